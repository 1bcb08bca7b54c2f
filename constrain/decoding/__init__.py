"""The decoding toolkit: sampling parameters, logits transforms, samplers and beam search, exact under a structure."""

from constrain.decoding.beam import BeamHypothesis, beam_search
from constrain.decoding.contrastive import Contrastive, contrastive_scores
from constrain.decoding.drafts import ChainedDrafts, ForcedDrafts, ModelDraft, PromptLookup, early_exit_model
from constrain.decoding.lookahead import LookaheadDrafts
from constrain.decoding.loop import TokenLogprob
from constrain.decoding.params import PRESETS, SamplingParams
from constrain.decoding.sampling import Sampler, next_token_probs, sample, sample_from_probs
from constrain.decoding.speculative import Draft, DraftContext, DraftSource, Speculation, SpeculationStats
from constrain.decoding.transforms import (
    apply_logit_bias,
    apply_penalties,
    apply_structure_mask,
    entropy,
    log_softmax,
    softmax,
)

__all__ = [
    "PRESETS",
    "BeamHypothesis",
    "ChainedDrafts",
    "Contrastive",
    "Draft",
    "DraftContext",
    "DraftSource",
    "ForcedDrafts",
    "LookaheadDrafts",
    "ModelDraft",
    "PromptLookup",
    "Sampler",
    "SamplingParams",
    "Speculation",
    "SpeculationStats",
    "TokenLogprob",
    "apply_logit_bias",
    "apply_penalties",
    "apply_structure_mask",
    "beam_search",
    "contrastive_scores",
    "early_exit_model",
    "entropy",
    "log_softmax",
    "next_token_probs",
    "sample",
    "sample_from_probs",
    "softmax",
]

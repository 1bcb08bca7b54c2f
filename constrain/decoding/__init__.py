"""The decoding toolkit: sampling parameters, logits transforms, samplers, beam search, speculative and contrastive
decoding, and the choice among sampled candidates, exact under a structure."""

from constrain.decoding.beam import BeamHypothesis, beam_search
from constrain.decoding.contrastive import Contrastive, contrastive_scores
from constrain.decoding.drafts import ChainedDrafts, ForcedDrafts, ModelDraft, PromptLookup, early_exit_model
from constrain.decoding.lookahead import LookaheadDrafts
from constrain.decoding.loop import TokenLogprob
from constrain.decoding.params import PRESETS, SamplingParams
from constrain.decoding.sampling import Sampler, next_token_probs, sample, sample_from_probs
from constrain.decoding.selection import Candidate, Selection, best_of, mbr, self_consistency
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
    "Candidate",
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
    "Selection",
    "Speculation",
    "SpeculationStats",
    "TokenLogprob",
    "apply_logit_bias",
    "apply_penalties",
    "apply_structure_mask",
    "beam_search",
    "best_of",
    "contrastive_scores",
    "early_exit_model",
    "entropy",
    "log_softmax",
    "mbr",
    "next_token_probs",
    "sample",
    "sample_from_probs",
    "self_consistency",
    "softmax",
]

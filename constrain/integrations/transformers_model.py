"""A transformers causal LM and its tokenizer as a model of constrain's own decoding loop.

:class:`TransformersModel` runs the forward passes of :class:`~constrain.decoding.loop.Decoding`: the prompts of a
batch are left-padded into one tensor, read in one pass, and every later step reads one token per row against the
key-value cache (``past_key_values``). Positions are counted per row from its first real token, so padding changes
nothing a row sees. Only the last position's logits are computed (``logits_to_keep=1``), which spares the output
layer over the prompt.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Any

from constrain.errors import ArgumentError, VocabularyError
from constrain.extras import check_installed, require
from constrain.vocab.vocabulary import Vocabulary

check_installed("transformers", extra="transformers", feature=__name__)
torch = require("torch", "transformers", feature=__name__)


class TransformersModel:
    """A transformers causal LM (``AutoModelForCausalLM``) with its tokenizer, for :class:`~constrain.decoding.loop.
    Decoding` and :class:`constrain.LLM`."""

    max_batch = None

    def __init__(self, model: Any, tokenizer: Any, *, eos_ids: Sequence[int] | None = None):
        if not callable(model) or not hasattr(model, "config"):
            raise ArgumentError("model", model, "a transformers causal language model (AutoModelForCausalLM)")
        if not callable(getattr(tokenizer, "encode", None)):
            raise ArgumentError("tokenizer", tokenizer, "the model's transformers tokenizer")
        self.model = model
        self.tokenizer = tokenizer
        self.vocab = Vocabulary.from_tokenizer(tokenizer, eos_ids=_eos_ids(model, tokenizer, eos_ids))
        self.logits_width = int(model.get_output_embeddings().weight.shape[0])
        if self.vocab.size > self.logits_width:
            raise VocabularyError(
                f"the tokenizer has {self.vocab.size:,} tokens but the model's output layer {self.logits_width:,}"
            )
        config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
        self.context_length: int | None = getattr(config, "max_position_embeddings", None)
        # transformers 5 renamed ``past_key_values`` to ``cache`` (in the forward's arguments and in its output)
        self._cache_name = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
        self._cache: Any = None
        self._mask: Any = None
        self._positions: Any = None

    @property
    def device(self) -> Any:
        return self.model.device

    # -- text ----------------------------------------------------------------------------------------------------

    def encode(self, text: str) -> list[int]:
        """The prompt's token ids, with the tokenizer's own special tokens (Gemma's ``<bos>``)."""
        return list(self.tokenizer.encode(text))

    def chat_template(self) -> str | None:
        """The tokenizer's chat template, or None when it has none."""
        return getattr(self.tokenizer, "chat_template", None) or None

    def render_chat(self, messages: Sequence[dict[str, Any]]) -> str:
        """The messages through the tokenizer's chat template, ready for the assistant's turn."""
        return self.tokenizer.apply_chat_template(list(messages), tokenize=False, add_generation_prompt=True)

    # -- forward passes ------------------------------------------------------------------------------------------

    def prefill(self, prompts: Sequence[Sequence[int]]) -> Any:
        width = max(len(p) for p in prompts)
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        ids = torch.full((len(prompts), width), pad, dtype=torch.long)
        mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for row, prompt in enumerate(prompts):
            ids[row, width - len(prompt) :] = torch.tensor(prompt, dtype=torch.long)
            mask[row, width - len(prompt) :] = 1
        positions = (mask.cumsum(dim=1) - 1).clamp(min=0)
        self._cache = None
        return self._forward(ids, mask, positions)

    def extend(self, tokens: Sequence[int]) -> Any:
        ids = torch.tensor(list(tokens), dtype=torch.long).unsqueeze(1)
        mask = torch.cat([self._mask, self._mask.new_ones((len(tokens), 1))], dim=1)
        return self._forward(ids, mask, self._positions[:, -1:] + 1)

    def _forward(self, ids: Any, mask: Any, positions: Any) -> Any:
        device = self.model.device
        with torch.inference_mode():
            out = self.model(
                input_ids=ids.to(device),
                attention_mask=mask.to(device),
                position_ids=positions.to(device),
                use_cache=True,
                logits_to_keep=1,
                **{self._cache_name: self._cache},
            )
        self._cache = getattr(out, self._cache_name)
        self._mask, self._positions = mask, positions
        return out.logits[:, -1, :].float()


def _eos_ids(model: Any, tokenizer: Any, given: Sequence[int] | None) -> list[int]:
    """The ids that end generation: those given, else the generation config's and the tokenizer's."""
    if given is not None:
        return [int(t) for t in given]
    ids: list[int] = []
    config = getattr(model, "generation_config", None)
    for source in (getattr(config, "eos_token_id", None), getattr(tokenizer, "eos_token_id", None)):
        for token in source if isinstance(source, (list, tuple)) else [source]:
            if isinstance(token, int) and token not in ids:
                ids.append(token)
    return ids

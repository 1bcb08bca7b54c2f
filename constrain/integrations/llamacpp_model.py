"""A llama-cpp-python ``Llama`` as a model of constrain's own decoding loop.

:class:`LlamaCppModel` runs the forward passes of :class:`~constrain.decoding.loop.Decoding` with ``Llama.eval``
and reads the last position's logits straight from llama.cpp's context, so llama.cpp's own sampler chain (and its
ctypes callbacks) is not involved: the loop samples with :class:`~constrain.decoding.sampling.Sampler` under the
structure's mask, as for every other model. A ``Llama`` holds one sequence, so a batch is one row; a prompt that
starts with the tokens already evaluated reuses them. Forced tokens are evaluated together, in one ``eval``.

Speculative decoding runs here too (:meth:`verify`, :meth:`rollback`): the drafts are decoded in one llama.cpp
batch that asks for logits at the draft positions only, and a rollback moves the evaluated length back (llama.cpp
drops the rest of the cache at the next evaluation). llama-cpp-python's own ``draft_model`` is refused: its
generator hands logits processors every evaluated draft token, not the position being sampled (see
:mod:`constrain.integrations.llamacpp`); :class:`~constrain.decoding.drafts.PromptLookup` in this loop drafts the
same way.

llama.cpp builds the output layer into its compute graph and llama-cpp-python exposes no way to project a subset
of its rows, so every step computes all logits here (``sparse_limit = 0``); the allowed sets the loop passes are
ignored.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from constrain.errors import ArgumentError
from constrain.extras import require
from constrain.integrations.llamacpp import vocabulary_from_llama

llama_cpp = require("llama_cpp", "llamacpp", feature=__name__)


class LlamaCppModel:
    """A ``llama_cpp.Llama`` for :class:`~constrain.decoding.loop.Decoding` and :class:`constrain.LLM`."""

    max_batch = 1
    sparse_limit = 0

    def __init__(self, llm: Any):
        if not isinstance(llm, llama_cpp.Llama):
            raise ArgumentError("llm", llm, "a llama_cpp.Llama")
        if getattr(llm, "draft_model", None) is not None:
            raise ArgumentError("llm", llm, "a Llama without draft_model: this loop evaluates every token itself")
        self.llm = llm
        self.vocab = vocabulary_from_llama(llm)
        self.logits_width = int(llm.n_vocab())
        self.context_length: int | None = int(llm.n_ctx())

    # -- text ----------------------------------------------------------------------------------------------------

    def encode(self, text: str) -> list[int]:
        """The prompt's token ids: a ``<bos>`` where the model wants one, and special tokens written as text
        (``<start_of_turn>``) read as those tokens, as transformers' tokenizers read them."""
        return list(self.llm.tokenize(text.encode("utf-8"), add_bos=True, special=True))

    def tokenize(self, text: str) -> list[int]:
        """llama.cpp's split of a piece of text, without ``<bos>`` or special tokens (forced text, fast-forward)."""
        return list(self.llm.tokenize(text.encode("utf-8"), add_bos=False, special=False))

    def chat_template(self) -> str | None:
        """The GGUF's chat template (``tokenizer.chat_template``), or None when it has none."""
        return self.llm.metadata.get("tokenizer.chat_template") or None

    def render_chat(self, messages: Sequence[dict[str, Any]]) -> str:
        """The messages through the GGUF's chat template, ready for the assistant's turn."""
        from llama_cpp.llama_chat_format import Jinja2ChatFormatter

        template = self.chat_template()
        if template is None:
            raise ArgumentError("messages", messages, "a model with a chat template")
        formatter = Jinja2ChatFormatter(
            template, eos_token=self._piece(self.llm.token_eos()), bos_token=self._piece(self.llm.token_bos())
        )
        return formatter(messages=list(messages)).prompt

    def _piece(self, token: int) -> str:
        return self.llm.detokenize([token], special=True).decode("utf-8", errors="replace")

    # -- forward passes ------------------------------------------------------------------------------------------

    def prefill(self, prompts: Sequence[Sequence[int]], allowed: Sequence[Any] | None = None) -> Any:
        if len(prompts) != 1:
            raise ArgumentError("prompts", f"{len(prompts)} rows", "one row: a Llama holds one sequence")
        prompt = list(prompts[0])
        llm = self.llm
        kept = 0
        evaluated = llm.input_ids[: llm.n_tokens]
        limit = min(len(evaluated), len(prompt) - 1)  # the last prompt token is always evaluated: its logits
        while kept < limit and evaluated[kept] == prompt[kept]:
            kept += 1
        llm.n_tokens = kept  # eval drops the cache past n_tokens
        return self._eval(prompt[kept:])

    def extend(self, tokens: Sequence[Sequence[int]], allowed: Sequence[Any] | None = None) -> Any:
        return self._eval([int(t) for t in tokens[0]])

    def verify(self, tokens: Sequence[int], keep: int, allowed: Sequence[Any] | None = None) -> np.ndarray:
        """Evaluate ``tokens`` in one batch; the logits after each of the last ``keep``, ``(keep, width)``."""
        llm = self.llm
        tokens = [int(t) for t in tokens]
        if not 1 <= keep <= len(tokens) or len(tokens) > llm.n_batch:
            raise ArgumentError("tokens", f"{len(tokens)} tokens, keep={keep}", f"1 <= keep <= len <= {llm.n_batch}")
        if llm.n_tokens + len(tokens) > self.context_length:
            raise ArgumentError("tokens", f"{len(tokens)} tokens", "room in the context window")
        llm._ctx.kv_cache_seq_rm(-1, llm.n_tokens, -1)
        start = llm.n_tokens
        llm._batch.set_batch(batch=tokens, n_past=start, logits_all=False)
        for i in range(len(tokens) - keep, len(tokens)):
            llm._batch.batch.logits[i] = True
        llm._ctx.decode(llm._batch)
        llm.input_ids[start : start + len(tokens)] = tokens
        llm.n_tokens += len(tokens)
        rows = [self._logits_at(i) for i in range(len(tokens) - keep, len(tokens))]
        return np.stack(rows)

    def rollback(self, num_tokens: int) -> None:
        """Forget the last ``num_tokens`` evaluated tokens (llama.cpp drops their cache at the next evaluation)."""
        if isinstance(num_tokens, bool) or not isinstance(num_tokens, int) or not 0 <= num_tokens <= self.llm.n_tokens:
            raise ArgumentError("num_tokens", num_tokens, f"an int in 0..{self.llm.n_tokens}: the tokens evaluated")
        self.llm.n_tokens -= num_tokens

    def _logits_at(self, index: int) -> np.ndarray:
        return np.ctypeslib.as_array(self.llm._ctx.get_logits_ith(index), shape=(self.logits_width,)).copy()

    def _eval(self, tokens: list[int]) -> np.ndarray:
        self.llm.eval(tokens)
        return self._logits_at(-1).reshape(1, -1)

"""A transformers causal LM and its tokenizer as a model of constrain's own decoding loop.

:class:`TransformersModel` runs the forward passes of :class:`~constrain.decoding.loop.Decoding`: the prompts of a
batch are left-padded into one tensor, read in one pass, and every later step reads one token per row against the
key-value cache (``past_key_values``). Positions are counted per row from its first real token, so padding changes
nothing a row sees; a step that reads several tokens of a row (forced ones) pads the shorter rows on the left
of that step's block, masked out the same way. Only the last position's logits are computed.

The output layer is the biggest single cost of a small model's step (Gemma 3 270M: 262,144 rows of 640 floats,
about half the step on a CPU). A row whose structure allows few tokens (at most ``sparse_limit``) gets the logits
of only those tokens: the decoder's last hidden state times the gathered rows of the output matrix, through the
model's own final soft-capping; every other logit is -inf. That is the same arithmetic as the full projection
restricted to those rows, so the distribution under the mask is the one masking the full logits gives, apart
from the rounding of dot products of another length. Whether a model's logits are ``lm_head(decoder(x))`` is
checked once, on a short input, against its own forward pass; a model that scales or transforms its logits in
another way (or whose output layer is not a plain linear layer) keeps the full projection, and says why in
``output_layer_reason``.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Any, Literal

from constrain.errors import ArgumentError, VocabularyError
from constrain.extras import check_installed, require
from constrain.vocab.vocabulary import Vocabulary

check_installed("transformers", extra="transformers", feature=__name__)
torch = require("torch", "transformers", feature=__name__)

OutputLayer = Literal["auto", "sparse", "full"]
#: Default ``sparse_limit`` as a share of the output layer's rows. Measured on Gemma 3 270M on a 2-core CPU
#: (benchmarks/bench_output_layer.py): the gathered projection of half the rows takes about 0.6 of the full one, of
#: three quarters 0.8; half keeps a margin for machines where gathering costs more.
SPARSE_SHARE = 0.5
#: Rows of the output matrix gathered at a time: a reused buffer, so no large allocation per step.
GATHER_ROWS = 4096
#: Largest difference allowed between the model's logits and ``lm_head(decoder(x))`` in the start-up check.
CHECK_TOLERANCE = 1e-3


class TransformersModel:
    """A transformers causal LM (``AutoModelForCausalLM``) with its tokenizer, for :class:`~constrain.decoding.loop.
    Decoding` and :class:`constrain.LLM`."""

    max_batch = None

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        eos_ids: Sequence[int] | None = None,
        output_layer: OutputLayer = "auto",
        sparse_limit: int | None = None,
    ):
        """``output_layer``: ``"auto"`` (sparse where the model allows it), ``"sparse"`` (raise where it does not)
        or ``"full"``. ``sparse_limit``: the largest allowed set projected sparsely (default: half the output
        layer's rows)."""
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
        self._recording = False
        if output_layer not in ("auto", "sparse", "full"):
            raise ArgumentError("output_layer", output_layer, "'auto', 'sparse' or 'full'")
        if sparse_limit is not None and (isinstance(sparse_limit, bool) or not isinstance(sparse_limit, int)):
            raise ArgumentError("sparse_limit", sparse_limit, "an int >= 0, or None for the default")
        reason = "output_layer='full'" if output_layer == "full" else self._sparse_problem(config)
        if reason is not None and output_layer == "sparse":
            raise ArgumentError("output_layer", output_layer, f"a model whose logits are lm_head(decoder(x)): {reason}")
        #: ``"sparse"`` or ``"full"``: how rows with few allowed tokens are projected; and why, when full.
        self.output_layer: str = "full" if reason else "sparse"
        self.output_layer_reason: str | None = reason
        default_limit = int(self.logits_width * SPARSE_SHARE)
        self.sparse_limit = 0 if reason else max(0, default_limit if sparse_limit is None else sparse_limit)

    @property
    def device(self) -> Any:
        return self.model.device

    # -- text ----------------------------------------------------------------------------------------------------

    def encode(self, text: str) -> list[int]:
        """The prompt's token ids, with the tokenizer's own special tokens (Gemma's ``<bos>``)."""
        return list(self.tokenizer.encode(text))

    def tokenize(self, text: str) -> list[int]:
        """The tokenizer's split of a piece of text, without special tokens (forced text, fast-forward)."""
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def chat_template(self) -> str | None:
        """The tokenizer's chat template, or None when it has none."""
        return getattr(self.tokenizer, "chat_template", None) or None

    def render_chat(self, messages: Sequence[dict[str, Any]]) -> str:
        """The messages through the tokenizer's chat template, ready for the assistant's turn."""
        return self.tokenizer.apply_chat_template(list(messages), tokenize=False, add_generation_prompt=True)

    # -- forward passes ------------------------------------------------------------------------------------------

    def prefill(self, prompts: Sequence[Sequence[int]], allowed: Sequence[Any] | None = None) -> Any:
        ids, block = self._left_padded(prompts)
        self._cache = self._mask = self._positions = None
        self._recording = False
        return self._forward(ids, block, allowed)

    def extend(self, tokens: Sequence[Sequence[int]], allowed: Sequence[Any] | None = None) -> Any:
        ids, block = self._left_padded(tokens)
        logits = self._forward(ids, block, allowed)
        if self._recording:
            self._cache.crop(0)  # sliding-window layers drop what they kept for a rollback
        return logits

    def verify(self, tokens: Sequence[int], keep: int, allowed: Sequence[Any] | None = None) -> Any:
        """Read ``tokens`` (one row); the logits after each of the last ``keep``, ``(keep, width)``. The key-value
        cache records enough for :meth:`rollback` (sliding-window layers keep their past until then)."""
        if self._mask is None or self._mask.shape[0] != 1:
            raise ArgumentError("tokens", list(tokens), "a prefill of one row before verify()")
        if not 1 <= keep <= len(tokens):
            raise ArgumentError("keep", keep, f"1..{len(tokens)}: the positions whose logits are returned")
        if not self._recording and hasattr(self._cache, "activate_past_recording"):
            self._cache.activate_past_recording()
            self._recording = True
        ids, block = self._left_padded([tokens])
        return self._forward(ids, block, allowed, keep=keep)

    def rollback(self, num_tokens: int) -> None:
        """Forget the last ``num_tokens`` tokens read (rejected drafts)."""
        read = self._mask.shape[1] if self._mask is not None else 0
        if isinstance(num_tokens, bool) or not isinstance(num_tokens, int) or not 0 <= num_tokens <= read:
            raise ArgumentError("num_tokens", num_tokens, f"an int in 0..{read}: the tokens read")
        self._cache.crop(-num_tokens)
        self._mask = self._mask[:, : read - num_tokens]
        self._positions = self._positions[:, -1:] - num_tokens

    def _left_padded(self, rows: Sequence[Sequence[int]]) -> tuple[Any, Any]:
        """The rows as one ``(batch, longest)`` block of ids, each right-aligned, and its attention mask."""
        width = max(len(r) for r in rows)
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        ids = torch.full((len(rows), width), pad, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, row in enumerate(rows):
            ids[i, width - len(row) :] = torch.tensor(list(row), dtype=torch.long)
            mask[i, width - len(row) :] = 1
        return ids, mask

    def _forward(self, ids: Any, block: Any, allowed: Sequence[Any] | None, *, keep: int = 1) -> Any:
        """Read a block of ids whose attention mask is ``block`` after what the cache holds; the logits after each
        of the last ``keep`` positions of every row, ``(batch * keep, width)``."""
        if self._mask is None:  # a prefill: positions count from each row's first real token
            mask, positions = block, (block.cumsum(dim=1) - 1).clamp(min=0)
        else:  # a pad repeats the position before it
            mask, positions = torch.cat([self._mask, block], dim=1), self._positions[:, -1:] + block.cumsum(dim=1)
        rows = ids.shape[0] * keep
        sparse = allowed is not None and self.sparse_limit > 0 and any(a is not None for a in allowed)
        # several rows of logits: the weight-major product (see _project) when the split is known to be exact
        split = sparse or (rows > 1 and self.output_layer == "sparse")
        device = self.model.device
        inputs = {
            "input_ids": ids.to(device),
            "attention_mask": mask.to(device),
            "position_ids": positions.to(device),
            "use_cache": True,
            self._cache_name: self._cache,
        }
        with torch.inference_mode():
            if split:
                out = self.model.get_decoder()(**inputs)
                hidden = out.last_hidden_state[:, -keep:, :]
                logits = self._project(hidden.reshape(-1, hidden.shape[-1]), allowed or [None] * rows)
            else:
                out = self.model(**inputs, logits_to_keep=keep)
                logits = out.logits[:, -keep:, :].float()
                logits = logits.reshape(-1, logits.shape[-1])
        self._cache = getattr(out, self._cache_name)
        self._mask, self._positions = mask, positions
        return logits

    # -- the output layer ----------------------------------------------------------------------------------------

    def _project(self, hidden: Any, allowed: Sequence[Any]) -> Any:
        """Logits ``(batch, width)`` from the decoder's last hidden states: all of them for rows whose ``allowed``
        is None, those of the allowed ids (and -inf elsewhere) for the others.

        Several full rows are computed as ``weight @ hidden.T``: on a CPU, ``linear`` over a few rows (a verifying
        pass, a small batch) takes about as long per row as one row alone, while the weight-major product reads
        the weight once (measured on Gemma 3 270M: 5 rows in 39 ms against 143 ms; one row 52 ms either way)."""
        head = self.model.get_output_embeddings()
        logits = torch.full((hidden.shape[0], self.logits_width), float("-inf"), device=hidden.device)
        full = [i for i, a in enumerate(allowed) if a is None]
        if len(full) == 1:
            logits[full] = self._cap(head(hidden[full])).float()
        elif full:
            product = torch.mm(head.weight, hidden[full].T).T
            if head.bias is not None:
                product += head.bias
            logits[full] = self._cap(product).float()
        for i, ids in enumerate(allowed):
            if ids is not None:
                index = torch.as_tensor(ids, dtype=torch.long, device=hidden.device)
                logits[i, index] = self._cap(self._gathered(hidden[i], index, head)).float()
        return logits

    def _gathered(self, hidden: Any, index: Any, head: Any) -> Any:
        """``head(hidden)`` at the rows ``index`` only, gathering the weight rows a block at a time."""
        weight = head.weight
        buffer = self._gather_buffer(weight)
        out = torch.empty(len(index), dtype=weight.dtype, device=weight.device)
        for start in range(0, len(index), GATHER_ROWS):
            part = index[start : start + GATHER_ROWS]
            rows = torch.index_select(weight, 0, part, out=buffer[: len(part)])
            torch.mv(rows, hidden, out=out[start : start + len(part)])
        if head.bias is not None:
            out += head.bias[index]
        return out

    def _gather_buffer(self, weight: Any) -> Any:
        buffer = getattr(self, "_buffer", None)
        if buffer is None or buffer.dtype != weight.dtype or buffer.device != weight.device:
            buffer = self._buffer = weight.new_empty((GATHER_ROWS, weight.shape[1]))
        return buffer

    def _cap(self, logits: Any) -> Any:
        """The model's final soft-capping (Gemma 2), where it has one."""
        if self._softcap is None:
            return logits
        return torch.tanh(logits / self._softcap) * self._softcap

    def _sparse_problem(self, config: Any) -> str | None:
        """Why this model's logits cannot be computed row by row from the decoder's output, or None."""
        cap = getattr(config, "final_logit_softcapping", None)
        self._softcap = float(cap) if cap else None
        head = self.model.get_output_embeddings() if hasattr(self.model, "get_output_embeddings") else None
        if not isinstance(head, torch.nn.Linear):
            return f"its output layer is {type(head).__name__}, not a torch.nn.Linear"
        decoder = self.model.get_decoder() if hasattr(self.model, "get_decoder") else None
        if decoder is None or decoder is self.model:
            return "it has no separate decoder (get_decoder) to run without the output layer"
        probe = torch.tensor([self.encode("A structure")[:4]], dtype=torch.long, device=self.model.device)
        with torch.inference_mode():
            expected = self.model(input_ids=probe, use_cache=False).logits[0, -1].float()
            hidden = decoder(input_ids=probe, use_cache=False).last_hidden_state[0, -1]
            got = self._cap(head(hidden)).float()
        gap = float((expected - got).abs().max())
        if not gap <= CHECK_TOLERANCE * max(1.0, float(expected.abs().max())):
            return f"its logits differ from lm_head(decoder(x)) by up to {gap:.3g} (a scaling this layer does not know)"
        return None


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

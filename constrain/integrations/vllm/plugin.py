"""The logits-processor plug-in: masks each request's logits rows to the structure in its ``extra_args``.

It implements the interface of vLLM's V2 model runner (one row per draft position under speculative decoding) and
the legacy V1 runner's, and is built on first access as a subclass of vLLM's abstract classes.
"""

from __future__ import annotations

import functools
import importlib
import json
import logging
import threading
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from constrain.automata.regex import regex_to_dfa
from constrain.compilers.choices import choice_regex
from constrain.errors import MissingExtraError, StructureError, VocabularyError
from constrain.integrations.vllm.backend import (
    ConstrainBackend,
    ConstrainGrammar,
    _word_bits,
    fill_draft_bitmasks,
)
from constrain.integrations.vllm.requests import (
    RequestType,
    _check_json_schema,
    structure_request,
)
from constrain.kernels.bitmask import apply_token_bitmask

logger = logging.getLogger(__name__)


class _Request:
    """The plug-in's state for one request: its grammar and how many committed output tokens it has read.

    A broken request (its structure could not be compiled, or a committed token broke it) is ended: its rows
    allow only its stop tokens (every token if it has none, rather than none at all).
    """

    __slots__ = ("grammar", "synced", "broken", "output_ids", "name", "stop_bits")

    def __init__(self, grammar: ConstrainGrammar | None, name: str, stop_token_ids: Iterable[int] = ()):
        self.grammar = grammar
        self.synced = 0
        self.broken = grammar is None
        self.output_ids: list[int] | None = None  # the legacy runner's live list of output tokens
        self.name = name
        stops = grammar.stop_token_ids if grammar is not None else frozenset(int(t) for t in stop_token_ids)
        self.stop_bits = _word_bits(stops) if stops else None

    def sync(self, tokens: Sequence[int]) -> None:
        """Read newly committed output tokens."""
        if not tokens:
            return
        self.synced += len(tokens)
        if self.broken:
            return
        if not self.grammar.accept_tokens(self.name, [int(t) for t in tokens]):
            self.broken = True
            logger.error(
                "constrain: %s: a committed token was not allowed by the structure (another stage changed the "
                "logits after the mask?); ending the request",
                self.name,
            )

    def restart(self) -> None:
        self.synced = 0
        if self.grammar is not None:
            self.grammar.reset()
            self.broken = False

    def fill(self, bitmask: np.ndarray, row: int, drafts: Sequence[int]) -> None:
        if self.broken:
            for j in range(len(drafts) + 1):
                out = bitmask[row + j].view(np.uint32)
                if self.stop_bits is None:
                    out[:] = 0xFFFFFFFF
                else:
                    out[:] = 0
                    ConstrainGrammar._or_bits(out, self.stop_bits)
            return
        fill_draft_bitmasks(self.grammar, bitmask, row, drafts, request_id=self.name)


class _StructureLogitsProcessorImpl:
    """The plug-in's logic, without vLLM base classes (see :class:`StructureLogitsProcessor`).

    Constructed by vLLM as ``cls(vllm_config, req_states)`` (V2 model runner) or
    ``cls(vllm_config, device, is_pin_memory)`` (legacy V1 runner).
    """

    def __init__(self, vllm_config: Any, req_states_or_device: Any = None, is_pin_memory: bool | None = None):
        self.vllm_config = vllm_config
        self.v2 = is_pin_memory is None and hasattr(req_states_or_device, "all_token_ids")
        if self.v2:
            self.req_states = req_states_or_device
            self.device = getattr(req_states_or_device, "device", None)
            self.vocab_size = getattr(req_states_or_device, "vocab_size", None)
        else:
            self.req_states = None
            self.device = req_states_or_device
            self.vocab_size = None
        self._requests: dict[int, _Request] = {}
        self._backend: ConstrainBackend | None = None
        self._backend_lock = threading.Lock()
        self._warned_placeholder = False

    # -- shared --------------------------------------------------------------------------------------------------

    @classmethod
    def validate_params(cls, sampling_params: Any) -> None:
        """Reject a malformed structure request at admission (StructureError is a ValueError): the keys, the
        value types, and, since they need no vocabulary, the regex / choice syntax and the JSON Schema (lowered to
        a grammar, as the compile will)."""
        request = structure_request(getattr(sampling_params, "extra_args", None))
        if request is None:
            return
        kind, spec = request
        if kind is RequestType.REGEX:
            regex_to_dfa(spec)
        elif kind is RequestType.CHOICE:
            regex_to_dfa(choice_regex(json.loads(spec)))
        elif kind is RequestType.JSON:
            _check_json_schema(spec)

    def make_backend(self) -> ConstrainBackend:
        """The backend that compiles this engine's requests: vLLM's tokenizer for the model. Override to supply
        another (a custom tokenizer, tests)."""
        from vllm.tokenizers import cached_tokenizer_from_config

        model_config = self.vllm_config.model_config
        tokenizer = cached_tokenizer_from_config(model_config)
        if tokenizer is None:
            raise VocabularyError("constrain needs the model's tokenizer, and this engine runs without one")
        vocab_size = self.vocab_size or model_config.get_vocab_size()
        return ConstrainBackend(self.vllm_config, tokenizer=tokenizer, vocab_size=vocab_size)

    @property
    def backend(self) -> ConstrainBackend:
        if self._backend is None:
            with self._backend_lock:
                if self._backend is None:
                    self._backend = self.make_backend()
        return self._backend

    def _new_request(self, sampling_params: Any, name: str) -> _Request | None:
        request = structure_request(getattr(sampling_params, "extra_args", None))
        if request is None:
            return None
        stops = set(getattr(sampling_params, "all_stop_token_ids", None) or ())
        try:
            grammar = self.backend.compile_grammar(request[0], request[1], stop_token_ids=stops)
        except (StructureError, VocabularyError) as exc:
            logger.error("constrain: %s: cannot compile its structure, ending it: %s", name, exc)
            grammar = None
        except Exception:  # e.g. the tokenizer cannot be loaded: fail this request, not the engine
            logger.exception("constrain: %s: cannot compile its structure, ending it", name)
            grammar = None
        return _Request(grammar, name, stops)

    def is_argmax_invariant(self) -> bool:
        """A structure changes which token is the most likely."""
        return False

    def apply(self, logits: Any, ctx: Any = None) -> Any:
        """Mask ``logits`` in place: V2 runner with ``ctx``, legacy runner without."""
        if ctx is None:
            return self._apply_v1(logits)
        return self._apply_v2(logits, ctx)

    def _apply_rows(self, logits: Any, blocks: list[tuple[_Request, list[int], list[int]]]) -> Any:
        """Fill one bitmask row per logits row of each (request, rows, drafts) and mask those rows."""
        total = sum(len(rows) for _, rows, _ in blocks)
        if not total:
            return logits
        bitmask = np.empty((total, (int(logits.shape[-1]) + 31) // 32), dtype=np.int32)
        indices: list[int] = []
        at = 0
        for request, rows, drafts in blocks:
            request.fill(bitmask, at, drafts)
            indices.extend(rows)
            at += len(rows)
        apply_token_bitmask(logits, bitmask, indices=indices)
        return logits

    # -- V2 model runner -------------------------------------------------------------------------------------------

    def add_request(self, req_idx: int, sampling_params: Any) -> bool:
        """A request enters slot ``req_idx`` (the slot's previous state is dropped); True if it has a structure."""
        request = self._new_request(sampling_params, f"request in slot {req_idx}")
        if request is None:
            self._requests.pop(req_idx, None)
            return False
        self._requests[req_idx] = request
        return True

    def apply_staged_writes(self) -> None:
        """Nothing is staged: the state lives on the host."""

    def _sync_v2(self, slots: list[int]) -> None:
        """Read each slot's committed output tokens that its grammar has not read yet."""
        import torch

        rs = self.req_states
        total_gpu = rs.total_len.gpu
        index = torch.as_tensor(slots, dtype=torch.long, device=total_gpu.device)
        totals = total_gpu[index].cpu().tolist()
        prompts = np.asarray(rs.prompt_len.np)[slots].tolist()
        row_ids: list[int] = []
        col_ids: list[int] = []
        spans: list[tuple[_Request, int]] = []
        for slot, total, prompt in zip(slots, totals, prompts):
            request = self._requests[slot]
            output_len = int(total) - int(prompt)
            if output_len < request.synced:  # the slot's history was rewritten: read it again
                request.restart()
            start = int(prompt) + request.synced
            count = max(0, int(total) - start)
            if count:
                row_ids.extend([slot] * count)
                col_ids.extend(range(start, start + count))
                spans.append((request, count))
        if not spans:
            return
        tokens_gpu = rs.all_token_ids.gpu
        rows_t = torch.as_tensor(row_ids, dtype=torch.long, device=tokens_gpu.device)
        cols_t = torch.as_tensor(col_ids, dtype=torch.long, device=tokens_gpu.device)
        tokens = tokens_gpu[rows_t, cols_t].cpu().tolist()
        at = 0
        for request, count in spans:
            request.sync(tokens[at : at + count])
            at += count

    def _apply_v2(self, logits: Any, ctx: Any) -> Any:
        requests = self._requests
        if not requests:
            return logits
        slots = [int(s) for s in np.asarray(ctx.idx_mapping_np).tolist() if int(s) in requests]
        if not slots:
            return logits  # no row of this batch is ours: no device sync
        self._sync_v2(sorted(set(slots)))
        row_slots = ctx.expanded_idx_mapping.cpu().tolist()
        local_pos = ctx.expanded_local_pos.cpu().tolist()
        input_ids = ctx.input_ids.cpu().tolist()
        per_slot: dict[int, list[tuple[int, int]]] = {}
        for row, slot in enumerate(row_slots):
            if slot in requests:
                per_slot.setdefault(slot, []).append((local_pos[row], row))
        blocks = []
        for slot, entries in per_slot.items():
            entries.sort()
            rows = [row for _, row in entries]
            # the row at local position j comes after the drafts fed at local positions 1..j
            drafts = [int(input_ids[row]) for row in rows[1:]]
            blocks.append((requests[slot], rows, drafts))
        return self._apply_rows(logits, blocks)

    # -- legacy V1 runner ------------------------------------------------------------------------------------------

    def update_state(self, batch_update: Any) -> None:
        """Follow the persistent batch: removed, then added, then moved requests (vLLM's order)."""
        if batch_update is None:
            return
        requests = self._requests
        for index in batch_update.removed:
            requests.pop(index, None)
        for index, params, _prompt_ids, output_ids in batch_update.added:
            request = self._new_request(params, f"request at batch index {index}")
            if request is None:
                requests.pop(index, None)
            else:
                request.output_ids = output_ids
                requests[index] = request
        for a, b, direction in batch_update.moved:
            if getattr(direction, "name", direction) == "SWAP":
                ra, rb = requests.pop(a, None), requests.pop(b, None)
                if ra is not None:
                    requests[b] = ra
                if rb is not None:
                    requests[a] = rb
            else:
                moved = requests.pop(a, None)
                if moved is None:
                    requests.pop(b, None)
                else:
                    requests[b] = moved

    def _apply_v1(self, logits: Any) -> Any:
        blocks = []
        n_rows = int(logits.shape[0])
        for index in sorted(self._requests):
            if index >= n_rows:
                continue
            request = self._requests[index]
            output = request.output_ids if request.output_ids is not None else []
            if len(output) < request.synced:
                request.restart()
            new = output[request.synced :]
            if any(t < 0 for t in new):  # placeholders of async scheduling that vLLM did not fill in
                cut = next(i for i, t in enumerate(new) if t < 0)
                request.sync(new[:cut])
                if not request.broken:
                    request.broken = True
                    if not self._warned_placeholder:
                        self._warned_placeholder = True
                        logger.error(
                            "constrain: vLLM's legacy runner did not give the plug-in its output tokens (async "
                            "scheduling); ending the request. Use the V2 model runner, or name the processor in "
                            "--logits-processors so that vLLM keeps the output tokens for it."
                        )
            else:
                request.sync(new)
            blocks.append((request, [index], []))
        return self._apply_rows(logits, blocks)


@functools.cache
def _plugin_class() -> type:
    """:class:`_StructureLogitsProcessorImpl` subclassing vLLM's logits-processor classes (V2 runner, and V1)."""
    bases: list[type] = [_StructureLogitsProcessorImpl]
    errors = []
    for module_name in (
        "vllm.v1.worker.gpu.sample.logits_processor.interface",  # the V2 model runner
        "vllm.v1.sample.logits_processor.interface",  # the legacy V1 runner
    ):
        try:
            bases.append(importlib.import_module(module_name).LogitsProcessor)
        except ImportError as exc:
            errors.append(f"{module_name}: {exc}")
    if len(bases) == 1:
        raise MissingExtraError(
            "vllm", "vllm", feature="constrain.integrations.vllm.StructureLogitsProcessor (" + "; ".join(errors) + ")"
        )
    cls = type(
        "StructureLogitsProcessor",
        tuple(bases),
        # Named where the entry point names it, so pickling finds it there.
        {
            "__module__": "constrain.integrations.vllm",
            "__qualname__": "StructureLogitsProcessor",
            "__doc__": _PLUGIN_DOC,
        },
    )
    return cls


_PLUGIN_DOC = """vLLM logits-processor plug-in: masks each request's rows to the structure in its ``extra_args``.

Registered under the entry-point group ``vllm.logits_processors``, so an installed constrain is loaded by every
vLLM engine; requests without a structure are not touched. See :func:`structure_request` for the keys, and the
module docstring for the two runner interfaces it implements.
"""

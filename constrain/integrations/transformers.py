"""Hugging Face transformers: a ``LogitsProcessor`` that keeps ``generate()`` inside a structure.

The processor keeps one matcher per batch row and synchronises it with ``input_ids`` on every call: it rolls
back to the longest common prefix of what the matcher read and what the row now holds, then reads the rest.
That one rule covers plain sampling, beam search (rows are reordered between steps) and assisted generation
(which calls with a growing prefix and rolls back rejected draft tokens).

The usual step appends one token to every row and changes nothing else; the processor checks that against a copy of
the previous call's ``input_ids`` (one ``torch.equal``) and then reads only the last column, so a step costs
O(batch) Python work however long the sequences are. Anything else goes through the general rule. A call whose
prompt columns differ from the previous call's, or with nothing generated yet, starts a new generation, so one
processor can serve several ``generate()`` calls.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from constrain.compilers import api
from constrain.errors import ArgumentError, DeadEndError, ShapeError, VocabularyError
from constrain.extras import check_installed, require
from constrain.kernels.bitmask import allocate_token_bitmask, apply_token_bitmask
from constrain.runtime.matcher import CompiledStructure, Matcher
from constrain.vocab.vocabulary import Vocabulary

check_installed("transformers", extra="transformers", feature=__name__)
torch = require("torch", "transformers", feature=__name__)


class StructureLogitsProcessor:
    """Masks the logits of each row to the tokens its structure allows next.

    ``structures`` is one compiled structure for every row, or one per row. Rows of a batch are matched
    independently; under beam search, a row is a beam (``num_beams`` rows per prompt), and the list is
    repeated accordingly when it has one entry per prompt.
    """

    def __init__(self, structures: CompiledStructure | Sequence[CompiledStructure], *, on_dead_end: str = "raise"):
        if on_dead_end not in ("raise", "stop"):
            raise ArgumentError("on_dead_end", on_dead_end, "'raise' or 'stop'")
        self.on_dead_end = on_dead_end
        self.structures = [structures] if isinstance(structures, CompiledStructure) else list(structures)
        if not self.structures:
            raise ArgumentError("structures", structures, "at least one structure")
        vocab = self.structures[0].vocab
        if any(s.vocab.fingerprint != vocab.fingerprint for s in self.structures):
            raise VocabularyError("all structures of one processor must be compiled for the same vocabulary")
        self.vocab = vocab
        self._prompt_length: int | None = None
        self._matchers: list[Matcher] = []
        self._histories: list[list[int]] = []
        self._stopped: dict[int, int] = {}  # rows sent to end of sequence at a dead end -> their history length
        self._bitmask: np.ndarray | None = None
        self._last_ids: torch.Tensor | None = None  # a copy of the previous call's input_ids

    def reset(self) -> None:
        """Forget the batch; the next call starts a new generation."""
        self._prompt_length = None
        self._matchers, self._histories = [], []
        self._stopped = {}
        self._last_ids = None

    def _start(self, batch: int, prompt_length: int) -> None:
        if len(self.structures) == 1:
            per_row = self.structures * batch
        elif batch % len(self.structures) == 0:
            per_row = [s for s in self.structures for _ in range(batch // len(self.structures))]
        else:
            raise ShapeError(f"{len(self.structures)} structures cannot be spread over a batch of {batch} rows")
        self._prompt_length = prompt_length
        self._matchers = [s.matcher() for s in per_row]
        self._histories = [[] for _ in range(batch)]
        self._stopped = {}
        self._last_ids = None

    def _sync(self, row: int, generated: list[int]) -> None:
        """Roll row ``row`` back to the longest common prefix of its history and ``generated``, then read the rest."""
        matcher, history = self._matchers[row], self._histories[row]
        common = 0
        limit = min(len(history), len(generated))
        while common < limit and history[common] == generated[common]:
            common += 1
        if common < len(history):
            matcher.rollback(len(history) - common)
            del history[common:]
            if self._stopped.get(row, -1) > common:
                del self._stopped[row]  # rolled back to before its dead end
        for token in generated[common:]:
            if matcher.is_finished() or row in self._stopped:
                break  # padding after the end of sequence
            matcher.advance(token)
            history.append(token)

    def _advance_rows(self, tokens: list[int]) -> None:
        """The usual step: each row's history is unchanged and one token was appended."""
        stopped = self._stopped
        for row, (matcher, token) in enumerate(zip(self._matchers, tokens)):
            if row in stopped or matcher.is_finished():
                continue  # padding after the end of sequence
            matcher.advance(token)
            self._histories[row].append(token)

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        batch, length = input_ids.shape
        if scores.shape[-1] < self.vocab.size:
            raise ShapeError(
                f"the model's logits have {scores.shape[-1]:,} columns but the structure's vocabulary has "
                f"{self.vocab.size:,} tokens: tokenizer and model do not match"
            )
        last, self._last_ids = self._last_ids, None  # kept only once this call has read every row
        prompt = self._prompt_length
        if (
            prompt is None
            or len(self._matchers) != batch
            or length <= prompt
            or (last is not None and not torch.equal(input_ids[:, :prompt], last[:, :prompt]))
        ):
            self._start(batch, length)  # a new generation (its first call sees the prompt alone)
        elif last is not None and last.shape[1] == length - 1 and torch.equal(input_ids[:, :-1], last):
            self._advance_rows(input_ids[:, -1].tolist())  # one new token per row: O(batch), not O(batch x length)
        else:  # beam search reordered rows, assisted generation rolled back drafts, or a processor was skipped
            ids = input_ids[:, self._prompt_length :].tolist()
            for row in range(batch):
                self._sync(row, ids[row])
        self._last_ids = input_ids.clone()  # generate() may reuse its buffer in place: keep a copy
        if self._bitmask is None or self._bitmask.shape != (batch, (scores.shape[-1] + 31) // 32):
            self._bitmask = allocate_token_bitmask(batch, scores.shape[-1])
        bitmask = self._bitmask
        for row, matcher in enumerate(self._matchers):
            matcher.fill_bitmask(bitmask, row)
        dead = np.flatnonzero(~bitmask.any(axis=1))  # one pass over the batch
        for row in dead.tolist():
            self._dead_end(row)
        apply_token_bitmask(scores, bitmask)
        return scores

    def _dead_end(self, row: int) -> None:
        """No token can continue row ``row``: raise with its text, or let it stop with an end-of-sequence token."""
        text = self.vocab.decode(self._histories[row]).decode("utf-8", errors="replace")
        if self.on_dead_end == "raise":
            raise DeadEndError(f"row {row}: no token of the vocabulary can continue the structure", text)
        self._stopped.setdefault(row, len(self._histories[row]))
        self._bitmask[row] = 0
        for eos in self.vocab.eos_ids:
            self._bitmask[row, eos >> 5] |= np.array(1 << (int(eos) & 31), dtype=np.uint32).view(np.int32)


def generate(
    model,
    tokenizer,
    prompt: str | Sequence[str],
    structure: Any,
    *,
    max_new_tokens: int = 256,
    eos_token_id: int | Sequence[int] | None = None,
    on_dead_end: str = "raise",
    **generate_kwargs,
) -> str | list[str]:
    """Generate text that follows ``structure`` with ``model.generate``: a CompiledStructure, a list of them (one per
    prompt), or any spec :func:`constrain.compile` takes (a regex, a JSON Schema, a Pydantic type, choices...),
    compiled here for the tokenizer's vocabulary.

    ``generate_kwargs`` go to ``model.generate`` (``do_sample``, ``temperature``, ``top_p``, ``num_beams``...);
    the default is greedy. Returns the generated text (a list for a list of prompts), end tokens left out.
    """
    from transformers import LogitsProcessorList

    prompts = [prompt] if isinstance(prompt, str) else list(prompt)
    vocab = Vocabulary.from_tokenizer(tokenizer)
    structures = _structures(structure, vocab)
    if any(s.vocab.fingerprint != vocab.fingerprint for s in structures):
        raise VocabularyError("the structure was compiled for another vocabulary than this tokenizer's")
    if eos_token_id is None:
        eos_token_id = [int(t) for t in vocab.eos_ids]
    padding_side = tokenizer.padding_side
    tokenizer.padding_side = "left"
    try:
        inputs = tokenizer(prompts, return_tensors="pt", padding=True).to(model.device)
    finally:
        tokenizer.padding_side = padding_side
    generate_kwargs.setdefault("do_sample", False)
    output = model.generate(
        **inputs,
        max_new_tokens=max_new_tokens,
        logits_processor=LogitsProcessorList([StructureLogitsProcessor(structures, on_dead_end=on_dead_end)]),
        eos_token_id=eos_token_id,
        pad_token_id=tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos_token_id[0],
        **generate_kwargs,
    )
    stop = set(eos_token_id) | {tokenizer.pad_token_id}
    texts = [
        vocab.decode([t for t in row if t not in stop]).decode("utf-8", errors="replace")
        for row in output[:, inputs["input_ids"].shape[1] :].tolist()
    ]
    return texts[0] if isinstance(prompt, str) else texts


def _structures(structure: Any, vocab: Vocabulary) -> list[CompiledStructure]:
    """The compiled structures of ``generate``'s ``structure`` argument."""
    if isinstance(structure, CompiledStructure):
        return [structure]
    if isinstance(structure, Sequence) and structure and all(isinstance(s, CompiledStructure) for s in structure):
        return list(structure)
    return [api.compile(structure, vocab)]

"""Hugging Face transformers: a ``LogitsProcessor`` that keeps ``generate()`` inside a structure.

The processor keeps one matcher per batch row and synchronises it with ``input_ids`` on every call: it rolls
back to the longest common prefix of what the matcher read and what the row now holds, then reads the rest.
That one rule covers plain sampling, beam search (rows are reordered between steps) and assisted generation
(which calls with a growing prefix and rolls back rejected draft tokens).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from ..errors import ShapeError
from ..kernels import allocate_token_bitmask, apply_token_bitmask
from ..matcher import CompiledStructure, Matcher


class StructureLogitsProcessor:
    """Masks the logits of each row to the tokens its structure allows next.

    ``structures`` is one compiled structure for every row, or one per row. Rows of a batch are matched
    independently; under beam search, a row is a beam (``num_beams`` rows per prompt), and the list is
    repeated accordingly when it has one entry per prompt.
    """

    def __init__(self, structures: CompiledStructure | Sequence[CompiledStructure]):
        self.structures = [structures] if isinstance(structures, CompiledStructure) else list(structures)
        if not self.structures:
            raise ValueError("at least one structure is needed")
        vocab = self.structures[0].vocab
        if any(s.vocab.fingerprint != vocab.fingerprint for s in self.structures):
            raise ShapeError("all structures of one processor must be compiled for the same vocabulary")
        self.vocab = vocab
        self._prompt_length: int | None = None
        self._matchers: list[Matcher] = []
        self._histories: list[list[int]] = []
        self._bitmask: np.ndarray | None = None

    def reset(self) -> None:
        """Forget the batch; the next call starts a new generation."""
        self._prompt_length = None
        self._matchers, self._histories = [], []

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

    def _sync(self, row: int, generated: list[int]) -> None:
        matcher, history = self._matchers[row], self._histories[row]
        common = 0
        limit = min(len(history), len(generated))
        while common < limit and history[common] == generated[common]:
            common += 1
        if common < len(history):
            matcher.rollback(len(history) - common)
            del history[common:]
        for token in generated[common:]:
            if matcher.is_finished():
                break  # padding after the end of sequence
            matcher.advance(token)
            history.append(token)

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        batch, length = input_ids.shape
        if scores.shape[-1] < self.vocab.size:
            raise ShapeError(
                f"the model's logits have {scores.shape[-1]:,} columns but the structure's vocabulary has "
                f"{self.vocab.size:,} tokens: tokenizer and model do not match"
            )
        if self._prompt_length is None or len(self._matchers) != batch or length < self._prompt_length:
            self._start(batch, length)
        ids = input_ids[:, self._prompt_length :].tolist()
        if self._bitmask is None or self._bitmask.shape != (batch, (scores.shape[-1] + 31) // 32):
            self._bitmask = allocate_token_bitmask(batch, scores.shape[-1])
        for row in range(batch):
            self._sync(row, ids[row])
            self._matchers[row].fill_bitmask(self._bitmask, row)
        apply_token_bitmask(scores, self._bitmask)
        return scores

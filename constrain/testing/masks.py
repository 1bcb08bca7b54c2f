"""Brute-force masks: the oracle for token masks, found by trying every token on the structure.

A :class:`~constrain.runtime.matcher.Matcher`'s mask comes from a walk of the vocabulary's byte trie (and, for
grammars, from stores of walks shared between structures). The brute force asks the structure about each token
on its own instead: :meth:`Matcher.accepts <constrain.runtime.matcher.Matcher.accepts>` reads the token's bytes
through the automaton, the same path :meth:`Matcher.advance <constrain.runtime.matcher.Matcher.advance>` takes,
and no mask is consulted. It costs one call per token (about a second for a 262,144-token vocabulary), so pass
``tokens`` to check a sample of a large vocabulary.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable

import numpy as np
from numpy.typing import NDArray

from constrain.kernels.bitmask import bitmask_to_bool
from constrain.runtime.matcher import CompiledStructure, Matcher


def _ids(size: int, tokens: Iterable[int] | None) -> list[int]:
    return list(range(size)) if tokens is None else [int(t) for t in tokens]


def brute_force_mask(matcher: Matcher, tokens: Iterable[int] | None = None) -> NDArray[np.bool_]:
    """The tokens ``matcher`` allows now, as booleans (``vocab.size``,), found without masks.

    Each token id is tried with :meth:`Matcher.accepts`, which reads the token's bytes through the structure and
    changes nothing: a special token is never allowed, an end-of-sequence token exactly when the structure may
    end. After the end of sequence only the end-of-sequence tokens are allowed, as in :meth:`Matcher.mask`.

    Only the ids in ``tokens`` are tried (all of them when ``tokens`` is None); the others are False. The answer
    equals ``bitmask_to_bool(matcher.mask(), vocab.size)`` wherever the matcher is right.
    """
    vocab = matcher.structure.vocab
    out = np.zeros(vocab.size, dtype=np.bool_)
    ids = _ids(vocab.size, tokens)
    if matcher.is_finished():
        eos = set(vocab.eos_ids.tolist())
        out[[t for t in ids if t in eos]] = True
        return out
    for t in ids:
        out[t] = matcher.accepts(t)
    return out


def brute_force_state_mask(
    structure: CompiledStructure, state: Hashable, tokens: Iterable[int] | None = None
) -> NDArray[np.bool_]:
    """The tokens ``structure`` allows in ``state``, as booleans (``vocab.size``,), found without masks.

    ``state`` is one the structure gave (``structure.start``, or what :meth:`CompiledStructure.read` returned): a
    DFA state, or a grammar's configurations. A matchable token is allowed when
    :meth:`CompiledStructure.read` reads its bytes; an end-of-sequence token when
    :meth:`CompiledStructure.can_end` says so; any other special token never. Only the ids in ``tokens`` are
    tried; the others are False.
    """
    vocab = structure.vocab
    out = np.zeros(vocab.size, dtype=np.bool_)
    ids = _ids(vocab.size, tokens)
    eos = set(vocab.eos_ids.tolist())
    can_end = structure.can_end(state)
    for t in ids:
        if t in eos:
            out[t] = can_end
        elif vocab.matchable[t]:
            out[t] = structure.read(state, t) is not None
    return out


def check_mask(matcher: Matcher, tokens: Iterable[int] | None = None, *, show: int = 10) -> None:
    """Raise AssertionError, naming up to ``show`` tokens that differ, unless ``matcher.mask()`` equals
    :func:`brute_force_mask` (on the ids in ``tokens``, or on every id when ``tokens`` is None).

    The mask is also checked to allow no id past the vocabulary in its last word.
    """
    vocab = matcher.structure.vocab
    mask = matcher.mask()
    got = bitmask_to_bool(mask, vocab.size)
    want = brute_force_mask(matcher, tokens)
    ids = np.arange(vocab.size) if tokens is None else np.unique(np.fromiter((int(t) for t in tokens), np.int64))
    wrong = ids[got[ids] != want[ids]]
    padding = bitmask_to_bool(mask, 32 * len(mask))[vocab.size :]
    if len(wrong) == 0 and not padding.any():
        return
    lines = [
        f"id {t} {vocab.token_text(int(t))!r}: the mask {'allows' if got[t] else 'refuses'} it, "
        f"the brute force {'allows' if want[t] else 'refuses'} it"
        for t in wrong[:show].tolist()
    ]
    if len(wrong) > show:
        lines.append(f"... and {len(wrong) - show} more")
    if padding.any():
        past = (np.flatnonzero(padding) + vocab.size)[:show].tolist()
        lines.append(f"the mask allows ids past the vocabulary: {past}")
    head = f"{matcher!r}: the mask and the brute force differ on {len(wrong)} tokens"
    raise AssertionError("\n".join([head, *lines]))

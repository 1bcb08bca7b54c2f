"""Automata of free text: any UTF-8 string, or any one in which a word does not occur.

Free text is what a model may write before a tool call's trigger: the trigger's first occurrence must be the
trigger, so the text before it is "any text without the trigger" (a Knuth-Morris-Pratt automaton run alongside
the UTF-8 one), and a token that straddles the end of the text and the start of the trigger is read like any
other.
"""

from __future__ import annotations

import numpy as np

from constrain.automata.dfa import DEAD, ByteDFA
from constrain.automata.regex import regex_to_dfa
from constrain.errors import ArgumentError

#: Any UTF-8 string, the empty one included.
ANY_TEXT = "(?s:.*)"
#: Any non-empty UTF-8 string.
SOME_TEXT = "(?s:.+)"


def text_dfa(nonempty: bool = False) -> ByteDFA:
    """Any UTF-8 text (non-empty with ``nonempty``)."""
    return regex_to_dfa(SOME_TEXT if nonempty else ANY_TEXT)


def text_without(word: bytes | str) -> ByteDFA:
    """Any UTF-8 text in which ``word`` (non-empty) does not occur, as a minimal DFA."""
    if isinstance(word, str):
        word = word.encode()
    if not word:
        raise ArgumentError("word", word, "a non-empty trigger")
    text = text_dfa()
    n = len(word)
    # seen[k, b]: how much of ``word`` the text ends with after ``b``, having ended with its first k bytes
    seen = np.zeros((n, 256), dtype=np.int64)
    seen[0, word[0]] = 1
    fallback = 0
    for k in range(1, n):
        seen[k] = seen[fallback]
        seen[k, word[k]] = k + 1
        fallback = int(seen[fallback, word[k]])
    index = {(0, 0): 0}
    order = [(0, 0)]
    rows: list[np.ndarray] = []
    for text_state, matched in order:
        row = np.full(256, DEAD, dtype=np.int32)
        nxt_text = text.trans[text_state]
        for b in np.flatnonzero(nxt_text >= 0).tolist():
            k = int(seen[matched, b])
            if k == n:
                continue  # the word occurs: not free text
            pair = (int(nxt_text[b]), k)
            target = index.get(pair)
            if target is None:
                target = index[pair] = len(order)
                order.append(pair)
            row[b] = target
        rows.append(row)
    accepting = np.array([bool(text.accepting[t]) for t, _ in order])
    return ByteDFA(np.ascontiguousarray(np.stack(rows)), accepting).reduced()

"""Running a :class:`~constrain.grammar.Pushdown`: configurations, reading bytes, and token masks.

A *configuration* is a stack of frames, bottom first, each frame a global automaton state (all rule DFAs are
numbered in one space). The top frame is where reading happens; a frame below it holds the state its rule
returns to. Before a byte is read, a configuration expands (its *closure*): a state with a call edge pushes the
callee's start state (the caller frame moves to the return state), and an accepting state of a called rule pops.
Ambiguity is kept exact by carrying a *set* of configurations.

Masks are one numba walk of the vocabulary trie carrying that set; frames live in a pool that is rewound as the
walk backtracks, so a stack is never copied.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import njit

from .errors import StructureError
from .grammar import Grammar, Pushdown, build_pushdown
from .masks import DEFAULT_CACHE_BYTES, MaskCache
from .matcher import CompiledStructure
from .vocab import Vocabulary

#: A configuration: global states from the bottom frame to the top one.
Stack = tuple[int, ...]
#: The state of a grammar matcher: the set of live configurations, sorted.
Configs = tuple[Stack, ...]

#: Most configurations (after closure) one position may hold; past it the grammar is too ambiguous to follow.
MAX_CONFIGS = 256
#: Deepest stack a configuration may have (bounds nesting such as ``[[[[...]]]]``).
MAX_STACK_DEPTH = 256


class AmbiguityError(StructureError):
    """The grammar allows too many parses of the text so far to follow them all."""


@dataclass(frozen=True, eq=False)
class Machine:
    """All rule DFAs of a pushdown automaton in one global state space, as flat arrays for the kernels."""

    trans: np.ndarray  # int32 (S, 256), global targets or -1
    accepting: np.ndarray  # bool (S,)
    call_ptr: np.ndarray  # int64 (S + 1,): call edges of state s are call_ptr[s]:call_ptr[s + 1]
    call_start: np.ndarray  # int32: the callee's start state
    call_return: np.ndarray  # int32: the caller's state after the callee returns
    rule_start: np.ndarray  # int32 (R,): global start state of each rule

    @classmethod
    def from_pushdown(cls, pushdown: Pushdown) -> Machine:
        offsets = np.cumsum([0] + [dfa.num_states for dfa in pushdown.rules])
        trans = np.concatenate(
            [np.where(dfa.trans >= 0, dfa.trans + off, -1) for dfa, off in zip(pushdown.rules, offsets)]
        ).astype(np.int32)
        accepting = np.concatenate([dfa.accepting for dfa in pushdown.rules])
        ptr, starts, returns = [0], [], []
        for dfa, off in zip(pushdown.rules, offsets):
            for s in range(dfa.num_states):
                for k, callee in enumerate(dfa.callees):
                    t = int(dfa.calls[s, k])
                    if t >= 0:
                        starts.append(int(offsets[callee]))
                        returns.append(int(off) + t)
                ptr.append(len(starts))
        return cls(
            np.ascontiguousarray(trans),
            np.ascontiguousarray(accepting),
            np.asarray(ptr, dtype=np.int64),
            np.asarray(starts, dtype=np.int32),
            np.asarray(returns, dtype=np.int32),
            offsets[:-1].astype(np.int32),
        )

    @property
    def start(self) -> Configs:
        return ((int(self.rule_start[0]),),)

    # -- the Python reference used by matchers to read tokens ----------------------------------------------------

    def closure(self, configs: Configs) -> list[Stack]:
        """Every configuration reachable by pushes and pops without reading a byte (the inputs included)."""
        seen: set[Stack] = set()
        out: list[Stack] = []
        work = list(configs)
        while work:
            stack = work.pop()
            if stack in seen:
                continue
            seen.add(stack)
            out.append(stack)
            if len(out) > MAX_CONFIGS:
                raise AmbiguityError(f"more than {MAX_CONFIGS} parses are open at once")
            top = stack[-1]
            for k in range(self.call_ptr[top], self.call_ptr[top + 1]):
                if len(stack) < MAX_STACK_DEPTH:
                    work.append(stack[:-1] + (int(self.call_return[k]), int(self.call_start[k])))
            if self.accepting[top] and len(stack) > 1:
                work.append(stack[:-1])
        return out

    def read(self, configs: Configs, data: bytes) -> Configs:
        """The configurations after reading ``data`` (empty when a byte is rejected)."""
        trans = self.trans
        for byte in data:
            nxt = {stack[:-1] + (int(trans[stack[-1], byte]),) for stack in self.closure(configs)}
            configs = tuple(sorted(s for s in nxt if s[-1] >= 0))
            if not configs:
                return ()
        return configs

    def can_end(self, configs: Configs) -> bool:
        """Whether the text so far is a complete match: some configuration closes down to an accepting bottom."""
        return any(len(s) == 1 and self.accepting[s[0]] for s in self.closure(configs))

    # -- masks ---------------------------------------------------------------------------------------------------

    def mask_words(self, configs: Configs, trie, words: np.ndarray) -> None:
        """Set in ``words`` (uint32) the bit of every token readable from ``configs`` (end of sequence aside)."""
        depth_cap = trie.max_depth + 1
        level_cap = MAX_CONFIGS
        pool_cap = depth_cap * level_cap * 4 + sum(len(s) for s in configs)
        pool_state = np.empty(pool_cap, dtype=np.int32)
        pool_parent = np.empty(pool_cap, dtype=np.int32)
        tops = []
        used = 0
        for stack in configs:
            parent = -1
            for state in stack:
                pool_state[used] = state
                pool_parent[used] = parent
                parent = used
                used += 1
            tops.append(parent)
        status = _walk_pushdown(
            self.trans, self.accepting, self.call_ptr, self.call_start, self.call_return,
            np.asarray(tops, dtype=np.int32), used, pool_state, pool_parent, level_cap,
            trie.node_key, trie.node_next, trie.node_token_ptr, trie.token_ids, depth_cap, words,
        )  # fmt: skip
        if status < 0:
            raise AmbiguityError(f"more than {MAX_CONFIGS} parses are open at once inside one token")


class PushdownMasks(MaskCache):
    """Masks of pushdown configurations, cached per configuration set."""

    def __init__(self, machine: Machine, vocab: Vocabulary, *, cache_bytes: int = DEFAULT_CACHE_BYTES):
        super().__init__(vocab, cache_bytes=cache_bytes)
        self.machine = machine

    def _walk(self, configs: Configs, words: np.ndarray) -> None:
        self.machine.mask_words(configs, self.vocab.trie, words)

    def _accepting(self, configs: Configs) -> bool:
        return self.machine.can_end(configs)


class GrammarStructure(CompiledStructure):
    """A context-free structure: a pushdown automaton with one DFA per grammar rule."""

    def __init__(self, pushdown: Pushdown, vocab: Vocabulary, *, source: str = "", cache_bytes: int = DEFAULT_CACHE_BYTES):
        super().__init__(vocab, source=source)
        self.pushdown = pushdown
        self.machine = Machine.from_pushdown(pushdown)
        self.start = self.machine.start
        self.masks = PushdownMasks(self.machine, vocab, cache_bytes=cache_bytes)

    def read(self, state: Configs, token: int) -> Configs | None:
        return self.machine.read(state, self.vocab.token_bytes(token)) or None

    def can_end(self, state: Configs) -> bool:
        return self.machine.can_end(state)

    def __repr__(self) -> str:
        rules, states = len(self.pushdown.rules), self.pushdown.num_states
        return f"GrammarStructure({self.source!r}, rules={rules}, states={states}, vocab={self.vocab.size:,})"


def compile_grammar(grammar: Grammar, vocab: Vocabulary, **options) -> GrammarStructure:
    """Compile a grammar (the IR of :mod:`constrain.grammar`) for ``vocab``; ``options``: ``cache_bytes``."""
    return GrammarStructure(build_pushdown(grammar), vocab, source=grammar.start, **options)


@njit(cache=True, nogil=True)
def _expand(
    trans, accepting, call_ptr, call_start, call_return, pool_state, pool_parent, pool_top, configs, n, out, work
):
    """Closure of ``configs[:n]`` (top-frame indices) into ``out``; new frames go to the pool from ``pool_top``;
    ``work`` is scratch space. Returns (count, new pool top), or count -1 when a bound is exceeded."""
    level_cap = out.shape[0]
    count = 0
    w = 0
    for j in range(n):
        work[w] = configs[j]
        w += 1
    while w > 0:
        w -= 1
        f = work[w]
        state = pool_state[f]
        parent = pool_parent[f]
        duplicate = False
        for j in range(count):
            g = out[j]
            if pool_state[g] == state and pool_parent[g] == parent:
                duplicate = True
                break
        if duplicate:
            continue
        if count >= level_cap or w + (call_ptr[state + 1] - call_ptr[state]) + 1 >= work.shape[0]:
            return -1, pool_top
        out[count] = f
        count += 1
        for k in range(call_ptr[state], call_ptr[state + 1]):
            if pool_top + 2 > pool_state.shape[0]:
                return -1, pool_top
            pool_state[pool_top] = call_return[k]
            pool_parent[pool_top] = parent
            pool_state[pool_top + 1] = call_start[k]
            pool_parent[pool_top + 1] = pool_top
            work[w] = pool_top + 1
            w += 1
            pool_top += 2
        if accepting[state] and parent >= 0:
            work[w] = parent
            w += 1
    return count, pool_top


@njit(cache=True, nogil=True)
def _walk_pushdown(
    trans, accepting, call_ptr, call_start, call_return, tops, pool_used, pool_state, pool_parent, level_cap,
    node_key, node_next, node_token_ptr, token_ids, depth_cap, out,
):
    """Set in ``out`` the bit of every token whose bytes some configuration can read. Returns 0, or -1 when the
    configurations outgrow ``level_cap``.

    ``level[d]`` holds the configurations after ``d`` bytes of the current trie path; ``closed[d]`` their
    closure, computed once per trie node and shared by all its children. Pool frames made for a level are
    dropped (the pool top rewound) when the walk moves to another branch.
    """
    work = np.empty(level_cap * 4, dtype=np.int32)
    level = np.empty((depth_cap + 1, level_cap), dtype=np.int32)
    level_n = np.zeros(depth_cap + 1, dtype=np.int64)
    closed = np.empty((depth_cap + 1, level_cap), dtype=np.int32)
    closed_n = np.full(depth_cap + 1, -1, dtype=np.int64)  # -1: not computed for the current path
    pool_mark = np.zeros(depth_cap + 1, dtype=np.int64)  # pool top after level d's frames
    closed_mark = np.zeros(depth_cap + 1, dtype=np.int64)  # pool top after level d's closure
    for j in range(tops.shape[0]):
        level[0, j] = tops[j]
    level_n[0] = tops.shape[0]
    pool_mark[0] = pool_used
    n = node_key.shape[0]
    i = 0
    while i < n:
        key = node_key[i]
        depth = key >> 8
        byte = key & 255
        parent = depth - 1
        if closed_n[parent] < 0:
            count, top = _expand(
                trans, accepting, call_ptr, call_start, call_return, pool_state, pool_parent,
                pool_mark[parent], level[parent], level_n[parent], closed[parent], work,
            )  # fmt: skip
            if count < 0:
                return -1
            closed_n[parent] = count
            closed_mark[parent] = top
        top = closed_mark[parent]
        count = 0
        for j in range(closed_n[parent]):
            f = closed[parent, j]
            t = trans[pool_state[f], byte]
            if t < 0:
                continue
            up = pool_parent[f]
            duplicate = False
            for m in range(count):
                g = level[depth, m]
                if pool_state[g] == t and pool_parent[g] == up:
                    duplicate = True
                    break
            if duplicate:
                continue
            if count >= level_cap or top >= pool_state.shape[0]:
                return -1
            pool_state[top] = t
            pool_parent[top] = up
            level[depth, count] = top
            count += 1
            top += 1
        if count == 0:
            i = node_next[i]
            continue
        level_n[depth] = count
        pool_mark[depth] = top
        closed_n[depth] = -1
        for k in range(node_token_ptr[i], node_token_ptr[i + 1]):
            t = token_ids[k]
            out[t >> 5] |= np.uint32(1) << np.uint32(t & 31)
        i += 1
    return 0

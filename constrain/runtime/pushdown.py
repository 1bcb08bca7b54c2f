"""Running a :class:`~constrain.grammar.ir.Pushdown`: configurations, reading bytes, and token masks.

A *configuration* is a stack of frames, bottom first, each frame a global automaton state (all rule DFAs are
numbered in one space). The top frame is where reading happens; a frame below it holds the state its rule
returns to. Before a byte is read, a configuration expands (its *closure*): a state with a call edge pushes the
callee's start state (the caller frame moves to the return state), and an accepting state of a called rule pops.
Ambiguity is kept exact by carrying a *set* of configurations.

Masks are one numba walk of the vocabulary trie carrying that set; frames live in a pool that is rewound as the
walk backtracks, so a stack is never copied.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterable

import numpy as np

from constrain import pages
from constrain.cache import BoundedCache
from constrain.errors import AmbiguityError, DepthError
from constrain.grammar.ir import Grammar, Pushdown
from constrain.grammar.rules import build_pushdown
from constrain.grammar.tokens import resolve_tokens
from constrain.runtime.lexical import (
    _NO_RANGES,
    LexicalMasks,
    _entry_bytes,
)
from constrain.runtime.masks import DEFAULT_CACHE_BYTES, MaskCache, check_cache_bytes
from constrain.runtime.matcher import (
    TRANSITION_CACHE_SHARE,
    CompiledStructure,
    Matcher,
    TransitionCache,
    state_bytes,
)
from constrain.runtime.pushdown_kernels import _append_rule, _walk_pushdown
from constrain.vocab.vocabulary import Vocabulary

#: A configuration: global states from the bottom frame to the top one.
Stack = tuple[int, ...]
#: The state of a grammar matcher: the set of live configurations, sorted.
Configs = tuple[Stack, ...]

#: Most configurations (after closure) one position may hold; past it the grammar is too ambiguous to follow.
MAX_CONFIGS = 256
#: Deepest stack a configuration that reads a byte may have (bounds nesting such as ``[[[[...]]]]``).
MAX_STACK_DEPTH = 256
#: What :attr:`Machine.rule_start` takes per rule: a list item and the int it points to.
_RULE_ENTRY_BYTES = 36


class Machine:
    """The rule DFAs of a pushdown automaton in one global state space, as flat arrays for the kernels.

    A rule's states are appended when it is first called, so a lazily built :class:`Pushdown` determinises only
    the rules a matcher reaches: until then a call edge into the rule holds ``-1 - rule`` as its callee's start,
    and whatever follows call edges (:meth:`closure`, :meth:`walk`, a structure's cached steps) asks
    :meth:`add_rule` first. States keep their numbers as the machine grows, so whatever is cached per state stays
    true; the arrays have room to spare and are replaced by larger copies when full (:attr:`version` counts
    the allocations; :attr:`on_grow` is told of each append).
    """

    #: The states a lazily built machine has room for from the start (a megabyte of transitions, allocated but
    #: not written): most schemas' texts reach fewer, so their machine never copies its arrays into larger ones.
    INITIAL_STATES = 1024
    #: How many times larger the arrays become when full. Copying them is what growing costs (the pages of the
    #: copy are written for the first time), and room not yet written costs no memory.
    GROWTH = 4

    def __init__(self, pushdown: Pushdown):
        self.pushdown = pushdown
        num_rules = len(pushdown.names)
        #: The global start state of each rule added; -1: not added yet (a list: read one item at a time, in Python).
        self.rule_start = [-1] * num_rules
        self._rule_size = [0] * num_rules
        #: Per rule: True when it calls no other rule (a lexical piece).
        self.call_free = [not calling for calling in pushdown.calling]
        self.num_states = 0
        self.version = 0
        self._waiting: dict[int, list[int]] = {}  # rule not added yet -> the edges whose callee it is
        self._lock = threading.RLock()
        #: A weak reference to what is called when rules are appended, after their states are written and before
        #: they are published (a :class:`GrammarStructure` makes its views again when the arrays were replaced,
        #: and counts its bytes again). Weak, so that the structure is freed as soon as it is dropped, not at a
        #: collection.
        self.on_grow: weakref.WeakMethod | None = None
        complete = all(pushdown.is_built(i) for i in range(num_rules))
        first = list(range(num_rules)) if complete else [0]
        dfas = [pushdown.rule(i) for i in first]
        states = sum(d.num_states for d in dfas)
        edges = sum(d.num_calls for d in dfas)
        if not complete:  # room for the rules its matchers will add: memory not yet written costs none
            states, edges = max(states, self.INITIAL_STATES), max(edges, self.INITIAL_STATES)
        self._allocate(max(1, states), max(1, edges))
        self._append(first, dfas)

    def _allocate(self, states: int, edges: int) -> None:
        """Arrays for ``states`` states and ``edges`` call edges, holding what the current ones hold."""
        used, edges_used = self.num_states, (int(self.call_ptr[self.num_states]) if self.num_states else 0)
        trans = pages.empty((states, 256), np.int32)  # mapped from 1 MiB on: see constrain.pages
        accepting = np.zeros(states, dtype=bool)
        plain = np.zeros(states, dtype=bool)
        state_rule = np.zeros(states, dtype=np.int32)
        call_ptr = np.zeros(states + 1, dtype=np.int64)
        call_start = np.empty(edges, dtype=np.int32)
        call_return = np.empty(edges, dtype=np.int32)
        if used:
            trans[:used] = self.trans[:used]
            accepting[:used] = self.accepting[:used]
            plain[:used] = self.plain[:used]
            state_rule[:used] = self.state_rule[:used]
            call_ptr[: used + 1] = self.call_ptr[: used + 1]
            call_start[:edges_used] = self.call_start[:edges_used]
            call_return[:edges_used] = self.call_return[:edges_used]
        self.trans = trans  # int32 (capacity, 256): global targets or -1
        self.accepting = accepting
        #: Per state: True when its closure is itself (it can neither call nor return).
        self.plain = plain
        self.state_rule = state_rule  # the rule each state belongs to
        self.call_ptr = call_ptr  # call edges of state s are call_ptr[s]:call_ptr[s + 1]
        self.call_start = call_start  # the callee's start state, or -1 - callee when that rule is not added yet
        self.call_return = call_return  # the caller's state after the callee returns
        self.version += 1

    def add_rule(self, rule: int) -> int:
        """Add rule ``rule`` (building its DFA if the pushdown has not yet) and return its start state. Errors of
        a late build (a rule past the automaton bounds) are raised here, naming the rule and where it came from."""
        start = self.rule_start[rule]
        if start >= 0:
            return start
        with self._lock:
            if self.rule_start[rule] < 0:
                dfa = self.pushdown.rule(rule)
                self._count_rules()
                self._append([rule], [dfa])
            return self.rule_start[rule]

    def _count_rules(self) -> None:
        """Room in the per-rule lists for the rules the pushdown added (writing a deferred rule adds those it
        brings)."""
        pushdown, known = self.pushdown, len(self.rule_start)
        added = len(pushdown.names) - known
        if added:
            self.rule_start.extend([-1] * added)
            self._rule_size.extend([0] * added)
            self.call_free.extend(not calling for calling in pushdown.calling[known:])

    def _append(self, rules: list[int], dfas: list) -> None:
        """Append the states and call edges of ``rules`` (with DFAs ``dfas``), then point the edges waiting for
        them at their starts: until then nothing can reach the new states. A matcher's mask appends one rule at a
        time, so the Python around the kernel is kept to plain ints and lists."""
        base = self.num_states
        edges_used = int(self.call_ptr[base])
        total, new_edges = base, 0
        for dfa in dfas:
            total += dfa.num_states
            new_edges += dfa.num_calls
        if total > len(self.accepting) or edges_used + new_edges > len(self.call_start):
            grow = self.GROWTH
            self._allocate(
                max(total, grow * len(self.accepting)), max(edges_used + new_edges, grow * len(self.call_start))
            )
        starts: dict[int, int] = {}
        offset = base
        rule_size, call_free = self._rule_size, self.call_free
        for rule, dfa in zip(rules, dfas):
            starts[rule] = offset
            rule_size[rule] = dfa.num_states
            call_free[rule] = not dfa.callees  # a rule written later was taken for a calling one until now
            offset += dfa.num_states
        rule_start = self.rule_start
        end = edges_used
        unresolved = False  # whether an edge calls a rule not added yet
        for rule, dfa in zip(rules, dfas):
            targets = []
            for callee in dfa.callees:
                start = starts.get(callee, rule_start[callee])
                if start < 0:
                    start, unresolved = -1 - callee, True
                targets.append(start)
            end = _append_rule(
                dfa.trans, dfa.accepting, dfa.calls, np.array(targets, dtype=np.int32), rule, starts[rule],
                self.trans, self.accepting, self.plain, self.state_rule, self.call_ptr, self.call_start,
                self.call_return,
            )  # fmt: skip
        if unresolved:
            waiting = self._waiting
            for edge, start in enumerate(self.call_start[edges_used:end].tolist(), edges_used):
                if start < 0:
                    waiting.setdefault(-1 - start, []).append(edge)
        self.num_states = total
        listener = self.on_grow() if self.on_grow is not None else None
        if listener is not None:  # told before the new states are published (it may make views of new arrays)
            listener()
        call_start = self.call_start
        for rule, start in starts.items():  # published last: a reader that sees a start finds its states written
            for edge in self._waiting.pop(rule, ()):
                call_start[edge] = start
            rule_start[rule] = start

    @property
    def nbytes(self) -> int:
        """The bytes its states and call edges take in its arrays (the room past them is not written, and costs
        no memory until it is)."""
        states, edges = self.num_states, int(self.call_ptr[self.num_states])
        per_state = sum(a[:1].nbytes for a in (self.trans, self.accepting, self.plain, self.state_rule, self.call_ptr))
        per_edge = self.call_start.itemsize + self.call_return.itemsize
        return states * per_state + edges * per_edge + _RULE_ENTRY_BYTES * len(self.rule_start)

    def locate(self, state: int) -> tuple[int, int]:
        """(rule index, state within that rule's DFA) of a global state."""
        rule = int(self.state_rule[state])
        return rule, state - self.rule_start[rule]

    def rule_states(self, rule: int) -> slice:
        """The global states of one rule (added)."""
        start = self.rule_start[rule]
        return slice(start, start + self._rule_size[rule])

    @property
    def start(self) -> Configs:
        return ((self.rule_start[0],),)

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
                start = int(self.call_start[k])
                if start < 0:
                    start = self.add_rule(-1 - start)
                work.append(stack[:-1] + (int(self.call_return[k]), start))
            if self.accepting[top] and len(stack) > 1:
                work.append(stack[:-1])
        return out

    def read(self, configs: Configs, data: bytes) -> Configs:
        """The configurations after reading ``data`` (empty when a byte is rejected). Raises :class:`DepthError`
        when a byte is read in a frame deeper than :data:`MAX_STACK_DEPTH` (a closure is finite without a bound:
        left recursion is refused when the pushdown is built, so the bound is the text's nesting)."""
        for byte in data:
            if len(configs) == 1 and self.plain[configs[0][-1]]:  # the common case: nothing to call or return
                stack = configs[0]
                nxt_state = int(self.trans[stack[-1], byte])
                if nxt_state < 0:
                    return ()
                configs = (stack[:-1] + (nxt_state,),)
                continue
            closure = self.closure(configs)  # which may add rules: the table is read after it
            trans = self.trans
            nxt = {stack[:-1] + (int(trans[stack[-1], byte]),) for stack in closure}
            configs = tuple(sorted(s for s in nxt if s[-1] >= 0))
            if not configs:
                return ()
            deepest = max(len(s) for s in configs)
            if deepest > MAX_STACK_DEPTH:
                raise DepthError(
                    f"the text nests deeper than MAX_STACK_DEPTH = {MAX_STACK_DEPTH} rule calls (a parse needs "
                    f"{deepest} frames at byte {byte!r})"
                )
        return configs

    def can_end(self, configs: Configs) -> bool:
        """Whether the text so far is a complete match: some configuration closes down to an accepting bottom."""
        return self.closed_can_end(self.closure(configs))

    def closed_can_end(self, stacks: list[Stack]) -> bool:
        """:meth:`can_end` of configurations already expanded by :meth:`closure`."""
        return any(len(s) == 1 and self.accepting[s[0]] for s in stacks)

    # -- masks ---------------------------------------------------------------------------------------------------

    def walk(
        self,
        configs: Configs,
        trie,
        words: np.ndarray,
        ranges: np.ndarray | None = None,
        *,
        record_pops: bool = False,
        closed: bool = False,
    ) -> np.ndarray:
        """Set in ``words`` (uint32) the bit of every token readable from ``configs`` (end of sequence aside).

        ``ranges`` (rows of first node, end node, depth already read) limits the walk to those trie subtrees,
        as if their first ``depth`` bytes had been read; by default, the whole trie. ``closed`` says the
        configurations are already expanded (no call or return before the first byte). With ``record_pops``,
        returns (as ranges, read-only) the trie subtrees below the nodes after which a configuration's bottom
        frame could return to a caller below it, i.e. where a caller's context decides the rest; otherwise an
        empty array.
        """
        scratch = _walk_scratch(trie)
        if len(configs) == 1 and len(configs[0]) == 1:  # a lone top frame: every local walk of a state
            scratch.one_state[0] = configs[0][0]
            top_state, top_parent, used = scratch.one_state, scratch.no_parent, 0
            pool_state, pool_parent = scratch.base_pool_state, scratch.base_pool_parent
        else:
            pool_cap = scratch.base_pool_cap + sum(len(s) for s in configs)
            if len(scratch.pool_state) < pool_cap:
                scratch.grow_pool(pool_cap)
            pool_state, pool_parent = scratch.pool_state[:pool_cap], scratch.pool_parent[:pool_cap]
            states, parents = [], []
            used = 0
            for stack in configs:
                parent = -1
                for state in stack[:-1]:
                    pool_state[used] = state
                    pool_parent[used] = parent
                    parent = used
                    used += 1
                states.append(stack[-1])
                parents.append(parent)
            top_state, top_parent = np.array(states, dtype=np.int32), np.array(parents, dtype=np.int32)
        while True:
            status, found = _walk_pushdown(
                self.trans, self.accepting, self.call_ptr, self.call_start, self.call_return, top_state,
                top_parent, used, pool_state, pool_parent, trie.node_key, trie.node_next, trie.node_token_ptr,
                trie.token_ids, trie.root_children, scratch.whole if ranges is None else ranges, not closed, words,
                scratch.pops if record_pops else scratch.pops[:0], scratch.work, scratch.levels, scratch.marks,
            )  # fmt: skip
            if status > -2:
                break
            self.add_rule(-2 - status)  # a callee the walk reached, not built yet: build it and walk again
        if status < 0:
            raise AmbiguityError(f"more than {MAX_CONFIGS} parses are open at once inside one token")
        if not len(found):
            return _NO_RANGES
        found.flags.writeable = False
        return found


class _WalkScratch:
    """The arrays a pushdown walk works in, kept per thread for one trie: a first-visit mask walks few tokens,
    and allocating these (a few hundred KB) each time cost more than the walk itself."""

    def __init__(self, trie):
        self.trie = trie
        depth_cap = trie.max_depth + 1
        #: Pool frames a walk may push (the frames below its tops come on top of that).
        self.base_pool_cap = depth_cap * MAX_CONFIGS * 4
        self.grow_pool(2 * self.base_pool_cap)
        self.pops = np.empty(trie.num_nodes + 1, dtype=np.int32)
        self.work = np.empty((2, MAX_CONFIGS * 4), dtype=np.int32)  # the closure's work list: states, parents
        self.levels = np.empty((4, depth_cap + 1, MAX_CONFIGS), dtype=np.int32)  # see _walk_pushdown
        self.marks = np.empty((5, depth_cap + 1), dtype=np.int64)
        self.whole = np.array([[0, trie.num_nodes, 0]], dtype=np.int64)
        self.one_state = np.zeros(1, dtype=np.int32)
        self.no_parent = np.full(1, -1, dtype=np.int32)

    def grow_pool(self, size: int) -> None:
        self.pool_state = np.empty(size, dtype=np.int32)
        self.pool_parent = np.empty(size, dtype=np.int32)
        self.base_pool_state = self.pool_state[: self.base_pool_cap]
        self.base_pool_parent = self.pool_parent[: self.base_pool_cap]


_scratch = threading.local()


def _walk_scratch(trie) -> _WalkScratch:
    """This thread's walk arrays for ``trie``."""
    scratch = getattr(_scratch, "walk", None)
    if scratch is None or scratch.trie is not trie:
        scratch = _scratch.walk = _WalkScratch(trie)
    return scratch


class PushdownMasks(MaskCache):
    """Masks of pushdown configurations, cached per configuration set.

    A configuration's mask splits in two. The tokens its top frame reads without returning to its caller depend
    on that frame's state alone: they are walked once per state and kept (with the trie nodes where the frame
    could return) in a cache shared by every configuration. Only the rest, the tokens that cross a return, are
    walked for the actual caller, and only below those recorded nodes.

    The mask of one stack is kept too when its top is lexical or it shares a position with other stacks: a
    lexical top's walk depends only on its bounded language, so the counted positions of a long string (one
    state each, one language) share one stack mask, and a set of stacks is the union of its stacks' masks.
    """

    def __init__(
        self, pushdown: Pushdown, machine: Machine, vocab: Vocabulary, *, cache_bytes: int = DEFAULT_CACHE_BYTES
    ):
        check_cache_bytes(cache_bytes)
        super().__init__(vocab, cache_bytes=cache_bytes // 2)
        self.pushdown = pushdown
        self.machine = machine
        self._local = BoundedCache(cache_bytes // 4)  # state -> (words, pop ranges)
        self._stacks = BoundedCache(cache_bytes // 4)  # (frames below, top's walk key) -> words
        self._lexical = LexicalMasks.of(vocab)
        self._hashes = np.zeros(machine.trans.shape[0], dtype=np.uint64)
        self._hashed = np.zeros(len(machine.rule_start), dtype=bool)

    def _rule_hashes(self, rule: int) -> np.ndarray:
        """The global hash array, with the bounded-language hashes of ``rule``'s states filled in."""
        if rule >= len(self._hashed) or not self._hashed[rule]:
            if rule >= len(self._hashed):  # a rule added since (written from a deferred one): room for its flag
                self._hashed = np.concatenate([self._hashed, np.zeros(len(self.machine.rule_start), dtype=bool)])
            if len(self._hashes) < self.machine.num_states:  # the machine added rules since: room for theirs
                grown = np.zeros(self.machine.trans.shape[0], dtype=np.uint64)
                grown[: len(self._hashes)] = self._hashes
                self._hashes = grown
            dfa = self.pushdown.rule(rule)
            self._hashes[self.machine.rule_states(rule)] = dfa.language_hashes(self._lexical.depth)
            self._hashed[rule] = True
        return self._hashes

    def local(self, state: int) -> tuple[np.ndarray, np.ndarray]:
        """(words, pop ranges) of a top frame in ``state`` that starts with a byte of its own rule: the tokens it
        reads without returning, and the trie subtrees (first node, end node, depth) whose tokens return to the
        caller partway."""
        entry = self._local.get(state)
        if entry is not None:
            return entry
        rule, local_state = self.machine.locate(state)
        if self.machine.call_free[rule]:  # a lexical piece: every structure over this vocabulary shares its walks
            entry = self._lexical.walk_without_words(self.pushdown.rule(rule), local_state)
            if entry is None:
                entry = self._lexical.walk(self.machine.trans, self.machine.accepting, self._rule_hashes(rule), state)
        else:
            entry = self._local_walk(state)
        self._local.put(state, entry, _entry_bytes(entry))
        return entry

    def _local_walk(self, state: int) -> tuple[np.ndarray, np.ndarray]:
        words = np.zeros(self.width, dtype=np.uint32)
        ranges = self.machine.walk(((state,),), self.vocab.trie, words, record_pops=True, closed=True)
        words.flags.writeable = False
        return words, ranges

    def compute(self, configs: Configs) -> np.ndarray:
        if len(configs) == 1 and self.machine.plain[configs[0][-1]]:
            # One configuration that can neither call nor return (inside a key, a literal, a number): it is its own
            # closure and cannot end, and its mask is its walk's read-only words, shared, not copied.
            return self._stack_words(configs[0], 1).view(np.int32)
        # Expanding first makes every pushed rule a top of its own, so a lexical rule entered right here (a
        # string where a value starts) is served from its shared walk instead of being walked again.
        stacks = self.machine.closure(configs)
        can_end = self.machine.closed_can_end(stacks)
        parts = [self._stack_words(stack, len(stacks)) for stack in stacks]
        if len(parts) == 1 and not can_end:
            # The mask is one walk's words, already read-only: shared, not copied. A first-visit mask is mostly
            # passes over 32 KB arrays that are not in the CPU cache yet, so each pass saved counts.
            return parts[0].view(np.int32)
        words = parts[0].copy()
        for part in parts[1:]:
            words |= part
        if can_end:
            words |= self._eos_words
        mask = words.view(np.int32)
        mask.flags.writeable = False
        return mask

    def _stack_words(self, stack: Stack, num_stacks: int) -> np.ndarray:
        """The (read-only) tokens one expanded configuration can read."""
        top = stack[-1]
        local_words, ranges = self.local(top)
        if len(stack) == 1 or not len(ranges):
            return local_words
        rule, _ = self.machine.locate(top)
        lexical = bool(self.machine.call_free[rule])
        key = (stack[:-1], int(self._rule_hashes(rule)[top])) if lexical else stack
        # A calling top alone at its position: the configuration's own mask cache holds the result.
        cached = lexical or num_stacks > 1
        stack_words = self._stacks.get(key) if cached else None
        if stack_words is None:
            stack_words = local_words.copy()
            self.machine.walk((stack[:-1],), self.vocab.trie, stack_words, ranges)
            stack_words.flags.writeable = False
            if cached:
                self._stacks.put(key, stack_words, stack_words.nbytes)
        return stack_words


class GrammarStructure(CompiledStructure):
    """A context-free structure: a pushdown automaton with one DFA per grammar rule."""

    def __init__(
        self, pushdown: Pushdown, vocab: Vocabulary, *, source: str = "", cache_bytes: int = DEFAULT_CACHE_BYTES
    ):
        super().__init__(vocab, source=source, cache_bytes=cache_bytes)
        self.pushdown = pushdown
        self.machine = machine = Machine(pushdown)
        self.start = machine.start
        self.masks = PushdownMasks(pushdown, machine, vocab, cache_bytes=cache_bytes)
        self._views()
        machine.on_grow = weakref.WeakMethod(self._grown)
        self._data = memoryview(vocab.data)
        self._offsets = memoryview(vocab.offsets).cast("B").cast("q")
        # What reading a token takes, cached on top of the structure's transitions (each a 32nd of ``cache_bytes``):
        # the runs of plain top frames, keyed by ``top * vocab.size + token`` (:meth:`transition`), and the local
        # steps and closures of states, keyed by ``state << 9 | (byte + 1)`` with byte -1 for the closure
        # (:meth:`_step`). Int keys: cheaper to make and to hash than tuples.
        self._runs = TransitionCache(cache_bytes // (2 * TRANSITION_CACHE_SHARE))
        self._local = TransitionCache(cache_bytes // (2 * TRANSITION_CACHE_SHARE))

    def _views(self) -> None:
        """Flat views of the machine's arrays whose items index as Python ints, for reading a token's bytes
        without a numpy scalar per byte; made again whenever the machine replaces its arrays. A loop that holds
        views in locals takes them again after a call that can add a rule: states it adds are only in the new
        arrays."""
        machine = self.machine
        self._views_version = machine.version
        self._trans = memoryview(machine.trans).cast("B").cast("i")
        self._plain = memoryview(machine.plain)
        self._accepting = memoryview(machine.accepting)
        self._call_ptr = memoryview(machine.call_ptr)
        self._call_start = memoryview(machine.call_start)
        self._call_return = memoryview(machine.call_return)

    def _grown(self) -> None:
        """The machine appended rules: views of its arrays are made again if it replaced them, and
        :attr:`on_grown` is told."""
        if self._views_version != self.machine.version:
            self._views()
        if self.on_grown is not None:
            self.on_grown()

    def matcher(self) -> GrammarMatcher:
        """A new matcher at the start of the structure."""
        return GrammarMatcher(self)

    def read(self, state: Configs, token: int) -> Configs | None:
        """The configurations after ``token``'s bytes (None when rejected): what :meth:`Machine.read` gives (or
        raises), computed another way (:meth:`transition`), keeping nothing in :attr:`transitions`."""
        return self._read_token(state, token, None)

    def transition(self, state: Configs, token: int) -> Configs | None:
        """:meth:`read`, for a matcher (the transition is not in :attr:`transitions`), keeping what it reads.

        The common case first: one configuration whose top frame can neither call nor return (inside a key, a
        string, a literal). Until a byte leads to a state that can, only its top frame changes, whatever lies
        below: the run of the token's bytes through the flat table is cached per (top state, token)
        (:meth:`_run`) and the stack is rebuilt around it. A :class:`GrammarMatcher` looks such runs up before
        anything else, so they are not kept in :attr:`transitions` too. Several such configurations each take
        their run (:meth:`_runs_of`). Any other byte is one :meth:`_step`, from steps cached per (state, byte);
        where a bound could be crossed, the rest of the token goes to :meth:`Machine.read`, which raises as it
        would have. What is read that way is kept in :attr:`transitions`."""
        return self._read_token(state, token, self.transitions)

    def _read_token(self, state: Configs, token: int, keep: TransitionCache | None) -> Configs | None:
        if len(state) == 1:
            stack = state[0]
            top = stack[-1]
            if self._plain[top]:
                run = self._run(top, token)
                if type(run) is int:
                    return (stack[:-1] + (run,),) if run >= 0 else None
                top, at = run
                nxt = self._read_from((stack[:-1] + (top,),), at, self._offsets[token + 1])
            else:
                nxt = self._read_from(state, self._offsets[token], self._offsets[token + 1])
        else:
            nxt = self._runs_of(state, token)
            if nxt is None:
                nxt = self._read_from(state, self._offsets[token], self._offsets[token + 1])
            elif not nxt:
                return None
        if nxt is not None and keep is not None:
            keep.put((state, token), nxt, 2 * state_bytes(nxt))
        return nxt

    def _run(self, top: int, token: int) -> int | tuple[int, int]:
        """``token``'s bytes read from a top frame in the plain state ``top`` while it stays plain (cached): the new
        top state when they all are read, -1 when one is rejected, else (the first state that is not plain,
        where the rest of the token's bytes start in the vocabulary's)."""
        key = top * self._size + token
        run = self._runs.get(key)
        return run if run is not None else self._new_run(top, token, key)

    def _new_run(self, top: int, token: int, key: int) -> int | tuple[int, int]:
        """:meth:`_run`, not cached yet (``key``: its key)."""
        trans, data, plain = self._trans, self._data, self._plain
        at, end = self._offsets[token], self._offsets[token + 1]
        run = top
        while at < end:  # an empty token (no vocabulary makes one matchable) reads nothing
            run = trans[(run << 8) | data[at]]
            at += 1
            if run < 0:
                break
            if at < end and not plain[run]:
                run = (run, at)
                break
        self._runs.put(key, run, 64)
        return run

    def _runs_of(self, state: Configs, token: int) -> Configs | None:
        """Several configurations whose tops are all plain, each reading the whole token while its top stays plain
        (two parses of one key, say): each takes its run (:meth:`_run`), since the reference reads the
        configurations of a set one by one (its closure and its byte step are unions over them) and such a set
        never grows, calls, returns or deepens. The set after the token (deduplicated, sorted as the reference
        sorts it; empty when every top rejects a byte), or None when some top is not plain, or stops being so
        before the token's end (:meth:`_read_from` then reads it)."""
        plain = self._plain
        out = set()
        for stack in state:
            top = stack[-1]
            if not plain[top]:
                return None
            run = self._run(top, token)
            if type(run) is not int:
                return None
            if run >= 0:
                out.add(stack[:-1] + (run,))
        return tuple(sorted(out))

    def _read_from(self, state: Configs, at: int, end: int) -> Configs | None:
        """:meth:`read` of the vocabulary's bytes ``data[at:end]``."""
        trans, data, plain = self._trans, self._data, self._plain
        while at < end:
            if len(state) == 1 and plain[state[0][-1]]:
                stack = state[0]
                top = stack[-1]
                while True:
                    top = trans[(top << 8) | data[at]]
                    at += 1
                    if top < 0:
                        return None
                    if at == end or not plain[top]:
                        break
                state = (stack[:-1] + (top,),)
                continue
            if len(state) > 1 and all(plain[stack[-1]] for stack in state):
                state, at = self._plain_runs(state, at, end)
                if not state:
                    return None
                continue
            nxt = self._step(state, data[at])
            if nxt is None:  # a bound may be crossed: the reference raises exactly where it would
                return self.machine.read(state, data[at:end]) or None
            if not nxt:
                return None
            state = nxt
            at += 1
            trans, plain = self._trans, self._plain  # the step may have added rules
        return state

    def _plain_runs(self, state: Configs, at: int, end: int) -> tuple[Configs, int]:
        """Several configurations whose tops are all plain read ``data[at:end]`` while they stay so: each top moves
        alone, and the set is rebuilt (deduplicated, sorted as the reference sorts it) once, not after every
        byte. The reference's closure of such a set is the set itself and its depth does not change, so no bound
        can be crossed. Returns (the configurations, where the rest of the bytes start): empty when every top
        rejects a byte."""
        trans, data, plain = self._trans, self._data, self._plain
        live = list(range(len(state)))
        tops = [stack[-1] for stack in state]
        while True:
            byte = data[at]
            at += 1
            alive: list[int] = []
            moved: list[int] = []
            stop = False
            for i, top in zip(live, tops):
                top = trans[(top << 8) | byte]
                if top >= 0:
                    alive.append(i)
                    moved.append(top)
                    if not plain[top]:
                        stop = True
            live, tops = alive, moved
            if not live:
                return (), at
            if stop or at == end:
                break
        return tuple(sorted({state[i][:-1] + (top,) for i, top in zip(live, tops)})), at

    def _step(self, configs: Configs, byte: int) -> Configs | None:
        """The configurations after one byte, as :meth:`Machine.read` computes them (its closure, then the byte),
        or None when that could raise (more than :data:`MAX_CONFIGS` in the closure, or a stack deeper than
        :data:`MAX_STACK_DEPTH`): the caller then runs the reference.

        The closure of a stack ``below + (q,)`` is ``below + s`` for each ``s`` of ``q``'s *local closure* (what
        pushes and pops reach from ``(q,)`` without popping its own frame), and, when a state of that local
        closure's bottom frame accepts and ``below`` is not empty, the closure of ``below`` itself. So a byte
        read from the stack is ``below + x`` for each ``x`` of ``q``'s *local step* (the local closure's stacks
        after the byte), and the step of ``below`` when ``q``'s frame can return: the local steps depend on
        (state, byte) alone and are cached per structure, and a stack is only walked down as far as frames
        return. The union is a set, sorted as the reference sorts it. The closure's size is at most the sum of
        the local closures' sizes, so where that sum is within :data:`MAX_CONFIGS` the reference cannot raise."""
        get = self._local.get
        trans, call_ptr, accepting = self._trans, self._call_ptr, self._accepting
        out = []
        bound = 0
        for stack in configs:
            depth = len(stack)
            while True:
                top = stack[depth - 1]
                if call_ptr[top] != call_ptr[top + 1]:
                    entry = get(top << 9 | (byte + 1))
                    if entry is None:
                        entry = self._local_step(top, byte)
                    steps, returns, size = entry
                    bound += size
                    if steps:
                        below = stack[: depth - 1]
                        for x in steps:
                            out.append(below + x)
                else:  # its local closure is itself: no need for the cache
                    bound += 1
                    target = trans[(top << 8) | byte]
                    if target >= 0:
                        out.append(stack[: depth - 1] + (target,))
                    returns = accepting[top]
                if returns and depth > 1:
                    depth -= 1
                else:
                    break
        if bound > MAX_CONFIGS:
            return None
        if len(out) > 1:
            out = sorted(set(out))
            if len(out) > 1:
                return tuple(out) if max(map(len, out)) <= MAX_STACK_DEPTH else None
        if out and len(out[0]) > MAX_STACK_DEPTH:
            return None
        return tuple(out)

    def _local_step(self, state: int, byte: int) -> tuple[tuple[Stack, ...], bool, int]:
        """(local step, whether the frame can return, size of the local closure) of ``state`` on ``byte``: see
        :meth:`_step`."""
        closure, returns, size = self._local_closure(state)
        trans = self._trans
        steps: list[Stack] = []
        for stack in closure:
            target = trans[(stack[-1] << 8) | byte]
            if target >= 0:
                stepped = stack[:-1] + (target,)
                if stepped not in steps:
                    steps.append(stepped)
        entry = (tuple(steps), returns, size)
        self._local.put(state << 9 | (byte + 1), entry, 64 + state_bytes(entry[0]))
        return entry

    def _local_closure(self, state: int) -> tuple[tuple[Stack, ...], bool, int]:
        """(the stacks, whether a bottom frame among them accepts, how many) of what :meth:`Machine.closure`
        reaches from ``(state,)`` standing on a frame below it, without popping to that frame: its own DFS,
        with the bottom frame's pops left out and noted. Past :data:`MAX_CONFIGS` stacks it stops with a size
        over the bound (no stack then has that state on top without a fallback to the reference)."""
        entry = self._local.get(state << 9)
        if entry is not None:
            return entry
        call_ptr, call_start = self._call_ptr, self._call_start
        call_return, accepting = self._call_return, self._accepting
        seen: set[Stack] = set()
        out: list[Stack] = []
        work: list[Stack] = [(state,)]
        returns = False
        while work:
            stack = work.pop()
            if stack in seen:
                continue
            seen.add(stack)
            out.append(stack)
            if len(out) > MAX_CONFIGS:
                entry = ((), False, MAX_CONFIGS + 1)
                break
            top = stack[-1]
            for k in range(call_ptr[top], call_ptr[top + 1]):
                start = call_start[k]
                if start < 0:  # a callee not added yet
                    start = self.machine.add_rule(-1 - start)
                    call_ptr, call_start = self._call_ptr, self._call_start
                    call_return, accepting = self._call_return, self._accepting
                work.append(stack[:-1] + (call_return[k], start))
            if accepting[top]:
                if len(stack) > 1:
                    work.append(stack[:-1])
                else:
                    returns = True
        else:
            entry = (tuple(out), returns, len(out))
        self._local.put(state << 9, entry, 64 + state_bytes(entry[0]))
        return entry

    def can_end(self, state: Configs) -> bool:
        return self.machine.can_end(state)

    def forced_bytes(self, state: Configs, limit: int) -> bytes:
        machine = self.machine
        out = bytearray()
        while len(out) < limit:
            stacks = machine.closure(state)
            if machine.closed_can_end(stacks):
                break
            live = np.flatnonzero((machine.trans[[s[-1] for s in stacks]] >= 0).any(axis=0))
            if len(live) != 1:
                break
            try:
                state = machine.read(state, bytes([int(live[0])]))
            except DepthError:  # the byte is allowed but nests too deep: let the mask walk decide
                break
            if not state:
                break
            out.append(int(live[0]))
        return bytes(out)

    @property
    def nbytes(self) -> int:
        return self.machine.nbytes + sum(dfa.nbytes for dfa in self.pushdown.built)

    def __repr__(self) -> str:
        rules, states = len(self.pushdown.names), self.machine.num_states
        return f"GrammarStructure({self.source!r}, rules={rules}, states={states}, vocab={self.vocab.size:,})"


class GrammarMatcher(Matcher):
    """A :class:`~constrain.runtime.matcher.Matcher` of a :class:`GrammarStructure`, whose ``advance`` takes the
    most common step itself: one configuration whose plain top frame reads the whole token while it stays plain
    (inside a key, a string, a literal), from the structure's runs (:meth:`GrammarStructure._run`), whatever
    lies below the top and whether or not this stack read the token before. Anything else goes the way of every
    matcher (the transition cache, then :meth:`GrammarStructure.transition`), and so does a token the run
    rejects, for the error that says why. The checks of a token come first, as they do for every matcher."""

    __slots__ = ()

    def advance(self, tokens: int | Iterable[int]) -> None:
        if type(tokens) is int:
            step = self._step
            state = step[0]
            if type(state) is tuple and len(state) == 1:  # not finished, one configuration
                s = self.structure
                stack = state[0]
                top = stack[-1]
                size = s._size
                if s._plain[top] and 0 <= tokens < size and s._readable[tokens]:
                    key = top * size + tokens
                    run = s._runs.get(key)
                    if run is None:
                        run = s._new_run(top, tokens, key)
                    if type(run) is int and run >= 0:
                        self._step = ((stack[:-1] + (run,),), step, step[2] + 1)
                        return
        Matcher.advance(self, tokens)


def compile_grammar(
    grammar: Grammar, vocab: Vocabulary, *, deadline: float | None = None, lazy: bool = False, **options
) -> GrammarStructure:
    """Compile a grammar (the IR of :mod:`constrain.grammar`) for ``vocab``; ``options``: ``cache_bytes``,
    ``source`` (what the structure names itself by; the start rule by default); ``deadline`` and ``lazy``: see
    :func:`~constrain.grammar.rules.build_pushdown`. A grammar that names tokens is compiled for the vocabulary
    with their literals (:mod:`constrain.grammar.tokens`)."""
    grammar, vocab = resolve_tokens(grammar, vocab)
    options.setdefault("source", grammar.start)
    return GrammarStructure(build_pushdown(grammar, deadline=deadline, lazy=lazy), vocab, **options)

"""Compile time limits read the compiling thread's own CPU time."""

from __future__ import annotations

import threading
import time

import constrain.automata.limits as limits
from constrain.automata.limits import compile_clock
from constrain.compilers.json_schema import compile_json_schema, schema_to_grammar
from constrain.compilers.pydantic import compile_pydantic
from constrain.testing import byte_vocabulary


def _burn(seconds: float) -> None:
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def test_the_clock_does_not_count_other_threads():
    started = compile_clock()
    worker = threading.Thread(target=_burn, args=(0.4,))
    worker.start()
    worker.join()
    assert compile_clock() - started < 0.1


def _schema(tag: str) -> dict:
    names = [f"{tag}_{i}" for i in range(2000)]
    properties = {name: {"type": "string", "maxLength": 3 + i % 9} for i, name in enumerate(names)}
    return {"type": "object", "properties": properties, "required": names[::3]}


def test_compiles_in_threads_each_get_their_own_time_limit():
    """Four compiles at once, next to a thread that burns more CPU than the limit, each fit a limit that one
    compile alone fits with ample room: a process-wide clock would have refused them all."""
    schema_to_grammar(_schema("warm"))  # imports, kernels and the automata every such schema shares
    started = time.thread_time()
    schema_to_grammar(_schema("alone"))
    alone = time.thread_time() - started
    limit = max(10 * alone, 0.5)
    outcomes: list[object] = []

    def compile_one(tag: str) -> None:
        try:
            schema_to_grammar(_schema(tag), time_limit=limit)
            outcomes.append("ok")
        except Exception as exc:  # a refusal: the test fails below, naming it
            outcomes.append(exc)

    process_started = time.process_time()
    threads = [threading.Thread(target=compile_one, args=(f"t{k}",)) for k in range(4)]
    threads.append(threading.Thread(target=_burn, args=(1.5 * limit,)))
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert outcomes == ["ok"] * 4, outcomes
    assert time.process_time() - process_started > limit  # the process as a whole ran past the limit


def test_a_short_compile_reads_the_cpu_clock_once(monkeypatch):
    """The CPU clock is a costly system call on a loaded virtual machine; a thread's CPU time grows no faster than
    the wall clock, so a compile that ends well within its limit reads it only when the limit starts (the nested
    limits of the compilers it calls included), however often it looks at the limit."""
    vocab = byte_vocabulary()
    schema = {"type": "object", "properties": {"a": {"type": "string", "pattern": "^[a-z]+$"}, "b": {"enum": [1, 2]}}}
    schema_to_grammar(schema)  # the process's one-off costs first
    reads = []
    clock = limits.compile_clock
    monkeypatch.setattr(limits, "compile_clock", lambda: reads.append(1) or clock())
    compile_json_schema(schema, vocab)
    assert len(reads) == 1
    reads.clear()
    compile_pydantic(int, vocab)  # a JSON Schema compile inside a Pydantic one
    assert len(reads) == 1

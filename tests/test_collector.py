"""A long compile pauses the cyclic garbage collector and leaves it as it found it; a short one never pauses."""

from __future__ import annotations

import gc
import json
import subprocess
import sys
import threading
import time

import pytest

from constrain import collector
from constrain.automata.limits import check_deadline, compile_clock, deadline
from constrain.compilers.json_schema import compile_json_schema
from constrain.errors import CompileTimeout
from constrain.testing.memory import status_mib


@pytest.fixture(autouse=True)
def collector_enabled():
    was = gc.isenabled()
    gc.enable()
    yield
    gc.enable() if was else gc.disable()


def busy(seconds: float) -> None:
    """Run ``seconds`` of CPU time, looking at the time limit as automaton construction does."""
    end = compile_clock() + seconds
    while compile_clock() < end:
        check_deadline()
        time.sleep(0)


def test_a_compile_longer_than_pause_after_runs_with_the_collector_off_until_it_ends():
    seen = []
    with deadline(None):
        busy(collector.PAUSE_AFTER / 4)
        seen.append(gc.isenabled())
        busy(collector.PAUSE_AFTER * 1.5)
        seen.append(gc.isenabled())
    assert seen == [True, False]
    assert gc.isenabled()


def test_a_short_real_compile_never_pauses(gemma_vocab, monkeypatch):
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    compile_json_schema(schema, gemma_vocab)  # the process's one-off costs (the metaschema's validator) first
    paused = []
    monkeypatch.setattr(collector, "pause", lambda: paused.append(True))
    compile_json_schema(schema, gemma_vocab)
    assert not paused and gc.isenabled()


def test_a_compile_refused_for_time_turns_the_collector_back_on():
    with pytest.raises(CompileTimeout), deadline(compile_clock() + collector.PAUSE_AFTER * 2):
        busy(collector.PAUSE_AFTER * 10)
    assert gc.isenabled()


def test_a_process_that_disabled_the_collector_keeps_it_disabled():
    gc.disable()
    with deadline(None):
        busy(collector.PAUSE_AFTER * 1.5)
    assert not gc.isenabled()


def test_concurrent_pauses_end_with_the_last_one():
    inside, release, states = threading.Event(), threading.Event(), []

    def other_compile():
        collector.pause()
        inside.set()
        release.wait(10)
        states.append(gc.isenabled())
        collector.resume()

    collector.pause()
    worker = threading.Thread(target=other_compile)
    worker.start()
    inside.wait(10)
    collector.resume()  # this thread's pause ends while the other's is still under way
    states.append(gc.isenabled())
    release.set()
    worker.join(10)
    assert states == [False, False]
    assert gc.isenabled()


def test_a_large_pause_ends_with_its_survivors_in_the_oldest_generation(monkeypatch):
    """Past LARGE_PAUSE allocations, the end of a pause collects the two younger generations, so the first masks
    after a large compile do not pay for walking what it built."""
    monkeypatch.setattr(collector, "LARGE_PAUSE", 1_000)
    collector.pause()
    kept = [[i] for i in range(5_000)]  # lists: objects the collector tracks
    assert gc.get_count()[0] >= 5_000
    collector.resume()
    assert gc.get_count()[0] < 1_000
    assert gc.is_tracked(kept[0])


def _fragmented_heap(mib: int) -> list[bytes]:
    """Free ``mib`` MiB of C-heap blocks (2 KiB bytes objects, which Python takes from malloc) while one block in
    64 stays alive: the heap cannot shrink from its top, so glibc keeps the free pages until it is trimmed."""
    blocks = [bytes(2048) for _ in range(mib * 512)]
    kept = blocks[::64]
    del blocks
    return kept


@pytest.mark.skipif(
    collector._malloc_trim() is None or status_mib() is None, reason="no malloc_trim (not glibc), or no /proc"
)
def test_the_end_of_a_long_compile_gives_the_heaps_free_pages_back():
    """A long compile's automata are freed when it ends, but the C heap keeps their pages: the end of a long
    compile's pause gives them back, so one schema that needed hundreds of MiB does not leave the process that
    much larger. A short pause does not (trimming a large heap takes milliseconds)."""
    collector.release_free_memory()
    kept = _fragmented_heap(200)
    freed_but_held = status_mib()
    collector.pause()
    collector.resume()
    assert status_mib() > freed_but_held - 50  # a short pause: the free pages stay
    with deadline(None):
        busy(collector.PAUSE_AFTER * 1.5)  # a long compile: pauses with long=True
    assert status_mib() < freed_but_held - 100, (freed_but_held, status_mib())
    assert gc.isenabled() and len(kept) == 200 * 8


def test_freeze_collects_start_up_garbage_and_takes_the_survivors_out_of_full_collections():
    """In a fresh process (freezing is for the whole of one): garbage cycles made before are freed, the objects
    alive are no longer walked by a full collection, and later garbage is still collected."""
    script = """
import gc, json, weakref
from constrain import collector
import constrain
class Node: pass
cycle = Node(); cycle.self = cycle; probe = weakref.ref(cycle); del cycle
kept = [[i] for i in range(50_000)]
tracked = len(gc.get_objects())
collector.freeze()
freed_before = probe() is None
later = Node(); later.self = later; probe_later = weakref.ref(later); del later
gc.collect()
print(json.dumps({"freed_before": freed_before, "frozen": gc.get_freeze_count(), "tracked": tracked,
                  "walked": len(gc.get_objects()), "freed_later": probe_later() is None}))
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True)
    found = json.loads(done.stdout)
    assert found["freed_before"] and found["freed_later"]
    assert found["frozen"] > 50_000 and found["walked"] < found["tracked"] // 20

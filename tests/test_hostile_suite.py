"""The hostile-input suite (:mod:`constrain.testing.hostile`): every case, in a fresh process, compiles or is
refused with a typed error within twice the time limit, under the documented memory bound."""

from __future__ import annotations

import pytest

from constrain.testing.hostile import MEMORY_BOUND_MB, cases, run_case

TIME_LIMIT = 1.0


@pytest.mark.parametrize("name", list(cases()))
def test_a_hostile_input_is_compiled_or_refused_in_time_and_memory(name):
    result = run_case(name, TIME_LIMIT)
    assert result.outcome in ("compiled", "refused"), result.error
    assert result.seconds <= 2 * TIME_LIMIT * result.compiles, f"{result.seconds:.2f} s for {result.compiles} compiles"
    assert result.peak_mb <= MEMORY_BOUND_MB, f"{result.peak_mb:.0f} MB"
    assert result.passed(TIME_LIMIT)


def test_a_case_that_fails_untyped_is_reported_as_failed(monkeypatch):
    """The runner itself: an unknown case is a KeyError here, and a child that dies is a failed outcome."""
    with pytest.raises(KeyError, match="no hostile case"):
        run_case("no-such-case")
    monkeypatch.setattr("sys.executable", "/bin/false")
    result = run_case("ref-to-itself", TIME_LIMIT)
    assert result.outcome == "failed" and "exit status 1" in result.error
    assert not result.passed(TIME_LIMIT)

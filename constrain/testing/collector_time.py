"""Time Python's cyclic garbage collector spends, for benchmarks that say how much of a measure it is."""

from __future__ import annotations

import gc
import time


class CollectorTime:
    """A :data:`gc.callbacks` hook (:meth:`install`): the seconds the collector ran since :meth:`reset`, and how
    many of its runs were full collections."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.full = 0
        self._start = 0.0

    def reset(self) -> None:
        self.seconds = 0.0
        self.full = 0

    def install(self) -> CollectorTime:
        """Count from now on, for the rest of the process; returns this hook."""
        gc.callbacks.append(self)
        return self

    def __call__(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._start = time.perf_counter()
            return
        self.seconds += time.perf_counter() - self._start
        self.full += info["generation"] == 2

"""Breadth-first constructions over pairs of states (a product of two automata, an automaton beside a counter),
as numba kernels: an open-addressing table that numbers non-negative int64 keys densely in the order they are
met, and the growable arrays that hold each numbered pair and its row of transitions."""

from __future__ import annotations

import numpy as np
from numba import njit

_EMPTY = np.int64(-1)
_MULTIPLIER = np.int64(0x9E3779B1)


@njit(cache=True, nogil=True)
def new_index(first_key):
    """``(slots, values)``: a table holding ``first_key`` as number 0."""
    slots = np.full(1024, _EMPTY, dtype=np.int64)
    values = np.empty(1024, dtype=np.int32)
    slot, _ = lookup(slots, values, first_key)
    return insert(slots, values, slot, first_key, 0)


@njit(cache=True, nogil=True)
def lookup(slots, values, key):
    """``(slot, number)`` of ``key``, or (the free slot where it would go, -1) when it has no number yet."""
    mask = slots.shape[0] - 1
    slot = (key * _MULTIPLIER) & mask
    while slots[slot] >= 0:
        if slots[slot] == key:
            return slot, np.int64(values[slot])
        slot = (slot + 1) & mask
    return slot, np.int64(-1)


@njit(cache=True, nogil=True)
def insert(slots, values, slot, key, number):
    """Give ``key`` its ``number`` (the next one: numbers are dense from 0) at the free ``slot`` :func:`lookup`
    found: ``(slots, values)``, rehashed into a table twice the size once it is half full."""
    slots[slot] = key
    values[slot] = number
    if 2 * (number + 1) <= slots.shape[0]:
        return slots, values
    size = 2 * slots.shape[0]
    grown_slots = np.full(size, _EMPTY, dtype=np.int64)
    grown_values = np.empty(size, dtype=np.int32)
    for i in range(slots.shape[0]):
        if slots[i] >= 0:
            s = (slots[i] * _MULTIPLIER) & (size - 1)
            while grown_slots[s] >= 0:
                s = (s + 1) & (size - 1)
            grown_slots[s] = slots[i]
            grown_values[s] = values[i]
    return grown_slots, grown_values


@njit(cache=True, nogil=True)
def grown(first, second, table, count):
    """The arrays of the numbered pairs (each pair's two halves, its row of ``table``) with room for twice as many,
    the first ``count`` kept: ``(first, second, table)``."""
    cap = 2 * first.shape[0]
    more_first = np.empty(cap, dtype=np.int32)
    more_second = np.empty(cap, dtype=np.int32)
    more_table = np.empty((cap, table.shape[1]), dtype=np.int32)
    more_first[:count] = first[:count]
    more_second[:count] = second[:count]
    more_table[:count] = table[:count]
    return more_first, more_second, more_table

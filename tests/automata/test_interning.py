"""The pair-numbering table of the breadth-first kernels: dense numbers in order of first sight, through the
table's rehashes and the pair arrays' growth."""

from __future__ import annotations

import numpy as np

from constrain.automata.interning import grown, insert, lookup, new_index


def test_keys_numbered_in_order_of_first_sight_across_rehashes():
    rng = np.random.default_rng(0)
    keys = [int(k) for k in rng.choice(10**12, size=5000, replace=False)]
    slots, values = new_index(np.int64(keys[0]))
    for number, key in enumerate(keys[1:], start=1):
        slot, found = lookup(slots, values, np.int64(key))
        assert found == -1
        slots, values = insert(slots, values, slot, np.int64(key), number)
    assert slots.shape[0] >= 2 * len(keys)  # rehashed as it filled: never more than half full
    for number, key in enumerate(keys):
        assert lookup(slots, values, np.int64(key))[1] == number
    assert lookup(slots, values, np.int64(10**12 + 1))[1] == -1


def test_grown_keeps_the_numbered_pairs():
    first = np.arange(4, dtype=np.int32)
    second = first * 10
    table = np.arange(12, dtype=np.int32).reshape(4, 3)
    more_first, more_second, more_table = grown(first, second, table, 3)
    assert more_first.shape == (8,) and more_table.shape == (8, 3)
    assert more_first[:3].tolist() == [0, 1, 2] and more_second[:3].tolist() == [0, 10, 20]
    assert (more_table[:3] == table[:3]).all()

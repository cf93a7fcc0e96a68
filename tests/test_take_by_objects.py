"""The pre-v5.16 get_partial_node() take rule by free objects (dynamics.takes_by_objects)
against a slab-by-slab walk of the v5.10 loop."""

from __future__ import annotations

import numpy as np
import pytest

from slabtune.model import dynamics


def _kernel_walk(n, y, t, half):
    """v5.10 mm/slub.c get_partial_node(), called until the ``t``-th slab is taken: each
    call adds acquire_slab()'s free objects to ``available`` and breaks once
    ``available > slub_cpu_partial(s) / 2``.  Returns (calls, slabs taken off)."""
    slabs = [yj for nj, yj in zip(n, y) for _ in range(nj)]
    i = calls = 0
    while i < t:
        calls += 1
        available = 0
        while i < len(slabs):
            available += slabs[i]
            i += 1
            if available > half:
                break
    return calls, min(i, len(slabs))


def test_kmalloc_512_takes_one_or_two_slabs_where_v516_takes_nine():
    """kmalloc-512 keeps 13 objects per CPU before v5.16 (set_cpu_partial()), so a call
    stops once it holds more than 6 free objects: one slab with 7 or more free, two with
    4; the slab rule of v5.16 on the model's 14-slab limit took 1 + 14 // 2 + 1 = 9."""
    take = lambda n, y, t: tuple(int(v) for v in dynamics.takes_by_objects(n, y, t, 13 // 2))  # noqa: E731
    assert take([10], [8], 1) == (1, 1)
    assert take([10], [4], 1) == (1, 2)
    assert take([10], [4], 3) == (2, 4)
    assert take([10], [1], 1) == (1, 7)
    assert take([3, 10], [1, 8], 1) == (1, 4)     # 1 + 1 + 1 + 8 > 6: the call crosses blocks
    assert take([3], [1], 2) == (1, 3)            # the call ran off the list's end
    assert take([4], [8], 0) == (0, 0)


def test_takes_equal_the_kernel_loop_slab_by_slab():
    rng = np.random.default_rng(36)
    cases = []
    for _ in range(400):
        nb = int(rng.integers(1, 6))
        n = [int(v) for v in rng.integers(0, 7, nb)]
        y = [int(v) for v in rng.integers(1, 40, nb)]
        half = int(rng.choice([0, 1, 3, 6, 15, 60]))
        S = sum(n)
        if S == 0:
            continue
        cases.append((n, y, int(rng.integers(1, S + 1)), half))
    for n, y, t, half in cases:
        got = tuple(int(v) for v in dynamics.takes_by_objects(n, y, t, half))
        assert got == _kernel_walk(n, y, t, half), (n, y, t, half)


@pytest.mark.parametrize("half", [0, 6])
def test_batched_rows_take_independently(half):
    n = [np.array([2, 0, 5]), np.array([4, 3, 1])]
    y = [np.array([3, 1, 9]), np.array([2, 7, 1])]
    t = np.array([5, 2, 6])
    takes, gone = dynamics.takes_by_objects(n, y, t, half)
    for b in range(3):
        want = _kernel_walk([n[0][b], n[1][b]], [y[0][b], y[1][b]], int(t[b]), half)
        assert (int(takes[b]), int(gone[b])) == want

"""A node's partial list empties its slabs in the kernel's order (dynamics.fifo_frees):
add_partial() puts slabs at the tail and objects are freed oldest first, so the slab at
the head takes the frees until it is empty and the next one starts; the closed form (one
run's frees at once) equals the reference's one free at a time (RefSim._fifo_free)."""

from __future__ import annotations

import jax.numpy as jnp
from hypothesis import given, settings
from hypothesis import strategies as st

from slabtune.model import dynamics, reference_sim

LV = dynamics.LEVELS


def _closed(s, u, hs, hu, c):
    out = dynamics.fifo_frees([jnp.int32(v) for v in s], [jnp.int32(v) for v in u],
                              jnp.int32(hs), jnp.int32(hu), jnp.int32(c))
    s2, u2, hs2, hu2, e = out
    return [int(v) for v in s2], [int(v) for v in u2[1:]], int(hs2), int(hu2), int(e)


class _List:
    """RefSim's node-list state alone: what RefSim._fifo_free reads and writes."""

    def __init__(self, s, u, hs, hu):
        self.ns, self.nu, self.hs, self.hu = [list(s)], [list(u)], [hs], [hu]

    _take_least_used = staticmethod(reference_sim.RefSim._take_least_used)
    _fifo_free = reference_sim.RefSim._fifo_free


def test_the_head_slab_empties_before_the_next_starts():
    """Four slabs of 6 objects (8 per slab, one partial level) and 13 frees: the first
    two slabs empty in turn (12 frees) and the third keeps 5, where frees spread over the
    level (the rule before) empty none until the level averages one object."""
    s, u, hs, hu, e = _closed([0, 4], [0, 24], 0, 0, 13)
    assert (s, u, hs, hu, e) == ([2, 1], [6], 1, 5, 2)
    sc, uc, drop = dynamics._cascade([jnp.int32(0), jnp.int32(4)],
                                     [jnp.int32(0), jnp.int32(24)],
                                     [None, jnp.int32(13)], [0, 1])
    assert int(drop) == 0 and int(sc[1]) == 4 and int(uc[1]) == 11


def test_the_head_slab_takes_the_frees_first():
    """A head slab with 3 objects (a bulk take's partly used one) and 4 frees: it
    empties with the third, and the least used partial slab (4 and 5 objects spread
    over two: the 4 first, the ``q`` slabs of the spread) becomes the head and takes the
    fourth."""
    assert _closed([1, 2], [0, 9], 1, 3, 4) == ([2, 1], [5], 1, 3, 1)


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 6), st.integers(0, 5), st.integers(1, 30), st.booleans(),
       st.data())
def test_closed_form_equals_one_free_at_a_time(s0, s1, objs, head, data):
    lo = dynamics.level_bounds(objs)
    if LV != 2 or objs < 2:
        return
    u1 = data.draw(st.integers(lo[1] * s1, (objs - 1) * s1))
    hu = data.draw(st.integers(1, objs - 1)) if head else 0
    tot = u1 + hu
    c = data.draw(st.integers(0, tot))
    ref = _List([s0, s1], [0, u1], int(head), hu)
    e = sum(ref._fifo_free(0) for _ in range(c))
    got = _closed([s0, s1], [0, u1], int(head), hu, c)
    assert got == (ref.ns[0], ref.nu[0][1:], ref.hs[0], ref.hu[0], e)
    # every free removed one object; the slabs emptied went to level 0
    assert sum(got[1]) + got[3] == tot - c
    assert got[0][0] == s0 + e

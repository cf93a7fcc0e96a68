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


def _v510_sim(take_objects):
    """A RefSim of v5.10 kmalloc-512 on one 16-CPU node (order 2: 32 objects per slab;
    slub_cpu_partial 13, so cpu_partial_slabs 14) whose CPU slab is used up."""
    from slabtune.model import policy, profiles, reference_sim
    from slabtune.model.topology import Topology
    topo = Topology.uniform(16, 1)
    prof = profiles.get_profile("v5.10")
    st = policy.structure(512, topo.possible, topo.present, topo.online,
                          policy.profile_arrays(prof))
    cfg = dynamics.config_from(st, prof, topo, {"kind": "local", "live": 64})
    cfg = cfg._replace(take_objects=np.int32(take_objects))
    sim = reference_sim.RefSim(cfg)
    assert (sim.objs, sim.cpu_partial_slabs) == (32, 14)
    sim.cs_free[0], sim.cs_inuse[0] = 0, 32
    return sim


@pytest.mark.parametrize("inuse, taken", [(28, 2), (30, 4), (25, 1), (31, 7)])
def test_reference_sim_takes_slabs_until_their_free_objects_pass_half(inuse, taken):
    """Ten partial slabs of ``inuse`` objects on the node list: the slow path's one
    get_partial_node() call (one list_lock) takes slabs until their free objects exceed
    13 / 2 = 6 (4 free each: 2 slabs; 2 free: 4; 7 free: 1; 1 free: 7), the first as the
    CPU slab, the rest onto the per-CPU partial list; v5.16's rule took 1 + 14 / 2 + 1."""
    for take_objects, want in ((1, taken), (0, 9)):
        sim = _v510_sim(take_objects)
        lv = sim._level(inuse)
        sim.ns[0][lv] += 10
        sim.nu[0][lv] += 10 * inuse
        sim.alloc(0, 0)
        c = sim.counts
        assert (c["alloc_slow"][0], c["list_lock"][0], c["slab_alloc"][0]) == (1, 1, 0)
        assert sum(sim.ns[0]) == 10 - want
        assert sim._pc_slabs(0) == want - 1
        assert (sim.cs_inuse[0], sim.cs_free[0]) == (inuse + 1, 32 - inuse - 1)


def test_v5_profiles_take_by_objects_and_v516_on_by_slabs():
    from slabtune.model import policy, profiles
    from slabtune.model.topology import Topology
    topo = Topology.uniform(16, 1)
    for name, want in (("v3.1", 0), ("v5.10", 1), ("v5.11", 1), ("v6.1", 0), ("v7.1", 0)):
        prof = profiles.get_profile(name)
        st = policy.structure(512, topo.possible, topo.present, topo.online,
                              policy.profile_arrays(prof))
        cfg = dynamics.config_from(st, prof, topo, {"kind": "local", "live": 8})
        assert int(cfg.take_objects) == want, name

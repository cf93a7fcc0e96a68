"""Kernel-semantics properties of the dynamics model (mm/slub.c behaviour, by era).

All runs share one compiled simulate (same shapes, same ``STEPS``).
"""

from __future__ import annotations

import jax
import numpy as np
import pytest

from slabtune.model import dynamics, policy, profiles, workloads
from slabtune.model.topology import Topology

STEPS = 2000
ONE_NODE = Topology.uniform(16, 1)
MEMLESS = Topology.uniform(64, 2, memoryless_nodes=(1,))


def _struct(profile, size=256, topo=ONE_NODE, explicit_sheaf=0):
    return policy.structure(size, topo.possible, topo.present, topo.online,
                        policy.profile_arrays(profiles.get_profile(profile)),
                        explicit_sheaf=explicit_sheaf)


def _run(profile, topo, wl, size=256, seed=0, structure=None, together=False, **kw):
    """Counters and config; ``together``: the bursty reps start in step
    (simulate.bursts_together), every CPU freeing at once.  A workload table without
    ``drain`` frees eagerly: these properties are stated for freers that free whatever is
    pending (tests/test_workload_occupancy.py checks the held occupancy)."""
    from slabtune.sweeps.simulate import bursts_together

    if isinstance(wl, dict):
        wl = {"drain": "eager", **wl}

    prof = profiles.get_profile(profile)
    st = structure if structure is not None else _struct(profile, size, topo)
    cfg = dynamics.config_from(st, prof, topo, wl, **kw)
    cfg = bursts_together(cfg) if together else cfg
    return dynamics.counters_numpy(dynamics.simulate(jax.random.key(seed), cfg, STEPS)), cfg


def _frac(c, part, whole):
    return c[part].sum() / max(c[whole].sum(), 1)


@pytest.mark.slow
@pytest.mark.parametrize("profile", ["v3.1", "v6.1", "v7.0"])
def test_local_churn_fitting_a_slab_stays_on_the_fast_paths(profile):
    """A live set smaller than a slab: allocations come from the CPU's freelist (or main
    sheaf) and frees go back to it, so after warm-up nothing takes a slow path."""
    c, cfg = _run(profile, ONE_NODE, {"kind": "local", "live": 8})
    assert int(cfg.objs_per_slab) > 8
    assert c["allocs"].sum() > 7_000
    assert _frac(c, "alloc_fast", "allocs") > 0.99
    assert _frac(c, "free_fast", "frees") > 0.99
    assert c["list_lock"].sum() <= 2 * dynamics.R      # at most the first refills
    assert c["slab_free"].sum() == 0


@pytest.mark.slow
def test_remote_frees_without_cpu_partial_never_take_the_fast_path():
    """v3.1 (no per-CPU partial lists): receivers free objects of the senders' CPU slabs,
    never of their own, so every free is a slow path; full slabs that get a free go back
    on the node's partial list under its lock."""
    c, _ = _run("v3.1", ONE_NODE, {"kind": "producer_consumer", "depth": 64})
    assert c["frees"].sum() > 7_000
    assert c["free_fast"].sum() == 0
    assert c["free_slow"].sum() == c["frees"].sum()
    assert c["cpu_partial_drain"].sum() == 0
    assert c["list_lock"][4:].sum() > 0          # receivers take node locks


@pytest.mark.parametrize("profile", ["v3.1", "v6.1"])
def test_objects_go_back_to_the_allocating_cpus_slab(profile):
    """A sender with fewer messages in flight than its slab holds: the receivers free every
    object into the sender's frozen CPU slab (no lock), the sender's slow path takes them
    back from the slab's freelist (ALLOC_REFILL) and never needs a second slab."""
    c, cfg = _run(profile, ONE_NODE, {"kind": "producer_consumer", "depth": 8})
    assert int(cfg.objs_per_slab) > 8
    senders = slice(0, 4)
    assert (c["alloc_slow"][senders] > 0).all()
    assert (c["slab_alloc"][senders] == 1).all()
    assert c["list_lock"].sum() == 0 and c["free_fast"].sum() == 0


def test_interrupt_cpu_never_frees_into_its_own_slab():
    """netperf-like (seed slub-lockless-slowpaths-netperf-2011): the CPU taking the
    interrupt frees the threads' transmit buffers, which sit in the threads' slabs, so its
    free fast path stays at zero while its own allocations mostly hit its freelist."""
    c, _ = _run("v3.1", ONE_NODE, {"kind": "request_response", "threads": 16, "live": 8},
                size=4096)
    assert c["frees"][0] > 500 and c["free_fast"][0] == 0
    assert c["alloc_fast"][0] / c["allocs"][0] > 0.8


def test_more_cpus_change_weights_not_per_rep_counts():
    """The state has R reps whatever the CPU count: 64 or 8192 CPUs (same cache geometry)
    give identical per-rep counters; only the weights scale."""
    st = _struct("v6.1", 512, Topology.uniform(64, 1))
    a, ca = _run("v6.1", Topology.uniform(64, 1), {"kind": "local", "live": 100}, structure=st)
    b, cb = _run("v6.1", Topology.uniform(8192, 1), {"kind": "local", "live": 100},
                 structure=st)
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)
    np.testing.assert_allclose(cb.rep_weight, 128 * ca.rep_weight)
    assert cb.rep_weight.sum() == 8192


def test_sheaves_absorb_local_frees():
    """A live set of several slabs: without sheaves (v6.1) frees of objects in slabs that
    are no longer the CPU slab are slow paths; with sheaves (v7.0) local frees land in the
    main sheaf (or its spare / the barn) and almost never reach a slab."""
    wl = {"kind": "local", "live": 300}
    old, _ = _run("v6.1", ONE_NODE, wl)
    new, _ = _run("v7.0", ONE_NODE, wl)
    assert _frac(old, "free_fast", "frees") < 0.8
    assert _frac(new, "sheaf_free_hit", "frees") > 0.95
    # FREE_FASTPATH counts every free into the sheaves, the ones that first replaced a
    # full main sheaf (spare swap, barn put, flush) too; all of these frees go there
    assert (new["sheaf_free_hit"] + new["sheaf_free_replace"]).sum() == new["free_fast"].sum()
    assert new["free_fast"].sum() == new["frees"].sum()
    assert new["free_slow"].sum() * 5 < old["free_slow"].sum()


def test_remote_completion_on_four_memory_nodes_frees_only_its_nodes_objects_fast():
    """block_io with a remote completion CPU on 4 memory nodes of 4 CPUs (lab
    bio-16cpu-4node): the completion CPU is alone with its node's 3 submitters in class 0,
    so only their objects go into its sheaves (v7.1 free_to_pcs(), FREE_FASTPATH) and the
    other 12 submitters' objects, on other nodes, go to their slabs (remote frees).  With
    the completion CPU in class 1, which stands for 3 nodes, most frees counted as local
    (70.6% fast against 20.0% measured on 7.2)."""
    topo = Topology.uniform(16, 4)
    c, cfg = _run("v7.1", topo, {"kind": "block_io", "depth": 32, "completion_remote": True})
    assert int(cfg.rep_node[0]) == workloads.NODE_MEM0
    local = np.asarray(cfg.rep_node) == workloads.NODE_MEM0
    assert float(np.asarray(cfg.rep_weight)[local][1:].sum()) == 3.0
    assert c["frees"][0] > 1000
    assert c["free_fast"][0] + c["remote_free"][0] == c["frees"][0]
    assert 0.05 < c["free_fast"][0] / c["frees"][0] < 0.35


def test_v70_memoryless_cpus_bypass_sheaves_v71_does_not():
    """Completion CPU on a memoryless node (seed sheaves-cross-cpu-regression-2026): in v7.0
    its numa_mem_id() never equals the slab's node, so every free bypasses the sheaf and
    goes to the slab (remote free); v7.1 lets it free into its sheaves, with a barn on its
    node."""
    wl = {"kind": "block_io", "depth": 32, "completion_remote": True}
    v70, cfg = _run("v7.0", MEMLESS, wl)
    v71, _ = _run("v7.1", MEMLESS, wl)
    assert int(cfg.rep_memoryless[0]) == 1 and int(cfg.rep_node[0]) == workloads.NODE_MEMLESS
    assert v70["frees"][0] > 1000
    assert v70["sheaf_free_hit"][0] == 0
    assert v70["remote_free"][0] == v70["frees"][0]
    assert v71["sheaf_free_hit"][0] / v71["frees"][0] > 0.9
    assert v71["remote_free"][0] == 0
    assert v71["list_lock"].sum() < v70["list_lock"].sum() / 3
    # the v7.0 completion CPU has no barn on its node, v7.1 uses one
    assert v70["barn_put"][0] == 0 and v71["barn_put"][0] + v71["barn_put_fail"][0] > 0


def test_slabs_are_freed_only_beyond_min_partial():
    """An emptied slab goes back to the page allocator only when its node already keeps
    min_partial partial slabs: with a huge min_partial nothing is freed and empty slabs
    pile up on the list; with min_partial 0 every emptied slab is freed.  The CPUs burst
    in step, so they all free at once and slabs empty (started apart, the allocating
    ones take the emptying slabs back: workloads.burst_phase_first)."""
    wl = {"kind": "local", "live": 400, "burst": 400}
    keep, _ = _run("v3.1", ONE_NODE, wl, min_partial=1000, together=True)
    drop, _ = _run("v3.1", ONE_NODE, wl, min_partial=0, together=True)
    assert keep["slab_free"].sum() == 0
    assert keep["empty_slabs_kept"].sum() > 1
    assert drop["slab_free"].sum() > 10
    assert drop["empty_slabs_kept"].sum() == 0
    assert drop["slabs_total"].sum() < keep["slabs_total"].sum()


@pytest.mark.parametrize("topo", [Topology.uniform(4, 1),
                                  Topology.uniform(4, 2, memoryless_nodes=(1,))])
def test_local_bursts_cycle_each_cpus_own_two_slabs(topo):
    """Local churn in bursts of two slabs' worth (6.1, 16 objects per slab, bursts of 32
    allocations then 32 frees, oldest first): each CPU's first free of a burst puts its
    older, full slab on its own per-CPU partial list, the next 15 empty it there, the
    other 16 go to its CPU slab's freelist; its next burst refills from that empty slab.
    So every CPU keeps two slabs for good: two new slabs each, no drain, no slab freed,
    one slow path per 32 allocations and half the frees fast.  (The lab measured the same
    on 4 CPUs with a memoryless node, 6.1 and 6.12: 0 new slabs and 64 KiB in the window,
    cpu_partial_free = cpu_partial_alloc = alloc_slowpath.)  The CPUs burst in step, as
    the lab's lockstep workers do (simulate.bursts_together): started apart
    (workloads.burst_phase_first), a CPU whose first burst is short keeps more than 32
    objects (its first free phase falls back to allocations) and more slabs."""
    c, cfg = _run("v6.1", topo, {"kind": "local", "live": 64, "burst": 32}, size=512,
                  together=True)
    reps = np.asarray(cfg.rep_weight) > 0
    assert int(cfg.objs_per_slab) == 16 and int(cfg.cpu_partial_slabs) > 2
    assert (c["slab_alloc"][reps] == 2).all()
    assert c["slab_free"].sum() == 0 and c["cpu_partial_drain"].sum() == 0
    allocs = c["allocs"][reps]
    assert (np.abs(c["alloc_slow"][reps] - allocs / 32) <= 1).all()
    assert (np.abs(c["free_fast"][reps] - c["frees"][reps] / 2) <= 16).all()
    assert np.allclose(c["slabs_total"].sum(), 2 * reps.sum(), rtol=0.05)


def test_before_3_1_slab_free_discards_every_slab_it_empties():
    """__slab_free() of v2.6.27 discards a slab it empties whatever the node keeps (its
    ``slab_empty:`` label has no min_partial test; the 2008 seed's patch changes
    min_partial only in unfreeze_slab() and get_any_partial()).  So on one node with a
    per-CPU slab that deactivates full, min_partial 1000 keeps no empty slab, and the
    2008 scenario's static and dynamic arms run alike; v3.1's ``nr_partial >
    min_partial`` keeps them.  The CPUs burst in step, all freeing at once."""
    wl = {"kind": "local", "live": 400, "burst": 400}
    old, cfg = _run("v2.6.27", ONE_NODE, wl, min_partial=1000, together=True)
    assert int(cfg.free_discard_offset) == profiles.DISCARD_EVERY_EMPTIED
    assert int(cfg.min_partial) + int(cfg.free_discard_offset) < 0
    assert old["slab_free"].sum() > 10
    assert old["empty_slabs_kept"].sum() == 0
    kept, cfg31 = _run("v3.1", ONE_NODE, wl, min_partial=1000, together=True)
    assert int(cfg31.free_discard_offset) == 1
    assert kept["slab_free"].sum() == 0 and kept["empty_slabs_kept"].sum() > 1
    five, _ = _run("v2.6.27", ONE_NODE, wl, min_partial=5, together=True)
    assert all(np.array_equal(five[k], old[k]) for k in old)
    # a policy's min_partial replaces the config's (as the tuner's batches do) and the
    # offset still means "every emptied slab"
    tuned = dynamics.counters_numpy(dynamics.simulate(
        jax.random.key(0), cfg._replace(min_partial=np.int32(5)), STEPS))
    assert all(np.array_equal(tuned[k], old[k]) for k in old)


@pytest.mark.parametrize("profile,wl", [
    ("v3.1", {"kind": "producer_consumer"}),
    ("v6.1", {"kind": "request_response", "threads": 32}),
    ("v7.0", {"kind": "block_io", "completion_remote": True}),
    ("v7.1", {"kind": "local", "live": 50, "burst": 10}),
])
def test_conservation(profile, wl):
    """allocs - frees = objects still allocated, and ops = allocs + frees."""
    c, _ = _run(profile, MEMLESS, wl)
    assert c["allocs"].sum() - c["frees"].sum() == c["outstanding"].sum()
    np.testing.assert_array_equal(c["ops"], c["allocs"] + c["frees"])
    np.testing.assert_array_equal(c["allocs"], c["alloc_fast"] + c["alloc_slow"])
    np.testing.assert_array_equal(c["frees"], c["free_fast"] + c["free_slow"])
    assert c["list_lock_remote"].sum() <= c["list_lock"].sum() == c["list_lock_node"].sum()


def test_reproducible_from_seed():
    wl = {"kind": "request_response", "threads": 12}
    a, _ = _run("v6.1", MEMLESS, wl, seed=5)
    b, _ = _run("v6.1", MEMLESS, wl, seed=5)
    c, _ = _run("v6.1", MEMLESS, wl, seed=6)
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)
    assert any(not np.array_equal(a[k], c[k]) for k in a)


def test_memoryless_penalty_grows_with_cpus_and_vanishes_with_the_fix():
    """Without the numa_mem_id() fix every allocation of a CPU on a memoryless node takes the
    memory node's list_lock; the machine-wide count (weights x per-rep) grows with the
    CPUs on memoryless nodes.  With the fix those CPUs use their CPU slabs."""
    def remote_locks(memless_cpus, fallback):
        topo = Topology.uniform(8 + memless_cpus, 2, memoryless_nodes=(1,),
                                node_cpus=(8, memless_cpus))
        st = _struct("v6.1", 256, topo)
        c, cfg = _run("v6.1", topo, {"kind": "local", "live": 8}, structure=st,
                      memoryless_fallback=fallback)
        return float((c["list_lock_remote"] * cfg.rep_weight).sum()), c
    small, cs = remote_locks(8, False)
    big, cb = remote_locks(64, False)
    fixed, cf = remote_locks(64, True)
    assert big > 4 * small > 0
    assert _frac(cb, "alloc_fast", "allocs") < 0.6
    assert fixed == 0
    assert _frac(cf, "alloc_fast", "allocs") > 0.99


@pytest.mark.slow
def test_batch_equals_single_runs():
    topo = MEMLESS
    cfgs = []
    for profile, wl in [("v3.1", {"kind": "local"}), ("v7.0", {"kind": "block_io"}),
                        ("v6.1", {"kind": "producer_consumer", "cross_node": 0.5})]:
        prof = profiles.get_profile(profile)
        cfgs.append(dynamics.config_from(_struct(profile, 256, topo), prof, topo, wl))
    keys = jax.random.split(jax.random.key(9), len(cfgs))
    batch = dynamics.counters_numpy(dynamics.simulate_batch(keys, dynamics.stack_configs(cfgs),
                                                            STEPS))
    for i, cfg in enumerate(cfgs):
        one = dynamics.counters_numpy(dynamics.simulate(keys[i], cfg, STEPS))
        for k in one:
            np.testing.assert_array_equal(batch[k][i], one[k], err_msg=k)


def test_workload_parameters_are_checked():
    with pytest.raises(workloads.WorkloadError, match="live"):
        workloads.local(ONE_NODE, live=0)
    with pytest.raises(workloads.WorkloadError, match="cross_node"):
        workloads.producer_consumer(ONE_NODE, cross_node=1.5)
    with pytest.raises(workloads.WorkloadError, match="bogus"):
        workloads.build("local", ONE_NODE, bogus=1)
    assert workloads.spec_params("block_io") == ("depth", "completion_remote", "completions",
                                                 "drain")
    with pytest.raises(workloads.WorkloadError, match="completions"):
        workloads.block_io(ONE_NODE, completions=16)


def test_block_io_with_many_completion_cpus_balances_the_machine():
    """With as many completion CPUs as submitters, half the reps complete: weighted
    machine-wide frees keep up with allocations (one completion CPU cannot)."""
    topo = Topology.uniform(64, 1)
    one, c1 = _run("v6.1", topo, {"kind": "block_io"})
    many, cm = _run("v6.1", topo, {"kind": "block_io", "completions": 32})
    assert cm.rep_weight[:4].sum() == 32 and cm.rep_weight[4:].sum() == 32
    def bal(c, cfg):
        return (c["frees"] * cfg.rep_weight).sum() / (c["allocs"] * cfg.rep_weight).sum()

    assert bal(many, cm) > 0.95 > 0.5 > bal(one, c1)


def test_interrupt_cpu_self_frees_take_its_fast_path():
    """irq_self_free: receive buffers the interrupt CPU frees itself, while still in its CPU
    slab, are fast frees (the seed's kmalloc-256/4k interrupt-CPU fast frees)."""
    wl = {"kind": "request_response", "threads": 16, "live": 8}
    off, _ = _run("v3.1", ONE_NODE, wl, size=4096)
    on, _ = _run("v3.1", ONE_NODE, dict(wl, irq_self_free=0.5), size=4096)
    assert off["free_fast"][0] == 0 < on["free_fast"][0]


@pytest.mark.parametrize("kind", list(workloads.BUILDERS))
def test_workload_layouts_cover_the_machine(kind):
    """Rep weights add up to the CPUs the workload runs on; free_to rows are stochastic."""
    wl, lay = workloads.build(kind, MEMLESS)
    assert lay.weight.shape == (workloads.R,) and lay.node_has_memory.shape == (workloads.N,)
    if kind in ("local", "producer_consumer", "block_io"):
        assert lay.weight.sum() == pytest.approx(64)
    allocs = wl.alloc_p > 0
    assert (wl.free_cum[allocs, -1] == workloads.PROB_ONE).all()
    assert (np.diff(wl.free_cum, axis=1) >= 0).all()
    # memoryless CPUs get slabs from a node with memory
    assert all(lay.node_has_memory[m] for m in lay.mem_node)


def test_v68_emptying_a_per_cpu_partial_slab_takes_the_list_lock():
    """v6.8 stopped freezing per-CPU partial slabs, so a free that empties one takes its
    node's list_lock in __slab_free(); before, a frozen slab took none.  The same v6.1
    configuration with only that switch: every other counter is equal, and the extra
    acquisitions are the per-CPU partial slabs emptied by frees, which producer/consumer
    frees of objects from slabs already on the consumer's list make."""
    wl = {"kind": "producer_consumer", "depth": 64}
    prof = profiles.get_profile("v6.1")
    assert not prof.unfrozen_cpu_partial
    assert profiles.detect_profile("6.12.0").unfrozen_cpu_partial
    assert not profiles.get_profile("v7.0").unfrozen_cpu_partial      # no such lists
    st = _struct("v6.1", 512, ONE_NODE)
    cfg = dynamics.config_from(st, prof, ONE_NODE, wl)
    assert int(cfg.pc_empty_locks) == 0
    w = dynamics.draws(jax.random.key(5), STEPS)
    old = dynamics.counters_numpy(dynamics.simulate_draws(w, cfg))
    new = dynamics.counters_numpy(dynamics.simulate_draws(w, cfg._replace(
        pc_empty_locks=np.int32(1))))
    for k in old:
        if k not in ("list_lock", "list_lock_node"):
            np.testing.assert_array_equal(old[k], new[k], err_msg=k)
    extra = new["list_lock"].sum() - old["list_lock"].sum()
    assert extra > 0
    assert new["list_lock_node"].sum() - old["list_lock_node"].sum() == extra


def _ref(unfrozen=False, **kw):
    """A v6.1 reference simulator on one node (kmalloc-256, producer/consumer);
    ``unfrozen``: per-CPU partial slabs not frozen, the one v6.8 switch."""
    from slabtune.model import reference_sim
    prof = profiles.get_profile("v6.1")
    cfg = dynamics.config_from(_struct("v6.1", 256, ONE_NODE), prof, ONE_NODE,
                               {"kind": "producer_consumer", "depth": 64}, **kw)
    return reference_sim.RefSim(cfg._replace(pc_empty_locks=np.int32(int(unfrozen))))


@pytest.mark.parametrize("unfrozen,locks", [(False, 0), (True, 1)])
def test_a_per_cpu_partial_slab_empties_and_its_drain_discards_it(unfrozen, locks):
    """Frees into a per-CPU partial list with a window of one slab (one freer, no lag
    spread) go to one slab at a time, so a slab empties on the list: 6.1 frees into the
    frozen slab with no lock; 6.12 (not frozen since v6.8) takes the node's list_lock in
    __slab_free() for the free that empties it and leaves it listed.  The drain (6.1
    __unfreeze_partials(), 6.12 __put_partials()) then discards it, as the node already
    keeps min_partial (0) partial slabs, and moves the others to the node's partial
    list."""
    sim = _ref(unfrozen, min_partial=0)
    assert sim.objs > 3
    for h in (3, 2, 3):                       # three listed slabs, 8 objects
        sim._add_pc(0, h)
    for _ in range(2):                        # the least used slab takes both frees
        sim._pc_free(0, 0)
    assert sim.pcs[0][0] == 1 and sim.pd[0] == 0 and sum(sim.pcu[0]) == 6
    assert sim.counts["list_lock"][0] == locks
    sim._pc_free(0, 0)                        # the next slab starts draining
    assert sim.pd[0] == 2 and sum(sim.pcu[0]) == 3 and sim._pc_slabs(0) == 3
    sim._drain(0)
    assert sim.counts["slab_free"][0] == 1    # the empty slab, discarded
    assert sum(sim.ns[0]) == 2 and sum(sim.nu[0]) == 5 and sim.ns[0][0] == 0
    assert sim._pc_slabs(0) == 0 and sim.counts["list_lock"][0] == locks + 1


_PC_WALK = jax.jit(dynamics._pc_walk, static_argnums=(7,))


@pytest.mark.parametrize("slabs", [(1,), (3, 2, 3), (5, 5, 5, 4), (1, 1, 7)])
@pytest.mark.parametrize("pw,extra", [(0, 0), (1, 1), (1, 4), (2, 1), (3, 5)])
@pytest.mark.parametrize("win", [1, 2, 4])
def test_pc_walk_is_the_frees_one_at_a_time(slabs, pw, extra, win):
    """dynamics._pc_walk (x frees into a per-CPU partial list with a draining window of
    ``win`` slabs) gives the levels, window and emptied slabs of RefSim._pc_free played x
    times, for every x up to the list's objects; _pc_free_one (runs of one op) is its
    x <= 1 case.  ``extra``: the window's oldest slab's objects (``half`` each for the
    others)."""
    half = _ref().half
    pd = half * max(pw - 1, 0) + extra
    total = sum(slabs) + pd
    assert total <= 64                        # the static bound of _PC_WALK's loop
    for x in range(total + 1):
        sim = _ref()
        sim.win = win
        for h in slabs:
            sim._add_pc(0, h)
        sim.pw[0], sim.pd[0] = pw, pd
        s0, u0 = list(sim.pcs[0]), [0] + list(sim.pcu[0][1:])
        for _ in range(x):
            sim._pc_free(0, 0)
        i32 = np.int32
        s, u, got_pd, got_pw, emptied = _PC_WALK(
            [i32(v) for v in s0], [i32(v) for v in u0], i32(pd), i32(pw), i32(x), i32(win),
            i32(half), 64)
        assert [int(v) for v in s] == sim.pcs[0], x
        assert [int(v) for v in u[1:]] == sim.pcu[0][1:], x
        assert (int(got_pd), int(got_pw)) == (sim.pd[0], sim.pw[0]), x
        assert int(emptied) == sim.pcs[0][0], x
        assert sim.pw[0] <= sim.pd[0] <= sim.pw[0] * (sim.objs - 1)
        if x <= 1:                            # the form runs of one op trace
            s1, u1, pd1, pw1, e1 = _PC_WALK(
                [i32(v) for v in s0], [i32(v) for v in u0], i32(pd), i32(pw), i32(x),
                i32(win), i32(half), 1)
            assert [int(v) for v in (*s1, *u1[1:], pd1, pw1, e1)] == \
                [int(v) for v in (*s, *u[1:], got_pd, got_pw, emptied)], x


def test_a_wide_window_keeps_its_slabs_partly_used_for_the_drain():
    """Four freers at different distances behind free into four slabs at once: of a
    list of four full slabs made partial (``objs - 1`` objects each), ``2 (objs - 1)``
    frees leave none empty (the walk of one slab at a time has emptied two), so the drain
    moves all four to the node's partial list and discards none."""
    for win, emptied in ((1, 2), (4, 0)):
        sim = _ref(min_partial=0)
        objs = sim.objs
        assert objs > 4 and sim.half == objs // 2
        sim.win = win
        for _ in range(4):
            sim._add_pc(0, objs - 1)
        for _ in range(2 * (objs - 1)):
            sim._pc_free(0, 0)
        assert sim.pcs[0][0] == emptied, win
        sim._drain(0)
        assert sim.counts["slab_free"][0] == emptied
        assert sum(sim.ns[0]) == 4 - emptied and sum(sim.nu[0]) == 2 * (objs - 1)


def test_the_window_is_the_freers_spread_behind_their_senders():
    """dynamics.pc_window and RefSim._window: a sender handing a quarter of its objects
    to each of four freers, with 4, 8, 12 and 36 of them waiting, has its freers 16 to
    144 of its allocations behind: 128 allocations, 16 slabs of 8 objects partly freed,
    over the four freers' lists 4 each, plus the one being freed: 5.  A sender with a
    single freer adds nothing; no spread leaves the window at one slab."""
    from slabtune.model import workloads
    fc = np.zeros((8, 8), np.int32)
    fc[0, 4:] = [16384, 32768, 49152, 65536]       # rep 0 frees go to reps 4..7
    fc[1, 2:] = 65536                              # rep 1 hands everything to rep 2
    mul, freers = workloads.lag_weights(fc)
    assert freers == 4 and set(mul[0, 4:]) == {64} and not mul[1].any()
    pend = np.zeros((8, 8), np.int32)
    pend[0, 4:] = [4, 8, 12, 36]
    pend[1, 2] = 500
    win = dynamics.pc_window(pend[..., None], mul[..., None], np.int32(freers), np.int32(8))
    assert int(win[0]) == 5
    sim = _ref()
    sim.lag_mul, sim.lag_freers, sim.objs = mul.tolist(), freers, 8
    sim.pend = pend.tolist()
    assert sim._window() == 5
    pend[0, 4:] = 20
    assert int(dynamics.pc_window(pend[..., None], mul[..., None], np.int32(freers),
                                  np.int32(8))[0]) == 1


TWO_MEM = Topology.uniform(16, 2)


@pytest.mark.parametrize("unfrozen", [False, True])
def test_remote_full_slab_free_goes_to_the_freeing_cpus_partial_list(unfrozen):
    """Item 5b.  Before 7.0, __slab_free() of an object into a full slab (not frozen,
    prior freelist NULL) with per-CPU partial lists puts the slab on the FREEING CPU's
    per-CPU partial list whatever node the slab is on (6.1: freezes it, put_cpu_partial(s,
    slab, 1); 6.12: the same without freezing), taking no list_lock.  A later push onto
    a list of cpu_partial_slabs slabs drains it (6.1 __unfreeze_partials(), 6.12
    __put_partials()): each slab goes to its own node's list under that node's list_lock,
    so a list holding slabs of both nodes takes both locks, the remote one counted as a
    remote acquisition.  v6.8+ (``unfrozen``): a free that empties the remote slab on the
    list takes the remote node's list_lock."""
    from slabtune.model import reference_sim
    prof = profiles.get_profile("v6.1")
    cfg = dynamics.config_from(_struct("v6.1", 256, TWO_MEM), prof, TWO_MEM,
                               {"kind": "producer_consumer", "depth": 64},
                               cpu_partial_slabs=2, min_partial=5)
    sim = reference_sim.RefSim(cfg._replace(pc_empty_locks=np.int32(int(unfrozen))))
    r = next(k for k in range(dynamics.R) if sim.mem[k] == 1 and sim.node[k] == 1)
    objs = sim.objs
    sim.F[0] = 3
    sim._slab_free(r, 0, ("full", None, 0))              # a node-0 slab, freed on node 1
    assert sim.counts["list_lock"][r] == 0 and sim.F[0] == 2
    assert sim._pc_remote(r) == 1 and sum(sim.rpu[r]) == objs - 1
    assert sim._pc_local(r) == 0 and sum(sim.ns[0]) == 0
    sim._add_pc(r, 3)                                    # a node-1 slab on the list: full
    sim._slab_free(r, 0, ("full", None, 0))              # the next push drains it first
    c = sim.counts
    assert (c["cpu_partial_drain"][r], c["list_lock"][r], c["list_lock_remote"][r]) == (1, 2, 1)
    assert (sum(sim.ns[0]), sum(sim.nu[0])) == (1, objs - 1)     # the remote slab, home
    assert (sum(sim.ns[1]), sum(sim.nu[1])) == (1, 3)            # the local one
    assert sim._pc_remote(r) == 1 and sim._pc_local(r) == 0
    for _ in range(objs - 1):                            # its objects freed one by one
        sim._slab_free(r, 0, ("rpc", r, 0))
    assert sim.rps[r][0] == 1 and sim.rpd[r] == 0        # empty, still listed
    assert c["list_lock"][r] == 2 + int(unfrozen)
    assert sim.lock_node[0] == 1 + int(unfrozen)


def test_v72_sheaf_flush_locks_once_per_slab_that_changes_state():
    """7.2 __kmem_cache_free_bulk() frees a flushed sheaf slab by slab, one __slab_free()
    each: it takes the node's list_lock for a full slab made partial or a slab made
    empty, none for a partial slab that stays partial (RefSim._bulk_free; the JAX
    _bulk_free equals it through the equality tests)."""
    from slabtune.model import reference_sim
    prof = profiles.get_profile("v7.1")
    cfg = dynamics.config_from(_struct("v7.1", 256, ONE_NODE), prof, ONE_NODE,
                               {"kind": "local", "live": 64}, min_partial=0)

    def flush(k, full=0, partial=()):
        sim = reference_sim.RefSim(cfg)
        sim.F[0] = full
        for h in partial:
            lv = sim._level(h)
            sim.ns[0][lv] += 1
            sim.nu[0][lv] += h
        sim._bulk_free(0, 0, k)
        return sim.counts["list_lock"][0], sim.counts["slab_free"][0], sim

    objs = flush(0)[2].objs
    assert objs > 4
    assert flush(3, partial=(objs - 1,))[:2] == (0, 0)      # stays partial: no lock
    assert flush(1, partial=(1,))[:2] == (1, 1)             # emptied, discarded
    locks, freed, sim = flush(objs + 1, full=2)             # one emptied, one partial
    assert (locks, freed, sim.F[0], sum(sim.ns[0])) == (2, 1, 0, 1)


def _v72_refill(cap, objs_free=(), head_free=0):
    """RefSim of v7.1 (7.2's rules) with sheaf capacity ``cap``, node 0's partial list
    holding slabs with ``objs_free`` free objects each and a head slab with ``head_free``;
    returns the list_locks and new slabs of one refill, and the sim."""
    from slabtune.model import reference_sim
    prof = profiles.get_profile("v7.1")
    cfg = dynamics.config_from(_struct("v7.1", 256, ONE_NODE), prof, ONE_NODE,
                               {"kind": "local", "live": 64}, min_partial=0,
                               sheaf_capacity=cap)
    sim = reference_sim.RefSim(cfg)
    for f in objs_free:
        h = sim.objs - f
        sim.ns[0][sim._level(h)] += 1
        sim.nu[0][sim._level(h)] += h
    if head_free:
        sim.hs[0], sim.hu[0] = 1, sim.objs - head_free
    sim._refill(0, 0)
    return sim.counts["list_lock"][0], sim.counts["slab_alloc"][0], sim


def test_v72_sheaf_refill_locks_bulk_take_surplus_and_new_partial_slab():
    """7.2.13 refill_objects(): one list_lock in get_partial_node_bulk() when the node's
    partial list is not empty, one for a partial slab's surplus returned
    (__slab_try_return_freelist()), one for a new slab left partly used
    (alloc_from_new_slab() puts it on the list); none for an empty list and new slabs
    used up."""
    objs = _v72_refill(1)[2].objs
    assert objs >= 8
    assert _v72_refill(objs)[:2] == (0, 1)                       # one new slab, used up
    assert _v72_refill(objs - 1)[:2] == (1, 1)                   # new slab partly used
    assert _v72_refill(3, objs_free=(5,))[:2] == (2, 0)          # take, return surplus
    assert _v72_refill(5, objs_free=(5,))[:2] == (1, 0)          # take exactly one slab
    assert _v72_refill(7, objs_free=(5,))[:2] == (2, 1)          # take all, new partial
    assert _v72_refill(10, objs_free=(5, 5))[:2] == (1, 0)       # two slabs used up
    locks, new, sim = _v72_refill(3, head_free=5)                # the head slab's surplus
    assert (locks, new, sim.hs[0], sim.hu[0]) == (2, 0, 1, objs - 2)


@pytest.mark.parametrize("cap,head_free,want", [
    # 32 objects per slab, cap 12, a head slab with 20 free: every refill finds the list
    # (4) and ends inside a slab (8 of the head's free left, then a new slab at 4, 16 and
    # 28 used): 8
    (12, 20, 8),
    # cap 16, no partial slab: refills 1 and 3 start a new slab (no list, one add), 2 and
    # 4 find it on the list and use it up: 4
    (16, 0, 4),
])
def test_v72_refill_locks_of_a_run_of_refills(cap, head_free, want):
    """Several refills in one run (b > 1): dynamics._refill_locks over the blocks of one
    bulk take (head slab, no partial slabs, new slabs) equals RefSim playing the refills
    one at a time, and the values worked out by hand above."""
    import jax.numpy as jnp
    rfl = 4
    locks, _, sim = _v72_refill(cap, head_free=head_free)
    objs = sim.objs
    assert objs == 32
    for _ in range(rfl - 1):
        sim._refill(0, 0)
    assert sim.counts["list_lock"][0] == want
    t = rfl * cap
    n = [jnp.int32(int(head_free > 0)), jnp.int32(0), jnp.int32(t)]
    y = [jnp.int32(head_free), jnp.int32(objs), jnp.int32(objs)]
    got = dynamics._refill_locks(n, y, jnp.int32(rfl), jnp.int32(cap),
                                 jnp.int32((t - head_free) % objs), dynamics.MAX_OPS_PER_STEP)
    assert int(got) == want
    one = dynamics._refill_locks(n, y, jnp.int32(1), jnp.int32(cap),
                                 jnp.int32(cap if cap < head_free else (cap - head_free) % objs), 1)
    assert int(one) == locks


def test_v618_opt_in_caches_keep_the_cpu_slab_beside_the_sheaves():
    """v6.18 caches that ask for sheaves keep struct kmem_cache_cpu (config cpu_slab 1);
    v7.x caches have sheaves and no CPU slab; caches without sheaves have one."""
    cfgs = {(name, sheaf): dynamics.config_from(
        _struct(name, 256, ONE_NODE, explicit_sheaf=sheaf), profiles.get_profile(name),
        ONE_NODE, {"kind": "local", "live": 64}) for name in ("v6.18", "v7.1") for sheaf in (0, 8)}
    got = {key: (int(c.sheaf_capacity) > 0, int(c.cpu_slab)) for key, c in cfgs.items()}
    assert got == {("v6.18", 0): (False, 1), ("v6.18", 8): (True, 1),
                   ("v7.1", 0): (True, 0), ("v7.1", 8): (True, 0)}
    # a v6.18 opt-in batch compiles the general runs even at b = 1 (a flush frees cap
    # objects in one op); a v7.1 one the single pick
    assert dynamics.run_bound(dynamics.stack_configs([cfgs["v6.18", 8]])) > 1
    assert dynamics.run_bound(dynamics.stack_configs([cfgs["v7.1", 0]])) == 1


def test_v618_sheaf_refill_and_flush_go_through_the_cpu_slab():
    """6.18 refill_sheaf() -> __kmem_cache_alloc_bulk(): ``cap`` objects from the CPU
    freelist (ALLOC_FASTPATH each) or ___slab_alloc() (ALLOC_SLOWPATH: a new CPU slab off
    the node's list under its lock, or from the page allocator); a flush ->
    __kmem_cache_free_bulk() -> do_slab_free(): objects of the CPU's own CPU slab go back
    on its freelist (FREE_FASTPATH, no lock).  Values worked out by hand: 32 objects per
    slab, capacity 8, no room in the barn."""
    from slabtune.model import reference_sim
    prof = profiles.get_profile("v6.18")
    cfg = dynamics.config_from(_struct("v6.18", 256, ONE_NODE, explicit_sheaf=8), prof,
                               ONE_NODE, {"kind": "local", "live": 64}, barn_max_full=0)
    sim = reference_sim.RefSim(cfg)
    assert (sim.objs, sim.cap) == (32, 8)
    c = sim.counts
    for _ in range(24):                  # refills at allocations 1, 9, 17
        sim.alloc(0, 0)
    assert [c[f][0] for f in ("allocs", "sheaf_refill", "alloc_fast", "alloc_slow",
                              "slab_alloc", "list_lock")] == [24, 3, 24 + 23, 1, 1, 0]
    assert (sim.cs_inuse[0], sim.cs_free[0], sim.main[0]) == (24, 8, 0)
    # 24 frees: 8 into main, swap, 8 more, then the full main is flushed (no barn room):
    # its 8 objects all sit in this CPU's CPU slab
    sim.free_run(0, 24, 0, 0)
    assert [c[f][0] for f in ("frees", "sheaf_flush", "free_fast", "free_slow",
                              "list_lock")] == [24, 1, 24 + 8, 0, 0]
    assert (sim.cs_inuse[0], sim.cs_free[0], sim.main[0], sim.spare[0]) == (16, 16, 8, 8)
    # a partial slab (10 allocated) on the node's list: with the CPU slab used up, a
    # refill takes it under the list_lock (one slow path) and 7 more from its freelist
    sim.main[0] = sim.spare[0] = 0
    sim.cs_free[0], sim.cs_inuse[0] = 0, 32
    lv = sim._level(10)
    sim.ns[0][lv] += 1
    sim.nu[0][lv] += 10
    before = {f: c[f][0] for f in ("alloc_fast", "alloc_slow", "list_lock", "slab_alloc")}
    sim._refill(0, 0)
    assert {f: c[f][0] - v for f, v in before.items()} == \
        {"alloc_fast": 7, "alloc_slow": 1, "list_lock": 1, "slab_alloc": 0}
    assert (sim.F[0], sim.cs_inuse[0], sim.cs_free[0]) == (1, 18, 14)


def test_node_list_floor_and_takeable_slabs_follow_get_any_partial():
    """A CPU of a node with memory takes from its node's list whenever it holds a slab; a
    CPU of a memoryless node (x86: numa_mem_id() is its own node, which has no
    kmem_cache_node) only through get_any_partial(): from a list of more than min_partial
    partial slabs, in the 1001 runs in 1024 whose get_cycles() % 1024 draw is at most
    remote_node_defrag_ratio (1000), never in the others.  Successive get_partial_node()
    calls of G slabs each stop once a call finds min_partial or fewer there."""
    floor = dynamics.node_list_floor
    assert floor(0, 1, 5) == 0 and floor(0, 0, 5) == 0
    assert floor(1, 1, 5) == 5 and floor(1, 1, 0) == 0
    assert floor(1, 0, 5) == floor(1, 0, 0) == dynamics.NO_TAKE
    draws = np.arange(1 << 16, dtype=np.uint32)
    assert ((draws & dynamics.DEFRAG_DRAW) <= profiles.REMOTE_NODE_DEFRAG_RATIO).mean() == \
        pytest.approx(1001 / 1024)
    take = lambda S, f, G: int(dynamics.takeable_slabs(S, f, G))  # noqa: E731
    assert take(7, 0, 3) == 7 and take(0, 0, 3) == 0
    assert take(5, 5, 4) == 0 and take(6, 5, 4) == 4      # one call, leaving 2
    assert take(8, 5, 4) == 4 and take(9, 5, 2) == 4      # 9 -> 7 -> 5: two calls
    assert take(12, 5, 4) == 8 and take(3, dynamics.NO_TAKE, 4) == 0


_ML4 = Topology.uniform(4, 2, memoryless_nodes=(1,))
_PC_ML = {"kind": "producer_consumer", "depth": 64, "cross_node": 0.5}


def _producers(cfg, c):
    """The producer reps of a producer/consumer run: (on the memoryless node, on node 0)."""
    ml = np.asarray(cfg.rep_memoryless) > 0
    prod = (np.asarray(cfg.rep_weight) > 0) & (c["allocs"] > 0)
    assert (prod & ml).any() and (prod & ~ml).any()
    return prod & ml, prod & ~ml


@pytest.mark.slow
def test_memoryless_cpus_take_new_slabs_while_their_node_keeps_min_partial_6_1():
    """6.1, producer/consumer across node 0 and a memoryless node 1 (512-byte objects, 16
    per slab): the producers' slabs come back to node 0's partial list through the
    consumers' frees.  Node 0's producer takes them (get_partial_node() of its node);
    node 1's producer only through get_any_partial(), while node 0 keeps more than
    min_partial (5) partial slabs, else it gets a new slab: it allocates far more new
    slabs and takes the list_lock less.  With min_partial 1000 (a sysfs write) it never
    searches the list at all: no list_lock, and every CPU slab it installs is new (frees
    into its frozen CPU slab refill it too, so it needs fewer than one per 16 objects),
    while node 0's producer takes nearly all of its slabs from the list."""
    c, cfg = _run("v6.1", _ML4, _PC_ML, size=512)
    mine, theirs = _producers(cfg, c)
    assert int(cfg.min_partial) == 5 and int(cfg.objs_per_slab) == 16
    assert c["slab_alloc"][mine].sum() > 2 * c["slab_alloc"][theirs].sum()
    assert c["list_lock"][mine].sum() < c["list_lock"][theirs].sum()
    hi, _ = _run("v6.1", _ML4, _PC_ML, size=512, min_partial=1000)
    assert hi["list_lock"][mine].sum() == 0 < hi["list_lock"][theirs].sum()
    assert hi["slab_alloc"][mine].sum() > 4 * hi["slab_alloc"][theirs].sum()
    assert hi["slab_alloc"][theirs].sum() < hi["allocs"][theirs].sum() // 16 // 4


@pytest.mark.slow
def test_memoryless_cpus_without_a_barn_take_a_new_slab_per_allocation_at_high_min_partial():
    """7.0 (barns only on nodes with memory): node 1's producer cannot refill a sheaf, and
    each of its allocations is one ___slab_alloc(): get_from_partial() finds no list on
    its own node and get_from_any_partial() searches node 0's only when it holds more
    than min_partial slabs.  At the default (5) it takes partial slabs most of the time;
    with min_partial 1000 every allocation gets a new slab (whose other objects go onto
    node 0's list, which the search never reaches), one list_lock each either way."""
    c, cfg = _run("v7.0", _ML4, _PC_ML, size=512)
    mine, _ = _producers(cfg, c)
    n = c["allocs"][mine].sum()
    assert c["alloc_slow"][mine].sum() == n == c["list_lock"][mine].sum()
    assert 0 < c["slab_alloc"][mine].sum() < n // int(cfg.objs_per_slab)
    hi, _ = _run("v7.0", _ML4, _PC_ML, size=512, min_partial=1000)
    assert hi["slab_alloc"][mine].sum() == hi["allocs"][mine].sum() == hi["list_lock"][mine].sum()


def test_first_burst_phases_spread_each_nodes_bursty_reps_apart():
    # bursts of the whole live set: two CPUs of one node a quarter cycle (half a burst)
    # apart; four reps per node class on two nodes an eighth of the cycle apart in each
    # class; interleaved churn: no bursts
    wl, _ = workloads.local(Topology.uniform(2, 1), live=1024, burst=1024)
    assert np.asarray(wl.phase_first).tolist() == [1024, 512] + [0] * 6
    wl, lay = workloads.local(Topology.uniform(8, 2), live=64, burst=64)
    assert np.asarray(lay.node).tolist() == [0, 0, 0, 0, 1, 1, 1, 1]
    assert np.asarray(wl.phase_first).tolist() == [64, 48, 32, 16] * 2
    wl, _ = workloads.local(Topology.uniform(8, 2), live=64)
    assert not np.asarray(wl.phase_first).any()
    # bursts of part of the live set start together (a short first burst would keep more
    # objects for good), and an inactive rep keeps a whole first phase
    wl, _ = workloads.local(Topology.uniform(2, 1), live=64, burst=32)
    assert np.asarray(wl.phase_first).tolist()[:2] == [32, 32]
    assert workloads.burst_phase_first([5, 5, 0, 7], [5, 5, 5, 7], [1, 1, 1, 0],
                                       [0] * 4).tolist() == [5, 3, 0, 7]


@pytest.mark.slow
def test_two_cpus_bursting_out_of_step_pass_full_sheaves_through_the_barn():
    """Two CPUs of one node allocate 1024 objects then free them, a quarter cycle apart
    (workloads.burst_phase_first).  While one frees and the other allocates, the sheaves
    the freeing CPU fills go to the node's barn and the allocating one takes them back
    (7.2 __pcs_replace_empty_main(): barn_get_full) instead of refilling from slabs; one
    CPU alone bursts 37 sheaves into a barn of 10 and flushes the rest.  7.2 in UML
    measured it on two CPUs: 0.029 barn gets per alloc+free pair, a fifth of one CPU's
    refills.  Started in step, the two would fill the barn together and refill from slabs
    together."""
    topo = Topology.uniform(2, 1)
    prof = profiles.get_profile("v7.1")
    st = policy.structure(512, topo.possible, topo.present, topo.online,
                          policy.profile_arrays(prof), is_kmalloc=True)
    cfg = dynamics.config_from(st, prof, topo, {"kind": "local", "live": 1024, "burst": 1024,
                                                "drain": "eager"})
    assert np.asarray(cfg.workload.phase_first)[:2].tolist() == [1024, 512]
    cap, steps = int(cfg.sheaf_capacity), 9 * 1024
    assert 10 <= cap < 1024 // int(cfg.barn_max_full)    # one CPU's burst overflows the barn
    c = dynamics.counters_numpy(dynamics.simulate(jax.random.key(0), cfg, steps))
    together = cfg._replace(workload=cfg.workload._replace(phase_first=cfg.workload.burst))
    t = dynamics.counters_numpy(dynamics.simulate(jax.random.key(0), together, steps))
    assert c["barn_get"].sum() > 4 * t["barn_get"].sum()
    assert 2 * c["sheaf_refill"].sum() < t["sheaf_refill"].sum()
    assert 2 * c["slab_alloc"].sum() < t["slab_alloc"].sum()
    assert 2 * c["sheaf_flush"].sum() < t["sheaf_flush"].sum()


def _layout_cfg(topo, kind="producer_consumer", size=512):
    prof = profiles.get_profile("v6.1")
    return dynamics.config_from(_struct("v6.1", size, topo), prof, topo, {"kind": kind})


def test_a_class_list_sums_the_lists_of_the_nodes_its_reps_sit_on():
    """workloads.list_nodes: 16 CPUs on 4 nodes, producer/consumer, 8 reps of 2 CPUs:
    class 0 is node 0; class 1's reps sit on nodes 1, 2 and 3 (workloads.rep_homes), so
    its list holds three nodes' slabs.  Reps standing for several CPUs of one node keep
    it one node's list (8 or 16 CPUs on 2 nodes, 224 on 2)."""
    cfg = _layout_cfg(Topology.uniform(16, 4))
    assert np.asarray(cfg.list_nodes)[:2].tolist() == [1, 3]
    assert sorted(set(np.asarray(cfg.rep_mem_home)[np.asarray(cfg.rep_mem_node) == 1])) \
        == [0, 1, 2]
    for cpus in (8, 16, 224):
        assert np.asarray(_layout_cfg(Topology.uniform(cpus, 2)).list_nodes)[:2].tolist() \
            == [1, 1], cpus
    # 16 CPUs on 16 nodes, local churn: class 1 stands for 15 nodes and its 7 reps sit
    # on 7 of them, so its list sums 7 lists
    many = _layout_cfg(Topology.uniform(16, 16), kind="local")
    assert np.asarray(many.node_weight)[1] == 15.0
    assert np.count_nonzero(np.asarray(many.rep_mem_node) == 1) == 7
    assert np.asarray(many.list_nodes)[1] == 7


def test_a_drain_keeps_empty_slabs_up_to_min_partial_for_each_node_of_its_list():
    """6.1 __unfreeze_partials() keeps a drained empty slab while its node holds fewer than
    min_partial partial slabs.  On 16 CPUs of 4 nodes (kmalloc-512, min_partial 5) class
    0's list is node 0's and keeps 5; class 1's is the lists of nodes 1-3 and keeps 15
    (dynamics.node_min_partial).  A per-CPU list of twenty empty slabs drained into each."""
    from slabtune.model import reference_sim
    cfg = _layout_cfg(Topology.uniform(16, 4))
    assert int(cfg.min_partial) == 5
    assert np.asarray(dynamics.node_min_partial(cfg.min_partial, cfg.list_nodes))[:2].tolist() \
        == [5, 15]
    mem = np.asarray(cfg.rep_mem_node)
    for node, kept in ((0, 5), (1, 15)):
        sim = reference_sim.RefSim(cfg)
        r = int(np.flatnonzero(mem == node)[0])
        sim.pcs[r][0] = 20
        sim._drain(r)
        assert sim.ns[node][0] == kept, node
        assert sim.counts["slab_free"][r] == 20 - kept


def test_home_share_deals_a_class_list_to_its_nodes():
    """dynamics.home_share: a list of one node's slabs is all the run's, whatever the draw;
    a list summing three nodes' lists of 7 slabs gives a node 2 or 3 of them, 3 for one
    in three values of the draw bits above SHARE_SHIFT, so 7/3 on average."""
    for S in (0, 1, 7, 40):
        for w2 in (0, 0xFFFFFFFF, 0x12345678):
            assert int(dynamics.home_share(S, 1, np.uint32(w2))) == S
    d = np.arange(3 * 100, dtype=np.uint32)
    got = np.asarray(dynamics.home_share(7, 3, d << np.uint32(dynamics.SHARE_SHIFT)))
    assert set(got.tolist()) == {2, 3}
    assert got.sum() * 3 == 7 * got.size
    # the low bits (get_any_partial()'s draw) do not move it
    assert int(dynamics.home_share(7, 3, np.uint32(dynamics.DEFRAG_DRAW))) == 3


def test_a_take_fills_the_per_cpu_list_from_its_own_nodes_share():
    """6.1 get_partial_node() walks the list of the CPU's own node: on 16 CPUs of 4 nodes
    a sender of class 1 (nodes 1-3) whose class list holds 6 partial slabs, 2 per node,
    takes its CPU slab and one more for its per-CPU partial list (its node's 2), not the
    4 one call takes from a list of one node (kmalloc-64: cpu_partial_slabs 4, a call
    takes 1 + 4 // 2 + 1)."""
    from slabtune.model import reference_sim
    cfg = _layout_cfg(Topology.uniform(16, 4), size=64)
    assert int(cfg.cpu_partial_slabs) == 4
    mem = np.asarray(cfg.rep_mem_node)
    r = int(np.flatnonzero(mem[:workloads.R // 2] == 1)[0])   # a sender of class 1
    pooled = cfg._replace(list_nodes=np.ones_like(np.asarray(cfg.list_nodes)))
    for c, taken in ((cfg, 2), (pooled, 4)):
        sim = reference_sim.RefSim(c)
        sim.ns[1][1], sim.nu[1][1] = 6, 6
        sim.alloc_run(r, 1, 0, 0)
        assert sum(sim.ns[1]) == 6 - taken
        assert sim._pc_local(r) == taken - 1
        assert sim.counts["slab_alloc"][r] == 0

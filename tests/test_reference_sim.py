"""The JAX dynamics model equals the event-by-event reference simulator exactly.

Both get the same configuration and the same random words (``dynamics.draws``); every
event counter must be equal, and every gauge's underlying integer sum (gauge * steps).
The reference also lets us check allocator invariants after every single step.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slabtune.errors import SlabtuneError
from slabtune.model import dynamics, policy, profiles, reference_sim
from slabtune.model.topology import Topology

STEPS = 300
GAUGES = {name for name, _ in dynamics.GAUGE_FIELDS}

TOPOS = {
    "1node16": Topology.uniform(16, 1),
    "2node_memless": Topology.uniform(64, 2, memoryless_nodes=(1,)),
    "3node": Topology.uniform(24, 3, memoryless_nodes=(2,)),
    "2mem": Topology.uniform(16, 2),
    # class 1 stands for three nodes, told apart by the reps' homes (workloads.rep_homes)
    "4mem": Topology.uniform(16, 4),
}
#: Freers that free whatever is pending (drain = "eager"); the edge cases add held ones.
WORKLOADS = {
    "local": {"kind": "local", "live": 40, "drain": "eager"},
    "local_burst": {"kind": "local", "live": 70, "burst": 20, "drain": "eager"},
    "producer_consumer": {"kind": "producer_consumer", "depth": 50, "cross_node": 0.3,
                          "drain": "eager"},
    "request_response": {"kind": "request_response", "threads": 6, "irq_free": 0.8,
                         "drain": "eager"},
    "block_io": {"kind": "block_io", "depth": 20, "completion_remote": True, "drain": "eager"},
}
#: Held occupancy (workloads.hold_levels): freers free only above their share.
HOLD = dict(drain="hold")


def _cfg(profile, topo, wl, size=256, explicit_sheaf=0, **kw):
    """One configuration (``kw``: config_from overrides, ops_per_step among them); a
    workload table without ``drain`` frees eagerly, as these tests were written for."""
    if isinstance(wl, dict):
        wl = {"drain": "eager", **wl}
    prof = profiles.get_profile(profile)
    st = policy.structure(size, topo.possible, topo.present, topo.online,
                      policy.profile_arrays(prof), explicit_sheaf=explicit_sheaf)
    return dynamics.config_from(st, prof, topo, wl, **kw)


def _case_cfg(case: dict, **extra):
    """The configuration of an edge case (profile, size, topo, wl, kw and optional
    wl_extra / explicit_sheaf), with ``extra`` config_from overrides."""
    return _cfg(case["profile"], TOPOS[case["topo"]],
                dict(WORKLOADS[case["wl"]], **case.get("wl_extra", {})),
                size=case["size"], explicit_sheaf=case.get("explicit_sheaf", 0),
                **case["kw"], **extra)


def _assert_equal(cfg, seed):
    w = dynamics.draws(jax.random.key(seed), STEPS)
    got = dynamics.counters_numpy(dynamics.simulate_draws(w, cfg))
    want = reference_sim.run(w, cfg)
    assert set(got) == set(want)
    for k in want:
        if k in GAUGES:
            np.testing.assert_array_equal(np.rint(got[k] * STEPS), np.rint(want[k] * STEPS),
                                          err_msg=k)
        else:
            np.testing.assert_array_equal(got[k], want[k], err_msg=k)
    assert want["ops"].sum() > 0
    return want


@pytest.mark.parametrize("profile", ["v2.6.27", "v3.1", "v5.10", "v6.1", "v6.18", "v7.0",
                                     "v7.1"])
@pytest.mark.parametrize("wl", list(WORKLOADS))
def test_equal_every_profile_and_workload(profile, wl):
    topo = TOPOS["2node_memless"] if wl != "local" else TOPOS["3node"]
    _assert_equal(_cfg(profile, topo, WORKLOADS[wl]), seed=hash((profile, wl)) & 0xFFFF)


@pytest.mark.parametrize("case", [
    # tiny slabs: one object per slab (4 KiB objects at order 0), no cpu partial room
    dict(profile="v6.1", size=4096, topo="1node16", wl="local_burst",
         kw=dict(min_partial=0)),
    # many frees of full slabs with a 1-slab per-CPU partial limit: frequent drains
    dict(profile="v6.1", size=512, topo="2node_memless", wl="producer_consumer",
         kw=dict(cpu_partial_slabs=1, min_partial=2)),
    # sheaves tighter than a slab, barns that fill up (flushes, barn put failures)
    dict(profile="v7.0", size=64, topo="1node16", wl="producer_consumer",
         kw=dict(sheaf_capacity=3, barn_max_full=1, barn_max_empty=1, min_partial=1)),
    dict(profile="v7.1", size=1024, topo="3node", wl="block_io",
         kw=dict(sheaf_capacity=5, barn_max_full=2)),
    # v6.18 opt-in sheaves beside the CPU slab: refills and flushes through it, often
    dict(profile="v6.18", size=64, topo="2node_memless", wl="producer_consumer",
         kw=dict(barn_max_full=1, cpu_partial_slabs=2, min_partial=1), explicit_sheaf=3),
    # memoryless CPUs without the numa_mem_id() fix: direct allocations under the lock
    dict(profile="v6.1", size=192, topo="2node_memless", wl="local",
         kw=dict(memoryless_fallback=False)),
    dict(profile="v7.0", size=256, topo="2node_memless", wl="request_response",
         kw=dict(barns="all_nodes")),
    # many completion CPUs on a memoryless node; interrupt CPU freeing its own buffers
    dict(profile="v7.0", size=512, topo="2node_memless", wl="block_io",
         kw=dict(), wl_extra=dict(completions=8)),
    dict(profile="v6.1", size=1024, topo="1node16", wl="request_response",
         kw=dict(), wl_extra=dict(irq_self_free=0.4)),
    # v6.18 opt-in sheaves next to per-CPU partial lists
    dict(profile="v6.18", size=256, topo="2node_memless", wl="block_io",
         kw=dict(), explicit_sheaf=32),
    # class 1 sums three nodes' lists: a run takes its node's share (dynamics.home_share)
    dict(profile="v6.1", size=512, topo="4mem", wl="producer_consumer", kw=dict()),
    dict(profile="v7.1", size=512, topo="4mem", wl="producer_consumer",
         kw=dict(sheaf_capacity=5, barn_max_full=1)),
    # held queues and live sets: freers free only above their share of the senders' L - h
    dict(profile="v6.1", size=512, topo="2mem", wl="producer_consumer", kw=dict(),
         wl_extra=HOLD),
    dict(profile="v7.1", size=256, topo="3node", wl="local_burst", kw=dict(), wl_extra=HOLD),
    dict(profile="v6.18", size=256, topo="2node_memless", wl="request_response", kw=dict(),
         wl_extra=dict(HOLD, irq_self_free=0.3), explicit_sheaf=32),
    dict(profile="v7.0", size=512, topo="2node_memless", wl="block_io",
         kw=dict(sheaf_capacity=5), wl_extra=dict(HOLD, completions=4)),
])
def test_equal_edge_configs(case):
    want = _assert_equal(_case_cfg(case), seed=7)
    assert want["allocs"].sum() > 100


# Runs of b ops per rep per step: the JAX closed forms against the reference playing the
# same run event by event.  Profiles: per-CPU partial era (v3.1 without, v6.1 with),
# sheaves next to per-CPU partial lists (v6.18 opt-in), sheaf era (v7.0, v7.1 with
# memoryless CPUs using sheaves); every workload kind; memoryless nodes in the topology.
@pytest.mark.parametrize("b", [1, 2, 7, 64])
@pytest.mark.parametrize("profile,explicit_sheaf", [("v3.1", 0), ("v6.1", 0), ("v6.18", 32),
                                                    ("v7.0", 0), ("v7.1", 0)])
@pytest.mark.parametrize("wl", list(WORKLOADS))
def test_runs_equal_reference(b, profile, explicit_sheaf, wl):
    topo = TOPOS["2node_memless"] if wl != "local" else TOPOS["3node"]
    cfg = _cfg(profile, topo, WORKLOADS[wl], size=512, explicit_sheaf=explicit_sheaf,
               ops_per_step=b)
    want = _assert_equal(cfg, seed=hash((profile, wl, b)) & 0xFFFF)
    if b > 1:
        # the runs really are longer than one op: some rep did more ops than steps
        assert want["ops"].max() > STEPS


@pytest.mark.parametrize("b", [7, 64])
@pytest.mark.parametrize("case", [
    # one object per slab, no per-CPU partial room: every allocation a new slab
    dict(profile="v6.1", size=4096, topo="1node16", wl="local_burst",
         kw=dict(min_partial=0)),
    # frequent drains of a 1-slab per-CPU partial list within one run
    dict(profile="v6.1", size=512, topo="2node_memless", wl="producer_consumer",
         kw=dict(cpu_partial_slabs=1, min_partial=2)),
    dict(profile="v6.1", size=64, topo="1node16", wl="local",
         kw=dict(cpu_partial_slabs=3, min_partial=1)),
    # sheaves tighter than a slab, barns that fill up: many refills and flushes per run
    dict(profile="v7.0", size=64, topo="1node16", wl="producer_consumer",
         kw=dict(sheaf_capacity=3, barn_max_full=1, barn_max_empty=1, min_partial=1)),
    dict(profile="v7.1", size=1024, topo="3node", wl="block_io",
         kw=dict(sheaf_capacity=5, barn_max_full=2)),
    # v6.18 opt-in sheaves beside the CPU slab: refills and flushes through it, often
    dict(profile="v6.18", size=64, topo="2node_memless", wl="producer_consumer",
         kw=dict(barn_max_full=1, cpu_partial_slabs=2, min_partial=1), explicit_sheaf=3),
    # barns on every node, on memory nodes only, none
    dict(profile="v7.0", size=256, topo="2node_memless", wl="request_response",
         kw=dict(barns="all_nodes")),
    dict(profile="v7.0", size=256, topo="3node", wl="local_burst",
         kw=dict(barns="none", sheaf_capacity=4)),
    # memoryless CPUs without the numa_mem_id() fix: direct allocations, b at a time
    dict(profile="v6.1", size=192, topo="2node_memless", wl="local",
         kw=dict(memoryless_fallback=False)),
    dict(profile="v6.1", size=1024, topo="1node16", wl="request_response",
         kw=dict(), wl_extra=dict(irq_self_free=0.4)),
    # class 1 sums three nodes' lists: a run takes its node's share (dynamics.home_share)
    dict(profile="v6.1", size=512, topo="4mem", wl="producer_consumer", kw=dict()),
    dict(profile="v7.1", size=512, topo="4mem", wl="producer_consumer",
         kw=dict(sheaf_capacity=5, barn_max_full=1)),
    # held occupancy: free runs stop at the excess over the freer's hold
    dict(profile="v6.1", size=256, topo="2node_memless", wl="producer_consumer", kw=dict(),
         wl_extra=HOLD),
    dict(profile="v7.1", size=512, topo="1node16", wl="local", kw=dict(), wl_extra=HOLD),
    dict(profile="v7.0", size=256, topo="3node", wl="request_response", kw=dict(),
         wl_extra=HOLD),
])
def test_runs_equal_reference_edge_configs(b, case):
    want = _assert_equal(_case_cfg(case, ops_per_step=b), seed=b)
    assert want["allocs"].sum() > 100


@pytest.mark.slow
@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(b=st.integers(1, 300), profile=st.sampled_from(["v3.1", "v6.1", "v6.18", "v7.0", "v7.1"]),
       size=st.sampled_from([8, 64, 192, 512, 1024, 4096]), topo=st.sampled_from(list(TOPOS)),
       wl=st.sampled_from(list(WORKLOADS)), min_partial=st.integers(0, 6),
       cps=st.integers(0, 8), sheaf=st.sampled_from([0, 1, 3, 8, 32]),
       barns=st.sampled_from(["none", "memory_nodes", "all_nodes"]),
       max_full=st.integers(0, 4), seed=st.integers(0, 1 << 16))
def test_runs_equal_reference_random_configs(b, profile, size, topo, wl, min_partial, cps,
                                             sheaf, barns, max_full, seed):
    """Random run lengths, slab sizes, list limits, sheaf capacities and barn modes."""
    explicit = sheaf if profile == "v6.18" else 0
    kw = dict(min_partial=min_partial, cpu_partial_slabs=cps, barns=barns,
              barn_max_full=max_full, ops_per_step=b)
    if profile in ("v7.0", "v7.1") and sheaf:
        kw["sheaf_capacity"] = sheaf
    cfg = _cfg(profile, TOPOS[topo], WORKLOADS[wl], size=size, explicit_sheaf=explicit, **kw)
    _assert_equal(cfg, seed)


@pytest.mark.parametrize("b", [1, 7, 64])
@pytest.mark.parametrize("profile,size,wl,kw", [
    ("v6.1", 4096, "producer_consumer", dict(cross_node=0.5)),
    ("v6.1", 4096, "block_io", dict()),
    ("v5.10", 4096, "producer_consumer", dict(cross_node=0.5)),
    # v6.8 on (unfrozen per-CPU partial slabs): emptying a remote one takes its node's lock
    ("v6.18", 4096, "producer_consumer", dict(cross_node=0.5)),
])
@pytest.mark.parametrize("cps,mp", [(None, None), (1, 2), (3, 0)])
def test_remote_slabs_on_per_cpu_partial_lists_equal_reference(b, profile, size, wl, kw,
                                                               cps, mp):
    """Two memory nodes, frees across them (item 5b): full slabs of the other node made
    partial by a free go on the freeing CPU's per-CPU partial list, and the list's drains
    move them home; the JAX model equals the reference, which really pushes such slabs."""
    over = {} if cps is None else dict(cpu_partial_slabs=cps, min_partial=mp)
    cfg = _cfg(profile, TOPOS["2mem"], dict(WORKLOADS[wl], **kw), size=size,
               ops_per_step=b, **over)
    _assert_equal(cfg, seed=b + 17)

    class Counting(reference_sim.RefSim):
        pushed = 0

        def _add_pc(self, r, h, remote=False):
            self.pushed += int(remote)
            super()._add_pc(r, h, remote)

    sim = Counting(cfg)
    w = np.asarray(dynamics.draws(jax.random.key(b + 17), STEPS))
    for t in range(STEPS):
        sim.step(w[t])
    assert sim.pushed > 0


def test_run_of_one_is_the_single_op_model():
    """b = 1 spelled out: every rep does at most one op per step."""
    cfg = _cfg("v6.1", TOPOS["2node_memless"], WORKLOADS["request_response"])
    want = _assert_equal(cfg, seed=1)
    assert want["ops"].max() <= STEPS


@pytest.mark.parametrize("b", [0, -3, 1025, 2.5, True])
def test_ops_per_step_out_of_range_is_named(b):
    with pytest.raises(SlabtuneError, match="ops_per_step"):
        _cfg("v6.1", TOPOS["1node16"], WORKLOADS["local"], ops_per_step=b)


def test_simulate_from_key_equals_its_draws():
    """simulate(key) draws its words in the scan; they are the words draws(key) returns."""
    cfg = _cfg("v7.0", TOPOS["2node_memless"], WORKLOADS["block_io"])
    key = jax.random.key(11)
    a = dynamics.counters_numpy(dynamics.simulate(key, cfg, STEPS))
    b = dynamics.counters_numpy(dynamics.simulate_draws(dynamics.draws(key, STEPS), cfg))
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)


def _slab_inuse(sim: reference_sim.RefSim) -> int:
    cs = sum(sim.cs_inuse)
    pc = sum(map(sum, sim.pcu)) + sum(sim.pd) + sum(map(sum, sim.rpu)) + sum(sim.rpd)
    node = sum(map(sum, sim.nu)) + sum(sim.hu)
    return cs + pc + node + sum(sim.F) * sim.objs


def _held(sim: reference_sim.RefSim) -> int:
    return sum(sim.main) + sum(sim.spare) + sum(sim.barn_full) * sim.cap


@pytest.mark.parametrize("b", [1, 16])
@pytest.mark.parametrize("profile,wl,kw", [
    ("v3.1", "producer_consumer", dict(min_partial=2)),
    ("v6.1", "local_burst", dict(min_partial=3)),
    ("v6.1", "request_response", dict(cpu_partial_slabs=2)),
    ("v6.1", "producer_consumer", dict(min_partial=1)),
    ("v7.0", "block_io", dict(sheaf_capacity=4)),
    ("v7.1", "producer_consumer", dict(sheaf_capacity=6, barn_max_full=1)),
])
@pytest.mark.parametrize("topo", ["2node_memless", "2mem"])
def test_invariants_every_step(profile, wl, kw, b, topo):
    """After every step: objects allocated from slabs = objects in flight + objects parked
    in sheaves and barns; a CPU slab's free + allocated + remotely freed objects = objects
    per slab; every fill level's objects lie within its bounds; a head slab is partly
    used; a per-CPU partial list's draining window holds between one and ``objs - 1``
    objects per slab and more than ``half`` for each slab behind its oldest (and on 6.1
    producer/consumer, where several freers lag their senders by different amounts, it is
    wider than one slab at some step); a node
    never keeps more than min_partial empty slabs; nothing negative."""
    cfg = _cfg(profile, TOPOS[topo], WORKLOADS[wl], ops_per_step=b, **kw)
    sim = reference_sim.RefSim(cfg)
    w = np.asarray(dynamics.draws(jax.random.key(3), 600))
    widest = 0
    for t in range(w.shape[0]):
        sim.step(w[t])
        widest = max(widest, sim.win)
        assert _slab_inuse(sim) == sum(sim.out) + _held(sim), t
        assert sum(sim.out) == sum(sim.pend_tot) == sum(map(sum, sim.pend))
        for r in range(dynamics.R):
            tot = sim.cs_free[r] + sim.cs_inuse[r] + sim.cs_rfree[r]
            assert tot in (0, sim.objs), (t, r)
            assert sim.cs_tracked[r] == sum(sim.pend_cs[r]) <= sim.cs_inuse[r]
            assert all(0 <= sim.pend_cs[r][j] <= sim.pend[r][j] for j in range(dynamics.R))
            for pw, pd in ((sim.pw[r], sim.pd[r]), (sim.rpw[r], sim.rpd[r])):
                assert (pw, pd) == (0, 0) or (pw > 0 and pw <= pd <= pw * (sim.objs - 1)
                                              and pd > sim.half * (pw - 1)), (t, r, pw, pd)
        lo = sim.lo + [sim.objs]
        for s, u in [(sim.pcs[r], sim.pcu[r]) for r in range(dynamics.R)] + \
                [(sim.rps[r], sim.rpu[r]) for r in range(dynamics.R)] + \
                [(sim.ns[n], sim.nu[n]) for n in range(dynamics.N)]:
            for lv in range(dynamics.LEVELS):
                hi = min(lo[lv + 1] - 1, sim.objs - 1)
                assert s[lv] >= 0 and lo[lv] * s[lv] <= u[lv] <= hi * s[lv], (t, s, u)
        for n in range(dynamics.N):
            assert sim.F[n] >= 0
            assert (sim.hs[n], sim.hu[n]) == (0, 0) or (sim.hs[n] == 1
                                                        and 0 < sim.hu[n] < sim.objs)
            # empty slabs are kept up to min_partial at the class list's scale
            assert sim.ns[n][0] <= sim.node_mp[n], (t, n, sim.node_mp)
            assert sim.barn_full[n] <= sim.max_full and sim.barn_empty[n] <= sim.max_empty
    if wl == "producer_consumer" and profile == "v6.1":
        assert widest > 1


def test_gauge_sums_carry_past_20_bits():
    """Gauge sums are carried into a high word every 2**20; a run whose objects_inuse sum
    passes 2**20 still matches the reference (and the exact arithmetic sum)."""
    cfg = _cfg("v6.1", TOPOS["1node16"], {"kind": "local", "live": 4000, "alloc_prob": 1.0})
    steps = 1500
    w = dynamics.draws(jax.random.key(5), steps)
    got = dynamics.counters_numpy(dynamics.simulate_draws(w, cfg))
    want = reference_sim.run(w, cfg)
    total = np.rint(got["objects_inuse"] * steps)
    assert total[0] == steps * (steps + 1) // 2 > 1 << dynamics.GAUGE_SHIFT
    np.testing.assert_array_equal(total, np.rint(want["objects_inuse"] * steps))


def test_fifo_split_takes_the_older_slabs_objects_first():
    """A pair's frees go oldest first: the objects of the allocator's earlier slabs, then
    those still in its current CPU slab (the youngest)."""
    pend, cs = np.array([5, 5, 3, 0]), np.array([2, 2, 3, 0])
    old, new = dynamics.fifo_split(np.array([3, 4, 2, 0]), pend, cs)
    assert old.tolist() == [3, 3, 0, 0] and new.tolist() == [0, 1, 2, 0]


@pytest.mark.parametrize("b", [1, 4])
def test_deep_queues_never_free_into_the_current_cpu_slab(b):
    """Block I/O on one node, 20 requests in flight per submitter and 16 objects per slab
    (kmalloc-256 at order 0, 6.1): with the completions oldest first, a submitter always
    has older requests out than its current CPU slab holds, so no object it allocated
    from that slab is freed into it while it is the CPU slab (no ``cs_rfree`` from
    ``pend_cs``).  Drawing uniformly sent about half of the completions there.  A CPU
    slab taken off a list with older objects still out takes their frees, as the
    kernel's frozen slab does (the node list's head slab, partly freed in the list's
    order, dynamics.fifo_frees); those are counted apart.  The JAX model equals the
    reference."""
    wl = {"kind": "block_io", "depth": 20}
    cfg = _cfg("v6.1", Topology.uniform(4, 1), wl, ops_per_step=b)
    want = _assert_equal(cfg, seed=b + 3)
    assert want["frees"].sum() > 0

    class Counting(reference_sim.RefSim):
        tracked = 0          # frees into another CPU's CPU slab of objects it handed out
        older = 0            # frees into another CPU's CPU slab of objects from before

        def free_run(self, r, n, w1, w2):
            before, older = sum(self.cs_rfree), self.older
            super().free_run(r, n, w1, w2)
            self.tracked += sum(self.cs_rfree) - before - (self.older - older)

        def _slab_free(self, r, n, dest):
            self.older += dest[0] == "cs" and dest[1] != r
            super()._slab_free(r, n, dest)

    sim = Counting(cfg)
    w = np.asarray(dynamics.draws(jax.random.key(b + 3), STEPS))
    # at the start a submitter's first requests all sit in its first CPU slab
    for t in range(STEPS // 3):
        sim.step(w[t])
    assert sim.tracked > 0
    sim.tracked = 0
    for t in range(STEPS // 3, STEPS):
        sim.step(w[t])
    assert int(np.asarray(cfg.objs_per_slab)) == 16 and sim.tracked == 0

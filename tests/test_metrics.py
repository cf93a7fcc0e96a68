"""Metrics from counters: weighting by rep CPUs, per-1000-op rates, memory, contention.

Counters are written by hand here (the dynamics core has its own tests); the layouts come
from the real workload constructors and config_from.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest

from slabtune.model import cost as cost_model
from slabtune.model import dynamics, metrics, policy, profiles, topology, workloads
from slabtune.sweeps import simconfig

R = dynamics.R
COST = simconfig.load_cost()[0]


def _cfg(profile="v6.1", cpus=8, nodes=2, size=4096, memoryless=(), kind="local", **wl):
    prof = profiles.get_profile(profile)
    topo = topology.Topology.uniform(cpus, nodes, memoryless_nodes=memoryless)
    st = policy.structure(size, topo.possible, topo.present, topo.online,
                          policy.profile_arrays(prof), is_kmalloc=True)
    return dynamics.config_from(st, prof, topo, workloads.build(kind, topo, **wl)), st


def _counters(**fields):
    base = {f: np.zeros(R, np.int32) for f in dynamics.COUNTER_FIELDS}
    base.update(list_lock_node=np.zeros(dynamics.N, np.int32),
                slabs_total=np.zeros(dynamics.N, np.float32), objects_inuse=np.zeros(R, np.float32),
                empty_slabs_kept=np.zeros(dynamics.N, np.float32),
                cpu_partial_slabs_held=np.zeros(R, np.float32),
                sheaf_objects_held=np.zeros(R, np.float32),
                barn_objects_held=np.zeros(dynamics.N, np.float32),
                outstanding=np.zeros(R, np.int32))
    for k, v in fields.items():
        base[k] = np.asarray(v, base[k].dtype)
    return dynamics.Counters(**base)


def _per_rep(values):
    v = list(values) + [0] * (R - len(values))
    return np.array(v)


_compute = jax.jit(lambda counters, cfg, pcp, object_size, steps, other: metrics.compute(
    counters, cfg, COST, pcp_max=pcp, object_size=object_size, steps=steps, other_ns=other))


def _metrics(counters, cfg, pcp=3, object_size=4096, steps=1000, other=0.0):
    return _compute(counters, cfg, pcp, float(object_size), float(steps), float(other))


def test_fast_path_fractions_weight_reps_by_their_cpus():
    # producer_consumer on 8 CPUs, 1 node: 4 sender reps and 4 receiver reps of 1 CPU each.
    cfg, _ = _cfg(cpus=12, nodes=1, kind="producer_consumer")
    w = np.asarray(cfg.rep_weight)
    assert w.sum() == pytest.approx(12.0)
    allocs = _per_rep([100, 100, 100, 100])
    fast = _per_rep([100, 50, 50, 50])
    frees = _per_rep([0, 0, 0, 0, 100, 100, 100, 100])
    ffast = _per_rep([0, 0, 0, 0, 10, 0, 0, 0])
    c = _counters(ops=allocs + frees, allocs=allocs, alloc_fast=fast, alloc_slow=allocs - fast,
                  frees=frees, free_fast=ffast, free_slow=frees - ffast)
    m = _metrics(c, cfg)
    want_a = (w * fast).sum() / (w * allocs).sum()
    want_f = (w * ffast).sum() / (w * frees).sum()
    assert float(m.alloc_fastpath_frac) == pytest.approx(want_a, rel=1e-6)
    assert float(m.free_fastpath_frac) == pytest.approx(want_f, rel=1e-6)
    ops = (w * (allocs + frees)).sum()
    assert float(m.alloc_slowpath_per_kop) == pytest.approx(
        1000 * (w * (allocs - fast)).sum() / ops, rel=1e-5)


def test_page_allocator_calls_land_in_the_slab_order():
    cfg, st = _cfg(size=4096)          # kmalloc-4k on 8 CPUs: order 3
    assert int(st.order) == 3
    ops = _per_rep([1000] * 8)
    c = _counters(ops=ops, allocs=ops // 2, frees=ops // 2, slab_alloc=_per_rep([10] * 8),
                  slab_free=_per_rep([5] * 8))
    m = _metrics(c, cfg)
    assert float(m.slab_allocs_per_kop) == pytest.approx(10.0)
    assert float(m.slab_frees_per_kop) == pytest.approx(5.0)
    by_order = np.asarray(m.page_allocs_per_kop_by_order)
    assert by_order.shape == (metrics.N_ORDERS,)
    assert by_order[3] == pytest.approx(10.0) and by_order.sum() == pytest.approx(10.0)
    # order 3 is above v5.11's per-CPU page lists: every call takes the zone lock
    m11 = _metrics(c, cfg, pcp=0)
    assert float(m11.zone_lock_per_kop) == pytest.approx(15.0)
    assert float(m.zone_lock_per_kop) == pytest.approx(15.0 / float(COST.pcp_batch), rel=1e-5)
    assert float(m11.ns_per_op) > float(m.ns_per_op)


def test_memory_scales_cpu_slabs_by_cpus_and_kept_empties_by_nodes():
    # 64 CPUs on 4 nodes, local churn: node class 0 = node 0, class 1 = nodes 1..3.
    cfg, st = _cfg(cpus=64, nodes=4, size=4096)
    slab = 4096 << int(st.order)
    w = np.asarray(cfg.rep_weight)
    mem = np.asarray(cfg.rep_mem_node)
    nw = np.asarray(cfg.node_weight)
    home = np.asarray(cfg.rep_mem_home)
    assert nw[1] == 3.0
    total = np.array([10.0, 12.0, 0, 0], np.float32)
    empty = np.array([2.0, 4.0, 0, 0], np.float32)
    live = _per_rep([20.0] * 8).astype(np.float32)
    c = _counters(ops=_per_rep([10] * 8), slabs_total=total, empty_slabs_kept=empty,
                  objects_inuse=live)
    m = _metrics(c, cfg)
    want, kept = 0.0, 0.0
    for n in (0, 1):
        on = mem == n
        cpu_scale = w[on].sum() / on.sum()
        # the class's list sums the lists of the nodes its reps sit on and keeps empty
        # slabs up to min_partial for each; every node of the class keeps its share
        lists = len(set(home[on].tolist()))
        real_empty = empty[n] / lists * nw[n]
        want += ((total[n] - empty[n]) * cpu_scale + real_empty) * slab
        kept += real_empty * slab
    # class 0 is node 0; class 1's six reps sit two on each of nodes 1-3, so its list is
    # three nodes' lists and its 4 kept slabs are 4/3 on each of the 3 nodes
    assert kept == pytest.approx((2 * 1 + 4 / 3 * 3) * slab)
    assert float(m.memory_bytes) == pytest.approx(want, rel=1e-6)
    assert float(m.empty_kept_bytes) == pytest.approx(kept, rel=1e-6)
    live_b = (w * live).sum() * 4096
    assert float(m.live_bytes) == pytest.approx(live_b)
    assert float(m.overhead_frac) == pytest.approx(want / live_b - 1, rel=1e-5)


def _lock_heavy(cpus, memoryless=()):
    nodes = 2 if memoryless else 1
    cfg, _ = _cfg(cpus=cpus, nodes=nodes, memoryless=memoryless)
    ops = _per_rep([1000] * 8)
    node = np.asarray(cfg.rep_node)
    ll = _per_rep([100] * 8)
    ll_remote = np.where(node != 0, ll, 0)   # reps on the memoryless node take node 0's lock
    c = _counters(ops=ops, allocs=ops // 2, frees=ops // 2, alloc_fast=ops // 2 - 50,
                  alloc_slow=_per_rep([50] * 8), free_fast=ops // 2 - 50,
                  free_slow=_per_rep([50] * 8), list_lock=ll, list_lock_remote=ll_remote,
                  list_lock_node=np.array([800, 0, 0, 0]))
    return _metrics(c, cfg)


def test_contention_grows_with_the_cpus_behind_the_same_counts():
    ms = [_lock_heavy(n) for n in (1, 8, 64, 512)]
    ns = [float(m.ns_per_op) for m in ms]
    rho = [float(m.list_lock_rho) for m in ms]
    assert ns == sorted(ns) and ns[-1] > 10 * ns[0]
    assert rho == sorted(rho) and rho[-1] > 0.99
    assert float(ms[0].list_lock_wait_ns) == 0.0          # one CPU never waits
    # the pace is exact to float32 below saturation; at a saturated lock the wait is
    # 1 / (1 - U) with U within 1e-5 of 1, which float32 resolves to about 1%
    for m in ms[:3]:
        assert float(m.fixed_point_residual) < 1e-3
    assert float(ms[3].fixed_point_residual) < 2e-2


def test_memoryless_cpus_pay_remote_lines_on_the_memory_nodes_lock():
    # The same counts on 16 CPUs: all on one node, or half of them on a memoryless node
    # whose CPUs take node 0's list_lock across the interconnect.
    local = _lock_heavy(16)
    memless = _lock_heavy(16, memoryless=(1,))
    assert float(memless.list_lock_remote_per_kop) > 0.0
    assert float(memless.ns_per_op) > float(local.ns_per_op)


@pytest.mark.slow
def test_compute_vmaps_over_configurations():
    cfgs = [_cfg(cpus=n)[0] for n in (2, 16, 128)]
    ops = _per_rep([1000] * 8)
    c = _counters(ops=ops, allocs=ops // 2, frees=ops // 2, list_lock=_per_rep([100] * 8),
                  list_lock_node=np.array([400, 400, 0, 0]))
    stacked = dynamics.stack_configs(cfgs)
    cs = jax.tree_util.tree_map(lambda x: np.stack([x] * 3), c)
    f = jax.vmap(lambda cc, cfg: metrics.compute(cc, cfg, COST, pcp_max=3, object_size=4096,
                                           steps=1000).ns_per_op)
    batched = np.asarray(f(cs, stacked))
    single = [float(_metrics(c, cfg).ns_per_op) for cfg in cfgs]
    np.testing.assert_allclose(batched, single, rtol=1e-5)


@pytest.mark.slow
def test_each_acquisition_moves_k_lines_local_or_remote():
    # Two reps of one CPU each: rep 0 on node 0 (memory), rep 1 on a memoryless node that
    # takes node 0's list_lock and zone lock across the interconnect.  Hand-worked with
    # hold 80, lines of 40 (local) and 150 (remote) ns, k = 5 list_lock lines, 3 barn
    # lines, 2 zone lines and 1 more per block the zone section moves: the service of an
    # acquisition is hold + k * f * line, f the chance that the previous holder was the
    # other CPU (1/2 where both take a lock equally, 0 on a barn each CPU has to itself).
    from slabtune.model import cost as cost_model
    from slabtune.model import priors

    cost = cost_model.cost_from_mapping({**priors.prior_values(), "list_lock_hold_ns": 80.0,
                                "line_local_ns": 40.0, "line_remote_ns": 150.0,
                                "list_lock_lines": 5.0, "barn_lock_lines": 3.0,
                                "zone_lock_lines": 2.0, "zone_block_lines": 1.0})
    cfg, _ = _cfg(cpus=2, nodes=2, memoryless=(1,))
    node = np.asarray(cfg.rep_node)
    assert node[0] == 0 and node[1] != 0 and np.asarray(cfg.rep_mem_node)[1] == 0
    ops = _per_rep([1000, 1000])
    c = _counters(ops=ops, allocs=ops // 2, frees=ops // 2, list_lock=_per_rep([100, 100]),
                  list_lock_remote=_per_rep([0, 100]), barn_get=_per_rep([10, 10]),
                  slab_alloc=_per_rep([31, 31]), list_lock_node=np.array([200, 0, 0, 0]))
    acq, line, hold, mult = metrics.lock_classes(c, cfg, 3, cost)
    n = dynamics.N
    acq, line = np.asarray(acq), np.asarray(line)
    # list_lock of node 0: 0.1 acquisitions per op each; half of 5 x 40 local, of 5 x 150
    # remote
    assert acq[0, 0] == pytest.approx(0.1) and acq[1, 0] == pytest.approx(0.1)
    assert line[0, 0] == pytest.approx(100.0) and line[1, 0] == pytest.approx(375.0)
    # barn of the rep's own node, which no other CPU takes: its 3 lines never move
    assert line[0, n] == 0.0 and acq[1, n + node[1]] == pytest.approx(0.01)
    assert line[1, n + node[1]] == 0.0
    # zone lock of node 0: half of 2 + 31 lines (a pcp batch of 31 blocks, a line each);
    # 31 order-3 calls per 1000 ops = 1/1000 per op
    assert line[0, 2 * n] == pytest.approx(33 * 40.0 / 2)
    assert line[1, 2 * n] == pytest.approx(33 * 150.0 / 2)
    assert acq[1, 2 * n] == pytest.approx(0.031 / 31.0)
    # The closed-queue solution serves each acquisition for hold + k * f * line.
    base = np.array([100.0, 100.0] + [0.0] * (R - 2), np.float32)
    w = np.asarray(cfg.rep_weight)
    sol = cost_model.solve(base, acq, hold, line, w, mult, cost.queueing)
    t = np.asarray(sol.t)
    service = np.array([80.0 + 100.0, 80.0 + 375.0])
    rho0 = float(np.sum(0.1 * service / float(sol.tau)))
    assert float(sol.rho[0]) == pytest.approx(rho0, rel=1e-3)
    wait = np.asarray(sol.wait)
    barn = n + node[1]
    want_t1 = (100.0 + 0.1 * (service[1] + wait[1, 0])
               + 0.01 * (40.0 + wait[1, barn])          # barn hold 40, no line moves
               + acq[1, 2 * n] * (50.0 * 31 + 33 * 75.0 + wait[1, 2 * n]))  # zone: half of 33
    # the zone lock's hold: 50 ns per block, a pcp batch of 31 blocks per acquisition
    assert float(np.asarray(hold)[2 * n]) == pytest.approx(50.0 * 31)
    assert t[1] == pytest.approx(want_t1, rel=1e-4)


@pytest.mark.slow
def test_a_lone_cpu_moves_no_lock_lines():
    # A lone CPU never waits and is always its lock's previous holder: its time per op is
    # the same whether a list_lock section touches one line or six.
    from slabtune.model import cost as cost_model
    from slabtune.model import priors

    cfg, _ = _cfg(cpus=1, nodes=1)
    ops = _per_rep([1000])
    c = _counters(ops=ops, allocs=ops // 2, frees=ops // 2, list_lock=_per_rep([100]),
                  list_lock_node=np.array([100, 0, 0, 0]))
    times = []
    for k in (1.0, 6.0):
        cost = cost_model.cost_from_mapping({**priors.prior_values(), "list_lock_lines": k})
        m = metrics.compute(c, cfg, cost, pcp_max=3, object_size=4096, steps=1000)
        assert float(m.list_lock_wait_ns) == 0.0
        times.append(float(m.ns_per_op))
    assert times[1] == times[0]


def _groups(kind, topo, **params):
    """The coupling groups of a workload as sets of active reps."""
    wl, layout = workloads.build(kind, topo, **params)
    m = np.asarray(metrics.coupling(wl))
    act = [r for r in range(workloads.R) if wl.active[r]]
    return {frozenset(r2 for r2 in act if m[r, r2]) for r in act}


def test_coupling_groups_follow_who_frees_whose_objects():
    # local churn: every CPU frees only its own objects, so no rep waits for another.
    t8 = topology.Topology.uniform(8, 2)
    assert all(len(g) == 1 for g in _groups("local", t8))
    # producer_consumer on the same node: each node class's senders and receivers form
    # one group; on the seed's memoryless machine the memory nodes' CPUs and the
    # memoryless ones exchange no object, so they pace separately.
    seed = topology.Topology.uniform(128, 8, memoryless_nodes=(1, 2, 3, 5, 6, 7))
    groups = _groups("producer_consumer", seed)
    assert len(groups) > 1 and all(len(g) == 2 for g in groups)
    # half the frees on the other node tie both nodes' senders and receivers together;
    # all of them there pairs node 0's senders with node 1's receivers and the reverse.
    assert len(_groups("producer_consumer", t8, cross_node=0.5)) == 1
    assert len(_groups("producer_consumer", t8, cross_node=1.0)) == 2
    # block I/O with one completion CPU: every submitter waits on it.
    assert len(_groups("block_io", t8)) == 1


@pytest.mark.slow
def test_freed_slabs_load_their_own_nodes_zone_lock_with_a_line_per_block():
    # Two CPUs on two nodes with memory.  Rep 0 allocates 31 slabs per 1000 ops on node 0;
    # rep 1 frees 31 per 1000 ops, all of node 0's slabs (every one of its list_lock
    # sections is node 0's).  Its pages go back to node 0's zone (__free_slab() ->
    # free_unref_page() -> the drain takes the page's zone lock), across the interconnect.
    from slabtune.model import cost as cost_model
    from slabtune.model import priors

    cost = cost_model.cost_from_mapping({**priors.prior_values(), "line_local_ns": 40.0,
                                         "line_remote_ns": 150.0, "zone_lock_lines": 2.0,
                                         "zone_block_lines": 3.0})
    cfg, _ = _cfg(cpus=2, nodes=2)
    node = np.asarray(cfg.rep_node)
    assert node[0] == 0 and node[1] == 1
    ops = _per_rep([1000, 1000])
    c = _counters(ops=ops, allocs=_per_rep([1000, 0]), frees=_per_rep([0, 1000]),
                  list_lock=_per_rep([0, 100]), list_lock_remote=_per_rep([0, 100]),
                  slab_alloc=_per_rep([31, 0]), slab_free=_per_rep([0, 31]),
                  list_lock_node=np.array([100, 0, 0, 0]))
    n = dynamics.N
    for pcp, blocks in ((3, 31), (0, 1)):   # order 3 (cfg.order): a pcp batch, or a buddy call
        acq, line, hold, _ = (np.asarray(x) for x in metrics.lock_classes(c, cfg, pcp, cost))
        calls = 0.031 / blocks
        # both CPUs take node 0's zone lock, none node 1's
        assert acq[0, 2 * n] == pytest.approx(calls) and acq[1, 2 * n] == pytest.approx(calls)
        assert acq[1, 2 * n + 1] == 0.0
        # each section moves 2 lines plus 3 per block, half the time (the other CPU held
        # it last): locally for rep 0, across nodes for rep 1
        k = 2.0 + 3.0 * blocks
        assert line[0, 2 * n] == pytest.approx(k * 40.0 / 2)
        assert line[1, 2 * n] == pytest.approx(k * 150.0 / 2)
        assert hold[2 * n] == pytest.approx(50.0 * blocks)
    # A CPU that frees its own node's slabs (no list_lock of another node) loads its own zone.
    c_own = c._replace(list_lock_remote=_per_rep([0, 0]), list_lock_node=np.array([0, 100, 0, 0]))
    acq, _, _, _ = (np.asarray(x) for x in metrics.lock_classes(c_own, cfg, 3, cost))
    assert acq[1, 2 * n] == 0.0 and acq[1, 2 * n + 1] == pytest.approx(0.001)


def test_a_lone_cpu_is_priced_as_the_cost_fit_prices_a_calibration_run():
    # One mapping from counters to priced events (cost.priced_events) serves the model and
    # the cost fit: the counters of a one-CPU run of bursts of 1024 on a 512-byte cache
    # (order 0, 8 objects, sheaves of 28: what 7.2 gave in UML), as the simulation counts
    # them (refills and flushes as events), give through metrics.compute the ns per pair
    # that calibrate.umlfit charges the same run (refills and flushes in objects, one
    # list_lock section per refill, per slab made partial and per slab discarded).
    from slabtune.calibrate import umlfit

    cfg, st = _cfg(profile="v7.1", cpus=1, nodes=1, size=512)
    assert (int(st.order), int(st.objs_per_slab), int(st.sheaf_capacity)) == (0, 8, 28)
    pairs = 100_000
    n = dict(barn_get=977, barn_get_fail=2453, barn_put=977, barn_put_fail=2441,
             slab_alloc=8152, slab_free=8105, free_add_partial=3124)
    lock = n["barn_get_fail"] + n["free_add_partial"] + n["slab_free"]
    c = _counters(ops=_per_rep([2 * pairs]), allocs=_per_rep([pairs]),
                  frees=_per_rep([pairs]), alloc_fast=_per_rep([pairs]),
                  free_fast=_per_rep([pairs]),
                  **{k: _per_rep([v]) for k, v in n.items() if k != "free_add_partial"},
                  sheaf_refill=_per_rep([n["barn_get_fail"]]),
                  sheaf_flush=_per_rep([n["barn_put_fail"]]),
                  list_lock=_per_rep([lock]), list_lock_node=np.array([lock, 0, 0, 0]))
    got = float(_metrics(c, cfg, object_size=512).ns_per_op)
    row = {k: v / pairs for k, v in n.items()}
    row.update(alloc_fastpath=1.0, free_fastpath=1.0, alloc_slowpath=0.0, free_slowpath=0.0,
               alloc_slab=row.pop("slab_alloc"), free_slab=row.pop("slab_free"),
               sheaf_refill=28 * n["barn_get_fail"] / pairs,
               sheaf_flush=28 * n["barn_put_fail"] / pairs, order=0, objs_per_slab=8)
    values = {k: float(v) for k, v in COST._asdict().items()}
    want = sum(umlfit.charge(umlfit.events(row, side), values) for side in ("alloc", "free"))
    assert got == pytest.approx(want, rel=1e-5)
    # and it is two per-op prices of the mapped counters (a pair is two ops)
    ev = metrics.priced_events(c, cfg.sheaf_capacity, cfg.remote_free_lines)
    one = np.asarray(cost_model.one_cpu_ns(ev, 0, 8, 3, COST))[0]
    assert got == pytest.approx(2 * float(one), rel=1e-5)


def test_a_replacement_is_priced_by_what_it_did():
    # 7.x counts every sheaf hit as a fast path, also the call that replaced its main
    # sheaf; the model prices that call as the fast path plus the exchange, refill or
    # flush it made, never as a slow path.  A swap with the spare costs nothing more.
    cfg, _ = _cfg(profile="v7.1", cpus=1, nodes=1, size=512)
    ops = _per_rep([1000])
    swaps = _counters(ops=ops, alloc_fast=_per_rep([500]), free_fast=_per_rep([500]),
                      sheaf_alloc_replace=_per_rep([20]), sheaf_free_replace=_per_rep([20]))
    plain = _counters(ops=ops, alloc_fast=_per_rep([500]), free_fast=_per_rep([500]))
    r = metrics.op_rates(swaps, cfg.sheaf_capacity, cfg.remote_free_lines)
    assert float(np.asarray(r.alloc_slow)[0]) == 0.0
    assert float(np.asarray(r.alloc_fast)[0]) == pytest.approx(0.5)
    assert float(_metrics(swaps, cfg).ns_per_op) == float(_metrics(plain, cfg).ns_per_op)
    # a failed barn attempt: a barn lock section, no exchange
    fail = _counters(ops=ops, alloc_fast=_per_rep([500]), free_fast=_per_rep([500]),
                     barn_get_fail=_per_rep([10]))
    ev = metrics.priced_events(fail, cfg.sheaf_capacity, cfg.remote_free_lines)
    assert float(np.asarray(ev.rates.sheaf_swap)[0]) == 0.0
    assert float(np.asarray(ev.barn_lock)[0]) == pytest.approx(0.01)

"""SLAB dynamics (model/slab_dynamics.py) against its plain-Python twin, and against what
mm/slab.c's rules imply on small cases.

Equality: the same configuration and the same words give the same integers in both, every
event counter and every gauge's underlying sum, on every profile and workload kind and on
randomised configurations (tunables, free_limit, reap interval, the numa_mem_id() switch,
topologies with memoryless nodes); the reference also checks its invariants after every
step.  The figures the other tests expect are derived from the kernel rules in their
docstrings, not read off a run.
"""

from __future__ import annotations

import math

import jax
import numpy as np
import pytest

from slabtune.errors import SlabtuneError
from slabtune.model import profiles, slab_reference, workloads
from slabtune.model import slab_dynamics as sd
from slabtune.model.topology import Topology

STEPS = 300
GAUGES = set(sd.REP_GAUGES + sd.NODE_GAUGES)
PROFILES = tuple(profiles.SLAB_PROFILES)

TOPOS = {
    "1cpu": Topology.uniform(1, 1),
    "1node16": Topology.uniform(16, 1),
    "2node": Topology.uniform(16, 2),
    "2node_memless": Topology.uniform(64, 2, memoryless_nodes=(1,)),
    "3node": Topology.uniform(24, 3, memoryless_nodes=(2,)),
    # every CPU on a memoryless node: the 2010 seed's machine in small
    "all_memless": Topology.uniform(16, 3, node_cpus=(0, 8, 8), memoryless_nodes=(1, 2)),
    "4node_2memless": Topology.uniform(32, 4, memoryless_nodes=(1, 3)),
    # class 1 stands for three nodes: frees between them are alien (rep_mem_home)
    "4mem": Topology.uniform(16, 4),
}
WORKLOADS = {
    "local": {"kind": "local", "live": 40, "drain": "eager"},
    "local_burst": {"kind": "local", "live": 150, "burst": 70, "drain": "eager"},
    "producer_consumer": {"kind": "producer_consumer", "depth": 50, "cross_node": 0.3,
                          "drain": "eager"},
    "request_response": {"kind": "request_response", "threads": 6, "irq_free": 0.8,
                         "drain": "eager"},
    "block_io": {"kind": "block_io", "depth": 20, "completion_remote": True,
                 "drain": "eager"},
    # held at the declared occupancy (workloads.hold_levels)
    "pc_held": {"kind": "producer_consumer", "depth": 50, "cross_node": 0.3,
                "drain": "hold"},
    "local_burst_held": {"kind": "local", "live": 150, "burst": 70, "drain": "hold"},
}


def _cfg(profile, topo, wl, size=256, **kw):
    """A workload table without ``drain`` frees eagerly: the properties below were stated
    for freers that free whatever is pending."""
    if isinstance(wl, dict):
        wl = {"drain": "eager", **wl}
    prof = profiles.SLAB_PROFILES[profile]
    return sd.config_from(sd.structure_for(size, topo, prof), prof, topo, wl, **kw)


def _assert_equal(cfg, seed, steps=STEPS):
    w = sd.draws(jax.random.key(seed), steps)
    got = sd.counters_numpy(sd.simulate_draws(w, cfg))
    want = slab_reference.run(w, cfg, check=True)
    assert set(got) == set(want)
    for k in want:
        if k in GAUGES:
            np.testing.assert_array_equal(np.rint(got[k] * steps), np.rint(want[k] * steps),
                                          err_msg=k)
        else:
            np.testing.assert_array_equal(got[k], want[k], err_msg=k)
    return want


@pytest.mark.parametrize("profile", PROFILES)
@pytest.mark.parametrize("wl", list(WORKLOADS))
@pytest.mark.parametrize("topo", ["2node_memless", "4node_2memless", "4mem"])
def test_equal_every_profile_and_workload(profile, wl, topo):
    want = _assert_equal(_cfg(profile, TOPOS[topo], WORKLOADS[wl], reap_interval=37),
                         seed=hash((profile, wl, topo)) & 0xFFFF)
    assert want["allocs"].sum() > 100


def _random_workload(rng, topo):
    kind = rng.choice(["local", "producer_consumer", "request_response", "block_io"])
    if kind == "local":
        return {"kind": kind, "live": int(rng.integers(1, 250)),
                "burst": int(rng.choice([0, 0, rng.integers(1, 200)])),
                "alloc_prob": float(rng.uniform(0.3, 0.7))}
    if kind == "producer_consumer":
        return {"kind": kind, "depth": int(rng.integers(1, 200)),
                "cross_node": float(rng.uniform(0, 1))}
    if kind == "request_response":
        return {"kind": kind, "threads": int(rng.integers(1, 64)),
                "irq_free": float(rng.uniform(0, 1)), "live": int(rng.integers(1, 64)),
                "irq_self_free": float(rng.uniform(0, 0.5))}
    return {"kind": kind, "depth": int(rng.integers(1, 100)),
            "completion_remote": bool(rng.integers(0, 2)),
            "completions": int(rng.choice([1, 1, 2, 4]))}


def random_config(seed: int):
    """A randomised configuration: topology, profile, object size, the numa_mem_id()
    switch, /proc/slabinfo tunables (short arrays and small batches flush and refill
    often), free_limit (small ones make free_block() destroy slabs), reap interval; one
    seed in four holds the declared occupancy (drain = "hold"), the others free eagerly."""
    rng = np.random.default_rng(seed)
    drain = "hold" if seed % 4 == 0 else "eager"
    while True:
        topo = TOPOS[rng.choice(list(TOPOS))]
        try:
            wl = workloads.build(**_random_workload(rng, topo), topology=topo, drain=drain)
            break
        except workloads.WorkloadError:
            continue
    prof = profiles.SLAB_PROFILES[rng.choice(PROFILES)]
    size = int(rng.choice([32, 64, 192, 256, 512, 1024, 2048, 4096, 8192]))
    st = sd.structure_for(size, topo, prof)
    kw = {}
    if rng.random() < 0.5:
        kw["limit"] = int(rng.integers(1, 130))
        kw["batchcount"] = int(rng.integers(1, kw["limit"] + 1))
        kw["shared"] = int(rng.integers(0, 9))
    if rng.random() < 0.5:
        kw["free_limit"] = [int(x) for x in rng.integers(0, 3 * st.objs_per_slab + 1, size=4)]
    if rng.random() < 0.5:
        kw["memoryless_fallback"] = bool(rng.integers(0, 2))
    kw["reap_interval"] = int(rng.choice([0, 1, 2, 5, 37]))
    return sd.config_from(st, prof, topo, wl, **kw)


@pytest.mark.parametrize("seed", range(48))
def test_equal_random_configs(seed):
    _assert_equal(random_config(seed), seed=1000 + seed)


def test_batch_mixes_configs_and_equals_the_reference():
    """One compiled batch over configurations of different profiles, topologies, sizes and
    workloads; each row equals the reference on the words its key draws; vmapping the
    single-configuration simulate gives the same counters."""
    cfgs = [random_config(100 + s) for s in range(6)]
    keys = jax.random.split(jax.random.key(5), len(cfgs))
    got = sd.counters_numpy(sd.simulate_batch(keys, sd.stack_configs(cfgs), 120))
    for b, cfg in enumerate(cfgs):
        want = slab_reference.run(sd.draws(keys[b], 120), cfg)
        for k in sd.COUNTER_FIELDS + ("list_lock_node", "outstanding"):
            np.testing.assert_array_equal(got[k][b], want[k], err_msg=k)
    vm = jax.vmap(lambda k, c: sd.simulate(k, c, 120))(keys, sd.stack_configs(cfgs))
    for k, v in sd.counters_numpy(vm).items():
        np.testing.assert_array_equal(v, got[k], err_msg=k)
    seeds = jax.vmap(sd.seed_of)(keys)
    by_seed = sd.counters_numpy(sd.simulate_batch(seeds, sd.stack_configs(cfgs), 120))
    np.testing.assert_array_equal(by_seed["list_lock"], got["list_lock"])


def _run(cfg, steps, seed=0):
    return sd.counters_numpy(sd.simulate(jax.random.key(seed), cfg, steps))


def test_local_burst_below_limit_takes_no_lock_after_warm_up():
    """Bursts of ``live`` allocations then ``live`` frees, live + batchcount <= limit.  A
    CPU's pool (array plus objects out) grows only by refills, which happen only on an
    empty array, so it stops refilling once the pool holds ``live`` objects, and it never
    flushes (the array never holds more than the pool).  kmalloc-256 on 6.1: num 16 (the
    freelist in an object), so each warm-up refill finds no free object on the node and
    grows one slab, taking all 16 objects (cache_grow_begin(), alloc_block() of up to 16
    or batchcount): ceil(40 / 16) = 3 refills, one list_lock each (cache_grow_end()), and
    none after."""
    topo = TOPOS["1node16"]
    cfg = _cfg("slab-v6.1", topo, {"kind": "local", "live": 40, "burst": 40}, size=256)
    assert (int(cfg.limit), int(cfg.batchcount), int(cfg.objs_per_slab)) == (120, 60, 16)
    early, late = _run(cfg, 200), _run(cfg, 3000)
    active = np.asarray(cfg.workload.active) > 0
    assert (early["list_lock"][active] == 3).all()
    assert (early["slab_alloc"][active] == 3).all()
    np.testing.assert_array_equal(late["list_lock"], early["list_lock"])
    assert late["free_slow"].sum() == 0
    assert late["alloc_fast"].sum() == late["allocs"].sum() - 3 * active.sum()


@pytest.mark.parametrize("topo,where", [("1cpu", "flush_slabs"), ("2node", "flush_shared")])
def test_burst_of_frees_flushes_whole_batches(topo, where):
    """One burst of F = limit + batchcount allocations, then F frees.  kmalloc-256 on 6.1
    has num 16 <= BATCHREFILL_LIMIT <= batchcount, so every refill of the burst finds no
    free object on the node, grows a slab and takes all its num objects: ceil(F / num)
    refills, a pool of P = num * ceil(F / num) objects, and the frees start on an array of
    a0 = P - F.  A free finding the array full flushes batchcount objects first
    (cache_flusharray()): ceil((a0 + F - limit) / batchcount) flushes, into the shared
    array where there is one (more than one possible CPU), else back to the slabs.  Every
    CPU bursts in step (simulate.bursts_together), so each does exactly this."""
    from slabtune.sweeps.simulate import bursts_together

    t = TOPOS[topo]
    cfg = bursts_together(_cfg("slab-v6.1", t, {"kind": "local", "live": 180, "burst": 180},
                               size=256))
    limit, bc, num = int(cfg.limit), int(cfg.batchcount), int(cfg.objs_per_slab)
    assert num <= sd.BATCHREFILL_LIMIT <= bc
    F = limit + bc
    refills = math.ceil(F / num)
    a0 = num * refills - F
    flushes = math.ceil((a0 + F - limit) / bc)
    assert flushes == 2
    c = _run(cfg, 2 * F)
    active = np.asarray(cfg.workload.active) > 0
    assert (c["allocs"][active] == F).all() and (c["frees"][active] == F).all()
    assert (c["alloc_slow"][active] == refills).all()
    assert (c[where][active] == flushes).all()
    assert (c["free_slow"][active] == flushes).all()
    other = "flush_shared" if where == "flush_slabs" else "flush_slabs"
    assert c[other].sum() == 0


def test_remote_frees_go_through_alien_caches():
    """Every message crosses nodes (producer_consumer, cross_node 1, two memory nodes):
    each free is an alien free under the alien lock; an alien array of 12 is drained to
    its node (that node's list_lock, remote) when a free finds it full, so a pair (source
    node, object's node) that took p frees flushed max(p - 1, 0) // 12 times; the
    receivers' only remote lock acquisitions are those drains."""
    topo = TOPOS["2node"]
    cfg = _cfg("slab-v3.1", topo, {"kind": "producer_consumer", "depth": 30,
                                   "cross_node": 1.0}, size=256)
    assert int(cfg.alien_limit) == 12
    c = _run(cfg, 2000)
    recv = np.arange(sd.R) >= sd.R // 2
    assert c["remote_free"].sum() == c["frees"].sum() > 0
    assert (c["alien_lock"] == c["remote_free"]).all()
    assert c["free_fast"].sum() == 0
    local = np.asarray(sd.derived(cfg)["local"])
    flushes = 0
    for src in range(sd.N):
        p = int(c["remote_free"][recv & (local == src)].sum())
        flushes += max(p - 1, 0) // 12
    assert c["alien_flush"].sum() == flushes > 0
    np.testing.assert_array_equal(c["list_lock_remote"][recv], c["alien_flush"][recv])


def test_reap_drains_alien_arrays_every_step():
    """With cache_reap() after every step, each alien array is emptied before the next
    step adds at most one object per rep to it: none ever fills (no alien_flush), and
    every reap_alien took one remote list_lock."""
    cfg = _cfg("slab-v6.1", TOPOS["2node"], {"kind": "producer_consumer", "depth": 30,
                                             "cross_node": 1.0}, reap_interval=1)
    c = _run(cfg, 1000)
    assert c["alien_flush"].sum() == 0 and c["reap_alien"].sum() > 0
    assert c["list_lock_remote"].sum() == c["reap_alien"].sum()
    assert c["alien_lock"].sum() == c["remote_free"].sum() + c["reap_alien"].sum()


def test_memoryless_without_numa_mem_id_never_hits_the_array():
    """Every CPU on a memoryless node, no numa_mem_id() (slab-v2.6.33): the arrays only
    take numa_node_id()'s objects, which have no memory, so every allocation is a slow
    path through fallback_alloc() (old kernels: four locks on the CPU's own node, one on
    the memory node when it has free objects) and every free an alien free."""
    cfg = _cfg("slab-v2.6.33", TOPOS["all_memless"], {"kind": "local", "live": 40})
    c = _run(cfg, 1500)
    assert c["alloc_fast"].sum() == 0
    np.testing.assert_array_equal(c["alloc_slow"], c["allocs"])
    np.testing.assert_array_equal(c["alloc_fallback"], c["allocs"])
    np.testing.assert_array_equal(c["remote_free"], c["frees"])
    assert c["array_objects_held"].sum() == 0
    # 4 own-node locks per allocation, 1 or 3 on the memory node (a grow)
    own = 4 * c["allocs"]
    np.testing.assert_array_equal(c["list_lock"] - c["list_lock_remote"], own)


def test_numa_mem_id_gives_a_normal_machines_hit_rate():
    """With numa_mem_id() (slab-v3.1) the memoryless CPUs' arrays hold their memory node's
    objects: the same CPUs and workload on that memory node itself give the same counters
    (same free_limit given to both), except that every list_lock is now remote."""
    wl = {"kind": "local", "live": 40}
    memless = _cfg("slab-v3.1", TOPOS["all_memless"], wl, free_limit=400)
    normal_topo = Topology.uniform(16, 1)
    normal = _cfg("slab-v3.1", normal_topo, wl, free_limit=400)
    a, b = _run(memless, 1500), _run(normal, 1500)
    for k in ("allocs", "alloc_fast", "alloc_slow", "free_fast", "list_lock", "slab_alloc",
              "slab_free"):
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)
    assert a["alloc_fast"].sum() > 0.9 * a["allocs"].sum()
    np.testing.assert_array_equal(a["list_lock_remote"], a["list_lock"])
    assert b["list_lock_remote"].sum() == 0


def _per_op(c, cfg, name):
    w = np.asarray(cfg.rep_weight, np.float64)
    return float((w * c[name]).sum() / (w * c["ops"]).sum())


@pytest.mark.parametrize("profile", PROFILES)
def test_memoryless_penalty_grows_with_memoryless_cpus(profile):
    """4 nodes of 8 CPUs, k of them memoryless (k = 0..3): without numa_mem_id() the
    machine's list_lock acquisitions and slow paths per op rise with k; with it they stay
    at the normal machine's level; at k = 0 both are the same run."""
    pen_lock, pen_slow = [], []
    for k in range(4):
        topo = Topology.uniform(32, 4, memoryless_nodes=tuple(range(1, 1 + k)))
        wl = {"kind": "local", "live": 40}
        off = _cfg(profile, topo, wl, memoryless_fallback=False)
        on = _cfg(profile, topo, wl, memoryless_fallback=True)
        a, b = _run(off, 1500), _run(on, 1500)
        if k == 0:
            for f in sd.COUNTER_FIELDS:
                np.testing.assert_array_equal(a[f], b[f], err_msg=f)
        pen_lock.append(_per_op(a, off, "list_lock") - _per_op(b, on, "list_lock"))
        pen_slow.append(_per_op(a, off, "alloc_slow") - _per_op(b, on, "alloc_slow"))
        assert _per_op(b, on, "alloc_fast") > 0.45     # about half the ops are allocations
    assert pen_lock[0] == pen_slow[0] == 0.0
    assert all(x < y for x, y in zip(pen_lock, pen_lock[1:])), pen_lock
    assert all(x < y for x, y in zip(pen_slow, pen_slow[1:])), pen_slow


def test_free_limit_returns_empty_slabs():
    """free_block() keeps at most free_limit free objects (plus the partly free slab):
    a burst workload freeing far more than it keeps gives slabs back, and with free_limit
    0 every slab that empties goes."""
    wl = {"kind": "local", "live": 300, "burst": 300}
    kept = _run(_cfg("slab-v6.1", TOPOS["1cpu"], wl), 3000)
    tight = _run(_cfg("slab-v6.1", TOPOS["1cpu"], wl, free_limit=0), 3000)
    assert tight["slab_free"].sum() > kept["slab_free"].sum()
    assert tight["empty_slabs_kept"].sum() == 0
    assert tight["slabs_total"].sum() < kept["slabs_total"].sum()


def test_metrics_price_slab_counters_through_the_slub_view():
    """slub_view() hands SLAB counters to model/metrics.compute unchanged: its fast-path
    fraction is the weighted array hit rate, its list_lock and slab rates the counters',
    and the arrays' objects show as parked (sheaf) bytes."""
    from importlib import resources

    from slabtune.model import cost, metrics

    text = resources.files("slabtune.model").joinpath("cost_default.toml").read_text()
    table, _ = cost.parse_cost_toml(text, "cost_default.toml")

    cfg = _cfg("slab-v6.1", TOPOS["2node_memless"], WORKLOADS["producer_consumer"],
               reap_interval=37)
    c = sd.simulate(jax.random.key(2), cfg, 600)
    cnt, scfg = sd.slub_view(c, cfg)
    m = metrics.compute(cnt, scfg, table, pcp_max=3, object_size=256,
                        steps=600)
    w = np.asarray(cfg.rep_weight, np.float64)
    hit = (w * np.asarray(c.alloc_fast)).sum() / (w * np.asarray(c.allocs)).sum()
    assert float(m.alloc_fastpath_frac) == pytest.approx(hit, rel=1e-5)
    kop = 1000 * (w * np.asarray(c.list_lock)).sum() / (w * np.asarray(c.ops)).sum()
    assert float(m.list_lock_per_kop) == pytest.approx(kop, rel=1e-5)
    assert float(m.sheaf_bytes) > 0 and float(m.ns_per_op) > 0


def test_bad_tunables_are_one_line_errors():
    with pytest.raises(SlabtuneError, match="batchcount"):
        _cfg("slab-v6.1", TOPOS["2node"], WORKLOADS["local"], limit=10, batchcount=11)
    with pytest.raises(SlabtuneError, match="reap_interval"):
        _cfg("slab-v6.1", TOPOS["2node"], WORKLOADS["local"], reap_interval=-1)
    with pytest.raises(SlabtuneError, match="shared"):
        _cfg("slab-v6.1", TOPOS["2node"], WORKLOADS["local"], shared=-2)


def test_alien_array_lines_follow_its_layout():
    """An alien array is 24 header bytes (lock, avail, limit, batchcount, touched) and
    8-byte entries in one line-aligned kmalloc object: entries 0-4 share the first line
    with the lock and avail, entry i >= 5 (byte 24 + 8 i >= 64) is on the second.  Over
    the 12 pushes that fill the array, 7 touch both lines: 1 + 7/12 on average."""
    from slabtune.model import slab

    assert slab.alien_section_lines(12) == pytest.approx(1 + 7 / 12)
    assert slab.alien_section_lines(5) == 1.0 and slab.alien_section_lines(1) == 1.0
    assert slab.alien_section_lines(6) == pytest.approx(1 + 1 / 6)
    assert slab.alien_section_lines(0) == 0.0
    np.testing.assert_allclose(slab.alien_section_lines(np.array([0, 1, 12])),
                               [0.0, 1.0, 1 + 7 / 12])


def _slab_counters(**fields):
    """SLAB counters of a hand-built run: zeros but ``fields``."""
    z = {f: np.zeros(sd.R, np.int32) for f in sd.COUNTER_FIELDS}
    z.update(list_lock_node=np.zeros(sd.N, np.int32),
             outstanding=np.zeros(sd.R, np.int32))
    z.update({g: np.zeros(sd.R, np.float32) for g in sd.REP_GAUGES})
    z.update({g: np.zeros(sd.N, np.float32) for g in sd.NODE_GAUGES})
    z.update(fields)
    return sd.SlabCounters(**z)


def test_an_alien_free_is_a_push_under_the_alien_lock_and_moves_no_remote_line():
    """cache_free_alien() (3.1; 6.1 __cache_free_alien()): the freeing CPU takes its own
    node's alien lock, pushes the pointer (``ac->entry[ac->avail++] = objp``) and unlocks;
    it writes neither the object nor its slab, so no cross-node line moves until the
    array is drained under the object's node's list_lock.  Hand-built: two CPUs of node 0
    (4 CPUs on 2 nodes), 1000 ops each, 200 of them alien frees, both on node 0's alien
    lock for node 1: an acquisition holds it for one push (free_fast_ns) and moves the
    array's 1 + 7/12 lines (a node-local transfer) when the previous holder was the other
    CPU, half the time; the remote frees add no line_remote_ns to the base time, where
    SLUB's view (the same counts, a SLUB config) pays one per remote free."""
    from importlib import resources

    from slabtune.model import cost as cost_model
    from slabtune.model import dynamics, metrics, slab

    text = resources.files("slabtune.model").joinpath("cost_default.toml").read_text()
    table, _ = cost_model.parse_cost_toml(text, "cost_default.toml")
    cfg = _cfg("slab-v3.1", Topology.uniform(4, 2), {"kind": "local", "live": 40})
    assert int(cfg.alien_limit) == 12
    assert list(np.asarray(cfg.rep_node)[:2]) == [0, 0]
    two = np.array([1000, 1000] + [0] * (sd.R - 2), np.int32)
    remote = np.array([200, 200] + [0] * (sd.R - 2), np.int32)
    c = _slab_counters(ops=two, allocs=two // 2, frees=two // 2, free_slow=remote,
                       remote_free=remote, alien_lock=remote)
    cnt, scfg = sd.slub_view(c, cfg)
    assert float(scfg.remote_free_lines) == 0.0
    assert float(scfg.alien_lock_lines) == pytest.approx(slab.alien_section_lines(12))
    acq, line, hold, _ = metrics.lock_classes(cnt, scfg, 3, table)
    n = sd.N
    acq, line, hold = np.asarray(acq), np.asarray(line), np.asarray(hold)
    assert acq[0, n] == pytest.approx(0.2) and acq[1, n] == pytest.approx(0.2)
    assert hold[n] == pytest.approx(float(table.free_fast_ns))
    want = (1 + 7 / 12) * 0.5 * float(table.line_local_ns)
    assert line[0, n] == pytest.approx(want, rel=1e-5)
    assert line[1, n] == pytest.approx(want, rel=1e-5)
    rates = metrics.op_rates(cnt, scfg.sheaf_capacity, scfg.remote_free_lines)
    assert np.asarray(rates.remote_free)[:2].tolist() == [0.0, 0.0]
    # the same counts as SLUB events: a barn section, and a remote line per remote free
    slub_cfg = scfg._replace(remote_free_lines=dynamics.SimConfig._field_defaults[
        "remote_free_lines"], alien_lock_lines=dynamics.SimConfig._field_defaults[
        "alien_lock_lines"])
    _, line_b, hold_b, _ = metrics.lock_classes(cnt, slub_cfg, 3, table)
    assert float(np.asarray(hold_b)[n]) == pytest.approx(float(table.barn_lock_hold_ns))
    assert float(np.asarray(line_b)[0, n]) == pytest.approx(
        float(table.barn_lock_lines) * 0.5 * float(table.line_local_ns), rel=1e-5)
    base = [np.asarray(cost_model.base_ns_per_op(
        metrics.op_rates(cnt, k.sheaf_capacity, k.remote_free_lines), k.order,
        k.objs_per_slab, 3, table))[0] for k in (slub_cfg, scfg)]
    assert base[0] - base[1] == pytest.approx(0.2 * float(table.line_remote_ns), rel=1e-5)


def test_a_drain_under_the_alien_lock_lengthens_its_section_not_the_holders_time():
    """__drain_alien_cache() runs with ``alien->lock`` held (cache_free_alien() on a full
    array, reap_alien()) and takes the object's node's list_lock inside, so the alien
    section of a CPU that drains is longer by that list_lock's service, once per drain.
    Hand-built: two CPUs of node 0 (4 CPUs on 2 nodes), 1000 ops each, 200 alien frees,
    20 drains (alien_flush), each on node 1's list_lock, which only these two take.  A
    list_lock section there: hold 50 + 3 lines x 150 ns x 1/2 (the other CPU held it last
    half the time) = 275 ns; 0.1 drains per alien section: 27.5 ns more per section, 5.5
    ns per op, which the holder already pays through its list_lock acquisitions, so
    without queueing its time per op is the same as with no nested drain."""
    from importlib import resources

    from slabtune.model import cost as cost_model
    from slabtune.model import metrics

    text = resources.files("slabtune.model").joinpath("cost_default.toml").read_text()
    table, _ = cost_model.parse_cost_toml(text, "cost_default.toml")
    assert (float(table.list_lock_hold_ns), float(table.list_lock_lines),
            float(table.line_remote_ns)) == (50.0, 3.0, 150.0)
    cfg = _cfg("slab-v3.1", Topology.uniform(4, 2), {"kind": "local", "live": 40})
    two = np.array([1000, 1000] + [0] * (sd.R - 2), np.int32)
    alien = np.array([200, 200] + [0] * (sd.R - 2), np.int32)
    drains = np.array([20, 20] + [0] * (sd.R - 2), np.int32)
    c = _slab_counters(ops=two, allocs=two // 2, frees=two // 2, free_slow=alien,
                       remote_free=alien, alien_lock=alien, alien_flush=drains,
                       list_lock=drains, list_lock_remote=drains,
                       list_lock_node=np.array([0, 40] + [0] * (sd.N - 2), np.int32))
    cnt, scfg = sd.slub_view(c, cfg)
    np.testing.assert_allclose(np.asarray(scfg.alien_drains)[:2], [0.1, 0.1])
    acq, line, hold, mult, nested = metrics.lock_sections(cnt, scfg, 3, table)
    n = sd.N
    acq, line, nested = np.asarray(acq), np.asarray(line), np.asarray(nested)
    assert acq[0, 1] == pytest.approx(0.02)
    assert line[0, 1] == pytest.approx(225.0, rel=1e-5)
    push = (1 + 7 / 12) * 0.5 * float(table.line_local_ns)
    assert line[0, n] == pytest.approx(push + 27.5, rel=1e-5)
    assert nested[:2] == pytest.approx([5.5, 5.5], rel=1e-5)
    # no queueing: the holder's time per op is the same with or without the nested drain
    flat = scfg._replace(alien_drains=np.float32(0.0))
    t = []
    for k in (scfg, flat):
        a, ln, h, m, nst = metrics.lock_sections(cnt, k, 3, table)
        base = np.full(sd.R, 100.0, np.float32) - np.asarray(nst)
        t.append(np.asarray(cost_model.solve(base, a, h, ln, k.rep_weight, m, 0.0).t)[:2])
    np.testing.assert_allclose(t[0], t[1], rtol=1e-5)


def test_slab_moves_its_batches_under_the_list_lock():
    """cache_alloc_refill() and cache_flusharray() move their batch with the node's
    list_lock held (transfer_objects() or the slab loop / free_block()), where SLUB moves a
    sheaf's objects outside it: each SLAB list_lock section is longer by array_object_ns
    per object it moves.  Hand-built: two CPUs of node 0, 1000 ops each, 50 local list_lock
    acquisitions moving 600 objects: 12 objects, 12 x 2 ns more per section, 1.2 ns per op
    that the holder already pays outside the lock (so it comes off its base time); a SLUB
    config with the same counts gets none of it."""
    from importlib import resources

    from slabtune.model import cost as cost_model
    from slabtune.model import dynamics, metrics

    text = resources.files("slabtune.model").joinpath("cost_default.toml").read_text()
    table, _ = cost_model.parse_cost_toml(text, "cost_default.toml")
    assert float(table.array_object_ns) == 2.0
    cfg = _cfg("slab-v3.1", Topology.uniform(4, 2), {"kind": "local", "live": 40})
    two = np.array([1000, 1000] + [0] * (sd.R - 2), np.int32)
    locks = np.array([50, 50] + [0] * (sd.R - 2), np.int32)
    c = _slab_counters(ops=two, allocs=two // 2, frees=two // 2, list_lock=locks,
                       objects_moved=12 * locks,
                       list_lock_node=np.array([100] + [0] * (sd.N - 1), np.int32))
    cnt, scfg = sd.slub_view(c, cfg)
    _, line, _, _, nested = metrics.lock_sections(cnt, scfg, 3, table)
    slub = scfg._replace(objects_under_list_lock=dynamics.SimConfig._field_defaults[
        "objects_under_list_lock"])
    _, line_s, _, _, nested_s = metrics.lock_sections(cnt, slub, 3, table)
    line, line_s = np.asarray(line), np.asarray(line_s)
    assert line[0, 0] - line_s[0, 0] == pytest.approx(24.0, rel=1e-5)
    assert np.asarray(nested)[:2] == pytest.approx([1.2, 1.2], rel=1e-5)
    assert np.asarray(nested_s)[:2].tolist() == [0.0, 0.0]

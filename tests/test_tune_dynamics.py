"""The opt-in ``dynamics`` objective set: tune studies whose batches run through the dynamics
model (model/dynamics.py -> model/metrics.py) instead of the structural proxy."""

from __future__ import annotations

import functools

import jax
import numpy as np
import optuna
import pytest

from slabtune.errors import SlabtuneError
from slabtune.model import cost as cost_model
from slabtune.model import dynamics, metrics, policy
from slabtune.sweeps import simconfig
from slabtune.tuner import objectives
from slabtune.tuner import study as studies

TRIALS = 48


@functools.lru_cache(maxsize=1)
def _spec():
    return studies.load_spec("tune_dynamics")


@functools.lru_cache(maxsize=1)
def _study():
    spec = _spec()
    runner, _url = studies.create_or_resume(spec, "dyn-test", "memory:")
    runner.run(TRIALS, 16)
    return runner


@pytest.mark.slow
def test_dynamics_study_runs_and_stores_per_topology_objectives():
    runner = _study()
    study = runner.study
    assert study.user_attrs["slabtune_objectives"]["set"] == "dynamics"
    done = study.get_trials(states=(optuna.trial.TrialState.COMPLETE,))
    failed = study.get_trials(states=(optuna.trial.TrialState.FAIL,))
    assert len(done) + len(failed) == TRIALS and len(done) >= TRIALS // 2
    # a failed trial is one whose points did not reach steady state, and says where
    for t in failed:
        assert t.user_attrs[studies.ATTR_NOT_STEADY].startswith("fleet.topology ")
        assert "\n" not in t.user_attrs[studies.ATTR_NOT_STEADY]
    w = np.array([t.weight for t in _spec().fleet.topologies])
    w = w / w.sum()
    names = study.user_attrs[studies.ATTR_TOPOLOGIES]
    assert names == ["laptop-8", "server-64x2", "memoryless-96x2"]
    for t in done:
        topo = t.user_attrs[studies.ATTR_TOPO]
        assert len(topo["memory"]) == len(topo["time"]) == 3
        assert all(np.isfinite(topo["memory"])) and all(x > 0 for x in topo["time"])
        assert t.values[0] == pytest.approx(float(np.dot(w, topo["memory"])))
        assert t.values[1] == pytest.approx(float(np.dot(w, topo["time"])))
    # the policies differ, and the dynamics tell them apart
    assert len({round(t.values[0], 6) for t in done}) > 1


# the mapping of the spec's workloads, spelled out (tuner/objectives.py dynamics_workload):
# network (foreign_free 0.5) -> producer_consumer, depth = 2 * live_per_cpu (senders are half
# the CPUs), cross_node 0.5; filesystem (foreign_free 0) -> local, live = live_per_cpu,
# burst = churn (1.0) * live.
_WORKLOADS = [  # (workload, cache, workload dict, op share within the workload)
    ("network", "kmalloc-256", {"kind": "producer_consumer", "depth": 128, "cross_node": 0.5},
     2.0 / 3.0),
    ("network", "kmalloc-1k", {"kind": "producer_consumer", "depth": 64, "cross_node": 0.5},
     1.0 / 3.0),
    ("filesystem", "dentry", {"kind": "local", "live": 256, "burst": 256}, 1.0),
]


@pytest.mark.slow
def test_baseline_equals_the_default_policy_simulated_directly():
    """The baseline is the default policy's counted window, point by point: the run to the
    end of the window less the run to the end of the warm-up (the lab's arithmetic,
    sweeps/window.py), with each point's run length, warm-up and window, priced by
    metrics.compute over the window's steps."""
    from slabtune.sweeps import dynsim
    from slabtune.sweeps.window import window_counters

    spec = _spec()
    fleet = spec.fleet
    ev = studies.evaluator_for(spec)
    scheds = ev._fn.steady.schedules
    seed = spec.objectives.seed
    prof = policy.profile_arrays(fleet.profile)
    cost = simconfig.load_cost()[0]
    pcp = cost_model.pcp_max_order(fleet.profile.version)
    caches = {c.name: c for c in fleet.caches}
    mem_topo, time_topo = [], []
    i = 0
    for ft in fleet.topologies:
        t = ft.topology
        over = {"network": 0.0, "filesystem": 0.0}
        live = {"network": 0.0, "filesystem": 0.0}
        ns = {"network": 0.0, "filesystem": 0.0}
        for wname, cname, wl, share in _WORKLOADS:
            c = caches[cname]
            st = policy.structure(c.size, t.possible, t.present, t.online, prof, early=c.early,
                              is_kmalloc=c.is_kmalloc, is_bootstrap=c.is_bootstrap,
                              explicit_sheaf=c.explicit_sheaf)
            sc = scheds[i]
            assert sc.window >= spec.objectives.steps
            cfg = dynamics.config_from(st, fleet.profile, t, wl, ops_per_step=sc.ops_per_step)
            one = dynamics.stack_configs([cfg])
            keys = jax.vmap(jax.random.key)(np.array([seed + i], np.uint32))
            early, late = (dynsim.simulate_batch(keys, one, n)
                           for n in (sc.warmup, sc.warmup + sc.window))
            win = jax.tree_util.tree_map(lambda x: np.asarray(x)[0], window_counters(
                early, late, sc.warmup, sc.warmup + sc.window))
            m = metrics.compute(win, cfg, cost, pcp_max=pcp, object_size=c.object_size,
                                steps=sc.window)
            over[wname] += float(m.memory_bytes - m.live_bytes)
            live[wname] += float(m.live_bytes)
            ns[wname] += share * float(m.ns_per_op) / 2.0   # per alloc-or-free op
            i += 1
        mem_topo.append(np.mean([over[w] / live[w] for w in over]))   # equal workload weights
        time_topo.append(np.mean([ns[w] for w in ns]))
    np.testing.assert_allclose(ev.baseline.memory_topo[0], mem_topo, rtol=1e-4)
    np.testing.assert_allclose(ev.baseline.time_topo[0], time_topo, rtol=1e-4)
    # the default policy evaluated as a trial is the baseline
    np.testing.assert_allclose(ev.evaluate([{}]).memory_topo, ev.baseline.memory_topo, rtol=1e-6)


@pytest.mark.slow
def test_batched_evaluation_equals_one_at_a_time():
    ev = studies.evaluator_for(_spec())
    params = [{"slub_min_order": 1, "cpu_partial_256": 8},
              {"slub_max_order": 0, "min_partial_lo": 9, "min_partial_hi": 9},
              {"cpu_partial_small": 0, "cpu_partial_256": 0, "cpu_partial_1k": 0}]
    batch = ev.evaluate(params)
    # float32 throughout: XLA fuses a batch of three and a batch of one differently, and the
    # closed-queue pace is a bisection, so the two round apart by a few ulps (1.04e-6 seen);
    # a batching mistake (a policy's values landing on another's row) is off by far more
    for i, p in enumerate(params):
        one = ev.evaluate([p])
        np.testing.assert_allclose(one.memory_topo[0], batch.memory_topo[i], rtol=1e-5)
        np.testing.assert_allclose(one.time_topo[0], batch.time_topo[i], rtol=1e-5)
    # and the three policies are not the same point
    assert len({round(float(x), 6) for x in batch.memory}) == 3


def test_larger_min_partial_holds_more_memory():
    """Nodes keep min_partial empty slabs on their partial lists instead of returning them to
    the page allocator (discard_slab only once nr_partial >= min_partial, mm/slub.c v6.18),
    so raising it never holds less memory, and more where slabs stay empty on the node
    lists.  With the per-CPU partial lists off every partial slab is on a node list; with
    them on, the spec's filesystem churn keeps its slabs on the per-CPU lists, as the
    kernel does (docs/LAB.md item 7), and its memory does not depend on min_partial.  The
    filesystem CPUs burst apart (workloads.burst_phase_first), so on a node with memory
    one CPU's allocations take back the slabs another's frees empty and few stay empty;
    the memoryless CPUs of memoryless-96x2 take none from a list that holds no more than
    min_partial (get_any_partial()), so there the kept empty slabs add up.  With the live
    sets held (workloads drain = "hold", 2026-11-28) memoryless-96x2's lists keep growing
    over the counted window with the per-CPU partial lists off (not in steady state after
    the retries), and the point is reported instead of used."""
    ev = studies.evaluator_for(_spec())
    off = {k: 0 for k in ("cpu_partial_page", "cpu_partial_1k", "cpu_partial_256",
                          "cpu_partial_small")}
    out = ev.evaluate([{"min_partial_lo": 0, "min_partial_hi": 0, **off},
                       {"min_partial_lo": 10, "min_partial_hi": 10, **off}])
    names = [t.name for t in _spec().fleet.topologies]
    ml = names.index("memoryless-96x2")
    steady = np.isfinite(out.memory_topo).all(axis=0)
    assert steady[:ml].all()
    assert np.all(out.memory_topo[1][steady] >= out.memory_topo[0][steady] * (1 - 1e-6))
    if steady[ml]:
        assert out.memory_topo[1][ml] > 1.02 * out.memory_topo[0][ml]
    else:   # reported, never used: see the docstring
        assert all("fleet.topology memoryless-96x2" in n for n in out.notes)


def test_dynamics_only_fields_are_rejected_for_the_structural_set():
    with pytest.raises(SlabtuneError, match=r"^objectives\.steps: only the dynamics set"):
        objectives.parse_objectives({"set": "structural", "steps": 100})
    with pytest.raises(SlabtuneError, match=r"^objectives\.steps: 0 is outside"):
        objectives.parse_objectives({"set": "dynamics", "steps": 0})


def test_steady_schedule_follows_the_live_set():
    """Run length, warm-up and window of a point from its workload (objectives.
    steady_schedule), worked by hand.  Local on 8 CPUs, live 1024 in bursts of 256: the hold
    cap is 1024 + 128 = 1152 (workloads.hold_levels), a rep allocates half its ops (a = 1/2)
    and frees its own (load 1: theta 1); runs b = 1152 // 32 = 36; fill ceil(1152 / 36) =
    32 steps, one turnover 1152 / (0.5 * 36) = 64 steps: warm-up 96; each half
    max(ceil(64 / 2), ceil(2048 ops / 36)) = 57 steps, rounded up to whole burst cycles
    (2 * ceil(256 / 36) = 16): 64.  producer_consumer on 2 CPUs, depth 4096: cap 4096 + 128
    = 4224, one sender (a = 1) and one receiver that frees all it gets (load 1); b =
    min(4224 // 32, 64) = 64, fill and turnover 66 steps each, halves 33 (2048 ops are 32).
    SLAB's set (one op per step): the local point's fill 1152, turnover 2304, halves 2048
    (a multiple of the 512-step cycle)."""
    from slabtune.model import workloads
    from slabtune.model.topology import Topology

    local, _ = workloads.local(Topology.uniform(8), live=1024, burst=256)
    assert objectives.steady_schedule(local) == (36, 96, 128)
    assert objectives.steady_schedule(local, run_max=1) == (1, 3456, 4096)
    # the spec's [objectives] steps is a floor under the window
    assert objectives.steady_schedule(local, window=10) == (36, 96, 128)
    assert objectives.steady_schedule(local, window=200) == (36, 96, 200)
    pc, _ = workloads.producer_consumer(Topology.uniform(2), depth=4096)
    assert objectives.steady_schedule(pc) == (64, 132, 66)


def _small_fleet_spec(topologies, steps=None, seed=1):
    """A fleet of ``topologies`` ((name, cpus, nodes, weight)) with a network workload
    (foreign frees: producer_consumer) and a filesystem one (local bursts) at live sets a
    test can simulate quickly."""
    import tomli_w

    doc = {"fleet": {"profile": "v6.18",
                     "topology": [{"name": n, "cpus": c, "nodes": k, "weight": w}
                                  for n, c, k, w in topologies],
                     "workload": [
                         {"name": "network", "foreign_free": 0.6, "churn": 0.3,
                          "caches": {"kmalloc-256": {"live_per_cpu": 512, "ops": 2.0},
                                     "skbuff_head_cache": {"live_per_cpu": 256, "ops": 3.0}}},
                         {"name": "filesystem", "foreign_free": 0.0, "churn": 0.2,
                          "caches": {"dentry": {"live_per_cpu": 2048}}}]},
           "search": {"sampler": "nsga2", "seed": seed, "knobs": {
               "slub_max_order": {"low": 0, "high": 3},
               "min_partial_hi": {"low": 0, "high": 10},
               "cpu_partial_small": {"low": 0, "high": 240, "step": 8},
               "cpu_partial_256": {"low": 0, "high": 120, "step": 4}}},
           "objectives": {"set": "dynamics", "seed": 3,
                          **({} if steps is None else {"steps": steps})}}
    return studies.parse_spec(tomli_w.dumps(doc), "small")


@pytest.mark.slow
def test_fleet_with_one_and_two_cpu_vms_of_large_weight_gets_a_front():
    """Issue 32 item 4: a 2-CPU VM of weight 10 (and a 1-CPU one) beside 8- and 64-CPU
    machines.  Before steady state (68ef3c4) the 2-CPU VM's receivers freed every message in
    the step it was sent, so the network caches held no live objects, their overhead was
    memory over 1 byte (24,576-40,960 on that topology against 1-3 elsewhere), and the
    front was one point with every gain 0.  Now every point holds its declared live set
    over the counted window (the check would refuse the spec otherwise), the small VMs'
    per-topology figures sit in the same range as the large machines', and the study has a
    front of several points."""
    spec = _small_fleet_spec([("vm-1", 1, 1, 5.0), ("vm-2", 2, 1, 10.0),
                              ("laptop-8", 8, 1, 1.0), ("server-64x2", 64, 2, 1.0)])
    ev = studies.evaluator_for(spec)
    mem, tim = ev.baseline.memory_topo[0], ev.baseline.time_topo[0]
    assert np.all(np.isfinite(mem)) and np.all(np.isfinite(tim))
    big_mem, big_time = mem[2:], tim[2:]
    for t in (0, 1):     # the VMs: overhead and time within the large machines' range, x3
        assert big_mem.min() / 3 <= mem[t] <= big_mem.max() * 3, (mem, tim)
        assert big_time.min() / 3 <= tim[t] <= big_time.max() * 3, (mem, tim)
    # every point held its declared live set over the window (objectives.OCCUPANCY_TOL)
    d = ev._fn
    live = objectives._point_live(*_baseline_window(d))
    np.testing.assert_allclose(live, d.declared, rtol=objectives.OCCUPANCY_TOL)
    runner, _ = studies.create_or_resume(spec, "vm", "memory:")
    runner.run(96, 32)
    front = runner.study.best_trials
    assert len(front) > 1
    assert len({tuple(round(v, 9) for v in t.values) for t in front}) > 1


def _baseline_window(d):
    """The window counters and configs of the baseline policy's points."""
    from slabtune.tuner.space import baseline_values

    vals = {k: np.array([v], np.int32) for k, v in baseline_values(d.fleet.profile).items()}
    cfg = d.configs(vals)
    keys = jax.vmap(jax.random.key)(d.seeds)
    warm, win = d.steady.plan(1)
    return d.steady(keys, cfg, warm, win).window, cfg


def test_a_point_not_in_steady_state_is_refused_in_one_line(monkeypatch):
    """A schedule too short to hold still (no warm-up, a window of 2 steps: halves of one
    step, filling from empty caches) and no lengthening: the baseline's figures are not
    used; the spec is refused with one line naming the topology, the workload and the
    halves' figures.  Evaluated on its own, such a policy's objectives are NaN (the trial
    fails) with that line in ``notes``."""
    monkeypatch.setattr(objectives, "SETTLE_DOUBLINGS", 0)
    monkeypatch.setattr(objectives, "RETRY_DOUBLINGS", 0)
    monkeypatch.setattr(objectives, "steady_schedule",
                        lambda wl, run_max, window: objectives.Schedule(1, 0, 2))
    spec = _small_fleet_spec([("vm-2", 2, 1, 1.0)])
    with pytest.raises(SlabtuneError) as err:
        objectives.FleetEvaluator(spec.fleet, spec.objectives)
    msg = str(err.value)
    assert "\n" not in msg
    assert msg.startswith("objectives: the baseline policy: fleet.topology vm-2, workload ")
    assert "not in steady state after" in msg and "tolerance 5%" in msg
    fa = objectives.fleet_arrays(spec.fleet)
    d = objectives.DynamicsObjectives(
        spec.fleet, policy.profile_arrays(spec.fleet.profile), fa, simconfig.load_cost()[0],
        cost_model.pcp_max_order(spec.fleet.profile.version), spec.objectives)
    from slabtune.tuner.space import baseline_values

    vals = {k: np.full(2, v, np.int32) for k, v in baseline_values(spec.fleet.profile).items()}
    vals["slub_max_order"] = np.array([3, 1], np.int32)
    out = d(vals)
    assert np.isnan(out.memory).all() and np.isnan(out.time).all()
    assert len(d.notes) == 2 and all(n.startswith("fleet.topology vm-2, workload ")
                                     for n in d.notes)

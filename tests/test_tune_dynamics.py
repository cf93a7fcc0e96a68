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
    assert len(done) == TRIALS
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
# network (foreign_free 0.5) -> producer_consumer, depth = live_per_cpu, cross_node 0.5;
# filesystem (foreign_free 0) -> local, live = live_per_cpu, burst = churn (1.0) * live.
_WORKLOADS = [  # (workload, cache, workload dict, op share within the workload)
    ("network", "kmalloc-256", {"kind": "producer_consumer", "depth": 64, "cross_node": 0.5},
     2.0 / 3.0),
    ("network", "kmalloc-1k", {"kind": "producer_consumer", "depth": 32, "cross_node": 0.5},
     1.0 / 3.0),
    ("filesystem", "dentry", {"kind": "local", "live": 256, "burst": 256}, 1.0),
]


@pytest.mark.slow
def test_baseline_equals_the_default_policy_simulated_directly():
    spec = _spec()
    fleet = spec.fleet
    ev = studies.evaluator_for(spec)
    steps, seed = spec.objectives.steps, spec.objectives.seed
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
            cfg = dynamics.config_from(st, fleet.profile, t, wl)
            cnt = dynamics.simulate(jax.random.key(seed + i), cfg, steps)
            m = metrics.compute(cnt, cfg, cost, pcp_max=pcp, object_size=c.object_size, steps=steps)
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
    min_partial (get_any_partial()), so there the kept empty slabs add up."""
    ev = studies.evaluator_for(_spec())
    off = {k: 0 for k in ("cpu_partial_page", "cpu_partial_1k", "cpu_partial_256",
                          "cpu_partial_small")}
    out = ev.evaluate([{"min_partial_lo": 0, "min_partial_hi": 0, **off},
                       {"min_partial_lo": 10, "min_partial_hi": 10, **off}])
    assert np.all(out.memory_topo[1] >= out.memory_topo[0] * (1 - 1e-6))
    names = [t.name for t in _spec().fleet.topologies]
    ml = names.index("memoryless-96x2")
    assert out.memory_topo[1][ml] > 1.02 * out.memory_topo[0][ml]


def test_dynamics_only_fields_are_rejected_for_the_structural_set():
    with pytest.raises(SlabtuneError, match=r"^objectives\.steps: only the dynamics set"):
        objectives.parse_objectives({"set": "structural", "steps": 100})
    with pytest.raises(SlabtuneError, match=r"^objectives\.steps: 0 is outside"):
        objectives.parse_objectives({"set": "dynamics", "steps": 0})

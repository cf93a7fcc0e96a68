"""The rig cost table of the native validation: no queueing and linear prices under it
(model/cost.py ``rig_cost``), the non-negative fit of its constants (tuner/rigcost.py), and
a real calibration of the native binary on this machine against the real model."""

from __future__ import annotations

import math
import statistics

import numpy as np
import pytest

from slabtune.model import cost
from slabtune.validate import candidates, dispatch, native_tasks, plan, rigcost
from slabtune.validate import spec as validate_spec

# --------------------------------------------------------------------------- the table


def test_rig_table_solves_a_saturated_lock_with_no_wait():
    """64 CPUs each taking a 50 ns lock once per op: with queueing the queue is long,
    under the rig table (queueing = 0) the wait is exactly 0 and t = base + hold."""
    args = dict(base=np.array([10.0]), acq=np.array([[1.0]]), hold=np.array([50.0]),
                line=np.array([[0.0]]), weight=np.array([64.0]), multiplicity=np.array([1.0]))
    server = cost.solve(**args, queueing=1.0)
    assert float(server.wait[0, 0]) > 100.0
    rig = cost.solve(**args, queueing=0.0)
    assert float(rig.wait[0, 0]) == 0.0
    assert float(rig.t[0]) == 60.0


def test_rig_table_is_built_in_code_only():
    t = cost.rig_cost({"alloc_fast_ns": 3.0}, 31.0)
    assert float(t.queueing) == 0.0 and float(t.line_local_ns) == 0.0
    assert float(t.line_remote_ns) == 0.0 and float(t.alloc_fast_ns) == 3.0
    assert float(t.free_fast_ns) == 0.0 and float(t.pcp_batch) == 31.0
    # a cost file keeps queueing on
    with pytest.raises(cost.CostError, match="cost.queueing"):
        cost.parse_cost_toml("[cost]\nqueueing = 0.0\n", base=cost.rig_cost({}, 31.0))
    with pytest.raises(cost.CostError, match="cost.line_remote_ns"):
        cost.rig_cost({"line_remote_ns": 1.0}, 31.0)
    with pytest.raises(cost.CostError, match="cost.alloc_slow_ns"):
        cost.rig_cost({"alloc_slow_ns": -1.0}, 31.0)


def _sims(params_by_topology):
    from slabtune.sweeps import simconfig

    spec = validate_spec.load_spec("validate_quick")
    return [simconfig.parse_doc(native_tasks.native_policy_doc(spec, t, p))
            for t, p in params_by_topology]


def test_model_under_the_rig_table_never_waits_and_is_linear_in_its_constants():
    """The native workload on a memoryless topology with cpu_partial 0 (every partial slab
    through the remote node's list_lock) and on one CPU: under the packaged table the
    list_lock queues; under a rig table the wait and every utilisation are exactly 0 and
    ns per pair is the features (unit tables) times the constants."""
    from slabtune.sweeps import simconfig, simulate

    sims = _sims([("memoryless-4x2", {"cpu_partial": 0, "min_partial": 0}),
                  ("up-1", {"slub_min_order": 0, "slub_max_order": 0}),
                  ("smp-4", {"slub_min_order": 4, "slub_max_order": 4})])
    simulated = simulate.simulate_specs(sims)
    packaged, _ = simconfig.load_cost()
    pk = simulate.metrics_of(sims, *simulated, packaged)
    assert pk[0]["list_lock_wait_ns"] > 0.0
    rng = np.random.default_rng(3)
    theta = {k: float(v) for k, v in zip(cost.RIG_FREE, rng.uniform(1.0, 90.0, len(cost.RIG_FREE)))}
    table = cost.rig_cost(theta, float(packaged.pcp_batch))
    got = simulate.metrics_of(sims, *simulated, table)
    feats = rigcost.features_of(sims, float(packaged.pcp_batch), simulated)
    want = rigcost.predict(feats, theta)
    for row, w in zip(got, want):
        assert row["list_lock_wait_ns"] == 0.0
        # the locks are busy some of the time (rho is their busy fraction) but nobody waits
        assert 0.0 <= row["list_lock_rho"] < 1.0
        assert row["ns_per_op"] == pytest.approx(w, rel=2e-5)
    # the features are what the model's counters say: on one CPU (v6.18) the list_lock is
    # taken only by frees that empty a slab on its own per-CPU partial list (unfrozen
    # since v6.8: the local workload's bursts empty some), two per pair being the
    # acquisitions per op twice; the memoryless topology's too; order 4 goes to the buddy
    # lists, order 0 to the pcp
    names = list(cost.RIG_FREE)
    ll = names.index("list_lock_hold_ns")
    assert sims[1].profile.unfrozen_cpu_partial
    assert feats[1, ll] == pytest.approx(pk[1]["list_lock_per_kop"] / 1000.0 * 2, rel=1e-4)
    assert feats[1, ll] > 0.0 and feats[0, ll] > 0.0
    assert feats[2, names.index("buddy_call_ns")] > 0.0 == feats[2, names.index("pcp_call_ns")]
    assert feats[1, names.index("pcp_call_ns")] > 0.0 == feats[1, names.index("buddy_call_ns")]


# --------------------------------------------------------------------------- the fit


def test_fit_recovers_known_constants_from_synthetic_features():
    rng = np.random.default_rng(0)
    names = ["a", "b", "c", "d", "unused", "twin"]
    x = np.zeros((30, 6))
    x[:, :4] = rng.uniform(0.0, 1.0, (30, 4))
    x[:, 5] = 2.5 * x[:, 2]                      # proportional to c: aliased
    theta = np.array([20.0, 0.0, 45.5, 3.25])
    y = x[:, :4] @ theta
    f = rigcost.fit(x, y, names)
    assert f["constants"]["a"] == pytest.approx(20.0, abs=1e-4)
    assert f["constants"]["b"] == pytest.approx(0.0, abs=1e-4)
    assert f["constants"]["c"] == pytest.approx(45.5, abs=1e-4)
    assert f["constants"]["d"] == pytest.approx(3.25, abs=1e-4)
    assert f["not_identified"] == ["unused"] and f["aliased"] == {"twin": "c"}
    assert f["constants"]["unused"] == 0.0 == f["constants"]["twin"]
    assert f["fitted_constants"] == ["a", "b", "c", "d"] and f["rank"] == 4
    assert f["r2"] == pytest.approx(1.0, abs=1e-12)
    assert f["fitted"] == pytest.approx(list(y), abs=1e-4)
    # noise: the constants come back within a few standard errors, R^2 below 1
    noisy = y + rng.normal(0.0, 0.5, len(y))
    g = rigcost.fit(x, noisy, names)
    for k, v in zip("abcd", theta):
        assert abs(g["constants"][k] - v) < 5 * g["stderr"][k] + 1e-9
    assert 0.9 < g["r2"] < 1.0
    assert g["r2"] == pytest.approx(rigcost.r_squared(g["fitted"], noisy))


def test_fit_takes_the_smallest_table_where_constants_are_not_told_apart():
    """Two columns that always sum to 1 (an alloc's fast and slow shares) beside a third:
    only their difference and the sum of levels are identified; the fit is exact and the
    tie goes to the smallest table."""
    rng = np.random.default_rng(1)
    fast = rng.uniform(0.5, 1.0, 20)
    x = np.column_stack([fast, 1.0 - fast, rng.uniform(0.0, 0.2, 20)])
    y = x @ np.array([30.0, 50.0, 400.0])
    f = rigcost.fit(x, y, ["fast", "slow", "other"])
    assert f["rank"] == 3 and f["r2"] == pytest.approx(1.0, abs=1e-9)
    assert f["constants"]["slow"] - f["constants"]["fast"] == pytest.approx(20.0, abs=1e-3)
    x2 = np.column_stack([x, 1.0 - x[:, 0]])     # a fourth column = the second again
    assert rigcost.fit(x2, y, ["fast", "slow", "other", "same"])["aliased"] == {"same": "slow"}
    assert rigcost.span_residual(x, x[:3]) == pytest.approx(0.0, abs=1e-9)
    assert rigcost.span_residual([[1.0, 1.0, 0.0]], [[1.0, -1.0, 0.0]]) == pytest.approx(1.0)


def test_calibration_policies_cover_every_order_on_every_topology():
    pol = rigcost.calibration_policies(10, 7, ["a", "b"])
    assert len(pol) == 40 and len({(t, tuple(sorted(p.items()))) for t, p in pol}) == 40
    first = pol[:10]
    assert {(t, p["slub_min_order"]) for t, p in first} == {
        (t, o) for t in "ab" for o in rigcost.CAL_ORDERS}
    assert all(p["slub_min_order"] == p["slub_max_order"] for _, p in pol)
    assert pol == rigcost.calibration_policies(10, 7, ["a", "b"])
    # the first two passes pin a one-slab per-CPU partial list, with min_partial at each end
    one_slab = min(v for v in rigcost.CAL_CPU_PARTIAL if v > 0)
    assert all(p["cpu_partial"] == one_slab for _, p in first)
    assert [p["min_partial"] for _, p in first] == (
        [min(rigcost.CAL_MIN_PARTIAL)] * 5 + [max(rigcost.CAL_MIN_PARTIAL)] * 5)
    assert "cpu_partial" not in rigcost.calibration_policies(2, 7, ["a"],
                                                             has_cpu_partial=False)[0][1]


def test_choose_calibration_brings_the_pairs_into_the_span():
    """A pool whose early entries never separate a third event from the first two: a
    pair that has it lies outside their span.  The choice takes the one pool entry that
    brings it in, though it comes last, then the entries that add directions; with the
    pool no larger than n, all of it."""
    pool = [[1.0, 0.0, 0.0], [2.0, 0.0, 0.0], [0.0, 1.0, 0.0], [1.0, 1.0, 0.0],
            [3.0, 1.0, 0.0], [0.0, 0.0, 1.0]]
    pair = [[1.0, 1.0, 1.0]]
    assert rigcost.span_residual(pool[:5], pair) > 0.5
    got = rigcost.choose_calibration(pool, pair, 3, first=1)
    assert got[0] == 0 and 5 in got and len(got) == 3
    assert rigcost.span_residual([pool[j] for j in got], pair) == pytest.approx(0.0, abs=1e-9)
    # the pair spanned by the first entries: the rest adds the most new direction
    assert rigcost.choose_calibration(pool, [[2.0, 0.0, 0.0]], 2, first=1) == [0, 2]
    assert rigcost.choose_calibration(pool, pair, 6) == list(range(6))


def test_rig_fit_needs_two_calibration_runs_and_keeps_the_failed_ones_listed():
    names = list(cost.RIG_FREE)
    one = [0.0] * len(names)
    one[names.index("alloc_fast_ns")] = 1.0
    cal = [{"topology": "t", "params": {"slub_min_order": 0}, "features": one,
            "runs": [50.0, 52.0, 51.0]},
           {"topology": "t", "params": {"slub_min_order": 1}, "features": one, "runs": [],
            "error": "native run: slubsim exited 1"}]
    rig = native_tasks.rig_fit(cal, 31.0, steps=1000, cpu=0)
    assert rig["constants"] is None and rig["error"].startswith("1 of 2 calibration runs")
    assert [c["measured"] for c in rig["calibration"]] == [51.0, None]
    assert rig["calibration"][1]["error"] == "native run: slubsim exited 1"
    cal.append({**cal[0], "runs": [60.0, 62.0, 61.0]})
    rig = native_tasks.rig_fit(cal, 31.0, steps=1000, cpu=0)
    # two runs with the same features: the fit is their mean, R^2 0 (nothing explained)
    assert rig["constants"]["alloc_fast_ns"] == pytest.approx(56.0, abs=1e-3)
    assert rig["r2"] == pytest.approx(0.0, abs=1e-6) and rig["runs"] == 2
    assert rig["calibration"][1]["fitted"] is None
    assert rig["not_identified"] == [n for n in names if n != "alloc_fast_ns"]


# --------------------------------------------------------------------------- real rig

_NATIVE_WHY = plan.native_available()

CAL_SPEC = """
[fleet]
profile = "v6.18"

[[fleet.topology]]
name = "up-1"
cpus = 1

[[fleet.topology]]
name = "smp-2"
cpus = 2

[[fleet.workload]]
name = "w"
[fleet.workload.caches]
"kmalloc-512" = { live_per_cpu = 64, ops = 1.0 }

[validate.native]
cache = "kmalloc-512"
steps = 2000
timing_steps = 50000
timing_repeats = 3
calibration_runs = 14
workload = { kind = "local", live = 64, burst = 32 }
"""


@pytest.mark.slow
@pytest.mark.skipif(_NATIVE_WHY is not None, reason=f"native target unavailable ({_NATIVE_WHY})")
def test_real_calibration_of_the_native_rig():
    """The baseline and one candidate on two topologies, 14 calibration configurations,
    3 interleaved rounds of 50000 steps, on this machine.

    R^2 > 0: the workload's ns per pair spans about 9 ns between slabs of 8 objects
    (a tenth of allocations and three quarters of frees on the slow path) and slabs of 32 or
    more (nearly all fast), while medians of 3 runs scatter by about 1 ns; a table that
    ignored the configuration would give R^2 <= 0.  How much of the variance the table
    explains depends on the machine's noise (0.5 to 0.9 was seen here, 0.50 on a quiet
    clean-clone run), so that figure is printed, not asserted: timing quality is a benchmark
    matter, not a unit test's.

    Per-event constants: in this workload the alloc and free slow path rates move together
    (both fall as objects per slab rise), so the runs do not separate one slow path from the
    other, nor reliably a fast price from a slow one (free_fast_ns above free_slow_ns was
    fitted on one run of three here); their standard errors are reported and no assertion
    is made on a constant alone.  What the runs do pin down is the
    table's price of a configuration: order-0 slabs (8 objects, the most slow paths) are
    measured dearer than slabs of order 2 or more (32+ objects, nearly all fast), by about
    9 ns against a 1 ns scatter on a quiet run (2.7 ns on a loaded one), and the fitted table
    prices them dearer too; the direction is asserted, the size printed."""
    spec = validate_spec.parse_spec(CAL_SPEC, "cal")
    cands = candidates.parse_candidates({"candidate": [
        {"id": "mp", "boot": {"slub_max_order": 1},
         "knobs": {"min_partial_lo": 1, "min_partial_hi": 1, "cpu_partial_256": 8}}]}, "t")
    tasks = [dispatch._task_dict(t, spec, None)
             for t in plan.plan_tasks(candidates.with_baseline(cands), spec, ("native",))]
    model = native_tasks.native_model_task(tasks, spec.text, spec.name)
    for td in tasks:
        td.update(model["pairs"][td["index"]])
    cal = model["calibration"]
    assert len(cal) == 14
    pair_keys = set()
    for td in tasks:
        from slabtune.sweeps import simconfig
        from slabtune.validate import native

        sim = simconfig.parse_doc(td["native"]["doc"])
        pair_keys.add(tuple(rigcost.native_key(td["topology"], native.sim_config_for_spec(sim))))
    assert not pair_keys & {tuple(c["key"]) for c in cal}            # disjoint
    assert len({tuple(c["key"]) for c in cal}) == 14
    assert {c["key"][1] for c in cal} == set(rigcost.CAL_ORDERS)           # every order
    res = native_tasks.run_native_batch(tasks, cal, model["pcp_batch"])
    rig = res["rig"]
    assert rig["error"] is None and rig["runs"] == 14
    k = rig["constants"]
    assert rig["r2"] > 0.0
    assert all(math.isfinite(v) for v in k.values())
    by_order = {}
    for c in rig["calibration"]:
        by_order.setdefault(c["key"][1], []).append(c)
    small = by_order[0]
    large = [c for o in rigcost.CAL_ORDERS if o >= 2 for c in by_order.get(o, [])]
    # the direction only: the size of the gap is machine noise's business (about 9 ns on
    # a quiet run, 2.7 ns on one clean-clone run), printed below, not asserted
    for side in ("measured", "fitted"):
        assert (statistics.mean(c[side] for c in small)
                > statistics.mean(c[side] for c in large)), side
    assert {"sheaf_swap_ns", "barn_lock_hold_ns"} <= set(rig["not_identified"])
    for c in rig["calibration"]:
        assert len(c["runs"]) == 3 and c["measured"] == statistics.median(c["runs"])
    # the rows: native_cost is the rig prediction, the others labelled diagnostics
    for i, rows in res["rows"].items():
        by = {r["field"]: r for r in rows}
        td = next(t for t in tasks if t["index"] == i)
        assert by["native_cost"]["predicted"] == pytest.approx(
            float(rigcost.predict(td["native"]["model"]["rig_features"], k)[0]))
        assert by["native_cost"]["comparable"]
        assert not by["native_cost_packaged"]["comparable"]
        assert not by["native_cost_prior"]["comparable"]
        assert by["native_cost_packaged"]["predicted"] == td["native"]["model"]["ns_per_op"]
        assert len({by[f]["measured"] for f in (
            "native_cost", "native_cost_packaged", "native_cost_prior")}) == 1
    # the pairs' features lie (nearly) in the span of the calibration's: their predictions
    # hardly rest on combinations of constants the calibration leaves open
    assert rig["pairs_outside_span"] < 0.02
    print("order 0 minus order >= 2, measured ns:",
          round(statistics.mean(c["measured"] for c in small)
                - statistics.mean(c["measured"] for c in large), 2))
    print({k: round(v, 2) for k, v in rig["constants"].items()}, "R^2", round(rig["r2"], 3),
          "stderr", {k: round(v, 2) for k, v in rig["stderr"].items()},
          "span", rig["pairs_outside_span"])

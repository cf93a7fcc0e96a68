"""``slabtune tune`` with a SLAB fleet (issue 14 item 4, the tune half): the SLAB search
space (slab_max_order and the /proc/slabinfo tunables), both objective sets checked against
a direct evaluation of the SLAB model for the same policy, export of a SLAB front
(slab_max_order on the command line, tunables as /proc/slabinfo writes), and bad input.
"""

from __future__ import annotations

import contextlib
import io
import json

import numpy as np
import optuna
import pytest
import tomli_w

from slabtune import cli
from slabtune.errors import SlabtuneError
from slabtune.model import profiles, slab
from slabtune.results import export
from slabtune.sweeps import simconfig, simulate
from slabtune.tuner import study as studies

PROFILE = "slab-v6.1"
CPUS = 4
LIVE = 100
SIZE = 256


def _spec(objectives: dict, knobs: dict | None = None, profile: str = PROFILE) -> dict:
    """One 4-CPU machine, one workload on kmalloc-256 that frees its own objects."""
    return {
        "fleet": {"profile": profile,
                  "topology": [{"name": "box", "cpus": CPUS, "weight": 1.0}],
                  "workload": [{"name": "w", "weight": 1.0, "foreign_free": 0.0, "churn": 0.0,
                                "caches": {"kmalloc-256": {"live_per_cpu": LIVE, "ops": 1.0}}}]},
        "search": {"sampler": "nsga2", "seed": 1, "knobs": knobs or {
            "slab_max_order": {"low": 0, "high": 2},
            "limit": {"choices": [4, 16, 54]},
            "batchcount": {"choices": [1, 8, 27]},
            "shared": {"choices": [0, 8]}}},
        "objectives": objectives,
    }


def _runner(tmp_path, doc, name="s"):
    spec = studies.parse_spec(tomli_w.dumps(doc), name)
    runner, _ = studies.create_or_resume(spec, name, f"journal:{tmp_path / (name + '.log')}")
    return runner


def _done(study):
    return [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]


def test_structural_trials_equal_the_slab_structure(tmp_path):
    """Each trial's memory is SLAB's structure for its policy, written out by hand: the
    live objects' share of calculate_slab_order()'s leftover, plus half of what the arrays
    and node hold (4 CPUs x limit, shared x batchcount, free_limit = (1 + 4) * batchcount
    + num; one node, so no alien arrays), over the live bytes.  Policies with batchcount
    above limit (slabinfo_write() refuses them) fail, and only those."""
    runner = _runner(tmp_path, _spec({"set": "structural"}))
    runner.run(24, 24)
    prof = profiles.SLAB_PROFILES[PROFILE]
    facts = slab.known_facts("kmalloc-256", prof)
    n_ok = 0
    for t in runner.study.trials:
        p = t.params
        if p["batchcount"] > p["limit"]:
            assert t.state == optuna.trial.TrialState.FAIL
            continue
        assert t.state == optuna.trial.TrialState.COMPLETE
        st = slab.structure(SIZE, CPUS, (CPUS,), prof, max_order=p["slab_max_order"],
                            facts=facts)
        live = CPUS * LIVE
        free_limit = (1 + CPUS) * p["batchcount"] + st.objs_per_slab
        held = 0.5 * (CPUS * p["limit"] + p["shared"] * p["batchcount"] + free_limit)
        want = (live / st.objs_per_slab * st.left_over + held * SIZE) / (live * SIZE)
        assert t.values[0] == pytest.approx(want, rel=1e-5)
        n_ok += 1
    assert n_ok >= 8
    # a bigger batch refills the array less often under the list_lock: at the same order,
    # limit and shared, time falls as batchcount grows
    by_rest: dict = {}
    for t in _done(runner.study):
        key = (t.params["slab_max_order"], t.params["limit"], t.params["shared"])
        by_rest.setdefault(key, []).append((t.params["batchcount"], t.values[1]))
    pairs = [sorted(v) for v in by_rest.values() if len({b for b, _ in v}) > 1]
    assert pairs
    for v in pairs:
        times = [tm for _, tm in v]
        assert times == sorted(times, reverse=True)


def test_dynamics_trials_equal_slabtune_simulate(tmp_path):
    """A dynamics-set trial's objectives are the SLAB dynamics of its policy as
    ``slabtune simulate`` runs it (same structure, tunables, workload and seed), counted
    over the trial's window as the lab counts it (the run to the window's end less the run
    to the warm-up's, sweeps/window.py), priced by the same metrics over the window's
    steps: memory (memory - live) / live, time ns_per_op / 2."""
    import dataclasses

    from slabtune.sweeps.window import window_counters

    steps, seed = 48, 7
    runner = _runner(tmp_path, _spec({"set": "dynamics", "steps": steps, "seed": seed}))
    runner.run(6, 6)
    warm, win = runner.evaluator._fn.plan
    assert (win >= steps).all()
    done = _done(runner.study)
    assert done
    for t in done:
        i = t.number
        doc = {"topology": {"cpus": CPUS}, "cache": {"name": "kmalloc-256"},
               "policy": {"profile": PROFILE, "params": dict(t.params)},
               "workload": {"kind": "local", "live": LIVE, "burst": 0},
               "run": {"steps": int(win[i]), "seed": seed}}
        spec = simconfig.parse_doc(doc)
        ends = [dataclasses.replace(spec, steps=int(n)) for n in (warm[i], warm[i] + win[i])]
        structs, cfgs, (early, late) = simulate.simulate_specs(ends)
        counters = window_counters(early, late, int(warm[i]), int(warm[i] + win[i]))
        [row] = simulate.metrics_of([spec], structs[1:], cfgs[1:], [counters],
                                    simconfig.load_cost()[0])
        live = row["live_bytes"]
        assert t.values[0] == pytest.approx((row["memory_bytes"] - live) / live, rel=1e-5)
        assert t.values[1] == pytest.approx(row["ns_per_op"] / 2.0, rel=1e-5)


def test_export_of_a_slab_front(tmp_path):
    """slab_max_order is the command line; the tunables are one /proc/slabinfo write per
    fleet cache, as slabinfo_write() parses them ("name limit batchcount shared")."""
    runner = _runner(tmp_path, _spec({"set": "structural"}), "ex")
    runner.run(16, 16)
    t = next(t for t in _done(runner.study) if t.params["slab_max_order"] != 1)
    cand = studies.candidate(runner.study, t.number)
    p = t.params
    assert export.render(cand, "cmdline") == f"slab_max_order={p['slab_max_order']}\n"
    script = export.render(cand, "slabinfo")
    assert script.startswith("#!/bin/sh\n")
    body = [ln for ln in script.splitlines() if not ln.startswith("#")]
    assert body == [f'echo "kmalloc-256 {p["limit"]} {p["batchcount"]} {p["shared"]}" '
                    "> /proc/slabinfo"]
    rep = json.loads(export.render(cand, "json"))
    assert rep["profile"] == PROFILE and rep["slabinfo"] == body
    assert rep["boot_params"] == {"slab_max_order": p["slab_max_order"]}
    assert "export --format slabinfo" in export.render(cand, "tmpfiles")
    # an unset batchcount follows enable_cpucache()'s (limit + 1) / 2 of the set limit
    doc = _spec({"set": "structural"}, {"limit": {"choices": [9]}})
    r2 = _runner(tmp_path, doc, "ex2")
    r2.run(1, 1)
    c2 = studies.candidate(r2.study, 0)
    assert c2.boot == {} and dict(c2.slabinfo) == {"kmalloc-256": (9, 5, 8)}


def _cli(tmp_path, doc, *args) -> tuple[int, str]:
    p = tmp_path / "spec.toml"
    p.write_text(tomli_w.dumps(doc))
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = cli.main(["tune", str(p), "--run-dir", str(tmp_path / "run"), *args])
    return rc, err.getvalue()


@pytest.mark.parametrize("knobs,profile,needle", [
    ({"cpu_partial_small": {}}, PROFILE, "cpu_partial_small is a SLUB knob"),
    ({"slub_max_order": {}}, PROFILE, "slub_max_order is a SLUB knob"),
    ({"limit": {}}, "v6.1", "limit is a SLAB knob"),
    ({"slab_max_order": {}}, "slab-v3.1", "has no such boot parameter"),
    ({"limit": {"low": 0, "high": 8}}, PROFILE, "limit.low: 0 is outside the kernel range"),
    ({"shared": {"high": 65}}, PROFILE, "shared.high: 65 is outside the kernel range"),
    ({"limit": {"high": 4095}}, PROFILE, "limit.high: 4095 is outside the kernel range"),
])
def test_bad_slab_input_is_one_line_exit_2(tmp_path, knobs, profile, needle):
    rc, err = _cli(tmp_path, _spec({"set": "structural"}, knobs, profile), "--trials", "1")
    assert rc == 2
    assert needle in err and len(err.strip().splitlines()) == 1
    if "knob" in needle or "boot parameter" in needle:    # names the knob and the profile
        assert profile in err and next(iter(knobs)) in err


def test_slab_baseline_is_the_kernel_default():
    """The baseline runs enable_cpucache()'s tunables and slab_max_order 1: its memory is
    the hand formula at limit 120, batchcount 60, shared 8 (kmalloc-256 on 4 CPUs)."""
    spec = studies.parse_spec(tomli_w.dumps(_spec({"set": "structural"})), "b")
    ev = studies.evaluator_for(spec)
    prof = profiles.SLAB_PROFILES[PROFILE]
    st = slab.structure(SIZE, CPUS, (CPUS,), prof, max_order=1,
                        facts=slab.known_facts("kmalloc-256", prof))
    assert (st.limit, st.batchcount, st.shared) == (120, 60, 8)
    live = CPUS * LIVE
    held = 0.5 * (CPUS * 120 + 8 * 60 + (1 + CPUS) * 60 + st.objs_per_slab)
    want = (live / st.objs_per_slab * st.left_over + held * SIZE) / (live * SIZE)
    assert ev.baseline.memory[0] == pytest.approx(want, rel=1e-5)
    direct = ev.evaluate([{"limit": 120, "batchcount": 60, "shared": 8, "slab_max_order": 1}])
    assert np.allclose(direct.memory, ev.baseline.memory)
    assert np.allclose(direct.time, ev.baseline.time)
    with pytest.raises(SlabtuneError, match="unknown knob"):
        spec.space.full_values({"cpu_partial_small": 1})


def test_builtin_slab_spec_parses():
    spec = studies.load_spec("tune_slab_quick")
    assert profiles.is_slab(spec.fleet.profile)
    assert set(spec.space.names) == {"slab_max_order", *slab.SLAB_TUNABLES}
    assert {spec.space.reach_of(n) for n in spec.space.names} == {"boot", "slabinfo"}


def test_numa_memory_counts_alien_arrays_and_every_nodes_lists():
    """On 2 nodes of 4 CPUs each node holds a shared array, one alien array for the other
    node (alloc_alien_cache(): 12 entries) and free objects up to its own free_limit
    ((1 + 4) * batchcount + num): the structural memory is the hand formula."""
    doc = _spec({"set": "structural"})
    doc["fleet"]["topology"] = [{"name": "numa", "cpus": 8, "nodes": 2, "weight": 1.0}]
    spec = studies.parse_spec(tomli_w.dumps(doc), "numa")
    ev = studies.evaluator_for(spec)
    pol = {"slab_max_order": 0, "limit": 16, "batchcount": 8, "shared": 4}
    got = ev.evaluate([pol]).memory[0]
    prof = profiles.SLAB_PROFILES[PROFILE]
    st = slab.structure(SIZE, 8, (4, 4), prof, max_order=0,
                        facts=slab.known_facts("kmalloc-256", prof))
    assert st.alien_limit == slab.ALIEN_LIMIT
    live = 8 * LIVE
    held = 0.5 * (8 * 16 + 2 * 4 * 8 + 2 * 1 * slab.ALIEN_LIMIT
                  + 2 * ((1 + 4) * 8 + st.objs_per_slab))
    want = (live / st.objs_per_slab * st.left_over + held * SIZE) / (live * SIZE)
    assert got == pytest.approx(want, rel=1e-5)


def test_order_grid_of_a_slab_policy():
    """``plot orders`` on a SLAB study: 1536-byte objects leave 1024 of 4096 bytes at
    order 0 (2 objects), more than 1/8, so calculate_slab_order() goes on to order 1
    (5 objects, 512 left, within 1/8) unless slab_max_order is 0."""
    from slabtune.tuner import objectives

    prof = profiles.SLAB_PROFILES[PROFILE]
    g0 = objectives.order_grid(prof, {"slab_max_order": 0}, [4], [1536])
    g3 = objectives.order_grid(prof, {"slab_max_order": 3}, [4], [1536])
    assert (g0["order"], g0["objs_per_slab"]) == ([0], [2])
    assert (g3["order"], g3["objs_per_slab"]) == ([1], [5])


def test_structural_alien_frees_are_priced_as_the_dynamics_set_prices_them():
    """The structural set's SLAB rates price a free of another node's object as
    cache_free_alien() does it (the dynamics set's rule, slab_dynamics.slub_view): no
    cross-node line outside the remote list_lock (remote_free priced 0), and alien lock
    sections of one push (free_fast_ns) on the alien array's 1 + 7/12 lines.  On 2 nodes
    with half the frees foreign (an alien lock per 4 ops), SLUB's barn section (40 ns, 3
    lines) would price each of them dearer; given SLUB's own barn section the barn
    argument is exactly the SLUB path; on one node (no alien arrays) the alien pricing
    changes nothing."""
    import jax.numpy as jnp

    from slabtune.model import metrics
    from slabtune.tuner import fleet as fleet_mod
    from slabtune.tuner import objectives, slab_objectives

    times = {}
    for topo in ({"name": "numa", "cpus": 8, "nodes": 2, "weight": 1.0},
                 {"name": "one", "cpus": 8, "weight": 1.0}):
        doc = _spec({"set": "structural"})
        doc["fleet"]["topology"] = [topo]
        doc["fleet"]["workload"][0]["foreign_free"] = 0.5
        spec = studies.parse_spec(tomli_w.dumps(doc), topo["name"])
        cost = spec.cost()
        fl = spec.fleet
        fa = fleet_mod.fleet_arrays(fl)
        pol = {"slab_max_order": np.array([0]), "limit": np.array([16]),
               "batchcount": np.array([8]), "shared": np.array([4])}
        sa = slab_objectives.structure_arrays(slab_objectives.policy_structures(fl, pol), fl)
        sa.pop("valid")
        reps = [slab_objectives.slab_rates(sa, fa, m, False) for m in (False, True)]
        rates, _, alien_acq = reps[0]
        assert float(jnp.max(rates.remote_free)) == 0.0
        order = jnp.broadcast_to(jnp.asarray(sa["order"])[:, :, None, :], reps[0][1].shape)
        objs = jnp.broadcast_to(jnp.asarray(sa["objs_per_slab"])[:, :, None, :], order.shape)
        lines = slab.alien_section_lines(jnp.asarray(sa["alien_limit"], jnp.float32)
                                         [:, :, None, :])
        barns = (None, (cost.barn_lock_hold_ns, cost.barn_lock_lines),
                 metrics.alien_section(lines, cost))
        times[topo["name"]] = tuple(
            float(objectives.priced_time(reps, order, objs, fa, cost, 3, barn=b)[0, 0])
            for b in barns) + (float(jnp.max(alien_acq)),)
    numa, one = times["numa"], times["one"]
    assert numa[3] == pytest.approx(0.25)          # half the frees, half the ops
    assert numa[0] == numa[1] and numa[2] < numa[0]
    assert one[3] == 0.0 and one[0] == one[1] == one[2]

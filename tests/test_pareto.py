"""Pareto queries over tune studies and sweep-run frames, and ``slabtune pareto``."""

from __future__ import annotations

import json

import optuna
import polars as pl
import pytest
from _tune_helpers import KERNEL_SPEC, assert_clean_error, quick_study, run_cli

from slabtune.results import pareto
from slabtune.tuner import constraints
from slabtune.tuner import study as studies


def test_non_dominated_on_hand_made_points():
    pts = [(1.0, 5.0), (2.0, 3.0), (2.0, 4.0), (3.0, 3.0), (4.0, 1.0), (1.0, 5.0), (5.0, 0.5)]
    keep = pareto.non_dominated(pts)
    assert sorted(keep) == [0, 1, 4, 5, 6]
    for i in keep:
        assert not any(pareto.dominates(pts[j], pts[i]) for j in range(len(pts)))
    for i in set(range(len(pts))) - set(keep):
        assert any(pareto.dominates(pts[j], pts[i]) for j in range(len(pts)))


def test_study_report_matches_optuna_front_and_gains():
    study, _url, _runner = quick_study()
    rep = pareto.study_pareto(study)
    shown = {p["trial"] for p in rep["points"]}
    folded = {t for p in rep["points"] for t in p["same_as"]}
    assert shown | folded == {t.number for t in study.best_trials} and not shown & folded
    assert rep["collapsed"] == len(folded)
    mems = [p["memory"] for p in rep["points"]]
    assert mems == sorted(mems)
    feasible = [t for t in study.get_trials(states=(optuna.trial.TrialState.COMPLETE,))
                if constraints.feasible(t)]
    for p in rep["points"]:
        assert not any(pareto.dominates(t.values, (p["memory"], p["time"])) for t in feasible)
    base = study.user_attrs["slabtune_baseline"]
    p = rep["points"][0]
    t = study.trials[p["trial"]]
    for i, name in enumerate(rep["topologies"]):
        want = 1.0 - t.user_attrs["per_topology"]["memory"][i] / base["memory_topo"][i]
        assert p["gains"][name]["memory"] == pytest.approx(want)


def test_all_points_marks_front_and_feasibility():
    study, _url, _runner = quick_study()
    df = pareto.all_points(study)
    assert df.height == len(study.trials)
    assert set(df.filter(pl.col("pareto"))["trial"]) == {t.number for t in study.best_trials}
    assert df.filter(pl.col("pareto"))["feasible"].all()
    assert not df["feasible"].all()


def test_sweep_pareto_on_a_lazy_frame():
    lf = pl.LazyFrame({"cpus": [1, 2, 3, 4, 5, 6],
                       "memory_overhead": [0.5, 0.1, 0.3, 0.1, 0.2, 0.05],
                       "ns_per_op": [10.0, 40.0, 20.0, 30.0, 35.0, 90.0]})
    got = pareto.sweep_pareto(lf)
    assert got["cpus"].to_list() == [6, 4, 3, 1]
    assert list(zip(got["memory_overhead"], got["ns_per_op"])) == [
        (0.05, 90.0), (0.1, 30.0), (0.3, 20.0), (0.5, 10.0)]


@pytest.mark.slow
def test_cli_pareto_json_and_table():
    study, url, _runner = quick_study()
    proc = run_cli("pareto", "--study", "quick", "--storage", url, "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    base = study.user_attrs["slabtune_baseline"]
    assert out["baseline"] == {"memory": base["memory"], "time": base["time"]}
    rep = studies.front_report(study)
    assert [p["trial"] for p in out["points"]] == [p["trial"] for p in rep["points"]]
    assert out["collapsed"] == rep["collapsed"]
    assert out["reach"] == pareto.reach_counts(rep["points"])
    for p in out["points"]:
        assert set(p) >= {"trial", "memory", "time", "params", "reach", "settings", "same_as"}
        assert p["params"] == study.trials[p["trial"]].params
        # tune_quick searches boot parameters and sysfs values only
        assert p["reach"] in ("boot", "sysfs", "boot+sysfs", "default")
    table = run_cli("pareto", "--study", "quick", "--storage", url)
    assert table.returncode == 0
    assert "gains against the baseline per topology" in table.stdout
    assert "laptop-8" in table.stdout
    head = next(ln for ln in table.stdout.splitlines() if ln.lstrip().startswith("trial"))
    assert head.split()[:4] == ["trial", "reach", "memory", "time"]
    assert "order_objects" not in table.stdout and "min_partial_lo" not in table.stdout


@pytest.mark.slow
def test_cli_pareto_bad_input(tmp_path):
    _study, url, _runner = quick_study()
    assert_clean_error(run_cli("pareto", "--study", "nope", "--storage", url),
                       "no study named 'nope'")
    assert_clean_error(run_cli("pareto", "--run", str(tmp_path / "missing")), "not a directory")
    assert_clean_error(run_cli("pareto", "--study", "x", "--storage", "mysql+nodriver://u@h/d"),
                       "storage")


def test_equal_objectives_collapse_to_the_fewest_changed_knobs():
    """Equal (memory, time) vectors keep one point: the one changing the fewest knobs from
    the kernel's values, then the lowest trial; the others are listed in same_as."""
    pts = [{"trial": 3, "memory": 0.1, "time": 5.0, "changed": 2},
           {"trial": 7, "memory": 0.1, "time": 5.0, "changed": 1},
           {"trial": 9, "memory": 0.1, "time": 5.0, "changed": 1},
           {"trial": 1, "memory": 0.2, "time": 4.0, "changed": 3},
           {"trial": 2, "memory": 0.1, "time": 5.5, "changed": 0}]
    kept, n = pareto.collapse_equal(pts)
    assert n == 2
    assert [(p["trial"], p["same_as"]) for p in kept] == [(7, [3, 9]), (1, []), (2, [])]
    assert pareto.reach_counts([{"reach": "boot"}, {"reach": "kernel"}, {"reach": "boot"}, {}]) \
        == {"boot": 2, "kernel": 1}




@pytest.mark.slow
def test_front_report_collapses_a_dead_kernel_knob_into_the_boot_point():
    """With slub_min_objects=16, calculate_order() never reads order_objects_mul, so the
    policies {16, mul 4} and {16, mul 7} have equal objectives: the report keeps the one
    changing one knob (reach boot), and the table says one point collapsed; a policy that
    changes the coefficient alone needs a rebuilt kernel."""
    spec = studies.parse_spec(KERNEL_SPEC, "kspec")
    runner, _ = studies.create_or_resume(spec, "kfront", "memory:")
    policies = [{"slub_min_objects": 16, "order_objects_mul": 7},
                {"slub_min_objects": 16, "order_objects_mul": 4},
                {"slub_min_objects": 0, "order_objects_mul": 7}]
    runner.record(policies, runner.evaluator.evaluate(policies))
    vals = [tuple(t.values) for t in runner.study.trials]
    assert vals[0] == vals[1]
    rep = studies.front_report(runner.study)
    pts = {p["trial"]: p for p in rep["points"]}
    assert 0 not in pts and pts[1]["same_as"] == [0] and rep["collapsed"] == 1
    assert pts[1]["reach"] == "boot" and pts[1]["settings"] == {"slab_min_objects=": "16"}
    assert rep["front_reach"][0] == "boot"     # mul 7 is inert there
    assert studies.deploy(spec, [policies[2]])[0].reach == "kernel"
    table = pareto.format_table(rep)
    assert "(1 more with the same objectives collapsed into them" in table
    assert "same objectives as: trial 1 = 0" in table

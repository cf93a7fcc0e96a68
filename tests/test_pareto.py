"""Pareto queries over tune studies and sweep-run frames, and ``slabtune pareto``."""

from __future__ import annotations

import json

import optuna
import polars as pl
import pytest
from _tune_helpers import assert_clean_error, quick_study, run_cli

from slabtune.results import pareto


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
    assert {p["trial"] for p in rep["points"]} == {t.number for t in study.best_trials}
    mems = [p["memory"] for p in rep["points"]]
    assert mems == sorted(mems)
    feasible = [t for t in study.get_trials(states=(optuna.trial.TrialState.COMPLETE,))
                if t.constraints["regression_excess"] <= 0]
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
    assert [p["trial"] for p in out["points"]] == \
        [p["trial"] for p in pareto.study_pareto(study)["points"]]
    for p in out["points"]:
        assert set(p) >= {"trial", "memory", "time", "params"}
        assert p["params"] == study.trials[p["trial"]].params
    table = run_cli("pareto", "--study", "quick", "--storage", url)
    assert table.returncode == 0
    assert "gains against the baseline per topology" in table.stdout
    assert "laptop-8" in table.stdout


@pytest.mark.slow
def test_cli_pareto_bad_input(tmp_path):
    _study, url, _runner = quick_study()
    assert_clean_error(run_cli("pareto", "--study", "nope", "--storage", url),
                       "no study named 'nope'")
    assert_clean_error(run_cli("pareto", "--run", str(tmp_path / "missing")), "not a directory")
    assert_clean_error(run_cli("pareto", "--study", "x", "--storage", "mysql+nodriver://u@h/d"),
                       "storage")

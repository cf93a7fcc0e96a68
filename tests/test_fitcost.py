"""The cost-constant fit: deterministic, inside its physical ranges, and a thin CLI."""

from __future__ import annotations

import contextlib
import copy
import io
import json
import math
import tomllib

import numpy as np
import pytest

from slabtune import cli
from slabtune.calibrate import fitcost, reproduce
from slabtune.model import cost, priors, scenarios
from slabtune.sweeps import simconfig

#: Short runs of the two scenarios with headline rows (real simulations, small counters).
SMALL_STEPS = 400
FEW_ITERATIONS = 40


def _short(sc):
    sc = copy.deepcopy(sc)
    for arm in sc["arms"].values():
        arm["run"]["steps"] = SMALL_STEPS
    return sc


@pytest.fixture(scope="module")
def arms():
    return reproduce.simulate_arms((_short(scenarios.SLUB_ORDER_2021),
                                    _short(scenarios.SHEAVES_2026)), work="none")


@pytest.fixture(scope="module")
def fitted(arms):
    return fitcost.fit(arms, iterations=FEW_ITERATIONS)


def test_prior_covers_every_constant_inside_its_range():
    assert set(priors.PRIOR) == set(cost.FIELDS)
    for name, p in priors.PRIOR.items():
        assert p.lo <= p.value <= p.hi, name
    assert len(fitcost.FREE) <= 4 and set(fitcost.FREE) <= set(priors.PRIOR)
    for name in fitcost.FREE:
        assert priors.PRIOR[name].lo < priors.PRIOR[name].hi, name
    # The prior itself is physical.
    assert priors.implausible(priors.prior_values()) == []


def test_same_counters_give_the_same_file(arms, fitted):
    again = fitcost.fit(arms, iterations=FEW_ITERATIONS)
    cmd = "slabtune reproduce --fit-cost x.toml"
    assert fitcost.to_toml(again, cmd) == fitcost.to_toml(fitted, cmd)
    assert again.values == fitted.values


def test_fit_stays_in_range_keeps_orderings_and_improves_on_the_prior(arms, fitted):
    prior = priors.prior_values()
    for name, v in fitted.values.items():
        if name in fitcost.FREE:
            assert priors.PRIOR[name].lo <= v <= priors.PRIOR[name].hi, name
        else:
            assert v == prior[name], name
    assert priors.constraint_violations(fitted.values, fitcost.FREE) == []
    v = fitted.values
    assert v["alloc_fast_ns"] <= v["alloc_slow_ns"] and v["free_fast_ns"] <= v["free_slow_ns"]
    assert v["line_remote_ns"] >= 2 * v["line_local_ns"]
    # Nelder-Mead keeps its best vertex, and the start is the prior: never worse.
    start_rows = reproduce.compare(arms.scenarios,
                                   reproduce.arm_metrics(arms, fitcost.cost_of(prior)))["rows"]
    assert fitted.objective <= fitcost.objective(prior, start_rows) + 1e-9
    # The residuals are the headline rows' log errors under the fitted table.
    heads = [r for r in fitted.rows if r["headline"]]
    assert len(heads) == len(fitted.residuals) == 3
    for r, e in zip(heads, fitted.residuals):
        assert e == pytest.approx(math.log(r["model_ratio"] / r["published_ratio"]))


def test_written_file_loads_and_names_the_fitted_constants(fitted, tmp_path):
    path = tmp_path / "fit.toml"
    path.write_text(fitcost.to_toml(fitted, f"slabtune reproduce --fit-cost {path}"))
    doc = tomllib.loads(path.read_text())
    assert set(doc["cost"]) == set(cost.FIELDS)
    assert tuple(doc["fitted"]) == fitcost.FREE
    assert all("headline ratios" in what for what in doc["fitted"].values())
    params, meta = simconfig.load_cost(path)
    assert set(meta.fitted) == set(fitcost.FREE)
    for name in cost.FIELDS:
        assert float(getattr(params, name)) == pytest.approx(fitted.values[name], rel=1e-6)
    assert f"--fit-cost {path}" in path.read_text().splitlines()[2]
    # The arms' work mode is recorded (the fixture's arms run with none).
    assert fitted.work == "none" and "none (other_ns = 0 on every arm)" in path.read_text()


@pytest.mark.parametrize("change, what", [
    ({"free_fast_ns": 97.4, "free_slow_ns": 84.4}, "free_fast_ns 97.4 > free_slow_ns 84.4"),
    ({"alloc_fast_ns": 90.0, "alloc_slow_ns": 60.0}, "alloc_fast_ns 90 > alloc_slow_ns 60"),
    ({"line_local_ns": 32.4, "line_remote_ns": 38.8}, "line_remote_ns 38.8 < 2 x line_local_ns"),
    ({"barn_lock_hold_ns": 400.0}, "barn_lock_hold_ns 400 outside 20-150"),
    ({"list_lock_lines": 12.0}, "list_lock_lines 12 outside 2-4"),
])
def test_violations_name_the_constant(change, what):
    values = {**priors.prior_values(), **change}
    found = [w for w, size in priors.constraint_violations(values, fitcost.FREE) if size > 0]
    assert any(w.startswith(what) for w in found), found
    assert any(w.startswith(what) for w in priors.implausible(values))


def test_bounded_map_never_leaves_the_range():
    z = np.array([-60.0, -1.0, 0.0, 60.0])
    x = fitcost.to_bounded(z)
    for name, v in zip(fitcost.FREE, x):
        assert priors.PRIOR[name].lo <= v <= priors.PRIOR[name].hi
    inside = np.array([priors.PRIOR[k].value for k in fitcost.FREE])
    np.testing.assert_allclose(fitcost.to_bounded(fitcost.from_bounded(inside)),
                               np.clip(inside, *_one_percent_in()), rtol=1e-9)


def _one_percent_in():
    lo = np.log([priors.PRIOR[k].lo for k in fitcost.FREE])
    hi = np.log([priors.PRIOR[k].hi for k in fitcost.FREE])
    return np.exp(lo + 0.01 * (hi - lo)), np.exp(lo + 0.99 * (hi - lo))


def _cli(argv):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = cli.main(argv)
    return rc, out.getvalue(), err.getvalue()


def test_bad_fit_cost_path_is_one_line(tmp_path):
    rc, _, err = _cli(["reproduce", "--fit-cost", str(tmp_path / "no" / "such" / "x.toml")])
    assert rc == 2 and err.count("\n") == 1
    assert "--fit-cost" in err and str(tmp_path / "no" / "such") in err
    rc, _, err = _cli(["reproduce", "--fit-cost", str(tmp_path)])
    assert rc == 2 and err.count("\n") == 1 and "is a directory" in err


def test_bad_cost_file_is_one_line_and_writes_nothing(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("[cost]\nline_remote_ns = -5.0\n")
    out = tmp_path / "out.toml"
    rc, _, err = _cli(["reproduce", "--cost", str(bad), "--fit-cost", str(out)])
    assert rc == 2 and err.count("\n") == 1 and "cost.line_remote_ns" in err
    assert not out.exists()


@pytest.mark.slow
def test_fit_cost_command_writes_and_reports(tmp_path):
    out = tmp_path / "fit.toml"
    rc, text, _ = _cli(["reproduce", "--work", "derived", "--fit-cost", str(out), "--json"])
    assert rc == 0
    summary = json.loads(text)
    doc = tomllib.loads(out.read_text())
    # The command to remake the file names the work mode, and the rows ran with it.
    assert f"slabtune reproduce --work derived --fit-cost {out}" in out.read_text()
    assert summary["work"] == "derived"
    assert {r["other_ns"] for r in summary["rows"]} == {sc["work"]["other_ns"]
                                                         for sc in scenarios.SCENARIOS}
    assert tuple(doc["fitted"]) == fitcost.FREE == tuple(summary["free"])
    for name in fitcost.FREE:
        assert priors.PRIOR[name].lo <= doc["cost"][name] <= priors.PRIOR[name].hi
    n_rows = len(summary["rows"])
    assert n_rows == sum(len(sc["rows"]) for sc in scenarios.SCENARIOS)
    assert all(0 <= n <= n_rows for n in summary["directions_agree"])
    assert summary["directions_agree"][1] == sum(r["direction_agrees"] for r in summary["rows"])
    heads = [r for r in summary["rows"] if r["headline"]]
    assert len(summary["residuals"]) == len(heads)
    for r, e in zip(heads, summary["residuals"]):
        assert e == pytest.approx(math.log(r["model_ratio"] / r["published_ratio"]), abs=1e-6)


def test_enforce_orderings_moves_a_fitted_constant_onto_a_barely_broken_boundary():
    v = priors.prior_values()
    v.update(line_local_ns=50.06, line_remote_ns=100.0)      # 2 x 50.06 = 100.12 > 100
    assert priors.constraint_violations(v, fitcost.FREE)                       # broken by 0.12%
    out = fitcost.enforce_orderings(v, free=("line_remote_ns",))
    assert out["line_remote_ns"] == 100.2                    # 100.12 rounded up, 4 digits
    assert out["line_local_ns"] == 50.06
    assert not priors.constraint_violations(out, free=("line_remote_ns",))
    # the local constant moves (down) when only it is free
    out = fitcost.enforce_orderings(v, free=("line_local_ns",))
    assert out["line_local_ns"] == 50.0 and out["line_remote_ns"] == 100.0
    # fast above slow by a hair: the slow constant moves up to it
    v = priors.prior_values()
    v.update(free_fast_ns=9.99, free_slow_ns=9.95)
    out = fitcost.enforce_orderings(v, free=("free_slow_ns",))
    assert out["free_slow_ns"] == 9.99


def test_enforce_orderings_leaves_real_breaks_to_be_reported():
    v = priors.prior_values()
    v.update(line_local_ns=60.0, line_remote_ns=100.0)       # 20% short of 2 x local
    out = fitcost.enforce_orderings(v, free=("line_remote_ns",))
    assert out == v
    assert any("line_remote_ns" in b[0] for b in priors.constraint_violations(out, fitcost.FREE))

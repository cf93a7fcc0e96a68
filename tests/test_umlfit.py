"""``slabtune calibrate fit``: per-event cost constants from the real 7.2 allocator's UML
timings in calibrate/data, and the packaged cost table they make."""

from __future__ import annotations

import contextlib
import io
import tomllib

import numpy as np
import pytest

from slabtune import cli
from slabtune.calibrate import umlfit
from slabtune.model import cost, priors
from slabtune.sweeps import simconfig


@pytest.fixture(scope="module")
def result():
    data = umlfit.default_data()
    return umlfit.fit(umlfit.read_rows(data), umlfit.sources(data))


def test_fewer_constants_than_figures_all_one_cpu(result):
    assert len(umlfit.FIT) < len(result.figures)
    assert {f.cpus for f in result.figures} == {1}
    assert {f.side for f in result.figures} == {"alloc", "free"}
    # the two-CPU rows are predicted, not fitted
    assert result.checks and {f.cpus for f in result.checks} == {2}


def test_local_churn_is_all_fast_path(result):
    # One CPU, 32 live objects: SLUB_STATS shows (almost) no barn, refill or slab event,
    # so each call's price is its fast path: the fitted constants are the measured
    # medians within a few percent.
    local = {f.side: f for f in result.figures if f.scenario == "local"}
    assert local["alloc"].events["alloc_fast_ns"] > 0.999
    for side, name in (("alloc", "alloc_fast_ns"), ("free", "free_fast_ns")):
        assert result.values[name] == pytest.approx(local[side].ns, rel=0.05)


def test_the_fit_is_a_least_squares_optimum_of_relative_errors(result):
    # Moving any fitted constant by 5% either way (not below its physical minimum) makes
    # the sum of squared relative errors over the fitted figures no smaller.
    def sse(values):
        return sum(((umlfit.charge(f.events, values) - f.ns) / f.ns) ** 2
                   for f in result.figures)
    best = sse(result.values)
    for name in umlfit.FIT:
        for factor in (0.95, 1.05):
            moved = max(result.values[name] * factor, priors.PRIOR[name].lo)
            assert sse({**result.values, name: moved}) >= best - 1e-6


def test_slab_orders_separate_the_per_object_cost_of_a_new_slab(result):
    # The same bursts on slabs of order 0 to 3 (sysfs order read back per run): objects per
    # slab double with each order while new slabs per pair fall, and the fitted per-object
    # cost of a new slab is a cache miss, not a store to a cached line.
    bursts = sorted((f for f in result.figures if f.scenario.startswith("local_burst_1024")
                     and f.side == "alloc"), key=lambda f: f.events["pcp_call_ns"],
                    reverse=True)
    assert len(bursts) == 4
    objs = [f.events["object_setup_ns"] / f.events["pcp_call_ns"] for f in bursts]
    assert objs == [8.0, 16.0, 32.0, 64.0]
    assert [f.ns for f in bursts] == sorted((f.ns for f in bursts), reverse=True)
    assert 20.0 <= result.values["object_setup_ns"] <= priors.PRIOR["object_setup_ns"].hi


def test_nnls_matches_an_unconstrained_solution_when_that_is_non_negative():
    rng = np.random.default_rng(1)
    a = rng.uniform(0, 1, (8, 3))
    x = np.array([2.0, 0.5, 3.0])
    np.testing.assert_allclose(umlfit.nnls(a, a @ x), x, rtol=1e-9)
    # a negative optimum is clipped to a support without it
    got = umlfit.nnls(a, a @ np.array([2.0, -1.0, 3.0]))
    assert np.all(got >= 0) and got[1] == 0.0


def test_the_packaged_table_is_this_fit(result):
    doc = tomllib.loads(simconfig.default_cost_text())
    for name in umlfit.FIT:
        assert doc["cost"][name] == pytest.approx(result.values[name], rel=1e-4), name
        assert umlfit.sources(umlfit.default_data()) in doc["fitted"][name]
    for name, value in doc["cost"].items():
        if name not in umlfit.FIT:
            assert value == priors.PRIOR[name].value, name
    # the text the command writes parses to the packaged constants
    params, meta = cost.parse_cost_toml(umlfit.to_toml(result, "x"))
    packaged, _ = simconfig.load_cost()
    for a, b in zip(params, packaged):
        assert float(a) == pytest.approx(float(b), rel=1e-4)
    assert set(meta.fitted) == set(umlfit.FIT)


def test_cli_writes_the_cost_file_and_rejects_a_missing_csv(tmp_path):
    out = tmp_path / "c.toml"
    with contextlib.redirect_stdout(io.StringIO()) as buf:
        assert cli.main(["calibrate", "fit", "--out", str(out)]) == 0
    assert f"fitted to {2 * 6} one-CPU figures" in buf.getvalue()
    params, meta = simconfig.load_cost(out)
    assert set(meta.fitted) == set(umlfit.FIT)
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        assert cli.main(["calibrate", "fit", "--data", str(tmp_path / "none.csv")]) == 2
    assert err.getvalue().strip().count("\n") == 0 and "--data" in err.getvalue()

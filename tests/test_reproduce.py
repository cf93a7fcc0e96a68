"""``slabtune reproduce``: every seed scenario, published figures beside the model's."""

from __future__ import annotations

import contextlib
import io
import json
import math

import pytest

from slabtune import cli
from slabtune.model import scenarios as S
from slabtune.tuner import reproduce as RP

KEYS = {"scenario", "metric", "published", "model", "published_ratio", "model_ratio",
        "direction_agrees", "headline"}


@pytest.fixture(scope="module")
def rows():
    """One run of the real CLI (in-process), as the JSON it prints."""
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert cli.main(["reproduce", "--json"]) == 0
    return json.loads(buf.getvalue())


def test_json_shape(rows):
    assert isinstance(rows, list) and rows
    for r in rows:
        assert KEYS <= set(r), set(KEYS) - set(r)
        assert isinstance(r["direction_agrees"], bool) and isinstance(r["headline"], bool)
        assert isinstance(r["model"], float) and math.isfinite(r["model"])
    assert {r["scenario"] for r in rows} == {sc["name"] for sc in S.SCENARIOS}


def test_published_figures_are_the_seeds(rows):
    by = {(r["scenario"], r["label"]): r for r in rows}
    hb = by[("slub-order-nr-cpus-2021", "hackbench time, 224 CPUs, v5.11 vs v5.10")]
    assert (hb["published_base"], hb["published"]) == (3.173, 9.135)
    assert hb["published_ratio"] == pytest.approx(2.879, abs=1e-3)
    sh = [r for r in rows if r["scenario"] == "sheaves-cross-cpu-regression-2026"]
    assert [(r["published_base"], r["published"]) for r in sh] == [(34.0, 13.0), (13.0, 25.0),
                                                                    (24.0, 29.0)]
    net = {r["label"]: (r["published_base"], r["published"]) for r in rows
           if r["scenario"] == "slub-lockless-slowpaths-netperf-2011"}
    assert net["kmalloc-4k alloc fast path %, 160 vs 16 threads"] == (54.4, 31.7)
    assert net["kmalloc-256 free fast path %, 160 vs 16 threads"] == (4.5, 0.1)
    assert len(net) == 6


def test_every_direction_agrees(rows):
    bad = [r["label"] for r in rows if not r["direction_agrees"]]
    assert not bad, bad


def test_headline_ratios_within_a_factor_of_1_5(rows):
    heads = [r for r in rows if r["headline"]]
    assert {r["scenario"] for r in heads} == {"slub-order-nr-cpus-2021",
                                              "sheaves-cross-cpu-regression-2026"}
    assert len(heads) == 3
    for r in heads:
        f = r["model_ratio"] / r["published_ratio"]
        assert 1 / RP.HEADLINE_FACTOR <= f <= RP.HEADLINE_FACTOR, (r["label"], f)
        assert r["within_factor"] is True


def test_one_scale_per_scenario_cancels_in_ratios(rows):
    # The scale is stated, the same for every row of a scenario, and fitted on one arm:
    # the model's value on that arm equals the published one.
    for sc in S.SCENARIOS:
        mine = [r for r in rows if r["scenario"] == sc["name"]]
        scales = {r["scale"] for r in mine}
        assert len(scales) == 1
        if sc["scale"] is None:
            assert scales == {None}
            continue
        (text,) = scales
        arm, value = sc["scale"]["fit_to"]
        assert f"{arm} = {value}" in text
        for r in mine:
            if r["base"] == arm:
                assert r["model_base"] == pytest.approx(value, rel=1e-4)
            assert r["model_ratio"] == pytest.approx(r["model"] / r["model_base"], rel=1e-6)


def test_eight_cpus_regress_far_less_than_224(rows):
    by = {r["label"]: r for r in rows}
    big = by["hackbench time, 224 CPUs, v5.11 vs v5.10"]["model_ratio"]
    small = by["hackbench time, 8 CPUs, v5.11 vs v5.10"]["model_ratio"]
    assert 1.0 < small < big


def test_arm_specs_apply_the_patches():
    dyn = RP.arm_spec(S.SLUB_MIN_PARTIAL_2008["arms"]["dynamic"])
    static = RP.arm_spec(S.SLUB_MIN_PARTIAL_2008["arms"]["static"])
    assert (static.profile.min_partial_divisor, static.profile.min_partial_hi) == (1, 5)
    assert (dyn.profile.min_partial_divisor, dyn.profile.min_partial_hi) == (1, 10)
    cap = RP.arm_spec(S.SHEAVES_2026["arms"]["v7.0+barns+2xcap"])
    assert cap.profile.sheaf_base_capacity == S.DOUBLED_SHEAF_BASE
    assert cap.profile.name == "v7.1+patch"


def test_text_report_lists_configs_and_the_fitted_constants():
    buf = io.StringIO()
    out = {"rows": [], "scenarios": [], "cost": {"source": "x.toml",
                                                  "fitted": {"a_ns": "fig 1",
                                                             "b_ns": "(see a_ns)"}}}
    from slabtune.commands.reproduce import format_report

    text = format_report(out)
    assert "a_ns, b_ns fitted to fig 1" in text
    assert "implausible" not in text
    buf.write(text)
    out["cost"]["implausible"] = ["free_fast_ns 97.4 > free_slow_ns 84.4"]
    assert "physically implausible (slabtune.tuner.fitcost.PRIOR ranges): free_fast_ns 97.4 > " \
        "free_slow_ns 84.4" in format_report(out)


def test_report_names_the_implausible_constants_of_the_table_in_use(tmp_path):
    # A cost file with a fast free dearer than a slow one is reported as such, whatever
    # the packaged defaults are.
    from slabtune.sweeps import simconfig
    from slabtune.tuner import fitcost

    values = {**fitcost.prior_values(), "free_fast_ns": 120.0}
    f = tmp_path / "c.toml"
    f.write_text("[cost]\n" + "".join(f"{k} = {v!r}\n" for k, v in values.items()))
    cost, meta = simconfig.load_cost(f)
    arms = RP.simulate_arms((S.SLUB_MIN_PARTIAL_2008,))
    out = RP.evaluate(cost=cost, cost_meta=meta, arms=arms)
    assert out["cost"]["implausible"] == ["free_fast_ns 120 > free_slow_ns 80",
                                          "free_fast_ns 120 outside 5-10"]

"""``slabtune reproduce``: every seed scenario, published figures beside the model's."""

from __future__ import annotations

import io
import math

import pytest
from test_reproduce_slab import OPEN as SLAB_OPEN

from slabtune.calibrate import reproduce
from slabtune.errors import SlabtuneError
from slabtune.model import scenarios

KEYS = {"scenario", "metric", "published", "model", "published_ratio", "model_ratio",
        "direction_agrees", "headline"}


@pytest.fixture(scope="module")
def rows(reproduce_rows):
    """One run of the real CLI (in-process), as the JSON it prints (tests/conftest.py)."""
    return reproduce_rows


def test_json_shape(rows):
    assert isinstance(rows, list) and rows
    for r in rows:
        assert KEYS <= set(r), set(KEYS) - set(r)
        assert isinstance(r["direction_agrees"], bool) and isinstance(r["headline"], bool)
        assert isinstance(r["model"], float) and math.isfinite(r["model"])
    assert {r["scenario"] for r in rows} == {sc["name"] for sc in scenarios.SCENARIOS}


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


#: Why the 224-CPU hackbench collapse is missing under the derived work (the default mode):
#: a closed machine that loses 2/3 of its throughput to a lock keeps that lock busy all the
#: time, so the lock must be busy 1 / (the published v5.11 rate per node) per message.
HACKBENCH_COLLAPSE_MISSING = (
    "no lock of the model can cap the 224-CPU v5.11 arm at the published pace: 102.4 M "
    "messages in 9.135 s on 2 nodes is 5.6 M messages/s per node, so a lock that sets that "
    "pace is busy 178 ns per message; the v5.11 arm puts 0.138 page allocator calls per "
    "message (35.3 slab allocs + 33.9 slab frees per 1000 ops, frees oldest first) on its "
    "node's zone->lock at 1/31 of a pcp batch each (rmqueue_bulk / free_pcppages_bulk, "
    "batch 31), each block with its hold and the struct page lines its buddy merge or "
    "split moves (zone_block_lines), and 0.015 list_lock acquisitions: about 37 ns of lock "
    "time per message at the packaged constants (253 ns per page on the zone lock) and "
    "94 ns with every lock constant at its range maximum (637 ns per page), which gives "
    "1.44x; the 1.92x at the edge of 1.5x needs about 860 ns of zone service per page, the "
    "2.88x about 1.25 us.  The lab finds the model's order-0 producer/consumer slab churn "
    "within 12% of 6.x's on two nodes (8 and 16 CPUs; docs/LAB.md), so the calls per "
    "message are close to the kernel's where the seed's machine has its two nodes; with "
    "no work (--work none) the modelled machine runs far faster than the published one "
    "and saturates the zone lock, which is where that mode's 24.4x comes from")
#: Rows whose direction the model does not give today, and the mechanism missing.
OPEN_DIRECTIONS: dict = {
    "IOPS, doubled sheaf capacity vs barns on memoryless nodes":
        "1.001x against 1.21x, flat (within reproduce.FLAT): with the derived work (1782 ns "
        "per op outside the allocator) halving the barn exchanges saves almost nothing, as "
        "an exchange costs a server 45 ns (sheaf_swap_ns 5 and the barn hold 40, plus its "
        "lines and wait); it read 1.006x while the table priced the exchange at UML's "
        "540 ns (before the rig term, uml_section_ns). With no other work (--work none) "
        "the direction agrees (2.10x); 1.21x needs the allocator about a sixth of the CPU "
        "time (docs/MODEL.md)",
    "netio sys time (avg of 50), dynamic vs static min_partial":
        "no difference (1.00x against 0.87x), and none is possible under 2.6.27's rules "
        "on one node: its __slab_free() discards every slab it empties (no min_partial "
        "test before v3.1, profiles.KernelProfile.slab_free_discard_offset), so min_partial "
        "only decides whether unfreeze_slab() keeps an empty CPU slab (a CPU slab "
        "deactivates full unless a flush or a node mismatch takes it early) and whether "
        "get_any_partial() may take from another node; both arms run the same paths. The "
        "published means carry the static arm's outliers (sd 2.28 s, max 16.95 s against "
        "0.29 and 8.64; minima 7.42 and 7.17 s). The model agreed before only because "
        "it applied 6.1's __slab_free() test to 2.6.27",
}


#: The SLAB rows' open directions (issue 14) are named, with their reasons, beside them.
OPEN_DIRECTIONS.update(SLAB_OPEN)


def test_all_directions_are_checked(rows):
    # every row is one parameter of the test below, and the open ones name real rows
    assert set(OPEN_DIRECTIONS) <= {r["label"] for r in rows}


def _direction_labels():
    return [r["label"] for sc in scenarios.SCENARIOS for r in sc["rows"]]


@pytest.mark.parametrize("label", [
    pytest.param(lb, marks=[pytest.mark.xfail(reason=OPEN_DIRECTIONS[lb], strict=True)]
                 if lb in OPEN_DIRECTIONS else []) for lb in _direction_labels()])
def test_every_direction_agrees(rows, label):
    (r,) = [r for r in rows if r["label"] == label]
    assert r["direction_agrees"], (label, r["model_ratio"], r["published_ratio"])


HEADLINES = ("hackbench time, 224 CPUs, v5.11 vs v5.10",
             "IOPS, barns on memoryless nodes vs v7.0",
             "IOPS, doubled sheaf capacity vs barns on memoryless nodes")
#: Headlines the packaged (physical, UML-calibrated) cost table does not meet in the
#: default (derived) work mode, and the mechanism missing (issue 13).
OPEN_HEADLINES = {
    "hackbench time, 224 CPUs, v5.11 vs v5.10": "1.01x against 2.88x: "
                                                 + HACKBENCH_COLLAPSE_MISSING,
}


def test_the_headlines_are_the_three_named(rows):
    heads = [r for r in rows if r["headline"]]
    assert {r["scenario"] for r in heads} == {"slub-order-nr-cpus-2021",
                                              "sheaves-cross-cpu-regression-2026"}
    assert sorted(r["label"] for r in heads) == sorted(HEADLINES)


@pytest.mark.parametrize("label", [
    pytest.param(h, marks=[pytest.mark.xfail(reason=OPEN_HEADLINES[h], strict=True)]
                 if h in OPEN_HEADLINES else []) for h in HEADLINES])
def test_headline_ratio_within_a_factor_of_1_5(rows, label):
    (r,) = [r for r in rows if r["headline"] and r["label"] == label]
    f = r["model_ratio"] / r["published_ratio"]
    assert 1 / reproduce.HEADLINE_FACTOR <= f <= reproduce.HEADLINE_FACTOR, (r["label"], f)
    assert r["within_factor"] is True


def test_one_scale_per_scenario_cancels_in_ratios(rows):
    # The scale is stated, the same for every row of a scenario, and fitted on one arm:
    # the model's value on that arm equals the published one.
    for sc in scenarios.SCENARIOS:
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
    # Holds since the frees are oldest first (1.015x against 1.024x), but by 1%: both
    # arms are the uncontended cost of v5.11's extra calls, not the 224-CPU collapse
    # (HACKBENCH_COLLAPSE_MISSING), so this pins the order, not the mechanism.
    by = {r["label"]: r for r in rows}
    big = by["hackbench time, 224 CPUs, v5.11 vs v5.10"]["model_ratio"]
    small = by["hackbench time, 8 CPUs, v5.11 vs v5.10"]["model_ratio"]
    assert 1.0 < small < big


def test_arm_specs_apply_the_patches():
    dyn = reproduce.arm_spec(scenarios.SLUB_MIN_PARTIAL_2008["arms"]["dynamic"])
    static = reproduce.arm_spec(scenarios.SLUB_MIN_PARTIAL_2008["arms"]["static"])
    assert (static.profile.min_partial_divisor, static.profile.min_partial_hi) == (1, 5)
    assert (dyn.profile.min_partial_divisor, dyn.profile.min_partial_hi) == (1, 10)
    cap = reproduce.arm_spec(scenarios.SHEAVES_2026["arms"]["v7.0+barns+2xcap"])
    assert cap.profile.sheaf_base_capacity == scenarios.DOUBLED_SHEAF_BASE
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
    assert "physically implausible (slabtune.model.priors.PRIOR ranges): free_fast_ns 97.4 > " \
        "free_slow_ns 84.4" in format_report(out)


def test_report_names_the_implausible_constants_of_the_table_in_use(tmp_path):
    # A cost file with a fast free dearer than a slow one is reported as such, whatever
    # the packaged defaults are.
    from slabtune.model import priors
    from slabtune.sweeps import simconfig

    values = {**priors.prior_values(), "free_fast_ns": 120.0}
    f = tmp_path / "c.toml"
    f.write_text("[cost]\n" + "".join(f"{k} = {v!r}\n" for k, v in values.items()))
    cost, meta = simconfig.load_cost(f)
    arms = reproduce.simulate_arms((scenarios.SLUB_MIN_PARTIAL_2008,))
    out = reproduce.evaluate(cost=cost, cost_meta=meta, arms=arms)
    assert out["cost"]["implausible"] == ["free_fast_ns 120 > free_slow_ns 80",
                                          "free_fast_ns 120 outside 5-30"]


# --------------------------------------------------------------------------- work per op


def test_work_per_op_is_derived_from_the_seeds_published_rates():
    # hackbench -g 16 -l 16000: 16 groups of 20 senders, each writing 16000 messages to
    # each of its group's 20 receivers; 3.173 s on 224 CPUs (v5.10); 2 kmalloc-512 ops.
    assert scenarios.HACKBENCH_MESSAGES == 102_400_000
    hb = scenarios.cpu_ns_per_op(224, 3.173, 102_400_000, 2)
    assert hb == pytest.approx(224 * 3.173e9 / 204.8e6) == pytest.approx(3470.5, abs=0.1)
    assert scenarios.SLUB_ORDER_2021["work"]["other_ns"] == pytest.approx(
        hb - scenarios.HACKBENCH_ALLOCATOR_NS, abs=0.05)
    # 34M IOPS on the 128 modelled CPUs (v6.19), a bio alloc + free per I/O.
    bio = scenarios.cpu_ns_per_op(128, 1.0, 34e6, 2)
    assert bio == pytest.approx(1882.35, abs=0.01)
    assert scenarios.SHEAVES_2026["work"]["other_ns"] == pytest.approx(
        bio - scenarios.BLOCK_IO_ALLOCATOR_NS, abs=0.05)
    # The seeds without a rate give no work, and say why.
    for sc in (scenarios.SLUB_NETPERF_2011, scenarios.SLUB_MIN_PARTIAL_2008):
        assert sc["work"]["other_ns"] == 0.0 and sc["work"]["derivation"].startswith("0: ")
    assert scenarios.work_outside_allocator_ns(50.0, 80.0) == 0.0


def test_unknown_work_mode_names_the_option():
    with pytest.raises(SlabtuneError, match="--work: 'all'"):
        reproduce.simulate_arms((scenarios.SLUB_MIN_PARTIAL_2008,), work="all")


@pytest.fixture(scope="module")
def derived():
    """The two scenarios with a derived work per op, run with it, at the prior constants."""
    from slabtune.calibrate import fitcost
    from slabtune.model import priors

    arms = reproduce.simulate_arms((scenarios.SLUB_ORDER_2021, scenarios.SHEAVES_2026),
                                   work="derived")
    return reproduce.evaluate(cost=fitcost.cost_of(priors.prior_values()), arms=arms)


def test_derived_work_is_applied_and_reported(derived, rows):
    assert derived["work"] == "derived"
    for sc in derived["scenarios"]:
        want = {s["name"]: s for s in scenarios.SCENARIOS}[sc["scenario"]]["work"]
        assert sc["work"]["applied_ns"] == sc["work"]["derived_ns"] == want["other_ns"] > 0
        for arm in sc["arms"].values():
            assert arm["config"]["workload"]["other_ns"] == want["other_ns"]
    assert {r["other_ns"] for r in derived["rows"]} == {
        scenarios.SLUB_ORDER_2021["work"]["other_ns"], scenarios.SHEAVES_2026["work"]["other_ns"]}
    # The default run (the CLI fixture) applies each scenario's derived work (0 where
    # the seed gives no rate).
    assert scenarios.DEFAULT_WORK == "derived"
    work = {s["name"]: s["work"]["other_ns"] for s in scenarios.SCENARIOS}
    assert all(r["other_ns"] == work[r["scenario"]] for r in rows)
    from slabtune.commands.reproduce import format_report

    text = format_report(derived)
    assert "work outside the allocator: " \
        f"{scenarios.SHEAVES_2026['work']['other_ns']:.4g} ns per op " \
        "applied (--work derived)" in text
    assert "128 modelled CPUs / 34M IOPS" in text


def test_allocator_cost_taken_off_the_derivation_is_the_models(derived):
    # The allocator ns per op subtracted in the derivation is the base arm's modelled cost
    # at the prior constants (ns_per_op is per alloc+free pair): kept within 25%.
    arms = {(sc["scenario"], name): a for sc in derived["scenarios"]
            for name, a in sc["arms"].items()}
    hb = arms[("slub-order-nr-cpus-2021", "v5.10@224")]["ns_per_op"] / 2
    bio = arms[("sheaves-cross-cpu-regression-2026", "v6.19")]["ns_per_op"] / 2
    assert hb == pytest.approx(scenarios.HACKBENCH_ALLOCATOR_NS, rel=0.25)
    assert bio == pytest.approx(scenarios.BLOCK_IO_ALLOCATOR_NS, rel=0.25)


def _hackbench_k(out):
    """The hackbench scenario's fitted scale: seconds = k / (allocations per us), so k is
    the published v5.10 time x the modelled v5.10@224 allocation rate."""
    (sc,) = [sc for sc in out["scenarios"] if sc["scenario"] == "slub-order-nr-cpus-2021"]
    return 3.173 * sc["arms"]["v5.10@224"]["alloc_throughput_per_us"]


def test_derived_work_makes_the_hackbench_scale_the_seeds_message_count(derived):
    # One allocation per message: at the published pace k is the message count in
    # millions.  With the derived work the modelled machine runs at that pace.
    assert _hackbench_k(derived) == pytest.approx(scenarios.HACKBENCH_MESSAGES / 1e6, rel=0.02)


def test_no_work_runs_hackbench_tens_of_times_faster_than_published():
    from slabtune.calibrate import fitcost
    from slabtune.model import priors

    arms = reproduce.simulate_arms((scenarios.SLUB_ORDER_2021,), work="none")
    out = reproduce.evaluate(cost=fitcost.cost_of(priors.prior_values()), arms=arms)
    assert {r["other_ns"] for r in out["rows"]} == {0.0}
    assert _hackbench_k(out) > 10 * scenarios.HACKBENCH_MESSAGES / 1e6

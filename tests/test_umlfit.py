"""``slabtune calibrate fit``: per-event cost constants from the real 7.2 allocator's UML
timings in calibrate/data, and the packaged cost table they make."""

from __future__ import annotations

import contextlib
import io
import itertools
import statistics
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
    assert len(umlfit.FIT) + len(umlfit.RIG) < len(result.figures)
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
    # Moving any fitted constant or the rig term by 5% either way (inside its range)
    # makes the sum of squared relative errors over the fitted figures no smaller.
    def sse(values, rig):
        return sum(((umlfit.rig_ns(f, values, rig) - f.ns) / f.ns) ** 2
                   for f in result.figures)
    best = sse(result.values, result.rig)
    for name in umlfit.FIT:
        for factor in (0.95, 1.05):
            p = priors.PRIOR[name]
            moved = min(max(result.values[name] * factor, p.lo), p.hi)
            assert sse({**result.values, name: moved}, result.rig) >= best - 1e-6
    for name in umlfit.RIG:
        for factor in (0.95, 1.05):
            assert sse(result.values, {name: result.rig[name] * factor}) >= best - 1e-6


def test_slab_orders_separate_the_per_object_cost_of_a_new_slab(result):
    # The same bursts on slabs of order 0 to 3 (sysfs order read back per run): objects per
    # slab double with each order while new slabs per pair fall, and so do the objects set
    # up per pair (larger slabs are reused before they empty), while the objects a refill
    # moves stay 0.687 per call.  With the rig's lock sections priced apart, a refill's
    # objects (recently freed, cached) cost a few ns each, a new slab's objects (fresh
    # pages) several times more.
    bursts = sorted((f for f in result.figures if f.scenario.startswith("local_burst_1024")
                     and f.side == "alloc"), key=lambda f: f.events["pcp_call_ns"],
                    reverse=True)
    assert len(bursts) == 4
    objs = [f.events["object_setup_ns"] / f.events["pcp_call_ns"] for f in bursts]
    assert objs == [8.0, 16.0, 32.0, 64.0]
    assert [f.ns for f in bursts] == sorted((f.ns for f in bursts), reverse=True)
    setups = [f.events["object_setup_ns"] for f in bursts]
    assert setups == sorted(setups, reverse=True) and setups[0] > 1.4 * setups[-1]
    assert [round(f.events["sheaf_object_ns"], 3) for f in bursts] == [0.687] * 4
    assert result.values["sheaf_object_ns"] < 20.0
    assert result.values["object_setup_ns"] > 2 * result.values["sheaf_object_ns"]


def test_box_lsq_is_the_unconstrained_solution_inside_and_the_best_on_the_box():
    rng = np.random.default_rng(1)
    a = rng.uniform(0, 1, (8, 3))
    lo, hi = np.array([0.0, 0.0, 0.0]), np.array([5.0, 5.0, 5.0])
    x = np.array([2.0, 0.5, 3.0])
    np.testing.assert_allclose(umlfit.box_lsq(a, a @ x, lo, hi), x, rtol=1e-9)
    # an optimum outside the box lands on it, and no point of a grid over the box does
    # better
    b = a @ np.array([2.0, -1.0, 7.0])
    got = umlfit.box_lsq(a, b, lo, hi)
    assert np.all(got >= lo) and np.all(got <= hi) and got[1] == 0.0 and got[2] == 5.0
    err = np.sum((a @ got - b) ** 2)
    grid = np.linspace(0, 5, 26)
    assert all(np.sum((a @ np.array(p) - b) ** 2) >= err - 1e-9
               for p in itertools.product(grid, grid, grid))


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
    # the rig term is stated in the file's header, never a constant of the table: a cost
    # file that set it would not load
    assert set(umlfit.RIG).isdisjoint(doc["cost"]) and set(umlfit.RIG).isdisjoint(cost.FIELDS)
    for name, value in result.rig.items():
        assert f"#   {name} = {value:g} ns" in simconfig.default_cost_text()
        with pytest.raises(cost.CostError, match=f"cost.{name}: unknown"):
            cost.cost_from_mapping({**doc["cost"], name: value})


def test_cli_writes_the_cost_file_and_rejects_a_missing_csv(tmp_path):
    out = tmp_path / "c.toml"
    with contextlib.redirect_stdout(io.StringIO()) as buf:
        assert cli.main(["calibrate", "fit", "--out", str(out)]) == 0
    assert f"fitted to {2 * 6} one-CPU figures" in buf.getvalue()
    assert "rig term (User Mode Linux only, not in the cost table): uml_section_ns = " \
        in buf.getvalue()
    params, meta = simconfig.load_cost(out)
    assert set(meta.fitted) == set(umlfit.FIT)
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        assert cli.main(["calibrate", "fit", "--data", str(tmp_path / "none.csv")]) == 2
    assert err.getvalue().strip().count("\n") == 0 and "--data" in err.getvalue()


def _by_scenario(figs):
    out: dict[str, dict[str, umlfit.Figure]] = {}
    for f in figs:
        out.setdefault(f.scenario, {})[f.side] = f
    return out


def _packaged_values():
    params, _ = simconfig.load_cost()
    return {k: float(v) for k, v in params._asdict().items()}


SCENARIOS = ["local", "local_burst_256", "local_burst_1024", "local_burst_1024_order1",
             "local_burst_1024_order2", "local_burst_1024_order3"]


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_the_packaged_table_reproduces_its_calibration_timings(result, scenario):
    # Each one-CPU calibration run: its counters priced by the model (the one mapping,
    # cost.priced_events, then cost.one_cpu_ns: what metrics.compute gives a lone CPU,
    # tests/test_metrics.py) under the packaged table, plus the rig term for each lock
    # section taken with interrupts off, against the measured ns per call, each side.
    values = _packaged_values()
    for f in _by_scenario(result.figures)[scenario].values():
        assert umlfit.rig_ns(f, values, result.rig) == pytest.approx(f.ns, rel=0.10), f.side


def test_without_the_rig_term_the_bursts_of_1024_miss(result):
    # The table alone, refitted with no rig term (every constant inside its range), cannot
    # carry the lock sections whose count per flush falls with the slab order: the free
    # side of bursts of 1024 misses by more than 10% at order 0 (too cheap) and order 3
    # (too dear).  The rig term is what brings them within 10%.
    alone = umlfit.fit(umlfit.read_rows(umlfit.default_data()), rig=())
    assert alone.rig == {}
    sides = _by_scenario(alone.figures)
    o0, o3 = sides["local_burst_1024"]["free"], sides["local_burst_1024_order3"]["free"]
    assert umlfit.charge(o0.events, alone.values) < 0.9 * o0.ns
    assert umlfit.charge(o3.events, alone.values) > 1.1 * o3.ns


def test_the_rig_term_measured_from_two_runs_brackets_the_fit(result):
    # Measured, not fitted: bursts of 1024 at order 0 and 3 flush the same objects per
    # call and differ in lock sections (and a little page allocator work); their free
    # sides' difference per section lies in a bracket over the page allocator's ranges
    # that holds the jointly fitted rig term, and the term is far above a server's
    # irq-off cost (tens of ns).
    est, lo, hi = umlfit.section_bracket(result.figures, result.values)
    (name,) = umlfit.RIG
    assert lo <= result.rig[name] <= hi and lo < est < hi
    assert 300 < result.rig[name] < priors.RIG_PRIOR[name].hi


def test_events_are_the_models_pricing_of_the_mapped_counters(result):
    # umlfit.events is read off the model's own pricing by linearity: charging its counts
    # at any table gives cost.one_cpu_ns of cost.priced_events of the call's counters.
    rows = umlfit.read_rows(umlfit.default_data())
    row = {k[:-len("_per_pair")]: statistics.median(float(r[k]) for r in rows
                                                     if r["scenario"] == "local_burst_1024"
                                                     and r["cpus"] == "1")
           for k in rows[0] if k.endswith("_per_pair")}
    row.update(order=0, objs_per_slab=8)
    values = _packaged_values()
    table = cost.cost_from_mapping(values)
    for side in ("alloc", "free"):
        ev = cost.priced_events(umlfit.slub_counts(row, side))
        want = float(cost.one_cpu_ns(ev, 0, 8, umlfit.PCP_MAX, table))
        assert umlfit.charge(umlfit.events(row, side), values) == pytest.approx(want, rel=1e-5)
        # the rig's events: one per list_lock, barn lock and zone->lock section
        sections = float(cost.irq_off_sections(ev, 0, umlfit.PCP_MAX, table))
        assert umlfit.rig_events(row, side) == {"uml_section_ns": pytest.approx(sections)}
        zone = (row["alloc_slab"] if side == "alloc" else row["free_slab"]) / 31
        lock = (row["barn_get_fail"] if side == "alloc"
                else row["free_add_partial"] + row["free_slab"])
        barn = row["barn_get"] + row["barn_get_fail"] if side == "alloc" \
            else row["barn_put"] + row["barn_put_fail"]
        assert sections == pytest.approx(lock + barn + zone, rel=1e-5)


def test_a_barn_exchange_is_cheaper_than_a_refill_from_slabs_as_uml_measured(result):
    # UML: bursts of 256 add one barn exchange per 32 calls and nothing else over local
    # churn; bursts of 1024 at order 3 add refills from slabs (28 objects, a few new
    # slabs).  Per event, measured: the exchange about 0.5 us, the refill about 1.8 us,
    # each with UML's overhead on its lock sections.
    one = _by_scenario(result.figures)
    a256, loc, a1024 = (one[s]["alloc"] for s in ("local_burst_256", "local",
                                                  "local_burst_1024_order3"))
    exchange = (a256.ns - loc.ns) / a256.events["sheaf_swap_ns"]
    refill = ((a1024.ns - loc.ns - a1024.events["sheaf_swap_ns"] * exchange)
              / a1024.events["list_lock_hold_ns"])
    assert 400 < exchange < 650 and refill > 2.5 * exchange
    # the packaged table prices them the same way round: an exchange (BARN_GET) against
    # a refill (BARN_GET_FAIL, 28 objects, its list_lock section), per event
    values = _packaged_values()
    table = cost.cost_from_mapping(values)
    zero = dict.fromkeys(cost.SlubCounts._fields, 0.0)

    def price(**kw):
        return float(cost.one_cpu_ns(cost.priced_events(cost.SlubCounts(**{**zero, **kw})),
                                     0, 8, 3, table))
    model_exchange = price(barn_get=1.0)
    model_refill = price(barn_get_fail=1.0, sheaf_refill=28.0, list_lock=1.0)
    assert model_exchange == pytest.approx(values["sheaf_swap_ns"] + values["barn_lock_hold_ns"])
    assert model_refill > 2.5 * model_exchange
    # on hardware an exchange is pointer swaps and one barn section (tens of ns); in the
    # rig its one irq-off section pays the rig term, which gives back the exchange UML
    # measured
    assert model_exchange < 100
    (rig,) = result.rig.values()
    assert model_exchange + rig == pytest.approx(exchange, rel=0.10)

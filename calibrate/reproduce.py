"""Reproduce the seed scenarios: run every arm of :mod:`slabtune.model.scenarios` through the
model and compare each published ratio with the model's.

Rules (from the issue): directions must agree; headline ratios must be within a factor of
1.5; a scenario's absolute times or IOPS may be scaled by ONE fitted constant, stated in
the output (it cancels in every ratio); cost constants are global (the packaged defaults or
a ``--cost`` file; any marked fitted there is reported).  Each scenario's work outside the
allocator per op (its ``work``, derived from the seed) is printed beside its scale; the
arms run with it when ``work`` is ``"derived"`` (the default,
:data:`slabtune.model.scenarios.DEFAULT_WORK`) and with none when it is ``"none"``.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, NamedTuple

from slabtune.errors import SlabtuneError
from slabtune.model import priors
from slabtune.model import scenarios as seed_scenarios
from slabtune.sweeps import simconfig, simulate

#: A model ratio within this of 1 counts as "no change" (and agrees with no direction).
FLAT = 0.005
#: Headline ratios must come out within this factor of the published ones.
HEADLINE_FACTOR = 1.5


def check_work(work: str) -> str:
    """``work`` must be one of :data:`slabtune.model.scenarios.WORK_MODES`."""
    if work not in seed_scenarios.WORK_MODES:
        raise SlabtuneError(f"--work: {work!r} is not one of "
                            f"{', '.join(seed_scenarios.WORK_MODES)}")
    return work


def applied_other_ns(sc: dict[str, Any], work: str) -> float:
    """The ``other_ns`` a scenario's arms run with under the ``work`` mode."""
    return float(sc["work"]["other_ns"]) if check_work(work) == "derived" else 0.0


def arm_spec(arm: dict[str, Any], other_ns: float = 0.0) -> simconfig.SimSpec:
    """A scenario arm as a validated spec; ``profile_patch`` replaces profile fields (the
    kernel patch the seed discusses) and marks the profile name with ``+patch``;
    ``other_ns``, when not 0, is the workload's work outside the allocator per op."""
    doc = {k: v for k, v in arm.items() if k != "profile_patch"}
    if other_ns:
        doc = {**doc, "workload": {**doc["workload"], "other_ns": float(other_ns)}}
    spec = simconfig.parse_doc(doc)
    patch = arm.get("profile_patch")
    if patch:
        prof = dataclasses.replace(spec.profile, name=spec.profile.name + "+patch", **patch)
        spec = dataclasses.replace(spec, profile=prof)
    return spec


def _raw(metric: str, row: dict[str, Any]) -> float:
    """The unscaled model quantity behind a row metric."""
    if metric in ("time",):
        return 1.0 / max(row["alloc_throughput_per_us"], 1e-30)
    if metric == "iops":
        return row["alloc_throughput_per_us"]
    if metric == "sys_time":
        return row["ns_per_op"]
    if metric == "alloc_fastpath_pct":
        return 100.0 * row["alloc_fastpath_frac"]
    if metric == "free_fastpath_pct":
        return 100.0 * row["free_fastpath_frac"]
    raise ValueError(f"scenario metric {metric!r} is unknown")


def _direction(ratio: float | None) -> int:
    if ratio is None or not math.isfinite(ratio):
        return 0
    if ratio > 1.0 + FLAT:
        return 1
    if ratio < 1.0 - FLAT:
        return -1
    return 0


class Arms(NamedTuple):
    """Every arm of some scenarios, simulated once: the counters do not depend on the cost
    constants (:func:`slabtune.model.metrics.compute` applies the cost model after the
    run), so one simulation serves any number of cost tables."""

    scenarios: tuple
    work: str           # the work mode the specs' other_ns come from
    keys: list          # (scenario name, arm name), in simulation order
    specs: list
    structs: list
    cfgs: list
    counters: list


def simulate_arms(scenarios=seed_scenarios.SCENARIOS,
                  work: str = seed_scenarios.DEFAULT_WORK) -> Arms:
    """Run every arm of every scenario through the dynamics model (one batch); each arm's
    spec carries the scenario's ``other_ns`` under the ``work`` mode (it paces the cost
    model, not the simulation)."""
    keys, specs = [], []
    for sc in scenarios:
        other = applied_other_ns(sc, work)
        for name, arm in sc["arms"].items():
            keys.append((sc["name"], name))
            specs.append(arm_spec(arm, other))
    structs, cfgs, counters = simulate.simulate_specs(specs)
    return Arms(tuple(scenarios), work, keys, specs, structs, cfgs, counters)


def arm_metrics(arms: Arms, cost) -> dict[tuple[str, str], dict[str, Any]]:
    """The metrics of every simulated arm under the cost constants ``cost``."""
    rows = simulate.metrics_of(arms.specs, arms.structs, arms.cfgs, arms.counters, cost)
    return dict(zip(arms.keys, rows))


def evaluate(scenarios=seed_scenarios.SCENARIOS, cost=None, cost_meta=None,
             arms: Arms | None = None, work: str = seed_scenarios.DEFAULT_WORK) -> dict[str, Any]:
    """Run every arm of every scenario in one batch under the ``work`` mode (or take
    ``arms`` already simulated, with their own mode) and build the comparison (see
    :func:`compare`)."""
    if cost is None:
        cost, cost_meta = simconfig.load_cost()
    if arms is None:
        arms = simulate_arms(scenarios, work)
    out = compare(arms.scenarios, arm_metrics(arms, cost), cost_meta, arms.work)
    out["cost"]["implausible"] = priors.implausible(
        {k: float(v) for k, v in cost._asdict().items()})
    return out


def compare(scenarios, results: dict[tuple[str, str], dict[str, Any]], cost_meta=None,
            work: str = seed_scenarios.DEFAULT_WORK) -> dict[str, Any]:
    """Published figures beside the model's, from the metrics of every arm (simulated
    under the ``work`` mode).

    Returns ``{"rows": [...], "scenarios": [...], "cost": {...}, "work": mode}``
    (:func:`evaluate` adds ``cost["implausible"]``, see
    :func:`slabtune.model.priors.implausible`); each row has ``scenario, metric, label,
    arm, base, allocator, base_allocator, published, model, published_ratio, model_ratio,
    direction_agrees, headline, within_factor, scale, other_ns`` (``allocator``: "SLUB"
    or "SLAB", the row's arm's; ``base_allocator`` its base's; ``other_ns``: the work per
    op its arms ran with).  A row without published figures states its direction by
    ``expect_direction`` (+1 or -1: the model ratio must be above or below 1) or by
    ``expect_ratio_between``.
    """
    rows, summaries = [], []
    for sc in scenarios:
        other_ns = applied_other_ns(sc, work)
        arms = {name: results[(sc["name"], name)] for name in sc["arms"]}
        scale = sc.get("scale")
        k, scale_text = 1.0, None
        if scale:
            fit_arm, fit_value = scale["fit_to"]
            raw = _raw(scale["metric"], arms[fit_arm])
            k = fit_value / raw if raw else float("nan")
            scale_text = (f"k = {k:.6g} fitted so that {fit_arm} = {fit_value} {scale['unit']}"
                          f" ({scale['what']})")

        def value(metric, arm, arms=arms, k=k, scale=scale):
            raw = _raw(metric, arms[arm])
            return raw * k if scale and metric == scale["metric"] else raw

        model_ratios = {}
        for row in sc["rows"]:
            m, a, b = row["metric"], row["arm"], row["base"]
            mv, mb = value(m, a), value(m, b)
            mr = mv / mb if mb else float("nan")
            model_ratios[f"{a}/{b}"] = mr
            pub, pub_b = row["published"], row["published_base"]
            pr = pub / pub_b if (pub is not None and pub_b) else None
            if pr is not None:
                agrees = _direction(pr) != 0 and _direction(pr) == _direction(mr)
            elif "expect_direction" in row:
                agrees = _direction(mr) == row["expect_direction"]
            else:
                lo, other = row["expect_ratio_between"]
                hi = model_ratios.get(other, float("inf"))
                agrees = _direction(mr) == 1 and lo < mr < hi
            within = None
            if row["headline"] and pr is not None:
                within = max(mr / pr, pr / mr) <= HEADLINE_FACTOR if mr > 0 else False
            rows.append({
                "scenario": sc["name"], "metric": m, "label": row["label"],
                "arm": a, "base": b,
                "allocator": arms[a]["allocator"], "base_allocator": arms[b]["allocator"],
                "published": pub, "published_base": pub_b, "model": mv, "model_base": mb,
                "published_ratio": pr, "model_ratio": mr,
                "direction_agrees": bool(agrees), "headline": bool(row["headline"]),
                "within_factor": within,
                "expect": row.get("expect"),
                "scale": scale_text,
                "other_ns": other_ns,
            })
        summaries.append({
            "scenario": sc["name"], "title": sc["title"], "assumptions": sc["assumptions"],
            "scale": scale_text,
            "work": {"applied_ns": other_ns, "derived_ns": float(sc["work"]["other_ns"]),
                     "derivation": sc["work"]["derivation"]},
            "arms": {name: _arm_summary(arms[name]) for name in sc["arms"]},
        })
    return {"rows": rows, "scenarios": summaries, "work": work,
            "cost": {"source": cost_meta.source if cost_meta else "given",
                     "fitted": dict(cost_meta.fitted) if cost_meta else {}}}


def _arm_summary(row: dict[str, Any]) -> dict[str, Any]:
    """The configuration of an arm spelled out, with its structure and key metrics."""
    keep = ("allocator", "order", "objs_per_slab", "min_partial", "cpu_partial",
            "cpu_partial_slabs", "sheaf_capacity", "alloc_fastpath_frac", "free_fastpath_frac",
            "slab_allocs_per_kop", "list_lock_per_kop", "list_lock_rho", "ns_per_op",
            "alloc_throughput_per_us", "memory_bytes", "overhead_frac")
    return {"config": row["config"], **{k: row[k] for k in keep}}

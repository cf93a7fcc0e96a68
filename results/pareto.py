"""Pareto queries: the non-dominated policies of a tune study, or configurations of a sweep run,
on memory overhead against modelled time per op (both lower is better).

Works on what the tuner stored (trial values, params and user attrs; the study's baseline
and topology names) and on sweep runs read lazily through :mod:`slabtune.results.store`.
This module never imports JAX.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import optuna
import polars as pl

from slabtune.errors import SlabtuneError

#: Column names a sweep run may use for the two objectives, first match wins.
MEMORY_COLUMNS = ("overhead_frac", "memory_overhead", "overhead_ratio", "memory")
TIME_COLUMNS = ("ns_per_op", "total_ns_per_op", "time_ns_per_op", "time")


def non_dominated(points: Sequence[tuple[float, float]]) -> list[int]:
    """Indices of the points no other point dominates (minimising both coordinates): a point
    is dominated when another is <= on both and < on one.  Equal points are all kept.
    Returned in increasing order of the first coordinate."""
    order = sorted(range(len(points)), key=lambda i: (points[i][0], points[i][1]))
    keep: list[int] = []
    best_y = float("inf")
    best_x = None
    for i in order:
        x, y = points[i]
        if y < best_y:
            keep.append(i)
            best_y, best_x = y, x
        elif y == best_y and x == best_x:
            keep.append(i)
    return keep


def dominates(a: Sequence[float], b: Sequence[float]) -> bool:
    """Whether ``a`` dominates ``b`` (minimisation): no worse on every objective, better on one."""
    return all(x <= y for x, y in zip(a, b)) and any(x < y for x, y in zip(a, b))


def gains(values: Iterable[float], baseline: Iterable[float]) -> list[float]:
    """Relative gain of each value over the baseline: 1 - value / baseline (positive = better)."""
    return [1.0 - v / b if b else 0.0 for v, b in zip(values, baseline)]


def collapse_equal(points: list[dict]) -> tuple[list[dict], int]:
    """Points with equal objective vectors (memory, time) collapsed to one: the one that
    changes the fewest knobs from the kernel's values (``changed``; without it every point
    counts alike), then the lowest trial number.  The kept point lists the others' trial
    numbers in ``same_as``.  Returns the kept points, in the input order, and how many
    were collapsed."""
    groups: dict[tuple[float, float], list[dict]] = {}
    for p in points:
        groups.setdefault((p["memory"], p["time"]), []).append(p)
    keep = {}
    for group in groups.values():
        best = min(group, key=lambda p: (p.get("changed", 0), p["trial"]))
        keep[best["trial"]] = sorted(p["trial"] for p in group if p is not best)
    out = [dict(p, same_as=keep[p["trial"]]) for p in points if p["trial"] in keep]
    return out, len(points) - len(out)


def study_pareto(study: optuna.Study,
                 annotate: Callable[[list[dict]], dict[int, dict]] | None = None) -> dict:
    """The Pareto front of a slabtune study with per-topology gains against the baseline.

    Returns ``{"study", "baseline": {"memory", "time"}, "topologies", "points": [{"trial",
    "memory", "time", "params", "gains": {topology: {"memory", "time"}}, "same_as"}],
    "collapsed"}``, points sorted by memory.  Infeasible trials (regression constraints)
    are left out, as in ``Study.best_trials``.  ``annotate`` maps the points to extra fields
    per trial (slabtune.tuner.study.front_report: ``reach``, ``settings``, ``changed``...);
    then points with equal objectives collapse (:func:`collapse_equal`).
    """
    attrs = study.user_attrs
    base = attrs.get("slabtune_baseline")
    topos = attrs.get("slabtune_topologies")
    if base is None or topos is None:
        raise SlabtuneError(f"study: {study.study_name!r} was not created by slabtune tune")
    best = study.best_trials if any(
        t.state == optuna.trial.TrialState.COMPLETE
        for t in study.get_trials(deepcopy=False)) else []
    best = sorted(best, key=lambda t: (t.values[0], t.values[1], t.number))
    points = []
    for t in best:
        topo = t.user_attrs.get("per_topology")
        mem_t = topo.get("memory") if isinstance(topo, dict) else None
        time_t = topo.get("time") if isinstance(topo, dict) else None
        if not all(isinstance(x, list) and len(x) == len(topos) for x in (mem_t, time_t)):
            # a trial added outside tune (Optuna's own API) or tampered with: no gains to show
            raise SlabtuneError(f"trial {t.number}: per_topology: not {len(topos)} memory and "
                                f"time values, one per fleet topology (not written by tune)")
        gm = gains(mem_t, base["memory_topo"])
        gt = gains(time_t, base["time_topo"])
        points.append({
            "trial": t.number,
            "memory": float(t.values[0]),
            "time": float(t.values[1]),
            "params": dict(t.params),
            "gains": {name: {"memory": gm[i], "time": gt[i]} for i, name in enumerate(topos)},
        })
    if annotate is not None and points:
        extra = annotate(points)
        points = [dict(p, **extra.get(p["trial"], {})) for p in points]
    points, collapsed = collapse_equal(points)
    return {
        "study": study.study_name,
        "baseline": {"memory": float(base["memory"]), "time": float(base["time"])},
        "baseline_topologies": {name: {"memory": base["memory_topo"][i],
                                       "time": base["time_topo"][i]}
                                for i, name in enumerate(topos)},
        "topologies": list(topos),
        "objectives": attrs.get("slabtune_objectives", {}),
        "n_trials": len(study.get_trials(deepcopy=False,
                                         states=(optuna.trial.TrialState.COMPLETE,))),
        "points": points,
        "collapsed": collapsed,
    }


def all_points(study: optuna.Study, reach: dict[int, str] | None = None) -> pl.DataFrame:
    """Every complete trial as a frame (trial, memory, time, feasible, pareto, reach):
    ``reach`` maps trials to their reach (slabtune.tuner.study.front_report's
    ``front_reach``); trials it leaves out get null."""
    trials = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
    front = {t.number for t in study.best_trials} if trials else set()
    reach = reach or {}
    return pl.DataFrame({
        "trial": [t.number for t in trials],
        "memory": [float(t.values[0]) for t in trials],
        "time": [float(t.values[1]) for t in trials],
        "feasible": [not t.constraints or max(t.constraints.values()) <= 0 for t in trials],
        "pareto": [t.number in front for t in trials],
        "reach": [reach.get(t.number) for t in trials],
    }, schema={"trial": pl.Int64, "memory": pl.Float64, "time": pl.Float64,
               "feasible": pl.Boolean, "pareto": pl.Boolean, "reach": pl.Utf8})


def _pick(columns: Sequence[str], candidates: Sequence[str], what: str) -> str:
    for c in candidates:
        if c in columns:
            return c
    raise SlabtuneError(f"run: no {what} column (looked for {', '.join(candidates)}); "
                        "the run's evaluator did not produce it")


def sweep_pareto(lf: pl.LazyFrame, memory_col: str | None = None,
                 time_col: str | None = None, limit: int = 1000) -> pl.DataFrame:
    """Non-dominated rows of a sweep run's LazyFrame on (memory, time), both minimised:
    sort by memory then time and keep rows whose time beats every row before them."""
    cols = lf.collect_schema().names()
    m = memory_col or _pick(cols, MEMORY_COLUMNS, "memory")
    t = time_col or _pick(cols, TIME_COLUMNS, "time")
    return (lf.drop_nulls([m, t]).sort([m, t])
            .with_columns(pl.col(t).cum_min().shift(1).alias("_best_before"))
            .filter(pl.col("_best_before").is_null() | (pl.col(t) < pl.col("_best_before")))
            .drop("_best_before").head(limit).collect())


def run_pareto(run_dir: str | Path) -> pl.DataFrame:
    """The Pareto rows of a sweep run directory (results/store.py)."""
    from slabtune.results import store

    run = store.open_run(run_dir)
    return sweep_pareto(run.scan())


def reach_counts(points: Sequence[dict]) -> dict[str, int]:
    """How many points have each reach (points without one are left out)."""
    out: dict[str, int] = {}
    for p in points:
        if "reach" in p:
            out[p["reach"]] = out.get(p["reach"], 0) + 1
    return out


def format_table(report: dict, max_params: int | None = None) -> str:
    """A plain-text table of a :func:`study_pareto` report.  With the annotations of
    slabtune.tuner.study.front_report, each row shows its reach and the settings it changes
    under the names a kernel engineer knows (``report["legend"]`` explains each column;
    ``-`` is the kernel's value); otherwise the raw searched params."""
    pts = report["points"]
    collapsed = report.get("collapsed", 0)
    lines = [f"study {report['study']}: {report['n_trials']} trials, "
             f"{len(pts)} on the Pareto front"
             + (f" ({collapsed} more with the same objectives collapsed into them: the one "
                "changing the fewest knobs is shown)" if collapsed else ""),
             f"baseline: memory overhead {report['baseline']['memory']:.4f}, "
             f"time {report['baseline']['time']:.2f} ns/op"]
    obj = report.get("objectives") or {}
    if obj.get("set") == "structural":
        lines.append("objectives: structural (structure + cost model with a slow-path-rate proxy, "
                     "not the dynamics simulation)")
    if obj.get("max_regression") is not None:
        lines.append(f"constraint: no topology regresses more than "
                     f"{100 * obj['max_regression']:.0f}% on either objective")
    counts = reach_counts(pts)
    if counts:
        lines.append("reach: " + ", ".join(f"{n} {r}" for r, n in counts.items())
                     + " (boot: boot parameters; sysfs/slabinfo: written at run time; "
                       "kernel: needs a rebuilt kernel)")
    if not pts:
        return "\n".join(lines)
    annotated = all("settings" in p for p in pts)
    if annotated:
        legend = report.get("legend") or {}
        used = {k for p in pts for k in p["settings"]}
        names = [k for k in legend if k in used] + sorted(used - set(legend))
        head = ["trial", "reach", "memory", "time"] + names
        rows = [[str(p["trial"]), p["reach"], f"{p['memory']:.4f}", f"{p['time']:.2f}"]
                + [p["settings"].get(n, "-") for n in names] for p in pts]
    else:
        names = sorted({k for p in pts for k in p["params"]})
        if max_params is not None:
            names = names[:max_params]
        head = ["trial", "memory", "time"] + names
        rows = [[str(p["trial"]), f"{p['memory']:.4f}", f"{p['time']:.2f}"]
                + [str(p["params"].get(n, "")) for n in names] for p in pts]
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(head)]
    fmt = lambda r: "  ".join(c.rjust(w) for c, w in zip(r, widths))  # noqa: E731
    lines += ["", fmt(head)] + [fmt(r) for r in rows]
    if annotated:
        lines += [f"  {n}: {report['legend'][n]}" for n in names if n in report.get("legend", {})]
        lines.append("  -: the kernel's value")
        inert = [p for p in pts if p.get("inert")]
        if inert:
            lines.append("  set with no effect on this fleet: " + "; ".join(
                f"trial {p['trial']}: {', '.join(p.get('inert_names') or p['inert'])}"
                for p in inert))
    dup = [p for p in pts if p.get("same_as")]
    if dup:
        lines.append("  same objectives as: " + "; ".join(
            f"trial {p['trial']} = {', '.join(map(str, p['same_as']))}" for p in dup))
    lines += ["", "gains against the baseline per topology (memory% / time%, + is better):"]
    topos = report["topologies"]
    th = ["trial"] + topos
    trows = [[str(p["trial"])] + [f"{100 * p['gains'][n]['memory']:+.1f}/"
                                  f"{100 * p['gains'][n]['time']:+.1f}"
                                 for n in topos] for p in pts]
    tw = [max(len(h), *(len(r[i]) for r in trows)) for i, h in enumerate(th)]
    lines += ["  ".join(c.rjust(w) for c, w in zip(th, tw))]
    lines += ["  ".join(c.rjust(w) for c, w in zip(r, tw)) for r in trows]
    return "\n".join(lines)

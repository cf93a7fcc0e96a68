"""The error report of a validation run (``slabtune validate report RUN``).

Every figure is recomputed from the rows the run stored, so the report can be derived
again from the parquet parts alone: the structural match rate, the median memory error over
the workload's caches, the Spearman rank correlation of predicted cost and measured time
(native rig under its fitted cost table, with its ceiling and the labelled diagnostics), and
the native fast-path difference.  docs/VALIDATION.md, "The report", says what each figure is
and where it comes from.  This module never imports JAX.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

import polars as pl

from slabtune.errors import SlabtuneError
from slabtune.validate import uml
from slabtune.validate.lab import format_summary as format_lab_summary
from slabtune.validate.lab import summary as lab_summary
from slabtune.validate.schema import (
    ROW_SCHEMA,
    STRUCTURAL_FIELDS,
    is_validate_run,
    task_table,
)

MEMORY_FIELD = "slab_bytes"
COST_FIELD = "cost"
NATIVE_COST_FIELD = "native_cost"
NATIVE_COST_PRIOR_FIELD = "native_cost_prior"
NATIVE_COST_PACKAGED_FIELD = "native_cost_packaged"
NATIVE_FASTPATH_FIELDS = ("alloc_fastpath_pct", "free_fastpath_pct")
MAX_LISTED = 200


def average_ranks(values: Sequence[float]) -> list[float]:
    """1-based ranks, ties sharing the mean of the ranks they span (as Spearman's rho with
    ties requires)."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        mean = (i + j) / 2.0 + 1.0
        for k in range(i, j + 1):
            ranks[order[k]] = mean
        i = j + 1
    return ranks


def spearman(x: Sequence[float], y: Sequence[float]) -> float | None:
    """Spearman's rank correlation: Pearson's correlation of the average ranks.  None for
    fewer than 3 pairs or when either side is constant (undefined)."""
    if len(x) != len(y):
        raise ValueError("spearman: x and y differ in length")
    if len(x) < 3:
        return None
    rx, ry = average_ranks(list(x)), average_ranks(list(y))
    mx, my = sum(rx) / len(rx), sum(ry) / len(ry)
    sxy = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    sxx = sum((a - mx) ** 2 for a in rx)
    syy = sum((b - my) ** 2 for b in ry)
    if sxx == 0 or syy == 0:
        return None
    return sxy / math.sqrt(sxx * syy)


def spearman_ceiling(x: Sequence[float]) -> float | None:
    """The largest Spearman any measured order could reach against predictions ``x``: the
    correlation with a measurement that orders the pairs exactly as ``x`` does.  Below 1
    only when ``x`` has ties: pairs the model predicts alike (candidates whose policies are
    the same configuration to the workload) share an average rank, and no order of their
    measurements can make up for it.  None where :func:`spearman` is undefined."""
    order = sorted(range(len(x)), key=lambda i: x[i])
    y = [0.0] * len(x)
    for rank, i in enumerate(order):
        y[i] = float(rank)
    return spearman(list(x), y)


def tie_within(x: Sequence[float], resolution: float) -> list[float]:
    """``x`` with values that lie within ``resolution`` of a neighbour (chained, after
    sorting) replaced by their group's smallest value: predictions a measurement cannot
    tell apart become ties, and :func:`spearman` gives them one average rank."""
    order = sorted(range(len(x)), key=lambda i: x[i])
    out = [0.0] * len(x)
    head = prev = None
    for i in order:
        if prev is None or x[i] - prev > resolution:
            head = x[i]
        out[i] = head
        prev = x[i]
    return out


def rig_resolution(rig: Mapping | None) -> float | None:
    """The native rig's repeat noise in ns per pair: the median, over the stored calibration
    configurations with at least 2 timing runs, of the standard error of their mean
    (stdev / sqrt(runs)).  None without such runs."""
    if not rig:
        return None
    ses = [statistics.stdev(c["runs"]) / math.sqrt(len(c["runs"]))
           for c in rig.get("calibration", []) if len(c.get("runs") or []) >= 2]
    return statistics.median(ses) if ses else None


def _ok(rows: pl.DataFrame) -> pl.DataFrame:
    return rows.filter(pl.col("status") == "ok")


def structural(rows: pl.DataFrame, target: str) -> dict:
    """Matched/total comparable structural rows of one target, and the mismatches."""
    s = _ok(rows).filter((pl.col("target") == target) & pl.col("comparable")
                         & pl.col("field").is_in(list(STRUCTURAL_FIELDS)))
    total = s.height
    bad = s.filter(pl.col("predicted") != pl.col("measured"))
    mism = [{k: r[k] for k in ("candidate", "topology", "cache", "field")}
            | {"predicted": int(r["predicted"]), "measured": int(r["measured"])}
            for r in bad.sort("candidate", "topology", "cache", "field").head(MAX_LISTED)
            .iter_rows(named=True)]
    return {"total": total, "matched": total - bad.height,
            "rate": (total - bad.height) / total if total else None,
            "mismatches": bad.height, "mismatch_list": mism}


def accounted_twin(name: str) -> str | None:
    """kmalloc-cg-N for kmalloc-N, else None: kernels with CONFIG_MEMCG_KMEM (KMALLOC_CGROUP
    caches, v5.14 on) serve __GFP_ACCOUNT kmalloc()s of that size class from kmalloc-cg-N."""
    if name.startswith("kmalloc-") and not name.startswith("kmalloc-cg-"):
        return "kmalloc-cg-" + name[len("kmalloc-"):]
    return None


def _spec_doc(spec_text: str | None) -> dict:
    """The validation spec stored with a run, parsed (empty when absent or unreadable: the
    report then leaves out the figures that need it rather than failing)."""
    import tomllib

    if not spec_text:
        return {}
    try:
        return tomllib.loads(spec_text)
    except tomllib.TOMLDecodeError:
        return {}


def workload_caches(spec_text: str | None) -> set[str]:
    """The caches a validation spec's workload drives: every cache its model workload names
    (``[fleet.workload.caches]``; ``[validate.native] cache`` must be one of them), and for
    each kmalloc-N also its :func:`accounted_twin` kmalloc-cg-N, explicitly: the guest's
    6.1 kernel serves hackbench's socket data (accounted allocations) from kmalloc-cg-512,
    not kmalloc-512.  Both spellings stay in the set; a row is one cache, counted once."""
    doc = _spec_doc(spec_text)
    out: set[str] = set()
    for w in doc.get("fleet", {}).get("workload", []):
        for name in (w.get("caches") or {}):
            out.add(name)
            if accounted_twin(name):
                out.add(accounted_twin(name))
    return out


def distribution(values: Sequence[float]) -> dict | None:
    """n, min, quartiles (statistics.quantiles, inclusive) and max of a list."""
    v = sorted(x for x in values if x is not None and not math.isnan(x))
    if not v:
        return None
    q = statistics.quantiles(v, n=4, method="inclusive") if len(v) > 1 else [v[0]] * 3
    return {"n": len(v), "min": v[0], "q1": q[0], "median": q[1], "q3": q[2], "max": v[-1]}


def memory_pairs(rows: pl.DataFrame, caches: set[str] | None = None) -> pl.DataFrame:
    """Per guest (candidate, topology): summed predicted and measured slab bytes of the
    driven caches (only those in ``caches`` when given), how many caches, the relative
    error and the signed one ((predicted - measured) / measured)."""
    m = _ok(rows).filter((pl.col("target") == "guest") & (pl.col("field") == MEMORY_FIELD))
    if caches is not None:
        m = m.filter(pl.col("cache").is_in(sorted(caches)))
    return (m.group_by("candidate", "topology")
            .agg(pl.col("predicted").sum().alias("mem_predicted"),
                 pl.col("measured").sum().alias("mem_measured"),
                 pl.len().alias("mem_caches"))
            .with_columns(((pl.col("mem_predicted") - pl.col("mem_measured"))
                           / pl.col("mem_measured")).alias("mem_signed_err"))
            .with_columns(pl.col("mem_signed_err").abs().alias("mem_rel_err"))
            .sort("candidate", "topology"))


def per_cache_mem_err(rows: pl.DataFrame) -> float | None:
    """Median over single (pair, cache) rows of |predicted - measured| / measured: small
    caches weigh as much as large ones here, unlike the per-pair sums."""
    m = _ok(rows).filter((pl.col("target") == "guest") & (pl.col("field") == MEMORY_FIELD)
                         & (pl.col("measured") > 0))
    if m.is_empty():
        return None
    return float(((m["predicted"] - m["measured"]).abs() / m["measured"]).median())


def _finite(values) -> list[float]:
    return [x for x in values if x is not None and not math.isnan(x)]


def memory_figures(rows: pl.DataFrame, caches: set[str] | None) -> dict:
    """Median relative error over guest pairs (caches restricted to ``caches`` when
    given), the distributions of the relative and signed errors, pairs over-predicted,
    and the median over single (pair, cache) rows."""
    mp = memory_pairs(rows, caches)
    errs = _finite(mp["mem_rel_err"].to_list())
    signed = _finite(mp["mem_signed_err"].to_list())
    m = rows if caches is None else rows.filter(pl.col("cache").is_in(sorted(caches)))
    return {"median_rel_err": statistics.median(errs) if errs else None,
            "pairs": len(errs), "rel_err": distribution(errs),
            "signed_err": distribution(signed),
            "over_predicted_pairs": sum(1 for x in signed if x > 0),
            "per_cache_median_rel_err": per_cache_mem_err(m)}


def memory(rows: pl.DataFrame, workload: set[str]) -> dict:
    """The memory figures: primary over the workload's caches (``workload``), secondary
    over every driven cache (``all_driven``), the workload caches that had rows, and the
    guest pairs with memory rows but none of the workload's caches (named, not dropped)."""
    prim = memory_figures(rows, workload)
    every = memory_pairs(rows)
    mine = memory_pairs(rows, workload)
    have = set(zip(mine["candidate"].to_list(), mine["topology"].to_list()))
    missing = [{"candidate": c, "topology": t}
               for c, t in zip(every["candidate"].to_list(), every["topology"].to_list())
               if (c, t) not in have]
    seen = _ok(rows).filter((pl.col("target") == "guest") & (pl.col("field") == MEMORY_FIELD)
                            & pl.col("cache").is_in(sorted(workload)))["cache"].unique()
    return {**prim, "workload_caches": sorted(workload),
            "workload_caches_with_rows": sorted(seen.to_list()),
            "pairs_without_workload_caches": missing,
            "all_driven": memory_figures(rows, None)}


def memoryless_topologies(spec_text: str | None) -> set[str]:
    """Names of the spec's ``[[fleet.topology]]`` entries with a memoryless node."""
    doc = _spec_doc(spec_text)
    return {str(t.get("name")) for t in doc.get("fleet", {}).get("topology", [])
            if t.get("memoryless_nodes")}


def _rho(df: pl.DataFrame) -> float | None:
    return spearman(df["predicted"].to_list(), df["measured"].to_list())


def speed(rows: pl.DataFrame, memoryless: set[str] | None = None,
          resolution: float | None = None) -> dict:
    """Spearman of predicted cost against measured time, from the preferred source: the
    real allocator under UML (``uml``), else the native allocator, else KVM guests.  The
    native allocator's figures, when it ran, are labelled beside it
    (``native_arithmetic_check`` when it is not the source): without the topologies with a
    memoryless node (``memoryless``: the native allocator has no remote memory, so the
    model's remote-node costs have nothing to meet), and against the model with its
    packaged and prior cost constants."""
    ok = _ok(rows)
    umlr = ok.filter((pl.col("target") == "uml") & (pl.col("field") == uml.UML_FIELD)
                     & pl.col("comparable") & pl.col("predicted").is_not_null()
                     & pl.col("measured").is_not_null())
    native = ok.filter((pl.col("target") == "native") & (pl.col("field") == NATIVE_COST_FIELD)
                       & pl.col("comparable") & pl.col("predicted").is_not_null())
    kvm = ok.filter((pl.col("target") == "guest") & (pl.col("field") == COST_FIELD)
                    & (pl.col("accelerator") == "kvm"))
    tcg = ok.filter((pl.col("target") == "guest") & (pl.col("field") == COST_FIELD)
                    & (pl.col("accelerator") != "kvm"))
    if umlr.height:
        src, use = "uml", umlr
    elif native.height:
        src, use = "native", native
    elif kvm.height:
        src, use = "guest-kvm", kvm
    else:
        src, use = None, native
    rho = spearman(use["predicted"].to_list(), use["measured"].to_list()) if src else None
    tcg_rho = spearman(tcg["predicted"].to_list(), tcg["measured"].to_list())
    ceiling = spearman_ceiling(use["predicted"].to_list()) if src else None
    out = {"spearman_time": rho, "speed_source": src, "pairs": use.height,
           "spearman_ceiling": ceiling,
           "distinct_predictions": use["predicted"].n_unique() if src else 0,
           "guest_tcg_spearman_not_counted": tcg_rho, "guest_tcg_pairs": tcg.height}
    if native.height and src != "native":
        # the native allocator beside the real one: a twin of the model, so its figure
        # checks the model's arithmetic, not the kernel
        out["native_arithmetic_check"] = {
            "spearman": _rho(native), "pairs": native.height,
            "label": "native allocator (a userspace twin written from the model's reading "
                     "of mm/slub.c): checks the model's arithmetic, not the kernel"}
    if native.height:
        ml = sorted(memoryless or ())
        keep = ~pl.col("topology").is_in(ml)
        out["native_labelled"] = {
            "memoryless_topologies": ml,
            "without_memoryless": {"spearman": _rho(native.filter(keep)),
                                   "pairs": native.filter(keep).height},
        }
        if resolution is not None:
            tied = tie_within(native["predicted"].to_list(), resolution)
            out["native_labelled"]["ties_within_noise"] = {
                "resolution_ns": resolution, "groups": len(set(tied)),
                "spearman": spearman(tied, native["measured"].to_list())}
        for field, key in ((NATIVE_COST_PACKAGED_FIELD, "packaged_constants"),
                           (NATIVE_COST_PRIOR_FIELD, "prior_constants")):
            d = ok.filter((pl.col("target") == "native") & (pl.col("field") == field))
            out["native_labelled"][key] = {"spearman": _rho(d) if d.height else None,
                                           "pairs": d.height}
            out["native_labelled"][f"{key}_without_memoryless"] = {
                "spearman": _rho(d.filter(keep)) if d.height else None,
                "pairs": d.filter(keep).height}
    return out


def rig_summary(rig: dict | None) -> dict | None:
    """The rig cost table a native run was ranked under (the manifest's ``native_rig``),
    re-derived from what was stored: each calibration run's fitted value is its features
    times the stored constants and R^2 is recomputed from those (``r2``; the fit's own
    figure is ``r2_at_fit``).  None for a run without one."""
    if not rig:
        return None
    from slabtune.validate import rigcost

    names = rig.get("names") or []
    out = {k: rig.get(k) for k in ("table", "unit", "constants", "stderr", "fitted_constants",
                                   "not_identified", "aliased", "rank", "pcp_batch",
                                   "timing_steps", "pairs_outside_span", "error")}
    cal = []
    for c in rig.get("calibration") or []:
        fitted = (float(rigcost.predict(c["features"], rig["constants"], names)[0])
                  if rig.get("constants") and c.get("measured") is not None else None)
        cal.append({"topology": c["topology"], "params": c["params"],
                    "effective": c.get("key"), "runs": c.get("runs"),
                    "measured": c.get("measured"), "fitted": fitted, "error": c.get("error")})
    used = [c for c in cal if c["fitted"] is not None]
    out.update(calibration=cal, runs=len(used), r2_at_fit=rig.get("r2"),
               r2=rigcost.r_squared([c["fitted"] for c in used], [c["measured"] for c in used]))
    return out


def native_fastpath(rows: pl.DataFrame) -> float | None:
    """Largest |model - native| fast-path fraction difference in percentage points."""
    n = _ok(rows).filter((pl.col("target") == "native")
                         & pl.col("field").is_in(list(NATIVE_FASTPATH_FIELDS)))
    if n.is_empty():
        return None
    return float((n["predicted"] - n["measured"]).abs().max())


def pairs(rows: pl.DataFrame, tasks: list[dict], workload: set[str]) -> list[dict]:
    """One entry per task: its pair, status and per-pair figures (memory: the workload's
    caches, ``mem_*``, and every driven cache, ``mem_all_*``)."""
    out = []
    mem = {(r["candidate"], r["topology"]): r
           for r in memory_pairs(rows, workload).iter_rows(named=True)}
    alld = {(r["candidate"], r["topology"]): r for r in memory_pairs(rows).iter_rows(named=True)}
    for t in tasks:
        r = rows.filter(pl.col("task") == t["task"])
        first = r.row(0, named=True) if r.height else {}
        s = r.filter(pl.col("comparable") & pl.col("field").is_in(list(STRUCTURAL_FIELDS)))
        e: dict[str, Any] = {
            "task": t["task"], "candidate": t["candidate"], "topology": t["topology"],
            "target": t["target"], "status": first.get("status", t["status"]),
            "accelerator": first.get("accelerator"), "attempts": first.get("attempts"),
            "structural_matched": int((s["predicted"] == s["measured"]).sum()) if s.height else 0,
            "structural_total": s.height,
        }
        if t["target"] == "guest" and (t["candidate"], t["topology"]) in mem:
            m = mem[(t["candidate"], t["topology"])]
            e.update(mem_predicted=m["mem_predicted"], mem_measured=m["mem_measured"],
                     mem_caches=m["mem_caches"], mem_rel_err=m["mem_rel_err"],
                     mem_signed_err=m["mem_signed_err"])
        if t["target"] == "guest" and (t["candidate"], t["topology"]) in alld:
            a = alld[(t["candidate"], t["topology"])]
            e.update(mem_all_predicted=a["mem_predicted"], mem_all_measured=a["mem_measured"],
                     mem_all_caches=a["mem_caches"], mem_all_rel_err=a["mem_rel_err"])
        for field, key in ((COST_FIELD, "cost"), (NATIVE_COST_FIELD, "cost"),
                           (uml.UML_FIELD, "cost")):
            c = r.filter(pl.col("field") == field)
            if c.height:
                e[f"{key}_predicted"] = c["predicted"][0]
                e["time_measured"] = c["measured"][0]
                e["time_counts"] = bool(c["comparable"][0])
        if e["status"] == "failed":
            e["error"] = first.get("error") or t.get("error")
            e["console_tail"] = (first.get("console_tail") or "")[-1000:]
        out.append(e)
    return out


def report(run, repredict: bool = False, cost: str | None = None) -> dict:
    """The report of a validation run (a :class:`slabtune.results.store.Run`).  With
    ``repredict`` the uml rows' predictions are computed again by today's model (under the
    cost table in force, or the cost file ``cost``) from the documents stored with the run
    (:func:`slabtune.validate.uml.repredict`; imports JAX), beside the stored times."""
    if not is_validate_run(run):
        raise SlabtuneError(f"run: {run.path} is not a validation run")
    rows = run.collect()
    if rows.is_empty():
        rows = pl.DataFrame(schema=ROW_SCHEMA)
    if repredict:
        rows = uml.repredict(run, rows, cost)
    tasks = task_table(run)
    g = structural(rows, "guest")
    h = structural(rows, "host")
    wl = workload_caches(run.manifest.get("spec_text"))
    mem = memory(rows, wl)
    sp = speed(rows, memoryless_topologies(run.manifest.get("spec_text")),
               rig_resolution(run.manifest.get("native_rig")))
    rig = rig_summary(run.manifest.get("native_rig"))
    failed = [t for t in tasks if t["status"] == "failed"]
    accels = sorted(set(rows.filter(pl.col("target") == "guest")["accelerator"].drop_nulls()))
    return {
        "run_dir": str(run.path),
        "run_id": run.run_id,
        "complete": run.complete,
        "tasks": len(tasks),
        "failed": len(failed),
        "pending": sum(1 for t in tasks if t["state"] != "done"),
        "candidates": [c["id"] for c in run.manifest["spec"].get("candidates", [])],
        "topologies": run.manifest["spec"].get("topologies", []),
        "targets": run.manifest["spec"].get("targets", []),
        "guest_accelerators": accels,
        "structural_match_rate": g["rate"],
        "structural": {"guest": g, "host": h},
        "median_mem_rel_err": mem["median_rel_err"],
        "memory_pairs": mem["pairs"],
        "median_mem_rel_err_per_cache": mem["per_cache_median_rel_err"],
        "memory": mem,
        "spearman_time": sp["spearman_time"],
        "speed_source": sp["speed_source"],
        "speed": sp,
        "native_fastpath_max_abs_diff_pp": native_fastpath(rows),
        "native_rig": rig,
        "sources": {
            "structural_match_rate": "guest /sys/kernel/slab before the workload vs "
                                     "tuner.check.predict_boot (guest kernel profile, boot params)",
            "median_mem_rel_err": "guest after-dump slabs << order of the caches the spec's "
                                  "workload names (kmalloc-N also as kmalloc-cg-N) that moved "
                                  "between the before and after dumps vs "
                                  "tuner.objectives.structural_memory (state drained) around "
                                  "the objects allocated then (the flushed dump's objects)",
            "memory.all_driven": "secondary: the same over every cache whose objects moved "
                                 "between the dumps, caches outside the workload bounded by "
                                 "the traffic the dumps show",
            "spearman_time": {"native": "native allocator: median ns spent inside its "
                                        "allocator calls per alloc+free pair (interleaved "
                                        "runs, threads on one CPU) vs the model's ns per "
                                        "pair for the binary's configuration under the rig "
                                        "cost table (no line costs, no queueing; constants "
                                        "fitted on calibration runs of other "
                                        "configurations, native_rig)",
                              "native-before-rig": "native allocator: median ns spent "
                                                   "inside its allocator calls per "
                                                   "alloc+free pair vs the model's ns per "
                                                   "pair under the packaged cost table (a "
                                                   "run stored before the rig cost table)",
                              "uml": uml.SOURCE_TEXT,
                              "guest-kvm": "guest workload wall time under KVM vs modelled ns/op",
                              None: "no comparable timings (guest timings under TCG do not "
                                    "count and no native run)"}[
                "native-before-rig" if sp["speed_source"] == "native" and rig is None
                else sp["speed_source"]],
            "native_fastpath_max_abs_diff_pp": "native allocator counters (lockstep run) vs "
                                               "the model's dynamics counters",
        },
        "lab": lab_part(rows),
        "skipped_targets": dict(run.manifest["spec"].get("skipped_targets") or {}),
        "uml": {**uml.summary(rows, run.manifest), "repredicted": repredict},
        "failed_tasks": [{k: t[k] for k in ("task", "candidate", "topology", "target", "error")}
                         for t in failed],
        "pairs": pairs(rows, tasks, wl),
    }


#: What the lab cannot compare on the SLAB kernel, and why (kernel/lab_boot.py
#: measure_slab()): without CONFIG_DEBUG_SLAB, mm/slab.c keeps no allocation hit/miss or
#: grown counts and /proc/slabinfo has no statistics columns.
SLAB_NOT_COMPARED = {
    "alloc_fastpath_frac": "no CONFIG_DEBUG_SLAB statistics in the lab's SLAB build",
    "free_fastpath_frac": "no CONFIG_DEBUG_SLAB statistics in the lab's SLAB build",
    "slab_allocs_per_kop": "no CONFIG_DEBUG_SLAB statistics in the lab's SLAB build",
}


def lab_part(rows: pl.DataFrame) -> dict:
    """The lab summary (:func:`slabtune.validate.lab.summary`) with each kernel's
    ``allocator`` (SLUB or SLAB, from its profile).  A SLAB kernel's entry keeps the figures
    compared there (memory, active objects; the /proc/slabinfo structure beside them),
    lists them under ``compared``, and names what is not compared with the reason
    (``not_compared``, :data:`SLAB_NOT_COMPARED`); its ``pairs`` hold each (candidate,
    topology)'s predicted and measured memory and active objects and its structure count."""
    from slabtune.model import profiles

    s = lab_summary(rows)
    for k in s["by_kernel"]:
        if k["profile"] not in profiles.SLAB_PROFILES:
            k["allocator"] = "SLUB"
            continue
        k["allocator"] = "SLAB"
        k["not_compared"] = {f: SLAB_NOT_COMPARED[f] for f in k["figures"]
                             if f in SLAB_NOT_COMPARED}
        k["figures"] = {f: v for f, v in k["figures"].items() if f not in SLAB_NOT_COMPARED}
        k["compared"] = [*k["figures"], "structure"]
        k["pairs"] = _slab_pairs(rows.filter((pl.col("target") == "lab")
                                             & (pl.col("kernel") == k["kernel"])
                                             & (pl.col("status") == "ok")))
    return s


def _slab_pairs(g: pl.DataFrame) -> list[dict]:
    """Per (candidate, topology) of one SLAB kernel's lab rows: predicted and measured
    ``memory_bytes`` and ``active_objects``, and /proc/slabinfo structure fields matched."""
    out = []
    for (cand, topo), p in sorted(g.group_by(["candidate", "topology"]),
                                  key=lambda kv: (str(kv[0][0]), str(kv[0][1]))):
        rec: dict[str, Any] = {"candidate": cand, "topology": topo}
        for f in ("memory_bytes", "active_objects"):
            sel = p.filter(pl.col("field") == f)
            rec[f] = ({"predicted": sel["predicted"][0], "measured": sel["measured"][0]}
                      if sel.height else None)
        st = p.filter(pl.col("field").str.starts_with("slabinfo."))
        rec["structure"] = {"matched": int((st["measured"] == st["predicted"]).sum()),
                            "compared": st.height}
        out.append(rec)
    return out


def format_lab(s: Mapping[str, Any]) -> list[str]:
    """Text lines of :func:`lab_part`: the SLUB kernels as
    :func:`slabtune.validate.lab.format_summary` prints them, then each SLAB kernel
    labelled with its allocator, what was compared and what not, and its pairs."""
    slub = {**s, "by_kernel": [k for k in s["by_kernel"] if k.get("allocator") != "SLAB"]}
    lines = format_lab_summary(slub)
    for k in s["by_kernel"]:
        if k.get("allocator") != "SLAB":
            continue
        figs = "; ".join(
            f"{f} {100 * v['median']:.0f}% / {100 * v['worst']:.0f}%" if "median" in v
            else f"{f} -" for f, v in k["figures"].items())
        st = k["structure"]
        lines.append(f"  {k['kernel']} (allocator SLAB, profile {k['profile']}, {k['runs']} "
                     f"runs): compared {figs}; /proc/slabinfo structure {st['matched']} of "
                     f"{st['compared']} exact")
        why = sorted(set(k["not_compared"].values()))
        if k["not_compared"]:
            lines.append(f"    not compared: {', '.join(k['not_compared'])} ({'; '.join(why)})")
        for p in k["pairs"]:
            parts = []
            for f, label, scale, unit in (("memory_bytes", "memory", 1024.0, " KiB"),
                                          ("active_objects", "active objects", 1.0, "")):
                v = p[f]
                if v is not None:
                    parts.append(f"{label} " + " / ".join(
                        "n/a" if x is None else f"{x / scale:.1f}{unit}"
                        for x in (v["predicted"], v["measured"])))
            parts.append(f"structure {p['structure']['matched']} of "
                         f"{p['structure']['compared']}")
            lines.append(f"    {p['candidate']} {p['topology']}: predicted / measured "
                         + "; ".join(parts))
    return lines


def format_rig(rig: dict | None) -> list[str]:
    """Text lines of :func:`rig_summary`."""
    if not rig:
        return []
    if rig.get("constants") is None:
        return [f"  rig cost table: none ({rig.get('error')})"]
    se = rig.get("stderr") or {}
    consts = ", ".join(f"{k} {v:.1f}" + (f" +- {se[k]:.1f}" if k in se else "")
                       for k, v in rig["constants"].items() if k in (rig["fitted_constants"] or []))
    out = [f"  rig cost table (native figure): R^2 {_fmt(rig['r2'])} over {rig['runs']} "
           f"calibration runs of other configurations ({rig['table']}; fitted rank "
           f"{rig['rank']} of {len(rig['fitted_constants'])}; pairs outside the "
           f"calibration span {_fmt(rig.get('pairs_outside_span'))})",
           f"    ns: {consts}"]
    if rig.get("not_identified"):
        out.append(f"    not identified (no calibration run exercises them, 0): "
                   f"{', '.join(rig['not_identified'])}")
    if rig.get("aliased"):
        out.append("    aliased (fitted as one, the first carries both): "
                   + ", ".join(f"{k} with {v}" for k, v in rig["aliased"].items()))
    for c in rig["calibration"]:
        eff = c.get("effective") or []
        out.append(f"    calibration {c['topology']:<16} "
                   + " ".join(f"{k}={v}" for k, v in sorted(c["params"].items()))
                   + (f" (order {eff[1]}, {eff[2]} objs)" if len(eff) > 2 else "")
                   + f": measured {_fmt(c['measured'])} fitted {_fmt(c['fitted'])}"
                   + (f" error {c['error']}" if c.get("error") else ""))
    return out


def _fmt(x: float | None, pct: bool = False) -> str:
    if x is None:
        return "n/a"
    return f"{100 * x:.1f}%" if pct else f"{x:.3f}"


def format_report(rep: dict) -> str:
    """Plain-text report."""
    g, h = rep["structural"]["guest"], rep["structural"]["host"]
    sp = rep["speed"]
    lines = [
        f"validation run {rep['run_id']}: {rep['tasks']} tasks, {rep['failed']} failed"
        + (f", {rep['pending']} pending" if rep["pending"] else "") + "; "
        f"targets {', '.join(rep['targets'])}; guest accelerator "
        f"{', '.join(rep['guest_accelerators']) or '-'}",
        f"structural (guest snapshots): {g['matched']}/{g['total']} fields match "
        f"({_fmt(g['rate'], True)}); host: {h['matched']}/{h['total']} ({_fmt(h['rate'], True)})",
        f"memory (guest, {rep['memory_pairs']} pairs, the workload's caches "
        f"{','.join(rep['memory']['workload_caches_with_rows']) or '-'}): median relative "
        f"error {_fmt(rep['median_mem_rel_err'], True)} (per cache: "
        f"{_fmt(rep['median_mem_rel_err_per_cache'], True)})",
    ]
    mem = rep["memory"]
    al = mem["all_driven"]

    def signed(label: str, d: dict | None) -> None:
        if d:
            lines.append(f"  memory signed error, {label}: min {_fmt(d['min'], True)} q1 "
                         f"{_fmt(d['q1'], True)} median {_fmt(d['median'], True)} q3 "
                         f"{_fmt(d['q3'], True)} max {_fmt(d['max'], True)} ({d['n']} pairs)")

    signed("workload caches", mem["signed_err"])
    lines.append(f"  (secondary, not the figure: every driven cache, {al['pairs']} pairs: median "
                 f"relative error {_fmt(al['median_rel_err'], True)}, per cache "
                 f"{_fmt(al['per_cache_median_rel_err'], True)})")
    signed("every driven cache", al["signed_err"])
    for p in mem["pairs_without_workload_caches"]:
        lines.append(f"  pair without a workload cache row: {p['candidate']} {p['topology']}")
    lines.append(f"speed: Spearman {_fmt(rep['spearman_time'])} over {sp['pairs']} pairs, "
                 f"source {rep['speed_source'] or 'none'} ({rep['sources']['spearman_time']})")
    if sp.get("spearman_ceiling") is not None:
        lines.append(f"  ({sp['distinct_predictions']} distinct predictions over {sp['pairs']} "
                     f"pairs: ties cap any measured order at Spearman "
                     f"{_fmt(sp['spearman_ceiling'])})")
    lab = sp.get("native_labelled")
    if lab:
        lines.append(
            f"  (labelled, not the figure: without memoryless topologies "
            f"{','.join(lab['memoryless_topologies']) or '-'}: Spearman "
            f"{_fmt(lab['without_memoryless']['spearman'])} over "
            f"{lab['without_memoryless']['pairs']} pairs; model with the packaged (server) "
            f"cost table: {_fmt(lab.get('packaged_constants', {}).get('spearman'))}, without "
            "memoryless "
            f"{_fmt(lab.get('packaged_constants_without_memoryless', {}).get('spearman'))}; "
            f"with prior cost constants: "
            f"{_fmt(lab['prior_constants']['spearman'])}, without memoryless "
            f"{_fmt(lab['prior_constants_without_memoryless']['spearman'])})")
        tw = lab.get("ties_within_noise")
        if tw:
            lines.append(f"  (labelled, not the figure: predictions closer than the rig's repeat "
                         f"noise, {tw['resolution_ns']:.3f} ns (median standard error of the "
                         f"calibration runs), as ties: {tw['groups']} groups, Spearman "
                         f"{_fmt(tw['spearman'])})")
    nac = sp.get("native_arithmetic_check")
    if nac:
        lines.append(f"  (beside it, labelled: {nac['label']}: Spearman {_fmt(nac['spearman'])} "
                     f"over {nac['pairs']} pairs)")
    lines.extend(format_rig(rep.get("native_rig")))
    if sp["guest_tcg_pairs"]:
        lines.append(f"  (guest TCG timings, not counted: Spearman "
                     f"{_fmt(sp['guest_tcg_spearman_not_counted'])} over "
                     f"{sp['guest_tcg_pairs']} pairs)")
    fastpath = rep["native_fastpath_max_abs_diff_pp"]
    lines.append(f"native fast path: max |model - native| "
                 f"{'n/a' if fastpath is None else format(fastpath, '.2f') + ' pp'} (the "
                 "native allocator checks the model's arithmetic, not the kernel)")
    for t, why in rep.get("skipped_targets", {}).items():
        lines.append(f"target {t} skipped: {why}")
    lines.extend(format_lab(rep["lab"]))
    lines.extend(uml.format_summary(rep["uml"]))
    for m in g["mismatch_list"][:20]:
        lines.append(f"  mismatch {m['candidate']} {m['topology']} {m['cache']} {m['field']}: "
                     f"kernel {m['measured']} model {m['predicted']}")
    lines.append("")
    lines.append(f"{'candidate':<14} {'topology':<16} {'target':<7} {'status':<7} "
                 f"{'struct':>9} {'mem err':>8} {'mem all':>8} {'cost ns':>8} {'measured':>8}")
    for p in rep["pairs"]:
        st = f"{p['structural_matched']}/{p['structural_total']}"
        lines.append(f"{p['candidate']!s:<14} {p['topology']!s:<16} {p['target']!s:<7} "
                     f"{p['status']!s:<7} {st:>9} {_fmt(p.get('mem_rel_err'), True):>8} "
                     f"{_fmt(p.get('mem_all_rel_err'), True):>8} "
                     f"{_fmt(p.get('cost_predicted')):>8} {_fmt(p.get('time_measured')):>8}")
    for f in rep["failed_tasks"]:
        lines.append(f"failed task {f['task']} ({f['candidate']}, {f['topology']}, "
                     f"{f['target']}): {f['error']}")
    return "\n".join(lines)

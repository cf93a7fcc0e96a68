"""The guest and host validation tasks: boot or read a real kernel, and turn its dumps into
rows beside the model's predictions (structure, slab memory, cost).
"""


from __future__ import annotations

import json
import math
import os
import statistics
import time
from collections.abc import Mapping, Sequence

import polars as pl

from slabtune.errors import SlabtuneError
from slabtune.model import bootparams, profiles
from slabtune.validate.candidates import Candidate
from slabtune.validate.predict import (
    dump_traffic,
    live_objects,
    predicted_cost,
    predicted_slab_bytes,
)
from slabtune.validate.schema import (
    COST_FIELD,
    MEMORY_FIELD,
    STRUCTURAL_FIELDS,
    failed_rows,
    row,
)
from slabtune.validate.spec import parse_spec


def structural_rows(task: dict, df: pl.DataFrame, common: dict) -> tuple[list[dict], dict]:
    """Predicted beside measured structural fields for every cache of a one-boot snapshot.
    Returns the rows and facts about the boot (profile, params, topology)."""
    from slabtune.kernel import check, snapshot
    from slabtune.kernel.host import topology_from_lists

    df = df.select([c for c in df.columns if c not in ("phase", "accelerator")])
    res = check.check_snapshot(df)
    boot = res.boots[0]
    df = snapshot.validate_snapshot(df, "validate")
    first = df.row(0, named=True)
    topo, _ = topology_from_lists(first["cpus_possible"], first["cpus_present"],
                                  first["cpus_online"], first["nodes_with_memory"],
                                  first["nodes_with_cpu"])
    prof = profiles.get_profile(boot.profile)
    names = df["cache"].to_list()
    pred = check.predict_boot(df["slab_size"].to_numpy(), names, topo, prof, boot.params)
    aside = {n.cache: n.reason for n in res.not_comparable}
    rows = []
    for i, r in enumerate(df.iter_rows(named=True)):
        for f in STRUCTURAL_FIELDS:
            if r[f] is None:
                continue
            rows.append(row(task, **common, kernel_release=boot.kernel_release,
                             profile=boot.profile, cache=r["cache"], field=f,
                             predicted=float(pred[f][i]), measured=float(r[f]), unit="count",
                             comparable=r["cache"] not in aside, note=aside.get(r["cache"])))
    # the rows must agree with kernel check's own verdict
    mism = sum(1 for x in rows if x["comparable"] and x["predicted"] != x["measured"])
    if mism != len(res.mismatches):
        raise SlabtuneError(f"validate: {mism} row mismatches but kernel check found "
                            f"{len(res.mismatches)}")
    facts = {"profile": prof, "params": boot.params, "topology": topo, "aside": aside,
             "release": boot.kernel_release}
    return rows, facts


def memory_rows(task: dict, before: pl.DataFrame, after: pl.DataFrame, facts: dict,
                common: dict, boot: Mapping[str, int],
                flushed: pl.DataFrame | None = None,
                churned: set[str] | frozenset = frozenset()) -> list[dict]:
    """Predicted beside measured slab bytes of the caches the workload drove: measured is
    the after-dump's ``slabs << order`` pages (every slab the cache holds: full, node
    partial, CPU and per-CPU partial), predicted the structural memory model at the end of
    a workload around the objects really allocated then (:func:`live_objects`), so the free
    objects retained on per-CPU slabs are counted once, by the model's own per-CPU terms.

    The caches in ``churned`` (the spec's workload caches,
    :func:`slabtune.validate.report.workload_caches`) are
    predicted as churned on every CPU; every other driven cache has its retained slabs
    bounded by the traffic the dumps show (:func:`dump_traffic`), so a cache the workload
    touches a little is not predicted as if every CPU had churned it."""
    from slabtune.kernel import check
    from slabtune.model.caches import CacheInfo

    j = before.join(after, on="cache", suffix="_after")
    driven = j.filter(((pl.col("objects") != pl.col("objects_after"))
                       | (pl.col("total_objects") != pl.col("total_objects_after")))
                      & pl.col("slabs_after").is_not_null()
                      & (pl.col("order") == pl.col("order_after")))
    driven = driven.filter(~pl.col("cache").is_in(list(facts["aside"])))
    if driven.is_empty():
        return []
    rows_in = driven.sort("cache").to_dicts()
    fl = ({r["cache"]: r for r in flushed.select("cache", "objects").iter_rows(named=True)}
          if flushed is not None else {})
    infos = [CacheInfo(r["cache"], int(r["object_size"]), int(r["slab_size"]),
                       is_kmalloc=check.is_kmalloc(r["cache"]), early=check.is_early(r["cache"]),
                       is_bootstrap=check.is_bootstrap(r["cache"])) for r in rows_in]
    live = [live_objects({"objects": r["objects_after"]}, fl.get(r["cache"])) for r in rows_in]
    traffic = [math.inf if r["cache"] in churned else float(dump_traffic(
        r, {"objects": r["objects_after"], "total_objects": r["total_objects_after"]}))
        for r in rows_in]
    pred = predicted_slab_bytes(facts["profile"], facts["topology"], boot, infos,
                                [n for n, _ in live], traffic)
    out = []
    for r, p, (n, src), tr in zip(rows_in, pred, live, traffic):
        meas = float(r["slabs_after"]) * float(profiles.PAGE_SIZE << int(r["order_after"]))
        how = ("workload cache, churned on every CPU" if math.isinf(tr)
               else f"traffic >= {int(tr)} objects (dumps)")
        out.append(row(task, **common, kernel_release=facts["release"],
                        profile=facts["profile"].name, cache=r["cache"], field=MEMORY_FIELD,
                        predicted=float(p), measured=meas, unit="bytes", comparable=True,
                        note=f"live objects {n} ({src}); {how}; before-dump objects "
                             f"{int(r['objects'] or 0)}, total {int(r['total_objects'] or 0)}; "
                             f"after-dump objects {int(r['objects_after'] or 0)}, total "
                             f"{int(r['total_objects_after'] or 0)}, node partial slabs "
                             f"{_count(r.get('partial_after'))}, slabs {int(r['slabs_after'])}"))
    return out


def _count(v) -> str:
    return "?" if v is None else str(int(v))


def median_over_boots(per_boot: Sequence[list[dict]], boots: int) -> list[dict]:
    """One slab-memory row per cache from the memory rows of several boots of one pair:
    measured and predicted are the medians over the boots that drove the cache (a guest's
    retained slabs move by tens of percent from boot to boot: which CPU each hackbench
    task ran on, and when, decides which per-CPU lists and node lists end up holding the
    slabs).  ``boots`` is how many were asked for.  With one boot the rows are returned as
    they are."""
    if len(per_boot) == 1 and boots == 1:
        return list(per_boot[0])
    by_cache: dict[str, list[dict]] = {}
    for rows in per_boot:
        for r in rows:
            by_cache.setdefault(r["cache"], []).append(r)
    out = []
    for cache in sorted(by_cache):
        rs = by_cache[cache]
        meas = [r["measured"] for r in rs]
        out.append({**rs[0], "measured": float(statistics.median(meas)),
                    "predicted": float(statistics.median(r["predicted"] for r in rs)),
                    "note": f"median of {len(rs)} of {boots} boots (measured "
                            + ", ".join(f"{m:.0f}" for m in meas) + "); first boot: "
                            + str(rs[0]["note"])})
    return out


def run_guest_task(task: dict) -> list[dict]:
    """Boot ``[validate] boots`` guests for a (candidate, topology) and return its rows:
    structural rows from the first good boot (the structure is fixed by the kernel, its
    boot parameters and the topology), slab memory as the median over the good boots
    (:func:`median_over_boots`), the guest's workload time as the median wall time.  The
    pair fails only when no boot succeeds."""
    from slabtune.kernel import guest
    from slabtune.validate.report import workload_caches

    spec = parse_spec(task["spec_text"], task["spec_name"])
    cand = Candidate.from_json(task["candidate"])
    topo = spec.topology(task["topology"])
    assets = guest.find_assets()
    prof = guest.kernel_profile(assets.kernel)
    boot = bootparams.validate_params(dict(cand.boot), prof)
    gs = guest.GuestSpec(topology=topo, boot_params=boot, workloads=spec.workloads,
                     memory_mib=spec.memory_mib,
                     timeout_s=float(task.get("timeout_s") or spec.timeout_s),
                     retries=spec.retries, accel=spec.accel)
    results = [guest.boot_guest(gs, assets) for _ in range(spec.boots)]
    good = [r for r in results if r.ok]
    attempts = sum(r.attempts for r in results)
    seconds = sum(r.total_seconds for r in results)
    if not good:
        r = results[0]
        return failed_rows(task, r.error, r.console_tail, attempts, seconds, r.accelerator)
    r = good[0]
    applied = json.dumps({"boot": boot, "not_applied": dict(cand.knobs)}, sort_keys=True)
    common = {"accelerator": r.accelerator, "attempts": attempts, "seconds": seconds,
              "applied": applied}
    rows, facts = structural_rows(task, r.before, common)
    churned = workload_caches(task["spec_text"])
    rows += median_over_boots([memory_rows(task, g.before, g.after, facts, common, boot,
                                           g.flushed, churned=churned) for g in good],
                              spec.boots)
    walls = [sum(float(w.get("wall_s") or 0.0) for w in g.workloads) for g in good]
    wall = statistics.median(walls)
    if r.workloads and wall > 0:
        cost = predicted_cost(facts["profile"], task["spec_text"], task["topology"], boot)
        rows.append(row(task, **common, kernel_release=facts["release"],
                         profile=facts["profile"].name, field=COST_FIELD, predicted=cost,
                         measured=wall, unit="predicted ns/op; measured workload s",
                         comparable=r.accelerator == "kvm",
                         note=None if r.accelerator == "kvm" else
                         "TCG: guest timing is an emulation artefact"))
    return rows


def run_host_task(task: dict) -> list[dict]:
    """Snapshot this machine's running kernel and compare it with the model."""
    from slabtune.kernel.host import take_snapshot

    t0 = time.monotonic()
    df = take_snapshot("/")
    common = {"accelerator": "host", "attempts": 1, "seconds": time.monotonic() - t0,
              "applied": json.dumps({"boot": "the host's own command line"})}
    rows, _ = structural_rows(task, df, common)
    return rows


def run_lab_task(task: dict) -> list[dict]:
    """The lab target (validate/lab.py run_validate_task)."""
    from slabtune.validate.lab import run_validate_task

    return run_validate_task(task)


_RUNNERS = {"guest": run_guest_task, "host": run_host_task, "lab": run_lab_task}


def run_task(task: dict) -> dict:
    """Body of one Ray task: run it, return ``{"index", "rows", "failed"}``.

    A SlabtuneError (bad configuration on this node, a guest that did not complete after
    its reboots) is a failed task with its message; OSError and subprocess errors propagate
    so that Ray retries the task.
    """
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    t0 = time.monotonic()
    try:
        rows = _RUNNERS[task["target"]](task)
    except SlabtuneError as err:
        rows = failed_rows(task, str(err), seconds=time.monotonic() - t0)
    failed = any(r["status"] == "failed" for r in rows)
    return {"index": task["index"], "rows": rows, "failed": failed, "pid": os.getpid(),
            "host": os.uname().nodename}

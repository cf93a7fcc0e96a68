"""The unit and meaning of every column slabtune stores, and how the parquet files carry them.

Three stores write parquet: sweep runs (axis columns, then metrics), validation and lab runs
(one row per measured quantity, :data:`slabtune.validate.schema.ROW_SCHEMA`), and ``results
export`` of a tune study (one row per trial).  Each column's unit and meaning are here once;
docs/SPECS.md ("Stored columns") shows the same table, and a test holds the two together.
Every part and export is written with them as arrow field metadata (keys ``unit`` and
``doc``: :func:`arrow_schema`), so a reader of the file alone (pyarrow, polars, DuckDB) finds
them.

Sweep axes and tune knobs: the boot axes are ``min_order``, ``max_order`` and
``min_objects``; tune spells the same boot parameters ``slub_min_order``,
``slub_max_order`` and ``slub_min_objects``.  :data:`ALIASES` maps each kernel name to its
axis, the sweep spec takes either spelling, and the column doc names both.

Imports nothing of slabtune (results may import only model).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping


@dataclasses.dataclass(frozen=True)
class Column:
    """One stored column: its unit (``-`` for names and flags) and what it holds."""

    unit: str
    doc: str


def _c(unit: str, doc: str) -> Column:
    return Column(unit, doc)


#: Sweep axis columns (docs/SPECS.md "Axes"): one per axis of the spec.
SWEEP_AXES: dict[str, Column] = {
    "cpus": _c("CPUs", "present (= online) CPUs"),
    "cpus_per_node": _c("CPUs", "CPUs on each node; present CPUs = nodes x this"),
    "nodes": _c("nodes", "NUMA nodes"),
    "memoryless_nodes": _c("nodes", "how many of the highest-numbered nodes have no memory"),
    "possible": _c("CPUs", "possible CPUs (nr_cpu_ids); 0: the same as cpus"),
    "cache": _c("-", "slab cache name"),
    "size": _c("bytes", "object stride of an anonymous cache created late in boot"),
    "profile": _c("-", "kernel profile (SLUB or SLAB)"),
    "min_order": _c("page order", "boot parameter slub_min_order (tune knob slub_min_order)"),
    "max_order": _c("page order", "boot parameter slub_max_order (tune knob slub_max_order)"),
    "min_objects": _c("objects", "boot parameter slub_min_objects, 0 unset (tune knob "
                                 "slub_min_objects) where the spec sweeps it; else the "
                                 "metric: the min_objects calculate_order() aimed at"),
    "explicit_sheaf": _c("objects", "sheaf capacity the cache's creator asks for; -1: the "
                                    "cache's own"),
    "workload": _c("-", "workload kind (dynamics)"),
    "live": _c("objects", "live objects per CPU (local, request_response)"),
    "burst": _c("objects", "allocations per burst (local)"),
    "alloc_prob_pct": _c("percent", "chance a step allocates (local)"),
    "depth": _c("objects", "queue depth (producer_consumer, block_io)"),
    "cross_node_pct": _c("percent", "share of messages to another node (producer_consumer)"),
    "threads": _c("threads", "server threads (request_response)"),
    "irq_free_pct": _c("percent", "share of frees in interrupt context (request_response)"),
    "completion_remote": _c("boolean", "completions on another CPU (block_io)"),
}

#: Sweep metric columns: the structure (model/policy.py Structure) and, with the dynamics
#: evaluator, model/metrics.py Metrics.  The metric ``min_objects`` shares its column name
#: with the boot axis (a spec that sweeps the axis leaves the metric out): its doc is the
#: axis's, which names both.
SWEEP_METRICS: dict[str, Column] = {
    "slab_size": _c("bytes", "object stride (sysfs slab_size)"),
    "nr_cpus": _c("CPUs", "the CPU count calculate_order() used"),
    "order": _c("page order", "slab order (a slab is 4096 << order bytes)"),
    "objs_per_slab": _c("objects", "objects per slab"),
    "leftover": _c("bytes", "unused bytes at the end of each slab"),
    "min_partial": _c("slabs", "empty slabs each node keeps on its partial list"),
    "cpu_partial": _c("objects", "per-CPU partial list limit (sysfs cpu_partial)"),
    "cpu_partial_slabs": _c("slabs", "per-CPU partial list limit in slabs"),
    "sheaf_capacity": _c("objects", "objects per sheaf; 0 without sheaves"),
    "alloc_fastpath_frac": _c("fraction", "allocations served by the per-CPU fast path"),
    "free_fastpath_frac": _c("fraction", "frees served by the per-CPU fast path"),
    "alloc_slowpath_per_kop": _c("per 1000 ops", "allocation slow paths"),
    "free_slowpath_per_kop": _c("per 1000 ops", "free slow paths"),
    "remote_frees_per_kop": _c("per 1000 ops", "frees of objects whose slab is on another "
                                               "node"),
    "slab_allocs_per_kop": _c("per 1000 ops", "slabs taken from the page allocator"),
    "slab_frees_per_kop": _c("per 1000 ops", "slabs given back to the page allocator"),
    "list_lock_per_kop": _c("per 1000 ops", "node list_lock acquisitions"),
    "list_lock_remote_per_kop": _c("per 1000 ops", "list_lock acquisitions of another "
                                                   "node's lock"),
    "barn_lock_per_kop": _c("per 1000 ops", "barn lock acquisitions"),
    "zone_lock_per_kop": _c("per 1000 ops", "page allocator zone lock acquisitions"),
    "list_lock_rho": _c("fraction", "utilisation of the busiest node's list_lock"),
    "barn_lock_rho": _c("fraction", "utilisation of the busiest barn lock"),
    "zone_lock_rho": _c("fraction", "utilisation of the zone lock"),
    "list_lock_wait_ns": _c("ns", "mean wait per list_lock acquisition"),
    "memory_bytes": _c("bytes", "slab memory held in all"),
    "live_bytes": _c("bytes", "bytes of live objects"),
    "inuse_slab_bytes": _c("bytes", "slab pages holding live objects"),
    "empty_kept_bytes": _c("bytes", "empty slabs kept on node partial lists"),
    "cpu_partial_bytes": _c("bytes", "slabs held on per-CPU partial lists"),
    "sheaf_bytes": _c("bytes", "objects parked in sheaves"),
    "barn_bytes": _c("bytes", "objects parked in barns"),
    "overhead_frac": _c("fraction", "memory_bytes / live_bytes - 1"),
    "ns_per_op": _c("ns per alloc+free pair", "modelled allocator time"),
    "total_ns_per_op": _c("ns per alloc+free pair", "modelled time with the workload's own "
                                                    "work"),
    "throughput_ops_per_us": _c("ops per us", "machine-wide allocator operations"),
    "alloc_throughput_per_us": _c("allocations per us", "machine-wide allocations"),
    "fixed_point_residual": _c("fraction", "largest relative error of the closed-queue "
                                           "fixed point (model/cost.py)"),
}

#: Validation and lab run columns (validate/schema.py ROW_SCHEMA).
VALIDATE_ROWS: dict[str, Column] = {
    "task": _c("-", "task number in the run's plan"),
    "candidate": _c("-", "candidate id (baseline: the kernel's defaults)"),
    "params": _c("-", "the candidate's boot parameters and knobs, JSON"),
    "applied": _c("-", "what the target applied, JSON"),
    "topology": _c("-", "topology name of the validation spec"),
    "target": _c("-", "guest, host, native, lab or uml"),
    "status": _c("-", "ok or failed"),
    "accelerator": _c("-", "kvm, tcg, lab-tcg ... (how the target ran)"),
    "kernel_release": _c("-", "uname -r of the kernel measured"),
    "profile": _c("-", "kernel profile the model used"),
    "cache": _c("-", "slab cache name"),
    "field": _c("-", "the quantity compared (order, slab_bytes, a SLUB_STATS counter ...)"),
    "predicted": _c("the row's unit", "the model's value of field"),
    "measured": _c("the row's unit", "the target's value of field"),
    "unit": _c("-", "unit of predicted and measured in this row"),
    "comparable": _c("boolean", "whether the row counts in the report"),
    "note": _c("-", "why a row is not comparable, or other remarks"),
    "attempts": _c("attempts", "tries the task took"),
    "seconds": _c("s", "wall time of the task"),
    "error": _c("-", "why a failed task failed"),
    "console_tail": _c("-", "last console lines of a failed boot"),
    "kernel": _c("-", "lab kernel name (scripts/build-kernels.sh)"),
    "config_hash": _c("-", "hash of the lab config"),
}

#: ``results export`` of a tune study (one row per trial).  Knob columns take the knob's
#: name; per-topology objectives are ``memory@TOPOLOGY`` and ``time@TOPOLOGY``.
STUDY_TRIALS: dict[str, Column] = {
    "trial": _c("-", "Optuna trial number"),
    "state": _c("-", "complete, fail, running, waiting or pruned"),
    "memory": _c("fraction", "fleet memory overhead: overhead bytes / live bytes, weighted "
                             "over the fleet"),
    "time": _c("ns per op", "modelled fleet time per allocator operation"),
    "feasible": _c("boolean", "no topology regresses past [objectives] max_regression "
                              "(no constraint: true)"),
    "regression_excess": _c("fraction", "largest regression over max_regression; <= 0 is "
                                        "feasible (null: no constraint)"),
    "pareto": _c("boolean", "on the study's Pareto front (Study.best_trials)"),
    "reach": _c("-", "what deploying it takes: default, boot, sysfs, boot+sysfs, slabinfo, "
                     "boot+slabinfo or kernel"),
    "not_steady": _c("-", "why a dynamics trial failed (points not in steady state)"),
}
#: Per-topology columns of a study export: prefix -> column of :data:`STUDY_TRIALS`.
STUDY_PER_TOPOLOGY = ("memory", "time")
#: Unit of each tune knob column (tuner/space.py KNOBS and SLAB_KNOBS).
KNOB_UNITS: dict[str, str] = {
    "slub_min_order": "page order", "slub_max_order": "page order",
    "slub_min_objects": "objects", "slub_nomerge": "boolean",
    "order_objects_mul": "factor", "order_objects_add": "count",
    "min_partial_divisor": "divisor", "min_partial_lo": "slabs", "min_partial_hi": "slabs",
    "cpu_partial_page": "objects", "cpu_partial_1k": "objects", "cpu_partial_256": "objects",
    "cpu_partial_small": "objects", "sheaf_page": "objects", "sheaf_1k": "objects",
    "sheaf_256": "objects", "sheaf_small": "objects", "barn_max_full": "sheaves",
    "barn_max_empty": "sheaves", "slab_max_order": "page order", "limit": "objects",
    "batchcount": "objects", "shared": "factor (x batchcount objects)",
}

#: Kernel boot-parameter names of the sweep boot axes: the sweep spec takes either.
ALIASES: dict[str, str] = {"slub_min_order": "min_order", "slub_max_order": "max_order",
                           "slub_min_objects": "min_objects"}

#: Each table by the docs/SPECS.md heading that shows it.
STORES: dict[str, Mapping[str, Column]] = {
    "Sweep axes": SWEEP_AXES, "Sweep metrics": SWEEP_METRICS,
    "Validation and lab rows": VALIDATE_ROWS, "Study export": STUDY_TRIALS,
}


def part_column(name: str) -> Column | None:
    """The doc of a run part's column: a sweep axis, a sweep metric or a validation row
    column (the stores share ``cache`` and ``profile``, which mean the same in each), or
    None."""
    return SWEEP_AXES.get(name) or SWEEP_METRICS.get(name) or VALIDATE_ROWS.get(name)


def study_column(name: str, knobs: Mapping[str, str] | None = None) -> Column | None:
    """The doc of a study export column: a fixed one, ``memory@T``/``time@T`` (topology
    T), or a knob (``knobs``: knob name -> what it sets)."""
    if name in STUDY_TRIALS:
        return STUDY_TRIALS[name]
    head, at, topo = name.partition("@")
    if at and head in STUDY_PER_TOPOLOGY:
        base = STUDY_TRIALS[head]
        return Column(base.unit, f"{base.doc.split(':')[0]} on topology {topo}")
    if knobs is not None and name in knobs:
        return Column(KNOB_UNITS[name], f"tune knob: {knobs[name]}")
    return None


def field_metadata(names: Iterable[str], lookup) -> dict[str, dict[str, str]]:
    """``{column: {"unit": ..., "doc": ...}}`` for every name ``lookup`` knows."""
    out = {}
    for n in names:
        col = lookup(n)
        if col is not None:
            out[n] = {"unit": col.unit, "doc": col.doc}
    return out


def arrow_schema(df, metadata: Mapping[str, Mapping[str, str]],
                 schema_metadata: Mapping[str, str] | None = None):
    """The arrow schema polars writes ``df`` with, each field carrying its ``metadata``
    entry (merged over what polars puts there, e.g. an Enum's categories), and the schema
    ``schema_metadata``."""
    import pyarrow as pa

    fields = []
    for f in df.head(0).to_arrow().schema:
        extra = {k.encode(): v.encode() for k, v in metadata.get(f.name, {}).items()}
        fields.append(f.with_metadata({**(f.metadata or {}), **extra}) if extra else f)
    return pa.schema(fields, metadata=dict(schema_metadata) if schema_metadata else None)

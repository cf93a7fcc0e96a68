"""The real-allocator lab: a simulation config (sweeps/simconfig.py) run by the lab module on
a kernel built from Debian's sources (``scripts/build-kernels.sh``), its SLUB_STATS counters
set beside the model's prediction of the same config.

One config drives both sides.  The kernel side boots the config's topology under qemu with
the config's slab boot parameters, writes its sysfs knobs (``min_partial``, ``cpu_partial``)
to the cache, or on the SLAB kernel its /proc/slabinfo tunables (:func:`slab_tunables`),
runs its ``[workload]`` on its ``[cache]`` with ``steps * ops_per_step`` ops per allocating
worker (:func:`slabtune.kernel.labmod.config_params`) and reads the cache's
counters (:func:`slabtune.kernel.lab_boot.measure`).  The model side simulates the same
config under the profile of the booted kernel (the config's own ``profile`` names the
machine it was written for; the lab kernel decides what runs), so one config on 6.1, 6.12
and 7.2 is predicted three times.

Every boot is one Ray task asking for the ``qemu`` resource (validate/dispatch.py), so on a
cluster whose workers offer it with KVM the runs use real cores; the accelerator
(``lab-tcg`` or ``lab-kvm``) goes with every row.  Under TCG the counters are functional
(every path the allocator takes is counted) but times are an emulation artefact: no time
is compared here.

The schedule (:data:`SCHEDULES`): ``free`` lets the module's workers run as fast as their
vCPUs go, a worker with nothing to do sleeping a tick; ``lockstep`` puts them on the
module's step barrier from the first step, one op or none each per step, for the
warm-up's steps and then the config's ``steps`` steps, the schedule the model simulates
(its warm-up too: the state the window starts from, the objects parked in barns above
all, is the schedule's as much as the allocator's).  A lockstep run's
accelerator label ends in ``-lockstep`` (``lab-tcg-lockstep``), so its rows never pool
with free-running ones unnoticed.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import os
import subprocess
import time
import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from slabtune.errors import SlabtuneError
from slabtune.sweeps.window import window_counters

#: The lab kernels with SLUB and SLUB_STATS (kernel/configs/kernels.tsv), in version order.
LAB_KERNELS = ("6.1", "6.12", "7.2")
#: The lab kernels with SLAB (CONFIG_SLAB, no SLUB_STATS, /proc/slabinfo without the
#: CONFIG_DEBUG_SLAB statistics columns).
SLAB_LAB_KERNELS = ("6.1-slab",)
#: How the module's workers are scheduled in the counted window (``lab run --schedule``).
SCHEDULES = ("free", "lockstep")
#: The figures compared for every run, with their units.
COMPARED: dict[str, str] = {
    "alloc_fastpath_frac": "fraction of allocations",
    "free_fastpath_frac": "fraction of frees",
    "slab_allocs_per_kop": "new slabs per 1000 ops",
    "memory_bytes": "bytes (mean over the run)",
}
#: Figures compared only on a SLAB kernel (kernel/lab_boot.py measure_slab()).
SLAB_COMPARED: dict[str, str] = {
    "active_objects": "objects not free on a node's lists (mean over the run)",
}
#: /proc/slabinfo columns set beside the SLAB model's structure (exact): slabinfo name ->
#: the model's row field.
SLABINFO_STRUCTURE: dict[str, str] = {
    "order": "order", "objs_per_slab": "objs_per_slab", "limit": "limit",
    "batchcount": "batchcount", "sharedfactor": "shared",
}
#: SLUB_STATS file -> (the model's Counters field, whether one model event moves a whole
#: sheaf: the kernel counts the objects, sheaf_refill/sheaf_flush are stat_add(n) in v7.x).
MODEL_COUNTERS: dict[str, tuple[str, bool]] = {
    "alloc_fastpath": ("alloc_fast", False),
    "alloc_slowpath": ("alloc_slow", False),
    "free_fastpath": ("free_fast", False),
    "free_slowpath": ("free_slow", False),
    "alloc_slab": ("slab_alloc", False),
    "free_slab": ("slab_free", False),
    "cpu_partial_drain": ("cpu_partial_drain", False),
    "barn_get": ("barn_get", False),
    "barn_get_fail": ("barn_get_fail", False),
    "barn_put": ("barn_put", False),
    "barn_put_fail": ("barn_put_fail", False),
    "sheaf_refill": ("sheaf_refill", True),
    "sheaf_flush": ("sheaf_flush", True),
}


@dataclasses.dataclass(frozen=True)
class LabConfig:
    """One checked simulation config for the lab."""

    name: str
    path: str
    text: str
    doc: dict
    config_hash: str

    def to_json(self) -> dict:
        return {"name": self.name, "path": self.path, "text": self.text}


def parse_config(text: str, name: str, path: str = "") -> LabConfig:
    """A simulation config checked for both sides: the model's parser
    (:func:`slabtune.sweeps.simconfig.parse_doc`), the lab module's mapping
    (:func:`slabtune.kernel.labmod.config_params`) and the knobs the lab can apply.  Every
    error is one line naming the file and the field."""
    from slabtune.kernel import lab_boot, labmod
    from slabtune.model import profiles
    from slabtune.sweeps import simconfig

    where = path or name
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise SlabtuneError(f"{where}: not valid TOML ({err})") from None
    try:
        spec = simconfig.parse_doc(doc)
        labmod.config_params(doc)
    except SlabtuneError as err:
        raise SlabtuneError(f"{where}: {err}") from None
    slab_run = profiles.is_slab(spec.profile)
    settable = lab_boot.SLABINFO_TUNABLES if slab_run else lab_boot.SYSFS_KNOBS
    for k in spec.knobs:
        if k not in settable:
            raise SlabtuneError(f"{where}: policy.params.{k}: a model knob the real kernel "
                                f"has no setting for (the lab applies boot parameters and "
                                f"{', '.join(settable)}; profile {spec.profile.name})")
    if spec.knobs and "name" not in doc["cache"]:
        raise SlabtuneError(f"{where}: policy.params.{next(iter(spec.knobs))}: the lab sets "
                            + ("/proc/slabinfo tunables" if slab_run else "sysfs values")
                            + " on kmalloc caches only")
    digest = hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:16]
    return LabConfig(name, path, text, doc, digest)


def config_from_doc(doc: Mapping[str, Any], name: str, path: str = "") -> LabConfig:
    """A :class:`LabConfig` of a document built in code (validate's pairs, a stored run's
    records)."""
    d = copy.deepcopy(dict(doc))
    digest = hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:16]
    return LabConfig(name, path, "", d, digest)


def is_slab_config(cfg: LabConfig) -> bool:
    """Whether a config names a SLAB profile (``[policy] profile = "slab-v6.1"``)."""
    from slabtune.model import profiles

    return cfg.doc["policy"]["profile"] in profiles.SLAB_PROFILES


def load_config(path: str | os.PathLike) -> LabConfig:
    """:func:`parse_config` of a file."""
    from slabtune.sweeps.spec import read_text_file

    p = Path(path)
    return parse_config(read_text_file(p, "CONFIG"), p.stem, str(p))


def resolve_kernels(names: Sequence[str] | None, slab: bool = False) -> list[str]:
    """``--kernel`` values checked (names of ``scripts/build-kernels.sh`` or bzImage
    paths); none given: every built lab kernel of :data:`LAB_KERNELS`, or with ``slab``
    (a SLAB profile's validation) of :data:`SLAB_LAB_KERNELS`."""
    from slabtune.kernel import build, lab_boot

    if names:
        for n in names:
            lab_boot.resolve_kernel(n)
        return list(dict.fromkeys(names))
    built = [k for k in (SLAB_LAB_KERNELS if slab else LAB_KERNELS)
             if build.kernel_path(k) is not None and build.build_tree(k) is not None]
    if not built:
        raise SlabtuneError(f"--kernel: no {'SLAB ' if slab else ''}lab kernel is built "
                            "here; build them with scripts/build-kernels.sh (about 27 min "
                            "on 2 cores)")
    return built


def kernel_profile(kernel: str):
    """The model profile of a lab kernel, from its bzImage's release: the SLAB profile of
    the lab's SLAB build (:func:`slabtune.kernel.guest.boot_profile`), else
    :func:`slabtune.model.profiles.detect_profile` (era rules included)."""
    from slabtune.kernel import guest, lab_boot

    path, _ = lab_boot.resolve_kernel(kernel)
    return as_built_for_x86(guest.boot_profile(path))


def release_profile(release: str):
    """The model profile of a stored record's kernel release (as :func:`kernel_profile`
    reads it from the bzImage)."""
    from slabtune.kernel import guest
    from slabtune.model import profiles, slab

    if release.endswith(guest.SLAB_RELEASE_SUFFIX):
        return as_built_for_x86(slab.detect_slab_profile(release))
    return profiles.detect_profile(release)


def as_built_for_x86(profile):
    """A profile as the lab's x86_64 kernels run it.

    SLAB's local node is numa_mem_id() (v2.6.35, "numa: slab: use numa_mem_id() for slab
    local memory node"), which differs from numa_node_id() only with
    CONFIG_HAVE_MEMORYLESS_NODES, and only ia64 and powerpc select that (arch/*/Kconfig of
    6.1; powerpc alone in 7.2).  On x86 a CPU of a memoryless node keeps that node as its
    local one, so the 2010 fix does not act: its refills cannot grow a slab there
    (__GFP_THISNODE), every allocation falls back to one object of node 0's lists and every
    free is an alien free, drained into node 0's shared array, which the fallback never
    reads.  Measured on the 6.1 SLAB lab kernel (local-4cpu-ml): 184 KiB held against
    64 KiB modelled with the fix and 184 KiB without it.  SLUB profiles are returned as
    they are (their ``memoryless_fallback`` is SLUB's behaviour on every architecture)."""
    from slabtune.model import profiles

    if profiles.is_slab(profile):
        return dataclasses.replace(profile, memoryless_fallback=False)
    return profile


# --------------------------------------------------------------------------- the model


def spec_for(doc: Mapping[str, Any], profile=None):
    """The config's :class:`~slabtune.sweeps.simconfig.SimSpec`, under ``profile`` (a
    KernelProfile, its knobs applied as the config's are) instead of the config's own."""
    from slabtune.model import profiles
    from slabtune.sweeps import simconfig

    spec = simconfig.parse_doc(copy.deepcopy(dict(doc)))
    if profile is not None:
        knobs = dict(spec.knobs)
        if profiles.is_slab(profile):
            # The booted kernel's architecture decides the numa_mem_id() switch
            # (:func:`as_built_for_x86`), not the config.
            knobs.pop("memoryless_fallback", None)
        spec = dataclasses.replace(spec, profile=simconfig.apply_knobs(profile, knobs))
    return spec


def predict(items: Sequence[tuple[Mapping[str, Any], Any]], cost=None,
            windows: Sequence[bool] | None = None,
            lockstep: Sequence[bool] | None = None) -> list[dict]:
    """The model's side of each (config document, KernelProfile or None) pair: the compared
    figures, ``ns_per_op`` (modelled ns per alloc+free pair), every counter of
    :data:`MODEL_COUNTERS` per 1000 ops (weighted over the representative CPUs as the
    metrics are), the structure, and the profile.  All over the lab's counted window: the
    config's ``steps`` after :func:`~slabtune.kernel.labmod.warmup_steps` of warm-up, as
    the kernel side counts them (:func:`window_counters`).  ``windows``: per item, False
    for the whole run from empty caches (a stored run measured before the lab had a
    warm-up); default all True.  ``lockstep``: per item, True for a run in the lockstep
    schedule, whose workers start their bursts together
    (:func:`slabtune.sweeps.simulate.bursts_together`); default all False (free-running
    CPUs drift apart, workloads.burst_phase_first)."""
    from slabtune.kernel import labmod
    from slabtune.sweeps import simconfig, simulate

    if cost is None:
        cost, _ = simconfig.load_cost(None)
    specs = [spec_for(d, prof) for d, prof in items]
    windows = [True] * len(specs) if windows is None else list(windows)
    warm = [labmod.warmup_steps(s.steps) if win else 0 for s, win in zip(specs, windows)]
    whole = [dataclasses.replace(s, steps=w + s.steps) for s, w in zip(specs, warm)]
    head = [dataclasses.replace(s, steps=max(w, 1)) for s, w in zip(specs, warm)]
    structs, cfgs, late = simulate.simulate_specs(whole, lockstep)
    _, _, early = simulate.simulate_specs(head, lockstep)
    counters = [c if w == 0 else window_counters(e, c, w, w + s.steps)
                for s, w, e, c in zip(specs, warm, early, late)]
    return _predicted(specs, structs, cfgs, counters, cost)


#: The SLAB model's events reported per 1000 ops on a SLAB kernel (none has a measured
#: counterpart there: the lab's SLAB build has no statistics).
SLAB_MODEL_COUNTERS = ("alloc_fast", "alloc_slow", "free_fast", "free_slow", "slab_alloc",
                       "slab_free", "refill_shared", "refill_slabs", "refill_grow",
                       "flush_shared", "flush_slabs", "alien_flush", "reap_drain")


def _predicted(specs, structs, cfgs, counters, cost) -> list[dict]:
    """:func:`predict`'s records of simulated counters.  A SLAB spec's record has the SLAB
    model's events by its own names, its structure as /proc/slabinfo shows it (order,
    objects per slab, limit, batchcount, shared) and ``active_objects``: the objects its
    CPUs hold (live) plus those parked in the per-CPU, shared and alien arrays, what
    /proc/slabinfo counts as active (mm/slab.c get_slabinfo())."""
    from slabtune.model import metrics
    from slabtune.sweeps import simulate

    rows = simulate.metrics_of(specs, structs, cfgs, counters, cost)
    out = []
    for spec, cfg, cnt, row in zip(specs, cfgs, counters, rows):
        rec = {**{k: row[k] for k in COMPARED}, "ns_per_op": float(row["ns_per_op"]),
               "profile": spec.profile.name}
        if simulate.is_slab_spec(spec):
            rec["structure"] = {k: row[k] for k in ("order", "objs_per_slab", "limit",
                                                    "batchcount", "shared")}
            rec["counters_per_kop"] = {
                name: float(metrics.per_kop(cnt, cfg.rep_weight, getattr(cnt, name)))
                for name in SLAB_MODEL_COUNTERS}
            size = float(spec.cache.object_size)
            rec["active_objects"] = (row["live_bytes"] + row["sheaf_bytes"]
                                     + row["barn_bytes"]) / size
        else:
            cap = int(row["sheaf_capacity"])
            rec["structure"] = {k: row[k] for k in ("order", "objs_per_slab", "min_partial",
                                                    "cpu_partial", "sheaf_capacity")}
            rec["counters_per_kop"] = {
                name: float(metrics.per_kop(cnt, cfg.rep_weight, getattr(cnt, field)))
                * (cap if per_sheaf else 1)
                for name, (field, per_sheaf) in MODEL_COUNTERS.items()}
            # the model's own list_lock sections (SLUB_STATS has no counter for them)
            rec["list_lock_per_kop"] = float(row["list_lock_per_kop"])
        out.append(rec)
    return out


# --------------------------------------------------------------------------- the kernel


def slab_tunables(spec) -> dict[str, int]:
    """The /proc/slabinfo line a SLAB spec's lab run writes, as the model runs it: the
    spec's tunables over the cache's own enable_cpucache() values on its topology
    (:func:`slabtune.sweeps.simulate.slab_structure_of`; the rule of
    :func:`slabtune.model.slab_dynamics.config_from` and of the result row's structure);
    all three, since slabinfo_write() takes one line of all three (6.1 mm/slab.c).  Empty
    when the spec sets none (the kernel keeps its own; nothing is written)."""
    from slabtune.model import slab
    from slabtune.sweeps import simulate

    given = {k: int(spec.knobs[k]) for k in slab.SLAB_TUNABLES if k in spec.knobs}
    if not given or not simulate.is_slab_spec(spec):
        return {}
    st = simulate.slab_structure_of(spec)
    own = {"limit": int(st.limit), "batchcount": int(st.batchcount), "shared": int(st.shared)}
    return {k: given.get(k, own[k]) for k in slab.SLAB_TUNABLES}


def boot_args(doc: Mapping[str, Any], profile=None) -> dict:
    """:func:`slabtune.kernel.lab_boot.boot_lab` keyword arguments of a config document:
    the config's ``steps * ops_per_step`` ops per allocating worker in the counted window,
    after a warm-up (:func:`slabtune.kernel.labmod.warmup_steps`); its SLUB knobs as
    ``sysfs`` values, or under a SLAB profile its tunables as the ``slabinfo`` line
    (:func:`slab_tunables`, the cache's own values resolved under ``profile``, the booted
    kernel's, as :func:`predict` resolves them)."""
    from slabtune.kernel import labmod
    from slabtune.sweeps import simconfig

    spec = simconfig.parse_doc(copy.deepcopy(dict(doc)))
    tunables = slab_tunables(spec_for(doc, profile) if profile is not None else spec)
    run = doc.get("run", {})
    return {"workload_doc": dict(doc["workload"]), "topology": spec.topology,
            "cache_doc": dict(doc["cache"]),
            "ops": int(run.get("steps", 2000)) * int(run.get("ops_per_step", 1)),
            "warmup": labmod.warmup_steps(int(run.get("steps", 2000)))
            * int(run.get("ops_per_step", 1)),
            "seed": int(run.get("seed", 0)), "boot_params": dict(spec.boot_given),
            "sysfs": {} if tunables else dict(spec.knobs), "slabinfo": tunables}


def blank_record(index: int, kernel: str, **kw) -> dict:
    """A boot record before (or instead of) a boot: not ok, nothing measured."""
    rec: dict[str, Any] = {"index": index, "kernel": kernel, "ok": False, "error": "",
                           "release": "", "accelerator": "", "attempts": 0, "seconds": 0.0,
                           "console_tail": "", "measured": None, "cmdline": "",
                           "module_params": [], "host": os.uname().nodename}
    rec.update(kw)
    return rec


def run_boot(task: Mapping[str, Any]) -> dict:
    """Body of one Ray task: boot ``task["kernel"]`` with ``task["doc"]`` and measure.
    A setup error or a failed guest is a record with ``ok`` false and the reason; OSError
    and subprocess errors propagate so Ray retries the task."""
    from slabtune.kernel import lab_boot

    t0 = time.monotonic()
    rec = blank_record(task["index"], task["kernel"])
    try:
        args = boot_args(task["doc"], kernel_profile(task["kernel"]))
        lockstep = task.get("schedule", "free") == "lockstep"
        r = lab_boot.boot_lab(task["kernel"], accel=task.get("accel", "auto"),
                              timeout_s=float(task.get("timeout_s") or
                                              lab_boot.DEFAULT_TIMEOUT_S),
                              lockstep=lockstep, **args)
    except SlabtuneError as err:
        rec.update(error=str(err), seconds=time.monotonic() - t0)
        return rec
    rec.update(ok=r.ok, error=r.error, release=r.release,
               accelerator=f"lab-{r.accel}" + ("-lockstep" if lockstep else ""),
               attempts=r.attempts, seconds=r.seconds, cmdline=r.cmdline,
               sysfs=dict(args["sysfs"]), slabinfo=dict(args["slabinfo"]),
               module_params=r.params, console_tail="" if r.ok else r.console_tail,
               measured=lab_boot.measure(r) if r.ok else None)
    return rec


def combine(rec: Mapping[str, Any], cfg: LabConfig, predicted: Mapping[str, Any]) -> dict:
    """The record ``lab run --json`` prints for one (config, kernel): ``kernel``,
    ``accelerator``, ``config``, ``measured`` and ``predicted``, each of the last two with
    the compared figures and ``counters`` (the kernel's SLUB_STATS deltas by name; the
    model's counterparts scaled to the measured op count)."""
    measured = rec.get("measured")
    ops = (measured or {}).get("ops") or 0
    pred = {k: predicted[k] for k in COMPARED}
    pred.update({k: predicted[k] for k in SLAB_COMPARED if k in predicted})
    pred["counters"] = ({k: v * ops / 1000.0 for k, v in predicted["counters_per_kop"].items()}
                        if ops else {})
    pred["counters_per_kop"] = dict(predicted["counters_per_kop"])
    pred["profile"] = predicted["profile"]
    pred["structure"] = dict(predicted["structure"])
    if measured is not None:
        measured = dict(measured)
        measured["counters_per_kop"] = ({k: 1000.0 * v / ops
                                         for k, v in measured["counters"].items()}
                                        if ops else {})
    return {
        "kernel": rec["kernel"], "release": rec.get("release", ""),
        "accelerator": rec.get("accelerator", ""), "ok": bool(rec.get("ok")),
        "error": rec.get("error", ""),
        "config": {"name": cfg.name, "path": cfg.path, "hash": cfg.config_hash,
                   "doc": cfg.doc},
        "profile": predicted["profile"], "attempts": rec.get("attempts", 0),
        "seconds": rec.get("seconds", 0.0), "cmdline": rec.get("cmdline", ""),
        "sysfs": dict(rec.get("sysfs") or {}), "slabinfo": dict(rec.get("slabinfo") or {}),
        "module_params": list(rec.get("module_params", [])),
        "measured": measured, "predicted": pred,
        "console_tail": rec.get("console_tail", ""),
    }


# --------------------------------------------------------------------------- rows


def topology_label(doc: Mapping[str, Any]) -> str:
    """``16cpu-4node``, ``4cpu-2node-ml1`` (memoryless nodes after ``ml``)."""
    t = doc["topology"]
    ml = t.get("memoryless_nodes", [])
    return (f"{t['cpus']}cpu-{t.get('nodes', 1)}node"
            + (f"-ml{','.join(str(n) for n in ml)}" if ml else ""))


def rows_of(record: Mapping[str, Any], base: Mapping[str, Any]) -> list[dict]:
    """Store rows (validate/schema.py ROW_SCHEMA) of one combined record: one per compared
    figure and one per counter either side has (``counters.<name>``, predicted None where
    the model has no counterpart); a failed run is one failed row with its console tail."""
    from slabtune.kernel.guest import CONSOLE_TAIL_CHARS
    from slabtune.validate.schema import ROW_SCHEMA, TASK_FIELD

    common = {k: None for k in ROW_SCHEMA}
    common.update(base)
    common.update(kernel=record["kernel"], kernel_release=record["release"],
                  accelerator=record["accelerator"] or None, profile=record["profile"],
                  config_hash=record["config"]["hash"], attempts=record["attempts"],
                  seconds=record["seconds"], applied=json.dumps(
                      {"cmdline": record["cmdline"], "module": record["module_params"],
                       "sysfs": record.get("sysfs", {}),
                       **({"slabinfo": record["slabinfo"]} if record.get("slabinfo")
                          else {})}),
                  target="lab")
    if not record["ok"]:
        return [{**common, "status": "failed", "field": TASK_FIELD,
                 "error": record["error"] or "failed", "comparable": False,
                 "console_tail": record.get("console_tail", "")[-CONSOLE_TAIL_CHARS:]}]
    m, p = record["measured"], record["predicted"]
    out = []
    for k, unit in COMPARED.items():
        out.append({**common, "status": "ok", "field": k, "measured": _num(m.get(k)),
                    "predicted": _num(p.get(k)), "unit": unit,
                    "comparable": m.get(k) is not None})
    for k, unit in SLAB_COMPARED.items():
        if k in m:
            out.append({**common, "status": "ok", "field": k, "measured": _num(m.get(k)),
                        "predicted": _num(p.get(k)), "unit": unit,
                        "comparable": m.get(k) is not None and p.get(k) is not None})
    for name, field in SLABINFO_STRUCTURE.items():
        if m.get("structure") and field in p.get("structure", {}):
            out.append({**common, "status": "ok", "field": f"slabinfo.{name}",
                        "measured": _num(m["structure"][name]),
                        "predicted": _num(p["structure"][field]), "unit": "structure",
                        "comparable": True})
    for name in sorted(set(m["counters"]) | set(p["counters"])):
        out.append({**common, "status": "ok", "field": f"counters.{name}",
                    "measured": _num(m["counters"].get(name)),
                    "predicted": _num(p["counters"].get(name)), "unit": "events",
                    "comparable": name in m["counters"] and name in p["counters"],
                    "note": "model: sheaves x capacity" if MODEL_COUNTERS.get(
                        name, ("", False))[1] else None})
    return out


def _num(v) -> float | None:
    return None if v is None else float(v)


# --------------------------------------------------------------------------- the run


@dataclasses.dataclass
class LabRun:
    run_dir: Path
    records: list[dict]

    @property
    def failed(self) -> int:
        return sum(not r["ok"] for r in self.records)


def stored_run(run, repredict: bool = False) -> LabRun:
    """The records of a stored lab run (its finished pairs, in plan order).  With
    ``repredict`` the model side is computed again by today's model (under the profile of
    each record's kernel release), beside the stored measurements: how a model change
    moves the report card without booting anything."""
    if run.manifest.get("kind") != "lab":
        raise SlabtuneError(f"lab show: {run.path} is not a lab run")
    states = run.manifest["chunks"]["states"]
    recs = [states[str(i)]["record"] for i in range(run.n_chunks)
            if states.get(str(i), {}).get("record") is not None]
    for r in recs:
        r.setdefault("console_tail", "")
    if repredict and recs:
        # a run measured before the lab had a warm-up counted from empty caches
        preds = predict([(r["config"]["doc"], release_profile(r["release"])) for r in recs],
                        windows=[bool((r.get("measured") or {}).get("warmup_ops"))
                                 for r in recs],
                        lockstep=[str(r.get("accelerator", "")).endswith("-lockstep")
                                  for r in recs])
        recs = [combine(r, config_from_doc(r["config"]["doc"], r["config"]["name"],
                                           r["config"].get("path", "")), pred)
                for r, pred in zip(recs, preds)]
    return LabRun(run.path, recs)


def check_allocator(cfg: LabConfig, kernel: str, profile) -> None:
    """Refuse, before anything runs, a config whose policy params belong to the other
    allocator than the booted kernel's: a SLUB knob (min_partial, cpu_partial, a slub_*
    boot parameter) on the SLAB kernel, or a /proc/slabinfo tunable or slab_max_order on a
    SLUB kernel that has no such thing.  One line naming the config, the knob and the
    kernel's profile (:func:`slabtune.model.slab.foreign_knob`)."""
    from slabtune.model import slab

    for name in cfg.doc["policy"].get("params", {}):
        why = slab.foreign_knob(str(name), profile)
        if why is not None:
            raise SlabtuneError(f"{cfg.path or cfg.name} on --kernel {kernel}: "
                                f"policy.params.{name}: {why}")


def run_lab(configs: Sequence[LabConfig], kernels: Sequence[str], *,
            out_dir: str | os.PathLike = "runs", ray_address: str | None = None,
            timeout_s: float | None = None, accel: str = "auto",
            resume: str | None = None, schedule: str = "free") -> LabRun:
    """Every (config, kernel) pair: predictions first (one model batch, here), then one Ray
    task per boot; each pair's rows are stored atomically as it finishes.  ``resume``: a
    run directory of an interrupted ``lab run``; its finished pairs are kept, the rest run
    (under the run's own schedule).  ``schedule``: one of :data:`SCHEDULES`."""
    from slabtune.results import store
    from slabtune.sweeps.dispatch import ray_session
    from slabtune.sweeps.runner import git_revision, package_versions
    from slabtune.validate.dispatch import local_resources

    out_dir = os.path.abspath(out_dir)    # the run directory named the same from any cwd
    if resume is not None:
        run = store.resolve_run(resume, out_dir)
        if run.manifest.get("kind") != "lab":
            raise SlabtuneError(f"--resume: {run.path} is not a lab run")
        configs = [parse_config(c["text"], c["name"], c["path"])
                   for c in run.manifest["spec"]["configs"]]
        kernels = list(run.manifest["spec"]["kernels"])
        accel = run.manifest["spec"]["accel"]
        schedule = run.manifest["spec"].get("schedule", "free")
    if schedule not in SCHEDULES:
        raise SlabtuneError(f"--schedule: {schedule!r} is not one of {', '.join(SCHEDULES)}")
    pairs = [(c, k) for c in configs for k in kernels]
    profiles = {k: kernel_profile(k) for k in kernels}
    for c, k in pairs:
        check_allocator(c, k, profiles[k])
    preds = predict([(c.doc, profiles[k]) for c, k in pairs],
                    lockstep=[schedule == "lockstep"] * len(pairs))
    meta = {"name": "lab", "evaluator": "lab", "chunk_size": 1,
            "configs": [c.to_json() for c in configs], "kernels": list(kernels),
            "accel": accel, "plan": [[c.name, k] for c, k in pairs]}
    if schedule != "free":      # a free-running run's manifest (and hash) as before
        meta["schedule"] = schedule
    spec_hash = hashlib.sha256(json.dumps(meta, sort_keys=True).encode()).hexdigest()
    with ray_session(ray_address, resources=local_resources()) as sess:
        if resume is None:
            run = store.create_run(out_dir, spec=meta, spec_hash=spec_hash,
                                   spec_text=json.dumps(meta), n_chunks=len(pairs),
                                   columns=[], versions=package_versions(),
                                   git_revision=git_revision(), extra={"kind": "lab"})
        with run.lock():
            run.clean_temporaries()
            run.start_attempt(ray=sess)
            records = _dispatch(run, pairs, preds, timeout_s, accel, schedule)
            run.finish()
    return LabRun(run.path, records)


def _dispatch(run, pairs, preds, timeout_s, accel, schedule="free") -> list[dict]:
    import ray

    from slabtune.validate.dispatch import qemu_placement, ray_failure
    from slabtune.validate.schema import MAX_RETRIES, QEMU_RESOURCE, frame

    use_qemu, node_cpus = qemu_placement("lab", True)
    remote = ray.remote(max_retries=MAX_RETRIES,
                        retry_exceptions=[OSError, subprocess.SubprocessError])(run_boot)
    records: dict[int, dict] = {}
    refs = {}
    for i, (cfg, kernel) in enumerate(pairs):
        if run.chunk_state(i) == "done":
            old = run.manifest["chunks"]["states"][str(i)].get("record")
            if old is not None:
                records[i] = old
            continue
        td = {"index": i, "kernel": kernel, "doc": cfg.doc, "timeout_s": timeout_s,
              "accel": accel, "schedule": schedule}
        opts: dict[str, Any] = {"num_cpus": max(1, min(int(cfg.doc["topology"]["cpus"]),
                                                       node_cpus))}
        if use_qemu:
            opts["resources"] = {QEMU_RESOURCE: 1}
        refs[remote.options(**opts).remote(td)] = i
    while refs:
        ready, _ = ray.wait(list(refs), num_returns=1)
        for ref in ready:
            i = refs.pop(ref)
            cfg, kernel = pairs[i]
            try:
                rec = ray.get(ref)
            except ray.exceptions.RayError as err:
                msg, lines = ray_failure(err)
                rec = blank_record(i, kernel, attempts=MAX_RETRIES + 1, error=msg,
                                   console_tail="\n".join(lines[-20:]))
            full = combine(rec, cfg, preds[i])
            rows = rows_of(full, {"task": i, "candidate": cfg.name,
                                  "params": json.dumps(cfg.doc["policy"].get("params", {}),
                                                       sort_keys=True),
                                  "topology": topology_label(cfg.doc),
                                  "cache": cfg.doc["cache"].get("name")
                                  or f"size-{cfg.doc['cache'].get('size')}"})
            slim = {k: v for k, v in full.items() if k != "console_tail"}
            run.write_part(i, frame(rows), status="ok" if full["ok"] else "failed",
                           config=cfg.name, kernel=kernel, error=full["error"] or None,
                           record=slim)
            records[i] = full
    return [records[i] for i in sorted(records)]


# --------------------------------------------------------------------------- report

#: Figures compared as an absolute difference in percentage points; the others relatively.
FRACTIONS = ("alloc_fastpath_frac", "free_fastpath_frac")


def _spread(values: list[float]) -> dict | None:
    if not values:
        return None
    return {"median": float(np.median(values)), "worst": float(max(values)), "n": len(values)}


def _figure(field: str, predicted: Sequence[float], measured: Sequence[float]) -> dict:
    """Median and worst |predicted - measured| of one compared figure over its pairs: in
    percentage points for the fast-path fractions, else relative to the measured value
    (pairs measured 0 left out and counted as ``measured_zero``)."""
    pairs = list(zip(predicted, measured))
    if field in FRACTIONS:
        return {"unit": "pp", **(_spread([abs(p - m) * 100 for p, m in pairs]) or {})}
    return {"unit": "relative", **(_spread([abs(p - m) / m for p, m in pairs if m > 0]) or {}),
            "measured_zero": sum(1 for _, m in pairs if m == 0)}


def _figure_text(f: Mapping[str, Any]) -> str:
    """A :func:`_figure` as ``median / worst`` (``-`` without pairs)."""
    if "median" not in f:
        return "-"
    if f["unit"] == "pp":
        return f"{f['median']:.1f} / {f['worst']:.1f} pp"
    return f"{100 * f['median']:.0f}% / {100 * f['worst']:.0f}%"


def summary(rows) -> dict:
    """The lab part of a report, from store rows (``target == "lab"``): per kernel and
    profile, for each compared figure the median and worst absolute difference in
    percentage points (fast-path fractions) or relative error |predicted - measured| /
    measured (slab allocations per 1000 ops, memory; pairs whose measured value is 0 are
    counted apart); per SLUB_STATS counter the model has, the same relative error.  The
    source is ``lab-tcg`` or ``lab-kvm`` (the accelerators of the rows)."""
    import polars as pl

    lab = rows.filter((pl.col("target") == "lab") & (pl.col("status") == "ok"))
    failed = rows.filter((pl.col("target") == "lab") & (pl.col("status") == "failed")).height
    out: dict[str, Any] = {"sources": sorted(set(lab["accelerator"].drop_nulls())),
                           "runs": lab.select(["task", "kernel"]).unique().height,
                           "failed": failed, "by_kernel": []}
    if lab.is_empty():
        return out
    for (kernel, profile), g in sorted(lab.group_by(["kernel", "profile"]),
                                       key=lambda kv: str(kv[0])):
        figs: dict[str, Any] = {}
        fields = [*COMPARED, *[f for f in SLAB_COMPARED if (g["field"] == f).any()]]
        for field in fields:
            sel = g.filter((pl.col("field") == field) & pl.col("measured").is_not_null()
                           & pl.col("predicted").is_not_null())
            figs[field] = _figure(field, sel["predicted"].to_list(), sel["measured"].to_list())
        counters: dict[str, Any] = {}
        for name in MODEL_COUNTERS:
            sel = g.filter((pl.col("field") == f"counters.{name}") & pl.col("comparable"))
            rel = [abs(a - b) / b for a, b in zip(sel["predicted"].to_list(),
                                                  sel["measured"].to_list())
                   if a is not None and b is not None and b > 0]
            if rel:
                counters[name] = _spread(rel)
        struct = g.filter(pl.col("field").str.starts_with("slabinfo."))
        out["by_kernel"].append({"kernel": kernel, "profile": profile,
                                 "runs": g["task"].n_unique(), "figures": figs,
                                 "counters": counters,
                                 "structure": {"matched": int((struct["measured"]
                                                               == struct["predicted"]).sum()),
                                               "compared": struct.height}})
    return out


def by_kind(records: Sequence[Mapping[str, Any]]) -> list[dict]:
    """The report card per (kernel, workload kind) of the records that ran: for each
    compared figure the median and worst |predicted - measured|, in percentage points for
    the fast-path fractions, else relative to the measured value (pairs measured 0 left
    out and counted as ``measured_zero``).  The kind is the config's ``workload.kind``
    (producer_consumer, block_io, ...); kernels and kinds in sorted order."""
    groups: dict[tuple[str, str], list[Mapping[str, Any]]] = {}
    for r in records:
        if r.get("ok"):
            kind = str(r["config"]["doc"].get("workload", {}).get("kind", "?"))
            groups.setdefault((str(r["kernel"]), kind), []).append(r)
    out = []
    for (kernel, kind), recs in sorted(groups.items()):
        figs: dict[str, Any] = {}
        for field in COMPARED:
            pairs = [(r["predicted"].get(field), r["measured"].get(field)) for r in recs]
            pairs = [(p, m) for p, m in pairs if p is not None and m is not None]
            figs[field] = _figure(field, [p for p, _ in pairs], [m for _, m in pairs])
        out.append({"kernel": kernel, "kind": kind, "runs": len(recs), "figures": figs})
    return out


def format_by_kind(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """:func:`by_kind` as a Markdown table: median / worst per figure."""
    if not rows:
        return []
    lines = ["| kernel | workload | runs | " + " | ".join(COMPARED) + " |",
             "|" + "---|" * (3 + len(COMPARED))]
    for row in rows:
        cells = [row["kernel"], row["kind"], str(row["runs"])]
        cells += [_figure_text(row["figures"][field]) for field in COMPARED]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def format_summary(s: Mapping[str, Any]) -> list[str]:
    """Text lines of :func:`summary`."""
    if not s["runs"] and not s["failed"]:
        return []
    lines = [f"lab (the real allocator, source {', '.join(s['sources']) or '-'}): "
             f"{s['runs']} runs, {s['failed']} failed; |predicted - measured| median / worst"]
    for k in s["by_kernel"]:
        parts = [f"{field} {_figure_text(f)}" for field, f in k["figures"].items()]
        st = k.get("structure") or {}
        if st.get("compared"):
            parts.append(f"/proc/slabinfo structure {st['matched']} of {st['compared']} exact")
        lines.append(f"  {k['kernel']} (profile {k['profile']}, {k['runs']} runs): "
                     + "; ".join(parts))
        if k["counters"]:
            lines.append("    counters (relative): " + "; ".join(
                f"{n} {100 * c['median']:.0f}% / {100 * c['worst']:.0f}%"
                for n, c in k["counters"].items()))
    return lines


# --------------------------------------------------------------------------- validate


def lab_available() -> str | None:
    """None when ``validate --target lab`` can run here (qemu and a built lab kernel), else
    why not."""
    import shutil

    if shutil.which("qemu-system-x86_64") is None:
        return "qemu-system-x86_64 is not installed"
    try:
        resolve_kernels(None)
    except SlabtuneError as err:
        return str(err)
    return None


def lab_cache_values(spec, cand) -> dict[str, int]:
    """The candidate's per-cache values of the spec's native cache (min_partial,
    cpu_partial, ...; :func:`slabtune.tuner.objectives.cache_values`), the same for every
    topology and kernel: compute once per candidate.  Empty on a SLAB fleet (SLAB has no
    such values; its tunables are the candidate's own, see
    :func:`slabtune.validate.candidates.slab_applied_tunables`)."""
    from slabtune.model import profiles
    from slabtune.tuner import objectives

    if profiles.is_slab(spec.fleet.profile):
        return {}
    return objectives.cache_values(spec.fleet, cand.params())[spec.native["cache"]]


def validate_doc(spec, cand, topology_name: str, profile=None,
                 per_cache: Mapping[str, int] | None = None) -> dict:
    """The config of a validation pair on the lab kernel of ``profile``: the spec's
    ``[validate.native]`` cache, workload, steps and seed on the topology, with what the
    native target applies of the candidate (:func:`~slabtune.validate.candidates.
    applied_values`): its boot parameters, and the cache's ``min_partial`` and
    ``cpu_partial`` where it searches the knobs behind them, written to sysfs by the lab.
    Those two only for a kmalloc cache (an own cache exists only during the run), and
    ``cpu_partial`` only where the kernel has per-CPU partial lists (not 7.x).  On the
    SLAB kernel (no /sys/kernel/slab): the boot parameter ``slab_max_order`` and the
    /proc/slabinfo tunables the candidate sets (limit, batchcount, shared; a kmalloc
    cache's only, likewise), which the lab writes (:func:`boot_args`) and the model runs
    with (:func:`predict`).  ``per_cache``: :func:`lab_cache_values` when the caller has
    it already."""
    from slabtune.kernel import labmod
    from slabtune.model import profiles, slab
    from slabtune.validate.candidates import applied_values
    from slabtune.validate.native_tasks import native_policy_doc

    cache = spec.native["cache"]
    if per_cache is None:
        per_cache = lab_cache_values(spec, cand)
    doc = native_policy_doc(spec, topology_name, applied_values(spec, cand, per_cache))
    keep = set(dict(cand.boot))
    if cache in labmod.KMALLOC_NAMES and profiles.is_slab(spec.fleet.profile):
        keep.update(slab.SLAB_TUNABLES)
    elif cache in labmod.KMALLOC_NAMES and not profiles.is_slab(profile):
        keep.add("min_partial")
        if profile is None or profile.has_cpu_partial:
            keep.add("cpu_partial")
    doc["policy"]["params"] = {k: v for k, v in doc["policy"]["params"].items() if k in keep}
    return doc


def validate_predictions(tds: Sequence[Mapping[str, Any]], kernels: Sequence[str],
                         spec_text: str, spec_name: str) -> dict[int, dict[str, dict]]:
    """Body of one Ray task: the model's side of every (validation lab task, kernel)."""
    from slabtune.validate.candidates import Candidate
    from slabtune.validate.spec import parse_spec

    spec = parse_spec(spec_text, spec_name)
    profiles = {k: kernel_profile(k) for k in kernels}
    keys, items = [], []
    for td in tds:
        cand = Candidate.from_json(td["candidate"])
        per_cache = lab_cache_values(spec, cand)
        for k in kernels:
            keys.append((td["index"], k))
            items.append((validate_doc(spec, cand, td["topology"], profiles[k], per_cache),
                          profiles[k]))
    out: dict[int, dict[str, dict]] = {}
    for (i, k), pred in zip(keys, predict(items)):
        out.setdefault(i, {})[k] = pred
    return out


def run_validate_task(task: Mapping[str, Any]) -> list[dict]:
    """A validation lab task: boot every lab kernel of the run on the pair's topology with
    the candidate's boot parameters and the spec's native workload; rows per kernel."""
    from slabtune.validate.candidates import Candidate
    from slabtune.validate.schema import row
    from slabtune.validate.spec import parse_spec

    spec = parse_spec(task["spec_text"], task["spec_name"])
    cand = Candidate.from_json(task["candidate"])
    per_cache = lab_cache_values(spec, cand)
    rows: list[dict] = []
    for k in task["lab_kernels"]:
        doc = validate_doc(spec, cand, task["topology"], kernel_profile(k), per_cache)
        cfg = config_from_doc(doc, f"{cand.id}@{task['topology']}")
        rec = run_boot({"index": task["index"], "kernel": k, "doc": doc,
                        "timeout_s": task.get("timeout_s") or spec.timeout_s,
                        "accel": spec.accel})
        full = combine(rec, cfg, task["lab_predicted"][str(k)])
        base = {key: v for key, v in row(task).items() if v is not None}
        base["cache"] = doc["cache"]["name"]
        rows += rows_of(full, base)
    return rows

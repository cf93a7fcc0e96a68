"""Validate candidate policies against real kernels: one Ray task per (candidate, topology,
target), measured values stored beside the model's prediction for the same configuration.

Targets (DESIGN.md section 6):

* ``guest``: boot the cached kernel under qemu (:mod:`slabtune.tuner.guest`) with the
  candidate's slab boot parameters and the topology, run the spec's workload inside, dump
  /sys/kernel/slab before and after.  A guest applies only the *boot* part of a candidate
  (sysfs and kernel-only knobs need a writable sysfs or a rebuilt kernel), so every guest
  prediction is made for exactly what the guest ran: its own kernel's profile (detected
  from the bzImage) and the candidate's boot parameters.  Rows:

  - structural (``order``, ``objs_per_slab``, ``min_partial``, ``cpu_partial``,
    ``sheaf_capacity``) for every cache of the before-dump, predicted by
    :func:`slabtune.tuner.check.predict_boot`; ``comparable`` is False for the caches
    :func:`~slabtune.tuner.check.check_snapshot` sets aside (debug flags, explicit sheaves);
  - ``slab_bytes`` for every cache the workload drives (objects or total_objects moved
    between the dumps, comparable, no debug flags): measured is the after-dump's
    ``slabs * (PAGE_SIZE << order)`` (every slab: full, node partial, CPU and per-CPU
    partial); predicted is the model's memory for the same cache holding the objects
    really allocated at that point (the structural memory model of
    :func:`slabtune.tuner.objectives.structural_memory` in its ``drained`` state, the end of
    a workload: live bytes, slab leftovers, the CPU slab and per-CPU partial slabs each CPU
    retains as whole, nearly empty slabs, empty slabs per node with memory, sheaves; the
    retained slabs of a cache the spec's workload does not name are bounded by the traffic
    the dumps show, :func:`dump_traffic`).  With ``[validate] boots = N`` each pair boots N
    guests and both sides are the medians over the good boots (:func:`median_over_boots`):
    a guest's retained slabs move by tens of percent from boot to boot.  The allocated count is an input taken from the guest (the model does not
    know how many objects hackbench leaves behind), so this compares how the model packs
    and retains slabs around a live set, not the live set itself.  It is the ``flushed``
    dump's ``objects`` (:func:`live_objects`): sysfs ``objects`` (show_slab_objects() with
    SO_ALL|SO_OBJECTS) leaves out only the free objects of the *node* partial lists, so
    before flush_all() the free objects of CPU slabs and per-CPU partial slabs would count
    as live and then again in the model's per-CPU terms.  The guest dumps once before
    ``before`` (to /dev/null), so the sysfs inodes and dentries the dump instantiates do
    not make inode_cache and dentry look driven;
  - ``cost``: predicted ns per op of the spec's model workload (the cost model via
    :class:`slabtune.tuner.objectives.Evaluator`) against the measured workload wall time
    (seconds).  Only the rank correlation of these two is meaningful, and only under KVM.

* ``host``: this machine's running kernel (``/sys/kernel/slab``).  It was booted with its
  own command line, so only the ``baseline`` candidate runs here, on topology ``host``;
  structural rows as for a guest (the host's profile and boot parameters).

* ``native``: :mod:`slabtune.tuner.native`, the userspace allocator, run with the spec's
  ``[validate.native]`` cache and model workload (``sweeps/simconfig.py`` kinds) on each
  topology.  A candidate's boot parameters and its per-cache ``min_partial`` and
  ``cpu_partial`` (what its sysfs knobs give that cache, from
  :func:`slabtune.tuner.objectives.cache_values`) are applied; kernel-only knobs are listed
  as not applied.  The model's side (:func:`slabtune.sweeps.simulate.run`: structure,
  dynamics, metrics) is computed in one Ray task in one batch for every pair.  Every
  native pair then runs in one further Ray task, after the guests (:func:`run_native_batch`:
  counters in lockstep, then timing runs interleaved across pairs and the rig's
  calibration configurations, allocator calls timed alone, threads pinned to one CPU).
  Rows: ``native_cost`` (the model's ns per alloc+free pair under the *rig cost table*
  against the median ns the binary spent inside its allocator per pair),
  ``native_cost_packaged`` and ``native_cost_prior`` (the same measurement against the
  model under the packaged server table and under the prior constants; labelled
  diagnostics, not counted), ``alloc_fastpath_pct`` and ``free_fastpath_pct`` (the model
  against the binary's counters from a run in lockstep with the model, reps weighted by
  the CPUs they stand for).  The rig table (:mod:`slabtune.tuner.rigcost`) is what the
  one-core rig pays: no cache-line transfers and no queueing
  (:func:`slabtune.model.cost.rig_cost`), per-event constants fitted on calibration runs
  of configurations that are none of the pairs'; the fit, its R^2 and the calibration are
  stored in the run manifest (``native_rig``).  The server tables stay the tuner's.

Infrastructure failures are retried at two levels: a guest boot that times out, panics or
loses its end marker is rebooted (``[validate] retries``), and a task whose worker dies or
raises an OSError is re-run by Ray (``MAX_RETRIES``).  A task that still fails is stored as
one ``status = "failed"`` row with its error and console tail, never dropped.

The store is :mod:`slabtune.results.store`: one run directory, one atomic parquet part per
task, the manifest listing each task's state.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import math
import os
import shutil
import statistics
import subprocess
import time
import tomllib
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import polars as pl

from slabtune.errors import SlabtuneError
from slabtune.model import bootparams as BP
from slabtune.model import profiles as P
from slabtune.model.topology import Topology

#: Every target, in the order tasks are planned.
TARGETS: tuple[str, ...] = ("guest", "host", "native")
#: Attempts beyond the first Ray makes for a task whose worker died or raised OSError.
MAX_RETRIES = 2
#: The custom Ray resource guest tasks ask for (a node with qemu and a kernel to boot).
QEMU_RESOURCE = "qemu"
BASELINE_ID = "baseline"
#: Structural fields compared (same as ``kernel check``).
STRUCTURAL_FIELDS: tuple[str, ...] = ("order", "objs_per_slab", "min_partial", "cpu_partial",
                                      "sheaf_capacity")
MEMORY_FIELD = "slab_bytes"
COST_FIELD = "cost"
TASK_FIELD = "task"
#: Row columns of a validation run, in order.
ROW_SCHEMA: dict[str, pl.DataType] = {
    "task": pl.Int64, "candidate": pl.String, "params": pl.String, "applied": pl.String,
    "topology": pl.String, "target": pl.String, "status": pl.String,
    "accelerator": pl.String, "kernel_release": pl.String, "profile": pl.String,
    "cache": pl.String, "field": pl.String, "predicted": pl.Float64, "measured": pl.Float64,
    "unit": pl.String, "comparable": pl.Boolean, "note": pl.String, "attempts": pl.Int64,
    "seconds": pl.Float64, "error": pl.String, "console_tail": pl.String,
}
CONSOLE_TAIL_CHARS = 3000


# --------------------------------------------------------------------------- candidates


@dataclasses.dataclass(frozen=True)
class Candidate:
    """A policy to validate: boot parameters (canonical ``slub_*`` names) and knobs of
    :data:`slabtune.tuner.space.KNOBS` that are not boot parameters."""

    id: str
    boot: Mapping[str, int] = dataclasses.field(default_factory=dict)
    knobs: Mapping[str, int] = dataclasses.field(default_factory=dict)
    source: str = ""

    def params(self) -> dict[str, int]:
        return {**dict(self.boot), **dict(self.knobs)}

    def to_json(self) -> dict:
        return {"id": self.id, "boot": dict(self.boot), "knobs": dict(self.knobs),
                "source": self.source}

    @classmethod
    def from_json(cls, d: Mapping) -> "Candidate":
        return cls(str(d["id"]), dict(d.get("boot", {})), dict(d.get("knobs", {})),
                   str(d.get("source", "")))


BASELINE = Candidate(BASELINE_ID, {}, {}, "the kernel's defaults")

#: Profile that accepts every boot parameter spelling (slub_* and slab_*), for checking a
#: candidate file before the target kernel is known.
_SPELLING_PROFILE = "v7.1"


def _check_knobs(where: str, knobs: Mapping) -> dict[str, int]:
    from slabtune.tuner.space import KNOBS

    out = {}
    for name, value in knobs.items():
        k = KNOBS.get(str(name))
        if k is None:
            raise SlabtuneError(f"{where}.knobs.{name}: unknown knob (known: {', '.join(KNOBS)})")
        if k.reach == "boot":
            raise SlabtuneError(f"{where}.knobs.{name}: a boot parameter; put it under boot")
        if isinstance(value, bool) or not isinstance(value, int):
            raise SlabtuneError(f"{where}.knobs.{name}: {value!r} is not an integer")
        if not k.low <= value <= k.high:
            raise SlabtuneError(f"{where}.knobs.{name}: {value} is outside {k.low}..{k.high}")
        out[k.name] = int(value)
    return out


def parse_candidates(doc: Any, source: str) -> list[Candidate]:
    """Candidates from a parsed candidate file.

    Format (TOML, or the same structure as JSON)::

        [[candidate]]
        id = "order1"                               # unique; "baseline" is reserved
        boot = { slub_max_order = 1 }               # slub_*/slab_* boot parameters
        knobs = { min_partial_lo = 3 }              # other knobs of tuner/space.py

    JSON may also be a bare list of such tables.  Boot parameters are checked against the
    allow-list here (every spelling) and again against the target kernel's profile before
    anything boots.  Every error names the field.
    """
    if isinstance(doc, list):
        doc = {"candidate": doc}
    if not isinstance(doc, Mapping):
        raise SlabtuneError(f"{source}: expected a table with [[candidate]] entries")
    unknown = set(doc) - {"candidate"}
    if unknown:
        raise SlabtuneError(f"{source}: unknown key {sorted(unknown)[0]!r} (expected candidate)")
    items = doc.get("candidate")
    if not isinstance(items, list) or not items:
        raise SlabtuneError(f"{source}: candidate: expected at least one [[candidate]]")
    out: list[Candidate] = []
    seen = {BASELINE_ID}
    for i, c in enumerate(items):
        where = f"{source}: candidate[{i}]"
        if not isinstance(c, Mapping):
            raise SlabtuneError(f"{where}: expected a table")
        bad = set(c) - {"id", "boot", "knobs"}
        if bad:
            raise SlabtuneError(f"{where}.{sorted(bad)[0]}: unknown field (expected id, boot, knobs)")
        cid = c.get("id", f"c{i}")
        if not isinstance(cid, str) or not cid or len(cid) > 64 or not all(
                ch.isalnum() or ch in "-_." for ch in cid):
            raise SlabtuneError(f"{where}.id: {cid!r} must be 1-64 letters, digits, '-', '_', '.'")
        if cid in seen:
            raise SlabtuneError(f"{where}.id: {cid!r} is "
                                + ("reserved" if cid == BASELINE_ID else "used twice"))
        seen.add(cid)
        boot = c.get("boot", {})
        knobs = c.get("knobs", {})
        for name, val in (("boot", boot), ("knobs", knobs)):
            if not isinstance(val, Mapping):
                raise SlabtuneError(f"{where}.{name}: expected a table")
        try:
            canon = BP.validate_params(dict(boot), P.get_profile(_SPELLING_PROFILE))
        except SlabtuneError as err:
            raise SlabtuneError(f"{where}.boot: {err}") from None
        out.append(Candidate(cid, canon, _check_knobs(where, knobs), source))
    return out


def load_candidate_file(path: str | os.PathLike) -> list[Candidate]:
    """Read a candidate file (``.toml`` or ``.json``; see :func:`parse_candidates`)."""
    p = Path(path)
    if not p.is_file():
        raise SlabtuneError(f"--candidate: {p}: no such file")
    text = p.read_text(errors="replace")
    if p.suffix.lower() == ".json":
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as err:
            raise SlabtuneError(f"--candidate: {p}: not valid JSON ({err.msg}, line {err.lineno})") from None
    else:
        try:
            doc = tomllib.loads(text)
        except tomllib.TOMLDecodeError as err:
            raise SlabtuneError(f"--candidate: {p}: not valid TOML ({err})") from None
    return parse_candidates(doc, f"--candidate {p.name}")


def candidate_rank(points: Sequence[dict]) -> list[dict]:
    """Order Pareto points for ``--top K``: by the sum of the fleet-level relative gains over
    the baseline on both objectives (memory overhead and ns per op), largest first; ties by
    trial number.  ``points`` are :func:`slabtune.results.pareto.study_pareto` points with
    ``gain`` added."""
    return sorted(points, key=lambda p: (-p["gain"], p["trial"]))


def check_count(flag: str, k) -> None:
    """``--top K`` / ``--spread K`` take a positive integer; anything else is a one-line error."""
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise SlabtuneError(f"{flag}: {k!r} must be a positive integer")


def spread_pick(points: Sequence[dict], k: int, key=None) -> list[dict]:
    """``k`` points spread over a Pareto front for ``--spread K``: the lowest-memory point,
    the lowest-time point, and ``k - 2`` more evenly spaced by rank between them along the
    front sorted by memory (ties by time, then trial number).  A front of at most ``k``
    points is returned whole; ``k = 1`` gives the lowest-memory point.  Returned sorted by
    memory.  ``points`` are :func:`slabtune.results.pareto.study_pareto` points.

    ``key`` (a function of a point) names what the validation would run for it: a point
    whose key was already picked is skipped for the next point along the front (towards
    more memory, then back towards less) with a key not yet picked, and when that leaves
    fewer than ``k`` picks the front is walked from its lowest-memory end for more.  Fewer
    than ``k`` points come back only when the front has fewer than ``k`` distinct keys."""
    check_count("--spread", k)
    front = sorted(points, key=lambda p: (p["memory"], p["time"], p["trial"]))
    if len(front) <= k:
        targets = list(range(len(front)))
    elif k == 1:
        targets = [0]
    else:
        lo_time = min(range(len(front)), key=lambda i: (front[i]["time"], front[i]["memory"],
                                                         front[i]["trial"]))
        ends = [0] if lo_time == 0 else [0, lo_time]
        rest = [i for i in range(len(front)) if i not in ends]
        need, m = k - len(ends), len(rest)
        # position j of `need` evenly spaced in (0, m + 1), rounded half up; m >= need keeps
        # the spacing >= 1, so the picks are distinct
        targets = ends + [rest[((2 * (j + 1) * (m + 1) + need + 1) // (2 * (need + 1))) - 1]
                          for j in range(need)]
    name = key if key is not None else (lambda p: ("trial", p["trial"]))
    keys = [name(p) for p in front]
    chosen: list[int] = []
    seen: set = set()

    def take(i: int) -> bool:
        if i in chosen or keys[i] in seen:
            return False
        chosen.append(i)
        seen.add(keys[i])
        return True

    for t in targets:
        any(take(i) for i in [*range(t, len(front)), *range(t - 1, -1, -1)])
    for i in range(len(front)):
        if len(chosen) >= k:
            break
        take(i)
    return [front[i] for i in sorted(chosen)]


def _front_points(study) -> list[dict]:
    """The study's Pareto points, each with ``gain``: the sum of the fleet-level relative
    gains over the baseline on both objectives."""
    from slabtune.results import pareto as PA

    rep = PA.study_pareto(study)
    base = rep["baseline"]
    return [{**p, "gain": float(sum(PA.gains([p["memory"], p["time"]],
                                               [base["memory"], base["time"]])))}
            for p in rep["points"]]


def _trial_candidates(study, points: Sequence[dict]) -> list[Candidate]:
    """Pareto points as candidates: their effective boot parameters that differ from the
    defaults, and their other knobs."""
    from slabtune.tuner import space as S
    from slabtune.tuner import study as ST

    spec = ST.study_spec(study)
    defaults = S.baseline_values(spec.fleet.profile)
    out = []
    for p in points:
        eff = ST.effective_params(p["params"], spec)
        boot = {k: int(v) for k, v in eff.items()
                if S.KNOBS[k].reach == "boot" and int(v) != defaults[k]}
        knobs = {k: int(v) for k, v in p["params"].items() if S.KNOBS[k].reach != "boot"}
        out.append(Candidate(f"trial-{p['trial']}", boot, knobs,
                             f"study {study.study_name} trial {p['trial']}"))
    return out


def candidates_from_study(study, top: int) -> list[Candidate]:
    """The ``top`` best Pareto-front trials of a slabtune study (see :func:`candidate_rank`)
    as candidates (see :func:`_trial_candidates`)."""
    check_count("--top", top)
    return _trial_candidates(study, candidate_rank(_front_points(study))[:top])


def spread_candidates(study, k: int, spec: ValidateSpec | None = None
                      ) -> tuple[list[Candidate], int]:
    """``k`` candidates spread over the study's Pareto front (see :func:`spread_pick`) and
    the front's size.  With the validation ``spec``, a front point whose validated
    configuration (:func:`validated_key`) equals one already picked is skipped for the next
    along the front, so the K candidates are K distinct configurations when the front has
    that many (fewer come back when it has not)."""
    check_count("--spread", k)
    pts = _front_points(study)
    key = None
    if spec is not None:
        cands = {p["trial"]: c for p, c in zip(pts, _trial_candidates(study, pts))}
        key = lambda p: validated_key(spec, cands[p["trial"]])  # noqa: E731
    picked = spread_pick(pts, k, key)
    return _trial_candidates(study, picked), len(pts)


def validated_key(spec: ValidateSpec, cand: Candidate) -> str:
    """What validating a candidate runs, as a string: its boot parameters and, for every
    cache of the spec's workload, the per-cache values the validation applies
    (:func:`applied_values`; a guest applies the boot parameters only).  Knobs that reach
    nothing the validation runs leave it unchanged."""
    from slabtune.tuner import objectives as O

    per = O.cache_values(spec.fleet, cand.params())
    return json.dumps({"boot": {k: int(v) for k, v in cand.boot.items()},
                       "caches": {c.name: applied_values(spec, cand, per[c.name])
                                  for c in spec.fleet.caches}}, sort_keys=True)


def with_baseline(cands: Sequence[Candidate]) -> list[Candidate]:
    """The baseline first, then the candidates (the baseline is always validated)."""
    return [BASELINE] + [c for c in cands if c.id != BASELINE_ID]


# --------------------------------------------------------------------------- spec


@dataclasses.dataclass(frozen=True)
class ValidateSpec:
    """A validation spec: topologies (+ model workload) and how guests run."""

    name: str
    text: str
    fleet: Any                     # slabtune.tuner.objectives.Fleet
    workloads: tuple               # guest.WorkloadSpec
    timeout_s: float = 180.0
    retries: int = 1
    memory_mib: int = 512
    accel: str = "auto"
    #: [validate.native]: cache name, workload table (simconfig kinds), steps, seed.
    native: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    #: Guest boots per (candidate, topology): slab memory is the median over them.
    boots: int = 1

    def topology(self, name: str) -> Topology:
        for t in self.fleet.topologies:
            if t.name == name:
                return t.topology
        raise SlabtuneError(f"topology: {name!r} is not in spec {self.name}")


#: Most guest boots per pair ``[validate] boots`` accepts.
MAX_BOOTS = 9


def parse_spec(text: str, name: str) -> ValidateSpec:
    """Parse a validation spec (see sweeps/validate_quick.toml); errors name the field."""
    from slabtune.tuner import guest as G
    from slabtune.tuner.objectives import parse_fleet

    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise SlabtuneError(f"--topologies {name}: not valid TOML ({err})") from None
    bad = set(doc) - {"validate", "fleet"}
    if bad:
        raise SlabtuneError(f"--topologies {name}: unknown table [{sorted(bad)[0]}]")
    if "fleet" not in doc:
        raise SlabtuneError(f"--topologies {name}: missing the [fleet] table")
    fleet = parse_fleet(doc["fleet"])
    v = doc.get("validate", {})
    if not isinstance(v, Mapping):
        raise SlabtuneError(f"--topologies {name}: validate: expected a table")
    bad = set(v) - {"timeout_s", "retries", "memory_mib", "accel", "workload", "native",
                    "boots"}
    if bad:
        raise SlabtuneError(f"validate.{sorted(bad)[0]}: unknown field")
    timeout = v.get("timeout_s", 180.0)
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout <= 3600:
        raise SlabtuneError(f"validate.timeout_s: {timeout!r} is outside (0, 3600]")
    retries = v.get("retries", 1)
    if isinstance(retries, bool) or not isinstance(retries, int) or not 0 <= retries <= 5:
        raise SlabtuneError(f"validate.retries: {retries!r} is outside 0..5")
    mem = v.get("memory_mib", 512)
    if isinstance(mem, bool) or not isinstance(mem, int) or not 128 <= mem <= 65536:
        raise SlabtuneError(f"validate.memory_mib: {mem!r} is outside 128..65536")
    boots = v.get("boots", 1)
    if isinstance(boots, bool) or not isinstance(boots, int) or not 1 <= boots <= MAX_BOOTS:
        raise SlabtuneError(f"validate.boots: {boots!r} is outside 1..{MAX_BOOTS}")
    accel = v.get("accel", "auto")
    if accel not in ("auto", "kvm", "tcg"):
        raise SlabtuneError(f"validate.accel: {accel!r} is not auto, kvm or tcg")
    wls = []
    fields = {f.name for f in dataclasses.fields(G.WorkloadSpec)}
    for i, w in enumerate(v.get("workload", [{}])):
        if not isinstance(w, Mapping):
            raise SlabtuneError(f"validate.workload[{i}]: expected a table")
        bad = set(w) - fields
        if bad:
            raise SlabtuneError(f"validate.workload[{i}].{sorted(bad)[0]}: unknown field")
        ws = G.WorkloadSpec(**w)
        try:
            ws.argv()
        except SlabtuneError as err:
            raise SlabtuneError(f"validate.workload[{i}]: {err}") from None
        wls.append(ws)
    for t in fleet.topologies:
        try:
            G.topology_qemu_args(t.topology, mem)
        except SlabtuneError as err:
            raise SlabtuneError(f"fleet.topology {t.name}: {err}") from None
    native = _parse_native(v.get("native", {}), fleet)
    return ValidateSpec(name, text, fleet, tuple(wls), float(timeout), retries, mem, accel,
                        native, boots)


NATIVE_DEFAULTS = {"cache": "kmalloc-512", "steps": 2000, "seed": 0,
                   "workload": {"kind": "local", "live": 64, "burst": 32},
                   "timing_sync_every": 0, "timing_steps": 1_000_000, "timing_repeats": 5,
                   "calibration_runs": 28, "calibration_seed": 1}


def _parse_native(tab: Any, fleet) -> dict:
    """``[validate.native]``: which cache of the fleet the native allocator runs, the model
    workload driving it (a sweeps/simconfig.py ``[workload]`` table), steps and seed, the
    timing runs, and the calibration runs of the rig cost table (``calibration_runs``
    configurations drawn with ``calibration_seed``, see :mod:`slabtune.tuner.rigcost`)."""
    if not isinstance(tab, Mapping):
        raise SlabtuneError("validate.native: expected a table")
    bad = set(tab) - set(NATIVE_DEFAULTS)
    if bad:
        raise SlabtuneError(f"validate.native.{sorted(bad)[0]}: unknown field")
    out = {**NATIVE_DEFAULTS, **dict(tab)}
    names = [c.name for c in fleet.caches]
    if out["cache"] not in names:
        raise SlabtuneError(f"validate.native.cache: {out['cache']!r} is not a cache of the "
                            f"fleet's workloads ({', '.join(names)})")
    for k, lo, hi in (("steps", 1, 1_000_000), ("seed", 0, (1 << 32) - 1),
                      ("timing_sync_every", 0, 1 << 30), ("timing_steps", 1, 100_000_000),
                      ("timing_repeats", 1, 15), ("calibration_runs", 2, 256),
                      ("calibration_seed", 0, (1 << 32) - 1)):
        val = out[k]
        if isinstance(val, bool) or not isinstance(val, int) or not lo <= val <= hi:
            raise SlabtuneError(f"validate.native.{k}: {val!r} is outside {lo}..{hi}")
    if not isinstance(out["workload"], Mapping) or "kind" not in out["workload"]:
        raise SlabtuneError("validate.native.workload: expected a table with kind")
    out["workload"] = dict(out["workload"])
    return out


def load_spec(ref: str) -> ValidateSpec:
    """A spec from a path or a built-in name (``validate_quick``)."""
    from slabtune.tuner.study import spec_file

    p = spec_file(ref, "--topologies")
    return parse_spec(p.read_text(), p.stem)


# --------------------------------------------------------------------------- targets


def native_available() -> str | None:
    """None when the native allocator can run here, else why not."""
    import importlib

    for mod in ("slabtune.tuner.native", "slabtune.sweeps.simconfig", "slabtune.sweeps.simulate",
                "slabtune.model.metrics"):
        try:
            importlib.import_module(mod)
        except ImportError as err:
            return f"{mod} is not available ({err})"
    if shutil.which("gcc") is None:
        return "gcc is not installed"
    return None


def guest_available() -> str | None:
    """None when qemu, a kernel and busybox are installed here, else why not."""
    from slabtune.tuner import guest as G

    try:
        G.find_assets(build=False)
    except SlabtuneError as err:
        return str(err)
    return None


def available_targets() -> dict[str, str | None]:
    """target -> None (runs here) or the reason it cannot."""
    host = None if Path("/sys/kernel/slab").is_dir() else "/sys/kernel/slab is missing"
    return {"guest": guest_available(), "host": host, "native": native_available()}


def parse_targets(text: str | None) -> tuple[str, ...]:
    """``--target`` (one name or a comma list); None means every target available here."""
    avail = available_targets()
    if text is None:
        chosen = tuple(t for t in TARGETS if avail[t] is None)
        if not chosen:
            raise SlabtuneError("--target: no target can run here: "
                                + "; ".join(f"{k}: {v}" for k, v in avail.items()))
        return chosen
    names = [t.strip() for t in text.split(",") if t.strip()]
    if not names:
        raise SlabtuneError("--target: empty")
    for t in names:
        if t not in TARGETS:
            raise SlabtuneError(f"--target: {t!r} is not one of {', '.join(TARGETS)}")
    return tuple(t for t in TARGETS if t in names)


# --------------------------------------------------------------------------- tasks


@dataclasses.dataclass(frozen=True)
class Task:
    index: int
    candidate: Candidate
    topology: str
    target: str


def plan_tasks(cands: Sequence[Candidate], spec: ValidateSpec,
               targets: Sequence[str]) -> list[Task]:
    """Every (candidate, topology) pair per target: guest and native over the spec's
    topologies, host for the baseline only (the host cannot reboot with other parameters)."""
    tasks: list[Task] = []
    for target in TARGETS:
        if target not in targets:
            continue
        for c in cands:
            if target == "host":
                if c.id == BASELINE_ID:
                    tasks.append(Task(len(tasks), c, "host", target))
                continue
            for t in spec.fleet.topologies:
                tasks.append(Task(len(tasks), c, t.name, target))
    return tasks


def preflight(cands: Sequence[Candidate], spec: ValidateSpec, targets: Sequence[str]) -> dict:
    """Refuse bad input before any qemu starts: every candidate's boot parameters against
    the guest kernel's profile, the guest assets present.  Returns facts for the manifest."""
    info: dict[str, Any] = {}
    if "guest" in targets:
        from slabtune.tuner import guest as G

        assets = G.find_assets()
        prof = G.kernel_profile(assets.kernel)
        info["guest_kernel"] = str(assets.kernel)
        info["guest_profile"] = prof.name
        for c in cands:
            try:
                BP.validate_params(dict(c.boot), prof)
            except SlabtuneError as err:
                raise SlabtuneError(f"candidate {c.id}: {err}") from None
    if "native" in targets:
        why = native_available()
        if why is not None:
            raise SlabtuneError(f"--target native: {why}")
        from slabtune.sweeps import simconfig as SC

        for c in cands:
            for t in spec.fleet.topologies:
                try:
                    sim = SC.parse_doc(native_doc(spec, c, t.name)[0])
                    _check_workload(sim)
                except SlabtuneError as err:
                    raise SlabtuneError(f"candidate {c.id} (native, {t.name}): {err}") from None
    return info


# --------------------------------------------------------------------------- model side


@functools.lru_cache(maxsize=64)
def _evaluator(profile_name: str, spec_text: str, topology_name: str):
    """A cost/memory Evaluator for one topology of the spec under one profile (cached per
    worker process: building one compiles the objective)."""
    from slabtune.tuner import objectives as O

    spec = parse_spec(spec_text, "spec")
    topo = next(t for t in spec.fleet.topologies if t.name == topology_name)
    fleet = dataclasses.replace(spec.fleet, profile=P.get_profile(profile_name),
                                topologies=(O.FleetTopology(topo.name, topo.topology, 1.0),))
    return O.Evaluator(fleet)


def predicted_cost(profile: P.KernelProfile, spec_text: str, topology_name: str,
                   params: Mapping[str, int]) -> float:
    """Modelled ns per op of the spec's model workload for a policy on one topology."""
    ev = _evaluator(profile.name, spec_text, topology_name)
    return float(ev.evaluate([dict(params)]).time_topo[0, 0])


def predicted_slab_bytes(profile: P.KernelProfile, topology: Topology, boot: Mapping[str, int],
                         caches: Sequence, live_objects: Sequence[int],
                         traffic: Sequence[float] | None = None) -> np.ndarray:
    """The structural memory model's slab bytes (live + overhead) per cache at the end of a
    workload (``state="drained"`` of :func:`slabtune.tuner.objectives.structural_memory`)
    when each holds ``live_objects`` objects spread over the topology's CPUs.  ``traffic``
    (per cache: objects allocated during the workload, ``inf`` for a cache the workload
    churns; None: every cache churned) bounds the slabs the CPUs and nodes retain.
    ``caches`` are :class:`slabtune.model.caches.CacheInfo`."""
    from slabtune.model import policy as PL
    from slabtune.tuner import objectives as O
    from slabtune.tuner.space import baseline_values

    cpus = max(topology.present, 1)
    wl = O.Workload("measured", 1.0, tuple(float(n) / cpus for n in live_objects),
                    tuple(1.0 for _ in caches), 0.5, 0.0)
    fleet = O.Fleet(profile, (O.FleetTopology("t", topology, 1.0),), tuple(caches), (wl,))
    fa = O.fleet_arrays(fleet)
    vals = baseline_values(profile)
    vals.update({k: int(v) for k, v in boot.items()})
    prof = PL.profile_arrays(profile)
    st, _ = O.policy_structure({k: np.array([v], np.int32) for k, v in vals.items()}, prof, fa)
    tr = None if traffic is None else np.asarray(traffic, np.float32)
    overhead, live = O.structural_memory(st, fa, np.array([vals["barn_max_full"]], np.float32),
                                         np.array([vals["barn_max_empty"]], np.float32),
                                         prof.barns, state="drained", traffic=tr)
    return np.asarray(overhead + live, np.float64)[0, 0, 0, :]


def dump_traffic(before: Mapping[str, Any], after: Mapping[str, Any]) -> int:
    """The fewest objects a cache can have allocated between two dumps: every object that
    the dumps show allocated or freed in between (``objects``), or every object of the slabs
    created or discarded in between (``total_objects``: a slab is allocated only for an
    allocation and discarded only after frees), whichever is more.  A lower bound: objects
    allocated and freed again between the dumps leave no trace in either count."""
    d_obj = abs(int(after.get("objects") or 0) - int(before.get("objects") or 0))
    d_tot = abs(int(after.get("total_objects") or 0) - int(before.get("total_objects") or 0))
    return max(d_obj, d_tot)


# --------------------------------------------------------------------------- rows


def _row(task: dict, **kw) -> dict:
    base = {k: None for k in ROW_SCHEMA}
    c = task["candidate"]
    base.update(task=task["index"], candidate=c["id"],
                params=json.dumps({**c["boot"], **c["knobs"]}, sort_keys=True),
                topology=task["topology"], target=task["target"], status="ok")
    base.update(kw)
    return base


def frame(rows: list[dict]) -> pl.DataFrame:
    return pl.DataFrame(rows, schema=ROW_SCHEMA, orient="row") if rows else pl.DataFrame(
        schema=ROW_SCHEMA)


def failed_rows(task: dict, error: str, console_tail: str = "", attempts: int | None = None,
                seconds: float | None = None, accelerator: str | None = None) -> list[dict]:
    """The one row a failed task leaves."""
    return [_row(task, status="failed", field=TASK_FIELD, error=error or "failed",
                 console_tail=(console_tail or "")[-CONSOLE_TAIL_CHARS:], attempts=attempts,
                 seconds=seconds, accelerator=accelerator, comparable=False)]


def structural_rows(task: dict, df: pl.DataFrame, common: dict) -> tuple[list[dict], dict]:
    """Predicted beside measured structural fields for every cache of a one-boot snapshot.
    Returns the rows and facts about the boot (profile, params, topology)."""
    from slabtune.results import snapshot as snap
    from slabtune.tuner import check
    from slabtune.tuner.host import topology_from_lists

    df = df.select([c for c in df.columns if c not in ("phase", "accelerator")])
    res = check.check_snapshot(df)
    boot = res.boots[0]
    df = snap.validate_snapshot(df, "validate")
    first = df.row(0, named=True)
    topo, _ = topology_from_lists(first["cpus_possible"], first["cpus_present"],
                                  first["cpus_online"], first["nodes_with_memory"],
                                  first["nodes_with_cpu"])
    prof = P.get_profile(boot.profile)
    names = df["cache"].to_list()
    pred = check.predict_boot(df["slab_size"].to_numpy(), names, topo, prof, boot.params)
    aside = {n.cache: n.reason for n in res.not_comparable}
    rows = []
    for i, r in enumerate(df.iter_rows(named=True)):
        for f in STRUCTURAL_FIELDS:
            if r[f] is None:
                continue
            rows.append(_row(task, **common, kernel_release=boot.kernel_release,
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


def live_objects(after: Mapping[str, Any], flushed: Mapping[str, Any] | None) -> tuple[int, str]:
    """The objects a cache really had allocated at the after-dump, and where that count
    came from.

    sysfs ``objects`` (show_slab_objects() with SO_ALL|SO_OBJECTS) is the node's
    total_objects minus the free objects of its *node* partial lists: the free objects of
    a CPU slab and of the per-CPU partial slabs count as allocated.  After flush_all()
    (the guest's ``flushed`` dump, see :func:`slabtune.tuner.guest.init_script`) those
    slabs sit on the node partial lists or went back to the page allocator, so the flushed
    ``objects`` is the allocated count.  Without a flushed dump (an older run, a kernel
    whose cpu_partial cannot be written) the after-dump's count is used and said so."""
    if flushed is not None and flushed.get("objects") is not None:
        return int(flushed["objects"]), "flushed"
    return int(after.get("objects") or 0), "after (includes free objects on per-CPU slabs)"


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
    :func:`slabtune.tuner.report.workload_caches`) are
    predicted as churned on every CPU; every other driven cache has its retained slabs
    bounded by the traffic the dumps show (:func:`dump_traffic`), so a cache the workload
    touches a little is not predicted as if every CPU had churned it."""
    from slabtune.model.caches import CacheInfo
    from slabtune.tuner import check

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
        meas = float(r["slabs_after"]) * float(P.PAGE_SIZE << int(r["order_after"]))
        how = ("workload cache, churned on every CPU" if math.isinf(tr)
               else f"traffic >= {int(tr)} objects (dumps)")
        out.append(_row(task, **common, kernel_release=facts["release"],
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
    from slabtune.tuner import guest as G
    from slabtune.tuner.report import workload_caches

    spec = parse_spec(task["spec_text"], task["spec_name"])
    cand = Candidate.from_json(task["candidate"])
    topo = spec.topology(task["topology"])
    assets = G.find_assets()
    prof = G.kernel_profile(assets.kernel)
    boot = BP.validate_params(dict(cand.boot), prof)
    gs = G.GuestSpec(topology=topo, boot_params=boot, workloads=spec.workloads,
                     memory_mib=spec.memory_mib,
                     timeout_s=float(task.get("timeout_s") or spec.timeout_s),
                     retries=spec.retries, accel=spec.accel)
    results = [G.boot_guest(gs, assets) for _ in range(spec.boots)]
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
        rows.append(_row(task, **common, kernel_release=facts["release"],
                         profile=facts["profile"].name, field=COST_FIELD, predicted=cost,
                         measured=wall, unit="predicted ns/op; measured workload s",
                         comparable=r.accelerator == "kvm",
                         note=None if r.accelerator == "kvm" else
                         "TCG: guest timing is an emulation artefact"))
    return rows


def run_host_task(task: dict) -> list[dict]:
    """Snapshot this machine's running kernel and compare it with the model."""
    from slabtune.tuner.host import take_snapshot

    t0 = time.monotonic()
    df = take_snapshot("/")
    common = {"accelerator": "host", "attempts": 1, "seconds": time.monotonic() - t0,
              "applied": json.dumps({"boot": "the host's own command line"})}
    rows, _ = structural_rows(task, df, common)
    return rows


def _check_workload(sim) -> None:
    """Build the native pair's model workload once, so a kind that cannot run on a topology
    (producer_consumer on one CPU) is refused before anything starts."""
    from slabtune.model import workloads as W

    try:
        W.build(sim.workload_kind, sim.topology, **sim.workload_params)
    except W.WorkloadError as err:
        raise SlabtuneError(f"validate.native.workload: {err}") from None


def native_doc(spec: ValidateSpec, cand: Candidate, topology_name: str,
               per_cache: Mapping[str, int] | None = None) -> tuple[dict, dict]:
    """The sweeps/simconfig.py document of one native (candidate, topology) pair, and what
    of the candidate it applies and leaves out.  ``per_cache`` holds the candidate's
    per-cache values of the native cache (:func:`slabtune.tuner.objectives.cache_values`);
    without it the sysfs knobs are left out (enough to check the document up front)."""
    from slabtune.tuner.space import KNOBS

    params = applied_values(spec, cand, per_cache)
    left = {k: v for k, v in cand.knobs.items() if KNOBS[k].reach == "kernel"}
    return native_policy_doc(spec, topology_name, params), {"applied": dict(params),
                                                            "not_applied": left}


def applied_values(spec: ValidateSpec, cand: Candidate,
                   per_cache: Mapping[str, int] | None) -> dict[str, int]:
    """What the native validation applies of a candidate to one cache: its boot parameters,
    and that cache's ``min_partial`` and ``cpu_partial`` (``per_cache``, from
    :func:`slabtune.tuner.objectives.cache_values`) when the candidate searches the knobs
    behind them (the sysfs files a kernel would take them from; cpu_partial only where the
    profile has per-CPU partial lists)."""
    params: dict[str, int] = {k: int(v) for k, v in cand.boot.items()}
    searched = set(cand.knobs)
    if per_cache is not None:
        if searched & {"min_partial_divisor", "min_partial_lo", "min_partial_hi"}:
            params["min_partial"] = int(per_cache["min_partial"])
        if spec.fleet.profile.has_cpu_partial and searched & {
                "cpu_partial_page", "cpu_partial_1k", "cpu_partial_256", "cpu_partial_small"}:
            params["cpu_partial"] = int(per_cache["cpu_partial"])
    return params


def native_policy_doc(spec: ValidateSpec, topology_name: str, params: Mapping[str, int]) -> dict:
    """The sweeps/simconfig.py document of the spec's native cache and workload on one
    topology under policy ``params`` (boot parameters, min_partial, cpu_partial)."""
    nat = spec.native
    t = spec.topology(topology_name)
    topo = {"cpus": t.present, "nodes": t.nodes, "node_cpus": list(t.node_cpus),
            "memoryless_nodes": list(t.memoryless_nodes), "possible": t.possible,
            "online": t.online}
    return {"topology": topo, "cache": {"name": nat["cache"]},
            "policy": {"profile": spec.fleet.profile.name, "params": dict(params)},
            "workload": dict(nat["workload"]),
            "run": {"steps": nat["steps"], "seed": nat["seed"]}}


def native_model_task(tasks: Sequence[dict], spec_text: str, spec_name: str) -> dict:
    """Body of the Ray task that predicts every native pair and the rig's calibration
    configurations in one batch (one simulation, one compilation): ``{"pairs": index ->
    {"spec_native", "native": {"doc", "applied", "model"}}, "calibration": [...],
    "pcp_batch"}``.  A pair's model holds its ns per pair under the packaged cost table
    (``ns_per_op``), under the prior constants (``ns_per_op_prior``) and under each unit
    rig table (``rig_features``, :mod:`slabtune.tuner.rigcost`); each calibration entry its
    topology, policy params, simconfig document and features.  Runs in a worker so the
    driver never imports JAX."""
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    from slabtune.sweeps import simconfig as SC
    from slabtune.sweeps import simulate as SIM
    from slabtune.tuner import objectives as O
    from slabtune.tuner import rigcost as RC

    spec = parse_spec(spec_text, spec_name)
    docs = []
    for t in tasks:
        cand = Candidate.from_json(t["candidate"])
        per_cache = O.cache_values(spec.fleet, cand.params())[spec.native["cache"]]
        docs.append(native_doc(spec, cand, t["topology"], per_cache))
    cost, _ = SC.load_cost()
    sims = [SC.parse_doc(d) for d, _ in docs]
    cal_sims, cal = calibration_set(spec, [(t["topology"], s) for t, s in zip(tasks, sims)])
    every = sims + cal_sims
    simulated = SIM.simulate_specs(every)
    preds = SIM.metrics_of(every, *simulated, cost)
    prior = SIM.metrics_of(every, *simulated, prior_cost(cost))
    pcp_batch = float(cost.pcp_batch)
    feats = RC.features_of(every, pcp_batch, simulated)
    keep = ("ns_per_op", "throughput_ops_per_us", "alloc_fastpath_frac", "free_fastpath_frac",
            "order", "objs_per_slab", "min_partial", "cpu_partial")
    pairs = {t["index"]: {"spec_native": dict(spec.native),
                          "native": {"doc": doc, "applied": applied,
                                     "model": {**{k: pred[k] for k in keep},
                                               "ns_per_op_prior": RC.model_pair_ns(pp),
                                               "rig_features": feats[i].tolist()}}}
             for i, (t, (doc, applied), pred, pp) in enumerate(zip(tasks, docs, preds, prior))}
    n = len(sims)
    for j, c in enumerate(cal):
        c["features"] = feats[n + j].tolist()
        c["model"] = {k: preds[n + j][k] for k in keep}
    return {"pairs": pairs, "calibration": cal, "pcp_batch": pcp_batch}


def calibration_set(spec: ValidateSpec, pairs: Sequence[tuple[str, Any]]
                    ) -> tuple[list, list[dict]]:
    """The rig's calibration configurations: the first ``calibration_runs`` of
    :func:`slabtune.tuner.rigcost.calibration_policies` whose effective native
    configuration (:func:`slabtune.tuner.rigcost.native_key`) is neither a validated pair's
    (``pairs``: topology name and SimSpec of each) nor an earlier calibration's.  Returns
    their SimSpecs and ``{"topology", "params", "doc", "key"}`` entries."""
    from slabtune.sweeps import simconfig as SC
    from slabtune.tuner import native as N
    from slabtune.tuner import rigcost as RC

    nat = spec.native
    n = int(nat["calibration_runs"])
    taken = {RC.native_key(topo, N.sim_config_for_spec(sim)) for topo, sim in pairs}
    sims, out = [], []
    for topo, params in RC.calibration_policies(n, int(nat["calibration_seed"]),
                                                [t.name for t in spec.fleet.topologies],
                                                spec.fleet.profile.has_cpu_partial):
        doc = native_policy_doc(spec, topo, params)
        sim = SC.parse_doc(doc)
        key = RC.native_key(topo, N.sim_config_for_spec(sim))
        if key in taken:
            continue
        taken.add(key)
        sims.append(sim)
        out.append({"topology": topo, "params": params, "doc": doc, "key": list(key)})
        if len(out) == n:
            break
    return sims, out


def prior_cost(cost):
    """``cost`` with every constant at its prior value (:data:`slabtune.tuner.fitcost.PRIOR`:
    order-of-magnitude values inside each constant's physical range), for the labelled
    diagnostic beside the packaged constants (cost_default.toml lists the packaged ones that
    are not physical, e.g. free_fast_ns > free_slow_ns)."""
    from slabtune.tuner import fitcost as FC

    return cost._replace(**{k: float(v) for k, v in FC.prior_values().items()
                            if k in cost._fields})


def timing_cpu() -> int:
    """The CPU every thread of a timing run is pinned to: the lowest this process may run
    on (the worker's own affinity, so a cluster node's restrictions hold)."""
    return min(os.sched_getaffinity(0))


def _native_counter_rows(td: dict, timeout: float) -> tuple[list[dict], Any]:
    """The counters run of one native pair (threads in lockstep with the model's steps):
    fast-path rows, and the binary's configuration for the timing runs."""
    from slabtune.sweeps import simconfig as SC
    from slabtune.tuner import native as N

    nat = td["native"]
    sim = SC.parse_doc(nat["doc"])
    cfg = N.config_for_spec(sim)
    res = N.run(cfg, timeout=timeout)
    fa, ff = N.fastpath_fractions(res, cfg.rep_weight)
    m = nat["model"]
    common = _native_common(td, sim, res.threads)
    return [
        _row(td, **common, field="alloc_fastpath_pct",
             predicted=100.0 * float(m["alloc_fastpath_frac"]), measured=100.0 * fa, unit="%"),
        _row(td, **common, field="free_fastpath_pct",
             predicted=100.0 * float(m["free_fastpath_frac"]), measured=100.0 * ff, unit="%"),
    ], cfg


def _native_common(td: dict, sim, threads: int) -> dict:
    nat = td["native"]
    return {"accelerator": "native", "attempts": 1,
            "applied": json.dumps(nat["applied"], sort_keys=True), "profile": sim.profile.name,
            "cache": sim.cache.name, "comparable": True,
            "note": f"{threads} threads; counters {nat['doc']['run']['steps']} steps in lockstep"}


def run_native_batch(tds: Sequence[dict], calibration: Sequence[dict] = (),
                     pcp_batch: float | None = None) -> dict:
    """Body of the one Ray task that runs every native pair (after the guest and host tasks
    have finished, so no guest competes for the cores): ``{"rows": index -> rows, "rig":
    the rig cost table's fit}``.

    1. Counters: each pair once in lockstep with the model (fast-path rows).
    2. Timing: ``timing_repeats`` rounds, each running every pair and every calibration
       configuration (``calibration``, from :func:`native_model_task`) once, the two kinds
       interleaved, so load from other work on the machine falls on both alike.  A timing
       run has the binary time each slab_alloc()/slab_free() call on its own (``time_ops``:
       not the workload driver, its hand-over queues or thread start-up), every thread
       pinned to one CPU (:func:`timing_cpu`: the reps time-slice on one core instead of
       outnumbering the machine's cores; a call that spans a time slice is left out),
       threads free-running for ``timing_steps`` steps.  The measured figure of a pair or a
       calibration configuration is the median over rounds of the ns spent in the
       allocator per alloc+free pair (:func:`slabtune.tuner.native.op_ns_per_pair`).
    3. The rig table: the calibration medians fitted against their features
       (:func:`rig_fit`).  ``native_cost`` is a pair's measurement against the model under
       that table (its features x the fitted constants); ``native_cost_packaged`` (the
       packaged server table) and ``native_cost_prior`` (the prior constants,
       :func:`prior_cost`) put the same measurement beside the model under the other
       tables: labelled diagnostics, not counted.
    A pair whose run fails leaves one failed row; the others go on.  A calibration run that
    fails is left out of the fit and listed with its error."""
    from slabtune.sweeps import simconfig as SC
    from slabtune.tuner import native as N
    from slabtune.tuner import rigcost as RC

    out: dict[int, list[dict]] = {}
    cfgs: dict[int, Any] = {}
    t0 = {td["index"]: time.monotonic() for td in tds}
    for td in tds:
        timeout = float(td.get("timeout_s") or 300.0)
        try:
            out[td["index"]], cfgs[td["index"]] = _native_counter_rows(td, timeout)
        except SlabtuneError as err:
            out[td["index"]] = failed_rows(td, str(err), seconds=time.monotonic() - t0[td["index"]])
    live = [td for td in tds if td["index"] in cfgs]
    if not live:
        return {"rows": out, "rig": None}
    sn = live[0]["spec_native"]
    timeout = float(live[0].get("timeout_s") or 300.0)
    pin = timing_cpu()

    def timed(cfg):
        return dataclasses.replace(cfg, sync_every=int(sn["timing_sync_every"]),
                                   steps=int(sn["timing_steps"]), time_ops=1, pin_cpu=pin)

    tcfg = {td["index"]: timed(cfgs[td["index"]]) for td in live}
    cal = [dict(c) for c in calibration]
    for c in cal:
        c.update(runs=[], dropped=0)
        try:
            c["cfg"] = timed(N.config_for_spec(SC.parse_doc(c["doc"])))
        except SlabtuneError as err:
            c["error"] = str(err)
    times: dict[int, list[float]] = {td["index"]: [] for td in live}
    dropped: dict[int, int] = {td["index"]: 0 for td in live}
    failed: dict[int, str] = {}
    # pairs and calibration runs in one round, interleaved by their position in their list
    order = sorted([((k + 0.5) / len(live), 0, k) for k in range(len(live))]
                   + [((k + 0.5) / len(cal), 1, k) for k in range(len(cal))])
    for _ in range(int(sn["timing_repeats"])):
        for _, kind, k in order:
            if kind == 1:
                c = cal[k]
                if "error" in c:
                    continue
                try:
                    r = N.run(c["cfg"], timeout=timeout)
                    c["runs"].append(N.op_ns_per_pair(r, c["cfg"].rep_weight))
                    c["dropped"] += int(r.raw.get("op_dropped", 0))
                except SlabtuneError as err:
                    c["error"] = str(err)
                continue
            td = live[k]
            i = td["index"]
            if i in failed:
                continue
            try:
                r = N.run(tcfg[i], timeout=float(td.get("timeout_s") or 300.0))
                times[i].append(N.op_ns_per_pair(r, cfgs[i].rep_weight))
                dropped[i] += int(r.raw.get("op_dropped", 0))
            except SlabtuneError as err:
                failed[i] = str(err)
    steps = int(sn["timing_steps"])
    rig = rig_fit(cal, pcp_batch, steps=steps, cpu=pin)
    for td in live:
        i = td["index"]
        if i in failed:
            out[i] = failed_rows(td, f"timing: {failed[i]}", seconds=time.monotonic() - t0[i])
            continue
        m = td["native"]["model"]
        v = times[i]
        med = statistics.median(v)
        common = {"accelerator": "native", "attempts": 1, "comparable": True,
                  "applied": out[i][0]["applied"], "profile": out[i][0]["profile"],
                  "cache": out[i][0]["cache"], "unit": "ns in the allocator per alloc+free pair",
                  "note": f"allocator calls timed alone, {len(v)} interleaved runs x "
                          f"{tcfg[i].steps} steps, threads on CPU {pin}; runs "
                          + ", ".join(f"{x:.1f}" for x in v)
                          + f"; {dropped[i]} calls over 50 us left out"}
        seconds = time.monotonic() - t0[i]
        if rig["constants"] is not None:
            rig_pred = float(RC.predict(m["rig_features"], rig["constants"], rig["names"])[0])
            rig_row = {}
        else:
            rig_pred, rig_row = None, {"comparable": False,
                                       "note": f"{common['note']}; no rig table: {rig['error']}"}
        out[i] = [{**r, "seconds": seconds} for r in out[i]] + [
            _row(td, **{**common, **rig_row}, seconds=seconds, field="native_cost",
                 predicted=rig_pred, measured=med),
            _row(td, **{**common, "comparable": False}, seconds=seconds,
                 field="native_cost_packaged", predicted=float(m["ns_per_op"]), measured=med),
            _row(td, **{**common, "comparable": False}, seconds=seconds,
                 field="native_cost_prior", predicted=float(m["ns_per_op_prior"]), measured=med),
        ]
    if rig["constants"] is not None:
        pf = [td["native"]["model"]["rig_features"] for td in live if td["index"] not in failed]
        rig["pairs_outside_span"] = RC.span_residual([c["features"] for c in rig["calibration"]
                                                      if c.get("measured") is not None], pf)
    return {"rows": out, "rig": rig}


def rig_fit(cal: Sequence[dict], pcp_batch: float | None, steps: int, cpu: int) -> dict:
    """The rig cost table from measured calibration runs (each with ``features``, ``runs``
    and maybe an ``error``): :func:`slabtune.tuner.rigcost.fit` of their medians, and what
    the run stores of it (``native_rig`` in the manifest: constants, R^2, what was not
    identified, every calibration configuration with its runs, median and fitted value).
    ``constants`` is None, with ``error``, when fewer than 2 calibration runs succeeded."""
    from slabtune.model import cost as C
    from slabtune.tuner import rigcost as RC

    ok = [c for c in cal if "error" not in c and c["runs"]]
    entries = [{"topology": c["topology"], "params": c["params"], "key": c.get("key"),
                "features": c["features"], "runs": [float(x) for x in c["runs"]],
                "dropped": c.get("dropped", 0), "error": c.get("error"),
                "measured": statistics.median(c["runs"]) if c["runs"] and "error" not in c
                else None} for c in cal]
    rig: dict[str, Any] = {
        "names": list(C.RIG_FREE), "unit": "ns in the allocator per alloc+free pair",
        "pcp_batch": pcp_batch, "timing_steps": steps, "cpu": cpu,
        "table": "rig: line_local_ns = line_remote_ns = 0, rho_max = 0 (no queueing)",
        "calibration": entries, "constants": None, "error": None}
    if len(ok) < 2:
        rig["error"] = f"{len(ok)} of {len(cal)} calibration runs succeeded (2 needed)"
        return rig
    f = RC.fit([c["features"] for c in ok], [statistics.median(c["runs"]) for c in ok],
               rig["names"])
    fitted = iter(f["fitted"])
    for e in entries:
        e["fitted"] = next(fitted) if e["measured"] is not None else None
    rig.update({k: f[k] for k in ("constants", "stderr", "fitted_constants",
                                  "not_identified", "aliased", "rank", "r2", "runs")})
    return rig


_RUNNERS = {"guest": run_guest_task, "host": run_host_task}


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


# --------------------------------------------------------------------------- dispatch


@dataclasses.dataclass(frozen=True)
class ValidateResult:
    run_dir: Path
    tasks: int
    failed: int


def _task_dict(t: Task, spec: ValidateSpec, timeout_s: float | None) -> dict:
    return {"index": t.index, "candidate": t.candidate.to_json(), "topology": t.topology,
            "target": t.target, "spec_text": spec.text, "spec_name": spec.name,
            "timeout_s": timeout_s}


def _guest_options(task: dict, spec: ValidateSpec, use_resource: bool, node_cpus: int) -> dict:
    present = spec.topology(task["topology"]).present
    opts: dict[str, Any] = {"num_cpus": max(1, min(present, node_cpus))}
    if use_resource:
        opts["resources"] = {QEMU_RESOURCE: 1}
    return opts


def local_resources() -> dict[str, float]:
    """Custom resources to declare on a local Ray instance: ``qemu`` (one guest at a time
    per two cores) when qemu and a kernel are installed."""
    if guest_available() is not None:
        return {}
    return {QEMU_RESOURCE: float(max(1, (os.cpu_count() or 1) // 2))}


def validate(cands: Sequence[Candidate], spec: ValidateSpec, targets: Sequence[str],
             out_dir: str | os.PathLike = "runs", ray_address: str | None = None,
             timeout_s: float | None = None, source: str = "") -> ValidateResult:
    """Run every task on Ray (a local instance unless an address is given, or the instance
    already initialised in this process) and store the rows; see the module docstring."""
    from slabtune.results import store
    from slabtune.sweeps.dispatch import ray_session
    from slabtune.sweeps.runner import git_revision, package_versions

    cands = with_baseline(cands)
    info = preflight(cands, spec, targets)
    tasks = plan_tasks(cands, spec, targets)
    if not tasks:
        raise SlabtuneError("--target: no task to run (host runs only the baseline)")
    meta = {"name": f"validate-{spec.name}", "evaluator": "validate", "chunk_size": 1,
            "targets": list(targets), "topologies": [t.name for t in spec.fleet.topologies],
            "candidates": [c.to_json() for c in cands], "source": source,
            "plan": [[t.candidate.id, t.topology, t.target] for t in tasks], **info}
    spec_hash = hashlib.sha256(json.dumps([meta, spec.text], sort_keys=True).encode()).hexdigest()
    # the run directory is made once Ray is up, so a bad --ray-address leaves nothing behind
    with ray_session(ray_address, resources=local_resources()) as sess:
        run = store.create_run(out_dir, spec=meta, spec_hash=spec_hash, spec_text=spec.text,
                               n_chunks=len(tasks), columns=[], versions=package_versions(),
                               git_revision=git_revision(), extra={"kind": "validate"})
        with run.lock():
            run.start_attempt(ray=sess)
            failed = _dispatch(run, tasks, spec, targets, timeout_s)
            run.finish()
    return ValidateResult(run.path, len(tasks), failed)


def _dispatch(run, tasks: Sequence[Task], spec: ValidateSpec, targets: Sequence[str],
              timeout_s: float | None) -> int:
    """Submit every task to the current Ray session, store each as it finishes; returns the
    number of failed tasks."""
    import ray

    failed = 0
    res = ray.cluster_resources()
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    node_cpus = int(max((n["Resources"].get("CPU", 1) for n in nodes), default=1))
    use_qemu = QEMU_RESOURCE in res
    if "guest" in targets and not use_qemu and len(nodes) > 1:
        raise SlabtuneError(f"--target guest: no Ray node offers the {QEMU_RESOURCE!r} "
                            "resource (start workers with --resources='{\"qemu\": 1}')")
    remote = ray.remote(max_retries=MAX_RETRIES,
                        retry_exceptions=[OSError, subprocess.SubprocessError])(run_task)
    tds = [_task_dict(t, spec, timeout_s) for t in tasks]
    nat = [td for td in tds if td["target"] == "native"]
    if nat:
        model = ray.remote(max_retries=MAX_RETRIES, retry_exceptions=[OSError])(
            native_model_task).options(num_cpus=1)
        try:
            filled = ray.get(model.remote(nat, spec.text, spec.name))
        except ray.exceptions.RayError as err:
            lines = [ln for ln in str(err).strip().splitlines() if ln.strip()]
            raise SlabtuneError("native: the model's predictions failed: "
                                + (lines[-1] if lines else err.__class__.__name__)) from None
        for td in nat:
            td.update(filled["pairs"][td["index"]])
    def store(td: dict, rows: list[dict]) -> int:
        bad = any(r["status"] == "failed" for r in rows)
        st = next((r for r in rows if r["status"] == "failed"), None)
        run.write_part(td["index"], frame(rows), status="failed" if bad else "ok",
                       candidate=td["candidate"]["id"], topology=td["topology"],
                       target=td["target"], error=st["error"] if st else None)
        return int(bad)

    def ray_failure(err) -> tuple[str, list[str]]:
        lines = [ln for ln in str(err).strip().splitlines() if ln.strip()]
        return (f"failed after {MAX_RETRIES + 1} attempts: "
                + (lines[-1] if lines else err.__class__.__name__)), lines

    refs = {}
    for td in tds:
        if td["target"] == "native":
            continue
        opts = (_guest_options(td, spec, use_qemu, node_cpus) if td["target"] == "guest"
                else {"num_cpus": 1})
        refs[remote.options(**opts).remote(td)] = td
    while refs:
        ready, _ = ray.wait(list(refs), num_returns=1)
        for ref in ready:
            td = refs.pop(ref)
            try:
                rows = ray.get(ref)["rows"]
            except ray.exceptions.RayError as err:
                msg, lines = ray_failure(err)
                rows = failed_rows(td, msg, console_tail="\n".join(lines[-20:]))
            failed += store(td, rows)
    if nat:
        # one task for every native pair, once the guests are done: its timing runs take
        # turns (see run_native_batch) and no guest competes with them for the cores
        batch = ray.remote(max_retries=MAX_RETRIES, retry_exceptions=[OSError])(
            run_native_batch).options(num_cpus=max(1, node_cpus))
        try:
            res = ray.get(batch.remote(nat, filled["calibration"], filled["pcp_batch"]))
            got = res["rows"]
            if res["rig"] is not None:
                # the rig table and its calibration, so the report re-derives its figures
                run.manifest["native_rig"] = res["rig"]
        except ray.exceptions.RayError as err:
            msg, lines = ray_failure(err)
            got = {td["index"]: failed_rows(td, msg, console_tail="\n".join(lines[-20:]))
                   for td in nat}
        for td in nat:
            failed += store(td, got[td["index"]])
    return failed


def is_validate_run(run) -> bool:
    return run.manifest.get("kind") == "validate"


def task_table(run) -> list[dict]:
    """One entry per task from the manifest (state, status, error)."""
    out = []
    plan = run.manifest["spec"].get("plan") or []
    for i in range(run.n_chunks):
        st = run.manifest["chunks"]["states"].get(str(i), {})
        cand, topo, target = plan[i] if i < len(plan) else ("?", "?", "?")
        out.append({"task": i, "state": st.get("state", "pending"),
                    "status": st.get("status") or "pending",
                    "candidate": st.get("candidate", cand), "topology": st.get("topology", topo),
                    "target": st.get("target", target), "error": st.get("error")})
    return out



"""Validation specs (TOML): the topologies and model workload a candidate is validated on, and
how guests and the native rig run (docs/SPECS.md).
"""


from __future__ import annotations

import dataclasses
import math
import tomllib
from collections.abc import Mapping
from typing import Any

from slabtune.errors import SlabtuneError
from slabtune.model.topology import Topology

# --------------------------------------------------------------------------- spec


@dataclasses.dataclass(frozen=True)
class ValidateSpec:
    """A validation spec: topologies (+ model workload) and how guests run."""

    name: str
    text: str
    fleet: Any                     # slabtune.tuner.fleet.Fleet
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
    from slabtune.kernel import guest

    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise SlabtuneError(f"--topologies {name}: not valid TOML ({err})") from None
    bad = set(doc) - {"validate", "fleet"}
    if bad:
        raise SlabtuneError(f"--topologies {name}: unknown table [{sorted(bad)[0]}]")
    if "fleet" not in doc:
        raise SlabtuneError(f"--topologies {name}: missing the [fleet] table")
    fleet = _parse_fleet(doc["fleet"])
    v = doc.get("validate", {})
    if not isinstance(v, Mapping):
        raise SlabtuneError(f"--topologies {name}: validate: expected a table")
    bad = set(v) - {"timeout_s", "retries", "memory_mib", "accel", "workload", "native",
                    "boots"}
    if bad:
        raise SlabtuneError(f"validate.{sorted(bad)[0]}: unknown field")
    timeout = v.get("timeout_s", 180.0)
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) \
            or not math.isfinite(timeout) or not 0 < timeout <= 3600:
        raise SlabtuneError(f"validate.timeout_s: {timeout!r} is not a finite number in "
                            "(0, 3600]")
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
    fields = {f.name for f in dataclasses.fields(guest.WorkloadSpec)}
    workload_tables = v.get("workload", [{}])
    if not isinstance(workload_tables, list):
        raise SlabtuneError("validate.workload: expected [[validate.workload]] tables")
    for i, w in enumerate(workload_tables):
        if not isinstance(w, Mapping):
            raise SlabtuneError(f"validate.workload[{i}]: expected a table")
        bad = set(w) - fields
        if bad:
            raise SlabtuneError(f"validate.workload[{i}].{sorted(bad)[0]}: unknown field")
        ws = guest.WorkloadSpec(**w)
        try:
            ws.argv()
        except SlabtuneError as err:
            raise SlabtuneError(f"validate.workload[{i}]: {err}") from None
        wls.append(ws)
    for t in fleet.topologies:
        try:
            guest.topology_qemu_args(t.topology, mem)
        except SlabtuneError as err:
            raise SlabtuneError(f"fleet.topology {t.name}: {err}") from None
        for i, ws in enumerate(wls):     # the workload pins to CPUs every guest must have
            for field in ("cpu_a", "cpu_b"):
                cpu = getattr(ws, field)
                if cpu is not None and cpu >= t.topology.online:
                    raise SlabtuneError(f"validate.workload[{i}].{field}: CPU {cpu} does not "
                                        f"exist on fleet.topology {t.name} "
                                        f"({t.topology.online} online CPUs, "
                                        f"0..{t.topology.online - 1})")
    native = _parse_native(v.get("native", {}), fleet)
    return ValidateSpec(name, text, fleet, tuple(wls), float(timeout), retries, mem, accel,
                        native, boots)


def _parse_fleet(table: Any):
    """The spec's ``[fleet]`` (:func:`slabtune.tuner.fleet.parse_fleet`, which takes SLAB
    profiles as well), except that a SLAB fleet names its topologies itself: validation
    reads its profile to pick the lab kernel, the knobs a candidate may set and the
    model's profile of each pair (sweeps/simulate's SLAB branch)."""
    from slabtune.model import profiles
    from slabtune.tuner.fleet import parse_fleet

    name = table.get("profile") if isinstance(table, Mapping) else None
    if isinstance(name, str) and name in profiles.SLAB_PROFILES and "sweep" in table:
        raise SlabtuneError(f"fleet.sweep: a SLAB fleet ({name}) takes [[fleet.topology]] "
                            "tables, not a sweep spec's topologies")
    return parse_fleet(table)


def is_slab_spec(spec: ValidateSpec) -> bool:
    """Whether a validation spec's fleet names a SLAB profile."""
    from slabtune.model import profiles

    return profiles.is_slab(spec.fleet.profile)


NATIVE_DEFAULTS = {"cache": "kmalloc-512", "steps": 2000, "seed": 0,
                   "workload": {"kind": "local", "live": 64, "burst": 32, "drain": "eager"},
                   "timing_sync_every": 0, "timing_steps": 1_000_000, "timing_repeats": 5,
                   "calibration_runs": 28, "calibration_seed": 1}


def _parse_native(tab: Any, fleet) -> dict:
    """``[validate.native]``: which cache of the fleet the native allocator runs, the model
    workload driving it (a sweeps/simconfig.py ``[workload]`` table), steps and seed, the
    timing runs, and the calibration runs of the rig cost table (``calibration_runs``
    configurations drawn with ``calibration_seed``, see :mod:`slabtune.validate.rigcost`)."""
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
    _check_native_workload(out["workload"])
    return out


def _check_native_workload(table: dict) -> None:
    """``[validate.native.workload]`` is a simulation config's ``[workload]`` table
    (:func:`slabtune.sweeps.simconfig.parse_workload`): checked now, with its field
    names prefixed, so a bad value (a NaN, a negative count) fails before any task runs."""
    from slabtune.sweeps import simconfig

    try:
        simconfig.parse_workload(table)
    except SlabtuneError as err:
        raise SlabtuneError(f"validate.native.{err}") from None


def load_spec(ref: str) -> ValidateSpec:
    """A spec from a path or a built-in name (``validate_quick``)."""
    from slabtune.sweeps.spec import read_text_file
    from slabtune.tuner.study import spec_file

    p = spec_file(ref, "--topologies")
    return parse_spec(read_text_file(p, "--topologies"), p.stem)

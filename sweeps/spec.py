"""Sweep specs: a TOML file naming the axes of a grid, validated against a schema.

A spec looks like::

    [sweep]
    name = "quick"
    evaluator = "structural"        # which model evaluates a configuration
    chunk_size = 4096               # configurations per chunk (one Ray task each)
    seed = 0
    metrics = ["order", "objs_per_slab"]   # optional; every metric when absent
    steps = 2000                    # dynamics evaluator only: simulated steps per config
    ops_per_step = 1                # dynamics evaluator only: run length b (speed/fidelity)

    [topology]                      # topology generator
    cpus = { logrange = [1, 8192], factor = 2 }
    nodes = [1, 2, 4]
    memoryless_nodes = [0, 1]       # the highest-numbered nodes have CPUs but no memory

    [cache]
    cache = ["kmalloc", "maple_node"]   # or: size = { logrange = [8, 2097152], factor = 2 }

    [kernel]
    profile = "all"

    [boot]
    min_order = { range = [0, 3] }  # inclusive
    max_order = 3

    [[exclude]]                     # rows matching every key are dropped
    profile = "v2.6.27"
    cpus = { gt = 4096 }

Every key of the sections ``topology``, ``cache``, ``kernel``, ``boot``, ``policy`` and
``workload`` is an axis; the grid is the product of the axes in that order (the last axis
varies fastest), minus the excluded rows and the impossible topologies (more memoryless
nodes than nodes, fewer possible than present CPUs, more than 8192 CPUs).  An axis value is
a scalar, a list, ``{range = [a, b], step = s}`` or ``{logrange = [a, b], factor = f}`` /
``{logrange = [a, b], num = n}`` (geometric, rounded, duplicates dropped).  String axes
accept group names: ``cache = "kmalloc" | "named" | "all"``, ``profile = "all"`` (every SLUB
profile) or ``"slab"`` (every SLAB profile, mm/slab.c: model/slab.py's structure and
model/slab_dynamics.py; the SLUB boot axes do not apply to SLAB rows, which take their
kernel's default slab order cap).

Evaluators add axes (see :mod:`slabtune.sweeps.evaluators`): the ``dynamics`` evaluator
needs ``[workload] workload = [...]`` (local, producer_consumer, request_response,
block_io) and takes workload parameters as axes (``live``, ``depth``, ``threads``,
``burst``, ``completion_remote``, and probabilities in percent: ``alloc_prob_pct``,
``cross_node_pct``, ``irq_free_pct``); ``[sweep] steps`` sets its simulated steps.

Any mistake raises :class:`SpecError` with one line naming the field and the reason.  This
module never imports JAX.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import tomllib
from importlib import resources
from typing import Any

from slabtune.errors import SlabtuneError
from slabtune.model import caches, limits, profiles
from slabtune.model.constants import MAX_OPS_PER_STEP
from slabtune.model.topology import MAX_CPUS, MAX_NODES
from slabtune.results import columns
from slabtune.results.safeio import TEXT_LIMIT, read_bounded

#: Spec sections whose keys are axes, in grid order.
AXIS_SECTIONS: tuple[str, ...] = ("topology", "cache", "kernel", "boot", "policy", "workload")
#: Names of the specs shipped in sweeps/.
BUILTIN_SPECS: tuple[str, ...] = ("quick", "fleet", "fleet_xl", "seeds", "memoryless")
#: Largest object stride a ``size`` axis accepts (2 MiB).
MAX_SIZE = 2 * 1024 * 1024
#: Largest chunk a spec may ask for.
MAX_CHUNK = 1 << 22
#: Simulated steps per configuration of a dynamics sweep ([sweep] steps).
DEFAULT_STEPS = 2000
MAX_STEPS = 1_000_000
#: Most points a ``logrange`` axis may generate before rounding (no axis has more values:
#: the widest, ``size``, spans 8..2 MiB).
MAX_AXIS_POINTS = 1 << 22
#: Most configurations (rows of the full product, before exclusions) ``sweep run`` accepts.
#: Larger grids are refused before anything is allocated; ``sweep plan`` still sizes them.
#: 1e10 rows is days of model time on a GPU and about a terabyte of parquet.
MAX_GRID_ROWS = 10_000_000_000
_COMPARISONS = ("eq", "ne", "lt", "le", "gt", "ge", "in")


class SpecError(SlabtuneError):
    """A sweep spec that cannot be run; the message names the field and the reason."""


@dataclasses.dataclass(frozen=True)
class AxisDef:
    """Schema of one axis: its section, value type, bounds or choices, and default."""

    section: str
    kind: type  # int or str
    lo: int = 0
    hi: int = 0
    default: Any = None
    doc: str = ""

    def choices(self) -> tuple[str, ...]:
        """Allowed values of a string axis (empty for int axes)."""
        return ()


@dataclasses.dataclass(frozen=True)
class ChoiceAxis(AxisDef):
    """A string axis whose values come from a fixed table; ``groups`` expand to several."""

    values: tuple[str, ...] = ()
    groups: tuple[tuple[str, tuple[str, ...]], ...] = ()

    def choices(self) -> tuple[str, ...]:
        return self.values


_KMALLOC = tuple(c.name for c in caches.CACHES.values() if c.is_kmalloc)
_NAMED = tuple(c.name for c in caches.CACHES.values() if not c.is_kmalloc)

#: Axes every evaluator understands.  Evaluators add their own (see sweeps.evaluators).
COMMON_AXES: dict[str, AxisDef] = {
    "cpus": AxisDef("topology", int, 1, MAX_CPUS, None, "present (= online) CPUs"),
    "cpus_per_node": AxisDef("topology", int, 1, MAX_CPUS, None,
                             "CPUs on each node; cpus = nodes * cpus_per_node"),
    "nodes": AxisDef("topology", int, 1, MAX_NODES, 1, "NUMA nodes"),
    "memoryless_nodes": AxisDef("topology", int, 0, MAX_NODES - 1, 0,
                                "nodes with CPUs but no memory (the highest-numbered ones)"),
    "possible": AxisDef("topology", int, 0, MAX_CPUS, 0,
                        "possible CPUs (nr_cpu_ids); 0 means the same as cpus"),
    "cache": ChoiceAxis("cache", str, default=None, doc="slab cache by name",
                        values=tuple(caches.CACHES),
                        groups=(("kmalloc", _KMALLOC), ("named", _NAMED),
                                ("all", tuple(caches.CACHES)))),
    "size": AxisDef("cache", int, 8, MAX_SIZE, None,
                    "object stride of an anonymous, late-created cache"),
    "profile": ChoiceAxis("kernel", str, default=None,
                          doc="kernel profile (SLUB, or SLAB: slab-v2.6.33, slab-v3.1, "
                              "slab-v6.1)",
                          values=tuple(profiles.PROFILES) + tuple(profiles.SLAB_PROFILES),
                          groups=(("all", tuple(profiles.PROFILES)),
                                  ("slab", tuple(profiles.SLAB_PROFILES)))),
    "min_order": AxisDef("boot", int, 0, profiles.MAX_PAGE_ORDER, 0, "slub_min_order"),
    "max_order": AxisDef("boot", int, 0, profiles.MAX_PAGE_ORDER, profiles.DEFAULT_MAX_ORDER,
                         "slub_max_order"),
    "min_objects": AxisDef("boot", int, 0, 32767, 0, "slub_min_objects (0: unset)"),
    "explicit_sheaf": AxisDef("policy", int, -1, 4096, -1,
                              "sheaf capacity the cache's creator asks for (-1: the cache's own)"),
}


@dataclasses.dataclass(frozen=True)
class Axis:
    """One expanded axis: its name, kind and values (ints, or strings for choice axes)."""

    name: str
    kind: type
    values: tuple

    def __len__(self) -> int:
        return len(self.values)


@dataclasses.dataclass(frozen=True)
class Exclusion:
    """Drop rows where every ``(axis, op, operand)`` test holds.  ``operand`` is a value,
    a tuple of values for ``in``, or ``("axis", name)`` to compare with another axis."""

    tests: tuple[tuple[str, str, Any], ...]


@dataclasses.dataclass(frozen=True)
class SweepSpec:
    """A validated spec: everything the runner needs, as plain data."""

    name: str
    description: str
    evaluator: str
    chunk_size: int
    seed: int
    steps: int
    metrics: tuple[str, ...]
    axes: tuple[Axis, ...]
    exclude: tuple[Exclusion, ...]
    defaults: tuple[tuple[str, Any], ...]
    source: str = ""
    #: Run length of the dynamics model (ops of one kind per rep per step); 1 is exact.
    ops_per_step: int = 1

    @property
    def axis_names(self) -> tuple[str, ...]:
        return tuple(a.name for a in self.axes)

    def axis(self, name: str) -> Axis:
        for a in self.axes:
            if a.name == name:
                return a
        raise KeyError(name)

    @property
    def product(self) -> int:
        """Rows of the full grid before exclusions."""
        return math.prod(len(a) for a in self.axes)

    def to_dict(self) -> dict:
        """Plain JSON-able form; :func:`from_dict` inverts it (used to ship specs to tasks)."""
        return {
            "name": self.name,
            "description": self.description,
            "evaluator": self.evaluator,
            "chunk_size": self.chunk_size,
            "seed": self.seed,
            "steps": self.steps,
            "metrics": list(self.metrics),
            "axes": [[a.name, "int" if a.kind is int else "str", list(a.values)]
                     for a in self.axes],
            "exclude": [[list(t) if not isinstance(t[2], tuple) else [t[0], t[1], list(t[2])]
                         for t in e.tests] for e in self.exclude],
            "defaults": [list(d) for d in self.defaults],
            # only when set, so the hash of a spec without it is what it always was
            **({"ops_per_step": self.ops_per_step} if self.ops_per_step != 1 else {}),
        }

    @property
    def hash(self) -> str:
        """sha256 of the canonical spec (everything but the description and source path)."""
        d = self.to_dict()
        d.pop("description")
        blob = json.dumps(d, sort_keys=True, separators=(",", ":")).encode()
        return hashlib.sha256(blob).hexdigest()


def over_grid_limit(spec: SweepSpec) -> bool:
    """Whether the spec's full product exceeds :data:`MAX_GRID_ROWS`."""
    return spec.product > MAX_GRID_ROWS


def check_grid_size(spec: SweepSpec) -> None:
    """Refuse a grid over :data:`MAX_GRID_ROWS` configurations, naming its size, or one cut
    into more chunks than model.limits' ``chunks`` (each a Ray task and a manifest state:
    6.6e9 rows in chunks of 1 was 6.6e9 tasks)."""
    if over_grid_limit(spec):
        axes = " x ".join(f"{a.name}[{len(a)}]" for a in spec.axes)
        raise SpecError(f"grid: {spec.product} configurations ({axes}) are over the limit of "
                        f"{MAX_GRID_ROWS} per sweep; narrow an axis or split the sweep into "
                        "several specs")
    chunks = -(-spec.product // spec.chunk_size)
    try:
        limits.check("chunks", chunks, "sweep.chunk_size",
                     f" ({spec.product:,} configurations in chunks of {spec.chunk_size:,}; "
                     "a larger chunk_size makes fewer)")
    except SlabtuneError as err:
        raise SpecError(str(err)) from None


def from_dict(d: dict) -> SweepSpec:
    """Rebuild a :class:`SweepSpec` from :meth:`SweepSpec.to_dict` output."""
    axes = tuple(Axis(n, int if k == "int" else str, tuple(v)) for n, k, v in d["axes"])
    excl = []
    for tests in d["exclude"]:
        ts = []
        for name, op, operand in tests:
            if isinstance(operand, list):
                operand = tuple(operand)
            ts.append((name, op, operand))
        excl.append(Exclusion(tuple(ts)))
    return SweepSpec(
        name=d["name"], description=d.get("description", ""), evaluator=d["evaluator"],
        chunk_size=int(d["chunk_size"]), seed=int(d["seed"]),
        steps=int(d.get("steps", DEFAULT_STEPS)), metrics=tuple(d["metrics"]),
        axes=axes, exclude=tuple(excl), defaults=tuple((k, v) for k, v in d["defaults"]),
        ops_per_step=int(d.get("ops_per_step", 1)),
    )


# --------------------------------------------------------------------------- loading


def builtin_path(name: str):
    """Path of a built-in spec (``quick`` -> sweeps/quick.toml)."""
    return resources.files("slabtune.sweeps").joinpath(f"{name}.toml")


def _is_builtin(name: str) -> bool:
    """A bare name of a spec shipped in sweeps/ (the documented ones are BUILTIN_SPECS;
    benchmark specs such as ``dynamics_bench`` live there too)."""
    if not name or "/" in name or name.endswith(".toml") or name.startswith("."):
        return False
    return name in BUILTIN_SPECS or builtin_path(name).is_file()


def load(spec: str) -> SweepSpec:
    """Load a spec from a path or a built-in name and validate it."""
    if _is_builtin(spec) and not os.path.exists(spec):
        text = builtin_path(spec).read_text()
        where = f"{spec}.toml"
    else:
        if not os.path.exists(spec):
            raise SpecError(f"spec: {spec!r} is neither a file nor a built-in spec "
                            f"({', '.join(BUILTIN_SPECS)})")
        try:
            text = read_text_file(spec, "spec")
        except SlabtuneError as err:
            raise SpecError(str(err)) from None
        where = os.path.basename(spec)
    return parse(text, where)


def read_text_file(path, field: str) -> str:
    """The UTF-8 text of an input file (a spec, config, cost or candidate file).  Each way
    reading can fail is one :class:`SlabtuneError` naming ``field`` and the path: missing,
    a directory, a path through a file, unreadable, not UTF-8 (binary), not a regular file
    (a device such as /dev/zero, a FIFO), larger than TEXT_LIMIT (16 MiB: checked before a
    byte is read, slabtune.results.safeio.read_bounded)."""
    p = os.fspath(path)
    raw = read_bounded(p, TEXT_LIMIT, field)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise SlabtuneError(f"{field}: {p} is not UTF-8 text (bad byte at offset "
                            f"{err.start}; a binary file?)") from None


def parse(text: str, where: str = "<spec>") -> SweepSpec:
    """Parse and validate TOML text; errors are prefixed with ``where``."""
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise SpecError(f"{where}: not valid TOML: {err}") from None
    try:
        return validate(doc)
    except SpecError as err:
        raise SpecError(f"{where}: {err}") from None


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _expand_int(field: str, raw, d: AxisDef) -> tuple[int, ...]:
    """Turn one int axis value form into a sorted-as-given tuple of ints within bounds."""
    if _is_int(raw):
        vals = [raw]
    elif isinstance(raw, list):
        if not raw:
            raise SpecError(f"{field}: empty list")
        for v in raw:
            if not _is_int(v):
                raise SpecError(f"{field}: {v!r} is not an integer")
        vals = list(raw)
    elif isinstance(raw, dict):
        vals = _expand_range(field, raw, d)
    else:
        raise SpecError(f"{field}: expected an integer, a list, {{range = [a, b]}} or "
                        f"{{logrange = [a, b]}}, got {raw!r}")
    for v in vals:
        if not d.lo <= v <= d.hi:
            raise SpecError(f"{field}: value {v} is outside {d.lo}..{d.hi}")
    if len(set(vals)) != len(vals):
        dup = next(v for v in vals if vals.count(v) > 1)
        raise SpecError(f"{field}: duplicate value {dup}")
    return tuple(vals)


def _expand_range(field: str, raw: dict, d: AxisDef) -> list[int]:
    """``{range = ...}`` or ``{logrange = ...}`` as a list of ints; a range is checked
    against the axis bounds before it is expanded, a logrange's point count against
    :data:`MAX_AXIS_POINTS`, so no form allocates more than an axis can hold."""
    keys = set(raw)
    if keys <= {"range", "step"} and "range" in keys:
        ab, step = raw["range"], raw.get("step", 1)
        _pair(f"{field}.range", ab)
        if not _is_int(step) or step < 1:
            raise SpecError(f"{field}.step: must be a positive integer, got {step!r}")
        _range_in_bounds(field, ab[0], ab[1], step, d)
        return list(range(ab[0], ab[1] + 1, step))
    if "logrange" in keys and keys <= {"logrange", "factor", "num"}:
        ab = raw["logrange"]
        _pair(f"{field}.logrange", ab)
        a, b = ab
        if a < 1:
            raise SpecError(f"{field}.logrange: start must be >= 1, got {a}")
        if ("factor" in raw) == ("num" in raw):
            raise SpecError(f"{field}.logrange: give exactly one of factor or num")
        return _dedupe_points(_log_points(field, raw, a, b), b)
    raise SpecError(f"{field}: unknown range form {sorted(keys)} "
                    "(use {range = [a, b], step = s} or {logrange = [a, b], factor = f | num = n})")


def _range_in_bounds(field: str, start: int, stop: int, step: int, d: AxisDef) -> None:
    """Fail on the first value of ``range(start, stop + 1, step)`` outside the axis bounds,
    as the expanded list would, without expanding it."""
    if start < d.lo or start > d.hi:
        raise SpecError(f"{field}: value {start} is outside {d.lo}..{d.hi}")
    first_above = start + ((d.hi - start) // step + 1) * step
    if first_above <= stop:
        raise SpecError(f"{field}: value {first_above} is outside {d.lo}..{d.hi}")


def _log_points(field: str, raw: dict, a: int, b: int) -> list[float]:
    """The geometric points of a logrange from ``a`` to ``b``, by ``factor`` or ``num``;
    more than :data:`MAX_AXIS_POINTS` of them is an error naming the key."""
    if "factor" in raw:
        f = raw["factor"]
        if not isinstance(f, (int, float)) or isinstance(f, bool) or not math.isfinite(f) \
                or f <= 1:
            raise SpecError(f"{field}.factor: must be a finite number > 1, got {f!r}")
        n = int(math.floor(math.log(b / a) / math.log(f) + 1e-9)) + 1
        if n > MAX_AXIS_POINTS:
            raise SpecError(f"{field}.factor: {f!r} makes {n} points from {a} to {b}; "
                            f"an axis takes at most {MAX_AXIS_POINTS}")
        return [a * f ** k for k in range(n)]
    n = raw["num"]
    if not _is_int(n) or not 2 <= n <= MAX_AXIS_POINTS:
        raise SpecError(f"{field}.num: must be an integer in 2..{MAX_AXIS_POINTS}, got {n!r}")
    return [a * (b / a) ** (k / (n - 1)) for k in range(n)]


def _dedupe_points(pts: list[float], b: int) -> list[int]:
    """Geometric points rounded to integers (at most ``b``), duplicates dropped, in order."""
    out: list[int] = []
    seen: set[int] = set()
    for x in pts:
        v = min(int(round(x)), b)
        if v not in seen:
            seen.add(v)
            out.append(v)
    return out


def _pair(field: str, ab) -> None:
    if not (isinstance(ab, list) and len(ab) == 2 and all(_is_int(x) for x in ab)):
        raise SpecError(f"{field}: expected [start, stop] integers, got {ab!r}")
    if ab[0] > ab[1]:
        raise SpecError(f"{field}: start {ab[0]} is above stop {ab[1]}")


def _expand_str(field: str, raw, d: AxisDef) -> tuple[str, ...]:
    items = [raw] if isinstance(raw, str) else raw
    if not isinstance(items, list) or not items:
        raise SpecError(f"{field}: expected a name or a non-empty list of names, got {raw!r}")
    groups = dict(getattr(d, "groups", ()))
    out: list[str] = []
    for it in items:
        if not isinstance(it, str):
            raise SpecError(f"{field}: {it!r} is not a string")
        if it in groups:
            names = groups[it]
        else:
            names = (_canonical(field, it, d),)
        for n in names:
            if n in out:
                raise SpecError(f"{field}: duplicate value {n!r}")
            out.append(n)
    return tuple(out)


def _canonical(field: str, value: str, d: AxisDef) -> str:
    """Normalise a choice (kmalloc-1024 -> kmalloc-1k, 6.1 -> v6.1) or fail naming it."""
    if field.endswith(".cache"):
        try:
            return caches.get_cache(value).name
        except ValueError:
            pass
    elif field.endswith(".profile"):
        try:
            return profiles.get_any_profile(value).name
        except ValueError:
            pass
    elif value in d.choices():
        return value
    groups = ", ".join(g for g, _ in getattr(d, "groups", ()))
    known = ", ".join(d.choices())
    raise SpecError(f"{field}: unknown value {value!r} (groups: {groups}; known: {known})")


def validate(doc: dict) -> SweepSpec:
    """Validate a parsed TOML document against the schema and expand its axes."""
    from slabtune.sweeps.evaluators import EVALUATORS  # no JAX at import time

    _check_sections(doc)
    sweep = _sweep_table(doc)
    name = check_name("sweep.name", sweep.get("name"))
    desc = sweep.get("description", "")
    if not isinstance(desc, str):
        raise SpecError("sweep.description: must be a string")
    ev_name = sweep.get("evaluator", "structural")
    if not isinstance(ev_name, str) or ev_name not in EVALUATORS:
        raise SpecError(f"sweep.evaluator: unknown evaluator {ev_name!r} "
                        f"(known: {', '.join(EVALUATORS)})")
    ev = EVALUATORS[ev_name]
    chunk, seed, steps, ops_per_step = _sweep_numbers(sweep, ev_name, ev)
    schema = {**COMMON_AXES, **ev.extra_axes()}
    axes = _axes(doc, schema, ev_name)
    names = [a.name for a in axes]
    metrics = _metrics(sweep, ev_name, ev, names)
    _check_axis_set(names, schema, ev_name, ev)
    exclude = tuple(_exclusion(i, e, axes) for i, e in enumerate(_list_of_tables(doc)))
    defaults = tuple((k, d.default) for k, d in schema.items()
                     if k not in names and d.default is not None)
    spec = SweepSpec(name=name, description=desc, evaluator=ev_name, chunk_size=chunk,
                     seed=seed, steps=steps, metrics=tuple(metrics), axes=tuple(axes),
                     exclude=exclude,
                     defaults=defaults, ops_per_step=ops_per_step)
    _check_slab_boot(spec)
    ev.check(spec)
    return spec


#: Axes that are SLUB knobs (boot parameters and the sheaf request): SLAB rows do not read
#: them, so a grid whose every profile is SLAB may not sweep them.
SLUB_ONLY_AXES: dict[str, str] = {"min_order": "slub_min_order", "max_order": "slub_max_order",
                                  "min_objects": "slub_min_objects",
                                  "explicit_sheaf": "sheaf_capacity"}


def _check_slab_boot(spec: SweepSpec) -> None:
    """A SLUB-only axis (:data:`SLUB_ONLY_AXES`) with a value other than its default on a
    grid whose profiles are all SLAB is a one-line error naming the knob and profile
    (:func:`slabtune.model.slab.foreign_knob`).  On a grid mixing SLAB and SLUB profiles
    those axes apply to the SLUB rows; the SLAB rows take their kernel's defaults."""
    from slabtune.model import slab

    names = spec.axis("profile").values
    if not all(n in profiles.SLAB_PROFILES for n in names):
        return
    for ax in spec.axes:
        knob = SLUB_ONLY_AXES.get(ax.name)
        if knob is None or ax.values == (COMMON_AXES[ax.name].default,):
            continue
        prof = profiles.SLAB_PROFILES[names[0]]
        raise SpecError(f"{COMMON_AXES[ax.name].section}.{ax.name}: "
                        f"{slab.foreign_knob(knob, prof)}")


def _check_sections(doc: dict) -> None:
    """Every top-level key is a known section."""
    allowed_top = {"sweep", "exclude", *AXIS_SECTIONS}
    for key in doc:
        if key not in allowed_top:
            raise SpecError(f"{key}: unknown section (allowed: {', '.join(sorted(allowed_top))})")


def _sweep_table(doc: dict) -> dict:
    """The ``[sweep]`` table, with only known keys."""
    sweep = doc.get("sweep")
    if not isinstance(sweep, dict):
        raise SpecError("sweep: missing [sweep] section")
    known_sweep = {"name", "description", "evaluator", "chunk_size", "seed", "metrics", "steps",
                   "ops_per_step"}
    for key in sweep:
        if key not in known_sweep:
            raise SpecError(f"sweep.{key}: unknown key (allowed: {', '.join(sorted(known_sweep))})")
    return sweep


def check_name(field: str, name) -> str:
    """A run or study name: non-empty letters, digits, '-', '_' and '.' (it becomes part of
    a directory name); returns it or raises SpecError naming ``field``."""
    if not isinstance(name, str) or not name or not all(c.isalnum() or c in "-_." for c in name):
        raise SpecError(f"{field}: must be a non-empty name of letters, digits, '-', '_', '.'; "
                        f"got {name!r}")
    return name


def _sweep_numbers(sweep: dict, ev_name: str, ev) -> tuple[int, int, int, int]:
    """``chunk_size``, ``seed``, ``steps`` and ``ops_per_step`` of ``[sweep]``, in range (the
    last two only for evaluators that simulate steps)."""
    chunk = sweep.get("chunk_size", 65536)
    if not _is_int(chunk) or not 1 <= chunk <= MAX_CHUNK:
        raise SpecError(f"sweep.chunk_size: must be an integer in 1..{MAX_CHUNK}, got {chunk!r}")
    seed = sweep.get("seed", 0)
    if not _is_int(seed) or not 0 <= seed < 2**32:
        raise SpecError(f"sweep.seed: must be an integer in 0..2**32-1, got {seed!r}")
    steps = sweep.get("steps", DEFAULT_STEPS)
    if not _is_int(steps) or not 1 <= steps <= MAX_STEPS:
        raise SpecError(f"sweep.steps: must be an integer in 1..{MAX_STEPS}, got {steps!r}")
    if "steps" in sweep and not ev.uses_steps:
        raise SpecError(f"sweep.steps: the {ev_name} evaluator simulates no steps")
    ops_per_step = sweep.get("ops_per_step", 1)
    if not _is_int(ops_per_step) or not 1 <= ops_per_step <= MAX_OPS_PER_STEP:
        raise SpecError(f"sweep.ops_per_step: must be an integer in 1..{MAX_OPS_PER_STEP}, "
                        f"got {ops_per_step!r}")
    if "ops_per_step" in sweep and not ev.uses_steps:
        raise SpecError(f"sweep.ops_per_step: the {ev_name} evaluator simulates no steps")
    return chunk, seed, steps, ops_per_step


def _metrics(sweep: dict, ev_name: str, ev, axis_names: list[str]) -> list[str]:
    """``[sweep] metrics``: known to the evaluator, each once, none named like an axis (a
    row has one column per name).  Default: every metric that is not also an axis, such as
    the ``min_objects`` the model used where ``[boot] min_objects`` is swept."""
    all_metrics = ev.metrics()
    metrics = sweep.get("metrics", [m for m in all_metrics if m not in axis_names])
    if not isinstance(metrics, list) or not metrics:
        raise SpecError("sweep.metrics: must be a non-empty list of metric names")
    for m in metrics:
        if m not in all_metrics:
            raise SpecError(f"sweep.metrics: unknown metric {m!r} for evaluator {ev_name} "
                            f"(known: {', '.join(all_metrics)})")
    if len(set(metrics)) != len(metrics):
        raise SpecError("sweep.metrics: lists a metric twice")
    for m in metrics:
        if m in axis_names:
            raise SpecError(f"sweep.metrics: {m!r} is also an axis of this spec; a row has one "
                            f"column per name, so leave it out of metrics")
    return metrics


#: ``[boot]`` keys spelled as the kernel and tune name them (``slub_min_order``), each the
#: axis it names (results/columns.py ALIASES, docs/SPECS.md "Stored columns").
BOOT_ALIASES: dict[str, str] = columns.ALIASES


def _axes(doc: dict, schema: dict[str, AxisDef], ev_name: str) -> list[Axis]:
    """Every key of the axis sections, checked against ``schema`` and expanded, in grid
    order."""
    axes: list[Axis] = []
    for section in AXIS_SECTIONS:
        table = doc.get(section)
        if table is None:
            continue
        if not isinstance(table, dict):
            raise SpecError(f"{section}: must be a table")
        for key, raw in table.items():
            field = f"{section}.{key}"
            if section == "boot" and key in BOOT_ALIASES:   # the tune knob's kernel name
                if BOOT_ALIASES[key] in table:
                    raise SpecError(f"{field}: give it or {section}.{BOOT_ALIASES[key]} "
                                    "(the same axis), not both")
                key = BOOT_ALIASES[key]
            d = schema.get(key)
            if d is None or d.section != section:
                here = [k for k, v in schema.items() if v.section == section]
                raise SpecError(f"{field}: unknown axis for evaluator {ev_name} "
                                f"(known in [{section}]: {', '.join(here) or 'none'})")
            vals = _expand_int(field, raw, d) if d.kind is int else _expand_str(field, raw, d)
            axes.append(Axis(key, d.kind, vals))
    return axes


def _check_axis_set(names: list[str], schema: dict[str, AxisDef], ev_name: str, ev) -> None:
    """The axes a grid needs: exactly one of cpus/cpus_per_node and of cache/size, a
    profile, nodes with cpus_per_node, and the evaluator's own required axes."""
    if ("cpus" in names) == ("cpus_per_node" in names):
        raise SpecError("topology.cpus: give exactly one of cpus or cpus_per_node")
    if ("cache" in names) == ("size" in names):
        raise SpecError("cache.cache: give exactly one of cache (names) or size (bytes)")
    if "profile" not in names:
        raise SpecError("kernel.profile: missing (a profile name, a list, or \"all\")")
    if "cpus_per_node" in names and "nodes" not in names:
        raise SpecError("topology.nodes: required with cpus_per_node")
    for req in ev.required_axes():
        if req not in names:
            raise SpecError(f"{schema[req].section}.{req}: evaluator {ev_name} needs this axis")


#: The range of an integer axis column (the grid and the parts hold int32).
INT32_MIN, INT32_MAX = -(2 ** 31), 2 ** 31 - 1


def _list_of_tables(doc: dict) -> list:
    ex = doc.get("exclude", [])
    if not isinstance(ex, list) or not all(isinstance(e, dict) for e in ex):
        raise SpecError("exclude: must be an array of tables ([[exclude]])")
    return ex


def _exclusion(i: int, table: dict, axes: list[Axis]) -> Exclusion:
    by_name = {a.name: a for a in axes}
    if not table:
        raise SpecError(f"exclude[{i}]: empty table would drop every row")
    tests = []
    for key, raw in table.items():
        field = f"exclude[{i}].{key}"
        ax = by_name.get(key)
        if ax is None:
            raise SpecError(f"{field}: not an axis of this spec (axes: {', '.join(by_name)})")
        if isinstance(raw, dict):
            items = list(raw.items())
        elif isinstance(raw, list):
            items = [("in", raw)]
        else:
            items = [("eq", raw)]
        for op, operand in items:
            if op not in _COMPARISONS:
                raise SpecError(f"{field}.{op}: unknown comparison (use {', '.join(_COMPARISONS)})")
            tests.append((key, op, _operand(f"{field}.{op}", op, operand, ax, by_name)))
    return Exclusion(tuple(tests))


def _operand(field, op, operand, ax: Axis, by_name):
    if op == "in":
        if not isinstance(operand, list) or not operand:
            raise SpecError(f"{field}: expected a non-empty list")
        return tuple(_scalar(field, v, ax) for v in operand)
    if ax.kind is int and isinstance(operand, str):
        other = by_name.get(operand)
        if other is None or other.kind is not int:
            raise SpecError(f"{field}: {operand!r} is not an integer axis of this spec")
        return ("axis", operand)
    if ax.kind is str and op not in ("eq", "ne"):
        raise SpecError(f"{field}: string axis {ax.name} supports only eq, ne and in")
    return _scalar(field, operand, ax)


def _scalar(field, v, ax: Axis):
    if ax.kind is int:
        if not _is_int(v):
            raise SpecError(f"{field}: {v!r} is not an integer")
        if not INT32_MIN <= v <= INT32_MAX:      # compared with the grid's int32 columns
            raise SpecError(f"{field}: {v} is outside the int32 range of axis values "
                            f"({INT32_MIN}..{INT32_MAX})")
        return v
    if not isinstance(v, str):
        raise SpecError(f"{field}: {v!r} is not a string")
    if v not in ax.values:
        # accept aliases (kmalloc-1024, 6.1) when they name a value on the axis
        for conv in (lambda s: caches.get_cache(s).name,
                     lambda s: profiles.get_any_profile(s).name):
            try:
                alias = conv(v)
            except ValueError:
                continue
            if alias in ax.values:
                return alias
        raise SpecError(f"{field}: {v!r} is not a value of axis {ax.name}")
    return v

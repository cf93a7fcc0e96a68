"""Fleets: the weighted topologies and workloads a policy is judged on (the ``[fleet]`` table
of a tune spec, or a sweep spec's topology axes), and their array layout for the objectives.
The TOML format is in docs/SPECS.md.
"""


from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import NamedTuple

import jax.numpy as jnp
import numpy as np

from slabtune.errors import SlabtuneError
from slabtune.model import profiles
from slabtune.model.caches import CacheInfo, UnknownCacheError, get_cache
from slabtune.model.topology import Topology, TopologyError, check_no_empty_nodes

_F32 = jnp.float32
_I32 = jnp.int32
_FLOAT32_MAX = float(np.finfo(np.float32).max)


# --------------------------------------------------------------------------- fleet data


@dataclasses.dataclass(frozen=True)
class FleetTopology:
    name: str
    topology: Topology
    weight: float


@dataclasses.dataclass(frozen=True)
class FleetWorkload:
    """Live objects per CPU and op share per cache, and the workload's free pattern."""

    name: str
    weight: float
    live_per_cpu: tuple[float, ...]   # aligned with Fleet.caches
    ops: tuple[float, ...]            # aligned with Fleet.caches
    foreign_free: float
    churn: float


@dataclasses.dataclass(frozen=True)
class Fleet:
    #: A SLUB profile, or a SLAB one (``slab-*``), whose objectives are
    #: :mod:`slabtune.tuner.slab_objectives`'.
    profile: profiles.KernelProfile | profiles.SlabProfile
    topologies: tuple[FleetTopology, ...]
    caches: tuple[CacheInfo, ...]
    workloads: tuple[FleetWorkload, ...]
    #: The kernel configuration that decides which caches merge (:data:`KERNEL_CONFIGS`).
    kernel_config: str = "distro"

    @property
    def topology_names(self) -> tuple[str, ...]:
        return tuple(t.name for t in self.topologies)


def check_number(where: str, value, lo: float, hi: float = math.inf) -> float:
    """A finite number in ``lo..hi`` (TOML's ``nan`` and ``inf`` are refused, and so is
    anything float32, which the objectives compute in, would hold as inf)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise SlabtuneError(f"{where}: expected a number, got {value!r}")
    if not math.isfinite(value) or abs(value) > _FLOAT32_MAX:
        raise SlabtuneError(f"{where}: {value!r} is not a finite number (float32)")
    if not lo <= value <= hi:
        raise SlabtuneError(f"{where}: {value} is outside {lo}..{hi}")
    return float(value)


def check_int(where: str, value, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise SlabtuneError(f"{where}: expected an integer, got {value!r}")
    if not lo <= value <= hi:
        raise SlabtuneError(f"{where}: {value} is outside {lo}..{hi}")
    return value


def _id_list(where: str, t: Mapping) -> list:
    """``memoryless_nodes`` of a ``[[fleet.topology]]`` table: a list (of node ids, checked
    by :meth:`Topology.uniform`)."""
    ml = t.get("memoryless_nodes", [])
    if not isinstance(ml, list):
        raise SlabtuneError(f"{where}.memoryless_nodes: expected a list of node ids, got {ml!r}")
    for n in ml:
        if isinstance(n, bool) or not isinstance(n, int):
            raise SlabtuneError(f"{where}.memoryless_nodes: {n!r} is not a node id (an "
                                "integer)")
    return ml


def _parse_topology(i: int, t) -> FleetTopology:
    where = f"fleet.topology[{i}]"
    if not isinstance(t, Mapping):
        raise SlabtuneError(f"{where}: expected a table")
    unknown = set(t) - {"name", "cpus", "nodes", "memoryless_nodes", "possible", "online",
                        "node_cpus", "distances", "weight"}
    if unknown:
        raise SlabtuneError(f"{where}.{sorted(unknown)[0]}: unknown field")
    cpus = check_int(f"{where}.cpus", t.get("cpus"), 1, 8192)
    nodes = check_int(f"{where}.nodes", t.get("nodes", 1), 1, 64)
    name = t.get("name", f"{cpus}cpu-{nodes}node")
    if not isinstance(name, str) or not name:
        raise SlabtuneError(f"{where}.name: expected a non-empty string")
    weight = check_number(f"{where}.weight", t.get("weight", 1.0), 0.0)
    try:
        topo = Topology.uniform(cpus, nodes, memoryless_nodes=_id_list(where, t),
                                possible=t.get("possible"), online=t.get("online"),
                                node_cpus=t.get("node_cpus"), distances=t.get("distances"))
        check_no_empty_nodes(topo)
    except (TopologyError, TypeError) as err:
        raise SlabtuneError(f"{where}: {err}") from None
    return FleetTopology(name, topo, weight)


def parse_fleet(table, sweep=None) -> Fleet:
    """Build a :class:`Fleet` from a spec's ``[fleet]`` table; errors name the field.

    Topologies are the ``[[fleet.topology]]`` tables, or those of a sweep spec named by
    ``sweep`` (:func:`sweep_fleet_topologies`); workloads are the ``[[fleet.workload]]``
    tables, or with ``sweep`` and none given, one workload over the sweep's caches
    (:func:`sweep_default_workload`).  ``sweep``: the already loaded sweep spec that
    ``[fleet] sweep`` names (a study keeps it, so re-reading a study never depends on the
    working directory or on the file still being there); loaded from its name if not given.
    """
    if not isinstance(table, Mapping):
        raise SlabtuneError("fleet: expected a [fleet] table")
    unknown = set(table) - {"profile", "topology", "workload", "sweep", "topology_weight",
                            "kernel_config"}
    if unknown:
        raise SlabtuneError(f"fleet.{sorted(unknown)[0]}: unknown field")
    if "sweep" in table:
        sweep = load_sweep(table["sweep"]) if sweep is None else sweep
        if "topology" in table:
            raise SlabtuneError("fleet.topology: give either [[fleet.topology]] tables or "
                                "fleet.sweep, not both")
    else:
        sweep = None
        if "topology_weight" in table:
            raise SlabtuneError("fleet.topology_weight: only a fleet taken from a sweep spec "
                                "(fleet.sweep) weights its topologies by rule")
    try:
        profile = profiles.get_any_profile(str(table.get("profile", _sweep_profile(sweep))))
    except profiles.UnknownProfileError as err:
        raise SlabtuneError(f"fleet.profile: {err}") from None
    if sweep is not None:
        topos = sweep_fleet_topologies(sweep, profile, table.get("topology_weight", "uniform"))
    else:
        topos_t = table.get("topology")
        if not isinstance(topos_t, list) or not topos_t:
            raise SlabtuneError("fleet.topology: expected at least one [[fleet.topology]] "
                                "(or fleet.sweep naming a sweep spec)")
        topos = tuple(_parse_topology(i, t) for i, t in enumerate(topos_t))
    names = [t.name for t in topos]
    if len(set(names)) != len(names):
        raise SlabtuneError("fleet.topology: names must be unique")
    if sum(t.weight for t in topos) <= 0:
        raise SlabtuneError("fleet.topology: weights add up to 0")
    wl_t = table.get("workload")
    if sweep is not None and wl_t is None:
        caches, workloads = sweep_default_workload(sweep)
    else:
        caches, workloads = _parse_workloads(wl_t)
    kcfg = table.get("kernel_config", "distro")
    if kcfg not in KERNEL_CONFIGS:
        raise SlabtuneError(f"fleet.kernel_config: {kcfg!r} is not one of "
                            f"{', '.join(KERNEL_CONFIGS)}")
    return Fleet(profile, topos, caches, workloads, kcfg)


#: ``[fleet] kernel_config``: the configuration facts cache merging depends on
#: (model/merging.py): ``distro`` (CONFIG_MEMCG and CONFIG_HARDENED_USERCOPY, as Debian's
#: kernels: no kmalloc cache merges) or ``lab`` (neither, as the lab's own builds).
KERNEL_CONFIGS: dict[str, tuple[bool, bool]] = {"distro": (True, True), "lab": (False, False)}


def merge_roots(fleet: Fleet) -> np.ndarray:
    """(K,) the index of the fleet cache whose kmem_cache each cache shares when caches
    merge (its own index when it has its own): :func:`slabtune.model.merging.merge_roots`
    over the fleet's caches, kmalloc caches first (kmem_cache_init() creates them before
    any other), the rest in fleet order, with the captured per-cache facts, the fleet
    cache's stride as its size and :data:`KERNEL_CONFIGS`.  A cache the capture does not
    know (``size-N``) is kept apart.  Only merges between fleet caches show: a fleet cache
    merged with one outside the fleet is modelled as on its own."""
    from slabtune.model import merging

    usercopy, memcg = KERNEL_CONFIGS[fleet.kernel_config]
    config = merging.MergeConfig(usercopy, memcg, tuple(fleet.profile.version[:2]))
    order = sorted(range(len(fleet.caches)), key=lambda i: not fleet.caches[i].is_kmalloc)
    names = [fleet.caches[i].name for i in order]
    facts = merging.captured_facts(names, config, {c.name: c.size for c in fleet.caches})
    facts = [f if f is not None else merging.CacheMergeFacts(n, 0, never=True)
             for n, f in zip(names, facts)]
    roots = merging.merge_roots(facts, config, nomerge=False)
    index = {c.name: i for i, c in enumerate(fleet.caches)}
    return np.array([index[roots[c.name]] for c in fleet.caches], np.int32)


def _parse_workloads(wl_t) -> tuple[tuple[CacheInfo, ...], tuple[FleetWorkload, ...]]:
    """The ``[[fleet.workload]]`` tables: the caches they name (in order of first use) and
    each workload's live objects and op shares aligned with them."""
    if not isinstance(wl_t, list) or not wl_t:
        raise SlabtuneError("fleet.workload: expected at least one [[fleet.workload]]")
    cache_names: list[str] = []
    raw = []
    for i, w in enumerate(wl_t):
        where = f"fleet.workload[{i}]"
        if not isinstance(w, Mapping):
            raise SlabtuneError(f"{where}: expected a table")
        unknown = set(w) - {"name", "weight", "foreign_free", "churn", "caches"}
        if unknown:
            raise SlabtuneError(f"{where}.{sorted(unknown)[0]}: unknown field")
        caches = w.get("caches")
        if not isinstance(caches, Mapping) or not caches:
            raise SlabtuneError(f"{where}.caches: expected a table of caches")
        entries = {}
        for cname, ct in caches.items():
            cw = f"{where}.caches.{cname}"
            try:
                info = get_cache(cname)
            except UnknownCacheError as err:
                raise SlabtuneError(f"{cw}: {err}") from None
            if not isinstance(ct, Mapping):
                raise SlabtuneError(f"{cw}: expected {{ live_per_cpu = N, ops = X }}")
            bad = set(ct) - {"live_per_cpu", "ops"}
            if bad:
                raise SlabtuneError(f"{cw}.{sorted(bad)[0]}: unknown field")
            live = check_number(f"{cw}.live_per_cpu", ct.get("live_per_cpu"), 1.0, 1e9)
            ops = check_number(f"{cw}.ops", ct.get("ops", 1.0), 0.0)
            if info.name in entries:      # two spellings of one cache: kmalloc-1k, -1024
                first = next(n for n in caches if get_cache(n).name == info.name)
                raise SlabtuneError(f"{cw}: names cache {info.name} again (as {first!r} "
                                    "before); give each cache once per workload")
            entries[info.name] = (live, ops)
            if info.name not in cache_names:
                cache_names.append(info.name)
        raw.append((str(w.get("name", f"workload{i}")),
                    check_number(f"{where}.weight", w.get("weight", 1.0), 0.0),
                    check_number(f"{where}.foreign_free", w.get("foreign_free", 0.5), 0.0, 1.0),
                    check_number(f"{where}.churn", w.get("churn", 0.2), 0.0, 1.0), entries))
    caches = tuple(get_cache(n) for n in cache_names)
    workloads = []
    for name, weight, ff, churn, entries in raw:
        live = tuple(entries.get(c, (0.0, 0.0))[0] for c in cache_names)
        ops = tuple(entries.get(c, (0.0, 0.0))[1] for c in cache_names)
        if sum(ops) <= 0:
            raise SlabtuneError(f"fleet.workload {name}: ops add up to 0")
        workloads.append(FleetWorkload(name, weight, live, ops, ff, churn))
    if sum(w.weight for w in workloads) <= 0:
        raise SlabtuneError("fleet.workload: weights add up to 0")
    return caches, tuple(workloads)


# --------------------------------------------------------------------------- fleet from a sweep

#: Sweep-spec axes that describe a topology (sweeps/spec.py COMMON_AXES, [topology]).
SWEEP_TOPOLOGY_AXES = ("cpus", "cpus_per_node", "nodes", "memoryless_nodes", "possible")
#: How ``[fleet] topology_weight`` weights a sweep's topologies: every topology alike, or
#: by its CPUs (a fleet counted in CPUs rather than machines).
TOPOLOGY_WEIGHTS = ("uniform", "cpus")
#: Most topologies a fleet taken from a sweep may have (each one multiplies the model's
#: work per policy; the built-in fleet sweep has 8192).
MAX_SWEEP_TOPOLOGIES = 256
#: Live objects per CPU of each cache in the default workload of a sweep fleet.
SWEEP_LIVE_PER_CPU = 1024.0


def load_sweep(ref):
    """The sweep spec ``[fleet] sweep`` names: a built-in name (``quick``) or a path to a
    sweep spec TOML (relative paths from the working directory; a study keeps what was read,
    see :func:`slabtune.tuner.study.study_spec`).  Errors name the field."""
    from slabtune.sweeps import spec as sweep_spec

    if not isinstance(ref, str) or not ref:
        raise SlabtuneError(f"fleet.sweep: expected a sweep spec name or path, got {ref!r}")
    try:
        return sweep_spec.load(ref)
    except SlabtuneError as err:
        raise SlabtuneError(f"fleet.sweep: {err}") from None


def _sweep_profile(sweep) -> str:
    """The fleet's profile when ``[fleet] profile`` is absent: the sweep's only profile,
    else v6.18."""
    if sweep is not None and "profile" in sweep.axis_names:
        values = sweep.axis("profile").values
        if len(values) == 1:
            return values[0]
    return "v6.18"


def _profile_test(op: str, operand, profile: str) -> bool | None:
    """Whether an exclusion test on the profile axis holds for ``profile`` (None: a test
    this fleet cannot decide, such as an order comparison or one against another axis)."""
    if op == "eq" and isinstance(operand, str):
        return profile == operand
    if op == "ne" and isinstance(operand, str):
        return profile != operand
    if op == "in" and isinstance(operand, tuple) and operand[:1] != ("axis",):
        return profile in operand
    return None


def sweep_fleet_topologies(sweep, profile: profiles.KernelProfile,
                           weighting: str = "uniform") -> tuple[FleetTopology, ...]:
    """The distinct topologies of a sweep spec's grid, as the sweep builds them (present
    CPUs ``cpus`` or ``nodes * cpus_per_node``, the highest-numbered ``memoryless_nodes``
    nodes without memory, ``possible`` 0 meaning present), minus the impossible ones and
    those its ``[[exclude]]`` tables drop for every row (tables that test only topology
    axes, or the profile axis, decided for the fleet's profile).  Weighted by
    ``weighting`` (:data:`TOPOLOGY_WEIGHTS`)."""
    from slabtune.sweeps import grid
    from slabtune.sweeps import spec as sweep_spec
    from slabtune.sweeps.evaluators import memoryless_node_ids

    if weighting not in TOPOLOGY_WEIGHTS:
        raise SlabtuneError(f"fleet.topology_weight: {weighting!r} is not one of "
                            f"{', '.join(TOPOLOGY_WEIGHTS)}")
    if "profile" in sweep.axis_names and profile.name not in sweep.axis("profile").values:
        raise SlabtuneError(f"fleet.profile: {profile.name} is not among the profiles of "
                            f"sweep spec {sweep.name} ({', '.join(sweep.axis('profile').values)})")
    axes = tuple(a for a in sweep.axes if a.name in SWEEP_TOPOLOGY_AXES)
    if not {"cpus", "cpus_per_node"} & {a.name for a in axes}:
        raise SlabtuneError(f"fleet.sweep: sweep spec {sweep.name} has no topologies "
                            "(no [topology] cpus or cpus_per_node axis)")
    names = {a.name for a in axes}
    exclude = []
    for ex in sweep.exclude:
        kept, applies = [], True
        for name, op, operand in ex.tests:
            if name == "profile":
                holds = _profile_test(op, operand, profile.name)
                applies &= bool(holds)
            elif name in names and not (isinstance(operand, tuple)
                                        and operand[:1] == ("axis",) and operand[1] not in names):
                kept.append((name, op, operand))
            else:
                applies = False   # depends on another axis: drops only some of the rows
        if applies and kept:
            exclude.append(sweep_spec.Exclusion(tuple(kept)))
    sub = dataclasses.replace(sweep, axes=axes, exclude=tuple(exclude))
    if sub.product > 64 * MAX_SWEEP_TOPOLOGIES:
        raise SlabtuneError(f"fleet.sweep: sweep spec {sweep.name} has {sub.product} "
                            f"topologies; a fleet takes at most {MAX_SWEEP_TOPOLOGIES}")
    cols = grid.axis_columns(sub, 0, sub.product)
    keep = ~grid.excluded(sub, cols)
    defaults = dict(sweep.defaults)
    col = lambda name: cols.get(name, np.full(sub.product, defaults.get(name) or 0))  # noqa: E731
    nodes = np.maximum(col("nodes"), 1)
    present = grid.present_cpus({**cols, "nodes": nodes})
    ml, possible = col("memoryless_nodes"), col("possible")
    seen, out = set(), []
    for i in np.flatnonzero(keep):
        # possible 0 means "= present": the same machine as possible == present
        key = (int(present[i]), int(nodes[i]), int(ml[i]),
               max(int(possible[i]), int(present[i])))
        if key in seen:
            continue
        seen.add(key)
        c, n, m, p = key
        name = f"{c}cpu" + (f"-{n}node" if n > 1 else "") + (f"-{m}memoryless" if m else "") \
            + (f"-{p}possible" if p > c else "")
        try:
            topo = Topology.uniform(c, n, memoryless_nodes=memoryless_node_ids(n, m),
                                    possible=max(p, c))
        except TopologyError as err:
            raise SlabtuneError(f"fleet.sweep: topology {name}: {err}") from None
        out.append(FleetTopology(name, topo, float(c) if weighting == "cpus" else 1.0))
    if not out:
        raise SlabtuneError(f"fleet.sweep: sweep spec {sweep.name} leaves no topology")
    if len(out) > MAX_SWEEP_TOPOLOGIES:
        raise SlabtuneError(f"fleet.sweep: sweep spec {sweep.name} has {len(out)} "
                            f"topologies; a fleet takes at most {MAX_SWEEP_TOPOLOGIES}")
    return tuple(out)


def sweep_default_workload(sweep) -> tuple[tuple[CacheInfo, ...], tuple[FleetWorkload, ...]]:
    """The workload of a sweep fleet that names none: every cache of the sweep's ``cache``
    axis (or anonymous caches of its ``size`` axis) with :data:`SWEEP_LIVE_PER_CPU` live
    objects per CPU and an equal share of ops, the workload table's default free pattern
    (foreign_free 0.5, churn 0.2)."""
    from slabtune.model.caches import anonymous_cache

    if "cache" in sweep.axis_names:   # a valid sweep spec has exactly one of the two
        caches = tuple(get_cache(n) for n in sweep.axis("cache").values)
    else:
        caches = tuple(anonymous_cache(int(s)) for s in sweep.axis("size").values)
    n = len(caches)
    wl = FleetWorkload("sweep-caches", 1.0, (SWEEP_LIVE_PER_CPU,) * n, (1.0,) * n, 0.5, 0.2)
    return caches, (wl,)


class FleetArrays(NamedTuple):
    """The fleet as arrays, laid out (T, W, K) = topologies x workloads x caches."""

    possible: jnp.ndarray
    present: jnp.ndarray
    online: jnp.ndarray
    cpus_mem: jnp.ndarray        # CPUs on nodes with memory
    cpus_ml: jnp.ndarray         # CPUs on memoryless nodes
    mem_nodes: jnp.ndarray
    all_nodes: jnp.ndarray
    size: jnp.ndarray
    is_kmalloc: jnp.ndarray
    early: jnp.ndarray
    is_bootstrap: jnp.ndarray
    explicit_sheaf: jnp.ndarray
    live_per_cpu: jnp.ndarray    # (W, K)
    ops: jnp.ndarray             # (W, K), normalised per workload
    foreign_free: jnp.ndarray    # (W,)
    churn: jnp.ndarray           # (W,)
    w_weight: jnp.ndarray        # (W,), normalised
    #: (K,) numpy: the cache whose kmem_cache each shares when merging (:func:`merge_roots`)
    merge_root: np.ndarray | None = None


def fleet_arrays(fleet: Fleet) -> FleetArrays:
    """Lay a fleet out as arrays (topology fields (T,), cache fields (K,))."""
    ts = [t.topology for t in fleet.topologies]
    ops = np.array([w.ops for w in fleet.workloads], np.float32)
    ops = ops / ops.sum(axis=1, keepdims=True)
    ww = np.array([w.weight for w in fleet.workloads], np.float32)
    return FleetArrays(
        possible=jnp.asarray([t.possible for t in ts], _I32),
        present=jnp.asarray([t.present for t in ts], _I32),
        online=jnp.asarray([t.online for t in ts], _I32),
        cpus_mem=jnp.asarray([t.present - t.cpus_on_memoryless_nodes for t in ts], _F32),
        cpus_ml=jnp.asarray([t.cpus_on_memoryless_nodes for t in ts], _F32),
        mem_nodes=jnp.asarray([len(t.memory_nodes) for t in ts], _F32),
        all_nodes=jnp.asarray([t.nodes for t in ts], _F32),
        size=jnp.asarray([c.size for c in fleet.caches], _I32),
        is_kmalloc=jnp.asarray([c.is_kmalloc for c in fleet.caches], bool),
        early=jnp.asarray([c.early for c in fleet.caches], bool),
        is_bootstrap=jnp.asarray([c.is_bootstrap for c in fleet.caches], bool),
        explicit_sheaf=jnp.asarray([c.explicit_sheaf for c in fleet.caches], _I32),
        live_per_cpu=jnp.asarray([w.live_per_cpu for w in fleet.workloads], _F32),
        ops=jnp.asarray(ops),
        foreign_free=jnp.asarray([w.foreign_free for w in fleet.workloads], _F32),
        churn=jnp.asarray([w.churn for w in fleet.workloads], _F32),
        w_weight=jnp.asarray(ww / ww.sum()),
        merge_root=None if profiles.is_slab(fleet.profile) else merge_roots(fleet),
    )

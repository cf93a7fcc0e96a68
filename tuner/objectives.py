"""Fleet objectives: memory overhead and modelled time per operation of a batch of policies,
aggregated over a weighted fleet of topologies and workloads, in one vectorised call.

A *fleet* (the ``[fleet]`` table of a tune spec) is a kernel profile, weighted topologies and
weighted workloads; a workload names the caches it uses, the live objects it keeps per CPU in
each and its share of operations::

    [fleet]
    profile = "v6.18"
    [[fleet.topology]]
    name = "small-8"
    cpus = 8
    weight = 2.0
    [[fleet.workload]]
    name = "net"
    foreign_free = 0.5      # share of frees that hit a slab other than the CPU's own
    churn = 0.2             # slabs drained to empty per slab's worth of allocations
    [fleet.workload.caches]
    "kmalloc-256" = { live_per_cpu = 4096, ops = 1.0 }

An *objective set* maps the structure of every (policy, topology, cache) point to per-topology
memory and time; sets are looked up by name in :data:`OBJECTIVE_SETS` (the spec's
``[objectives] set``), so the dynamics-based set can replace the structural one unchanged.

``structural`` (the set shipped here) derives both from the structural model alone:

* memory: bytes held beyond live objects, over live object bytes, from slab leftovers
  (``leftover`` per slab in use), the slabs each CPU retains (its CPU slab and its per-CPU
  partial list at the mean length of put_cpu_partial()'s fill-and-drain rule, the slabs half
  free: the kernel's own assumption in slub_set_cpu_partial), the empty slabs a node with
  memory keeps (half way to ``min_partial`` under churn, at it once a workload has ended),
  and sheaves (main and spare half full, their kmalloc'd structs, barns half
  way to their limits); see :func:`structural_memory`, whose ``state`` input ("steady" here)
  is what tells this churning fleet apart from a finished workload (validation, "drained");
* time: ns per alloc-or-free op from :mod:`slabtune.model.cost` (its constants, its page
  allocator and M/M/1 lock contention fixed point), fed with per-op event rates estimated
  from the structure (a slow-path-rate proxy, documented in :func:`structural_rates`), for
  two representative CPUs per topology: one on a node with memory, one on a memoryless node.

``dynamics`` (opt-in: ``[objectives] set = "dynamics"``, with optional ``steps`` and
``seed``) measures both with the dynamics model instead: every (policy, topology,
workload-cache) point becomes a :class:`~slabtune.model.dynamics.SimConfig`, a batch runs
as one ``simulate_batch`` call and ``metrics.compute`` gives overhead_frac-style memory
and ns per op (see :class:`DynamicsObjectives` and :func:`dynamics_workload` for the
mapping of fleet workloads to dynamics workloads).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.resources
import math
from typing import Callable, Mapping, NamedTuple

import jax
import jax.numpy as jnp
from jax import lax
import numpy as np

from slabtune.errors import SlabtuneError
from slabtune.model import cost as C
from slabtune.model import policy as PL
from slabtune.model import profiles as P
from slabtune.model.caches import CacheInfo, UnknownCacheError, get_cache
from slabtune.model.topology import Topology, TopologyError
from slabtune.tuner.space import KNOBS, SearchSpace, baseline_values

_F32 = jnp.float32
_I32 = jnp.int32


# --------------------------------------------------------------------------- fleet data


@dataclasses.dataclass(frozen=True)
class FleetTopology:
    name: str
    topology: Topology
    weight: float


@dataclasses.dataclass(frozen=True)
class Workload:
    """Live objects per CPU and op share per cache, and the workload's free pattern."""

    name: str
    weight: float
    live_per_cpu: tuple[float, ...]   # aligned with Fleet.caches
    ops: tuple[float, ...]            # aligned with Fleet.caches
    foreign_free: float
    churn: float


@dataclasses.dataclass(frozen=True)
class Fleet:
    profile: P.KernelProfile
    topologies: tuple[FleetTopology, ...]
    caches: tuple[CacheInfo, ...]
    workloads: tuple[Workload, ...]

    @property
    def topology_names(self) -> tuple[str, ...]:
        return tuple(t.name for t in self.topologies)


def _num(where: str, value, lo: float, hi: float = math.inf) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise SlabtuneError(f"{where}: expected a number, got {value!r}")
    if not lo <= value <= hi:
        raise SlabtuneError(f"{where}: {value} is outside {lo}..{hi}")
    return float(value)


def _int(where: str, value, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise SlabtuneError(f"{where}: expected an integer, got {value!r}")
    if not lo <= value <= hi:
        raise SlabtuneError(f"{where}: {value} is outside {lo}..{hi}")
    return value


def _parse_topology(i: int, t) -> FleetTopology:
    where = f"fleet.topology[{i}]"
    if not isinstance(t, Mapping):
        raise SlabtuneError(f"{where}: expected a table")
    unknown = set(t) - {"name", "cpus", "nodes", "memoryless_nodes", "possible", "online",
                        "node_cpus", "weight"}
    if unknown:
        raise SlabtuneError(f"{where}.{sorted(unknown)[0]}: unknown field")
    cpus = _int(f"{where}.cpus", t.get("cpus"), 1, 8192)
    nodes = _int(f"{where}.nodes", t.get("nodes", 1), 1, 64)
    name = t.get("name", f"{cpus}cpu-{nodes}node")
    if not isinstance(name, str) or not name:
        raise SlabtuneError(f"{where}.name: expected a non-empty string")
    weight = _num(f"{where}.weight", t.get("weight", 1.0), 0.0)
    try:
        topo = Topology.uniform(cpus, nodes, memoryless_nodes=t.get("memoryless_nodes", ()),
                                possible=t.get("possible"), online=t.get("online"),
                                node_cpus=t.get("node_cpus"))
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
    unknown = set(table) - {"profile", "topology", "workload", "sweep", "topology_weight"}
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
        profile = P.get_profile(str(table.get("profile", _sweep_profile(sweep))))
    except P.UnknownProfileError as err:
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
    return Fleet(profile, topos, caches, workloads)


def _parse_workloads(wl_t) -> tuple[tuple[CacheInfo, ...], tuple[Workload, ...]]:
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
            live = _num(f"{cw}.live_per_cpu", ct.get("live_per_cpu"), 1.0, 1e9)
            ops = _num(f"{cw}.ops", ct.get("ops", 1.0), 0.0)
            entries[info.name] = (live, ops)
            if info.name not in cache_names:
                cache_names.append(info.name)
        raw.append((str(w.get("name", f"workload{i}")),
                    _num(f"{where}.weight", w.get("weight", 1.0), 0.0),
                    _num(f"{where}.foreign_free", w.get("foreign_free", 0.5), 0.0, 1.0),
                    _num(f"{where}.churn", w.get("churn", 0.2), 0.0, 1.0), entries))
    caches = tuple(get_cache(n) for n in cache_names)
    workloads = []
    for name, weight, ff, churn, entries in raw:
        live = tuple(entries.get(c, (0.0, 0.0))[0] for c in cache_names)
        ops = tuple(entries.get(c, (0.0, 0.0))[1] for c in cache_names)
        if sum(ops) <= 0:
            raise SlabtuneError(f"fleet.workload {name}: ops add up to 0")
        workloads.append(Workload(name, weight, live, ops, ff, churn))
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
    from slabtune.sweeps import spec as SP

    if not isinstance(ref, str) or not ref:
        raise SlabtuneError(f"fleet.sweep: expected a sweep spec name or path, got {ref!r}")
    try:
        return SP.load(ref)
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


def sweep_fleet_topologies(sweep, profile: P.KernelProfile,
                           weighting: str = "uniform") -> tuple[FleetTopology, ...]:
    """The distinct topologies of a sweep spec's grid, as the sweep builds them (present
    CPUs ``cpus`` or ``nodes * cpus_per_node``, the highest-numbered ``memoryless_nodes``
    nodes without memory, ``possible`` 0 meaning present), minus the impossible ones and
    those its ``[[exclude]]`` tables drop for every row (tables that test only topology
    axes, or the profile axis, decided for the fleet's profile).  Weighted by
    ``weighting`` (:data:`TOPOLOGY_WEIGHTS`)."""
    from slabtune.sweeps import grid as G
    from slabtune.sweeps import spec as SP
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
            exclude.append(SP.Exclusion(tuple(kept)))
    sub = dataclasses.replace(sweep, axes=axes, exclude=tuple(exclude))
    if sub.product > 64 * MAX_SWEEP_TOPOLOGIES:
        raise SlabtuneError(f"fleet.sweep: sweep spec {sweep.name} has {sub.product} "
                            f"topologies; a fleet takes at most {MAX_SWEEP_TOPOLOGIES}")
    cols = G.axis_columns(sub, 0, sub.product)
    keep = ~G.excluded(sub, cols)
    defaults = dict(sweep.defaults)
    col = lambda name: cols.get(name, np.full(sub.product, defaults.get(name) or 0))  # noqa: E731
    nodes = np.maximum(col("nodes"), 1)
    present = G.present_cpus({**cols, "nodes": nodes})
    ml, possible = col("memoryless_nodes"), col("possible")
    seen, out = set(), []
    for i in np.flatnonzero(keep):
        key = (int(present[i]), int(nodes[i]), int(ml[i]), int(possible[i]))
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


def sweep_default_workload(sweep) -> tuple[tuple[CacheInfo, ...], tuple[Workload, ...]]:
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
    wl = Workload("sweep-caches", 1.0, (SWEEP_LIVE_PER_CPU,) * n, (1.0,) * n, 0.5, 0.2)
    return caches, (wl,)


# --------------------------------------------------------------------------- objectives


class PerTopology(NamedTuple):
    """Per-topology objectives of a batch: shape (B, T) each, lower is better."""

    memory: jnp.ndarray   # overhead bytes / live object bytes
    time: jnp.ndarray     # modelled ns per alloc-or-free op


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
    )


def policy_structure(values: Mapping[str, jnp.ndarray], prof: PL.ProfileArrays,
                     fa: FleetArrays) -> tuple[PL.Structure, PL.ProfileArrays]:
    """The structure of every (policy, topology, cache) point, shape (B, T, K).

    ``values`` holds every knob as a (B,) array.  Profile-field knobs replace the
    profile's fields; the order heuristic's coefficients become an explicit min_objects
    (``mul * (fls(nr_cpus) + add)``, which equals the kernel's default at mul=4, add=1),
    overridden, as in calculate_order(), by a non-zero slub_min_objects.
    """
    b = lambda name: jnp.asarray(values[name], _I32)[:, None, None]  # noqa: E731
    prof = prof._replace(**{k: b(k) for k in (
        "min_partial_divisor", "min_partial_lo", "min_partial_hi",
        "cpu_partial_page", "cpu_partial_1k", "cpu_partial_256", "cpu_partial_small",
        "sheaf_page", "sheaf_1k", "sheaf_256", "sheaf_small")})
    t = lambda x: x[None, :, None]  # noqa: E731
    k = lambda x: x[None, None, :]  # noqa: E731
    nr = PL.order_nr_cpus(t(fa.possible), t(fa.present), t(fa.online), prof, k(fa.early))
    coeff = b("order_objects_mul") * (PL.fls(nr) + b("order_objects_add"))
    boot_mo = b("slub_min_objects")
    min_objects = jnp.where(boot_mo > 0, boot_mo, jnp.maximum(coeff, 1))
    st = PL.structure(k(fa.size), t(fa.possible), t(fa.present), t(fa.online), prof,
                      min_order=b("slub_min_order"), max_order=b("slub_max_order"),
                      min_objects=min_objects, early=k(fa.early), is_kmalloc=k(fa.is_kmalloc),
                      is_bootstrap=k(fa.is_bootstrap), explicit_sheaf=k(fa.explicit_sheaf))
    return st, prof


#: Rounds of the cost model's contention fixed point (model/cost.py defaults: 6 rounds of 32
#: bisection steps).  On the quick fleet (128 random policies) two rounds stay within 0.11%
#: of the 6 x 32 per-topology times with 16 bisection steps (0.10% with 24: the rounds, not
#: the steps, bound the error; 16 steps resolve a utilisation to 2^-16) at a sixth of the
#: 6 x 32 cost on CPU.
SOLVE_SWEEPS = 2
SOLVE_STEPS = 16
#: Configurations solved together (vmap) per step of a sequential map over the batch.
SOLVE_BLOCK = 256
#: Barn hit rate proxy: a barn with ``f`` full (or empty) sheaves serves a sheaf exchange
#: with probability f / (f + BARN_HIT_HALF); 10 sheaves give 5/6.
BARN_HIT_HALF = 2.0
#: Kept empty slabs absorb slab allocations: of the slabs a workload drains to empty, a node
#: keeping ``m`` empty slabs hands back to the page allocator 1 / (1 + m / MIN_PARTIAL_SCALE).
MIN_PARTIAL_SCALE = 4.0


def structural_rates(st: PL.Structure, prof: PL.ProfileArrays, barn_full, ff, churn,
                     memoryless: bool):
    """Per-op event rates and lock acquisitions of one representative CPU, from structure.

    Half of all ops are allocs, half frees.  Proxy rules (named so they can be replaced by
    the dynamics counters):

    * no sheaves: an alloc slow path (___slab_alloc) every n/2 allocs (a slab taken with half
      its objects free; every alloc for n <= 2); a node list_lock acquisition per (n/2 + cpu_partial) allocs, since
      per-CPU partial slabs refill without the lock; a share ``ff`` of frees go to a foreign
      slab (__slab_free), and take the list_lock once per 2/(n + 2 cpu_partial) of them, the
      per-CPU partial list draining (put_partials) once per cpu_partial of them;
    * sheaves (capacity c): a sheaf exchange per c ops on each side; half come from the
      spare, the rest from the barn (barn lock) which hits with the proxy above, misses
      refill or flush c objects under the list_lock;
    * a CPU on a memoryless node without the numa_mem_id() fix takes every alloc through
      the slow path and list_lock (the 2010 penalty); where remote frees bypass sheaves and
      the CPU may not use them (v7.0 memoryless nodes), every free is a remote slow free;
    * slab allocations per alloc: churn / n / (1 + min_partial / MIN_PARTIAL_SCALE), and as
      many slab frees.

    Returns (OpRates, list_lock, barn_lock) acquisitions per op.
    """
    f = lambda x: jnp.asarray(x, _F32)  # noqa: E731
    n = jnp.maximum(f(st.objs_per_slab), 1.0)
    cp = f(st.cpu_partial)
    cap = f(st.sheaf_capacity)
    has_sheaf = cap > 0
    capm = jnp.maximum(cap, 1.0)
    barn_hit = f(barn_full) / (f(barn_full) + BARN_HIT_HALF)
    if memoryless:
        no_fix = prof.memoryless_fallback == 0
        bypass = (prof.remote_free_bypasses_sheaf == 1) & (prof.memoryless_cpus_use_sheaves == 0)
        barn_hit = jnp.where(prof.barns == 2, barn_hit, 0.0)  # barns only on memory nodes
    else:
        no_fix = jnp.asarray(False)
        bypass = jnp.asarray(False)

    # allocs (per alloc); an alloc takes at most one slow path, so a slab of one object
    # (n = 1: 2 / n would say two) makes every alloc slow, not more
    a_slow_ns = jnp.where(has_sheaf, 0.0, jnp.minimum(2.0 / n, 1.0))
    a_lock_ns = jnp.where(has_sheaf, 0.0, 1.0 / (n / 2.0 + cp))
    a_swap = jnp.where(has_sheaf, 1.0 / capm, 0.0)
    a_barn = jnp.where(has_sheaf, 0.5 / capm, 0.0)
    a_lock_sh = jnp.where(has_sheaf, 0.5 * (1.0 - barn_hit) / capm, 0.0)
    a_moved = jnp.where(has_sheaf, 0.5 * (1.0 - barn_hit), 0.0)
    a_slow = jnp.where(no_fix, 1.0, a_slow_ns + a_lock_sh)
    a_lock = jnp.where(no_fix, 1.0, a_lock_ns + a_lock_sh)
    a_fast = 1.0 - jnp.minimum(a_slow, 1.0)

    # frees (per free)
    ff = f(ff)
    f_slow_ns = ff
    f_lock_ns = ff * 2.0 / (n + 2.0 * cp)
    f_drain = jnp.where(cp > 0, ff / jnp.maximum(cp, 1.0), 0.0)
    f_lock_sh = 0.5 * (1.0 - barn_hit) / capm
    sheaf_free = has_sheaf & ~bypass
    f_slow = jnp.where(sheaf_free, f_lock_sh, jnp.where(bypass & has_sheaf, 1.0, f_slow_ns))
    f_lock = jnp.where(sheaf_free, f_lock_sh, f_lock_ns)
    f_swap = jnp.where(sheaf_free, 1.0 / capm, 0.0)
    f_barn = jnp.where(sheaf_free, 0.5 / capm, 0.0)
    f_moved = jnp.where(sheaf_free, 0.5 * (1.0 - barn_hit), 0.0)
    f_fast = 1.0 - jnp.minimum(f_slow, 1.0)
    remote = jnp.where(bypass & has_sheaf, 1.0, 0.0) + jnp.where(no_fix, 1.0, 0.0)

    slab_alloc = f(churn) / n / (1.0 + f(st.min_partial) / MIN_PARTIAL_SCALE)
    rates = C.OpRates(
        alloc_fast=0.5 * a_fast, free_fast=0.5 * f_fast,
        alloc_slow=0.5 * a_slow, free_slow=0.5 * f_slow,
        remote_free=0.5 * remote,
        sheaf_swap=0.5 * (a_swap + f_swap),
        sheaf_objects_moved=0.5 * (a_moved + f_moved),
        cpu_partial_drain=0.5 * f_drain,
        slab_alloc=0.5 * slab_alloc, slab_free=0.5 * slab_alloc,
    )
    return rates, 0.5 * (a_lock + f_lock), 0.5 * (a_barn + f_barn)


#: States a memory prediction can describe (:func:`structural_memory`): ``steady``, a
#: workload churning its live set (the tuner's fleet); ``drained``, the end of a workload
#: that allocated and freed across CPUs (validation's after-dump).
MEMORY_STATES = ("steady", "drained")
#: Fill of a node's empty-slab list, as a share of min_partial, per memory state.  An empty
#: slab stays on a node only while the node has fewer than min_partial partial slabs:
#: __slab_free(), __unfreeze_partials() and deactivate_slab() discard it (discard_slab())
#: once n->nr_partial >= s->min_partial, so the count stops at the limit.
#: ``steady``: get_partial_node() hands empty slabs back to allocating CPUs (a new slab is
#: allocated only once the node list is empty), so the count walks between 0 and the limit,
#: kept at both ends, and is on average half way.  ``drained``: after a workload's last
#: frees nothing allocates to take them back, and every slab that empties beyond the CPUs'
#: own lists lands on its node's list until the limit: the list ends full (bounded by the
#: slabs the workload touched, :func:`bound_by_traffic`).
LIST_FILL = {"steady": 0.5, "drained": 1.0}


def per_cpu_partial_list_slabs(cpu_partial_slabs):
    """Mean length, in slabs, of one CPU's per-CPU partial list under traffic that feeds
    and takes it alike (``C`` = ``cpu_partial_slabs``; 0 where the profile has none).

    A free into a full slab freezes it onto the freeing CPU's list (__slab_free() ->
    put_cpu_partial()); a CPU whose CPU slab runs out takes the next one off its list
    (___slab_alloc(), slub_percpu_partial()).  put_cpu_partial() finding the list at
    C slabs moves the whole list to the node (__unfreeze_partials()) and starts a new one
    with the slab at hand, so the length walks up and down by one, is kept at 0, and
    restarts at 1 from C.  The stationary weights of such a walk are C at 0 and C + 1 - k
    at k = 1..C (the restart's flow crosses every step from C down to 1), so the mean is
    (C + 1)(C + 2) / (3 (C + 3)): 2.4 slabs for C = 7, not the 3.5 of a list found half way
    at a random moment.  (get_partial_node() refilling an empty list from the node's slabs
    pushes it up; the model leaves that out.)
    """
    c = jnp.asarray(cpu_partial_slabs, _F32)
    return jnp.where(c > 0, (c + 1.0) * (c + 2.0) / (3.0 * (c + 3.0)), 0.0)


def retained_free_fraction(state: str) -> float:
    """Free share of the slabs a CPU retains (its CPU slab and per-CPU partial slabs).

    ``steady``: half, slub_set_cpu_partial()'s own assumption (cpu_partial_slabs =
    DIV_ROUND_UP(2 * cpu_partial, objs_per_slab): per-CPU partial slabs are half full).
    ``drained``: all of it: once a workload has freed what it allocated, the slabs a CPU
    retains stay frozen on its lists however empty they get (__slab_free() of a frozen slab
    only returns the object; only the node lists discard empty slabs), so they are whole
    slabs with (nearly) nothing allocated.
    """
    return {"steady": 0.5, "drained": 1.0}[check_memory_state(state)]


def check_memory_state(state: str) -> str:
    """``state`` if it is one of :data:`MEMORY_STATES`, else a one-line error."""
    if state not in MEMORY_STATES:
        raise SlabtuneError(f"state: {state!r} is not one of {', '.join(MEMORY_STATES)}")
    return state


def per_cpu_retained_slabs(cpu_partial_slabs):
    """Slabs one CPU that uses a cache retains: its CPU slab plus its per-CPU partial list
    (:func:`per_cpu_partial_list_slabs`)."""
    return 1.0 + per_cpu_partial_list_slabs(cpu_partial_slabs)


def node_retained_slabs(min_partial, state: str = "steady"):
    """Empty slabs one node with memory keeps in memory state ``state``: its
    :data:`LIST_FILL` share of ``min_partial`` (discard_slab() beyond it)."""
    return LIST_FILL[check_memory_state(state)] * jnp.asarray(min_partial, _F32)


def bound_by_traffic(per_cpu, node, objs_per_slab, traffic):
    """(per-CPU, node) retained slabs no more than the slabs ``traffic`` objects could have
    touched, ceil(traffic / objs_per_slab), per-CPU slabs first: a slab reaches a CPU's
    lists only by an allocation from it or a free into it, and reaches a node's empty list
    only from there, so a cache that few objects passed through during a workload cannot hold
    every CPU's full share.  ``traffic`` inf (the workload churns the cache) leaves both."""
    touched = jnp.ceil(jnp.asarray(traffic, _F32) / jnp.maximum(objs_per_slab, 1.0))
    pc = jnp.minimum(per_cpu, touched)
    return pc, jnp.minimum(node, jnp.maximum(touched - pc, 0.0))


def structural_memory(st: PL.Structure, fa: FleetArrays, barn_full, barn_empty, barns_where,
                      state: str = "steady", traffic=None):
    """Overhead bytes and live bytes per (B, T, W, K) point (see the module docstring).

    Retention, in slabs of ``slab_bytes(order)``: every CPU holds
    :func:`per_cpu_retained_slabs`, of which :func:`retained_free_fraction` (``state``) is
    free; every node with memory holds :func:`node_retained_slabs` empty slabs (both by
    ``state``).  ``traffic``
    ((K,) objects allocated during the workload per cache, inf for a cache the workload
    churns; None: every cache churned) bounds both (:func:`bound_by_traffic`); the tuner's
    steady fleet passes none.  Live objects pay their slabs' ``leftover`` share.
    """
    f = lambda x: jnp.asarray(x, _F32)  # noqa: E731
    t = lambda x: x[None, :, None, None]  # noqa: E731
    s = lambda x: x[:, :, None, :]  # noqa: E731   (B,T,K) -> (B,T,1,K)
    size = f(fa.size)[None, None, None, :]
    cpus = t(fa.cpus_mem + fa.cpus_ml)
    live_objs = cpus * fa.live_per_cpu[None, None, :, :]
    n = jnp.maximum(f(s(st.objs_per_slab)), 1.0)
    slab = f(PL.slab_bytes(s(st.order)))
    leftover = live_objs / n * f(s(st.leftover))
    per_cpu = cpus * per_cpu_retained_slabs(s(st.cpu_partial_slabs))
    node = t(fa.mem_nodes) * node_retained_slabs(s(st.min_partial), state)
    if traffic is not None:
        per_cpu, node = bound_by_traffic(per_cpu, node, n,
                                         f(traffic)[None, None, None, :])
    cpu_retained = per_cpu * slab * retained_free_fraction(state)
    node_empty = node * slab
    cap = f(s(st.sheaf_capacity))
    sheaf_struct = f(PL.kmalloc_size_roundup(P.SHEAF_HEADER_BYTES + P.POINTER_BYTES * s(st.sheaf_capacity)))
    sheaf_struct = jnp.where(cap > 0, sheaf_struct, 0.0)
    per_cpu_sheaves = cpus * (2.0 * sheaf_struct + cap * size)
    barn_nodes = jnp.where(barns_where == 2, t(fa.all_nodes), t(fa.mem_nodes))
    bf = f(barn_full)[:, None, None, None]
    be = f(barn_empty)[:, None, None, None]
    barns = barn_nodes * (bf / 2.0 * (sheaf_struct + cap * size) + be / 2.0 * sheaf_struct)
    barns = jnp.where(cap > 0, barns, 0.0)
    overhead = leftover + cpu_retained + node_empty + per_cpu_sheaves + barns
    return overhead, live_objs * size


def solve_reps(base, acq, line, weight, mult, hold, cost: C.CostParams, has_ml: np.ndarray):
    """Per-op ns of both representative CPUs of every (B, T, W, K) point: the cost model's
    contention fixed point (:func:`slabtune.model.cost.solve`), ``(..., R=2)``.

    A topology without CPUs on memoryless nodes (``has_ml[t]`` false, a static mask) has no
    second representative: its weight is 0, so it neither loads any lock nor counts in the
    CPU-weighted time, and the fixed point of rep 0 alone is the same.  Those topologies
    are solved with one rep (half the work per bisection step); rep 1's time is 0 there.
    Solved in cache-sized blocks (:data:`SOLVE_BLOCK`): the bisection loop touches its
    whole working set every step, so one block of all configurations runs out of cache.
    """
    def solve(args):
        b_, a_, l_, w_, m_ = args
        return C.solve(b_, a_, hold, l_, w_, m_, cost.rho_max, sweeps=SOLVE_SWEEPS,
                       steps=SOLVE_STEPS).t

    def group(sel, reps):
        pick = lambda x: jnp.take(x, sel, axis=1)  # noqa: E731
        b_, w_ = (pick(x)[..., :reps] for x in (base, weight))
        a_, l_ = (pick(x)[..., :reps, :] for x in (acq, line))
        m_ = pick(mult)
        shape = b_.shape
        args = (b_.reshape(-1, reps), a_.reshape(-1, reps, 3), l_.reshape(-1, reps, 3),
                w_.reshape(-1, reps), m_.reshape(-1, 3))
        t = lax.map(solve, args, batch_size=min(SOLVE_BLOCK, args[0].shape[0]))
        t = t.reshape(shape)
        return t if reps == 2 else jnp.concatenate([t, jnp.zeros_like(t)], -1)

    ml = np.flatnonzero(has_ml)
    local = np.flatnonzero(~has_ml)
    parts = [(idx, group(idx, r)) for idx, r in ((local, 1), (ml, 2)) if len(idx)]
    if len(parts) == 1:
        return parts[0][1]
    order = np.argsort(np.concatenate([idx for idx, _ in parts]))
    return jnp.take(jnp.concatenate([t for _, t in parts], axis=1), order, axis=1)


def structural_objectives(values, prof: PL.ProfileArrays, fa: FleetArrays, cost: C.CostParams,
                          pcp_max: int) -> PerTopology:
    """The ``structural`` objective set: (B, T) memory overhead ratio and ns per op."""
    st, prof_b = policy_structure(values, prof, fa)
    bfull = jnp.asarray(values["barn_max_full"], _F32)
    bempty = jnp.asarray(values["barn_max_empty"], _F32)
    overhead, live = structural_memory(st, fa, bfull, bempty, prof.barns)
    # memory: per workload, all caches together; then workloads weighted.
    mem_w = overhead.sum(-1) / jnp.maximum(live.sum(-1), 1.0)          # (B, T, W)
    memory = (mem_w * fa.w_weight[None, None, :]).sum(-1)

    # time: rates per (B, T, W, K) for the two representative CPUs.
    def bcast(x):
        return jnp.broadcast_to(x[:, :, None, :], (x.shape[0], x.shape[1],
                                                   fa.live_per_cpu.shape[0], x.shape[2]))
    stw = PL.Structure(*(bcast(jnp.asarray(x)) for x in st))
    bf4 = bfull[:, None, None, None]
    ff = fa.foreign_free[None, None, :, None]
    ch = fa.churn[None, None, :, None]
    prof4 = PL.ProfileArrays(*(jnp.reshape(x, x.shape + (1,) * max(0, 4 - x.ndim))
                               if x.ndim == 3 else x for x in prof_b))
    shape = stw.order.shape
    bs = lambda x: jnp.broadcast_to(jnp.asarray(x, _F32), shape)  # noqa: E731
    reps = []
    for m in (False, True):
        r, ll, bl = structural_rates(stw, prof4, bf4, ff, ch, memoryless=m)
        reps.append((C.OpRates(*(bs(x) for x in r)), bs(ll), bs(bl)))
    order = stw.order.astype(_F32)
    objs = stw.objs_per_slab.astype(_F32)
    base = jnp.stack([C.base_ns_per_op(r, order, objs, pcp_max, cost) for r, _, _ in reps], -1)
    zone = C.zone_lock_per_call(order, pcp_max, cost)
    acq = jnp.stack([jnp.stack([ll, bl, (r.slab_alloc + r.slab_free) * zone], -1)
                     for r, ll, bl in reps], -2)                       # (..., R=2, L=3)
    tb = lambda x: jnp.broadcast_to(x[None, :, None, None], shape)  # noqa: E731
    weight = jnp.stack([tb(fa.cpus_mem), tb(fa.cpus_ml)], -1)
    mult = jnp.stack([tb(fa.mem_nodes), tb(jnp.maximum(fa.mem_nodes, 1.0)), tb(fa.mem_nodes)], -1)
    # rep 0 takes its own node's locks (local line transfers); rep 1's nearest memory node
    # is remote.  Zone locks likewise.
    line = jnp.stack([jnp.full(shape + (3,), cost.line_local_ns),
                      jnp.full(shape + (3,), cost.line_remote_ns)], -2)
    # a critical section moves several lines, as in the dynamics set's lock classes
    line = line * C.lock_line_counts(cost)
    hold = jnp.stack([cost.list_lock_hold_ns, cost.barn_lock_hold_ns, cost.zone_lock_hold_ns])
    t_rep = solve_reps(base, acq, line, weight, mult, hold, cost,
                       np.asarray(fa.cpus_ml) > 0)
    wsum = jnp.maximum(weight.sum(-1), 1.0)
    t_cpu = (t_rep * weight).sum(-1) / wsum                          # (B, T, W, K)
    t_w = (t_cpu * fa.ops[None, None, :, :]).sum(-1)                 # (B, T, W)
    time = (t_w * fa.w_weight[None, None, :]).sum(-1)
    return PerTopology(memory=memory, time=time)


# --------------------------------------------------------------------------- dynamics set

#: Live objects per CPU a dynamics workload keeps at most (the simulation runs a few hundred
#: steps; a larger live set would never be reached).
DYN_LIVE_MAX = 256
#: Dynamics steps and base seed when the spec's [objectives] table names none.
DYN_STEPS = 256
DYN_SEED = 0


def dynamics_workload(wl: Workload, k: int) -> dict:
    """The dynamics workload standing for fleet workload ``wl`` on cache ``k``.

    Mapping (workload kinds: model/workloads.py):

    * ``foreign_free > 0``: objects are freed by other CPUs than the one that allocated
      them (__slab_free on a slab that is not the freeing CPU's own), so the workload is
      ``producer_consumer`` (senders allocate, receivers free) with ``depth`` = the live
      objects per CPU and ``cross_node`` = ``foreign_free`` (the share of those frees
      crossing to another node class, where the topology has one);
    * ``foreign_free == 0``: ``local`` (every CPU frees its own objects) with ``live`` = the
      live objects per CPU and ``burst`` = round(churn * live) (churn drains the live set
      in bursts of that many frees; 0 interleaves allocs and frees at random).

    Live objects per CPU are capped at :data:`DYN_LIVE_MAX`.
    """
    live = max(1, min(int(round(wl.live_per_cpu[k])), DYN_LIVE_MAX))
    if wl.foreign_free > 0:
        return {"kind": "producer_consumer", "depth": live, "cross_node": wl.foreign_free}
    return {"kind": "local", "live": live, "burst": int(round(wl.churn * live))}


class DynamicsObjectives:
    """The ``dynamics`` objective set: per-topology memory and time of a batch of policies
    measured by the dynamics model (model/dynamics.py) instead of the structural proxy.

    Points: every (topology ``t``, workload-cache pair ``p``) the fleet uses (a workload's
    cache with live objects), one :class:`~slabtune.model.dynamics.SimConfig` each, built
    with :func:`~slabtune.model.dynamics.config_from` from the baseline structure and the
    workload of :func:`dynamics_workload`; a policy replaces the fields config_from takes
    from the structure and its overrides (order, objs_per_slab, min_partial,
    cpu_partial_slabs, sheaf_capacity, barn limits) with its own, by config_from's rules.
    All (policy x point) configs of a batch run in one ``simulate_batch`` call (batch padded
    like the structural set, so compiles are reused), seeded per point (seed + t * P + p,
    the same random stream for every policy), then ``metrics.compute`` (vmapped).

    Aggregation, like the structural set: memory per workload is the overhead bytes of its
    caches (memory_bytes - live_bytes) over their live bytes, workloads weighted; time per
    workload is ns per alloc-or-free op (metrics ns_per_op / 2: it is per alloc+free pair)
    weighted by the caches' op shares, workloads weighted.  Both (B, T).
    """

    def __init__(self, fleet: Fleet, prof: PL.ProfileArrays, fa: FleetArrays,
                 cost: C.CostParams, pcp_max: int, objective: "ObjectiveSpec"):
        from slabtune.model import dynamics as D

        self.fleet, self.prof, self.fa, self.cost, self.pcp_max = fleet, prof, fa, cost, pcp_max
        self.steps = objective.steps if objective.steps is not None else DYN_STEPS
        seed = objective.seed if objective.seed is not None else DYN_SEED
        #: (workload index, cache index) pairs simulated, per topology
        self.pairs = [(w, k) for w, wl in enumerate(fleet.workloads)
                      for k in range(len(fleet.caches)) if wl.live_per_cpu[k] > 0]
        T, Pn = len(fleet.topologies), len(self.pairs)
        base = baseline_values(fleet.profile)
        st, _ = jax.jit(policy_structure)({k: np.array([v], np.int32) for k, v in base.items()},
                                          prof, fa)
        tk_shape = (T, len(fleet.caches))
        st = PL.Structure(*(np.broadcast_to(np.asarray(x)[0], tk_shape) for x in st))
        cfgs = []
        for t, ft in enumerate(fleet.topologies):
            for w, k in self.pairs:
                s_tk = PL.Structure(*(x[t, k] for x in st))
                try:
                    cfgs.append(D.config_from(s_tk, fleet.profile, ft.topology,
                                              dynamics_workload(fleet.workloads[w], k)))
                except ValueError as err:
                    raise SlabtuneError(f"fleet.topology {ft.name}: dynamics workload of "
                                        f"{fleet.workloads[w].name}: {err}") from None
        self.template = D.stack_configs(cfgs)                      # (T * P,)
        self.seeds = (seed + np.arange(T * Pn)).astype(np.uint32)
        self.has_cpu_partial = fleet.profile.has_cpu_partial
        tk = [(t, k) for t in range(T) for _, k in self.pairs]
        self._t_idx = np.array([t for t, _ in tk])
        self._k_idx = np.array([k for _, k in tk])
        osz = np.array([fleet.caches[k].object_size for _, k in self.pairs], np.float32)
        self.object_size = np.tile(osz, T)
        ops = np.asarray(fa.ops)
        # (P, W) one-hot of each pair's workload and (P,) its op share within the workload
        self.pair_w = np.zeros((Pn, len(fleet.workloads)), np.float32)
        self.pair_ops = np.zeros(Pn, np.float32)
        for i, (w, k) in enumerate(self.pairs):
            self.pair_w[i, w] = 1.0
            self.pair_ops[i] = ops[w, k]
        self._structure = jax.jit(policy_structure)
        self._metrics = jax.jit(functools.partial(
            _dynamics_aggregate, cost=cost, pcp_max=pcp_max, steps=self.steps, T=T,
            pair_w=jnp.asarray(self.pair_w), pair_ops=jnp.asarray(self.pair_ops),
            w_weight=fa.w_weight))

    def configs(self, values) -> "D.SimConfig":
        """The stacked configs of a batch, laid out (b, t, p) policy-major: the template
        of every point with the policy's structural fields (config_from's rules: no
        per-CPU partial slabs on kernels without them; a per-CPU slab iff no sheaf)."""
        st, _ = self._structure({k: np.asarray(v, np.int32) for k, v in values.items()},
                                self.prof, self.fa)
        B = len(np.asarray(values["barn_max_full"]))
        full = (B, self.fa.possible.shape[0], self.fa.size.shape[0])
        pick = lambda x: np.broadcast_to(np.asarray(x), full)[  # noqa: E731
            :, self._t_idx, self._k_idx].reshape(-1)
        cap = pick(st.sheaf_capacity).astype(np.int32)
        cps = pick(st.cpu_partial_slabs).astype(np.int32)
        if not self.has_cpu_partial:
            cps = np.zeros_like(cps)
        n = len(self._t_idx)
        rep = lambda name: np.repeat(np.asarray(values[name], np.int32), n)  # noqa: E731
        cfg = jax.tree_util.tree_map(lambda x: np.tile(x, (B,) + (1,) * (x.ndim - 1)),
                                     self.template)
        return cfg._replace(objs_per_slab=pick(st.objs_per_slab).astype(np.int32),
                            order=pick(st.order).astype(np.int32),
                            min_partial=pick(st.min_partial).astype(np.int32),
                            cpu_partial_slabs=cps, sheaf_capacity=cap,
                            cpu_slab=(cap == 0).astype(np.int32),
                            barn_max_full=rep("barn_max_full"),
                            barn_max_empty=rep("barn_max_empty"))

    def __call__(self, values) -> PerTopology:
        from slabtune.model import dynamics as D

        cfg = self.configs(values)
        B = len(np.asarray(values["barn_max_full"]))
        keys = jax.vmap(jax.random.key)(np.tile(self.seeds, B))
        counters = D.simulate_batch(keys, cfg, self.steps)
        return self._metrics(counters, cfg, np.tile(self.object_size, B))


def _dynamics_aggregate(counters, cfg, object_size, *, cost, pcp_max, steps, T, pair_w,
                        pair_ops, w_weight) -> PerTopology:
    """Metrics of every (policy, topology, pair) config, aggregated to (B, T) (see
    :class:`DynamicsObjectives`)."""
    from slabtune.model import metrics as M

    met = jax.vmap(lambda cnt, c, osz: M.compute(cnt, c, cost, pcp_max=pcp_max,
                                                 object_size=osz, steps=steps))(
        counters, cfg, object_size)
    Pn = pair_w.shape[0]
    shape = (-1, T, Pn)
    over = jnp.reshape(met.memory_bytes - met.live_bytes, shape)
    live = jnp.reshape(met.live_bytes, shape)
    ns = jnp.reshape(met.ns_per_op, shape) / 2.0
    mem_w = (over @ pair_w) / jnp.maximum(live @ pair_w, 1.0)          # (B, T, W)
    t_w = (ns * pair_ops) @ pair_w
    return PerTopology(memory=(mem_w * w_weight).sum(-1), time=(t_w * w_weight).sum(-1))


ObjectiveSet = Callable[..., PerTopology]
#: Objective sets by the name a spec's ``[objectives] set`` gives.  A set that is a class
#: (``dynamics``) is built once per fleet and called with the batch's knob values.
OBJECTIVE_SETS: dict[str, ObjectiveSet] = {"structural": structural_objectives,
                                           "dynamics": DynamicsObjectives}


def load_default_cost() -> C.CostParams:
    """The cost constants shipped in slabtune/model/cost_default.toml."""
    text = importlib.resources.files("slabtune.model").joinpath("cost_default.toml").read_text()
    params, _meta = C.parse_cost_toml(text, "cost_default.toml")
    return params


@dataclasses.dataclass(frozen=True)
class ObjectiveSpec:
    name: str = "structural"
    #: Largest allowed per-topology regression against the baseline, as a fraction
    #: (0.05 = 5%); None for no constraint.
    max_regression: float | None = None
    #: ``dynamics`` set only: simulated steps per config and the base seed (None: defaults).
    steps: int | None = None
    seed: int | None = None
    #: A cost file (path as the spec writes it) whose constants override the packaged ones
    #: for the time objective; None: the packaged table.
    cost: str | None = None


def parse_objectives(table) -> ObjectiveSpec:
    if table is None:
        return ObjectiveSpec()
    if not isinstance(table, Mapping):
        raise SlabtuneError("objectives: expected an [objectives] table")
    unknown = set(table) - {"set", "max_regression", "steps", "seed", "cost"}
    if unknown:
        raise SlabtuneError(f"objectives.{sorted(unknown)[0]}: unknown field")
    name = table.get("set", "structural")
    if name not in OBJECTIVE_SETS:
        raise SlabtuneError(f"objectives.set: {name!r} is not one of {', '.join(OBJECTIVE_SETS)}")
    mr = table.get("max_regression")
    if mr is not None:
        mr = _num("objectives.max_regression", mr, 0.0, 10.0)
    steps = table.get("steps")
    seed = table.get("seed")
    if name != "dynamics" and (steps is not None or seed is not None):
        raise SlabtuneError(f"objectives.{'steps' if steps is not None else 'seed'}: only "
                            f"the dynamics set simulates")
    if steps is not None:
        steps = _int("objectives.steps", steps, 1, 1 << 20)
    if seed is not None:
        seed = _int("objectives.seed", seed, 0, (1 << 31) - 1)
    cost = table.get("cost")
    if cost is not None and (not isinstance(cost, str) or not cost):
        raise SlabtuneError(f"objectives.cost: {cost!r} is not a path to a cost file")
    return ObjectiveSpec(name, mr, steps, seed, cost)


class Evaluation(NamedTuple):
    """Objectives of a batch (numpy): fleet aggregates (B,) and per-topology (B, T)."""

    memory: np.ndarray
    time: np.ndarray
    memory_topo: np.ndarray
    time_topo: np.ndarray


#: Smallest padded batch: the baseline, one-at-a-time trials and batches up to this size
#: share one compiled shape.
MIN_BUCKET = 64


def _bucket(n: int) -> int:
    """Pad batch sizes to powers of two (at least MIN_BUCKET) so a study compiles few shapes;
    a single policy is evaluated alone (one-at-a-time studies pay for one policy, not 64)."""
    if n <= 1:
        return 1
    return max(MIN_BUCKET, 1 << (n - 1).bit_length())


class Evaluator:
    """Evaluates a batch of policies over a fleet in one jitted call."""

    def __init__(self, fleet: Fleet, objective: ObjectiveSpec = ObjectiveSpec(),
                 cost: C.CostParams | None = None):
        self.fleet = fleet
        self.objective = objective
        self.cost = cost if cost is not None else load_default_cost()
        self.fa = fleet_arrays(fleet)
        self.prof = PL.profile_arrays(fleet.profile)
        self.baseline_values = baseline_values(fleet.profile)
        fn = OBJECTIVE_SETS[objective.name]
        pcp_max = C.pcp_max_order(fleet.profile.version)
        if isinstance(fn, type):
            self._fn = fn(fleet, self.prof, self.fa, self.cost, pcp_max, objective)
        else:
            self._fn = jax.jit(functools.partial(fn, prof=self.prof, fa=self.fa,
                                                 cost=self.cost, pcp_max=pcp_max))
        self._topo_w = np.array([t.weight for t in fleet.topologies], np.float64)
        self._topo_w = self._topo_w / self._topo_w.sum()
        # the baseline rides in the batched shape, so a batched study compiles one shape
        full = self.evaluate([{}] * MIN_BUCKET)
        self.baseline = Evaluation(*(x[:1] for x in full))

    def evaluate(self, params_list) -> Evaluation:
        """Objectives of each policy in ``params_list`` (knob -> value mappings; knobs left
        out keep their baseline value)."""
        n = len(params_list)
        size = _bucket(n)
        values = {}
        for name in KNOBS:
            base = self.baseline_values[name]
            col = np.full(size, base, np.int32)
            for i, p in enumerate(params_list):
                if name in p:
                    col[i] = int(p[name])
            values[name] = col
        out = self._fn(values)
        mem = np.asarray(out.memory, np.float64)[:n]
        tim = np.asarray(out.time, np.float64)[:n]
        return Evaluation(memory=mem @ self._topo_w, time=tim @ self._topo_w,
                          memory_topo=mem, time_topo=tim)

    def regression_excess(self, ev: Evaluation) -> np.ndarray:
        """Per policy: the worst per-topology regression against the baseline on either
        objective, minus the allowed fraction (<= 0 is feasible; 0 where unconstrained)."""
        if self.objective.max_regression is None:
            return np.zeros(len(ev.memory))
        rm = ev.memory_topo / self.baseline.memory_topo - 1.0
        rt = ev.time_topo / self.baseline.time_topo - 1.0
        return np.maximum(rm, rt).max(axis=1) - self.objective.max_regression


def space_check(space: SearchSpace, fleet: Fleet) -> None:
    """A space and a fleet must target the same profile."""
    if space.profile.name != fleet.profile.name:
        raise SlabtuneError(f"search: profile {space.profile.name} differs from fleet.profile "
                            f"{fleet.profile.name}")


def order_grid(profile: P.KernelProfile, params: Mapping[str, int], cpus: list[int],
               sizes: list[int]) -> dict[str, list[int]]:
    """Slab order and objects per slab of a policy on single-node machines of each CPU count
    (possible = present = online) for caches of each stride: columns cpus, size, order,
    objs_per_slab, one row per cell (for the order heatmap)."""
    from slabtune.model.caches import anonymous_cache

    topos = tuple(FleetTopology(str(c), Topology.uniform(c), 1.0) for c in cpus)
    caches = tuple(anonymous_cache(s) for s in sizes)
    wl = Workload("grid", 1.0, tuple(1.0 for _ in sizes), tuple(1.0 for _ in sizes), 0.5, 0.1)
    fa = fleet_arrays(Fleet(profile, topos, caches, (wl,)))
    vals = baseline_values(profile)
    vals.update({k: int(v) for k, v in params.items()})
    st, _ = policy_structure({k: np.array([v], np.int32) for k, v in vals.items()},
                             PL.profile_arrays(profile), fa)
    order = np.asarray(st.order)[0]
    objs = np.asarray(st.objs_per_slab)[0]
    out: dict[str, list[int]] = {"cpus": [], "size": [], "order": [], "objs_per_slab": []}
    for i, c in enumerate(cpus):
        for j, s in enumerate(sizes):
            out["cpus"].append(int(c))
            out["size"].append(int(s))
            out["order"].append(int(order[i, j]))
            out["objs_per_slab"].append(int(objs[i, j]))
    return out


def cache_values(spec_fleet: Fleet, params: Mapping[str, int]) -> dict[str, dict[str, int]]:
    """Per-cache structural values of a policy (order, objs_per_slab, min_partial,
    cpu_partial objects, sheaf_capacity) on the fleet's first topology; min_partial and
    cpu_partial do not depend on the topology."""
    fa = fleet_arrays(spec_fleet)
    vals = baseline_values(spec_fleet.profile)
    vals.update({k: int(v) for k, v in params.items()})
    st, _ = policy_structure({k: np.array([v], np.int32) for k, v in vals.items()},
                             PL.profile_arrays(spec_fleet.profile), fa)
    out = {}
    for j, c in enumerate(spec_fleet.caches):
        out[c.name] = {f: int(np.asarray(getattr(st, f))[0, 0, j])
                       for f in ("order", "objs_per_slab", "min_partial", "cpu_partial",
                                 "sheaf_capacity")}
    return out

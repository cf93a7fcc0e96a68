"""Fleet objectives of SLAB policies (a ``[fleet] profile = "slab-*"`` tune spec): the same
two sets as SLUB's (:mod:`slabtune.tuner.objectives`), aggregated the same way, over SLAB's
structure (:func:`slabtune.model.slab.structure`) and dynamics
(:mod:`slabtune.model.slab_dynamics`).

A SLAB policy is ``slab_max_order`` (the boot parameter calculate_slab_order() stops at)
and the /proc/slabinfo tunables ``limit``, ``batchcount``, ``shared``, written to every
cache of the fleet; a tunable at :data:`~slabtune.tuner.space.SLAB_CACHE_DEFAULT` keeps
the cache's enable_cpucache() value, except that an unset batchcount under a set limit is
``(limit + 1) / 2``, enable_cpucache()'s rule.  A policy whose batchcount exceeds a
cache's limit is one the kernel does not apply (slabinfo_write() skips the line:
:func:`slabtune.model.slab.tunables_accepted`): its objectives are NaN, so the trial fails.

What do_tune_cpucache() (6.1 mm/slab.c) changes when a tunables line is written: the
per-CPU arrays hold ``limit`` objects and move ``batchcount`` per refill or flush; the
node's shared array holds ``shared * batchcount``; setup_kmem_cache_nodes() re-runs
init_cache_node(), so ``free_limit = (1 + nr_cpus_node) * batchcount + num``; the alien
arrays keep the entries enable_cpucache() gave them (setup_kmem_cache_node() installs new
ones only on a node that has none: ``slab.retuned_alien_limit``).
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

import jax.numpy as jnp
import numpy as np

from slabtune.errors import SlabtuneError
from slabtune.model import cost as cost_model
from slabtune.model import slab
from slabtune.tuner import objectives as obj
from slabtune.tuner.space import SLAB_CACHE_DEFAULT

if TYPE_CHECKING:
    from slabtune.tuner.fleet import Fleet, FleetArrays
    from slabtune.tuner.objectives import ObjectiveSpec

_F32 = jnp.float32
#: Fill of every SLAB array and of the node's free objects in the structural set's steady
#: state: refills and flushes keep a per-CPU array between 0 and ``limit`` objects (a flush
#: at ``limit`` leaves limit - batchcount, a refill at 0 brings batchcount), so half full
#: on average; the shared and alien arrays and the node's free objects (up to
#: ``free_limit``) likewise.
ARRAY_FILL = 0.5


def tunables_of(limit, batchcount, shared, d_limit, d_batchcount, d_shared):
    """The (limit, batchcount, shared) a cache runs with under a policy's tunables,
    elementwise (numpy arrays or ints): a tunable at :data:`SLAB_CACHE_DEFAULT` keeps the
    cache's enable_cpucache() value ``d_*``, except that an unset batchcount under a set
    limit is enable_cpucache()'s ``(limit + 1) / 2`` (6.1 mm/slab.c)."""
    lim = np.where(limit == SLAB_CACHE_DEFAULT, d_limit, limit)
    bc = np.where(batchcount != SLAB_CACHE_DEFAULT, batchcount,
                  np.where(limit == SLAB_CACHE_DEFAULT, d_batchcount, (lim + 1) // 2))
    sh = np.where(shared == SLAB_CACHE_DEFAULT, d_shared, shared)
    return lim, bc, sh


def cache_tunables(limit: int, batchcount: int, shared: int,
                   default: slab.CpuCache) -> slab.CpuCache:
    """:func:`tunables_of` of one cache whose enable_cpucache() tunables are ``default``."""
    return slab.CpuCache(*(int(x) for x in tunables_of(limit, batchcount, shared, *default)))


def shared_entries(shared, batchcount):
    """Objects a node's shared array holds: ``shared * batchcount`` (enable_cpucache() /
    do_tune_cpucache() -> setup_kmem_cache_nodes(), 6.1 mm/slab.c)."""
    return shared * batchcount


def tuned_structure(st: slab.SlabStructure, tun: slab.CpuCache,
                    node_cpus: tuple[int, ...]) -> slab.SlabStructure:
    """``st`` after ``echo "name limit batchcount shared" > /proc/slabinfo``
    (do_tune_cpucache(), 6.1 mm/slab.c; see the module docstring)."""
    return st._replace(
        limit=tun.limit, batchcount=tun.batchcount, shared=tun.shared,
        shared_entries=shared_entries(tun.shared, tun.batchcount),
        alien_limit=slab.retuned_alien_limit(st.alien_limit, tun.limit),
        free_limit=tuple(slab.free_limit(tun.batchcount, st.objs_per_slab, c)
                         for c in node_cpus))


@functools.lru_cache(maxsize=65536)
def _base_structure(size: int, name: str, possible: int, node_cpus: tuple[int, ...],
                    profile, max_order: int) -> slab.SlabStructure:
    facts = slab.known_facts(name, profile) or slab.NO_FACTS
    return slab.structure(size, possible, node_cpus, profile, max_order=max_order, facts=facts)


def policy_structures(fleet: Fleet, values) -> list[list[list[slab.SlabStructure | None]]]:
    """SLAB's structure of every (policy b, topology t, cache k) point under the batch's
    knob ``values`` (every SLAB knob as a (B,) array); None where the kernel does not apply
    the policy's tunables to that cache (``slab.tunables_accepted``: batchcount above
    limit)."""
    B = len(np.asarray(values["slab_max_order"]))
    out = []
    for b in range(B):
        mo, lim, bc, sh = (int(np.asarray(values[k])[b])
                           for k in ("slab_max_order", "limit", "batchcount", "shared"))
        rows = []
        for ft in fleet.topologies:
            t = ft.topology
            nc = tuple(int(c) for c in t.node_cpus)
            row = []
            for c in fleet.caches:
                st = _base_structure(c.size, c.name, t.possible, nc, fleet.profile, mo)
                tun = cache_tunables(lim, bc, sh, slab.CpuCache(st.limit, st.batchcount,
                                                                st.shared))
                ok = slab.tunables_accepted(tun.limit, tun.batchcount, tun.shared)
                row.append(tuned_structure(st, tun, nc) if ok else None)
            rows.append(row)
        out.append(rows)
    return out


def structure_arrays(structs, fleet: Fleet) -> dict[str, np.ndarray]:
    """(B, T, K) float arrays of what the structural set reads, and ``valid`` (B,): order,
    objs_per_slab, left_over, limit, batchcount, shared_entries, alien_limit, free_limit
    (summed over the topology's nodes); a refused point is a valid-looking placeholder and
    its policy invalid."""
    fields = STRUCTURE_FIELDS
    B, T, K = len(structs), len(fleet.topologies), len(fleet.caches)
    out = {f: np.ones((B, T, K), np.float32) for f in fields}
    valid = np.ones(B, bool)
    for b in range(B):
        for t in range(T):
            for k in range(K):
                st = structs[b][t][k]
                if st is None:
                    valid[b] = False
                    continue
                for f in fields:
                    v = getattr(st, f)
                    out[f][b, t, k] = sum(v) if f == "free_limit" else v
    out["valid"] = valid
    return out


#: What :func:`structure_arrays` reads of each structure (free_limit: summed over nodes).
STRUCTURE_FIELDS = ("order", "objs_per_slab", "left_over", "limit", "batchcount",
                    "shared_entries", "alien_limit", "free_limit")
_BASE_FIELDS = ("order", "objs_per_slab", "left_over", "limit", "batchcount", "shared",
                "alien_limit")


def policy_structure_arrays(fleet: Fleet, values) -> dict[str, np.ndarray]:
    """:func:`structure_arrays` of :func:`policy_structures` computed on arrays: the
    structure of each distinct ``slab_max_order`` in the batch is built once per (topology,
    cache), and the tunables are applied to all policies at once by the same rules
    (:func:`tunables_of`, :func:`shared_entries`, ``slab.retuned_alien_limit``,
    ``slab.free_limit``; ``slab.tunables_accepted`` for ``valid``).  Equal to the per-point
    path on every valid policy; an invalid policy's entries are whatever the rules give."""
    mo = np.asarray(values["slab_max_order"]).astype(np.int64)
    orders, inv = np.unique(mo, return_inverse=True)
    T, K = len(fleet.topologies), len(fleet.caches)
    node_cpus = [tuple(int(c) for c in ft.topology.node_cpus) for ft in fleet.topologies]
    base = {f: np.empty((len(orders), T, K), np.int64) for f in _BASE_FIELDS}
    for i, o in enumerate(orders.tolist()):
        for t, ft in enumerate(fleet.topologies):
            for k, c in enumerate(fleet.caches):
                st = _base_structure(c.size, c.name, ft.topology.possible, node_cpus[t],
                                     fleet.profile, o)
                for f in _BASE_FIELDS:
                    base[f][i, t, k] = getattr(st, f)
    g = {f: a[inv.reshape(-1)] for f, a in base.items()}             # (B, T, K)
    col = lambda n: np.asarray(values[n]).astype(np.int64)[:, None, None]  # noqa: E731
    lim, bc, sh = tunables_of(col("limit"), col("batchcount"), col("shared"),
                              g["limit"], g["batchcount"], g["shared"])
    free = np.zeros(lim.shape, np.int64)
    for t, nc in enumerate(node_cpus):
        for c in nc:
            free[:, t] += slab.free_limit(bc[:, t], g["objs_per_slab"][:, t], c)
    pairs, where = np.unique(g["alien_limit"] * (1 << 32) + lim, return_inverse=True)
    alien = np.array([slab.retuned_alien_limit(int(p >> 32), int(p & 0xFFFFFFFF))
                      for p in pairs.tolist()], np.int64)
    out = {"order": g["order"], "objs_per_slab": g["objs_per_slab"],
           "left_over": g["left_over"], "limit": lim, "batchcount": bc,
           "shared_entries": shared_entries(sh, bc),
           "alien_limit": alien[where.reshape(-1)].reshape(lim.shape), "free_limit": free}
    out = {f: out[f].astype(np.float32) for f in STRUCTURE_FIELDS}
    out["valid"] = slab.tunables_accepted(lim, bc, sh).all(axis=(1, 2))
    return out


def slab_memory(sa, fa: FleetArrays):
    """Overhead and live bytes per (B, T, W, K) point of the structural set.

    Live objects (online CPUs x live per CPU) pay their slabs' leftover share; besides, SLAB
    holds free objects in (mm/slab.c 6.1): every CPU's array (``limit``), each node's shared
    array (``shared * batchcount``) and alien arrays (one of ``alien_limit`` per other
    node), and each node's slab lists up to ``free_limit``; all :data:`ARRAY_FILL` full."""
    f = lambda x: jnp.asarray(x, _F32)  # noqa: E731
    s = lambda x: f(x)[:, :, None, :]  # noqa: E731   (B,T,K) -> (B,T,1,K)
    t = lambda x: f(x)[None, :, None, None]  # noqa: E731
    size = f(fa.size)[None, None, None, :]
    cpus = t(fa.cpus_mem + fa.cpus_ml)
    nodes = t(fa.all_nodes)
    live_objs = cpus * fa.live_per_cpu[None, None, :, :]
    leftover = live_objs / jnp.maximum(s(sa["objs_per_slab"]), 1.0) * s(sa["left_over"])
    held = (cpus * s(sa["limit"]) + nodes * s(sa["shared_entries"])
            + nodes * (nodes - 1.0) * s(sa["alien_limit"]) + s(sa["free_limit"]))
    return leftover + ARRAY_FILL * held * size, live_objs * size


def slab_rates(sa, fa: FleetArrays, memoryless: bool, fallback: bool):
    """Per-op event rates and (list_lock, alien lock) acquisitions of one representative
    CPU of SLAB, each (B, T, W, K); half of the ops are allocs, half frees.  Proxy rules:

    * an alloc refills the CPU's array (cache_alloc_refill(), under the node's list_lock)
      once per ``batchcount`` allocs; a CPU on a memoryless node without the numa_mem_id()
      fix (``fallback`` false) takes every alloc through fallback_alloc() and the list_lock;
    * a free flushes the array (cache_flusharray(), list_lock) once per ``batchcount``
      frees; a free of another node's object (the workload's foreign frees where the
      topology has more than one memory node; every free of a memoryless CPU without the
      fix) takes the alien array's lock and drains it (remote list_lock) once per
      ``alien_limit`` such frees, or without alien arrays goes to free_block() under the
      remote list_lock each time (cache_free_alien()); neither moves a cross-node line
      outside that list_lock (``slab_dynamics.REMOTE_FREE_LINES``), and the alien lock's
      sections are pushes (metrics.alien_section(), as the dynamics set prices them);
    * every object passing through an array moves in a batch (``sheaf_objects_moved``, as
      :func:`slabtune.model.slab_dynamics.slub_view` prices SLAB's objects moved);
    * slab allocations per alloc: churn / objects per slab, and as many slab frees.
    """
    from slabtune.model import slab_dynamics

    f = lambda x: jnp.asarray(x, _F32)  # noqa: E731
    s = lambda x: f(x)[:, :, None, :]  # noqa: E731
    bc = s(sa["batchcount"])
    alien = s(sa["alien_limit"])
    n = jnp.maximum(s(sa["objs_per_slab"]), 1.0)
    shape = jnp.broadcast_shapes(bc.shape, (1, 1, fa.live_per_cpu.shape[0], 1))
    multi = (f(fa.mem_nodes) > 1.0)[None, :, None, None]
    no_fix = memoryless and not fallback
    cross = f(fa.foreign_free)[None, None, :, None] * multi
    if no_fix:
        cross = jnp.ones(shape, _F32)
    a_slow = jnp.ones(shape, _F32) if no_fix else jnp.broadcast_to(1.0 / bc, shape)
    has_alien = alien > 0
    f_slow = (1.0 - cross) / bc + cross * jnp.where(has_alien, 1.0 / jnp.maximum(alien, 1.0),
                                                    1.0)
    f_slow = jnp.broadcast_to(f_slow, shape)
    alien_lock = jnp.broadcast_to(jnp.where(has_alien, cross, 0.0), shape)
    a_moved = 0.0 if no_fix else 1.0
    f_moved = jnp.where(has_alien, 1.0, 1.0 - cross)
    churn = f(fa.churn)[None, None, :, None]
    slab_alloc = jnp.broadcast_to(churn / n, shape)
    zero = jnp.zeros(shape, _F32)
    rates = cost_model.OpRates(
        alloc_fast=0.5 * (1.0 - jnp.minimum(a_slow, 1.0)),
        free_fast=0.5 * (1.0 - jnp.minimum(f_slow, 1.0)),
        alloc_slow=0.5 * a_slow, free_slow=0.5 * f_slow,
        remote_free=0.5 * slab_dynamics.REMOTE_FREE_LINES * jnp.broadcast_to(cross, shape),
        sheaf_swap=zero,
        sheaf_objects_moved=jnp.broadcast_to(0.5 * (a_moved + f_moved), shape),
        cpu_partial_drain=zero, slab_alloc=0.5 * slab_alloc, slab_free=0.5 * slab_alloc)
    return rates, 0.5 * (a_slow + f_slow), 0.5 * alien_lock


class SlabStructuralObjectives:
    """The ``structural`` set for a SLAB fleet: memory from :func:`slab_memory`, time from
    :func:`slab_rates` priced as SLUB's structural set prices its rates
    (:func:`slabtune.tuner.objectives.priced_time`), aggregated alike."""

    def __init__(self, fleet: Fleet, fa: FleetArrays, cost: cost_model.CostParams,
                 pcp_max: int, objective: ObjectiveSpec):
        self.fleet, self.fa = fleet, fa
        self._price = obj.shared_jit(_structural, fa=fa, cost=cost, pcp_max=pcp_max,
                                     fallback=bool(fleet.profile.memoryless_fallback))

    def __call__(self, values):
        from slabtune.tuner.objectives import PerTopology

        sa = policy_structure_arrays(self.fleet, values)
        valid = sa.pop("valid")
        mem, tim = self._price(sa)
        bad = np.where(valid, 0.0, np.nan)[:, None]
        return PerTopology(memory=np.asarray(mem) + bad, time=np.asarray(tim) + bad)


def _structural(sa, *, fa, cost, pcp_max, fallback):
    from slabtune.model import metrics
    from slabtune.tuner.objectives import priced_time

    overhead, live = slab_memory(sa, fa)
    mem_w = overhead.sum(-1) / jnp.maximum(live.sum(-1), 1.0)          # (B, T, W)
    memory = (mem_w * fa.w_weight[None, None, :]).sum(-1)
    reps = [slab_rates(sa, fa, m, fallback) for m in (False, True)]
    order = jnp.broadcast_to(jnp.asarray(sa["order"])[:, :, None, :], reps[0][1].shape)
    objs = jnp.broadcast_to(jnp.asarray(sa["objs_per_slab"])[:, :, None, :], order.shape)
    lines = slab.alien_section_lines(jnp.asarray(sa["alien_limit"], _F32)[:, :, None, :])
    return memory, priced_time(reps, order, objs, fa, metrics.slab_table(cost), pcp_max,
                               barn=metrics.alien_section(lines, cost))



class SlabDynamicsObjectives(obj.DynamicsObjectives):
    """The ``dynamics`` set for a SLAB fleet: every (policy, topology, workload-cache)
    point one :class:`~slabtune.model.slab_dynamics.SlabSimConfig`
    (:func:`~slabtune.model.slab_dynamics.config_from` with the policy's structure and
    tunables, and the workload of :func:`slabtune.tuner.objectives.dynamics_workload`),
    run in steady state as the SLUB set runs its points (the same schedules,
    :func:`~slabtune.tuner.objectives.steady_schedule` with one op per step: SLAB's
    engines have no runs; the same counted window, check and seeds), priced through
    :func:`~slabtune.model.slab_dynamics.slub_view` by ``metrics.compute``, and
    aggregated by the SLUB set's :func:`~slabtune.tuner.objectives._dynamics_aggregate`.
    """

    run_max = 1

    def __init__(self, fleet: Fleet, fa: FleetArrays, cost: cost_model.CostParams,
                 pcp_max: int, objective: ObjectiveSpec):
        from slabtune.model import slab_dynamics
        from slabtune.sweeps import dynsim

        self.fleet, self.fa, self.cost, self.pcp_max = fleet, fa, cost, pcp_max
        seed = objective.seed if objective.seed is not None else obj.DYN_SEED
        self._pairs_and_weights(fleet, fa)
        T, Pn = len(fleet.topologies), len(self.pairs)
        self.seeds = (seed + np.arange(T * Pn)).astype(np.uint32)
        self._cfg_cache: dict = {}
        self._run = dynsim.run_slab_batch_at
        self.view = slab_dynamics.slub_view
        base = self._base_structures()
        self._schedule([self.point_config(base[t][k], t, w, k)
                        for t in range(T) for w, k in self.pairs], objective)
        self.settle(self.configs({"slab_max_order": np.array([slab.default_max_order()]),
                                  **{k: np.array([SLAB_CACHE_DEFAULT])
                                     for k in ("limit", "batchcount", "shared")}})[0])

    def _base_structures(self):
        return policy_structures(self.fleet, {
            "slab_max_order": np.array([slab.default_max_order()]),
            "limit": np.array([SLAB_CACHE_DEFAULT]),
            "batchcount": np.array([SLAB_CACHE_DEFAULT]),
            "shared": np.array([SLAB_CACHE_DEFAULT])})[0]

    def point_config(self, st: slab.SlabStructure, t: int, w: int, k: int):
        """The SlabSimConfig of one point (the structure carries the policy's
        tunables)."""
        from slabtune.model import slab_dynamics

        key = (st, t, w, k)
        if key not in self._cfg_cache:
            ft = self.fleet.topologies[t]
            try:
                self._cfg_cache[key] = slab_dynamics.config_from(
                    st, self.fleet.profile, ft.topology,
                    obj.dynamics_workload(self.fleet.workloads[w], k, ft.topology))
            except ValueError as err:
                raise SlabtuneError(f"fleet.topology {ft.name}: dynamics workload of "
                                    f"{self.fleet.workloads[w].name}: {err}") from None
        return self._cfg_cache[key]

    def configs(self, values):
        """Stacked configs of a batch, laid out (b, t, p) policy-major, and (B,)
        validity (a policy the kernel refuses runs the baseline's configs, and its
        objectives are NaN)."""
        from slabtune.model import slab_dynamics

        structs = policy_structures(self.fleet, values)
        valid = np.array([all(st is not None for row in sb for st in row)
                          for sb in structs])
        base = self._base_structures()
        cfgs = []
        for b, sb in enumerate(structs):
            for t in range(len(self.fleet.topologies)):
                for w, k in self.pairs:
                    st = sb[t][k] if valid[b] else base[t][k]
                    cfgs.append(self.point_config(st, t, w, k))
        return slab_dynamics.stack_configs(cfgs), valid

    def __call__(self, values):
        cfg, valid = self.configs(values)
        out = self.measure(cfg, len(valid), same=obj.same_rows(values))
        bad = np.where(valid, 0.0, np.nan)[:, None]
        self.notes = [n if v else "" for n, v in zip(self.notes, valid)]
        return obj.PerTopology(memory=np.asarray(out.memory) + bad,
                               time=np.asarray(out.time) + bad)


#: SLAB objective sets by the names of :data:`slabtune.tuner.objectives.OBJECTIVE_SETS`.
SLAB_OBJECTIVE_SETS = {"structural": SlabStructuralObjectives,
                       "dynamics": SlabDynamicsObjectives}

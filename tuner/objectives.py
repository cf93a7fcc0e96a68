"""Fleet objectives: memory overhead and modelled time per operation of a batch of policies,
aggregated over a weighted fleet of topologies and workloads (:mod:`slabtune.tuner.fleet`),
in one vectorised call.

An *objective set* maps the structure of every (policy, topology, cache) point to
per-topology memory and time; sets are looked up by name in :data:`OBJECTIVE_SETS` (a tune
spec's ``[objectives] set``):

* ``structural``: memory from the retention model in its ``steady`` state
  (:func:`slabtune.model.retention.structural_memory`), time from the cost model fed with
  event rates estimated from structure (:func:`slabtune.model.rates.structural_rates`), for
  two representative CPUs per topology (one on a node with memory, one on a memoryless node);
* ``dynamics``: both measured by the dynamics model, every (policy, topology, workload-cache)
  point one :class:`~slabtune.model.dynamics.SimConfig` of one ``simulate_batch`` call
  (:class:`DynamicsObjectives`).

docs/TUNING.md describes fleets, sets and cost tables; docs/SPECS.md the TOML.
"""


from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from slabtune.errors import SlabtuneError
from slabtune.model import cost as cost_model
from slabtune.model import policy, profiles
from slabtune.model.topology import Topology
from slabtune.sweeps import simconfig
from slabtune.tuner.space import SearchSpace, baseline_values, knobs_for

if TYPE_CHECKING:
    from slabtune.model import dynamics

from slabtune.model.rates import structural_rates
from slabtune.model.retention import structural_memory
from slabtune.tuner.fleet import (
    Fleet,
    FleetArrays,
    FleetTopology,
    FleetWorkload,
    check_int,
    check_number,
    fleet_arrays,
)

_F32 = jnp.float32
_I32 = jnp.int32


# --------------------------------------------------------------------------- objectives


class PerTopology(NamedTuple):
    """Per-topology objectives of a batch: shape (B, T) each, lower is better."""

    memory: jnp.ndarray   # overhead bytes / live object bytes
    time: jnp.ndarray     # modelled ns per alloc-or-free op


def policy_structure(values: Mapping[str, jnp.ndarray], prof: policy.ProfileArrays,
                     fa: FleetArrays) -> tuple[policy.Structure, policy.ProfileArrays]:
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
    nr = policy.order_nr_cpus(t(fa.possible), t(fa.present), t(fa.online), prof, k(fa.early))
    coeff = b("order_objects_mul") * (policy.fls(nr) + b("order_objects_add"))
    boot_mo = b("slub_min_objects")
    min_objects = jnp.where(boot_mo > 0, boot_mo, jnp.maximum(coeff, 1))
    st = policy.structure(k(fa.size), t(fa.possible), t(fa.present), t(fa.online), prof,
                      min_order=b("slub_min_order"), max_order=b("slub_max_order"),
                      min_objects=min_objects, early=k(fa.early), is_kmalloc=k(fa.is_kmalloc),
                      is_bootstrap=k(fa.is_bootstrap), explicit_sheaf=k(fa.explicit_sheaf))
    return st, prof


#: :func:`policy_structure` jitted once for every evaluator: jax.jit keeps a compiled program
#: per function and argument shapes for the process's life, so a jax.jit(...) built per
#: instance compiled and kept one per instance (issue 35: each holds hundreds of memory
#: mappings).  So every jitted objective here is one module-level function: the fleet's
#: arrays are arguments where the function reads none of them on the host, else the
#: jitted function is shared by their values (:func:`shared_jit`).
_policy_structure = jax.jit(policy_structure)


#: Bisection steps of the cost model's pace (model/cost.py ``solve``, default 40): each
#: halves the bracket of ``log tau``, whose width is at most the log of the ratio of a pace
#: with every CPU queued at every lock to one with none (below 2**6 on the quick fleet), so
#: 24 steps resolve the pace to better than 1e-5 relative.
SOLVE_STEPS = 24
#: Configurations solved together (vmap) per step of a sequential map over the batch.
SOLVE_BLOCK = 256


def solve_reps(base, acq, line, weight, mult, hold, cost: cost_model.CostParams,
               has_ml: np.ndarray):
    """Per-op ns of both representative CPUs of every (B, T, W, K) point: the cost model's
    closed-queue contention (:func:`slabtune.model.cost.solve`), ``(..., R=2)``.

    A topology without CPUs on memoryless nodes (``has_ml[t]`` false, a static mask) has no
    second representative: its weight is 0, so it neither loads any lock nor counts in the
    CPU-weighted time, and the fixed point of rep 0 alone is the same.  Those topologies
    are solved with one rep (half the work per bisection step); rep 1's time is 0 there.
    Solved in cache-sized blocks (:data:`SOLVE_BLOCK`): the bisection loop touches its
    whole working set every step, so one block of all configurations runs out of cache.
    """
    def solve(args):
        b_, a_, l_, w_, m_ = args
        return cost_model.solve(b_, a_, hold, l_, w_, m_, cost.queueing, steps=SOLVE_STEPS).t

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


def priced_time(reps, order, objs_per_slab, fa: FleetArrays, cost: cost_model.CostParams,
                pcp_max: int, barn=None) -> jnp.ndarray:
    """(B, T) modelled ns per op of structural event rates: ``reps`` holds, for the two
    representative CPUs (node with memory, memoryless node), ``(OpRates, list_lock,
    barn_lock)`` acquisitions per op, each (B, T, W, K); priced by the cost model
    (base_ns_per_op, then the closed-queue contention of :func:`solve_reps`), CPU-weighted
    per point, weighted by the caches' op shares and the workloads' weights.  Shared by the
    SLUB structural set and SLAB's (:mod:`slabtune.tuner.slab_objectives`), which passes
    ``barn``: the ``(hold, lines)`` of its alien lock sections (metrics.alien_section(),
    lines broadcastable to (B, T, W, K)) for the barn lock class."""
    shape = reps[0][1].shape
    order = jnp.asarray(order, _F32)
    objs = jnp.asarray(objs_per_slab, _F32)
    base = jnp.stack([cost_model.base_ns_per_op(r, order, objs, pcp_max, cost)
                      for r, _, _ in reps], -1)
    zone = cost_model.zone_lock_per_call(order, pcp_max, cost)
    acq = jnp.stack([jnp.stack([ll, bl, (r.slab_alloc + r.slab_free) * zone], -1)
                     for r, ll, bl in reps], -2)                       # (..., R=2, L=3)
    tb = lambda x: jnp.broadcast_to(x[None, :, None, None], shape)  # noqa: E731
    weight = jnp.stack([tb(fa.cpus_mem), tb(fa.cpus_ml)], -1)
    mult = jnp.stack([tb(fa.mem_nodes), tb(jnp.maximum(fa.mem_nodes, 1.0)), tb(fa.mem_nodes)], -1)
    # rep 0 takes its own node's locks (local line transfers); rep 1's nearest memory node
    # is remote.  Zone locks likewise.
    line = jnp.stack([jnp.full(shape + (3,), cost.line_local_ns),
                      jnp.full(shape + (3,), cost.line_remote_ns)], -2)
    # a critical section moves several lines, as in the dynamics set's lock classes, and
    # only when the lock's previous holder was another CPU (cost.foreign_holder_fraction)
    moved = jnp.vectorize(cost_model.foreign_holder_fraction,
                          signature="(r,l),(r),(l),(r)->(r,l)")(
        acq, weight, mult, jnp.ones_like(weight))
    counts = cost_model.lock_line_counts(
        cost, cost_model.zone_blocks_per_acquisition(order, pcp_max, cost))[..., None, :]
    if barn is not None:
        counts = jnp.where(jnp.arange(3) == 1, jnp.asarray(barn[1], _F32)[..., None, None],
                           counts)
    line = line * counts * moved
    # the zone lock's hold depends on the order (a pcp batch or one block): it goes with
    # the per-point service in ``line``, and the class's shared hold is 0
    zone_hold = cost_model.zone_hold_ns(order, pcp_max, cost)[..., None]     # (..., 1)
    line = line.at[..., 2].add(zone_hold)
    barn_hold = cost.barn_lock_hold_ns if barn is None else barn[0]
    hold = jnp.stack([cost.list_lock_hold_ns, barn_hold, jnp.float32(0.0)])
    t_rep = solve_reps(base, acq, line, weight, mult, hold, cost,
                       np.asarray(fa.cpus_ml) > 0)
    wsum = jnp.maximum(weight.sum(-1), 1.0)
    t_cpu = (t_rep * weight).sum(-1) / wsum                          # (B, T, W, K)
    t_w = (t_cpu * fa.ops[None, None, :, :]).sum(-1)                 # (B, T, W)
    return (t_w * fa.w_weight[None, None, :]).sum(-1)


def merged_structure(st: policy.Structure, values, fa: FleetArrays):
    """Cache merging in the structural set: ``(st, alias, in_group)``.

    Without ``slub_nomerge`` (``values["slub_nomerge"]`` 0) a cache that
    :func:`~slabtune.tuner.fleet.merge_roots` merges into another fleet cache has that
    cache's kmem_cache (``__kmem_cache_alias()``, mm/slab_common.c): its structure is the
    owner's and it keeps no slabs, per-CPU slabs or sheaves, partial lists or barns of its
    own.  ``alias``: (B, 1, K) such caches, per policy; ``in_group``: (B, 1, K) the caches
    of a merged kmem_cache, owner included, whose list_lock and barn traffic is one
    (:func:`merged_lock_rate`).  Both None where no fleet caches merge."""
    root = fa.merge_root
    if root is None or "slub_nomerge" not in values:
        return st, None, None
    k = np.arange(len(root))
    aliased = root != k
    if not aliased.any():
        return st, None, None
    grouped = np.bincount(root, minlength=len(root))[root] > 1
    merging = jnp.asarray(values["slub_nomerge"], _I32)[:, None, None] == 0     # (B, 1, 1)
    alias = merging & jnp.asarray(aliased)[None, None, :]
    shape = jnp.broadcast_shapes(*(jnp.shape(x) for x in st))

    def owner(x):
        x = jnp.broadcast_to(x, shape)
        return jnp.where(alias, jnp.take(x, jnp.asarray(root), axis=-1), x)
    st = policy.Structure(*(owner(x) for x in st))
    return st, alias, merging & jnp.asarray(grouped)[None, None, :]


def merged_lock_rate(rate, fa: FleetArrays, in_group):
    """(B, T, W, K) list_lock (or barn lock) acquisitions per op where merged caches share
    one lock: each member's rate becomes its kmem_cache's, the op-weighted mean over the
    members (the group priced as one cache whose ops are theirs, as :func:`priced_time`
    prices each cache's lock on its own).  Caches outside a group keep theirs."""
    root = np.asarray(fa.merge_root)
    same = jnp.asarray((root[:, None] == root[None, :]).astype(np.float32))   # (K, K)
    ops = fa.ops                                                            # (W, K)
    num = jnp.einsum("btwj,wj,kj->btwk", rate, ops, same)
    den = jnp.einsum("wj,kj->wk", ops, same)[None, None]
    mean = jnp.where(den > 0, num / jnp.maximum(den, 1e-30), rate)
    return jnp.where(in_group[:, :, None, :], mean, rate)


def structural_objectives(values, prof: policy.ProfileArrays, fa: FleetArrays,
                          cost: cost_model.CostParams, pcp_max: int) -> PerTopology:
    """The ``structural`` objective set: (B, T) memory overhead ratio and ns per op."""
    st, prof_b = policy_structure(values, prof, fa)
    st, alias, in_group = merged_structure(st, values, fa)
    bfull = jnp.asarray(values["barn_max_full"], _F32)
    bempty = jnp.asarray(values["barn_max_empty"], _F32)
    overhead, live = structural_memory(st, fa, bfull, bempty, prof.barns,
                                       cpu_slab=policy.has_cpu_slab(prof),
                                       shared=None if alias is None else alias[:, :, None, :])
    # memory: per workload, all caches together; then workloads weighted.
    mem_w = overhead.sum(-1) / jnp.maximum(live.sum(-1), 1.0)          # (B, T, W)
    memory = (mem_w * fa.w_weight[None, None, :]).sum(-1)

    # time: rates per (B, T, W, K) for the two representative CPUs.
    def bcast(x):
        return jnp.broadcast_to(x[:, :, None, :], (x.shape[0], x.shape[1],
                                                   fa.live_per_cpu.shape[0], x.shape[2]))
    stw = policy.Structure(*(bcast(jnp.asarray(x)) for x in st))
    bf4 = bfull[:, None, None, None]
    ff = fa.foreign_free[None, None, :, None]
    ch = fa.churn[None, None, :, None]
    prof4 = policy.ProfileArrays(*(jnp.reshape(x, x.shape + (1,) * max(0, 4 - x.ndim))
                               if x.ndim == 3 else x for x in prof_b))
    shape = stw.order.shape
    bs = lambda x: jnp.broadcast_to(jnp.asarray(x, _F32), shape)  # noqa: E731
    reps = []
    for m in (False, True):
        r, ll, bl = structural_rates(stw, prof4, bf4, ff, ch, memoryless=m)
        ll, bl = bs(ll), bs(bl)
        if alias is not None:
            ll, bl = (merged_lock_rate(x, fa, in_group) for x in (ll, bl))
        reps.append((cost_model.OpRates(*(bs(x) for x in r)), ll, bl))
    time = priced_time(reps, stw.order, stw.objs_per_slab, fa, cost, pcp_max)
    return PerTopology(memory=memory, time=time)


# --------------------------------------------------------------------------- dynamics set

#: Dynamics base seed when the spec's [objectives] table names none.
DYN_SEED = 0
#: Steady state (docs/TUNING.md, "Objective sets"): the longest run (``ops_per_step``) a
#: SLUB point gets, and the share of its live set one run may be at most (1/32: the hold
#: band's half-width, workloads.hold_levels, so a run never jumps across the band).
RUN_MAX = 64
RUN_SHARE = 32
#: Ops per rep in each half of a counted window at least: time per op is driven by rare
#: costly events (a slab from the page allocator, a refill of a small per-CPU array), and a
#: half of a few hundred ops sees a handful (SLAB at limit 4, live 100: halves of 412 ops
#: 9.8% apart in time per op, memory equal).
HALF_MIN_OPS = 2048
#: The window's halves must agree within this share of the window's value, in memory held
#: and in ns per op, per (topology, workload); else the point is not in steady state.
STEADY_TOL = 0.05
#: The live objects per CPU a point holds over its window must be within this share of the
#: fleet's declared live_per_cpu.
OCCUPANCY_TOL = 0.10
#: A (topology, workload) whose baseline is not in steady state with the derived schedule
#: gets its warm-up and window doubled, up to this many times (:meth:`DynamicsObjectives.
#: settle`).
SETTLE_DOUBLINGS = 5
#: A trial's (topology, workload) still moving is run again with its warm-up and window
#: doubled, up to this many times, before its objectives are reported as not in steady
#: state.
RETRY_DOUBLINGS = 2


def dynamics_workload(wl: FleetWorkload, k: int, topology: Topology | None = None) -> dict:
    """The dynamics workload standing for fleet workload ``wl`` on cache ``k`` (on
    ``topology``), holding the fleet's declared live set (workloads ``drain = "hold"``).

    Mapping (workload kinds: model/workloads.py), ``L`` = round(live_per_cpu):

    * ``foreign_free > 0``: objects are freed by other CPUs than the one that allocated
      them (__slab_free on a slab that is not the freeing CPU's own), so the workload is
      ``producer_consumer`` (senders allocate, receivers free) with ``depth`` = ``2 * L``
      (senders are half the CPUs, so the machine holds ``L`` per CPU) and ``cross_node`` =
      ``foreign_free`` (the share of those frees crossing to another node class, where the
      topology has one);
    * ``foreign_free == 0``, or a topology of one CPU (no other CPU to free on): ``local``
      (every CPU frees its own objects) with ``live`` = ``L`` and ``burst`` =
      round(churn * L) (churn turns over that share of the live set in bursts; 0
      interleaves allocs and frees at random).
    """
    live = max(1, int(round(wl.live_per_cpu[k])))
    one_cpu = topology is not None and sum(topology.node_cpus) < 2
    if wl.foreign_free > 0 and not one_cpu:
        return {"kind": "producer_consumer", "depth": 2 * live, "cross_node": wl.foreign_free}
    return {"kind": "local", "live": live, "burst": int(round(wl.churn * live))}


class Schedule(NamedTuple):
    """How one point is simulated: the run length, the warm-up and the counted window (all
    in steps)."""

    ops_per_step: int
    warmup: int
    window: int


def steady_schedule(wl, run_max: int = RUN_MAX, window: int | None = None) -> Schedule:
    """The run length, warm-up and counted window that put a point in steady state, from its
    :class:`~slabtune.model.workloads.Workload` (one configuration's (R,) arrays).

    No kernel function: the workload's timing.  An allocating rep ``o`` (active, with an
    allocation cap ``live_target[o]``) allocates a share ``a_o`` of its ops once it holds
    its live set: 1 for a sender (``alloc_p`` 65536), 1/2 for bursts (``burst`` allocations,
    then as many frees) and ``alloc_p / 65536`` for random interleaving.  A rep ``j`` must
    do ``a_j + sum_o a_o share[o][j]`` runs a step to keep up (its allocations and the frees
    of objects pending to it, ``share`` the steps of ``free_cum``); the busiest sets the
    pace ``theta = min(1, 1 / max load)``.  Runs are ``b = clip(min cap // RUN_SHARE, 1,
    run_max)`` ops.  ``fill = ceil(max cap / b)`` steps fill every live set (the engines
    free nothing below a rep's hold floor, so until then a rep allocates on every op) and
    ``turn = max_o ceil(cap_o / (a_o theta b))`` steps let every allocating rep allocate
    its whole live set once more: the warm-up is ``fill + turn``.  Each half of the window
    is ``ceil(turn / 2)`` steps (at least :data:`HALF_MIN_OPS` ops), rounded up to whole burst
    cycles (``2 * ceil(burst / b)`` steps; runs never cross a burst phase) so that both
    halves average the same phases; ``window`` (the spec's ``[objectives] steps``) is a
    floor under the derived window.  These are floors: :meth:`DynamicsObjectives.settle`
    lengthens them where the baseline is still moving."""
    from slabtune.model.workloads import PROB_ONE

    alloc_p = np.asarray(wl.alloc_p, np.int64)
    cap = np.asarray(wl.live_target, np.int64)
    burst = np.asarray(wl.burst, np.int64)
    alloc = (np.asarray(wl.active) > 0) & (cap > 0) & (alloc_p > 0)
    if not alloc.any():
        raise ValueError("no CPU allocates")
    a = np.where(alloc_p >= PROB_ONE, 1.0, np.where(burst > 0, 0.5, alloc_p / PROB_ONE))
    a = np.where(alloc, a, 0.0)
    fc = np.asarray(wl.free_cum, np.int64)
    share = np.diff(np.concatenate([np.zeros((fc.shape[0], 1), np.int64), fc], axis=1),
                    axis=1).clip(0) / PROB_ONE
    load = a + (a[:, None] * share).sum(axis=0)
    theta = min(1.0, 1.0 / float(load.max()))
    b = int(np.clip(int(cap[alloc].min()) // RUN_SHARE, 1, run_max))
    fill = -(-int(cap[alloc].max()) // b)
    turn = int(np.ceil((cap[alloc] / (a[alloc] * theta * b)).max()))
    half = max(-(-turn // 2), -(-HALF_MIN_OPS // b))
    bursts = burst[alloc & (burst > 0)]
    if len(bursts):
        cycle = 2 * -(-int(bursts.max()) // b)
        half = -(-half // cycle) * cycle
    return Schedule(b, fill + turn, max(2 * half, window or 0))


class SteadyRuns:
    """Runs a batch of dynamics points in steady state: every point ``q`` of the ``Q``
    points of a policy has its :class:`Schedule`; a batch of ``B`` policies lays its
    configurations out policy-major (``b * Q + q``), each with its warm-up and window
    (:meth:`plan`, lengthened where a retry needs it).  The configurations run in one
    engine call that stops each at its own three checkpoints
    (:func:`slabtune.sweeps.window.run_window`), giving the counters of the window and of
    its two halves."""

    def __init__(self, schedules: list[Schedule], run):
        self.schedules = schedules
        self.run = run
        self.Q = len(schedules)

    def plan(self, B: int) -> tuple[np.ndarray, np.ndarray]:
        """(B * Q,) warm-up and window steps of a batch of ``B`` policies."""
        return (np.tile([s.warmup for s in self.schedules], B).astype(np.int64),
                np.tile([s.window for s in self.schedules], B).astype(np.int64))

    def __call__(self, keys, cfgs, warm, win, idx=None):
        """Counters (a :class:`~slabtune.sweeps.window.Windowed`) of the configurations
        ``idx`` (default all) of ``cfgs``, each over its window ``win[i]`` after
        ``warm[i]`` steps, in ``idx``'s order."""
        from slabtune.sweeps import window as sw

        idx = np.arange(len(warm)) if idx is None else np.asarray(idx)
        sub = jax.tree_util.tree_map(functools.partial(_take, idx=idx), cfgs)
        got = sw.run_window(keys[jnp.asarray(idx)], sub, np.asarray(warm)[idx],
                            np.asarray(win)[idx], run=self.run)
        return sw.Windowed(*(type(c)(**{f: np.asarray(getattr(c, f)) for f in c._fields})
                             for c in got))


def same_rows(values) -> np.ndarray:
    """(B,) for each policy of a batch (knob -> (B,) values) the first policy with the same
    knob values."""
    rows = np.stack([np.asarray(v) for _, v in sorted(values.items())], axis=1)
    _, first, inverse = np.unique(rows, axis=0, return_index=True, return_inverse=True)
    return first[inverse.reshape(-1)]


def _take_rows(windowed, rows):
    """A :class:`~slabtune.sweeps.window.Windowed` of the given rows of each counter."""
    return type(windowed)(*(type(c)(**{f: np.array(np.asarray(getattr(c, f))[rows])
                                       for f in c._fields}) for c in windowed))


def _scatter(dst, idx, src) -> None:
    """Put the counters of ``src`` (Windowed) into rows ``idx`` of ``dst``, in place."""
    for d, s in zip(dst, src):
        for f in d._fields:
            getattr(d, f)[idx] = getattr(s, f)


def _take(x, idx):
    return np.asarray(x)[idx]


def _point_live(counters, cfg):
    """(P,) live objects per CPU each point held over the window (objects_inuse, rep
    weighted)."""
    w = np.asarray(cfg.rep_weight, np.float64)
    inuse = np.asarray(counters.objects_inuse, np.float64)
    return (w * inuse).sum(-1) / np.maximum(w.sum(-1), 1e-30)


class DynamicsObjectives:
    """The ``dynamics`` objective set: per-topology memory and time of a batch of policies
    measured by the dynamics model (model/dynamics.py) in steady state, at the fleet's
    declared live sets.

    Points: every (topology ``t``, workload-cache pair ``p``) the fleet uses (a workload's
    cache with live objects), one :class:`~slabtune.model.dynamics.SimConfig` each, built
    with :func:`~slabtune.model.dynamics.config_from` from the baseline structure and the
    workload of :func:`dynamics_workload`; a policy replaces the fields config_from takes
    from the structure and its overrides (order, objs_per_slab, min_partial,
    cpu_partial_slabs, sheaf_capacity, barn limits) with its own, by config_from's rules.
    Each point runs with the :class:`Schedule` of :func:`steady_schedule` and is counted
    over its window only, as the lab counts the kernel (:class:`SteadyRuns`; seeded per
    point, seed + t * P + p, the same random stream for every policy); ``metrics.compute``
    (vmapped) turns the window's counters into memory and time.

    Aggregation, like the structural set: memory per workload is the overhead bytes of its
    caches (memory_bytes - live_bytes) over their live bytes, workloads weighted; time per
    workload is ns per alloc-or-free op (metrics ns_per_op / 2: it is per alloc+free pair)
    weighted by the caches' op shares, workloads weighted.  Both (B, T).

    Steady state is checked on every point of every batch (:meth:`check`): a (policy,
    topology) whose window halves disagree, or whose live set is not the declared one, gets
    NaN objectives (the trial fails) and a one-line reason in :attr:`notes`.
    """

    run_max = RUN_MAX

    def __init__(self, fleet: Fleet, prof: policy.ProfileArrays, fa: FleetArrays,
                 cost: cost_model.CostParams, pcp_max: int, objective: ObjectiveSpec):
        from slabtune.model import dynamics
        from slabtune.sweeps import dynsim

        self.fleet, self.prof, self.fa, self.cost, self.pcp_max = fleet, prof, fa, cost, pcp_max
        seed = objective.seed if objective.seed is not None else DYN_SEED
        self._pairs_and_weights(fleet, fa)
        T, Pn = len(fleet.topologies), len(self.pairs)
        base = baseline_values(fleet.profile)
        st, _ = _policy_structure({k: np.array([v], np.int32) for k, v in base.items()},
                                  prof, fa)
        tk_shape = (T, len(fleet.caches))
        st = policy.Structure(*(np.broadcast_to(np.asarray(x)[0], tk_shape) for x in st))
        cfgs = []
        for t, ft in enumerate(fleet.topologies):
            for w, k in self.pairs:
                s_tk = policy.Structure(*(x[t, k] for x in st))
                try:
                    cfgs.append(dynamics.config_from(
                        s_tk, fleet.profile, ft.topology,
                        dynamics_workload(fleet.workloads[w], k, ft.topology)))
                except ValueError as err:
                    raise SlabtuneError(f"fleet.topology {ft.name}: dynamics workload of "
                                        f"{fleet.workloads[w].name}: {err}") from None
        self._run = dynsim.run_batch_at
        self._schedule(cfgs, objective)
        cfgs = [c._replace(ops_per_step=np.int32(s.ops_per_step))
                for c, s in zip(cfgs, self.steady.schedules)]
        self.template = dynamics.stack_configs(cfgs)                      # (T * P,)
        self.seeds = (seed + np.arange(T * Pn)).astype(np.uint32)
        self.has_cpu_partial = fleet.profile.has_cpu_partial
        self.has_cpu_slab = fleet.profile.has_cpu_slab
        tk = [(t, k) for t in range(T) for _, k in self.pairs]
        self._t_idx = np.array([t for t, _ in tk])
        self._k_idx = np.array([k for _, k in tk])
        self._structure = _policy_structure
        self.settle(self.configs({k: np.array([v], np.int32) for k, v in base.items()}))

    def _pairs_and_weights(self, fleet: Fleet, fa: FleetArrays) -> None:
        """The simulated (workload, cache) pairs, their declared live sets, object sizes and
        op shares, and the jitted metrics; shared with SLAB's set."""
        #: (workload index, cache index) pairs simulated, per topology
        self.pairs = [(w, k) for w, wl in enumerate(fleet.workloads)
                      for k in range(len(fleet.caches)) if wl.live_per_cpu[k] > 0]
        T, Pn = len(fleet.topologies), len(self.pairs)
        osz = np.array([fleet.caches[k].object_size for _, k in self.pairs], np.float32)
        self.object_size = np.tile(osz, T)
        self.declared = np.tile(np.array([max(1, int(round(fleet.workloads[w].live_per_cpu[k])))
                                          for w, k in self.pairs], np.float64), T)
        ops = np.asarray(fa.ops)
        # (P, W) one-hot of each pair's workload and (P,) its op share within the workload
        self.pair_w = np.zeros((Pn, len(fleet.workloads)), np.float32)
        self.pair_ops = np.zeros(Pn, np.float32)
        for i, (w, k) in enumerate(self.pairs):
            self.pair_w[i, w] = 1.0
            self.pair_ops[i] = ops[w, k]
        self._metrics = functools.partial(
            _aggregate, cost=self.cost, pcp_max=self.pcp_max, T=T,
            pair_w=jnp.asarray(self.pair_w), pair_ops=jnp.asarray(self.pair_ops),
            w_weight=fa.w_weight)
        self.notes: list[str] = []

    def _schedule(self, cfgs, objective: ObjectiveSpec) -> None:
        """Every point's :class:`Schedule` (:func:`steady_schedule`)."""
        T, Pn = len(self.fleet.topologies), len(self.pairs)
        scheds = []
        for i, c in enumerate(cfgs):
            try:
                scheds.append(steady_schedule(c.workload, self.run_max, objective.steps))
            except ValueError as err:
                t, p = divmod(i, Pn)
                raise SlabtuneError(
                    f"fleet.topology {self.fleet.topologies[t].name}: dynamics workload of "
                    f"{self.fleet.workloads[self.pairs[p][0]].name}: {err}") from None
        assert len(scheds) == T * Pn
        self.steady = SteadyRuns(scheds, self._run)

    def settle(self, base_cfg) -> None:
        """Lengthen the schedules until the baseline policy (``base_cfg``, one policy's
        points) is in steady state within half of :data:`STEADY_TOL` (a margin for the
        trials, which are checked against the whole): each (topology, workload) that
        :meth:`check` finds moving gets the warm-up and the window of its points doubled,
        at most :data:`SETTLE_DOUBLINGS` times, and every later batch starts from those.
        The derived schedule is a floor: slow mechanisms (a memoryless node's lists filling
        with slabs its CPUs never take back) drift for many turnovers of the live set."""
        self.measure(base_cfg, 1, tol=STEADY_TOL / 2, retries=SETTLE_DOUBLINGS)
        warm, win = self.plan
        self.steady = SteadyRuns([s._replace(warmup=int(w), window=int(n)) for s, w, n in
                                  zip(self.steady.schedules, warm, win)], self._run)

    def configs(self, values) -> dynamics.SimConfig:
        """The stacked configs of a batch, laid out (b, t, p) policy-major: the template
        of every point with the policy's structural fields (config_from's rules: no
        per-CPU partial slabs on kernels without them; a per-CPU slab without a sheaf, and
        beside one where the profile keeps it, v6.18)."""
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
                            cpu_slab=((cap == 0) | self.has_cpu_slab).astype(np.int32),
                            barn_max_full=rep("barn_max_full"),
                            barn_max_empty=rep("barn_max_empty"))

    def __call__(self, values) -> PerTopology:
        cfg = self.configs(values)
        return self.measure(cfg, len(np.asarray(values["barn_max_full"])),
                            same=same_rows(values))

    #: A function of (counters, configs) returning the SLUB counters and configs that
    #: ``metrics.compute`` prices (SLAB's slub_view); None for SLUB.
    view = None

    def measure(self, cfg, B: int, tol: float = STEADY_TOL, retries: int | None = None,
                same=None) -> PerTopology:
        """Run ``cfg`` (B policies' points, policy-major) in steady state and return the
        window's (B, T) objectives, NaN where a (policy, topology) is not in steady state
        (:meth:`check`).  The points of a (policy, topology, workload) found moving run
        again with their warm-up and window doubled, up to ``retries`` times (default
        :data:`RETRY_DOUBLINGS`), priced through :attr:`view`.  ``same`` (B,): for each
        policy the first one of the batch with the same knobs (:func:`same_rows`; a
        padded batch repeats its first policy), whose runs it shares.  The final warm-ups
        and windows are left in :attr:`plan`."""
        retries = RETRY_DOUBLINGS if retries is None else retries
        keys = jax.vmap(jax.random.key)(np.tile(self.seeds, B))
        warm, win = self.steady.plan(B)
        Q = self.steady.Q
        rep = np.arange(B) if same is None else np.asarray(same)
        src = (rep[:, None] * Q + np.arange(Q)).reshape(-1)       # the config each copies
        runs = np.flatnonzero(src == np.arange(B * Q))
        got = _take_rows(self.steady(keys, cfg, warm, win, runs), np.searchsorted(runs, src))
        osz = np.tile(self.object_size, B)
        T, Pn = len(self.fleet.topologies), len(self.pairs)
        pair_wl = np.array([w for w, _ in self.pairs])
        for attempt in range(retries + 1):
            steps = (win.astype(np.float32), (win // 2).astype(np.float32),
                     (win - win // 2).astype(np.float32))
            outs, live = [], None
            for i, (c, n) in enumerate(zip(got, steps)):
                c, v = self.view(c, cfg) if self.view is not None else (c, cfg)
                outs.append(self._metrics(c, v, osz, n))
                if i == 0:
                    live = _point_live(c, v)
            res = self.check(*outs, live, B, tol, warm)
            bad = self.unsteady[:, :, pair_wl].reshape(-1)                 # (B * T * P,)
            if attempt == retries or not bad.any():
                break
            idx = np.flatnonzero(bad & (src == np.arange(B * Q)))
            warm[idx] *= 2
            win[idx] *= 2
            warm, win = warm[src], win[src]
            members = np.flatnonzero(np.isin(src, idx))
            _scatter(got, members, _take_rows(self.steady(keys, cfg, warm, win, idx),
                                              np.searchsorted(idx, src[members])))
        assert len(warm) == B * T * Pn
        self.plan = (warm, win)
        return res

    def check(self, whole, first, second, live, B: int, tol: float = STEADY_TOL,
              warm=None) -> PerTopology:
        """The window's objectives with NaN where a (policy, topology) is not in steady
        state, and :attr:`notes` (one line per policy, empty where all are): a workload
        whose window halves differ by more than :data:`STEADY_TOL` of the window in memory
        held or in ns per op, or a point whose live objects per CPU are more than
        :data:`OCCUPANCY_TOL` off the declared ones."""
        T, Pn = len(self.fleet.topologies), len(self.pairs)
        mem = np.asarray(whole.memory, np.float64).copy()
        tim = np.asarray(whole.time, np.float64).copy()
        parts = [tuple(np.asarray(x, np.float64) for x in (o.held, o.t_w))
                 for o in (whole, first, second)]
        (held, t_w), (h1, t1), (h2, t2) = parts
        d_mem = np.abs(h1 - h2) / np.maximum(held, 1e-30)                  # (B, T, W)
        d_time = np.abs(t1 - t2) / np.maximum(t_w, 1e-30)
        used = self.pair_w.sum(0) > 0                                      # (W,)
        moving = ((d_mem > tol) | (d_time > tol)) & used
        occ = np.asarray(live, np.float64).reshape(B, T, Pn) / self.declared.reshape(T, Pn)
        off = np.abs(occ - 1.0) > OCCUPANCY_TOL
        #: (B, T, W) the (policy, topology, workload) not in steady state
        self.unsteady = moving | (off.astype(np.float32) @ self.pair_w > 0)
        self.notes = [""] * B
        for b in range(B):
            notes = []
            for t in range(T):
                name = self.fleet.topologies[t].name
                for p in np.flatnonzero(off[b, t]):
                    w, k = self.pairs[p]
                    notes.append(
                        f"fleet.topology {name}, workload {self.fleet.workloads[w].name}, "
                        f"cache {self.fleet.caches[k].name}: {occ[b, t, p] * 100:.0f}% of "
                        f"the declared live set held over the counted window "
                        f"({live[b * T * Pn + t * Pn + p]:.0f} live objects per CPU against "
                        f"{self.declared[t * Pn + p]:.0f})")
                for w in np.flatnonzero(moving[b, t]):
                    ws = [int(warm[(b * T + t) * Pn + p]) if warm is not None
                          else self.steady.schedules[t * Pn + p].warmup
                          for p in range(Pn) if self.pairs[p][0] == w]
                    notes.append(
                        f"fleet.topology {name}, workload {self.fleet.workloads[w].name}: "
                        f"not in steady state after {max(ws)} warm-up "
                        f"steps: the window's halves differ by "
                        f"{d_mem[b, t, w] * 100:.1f}% in memory held "
                        f"({h1[b, t, w] / 1024:.0f} against {h2[b, t, w] / 1024:.0f} KiB) "
                        f"and {d_time[b, t, w] * 100:.1f}% in time per op "
                        f"({t1[b, t, w]:.1f} against {t2[b, t, w]:.1f} ns); tolerance "
                        f"{tol * 100:.0f}%")
                if off[b, t].any() or moving[b, t].any():
                    mem[b, t] = tim[b, t] = np.nan
            self.notes[b] = "; ".join(notes)
        return PerTopology(memory=mem, time=tim)


class _Aggregate(NamedTuple):
    """Window metrics of a batch: (B, T) objectives, and per (B, T, W) the memory held by
    each workload's caches (bytes, live included) and its ns per op."""

    memory: jnp.ndarray
    time: jnp.ndarray
    held: jnp.ndarray
    t_w: jnp.ndarray


def _dynamics_aggregate(counters, cfg, object_size, steps, *, cost, pcp_max, T, pair_w,
                        pair_ops, w_weight) -> _Aggregate:
    """Metrics of every (policy, topology, pair) config over ``steps`` (per config: the
    counted window's steps), aggregated to (B, T) (see :class:`DynamicsObjectives`)."""
    from slabtune.model import metrics

    met = jax.vmap(lambda cnt, c, osz, n: metrics.compute(cnt, c, cost, pcp_max=pcp_max,
                                                          object_size=osz, steps=n))(
        counters, cfg, object_size, steps)
    Pn = pair_w.shape[0]
    shape = (-1, T, Pn)
    total = jnp.reshape(met.memory_bytes, shape)
    live = jnp.reshape(met.live_bytes, shape)
    ns = jnp.reshape(met.ns_per_op, shape) / 2.0
    held = total @ pair_w                                             # (B, T, W)
    mem_w = ((total - live) @ pair_w) / jnp.maximum(live @ pair_w, 1.0)
    t_w = (ns * pair_ops) @ pair_w
    return _Aggregate(memory=(mem_w * w_weight).sum(-1), time=(t_w * w_weight).sum(-1),
                      held=held, t_w=t_w)


_aggregate = jax.jit(_dynamics_aggregate, static_argnames=("pcp_max", "T"))


def _content_key(tree):
    """A hashable key of a pytree's structure and leaf values (arrays by dtype, shape and
    bytes)."""
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    return treedef, tuple((np.asarray(x).dtype.str, np.shape(x), np.asarray(x).tobytes())
                          for x in leaves)


#: :func:`shared_jit`'s jitted functions, by function and bound arguments' values.
_SHARED_JITS: dict = {}


def shared_jit(fn, **bound):
    """``jax.jit(functools.partial(fn, **bound))``, one per distinct ``fn`` and bound
    values in the process: evaluators of the same fleet share one compiled program per
    batch shape instead of each compiling and keeping its own (see
    :data:`_policy_structure`).  For functions that read some bound arrays on the host
    (the structural sets: the fleet's merge roots, its memoryless topologies)."""
    key = (fn, _content_key(bound))
    if key not in _SHARED_JITS:
        _SHARED_JITS[key] = jax.jit(functools.partial(fn, **bound))
    return _SHARED_JITS[key]


ObjectiveSet = Callable[..., PerTopology]
#: Objective sets by the name a spec's ``[objectives] set`` gives.  A set that is a class
#: (``dynamics``) is built once per fleet and called with the batch's knob values.
OBJECTIVE_SETS: dict[str, ObjectiveSet] = {"structural": structural_objectives,
                                           "dynamics": DynamicsObjectives}


@dataclasses.dataclass(frozen=True)
class ObjectiveSpec:
    name: str = "structural"
    #: Largest allowed per-topology regression against the baseline, as a fraction
    #: (0.05 = 5%); None for no constraint.
    max_regression: float | None = None
    #: ``dynamics`` set only: the counted window's steps at least (None: each point's own,
    #: :func:`steady_schedule`) and the base seed (None: :data:`DYN_SEED`).
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
    if not isinstance(name, str) or name not in OBJECTIVE_SETS:
        raise SlabtuneError(f"objectives.set: {name!r} is not one of {', '.join(OBJECTIVE_SETS)}")
    mr = table.get("max_regression")
    if mr is not None:
        mr = check_number("objectives.max_regression", mr, 0.0, 10.0)
    steps = table.get("steps")
    seed = table.get("seed")
    if name != "dynamics" and (steps is not None or seed is not None):
        raise SlabtuneError(f"objectives.{'steps' if steps is not None else 'seed'}: only "
                            f"the dynamics set simulates")
    if steps is not None:
        steps = check_int("objectives.steps", steps, 2, 1 << 20)
    if seed is not None:
        seed = check_int("objectives.seed", seed, 0, (1 << 31) - 1)
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
    #: (B,) object array: per policy, why its objectives are NaN (``dynamics`` set: a
    #: point not in steady state, :meth:`DynamicsObjectives.check`), "" where they are not
    #: or the set gives no reason; None where not computed.
    notes: np.ndarray | None = None


#: Smallest padded batch: the baseline, one-at-a-time trials and batches up to this size
#: share one compiled shape.
MIN_BUCKET = 64


def _bucket(n: int) -> int:
    """Pad batch sizes to powers of two (at least MIN_BUCKET) so a study compiles few shapes;
    a single policy is evaluated alone (one-at-a-time studies pay for one policy, not 64)."""
    if n <= 1:
        return 1
    return max(MIN_BUCKET, 1 << (n - 1).bit_length())


class FleetEvaluator:
    """Evaluates a batch of policies over a fleet in one jitted call."""

    def __init__(self, fleet: Fleet, objective: ObjectiveSpec = ObjectiveSpec(),
                 cost: cost_model.CostParams | None = None):
        self.fleet = fleet
        self.objective = objective
        self.cost = cost if cost is not None else simconfig.load_cost()[0]
        self.fa = fleet_arrays(fleet)
        self.knobs = tuple(knobs_for(fleet.profile))
        self.baseline_values = baseline_values(fleet.profile)
        pcp_max = cost_model.pcp_max_order(fleet.profile.version)
        self._traceable = False
        if profiles.is_slab(fleet.profile):
            from slabtune.tuner import slab_objectives

            self.prof = None
            fn = slab_objectives.SLAB_OBJECTIVE_SETS[objective.name]
            self._fn = fn(fleet, self.fa, self.cost, pcp_max, objective)
        elif isinstance(fn := OBJECTIVE_SETS[objective.name], type):
            self.prof = policy.profile_arrays(fleet.profile)
            self._fn = fn(fleet, self.prof, self.fa, self.cost, pcp_max, objective)
        else:
            self.prof = policy.profile_arrays(fleet.profile)
            self._traceable = True
            self._fn = shared_jit(fn, prof=self.prof, fa=self.fa, cost=self.cost,
                                  pcp_max=pcp_max)
        self._topo_w = np.array([t.weight for t in fleet.topologies], np.float64)
        self._topo_w = self._topo_w / self._topo_w.sum()
        # the baseline rides in the batched shape, so a batched study compiles one shape
        full = self.evaluate([{}] * MIN_BUCKET)
        self.baseline = Evaluation(*(x[:1] for x in full[:4]))
        if full.notes is not None and full.notes[0]:
            raise SlabtuneError(f"objectives: the baseline policy: {full.notes[0]}")

    def evaluate(self, params_list) -> Evaluation:
        """Objectives of each policy in ``params_list`` (knob -> value mappings; knobs left
        out keep their baseline value)."""
        n = len(params_list)
        values = {}
        for name in self.knobs:
            base = self.baseline_values[name]
            col = np.full(n, base, np.int32)
            for i, p in enumerate(params_list):
                if name in p:
                    col[i] = int(p[name])
            values[name] = col
        return self.evaluate_values(values)

    def evaluate_values(self, values: Mapping[str, np.ndarray]) -> Evaluation:
        """Objectives of the policies whose knobs are the (n,) arrays of ``values`` (every
        knob, effective values), padded to the batch bucket as :meth:`evaluate` pads."""
        n = len(np.asarray(values[self.knobs[0]]))
        size = _bucket(n)
        padded = {}
        for name in self.knobs:
            col = np.full(size, self.baseline_values[name], np.int32)
            col[:n] = np.asarray(values[name], np.int32)
            padded[name] = col
        out = self._fn(padded)
        mem = np.asarray(out.memory, np.float64)[:n]
        tim = np.asarray(out.time, np.float64)[:n]
        notes = np.full(n, "", object)
        if isinstance(getattr(self._fn, "notes", None), list):
            notes[:] = self._fn.notes[:n]
        return Evaluation(memory=mem @ self._topo_w, time=tim @ self._topo_w,
                          memory_topo=mem, time_topo=tim, notes=notes)

    @property
    def traceable(self) -> Callable[[Mapping[str, jnp.ndarray]], PerTopology] | None:
        """The objective set as a function that can run inside another jitted function
        (knob values -> per-topology objectives), or None when the set runs host code
        between its compiled parts (``dynamics``)."""
        return self._fn if self._traceable else None

    def fleet_aggregate(self, out: PerTopology):
        """(memory, time, regression excess), each (B,), of per-topology objectives, in
        jax.numpy: the fleet aggregates of :meth:`evaluate` and :meth:`regression_excess`
        (0 where unconstrained) for code that stays inside a jitted loop."""
        w = jnp.asarray(self._topo_w, _F32)
        mem = jnp.asarray(out.memory, _F32)
        tim = jnp.asarray(out.time, _F32)
        if self.objective.max_regression is None:
            excess = jnp.zeros(mem.shape[0], _F32)
        else:
            rm = mem / jnp.asarray(self.baseline.memory_topo, _F32) - 1.0
            rt = tim / jnp.asarray(self.baseline.time_topo, _F32) - 1.0
            excess = jnp.maximum(rm, rt).max(axis=1) - self.objective.max_regression
        return mem @ w, tim @ w, excess

    def regression_excess(self, ev: Evaluation) -> np.ndarray:
        """Per policy: the worst per-topology regression against the baseline on either
        objective, minus the allowed fraction (<= 0 is feasible; 0 where unconstrained;
        inf where an objective is NaN: a policy not evaluated, such as one not in steady
        state, is not feasible, and Optuna takes no NaN constraint)."""
        if self.objective.max_regression is None:
            return np.zeros(len(ev.memory))
        rm = ev.memory_topo / self.baseline.memory_topo - 1.0
        rt = ev.time_topo / self.baseline.time_topo - 1.0
        excess = np.maximum(rm, rt).max(axis=1) - self.objective.max_regression
        return np.where(np.isnan(excess), np.inf, excess)


def space_check(space: SearchSpace, fleet: Fleet) -> None:
    """A space and a fleet must target the same profile."""
    if space.profile.name != fleet.profile.name:
        raise SlabtuneError(f"search: profile {space.profile.name} differs from fleet.profile "
                            f"{fleet.profile.name}")


def order_grid(profile: profiles.KernelProfile, params: Mapping[str, int], cpus: list[int],
               sizes: list[int]) -> dict[str, list[int]]:
    """Slab order and objects per slab of a policy on single-node machines of each CPU count
    (possible = present = online) for caches of each stride: columns cpus, size, order,
    objs_per_slab, one row per cell (for the order heatmap).  A SLAB profile's are
    calculate_slab_order()'s under the policy's ``slab_max_order`` (the default cap when not
    given), with an anonymous cache's creation facts."""
    from slabtune.model.caches import anonymous_cache

    if profiles.is_slab(profile):
        from slabtune.model import slab

        mo = int(params.get("slab_max_order", slab.default_max_order()))
        out = {"cpus": [], "size": [], "order": [], "objs_per_slab": []}
        for c in cpus:
            for s in sizes:
                st = slab.structure(s, c, (c,), profile, max_order=mo)
                for k, v in zip(out, (c, s, st.order, st.objs_per_slab)):
                    out[k].append(int(v))
        return out

    topos = tuple(FleetTopology(str(c), Topology.uniform(c), 1.0) for c in cpus)
    caches = tuple(anonymous_cache(s) for s in sizes)
    wl = FleetWorkload("grid", 1.0, tuple(1.0 for _ in sizes), tuple(1.0 for _ in sizes), 0.5, 0.1)
    fa = fleet_arrays(Fleet(profile, topos, caches, (wl,)))
    vals = baseline_values(profile)
    vals.update({k: int(v) for k, v in params.items()})
    st, _ = policy_structure({k: np.array([v], np.int32) for k, v in vals.items()},
                             policy.profile_arrays(profile), fa)
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
                             policy.profile_arrays(spec_fleet.profile), fa)
    out = {}
    for j, c in enumerate(spec_fleet.caches):
        out[c.name] = {f: int(np.asarray(getattr(st, f))[0, 0, j])
                       for f in ("order", "objs_per_slab", "min_partial", "cpu_partial",
                                 "sheaf_capacity")}
    return out

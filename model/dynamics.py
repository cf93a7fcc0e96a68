"""SLUB dynamics: per-CPU alloc/free streams through slabs, partial lists and sheaves.

The simulation is a pure ``step(draws, state, cfg)`` over a :class:`State` pytree, run with
``lax.scan`` (:func:`simulate`) and vmapped over configurations (:func:`simulate_batch`).
Everything is int32 masked array code: no Python control flow on traced values, static
loops over the ``R`` representative CPUs ("reps") and ``N`` node classes only.

What it models and how it maps to mm/slub.c is written up in docs/MODEL.md; the short form:

* Each rep owns a per-CPU slab (``cs_free`` objects on the lockless freelist, ``cs_inuse``
  allocated, ``cs_rfree`` freed into it by other CPUs), a per-CPU partial list (v3.2..v6.18)
  and a main and spare sheaf (v6.18 opt-in, v7.0 on).
* Each node class keeps a partial list (slabs by fill level, ``ns*``/``nu*``, and a head
  slab ``hs``/``hu``), a count of full slabs and a barn (full and empty sheaves).
* Objects in flight are counted by (allocating rep, freeing rep) in ``pend``; ``pend_cs``
  counts those of them that sit in the allocating rep's current CPU slab, so a free goes
  back to the slab its object came from: the allocating CPU's slab while it is still that
  CPU's slab (a fast free for the CPU itself, a free into a frozen slab for another CPU),
  else one of the slabs it used before.  Each (allocating, freeing) pair is a FIFO queue
  (:func:`fifo_split`): the objects of the current CPU slab, the youngest, go last.
* Runs: in a step each rep does a run of up to ``SimConfig.ops_per_step`` (b) operations of
  one kind, computed in closed form (piecewise-linear integer transitions); random picks
  within a run are counts by systematic sampling, which for b = 1 is the single pick, so
  b = 1 is the one-op model bit for bit (docs/MODEL.md, "Runs").

Partial lists are histograms of slabs by fill level (``LEVELS`` levels of allocated
objects, :func:`level_bounds`; per level its slabs and their objects, spread evenly over
them), plus the node's head slab a bulk take left partly used: frees land on slabs in
proportion to their objects, so a slab empties only when its own objects are gone, and
takes find the emptiest slabs first (docs/MODEL.md, "Fill levels").  The same rules,
written as plain branches over Python ints, are :mod:`slabtune.model.reference_sim`; with
the same random bits both give identical counters.
"""

from __future__ import annotations

import functools
import os
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from slabtune.errors import SlabtuneError
from slabtune.model import profiles, runlen, workloads
from slabtune.model.constants import MAX_OPS_PER_STEP
from slabtune.model.intmath import ceil_div, floor_div
from slabtune.model.topology import Topology
from slabtune.model.workloads import PROB_ONE

R = workloads.R
N = workloads.N
#: Random 32-bit words drawn per rep per step: op choice, freer/origin choice, slab choice.
K = 3
_I32 = jnp.int32
_U32 = jnp.uint32

BARNS_NONE, BARNS_MEMORY, BARNS_ALL = 0, 1, 2
#: Fill levels of a partial list: level 0 empty, then ranges of allocated objects (2: empty
#: and partial; 3 and 4 work and cost speed, see docs/MODEL.md "Fill levels").
LEVELS = 2
#: State fields of the fill levels: per-CPU partial slabs (per rep) and node partial slabs
#: (per node class) by level, and their objects (level 0 holds none).
PCS = tuple(f"pc{k}" for k in range(LEVELS))
PCU = (None,) + tuple(f"pcu{k}" for k in range(1, LEVELS))
#: The same for a rep's per-CPU partial slabs of the other memory node class (item 5b:
#: __slab_free() puts a full slab made partial on the freeing CPU's list, whatever its node).
RPS = tuple(f"rp{k}" for k in range(LEVELS))
RPU = (None,) + tuple(f"rpu{k}" for k in range(1, LEVELS))
NS = tuple(f"ns{k}" for k in range(LEVELS))
NU = (None,) + tuple(f"nu{k}" for k in range(1, LEVELS))
#: Gauge sums are kept as (sum >> GAUGE_SHIFT, sum mod 2**GAUGE_SHIFT) int32 pairs.
GAUGE_SHIFT = 20


# --------------------------------------------------------------------------- public types


class SimConfig(NamedTuple):
    """Everything fixed for one run (arrays; vmappable).

    Scalars: ``objs_per_slab``, ``order``, ``min_partial``, ``cpu_partial_slabs`` (0: no
    per-CPU partial list), ``sheaf_capacity`` (0: no sheaves), ``cpu_slab`` (1: the cache
    has a per-CPU slab: every cache without sheaves, and v6.18's opt-in caches beside
    their sheaves, which refill and flush through it), ``barns`` (0 none, 1 on nodes
    with memory, 2 on every node), ``remote_free_bypasses_sheaf``,
    ``memoryless_cpus_use_sheaves``, ``memoryless_fallback``, ``barn_max_full``,
    ``barn_max_empty``.  Per rep (R,): ``rep_weight`` (float), ``rep_node``,
    ``rep_mem_node``, ``rep_memoryless``; per node class (N,): ``node_has_memory``,
    ``node_weight`` (float); the :class:`~slabtune.model.workloads.Workload`; and
    ``ops_per_step``, the run length b (ops of one kind per rep per step, 1..1024).
    """

    objs_per_slab: Any
    order: Any
    min_partial: Any
    cpu_partial_slabs: Any
    sheaf_capacity: Any
    cpu_slab: Any
    barns: Any
    remote_free_bypasses_sheaf: Any
    memoryless_cpus_use_sheaves: Any
    memoryless_fallback: Any
    barn_max_full: Any
    barn_max_empty: Any
    rep_weight: Any
    rep_node: Any
    rep_mem_node: Any
    rep_memoryless: Any
    node_has_memory: Any
    node_weight: Any
    workload: workloads.Workload
    ops_per_step: Any = np.int32(1)
    #: 1 where the profile has no CPU slab (v7.0 on): an allocation the sheaves cannot
    #: serve without a barn goes to ___slab_alloc(), one object per call.
    slab_alloc_single: Any = np.int32(0)
    #: 1 where per-CPU partial slabs are not frozen (v6.8 on): a free that empties one
    #: takes its node's list_lock.
    pc_empty_locks: Any = np.int32(0)
    #: Pricing of SLAB counters seen through slab_dynamics.slub_view(); SLUB's own runs
    #: keep the defaults.  Cross-node lines a remote free moves outside any lock: 1 for
    #: SLUB (__slab_free() writes the foreign slab's freelist and counters), 0 for SLAB
    #: (cache_free_alien() writes only the local alien array; the cross-node lines move
    #: when it is drained, under the remote list_lock).
    remote_free_lines: Any = np.float32(1.0)
    #: 0: the barn lock classes are SLUB's barns; above 0: they are SLAB's alien locks, a
    #: section being one pointer push on an alien array that touches this many lines on
    #: average (slab.alien_section_lines()).
    alien_lock_lines: Any = np.float32(0.0)
    #: SLAB's view only, per rep (R,) or 0: drains of an alien array done under its lock
    #: (a full array's, reap_alien()'s) per alien lock acquisition (metrics.lock_sections).
    alien_drains: Any = np.float32(0.0)
    #: SLAB's view only, 1: the objects a refill, flush or drain moves are moved under
    #: the list_lock (SLUB moves a sheaf's outside it).
    objects_under_list_lock: Any = np.float32(0.0)
    #: __slab_free() discards a slab it has just emptied when its node holds at least
    #: ``min_partial + free_discard_offset`` partial slabs: 0 from v4 (``>=``), 1 in v3.1
    #: (``>``), profiles.DISCARD_EVERY_EMPTIED before v3.1, which discarded every slab it
    #: emptied (profiles.KernelProfile.slab_free_discard_offset).
    free_discard_offset: Any = np.int32(0)
    #: get_any_partial()'s remote_node_defrag_ratio (profiles.REMOTE_NODE_DEFRAG_RATIO):
    #: a CPU of a memoryless node searches its memory node's partial list only in runs
    #: whose draw passes it (:func:`node_list_floor`).
    remote_node_defrag_ratio: Any = np.int32(profiles.REMOTE_NODE_DEFRAG_RATIO)
    #: Per rep (R,): which node of its memory class a rep's slabs come from
    #: (workloads.rep_homes; 0 everywhere where each class is one node).  Objects of two
    #: reps of one class with different homes are remote to each other (:func:`remote_to`).
    rep_mem_home: Any = np.zeros(workloads.R, np.int32)
    #: (R, R) and scalar: :func:`slabtune.model.workloads.lag_weights` of the workload's
    #: ``free_cum``, how far each freer is behind each sender (zeros: every per-CPU
    #: partial list drains one slab at a time, :func:`pc_window`).
    lag_mul: Any = np.zeros((workloads.R, workloads.R), np.int32)
    lag_freers: Any = np.int32(0)
    #: Per node class (N,): :func:`slabtune.model.workloads.list_nodes`, the real nodes'
    #: partial lists a class's list sums, which scales its min_partial tests
    #: (:func:`node_min_partial`).
    list_nodes: Any = np.ones(workloads.N, np.int32)
    #: 1 where get_partial_node() stops by free objects (v3.2 to v5.15: ``available >
    #: slub_cpu_partial(s) / 2``, :func:`takes_by_objects`), 0 where by slabs (v5.16 on).
    #: ``cpu_partial_slabs`` is then slub_cpu_partial(s) + 1 (policy.cpu_partial_slabs).
    take_objects: Any = np.int32(0)


#: Event counters, one int32 per rep (what that rep's CPU did).
COUNTER_FIELDS = (
    "ops", "allocs", "frees", "alloc_fast", "alloc_slow", "free_fast", "free_slow",
    "remote_free", "list_lock", "list_lock_remote", "slab_alloc", "slab_free",
    "sheaf_alloc_hit", "sheaf_free_hit", "sheaf_refill", "sheaf_flush", "barn_get",
    "barn_put", "barn_get_fail", "barn_put_fail", "cpu_partial_drain",
    "sheaf_alloc_replace", "sheaf_free_replace",
)
#: Gauges averaged over the steps: (name, axis) with axis "rep" (R,) or "node" (N,).
GAUGE_FIELDS = (
    ("slabs_total", "node"), ("objects_inuse", "rep"), ("empty_slabs_kept", "node"),
    ("cpu_partial_slabs_held", "rep"), ("sheaf_objects_held", "rep"),
    ("barn_objects_held", "node"),
)


class Counters(NamedTuple):
    """What a run did.  Event counts are (R,) int32 per rep (multiply by ``rep_weight`` for
    the machine); ``list_lock_node`` (N,) counts list_lock acquisitions per node class;
    gauges are float32 time averages (per node class or per rep, see GAUGE_FIELDS);
    ``outstanding`` (R,) is the objects each rep had allocated and not freed at the end."""

    ops: Any
    allocs: Any
    frees: Any
    alloc_fast: Any
    alloc_slow: Any
    free_fast: Any
    free_slow: Any
    remote_free: Any
    list_lock: Any
    list_lock_remote: Any
    slab_alloc: Any
    slab_free: Any
    sheaf_alloc_hit: Any
    sheaf_free_hit: Any
    sheaf_refill: Any
    sheaf_flush: Any
    barn_get: Any
    barn_put: Any
    barn_get_fail: Any
    barn_put_fail: Any
    cpu_partial_drain: Any
    sheaf_alloc_replace: Any
    sheaf_free_replace: Any
    list_lock_node: Any
    slabs_total: Any
    objects_inuse: Any
    empty_slabs_kept: Any
    cpu_partial_slabs_held: Any
    sheaf_objects_held: Any
    barn_objects_held: Any
    outstanding: Any


#: The fields of :class:`State`, each (shape) and meaning:
#: ``pend`` (R, R) objects allocated by rep i, to be freed by rep j; ``pend_cs`` (R, R) of
#: them, still in rep i's current CPU slab; ``cs_tracked`` (R,) sum over j of pend_cs[r, j];
#: ``out`` (R,) objects allocated by r and not yet freed; ``pend_tot`` (R,) objects rep r
#: has to free; ``cs_free``, ``cs_inuse``, ``cs_rfree`` (R,) objects on r's CPU freelist,
#: allocated from its CPU slab, freed into it by other CPUs; ``pc0``, ``pc1``, ... (R,,
#: :data:`PCS`) slabs on r's per-CPU partial list by fill level and ``pcu1``, ... (R,,
#: :data:`PCU`) their allocated objects; ``pw``, ``pd`` (R,) the slabs of r's per-CPU
#: partial list being freed into, its draining window, and their objects (0: none;
#: :func:`_pc_free_one`); ``rp0``, ..., ``rpu1``, ..., ``rpw``, ``rpd`` (R,,
#: :data:`RPS`, :data:`RPU`) the same for r's per-CPU partial slabs of the other memory
#: node class (``1 - rep_mem_node``); ``main``, ``spare`` (R,) objects in r's sheaves;
#: ``phase``, ``phase_left`` (R,) burst phase (0 allocating, 1 freeing) and ops left in it;
#: ``ns0``, ... and ``nu1``, ... (N,, :data:`NS`, :data:`NU`) the node's partial list by
#: fill level; ``hs``, ``hu`` (N,) 1 when a bulk take left a partly used slab at the
#: list's head, and its allocated objects (0 without one); ``full_slabs`` (N,) slabs with
#: every object allocated, on no list; ``barn_full``, ``barn_empty`` (N,) sheaves in the
#: node's barn; ``counts`` (len(COUNTER_FIELDS), R) event counters; ``lock_node`` (N,)
#: list_lock acquisitions per node class; ``gsum_rep`` (3, R) gauge sums mod 2**20
#: (objects_inuse, cpu_partial, sheaves), ``gsum_node`` (3, N) (slabs_total, empty slabs,
#: barn objects), ``ghi_rep``, ``ghi_node`` the sums // 2**20 (so long runs cannot
#: overflow int32).
STATE_FIELDS = (
    "pend", "pend_cs", "cs_tracked", "out", "pend_tot", "cs_free", "cs_inuse", "cs_rfree",
    *PCS, *PCU[1:], "pd", "pw", *RPS, *RPU[1:], "rpd", "rpw", "main", "spare", "phase",
    "phase_left",
    *NS, *NU[1:], "hs", "hu",
    "full_slabs", "barn_full", "barn_empty", "counts", "lock_node", "gsum_rep",
    "gsum_node", "ghi_rep", "ghi_node",
)

State = NamedTuple("State", [(f, Any) for f in STATE_FIELDS])
State.__doc__ = """What evolves: per rep (R,), per node class (N,), ``pend`` (R, R) and counters
(:data:`STATE_FIELDS`).  The scan carries it as a dict of these arrays."""


# --------------------------------------------------------------------------- config


def _scalar(x, dtype=np.int32):
    return np.asarray(x, dtype)


def config_from(structure, profile: profiles.KernelProfile, topology: Topology, workload,
                *, memoryless_fallback: bool | None = None, barns: str | None = None,
                min_partial: int | None = None, cpu_partial_slabs: int | None = None,
                sheaf_capacity: int | None = None,
                barn_max_full: int = profiles.BARN_MAX_FULL,
                barn_max_empty: int = profiles.BARN_MAX_EMPTY, ops_per_step: int = 1) -> SimConfig:
    """Build a :class:`SimConfig` for one configuration.

    ``structure``: a :class:`slabtune.model.policy.Structure` of scalars (order,
    objs_per_slab, min_partial, cpu_partial_slabs, sheaf_capacity).  ``workload``: a
    ``(Workload, RepLayout)`` pair from :mod:`slabtune.model.workloads`, or a dict
    ``{"kind": ..., **params}`` built on ``topology``.  Keyword overrides stand for sysfs
    writes and boot-time switches (``barns``: "none", "memory_nodes" or "all_nodes").
    ``ops_per_step``: the run length b (see :data:`MAX_OPS_PER_STEP`); 1 is one op per rep
    per step, larger values trade fidelity for speed (docs/MODEL.md, "Runs").
    """
    b = check_ops_per_step(ops_per_step)
    if isinstance(workload, dict):
        params = dict(workload)
        kind = params.pop("kind")
        workload = workloads.build(kind, topology, **params)
    wl, lay = workload
    cap = int(np.asarray(structure.sheaf_capacity) if sheaf_capacity is None else sheaf_capacity)
    cps = int(np.asarray(structure.cpu_partial_slabs) if cpu_partial_slabs is None
              else cpu_partial_slabs)
    if not profile.has_cpu_partial:
        cps = 0
    mp = int(np.asarray(structure.min_partial)) if min_partial is None else int(min_partial)
    fb = profile.memoryless_fallback if memoryless_fallback is None else bool(memoryless_fallback)
    barn_name = profile.barns if barns is None else barns
    if barn_name not in profiles.BARN_NODES:
        raise ValueError(f"barns: {barn_name!r} is not one of {', '.join(profiles.BARN_NODES)}")
    objs = int(np.asarray(structure.objs_per_slab))
    if objs < 1:
        raise ValueError(f"objs_per_slab: {objs} < 1")
    lag_mul, freers = workloads.lag_weights(wl.free_cum)
    return SimConfig(
        objs_per_slab=_scalar(objs),
        order=_scalar(np.asarray(structure.order)),
        min_partial=_scalar(mp),
        cpu_partial_slabs=_scalar(cps),
        sheaf_capacity=_scalar(cap),
        cpu_slab=_scalar(int(cap == 0 or profile.has_cpu_slab)),
        barns=_scalar(profiles.BARN_NODES.index(barn_name)),
        remote_free_bypasses_sheaf=_scalar(int(profile.remote_free_bypasses_sheaf)),
        memoryless_cpus_use_sheaves=_scalar(int(profile.memoryless_cpus_use_sheaves)),
        memoryless_fallback=_scalar(int(fb)),
        barn_max_full=_scalar(barn_max_full),
        barn_max_empty=_scalar(barn_max_empty),
        rep_weight=np.asarray(lay.weight, np.float32),
        rep_node=np.asarray(lay.node, np.int32),
        rep_mem_node=np.asarray(lay.mem_node, np.int32),
        rep_memoryless=np.asarray(lay.memoryless, np.int32),
        node_has_memory=np.asarray(lay.node_has_memory, np.int32),
        node_weight=np.asarray(lay.node_weight, np.float32),
        workload=workloads.Workload(*(np.asarray(f, np.int32) for f in wl)),
        ops_per_step=_scalar(b),
        slab_alloc_single=_scalar(int(not profile.has_cpu_slab)),
        pc_empty_locks=_scalar(int(profile.unfrozen_cpu_partial)),
        take_objects=_scalar(int(profile.cpu_partial_counts_objects)),
        free_discard_offset=_scalar(profile.slab_free_discard_offset),
        remote_node_defrag_ratio=_scalar(profiles.REMOTE_NODE_DEFRAG_RATIO),
        rep_mem_home=np.asarray(lay.mem_home, np.int32),
        lag_mul=lag_mul,
        lag_freers=_scalar(freers),
        list_nodes=workloads.list_nodes(lay.weight, lay.mem_node, lay.mem_home),
    )


def check_ops_per_step(b) -> int:
    """``b`` as an int in 1..MAX_OPS_PER_STEP, or a SlabtuneError naming ops_per_step."""
    if isinstance(b, bool) or not isinstance(b, (int, np.integer)) \
            or not 1 <= int(b) <= MAX_OPS_PER_STEP:
        raise SlabtuneError(f"ops_per_step: {b!r} is not an integer in 1..{MAX_OPS_PER_STEP}")
    return int(b)


def stack_configs(cfgs) -> SimConfig:
    """Stack configurations along a new leading axis (for :func:`simulate_batch`)."""
    return jax.tree_util.tree_map(lambda *xs: np.stack(xs), *cfgs)


# --------------------------------------------------------------------------- random bits


def _mix32(x):
    """lowbias32 integer hash on uint32 (wraps mod 2**32)."""
    x = x ^ (x >> 16)
    x = x * _U32(0x7FEB352D)
    x = x ^ (x >> 15)
    x = x * _U32(0x846CA68B)
    x = x ^ (x >> 16)
    return x


def seed_of(key) -> jnp.ndarray:
    """The 32-bit stream seed of a run, drawn from its jax.random key."""
    return jax.random.bits(key, (), jnp.uint32)


def _draws_at(seed, t):
    """The uint32 words of step ``t``, shape (R, K) + seed.shape: a counter-based hash of
    (seed, t, rep, k)."""
    seed = jnp.asarray(seed, _U32)
    ctr = jnp.asarray(t, _U32) * _U32(R * K) + jnp.arange(R * K, dtype=_U32)
    ctr = ctr.reshape((R, K) + (1,) * seed.ndim)
    s = _mix32(seed ^ _U32(0x5BD1E995))
    return _mix32((ctr * _U32(0x9E3779B9)) ^ s)


def draws(key, steps: int) -> jnp.ndarray:
    """All random words of a run, shape (steps, R, K) uint32: what :func:`simulate` uses
    step by step, for feeding the reference simulator the same numbers (drawn in blocks of
    one compiled shape, :func:`slabtune.model.runlen.blocked_draws`)."""
    return runlen.blocked_draws(_draws_at, key, seed_of, steps)


# --------------------------------------------------------------------------- helpers
# The step works on a batch of configurations laid out batch-minor: a scalar of the model
# is a (B,) vector, a per-rep field (R, B), a per-node field (N, B), so every operation is
# a contiguous vector loop over the batch.  Node-class and traced rep indices go through
# one-hot selects (N and R are small); the rep being stepped is the fori_loop counter,
# the same for the whole batch, so its rows are plain dynamic slices.

_NODES = np.arange(N, dtype=np.int32)[:, None]
_REPS = np.arange(R, dtype=np.int32)[:, None]


def _get(x, idx):
    """x[idx] per configuration for a traced index (B,), as a one-hot select and sum."""
    ar = _NODES if x.shape[0] == N else _REPS
    return jnp.sum(jnp.where(ar == idx, x, 0), axis=0)


def _add(x, idx, v):
    """x with v added at a traced index (B,)."""
    ar = _NODES if x.shape[0] == N else _REPS
    return x + jnp.where(ar == idx, v, 0)


def _cumsum(x, axis=0):
    """Inclusive prefix sums along a short static axis (segments of a step: R reps, 2R
    slab segments, 8 blocks) as a chain of vector adds.  ``jnp.cumsum`` lowers to a
    reduce-window that XLA:CPU emits as a scalar loop over the window for every output
    element, which made it most of the cost of a one-op run."""
    parts = [lax.index_in_dim(x, 0, axis, keepdims=False)]
    for k in range(1, x.shape[axis]):
        parts.append(parts[-1] + lax.index_in_dim(x, k, axis, keepdims=False))
    return jnp.stack(parts, axis=axis)


def level_bounds(objs: int) -> list[int]:
    """The lowest allocated-object count of each fill level for ``objs`` objects per slab:
    0 (empty), 1, then ``max(k, ceil((k - 1) objs / (LEVELS - 1)))`` for level k; a level
    whose bound exceeds ``objs - 1`` holds no slab (with ``LEVELS`` or fewer objects per
    slab every count is its own level).  No kernel function: the model's resolution of a
    partial list."""
    return [0] + [max(k, -(-(k - 1) * objs // (LEVELS - 1))) for k in range(1, LEVELS)]


def _level_of(h, lo):
    """The fill level of a slab with ``h`` allocated objects."""
    return sum(_i(h >= lo[k]) for k in range(1, LEVELS))


def _cascade(s, u, c, lo):
    """``c[k]`` frees into the slabs of level k of a list (``s[k]`` slabs, ``u[k]``
    objects; ``c[0]`` unused), the fullest level first.  Objects stay spread evenly over
    a level's slabs, so a level's frees beyond its slack (``u - lo * s``) each drop one
    slab to the level below (with ``lo - 1`` objects); frees beyond its slabs pass down
    with them.  Returns the new levels and the slabs that emptied (dropped from level 1):
    the same as the frees one at a time, fullest level first (what the reference does)."""
    s, u = list(s), list(u)
    carry = _i(0)
    for k in range(LEVELS - 1, 0, -1):
        ck = c[k] + carry
        over = ck - (u[k] - lo[k] * s[k])
        drop = jnp.clip(over, 0, s[k])
        carry = jnp.maximum(over - s[k], 0)
        u[k] = u[k] - (ck - carry) - drop * (lo[k] - 1)
        s[k] = s[k] - drop
        s[k - 1] = s[k - 1] + drop
        if k > 1:
            u[k - 1] = u[k - 1] + drop * (lo[k] - 1)
    return s, u, drop


def _spread(s, u):
    """Per level k >= 1 of a list, the evenly spread objects ``u = q * s + r``: ``q`` and
    ``r`` (``s - r`` slabs hold ``q``, ``r`` hold ``q + 1``)."""
    q = [None] + [floor_div(u[k], jnp.maximum(s[k], 1)) for k in range(1, LEVELS)]
    r = [None] + [u[k] - q[k] * s[k] for k in range(1, LEVELS)]
    return q, r


def _even(n, u):
    """``u`` objects spread evenly over ``n`` slabs, ``u = q * n + r``: ``q`` and ``r``
    (``n - r`` slabs hold ``q``, ``r`` hold ``q + 1``; a per-CPU partial list's draining
    window as a take or a drain sees it)."""
    q = floor_div(u, jnp.maximum(n, 1))
    return q, u - q * n


def _level_blocks(s, u, q, r, objs):
    """A list's slabs emptiest first as blocks of equal free objects: (slabs, free
    objects per slab) for level 0, then per level its ``q`` and its ``q + 1`` slabs."""
    n, y = [s[0]], [objs]
    for k in range(1, LEVELS):
        n += [s[k] - r[k], r[k]]
        y += [objs - q[k], objs - q[k] - 1]
    return n, y


def _i(x):
    return jnp.asarray(x, _I32)


def _materialize(xs, zero):
    """The int32 values ``xs`` (a list of same-shape arrays) computed once and stored.
    XLA:CPU fuses cheap elementwise chains into every consumer and recomputes them per
    element (once per node class for a one-hot select), and drops optimisation barriers
    before fusion; an in-place dynamic-update-slice ends a fusion, so each value is
    written into a row of a buffer one row longer than needed (``zero`` keeps XLA from
    folding it) and read back."""
    shape = jnp.shape(xs[0])
    buf = jnp.zeros((len(xs) + 1,) + shape, _I32) + zero
    for i, x in enumerate(xs):
        buf = lax.dynamic_update_slice_in_dim(buf, jnp.broadcast_to(_i(x), shape)[None], i, 0)
    return [buf[i] for i in range(len(xs))]


_CI = {name: k for k, name in enumerate(COUNTER_FIELDS)}


class _Ctx:
    """Mutable view of one rep op: the state dict and the rep's counter increments."""

    def __init__(self, st: dict, r, d: dict):
        self.st = st
        self.r = r
        self.d = d
        self.inc = [_i(0)] * len(COUNTER_FIELDS)
        self.locks = {}   # id(node) -> [node, acquisitions]: one one-hot add per node
        self.node_locks = None   # (N, B) acquisitions on every node class
        self.rows = {}    # per-rep field -> this rep's current (B,) entry
        self.m = None     # the rep's memory node class (B,), set for the run
        self.nrows = {}   # per-node field -> [entry at node m as read, current entry]

    def bump(self, name, v):
        self.inc[_CI[name]] = self.inc[_CI[name]] + _i(v)

    def lock(self, node, cnt):
        """``cnt`` list_lock acquisitions on node class ``node`` (a count or a condition)."""
        cnt = _i(cnt)
        self.bump("list_lock", cnt)
        self.bump("list_lock_remote", jnp.where(node != self.d["node"][self.r], cnt, 0))
        ent = self.locks.setdefault(id(node), [node, _i(0)])
        ent[1] = ent[1] + cnt

    def lock_nodes(self, cnt):
        """``cnt[n]`` list_lock acquisitions on every node class n ((N, B) counts; summed
        and counted once, in :meth:`flush_locks`)."""
        self.node_locks = cnt if self.node_locks is None else self.node_locks + cnt

    def flush_locks(self):
        if self.node_locks is not None:
            cnt, self.node_locks = self.node_locks, None
            self.bump("list_lock", jnp.sum(cnt, axis=0))
            self.bump("list_lock_remote",
                      jnp.sum(jnp.where(_NODES != self.d["node"][self.r], cnt, 0), axis=0))
            self.st["lock_node"] = self.st["lock_node"] + cnt
        if self.locks:
            ents = list(self.locks.values())
            shape = jnp.shape(self.d["zero"])
            cnts = _materialize([jnp.broadcast_to(c, shape) for _, c in ents], self.d["zero"])
            for (node, _), cnt in zip(ents, cnts):
                self.st["lock_node"] = _add(self.st["lock_node"], node, cnt)
        self.locks = {}

    # This rep's entries of per-rep fields are kept as (B,) values while the op runs and
    # written back once (one dynamic-update-slice per field instead of one per update).

    def row(self, name):
        """This rep's current entry of a per-rep field."""
        if name not in self.rows:
            self.rows[name] = self.st[name][self.r]
        return self.rows[name]

    def whole(self, name):
        """A per-rep field with this rep's pending entry written back."""
        if name in self.rows:
            self.st[name] = self.st[name].at[self.r].set(self.rows.pop(name))
        return self.st[name]

    def write_rows(self):
        for name in list(self.rows):
            self.whole(name)

    def rset(self, name, v, cond=True):
        """Set this rep's entry of a per-rep field (where ``cond``)."""
        self.rows[name] = jnp.where(cond, v, self.row(name))

    def radd(self, name, v):
        self.rows[name] = self.row(name) + _i(v)

    # Node ``m``'s entries of per-node fields likewise: read once, changed as (B,) values,
    # and written back in :meth:`nflush` behind an optimisation barrier, so that the
    # chains computing them are not fused into (N, B) selects and reduces (XLA would
    # recompute them once per node class).

    def nget(self, name):
        """Node ``m``'s current entry of a per-node field."""
        if name not in self.nrows:
            v = _get(self.st[name], self.m)
            self.nrows[name] = [v, v]
        return self.nrows[name][1]

    def nset(self, name, v):
        self.nget(name)
        self.nrows[name][1] = _i(v)

    def nflush(self):
        """Write node ``m``'s changed entries back (one barrier for all of them)."""
        if not self.nrows:
            return
        names = list(self.nrows)
        deltas = _materialize([self.nrows[f][1] - self.nrows[f][0] for f in names],
                              self.d["zero"])
        for f, dv in zip(names, deltas):
            self.st[f] = self.st[f] + jnp.where(_NODES == self.m, dv, 0)
        self.nrows = {}

    def nadd(self, name, n, v):
        """Add ``v`` at node class ``n`` of a per-node field (or at rep ``n`` of a per-rep
        field, ``n`` traced)."""
        self.st[name] = _add(self.whole(name), n, _i(v))


# --------------------------------------------------------------------------- the step


def _below(cum, n, u, tot, n_max):
    """How many of a run's ``n`` systematic points ``(u + i * tot) / n`` (i < n) lie below
    ``cum``: ``clip(ceil((cum * n - u) / tot), 0, n)``.

    ``n_max`` is static, a bound on ``n`` over the whole batch.  With ``n_max == 1`` (one op
    per step, the one-op model's random pick) the formula is the single pick itself:
    ``ceil((cum - u) / tot) >= 1`` exactly when ``cum > u``, so the count is
    ``n * (cum > u)`` for n in {0, 1}, bit for bit, and XLA traces a compare instead of
    the divide."""
    if n_max == 1:
        return _i(n) * _i(cum > u)
    return jnp.clip(ceil_div(cum * n - u, tot), 0, n)


def _systematic(cum, n, u, tot, n_max, axis=0):
    """Cumulative counts of a run's ``n`` random picks by systematic sampling: how many of
    the points ``(u + i * tot) // n`` (i < n, ``0 <= u < tot``) lie below each cumulative
    size ``cum`` along ``axis`` (:func:`_below`); the last segment takes every point.  For
    ``n == 1`` this is the single pick of ``u`` (the first segment whose cumulative size
    exceeds it), which is what ``n_max == 1`` traces."""
    c = _below(cum, n, u, tot, n_max)
    last = [slice(None)] * c.ndim
    last[axis] = slice(-1, None)
    last = tuple(last)
    return c.at[last].set(jnp.broadcast_to(n, c[last].shape))


def _counts(cum, axis=0):
    """Per-segment counts from cumulative counts along ``axis``."""
    first = lax.slice_in_dim(cum, 0, 1, axis=axis)
    return jnp.concatenate([first, jnp.diff(cum, axis=axis)], axis=axis)


def _pick_classes(mem_node, k, n_max, flush_to=None):
    """The node classes a free run's picks can land on, as a leading axis ``cls`` (C, B),
    with ``on_cls`` taking a per-node (N, B) field to (C, B) and ``from_cls`` putting
    (C, B) counts back on (N, B) (zero elsewhere).  In general every class (C = N, both
    maps the identity).  With the static run bound ``n_max == 1`` a run is one free, the
    one-op model's pick: ``k`` (R, B) is then 1 at most at one rep, whose memory node is
    the only class that can get it (C = 1), so the split never traces the other classes.
    ``flush_to`` (B,): one pick of a batch with v6.18 opt-in caches, whose free either
    goes to a slab (``k``, the picks that skip the sheaves) or into the main sheaf, whose
    flush, if any, goes to node ``flush_to``'s slabs: still one class, that node's when
    ``k`` is empty."""
    if n_max != 1:
        return _NODES, (lambda v: v), (lambda v: v)
    c = jnp.sum(jnp.where(k > 0, mem_node, 0), axis=0)                  # (B,)
    if flush_to is not None:
        c = jnp.where(jnp.any(k > 0, axis=0), c, flush_to)
    return (c[None], lambda v: _get(v, c)[None],
            lambda v: jnp.where(_NODES == c, v[0], 0))


def _rep_op(r, w, st: dict, cfg: SimConfig, d: dict) -> dict:
    """One run of rep ``r``: up to ``ops_per_step`` allocations or frees (the workload's
    choice), as closed-form transitions.

    ``w``: this rep's K random words.  Allocation and free halves are masked updates (the
    run lengths ``na``/``nf`` exclude each other); the order of the events within a run is
    the one :mod:`slabtune.model.reference_sim` plays event by event (docs/MODEL.md).

    The parts, each its own function, in the order they are traced (the order is part of
    the compiled program; keep it): :func:`_rep_values`, :func:`_choose_run`, the
    allocation half :func:`_alloc_run`, the optimisation barrier :func:`_between_halves`,
    the free half :func:`_free_run`, and :func:`_write_counters`.  The parts update the
    state through the :class:`_Ctx` they are given (as :func:`_bulk_take` and the other
    helpers do) and have no other effect; none branches in Python on a traced value.
    """
    st = dict(st)
    cx = _Ctx(st, r, d)
    k = _rep_values(r, w, cfg, d)
    cx.m = k.m
    do_a, na, nf = _choose_run(cx, cfg.workload, k.w0)
    shape = jnp.shape(do_a)
    _alloc_run(cx, k, cfg, do_a, na)
    nf, k = _between_halves(cx, k, nf, shape)
    _free_run(cx, k, cfg, nf)
    _write_counters(cx, shape)
    return st


class _Rep(NamedTuple):
    """What one rep's run reads besides the state: the cache's scalars, the rep's node
    classes and its K random words (the free half gets ``w1``/``w2`` as they come out of
    the optimisation barrier, :func:`_between_halves`)."""

    objs: Any       # objects per slab
    cap: Any        # sheaf capacity (0: no sheaves)
    capm: Any       # max(cap, 1), a divisor
    sheaves: Any    # cap > 0
    cps: Any        # cpu_partial_slabs (0: no per-CPU partial list)
    mp: Any         # per node class, min_partial as __slab_free() applies it (``free_mp``)
    w0: Any         # random word: the run's kind
    w1: Any         # random word: freeing reps of an allocation run, pending objects freed
    w2: Any         # random word: slabs a free run's objects come from
    m: Any          # the rep's memory node class (its slabs come from there)
    floor: Any      # node m's list serves this run only above this many slabs
    kn: Any         # the real nodes' lists node m's list sums (``list_nodes``)
    own: Any        # the rep's own node class (its barn)
    has_barn: Any   # the rep's node has a barn (and the cache sheaves)
    cs_sheaf: Any   # a v6.18 opt-in cache: sheaves beside a CPU slab (a Python False
    #                 where the batch has none, RunForm.optin, so nothing of it is traced)


def _rep_values(r, w, cfg: SimConfig, d: dict) -> _Rep:
    """The :class:`_Rep` of rep ``r`` with random words ``w`` (no kernel function: the
    constants of one run, read from the config and :func:`_derived` ``d``).  ``m`` is one
    traced value for the whole run: :meth:`_Ctx.lock` counts locks per node object."""
    objs = d["objs"]
    cap = _i(cfg.sheaf_capacity)
    capm = jnp.maximum(cap, 1)
    sheaves = cap > 0
    cps = _i(cfg.cpu_partial_slabs)
    mp = d["free_mp"]
    w0, w1, w2 = w[0], w[1], w[2]
    m = d["mem_node"][r]
    # an alloc run draws get_any_partial()'s defrag-ratio test from w2 (free runs use it)
    floor = node_list_floor(d["memless"][r], _i(_i(w2 & _U32(DEFRAG_DRAW)) <= d["defrag"]),
                            _get(d["min_partial"], m))
    kn = _get(d["list_nodes"], m)
    own = d["node"][r]
    has_barn = d["has_barn"][r]
    cs_sheaf = sheaves & (cfg.cpu_slab > 0) if d["optin"] else False
    return _Rep(objs, cap, capm, sheaves, cps, mp, w0, w1, w2, m, floor, kn, own, has_barn,
                cs_sheaf)


#: get_cycles() % 1024 of get_any_partial()'s defrag-ratio test: the low bits of an
#: alloc run's ``w2``.
DEFRAG_DRAW = 1023
#: A node list floor no list reaches: the run takes nothing from node lists.
NO_TAKE = 1 << 30


def node_min_partial(min_partial, list_nodes):
    """Per node class, the partial slabs at which its list meets min_partial: the
    kernel's per-node tests (6.1 to 7.2 __slab_free() ``n->nr_partial >=
    s->min_partial``, the per-CPU partial drain keeping empty slabs up to min_partial,
    get_any_partial()'s ``n->nr_partial > s->min_partial``) on a list that sums
    ``list_nodes`` real nodes' lists (:func:`slabtune.model.workloads.list_nodes`):
    ``min_partial * list_nodes``.  Compared with one node's min_partial, class 1's list
    of four nodes' three (16 CPUs, 4 nodes) discarded the slabs that three lists each
    shorter than min_partial keep.  Plain operators (the reference and the C engine
    compute the same)."""
    return min_partial * list_nodes


#: The bits of an alloc run's ``w2`` that deal a class list's remainder slabs to homes
#: (:func:`home_share`); its low bits draw get_any_partial()'s test (:data:`DEFRAG_DRAW`).
SHARE_SHIFT = 16


def home_share(S, list_nodes, w2):
    """Of a node class's list of ``S`` partial slabs (the head slab included), those on
    the list of the real node a run's CPU takes from: the class's list sums
    ``list_nodes`` nodes' lists (:func:`node_min_partial`), and get_partial_node() walks
    only ``n->partial`` of the CPU's own memory node (6.1 and 6.12 get_partial()), so a
    CPU whose node's list is empty takes a new slab although the class's list holds other
    nodes' slabs, and one call fills the per-CPU partial list from its own node's slabs
    alone.  The share is ``S // list_nodes``, one more with probability ``(S %
    list_nodes) / list_nodes`` (drawn from the bits of ``w2`` above
    :data:`SHARE_SHIFT`), so the shares of the class's nodes average ``S / list_nodes``;
    it is ``S`` where the class is one node's list.  The CPU-slab takes use it
    (:func:`_partial_lists`); pooled, a sender on 16 CPUs of 4 nodes had filled its
    per-CPU partial list from three nodes' slabs: lab ``pc-16cpu-4node-order0`` (6.1) 4.9
    new slabs per kop and 407 KiB against 7.11 and 387 measured, 6.19 and 373 with the
    share; ``pc-16cpu-4node`` (order 2) 815 KiB against 697, 736 with it.  The 7.x bulk
    takes (:func:`_bulk_take`) keep the whole list: the share there overshot 7.2's memory
    on four nodes (docs/MODEL.md "Representative CPUs and node classes").
    get_any_partial() from the class's other nodes (more than min_partial each) is left
    out, as it is for CPUs of memory nodes across classes.  On int32 arrays; the
    reference and the C engine compute the same with their own integer division."""
    q = floor_div(S, list_nodes)
    d = jnp.asarray(w2 >> SHARE_SHIFT).astype(jnp.int32)
    dr = d - floor_div(d, list_nodes) * list_nodes
    return q + _i(dr < S - q * list_nodes)


def node_list_floor(memless, searched, min_partial):
    """How many partial slabs its memory node's list must hold more than for a rep to
    take slabs or objects from it (the list counts its head slab).  A CPU of a node with
    memory: 0, get_partial_node() of its own node.  A CPU of a memoryless node: on x86
    (no CONFIG_HAVE_MEMORYLESS_NODES) numa_mem_id() is that node itself, which has no
    kmem_cache_node, so get_partial() finds nothing there and get_any_partial() takes from
    a node with more than ``min_partial`` partial slabs, and only when ``searched`` (its
    ``get_cycles() % 1024 <= remote_node_defrag_ratio`` test passed); otherwise the
    allocation gets a new slab from the page allocator (6.1.192 get_partial(),
    get_any_partial(); 7.2.13 get_from_partial(), get_from_any_partial() and
    refill_objects(), whose __refill_objects_any() has the same tests).  So such CPUs take
    new slabs while their memory node keeps min_partial partial ones.  The search walks
    the zonelist, nearest node first; the model offers the nearest memory node alone.
    Plain operators, so Python ints and traced arrays both work."""
    return memless * (searched * min_partial + (1 - searched) * NO_TAKE)


def _choose_run(cx: _Ctx, wl: workloads.Workload, w0):
    """The kind and length of rep ``cx.r``'s run this step (the workload, no kernel
    function): it allocates if it can (active, below its live target) and wants to (its
    burst phase, else the high half of ``w0`` against ``alloc_p``), else frees if it has
    more objects to free than it holds (``hold``,
    :func:`slabtune.model.workloads.hold_levels`), at most that excess; at most b ops, at
    most the rest of a burst phase (which flips at its end).  Returns ``do_a`` (the run
    allocates) and the run lengths ``na``/``nf`` (one of them 0), and counts the ops."""
    r, d = cx.r, cx.d
    # ---- workload: a run of allocations or of frees, and its length
    alloc_p = wl.alloc_p[r]
    burst = wl.burst[r]
    can_a = (wl.active[r] > 0) & (alloc_p > 0) & (cx.row("out") < wl.live_target[r])
    excess = cx.row("pend_tot") - wl.hold[r]
    can_f = (wl.active[r] > 0) & (excess > 0)
    bursty = burst > 0
    want_a = jnp.where(bursty, cx.row("phase") == 0, _i(w0 >> 16) < alloc_p)
    do_a = can_a & (want_a | ~can_f)
    do_f = can_f & ~do_a
    n = jnp.where(do_a, jnp.minimum(d["b"], wl.live_target[r] - cx.row("out")),
                  jnp.where(do_f, jnp.minimum(d["b"], excess), 0))
    n = jnp.where(bursty, jnp.minimum(n, cx.row("phase_left")), n)
    left = cx.row("phase_left") - jnp.where(bursty, n, 0)
    flip = bursty & (n > 0) & (left <= 0)
    cx.rset("phase", 1 - cx.row("phase"), flip)
    cx.rset("phase_left", jnp.where(flip, burst, left))
    cx.bump("ops", n)
    na = jnp.where(do_a, n, 0)
    nf = jnp.where(do_f, n, 0)
    return do_a, na, nf


# ================================================================ allocation run


def _alloc_run(cx: _Ctx, k: _Rep, cfg: SimConfig, do_a, na):
    """The allocation half of a run: ``na`` allocations (0 when the run frees), the paths
    of slab_alloc() (mm/slub.c): the sheaves where the cache has them
    (:func:`_sheaf_alloc`, v6.18 opt-in, v7.0 on), else the CPU slab
    (:func:`_cpu_slab_alloc`), except on a memoryless CPU without the numa_mem_id() fix
    (v2.6.27, or the ``memoryless_fallback`` override), which takes every object from its
    memory node's partial list; then the bulk take of the sheaf refills and those direct
    allocations from node ``m`` (:func:`_bulk_take`) and the bookkeeping
    (:func:`_count_allocs`).  A v6.18 opt-in cache (sheaves beside the CPU slab,
    ``cs_sheaf``) refills through the CPU slab instead (6.18 refill_sheaf() calls
    __kmem_cache_alloc_bulk(): ``cap`` objects each from the CPU freelist, then the slow
    paths of ___slab_alloc()); those objects stay untracked in the CPU slab, and
    SLUB_STATS counts each as a fast or slow path, as the model does."""
    Cj, cnt = _alloc_freers(cx, cfg.workload, na, k.w1)
    # whether the run's bulk takes may use node m's list, as the run starts
    s0, _, hs0, _ = _node_levels(cx)
    use_list = sum(s0) + hs0 > k.floor
    sh_slow, rfl, ndir = _sheaf_alloc(cx, k, cfg, na)
    cs_sheaf = k.cs_sheaf

    # -- a CPU on a memoryless node without the numa_mem_id() fix never finds its CPU slab
    #    "local": every object comes from the node's partial list under its lock; so does
    #    a v7.x allocation the sheaves could not serve (``ndir``)
    direct = do_a & ~k.sheaves & (cx.d["alloc_local"][cx.r] == 0)
    nd = jnp.where(direct, na, 0) + ndir

    a_cs = do_a & ~k.sheaves & ~direct
    n_rc = jnp.where(cs_sheaf, rfl * k.cap, 0)        # refilled through the CPU slab
    nc = jnp.where(a_cs, na, n_rc)
    rfe, E, t_pg = _cpu_slab_alloc(cx, k, a_cs | (n_rc > 0), nc, Cj, cnt, a_cs)

    # -- bulk allocation from node m: sheaf refills (cap objects each) or direct ones
    n_b, y_b, rem = _bulk_take(cx, k.m, rfl * k.cap - n_rc + nd, use_list)
    single = cfg.slab_alloc_single > 0
    cx.lock(k.m, jnp.where(single, _refill_locks(n_b, y_b, rfl, k.cap, rem, cx.d["max_run"]),
                           jnp.where(cs_sheaf, 0, rfl)) + nd)

    _count_allocs(cx, na, n_rc, cnt, sh_slow, rfe, E, nd, t_pg)


def _alloc_freers(cx: _Ctx, wl: workloads.Workload, na, w1):
    """The freeing rep of each of a run's ``na`` allocations (the workload's who frees
    what, no kernel function), drawn when the object is allocated: systematic points over
    the rep's ``free_cum`` row from the low half of ``w1``.  Returns the cumulative counts
    ``Cj`` and the counts ``cnt`` per freeing rep (R, B); counts the allocations."""
    r, d = cx.r, cx.d
    # freeing rep of each object: systematic points over the rep's free_cum row
    Cj = _systematic(wl.free_cum[r], na, _i(w1 & _U32(0xFFFF)), PROB_ONE, d["max_run"])
    cnt = _counts(Cj)
    cx.bump("allocs", na)
    return Cj, cnt


def _sheaf_alloc(cx: _Ctx, k: _Rep, cfg: SimConfig, na):
    """A run's allocations from the per-CPU sheaves (v6.18 for caches that ask for them,
    every cache from v7.0): alloc_from_pcs() takes from the main sheaf; when it is empty,
    __pcs_replace_empty_main() swaps in a non-empty spare, else takes a full sheaf from
    the barn (barn_replace_empty_sheaf(): the empty main goes into the barn while it has
    room), else refills the main sheaf from the slabs (refill_sheaf(), ``cap`` objects;
    the caller does the bulk take and its lock).  Without a barn on the CPU's node (v7.0:
    barns only on nodes with memory) __pcs_replace_empty_main() gives up after the spare
    (``if (!barn) return NULL``, 7.2.13 mm/slub.c) and, where the profile has no CPU slab
    (v7.0 on, ``slab_alloc_single``), every further allocation is one ___slab_alloc():
    one object from a node's partial list under its list_lock, or from a new slab.
    Returns the replacements ``sh_slow``, the refills ``rfl`` and those single
    allocations ``ndir`` (the caller takes them, a lock each)."""
    st, cap, capm, sheaves = cx.st, k.cap, k.capm, k.sheaves
    own, has_barn = k.own, k.has_barn
    # -- sheaves (alloc_from_pcs, __pcs_replace_empty_main): main, then the spare, then
    #    full sheaves from the barn, then refills from slabs, cap objects each
    ns = jnp.where(sheaves, na, 0)
    main_r, spare_r = cx.row("main"), cx.row("spare")
    n1 = ns - jnp.minimum(ns, main_r)
    swap = (n1 > 0) & (spare_r > 0)
    n2 = n1 - jnp.where(swap, jnp.minimum(n1, spare_r), 0)
    single = ~has_barn & (cfg.slab_alloc_single > 0)
    ndir = jnp.where(single, n2, 0)
    n2 = n2 - ndir
    bf = _get(st["barn_full"], own)
    gb = jnp.where(has_barn, jnp.minimum(ceil_div(n2, capm), bf), 0)
    rfl = ceil_div(jnp.maximum(n2 - gb * cap, 0), capm)
    sh_slow = _i(swap) + gb + rfl
    cx.bump("sheaf_alloc_hit", ns - ndir - sh_slow)
    cx.bump("barn_get", gb)
    cx.bump("barn_get_fail", jnp.where(has_barn, rfl, 0))
    cx.bump("sheaf_refill", rfl)
    cx.rset("main", main_r + jnp.where(swap, spare_r, 0) + (gb + rfl) * cap - (ns - ndir))
    cx.rset("spare", 0, swap)
    cx.nadd("barn_full", own, -gb)
    cx.nadd("barn_empty", own,
            jnp.clip(cfg.barn_max_empty - _get(st["barn_empty"], own), 0, gb))
    return sh_slow, rfl, ndir


def _cpu_slab_alloc(cx: _Ctx, k: _Rep, a_cs, nc, Cj, cnt, tracked):
    """A run's allocations through the CPU slab (``a_cs``: caches without sheaves, CPUs
    whose CPU slab counts as local): slab_alloc()'s fast path on the CPU freelist, then
    the slow paths of ___slab_alloc() in their order (:func:`_cpu_freelist`), new
    CPU slabs from the per-CPU partial list (v3.2 to v6.18), the node's partial list
    (get_partial_node()) and the page allocator (new_slab()): :func:`_partial_lists`,
    :func:`_new_cpu_slabs`, :func:`_take_partial_slabs`, :func:`_install_cpu_slab`.
    ``nc`` objects (``a_cs``: any), for the reps ``Cj``/``cnt`` where ``tracked`` (the
    run's own allocations), else for a v6.18 sheaf refill (untracked).  Returns ``rfe``
    (the remotely freed objects were taken), ``E`` (new CPU slabs) and ``t_pg`` (of them,
    new slabs from the page allocator)."""
    # -- CPU slab (slab_alloc fast path, ___slab_alloc): the freelist, the remotely freed
    #    objects, then new CPU slabs, each a slow path, in the order ___slab_alloc takes
    #    them: per-CPU partial slabs, node partial slabs (get_partial_node moving up to
    #    cpu_partial_slabs / 2 + 1 more to the per-CPU list), new slabs
    nc = jnp.where(a_cs, nc, 0)
    fl = _cpu_freelist(cx, nc)
    pl = _partial_lists(cx, k)
    ns = _new_cpu_slabs(k, pl, fl.n2)
    _take_partial_slabs(cx, k, pl, ns)
    _install_cpu_slab(cx, k, nc, fl, ns, Cj, cnt, tracked)
    return fl.rfe, ns.E, ns.t_pg


class _Freelist(NamedTuple):
    """What a CPU-slab allocation run takes before it needs a new CPU slab."""

    f0: Any     # objects on the CPU freelist as the run starts
    i0: Any     # allocated objects of the CPU slab as the run starts
    r0: Any     # objects other CPUs freed into the CPU slab as the run starts
    a0: Any     # allocations from the CPU freelist (fast)
    a1: Any     # allocations from the remotely freed objects
    n1: Any     # allocations left after the freelist
    n2: Any     # allocations left for new CPU slabs
    rfe: Any    # the remotely freed objects were taken (one slow path)


def _cpu_freelist(cx: _Ctx, nc) -> _Freelist:
    """The first ``nc`` allocations' sources in the current CPU slab: the lockless CPU
    freelist (the slab_alloc() fast path), then, once it is empty, the objects other
    CPUs freed into the frozen slab (___slab_alloc() taking ``slab->freelist`` through
    get_freelist(), no lock, one slow path)."""
    f0, i0, r0 = cx.row("cs_free"), cx.row("cs_inuse"), cx.row("cs_rfree")
    a0 = jnp.minimum(nc, f0)
    n1 = nc - a0
    rfe = (n1 > 0) & (r0 > 0)
    a1 = jnp.where(rfe, jnp.minimum(n1, r0), 0)
    n2 = n1 - a1
    return _Freelist(f0, i0, r0, a0, a1, n1, n2, rfe)


class _Partials(NamedTuple):
    """The per-CPU and node partial lists a CPU-slab run takes new CPU slabs from, as
    blocks of slabs of equal free objects in the order the run takes them: the per-CPU
    list's empty slabs, its draining window (its objects spread evenly, the ``q`` slabs
    first), then its levels emptiest first (``NPC`` blocks), then node ``m``'s head slab
    and its list emptiest first (one block and ``NPC - 2``)."""

    n: Any      # list of (B,): slabs per block
    y: Any      # list of (B,): free objects per slab of each block
    pq: Any     # per-CPU list: q of each level (_spread)
    nq: Any     # node m's list: q of each level
    ps: Any     # slabs on the per-CPU partial list
    S_m: Any    # slabs on node m's partial list (the head slab included)
    G: Any      # slabs one get_partial_node() takes off node m's list


#: Blocks of the per-CPU partial list: its empty slabs, the draining window's two (its
#: ``q`` and ``q + 1`` slabs, :func:`_even`), then the blocks of its partial levels
#: (:func:`_level_blocks`).
NPC = 2 * LEVELS + 1


def _node_levels(cx: _Ctx):
    """The rep's memory node's partial list: slabs and objects per level, head slab (B,)."""
    s = [cx.nget(f) for f in NS]
    u = [_i(0)] + [cx.nget(f) for f in NU[1:]]
    return s, u, cx.nget("hs"), cx.nget("hu")


def _partial_lists(cx: _Ctx, k: _Rep) -> _Partials:
    """The :class:`_Partials` of rep ``cx.r`` and its memory node ``m`` as the run
    starts: the per-CPU partial list (``c->partial``, v3.2 to v6.18), taken emptiest
    first; the node's list (``n->partial``), which get_partial_node() (6.1, 6.12
    mm/slub.c) walks from its head: the head slab a bulk take left there, then, as the
    oldest slabs of a FIFO list have had the most frees, the emptiest; one call takes the
    slab it returns plus, where the era has per-CPU partial lists, up to
    ``cpu_partial_slabs / 2 + 1`` more that it puts on the per-CPU list.  A CPU of a
    memoryless node calls it only while the list holds more than the run's floor
    (:func:`node_list_floor`, get_any_partial()), so its calls reach the first
    :func:`takeable_slabs` of the list."""
    objs, cps = k.objs, k.cps
    ps_l = [cx.row(f) for f in PCS]
    pu_l = [_i(0)] + [cx.row(f) for f in PCU[1:]]
    pd, pw = cx.row("pd"), cx.row("pw")
    pq, pr = _spread(ps_l, pu_l)
    n_p, y_p = _level_blocks(ps_l, pu_l, pq, pr, objs)
    # the draining window after the empty ones (RefSim._take_pc), its objects spread
    # evenly over its slabs, the least used first
    wq, wr = _even(pw, pd)
    n_p = n_p[:1] + [pw - wr, wr] + n_p[1:]
    y_p = y_p[:1] + [objs - wq, objs - wq - 1] + y_p[1:]
    s, u, hs, hu = _node_levels(cx)
    nq, nr = _spread(s, u)
    n_n, y_n = _level_blocks(s, u, nq, nr, objs)
    G = 1 + jnp.where(cps > 0, cps // 2 + 1, 0)      # slabs per node list take
    S_h = home_share(sum(s) + hs, k.kn, k.w2)
    S_m = takeable_slabs(S_h, k.floor, G)
    # before v5.16 the calls stop by free objects: they reach the end of the call that
    # takes the list below the floor (the slab S_h - floor)
    _, S_o = takes_by_objects(_taken([hs] + n_n, S_h), [objs - hu] + y_n,
                              jnp.maximum(S_h - k.floor, 0), take_half(cps))
    S_m = jnp.where(by_objects(cx, k), jnp.where(S_h > k.floor, S_o, 0), S_m)
    return _Partials(n_p + _taken([hs] + n_n, S_m), y_p + [objs - hu] + y_n, pq, nq,
                     sum(ps_l) + pw, S_m, G)


def take_half(cps):
    """slub_cpu_partial(s) / 2 (v3.2 to v5.15 get_partial_node()'s stop) from the
    model's ``cpu_partial_slabs``, which is slub_cpu_partial(s) + 1 in those eras
    (policy.cpu_partial_slabs)."""
    return floor_div(jnp.maximum(cps - 1, 0), 2)


def by_objects(cx: _Ctx, k: _Rep):
    """Whether the run's get_partial_node() calls stop by free objects (v3.2 to v5.15,
    with a per-CPU partial list) rather than by slabs."""
    return cx.d["take_objects"] & (k.cps > 0)


def takeable_slabs(S, floor, G):
    """Of a node list of ``S`` partial slabs, those successive get_partial_node() calls of
    ``G`` slabs each can take while each call finds more than ``floor`` slabs there
    (:func:`node_list_floor`; the last call may take the list below it): all of them when
    ``floor`` is 0."""
    return jnp.where(S > floor, jnp.minimum(S, ceil_div(S - floor, G) * G), 0)


def takes_by_objects(n, y, t, half):
    """The pre-v5.16 take rule: get_partial_node() (v3.2 to v5.15 mm/slub.c) walks the node
    list from its head, adds each slab's free objects (acquire_slab()'s ``objects -
    inuse``, the first slab, which becomes the CPU slab, included) to ``available`` and
    stops after the slab that makes ``available > slub_cpu_partial(s) / 2`` (``half``,
    an object count); v5.16 counts slabs instead (``partial_slabs > cpu_partial_slabs /
    2``, the fixed ``G`` of :func:`takeable_slabs`).

    The list is blocks of ``n[j]`` slabs with ``y[j]`` free objects each, in list order
    (lists of (B,) or ints; ``y`` >= 1 where ``n`` > 0).  Successive calls take up to and
    including the list's ``t``-th slab (``t`` >= 1; 0: no call).  Returns ``(takes,
    gone)``: the calls made and the slabs they took off the list, i.e. through the end of
    the call that took the ``t``-th slab, or the whole list where that call ran off its
    end.  Within a block of yield ``y`` a call that starts there takes ``half // y + 1``
    slabs; a call still open at a block's end carries its objects into the next."""
    zero = jnp.zeros_like(jnp.asarray(t, jnp.int32))
    pos, a, calls = zero, zero, zero     # slabs before the block, open call's objects
    takes, end = zero, zero              # for slab t: calls through it, its call's end
    found = jnp.asarray(t) <= 0          # the call of slab t is known (or none needed)
    pending = jnp.zeros_like(found)      # slab t's call is open past its block
    for nj, yj in zip(n, y):
        nj = jnp.asarray(nj, jnp.int32)
        yj = jnp.maximum(jnp.asarray(yj, jnp.int32), 1)
        g = floor_div(half, yj) + 1                      # slabs of a call begun here
        opened = a > 0
        c = jnp.where(opened, floor_div(half - a, yj) + 1, 0)   # slabs closing it
        closes = opened & (c <= nj)
        # slab t's call was open when this block began: it ends here or goes on
        end = jnp.where(pending & closes, pos + c, end)
        found = found | (pending & closes)
        pending = pending & ~closes
        p0 = pos + jnp.where(opened, jnp.where(closes, c, nj), 0)   # fresh calls start
        rest = jnp.maximum(pos + nj - p0, 0)
        k = floor_div(rest, g)                           # whole calls in the block
        r = rest - k * g                                 # a call left open at its end
        in_blk = ~found & ~pending & (t > pos) & (t <= pos + nj)
        in_open = in_blk & (t <= p0)                     # taken by the call carried in
        end = jnp.where(in_open & closes, pos + c, end)
        pending = pending | (in_open & ~closes)
        i = floor_div(jnp.maximum(t - p0 - 1, 0), g)     # fresh call of slab t
        fresh = in_blk & (t > p0)
        takes = jnp.where(in_open, calls, jnp.where(fresh, calls + i + 1, takes))
        end = jnp.where(fresh & (i < k), p0 + (i + 1) * g, end)
        pending = pending | (fresh & (i >= k))
        found = found | (in_open & closes) | (fresh & (i < k))
        calls = calls + k + (r > 0)
        a = jnp.where(closes | ~opened, r * yj, a + nj * yj)
        pos = pos + nj
    end = jnp.where(pending, pos, end)                   # ran off the list's end
    return takes, jnp.where(jnp.asarray(t) > 0, end, 0)


class _NewSlabs(NamedTuple):
    """The new CPU slabs of a CPU-slab allocation run."""

    E: Any          # new CPU slabs (each a slow path)
    L: Any          # objects the run takes from the last of them
    y_last: Any     # free objects of the last of them when it became the CPU slab
    t_p: Any        # of them, taken off the per-CPU partial list
    t_n: Any        # of them, taken off node m's partial list
    t_pg: Any       # of them, new slabs from the page allocator


def _new_cpu_slabs(k: _Rep, p: _Partials, n2) -> _NewSlabs:
    """How many new CPU slabs the ``n2`` allocations left after the freelists take, each a
    slow path of ___slab_alloc() in its order of sources: the per-CPU partial list
    (``c->partial``, v3.2 to v6.18), the node's partial list (get_partial()), the
    page allocator (new_slab()).  The sources are blocks of slabs of equal yield
    (:class:`_Partials`); slabs get_partial_node() moves to the per-CPU list are taken
    from there in the node list's order, so the run's slabs follow the blocks; the run
    ends in the block its cumulative yield reaches."""
    objs = k.objs
    blk, o_before, e_before, y_last = _block_walk(list(p.n) + [n2], list(p.y) + [objs], n2)
    need = n2 - o_before
    ev = ceil_div(need, jnp.maximum(y_last, 1))
    E = jnp.where(n2 > 0, e_before + ev, 0)
    L = need - (ev - 1) * y_last                       # objects taken from the last slab
    t_p = jnp.minimum(E, p.ps)
    t_n = jnp.clip(E - p.ps, 0, p.S_m)
    t_pg = jnp.maximum(E - p.ps - p.S_m, 0)
    return _NewSlabs(E, L, y_last, t_p, t_n, t_pg)


def _block_walk(n, y, t):
    """Blocks of ``n[j]`` slabs with ``y[j]`` free objects each, in order (lists of (B,)):
    the block ``blk`` in which the ``t``-th object is reached (the first whose cumulative
    objects reach ``t``; 0 for t = 0), the objects and slabs of the blocks before it, and
    its ``y``.  Written over Python lists of (B,) values: a stacked (blocks, B) array
    would make XLA:CPU emit concatenates, which it evaluates element by element."""
    blk, o_cum = _i(0), _i(0)
    for nj, yj in zip(n, y):
        o_cum = o_cum + nj * yj
        blk = blk + _i(o_cum < t)
    o_cum, e_cum = _i(0), _i(0)
    o_before, e_before, y_at = _i(0), _i(0), _i(0)
    for j, (nj, yj) in enumerate(zip(n, y)):
        at = blk == j
        o_before = jnp.where(at, o_cum, o_before)
        e_before = jnp.where(at, e_cum, e_before)
        y_at = jnp.where(at, yj, y_at)
        o_cum, e_cum = o_cum + nj * yj, e_cum + nj
    return blk, o_before, e_before, y_at


def _walk_objects(n, y, t):
    """Take ``t`` objects from blocks of ``n[j]`` slabs with ``y[j]`` free objects each, in
    order (:func:`_block_walk`): per block the slabs emptied of their free objects
    (``full``) and the slabs touched (``taken``: ``full`` plus the one partly taken), the
    objects ``rem`` taken from that partly taken slab and its block's ``y_at``."""
    blk, o_before, _, y_at = _block_walk(n, y, t)
    need = t - o_before
    w = floor_div(need, jnp.maximum(y_at, 1))
    rem = need - w * y_at
    full = [jnp.where(blk > j, nj, jnp.where(blk == j, w, 0)) for j, nj in enumerate(n)]
    taken = [f + _i((blk == j) & (rem > 0)) for j, f in enumerate(full)]
    return full, taken, rem, y_at


def _taken(n, x):
    """Slabs of each block (list ``n``) among the first ``x`` of the blocks' order."""
    out, start = [], _i(0)
    for nj in n:
        out.append(jnp.clip(x - start, 0, nj))
        start = start + nj
    return out


def _level_loss(t, q):
    """Per level k >= 1, the objects of ``t[2k-1]`` slabs of its ``q`` block and ``t[2k]``
    of its ``q + 1`` block (``t`` as :func:`_taken` of :func:`_level_blocks`)."""
    return [None] + [t[2 * k - 1] * q[k] + t[2 * k] * (q[k] + 1) for k in range(1, LEVELS)]


def _level_slabs(t):
    """Per level, the slabs of its blocks in ``t`` (as :func:`_level_loss`)."""
    return [t[0]] + [t[2 * k - 1] + t[2 * k] for k in range(1, LEVELS)]


def _take_partial_slabs(cx: _Ctx, k: _Rep, p: _Partials, ns: _NewSlabs):
    """Take a run's new CPU slabs off the partial lists: ``t_p`` off the per-CPU partial
    list (no lock), then ``t_n`` off node ``m``'s list in get_partial_node() calls, each
    under the node's list_lock and taking ``G`` slabs: one becomes the CPU slab, the rest
    go onto the per-CPU partial list (put_cpu_partial(), v3.2 to v6.18), where later slow
    paths of the run take them first.  Updates both lists' levels."""
    m = k.m
    t_p, t_n = ns.t_p, ns.t_n
    takes = ceil_div(t_n, p.G)
    gone = jnp.minimum(takes * p.G, p.S_m)
    # v3.2 to v5.15: each call stops once its slabs hold more than half the limit's
    # objects (the node list's blocks here end at S_m, the last reachable call's end)
    t_o, g_o = takes_by_objects(p.n[NPC:], p.y[NPC:], t_n, take_half(k.cps))
    obj = by_objects(cx, k)
    takes = jnp.where(obj, t_o, takes)
    gone = jnp.where(obj, g_o, gone)
    in_node = t_n > 0
    tp = _taken(p.n[:NPC], t_p)
    t_q, t_q1, tp = tp[1], tp[2], tp[:1] + tp[3:]   # the window's blocks, the levels'
    nb = p.n[NPC + 1:]                   # node list blocks after the head slab
    hs = p.n[NPC]
    tg = _taken(nb, gone - hs)
    tn = _taken(nb, t_n - hs)
    mv = [a - b for a, b in zip(tg, tn)]
    ps_new = _level_slabs(mv)
    pu_new = _level_loss(mv, p.nq)
    pl, pul = _level_slabs(tp), _level_loss(tp, p.pq)
    for lv in range(LEVELS):
        cx.rset(PCS[lv], jnp.where(in_node, ps_new[lv], cx.row(PCS[lv]) - pl[lv]))
        if lv:
            cx.rset(PCU[lv], jnp.where(in_node, pu_new[lv], cx.row(PCU[lv]) - pul[lv]))
    pd, pw = cx.row("pd"), cx.row("pw")
    wq, _ = _even(pw, pd)
    pd = pd - t_q * wq - t_q1 * (wq + 1)
    cx.rset("pd", jnp.where(in_node, 0, pd))
    cx.rset("pw", jnp.where(in_node, 0, pw - t_q - t_q1))
    gl, gul = _level_slabs(tg), _level_loss(tg, p.nq)
    for lv in range(LEVELS):
        cx.nset(NS[lv], cx.nget(NS[lv]) - gl[lv])
        if lv:
            cx.nset(NU[lv], cx.nget(NU[lv]) - gul[lv])
    cx.nset("hs", jnp.where(in_node, 0, cx.nget("hs")))
    cx.nset("hu", jnp.where(in_node, 0, cx.nget("hu")))
    cx.lock(m, takes)


def _install_cpu_slab(cx: _Ctx, k: _Rep, nc, fl: _Freelist, ns: _NewSlabs, Cj, cnt, tracked):
    """The CPU slab after a CPU-slab allocation run: each new CPU slab deactivates the
    old one (deactivate_slab(): an exhausted CPU slab is full and on no list, unless it
    held nothing), the last one keeps its free objects on the CPU freelist; else the
    freelist and the remotely freed objects are what the run left.  Which of the run's
    objects are still in the CPU slab (``pend_cs``, ``cs_tracked``): the last ``L`` of
    the run when it took a new CPU slab (its objects are in freeing-rep order); none of a
    sheaf refill's (not ``tracked``)."""
    st, r, objs = cx.st, cx.r, k.objs
    f0, i0, r0, a0, a1, n1, rfe = fl.f0, fl.i0, fl.r0, fl.a0, fl.a1, fl.n1, fl.rfe
    E, L, y_last = ns.E, ns.L, ns.y_last
    # every new CPU slab deactivates the old one, full unless it held nothing
    cx.nset("full_slabs", cx.nget("full_slabs") + jnp.where(E > 0, E - _i(i0 + a0 + a1 == 0), 0))
    cx.rset("cs_free", jnp.where(E > 0, y_last - L, jnp.where(rfe, r0 - a1, f0 - a0)))
    cx.rset("cs_inuse", jnp.where(E > 0, objs - y_last + L, i0 + a0 + a1))
    cx.rset("cs_rfree", 0, n1 > 0)
    # objects still in the CPU slab: the last L of the run (its objects are in j order)
    suffix = _counts(jnp.maximum(Cj - (nc - L), 0))
    pcs_row = jnp.where(E > 0, jnp.where(tracked, suffix, 0),
                        st["pend_cs"][r] + jnp.where(tracked, cnt, 0))
    st["pend_cs"] = st["pend_cs"].at[r].set(pcs_row)
    cx.rset("cs_tracked", jnp.where(E > 0, jnp.where(tracked, L, 0),
                                    cx.row("cs_tracked") + jnp.where(tracked, nc, 0)))


def _count_allocs(cx: _Ctx, na, n_rc, cnt, sh_slow, rfe, E, nd, t_pg):
    """The allocation run's bookkeeping: fast and slow paths as SLUB_STATS counts them
    (ALLOC_SLOWPATH is ___slab_alloc(): taking the remotely freed objects, a new CPU slab,
    a direct node-list allocation; every object alloc_from_pcs() hands out is
    ALLOC_FASTPATH, v6.18/v7.x, also right after __pcs_replace_empty_main() swapped in the
    spare or a barn sheaf or refilled one: those replacements are ``sheaf_alloc_replace``),
    new slabs from the page allocator, and the objects now in flight (``pend`` by freeing
    rep, ``out``, the freeing reps' ``pend_tot``).  ``n_rc`` objects a v6.18 sheaf refill
    took through the CPU slab count as fast or slow paths too (SLUB_STATS does)."""
    st, r = cx.st, cx.r
    slow = _i(rfe) + E + nd
    cx.bump("alloc_fast", na + n_rc - slow)
    cx.bump("alloc_slow", slow)
    cx.bump("sheaf_alloc_replace", sh_slow)
    cx.bump("slab_alloc", t_pg)
    st["pend"] = st["pend"].at[r].add(cnt)
    cx.radd("out", na)
    st["pend_tot"] = cx.whole("pend_tot") + cnt


def _between_halves(cx: _Ctx, k: _Rep, nf, shape):
    """The optimisation barrier between a run's allocation and free halves (no kernel
    function): this rep's rows are written back and the state, the counter increments
    (broadcast to the batch ``shape``), ``nf`` and the free half's random words go through
    ``lax.optimization_barrier``.  Returns ``nf`` and ``k`` with ``w1``/``w2`` past it."""
    st = cx.st
    # a materialisation point between the two halves: XLA then fuses each half on its own
    # (half the compile time, same speed)
    cx.nflush()
    cx.write_rows()
    inc = tuple(jnp.broadcast_to(x, shape) for x in cx.inc)
    st_b, inc, nf, w1, w2 = lax.optimization_barrier((dict(st), inc, nf, k.w1, k.w2))
    st.update(st_b)
    cx.inc = list(inc)
    return nf, k._replace(w1=w1, w2=w2)


# ================================================================ free run


def _free_run(cx: _Ctx, k: _Rep, cfg: SimConfig, nf):
    """The free half of a run: ``nf`` frees (0 when the run allocates), in the run's
    fixed order (docs/MODEL.md): which pending objects (:func:`_pick_pending`), the slabs
    as the run starts (:func:`_slab_layout`), every sheaf free first
    (:func:`_sheaf_free`), then the frees into slabs, which slab_free() and __slab_free()
    do without the sheaves (:func:`_split_slab_frees`): into CPU and per-CPU partial slabs
    (:func:`_frozen_frees`), the node's partial list (:func:`_part_frees`), full slabs
    (:func:`_full_slab_frees`); last the fast and slow path counts."""
    cx.bump("frees", nf)
    k_cs, k_ot, k_all, rem = _pick_pending(cx, k, nf)
    # the origins whose objects go to the sheaves (free_to_pcs(); remote objects bypass
    # them where ``remote_free_bypasses_sheaf``, v6.18 on)
    sh = k.sheaves & ~((cfg.remote_free_bypasses_sheaf > 0) & rem)       # (R, B)
    lay = _slab_layout(cx, k, k_ot, sh)
    _unpend(cx, k_cs, k_all, nf)
    nsh, full_main, xm = _sheaf_free(cx, k, cfg, sh, k_all)
    cx.nflush()
    c_cs, c_pc, xH, xU, xF = _split_slab_frees(cx, k, lay, sh, k_cs, k_ot, xm)
    own_fast = _frozen_frees(cx, c_cs, c_pc)
    _part_frees(cx, xH, xU, lay.on_cls, lay.from_cls)
    _full_slab_frees(cx, k, cfg, lay, xF)

    # FREE_FASTPATH counts every free_to_pcs(), also one that first replaced a full main
    # sheaf (__pcs_replace_full_main(): ``sheaf_free_replace``); a v6.18 flush's objects
    # (``xm``) count as the slab frees they are (do_slab_free(), __slab_free())
    ffast = nsh + own_fast
    cx.bump("free_fast", ffast)
    cx.bump("free_slow", nf + xm - ffast)
    cx.bump("sheaf_free_replace", full_main)


def fifo_split(k, pend, pend_cs):
    """How ``k`` frees of one (allocating, freeing) pair's ``pend`` objects in flight split
    into ``(old, cs)``: objects of the allocator's earlier slabs and objects of its current
    CPU slab (``pend_cs`` of them).  The workload, no kernel function: a pair's objects go
    back in the order they were allocated (a socket's skbs, a block queue's requests, a
    pipe's messages; the lab module's rings, native/lab/slabtune_lab.c, are FIFO), so the
    current CPU slab's objects, the youngest, are freed last.  With more objects in flight
    than a slab holds, frees seldom reach the CPU slab they came from, and an allocator
    whose CPU slab runs dry finds few objects freed back into it (6.1 ___slab_alloc()
    get_freelist(), ``alloc_refill``); drawing uniformly over the pending objects had sent
    half of a block I/O submitter's completions to its current CPU slab: lab bio on 4 CPUs
    of one node, 6.1, 82.7% of allocations fast against 92.3% measured (93.1% FIFO)."""
    old = jnp.minimum(k, pend - pend_cs)
    return old, k - old


def remote_to(mem, mem_home, local, local_home):
    """Whether objects from slabs of memory class ``mem``, node ``mem_home`` of it, are
    remote to a CPU whose numa_mem_id() is class ``local``, node ``local_home``: 7.x
    slab_free() gives them to its sheaves only when ``slab_nid(slab) == numa_mem_id()``
    (v7.0; v6.18 for caches with sheaves).  Nodes of one class are told apart by their
    homes (workloads.rep_homes).  Elementwise; the reference and the C engine test the
    same."""
    return (mem != local) | (mem_home != local_home)


def _pick_pending(cx: _Ctx, k: _Rep, nf):
    """Which of rep ``cx.r``'s pending objects its ``nf`` frees take (the workload, no
    kernel function): systematic points (offset from ``w1``) over the origins' objects
    in flight, then per origin the oldest first (:func:`fifo_split`).  Returns per origin
    rep (R, B) the objects still in its CPU slab ``k_cs``, the others ``k_ot`` and their
    sum ``k_all``, and ``rem``: the origins whose objects are remote to the freeing CPU
    (slab node against its numa_mem_id() as the v7.0 sheaf test sees it; v7.1 lets
    memoryless CPUs use their memory node); counts the remote frees."""
    st, d, r, w1 = cx.st, cx.d, cx.r, k.w1
    # which origins: systematic points over their objects in flight to this rep
    col = st["pend"][:, r]
    T = jnp.maximum(cx.row("pend_tot"), 1)
    k_all = _counts(_systematic(_cumsum(col), nf, _i(w1 >> 1) % T, T, d["max_run"]))
    k_ot, k_cs = fifo_split(k_all, col, st["pend_cs"][:, r])
    rem = remote_to(d["mem_node"], d["mem_home"], d["local_node"][r], d["mem_home"][r])
    cx.bump("remote_free", jnp.sum(jnp.where(rem, k_all, 0), axis=0))
    return k_cs, k_ot, k_all, rem


class _Layout(NamedTuple):
    """The allocated objects on the node classes a free run can reach, by slab, as the
    run starts (shapes: C node classes, ``SEG * R`` rep segments, B configurations)."""

    z: Any          # (SEG*R, B) rep segments: CPU slab, per-CPU partial list
    cls: Any        # (C, B) the node classes (:func:`_pick_classes`)
    on_cls: Any     # per-node (N, B) field -> (C, B)
    from_cls: Any   # (C, B) counts -> per-node (N, B)
    on_seg: Any     # (C, SEG*R, B) rep segment on node class c
    z_end: Any      # (SEG*R, B) a segment's end among its node's segments
    z_tot: Any      # (C, B) end of the rep segments
    p_end: Any      # list of (C, B): ends of the head slab, then levels 3, 2, 1
    tot: Any        # (C, B) end of the full slabs (at least 1)
    own: Any        # (B,) this rep's own older objects freed onto its per-CPU partial list


#: Segments per rep in a free run's split: its CPU slab, its per-CPU partial list (the
#: draining window and every level: its frees go to the window, :func:`_pc_walk`),
#: its per-CPU partial slabs of the other memory node class (the same way).
SEG = 3


def _slab_layout(cx: _Ctx, k: _Rep, k_ot, sh) -> _Layout:
    """The :class:`_Layout` a free run's objects that are no longer in their origin's CPU
    slab are split over (no kernel function: where the objects are); ``sh`` (R, B): the
    origins whose objects go to the sheaves."""
    st, d, objs = cx.st, cx.d, k.objs
    # the slabs on every node class as the run starts, in destination order: per rep its
    # CPU slab (objects not tracked in pend_cs) and its per-CPU partial list; then the
    # node's head slab and partial list by level, fullest first; then its full slabs
    # (each rep segment lies on one node class, its rep's memory node; a segment's end is
    # its cumulative size among its node's segments)
    # The split runs over a leading axis of the node classes the run's picks can land on
    # (:func:`_pick_classes`): all N, or under a static run bound of 1 just the class of
    # the single pick, the one-op model's choice of node (the others get no picks).
    zc = cx.whole("cs_inuse") - cx.whole("cs_tracked")
    zp = cx.whole("pd") + sum(cx.whole(PCU[lv]) for lv in range(1, LEVELS))
    zr = cx.whole("rpd") + sum(cx.whole(RPU[lv]) for lv in range(1, LEVELS))
    own, zp = _own_first(cx.r, k_ot, sh, zp)
    z = jnp.stack([zc, zp, zr], axis=1).reshape((SEG * R,) + zc.shape[1:])
    if d["free_max"] != 1 and d["max_run"] == 1:
        # one pick, a v6.18 flush beside it at most (RunForm(1, ..., optin))
        cls, on_cls, from_cls = _pick_classes(d["mem_node"], jnp.where(sh, 0, k_ot), 1, k.m)
    else:
        cls, on_cls, from_cls = _pick_classes(d["mem_node"], k_ot, d["free_max"])
    on_seg = d["seg_node"][None] == cls[:, None]                        # (C, SEG*R, B)
    cum_n = _cumsum(jnp.where(on_seg, z[None], 0), axis=1)
    z_end = jnp.sum(jnp.where(on_seg, cum_n, 0), axis=0)                 # (SEG*R, B)
    z_tot = cum_n[:, -1]                                                 # (C, B)
    p_end = [z_tot + on_cls(st["hu"])]
    for lv in range(LEVELS - 1, 0, -1):
        p_end.append(p_end[-1] + on_cls(st[NU[lv]]))
    tot = jnp.maximum(p_end[-1] + on_cls(st["full_slabs"]) * objs, 1)
    return _Layout(z, cls, on_cls, from_cls, on_seg, z_end, z_tot, p_end, tot, own)


def _own_first(r, k_ot, sh, zp):
    """How many of rep ``r``'s frees of its own older objects (``k_ot[r]``, those that skip
    the sheaves) go onto its own per-CPU partial list, before the run's other frees are
    spread over the slabs: up to the list's allocated objects ``zp[r]`` as the run
    starts.  Returns that count (B,) and ``zp`` less it.  The workload, no kernel
    function: a CPU that frees its own objects oldest first (local churn) frees into the
    slabs it filled earliest, and the first free into such a full slab put it on this
    CPU's per-CPU partial list (put_cpu_partial(), v3.2 on), so its next frees empty that
    slab, not other CPUs' slabs of the node.  Spread over the node's slabs by their
    objects, a CPU's frees had landed in other CPUs' full slabs, whose partial slabs then
    piled up on its list (drained at cpu_partial_slabs) while the others took new slabs:
    lab local-4cpu-ml, 6.1, 130 KiB of slabs and 1.1 new slabs per kop against 64 KiB
    and none measured.  Frees from other CPUs' objects keep the spread: a sender's slab
    takes the frees of every receiver of its objects."""
    mine = _REPS == r
    self_old = jnp.sum(jnp.where(mine & ~sh, k_ot, 0), axis=0)
    own = jnp.minimum(self_old, jnp.sum(jnp.where(mine, zp, 0), axis=0))
    return own, zp - jnp.where(mine, own, 0)


def _unpend(cx: _Ctx, k_cs, k_all, nf):
    """Take a free run's objects off the books (no kernel function): ``pend`` and
    ``pend_cs`` of every origin rep, its ``cs_tracked`` and ``out``, this rep's
    ``pend_tot``."""
    st, r = cx.st, cx.r
    st["pend"] = st["pend"].at[:, r].add(-k_all)
    st["pend_cs"] = st["pend_cs"].at[:, r].add(-k_cs)
    st["cs_tracked"] = cx.whole("cs_tracked") - k_cs
    st["out"] = cx.whole("out") - k_all
    cx.radd("pend_tot", -nf)


def _sheaf_free(cx: _Ctx, k: _Rep, cfg: SimConfig, sh, k_all):
    """A free run's frees into the per-CPU sheaves, all before its slab frees (v6.18 for
    caches that ask for sheaves, every cache from v7.0; remote objects bypass the sheaf
    where ``remote_free_bypasses_sheaf``, v6.18 on): free_to_pcs() pushes onto the main
    sheaf while it has room; each time it is full, __pcs_replace_full_main() swaps it
    with an empty spare, else puts it into the barn while the barn holds fewer than
    ``barn_max_full`` full sheaves, else flushes its ``cap`` objects to node ``m``'s slabs
    (:func:`_bulk_free`: a list_lock per slab that changes state; 7.x).  A v6.18 opt-in
    cache's flush (6.18 __kmem_cache_free_bulk(): do_slab_free() per slab, the CPU
    slab's freelist or __slab_free()) frees them as the run's slab frees into node ``m``
    (returned as ``xm``, :func:`_split_slab_frees`).  ``sh`` (R, B): the origins whose
    objects go to the sheaves.  Returns the sheaf frees ``nsh``, ``full_main``, the frees
    that found the main sheaf full (each a slow path), and ``xm``."""
    st, cap, capm = cx.st, k.cap, k.capm
    m, own, has_barn = k.m, k.own, k.has_barn
    # -- sheaf frees first (free_to_pcs, __pcs_replace_full_main): the main sheaf, then
    #    one slow path per cap frees: the spare swap, barn puts, flushes
    nsh = jnp.sum(jnp.where(sh, k_all, 0), axis=0)
    main_r, spare_r = cx.row("main"), cx.row("spare")
    over = nsh - jnp.minimum(nsh, cap - main_r)
    full_main = ceil_div(over, capm)
    fswap = (full_main > 0) & (spare_r == 0)
    room = jnp.where(has_barn, jnp.maximum(cfg.barn_max_full - _get(st["barn_full"], own), 0), 0)
    puts = jnp.minimum(full_main - _i(fswap), room)
    fl = full_main - _i(fswap) - puts
    cx.bump("sheaf_free_hit", nsh - full_main)
    cx.bump("barn_put", puts)
    cx.bump("barn_put_fail", jnp.where(has_barn, fl, 0))
    cx.bump("sheaf_flush", fl)
    cx.rset("main", jnp.where(full_main > 0, over - (full_main - 1) * cap, main_r + nsh))
    cx.rset("spare", cap, fswap)
    cx.nadd("barn_empty", own, -jnp.minimum(puts, _get(st["barn_empty"], own)))
    cx.nadd("barn_full", own, puts)
    _bulk_free(cx, m, jnp.where(k.cs_sheaf, 0, fl * cap))
    return nsh, full_main, jnp.where(k.cs_sheaf, fl * cap, 0)


def _split_slab_frees(cx: _Ctx, k: _Rep, lay: _Layout, sh, k_cs, k_ot, xm):
    """Where a free run's objects that skip the sheaves land, which __slab_free() finds
    from the object's slab: an object still in its origin's CPU slab goes there; this
    rep's own older objects onto its own per-CPU partial list first (:func:`_own_first`);
    the others, per node class, by systematic points (offset from ``w2``) over the slabs as
    the run starts (:class:`_Layout`): a slab takes frees in proportion to its allocated
    objects; ``xm`` more (a v6.18 flush) go into node ``m``'s slabs with them.  Returns
    per rep (R, B) the frees into its CPU slab ``c_cs``, (R, 2, B) into its per-CPU
    partial slabs of its memory node and of the other class ``c_pc``, and per node class
    (N, B) those into its head slab ``xH``, per level into its partial list ``xU`` (a list
    by level) and into full slabs ``xF``."""
    d, w2 = cx.d, k.w2
    z, cls, from_cls, on_seg = lay.z, lay.cls, lay.from_cls, lay.on_seg
    z_end, z_tot, p_end, tot = lay.z_end, lay.z_tot, lay.p_end, lay.tot
    # -- objects still in their origin's CPU slab: the CPU's own freelist (fast) or
    #    another CPU's frozen slab (no lock)
    kcs = jnp.where(sh, 0, k_cs)
    kot = jnp.where(sh, 0, k_ot) - jnp.where(_REPS == cx.r, lay.own, 0)
    # -- the other slab frees, per node class: systematic points over the sizes
    on = d["mem_node"][None] == cls[:, None]                             # (C, R, B)
    x = jnp.sum(jnp.where(on, kot[None], 0), axis=1) + jnp.where(cls == k.m, xm, 0)
    un = _i(w2 >> 1) % tot

    def below(end, n_, u_, t_):          # points of a node's run below a segment end
        return _below(end, n_, u_, t_, d["free_max"])

    def at_seg(v):                       # a node class's value at each of its segments
        return jnp.sum(jnp.where(on_seg, v[:, None], 0), axis=0)

    xs, us, ts = at_seg(x), at_seg(un), at_seg(tot)
    cz = (below(z_end, xs, us, ts) - below(z_end - z, xs, us, ts)).reshape(
        (R, SEG) + z.shape[1:])
    c_cs = kcs + cz[:, 0]
    # (R, 2, B): its memory node's, the other class's; this rep's own first (_own_first)
    c_pc = jnp.stack([cz[:, 1] + jnp.where(_REPS == cx.r, lay.own, 0), cz[:, 2]], axis=1)
    ends = [below(e, x, un, tot) for e in [z_tot] + p_end]
    xH = from_cls(ends[1] - ends[0])
    xU = [None] + [from_cls(ends[LEVELS + 1 - lv] - ends[LEVELS - lv])
                   for lv in range(1, LEVELS)]
    xF = from_cls(x - ends[-1])                  # the last segment takes the rest
    return c_cs, c_pc, xH, xU, xF


#: The lag sum :func:`pc_window` divides is capped here (exact float32 division; a
#: window this wide is wider than any per-CPU partial list).
LAG_SUM_MAX = (1 << 23) - 1


def pc_window(pend, lag_mul, freers, objs):
    """How many of a per-CPU partial list's slabs are partly freed at a time, its
    draining window (at least 1), from the objects in flight ``pend`` (R, R, ...) as a
    step starts.  A sender's slab goes on the per-CPU partial list of the freer that
    frees into it first (put_cpu_partial(), 6.1 and 6.12 mm/slub.c __slab_free()); its
    other objects come back from the freers behind, each in the sender's order, so it
    empties when the freer most behind has passed it.  A sender whose freers lag it by
    between ``lo`` and ``hi`` allocations (:func:`slabtune.model.workloads.lag_weights`)
    keeps ``(hi - lo) / objs`` slabs partly freed; the window is that sum over senders,
    shared by the ``freers`` reps' lists, plus the one slab being freed.  No fitted
    constant: lab ``pc-8cpu-2node-order0`` on 6.1 keeps 11.8 of a drained list's 13 slabs
    partly used, the model's pend gives a window of about 14 (docs/LAB.md)."""
    on = lag_mul > 0
    lag = jnp.minimum(pend, workloads.LAG_PEND_MAX) * lag_mul
    hi = jnp.max(jnp.where(on, lag, 0), axis=1)
    lo = jnp.min(jnp.where(on, lag, jnp.iinfo(jnp.int32).max), axis=1)
    spread = jnp.where(jnp.any(on, axis=1), (hi - lo) >> workloads.LAG_BITS, 0)
    tot = jnp.minimum(jnp.sum(spread, axis=0), LAG_SUM_MAX)
    return 1 + floor_div(tot, objs * jnp.maximum(freers, 1))


def _pc_free_one(s, u, pd, pw, x, win, half):
    """``x`` (0 or 1) frees into a per-CPU partial list: levels ``s``/``u`` and its
    draining window of ``pw`` slabs holding ``pd`` objects.  The kernel's freers free a
    slab's objects in the order they were allocated, so slabs empty while on the list
    (6.1 __slab_free(): the slab is frozen, no lock, it stays listed; 6.12
    __slab_free(): not frozen, ``!new.inuse`` takes the node's list_lock and, as ``prior
    && !on_node_partial``, leaves it listed); the emptied slabs count on level 0, where
    the list's drain (__unfreeze_partials(), 6.1; __put_partials(), 6.12) discards them
    while the node keeps min_partial.  Several freers at different distances behind
    (:func:`pc_window`) free into ``win`` slabs at once, the oldest furthest along: a
    free that finds fewer than ``win`` slabs in the window first starts the least used
    partial slab (lowest level >= 1, its ``q`` slabs first); the window's slabs hold
    ``half = objs // 2`` objects each behind its oldest, so the oldest is empty when
    ``pd`` falls to ``half * (pw - 1)`` (a take or a drain sees the window's objects
    spread evenly, :func:`_even`).  With ``win`` 1 this is one slab at a time.
    Returns the new levels, window and the slabs emptied.  Elementwise (any shape); the
    same as RefSim._pc_free."""
    pull = (x > 0) & (pw < win)
    h, found = _i(0), pull & False
    s, u = list(s), list(u)
    for k in range(1, LEVELS):
        here = pull & ~found & (s[k] > 0)
        qk = floor_div(u[k], jnp.maximum(s[k], 1))
        h = jnp.where(here, qk, h)
        s[k] = s[k] - _i(here)
        u[k] = u[k] - jnp.where(here, qk, 0)
        found = found | here
    pd = pd + h - x
    pw = pw + _i(found)
    emptied = _i((x > 0) & (pw > 0) & (pd <= half * (pw - 1)))
    s[0] = s[0] + emptied
    return s, u, pd, pw - emptied, emptied


def _pc_walk(s, u, pd, pw, x, win, half, n_max):
    """``x`` (at most ``n_max``, a static bound) frees into a per-CPU partial list, one
    after another by :func:`_pc_free_one`: a loop of masked frees, as many as the largest
    ``x`` of the arrays (the window's starts and empties interleave with the slabs'
    objects, which no block walk holds).  Returns the new levels, window and the slabs
    emptied."""
    if n_max == 1:
        return _pc_free_one(s, u, pd, pw, x, win, half)
    zero = _i(0) * pd

    def body(c):
        i, s_, u_, pd_, pw_, e_ = c
        s2, u2, pd2, pw2, e2 = _pc_free_one(s_, u_, pd_, pw_, _i(i < x), win, half)
        return i + 1, s2, u2, pd2, pw2, e_ + e2

    top = jnp.minimum(jnp.max(x), n_max)
    _, s, u, pd, pw, emptied = lax.while_loop(
        lambda c: c[0] < top, body, (_i(0), list(s), [zero] + list(u[1:]), pd, pw, zero))
    return s, u, pd, pw, emptied


def _frozen_frees(cx: _Ctx, c_cs, c_pc):
    """Frees into CPU slabs and per-CPU partial slabs: into this CPU's own CPU slab,
    slab_free()'s fast path onto its freelist; into another CPU's, __slab_free() onto the
    frozen slab's freelist (``cs_rfree``, which its owner takes on its next slow path);
    into per-CPU partial slabs (``c_pc`` per rep, of its memory node and of the other
    memory class, each list by :func:`_pc_walk` in its draining window), __slab_free()
    without the lock while they are frozen (v3.2 to v6.7); from v6.8 (``pc_empty_locks``,
    folded into ``d["pc_lock_onehot"]``) a free that empties one takes the list_lock of
    its node (the slab's, remote ones included) and leaves it on the per-CPU list (6.12
    mm/slub.c __slab_free(): not on the node's partial list).  Returns the fast frees."""
    st, r = cx.st, cx.r
    mine = _REPS == r
    st["cs_inuse"] = cx.whole("cs_inuse") - c_cs
    st["cs_rfree"] = cx.whole("cs_rfree") + jnp.where(mine, 0, c_cs)
    d = cx.d
    lists = ((PCS, PCU, "pd", "pw", c_pc[:, 0]), (RPS, RPU, "rpd", "rpw", c_pc[:, 1]))
    vals = []
    for fs, fu, fd, fw, c in lists:
        s = [cx.whole(f) for f in fs]
        u = [_i(0)] + [cx.whole(f) for f in fu[1:]]
        s, u, pd, pw, emptied = _pc_walk(s, u, cx.whole(fd), cx.whole(fw), c, d["win"],
                                         d["half"], d["free_max"])
        vals += s + u[1:] + [pd, pw, emptied]
    out = _materialize(vals, cx.d["zero"])         # one barrier for both lists
    w = len(vals) // 2
    for (fs, fu, fd, fw, _), o in zip(lists, (out[:w], out[w:])):
        for lv in range(LEVELS):
            st[fs[lv]] = o[lv]
            if lv:
                st[fu[lv]] = o[LEVELS - 1 + lv]
        st[fd] = o[-3]
        st[fw] = o[-2]
    # per node class: the reps' memory (other memory) nodes as a one-hot (N, R) selecting
    # the counts of their own (remote) slabs
    cx.lock_nodes(jnp.sum(jnp.where(cx.d["pc_lock_onehot"] > 0, out[w - 1][None], 0)
                          + jnp.where(cx.d["rpc_lock_onehot"] > 0, out[-1][None], 0), axis=1))
    own_fast = jnp.sum(jnp.where(mine, c_cs, 0), axis=0)
    cx.radd("cs_free", own_fast)
    return own_fast


def _full_slab_frees(cx: _Ctx, k: _Rep, cfg: SimConfig, lay: _Layout, xF):
    """``xF[n]`` frees (N, B) into full slabs of node class n: __slab_free() makes each
    slab partial, frozen onto this CPU's per-CPU partial list whatever the slab's node and
    without a list_lock (put_cpu_partial(), v3.2 to v6.18: 6.1 mm/slub.c __slab_free(),
    ``kmem_cache_has_cpu_partial(s) && !prior``; 6.12 the same without freezing):
    :func:`_full_to_cpu_partial`, node class 0's frees before node class 1's; without a
    per-CPU partial list the slab is added to the tail of the node's partial list under
    its list_lock (add_partial(..., DEACTIVATE_TO_TAIL), 6.1; ADD_TO_TAIL, 7.2), at the
    top fill level (``objs - 1`` objects; with one object per slab the now empty slab is
    freed, discard_slab(), once the node keeps min_partial: ``free_mp``).  Frees beyond
    a node's full slabs go into the slabs the run has just made partial, at the top
    level: this CPU's per-CPU partial slabs of that node while they hold objects
    (:func:`_pc_walk`), else the node's list (:func:`_part_frees`); with one op per run
    there are none."""
    st, objs, cps, mp, m = cx.st, k.objs, k.cps, k.mp, k.m
    on_cls, from_cls = lay.on_cls, lay.from_cls
    top = cx.d["top"]
    F = st["full_slabs"]
    xF1 = jnp.minimum(xF, jnp.maximum(F, 0))
    xF2 = xF - xF1
    cpp = (cps > 0) & (cfg.cpu_slab > 0)                                # (B,)
    xnp = jnp.where(cpp, 0, xF1)
    st["full_slabs"] = F - xF1
    S = _node_total(st)
    keep = jnp.where(objs == 1, jnp.clip(mp - S, 0, xnp), xnp)
    for lv in range(LEVELS):
        st[NS[lv]] = st[NS[lv]] + jnp.where(top == lv, keep, 0)
        if lv:
            st[NU[lv]] = st[NU[lv]] + jnp.where(top == lv, keep * (objs - 1), 0)
    cx.bump("slab_free", jnp.sum(xnp - keep, axis=0))
    cx.lock_nodes(xnp)
    if cx.d["free_max"] == 1:
        # one free at most: into a full slab of its memory node or of the other class
        x = jnp.where(cpp, jnp.sum(xF1, axis=0), 0)
        rem = jnp.sum(jnp.where(_NODES != m, xF1, 0), axis=0) > 0
        _full_to_cpu_partial(cx, m, x, rem)
        return
    o = cx.d["other"][cx.r]
    # slabs come from memory node classes 0 and 1; one pick with a v6.18 flush beside it
    # at most lands on the layout's one class (:func:`_pick_classes`)
    one = lay.cls.shape[0] == 1
    for c in ([lay.cls[0]] if one else (0, 1)):
        rem = m != c
        at = (lambda v, c=c: _get(v, c)) if one else (lambda v, c=c: v[c])
        _full_to_cpu_partial(cx, m, jnp.where(cpp, at(xF1), 0), rem)
        xm2 = jnp.where(cpp, at(xF2), 0)
        ls = [jnp.where(rem, cx.row(b), cx.row(a)) for a, b in zip(PCS, RPS)]
        lu = [_i(0)] + [jnp.where(rem, cx.row(b), cx.row(a))
                        for a, b in zip(PCU[1:], RPU[1:])]
        lpd = jnp.where(rem, cx.row("rpd"), cx.row("pd"))
        lpw = jnp.where(rem, cx.row("rpw"), cx.row("pw"))
        into_pc = jnp.minimum(xm2, lpd + sum(lu[1:]))
        s, u, pd, pw, emptied = _pc_walk(ls, lu, lpd, lpw, into_pc, cx.d["win"],
                                         cx.d["half"], cx.d["free_max"])
        cx.rset("pd", pd, ~rem)
        cx.rset("rpd", pd, rem)
        cx.rset("pw", pw, ~rem)
        cx.rset("rpw", pw, rem)
        for lv in range(LEVELS):
            cx.rset(PCS[lv], s[lv], ~rem)
            cx.rset(RPS[lv], s[lv], rem)
            if lv:
                cx.rset(PCU[lv], u[lv], ~rem)
                cx.rset(RPU[lv], u[lv], rem)
        lk = jnp.where(cx.d["pc_empty_locks"], emptied, 0)
        cx.lock(m, jnp.where(rem, 0, lk))
        cx.lock(o, jnp.where(rem, lk, 0))
        cx.nflush()
        rest = jnp.where(_NODES == c, jnp.where(cpp, xm2 - into_pc, at(xF2)), 0)  # (N, B)
        _part_frees(cx, _i(0) * rest, [None] + [jnp.where(top == lv, rest, 0)
                                               for lv in range(1, LEVELS)], on_cls, from_cls)


def _write_counters(cx: _Ctx, shape):
    """End of a run (no kernel function): the list_lock acquisitions go onto their node
    classes, this rep's rows are written back, and its counter increments (broadcast to
    the batch ``shape``) are added to its column of ``counts``."""
    st, r = cx.st, cx.r
    cx.nflush()
    cx.flush_locks()
    cx.write_rows()
    st["counts"] = st["counts"].at[:, r].add(jnp.stack([jnp.broadcast_to(x, shape)
                                                        for x in cx.inc]))


def _node_total(st):
    """Slabs on every node class's partial list (N, B): its levels and its head slab."""
    return sum(st[f] for f in NS) + st["hs"]


def fifo_frees(s, u, hs, hu, c):
    """``c`` frees into a node's partial list in the order its slabs were put there: every
    free goes to the list's head slab (``hs``, ``hu`` allocated objects); with none, the
    free first makes the least used partial slab the head (the lowest level >= 1, its
    ``q`` slabs first, :func:`_spread`), so the list's slabs empty one after another and
    each free that takes a head slab's last object empties one slab.  The kernel's lists
    are FIFO: add_partial() puts a slab a CPU drains or a free makes partial at the tail
    (6.1 mm/slub.c __unfreeze_partials() and __slab_free(): DEACTIVATE_TO_TAIL / the
    ``tail`` of __add_partial(); 7.2 ADD_TO_TAIL), get_partial_node() walks from the head,
    and objects are freed oldest first (workloads: FIFO per pair, :func:`fifo_split`), so
    the slab at the head, the oldest, holds the oldest objects and takes the frees until
    it is empty.  Spread evenly over a level instead, a slab emptied only when its whole
    level averaged one object (lab pc-16cpu-4node-order1, 6.1: 0.46 new slabs per kop
    predicted against 2.18).  Returns the new levels, head slab and the slabs emptied
    (counted on level 0; the caller applies the discard rule).  Elementwise; the same as
    RefSim._fifo_free one free at a time (a closed-form walk over the head and the
    levels' blocks, :func:`_walk_objects`)."""
    q, r = _spread(s, u)
    n = [hs]
    y = [jnp.where(hs > 0, hu, 0)]
    for k in range(1, LEVELS):
        n += [s[k] - r[k], r[k]]
        y += [q[k], q[k] + 1]
    tot = sum(nj * yj for nj, yj in zip(n, y))
    c = jnp.minimum(c, tot)
    full, taken, rem, y_at = _walk_objects(n, y, c)
    e = sum(full)
    tk = [_i(0)] + taken[1:]
    sl, ul = _level_slabs(tk), _level_loss(tk, q)
    s = [s[0] + e] + [s[k] - sl[k] for k in range(1, LEVELS)]
    u = [u[0]] + [u[k] - ul[k] for k in range(1, LEVELS)]
    go = c > 0
    hs2 = jnp.where(go, _i(rem > 0), hs)
    hu2 = jnp.where(go, jnp.where(rem > 0, y_at - rem, 0), hu)
    return s, u, hs2, hu2, e


def _part_frees(cx: _Ctx, xh, x, on_cls, from_cls):
    """Frees (N, B) into node n's partial list: ``xh[n]`` found their objects in its head
    slab, ``x[k][n]`` in its slabs of level k.  Where the cache has a CPU slab
    (``d["fifo_node"]``, every era before v7.0) they land in the list's order
    (:func:`fifo_frees`); in a sheaf-only cache (v7.0 on) the head slab is the one a
    refill left partly used (:func:`_bulk_take`), whose objects went to the sheaves last,
    so the frees stay where the layout put them: into the head slab and, per level,
    spread over its slabs (:func:`_cascade`; FIFO there predicted 5-7 new slabs per kop
    on 7.2 pc/rr/bio-8cpu-2node against 0-0.14 measured).  A free that takes a slab's
    last object takes the list_lock and discards the slab while the node keeps at least
    min_partial partial slabs (__slab_free(): ``!new.inuse && n->nr_partial >=
    s->min_partial``, 6.1 to 7.2; ``>`` in v3.1; every such slab before v3.1:
    ``free_mp``, SimConfig.free_discard_offset; a kept empty slab stays on the list,
    level 0).  Worked out on the node classes the frees can reach (``on_cls``/``from_cls``
    of :func:`_pick_classes`)."""
    st, mp = cx.st, on_cls(cx.d["free_mp"])
    S = on_cls(_node_total(st))
    hs, hu = on_cls(st["hs"]), on_cls(st["hu"])
    xh = on_cls(xh)
    xl = [None] + [on_cls(v) for v in x[1:]]
    s0 = [on_cls(st[f]) for f in NS]
    u0 = [_i(0)] + [on_cls(st[f]) for f in NU[1:]]
    fifo = cx.d["fifo_node"]
    sf, uf, hsf, huf, ef = fifo_frees(s0, u0, hs, hu, xh + sum(xl[1:]))
    emp_h = _i((hs > 0) & (xh > 0) & (hu == xh))
    sc, uc, emptied = _cascade([s0[0] + emp_h] + s0[1:], u0, xl, cx.d["lo"])
    s = [jnp.where(fifo, a, b) for a, b in zip(sf, sc)]
    u = [u0[0]] + [jnp.where(fifo, a, b) for a, b in zip(uf[1:], uc[1:])]
    hs2 = jnp.where(fifo, hsf, hs - emp_h)
    hu2 = jnp.where(fifo, huf, hu - xh)
    e = jnp.where(fifo, ef, emp_h + emptied)
    disc = jnp.clip(S - mp + 1, 0, e)
    s[0] = s[0] - disc
    out = _materialize(s + u[1:] + [hs2, hu2, e, disc], cx.d["zero"])
    s, u = out[:LEVELS], [u[0]] + out[LEVELS:2 * LEVELS - 1]
    hs2, hu2, e, disc = out[2 * LEVELS - 1:]
    for lv in range(LEVELS):
        st[NS[lv]] = st[NS[lv]] + from_cls(s[lv] - s0[lv])
        if lv:
            st[NU[lv]] = st[NU[lv]] + from_cls(u[lv] - u0[lv])
    st["hs"] = st["hs"] + from_cls(hs2 - hs)
    st["hu"] = st["hu"] + from_cls(hu2 - hu)
    cx.bump("slab_free", jnp.sum(disc, axis=0))
    cx.lock_nodes(from_cls(e))


def _bc(*xs):
    """The values broadcast to one common shape, as int32 (rows of a stacked table)."""
    return [jnp.broadcast_to(_i(x), jnp.broadcast_shapes(*(jnp.shape(y) for y in xs)))
            for x in xs]


def _full_to_cpu_partial(cx: _Ctx, m, x, rem):
    """``x`` frees, each into a full slab of one node class, which then goes on this rep's
    per-CPU partial list at the top fill level (put_cpu_partial(), 6.1 and 6.12
    mm/slub.c): of its memory node ``m``, or where ``rem`` of the other memory class
    (``d["other"]``, item 5b).  A list already holding cpu_partial_slabs slabs, of either
    node, is first drained (unfreeze_partials(): each slab onto its own node's list under
    that node's list_lock, the draining windows' slabs among them at their levels, empty
    ones kept up to min_partial; one lock per node class on the list,
    :meth:`RefSim._drain`), so drains come every cpu_partial_slabs frees after the
    first."""
    st, objs, lo = cx.st, cx.d["objs"], cx.d["lo"]
    top = cx.d["top"]
    cps = _i(cx.d["cps"])
    o = cx.d["other"][cx.r]
    mp_m, mp_o = _get(cx.d["min_partial"], m), _get(cx.d["min_partial"], o)
    parts = []                           # (slabs, objects, window objects, window slabs)
    for fs, fu, fd, fw in ((PCS, PCU, "pd", "pw"), (RPS, RPU, "rpd", "rpw")):
        parts.append(([cx.row(f) for f in fs], [_i(0)] + [cx.row(f) for f in fu[1:]],
                      cx.row(fd), cx.row(fw)))
    p = sum(sum(s) + pw for s, _, _, pw in parts)
    t1 = jnp.maximum(cps - p, 0) + 1                 # the free that drains first
    D = jnp.where(x >= t1, 1 + floor_div(x - t1, jnp.maximum(cps, 1)), 0)
    drained = D > 0
    on_top = [top == lv for lv in range(LEVELS)]

    def first(part, mine):
        """A part of the list the first drain moves: as the run found it (its window's
        slabs at their levels, its objects spread evenly over them: ``pw - wr`` slabs of
        ``wq``, ``wr`` of ``wq + 1``), plus t1 - 1 top-level slabs where the pushes are of
        its node."""
        s, u, pd, pw = part
        wq, wr = _even(pw, pd)
        on_q = [(pw > wr) & (_level_of(wq, lo) == lv) for lv in range(LEVELS)]
        on_q1 = [(wr > 0) & (_level_of(wq + 1, lo) == lv) for lv in range(LEVELS)]
        add = jnp.where(mine, t1 - 1, 0)
        s1 = [s[lv] + jnp.where(on_q[lv], pw - wr, 0) + jnp.where(on_q1[lv], wr, 0)
              + jnp.where(on_top[lv], add, 0) for lv in range(LEVELS)]
        u1 = [None] + [u[lv] + jnp.where(on_q[lv], (pw - wr) * wq, 0)
                       + jnp.where(on_q1[lv], wr * (wq + 1), 0)
                       + jnp.where(on_top[lv], add * (objs - 1), 0) for lv in range(1, LEVELS)]
        return s1, u1

    (sL, uL), (sR, uR) = first(parts[0], ~rem), first(parts[1], rem)
    S_m = sum(cx.nget(f) for f in NS) + cx.nget("hs")
    S_o = _get(_node_total(st), o)
    neL, neR = sum(sL[1:]), sum(sR[1:])
    keepL = jnp.clip(mp_m - (S_m + neL), 0, sL[0])
    keepR = jnp.clip(mp_o - (S_o + neR), 0, sR[0])
    ne_s = jnp.where(top > 0, cps, 0)                # later drains: cps top slabs each
    e_s = cps - ne_s
    S2 = jnp.where(rem, S_o + neR + keepR, S_m + neL + keepL)
    keep_s = jnp.clip(jnp.where(rem, mp_o, mp_m) - (S2 + (D - 1) * ne_s), 0, (D - 1) * e_s)
    later = (D - 1) * cps
    left = jnp.where(drained, 1 + x - t1 - (D - 1) * cps, x)
    lockL = _i(drained & (neL + sL[0] > 0)) + jnp.where(drained & ~rem, D - 1, 0)
    lockR = _i(drained & (neR + sR[0] > 0)) + jnp.where(drained & rem, D - 1, 0)
    D, keepL, keepR, keep_s, later, left, lockL, lockR = _materialize(
        [D, keepL, keepR, keep_s, later, left, lockL, lockR], cx.d["zero"])
    drained = D > 0
    # node m takes the first drain's local part and the later drains of local pushes;
    # the other class the remote part and the later drains of remote pushes
    for node_m, s1, u1, keep1, mine in ((True, sL, uL, keepL, ~rem),
                                        (False, sR, uR, keepR, rem)):
        later_x = jnp.where(mine, later, 0)
        add = [jnp.where(drained, keep1 + jnp.where(mine, keep_s, 0), 0)]
        add += [jnp.where(drained, s1[lv] + jnp.where(on_top[lv], later_x, 0), 0)
                for lv in range(1, LEVELS)]
        addu = [None] + [jnp.where(drained, u1[lv] + jnp.where(
            on_top[lv], later_x * (objs - 1), 0), 0) for lv in range(1, LEVELS)]
        for lv in range(LEVELS):
            if node_m:
                cx.nset(NS[lv], cx.nget(NS[lv]) + add[lv])
                if lv:
                    cx.nset(NU[lv], cx.nget(NU[lv]) + addu[lv])
            else:
                st[NS[lv]] = _add(st[NS[lv]], o, add[lv])
                if lv:
                    st[NU[lv]] = _add(st[NU[lv]], o, addu[lv])
    cx.bump("slab_free", jnp.where(drained, sL[0] - keepL + sR[0] - keepR
                                   + (D - 1) * e_s - keep_s, 0))
    cx.bump("cpu_partial_drain", D)
    cx.lock(m, lockL)
    cx.lock(o, lockR)
    for f in ("pd", "rpd", "pw", "rpw"):
        cx.rset(f, 0, drained)
    for lv in range(LEVELS):
        for fs, fu, (ps, pu, _, _), mine in ((PCS, PCU, parts[0], ~rem),
                                          (RPS, RPU, parts[1], rem)):
            add = jnp.where(on_top[lv] & mine, left, 0)
            cx.rset(fs[lv], jnp.where(drained, add, ps[lv] + add))
            if lv:
                cx.rset(fu[lv], jnp.where(drained, add * (objs - 1), pu[lv] + add * (objs - 1)))


def _bulk_take(cx: _Ctx, m, t, use_list):
    """Allocate ``t`` objects from node ``m`` (refill_objects() of a sheaf, or single
    ___slab_alloc() calls, 7.2 mm/slub.c): the head slab first, then whole slabs from the
    list's head, emptiest first (get_partial_node_bulk() walks the list from its head),
    then new slabs from the page allocator; slabs used up are full, a last one partly used
    stays at the list's head (alloc_from_new_slab(): ADD_TO_HEAD), where the next take
    continues it, so single takes fill one slab after another as a bulk take does.
    Without ``use_list`` (a CPU of a memoryless node whose run found the list at or below
    its floor, :func:`node_list_floor`) every object comes from new slabs; when they leave
    a new head slab, the old one stays on the list behind it, an ordinary partial slab.
    It takes from the class's whole list, not its node's share (:func:`home_share`),
    which overshot 7.2's memory on four nodes."""
    objs, lo = cx.d["objs"], cx.d["lo"]
    s, u, hs, hu = _node_levels(cx)
    q, r = _spread(s, u)
    nb, yb = _level_blocks(s, u, q, r, objs)
    aside = ~use_list & (hs > 0) & (t > 0)
    n = [jnp.where(use_list, x, 0) for x in [hs] + nb] + [t]
    y = [objs - hu] + yb + [objs]
    full, taken, rem, y_at = _walk_objects(n, y, t)
    tk = taken[1:-1]
    sl, ul = _level_slabs(tk), _level_loss(tk, q)
    back = aside & (rem > 0)
    lv_h = _level_of(hu, lo)
    for lv in range(LEVELS):
        add = _i(back & (lv_h == lv))
        cx.nset(NS[lv], s[lv] - sl[lv] + add)
        if lv:
            cx.nset(NU[lv], u[lv] - ul[lv] + add * hu)
    cx.nset("hs", jnp.where(t > 0, _i((rem > 0) | aside), hs))
    cx.nset("hu", jnp.where(t > 0, jnp.where(rem > 0, objs - y_at + rem,
                                             jnp.where(aside, hu, 0)), hu))
    cx.nset("full_slabs", cx.nget("full_slabs") + sum(full))
    cx.bump("slab_alloc", taken[-1])
    return n, y, rem


def _refill_locks(n, y, rfl, cap, rem, max_run):
    """The list_locks of ``rfl`` sheaf refills of ``cap`` objects each taken one after
    another from the blocks ``n``, ``y`` of :func:`_bulk_take` (head slab, partial slabs,
    new slabs; ``rem`` the objects the whole take left in a partly used slab).  Per refill
    (7.2.13 refill_objects()): one in get_partial_node_bulk() when the node's partial list
    is not empty, one when the refill ends in a partly used slab (a partial slab's surplus
    returned by __slab_try_return_freelist(), or a new slab put on the list by
    alloc_from_new_slab()).  Refill i ends on a slab end when ``i * cap`` is a block
    boundary; the list is empty at its start when the partial slabs' free objects ``P``
    are used up and refill i - 1 ended on a slab end.  So the locks are
    ``min(rfl, ceil(P / cap))`` plus, over i = 1..rfl, ``e_i`` (refill i ends inside a
    slab) plus ``e_i`` again for i < rfl with ``i * cap > P``.  ``e_rfl`` is ``rem > 0``;
    the inner ends are walked one by one (a loop of at most ceil(b / cap) - 1 rounds,
    none where every run refills at most once, as at b = 1)."""
    P = sum(nj * yj for nj, yj in zip(n[:-1], y[:-1]))
    capm = jnp.maximum(cap, 1)
    locks = jnp.minimum(rfl, ceil_div(P, capm)) + _i((rfl > 0) & (rem > 0))
    if max_run == 1:
        return locks

    def inner(c):
        i, acc = c
        x = i * cap
        _, o_before, _, y_at = _block_walk(n, y, x)
        e = _i((i < rfl) & ((x - o_before) % jnp.maximum(y_at, 1) != 0))
        return i + 1, acc + e * (1 + _i(x > P))

    _, acc = lax.while_loop(lambda c: c[0] < jnp.max(rfl), inner, (_i(1), locks * 0))
    return locks + acc


def _bulk_free(cx: _Ctx, m, k):
    """Free ``k`` objects (a run's flushed sheaves, __kmem_cache_free_bulk(), 7.2) into
    node ``m``'s slabs: split over its partial slabs in proportion to their objects
    (points at 0, tot/k, ...: the head slab, then the levels from the fullest down,
    :func:`_cascade`), the rest into full slabs (which become partial: all but the last
    emptied); empty slabs beyond min_partial are discarded.  One list_lock per slab that
    changes state (7.2 __kmem_cache_free_bulk(): one __slab_free() per slab, locking for
    a full slab made partial or a slab made empty; a partial slab that stays partial
    takes none), so a flush may take none."""
    objs, lo = cx.d["objs"], cx.d["lo"]
    s, u, hs, hu = _node_levels(cx)
    segs = [hu] + [u[lv] for lv in range(LEVELS - 1, 0, -1)]
    cum = _cumsum(jnp.stack(_bc(*segs)))
    tot = cum[-1]
    x = jnp.minimum(k, tot)
    pts = jnp.clip(ceil_div(cum * x, jnp.maximum(tot, 1)), 0, x)
    c = _materialize(list(_counts(pts)) + [x], cx.d["zero"])
    c, x = c[:LEVELS], c[LEVELS]
    emp_h = _i((hs > 0) & (c[0] > 0) & (hu == c[0]))
    s2, u2, emptied = _cascade([s[0] + emp_h] + s[1:], u,
                         [None] + [c[LEVELS - lv] for lv in range(1, LEVELS)], lo)
    F = cx.nget("full_slabs")
    yv = jnp.minimum(k - x, F * objs)
    g = ceil_div(yv, objs)
    h = g * objs - yv
    lv_h = _level_of(h, lo)
    s2[0] = s2[0] + jnp.maximum(g - 1, 0)
    for lv in range(LEVELS):
        add = _i((g > 0) & (lv_h == lv))
        s2[lv] = s2[lv] + add
        if lv:
            u2[lv] = u2[lv] + add * h
    S = sum(s2) + hs - emp_h
    drop = jnp.where(k > 0, jnp.clip(S - _get(cx.d["min_partial"], m), 0, s2[0]), 0)
    s2[0] = s2[0] - drop
    out = _materialize(s2 + u2[1:] + [drop, g, emp_h + emptied + g], cx.d["zero"])
    s2, u2 = out[:LEVELS], [u2[0]] + out[LEVELS:2 * LEVELS - 1]
    drop, g, chg = out[2 * LEVELS - 1:]
    for lv in range(LEVELS):
        cx.nset(NS[lv], s2[lv])
        if lv:
            cx.nset(NU[lv], u2[lv])
    cx.nset("hs", hs - emp_h)
    cx.nset("hu", hu - c[0])
    cx.nset("full_slabs", F - g)
    cx.bump("slab_free", drop)
    cx.lock(m, chg)


class RunForm(NamedTuple):
    """The static form a batch is compiled for (:func:`run_form`): ``alloc`` bounds a
    run's allocations and the frees it picks (``ops_per_step``), ``free`` the slab frees
    one run can make (a v6.18 flush adds ``cap`` to one free), ``optin`` whether any
    configuration is a v6.18 opt-in cache (sheaves beside a CPU slab); without one the
    refill-through-the-CPU-slab and flush-as-slab-frees terms are not traced at all."""

    alloc: int
    free: int
    optin: bool


def _as_form(max_run) -> RunForm:
    """A :class:`RunForm` from a static run bound: an int ``b`` bounds both halves and
    keeps the opt-in terms (what a caller's own jit gets)."""
    if isinstance(max_run, RunForm):
        return max_run
    return RunForm(int(max_run), int(max_run), True)


#: The forms, narrowest first: one-op runs without opt-in caches; v6.18 opt-in caches at
#: one op per step; runs of more than one op.
_FORMS = (RunForm(1, 1, False), RunForm(1, MAX_OPS_PER_STEP, True),
          RunForm(MAX_OPS_PER_STEP, MAX_OPS_PER_STEP, True))


def _form_kinds(cfgs: SimConfig) -> np.ndarray:
    """Per configuration (concrete, batch-major), the index into :data:`_FORMS` of the
    narrowest form exact for it: one-op runs without opt-in caches trace the one-op model
    (:func:`_below`); a v6.18 opt-in cache at one op per step keeps one-op picks but the
    general slab-free split (its flush frees ``cap`` objects at once); ``ops_per_step``
    above 1 needs the general runs."""
    b = np.asarray(cfgs.ops_per_step).reshape(-1)
    return np.where(b > 1, 2, np.where(_general(cfgs).reshape(-1), 1, 0))


def run_form(cfgs: SimConfig) -> RunForm:
    """The cheapest :class:`RunForm` that is exact for every configuration of the
    concrete batch ``cfgs`` (:func:`_form_kinds`)."""
    return _FORMS[int(_form_kinds(cfgs).max())]


def _concrete(cfgs: SimConfig) -> bool:
    """Whether the fields :func:`run_form` reads are concrete (not traced)."""
    return not any(isinstance(x, jax.core.Tracer)
                   for x in (cfgs.ops_per_step, cfgs.sheaf_capacity, cfgs.cpu_slab))


def _derived(cfg: SimConfig, max_run=MAX_OPS_PER_STEP) -> dict:
    """Per-run constants of the step (computed once, outside the scan); ``max_run`` is the
    static run bound of the batch (:func:`run_bound`, an int) or its :class:`RunForm`,
    kept as Python values."""
    form = _as_form(max_run)
    objs = _i(cfg.objs_per_slab)
    node = _i(cfg.rep_node)
    mem = _i(cfg.rep_mem_node)
    memless = cfg.rep_memoryless > 0
    barn_at = (cfg.barns == BARNS_ALL) | ((cfg.barns == BARNS_MEMORY) & (cfg.node_has_memory > 0))
    use_sh = cfg.memoryless_cpus_use_sheaves > 0
    mp = node_min_partial(_i(cfg.min_partial), _i(cfg.list_nodes))
    return dict(
        objs=objs,
        zero=_i(objs < 0),
        lo=_levels(objs),
        top=_level_of(objs - 1, _levels(objs)),
        pc_empty_locks=cfg.pc_empty_locks > 0,
        take_objects=cfg.take_objects > 0,
        # node list frees in the list's order where the cache has a CPU slab (_part_frees)
        fifo_node=cfg.cpu_slab > 0,
        # objects per slab of a per-CPU partial list's window behind its oldest
        # (_pc_free_one); the window's width is each step's own (step(), pc_window)
        half=objs >> 1,
        # per node class (N,): min_partial for the lists the class's list sums
        min_partial=mp,
        list_nodes=_i(cfg.list_nodes),
        # the partial slabs at which __slab_free() discards a slab it empties
        free_mp=mp + _i(cfg.free_discard_offset),
        cps=_i(cfg.cpu_partial_slabs),
        b=_i(cfg.ops_per_step),
        max_run=form.alloc,
        free_max=form.free,
        optin=form.optin,
        node=node,
        mem_node=mem,
        # numa_mem_id() as the v7.0 sheaf test sees it: a memoryless node's own id unless
        # the profile lets memoryless CPUs use sheaves (v7.1)
        local_node=jnp.where(memless & ~use_sh, node, mem),
        mem_home=_i(cfg.rep_mem_home),
        memless=_i(memless),
        defrag=_i(cfg.remote_node_defrag_ratio),
        alloc_local=_i(~memless | (cfg.memoryless_fallback > 0)),
        has_barn=jnp.any((node[None] == _NODES[:, :, None]) & barn_at[:, None], axis=0)
        & (cfg.sheaf_capacity > 0),
        # slabs come from memory node classes 0 and 1: a rep's remote slabs are the other's
        other=1 - mem,
        # the node class of each rep segment of a free run's split (:data:`SEG`)
        seg_node=jnp.stack([mem, mem, 1 - mem], axis=1).reshape((SEG * R,) + mem.shape[1:]),
        # (N, R) one-hot of each rep's memory node class (of the other memory class), zero
        # where frees that empty a per-CPU partial slab take no lock (before v6.8): see
        # _frozen_frees
        pc_lock_onehot=_i((mem[None] == _NODES[:, :, None]) & (cfg.pc_empty_locks > 0)),
        rpc_lock_onehot=_i(((1 - mem)[None] == _NODES[:, :, None]) & (cfg.pc_empty_locks > 0)),
    )


def _levels(objs):
    """:func:`level_bounds` on int32 arrays."""
    return [_i(0) * objs] + [jnp.maximum(k, ceil_div((k - 1) * objs, LEVELS - 1))
                             for k in range(1, LEVELS)]


def _gauges(st, d, cfg):
    """Per-step gauge values: rows (R,) and rows (N,)."""
    pc = sum(st[f] for f in PCS) + st["pw"]
    rpc = sum(st[f] for f in RPS) + st["rpw"]
    cs_held = _i((st["cs_free"] + st["cs_inuse"] + st["cs_rfree"]) > 0) + pc
    held = jnp.sum(jnp.where(d["mem_node"][:, None] == _NODES[None], cs_held[:, None], 0)
                   + jnp.where(d["other"][:, None] == _NODES[None], rpc[:, None], 0), axis=0)
    pc = pc + rpc
    rep = jnp.stack([st["out"], pc, st["main"] + st["spare"]])
    node = jnp.stack([_node_total(st) + st["full_slabs"] + held, st[NS[0]],
                      st["barn_full"] * _i(cfg.sheaf_capacity)])
    return rep, node


def step(w, st: dict, cfg: SimConfig, d: dict | None = None,
         max_run: int = MAX_OPS_PER_STEP) -> dict:
    """Advance one step: every rep, in order 0..R-1, does one run of at most
    ``cfg.ops_per_step`` allocator ops of one kind.

    ``w``: the step's (R, K) uint32 random words; ``st``: the state as a dict of arrays
    (the fields of :class:`State`); ``max_run``: the static run bound (:func:`run_bound`,
    used when ``d`` is not given).  Pure: returns the new state.
    """
    if d is None:
        d = _derived(cfg, max_run)
    d = dict(d, win=pc_window(st["pend"], _i(cfg.lag_mul), _i(cfg.lag_freers), d["objs"]))
    st = lax.fori_loop(0, R, lambda r, s: _rep_op(r, w[r], s, cfg, d), dict(st))
    rep, node = _gauges(st, d, cfg)
    add_gauges(st, "gsum_rep", "ghi_rep", rep)
    add_gauges(st, "gsum_node", "ghi_node", node)
    return st


def add_gauges(st: dict, lo: str, hi: str, g) -> None:
    """Add this step's gauge values ``g`` to the two-word sums ``st[lo]`` (low
    :data:`GAUGE_SHIFT` bits) and ``st[hi]`` (the rest), in place: int32 sums over long runs
    never overflow."""
    tot = st[lo] + g
    st[hi] = st[hi] + (tot >> GAUGE_SHIFT)
    st[lo] = tot & ((1 << GAUGE_SHIFT) - 1)


def init_state(cfg: SimConfig) -> State:
    """Empty caches: no slabs, empty sheaves, nothing allocated (batch-minor: every field
    has a trailing batch axis of the size of ``cfg.objs_per_slab``)."""
    bs = jnp.shape(cfg.objs_per_slab)

    def z(*s):
        return jnp.zeros(s + bs, _I32)

    return State(
        pend=z(R, R), pend_cs=z(R, R), cs_tracked=z(R), out=z(R), pend_tot=z(R), cs_free=z(R),
        cs_inuse=z(R), cs_rfree=z(R), **{f: z(R) for f in PCS + PCU[1:] + RPS + RPU[1:]}, pd=z(R),
        pw=z(R), rpd=z(R), rpw=z(R), main=z(R),
        spare=z(R), phase=z(R), phase_left=jnp.asarray(cfg.workload.phase_first, _I32),
        **{f: z(N) for f in NS + NU[1:] + ("hs", "hu")}, full_slabs=z(N), barn_full=z(N),
        barn_empty=z(N),
        counts=z(len(COUNTER_FIELDS), R), lock_node=z(N), gsum_rep=z(3, R), gsum_node=z(3, N),
        ghi_rep=z(3, R), ghi_node=z(3, N),
    )


def _finish(st: State, steps) -> Counters:
    """Counters of a batch-minor final state, batch-major ((B, R), (B, N)), after ``steps``
    steps (may be traced)."""

    def front(x):
        return jnp.moveaxis(x, -1, 0)

    c = {name: front(st.counts[k]) for k, name in enumerate(COUNTER_FIELDS)}
    inv = runlen.inv_steps(steps)
    scale = jnp.float32(1 << GAUGE_SHIFT)
    g = (st.ghi_rep.astype(jnp.float32) * scale + st.gsum_rep.astype(jnp.float32)) * inv
    gn = (st.ghi_node.astype(jnp.float32) * scale + st.gsum_node.astype(jnp.float32)) * inv
    return Counters(
        **c, list_lock_node=front(st.lock_node),
        slabs_total=front(gn[0]), objects_inuse=front(g[0]), empty_slabs_kept=front(gn[1]),
        cpu_partial_slabs_held=front(g[1]), sheaf_objects_held=front(g[2]),
        barn_objects_held=front(gn[2]), outstanding=front(st.out),
    )


def _batch_minor(cfgs: SimConfig) -> SimConfig:
    """Move the leading batch axis of every config field to the end."""
    return jax.tree_util.tree_map(lambda x: jnp.moveaxis(jnp.asarray(x), 0, -1), cfgs)


def run_bound(cfgs: SimConfig) -> int:
    """The static run bound of a batch, read outside jit from its concrete
    ``ops_per_step``: 1 when no configuration runs more than one op per step (the run
    closed forms then trace as the one-op model's single pick, see :func:`_below`), else
    :data:`MAX_OPS_PER_STEP` (the general runs; one compiled form for every b > 1).  A
    v6.18 opt-in cache (sheaves and a CPU slab) needs the general form at b = 1 too: one
    free that flushes a sheaf frees ``cap`` objects into slabs.  A traced
    ``ops_per_step`` (a caller's own jit) gets the general bound."""
    b = cfgs.ops_per_step
    if isinstance(b, jax.core.Tracer):
        return MAX_OPS_PER_STEP
    return MAX_OPS_PER_STEP if np.any(_general(cfgs)) else 1


def _general(cfgs: SimConfig) -> np.ndarray:
    """Per configuration (concrete, batch-major), whether it needs the general run form:
    ``ops_per_step`` > 1, or a v6.18 opt-in cache (sheaves and a CPU slab)."""
    cs_sheaf = (np.asarray(cfgs.sheaf_capacity) > 0) & (np.asarray(cfgs.cpu_slab) > 0)
    return (np.asarray(cfgs.ops_per_step) > 1) | cs_sheaf


def _bound(cfgs: SimConfig, max_run) -> int:
    """The static run bound to compile for: :func:`run_bound` of ``cfgs``, or the caller's
    ``max_run`` (1 or larger, or a :class:`RunForm`), refused with a one-line error when a
    concrete ``ops_per_step`` exceeds 1 under ``max_run == 1`` or the configurations need
    more than the form given."""
    if max_run is None:
        return run_bound(cfgs)
    if isinstance(max_run, RunForm):
        if _concrete(cfgs):
            need = run_form(cfgs)
            if need.alloc > max_run.alloc or need.free > max_run.free \
                    or (need.optin and not max_run.optin):
                raise SlabtuneError(f"max_run: {tuple(max_run)} is narrower than the "
                                    f"configurations need, {tuple(need)} (dynamics.run_form)")
        return max_run
    if isinstance(max_run, bool) or not isinstance(max_run, (int, np.integer)) or max_run < 1:
        raise SlabtuneError(f"max_run: {max_run!r} is not a positive integer")
    if max_run == 1 and run_bound(cfgs) != 1 \
            and not isinstance(cfgs.ops_per_step, jax.core.Tracer):
        raise SlabtuneError("max_run: 1 but some configuration has ops_per_step > 1 or is "
                            "a v6.18 opt-in cache (sheaves beside a CPU slab)")
    return 1 if max_run == 1 else MAX_OPS_PER_STEP


def _static_form(cfgs: SimConfig, max_run) -> RunForm:
    """The :class:`RunForm` to compile for: :func:`run_form` of a concrete batch without
    ``max_run``, else the form of :func:`_bound`."""
    if max_run is None and _concrete(cfgs):
        return run_form(cfgs)
    return _as_form(_bound(cfgs, max_run))


def run_state(seeds_or_draws, cfgs: SimConfig, steps, pre_drawn: bool,
              max_run: int = MAX_OPS_PER_STEP) -> State:
    """The final batch-minor :class:`State` of a batch of runs of ``steps`` steps
    (traceable; ``steps`` may be traced, ``max_run`` is static): :func:`run_states` at one
    checkpoint."""
    return run_states(seeds_or_draws, cfgs, (steps,), pre_drawn, max_run)[0]


def run_states(seeds_or_draws, cfgs: SimConfig, checkpoints, pre_drawn: bool,
               max_run: int = MAX_OPS_PER_STEP) -> list:
    """The batch-minor :class:`State` of a batch of runs after each of ``checkpoints``
    steps (non-decreasing, each may be traced; their number is static), from one run: a
    run's first steps do not depend on its length.  ``cfgs`` is batch-major (see
    :func:`stack_configs`); ``seeds_or_draws`` is (B,) uint32 seeds or (S, R, K, B) words
    with S at least the last checkpoint; ``max_run`` bounds every configuration's
    ``ops_per_step`` (:func:`run_bound`).  The step loop has a traced bound
    (:func:`slabtune.model.runlen.advance`), so one compiled program serves every length."""
    cfg = _batch_minor(cfgs)
    d = _derived(cfg, max_run)
    st = init_state(cfg)._asdict()
    if pre_drawn:
        def body(t, s):
            return step(lax.dynamic_index_in_dim(seeds_or_draws, t, 0, keepdims=False),
                        s, cfg, d)
    else:
        def body(t, s):
            return step(_draws_at(seeds_or_draws, t.astype(_U32)), s, cfg, d)
    out, t0 = [], 0
    for t1 in checkpoints:
        st = runlen.advance(st, t0, t1, body)
        out.append(State(**st))
        t0 = t1
    return out


def _one(cfg: SimConfig) -> SimConfig:
    return jax.tree_util.tree_map(lambda x: jnp.asarray(x)[None], cfg)


def _first(c: Counters) -> Counters:
    return Counters(*(x[0] for x in c))


def simulate(key, cfg: SimConfig, steps: int, max_run: int | None = None) -> Counters:
    """Run ``steps`` steps of configuration ``cfg`` from empty caches; the random stream is
    fixed by ``key`` (see :func:`draws`).  ``max_run``: the static run bound, by default
    :func:`run_bound` of ``cfg``."""
    return _simulate(key, cfg, jnp.asarray(steps, _I32), _static_form(cfg, max_run))


@functools.partial(jax.jit, static_argnums=3)
def _simulate(key, cfg, steps, max_run):
    seeds = seed_of(key)[None]
    return _first(_finish(run_state(seeds, _one(cfg), steps, False, max_run), steps))


def simulate_draws(w, cfg: SimConfig, max_run: int | None = None) -> Counters:
    """As :func:`simulate`, with the random words given: ``w`` of shape (steps, R, K)
    (padded to a bucket length, :func:`slabtune.model.runlen.pad_words`)."""
    w, steps = runlen.pad_words(w)
    return _simulate_draws(w, steps, cfg, _static_form(cfg, max_run))


@functools.partial(jax.jit, static_argnums=3)
def _simulate_draws(w, steps, cfg, max_run):
    return _first(_finish(run_state(w[..., None], _one(cfg), steps, True, max_run), steps))


def simulate_batch(keys, cfgs: SimConfig, steps: int, max_run: int | None = None) -> Counters:
    """:func:`simulate` over a batch of configurations (leading axis of ``keys`` and of
    every field of ``cfgs``, see :func:`stack_configs`); the same result as vmapping
    :func:`simulate`, computed batch-minor.  ``max_run``: the static run bound, by default
    :func:`run_bound` of ``cfgs`` (pass it, or the batch's :func:`run_form`, when calling
    this inside your own jit).  On the
    CPU, outside jit, a batch of more than :data:`CHUNK` runs as equal parts, one per usable
    CPU, each in its own thread (:func:`_parts`); on an accelerator the batch runs as one
    scan (:func:`_on_cpu`).  Without ``max_run``, a concrete batch runs as one batch per
    :class:`RunForm` its configurations need (:func:`_form_groups`), so that one-op
    configurations keep the one-op form beside opt-in caches and longer runs.  ``steps``
    may be traced: one compiled program serves every run length."""
    return simulate_batch_at(keys, cfgs, (steps,), max_run)[0]


def simulate_batch_at(keys, cfgs: SimConfig, checkpoints, max_run: int | None = None) -> tuple:
    """:func:`simulate_batch`'s counters after each of ``checkpoints`` steps
    (non-decreasing), from one run of each configuration to the last: a tuple of
    :class:`Counters`, each what :func:`simulate_batch` returns for that many steps (the
    first steps of a run do not depend on its length)."""
    ck = runlen.checkpoints(checkpoints)
    leaves = jax.tree_util.tree_leaves((keys, cfgs, checkpoints))
    traced = any(isinstance(x, jax.core.Tracer) for x in leaves)
    if max_run is not None or traced:
        return _run_batch(keys, cfgs, ck, _as_form(_bound(cfgs, max_run)), traced)
    groups = _form_groups(cfgs)
    if len(groups) == 1:
        return _run_batch(keys, cfgs, ck, groups[0][0], False)
    # the groups run one after the other, each over every usable CPU (:func:`_parts`):
    # running them at once in threads of their own oversubscribed the cores and ran slower
    # (bench_dynamics at 10^4, b = 1: 3.27 M ops/s against 3.67-3.90 M, 10:01-10:20 UTC
    # 2026-11-25, load 0-1); one such run, with both groups split in parts, hung
    outs = [_run_batch(jnp.take(keys, i, axis=0), jax.tree_util.tree_map(
        lambda x, i=i: np.take(np.asarray(x), i, axis=0), cfgs), ck, form, False)
        for form, i in groups]
    back = np.argsort(np.concatenate([i for _, i in groups]))
    return jax.tree_util.tree_map(
        lambda *xs: jnp.take(jnp.concatenate(xs), back, axis=0), *outs)


def _form_groups(cfgs: SimConfig) -> list:
    """The concrete batch's configurations grouped by the :class:`RunForm` each needs on
    its own (:func:`_form_kinds`): ``[(form, indices), ...]``, the one-op group first."""
    kinds = _form_kinds(cfgs)
    return [(f, np.nonzero(kinds == k)[0]) for k, f in enumerate(_FORMS) if (kinds == k).any()]


def _run_batch(keys, cfgs: SimConfig, ck, form: RunForm, traced: bool) -> tuple:
    """One compiled form over the batch, the counters at each checkpoint of ``ck`` (C,):
    one scan on an accelerator, else equal parts in threads (:func:`_parts`)."""
    n = len(keys)
    if not _on_cpu():
        return _simulate_batch_at(keys, cfgs, ck, form, max(n, 1), False)
    p = 1 if traced else _parts(n)
    if p == 1:
        return _simulate_batch_at(keys, cfgs, ck, form)
    # configurations are independent: equal parts (the last padded with copies of the last
    # configuration, so one compiled shape), run at once, the padding dropped
    c = -(-n // p)
    idx = np.minimum(np.arange(p * c), n - 1).reshape(p, c)

    def part(i):
        return _simulate_batch_at(jnp.take(keys, i, axis=0), jax.tree_util.tree_map(
            lambda x: jnp.take(jnp.asarray(x), i, axis=0), cfgs), ck, form)

    # the first part is compiled (and dispatched, asynchronously) here, so the threads
    # reuse one executable instead of each compiling it and writing it to the persistent
    # compilation cache at the same time
    first = part(idx[0])
    futs = [_pool(p).submit(lambda i: jax.block_until_ready(part(i)), i) for i in idx[1:]]
    return jax.tree_util.tree_map(lambda *xs: jnp.concatenate(xs)[:n],
                                  first, *[f.result() for f in futs])


def _parts(n: int) -> int:
    """Threads :func:`simulate_batch` splits ``n`` configurations over: one per CPU this
    process may run on, while every part keeps at least :data:`PART_MIN` configurations.
    One XLA:CPU execution of the step uses about one core (its fusions are too small to
    split), so at 10^4 configurations, b = 1, 2 cores, two threads gave 1.9-2.1x the wall
    rate of one call (6.0-6.1 M against 2.9-3.2 M ops/s, load 2, 20:50 UTC 2026-11-24)."""
    return max(1, min(usable_cpus(), n // PART_MIN))


#: Fewest configurations a thread's part of a batch keeps (:func:`_parts`): half a
#: :data:`CHUNK`, so that bench_dynamics' 990 v6.18 opt-in configurations, a group of
#: their own (:func:`_form_groups`), run on both cores (the mix at 10^4 configurations,
#: b = 1: 3.67-3.90 M ops/s against 3.14 M with parts of at least CHUNK, groups one after
#: the other, 10:01-10:20 UTC 2026-11-25, load 0-1).
PART_MIN = 480


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity mask, else the machine's count)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def _on_cpu() -> bool:
    """Whether JAX runs on the host's CPU.  The chunks and threads of :func:`simulate_batch`
    exist because one XLA:CPU execution of the step uses about one core and a large batch
    falls out of its caches; an accelerator runs the whole batch in one scan instead (each
    fusion is one kernel launch, so fewer, wider launches are what it wants)."""
    return jax.default_backend() == "cpu"


@functools.cache
def _pool(p: int):
    from concurrent.futures import ThreadPoolExecutor

    return ThreadPoolExecutor(p, thread_name_prefix="dynamics")


#: Most configurations one scan steps at a time (:func:`_simulate_batch`): a larger batch
#: is run as equal chunks of at most about this many, one after the other, so the step's
#: working set (2.1 KB of state and 0.6 KB of config per configuration, read and written R
#: times a step: 2.6 MB a chunk, against 27 MB for 10^4 in one scan) stays in the caches.
#: Sizes from 240 to 1200 that are no multiple of :data:`ALIAS` ran alike (one thread pinned
#: to one core, 4800 configurations, b = 1, 20 steps, 5 interleaved rounds, load 8, 23:34
#: UTC 2026-11-24: 0.27-0.30 CPU s each, 960 the fastest).  Earlier, chunks against one scan
#: of 10^4: 1.38-1.48x where XLA ran the scan on one core, 0.87-0.92x where it spread the
#: large scan's fusions over both (load 2); in two threads (:func:`_parts`) 2.13x wall
#: against 1.64x for two unchunked halves.
CHUNK = 960
#: A chunk's size is rounded up to a multiple of this many configurations (whole vectors).
ALIGN = 16
#: A chunk of a multiple of this many configurations is one :data:`ALIGN` larger: every
#: (R, c) or (N, c) int32 field then has rows 1 KiB apart or a multiple of it, and the
#: fusions' many operands fall into the same sets of the set-associative caches.  One
#: thread pinned to one core, b = 1, 20 steps, CPU us per configuration and step, medians of
#: 5 interleaved rounds (load 8, 23:43 UTC 2026-11-24): c = 1024 5.52, 512 4.28, 256 3.45,
#: 768 and 1280 3.37; c = 960, 992, 1000, 1008 2.60-2.77, 520 2.77, 264 2.90.
ALIAS = 256


def _chunks(n: int, chunk: int = CHUNK, spread: bool = True) -> tuple[int, int]:
    """(chunks, size) for ``n`` configurations: the fewest chunks of at most ``chunk``,
    equal in size (the last padded); with ``spread`` (the CPU) the size is rounded up to a
    multiple of :data:`ALIGN` and kept off multiples of :data:`ALIAS`, so it can exceed
    ``n`` or ``chunk`` by up to 2 ALIGN - 1."""
    k = -(-n // chunk)
    c = -(-n // k)
    if spread:
        c = -(-c // ALIGN) * ALIGN
        c += ALIGN * (c % ALIAS == 0)
    return k, c


def _simulate_batch(keys, cfgs, steps, max_run, chunk=CHUNK, spread=True) -> Counters:
    """The counters of one compiled batch after ``steps`` steps (:func:`_simulate_batch_at`
    at one checkpoint)."""
    return _simulate_batch_at(keys, cfgs, runlen.checkpoints(steps), max_run, chunk, spread)[0]


def _finish_at(states, ck) -> tuple:
    return tuple(_finish(st, ck[i]) for i, st in enumerate(states))


@functools.partial(jax.jit, static_argnums=(3, 4, 5))
def _simulate_batch_at(keys, cfgs, ck, max_run, chunk=CHUNK, spread=True):
    """The counters of a batch at each checkpoint of ``ck`` ((C,) int32, traced: one
    compiled program per batch shape, form and number of checkpoints), in chunks of at most
    ``chunk`` configurations (:func:`_chunks`)."""
    seeds = jax.vmap(seed_of)(keys)
    n = seeds.shape[0]
    k, c = _chunks(n, chunk, spread)
    marks = [ck[i] for i in range(ck.shape[0])]
    if k * c == n == c:
        return _finish_at(run_states(seeds, cfgs, marks, False, max_run), ck)
    # configurations are independent: pad with copies of the last one, run the chunks in
    # order (lax.map, one compiled body), drop the padding
    idx = jnp.minimum(jnp.arange(k * c), n - 1)

    def split(x):
        x = jnp.take(jnp.asarray(x), idx, axis=0)
        return x.reshape((k, c) + x.shape[1:])

    out = lax.map(lambda a: _finish_at(run_states(a[0], a[1], marks, False, max_run), ck),
                  (split(seeds), jax.tree_util.tree_map(split, cfgs)))
    return jax.tree_util.tree_map(lambda x: x.reshape((k * c,) + x.shape[2:])[:n], out)


def counters_numpy(c: Counters) -> dict:
    """Counters as a dict of NumPy arrays."""
    return {k: np.asarray(v) for k, v in c._asdict().items()}

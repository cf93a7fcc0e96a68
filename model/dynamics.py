"""SLUB dynamics: per-CPU alloc/free streams through slabs, partial lists and sheaves.

The simulation is a pure ``step(draws, state, cfg)`` over a :class:`State` pytree, run with
``lax.scan`` (:func:`simulate`) and vmapped over configurations (:func:`simulate_batch`).
Everything is int32 masked array code: no Python control flow on traced values, static
loops over the ``R`` representative CPUs ("reps") and ``N`` node classes only.

What it models and how it maps to mm/slub.c is written up in docs/MODEL.md; the short form:

* Each rep owns a per-CPU slab (``cs_free`` objects on the lockless freelist, ``cs_inuse``
  allocated, ``cs_rfree`` freed into it by other CPUs), a per-CPU partial list (v3.2..v6.18)
  and a main and spare sheaf (v6.18 opt-in, v7.0 on).
* Each node class keeps a partial list (``part_slabs`` slabs holding ``part_inuse``
  objects), a count of full slabs and a barn (full and empty sheaves).
* Objects in flight are counted by (allocating rep, freeing rep) in ``pend``; ``pend_cs``
  counts those of them that sit in the allocating rep's current CPU slab, so a free goes
  back to the slab its object came from: the allocating CPU's slab while it is still that
  CPU's slab (a fast free for the CPU itself, a free into a frozen slab for another CPU),
  else one of the slabs it used before.
* Runs: in a step each rep does a run of up to ``SimConfig.ops_per_step`` (b) operations of
  one kind, computed in closed form (piecewise-linear integer transitions); random picks
  within a run are counts by systematic sampling, which for b = 1 is the single pick, so
  b = 1 is the one-op model bit for bit (docs/MODEL.md, "Runs").

Partial lists are counts, not lists: the model assumes objects are packed (every partial
slab but one holds ``objs - 1`` objects), which fixes which free empties a slab and what a
refill takes without storing slabs.  The same rules, written as plain branches over
Python ints, are :mod:`slabtune.model.reference_sim`; with the same random bits both give
identical counters.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from slabtune.errors import SlabtuneError
from slabtune.model import profiles, workloads
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
#: Gauge sums are kept as (sum >> GAUGE_SHIFT, sum mod 2**GAUGE_SHIFT) int32 pairs.
GAUGE_SHIFT = 20


# --------------------------------------------------------------------------- public types


class SimConfig(NamedTuple):
    """Everything fixed for one run (arrays; vmappable).

    Scalars: ``objs_per_slab``, ``order``, ``min_partial``, ``cpu_partial_slabs`` (0: no
    per-CPU partial list), ``sheaf_capacity`` (0: no sheaves), ``cpu_slab`` (1: the cache
    allocates through a per-CPU slab when it has no sheaf), ``barns`` (0 none, 1 on nodes
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


class State(NamedTuple):
    """What evolves: per rep (R,), per node class (N,), ``pend`` (R, R) and counters.

    The scan carries it as a dict of these arrays.
    """

    pend: Any          # (R, R) objects allocated by rep i, to be freed by rep j
    pend_cs: Any       # (R, R) of pend[i, j]: still in rep i's current CPU slab
    cs_tracked: Any    # (R,) sum over j of pend_cs[r, j]
    out: Any           # (R,) objects allocated by r and not yet freed
    pend_tot: Any      # (R,) objects rep r has to free
    cs_free: Any       # (R,) objects on r's CPU freelist
    cs_inuse: Any      # (R,) allocated objects of r's CPU slab
    cs_rfree: Any      # (R,) objects other CPUs freed into r's CPU slab
    pc_slabs: Any      # (R,) slabs on r's per-CPU partial list
    pc_inuse: Any      # (R,) allocated objects in them
    main: Any          # (R,) objects in r's main sheaf
    spare: Any         # (R,) objects in r's spare sheaf
    phase: Any         # (R,) burst phase: 0 allocating, 1 freeing
    phase_left: Any    # (R,) ops left in this phase
    part_slabs: Any    # (N,) slabs on the node's partial list (empty ones included)
    part_inuse: Any    # (N,) allocated objects in them
    full_slabs: Any    # (N,) slabs with every object allocated, on no list
    barn_full: Any     # (N,) full sheaves in the node's barn
    barn_empty: Any    # (N,) empty sheaves in the node's barn
    counts: Any        # (len(COUNTER_FIELDS), R) event counters
    lock_node: Any     # (N,) list_lock acquisitions per node class
    gsum_rep: Any      # (3, R) gauge sums mod 2**20: objects_inuse, cpu_partial, sheaves
    gsum_node: Any     # (3, N) gauge sums mod 2**20: slabs_total, empty slabs, barn objects
    ghi_rep: Any       # (3, R) gauge sums // 2**20 (so long runs cannot overflow int32)
    ghi_node: Any      # (3, N)


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
    return SimConfig(
        objs_per_slab=_scalar(objs),
        order=_scalar(np.asarray(structure.order)),
        min_partial=_scalar(mp),
        cpu_partial_slabs=_scalar(cps),
        sheaf_capacity=_scalar(cap),
        cpu_slab=_scalar(1 if cap == 0 else 0),
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


@functools.partial(jax.jit, static_argnums=1)
def draws(key, steps: int) -> jnp.ndarray:
    """All random words of a run, shape (steps, R, K) uint32: what :func:`simulate` uses
    step by step, for feeding the reference simulator the same numbers."""
    seed = seed_of(key)
    return jax.vmap(lambda t: _draws_at(seed, t))(jnp.arange(steps, dtype=_U32))


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


def _nonempty(slabs, inuse, cap1):
    """Non-empty slabs of a partial list under the packing rule: ceil(inuse / (objs-1))."""
    return jnp.minimum(slabs, ceil_div(inuse, cap1))


def _i(x):
    return jnp.asarray(x, _I32)


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
        for node, cnt in self.locks.values():
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


def _pick_classes(mem_node, k, n_max):
    """The node classes a free run's picks can land on, as a leading axis ``cls`` (C, B),
    with ``on_cls`` taking a per-node (N, B) field to (C, B) and ``from_cls`` putting
    (C, B) counts back on (N, B) (zero elsewhere).  In general every class (C = N, both
    maps the identity).  With the static run bound ``n_max == 1`` a run is one free, the
    one-op model's pick: ``k`` (R, B) is then 1 at most at one rep, whose memory node is
    the only class that can get it (C = 1), so the split never traces the other classes."""
    if n_max != 1:
        return _NODES, (lambda v: v), (lambda v: v)
    c = jnp.sum(jnp.where(k > 0, mem_node, 0), axis=0)                  # (B,)
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
    cap1: Any       # max(objs - 1, 1): objects of a packed partial slab
    cap: Any        # sheaf capacity (0: no sheaves)
    capm: Any       # max(cap, 1), a divisor
    sheaves: Any    # cap > 0
    cps: Any        # cpu_partial_slabs (0: no per-CPU partial list)
    mp: Any         # min_partial
    w0: Any         # random word: the run's kind
    w1: Any         # random word: freeing reps of an allocation run, pending objects freed
    w2: Any         # random word: slabs a free run's objects come from
    m: Any          # the rep's memory node class (its slabs come from there)
    own: Any        # the rep's own node class (its barn)
    has_barn: Any   # the rep's node has a barn (and the cache sheaves)


def _rep_values(r, w, cfg: SimConfig, d: dict) -> _Rep:
    """The :class:`_Rep` of rep ``r`` with random words ``w`` (no kernel function: the
    constants of one run, read from the config and :func:`_derived` ``d``).  ``m`` is one
    traced value for the whole run: :meth:`_Ctx.lock` counts locks per node object."""
    objs, cap1 = d["objs"], d["cap1"]
    cap = _i(cfg.sheaf_capacity)
    capm = jnp.maximum(cap, 1)
    sheaves = cap > 0
    cps = _i(cfg.cpu_partial_slabs)
    mp = d["min_partial"]
    w0, w1, w2 = w[0], w[1], w[2]
    m = d["mem_node"][r]
    own = d["node"][r]
    has_barn = d["has_barn"][r]
    return _Rep(objs, cap1, cap, capm, sheaves, cps, mp, w0, w1, w2, m, own, has_barn)


def _choose_run(cx: _Ctx, wl: workloads.Workload, w0):
    """The kind and length of rep ``cx.r``'s run this step (the workload, no kernel
    function): it allocates if it can (active, below its live target) and wants to (its
    burst phase, else the high half of ``w0`` against ``alloc_p``), else frees if it has
    objects to free; at most b ops, at most the rest of a burst phase (which flips at its
    end).  Returns ``do_a`` (the run allocates) and the run lengths ``na``/``nf`` (one of
    them 0), and counts the ops."""
    r, d = cx.r, cx.d
    # ---- workload: a run of allocations or of frees, and its length
    alloc_p = wl.alloc_p[r]
    burst = wl.burst[r]
    can_a = (wl.active[r] > 0) & (alloc_p > 0) & (cx.row("out") < wl.live_target[r])
    can_f = (wl.active[r] > 0) & (cx.row("pend_tot") > 0)
    bursty = burst > 0
    want_a = jnp.where(bursty, cx.row("phase") == 0, _i(w0 >> 16) < alloc_p)
    do_a = can_a & (want_a | ~can_f)
    do_f = can_f & ~do_a
    n = jnp.where(do_a, jnp.minimum(d["b"], wl.live_target[r] - cx.row("out")),
                  jnp.where(do_f, jnp.minimum(d["b"], cx.row("pend_tot")), 0))
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
    (:func:`_count_allocs`)."""
    Cj, cnt = _alloc_freers(cx, cfg.workload, na, k.w1)
    sh_slow, rfl, ndir = _sheaf_alloc(cx, k, cfg, na)

    # -- a CPU on a memoryless node without the numa_mem_id() fix never finds its CPU slab
    #    "local": every object comes from the node's partial list under its lock; so does
    #    a v7.x allocation the sheaves could not serve (``ndir``)
    direct = do_a & ~k.sheaves & (cx.d["alloc_local"][cx.r] == 0)
    nd = jnp.where(direct, na, 0) + ndir

    a_cs = do_a & ~k.sheaves & ~direct
    rfe, E, t_pg = _cpu_slab_alloc(cx, k, a_cs, na, Cj, cnt)

    # -- bulk allocation from node m: sheaf refills (cap objects each) or direct ones
    _bulk_take(cx, k.m, rfl * k.cap + nd)
    cx.lock(k.m, rfl + nd)

    _count_allocs(cx, na, cnt, sh_slow, rfe, E, nd, t_pg)


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


def _cpu_slab_alloc(cx: _Ctx, k: _Rep, a_cs, na, Cj, cnt):
    """A run's allocations through the CPU slab (``a_cs``: caches without sheaves, CPUs
    whose CPU slab counts as local): slab_alloc()'s fast path on the CPU freelist, then
    the slow paths of ___slab_alloc() in their order (:func:`_cpu_freelist`), new
    CPU slabs from the per-CPU partial list (v3.2 to v6.18), the node's partial list
    (get_partial_node()) and the page allocator (new_slab()): :func:`_partial_lists`,
    :func:`_new_cpu_slabs`, :func:`_take_partial_slabs`, :func:`_install_cpu_slab`.
    Returns ``rfe`` (the remotely freed objects were taken), ``E`` (new CPU slabs) and
    ``t_pg`` (of them, new slabs from the page allocator)."""
    # -- CPU slab (slab_alloc fast path, ___slab_alloc): the freelist, the remotely freed
    #    objects, then new CPU slabs, each a slow path, in the order ___slab_alloc takes
    #    them: per-CPU partial slabs, node partial slabs (get_partial_node moving up to
    #    cpu_partial_slabs / 2 + 1 more to the per-CPU list), new slabs
    nc = jnp.where(a_cs, na, 0)
    fl = _cpu_freelist(cx, nc)
    pl = _partial_lists(cx, k)
    ns = _new_cpu_slabs(k, pl, fl.n2)
    _take_partial_slabs(cx, k, pl, ns)
    _install_cpu_slab(cx, k, a_cs, nc, fl, ns, Cj, cnt)
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
    """The per-CPU and node partial lists a CPU-slab run takes new CPU slabs from, under
    the packing rule (empty slabs, non-empty ones, the objects of the emptiest)."""

    ps: Any     # slabs on the per-CPU partial list
    pu: Any     # allocated objects in them
    S_m: Any    # slabs on node m's partial list
    ne_p: Any   # non-empty per-CPU partial slabs
    e_p: Any    # empty per-CPU partial slabs
    hd_p: Any   # allocated objects of the emptiest non-empty per-CPU partial slab
    ne_n: Any   # non-empty slabs on node m's list
    e_n: Any    # empty slabs on node m's list
    hd_n: Any   # allocated objects of the emptiest non-empty slab on node m's list
    G: Any      # slabs one get_partial_node() takes off node m's list
    q1: Any     # nearly full slabs taken with the last empty ones


def _partial_lists(cx: _Ctx, k: _Rep) -> _Partials:
    """The :class:`_Partials` of rep ``cx.r`` and its memory node ``m`` as the run
    starts: the per-CPU partial list (``c->partial``, v3.2 to v6.18) and the node's
    (``n->partial``), and what one get_partial_node() takes off the node's list under its
    list_lock: the slab it returns plus, where the era has per-CPU partial lists, up to
    ``cpu_partial_slabs / 2 + 1`` more that it puts on the per-CPU list."""
    st, cap1, cps, m = cx.st, k.cap1, k.cps, k.m
    ps, pu = cx.row("pc_slabs"), cx.row("pc_inuse")
    S_m = _get(st["part_slabs"], m)
    U_m = _get(st["part_inuse"], m)
    ne_p = _nonempty(ps, pu, cap1)
    e_p = ps - ne_p
    hd_p = pu - (ne_p - 1) * cap1
    ne_n = _nonempty(S_m, U_m, cap1)
    e_n = S_m - ne_n
    hd_n = U_m - (ne_n - 1) * cap1
    G = 1 + jnp.where(cps > 0, cps // 2 + 1, 0)      # slabs per node list take
    gend = ceil_div(e_n, G) * G
    q1 = jnp.where((e_n > 0) & (gend < S_m), gend - e_n, 0)
    return _Partials(ps, pu, S_m, ne_p, e_p, hd_p, ne_n, e_n, hd_n, G, q1)


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
    page allocator (new_slab()).  The sources are blocks of slabs of equal yield, most
    free first within a list; the run ends in the block its cumulative yield reaches."""
    objs, cap1 = k.objs, k.cap1
    ps, pu, S_m, ne_p, e_p, hd_p, ne_n, e_n, hd_n, G, q1 = p
    one = objs - cap1
    h_p, h_n = _i(ne_p > 0), _i(ne_n > 0)
    # the new CPU slabs as blocks of equal yield (free objects per slab): per-CPU list
    # (empty slabs, the emptiest, the rest), node list (empty, q1 nearly full ones that
    # came with the last empties, the emptiest, the rest), the page allocator
    bc = jnp.stack(_bc(e_p, h_p, ne_p - h_p, e_n, q1, h_n, ne_n - h_n - q1, n2))
    by = jnp.stack(_bc(objs, objs - hd_p, one, objs, one, objs - hd_n, one, objs))
    ocum = _cumsum(bc * by)
    ecum = _cumsum(bc)
    blk = jnp.sum(_i(ocum < n2), axis=0)
    at = np.arange(8)[:, None] == blk
    o_before = jnp.sum(jnp.where(at, ocum - bc * by, 0), axis=0)
    e_before = jnp.sum(jnp.where(at, ecum - bc, 0), axis=0)
    y_last = jnp.sum(jnp.where(at, by, 0), axis=0)
    need = n2 - o_before
    ev = ceil_div(need, jnp.maximum(y_last, 1))
    E = jnp.where(n2 > 0, e_before + ev, 0)
    L = need - (ev - 1) * y_last                       # objects taken from the last slab
    t_p = jnp.minimum(E, ps)
    t_n = jnp.clip(E - ps, 0, S_m)
    t_pg = jnp.maximum(E - ps - S_m, 0)
    return _NewSlabs(E, L, y_last, t_p, t_n, t_pg)


def _take_partial_slabs(cx: _Ctx, k: _Rep, p: _Partials, ns: _NewSlabs):
    """Take a run's new CPU slabs off the partial lists: ``t_p`` off the per-CPU partial
    list (no lock), then ``t_n`` off node ``m``'s list in get_partial_node() calls, each
    under the node's list_lock and taking ``G`` slabs: one becomes the CPU slab, the rest
    go onto the per-CPU partial list (put_cpu_partial(), v3.2 to v6.18), where later slow
    paths of the run take them first.  Updates both lists' slabs and objects."""
    cap1, m = k.cap1, k.m
    ps, pu, S_m, ne_p, e_p, hd_p, ne_n, e_n, hd_n, G, q1 = p
    t_p, t_n = ns.t_p, ns.t_n

    def inuse_p(t):
        return cap1 * jnp.clip(t - e_p, 0, ne_p) - jnp.where((t > e_p) & (ne_p > 0),
                                                            cap1 - hd_p, 0)

    def inuse_n(t):
        return cap1 * jnp.clip(t - e_n, 0, ne_n) - jnp.where(
            (t >= e_n + q1 + 1) & (ne_n > 0), cap1 - hd_n, 0)

    takes = ceil_div(t_n, G)
    gone = jnp.minimum(takes * G, S_m)
    in_node = t_n > 0
    cx.rset("pc_slabs", jnp.where(in_node, gone - t_n, ps - t_p))
    cx.rset("pc_inuse", jnp.where(in_node, inuse_n(gone) - inuse_n(t_n), pu - inuse_p(t_p)))
    cx.nadd("part_slabs", m, -gone)
    cx.nadd("part_inuse", m, -inuse_n(gone))
    cx.lock(m, takes)


def _install_cpu_slab(cx: _Ctx, k: _Rep, a_cs, nc, fl: _Freelist, ns: _NewSlabs, Cj, cnt):
    """The CPU slab after a CPU-slab allocation run: each new CPU slab deactivates the
    old one (deactivate_slab(): an exhausted CPU slab is full and on no list, unless it
    held nothing), the last one keeps its free objects on the CPU freelist; else the
    freelist and the remotely freed objects are what the run left.  Which of the run's
    objects are still in the CPU slab (``pend_cs``, ``cs_tracked``): the last ``L`` of
    the run when it took a new CPU slab (its objects are in freeing-rep order)."""
    st, r, objs, m = cx.st, cx.r, k.objs, k.m
    f0, i0, r0, a0, a1, n1, rfe = fl.f0, fl.i0, fl.r0, fl.a0, fl.a1, fl.n1, fl.rfe
    E, L, y_last = ns.E, ns.L, ns.y_last
    # every new CPU slab deactivates the old one, full unless it held nothing
    cx.nadd("full_slabs", m, jnp.where(E > 0, E - _i(i0 + a0 + a1 == 0), 0))
    cx.rset("cs_free", jnp.where(E > 0, y_last - L, jnp.where(rfe, r0 - a1, f0 - a0)))
    cx.rset("cs_inuse", jnp.where(E > 0, objs - y_last + L, i0 + a0 + a1))
    cx.rset("cs_rfree", 0, n1 > 0)
    # objects still in the CPU slab: the last L of the run (its objects are in j order)
    suffix = _counts(jnp.maximum(Cj - (nc - L), 0))
    pcs_row = jnp.where(E > 0, suffix, st["pend_cs"][r] + jnp.where(a_cs, cnt, 0))
    st["pend_cs"] = st["pend_cs"].at[r].set(pcs_row)
    cx.rset("cs_tracked", jnp.where(E > 0, L, cx.row("cs_tracked") + nc))


def _count_allocs(cx: _Ctx, na, cnt, sh_slow, rfe, E, nd, t_pg):
    """The allocation run's bookkeeping: fast and slow paths as SLUB_STATS counts them
    (ALLOC_SLOWPATH is ___slab_alloc(): taking the remotely freed objects, a new CPU slab,
    a direct node-list allocation; every object alloc_from_pcs() hands out is
    ALLOC_FASTPATH, v6.18/v7.x, also right after __pcs_replace_empty_main() swapped in the
    spare or a barn sheaf or refilled one: those replacements are ``sheaf_alloc_replace``),
    new slabs from the page allocator, and the objects now in flight (``pend`` by freeing
    rep, ``out``, the freeing reps' ``pend_tot``)."""
    st, r = cx.st, cx.r
    slow = _i(rfe) + E + nd
    cx.bump("alloc_fast", na - slow)
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
    lay = _slab_layout(cx, k, k_ot)
    _unpend(cx, k_cs, k_all, nf)
    sh, nsh, full_main = _sheaf_free(cx, k, cfg, rem, k_all)
    c_cs, c_pc, xU, xF = _split_slab_frees(cx, k, lay, sh, k_cs, k_ot)
    own_fast = _frozen_frees(cx, c_cs, c_pc)
    _part_frees(cx, xU, lay.on_cls, lay.from_cls)
    _full_slab_frees(cx, k, cfg, lay, xF)

    # FREE_FASTPATH counts every free_to_pcs(), also one that first replaced a full main
    # sheaf (__pcs_replace_full_main(): ``sheaf_free_replace``)
    ffast = nsh + own_fast
    cx.bump("free_fast", ffast)
    cx.bump("free_slow", nf - ffast)
    cx.bump("sheaf_free_replace", full_main)


def _pick_pending(cx: _Ctx, k: _Rep, nf):
    """Which of rep ``cx.r``'s pending objects its ``nf`` frees take (the workload, no
    kernel function), drawn uniformly: systematic points (offset from ``w1``) over the
    origin segments.  Returns per origin rep (R, B) the objects still in its CPU slab
    ``k_cs``, the others ``k_ot`` and their sum ``k_all``, and ``rem``: the origins whose
    objects are remote to the freeing CPU (slab node against its numa_mem_id() as the
    v7.0 sheaf test sees it; v7.1 lets memoryless CPUs use their memory node); counts the
    remote frees."""
    st, d, r, w1 = cx.st, cx.d, cx.r, k.w1
    # which pending objects: systematic points over the segments (origin 0 in its CPU
    # slab, origin 0 elsewhere, origin 1 in its CPU slab, ...)
    col = st["pend"][:, r]
    col_cs = st["pend_cs"][:, r]
    seg = jnp.stack([col_cs, col - col_cs], axis=1).reshape((2 * R,) + col.shape[1:])
    T = jnp.maximum(cx.row("pend_tot"), 1)
    k2 = _counts(_systematic(_cumsum(seg), nf, _i(w1 >> 1) % T, T, d["max_run"]))
    k2 = k2.reshape((R, 2) + col.shape[1:])
    k_cs, k_ot = k2[:, 0], k2[:, 1]
    k_all = k_cs + k_ot
    rem = d["mem_node"] != d["local_node"][r]
    cx.bump("remote_free", jnp.sum(jnp.where(rem, k_all, 0), axis=0))
    return k_cs, k_ot, k_all, rem


class _Layout(NamedTuple):
    """The allocated objects on the node classes a free run can reach, by slab, as the
    run starts (shapes: C node classes, 2R rep segments, B configurations)."""

    z: Any          # (2R, B) rep segments cs_0, pc_0, cs_1, ...: CPU slab, per-CPU partial
    cls: Any        # (C, B) the node classes (:func:`_pick_classes`)
    on_cls: Any     # per-node (N, B) field -> (C, B)
    from_cls: Any   # (C, B) counts -> per-node (N, B)
    on_seg: Any     # (C, 2R, B) rep segment on node class c
    z_end: Any      # (2R, B) a segment's end among its node's segments
    z_tot: Any      # (C, B) end of the rep segments
    u_end: Any      # (C, B) end of the partial list
    tot: Any        # (C, B) end of the full slabs (at least 1)


def _slab_layout(cx: _Ctx, k: _Rep, k_ot) -> _Layout:
    """The :class:`_Layout` a free run's objects that are no longer in their origin's CPU
    slab are split over (no kernel function: where the objects are)."""
    st, d, objs = cx.st, cx.d, k.objs
    # the slabs on every node class as the run starts, in destination order: per rep its
    # CPU slab (objects not tracked in pend_cs) and its per-CPU partial slabs, then the
    # node's partial list, then its full slabs
    # (the rep segments cs_0, pc_0, cs_1, ... each lie on one node class, their rep's
    # memory node; a segment's end is its cumulative size among its node's segments)
    # The split runs over a leading axis of the node classes the run's picks can land on
    # (:func:`_pick_classes`): all N, or under a static run bound of 1 just the class of
    # the single pick, the one-op model's choice of node (the others get no picks).
    zc = cx.whole("cs_inuse") - cx.whole("cs_tracked")
    z = jnp.stack([zc, cx.whole("pc_inuse")], axis=1).reshape((2 * R,) + zc.shape[1:])
    cls, on_cls, from_cls = _pick_classes(d["mem_node"], k_ot, d["max_run"])
    on_seg = jnp.repeat(d["mem_node"], 2, axis=0)[None] == cls[:, None]  # (C, 2R, B)
    cum_n = _cumsum(jnp.where(on_seg, z[None], 0), axis=1)
    z_end = jnp.sum(jnp.where(on_seg, cum_n, 0), axis=0)                 # (2R, B)
    z_tot = cum_n[:, -1]                                                 # (C, B)
    u_end = z_tot + on_cls(st["part_inuse"])
    tot = jnp.maximum(u_end + on_cls(st["full_slabs"]) * objs, 1)
    return _Layout(z, cls, on_cls, from_cls, on_seg, z_end, z_tot, u_end, tot)


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


def _sheaf_free(cx: _Ctx, k: _Rep, cfg: SimConfig, rem, k_all):
    """A free run's frees into the per-CPU sheaves, all before its slab frees (v6.18 for
    caches that ask for sheaves, every cache from v7.0; remote objects bypass the sheaf
    where ``remote_free_bypasses_sheaf``, v6.18 on): free_to_pcs() pushes onto the main
    sheaf while it has room; each time it is full, __pcs_replace_full_main() swaps it
    with an empty spare, else puts it into the barn while the barn holds fewer than
    ``barn_max_full`` full sheaves, else flushes its ``cap`` objects to node ``m``'s slabs
    under the list_lock (:func:`_bulk_free`).  Returns ``sh`` (R, B), the origins whose
    objects go to the sheaves, the sheaf frees ``nsh`` and ``full_main``, the frees that
    found the main sheaf full (each a slow path)."""
    st, cap, capm, sheaves = cx.st, k.cap, k.capm, k.sheaves
    m, own, has_barn = k.m, k.own, k.has_barn
    # -- sheaf frees first (free_to_pcs, __pcs_replace_full_main): the main sheaf, then
    #    one slow path per cap frees: the spare swap, barn puts, flushes
    sh = sheaves & ~((cfg.remote_free_bypasses_sheaf > 0) & rem)        # (R, B)
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
    _bulk_free(cx, m, fl * cap)
    cx.lock(m, fl)
    return sh, nsh, full_main


def _split_slab_frees(cx: _Ctx, k: _Rep, lay: _Layout, sh, k_cs, k_ot):
    """Where a free run's objects that skip the sheaves land, which __slab_free() finds
    from the object's slab: an object still in its origin's CPU slab goes there; the
    others, per node class, by systematic points (offset from ``w2``) over the slabs as
    the run starts (:class:`_Layout`).  Returns per rep (R, B) the frees into its CPU
    slab ``c_cs`` and into its per-CPU partial slabs ``c_pc``, and per node class (N, B)
    those into the partial list ``xU`` and into full slabs ``xF``."""
    d, w2 = cx.d, k.w2
    z, cls, from_cls, on_seg = lay.z, lay.cls, lay.from_cls, lay.on_seg
    z_end, z_tot, u_end, tot = lay.z_end, lay.z_tot, lay.u_end, lay.tot
    # -- objects still in their origin's CPU slab: the CPU's own freelist (fast) or
    #    another CPU's frozen slab (no lock)
    kcs = jnp.where(sh, 0, k_cs)
    kot = jnp.where(sh, 0, k_ot)
    # -- the other slab frees, per node class: systematic points over the sizes
    on = d["mem_node"][None] == cls[:, None]                             # (C, R, B)
    x = jnp.sum(jnp.where(on, kot[None], 0), axis=1)                    # (C, B)
    un = _i(w2 >> 1) % tot

    def below(end, n_, u_, t_):          # points of a node's run below a segment end
        return _below(end, n_, u_, t_, d["max_run"])

    def at_seg(v):                       # a node class's value at each of its segments
        return jnp.sum(jnp.where(on_seg, v[:, None], 0), axis=0)

    xs, us, ts = at_seg(x), at_seg(un), at_seg(tot)
    cz = (below(z_end, xs, us, ts) - below(z_end - z, xs, us, ts)).reshape(
        (R, 2) + z.shape[1:])
    c_cs = kcs + cz[:, 0]
    c_pc = cz[:, 1]
    at_u = below(u_end, x, un, tot)
    xU = from_cls(at_u - below(z_tot, x, un, tot))                      # (N, B)
    xF = from_cls(x - at_u)                      # the last segment takes the rest
    return c_cs, c_pc, xU, xF


def _frozen_frees(cx: _Ctx, c_cs, c_pc):
    """Frees into CPU slabs and per-CPU partial slabs: into this CPU's own CPU slab,
    slab_free()'s fast path onto its freelist; into another CPU's, __slab_free() onto the
    frozen slab's freelist (``cs_rfree``, which its owner takes on its next slow path);
    into per-CPU partial slabs, __slab_free() without the lock while they are frozen (v3.2
    to v6.7); from v6.8 (``pc_empty_locks``, folded into ``d["pc_lock_onehot"]``) a free
    that empties one takes the list_lock of its node (under the packing rule a listed slab
    empties every ``objs - 1`` frees).
    Returns the fast frees."""
    st, r = cx.st, cx.r
    mine = _REPS == r
    st["cs_inuse"] = cx.whole("cs_inuse") - c_cs
    st["cs_rfree"] = cx.whole("cs_rfree") + jnp.where(mine, 0, c_cs)
    pu = cx.whole("pc_inuse")
    # listed slabs hold at most objs - 1 objects each (a slab joins on its first free), so
    # the non-empty ones are ceil(inuse / (objs - 1)) without the slab count's bound
    cap1 = cx.d["cap1"]
    emptied = ceil_div(pu, cap1) - ceil_div(pu - c_pc, cap1)                   # (R, B)
    # per node class: the reps' memory nodes as a one-hot matrix (N, R) times the counts
    cx.lock_nodes(jnp.einsum("nr...,r...->n...", cx.d["pc_lock_onehot"], emptied))
    st["pc_inuse"] = pu - c_pc
    own_fast = jnp.sum(jnp.where(mine, c_cs, 0), axis=0)
    cx.radd("cs_free", own_fast)
    return own_fast


def _full_slab_frees(cx: _Ctx, k: _Rep, cfg: SimConfig, lay: _Layout, xF):
    """``xF[n]`` frees (N, B) into full slabs of node class n: __slab_free() makes each
    slab partial, frozen onto this CPU's per-CPU partial list (put_cpu_partial(), v3.2 to
    v6.18, for a slab of its memory node: :func:`_full_to_cpu_partial`), else added to
    the node's partial list under its list_lock (add_partial(); with one object per slab
    the now empty slab is freed, discard_slab(), once the node keeps min_partial).  Frees
    beyond the node's full slabs go into the slabs the run has just made partial: this
    CPU's per-CPU partial list while it holds objects, else the node's list
    (:func:`_part_frees`)."""
    st, objs, cps, mp, m = cx.st, k.objs, k.cps, k.mp, k.m
    on_cls, from_cls = lay.on_cls, lay.from_cls
    # full slabs become partial: frozen onto this CPU's partial list if it has one (and
    # the slab is on its memory node), else onto the node's list under the lock; picks
    # beyond the node's full slabs free into the slabs the run has just made partial
    F = st["full_slabs"]
    xF1 = jnp.minimum(xF, jnp.maximum(F, 0))
    xF2 = xF - xF1
    cpp = (cps > 0) & (cfg.cpu_slab > 0) & (_NODES == m)                 # (N, B)
    xnp = jnp.where(cpp, 0, xF1)
    st["full_slabs"] = F - xF1
    S = st["part_slabs"]
    keep = jnp.where(objs == 1, jnp.clip(mp - S, 0, xnp), xnp)
    st["part_slabs"] = S + keep
    st["part_inuse"] = st["part_inuse"] + keep * (objs - 1)
    cx.bump("slab_free", jnp.sum(xnp - keep, axis=0))
    cx.lock_nodes(xnp)
    _full_to_cpu_partial(cx, m, jnp.sum(jnp.where(cpp, xF1, 0), axis=0))
    xm2 = jnp.sum(jnp.where(cpp, xF2, 0), axis=0)
    pcu = cx.row("pc_inuse")
    into_pc = jnp.minimum(xm2, pcu)
    cx.rset("pc_inuse", pcu - into_pc)
    _part_frees(cx, jnp.where(cpp, xm2 - into_pc, xF2), on_cls, from_cls)


def _write_counters(cx: _Ctx, shape):
    """End of a run (no kernel function): the list_lock acquisitions go onto their node
    classes, this rep's rows are written back, and its counter increments (broadcast to
    the batch ``shape``) are added to its column of ``counts``."""
    st, r = cx.st, cx.r
    cx.flush_locks()
    cx.write_rows()
    st["counts"] = st["counts"].at[:, r].add(jnp.stack([jnp.broadcast_to(x, shape)
                                                        for x in cx.inc]))


def _part_frees(cx: _Ctx, x, on_cls, from_cls):
    """``x[n]`` frees (N, B) into node n's partial list: the free that takes a slab's last
    object (packing rule: U - 1 a multiple of objs - 1) takes the list_lock and discards
    the slab while the node keeps at least min_partial partial slabs.  Worked out on the
    node classes the frees can reach (``on_cls``/``from_cls`` of :func:`_pick_classes`)."""
    st, cap1, mp = cx.st, cx.d["cap1"], cx.d["min_partial"]
    x = on_cls(x)
    U, S = on_cls(st["part_inuse"]), on_cls(st["part_slabs"])
    emp = floor_div(U - 1, cap1) - floor_div(U - x - 1, cap1)
    disc = jnp.clip(S - mp + 1, 0, emp)
    st["part_inuse"] = st["part_inuse"] - from_cls(x)
    st["part_slabs"] = st["part_slabs"] - from_cls(disc)
    cx.bump("slab_free", jnp.sum(disc, axis=0))
    cx.lock_nodes(from_cls(emp))


def _bc(*xs):
    """The values broadcast to one common shape, as int32 (rows of a stacked table)."""
    return [jnp.broadcast_to(_i(x), jnp.broadcast_shapes(*(jnp.shape(y) for y in xs)))
            for x in xs]


def _full_to_cpu_partial(cx: _Ctx, m, x):
    """``x`` frees, each into a full slab of node ``m``, which then goes on this rep's
    per-CPU partial list (put_cpu_partial); a list already holding cpu_partial_slabs is
    first drained to the node (unfreeze_partials), so drains come every
    cpu_partial_slabs frees after the first."""
    st, objs, cap1, mp = cx.st, cx.d["objs"], cx.d["cap1"], cx.d["min_partial"]
    cps = _i(cx.d["cps"])
    p, pu = cx.row("pc_slabs"), cx.row("pc_inuse")
    t1 = jnp.maximum(cps - p, 0) + 1                 # the free that drains first
    D = jnp.where(x >= t1, 1 + floor_div(x - t1, jnp.maximum(cps, 1)), 0)
    s1, u1 = p + t1 - 1, pu + (t1 - 1) * (objs - 1)  # the list the first drain moves
    ne1 = _nonempty(s1, u1, cap1)
    e1 = s1 - ne1
    S = _get(st["part_slabs"], m)
    keep1 = jnp.clip(mp - (S + ne1), 0, e1)
    ne_s = _nonempty(cps, cps * (objs - 1), cap1)    # later drains: cps slabs each
    e_s = cps - ne_s
    S2 = S + ne1 + keep1
    keep_s = jnp.clip(mp - (S2 + (D - 1) * ne_s), 0, (D - 1) * e_s)
    drained = D > 0
    cx.nadd("part_slabs", m, jnp.where(drained, ne1 + keep1 + (D - 1) * ne_s + keep_s, 0))
    cx.nadd("part_inuse", m, jnp.where(drained, u1 + (D - 1) * cps * (objs - 1), 0))
    cx.bump("slab_free", jnp.where(drained, e1 - keep1 + (D - 1) * e_s - keep_s, 0))
    cx.bump("cpu_partial_drain", D)
    cx.lock(m, D)
    left = jnp.where(drained, 1 + x - t1 - (D - 1) * cps, p + x)
    cx.rset("pc_slabs", left)
    cx.rset("pc_inuse", jnp.where(drained, left * (objs - 1), pu + x * (objs - 1)))


def _bulk_take(cx: _Ctx, m, t):
    """Allocate ``t`` objects from node ``m``: free objects on its partial list first
    (slabs that fill up leave the list), then new slabs from the page allocator (a last,
    partly used one goes on the list)."""
    st, objs = cx.st, cx.d["objs"]
    S = _get(st["part_slabs"], m)
    U = _get(st["part_inuse"], m)
    x = jnp.minimum(t, S * objs - U)
    U = U + x
    f = jnp.maximum(U - S * (objs - 1), 0)
    rem = t - x
    g = ceil_div(rem, objs)
    last = rem - jnp.maximum(g - 1, 0) * objs
    partial_last = (g > 0) & (last < objs)
    dS = -f + _i(partial_last)
    dU = x - f * objs + jnp.where(partial_last, last, 0)
    cx.nadd("part_slabs", m, dS)
    cx.nadd("part_inuse", m, dU)
    cx.nadd("full_slabs", m, f + jnp.where(partial_last, g - 1, g))
    cx.bump("slab_alloc", g)


def _bulk_free(cx: _Ctx, m, k):
    """Free ``k`` objects (a flushed sheaf) into node ``m``'s slabs: partial slabs first,
    then full ones (which become partial); empty slabs beyond min_partial are discarded."""
    st, objs = cx.st, cx.d["objs"]
    U = _get(st["part_inuse"], m)
    F = _get(st["full_slabs"], m)
    x = jnp.minimum(k, U)
    y = jnp.minimum(k - x, F * objs)
    g = ceil_div(y, objs)
    S = _get(st["part_slabs"], m) + g
    U = U - x + g * objs - y
    e = S - _nonempty(S, U, cx.d["cap1"])
    drop = jnp.where(k > 0, jnp.clip(S - cx.d["min_partial"], 0, e), 0)
    cx.nadd("part_inuse", m, -x + g * objs - y)
    cx.nadd("part_slabs", m, g - drop)
    cx.nadd("full_slabs", m, -g)
    cx.bump("slab_free", drop)


def _derived(cfg: SimConfig, max_run: int = MAX_OPS_PER_STEP) -> dict:
    """Per-run constants of the step (computed once, outside the scan); ``max_run`` is the
    static run bound of the batch (:func:`run_bound`), kept as a Python int."""
    objs = _i(cfg.objs_per_slab)
    node = _i(cfg.rep_node)
    mem = _i(cfg.rep_mem_node)
    memless = cfg.rep_memoryless > 0
    barn_at = (cfg.barns == BARNS_ALL) | ((cfg.barns == BARNS_MEMORY) & (cfg.node_has_memory > 0))
    use_sh = cfg.memoryless_cpus_use_sheaves > 0
    return dict(
        objs=objs,
        cap1=jnp.maximum(objs - 1, 1),
        min_partial=_i(cfg.min_partial),
        cps=_i(cfg.cpu_partial_slabs),
        b=_i(cfg.ops_per_step),
        max_run=int(max_run),
        node=node,
        mem_node=mem,
        # numa_mem_id() as the v7.0 sheaf test sees it: a memoryless node's own id unless
        # the profile lets memoryless CPUs use sheaves (v7.1)
        local_node=jnp.where(memless & ~use_sh, node, mem),
        alloc_local=_i(~memless | (cfg.memoryless_fallback > 0)),
        has_barn=jnp.any((node[None] == _NODES[:, :, None]) & barn_at[:, None], axis=0)
        & (cfg.sheaf_capacity > 0),
        # (N, R) one-hot of each rep's memory node class, zero where frees that empty a
        # per-CPU partial slab take no lock (before v6.8): see _frozen_frees
        pc_lock_onehot=_i((mem[None] == _NODES[:, :, None]) & (cfg.pc_empty_locks > 0)),
    )


def _gauges(st, d, cfg):
    """Per-step gauge values: rows (R,) and rows (N,)."""
    cs_held = _i((st["cs_free"] + st["cs_inuse"] + st["cs_rfree"]) > 0) + st["pc_slabs"]
    held = jnp.sum(jnp.where(d["mem_node"][:, None] == _NODES[None], cs_held[:, None], 0),
                   axis=0)
    S, U = st["part_slabs"], st["part_inuse"]
    rep = jnp.stack([st["out"], st["pc_slabs"], st["main"] + st["spare"]])
    node = jnp.stack([S + st["full_slabs"] + held, S - _nonempty(S, U, d["cap1"]),
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
    st = lax.fori_loop(0, R, lambda r, s: _rep_op(r, w[r], s, cfg, d), dict(st))
    rep, node = _gauges(st, d, cfg)
    for lo, hi, g in (("gsum_rep", "ghi_rep", rep), ("gsum_node", "ghi_node", node)):
        tot = st[lo] + g
        st[hi] = st[hi] + (tot >> GAUGE_SHIFT)
        st[lo] = tot & ((1 << GAUGE_SHIFT) - 1)
    return st


def init_state(cfg: SimConfig) -> State:
    """Empty caches: no slabs, empty sheaves, nothing allocated (batch-minor: every field
    has a trailing batch axis of the size of ``cfg.objs_per_slab``)."""
    bs = jnp.shape(cfg.objs_per_slab)

    def z(*s):
        return jnp.zeros(s + bs, _I32)

    return State(
        pend=z(R, R), pend_cs=z(R, R), cs_tracked=z(R), out=z(R), pend_tot=z(R), cs_free=z(R),
        cs_inuse=z(R), cs_rfree=z(R), pc_slabs=z(R), pc_inuse=z(R), main=z(R), spare=z(R),
        phase=z(R), phase_left=jnp.asarray(cfg.workload.burst, _I32), part_slabs=z(N),
        part_inuse=z(N), full_slabs=z(N), barn_full=z(N), barn_empty=z(N),
        counts=z(len(COUNTER_FIELDS), R), lock_node=z(N), gsum_rep=z(3, R), gsum_node=z(3, N),
        ghi_rep=z(3, R), ghi_node=z(3, N),
    )


def _finish(st: State, steps: int) -> Counters:
    """Counters of a batch-minor final state, batch-major ((B, R), (B, N))."""

    def front(x):
        return jnp.moveaxis(x, -1, 0)

    c = {name: front(st.counts[k]) for k, name in enumerate(COUNTER_FIELDS)}
    den = jnp.float32(max(steps, 1))
    scale = jnp.float32(1 << GAUGE_SHIFT)
    g = (st.ghi_rep.astype(jnp.float32) * scale + st.gsum_rep.astype(jnp.float32)) / den
    gn = (st.ghi_node.astype(jnp.float32) * scale + st.gsum_node.astype(jnp.float32)) / den
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
    traced ``ops_per_step`` (a caller's own jit) gets the general bound."""
    b = cfgs.ops_per_step
    if isinstance(b, jax.core.Tracer):
        return MAX_OPS_PER_STEP
    return 1 if int(np.max(np.asarray(b))) <= 1 else MAX_OPS_PER_STEP


def _bound(cfgs: SimConfig, max_run) -> int:
    """The static run bound to compile for: :func:`run_bound` of ``cfgs``, or the caller's
    ``max_run`` (1 or larger), refused with a one-line error when a concrete
    ``ops_per_step`` exceeds 1 under ``max_run == 1``."""
    if max_run is None:
        return run_bound(cfgs)
    if isinstance(max_run, bool) or not isinstance(max_run, (int, np.integer)) or max_run < 1:
        raise SlabtuneError(f"max_run: {max_run!r} is not a positive integer")
    if max_run == 1 and run_bound(cfgs) != 1 \
            and not isinstance(cfgs.ops_per_step, jax.core.Tracer):
        raise SlabtuneError("max_run: 1 but some configuration has ops_per_step > 1")
    return 1 if max_run == 1 else MAX_OPS_PER_STEP


def run_state(seeds_or_draws, cfgs: SimConfig, steps: int, pre_drawn: bool,
              max_run: int = MAX_OPS_PER_STEP) -> State:
    """The final batch-minor :class:`State` of a batch of runs (traceable; ``steps`` and
    ``max_run`` static).  ``cfgs`` is batch-major (see :func:`stack_configs`);
    ``seeds_or_draws`` is (B,) uint32 seeds or (steps, R, K, B) words; ``max_run`` bounds
    every configuration's ``ops_per_step`` (:func:`run_bound`)."""
    cfg = _batch_minor(cfgs)
    d = _derived(cfg, max_run)
    st0 = init_state(cfg)._asdict()
    if pre_drawn:
        def body(st, w):
            return step(w, st, cfg, d), None
        xs = seeds_or_draws
    else:
        seeds = seeds_or_draws

        def body(st, t):
            return step(_draws_at(seeds, t), st, cfg, d), None
        xs = jnp.arange(steps, dtype=_U32)
    st, _ = lax.scan(body, st0, xs)
    return State(**st)


def _one(cfg: SimConfig) -> SimConfig:
    return jax.tree_util.tree_map(lambda x: jnp.asarray(x)[None], cfg)


def _first(c: Counters) -> Counters:
    return Counters(*(x[0] for x in c))


def simulate(key, cfg: SimConfig, steps: int, max_run: int | None = None) -> Counters:
    """Run ``steps`` steps of configuration ``cfg`` from empty caches; the random stream is
    fixed by ``key`` (see :func:`draws`).  ``max_run``: the static run bound, by default
    :func:`run_bound` of ``cfg``."""
    return _simulate(key, cfg, steps, _bound(cfg, max_run))


@functools.partial(jax.jit, static_argnums=(2, 3))
def _simulate(key, cfg, steps, max_run):
    seeds = seed_of(key)[None]
    return _first(_finish(run_state(seeds, _one(cfg), steps, False, max_run), steps))


def simulate_draws(w, cfg: SimConfig, max_run: int | None = None) -> Counters:
    """As :func:`simulate`, with the random words given: ``w`` of shape (steps, R, K)."""
    return _simulate_draws(w, cfg, _bound(cfg, max_run))


@functools.partial(jax.jit, static_argnums=2)
def _simulate_draws(w, cfg, max_run):
    steps = w.shape[0]
    return _first(_finish(run_state(w[..., None], _one(cfg), steps, True, max_run), steps))


def simulate_batch(keys, cfgs: SimConfig, steps: int, max_run: int | None = None) -> Counters:
    """:func:`simulate` over a batch of configurations (leading axis of ``keys`` and of
    every field of ``cfgs``, see :func:`stack_configs`); the same result as vmapping
    :func:`simulate`, computed batch-minor.  ``max_run``: the static run bound, by default
    :func:`run_bound` of ``cfgs`` (pass it when calling this inside your own jit)."""
    return _simulate_batch(keys, cfgs, steps, _bound(cfgs, max_run))


@functools.partial(jax.jit, static_argnums=(2, 3))
def _simulate_batch(keys, cfgs, steps, max_run):
    seeds = jax.vmap(seed_of)(keys)
    return _finish(run_state(seeds, cfgs, steps, False, max_run), steps)


def counters_numpy(c: Counters) -> dict:
    """Counters as a dict of NumPy arrays."""
    return {k: np.asarray(v) for k, v in c._asdict().items()}

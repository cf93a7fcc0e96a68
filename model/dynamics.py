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

from slabtune.model import policy as PL
from slabtune.model import profiles as P
from slabtune.model import workloads as W
from slabtune.model.topology import Topology

R = W.R
N = W.N
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
    ``node_weight`` (float); and the :class:`~slabtune.model.workloads.Workload`.
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
    workload: W.Workload


#: Event counters, one int32 per rep (what that rep's CPU did).
COUNTER_FIELDS = (
    "ops", "allocs", "frees", "alloc_fast", "alloc_slow", "free_fast", "free_slow",
    "remote_free", "list_lock", "list_lock_remote", "slab_alloc", "slab_free",
    "sheaf_alloc_hit", "sheaf_free_hit", "sheaf_refill", "sheaf_flush", "barn_get",
    "barn_put", "barn_get_fail", "barn_put_fail", "cpu_partial_drain",
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


def config_from(structure, profile: P.KernelProfile, topology: Topology, workload,
                *, memoryless_fallback: bool | None = None, barns: str | None = None,
                min_partial: int | None = None, cpu_partial_slabs: int | None = None,
                sheaf_capacity: int | None = None,
                barn_max_full: int = P.BARN_MAX_FULL,
                barn_max_empty: int = P.BARN_MAX_EMPTY) -> SimConfig:
    """Build a :class:`SimConfig` for one configuration.

    ``structure``: a :class:`slabtune.model.policy.Structure` of scalars (order,
    objs_per_slab, min_partial, cpu_partial_slabs, sheaf_capacity).  ``workload``: a
    ``(Workload, RepLayout)`` pair from :mod:`slabtune.model.workloads`, or a dict
    ``{"kind": ..., **params}`` built on ``topology``.  Keyword overrides stand for sysfs
    writes and boot-time switches (``barns``: "none", "memory_nodes" or "all_nodes").
    """
    if isinstance(workload, dict):
        params = dict(workload)
        kind = params.pop("kind")
        workload = W.build(kind, topology, **params)
    wl, lay = workload
    cap = int(np.asarray(structure.sheaf_capacity)) if sheaf_capacity is None else int(sheaf_capacity)
    cps = int(np.asarray(structure.cpu_partial_slabs)) if cpu_partial_slabs is None else int(cpu_partial_slabs)
    if not profile.has_cpu_partial:
        cps = 0
    mp = int(np.asarray(structure.min_partial)) if min_partial is None else int(min_partial)
    fb = profile.memoryless_fallback if memoryless_fallback is None else bool(memoryless_fallback)
    barn_name = profile.barns if barns is None else barns
    if barn_name not in P.BARN_NODES:
        raise ValueError(f"barns: {barn_name!r} is not one of {', '.join(P.BARN_NODES)}")
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
        barns=_scalar(P.BARN_NODES.index(barn_name)),
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
        workload=W.Workload(*(np.asarray(f, np.int32) for f in wl)),
    )


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


def _cdiv(a, b):
    return (a + b - 1) // b


def _nonempty(slabs, inuse, cap1):
    """Non-empty slabs of a partial list under the packing rule: ceil(inuse / (objs-1))."""
    return jnp.minimum(slabs, _cdiv(inuse, cap1))


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
        self.rows = {}    # per-rep field -> this rep's current (B,) entry

    def bump(self, name, v):
        self.inc[_CI[name]] = self.inc[_CI[name]] + _i(v)

    def lock(self, node, cond):
        """A list_lock acquisition on node class ``node`` (where ``cond``)."""
        self.bump("list_lock", cond)
        self.bump("list_lock_remote", cond & (node != self.d["node"][self.r]))
        ent = self.locks.setdefault(id(node), [node, _i(0)])
        ent[1] = ent[1] + _i(cond)

    def flush_locks(self):
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


def _rep_op(r, w, st: dict, cfg: SimConfig, d: dict) -> dict:
    """One allocator op of rep ``r``: the workload's choice, then an allocation or a free.

    ``w``: this rep's K random words.  Allocation and free are computed as masked updates
    (``do_a``/``do_f`` exclude each other), in the order of the reference's branches.
    """
    st = dict(st)
    cx = _Ctx(st, r, d)
    wl = cfg.workload
    objs, cap1 = d["objs"], d["cap1"]
    cap = _i(cfg.sheaf_capacity)
    sheaves = cap > 0
    w0, w1, w2 = w[0], w[1], w[2]
    m = d["mem_node"][r]
    own = d["node"][r]
    has_barn = d["has_barn"][r]

    # ---- workload: allocate or free?
    alloc_p = wl.alloc_p[r]
    burst = wl.burst[r]
    can_a = (wl.active[r] > 0) & (alloc_p > 0) & (cx.row("out") < wl.live_target[r])
    can_f = (wl.active[r] > 0) & (cx.row("pend_tot") > 0)
    bursty = burst > 0
    want_a = jnp.where(bursty, cx.row("phase") == 0, _i(w0 >> 16) < alloc_p)
    do_a = can_a & (want_a | ~can_f)
    do_f = can_f & ~do_a
    did = do_a | do_f
    left = cx.row("phase_left") - _i(bursty & did)
    flip = bursty & did & (left <= 0)
    cx.rset("phase", 1 - cx.row("phase"), flip)
    cx.rset("phase_left", jnp.where(flip, burst, left))
    cx.bump("ops", did)

    # ================================================================ allocation
    lo16 = _i(w1 & _U32(0xFFFF))
    j = jnp.sum(_i(lo16 >= wl.free_cum[r]), axis=0)  # first rep whose cumulative share exceeds it
    j = jnp.minimum(j, R - 1)
    cx.bump("allocs", do_a)

    # -- sheaf path (alloc_from_pcs, __pcs_replace_empty_main)
    a_sh = do_a & sheaves
    main_r, spare_r = cx.row("main"), cx.row("spare")
    hit = a_sh & (main_r > 0)
    swap = a_sh & ~hit & (spare_r > 0)
    bget = a_sh & ~hit & ~swap & has_barn & (_get(st["barn_full"], own) > 0)
    refill = a_sh & ~hit & ~swap & ~bget
    cx.bump("sheaf_alloc_hit", hit)
    cx.bump("barn_get", bget)
    cx.bump("barn_get_fail", refill & has_barn)
    cx.bump("sheaf_refill", refill)
    cx.rset("main", jnp.where(hit, main_r - 1, jnp.where(swap, spare_r - 1, cap - 1)), a_sh)
    cx.rset("spare", 0, swap)
    cx.nadd("barn_full", own, -_i(bget))
    cx.nadd("barn_empty", own,
            _i(bget & (_get(st["barn_empty"], own) < cfg.barn_max_empty)))

    # -- a CPU on a memoryless node without the numa_mem_id() fix never finds its CPU slab
    #    "local": every object comes from the node's partial list under its lock
    direct = do_a & ~sheaves & (d["alloc_local"][r] == 0)

    # -- CPU slab (slab_alloc fast path, ___slab_alloc)
    a_cs = do_a & ~sheaves & ~direct
    fast = a_cs & (cx.row("cs_free") > 0)
    slow = a_cs & ~fast
    rf = slow & (cx.row("cs_rfree") > 0)
    newslab = slow & ~rf
    deact_full = newslab & (cx.row("cs_inuse") > 0)
    from_pc = newslab & (cx.row("pc_slabs") > 0)
    S_m = _get(st["part_slabs"], m)
    U_m = _get(st["part_inuse"], m)
    from_node = newslab & ~from_pc & (S_m > 0)
    from_page = newslab & ~from_pc & ~from_node
    pcs, pcu = cx.row("pc_slabs"), cx.row("pc_inuse")
    pc_h = jnp.where(pcs > _nonempty(pcs, pcu, cap1), 0, pcu - (pcs - 1) * cap1)
    nd_h = jnp.where(S_m > _nonempty(S_m, U_m, cap1), 0, U_m - (S_m - 1) * cap1)
    took = jnp.where(from_pc, pc_h, jnp.where(from_node, nd_h, 0))
    cx.radd("pc_slabs", -_i(from_pc))
    cx.radd("pc_inuse", -jnp.where(from_pc, pc_h, 0))
    cx.nadd("full_slabs", m, _i(deact_full))
    # get_partial_node(): in the same lock hold, more slabs go to the (empty) per-CPU
    # partial list until it has more than cpu_partial_slabs / 2; most free ones first
    S1, U1 = S_m - 1, U_m - nd_h
    e1 = S1 - _nonempty(S1, U1, cap1)
    k = jnp.where(from_node & (cfg.cpu_partial_slabs > 0),
                  jnp.minimum(S1, cfg.cpu_partial_slabs // 2 + 1), 0)
    mv = jnp.where(k > 0, jnp.minimum(U1, (k - jnp.minimum(k, e1)) * cap1), 0)
    cx.radd("pc_slabs", k)
    cx.radd("pc_inuse", mv)
    cx.nadd("part_slabs", m, -_i(from_node) - k)
    cx.nadd("part_inuse", m, -jnp.where(from_node, nd_h, 0) - mv)
    cs_free = jnp.where(rf, cx.row("cs_rfree"),
                        jnp.where(newslab, objs - took, cx.row("cs_free")))
    cs_inuse = jnp.where(newslab, took, cx.row("cs_inuse"))
    cx.rset("cs_free", cs_free - _i(a_cs))
    cx.rset("cs_inuse", cs_inuse + _i(a_cs))
    cx.rset("cs_rfree", 0, slow)
    # a new CPU slab: the objects of the old one are no longer in the CPU slab
    tracked = jnp.where(newslab, 0, cx.row("cs_tracked"))
    cx.rset("cs_tracked", tracked + _i(a_cs))
    pcs_row = jnp.where(newslab, 0, st["pend_cs"][r]) + jnp.where((_REPS == j) & a_cs, 1, 0)
    st["pend_cs"] = st["pend_cs"].at[r].set(pcs_row)
    cx.lock(m, from_node)

    # -- bulk allocation from node m: a sheaf refill (cap objects) or a direct one (1)
    _bulk_take(cx, m, jnp.where(refill, cap, jnp.where(direct, 1, 0)))
    cx.lock(m, refill | direct)

    cx.bump("alloc_fast", hit | fast)
    cx.bump("alloc_slow", do_a & ~(hit | fast))
    cx.bump("slab_alloc", from_page)
    st["pend"] = st["pend"].at[r].add(jnp.where((_REPS == j) & do_a, 1, 0))
    cx.radd("out", do_a)
    cx.nadd("pend_tot", j, do_a)

    # ================================================================ free
    # a materialisation point between the two halves: XLA then fuses each half on its own
    # (half the compile time, same speed)
    cx.write_rows()
    inc = tuple(jnp.broadcast_to(x, jnp.shape(do_a)) for x in cx.inc)
    st_b, inc, do_f, w1, w2 = lax.optimization_barrier((dict(st), inc, do_f, w1, w2))
    st.update(st_b)
    cx.inc = list(inc)
    cx.bump("frees", do_f)
    # which pending object: segments (origin 0 in its CPU slab, origin 0 elsewhere,
    # origin 1 in its CPU slab, ...), the word picks one object uniformly
    col = st["pend"][:, r]
    col_cs = st["pend_cs"][:, r]
    seg = jnp.stack([col_cs, col - col_cs], axis=1).reshape((2 * R,) + col.shape[1:])
    c = _i(w1 >> 1) % jnp.maximum(cx.row("pend_tot"), 1)
    sel = jnp.minimum(jnp.sum(_i(jnp.cumsum(seg, axis=0) <= c), axis=0), 2 * R - 1)
    origin = sel // 2
    in_cs_any = do_f & (sel % 2 == 0)       # in the origin's current CPU slab
    in_cs = in_cs_any & (origin == r)       # ... which is this CPU's own
    rem_cs = in_cs_any & (origin != r)      # ... another CPU's (frozen) slab
    n = _get(d["mem_node"], origin)
    remote = n != d["local_node"][r]
    cx.bump("remote_free", do_f & remote)
    st["pend"] = st["pend"].at[:, r].add(-jnp.where((_REPS == origin) & do_f, 1, 0))
    st["pend_cs"] = st["pend_cs"].at[:, r].add(-jnp.where((_REPS == origin) & in_cs_any, 1, 0))
    cx.nadd("cs_tracked", origin, -_i(in_cs_any))
    cx.nadd("out", origin, -_i(do_f))
    cx.radd("pend_tot", -_i(do_f))

    # -- sheaf free (free_to_pcs, __pcs_replace_full_main)
    f_sh = do_f & sheaves & ~((cfg.remote_free_bypasses_sheaf > 0) & remote)
    main_r, spare_r = cx.row("main"), cx.row("spare")
    fhit = f_sh & (main_r < cap)
    fswap = f_sh & ~fhit & (spare_r == 0)
    bput = f_sh & ~fhit & ~fswap & has_barn & (_get(st["barn_full"], own) < cfg.barn_max_full)
    flush = f_sh & ~fhit & ~fswap & ~bput
    cx.bump("sheaf_free_hit", fhit)
    cx.bump("barn_put", bput)
    cx.bump("barn_put_fail", flush & has_barn)
    cx.bump("sheaf_flush", flush)
    cx.rset("main", jnp.where(fhit, main_r + 1, 1), f_sh)
    cx.rset("spare", cap, fswap)
    cx.nadd("barn_full", own, _i(bput))
    cx.nadd("barn_empty", own, -_i(bput & (_get(st["barn_empty"], own) > 0)))
    _bulk_free(cx, m, jnp.where(flush, cap, 0))
    cx.lock(m, flush)

    # -- slab free (do_slab_free fast path, __slab_free)
    f_sl = do_f & ~f_sh
    own_cs = f_sl & in_cs
    other = f_sl & ~in_cs_any
    # an object of another CPU's current CPU slab: freed into that frozen slab, no lock
    cx.nadd("cs_rfree", origin, _i(f_sl & rem_cs))
    cx.nadd("cs_inuse", origin, -_i(f_sl & rem_cs))
    # which slab holds it, by allocated objects on node n: frozen slabs (CPU slabs and
    # per-CPU partial slabs, rep by rep), then the node's partial list, then full slabs
    on_n = d["mem_node"] == n
    zc = jnp.where(on_n, cx.whole("cs_inuse") - cx.whole("cs_tracked"), 0)
    zp = jnp.where(on_n, cx.whole("pc_inuse"), 0)
    Un = _get(st["part_inuse"], n)
    Sn = _get(st["part_slabs"], n)
    Fn = _get(st["full_slabs"], n)
    z2 = jnp.stack([zc, zp], axis=1).reshape((2 * R,) + zc.shape[1:])  # cs_0, pc_0, cs_1..
    zcum = jnp.cumsum(z2, axis=0)
    ztot = zcum[-1]
    tot = ztot + Un + Fn * objs
    dd = _i(w2 >> 1) % jnp.maximum(tot, 1)
    slot = jnp.minimum(jnp.sum(_i(zcum <= dd), axis=0), 2 * R - 1)
    kk = slot // 2
    in_pc = (slot % 2) == 1
    to_frozen = other & (dd < ztot)
    to_part = other & ~to_frozen & (dd < ztot + Un)
    to_full = other & ~to_frozen & ~to_part
    fz_cs = to_frozen & ~in_pc
    own_hit = fz_cs & (kk == r)
    ffast = own_cs | own_hit
    cx.radd("cs_free", ffast)
    cx.nadd("cs_inuse", kk, -_i(fz_cs))
    cx.radd("cs_inuse", -_i(own_cs))
    cx.nadd("cs_rfree", kk, _i(fz_cs & ~own_hit))
    cx.nadd("pc_inuse", kk, -_i(to_frozen & in_pc))
    # the free that takes a partial slab's last object takes the list_lock and discards
    # the slab if the node already keeps min_partial partial slabs
    empties = to_part & (((Un - 1) % cap1) == 0)
    discard = empties & (Sn >= cfg.min_partial)
    cx.nadd("part_inuse", n, -_i(to_part))
    cx.nadd("part_slabs", n, -_i(discard))
    cx.lock(n, empties)
    cx.bump("slab_free", discard)
    # a full slab becomes partial: frozen onto this CPU's partial list if it has one (and
    # the slab is on its memory node), else onto the node's list under the lock
    to_cpp = to_full & (cfg.cpu_partial_slabs > 0) & (cfg.cpu_slab > 0) & (n == m)
    to_np = to_full & ~to_cpp
    cx.nadd("full_slabs", n, -_i(to_full))
    _drain(cx, m, to_cpp & (cx.row("pc_slabs") >= cfg.cpu_partial_slabs))
    cx.radd("pc_slabs", to_cpp)
    cx.radd("pc_inuse", jnp.where(to_cpp, objs - 1, 0))
    cx.lock(n, to_np)
    np_discard = to_np & (objs == 1) & (_get(st["part_slabs"], n) >= cfg.min_partial)
    np_keep = to_np & ~np_discard
    cx.nadd("part_slabs", n, np_keep)
    cx.nadd("part_inuse", n, jnp.where(np_keep, objs - 1, 0))
    cx.bump("slab_free", np_discard)

    cx.bump("free_fast", fhit | ffast)
    cx.bump("free_slow", do_f & ~(fhit | ffast))
    cx.flush_locks()
    cx.write_rows()
    shape = jnp.shape(do_a)
    st["counts"] = st["counts"].at[:, r].add(jnp.stack([jnp.broadcast_to(x, shape)
                                                        for x in cx.inc]))
    return st


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
    g = _cdiv(rem, objs)
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
    g = _cdiv(y, objs)
    S = _get(st["part_slabs"], m) + g
    U = U - x + g * objs - y
    e = S - _nonempty(S, U, cx.d["cap1"])
    drop = jnp.where(k > 0, jnp.clip(S - cx.d["min_partial"], 0, e), 0)
    cx.nadd("part_inuse", m, -x + g * objs - y)
    cx.nadd("part_slabs", m, g - drop)
    cx.nadd("full_slabs", m, -g)
    cx.bump("slab_free", drop)


def _drain(cx: _Ctx, m, cond):
    """unfreeze_partials(): move this rep's per-CPU partial slabs to node ``m``'s list under
    one lock; empty ones beyond min_partial go back to the page allocator."""
    st, r = cx.st, cx.r
    s = jnp.where(cond, cx.row("pc_slabs"), 0)
    u = jnp.where(cond, cx.row("pc_inuse"), 0)
    ne = _nonempty(s, u, cx.d["cap1"])
    e = s - ne
    S = _get(st["part_slabs"], m) + ne
    keep = jnp.clip(cx.d["min_partial"] - S, 0, e)
    cx.nadd("part_slabs", m, ne + keep)
    cx.nadd("part_inuse", m, u)
    cx.rset("pc_slabs", 0, cond)
    cx.rset("pc_inuse", 0, cond)
    cx.bump("slab_free", e - keep)
    cx.bump("cpu_partial_drain", cond)
    cx.lock(m, cond)


def _derived(cfg: SimConfig) -> dict:
    """Per-run constants of the step (computed once, outside the scan)."""
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
        node=node,
        mem_node=mem,
        # numa_mem_id() as the v7.0 sheaf test sees it: a memoryless node's own id unless
        # the profile lets memoryless CPUs use sheaves (v7.1)
        local_node=jnp.where(memless & ~use_sh, node, mem),
        alloc_local=_i(~memless | (cfg.memoryless_fallback > 0)),
        has_barn=jnp.any((node[None] == _NODES[:, :, None]) & barn_at[:, None], axis=0)
        & (cfg.sheaf_capacity > 0),
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


def step(w, st: dict, cfg: SimConfig, d: dict | None = None) -> dict:
    """Advance one step: every rep, in order 0..R-1, does at most one allocator op.

    ``w``: the step's (R, K) uint32 random words; ``st``: the state as a dict of arrays
    (the fields of :class:`State`).  Pure: returns the new state.
    """
    if d is None:
        d = _derived(cfg)
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
    z = lambda *s: jnp.zeros(s + bs, _I32)
    return State(
        pend=z(R, R), pend_cs=z(R, R), cs_tracked=z(R), out=z(R), pend_tot=z(R), cs_free=z(R), cs_inuse=z(R),
        cs_rfree=z(R), pc_slabs=z(R), pc_inuse=z(R), main=z(R), spare=z(R), phase=z(R),
        phase_left=jnp.asarray(cfg.workload.burst, _I32), part_slabs=z(N), part_inuse=z(N),
        full_slabs=z(N), barn_full=z(N), barn_empty=z(N),
        counts=z(len(COUNTER_FIELDS), R), lock_node=z(N), gsum_rep=z(3, R), gsum_node=z(3, N),
        ghi_rep=z(3, R), ghi_node=z(3, N),
    )


def _finish(st: State, steps: int) -> Counters:
    """Counters of a batch-minor final state, batch-major ((B, R), (B, N))."""
    front = lambda x: jnp.moveaxis(x, -1, 0)
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


def run_state(seeds_or_draws, cfgs: SimConfig, steps: int, pre_drawn: bool) -> State:
    """The final batch-minor :class:`State` of a batch of runs (traceable; ``steps``
    static).  ``cfgs`` is batch-major (see :func:`stack_configs`); ``seeds_or_draws`` is
    (B,) uint32 seeds or (steps, R, K, B) words."""
    cfg = _batch_minor(cfgs)
    d = _derived(cfg)
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


@functools.partial(jax.jit, static_argnums=2)
def simulate(key, cfg: SimConfig, steps: int) -> Counters:
    """Run ``steps`` steps of configuration ``cfg`` from empty caches; the random stream is
    fixed by ``key`` (see :func:`draws`)."""
    seeds = seed_of(key)[None]
    return _first(_finish(run_state(seeds, _one(cfg), steps, False), steps))


@jax.jit
def simulate_draws(w, cfg: SimConfig) -> Counters:
    """As :func:`simulate`, with the random words given: ``w`` of shape (steps, R, K)."""
    steps = w.shape[0]
    return _first(_finish(run_state(w[..., None], _one(cfg), steps, True), steps))


@functools.partial(jax.jit, static_argnums=2)
def simulate_batch(keys, cfgs: SimConfig, steps: int) -> Counters:
    """:func:`simulate` over a batch of configurations (leading axis of ``keys`` and of
    every field of ``cfgs``, see :func:`stack_configs`); the same result as vmapping
    :func:`simulate`, computed batch-minor."""
    seeds = jax.vmap(seed_of)(keys)
    return _finish(run_state(seeds, cfgs, steps, False), steps)


def counters_numpy(c: Counters) -> dict:
    """Counters as a dict of NumPy arrays."""
    return {k: np.asarray(v) for k, v in c._asdict().items()}

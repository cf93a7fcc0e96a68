"""SLAB dynamics (mm/slab.c, CONFIG_SLAB, removed in v6.8): per-CPU array caches, the
node's shared array, alien caches and the node's slab lists, one operation per rep per step.

Same shape of computation as :mod:`slabtune.model.dynamics` (SLUB): a pure ``step`` over a
state dict of int32 arrays, ``lax.scan`` over steps (:func:`simulate`), one jit over a batch
of configurations laid out batch-minor (:func:`simulate_batch`), ``R`` representative CPUs
("reps") and ``N`` node classes from :mod:`slabtune.model.workloads`.  The rules, written as
plain branches over Python ints, are :mod:`slabtune.model.slab_reference`; fed the same
random words both give the same integers (``tests/test_slab_dynamics.py``).

What a rep does, restated from mm/slab.c (6.1: Debian's 6.1.192; 3.1 and 2.6.33: the
2.6.35-3.x mm/slab.c, whose functions below are those of both apart from numa_mem_id()):

* **Allocation** (``____cache_alloc()``): pop the CPU's array (``ac->avail``; fast, no
  lock).  Empty: ``cache_alloc_refill()`` under the local node's list_lock takes up to
  ``batchcount`` objects (16 while the array was not touched since the last reap,
  BATCHREFILL_LIMIT) from the node's shared array, else from its partial and free slabs,
  else grows the cache by one slab and takes them from it.
* **Free** (``___cache_free()``): an object of another node than the CPU's local node goes
  to the local node's alien array for that node (``cache_free_alien()``, under the alien
  lock); a full alien array is first drained to its node (``__drain_alien_cache()``: that
  node's list_lock, into its shared array as far as it has room, the rest back to the
  slabs).  A local object is pushed on the CPU's array (fast); a full array is first
  flushed by ``batchcount`` objects (``cache_flusharray()``, list_lock): into the shared
  array if it has room, else back to their slabs (``free_block()``), which destroys free
  slabs while the node holds more than ``free_limit`` free objects.
* **cache_reap()** every ``reap_interval`` steps (0: never; the kernel's is 2 s per CPU,
  millions of operations at the model's pace): each rep drains the alien arrays of its
  local node, and a part of its array unless touched since the last reap
  (``drain_array()``: ``(limit + 4) / 5`` objects, or half when fewer are left); every
  second reap (REAPTIMEOUT_NODE is twice REAPTIMEOUT_AC) the first rep of a node also
  drains its shared array likewise and frees up to ``ceil(free_limit / (5 num))`` free
  slabs (``drain_freelist()``) unless a refill touched the free list since.
* **The local node** is ``numa_mem_id()`` (v2.6.35 on, "numa: slab: use numa_mem_id() for
  slab local memory node") or ``numa_node_id()`` (before; ``memoryless_fallback = 0``).
  Without the fix a CPU on a memoryless node has a local node with no memory: its refills
  find nothing there and cannot grow a slab (GFP_THISNODE), so its array stays empty and
  every allocation goes through ``____cache_alloc_node()`` and ``fallback_alloc()`` to one
  object of the nearest memory node's slabs; every free of it is an alien free.  Note
  that numa_mem_id() differs from numa_node_id() only with CONFIG_HAVE_MEMORYLESS_NODES
  (ia64 and powerpc in 6.1, include/linux/topology.h and arch/*/Kconfig): on x86 every
  SLAB kernel behaves as ``memoryless_fallback = 0`` on a memoryless node.

Node slab lists are counted, not listed: per node class ``slabs`` (total) and ``free``
(free objects on the lists, ``n->free_objects``), packed: at most one slab is partial, so
``free // num`` slabs are empty.  The allocated objects ("in use" to the slab lists, which
includes the objects in arrays, shared and alien arrays) are thus on as few slabs as they
fit: memory is a lower bound and slabs empty as soon as their node's free objects allow
it (docs/MODEL.md, "SLAB: dynamics").

Events and where their locks go are counted per rep (:data:`COUNTER_FIELDS`; a machine
figure weights each rep's counts by ``rep_weight``), list_lock acquisitions also per node
class (``list_lock_node``); gauges are averaged over the steps.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from slabtune.errors import SlabtuneError
from slabtune.model import dynamics, profiles, runlen, slab, workloads
from slabtune.model.intmath import ceil_div, floor_div
from slabtune.model.topology import Topology

R = workloads.R
N = workloads.N
#: Random 32-bit words per rep per step: the op's kind, and who frees an allocated object
#: (low 16 bits) or which pending object a free takes (the rest).
K = 2
#: cache_alloc_refill(): an array not touched since the last reap refills at most this many.
BATCHREFILL_LIMIT = 16
#: Lock acquisitions of the paths whose locking changed when cache_grow() was split into
#: cache_grow_begin()/cache_grow_end() (Joonsoo Kim's 2016 SLAB series; every profile here
#: is far from that boundary, so the version below only has to separate 3.1 from 6.1).
#: Old: cache_grow() takes the list_lock for the colour and again to add the slab, and
#: cache_alloc_refill() retries under the lock after it; a failed grow still takes the
#: colour lock.  6.1: a refill that sees no free objects and an empty shared array skips
#: the lock, the colour is taken without it, cache_grow_end() locks once.
GROW_SPLIT_VERSION = (4, 6)
#: refill of an empty node: (old, 6.1) locks on the local node.
_LOCKS_REFILL_GROW = (4, 1)
#: an allocation without numa_mem_id() on a memoryless node: locks on the memoryless node's
#: own kmem_cache_node (old: refill, failed grow, ____cache_alloc_node(), failed grow; 6.1:
#: ____cache_alloc_node() only) ...
_LOCKS_FALLBACK_OWN = (4, 1)
#: ... and on the memory node when fallback_alloc() has to grow (old: colour, add,
#: ____cache_alloc_node(); 6.1: cache_grow_end(), ____cache_alloc_node()); 1 when the
#: memory node has free objects.
_LOCKS_FALLBACK_GROW = (3, 2)
_I32 = jnp.int32
_U32 = jnp.uint32
GAUGE_SHIFT = dynamics.GAUGE_SHIFT


class SlabSimConfig(NamedTuple):
    """Everything fixed for one SLAB run (arrays; a pytree, so it vmaps and batches).

    Scalars: ``objs_per_slab`` (num), ``order``, ``limit``, ``batchcount``,
    ``shared_entries`` (the shared array's size, sharedfactor * batchcount; 0: none),
    ``alien_limit`` (entries of an alien array; 0: no alien caches, remote objects are
    freed straight to their node under its list_lock), ``reap_interval`` (steps between
    cache_reap() runs; 0: never), ``old_locks`` (1: cache_grow() with its two locks, before
    GROW_SPLIT_VERSION), ``free_on_empty`` (1: free_block() destroys a slab when it empties
    and the node is above free_limit, the old rule; 0: 6.1's loop after the batch),
    ``memoryless_fallback`` (numa_mem_id()).  Per node class (N,): ``free_limit``,
    ``node_has_memory``, ``node_weight`` (float).  Per rep (R,): ``rep_weight`` (float),
    ``rep_node``, ``rep_mem_node``, ``rep_memoryless``.  The
    :class:`~slabtune.model.workloads.Workload`.
    """

    objs_per_slab: Any
    order: Any
    limit: Any
    batchcount: Any
    shared_entries: Any
    alien_limit: Any
    reap_interval: Any
    old_locks: Any
    free_on_empty: Any
    memoryless_fallback: Any
    free_limit: Any
    rep_weight: Any
    rep_node: Any
    rep_mem_node: Any
    rep_memoryless: Any
    node_has_memory: Any
    node_weight: Any
    workload: workloads.Workload
    #: Per rep (R,): which node of its memory class its slabs come from
    #: (workloads.rep_homes).  An object of another node of the rep's class is an alien
    #: too (dynamics.remote_to); it waits in the array alien[L][L].
    rep_mem_home: Any = np.zeros(R, np.int32)


#: Event counters, one int32 per rep.  The first twelve mean what the SLUB model's fields of
#: the same names mean (alloc_fast: an array hit; alloc_slow: every other allocation;
#: free_fast: a push on the CPU's array; free_slow: a flush or an alien free); the rest are
#: SLAB's own (docs/MODEL.md, "SLAB: dynamics", has the table).
COUNTER_FIELDS = (
    "ops", "allocs", "frees", "alloc_fast", "alloc_slow", "free_fast", "free_slow",
    "remote_free", "list_lock", "list_lock_remote", "slab_alloc", "slab_free",
    "refill_shared", "refill_slabs", "refill_grow", "alloc_fallback", "flush_shared",
    "flush_slabs", "alien_lock", "alien_flush", "reap_alien", "reap_drain", "reap_shared",
    "reap_slab_free", "objects_moved",
)
#: Gauges averaged over the steps: per rep, then per node class.
REP_GAUGES = ("objects_inuse", "array_objects_held")
NODE_GAUGES = ("slabs_total", "empty_slabs_kept", "shared_objects_held",
               "alien_objects_held")
_CI = {name: k for k, name in enumerate(COUNTER_FIELDS)}

SlabCounters = NamedTuple("SlabCounters", [(f, Any) for f in COUNTER_FIELDS + (
    "list_lock_node",) + REP_GAUGES + NODE_GAUGES + ("outstanding",)])
SlabCounters.__doc__ = """What a SLAB run did: the (R,) int32 event counts of
:data:`COUNTER_FIELDS`, ``list_lock_node`` (N,) list_lock acquisitions per node class, the
float32 gauges (:data:`REP_GAUGES` per rep, :data:`NODE_GAUGES` per node class:
``alien_objects_held`` by the node class whose alien arrays hold them) and ``outstanding``
(R,) objects each rep had allocated and not freed at the end."""

#: State fields: ``pend`` (R, R) objects allocated by rep i that rep j will free; ``out``
#: (R,) objects rep r has allocated and not freed; ``pend_tot`` (R,) objects rep r has to
#: free; ``phase``/``phase_left`` (R,) burst phase; ``avail``, ``touched`` (R,) the CPU's
#: array; per node class (N,): ``shared`` and ``sh_touched`` (its shared array),
#: ``free`` (free objects on its slab lists), ``slabs``, ``free_touched``; ``alien`` (N, N)
#: objects in node a's alien array for node b; counters and gauge sums (low 20 bits and
#: the rest, as in the SLUB model).
STATE_FIELDS = ("pend", "out", "pend_tot", "phase", "phase_left", "avail", "touched",
                "shared", "sh_touched", "free", "slabs", "free_touched", "alien", "counts",
                "lock_node", "g_rep", "ghi_rep", "g_node", "ghi_node")


# --------------------------------------------------------------------------- config


def _i32(x):
    return np.asarray(x, np.int32)


def structure_for(size: int, topology: Topology, profile: profiles.SlabProfile,
                  max_order: int | None = None,
                  facts: slab.CacheFacts = slab.NO_FACTS) -> slab.SlabStructure:
    """:func:`slabtune.model.slab.structure` of a cache of stride ``size`` on
    ``topology`` (its possible CPUs and CPUs per node)."""
    return slab.structure(size, topology.possible, topology.node_cpus, profile,
                          max_order=max_order, facts=facts)


def config_from(structure: slab.SlabStructure, profile: profiles.SlabProfile,
                topology: Topology, workload, *, memoryless_fallback: bool | None = None,
                reap_interval: int = 0, limit: int | None = None,
                batchcount: int | None = None, shared: int | None = None,
                free_limit=None) -> SlabSimConfig:
    """A :class:`SlabSimConfig` for one configuration, as
    :func:`slabtune.model.dynamics.config_from` builds SLUB's.

    ``structure``: :func:`slabtune.model.slab.structure` of the cache on ``topology``
    (:func:`structure_for`).  ``workload``: a ``(Workload, RepLayout)`` pair or a dict
    ``{"kind": ..., **params}`` (:func:`slabtune.model.workloads.build`).  Overrides:
    ``memoryless_fallback`` (the numa_mem_id() switch, default the profile's), the
    /proc/slabinfo tunables ``limit``, ``batchcount``, ``shared`` (the factor; as
    do_tune_cpucache() takes them: the shared array holds shared * batchcount objects, the
    alien arrays keep the size enable_cpucache() gave them, slab.retuned_alien_limit),
    ``reap_interval`` (steps between cache_reap() runs, 0 none), ``free_limit`` (an int or
    N ints).

    By default a node class's free_limit is init_cache_node()'s rule applied to the CPUs
    the model has there: ``(1 + reps on the node class) * batchcount + num``.  The node's
    lists only see the reps' traffic, so the kernel's value for the whole node (1 + its
    CPUs) would keep free objects the reps never produce.
    """
    if isinstance(workload, dict):
        params = dict(workload)
        kind = params.pop("kind")
        workload = workloads.build(kind, topology, **params)
    wl, lay = workload
    num = int(structure.objs_per_slab)
    if num < 1:
        raise SlabtuneError(f"objs_per_slab: {num} < 1")
    lim = int(structure.limit if limit is None else limit)
    bc = int(structure.batchcount if batchcount is None else batchcount)
    if lim < 1 or not 1 <= bc <= lim:
        raise SlabtuneError(f"limit {lim}, batchcount {bc}: need 1 <= batchcount <= limit")
    if shared is None:
        sh_ent = int(structure.shared) * bc
    elif isinstance(shared, bool) or int(shared) < 0:
        raise SlabtuneError(f"shared: {shared!r} is not a non-negative integer")
    else:
        sh_ent = int(shared) * bc
    al = slab.retuned_alien_limit(int(structure.alien_limit), lim)
    active = np.asarray(wl.active) > 0
    node = np.asarray(lay.node)
    if free_limit is None:
        fl = [(1 + int(np.sum(active & (node == n)))) * bc + num for n in range(N)]
    else:
        fl = list(np.broadcast_to(np.asarray(free_limit, np.int64), (N,)))
        if min(fl) < 0:
            raise SlabtuneError(f"free_limit: {free_limit!r} is negative")
    fb = profile.memoryless_fallback if memoryless_fallback is None \
        else bool(memoryless_fallback)
    if isinstance(reap_interval, bool) or int(reap_interval) != reap_interval \
            or int(reap_interval) < 0:
        raise SlabtuneError(f"reap_interval: {reap_interval!r} is not an integer >= 0")
    old = profile.version < GROW_SPLIT_VERSION
    return SlabSimConfig(
        objs_per_slab=_i32(num), order=_i32(structure.order), limit=_i32(lim),
        batchcount=_i32(bc), shared_entries=_i32(sh_ent), alien_limit=_i32(al),
        reap_interval=_i32(int(reap_interval)), old_locks=_i32(int(old)),
        free_on_empty=_i32(int(old)), memoryless_fallback=_i32(int(fb)),
        free_limit=_i32(fl),
        rep_weight=np.asarray(lay.weight, np.float32),
        rep_node=_i32(lay.node), rep_mem_node=_i32(lay.mem_node),
        rep_memoryless=_i32(lay.memoryless),
        node_has_memory=_i32(lay.node_has_memory),
        node_weight=np.asarray(lay.node_weight, np.float32),
        workload=workloads.Workload(*(_i32(f) for f in wl)),
        rep_mem_home=_i32(lay.mem_home),
    )


def stack_configs(cfgs) -> SlabSimConfig:
    """Stack configurations along a new leading axis (for :func:`simulate_batch`)."""
    return jax.tree_util.tree_map(lambda *xs: np.stack(xs), *cfgs)


def derived(cfg) -> dict:
    """Per-run values every op reads, from a configuration (NumPy or JAX, any trailing
    batch shape): the rep's local node (numa_mem_id(), or numa_node_id() without the fix),
    whether its allocations can use its array (``alloc_local``), and whether it is the
    first active rep of its local node (the one whose cache_reap() does the node's part).
    The reference computes the same from one configuration."""
    xp = jnp if any(isinstance(x, jax.Array) for x in jax.tree_util.tree_leaves(cfg)) else np
    memless = xp.asarray(cfg.rep_memoryless) > 0
    fb = xp.asarray(cfg.memoryless_fallback) > 0
    node = xp.asarray(cfg.rep_node).astype(np.int32)
    mem = xp.asarray(cfg.rep_mem_node).astype(np.int32)
    no_fix = memless & ~fb
    local = xp.where(no_fix, node, mem)
    active = xp.asarray(cfg.workload.active) > 0
    same = (local[:, None] == local[None, :]) & active[None, :]          # [r, q]
    before = np.tril(np.ones((R, R), bool), -1).reshape((R, R) + (1,) * (local.ndim - 1))
    first = active & ~xp.any(same & before, axis=1)
    return dict(local=local, alloc_local=(~no_fix).astype(np.int32), first=first)


# --------------------------------------------------------------------------- random words


def _fmix32(x):
    """MurmurHash3's 32-bit finaliser (wraps mod 2**32)."""
    x = x ^ (x >> 16)
    x = x * _U32(0x85EBCA6B)
    x = x ^ (x >> 13)
    x = x * _U32(0xC2B2AE35)
    return x ^ (x >> 16)


def seed_of(key) -> jnp.ndarray:
    """The 32-bit stream seed of a run, from its jax.random key."""
    return jax.random.bits(key, (), jnp.uint32)


def _words_at(seed, t):
    """The (R, K) + seed.shape uint32 words of step ``t``: a hash of (seed, t, rep, k)."""
    seed = jnp.asarray(seed, _U32)
    ctr = jnp.asarray(t, _U32) * _U32(R * K) + jnp.arange(R * K, dtype=_U32)
    ctr = ctr.reshape((R, K) + (1,) * seed.ndim)
    return _fmix32(ctr ^ _fmix32(seed * _U32(0x9E3779B1) + _U32(0x632BE5AB)))


def draws(key, steps: int) -> jnp.ndarray:
    """All words of a run, (steps, R, K) uint32: what :func:`simulate` draws step by step,
    for the reference (in blocks of one compiled shape, :func:`runlen.blocked_draws`)."""
    return runlen.blocked_draws(_words_at, key, seed_of, steps)


# --------------------------------------------------------------------------- helpers
# Batch-minor: a scalar of the model is (B,), a per-rep field (R, B), per node (N, B), the
# alien arrays (N, N, B).  Node indices are traced (B,) values, selected one-hot.

_NODES = np.arange(N, dtype=np.int32)[:, None]
_REPS = np.arange(R, dtype=np.int32)[:, None]


def _i(x):
    return jnp.asarray(x, _I32)


def _at(x, idx):
    """x[idx] per configuration, idx (B,) over the leading axis (N or R)."""
    ar = _NODES if x.shape[0] == N else _REPS
    return jnp.sum(jnp.where(ar == idx, x, 0), axis=0)


def _oh(idx):
    """(N, B) one-hot of node class idx (B,)."""
    return _NODES == idx


def _free_block(st, d, node, k, locks_free=None):
    """free_block(): ``k`` objects back to node ``node``'s slabs (``k`` may be 0).  The
    node's free objects grow by k; free slabs go to the page allocator while the node
    holds more than free_limit free objects: 6.1 after the batch, as many as needed
    (``while (n->free_objects > n->free_limit && !list_empty(&n->slabs_free))``); old
    kernels as each slab empties, when the count is above the limit then.  With packed
    lists a slab empties each time the free count reaches a multiple of num.  Returns the
    slabs freed."""
    num = d["num"]
    oh = _oh(node)
    f0 = _at(st["free"], node)
    f1 = f0 + k
    lim = _at(d["free_limit"], node)
    q0 = floor_div(f0, num)
    q1 = floor_div(f1, num)
    c = q1 - q0
    d_old = c - jnp.minimum(c, jnp.maximum(floor_div(lim, num) - q0, 0))
    d_new = jnp.where(f1 > lim, jnp.minimum(q1, ceil_div(f1 - lim, num)), 0)
    dd = jnp.where(k > 0, jnp.where(d["free_on_empty"], d_old, d_new), 0)
    st["free"] = st["free"] + jnp.where(oh, k - dd * num, 0)
    st["slabs"] = st["slabs"] - jnp.where(oh, dd, 0)
    return dd


def _lock(inc, st, node, own, cnt):
    """``cnt`` list_lock acquisitions on node class ``node`` by a rep of node ``own``."""
    inc["list_lock"] = inc["list_lock"] + cnt
    inc["list_lock_remote"] = inc["list_lock_remote"] + jnp.where(node != own, cnt, 0)
    st["lock_node"] = st["lock_node"] + jnp.where(_oh(node), cnt, 0)


def _drain_alien(st, d, inc, src, dst, own, on):
    """__drain_alien_cache(): where ``on``, empty node ``src``'s alien array for ``dst``
    into ``dst`` under its list_lock: into its shared array as far as it has room (at most
    the alien array's limit), the rest back to its slabs.  ``dst`` may be a static int."""
    oh_s = _oh(src)
    oh_d = _oh(dst)
    pair = oh_s[:, None] & oh_d[None, :]
    a = jnp.sum(jnp.where(pair, st["alien"], 0), axis=(0, 1))
    on = on & (a > 0)
    room = d["sh_ent"] - _at(st["shared"], dst)
    x = jnp.where(on, jnp.minimum(jnp.minimum(a, d["alien_limit"]), room), 0)
    st["shared"] = st["shared"] + jnp.where(oh_d, x, 0)
    dd = _free_block(st, d, dst, jnp.where(on, a - x, 0))
    st["alien"] = st["alien"] - jnp.where(pair & on, a, 0)
    _lock(inc, st, dst, own, _i(on))
    inc["slab_free"] = inc["slab_free"] + dd
    inc["objects_moved"] = inc["objects_moved"] + jnp.where(on, a, 0)
    return on


def _new_inc(shape):
    return {f: jnp.zeros(shape, _I32) for f in COUNTER_FIELDS}


def _add_counts(st, r, inc):
    vec = jnp.stack([inc[f] for f in COUNTER_FIELDS])          # (C, B)
    st["counts"] = st["counts"].at[:, r].add(vec)


# --------------------------------------------------------------------------- one op


def _rep_op(r, w, st, cfg: SlabSimConfig, d):
    """One operation of rep ``r`` (words ``w``, (K, B)): the workload picks an allocation
    or a free, then SLAB's paths as in :mod:`slabtune.model.slab_reference`."""
    st = dict(st)
    wl = cfg.workload
    w0, w1 = w[0], w[1]
    inc = _new_inc(jnp.shape(w0))
    # ---- the workload: allocate if it can and wants to, else free if it can (it holds
    # ``hold`` pending objects, workloads.hold_levels)
    out_r = st["out"][r]
    pt_r = st["pend_tot"][r]
    ph = st["phase"][r]
    pl = st["phase_left"][r]
    act = wl.active[r] > 0
    ap = wl.alloc_p[r]
    burst = wl.burst[r]
    can_a = act & (ap > 0) & (out_r < wl.live_target[r])
    can_f = act & (pt_r > wl.hold[r])
    bursty = burst > 0
    want_a = jnp.where(bursty, ph == 0, _i(w0 >> 16) < ap)
    do_a = can_a & (want_a | ~can_f)
    do_f = can_f & ~do_a
    n = _i(do_a | do_f)
    n = jnp.where(bursty, jnp.minimum(n, pl), n)
    do_a = do_a & (n > 0)
    do_f = do_f & (n > 0)
    left = pl - jnp.where(bursty, n, 0)
    flip = bursty & (n > 0) & (left <= 0)
    st["phase"] = st["phase"].at[r].set(jnp.where(flip, 1 - ph, ph))
    st["phase_left"] = st["phase_left"].at[r].set(jnp.where(flip, burst, left))
    inc["ops"] = n
    inc["allocs"] = _i(do_a)
    inc["frees"] = _i(do_f)

    num, lim, bcf = d["num"], d["limit"], d["bc"]
    old = d["old_locks"]
    own = d["node"][r]
    L = d["local"][r]
    M = d["mem"][r]
    al = d["alloc_local"][r] > 0
    av = st["avail"][r]
    tc = st["touched"][r]
    shL = _at(st["shared"], L)
    fL = _at(st["free"], L)
    fM = _at(st["free"], M)

    # ---- allocation: who will free the object (low half of w1 against free_cum)
    j = jnp.sum(_i(wl.free_cum[r] <= _i(w1 & _U32(0xFFFF))), axis=0)
    ja = _i((_REPS == j) & do_a)
    # ---- free: which pending object (the rest of w1, uniform over the rep's pending)
    col = st["pend"][:, r]
    u = _i(w1 >> 1) % jnp.maximum(pt_r, 1)
    cum = col
    for q in range(1, R):
        cum = cum.at[q].add(cum[q - 1])
    i = jnp.sum(_i(cum <= u), axis=0)
    fi = _i((_REPS == i) & do_f)
    st["pend"] = st["pend"].at[r].add(ja).at[:, r].add(-fi)
    st["pend_tot"] = st["pend_tot"] + ja - jnp.where(_REPS == r, _i(do_f), 0)
    st["out"] = st["out"] + jnp.where(_REPS == r, _i(do_a), 0) - fi

    # ---- ____cache_alloc(): the array, else cache_alloc_refill()
    hit = do_a & al & (av > 0)
    miss = do_a & al & (av == 0)
    ml = do_a & ~al
    bc = jnp.where((tc > 0) | (bcf <= BATCHREFILL_LIMIT), bcf, BATCHREFILL_LIMIT)
    from_sh = miss & (shL > 0)
    from_sl = miss & (shL == 0) & (fL > 0)
    grow = miss & (shL == 0) & (fL == 0)
    t = jnp.where(from_sh, jnp.minimum(jnp.minimum(bc, shL), lim),
                  jnp.where(from_sl, jnp.minimum(bc, fL),
                            jnp.where(grow, jnp.minimum(bc, num), 0)))
    fL_mod = fL - floor_div(fL, num) * num
    # ---- no numa_mem_id(): ____cache_alloc_node() then fallback_alloc() from node M
    ml_take = ml & (fM > 0)
    ml_grow = ml & (fM == 0)
    fM_mod = fM - floor_div(fM, num) * num
    ohL, ohM = _oh(L), _oh(M)
    st["shared"] = st["shared"] - jnp.where(ohL, jnp.where(from_sh, t, 0), 0)
    st["sh_touched"] = jnp.where(ohL & from_sh, 1, st["sh_touched"])
    st["free"] = (st["free"] + jnp.where(ohL, jnp.where(grow, num - t, 0)
                                         - jnp.where(from_sl, t, 0), 0)
                  + jnp.where(ohM, jnp.where(ml_grow, num - 1, 0) - _i(ml_take), 0))
    st["slabs"] = st["slabs"] + jnp.where(ohL, _i(grow), 0) + jnp.where(ohM, _i(ml_grow), 0)
    ft = st["free_touched"]
    ft = jnp.where(ohL & ((from_sl & (t > fL_mod)) | (grow & old)), 1, ft)
    ft = jnp.where(ohM & ((ml_take & (fM_mod == 0)) | ml_grow), 1, ft)
    st["free_touched"] = ft

    # ---- ___cache_free(): alien free or the array, flushed when full
    nobj = _at(d["mem"], i)
    # cache_free_alien(): an object of another node than numa_mem_id() (dynamics.remote_to)
    loc = do_f & ~dynamics.remote_to(nobj, _at(d["home"], i), L, d["home"][r])
    push = loc & (av < lim)
    flush = loc & (av >= lim)
    room = d["sh_ent"] - shL
    fl_sh = flush & (room > 0)
    fl_sl = flush & ~fl_sh
    kf = jnp.where(fl_sh, jnp.minimum(bcf, room), bcf)
    st["shared"] = st["shared"] + jnp.where(ohL & fl_sh, kf, 0)
    rem = do_f & ~loc
    has_al = d["alien_limit"] > 0
    pair = ohL[:, None] & _oh(nobj)[None, :]
    a_ln = jnp.sum(jnp.where(pair, st["alien"], 0), axis=(0, 1))
    full = rem & has_al & (a_ln >= d["alien_limit"])
    _drain_alien(st, d, inc, L, nobj, own, full)
    st["alien"] = st["alien"] + jnp.where(pair & rem & has_al, 1, 0)
    direct = rem & ~has_al
    dd = _free_block(st, d, jnp.where(fl_sl, L, nobj),
                     jnp.where(fl_sl, kf, _i(direct)))

    st["avail"] = st["avail"].at[r].set(
        jnp.where(hit, av - 1, jnp.where(miss, t - 1, jnp.where(
            push, av + 1, jnp.where(flush, av - kf + 1, av)))))
    st["touched"] = st["touched"].at[r].set(jnp.where(hit | miss, 1, tc))

    def era(pair):   # (old, 6.1) lock counts
        return jnp.where(old, pair[0], pair[1])

    c_l = (_i(from_sh | from_sl | flush) + jnp.where(grow, era(_LOCKS_REFILL_GROW), 0)
           + jnp.where(ml, era(_LOCKS_FALLBACK_OWN), 0))
    _lock(inc, st, L, own, c_l)
    c_b = _i(ml_take | direct) + jnp.where(ml_grow, era(_LOCKS_FALLBACK_GROW), 0)
    _lock(inc, st, jnp.where(do_a, M, nobj), own, c_b)

    inc["alloc_fast"] = _i(hit)
    inc["alloc_slow"] = _i(miss | ml)
    inc["free_fast"] = _i(push)
    inc["free_slow"] = _i(flush | rem)
    inc["remote_free"] = _i(rem)
    inc["slab_alloc"] = _i(grow | ml_grow)
    inc["slab_free"] = inc["slab_free"] + dd
    inc["refill_shared"] = _i(from_sh)
    inc["refill_slabs"] = _i(from_sl)
    inc["refill_grow"] = _i(grow)
    inc["alloc_fallback"] = _i(ml)
    inc["flush_shared"] = _i(fl_sh)
    inc["flush_slabs"] = _i(fl_sl)
    inc["alien_lock"] = _i(rem & has_al)
    inc["alien_flush"] = _i(full)
    inc["objects_moved"] = (inc["objects_moved"] + t + _i(ml) + jnp.where(flush, kf, 0)
                            + _i(direct))
    _add_counts(st, r, inc)
    return st


# --------------------------------------------------------------------------- cache_reap


def _reap_rep(r, st, d, node_round, on_step):
    """cache_reap() on rep ``r``'s CPU (mm/slab.c 6.1; the same steps in 3.1):
    reap_alien() (here every alien array of the local node, not one node per reap), then
    drain_array() of the CPU's array; on node rounds, if it is its local node's first rep,
    drain_array() of the shared array and drain_freelist()."""
    st = dict(st)
    inc = _new_inc(jnp.shape(on_step))
    on = on_step & d["active"][r]
    own = d["node"][r]
    L = d["local"][r]
    ohL = _oh(L)
    lim = d["limit"]
    for n in range(N):
        # alien[L][L] holds the objects of the other nodes of L's class (rep_mem_home)
        dr = _drain_alien(st, d, inc, L, n, own, on & (d["alien_limit"] > 0))
        inc["alien_lock"] = inc["alien_lock"] + _i(dr)
        inc["reap_alien"] = inc["reap_alien"] + _i(dr)
    # drain_array() of the CPU's array: a touched one is only untouched
    av = st["avail"][r]
    tc = st["touched"][r]
    busy = on & (av > 0)
    dr = busy & (tc == 0)
    tf = floor_div(lim + 4, 5)
    tf = jnp.where(tf > av, floor_div(av + 1, 2), tf)
    tf = jnp.where(dr, tf, 0)
    inc["slab_free"] = inc["slab_free"] + _free_block(st, d, L, tf)
    st["avail"] = st["avail"].at[r].set(av - tf)
    st["touched"] = st["touched"].at[r].set(jnp.where(busy, 0, tc))
    _lock(inc, st, L, own, _i(dr))
    inc["reap_drain"] = _i(dr)
    inc["objects_moved"] = inc["objects_moved"] + tf
    # the node's part, by its first rep, on every second reap
    nd = on & node_round & d["first"][r]
    sh = _at(st["shared"], L)
    sht = _at(st["sh_touched"], L)
    sbusy = nd & (sh > 0)
    sdr = sbusy & (sht == 0)
    stf = floor_div(d["sh_ent"] + 4, 5)
    stf = jnp.where(stf > sh, floor_div(sh + 1, 2), stf)
    stf = jnp.where(sdr, stf, 0)
    inc["slab_free"] = inc["slab_free"] + _free_block(st, d, L, stf)
    st["shared"] = st["shared"] - jnp.where(ohL, stf, 0)
    st["sh_touched"] = jnp.where(ohL & sbusy, 0, st["sh_touched"])
    _lock(inc, st, L, own, _i(sdr))
    inc["reap_shared"] = _i(sdr)
    inc["objects_moved"] = inc["objects_moved"] + stf
    ft = _at(st["free_touched"], L)
    fdr = nd & (ft == 0)
    num = d["num"]
    tofree = ceil_div(_at(d["free_limit"], L), 5 * num)
    nf = jnp.where(fdr, jnp.minimum(tofree, floor_div(_at(st["free"], L), num)), 0)
    st["free"] = st["free"] - jnp.where(ohL, nf * num, 0)
    st["slabs"] = st["slabs"] - jnp.where(ohL, nf, 0)
    st["free_touched"] = jnp.where(ohL & nd, 0, st["free_touched"])
    _lock(inc, st, L, own, nf)
    inc["slab_free"] = inc["slab_free"] + nf
    inc["reap_slab_free"] = nf
    _add_counts(st, r, inc)
    return st


# --------------------------------------------------------------------------- step and scan


def _derived(cfg: SlabSimConfig) -> dict:
    """Per-run constants of the step (batch-minor config)."""
    dv = derived(cfg)
    return dict(
        num=_i(cfg.objs_per_slab), limit=_i(cfg.limit), bc=_i(cfg.batchcount),
        sh_ent=_i(cfg.shared_entries), alien_limit=_i(cfg.alien_limit),
        old_locks=cfg.old_locks > 0, free_on_empty=cfg.free_on_empty > 0,
        free_limit=_i(cfg.free_limit), reap=_i(cfg.reap_interval),
        node=_i(cfg.rep_node), mem=_i(cfg.rep_mem_node), local=_i(dv["local"]),
        alloc_local=_i(dv["alloc_local"]), first=dv["first"], home=_i(cfg.rep_mem_home),
        active=cfg.workload.active > 0,
    )


def step(w, t, st: dict, cfg: SlabSimConfig, d: dict) -> dict:
    """One step: reps 0..R-1 do one operation each (words ``w``, (R, K, B)), then, on steps
    ``t`` with ``(t + 1) % reap_interval == 0``, every active rep runs cache_reap() in rep
    order; then the gauges.  Pure: returns the new state."""
    st = lax.fori_loop(0, R, lambda r, s: _rep_op(r, w[r], s, cfg, d), dict(st))
    t1 = jnp.asarray(t, _I32) + 1
    rp = jnp.maximum(d["reap"], 1)
    c = floor_div(t1, rp)
    on = (d["reap"] > 0) & (t1 - c * rp == 0)
    node_round = (c - floor_div(c, 2) * 2) == 0

    def reap(s):
        return lax.fori_loop(0, R, lambda r, x: _reap_rep(r, x, d, node_round, on), s)

    st = lax.cond(jnp.any(on), reap, lambda s: s, st)
    num = d["num"]
    rep = jnp.stack([st["out"], st["avail"]])
    node = jnp.stack([st["slabs"], floor_div(st["free"], num), st["shared"],
                      jnp.sum(st["alien"], axis=1)])
    dynamics.add_gauges(st, "g_rep", "ghi_rep", rep)
    dynamics.add_gauges(st, "g_node", "ghi_node", node)
    return st


def init_state(cfg: SlabSimConfig) -> dict:
    """Empty caches, nothing allocated (batch-minor: trailing axis of the batch)."""
    bs = jnp.shape(cfg.objs_per_slab)

    def z(*s):
        return jnp.zeros(s + bs, _I32)

    return dict(
        pend=z(R, R), out=z(R), pend_tot=z(R), phase=z(R),
        phase_left=jnp.asarray(cfg.workload.phase_first, _I32), avail=z(R), touched=z(R),
        shared=z(N), sh_touched=z(N), free=z(N), slabs=z(N), free_touched=z(N),
        alien=z(N, N), counts=z(len(COUNTER_FIELDS), R), lock_node=z(N),
        g_rep=z(len(REP_GAUGES), R), ghi_rep=z(len(REP_GAUGES), R),
        g_node=z(len(NODE_GAUGES), N), ghi_node=z(len(NODE_GAUGES), N),
    )


def _finish(st: dict, steps) -> SlabCounters:
    """Counters of a batch-minor final state, batch-major, after ``steps`` steps (may be
    traced)."""

    def front(x):
        return jnp.moveaxis(x, -1, 0)

    inv = runlen.inv_steps(steps)
    scale = jnp.float32(1 << GAUGE_SHIFT)
    g = (st["ghi_rep"].astype(jnp.float32) * scale + st["g_rep"].astype(jnp.float32)) * inv
    gn = (st["ghi_node"].astype(jnp.float32) * scale
          + st["g_node"].astype(jnp.float32)) * inv
    c = {name: front(st["counts"][k]) for k, name in enumerate(COUNTER_FIELDS)}
    c.update({name: front(g[k]) for k, name in enumerate(REP_GAUGES)})
    c.update({name: front(gn[k]) for k, name in enumerate(NODE_GAUGES)})
    return SlabCounters(**c, list_lock_node=front(st["lock_node"]),
                        outstanding=front(st["out"]))


def _batch_minor(cfgs: SlabSimConfig) -> SlabSimConfig:
    return jax.tree_util.tree_map(lambda x: jnp.moveaxis(jnp.asarray(x), 0, -1), cfgs)


def run_state(seeds_or_words, cfgs: SlabSimConfig, steps, pre_drawn: bool) -> dict:
    """The final batch-minor state of a batch after ``steps`` steps (traceable, ``steps``
    may be traced): :func:`run_states` at one checkpoint."""
    return run_states(seeds_or_words, cfgs, (steps,), pre_drawn)[0]


def run_states(seeds_or_words, cfgs: SlabSimConfig, checkpoints, pre_drawn: bool) -> list:
    """The batch-minor state of a batch after each of ``checkpoints`` steps
    (non-decreasing, each may be traced, their number static), from one run: ``cfgs``
    batch-major, ``seeds_or_words`` (B,) uint32 seeds or (S, R, K, B) words with S at least
    the last checkpoint.  The step loop has a traced bound (:func:`runlen.advance`)."""
    cfg = _batch_minor(cfgs)
    d = _derived(cfg)
    st = init_state(cfg)
    if pre_drawn:
        def body(t, s):
            w = lax.dynamic_index_in_dim(seeds_or_words, t, 0, keepdims=False)
            return step(w, t, s, cfg, d)
    else:
        def body(t, s):
            return step(_words_at(seeds_or_words, t.astype(_U32)), t, s, cfg, d)
    out, t0 = [], 0
    for t1 in checkpoints:
        st = runlen.advance(st, t0, t1, body)
        out.append(st)
        t0 = t1
    return out


def _seeds(keys_or_seeds):
    x = jnp.asarray(keys_or_seeds)
    if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
        return jax.vmap(seed_of)(x)
    return x.astype(_U32)


def simulate(key, cfg: SlabSimConfig, steps: int) -> SlabCounters:
    """Run ``steps`` steps of one configuration from empty caches, the words fixed by
    ``key`` (see :func:`draws`)."""
    one = jax.tree_util.tree_map(lambda x: jnp.asarray(x)[None], cfg)
    c = simulate_batch(jnp.asarray(key)[None], one, steps)
    return SlabCounters(*(x[0] for x in c))


def simulate_draws(w, cfg: SlabSimConfig) -> SlabCounters:
    """As :func:`simulate` with the words given, (steps, R, K) uint32 (the reference
    test's entry)."""
    one = jax.tree_util.tree_map(lambda x: jnp.asarray(x)[None], cfg)
    w, steps = runlen.pad_words(jnp.asarray(w, _U32))
    c = _simulate_words(w[..., None], steps, one)
    return SlabCounters(*(x[0] for x in c))


@jax.jit
def _simulate_words(w, steps, cfgs):
    return _finish(run_state(w, cfgs, steps, True), steps)


def simulate_batch(keys_or_seeds, cfgs: SlabSimConfig, steps) -> SlabCounters:
    """Simulate a batch of configurations (leading axis of every field of ``cfgs``, see
    :func:`stack_configs`) in one compiled loop, batch-minor; ``keys_or_seeds``: (B,)
    jax.random keys or uint32 seeds.  The same counters as :func:`simulate` per
    configuration.  ``steps`` may be traced: one compiled program serves every length."""
    return simulate_batch_at(keys_or_seeds, cfgs, (steps,))[0]


def simulate_batch_at(keys_or_seeds, cfgs: SlabSimConfig, checkpoints) -> tuple:
    """:func:`simulate_batch`'s counters after each of ``checkpoints`` steps
    (non-decreasing), from one run to the last: a tuple of :class:`SlabCounters`."""
    return _simulate_batch_at(_seeds(keys_or_seeds), cfgs, runlen.checkpoints(checkpoints))


@jax.jit
def _simulate_batch_at(seeds, cfgs, ck):
    states = run_states(seeds, cfgs, [ck[i] for i in range(ck.shape[0])], False)
    return tuple(_finish(st, ck[i]) for i, st in enumerate(states))


#: SLAB events priced as a SLUB event of the same cost shape (:func:`slub_view`): the
#: objects a batch refill, flush, shared or alien drain moves (``objects_moved``) as the
#: objects a sheaf refill moves (``sheaf_refill`` with a capacity of 1, so
#: :func:`slabtune.model.metrics.op_rates` charges ``sheaf_object_ns`` per object), and an
#: alien lock acquisition (``alien_lock``: the rep's local node's alien array for the
#: object's node, ``cache_free_alien()``) as an acquisition of the barn lock class on the
#: rep's own node without moving a sheaf (``barn_get_fail``, no ``sheaf_swap_ns``), which
#: the view's ``alien_lock_lines`` turns into an alien lock's section
#: (:func:`slabtune.model.metrics.barn_section`: one pointer push, the alien array's lines).
PRICED_AS: dict[str, str] = {"sheaf_refill": "objects_moved", "barn_get_fail": "alien_lock"}


#: Cross-node lines a SLAB remote free moves outside any lock: none.  An alien free
#: (cache_free_alien()) writes only the local alien array and reads the slab's node id; a
#: direct one (no alien arrays) frees under the object's node's list_lock.  Its cross-node
#: lines are that list_lock's section, priced there (``SimConfig.remote_free_lines``).
REMOTE_FREE_LINES = 0.0


def alien_drains(c: SlabCounters):
    """Per rep, the drains done under an alien lock per acquisition of it: a full array's
    (``alien_flush``, cache_free_alien()) and reap_alien()'s (``reap_alien``, which count
    as acquisitions too), over ``alien_lock``; 0 for a rep that takes none."""
    n = jnp.asarray(c.alien_flush, jnp.float32) + jnp.asarray(c.reap_alien, jnp.float32)
    a = jnp.asarray(c.alien_lock, jnp.float32)
    return jnp.where(a > 0, n / jnp.maximum(a, 1.0), 0.0)


def slub_view(c: SlabCounters, cfg: SlabSimConfig):
    """SLAB counters and configuration in the SLUB model's types, so that
    :func:`slabtune.model.metrics.compute` prices them unchanged: returns
    ``(dynamics.Counters, dynamics.SimConfig)`` (one configuration or a batch, leading axes
    kept).  The shared names carry over; :data:`PRICED_AS` maps the objects moved and the
    alien lock onto the SLUB events priced alike; other SLUB-only events (sheaf swaps,
    barns, per-CPU partial drains) are 0; the objects parked in the CPUs' arrays become
    ``sheaf_objects_held`` (per rep, scaled by its CPUs) and those in the node's shared and
    alien arrays ``barn_objects_held`` (per node class, scaled by its nodes), so they show
    in the memory breakdown; the config has sheaf capacity 1 (one object per "refill"), no
    per-CPU partial list, ``min_partial`` 0 (SLAB has none), ``remote_free_lines`` 0 (an
    alien free writes only its local alien array and reads the slab's node id; the
    cross-node lines move in the drain, under the remote list_lock, which is priced there;
    a direct remote free without alien arrays is all under that list_lock too),
    ``alien_lock_lines`` (:func:`slabtune.model.slab.alien_section_lines` of the alien
    arrays' entries) and ``alien_drains`` (:func:`alien_drains`: the drains each alien
    section does under the lock, which metrics.lock_sections() adds to its service), and
    ``objects_under_list_lock`` 1 (every batch SLAB moves, it moves under the list_lock).
    list_locks keep their node classes; metrics puts a memoryless rep's on its memory
    node, where its objects come from.  What this prices with SLUB's constants and what
    it misses is in docs/MODEL.md ("SLAB: dynamics", pricing)."""
    from slabtune.model import dynamics

    zero = jnp.zeros_like(jnp.asarray(c.ops))
    src = {f: f for f in dynamics.COUNTER_FIELDS if f in _CI} | PRICED_AS
    fields = {f: getattr(c, src[f]) if f in src else zero for f in dynamics.COUNTER_FIELDS}
    counters = dynamics.Counters(
        **fields, list_lock_node=c.list_lock_node, slabs_total=c.slabs_total,
        objects_inuse=c.objects_inuse, empty_slabs_kept=c.empty_slabs_kept,
        cpu_partial_slabs_held=jnp.zeros_like(jnp.asarray(c.objects_inuse)),
        sheaf_objects_held=c.array_objects_held,
        barn_objects_held=jnp.asarray(c.shared_objects_held) + jnp.asarray(c.alien_objects_held),
        outstanding=c.outstanding)
    z = jnp.zeros_like(jnp.asarray(cfg.objs_per_slab))
    given = dict(
        objs_per_slab=cfg.objs_per_slab, order=cfg.order, min_partial=z, cpu_partial_slabs=z,
        sheaf_capacity=z + 1, cpu_slab=z + 1, barns=z, remote_free_bypasses_sheaf=z,
        memoryless_cpus_use_sheaves=z, memoryless_fallback=cfg.memoryless_fallback,
        barn_max_full=z, barn_max_empty=z, rep_weight=cfg.rep_weight, rep_node=cfg.rep_node,
        rep_mem_node=cfg.rep_mem_node, rep_memoryless=cfg.rep_memoryless,
        node_has_memory=cfg.node_has_memory, node_weight=cfg.node_weight,
        workload=cfg.workload, ops_per_step=z + 1, rep_mem_home=cfg.rep_mem_home,
        lag_mul=jnp.zeros(jnp.shape(z) + (R, R), z.dtype),
        list_nodes=jnp.ones(jnp.shape(z) + (workloads.N,), z.dtype),
        remote_free_lines=jnp.zeros_like(jnp.asarray(cfg.objs_per_slab, jnp.float32))
        + REMOTE_FREE_LINES,
        alien_lock_lines=jnp.asarray(slab.alien_section_lines(
            jnp.asarray(cfg.alien_limit)), jnp.float32),
        alien_drains=alien_drains(c),
        objects_under_list_lock=jnp.ones_like(jnp.asarray(cfg.objs_per_slab, jnp.float32)))
    # SLUB-only switches with a default (era rules of SLUB's paths): that default, in the
    # batch's shape, so the view vmaps like a stacked SLUB config.
    rest = {f: z + jnp.asarray(d).astype(z.dtype) for f, d in
            dynamics.SimConfig._field_defaults.items() if f not in given}
    return counters, dynamics.SimConfig(**given, **rest)


def counters_numpy(c: SlabCounters) -> dict:
    """Counters as a dict of NumPy arrays."""
    return {k: np.asarray(v) for k, v in c._asdict().items()}

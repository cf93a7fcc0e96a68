"""Vectorised SLUB policy formulas: slab order, partial-list limits and sheaf capacity.

Every function here is pure ``jax.numpy`` on int32 arrays: sizes, CPU counts, boot
parameters and profiles (as :class:`ProfileArrays`) broadcast together, so one jitted call
evaluates a whole grid and the functions compose under ``vmap``.  Loops of the kernel become
masked array code with static bounds (orders 0..MAX_PAGE_ORDER, at most four leftover
fractions, at most 17 halvings of min_objects).

Products such as ``min_objects * size`` overflow int32 for large objects, so the formulas
never form them: ``a * b <= PAGE_SIZE << o`` is tested as ``a <= (PAGE_SIZE << o) // b``.
"""

from __future__ import annotations

from typing import NamedTuple

import jax.numpy as jnp
from jax import lax

from slabtune.model import profiles as P

_I32 = jnp.int32
#: Orders examined by the vectorised loops (0..MAX_PAGE_ORDER).
_ORDERS = tuple(range(P.MAX_PAGE_ORDER + 1))
#: Largest order for which PAGE_SIZE << order still fits comfortably in int32.
_SAFE_ORDER = 18
#: All fractions any era tries, loosest last; a profile uses a prefix.
_ALL_FRACTIONS = (16, 8, 4, 2)
#: kmalloc size classes below 256 that are not powers of two (kmalloc-96, kmalloc-192).
_KMALLOC_ODD = (96, 192)


class ProfileArrays(NamedTuple):
    """A :class:`~slabtune.model.profiles.KernelProfile` as int32 arrays (a pytree).

    Stack several profiles with :func:`stack_profiles` to broadcast them against a grid.
    """

    nr_cpus_rule: jnp.ndarray
    order_loop: jnp.ndarray
    n_fractions: jnp.ndarray
    cap_min_objects: jnp.ndarray
    cap_at_least_one: jnp.ndarray
    max_objs_per_slab: jnp.ndarray
    min_partial_divisor: jnp.ndarray
    min_partial_lo: jnp.ndarray
    min_partial_hi: jnp.ndarray
    has_cpu_partial: jnp.ndarray
    cpu_partial_page: jnp.ndarray
    cpu_partial_1k: jnp.ndarray
    cpu_partial_256: jnp.ndarray
    cpu_partial_small: jnp.ndarray
    sheaf_mode: jnp.ndarray
    sheaf_page: jnp.ndarray
    sheaf_1k: jnp.ndarray
    sheaf_256: jnp.ndarray
    sheaf_small: jnp.ndarray
    sheaves_on_kmalloc: jnp.ndarray
    barns: jnp.ndarray
    remote_free_bypasses_sheaf: jnp.ndarray
    memoryless_cpus_use_sheaves: jnp.ndarray
    memoryless_fallback: jnp.ndarray


def profile_arrays(p: P.KernelProfile) -> ProfileArrays:
    """Encode one profile as scalar int32 arrays."""
    cpp = p.cpu_partial_objects or (0, 0, 0, 0)
    fr = tuple(p.fractions)
    if fr != _ALL_FRACTIONS[: len(fr)]:
        raise ValueError(f"profile {p.name}: fractions must be a prefix of {_ALL_FRACTIONS}")
    vals = dict(
        nr_cpus_rule=P.NR_CPUS_RULES.index(p.nr_cpus_rule),
        order_loop=P.ORDER_LOOPS.index(p.order_loop),
        n_fractions=len(fr),
        cap_min_objects=int(p.cap_min_objects),
        cap_at_least_one=int(p.cap_at_least_one),
        max_objs_per_slab=p.max_objs_per_slab,
        min_partial_divisor=p.min_partial_divisor,
        min_partial_lo=p.min_partial_lo,
        min_partial_hi=p.min_partial_hi,
        has_cpu_partial=int(p.has_cpu_partial),
        cpu_partial_page=cpp[0],
        cpu_partial_1k=cpp[1],
        cpu_partial_256=cpp[2],
        cpu_partial_small=cpp[3],
        sheaf_mode=P.SHEAF_MODES.index(p.sheaves),
        sheaf_page=p.sheaf_base_capacity[0],
        sheaf_1k=p.sheaf_base_capacity[1],
        sheaf_256=p.sheaf_base_capacity[2],
        sheaf_small=p.sheaf_base_capacity[3],
        sheaves_on_kmalloc=int(p.sheaves_on_kmalloc),
        barns=P.BARN_NODES.index(p.barns),
        remote_free_bypasses_sheaf=int(p.remote_free_bypasses_sheaf),
        memoryless_cpus_use_sheaves=int(p.memoryless_cpus_use_sheaves),
        memoryless_fallback=int(p.memoryless_fallback),
    )
    return ProfileArrays(**{k: jnp.asarray(v, _I32) for k, v in vals.items()})


def stack_profiles(profiles) -> ProfileArrays:
    """Stack profiles along a new leading axis (shape ``(len(profiles),)`` per field)."""
    arrs = [profile_arrays(p) for p in profiles]
    return ProfileArrays(*(jnp.stack(field) for field in zip(*arrs)))


def expand_profile(p: ProfileArrays, ndim: int) -> ProfileArrays:
    """Append ``ndim`` unit axes to every field so a profile axis broadcasts as the first."""
    return ProfileArrays(*(jnp.reshape(f, f.shape + (1,) * ndim) for f in p))


# --------------------------------------------------------------------------- bit helpers


def fls(x):
    """find-last-set: index (1-based) of the highest set bit, fls(0) = 0, fls(224) = 8."""
    x = jnp.asarray(x, _I32)
    return jnp.where(x > 0, 32 - lax.clz(x), 0).astype(_I32)


def ilog2(x):
    """ilog2 of a positive integer (floor of log2)."""
    return fls(x) - 1


def get_order(n):
    """get_order(n): smallest order with PAGE_SIZE << order >= n (for n >= 1)."""
    n = jnp.asarray(n, _I32)
    return jnp.maximum(fls(n - 1) - P.PAGE_SHIFT, 0).astype(_I32)


def slab_bytes(order):
    """Bytes in a slab of ``order`` (PAGE_SIZE << order), orders clipped to stay in int32."""
    order = jnp.clip(jnp.asarray(order, _I32), 0, _SAFE_ORDER)
    return jnp.left_shift(jnp.asarray(P.PAGE_SIZE, _I32), order)


def order_objects(order, size):
    """order_objects(): how many objects of ``size`` fit a slab of ``order`` (no cap)."""
    return slab_bytes(order) // jnp.asarray(size, _I32)


def _get_order_of_product(count, size):
    """get_order(count * size) without forming the product; saturates at _SAFE_ORDER + 1."""
    count = jnp.asarray(count, _I32)
    size = jnp.asarray(size, _I32)
    result = jnp.full(jnp.broadcast_shapes(count.shape, size.shape), _SAFE_ORDER + 1, _I32)
    for o in reversed(range(_SAFE_ORDER + 1)):
        fits = count <= order_objects(o, size)
        result = jnp.where(fits, o, result)
    return result


# --------------------------------------------------------------------------- nr_cpus


def order_nr_cpus(possible, present, online, p: ProfileArrays, early=False):
    """The CPU count ``calculate_order`` feeds to ``fls`` under a profile's rule.

    * ``possible`` (up to v5.10): ``nr_cpu_ids``.
    * ``online_at_boot`` (v5.11, commit 045ab8c9487b): ``num_online_cpus()``, which is 1 for
      caches created before the secondary CPUs come up (``early``: the kmalloc caches and
      everything else ``start_kernel`` creates).  The regression of seed
      slub-order-nr-cpus-2021.
    * ``present_else_possible`` (v5.12 on): ``num_present_cpus()``, or ``nr_cpu_ids`` where
      that is <= 1 because the architecture only marks CPUs present as it onlines them.
    """
    possible = jnp.asarray(possible, _I32)
    present = jnp.asarray(present, _I32)
    online = jnp.asarray(online, _I32)
    early = jnp.asarray(early, bool)
    at_boot = jnp.where(early, 1, online)
    present_rule = jnp.where(present <= 1, possible, present)
    rule = p.nr_cpus_rule
    return jnp.where(rule == 0, possible, jnp.where(rule == 1, at_boot, present_rule)).astype(_I32)


def default_min_objects(nr_cpus):
    """min_objects when slub_min_objects is unset: 4 * (fls(nr_cpus) + 1) (since v2.6.26).

    More CPUs contend more on the node list_lock, so bigger slabs let each CPU stay on its
    own slab longer, at the price of more memory stranded in partly used slabs.
    """
    return 4 * (fls(nr_cpus) + 1)


# --------------------------------------------------------------------------- slab order


def _leftover_ok(order, size, fraction):
    """calc_slab_order's acceptance test: (slab % size) <= slab / fraction."""
    slab = slab_bytes(order)
    return (slab % size) <= slab // fraction


def _first_fitting_order(size, lo, hi, fraction):
    """Smallest order in [lo, hi] passing the leftover test, or -1 (calc_slab_order's loop)."""
    best = jnp.full(jnp.broadcast_shapes(jnp.shape(size), jnp.shape(lo), jnp.shape(hi)), -1, _I32)
    for o in reversed(_ORDERS):
        ok = (o >= lo) & (o <= hi) & _leftover_ok(o, size, fraction)
        best = jnp.where(ok, o, best)
    return best


def _last_fitting_order(size, lo, hi, fraction):
    """Largest order in [lo, hi] passing the leftover test, or -1."""
    best = jnp.full(jnp.broadcast_shapes(jnp.shape(size), jnp.shape(lo), jnp.shape(hi)), -1, _I32)
    for o in _ORDERS:
        ok = (o >= lo) & (o <= hi) & _leftover_ok(o, size, fraction)
        best = jnp.where(ok, o, best)
    return best


def _fraction_pass(size, start, max_order, n_fractions):
    """Try fractions 16, 8, 4(, 2) in turn from ``start``; first success wins, else -1."""
    order = jnp.full(jnp.broadcast_shapes(jnp.shape(size), jnp.shape(start)), -1, _I32)
    for i, f in enumerate(_ALL_FRACTIONS):
        cand = _first_fitting_order(size, start, max_order, f)
        take = (order < 0) & (cand >= 0) & (i < n_fractions)
        order = jnp.where(take, cand, order)
    return order


def _too_many_objects_order(size, p: ProfileArrays):
    """get_order(size * MAX_OBJS_PER_PAGE) - 1: the order used when even the minimum order
    would hold more objects than page->objects can count."""
    small = jnp.minimum(jnp.asarray(size, _I32), P.PAGE_SIZE)
    return _get_order_of_product(p.max_objs_per_slab, small) - 1


def min_objects_target(size, nr_cpus, p: ProfileArrays, max_order=P.DEFAULT_MAX_ORDER,
                       min_objects=0):
    """The min_objects ``calculate_order`` starts from.

    ``slub_min_objects`` if set, else :func:`default_min_objects`; capped (from v2.6.30ish)
    at the objects an order-``slub_max_order`` slab holds, a cap that is at least 1 from v6.8.
    """
    size = jnp.asarray(size, _I32)
    min_objects = jnp.asarray(min_objects, _I32)
    target = jnp.where(min_objects > 0, min_objects, default_min_objects(nr_cpus))
    cap = order_objects(max_order, size)
    cap = jnp.where(p.cap_at_least_one == 1, jnp.maximum(cap, 1), cap)
    return jnp.where(p.cap_min_objects == 1, jnp.minimum(target, cap), target).astype(_I32)


def slab_order(size, nr_cpus, p: ProfileArrays, min_order=0, max_order=P.DEFAULT_MAX_ORDER,
               min_objects=0):
    """calculate_order(): the page order of a cache's slabs.

    Larger orders keep a CPU on its own slab for more allocations (less list_lock and page
    allocator traffic); smaller orders waste less memory and are cheaper to get from the
    buddy allocator, whose per-CPU lists only cache low orders.  The kernel searches for the
    smallest order whose leftover is at most 1/16, 1/8, 1/4 (and, from v6.8, 1/2) of the
    slab while holding ``min_objects`` objects:

    * ``single_pass`` (v6.8 on): start at max(slub_min_order, get_order(min_objects*size)),
      try each fraction once, else get_order(size).
    * ``decrement`` (v2.6.30s to v6.7): for min_objects down to 2, try fractions 16, 8, 4
      from max(slub_min_order, get_order(min_objects*size)); else one object at
      max(slub_min_order, get_order(size)).
    * ``halve`` (v2.6.26 to v2.6.29): as ``decrement`` but min_objects halves.

    In every era, when a slub_min_order slab would already hold more than
    MAX_OBJS_PER_PAGE objects the order is get_order(size * MAX_OBJS_PER_PAGE) - 1.
    ``size`` is the cache's object stride (``slab_size`` in sysfs).
    """
    size = jnp.asarray(size, _I32)
    min_order = jnp.asarray(min_order, _I32)
    max_order = jnp.asarray(max_order, _I32)
    target = min_objects_target(size, nr_cpus, p, max_order, min_objects)
    too_many = _too_many_objects_order(size, p)

    # v6.8 on: one pass over the fractions.
    start = jnp.maximum(min_order, _get_order_of_product(jnp.maximum(target, 0), size))
    single = _fraction_pass(size, start, max_order, p.n_fractions)
    single = jnp.where(single >= 0, single, get_order(size))
    single = jnp.where(order_objects(start, size) > p.max_objs_per_slab, too_many, single)

    # Older eras: the min_objects back-off.  A min_objects value m succeeds iff some order
    # in [max(min_order, get_order(m*size)), max_order] passes the loosest fraction, i.e.
    # iff m * size fits in a slab of the largest such order `top`.  So the first m that
    # succeeds is the first one in the back-off sequence at or below `bound`.
    loosest = jnp.asarray(_ALL_FRACTIONS, _I32)[p.n_fractions - 1]
    top = jnp.full(jnp.broadcast_shapes(size.shape, min_order.shape, max_order.shape,
                                        loosest.shape), -1, _I32)
    for o in _ORDERS:
        ok = (o >= min_order) & (o <= max_order) & _leftover_ok(o, size, loosest)
        top = jnp.where(ok, o, top)
    bound = jnp.where(top >= 0, order_objects(jnp.maximum(top, 0), size), 0)
    dec_m = jnp.minimum(target, bound)
    halve_m = jnp.zeros_like(dec_m)
    found = jnp.zeros(dec_m.shape, bool)
    for k in range(17):
        m = jnp.right_shift(target, k)
        hit = (~found) & (m <= bound)
        halve_m = jnp.where(hit, m, halve_m)
        found = found | hit
    m = jnp.where(p.order_loop == 0, halve_m, dec_m)
    start_old = jnp.maximum(min_order, _get_order_of_product(jnp.maximum(m, 1), size))
    looped = _fraction_pass(size, start_old, max_order, p.n_fractions)
    looped = jnp.where((m > 1) & (top >= 0), looped, -1)
    old = jnp.where(looped >= 0, looped, jnp.maximum(min_order, get_order(size)))
    old = jnp.where(order_objects(min_order, size) > p.max_objs_per_slab, too_many, old)

    return jnp.where(p.order_loop == 2, single, old).astype(_I32)


def objects_per_slab(size, order, p: ProfileArrays):
    """oo_objects(s->oo): objects in one slab, at most MAX_OBJS_PER_PAGE."""
    return jnp.minimum(order_objects(order, size), p.max_objs_per_slab).astype(_I32)


def leftover_bytes(size, order, p: ProfileArrays):
    """Bytes at the end of a slab that no object uses: (PAGE_SIZE << order) - objs * size."""
    return (slab_bytes(order) - objects_per_slab(size, order, p) * jnp.asarray(size, _I32)).astype(_I32)


# --------------------------------------------------------------------------- partial lists


def min_partial(size, p: ProfileArrays):
    """set_min_partial(): empty slabs a node keeps on its partial list instead of freeing.

    Larger objects get more, "to avoid pounding the page allocator excessively" (seed
    slub-dynamic-min-partial-2008, which clamped ilog2(size) to [MIN_PARTIAL, MAX_PARTIAL] =
    [5, 10]); current kernels clamp ilog2(size) / 2 to [5, 10]; v2.6.27 kept a static 5.
    """
    raw = ilog2(size) // p.min_partial_divisor
    return jnp.clip(raw, p.min_partial_lo, p.min_partial_hi).astype(_I32)


def _by_size_class(size, page, k1, b256, small):
    size = jnp.asarray(size, _I32)
    return jnp.where(size >= P.PAGE_SIZE, page,
                     jnp.where(size >= 1024, k1, jnp.where(size >= 256, b256, small))).astype(_I32)


def cpu_partial_objects(size, p: ProfileArrays):
    """set_cpu_partial(): objects a CPU may keep on its per-CPU partial list (v3.2 to v6.18).

    Per-CPU partial slabs let frees to a slab that is not the CPU's current one skip the node
    list_lock; the limit bounds the memory that hides there.  The table is 2/6/13/30 objects
    (>= PAGE_SIZE, >= 1024, >= 256, smaller) up to v5.15 and 6/24/52/120 from v5.16; 0 where
    the era has no per-CPU partial lists.
    """
    val = _by_size_class(size, p.cpu_partial_page, p.cpu_partial_1k, p.cpu_partial_256,
                         p.cpu_partial_small)
    return jnp.where(p.has_cpu_partial == 1, val, 0).astype(_I32)


def cpu_partial_slabs(size, objs_per_slab, p: ProfileArrays):
    """slub_set_cpu_partial(): the limit in slabs, DIV_ROUND_UP(2 * objects, objs_per_slab),
    assuming per-CPU partial slabs are half full (v5.16 on; earlier eras counted objects)."""
    objs = cpu_partial_objects(size, p)
    per = jnp.maximum(jnp.asarray(objs_per_slab, _I32), 1)
    return ((2 * objs + per - 1) // per).astype(_I32)


# --------------------------------------------------------------------------- sheaves


def kmalloc_size_roundup(nbytes):
    """kmalloc_size_roundup(): the kmalloc bucket a request of ``nbytes`` lands in.

    Buckets are 8, 16, 32, 64, 96, 128, 192 and powers of two from 256 up.
    """
    n = jnp.maximum(jnp.asarray(nbytes, _I32), 8)
    pow2 = jnp.left_shift(jnp.asarray(1, _I32), fls(n - 1))
    r = pow2
    for odd in _KMALLOC_ODD:
        r = jnp.where((n <= odd) & (odd < pow2) & (n > odd // 3 * 2), odd, r)
    return r.astype(_I32)


def round_sheaf_capacity(capacity):
    """Raise a sheaf capacity so the sheaf (32-byte header + 8 bytes per object) exactly
    fills its kmalloc bucket: a sheaf of 26 objects takes 240 bytes, lands in kmalloc-256,
    and so holds 28."""
    capacity = jnp.asarray(capacity, _I32)
    bucket = kmalloc_size_roundup(P.SHEAF_HEADER_BYTES + P.POINTER_BYTES * capacity)
    return ((bucket - P.SHEAF_HEADER_BYTES) // P.POINTER_BYTES).astype(_I32)


def default_sheaf_capacity(size, p: ProfileArrays):
    """calculate_sheaf_capacity()'s default: 4/12/26/60 objects by size class (half the
    per-CPU partial counts, as each CPU has two sheaves), then rounded to a kmalloc bucket."""
    base = _by_size_class(size, p.sheaf_page, p.sheaf_1k, p.sheaf_256, p.sheaf_small)
    return round_sheaf_capacity(base)


def sheaf_capacity(size, p: ProfileArrays, is_kmalloc=False, is_bootstrap=False,
                   explicit=0):
    """s->sheaf_capacity of a cache.

    * no sheaves (before v6.18): 0;
    * opt-in (v6.18): the capacity the cache's creator asked for, 0 if none;
    * all caches (v7.0 on): max(default, explicit) except for kmalloc caches (not yet) and
      the bootstrap caches kmem_cache and kmem_cache_node (0).
    """
    explicit = jnp.asarray(explicit, _I32)
    is_kmalloc = jnp.asarray(is_kmalloc, bool)
    is_bootstrap = jnp.asarray(is_bootstrap, bool)
    all_caches = jnp.maximum(default_sheaf_capacity(size, p), explicit)
    excluded = is_bootstrap | (is_kmalloc & (p.sheaves_on_kmalloc == 0))
    all_caches = jnp.where(excluded, 0, all_caches)
    return jnp.where(p.sheaf_mode == 0, 0,
                     jnp.where(p.sheaf_mode == 1, explicit, all_caches)).astype(_I32)


# --------------------------------------------------------------------------- all at once


class Structure(NamedTuple):
    """The structural prediction for one (cache, topology, parameters, profile) point."""

    nr_cpus: jnp.ndarray
    min_objects: jnp.ndarray
    order: jnp.ndarray
    objs_per_slab: jnp.ndarray
    leftover: jnp.ndarray
    min_partial: jnp.ndarray
    cpu_partial: jnp.ndarray
    cpu_partial_slabs: jnp.ndarray
    sheaf_capacity: jnp.ndarray


def structure(size, possible, present, online, p: ProfileArrays, min_order=0,
              max_order=P.DEFAULT_MAX_ORDER, min_objects=0, early=False, is_kmalloc=False,
              is_bootstrap=False, explicit_sheaf=0) -> Structure:
    """Every structural field of a cache, broadcasting all arguments together."""
    nr = order_nr_cpus(possible, present, online, p, early)
    order = slab_order(size, nr, p, min_order, max_order, min_objects)
    objs = objects_per_slab(size, order, p)
    return Structure(
        nr_cpus=nr,
        min_objects=min_objects_target(size, nr, p, max_order, min_objects),
        order=order,
        objs_per_slab=objs,
        leftover=leftover_bytes(size, order, p),
        min_partial=min_partial(size, p),
        cpu_partial=cpu_partial_objects(size, p),
        cpu_partial_slabs=cpu_partial_slabs(size, objs, p),
        sheaf_capacity=sheaf_capacity(size, p, is_kmalloc, is_bootstrap, explicit_sheaf),
    )

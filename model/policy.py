"""Vectorised SLUB policy formulas: slab order, partial-list limits and sheaf capacity.

Every function here is pure ``jax.numpy`` on int32 arrays: sizes, CPU counts, boot
parameters and profiles (as :class:`ProfileArrays`) broadcast together, so one jitted call
evaluates a whole grid and the functions compose under ``vmap``.  Loops of the kernel become
masked array code with static bounds (orders 0..MAX_PAGE_ORDER, at most four leftover
fractions, at most 17 halvings of min_objects).

Products such as ``min_objects * size`` overflow int32 for large objects, so the formulas
never form them: ``a * b <= PAGE_SIZE << o`` is tested as ``a <= (PAGE_SIZE << o) // b``.
Those quotients are tabulated once per size for orders 0..MAX_PAGE_ORDER (see
:func:`_order_table`), and quotients come from float32 with a one-step integer correction
where that is exact, since integer division does not vectorise on x86.  The scalar
reference in :mod:`slabtune.model.reference` checks every formula here in the tests.
"""

from __future__ import annotations

from typing import NamedTuple

import jax.numpy as jnp
from jax import lax

from slabtune.model import profiles as kernel_profiles
from slabtune.model.constants import STRUCTURE_FIELDS
from slabtune.model.intmath import floor_div

_I32 = jnp.int32
#: Orders examined by the vectorised loops (0..MAX_PAGE_ORDER).
_ORDERS = tuple(range(kernel_profiles.MAX_PAGE_ORDER + 1))
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
    cpu_partial_counts_objects: jnp.ndarray
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


def profile_arrays(p: kernel_profiles.KernelProfile) -> ProfileArrays:
    """Encode one profile as scalar int32 arrays."""
    cpp = p.cpu_partial_objects or (0, 0, 0, 0)
    fr = tuple(p.fractions)
    if fr != _ALL_FRACTIONS[: len(fr)]:
        raise ValueError(f"profile {p.name}: fractions must be a prefix of {_ALL_FRACTIONS}")
    vals = dict(
        nr_cpus_rule=kernel_profiles.NR_CPUS_RULES.index(p.nr_cpus_rule),
        order_loop=kernel_profiles.ORDER_LOOPS.index(p.order_loop),
        n_fractions=len(fr),
        cap_min_objects=int(p.cap_min_objects),
        cap_at_least_one=int(p.cap_at_least_one),
        max_objs_per_slab=p.max_objs_per_slab,
        min_partial_divisor=p.min_partial_divisor,
        min_partial_lo=p.min_partial_lo,
        min_partial_hi=p.min_partial_hi,
        has_cpu_partial=int(p.has_cpu_partial),
        cpu_partial_counts_objects=int(p.cpu_partial_counts_objects),
        cpu_partial_page=cpp[0],
        cpu_partial_1k=cpp[1],
        cpu_partial_256=cpp[2],
        cpu_partial_small=cpp[3],
        sheaf_mode=kernel_profiles.SHEAF_MODES.index(p.sheaves),
        sheaf_page=p.sheaf_base_capacity[0],
        sheaf_1k=p.sheaf_base_capacity[1],
        sheaf_256=p.sheaf_base_capacity[2],
        sheaf_small=p.sheaf_base_capacity[3],
        sheaves_on_kmalloc=int(p.sheaves_on_kmalloc),
        barns=kernel_profiles.BARN_NODES.index(p.barns),
        remote_free_bypasses_sheaf=int(p.remote_free_bypasses_sheaf),
        memoryless_cpus_use_sheaves=int(p.memoryless_cpus_use_sheaves),
        memoryless_fallback=int(p.memoryless_fallback),
    )
    return ProfileArrays(**{k: jnp.asarray(v, _I32) for k, v in vals.items()})


def has_cpu_slab(p: ProfileArrays):
    """Whether the profile's caches have a per-CPU slab (array form of
    :attr:`~slabtune.model.profiles.KernelProfile.has_cpu_slab`: none from v7.0)."""
    modes = [kernel_profiles.SHEAF_MODES.index(m) for m in kernel_profiles.CPU_SLAB_SHEAF_MODES]
    return jnp.isin(p.sheaf_mode, jnp.asarray(modes, _I32))


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
    return jnp.maximum(fls(n - 1) - kernel_profiles.PAGE_SHIFT, 0).astype(_I32)


def slab_bytes(order):
    """Bytes in a slab of ``order`` (PAGE_SIZE << order), orders clipped to stay in int32."""
    order = jnp.clip(jnp.asarray(order, _I32), 0, _SAFE_ORDER)
    return jnp.left_shift(jnp.asarray(kernel_profiles.PAGE_SIZE, _I32), order)


def order_objects(order, size):
    """order_objects(): how many objects of ``size`` fit a slab of ``order`` (no cap)."""
    return slab_bytes(order) // jnp.asarray(size, _I32)


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


class _OrderTable(NamedTuple):
    """What the kernel's order loops look up, tabulated once per object size.

    ``objs[o]`` is order_objects(o, size) for o = 0..MAX_PAGE_ORDER; ``fits[i]`` is a
    bitmask whose bit o is set when an order-o slab's leftover passes calc_slab_order's test
    for the i-th fraction of :data:`_ALL_FRACTIONS` ((slab % size) <= slab / fraction).
    The kernel revisits the same orders for every fraction and every min_objects; with the
    table each visit is a bit operation instead of a division.
    """

    objs: tuple
    fits: tuple


def _order_table(size) -> _OrderTable:
    """Build the :class:`_OrderTable` of ``size`` (one float division per element).

    x86 has no vector integer divide, so the object counts come from one float32
    reciprocal.  PAGE_SIZE << o is a power of two, hence fl(1/size) * 2^(12+o) equals the
    correctly rounded quotient fl(2^(12+o) / size); for a numerator below 2^24 its floor is
    the integer quotient (a non-integral a/b lies at least 1/b from an integer, and
    rounding moves it by at most a/b * 2^-24 < 1/b).  A one-step correction on the
    remainder keeps the counts exact even under a divide that is off by an ulp.
    """
    size = jnp.asarray(size, _I32)
    recip = 1.0 / size.astype(jnp.float32)
    objs = []
    fits = [jnp.zeros(size.shape, _I32) for _ in _ALL_FRACTIONS]
    for o in _ORDERS:
        slab = kernel_profiles.PAGE_SIZE << o
        n = jnp.floor(recip * jnp.float32(slab)).astype(_I32)
        rem = slab - n * size
        n = n - (rem < 0).astype(_I32) + (rem >= size).astype(_I32)
        rem = slab - n * size
        objs.append(n)
        for i, f in enumerate(_ALL_FRACTIONS):
            fits[i] = fits[i] | jnp.where(rem <= slab // f, 1 << o, 0).astype(_I32)
    return _OrderTable(tuple(objs), tuple(fits))


def _pick(table, order):
    """table[order] for an order array in 0..MAX_PAGE_ORDER (larger orders read the last)."""
    order = jnp.asarray(order, _I32)
    out = table[-1]
    for o in reversed(_ORDERS[:-1]):
        out = jnp.where(order == o, table[o], out)
    return out


def _order_for_objects(t: _OrderTable, count):
    """get_order(count * size) without forming the product: the number of orders whose
    slab holds fewer than ``count`` objects (counts grow with the order), so
    MAX_PAGE_ORDER + 1 when even the largest order is too small; 0 for count <= 0."""
    count = jnp.asarray(count, _I32)
    result = jnp.zeros(jnp.broadcast_shapes(count.shape, t.objs[0].shape), _I32)
    for n in t.objs:
        result = result + (n < count).astype(_I32)
    return result


def _orders_between(lo, hi):
    """Bitmask of the orders lo..hi (empty where lo > hi)."""
    lo = jnp.clip(jnp.asarray(lo, _I32), 0, 30)
    hi = jnp.clip(jnp.asarray(hi, _I32), -1, 29)
    one = jnp.asarray(1, _I32)
    return (jnp.left_shift(one, hi + 1) - 1) & ~(jnp.left_shift(one, lo) - 1)


def _lowest_order(mask):
    """Index of the lowest set bit of ``mask``, or -1 for an empty mask."""
    low = mask & -mask
    return jnp.where(mask != 0, 31 - lax.clz(low), -1).astype(_I32)


def _highest_order(mask):
    """Index of the highest set bit of ``mask``, or -1 for an empty mask."""
    return jnp.where(mask != 0, 31 - lax.clz(mask), -1).astype(_I32)


def _fraction_pass(t: _OrderTable, allowed, n_fractions):
    """calc_slab_order() for fractions 16, 8, 4(, 2) in turn over the ``allowed`` orders:
    the smallest allowed order passing the first fraction that any passes, else -1."""
    order = jnp.asarray(-1, _I32)
    for i in range(len(_ALL_FRACTIONS)):
        cand = t.fits[i] & allowed
        take = (order < 0) & (cand != 0) & (i < n_fractions)
        order = jnp.where(take, _lowest_order(cand), order)
    return order


def _too_many_objects_order(t: _OrderTable, p: ProfileArrays):
    """get_order(size * MAX_OBJS_PER_PAGE) - 1: the order used when the starting order
    would hold more objects than page->objects can count (only ever taken for sizes whose
    largest slab exceeds that count, where the table's answer is exact)."""
    return _order_for_objects(t, p.max_objs_per_slab) - 1


def _cap_min_objects(target, cap, p: ProfileArrays):
    """min(min_objects, order_objects(slub_max_order)) where the era caps it (v2.6.30s on),
    the cap being at least 1 from v6.8."""
    cap = jnp.where(p.cap_at_least_one == 1, jnp.maximum(cap, 1), cap)
    return jnp.where(p.cap_min_objects == 1, jnp.minimum(target, cap), target).astype(_I32)


def min_objects_target(size, nr_cpus, p: ProfileArrays, max_order=kernel_profiles.DEFAULT_MAX_ORDER,
                       min_objects=0):
    """The min_objects ``calculate_order`` starts from.

    ``slub_min_objects`` if set, else :func:`default_min_objects`; capped (from v2.6.30ish)
    at the objects an order-``slub_max_order`` slab holds, a cap that is at least 1 from v6.8.
    """
    size = jnp.asarray(size, _I32)
    min_objects = jnp.asarray(min_objects, _I32)
    target = jnp.where(min_objects > 0, min_objects, default_min_objects(nr_cpus))
    return _cap_min_objects(target, order_objects(max_order, size), p)


def _calculate_order(t: _OrderTable, size, target, p: ProfileArrays, min_order, max_order):
    """calculate_order() from the order table and the capped min_objects ``target``."""
    too_many = _too_many_objects_order(t, p)
    fits_loosest = t.fits[0]
    for i in range(1, len(_ALL_FRACTIONS)):
        fits_loosest = jnp.where(p.n_fractions == i + 1, t.fits[i], fits_loosest)

    # v6.8 on: one pass over the fractions.
    start = jnp.maximum(min_order, _order_for_objects(t, target))
    single = _fraction_pass(t, _orders_between(start, max_order), p.n_fractions)
    single = jnp.where(single >= 0, single, get_order(size))
    single = jnp.where(_pick(t.objs, start) > p.max_objs_per_slab, too_many, single)

    # Older eras: the min_objects back-off.  A min_objects value m succeeds iff some order
    # in [max(min_order, get_order(m*size)), max_order] passes the loosest fraction, i.e.
    # iff m * size fits in a slab of the largest such order `top`.  So the first m that
    # succeeds is the first one in the back-off sequence at or below `bound`.
    top = _highest_order(fits_loosest & _orders_between(min_order, max_order))
    bound = jnp.where(top >= 0, _pick(t.objs, jnp.maximum(top, 0)), 0)
    dec_m = jnp.minimum(target, bound)
    # Halving: the first target >> k at or below bound.  Shifting target down to bound's bit
    # length (k0) leaves it at most one halving short; a bound of 0 needs every bit gone.
    k0 = jnp.maximum(fls(target) - fls(bound), 0)
    k = k0 + (jnp.right_shift(target, k0) > bound).astype(_I32)
    halve_m = jnp.right_shift(target, jnp.where(bound > 0, k, fls(target)))
    m = jnp.where(p.order_loop == 0, halve_m, dec_m)
    start_old = jnp.maximum(min_order, _order_for_objects(t, jnp.maximum(m, 1)))
    looped = _fraction_pass(t, _orders_between(start_old, max_order), p.n_fractions)
    looped = jnp.where((m > 1) & (top >= 0), looped, -1)
    old = jnp.where(looped >= 0, looped, jnp.maximum(min_order, get_order(size)))
    old = jnp.where(_pick(t.objs, min_order) > p.max_objs_per_slab, too_many, old)

    return jnp.where(p.order_loop == 2, single, old).astype(_I32)


def _target_and_order(size, nr_cpus, p: ProfileArrays, min_order, max_order, min_objects):
    """(capped min_objects, order) sharing one order table."""
    size = jnp.asarray(size, _I32)
    min_order = jnp.asarray(min_order, _I32)
    max_order = jnp.asarray(max_order, _I32)
    min_objects = jnp.asarray(min_objects, _I32)
    t = _order_table(size)
    target = jnp.where(min_objects > 0, min_objects, default_min_objects(nr_cpus))
    target = _cap_min_objects(target, _pick(t.objs, max_order), p)
    return target, _calculate_order(t, size, target, p, min_order, max_order)


def slab_order(size, nr_cpus, p: ProfileArrays, min_order=0,
               max_order=kernel_profiles.DEFAULT_MAX_ORDER, min_objects=0):
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
    ``size`` is the cache's object stride (``slab_size`` in sysfs); boot-parameter orders
    are 0..MAX_PAGE_ORDER (the kernel clamps slub_max_order to it).
    """
    return _target_and_order(size, nr_cpus, p, min_order, max_order, min_objects)[1]


def objects_per_slab(size, order, p: ProfileArrays):
    """oo_objects(s->oo): objects in one slab, at most MAX_OBJS_PER_PAGE.

    The count is exact wherever it is below 2^24, far above any MAX_OBJS_PER_PAGE, so the
    capped result is exact for every order up to the clip of :func:`slab_bytes`.
    """
    objs = floor_div(slab_bytes(order), size)
    return jnp.minimum(objs, p.max_objs_per_slab).astype(_I32)


def leftover_bytes(size, order, p: ProfileArrays):
    """Bytes at the end of a slab that no object uses: (PAGE_SIZE << order) - objs * size."""
    return (slab_bytes(order)
            - objects_per_slab(size, order, p) * jnp.asarray(size, _I32)).astype(_I32)


# --------------------------------------------------------------------------- partial lists


def min_partial(size, p: ProfileArrays):
    """set_min_partial(): empty slabs a node keeps on its partial list instead of freeing.

    Larger objects get more, "to avoid pounding the page allocator excessively" (seed
    slub-dynamic-min-partial-2008, which clamped ilog2(size) to [MIN_PARTIAL, MAX_PARTIAL] =
    [5, 10]); current kernels clamp ilog2(size) / 2 to [5, 10]; v2.6.27 kept a static 5.
    """
    raw = floor_div(ilog2(size), p.min_partial_divisor)  # ilog2 < 2^24: exact
    return jnp.clip(raw, p.min_partial_lo, p.min_partial_hi).astype(_I32)


def _by_size_class(size, page, k1, b256, small):
    size = jnp.asarray(size, _I32)
    return jnp.where(size >= kernel_profiles.PAGE_SIZE, page,
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
    """The per-CPU partial list's length limit in slabs: the list is drained
    (unfreeze_partials()) when a slab arrives and it already holds this many.

    * v5.16 on, slub_set_cpu_partial(): DIV_ROUND_UP(2 * objects, objs_per_slab), assuming
      the slabs on the list are half free.
    * v3.2 to v5.15, put_cpu_partial() drains when the free objects already on the list
      (``pobjects``) exceed ``cpu_partial``.  A slab joins the list on the first free into
      it while it was full (__slab_free() with ``!prior``), so with one free object each
      the list drains at ``cpu_partial + 1`` slabs: 14 slabs of kmalloc-512 (cpu_partial
      13) where v5.16's rule gives 4 at order 0 and 1 at order 3.  Frees into slabs
      already on the list make the kernel drain earlier; the model counts slabs against
      this limit (a slab joins its per-CPU list with one free object, at the top fill
      level), so this is the limit it reaches.
    """
    objs = cpu_partial_objects(size, p)
    per = jnp.maximum(jnp.asarray(objs_per_slab, _I32), 1)
    # 2 * 120 + 65535 < 2^24: the float quotient is exact here.
    by_slabs = floor_div(2 * objs + per - 1, per)
    by_objects = jnp.where(objs > 0, objs + 1, 0)
    return jnp.where(p.cpu_partial_counts_objects == 1, by_objects, by_slabs).astype(_I32)


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
    bucket = kmalloc_size_roundup(kernel_profiles.SHEAF_HEADER_BYTES
                                  + kernel_profiles.POINTER_BYTES * capacity)
    return ((bucket - kernel_profiles.SHEAF_HEADER_BYTES)
            // kernel_profiles.POINTER_BYTES).astype(_I32)


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
    * all caches (v7.0 on): calculate_sheaf_capacity()'s max(default, explicit), so
      maple_node (256 bytes, default 28) asking for 32 gets 32; 0 for the bootstrap caches
      kmem_cache and kmem_cache_node (SLAB_NO_SHEAVES).  kmalloc caches get the default
      (bootstrap_kmalloc_sheaves(), v7.0) where the profile's ``sheaves_on_kmalloc`` says so,
      which every shipped profile with sheaves for all caches does.
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


if Structure._fields != STRUCTURE_FIELDS:  # one list of the fields, model/constants.py
    raise ImportError("model/constants.py STRUCTURE_FIELDS differs from policy.Structure")


def structure(size, possible, present, online, p: ProfileArrays, min_order=0,
              max_order=kernel_profiles.DEFAULT_MAX_ORDER, min_objects=0, early=False,
              is_kmalloc=False, is_bootstrap=False, explicit_sheaf=0) -> Structure:
    """Every structural field of a cache, broadcasting all arguments together."""
    nr = order_nr_cpus(possible, present, online, p, early)
    target, order = _target_and_order(size, nr, p, min_order, max_order, min_objects)
    objs = objects_per_slab(size, order, p)
    return Structure(
        nr_cpus=nr,
        min_objects=target,
        order=order,
        objs_per_slab=objs,
        leftover=leftover_bytes(size, order, p),
        min_partial=min_partial(size, p),
        cpu_partial=cpu_partial_objects(size, p),
        cpu_partial_slabs=cpu_partial_slabs(size, objs, p),
        sheaf_capacity=sheaf_capacity(size, p, is_kmalloc, is_bootstrap, explicit_sheaf),
    )

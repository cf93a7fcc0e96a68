"""A plain-Python scalar reference of the structural SLUB formulas, used only by tests.

This module is a second, independent transcription of mm/slub.c, written from the kernel
sources of each era (not from :mod:`slabtune.model.policy`), so that the vectorised JAX
formulas can be checked against it value by value.  It takes one configuration at a time,
works on Python ints only (no numpy, no JAX), and keeps the kernel's loops as loops:
``calculate_order`` with its ``while (min_objects > 1)`` back-off, ``calc_slab_order``'s
``for (order = ...; order <= max_order; order++)`` scan, and so on.  Every difference
between eras is read from a :class:`~slabtune.model.profiles.KernelProfile` field.

Arithmetic is exact (Python ints), where the kernel multiplies 32-bit ints: the only
products that could wrap there (``min_objects * size`` in the uncapped v2.6.2x back-off)
only decide whether an order beyond ``slub_max_order`` is needed, which exact arithmetic
answers correctly.

The domain is the kernel's: object sizes up to PAGE_SIZE << MAX_PAGE_ORDER (beyond that
calculate_order() returns -ENOSYS and no cache exists) and boot-parameter orders 0..10.

Nothing outside ``tests/`` and ``benchmarks/`` should import this module: the model's one
place for each formula is :mod:`slabtune.model.policy`.
"""

from __future__ import annotations

from slabtune.model.profiles import (
    DEFAULT_MAX_ORDER,
    MAX_PAGE_ORDER,
    PAGE_SHIFT,
    PAGE_SIZE,
    POINTER_BYTES,
    SHEAF_HEADER_BYTES,
    KernelProfile,
)

#: Structural fields, in the order of ``policy.Structure``.
STRUCTURE_FIELDS: tuple[str, ...] = (
    "nr_cpus",
    "min_objects",
    "order",
    "objs_per_slab",
    "leftover",
    "min_partial",
    "cpu_partial",
    "cpu_partial_slabs",
    "sheaf_capacity",
)

#: -ENOSYS, what calculate_order() returns when no order up to the buddy allocator's
#: largest can hold one object.
ENOSYS = -38

_U64 = (1 << 64) - 1


# ---------------------------------------------------------------------------------------
# Bit helpers (include/asm-generic/bitops, include/asm-generic/getorder.h)
# ---------------------------------------------------------------------------------------


def fls(x: int) -> int:
    """fls(): 1-based index of the most significant set bit; fls(0) = 0, fls(224) = 8."""
    n = 0
    while x:
        x >>= 1
        n += 1
    return n


def ilog2(x: int) -> int:
    """ilog2() of a positive integer: floor(log2(x)) = fls(x) - 1."""
    return fls(x) - 1


def get_order(n: int) -> int:
    """get_order(): the smallest order with PAGE_SIZE << order >= n.

    Literally ``size--; size >>= PAGE_SHIFT; return fls64(size);`` on an unsigned long,
    so get_order(0) wraps to 52 as in the kernel (which calls it undefined).
    """
    n = (n - 1) & _U64
    n >>= PAGE_SHIFT
    return fls(n)


def order_objects(order: int, size: int) -> int:
    """order_objects(): how many objects of ``size`` fit a slab of ``order`` (no cap)."""
    return (PAGE_SIZE << order) // size


# ---------------------------------------------------------------------------------------
# calculate_order()
# ---------------------------------------------------------------------------------------


def order_nr_cpus(possible: int, present: int, online: int, profile: KernelProfile,
                  early: bool = False) -> int:
    """The CPU count calculate_order() feeds to fls(), by era.

    * up to v5.10: ``nr_cpu_ids`` (possible CPUs);
    * v5.11 (045ab8c9487b): ``num_online_cpus()``, which is 1 while ``start_kernel`` is
      still creating its caches (the kmalloc caches: ``early``);
    * v5.12 on: ``num_present_cpus()``, but ``nr_cpu_ids`` when that is <= 1, since some
      architectures only mark a CPU present when they bring it online.
    """
    rule = profile.nr_cpus_rule
    if rule == "possible":
        return possible
    if rule == "online_at_boot":
        if early:
            return 1
        return online
    if rule == "present_else_possible":
        nr_cpus = present
        if nr_cpus <= 1:
            nr_cpus = possible
        return nr_cpus
    raise ValueError(f"unknown nr_cpus_rule {rule!r}")


def min_objects_target(size: int, nr_cpus: int, profile: KernelProfile,
                       max_order: int = DEFAULT_MAX_ORDER, min_objects: int = 0) -> int:
    """The min_objects calculate_order() starts its search from.

    ``slub_min_objects`` if set, else 4 * (fls(nr_cpus) + 1) (v2.6.26 on); from the
    v2.6.30s capped at order_objects(slub_max_order, size), and since v6.8 that cap is at
    least 1 (get_order(0) is undefined).
    """
    target = min_objects
    if not target:
        target = 4 * (fls(nr_cpus) + 1)
    if profile.cap_min_objects:
        max_objects = order_objects(max_order, size)
        if profile.cap_at_least_one and max_objects < 1:
            max_objects = 1
        if target > max_objects:
            target = max_objects
    return target


def _too_many_objects_order(size: int, profile: KernelProfile) -> int:
    """get_order(size * MAX_OBJS_PER_PAGE) - 1: the order the kernel returns when a slab
    at the starting order would hold more objects than page->objects can count."""
    return get_order(size * profile.max_objs_per_slab) - 1


def _calc_slab_order_backoff(size: int, min_objects: int, max_order: int, fract_leftover: int,
                             slub_min_order: int, profile: KernelProfile) -> int:
    """slab_order()/calc_slab_order() of v2.6.26 .. v6.7.

    Returns the first order from max(slub_min_order, get_order(min_objects * size)) up to
    ``max_order`` whose leftover (slab % size) is at most slab / fract_leftover, or
    ``max_order + 1`` when none is (the loop runs off its end).
    """
    if order_objects(slub_min_order, size) > profile.max_objs_per_slab:
        return _too_many_objects_order(size, profile)
    order = max(slub_min_order, get_order(min_objects * size))
    while order <= max_order:
        slab_size = PAGE_SIZE << order
        if slab_size < min_objects * size:
            order += 1
            continue
        rem = slab_size % size
        if rem <= slab_size // fract_leftover:
            break
        order += 1
    return order


def _calculate_order_backoff(size: int, min_objects: int, profile: KernelProfile,
                             slub_min_order: int, slub_max_order: int) -> int:
    """calculate_order() of v2.6.26 .. v6.7: fractions inside a min_objects back-off.

    For each min_objects (halved up to v2.6.29, decremented after) try 1/16, 1/8, 1/4
    waste; then one object per slab within slub_max_order; then one object at any order
    the buddy allocator has.
    """
    while min_objects > 1:
        for fraction in profile.fractions:
            order = _calc_slab_order_backoff(size, min_objects, slub_max_order, fraction,
                                             slub_min_order, profile)
            if order <= slub_max_order:
                return order
        if profile.order_loop == "halve":
            min_objects //= 2
        else:
            min_objects -= 1

    # We were unable to place multiple objects in a slab: try a single object.
    order = _calc_slab_order_backoff(size, 1, slub_max_order, 1, slub_min_order, profile)
    if order <= slub_max_order:
        return order

    # This slab cannot be placed using slub_max_order.
    order = _calc_slab_order_backoff(size, 1, MAX_PAGE_ORDER, 1, slub_min_order, profile)
    if order <= MAX_PAGE_ORDER:
        return order
    return ENOSYS


def _calc_slab_order_v6_8(size: int, min_order: int, max_order: int, fract_leftover: int) -> int:
    """calc_slab_order() of v6.8 on: the first order in [min_order, max_order] whose
    leftover is at most slab / fract_leftover, else ``max_order + 1`` (or min_order when
    that is already beyond max_order)."""
    order = min_order
    while order <= max_order:
        slab_size = PAGE_SIZE << order
        rem = slab_size % size
        if rem <= slab_size // fract_leftover:
            break
        order += 1
    return order


def _calculate_order_single_pass(size: int, min_objects: int, profile: KernelProfile,
                                 slub_min_order: int, slub_max_order: int) -> int:
    """calculate_order() of v6.8 on ("attempt to find layouts up to 1/2 waste").

    The starting order is fixed by min_objects once; the fractions 1/16 .. 1/2 are tried
    in turn from it; if even one object does not fit slub_max_order, get_order(size).
    """
    min_order = max(slub_min_order, get_order(min_objects * size))
    if order_objects(min_order, size) > profile.max_objs_per_slab:
        return _too_many_objects_order(size, profile)

    for fraction in profile.fractions:
        order = _calc_slab_order_v6_8(size, min_order, slub_max_order, fraction)
        if order <= slub_max_order:
            return order

    order = get_order(size)
    if order <= MAX_PAGE_ORDER:
        return order
    return ENOSYS


def slab_order(size: int, nr_cpus: int, profile: KernelProfile, min_order: int = 0,
               max_order: int = DEFAULT_MAX_ORDER, min_objects: int = 0) -> int:
    """calculate_order(): the page order of a cache's slabs under ``profile``'s loop.

    ``min_order``, ``max_order`` and ``min_objects`` are the boot parameters
    slub_min_order, slub_max_order and slub_min_objects (0: unset).
    """
    target = min_objects_target(size, nr_cpus, profile, max_order, min_objects)
    if profile.order_loop == "single_pass":
        return _calculate_order_single_pass(size, target, profile, min_order, max_order)
    if profile.order_loop in ("halve", "decrement"):
        return _calculate_order_backoff(size, target, profile, min_order, max_order)
    raise ValueError(f"unknown order_loop {profile.order_loop!r}")


def objects_per_slab(size: int, order: int, profile: KernelProfile) -> int:
    """oo_objects(s->oo): objects in one slab of ``order``, at most MAX_OBJS_PER_PAGE."""
    objects = order_objects(order, size)
    if objects > profile.max_objs_per_slab:
        objects = profile.max_objs_per_slab
    return objects


def leftover_bytes(size: int, order: int, profile: KernelProfile) -> int:
    """Bytes at the end of a slab that no object occupies."""
    return (PAGE_SIZE << order) - objects_per_slab(size, order, profile) * size


# ---------------------------------------------------------------------------------------
# Partial lists
# ---------------------------------------------------------------------------------------


def min_partial(size: int, profile: KernelProfile) -> int:
    """set_min_partial(): empty slabs a node keeps on its partial list.

    MIN_PARTIAL (5) statically in v2.6.27; ilog2(size) clamped to [MIN_PARTIAL,
    MAX_PARTIAL] = [5, 10] from the 2008 dynamic patch; ilog2(size) / 2 clamped likewise in
    current kernels.
    """
    value = ilog2(size) // profile.min_partial_divisor
    if value < profile.min_partial_lo:
        value = profile.min_partial_lo
    elif value > profile.min_partial_hi:
        value = profile.min_partial_hi
    return value


def _size_class_value(size: int, table: tuple[int, int, int, int]) -> int:
    """The kernel's size ladder: >= PAGE_SIZE, >= 1024, >= 256, else smaller."""
    if size >= PAGE_SIZE:
        return table[0]
    if size >= 1024:
        return table[1]
    if size >= 256:
        return table[2]
    return table[3]


def cpu_partial_objects(size: int, profile: KernelProfile) -> int:
    """set_cpu_partial(): objects kept on a CPU's partial list (v3.2 .. v6.18), 0 where the
    era has no per-CPU partial lists."""
    if profile.cpu_partial_objects is None:
        return 0
    return _size_class_value(size, profile.cpu_partial_objects)


def cpu_partial_slabs(size: int, objs_per_slab: int, profile: KernelProfile) -> int:
    """The per-CPU partial list's slab limit.  v5.16 on, slub_set_cpu_partial():
    DIV_ROUND_UP(nr_objects * 2, oo_objects(s->oo)), assuming the listed slabs are half
    free.  Before v5.16 put_cpu_partial() drained once ``pobjects > cpu_partial``; with one
    free object per listed slab (a slab joins on its first free while full) that is
    ``cpu_partial + 1`` slabs."""
    nr_objects = cpu_partial_objects(size, profile)
    if profile.cpu_partial_counts_objects:
        return nr_objects + 1 if nr_objects > 0 else 0
    return (nr_objects * 2 + objs_per_slab - 1) // objs_per_slab


# ---------------------------------------------------------------------------------------
# Sheaves
# ---------------------------------------------------------------------------------------


def kmalloc_size_roundup(nbytes: int) -> int:
    """kmalloc_size_roundup() on x86-64 (KMALLOC_MIN_SIZE 8): the bucket that serves a
    request of ``nbytes``: 8, 16, 32, 64, 96, 128, 192, then powers of two up to
    KMALLOC_MAX_CACHE_SIZE (2 * PAGE_SIZE); larger requests go to the page allocator
    and get whole pages of get_order(nbytes)."""
    if nbytes == 0:
        return 0
    if nbytes > 2 * PAGE_SIZE:
        return PAGE_SIZE << get_order(nbytes)
    if nbytes <= 8:
        return 8
    if 64 < nbytes <= 96:
        return 96
    if 128 < nbytes <= 192:
        return 192
    return 1 << fls(nbytes - 1)


def sheaf_capacity(size: int, profile: KernelProfile, is_kmalloc: bool = False,
                   is_bootstrap: bool = False, explicit: int = 0) -> int:
    """s->sheaf_capacity.

    * before v6.18: no sheaves, 0;
    * v6.18: the capacity the cache's creator passes in kmem_cache_args, taken as is;
    * v7.0 on (calculate_sheaf_capacity()): 0 for the bootstrap caches (SLAB_NO_OBJ_EXT)
      and, where the profile says so, kmalloc caches; else 4/12/26/60 by object size,
      raised so that the 32-byte header plus 8 bytes per object exactly fills its kmalloc
      bucket, and at least the explicit request.
    """
    if profile.sheaves == "none":
        return 0
    if profile.sheaves == "opt_in":
        return explicit
    if profile.sheaves != "all":
        raise ValueError(f"unknown sheaves mode {profile.sheaves!r}")
    if is_bootstrap:
        return 0
    if is_kmalloc and not profile.sheaves_on_kmalloc:
        return 0
    capacity = _size_class_value(size, profile.sheaf_base_capacity)
    nbytes = SHEAF_HEADER_BYTES + POINTER_BYTES * capacity
    nbytes = kmalloc_size_roundup(nbytes)
    capacity = (nbytes - SHEAF_HEADER_BYTES) // POINTER_BYTES
    if explicit > capacity:
        capacity = explicit
    return capacity


# ---------------------------------------------------------------------------------------
# Everything together
# ---------------------------------------------------------------------------------------


def structure(size: int, possible: int, present: int, online: int, profile: KernelProfile,
              min_order: int = 0, max_order: int = DEFAULT_MAX_ORDER, min_objects: int = 0,
              early: bool = False, is_kmalloc: bool = False, is_bootstrap: bool = False,
              explicit_sheaf: int = 0) -> dict[str, int]:
    """Every structural field of one cache, keyed like ``policy.Structure``'s fields."""
    nr_cpus = order_nr_cpus(possible, present, online, profile, early)
    order = slab_order(size, nr_cpus, profile, min_order, max_order, min_objects)
    objs = objects_per_slab(size, order, profile)
    return {
        "nr_cpus": nr_cpus,
        "min_objects": min_objects_target(size, nr_cpus, profile, max_order, min_objects),
        "order": order,
        "objs_per_slab": objs,
        "leftover": leftover_bytes(size, order, profile),
        "min_partial": min_partial(size, profile),
        "cpu_partial": cpu_partial_objects(size, profile),
        "cpu_partial_slabs": cpu_partial_slabs(size, objs, profile),
        "sheaf_capacity": sheaf_capacity(size, profile, is_kmalloc, is_bootstrap,
                                         explicit_sheaf),
    }

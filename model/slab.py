"""SLAB's structural rules (mm/slab.c, CONFIG_SLAB, removed in v6.8), as pure functions.

SLAB sizes a cache once, at kmem_cache_create() time, and its per-CPU arrays once the CPU
count is known (enable_cpucache(), run for every cache from kmem_cache_init_late()).  What
it decides is what ``/proc/slabinfo`` prints: ``objperslab`` and ``pagesperslab`` (order),
and the tunables ``limit``, ``batchcount`` and ``sharedfactor``; and what it prints nowhere
but the dynamics will need: the node's shared array (sharedfactor * batchcount entries), the
alien caches (one per other online node, 12 entries) and the node's ``free_limit``.

The rules, and the source each was read from (64-bit, 4 KiB pages):

* ``calculate_slab_order()``: orders 0.. up to KMALLOC_MAX_ORDER; the first order that
  holds an object is taken, and the loop goes on to a larger order only while the slab
  wastes more than 1/8 of itself (``left_over * 8 <= PAGE_SIZE << gfporder`` stops it),
  never beyond ``slab_max_order`` (called ``slab_break_gfp_order`` before v3.4), and never
  for SLAB_RECLAIM_ACCOUNT caches (first fit).  slab_max_order is 1 on machines with more
  than 32 MiB of RAM, else 0; from v3.4 the ``slab_max_order=`` boot parameter sets it.
* Where the slab's management data lives, and so how many objects fit
  (``cache_estimate()``):

  - v2.6.33 and v3.1 (``layout = "slab_mgmt"``, read in mm/slab.c of a 2.6.3x tree with
    kmemcheck, kmemleak and memory hotplug support, between v2.6.34 and v3.2, whose
    kmem_cache_create(), cache_estimate(), calculate_slab_order() and enable_cpucache()
    are those of v2.6.33 and v3.1: they did not change in that span): a ``struct slab``
    (48 bytes) and one 4-byte ``kmem_bufctl_t`` per object, rounded up to the cache's
    alignment, sit at the start of the slab unless the object is at least PAGE_SIZE >> 3
    (512) bytes and the cache is not SLAB_NOLEAKTRACE, in which case they go off slab;
    off slab, calculate_slab_order() stops before an order whose object count exceeds
    ``(size - 48) / 4`` (the management block must not itself need an off-slab cache),
    and kmem_cache_create() moves the block back on slab (same order and count) when the
    leftover has room for it.
  - v6.1 (``layout = "freelist_idx"``, read in mm/slab.c of Debian's linux-source-6.1
    6.1.192): a one-byte ``freelist_idx_t`` per object (FREELIST_BYTE_INDEX, since
    SLAB_OBJ_MIN_SIZE is 16), so at most 255 objects a slab, and three placements tried in
    turn by __kmem_cache_create(): the freelist inside a free object
    (set_objfreelist_slab_cache(): not for caches with a constructor or
    SLAB_TYPESAFE_BY_RCU, nor with init_on_free, and only when ``num`` index bytes fit in
    one object, ``num <= object_size``); off slab in a kmalloc cache
    (set_off_slab_cache(): worth it only when that kmalloc cache's size is at most half
    the object size, and abandoned when the leftover could hold the freelist anyway); else
    on slab, ``num = slab_bytes / (size + 1)``.
* ``enable_cpucache()`` (identical in every version here): ``limit`` 1 above 128 KiB, 8
  above PAGE_SIZE, 24 above 1 KiB, 54 above 256 bytes, else 120 (capped at 32 with
  CONFIG_DEBUG_SLAB); ``batchcount = (limit + 1) / 2``; ``shared = 8`` when the object
  is at most PAGE_SIZE and ``num_possible_cpus() > 1``, else 0.  Every cache, the kmalloc
  caches included, gets these values from kmem_cache_init_late(), after setup_arch() has
  set the possible-CPU mask, so no cache sees a smaller CPU count (unlike SLUB's v5.11
  rule).
* ``alloc_alien_cache()``: on NUMA with more than one possible node (and without the
  ``noaliencache`` boot parameter), each node keeps one alien array per other online node,
  of 12 entries (``limit`` itself when it is 1).
* ``init_cache_node()`` (``alloc_kmemlist()`` before v3.x's renames):
  ``free_limit = (1 + nr_cpus_node(node)) * batchcount + num``: the free objects a node
  keeps on its slab lists before free_block() hands empty slabs back to the page
  allocator.

Pure Python integers: ``kernel check`` needs a few hundred caches at most, and these are the
exact references a vectorised form would be tested against.  Nothing here imports JAX.
"""

from __future__ import annotations

import functools
import itertools
import re
from collections.abc import Iterable
from typing import Literal, NamedTuple

from slabtune.errors import SlabtuneError
from slabtune.model import bootparams, profiles
from slabtune.model.profiles import PAGE_SIZE, SlabProfile

#: KMALLOC_MAX_ORDER on x86-64 (MAX_ORDER 11): calculate_slab_order() tries orders 0..10.
KMALLOC_MAX_ORDER = 10
#: enable_cpucache()'s limit by object size: (size above which, limit), first match wins.
LIMIT_TABLE: tuple[tuple[int, int], ...] = ((131072, 1), (PAGE_SIZE, 8), (1024, 24), (256, 54))
LIMIT_SMALL = 120
#: enable_cpucache()'s shared array factor on SMP.
SHARED_FACTOR = 8
#: With CONFIG_DEBUG_SLAB enable_cpucache() caps limit at 32.
DEBUG_LIMIT_CAP = 32
#: alloc_alien_cache(): entries of each alien array (when limit > 1).
ALIEN_LIMIT = 12
#: Boot RAM above which slab_max_order (slab_break_gfp_order) defaults to 1.
MAX_ORDER_HI_RAM = 32 << 20
#: kmalloc caches of a SLAB kernel on x86-64 (KMALLOC_SHIFT_LOW 5) as (request size,
#: cache size): 96 and 192 come after 64 and 128; kmalloc-96 is SLAB_HWCACHE_ALIGN'ed to
#: 128 bytes (ARCH_KMALLOC_FLAGS on a 64-byte line), kmalloc-192 stays 192.  Used for the
#: off-slab freelist (at most 255 bytes in v6.1), which kmalloc_slab() sizes.
KMALLOC_FREELIST_CACHES: tuple[tuple[int, int], ...] = (
    (32, 32), (64, 64), (96, 128), (128, 128), (192, 192), (256, 256))

Placement = Literal["objfreelist", "off_slab", "on_slab"]


class CacheFacts(NamedTuple):
    """What a cache's creator passed to kmem_cache_create() that SLAB's layout depends on
    and /proc/slabinfo does not print.

    ``object_size`` is the size asked for (0: the stride itself); ``no_objfreelist`` a
    constructor or SLAB_TYPESAFE_BY_RCU (or init_on_free), which rule out the freelist in
    an object (v6.1); ``reclaim`` SLAB_RECLAIM_ACCOUNT (first-fit order); ``noleaktrace``
    SLAB_NOLEAKTRACE (never off slab); ``align`` the cache's alignment (v2.6.33/v3.1 round
    the on-slab management block up to it; 0: word alignment).
    """

    object_size: int = 0
    no_objfreelist: bool = False
    reclaim: bool = False
    noleaktrace: bool = False
    align: int = 8


#: No creation facts: object size = stride, no constructor or special flags.
NO_FACTS = CacheFacts()


class SlabLayout(NamedTuple):
    """One cache's slab geometry: ``order``, ``num`` objects, ``left_over`` bytes and where
    the freelist (or struct slab and bufctls) lives.  ``num`` is 0 when nothing fits."""

    order: int
    num: int
    left_over: int
    placement: Placement


class CpuCache(NamedTuple):
    """enable_cpucache()'s tunables, as /proc/slabinfo prints them."""

    limit: int
    batchcount: int
    shared: int


class SlabStructure(NamedTuple):
    """Everything SLAB fixes about one cache on one machine."""

    order: int
    objs_per_slab: int
    left_over: int
    placement: Placement
    limit: int
    batchcount: int
    #: /proc/slabinfo's sharedfactor: the shared array holds shared * batchcount objects.
    shared: int
    shared_entries: int
    #: Entries of each alien array (0: no alien caches).
    alien_limit: int
    #: free_limit of each node (numbered as the topology's nodes).
    free_limit: tuple[int, ...]


def default_max_order(ram_bytes: int | None = None) -> int:
    """slab_max_order (slab_break_gfp_order before v3.4) when the boot does not set it:
    SLAB_MAX_ORDER_HI (1) above 32 MiB of RAM, else SLAB_MAX_ORDER_LO (0)
    (kmem_cache_init(), every version here).  ``None`` means a machine of today's size."""
    return 1 if ram_bytes is None or ram_bytes > MAX_ORDER_HI_RAM else 0


def _align(x: int, a: int) -> int:
    return -(-x // a) * a if a > 1 else x


def cache_estimate(order: int, size: int, off_slab: bool, profile: SlabProfile,
                   align: int = 8) -> tuple[int, int]:
    """(num, left_over) of an order-``order`` slab of ``size``-byte objects.

    ``off_slab`` covers both placements without management data in the slab (v6.1's
    OBJFREELIST and OFF_SLAB, v2.6.33's CFLGS_OFF_SLAB): ``num = slab / size``.  On slab,
    v6.1 reserves one freelist byte per object; v2.6.33/v3.1 a struct slab plus a 4-byte
    bufctl per object, the block rounded up to ``align``, and takes one object off the
    first guess when the rounded block does not fit (cache_estimate() of each version).
    """
    slab = PAGE_SIZE << order
    if off_slab:
        num = min(slab // size, profile.max_objs_per_slab)
        return num, slab - num * size
    entry = profile.freelist_entry_bytes
    if profile.layout == "freelist_idx":
        return slab // (size + entry), slab % (size + entry)
    head = profile.mgmt_header_bytes
    num = (slab - head) // (size + entry)
    if _align(head + num * entry, align) + num * size > slab:
        num -= 1
    num = min(num, profile.max_objs_per_slab)
    return num, slab - num * size - _align(head + num * entry, align)


def kmalloc_freelist_size(nbytes: int) -> int | None:
    """The size of the kmalloc cache kmalloc_slab() picks for an off-slab freelist of
    ``nbytes`` (v6.1); None beyond kmalloc-256 (never needed: at most 255 objects)."""
    for request, size in KMALLOC_FREELIST_CACHES:
        if nbytes <= request:
            return size
    return None


def calculate_slab_order(size: int, placement: Placement, profile: SlabProfile,
                         max_order: int, facts: CacheFacts = NO_FACTS) -> SlabLayout:
    """calculate_slab_order() for one placement: the order and object count SLAB settles on.

    Orders run from 0; one that holds no object is skipped; a count above the freelist's
    reach ends the search (v6.1: 255 objects, SLAB_OBJ_MAX_NUM; v2.6.33 off slab:
    ``(size - sizeof(struct slab)) / sizeof(kmem_bufctl_t)``).  v6.1 off slab also skips an
    order whose freelist would live in a kmalloc cache bigger than half the object
    (``freelist_cache_size > cachep->size / 2``, with cachep->size still the creator's
    object size).  The first acceptable order is kept and the search stops there for
    SLAB_RECLAIM_ACCOUNT caches, at ``max_order``, or once the waste is at most 1/8 of the
    slab.  The trade: bigger slabs waste less of each slab but ask the page allocator for
    contiguous pages it may not have.
    """
    off = placement != "on_slab"
    object_size = facts.object_size or size
    best = SlabLayout(0, 0, 0, placement)
    for order in range(KMALLOC_MAX_ORDER + 1):
        num, left = cache_estimate(order, size, off, profile, facts.align)
        if num == 0:
            continue
        if profile.layout == "freelist_idx":
            if num > profile.max_objs_per_slab:
                break
            if placement == "off_slab":
                fl = kmalloc_freelist_size(num * profile.freelist_entry_bytes)
                if fl is None or fl > object_size // 2:
                    continue
        elif off and num > (size - profile.mgmt_header_bytes) // profile.freelist_entry_bytes:
            break
        best = SlabLayout(order, num, left, placement)
        if facts.reclaim or order >= max_order or left * 8 <= (PAGE_SIZE << order):
            break
    return best


def slab_layout(size: int, profile: SlabProfile, max_order: int | None = None,
                facts: CacheFacts = NO_FACTS) -> SlabLayout:
    """The placement, order and object count kmem_cache_create() settles on for objects of
    stride ``size`` (/proc/slabinfo's objsize), under ``max_order`` (default:
    :func:`default_max_order`).

    v6.1 (__kmem_cache_create()): the freelist in an object when allowed and ``num`` bytes
    fit in one object; else off slab when set_off_slab_cache() finds an order and the
    leftover cannot hold the freelist; else on slab.  v2.6.33/v3.1 (kmem_cache_create()):
    off slab from PAGE_SIZE >> 3 bytes, moved back on slab (same geometry) when the leftover
    holds the management block.
    """
    if max_order is None:
        max_order = default_max_order()
    object_size = facts.object_size or size
    if profile.layout == "freelist_idx":
        if not facts.no_objfreelist:
            lay = calculate_slab_order(size, "objfreelist", profile, max_order, facts)
            if lay.num and lay.num * profile.freelist_entry_bytes <= object_size:
                return lay
        if not facts.noleaktrace:
            lay = calculate_slab_order(size, "off_slab", profile, max_order, facts)
            if lay.num and lay.left_over < lay.num * profile.freelist_entry_bytes:
                return lay
        return calculate_slab_order(size, "on_slab", profile, max_order, facts)
    if object_size >= profile.off_slab_min_size and not facts.noleaktrace:
        lay = calculate_slab_order(size, "off_slab", profile, max_order, facts)
        mgmt = _align(profile.mgmt_header_bytes + lay.num * profile.freelist_entry_bytes,
                      facts.align)
        if lay.num and lay.left_over >= mgmt:
            return SlabLayout(lay.order, lay.num, lay.left_over - mgmt, "on_slab")
        return lay
    return calculate_slab_order(size, "on_slab", profile, max_order, facts)


def cpucache_tunables(size: int, nr_possible_cpus: int, debug: bool = False) -> CpuCache:
    """enable_cpucache(): (limit, batchcount, shared) of a cache of stride ``size``.

    The per-CPU array (``limit`` objects) is SLAB's fast path: small objects get long
    arrays, large ones short, since a full array pins limit * size bytes per CPU.  Refills
    and flushes move ``batchcount`` objects at a time under the node's list_lock.  The
    node's shared array (shared * batchcount objects) passes objects between CPUs of one
    node without touching slabs; on a machine with one possible CPU it would only be a
    bigger limit, so it is off.
    """
    limit = next((lim for above, lim in LIMIT_TABLE if size > above), LIMIT_SMALL)
    if debug:
        limit = min(limit, DEBUG_LIMIT_CAP)
    shared = SHARED_FACTOR if size <= PAGE_SIZE and nr_possible_cpus > 1 else 0
    return CpuCache(limit, (limit + 1) // 2, shared)


def alien_limit(limit: int, possible_nodes: int, use_alien_caches: bool = True) -> int:
    """Entries of each alien array (alloc_alien_cache()); 0 where there are none: one
    possible node, or the ``noaliencache`` boot parameter.  A free of another node's
    object on NUMA goes to the alien array for that node and reaches its slabs in
    batches, instead of taking the remote list_lock for every object."""
    if possible_nodes <= 1 or not use_alien_caches:
        return 0
    return _alien_entries(limit)


def _alien_entries(limit: int) -> int:
    """Entries of one alien array of a cache whose per-CPU limit is ``limit``
    (alloc_alien_cache(): ALIEN_LIMIT, or the limit itself when it is 1)."""
    return ALIEN_LIMIT if limit > 1 else limit


#: do_tune_cpucache() allocates the per-CPU arrays with __alloc_percpu(), which refuses
#: more than PCPU_MIN_UNIT_SIZE (32 KiB): 8-byte pointers after the 16-byte struct
#: array_cache (avail, limit, batchcount, touched) leave room for 4094 (6.1 mm/slab.c
#: alloc_kmem_cache_cpus(), mm/percpu.c pcpu_alloc()).
LIMIT_MAX = (32768 - 16) // 8


def tunables_accepted(limit, batchcount, shared):
    """Whether slabinfo_write() applies a tunables line (6.1 mm/slab.c): it calls
    do_tune_cpucache() only when ``limit >= 1``, ``1 <= batchcount <= limit`` and
    ``shared >= 0``; any other line is skipped (the write returns its length and the cache
    keeps its tunables).  Elementwise on numpy arrays."""
    return (limit >= 1) & (batchcount >= 1) & (batchcount <= limit) & (shared >= 0)


def retuned_alien_limit(alien: int, limit: int) -> int:
    """Entries of a cache's alien arrays once its limit is set to ``limit`` by a
    /proc/slabinfo write: unchanged, ``alien`` (0 where the cache has none).
    do_tune_cpucache() -> setup_kmem_cache_nodes() -> setup_kmem_cache_node() (6.1
    mm/slab.c) does allocate alien arrays from the new limit, but installs them only where
    the node has none (``if (!n->alien)``) and frees them otherwise; a cache's arrays exist
    from its first enable_cpucache(), so they keep the entries of its default limit (12,
    or 1 for a cache whose default limit is 1).  ``limit`` is taken for the callers'
    sake and does not change the result."""
    del limit
    return int(alien)


#: Bytes of an alien array before its entries, on x86-64: 6.1's struct alien_cache
#: (spinlock_t lock, padded to the 8-byte alignment of the struct array_cache after it:
#: avail, limit, batchcount, touched) and 3.1's struct array_cache (the same four counts,
#: then spinlock_t lock, padded to the entries' 8 bytes) are both 24 bytes.
ALIEN_HEADER_BYTES = 24
#: x86-64's cache line, and the bytes of one entry (a pointer).
CACHE_LINE_BYTES = 64
POINTER_BYTES = 8


def alien_section_lines(entries):
    """Mean cache lines one cache_free_alien() critical section touches (6.1
    __cache_free_alien(), 3.1 cache_free_alien(): ``spin_lock(&alien->lock)``, a full array
    first drained, then ``ac->entry[ac->avail++] = objp``), over the ``entries`` frees that
    fill an alien array of that many entries (0 where there are none).

    The array is one kmalloc object of ALIEN_HEADER_BYTES + 8 * entries bytes (120 at 12
    entries: kmalloc-128, aligned to its size, so it starts a line).  Every section
    touches the first line (lock word and ``avail``, with the first entries); the push of
    entry i touches a second line when its byte offset is past the first line.  Works on
    ints and arrays alike."""
    first = (CACHE_LINE_BYTES - ALIEN_HEADER_BYTES) // POINTER_BYTES
    beyond = (entries - first) * (entries > first)
    return (entries > 0) * (1.0 + beyond / (entries + (entries <= 0)))


def free_limit(batchcount: int, num: int, cpus_on_node: int) -> int:
    """init_cache_node(): ``(1 + nr_cpus_node(node)) * batchcount + num``, the free objects
    a node's slab lists keep before free_block() returns empty slabs to the page
    allocator: room for every CPU's batch plus one slab."""
    return (1 + cpus_on_node) * batchcount + num


def structure(size: int, nr_possible_cpus: int, node_cpus: Iterable[int],
              profile: SlabProfile, max_order: int | None = None,
              facts: CacheFacts = NO_FACTS, possible_nodes: int | None = None,
              use_alien_caches: bool = True, debug: bool = False) -> SlabStructure:
    """Everything SLAB fixes about a cache of stride ``size`` on a machine with
    ``nr_possible_cpus`` possible CPUs and ``node_cpus[i]`` CPUs on node i."""
    node_cpus = tuple(int(c) for c in node_cpus)
    lay = slab_layout(size, profile, max_order, facts)
    tun = cpucache_tunables(size, nr_possible_cpus, debug)
    nodes = len(node_cpus) if possible_nodes is None else possible_nodes
    return SlabStructure(
        order=lay.order, objs_per_slab=lay.num, left_over=lay.left_over,
        placement=lay.placement, limit=tun.limit, batchcount=tun.batchcount,
        shared=tun.shared, shared_entries=tun.shared * tun.batchcount,
        alien_limit=alien_limit(tun.limit, nodes, use_alien_caches),
        free_limit=tuple(free_limit(tun.batchcount, lay.num, c) for c in node_cpus))


def detect_slab_profile(release: str) -> SlabProfile:
    """The SLAB profile whose era covers a kernel release (``6.1.192-slabtune-slab`` ->
    slab-v6.1): the newest at or below it.  SLAB left the kernel in v6.8, so a release from
    6.8 on has no SLAB; UnknownProfileError then, and for an unreadable or older release.
    Versions are (major, minor), so every 2.6.x release maps to slab-v2.6.33: right for
    the structure (cache_estimate() and calculate_slab_order() as read hold from 2.6.15 to
    v3.14), not for 2.6.35-2.6.39's numa_mem_id() fix, which slab-v3.1 has."""
    ver = profiles.release_version(release)
    if ver is None:
        raise profiles.UnknownProfileError(
            f"cannot read a kernel version from release {release!r}")
    if ver >= (6, 8):
        raise profiles.UnknownProfileError(
            f"kernel release {release!r} has no SLAB (mm/slab.c was removed in v6.8)")
    older = [p for p in profiles.SLAB_PROFILES.values() if p.version <= ver]
    if not older:
        raise profiles.UnknownProfileError(
            f"kernel release {release!r} is older than every SLAB profile")
    return max(older, key=lambda p: p.version)


# --------------------------------------------------------------------------- creation facts

_KMALLOC = re.compile(r"^(?:dma-)?kmalloc-(?:(rcl|cg|rnd-\d+)-)?(\d+)(k?)$")

#: Creation facts of v6.1 caches whose geometry /proc/slabinfo's stride alone leaves open
#: (:func:`layout_candidates` finds them), read at their kmem_cache_create() call in
#: Debian's linux-source-6.1 6.1.192; object sizes from the struct on x86-64 without
#: lockdep.  The rest of a 6.1 guest's caches come out the same whatever their creator
#: passed, so they need no entry.
V61_CACHE_FACTS: dict[str, CacheFacts] = {
    # drivers/acpi/osl.c acpi_os_create_cache(): no flags, no constructor;
    # sizeof(union acpi_generic_state) is the 80-byte stride.
    "Acpi-State": CacheFacts(object_size=80),
    # kernel/fork.c proc_caches_init(): SLAB_HWCACHE_ALIGN, no constructor; struct
    # fs_struct is 56 bytes (five ints, two struct path), so 64 index bytes do not fit in
    # one object and the freelist stays on slab: 63 objects.
    "fs_cache": CacheFacts(object_size=56),
    # fs/seq_file.c seq_file_init(): KMEM_CACHE(seq_file, ...), no constructor.
    "seq_file": CacheFacts(object_size=120),
    # mm/vmalloc.c vmalloc_init(): KMEM_CACHE(vmap_area, SLAB_PANIC): 64 bytes, no ctor.
    "vmap_area": CacheFacts(object_size=64),
    # Order 1 needs a cache without SLAB_RECLAIM_ACCOUNT (which stops at the first fit):
    # files_cache and task_struct (kernel/fork.c), shmem_inode_cache (mm/shmem.c, with a
    # constructor), sighand_cache (kernel/fork.c, SLAB_TYPESAFE_BY_RCU and a constructor).
    "files_cache": CacheFacts(object_size=704),
    "task_struct": CacheFacts(object_size=2816),
    "shmem_inode_cache": CacheFacts(object_size=712, no_objfreelist=True),
    "sighand_cache": CacheFacts(object_size=2112, no_objfreelist=True),
    # net/socket.c sock_init(): SLAB_HWCACHE_ALIGN | SLAB_RECLAIM_ACCOUNT, with init_once.
    "sock_inode_cache": CacheFacts(object_size=704, no_objfreelist=True, reclaim=True),
}


def kmalloc_facts(name: str) -> CacheFacts | None:
    """Creation facts of a kmalloc cache from its name (create_kmalloc_cache(): no
    constructor, object size the class size, SLAB_RECLAIM_ACCOUNT for kmalloc-rcl-*);
    None for any other name."""
    m = _KMALLOC.match(name)
    if m is None:
        return None
    size = int(m.group(2)) * (1024 if m.group(3) else 1)
    return CacheFacts(object_size=size, reclaim=m.group(1) == "rcl")


def known_facts(name: str, profile: SlabProfile) -> CacheFacts | None:
    """What slabtune knows of a cache's creation: kmalloc caches by name, the v6.1 table
    for a v6.1 profile; None when nothing is known."""
    facts = kmalloc_facts(name)
    if facts is None and profile.layout == "freelist_idx":
        facts = V61_CACHE_FACTS.get(name)
    return facts


@functools.lru_cache(maxsize=65536)
def _layout(size: int, profile: SlabProfile, max_order: int, facts: CacheFacts) -> SlabLayout:
    return slab_layout(size, profile, max_order, facts)


def layout_candidates(size: int, profile: SlabProfile, max_order: int,
                      facts: CacheFacts | None = None) -> tuple[SlabLayout, ...]:
    """Every (order, objects) geometry a cache of stride ``size`` can have, one layout per
    distinct geometry: the one of ``facts`` when given, else one for each combination of
    what /proc/slabinfo does not show: a constructor or SLAB_TYPESAFE_BY_RCU or not,
    SLAB_RECLAIM_ACCOUNT or not, an object size from just above max(size / 2, size - 64)
    up to the stride (what word or cache-line alignment leaves; a cache with a larger
    explicit alignment needs its facts given) and, for the slab_mgmt profiles, an
    alignment of 8 to 64 bytes.  One candidate means the stride decides the geometry."""
    if facts is not None:
        return (_layout(size, profile, max_order, facts),)
    aligns = (8,) if profile.layout == "freelist_idx" else (8, 16, 32, 64)
    seen: dict[tuple[int, int], SlabLayout] = {}
    for obj in range(max(size // 2, size - 64) + 1, size + 1):
        for no_ofl, reclaim, align in itertools.product((False, True), (False, True), aligns):
            lay = _layout(size, profile, max_order,
                          CacheFacts(obj, no_ofl, reclaim, False, align))
            seen.setdefault((lay.order, lay.num), lay)
    return tuple(seen.values())


class SlabParams(NamedTuple):
    """SLAB's boot parameters as a boot applied them."""

    max_order: int = 1
    use_alien_caches: bool = True


def parse_cmdline(cmdline: str, profile: SlabProfile, ram_bytes: int | None = None) -> SlabParams:
    """The SLAB parameters of a boot: ``slab_max_order=`` where the profile has it
    (slab_max_order_setup(): get_option() into an int, below 0 taken as 0, above
    MAX_ORDER - 1 as 10; the last one wins) and ``noaliencache``; slab_max_order defaults
    by RAM (:func:`default_max_order`).  A slab_max_order value that is not a decimal
    integer in 0..10 raises SlabtuneError naming it, as the SLUB check does for its
    parameters."""
    max_order = default_max_order(ram_bytes)
    aliens = True
    for arg in bootparams.split_cmdline(cmdline):
        name, eq, value = arg.partition("=")
        name = name.replace("-", "_")
        if name == "noaliencache" and not eq:
            aliens = False
        elif name == "slab_max_order" and eq and name in profile.boot_params:
            text = value.strip()
            if not (text.isdigit() and int(text) <= profiles.MAX_PAGE_ORDER):
                raise SlabtuneError(f"cmdline {arg}: must be an integer in "
                                    f"0..{profiles.MAX_PAGE_ORDER}")
            max_order = int(text)
    return SlabParams(max_order, aliens)


# --------------------------------------------------------------------------- knobs

#: Knobs only SLAB has: the tunables /proc/slabinfo takes (slabinfo_write(): "name limit
#: batchcount shared") and the order cap (``slab_max_order=``, v3.4 on).
SLAB_ONLY_KNOBS: dict[str, str] = {
    "limit": "per-CPU array size, a /proc/slabinfo tunable",
    "batchcount": "objects per array refill or flush, a /proc/slabinfo tunable",
    "shared": "shared array factor, a /proc/slabinfo tunable",
    "slab_max_order": "SLAB's slab order cap, a boot parameter",
}
#: Knobs and boot parameters of SLUB that SLAB has nothing like.
SLUB_ONLY_KNOBS: dict[str, str] = {
    "min_partial": "partial slabs a node keeps",
    "cpu_partial": "per-CPU partial lists",
    "sheaf_capacity": "sheaves",
    "barns_on_memoryless_nodes": "sheaves and barns",
    "slub_min_order": "SLUB's order floor, a boot parameter",
    "slub_max_order": "SLUB's order cap, a boot parameter",
    "slub_min_objects": "SLUB's objects-per-slab target, a boot parameter",
    "slab_min_order": "SLUB's order floor, a boot parameter (v6.8 spelling)",
    "slab_min_objects": "SLUB's objects-per-slab target, a boot parameter (v6.8 spelling)",
}
#: Knobs a SLAB profile takes besides its boot parameters (the /proc/slabinfo tunables and
#: the numa_mem_id() switch).
SLAB_TUNABLES: tuple[str, ...] = ("limit", "batchcount", "shared")


def foreign_knob(name: str, profile: profiles.KernelProfile | SlabProfile) -> str | None:
    """Why a knob is refused when it belongs to the other allocator than ``profile``'s
    (one line naming the knob and the profile), else None.  ``slab_max_order`` is SLUB's
    own spelling of slub_max_order from v6.8, so only older SLUB profiles refuse it."""
    if profiles.is_slab(profile):
        what = SLUB_ONLY_KNOBS.get(name)
        return f"{name} is a SLUB knob ({what}); profile {profile.name} is SLAB" if what else None
    what = SLAB_ONLY_KNOBS.get(name)
    if what is None or name in bootparams.allowed_names(profile):
        return None
    return f"{name} is a SLAB knob ({what}); profile {profile.name} is SLUB"


def validate_params(params: dict[str, object], profile: SlabProfile) -> dict[str, object]:
    """Strictly check a SLAB profile's knobs: the tunables as do_tune_cpucache() would take
    them from /proc/slabinfo (limit >= 1, 1 <= batchcount <= limit, shared >= 0), the
    profile's boot parameters (slab_max_order 0..10) and memoryless_fallback (a bool).
    SlabtuneError names the knob: a SLUB knob (:func:`foreign_knob`), a boot parameter
    the profile's kernel does not have, a value of the wrong type or out of range."""
    out: dict[str, object] = {}
    allowed = SLAB_TUNABLES + profile.boot_params + ("memoryless_fallback",)
    for name, value in params.items():
        msg = foreign_knob(name, profile)
        if msg is not None:
            raise SlabtuneError(f"{name}: {msg}")
        if name == "slab_max_order" and name not in profile.boot_params:
            raise SlabtuneError(f"slab_max_order: profile {profile.name} has no such boot "
                                "parameter (slab_max_order= came in v3.4)")
        if name not in allowed:
            raise SlabtuneError(f"{name}: unknown knob for SLAB profile {profile.name} "
                                f"(allowed: {', '.join(allowed)})")
        if name == "memoryless_fallback":
            if not isinstance(value, bool):
                raise SlabtuneError(f"{name}: {value!r} is not true or false")
        elif isinstance(value, bool) or not isinstance(value, int):
            raise SlabtuneError(f"{name}: {value!r} is not an integer")
        out[name] = value
    lo = {"limit": 1, "batchcount": 1, "shared": 0, "slab_max_order": 0}
    for name, low in lo.items():
        if name in out and out[name] < low:
            raise SlabtuneError(f"{name}: {out[name]} is below {low}")
    if out.get("slab_max_order", 0) > profiles.MAX_PAGE_ORDER:
        raise SlabtuneError(f"slab_max_order: {out['slab_max_order']} is above "
                            f"{profiles.MAX_PAGE_ORDER}")
    if "limit" in out and out.get("batchcount", 0) > out["limit"]:
        raise SlabtuneError(f"batchcount: {out['batchcount']} is above limit {out['limit']}")
    return out

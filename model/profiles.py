"""Kernel profiles: what each SLUB era computes, as data.

A profile names the rules mm/slub.c of one kernel version applies when it sizes a cache and
runs its fast paths.  Nothing in the model branches on a version string: every difference
between eras is a field here, and the vectorised formulas in :mod:`slabtune.model.policy`
read the fields (as integer arrays, so that several profiles broadcast against sizes and CPU
counts in one compiled call).

Sources, all restated from mm/slub.c of the version named:

* ``calculate_order``: up to v2.6.2x the min_objects back-off halved (``min_objects /= 2``)
  and was not capped by what a max-order slab holds; from the 2.6.30s it was capped and
  decremented by one; v6.8 ("attempt to find layouts up to 1/2 waste") dropped the
  min_objects loop and added fraction 2, and later kernels made the cap at least 1.
* ``nr_cpus``: ``nr_cpu_ids`` up to v5.10; ``num_online_cpus()`` in v5.11 (045ab8c9487b,
  which is 1 for caches created before secondary CPUs are brought up); from v5.12
  ``num_present_cpus()``, or ``nr_cpu_ids`` when that is <= 1.
* ``min_partial``: a static MIN_PARTIAL (5) in v2.6.27; ilog2(size) clamped to [5, 10] from
  the 2008 dynamic per-cache patch (seed slub-dynamic-min-partial-2008); ilog2(size) / 2
  clamped to [5, 10] in current kernels.  Where __slab_free() applies it changed:
  :attr:`KernelProfile.slab_free_discard_offset` (no test before v3.1, ``>`` in v3.1,
  ``>=`` later).
* per-CPU partial lists: v3.2 to v6.18.  Before v5.16 the limit was counted in objects with
  the table 2/6/13/30; v5.16 moved to a slab count derived from 6/24/52/120 objects.
* sheaves: opt-in per cache (explicit capacity) in v6.18; every cache but the two bootstrap
  caches from v7.0, the kmalloc caches included.  calculate_sizes() skips the kmalloc caches
  (their sheaves and barns are themselves kmalloc'ed) and kmem_cache_init() gives them
  sheaves afterwards with bootstrap_kmalloc_sheaves(), at the default capacity (patch
  "slab: handle kmalloc sheaves bootstrap" of the series merged for v7.0 as
  slab/for-7.0/sheaves; mm/slub.c of 7.2.13: calculate_sizes() 7990,
  bootstrap_cache_sheaves() 8498, bootstrap_kmalloc_sheaves() 8552, called at 8615).  A
  cache whose creator asks for a capacity (kmem_cache_args.sheaf_capacity) gets
  max(default, request) from v7.0 (calculate_sheaf_capacity(), 7.2.13 mm/slub.c:7839).
  Barns on nodes with memory in v7.0, on every online node from v7.1 (seed
  sheaves-cross-cpu-regression-2026).  7.2 keeps v7.1's rules (its kmem_cache_init() puts
  a barn on every online node; its structure is checked against snapshots of a 7.2.13
  guest, tests/data/guest-v7.2-*.csv), so a 7.2 release maps to v7.1.
* CPUs on memoryless nodes (``memoryless_fallback``, see the field): SLUB never had the
  problem the 2010 numa_mem_id() fix solved, which was SLAB's ("numa: slab: use
  numa_mem_id() for slab local memory node", v2.6.35).  Every SLUB profile here keeps the
  per-CPU fast path for those CPUs.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Literal

NrCpusRule = Literal["possible", "online_at_boot", "present_else_possible"]
OrderLoop = Literal["halve", "decrement", "single_pass"]
SheafMode = Literal["none", "opt_in", "all"]
BarnNodes = Literal["none", "memory_nodes", "all_nodes"]

NR_CPUS_RULES: tuple[str, ...] = ("possible", "online_at_boot", "present_else_possible")
ORDER_LOOPS: tuple[str, ...] = ("halve", "decrement", "single_pass")
SHEAF_MODES: tuple[str, ...] = ("none", "opt_in", "all")
#: Sheaf modes under which caches keep their per-CPU slab: all before v7.0, whose sheaves
#: for every cache replaced it (see KernelProfile.has_cpu_slab).
CPU_SLAB_SHEAF_MODES = ("none", "opt_in")
BARN_NODES: tuple[str, ...] = ("none", "memory_nodes", "all_nodes")

PAGE_SHIFT = 12
PAGE_SIZE = 1 << PAGE_SHIFT
#: PAGE_ALLOC_COSTLY_ORDER, the default slub_max_order in every profile here.
DEFAULT_MAX_ORDER = 3
#: Largest order the buddy allocator hands out on x86-64 (MAX_ORDER - 1 before v6.4,
#: MAX_PAGE_ORDER after; the value is 10 either way).
MAX_PAGE_ORDER = 10
#: struct slab_sheaf is a 32-byte header followed by an array of object pointers.
SHEAF_HEADER_BYTES = 32
POINTER_BYTES = 8
#: A barn holds at most this many full and this many empty sheaves (MAX_FULL_SHEAVES,
#: MAX_EMPTY_SHEAVES).
BARN_MAX_FULL = 10
BARN_MAX_EMPTY = 10
#: KernelProfile.slab_free_discard_offset of kernels whose __slab_free() discards every
#: slab it empties: min_partial plus this is below any partial-slab count.
DISCARD_EVERY_EMPTIED = -(1 << 20)
#: The default remote_node_defrag_ratio of every SLUB cache (kmem_cache_open(), 6.1.192
#: and 6.12.117; do_kmem_cache_create(), 7.2.13; already in the 2008 code that clamps
#: min_partial by ilog2(size)): get_any_partial() searches other nodes' partial lists
#: only when ``get_cycles() % 1024`` is at most this, 1001 calls in 1024.
REMOTE_NODE_DEFRAG_RATIO = 1000


@dataclasses.dataclass(frozen=True)
class KernelProfile:
    """The slab-sizing and fast-path rules of one kernel era.

    Size-class tables are ordered (>= PAGE_SIZE, >= 1024, >= 256, smaller).
    """

    name: str
    version: tuple[int, int]
    nr_cpus_rule: NrCpusRule
    order_loop: OrderLoop
    #: Leftover fractions tried in order: a slab may waste at most slab_bytes / fraction.
    fractions: tuple[int, ...]
    #: Whether min_objects is capped at what an order-slub_max_order slab holds.
    cap_min_objects: bool
    #: Whether that cap is at least 1 (max(order_objects(max_order), 1)).
    cap_at_least_one: bool
    #: MAX_OBJS_PER_PAGE: 65535 while page->objects was 16 bits, 32767 from v2.6.3x.
    max_objs_per_slab: int
    #: min_partial = clamp(ilog2(size) // divisor, lo, hi); lo == hi gives a static value.
    min_partial_divisor: int
    min_partial_lo: int
    min_partial_hi: int
    #: Per-CPU partial object limits by size class, or None where the era has no such list.
    cpu_partial_objects: tuple[int, int, int, int] | None
    #: Sheaves: none, opt-in (explicit capacity by the cache's creator) or every cache.
    sheaves: SheafMode
    #: Default sheaf capacity by size class before the kmalloc-bucket round-up.
    sheaf_base_capacity: tuple[int, int, int, int]
    #: Whether kmalloc caches get sheaves when ``sheaves == "all"``: they do from v7.0 on
    #: (bootstrap_kmalloc_sheaves(), default capacity), the release that made sheaves
    #: universal; False only matters to a profile built by hand.
    sheaves_on_kmalloc: bool
    #: Where barns live.
    barns: BarnNodes
    #: Whether a free of an object from another node than the freeing CPU's memory node
    #: bypasses the sheaf (v7.0 ``slab_nid(slab) == numa_mem_id()`` test).
    remote_free_bypasses_sheaf: bool
    #: Whether CPUs on memoryless nodes may free into sheaves anyway (v7.1).
    memoryless_cpus_use_sheaves: bool
    #: Whether a CPU on a memoryless node allocates through its per-CPU cache (CPU slab or
    #: sheaves) like any other CPU (True), or takes every object from its memory node's
    #: partial list under the list_lock (False).  True in every SLUB profile: SLUB's fast
    #: path asks node_match(c, node) with node = -1 (NUMA_NO_NODE) for kmalloc() and
    #: kmem_cache_alloc(), which matches any slab, so the CPU slab serves a memoryless CPU
    #: (slab_alloc() and __slab_alloc() of v2.6.24 and v3.1, slab_alloc_node() of 6.1.192,
    #: read there).  False is SLAB's behaviour before v2.6.35, whose per-CPU arrays only
    #: held objects of numa_node_id() (fixed by "numa: slab: use numa_mem_id() for slab
    #: local memory node"): the 2010 seed's mechanism, kept as the
    #: ``[policy.params] memoryless_fallback = false`` override until SLAB has profiles.
    #:
    #: What SLUB does on such a CPU whatever this switch says: when the per-CPU cache
    #: runs dry, get_partial() searches numa_mem_id()'s node, which is the memoryless node
    #: itself on x86 (no CONFIG_HAVE_MEMORYLESS_NODES: numa_mem_id() is numa_node_id()) and
    #: on every architecture before Joonsoo Kim's 2014 patch "slub: search partial list on
    #: numa_mem_id(), instead of numa_node_id()"; that node has no kmem_cache_node, so
    #: get_any_partial() walks the zonelist and takes a partial slab only from a node with
    #: more than min_partial of them, and only when get_cycles() % 1024 is at most
    #: remote_node_defrag_ratio (:data:`REMOTE_NODE_DEFRAG_RATIO`), else new_slab() gets a
    #: fresh slab from the nearest node (6.1.192 get_partial()/get_any_partial(), 7.2.13
    #: get_from_partial()/get_from_any_partial() and refill_objects()).  The model does
    #: this for the nearest memory node (dynamics.node_list_floor).  Explicit-node allocations
    #: (kmalloc_node() of a memoryless node, whose ALLOC_NODE_MISMATCH deactivations the
    #: 2014 node_to_mem_node() patches stopped) are not modelled at all.
    memoryless_fallback: bool
    #: Boot parameter spellings the kernel accepts.
    boot_param_prefixes: tuple[str, ...]

    @property
    def has_cpu_partial(self) -> bool:
        return self.cpu_partial_objects is not None

    @property
    def cpu_partial_counts_objects(self) -> bool:
        """Whether the per-CPU partial limit counts free objects (put_cpu_partial()'s
        ``pobjects > s->cpu_partial`` test, v3.2 to v5.15) rather than slabs (v5.16,
        "mm, slub: change percpu partial accounting from objects to pages":
        ``slabs >= s->cpu_partial_slabs``)."""
        return self.has_cpu_partial and self.version < (5, 16)

    @property
    def unfrozen_cpu_partial(self) -> bool:
        """Whether per-CPU partial slabs are no longer frozen (v6.8, "SLUB: delay freezing
        of partial slabs"): a free that empties one then takes its node's list_lock in
        __slab_free() (``!new.inuse`` with ``prior`` and not ``was_frozen``; 6.12.117
        mm/slub.c), where a frozen one (v3.2 to v6.7) took no lock."""
        return self.has_cpu_partial and self.version >= (6, 8)

    @property
    def slab_free_discard_offset(self) -> int:
        """What __slab_free() adds to min_partial to get the partial slabs a node must
        hold before it discards a slab a free has just emptied (the slab itself counted
        when it is on the list): 0 for ``>=``, 1 for ``>``, and
        :data:`DISCARD_EVERY_EMPTIED` where there is no test.  An offset, not a count, so
        that it holds for any min_partial a policy sets.

        Before v3.1 __slab_free() discarded every slab it emptied (``slab_empty:``
        remove_partial() and discard_slab(), no test: mm/slub.c of 2.6.22 to 2.6.3x, and
        the 2008 seed's patch touches min_partial only in unfreeze_slab() and
        get_any_partial()), so min_partial only kept empty CPU slabs a deactivation
        handed back.  v3.1's lockless __slab_free() ("slub: Rework allocator fastpaths",
        March 2011) keeps the slab while ``n->nr_partial > s->min_partial`` is false, as
        3.2 does; the test reads ``n->nr_partial >= s->min_partial`` in the 4.x sources
        and in 6.1 to 7.2 (the profiles from v5.10 on)."""
        if self.version < (3, 1):
            return DISCARD_EVERY_EMPTIED
        if self.version < (4, 0):
            return 1
        return 0

    @property
    def has_cpu_slab(self) -> bool:
        """Whether a cache has a per-CPU slab (struct kmem_cache_cpu's lockless freelist).
        Every SLUB until v7.0, whose sheaves series (slab/for-7.0/sheaves) gave every cache
        sheaves and removed the per-CPU slab and per-CPU partial list: mm/slub.c of 7.2.13
        has no struct kmem_cache_cpu.  v6.18's opt-in caches keep theirs beside the sheaves."""
        return self.sheaves in CPU_SLAB_SHEAF_MODES

    @property
    def label(self) -> str:
        return self.name


_CPU_PARTIAL_V3 = (2, 6, 13, 30)
_CPU_PARTIAL_V516 = (6, 24, 52, 120)
_SHEAF_BASE = (4, 12, 26, 60)


def _profile(name: str, version: tuple[int, int], **kw) -> KernelProfile:
    base = dict(
        name=name,
        version=version,
        nr_cpus_rule="present_else_possible",
        order_loop="decrement",
        fractions=(16, 8, 4),
        cap_min_objects=True,
        cap_at_least_one=False,
        max_objs_per_slab=32767,
        min_partial_divisor=2,
        min_partial_lo=5,
        min_partial_hi=10,
        cpu_partial_objects=_CPU_PARTIAL_V516,
        sheaves="none",
        sheaf_base_capacity=_SHEAF_BASE,
        sheaves_on_kmalloc=False,
        barns="none",
        remote_free_bypasses_sheaf=False,
        memoryless_cpus_use_sheaves=False,
        memoryless_fallback=True,
        boot_param_prefixes=("slub",),
    )
    base.update(kw)
    return KernelProfile(**base)


PROFILES: dict[str, KernelProfile] = {
    p.name: p
    for p in (
        _profile(
            "v2.6.27", (2, 6),
            nr_cpus_rule="possible", order_loop="halve", cap_min_objects=False,
            max_objs_per_slab=65535, min_partial_divisor=1, min_partial_lo=5,
            min_partial_hi=5, cpu_partial_objects=None,
        ),
        _profile(
            "v3.1", (3, 1),
            nr_cpus_rule="possible", min_partial_divisor=1, cpu_partial_objects=None,
        ),
        _profile("v5.10", (5, 10), nr_cpus_rule="possible", cpu_partial_objects=_CPU_PARTIAL_V3),
        _profile(
            "v5.11", (5, 11), nr_cpus_rule="online_at_boot", cpu_partial_objects=_CPU_PARTIAL_V3
        ),
        _profile("v6.1", (6, 1)),
        _profile(
            "v6.18", (6, 18),
            order_loop="single_pass", fractions=(16, 8, 4, 2), cap_at_least_one=True,
            sheaves="opt_in", barns="memory_nodes", remote_free_bypasses_sheaf=True,
            boot_param_prefixes=("slub", "slab"),
        ),
        _profile(
            "v7.0", (7, 0),
            order_loop="single_pass", fractions=(16, 8, 4, 2), cap_at_least_one=True,
            cpu_partial_objects=None, sheaves="all", sheaves_on_kmalloc=True,
            barns="memory_nodes", remote_free_bypasses_sheaf=True,
            boot_param_prefixes=("slub", "slab"),
        ),
        _profile(
            "v7.1", (7, 1),
            order_loop="single_pass", fractions=(16, 8, 4, 2), cap_at_least_one=True,
            cpu_partial_objects=None, sheaves="all", sheaves_on_kmalloc=True,
            barns="all_nodes", remote_free_bypasses_sheaf=True, memoryless_cpus_use_sheaves=True,
            boot_param_prefixes=("slub", "slab"),
        ),
    )
}


class UnknownProfileError(ValueError):
    """Raised for a profile name that is not in :data:`PROFILES`."""


def get_profile(name: str) -> KernelProfile:
    """Return the profile called ``name`` (``6.1`` and ``v6.1`` both work)."""
    key = name if name.startswith("v") else f"v{name}"
    try:
        return PROFILES[key]
    except KeyError:
        if name in SLAB_PROFILES:
            raise UnknownProfileError(
                f"kernel profile {name!r} is a SLAB profile: simulate, sweep, tune, "
                f"validate, reproduce and kernel check take SLAB profiles, this input only "
                f"SLUB ones (SLUB profiles: {', '.join(PROFILES)})") from None
        known = ", ".join(PROFILES)
        raise UnknownProfileError(f"unknown kernel profile {name!r} (known: {known}; SLAB: "
                                  f"{', '.join(SLAB_PROFILES)})") from None


# --------------------------------------------------------------------------- SLAB

#: Where a SLAB slab keeps its management data: a struct slab plus one kmem_bufctl_t per
#: object (up to v3.14), or one freelist_idx_t per object (v3.15 on; the freelist moves
#: into a free object or off slab when that packs better, v4.6 on).
SlabLayoutRule = Literal["slab_mgmt", "freelist_idx"]


@dataclasses.dataclass(frozen=True)
class SlabProfile:
    """The rules of one SLAB era (mm/slab.c, CONFIG_SLAB, gone in v6.8), as data.

    SLAB is a different allocator, not a SLUB era, so its profiles are their own type and
    registry (:data:`SLAB_PROFILES`); :func:`get_any_profile` finds either kind.  The rule
    functions that read these fields are in :mod:`slabtune.model.slab`, whose docstring
    names the source read for each.
    """

    name: str
    version: tuple[int, int]
    layout: SlabLayoutRule
    #: sizeof(struct slab) at the head of an on-slab slab (slab_mgmt: 48 on 64-bit); 0 in
    #: freelist_idx kernels, whose slabs carry only the index array.
    mgmt_header_bytes: int
    #: Bytes of the per-object freelist entry: kmem_bufctl_t (4) or freelist_idx_t (1).
    freelist_entry_bytes: int
    #: Most objects a slab may hold: SLAB_LIMIT (~0U - 3) or SLAB_OBJ_MAX_NUM (255).
    max_objs_per_slab: int
    #: slab_mgmt only: objects of at least this size try off-slab management (PAGE_SIZE >> 3).
    off_slab_min_size: int
    #: SLAB boot parameters the kernel accepts and slabtune may set: slab_max_order= from
    #: v3.4 ("slab: introduce slab_max_order kernel parameter"); none before.
    boot_params: tuple[str, ...]
    #: Whether a CPU on a memoryless node keeps objects of its nearest memory node in its
    #: per-CPU array (numa_mem_id(), "numa: slab: use numa_mem_id() for slab local memory
    #: node", v2.6.35); before, the arrays only held numa_node_id()'s objects and such a
    #: CPU's fast path never hit.
    memoryless_fallback: bool
    allocator: Literal["slab"] = "slab"

    @property
    def label(self) -> str:
        return self.name


_SLAB_MGMT = dict(layout="slab_mgmt", mgmt_header_bytes=48, freelist_entry_bytes=4,
                  max_objs_per_slab=(1 << 32) - 4, off_slab_min_size=PAGE_SIZE >> 3)

#: The SLAB profiles, by name (the names say "slab-" so they never collide with SLUB's).
SLAB_PROFILES: dict[str, SlabProfile] = {
    p.name: p
    for p in (
        SlabProfile("slab-v2.6.33", (2, 6), boot_params=(), memoryless_fallback=False,
                    **_SLAB_MGMT),
        SlabProfile("slab-v3.1", (3, 1), boot_params=(), memoryless_fallback=True,
                    **_SLAB_MGMT),
        SlabProfile("slab-v6.1", (6, 1), layout="freelist_idx", mgmt_header_bytes=0,
                    freelist_entry_bytes=1, max_objs_per_slab=255, off_slab_min_size=0,
                    boot_params=("slab_max_order",), memoryless_fallback=True),
    )
}


def get_any_profile(name: str) -> KernelProfile | SlabProfile:
    """A SLAB profile by its exact name (``slab-v6.1``), else :func:`get_profile`."""
    if name in SLAB_PROFILES:
        return SLAB_PROFILES[name]
    return get_profile(name)


def is_slab(profile: object) -> bool:
    """Whether a profile is a SLAB one (:class:`SlabProfile`)."""
    return getattr(profile, "allocator", "slub") == "slab"


_RELEASE = re.compile(r"^\s*(\d+)\.(\d+)")


def release_version(release: str | None) -> tuple[int, int] | None:
    """(major, minor) of a kernel release string (``6.1.0-27-amd64`` -> (6, 1)); None when
    it does not start with a version."""
    m = _RELEASE.match(release or "")
    return (int(m.group(1)), int(m.group(2))) if m else None


def detect_profile(release: str) -> KernelProfile:
    """Pick the profile whose era covers a kernel release string such as ``6.1.0-27-amd64``.

    The newest profile whose version is <= the release wins, so 6.12 maps to v6.1's rules
    (the order loop changed in v6.8, which the nearest profile below 6.12, v6.1, does not
    have: see :func:`era_overrides`).
    """
    ver = release_version(release)
    if ver is None:
        raise UnknownProfileError(f"cannot read a kernel version from release {release!r}")
    best: KernelProfile | None = None
    for p in sorted(PROFILES.values(), key=lambda p: p.version):
        if p.version <= ver:
            best = p
    if best is None:
        raise UnknownProfileError(f"kernel release {release!r} is older than every profile")
    return era_overrides(best, ver)


def era_overrides(profile: KernelProfile, ver: tuple[int, int]) -> KernelProfile:
    """Adjust a profile to a release between two profiles where a rule changed in between.

    v6.8 replaced the min_objects loop with a single pass over fractions 16..2 and added the
    ``slab_*`` boot parameter spellings; a 6.8..6.17 kernel keeps v6.1's other rules.
    """
    if profile.order_loop != "single_pass" and ver >= (6, 8):
        return dataclasses.replace(
            profile,
            name=f"v{ver[0]}.{ver[1]}",
            version=ver,
            order_loop="single_pass",
            fractions=(16, 8, 4, 2),
            cap_at_least_one=True,
            boot_param_prefixes=("slub", "slab"),
        )
    return profile

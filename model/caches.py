"""Slab caches by name: the kmalloc size classes and a few named caches, as data.

A cache enters the model as its object *stride* (``slab_size`` in ``/sys/kernel/slab``: the
object size rounded up to its alignment plus any metadata), which is what
``calculate_order`` divides slabs by.  Two more facts matter to the policy formulas:

* ``early``: whether the cache is created in ``start_kernel`` before the secondary CPUs are
  brought up (``smp_init``).  Under the v5.11 rule (``num_online_cpus()``, seed
  slub-order-nr-cpus-2021) such caches size their slabs for one CPU.  kmalloc caches
  (``create_kmalloc_caches`` in ``kmem_cache_init``), the VFS caches (``vfs_caches_init``),
  ``vm_area_struct`` (``proc_caches_init``) and ``maple_node`` (``maple_tree_init``) are early;
  ``skbuff_head_cache`` (``sock_init``, a core initcall) and the bio caches (block layer
  initcalls) are created after SMP bring-up.
* ``explicit_sheaf``: the sheaf capacity a cache's creator asks for in
  ``kmem_cache_args.sheaf_capacity``: 32 for ``maple_node`` (``maple_tree_init``,
  lib/maple_tree.c) and ``vm_area_struct`` (``vma_state_init``, mm/vma_init.c of 7.2.13),
  from v6.18 on.  Opt-in sheaves (v6.18) take it as is; from v7.0 the capacity is
  max(default, request), so maple_node (stride 256, default 28) has 32 and
  vm_area_struct (stride 192, default 60) keeps 60.  ``kernel check`` predicts these
  caches with their requests.

Strides below were read from ``/sys/kernel/slab/*/slab_size`` of an x86-64 v6.18 host
without debugging options; they differ by configuration (e.g. with ``slub_debug``).
"""

from __future__ import annotations

import dataclasses
import re


@dataclasses.dataclass(frozen=True)
class CacheInfo:
    """One slab cache: its name, object size, stride and creation-time facts."""

    name: str
    object_size: int
    size: int
    is_kmalloc: bool = False
    early: bool = True
    explicit_sheaf: int = 0
    is_bootstrap: bool = False


#: kmalloc size classes (``kmalloc_info[]``): 8..8k, with the two odd classes 96 and 192.
KMALLOC_SIZES: tuple[int, ...] = (8, 16, 32, 64, 96, 128, 192, 256, 512, 1024, 2048, 4096, 8192)


def kmalloc_name(size: int) -> str:
    """The kernel's name for a kmalloc class: kmalloc-1k for 1024, kmalloc-8 for 8."""
    if size >= 1024 and size % 1024 == 0:
        return f"kmalloc-{size // 1024}k"
    return f"kmalloc-{size}"


def _kmalloc_caches() -> dict[str, CacheInfo]:
    out = {}
    for s in KMALLOC_SIZES:
        out[kmalloc_name(s)] = CacheInfo(kmalloc_name(s), s, s, is_kmalloc=True, early=True)
    return out


_NAMED = (
    # name, object_size, slab_size (stride), early, explicit sheaf capacity
    CacheInfo("maple_node", 256, 256, early=True, explicit_sheaf=32),
    CacheInfo("vm_area_struct", 192, 192, early=True, explicit_sheaf=32),
    CacheInfo("skbuff_head_cache", 224, 256, early=False),
    CacheInfo("skbuff_fclone_cache", 512, 512, early=False),
    CacheInfo("bio-248", 248, 256, early=False),
    CacheInfo("bio-448", 448, 512, early=False),
    CacheInfo("names_cache", 4096, 4096, early=True),
    CacheInfo("dentry", 192, 192, early=True),
    CacheInfo("filp", 184, 192, early=True),
    CacheInfo("inode_cache", 616, 624, early=True),
    CacheInfo("radix_tree_node", 576, 584, early=True),
    CacheInfo("buffer_head", 104, 104, early=True),
    CacheInfo("anon_vma", 96, 104, early=True),
    CacheInfo("task_struct", 5840, 5888, early=True),
    CacheInfo("mm_struct", 1568, 1600, early=True),
    CacheInfo("TCP", 2304, 2368, early=False),
    CacheInfo("kmem_cache", 232, 256, early=True, is_bootstrap=True),
    CacheInfo("kmem_cache_node", 72, 128, early=True, is_bootstrap=True),
)

#: Every cache known by name.
CACHES: dict[str, CacheInfo] = {**_kmalloc_caches(), **{c.name: c for c in _NAMED}}

_KMALLOC_RE = re.compile(r"^kmalloc-(\d+)(k?)$")


class UnknownCacheError(ValueError):
    """A cache name that is neither a kmalloc class nor in :data:`CACHES`."""


def get_cache(name: str) -> CacheInfo:
    """Look a cache up by name; ``kmalloc-1024`` is accepted for ``kmalloc-1k``."""
    if name in CACHES:
        return CACHES[name]
    m = _KMALLOC_RE.match(name)
    if m:
        size = int(m.group(1)) * (1024 if m.group(2) else 1)
        if size in KMALLOC_SIZES:
            return CACHES[kmalloc_name(size)]
    known = ", ".join(CACHES)
    raise UnknownCacheError(f"cache.name: unknown cache {name!r} (known: {known})")


def anonymous_cache(size: int) -> CacheInfo:
    """A cache given only by its stride (``[cache] size = N``): not kmalloc, created late."""
    if not isinstance(size, int) or isinstance(size, bool) or not 8 <= size <= 2 * 1024 * 1024:
        raise UnknownCacheError(f"cache.size: {size!r} must be an integer in 8..2097152 bytes")
    return CacheInfo(f"size-{size}", size, size, is_kmalloc=False, early=False)

"""SLUB cache merging: which caches share one ``struct kmem_cache``, with and without
``slub_nomerge``.

A new cache is *aliased* to an existing one (``__kmem_cache_alias()``, mm/slab_common.c of
6.1, 6.12 and 7.2) when ``find_mergeable()`` finds one: it then has no slabs, per-CPU
slabs or sheaves, partial lists or list_lock of its own; its objects live in the existing
cache's.  The rule, as those three versions write it:

* nothing merges under ``slab_nomerge`` (boot parameters ``slab_nomerge`` / ``slub_nomerge``,
  undone by ``slab_merge`` / ``slub_merge``; default ``!CONFIG_SLAB_MERGE_DEFAULT``, which
  is y);
* the new cache is not merged if it has a constructor, a usercopy region (``usersize``,
  counted only with CONFIG_HARDENED_USERCOPY from v6.12; always in 6.1) or a SLAB_NEVER_MERGE
  flag (debug flags, SLAB_TYPESAFE_BY_RCU, SLAB_NO_MERGE, ...);
* an existing cache is skipped when ``slab_unmergeable()``: the same conditions, or a
  negative refcount (kmem_cache and kmem_cache_node, made during bootstrap by
  ``create_boot_cache()``);
* of the rest, the most recently created (``list_for_each_entry_reverse``) whose
  SLAB_MERGE_SAME flags (RECLAIM_ACCOUNT, CACHE_DMA, CACHE_DMA32, ACCOUNT) equal the new
  cache's, whose ``s->size`` is at least the new size rounded to a word and to its
  alignment (``calculate_alignment()``), is a multiple of that alignment, and is less than
  a word larger, is taken.

Sizes are word multiples, so the last two conditions leave only ``s->size`` equal to the
new aligned size: the caches one merged cache holds are exactly the mergeable caches of one
(flags, aligned size), the first created giving its kmem_cache.  :func:`find_mergeable`
still states the kernel's conditions; :func:`merge_roots` applies them in creation order.

Kernel-config and version facts that decide mergeability beyond sysfs
(:class:`MergeConfig`): CONFIG_HARDENED_USERCOPY (kmalloc caches carry ``usersize`` = their
size, so with it no kmalloc cache merges), CONFIG_MEMCG (SLAB_ACCOUNT exists; from v7.x
``new_kmalloc_cache()`` also gives KMALLOC_NORMAL caches SLAB_NO_MERGE), and from v6.18 a
cache created with ``kmem_cache_args.sheaf_capacity`` gets SLAB_NO_MERGE
(``__kmem_cache_create_args()``).  The per-cache facts (ctor, usersize, flags, align,
size) come from a capture of a live ``/sys/kernel/slab`` (:mod:`slabtune.kernel.slab_aliases`,
``slab_merge_facts.csv``: an x86-64 6.18.44 host with MEMCG, HARDENED_USERCOPY and ZONE_DMA
on) or from a snapshot.  Pure Python, no JAX.
"""

from __future__ import annotations

import csv
import dataclasses
import functools
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

#: sizeof(void *) on x86-64: sizes are rounded to it, and a merge target may be at most
#: this much minus one larger.
WORD = 8
#: create_unique_id()'s letters for the SLAB_MERGE_SAME flags (mm/slub.c).
MERGE_SAME_LETTERS = "dDaA"
#: First version whose new_kmalloc_cache() sets SLAB_NO_MERGE on KMALLOC_NORMAL caches under
#: CONFIG_MEMCG (present in 7.2.13's mm/slab_common.c, absent from 6.12.117's).
KMALLOC_MEMCG_NO_MERGE = (7, 0)
#: First version with kmem_cache_args.sheaf_capacity (sheaves, v6.18); such a cache is
#: SLAB_NO_MERGE.
SHEAF_NO_MERGE = (6, 18)
#: Caches SLUB creates with create_boot_cache() and a refcount of -1: never merge targets,
#: and never merged (they are made before any other cache).
BOOTSTRAP_CACHES = ("kmem_cache", "kmem_cache_node")
#: Creators that pass SLAB_NO_MERGE themselves, by the first version taken to have it:
#: skb_init() (net/core/skbuff.c) gives skbuff_head_cache FLAG_SKB_NO_MERGE (SLAB_NO_MERGE
#: unless CONFIG_SLUB_TINY) in the 6.12.117 and 7.2.13 trees, not in 6.1.192's; key_init()
#: (security/keys/key.c) gives key_jar SLAB_NO_MERGE in 7.2.13, not in 6.12.117, and the
#: 6.18 capture has it merged.  The first version in between is not pinned down: the one
#: after the last tree seen without it is used.
NO_MERGE_CREATORS: dict[str, tuple[int, int]] = {"skbuff_head_cache": (6, 12),
                                                 "key_jar": (6, 19)}
#: kmem_buckets_create() (mm/slab_common.c, v6.11 on) makes SLAB_NO_MERGE caches named
#: "<prefix>-<kmalloc size>" for these callers (mm/util.c, ipc/msgutil.c), and
#: kmem_buckets_cache itself ("kmalloc_buckets", SLAB_NO_MERGE).
BUCKET_PREFIXES = ("memdup_user-", "msg_msg-")
BUCKETS_CACHE = "kmalloc_buckets"
#: Caches whose creator passes a sheaf capacity (lib/maple_tree.c maple_tree_init(),
#: mm/vma_init.c vma_state_init(), v6.18 on).
SHEAF_CACHES = ("maple_node", "vm_area_struct")

FACTS_FILE = Path(__file__).with_name("slab_merge_facts.csv")
_UNIQUE_RE = re.compile(r"^:([dDaAF]*)-?(\d{7})$")
_KMALLOC_RE = re.compile(r"^(?:(dma|cg|rcl)-)?kmalloc-(?:(dma|cg|rcl)-)?(\d+k?)$")


@dataclasses.dataclass(frozen=True)
class MergeConfig:
    """What the kernel's configuration adds to the per-cache facts."""

    hardened_usercopy: bool = True
    memcg: bool = True
    version: tuple[int, int] = (6, 18)


#: A distribution kernel (Debian's cloud and generic kernels, the 6.18 host).
DISTRO = MergeConfig(True, True)
#: The lab's own builds (kernel/configs: no MEMCG, no HARDENED_USERCOPY).
LAB = MergeConfig(False, False, (7, 2))


@dataclasses.dataclass(frozen=True)
class CacheMergeFacts:
    """What find_mergeable() reads of one cache, as created (before any merge).

    ``size``: the object size rounded to a word and to the cache's alignment (``s->size``
    of a mergeable cache, which has no metadata outside the object); ``flags``: its
    SLAB_MERGE_SAME letters; ``never``: a constructor, SLAB_NEVER_MERGE flags, a bootstrap
    refcount or a sheaf request (never merged, whatever the config); ``usersize``: its
    usercopy region."""

    name: str
    size: int
    flags: str = ""
    never: bool = False
    usersize: int = 0
    align: int = WORD


def aligned_size(size: int, align: int) -> int:
    """find_mergeable(): ``ALIGN(ALIGN(size, sizeof(void *)), align)``."""
    size = -(-size // WORD) * WORD
    return -(-size // align) * align


def unmergeable(c: CacheMergeFacts, config: MergeConfig, nomerge: bool) -> bool:
    """slab_unmergeable() / slab_args_unmergeable() (mm/slab_common.c 6.12, 7.2): nomerge,
    SLAB_NEVER_MERGE / ctor / bootstrap (``never``), or a usercopy region under
    CONFIG_HARDENED_USERCOPY."""
    return nomerge or c.never or (config.hardened_usercopy and c.usersize > 0)


def find_mergeable(new: CacheMergeFacts, existing: Sequence[CacheMergeFacts],
                   config: MergeConfig, nomerge: bool) -> int | None:
    """find_mergeable(): the index in ``existing`` (creation order) of the cache ``new``
    is aliased to, or None.  The newest candidate wins (list_for_each_entry_reverse)."""
    if unmergeable(new, config, nomerge):
        return None
    size = aligned_size(new.size, new.align)
    for i in range(len(existing) - 1, -1, -1):
        s = existing[i]
        if unmergeable(s, config, nomerge):
            continue
        if size > s.size or s.flags != new.flags:
            continue
        if s.size % new.align or s.size - size >= WORD:
            continue
        return i
    return None


def merge_roots(caches: Sequence[CacheMergeFacts], config: MergeConfig,
                nomerge: bool) -> dict[str, str]:
    """Each cache's kmem_cache owner, creating ``caches`` in order: ``__kmem_cache_alias()``
    hits join the cache found; misses create a cache of their own (``create_cache()``)."""
    created: list[CacheMergeFacts] = []
    root: dict[str, str] = {}
    for c in caches:
        i = find_mergeable(c, created, config, nomerge)
        if i is None:
            created.append(dataclasses.replace(c, size=aligned_size(c.size, c.align)))
            root[c.name] = c.name
        else:
            root[c.name] = created[i].name
    return root


def groups(roots: Mapping[str, str]) -> dict[str, tuple[str, ...]]:
    """The names each kmem_cache holds, by owner, in the order given."""
    out: dict[str, list[str]] = {}
    for name, r in roots.items():
        out.setdefault(r, []).append(name)
    return {r: tuple(v) for r, v in out.items()}


# --------------------------------------------------------------------------- facts


def parse_unique_id(name: str) -> tuple[str, int] | None:
    """create_unique_id()'s ``:<flags>-<size>`` as (flags, size), or None for a cache's own
    name."""
    m = _UNIQUE_RE.match(name)
    return (m.group(1), int(m.group(2))) if m else None


def kmalloc_kind(name: str) -> str | None:
    """'' for a KMALLOC_NORMAL cache name (kmalloc-64), 'rcl'/'cg'/'dma' for the typed ones
    (kmalloc-rcl-64, kmalloc-cg-64, dma-kmalloc-64), None otherwise."""
    m = _KMALLOC_RE.match(name)
    if not m:
        return None
    return m.group(1) or m.group(2) or ""


def source_never(name: str, config: MergeConfig) -> bool:
    """Unmergeability sysfs does not show: bootstrap caches (refcount -1), a sheaf request
    from v6.18, SLAB_NO_MERGE creators (:data:`NO_MERGE_CREATORS`), the caches of
    kmem_buckets_create(), KMALLOC_NORMAL caches under CONFIG_MEMCG from v7.0."""
    if name in BOOTSTRAP_CACHES:
        return True
    if name in SHEAF_CACHES and config.version >= SHEAF_NO_MERGE:
        return True
    if name in NO_MERGE_CREATORS and config.version >= NO_MERGE_CREATORS[name]:
        return True
    if name == BUCKETS_CACHE or name.startswith(BUCKET_PREFIXES):
        return True
    return (config.memcg and config.version >= KMALLOC_MEMCG_NO_MERGE
            and kmalloc_kind(name) == "")


def facts_from_row(row: Mapping[str, object], config: MergeConfig,
                   size: int | None = None) -> CacheMergeFacts:
    """A cache's merge facts from a :mod:`slabtune.kernel.slab_aliases` row.

    A row whose ``target`` is a unique id is a mergeable name: no ctor, no SLAB_NEVER_MERGE
    flag, no usercopy region (or the kernel would have kept it apart), its flags the id's,
    its aligned size the target's ``s->size``.  A cache with its own directory reads its
    files: ctor, destroy_by_rcu, the debug flags, usersize, reclaim_account/cache_dma
    (SLAB_ACCOUNT is not shown: an own-named cache's is irrelevant, it is unmergeable or
    alone).  ``size`` replaces the object size (e.g. the model's stride).  Without
    CONFIG_MEMCG the 'A' letter is dropped (SLAB_ACCOUNT is 0)."""
    name = str(row["name"])
    uid = parse_unique_id(str(row["target"]))
    if uid is not None:
        flags, s = uid
        flags = flags.replace("F", "")
        if not config.memcg:
            flags = flags.replace("A", "")
        return CacheMergeFacts(name, size if size is not None else s, flags,
                               never=source_never(name, config))
    i = lambda k: int(row[k])  # noqa: E731
    never = (bool(i("ctor")) or bool(i("destroy_by_rcu"))
             or any(i(k) for k in ("sanity_checks", "red_zone", "poison", "store_user", "trace"))
             or source_never(name, config))
    flags = ("d" if i("cache_dma") else "") + ("a" if i("reclaim_account") else "")
    obj = size if size is not None else i("object_size")
    return CacheMergeFacts(name, obj, flags, never, i("usersize"), max(i("align"), WORD))


@functools.cache
def _captured_rows() -> dict[str, dict[str, str]]:
    with open(FACTS_FILE, newline="") as fh:
        return {r["name"]: r for r in csv.DictReader(fh)}


def captured_facts(names: Iterable[str], config: MergeConfig = DISTRO,
                   sizes: Mapping[str, int] | None = None) -> list[CacheMergeFacts | None]:
    """The committed capture's facts for each name (None where the capture has no such
    cache), with ``sizes`` replacing object sizes where given."""
    rows = _captured_rows()
    sizes = sizes or {}
    return [facts_from_row(rows[n], config, sizes.get(n)) if n in rows else None
            for n in names]

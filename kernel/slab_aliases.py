"""Read the cache-merging facts of a live kernel from ``/sys/kernel/slab``.

Every name under ``/sys/kernel/slab`` is either a real cache directory or a symlink.  SLUB
gives a cache that may be merged (``slab_unmergeable()`` false) a directory named by
``create_unique_id()`` (``:`` then one letter per SLAB_MERGE_SAME flag: ``d`` CACHE_DMA,
``D`` CACHE_DMA32, ``a`` RECLAIM_ACCOUNT, ``A`` ACCOUNT; ``F`` CONSISTENCY_CHECKS; then
``-`` if any letter, then ``s->size`` as 7 digits) and a symlink per name that reached it:
its creator's and every later ``__kmem_cache_alias()`` hit (``sysfs_slab_alias()``).  An
unmergeable cache's directory carries its own name (``sysfs_slab_add()``, mm/slub.c of
6.1, 6.12, 7.2).

:func:`read_merge_facts` returns one row per name with the facts ``slab_unmergeable()`` /
``find_mergeable()`` read that sysfs shows: ``ctor``, ``usersize``, ``destroy_by_rcu``,
the debug flags, ``align``, ``slab_size`` (``s->size``), ``reclaim_account``,
``cache_dma``.  A symlinked name shows its target's files, so its row holds the merged
cache's facts and ``target`` names that directory.  The model reads a committed capture
(``model/slab_merge_facts.csv``, :func:`write_facts`);
``python -m slabtune.kernel.slab_aliases model/slab_merge_facts.csv`` refreshes it.
"""

from __future__ import annotations

import csv
import os
from collections.abc import Sequence
from pathlib import Path

from slabtune.errors import SlabtuneError

#: Columns of a merge-facts capture, in order.
FACT_COLUMNS: tuple[str, ...] = (
    "name", "target", "object_size", "slab_size", "align", "ctor", "usersize",
    "destroy_by_rcu", "reclaim_account", "cache_dma", "hwcache_align", "sanity_checks",
    "red_zone", "poison", "store_user", "trace",
)
_INT_FILES = ("object_size", "slab_size", "align", "usersize", "destroy_by_rcu",
              "reclaim_account", "cache_dma", "hwcache_align", "sanity_checks", "red_zone",
              "poison", "store_user", "trace")


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError as err:
        raise SlabtuneError(f"{path}: cannot read: {err.strerror or err}") from None


def _cache_row(d: Path) -> dict[str, object]:
    row: dict[str, object] = {}
    for f in _INT_FILES:
        text = _read(d / f) if (d / f).exists() else "0"
        try:
            row[f] = int(text.split()[0]) if text else 0
        except ValueError:
            raise SlabtuneError(f"{d / f}: {text[:40]!r} is not a number") from None
    # ctor_show() prints "%pS" of s->ctor, or nothing without one
    row["ctor"] = 1 if _read(d / "ctor") else 0
    return row


def read_merge_facts(root: str | os.PathLike = "/") -> list[dict[str, object]]:
    """One row per name under ``root/sys/kernel/slab`` (:data:`FACT_COLUMNS`), sorted by
    name; ``target`` is the directory the name is (its own name for a directory)."""
    slab = Path(root) / "sys/kernel/slab"
    try:
        names = sorted(os.listdir(slab))
    except OSError as err:
        raise SlabtuneError(f"{slab}: cannot list: {err.strerror or err}") from None
    dirs: dict[str, dict[str, object]] = {}
    rows = []
    for name in names:
        p = slab / name
        target = os.path.basename(os.readlink(p)) if p.is_symlink() else name
        if target not in dirs:
            if not (slab / target).is_dir():
                continue          # destroyed while we read
            dirs[target] = _cache_row(slab / target)
        rows.append({"name": name, "target": target, **dirs[target]})
    if not rows:
        raise SlabtuneError(f"{slab}: no slab caches found")
    return rows


def write_facts(rows: Sequence[dict[str, object]], path: str | os.PathLike) -> None:
    """Write :func:`read_merge_facts` rows as CSV (:data:`FACT_COLUMNS`)."""
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=FACT_COLUMNS)
        w.writeheader()
        for r in rows:
            w.writerow({k: r[k] for k in FACT_COLUMNS})


if __name__ == "__main__":  # pragma: no cover - a capture helper
    import sys

    write_facts(read_merge_facts("/"), sys.argv[1])

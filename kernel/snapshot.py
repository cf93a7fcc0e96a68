"""The kernel snapshot format: one row per slab cache of one boot.

This is the contract ``slabtune kernel snapshot`` writes, ``slabtune kernel check`` reads,
and the guest validator produces from inside a qemu guest.  The first columns are fixed, in
this order; extra columns may follow.

Most snapshots come from SLUB (``/sys/kernel/slab``).  A kernel built with CONFIG_SLAB (the
allocator Linux had up to v6.7) has no sysfs tree; its snapshot is read from
``/proc/slabinfo`` (:func:`parse_slabinfo`) and says so in an ``allocator`` column ("slab",
followed by :data:`SLAB_COLUMNS`).  A snapshot without that column is a SLUB one.

A snapshot is CSV or parquet, chosen by the file's suffix.  Reading validates columns, types
and values and turns every problem into one :class:`~slabtune.errors.SlabtuneError` line that
names the file, the row (and cache) and the column.  This module never imports JAX.
"""

from __future__ import annotations

import csv
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import polars as pl

from slabtune.errors import SlabtuneError
from slabtune.results.safeio import DATA_LIMIT, check_input, write_atomic

#: Required columns, in order.  CPU and node columns hold kernel list syntax ("0-63", "0,2").
SNAPSHOT_COLUMNS: tuple[str, ...] = (
    "kernel_release",
    "cmdline",
    "cpus_possible",
    "cpus_present",
    "cpus_online",
    "nodes_with_memory",
    "nodes_with_cpu",
    "cache",
    "object_size",
    "slab_size",
    "order",
    "objs_per_slab",
    "min_partial",
    "cpu_partial",
    "sheaf_capacity",
)
#: Columns that identify one boot within a snapshot.
BOOT_COLUMNS: tuple[str, ...] = SNAPSHOT_COLUMNS[:7]
#: Required columns holding kernel list syntax.
LIST_COLUMNS: tuple[str, ...] = SNAPSHOT_COLUMNS[2:7]
#: Required integer columns; every one but sheaf_capacity must be filled in.
INT_COLUMNS: tuple[str, ...] = SNAPSHOT_COLUMNS[8:]
#: sheaf_capacity is empty (null) where the kernel has no such sysfs file (before v6.18).
NULLABLE_INT_COLUMNS: tuple[str, ...] = ("sheaf_capacity",)
#: SLAB_DEBUG flag files: a cache with any of them set has a layout and partial-list
#: behaviour the policy formulas do not model.
DEBUG_FLAG_COLUMNS: tuple[str, ...] = ("sanity_checks", "red_zone", "poison", "store_user", "trace")
#: Optional extra columns ``kernel snapshot`` writes after the required ones (all integers;
#: slabs/objects/total_objects/partial are the first number of their sysfs file, aliases the
#: number of /sys/kernel/slab symlinks naming this cache).
EXTRA_COLUMNS: tuple[str, ...] = DEBUG_FLAG_COLUMNS + (
    "slabs", "objects", "total_objects", "partial", "aliases")

#: Optional columns of a guest booted with a policy (``guest boot --policy``): the value
#: the policy wrote to the cache's sysfs ``min_partial`` / ``cpu_partial`` before the dump
#: (integers; empty where nothing was written).  ``kernel check`` compares the cache's
#: value with it instead of the model's default.
POLICY_COLUMNS: tuple[str, ...] = ("set_min_partial", "set_cpu_partial")

#: The allocators a snapshot can come from.  SLUB: /sys/kernel/slab, no ``allocator``
#: column.  SLAB (CONFIG_SLAB, up to v6.7): /proc/slabinfo, ``allocator`` "slab".
ALLOCATORS: tuple[str, ...] = ("slub", "slab")
#: Columns of a SLAB snapshot after EXTRA_COLUMNS: ``allocator`` ("slab"), then the
#: /proc/slabinfo numbers no SLUB column holds: the per-CPU array tunables ``limit``,
#: ``batchcount`` and ``sharedfactor`` (the node's shared array holds sharedfactor *
#: batchcount objects), ``active_slabs`` (slabs not entirely free) and ``shared_avail``
#: (objects sitting in the nodes' shared arrays).
SLAB_COLUMNS: tuple[str, ...] = ("allocator", "limit", "batchcount", "sharedfactor",
                                 "active_slabs", "shared_avail")
#: The integer columns of SLAB_COLUMNS.
SLAB_INT_COLUMNS: tuple[str, ...] = SLAB_COLUMNS[1:]
#: Required integer columns a SLAB snapshot leaves empty: /proc/slabinfo prints no
#: object_size (its ``objsize`` is the cache's ``size``, the stride SLUB calls slab_size),
#: and min_partial, cpu_partial and sheaf_capacity are SLUB's own.
SLAB_NULL_COLUMNS: tuple[str, ...] = ("object_size", "min_partial", "cpu_partial",
                                      "sheaf_capacity")

#: Lower bounds of the integer columns (object sizes must be positive; a slab holds >= 1).
_MINIMUM = {
    "object_size": 1, "slab_size": 1, "order": 0, "objs_per_slab": 1, "min_partial": 0,
    "cpu_partial": 0, "sheaf_capacity": 0,
}
#: Upper bounds of the integer columns: what any kernel can report.  A slab's order is a
#: page order (MAX_PAGE_ORDER is 10 on x86-64; no architecture allows more than 20); a slab
#: holds at most MAX_OBJS_PER_PAGE (32767) objects (15 bits of struct slab); sizes fit in a
#: slab of the largest order; the rest are counters the model holds as int32.
_INT32_MAX = (1 << 31) - 1
_MAXIMUM = {
    "object_size": 1 << 30, "slab_size": 1 << 30, "order": 20, "objs_per_slab": 32767,
    "min_partial": _INT32_MAX, "cpu_partial": _INT32_MAX, "sheaf_capacity": _INT32_MAX,
}
# SLAB's tunables and slab counts: non-negative (kernel ints and unsigned longs).
_MINIMUM.update(dict.fromkeys(SLAB_INT_COLUMNS, 0))
_MAXIMUM.update(dict.fromkeys(SLAB_INT_COLUMNS, (1 << 63) - 1))
_SUFFIXES = (".csv", ".parquet")


# --------------------------------------------------------------------------- kernel lists


_LIST_ITEM = re.compile(r"^(\d+)(?:-(\d+)(?::(\d+)/(\d+))?)?$")


def parse_cpulist(text: str | None) -> tuple[int, ...]:
    """Parse kernel list syntax ("0-3,8", "0-7:2/4", "") into sorted distinct ids.

    This is the format of ``/sys/devices/system/cpu/{possible,present,online}`` and the node
    masks, printed by ``%*pbl`` and read by ``bitmap_parselist()``: comma-separated single
    numbers and inclusive ranges ``a-b``, optionally ``a-b:used/group`` (the first ``used``
    of every ``group`` bits).  An empty string (or None) is the empty mask.  Raises
    ValueError naming the bad item.
    """
    if text is None:
        return ()
    text = text.strip()
    if not text:
        return ()
    ids: set[int] = set()
    for item in text.split(","):
        m = _LIST_ITEM.match(item.strip())
        if not m:
            raise ValueError(f"{item.strip()!r} is not kernel list syntax (want e.g. 0-3,8)")
        lo = int(m.group(1))
        hi = int(m.group(2)) if m.group(2) is not None else lo
        if hi < lo:
            raise ValueError(f"range {item.strip()!r} runs backwards")
        used = int(m.group(3)) if m.group(3) is not None else 1
        group = int(m.group(4)) if m.group(4) is not None else 1
        if group < 1 or used < 1 or used > group:
            raise ValueError(f"{item.strip()!r}: group syntax wants 1 <= used <= group")
        if hi - lo > 1 << 20:
            raise ValueError(f"range {item.strip()!r} is implausibly large")
        ids.update(i for i in range(lo, hi + 1) if (i - lo) % group < used)
    return tuple(sorted(ids))


def format_cpulist(ids: Iterable[int]) -> str:
    """Format ids in kernel list syntax, as ``%*pbl`` prints a mask: ``[0,1,2,3,8]`` ->
    ``"0-3,8"``, a lone id as itself, the empty mask as ``""``."""
    out: list[str] = []
    run: list[int] = []
    for i in sorted(set(int(x) for x in ids)):
        if i < 0:
            raise ValueError(f"negative id {i} in a kernel list")
        if run and i == run[-1] + 1:
            run.append(i)
            continue
        if run:
            out.append(_span(run))
        run = [i]
    if run:
        out.append(_span(run))
    return ",".join(out)


def _span(run: Sequence[int]) -> str:
    return str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}"


# --------------------------------------------------------------------------- frames


def snapshot_schema(extra: Sequence[str] = EXTRA_COLUMNS) -> dict[str, pl.DataType]:
    """The polars dtypes of a snapshot: strings for text and lists (and ``allocator``),
    Int64 for numbers."""
    schema: dict[str, pl.DataType] = {}
    for c in SNAPSHOT_COLUMNS:
        schema[c] = pl.Int64 if c in INT_COLUMNS else pl.String
    for c in extra:
        schema[c] = pl.String if c == "allocator" else pl.Int64
    return schema


def frame_from_rows(rows: Sequence[Mapping[str, object]],
                    extra: Sequence[str] = EXTRA_COLUMNS) -> pl.DataFrame:
    """Build a typed snapshot frame (required columns first, then ``extra``) from dicts;
    keys missing from a row become nulls."""
    schema = snapshot_schema(extra)
    data = {c: [r.get(c) for r in rows] for c in schema}
    return pl.DataFrame(data, schema=schema)


def _row_label(df: pl.DataFrame, i: int) -> str:
    cache = df["cache"][i] if "cache" in df.columns else None
    return f"row {i + 1}" + (f" (cache {cache})" if cache else "")


def validate_snapshot(df: pl.DataFrame, source: str = "snapshot") -> pl.DataFrame:
    """Check and type a snapshot frame; return it with the required columns first.

    String columns may arrive as strings (CSV) or typed (parquet); integer columns are parsed
    strictly.  Raises SlabtuneError naming ``source``, the row/cache and the column for: a
    missing column, no rows, an empty required value, a non-integer, a value below its
    minimum (a size of 0 or less), slab_size below object_size, a CPU/node column that is
    not kernel list syntax, or a cache listed twice in one boot.  Rows whose ``allocator``
    is "slab" may leave :data:`SLAB_NULL_COLUMNS` empty; an ``allocator`` other than slub
    or slab is refused.
    """
    missing = [c for c in SNAPSHOT_COLUMNS if c not in df.columns]
    if missing:
        raise SlabtuneError(f"{source}: missing column(s) {', '.join(missing)}")
    if df.height == 0:
        raise SlabtuneError(f"{source}: no rows")
    extras = [c for c in df.columns if c not in SNAPSHOT_COLUMNS]
    slab_rows = None
    if "allocator" in df.columns:
        alloc = df["allocator"].cast(pl.String).str.strip_chars()
        bad = ~alloc.is_in(list(ALLOCATORS)).fill_null(False)
        if bad.any():
            i = int(bad.arg_true()[0])
            raise SlabtuneError(f"{source}: {_row_label(df, i)}: column allocator: "
                                f"{alloc[i]!r} is not one of {', '.join(ALLOCATORS)}")
        slab_rows = alloc == "slab"
    cols = []
    for c in SNAPSHOT_COLUMNS:
        s = df[c]
        if c in INT_COLUMNS:
            s = _int_column(df, c, source)
            empty = s.is_null()
            if slab_rows is not None and c in SLAB_NULL_COLUMNS:
                empty = empty & ~slab_rows
            if c not in NULLABLE_INT_COLUMNS and empty.any():
                i = int(empty.arg_true()[0])
                raise SlabtuneError(f"{source}: {_row_label(df, i)}: column {c} is empty")
            _check_range(df, s, c, source)
        else:
            if s.dtype != pl.String:
                s = s.cast(pl.String)
            if c in ("cmdline",) + LIST_COLUMNS:
                s = s.fill_null("")
            elif s.null_count():
                i = int(s.is_null().arg_true()[0])
                raise SlabtuneError(f"{source}: {_row_label(df, i)}: column {c} is empty")
        cols.append(s.alias(c))
    for c in extras:
        s = df[c]
        if c == "allocator":
            s = s.cast(pl.String).str.strip_chars()
        elif s.dtype == pl.String or s.dtype.is_integer():
            if c in EXTRA_COLUMNS or c in SLAB_INT_COLUMNS or c in POLICY_COLUMNS:
                s = _int_column(df, c, source)
                if c in SLAB_INT_COLUMNS:
                    _check_range(df, s, c, source)
        cols.append(s.alias(c))
    out = pl.DataFrame(cols)
    small = (out["slab_size"] < out["object_size"])
    if small.any():
        i = int(small.arg_true()[0])
        raise SlabtuneError(
            f"{source}: {_row_label(out, i)}: slab_size {out['slab_size'][i]} is smaller than "
            f"object_size {out['object_size'][i]}")
    for c in LIST_COLUMNS:
        for text in out[c].unique(maintain_order=True).to_list():
            try:
                parse_cpulist(text)
            except ValueError as err:
                i = int((out[c] == text).arg_true()[0])
                raise SlabtuneError(f"{source}: {_row_label(out, i)}: column {c}: {err}") from None
    dup = out.select(list(BOOT_COLUMNS) + ["cache"]).is_duplicated()
    if dup.any():
        i = int(dup.arg_true()[0])
        raise SlabtuneError(
            f"{source}: {_row_label(out, i)}: cache {out['cache'][i]} appears twice in one boot "
            "(two dumps of the same boot belong in separate files)")
    return out


def _check_range(df: pl.DataFrame, s: pl.Series, c: str, source: str) -> None:
    """Fail on the first value of integer column ``c`` outside what a kernel can report
    (:data:`_MINIMUM`, :data:`_MAXIMUM`), naming the file, the row (and cache) and the
    column: bad input, not something for the model to mismatch."""
    low, high = _MINIMUM[c], _MAXIMUM[c]
    bad = ((s < low) | (s > high)).fill_null(False)
    if bad.any():
        i = int(bad.arg_true()[0])
        limit = f"must be >= {low}" if s[i] < low else \
            f"must be <= {high}, the most a kernel can report"
        raise SlabtuneError(f"{source}: {_row_label(df, i)}: {c} is {s[i]} ({limit})")


def _int_column(df: pl.DataFrame, c: str, source: str) -> pl.Series:
    s = df[c]
    if s.dtype.is_integer():
        return s.cast(pl.Int64)
    if s.dtype == pl.Null:
        return s.cast(pl.Int64)
    text = s.cast(pl.String).str.strip_chars()
    text = pl.select(pl.when(text == "").then(None).otherwise(text)).to_series()
    parsed = text.cast(pl.Int64, strict=False)
    bad = parsed.is_null() & text.is_not_null()
    if bad.any():
        i = int(bad.arg_true()[0])
        raise SlabtuneError(
            f"{source}: {_row_label(df, i)}: column {c}: {text[i]!r} is not an integer")
    return parsed


def _check_suffix(path: Path) -> str:
    suffix = path.suffix.lower()
    if suffix not in _SUFFIXES:
        raise SlabtuneError(
            f"{path}: unknown snapshot format {suffix or '(no suffix)'!r} (want .csv or .parquet)")
    return suffix


def read_snapshot(path: str | os.PathLike) -> pl.DataFrame:
    """Read and validate a CSV or parquet snapshot (see :func:`validate_snapshot`).

    An unreadable file or one polars cannot parse raises SlabtuneError naming the file.
    """
    path = Path(path)
    suffix = _check_suffix(path)
    if not path.exists():
        blocker = next((p for p in path.parents if p.exists() and not p.is_dir()), None)
        if blocker is not None:
            raise SlabtuneError(f"{path}: cannot read snapshot: {blocker} is a file, not a "
                                "directory")
        raise SlabtuneError(f"{path}: cannot read snapshot: no such file")
    if path.is_dir():
        raise SlabtuneError(f"{path}: cannot read snapshot: is a directory")
    check_input(path, DATA_LIMIT, "snapshot")   # a regular file, bounded: not a FIFO
    if suffix == ".csv":
        _check_csv_header(path)
    try:
        if suffix == ".csv":
            df = pl.read_csv(path, infer_schema=False, raise_if_empty=True)
        else:
            df = pl.read_parquet(path)
    except (pl.exceptions.PolarsError, OSError, ValueError) as err:
        first = (str(err).strip().splitlines() or [err.__class__.__name__])[0]
        raise SlabtuneError(f"{path}: malformed snapshot: {first}") from None
    return validate_snapshot(df, str(path))


def _check_csv_header(path: Path) -> None:
    """A CSV snapshot's header names every required column, and no row has more fields
    than the header: each problem is one line naming the file and the missing column or
    the row (instead of a parser's message about its schema)."""
    with open(path, encoding="utf-8", errors="replace", newline="") as fh:
        rows = csv.reader(fh)
        header = next(rows, None)
        if header is None:
            return   # empty: the parser says so
        missing = [c for c in SNAPSHOT_COLUMNS if c not in header]
        if missing:
            raise SlabtuneError(f"{path}: header: missing column(s) {', '.join(missing)} "
                                f"(the header has {len(header)} columns)")
        for i, row in enumerate(rows):
            if len(row) > len(header):
                raise SlabtuneError(f"{path}: row {i + 1}: {len(row)} fields but the header "
                                    f"names {len(header)} columns")


def write_snapshot(df: pl.DataFrame, path: str | os.PathLike) -> Path:
    """Validate ``df`` and write it to ``path`` (CSV or parquet by suffix), atomically:
    the file appears complete or not at all."""
    path = Path(path)
    suffix = _check_suffix(path)
    df = validate_snapshot(df, str(path))
    write_atomic(path, (lambda fh: df.write_csv(fh)) if suffix == ".csv"
                 else (lambda fh: df.write_parquet(fh)), "snapshot")
    return path


def boots(df: pl.DataFrame) -> list[pl.DataFrame]:
    """Split a validated snapshot into boots (rows equal in every BOOT_COLUMNS column), in
    order of first appearance, each keeping its rows' order."""
    keyed = df.with_row_index("_row")
    groups = keyed.group_by(list(BOOT_COLUMNS), maintain_order=True).agg(pl.col("_row"))
    return [df[sorted(idx)] for idx in groups["_row"].to_list()]


# --------------------------------------------------------------------------- /proc/slabinfo


#: The /proc/slabinfo formats :func:`parse_slabinfo` reads: version 2.1 (mm/slab_common.c
#: print_slabinfo_header(), unchanged since v2.6.x), and its CONFIG_DEBUG_SLAB variant
#: "2.1 (statistics)", whose lines carry two more groups (globalstat, cpustat) that are
#: skipped.
SLABINFO_VERSIONS: tuple[str, ...] = ("2.1", "2.1 (statistics)")
_SLABINFO_PREFIX = "slabinfo - version: "


def slabinfo_version(line: str) -> str:
    """The version a /proc/slabinfo first line names ("slabinfo - version: 2.1" -> "2.1");
    ValueError for any other line or version."""
    if not line.startswith(_SLABINFO_PREFIX):
        raise ValueError(f"not a /proc/slabinfo header: {line[:80]!r}")
    version = line[len(_SLABINFO_PREFIX):].strip()
    if version not in SLABINFO_VERSIONS:
        raise ValueError(f"/proc/slabinfo version {version!r} is not supported (want "
                         f"{' or '.join(repr(v) for v in SLABINFO_VERSIONS)})")
    return version


def parse_slabinfo_line(line: str) -> dict[str, object]:
    """One cache line of /proc/slabinfo as snapshot values (mm/slab_common.c cache_show()):

    ``name active_objs num_objs objsize objperslab pagesperslab : tunables limit batchcount
    sharedfactor : slabdata active_slabs num_slabs sharedavail [: globalstat ... : cpustat
    ...]`` gives cache, objects (active_objs: every object not free on a node list, so the
    ones in per-CPU and shared arrays count as in use, like SLUB's ``objects``),
    total_objects (num_objs = num_slabs * objperslab), slab_size (objsize is the cache's
    ``size``, the object stride: what SLUB's ``slab_size`` file shows), objs_per_slab,
    order (log2 of pagesperslab), slabs (num_slabs), the :data:`SLAB_INT_COLUMNS` and
    ``allocator`` "slab".  ValueError naming the cache for a malformed line."""
    f = line.split()
    if (len(f) < 16 or f[6:8] != [":", "tunables"] or f[11:13] != [":", "slabdata"]
            or (len(f) > 16 and f[16:18] != [":", "globalstat"])):
        raise ValueError(f"not a /proc/slabinfo cache line: {line.strip()[:120]!r}")
    try:
        nums = [int(x) for x in f[1:6] + f[8:11] + f[13:16]]
    except ValueError:
        raise ValueError(f"cache {f[0]}: a field is not an integer in "
                         f"{line.strip()[:120]!r}") from None
    active, num, objsize, per_slab, pages, limit, batch, shared, act_slabs, slabs, avail = nums
    if pages < 1 or pages & (pages - 1):
        raise ValueError(f"cache {f[0]}: pagesperslab {pages} is not a power of two")
    return {
        "cache": f[0], "slab_size": objsize, "order": pages.bit_length() - 1,
        "objs_per_slab": per_slab, "slabs": slabs, "objects": active, "total_objects": num,
        "allocator": "slab", "limit": limit, "batchcount": batch, "sharedfactor": shared,
        "active_slabs": act_slabs, "shared_avail": avail,
    }


def parse_slabinfo(text: str) -> list[dict[str, object]]:
    """Every cache of a /proc/slabinfo text, in its order (see :func:`parse_slabinfo_line`).
    The first non-empty line must name a supported version (:func:`slabinfo_version`);
    lines starting with ``#`` (the column legend) are skipped.  ValueError naming the line
    number for anything else."""
    rows: list[dict[str, object]] = []
    header = False
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            if not header:
                slabinfo_version(line)
                header = True
            elif not line.startswith("#"):
                rows.append(parse_slabinfo_line(line))
        except ValueError as err:
            raise ValueError(f"/proc/slabinfo line {n}: {err}") from None
    if not header:
        raise ValueError("/proc/slabinfo: empty")
    return rows


def slabinfo_frame(text: str, boot: Mapping[str, str]) -> pl.DataFrame:
    """A SLAB snapshot frame from a /proc/slabinfo text and the boot's identity (the
    :data:`BOOT_COLUMNS`): the required columns (SLAB_NULL_COLUMNS null), EXTRA_COLUMNS
    (flags, partial and aliases null: /proc/slabinfo has none), then SLAB_COLUMNS; sorted
    by cache name."""
    rows = [{**boot, **r} for r in parse_slabinfo(text)]
    rows.sort(key=lambda r: str(r["cache"]))
    return frame_from_rows(rows, extra=EXTRA_COLUMNS + SLAB_COLUMNS)


def allocator(df: pl.DataFrame) -> str:
    """The allocator a snapshot comes from: "slab" when any row's ``allocator`` is slab,
    else "slub" (a snapshot without the column is a SLUB one)."""
    if "allocator" in df.columns and (df["allocator"].cast(pl.String) == "slab").any():
        return "slab"
    return "slub"


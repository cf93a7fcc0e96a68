"""Lazy grid expansion: chunk ``i`` of a spec's grid, computed from mixed-radix indices.

The grid is the Cartesian product of the spec's axes in order (the last axis varies
fastest, like :func:`itertools.product`).  Row ``r`` of the full product has digit
``(r // stride_k) % len(axis_k)`` on axis ``k``; a chunk is the index range
``[i * chunk_size, (i + 1) * chunk_size)`` of the product, so no list of rows ever exists and
each chunk is a handful of vectorised numpy operations.  Excluded rows (the spec's
``[[exclude]]`` tables and impossible topologies) are masked, not skipped, so chunk ``i``
always covers the same product rows: that is what makes a chunk's result reproducible on a
retry or a resumed run.

Columns are numpy arrays: ints as int32, string axes as int32 codes into the axis values.
This module never imports JAX.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from slabtune.model.topology import MAX_CPUS
from slabtune.sweeps.spec import SweepSpec

_OPS = {
    "eq": np.equal, "ne": np.not_equal, "lt": np.less, "le": np.less_equal,
    "gt": np.greater, "ge": np.greater_equal,
}


class Chunk(NamedTuple):
    """One chunk of the grid.

    ``columns`` maps every axis (and every defaulted axis) to an array of ``padded`` rows;
    rows at and past ``n_product`` are padding (copies of the chunk's first row) and
    ``keep`` is False there and on excluded rows.
    """

    index: int
    start: int
    n_product: int
    columns: dict
    keep: np.ndarray


def n_chunks(spec: SweepSpec) -> int:
    """Chunks needed to cover the full product."""
    return max(1, math.ceil(spec.product / spec.chunk_size))


def bucket(n: int) -> int:
    """Compiled row count for chunks of ``n`` rows: the next power of two (at least 256).

    Every chunk of a sweep (the last one padded) and every sweep whose chunk size falls in
    the same bucket reuse one compiled evaluator.
    """
    return max(256, 1 << (max(n, 1) - 1).bit_length())


def _strides(spec: SweepSpec) -> list[int]:
    """Rows between two steps of each axis (the product of the lengths of the axes after it)."""
    out, s = [0] * len(spec.axes), 1
    for k in range(len(spec.axes) - 1, -1, -1):
        out[k] = s
        s *= len(spec.axes[k])
    return out


def _periodic(table: np.ndarray, stride: int, start: int, stop: int) -> np.ndarray:
    """``table[(r // stride) % len(table)]`` for rows ``start..stop-1``, built from runs.

    Over a contiguous range an axis holds each value for ``stride`` rows and then moves on,
    so the column is the (short) sequence of values met, each repeated for its run: no
    division or gather per row, which is what made grid expansion cost as much as the model
    on large chunks.
    """
    n = len(table)
    if stride == 1:      # the fastest axis: the table itself, rotated and tiled
        return np.resize(np.roll(table, -(start % n)), stop - start)
    first, last = start // stride, (stop - 1) // stride
    counts = np.full(last - first + 1, stride, np.int64)
    counts[0] -= start - first * stride
    counts[-1] -= (last + 1) * stride - stop
    return np.repeat(table[np.arange(first, last + 1) % n], counts)


def digits(spec: SweepSpec, start: int, stop: int) -> list[np.ndarray]:
    """Per-axis digit arrays (int64) of product rows ``start..stop-1``."""
    return [_periodic(np.arange(len(ax), dtype=np.int64), s, start, stop)
            for ax, s in zip(spec.axes, _strides(spec))]


def axis_columns(spec: SweepSpec, start: int, stop: int) -> dict[str, np.ndarray]:
    """Axis values of product rows ``start..stop-1``: int axes as int32 values, string axes
    as int32 codes (indices into the axis' values)."""
    cols = {}
    for ax, s in zip(spec.axes, _strides(spec)):
        table = (np.asarray(ax.values, dtype=np.int32) if ax.kind is int
                 else np.arange(len(ax), dtype=np.int32))
        cols[ax.name] = _periodic(table, s, start, stop)
    return cols


def excluded(spec: SweepSpec, cols: dict[str, np.ndarray]) -> np.ndarray:
    """Rows dropped by the spec's ``[[exclude]]`` tables or by impossible topologies."""
    n = len(next(iter(cols.values())))
    drop = np.zeros(n, bool)
    for ex in spec.exclude:
        hit = np.ones(n, bool)
        for name, op, operand in ex.tests:
            ax = spec.axis(name)
            col = cols[name]
            if op == "in":
                vals = [ax.values.index(v) if ax.kind is str else v for v in operand]
                hit &= np.isin(col, np.asarray(vals, np.int32))
            elif isinstance(operand, tuple) and operand[:1] == ("axis",):
                hit &= _OPS[op](col, cols[operand[1]])
            else:
                val = ax.values.index(operand) if ax.kind is str else operand
                hit &= _OPS[op](col, val)
        drop |= hit
    return drop | impossible_topology(cols)


def impossible_topology(cols: dict[str, np.ndarray]) -> np.ndarray:
    """Topologies no machine has: every node memoryless or more memoryless nodes than nodes,
    fewer possible than present CPUs, or more than MAX_CPUS CPUs."""
    n = len(next(iter(cols.values())))
    bad = np.zeros(n, bool)
    nodes = cols.get("nodes")
    if "memoryless_nodes" in cols:
        bad |= cols["memoryless_nodes"] >= (nodes if nodes is not None else 1)
    cpus = present_cpus(cols)
    if cpus is not None:
        bad |= cpus > MAX_CPUS
        if "possible" in cols:
            poss = cols["possible"]
            bad |= (poss != 0) & (poss < cpus)
    return bad


def present_cpus(cols: dict[str, np.ndarray]):
    """Present CPUs of each row: ``cpus``, or ``nodes * cpus_per_node``."""
    if "cpus" in cols:
        return cols["cpus"].astype(np.int64)
    if "cpus_per_node" in cols:
        return cols["cpus_per_node"].astype(np.int64) * cols["nodes"]
    return None


def chunk(spec: SweepSpec, i: int, padded: int | None = None) -> Chunk:
    """Chunk ``i``: axis columns plus defaults, padded to ``padded`` rows (default
    :func:`bucket` of the chunk size)."""
    total = spec.product
    nch = n_chunks(spec)
    if not 0 <= i < nch:
        raise IndexError(f"chunk {i} outside 0..{nch - 1}")
    start = i * spec.chunk_size
    stop = min(total, start + spec.chunk_size)
    n = stop - start
    padded = bucket(spec.chunk_size) if padded is None else padded
    cols = axis_columns(spec, start, stop)
    keep = ~excluded(spec, cols)
    if padded > n:
        pad = padded - n
        cols = {k: np.concatenate([v, np.repeat(v[:1], pad)]) for k, v in cols.items()}
        keep = np.concatenate([keep, np.zeros(pad, bool)])
    for name, value in spec.defaults:
        cols.setdefault(name, np.full(padded, value, np.int32))
    return Chunk(i, start, n, cols, keep)


def count_rows(spec: SweepSpec, block: int = 1 << 20) -> int:
    """Rows of the grid after exclusions (evaluates the masks block by block)."""
    if not spec.exclude and not _may_be_impossible(spec):
        return spec.product
    kept = 0
    for start in range(0, spec.product, block):
        stop = min(spec.product, start + block)
        kept += int((~excluded(spec, axis_columns(spec, start, stop))).sum())
    return kept


def first_kept_row(spec: SweepSpec, block: int = 1 << 20) -> int | None:
    """Index of the first product row that survives the exclusions and the topology check,
    or None when none does (a grid of impossible or excluded configurations only).  Stops at
    the first block that keeps a row, so a normal grid costs one block."""
    if not spec.exclude and not _may_be_impossible(spec):
        return 0 if spec.product else None
    for start in range(0, spec.product, block):
        stop = min(spec.product, start + block)
        kept = np.flatnonzero(~excluded(spec, axis_columns(spec, start, stop)))
        if kept.size:
            return start + int(kept[0])
    return None


def _may_be_impossible(spec: SweepSpec) -> bool:
    names = set(spec.axis_names)
    return bool(names & {"memoryless_nodes", "possible", "cpus_per_node"})

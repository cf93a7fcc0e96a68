"""A search space as a grid of integer indices, shared by the exhaustive front
(:mod:`slabtune.tuner.exhaustive`) and the population search (:mod:`slabtune.tuner.population`).

Every knob of a :class:`~slabtune.tuner.space.SearchSpace` takes finitely many values (its
``choices``, or ``low..high`` by ``step``), so a candidate is a vector of indices, one per
knob, and the whole space is the mixed-radix numbers below :attr:`Grid.size`.  Turning
indices into the knob values the model reads is array code (numpy or jnp), with the kernel's
boot-parameter semantics applied as :func:`slabtune.tuner.study.effective_params` applies
them to one trial, so a candidate drawn here and the same params told as an Optuna trial
evaluate to the same objectives.

A SLAB profile's grid lays out SLAB's knobs (``slab_max_order`` and the /proc/slabinfo
tunables, :data:`slabtune.tuner.space.SLAB_KNOBS`) and none of SLUB's boot-parameter rules;
its points whose tunables slabinfo_write() ignores (batchcount above limit) stay in the grid
and evaluate to NaN (a failed trial), as on the trial path.
"""

from __future__ import annotations

import dataclasses
import math

import jax.numpy as jnp
import numpy as np

from slabtune.model import bootparams, profiles, slab
from slabtune.tuner.space import SearchSpace, baseline_values


@dataclasses.dataclass(frozen=True)
class Grid:
    """The value tables of the searched knobs: knob ``i`` takes ``tables[i][:sizes[i]]``
    (rows padded with their last value)."""

    names: tuple[str, ...]
    tables: np.ndarray          # (K, L) int32
    sizes: np.ndarray           # (K,) int64
    baseline: dict[str, int]    # every knob's value in the unmodified kernel
    cross_adjust: bool          # setup_slub_min/max_order keep min <= max (v6.7 on)
    slab: bool = False          # a SLAB profile's knobs (no SLUB boot-parameter rules)

    @property
    def size(self) -> int:
        """Points in the space (a Python int: it can pass 2**63)."""
        return math.prod(int(s) for s in self.sizes)

    def describe(self) -> str:
        """``knob a 3 x knob b 5 ...``: the factors of :attr:`size`; on a SLAB grid that
        searches both limit and batchcount, also how many points the kernel ignores
        (:meth:`ignored_points`)."""
        text = " x ".join(f"{n} {int(s)}" for n, s in zip(self.names, self.sizes))
        ignored = self.ignored_points()
        if ignored:
            text += (f"; {ignored:,} with batchcount above limit, which slabinfo_write() "
                     "ignores")
        return text

    def ignored_points(self) -> int | None:
        """Points of a SLAB grid whose searched limit and batchcount slabinfo_write()
        ignores for every cache (:func:`slabtune.model.slab.tunables_accepted`),
        counted from the two knobs' tables; None unless both are searched (with one at
        each cache's default, which points the kernel ignores depends on the cache)."""
        if not self.slab or not {"limit", "batchcount"} <= set(self.names):
            return None
        col = {n: self.tables[i, :int(s)] for i, (n, s) in
               enumerate(zip(self.names, self.sizes))}
        pairs = slab.tunables_accepted(col["limit"][:, None], col["batchcount"][None, :], 0)
        rest = self.size // (len(col["limit"]) * len(col["batchcount"]))
        return int((~pairs).sum()) * rest

    def params(self, genome) -> dict[str, int]:
        """The Optuna params (searched knob -> value) of one index vector."""
        return {n: int(self.tables[i, int(g)]) for i, (n, g) in enumerate(zip(self.names, genome))}

    def genomes_of(self, index: np.ndarray) -> np.ndarray:
        """Index vectors (N, K) of flat point numbers (N,): mixed radix, last knob fastest."""
        index = np.asarray(index, np.int64)
        out = np.empty((len(index), len(self.names)), np.int32)
        for i in range(len(self.names) - 1, -1, -1):
            out[:, i] = index % self.sizes[i]
            index = index // self.sizes[i]
        return out

    def nearest(self, values: dict[str, int]) -> np.ndarray:
        """The index vector whose values are nearest to ``values`` knob by knob."""
        return np.array([int(np.argmin(np.abs(self.tables[i, :int(s)] - values[n])))
                         for i, (n, s) in enumerate(zip(self.names, self.sizes))], np.int32)


def grid_of(space: SearchSpace, names: tuple[str, ...] | None = None) -> Grid:
    """The grid of ``space``'s knobs (or of the named ones, in the space's order)."""
    knobs = [k for k in space.knobs if names is None or k.name in names]
    vals = [list(k.choices) if k.choices is not None else list(range(k.low, k.high + 1, k.step))
            for k in knobs]
    width = max(len(v) for v in vals)
    tables = np.array([v + [v[-1]] * (width - len(v)) for v in vals], np.int32)
    return Grid(names=tuple(k.name for k in knobs), tables=tables,
                sizes=np.array([len(v) for v in vals], np.int64),
                baseline=baseline_values(space.profile),
                cross_adjust=space.profile.version >= bootparams.MIN_MAX_CROSS_ADJUST,
                slab=profiles.is_slab(space.profile))


def knob_values(grid: Grid, genomes, xp=np) -> dict:
    """Every knob as a (N,) array for index vectors ``genomes`` (N, K): searched knobs from
    the grid, the rest at the baseline, then the boot parameters as the kernel applies them
    (:func:`slabtune.tuner.study.effective_params`: min_order, then max_order, each
    ``setup_slub_*`` call keeping min <= max from v6.7).  ``xp`` is numpy or jax.numpy.

    A SLAB grid's values are its knobs as they are: every ``slab_max_order`` it holds lies in
    0..MAX_ORDER - 1, all that slab_max_order_setup() (6.1 mm/slab.c) changes is outside it
    (it clamps to that range), and the tunables are written as /proc/slabinfo takes them
    (:func:`slabtune.tuner.study.effective_params` passes a SLAB trial's params alike)."""
    genomes = xp.asarray(genomes)
    n = genomes.shape[0]
    tables = xp.asarray(grid.tables)
    out = {name: xp.full((n,), v, xp.int32) for name, v in grid.baseline.items()}
    for i, name in enumerate(grid.names):
        out[name] = tables[i][genomes[:, i]]
    if grid.slab:
        return out
    lo = xp.full((n,), 0, xp.int32)
    hi = xp.full((n,), profiles.DEFAULT_MAX_ORDER, xp.int32)
    if "slub_min_order" in grid.names:
        lo = out["slub_min_order"]
        if grid.cross_adjust:
            hi = xp.maximum(hi, lo)
    if "slub_max_order" in grid.names:
        hi = xp.minimum(out["slub_max_order"], profiles.MAX_PAGE_ORDER)
        if grid.cross_adjust:
            lo = xp.minimum(lo, hi)
    out["slub_min_order"], out["slub_max_order"] = lo, hi
    return out


def jnp_knob_values(grid: Grid, genomes) -> dict:
    """:func:`knob_values` in jax.numpy (traceable)."""
    return knob_values(grid, genomes, jnp)


def evaluate_rows(evaluator, grid: Grid, genomes: np.ndarray, block: int | None = None):
    """The study evaluator's :class:`Evaluation` of index vectors, ``block`` rows per call
    (default the smallest batch bucket, compiled with the evaluator), the last block padded
    with copies of its first row, so no new batch shape is compiled."""
    from slabtune.tuner.objectives import MIN_BUCKET, Evaluation

    block = block or MIN_BUCKET
    parts = []
    for i in range(0, len(genomes), block):
        g = genomes[i:i + block]
        n = len(g)
        if n < block:
            g = np.concatenate([g, np.repeat(g[:1], block - n, 0)])
        ev = evaluator.evaluate_values(knob_values(grid, g))
        parts.append([None if x is None else x[:n] for x in ev])
    # a field a set does not compute (``notes``) is None in every block
    return Evaluation(*(None if parts[0][j] is None else np.concatenate([p[j] for p in parts])
                        for j in range(len(Evaluation._fields))))

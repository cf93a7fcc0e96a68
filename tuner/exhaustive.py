"""The exact Pareto front of a space small enough to enumerate (``slabtune tune --exhaustive``).

Every point of the space (or of a named subspace, the other knobs at their baseline) is
evaluated, a chunk of points per model call, and the front of the feasible points is kept
as it grows (:class:`~slabtune.tuner.front.RunningFront`).  After each chunk the points that
joined the front are added to the study as ordinary finished trials (the study's own
distributions, objectives, per-topology attr and regression constraint, so ``pareto``,
``plot``, ``export``, ``validate`` and optuna-dashboard read them unchanged), and the next
chunk's first point is kept in the study's user attrs.  A point that joins the front and is
later pushed off it stays a trial, so ``Study.best_trials`` at the end is exactly the front
of the whole space (one trial per objective vector: of equal points, the first in
enumeration order).  An interrupted run resumes at the chunk it was in; points already
stored are not added again.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

import numpy as np

from slabtune.errors import SlabtuneError
from slabtune.tuner import constraints
from slabtune.tuner import front as fronts
from slabtune.tuner import grid as grids

#: Largest space ``--exhaustive`` enumerates unless told otherwise, per objective set (about
#: a minute of model time on two cores: the structural set prices a policy in ~0.04 ms,
#: the dynamics set simulates one in ~16 ms).
MAX_POINTS = {"structural": 2_000_000, "dynamics": 4096}
#: Points per model call, per objective set.
CHUNK = {"structural": 8192, "dynamics": 256}
#: Study user attr: {knobs key: {"size": N, "next": first point not yet evaluated}}.
ATTR_STATE = "slabtune_exhaustive"
#: Trial user attrs: the enumerated subspace (knob names joined by ',') and the point number.
ATTR_SPACE = "slabtune_exhaustive_space"
ATTR_POINT = "slabtune_point"


def subspace(spec, knobs: str | None) -> tuple[str, ...]:
    """The knobs ``--knobs`` names (comma-separated; ``boot``: the spec's boot parameters),
    in the spec's order; all the spec's knobs when None (a SLAB spec's ``boot`` is its
    ``slab_max_order``)."""
    names = spec.space.names
    if knobs is None:
        return names
    want: list[str] = []
    for item in (x.strip() for x in knobs.split(",")):
        if item == "boot":
            want += [n for n in names if spec.space.reach_of(n) == "boot"]
        elif item in names:
            want.append(item)
        else:
            raise SlabtuneError(f"--knobs: {item!r} is not a knob of spec {spec.name} "
                                f"(its knobs: {', '.join(names)}; or 'boot')")
    if not want:
        raise SlabtuneError(f"--knobs: spec {spec.name} has no boot-parameter knobs")
    return tuple(n for n in names if n in want)


def plan(spec, knobs: tuple[str, ...], max_points: int | None = None) -> grids.Grid:
    """The grid to enumerate, or one SlabtuneError line naming the space and its size when
    it has more than ``max_points`` points (default :data:`MAX_POINTS` of the set)."""
    grid = grids.grid_of(spec.space, knobs)
    limit = max_points if max_points is not None else MAX_POINTS[spec.objectives.name]
    if grid.size > limit:
        where = spec.name if knobs == spec.space.names else f"{spec.name} [{','.join(knobs)}]"
        raise SlabtuneError(
            f"--exhaustive: space {where} has {grid.size:,} points ({grid.describe()}), over "
            f"the limit of {limit:,} (--max-points); enumerate a subspace with --knobs or "
            f"search it with --sampler population")
    return grid


@dataclasses.dataclass
class Result:
    points: int          # points in the space
    evaluated: int       # points evaluated by this call
    front: int           # trials on the study's front of this space at the end
    added: int           # trials this call added
    seconds: float
    done: bool


def run(runner, grid: grids.Grid, chunk: int | None = None, max_chunks: int | None = None,
        on_chunk: Callable[[int, np.ndarray], None] | None = None) -> Result:
    """Enumerate ``grid`` for ``runner``'s study, resuming where an earlier call stopped.
    ``max_chunks`` stops early (tests, benchmarks); ``on_chunk(points evaluated so far,
    front objectives (F, 2))`` is called after each chunk."""
    study = runner.study
    key = ",".join(grid.names)
    chunk = chunk or CHUNK[runner.spec.objectives.name]
    state = dict(study.user_attrs.get(ATTR_STATE, {}))
    mine = state.get(key, {"size": grid.size, "next": 0})
    if mine["size"] != grid.size:
        raise SlabtuneError(f"--exhaustive: study {study.study_name!r} enumerated space "
                            f"[{key}] with {mine['size']} points, now {grid.size}")
    running = fronts.RunningFront()
    stored: set[int] = set()
    old_obj, old_pts = [], []
    for t in study.get_trials(deepcopy=False):
        if t.user_attrs.get(ATTR_SPACE) != key:
            continue
        stored.add(int(t.user_attrs[ATTR_POINT]))
        if t.values is not None and constraints.feasible(t):
            old_obj.append(t.values)
            old_pts.append(int(t.user_attrs[ATTR_POINT]))
    if old_pts:   # in point order, so equal points resolve as in one uninterrupted run
        order = np.argsort(old_pts)
        running.add(np.array(old_obj)[order], np.array(old_pts)[order])
    t0 = time.perf_counter()
    start, n, added, evaluated, chunks = int(mine["next"]), grid.size, 0, 0, 0
    while start < n and (max_chunks is None or chunks < max_chunks):
        idx = np.arange(start, min(n, start + chunk), dtype=np.int64)
        genomes = grid.genomes_of(idx)
        ev = grids.evaluate_rows(runner.evaluator, grid, genomes, min(chunk, n))
        obj = np.stack([ev.memory, ev.time], 1)
        ok = np.isfinite(obj).all(1) & (runner.evaluator.regression_excess(ev) <= 0)
        joined = set(running.add(obj[ok], idx[ok]).tolist()) - stored
        rows = [i for i, p in enumerate(idx.tolist()) if p in joined]
        if rows:
            sub = type(ev)(*(x[rows] for x in ev))
            runner.record([grid.params(genomes[i]) for i in rows], sub,
                          [{ATTR_SPACE: key, ATTR_POINT: int(idx[i])} for i in rows])
            stored.update(int(idx[i]) for i in rows)
            added += len(rows)
        start += len(idx)
        evaluated += len(idx)
        chunks += 1
        state[key] = {"size": n, "next": start}
        study.set_user_attr(ATTR_STATE, state)
        if on_chunk is not None:
            on_chunk(start, running.obj)
    return Result(points=n, evaluated=evaluated, front=len(running.obj), added=added,
                  seconds=time.perf_counter() - t0, done=start >= n)


"""Vectorised population search (``slabtune tune --sampler population``): NSGA-II on arrays.

For spaces too large to enumerate.  A generation is a population of ``N`` index vectors
(:mod:`slabtune.tuner.grid`), kept sorted best first.  Each generation:

1. **variation**: ``N`` children, each from two parents picked by binary tournament (of two
   random members the one nearer the front of the sorted population), uniform crossover
   (probability 0.9), then per-knob mutation with probability 1/K: half of the mutations
   redraw the index uniformly, half move it by a few steps (a scale of 1/8 of the knob's
   range), clipped to the grid;
2. **evaluation** of all children in one model call;
3. **survival**: parents and children together are sorted by constrained domination (Deb:
   a feasible point beats an infeasible one, infeasible points go by their regression
   excess) into non-dominated fronts, each front by crowding distance (its neighbours'
   spread on both objectives, the ends first), and the first ``N`` survive.  With two
   objectives a front is peeled with one sort and a running minimum (see
   :mod:`slabtune.tuner.front`); points equal on both objectives fall to later fronts, so
   copies do not crowd out the spread;
4. an **archive** of the non-dominated feasible points seen so far (one per objective
   vector, at most ``A``; past ``A`` the most crowded go, the count dropped is kept).

With SLUB's ``structural`` objective set all generations of a call run inside one compiled
``lax.scan``; the ``dynamics`` set, and both SLAB sets (whose per-cache structure is host
code, :mod:`slabtune.tuner.slab_objectives`), evaluate on the host between compiled
variation and survival steps, one generation per step.  Generation ``g`` draws from
``fold_in(key(seed), g)``, so a run is reproducible and a run of ``a + b`` generations
equals a run of ``a`` resumed for ``b``.

The Optuna study stays the store: after a call, every archive member and a sample of ``S``
children per generation are added as finished trials (:meth:`StudyRunner.record`, the
study's distributions, values re-evaluated by the study's evaluator), skipping params the
study already holds; archive members that are non-dominated among what is recorded carry
the user attr ``slabtune_front_generation``.  The population, the archive and the generation
counter are kept in the study's user attrs, so ``--study NAME`` resumes the search.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from slabtune.errors import SlabtuneError
from slabtune.model import limits
from slabtune.tuner import front as fronts
from slabtune.tuner import grid as grids

#: Candidates per generation by objective set (a structural generation of 2048 costs about
#: 0.1 s on two cores; a dynamics one of 256 about 4 s).
POPULATION = {"structural": 2048, "dynamics": 256}
ARCHIVE = 1024
#: Children per generation recorded as trials besides the archive.
SAMPLE = 16
#: Most generations one call of the compiled loop runs (one compile serves any count up to it).
LOOP = 64
ATTR_STATE = "slabtune_population"
ATTR_SOURCE = "slabtune_source"
ATTR_FRONT_GEN = "slabtune_front_generation"
#: Trial user attr: the generation after which the trial was recorded.
ATTR_RECORDED_AT = "slabtune_recorded_generation"
_BIG = np.float32(np.finfo(np.float32).max)
_NO_RANK = np.int32(1 << 30)


class State(NamedTuple):
    """The search state (a pytree): the population sorted best first, and the archive."""

    pop: jnp.ndarray        # (N, K) int32 index vectors
    obj: jnp.ndarray        # (N, 2) float32 memory, time
    exc: jnp.ndarray        # (N,) float32 regression excess (<= 0 feasible)
    arch: jnp.ndarray       # (A, K) int32
    arch_obj: jnp.ndarray   # (A, 2) float32
    arch_ok: jnp.ndarray    # (A,) bool: a member
    dropped: jnp.ndarray    # () int32: front points the full archive has let go
    gen: jnp.ndarray        # () int32: generations done


# --------------------------------------------------------------------------- array kernels


def _sanitise(obj, exc):
    """A non-finite objective makes the point the worst infeasible point."""
    bad = ~jnp.isfinite(obj).all(1) | ~jnp.isfinite(exc)
    return (jnp.where(bad[:, None], _BIG, obj).astype(jnp.float32),
            jnp.where(bad, _BIG, exc).astype(jnp.float32))


def _fronts(obj, alive, need):
    """Non-dominated ranks (0, 1, ...) of the ``alive`` points of (M, 2) ``obj``, peeled
    until at least ``need`` points are ranked; others get _NO_RANK.  Also returns the sort
    order used (first objective, second, position)."""
    m = obj.shape[0]
    order = jnp.lexsort((jnp.arange(m), obj[:, 1], obj[:, 0]))
    s2 = obj[order, 1]
    live0 = alive[order]

    def cond(c):
        _, live, _, filled = c
        return (filled < need) & live.any()

    def body(c):
        rank, live, r, filled = c
        v = jnp.where(live, s2, jnp.inf)
        before = jnp.concatenate([jnp.array([jnp.inf], v.dtype), lax.cummin(v)[:-1]])
        front = live & (v < before)
        return (jnp.where(front, r, rank), live & ~front, r + 1,
                filled + front.sum(dtype=jnp.int32))

    rank_s, _, _, _ = lax.while_loop(cond, body, (jnp.full(m, _NO_RANK), live0,
                                                  jnp.int32(0), jnp.int32(0)))
    rank = jnp.zeros(m, jnp.int32).at[order].set(rank_s)
    return rank, order


def _crowding(obj, rank, order, span):
    """Crowding distance of each ranked point within its front (ends: inf)."""
    m = obj.shape[0]
    rank_s = rank[order]
    by = jnp.lexsort((jnp.arange(m), rank_s))      # fronts in turn, each in f1 order
    idx = order[by]
    r = rank_s[by]
    f = obj[idx]
    same_prev = jnp.concatenate([jnp.array([False]), r[1:] == r[:-1]])
    same_next = jnp.concatenate([r[:-1] == r[1:], jnp.array([False])])
    prev = jnp.concatenate([f[:1], f[:-1]])
    nxt = jnp.concatenate([f[1:], f[-1:]])
    d = (nxt[:, 0] - prev[:, 0]) / span[0] + (prev[:, 1] - nxt[:, 1]) / span[1]
    d = jnp.where(same_prev & same_next, d, jnp.inf)
    d = jnp.where(r == _NO_RANK, 0.0, d)
    return jnp.zeros(m, jnp.float32).at[idx].set(d.astype(jnp.float32))


def _span(obj, ok):
    lo = jnp.where(ok[:, None], obj, jnp.inf).min(0)
    hi = jnp.where(ok[:, None], obj, -jnp.inf).max(0)
    return jnp.maximum(jnp.where(jnp.isfinite(hi - lo), hi - lo, 1.0), 1e-12)


def survival_order(obj, exc, need):
    """Indices of all points, best first, by constrained domination and crowding."""
    feas = exc <= 0
    rank, order = _fronts(obj, feas, need)
    crowd = _crowding(obj, rank, order, _span(obj, feas))
    rank = jnp.where(feas, rank, _NO_RANK + 1)
    second = jnp.where(feas, -crowd, exc)
    return jnp.lexsort((jnp.arange(obj.shape[0]), second, rank))


def _archive_update(state: State, genomes, obj, exc, size: int):
    """The non-dominated feasible points of the archive and ``genomes`` (one per objective
    vector, archive members winning ties), at most ``size`` of them, ends and the least
    crowded kept first."""
    cand = jnp.concatenate([state.arch, genomes])
    cobj = jnp.concatenate([state.arch_obj, obj])
    ok = jnp.concatenate([state.arch_ok, exc <= 0])
    rank, order = _fronts(cobj, ok, 1)
    front = rank == 0
    crowd = _crowding(cobj, jnp.where(front, 0, _NO_RANK), order, _span(cobj, front))
    key = jnp.where(front, -crowd, jnp.inf)
    pick = jnp.lexsort((jnp.arange(cand.shape[0]), key))[:size]
    n_front = front.sum(dtype=jnp.int32)
    return state._replace(arch=cand[pick], arch_obj=cobj[pick], arch_ok=front[pick],
                          dropped=state.dropped + jnp.maximum(n_front - size, 0))


def _vary(pop, sizes, key):
    """``N`` children of the sorted population ``pop`` (see the module docstring)."""
    n, k = pop.shape
    ks = jax.random.split(key, 8)
    p1 = jax.random.randint(ks[0], (2, n), 0, n).min(0)
    p2 = jax.random.randint(ks[1], (2, n), 0, n).min(0)
    swap = jax.random.bernoulli(ks[2], 0.5, (n, k)) & jax.random.bernoulli(ks[3], 0.9, (n, 1))
    child = jnp.where(swap, pop[p2], pop[p1])
    mutate = jax.random.bernoulli(ks[4], 1.0 / k, (n, k))
    redraw = jax.random.bernoulli(ks[5], 0.5, (n, k))
    fresh = jax.random.randint(ks[6], (n, k), 0, sizes[None, :])
    scale = jnp.maximum(sizes // 8, 1)[None, :].astype(jnp.float32)
    z = jax.random.normal(ks[7], (n, k))
    step = jnp.sign(z) * (1.0 + jnp.floor(jnp.abs(z) * scale))
    moved = jnp.clip(child + step.astype(jnp.int32), 0, sizes[None, :] - 1)
    return jnp.where(mutate, jnp.where(redraw, fresh, moved), child).astype(jnp.int32)


def _survive(state: State, child, cobj, cexc, sample_key, sample: int, archive: int):
    """Survival of parents and children, the archive update, and ``sample`` children
    drawn for recording (their indices)."""
    n = state.pop.shape[0]
    allg = jnp.concatenate([state.pop, child])
    allo = jnp.concatenate([state.obj, cobj])
    alle = jnp.concatenate([state.exc, cexc])
    keep = survival_order(allo, alle, n)[:n]
    st = state._replace(pop=allg[keep], obj=allo[keep], exc=alle[keep], gen=state.gen + 1)
    st = _archive_update(st, child, cobj, cexc, archive)
    picked = jax.random.choice(sample_key, n, (sample,), replace=False)
    return st, picked


# --------------------------------------------------------------------------- the search


@dataclasses.dataclass
class Progress:
    generation: int
    evaluated: int
    seconds: float
    front: np.ndarray    # (F, 2) the archive's objectives


class Search:
    """The population search over ``grid`` with ``evaluator`` (a FleetEvaluator)."""

    def __init__(self, evaluator, grid: grids.Grid, seed: int, population: int,
                 archive: int = ARCHIVE, sample: int = SAMPLE):
        if population < 4:
            raise SlabtuneError(f"--population: {population} must be at least 4")
        if not 0 <= sample <= population:
            raise SlabtuneError(f"--record-sample: {sample} must be 0..{population}")
        if archive < 1:
            raise SlabtuneError(f"archive: {archive} must be at least 1")
        self.evaluator, self.grid, self.seed = evaluator, grid, int(seed)
        self.n, self.archive, self.sample = int(population), int(archive), int(sample)
        self.sizes = jnp.asarray(grid.sizes, jnp.int32)
        self.root = jax.random.key(self.seed)
        fn = evaluator.traceable
        self._traced = None
        if fn is not None:
            def objectives(genomes):
                out = fn(grids.jnp_knob_values(grid, genomes))
                mem, tim, exc = evaluator.fleet_aggregate(out)
                return _sanitise(jnp.stack([mem, tim], 1), exc)
            self._traced = objectives
            self._eval = jax.jit(objectives)
        self._vary = jax.jit(_vary)
        self._survive = jax.jit(functools.partial(_survive, sample=self.sample,
                                                  archive=self.archive))
        self._loop = jax.jit(self._loop_impl)

    # evaluation --------------------------------------------------------------------------

    def evaluate(self, genomes) -> tuple[jnp.ndarray, jnp.ndarray]:
        """(obj (N, 2), excess (N,)) float32 of index vectors, by the study's evaluator."""
        if self._traced is not None:
            return self._eval(genomes)
        g = np.asarray(genomes)
        ev = self.evaluator.evaluate_values(grids.knob_values(self.grid, g))
        exc = self.evaluator.regression_excess(ev)
        return _sanitise(jnp.asarray(np.stack([ev.memory, ev.time], 1)), jnp.asarray(exc))

    # state -------------------------------------------------------------------------------

    def initial(self) -> State:
        """Generation 0, not evaluated: ``N`` uniform index vectors, the first the grid
        point nearest the baseline policy, all ranked last (worst infeasible), so the first
        generation's children, drawn from them, replace them all.  (A SLAB baseline's
        tunables are each cache's own, which no grid point holds: nearest to their stand-in
        :data:`~slabtune.tuner.space.SLAB_CACHE_DEFAULT` is each tunable's smallest value.)"""
        key = jax.random.fold_in(self.root, 0)
        k = len(self.grid.names)
        pop = jax.random.randint(key, (self.n, k), 0, self.sizes)
        pop = pop.at[0].set(jnp.asarray(self.grid.nearest(self.grid.baseline)))
        return State(pop=pop, obj=jnp.full((self.n, 2), _BIG, jnp.float32),
                     exc=jnp.full(self.n, _BIG, jnp.float32),
                     arch=jnp.zeros((self.archive, k), jnp.int32),
                     arch_obj=jnp.full((self.archive, 2), _BIG, jnp.float32),
                     arch_ok=jnp.zeros(self.archive, bool), dropped=jnp.int32(0),
                     gen=jnp.int32(0))

    def _keys(self, gen):
        return jax.random.split(jax.random.fold_in(self.root, gen + 1))

    def _loop_impl(self, state: State, count):
        """``count`` (<= :data:`LOOP`, traced) generations in one compiled loop; the
        sampled children of each in a (LOOP, S, K) buffer."""
        buf = jnp.zeros((LOOP, self.sample, len(self.grid.names)), jnp.int32)

        def body(i, carry):
            st, buf = carry
            kv, ks = self._keys(st.gen)
            child = _vary(st.pop, self.sizes, kv)
            cobj, cexc = self._traced(child)
            st, picked = _survive(st, child, cobj, cexc, ks, self.sample, self.archive)
            return st, buf.at[i].set(child[picked])

        return lax.fori_loop(0, count, body, (state, buf))

    def advance(self, state: State, generations: int, chunk: int | None = None,
                on_chunk: Callable[[Progress], None] | None = None):
        """Run ``generations`` more generations; returns (state, sampled children (G*S, K)).
        Structural set: up to ``chunk`` (at most :data:`LOOP`) generations per call of the
        compiled loop; ``on_chunk`` sees the archive after each call."""
        t0 = time.perf_counter()
        samples = []
        left = generations
        per_call = max(1, min(chunk or LOOP, LOOP))
        while left > 0:
            if self._traced is not None:
                g = min(left, per_call)
                state, buf = self._loop(state, jnp.int32(g))
                samples.append(np.asarray(buf)[:g].reshape(-1, len(self.grid.names)))
            else:
                g = 1
                kv, ks = self._keys(state.gen)
                child = self._vary(state.pop, self.sizes, kv)
                cobj, cexc = self.evaluate(child)
                state, picked = self._survive(state, child, cobj, cexc, ks)
                samples.append(np.asarray(child)[np.asarray(picked)])
            left -= g
            if on_chunk is not None:
                on_chunk(Progress(int(state.gen), int(state.gen) * self.n,
                                  time.perf_counter() - t0, archive_front(state)[1]))
        k = len(self.grid.names)
        return state, (np.concatenate(samples) if samples else np.zeros((0, k), np.int32))

    # persistence -------------------------------------------------------------------------

    def settings(self) -> dict:
        return {"seed": self.seed, "population": self.n, "archive": self.archive,
                "knobs": list(self.grid.names)}

    def to_attr(self, state: State) -> dict:
        ok = np.asarray(state.arch_ok)
        return {**self.settings(), "generation": int(state.gen), "dropped": int(state.dropped),
                "pop": np.asarray(state.pop).tolist(), "obj": np.asarray(state.obj).tolist(),
                "exc": np.asarray(state.exc).tolist(), "arch": np.asarray(state.arch).tolist(),
                "arch_obj": np.asarray(state.arch_obj).tolist(), "arch_ok": ok.tolist()}

    def from_attr(self, attr: dict) -> State:
        mine = self.settings()
        for k, v in mine.items():
            if attr.get(k) != v:
                raise SlabtuneError(f"--sampler population: the study's search has {k} "
                                    f"{attr.get(k)!r}, this call {v!r}; resume with the same")
        f32 = lambda x: jnp.asarray(np.asarray(x, np.float32))  # noqa: E731
        return State(pop=jnp.asarray(np.asarray(attr["pop"], np.int32)), obj=f32(attr["obj"]),
                     exc=f32(attr["exc"]), arch=jnp.asarray(np.asarray(attr["arch"], np.int32)),
                     arch_obj=f32(attr["arch_obj"]), arch_ok=jnp.asarray(attr["arch_ok"]),
                     dropped=jnp.int32(attr["dropped"]), gen=jnp.int32(attr["generation"]))


def archive_front(state: State) -> tuple[np.ndarray, np.ndarray]:
    """(genomes (F, K), objectives (F, 2)) of the archive's members."""
    ok = np.asarray(state.arch_ok)
    return np.asarray(state.arch)[ok], np.asarray(state.arch_obj)[ok].astype(np.float64)


# --------------------------------------------------------------------------- with a study


@dataclasses.dataclass
class Result:
    generations: tuple[int, int]   # first and last generation of this call
    evaluated: int                 # candidates evaluated by this call
    front: int                     # archive members at the end
    dropped: int                   # front points the full archive let go (ever)
    recorded: int                  # trials added
    recorded_front: int            # of which marked as front
    seconds: float


_SEARCHES: dict[tuple, Search] = {}


def searcher(evaluator, grid: grids.Grid, seed: int, population: int, archive: int,
             sample: int) -> Search:
    """One :class:`Search` (one compiled loop) per evaluator and settings in a process."""
    key = (id(evaluator), grid.names, grid.tables.tobytes(), seed, population, archive, sample)
    if key not in _SEARCHES:
        _SEARCHES[key] = Search(evaluator, grid, seed, population, archive, sample)
    return _SEARCHES[key]


def run(runner, generations: int, population: int | None = None, seed: int | None = None,
        archive: int = ARCHIVE, sample: int = SAMPLE,
        on_chunk: Callable[[Progress], None] | None = None, chunk: int | None = None) -> Result:
    """Run (or resume) the population search of ``runner``'s study for ``generations``
    more generations and record its front and samples as trials."""
    if generations < 0:
        raise SlabtuneError(f"--generations: {generations} is negative")
    spec, study = runner.spec, runner.study
    population = population or POPULATION[spec.objectives.name]
    limits.check("population", population, "--population")
    seed = seed if seed is not None else (spec.space.seed or 0)
    t0 = time.perf_counter()
    search = searcher(runner.evaluator, grids.grid_of(spec.space), seed, population, archive,
                      sample)
    stored = study.user_attrs.get(ATTR_STATE)
    evaluated = 0
    if stored is None:
        state = search.initial()
    else:
        state = search.from_attr(stored)
    g0 = int(state.gen)
    state, sampled = search.advance(state, generations, chunk=chunk, on_chunk=on_chunk)
    evaluated += generations * population
    added, marked = record(runner, search, state, sampled)
    study.set_user_attr(ATTR_STATE, search.to_attr(state))
    return Result(generations=(g0, int(state.gen)), evaluated=evaluated,
                  front=int(np.asarray(state.arch_ok).sum()), dropped=int(state.dropped),
                  recorded=added, recorded_front=marked, seconds=time.perf_counter() - t0)


def record(runner, search: Search, state: State, sampled: np.ndarray) -> tuple[int, int]:
    """Add the archive and the sampled children to the study as trials (params it does not
    hold yet), values from the study's evaluator; returns (added, marked as front)."""
    grid = search.grid
    arch, _ = archive_front(state)
    genomes = np.concatenate([arch, sampled]) if len(sampled) else arch
    have = {tuple(t.params.get(n) for n in grid.names)
            for t in runner.study.get_trials(deepcopy=False)}
    rows, seen = [], set()
    for i, g in enumerate(genomes):
        p = grid.params(g)
        key = tuple(p[n] for n in grid.names)
        if key in have or key in seen:
            continue
        seen.add(key)
        rows.append(i)
    if not rows:
        return 0, 0
    picked = genomes[rows]
    ev = grids.evaluate_rows(runner.evaluator, grid, picked)
    obj = np.stack([ev.memory, ev.time], 1)
    ok = np.isfinite(obj).all(1) & (runner.evaluator.regression_excess(ev) <= 0)
    # front: non-dominated among these and every feasible trial the study already holds
    # (an equal earlier trial keeps the mark to itself)
    old = np.array([t.values for t in runner.study.best_trials], np.float64).reshape(-1, 2)
    keep = fronts.nondominated(np.concatenate([old, obj[ok]]))[len(old):]
    on_front = np.zeros(len(rows), bool)
    on_front[np.flatnonzero(ok)[keep]] = True
    on_front &= np.asarray(rows) < len(arch)
    gen = int(state.gen)
    attrs = [{ATTR_SOURCE: "population", ATTR_RECORDED_AT: gen,
              **({ATTR_FRONT_GEN: gen} if f else {})} for f in on_front]
    runner.record([grid.params(g) for g in picked], ev, attrs)
    return len(rows), int(on_front.sum())


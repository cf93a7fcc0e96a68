"""Time to a Pareto front: hypervolume against wall-clock seconds for each way of searching,
side by side in one run, on the same fleet, objectives and evaluator.

Methods:

* ``optuna``: Optuna's plain sequential loop, ``study.optimize`` with the default
  multi-objective sampler (``optuna.create_study(directions=...)``), in-memory storage, the
  objective evaluating one policy (the regression limit told with ``Trial.set_constraint``);
* ``tune``: ``slabtune tune`` as it is (:class:`StudyRunner`, the spec's sampler, batches
  of ``--batch``, in-memory storage);
* ``exhaustive``: ``tune --exhaustive`` (:mod:`slabtune.tuner.exhaustive`), where the space
  is enumerable;
* ``population``: ``tune --sampler population`` (:mod:`slabtune.tuner.population`).

Each method gets the same budget of its own seconds.  Every so often its front so far is
read from its study (feasible trials only) and its hypervolume taken with both objectives
divided by the baseline's, against the reference point (1.2, 1.2), the baseline's
objectives times 1.2; reading the study and taking the hypervolume are not counted in the
method's seconds.  Compiles are: the evaluator's shapes are compiled before any method
starts, a method's own (the population loop, the exhaustive chunk) count in its seconds.

For each objective set two spaces are searched: the built-in spec's own (``tune_quick``,
``tune_dynamics``: too large to enumerate) and an enumerable one on the same fleet (the
spec with its ``[search.knobs]`` replaced, :data:`ENUM_KNOBS`), where the exhaustive front
is the exact one and each sampler's front is compared with it.  Printed: per space the
seconds each method needs to reach 99% of the best hypervolume any method reached in the
budget, the ratios against ``optuna``, final hypervolumes, and (enumerable space) each
method's hypervolume as a share of the exact front's and the exact front points it found.

    .venv/bin/python benchmarks/bench_front.py [--sets structural,dynamics]
        [--budget-structural 60] [--budget-dynamics 120] [--allocator slub|slab] [--json]

``--allocator slab`` searches SLAB policies instead, on ``tune_slab_quick``'s fleet (its
objectives set to each set in turn): the spec's own space (576 points) is the enumerable
one, and the searched space widens its knobs to :data:`SLAB_WIDE_KNOBS`.

``--json`` prints one object: ``structural`` and ``dynamics`` each hold
``seconds_to_99pct`` per method (null: not reached within the budget) and
``speedup_vs_optuna`` (the best slabtune method's seconds against ``optuna``'s; with
``speedup_is_lower_bound`` true when ``optuna`` never reached it, so its budget stands in),
for the spec's space, and the enumerable space under ``exact``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import re
import sys
import time

import numpy as np
import optuna

from slabtune.tuner import exhaustive, population
from slabtune.tuner import front as fronts
from slabtune.tuner import study as studies
from slabtune.tuner.constraints import feasible
from slabtune.tuner.grid import grid_of
from slabtune.tuner.space import SearchSpace

SPECS = {"structural": "tune_quick", "dynamics": "tune_dynamics"}
#: The enumerable space of each set, on the built-in spec's fleet and objectives.
ENUM_KNOBS = {
    "structural": """slub_min_order = { low = 0, high = 3 }
slub_max_order = { low = 0, high = 6 }
slub_min_objects = { low = 0, high = 128 }
cpu_partial_small = { low = 0, high = 240, step = 8 }
""",
    "dynamics": """slub_min_order = { low = 0, high = 2 }
slub_max_order = { low = 0, high = 4 }
min_partial_lo = { low = 0, high = 10, step = 2 }
cpu_partial_small = { low = 0, high = 240, step = 24 }
""",
}
#: ``--allocator slab``: the SLAB spec, and its knobs widened (about 9.4e7 points).
SLAB_SPEC = "tune_slab_quick"
SLAB_WIDE_KNOBS = """slab_max_order = { low = 0, high = 10 }
limit = { low = 1, high = 512 }
batchcount = { low = 1, high = 256 }
shared = { low = 0, high = 64 }
"""
METHODS = ("optuna", "tune", "exhaustive", "population", "population_warm")
#: Methods the headline speedup picks from (population_warm is reported beside it).
COLD = ("tune", "exhaustive", "population")
REF = 1.2
#: Method seconds between readings of the front.
READ_EVERY = {"structural": 0.25, "dynamics": 2.0}


def enum_spec(name: str, knobs: str | None, objectives: str | None = None,
              suffix: str = "enumerable") -> studies.TuneSpec:
    """The built-in spec with its [search.knobs] table replaced by ``knobs`` (None: kept)
    and, given ``objectives``, its [objectives] table (the spec's last) by that set."""
    path = studies.spec_file(name)
    text = path.read_text()
    if knobs is not None:
        text = re.sub(r"\[search\.knobs\]\n(.*?)\n\[objectives\]",
                      lambda _: f"[search.knobs]\n{knobs}\n[objectives]", text, flags=re.S)
    if objectives is not None:
        text = text[:text.index("[objectives]")] + f'[objectives]\nset = "{objectives}"\n'
    return studies.parse_spec(text, f"{name}-{suffix}")


def specs_for(allocator: str, set_name: str) -> tuple[studies.TuneSpec, studies.TuneSpec]:
    """(the searched spec, the enumerable spec on its fleet) of an objective set."""
    if allocator == "slab":
        return (enum_spec(SLAB_SPEC, SLAB_WIDE_KNOBS, set_name, "wide"),
                enum_spec(SLAB_SPEC, None, set_name))
    return (studies.load_spec(SPECS[set_name]),
            enum_spec(SPECS[set_name], ENUM_KNOBS[set_name]))


class Clock:
    """Seconds a method has spent, with readings of its study left out."""

    def __init__(self):
        self.spent, self._t = 0.0, time.perf_counter()

    def pause(self) -> float:
        self.spent += time.perf_counter() - self._t
        return self.spent

    def resume(self) -> None:
        self._t = time.perf_counter()


def feasible_values(study: optuna.Study) -> np.ndarray:
    vals = [t.values for t in study.get_trials(deepcopy=False,
                                               states=(optuna.trial.TrialState.COMPLETE,))
            if feasible(t)]
    return np.array(vals, np.float64).reshape(-1, 2)


class Curve:
    """(seconds, hypervolume) readings of one method."""

    def __init__(self, base: np.ndarray):
        self.base, self.points, self.final_front = base, [], np.zeros((0, 2))

    def read(self, t: float, study: optuna.Study) -> None:
        vals = feasible_values(study)
        norm = vals / self.base
        self.points.append((t, fronts.hypervolume(norm, (REF, REF))))
        self.final_front = vals

    def seconds_to(self, target: float) -> float | None:
        for t, hv in self.points:
            if hv >= target:
                return t
        return None

    @property
    def final(self) -> float:
        return self.points[-1][1] if self.points else 0.0


def run_optuna(spec, evaluator, budget, every):
    clock = Clock()
    curve = Curve(_base(evaluator))
    study = optuna.create_study(directions=list(studies.DIRECTIONS))
    dists = spec.space.distributions()
    constrained = spec.objectives.max_regression is not None
    nxt = [every]

    def objective(trial):
        params = {}
        for name, d in dists.items():
            if isinstance(d, optuna.distributions.CategoricalDistribution):
                params[name] = trial.suggest_categorical(name, list(d.choices))
            else:
                params[name] = trial.suggest_int(name, d.low, d.high, step=d.step)
        ev = evaluator.evaluate([studies.effective_params(params, spec)])
        if constrained:
            trial.set_constraint(studies.ATTR_EXCESS, float(evaluator.regression_excess(ev)[0]))
        return float(ev.memory[0]), float(ev.time[0])

    def callback(st, _trial):
        t = clock.pause()
        if t >= nxt[0] or t >= budget:
            curve.read(t, st)
            nxt[0] = t + every
        if t >= budget:
            st.stop()
        clock.resume()

    clock.resume()
    study.optimize(objective, callbacks=[callback])
    return curve, {"trials": len(study.trials), "sampler": type(study.sampler).__name__}


def run_tune(spec, evaluator, budget, every, batch):
    clock = Clock()
    curve = Curve(_base(evaluator))
    runner, _ = studies.create_or_resume(spec, "bench-tune", "memory:", evaluator=evaluator)
    clock.resume()
    while True:
        runner.run(batch, batch)
        t = clock.pause()
        curve.read(t, runner.study)
        if t >= budget:
            break
        clock.resume()
    return curve, {"trials": len(runner.study.trials), "batch": batch}


def run_exhaustive(spec, evaluator, budget, every):
    clock = Clock()
    curve = Curve(_base(evaluator))
    runner, _ = studies.create_or_resume(spec, "bench-exhaustive", "memory:",
                                         evaluator=evaluator)
    grid = exhaustive.plan(spec, spec.space.names)
    clock.resume()
    done = False
    while not done:
        res = exhaustive.run(runner, grid, max_chunks=1)
        done = res.done
        t = clock.pause()
        curve.read(t, runner.study)
        if t >= budget and not done:
            break
        clock.resume()
    return curve, {"points": grid.size, "done": done, "front": len(runner.study.best_trials),
                   "trials": len(runner.study.trials)}


def run_population(spec, evaluator, budget, every, size, gens):
    """The population search as ``tune --sampler population`` runs it (its compiled loop,
    ``gens`` generations per call, then the archive and samples recorded as trials); the
    front is read from the archive after each call, and the one recording's seconds are
    added to every reading (the front is in the study only once recorded)."""
    clock = Clock()
    curve = Curve(_base(evaluator))
    runner, _ = studies.create_or_resume(spec, "bench-population", "memory:",
                                         evaluator=evaluator)
    population._SEARCHES.clear()      # a new compiled loop (from the disk cache when warm)
    clock.resume()
    grid = grid_of(spec.space)
    search = population.searcher(evaluator, grid, spec.space.seed or 0, size,
                                 population.ARCHIVE, population.SAMPLE)
    state = search.initial()
    samples, readings = [], []
    while True:
        state, smp = search.advance(state, gens, chunk=gens)
        samples.append(smp)
        t = clock.pause()
        front = population.archive_front(state)[1] / curve.base
        readings.append((t, fronts.hypervolume(front, (REF, REF))))
        if t >= budget:
            break
        clock.resume()
    t_rec = time.perf_counter()
    population.record(runner, search, state, np.concatenate(samples))
    runner.study.set_user_attr(population.ATTR_STATE, search.to_attr(state))
    rec = time.perf_counter() - t_rec
    curve.points = [(t + rec, hv) for t, hv in readings]
    curve.read(readings[-1][0] + rec, runner.study)
    return curve, {"population": size, "generations": int(state.gen),
                   "trials": len(runner.study.trials),
                   "archive": int(np.asarray(state.arch_ok).sum()),
                   "dropped": int(state.dropped), "record_s": round(rec, 3)}


def _base(evaluator) -> np.ndarray:
    return np.array([evaluator.baseline.memory[0], evaluator.baseline.time[0]])


def bench_space(spec, budget, args, set_name, with_exhaustive) -> dict:
    evaluator = studies.evaluator_for(spec)
    t0 = time.perf_counter()
    for n in (1, args.batch):          # the evaluator's shapes, compiled before timing
        evaluator.evaluate([{}] * n)
    compile_s = time.perf_counter() - t0
    grid_size = _space_size(spec.space)
    print(f"\n== {set_name}: {spec.name}, {len(spec.space.knobs)} knobs, {grid_size:,} points; "
          f"budget {budget:g} s per method (evaluator compile {compile_s:.1f} s, not counted)",
          flush=True)
    every = READ_EVERY[set_name]
    curves, info = {}, {}
    runs = [("optuna", lambda: run_optuna(spec, evaluator, budget, every)),
            ("tune", lambda: run_tune(spec, evaluator, budget, every, args.batch))]
    if with_exhaustive:
        runs.append(("exhaustive", lambda: run_exhaustive(spec, evaluator, budget, every)))
    pop = args.population or population.POPULATION[set_name]
    gens = 4 if set_name == "structural" else 1
    # cold: the compiled loop built from nothing; warm: a new loop whose compiled code the
    # persistent compilation cache (tune turns it on) already holds, as on a second run
    runs.append(("population", lambda: run_population(spec, evaluator, budget, every, pop,
                                                      gens)))
    runs.append(("population_warm", lambda: run_population(spec, evaluator, budget, every,
                                                           pop, gens)))
    for name, fn in runs:
        curves[name], info[name] = fn()
        print(f"  {name:11} final hv {curves[name].final:.5f} after "
              f"{curves[name].points[-1][0]:.1f} s  {info[name]}", flush=True)
    best = max(c.final for c in curves.values())
    target = 0.99 * best
    secs = {m: (curves[m].seconds_to(target) if m in curves else None) for m in METHODS}
    out = {"spec": spec.name, "space_size": grid_size, "budget_s": budget,
           "best_hv": best, "final_hv": {m: c.final for m, c in curves.items()},
           "seconds_to_99pct": secs, "info": info}
    mine = {m: s for m, s in secs.items() if m in COLD and s is not None}
    if mine:
        best_m = min(mine, key=mine.get)
        a = secs["optuna"]
        out["best_method"] = best_m
        out["speedup_is_lower_bound"] = a is None
        out["speedup_vs_optuna"] = (a if a is not None else budget) / mine[best_m]
    else:
        out["best_method"], out["speedup_vs_optuna"], out["speedup_is_lower_bound"] = \
            None, None, False
    print(f"  99% of best hv ({best:.5f}) reached after (s):  " + "  ".join(
        f"{m} {'-' if s is None else f'{s:.2f}'}" for m, s in secs.items() if m in curves))
    ratios = {}
    for m, s_m in secs.items():
        if m != "optuna" and s_m is not None:
            a = secs["optuna"] if secs["optuna"] is not None else budget
            ratios[m] = a / s_m
    out["ratio_vs_optuna"] = ratios
    lb = ">= " if secs["optuna"] is None else ""
    print("  against optuna (its seconds / the method's): " + "  ".join(
        f"{m} {lb}{r:.1f}x" for m, r in ratios.items()))
    if out["speedup_vs_optuna"] is not None:
        print(f"  best cold slabtune method {out['best_method']}: {lb}"
              f"{out['speedup_vs_optuna']:.1f}x sooner than optuna")
    if with_exhaustive and "exhaustive" in curves and info["exhaustive"]["done"]:
        exact = curves["exhaustive"].final_front
        exact_front = exact[fronts.nondominated(exact)]
        out["exact_front_size"] = len(exact_front)
        out["hv_share_of_exact"] = {m: c.final / curves["exhaustive"].final
                                    for m, c in curves.items()}
        out["exact_points_found"] = {m: _found(exact_front, c.final_front)
                                     for m, c in curves.items()}
        print(f"  exact front: {len(exact_front)} points; share of its hv: " + "  ".join(
            f"{m} {v:.4f}" for m, v in out["hv_share_of_exact"].items())
            + "; exact points found: " + "  ".join(
            f"{m} {v}" for m, v in out["exact_points_found"].items()))
    return out


def _found(exact: np.ndarray, got: np.ndarray) -> int:
    if len(got) == 0:
        return 0
    return int(sum(np.isclose(got, p, rtol=1e-6, atol=0).all(1).any() for p in exact))


def _space_size(space: SearchSpace) -> int:
    return grid_of(space).size


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sets", default="structural,dynamics")
    ap.add_argument("--budget-structural", type=float, default=60.0)
    ap.add_argument("--budget-dynamics", type=float, default=120.0)
    ap.add_argument("--budget-enumerable", type=float, default=None,
                    help="budget on the enumerable spaces (default: half the set's)")
    ap.add_argument("--batch", type=int, default=64, help="tune's batch (its default)")
    ap.add_argument("--population", type=int, default=None,
                    help="population size (default: the set's, "
                         + ", ".join(f"{k} {v}" for k, v in population.POPULATION.items()) + ")")
    ap.add_argument("--allocator", choices=("slub", "slab"), default="slub",
                    help="slab: SLAB policies on tune_slab_quick's fleet (see above)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    # SLAB: Optuna's loop logs a warning for every failed trial (batchcount above limit)
    optuna.logging.set_verbosity(logging.ERROR if args.allocator == "slab" else logging.WARNING)
    import atexit
    import shutil
    import tempfile

    import jax
    # an empty persistent compilation cache of this run's own: the first population run
    # compiles cold and fills it, the second finds its loop there
    cache = tempfile.mkdtemp(prefix="bench-front-jax-")
    atexit.register(shutil.rmtree, cache, ignore_errors=True)
    jax.config.update("jax_compilation_cache_dir", cache)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)
    print(f"{platform.node()} {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}, "
          f"optuna {optuna.__version__}", flush=True)
    result = {}
    for set_name in args.sets.split(","):
        budget = getattr(args, f"budget_{set_name}")
        searched, enumerable = specs_for(args.allocator, set_name)
        entry = bench_space(searched, budget, args, set_name, False)
        eb = args.budget_enumerable or budget / 2
        entry["exact"] = bench_space(enumerable, eb, args, set_name, True)
        result[set_name] = entry
    print(f"load at the end {os.getloadavg()[0]:.2f}", flush=True)
    if args.json:
        json.dump(result, sys.stdout)
        print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

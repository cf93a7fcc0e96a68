"""``slabtune tune SPEC``: run (or resume) an Optuna study over SLUB or SLAB policies.

Three ways to fill a study, all stored as ordinary Optuna trials:

* the spec's sampler (NSGA-II or TPE): ``--trials`` asked ``--batch`` at a time, each batch
  evaluated in one vectorised model call and written to the storage in one go;
* ``--exhaustive``: every point of the space (or of the ``--knobs`` subspace), in chunks,
  keeping the exact front (:mod:`slabtune.tuner.exhaustive`);
* ``--sampler population``: ``--generations`` of a vectorised NSGA-II population search,
  its front and a sample recorded (:mod:`slabtune.tuner.population`).

Storage defaults to ``runs/<study>/study.db``; ``--storage`` takes any Optuna storage URL or
``journal:PATH``; ``--study NAME`` resumes an existing study with the same spec.
"""

from __future__ import annotations

import shlex
import sys
import time

from slabtune.commands import jsonout


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "tune", help="search policies for the Pareto front of memory against time per op",
        description="Run a multi-objective Optuna study (NSGA-II or TPE, from the spec) over "
                    "the knobs of a tune spec's [search] table (boot parameters and sysfs "
                    "values unless [search] reach = \"kernel\" allows knobs that need a "
                    "rebuilt kernel), evaluated over its [fleet] "
                    "(inline [[fleet.topology]]/[[fleet.workload]] tables, or sweep = NAME|PATH "
                    "taking a sweep spec's topologies and caches). Each batch is written to "
                    "the storage in one go. SPEC is a TOML file or a built-in name "
                    "(tune_quick, tune_dynamics, tune_sweep_quick, tune_slab_quick).")
    p.add_argument("spec", metavar="SPEC", help="tune spec file or built-in name")
    p.add_argument("--trials", type=int, metavar="N",
                   help="trials to add with the spec's sampler (required unless --exhaustive "
                        "or --sampler population)")
    p.add_argument("--batch", type=int, default=64, metavar="B",
                   help="trials asked and evaluated together (default 64)")
    p.add_argument("--exhaustive", action="store_true",
                   help="evaluate every point of the spec's space (or of --knobs) in "
                        "vectorised chunks and store its exact Pareto front as trials; "
                        "prints the space's size first and refuses (exit 2) a space over "
                        "--max-points; resumes where an interrupted run stopped")
    p.add_argument("--knobs", metavar="K1,K2",
                   help="with --exhaustive: enumerate only these knobs of the spec ('boot': "
                        "its boot parameters), the others at their baseline values")
    p.add_argument("--max-points", type=int, metavar="N",
                   help="with --exhaustive: largest space to enumerate (default "
                        + ", ".join(f"{k} {v:,}" for k, v in _max_points().items()) + ")")
    p.add_argument("--sampler", choices=("spec", "population"), default="spec",
                   help="spec: the spec's [search] sampler, --trials at a time; population: "
                        "a vectorised NSGA-II search (thousands of candidates a generation, "
                        "selected on arrays inside one compiled loop), recording its front "
                        "and a sample of each generation as trials; resumes with --study")
    p.add_argument("--generations", type=int, metavar="G",
                   help="with --sampler population: generations to add (required)")
    p.add_argument("--population", type=int, metavar="P",
                   help="with --sampler population: candidates per generation (default "
                        + ", ".join(f"{k} {v}" for k, v in _population().items()) + ")")
    p.add_argument("--record-sample", type=int, default=16, metavar="S",
                   help="with --sampler population: children of each generation recorded as "
                        "trials besides the front (default 16)")
    p.add_argument("--storage", metavar="URL",
                   help="Optuna storage URL (sqlite:///..., postgresql://... with the "
                        "postgres extra, mysql://... with the mysql extra, journal:PATH); "
                        "default: sqlite in the run directory")
    p.add_argument("--study", metavar="NAME", help="study name; resumes it when it exists")
    p.add_argument("--run-dir", metavar="DIR",
                   help="run directory (default runs/<study>) holding study.db")
    p.add_argument("--workers", type=int, metavar="N",
                   help="add the --trials with N study workers as Ray tasks (a local Ray "
                        "instance, or the cluster of --ray-address / RAY_ADDRESS), all on "
                        "the one storage; each draws its own seed stream and skips the "
                        "candidates any writer stored (default: this process alone, or 1 "
                        "worker on the cluster when an address is given)")
    p.add_argument("--ray-address", metavar="ADDR",
                   help="Ray cluster for the workers (default: RAY_ADDRESS; the storage "
                        "must be one every node reaches)")
    p.add_argument("--json", action="store_true",
                   help="print {study, storage, trials, added, duplicates} (and the "
                        "search's counts, the workers' reports) as JSON; "
                        + jsonout.NON_FINITE_HELP)
    p.set_defaults(func=_tune)


def _max_points() -> dict:
    from slabtune.tuner.exhaustive import MAX_POINTS

    return MAX_POINTS


def _population() -> dict:
    from slabtune.tuner.population import POPULATION

    return POPULATION


def _tune(args) -> int:
    from slabtune.commands.paths import output_dir
    from slabtune.errors import SlabtuneError
    from slabtune.sweeps.evaluators import configure_jax
    from slabtune.tuner import study

    mode = _check_mode(args)
    workers = _check_workers(args, mode)
    if args.batch < 1:
        raise SlabtuneError(f"--batch: {args.batch} must be at least 1")
    if args.run_dir is not None:
        output_dir("--run-dir", args.run_dir)
    if args.study is not None:
        study.check_study_name(args.study)
    spec = study.load_spec(args.spec)
    configure_jax()   # compiled evaluators and search loops persist between runs
    grid = None
    if mode == "exhaustive":
        from slabtune.tuner import exhaustive

        knobs = exhaustive.subspace(spec, args.knobs)
        grid = exhaustive.plan(spec, knobs, args.max_points)   # refuses before any storage
        where = spec.name if args.knobs is None else f"{spec.name} [{','.join(knobs)}]"
        print(f"exhaustive: space {where} has {grid.size:,} points ({grid.describe()})",
              file=sys.stderr if args.json else sys.stdout, flush=True)
    if workers is not None and args.storage is not None:
        from slabtune.tuner.workers import shared_url

        args.storage = shared_url(args.storage)     # the workers' URL, checked before work
    runner, url = study.create_or_resume(spec, args.study, args.storage, args.run_dir)
    before = len(runner.study.trials)
    t0 = time.perf_counter()
    extra: dict = {}
    if mode == "exhaustive":
        res = exhaustive.run(runner, grid)
        extra = {"points": res.points, "evaluated": res.evaluated, "front": res.front}
        what = (f"{res.evaluated:,} of {res.points:,} points evaluated, front of "
                f"{res.front} points")
    elif mode == "population":
        from slabtune.tuner import population

        res = population.run(runner, args.generations, population=args.population,
                             sample=args.record_sample)
        extra = {"generation": res.generations[1], "evaluated": res.evaluated,
                 "archive": res.front, "recorded_front": res.recorded_front}
        what = (f"generations {res.generations[0]}..{res.generations[1]} "
                f"({res.evaluated:,} candidates evaluated), front of {res.front} in its "
                f"archive" + (f" ({res.dropped} front points let go: archive full)"
                              if res.dropped else ""))
    elif workers is not None:
        from slabtune.tuner import workers as study_workers

        reports = study_workers.run(runner.study.study_name, url, args.trials, args.batch,
                                    workers, args.ray_address)
        runner.added = sum(r["added"] for r in reports)
        runner.duplicates = sum(r["duplicates"] for r in reports)
        nodes = len({r["node"] for r in reports})
        extra = {"workers": reports}
        what = (f"{len(reports)} Ray worker{'s' if len(reports) != 1 else ''} on {nodes} "
                f"node{'s' if nodes != 1 else ''}")
    else:
        runner.run(args.trials, args.batch)
        what = None
    dt = time.perf_counter() - t0
    total = len(runner.study.trials)
    moving = [t.user_attrs[study.ATTR_NOT_STEADY] for t in runner.study.trials[before:]
              if study.ATTR_NOT_STEADY in t.user_attrs]
    if moving:
        print(f"slabtune: warning: {len(moving)} trials failed, not in steady state "
              f"(first: {moving[0]})", file=sys.stderr)
    skipped = (f"; {runner.duplicates} asked candidates skipped, already in the study"
               if runner.duplicates else "")
    if runner.added < (args.trials or 0):
        print(f"slabtune: note: {runner.added} of {args.trials} trials added: the sampler "
              f"kept asking for candidates already in the study{skipped}", file=sys.stderr)
    if args.json:
        print(jsonout.dumps({"study": runner.study.study_name, "storage": study.shown_url(url),
                             "trials": total,
                             "added": runner.added, "duplicates": runner.duplicates,
                             **extra}))
    else:
        front = len(runner.study.best_trials)
        if what:
            print(f"{mode if workers is None else 'workers'}: {what}")
        print(f"study {runner.study.study_name}: {runner.added} trials added "
              f"({total} in all) in {dt:.1f} s{skipped}; {front} on the Pareto front")
        print(f"storage {study.shown_url(url)}")
        print(next_hint(runner.study.study_name, args.storage, url), file=sys.stderr)
    return 0


def _check_workers(args, mode: str) -> int | None:
    """How many Ray workers add the trials (None: this process does), from --workers,
    --ray-address and RAY_ADDRESS; one line when they do not fit the mode."""
    import os

    from slabtune.errors import SlabtuneError

    if args.workers is not None and args.workers < 1:
        raise SlabtuneError(f"--workers: {args.workers} must be at least 1")
    for flag, value in (("--workers", args.workers), ("--ray-address", args.ray_address)):
        if value is not None and mode != "spec":
            other = "--exhaustive" if mode == "exhaustive" else "--sampler population"
            raise SlabtuneError(f"{flag}: not with {other} (it runs in this process)")
    if args.workers is not None:
        return args.workers
    if args.ray_address or (mode == "spec" and os.environ.get("RAY_ADDRESS")):
        return 1
    if os.environ.get("RAY_ADDRESS"):
        flag = "--exhaustive" if mode == "exhaustive" else "--sampler population"
        print(f"slabtune: note: RAY_ADDRESS is set; tune {flag} runs in this process",
              file=sys.stderr)
    return None


def _check_mode(args) -> str:
    """Which way the study is filled; options of another mode are one-line errors."""
    from slabtune.errors import SlabtuneError
    from slabtune.model import limits

    if args.exhaustive and args.sampler == "population":
        raise SlabtuneError("--exhaustive: give it or --sampler population, not both")
    mode = ("exhaustive" if args.exhaustive else
            "population" if args.sampler == "population" else "spec")
    for flag, value, owner in (("--knobs", args.knobs, "exhaustive"),
                               ("--max-points", args.max_points, "exhaustive"),
                               ("--generations", args.generations, "population"),
                               ("--population", args.population, "population")):
        if value is not None and mode != owner:
            need = "--exhaustive" if owner == "exhaustive" else "--sampler population"
            raise SlabtuneError(f"{flag}: only with {need}")
    if mode == "spec" and args.trials is None:
        raise SlabtuneError("--trials: required (or --exhaustive, or --sampler population "
                            "with --generations)")
    if mode != "spec" and args.trials is not None:
        other = "--exhaustive" if args.exhaustive else "--sampler population"
        raise SlabtuneError(f"--trials: not with {other}")
    if args.trials is not None and args.trials < 0:
        raise SlabtuneError(f"--trials: {args.trials} is negative")
    if mode == "population" and args.generations is None:
        raise SlabtuneError("--generations: required with --sampler population")
    if args.generations is not None and args.generations < 0:
        raise SlabtuneError(f"--generations: {args.generations} is negative")
    if args.population is not None and args.population < 4:
        raise SlabtuneError(f"--population: {args.population} must be at least 4")
    if args.population is not None:
        limits.check("population", args.population, "--population")
    if args.trials is not None:
        limits.check("trials", args.trials, "--trials")
    if args.record_sample < 0:
        raise SlabtuneError(f"--record-sample: {args.record_sample} is negative")
    if args.max_points is not None and args.max_points < 1:
        raise SlabtuneError(f"--max-points: {args.max_points} must be at least 1")
    return mode


def next_hint(study: str, storage: str | None, url: str) -> str:
    """The ``next:`` line after a study: a pasteable ``slabtune pareto`` command (every
    argument shell-quoted), or, for an in-memory study, that it is gone."""
    from slabtune.tuner.study import is_in_memory_url, shown_url

    if is_in_memory_url(url):
        return ("note: the study lived in memory (--storage memory:) and is gone now that "
                "this process ends; use a file storage to keep it")
    # never a password: an RDB URL's is masked, the user types it again
    argv = ["slabtune", "pareto", "--study", study] + (["--storage", shown_url(url)]
                                                       if storage else [])
    return "next: " + shlex.join(argv)

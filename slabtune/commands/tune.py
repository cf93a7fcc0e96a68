"""``slabtune tune SPEC``: run (or resume) an Optuna study over SLUB policies.

Trials are asked ``--batch`` at a time, each batch is evaluated in one vectorised model call
and written to the storage in one go.  Storage defaults to ``runs/<study>/study.db``;
``--storage`` takes any Optuna storage URL or ``journal:PATH``; ``--study NAME`` resumes an
existing study with the same spec.
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
                    "the knobs of a tune spec's [search] table, evaluated over its [fleet] "
                    "(inline [[fleet.topology]]/[[fleet.workload]] tables, or sweep = NAME|PATH "
                    "taking a sweep spec's topologies and caches). Each batch is written to "
                    "the storage in one go. SPEC is a TOML file or a built-in name "
                    "(tune_quick, tune_dynamics, tune_sweep_quick).")
    p.add_argument("spec", metavar="SPEC", help="tune spec file or built-in name")
    p.add_argument("--trials", type=int, required=True, metavar="N", help="trials to add")
    p.add_argument("--batch", type=int, default=64, metavar="B",
                   help="trials asked and evaluated together (default 64)")
    p.add_argument("--storage", metavar="URL",
                   help="Optuna storage URL (sqlite:///..., postgresql://..., journal:PATH); "
                        "default: sqlite in the run directory")
    p.add_argument("--study", metavar="NAME", help="study name; resumes it when it exists")
    p.add_argument("--run-dir", metavar="DIR",
                   help="run directory (default runs/<study>) holding study.db")
    p.add_argument("--json", action="store_true",
                   help="print {study, storage, trials} as JSON; " + jsonout.NON_FINITE_HELP)
    p.set_defaults(func=_tune)


def _tune(args) -> int:
    from slabtune.commands.paths import output_dir
    from slabtune.errors import SlabtuneError
    from slabtune.tuner import study

    if args.trials < 0:
        raise SlabtuneError(f"--trials: {args.trials} is negative")
    if args.batch < 1:
        raise SlabtuneError(f"--batch: {args.batch} must be at least 1")
    if args.run_dir is not None:
        output_dir("--run-dir", args.run_dir)
    if args.study is not None:
        study.check_study_name(args.study)
    spec = study.load_spec(args.spec)
    runner, url = study.create_or_resume(spec, args.study, args.storage, args.run_dir)
    before = len(runner.study.trials)
    t0 = time.perf_counter()
    runner.run(args.trials, args.batch)
    dt = time.perf_counter() - t0
    total = len(runner.study.trials)
    if args.json:
        print(jsonout.dumps({"study": runner.study.study_name, "storage": url, "trials": total}))
    else:
        front = len(runner.study.best_trials)
        print(f"study {runner.study.study_name}: {total - before} trials added "
              f"({total} in all) in {dt:.1f} s; {front} on the Pareto front")
        print(f"storage {url}")
        print(next_hint(runner.study.study_name, args.storage, url), file=sys.stderr)
    return 0


def next_hint(study: str, storage: str | None, url: str) -> str:
    """The ``next:`` line after a study: a pasteable ``slabtune pareto`` command (every
    argument shell-quoted), or, for an in-memory study, that it is gone."""
    from slabtune.tuner.study import is_in_memory_url

    if is_in_memory_url(url):
        return ("note: the study lived in memory (--storage memory:) and is gone now that "
                "this process ends; use a file storage to keep it")
    argv = ["slabtune", "pareto", "--study", study] + (["--storage", url] if storage else [])
    return "next: " + shlex.join(argv)

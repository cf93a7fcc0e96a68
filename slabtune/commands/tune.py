"""``slabtune tune SPEC``: run (or resume) an Optuna study over SLUB policies.

Trials are asked ``--batch`` at a time, each batch is evaluated in one vectorised model call
and written to the storage in one go.  Storage defaults to ``runs/<study>/study.db``; ``--storage`` takes any Optuna storage
URL or ``journal:PATH``; ``--study NAME`` resumes an existing study with the same spec.
"""

from __future__ import annotations

import json
import sys
import time


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
                   help="print {study, storage, trials} as JSON")
    p.set_defaults(func=_tune)


def _tune(args) -> int:
    from slabtune.errors import SlabtuneError
    from slabtune.tuner import study

    if args.trials < 0:
        raise SlabtuneError(f"--trials: {args.trials} is negative")
    if args.batch < 1:
        raise SlabtuneError(f"--batch: {args.batch} must be at least 1")
    spec = study.load_spec(args.spec)
    runner, url = study.create_or_resume(spec, args.study, args.storage, args.run_dir)
    before = len(runner.study.trials)
    t0 = time.perf_counter()
    runner.run(args.trials, args.batch)
    dt = time.perf_counter() - t0
    total = len(runner.study.trials)
    if args.json:
        print(json.dumps({"study": runner.study.study_name, "storage": url, "trials": total}))
    else:
        front = len(runner.study.best_trials)
        print(f"study {runner.study.study_name}: {total - before} trials added "
              f"({total} in all) in {dt:.1f} s; {front} on the Pareto front")
        print(f"storage {url}")
        print(f"next: slabtune pareto --study {runner.study.study_name}"
              + (f" --storage {url}" if args.storage else ""), file=sys.stderr)
    return 0

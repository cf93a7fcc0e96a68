"""``slabtune validate``: check candidate policies against real kernels, and
``slabtune validate report RUN``: the error report of such a run.

Dispatch and the validators live in :mod:`slabtune.validate`, the report in
:mod:`slabtune.validate.report`; this module parses arguments and prints.
"""

from __future__ import annotations

import shlex
import sys

from slabtune.commands import jsonout


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "validate", help="run candidates against real kernels (qemu guests, the host, the "
                         "native allocator) and store measured beside predicted values",
        description="Validate candidates: every (candidate, topology) pair becomes a Ray task "
                    "per target (guest: qemu boots with the candidate's boot parameters; host: "
                    "this machine's kernel, baseline only; native: the userspace allocator; "
                    "lab: the lab kernels under qemu with SLUB_STATS; uml: the real 7.2 "
                    "allocator timed natively in User Mode Linux, on the topologies UML can "
                    "express, the others skipped with their reason). "
                    "The baseline (kernel defaults) is always included. "
                    "'slabtune validate report RUN [--json] [--repredict]' prints the error "
                    "report of a run; 'slabtune validate --resume RUN' finishes an "
                    "interrupted one. "
                    "Exit 0 when every task completed, 1 when some failed, 2 on bad input.")
    p.add_argument("action", nargs="?", choices=("report",),
                   help="'report': print the error report of RUN")
    p.add_argument("run_ref", nargs="?", metavar="RUN",
                   help="(report) a validation run directory, run id or unique prefix")
    src = p.add_argument_group("candidates (one of)")
    src.add_argument("--study", metavar="NAME",
                     help="take trials of this study (with --top K or --spread K)")
    src.add_argument("--run", metavar="RUN_DIR", dest="tune_run",
                     help="take trials of the study in this tune run directory "
                          "(with --top K or --spread K)")
    src.add_argument("--candidate", metavar="FILE",
                     help="candidates from a TOML/JSON file ([[candidate]] id, boot, knobs)")
    p.add_argument("--top", type=int, metavar="K",
                   help="(with --study/--run) the K Pareto trials with the largest summed "
                        "relative gain over the baseline on memory and time")
    p.add_argument("--spread", type=int, metavar="K",
                   help="(with --study/--run; instead of --top) K trials spread over the "
                        "Pareto front: the lowest-memory one, the lowest-time one, and the "
                        "rest evenly spaced by rank along the front sorted by memory (ties by "
                        "trial number); a point whose validated configuration (boot "
                        "parameters and the per-cache values validation applies to the "
                        "spec's workload caches) equals one already picked is skipped for the "
                        "next along the front; fewer than K only when the front has fewer "
                        "distinct configurations (the count is printed)")
    p.add_argument("--storage", metavar="URL", help="Optuna storage URL of the study")
    p.add_argument("--topologies", metavar="SPEC",
                   help="validation spec file or built-in name (validate_quick)")
    p.add_argument("--target", metavar="guest|host|native|lab|uml",
                   help="target(s), comma separated (default: every target this machine can run)")
    p.add_argument("--uml-runs", type=int, metavar="K",
                   help="(uml) timed UML runs per pair, in rounds interleaved over the pairs; "
                        "the measured figure is their median (default 11)")
    p.add_argument("--uml-ops", type=int, metavar="N",
                   help="(uml) operations per allocating worker of a UML run (default 200000)")
    p.add_argument("--uml-max-cpus", type=int, metavar="N",
                   help="(uml) the most virtual CPUs a pair may have (default: the host cores "
                        "this process may use; never more than the UML kernel's NR_CPUS); "
                        "topologies above it are skipped with that reason")
    p.add_argument("--resume", metavar="RUN",
                   help="finish an interrupted validation run: only its tasks not done run "
                        "(a uml pair keeps its finished rounds); takes the run's candidates, "
                        "spec and targets")
    p.add_argument("--repredict", action="store_true",
                   help="(report) compute the uml rows' predictions again with today's model "
                        "from the documents stored with the run, beside the stored times")
    p.add_argument("--cost", metavar="FILE",
                   help="(report --repredict) a cost file whose constants override the "
                        "packaged ones for the new predictions")
    p.add_argument("--ray-address", metavar="ADDR", help="Ray cluster address (default: a local "
                   "instance, or RAY_ADDRESS)")
    p.add_argument("--out", default="runs", metavar="DIR", help="where run directories go")
    p.add_argument("--timeout", type=float, metavar="S",
                   help="override the spec's guest boot timeout (seconds)")
    p.add_argument("--json", action="store_true", help="print JSON; " + jsonout.NON_FINITE_HELP)
    p.set_defaults(func=_validate)


def _validate(args) -> int:
    from slabtune.errors import SlabtuneError

    if args.action == "report":
        return _report(args)
    if args.run_ref is not None:
        raise SlabtuneError(f"validate: unexpected argument {args.run_ref!r} "
                            "(did you mean 'validate report RUN'?)")
    from slabtune.commands.paths import input_file, output_dir
    from slabtune.validate import candidates, dispatch, plan, uml
    from slabtune.validate import spec as validate_spec

    for flag, v in (("--repredict", args.repredict), ("--cost", args.cost)):
        if v:
            raise SlabtuneError(f"{flag}: only with 'validate report RUN'")
    uml_opts = uml.check_options(args.uml_runs, args.uml_ops, args.uml_max_cpus)
    if args.resume is not None:
        extra = [n for n, v in (("--study", args.study), ("--run", args.tune_run),
                                ("--candidate", args.candidate), ("--top", args.top),
                                ("--spread", args.spread), ("--topologies", args.topologies),
                                ("--target", args.target), ("--uml-runs", args.uml_runs),
                                ("--uml-ops", args.uml_ops),
                                ("--uml-max-cpus", args.uml_max_cpus)) if v is not None]
        if extra:
            raise SlabtuneError(f"--resume: {extra[0]} does not apply (a resumed run keeps "
                                "its own)")
        if args.timeout is not None and not 0 < args.timeout <= 3600:
            raise SlabtuneError(f"--timeout: {args.timeout} is outside (0, 3600]")
        res = dispatch.resume(args.resume, out_dir=args.out, ray_address=args.ray_address,
                              timeout_s=args.timeout)
        return _done(args, res, None)

    if bool(args.candidate) + bool(args.study or args.tune_run) != 1:
        raise SlabtuneError("candidates: give exactly one of --study NAME, --run RUN_DIR "
                            "(each with --top K or --spread K), --candidate FILE")
    if args.top is not None and args.spread is not None:
        raise SlabtuneError("--spread: give either --top K or --spread K, not both")
    for flag, k in (("--top", args.top), ("--spread", args.spread)):
        if k is not None:
            candidates.check_count(flag, k)
    if args.topologies is None:
        raise SlabtuneError("--topologies: required (a spec file or validate_quick)")
    if args.timeout is not None and not 0 < args.timeout <= 3600:
        raise SlabtuneError(f"--timeout: {args.timeout} is outside (0, 3600]")
    output_dir("--out", args.out)
    if args.candidate:
        input_file("--candidate", args.candidate)
    spec = validate_spec.load_spec(args.topologies)
    targets = plan.parse_targets(args.target)
    if args.candidate:
        for flag, k in (("--top", args.top), ("--spread", args.spread)):
            if k is not None:
                raise SlabtuneError(f"{flag}: only with --study or --run")
        cands = candidates.load_candidate_file(args.candidate, spec.fleet.profile)
        source = f"file {args.candidate}"
    else:
        if args.top is None and args.spread is None:
            raise SlabtuneError("--top: --top K or --spread K required with --study or --run")
        from slabtune.tuner import study as studies

        study = studies.load_study(args.study, args.storage, args.tune_run)
        if args.spread is not None:
            cands, front = candidates.spread_candidates(study, args.spread, spec)
            source = f"study {study.study_name} spread {args.spread}"
            if len(cands) < args.spread:
                print(f"spread: the Pareto front has {front} points and {len(cands)} distinct "
                      f"validated configurations, fewer than {args.spread}: taking "
                      f"{len(cands)}", file=sys.stderr)
            print(f"spread: {', '.join(c.id for c in cands)}", file=sys.stderr)
        else:
            cands = candidates.candidates_from_study(study, args.top)
            source = f"study {study.study_name} top {args.top}"
    res = dispatch.validate(cands, spec, targets, out_dir=args.out, ray_address=args.ray_address,
                            timeout_s=args.timeout, source=source, uml_opts=uml_opts)
    return _done(args, res, f"validated {len(candidates.with_baseline(cands))} candidates on "
                            f"{len(spec.fleet.topologies)} topologies ({', '.join(targets)})")


def _done(args, res, what: str | None) -> int:
    if args.json:
        print(jsonout.dumps({"run_dir": str(res.run_dir), "tasks": res.tasks,
                             "failed": res.failed}))
    else:
        print(f"{what or 'resumed'}: {res.tasks} tasks, {res.failed} failed")
        print(f"run {res.run_dir}")
        print("next: " + shlex.join(["slabtune", "validate", "report", str(res.run_dir)]),
              file=sys.stderr)
    return 1 if res.failed else 0


def _report(args) -> int:
    from slabtune.commands.paths import input_dir, input_file
    from slabtune.errors import SlabtuneError
    from slabtune.results import store
    from slabtune.validate import report

    if args.run_ref is None:
        raise SlabtuneError("validate report: give RUN (a validation run directory)")
    extra = [n for n, v in (("--study", args.study), ("--run", args.tune_run),
                            ("--candidate", args.candidate), ("--top", args.top),
                            ("--spread", args.spread),
                            ("--topologies", args.topologies), ("--target", args.target),
                            ("--uml-runs", args.uml_runs), ("--uml-ops", args.uml_ops),
                            ("--uml-max-cpus", args.uml_max_cpus),
                            ("--resume", args.resume)) if v is not None]
    if extra:
        raise SlabtuneError(f"validate report: {extra[0]} does not apply to a report")
    if args.cost is not None and not args.repredict:
        raise SlabtuneError("--cost: only with --repredict")
    input_dir("--out", args.out)
    if args.cost is not None:
        input_file("--cost", args.cost)
    run = store.resolve_run(args.run_ref, args.out)
    rep = report.report(run, repredict=args.repredict, cost=args.cost)
    if args.json:
        print(jsonout.dumps(rep, default=str))
    else:
        print(report.format_report(rep))
    return 0

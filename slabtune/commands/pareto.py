"""``slabtune pareto``: the non-dominated policies of a tune study (or configurations of a
sweep run) with both objectives, what deploying each takes (its reach) and per-topology
gains against the baseline."""

from __future__ import annotations

from pathlib import Path

from slabtune.commands import jsonout


def register(subparsers) -> None:
    p = subparsers.add_parser("pareto", help="print the Pareto front of a study or sweep run")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--study", metavar="NAME", help="tune study name")
    src.add_argument("--run", metavar="RUN_DIR",
                     help="a tune run directory (with study.db) or a sweep run directory")
    p.add_argument("--storage", metavar="URL", help="storage URL (default: the run's study.db)")
    p.add_argument("--json", action="store_true",
                   help='print {"baseline": {...}, "collapsed": N, "reach": {REACH: count}, '
                        '"points": [{trial, memory, time, reach, settings, params, knobs, '
                        'inert, same_as, gains}]}; reach is boot, sysfs, boot+sysfs (a stock '
                        'kernel takes it) or kernel (needs a rebuilt kernel); points with '
                        'equal objectives are collapsed into the one changing the fewest '
                        'knobs (same_as: the others); ' + jsonout.NON_FINITE_HELP)
    p.set_defaults(func=_pareto)


def _pareto(args) -> int:
    from slabtune.errors import SlabtuneError
    from slabtune.results import pareto

    if args.run and not args.storage and not (Path(args.run) / "study.db").is_file():
        if not Path(args.run).is_dir():
            raise SlabtuneError(f"run: {args.run} is not a directory")
        df = pareto.run_pareto(args.run)
        if args.json:
            print(jsonout.dumps({"run": str(args.run), "points": df.to_dicts()}, default=str))
        else:
            print(df)
        return 0
    from slabtune.tuner import study as studies

    study = studies.load_study(args.study, args.storage, args.run)
    rep = studies.front_report(study)
    if args.json:
        keys = ("trial", "memory", "time", "reach", "settings", "params", "knobs", "inert",
                "same_as", "gains")
        print(jsonout.dumps({"study": rep["study"], "baseline": rep["baseline"],
                             "collapsed": rep["collapsed"],
                             "reach": pareto.reach_counts(rep["points"]),
                             "legend": rep["legend"],
                             "points": [{k: p[k] for k in keys} for p in rep["points"]]}))
    else:
        print(pareto.format_table(rep))
    return 0

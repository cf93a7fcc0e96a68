"""``slabtune results list`` and ``slabtune results show RUN``: summarise stored runs.

The store is :mod:`slabtune.results.store` (polars, never JAX).
"""

from __future__ import annotations

import argparse
import sys

from slabtune.commands import jsonout


def register(subparsers) -> None:
    res = subparsers.add_parser("results", help="list and summarise stored sweep runs")
    sub = res.add_subparsers(dest="results_command", metavar="ACTION")
    res.set_defaults(func=lambda args: _help(res))

    ls = sub.add_parser("list", help="one line per run under --out")
    ls.add_argument("--out", default="runs", metavar="DIR", help="run directories (default: runs)")
    ls.add_argument("--json", action="store_true",
                    help="print a JSON list; " + jsonout.NON_FINITE_HELP)
    ls.set_defaults(func=_list)

    sh = sub.add_parser("show", help="manifest summary, columns and value ranges of one run")
    sh.add_argument("run", metavar="RUN", help="a run directory, id or unique id prefix")
    sh.add_argument("--out", default="runs", metavar="DIR", help="run directories (default: runs)")
    sh.add_argument("--head", type=int, default=5, metavar="N", help="rows to print (default 5)")
    sh.add_argument("--json", action="store_true",
                    help="print one JSON object; " + jsonout.NON_FINITE_HELP)
    sh.set_defaults(func=_show)


def _help(parser: argparse.ArgumentParser) -> int:
    parser.print_help(sys.stderr)
    return 2


def _list(args) -> int:
    """One line per run; a damaged run (unreadable or edited manifest) gets a line of its
    own saying what is wrong, and the others are listed as usual."""
    from slabtune.commands.paths import input_dir
    from slabtune.results import store

    input_dir("--out", args.out)
    rows, damaged = [], []
    for run, err in store.scan_runs(args.out):
        if run is not None:
            try:
                rows.append(run.summary())
                continue
            except (KeyError, TypeError, ValueError, OSError) as e:
                err = f"{run.path}: manifest field {e} is missing or malformed"
        damaged.append(err)
    if args.json:
        print(jsonout.dumps(rows + [{"state": "damaged", "error": e} for e in damaged]))
        return 0
    if not rows and not damaged:
        print(f"no runs under {args.out}")
        return 0
    for r in rows:
        print(f"{r['run_id']}  {r['state']:8s}  rows {r['rows']:>9d}  chunks "
              f"{r['chunks_done']}/{r['chunks']}  {r['evaluator']}  started {r['started']}")
    for e in damaged:
        print(f"damaged: {e}")
    return 0


def _num(v) -> str:
    return f"{v:.6g}" if isinstance(v, float) else str(v)


def _show(args) -> int:
    import polars as pl

    from slabtune.commands.paths import input_dir
    from slabtune.results import store

    input_dir("--out", args.out)
    run = store.resolve_run(args.run, args.out)
    run.verify()             # a truncated or edited part is one line naming it
    summary = run.summary()
    lf = run.scan()
    schema = dict(lf.collect_schema()) if run.done_chunks() else run.schema()
    ranges = {}
    if run.rows:
        ints = [c for c, t in schema.items() if t.is_numeric()]
        if ints:
            agg = lf.select([pl.col(c).min().alias(f"{c}:min") for c in ints]
                            + [pl.col(c).max().alias(f"{c}:max") for c in ints]).collect().row(0)
            n = len(ints)
            ranges = {c: [agg[k], agg[k + n]] for k, c in enumerate(ints)}
    if args.json:
        summary["columns"] = {c: str(t) for c, t in schema.items()}
        summary["ranges"] = ranges
        summary["versions"] = run.manifest.get("versions")
        print(jsonout.dumps(summary))
        return 0
    for k in ("run_id", "run_dir", "spec", "spec_hash", "evaluator", "state", "rows",
              "parquet_bytes", "started", "ended", "devices", "git_revision"):
        print(f"{k}: {summary[k]}")
    print(f"chunks: {summary['chunks_done']}/{summary['chunks']} done")
    print("columns:")
    for c, t in schema.items():
        extra = f"  {_num(ranges[c][0])}..{_num(ranges[c][1])}" if c in ranges else ""
        if isinstance(t, pl.Enum):
            cats = list(t.categories)
            extra = f"  {len(cats)} values: {', '.join(cats[:6])}{' ...' if len(cats) > 6 else ''}"
        print(f"  {c}: {'enum' if isinstance(t, pl.Enum) else str(t).lower()}{extra}")
    if run.rows and args.head > 0:
        with pl.Config(tbl_rows=args.head, tbl_cols=-1, tbl_width_chars=160):
            print(lf.head(args.head).collect())
    return 0

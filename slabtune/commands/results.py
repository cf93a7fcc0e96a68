"""``slabtune results list``, ``results show RUN`` and ``results export --study NAME``:
summarise stored runs and tune studies, and write a study's trials as parquet.

The store is :mod:`slabtune.results.store` (polars, never JAX); studies are read through
:mod:`slabtune.tuner.catalog` (Optuna, imported only when a study is there to read).
"""

from __future__ import annotations

import argparse
import sys

from slabtune.commands import jsonout


def register(subparsers) -> None:
    res = subparsers.add_parser("results", help="list and summarise stored runs and tune "
                                                "studies; export a study as parquet")
    sub = res.add_subparsers(dest="results_command", metavar="ACTION")
    res.set_defaults(func=lambda args: _help(res))

    ls = sub.add_parser("list", help="one line per run and per tune study under --out",
                        description="One line per run directory under --out (sweep, "
                                    "validate, lab: its state, rows and chunks, and for a "
                                    "failed run the error it recorded) and per tune study "
                                    "(a run directory holding study.db, and the studies of "
                                    "--storage: trials by state and the front's size).")
    ls.add_argument("--out", default="runs", metavar="DIR", help="run directories (default: runs)")
    ls.add_argument("--storage", metavar="URL",
                    help="also list the studies of this Optuna storage (sqlite:///..., "
                         "postgresql://..., journal:PATH)")
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

    ex = sub.add_parser(
        "export", help="write every trial of a tune study to a parquet file",
        description="Write every trial of a tune study as one parquet row: trial, state, one "
                    "column per searched knob, the objectives memory and time, memory@T and "
                    "time@T per fleet topology T, regression_excess and feasible, pareto, "
                    "reach and not_steady. Each column carries its unit and meaning as "
                    "arrow field metadata (unit, doc; docs/SPECS.md 'Stored columns'). The "
                    "file is written whole or not at all.")
    src = ex.add_mutually_exclusive_group(required=True)
    src.add_argument("--study", metavar="NAME", help="tune study name")
    src.add_argument("--run", metavar="RUN_DIR", help="tune run directory (with study.db)")
    ex.add_argument("--storage", metavar="URL", help="storage URL (default: the run's study.db)")
    ex.add_argument("--out", required=True, metavar="FILE.parquet", help="file to write")
    ex.add_argument("--json", action="store_true",
                    help="print {study, out, trials, columns} as JSON")
    ex.set_defaults(func=_export)


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
                rows.append({"kind": "run", **run.summary()})
                continue
            except (KeyError, TypeError, ValueError, OSError) as e:
                err = f"{run.path}: manifest field {e} is missing or malformed"
        damaged.append(err)
    found, bad = _studies(args.out, args.storage)
    damaged += bad
    if args.json:
        print(jsonout.dumps(rows + found + [{"state": "damaged", "error": e} for e in damaged]))
        return 0
    if not rows and not found and not damaged:
        print(f"no runs or studies under {args.out}")
        return 0
    for r in rows:
        print(f"{r['run_id']}  {r['state']:8s}  rows {r['rows']:>9d}  chunks "
              f"{r['chunks_done']}/{r['chunks']}  {r['evaluator']}  started {r['started']}")
        if r["error"]:
            more = f" ({r['errors']} chunks recorded errors)" if r["errors"] > 1 else ""
            print(f"    error{more}: {_cut(r['error'])}")
    for r in found:
        states = ", ".join(f"{k} {v}" for k, v in sorted(r["states"].items()))
        where = r.get("run_dir") or r["storage"]
        what = (f"spec {r['spec']}, profile {r['profile']}" if r["slabtune"]
                else "not a slabtune study")
        print(f"study {r['study']}  trials {r['trials']} ({states or 'none'})  front "
              f"{r['front']}  {what}  {where}")
    for e in damaged:
        print(f"damaged: {e}")
    return 0


def _cut(text: str, limit: int = 300) -> str:
    """An error as one line of at most ``limit`` characters."""
    from slabtune.results.export import one_line

    return one_line(" | ".join(str(text).split("\n")), limit)


def _studies(out: str, storage: str | None) -> tuple[list[dict], list[str]]:
    """The studies of the tune run directories under ``out`` (and of ``storage``), and the
    databases that could not be read; Optuna is imported only when there is one."""
    from pathlib import Path

    from slabtune.tuner.study import DB_NAME

    base = Path(out)
    has_db = base.is_dir() and any((d / DB_NAME).exists() for d in base.iterdir()
                                   if d.is_dir())
    if not has_db and storage is None:
        return [], []
    from slabtune.tuner import catalog

    found, damaged = [], []
    for r, err in catalog.run_dir_studies(out) if has_db else []:
        if r is None:
            damaged.append(err)
        else:
            found.append(r)
    if storage is not None:
        found += catalog.storage_studies(storage)
    return found, damaged


def _num(v) -> str:
    return f"{v:.6g}" if isinstance(v, float) else str(v)


def _show(args) -> int:
    import polars as pl

    from slabtune.commands.paths import input_dir
    from slabtune.results import columns, store

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
        summary["units"] = {c: d.unit for c in schema if (d := columns.part_column(c))}
        summary["ranges"] = ranges
        summary["versions"] = run.manifest.get("versions")
        print(jsonout.dumps(summary))
        return 0
    for k in ("run_id", "run_dir", "spec", "spec_hash", "evaluator", "state", "rows",
              "parquet_bytes", "started", "ended", "devices", "git_revision"):
        print(f"{k}: {summary[k]}")
    print(f"chunks: {summary['chunks_done']}/{summary['chunks']} done")
    if summary["error"]:
        print(f"error ({summary['errors']} chunks recorded one; the first): "
              f"{_cut(summary['error'])}")
    print("columns:")
    for c, t in schema.items():
        extra = f"  {_num(ranges[c][0])}..{_num(ranges[c][1])}" if c in ranges else ""
        if isinstance(t, pl.Enum):
            cats = list(t.categories)
            extra = f"  {len(cats)} values: {', '.join(cats[:6])}{' ...' if len(cats) > 6 else ''}"
        doc = columns.part_column(c)
        unit = f"  [{doc.unit}]" if doc is not None and doc.unit != "-" else ""
        print(f"  {c}: {'enum' if isinstance(t, pl.Enum) else str(t).lower()}{extra}{unit}")
    if run.rows and args.head > 0:
        with pl.Config(tbl_rows=args.head, tbl_cols=-1, tbl_width_chars=160):
            print(lf.head(args.head).collect())
    return 0


def _export(args) -> int:
    from slabtune.commands.paths import output_file
    from slabtune.results import columns, export
    from slabtune.tuner import catalog
    from slabtune.tuner import study as studies

    output_file("--out", args.out)
    study = studies.load_study(args.study, args.storage, args.run)
    df, knob_docs = catalog.trials_frame(study)
    meta = columns.field_metadata(df.columns,
                                  lambda n: columns.study_column(n, knob_docs))
    url, _ = studies.resolve_storage(study.study_name, args.storage, args.run, create=False)
    info = {"slabtune_study": study.study_name, "slabtune_storage": studies.shown_url(url),
            "slabtune_spec": str(study.user_attrs.get(studies.ATTR_SPEC, "")),
            "slabtune_baseline": jsonout.dumps(study.user_attrs.get(studies.ATTR_BASELINE))}
    path = export.write_parquet(df, args.out, meta, "--out", info)
    complete = int((df["state"] == "complete").sum())
    if args.json:
        print(jsonout.dumps({"study": study.study_name, "out": str(path), "trials": df.height,
                             "complete": complete, "columns": df.columns}))
    else:
        print(f"wrote {df.height} trials ({complete} complete) of study {study.study_name} "
              f"to {path}: {df.width} columns, each with its unit")
    return 0

"""``slabtune sweep run`` and ``slabtune sweep plan``: batch-evaluate a grid from a spec.

The handlers parse arguments and print; specs live in :mod:`slabtune.sweeps.spec`, the run
in :mod:`slabtune.sweeps.runner` (imported lazily: it pulls in polars and, in its tasks,
JAX and Ray).
"""

from __future__ import annotations

import argparse
import sys

from slabtune.commands import jsonout
from slabtune.errors import SlabtuneError


def register(subparsers) -> None:
    sweep = subparsers.add_parser("sweep", help="evaluate a grid of configurations from a spec")
    sub = sweep.add_subparsers(dest="sweep_command", metavar="ACTION")
    sweep.set_defaults(func=lambda args: _help(sweep))

    r = sub.add_parser("run", help="run (or resume) a sweep and store its rows as parquet")
    r.add_argument("spec", metavar="SPEC",
                   help="a spec file or a built-in name "
                        "(quick, fleet, fleet_xl, seeds, memoryless)")
    r.add_argument("--out", default="runs", metavar="DIR",
                   help="directory that holds run directories (default: runs)")
    r.add_argument("--ray-address", default=None, metavar="ADDR",
                   help="run on this Ray cluster (default: $RAY_ADDRESS, else a local Ray)")
    r.add_argument("--resume", default=None, metavar="RUN",
                   help="continue an interrupted run (its directory, id or id prefix)")
    r.add_argument("--json", action="store_true",
                   help="print one JSON object {run_dir, rows, ...} instead of text; "
                        + jsonout.NON_FINITE_HELP)
    r.add_argument("--quiet", action="store_true", help="no progress output")
    r.set_defaults(func=_run)

    p = sub.add_parser("plan", help="print grid size, chunks and estimated memory; run nothing")
    p.add_argument("spec", metavar="SPEC", help="a spec file or a built-in name")
    p.add_argument("--json", action="store_true",
                   help="print one JSON object {configs, chunks, est_memory_bytes, refused, ...}; "
                        + jsonout.NON_FINITE_HELP)
    p.set_defaults(func=_plan)


def _help(parser: argparse.ArgumentParser) -> int:
    parser.print_help(sys.stderr)
    return 2


def _load(ref: str):
    from slabtune.sweeps import spec as sweep_spec

    spec = sweep_spec.load(ref)
    if sweep_spec._is_builtin(ref):
        import os

        if not os.path.exists(ref):
            return spec, sweep_spec.builtin_path(ref).read_text()
    return spec, sweep_spec.read_text_file(ref, "spec")


def _where(ref: str) -> str:
    """How errors name a spec: its file name, or ``NAME.toml`` for a built-in."""
    import os

    return os.path.basename(ref) if os.path.exists(ref) or ref.endswith(".toml") else f"{ref}.toml"


def _run(args) -> int:
    from slabtune.commands.paths import output_dir
    from slabtune.sweeps import runner

    output_dir("--out", args.out)
    spec, text = _load(args.spec)
    try:
        runner.check_runnable(spec)
    except SlabtuneError as err:
        raise SlabtuneError(f"{_where(args.spec)}: {err}") from None
    res = runner.run_sweep(spec, args.out, spec_text=text, ray_address=args.ray_address,
                           resume=args.resume, progress=not (args.quiet or args.json))
    if args.json:
        print(jsonout.dumps({"run_dir": str(res.run_dir), "rows": res.rows,
                             "chunks_run": res.chunks_run, "chunks": res.chunks_total,
                             "seconds": round(res.seconds, 3), "devices": res.devices,
                             "timings": {"ray_start_s": round(res.ray_start_s, 3),
                                         "model_s": round(res.model_s, 3),
                                         "grid_s": round(res.grid_s, 3),
                                         "write_s": round(res.write_s, 3)}}))
    else:
        print(f"run_dir: {res.run_dir}")
        print(f"rows: {res.rows}")
    return 0


def _human_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def _plan(args) -> int:
    import dataclasses

    from slabtune.sweeps import runner
    from slabtune.sweeps import spec as sweep_spec

    spec, _ = _load(args.spec)
    p = runner.plan(spec)
    if p.refused is None:
        try:                                 # the chunk bound (model.limits), as run checks it
            sweep_spec.check_grid_size(spec)
        except sweep_spec.SpecError as err:
            p = dataclasses.replace(p, refused=str(err))
    if args.json:
        print(jsonout.dumps({"spec": spec.name, "spec_hash": spec.hash,
                             "evaluator": spec.evaluator,
                             "configs": p.configs, "product": p.product, "chunks": p.chunks,
                             "chunk_size": p.chunk_size, "bucket": p.bucket,
                             "est_memory_bytes": p.est_memory_bytes,
                             "est_memory_parts": p.memory_parts,
                             "max_configs": p.max_configs, "refused": p.refused,
                             "axes": {a.name: len(a) for a in spec.axes},
                             "columns": [c[0] for c in p.columns]}))
        return 0
    print(f"spec: {spec.name} ({spec.evaluator}, hash {spec.hash[:12]})")
    print("axes: " + " x ".join(f"{a.name}[{len(a)}]" for a in spec.axes))
    print(_configs_line(p))
    print(f"chunks: {p.chunks} of {p.chunk_size} (compiled shape {p.bucket})")
    m = p.memory_parts
    print(f"est_memory: {_human_bytes(p.est_memory_bytes)} (Ray {_human_bytes(m['ray'])} + "
          f"driver {_human_bytes(m['driver'])} + {m['workers']} workers x "
          f"{_human_bytes(m['per_worker'])}, resident sets summed)")
    print(f"limit: {p.max_configs} configurations per sweep run")
    if p.refused:
        print(f"refused: sweep run would refuse this grid: {p.refused}")
    return 0


def _configs_line(p) -> str:
    """``configs: N`` with the excluded count, or the product when it was not counted."""
    if p.configs is None:
        return f"configs: {p.product} before exclusions (not counted: over the limit)"
    excluded = p.product - p.configs
    return f"configs: {p.configs}" + (f" ({excluded} of {p.product} excluded)" if excluded else "")

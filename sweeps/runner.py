"""The sweep runner: spec -> grid chunks -> model (Ray tasks) -> parquet parts + manifest.

Data flows one way: the grid expands chunk ``i`` lazily inside its task, the evaluator turns
it into metric columns, :func:`frame` makes them a polars frame (axis columns first, string
axes as ``Enum``, then the metrics) and the store writes it as part ``i``: in the task
itself when its worker shares this host's filesystem, else in the driver from the returned
arrays.  The driver marks each part done.  A resumed run skips the chunks its manifest
marks done.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path

import numpy as np
import polars as pl

from slabtune.errors import SlabtuneError
from slabtune.results import store
from slabtune.sweeps import grid
from slabtune.sweeps.evaluators import EVALUATORS
from slabtune.sweeps.progress import Progress
from slabtune.sweeps.spec import (
    MAX_GRID_ROWS,
    SpecError,
    SweepSpec,
    check_grid_size,
    over_grid_limit,
)

#: Test hook: SIGKILL the driver itself after writing this many parts (see tests).
KILL_AFTER_ENV = "SLABTUNE_TEST_KILL_AFTER_CHUNKS"
#: Bytes a worker keeps live per row and per int32 column while it evaluates and writes a
#: chunk (inputs, outputs, XLA temporaries of the unrolled order search, the frame and the
#: parquet encoder), in units of 4 bytes.  Structural: measured 280-290 B per row over
#: 26 columns (fleet_xl, chunks of 2^18..2^22 rows), so 3; dynamics: not measured, kept
#: at the old 8.
_WORK_FACTOR = {"structural": 3}
_WORK_FACTOR_DEFAULT = 8
#: A worker's resident memory before its first chunk (Python, JAX, XLA runtime, polars).
_WORKER_BASE = 300 << 20
#: The driver (Python, polars, Ray's client) and a local Ray's own daemons (GCS, raylet,
#: agents), resident, as measured on a fleet_xl run (260 MB and 470 MB).
_DRIVER_BASE = 300 << 20
_RAY_DAEMONS = 500 << 20


@dataclasses.dataclass
class SweepResult:
    """What a finished (or resumed-to-completion) sweep reports."""

    run_dir: Path
    rows: int
    chunks_run: int
    chunks_total: int
    seconds: float
    model_s: float
    grid_s: float
    write_s: float
    ray_start_s: float
    devices: list


@dataclasses.dataclass(frozen=True)
class Plan:
    """What ``sweep plan`` prints.  ``configs`` is None when the grid is over
    ``max_configs`` (not counted: counting walks the whole product); ``refused`` says why
    ``sweep run`` would refuse the grid (None when it would run it)."""

    configs: int | None
    product: int
    chunks: int
    chunk_size: int
    bucket: int
    est_memory_bytes: int
    columns: list
    #: ``{"ray", "driver", "workers", "per_worker"}``: the parts of ``est_memory_bytes``.
    memory_parts: dict = dataclasses.field(default_factory=dict)
    max_configs: int = MAX_GRID_ROWS
    refused: str | None = None


def output_columns(spec: SweepSpec) -> list:
    """``[(name, "int32"|"float32"|"enum", categories|None)]``: axes in order, then the
    metrics."""
    ev = EVALUATORS[spec.evaluator]
    cols = [(a.name, "int32", None) if a.kind is int else (a.name, "enum", list(a.values))
            for a in spec.axes]
    cols += [(m, ev.metric_dtype(m), None) for m in spec.metrics]
    return cols


def plan(spec: SweepSpec, workers: int | None = None) -> Plan:
    """Grid size, chunk count and an estimate of peak memory, without running anything.

    Memory, summed over the resident sets of every process of a local run: Ray's daemons,
    the driver, and one worker per CPU (at most one per chunk), each its base plus one
    chunk of ``bucket`` rows times every input, axis and metric column (int32) times the
    evaluator's working factor.  Workers write their own parts, so chunks waiting in
    Ray's queue hold no rows.
    """
    workers = max(1, min(workers or os.cpu_count() or 1, grid.n_chunks(spec)))
    b = grid.bucket(spec.chunk_size)
    ncols = len(spec.axes) + len(spec.defaults) + len(spec.metrics) + 8
    factor = _WORK_FACTOR.get(spec.evaluator, _WORK_FACTOR_DEFAULT)
    per_worker = _WORKER_BASE + b * 4 * ncols * factor
    parts = {"ray": _RAY_DAEMONS, "driver": _DRIVER_BASE, "workers": workers,
             "per_worker": per_worker}
    est = _RAY_DAEMONS + _DRIVER_BASE + workers * per_worker
    configs, refused = None, None
    if over_grid_limit(spec):
        refused = (f"{spec.product} configurations are over the limit of {MAX_GRID_ROWS} "
                   "per sweep")
    else:
        configs = grid.count_rows(spec)
        if configs == 0:
            refused = "every configuration is excluded or an impossible topology"
    return Plan(configs=configs, product=spec.product, chunks=grid.n_chunks(spec),
                chunk_size=spec.chunk_size, bucket=b, est_memory_bytes=int(est),
                columns=output_columns(spec), refused=refused, memory_parts=parts)


def check_runnable(spec: SweepSpec) -> None:
    """Refuse, before anything is allocated or written, a grid ``sweep run`` cannot do
    anything useful with: over :data:`MAX_GRID_ROWS` configurations, or none left after the
    exclusions and the impossible topologies (it would write a complete run of 0 rows)."""
    check_grid_size(spec)
    if grid.first_kept_row(spec) is None:
        raise SpecError(f"grid: every one of the {spec.product} configurations is excluded or "
                        "an impossible topology; nothing to run (check [[exclude]] and the "
                        "topology axes)")


def frame(spec: SweepSpec, columns: dict) -> pl.DataFrame:
    """A chunk's returned arrays as a polars frame in output order."""
    series = []
    for a in spec.axes:
        col = columns[a.name]
        if a.kind is int:
            series.append(pl.Series(a.name, col, dtype=pl.Int32))
        else:
            cats = pl.Series(a.name, list(a.values), dtype=pl.Enum(list(a.values)))
            series.append(cats.gather(np.asarray(col, np.int64)))
    ev = EVALUATORS[spec.evaluator]
    for m in spec.metrics:
        dtype = pl.Float32 if ev.metric_dtype(m) == "float32" else pl.Int32
        series.append(pl.Series(m, columns[m], dtype=dtype))
    return pl.DataFrame(series)


def package_versions() -> dict:
    """Versions of the packages that shape results, without importing them."""
    out = {"python": sys.version.split()[0]}
    for pkg in ("slabtune", "jax", "jaxlib", "numpy", "ray", "polars", "pyarrow"):
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            out[pkg] = None
    return out


def git_revision() -> str | None:
    """HEAD of the source checkout (with ``-dirty`` when it has local changes), or None."""
    root = Path(__file__).resolve().parent.parent
    try:
        rev = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True,
                             text=True, timeout=10)
        if rev.returncode != 0:
            return None
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "-uno"],
                               capture_output=True, text=True, timeout=10)
        return rev.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return None


def run_sweep(spec: SweepSpec, out_dir="runs", *, spec_text: str = "",
              ray_address: str | None = None, resume=None, progress: bool = True,
              progress_stream=None, fail_once_dir: str | None = None,
              max_in_flight: int | None = None) -> SweepResult:
    """Run (or resume) a sweep and return where its results are.

    ``resume`` names an earlier run (path, id or unique id prefix under ``out_dir``) of the
    same spec: its done chunks are kept, the rest computed.
    """
    t_start = time.perf_counter()
    from slabtune.sweeps.dispatch import (
        ChunkFailed,
        ray_session,
        run_chunks,
        workers_see,
    )

    check_runnable(spec)
    out_dir = os.path.abspath(out_dir)    # a cluster's workers do not share our cwd
    spec_dict = spec.to_dict()
    spec_dict["_hash"] = spec.hash
    if resume is not None:
        run = store.resolve_run(resume, out_dir)
        if run.manifest["spec_hash"] != spec.hash:
            raise SpecError(f"--resume: run {run.run_id} was made from a different spec "
                            f"(hash {run.manifest['spec_hash'][:12]}, this spec "
                            f"{spec.hash[:12]})")
    else:
        if spec.evaluator not in EVALUATORS:
            raise SpecError(f"sweep.evaluator: unknown evaluator {spec.evaluator!r}")
        run = store.create_run(out_dir, spec=spec.to_dict(), spec_hash=spec.hash,
                               spec_text=spec_text, n_chunks=grid.n_chunks(spec),
                               columns=output_columns(spec), versions=package_versions(),
                               git_revision=git_revision())
    kill_after = int(os.environ.get(KILL_AFTER_ENV, "0") or 0)
    model_s = grid_s = write_s = ray_start_s = 0.0
    chunks_run = 0
    with run.lock():
        run.clean_temporaries()
        done = run.done_chunks()          # grows with the work done, not with the grid
        n_pending = run.n_chunks - len(done)
        run.start_attempt(pid=os.getpid(), pending=n_pending,
                          ray_address=ray_address or os.environ.get("RAY_ADDRESS"))
        product = spec.product
        done_configs = sum(_chunk_product(spec, i) for i in done)
        prog = Progress(product, run.n_chunks, stream=progress_stream, enabled=progress,
                        done_configs=done_configs, done_chunks=len(done))
        devices = set(run.manifest.get("devices", []))
        if n_pending:
            t_ray = time.perf_counter()
            with ray_session(ray_address) as session:
                ray_start_s = time.perf_counter() - t_ray
                # Workers that see the run directory (this host's, or a shared file system
                # at the same path) write their parts themselves; where a node does not,
                # every task sends its columns back and the driver writes them.
                where = run.path.absolute()         # a --resume PATH may be relative
                part_dir = str(where) if workers_see(where) else None
                run.manifest["attempts"][-1]["workers_write_parts"] = part_dir is not None
                run.manifest["ray"] = session
                run.save()        # which Ray this attempt runs on, before any chunk is done
                results = run_chunks(spec_dict, run.iter_pending(), max_in_flight=max_in_flight,
                                     fail_once_dir=fail_once_dir, part_dir=part_dir)
                for res in _recording_failures(run, results, ChunkFailed):
                    t_w = time.perf_counter()
                    devices.add(res["device"])
                    run.manifest["devices"] = sorted(devices)
                    info = {"device": res["device"], "model_s": round(res["model_s"], 6)}
                    if "columns" in res:
                        run.write_part(res["index"], frame(spec, res["columns"]), **info)
                    else:
                        run.commit_part(res["index"], res["part"], res["rows"], **info,
                                        bytes=res["bytes"])
                        write_s += res["write_s"]
                    write_s += time.perf_counter() - t_w
                    model_s += res["model_s"]
                    grid_s += res["grid_s"]
                    chunks_run += 1
                    prog.update(res["n_product"])
                    if kill_after and chunks_run >= kill_after:
                        os.kill(os.getpid(), signal.SIGKILL)
        run.finish()
    return SweepResult(run_dir=run.path, rows=run.rows, chunks_run=chunks_run,
                       chunks_total=run.n_chunks, seconds=time.perf_counter() - t_start,
                       model_s=model_s, grid_s=grid_s, write_s=write_s,
                       ray_start_s=ray_start_s, devices=sorted(devices))


def _recording_failures(run, results, failure):
    """Pass results through; a chunk that failed for good is marked ``failed`` (with its
    error) in the manifest before the error propagates, so ``--resume`` retries it."""
    try:
        yield from results
    except failure as err:
        run.manifest["chunks"]["states"][str(err.index)] = {
            "state": "failed", "error": str(err), "when": store.now_iso()}
        run.save()
        raise


def _chunk_product(spec: SweepSpec, i: int) -> int:
    start = i * spec.chunk_size
    return max(0, min(spec.product, start + spec.chunk_size) - start)


def evaluate_local(spec: SweepSpec, indices=None) -> dict:
    """Evaluate chunks in this process without Ray or the store (benchmarks, tests):
    returns ``{"model_s", "grid_s", "rows"}``."""
    from slabtune.sweeps.dispatch import chunk_task

    d = spec.to_dict()
    d["_hash"] = spec.hash
    out = {"model_s": 0.0, "grid_s": 0.0, "rows": 0}
    for i in (range(grid.n_chunks(spec)) if indices is None else indices):
        res = chunk_task(d, i)
        out["model_s"] += res["model_s"]
        out["grid_s"] += res["grid_s"]
        out["rows"] += len(next(iter(res["columns"].values())))
    return out


__all__ = ["SweepResult", "Plan", "plan", "run_sweep", "frame", "output_columns",
           "evaluate_local", "SlabtuneError"]

"""``slabtune main``: the whole pipeline on embedded defaults, for README's first command.

Each stage prints a progress line as it starts and what it found when it ends; the paths of
everything written are listed at the end.  Heavy libraries are imported inside the stages so
``slabtune --help`` stays fast.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

#: CPU counts and caches of the order table printed after the sweep.
TABLE_CPUS = (1, 8, 64, 128, 256, 1024, 8192)
TABLE_CACHES = ("kmalloc-64", "kmalloc-256", "kmalloc-512", "kmalloc-1k", "kmalloc-4k",
                "maple_node", "task_struct")
TABLE_PROFILES = ("v5.10", "v5.11", "v6.18")


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "main", help="run the whole pipeline on embedded defaults (README's first command)",
        description="Check the model against this host's kernel, run the built-in quick sweep "
                    "on an in-process Ray and print its slab orders, run the built-in "
                    "tune_quick Optuna study (SQLite in the run directory), print its Pareto "
                    "front, draw it, and export the chosen policy's boot parameters; every "
                    "file written is listed at the end.")
    p.add_argument("--out", default="runs", metavar="DIR",
                   help="directory for run outputs (default: ./runs)")
    p.add_argument("--ray-address", metavar="ADDR", default=os.environ.get("RAY_ADDRESS"),
                   help="join this Ray cluster instead of starting one in-process")
    p.add_argument("--trials", type=int, default=256, metavar="N",
                   help="trials of the quick study (default 256)")
    p.add_argument("--batch", type=int, default=64, metavar="B",
                   help="trials evaluated per vectorised model call (default 64)")
    p.set_defaults(func=run)


def _stage(n: int, title: str) -> float:
    print(f"[{n}] {title} ...", flush=True)
    return time.perf_counter()


def _done(t0: float, what: str) -> None:
    print(f"    {what} ({time.perf_counter() - t0:.1f} s)", flush=True)


def host_check() -> tuple[str, bool]:
    """Snapshot this host's slab caches and check every one against the model."""
    from slabtune.kernel import check
    from slabtune.kernel.host import take_snapshot

    if not os.path.isdir("/sys/kernel/slab"):
        return "skipped: /sys/kernel/slab is not readable here", True
    result = check.check_snapshot(take_snapshot())
    lines = [result.summary()]
    for m in result.mismatches[:10]:
        lines.append(f"mismatch {m.cache}.{m.field}: kernel {m.kernel}, model {m.model}")
    return "\n    ".join(lines), result.ok


def order_table(run_dir: Path) -> str:
    """Slab order by cache and CPU count, one block per profile, from a sweep run."""
    import polars as pl

    from slabtune.results.store import open_run

    lf = open_run(run_dir).scan()
    df = (lf.filter(pl.col("min_order") == 0)
            .filter(pl.col("cpus").is_in(list(TABLE_CPUS)))
            .filter(pl.col("cache").cast(pl.Utf8).is_in(list(TABLE_CACHES)))
            .filter(pl.col("profile").cast(pl.Utf8).is_in(list(TABLE_PROFILES)))
            .select("profile", "cache", "cpus", "order")
            .collect())
    out = []
    head = "cache".ljust(14) + "".join(f"{c:>7}" for c in TABLE_CPUS)
    for prof in TABLE_PROFILES:
        out.append(f"slab order under {prof} (columns: CPUs; kmalloc caches count as created "
                   f"before SMP bring-up)" if prof == "v5.11" else f"slab order under {prof} "
                   f"(columns: CPUs)")
        out.append(head)
        sub = df.filter(pl.col("profile").cast(pl.Utf8) == prof)
        for cache in TABLE_CACHES:
            row = sub.filter(pl.col("cache").cast(pl.Utf8) == cache)
            by_cpus = dict(zip(row["cpus"].to_list(), row["order"].to_list()))
            out.append(cache.ljust(14) + "".join(f"{by_cpus.get(c, '-'):>7}" for c in TABLE_CPUS))
        out.append("")
    return "\n".join(out)


def pick_candidate(rep: dict, deployable=lambda point: True) -> dict | None:
    """The Pareto point to export.

    Users leave with boot parameters and sysfs values they can apply today, so points that
    ``deployable`` rejects (they need a kernel change) come last.  Among the rest: the
    fastest point that holds no more memory than the baseline, else the fastest one.
    ``None`` for an empty front.
    """
    points = rep["points"]
    if not points:
        return None
    base_mem = rep["baseline"]["memory"]
    return min(points, key=lambda p: (not deployable(p), p["memory"] > base_mem, p["time"],
                                      p["memory"], p["trial"]))


def tune_and_export(out: Path, trials: int, batch: int, written: list) -> None:
    """Stages 3-6: the quick study, its Pareto table, a chart, the exported policy."""
    import datetime as _dt

    from slabtune.results import charts, export, pareto
    from slabtune.results.safeio import write_atomic
    from slabtune.tuner import study

    spec = study.load_spec("tune_quick")
    name = f"main-{_dt.datetime.now(_dt.UTC).strftime('%Y%m%d-%H%M%S')}"
    run_dir = out / name
    t0 = _stage(3, f"tuning: {trials} trials of the built-in 'tune_quick' study, "
                   f"{batch} per model call, SQLite storage in {run_dir}")
    runner, url = study.create_or_resume(spec, name, None, run_dir)
    done = 0
    while done < trials:
        k = min(batch, trials - done)
        got = runner.run(k, batch)
        done += got
        if got < k:         # the sampler found nothing new to ask (StudyRunner.run)
            break
        print(f"    progress: {done}/{trials} trials, "
              f"{len(runner.study.best_trials)} on the Pareto front", flush=True)
    written.append(("Optuna study (SQLite)", run_dir / study.DB_NAME))
    _done(t0, f"study {name} in {url}")

    _stage(4, "Pareto front of memory overhead against modelled time per operation")
    rep = study.front_report(runner.study)
    print(pareto.format_table(rep))

    t0 = _stage(5, "drawing the Pareto front")
    chart = charts.pareto_chart(pareto.all_points(runner.study, rep["front_reach"]),
                                rep["baseline"],
                            title=f"{name}: memory against time per op")
    for suffix in ("html", "png"):
        written.append((f"Pareto chart ({suffix})",
                        charts.save(chart, run_dir / f"pareto.{suffix}")))
    _done(t0, "chart written")

    t0 = _stage(6, "exporting the chosen policy's boot parameters")
    chosen = pick_candidate(rep, lambda p: p.get("reach") != "kernel")
    if chosen is None:
        _done(t0, "no Pareto point to export")
        return
    cand = study.candidate(runner.study, chosen["trial"])
    for fmt, fname in (("cmdline", "cmdline.txt"), ("grub", "99-slabtune.cfg"),
                       ("tmpfiles", "slabtune.conf"), ("json", "report.json")):
        path = run_dir / fname
        write_atomic(path, export.render(cand, fmt), "--out")
        written.append((f"export ({fmt})", path))
    print(f"    reach: {export.REACH_TEXT[cand.reach]}")
    print("    kernel command line: " + (run_dir / "cmdline.txt").read_text().strip())
    for line in export.kernel_change_notes(cand):
        print(f"    {line}")
    _done(t0, f"trial {chosen['trial']}: memory {chosen['memory']:.4g}, time {chosen['time']:.4g} "
              f"(baseline {rep['baseline']['memory']:.4g}, {rep['baseline']['time']:.4g})")


def run(args) -> int:
    from slabtune.commands.paths import output_dir
    from slabtune.errors import SlabtuneError
    from slabtune.sweeps import runner
    from slabtune.sweeps import spec as sweep_spec

    if args.trials < 1:
        raise SlabtuneError(f"--trials: {args.trials} must be at least 1")
    if args.batch < 1:
        raise SlabtuneError(f"--batch: {args.batch} must be at least 1")
    out = output_dir("--out", args.out)
    written: list[tuple[str, Path]] = []
    ok = True

    t0 = _stage(1, "checking the model against this host's kernel (/sys/kernel/slab)")
    summary, host_ok = host_check()
    ok &= host_ok
    _done(t0, summary)

    t0 = _stage(2, "running the built-in 'quick' structural sweep on "
                   + (f"the Ray cluster at {args.ray_address}" if args.ray_address
                      else "an in-process Ray"))
    spec = sweep_spec.load("quick")
    res = runner.run_sweep(spec, out, spec_text=sweep_spec.builtin_path("quick").read_text(),
                           ray_address=args.ray_address, progress=True,
                           progress_stream=sys.stderr)
    written.append(("quick sweep run", res.run_dir))
    _done(t0, f"{res.rows} configurations in {res.run_dir}")
    print()
    print(order_table(res.run_dir))

    tune_and_export(out, args.trials, args.batch, written)

    print("wrote:")
    for what, path in written:
        print(f"  {what}: {path}")
    return 0 if ok else 1

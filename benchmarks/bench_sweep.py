"""Benchmark: sweeps end to end against the model alone and the scalar reference.

Measured side by side in one run on this machine (medians of ``--repeats``):

1. ``slabtune sweep run SPEC --json`` in a fresh subprocess (interpreter start, local Ray
   start, worker start, compile, grid expansion, model, parquet, manifest): wall seconds and
   configurations per second.  Target for fleet (2^20 structural configurations): < 20 s.
2. The same chunks evaluated in this process without Ray or parquet (the model and the
   grid only), compile reported apart: the time the model needs.
3. The same configurations one by one through the scalar reference
   (:mod:`slabtune.model.reference`): configurations per second, and the ratio.
4. Time outside the model (start-up, Ray, grid expansion, parquet, idle workers) as a share
   of the end-to-end run: 1 - (the chunks' model seconds, summed over workers) / (worker
   slots x end-to-end wall).
5. When a ``dynamics`` evaluator is registered: the same for a 10^4-configuration dynamics
   spec (target: under 30% of the time outside the model).
6. ``fleet_xl`` (issue 15 item 4, about 10^8 structural configurations): ``slabtune sweep
   run`` in a fresh subprocess ``--repeats`` times, Ray start included: median wall
   seconds, rows per second, peak memory of the whole process tree (the driver, Ray's
   daemons and its workers; resident sets summed, and proportional sets, which count a
   shared page once), parquet bytes, ``sweep plan``'s memory estimate beside the measured
   peak, and the load average before and after.  The same spec is run with the runner of
   ``--baseline-rev`` (the code of that revision, from ``git archive``, first on the
   subprocess' path; its Ray workers inherit that path) interleaved with the current one,
   and the ratio printed.  Targets: under 60 s, under 4 GiB.

Usage: ``python benchmarks/bench_sweep.py [--spec fleet] [--repeats 3] [--reference-limit N]
[--only structural|dynamics|xl] [--xl-spec fleet_xl] [--baseline-rev REV|none] [--json]``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from slabtune.model import caches, reference
from slabtune.model import profiles as kernel_profiles
from slabtune.sweeps import grid
from slabtune.sweeps import spec as sweep_spec
from slabtune.sweeps.evaluators import EVALUATORS


def end_to_end(spec_ref: str, repeats: int, extra_env=None) -> dict:
    """Wall time of ``slabtune sweep run`` in a fresh subprocess, ``repeats`` times."""
    walls, inner, rows, model_shares = [], [], None, []
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled",
           **(extra_env or {})}
    env.pop("RAY_ADDRESS", None)
    with tempfile.TemporaryDirectory(prefix="slt-bench-") as out:
        for _ in range(repeats):
            t0 = time.perf_counter()
            proc = subprocess.run([sys.executable, "-m", "slabtune", "sweep", "run", spec_ref,
                                   "--out", out, "--json"], capture_output=True, text=True,
                                  env=env)
            walls.append(time.perf_counter() - t0)
            lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
            if proc.returncode != 0 or not lines:
                raise SystemExit(f"sweep run failed (rc {proc.returncode}):\n"
                                 f"{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
            doc = json.loads(lines[-1])
            inner.append(doc["seconds"])
            rows = doc["rows"]
            # the local Ray has os.cpu_count() worker slots; the model's share of their
            # wall-clock capacity (compile included, JAX import and Ray start not)
            slots = os.cpu_count() or 1
            model_shares.append(doc["timings"]["model_s"] / (slots * walls[-1]))
    return {"wall_s": walls, "median_wall_s": statistics.median(walls),
            "median_run_s": statistics.median(inner), "rows": rows,
            "model_share_of_worker_capacity": model_shares,
            "median_outside_share": 1 - statistics.median(model_shares)}


def model_only(spec: sweep_spec.SweepSpec, repeats: int) -> dict:
    """Grid + evaluator over every chunk in this process; compile measured apart."""
    from slabtune.sweeps.dispatch import chunk_task

    d = {**spec.to_dict(), "_hash": spec.hash}
    first = chunk_task(d, 0)
    warm0 = chunk_task(d, 0)
    compile_s = max(0.0, first["model_s"] - warm0["model_s"])
    totals, grids = [], []
    for _ in range(repeats):
        m = g = 0.0
        for i in range(grid.n_chunks(spec)):
            res = chunk_task(d, i)
            m += res["model_s"]
            g += res["grid_s"]
        totals.append(m)
        grids.append(g)
    return {"compile_s": compile_s, "median_model_s": statistics.median(totals),
            "median_grid_s": statistics.median(grids)}


def reference_rate(spec: sweep_spec.SweepSpec, limit: int) -> dict:
    """Configurations per second through reference.structure, one call per configuration,
    over the first ``limit`` rows of the grid (all of them when limit >= the grid)."""
    n = min(limit, spec.product)
    cols = grid.axis_columns(spec, 0, n)
    keep = ~grid.excluded(spec, cols)
    defaults = dict(spec.defaults)

    def col(name):
        return cols[name] if name in cols else [defaults[name]] * n

    cache_vals = spec.axis("cache").values if "cache" in cols else None
    prof_vals = spec.axis("profile").values
    profiles = [kernel_profiles.get_profile(p) for p in prof_vals]
    infos = [caches.get_cache(c) for c in cache_vals] if cache_vals else None
    if "cpus" in cols:
        cpus = cols["cpus"].tolist()
    else:
        cpus = (cols["cpus_per_node"] * cols["nodes"]).tolist()
    possible, mino, maxo, mobj, expl = (list(map(int, col(k))) for k in (
        "possible", "min_order", "max_order", "min_objects", "explicit_sheaf"))
    prof, cache = cols["profile"].tolist(), (cols["cache"].tolist() if infos else None)
    sizes = cols["size"].tolist() if "size" in cols else None
    done = 0
    t0 = time.perf_counter()
    for r in range(n):
        if not keep[r]:
            continue
        if infos:
            c = infos[cache[r]]
            size, early, kmal, boot, ex = c.size, c.early, c.is_kmalloc, c.is_bootstrap, \
                c.explicit_sheaf
        else:
            size, early, kmal, boot, ex = sizes[r], False, False, False, 0
        if expl[r] >= 0:
            ex = expl[r]
        reference.structure(size, possible[r] or cpus[r], cpus[r], cpus[r], profiles[prof[r]],
                    mino[r], maxo[r], mobj[r], early, kmal, boot, ex)
        done += 1
    dt = time.perf_counter() - t0
    return {"configs": done, "seconds": dt, "rate": done / dt if dt else float("nan")}


def report(name: str, spec: sweep_spec.SweepSpec, repeats: int, ref_limit: int,
           spec_ref: str) -> dict:
    rows = grid.count_rows(spec)
    print(f"== {name}: {rows} configurations, {grid.n_chunks(spec)} chunks of {spec.chunk_size} "
          f"({spec.evaluator}), repeats {repeats}", flush=True)
    e2e = end_to_end(spec_ref, repeats)
    print(f"end to end (subprocess, Ray start included): median {e2e['median_wall_s']:.2f} s "
          f"[{', '.join(f'{w:.2f}' for w in e2e['wall_s'])}] -> "
          f"{rows / e2e['median_wall_s']:,.0f} configs/s", flush=True)
    mo = model_only(spec, repeats)
    print(f"model alone (in-process, warm): median {mo['median_model_s']:.3f} s -> "
          f"{rows / mo['median_model_s']:,.0f} configs/s; compile {mo['compile_s']:.2f} s; "
          f"grid expansion {mo['median_grid_s']:.3f} s", flush=True)
    out = {"spec": name, "configs": rows, "end_to_end": e2e, "model": mo}
    outside = e2e["median_outside_share"]
    print(f"time outside the model: {100 * outside:.1f}% of the workers' wall-clock "
          f"capacity ({os.cpu_count()} slots x end-to-end wall; model time = the chunks' "
          f"own model seconds, compile included)", flush=True)
    naive = 1 - mo["median_model_s"] / e2e["median_wall_s"]
    print(f"  (1 - in-process model time / end-to-end wall: {100 * naive:.1f}%; negative "
          f"when parallel workers beat one process)", flush=True)
    out["outside_share"] = outside
    out["outside_share_vs_in_process"] = naive
    if ref_limit > 0 and spec.evaluator == "structural":
        ref = reference_rate(spec, ref_limit)
        ratio_model = (rows / mo["median_model_s"]) / ref["rate"]
        ratio_e2e = (rows / e2e["median_wall_s"]) / ref["rate"]
        print(f"scalar reference, one by one: {ref['configs']} configs in {ref['seconds']:.2f} s "
              f"-> {ref['rate']:,.0f} configs/s", flush=True)
        print(f"ratio vs reference: model alone {ratio_model:,.1f}x, end to end "
              f"{ratio_e2e:,.2f}x", flush=True)
        out["reference"] = ref
        out["ratio_model_vs_reference"] = ratio_model
        out["ratio_end_to_end_vs_reference"] = ratio_e2e
    return out


#: The runner before issue 15 item 4 (chunks shipped to the driver, which wrote every part).
BASELINE_REV = "dded5510f1f5025ab008ef6e81a93b2fbdbe1ee5"
#: Top-level directories that make up the ``slabtune`` package (pyproject's package-dir).
PACKAGE_DIRS = ("calibrate", "kernel", "model", "native", "results", "sweeps", "tuner",
                "validate")
ROOT = Path(__file__).resolve().parent.parent


def _children() -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as fh:
                ppid = int(fh.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        out.setdefault(ppid, []).append(int(d))
    return out


def _tree_memory(pid: int) -> tuple[int, int]:
    """(RSS, PSS) in bytes summed over ``pid`` and every descendant (Ray's daemons and
    workers are children of the driver's local instance)."""
    kids, todo, rss, pss = _children(), [pid], 0, 0
    while todo:
        p = todo.pop()
        todo.extend(kids.get(p, []))
        try:
            with open(f"/proc/{p}/smaps_rollup") as fh:
                for line in fh:
                    if line.startswith("Rss:"):
                        rss += int(line.split()[1]) * 1024
                    elif line.startswith("Pss:"):
                        pss += int(line.split()[1]) * 1024
        except OSError:
            continue
    return rss, pss


def _sampled_run(cmd, env, cwd=None) -> tuple[subprocess.CompletedProcess, float, int, int]:
    """Run ``cmd``, sampling its process tree's memory every 0.1 s; returns the process,
    its wall seconds and the peak RSS and PSS sums."""
    peak = [0, 0]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, cwd=cwd)
    done = threading.Event()

    def sample():
        while not done.is_set():
            rss, pss = _tree_memory(proc.pid)
            peak[0], peak[1] = max(peak[0], rss), max(peak[1], pss)
            done.wait(0.1)

    th = threading.Thread(target=sample, daemon=True)
    th.start()
    out, err = proc.communicate()
    wall = time.perf_counter() - t0
    done.set()
    th.join()
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err), wall, peak[0], peak[1]


def baseline_tree(rev: str, dest: Path) -> Path:
    """The package as it was at ``rev``, laid out as an importable ``slabtune`` under
    ``dest`` (what the editable install maps from the repository's top-level dirs)."""
    src = dest / "src"
    src.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "slabtune",
                              *PACKAGE_DIRS], capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(src)], input=archive.stdout, check=True)
    pkg = dest / "pkg"
    pkg.mkdir()
    shutil.move(str(src / "slabtune"), str(pkg / "slabtune"))
    for d in PACKAGE_DIRS:
        if (src / d).is_dir():
            shutil.move(str(src / d), str(pkg / "slabtune" / d))
    return pkg


def xl_run(spec_path: str, out: str, code_root: Path | None) -> dict:
    """One ``sweep run`` of ``spec_path`` in a fresh interpreter; with ``code_root`` the
    package is imported from there (the baseline), else from this checkout."""
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled"}
    env.pop("RAY_ADDRESS", None)
    if code_root is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(code_root),
                                                          env.get("PYTHONPATH")]))
    load0 = os.getloadavg()[0]
    proc, wall, rss, pss = _sampled_run(
        [sys.executable, "-m", "slabtune", "sweep", "run", spec_path, "--out", out, "--json"],
        env, cwd=str(code_root) if code_root is not None else None)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise SystemExit(f"sweep run failed (rc {proc.returncode}):\n{proc.stdout[-2000:]}\n"
                         f"{proc.stderr[-3000:]}")
    doc = json.loads(lines[-1])
    run_dir = Path(doc["run_dir"])
    manifest = json.loads((run_dir / "manifest.json").read_text())
    parquet = sum(p.stat().st_size for p in run_dir.glob("part-*.parquet"))
    shutil.rmtree(run_dir)
    return {"wall_s": wall, "run_s": doc["seconds"], "rows": doc["rows"], "peak_rss": rss,
            "peak_pss": pss, "parquet_bytes": parquet, "timings": doc["timings"],
            "workers_wrote_parts": bool(manifest["attempts"][-1].get("workers_write_parts")),
            "load_before": load0, "load_after": os.getloadavg()[0]}


def _gib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB"


def xl_report(spec_ref: str, repeats: int, baseline_rev: str | None) -> dict:
    """Section 6 of the module docstring."""
    from slabtune.sweeps import runner

    spec = sweep_spec.load(spec_ref)
    spec_path = str(sweep_spec.builtin_path(spec_ref)) if sweep_spec._is_builtin(spec_ref) \
        and not os.path.exists(spec_ref) else os.path.abspath(spec_ref)
    plan = runner.plan(spec)
    print(f"== {spec_ref}: {plan.configs:,} configurations, {plan.chunks} chunks of "
          f"{spec.chunk_size}; plan's memory estimate {_gib(plan.est_memory_bytes)}; "
          f"repeats {repeats}", flush=True)
    sides = {"current": None}
    with tempfile.TemporaryDirectory(prefix="slt-bench-xl-") as tmp:
        if baseline_rev:
            sides["baseline"] = baseline_tree(baseline_rev, Path(tmp) / "base")
        runs: dict[str, list] = {k: [] for k in sides}
        for _ in range(repeats):
            for side, code in sides.items():      # interleaved: the same load for both
                r = xl_run(spec_path, os.path.join(tmp, "runs"), code)
                runs[side].append(r)
                print(f"  {side:8s} wall {r['wall_s']:6.2f} s  peak RSS {_gib(r['peak_rss'])} "
                      f"(PSS {_gib(r['peak_pss'])})  parquet {r['parquet_bytes'] / 2**20:.1f} "
                      f"MiB  load {r['load_before']:.2f}->{r['load_after']:.2f}  "
                      f"timings {r['timings']}", flush=True)
    out = {"spec": spec_ref, "configs": plan.configs, "est_memory_bytes": plan.est_memory_bytes}
    for side, rs in runs.items():
        wall = statistics.median(r["wall_s"] for r in rs)
        summary = {"median_wall_s": wall, "wall_s": [r["wall_s"] for r in rs],
                   "rows_per_s": rs[0]["rows"] / wall,
                   "peak_rss_bytes": max(r["peak_rss"] for r in rs),
                   "peak_pss_bytes": max(r["peak_pss"] for r in rs),
                   "parquet_bytes": rs[0]["parquet_bytes"], "rows": rs[0]["rows"],
                   "workers_wrote_parts": rs[0]["workers_wrote_parts"],
                   "load": [r["load_before"] for r in rs] + [rs[-1]["load_after"]]}
        out[side] = summary
        print(f"{side}: median {wall:.2f} s [{', '.join(f'{w:.2f}' for w in summary['wall_s'])}]"
              f" -> {summary['rows_per_s']:,.0f} rows/s; peak RSS {_gib(summary['peak_rss_bytes'])}"
              f" (PSS {_gib(summary['peak_pss_bytes'])}); parquet "
              f"{summary['parquet_bytes']:,} bytes; workers wrote parts: "
              f"{summary['workers_wrote_parts']}", flush=True)
    cur = out["current"]
    print(f"plan's estimate {_gib(plan.est_memory_bytes)} against measured peak RSS "
          f"{_gib(cur['peak_rss_bytes'])} ({plan.est_memory_bytes / cur['peak_rss_bytes']:.2f}x)")
    if "baseline" in out:
        base = out["baseline"]
        out["speedup_vs_baseline"] = base["median_wall_s"] / cur["median_wall_s"]
        out["memory_vs_baseline"] = cur["peak_rss_bytes"] / base["peak_rss_bytes"]
        print(f"against the runner of {baseline_rev[:12]}: {out['speedup_vs_baseline']:.2f}x "
              f"faster, {out['memory_vs_baseline']:.2f}x the peak RSS")
    ok_t, ok_m = cur["median_wall_s"] < 60, cur["peak_rss_bytes"] < 4 * 2**30
    print(f"target: end to end < 60 s: {cur['median_wall_s']:.2f} s -> "
          f"{'met' if ok_t else 'NOT met'}; peak memory < 4 GiB: "
          f"{_gib(cur['peak_rss_bytes'])} -> {'met' if ok_m else 'NOT met'}")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--spec", default="fleet", help="structural spec (default fleet)")
    ap.add_argument("--dynamics-spec", default="dynamics_bench",
                    help="dynamics spec of ~10^4 configurations (default dynamics_bench)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--reference-limit", type=int, default=1 << 30,
                    help="configurations to push through the scalar reference (default: all)")
    ap.add_argument("--only", choices=("structural", "dynamics", "xl"), default=None,
                    help="run one part of the benchmark")
    ap.add_argument("--xl-spec", default="fleet_xl", help="the 10^8 spec (default fleet_xl)")
    ap.add_argument("--baseline-rev", default=BASELINE_REV,
                    help="git revision whose runner the xl part compares with ('none': skip)")
    ap.add_argument("--json", action="store_true", help="also print one JSON object at the end")
    args = ap.parse_args(argv)
    results = {"cpus": os.cpu_count(), "load_avg_1m": os.getloadavg()[0]}
    print(f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}")
    if args.only in (None, "xl"):
        rev = None if args.baseline_rev in ("", "none") else args.baseline_rev
        results["xl"] = xl_report(args.xl_spec, args.repeats, rev)
    if args.only == "xl":
        pass
    elif args.only != "dynamics":
        spec = sweep_spec.load(args.spec)
        results["structural"] = report(args.spec, spec, args.repeats, args.reference_limit,
                                       args.spec)
        target = results["structural"]["end_to_end"]["median_wall_s"]
        print(f"target: 10^6 structural configs end to end < 20 s: {target:.2f} s -> "
              f"{'met' if target < 20 else 'NOT met'}")
    if args.only in ("structural", "xl"):
        pass
    elif "dynamics" in EVALUATORS:
        dspec = sweep_spec.load(args.dynamics_spec)
        results["dynamics"] = report(args.dynamics_spec, dspec, args.repeats, 0,
                                     args.dynamics_spec)
        share = results["dynamics"]["outside_share"]
        print(f"target: dynamics sweep < 30% outside the model: {100 * share:.1f}% -> "
              f"{'met' if share < 0.30 else 'NOT met'}")
    else:
        print("dynamics: no 'dynamics' evaluator registered; dynamics benchmark skipped")
    if args.json:
        print(json.dumps(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

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

Usage: ``python benchmarks/bench_sweep.py [--spec fleet] [--repeats 3] [--reference-limit N]
[--json]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

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


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--spec", default="fleet", help="structural spec (default fleet)")
    ap.add_argument("--dynamics-spec", default="dynamics_bench",
                    help="dynamics spec of ~10^4 configurations (default dynamics_bench)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--reference-limit", type=int, default=1 << 30,
                    help="configurations to push through the scalar reference (default: all)")
    ap.add_argument("--only", choices=("structural", "dynamics"), default=None,
                    help="run one half of the benchmark")
    ap.add_argument("--json", action="store_true", help="also print one JSON object at the end")
    args = ap.parse_args(argv)
    results = {"cpus": os.cpu_count(), "load_avg_1m": os.getloadavg()[0]}
    print(f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}")
    if args.only != "dynamics":
        spec = sweep_spec.load(args.spec)
        results["structural"] = report(args.spec, spec, args.repeats, args.reference_limit,
                                       args.spec)
        target = results["structural"]["end_to_end"]["median_wall_s"]
        print(f"target: 10^6 structural configs end to end < 20 s: {target:.2f} s -> "
              f"{'met' if target < 20 else 'NOT met'}")
    if args.only == "structural":
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

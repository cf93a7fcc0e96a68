"""The steady-state dynamics objective on docs/SPECS.md's example fleet (issue 32 item 7):
seconds for a number of trials of ``tune`` (batched), and time to 99% hypervolume against
Optuna's plain loop on the same objective, side by side in one run.

The fleet is the SPECS.md tune-spec example's: laptop-8 (weight 2) and memoryless-96x2
(possible 128, weight 0.5); network (foreign_free 0.6, churn 0.3: kmalloc-256 4,096 and
skbuff_head_cache 2,048 live objects per CPU) and filesystem (dentry, 16,384 live objects
per CPU, churn 0.2); its knobs (``reach = "kernel"``: sheaf_small needs a rebuilt kernel),
TPE seed 1, max_regression 0.1; ``[objectives] set = "dynamics"``, steps 256 (a floor under
each point's derived window), seed 3; no cost file (the packaged table).  ``--profile``
runs the same fleet under another kernel profile.

Printed, per repeat and as medians:

* ``build``: seconds to build the evaluator (each point's schedule, the baseline settled
  until its window's halves agree, the baseline batch), wall and process CPU;
* ``trials``: ``tune``'s batched loop (:class:`StudyRunner`, batches of ``--batch``, in
  memory) for ``--trials`` trials: wall and CPU seconds, trials that failed (not in steady
  state), front size, simulated allocator ops per second;
* ``race``: hypervolume against each method's own seconds for Optuna's plain
  ``study.optimize`` (one trial at a time, the objective evaluating one policy) and
  ``tune`` (benchmarks/bench_front.py's ``run_optuna`` and ``run_tune``, the same
  reference point), ``--budget`` seconds each; the seconds each needs to reach 99% of the
  best hypervolume either reached, and their ratio (a lower bound where Optuna never
  reaches it).  Method seconds are process CPU seconds by default (``--clock``).

The load average (``os.getloadavg``) is printed before and after each part: the machine is
shared, so only figures of one run compare.  ``--out FILE`` writes the results as JSON
(benchmarks/results/).

    .venv/bin/python benchmarks/bench_objective.py [--trials 1024] [--batch 64]
        [--budget 120] [--repeats 1] [--profile v6.18] [--out benchmarks/results/F.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np
import optuna

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_front  # noqa: E402

from slabtune.errors import SlabtuneError  # noqa: E402
from slabtune.tuner import study as studies  # noqa: E402

SPEC = """[fleet]
profile = "{profile}"

[[fleet.topology]]
name = "laptop-8"
cpus = 8
weight = 2.0

[[fleet.topology]]
name = "{big}"
cpus = 96
nodes = 2
memoryless_nodes = {memoryless}
possible = 128
weight = 0.5

[[fleet.workload]]
name = "network"
foreign_free = 0.6
churn = 0.3
[fleet.workload.caches]
"kmalloc-256" = {{ live_per_cpu = 4096, ops = 2.0 }}
skbuff_head_cache = {{ live_per_cpu = 2048, ops = 3.0 }}

[[fleet.workload]]
name = "filesystem"
foreign_free = 0.0
[fleet.workload.caches]
dentry = {{ live_per_cpu = 16384 }}

[search]
sampler = "tpe"
seed = 1
reach = "kernel"

[search.knobs]
slub_max_order = {{ low = 1, high = 4 }}
slub_min_objects = {{ choices = [0, 8, 16, 32] }}
cpu_partial_small = {{ low = 0, high = 240, step = 8 }}
min_partial_hi = {{}}
sheaf_small = {{ low = 0, high = 64, step = 4 }}

[objectives]
set = "dynamics"
steps = 256
seed = 3
max_regression = 0.1
"""


#: The 96-CPU machine of ``--big``: SPECS.md's memoryless one, or both nodes with memory.
BIG = {"memoryless": {"big": "memoryless-96x2", "memoryless": "[1]"},
       "memory": {"big": "server-96x2", "memoryless": "[]"}}


class CpuClock(bench_front.Clock):
    """bench_front's method clock in process CPU seconds (``--clock cpu``): on a machine
    shared with other work, wall seconds measure the neighbours as much as the method."""

    def __init__(self):
        self.spent, self._t = 0.0, time.process_time()

    def pause(self) -> float:
        self.spent += time.process_time() - self._t
        return self.spent

    def resume(self) -> None:
        self._t = time.process_time()


def load() -> float:
    return round(os.getloadavg()[0], 2)


class Timer:
    """Wall and process CPU seconds (every thread of the process, the C engine's too)."""

    def __enter__(self):
        self.w, self.c = time.perf_counter(), time.process_time()
        self.load_before = load()
        return self

    def __exit__(self, *exc):
        self.wall = time.perf_counter() - self.w
        self.cpu = time.process_time() - self.c
        self.load_after = load()


def model_ops(evaluator, batches: int) -> float:
    """Allocator ops one batch of the evaluator simulates (three runs per point: to the
    warm-up's end, the window's middle and its end), times ``batches``: from the plan of
    the last batch."""
    d = evaluator._fn
    warm, win = d.plan
    steps = 3 * warm + win + win // 2
    b = np.tile([s.ops_per_step for s in d.steady.schedules], len(warm) // d.steady.Q)
    # every rep runs at most b ops a step; 8 reps
    return float((steps * b * 8).sum()) * batches


def one_repeat(spec_text: str, args) -> dict:
    studies._EVALUATORS.clear()
    spec = studies.parse_spec(spec_text, "specs-example")
    out: dict = {}
    with Timer() as t:
        try:
            ev = studies.evaluator_for(spec)
        except SlabtuneError as err:
            out["refused"] = str(err)
            out["build"] = {"wall_s": round(time.perf_counter() - t.w, 2),
                            "cpu_s": round(time.process_time() - t.c, 2)}
            print(f"  build refused after {out['build']['wall_s']} s wall, "
                  f"{out['build']['cpu_s']} s CPU: slabtune: error: {err}", flush=True)
            return out
    out["build"] = {"wall_s": round(t.wall, 2), "cpu_s": round(t.cpu, 2),
                    "load": [t.load_before, t.load_after]}
    out["schedules"] = [list(s) for s in ev._fn.steady.schedules]
    out["baseline"] = {"memory_topo": ev.baseline.memory_topo[0].tolist(),
                       "time_topo": ev.baseline.time_topo[0].tolist()}
    print(f"  build {t.wall:.1f} s wall, {t.cpu:.1f} s CPU (load {t.load_before} -> "
          f"{t.load_after}); schedules (ops_per_step, warm-up, window) per point: "
          f"{out['schedules']}", flush=True)
    runner, _ = studies.create_or_resume(spec, "bench-objective", "memory:", evaluator=ev)
    with Timer() as t:
        runner.run(args.trials, args.batch)
    trials = runner.study.trials
    failed = [x for x in trials if x.state == optuna.trial.TrialState.FAIL]
    ops = model_ops(ev, -(-args.trials // args.batch))
    out["trials"] = {"n": len(trials), "wall_s": round(t.wall, 2), "cpu_s": round(t.cpu, 2),
                     "failed": len(failed), "front": len(runner.study.best_trials),
                     "model_ops_approx": ops, "load": [t.load_before, t.load_after],
                     "first_failure": (failed[0].user_attrs.get(studies.ATTR_NOT_STEADY)
                                       if failed else None)}
    print(f"  {len(trials)} trials: {t.wall:.1f} s wall, {t.cpu:.1f} s CPU (load "
          f"{t.load_before} -> {t.load_after}); {len(failed)} failed (not in steady state); "
          f"front {len(runner.study.best_trials)}; about {ops / max(t.cpu, 1e-9) / 1e6:.0f} M "
          f"simulated ops per CPU-second", flush=True)
    race = {}
    curves = {}
    for name, fn in (("optuna", lambda: bench_front.run_optuna(spec, ev, args.budget,
                                                                args.every)),
                     ("tune", lambda: bench_front.run_tune(spec, ev, args.budget, args.every,
                                                            args.batch))):
        l0 = load()
        curves[name], info = fn()
        race[name] = {"final_hv": curves[name].final, "load": [l0, load()], **info}
        print(f"  race {name:7} final hv {curves[name].final:.5f} after "
              f"{curves[name].points[-1][0]:.1f} s {info} (load {l0} -> {load()})", flush=True)
    best = max(c.final for c in curves.values())
    for name, c in curves.items():
        race[name]["seconds_to_99pct"] = c.seconds_to(0.99 * best)
    t_opt, t_tune = race["optuna"]["seconds_to_99pct"], race["tune"]["seconds_to_99pct"]
    lower = t_opt is None
    ratio = ((args.budget if lower else t_opt) / t_tune) if t_tune else None
    race["speedup_vs_optuna"] = ratio
    race["speedup_is_lower_bound"] = lower
    out["race"] = race
    print(f"  99% of the best hypervolume ({best:.5f}): optuna "
          f"{'never' if lower else f'{t_opt:.1f} s'}, tune "
          f"{'never' if t_tune is None else f'{t_tune:.1f} s'}; speedup "
          f"{'n/a' if ratio is None else f'{ratio:.1f}x'}{' (lower bound)' if lower else ''}",
          flush=True)
    return out


def median(rows, *path):
    vals = []
    for r in rows:
        x = r
        for p in path:
            x = x.get(p) if isinstance(x, dict) else None
        if isinstance(x, (int, float)):
            vals.append(float(x))
    return float(np.median(vals)) if vals else None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--budget", type=float, default=120.0,
                    help="seconds each method gets in the hypervolume race")
    ap.add_argument("--every", type=float, default=2.0,
                    help="method seconds between readings of the front")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--clock", choices=("cpu", "wall"), default="cpu",
                    help="the race's method seconds: process CPU (default) or wall")
    ap.add_argument("--profile", default="v6.18")
    ap.add_argument("--big", default="memoryless,memory",
                    help="the 96-CPU machine's node 1: memoryless (SPECS.md's example as it "
                         "is), memory (both nodes with memory), or both, comma-separated")
    ap.add_argument("--out", default=None, help="write the results as JSON to this file")
    args = ap.parse_args(argv)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    from slabtune.sweeps import dynsim

    if args.clock == "cpu":
        bench_front.Clock = CpuClock
    print(f"bench_objective: {platform.node()}, {os.cpu_count()} CPUs, load {load()}, "
          f"engine {dynsim.engine()}, profile {args.profile}, {args.trials} trials in "
          f"batches of {args.batch}, race budget {args.budget:g} s", flush=True)
    results = {}
    for big in args.big.split(","):
        text = SPEC.format(profile=args.profile, **BIG[big])
        rows = []
        for r in range(args.repeats):
            print(f"{BIG[big]['big']}: repeat {r + 1}/{args.repeats}", flush=True)
            rows.append(one_repeat(text, args))
        results[big] = {"spec": text, "repeats": rows, "medians": summarise(rows)}
    if args.out:
        doc = {"bench": "bench_objective", "time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ",
                                                                      time.gmtime()),
               "host": platform.node(), "cpus": os.cpu_count(), "args": vars(args),
               "results": results, "load_end": load()}
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")
        print(f"wrote {args.out}")
    return 0


def summarise(rows) -> dict:
    summary = {
        "build_wall_s": median(rows, "build", "wall_s"),
        "build_cpu_s": median(rows, "build", "cpu_s"),
        "trials_wall_s": median(rows, "trials", "wall_s"),
        "trials_cpu_s": median(rows, "trials", "cpu_s"),
        "optuna_s_to_99pct": median(rows, "race", "optuna", "seconds_to_99pct"),
        "tune_s_to_99pct": median(rows, "race", "tune", "seconds_to_99pct"),
        "speedup_vs_optuna": median(rows, "race", "speedup_vs_optuna"),
    }
    print("medians: " + ", ".join(f"{k} {v:.2f}" if v is not None else f"{k} n/a"
                                  for k, v in summary.items()), flush=True)
    return summary


if __name__ == "__main__":
    sys.exit(main())

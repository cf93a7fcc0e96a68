"""Trials per second of a tune study: batched ask -> one model call -> tell, against one trial
at a time (ask one, evaluate it alone, tell it), with the same sampler, seed and fleet (the
built-in quick spec), for in-memory, journal-file and SQLite storage, side by side in one run.

For each storage and mode the study is run ``--repeats`` times from scratch and the median
trials/s is quoted, with the share of wall time spent in model calls (the rest is the
sampler and the storage).  Target (structural set): batched >= 20x one-at-a-time with
in-memory storage.

    .venv/bin/python benchmarks/bench_tune.py [--trials 256] [--batch 128] [--repeats 3]

``--objectives dynamics`` runs the same table with the ``dynamics`` objective set (every
policy simulated by the dynamics model) on the built-in tune_dynamics spec:

    .venv/bin/python benchmarks/bench_tune.py --objectives dynamics --trials 64 --batch 64
"""

from __future__ import annotations

import argparse
import logging
import statistics
import tempfile
import time
from pathlib import Path

import optuna

from slabtune.tuner import study as ST


#: Built-in spec benchmarked for each objective set.
SPECS = {"structural": "tune_quick", "dynamics": "tune_dynamics"}


def _storage_url(kind: str, tmp: Path, tag: str) -> str:
    if kind == "memory":
        return "memory:"
    if kind == "journal":
        return f"journal:{tmp / (tag + '.log')}"
    if kind == "sqlite":
        return f"sqlite:///{tmp / (tag + '.db')}"
    raise ValueError(kind)


def run_once(spec, evaluator, kind: str, tmp: Path, tag: str, trials: int, batch: int):
    """(wall seconds, seconds inside model calls) for ``trials`` trials of a fresh study."""
    url = _storage_url(kind, tmp, tag)
    runner, _ = ST.create_or_resume(spec, tag, url, evaluator=evaluator)
    inner = runner.evaluate
    spent = [0.0]

    def timed(params_list):
        t0 = time.perf_counter()
        out = inner(params_list)
        spent[0] += time.perf_counter() - t0
        return out

    runner.evaluate = timed
    t0 = time.perf_counter()
    runner.run(trials, batch)
    wall = time.perf_counter() - t0
    assert len(runner.study.trials) == trials
    return wall, spent[0]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=256)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--storages", default="memory,journal,sqlite")
    ap.add_argument("--objectives", choices=sorted(SPECS), default="structural",
                    help="objective set (and its built-in spec: %s)" % ", ".join(
                        f"{k}: {v}" for k, v in sorted(SPECS.items())))
    args = ap.parse_args(argv)
    optuna.logging.set_verbosity(logging.WARNING)

    spec = ST.load_spec(SPECS[args.objectives])
    assert spec.objectives.name == args.objectives
    t0 = time.perf_counter()
    evaluator = ST.evaluator_for(spec)
    evaluator.evaluate([{}] * args.batch)  # compile the batched and single shapes first
    evaluator.evaluate([{}])
    print(f"{spec.name} spec, {args.objectives} objectives: {len(spec.fleet.topologies)} topologies x {len(spec.fleet.workloads)} "
          f"workloads x {len(spec.fleet.caches)} caches, {len(spec.space.knobs)} knobs, "
          f"sampler {spec.space.sampler}; compile {time.perf_counter() - t0:.1f} s")
    model = {}
    for n in (1, args.batch):
        ts = []
        for _ in range(max(3, args.repeats)):
            t1 = time.perf_counter()
            evaluator.evaluate([{}] * n)
            ts.append(time.perf_counter() - t1)
        model[n] = statistics.median(ts)
    print(f"model alone: {1000 * model[1]:.2f} ms for 1 policy, {1000 * model[args.batch]:.1f} ms "
          f"for {args.batch} ({1000 * model[args.batch] / args.batch:.3f} ms per policy; "
          f"{model[1] * args.batch / model[args.batch]:.1f}x from batching the model call)")
    print(f"{args.trials} trials per study, batch {args.batch}, median of {args.repeats}")
    print(f"{'storage':8} {'mode':8} {'trials/s':>9} {'model %':>8} {'ms/trial':>9}")
    results = {}
    with tempfile.TemporaryDirectory(prefix="bench-tune-") as d:
        tmp = Path(d)
        for kind in args.storages.split(","):
            # modes alternate within each repeat, so both see the same machine load
            runs = {"batched": ([], []), "single": ([], [])}
            for r in range(args.repeats):
                for mode, batch in (("batched", args.batch), ("single", 1)):
                    wall, model = run_once(spec, evaluator, kind, tmp, f"{kind}-{mode}-{r}",
                                           args.trials, batch)
                    runs[mode][0].append(args.trials / wall)
                    runs[mode][1].append(model / wall)
            for mode in ("batched", "single"):
                rate = statistics.median(runs[mode][0])
                share = statistics.median(runs[mode][1])
                results[(kind, mode)] = (rate, share)
                print(f"{kind:8} {mode:8} {rate:9.1f} {100 * share:7.1f}% {1000 / rate:9.2f}",
                      flush=True)
    print()
    for kind in args.storages.split(","):
        b, s = results[(kind, "batched")], results[(kind, "single")]
        bound = "model" if b[1] >= 0.5 else "sampler+storage"
        print(f"{kind:8} batched/single = {b[0] / s[0]:6.1f}x   (batched run bound by {bound}: "
              f"{100 * (1 - b[1]):.0f}% of its time outside the model)")
    ratio = results.get(("memory", "batched"), (0,))[0] / results.get(("memory", "single"), (1,))[0]
    if "memory" in args.storages.split(",") and args.objectives == "structural":
        print(f"target batched >= 20x one-at-a-time in memory: {ratio:.1f}x "
              f"{'MET' if ratio >= 20 else 'NOT MET'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

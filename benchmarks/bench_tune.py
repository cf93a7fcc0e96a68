"""Trials per second of a tune study: batched ask -> one model call -> tell, against one trial
at a time (ask one, evaluate it alone, tell it), with the same sampler, seed and fleet (the
built-in quick spec), for in-memory, journal-file and SQLite storage, side by side in one run.

For each storage and mode the study is run ``--repeats`` times from scratch and the median
trials/s is quoted, with the median ms per trial spent in each phase: ask (the sampler and
the study's bookkeeping), model (evaluator calls), tell, store (batched: the batch's single
write to the storage).  The one-at-a-time baseline is the natural Optuna loop on the study's
own storage (``Study.ask``, the evaluator with a batch of one, ``Study.tell``); the batched
side is the tuner's runner (``StudyRunner.run``).  Target (structural set): batched >= 20x
one-at-a-time with in-memory storage; the last line says what caps the ratio.

    .venv/bin/python benchmarks/bench_tune.py [--trials 256] [--batch 128] [--repeats 3]

``--objectives dynamics`` runs the same table with the ``dynamics`` objective set (every
policy simulated by the dynamics model) on the built-in tune_dynamics spec:

    .venv/bin/python benchmarks/bench_tune.py --objectives dynamics --trials 64 --batch 64

``--spec tune_sweep_quick`` runs it on a larger fleet (the quick sweep's 14 topologies x 16
caches, 224 (topology, workload, cache) points per policy against tune_quick's 56).
"""

from __future__ import annotations

import argparse
import logging
import statistics
import tempfile
import time
from pathlib import Path

import optuna

from slabtune.tuner import study as studies

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


PHASES = ("ask", "model", "tell", "store")


def run_batched(spec, evaluator, kind: str, tmp: Path, tag: str, trials: int, batch: int):
    """(wall seconds, {phase: seconds}) of ``trials`` trials of a fresh study through the
    tuner's batched runner: ask (sampler, in-memory bookkeeping), model (one evaluator
    call per batch), tell (in memory) and store (the batch written to the storage)."""
    url = _storage_url(kind, tmp, tag)
    runner, _ = studies.create_or_resume(spec, tag, url, evaluator=evaluator)
    spent = dict.fromkeys(PHASES, 0.0)

    def timed(phase, fn):
        def call(*a):
            t0 = time.perf_counter()
            out = fn(*a)
            spent[phase] += time.perf_counter() - t0
            return out
        return call

    runner.ask_batch = timed("ask", runner.ask_batch)
    runner.evaluate = timed("model", runner.evaluate)
    runner.tell_batch = timed("tell", runner.tell_batch)
    t0 = time.perf_counter()
    runner.run(trials, batch)
    wall = time.perf_counter() - t0
    spent["store"] = wall - spent["ask"] - spent["model"] - spent["tell"]
    assert len(runner.study.trials) == trials
    return wall, spent


def run_single(spec, evaluator, kind: str, tmp: Path, tag: str, trials: int):
    """The same for the natural Optuna loop, one trial at a time: ``Study.ask`` on the
    study's own storage, the evaluator called with a batch of one, ``set_user_attr``,
    ``set_constraint``, ``Study.tell`` (ask and tell include their storage round trips)."""
    url = _storage_url(kind, tmp, tag)
    runner, _ = studies.create_or_resume(spec, tag, url, evaluator=evaluator)
    study, dists = runner.study, runner.distributions
    constrained = spec.objectives.max_regression is not None
    spent = dict.fromkeys(PHASES, 0.0)
    t0 = time.perf_counter()
    for _ in range(trials):
        t1 = time.perf_counter()
        trial = study.ask(dists)
        t2 = time.perf_counter()
        ev = runner.evaluate([trial.params])
        t3 = time.perf_counter()
        trial.set_user_attr(studies.ATTR_TOPO, {"memory": ev.memory_topo[0].tolist(),
                                           "time": ev.time_topo[0].tolist()})
        if constrained:
            trial.set_constraint(studies.ATTR_EXCESS, float(evaluator.regression_excess(ev)[0]))
        study.tell(trial, [float(ev.memory[0]), float(ev.time[0])])
        t4 = time.perf_counter()
        spent["ask"] += t2 - t1
        spent["model"] += t3 - t2
        spent["tell"] += t4 - t3
    wall = time.perf_counter() - t0
    assert len(study.trials) == trials
    return wall, spent


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=256)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--storages", default="memory,journal,sqlite")
    ap.add_argument("--objectives", choices=sorted(SPECS), default="structural",
                    help="objective set (and its built-in spec: "
                         + ", ".join(f"{k}: {v}" for k, v in sorted(SPECS.items())) + ")")
    ap.add_argument("--spec", help="another tune spec (file or built-in name), e.g. the larger "
                                   "fleet of tune_sweep_quick; its own objective set")
    args = ap.parse_args(argv)
    optuna.logging.set_verbosity(logging.WARNING)

    spec = studies.load_spec(args.spec or SPECS[args.objectives])
    if args.spec:
        args.objectives = spec.objectives.name
    assert spec.objectives.name == args.objectives
    t0 = time.perf_counter()
    evaluator = studies.evaluator_for(spec)
    evaluator.evaluate([{}] * args.batch)  # compile the batched and single shapes first
    evaluator.evaluate([{}])
    print(f"{spec.name} spec, {args.objectives} objectives: {len(spec.fleet.topologies)} "
          f"topologies x {len(spec.fleet.workloads)} workloads x {len(spec.fleet.caches)} caches "
          f"({len(spec.fleet.topologies) * len(spec.fleet.workloads) * len(spec.fleet.caches)} "
          f"points per policy), {len(spec.space.knobs)} knobs, "
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
    print(f"{args.trials} trials per study, batch {args.batch}, median of {args.repeats}; "
          f"ms per trial, split by phase (batched: ask and tell in memory, store = the "
          f"batch's write; single: Study.ask/tell on the storage itself)")
    print(f"{'storage':8} {'mode':8} {'trials/s':>9} {'ms/trial':>9} "
          + " ".join(f"{p:>7}" for p in PHASES))
    results = {}
    kinds = args.storages.split(",")
    with tempfile.TemporaryDirectory(prefix="bench-tune-") as d:
        tmp = Path(d)
        for kind in kinds:
            # modes alternate within each repeat, so both see the same machine load
            runs = {"batched": [], "single": []}
            for r in range(args.repeats):
                runs["batched"].append(run_batched(spec, evaluator, kind, tmp,
                                                   f"{kind}-b-{r}", args.trials, args.batch))
                runs["single"].append(run_single(spec, evaluator, kind, tmp, f"{kind}-s-{r}",
                                                 args.trials))
            for mode in ("batched", "single"):
                walls = [w for w, _ in runs[mode]]
                rate = args.trials / statistics.median(walls)
                split = {p: 1000 * statistics.median(sp[p] for _, sp in runs[mode]) / args.trials
                         for p in PHASES}
                results[(kind, mode)] = (rate, split)
                print(f"{kind:8} {mode:8} {rate:9.1f} {1000 / rate:9.3f} "
                      + " ".join(f"{split[p]:7.3f}" for p in PHASES), flush=True)
    print()
    for kind in kinds:
        (b, bs), (s, _ss) = results[(kind, "batched")], results[(kind, "single")]
        total = sum(bs.values())
        share = {"sampler": bs["ask"] + bs["tell"], "model": bs["model"], "storage": bs["store"]}
        bound = max(share, key=share.get)
        print(f"{kind:8} batched/single = {b / s:6.1f}x   batched bound by {bound}: "
              + ", ".join(f"{k} {100 * v / total:.0f}%" for k, v in share.items()))
    if "memory" in kinds and spec.name == SPECS["structural"]:
        ratio = results[("memory", "batched")][0] / results[("memory", "single")][0]
        floor = sum(results[("memory", "single")][1].values()) / (
            results[("memory", "batched")][1]["ask"] + results[("memory", "batched")][1]["tell"])
        single_ms = sum(results[("memory", "single")][1].values())
        per_policy_ms = 1000 * model[args.batch] / args.batch
        print(f"target batched >= 20x one-at-a-time in memory: {ratio:.1f}x "
              f"{'MET' if ratio >= 20 else 'NOT MET'} (with a free model, the sampler's own "
              f"per-trial cost would cap it at {floor:.1f}x; with a free sampler, tell and "
              f"storage, the batched model call alone ({per_policy_ms:.3f} ms per policy on "
              f"this machine) would cap it at {single_ms / per_policy_ms:.1f}x: 20x needs the "
              f"model under {single_ms / 20:.3f} ms per policy)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

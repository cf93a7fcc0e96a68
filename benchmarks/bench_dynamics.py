"""Benchmark: simulated allocator operations per second, JAX model against the reference.

For batches of 10^2, 10^3 and 10^4 configurations (every workload kind, several kernel
profiles, cache sizes and topologies), run ``simulate_batch`` for ``--steps`` steps and count
the allocator operations actually simulated (the ``ops`` counters, allocations plus frees,
summed over the batch).  The reference simulator runs a sample of the same configurations
in the same process.  Prints the median of ``--repeat`` timed runs per batch size (compile
excluded; the first call, compile included, is shown apart), ops/s, and the ratio to the
reference: a curve over batch size, for every run length b in ``--ops-per-step`` (ops of one
kind a rep does per step, ``SimConfig.ops_per_step``).  The reference plays the same runs
event by event, so its rate is measured per b too.
Rates are given per wall-clock second and per CPU second of this process (``process_time``,
all its threads): on a shared machine the second is the steadier figure.

The C engine (``native/dynsim.c`` through :mod:`slabtune.sweeps.dynsim`, what
``simulate_batch`` callers get on the CPU by default) runs the same batches interleaved with
the JAX model, its rate printed beside it and its counters compared with the JAX model's on
every repeat (``--no-native`` skips it).

At b = 1 the one-op body the runs replaced (``git show 42784f4:model/dynamics.py``, loaded
from git when the checkout has it; ``--no-old-body`` skips it) is timed on the same batches
in the same run, interleaved repeat by repeat, and the ratio new / old of the CPU rates is
printed: b = 1 compiles the runs with the static run bound 1 (``dynamics.run_bound``).

Fidelity cost of a run length: the distinct configurations are run for ``--fid-steps``
steps at b = 1 and at each b (same keys); per configuration the weighted alloc and free
fast-path fractions (percentage points) and the memory held (``metrics.memory`` total,
relative) are compared with b = 1; median and max over configurations are printed.

    .venv/bin/python benchmarks/bench_dynamics.py [--steps 200] [--repeat 3] \
        [--ops-per-step 1,16,64,256] [--fid-steps 2000] [--no-old-body] [--no-native]
"""

from __future__ import annotations

import argparse
import importlib.util
import itertools
import os
import statistics
import subprocess
import time

import jax
import numpy as np

from slabtune.model import dynamics, metrics, policy, profiles, reference_sim
from slabtune.model.topology import Topology
from slabtune.sweeps import dynsim

PROFILES = ("v3.1", "v6.1", "v6.18", "v7.0", "v7.1")
SIZES = (64, 256, 1024, 4096)
TOPOS = (Topology.uniform(16, 1), Topology.uniform(64, 2, memoryless_nodes=(1,)),
         Topology.uniform(512, 8, memoryless_nodes=(6, 7)))
WORKLOADS = ({"kind": "local", "live": 64}, {"kind": "local", "live": 300, "burst": 50},
             {"kind": "producer_consumer", "cross_node": 0.3},
             {"kind": "request_response", "threads": 64},
             {"kind": "block_io", "completion_remote": True})


def distinct_configs(b: int = 1) -> list:
    """Every (profile, size, topology, workload) configuration, run length ``b``; with the
    object size of each."""
    out = []
    for prof_name, size, topo, wl in itertools.product(PROFILES, SIZES, TOPOS, WORKLOADS):
        prof = profiles.get_profile(prof_name)
        st = policy.structure(size, topo.possible, topo.present, topo.online,
                          policy.profile_arrays(prof), explicit_sheaf=32 if size <= 256 else 0)
        out.append(dynamics.config_from(st, prof, topo, wl, ops_per_step=b))
    return out


def labels() -> list[str]:
    """A short name per distinct configuration (same order as :func:`distinct_configs`)."""
    return [f"{p} {s}B {t.present}cpu/{t.nodes}n {w['kind']}"
            + ("" if "burst" not in w else f" burst={w['burst']}")
            for p, s, t, w in itertools.product(PROFILES, SIZES, TOPOS, WORKLOADS)]


def fidelity(cfgs, steps: int) -> dict:
    """Per configuration: weighted alloc/free fast-path fractions and memory held (bytes)."""
    batch = dynamics.stack_configs(cfgs)
    keys = jax.random.split(jax.random.key(99), len(cfgs))
    c = dynamics.simulate_batch(keys, batch, steps)
    w = np.asarray(batch.rep_weight, np.float64)
    frac = lambda a, b: (w * np.asarray(getattr(c, a))).sum(1) / np.maximum(  # noqa: E731
        (w * np.asarray(getattr(c, b))).sum(1), 1e-9)
    mem = jax.vmap(lambda cc, cf: metrics.memory(cc, cf, 64)[0])(c, batch)
    return dict(alloc=frac("alloc_fast", "allocs"), free=frac("free_fast", "frees"),
                mem=np.asarray(mem, np.float64))


#: The commit whose model/dynamics.py is the one-op body before runs.
OLD_BODY = "42784f4"


def old_body(rev: str = OLD_BODY):
    """The dynamics module of commit ``rev`` (by default :data:`OLD_BODY`, the one-op
    body), loaded from git, or None."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:
        src = subprocess.run(["git", "-C", root, "show", f"{rev}:model/dynamics.py"],
                             capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    spec = importlib.util.spec_from_loader("slabtune.model._dynamics_one_op", loader=None)
    mod = importlib.util.module_from_spec(spec)
    exec(compile(src, f"{rev}:model/dynamics.py", "exec"), mod.__dict__)
    return mod


def batch_of(cfgs, n):
    return dynamics.stack_configs([cfgs[i % len(cfgs)] for i in range(n)])


def same_counters(a, b) -> bool:
    """Whether two Counters are equal: every event counter and every float32 gauge, bit for
    bit (tests/test_dynsim.py)."""
    return all(np.array_equal(np.asarray(getattr(a, f)), np.asarray(getattr(b, f)))
               for f in dynamics.Counters._fields)


def time_jax(cfgs, n, steps, repeat, old=None, native=True):
    """Per engine, (ops, median wall s, median CPU s, first-call s) of ``simulate_batch``:
    the JAX model; with the one-op module ``old`` the same for it; with ``native`` the C
    engine (:mod:`slabtune.sweeps.dynsim`); their repeats interleaved.  Also whether the C
    engine's counters equaled the JAX model's on every repeat (None without it)."""
    batch = batch_of(cfgs, n)
    runs = [("jax", dynamics.simulate_batch, batch)]
    if old is not None:
        runs.append(("old", old.simulate_batch,
                     old.SimConfig(*batch[:len(old.SimConfig._fields)])))
    if native:
        runs.append(("native", dynsim.simulate_batch, batch))
    out = {}
    for name, fn, b in runs:
        keys = jax.random.split(jax.random.key(0), n)
        t0 = time.perf_counter()
        jax.block_until_ready(fn(keys, b, steps))
        out[name] = ([], [], time.perf_counter() - t0, [0])
    same = True if native else None
    for i in range(repeat):
        keys = jax.random.split(jax.random.key(i + 1), n)
        jax.block_until_ready(keys)
        got = {}
        for name, fn, b in runs:
            times, cpu, _, ops = out[name]
            t0, c0 = time.perf_counter(), time.process_time()
            c = fn(keys, b, steps)
            jax.block_until_ready(c)
            times.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
            ops[0] = int(np.asarray(c.ops, np.int64).sum())
            got[name] = c
        if native:
            same = same and same_counters(got["jax"], got["native"])
    return {name: (o[0], statistics.median(t), statistics.median(c), f)
            for name, (t, c, f, o) in out.items()}, same


def time_reference(cfgs, steps, sample):
    rates, cpu_rates = [], []
    for i, cfg in enumerate(cfgs[:: max(len(cfgs) // sample, 1)][:sample]):
        w = np.asarray(dynamics.draws(jax.random.key(i), steps))
        t0, c0 = time.perf_counter(), time.process_time()
        c = reference_sim.run(w, cfg)
        dt, dc = time.perf_counter() - t0, time.process_time() - c0
        rates.append(int(c["ops"].sum()) / dt)
        cpu_rates.append(int(c["ops"].sum()) / dc)
    return statistics.median(rates), statistics.median(cpu_rates)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--sizes", default="100,1000,10000")
    ap.add_argument("--ref-sample", type=int, default=9)
    ap.add_argument("--ops-per-step", default="1,16,64,256",
                    help="run lengths b to measure (comma-separated; 1 is today's model)")
    ap.add_argument("--fid-steps", type=int, default=2000,
                    help="steps of the fidelity runs (0: skip them)")
    ap.add_argument("--no-old-body", action="store_true",
                    help=f"at b = 1, do not time the one-op body of {OLD_BODY} alongside")
    ap.add_argument("--no-native", action="store_true",
                    help="do not time the C engine (native/dynsim.c) alongside")
    ap.add_argument("--old-body", default=OLD_BODY, metavar="REV",
                    help="the commit whose model/dynamics.py is timed alongside at b = 1 "
                         f"(default {OLD_BODY}; e.g. HEAD for a change not yet committed)")
    args = ap.parse_args(argv)
    bs = [dynamics.check_ops_per_step(int(x)) for x in args.ops_per_step.split(",")]
    print(f"devices: {jax.devices()}  steps: {args.steps}  distinct configs: "
          f"{len(distinct_configs())}  load average: {os.getloadavg()[0]:.1f} on "
          f"{os.cpu_count()} CPUs")
    for b in bs:
        cfgs = distinct_configs(b)
        ref, ref_cpu = time_reference(cfgs, args.steps, args.ref_sample)
        print(f"\nb = {b}: reference {ref:,.0f} ops/s wall, {ref_cpu:,.0f} ops/CPU-s "
              f"(median of {args.ref_sample} configs)")
        print(f"{'configs':>8} {'ops':>13} {'median s':>9} {'cpu s':>7} {'first s':>8} "
              f"{'ops/s':>14} {'x ref':>6} {'ops/CPU-s':>14} {'x ref':>6}")
        old = old_body(args.old_body) if b == 1 and not args.no_old_body else None
        for n in (int(x) for x in args.sizes.split(",")):
            res, same = time_jax(cfgs, n, args.steps, args.repeat, old, not args.no_native)
            label = {"jax": "", "old": f"{args.old_body} body", "native": "native (C)"}
            for name, (ops, med, cpu, first) in res.items():
                rate, crate = ops / med, ops / max(cpu, 1e-9)
                print(f"{n:>8} {ops:>13,} {med:>9.3f} {cpu:>7.3f} {first:>8.1f} "
                      f"{rate:>14,.0f} {rate / ref:>6.1f} {crate:>14,.0f} {crate / ref_cpu:>6.1f}"
                      + (f"  {label[name]}" if label[name] else ""))
            if "old" in res:
                print(f"{'':>8} b = 1 now / {args.old_body} body, CPU rate: "
                      f"{res['old'][2] / res['jax'][2]:.2f}x wall rate: "
                      f"{res['old'][1] / res['jax'][1]:.2f}x "
                      f"(same ops: {res['jax'][0] == res['old'][0]})")
            if "native" in res:
                print(f"{'':>8} native (C) / JAX model, wall rate: "
                      f"{res['jax'][1] / res['native'][1]:.1f}x CPU rate: "
                      f"{res['jax'][2] / res['native'][2]:.1f}x; counters equal on every "
                      f"repeat: {same}")
    if args.fid_steps <= 0:
        return
    base = fidelity(distinct_configs(1), args.fid_steps)
    print(f"\nfidelity against b = 1 ({len(base['mem'])} configs, {args.fid_steps} steps): "
          f"|difference|, median / max")
    print(f"{'b':>5} {'alloc fast pp':>15} {'free fast pp':>15} {'memory rel':>15}  "
          f"worst alloc fast-path config; per workload: alloc pp median / max")
    names = labels()
    for b in bs:
        if b == 1:
            continue
        f = fidelity(distinct_configs(b), args.fid_steps)
        da = 100 * np.abs(f["alloc"] - base["alloc"])
        dfr = 100 * np.abs(f["free"] - base["free"])
        dm = np.abs(f["mem"] - base["mem"]) / np.maximum(base["mem"], 1.0)
        kinds = [n.split()[3] + (" burst" if "burst" in n else "") for n in names]
        per = "; ".join(f"{k} {np.median(da[[x == k for x in kinds]]):.2f} / "
                        f"{da[[x == k for x in kinds]].max():.1f}" for k in dict.fromkeys(kinds))
        print(f"{b:>5} {np.median(da):>7.2f} / {da.max():<6.2f} {np.median(dfr):>7.2f} / "
              f"{dfr.max():<6.2f} {np.median(dm):>7.3f} / {dm.max():<6.3f}  "
              f"{names[int(np.argmax(da))]}; {per}")
    print(f"load average at the end: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()

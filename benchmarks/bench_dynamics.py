"""Benchmark: simulated allocator operations per second, JAX model against the reference.

For batches of 10^2, 10^3 and 10^4 configurations (every workload kind, several kernel
profiles, cache sizes and topologies), run ``simulate_batch`` for ``--steps`` steps and count
the allocator operations actually simulated (the ``ops`` counters, allocations plus frees,
summed over the batch).  The reference simulator runs a sample of the same configurations
in the same process.  Prints the median of ``--repeat`` timed runs per batch size (compile
excluded; the first call, compile included, is shown apart), ops/s, and the ratio to the
reference: a curve over batch size.
Rates are given per wall-clock second and per CPU second of this process (``process_time``,
all its threads): on a shared machine the second is the steadier figure.

    .venv/bin/python benchmarks/bench_dynamics.py [--steps 200] [--repeat 3]
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import time

import jax
import numpy as np

from slabtune.model import dynamics as D
from slabtune.model import policy as PL
from slabtune.model import profiles as P
from slabtune.model import reference_sim as RS
from slabtune.model.topology import Topology

PROFILES = ("v3.1", "v6.1", "v6.18", "v7.0", "v7.1")
SIZES = (64, 256, 1024, 4096)
TOPOS = (Topology.uniform(16, 1), Topology.uniform(64, 2, memoryless_nodes=(1,)),
         Topology.uniform(512, 8, memoryless_nodes=(6, 7)))
WORKLOADS = ({"kind": "local", "live": 64}, {"kind": "local", "live": 300, "burst": 50},
             {"kind": "producer_consumer", "cross_node": 0.3},
             {"kind": "request_response", "threads": 64},
             {"kind": "block_io", "completion_remote": True})


def distinct_configs() -> list:
    out = []
    for prof_name, size, topo, wl in itertools.product(PROFILES, SIZES, TOPOS, WORKLOADS):
        prof = P.get_profile(prof_name)
        st = PL.structure(size, topo.possible, topo.present, topo.online,
                          PL.profile_arrays(prof), explicit_sheaf=32 if size <= 256 else 0)
        out.append(D.config_from(st, prof, topo, wl))
    return out


def batch_of(cfgs, n):
    return D.stack_configs([cfgs[i % len(cfgs)] for i in range(n)])


def time_jax(cfgs, n, steps, repeat):
    batch = batch_of(cfgs, n)
    keys = jax.random.split(jax.random.key(0), n)
    t0 = time.perf_counter()
    c = D.simulate_batch(keys, batch, steps)
    jax.block_until_ready(c)
    first = time.perf_counter() - t0
    times, cpu = [], []
    for i in range(repeat):
        keys = jax.random.split(jax.random.key(i + 1), n)
        jax.block_until_ready(keys)
        t0, c0 = time.perf_counter(), time.process_time()
        c = D.simulate_batch(keys, batch, steps)
        jax.block_until_ready(c)
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    ops = int(np.asarray(c.ops, np.int64).sum())
    return ops, statistics.median(times), statistics.median(cpu), first


def time_reference(cfgs, steps, sample):
    rates, cpu_rates = [], []
    for i, cfg in enumerate(cfgs[:: max(len(cfgs) // sample, 1)][:sample]):
        w = np.asarray(D.draws(jax.random.key(i), steps))
        t0, c0 = time.perf_counter(), time.process_time()
        c = RS.run(w, cfg)
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
    args = ap.parse_args(argv)
    cfgs = distinct_configs()
    ref, ref_cpu = time_reference(cfgs, args.steps, args.ref_sample)
    print(f"devices: {jax.devices()}  steps: {args.steps}  distinct configs: {len(cfgs)}  "
          f"load average: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    print(f"reference: {ref:,.0f} ops/s wall, {ref_cpu:,.0f} ops/CPU-s "
          f"(median of {args.ref_sample} configs)")
    print(f"{'configs':>8} {'ops':>12} {'median s':>9} {'cpu s':>7} {'first s':>8} "
          f"{'ops/s':>13} {'x ref':>6} {'ops/CPU-s':>13} {'x ref':>6}")
    for n in (int(x) for x in args.sizes.split(",")):
        ops, med, cpu, first = time_jax(cfgs, n, args.steps, args.repeat)
        rate, crate = ops / med, ops / max(cpu, 1e-9)
        print(f"{n:>8} {ops:>12,} {med:>9.3f} {cpu:>7.3f} {first:>8.1f} "
              f"{rate:>13,.0f} {rate / ref:>6.1f} {crate:>13,.0f} {crate / ref_cpu:>6.1f}")


if __name__ == "__main__":
    main()

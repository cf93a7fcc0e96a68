"""Native allocator timings under the seed scenarios, side by side in one run.

For every arm of every seed scenario (slabtune.model.scenarios) the native allocator
(native/slubsim.c via slabtune.validate.native) runs ``--repeats`` times with the arms
interleaved round-robin (so machine load hits them alike), the threads free-running
(``sync_every = 0``) for ``--steps`` steps each; it prints the median ns per op of each arm,
the spread, and for each scenario row comparing two arms on time or throughput the measured
ratio next to the published one.  A JSON line at the end holds the medians.

With ``--timed-calls`` the figure is the time spent inside the allocator per alloc+free
pair instead of wall time per op: the binary times each slab_alloc()/slab_free() call alone
(``time_ops``) with every thread pinned to one CPU (``pin_cpu``), as ``slabtune validate``
measures the native target; the workload driver, its queues and oversubscribed cores are
then out of the figure.

Two cores shared with other work: compare arms only within one run.

    .venv/bin/python benchmarks/bench_native.py [--repeats 5] [--steps 20000] [--sync-every 0]
                                                [--timed-calls]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics

from slabtune.model import scenarios
from slabtune.sweeps import simconfig
from slabtune.validate import native


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--steps", type=int, default=20000)
    ap.add_argument("--sync-every", type=int, default=0)
    ap.add_argument("--timed-calls", action="store_true",
                    help="ns inside the allocator per alloc+free pair, threads on one CPU")
    a = ap.parse_args()
    extra = ({"time_ops": 1, "pin_cpu": min(os.sched_getaffinity(0))} if a.timed_calls
             else {})
    unit = "ns/pair in allocator" if a.timed_calls else "ns/op"
    binary = native.build()
    arms = []
    for sc in scenarios.SCENARIOS:
        for name, arm in sc["arms"].items():
            arm = dict(arm)
            patch = arm.pop("profile_patch", None)
            spec = native.patched_spec(simconfig.parse_doc(arm), patch)
            cfg = native.config_for_spec(spec, sync_every=a.sync_every, steps=a.steps)
            arms.append((sc["name"], name, dataclasses.replace(cfg, **extra)))
    times: dict[tuple[str, str], list[float]] = {(s, n): [] for s, n, _ in arms}
    for _ in range(a.repeats):
        for s, n, cfg in arms:
            r = native.run(cfg, binary=binary)
            times[(s, n)].append(native.op_ns_per_pair(r, cfg.rep_weight) if a.timed_calls
                                 else r.ns_per_op)
    print(f"# {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}; {a.repeats} repeats x "
          f"{a.steps} steps, sync_every {a.sync_every}"
          + (f", allocator calls timed alone on CPU {extra['pin_cpu']}" if a.timed_calls else ""))
    med = {k: statistics.median(v) for k, v in times.items()}
    for (s, n), v in times.items():
        print(f"{s:40s} {n:18s} median {med[(s, n)]:9.1f} {unit}  "
              f"(min {min(v):.1f}, max {max(v):.1f})")
    print("# scenario rows: measured ratio (arm / base) against published")
    for sc in scenarios.SCENARIOS:
        for row in sc["rows"]:
            if row["metric"] not in ("time", "iops", "sys_time"):
                continue
            arm, base = med[(sc["name"], row["arm"])], med[(sc["name"], row["base"])]
            # time-like metrics scale with ns per op, throughput-like ones inversely
            ratio = arm / base if row["metric"] != "iops" else base / arm
            pub = (row["published"] / row["published_base"]
                   if row.get("published") is not None else None)
            pub_s = f"{pub:.3f}" if pub is not None else row.get("expect", "-")
            print(f"{row['label']:70s} measured {ratio:6.3f}  published {pub_s}")
    key = "alloc_ns_per_pair_median" if a.timed_calls else "ns_per_op_median"
    print(json.dumps({key: {f"{s}:{n}": round(v, 1) for (s, n), v in med.items()}}))


if __name__ == "__main__":
    main()

"""Native allocator timings under the seed scenarios, side by side in one run.

For every arm of every seed scenario (slabtune.model.scenarios) the native allocator
(native/slubsim.c via slabtune.tuner.native) runs ``--repeats`` times with the arms
interleaved round-robin (so machine load hits them alike), the threads free-running
(``sync_every = 0``) for ``--steps`` steps each; it prints the median ns per op of each arm,
the spread, and for each scenario row comparing two arms on time or throughput the measured
ratio next to the published one.  A JSON line at the end holds the medians.

Two cores shared with other work: compare arms only within one run.

    .venv/bin/python benchmarks/bench_native.py [--repeats 5] [--steps 20000] [--sync-every 0]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics

from slabtune.model import scenarios as S
from slabtune.sweeps import simconfig as SC
from slabtune.tuner import native as NV


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--steps", type=int, default=20000)
    ap.add_argument("--sync-every", type=int, default=0)
    a = ap.parse_args()
    binary = NV.build()
    arms = []
    for sc in S.SCENARIOS:
        for name, arm in sc["arms"].items():
            arm = dict(arm)
            patch = arm.pop("profile_patch", None)
            spec = NV.patched_spec(SC.parse_doc(arm), patch)
            cfg = NV.config_for_spec(spec, sync_every=a.sync_every, steps=a.steps)
            arms.append((sc["name"], name, cfg))
    times: dict[tuple[str, str], list[float]] = {(s, n): [] for s, n, _ in arms}
    for _ in range(a.repeats):
        for s, n, cfg in arms:
            times[(s, n)].append(NV.run(cfg, binary=binary).ns_per_op)
    print(f"# {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}; {a.repeats} repeats x "
          f"{a.steps} steps, sync_every {a.sync_every}")
    med = {k: statistics.median(v) for k, v in times.items()}
    for (s, n), v in times.items():
        print(f"{s:40s} {n:18s} median {med[(s, n)]:9.1f} ns/op  "
              f"(min {min(v):.1f}, max {max(v):.1f})")
    print("# scenario rows: measured ratio (arm / base) against published")
    for sc in S.SCENARIOS:
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
    print(json.dumps({"ns_per_op_median": {f"{s}:{n}": round(v, 1)
                                           for (s, n), v in med.items()}}))


if __name__ == "__main__":
    main()

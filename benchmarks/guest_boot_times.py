"""Guest boot times: median seconds from qemu's start to the guest init's start marker (and
to qemu's exit), for -smp 1, 2 and 4 in one run, side by side, with the accelerator used.

Under TCG every vCPU shares the host's cores, so these are emulation times, not kernel
speed; they size timeouts and tell how many guest checks fit a budget.

    .venv/bin/python benchmarks/guest_boot_times.py [--repeats 5] [--smp 1,2,4]
"""

from __future__ import annotations

import argparse
import statistics
import sys

from slabtune.errors import SlabtuneError
from slabtune.kernel import guest
from slabtune.model.topology import Topology


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--smp", default="1,2,4")
    ap.add_argument("--accel", default="auto", choices=("auto", "kvm", "tcg"))
    args = ap.parse_args(argv)
    try:
        smps = [int(x) for x in args.smp.split(",")]
        assets = guest.find_assets()
    except (ValueError, SlabtuneError) as exc:
        print(f"guest_boot_times: error: {exc}", file=sys.stderr)
        return 2
    probe = guest.probe_kvm(assets)
    print(f"kvm probe: usable={probe.usable} ({probe.reason})")
    rows = []
    for smp in smps:
        boots, totals, failures, attempts = [], [], 0, 0
        for _ in range(args.repeats):
            r = guest.boot_guest(guest.GuestSpec(topology=Topology.uniform(smp), dump=False,
                                         accel=args.accel, timeout_s=120), assets)
            attempts += r.attempts
            if r.ok and r.boot_seconds is not None:
                boots.append(r.boot_seconds)
                totals.append(r.total_seconds)
            else:
                failures += 1
        accel = r.accelerator
        rows.append((smp, accel, boots, totals, failures, attempts))
    base = statistics.median(rows[0][2]) if rows and rows[0][2] else None
    print(f"{'smp':>4} {'accel':>5} {'n':>3} {'boot_med_s':>10} {'exit_med_s':>10} "
          f"{'min_s':>6} {'max_s':>6} {'vs_smp' + str(smps[0]):>9} {'attempts':>8} {'failed':>6}")
    for smp, accel, boots, totals, failures, attempts in rows:
        if not boots:
            print(f"{smp:>4} {accel:>5} {0:>3} {'-':>10} {'-':>10}")
            continue
        med = statistics.median(boots)
        ratio = f"{med / base:.2f}x" if base else "-"
        print(f"{smp:>4} {accel:>5} {len(boots):>3} {med:>10.2f} "
              f"{statistics.median(totals):>10.2f} "
              f"{min(boots):>6.2f} {max(boots):>6.2f} {ratio:>9} {attempts:>8} {failures:>6}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""``slabtune kernel snapshot`` and ``slabtune kernel check``: the real-kernel tier.

The handlers only parse arguments and print; reading sysfs lives in
:mod:`slabtune.kernel.host`, the file format in :mod:`slabtune.kernel.snapshot` and the
comparison in :mod:`slabtune.kernel.check` (imported lazily: it pulls in JAX).
"""

from __future__ import annotations

import argparse
import sys

from slabtune.commands import jsonout


def register(subparsers) -> None:
    kernel = subparsers.add_parser(
        "kernel", help="snapshot this kernel's slab caches and check the model against them")
    sub = kernel.add_subparsers(dest="kernel_command", metavar="ACTION")
    kernel.set_defaults(func=lambda args: _help(kernel))

    s = sub.add_parser("snapshot", help="write /sys/kernel/slab and the CPU/node layout to a file")
    s.add_argument("--out", required=True, metavar="FILE",
                   help="output file; .csv or .parquet picks the format")
    s.add_argument("--root", default="/", metavar="DIR",
                   help="read sys/ and proc/ under DIR instead of / (a tree copied from a guest)")
    s.set_defaults(func=_snapshot)

    c = sub.add_parser(
        "check", help="predict every cache of a snapshot and compare",
        description="Predict order, objs_per_slab, min_partial, cpu_partial and sheaf_capacity "
                    "of every cache of each boot in a snapshot and compare with the kernel "
                    "(on a SLAB snapshot from /proc/slabinfo: order, objs_per_slab, limit, "
                    "batchcount and sharedfactor). "
                    "Exit 0 when every comparable cache matches, 1 on any mismatch (or when no "
                    "cache is comparable), 2 on bad input.")
    c.add_argument("--snapshot", metavar="FILE",
                   help="snapshot to check (.csv or .parquet); default: a fresh one of this host")
    c.add_argument("--profile", metavar="NAME",
                   help="kernel profile (e.g. v6.18, slab-v6.1); default: detected from "
                        "kernel_release")
    c.add_argument("--json", action="store_true", help="print one JSON object instead of tables; "
                   + jsonout.NON_FINITE_HELP)
    c.set_defaults(func=_check)


def _help(parser: argparse.ArgumentParser) -> int:
    parser.print_help(sys.stderr)
    return 2


def _snapshot(args) -> int:
    from slabtune.commands.paths import input_dir, output_file
    from slabtune.kernel.host import take_snapshot
    from slabtune.kernel.snapshot import write_snapshot

    output_file("--out", args.out)
    input_dir("--root", args.root)
    df = take_snapshot(args.root)
    path = write_snapshot(df, args.out)
    print(f"wrote {df.height} caches of kernel {df['kernel_release'][0]} to {path}")
    return 0


def _check(args) -> int:
    from slabtune.kernel import check
    from slabtune.kernel.host import take_snapshot
    from slabtune.kernel.snapshot import read_snapshot

    if args.profile is not None:  # fail fast, before reading sysfs or compiling anything
        check.resolve_profile(args.profile)
    if args.snapshot:
        df, source = read_snapshot(args.snapshot), args.snapshot
    else:
        df, source = take_snapshot("/"), "/sys/kernel/slab"
    result = check.check_snapshot(df, args.profile, source)
    if args.json:
        print(jsonout.dumps(result.to_json(), indent=None))
    else:
        _print_report(result)
    return 0 if result.ok else 1


def _print_report(r) -> None:
    for b in r.boots:
        print(f"boot {b.index}: {b.kernel_release} profile {b.profile}; cpus possible "
              f"{b.cpus_possible} (nr_cpu_ids {b.nr_cpu_ids}) present {b.cpus_present} "
              f"({b.present}) online {b.cpus_online} ({b.online}); nodes with memory "
              f"{b.nodes_with_memory or '-'}, with cpus {b.nodes_with_cpu or '-'}; "
              f"{b.params_text()}; {b.caches} caches")
    if r.not_comparable:
        print(f"not comparable ({len(r.not_comparable)}):")
        w = max(len(n.cache) for n in r.not_comparable)
        for n in r.not_comparable:
            print(f"  boot {n.boot}  {n.cache:<{w}}  {n.reason}")
    if r.mismatches:
        print(f"mismatches ({len(r.mismatches)}):")
        w = max(len(m.cache) for m in r.mismatches)
        print(f"  {'boot':<4}  {'cache':<{w}}  {'field':<14}  {'kernel':>7}  {'model':>7}")
        for m in r.mismatches:
            print(f"  {m.boot:<4}  {m.cache:<{w}}  {m.field:<14}  {m.kernel:>7}  {m.model:>7}")
    print("fields: " + ", ".join(f"{k} {v.matched}/{v.total}" for k, v in r.fields.items()))
    if r.policy:
        print("policy sysfs values the kernel shows as written: "
              + ", ".join(f"{k} {v.matched}/{v.total}" for k, v in r.policy.items()))
    if r.comparable == 0:
        print("no comparable caches: nothing was checked")
    print(r.summary())

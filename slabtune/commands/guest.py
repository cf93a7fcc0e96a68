"""``slabtune guest boot`` and ``slabtune guest probe``: the qemu guest tier.

The handlers parse arguments and print; booting, the initramfs and console parsing live in
:mod:`slabtune.kernel.guest`.
"""

from __future__ import annotations

import argparse
import sys

from slabtune.commands import jsonout
from slabtune.errors import SlabtuneError


def register(subparsers) -> None:
    guest = subparsers.add_parser(
        "guest", help="boot a real kernel under qemu with a chosen topology and slub_* "
                      "parameters, run the workload, snapshot /sys/kernel/slab "
                      "(/proc/slabinfo on a SLAB kernel)")
    sub = guest.add_subparsers(dest="guest_command", metavar="ACTION")
    guest.set_defaults(func=lambda args: _help(guest))

    b = sub.add_parser(
        "boot", help="boot one guest and write its before/after snapshots",
        description="Boot a kernel (default: the Debian cloud kernel that "
                    "scripts/install-guest-deps.sh unpacks) under qemu, dump /sys/kernel/slab "
                    "(/proc/slabinfo on a CONFIG_SLAB kernel, which has no sysfs tree: a "
                    "SLAB snapshot) before and after the workload, write the snapshot(s). "
                    "Exit 0 when the "
                    "guest completed, 1 when it failed after its retries, 2 on bad input.")
    b.add_argument("--cpus", type=int, default=1, help="present CPUs (default 1)")
    b.add_argument("--possible", type=int, help="possible CPUs (default: --cpus)")
    b.add_argument("--online", type=int, help="CPUs brought online at boot (default: --cpus)")
    b.add_argument("--nodes", type=int, default=1, help="NUMA nodes (default 1)")
    b.add_argument("--node-cpus", metavar="N,N,...",
                   help="present CPUs per node (default: spread evenly)")
    b.add_argument("--memoryless", metavar="NODE,...", default="",
                   help="nodes without memory")
    b.add_argument("--param", action="append", default=[], metavar="NAME=VALUE",
                   help="slab boot parameter (slub_min_order, slub_max_order, "
                        "slub_min_objects; slab_* from 6.8), or the flag slub_nomerge "
                        "(slab_nomerge) without a value; repeatable")
    b.add_argument("--policy", metavar="FILE.json",
                   help="apply both halves of a policy that `slabtune export --format json` "
                        "wrote: its boot parameters on the command line (checked against "
                        "the booted kernel's allow-list) and its per-cache sysfs values "
                        "(min_partial, cpu_partial) written in the guest before the first "
                        "snapshot, which records them (columns set_min_partial, "
                        "set_cpu_partial) for `kernel check`; not with --param")
    b.add_argument("--kernel", metavar="BZIMAGE|NAME",
                   help="boot this bzImage instead, or a lab kernel by name (6.1, 6.1-slab, "
                        "6.12, 7.2: scripts/build-kernels.sh)")
    b.add_argument("--memory", type=int, default=512, metavar="MIB", help="guest memory")
    b.add_argument("--timeout", type=float, default=120.0, metavar="S",
                   help="wall-clock limit per boot attempt (default 120)")
    b.add_argument("--retries", type=int, default=1, help="retries after a failed boot")
    b.add_argument("--accel", choices=("auto", "kvm", "tcg"), default="auto")
    b.add_argument("--workload", choices=("hackbench", "crosscpu", "none"),
                   default="hackbench")
    b.add_argument("--groups", type=int, default=2)
    b.add_argument("--fds", type=int, default=4)
    b.add_argument("--loops", type=int, default=100)
    b.add_argument("--msg-size", type=int, default=100)
    b.add_argument("--transport", choices=("socket", "pipe"), default="socket")
    b.add_argument("--out", metavar="FILE", help="snapshot before the workload (.csv/.parquet)")
    b.add_argument("--after", metavar="FILE", help="snapshot after the workload")
    b.add_argument("--json", action="store_true",
                   help="print one JSON summary line; " + jsonout.NON_FINITE_HELP)
    b.set_defaults(func=_boot)

    p = sub.add_parser("probe", help="probe whether KVM guests run here (cached)")
    p.add_argument("--refresh", action="store_true", help="ignore the cached result")
    p.add_argument("--kernel", metavar="BZIMAGE")
    p.set_defaults(func=_probe)


def _help(parser: argparse.ArgumentParser) -> int:
    parser.print_help(sys.stderr)
    return 2


def _int_list(text: str, field: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise SlabtuneError(f"{field}: {text!r} is not a comma-separated list of "
                            "integers") from None


def _params(items: list[str]) -> dict[str, str | None]:
    """--param NAME=VALUE, or a bare flag NAME (slub_nomerge, slab_nomerge): None."""
    from slabtune.model import bootparams, profiles

    flags = {n for p in profiles.PROFILES.values() for n in bootparams.allowed_flags(p)}
    out: dict[str, str | None] = {}
    for item in items:
        name, eq, value = item.partition("=")
        if not name or not (eq or name in flags):
            raise SlabtuneError(f"--param: {item!r} is not NAME=VALUE")
        out[name] = value if eq else None
    return out


def _topology(args):
    """The guest's topology from --cpus, --nodes, --node-cpus, --memoryless, --possible and
    --online; an impossible one (or a node with neither CPUs nor memory) is one error line."""
    from slabtune.model.topology import Topology, TopologyError, check_no_empty_nodes

    node_cpus = _int_list(args.node_cpus, "--node-cpus") if args.node_cpus else None
    try:
        topo = Topology.uniform(args.cpus, nodes=args.nodes,
                                memoryless_nodes=_int_list(args.memoryless, "--memoryless"),
                                possible=args.possible, online=args.online, node_cpus=node_cpus)
        check_no_empty_nodes(topo)
    except TopologyError as err:
        raise SlabtuneError(f"topology: {err}") from None
    return topo


#: Largest policy file read (an export of a fleet of every cache is a few KiB).
POLICY_LIMIT = 1 << 20


def read_policy(path) -> tuple[dict, dict, dict]:
    """``(boot parameters, sysfs values, the whole report)`` of a policy file that
    ``slabtune export --format json`` wrote; anything else is one error line naming the
    file and the field.  The boot parameters are checked against the allow-list here and
    against the booted kernel's profile at boot; the sysfs values by
    :func:`slabtune.kernel.guest.policy_writes`."""
    import json

    from slabtune.kernel.guest import policy_writes
    from slabtune.results.safeio import read_bounded

    raw = read_bounded(path, POLICY_LIMIT, "--policy")
    try:
        doc = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as err:
        raise SlabtuneError(f"--policy: {path}: not JSON ({err})") from None
    if not isinstance(doc, dict) or "boot_params" not in doc or "sysfs" not in doc:
        raise SlabtuneError(f"--policy: {path}: not a policy (no boot_params and sysfs: "
                            "write one with slabtune export --format json)")
    boot = doc["boot_params"]
    if not isinstance(boot, dict) or not all(
            isinstance(v, int) and not isinstance(v, bool) for v in boot.values()):
        raise SlabtuneError(f"--policy: {path}: boot_params is not a table of integers")
    if doc.get("slabinfo"):
        raise SlabtuneError(f"--policy: {path}: a SLAB policy's /proc/slabinfo tunables are "
                            "not applied by guest boot (only its boot parameter would be)")
    try:
        policy_writes(doc["sysfs"])
    except SlabtuneError as err:
        raise SlabtuneError(f"--policy: {path}: {err}") from None
    return dict(boot), dict(doc["sysfs"]), doc


def _check_inputs(args) -> tuple[dict, dict, dict]:
    """Everything a boot checks before it looks for a kernel or starts qemu: the --param
    names against the allow-list and their values against their ranges (for every
    spelling any profile accepts; the booted kernel's own profile is checked again once
    it is known), a --policy file (:func:`read_policy`), and the output paths.  Returns
    the boot parameters (of --param or the policy), the policy's sysfs values and the
    whole policy ({} without --policy)."""
    from slabtune.commands.paths import output_file
    from slabtune.model import bootparams

    params = _params(args.param)
    flag, sysfs, doc = "--param", {}, {}
    if args.policy is not None:
        if params:
            raise SlabtuneError("--policy: give boot parameters in the policy or with "
                                "--param, not both")
        params, sysfs, doc = read_policy(args.policy)
        flag = "--policy"
    try:
        bootparams.validate_params_any_profile(params)
    except SlabtuneError as err:
        raise SlabtuneError(f"{flag}: {err}") from None
    for flag, path in (("--out", args.out), ("--after", args.after)):
        if path:
            output_file(flag, path)
    return params, sysfs, doc


def _boot(args) -> int:
    from slabtune.kernel import guest as qemu_guest
    from slabtune.kernel.snapshot import allocator, write_snapshot

    params, sysfs, doc = _check_inputs(args)
    for k in doc.get("kernel_change") or ():
        print(f"note: policy knob {k.get('knob')} needs a kernel change; not applied",
              file=sys.stderr)
    topo = _topology(args)
    workloads = ()
    if args.workload != "none":
        workloads = (qemu_guest.WorkloadSpec(mode=args.workload, transport=args.transport,
                                             groups=args.groups, fds=args.fds, loops=args.loops,
                                             msg_size=args.msg_size),)
        workloads[0].argv()   # range errors now, before a kernel is looked for
    spec = qemu_guest.GuestSpec(topology=topo, boot_params=params, workloads=workloads,
                                memory_mib=args.memory, timeout_s=args.timeout,
                                retries=args.retries, accel=args.accel, sysfs=sysfs)
    assets = qemu_guest.find_assets(kernel=_kernel_arg(args.kernel))
    if doc.get("profile") is not None:
        booted = qemu_guest.boot_profile(assets.kernel).name
        if booted != doc["profile"]:
            print(f"note: the policy was tuned for kernel profile {doc['profile']}; the "
                  f"booted kernel is {booted}", file=sys.stderr)
    r = qemu_guest.boot_guest(spec, assets)
    if r.ok:
        if args.out:
            write_snapshot(r.before, args.out)
        if args.after:
            write_snapshot(r.after, args.after)
    summary = {
        "ok": r.ok, "error": r.error, "accelerator": r.accelerator, "attempts": r.attempts,
        "boot_seconds": r.boot_seconds, "total_seconds": round(r.total_seconds, 3),
        "returncode": r.returncode, "kernel": r.kernel, "cmdline": r.cmdline,
        "caches": r.before.height if r.before is not None else 0,
        "workloads": r.workloads, "qemu_argv": r.qemu_argv, "policy": r.policy,
    }
    if args.json:
        print(jsonout.dumps(summary))
    elif r.ok:
        first = r.before.row(0, named=True)
        print(f"guest {first['kernel_release']} ({r.accelerator}, attempt {r.attempts}): "
              f"init after {r.boot_seconds:.1f} s, done after {r.total_seconds:.1f} s; cpus "
              f"possible {first['cpus_possible']} present {first['cpus_present']} online "
              f"{first['cpus_online']}; nodes with memory {first['nodes_with_memory'] or '-'}, "
              f"with cpus {first['nodes_with_cpu'] or '-'}; {r.before.height} caches"
              + ("; SLAB (/proc/slabinfo)" if allocator(r.before) == "slab" else ""))
        if r.policy:
            done = [w for w in r.policy if w["target"] is not None]
            print(f"policy: wrote {len(done)} sysfs values"
                  + "".join(f"; {w['cache']} {w['attr']}={w['value']}" for w in done))
            for w in r.policy:
                if w["target"] is None:
                    print(f"note: policy: this kernel has no cache {w['cache']}; its "
                          f"{w['attr']} was not written", file=sys.stderr)
        for w in r.workloads:
            print(f"workload {w.get('mode')}: {w.get('messages')} messages in "
                  f"{w.get('wall_s')} s")
        for flag, path in (("before", args.out), ("after", args.after)):
            if path:
                print(f"wrote {flag} snapshot to {path}")
    if not r.ok:
        print(f"slabtune: guest failed after {r.attempts} attempt(s): {r.error}", file=sys.stderr)
        print(r.console_tail[-2000:], file=sys.stderr)
        return 1
    return 0


def _probe(args) -> int:
    from slabtune.kernel import guest as qemu_guest

    probe = qemu_guest.probe_kvm(qemu_guest.find_assets(kernel=args.kernel), refresh=args.refresh)
    print(f"kvm usable: {'yes' if probe.usable else 'no'} ({probe.reason})")
    return 0


def _kernel_arg(value: str | None) -> str | None:
    """``--kernel``: a lab kernel's name (its built bzImage) or a path, as given."""
    from slabtune.kernel import build, lab_boot

    if value is not None and value in build.read_table():
        return str(lab_boot.resolve_kernel(value)[0])
    return value

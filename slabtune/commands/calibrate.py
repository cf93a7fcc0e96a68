"""``slabtune calibrate uml``: time the real allocator's paths natively in the User Mode
Linux kernel (``7.2-uml`` of scripts/build-kernels.sh) with the lab module, and write the
per-run rows (ns per allocation+free pair and SLUB_STATS counters per pair) as a CSV.
``slabtune calibrate fit``: fit the per-event cost constants to such a CSV
(:mod:`slabtune.calibrate.umlfit`) and write a cost file that ``simulate --cost`` and
``tune --cost`` read.  The work lives in :mod:`slabtune.kernel.uml` and
:mod:`slabtune.calibrate.umlfit`; this module parses and prints.
"""

from __future__ import annotations

import datetime
import os
import platform
import shlex
import sys


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "calibrate", help="time the real allocator natively (User Mode Linux) for per-event "
                          "costs",
        description="'slabtune calibrate uml': boot the 7.2-uml kernel (scripts/build-kernels.sh "
                    "--only 7.2-uml) as a host process, once per (scenario, CPU count, run), "
                    "run the lab module with its allocation and free calls timed, and print "
                    "the medians: ns per allocation+free pair and per call, and the SLUB_STATS "
                    "counters per pair.  Every run is one CSV row (--out).  Scenarios: local "
                    "(fast paths), local_burst_256 (sheaves swapped with the barn), "
                    "local_burst_1024 (sheaf refill/flush, slabs; _order1.._order3 on "
                    "larger slabs), producer_consumer (2+ "
                    "CPUs: remote frees).  Exit 0 when every run "
                    "completed, 1 when some failed, 2 on bad input.  'slabtune calibrate fit': "
                    "fit alloc_fast_ns, free_fast_ns, sheaf_swap_ns, sheaf_object_ns and "
                    "object_setup_ns, each inside its physical range and priced as the "
                    "model prices a lone CPU, jointly with the rig term uml_section_ns "
                    "(what User Mode Linux adds to each lock section taken with interrupts "
                    "off: printed and named in the file's header, never a constant of the "
                    "table), to the one-CPU rows of such CSVs "
                    "(--data; default: every calibrate/data/uml-*.csv of the package), every "
                    "other constant at its "
                    "physical prior, print measured against modelled ns per call (the "
                    "multi-CPU rows predicted, not fitted) and write the cost file to --out.")
    p.add_argument("target", choices=("uml", "fit"),
                   help="'uml': time the User Mode Linux kernel; 'fit': fit a cost file")
    p.add_argument("--data", metavar="CSV", action="append",
                   help="fit: a calibration CSV (repeatable; default: every "
                        "calibrate/data/uml-*.csv of the package, their runs together)")
    p.add_argument("--cpus", action="append", metavar="N",
                   help="virtual CPUs of a boot (repeatable; default: 1 and 2)")
    p.add_argument("--runs", default="5", metavar="K",
                   help="boots per (scenario, CPUs), seeds 1..K (default 5)")
    p.add_argument("--ops", default=None, metavar="N",
                   help="ops (allocations plus frees) per allocating worker (default 200000)")
    p.add_argument("--scenario", action="append", metavar="NAME",
                   help="local, local_burst_256, local_burst_1024[_order1|2|3] or "
                        "producer_consumer "
                        "(repeatable; default: all)")
    p.add_argument("--out", metavar="FILE",
                   help="uml: the CSV (default: calibrate/data/uml-7.2-<date>.csv, in a "
                        "calibrate/data directory that exists here); fit: the cost TOML "
                        "(default: print it)")
    p.add_argument("--nice", default=None, metavar="N",
                   help="niceness of the UML process, 0-19 (default 10)")
    p.add_argument("--timeout", default=None, metavar="S",
                   help="wall-clock limit per boot in seconds (default 120)")
    p.set_defaults(func=_calibrate)


def _int_arg(flag: str, text: str, lo: int, hi: int) -> int:
    from slabtune.errors import SlabtuneError

    try:
        v = int(text, 10)
    except (TypeError, ValueError):
        raise SlabtuneError(f"{flag}: {text!r} is not an integer") from None
    if not lo <= v <= hi:
        raise SlabtuneError(f"{flag}: {v} is outside {lo}..{hi}")
    return v


def _fit(args) -> int:
    from slabtune.calibrate import umlfit
    from slabtune.commands.paths import output_file
    from slabtune.results.safeio import write_atomic

    if args.out is not None:
        output_file("--out", args.out)      # a device, link or directory: refused before the fit
    data = args.data or umlfit.default_data()
    res = umlfit.fit(umlfit.read_rows(data), source=umlfit.sources(data))
    command = "slabtune calibrate fit" + "".join(f" --data {umlfit.source_name(d)}"
                                                 for d in (args.data or []))
    text = umlfit.to_toml(res, command)
    for line in umlfit.report(res):
        print(line, file=sys.stderr if args.out is None else sys.stdout)
    if args.out is None:
        print(text, end="")
        return 0
    out = write_atomic(output_file("--out", args.out), text, "--out")
    print(f"wrote {out}", file=sys.stderr)
    return 0


def _calibrate(args) -> int:
    if args.target == "fit":
        return _fit(args)
    from slabtune.commands.paths import output_file
    from slabtune.errors import SlabtuneError
    from slabtune.kernel import build, uml

    if args.out is not None:
        output_file("--out", args.out)               # before looking for the kernel
    image = uml.kernel_image()                       # one line when not built
    limit = uml.nr_cpus()
    cpus = sorted({_int_arg("--cpus", c, 1, limit) for c in (args.cpus or ["1", "2"])})
    runs = _int_arg("--runs", args.runs, 1, 1000)
    ops = _int_arg("--ops", args.ops, 1, 100_000_000) if args.ops else uml.DEFAULT_OPS
    nice = _int_arg("--nice", args.nice, 0, 19) if args.nice else uml.DEFAULT_NICE
    timeout = _int_arg("--timeout", args.timeout, 1, 3600) if args.timeout \
        else uml.DEFAULT_TIMEOUT_S
    scenarios = args.scenario or list(uml.SCENARIO_NAMES)
    for s in scenarios:
        if s not in uml.SCENARIO_NAMES:
            raise SlabtuneError(f"--scenario: {s!r} is not one of "
                                f"{', '.join(uml.SCENARIO_NAMES)}")
    today = datetime.date.today().isoformat()
    if args.out is None:
        if not os.path.isdir(os.path.join("calibrate", "data")):
            raise SlabtuneError("--out: no calibrate/data directory here; give --out FILE")
        args.out = os.path.join("calibrate", "data", f"uml-7.2-{today}.csv")
    out = output_file("--out", args.out)
    info = build.build_info(uml.UML_KERNEL) or {}
    load0 = _loadavg()

    def progress(line: str) -> None:
        print(f"slabtune: {line}", file=sys.stderr, flush=True)

    rows, results = uml.calibrate(cpus, runs, scenarios=scenarios, ops=ops, nice=nice,
                                  timeout_s=float(timeout), progress=progress)
    header = _header(args, info, image, cpus, runs, ops, nice, scenarios, load0, results)
    uml.write_csv(rows, out, header)
    print(format_table(uml.summary(rows), rows))
    print(f"wrote {out} ({len(rows)} rows)", file=sys.stderr)
    failed = [r for r in results if not r.ok]
    for r in failed[:3]:
        print(f"slabtune: failed run: {r.error}", file=sys.stderr)
    return 1 if failed else 0


def _loadavg() -> str:
    try:
        with open("/proc/loadavg") as fh:
            return " ".join(fh.read().split()[:3])
    except OSError:
        return "unknown"


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _header(args, info, image, cpus, runs, ops, nice, scenarios, load0, results) -> list[str]:
    from slabtune.kernel import uml

    ok = sum(1 for r in results if r.ok)
    release = next((r.release for r in results if r.release), info.get("kernel_release", "?"))
    lines = [
        "slabtune calibrate uml: the real SLUB allocator timed natively in User Mode Linux.",
        f"made {datetime.datetime.now().astimezone().isoformat(timespec='seconds')} by: "
        f"slabtune calibrate {' '.join(shlex.quote(a) for a in sys.argv[2:])}".rstrip(),
        f"kernel {release} ({image}; {info.get('package', '?')} {info.get('version', '?')}, "
        f"build inputs {str(info.get('inputs_hash', '?'))[:12]}, .config "
        f"{str(info.get('config_hash', '?'))[:12]}): ARCH=um, SMP, PREEMPT, SLUB_STATS; "
        "booted with ncpus=N seccomp=on mem=256M",
        f"host: {platform.node()} {platform.release()}, {os.cpu_count()} CPUs ({_cpu_model()}),"
        f" load average {load0} before, {_loadavg()} after; UML under nice -n {nice}",
        f"runs: {ok} of {len(results)} ok; CPUs {cpus}; {runs} runs each (seeds 1..{runs}); "
        f"{ops} ops per allocating worker; a 512-byte cache of the module's own",
        "scenarios: " + "; ".join(f"{s.name} ({dict(s.workload)}): {s.what}"
                                  for s in uml.SCENARIOS if s.name in scenarios),
        "timing: the lab module (time_calls=1, idle_spin=1) brackets each kmem_cache_alloc/"
        "kmem_cache_free with two ktime_get_ns() reads; UML's clock steps 256 ns, so a mean "
        "over >=1e5 calls is exact to a fraction of a ns;",
        "  clock_ns (an empty bracket's mean cost, measured in the run) is subtracted per "
        f"call; brackets > {uml.DEFAULT_LONG_NS} ns (a preempted host thread) are left out "
        "and counted in alloc_long/free_long.",
        "columns: ns_per_pair = alloc_ns_per_call + free_ns_per_call (allocator time per "
        "allocation+free pair); ns_per_pair_all counts the long brackets too;",
        "  loop_ns_per_alloc = the allocating workers' loop time (harness and waits included) "
        "per allocation; boot_s = the boot's wall time, run included;",
        "  <counter>_per_pair = SLUB_STATS delta of the cache over the run (after - before "
        "dumps) / pairs (7.x counts sheaf_refill and sheaf_flush in objects).",
    ]
    return lines


#: Counters shown in the printed table (per pair).
_TABLE_COUNTERS = ("sheaf_refill", "sheaf_flush", "barn_get", "barn_put", "alloc_slab",
                   "free_slab", "free_add_partial", "free_remove_partial")


def format_table(summary, rows) -> str:
    """The medians of each (scenario, cpus) as a text table."""
    def num(v, nd=1):
        return "-" if v is None else f"{v:.{nd}f}"

    total: dict[tuple[str, int], int] = {}
    for r in rows:
        total[(r["scenario"], r["cpus"])] = total.get((r["scenario"], r["cpus"]), 0) + 1
    head = (["scenario", "cpus", "runs", "ns/pair", "alloc ns", "free ns", "all ns/pair",
             "long"] + [c.replace("_", " ") for c in _TABLE_COUNTERS])
    lines = ["\t".join(head)]
    for s in summary:
        lines.append("\t".join([
            s["scenario"], str(s["cpus"]),
            f"{s['runs']}/{total.get((s['scenario'], s['cpus']), s['runs'])}",
            num(s["ns_per_pair"]), num(s["alloc_ns_per_call"]), num(s["free_ns_per_call"]),
            num(s["ns_per_pair_all"]),
            num((s["alloc_long"] or 0) + (s["free_long"] or 0), 0),
            *[num(s.get(f"{c}_per_pair"), 3) for c in _TABLE_COUNTERS]]))
    for key, n in total.items():
        if not any((s["scenario"], s["cpus"]) == key for s in summary):
            lines.append("\t".join([key[0], str(key[1]), f"0/{n}"] + ["-"] * (len(head) - 3)))
    return _columns(lines)


def _columns(lines: list[str]) -> str:
    cells = [ln.split("\t") for ln in lines]
    width = [max(len(r[i]) for r in cells) for i in range(len(cells[0]))]
    return "\n".join("  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w)
                               in enumerate(zip(r, width))) for r in cells)

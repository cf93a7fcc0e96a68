"""Run the lab module in a User Mode Linux kernel, to time the real allocator natively.

``7.2-uml`` (kernel/configs/kernels.tsv, arch ``um``) is Debian's 7.2 built with
``make ARCH=um``: the kernel is a host executable, and with SMP each virtual CPU is a host
thread, so mm/slub.c runs natively on the host's cores rather than under qemu's TCG.  This
module boots it as a subprocess (no root, no KVM) with the lab's own /init
(:func:`slabtune.kernel.lab_boot.init_script`: the cache's sysfs files dumped before and
after one run of the module) in an initramfs of :func:`lab_boot.build_initramfs`, and reads
the result back with :func:`lab_boot.console_result`, so a UML run is a
:class:`lab_boot.LabBootResult` like a qemu one (``accel`` ``"uml"``).

The command line (:func:`uml_argv`) is UML's own (arch/um, 7.2):

* ``ncpus=N``: virtual CPUs (arch/um/kernel/smp.c), at most the kernel's NR_CPUS;
* ``seccomp=on``: userspace processes under seccomp rather than ptrace; 7.2 refuses SMP with
  the ptrace userspace ("SMP is not supported with PTRACE userspace"), and the 1-CPU runs use
  it too, so every run has the same userspace mode;
* ``mem=``, ``initrd=<cpio>`` (a host file), ``con0=fd:0,fd:1`` (/dev/console on the
  process's stdin and stdout: stdin is a pipe nobody writes, stdout the console file),
  ``uml_dir=`` and ``umid=`` (UML's pid file and mconsole socket go to the run's temporary
  directory, not ~/.uml).

Every value on it is validated first (integers in range, paths and names of a fixed
alphabet), and the kernel runs from an argument list, never through a shell.

Timing (:func:`timing`): with ``time_calls=1`` the module brackets every allocation and free
call with two ``ktime_get_ns()`` reads (native/lab/slabtune_lab.c).  UML's clocksource
counts in steps of 256 ns (arch/um ``TIMER_MULTIPLIER``); a bracket of a call that starts at
a random phase of that step still has the call's duration as its mean, so a sum over 10^5
calls is exact to a fraction of a ns per call, and the mean cost of an empty bracket
(``clock_ps``, measured by each worker before the run) is subtracted per call.  Brackets
above ``long_ns`` are kept apart (``*_long``): on a shared host they are the virtual CPU's
host thread being preempted, not the allocator.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import re
import secrets
import shutil
import statistics
import subprocess
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from slabtune.errors import SlabtuneError
from slabtune.kernel import build, lab_boot, labmod
from slabtune.model import bootparams
from slabtune.native import cache_dir
from slabtune.results.safeio import write_atomic

#: The kernel of kernels.tsv this runner boots.
UML_KERNEL = "7.2-uml"
DEFAULT_MEMORY_MIB = 256
DEFAULT_TIMEOUT_S = 120.0
#: Ops per allocating worker of a calibration run.
DEFAULT_OPS = 200_000
#: Brackets above this many ns are counted apart (a preempted host thread).
DEFAULT_LONG_NS = 50_000
#: Niceness of the UML process (the host's cores are shared).
DEFAULT_NICE = 10
#: The largest NR_CPUS arch/um allows (NR_CPUS_RANGE_END).
UML_MAX_CPUS = 64
_PATH_RE = re.compile(r"^/[A-Za-z0-9_./+-]+$")
_UMID_RE = re.compile(r"^[A-Za-z0-9_-]{1,32}$")
#: Slab boot parameter names (model/bootparams.py: ``slub_min_order``, ``slab_max_order``..).
_PARAM_NAME_RE = re.compile(r"^sl[au]b_[a-z_]{1,32}$")


class UmlError(SlabtuneError):
    """A UML run cannot be set up (kernel not built, a bad value, no static busybox); one
    line."""


# --------------------------------------------------------------------------- command line


def _int(where: str, v: Any, lo: int, hi: int) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise UmlError(f"{where}: {v!r} is not an integer in {lo}..{hi}")
    return v


def _path(where: str, p: Path | str) -> str:
    """An absolute path UML can take on its command line (which it splits at spaces and
    commas do not separate anything, but keep the alphabet plain)."""
    s = str(p)
    if not _PATH_RE.match(s) or "/../" in s + "/":
        raise UmlError(f"{where}: {s!r} is not an absolute path of letters, digits and "
                       "_./+-")
    return s


def nr_cpus(kernel_name: str = UML_KERNEL) -> int:
    """CONFIG_NR_CPUS of a built UML kernel (its ``config``), else arch/um's upper bound."""
    try:
        text = (build.kernel_dir(kernel_name) / "config").read_text()
    except OSError:
        return UML_MAX_CPUS
    m = re.search(r"^CONFIG_NR_CPUS=(\d+)$", text, re.M)
    return int(m.group(1)) if m else UML_MAX_CPUS


def uml_argv(kernel: Path | str, initrd: Path | str, uml_dir: Path | str, *, cpus: int,
             memory_mib: int = DEFAULT_MEMORY_MIB, umid: str = "slabtune",
             max_cpus: int = UML_MAX_CPUS, nice: int | None = DEFAULT_NICE,
             boot_params: Mapping[str, int] | None = None) -> list[str]:
    """The argument list that boots a UML kernel with ``cpus`` virtual CPUs, ``memory_mib``
    of memory and the initramfs ``initrd``; ``nice`` (0..19, None: none) prefixes
    ``nice -n``.  ``boot_params``: slab boot parameters already checked against the
    kernel's profile (:func:`checked_boot_params`), each one more ``name=value`` word (UML
    hands the words it does not know to the kernel's command line).  Every value is
    checked; one UmlError line for a bad one."""
    _int("cpus", cpus, 1, min(max_cpus, UML_MAX_CPUS))
    words = []
    for k, v in (boot_params or {}).items():
        if not isinstance(k, str) or not _PARAM_NAME_RE.match(k):
            raise UmlError(f"boot parameter {k!r}: not a slab boot parameter name")
        words.append(bootparams.cmdline_arg(k, _int(k, v, 0, (1 << 31) - 1)))
    _int("memory_mib", memory_mib, 32, 1 << 16)
    if not isinstance(umid, str) or not _UMID_RE.match(umid):
        raise UmlError(f"umid: {umid!r} is not 1-32 letters, digits, _ or -")
    argv = [] if nice is None else ["nice", "-n", str(_int("nice", nice, 0, 19))]
    return argv + [
        _path("kernel", kernel),
        f"mem={memory_mib}M",
        f"ncpus={cpus}",
        "seccomp=on",
        f"initrd={_path('initrd', initrd)}",
        f"uml_dir={_path('uml_dir', uml_dir)}",
        f"umid={umid}",
        "con0=fd:0,fd:1",
    ] + words


# --------------------------------------------------------------------------- busybox


def _is_static_elf(path: Path) -> bool:
    """Whether ``path`` is an ELF executable without a program interpreter (PT_INTERP)."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(64)
            if len(head) < 64 or head[:4] != b"\x7fELF" or head[4] != 2:    # ELF64
                return False
            order = "little" if head[5] == 1 else "big"
            phoff = int.from_bytes(head[32:40], order)
            phentsize = int.from_bytes(head[54:56], order)
            phnum = int.from_bytes(head[56:58], order)
            fh.seek(phoff)
            table = fh.read(phentsize * phnum)
    except OSError:
        return False
    for i in range(phnum):
        if int.from_bytes(table[i * phentsize:i * phentsize + 4], order) == 3:   # PT_INTERP
            return False
    return True


def find_busybox(busybox: Path | str | None = None) -> Path:
    """A static busybox: the given one, else the cache's (scripts/install-guest-deps.sh),
    else the one on PATH.  UML runs it as a host process with nothing but the initramfs
    around it, so a dynamically linked one cannot start."""
    cand = busybox if busybox is not None else (
        cache_dir() / "busybox" if (cache_dir() / "busybox").exists()
        else shutil.which("busybox"))
    if cand is None:
        raise UmlError("busybox: not found; run scripts/install-guest-deps.sh (as root)")
    p = Path(cand).expanduser().resolve()
    if not p.is_file():
        raise UmlError(f"busybox: {p} is not a file")
    if not _is_static_elf(p):
        raise UmlError(f"busybox: {p} is not a statically linked 64-bit ELF executable")
    return p


# --------------------------------------------------------------------------- one run


def kernel_image(kernel_name: str = UML_KERNEL) -> Path:
    """The built UML executable of ``kernel_name``; one UmlError line when it is not a UML
    kernel or not built."""
    if kernel_name not in build.KERNELS:
        raise UmlError(f"kernel: unknown kernel {kernel_name!r} (known: "
                       f"{', '.join(build.KERNELS) or 'none'})")
    if build.kernel_arch(kernel_name) != "um":
        raise UmlError(f"kernel {kernel_name}: not a User Mode Linux kernel (arch "
                       f"{build.kernel_arch(kernel_name)})")
    image = build.kernel_path(kernel_name)
    if image is None or build.build_tree(kernel_name) is None:
        raise UmlError(f"kernel {kernel_name}: not built yet (scripts/build-kernels.sh "
                       f"--only {kernel_name})")
    return image


def kernel_release(kernel_name: str = UML_KERNEL) -> str:
    """The release string of a built UML kernel (its build record), for its profile."""
    info = build.build_info(kernel_name) or {}
    rel = info.get("kernel_release")
    if not rel:
        raise UmlError(f"kernel {kernel_name}: not built yet (scripts/build-kernels.sh "
                       f"--only {kernel_name})")
    return str(rel)


def kernel_profile(kernel_name: str = UML_KERNEL):
    """The model's profile of a built UML kernel: the era of its release
    (:func:`slabtune.model.profiles.detect_profile`; 7.2 runs under v7.1's rules)."""
    from slabtune.model import profiles

    return profiles.detect_profile(kernel_release(kernel_name))


def checked_boot_params(params: Mapping[str, Any] | None, kernel_name: str = UML_KERNEL
                        ) -> dict[str, int]:
    """Slab boot parameters checked against the UML kernel's profile (the allow-list and
    ranges of model/bootparams.py); the canonical ``slub_*`` names, which 7.2 still takes.
    One SlabtuneError line naming the parameter for a bad one."""
    from slabtune.model import bootparams

    if not params:
        return {}
    return bootparams.validate_params(dict(params), kernel_profile(kernel_name))


def run_lab(workload_doc: Mapping[str, Any], *, cpus: int,
            cache_doc: Mapping[str, Any] | None = None, ops: int = DEFAULT_OPS,
            seed: int = 1, ring: str = "lockless", time_calls: bool = True,
            long_ns: int = DEFAULT_LONG_NS, idle_spin: bool = True,
            memory_mib: int = DEFAULT_MEMORY_MIB,
            timeout_s: float = DEFAULT_TIMEOUT_S, nice: int | None = DEFAULT_NICE,
            kernel_name: str = UML_KERNEL, busybox: Path | str | None = None,
            boot_params: Mapping[str, Any] | None = None,
            sysfs: Mapping[str, int] | None = None) -> lab_boot.LabBootResult:
    """Boot the UML kernel with ``cpus`` virtual CPUs and run the ``[workload]`` table
    ``workload_doc`` once on the ``[cache]`` table ``cache_doc`` (default: a 512-byte cache
    of the module's own), ``ops`` ops per allocating worker, roles placed as
    :func:`labmod.module_params` places them on one node of ``cpus`` CPUs.  With
    ``time_calls`` the module times its allocator calls (:func:`timing`); with
    ``idle_spin`` a worker waiting for objects spins instead of sleeping a tick (the kernel
    has no high-resolution timers), so both sides of a hand-off run at once.  Setup errors
    raise (UmlError, LabError, LabBootError); a run that fails (timeout, UML exited before
    /init or before the end marker, insmod failed) returns ``ok=False`` with one line in
    ``error`` and the console tail.

    ``boot_params`` (slab boot parameters, :func:`checked_boot_params`) go on the command
    line; ``sysfs`` values (:data:`lab_boot.SYSFS_KNOBS`) are written to the cache's sysfs
    files by the /init before the run, as the qemu lab writes them (a kmalloc cache only:
    a cache of the module's own exists only during the run)."""
    kernel = kernel_image(kernel_name)
    cache_doc = dict(cache_doc or {"size": 512})
    boot = checked_boot_params(boot_params, kernel_name)
    sysfs = dict(sysfs or {})
    if sysfs and "name" not in cache_doc:
        raise UmlError(f"policy.params.{next(iter(sysfs))}: a cache of the module's own "
                       "exists only during the run; sysfs values are set on kmalloc caches "
                       "only")
    _int("cpus", cpus, 1, nr_cpus(kernel_name))
    _int("long_ns", long_ns, 0, (1 << 32) - 1)
    if not 1 <= timeout_s <= 3600:
        raise UmlError(f"timeout_s: {timeout_s!r} is outside 1..3600")
    params = (labmod.cache_params(cache_doc)
              + labmod.module_params(workload_doc, {"cpus": cpus}, ops=ops, seed=seed,
                                     ring=ring)
              + (["time_calls=1", f"long_ns={long_ns}"] if time_calls else [])
              + (["idle_spin=1"] if idle_spin else []))
    cache = cache_doc["name"] if "name" in cache_doc else labmod.MODULE_NAME
    lab_boot.init_script("x", cache, params, sysfs=sysfs)   # every value checked first
    bb = find_busybox(busybox)
    ko = labmod.build_module(kernel_name)
    token = secrets.token_hex(6)
    script = lab_boot.init_script(token, cache, params, sysfs=sysfs)
    with tempfile.TemporaryDirectory(prefix="slabtune-uml-") as tmp:
        tmpd = Path(tmp).resolve()
        initrd = tmpd / "initrd.cpio"
        initrd.write_bytes(lab_boot.build_initramfs(bb, ko, script))
        argv = uml_argv(kernel, initrd, tmpd, cpus=cpus, memory_mib=memory_mib,
                        umid=f"slabtune-{token}", max_cpus=nr_cpus(kernel_name), nice=nice,
                        boot_params=boot)
        console, err = tmpd / "console.log", tmpd / "stderr.log"
        rc, timed_out, seconds = _run(argv, console, err, token, timeout_s)
        text = console.read_text(errors="replace") if console.exists() else ""
        stderr = err.read_text(errors="replace") if err.exists() else ""
    return lab_boot.console_result(
        text, stderr, token, rc, timed_out, seconds, kernel=kernel, cache=cache,
        params=params, argv=argv, accel="uml", cmdline=" ".join(argv[argv.index(str(kernel))
                                                                     + 1:]),
        sysfs=sysfs, runner="uml")


def _run(argv: list[str], console: Path, err: Path, token: str, timeout_s: float
         ) -> tuple[int | None, bool, float]:
    """Run UML in its own session until it exits, a few seconds after the end marker, or
    the deadline (then the whole group, its helper processes included, is killed).
    stdout (its console) goes to ``console``, stderr (UML's own messages and the stderr
    console's printk) to ``err``; stdin is a pipe nobody writes (an EOF on /dev/console's
    input would hang it up).  Returns (exit status, timed out, seconds)."""
    with open(console, "wb") as out, open(err, "wb") as errf:
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=out, stderr=errf,
                                start_new_session=True, cwd=console.parent)
        try:
            timed_out, seconds = lab_boot.watch(proc, console, f"{lab_boot.MARK} E {token}",
                                                timeout_s, grace_s=5.0, poll_s=0.05)
        finally:
            if proc.stdin is not None:
                proc.stdin.close()
    return proc.returncode, timed_out, seconds


# --------------------------------------------------------------------------- timing


def timing(result: lab_boot.LabBootResult) -> dict[str, Any]:
    """The allocator's time in one run with ``time_calls=1``, from the module's worker
    records: calls, their bracketed ns (each worker's own empty-bracket cost, ``clock_ps``,
    subtracted per call it made), and the brackets kept apart above ``long_ns``.

    * ``alloc_ns_per_call``, ``free_ns_per_call``: over the calls that were not long;
    * ``ns_per_pair``: their sum, one allocation and one free (what a per-event cost model
      sums to per pair);
    * ``ns_per_pair_all``: every call's bracket, long ones included, per pair;
    * ``loop_ns_per_alloc``: the allocating workers' time to their last op (``ops_ns``:
      the module's loop, rings and waits included) per allocation.
    """
    ws = result.workers

    def total(key: str) -> int:
        return sum(int(w.get(key, 0)) for w in ws)

    def net(kind: str, long: bool) -> float:
        """Bracketed ns of one kind of call, each worker's clock cost taken off per call
        (the long brackets and their calls added with ``long``)."""
        out = 0.0
        for w in ws:
            n = int(w.get(f"{kind}s", 0)) - (0 if long else int(w.get(f"{kind}_long", 0)))
            ns = int(w.get(f"{kind}_ns", 0)) + (int(w.get(f"{kind}_long_ns", 0)) if long
                                                 else 0)
            out += ns - n * int(w.get("clock_ps", 0)) / 1000.0
        return out

    allocs, frees = total("allocs"), total("frees")
    a_long, f_long = total("alloc_long"), total("free_long")
    clocks = [int(w.get("clock_ps", 0)) / 1000.0 for w in ws]
    clock = statistics.median(clocks) if clocks else 0.0
    senders = [w for w in ws if int(w.get("allocs", 0)) > 0]
    a_n, f_n = allocs - a_long, frees - f_long
    a_call = net("alloc", False) / a_n if a_n > 0 else None
    f_call = net("free", False) / f_n if f_n > 0 else None
    pairs = min(allocs, frees)
    return {
        "allocs": allocs, "frees": frees, "pairs": pairs,
        "clock_ns": clock,
        "alloc_ns_per_call": a_call, "free_ns_per_call": f_call,
        "ns_per_pair": (a_call + f_call) if a_call is not None and f_call is not None
        else None,
        "ns_per_pair_all": (net("alloc", True) + net("free", True)) / pairs if pairs
        else None,
        "alloc_long": a_long, "free_long": f_long,
        "loop_ns_per_alloc": (sum(int(w.get("ops_ns", 0)) for w in senders)
                              / sum(int(w["allocs"]) for w in senders)) if senders else None,
    }


# --------------------------------------------------------------------------- calibration


@dataclasses.dataclass(frozen=True)
class Scenario:
    """One kind of calibration run: a ``[workload]`` table, the fewest CPUs it needs, and
    slab boot parameters (``boot``: e.g. ``slub_min_order`` to time the same workload on
    larger slabs)."""

    name: str
    workload: Mapping[str, Any]
    min_cpus: int = 1
    what: str = ""
    boot: Mapping[str, int] = dataclasses.field(default_factory=dict)


#: The calibration runs.  Each exercises a different mix of paths, so the per-event costs
#: can be fitted from the counters of all of them together.
SCENARIOS: tuple[Scenario, ...] = (
    Scenario("local", {"kind": "local", "live": 32, "alloc_prob": 0.5, "drain": "eager"}, 1,
             "local churn, 32 live per CPU: sheaf fast paths only"),
    Scenario("local_burst_256", {"kind": "local", "live": 256, "burst": 256, "drain": "eager"}, 1,
             "256 allocations then 256 frees per CPU: sheaves swapped with the barn"),
    Scenario("local_burst_1024", {"kind": "local", "live": 1024, "burst": 1024,
                                  "drain": "eager"}, 1,
             "1024 allocations then 1024 frees per CPU: sheaf refill and flush, barn, "
             "new and freed slabs"),
    Scenario("producer_consumer", {"kind": "producer_consumer", "depth": 64, "drain": "eager"}, 2,
             "half the CPUs allocate, the other half free: remote frees, full sheaves "
             "handed over through the barn"),
) + tuple(
    Scenario(f"local_burst_1024_order{k}", {"kind": "local", "live": 1024, "burst": 1024,
                                            "drain": "eager"}, 1,
             f"bursts of 1024 on slabs of order {k} (slub_min_order={k}): the same sheaf "
             "traffic over fewer, larger new slabs, which separates a slab's per-page cost "
             "from its per-object cost", boot={"slub_min_order": k})
    for k in (1, 2, 3))
SCENARIO_NAMES = tuple(s.name for s in SCENARIOS)

#: SLUB_STATS counters of 7.2 written to the CSV (per pair), in this order.
CSV_COUNTERS = (
    "alloc_fastpath", "alloc_slowpath", "free_fastpath", "free_slowpath",
    "sheaf_refill", "sheaf_flush", "sheaf_alloc", "sheaf_free", "barn_get",
    "barn_get_fail", "barn_put", "barn_put_fail", "alloc_slab", "free_slab",
    "alloc_from_partial", "free_add_partial", "free_remove_partial", "free_frozen",
    "alloc_refill", "cmpxchg_double_fail", "cmpxchg_double_cpu_fail", "cpuslab_flush",
)


def calibration_row(scenario: str, cpus: int, run: int, result: lab_boot.LabBootResult
                    ) -> dict[str, Any]:
    """One CSV row: the run's identity, its timing (:func:`timing`), the cache's slab
    ``order`` and ``objs_per_slab`` as its sysfs files gave them after the run (empty when
    not dumped), and every :data:`CSV_COUNTERS` delta per pair (one allocation plus one
    free)."""
    t = timing(result)
    after = result.dumps.get("after", {})
    counters = lab_boot.counter_deltas(result)
    pairs = t["pairs"] or 0
    row: dict[str, Any] = {
        "scenario": scenario, "cpus": cpus, "run": run, "ok": int(result.ok),
        "pairs": pairs, "ns_per_pair": t["ns_per_pair"],
        "alloc_ns_per_call": t["alloc_ns_per_call"], "free_ns_per_call": t["free_ns_per_call"],
        "ns_per_pair_all": t["ns_per_pair_all"], "loop_ns_per_alloc": t["loop_ns_per_alloc"],
        "clock_ns": t["clock_ns"], "alloc_long": t["alloc_long"], "free_long": t["free_long"],
        "boot_s": result.seconds,
        "order": lab_boot.counter_total(after.get("order")),
        "objs_per_slab": lab_boot.counter_total(after.get("objs_per_slab")),
    }
    for name in CSV_COUNTERS:
        row[f"{name}_per_pair"] = (counters.get(name, 0) / pairs) if pairs else None
    return row


def calibrate(cpus_list: Sequence[int], runs: int, *, scenarios: Iterable[str] = SCENARIO_NAMES,
              ops: int = DEFAULT_OPS, long_ns: int = DEFAULT_LONG_NS,
              nice: int | None = DEFAULT_NICE, timeout_s: float = DEFAULT_TIMEOUT_S,
              progress=None) -> tuple[list[dict[str, Any]], list[lab_boot.LabBootResult]]:
    """Every scenario on every CPU count of ``cpus_list`` it fits (``min_cpus``), ``runs``
    boots each (seeds 1..runs), interleaved run by run so that a slow spell of the host
    spreads over the scenarios.  Returns the CSV rows (:func:`calibration_row`) and the
    results, failed ones included (``ok`` 0)."""
    _int("runs", runs, 1, 1000)
    wanted = list(scenarios)
    for s in wanted:
        if s not in SCENARIO_NAMES:
            raise UmlError(f"scenario: {s!r} is not one of {', '.join(SCENARIO_NAMES)}")
    limit = nr_cpus()
    for c in cpus_list:
        _int("cpus", c, 1, limit)
    plan = [(s, c) for s in SCENARIOS if s.name in wanted for c in cpus_list
            if c >= s.min_cpus]
    if not plan:
        raise UmlError("cpus: no scenario fits these CPU counts (producer_consumer needs 2)")
    rows, results = [], []
    for run in range(1, runs + 1):
        for s, c in plan:
            res = run_lab(s.workload, cpus=c, ops=ops, seed=run, long_ns=long_ns, nice=nice,
                          boot_params=s.boot or None,
                          timeout_s=timeout_s)
            rows.append(calibration_row(s.name, c, run, res))
            results.append(res)
            if progress is not None:
                r = rows[-1]
                progress(f"{s.name} cpus={c} run {run}: "
                         + (f"{r['ns_per_pair']:.1f} ns/pair, {res.seconds:.1f} s"
                            if res.ok and r["ns_per_pair"] is not None
                            else f"failed: {res.error}"))
    return rows, results


def summary(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Medians over the successful runs of each (scenario, cpus): ns per pair and per call,
    and the counters per pair."""
    groups: dict[tuple[str, int], list[Mapping[str, Any]]] = {}
    for r in rows:
        if r.get("ok") and r.get("ns_per_pair") is not None:
            groups.setdefault((r["scenario"], r["cpus"]), []).append(r)
    out = []
    for (scen, cpus), rs in groups.items():
        med = {"scenario": scen, "cpus": cpus, "runs": len(rs)}
        for k in rs[0]:
            if k in ("scenario", "cpus", "run", "ok"):
                continue
            vals = [r[k] for r in rs if r.get(k) is not None]
            med[k] = statistics.median(vals) if vals else None
        out.append(med)
    return out


def write_csv(rows: Sequence[Mapping[str, Any]], path: Path | str, header: Sequence[str]
              ) -> None:
    """The rows as CSV, after ``#`` comment lines ``header`` (how they were made)."""
    path = Path(path)
    if not rows:
        raise UmlError("no rows to write")
    fields = list(rows[0])
    path.parent.mkdir(parents=True, exist_ok=True)
    fh = io.StringIO(newline="")
    for line in header:
        fh.write(f"# {line}\n")
    w = csv.DictWriter(fh, fieldnames=fields, lineterminator="\n")
    w.writeheader()
    for r in rows:
        w.writerow({k: _fmt(r.get(k)) for k in fields})
    write_atomic(path, fh.getvalue(), "--out")


def _fmt(v: Any) -> Any:
    if v is None:
        return ""
    if isinstance(v, float):
        return f"{v:.6g}"
    return v


def read_csv(path: Path | str) -> list[dict[str, str]]:
    """Rows of a CSV :func:`write_csv` wrote (comment lines skipped), values as text."""
    with open(path, newline="") as fh:
        lines = [ln for ln in fh if not ln.startswith("#")]
    return list(csv.DictReader(lines))

"""Boot one of slabtune's own kernels under qemu with the lab module and read a cache's
SLUB_STATS counters around one run of it.

The guest is built from kernel/guest.py's public pieces (the topology's ``-smp``/``-numa``
arguments, the command line, the qemu argv, the newc cpio writer) around an /init of its
own (busybox sh) that

1. mounts proc and sysfs and sets the console log level to 1 (kernel messages stay in the
   log buffer, off the serial console), and writes the run's knobs to the cache: SLUB's
   sysfs files (``min_partial``, ``cpu_partial``) or, on the SLAB kernel, the tunables
   line ``<cache> <limit> <batchcount> <shared>`` to /proc/slabinfo,
2. dumps every readable file of ``/sys/kernel/slab/<cache>/`` (``warm``, discarded: it
   instantiates the sysfs inodes; then ``base``),
3. loads and unloads the module once without running it and reads the log, as the run
   will (``before`` then minus ``base`` is what everything but the run costs the cache:
   module loading, kthread-free bookkeeping, the commands' forks),
4. loads the module with the run's parameters; with a warm-up (the module's ``warmup``
   ops per allocating worker) every worker parks at the end of it, /proc/slabtune_lab
   reads ``parked``, the /init dumps ``window`` and writes ``resume`` there, and the
   counted window runs (``window`` to ``after``: the cache's start-up is outside it);
   with ``end_park=1`` (``drain = "hold"`` in lockstep) the workers park again after the
   window's last step, /proc/slabtune_lab reads ``ended``, the /init dumps ``end`` and
   writes ``resume``, and the drain that frees the live sets runs outside the window
   (``window`` to ``end``);
5. prints the module's log lines, dumps ``after``, unloads the module and powers off.

Every line the host reads starts with ``@@LAB``; the dumps use the shell's ``read``
builtin, so they fork nothing.  Nothing a caller types reaches the shell unchecked: module
parameters are ``key=value`` words of a fixed alphabet, knob values checked ints.
"""

from __future__ import annotations

import dataclasses
import os
import re
import secrets
import signal
import stat
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from slabtune.errors import SlabtuneError
from slabtune.kernel import build, guest, labmod
from slabtune.model import profiles, slab
from slabtune.model.topology import Topology

MARK = "@@LAB"
#: busybox applets the /init uses.
APPLETS = ("sh", "mount", "echo", "cat", "insmod", "rmmod", "dmesg", "grep", "poweroff",
           "sleep", "sync", "mkfifo")
DEFAULT_TIMEOUT_S = 300.0
#: Seconds between two samples of the cache's ``slabs`` file while the run goes on.
SAMPLE_INTERVAL_S = 0.05
#: Attempts a boot that failed before the run could report (timeout, no start or end
#: marker) gets in all: one retry for boot flakes.
BOOT_ATTEMPTS = 2
#: Every SLUB_STATS file of the kernels the lab builds (``enum stat_item`` of mm/slub.c,
#: lower-cased as sysfs names them): 6.1 and 6.12 have the per-CPU slab and partial
#: counters, 7.2 (sheaves for every cache) has sheaf and barn counters instead.
SLUB_STAT_FILES = (
    "alloc_fastpath", "alloc_slowpath", "free_fastpath", "free_slowpath", "free_frozen",
    "free_add_partial", "free_remove_partial", "alloc_from_partial", "alloc_slab",
    "alloc_refill", "alloc_node_mismatch", "free_slab", "cpuslab_flush", "deactivate_full",
    "deactivate_empty", "deactivate_to_head", "deactivate_to_tail",
    "deactivate_remote_frees", "deactivate_bypass", "order_fallback",
    "cmpxchg_double_cpu_fail", "cmpxchg_double_fail", "cpu_partial_alloc",
    "cpu_partial_free", "cpu_partial_node", "cpu_partial_drain",
    # v6.18 / v7.x sheaves and barns
    "free_rcu_sheaf", "free_rcu_sheaf_fail", "sheaf_flush", "sheaf_refill", "sheaf_alloc",
    "sheaf_free", "barn_get", "barn_get_fail", "barn_put", "barn_put_fail",
    "sheaf_prefill_fast", "sheaf_prefill_slow", "sheaf_prefill_oversize",
    "sheaf_return_fast", "sheaf_return_slow",
)
#: Phases the /init dumps the cache in (``warm`` goes to /dev/null); ``window`` only in a
#: run with a warm-up, at the start of its counted window; ``end`` only in a run with
#: ``end_park=1``, at its end, before the drain.
PHASES = ("base", "before", "window", "end", "after")
#: The module parameter that parks the workers at the window's end (labmod.module_params).
END_PARK = "end_park=1"
_PARAM_RE = re.compile(r"^[a-z_]+=[A-Za-z0-9_,\-]+$")
_KO_PATH = "lib/slabtune_lab.ko"


class LabBootError(SlabtuneError):
    """A lab boot cannot be set up or failed; one line."""


@dataclasses.dataclass
class LabBootResult:
    """What one lab boot read back."""

    ok: bool
    error: str
    kernel: str
    release: str
    cache: str
    #: files of /sys/kernel/slab/<cache>/ (as the ``after`` dump listed them)
    files: list[str]
    #: phase -> file -> first line of the file (``base``, ``before``, ``after``)
    dumps: dict[str, dict[str, str]]
    #: phases in which the cache did not exist (an own cache before the run): counters 0
    missing: list[str]
    #: the cache's ``slabs`` file sampled during the run, in order
    samples: list[str]
    #: the module's ``done`` record (None when it printed none) and ``worker`` records
    done: dict | None
    workers: list[dict]
    module_errors: list[dict]
    insmod_rc: int | None
    params: list[str]
    qemu_argv: list[str]
    accel: str
    seconds: float
    console_tail: str
    #: boots made (a boot flake is retried once, see BOOT_ATTEMPTS)
    attempts: int = 1
    cmdline: str = ""
    #: samples taken before the counted window (a run with a warm-up); None: no window
    window_at: int | None = None
    #: samples taken before the window's end (a run with ``end_park=1``); None: the end
    end_at: int | None = None

    def value(self, phase: str, name: str) -> int | None:
        """The total (first number) of counter ``name`` in ``phase``: 0 when the cache did
        not exist yet in that phase, None when the file is absent."""
        if phase in self.missing:
            return 0
        return counter_total(self.dumps.get(phase, {}).get(name))

    def delta(self, name: str, start: str = "before", end: str = "after") -> int | None:
        """``end`` minus ``start`` of counter ``name`` (None when either is absent)."""
        a, b = self.value(start, name), self.value(end, name)
        return None if a is None or b is None else b - a

    def per_cpu_delta(self, name: str, start: str = "before", end: str = "after"
                      ) -> dict[int, int]:
        """Per-CPU deltas of a SLUB_STATS counter (its ``C<cpu>=<n>`` fields)."""
        a = counter_per_cpu(self.dumps.get(start, {}).get(name))
        b = counter_per_cpu(self.dumps.get(end, {}).get(name))
        return {c: b.get(c, 0) - a.get(c, 0) for c in sorted(set(a) | set(b))}


def counter_total(raw: str | None) -> int | None:
    """The first number of a sysfs slab file's line (``"123 C0=100 C1=23"`` -> 123)."""
    if not raw:
        return None
    head = raw.split(" ", 1)[0]
    try:
        return int(head)
    except ValueError:
        return None


def counter_per_cpu(raw: str | None) -> dict[int, int]:
    """``"123 C0=100 C1=23"`` -> ``{0: 100, 1: 23}``."""
    out: dict[int, int] = {}
    for part in (raw or "").split()[1:]:
        m = re.fullmatch(r"C(\d+)=(\d+)", part)
        if m:
            out[int(m.group(1))] = int(m.group(2))
    return out


# --------------------------------------------------------------------------- the guest


#: Per-cache sysfs files a lab run may set before it starts (simulation knobs of the same
#: names, sweeps/simconfig.py SIM_KNOBS); cpu_partial exists only with per-CPU partial lists.
SYSFS_KNOBS = ("min_partial", "cpu_partial")
#: The /proc/slabinfo tunables a lab run on the SLAB kernel writes before it starts, in the
#: order of the line slabinfo_write() parses (``name limit batchcount shared``).
SLABINFO_TUNABLES = slab.SLAB_TUNABLES


def check_slabinfo(tunables: Mapping[str, int]) -> tuple[int, int, int]:
    """The ``(limit, batchcount, shared)`` of a SLAB lab run's /proc/slabinfo write,
    checked.  slabinfo_write() (6.1 mm/slab.c) takes one line of all three: it returns
    -EINVAL for a cache name it does not find, and for a line it does not accept
    (:func:`slabtune.model.slab.tunables_accepted`: ``limit >= 1``,
    ``1 <= batchcount <= limit``, ``shared >= 0``) it returns success and changes nothing,
    so such a line is refused here rather than run with the kernel's defaults; a limit
    above :data:`slabtune.model.slab.LIMIT_MAX` fails in __alloc_percpu()
    (do_tune_cpucache(), -ENOMEM).  Every value is an int (never a string for the shell);
    one error line names the field."""
    from slabtune.model.slab import LIMIT_MAX as SLAB_LIMIT_MAX
    from slabtune.model.slab import tunables_accepted

    missing = [k for k in SLABINFO_TUNABLES if k not in tunables]
    extra = [k for k in tunables if k not in SLABINFO_TUNABLES]
    if extra:
        raise LabBootError(f"policy.params.{extra[0]}: not a /proc/slabinfo tunable (the "
                           f"lab writes {', '.join(SLABINFO_TUNABLES)})")
    if missing:
        raise LabBootError(f"policy.params.{missing[0]}: slabinfo_write() takes limit, "
                           "batchcount and shared in one line; give all three")
    for k in SLABINFO_TUNABLES:
        v = tunables[k]
        if isinstance(v, bool) or not isinstance(v, int) or not -(1 << 31) <= v < 1 << 31:
            raise LabBootError(f"policy.params.{k}: {v!r} is not an integer")
    lim, bc, sh = (int(tunables[k]) for k in SLABINFO_TUNABLES)
    if not tunables_accepted(lim, bc, sh):
        raise LabBootError(f"policy.params.batchcount: limit {lim}, batchcount {bc}, shared "
                           f"{sh}: slabinfo_write() ignores the line (it needs limit >= 1, "
                           "1 <= batchcount <= limit, shared >= 0)")
    if lim > SLAB_LIMIT_MAX:
        raise LabBootError(f"policy.params.limit: {lim} is above {SLAB_LIMIT_MAX} (the per-CPU "
                           "array would exceed __alloc_percpu()'s 32 KiB)")
    return lim, bc, sh


def _slub_probe() -> list[str]:
    """Shell functions of a SLUB kernel: ``dump <phase>`` prints every readable file of
    the cache's sysfs directory ``$D``; ``sample`` sets ``v`` to its ``slabs`` line."""
    return [
        "dump() {",
        '  [ -d "$D/" ] || { echo "$M X $1"; return; }',
        '  for f in "$D"/*; do',
        '    [ -f "$f" ] || continue',
        '    v=; { read -r v < "$f"; } 2>/dev/null || [ -n "$v" ] || continue',
        '    echo "$M C $1 ${f##*/} $v"',
        "  done",
        '  echo "$M N $1"',
        "}",
        'sample() { v=; { read -r v < "$D/slabs"; } 2>/dev/null; }',
    ]


def _slab_probe() -> list[str]:
    """Shell functions of a SLAB kernel (no /sys/kernel/slab): ``dump <phase>`` prints the
    cache's /proc/slabinfo line (after its name) as file ``slabinfo``; ``sample`` sets ``v``
    to ``num_slabs A=active_objs O=num_objs`` of it (the 14th field after the name is
    num_slabs, mm/slab_common.c cache_show()).  Reads through the ``read`` builtin only."""
    return [
        "line() {",
        "  l=; while read -r n rest; do",
        '    [ "$n" = "$C" ] && { l=$rest; break; }',
        "  done < /proc/slabinfo",
        "}",
        "dump() {",
        '  line; [ -n "$l" ] || { echo "$M X $1"; return; }',
        '  echo "$M C $1 slabinfo $l"',
        '  echo "$M N $1"',
        "}",
        'sample() { line; v=; [ -n "$l" ] && { set -- $l; v="${14} A=$1 O=$2"; }; }',
    ]


def init_script(token: str, cache: str, params: Sequence[str],
                sample_s: float = SAMPLE_INTERVAL_S,
                sysfs: Mapping[str, int] | None = None, allocator: str = "slub",
                slabinfo: Mapping[str, int] | None = None) -> str:
    """The guest's /init for one lab run on /sys/kernel/slab/``cache`` (``allocator``
    ``slub``) or on the cache's /proc/slabinfo line (``slab``: SLAB has no sysfs
    directory).  Before anything is dumped, ``sysfs`` values (:data:`SYSFS_KNOBS`, SLUB's)
    are written to the cache's files, or on SLAB the ``slabinfo`` tunables
    (:func:`check_slabinfo`) as the line ``<cache> <limit> <batchcount> <shared>`` to
    /proc/slabinfo (slabinfo_write() -> do_tune_cpucache(), 6.1 mm/slab.c: the per-CPU
    arrays are replaced and their objects freed to the node lists, the node's shared array
    is re-made with shared * batchcount entries and free_limit recomputed; the alien
    arrays stay as enable_cpucache() made them, setup_kmem_cache_node() keeps an existing
    one)."""
    if allocator not in ("slub", "slab"):
        raise LabBootError(f"allocator: {allocator!r} is not slub or slab")
    sysfs = dict(sysfs or {})
    if sysfs and allocator == "slab":
        raise LabBootError(f"policy.params.{next(iter(sysfs))}: a SLUB sysfs file; SLAB "
                           "has no /sys/kernel/slab")
    if slabinfo and allocator != "slab":
        raise LabBootError(f"policy.params.{next(iter(slabinfo))}: a SLAB /proc/slabinfo "
                           "tunable; a SLUB kernel takes none")
    tune = check_slabinfo(slabinfo) if slabinfo else None
    for k, v in sysfs.items():
        if k not in SYSFS_KNOBS:
            raise LabBootError(f"policy.params.{k}: the lab sets only {', '.join(SYSFS_KNOBS)}")
        if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < 1 << 31:
            raise LabBootError(f"policy.params.{k}: {v!r} is not a non-negative integer")
    if not 0.001 <= sample_s <= 10:
        raise LabBootError(f"sample_s: {sample_s!r} is outside 0.001..10 s")
    if not token.isalnum():
        raise LabBootError("token: must be alphanumeric")
    if not re.fullmatch(r"[A-Za-z0-9_:\-]+", cache):
        raise LabBootError(f"cache: {cache!r} is not a slab cache name")
    for p in params:
        if not _PARAM_RE.match(p):
            raise LabBootError(f"params: {p!r} is not a key=value module parameter")
    args = " ".join(params)
    # end_park=1: once the window is open, watch for the workers parking at its end
    end_watch = [
        '  elif [ -z "$e" ]; then',
        '    v=; { read -r v < /proc/slabtune_lab; } 2>/dev/null',
        '    if [ "$v" = ended ]; then',
        '      dump end; echo "$M I end_sample $i"; e=1',
        '      echo resume > /proc/slabtune_lab; echo "$M R resume_end $?"',
        "    fi",
    ] if END_PARK in params else []
    return "\n".join([
        *guest.init_prelude(MARK),
        f"D=/sys/kernel/slab/{cache}", f"C={cache}",
        f'echo "$M S {token}"',
        'v=; read v < /proc/sys/kernel/osrelease; echo "$M I release $v"',
        'v=; read v < /sys/devices/system/cpu/online; echo "$M I cpus_online $v"',
        'v=NA; [ -r /sys/devices/system/node/has_memory ] && '
        '{ read v < /sys/devices/system/node/has_memory; }; echo "$M I has_memory $v"',
        *(_slab_probe() if allocator == "slab" else _slub_probe()),
        *[f'echo {v} > "$D/{k}"; echo "$M R set_{k} $?"' for k, v in sysfs.items()],
        *([f'echo "$C {tune[0]} {tune[1]} {tune[2]}" > /proc/slabinfo; '
           'echo "$M R set_slabinfo $?"'] if tune else []),
        "dump warm > /dev/null",
        "dump base",
        f"insmod /{_KO_PATH} autorun=0",
        'echo "$M R probe_insmod $?"',
        "rmmod slabtune_lab",
        'echo "$M R probe_rmmod $?"',
        "dmesg | grep 'slabtune_lab: ' > /dev/null",
        "dump before",
        # the run: insmod in the background while the cache's slab count is sampled every
        # SAMPLE_INTERVAL_S (the wait is a read with a timeout on a FIFO: no fork, no CPU);
        # when the module's workers park after their warm-up, the window's start is dumped
        # and the run resumed (a read and a write of /proc/slabtune_lab, no fork either)
        "mkfifo /tmp/tick",
        f"( insmod /{_KO_PATH} {args}; echo $? > /tmp/rc ) &",
        "i=0; w=; e=",
        "while [ ! -e /tmp/rc ]; do",
        '  sample; [ -n "$v" ] && echo "$M P $i $v"',
        '  if [ -z "$w" ]; then',
        '    v=; { read -r v < /proc/slabtune_lab; } 2>/dev/null',
        '    if [ "$v" = parked ]; then',
        '      dump window; echo "$M I window_sample $i"; w=1',
        '      echo resume > /proc/slabtune_lab; echo "$M R resume $?"',
        "    fi",
        *end_watch,
        "  fi",
        "  i=$((i+1))",
        f"  read -t {sample_s:g} v <> /tmp/tick",
        "done",
        "wait",
        'v=; read v < /tmp/rc; echo "$M R insmod $v"',
        "dmesg | grep 'slabtune_lab: ' > /tmp/lab.log",
        "dump after",
        'while read -r l; do echo "$M K $l"; done < /tmp/lab.log',
        "rmmod slabtune_lab",
        'echo "$M R rmmod $?"',
        f'echo "$M E {token}"',
        "sync",
        "poweroff -f",
        "sleep 60",
    ]) + "\n"


def build_initramfs(busybox: Path, ko: Path, script: str) -> bytes:
    """An uncompressed newc initramfs: busybox and its applet links, the module, /init and
    /dev/console (kernel/guest.py's cpio writer)."""
    d = stat.S_IFDIR | 0o755
    entries = [guest.CpioEntry(n, d) for n in ("bin", "dev", "lib", "proc", "sys", "tmp")]
    entries.append(guest.CpioEntry("dev/console", stat.S_IFCHR | 0o600, rdev=(5, 1)))
    entries.append(guest.CpioEntry("bin/busybox", stat.S_IFREG | 0o755,
                                   Path(busybox).read_bytes()))
    entries += [guest.CpioEntry(f"bin/{a}", stat.S_IFLNK | 0o777, b"busybox")
                for a in APPLETS]
    entries.append(guest.CpioEntry(_KO_PATH, stat.S_IFREG | 0o644, Path(ko).read_bytes()))
    entries.append(guest.CpioEntry("init", stat.S_IFREG | 0o755, script.encode()))
    return guest.cpio_newc(entries)


def parse_console(text: str, token: str) -> dict[str, Any]:
    """The ``@@LAB`` records of a console log: started/ended, info, dumps, return codes,
    the module's kernel log lines."""
    out: dict[str, Any] = {"started": False, "ended": False, "info": {}, "rc": {},
                           "dumps": {p: {} for p in PHASES}, "missing": [], "log": [],
                           "samples": [], "window_at": None, "end_at": None}
    for raw in text.replace("\r\n", "\n").split("\n"):
        line = raw.rstrip("\r")
        if not line.startswith(MARK + " "):
            continue
        parts = line.split(" ", 4)
        kind = parts[1] if len(parts) > 1 else ""
        if kind == "S" and len(parts) > 2 and parts[2] == token:
            out["started"] = True
        elif kind == "E" and len(parts) > 2 and parts[2] == token:
            out["ended"] = True
        elif kind == "I" and len(parts) > 3:
            out["info"][parts[2]] = " ".join(parts[3:])
            if parts[2] == "window_sample":
                out["window_at"] = len(out["samples"])
            elif parts[2] == "end_sample":
                out["end_at"] = len(out["samples"])
        elif kind == "R" and len(parts) > 3:
            out["rc"][parts[2]] = int(parts[3]) if parts[3].lstrip("-").isdigit() else None
        elif kind == "C" and len(parts) > 3 and parts[2] in out["dumps"]:
            out["dumps"][parts[2]][parts[3]] = parts[4] if len(parts) > 4 else ""
        elif kind == "P" and len(parts) > 3 and parts[2].isdigit():
            out["samples"].append(" ".join(parts[3:]))
        elif kind == "X" and len(parts) > 2:
            out["missing"].append(parts[2])
        elif kind == "K":
            out["log"].append(line.split(" ", 2)[2] if line.count(" ") >= 2 else "")
    return out


def watch(proc: subprocess.Popen, console: Path, end: str, timeout_s: float,
          grace_s: float = 10.0, poll_s: float = 0.1) -> tuple[bool, float]:
    """Poll ``proc`` (started in its own session) until it exits, ``grace_s`` after the
    line ``end`` appeared in ``console``, or ``timeout_s`` (``t0``: now); a process still
    running then has its whole group killed.  Returns (timed out, seconds)."""
    t0 = time.monotonic()
    timed_out = False
    ended_at = None
    try:
        while proc.poll() is None:
            now = time.monotonic()
            if ended_at is None and console.exists() \
                    and end in console.read_text(errors="replace"):
                ended_at = now
            if ended_at is not None and now - ended_at > grace_s:
                break
            if now - t0 > timeout_s:
                timed_out = True
                break
            time.sleep(poll_s)
    finally:
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait(timeout=10)
    return timed_out, time.monotonic() - t0


def _run_qemu(argv: list[str], console: Path, token: str, timeout_s: float
              ) -> tuple[int | None, bool, float]:
    """Run qemu in its own process group until it exits, a few seconds after the end
    marker, or the deadline (then the group is killed).  Returns (rc, timed_out, s)."""
    with open(console.with_suffix(".err"), "wb") as err:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=err, stderr=err,
                                start_new_session=True)
        timed_out, seconds = watch(proc, console, f"{MARK} E {token}", timeout_s)
    return proc.returncode, timed_out, seconds


def boot_lab(kernel_name: str, workload_doc: Mapping[str, Any], topology: Topology,
             *, cache_doc: Mapping[str, Any] | None = None, ops: int = labmod.DEFAULT_OPS,
             seed: int = 1, ring: str = "lockless", memory_mib: int = 512,
             timeout_s: float = DEFAULT_TIMEOUT_S, accel: str = "auto",
             extra_params: Sequence[str] = (), boot_params: Mapping[str, int] | None = None,
             sysfs: Mapping[str, int] | None = None,
             attempts: int = BOOT_ATTEMPTS, warmup: int = 0, lockstep: bool = False,
             slabinfo: Mapping[str, int] | None = None) -> LabBootResult:
    """Build the module for ``kernel_name``, boot that kernel on ``topology`` and run the
    ``[workload]`` table ``workload_doc`` on the ``[cache]`` table ``cache_doc`` (default
    kmalloc-512); the counters of that cache before and after, its slab count sampled
    during the run, and the module's records.  ``kernel_name`` is a kernel of
    ``scripts/build-kernels.sh`` (``6.1``, ``6.12``, ``7.2``) or the path of a bzImage whose
    build tree the module can be built against (see :func:`resolve_kernel`).
    ``extra_params`` (``key=value``) go after the generated module parameters and so
    override them; ``boot_params`` (slab boot parameters) go on the kernel command line,
    checked against the kernel's profile; ``sysfs`` values are written to the cache's
    sysfs files before the run (a kmalloc cache: an own cache does not exist until then),
    on the SLAB kernel the ``slabinfo`` tunables (limit, batchcount, shared) to
    /proc/slabinfo (:func:`init_script`; a kmalloc cache likewise).
    ``warmup``: ops per allocating worker before the counted window (the module parks its
    workers there and the /init dumps ``window``; see :func:`measure`).  ``lockstep``: the
    module's step barrier in the warm-up and the window
    (:func:`slabtune.kernel.labmod.module_params`).
    A boot that fails before the run reports (timeout, no start or end marker) is retried
    until ``attempts`` boots were made.
    Setup errors raise (LabError, GuestError, LabBootError); a guest that fails returns
    ``ok=False`` with the reason in ``error``."""
    cache_doc = dict(cache_doc or {"name": "kmalloc-512"})
    kernel, tree_name = resolve_kernel(kernel_name)
    # SLAB_NO_MERGE exists from v6.5; before it, an own cache of a kmalloc size would be
    # merged into kmalloc-N (find_mergeable()) and its counters mixed with the kernel's,
    # so those kernels boot with slab_nomerge instead.
    ver = profiles.release_version(guest.bzimage_release(kernel))
    old_kernel = ver is not None and ver < (6, 5)
    own = "name" not in cache_doc
    params = (labmod.cache_params(cache_doc, no_merge=not old_kernel)
              + labmod.module_params(workload_doc, topology, ops=ops, seed=seed, ring=ring,
                                     warmup=warmup, lockstep=lockstep)
              + list(extra_params))
    cache = cache_doc["name"] if not own else labmod.MODULE_NAME
    if sysfs and own:
        raise LabBootError(f"policy.params.{next(iter(sysfs))}: a cache of the module's own "
                           "exists only during the run; the lab sets sysfs values on kmalloc "
                           "caches only")
    if slabinfo and own:
        raise LabBootError(f"policy.params.{next(iter(slabinfo))}: a cache of the module's "
                           "own exists only during the run; the lab writes /proc/slabinfo "
                           "tunables of kmalloc caches only")
    # the lab's SLAB build is checked against its SLAB profile (slab_max_order=) and read
    # through /proc/slabinfo
    profile = guest.boot_profile(kernel)
    allocator = "slab" if profiles.is_slab(profile) else "slub"
    init_script("x", cache, params, sysfs=sysfs, allocator=allocator,   # checked before a boot
                slabinfo=slabinfo)
    ko = labmod.build_module(tree_name)
    # find_assets checks qemu, the kernel and busybox; the module stands in for the
    # workload binary, which this guest does not use.
    assets = guest.find_assets(kernel=kernel, workload=ko, build=False)
    cmdline = guest.guest_cmdline(dict(boot_params or {}), topology, profile)
    if own and old_kernel:
        cmdline += " slab_nomerge"
    if accel == "auto":
        accel = "kvm" if guest.probe_kvm(assets).usable else "tcg"
    if not 1 <= attempts <= 5:
        raise LabBootError(f"attempts: {attempts!r} is outside 1..5")
    result = None
    for n in range(1, attempts + 1):
        result = _boot_once(assets, ko, kernel, cache, params, cmdline, topology, memory_mib,
                            timeout_s, accel, dict(sysfs or {}), allocator,
                            dict(slabinfo or {}))
        result.attempts = n
        if result.ok or not _is_boot_flake(result.error):
            break
    assert result is not None
    return result


def resolve_kernel(name: str) -> tuple[Path, str]:
    """``(bzImage, lab kernel name)`` for ``--kernel``: a kernel of
    ``scripts/build-kernels.sh`` (``6.1``, ``6.12``, ``7.2``, ``6.1-slab``) by name, or a
    bzImage path whose release string is that of a built lab kernel (the module is built
    against that kernel's kept tree; a kernel of another release has no tree to build it
    against).  One error line when neither holds."""
    table = build.read_table()
    if name in table:
        if table[name].arch != "x86":
            raise LabBootError(f"--kernel {name}: a User Mode Linux kernel, not a bzImage for "
                               "qemu (kernel/uml.py runs it: slabtune calibrate uml)")
        kernel = build.kernel_path(name)
        if kernel is None:
            raise LabBootError(f"--kernel {name}: not built yet (scripts/build-kernels.sh "
                               f"--only {name})")
        return kernel, name
    path = Path(name)
    if not path.is_file():
        raise LabBootError(f"--kernel {name}: neither a lab kernel ({', '.join(table)}) nor "
                           "a bzImage file")
    release = guest.bzimage_release(path)
    for known in table:
        built = build.kernel_path(known)
        if built is not None and release and guest.bzimage_release(built) == release:
            return path, known
    raise LabBootError(f"--kernel {name}: release {release or 'unknown'} is not one of the "
                       "built lab kernels, so there is no tree to build the lab module "
                       "against (scripts/build-kernels.sh)")


#: Errors of a boot that never reached the run's report: worth one more boot.
_FLAKES = ("timed out", "qemu exited", "no end marker")


def _is_boot_flake(error: str) -> bool:
    return error.startswith(_FLAKES)


def _boot_once(assets, ko: Path, kernel: Path, cache: str, params: list[str], cmdline: str,
               topology: Topology, memory_mib: int, timeout_s: float, accel: str,
               sysfs: dict[str, int], allocator: str = "slub",
               slabinfo: dict[str, int] | None = None) -> LabBootResult:
    """One boot of a lab guest; see :func:`boot_lab`."""
    token = secrets.token_hex(6)
    script = init_script(token, cache, params, sysfs=sysfs, allocator=allocator,
                         slabinfo=slabinfo)
    with tempfile.TemporaryDirectory(prefix="slabtune-lab-") as tmp:
        tmpd = Path(tmp)
        initrd = tmpd / "initrd.cpio"
        initrd.write_bytes(build_initramfs(assets.busybox, ko, script))
        console = tmpd / "console.log"
        argv = guest.qemu_argv(assets, initrd, console, cmdline, topology, memory_mib, accel)
        rc, timed_out, seconds = _run_qemu(argv, console, token, timeout_s)
        text = console.read_text(errors="replace") if console.exists() else ""
        qerr = console.with_suffix(".err")
        stderr = qerr.read_text(errors="replace") if qerr.exists() else ""
    return console_result(text, stderr, token, rc, timed_out, seconds, kernel=kernel,
                          cache=cache, params=params, argv=argv, accel=accel,
                          cmdline=cmdline, sysfs=sysfs, slabinfo=slabinfo)


def console_result(text: str, stderr: str, token: str, rc: int | None, timed_out: bool,
                   seconds: float, *, kernel: Path, cache: str, params: list[str],
                   argv: list[str], accel: str, cmdline: str, sysfs: Mapping[str, int],
                   runner: str = "qemu", slabinfo: Mapping[str, int] | None = None
                   ) -> LabBootResult:
    """The result of one boot of :func:`init_script`'s /init from what it printed: the
    console ``text`` (its ``@@LAB`` records), the ``runner``'s stderr and exit status
    ``rc``, whether it was killed at its deadline; ``ok=False`` with one line in ``error``
    when the run did not report, or when the ``slabinfo`` tunables written do not show in
    the cache's /proc/slabinfo line at ``base`` (:func:`slabinfo_mismatch`).  qemu boots
    (:func:`boot_lab`) and User Mode Linux boots (kernel/uml.py, ``runner="uml"``) share
    it."""
    parsed = parse_console(text, token)
    try:
        records = labmod.parse_printk(parsed["log"])
    except labmod.LabError as err:
        records = {"workers": [], "done": None, "errors": [{"field": "printk",
                                                            "msg": str(err)}]}
    error = ""
    if timed_out:
        error = f"timed out after {seconds:.0f} s"
    elif not parsed["started"]:
        last = (stderr.strip().splitlines() or ["no output"])[-1]
        error = f"{runner} exited with {rc} before init started: {last}"
    elif not parsed["ended"]:
        error = f"no end marker ({runner} exited with {rc})"
    elif any(parsed["rc"].get(f"set_{k}") != 0 for k in sysfs):
        k = next(k for k in sysfs if parsed["rc"].get(f"set_{k}") != 0)
        error = f"policy.params.{k}: writing {sysfs[k]} to /sys/kernel/slab/{cache}/{k} failed"
    elif slabinfo and parsed["rc"].get("set_slabinfo") != 0:
        error = (f"policy.params.limit: writing '{cache} "
                 + " ".join(str(slabinfo[k]) for k in SLABINFO_TUNABLES)
                 + "' to /proc/slabinfo failed")
    elif slabinfo and slabinfo_mismatch(parsed["dumps"]["base"].get("slabinfo"), cache,
                                        slabinfo):
        error = slabinfo_mismatch(parsed["dumps"]["base"].get("slabinfo"), cache, slabinfo)
    elif parsed["rc"].get("insmod") != 0:
        why = records["errors"][0] if records["errors"] else {}
        error = f"insmod exited with {parsed['rc'].get('insmod')}" + (
            f": {why.get('field')}: {why.get('msg')}" if why else "")
    elif records["done"] is None:
        error = "the module printed no done line"
    elif records["done"].get("status") != 0:
        error = f"the module's run ended with status {records['done'].get('status')}"
    elif "after" in parsed["missing"]:
        error = f"cache {cache} does not exist in the guest (/sys/kernel/slab, /proc/slabinfo)"
    elif records["done"].get("warmup") and (records["done"].get("window") != 1
                                             or not parsed["dumps"]["window"]):
        error = "the run's warm-up ended but its window's start was not dumped"
    elif records["done"].get("end_park") and (records["done"].get("ended") != 1
                                               or not parsed["dumps"]["end"]):
        error = "the run's window ended but its end was not dumped (end_park)"
    return LabBootResult(
        ok=not error, error=error, kernel=str(kernel),
        release=parsed["info"].get("release", ""), cache=cache,
        files=sorted(parsed["dumps"]["after"]), dumps=parsed["dumps"],
        missing=[p for p in parsed["missing"] if p in PHASES], samples=parsed["samples"],
        done=records["done"], workers=records["workers"], module_errors=records["errors"],
        insmod_rc=parsed["rc"].get("insmod"), params=params, qemu_argv=argv, accel=accel,
        seconds=seconds, cmdline=cmdline, window_at=parsed["window_at"],
        end_at=parsed["end_at"],
        console_tail=(text + (f"\n[{runner} stderr]\n" + stderr if stderr.strip() else "")
                      )[-guest.CONSOLE_TAIL_CHARS:],
    )


def slabinfo_mismatch(raw: str | None, cache: str, tunables: Mapping[str, int]
                      ) -> str | None:
    """Why the cache's /proc/slabinfo line ``raw`` (after its name) does not show the
    tunables written (limit, batchcount and sharedfactor columns of cache_show()), or None
    when it does."""
    from slabtune.kernel import snapshot

    if not raw:
        return f"cache {cache} has no /proc/slabinfo line after the tunables were written"
    got = snapshot.parse_slabinfo_line(f"{cache} {raw}")
    shown = {"limit": got["limit"], "batchcount": got["batchcount"],
             "shared": got["sharedfactor"]}
    bad = [k for k in SLABINFO_TUNABLES if int(shown[k]) != int(tunables[k])]
    if not bad:
        return None
    return (f"policy.params.{bad[0]}: /proc/slabinfo shows {cache} with limit "
            f"{shown['limit']} batchcount {shown['batchcount']} shared {shown['shared']}, "
            "not the " + " ".join(str(tunables[k]) for k in SLABINFO_TUNABLES) + " written")


# --------------------------------------------------------------------------- figures

#: Bytes of a base page (x86-64), for slab memory from ``slabs`` and ``order``.
PAGE_SIZE = 4096


def window_start(result: LabBootResult) -> str:
    """The phase the counted window starts at: ``window`` when the run had a warm-up (its
    workers parked and the /init dumped the cache there), else ``before``."""
    return "window" if result.dumps.get("window") else "before"


def window_end(result: LabBootResult) -> str:
    """The phase the counted window ends at: ``end`` when the run parked its workers
    after the window's last step (``end_park=1``) and the /init dumped the cache there,
    else ``after`` (the window then ends with the drain)."""
    return "end" if result.dumps.get("end") else "after"


def counter_deltas(result: LabBootResult) -> dict[str, int]:
    """Every SLUB_STATS counter of the cache the run changed or left over the counted
    window, :func:`window_end` minus :func:`window_start`, by sysfs name (the kernel's
    own ``enum stat_item`` names)."""
    out = {}
    start, end = window_start(result), window_end(result)
    for name in SLUB_STAT_FILES:
        d = result.delta(name, start=start, end=end)
        if d is not None:
            out[name] = d
    return out


def counter_deltas_per_cpu(result: LabBootResult) -> dict[str, dict[str, int]]:
    """The per-CPU split (the ``C<cpu>=<n>`` fields) of every SLUB_STATS counter over the
    counted window, by sysfs name and then CPU number (as a string, JSON's key type); only
    the counters and CPUs that moved.  The kernel's totals cannot tell which CPU's sheaves
    overflowed or which CPU took the slow paths; the model's counters are per rep, and
    the lab module pins each worker to its CPU (the ``worker`` records)."""
    out = {}
    start, end = window_start(result), window_end(result)
    for name in SLUB_STAT_FILES:
        moved = {str(c): d for c, d in result.per_cpu_delta(name, start=start, end=end).items()
                 if d}
        if moved:
            out[name] = moved
    return out


def _frac(num: float, den: float) -> float | None:
    return num / den if den > 0 else None


def measure(result: LabBootResult) -> dict[str, Any]:
    """The measured side of a lab run, in the model's metric names.

    * ``alloc_fastpath_frac`` = alloc_fastpath / (alloc_fastpath + alloc_slowpath), and the
      same for frees.  What counts as a fast path is the kernel's: before v7.0 the lockless
      per-CPU freelist (slab_alloc_node(), do_slab_free()); on kernels with sheaves every
      object taken from or put into a per-CPU sheaf (alloc_from_pcs(), free_to_pcs()), a
      sheaf replaced from the barn or refilled included.
    * the window: with a warm-up (the module's ``warmup``), counters and ops count from
      the ``window`` dump, taken while every worker was parked after its warm-up ops, to
      the end (the cache's start-up slabs fall outside, as the model's warm-up steps do,
      validate/lab.py :func:`~slabtune.validate.lab.predict`); without one from ``before``.
      It ends at ``end`` where the run parked there (``end_park=1``: the drain that frees
      the live sets falls outside, as the model has none), else at ``after``.
    * ``ops``: the workload's allocations plus frees in the window (the module's ``done``
      record less its ``warm_allocs``/``warm_frees``), the denominator of every
      ``*_per_kop`` figure as in the model (one op is one alloc or one free).
    * ``slab_allocs_per_kop`` = 1000 * alloc_slab / ops (new slabs from the page allocator).
    * ``memory_bytes``: the cache's slab memory the run added, averaged over the window:
      mean of the ``slabs`` samples taken in it minus the slabs before the run, times
      ``PAGE_SIZE << order``; a window too short for the 50 ms sampler counts the slabs of
      its starting dump.  None when there is neither.
    * ``counters``: every SLUB_STATS delta (:func:`counter_deltas`), and
      ``counters_per_cpu`` their split over CPUs (:func:`counter_deltas_per_cpu`).
    """
    if "slabinfo" in result.dumps.get("after", {}):
        return measure_slab(result)
    counters = counter_deltas(result)
    ops, warm_ops = window_ops(result)
    order = counter_total(result.dumps.get("after", {}).get("order"))
    before_slabs = result.value("before", "slabs")
    samples = [v for v in (counter_total(s) for s in window_samples(result)) if v is not None]
    if not samples and result.window_at is not None:
        # a window shorter than the sampling period (a loaded host runs the module's 1500
        # ops in under 50 ms): the dump at its start is its one sample
        samples = [v for v in [counter_total(result.dumps.get("window", {}).get("slabs"))]
                   if v is not None]
    memory = None
    if samples and order is not None and before_slabs is not None:
        mean = sum(samples) / len(samples)
        memory = max(mean - before_slabs, 0.0) * (PAGE_SIZE << order)
    c = counters.get
    return {
        "alloc_fastpath_frac": _frac(c("alloc_fastpath", 0),
                                     c("alloc_fastpath", 0) + c("alloc_slowpath", 0)),
        "free_fastpath_frac": _frac(c("free_fastpath", 0),
                                    c("free_fastpath", 0) + c("free_slowpath", 0)),
        "slab_allocs_per_kop": (1000.0 * c("alloc_slab", 0) / ops) if ops else None,
        "memory_bytes": memory,
        "ops": ops,
        "warmup_ops": warm_ops,
        "order": order,
        "samples": len(samples),
        "peak_slabs": (max(samples) - before_slabs) if samples and before_slabs is not None
        else None,
        "counters": counters,
        "counters_per_cpu": counter_deltas_per_cpu(result),
    }


def window_ops(result: LabBootResult) -> tuple[int, int]:
    """(ops in the counted window, ops of the warm-up) from the module's ``done`` record:
    allocations plus frees, less those done before the workers parked; up to the window's
    end park where there was one (``end_allocs``/``end_frees``), else to the run's end."""
    done = result.done or {}
    warm = int(done.get("warm_allocs", 0)) + int(done.get("warm_frees", 0))
    if window_end(result) == "end":
        total = int(done.get("end_allocs", 0)) + int(done.get("end_frees", 0))
    else:
        total = int(done.get("allocs", 0)) + int(done.get("frees", 0))
    return total - warm, warm


def window_samples(result: LabBootResult) -> list[str]:
    """The samples taken in the counted window (all of them in a run without warm-up; up
    to the end park where there was one)."""
    end = result.end_at if window_end(result) == "end" else None
    return result.samples[result.window_at or 0:end]


def slabinfo_of(result: LabBootResult, phase: str) -> dict[str, Any] | None:
    """The cache's /proc/slabinfo line in ``phase`` of a SLAB run, parsed
    (:func:`slabtune.kernel.snapshot.parse_slabinfo_line`); None where the cache did not
    exist (an own cache before the run)."""
    from slabtune.kernel import snapshot

    raw = result.dumps.get(phase, {}).get("slabinfo")
    return snapshot.parse_slabinfo_line(f"{result.cache} {raw}") if raw else None


def _sample_fields(raw: str) -> tuple[int, int] | None:
    """``"12 A=80 O=96"`` (a SLAB sample: num_slabs, active_objs, num_objs) -> (12, 80)."""
    parts = raw.split()
    try:
        active = next(int(p[2:]) for p in parts[1:] if p.startswith("A="))
        return int(parts[0]), active
    except (ValueError, IndexError, StopIteration):
        return None


def measure_slab(result: LabBootResult) -> dict[str, Any]:
    """The measured side of a lab run on the SLAB kernel (CONFIG_SLAB, no SLUB_STATS, no
    /sys/kernel/slab).  The lab's build has no CONFIG_DEBUG_SLAB, so /proc/slabinfo has no
    statistics columns (allocation hits and misses, grown, reaped): the fast-path fractions
    and ``slab_allocs_per_kop`` are None.  What it gives, over the same window as on SLUB
    (:func:`measure`):

    * ``memory_bytes``: (mean sampled num_slabs - num_slabs before the run) *
      ``PAGE_SIZE * pagesperslab``;
    * ``active_objects``: mean sampled active_objs - active_objs before the run: objects
      not free on a node's lists, so the ones parked in the per-CPU, shared and alien
      arrays count (mm/slab.c get_slabinfo()), besides the workload's live ones;
    * ``slabinfo``: the parsed line at the window's start and at the end (after every
      object was freed); ``structure``: order, objs_per_slab, limit, batchcount and
      sharedfactor of the end's line;
    * ``ops``, ``warmup_ops``, ``samples``, ``peak_slabs`` as on SLUB; ``counters`` empty.
    """
    ops, warm_ops = window_ops(result)
    before = slabinfo_of(result, "before")
    end = slabinfo_of(result, "after")
    start = slabinfo_of(result, window_start(result))
    base_slabs = int(before["slabs"]) if before else 0
    base_active = int(before["objects"]) if before else 0
    samples = [v for v in (_sample_fields(s) for s in window_samples(result)) if v is not None]
    memory = active = None
    if samples and end is not None:
        slab_bytes = PAGE_SIZE << int(end["order"])
        memory = max(sum(n for n, _ in samples) / len(samples) - base_slabs, 0.0) * slab_bytes
        active = max(sum(a for _, a in samples) / len(samples) - base_active, 0.0)
    return {
        "alloc_fastpath_frac": None, "free_fastpath_frac": None, "slab_allocs_per_kop": None,
        "memory_bytes": memory, "active_objects": active,
        "ops": ops, "warmup_ops": warm_ops,
        "order": int(end["order"]) if end else None, "samples": len(samples),
        "peak_slabs": (max(n for n, _ in samples) - base_slabs) if samples else None,
        "slabinfo": {"window": start, "after": end},
        "structure": ({k: end[k] for k in ("order", "objs_per_slab", "limit", "batchcount",
                                           "sharedfactor")} if end else None),
        "counters": {},
    }

"""Boot one of slabtune's own kernels under qemu with the lab module and read a cache's
SLUB_STATS counters around one run of it.

The guest is built from kernel/guest.py's public pieces (the topology's ``-smp``/``-numa``
arguments, the command line, the qemu argv, the newc cpio writer) around an /init of its
own (busybox sh) that

1. mounts proc and sysfs and sets the console log level to 1 (kernel messages stay in the
   log buffer, off the serial console),
2. dumps every readable file of ``/sys/kernel/slab/<cache>/`` (``warm``, discarded: it
   instantiates the sysfs inodes; then ``base``),
3. loads and unloads the module once without running it and reads the log, as the run
   will (``before`` then minus ``base`` is what everything but the run costs the cache:
   module loading, kthread-free bookkeeping, the commands' forks),
4. loads the module with the run's parameters, prints the module's log lines, dumps
   ``after``, unloads the module and powers off.

Every line the host reads starts with ``@@LAB``; the dumps use the shell's ``read``
builtin, so they fork nothing.  Nothing a caller types reaches the shell unchecked: module
parameters are ``key=value`` words of a fixed alphabet.
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
from slabtune.model.topology import Topology

MARK = "@@LAB"
#: busybox applets the /init uses.
APPLETS = ("sh", "mount", "echo", "cat", "insmod", "rmmod", "dmesg", "grep", "poweroff",
           "sleep", "sync")
DEFAULT_TIMEOUT_S = 300.0
#: Phases the /init dumps the cache in (``warm`` goes to /dev/null).
PHASES = ("base", "before", "after")
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


def init_script(token: str, cache: str, params: Sequence[str]) -> str:
    """The guest's /init for one lab run on /sys/kernel/slab/``cache``."""
    if not token.isalnum():
        raise LabBootError("token: must be alphanumeric")
    if not re.fullmatch(r"[A-Za-z0-9_:\-]+", cache):
        raise LabBootError(f"cache: {cache!r} is not a slab cache name")
    for p in params:
        if not _PARAM_RE.match(p):
            raise LabBootError(f"params: {p!r} is not a key=value module parameter")
    args = " ".join(params)
    return "\n".join([
        *guest.init_prelude(MARK),
        f"D=/sys/kernel/slab/{cache}",
        f'echo "$M S {token}"',
        'v=; read v < /proc/sys/kernel/osrelease; echo "$M I release $v"',
        'v=; read v < /sys/devices/system/cpu/online; echo "$M I cpus_online $v"',
        'v=NA; [ -r /sys/devices/system/node/has_memory ] && '
        '{ read v < /sys/devices/system/node/has_memory; }; echo "$M I has_memory $v"',
        "dump() {",
        '  [ -d "$D/" ] || { echo "$M X $1"; return; }',
        '  for f in "$D"/*; do',
        '    [ -f "$f" ] || continue',
        '    v=; { read -r v < "$f"; } 2>/dev/null || [ -n "$v" ] || continue',
        '    echo "$M C $1 ${f##*/} $v"',
        "  done",
        '  echo "$M N $1"',
        "}",
        "dump warm > /dev/null",
        "dump base",
        f"insmod /{_KO_PATH} autorun=0",
        'echo "$M R probe_insmod $?"',
        "rmmod slabtune_lab",
        'echo "$M R probe_rmmod $?"',
        "dmesg | grep 'slabtune_lab: ' > /dev/null",
        "dump before",
        f"insmod /{_KO_PATH} {args}",
        'echo "$M R insmod $?"',
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
                           "dumps": {p: {} for p in PHASES}, "missing": [], "log": []}
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
        elif kind == "R" and len(parts) > 3:
            out["rc"][parts[2]] = int(parts[3]) if parts[3].lstrip("-").isdigit() else None
        elif kind == "C" and len(parts) > 3 and parts[2] in out["dumps"]:
            out["dumps"][parts[2]][parts[3]] = parts[4] if len(parts) > 4 else ""
        elif kind == "X" and len(parts) > 2:
            out["missing"].append(parts[2])
        elif kind == "K":
            out["log"].append(line.split(" ", 2)[2] if line.count(" ") >= 2 else "")
    return out


def _run_qemu(argv: list[str], console: Path, token: str, timeout_s: float
              ) -> tuple[int | None, bool, float]:
    """Run qemu in its own process group until it exits, a few seconds after the end
    marker, or the deadline (then the group is killed).  Returns (rc, timed_out, s)."""
    end = f"{MARK} E {token}"
    t0 = time.monotonic()
    timed_out = False
    ended_at = None
    with open(console.with_suffix(".err"), "wb") as err:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=err, stderr=err,
                                start_new_session=True)
        try:
            while proc.poll() is None:
                now = time.monotonic()
                if ended_at is None and console.exists() \
                        and end in console.read_text(errors="replace"):
                    ended_at = now
                if ended_at is not None and now - ended_at > 10:
                    break
                if now - t0 > timeout_s:
                    timed_out = True
                    break
                time.sleep(0.1)
        finally:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                proc.wait(timeout=10)
    return proc.returncode, timed_out, time.monotonic() - t0


def boot_lab(kernel_name: str, workload_doc: Mapping[str, Any], topology: Topology,
             *, cache_doc: Mapping[str, Any] | None = None, ops: int = labmod.DEFAULT_OPS,
             seed: int = 1, ring: str = "lockless", memory_mib: int = 512,
             timeout_s: float = DEFAULT_TIMEOUT_S, accel: str = "auto",
             extra_params: Sequence[str] = ()) -> LabBootResult:
    """Build the module for ``kernel_name``, boot that kernel on ``topology`` and run the
    ``[workload]`` table ``workload_doc`` on the ``[cache]`` table ``cache_doc`` (default
    kmalloc-512); the counters of that cache before and after, and the module's records.
    ``extra_params`` (``key=value``) go after the generated parameters and so override them.
    Setup errors raise (LabError, GuestError, LabBootError); a guest that fails returns
    ``ok=False`` with the reason in ``error``."""
    cache_doc = dict(cache_doc or {"name": "kmalloc-512"})
    params = (labmod.cache_params(cache_doc)
              + labmod.module_params(workload_doc, topology, ops=ops, seed=seed, ring=ring)
              + list(extra_params))
    cache = cache_doc["name"] if "name" in cache_doc else labmod.MODULE_NAME
    kernel = build.kernel_path(kernel_name)
    if kernel is None:
        raise LabBootError(f"kernel {kernel_name}: not built (scripts/build-kernels.sh)")
    ko = labmod.build_module(kernel_name)
    # find_assets checks qemu, the kernel and busybox; the module stands in for the
    # workload binary, which this guest does not use.
    assets = guest.find_assets(kernel=kernel, workload=ko, build=False)
    profile = guest.kernel_profile(kernel)
    cmdline = guest.guest_cmdline({}, topology, profile)
    if accel == "auto":
        accel = "kvm" if guest.probe_kvm(assets).usable else "tcg"
    token = secrets.token_hex(6)
    script = init_script(token, cache, params)
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
    parsed = parse_console(text, token)
    records = labmod.parse_printk(parsed["log"])
    error = ""
    if timed_out:
        error = f"timed out after {seconds:.0f} s"
    elif not parsed["started"]:
        last = (stderr.strip().splitlines() or ["no output"])[-1]
        error = f"qemu exited with {rc} before init started: {last}"
    elif not parsed["ended"]:
        error = f"no end marker (qemu exited with {rc})"
    elif parsed["rc"].get("insmod") != 0:
        why = records["errors"][0] if records["errors"] else {}
        error = f"insmod exited with {parsed['rc'].get('insmod')}" + (
            f": {why.get('field')}: {why.get('msg')}" if why else "")
    elif records["done"] is None:
        error = "the module printed no done line"
    elif records["done"].get("status") != 0:
        error = f"the module's run ended with status {records['done'].get('status')}"
    elif "after" in parsed["missing"]:
        error = f"/sys/kernel/slab/{cache} does not exist in the guest"
    return LabBootResult(
        ok=not error, error=error, kernel=str(kernel),
        release=parsed["info"].get("release", ""), cache=cache,
        files=sorted(parsed["dumps"]["after"]), dumps=parsed["dumps"],
        missing=[p for p in parsed["missing"] if p in PHASES],
        done=records["done"], workers=records["workers"], module_errors=records["errors"],
        insmod_rc=parsed["rc"].get("insmod"), params=params, qemu_argv=argv, accel=accel,
        seconds=seconds,
        console_tail=(text + ("\n[qemu stderr]\n" + stderr if stderr.strip() else ""))[-4000:],
    )

"""Boot a real kernel under qemu, run the static workload inside, snapshot /sys/kernel/slab.

The guest tier of validation (DESIGN.md section 6): a kernel image (by default the Debian
cloud kernel that ``scripts/install-guest-deps.sh`` unpacks into the cache directory) boots
with a chosen topology (``-smp``, ``maxcpus``, ``-numa`` nodes with memory, without memory,
without CPUs) and chosen ``slub_*`` boot parameters, from an initramfs built here: a static
busybox, the static workload (``native/workload.c``) and a generated ``/init`` that

1. mounts proc and sysfs and quiets the console (console loglevel 1: only KERN_EMERG, so
   soft lockups and panics still show),
2. prints the boot identity (release, cmdline, CPU and node masks) and one line per real
   cache directory of ``/sys/kernel/slab`` (aliases: one line per symlink), or, on a
   CONFIG_SLAB kernel (no /sys/kernel/slab), every line of ``/proc/slabinfo``,
3. runs the workload(s), each line of output prefixed,
4. prints the same dump again, an end marker, and powers off (``poweroff -f``).

Every line this module parses starts with ``@@ST`` and a one-letter record type, so kernel
messages on the same serial console are ignored.  The host reads the serial log from a file,
parses both dumps into polars frames in the snapshot format (results/snapshot.py), and keeps
the exact qemu argv, the accelerator, timings and the console tail in a :class:`GuestResult`.

Nothing a user types reaches a shell: the init script is generated from validated integers
and fixed words only, and qemu runs from an argument list.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import secrets
import shutil
import signal
import stat
import subprocess
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import polars as pl

from slabtune import native as native_sources
from slabtune.errors import SlabtuneError
from slabtune.kernel import snapshot
from slabtune.model import bootparams, profiles, slab
from slabtune.model.profiles import KernelProfile, UnknownProfileError, detect_profile
from slabtune.model.topology import Topology
from slabtune.native import cache_dir

INSTALL_HINT = "run scripts/install-guest-deps.sh (as root) to install qemu, a kernel and busybox"

#: Record prefix of every console line the host parses.
MARK = "@@ST"
#: Per-cache sysfs attributes the init dumps, in this order.  sheaf_capacity is absent before
#: v6.18 (dumped as NA, stored as null); slabs/objects/total_objects/partial keep the first
#: number of their file (the total; per-node counts follow it in the file).
CACHE_ATTRS: tuple[str, ...] = (
    "object_size", "slab_size", "order", "objs_per_slab", "min_partial", "cpu_partial",
    "sheaf_capacity", "slabs", "objects", "total_objects", "partial",
    "sanity_checks", "red_zone", "poison", "store_user", "trace",
)
#: Attributes every real cache directory has on every kernel this module supports.
_REQUIRED_ATTRS = ("object_size", "slab_size", "order", "objs_per_slab", "min_partial",
                   "cpu_partial")
#: Dumps the init prints: before and after the workloads, and after flushing every cache's
#: per-CPU slabs (see :func:`init_script`).
PHASES = ("before", "after", "flushed")
#: Columns after SNAPSHOT_COLUMNS in the frames this module returns.
FRAME_EXTRA: tuple[str, ...] = snapshot.EXTRA_COLUMNS
#: Boot identity lines (record ``I``): key in the init script -> snapshot column.
_INFO_KEYS = {
    "release": "kernel_release", "cmdline": "cmdline", "cpus_possible": "cpus_possible",
    "cpus_present": "cpus_present", "cpus_online": "cpus_online",
    "has_memory": "nodes_with_memory", "has_cpu": "nodes_with_cpu",
}

DEFAULT_MEMORY_MIB = 512
DEFAULT_TIMEOUT_S = 120.0
PROBE_TIMEOUT_S = 30.0
CONSOLE_TAIL_CHARS = 4000


class GuestError(SlabtuneError):
    """A guest cannot be set up (missing qemu/kernel/busybox, bad parameter, bad topology)."""


# --------------------------------------------------------------------------- assets


@dataclasses.dataclass(frozen=True)
class GuestAssets:
    """The host-side files one boot needs."""

    qemu: Path
    kernel: Path
    busybox: Path
    workload: Path


def _existing(path: Path | str | None, what: str) -> Path:
    if path is None:
        raise GuestError(f"{what}: not found; {INSTALL_HINT}")
    p = Path(path).expanduser()
    if not p.is_file():
        raise GuestError(f"{what}: {p} is not a file; {INSTALL_HINT}")
    return p.resolve()


def find_assets(kernel: Path | str | None = None, busybox: Path | str | None = None,
                workload: Path | str | None = None, qemu: Path | str | None = None,
                build: bool = True) -> GuestAssets:
    """Locate qemu, a bzImage, a static busybox and the static workload.

    ``kernel`` overrides the cached Debian kernel with any bzImage.  The workload is built
    from native/workload.c when missing or older than its source and ``build`` is set.
    Raises GuestError naming the first missing piece.
    """
    c = cache_dir()
    qemu_path = qemu or shutil.which("qemu-system-x86_64")
    kernel_path = kernel if kernel is not None else (c / "bzImage" if (c / "bzImage").exists()
                                                     else None)
    busybox_path = busybox if busybox is not None else (c / "busybox" if (c / "busybox").exists()
                                                        else shutil.which("busybox"))
    wl = Path(workload) if workload is not None else native_sources.build_dir() / "workload"
    src = native_sources.source("workload.c")
    stale = not wl.exists() or (src.exists() and src.stat().st_mtime > wl.stat().st_mtime)
    if workload is None and stale and build:
        wl = build_workload()
    return GuestAssets(
        qemu=_existing(qemu_path, "qemu-system-x86_64"),
        kernel=_existing(kernel_path, "kernel"),
        busybox=_existing(busybox_path, "busybox"),
        workload=_existing(wl, "workload"),
    )


def build_workload(out_dir: Path | None = None) -> Path:
    """Compile the packaged workload.c statically (``gcc -static -O2``) into the user cache
    (:func:`slabtune.native.build_dir`)."""
    out_dir = out_dir or native_sources.build_dir()
    out_dir.mkdir(parents=True, exist_ok=True)
    out = out_dir / "workload"
    gcc = shutil.which("gcc")
    if gcc is None:
        raise GuestError(f"workload: gcc is not installed; {INSTALL_HINT}")
    proc = subprocess.run(
        [gcc, "-static", "-O2", "-Wall", "-o", str(out), str(native_sources.source("workload.c"))],
        capture_output=True, text=True, timeout=120)
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["?"])[-1]
        raise GuestError(f"workload: static build failed: {last}")
    return out


# --------------------------------------------------------------------------- boot parameters


def bzimage_release(kernel: Path | str) -> str | None:
    """The release string a bzImage carries (x86 boot protocol: the 2-byte field at 0x20E,
    when the header magic "HdrS" sits at 0x202, points at ``version - 0x200``), e.g.
    ``6.1.0-56-cloud-amd64``; None when the file has no such header."""
    try:
        with open(kernel, "rb") as fh:
            head = fh.read(0x4000)
            if len(head) < 0x210 or head[0x202:0x206] != b"HdrS":
                return None
            off = int.from_bytes(head[0x20E:0x210], "little")
            if not off:
                return None
            fh.seek(off + 0x200)
            text = fh.read(256).split(b"\0", 1)[0].decode("ascii", "replace")
    except OSError:
        return None
    return text.split(" ", 1)[0] or None


def kernel_profile(kernel: Path | str) -> KernelProfile:
    """The kernel profile of a bzImage, from its embedded release string."""
    release = bzimage_release(kernel)
    if release is None:
        raise GuestError(f"kernel: {kernel} is not a bzImage (no boot header)")
    try:
        return detect_profile(release)
    except UnknownProfileError as exc:
        raise GuestError(f"kernel: {exc}") from None


#: The release suffix of the lab's SLAB build (kernel/configs/slab.config LOCALVERSION).
SLAB_RELEASE_SUFFIX = "-slab"


def boot_profile(kernel: Path | str):
    """The profile a guest's boot parameters are checked against: the SLAB profile of the
    lab's SLAB build (release ending in :data:`SLAB_RELEASE_SUFFIX`: mm/slab.c takes
    ``slab_max_order=``, not SLUB's parameters), else :func:`kernel_profile`."""
    release = bzimage_release(kernel)
    if release is not None and release.endswith(SLAB_RELEASE_SUFFIX):
        try:
            return slab.detect_slab_profile(release)
        except UnknownProfileError as exc:
            raise GuestError(f"kernel: {exc}") from None
    return kernel_profile(kernel)


def validate_boot_params(params: Mapping[str, object], profile) -> dict[str, int]:
    """Allow-list and range-check slab boot parameters for the kernel being booted
    (model/bootparams.py: slub_min_order, slub_max_order, slub_min_objects, and slab_* from
    v6.8); returns canonical ``slub_*`` names, which every kernel accepts.  For a SLAB
    profile, SLAB's own boot parameters (``slab_max_order``, v3.4 on: model/slab.py); its
    tunables (limit, batchcount, shared) are /proc/slabinfo writes, not boot parameters."""
    if profiles.is_slab(profile):
        for name in params:
            if name in slab.SLAB_TUNABLES:
                raise GuestError(f"{name}: a SLAB tunable is written to /proc/slabinfo, "
                                 "not given on the kernel command line")
        given = {}
        for name, value in params.items():
            if isinstance(value, str):      # from the command line (--param NAME=VALUE)
                try:
                    value = int(value, 10)
                except ValueError:
                    raise GuestError(f"{name}: {value!r} is not an integer") from None
            given[name] = value
        return {k: int(v) for k, v in slab.validate_params(given, profile).items()
                if k != "memoryless_fallback"}
    return bootparams.validate_params(dict(params), profile)


def guest_cmdline(params: Mapping[str, object], topology: Topology, profile) -> str:
    """The kernel command line: serial console, reboot (and so exit qemu) on panic, the
    validated slab parameters, and ``maxcpus`` when fewer CPUs should come online than are
    present."""
    parts = ["console=ttyS0", "panic=-1"]
    parts += [bootparams.cmdline_arg(k, v)
              for k, v in validate_boot_params(params, profile).items()]
    if topology.online < topology.present:
        parts.append(f"maxcpus={int(topology.online)}")
    return " ".join(parts)


# --------------------------------------------------------------------------- sysfs policy


#: Per-cache sysfs attributes a policy may write before the snapshot (the tmpfiles.d half of
#: ``slabtune export``): both read back exactly what was written.  mm/slub.c (6.1, 6.12):
#: min_partial_store() sets ``s->min_partial`` from kstrtoul(); cpu_partial_store() takes
#: kstrtouint(), refuses a nonzero value with -EINVAL where the cache has no per-CPU
#: partial lists, and sets ``s->cpu_partial`` (slub_set_cpu_partial()), which
#: cpu_partial_show() prints.
POLICY_ATTRS: tuple[str, ...] = ("min_partial", "cpu_partial")
#: Largest value written: kstrtouint()'s range (cpu_partial_store()); min_partial takes more.
POLICY_VALUE_MAX = (1 << 32) - 1
#: A cache name a policy may name: one sysfs path component, no shell or glob syntax.
_POLICY_CACHE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.:@+-]*")
#: Snapshot columns holding the value the policy wrote to a cache (null: not written).
POLICY_COLUMNS: tuple[str, ...] = snapshot.POLICY_COLUMNS


def policy_writes(sysfs: Mapping[str, Mapping[str, object]]) -> tuple[tuple[str, str, int], ...]:
    """``(cache, attribute, value)`` for every per-cache sysfs value of a policy
    (``{cache: {attribute: value}}``, as ``slabtune export --format json`` writes it under
    ``sysfs``), in cache and attribute order.  A cache name that is not one plain path
    component, an attribute other than :data:`POLICY_ATTRS` or a value that is not an
    integer in 0..:data:`POLICY_VALUE_MAX` is one GuestError naming it."""
    if not isinstance(sysfs, Mapping):
        raise GuestError("sysfs: not a table of caches")
    out = []
    for cache in sorted(sysfs):
        if not isinstance(cache, str) or not _POLICY_CACHE.fullmatch(cache) \
                or len(cache) > 64:
            raise GuestError(f"sysfs: cache name {ascii(cache)[:70]} is not a plain cache name")
        attrs = sysfs[cache]
        if not isinstance(attrs, Mapping):
            raise GuestError(f"sysfs.{cache}: not a table of attributes")
        for attr in sorted(attrs):
            value = attrs[attr]
            if attr not in POLICY_ATTRS:
                raise GuestError(f"sysfs.{cache}: {ascii(attr)[:40]} is not one of "
                                 f"{', '.join(POLICY_ATTRS)}")
            if isinstance(value, bool) or not isinstance(value, int) \
                    or not 0 <= value <= POLICY_VALUE_MAX:
                raise GuestError(f"sysfs.{cache}.{attr}: {ascii(value)[:40]} is not an integer "
                                 f"in 0..{POLICY_VALUE_MAX}")
            out.append((cache, attr, int(value)))
    return tuple(out)


def policy_file(writes: Sequence[tuple[str, str, int]]) -> bytes:
    """The initramfs file ``/policy``: one ``cache attribute value`` line per write, read
    by the init's ``read`` builtin (data, never shell code)."""
    return "".join(f"{c} {a} {v}\n" for c, a, v in writes).encode()


# --------------------------------------------------------------------------- topology


def topology_qemu_args(topology: Topology, memory_mib: int = DEFAULT_MEMORY_MIB) -> list[str]:
    """``-m``, ``-smp`` and ``-numa`` arguments for a topology.

    Each possible CPU is its own socket, so ``-numa cpu,node-id=N,socket-id=S`` places it.
    Present CPUs go to nodes in order of ``node_cpus``; CPUs beyond ``present`` (hotpluggable
    ones) go to the first node with CPUs.  Memory is split evenly (2 MiB granules) between
    the nodes with memory; a node without memory gets no memdev (a memoryless node, or an
    empty one when it has no CPUs either).  A topology's SLIT (``distances``) goes to qemu
    as ``-numa dist`` entries.
    """
    if (isinstance(memory_mib, bool) or not isinstance(memory_mib, int)
            or not 128 <= memory_mib <= 65536):
        raise GuestError(f"memory_mib: {memory_mib!r} is outside 128..65536")
    if topology.possible > 255:
        raise GuestError(f"possible: {topology.possible} CPUs is more than qemu's q35/pc "
                         "machine boots without an IOMMU (255)")
    args = ["-m", f"{memory_mib}M",
            "-smp", f"cpus={topology.present},maxcpus={topology.possible},"
                    f"sockets={topology.possible},cores=1,threads=1"]
    if topology.nodes == 1:
        return args
    mem_nodes = topology.memory_nodes
    share = (memory_mib // len(mem_nodes)) // 2 * 2
    sizes = {n: share for n in mem_nodes}
    sizes[mem_nodes[0]] += memory_mib - share * len(mem_nodes)
    for n in range(topology.nodes):
        if n in sizes:
            args += ["-object", f"memory-backend-ram,id=mem{n},size={sizes[n]}M",
                     "-numa", f"node,nodeid={n},memdev=mem{n}"]
        else:
            args += ["-numa", f"node,nodeid={n}"]
    socket = 0
    for n, count in enumerate(topology.node_cpus):
        for _ in range(count):
            args += ["-numa", f"cpu,node-id={n},socket-id={socket}"]
            socket += 1
    first_cpu_node = topology.cpu_nodes[0]
    for s in range(socket, topology.possible):
        args += ["-numa", f"cpu,node-id={first_cpu_node},socket-id={s}"]
    if topology.distances is not None:
        # the SLIT qemu gives the guest (ACPI SLIT: node_distance() and the fallback
        # order of build_zonelists); the local distance is 10 and not passed
        for i, row in enumerate(topology.distances):
            for j, d in enumerate(row):
                if i != j:
                    args += ["-numa", f"dist,src={i},dst={j},val={int(d)}"]
    return args


# --------------------------------------------------------------------------- workload spec


@dataclasses.dataclass(frozen=True)
class WorkloadSpec:
    """One run of native/workload.c inside the guest (see its header for the modes)."""

    mode: str = "hackbench"
    transport: str = "socket"
    groups: int = 2
    fds: int = 4
    loops: int = 100
    msg_size: int = 100
    cpu_a: int | None = None
    cpu_b: int | None = None

    def argv(self) -> list[str]:
        """Validated argument list (fixed words and integers only)."""
        if self.mode not in ("hackbench", "crosscpu"):
            raise GuestError(f"workload.mode: {self.mode!r} is not hackbench or crosscpu")
        if self.transport not in ("socket", "pipe"):
            raise GuestError(f"workload.transport: {self.transport!r} is not socket or pipe")
        out = ["--mode", self.mode, "--transport", self.transport]
        for name, lo, hi in (("groups", 1, 256), ("fds", 1, 64), ("loops", 1, 100_000_000),
                             ("msg_size", 1, 1 << 20)):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
                raise GuestError(f"workload.{name}: {v!r} is outside {lo}..{hi}")
            out += ["--size" if name == "msg_size" else f"--{name}", str(v)]
        if (self.cpu_a is None) != (self.cpu_b is None):
            raise GuestError("workload.cpu_a: cpu_a and cpu_b go together")
        if self.cpu_a is not None:
            for name in ("cpu_a", "cpu_b"):
                v = getattr(self, name)
                if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < 8192:
                    raise GuestError(f"workload.{name}: {v!r} is outside 0..8191")
            out += ["--cpu-a", str(self.cpu_a), "--cpu-b", str(self.cpu_b)]
        return out


# --------------------------------------------------------------------------- initramfs


@dataclasses.dataclass(frozen=True)
class CpioEntry:
    """One member of a newc cpio archive."""

    name: str
    mode: int
    data: bytes = b""
    rdev: tuple[int, int] = (0, 0)


def cpio_newc(entries: Iterable[CpioEntry]) -> bytes:
    """Serialise entries as a "newc" (SVR4, no CRC) cpio archive, the format the kernel
    unpacks an initramfs from (init/initramfs.c): a 110-byte ASCII-hex header, the
    NUL-terminated name padded to 4 bytes, the data padded to 4 bytes, and a TRAILER!!!
    entry.  Symlinks carry their target as data."""
    out = bytearray()

    def pad4() -> None:
        out.extend(b"\0" * (-len(out) % 4))

    ino = 1
    for e in list(entries) + [CpioEntry("TRAILER!!!", 0)]:
        name = e.name.encode() + b"\0"
        fields = (ino, e.mode, 0, 0, 2 if stat.S_ISDIR(e.mode) else 1, 0, len(e.data),
                  0, 0, e.rdev[0], e.rdev[1], len(name), 0)
        out += b"070701" + b"".join(b"%08X" % f for f in fields)
        out += name
        pad4()
        out += e.data
        pad4()
        ino += 1
    return bytes(out)


def _dir(name: str) -> CpioEntry:
    return CpioEntry(name, stat.S_IFDIR | 0o755)


def _file(name: str, data: bytes, mode: int = 0o755) -> CpioEntry:
    return CpioEntry(name, stat.S_IFREG | mode, data)


def _link(name: str, target: str) -> CpioEntry:
    return CpioEntry(name, stat.S_IFLNK | 0o777, target.encode())


_APPLETS = ("sh", "mount", "echo", "cat", "readlink", "poweroff", "sleep", "sync")


def init_script(token: str, workloads: Sequence[WorkloadSpec] = (), dump: bool = True,
                policy: bool = False) -> str:
    """The guest's /init (busybox sh).  ``token`` (hex) tags the start and end markers so a
    stale log cannot pass for this boot.  Records, one per line, all starting with MARK:

    * ``S <token> <uptime>`` start, ``E <token>`` end;
    * ``I <phase> <key> <value>`` boot identity (release, cmdline, CPU and node masks);
    * ``C <phase> <cache> attr=value ...`` one real cache directory (NA: no such file);
    * ``A <phase> <alias> <cache>`` one /sys/kernel/slab symlink;
    * ``N <phase> <count>`` number of C records just printed (detects a truncated dump);
    * ``W <i> begin``, ``J <i> <line>`` workload output, ``W <i> rc <status>``;
    * ``Y <cache> <target> <attr> <value> <rc>`` one policy write (``policy``).

    With ``policy``: before anything is dumped, every line ``cache attribute value`` of the
    initramfs file ``/policy`` (:func:`policy_file`) is written to
    ``/sys/kernel/slab/<cache>/<attribute>`` (:func:`_init_policy_lines`).

    With ``dump``: a first dump goes to /dev/null, so the sysfs inodes and dentries the dump
    itself instantiates (one per /sys/kernel/slab file read) exist before ``before`` is
    taken and do not show as cache movement between ``before`` and ``after``.  After the
    ``after`` dump every cache's ``cpu_partial`` is written back unchanged: its store
    handler calls flush_all(), which deactivates every CPU slab and unfreezes every per-CPU
    partial list onto the node partial lists (mm/slub.c cpu_partial_store()).  The
    ``flushed`` dump then reads ``objects`` without the free objects that sat on per-CPU
    slabs (sysfs ``objects`` is total_objects minus the free objects of the node partial
    lists only, show_slab_objects(SO_ALL|SO_OBJECTS)), i.e. the objects really allocated.

    The script's parts: :func:`_init_start_lines`, :func:`_init_info_function`,
    :func:`_init_dump_function`, :func:`_init_before_lines`, :func:`_init_workload_lines`
    per workload, :func:`_init_flush_lines`, :func:`_init_end_lines`.
    """
    if not token.isalnum():
        raise GuestError("token: must be alphanumeric")
    lines = _init_start_lines(token) + _init_info_function() + _init_dump_function()
    if policy:
        lines += _init_policy_lines()
    if dump:
        lines += _init_before_lines()
    for i, w in enumerate(workloads):
        lines += _init_workload_lines(i, w)
    if dump:
        lines += _init_flush_lines()
    lines += _init_end_lines(token)
    return "\n".join(lines) + "\n"


def init_prelude(mark: str = MARK) -> list[str]:
    """The first lines of every /init slabtune generates: the shell, PATH, /proc and /sys
    mounted, console log level 1 (kernel messages do not interleave with the records) and
    ``M`` the record mark the host parses."""
    return [
        "#!/bin/sh",
        "PATH=/bin",
        "export PATH",
        "mount -t proc proc /proc",
        "mount -t sysfs sysfs /sys",
        "echo 1 > /proc/sys/kernel/printk",
        f"M={mark}",
    ]


def _init_start_lines(token: str) -> list[str]:
    """The start of /init: :func:`init_prelude` and the start record
    ``S <token> <uptime>``."""
    return init_prelude() + [
        "up=",
        "read up rest < /proc/uptime",
        f'echo "$M S {token} $up"',
    ]


def _init_info_function() -> list[str]:
    """The shell function ``info <phase>``: the boot identity as ``I`` records (kernel
    release, command line, possible/present/online CPU masks, node has_memory and
    has_cpu masks, NA where the node file is missing: a kernel without NUMA)."""
    return [
        "info() {",
        '  v=; read v < /proc/sys/kernel/osrelease; echo "$M I $1 release $v"',
        '  v=; read v < /proc/cmdline; echo "$M I $1 cmdline $v"',
        "  for f in possible present online; do",
        '    v=; read v < /sys/devices/system/cpu/$f; echo "$M I $1 cpus_$f $v"',
        "  done",
        "  for f in has_memory has_cpu; do",
        ('    v=NA; [ -r /sys/devices/system/node/$f ] && '
         '{ v=; read v < /sys/devices/system/node/$f; }'),
        '    echo "$M I $1 $f $v"',
        "  done",
        "}",
    ]


def _init_dump_function() -> list[str]:
    """The shell function ``dump <phase>``: one ``A`` record per /sys/kernel/slab alias
    (symlink), one ``C`` record per cache directory with every attribute of
    :data:`CACHE_ATTRS` (first word, NA when missing), then ``N`` with the count of ``C``
    records.

    A kernel without /sys/kernel/slab (CONFIG_SLAB: SLAB has no sysfs) gets
    /proc/slabinfo instead, line by line through the ``read`` builtin (no fork): ``H``
    records for its header lines (version, column legend), one ``P`` record per cache line
    as the kernel printed it, then ``N`` with the count of ``P`` records."""
    attrs = " ".join(CACHE_ATTRS)
    return [
        "dump() {",
        "  n=0",
        "  if [ ! -d /sys/kernel/slab ]; then",
        "    while read -r l; do",
        "      case \"$l\" in",
        '        slabinfo*|"#"*) echo "$M H $1 $l" ;;',
        '        *) echo "$M P $1 $l"; n=$((n+1)) ;;',
        "      esac",
        "    done < /proc/slabinfo",
        '    echo "$M N $1 $n"',
        "    return",
        "  fi",
        "  for d in /sys/kernel/slab/*; do",
        "    c=${d##*/}",
        '    if [ -L "$d" ]; then',
        '      t=$(readlink "$d"); echo "$M A $1 $c ${t##*/}"; continue',
        "    fi",
        '    line="$M C $1 $c"',
        f"    for a in {attrs}; do",
        '      v=; [ -r "$d/$a" ] && read v < "$d/$a"',
        '      v=${v%% *}; [ -n "$v" ] || v=NA',
        '      line="$line $a=$v"',
        "    done",
        '    echo "$line"',
        "    n=$((n+1))",
        "  done",
        '  echo "$M N $1 $n"',
        "}",
    ]


def _init_policy_lines() -> list[str]:
    """The sysfs half of a policy, before the first dump: each line ``c a v`` of /policy
    (checked on the host, :func:`policy_writes`) is written as ``echo v >
    /sys/kernel/slab/c/a`` and reported as ``Y c target a v rc``, ``target`` the cache
    directory the name resolves to (a merged cache's name is a symlink to it) and ``rc``
    the write's status, or ``missing`` where the kernel has no cache of that name.  The
    names are data read by ``read``, quoted wherever used: never shell code."""
    return [
        "while read -r c a v; do",
        '  d="/sys/kernel/slab/$c"',
        '  if [ ! -e "$d/$a" ]; then echo "$M Y $c - $a $v missing"; continue; fi',
        '  t="$c"',
        '  if [ -L "$d" ]; then t=$(readlink "$d"); t="${t##*/}"; fi',
        '  echo "$v" > "$d/$a" 2>/dev/null',
        '  echo "$M Y $c $t $a $v $?"',
        "done < /policy",
    ]


def _init_before_lines() -> list[str]:
    """With ``dump``, before the workloads: a warm-up dump to /dev/null (instantiates
    the sysfs inodes and dentries the dump itself needs), then the ``before`` phase."""
    return ["dump warm > /dev/null", "info before", "dump before"]


def _init_workload_lines(i: int, w: WorkloadSpec) -> list[str]:
    """Workload ``i``: ``W <i> begin``, its run of /bin/workload with the validated
    arguments of :meth:`WorkloadSpec.argv`, its output as ``J <i>`` records, then
    ``W <i> rc <status>``."""
    args = " ".join(w.argv())
    return [
        f'echo "$M W {i} begin"',
        f"/bin/workload {args} > /tmp/w{i}.out 2>&1",
        "rc=$?",
        f'while read -r l; do echo "$M J {i} $l"; done < /tmp/w{i}.out',
        f'echo "$M W {i} rc $rc"',
    ]


def _init_flush_lines() -> list[str]:
    """With ``dump``, after the workloads: the ``after`` phase, every cache's
    ``cpu_partial`` written back unchanged (its store handler flushes the per-CPU slabs
    and partial lists, see :func:`init_script`), then the ``flushed`` phase.

    Under SLAB (no /sys/kernel/slab) every cache's tunables are written back unchanged to
    /proc/slabinfo instead: slabinfo_write() -> do_tune_cpucache() (mm/slab.c) swaps in
    new per-CPU arrays and frees the objects of the old ones to their slabs, and
    setup_kmem_cache_node(force_change) does the same with each node's shared array, so
    ``flushed`` counts as active only objects really allocated (and those in alien
    caches, which are not drained)."""
    return [
        "info after", "dump after",
        "if [ -d /sys/kernel/slab ]; then",
        "for d in /sys/kernel/slab/*; do",
        '  [ -L "$d" ] && continue',
        '  v=; read v < "$d/cpu_partial" && echo "$v" > "$d/cpu_partial" 2>/dev/null',
        "done",
        "else",
        "while read -r c x x x x x x x l b s x; do",
        '  case "$c" in slabinfo|"#") continue ;; esac',
        '  echo "$c $l $b $s" > /proc/slabinfo 2>/dev/null',
        "done < /proc/slabinfo",
        "fi",
        "info flushed", "dump flushed",
    ]


def _init_end_lines(token: str) -> list[str]:
    """The end of /init: the end record ``E <token>``, sync, and power off (the sleep
    keeps /init from exiting, which panics the kernel, should poweroff return)."""
    return [f'echo "$M E {token}"', "sync", "poweroff -f", "sleep 60"]


def build_initramfs(busybox: Path, script: str, workload: Path | None = None,
                    policy: bytes | None = None) -> bytes:
    """An uncompressed newc initramfs: busybox with applet links, /init, the workload, the
    policy's sysfs writes (``/policy``, :func:`policy_file`) and /dev/console (so init's
    output reaches the serial console)."""
    entries = [_dir(d) for d in ("bin", "dev", "proc", "sys", "tmp")]
    entries.append(CpioEntry("dev/console", stat.S_IFCHR | 0o600, rdev=(5, 1)))
    entries.append(_file("bin/busybox", Path(busybox).read_bytes()))
    entries += [_link(f"bin/{a}", "busybox") for a in _APPLETS]
    if workload is not None:
        entries.append(_file("bin/workload", Path(workload).read_bytes()))
    if policy is not None:
        entries.append(_file("policy", policy, 0o644))
    entries.append(_file("init", script.encode()))
    return cpio_newc(entries)


# --------------------------------------------------------------------------- console parsing


class ConsoleParseError(ValueError):
    """The console log lacks a record or holds a malformed one."""


@dataclasses.dataclass(frozen=True)
class ParsedConsole:
    """What the host read back from one boot's console."""

    started: bool
    ended: bool
    guest_uptime_at_start: float | None
    info: dict[str, dict[str, str]]
    caches: dict[str, list[dict[str, object]]]
    aliases: dict[str, dict[str, str]]
    counts: dict[str, int]
    workloads: list[dict]
    workload_rc: list[int | None]
    workload_output: list[list[str]]
    #: /proc/slabinfo header lines (``H`` records) per phase: present only for a kernel
    #: without /sys/kernel/slab (SLAB)
    slabinfo_header: dict[str, list[str]] = dataclasses.field(default_factory=dict)
    #: policy writes (``Y`` records): cache, target (None: missing), attr, value, rc
    #: (None: missing)
    policy: list[dict] = dataclasses.field(default_factory=list)


def _console_lines(text: str) -> list[str]:
    return [ln.rstrip("\r") for ln in text.replace("\r\n", "\n").split("\n")]


def parse_console(text: str, token: str) -> ParsedConsole:
    """Parse the MARK records of a console log (see :func:`init_script`).  Lines not starting
    with MARK are kernel messages and are skipped; a malformed MARK line raises
    ConsoleParseError."""
    started = ended = False
    uptime = None
    info: dict[str, dict[str, str]] = {p: {} for p in PHASES}
    caches: dict[str, list[dict[str, object]]] = {p: [] for p in PHASES}
    aliases: dict[str, dict[str, str]] = {p: {} for p in PHASES}
    headers: dict[str, list[str]] = {}
    counts: dict[str, int] = {}
    outputs: dict[int, list[str]] = {}
    rcs: dict[int, int | None] = {}
    policy: list[dict] = []
    for line in _console_lines(text):
        if not line.startswith(MARK + " "):
            continue
        parts = line.split(" ")
        kind = parts[1] if len(parts) > 1 else ""
        try:
            if kind == "S" and parts[2] == token:
                started = True
                uptime = float(parts[3]) if len(parts) > 3 and parts[3] else None
            elif kind == "E" and parts[2] == token:
                ended = True
            elif kind == "I":
                phase, key = parts[2], parts[3]
                info[phase][key] = " ".join(parts[4:])
            elif kind == "C":
                phase, cache = parts[2], parts[3]
                row: dict[str, object] = {"cache": cache}
                for kv in parts[4:]:
                    k, v = kv.split("=", 1)
                    if k not in CACHE_ATTRS:
                        raise ConsoleParseError(f"unknown attribute {k!r}")
                    row[k] = None if v == "NA" else int(v)
                missing = [a for a in _REQUIRED_ATTRS if row.get(a) is None]
                if missing:
                    raise ConsoleParseError(f"cache {cache} lacks {missing[0]}")
                caches[phase].append(row)
            elif kind == "H":
                text = " ".join(parts[3:])
                if not headers.setdefault(parts[2], []):
                    snapshot.slabinfo_version(text)
                headers[parts[2]].append(text)
            elif kind == "P":
                phase = parts[2]
                if not headers.get(phase):
                    raise ConsoleParseError("a /proc/slabinfo line before its header")
                caches[phase].append(snapshot.parse_slabinfo_line(" ".join(parts[3:])))
            elif kind == "A":
                aliases[parts[2]][parts[3]] = parts[4]
            elif kind == "N":
                counts[parts[2]] = int(parts[3])
            elif kind == "W":
                i = int(parts[2])
                if parts[3] == "begin":
                    outputs.setdefault(i, [])
                    rcs.setdefault(i, None)
                elif parts[3] == "rc":
                    rcs[i] = int(parts[4])
            elif kind == "Y":
                missing = parts[6] == "missing"
                policy.append({"cache": parts[2], "target": None if missing else parts[3],
                               "attr": parts[4], "value": int(parts[5]),
                               "rc": None if missing else int(parts[6])})
                if len(parts) != 7:
                    raise ValueError("not 5 fields")
            elif kind == "J":
                outputs.setdefault(int(parts[2]), []).append(" ".join(parts[3:]))
        except (IndexError, KeyError, ValueError) as exc:
            raise ConsoleParseError(f"malformed console record {line[:120]!r}: {exc}") from None
    for phase in PHASES:
        if phase in counts and counts[phase] != len(caches[phase]):
            raise ConsoleParseError(
                f"{phase} dump: {len(caches[phase])} cache records, init counted {counts[phase]}")
    workloads: list[dict] = []
    order = sorted(set(outputs) | set(rcs))
    for i in order:
        found = None
        for ln in outputs.get(i, []):
            if ln.startswith("{"):
                try:
                    found = json.loads(ln)
                except json.JSONDecodeError:
                    raise ConsoleParseError(
                        f"workload {i}: unparseable JSON {ln[:120]!r}") from None
        workloads.append(found if found is not None else {})
    return ParsedConsole(
        started=started, ended=ended, guest_uptime_at_start=uptime, info=info, caches=caches,
        aliases=aliases, counts=counts, workloads=workloads,
        workload_rc=[rcs.get(i) for i in order],
        workload_output=[outputs.get(i, []) for i in order],
        slabinfo_header=headers, policy=policy,
    )


def snapshot_frame(parsed: ParsedConsole, phase: str, accelerator: str = "") -> pl.DataFrame:
    """One dump as a snapshot frame: SNAPSHOT_COLUMNS first (sheaf_capacity null where the
    kernel has no such file), then FRAME_EXTRA, then ``phase`` and ``accelerator``; sorted
    by cache name.  ``aliases`` counts the /sys/kernel/slab symlinks naming each cache.

    A dump read from /proc/slabinfo (a SLAB kernel) becomes a SLAB snapshot
    (:func:`slabtune.kernel.snapshot.parse_slabinfo_line`): FRAME_EXTRA with flags,
    partial and aliases null, then :data:`slabtune.kernel.snapshot.SLAB_COLUMNS`."""
    info = parsed.info[phase]
    missing = [k for k in _INFO_KEYS if k not in info]
    if missing:
        raise ConsoleParseError(f"{phase} dump: no {missing[0]} record")
    if not parsed.caches[phase]:
        raise ConsoleParseError(f"{phase} dump: no caches (the guest has neither "
                                "/sys/kernel/slab nor /proc/slabinfo)")
    kinds = {str(c.get("allocator", "slub")) for c in parsed.caches[phase]}
    if len(kinds) > 1:
        raise ConsoleParseError(f"{phase} dump: both /sys/kernel/slab and /proc/slabinfo "
                                "records")
    slab = kinds == {"slab"}
    boot = {col: ("" if info[k] == "NA" else info[k]) for k, col in _INFO_KEYS.items()}
    alias_count: dict[str, int] = {}
    for target in parsed.aliases[phase].values():
        alias_count[target] = alias_count.get(target, 0) + 1
    rows = []
    for c in sorted(parsed.caches[phase], key=lambda r: str(r["cache"])):
        row = dict(boot)
        row.update(c)
        row["aliases"] = None if slab else alias_count.get(str(c["cache"]), 0)
        rows.append(row)
    extra = FRAME_EXTRA + (snapshot.SLAB_COLUMNS if slab else ())
    df = snapshot.frame_from_rows(rows, extra=extra)
    return df.with_columns(pl.lit(phase).alias("phase"), pl.lit(accelerator).alias("accelerator"))


# --------------------------------------------------------------------------- running qemu


@dataclasses.dataclass(frozen=True)
class GuestSpec:
    """One guest boot: topology, slab boot parameters, workloads, limits."""

    topology: Topology
    boot_params: Mapping[str, int] = dataclasses.field(default_factory=dict)
    workloads: tuple[WorkloadSpec, ...] = ()
    memory_mib: int = DEFAULT_MEMORY_MIB
    timeout_s: float = DEFAULT_TIMEOUT_S
    retries: int = 1
    #: "auto" (KVM when a probe boot works, else TCG), "kvm" or "tcg".
    accel: str = "auto"
    dump: bool = True
    #: A policy's sysfs half, ``{cache: {attribute: value}}`` (:func:`policy_writes`),
    #: written in the guest before the first dump.
    sysfs: Mapping[str, Mapping[str, int]] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class GuestResult:
    """Outcome of a guest boot (after retries).  ``ok`` is False with ``error`` and the
    console tail when the guest never reached its end marker."""

    ok: bool
    accelerator: str
    #: seconds from qemu's start to the init's start marker (None if never seen)
    boot_seconds: float | None
    #: seconds from qemu's start to its exit (or kill)
    total_seconds: float
    returncode: int | None
    attempts: int
    console_tail: str
    error: str
    before: pl.DataFrame | None
    after: pl.DataFrame | None
    workloads: list[dict]
    qemu_argv: list[str]
    kernel: str
    cmdline: str
    guest_uptime_at_start: float | None = None
    timed_out: bool = False
    attempt_errors: list[str] = dataclasses.field(default_factory=list)
    #: the dump after every cache's per-CPU slabs were flushed (see :func:`init_script`)
    flushed: pl.DataFrame | None = None
    #: the policy's sysfs writes as the guest reported them (:func:`_init_policy_lines`):
    #: cache, target (the cache directory written; None where the kernel has no such
    #: cache), attr, value, rc (None: missing)
    policy: list[dict] = dataclasses.field(default_factory=list)


_PANIC_MARKERS = ("Kernel panic", "BUG: soft lockup", "KVM internal error")


def _accel_args(accel: str) -> list[str]:
    if accel == "kvm":
        return ["-accel", "kvm", "-cpu", "host"]
    if accel == "tcg":
        return ["-accel", "tcg,thread=multi"]
    raise GuestError(f"accel: {accel!r} is not auto, kvm or tcg")


def qemu_argv(assets: GuestAssets, initrd: Path, console_log: Path, cmdline: str,
              topology: Topology, memory_mib: int, accel: str) -> list[str]:
    """The full qemu command line (an argument list; nothing goes through a shell)."""
    for p in (assets.kernel, initrd, console_log):
        if "," in str(p):
            raise GuestError(f"path: qemu cannot take a comma in {p}")
    return [
        str(assets.qemu), "-machine", "q35", *_accel_args(accel),
        *topology_qemu_args(topology, memory_mib),
        "-kernel", str(assets.kernel), "-initrd", str(initrd), "-append", cmdline,
        "-display", "none", "-monitor", "none", "-nodefaults", "-no-reboot",
        "-serial", f"file:{console_log}",
    ]


@dataclasses.dataclass(frozen=True)
class _Attempt:
    returncode: int | None
    timed_out: bool
    console: str
    stderr: str
    boot_seconds: float | None
    total_seconds: float


def _run_qemu(argv: list[str], console_log: Path, stderr_log: Path, token: str,
              timeout_s: float) -> _Attempt:
    """Run qemu in its own process group; poll the console for the start/end markers; kill
    the whole group at the deadline.  Never waits past ``timeout_s`` (+ kill latency)."""
    start_mark = f"{MARK} S {token}"
    end_mark = f"{MARK} E {token}"
    t0 = time.monotonic()
    boot_s = None
    timed_out = False
    with open(stderr_log, "wb") as err:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=err, stderr=err,
                                start_new_session=True)
        try:
            ended_at = None
            while True:
                rc = proc.poll()
                now = time.monotonic()
                text = console_log.read_text(errors="replace") if console_log.exists() else ""
                if boot_s is None and start_mark in text:
                    boot_s = now - t0
                if end_mark in text and ended_at is None:
                    ended_at = now
                if rc is not None:
                    break
                # poweroff -f follows the end marker at once; give it a few seconds.
                if ended_at is not None and now - ended_at > 10:
                    _kill_group(proc)
                    break
                if now - t0 > timeout_s:
                    timed_out = True
                    _kill_group(proc)
                    break
                time.sleep(0.05)
        finally:
            if proc.poll() is None:
                _kill_group(proc)
    total = time.monotonic() - t0
    console = console_log.read_text(errors="replace") if console_log.exists() else ""
    stderr = stderr_log.read_text(errors="replace") if stderr_log.exists() else ""
    return _Attempt(proc.returncode, timed_out, console, stderr, boot_s, total)


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass


def _tail(text: str, n: int = CONSOLE_TAIL_CHARS) -> str:
    return text[-n:]


def _attempt_error(a: _Attempt, parsed: ParsedConsole | None, parse_err: str) -> str:
    """Why an attempt failed, or "" when it succeeded.  A guest that printed its end marker
    and parsed cleanly succeeded even if it logged a soft lockup on the way."""
    if parse_err:
        return f"console: {parse_err}"
    if parsed is not None and parsed.started and parsed.ended and not a.timed_out:
        return ""
    cause = next((m for m in _PANIC_MARKERS if m in a.console or m in a.stderr), "")
    if a.timed_out:
        return f"timed out after {a.total_seconds:.1f} s" + (f" ({cause})" if cause else "")
    if cause:
        return f"guest failed: {cause}"
    if parsed is None or not parsed.started:
        last = (a.stderr.strip().splitlines() or ["no output"])[-1]
        return f"qemu exited with {a.returncode} before init started: {last}"
    return f"no end marker (qemu exited with {a.returncode})"


def boot_guest(spec: GuestSpec, assets: GuestAssets | None = None) -> GuestResult:
    """Boot one guest per :class:`GuestSpec`, retrying ``spec.retries`` times when an
    attempt times out, panics or never prints its end marker.  Boot parameters are validated
    (GuestError) before anything starts."""
    for w in spec.workloads:  # validate before anything starts
        w.argv()
    if not isinstance(spec.retries, int) or not 0 <= spec.retries <= 5:
        raise GuestError(f"retries: {spec.retries!r} is outside 0..5")
    if not spec.timeout_s > 0:
        raise GuestError(f"timeout_s: {spec.timeout_s!r} must be positive")
    topology_qemu_args(spec.topology, spec.memory_mib)  # validate
    writes = policy_writes(spec.sysfs)
    if writes and not spec.dump:
        raise GuestError("sysfs: a policy's values are checked in the dumps; dump is off")
    assets = assets or find_assets()
    profile = boot_profile(assets.kernel)
    if writes and profiles.is_slab(profile):
        raise GuestError(f"sysfs: {profile.name} is SLAB, which has no /sys/kernel/slab "
                         "(its tunables are /proc/slabinfo writes)")
    cmdline = guest_cmdline(spec.boot_params, spec.topology, profile)
    if spec.accel == "auto":
        accel = "kvm" if probe_kvm(assets).usable else "tcg"
    else:
        _accel_args(spec.accel)
        accel = spec.accel

    errors: list[str] = []
    result: GuestResult | None = None
    with tempfile.TemporaryDirectory(prefix="slabtune-guest-") as tmp:
        tmpd = Path(tmp)
        for attempt in range(1, spec.retries + 2):
            token = secrets.token_hex(6)
            initrd = tmpd / f"initrd-{attempt}.cpio"
            initrd.write_bytes(build_initramfs(
                assets.busybox, init_script(token, spec.workloads, spec.dump, bool(writes)),
                assets.workload if spec.workloads else None,
                policy_file(writes) if writes else None))
            console_log = tmpd / f"console-{attempt}.log"
            argv = qemu_argv(assets, initrd, console_log, cmdline, spec.topology,
                             spec.memory_mib, accel)
            a = _run_qemu(argv, console_log, tmpd / f"qemu-{attempt}.err", token, spec.timeout_s)
            parsed, parse_err = None, ""
            try:
                parsed = parse_console(a.console, token)
            except ConsoleParseError as exc:
                parse_err = str(exc)
            before = after = flushed = None
            err = _attempt_error(a, parsed, parse_err)
            if not err and spec.dump:
                try:
                    before = snapshot_frame(parsed, "before", accel)
                    after = snapshot_frame(parsed, "after", accel)
                    flushed = snapshot_frame(parsed, "flushed", accel)
                except ConsoleParseError as exc:
                    err = f"console: {exc}"
            if not err and writes:
                err = _policy_error(writes, parsed.policy)
                if not err:
                    before, after, flushed = (with_policy_columns(f, parsed.policy)
                                              for f in (before, after, flushed))
            if not err and parsed is not None:
                bad = [i for i, rc in enumerate(parsed.workload_rc) if rc != 0]
                if bad:
                    out = " | ".join(parsed.workload_output[bad[0]])[-300:]
                    err = f"workload {bad[0]} exited with {parsed.workload_rc[bad[0]]}: {out}"
            tail = _tail(a.console + ("\n[qemu stderr]\n" + a.stderr if a.stderr.strip() else ""))
            result = GuestResult(
                ok=not err, accelerator=accel, boot_seconds=a.boot_seconds,
                total_seconds=a.total_seconds, returncode=a.returncode, attempts=attempt,
                console_tail=tail, error=err, before=before, after=after,
                workloads=parsed.workloads if parsed is not None and not err else [],
                qemu_argv=argv, kernel=str(assets.kernel), cmdline=cmdline,
                guest_uptime_at_start=parsed.guest_uptime_at_start if parsed else None,
                timed_out=a.timed_out, attempt_errors=errors + ([err] if err else []),
                flushed=flushed, policy=list(parsed.policy) if parsed is not None else [],
            )
            if not err:
                break
            errors.append(err)
    assert result is not None
    return result


def _policy_error(writes: Sequence[tuple[str, str, int]], got: Sequence[dict]) -> str:
    """Why the guest's report of the policy writes (``Y`` records) does not show every write
    done, or "": a record per write, in order, each with status 0.  A cache the kernel does
    not have is not an error (a policy for a fleet names caches a small kernel may lack);
    :attr:`GuestResult.policy` keeps it with target None."""
    if len(got) != len(writes):
        return f"policy: the guest reported {len(got)} of {len(writes)} sysfs writes"
    for (cache, attr, value), rec in zip(writes, got):
        if (rec["cache"], rec["attr"], rec["value"]) != (cache, attr, value):
            return f"policy: write {cache}/{attr}={value} reported as {rec}"
        if rec["rc"] not in (0, None):
            return (f"policy: the kernel refused {value} for /sys/kernel/slab/{cache}/{attr} "
                    f"(status {rec['rc']})")
    return ""


def with_policy_columns(df: pl.DataFrame | None, writes: Sequence[dict]) -> pl.DataFrame | None:
    """A snapshot frame with :data:`POLICY_COLUMNS`: the value last written to each cache
    directory (through its own name or a merged alias), null where none was."""
    if df is None:
        return None
    last: dict[str, dict[str, int]] = {}
    for w in writes:
        if w["target"] is not None:
            last.setdefault(w["attr"], {})[w["target"]] = int(w["value"])
    return df.with_columns(
        pl.col("cache").replace_strict(last.get(attr, {}), default=None,
                                       return_dtype=pl.Int64).alias(col)
        for attr, col in zip(POLICY_ATTRS, POLICY_COLUMNS, strict=True))


# --------------------------------------------------------------------------- KVM probe


@dataclasses.dataclass(frozen=True)
class KvmProbe:
    """Whether KVM guests really run here, and why not."""

    usable: bool
    reason: str
    seconds: float = 0.0


_PROBE_CACHE: dict[str, KvmProbe] = {}


def _probe_key(assets: GuestAssets) -> str:
    try:
        boot_id = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        boot_id = "unknown"
    raw = f"{boot_id}|{assets.qemu}|{assets.kernel}|{assets.kernel.stat().st_mtime_ns}"
    return hashlib.sha256(raw.encode()).hexdigest()[:16]


def probe_kvm(assets: GuestAssets | None = None, timeout_s: float = PROBE_TIMEOUT_S,
              refresh: bool = False) -> KvmProbe:
    """Boot a minimal guest (no dump, no workload) with ``-accel kvm``; KVM counts as usable
    only if that guest reaches its end marker.  /dev/kvm that opens is not enough: without
    hardware virtualisation under a VM, guests die with "KVM internal error ... emulation
    failure".  The result is cached in memory and in the cache directory, keyed by the host's
    boot id, qemu and kernel."""
    assets = assets or find_assets()
    key = _probe_key(assets)
    cache_file = cache_dir() / "kvm-probe.json"
    if not refresh:
        if key in _PROBE_CACHE:
            return _PROBE_CACHE[key]
        try:
            stored = json.loads(cache_file.read_text())
            if stored.get("key") == key:
                probe = KvmProbe(bool(stored["usable"]), str(stored["reason"]),
                                 float(stored.get("seconds", 0.0)))
                _PROBE_CACHE[key] = probe
                return probe
        except (OSError, ValueError, KeyError):
            pass
    try:
        fd = os.open("/dev/kvm", os.O_RDWR)
        os.close(fd)
    except OSError as exc:
        probe = KvmProbe(False, f"/dev/kvm: {exc.strerror}")
    else:
        spec = GuestSpec(topology=Topology.uniform(1), timeout_s=timeout_s, retries=0,
                         accel="kvm", dump=False)
        r = boot_guest(spec, assets)
        if r.ok:
            probe = KvmProbe(True, "probe guest reached its end marker", r.total_seconds)
        else:
            probe = KvmProbe(False, f"probe boot failed: {r.error}", r.total_seconds)
    _PROBE_CACHE[key] = probe
    try:
        cache_file.parent.mkdir(parents=True, exist_ok=True)
        tmp = cache_file.with_suffix(".tmp")
        tmp.write_text(json.dumps({"key": key, **dataclasses.asdict(probe)}))
        os.replace(tmp, cache_file)
    except OSError:
        pass
    return probe

"""The lab module (``native/lab/slabtune_lab.c``): build it against a kept kernel build
tree, and map a simulation config to its parameters.

The module drives one slab cache from kthreads bound to chosen CPUs in the workload kinds
of the model (model/workloads.py), so the real allocator's SLUB_STATS counters can be set
beside the model's.  :func:`build_module` compiles it with ``make -C <tree> M=<dir>
modules`` into ``<build_dir>/lab/<kernel>/`` (:func:`slabtune.native.build_dir`), again
only when the source or the tree changed.  :func:`module_params` turns a config's
``[workload]`` table and its topology into ``insmod`` arguments that place the model's
roles (senders and receivers, the interrupt CPU, completion CPUs) on the guest's CPUs the
way the model's constructors spread its representative CPUs over node classes;
:func:`cache_params` does the same for ``[cache]`` and :func:`config_params` for a whole
config document.  Every bad value is one :class:`LabError` line naming the field.

CPU numbering is the guest's (kernel/guest.py topology_qemu_args): present CPUs fill the
nodes in order of ``node_cpus``, and the first ``online`` of them come up.
"""

from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import json
import math
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from slabtune import native
from slabtune.errors import SlabtuneError
from slabtune.kernel import build

#: The module's sources, relative to the slabtune.native package.
SOURCES = ("lab/slabtune_lab.c", "lab/Kbuild")
MODULE_NAME = "slabtune_lab"
#: Prefix of the module's printk lines (each followed by a record word and one JSON object).
PRINTK_PREFIX = "slabtune_lab: "
#: Most kthreads one run may have (LAB_MAX_WORKERS in the C source).
MAX_WORKERS = 64
#: Largest live target or depth the module takes (LAB_MAX_LIVE).
MAX_LIVE = 1 << 20
#: Probabilities are integers out of this (as in model/workloads.py).
PROB_ONE = 1 << 16
#: Ops per allocating worker when the caller gives none.
DEFAULT_OPS = 10_000
#: A lab run's warm-up is this fraction (1/n) of its steps, before the counted window.
WARMUP_DIVISOR = 4
#: Seconds one module build may take.
BUILD_TIMEOUT_S = 600

#: Parameters of each workload kind with the model's defaults (model/workloads.py
#: constructors; tests/test_lab_module.py checks that they agree).
KIND_DEFAULTS: dict[str, dict[str, Any]] = {
    "local": {"live": 32, "burst": 0, "alloc_prob": 0.5, "drain": "hold"},
    "producer_consumer": {"depth": 64, "cross_node": 0.0, "drain": "hold"},
    "request_response": {"threads": 16, "irq_free": 0.9, "live": 16, "irq_self_free": 0.0,
                         "drain": "hold"},
    "block_io": {"depth": 32, "completion_remote": False, "completions": 1,
                 "drain": "hold"},
}
#: The ``drain`` values (model/workloads.py DRAINS): ``hold`` keeps the declared live set,
#: ``eager`` frees whenever objects are pending (the declared value a cap).
DRAINS = ("hold", "eager")

NODE_MEM0, NODE_MEM_OTHER, NODE_MEMLESS = 0, 1, 2

#: The kmalloc caches (kernel names, mm/slab_common.c kmalloc_info[]) -> kmalloc size.
KMALLOC_NAMES: dict[str, int] = {
    (f"kmalloc-{n // 1024}k" if n >= 1024 else f"kmalloc-{n}"): n
    for n in (8, 16, 32, 64, 96, 128, 192, 256, 512, 1024, 2048, 4096, 8192)
}


class LabError(SlabtuneError):
    """The lab module cannot be built, or a config does not map to its parameters; the
    message is one line naming the field or the build log."""


# --------------------------------------------------------------------------- building


def module_dir(kernel_name: str) -> Path:
    """Where the module for ``kernel_name`` is built: ``<build_dir>/lab/<kernel_name>``."""
    return native.build_dir() / "lab" / kernel_name


def _tree_identity(tree: Path) -> str:
    """A hash of what a module build depends on in the kernel tree: its .config, exported
    symbols and release string."""
    h = hashlib.sha256()
    for rel in (".config", "Module.symvers", "include/generated/utsrelease.h"):
        p = tree / rel
        try:
            h.update(rel.encode() + b"\0" + p.read_bytes() + b"\0")
        except OSError:
            h.update(rel.encode() + b"\0missing\0")
    return h.hexdigest()


def _stamp(tree: Path, arch_args: list[str]) -> str:
    h = hashlib.sha256()
    h.update(f"{tree}\0{_tree_identity(tree)}\0".encode())
    if arch_args:       # nothing for x86, so x86 stamps read as before
        h.update(("\0".join(arch_args) + "\0").encode())
    for name in SOURCES:
        h.update(name.encode() + b"\0" + native.source(name).read_bytes() + b"\0")
    return h.hexdigest()


def build_module(kernel_name: str, jobs: int = 1) -> Path:
    """The ``slabtune_lab.ko`` for the built kernel ``kernel_name``, compiled against its
    kept build tree when missing or when the source or the tree changed (a stamp file holds
    their hash).  A kernel of arch ``um`` (User Mode Linux) gets ``ARCH=um`` on make's
    command line, as its tree was configured with.  The full make output goes to
    ``build.log`` beside it; a failed build is one LabError line naming that log."""
    if kernel_name not in build.KERNELS:
        known = ", ".join(build.KERNELS) or "none"
        raise LabError(f"kernel: unknown kernel {kernel_name!r} (known: {known})")
    tree = build.build_tree(kernel_name)
    if tree is None:
        raise LabError(f"kernel {kernel_name}: no kept build tree under "
                       f"{build.kernel_dir(kernel_name)}; build the kernel first "
                       "(scripts/build-kernels.sh)")
    arch_args = ["ARCH=um"] if build.kernel_arch(kernel_name) == "um" else []
    out = module_dir(kernel_name)
    out.mkdir(parents=True, exist_ok=True)
    ko = out / f"{MODULE_NAME}.ko"
    stamp_file = out / "stamp"
    log = out / "build.log"
    with open(out / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        want = _stamp(tree, arch_args)
        try:
            if ko.is_file() and stamp_file.read_text().strip() == want:
                return ko
        except OSError:
            pass
        make = shutil.which("make")
        if make is None:
            raise LabError(f"lab module: make is not installed (kernel {kernel_name})")
        stamp_file.unlink(missing_ok=True)
        ko.unlink(missing_ok=True)
        for name in SOURCES:
            shutil.copyfile(native.source(name), out / Path(name).name)
        argv = [make, "-C", str(tree), *arch_args, f"M={out}", f"-j{int(jobs)}", "modules"]
        with open(log, "w") as fh:
            fh.write(" ".join(argv) + "\n")
            fh.flush()
            try:
                proc = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=fh,
                                      stderr=subprocess.STDOUT, timeout=BUILD_TIMEOUT_S)
                rc = proc.returncode
            except subprocess.TimeoutExpired:
                rc = None
        if rc != 0 or not ko.is_file():
            why = "timed out" if rc is None else f"make exited with {rc}"
            first = _first_error(log)
            raise LabError(f"lab module for kernel {kernel_name}: build failed ({why}"
                           + (f": {first}" if first else "") + f"); log: {log}")
        stamp_file.write_text(want + "\n")
        return ko


def _first_error(log: Path) -> str:
    try:
        lines = log.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    for line in lines:
        if "error:" in line or "Error " in line:
            return line.strip()[:200]
    return ""


# --------------------------------------------------------------------------- topology


@dataclasses.dataclass(frozen=True)
class _Layout:
    """The guest's online CPUs: node of each, and the node classes of the model."""

    cpu_node: tuple[int, ...]          # node of online CPU i
    node_has_memory: tuple[bool, ...]

    def cpus_of_node(self, n: int) -> list[int]:
        return [c for c, m in enumerate(self.cpu_node) if m == n]

    def node_class(self, n: int) -> int:
        """Class 0: the first node with memory that has online CPUs; 1: other memory nodes;
        2: memoryless nodes (model/workloads.py node_groups)."""
        if not self.node_has_memory[n]:
            return NODE_MEMLESS
        mem_cpu = [m for m in range(len(self.node_has_memory))
                   if self.node_has_memory[m] and self.cpus_of_node(m)]
        first = mem_cpu[0] if mem_cpu else self.node_has_memory.index(True)
        return NODE_MEM0 if n == first else NODE_MEM_OTHER

    def cpus_of_class(self, k: int) -> list[int]:
        return [c for c, n in enumerate(self.cpu_node) if self.node_class(n) == k]


def _layout(topology: Any) -> _Layout:
    """A Topology (node_cpus, node_has_memory, online) or a config's [topology] table."""
    if isinstance(topology, Mapping):
        node_cpus, has_mem, online = _topology_table(topology)
    else:
        try:
            node_cpus = tuple(int(c) for c in topology.node_cpus)
            has_mem = tuple(bool(m) for m in topology.node_has_memory)
            online = int(topology.online)
        except (AttributeError, TypeError, ValueError):
            raise LabError(f"topology: {topology!r} is not a Topology or a [topology] "
                           "table") from None
    if not any(has_mem):
        raise LabError("topology.memoryless_nodes: every node is memoryless")
    cpu_node = [n for n, c in enumerate(node_cpus) for _ in range(c)][:online]
    if not cpu_node:
        raise LabError("topology.online: no online CPU")
    return _Layout(tuple(cpu_node), has_mem)


def _topology_table(tab: Mapping) -> tuple[tuple[int, ...], tuple[bool, ...], int]:
    cpus = _int("topology.cpus", tab.get("cpus"), 1, 8192)
    nodes = _int("topology.nodes", tab.get("nodes", 1), 1, 64)
    node_cpus = tab.get("node_cpus")
    if node_cpus is None:
        base, extra = divmod(cpus, nodes)
        node_cpus = [base + (1 if i < extra else 0) for i in range(nodes)]
    elif not isinstance(node_cpus, Sequence) or len(node_cpus) != nodes:
        raise LabError(f"topology.node_cpus: must list {nodes} CPU counts")
    node_cpus = tuple(_int(f"topology.node_cpus[{i}]", c, 0, 8192)
                      for i, c in enumerate(node_cpus))
    if sum(node_cpus) != cpus:
        raise LabError(f"topology.node_cpus: adds up to {sum(node_cpus)} CPUs but "
                       f"cpus = {cpus}")
    ml = tab.get("memoryless_nodes", [])
    if not isinstance(ml, Sequence) or isinstance(ml, str):
        raise LabError("topology.memoryless_nodes: must be a list of node ids")
    for n in ml:
        _int("topology.memoryless_nodes", n, 0, nodes - 1)
    online = _int("topology.online", tab.get("online", cpus), 1, cpus)
    return node_cpus, tuple(i not in ml for i in range(nodes)), online


# --------------------------------------------------------------------------- values


def _int(where: str, v: Any, lo: int, hi: int) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise LabError(f"{where}: {v!r} is not an integer in {lo}..{hi}")
    return v


def _prob(where: str, v: Any) -> int:
    """A probability quantised to 1/65536 exactly as model/workloads.py does."""
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) \
            or not 0.0 <= float(v) <= 1.0:
        raise LabError(f"{where}: {v!r} is not a probability in [0, 1]")
    return int(round(float(v) * PROB_ONE))


def _bool(where: str, v: Any) -> bool:
    if not isinstance(v, bool):
        raise LabError(f"{where}: {v!r} is not true or false")
    return v


def cpu_list(cpus: Sequence[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``"0-2,5"`` (order kept; runs of consecutive CPUs joined)."""
    parts: list[str] = []
    i = 0
    while i < len(cpus):
        j = i
        while j + 1 < len(cpus) and cpus[j + 1] == cpus[j] + 1:
            j += 1
        parts.append(str(cpus[i]) if i == j else f"{cpus[i]}-{cpus[j]}")
        i = j + 1
    return ",".join(parts)


# --------------------------------------------------------------------------- parameters


def warmup_steps(steps: int) -> int:
    """Steps (ops per allocating worker, one op per rep per step) a lab run does before its
    counted window, on both sides: the kernel's workers park after them and the counters
    are read there (kernel/lab_boot.py), the model's counters at that step are subtracted
    (validate/lab.py).  A quarter of the run: the cache's start-up (the slabs that first
    fill every CPU's live objects, about one per CPU) falls inside it."""
    return steps // WARMUP_DIVISOR


def module_params(workload_doc: Mapping[str, Any], topology: Any, *, ops: int = DEFAULT_OPS,
                  seed: int = 1, ring: str = "lockless", warmup: int = 0,
                  lockstep: bool = False) -> list[str]:
    """``insmod`` arguments (``key=value``) that run a config's ``[workload]`` table on the
    CPUs of ``topology`` (a :class:`~slabtune.model.topology.Topology` or a ``[topology]``
    table).  Roles go on CPUs as the model's constructors spread their reps:

    * ``local``: every online CPU;
    * ``producer_consumer``: on each node the first half (rounded up) of its CPUs send and
      the rest receive (a node's only CPU does both); at least 2 CPUs;
    * ``request_response``: the interrupt CPU is the first CPU of the first memory node with
      CPUs; ``min(threads, CPUs - 1)`` thread CPUs follow from that node, the other memory
      nodes, then the memoryless nodes (1 CPU: both on it);
    * ``block_io``: ``completions`` completion CPUs, the first of the first memory node, or
      with ``completion_remote`` of a memoryless node (else another memory node); every
      other CPU submits.

    ``other_ns`` becomes the module's ``work_ns`` (rounded).  ``ops``: ops per allocating
    worker in the counted window; ``warmup``: ops per allocating worker before it (0: no
    warm-up); ``seed``: the module's generator seed; ``ring``: lockless or spinlock;
    ``lockstep``: the module's step barrier from the first step, warm-up included (every
    worker one op or none per step, the model's schedule, and ``warmup`` and ``ops``
    count steps, so every allocating worker runs the same steps as each rep of the model
    does and all park after the same step; free-running workers sleep a tick when idle,
    and returns pile up meanwhile).

    ``drain`` (every kind; ``hold`` by default, as in the model): ``hold`` becomes the
    module's ``drain=hold``, which keeps the declared live set by the rule of
    model/workloads.py ``hold_levels`` computed over the module's own workers and their
    free distributions (a local ``burst`` above twice ``live`` is refused); ``eager``
    passes nothing (the module's default), so an eager config's parameters are those of
    before ``drain`` existed.  A ``hold`` run in lockstep with a warm-up also gets
    ``end_park=1``: its workers park again after the window's last step, so the window
    ends before the drain that frees every live set (kernel/lab_boot.py dumps ``end``).
    """
    if not isinstance(workload_doc, Mapping):
        raise LabError("workload: must be a table")
    kind = workload_doc.get("kind")
    if kind not in KIND_DEFAULTS:
        raise LabError(f"workload.kind: {kind!r} is not one of {', '.join(KIND_DEFAULTS)}")
    defaults = KIND_DEFAULTS[kind]
    for key in workload_doc:
        if key not in ("kind", "other_ns", *defaults):
            raise LabError(f"workload.{key}: unknown key (allowed: kind, other_ns, "
                           f"{', '.join(defaults)})")
    p = {**defaults, **{k: v for k, v in workload_doc.items() if k in defaults}}
    other = workload_doc.get("other_ns", 0.0)
    if isinstance(other, bool) or not isinstance(other, (int, float)) \
            or not math.isfinite(other) or not 0 <= other < 1e9:
        raise LabError(f"workload.other_ns: {other!r} is not a number in [0, 1e9)")
    _int("ops", ops, 1, (1 << 63) - 1)
    _int("warmup", warmup, 0, (1 << 63) - 1)
    _int("seed", seed, 0, (1 << 64) - 1)
    if ring not in ("lockless", "spinlock"):
        raise LabError(f"ring: {ring!r} is not lockless or spinlock")
    drain = p["drain"]
    if drain not in DRAINS:
        raise LabError(f"workload.drain: {drain!r} is not one of {', '.join(DRAINS)}")
    lay = _layout(topology)
    cpus_a, cpus_b, extra = _ROLES[kind](p, lay)
    if drain == "hold" and kind == "local" and p["burst"] > 2 * p["live"]:
        raise LabError(f"workload.burst: {p['burst']} is more than twice live "
                       f"({p['live']}) under drain = \"hold\"")
    if len(cpus_a) + len(cpus_b) > MAX_WORKERS:
        raise LabError(f"topology: {len(cpus_a) + len(cpus_b)} workers are more than the "
                       f"lab module's {MAX_WORKERS}")
    out = [f"kind={kind}", f"cpus={cpu_list(cpus_a)}"]
    if cpus_b:
        out.append(f"cpus_b={cpu_list(cpus_b)}")
    out += [f"{k}={v}" for k, v in extra]
    out += [f"ops={ops}", f"seed={seed}", f"ring={ring}"]
    if warmup:
        out.append(f"warmup={warmup}")
    if lockstep:
        out.append("lockstep=1")
    if drain == "hold":
        out.append("drain=hold")
        if lockstep and warmup:
            out.append("end_park=1")
    if other:
        out.append(f"work_ns={int(round(other))}")
    return out


def _local(p: dict, lay: _Layout):
    live = _int("workload.live", p["live"], 1, MAX_LIVE)
    burst = _int("workload.burst", p["burst"], 0, MAX_LIVE)
    ap = _prob("workload.alloc_prob", p["alloc_prob"])
    cpus = list(range(len(lay.cpu_node)))
    return cpus, [], [("live", live), ("burst", burst), ("alloc_prob", ap)]


def _producer_consumer(p: dict, lay: _Layout):
    depth = _int("workload.depth", p["depth"], 1, MAX_LIVE)
    cross = _prob("workload.cross_node", p["cross_node"])
    if len(lay.cpu_node) < 2:
        raise LabError("workload.kind: producer_consumer needs at least 2 CPUs")
    send: list[int] = []
    recv: list[int] = []
    for n in range(len(lay.node_has_memory)):
        cs = lay.cpus_of_node(n)
        if not cs:
            continue
        half = (len(cs) + 1) // 2
        send += cs[:half]
        recv += cs[half:] if len(cs) > 1 else cs
    return send, recv, [("depth", depth), ("cross_node", cross)]


def _request_response(p: dict, lay: _Layout):
    threads = _int("workload.threads", p["threads"], 1, 1 << 24)
    live = _int("workload.live", p["live"], 1, MAX_LIVE)
    irq_free = _prob("workload.irq_free", p["irq_free"])
    own = _prob("workload.irq_self_free", p["irq_self_free"])
    first = lay.cpus_of_class(NODE_MEM0)
    irq = first[0]
    total = len(lay.cpu_node)
    if total == 1:
        app = [irq]
    else:
        order = [c for c in first if c != irq]
        order += lay.cpus_of_class(NODE_MEM_OTHER) + lay.cpus_of_class(NODE_MEMLESS)
        app = order[:min(threads, total - 1)]
    return app, [irq], [("live", live), ("irq_free", irq_free), ("irq_self_free", own)]


def _block_io(p: dict, lay: _Layout):
    depth = _int("workload.depth", p["depth"], 1, MAX_LIVE)
    remote = _bool("workload.completion_remote", p["completion_remote"])
    completions = _int("workload.completions", p["completions"], 1, MAX_WORKERS)
    total = len(lay.cpu_node)
    if total < 2:
        raise LabError("workload.kind: block_io needs at least 2 CPUs")
    comp_class = NODE_MEM0
    if remote:
        # model/workloads.py block_io(): another memory node only where class 1 is one node
        # (or the completions do not fit on the first), else the first memory node
        other = lay.cpus_of_class(NODE_MEM_OTHER)
        if lay.cpus_of_class(NODE_MEMLESS):
            comp_class = NODE_MEMLESS
        elif other and (len({lay.cpu_node[c] for c in other}) == 1
                        or completions >= len(lay.cpus_of_class(NODE_MEM0))):
            comp_class = NODE_MEM_OTHER
    pool = lay.cpus_of_class(comp_class)
    if completions > len(pool) or total - completions < 1:
        raise LabError(f"workload.completions: {completions} leaves no submitting CPU or "
                       f"exceeds the {len(pool)} CPUs of the completion node class")
    comp = pool[:completions]
    submit = [c for c in range(total) if c not in comp]
    return submit, comp, [("depth", depth)]


_ROLES = {
    "local": _local,
    "producer_consumer": _producer_consumer,
    "request_response": _request_response,
    "block_io": _block_io,
}


def cache_params(cache_doc: Mapping[str, Any], *, cache_name: str = MODULE_NAME,
                 no_merge: bool = True) -> list[str]:
    """``insmod`` arguments for a config's ``[cache]`` table: ``name = "kmalloc-512"`` (any
    kmalloc cache, ``kmalloc-1k`` style above 512) drives kmalloc of that size;
    ``size = N`` a cache of the module's own, ``cache_name``, of that size, kept unmerged
    (SLAB_NO_MERGE, v6.5 on) and kept until the module is removed, so its
    /sys/kernel/slab directory can be read after the run.  Kernels before v6.5 have no
    SLAB_NO_MERGE and refuse it: pass ``no_merge=False`` there (a size no existing cache
    is within 8 bytes of is not merged anyway).  Other named caches belong to kernel
    subsystems and cannot be driven from the module."""
    if not isinstance(cache_doc, Mapping):
        raise LabError("cache: must be a table")
    for key in cache_doc:
        if key not in ("name", "size"):
            raise LabError(f"cache.{key}: unknown key (allowed: name, size)")
    if ("name" in cache_doc) == ("size" in cache_doc):
        raise LabError("cache: give exactly one of name or size")
    if "name" in cache_doc:
        name = cache_doc["name"]
        size = KMALLOC_NAMES.get(name) if isinstance(name, str) else None
        if size is None:
            raise LabError(f"cache.name: {name!r} is not a kmalloc cache the lab module can "
                           f"drive ({', '.join(KMALLOC_NAMES)}; size = N for a cache of "
                           "its own)")
        return [f"size={size}"]
    size = _int("cache.size", cache_doc["size"], 8, 1 << 20)
    if not cache_name.replace("_", "").isalnum() or len(cache_name) > 31:
        raise LabError(f"cache_name: {cache_name!r} is not a short identifier")
    return (["own_cache=1", f"size={size}", f"cache_name={cache_name}"]
            + (["cache_flags=no_merge"] if no_merge else []) + ["keep_cache=1"])


def config_params(doc: Mapping[str, Any], *, ring: str = "lockless") -> list[str]:
    """``insmod`` arguments for a whole simulation config document (the tables of a
    CONFIG.toml, sweeps/simconfig.py): its ``[cache]``, its ``[workload]`` on its
    ``[topology]``, and from ``[run]`` the seed and ``steps * ops_per_step`` ops per
    allocating worker (one op per rep per step in the model) in the counted window, after
    :func:`warmup_steps` ``* ops_per_step`` of warm-up."""
    if not isinstance(doc, Mapping):
        raise LabError("config: must be a table")
    for name in ("topology", "cache", "workload"):
        if not isinstance(doc.get(name), Mapping):
            raise LabError(f"[{name}]: missing table")
    run = doc.get("run", {})
    if not isinstance(run, Mapping):
        raise LabError("run: must be a table")
    steps = _int("run.steps", run.get("steps", 2000), 1, 10_000_000)
    b = _int("run.ops_per_step", run.get("ops_per_step", 1), 1, 1024)
    seed = _int("run.seed", run.get("seed", 0), 0, (1 << 32) - 1)
    return (cache_params(doc["cache"])
            + module_params(doc["workload"], doc["topology"], ops=steps * b, seed=seed,
                            ring=ring, warmup=warmup_steps(steps) * b))


def parse_printk(lines: Sequence[str] | str) -> dict[str, Any]:
    """The module's records from kernel log lines: ``{"workers": [...], "done": {...} or
    None, "errors": [...]}`` (the last run's when the log holds several)."""
    if isinstance(lines, str):
        lines = lines.splitlines()
    out: dict[str, Any] = {"workers": [], "done": None, "errors": []}
    for line in lines:
        at = line.find(PRINTK_PREFIX)
        if at < 0:
            continue
        word, _, body = line[at + len(PRINTK_PREFIX):].partition(" ")
        if word not in ("worker", "done", "error"):
            continue
        try:
            rec = json.loads(body)
        except ValueError:
            raise LabError(f"lab module: malformed {word} line: {line.strip()[:200]}") from None
        if word == "worker":
            if out["done"] is not None:      # a later run starts
                out = {"workers": [], "done": None, "errors": []}
            out["workers"].append(rec)
        elif word == "done":
            out["done"] = rec
        else:
            out["errors"].append(rec)
    return out

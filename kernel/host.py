"""Read a running kernel: its CPU/node topology and its slab caches, from sysfs and procfs.

Everything here takes a ``root`` directory (``/`` for this host) so the same code reads a
tree copied out of a guest.  Kernel list strings ("0-63", "0,2") are parsed and formatted with
the helpers of :mod:`slabtune.kernel.snapshot`, which owns the format.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import polars as pl

from slabtune.errors import SlabtuneError
from slabtune.kernel import snapshot
from slabtune.model.topology import Topology, TopologyError
from slabtune.results.safeio import read_bounded

#: Per-cache sysfs files that fill required snapshot columns (sheaf_capacity is optional).
_CACHE_FILES = ("object_size", "slab_size", "order", "objs_per_slab", "min_partial",
                "cpu_partial")
#: Per-cache files for the extra columns; a missing one leaves the column empty.
_EXTRA_FILES = snapshot.DEBUG_FLAG_COLUMNS + ("slabs", "objects", "total_objects", "partial")


@dataclasses.dataclass(frozen=True)
class HostTopology:
    """A machine's topology as the model sees it plus the raw kernel list strings.

    ``node_ids`` maps the model's dense node index to the kernel's node id (the kernel's
    online nodes need not be contiguous); ``node_cpulists`` holds each node's ``cpulist``
    and ``node_distances`` its ``distance`` line ("" where the file is missing).
    """

    topology: Topology
    cpus_possible: str
    cpus_present: str
    cpus_online: str
    nodes_online: str
    nodes_with_memory: str
    nodes_with_cpu: str
    node_ids: tuple[int, ...]
    node_cpulists: tuple[str, ...]
    node_distances: tuple[str, ...] = ()


#: Largest sysfs or procfs file read (sysfs attributes are at most a page; a tree copied
#: from a guest under --root may hold anything).
_FILE_LIMIT = 1 << 20


def _read_text(path: Path) -> str:
    """A sysfs/procfs file under the root, refused unless a regular file of at most
    _FILE_LIMIT bytes (a FIFO or device planted in a --root tree would block or never
    end; slabtune.results.safeio.read_bounded)."""
    try:
        return read_bounded(path, _FILE_LIMIT, "--root").decode(errors="replace").strip()
    except OSError as err:
        raise SlabtuneError(f"{path}: cannot read: {err.strerror or err}") from None


def _read_list(path: Path) -> tuple[int, ...]:
    text = _read_text(path)
    try:
        return snapshot.parse_cpulist(text)
    except ValueError as err:
        raise SlabtuneError(f"{path}: {err}") from None


def topology_from_lists(cpus_possible: str, cpus_present: str, cpus_online: str,
                        nodes_with_memory: str, nodes_with_cpu: str,
                        node_cpulists: dict[int, str] | None = None,
                        nodes_online: str | None = None,
                        node_distances: dict[int, str] | None = None,
                        ) -> tuple[Topology, tuple[int, ...]]:
    """Build a :class:`Topology` from kernel list strings; return it with the node ids.

    * ``possible`` is ``nr_cpu_ids`` (highest possible CPU + 1), ``present`` and ``online``
      the weights of their masks, as ``num_present_cpus()``/``num_online_cpus()`` count.
    * nodes are the union of the memory nodes, CPU nodes and ``node_cpulists`` keys, in id
      order, renumbered densely.
    * with ``node_cpulists`` each node gets its present CPUs; present CPUs no node lists
      (x86 unmaps offline CPUs from their node) go to the first CPU node.  Without them (a
      snapshot stores no per-node lists) the present CPUs are spread evenly over the CPU
      nodes: an approximation that only matters to the dynamics model, not to the
      structural fields ``kernel check`` compares.
    * with ``nodes_online`` and ``node_distances`` (each node's ``distance`` line: one
      node_distance() per online node in id order, drivers/base/node.c
      node_read_distance()) the topology carries the SLIT of its nodes; without them, or
      when a node's line is missing, the kernel's default (10 local, 20 remote).

    Raises SlabtuneError naming the field for an impossible combination.
    """
    try:
        possible = snapshot.parse_cpulist(cpus_possible)
        present = snapshot.parse_cpulist(cpus_present)
        online = snapshot.parse_cpulist(cpus_online)
        mem_nodes = set(snapshot.parse_cpulist(nodes_with_memory))
        cpu_nodes = set(snapshot.parse_cpulist(nodes_with_cpu))
    except ValueError as err:
        raise SlabtuneError(f"topology: {err}") from None
    if not possible:
        raise SlabtuneError("topology: cpus_possible is empty")
    node_ids = sorted(mem_nodes | cpu_nodes | set(node_cpulists or ()))
    if not node_ids:
        node_ids = [0]
        mem_nodes = {0}
    present_set = set(present)
    if node_cpulists:
        counts = []
        assigned: set[int] = set()
        for n in node_ids:
            cpus = set(snapshot.parse_cpulist(node_cpulists.get(n, ""))) & present_set
            assigned |= cpus
            counts.append(len(cpus))
        rest = len(present_set - assigned)
        if rest:
            first = next((i for i, n in enumerate(node_ids) if counts[i] or n in cpu_nodes), 0)
            counts[first] += rest
    else:
        holders = [i for i, n in enumerate(node_ids) if n in cpu_nodes] or [
            i for i, n in enumerate(node_ids) if n in mem_nodes] or [0]
        base, extra = divmod(len(present), len(holders))
        counts = [0] * len(node_ids)
        for k, i in enumerate(holders):
            counts[i] = base + (1 if k < extra else 0)
    distances = _distance_rows(node_ids, nodes_online, node_distances)
    try:
        topo = Topology(
            possible=max(possible) + 1,
            present=len(present),
            online=len(online),
            node_cpus=tuple(counts),
            node_has_memory=tuple(n in mem_nodes for n in node_ids),
            distances=distances,
        )
    except TopologyError as err:
        raise SlabtuneError(f"topology: {err}") from None
    return topo, tuple(node_ids)


def _distance_rows(node_ids, nodes_online: str | None,
                   node_distances: dict[int, str] | None):
    """The SLIT rows of ``node_ids`` from the nodes' ``distance`` lines, whose columns are
    the online nodes in id order; None when a line is missing (the default distances)."""
    if not nodes_online or not node_distances:
        return None
    try:
        online = snapshot.parse_cpulist(nodes_online)
    except ValueError as err:
        raise SlabtuneError(f"nodes_online: {err}") from None
    col = {n: i for i, n in enumerate(online)}
    if any(n not in col or not node_distances.get(n) for n in node_ids):
        return None
    rows = []
    for n in node_ids:
        text = node_distances[n]
        try:
            vals = [int(v) for v in text.split()]
        except ValueError:
            raise SlabtuneError(f"node{n}/distance: {text[:60]!r} is not a list of "
                                "numbers") from None
        if len(vals) != len(online):
            raise SlabtuneError(f"node{n}/distance: {len(vals)} entries but "
                                f"{len(online)} online nodes ({nodes_online})")
        rows.append(tuple(vals[col[m]] for m in node_ids))
    return tuple(rows)


def read_host_topology(root: str | os.PathLike = "/") -> HostTopology:
    """Read ``/sys/devices/system/cpu/{possible,present,online}`` and the node states
    (``node/online``, ``has_memory``, ``has_cpu``, ``nodeN/cpulist``, ``nodeN/distance``)
    under ``root``.

    A kernel without CONFIG_NUMA has no ``node`` directory: it is one node 0 with memory
    holding every present CPU.
    """
    root = Path(root)
    cpu = root / "sys/devices/system/cpu"
    node = root / "sys/devices/system/node"
    possible = _read_text(cpu / "possible")
    present = _read_text(cpu / "present")
    online = _read_text(cpu / "online")
    if node.is_dir():
        nodes_online = _read_text(node / "online")
        with_memory = _read_text(node / "has_memory")
        with_cpu = _read_text(node / "has_cpu")
        cpulists: dict[int, str] = {}
        distances: dict[int, str] = {}
        for entry in sorted(node.iterdir()):
            name = entry.name
            if name.startswith("node") and name[4:].isdigit():
                cpulists[int(name[4:])] = _read_text(entry / "cpulist")
                if (entry / "distance").is_file():
                    distances[int(name[4:])] = _read_text(entry / "distance")
    else:
        nodes_online = with_memory = "0"
        with_cpu = "0" if present else ""
        cpulists = {0: present}
        distances = {}
    for field, text in (("cpus_possible", possible), ("cpus_present", present),
                        ("cpus_online", online), ("nodes_online", nodes_online),
                        ("nodes_with_memory", with_memory), ("nodes_with_cpu", with_cpu)):
        try:
            snapshot.parse_cpulist(text)
        except ValueError as err:
            raise SlabtuneError(f"{field}: {err}") from None
    topo, node_ids = topology_from_lists(possible, present, online, with_memory, with_cpu,
                                         cpulists, nodes_online, distances)
    return HostTopology(
        topology=topo,
        cpus_possible=possible,
        cpus_present=present,
        cpus_online=online,
        nodes_online=nodes_online,
        nodes_with_memory=with_memory,
        nodes_with_cpu=with_cpu,
        node_ids=node_ids,
        node_cpulists=tuple(cpulists.get(n, "") for n in node_ids),
        node_distances=tuple(distances.get(n, "") for n in node_ids),
    )


def _first_int(path: Path) -> int:
    """The first number of a slab sysfs file ("997 N0=997" -> 997)."""
    text = _read_text(path)
    token = text.split()[0] if text else ""
    try:
        return int(token)
    except ValueError:
        raise SlabtuneError(f"{path}: {text[:40]!r} is not a number") from None


def read_slab_caches(root: str | os.PathLike = "/") -> list[dict[str, object]]:
    """One dict per real cache directory of ``/sys/kernel/slab`` (symlinks are merged-cache
    aliases: counted in ``aliases``, not listed), sorted by name.

    A cache destroyed while it is being read is skipped.  ``sheaf_capacity`` is None where
    the kernel has no such file (before v6.18).
    """
    slab = Path(root) / "sys/kernel/slab"
    try:
        entries = sorted(os.listdir(slab))
    except OSError as err:
        raise SlabtuneError(f"{slab}: cannot list: {err.strerror or err}") from None
    aliases: dict[str, int] = {}
    dirs = []
    for name in entries:
        p = slab / name
        if p.is_symlink():
            target = os.path.basename(os.readlink(p))
            aliases[target] = aliases.get(target, 0) + 1
        elif p.is_dir():
            dirs.append(name)
    rows = []
    for name in dirs:
        p = slab / name
        if not p.is_dir():
            continue
        row: dict[str, object] = {"cache": name}
        try:
            for f in _CACHE_FILES:
                row[f] = _first_int(p / f)
            row["sheaf_capacity"] = _first_int(p / "sheaf_capacity") if (
                p / "sheaf_capacity").exists() else None
            for f in _EXTRA_FILES:
                row[f] = _first_int(p / f) if (p / f).exists() else None
        except SlabtuneError:
            if not p.is_dir():
                continue  # the cache went away under us
            raise
        row["aliases"] = aliases.get(name, 0)
        rows.append(row)
    if not rows:
        raise SlabtuneError(f"{slab}: no slab caches found")
    return rows


def take_snapshot(root: str | os.PathLike = "/") -> pl.DataFrame:
    """Snapshot the kernel under ``root``: one typed row per slab cache with the boot's
    release, command line and CPU/node lists (the :data:`SNAPSHOT_COLUMNS` contract, then
    :data:`EXTRA_COLUMNS`)."""
    root = Path(root)
    host = read_host_topology(root)
    boot = {
        "kernel_release": _read_text(root / "proc/sys/kernel/osrelease"),
        "cmdline": _read_text(root / "proc/cmdline"),
        "cpus_possible": host.cpus_possible,
        "cpus_present": host.cpus_present,
        "cpus_online": host.cpus_online,
        "nodes_with_memory": host.nodes_with_memory,
        "nodes_with_cpu": host.nodes_with_cpu,
    }
    rows = [{**boot, **cache} for cache in read_slab_caches(root)]
    return snapshot.validate_snapshot(snapshot.frame_from_rows(rows), f"{root / 'sys/kernel/slab'}")

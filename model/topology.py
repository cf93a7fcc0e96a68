"""Machine topologies: CPU counts, NUMA nodes, which nodes have memory and which have CPUs.

A :class:`Topology` is plain data (the model never reads files; reading the host's
``/sys/devices/system`` lives in :mod:`slabtune.kernel.host`).  It mirrors the kernel's
masks: ``cpu_possible_mask`` (nr_cpu_ids), ``cpu_present_mask``, ``cpu_online_mask``, and
the node states N_MEMORY and N_CPU.
"""

from __future__ import annotations

import dataclasses
import numbers

MAX_CPUS = 8192
MAX_NODES = 64


class TopologyError(ValueError):
    """An impossible topology; the message names the field."""


@dataclasses.dataclass(frozen=True)
class Topology:
    """CPUs and NUMA nodes of one machine.

    ``node_cpus[i]`` is the number of present CPUs on node ``i``; ``node_has_memory[i]``
    whether node ``i`` has memory (N_MEMORY).  A node with CPUs and no memory is a
    memoryless node: its CPUs' ``numa_mem_id()`` is the nearest node with memory.
    """

    possible: int
    present: int
    online: int
    node_cpus: tuple[int, ...]
    node_has_memory: tuple[bool, ...]

    def __post_init__(self):
        validate(self)

    @property
    def nodes(self) -> int:
        return len(self.node_cpus)

    @property
    def memoryless_nodes(self) -> tuple[int, ...]:
        return tuple(i for i, m in enumerate(self.node_has_memory) if not m)

    @property
    def memory_nodes(self) -> tuple[int, ...]:
        return tuple(i for i, m in enumerate(self.node_has_memory) if m)

    @property
    def cpu_nodes(self) -> tuple[int, ...]:
        return tuple(i for i, c in enumerate(self.node_cpus) if c > 0)

    @property
    def cpus_on_memoryless_nodes(self) -> int:
        return sum(c for c, m in zip(self.node_cpus, self.node_has_memory) if not m)

    @classmethod
    def uniform(cls, cpus: int, nodes: int = 1, memoryless_nodes=(), possible: int | None = None,
                online: int | None = None, node_cpus=None) -> Topology:
        """CPUs spread evenly over ``nodes`` (the first nodes get the remainder) unless
        ``node_cpus`` lists them; ``memoryless_nodes`` names nodes without memory."""
        for name, v in (("cpus", cpus), ("nodes", nodes), ("possible", possible),
                        ("online", online)):
            if v is not None and not _is_int(v):
                raise TopologyError(f"{name}: {v!r} is not an integer")
        if nodes < 1 or nodes > MAX_NODES:
            raise TopologyError(f"nodes: {nodes} is outside 1..{MAX_NODES}")
        if node_cpus is None:
            if cpus < 0:
                raise TopologyError(f"cpus: {cpus} is negative")
            base, extra = divmod(cpus, nodes)
            node_cpus = tuple(base + (1 if i < extra else 0) for i in range(nodes))
        node_cpus = tuple(_count("node_cpus", c) for c in node_cpus)
        if len(node_cpus) != nodes:
            raise TopologyError(f"node_cpus: lists {len(node_cpus)} nodes but nodes = {nodes}")
        if sum(node_cpus) != cpus:
            raise TopologyError(f"node_cpus: adds up to {sum(node_cpus)} CPUs but cpus = {cpus}")
        ml = set()
        for n in memoryless_nodes:
            if not _is_int(n) or n < 0 or n >= nodes:
                raise TopologyError(f"memoryless_nodes: node {n!r} does not exist "
                                    f"(nodes = {nodes})")
            if n in ml:
                raise TopologyError(f"memoryless_nodes: node {n} is listed twice")
            ml.add(n)
        has_mem = tuple(i not in ml for i in range(nodes))
        return cls(
            possible=cpus if possible is None else possible,
            present=cpus,
            online=cpus if online is None else online,
            node_cpus=node_cpus,
            node_has_memory=has_mem,
        )


def _is_int(v) -> bool:
    """An integer (numpy's included) that is not a bool."""
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def _count(field: str, v) -> int:
    """A CPU count given for a node: an integer (not a float that would be truncated)."""
    if not _is_int(v):
        raise TopologyError(f"{field}: {v!r} is not an integer CPU count")
    return int(v)


def empty_nodes(t: Topology) -> tuple[int, ...]:
    """Nodes with neither CPUs nor memory.  The kernel keeps such a node offline (it is in
    neither N_CPU nor N_MEMORY, so no kmem_cache_node, barn or CPU of a cache is on it), but
    the model counts every listed node (the barn count of profiles with barns on all nodes,
    the node count a workload spreads over), so a layout a user writes may not list one."""
    return tuple(i for i, (c, m) in enumerate(zip(t.node_cpus, t.node_has_memory))
                 if c == 0 and not m)


def check_no_empty_nodes(t: Topology) -> None:
    """Raise :class:`TopologyError` naming the first node with neither CPUs nor memory."""
    empty = empty_nodes(t)
    if empty:
        raise TopologyError(f"memoryless_nodes: node {empty[0]} would have neither CPUs nor "
                            "memory (a node the kernel keeps offline); give it CPUs "
                            "(node_cpus) or memory, or leave it out (fewer nodes)")


def validate(t: Topology) -> None:
    """Raise :class:`TopologyError` naming the first impossible field of ``t``."""
    if not 1 <= t.possible <= MAX_CPUS:
        raise TopologyError(f"possible: {t.possible} CPUs is outside 1..{MAX_CPUS}")
    if not 1 <= t.present <= t.possible:
        raise TopologyError(f"present: {t.present} CPUs must be in 1..possible ({t.possible})")
    if not 1 <= t.online <= t.present:
        raise TopologyError(f"online: {t.online} CPUs must be in 1..present ({t.present})")
    if not 1 <= len(t.node_cpus) <= MAX_NODES:
        raise TopologyError(f"nodes: {len(t.node_cpus)} is outside 1..{MAX_NODES}")
    if len(t.node_has_memory) != len(t.node_cpus):
        raise TopologyError("node_has_memory: length differs from node_cpus")
    if any(c < 0 for c in t.node_cpus):
        raise TopologyError(f"node_cpus: negative CPU count in {list(t.node_cpus)}")
    if sum(t.node_cpus) != t.present:
        raise TopologyError(
            f"node_cpus: adds up to {sum(t.node_cpus)} CPUs but present = {t.present}")
    if not any(t.node_has_memory):
        raise TopologyError("memoryless_nodes: every node is memoryless; at least one node "
                            "needs memory")

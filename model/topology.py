"""Machine topologies: CPU counts, NUMA nodes, which nodes have memory and which have CPUs.

A :class:`Topology` is plain data (the model never reads files; reading the host's
``/sys/devices/system`` lives in :mod:`slabtune.kernel.host`).  It mirrors the kernel's
masks: ``cpu_possible_mask`` (nr_cpu_ids), ``cpu_present_mask``, ``cpu_online_mask``, and
the node states N_MEMORY and N_CPU, and the firmware's node distances (ACPI SLIT) from which
the kernel orders each node's fallback list (:func:`numa_mem_ids`).
"""

from __future__ import annotations

import dataclasses
import numbers

MAX_CPUS = 8192
MAX_NODES = 64
#: node_distance() without a SLIT (include/linux/topology.h LOCAL_DISTANCE and
#: REMOTE_DISTANCE; x86's __node_distance() falls back to them when the firmware gives none).
LOCAL_DISTANCE = 10
REMOTE_DISTANCE = 20
#: Largest distance a SLIT entry may hold: entries are u8 and 255 means "unreachable".
MAX_DISTANCE = 254


class TopologyError(ValueError):
    """An impossible topology; the message names the field."""


@dataclasses.dataclass(frozen=True)
class Topology:
    """CPUs and NUMA nodes of one machine.

    ``node_cpus[i]`` is the number of present CPUs on node ``i``; ``node_has_memory[i]``
    whether node ``i`` has memory (N_MEMORY).  A node with CPUs and no memory is a
    memoryless node: its CPUs take their memory from the first node of its fallback list,
    the nearest node with memory by the kernel's rule (:func:`numa_mem_ids`).
    ``distances[i][j]`` is ``node_distance(i, j)`` as the firmware's SLIT gives it (the
    local node 10, others 11..254; the kernel does not require it to be symmetric); None
    means no SLIT: 10 local, 20 remote.
    """

    possible: int
    present: int
    online: int
    node_cpus: tuple[int, ...]
    node_has_memory: tuple[bool, ...]
    distances: tuple[tuple[int, ...], ...] | None = None

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

    def distance(self, a: int, b: int) -> int:
        """node_distance(a, b): the SLIT entry, or 10 local and 20 remote without one."""
        if self.distances is not None:
            return self.distances[a][b]
        return LOCAL_DISTANCE if a == b else REMOTE_DISTANCE

    @property
    def cpus_on_memoryless_nodes(self) -> int:
        return sum(c for c, m in zip(self.node_cpus, self.node_has_memory) if not m)

    @classmethod
    def uniform(cls, cpus: int, nodes: int = 1, memoryless_nodes=(), possible: int | None = None,
                online: int | None = None, node_cpus=None, distances=None) -> Topology:
        """CPUs spread evenly over ``nodes`` (the first nodes get the remainder) unless
        ``node_cpus`` lists them; ``memoryless_nodes`` names nodes without memory;
        ``distances`` is the SLIT (a ``nodes`` x ``nodes`` list of lists) or None."""
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
            distances=_distance_rows(distances),
        )


def _is_int(v) -> bool:
    """An integer (numpy's included) that is not a bool."""
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def _count(field: str, v) -> int:
    """A CPU count given for a node: an integer (not a float that would be truncated)."""
    if not _is_int(v):
        raise TopologyError(f"{field}: {v!r} is not an integer CPU count")
    return int(v)


def _distance_rows(d):
    """A SLIT as a tuple of tuples (hashable, like the other fields); None stays None.  The
    values are checked by :func:`validate`."""
    if d is None:
        return None
    if isinstance(d, (str, bytes)) or not hasattr(d, "__iter__"):
        raise TopologyError(f"distances: {d!r} is not a list of rows")
    rows = []
    for i, row in enumerate(d):
        if isinstance(row, (str, bytes)) or not hasattr(row, "__iter__"):
            raise TopologyError(f"distances: row {i} ({row!r}) is not a list")
        rows.append(tuple(row))
    return tuple(rows)


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
    if t.distances is not None:
        _validate_distances(t.distances, len(t.node_cpus))


def _validate_distances(d, n: int) -> None:
    """The checks the kernel makes of a SLIT before it uses one (x86 slit_valid() in
    drivers/acpi/numa/srat.c, numa_set_distance()): a square table over the nodes, the
    local distance 10 on the diagonal, every other entry above it and below 255
    (unreachable).  Asymmetric tables are accepted, as the kernel accepts them."""
    if not isinstance(d, tuple) or len(d) != n:
        raise TopologyError(f"distances: has {len(d)} rows but there are {n} nodes")
    for i, row in enumerate(d):
        if len(row) != n:
            raise TopologyError(f"distances: row {i} has {len(row)} entries but there are "
                                f"{n} nodes")
        for j, v in enumerate(row):
            if not _is_int(v):
                raise TopologyError(f"distances: [{i}][{j}] = {v!r} is not an integer")
            if i == j and v != LOCAL_DISTANCE:
                raise TopologyError(f"distances: [{i}][{i}] = {v} but a node's distance to "
                                    f"itself is {LOCAL_DISTANCE}")
            if i != j and not LOCAL_DISTANCE < v <= MAX_DISTANCE:
                raise TopologyError(f"distances: [{i}][{j}] = {v} is outside "
                                    f"{LOCAL_DISTANCE + 1}..{MAX_DISTANCE}")


#: PENALTY_FOR_NODE_WITH_CPUS (include/linux/topology.h): added to a candidate node's
#: distance when its cpumask is not empty.
PENALTY_FOR_NODE_WITH_CPUS = 1
#: MAX_NUMNODES of an x86-64 kernel with the default CONFIG_NODES_SHIFT=6 (the lab's
#: kernels); node_load only breaks ties between equal scaled distances below it.
MAX_NUMNODES = 1 << 6


def fallback_orders(t: Topology, *, cpus_in_node_masks: bool = False,
                    node_load: str = "accumulate",
                    max_numnodes: int = MAX_NUMNODES) -> tuple[tuple[int, ...], ...]:
    """Each node's fallback list of memory nodes, as build_zonelists() orders it at boot.

    mm/page_alloc.c of 6.1.192 and 7.2.13 (read there): __build_all_zonelists() clears
    ``node_load`` and builds the zonelists of every node in id order; build_zonelists()
    calls find_next_best_node() until no memory node is left.  That returns the node
    itself first if it has memory, else, over the memory nodes not yet listed, the one
    with the smallest ``(node_distance(node, n) + (n < node) + penalty) * MAX_NUMNODES +
    node_load[n]`` (ties to the lower id): the nearest, then one above ``node`` ("prefer
    the next node"), then a node without CPUs (penalty PENALTY_FOR_NODE_WITH_CPUS when
    cpumask_of_node(n) is not empty), then the less loaded.  Each time the distance
    changes from the previous pick (from the node itself for the first), build_zonelists()
    charges the pick: ``node_load[node] += 1`` in these versions (``node_load="accumulate"``);
    from 2.6.23 until the 2021 patch "mm/page_alloc: use accumulated load when building node
    fallback list" it assigned ``node_load[node] = load`` with ``load`` counting down from
    nr_online_nodes per pick (``node_load="assign"``).  So memoryless nodes at equal
    distance from several memory nodes are dealt out over them in turn.

    ``cpus_in_node_masks``: whether the CPU penalty sees the nodes' CPUs.  On x86 it does
    not at boot: start_kernel() builds the zonelists in mm_core_init() (7.2.13
    init/main.c:1039) before arch_cpu_finalize_init() identifies the boot CPU and its
    numa_add_cpu() fills the first cpumask (arch/x86/kernel/cpu/common.c identify_cpu()),
    and secondary CPUs come up later still; so the default is False.  A rebuild after boot
    (memory hotplug) sees them.
    """
    if node_load not in ("accumulate", "assign"):
        raise TopologyError(f"node_load: {node_load!r} is not accumulate or assign")
    n_nodes = t.nodes
    mem = t.memory_nodes
    load = [0] * n_nodes
    orders = []
    for local in range(n_nodes):
        used: set[int] = set()
        order: list[int] = []
        prev = local
        countdown = n_nodes
        while True:
            best = -1
            if local not in used and t.node_has_memory[local]:
                best = local
            else:
                best_val = None
                for n in mem:
                    if n in used:
                        continue
                    val = t.distance(local, n) + (1 if n < local else 0)
                    if cpus_in_node_masks and t.node_cpus[n] > 0:
                        val += PENALTY_FOR_NODE_WITH_CPUS
                    val = val * max_numnodes + load[n]
                    if best_val is None or val < best_val:
                        best_val, best = val, n
            if best < 0:
                break
            used.add(best)
            if t.distance(local, best) != t.distance(local, prev):
                if node_load == "accumulate":
                    load[best] += 1
                else:
                    load[best] = countdown
            order.append(best)
            prev = best
            countdown -= 1
        orders.append(tuple(order))
    return tuple(orders)


def numa_mem_ids(t: Topology, **rule) -> tuple[int, ...]:
    """The memory node each node's CPUs allocate from: the node itself if it has memory,
    else the head of its fallback list (:func:`fallback_orders`, whose keyword arguments
    ``rule`` takes).

    That head is local_memory_node(node) (mm/page_alloc.c, 7.2.13): the node of the first
    zone of the node's zonelist, which the kernel stores as numa_mem_id() of the node's CPUs
    where CONFIG_HAVE_MEMORYLESS_NODES is set (powerpc and ia64 in 6.1.192, powerpc alone
    in 7.2.13).  x86 has no such option and numa_mem_id() is the CPU's own node there
    (include/linux/topology.h), but SLUB's allocations for a memoryless node still land
    on the same node: new_slab() with NUMA_NO_NODE asks the page allocator, which walks
    that zonelist from its head, and get_any_partial() searches the nodes' partial lists
    in the same order.
    """
    orders = fallback_orders(t, **rule)
    return tuple(i if t.node_has_memory[i] else orders[i][0] for i in range(t.nodes))

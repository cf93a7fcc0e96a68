"""Workloads as data: who allocates, who frees, how many objects are live.

A workload is not code: it is a :class:`Workload` pytree of int32 arrays over the ``R``
representative CPUs ("reps") of :mod:`slabtune.model.dynamics`, plus a :class:`RepLayout`
saying which CPUs each rep stands for.  The four constructors build both from a
:class:`~slabtune.model.topology.Topology`:

* :func:`local`: each CPU allocates and frees its own objects (a live set per CPU, in
  bursts or randomly interleaved).
* :func:`producer_consumer`: hackbench-like groups; senders allocate, receivers free,
  on the same node or, with ``cross_node``, on another one.
* :func:`request_response`: netperf TCP_RR with ``threads`` on the machine; one CPU takes
  the network interrupt and frees most objects the application threads allocate (and
  allocates the receive buffers they free).
* :func:`block_io`: ublk/io_uring-like; submitting CPUs allocate, one completion CPU frees,
  possibly on another node, on machines where some nodes have no memory.

Probabilities are quantised to 1/65536 here (with NumPy, once), so that the JAX model and
the reference simulator compare the same integers against the same random bits.

Node classes
------------
The model keeps ``N`` node classes, each standing for one typical node of a kind:
class 0 is the first node with memory that has CPUs, class 1 any other node with memory
(a representative of ``node_weight[1]`` such nodes), class 2 a memoryless node with CPUs
whose memory node is class 0's, class 3 one whose memory node is in class 1 (each
representing ``node_weight[k]`` such nodes); class 3 is padding where there is none.

A CPU on a memoryless node gets its slabs from the head of its node's fallback list, the
node :func:`~slabtune.model.topology.numa_mem_ids` gives by the kernel's
build_zonelists() rule (nearest by the SLIT, then a node above it, then the less loaded,
so memoryless nodes at equal distance are dealt out over the memory nodes).  Its reps
take ``mem_node`` 0 or 1 by that node's class and node class 2 or 3 accordingly: a
memoryless node's barn (v7.1) then only ever holds objects of its own memory node, as in
the kernel, where each memoryless node has a barn of its own.  The CPUs a workload
spreads its reps over thus fall in the four :data:`GROUPS`.  Class 1 stands for
``node_weight[1]`` memory nodes: the ones with CPUs and the CPU-less ones some memoryless
node allocates from; its locks and slabs are shared evenly among them, which is exact
when they are alike (as many CPUs of their own and of memoryless nodes each, as on the
seed's 8-node machine, or the round-robin of equidistant nodes gives) and an average
otherwise.
"""

from __future__ import annotations

import inspect
from typing import NamedTuple

import numpy as np

from slabtune.model.topology import Topology, numa_mem_ids

#: Representative CPUs per configuration.
R = 8
#: Node classes per configuration (the last one is padding unless a memoryless node
#: allocates from a class-1 node, kept so that shapes stay (4,) for code built on them).
N = 4
#: Probabilities are integers out of this.
PROB_ONE = 1 << 16

NODE_MEM0, NODE_MEM_OTHER, NODE_MEMLESS, NODE_MEMLESS_OTHER = 0, 1, 2, 3
#: Class 3 when no memoryless node allocates from a class-1 node.
NODE_PAD = NODE_MEMLESS_OTHER
#: The memoryless classes.
MEMLESS_CLASSES = (NODE_MEMLESS, NODE_MEMLESS_OTHER)
#: The CPU groups a workload spreads its reps over, in order: (node class of the CPUs,
#: node class their slabs come from).  Memoryless CPUs split by their memory node.
GROUPS = ((NODE_MEM0, NODE_MEM0), (NODE_MEM_OTHER, NODE_MEM_OTHER),
          (NODE_MEMLESS, NODE_MEM0), (NODE_MEMLESS_OTHER, NODE_MEM_OTHER))
#: Class 0's own CPUs: the interrupt CPU of request_response, and unused (padding) reps.
_GROUP0 = GROUPS[0]


class WorkloadError(ValueError):
    """A workload parameter out of range; the message names the parameter."""


class Workload(NamedTuple):
    """Per-rep workload parameters (int32 arrays; a pytree, so it vmaps).

    ``alloc_p[r]``: probability (out of 65536) that an op of rep ``r`` is an allocation when
    it could both allocate and free (used when ``burst[r] == 0``).
    ``free_cum[r, j]``: cumulative probability (out of 65536) that an object rep ``r``
    allocates is freed by rep ``<= j``; the last column is 65536 for reps that allocate.
    ``live_target[r]``: at most this many objects allocated by ``r`` are outstanding.
    ``hold[r]``: rep ``r`` frees only while more than this many objects are pending to it
    (its own included), at most the excess in one run (:func:`hold_levels`; 0 frees
    whenever it can).
    ``burst[r]``: > 0 makes rep ``r`` alternate ``burst`` allocations and ``burst`` frees
    (each falling back to the other kind when impossible); 0 interleaves them at random.
    ``active[r]``: 1 if rep ``r`` stands for at least one CPU.
    ``phase_first[r]``: allocations in rep ``r``'s first burst phase
    (:func:`burst_phase_first`: a node's reps that burst their whole live set start
    apart).
    """

    alloc_p: np.ndarray
    free_cum: np.ndarray
    live_target: np.ndarray
    hold: np.ndarray
    burst: np.ndarray
    active: np.ndarray
    phase_first: np.ndarray


class RepLayout(NamedTuple):
    """Which CPUs each rep stands for (arrays; a pytree).

    ``weight[r]``: real CPUs rep ``r`` stands for (float; 0 for an unused rep).
    ``node[r]``: node class of rep ``r``'s CPU; ``mem_node[r]``: node class its slabs come
    from (its own for a memory node, the nearest memory node for a memoryless one).
    ``memoryless[r]``: 1 if its CPU sits on a node without memory.
    ``node_has_memory[n]``, ``node_weight[n]``: per node class, whether it has memory and
    how many real nodes it stands for.  ``home[r]``: which of its node class's nodes rep
    ``r``'s CPU sits on, and ``mem_home[r]``: which of its memory class's nodes its slabs
    come from (:func:`rep_homes`; both 0 where a class is one node).
    """

    weight: np.ndarray
    node: np.ndarray
    mem_node: np.ndarray
    memoryless: np.ndarray
    node_has_memory: np.ndarray
    node_weight: np.ndarray
    home: np.ndarray
    mem_home: np.ndarray


# --------------------------------------------------------------------------- helpers


def _prob(name: str, p: float) -> int:
    if not 0.0 <= float(p) <= 1.0:
        raise WorkloadError(f"{name}: {p} is not a probability in [0, 1]")
    return int(round(float(p) * PROB_ONE))


def _count(name: str, v, lo: int = 0, hi: int = 1 << 24) -> int:
    if isinstance(v, bool) or int(v) != v or not lo <= int(v) <= hi:
        raise WorkloadError(f"{name}: {v!r} is not an integer in {lo}..{hi}")
    return int(v)


def node_groups(topology: Topology) -> dict:
    """CPU counts and node counts per node class of ``topology``.

    Returns ``cpus[N]``, ``nodes[N]`` and ``has_memory[N]`` (lists), ``group_cpus`` (CPUs
    per group of :data:`GROUPS`, a dict), ``mem_class`` (per node, the class its CPUs'
    slabs come from), ``node_class`` (per node, its class), ``taking`` (the nodes that
    take part, in node order: those counted in ``nodes``) and ``mem_id`` (per node, its
    memory node, :func:`~slabtune.model.topology.numa_mem_ids`).
    """
    mem_with_cpu = [i for i in topology.memory_nodes if topology.node_cpus[i] > 0]
    first = mem_with_cpu[0] if mem_with_cpu else topology.memory_nodes[0]
    mem_id = numa_mem_ids(topology)
    serves = {mem_id[i] for i in topology.memoryless_nodes if topology.node_cpus[i] > 0}
    cpus = [0] * N
    nodes = [0] * N
    group_cpus = {g: 0 for g in GROUPS}
    mem_class, node_class, taking = [], [], []
    for i, c in enumerate(topology.node_cpus):
        m = NODE_MEM0 if mem_id[i] == first else NODE_MEM_OTHER
        k = m if topology.node_has_memory[i] else MEMLESS_CLASSES[m]
        mem_class.append(m)
        node_class.append(k)
        if k == NODE_MEM_OTHER and c == 0 and i not in serves:
            continue  # takes no part in a CPU-driven workload: no CPUs, no memoryless users
        if k in MEMLESS_CLASSES and c == 0:
            continue
        cpus[k] += c
        nodes[k] += 1
        group_cpus[(k, m)] += c
        taking.append(i)
    has_memory = [True, True, False, nodes[NODE_MEMLESS_OTHER] == 0]
    return dict(cpus=cpus, nodes=nodes, has_memory=has_memory, group_cpus=group_cpus,
                mem_class=mem_class, node_class=node_class, taking=taking, mem_id=mem_id)


def _layout(topology: Topology, slots: list[tuple[tuple[int, int], float]],
            roles=None) -> RepLayout:
    """Build a layout from ``slots``: one (group, weight) per rep (padded to R), the group
    a (node class, memory node class) pair of :data:`GROUPS`.  ``roles`` (one tag per
    slot, default all alike): reps of different roles are dealt over a class's nodes
    apart (:func:`rep_homes`), so that each node gets its senders and its receivers."""
    g = node_groups(topology)
    slots = list(slots) + [(_GROUP0, 0.0)] * (R - len(slots))
    node = np.array([s[0][0] for s in slots], np.int32)
    weight = np.array([s[1] for s in slots], np.float32)
    memless = np.isin(node, MEMLESS_CLASSES).astype(np.int32)
    mem_node = np.array([s[0][1] for s in slots], np.int32)
    roles = list(roles or []) + [0] * (R - len(roles or []))
    home, mem_home = rep_homes(topology, g, [(s[0], t) for s, t in zip(slots, roles)], weight)
    return RepLayout(
        weight=weight,
        node=node,
        mem_node=mem_node,
        memoryless=memless,
        node_has_memory=np.array(g["has_memory"], np.int32),
        node_weight=np.array([max(n, 0) for n in g["nodes"]], np.float32),
        home=home,
        mem_home=mem_home,
    )


def rep_homes(topology: Topology, g: dict, groups, weight) -> tuple[np.ndarray, np.ndarray]:
    """Per rep, which node of its class its CPU sits on (``home``: an index into the
    class's nodes in node order) and which node of its memory class its slabs come from
    (``mem_home``: an index into that class's memory nodes), for reps in ``groups`` (one
    (:data:`GROUPS` pair, role) each) and ``weight`` (0: unused) on ``topology``, whose
    :func:`node_groups` is ``g``.

    A class stands for several alike nodes (class 1: every memory node but the first),
    and a group's reps of one role are dealt out over the group's nodes with CPUs in
    node order: the j-th of n reps sits on node ``j * len(nodes) // n``, one node each
    where there are as many reps as nodes.  The kernel tells those nodes apart where the
    model's classes do not: 7.x slab_free() gives a CPU's sheaves only objects of its own
    node (``slab_nid(slab) == numa_mem_id()``), so a free between two nodes of class 1
    bypasses them like a free across classes.  A memoryless rep's slabs come from its
    node's memory node (:func:`~slabtune.model.topology.numa_mem_ids`).  With fewer reps
    than nodes a rep stands for several nodes and frees among its own CPUs count as one
    node's: an approximation."""
    by_class = {c: [i for i in g["taking"] if g["node_class"][i] == c] for c in range(N)}
    home = np.zeros(len(groups), np.int32)
    mem_home = np.zeros(len(groups), np.int32)
    for grp in dict.fromkeys(groups):
        reps = [r for r, gr in enumerate(groups) if gr == grp and weight[r] > 0]
        (k, m), _ = grp
        cpu_nodes = [i for i in by_class[k] if g["mem_class"][i] == m
                     and topology.node_cpus[i] > 0]
        if not reps or not cpu_nodes:
            continue
        for j, r in enumerate(reps):
            node = cpu_nodes[j * len(cpu_nodes) // len(reps)]
            home[r] = by_class[k].index(node)
            # a memory node a memoryless node with CPUs allocates from takes part
            mem_home[r] = by_class[m].index(g["mem_id"][node])
    return home, mem_home


def _spread(total_reps: int, groups: list[tuple]) -> list[tuple]:
    """Share ``total_reps`` reps among CPU groups ``(group, cpus)`` in proportion to
    their CPUs (each non-empty group gets at least one rep, never more reps than CPUs);
    each rep's weight is its group's CPUs over the group's reps."""
    groups = [(k, c) for k, c in groups if c > 0]
    if not groups:
        return []
    total_reps = max(total_reps, len(groups))
    alloc = [1] * len(groups)
    left = total_reps - len(groups)
    tot = sum(c for _, c in groups)
    # largest remainder, deterministic
    want = [total_reps * c / tot for _, c in groups]
    while left > 0:
        i = max(range(len(groups)), key=lambda i: (want[i] - alloc[i], -i))
        alloc[i] += 1
        left -= 1
    out = []
    for (k, c), a in zip(groups, alloc):
        a = min(a, c)
        out += [(k, c / a)] * a
    return out


def _free_cum(rows: list[list[float]]) -> np.ndarray:
    """Quantise row-stochastic free_to rows to cumulative int32 thresholds out of 65536."""
    out = np.zeros((R, R), np.int32)
    for r, row in enumerate(rows):
        row = list(row) + [0.0] * (R - len(row))
        s = sum(row)
        if s <= 0:
            continue
        acc = 0.0
        for j in range(R):
            acc += row[j] / s
            out[r, j] = int(round(acc * PROB_ONE))
        out[r, R - 1] = PROB_ONE
        # columns after the last positive entry stay at 65536
        last = max(j for j in range(R) if row[j] > 0)
        out[r, last:] = PROB_ONE
    return out


def free_shares(free_cum) -> np.ndarray:
    """``share[o][r]``, (R, R) int64 out of 65536: the fraction of rep ``o``'s objects rep
    ``r`` frees, the steps of ``free_cum``'s row ``o`` (no kernel function: the
    workload's who-frees-what)."""
    fc = np.asarray(free_cum, np.int64)
    share = np.diff(np.concatenate([np.zeros((fc.shape[0], 1), np.int64), fc], axis=1), axis=1)
    return np.maximum(share, 0)


#: Fraction bits of :func:`lag_weights`' multipliers (a lag is kept in 1/16ths of an
#: allocation), the largest multiplier (shares below 1/4096 count as 1/4096) and the
#: objects in flight a lag counts at most: their product stays below 2**31.
LAG_BITS = 4
LAG_MUL_MAX = 1 << 16
LAG_PEND_MAX = 1 << 14


def lag_weights(free_cum) -> tuple[np.ndarray, int]:
    """Multipliers that turn the objects a sender has in flight to each of its freers into
    how far behind its allocations each freer is, and the number of freers they reach.

    No kernel function: the workload's order of frees, which decides how long a slab
    stays partly used.  A sender ``o`` hands a share ``p[o][r]`` of its objects to freer
    ``r``, which frees them oldest first; with ``pend[o][r]`` of them waiting, ``r`` is
    ``pend[o][r] / p[o][r]`` of ``o``'s allocations behind.  A slab ``o`` filled holds
    objects of every freer: it becomes partial when the least behind frees into it and
    empties when the most behind has passed it, so ``o`` keeps about ``(max lag - min
    lag) / objs`` slabs partly used at any time (the kernel's per-CPU partial slabs that
    are still in use when their list drains; docs/LAB.md, "Order-0 producer/consumer").
    Returns ``mul`` (R, R) int32, ``round(2**LAG_BITS / p[o][r])`` (at most
    :data:`LAG_MUL_MAX`) where ``o`` hands objects to at least two freers and ``p[o][r] >
    0``, else 0 (a sender with one freer has no spread), and how many reps are such a
    freer (columns of ``mul`` with an entry above 0).  The engines' use:
    :func:`slabtune.model.dynamics.pc_window`."""
    share = free_shares(free_cum)
    many = (share > 0).sum(axis=1) >= 2
    mul = np.zeros(share.shape, np.int64)
    for o in np.flatnonzero(many):
        for r in np.flatnonzero(share[o] > 0):
            # round(2**LAG_BITS * PROB_ONE / share) in integers
            mul[o, r] = min((2 * (PROB_ONE << LAG_BITS) + share[o, r]) // (2 * share[o, r]),
                            LAG_MUL_MAX)
    freers = int(np.count_nonzero(mul.any(axis=0)))
    return mul.astype(np.int32), freers


def list_nodes(weight, mem_node, mem_home) -> np.ndarray:
    """Per node class (N,) int32: how many real nodes' partial lists the class's one list
    sums, the nodes of the class its active reps' slabs come from (``mem_home``), at
    least 1.

    No kernel function: the model's units.  The kernel's min_partial tests are per node
    (``n->nr_partial >= s->min_partial`` in __slab_free(), the per-CPU partial drain's
    keep, get_any_partial()'s ``n->nr_partial > s->min_partial``), and the engines compare
    a class's list with ``min_partial`` times this
    (:func:`slabtune.model.dynamics.node_min_partial`).  A node's list grows by the drains
    and frees of the CPUs that free its objects and shrinks by its own CPUs' takes; a rep
    standing for w CPUs feeds and takes from it at 1/w of their rate, both sides alike,
    so its length is the real list's and it stays one node's list: lab
    ``pc-16cpu-2node-order0`` (16 CPUs of 2 nodes, 8 reps of 2 CPUs) measured 7.93 new
    slabs per kop on 6.1, predicted 8.85 so, 11.4 with min_partial scaled by the reps'
    share of a node's CPUs.  Where the reps of a class sit on several of its nodes
    (:func:`rep_homes`) the class's list holds the slabs of all of them, the sum of that
    many lists, and one node's min_partial discarded empty slabs that each of the shorter
    real lists keeps: ``pc-8cpu-4node-order0`` measured 8.55, predicted 4.9 with the sum,
    19.1 without (docs/LAB.md)."""
    w = np.asarray(weight)
    mem = np.asarray(mem_node)
    home = np.asarray(mem_home)
    out = np.ones(N, np.int32)
    for n in range(N):
        on = (w > 0) & (mem == n)
        out[n] = max(len(set(home[on].tolist())), 1)
    return out


def burst_phase_first(burst, live, active, node) -> np.ndarray:
    """Allocations in each rep's first burst phase: the j-th of the ``n`` active reps of a
    node class whose bursts fill and empty their live set (``burst`` = ``live``) starts
    with ``burst - burst * j // n``, so it runs ``burst * j // n`` ops ahead of the first:
    two CPUs a quarter of their ``2 * burst``-op cycle apart, more spread over half of it.

    CPUs that burst on their own do not keep in step: their phases drift apart.  Started
    together, the model's reps would allocate together and free together for ever, and a
    node's barn would never pass the full sheaves one CPU frees to another that allocates
    (7.2 barn_get_full() in __pcs_replace_empty_main()).  The real allocator does: 7.2 in
    UML, two CPUs bursting 1024 objects, takes 0.029 full sheaves from the barn per
    alloc+free pair, nearly one per sheaf, and a fifth of one CPU's slab refills.  A
    quarter cycle is how far apart two independent phases are on average (the shorter arc
    between two uniform points of a circle).  After its first cycle such a rep runs the
    first rep's cycle shifted by that many ops, with the same live set.

    Reps whose live target is not their burst start together: a short first burst would
    leave them holding that many more objects for good (the first free phase runs out of
    objects and falls back to allocations), which the real CPUs do not (6.1-slab in the
    lab, two CPUs bursting 32 of 64 objects free-running: 28 KiB measured, 36 KiB
    predicted with the two apart).  Shifting those would need a wait before the first op,
    as long as a burst: longer than many runs."""
    burst = np.asarray(burst, np.int32)
    out = burst.copy()
    spread = (np.asarray(active) > 0) & (burst > 0) & (burst == np.asarray(live))
    node = np.asarray(node)
    for c in np.unique(node[spread]):
        reps = np.flatnonzero(spread & (node == c))
        for j, r in enumerate(reps):
            out[r] = burst[r] - int(burst[r]) * j // len(reps)
    return out


#: The ``drain`` parameter of every constructor: ``"hold"`` keeps the declared live set
#: (:func:`hold_levels`), ``"eager"`` frees as soon as it can (the declared value a cap).
DRAINS = ("hold", "eager")
#: Workload parameters that are strings (a config passes them as they are).
TEXT_PARAMS = ("drain",)


def _drain(drain) -> str:
    if drain not in DRAINS:
        raise WorkloadError(f"drain: {drain!r} is not one of {', '.join(DRAINS)}")
    return drain


def hold_levels(live, burst, free_cum) -> tuple[np.ndarray, np.ndarray]:
    """The allocation cap and the free floor per rep that make a workload keep its
    declared occupancy: ``(live_target, hold)``, (R,) int32 each.

    No kernel function: the workload, whose live set is a property of the program, like
    hackbench's socket queues (messages a sender has written and its receiver not yet
    read), a block device's queue depth, or a cache's working set.  For an allocating rep
    ``o`` (``live[o] > 0``: local and request_response ``live``, request_response's
    interrupt CPU its scaled live, producer_consumer and block_io ``depth``) of declared
    occupancy ``L``: with bursts of ``B > 0`` it keeps between ``L - B//2`` and ``L + (B -
    B//2)`` (a burst cycles the live set between the two), otherwise within a band of
    half-width ``h = max(1, L // 32)``: ``live_target[o] = L + h`` caps its allocations.
    A freer ``r`` frees only while the objects pending to it exceed ``hold[r] =
    round(sum_o share[o][r] * (L_o - h_o))`` (``L - B//2`` with bursts), ``share[o][r]``
    the fraction of ``o``'s objects ``r`` frees (the steps of ``free_cum``'s row ``o``, out
    of 65536; rounded half up in integers), and a free run frees at most the excess.  So
    the senders' objects in flight sit in ``[L - h, L + h]`` on average (a local rep
    frees its own: its floor is its own ``L - h``; the rule bounds the senders' sum, and
    one sender's count wanders about it as a free's origin is drawn by what is pending):
    receivers consume at the rate that keeps the queues full.  A free takes the oldest
    object of its origin, so an object lives about ``L`` of its sender's ops: lifetimes
    are long, not free-next-step; this is the only lifetime model (``drain = "eager"`` is
    the old free-when-possible one)."""
    live = np.asarray(live, np.int64)
    burst = np.asarray(burst, np.int64)
    alloc = live > 0
    h = np.maximum(1, live // 32)
    below = np.where(burst > 0, burst // 2, h)
    above = np.where(burst > 0, burst - burst // 2, h)
    cap = np.where(alloc, live + above, 0)
    floor = np.where(alloc, live - below, 0)
    hold = ((free_shares(free_cum) * floor[:, None]).sum(axis=0) + PROB_ONE // 2) // PROB_ONE
    return cap.astype(np.int32), hold.astype(np.int32)


def _workload(alloc_p, rows, live, burst, layout: RepLayout, drain: str) -> Workload:
    active = (layout.weight > 0).astype(np.int32)
    pad = R - len(alloc_p)
    burst = np.array(list(burst) + [0] * pad, np.int32)
    live = np.array(list(live) + [0] * pad, np.int32) * active
    free_cum = _free_cum(list(rows) + [[]] * pad) * active[:, None]
    if drain == "hold":
        cap, hold = hold_levels(live, burst, free_cum)
    else:
        cap, hold = live, np.zeros(R, np.int32)
    return Workload(
        alloc_p=np.array(list(alloc_p) + [0] * pad, np.int32) * active,
        free_cum=free_cum,
        live_target=cap,
        hold=hold,
        burst=burst,
        active=active,
        phase_first=burst_phase_first(burst, live, active, layout.node),
    )


# --------------------------------------------------------------------------- constructors


def local(topology: Topology, live: int = 32, burst: int = 0, alloc_prob: float = 0.5,
          drain: str = "hold"):
    """Per-CPU churn: every CPU allocates and frees its own objects.

    ``live``: objects each CPU keeps allocated (``drain = "hold"``, :func:`hold_levels`;
    with ``"eager"`` at most this many); ``burst``: allocate this many then free this many
    (0: interleave at random with ``alloc_prob``; at most ``2 * live`` when holding).  Reps
    are spread over the CPUs of every node class in proportion to their CPU counts.
    """
    live = _count("live", live, 1)
    burst = _count("burst", burst, 0)
    ap = _prob("alloc_prob", alloc_prob)
    drain = _drain(drain)
    if drain == "hold" and burst > 2 * live:
        raise WorkloadError(f"burst: {burst} is more than twice live ({live}): a burst "
                            "cycles the live set between live - burst/2 and live + burst/2")
    g = node_groups(topology)
    slots = _spread(R, list(g["group_cpus"].items()))
    lay = _layout(topology, slots)
    n = len(slots)
    rows = [[1.0 if j == r else 0.0 for j in range(R)] for r in range(n)]
    return _workload([ap] * n, rows, [live] * n, [burst] * n, lay, drain), lay


def producer_consumer(topology: Topology, depth: int = 64, cross_node: float = 0.0,
                      drain: str = "hold"):
    """hackbench-like message passing: senders allocate, receivers free.

    Reps 0..3 are senders, 4..7 receivers (half the CPUs each, over every node class).
    ``depth``: messages a sender keeps in flight (``drain = "hold"``: receivers consume at
    the rate that keeps its queues full, :func:`hold_levels`; ``"eager"``: at most this
    many, receivers free as soon as they can); ``cross_node``: fraction of messages
    received on another node than the sender's (when the machine has one), spread over
    the receiving CPUs of every other node alike, as the lab module does (a node is a
    class and a home, :func:`rep_homes`; per rep in proportion to the CPUs it stands
    for).  The rest go to the receivers of the sender's own node.  Spread over node
    classes instead, class 1's senders on 16 CPUs of 4 nodes had sent all their
    cross-node messages to class 0's receivers, which then freed two objects a step and
    throttled every sender at its depth: half the kernel's rate (lab pc-16cpu-4node,
    6.1: 4,900-5,100 allocations per sender against 9,860-10,000 measured).
    """
    depth = _count("depth", depth, 1)
    cross = _prob("cross_node", cross_node) / PROB_ONE
    drain = _drain(drain)
    g = node_groups(topology)
    groups = list(g["group_cpus"].items())
    if sum(c for _, c in groups) < 2:
        raise WorkloadError("producer_consumer: needs at least 2 CPUs")
    half = [(k, c / 2.0) for k, c in groups]
    send = _spread(R // 2, [(k, max(int(c), 1) if c > 0 else 0) for k, c in half])
    recv = _spread(R // 2, [(k, max(int(c), 1) if c > 0 else 0) for k, c in half])
    # exact weights: each side stands for half the CPUs of its group
    def reweight(side):
        cnt = {}
        for k, _ in side:
            cnt[k] = cnt.get(k, 0) + 1
        return [(k, g["group_cpus"][k] / 2.0 / cnt[k]) for k, _ in side]
    send, recv = reweight(send), reweight(recv)
    send += [(_GROUP0, 0.0)] * (R // 2 - len(send))
    slots = send + recv
    lay = _layout(topology, slots, roles=[0] * len(send) + [1] * len(recv))
    rows = []
    recv_reps = [R // 2 + i for i, (_, w) in enumerate(recv) if w > 0]
    for s in range(R // 2):
        # a node is a (node class, home) pair: the other nodes of a sender's own class
        # are other nodes too (rep_homes)
        at = (int(lay.node[s]), int(lay.home[s]))
        same = [j for j in recv_reps if (int(lay.node[j]), int(lay.home[j])) == at]
        other = [j for j in recv_reps if j not in same]
        row = [0.0] * R
        if not same:
            same, other = other, []
        c = cross if other else 0.0
        for grp, share in ((same, 1.0 - c), (other, c)):
            tot = sum(float(lay.weight[j]) for j in grp)
            for j in grp:
                row[j] += share * float(lay.weight[j]) / tot
        rows.append(row)
    rows += [[0.0] * R for _ in range(len(recv))]
    ap = [PROB_ONE] * (R // 2) + [0] * len(recv)
    live = [depth] * (R // 2) + [0] * len(recv)
    return _workload(ap, rows, live, [0] * len(slots), lay, drain), lay


def request_response(topology: Topology, threads: int = 16, irq_free: float = 0.9,
                     live: int = 16, irq_self_free: float = 0.0, drain: str = "hold"):
    """netperf TCP_RR with ``threads`` threads: rep 0 is the CPU taking the network
    interrupt (on node class 0); reps 1..7 the CPUs running threads (min(threads, CPUs-1)
    of them, over every node class).  ``irq_free``: fraction of the objects the threads
    allocate (transmit buffers) that the interrupt CPU frees; it allocates the receive
    buffers, which the threads free.  ``live``: objects in flight per thread CPU (the
    interrupt CPU: ``live`` times the threads per thread rep), kept (``drain = "hold"``,
    :func:`hold_levels`) or at most (``"eager"``).
    ``irq_self_free``: fraction of the interrupt CPU's own allocations it frees itself
    (buffers consumed in the interrupt, often while still in its CPU slab).
    """
    threads = _count("threads", threads, 1)
    live = _count("live", live, 1)
    f = _prob("irq_free", irq_free) / PROB_ONE
    own = _prob("irq_self_free", irq_self_free) / PROB_ONE
    drain = _drain(drain)
    g = node_groups(topology)
    total = sum(g["cpus"])
    app = min(threads, max(total - 1, 1))
    groups = []
    left = app
    for k in GROUPS:
        c = g["group_cpus"][k] - (1 if k == _GROUP0 and total > 1 else 0)
        share = min(c, left)
        groups.append((k, share))
        left -= share
    if total == 1:
        groups = [(_GROUP0, 1)]
    slots = [(_GROUP0, 1.0)] + _spread(R - 1, groups)
    lay = _layout(topology, slots, roles=[0] + [1] * (len(slots) - 1))
    n = len(slots)
    rows = [[own] + [(1.0 - own) / (n - 1)] * (n - 1)] if n > 1 else [[1.0]]
    for r in range(1, n):
        row = [0.0] * R
        row[0] += f
        row[r] += 1.0 - f
        rows.append(row)
    ap = [PROB_ONE // 2] * n
    lv = [live * max(app // max(n - 1, 1), 1)] + [live] * (n - 1)
    return _workload(ap, rows, lv, [0] * n, lay, drain), lay


def block_io(topology: Topology, depth: int = 32, completion_remote: bool = False,
             completions: int = 1, drain: str = "hold"):
    """ublk/io_uring-like block I/O: submitting CPUs allocate a request object, completion
    CPUs free them.  ``completions``: completion CPUs (1: rep 0 alone, the others submit;
    more: up to R/2 reps stand for them, each submitter spreading its requests evenly over
    them).  With ``completion_remote`` the completion CPUs sit on another node class than
    the first memory node (a memoryless node if the machine has one, else another memory
    node): the first CPUs of that class in node order, as the lab module places them, which
    on memoryless nodes may take their slabs from either memory class.  On a machine of
    three or more memory nodes and no memoryless CPU they stay on the first memory node
    (when they fit there): class 1 then stands for several nodes, and a completion CPU in
    it would count every class-1 node's objects as its own (local: into its sheaves from
    v6.18), where the kernel sends those of the other nodes to their slabs; class 0 is one
    node, whose submitters' objects alone are local, and with nodes alike a completion
    CPU on the first node is as remote from the other nodes' submitters as one on the
    second (lab bio-16cpu-4node on 7.2: 20% of frees fast measured, 70.6% predicted with
    the completion in class 1).  ``depth``: requests in flight per submitting CPU,
    kept (``drain = "hold"``: the completions reap at the rate that keeps the queue
    full, :func:`hold_levels`) or at most (``"eager"``).
    """
    depth = _count("depth", depth, 1)
    completions = _count("completions", completions, 1)
    drain = _drain(drain)
    g = node_groups(topology)
    comp: tuple[int, ...] = (NODE_MEM0,)
    memless_cpus = sum(g["cpus"][k] for k in MEMLESS_CLASSES)
    if completion_remote:
        if memless_cpus > 0:
            comp = MEMLESS_CLASSES
        elif g["cpus"][NODE_MEM_OTHER] > 0 and (g["nodes"][NODE_MEM_OTHER] == 1
                                                or completions >= g["cpus"][NODE_MEM0]):
            comp = (NODE_MEM_OTHER,)
    pool = sum(g["cpus"][k] for k in comp)
    if sum(g["cpus"]) < 2:
        raise WorkloadError("block_io: needs at least 2 CPUs")
    if completions > pool or sum(g["cpus"]) - completions < 1:
        raise WorkloadError(f"completions: {completions} leaves no submitting CPU or exceeds "
                            f"the {pool} CPUs of the completion node class")
    # the completion CPUs are the first ones of their kind in node order (as the lab's
    # module places them), which on memoryless nodes may span both memoryless classes
    taken = dict.fromkeys(GROUPS, 0)
    left = completions
    for i, c in enumerate(topology.node_cpus):
        k, m = g["node_class"][i], g["mem_class"][i]
        take = min(c, left) if k in comp else 0
        taken[(k, m)] += take
        left -= take
    cpus = {k: c - taken[k] for k, c in g["group_cpus"].items()}
    comp_slots = _spread(R // 2 if completions > 1 else 1,
                         [(k, c) for k, c in taken.items() if c > 0])
    nc = len(comp_slots)
    slots = comp_slots + _spread(R - nc, list(cpus.items()))
    lay = _layout(topology, slots, roles=[0] * nc + [1] * (len(slots) - nc))
    n = len(slots)
    rows = [[0.0] * R for _ in range(nc)]
    # each submitter spreads its requests evenly over the completion CPUs
    w = [s[1] for s in comp_slots]
    share = [1.0 / nc] * nc if len(set(w)) == 1 else [x / sum(w) for x in w]
    rows += [share + [0.0] * (R - nc) for _ in range(nc, n)]
    ap = [0] * nc + [PROB_ONE] * (n - nc)
    lv = [0] * nc + [depth] * (n - nc)
    return _workload(ap, rows, lv, [0] * n, lay, drain), lay


BUILDERS = {
    "local": local,
    "producer_consumer": producer_consumer,
    "request_response": request_response,
    "block_io": block_io,
}


def spec_params(kind: str) -> tuple[str, ...]:
    """Parameter names (besides the topology) of the constructor of workload ``kind``."""
    if kind not in BUILDERS:
        raise WorkloadError(f"kind: {kind!r} is not one of {', '.join(BUILDERS)}")
    sig = inspect.signature(BUILDERS[kind])
    return tuple(p for p in sig.parameters if p != "topology")


def build(kind: str, topology: Topology, **params):
    """Build ``(Workload, RepLayout)`` of ``kind`` on ``topology``; unknown parameters raise
    :class:`WorkloadError` naming them."""
    allowed = spec_params(kind)
    for k in params:
        if k not in allowed:
            raise WorkloadError(f"{k}: not a parameter of workload {kind!r} "
                                f"(known: {', '.join(allowed)})")
    return BUILDERS[kind](topology, **params)

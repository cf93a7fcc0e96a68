"""The physical range of every cost constant: an order-of-magnitude prior value for a 2020s
server core and the interval a physical value lies in, the orderings a physical table keeps
(fast paths no dearer than slow ones, remote lines dearer than local ones), and what makes a
table unphysical.  ``slabtune reproduce`` judges every cost table against these; the cost fit
moves constants only inside them.
"""


from __future__ import annotations

import math
from typing import NamedTuple

from slabtune.model import cost


class Prior(NamedTuple):
    """A constant's order-of-magnitude value and the range a physical value lies in."""

    value: float
    lo: float
    hi: float
    why: str


#: Prior value and physical range of every cost constant (ns unless stated), for a 2020s
#: server core.  Ranges are physical bounds (what the operation must cost at least and
#: can cost at most on such a core); each text names where its range comes from (a
#: published microbenchmark, a kernel measurement, the kernel structure it counts).
#: Sources named below: [B15] Jesper Dangaard Brouer's SLUB bulk-API commits of 2015
#: (fbd02630c6e3 "slub: initial bulk free implementation": fast path alloc+free 43 cycles,
#: 10.8 ns, and local_irq_save/restore 37 cycles, 9.4 ns, on an i7-4790K at 4 GHz);
#: [MLC] Intel Memory Latency Checker, L2-to-L2 modified intervention 40-42 ns on one
#: socket of a Xeon E5-2660 v4 (John McCalpin, Intel developer forum, "Core-to-Core
#: Communication Latency in Skylake/Kaby Lake"); [UML] the real 7.2 allocator timed in
#: User Mode Linux (calibrate/data/uml-7.2-2026-11-24*.csv, docs/LAB.md).  A range is
#: never widened to take a fitted value: a fit that wants more sits at the edge and says so
#: (``slabtune calibrate fit``).
PRIOR: dict[str, Prior] = {
    "alloc_fast_ns": Prior(8.0, 5.0, 30.0, "this_cpu_cmpxchg_double or a sheaf pop under "
                           "local_trylock, with the alloc hooks: from half the 10.8 ns "
                           "alloc+free pair of [B15] to twice the 15.7 ns call of [UML]"),
    "free_fast_ns": Prior(8.0, 5.0, 30.0, "lockless free to the CPU's own slab or sheaf, with "
                          "the free hooks: from half the 10.8 ns pair of [B15] to twice "
                          "the 15.4 ns call of [UML]"),
    "alloc_slow_ns": Prior(80.0, 50.0, 150.0, "___slab_alloc outside the lock"),
    "free_slow_ns": Prior(80.0, 50.0, 150.0, "__slab_free cmpxchg on a foreign slab"),
    "sheaf_swap_ns": Prior(10.0, 5.0, 200.0, "a sheaf exchange with the barn outside its "
                           "lock: a few pointer swaps when hot (5 ns) up to two misses to "
                           "memory, the sheaf's header and the CPU's slub_percpu_sheaves "
                           "(local DRAM, 70-100 ns idle latency as Intel MLC reports it on "
                           "2020s Xeons); the barn lock section is priced apart, and what "
                           "UML adds to it is the rig's (RIG_PRIOR)"),
    "sheaf_object_ns": Prior(2.0, 1.0, 100.0, "one object moved between a sheaf and a slab: "
                             "a pointer copy when the object's line is cached (1 ns), up to "
                             "a miss to memory on its free pointer (local DRAM, 70-100 ns idle "
                             "latency as Intel MLC reports it on 2020s Xeons)"),
    "cpu_partial_drain_ns": Prior(40.0, 20.0, 100.0, "unfreezing a CPU's partial slabs"),
    "list_lock_hold_ns": Prior(50.0, 20.0, 150.0, "spin_lock_irqsave/unlock_irqrestore "
                               "(about 20 ns uncontended: the 9.4 ns irq save/restore of "
                               "[B15] and an uncontended atomic) around a few dozen "
                               "instructions of list work on lines already moved (priced "
                               "apart, list_lock_lines x line)"),
    "barn_lock_hold_ns": Prior(40.0, 20.0, 150.0, "a list_del/list_add under the barn lock"),
    "line_local_ns": Prior(40.0, 30.0, 60.0, "cache-line transfer within a node: [MLC] "
                           "40-42 ns for a modified line between two cores of one socket"),
    "line_remote_ns": Prior(150.0, 100.0, 300.0, "cache-line transfer across nodes"),
    "pcp_call_ns": Prior(100.0, 50.0, 200.0, "per-CPU page list hit"),
    "buddy_call_ns": Prior(400.0, 200.0, 1000.0, "buddy allocator call"),
    "zone_lock_hold_ns": Prior(50.0, 20.0, 150.0, "zone->lock hold per block taken or "
                               "returned (__rmqueue_smallest, __free_one_page with its "
                               "buddy merging) on lines already moved (they are priced "
                               "apart, zone_block_lines x line); a pcp refill or drain "
                               "moves pcp_batch blocks in one hold"),
    "pcp_batch": Prior(31.0, 31.0, 31.0, "pages per pcp refill (count, not ns)"),
    "page_setup_ns": Prior(40.0, 20.0, 100.0, "struct page/folio setup per 4 KiB page"),
    "object_setup_ns": Prior(3.0, 1.0, 100.0, "writing the free pointer of each object "
                             "of a new slab (allocate_slab's freelist): a store to a cached "
                             "line (1 ns), up to a miss to memory per object of a cold slab "
                             "(local DRAM, 70-100 ns idle latency as Intel MLC reports it "
                             "on 2020s Xeons)"),
    "array_object_ns": Prior(2.0, 1.0, 10.0, "SLAB: one object pointer moved between "
                             "array caches or to and from a slab: a pointer copy (1 ns) up "
                             "to a slab's index bookkeeping; SLAB's bulk alloc+free through "
                             "its arrays cost 3.3-4.1 ns per object in batches of 16-250 "
                             "(e6cdb58d1c83 'slab: implement bulk free in SLAB allocator', "
                             "i7-4790K at 4 GHz)"),
    "queueing": Prior(1.0, 1.0, 1.0, "closed-queue waits on (a flag, not a time)"),
    "list_lock_lines": Prior(cost.OPTIONAL_DEFAULTS["list_lock_lines"], 2.0, 4.0,
                             "lines per list_lock section (count): kmem_cache_node's first "
                             "line (list_lock, nr_partial and the partial head share it), "
                             "the slab's freelist/counters/slab_list, and on a list_del the "
                             "two neighbours' slab_list links"),
    "barn_lock_lines": Prior(cost.OPTIONAL_DEFAULTS["barn_lock_lines"], 2.0, 4.0,
                             "lines per barn lock section (count): struct node_barn (lock, "
                             "both sheaf lists, nr_full/nr_empty: 44 bytes, one line), the "
                             "sheaf's barn_list, a neighbour's link"),
    "zone_lock_lines": Prior(cost.OPTIONAL_DEFAULTS["zone_lock_lines"], 3.0, 6.0,
                             "lines per zone->lock section (count): the padded lock line, "
                             "free_area[order] list head and nr_free, the zone's "
                             "free-page counters"),
    "zone_block_lines": Prior(cost.OPTIONAL_DEFAULTS["zone_block_lines"], 2.0, 8.0,
                              "lines per block taken or returned under zone->lock (count): "
                              "6.1 and 7.2 __free_one_page() reads each buddy it tries, "
                              "unlinks each free one with its two list neighbours and links "
                              "the merged block; __rmqueue_smallest() unlinks a block and "
                              "its successor, expand() links each half split off; one merge "
                              "or split per block on average: 6 lines freed, 4 taken (2 "
                              "with none, 8 with two)"),
}
#: The calibration rig's constants (:data:`slabtune.calibrate.umlfit.RIG`): what User Mode
#: Linux adds to an operation beyond the table's price.  Fitted with the table's constants
#: to the same UML timings, never part of a cost table, never applied to a hardware
#: prediction.
RIG_PRIOR: dict[str, Prior] = {
    "uml_section_ns": Prior(0.0, 0.0, 600.0, "UML's overhead per lock section taken with "
                            "interrupts off (list_lock, barn lock, zone->lock): 0, as on "
                            "hardware (UML masks interrupts by storing a thread-local "
                            "flag, arch/um/os-Linux/signal.c), up to what one whole barn "
                            "exchange with its one barn lock section costs over local "
                            "churn in [UML], bursts of 256: 513 ns per exchange on the "
                            "allocation side, 580 ns on the free side"),
}
#: Remote cache-line transfers cost at least this many local ones.
REMOTE_OVER_LOCAL = 2.0


def prior_values() -> dict[str, float]:
    """Every constant at its prior value."""
    return {k: p.value for k, p in PRIOR.items()}


def constraint_violations(values: dict[str, float], free) -> list[tuple[str, float]]:
    """Physical orderings a cost table breaks, each with its size in log units.

    A lockless fast path costs no more than the slow path of the same operation
    (``this_cpu_cmpxchg`` against a cmpxchg on a foreign slab or ``___slab_alloc``); a
    cross-node line transfer costs at least :data:`REMOTE_OVER_LOCAL` local ones; a free
    constant lies within its :data:`PRIOR` range.
    """
    out = []
    for fast, slow in (("alloc_fast_ns", "alloc_slow_ns"), ("free_fast_ns", "free_slow_ns")):
        if values[fast] > values[slow]:
            out.append((f"{fast} {values[fast]:g} > {slow} {values[slow]:g}",
                        math.log(values[fast] / values[slow])))
    need = REMOTE_OVER_LOCAL * values["line_local_ns"]
    if values["line_remote_ns"] < need:
        out.append((f"line_remote_ns {values['line_remote_ns']:g} < {REMOTE_OVER_LOCAL:g} x "
                    f"line_local_ns {values['line_local_ns']:g}",
                    math.log(need / values["line_remote_ns"])))
    for name in free:
        p, v = PRIOR[name], values[name]
        if not p.lo <= v <= p.hi:
            out.append((f"{name} {v:g} outside {p.lo:g}-{p.hi:g}",
                        abs(math.log(v / (p.lo if v < p.lo else p.hi)))))
    return out


def implausible(values: dict[str, float]) -> list[str]:
    """What makes a cost table unphysical: broken orderings and constants outside their
    :data:`PRIOR` range (constants with a fixed prior, such as ``pcp_batch``, are not
    judged)."""
    ranged = tuple(k for k, p in PRIOR.items() if p.lo < p.hi)
    return [what for what, _ in constraint_violations(values, ranged)]

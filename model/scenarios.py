"""The four seed scenarios as data: published figures and the configurations that model them.

Each scenario is a set of *arms* (one configuration each, written as the same tables a
``slabtune simulate`` CONFIG.toml has, plus an optional ``profile_patch`` that stands for a
kernel patch the seed discusses) and a list of *rows* comparing two arms on one metric.

A row's ``metric`` is one of the model's outputs: ``time`` and ``iops`` are workload
throughput figures (``time`` proportional to 1 / throughput, ``iops`` proportional to
throughput) scaled by the scenario's one fitted constant (see ``scale``); the others are
unscaled fractions in percent.  ``published`` and ``published_base`` are the figures the
seed gives for the row's arm and its baseline arm (None where the seed gives a direction
only: then ``expect`` states it).  The ratio compared is value(arm) / value(base).

Topologies and workload parameters that the seeds do not state are assumptions, written
next to them; they are the same for every arm of a scenario.

Each scenario also states its ``work``: the CPU time per allocator operation spent outside
the modelled cache (``other_ns`` of the workload), derived from the seed's own published
rate where it gives one (:func:`cpu_ns_per_op`, :func:`work_outside_allocator_ns`), else
0 with the reason.  It is not fitted and not chosen from the ratios.  The arms run with it
by default (:data:`DEFAULT_WORK`): real hackbench and fio spend most of their CPU outside
the modelled cache, and with that work the one fitted scale of a scenario comes out at the
seed's own count (hackbench: k = 101.6 against its 102.4 M messages), where without it the
modelled machine runs about 43x faster than the published one.  ``slabtune reproduce
--work none`` still runs the arms at allocator speed (docs/MODEL.md, "reproduce with the
packaged table").
"""

from __future__ import annotations

from typing import Any

#: Object stride of the caches these scenarios use comes from model/caches.py.

#: How the arms' ``other_ns`` is set: ``none`` runs every arm with 0 (the allocator is
#: all the machine does), ``derived`` with the scenario's ``work["other_ns"]``.
WORK_MODES: tuple[str, ...] = ("none", "derived")
#: The work mode ``slabtune reproduce`` and :mod:`slabtune.calibrate.reproduce` use unless
#: told otherwise: the physical one, each arm with its seed-derived work per op.
DEFAULT_WORK = "derived"


def cpu_ns_per_op(cpus: float, seconds: float, units: float, ops_per_unit: float) -> float:
    """CPU ns per allocator operation when ``cpus`` CPUs, all busy for ``seconds``, do
    ``units`` of work (hackbench messages, I/Os), each with ``ops_per_unit`` allocations
    and frees of the modelled cache.  An upper bound: idle CPU time would lower it."""
    return cpus * seconds * 1e9 / (units * ops_per_unit)


def work_outside_allocator_ns(cpu_ns: float, allocator_ns: float) -> float:
    """What is left of ``cpu_ns`` per operation after the allocator's own cost."""
    return max(cpu_ns - allocator_ns, 0.0)


def no_work(why: str) -> dict[str, Any]:
    """The ``work`` of a scenario whose seed gives no rate to derive it from."""
    return {"other_ns": 0.0, "derivation": f"0: {why}"}

# --------------------------------------------------------------------------- 2021


def _hackbench(profile: str, cpus: int, nodes: int) -> dict[str, Any]:
    """hackbench -g 16 -l 16000 (process mode, sockets): senders allocate skb data
    (100-byte messages: a kmalloc-512 head, the cache Mel Gorman names) and receivers on
    other CPUs free it."""
    return {
        "topology": {"cpus": cpus, "nodes": nodes},
        "cache": {"name": "kmalloc-512"},
        "policy": {"profile": profile},
        "workload": {"kind": "producer_consumer", "drain": "eager"},
        "run": {"steps": 3000, "seed": 1},
    }


#: hackbench -g 16 -l 16000 (the seed): every group has 20 senders and 20 receivers
#: (hackbench's fixed group size) and each sender writes ``loops`` 100-byte messages to
#: each receiver of its group.
HACKBENCH_GROUPS, HACKBENCH_FDS, HACKBENCH_LOOPS = 16, 20, 16000
HACKBENCH_MESSAGES = HACKBENCH_GROUPS * HACKBENCH_FDS * HACKBENCH_FDS * HACKBENCH_LOOPS
#: Allocator ops per message in the modelled cache: one kmalloc-512 skb data alloc by the
#: sender and its free by the receiver (skbuff_head_cache is not modelled).
HACKBENCH_OPS_PER_MESSAGE = 2
#: Allocator ns per op of the v5.10@224 arm under slabtune.model.priors.PRIOR with the
#: derived work (model output, rounded; 3% of the CPU time per op).
HACKBENCH_ALLOCATOR_NS = 45.0
_HB_CPU_NS = cpu_ns_per_op(224, 3.173, HACKBENCH_MESSAGES, HACKBENCH_OPS_PER_MESSAGE)

SLUB_ORDER_2021 = {
    "name": "slub-order-nr-cpus-2021",
    "title": "hackbench, v5.11 num_online_cpus() rule against v5.10 (kmalloc caches made "
             "before SMP bring-up get order-0 slabs)",
    "assumptions": "224-CPU arm64 server modelled as 2 nodes x 112 CPUs (ThunderX2-like); "
                   "8-CPU system as 1 node; hackbench as producer_consumer on kmalloc-512",
    "scale": {"metric": "time", "fit_to": ("v5.10@224", 3.173),
              "unit": "s", "what": "seconds per hackbench run = k / machine throughput"},
    "work": {
        "other_ns": round(work_outside_allocator_ns(_HB_CPU_NS, HACKBENCH_ALLOCATOR_NS), 1),
        "derivation": f"224 CPUs x 3.173 s (v5.10) / {HACKBENCH_MESSAGES:,} messages "
                      f"(16 groups x 20 senders x 20 receivers x 16000 loops) / "
                      f"{HACKBENCH_OPS_PER_MESSAGE} ops (kmalloc-512 alloc + free) = "
                      f"{_HB_CPU_NS:.0f} ns of CPU per op, less {HACKBENCH_ALLOCATOR_NS:.0f} "
                      "ns allocator cost; every CPU assumed busy; the 8-CPU arms use the "
                      "same work per op"},
    "arms": {
        "v5.10@224": _hackbench("v5.10", 224, 2),
        "v5.11@224": _hackbench("v5.11", 224, 2),
        "v5.10@8": _hackbench("v5.10", 8, 1),
        "v5.11@8": _hackbench("v5.11", 8, 1),
    },
    "rows": [
        {"metric": "time", "arm": "v5.11@224", "base": "v5.10@224",
         "published": 9.135, "published_base": 3.173, "headline": True,
         "label": "hackbench time, 224 CPUs, v5.11 vs v5.10"},
        {"metric": "time", "arm": "v5.11@8", "base": "v5.10@8",
         "published": None, "published_base": None, "headline": False,
         "expect": "slower, but far less than on 224 CPUs",
         "expect_ratio_between": (1.0, "v5.11@224/v5.10@224"),
         "label": "hackbench time, 8 CPUs, v5.11 vs v5.10"},
    ],
}

# --------------------------------------------------------------------------- 2011


#: Objects of one cache a netperf TCP_RR thread has in flight (one transaction).
NETPERF_LIVE_PER_THREAD = 8
#: Which CPU frees what (Rientjes in the seed): kmalloc-256 and kmalloc-4k objects are
#: allocated by the threads and freed on the interrupt CPU, kmalloc-1k objects mostly
#: freed where they were allocated (the interrupt CPU's share of its frees is the slow
#: path).  Fraction of the threads' objects freed by the interrupt CPU:
NETPERF_IRQ_FREE = {"kmalloc-256": 0.95, "kmalloc-1k": 0.25, "kmalloc-4k": 0.95}
#: CPUs running netperf threads (all but the interrupt CPU of the 16).
_NETPERF_APP_CPUS = 15


def _netperf(cache: str, threads: int) -> dict[str, Any]:
    """netperf TCP_RR client, ``threads`` threads on a 16-core 4-node machine (v3.1, no
    per-CPU partial lists); the network interrupt lands on one CPU.  More threads than CPUs
    means more transactions, hence more objects, in flight per CPU."""
    per_cpu = -(-threads // _NETPERF_APP_CPUS)
    return {
        "topology": {"cpus": 16, "nodes": 4},
        "cache": {"name": cache},
        "policy": {"profile": "v3.1"},
        "workload": {"kind": "request_response", "threads": threads, "drain": "eager",
                     "irq_free": NETPERF_IRQ_FREE[cache],
                     "live": NETPERF_LIVE_PER_THREAD * per_cpu},
        "run": {"steps": 12000, "seed": 2},
    }


_NETPERF_PUBLISHED = {
    # cache: (alloc fast % at 16, at 160, free fast % at 16, at 160)
    "kmalloc-256": (91.1, 62.8, 4.5, 0.1),
    "kmalloc-1k": (99.1, 98.3, 76.5, 66.6),
    "kmalloc-4k": (54.4, 31.7, 1.4, 0.1),
}

SLUB_NETPERF_2011 = {
    "name": "slub-lockless-slowpaths-netperf-2011",
    "title": "netperf TCP_RR fast-path percentages, 160 against 16 threads (v3.1)",
    "assumptions": "client machine: 16 CPUs on 4 nodes; request_response with the network "
                   "interrupt on one CPU; percentages are unscaled",
    "scale": None,
    "work": no_work("the seed gives allocation counts but no transaction rate, and "
                    "fast-path percentages do not depend on time"),
    "arms": {f"{c}@{t}": _netperf(c, t) for c in _NETPERF_PUBLISHED for t in (16, 160)},
    "rows": [
        row
        for cache, (a16, a160, f16, f160) in _NETPERF_PUBLISHED.items()
        for row in (
            {"metric": "alloc_fastpath_pct", "arm": f"{cache}@160", "base": f"{cache}@16",
             "published": a160, "published_base": a16, "headline": False,
             "label": f"{cache} alloc fast path %, 160 vs 16 threads"},
            {"metric": "free_fastpath_pct", "arm": f"{cache}@160", "base": f"{cache}@16",
             "published": f160, "published_base": f16, "headline": False,
             "label": f"{cache} free fast path %, 160 vs 16 threads"},
        )
    ],
}

# --------------------------------------------------------------------------- 2026

#: The capacity patch of the thread: base capacities 4/12/26/60 -> 6/24/52/120.
DOUBLED_SHEAF_BASE = (6, 24, 52, 120)


def _block_io(profile: str, **patch) -> dict[str, Any]:
    """Random-read block I/O (ublk/io_uring): a bio allocated on the submitting CPU and
    freed on another CPU that completes it; most CPUs sit on nodes without memory.

    Modelled with the producer_consumer workload (half the CPUs of every node submit, the
    other half complete), not with block_io, whose single completion CPU would make one
    CPU's free path the pace of the whole machine."""
    arm = {
        "topology": {"cpus": 128, "nodes": 8, "memoryless_nodes": [1, 2, 3, 5, 6, 7]},
        "cache": {"name": "bio-248"},
        "policy": {"profile": profile},
        "workload": {"kind": "producer_consumer", "drain": "eager"},
        "run": {"steps": 3000, "seed": 3},
    }
    if patch:
        arm["profile_patch"] = patch
    return arm


#: Allocator ops per I/O in the modelled cache: one bio alloc on the submitting CPU and
#: its free on the completing CPU (bio-248 only; no other cache of the I/O path is
#: modelled).
BLOCK_IO_OPS_PER_IO = 2
#: Allocator ns per op of the v6.19 arm under slabtune.model.priors.PRIOR (model output,
#: rounded; 5% of the CPU time per op).
BLOCK_IO_ALLOCATOR_NS = 100.0
_BIO_CPU_NS = cpu_ns_per_op(128, 1.0, 34.0e6, BLOCK_IO_OPS_PER_IO)

SHEAVES_2026 = {
    "name": "sheaves-cross-cpu-regression-2026",
    "title": "block I/O IOPS on a machine with memoryless nodes: v6.19 per-CPU partial "
             "lists, v7.0 sheaves, barns on memoryless nodes, doubled sheaf capacity",
    "assumptions": "AMD Zen4 layout not given in the thread: modelled as 128 CPUs on 8 "
                   "nodes of which only nodes 0 and 4 have memory; bio-248 cache; "
                   "submitters allocate, completing CPUs on the same node class free "
                   "(producer_consumer); v6.19 uses the v6.18 profile (bio caches do not "
                   "opt in to sheaves); the capacity patch doubles the base capacities",
    "scale": {"metric": "iops", "fit_to": ("v6.19", 34.0), "unit": "M IOPS",
              "what": "IOPS = k x machine throughput"},
    "work": {
        "other_ns": round(work_outside_allocator_ns(_BIO_CPU_NS, BLOCK_IO_ALLOCATOR_NS), 1),
        "derivation": f"128 modelled CPUs / 34M IOPS (v6.19) / {BLOCK_IO_OPS_PER_IO} ops "
                      f"(bio-248 alloc + free per I/O) = {_BIO_CPU_NS:.0f} ns of CPU per "
                      f"op, less {BLOCK_IO_ALLOCATOR_NS:.0f} ns allocator cost; every CPU "
                      "assumed busy"},
    "arms": {
        "v6.19": _block_io("v6.18"),
        "v7.0": _block_io("v7.0"),
        "v7.0+barns": _block_io("v7.1"),
        "v7.0+barns+2xcap": _block_io("v7.1", sheaf_base_capacity=DOUBLED_SHEAF_BASE),
    },
    "rows": [
        {"metric": "iops", "arm": "v7.0", "base": "v6.19", "published": 13.0,
         "published_base": 34.0, "headline": False, "label": "IOPS, v7.0 vs v6.19"},
        {"metric": "iops", "arm": "v7.0+barns", "base": "v7.0", "published": 25.0,
         "published_base": 13.0, "headline": True,
         "label": "IOPS, barns on memoryless nodes vs v7.0"},
        {"metric": "iops", "arm": "v7.0+barns+2xcap", "base": "v7.0+barns", "published": 29.0,
         "published_base": 24.0, "headline": True,
         "label": "IOPS, doubled sheaf capacity vs barns on memoryless nodes"},
    ],
}

# --------------------------------------------------------------------------- 2008

#: The patch: min_partial = ilog2(size) clamped to [MIN_PARTIAL, MAX_PARTIAL] = [5, 10].
DYNAMIC_MIN_PARTIAL = {"min_partial_divisor": 1, "min_partial_lo": 5, "min_partial_hi": 10}


def _netio(**patch) -> dict[str, Any]:
    """fio's netio example on a 2-way machine: network buffers close to a page in size
    (kmalloc-4k), allocated and freed in bursts on both CPUs."""
    arm = {
        "topology": {"cpus": 2, "nodes": 1},
        "cache": {"name": "kmalloc-4k"},
        "policy": {"profile": "v2.6.27"},
        "workload": {"kind": "local", "drain": "eager"},
        "run": {"steps": 3000, "seed": 4},
    }
    if patch:
        arm["profile_patch"] = patch
    return arm


SLUB_MIN_PARTIAL_2008 = {
    "name": "slub-dynamic-min-partial-2008",
    "title": "fio netio sys time, static MIN_PARTIAL (5) against per-cache "
             "min_partial = clamp(ilog2(size), 5, 10)",
    "assumptions": "2 CPUs, 1 node; kmalloc-4k with local churn (the local workload's "
                   "defaults: up to 32 live objects per CPU, allocations and frees "
                   "interleaved at random)",
    "scale": {"metric": "sys_time", "fit_to": ("static", 8.89), "unit": "s sys",
              "what": "sys seconds = k x allocator ns per op"},
    "work": no_work("the seed gives times but no count of allocations, and its row "
                    "compares allocator time (sys), not throughput"),
    "arms": {
        "static": _netio(),
        "dynamic": _netio(**DYNAMIC_MIN_PARTIAL),
    },
    "rows": [
        {"metric": "sys_time", "arm": "dynamic", "base": "static", "published": 7.73,
         "published_base": 8.89, "headline": False,
         "label": "netio sys time (avg of 50), dynamic vs static min_partial"},
    ],
}

# --------------------------------------------------------------------------- SLAB
#
# The seeds' SLAB figures (issue 14 item 3).  SLAB arms run model/slab_dynamics.py; every
# arm's allocator is its profile's (``slab-*`` profiles are SLAB).  SLUB arms repeat the
# SLUB scenarios' configurations, so these scenarios leave the SLUB rows above unchanged.


def _slab(arm: dict[str, Any], profile: str, **params) -> dict[str, Any]:
    """``arm`` under the SLAB profile ``profile`` (SLUB's profile patch and params
    dropped), with SLAB knobs ``params``."""
    policy: dict[str, Any] = {"profile": profile}
    if params:
        policy["params"] = params
    return {**{k: v for k, v in arm.items() if k != "profile_patch"}, "policy": policy}


SLAB_NETIO_2008 = {
    "name": "slab-netio-2008",
    "title": "fio netio, SLAB against SLUB with static MIN_PARTIAL (real and sys time)",
    "assumptions": "the 2008 scenario's machine and workload (2 CPUs, 1 node, kmalloc-4k "
                   "local churn); SLAB as slab-v2.6.33, the oldest SLAB profile (2.6.27's "
                   "mm/slab.c has the same array, shared and free_limit rules on one node); "
                   "SLUB with dynamic min_partial (23.00 s real, 7.73 s sys) is within 0.5% "
                   "of SLAB (22.98 s, 7.70 s), which reproduce counts as no change, so it "
                   "is not a row",
    "scale": {"metric": "time", "fit_to": ("SLUB static", 23.46), "unit": "s real",
              "what": "real seconds = k / machine throughput"},
    "work": no_work("the seed gives times but no count of allocations"),
    "arms": {
        "SLAB": _slab(_netio(), "slab-v2.6.33"),
        "SLUB static": _netio(),
        "SLUB dynamic": _netio(**DYNAMIC_MIN_PARTIAL),
    },
    "rows": [
        {"metric": "time", "arm": "SLAB", "base": "SLUB static", "published": 22.98,
         "published_base": 23.46, "headline": False,
         "label": "netio real time (avg of 50), SLAB vs SLUB static min_partial"},
        {"metric": "sys_time", "arm": "SLUB static", "base": "SLAB", "published": 8.89,
         "published_base": 7.70, "headline": False,
         "label": "netio sys time (avg of 50), SLUB static min_partial vs SLAB"},
    ],
}


SLAB_NETPERF_2011 = {
    "name": "slab-netperf-2011",
    "title": "netperf TCP_RR at 160 threads: 'SLUB can never compete with SLAB' in the slow "
             "paths (v3.1, SLAB against SLUB per cache)",
    "assumptions": "the 2011 scenario's client machine and workload (the seed's 'two "
                   "16-core, 4 node systems', the network interrupt on one CPU); SLAB as "
                   "slab-v3.1; the seed gives SLUB_STATS only, so the rows are directions: "
                   "SLAB's allocator time per op below SLUB's at 160 threads",
    "scale": None,
    "work": no_work("the seed gives allocation counts but no transaction rate"),
    "arms": {
        **{f"SLAB {c}@{t}": _slab(_netperf(c, t), "slab-v3.1")
           for c in _NETPERF_PUBLISHED for t in (16, 160)},
        **{f"SLUB {c}@{t}": _netperf(c, t) for c in _NETPERF_PUBLISHED for t in (16, 160)},
    },
    "rows": [
        {"metric": "sys_time", "arm": f"SLAB {c}@{t}", "base": f"SLUB {c}@{t}",
         "published": None, "published_base": None, "headline": False,
         "expect": "SLAB faster (allocator ns per op lower)", "expect_direction": -1,
         "label": f"{c} allocator time per op, {t} threads, SLAB vs SLUB"}
        for c in _NETPERF_PUBLISHED for t in (160,)
    ],
}


#: The 2010 fix's machine: every CPU on a node without memory, memory on node 0 alone
#: (ia64/powerpc layouts where numa_mem_id() differs from numa_node_id()).
MEMORYLESS_2010_TOPOLOGY = {"cpus": 64, "nodes": 5, "node_cpus": [0, 16, 16, 16, 16],
                            "memoryless_nodes": [1, 2, 3, 4]}


def memoryless_penalty_topologies() -> list[dict[str, Any]]:
    """[topology] tables with more and more CPUs on memoryless nodes: 4 nodes of 8 CPUs
    with 0, 1, 2, 3 of them memoryless, then 4 memoryless nodes of 8 CPUs beside a
    CPU-less memory node (0, 8, 16, 24, 32 CPUs on memoryless nodes)."""
    out = [{"cpus": 32, "nodes": 4, "memoryless_nodes": list(range(4 - k, 4))}
           for k in range(4)]
    out.append({"cpus": 32, "nodes": 5, "node_cpus": [0, 8, 8, 8, 8],
                "memoryless_nodes": [1, 2, 3, 4]})
    return out


def slab_memoryless_arm(topology: dict[str, Any], fix: bool,
                        profile: str = "slab-v2.6.33") -> dict[str, Any]:
    """A SLAB arm of the 2010 numa_mem_id() case on ``topology`` (a [topology] table):
    local churn on kmalloc-256, with (``fix``) or without the fix ("numa: slab: use
    numa_mem_id() for slab local memory node", v2.6.35)."""
    return {
        "topology": dict(topology),
        "cache": {"name": "kmalloc-256"},
        "policy": {"profile": profile, "params": {"memoryless_fallback": fix}},
        "workload": {"kind": "local", "live": 40, "drain": "eager"},
        "run": {"steps": 3000, "seed": 5},
    }


SLAB_MEMORYLESS_2010 = {
    "name": "slab-memoryless-numa-mem-id-2010",
    "title": "SLAB on a machine whose CPUs all sit on memoryless nodes, without and with "
             "numa_mem_id() (v2.6.35)",
    "assumptions": "64 CPUs on 4 memoryless nodes, memory on node 0 alone; kmalloc-256 "
                   "local churn; slab-v2.6.33 with memoryless_fallback false (numa_node_id()"
                   ", the array never holds an object) and true (the fix); the patch gives "
                   "no figures, so the rows are directions",
    "scale": None,
    "work": no_work("the patch gives no figures"),
    "arms": {
        "no fix": slab_memoryless_arm(MEMORYLESS_2010_TOPOLOGY, False),
        "fix": slab_memoryless_arm(MEMORYLESS_2010_TOPOLOGY, True),
    },
    "rows": [
        {"metric": "sys_time", "arm": "no fix", "base": "fix", "published": None,
         "published_base": None, "headline": False,
         "expect": "slower without the fix", "expect_direction": 1,
         "label": "allocator time per op, SLAB without vs with numa_mem_id()"},
        {"metric": "alloc_fastpath_pct", "arm": "no fix", "base": "fix", "published": None,
         "published_base": None, "headline": False,
         "expect": "no array hit without the fix", "expect_direction": -1,
         "label": "alloc array hit %, SLAB without vs with numa_mem_id()"},
    ],
}

SCENARIOS: tuple[dict[str, Any], ...] = (
    SLUB_ORDER_2021, SLUB_NETPERF_2011, SHEAVES_2026, SLUB_MIN_PARTIAL_2008,
    SLAB_NETIO_2008, SLAB_NETPERF_2011, SLAB_MEMORYLESS_2010)

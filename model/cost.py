"""The cost model: nanoseconds per allocator operation from simulated counters.

Every constant is named in :class:`CostParams`, documented in :data:`DOCS`, and has its
default in ``cost_default.toml`` beside this module (read by the caller, not here: the model
never reads files; :func:`parse_cost_toml` takes the text).  The functions are pure
``jax.numpy`` on float32 arrays, so a sweep can ``vmap`` them over configurations and over
cost constants alike.

What a representative CPU ``r`` pays per operation (one alloc or one free)::

    t_r = other_r                                   # the workload's own work per op
        + fast/slow path base costs  * their rates per op
        + page allocator calls       * (pcp or buddy cost + per-page and per-object setup)
        + sum_l A[r, l] * (hold_l + k_l * f_{r,l} * line_{r,l} + W_l)   # lock acquisitions

``A[r, l]`` is rep ``r``'s acquisitions per op of lock class ``l`` (a node's list_lock, a
node's barn lock, a zone lock), ``line_{r,l}`` the transfer of one cache line to the
acquiring CPU (local or cross-node), ``k_l`` the lines a critical section of that lock
moves from the previous holder (``list_lock_lines``, ``barn_lock_lines``,
``zone_lock_lines``: the lock word and the list heads, counters and links the section
writes, and for a zone lock ``zone_block_lines`` more per block it moves, see
:data:`DOCS` and :func:`lock_line_counts`), ``f_{r,l}`` the probability that the previous holder was
another CPU (:func:`foreign_holder_fraction`; a CPU retaking its own lock finds the lines
in its cache), ``W_l`` the queueing wait.  Each lock is a queue of a closed
network (the machine-repairman model): a CPU spinning on a lock does nothing else, so a lock
never has more waiters than the CPUs that take it, and the service of an acquisition is
``hold_l + k_l * f_{r,l} * line_{r,l}`` (a CPU across the interconnect holds the lock longer for
everyone).  The waits are mean-value analysis (:func:`mva_waits`); the machine's pace is
the one root of a decreasing function (:func:`solve`).  Near saturation the busiest lock
serves one acquisition per mean service time and the machine slows to what it serves:
which is how one node's list_lock caps a whole machine.
"""

from __future__ import annotations

import math
import tomllib
from typing import NamedTuple

import jax.numpy as jnp
from jax import lax

_F32 = jnp.float32


class CostParams(NamedTuple):
    """Cost constants in ns (a pytree of float32 scalars; stack them to sweep costs)."""

    alloc_fast_ns: jnp.ndarray
    free_fast_ns: jnp.ndarray
    alloc_slow_ns: jnp.ndarray
    free_slow_ns: jnp.ndarray
    sheaf_swap_ns: jnp.ndarray
    sheaf_object_ns: jnp.ndarray
    cpu_partial_drain_ns: jnp.ndarray
    list_lock_hold_ns: jnp.ndarray
    barn_lock_hold_ns: jnp.ndarray
    line_local_ns: jnp.ndarray
    line_remote_ns: jnp.ndarray
    pcp_call_ns: jnp.ndarray
    buddy_call_ns: jnp.ndarray
    zone_lock_hold_ns: jnp.ndarray
    pcp_batch: jnp.ndarray
    page_setup_ns: jnp.ndarray
    object_setup_ns: jnp.ndarray
    queueing: jnp.ndarray
    list_lock_lines: jnp.ndarray
    barn_lock_lines: jnp.ndarray
    zone_lock_lines: jnp.ndarray
    zone_block_lines: jnp.ndarray
    array_object_ns: jnp.ndarray


#: One line per constant: what it stands for in the kernel.
DOCS: dict[str, str] = {
    "alloc_fast_ns": "allocation served by the per-CPU slab freelist or main sheaf "
                     "(this_cpu_cmpxchg, no lock)",
    "free_fast_ns": "free to the CPU's own slab or main sheaf (no lock)",
    "alloc_slow_ns": "___slab_alloc bookkeeping outside any lock: taking a slab's freelist, "
                     "switching the CPU slab, sheaf swap checks",
    "free_slow_ns": "__slab_free outside any lock: cmpxchg on a foreign slab's freelist",
    "sheaf_swap_ns": "exchanging a sheaf with the spare or the barn (pointer swaps)",
    "sheaf_object_ns": "moving one object between a sheaf and its slab in a refill or flush, "
                       "outside the list_lock (7.x refill_objects pops the slabs it took "
                       "off the list after dropping the lock; __kmem_cache_free_bulk)",
    "cpu_partial_drain_ns": "__put_partials outside the lock: unfreezing a CPU's partial slabs",
    "list_lock_hold_ns": "time a node's list_lock is held per acquisition (irqsave spinlock "
                         "around partial-list manipulation)",
    "barn_lock_hold_ns": "time a barn's lock is held per sheaf get/put",
    "line_local_ns": "moving a contended lock's cache line between CPUs of one node",
    "line_remote_ns": "moving a cache line across nodes (a lock or slab freelist owned by "
                      "another node); also charged to each remote free",
    "pcp_call_ns": "page allocator call served by the per-CPU page lists (orders the era "
                   "caches per CPU: 0 before v5.13, up to PAGE_ALLOC_COSTLY_ORDER from v5.13)",
    "buddy_call_ns": "page allocator call that goes to the buddy lists (work outside the "
                     "zone lock)",
    "zone_lock_hold_ns": "zone->lock hold time per block taken or returned, its struct "
                         "page lines already moved (a buddy call moves one block, a pcp "
                         "batch refill or drain pcp_batch in one hold)",
    "pcp_batch": "pcp calls per zone->lock acquisition (pcp->batch: refills and drains move "
                 "batches of pages)",
    "page_setup_ns": "per 4 KiB page of a new or freed slab (struct page/folio setup, "
                     "memcg accounting)",
    "object_setup_ns": "per object of a new slab (freelist construction in allocate_slab)",
    "queueing": "1: CPUs queue for contended locks (the closed-queue waits of solve); 0: "
                "no waits, for the one-core rig of rig_cost only (a flag, not a time)",
    "list_lock_lines": "cache lines one list_lock critical section moves from the previous "
                       "holder (a count): the lock word of struct kmem_cache_node, its "
                       "partial list head and nr_partial, the slab's slab->slab_list links "
                       "and counters, its neighbours' list links",
    "barn_lock_lines": "cache lines one barn lock critical section moves (a count): the "
                       "lock word of struct node_barn, the sheaves_full/sheaves_empty list "
                       "heads, nr_full/nr_empty, the sheaf's list links",
    "zone_lock_lines": "cache lines one zone->lock critical section moves (a count): the "
                       "lock word, the free_area[order] free lists and nr_free, the zone's "
                       "free-page counters",
    "zone_block_lines": "cache lines each block taken or returned under zone->lock moves "
                        "(a count): struct pages other CPUs wrote last, the block's buddy "
                        "and the free-list neighbours __free_one_page() and "
                        "__rmqueue_smallest()/expand() unlink and link",
    "array_object_ns": "SLAB: moving one object pointer between array caches or between an "
                       "array and its slab (transfer_objects()' memcpy, free_block() and "
                       "slab_get_obj() per object); SLUB's refill and flush objects are "
                       "sheaf_object_ns",
}

#: Constants a cost file may leave out, with the value they take then (the physical priors
#: of :data:`slabtune.model.priors.PRIOR`): the per-acquisition line counts came after
#: the first cost files, which charged one line per acquisition; ``queueing`` came with the
#: closed-queue waits; ``array_object_ns`` (SLAB's objects moved) came with the one mapping
#: from counters to priced events, before which SLAB's moves were priced as sheaf objects.
#: Names older cost files may carry that no longer exist: ``rho_max`` capped the utilisation
#: of the open M/M/1 queue the closed queue replaced (a closed queue needs no cap).  A file
#: that sets one still loads; the value is not used.
RETIRED: tuple[str, ...] = ("rho_max",)
OPTIONAL_DEFAULTS: dict[str, float] = {
    "queueing": 1.0,
    "list_lock_lines": 3.0,
    "barn_lock_lines": 3.0,
    "zone_lock_lines": 4.0,
    "zone_block_lines": 5.0,
    "array_object_ns": 2.0,
}

FIELDS: tuple[str, ...] = CostParams._fields
#: Largest cost constant: the model holds them as float32, where anything larger is inf.
FLOAT32_MAX = 3.4028234663852886e38


class CostError(ValueError):
    """Bad cost constants; the message names the field."""


class CostMeta(NamedTuple):
    """Where the constants came from: the source label and which were fitted, to what."""

    source: str
    fitted: dict[str, str]


def cost_from_mapping(values: dict, base: CostParams | None = None) -> CostParams:
    """Build :class:`CostParams` from a ``{name: number}`` mapping, over ``base`` if given.

    Unknown names, non-numbers and negative values raise :class:`CostError` naming the key.
    Without ``base``, constants of :data:`OPTIONAL_DEFAULTS` left out take their value there
    (older cost files stay valid).
    """
    out = dict(OPTIONAL_DEFAULTS) if base is None else {
        k: float(v) for k, v in base._asdict().items()}
    for key, val in values.items():
        if key in RETIRED:
            continue
        if key not in FIELDS:
            raise CostError(f"cost.{key}: unknown cost constant (known: {', '.join(FIELDS)})")
        if isinstance(val, bool) or not isinstance(val, (int, float)):
            raise CostError(f"cost.{key}: {val!r} is not a number")
        if not math.isfinite(val) or abs(val) > FLOAT32_MAX:
            raise CostError(f"cost.{key}: {val!r} is not a finite number (float32)")
        if val < 0:
            raise CostError(f"cost.{key}: {val} is negative")
        out[key] = float(val)
    missing = [k for k in FIELDS if k not in out]
    if missing:
        raise CostError(f"cost.{missing[0]}: missing (every constant needs a value)")
    if out["pcp_batch"] < 1:
        raise CostError(f"cost.pcp_batch: {out['pcp_batch']} must be at least 1")
    if out["queueing"] != 1.0:
        raise CostError(f"cost.queueing: {out['queueing']} must be 1 (0, no queueing, is "
                        "for the one-core rig table built in code)")
    for key in ("list_lock_lines", "barn_lock_lines", "zone_lock_lines"):
        if out[key] < 1:
            raise CostError(f"cost.{key}: {out[key]} must be at least 1 (the lock's own line)")
    return CostParams(**{k: jnp.asarray(out[k], _F32) for k in FIELDS})


#: Constants a one-core rig's cost is linear in (:func:`rig_cost`): everything but the line
#: transfers (none move between CPUs), ``queueing`` (no lock is contended), the lock line
#: counts (they multiply a zero line cost) and ``pcp_batch`` (a count, held fixed).
RIG_FREE: tuple[str, ...] = (
    "alloc_fast_ns", "free_fast_ns", "alloc_slow_ns", "free_slow_ns", "sheaf_swap_ns",
    "sheaf_object_ns", "cpu_partial_drain_ns", "list_lock_hold_ns", "barn_lock_hold_ns",
    "pcp_call_ns", "buddy_call_ns", "zone_lock_hold_ns", "page_setup_ns", "object_setup_ns",
)


def rig_cost(values: dict, pcp_batch: float) -> CostParams:
    """A cost table for a rig whose threads all run on one CPU (``slabtune validate``'s
    native timing runs): no cache line ever moves between CPUs, so ``line_local_ns =
    line_remote_ns = 0`` (a lock's critical section and a remote free cost only their own
    work), and no lock is ever contended (the threads time-slice on one core, and a call
    that spans a time slice is dropped), so ``queueing = 0``: :func:`solve` charges no wait.
    ns per op is then linear in the :data:`RIG_FREE` constants taken from ``values``
    (missing ones are 0), with ``pcp_batch`` fixed.  Built in code only:
    :func:`parse_cost_toml` keeps ``queueing`` at 1 for the tables the tuner uses."""
    bad = [k for k in values if k not in RIG_FREE]
    if bad:
        raise CostError(f"cost.{bad[0]}: not a rig constant (rig constants: {', '.join(RIG_FREE)})")
    for key, val in values.items():
        if not float(val) >= 0:
            raise CostError(f"cost.{key}: {val} is negative")
    if not float(pcp_batch) >= 1:
        raise CostError(f"cost.pcp_batch: {pcp_batch} must be at least 1")
    out = {k: float(values.get(k, 0.0)) for k in RIG_FREE}
    out.update(line_local_ns=0.0, line_remote_ns=0.0, queueing=0.0, pcp_batch=float(pcp_batch),
               list_lock_lines=1.0, barn_lock_lines=1.0, zone_lock_lines=1.0,
               zone_block_lines=1.0, array_object_ns=0.0)
    return CostParams(**{k: jnp.asarray(out[k], _F32) for k in FIELDS})


def parse_cost_toml(text: str, source: str = "<string>", base: CostParams | None = None
                    ) -> tuple[CostParams, CostMeta]:
    """Parse a cost file: a ``[cost]`` table of constants and an optional ``[fitted]`` table
    naming constants fitted to a published figure (``name = "what it was fitted to"``)."""
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise CostError(f"{source}: not valid TOML ({err})") from None
    for key in doc:
        if key not in ("cost", "fitted"):
            raise CostError(f"{source}: unknown table [{key}] (expected [cost], [fitted])")
    table = doc.get("cost", {})
    if not isinstance(table, dict):
        raise CostError(f"{source}: cost must be a table")
    params = cost_from_mapping(table, base)
    fitted = doc.get("fitted", {})
    if not isinstance(fitted, dict):
        raise CostError(f"{source}: fitted must be a table")
    for key, val in fitted.items():
        if key not in FIELDS:
            raise CostError(f"fitted.{key}: not a cost constant")
        if not isinstance(val, str):
            raise CostError(f"fitted.{key}: must be a string saying what it was fitted to")
    return params, CostMeta(source, dict(fitted))


def pcp_max_order(version: tuple[int, int]) -> int:
    """Highest order the page allocator's per-CPU lists cache.

    Only order 0 up to v5.12 (Mel Gorman in seed slub-order-nr-cpus-2021: "the page
    allocator which only caches order-0 pages on a per-cpu basis"); v5.13 (44042b449872,
    "allow high-order pages to be stored on the per-cpu lists") caches orders up to
    PAGE_ALLOC_COSTLY_ORDER (3).
    """
    return 0 if tuple(version) < (5, 13) else 3


# --------------------------------------------------------------------------- per-op costs


class OpRates(NamedTuple):
    """Per-operation event rates of each representative CPU (float32, shape (R,)).

    Lock acquisitions are not here: they enter :func:`solve` as the matrix ``A``.
    """

    alloc_fast: jnp.ndarray
    free_fast: jnp.ndarray
    alloc_slow: jnp.ndarray
    free_slow: jnp.ndarray
    remote_free: jnp.ndarray
    sheaf_swap: jnp.ndarray
    sheaf_objects_moved: jnp.ndarray
    cpu_partial_drain: jnp.ndarray
    slab_alloc: jnp.ndarray
    slab_free: jnp.ndarray


def page_call_ns(order, pcp_max, c: CostParams):
    """Cost of one page allocator call outside the zone lock for a slab of ``order``:
    a pcp hit for orders the era caches per CPU, else a buddy call."""
    order = jnp.asarray(order, _F32)
    return jnp.where(order <= pcp_max, c.pcp_call_ns, c.buddy_call_ns)


def zone_blocks_per_acquisition(order, pcp_max, c: CostParams):
    """Blocks moved in one zone->lock hold for slabs of ``order``: a pcp refill
    (rmqueue_bulk) or drain (free_pcppages_bulk) moves ``pcp_batch``, where a buddy call
    (rmqueue_buddy, free_one_page) moves one."""
    order = jnp.asarray(order, _F32)
    return jnp.where(order <= pcp_max, c.pcp_batch, 1.0)


def zone_lock_per_call(order, pcp_max, c: CostParams):
    """zone->lock acquisitions per page allocator call: one per
    :func:`zone_blocks_per_acquisition` calls (1 / pcp_batch for orders cached per CPU, whose
    lists refill and drain in batches; 1 for higher orders)."""
    return 1.0 / zone_blocks_per_acquisition(order, pcp_max, c)


def zone_hold_ns(order, pcp_max, c: CostParams):
    """zone->lock hold per acquisition for slabs of ``order``: ``zone_lock_hold_ns`` per
    block moved under the lock (:func:`zone_blocks_per_acquisition`).  The zone lock's
    busy time per page allocator call is the same either way; what the per-CPU lists save
    is the section's own line transfers and the waits of ``pcp_batch - 1`` acquisitions."""
    return c.zone_lock_hold_ns * zone_blocks_per_acquisition(order, pcp_max, c)


def slab_setup_ns(order, objs_per_slab, c: CostParams):
    """Setup of one new slab (7.2 allocate_slab()): struct page work for its 2**order
    pages (alloc_slab_page()'s compound page, account_slab()) plus the free pointer of
    each of its objects (the freelist loop or shuffle_freelist(), setup_object()).
    Charged per slab allocated, never per object allocated."""
    pages = jnp.exp2(jnp.asarray(order, _F32))
    return pages * c.page_setup_ns + jnp.asarray(objs_per_slab, _F32) * c.object_setup_ns


def slab_teardown_ns(order, c: CostParams):
    """Teardown of one freed slab (7.2 __free_slab()): struct page work for its 2**order
    pages (__ClearPageSlab(), unaccount_slab(), free_frozen_pages()' per-page checks).
    No per-object work: a freed slab's objects are not touched again."""
    return jnp.exp2(jnp.asarray(order, _F32)) * c.page_setup_ns


def base_ns_per_op(r: OpRates, order, objs_per_slab, pcp_max, c: CostParams):
    """ns per op of each rep CPU outside lock holds, line transfers and waits (shape (R,)).

    Objects moved in sheaf refills and flushes are here, outside any lock: 7.x
    refill_objects() takes whole slabs off the partial list under the list_lock
    (get_partial_node_bulk, per slab) and pops their objects after dropping it, and a
    flush frees its objects through __kmem_cache_free_bulk() outside the lock (it takes
    the list_lock only for a slab that changes list).  A new slab costs a page allocator
    call and its setup (:func:`slab_setup_ns`), a freed one a page allocator call and its
    teardown (:func:`slab_teardown_ns`)."""
    call = page_call_ns(order, pcp_max, c)
    return (r.alloc_fast * c.alloc_fast_ns + r.free_fast * c.free_fast_ns
            + r.alloc_slow * c.alloc_slow_ns + r.free_slow * c.free_slow_ns
            + r.remote_free * c.line_remote_ns
            + r.sheaf_swap * c.sheaf_swap_ns
            + r.sheaf_objects_moved * c.sheaf_object_ns
            + r.cpu_partial_drain * c.cpu_partial_drain_ns
            + r.slab_alloc * (call + slab_setup_ns(order, objs_per_slab, c))
            + r.slab_free * (call + slab_teardown_ns(order, c)))


class SlubCounts(NamedTuple):
    """SLUB_STATS-like counters of one CPU per operation (or per call), the input of
    :func:`priced_events`.  The names are SLUB_STATS' where it has the event; floats or
    arrays of one shape.

    ``alloc_fast``/``free_fast``: ALLOC_FASTPATH/FREE_FASTPATH (a CPU-slab or sheaf hit;
    7.x counts every object alloc_from_pcs()/free_to_pcs() hands out, also one that
    first replaced the main sheaf).  ``alloc_slow``/``free_slow``: ALLOC_SLOWPATH/
    FREE_SLOWPATH (___slab_alloc(), __slab_free()).  ``remote_free``: frees of another
    node's object that move cross-node lines outside any lock (the model's count; 0
    where unknown).  ``barn_get``/``barn_put`` and ``_fail``: BARN_GET, BARN_PUT,
    BARN_GET_FAIL, BARN_PUT_FAIL.  ``sheaf_refill``/``sheaf_flush``: objects moved into
    and out of sheaves (7.x SHEAF_REFILL/SHEAF_FLUSH count objects).  ``slab_alloc``/
    ``slab_free``: ALLOC_SLAB/FREE_SLAB.  ``cpu_partial_drain``: CPU_PARTIAL_DRAIN.
    ``list_lock``: node list_lock sections (no SLUB_STATS counter: the model counts them,
    a timing run estimates them, :func:`slabtune.calibrate.umlfit.slub_counts`)."""

    alloc_fast: jnp.ndarray
    alloc_slow: jnp.ndarray
    free_fast: jnp.ndarray
    free_slow: jnp.ndarray
    remote_free: jnp.ndarray
    barn_get: jnp.ndarray
    barn_get_fail: jnp.ndarray
    barn_put: jnp.ndarray
    barn_put_fail: jnp.ndarray
    sheaf_refill: jnp.ndarray
    sheaf_flush: jnp.ndarray
    slab_alloc: jnp.ndarray
    slab_free: jnp.ndarray
    cpu_partial_drain: jnp.ndarray
    list_lock: jnp.ndarray


class PricedEvents(NamedTuple):
    """What the cost model charges per operation: the rates :func:`base_ns_per_op` prices
    and the lock sections :func:`solve` queues (``list_lock``, ``barn_lock``; zone lock
    sections follow from ``rates.slab_alloc + rates.slab_free``, :func:`zone_lock_per_call`)."""

    rates: OpRates
    list_lock: jnp.ndarray
    barn_lock: jnp.ndarray


def priced_events(s: SlubCounts, remote_free_lines=1.0) -> PricedEvents:
    """THE mapping from counters to priced events, used by the model
    (:func:`slabtune.model.metrics.op_rates`, :func:`~slabtune.model.metrics.lock_sections`)
    and by the cost fit (:func:`slabtune.calibrate.umlfit.events`) alike.

    From 7.2 mm/slub.c (and the CPU-slab kernels' paths the model counts the same way):

    * every fast path (ALLOC_FASTPATH, FREE_FASTPATH) at ``alloc_fast_ns``/``free_fast_ns``,
      including the call that first replaced its main sheaf: the replacement is priced by
      what it did, below, not as a slow path.  A swap with the spare
      (``swap(pcs->main, pcs->spare)`` in __pcs_replace_empty_main()/full_main()) is two
      pointer writes in the same local_lock section and has no SLUB_STATS counter: no
      charge of its own;
    * ALLOC_SLOWPATH/FREE_SLOWPATH (___slab_alloc(), __slab_free() outside the lock) at
      ``alloc_slow_ns``/``free_slow_ns``;
    * a sheaf exchange with the barn, BARN_GET or BARN_PUT (barn_replace_empty_sheaf(),
      barn_replace_full_sheaf(), or the barn_put_full_sheaf() of
      __pcs_install_empty_sheaf(), each counted once): ``sheaf_swap_ns`` outside the lock
      and one barn lock section;
    * a failed attempt, BARN_GET_FAIL or BARN_PUT_FAIL: one barn lock section and no
      exchange (an upper bound for SLUB: 7.2 skips the lock when its racy
      ``data_race(barn->nr_full)``/``nr_empty`` check already fails; SLAB's view counts
      its alien lock sections here, slab_dynamics.PRICED_AS).  What follows the failure
      is priced by its own counters: the refill (refill_sheaf() -> refill_objects():
      get_partial_node_bulk()'s list_lock section, new slabs) or the flush
      (sheaf_flush_unused() -> __kmem_cache_free_bulk(): __slab_free() per slab, a
      list_lock section per slab that changes list);
    * each object refilled or flushed (SHEAF_REFILL, SHEAF_FLUSH: objects in 7.x) at
      ``sheaf_object_ns``, outside any lock (SLAB's view: the objects its arrays move, at
      ``array_object_ns``, :func:`slabtune.model.metrics.with_object_price`);
    * each list_lock section at its hold (and lines and wait, in :func:`solve`);
    * each new slab (ALLOC_SLAB) a page allocator call plus its setup, per slab
      (:func:`slab_setup_ns`); each freed slab (FREE_SLAB) a page allocator call plus its
      per-page teardown (:func:`slab_teardown_ns`), no per-object work; zone lock sections
      per call by :func:`zone_lock_per_call`;
    * each remote free ``remote_free_lines`` cross-node lines (1 for SLUB, 0 for SLAB's
      alien free, ``SimConfig.remote_free_lines``), each CPU_PARTIAL_DRAIN at
      ``cpu_partial_drain_ns``.

    Works on floats and arrays alike (no jax call)."""
    rates = OpRates(
        alloc_fast=s.alloc_fast, free_fast=s.free_fast,
        alloc_slow=s.alloc_slow, free_slow=s.free_slow,
        remote_free=s.remote_free * remote_free_lines,
        sheaf_swap=s.barn_get + s.barn_put,
        sheaf_objects_moved=s.sheaf_refill + s.sheaf_flush,
        cpu_partial_drain=s.cpu_partial_drain,
        slab_alloc=s.slab_alloc, slab_free=s.slab_free,
    )
    return PricedEvents(rates=rates, list_lock=s.list_lock,
                        barn_lock=s.barn_get + s.barn_put + s.barn_get_fail + s.barn_put_fail)


def one_cpu_ns(ev: PricedEvents, order, objs_per_slab, pcp_max, c: CostParams):
    """ns per op of a CPU alone on its locks (one CPU: no line moves, no lock is
    contended): :func:`base_ns_per_op` plus each lock section's hold, the zone lock's per
    page allocator call (:func:`zone_hold_ns` x :func:`zone_lock_per_call`).  What
    :func:`solve` gives for one rep of weight 1 (:func:`slabtune.model.metrics.compute`
    on a one-CPU machine), and what the cost fit prices a one-CPU timing with."""
    r = ev.rates
    return (base_ns_per_op(r, order, objs_per_slab, pcp_max, c)
            + ev.list_lock * c.list_lock_hold_ns + ev.barn_lock * c.barn_lock_hold_ns
            + zone_sections(r, order, pcp_max, c) * zone_hold_ns(order, pcp_max, c))


def zone_sections(r: OpRates, order, pcp_max, c: CostParams):
    """zone->lock sections per op: one page allocator call per new or freed slab, each
    :func:`zone_lock_per_call` sections (a pcp refill or drain serves ``pcp_batch``
    calls)."""
    return (r.slab_alloc + r.slab_free) * zone_lock_per_call(order, pcp_max, c)


def irq_off_sections(ev: PricedEvents, order, pcp_max, c: CostParams):
    """Lock sections per op taken with interrupts disabled: every list_lock section
    (7.2 mm/slub.c ``spin_lock_irqsave(&n->list_lock, flags)``), every barn lock section
    (``spin_lock_irqsave(&barn->lock, flags)`` in barn_get_empty_sheaf(),
    barn_replace_empty_sheaf() and the others) and every zone->lock section
    (:func:`zone_sections`; mm/page_alloc.c rmqueue_bulk(), free_pcppages_bulk(),
    rmqueue_buddy() and free_one_page() take ``spin_lock_irqsave(&zone->lock, flags)``).
    The sheaf fast paths (``local_trylock``) and the per-CPU page lists (``pcp_spin_trylock``
    on SMP) mask no interrupts.  What a calibration rig's per-section overhead multiplies
    (:data:`slabtune.calibrate.umlfit.RIG`); never part of a hardware table's price."""
    return ev.list_lock + ev.barn_lock + zone_sections(ev.rates, order, pcp_max, c)


def lock_line_counts(c: CostParams, zone_blocks=1.0):
    """Cache lines one critical section moves, per lock kind (list_lock, barn, zone; shape
    ``zone_blocks.shape + (3,)``): a contended spinlock's section reads and writes lines
    the previous holder wrote (the lock word, kmem_cache_node's partial list and
    nr_partial, slab->slab_list and counters; node_barn's sheaves lists and
    nr_full/nr_empty; zone->lock and the free_area lists), each a transfer to the
    acquiring CPU, so an acquisition costs ``k * line``.

    A zone->lock section also moves ``zone_block_lines`` per block it takes or returns
    (``zone_blocks``, :func:`zone_blocks_per_acquisition`).  6.1 __free_one_page() reads
    each buddy it tries (find_buddy_page_pfn), unlinks every free buddy it merges with
    (del_page_from_free_list: the buddy and its two list neighbours), reads the next
    buddy up (buddy_merge_likely) and links the merged block before the list's first
    block; __rmqueue_smallest() unlinks a block (it and its successor) and expand() marks
    and links each half it splits off.  With a merge or split per block on average (a
    block of order k feeds 2**k pages with 2**k - 1 splits, and merges back the same way)
    that is 6 lines per block freed and 4 per block taken: struct pages the previous
    holders wrote while they held the lock, so they move on the same terms as the
    section's own lines.  7.2 walks the same lines (__free_one_page(),
    page_del_and_expand() and expand())."""
    zone = c.zone_lock_lines + c.zone_block_lines * jnp.asarray(zone_blocks, _F32)
    ll, bl, zone = jnp.broadcast_arrays(c.list_lock_lines, c.barn_lock_lines, zone)
    return jnp.stack([ll, bl, zone], axis=-1)


def foreign_holder_fraction(acq, weight, multiplicity, duty):
    """Probability that the previous holder of the lock a CPU of rep ``r`` takes was another
    CPU, per rep and lock class (R, L): the fraction of the critical section's lines that
    must move to it.

    A lock's lines (the lock word, the list heads and counters its section writes) stay in
    the cache of the CPU that last held it; a CPU that takes the same lock again finds them
    there and moves none (the netperf request_response interrupt CPU freeing most objects
    under one alien lock, a CPU alone on its node's list_lock).  With the acquisitions of
    one lock instance interleaved at random, the previous holder is this CPU with
    probability its share of the instance's acquisitions, so an acquisition moves
    ``k * (1 - share)`` lines on average.  One CPU of rep ``r`` brings ``duty_r acq_rl``
    acquisitions per simulated step to its lock, and the instance gets
    ``sum_j n_jl duty_j acq_jl`` from the ``n_jl = weight_j / multiplicity_l`` CPUs of each
    rep on it, the arrivals :func:`solve` uses, taken at equal pace (exact within a
    coupling group, whose reps share a pace; the pace cancels).  A share above 1 (a rep
    with fewer CPUs than the class has locks) is 1.  Held fixed while :func:`solve`
    bisects the pace, so every wait still falls as the paces grow.

    ``acq`` (R, L): acquisitions per op; ``weight`` (R,): real CPUs per rep (0: inactive);
    ``multiplicity`` (L,): real locks per class; ``duty`` (R,): ops per simulated step.
    """
    acq = jnp.asarray(acq, _F32)
    weight = jnp.asarray(weight, _F32)
    mine = jnp.where((weight > 0)[:, None], jnp.asarray(duty, _F32)[:, None] * acq, 0.0)
    pop = weight[:, None] / jnp.maximum(jnp.asarray(multiplicity, _F32), 1.0)[None, :]
    total = jnp.sum(pop * mine, axis=0)
    share = mine / jnp.where(total > 0, total, 1.0)[None, :]
    return 1.0 - jnp.clip(share, 0.0, 1.0)


# --------------------------------------------------------------------------- contention
#
# Every lock is a queue in a CLOSED network: a CPU waiting for a spinlock does nothing else,
# so no lock can ever see more waiters than there are CPUs that take it, and a machine whose
# busiest lock saturates slows down to what that lock serves (the machine-repairman model).
# An open M/M/1 queue would let the queue grow without bound as the utilisation nears 1 and
# needed a cap; a closed one needs none.  The waits are Bard-Schweitzer mean-value analysis:
#
#   a CPU of rep r arriving at lock l finds, on average, the lock's mean population less
#   its own share (the arrival theorem: it does not queue behind itself), and waits the
#   service of each CPU ahead of it:   W_rl = sum_j Q_jl S_jl - Q_rl S_rl / max(n_rl, 1)
#   Little's law for the CPUs of rep j at one lock of class l:  Q_jl = a_jl (S_jl + W_jl)
#
# with ``S`` the service (hold + the cache lines the section moves), ``n_rl`` the CPUs of
# rep r on one lock of class l, and ``a_jl = n_jl x_j A_jl`` their arrivals per ns, where
# ``x_j = duty_j / tau`` is one CPU's ops per ns at the machine's pace ``tau``.  For a given
# ``tau`` the two equations are linear in the waits and have the closed form of
# :func:`mva_waits`; ``tau`` itself is the one root of ``tau = max_r duty_r t_r(tau)``,
# found by bisection (:func:`solve`).  Service is taken as exponential (a CPU finishing
# its section is as far from done as one starting it); spinlock sections are closer to
# constant, which would halve the wait for the holder in service: the model errs long.


class Solution(NamedTuple):
    """The contention fixed point."""

    t: jnp.ndarray           # (R,) ns per op of each rep CPU, everything included
    wait: jnp.ndarray        # (R, L) mean wait of rep r per acquisition of lock class l
    rho: jnp.ndarray         # (L,) utilisation of each lock of class l (busy fraction)
    tau: jnp.ndarray         # () ns per simulated step of the slowest coupling group
    throughput: jnp.ndarray  # () machine-wide ops per ns
    residual: jnp.ndarray    # () max over reps of |pace_r(t) - pace_r| / pace_r at the
    #                          solution: 0 to float32 below saturation; about 1e-2 at a
    #                          saturated lock, where the wait goes as 1 / (1 - U) with U
    #                          within 1e-5 of 1 (up to 6e-2 where coupling groups share it)
    pace: jnp.ndarray = None  # (R,) ns per simulated step of rep r's coupling group


class _Locks(NamedTuple):
    """What :func:`solve` holds fixed while it looks for the pace (float32; R reps, L lock
    classes)."""

    fixed: jnp.ndarray     # (R,) ns per op without waiting: base + acq x service
    acq: jnp.ndarray       # (R, L) acquisitions per op
    service: jnp.ndarray   # (R, L) hold + line of rep r's acquisitions
    pop: jnp.ndarray       # (R, L) CPUs of rep r on one lock of class l (0: it never takes it)
    duty: jnp.ndarray      # (R,) ops per simulated step (0 for an inactive rep)
    wait_max: jnp.ndarray  # (L,) longest possible wait: every other CPU of the lock ahead
    queueing: jnp.ndarray  # () 1: CPUs queue; 0: no waits (the one-core rig)


def _lock_system(base, acq, hold, line, weight, multiplicity, queueing, duty) -> _Locks:
    """The :class:`_Locks` of :func:`solve`'s arguments."""
    base = jnp.asarray(base, _F32)
    acq = jnp.asarray(acq, _F32)
    service = jnp.asarray(hold, _F32)[None, :] + jnp.asarray(line, _F32)
    weight = jnp.asarray(weight, _F32)
    active = weight > 0
    duty = jnp.ones_like(base) if duty is None else jnp.asarray(duty, _F32)
    duty = jnp.where(active, duty, 0.0)
    mult = jnp.maximum(jnp.asarray(multiplicity, _F32), 1.0)
    takes = active[:, None] & (acq > 0)
    pop = jnp.where(takes, weight[:, None] / mult[None, :], 0.0)
    # At most every other CPU that takes the lock is ahead, each for its longest service.
    ahead = jnp.maximum(jnp.sum(pop, axis=0) - 1.0, 0.0)
    wait_max = ahead * jnp.max(jnp.where(takes, service, 0.0), axis=0)
    return _Locks(fixed=base + jnp.sum(acq * service, axis=1), acq=acq, service=service,
                  pop=pop, duty=duty, wait_max=wait_max,
                  queueing=jnp.asarray(queueing, _F32))


def mva_waits(arrivals, service, pop, wait_max):
    """Mean wait per acquisition of each rep at each lock (R, L), for given arrivals.

    ``arrivals`` (R, L): acquisitions per ns that the CPUs of rep r bring to ONE lock of
    class l; ``service`` (R, L); ``pop`` (R, L): those CPUs' number.  Bard-Schweitzer MVA
    (see the comment above :class:`Solution`): with ``u = a S`` and ``c = u / max(n, 1)``,
    ``W_r = (B - c_r S_r) / (1 + c_r)`` where ``B = sum_j Q_j S_j`` solves
    ``B = sum_j u_j (S_j + B) / (1 + c_j)``, i.e. ``B = P / (1 - U)`` with
    ``U = sum_j u_j / (1 + c_j)`` and ``P = sum_j u_j S_j / (1 + c_j)``.  Where ``U >= 1``
    (more work than one lock can serve at these arrivals) or a wait would exceed
    ``wait_max`` (every other CPU ahead), the wait is ``wait_max``: a closed queue never
    holds more than its CPUs.  A lone CPU (``n <= 1`` and no other rep) waits 0.
    """
    u = arrivals * service
    c = u / jnp.maximum(pop, 1.0)
    big_u = jnp.sum(u / (1.0 + c), axis=0)
    p = jnp.sum(u * service / (1.0 + c), axis=0)
    ok = big_u < 1.0
    b = jnp.where(ok, p / jnp.where(ok, 1.0 - big_u, 1.0), jnp.inf)
    w = (b[None, :] - c * service) / (1.0 + c)
    return jnp.clip(w, 0.0, wait_max[None, :])


def _waits_at(s: _Locks, tau):
    """(R, L) waits when rep r's group goes at ``tau`` (scalar or (R,)) ns per step."""
    rate = s.duty / tau                                   # (R,) ops per ns of one CPU
    w = mva_waits(s.pop * (rate[:, None] * s.acq), s.service, s.pop, s.wait_max)
    return w * s.queueing


def _times_at(s: _Locks, tau):
    """(R,) ns per op at pace ``tau``: the fixed time plus the waits."""
    return s.fixed + jnp.sum(s.acq * _waits_at(s, tau), axis=1)


def _pace_of(s: _Locks, t, coupling):
    """(R,) ns per step rep r's coupling group needs at per-op times ``t``: the largest
    ``duty_j t_j`` over the reps j coupled to r (at least 1e-3)."""
    need = jnp.where(coupling, (s.duty * t)[None, :], 0.0)
    return jnp.maximum(jnp.max(need, axis=1), 1e-3)


def solve(base, acq, hold, line, weight, multiplicity, queueing=1.0, duty=None,
          steps: int = 40, coupling=None) -> Solution:
    """Per-op times ``t = base + acq @ (hold + line + W)`` with ``W`` the closed-queue waits.

    ``base`` (R,): ns per op outside locks (the workload's own work included).  ``acq``
    (R, L): acquisitions per op of each lock class.  ``hold`` (L,): hold time.  ``line``
    (R, L): what rep r adds to each acquisition beyond ``hold``: the cache lines its
    critical section moves (``k_l * f_{r,l} * line_{r,l}``, local or cross-node, with
    ``f`` of :func:`foreign_holder_fraction`, computed by the caller) and any work it does
    under the lock (bulk sheaf refills and flushes).  ``weight`` (R,): real CPUs per rep.
    ``multiplicity`` (L,): real locks per class (a rep's CPUs spread evenly over them).
    ``queueing``: 1, or 0 for no waits (the one-core rig, :func:`rig_cost`).  ``duty`` (R,):
    ops per simulated step of each rep (default 1).  ``coupling`` (R, R) bool: the reps
    whose pace rep r must keep (:func:`slabtune.model.metrics.coupling`; default: all).

    Pacing: reps that hand objects to each other are coupled (a receiver frees what its
    sender allocated, so neither can run ahead of the other for long), so a coupling group
    advances one step in ``pace_g = max_{r in g} duty_r t_r`` ns and rep ``r`` does
    ``duty_r / pace_g`` ops per ns: a rep that is not the slowest of its group idles.
    Groups that exchange no objects (the CPUs of a node with memory and those of a
    memoryless one, each submitting and completing its own I/O) go at their own paces and
    meet only in the locks they share; with one group this is the machine-wide pace.
    Every wait falls as the paces grow, so each group's ``pace_g(t) - pace_g`` is
    decreasing in its own pace; all groups are bisected at once, ``steps`` bisections of
    ``log pace`` between the pace with no waiting and the pace with every CPU queued behind
    every other at each of its locks (where groups share a saturated lock the result is
    within the reported ``residual``, a few per cent at worst).
    """
    s = _lock_system(base, acq, hold, line, weight, multiplicity, queueing, duty)
    r = s.fixed.shape[0]
    coupling = (jnp.ones((r, r), bool) if coupling is None
                else jnp.asarray(coupling, bool) | jnp.eye(r, dtype=bool))
    lo = _pace_of(s, s.fixed, coupling)
    hi = _pace_of(s, s.fixed + jnp.sum(s.acq * s.wait_max[None, :], axis=1), coupling)
    hi = jnp.maximum(hi, lo * (1.0 + 1e-6))

    def bisect(_, bracket):
        a, b = bracket
        mid = jnp.sqrt(a * b)
        slow = _pace_of(s, _times_at(s, mid), coupling) > mid   # the root lies above mid
        return jnp.where(slow, mid, a), jnp.where(slow, b, mid)

    a, b = lax.fori_loop(0, steps, bisect, (lo, hi))
    # The upper ends: waits there are finite and never above wait_max.
    t = _times_at(s, b)
    pace = _pace_of(s, t, coupling)
    rate = s.duty / pace
    arrivals = s.pop * rate[:, None] * s.acq
    rho = jnp.sum(arrivals * s.service, axis=0)
    wait = _waits_at(s, pace)
    weight = jnp.asarray(weight, _F32)
    return Solution(t=t, wait=wait, rho=rho, tau=jnp.max(jnp.where(weight > 0, pace, 0.0)),
                    throughput=jnp.sum(jnp.where(weight > 0, weight * rate, 0.0)),
                    residual=jnp.max(jnp.abs(_pace_of(s, _times_at(s, pace), coupling) - pace)
                                     / pace),
                    pace=pace)

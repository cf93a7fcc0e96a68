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
        + sum_l A[r, l] * (hold_l + k_l * line_{r,l} + W_l)    # lock acquisitions

``A[r, l]`` is rep ``r``'s acquisitions per op of lock class ``l`` (a node's list_lock, a
node's barn lock, a zone lock), ``line_{r,l}`` the transfer of one cache line to the
acquiring CPU (local or cross-node), ``k_l`` the lines a critical section of that lock
moves from the previous holder (``list_lock_lines``, ``barn_lock_lines``,
``zone_lock_lines``: the lock word and the list heads, counters and links the section
writes, see :data:`DOCS`), ``W_l`` the queueing wait.  Contention is M/M/1 on each
lock, whose service time is ``hold_l + k_l * line_{r,l}``: with ``lambda_l`` acquisitions
per ns on each of the ``m_l`` real locks of the class (rep ``r``'s CPUs contribute
``weight_r * A[r, l]`` per op), ``rho_l = sum_r lambda_{r,l} * (hold_l + k_l * line_{r,l})``
and ``W_l = s_l * rho_l / (1 - rho_l)`` with ``s_l`` the mean service time, less the CPU's own
share of ``rho_l`` in the numerator (a CPU never queues behind itself).  ``t_r`` depends
on ``W`` and ``W`` on ``t_r``; the fixed point is found by bisection on each lock's
utilisation in turn (the map from ``rho`` to ``rho'`` is decreasing, so plain iteration
would oscillate), static rounds for ``jit``.  Near saturation the fixed point gives each
lock a throughput just under one per mean service time: the machine slows to what its
busiest lock can serve, which is how one node's list_lock caps a whole machine.
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
    rho_max: jnp.ndarray
    list_lock_lines: jnp.ndarray
    barn_lock_lines: jnp.ndarray
    zone_lock_lines: jnp.ndarray


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
                       "done under the node's list_lock (lengthens that lock's hold)",
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
    "zone_lock_hold_ns": "zone->lock hold time per buddy call or per pcp batch refill/drain",
    "pcp_batch": "pcp calls per zone->lock acquisition (pcp->batch: refills and drains move "
                 "batches of pages)",
    "page_setup_ns": "per 4 KiB page of a new or freed slab (struct page/folio setup, "
                     "memcg accounting)",
    "object_setup_ns": "per object of a new slab (freelist construction in allocate_slab)",
    "rho_max": "cap on lock utilisation in the M/M/1 wait (keeps the fixed point finite)",
    "list_lock_lines": "cache lines one list_lock critical section moves from the previous "
                       "holder (a count): the lock word of struct kmem_cache_node, its "
                       "partial list head and nr_partial, the slab's slab->slab_list links "
                       "and counters, its neighbours' list links",
    "barn_lock_lines": "cache lines one barn lock critical section moves (a count): the "
                       "lock word of struct node_barn, the sheaves_full/sheaves_empty list "
                       "heads, nr_full/nr_empty, the sheaf's list links",
    "zone_lock_lines": "cache lines one zone->lock critical section moves (a count): the "
                       "lock word, the free_area[order] free lists and nr_free, the zone's "
                       "free-page counters, the pages' buddy links",
}

#: Constants a cost file may leave out, with the value they take then (the physical priors
#: of :data:`slabtune.model.priors.PRIOR`): the per-acquisition line counts came after
#: the first cost files, which charged one line per acquisition.
OPTIONAL_DEFAULTS: dict[str, float] = {
    "list_lock_lines": 4.0,
    "barn_lock_lines": 3.0,
    "zone_lock_lines": 4.0,
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
    if not 0 < out["rho_max"] < 1:
        raise CostError(f"cost.rho_max: {out['rho_max']} must be in (0, 1)")
    for key in OPTIONAL_DEFAULTS:
        if out[key] < 1:
            raise CostError(f"cost.{key}: {out[key]} must be at least 1 (the lock's own line)")
    return CostParams(**{k: jnp.asarray(out[k], _F32) for k in FIELDS})


#: Constants a one-core rig's cost is linear in (:func:`rig_cost`): everything but the line
#: transfers (none move between CPUs), the queueing cap (no lock is contended), the lock line
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
    that spans a time slice is dropped), so ``rho_max = 0``: :func:`wait_excluding_own`
    clips every utilisation to 0 and the M/M/1 wait is exactly 0.  ns per op is then linear
    in the :data:`RIG_FREE` constants taken from ``values`` (missing ones are 0), with
    ``pcp_batch`` fixed.  Built in code only: :func:`parse_cost_toml` keeps ``rho_max`` in
    (0, 1) for the tables the tuner uses."""
    bad = [k for k in values if k not in RIG_FREE]
    if bad:
        raise CostError(f"cost.{bad[0]}: not a rig constant (rig constants: {', '.join(RIG_FREE)})")
    for key, val in values.items():
        if not float(val) >= 0:
            raise CostError(f"cost.{key}: {val} is negative")
    if not float(pcp_batch) >= 1:
        raise CostError(f"cost.pcp_batch: {pcp_batch} must be at least 1")
    out = {k: float(values.get(k, 0.0)) for k in RIG_FREE}
    out.update(line_local_ns=0.0, line_remote_ns=0.0, rho_max=0.0, pcp_batch=float(pcp_batch),
               list_lock_lines=1.0, barn_lock_lines=1.0, zone_lock_lines=1.0)
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


def zone_lock_per_call(order, pcp_max, c: CostParams):
    """zone->lock acquisitions per page allocator call: 1 / pcp_batch for orders cached per
    CPU (the lists refill and drain in batches), 1 for higher orders."""
    order = jnp.asarray(order, _F32)
    return jnp.where(order <= pcp_max, 1.0 / c.pcp_batch, 1.0)


def slab_setup_ns(order, objs_per_slab, c: CostParams):
    """Per-slab setup or teardown work: struct page work for 2**order pages plus freelist
    construction for each object (allocate_slab / __free_slab)."""
    pages = jnp.exp2(jnp.asarray(order, _F32))
    return pages * c.page_setup_ns + jnp.asarray(objs_per_slab, _F32) * c.object_setup_ns


def base_ns_per_op(r: OpRates, order, objs_per_slab, pcp_max, c: CostParams):
    """ns per op of each rep CPU outside lock holds, line transfers and waits (shape (R,)).

    Objects moved in sheaf refills and flushes are not here: that work is done under the
    node's list_lock and is part of the lock's service time (see
    :func:`slabtune.model.metrics.lock_classes`)."""
    page = page_call_ns(order, pcp_max, c) + slab_setup_ns(order, objs_per_slab, c)
    return (r.alloc_fast * c.alloc_fast_ns + r.free_fast * c.free_fast_ns
            + r.alloc_slow * c.alloc_slow_ns + r.free_slow * c.free_slow_ns
            + r.remote_free * c.line_remote_ns
            + r.sheaf_swap * c.sheaf_swap_ns
            + r.cpu_partial_drain * c.cpu_partial_drain_ns
            + (r.slab_alloc + r.slab_free) * page)


def lock_line_counts(c: CostParams):
    """Cache lines one critical section moves, per lock kind (list_lock, barn, zone; shape
    (3,)): a contended spinlock's section reads and writes lines the previous holder wrote
    (the lock word, kmem_cache_node's partial list and nr_partial, slab->slab_list and
    counters; node_barn's sheaves lists and nr_full/nr_empty; zone->lock and the free_area
    lists), each a transfer to the acquiring CPU, so an acquisition costs ``k * line``."""
    return jnp.stack([c.list_lock_lines, c.barn_lock_lines, c.zone_lock_lines])


# --------------------------------------------------------------------------- contention


def mm1_wait(hold, rho, rho_max):
    """M/M/1 mean wait in queue: hold * rho / (1 - rho), with rho capped at rho_max."""
    rho = jnp.clip(rho, 0.0, rho_max)
    return hold * rho / (1.0 - rho)


def wait_excluding_own(service, rho, own, rho_max):
    """M/M/1 mean wait of one CPU: service * rho_others / (1 - rho), where rho_others =
    rho - own leaves out the CPU's own share ``own`` (shape (R, L)) and ``service`` (L,) is
    the lock's mean service time; a lone CPU never waits."""
    rho = jnp.clip(rho, 0.0, rho_max)[None, :]
    others = jnp.clip(rho - own, 0.0, rho)
    return service[None, :] * others / (1.0 - rho)


class Solution(NamedTuple):
    """The contention fixed point."""

    t: jnp.ndarray           # (R,) ns per op of each rep CPU, everything included
    wait: jnp.ndarray        # (R, L) mean wait of rep r per acquisition of lock class l
    rho: jnp.ndarray         # (L,) utilisation of each lock class
    tau: jnp.ndarray         # () ns per simulated step: the pace of the busiest rep
    throughput: jnp.ndarray  # () machine-wide ops per ns
    residual: jnp.ndarray    # () max |U(rho) - rho| at the solution


def solve(base, acq, hold, line, weight, multiplicity, rho_max, duty=None, sweeps: int = 6,
          steps: int = 32) -> Solution:
    """Solve t = base + acq @ (hold + line + W(t)) for the per-op times ``t``.

    ``base`` (R,): ns per op outside locks.  ``acq`` (R, L): acquisitions per op of each
    lock class.  ``hold`` (L,): hold time.  ``line`` (R, L): what rep r adds to each
    acquisition of lock l beyond ``hold``: the transfer of the cache lines its critical
    section moves (the lock's and the lists it guards, ``k_l * line_{r,l}``) and any
    work it does under the lock (bulk sheaf refills and flushes).  ``weight`` (R,): real
    CPUs per rep.  ``multiplicity`` (L,): real locks per class (arrivals spread evenly over
    them).  ``duty`` (R,): ops per simulated step of each rep (default 1).

    Service: a CPU holds the lock for ``hold`` plus the transfer of the lock's line (and the
    list it guards) to it, ``hold + line``; CPUs across the interconnect therefore lower
    the lock's capacity for everyone, which is how a memory node's lock becomes the
    bottleneck of CPUs on memoryless nodes.

    Pacing: the reps of a workload are coupled (a receiver frees what a sender allocated),
    so the machine advances one simulated step in ``tau = max_r duty_r * t_r`` ns and rep
    ``r`` does ``duty_r / tau`` ops per ns; with one rep, or equal reps, that is ``1 / t``.

    In terms of the utilisations, the fixed point is ``rho = U(rho)`` with ``U`` decreasing
    in every argument (more waiting slows every CPU, which lowers every arrival rate), so
    ``U(rho)_l - rho_l`` has exactly one root in ``rho_l`` when the others are held: each
    lock class is solved by bisection in turn, and the round over classes is repeated
    (``sweeps`` and ``steps`` are static).

    The parts: :func:`_lock_system` (the fixed arrays), :func:`_pace`, :func:`_waits`,
    :func:`_times`, :func:`_utilisation` (of each lock class), :func:`_bisect_class` (the
    bisection of one class), :func:`_fixed_point` (the rounds) and :func:`_solution` (the
    final times).
    """
    s = _lock_system(base, acq, hold, line, weight, multiplicity, rho_max, duty)
    rho = _fixed_point(s, sweeps, steps)
    return _solution(s, rho)


class _Locks(NamedTuple):
    """What :func:`solve` holds fixed while it looks for the utilisations (float32; R reps,
    L lock classes)."""

    fixed: jnp.ndarray         # (R,) ns per op without waiting: base + acq x service
    acq: jnp.ndarray           # (R, L) acquisitions per op
    service: jnp.ndarray       # (R, L) hold + line of rep r's acquisitions
    mean_service: jnp.ndarray  # (L,) mean service over each lock's arrivals
    own: jnp.ndarray           # (R, L) rep r's own share of a lock's utilisation
    weight: jnp.ndarray        # (R,) real CPUs per rep
    duty: jnp.ndarray          # (R,) ops per simulated step
    active: jnp.ndarray        # (R,) weight > 0
    mult: jnp.ndarray          # (L,) real locks per class, at least 1
    rho_max: jnp.ndarray       # () utilisation cap
    hold: jnp.ndarray          # (L,) hold time (its shape fixes L)


def _lock_system(base, acq, hold, line, weight, multiplicity, rho_max, duty) -> _Locks:
    """The :class:`_Locks` of :func:`solve`'s arguments: the service of each acquisition
    (hold plus lines), the time per op without waiting, each lock's mean service over its
    arrivals, and each rep's own share of a lock (taken out of the queue it sees)."""
    base = jnp.asarray(base, _F32)
    acq = jnp.asarray(acq, _F32)
    hold = jnp.asarray(hold, _F32)
    line = jnp.asarray(line, _F32)
    weight = jnp.asarray(weight, _F32)
    rho_max = jnp.asarray(rho_max, _F32)
    duty = jnp.ones_like(base) if duty is None else jnp.asarray(duty, _F32)
    active = weight > 0
    mult = jnp.maximum(jnp.asarray(multiplicity, _F32), 1.0)
    service = hold[None, :] + line
    fixed = base + jnp.sum(acq * service, axis=1)
    # Mean service time of each lock over its arrivals (rates all scale with 1 / tau).
    flow = jnp.where(active, weight * duty, 0.0)[:, None] * acq
    mean_service = jnp.where(jnp.sum(flow, axis=0) > 0,
                             jnp.sum(flow * service, axis=0)
                             / jnp.maximum(jnp.sum(flow, axis=0), 1e-30), hold)

    # A CPU does not queue behind itself: its own share of a lock's utilisation (bounded
    # above by its share when nobody waits) is taken out of the queue it sees.
    own = acq * service * (duty / _pace(active, duty, fixed))[:, None]
    return _Locks(fixed=fixed, acq=acq, service=service, mean_service=mean_service, own=own,
                  weight=weight, duty=duty, active=active, mult=mult, rho_max=rho_max,
                  hold=hold)


def _pace(active, duty, t):
    """ns per simulated step at per-op times ``t``: ``tau = max_r duty_r * t_r`` over the
    active reps (at least 1e-3)."""
    return jnp.maximum(jnp.max(jnp.where(active, duty * t, 0.0)), 1e-3)


def _waits(s: _Locks, rho):
    """(R, L) mean wait of each rep per acquisition at utilisations ``rho``
    (:func:`wait_excluding_own`)."""
    return wait_excluding_own(s.mean_service, rho, s.own, s.rho_max)


def _times(s: _Locks, rho):
    """(R,) ns per op at utilisations ``rho``: the fixed time plus the waits."""
    return s.fixed + jnp.sum(s.acq * _waits(s, rho), axis=1)


def _utilisation(s: _Locks, t):
    """(L,) utilisation of each lock class when the reps take ``t`` ns per op: the busy
    time its arrivals bring per ns, spread over the class's locks, capped at rho_max."""
    rate = s.duty / _pace(s.active, s.duty, t)
    busy = jnp.sum(s.weight[:, None] * s.acq * s.service * rate[:, None], axis=0) / s.mult
    return jnp.minimum(busy, s.rho_max)


def _bisect_class(s: _Locks, rho, lc: int, steps: int):
    """``rho`` with lock class ``lc``'s utilisation solved, the others held: ``steps``
    bisections of ``U(rho)_lc - rho_lc`` (decreasing, one root) on [0, rho_max]."""
    def bisect(_, bracket):
        lo, hi = bracket
        mid = 0.5 * (lo + hi)
        trial = rho.at[lc].set(mid)
        above = _utilisation(s, _times(s, trial))[lc] > mid
        return jnp.where(above, mid, lo), jnp.where(above, hi, mid)

    lo, hi = lax.fori_loop(0, steps, bisect, (jnp.asarray(0.0, _F32), s.rho_max))
    return rho.at[lc].set(0.5 * (lo + hi))


def _fixed_point(s: _Locks, sweeps: int, steps: int):
    """The utilisations at the fixed point ``rho = U(rho)``: from 0, ``sweeps`` rounds,
    each solving every lock class in turn (:func:`_bisect_class`)."""
    n_locks = s.hold.shape[-1]

    def sweep(_, rho):
        for lc in range(n_locks):
            rho = _bisect_class(s, rho, lc, steps)
        return rho

    return lax.fori_loop(0, sweeps, sweep, jnp.zeros_like(s.hold))


def _solution(s: _Locks, rho) -> Solution:
    """The :class:`Solution` at utilisations ``rho``: per-op times, the pace, the waits,
    the machine's throughput and the residual ``max |U(rho) - rho|``."""
    t = _times(s, rho)
    tau = _pace(s.active, s.duty, t)
    resid = jnp.max(jnp.abs(_utilisation(s, t) - rho))
    return Solution(t=t, wait=_waits(s, rho), rho=rho, tau=tau,
                    throughput=jnp.sum(jnp.where(s.active, s.weight * s.duty, 0.0)) / tau,
                    residual=resid)

"""Metrics of one simulated configuration: from per-rep counters to machine-wide figures.

The dynamics core (:mod:`slabtune.model.dynamics`) counts what each representative CPU
("rep") did; a rep stands for ``rep_weight`` real CPUs, so machine-wide rates weight every
rep's counts by its weight.  This module turns those counts into

* fast-path fractions of allocations and frees, slow-path and remote-free rates;
* page-allocator calls (slab allocations and frees) per 1000 operations, by order;
* list_lock, barn and zone lock acquisitions per 1000 operations and their modelled
  contention (utilisation and wait, from :func:`slabtune.model.cost.solve`);
* memory held in slab pages, split into what holds live objects, empty slabs kept on the
  node partial lists (min_partial), per-CPU partial slabs, objects parked in sheaves and
  barns, and the overhead over live object bytes;
* modelled ns per alloc+free pair and the machine's throughput.

Pure ``jax.numpy`` on one configuration (vmap it for a batch).

Scaling node gauges: the simulation runs one node per node class, fed by the reps whose
memory node it is.  Slabs that follow the CPUs (in use, per-CPU slabs) scale with the real
CPUs those reps stand for; the empty slabs a node keeps (min_partial) and the sheaves its
barn holds are per node and scale with the class's real node count.
"""

from __future__ import annotations

from typing import NamedTuple

import jax.numpy as jnp

from slabtune.model import cost, profiles

_F32 = jnp.float32
#: Orders reported in ``page_allocs_per_kop_by_order`` (0..MAX_PAGE_ORDER).
N_ORDERS = profiles.MAX_PAGE_ORDER + 1
#: Lock kinds, in the order of the lock-class axis (kind-major, then node class).
LOCK_KINDS = ("list_lock", "barn", "zone")


class Metrics(NamedTuple):
    """Machine-wide metrics of one configuration (float32 scalars unless noted)."""

    alloc_fastpath_frac: jnp.ndarray
    free_fastpath_frac: jnp.ndarray
    alloc_slowpath_per_kop: jnp.ndarray
    free_slowpath_per_kop: jnp.ndarray
    remote_frees_per_kop: jnp.ndarray
    slab_allocs_per_kop: jnp.ndarray
    slab_frees_per_kop: jnp.ndarray
    page_allocs_per_kop_by_order: jnp.ndarray   # (N_ORDERS,)
    list_lock_per_kop: jnp.ndarray
    list_lock_remote_per_kop: jnp.ndarray
    barn_lock_per_kop: jnp.ndarray
    zone_lock_per_kop: jnp.ndarray
    list_lock_rho: jnp.ndarray                  # busiest node's list_lock utilisation
    barn_lock_rho: jnp.ndarray
    zone_lock_rho: jnp.ndarray
    list_lock_wait_ns: jnp.ndarray              # mean wait per list_lock acquisition
    memory_bytes: jnp.ndarray
    live_bytes: jnp.ndarray
    inuse_slab_bytes: jnp.ndarray
    empty_kept_bytes: jnp.ndarray
    cpu_partial_bytes: jnp.ndarray
    sheaf_bytes: jnp.ndarray
    barn_bytes: jnp.ndarray
    overhead_frac: jnp.ndarray
    ns_per_op: jnp.ndarray                      # allocator ns per alloc+free pair
    total_ns_per_op: jnp.ndarray                # the same with the workload's own work
    throughput_ops_per_us: jnp.ndarray          # machine-wide allocator ops per us
    alloc_throughput_per_us: jnp.ndarray        # machine-wide allocations per us
    fixed_point_residual: jnp.ndarray


def _f(x):
    return jnp.asarray(x, _F32)


def _safe_div(a, b):
    b = _f(b)
    return jnp.where(b > 0, _f(a) / jnp.where(b > 0, b, 1.0), 0.0)


def per_op(counters, name):
    """A counter per operation of each rep (0 for a rep that did nothing), shape (R,)."""
    return _safe_div(getattr(counters, name), counters.ops)


def per_kop(counters, weight, x):
    """Events ``x`` (R,) per 1000 operations of the machine: each rep's counts weighted by
    the CPUs it stands for (``weight``), over the weighted operations."""
    w = _f(weight)
    return 1000.0 * _safe_div(jnp.sum(w * _f(x)), jnp.sum(w * _f(counters.ops)))


def slub_counts(counters, sheaf_capacity) -> cost.SlubCounts:
    """A run's counters per operation of each rep, as SLUB_STATS counts them
    (:class:`slabtune.model.cost.SlubCounts`): the simulation counts sheaf refills and
    flushes as events, SLUB_STATS (7.x) as objects, so each is ``sheaf_capacity``
    objects; ``list_lock`` is the simulation's own count of sections."""
    g = lambda n: per_op(counters, n)  # noqa: E731
    cap = _f(sheaf_capacity)
    return cost.SlubCounts(
        alloc_fast=g("alloc_fast"), alloc_slow=g("alloc_slow"),
        free_fast=g("free_fast"), free_slow=g("free_slow"), remote_free=g("remote_free"),
        barn_get=g("barn_get"), barn_get_fail=g("barn_get_fail"),
        barn_put=g("barn_put"), barn_put_fail=g("barn_put_fail"),
        sheaf_refill=g("sheaf_refill") * cap, sheaf_flush=g("sheaf_flush") * cap,
        slab_alloc=g("slab_alloc"), slab_free=g("slab_free"),
        cpu_partial_drain=g("cpu_partial_drain"), list_lock=g("list_lock"))


def priced_events(counters, sheaf_capacity, remote_free_lines=1.0) -> cost.PricedEvents:
    """Per-op priced events of each rep: :func:`slabtune.model.cost.priced_events` (the
    one mapping, which the cost fit uses too) of :func:`slub_counts`.
    ``remote_free_lines``: cross-node lines one remote free moves outside any lock
    (``SimConfig.remote_free_lines``: 1 for SLUB, 0 for SLAB's alien free)."""
    return cost.priced_events(slub_counts(counters, sheaf_capacity), _f(remote_free_lines))


def op_rates(counters, sheaf_capacity, remote_free_lines=1.0) -> cost.OpRates:
    """Per-op event rates of each rep, in the terms :func:`slabtune.model.cost.
    base_ns_per_op` charges: the ``rates`` of :func:`priced_events`."""
    return priced_events(counters, sheaf_capacity, remote_free_lines).rates


def with_object_price(cfg, c: cost.CostParams) -> cost.CostParams:
    """The table a configuration's moved objects are priced by: SLAB's (the view's
    ``objects_under_list_lock`` above 0) move object pointers between array caches and
    slabs (transfer_objects(), free_block(), slab_get_obj(): ``array_object_ns`` each),
    where SLUB's refills and flushes read or write each object's free pointer
    (``sheaf_object_ns``); so for SLAB ``sheaf_object_ns`` takes ``array_object_ns``."""
    slab = _f(cfg.objects_under_list_lock) > 0
    return c._replace(sheaf_object_ns=jnp.where(slab, c.array_object_ns, c.sheaf_object_ns))


def slab_table(c: cost.CostParams) -> cost.CostParams:
    """The table SLAB's moved objects are priced by everywhere (the structural set too):
    ``sheaf_object_ns`` takes ``array_object_ns`` (:func:`with_object_price`)."""
    return c._replace(sheaf_object_ns=c.array_object_ns)


def lock_classes(counters, cfg, pcp_max, c: cost.CostParams):
    """:func:`lock_sections` without the nested drains: ``(acq, line, hold, mult)``."""
    return lock_sections(counters, cfg, pcp_max, c)[:4]


def lock_sections(counters, cfg, pcp_max, c: cost.CostParams):
    """Acquisitions per op of every lock class by every rep, and what each costs to reach.

    Lock classes are ``(kind, node class)`` for kind in :data:`LOCK_KINDS` (3N classes):

    * list_lock: a rep's local acquisitions are on its own node's lock; acquisitions of
      another node's lock (``list_lock_remote``) are on its memory node when its own node
      has no memory, else spread over the other node classes in proportion to the locks'
      simulated acquisition counts.
    * barn: get/put (and failed attempts, which take the lock too) on the rep's own node.
    * zone: page allocator calls, ``zone_lock_per_call`` each: a new slab's on the rep's
      memory node, a freed slab's on the node of its pages (:func:`slab_free_nodes`).

    Reaching a lock costs ``k`` cache-line transfers (``list_lock_lines``,
    ``barn_lock_lines``, ``zone_lock_lines``), each ``line_remote_ns`` for a lock on another
    node and ``line_local_ns`` on the rep's own: the critical section touches the lock word
    and the list heads, counters and links the previous holder wrote.  They move only when
    that holder was another CPU: ``k`` times :func:`slabtune.model.cost.foreign_holder_fraction`
    (a CPU alone on its lock moves none).
    The objects a sheaf refill or flush moves are priced outside the lock
    (:func:`slabtune.model.cost.base_ns_per_op`).

    SLAB (``cfg.objects_under_list_lock``) moves the objects of a refill, flush or drain
    under the list_lock (cache_alloc_refill(), cache_flusharray(), __drain_alien_cache(),
    drain_array(): transfer_objects() or free_block() with ``n->list_lock`` held), so each
    of rep r's list_lock sections is longer by ``array_object_ns`` (:func:`with_object_price`)
    times the objects it
    moves per acquisition; that time is also returned in ``nested``.
    SLAB's alien locks (the barn classes of slab_dynamics.slub_view()) also hold the drains
    done under them: 6.1 __cache_free_alien() and reap_alien() (3.1 cache_free_alien(),
    reap_alien()) call __drain_alien_cache() with ``alien->lock`` held, which takes the
    object's node's list_lock inside.  Each section of rep r is longer by
    ``cfg.alien_drains`` (drains per alien lock acquisition) times r's mean service (hold
    and lines) of another node's list_lock; the list_lock wait inside is left out.  That
    time is the holder's own already (its list_lock acquisitions; the objects in
    base_ns_per_op), so it is returned apart, as ``nested (R,)``: ns per op that
    :func:`compute` takes off the base time.

    Returns ``acq (R, 3N)``, ``line (R, 3N)``, ``hold (3N,)``, ``multiplicity (3N,)``,
    ``nested (R,)``.
    """
    c = with_object_price(cfg, c)
    n_nodes = cfg.node_weight.shape[-1]
    nodes = jnp.arange(n_nodes)
    own = jnp.asarray(cfg.rep_node)[:, None] == nodes[None, :]          # (R, N)
    mem = jnp.asarray(cfg.rep_mem_node)[:, None] == nodes[None, :]
    memless = (jnp.asarray(cfg.rep_memoryless) > 0)[:, None]
    ev = priced_events(counters, cfg.sheaf_capacity, cfg.remote_free_lines)
    ll = ev.list_lock[:, None]
    ll_remote = per_op(counters, "list_lock_remote")[:, None]
    by_node = _f(counters.list_lock_node)[None, :]
    others = jnp.where(own, 0.0, by_node)
    spread = _safe_div(others, jnp.sum(others, axis=1, keepdims=True))
    spread = jnp.where(jnp.sum(others, axis=1, keepdims=True) > 0, spread, _f(mem & ~own))
    list_acq = jnp.where(memless, ll * _f(mem), (ll - ll_remote) * _f(own) + ll_remote * spread)
    barn_acq = ev.barn_lock[:, None] * _f(own)
    zone_acq = cost.zone_lock_per_call(cfg.order, pcp_max, c) * (
        ev.rates.slab_alloc[:, None] * _f(mem)
        + ev.rates.slab_free[:, None] * slab_free_nodes(list_acq, mem))
    acq = jnp.concatenate([list_acq, barn_acq, zone_acq], axis=1)
    remote = jnp.tile(~own, (1, len(LOCK_KINDS)))
    mult = jnp.tile(jnp.maximum(_f(cfg.node_weight), 1.0), len(LOCK_KINDS))
    # A critical section moves k lines the previous holder wrote (lock word, list heads,
    # counters, links): k transfers, each local or cross-node like the lock's own line,
    # when that holder was another CPU (counts per rep stand in for the arrivals: the
    # duty of cost.foreign_holder_fraction is ops per step, the steps cancel).
    barn_hold, barn_lines = barn_section(cfg.alien_lock_lines, c)
    zone_blocks = cost.zone_blocks_per_acquisition(cfg.order, pcp_max, c)
    lines = jnp.repeat(cost.lock_line_counts(c, zone_blocks).at[1].set(barn_lines), n_nodes)
    moved = cost.foreign_holder_fraction(acq, cfg.rep_weight, mult, _f(counters.ops))
    line = lines[None, :] * moved * jnp.where(remote, c.line_remote_ns, c.line_local_ns)
    hold = jnp.concatenate([jnp.full((n_nodes,), c.list_lock_hold_ns),
                            jnp.full((n_nodes,), barn_hold),
                            jnp.full((n_nodes,), cost.zone_hold_ns(cfg.order, pcp_max, c))])
    # SLAB moves its batches under the list_lock (refill, flush, alien and reap drains)
    moved_ns = _f(cfg.objects_under_list_lock) * c.sheaf_object_ns * _safe_div(
        ev.rates.sheaf_objects_moved, ll[:, 0])                              # (R,)
    line = line.at[:, :n_nodes].add(moved_ns[:, None] * _f(list_acq > 0))
    far = _f(~own)
    far_acq = list_acq * far
    far_service = _safe_div(jnp.sum(far_acq * (hold[None, :n_nodes] + line[:, :n_nodes]),
                                    axis=1), jnp.sum(far_acq, axis=1))
    drain = _f(cfg.alien_drains) * far_service                              # (R,)
    line = line.at[:, n_nodes:2 * n_nodes].add(drain[:, None] * _f(barn_acq > 0))
    nested = jnp.sum(barn_acq, axis=1) * drain + jnp.sum(list_acq, axis=1) * moved_ns
    return acq, line, hold, mult, nested


def slab_free_nodes(list_acq, mem):
    """(R, N): the node classes whose zones get rep r's slab frees, as shares.

    A freed slab's pages go back to their own zone (6.1 and 7.2 __free_slab() ->
    __free_pages(): free_unref_page() puts them on the freeing CPU's per-CPU list of the
    page's zone, whose drain takes that zone's lock), so a CPU that empties slabs of
    another node loads that node's zone lock, across the interconnect.  The simulation
    counts slab frees per rep, not per node; SLUB empties and discards a slab in a section
    of the slab's own node's list_lock (6.1 __slab_free()'s slab_empty and
    unfreeze_partials(), 7.2 __slab_free()'s slab_empty), so the rep's frees are spread
    like its list_lock acquisitions (an approximation: every section of one rep is taken
    as equally likely to discard).  A rep that takes no list_lock frees on its memory
    node."""
    total = jnp.sum(list_acq, axis=1, keepdims=True)
    return jnp.where(total > 0, _safe_div(list_acq, total), _f(mem))


def alien_section(lines, c: cost.CostParams):
    """Hold and lines of one section of a SLAB alien lock: 6.1 __cache_free_alien() / 3.1
    cache_free_alien() hold it for one pointer push, ``ac->entry[ac->avail++] = objp``,
    the push a fast free does on the CPU's own array (``free_fast_ns``), on an alien
    array whose sections touch ``lines`` cache lines (slab.alien_section_lines())."""
    return c.free_fast_ns, _f(lines)


def barn_section(alien_lock_lines, c: cost.CostParams):
    """Hold and lines of one section of the barn lock classes: SLUB's barn
    (``barn_lock_hold_ns``, ``barn_lock_lines``), or, for SLAB's counters
    (``SimConfig.alien_lock_lines`` above 0, slab_dynamics.slub_view()), an alien lock
    (:func:`alien_section`)."""
    is_alien = _f(alien_lock_lines) > 0
    hold, lines = alien_section(alien_lock_lines, c)
    return (jnp.where(is_alien, hold, c.barn_lock_hold_ns),
            jnp.where(is_alien, lines, c.barn_lock_lines))


def coupling(workload):
    """(R, R) bool: the reps each rep's pace is tied to, because they hand objects to each
    other (``free_cum``: rep j frees objects rep r allocates), closed transitively over
    the active reps.  A sender and its receivers are one group (hackbench: the receiver
    frees the skb its sender allocated; block I/O: the completing CPU frees the submitter's
    bio); CPUs that only free their own objects, or groups on different nodes that never
    exchange an object, are groups of their own and go at their own pace
    (:func:`slabtune.model.cost.solve`)."""
    fc = jnp.asarray(workload.free_cum)
    r = fc.shape[-1]
    gives = jnp.diff(fc, axis=-1, prepend=jnp.zeros_like(fc[..., :1])) > 0
    active = jnp.asarray(workload.active) > 0
    linked = (gives | jnp.swapaxes(gives, -1, -2)) & active[..., :, None] & active[..., None, :]
    reach = (linked | jnp.eye(r, dtype=bool)).astype(jnp.float32)
    for _ in range(max(r - 1, 1).bit_length()):          # paths of up to r - 1 hops
        reach = (reach @ reach > 0).astype(jnp.float32)
    return reach > 0


def kept_scale(cfg):
    """Per node class (N,): real empty slabs kept on one of the class's nodes per empty
    slab on the model's list.  A class's list sums ``list_nodes`` nodes' lists and keeps
    empty slabs up to ``min_partial`` for each of them
    (:func:`slabtune.model.dynamics.node_min_partial`), where each real node keeps up to
    min_partial (6.1 to 7.2 __slab_free(), the per-CPU partial drain), so one kept slab of
    the model's is ``1 / list_nodes`` of a node's: 1 where a class's reps sit on one node
    (and in SLAB's view)."""
    return 1.0 / jnp.maximum(_f(cfg.list_nodes), 1.0)


def memory(counters, cfg, object_size):
    """Bytes held machine-wide: (total, live, in-use slabs, empty kept, per-CPU partial,
    sheaves, barns)."""
    w = _f(cfg.rep_weight)
    active = w > 0
    n_nodes = cfg.node_weight.shape[-1]
    mem = jnp.asarray(cfg.rep_mem_node)[:, None] == jnp.arange(n_nodes)[None, :]
    reps_on = jnp.sum(_f(mem & active[:, None]), axis=0)
    cpus_on = jnp.sum(_f(mem) * w[:, None], axis=0)
    cpu_scale = _safe_div(cpus_on, reps_on)
    node_scale = _f(cfg.node_weight)
    slab = _f(jnp.left_shift(jnp.asarray(profiles.PAGE_SIZE, jnp.int32), cfg.order))
    size = _f(object_size)
    total_slabs = _f(counters.slabs_total)
    empty = _f(counters.empty_slabs_kept)
    empty_b = jnp.sum(empty * kept_scale(cfg) * node_scale) * slab
    following_b = jnp.sum((total_slabs - empty) * cpu_scale) * slab
    cpu_partial_b = jnp.sum(_f(counters.cpu_partial_slabs_held) * w) * slab
    sheaf_b = jnp.sum(_f(counters.sheaf_objects_held) * w) * size
    barn_b = jnp.sum(_f(counters.barn_objects_held) * node_scale) * size
    live_b = jnp.sum(_f(counters.objects_inuse) * w) * size
    total_b = empty_b + following_b
    inuse_b = jnp.maximum(following_b - cpu_partial_b, 0.0)
    return total_b, live_b, inuse_b, empty_b, cpu_partial_b, sheaf_b, barn_b


def compute(counters, cfg, c: cost.CostParams, *, pcp_max, object_size, steps,
            other_ns=0.0) -> Metrics:
    """All metrics of one configuration.

    ``pcp_max``: :func:`slabtune.model.cost.pcp_max_order` of the profile; ``object_size``:
    bytes of one object (for live bytes; the slab stride is in the slab geometry);
    ``steps``: simulated steps (to turn op counts into a duty per step); ``other_ns``: the
    workload's own work per op (scalar or (R,)), which paces lock arrivals but is not
    allocator cost.
    """
    w = _f(cfg.rep_weight)
    ops = _f(counters.ops)
    wops = jnp.sum(w * ops)
    wsum = lambda x: jnp.sum(w * _f(x))  # noqa: E731
    kop = lambda x: per_kop(counters, w, x)  # noqa: E731

    rates = priced_events(counters, cfg.sheaf_capacity, cfg.remote_free_lines).rates
    alloc_ns = cost.base_ns_per_op(rates, cfg.order, cfg.objs_per_slab, pcp_max,
                                   with_object_price(cfg, c))
    other = jnp.broadcast_to(_f(other_ns), alloc_ns.shape)
    acq, line, hold, mult, nested = lock_sections(counters, cfg, pcp_max, c)
    duty = ops / jnp.maximum(_f(steps), 1.0)
    sol = cost.solve(alloc_ns - nested + other, acq, hold, line, w, mult, c.queueing,
                     duty=duty,
                     coupling=coupling(cfg.workload))
    alloc_t = sol.t - other
    n_nodes = cfg.node_weight.shape[-1]
    ll_acq = acq[:, :n_nodes]
    ll_weight = w[:, None] * ops[:, None] * ll_acq
    ll_wait = _safe_div(jnp.sum(ll_weight * sol.wait[:, :n_nodes]), jnp.sum(ll_weight))

    page_allocs = kop(counters.slab_alloc)
    by_order = jnp.where(jnp.arange(N_ORDERS) == cfg.order, page_allocs, 0.0)
    total_b, live_b, inuse_b, empty_b, cpp_b, sheaf_b, barn_b = memory(
        counters, cfg, object_size)
    zone_calls = per_op(counters, "slab_alloc") + per_op(counters, "slab_free")
    return Metrics(
        # of the fast and slow paths (SLUB_STATS' ratio): the callers' operations, and
        # on v6.18 opt-in caches also the objects sheaf refills and flushes take through
        # the CPU slab (dynamics._count_allocs, _free_run)
        alloc_fastpath_frac=_safe_div(wsum(counters.alloc_fast),
                                      wsum(counters.alloc_fast + counters.alloc_slow)),
        free_fastpath_frac=_safe_div(wsum(counters.free_fast),
                                     wsum(counters.free_fast + counters.free_slow)),
        alloc_slowpath_per_kop=kop(counters.alloc_slow),
        free_slowpath_per_kop=kop(counters.free_slow),
        remote_frees_per_kop=kop(counters.remote_free),
        slab_allocs_per_kop=page_allocs,
        slab_frees_per_kop=kop(counters.slab_free),
        page_allocs_per_kop_by_order=by_order,
        list_lock_per_kop=kop(counters.list_lock),
        list_lock_remote_per_kop=kop(counters.list_lock_remote),
        barn_lock_per_kop=kop(counters.barn_get + counters.barn_put
                                  + counters.barn_get_fail + counters.barn_put_fail),
        zone_lock_per_kop=1000.0 * _safe_div(
            jnp.sum(w * ops * zone_calls * cost.zone_lock_per_call(cfg.order, pcp_max, c)), wops),
        list_lock_rho=jnp.max(sol.rho[:n_nodes]),
        barn_lock_rho=jnp.max(sol.rho[n_nodes:2 * n_nodes]),
        zone_lock_rho=jnp.max(sol.rho[2 * n_nodes:]),
        list_lock_wait_ns=ll_wait,
        memory_bytes=total_b,
        live_bytes=live_b,
        inuse_slab_bytes=inuse_b,
        empty_kept_bytes=empty_b,
        cpu_partial_bytes=cpp_b,
        sheaf_bytes=sheaf_b,
        barn_bytes=barn_b,
        overhead_frac=jnp.where(live_b > 0, _safe_div(total_b, live_b) - 1.0, 0.0),
        ns_per_op=2.0 * _safe_div(jnp.sum(w * ops * alloc_t), wops),
        total_ns_per_op=2.0 * _safe_div(jnp.sum(w * ops * sol.t), wops),
        throughput_ops_per_us=sol.throughput * 1000.0,
        alloc_throughput_per_us=1000.0 * jnp.sum(w * _f(counters.allocs) / sol.pace)
        / jnp.maximum(_f(steps), 1.0),
        fixed_point_residual=sol.residual,
    )


#: Metrics a sweep can store as one column each (everything but the by-order vector).
SCALAR_METRICS: tuple[str, ...] = tuple(
    f for f in Metrics._fields if f != "page_allocs_per_kop_by_order")

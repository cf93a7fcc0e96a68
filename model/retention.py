"""Memory a cache retains beyond its live objects, from structure alone: slab leftovers, the
slabs each CPU keeps (CPU slab, per-CPU partial list), the empty slabs a node keeps up to
min_partial, sheaves and barns, in a churning (``steady``) or finished (``drained``)
workload (docs/MODEL.md, "Memory after a workload").
"""


from __future__ import annotations

import jax.numpy as jnp

from slabtune.errors import SlabtuneError
from slabtune.model import policy, profiles

_F32 = jnp.float32


#: States a memory prediction can describe (:func:`structural_memory`): ``steady``, a
#: workload churning its live set (the tuner's fleet); ``drained``, the end of a workload
#: that allocated and freed across CPUs (validation's after-dump).
MEMORY_STATES = ("steady", "drained")
#: Fill of a node's empty-slab list, as a share of min_partial, per memory state.  An empty
#: slab stays on a node only while the node has fewer than min_partial partial slabs:
#: __slab_free(), __unfreeze_partials() and deactivate_slab() discard it (discard_slab())
#: once n->nr_partial >= s->min_partial, so the count stops at the limit.
#: ``steady``: get_partial_node() hands empty slabs back to allocating CPUs (a new slab is
#: allocated only once the node list is empty), so the count walks between 0 and the limit,
#: kept at both ends, and is on average half way.  ``drained``: after a workload's last
#: frees nothing allocates to take them back, and every slab that empties beyond the CPUs'
#: own lists lands on its node's list until the limit: the list ends full (bounded by the
#: slabs the workload touched, :func:`bound_by_traffic`).
LIST_FILL = {"steady": 0.5, "drained": 1.0}


def per_cpu_partial_list_slabs(cpu_partial_slabs):
    """Mean length, in slabs, of one CPU's per-CPU partial list under traffic that feeds
    and takes it alike (``C`` = ``cpu_partial_slabs``; 0 where the profile has none).

    A free into a full slab freezes it onto the freeing CPU's list (__slab_free() ->
    put_cpu_partial()); a CPU whose CPU slab runs out takes the next one off its list
    (___slab_alloc(), slub_percpu_partial()).  put_cpu_partial() finding the list at
    C slabs moves the whole list to the node (__unfreeze_partials()) and starts a new one
    with the slab at hand, so the length walks up and down by one, is kept at 0, and
    restarts at 1 from C.  The stationary weights of such a walk are C at 0 and C + 1 - k
    at k = 1..C (the restart's flow crosses every step from C down to 1), so the mean is
    (C + 1)(C + 2) / (3 (C + 3)): 2.4 slabs for C = 7, not the 3.5 of a list found half way
    at a random moment.  (get_partial_node() refilling an empty list from the node's slabs
    pushes it up; the model leaves that out.)
    """
    c = jnp.asarray(cpu_partial_slabs, _F32)
    return jnp.where(c > 0, (c + 1.0) * (c + 2.0) / (3.0 * (c + 3.0)), 0.0)


def retained_free_fraction(state: str) -> float:
    """Free share of the slabs a CPU retains (its CPU slab and per-CPU partial slabs).

    ``steady``: half, slub_set_cpu_partial()'s own assumption (cpu_partial_slabs =
    DIV_ROUND_UP(2 * cpu_partial, objs_per_slab): per-CPU partial slabs are half full).
    ``drained``: all of it: once a workload has freed what it allocated, the slabs a CPU
    retains stay frozen on its lists however empty they get (__slab_free() of a frozen slab
    only returns the object; only the node lists discard empty slabs), so they are whole
    slabs with (nearly) nothing allocated.
    """
    return {"steady": 0.5, "drained": 1.0}[check_memory_state(state)]


def check_memory_state(state: str) -> str:
    """``state`` if it is one of :data:`MEMORY_STATES`, else a one-line error."""
    if state not in MEMORY_STATES:
        raise SlabtuneError(f"state: {state!r} is not one of {', '.join(MEMORY_STATES)}")
    return state


def per_cpu_retained_slabs(cpu_partial_slabs, cpu_slab=True):
    """Slabs one CPU that uses a cache retains: its CPU slab (``cpu_slab``: none from v7.0,
    :attr:`~slabtune.model.profiles.KernelProfile.has_cpu_slab`) plus its per-CPU partial
    list (:func:`per_cpu_partial_list_slabs`)."""
    return jnp.asarray(cpu_slab, _F32) + per_cpu_partial_list_slabs(cpu_partial_slabs)


def node_retained_slabs(min_partial, state: str = "steady"):
    """Empty slabs one node with memory keeps in memory state ``state``: its
    :data:`LIST_FILL` share of ``min_partial`` (discard_slab() beyond it)."""
    return LIST_FILL[check_memory_state(state)] * jnp.asarray(min_partial, _F32)


def bound_by_traffic(per_cpu, node, objs_per_slab, traffic):
    """(per-CPU, node) retained slabs no more than the slabs ``traffic`` objects could have
    touched, ceil(traffic / objs_per_slab), per-CPU slabs first: a slab reaches a CPU's
    lists only by an allocation from it or a free into it, and reaches a node's empty list
    only from there, so a cache that few objects passed through during a workload cannot hold
    every CPU's full share.  ``traffic`` inf (the workload churns the cache) leaves both."""
    touched = jnp.ceil(jnp.asarray(traffic, _F32) / jnp.maximum(objs_per_slab, 1.0))
    pc = jnp.minimum(per_cpu, touched)
    return pc, jnp.minimum(node, jnp.maximum(touched - pc, 0.0))


def structural_memory(st: policy.Structure, fa, barn_full, barn_empty, barns_where,
                      state: str = "steady", traffic=None, cpu_slab=True, shared=None):
    """Overhead bytes and live bytes per (B, T, W, K) point (see the module docstring).

    Retention, in slabs of ``slab_bytes(order)``: every CPU holds
    :func:`per_cpu_retained_slabs`, of which :func:`retained_free_fraction` (``state``) is
    free; every node with memory holds :func:`node_retained_slabs` empty slabs (both by
    ``state``).  ``traffic``
    ((K,) objects allocated during the workload per cache, inf for a cache the workload
    churns; None: every cache churned) bounds both (:func:`bound_by_traffic`); the tuner's
    steady fleet passes none.  ``cpu_slab``: whether the profile's caches have a CPU slab
    (:attr:`~slabtune.model.profiles.KernelProfile.has_cpu_slab`; v7.x: none, the sheaves
    hold what it held).  Live objects pay their slabs' ``leftover`` share.  ``shared``
    (bool, broadcastable to (B, T, W, K); None: none): caches merged into another
    (model/merging.py), whose objects live in that cache's slabs: they pay their leftover
    share, and the retained slabs, sheaves and barns are the other cache's, counted there.
    """
    f = lambda x: jnp.asarray(x, _F32)  # noqa: E731
    t = lambda x: x[None, :, None, None]  # noqa: E731
    s = lambda x: x[:, :, None, :]  # noqa: E731   (B,T,K) -> (B,T,1,K)
    size = f(fa.size)[None, None, None, :]
    cpus = t(fa.cpus_mem + fa.cpus_ml)
    live_objs = cpus * fa.live_per_cpu[None, None, :, :]
    n = jnp.maximum(f(s(st.objs_per_slab)), 1.0)
    slab = f(policy.slab_bytes(s(st.order)))
    leftover = live_objs / n * f(s(st.leftover))
    per_cpu = cpus * per_cpu_retained_slabs(s(st.cpu_partial_slabs), cpu_slab)
    node = t(fa.mem_nodes) * node_retained_slabs(s(st.min_partial), state)
    if traffic is not None:
        per_cpu, node = bound_by_traffic(per_cpu, node, n,
                                         f(traffic)[None, None, None, :])
    cpu_retained = per_cpu * slab * retained_free_fraction(state)
    node_empty = node * slab
    cap = f(s(st.sheaf_capacity))
    sheaf_struct = f(policy.kmalloc_size_roundup(profiles.SHEAF_HEADER_BYTES
                                                 + profiles.POINTER_BYTES * s(st.sheaf_capacity)))
    sheaf_struct = jnp.where(cap > 0, sheaf_struct, 0.0)
    per_cpu_sheaves = cpus * (2.0 * sheaf_struct + cap * size)
    barn_nodes = jnp.where(barns_where == 2, t(fa.all_nodes), t(fa.mem_nodes))
    bf = f(barn_full)[:, None, None, None]
    be = f(barn_empty)[:, None, None, None]
    barns = barn_nodes * (bf / 2.0 * (sheaf_struct + cap * size) + be / 2.0 * sheaf_struct)
    barns = jnp.where(cap > 0, barns, 0.0)
    retained = cpu_retained + node_empty + per_cpu_sheaves + barns
    if shared is not None:
        retained = jnp.where(shared, 0.0, retained)
    return leftover + retained, live_objs * size

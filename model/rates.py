"""Per-operation event rates from structure alone: the slow-path, lock and slab-allocation
rates the structural time objective prices (docs/MODEL.md, "Structural rates"). A proxy for
the dynamics counters, named rule by rule so the dynamics set can replace it.
"""


from __future__ import annotations

import jax.numpy as jnp

from slabtune.model import cost, policy

_F32 = jnp.float32


#: Barn hit rate proxy: a barn with ``f`` full (or empty) sheaves serves a sheaf exchange
#: with probability f / (f + BARN_HIT_HALF); 10 sheaves give 5/6.
BARN_HIT_HALF = 2.0
#: Kept empty slabs absorb slab allocations: of the slabs a workload drains to empty, a node
#: keeping ``m`` empty slabs hands back to the page allocator 1 / (1 + m / MIN_PARTIAL_SCALE).
MIN_PARTIAL_SCALE = 4.0


def structural_rates(st: policy.Structure, prof: policy.ProfileArrays, barn_full, ff, churn,
                     memoryless: bool):
    """Per-op event rates and lock acquisitions of one representative CPU, from structure.

    Half of all ops are allocs, half frees.  Proxy rules (named so they can be replaced by
    the dynamics counters):

    * no sheaves: an alloc slow path (___slab_alloc) every n/2 allocs (a slab taken with half
      its objects free; every alloc for n <= 2); a node list_lock acquisition per
      (n/2 + cpu_partial) allocs, since per-CPU partial slabs refill without the lock; a
      share ``ff`` of frees go to a foreign slab (__slab_free), and take the list_lock once
      per 2/(n + 2 cpu_partial) of them, the per-CPU partial list draining (put_partials)
      once per cpu_partial of them;
    * sheaves (capacity c): a sheaf exchange per c ops on each side; half come from the
      spare, the rest from the barn (barn lock) which hits with the proxy above, misses
      refill or flush c objects under the list_lock;
    * a CPU on a memoryless node without the numa_mem_id() fix takes every alloc through
      the slow path and list_lock (the 2010 penalty); where remote frees bypass sheaves and
      the CPU may not use them (v7.0 memoryless nodes), every free is a remote slow free;
    * slab allocations per alloc: churn / n / (1 + min_partial / MIN_PARTIAL_SCALE), and as
      many slab frees.

    Returns (OpRates, list_lock, barn_lock) acquisitions per op.
    """
    f = lambda x: jnp.asarray(x, _F32)  # noqa: E731
    n = jnp.maximum(f(st.objs_per_slab), 1.0)
    cp = f(st.cpu_partial)
    cap = f(st.sheaf_capacity)
    has_sheaf = cap > 0
    capm = jnp.maximum(cap, 1.0)
    barn_hit = f(barn_full) / (f(barn_full) + BARN_HIT_HALF)
    if memoryless:
        no_fix = prof.memoryless_fallback == 0
        bypass = (prof.remote_free_bypasses_sheaf == 1) & (prof.memoryless_cpus_use_sheaves == 0)
        barn_hit = jnp.where(prof.barns == 2, barn_hit, 0.0)  # barns only on memory nodes
    else:
        no_fix = jnp.asarray(False)
        bypass = jnp.asarray(False)

    # allocs (per alloc); an alloc takes at most one slow path, so a slab of one object
    # (n = 1: 2 / n would say two) makes every alloc slow, not more
    a_slow_ns = jnp.where(has_sheaf, 0.0, jnp.minimum(2.0 / n, 1.0))
    a_lock_ns = jnp.where(has_sheaf, 0.0, 1.0 / (n / 2.0 + cp))
    a_swap = jnp.where(has_sheaf, 1.0 / capm, 0.0)
    a_barn = jnp.where(has_sheaf, 0.5 / capm, 0.0)
    a_lock_sh = jnp.where(has_sheaf, 0.5 * (1.0 - barn_hit) / capm, 0.0)
    a_moved = jnp.where(has_sheaf, 0.5 * (1.0 - barn_hit), 0.0)
    a_slow = jnp.where(no_fix, 1.0, a_slow_ns + a_lock_sh)
    a_lock = jnp.where(no_fix, 1.0, a_lock_ns + a_lock_sh)
    a_fast = 1.0 - jnp.minimum(a_slow, 1.0)

    # frees (per free)
    ff = f(ff)
    f_slow_ns = ff
    f_lock_ns = ff * 2.0 / (n + 2.0 * cp)
    f_drain = jnp.where(cp > 0, ff / jnp.maximum(cp, 1.0), 0.0)
    f_lock_sh = 0.5 * (1.0 - barn_hit) / capm
    sheaf_free = has_sheaf & ~bypass
    f_slow = jnp.where(sheaf_free, f_lock_sh, jnp.where(bypass & has_sheaf, 1.0, f_slow_ns))
    f_lock = jnp.where(sheaf_free, f_lock_sh, f_lock_ns)
    f_swap = jnp.where(sheaf_free, 1.0 / capm, 0.0)
    f_barn = jnp.where(sheaf_free, 0.5 / capm, 0.0)
    f_moved = jnp.where(sheaf_free, 0.5 * (1.0 - barn_hit), 0.0)
    f_fast = 1.0 - jnp.minimum(f_slow, 1.0)
    remote = jnp.where(bypass & has_sheaf, 1.0, 0.0) + jnp.where(no_fix, 1.0, 0.0)

    slab_alloc = f(churn) / n / (1.0 + f(st.min_partial) / MIN_PARTIAL_SCALE)
    rates = cost.OpRates(
        alloc_fast=0.5 * a_fast, free_fast=0.5 * f_fast,
        alloc_slow=0.5 * a_slow, free_slow=0.5 * f_slow,
        remote_free=0.5 * remote,
        sheaf_swap=0.5 * (a_swap + f_swap),
        sheaf_objects_moved=0.5 * (a_moved + f_moved),
        cpu_partial_drain=0.5 * f_drain,
        slab_alloc=0.5 * slab_alloc, slab_free=0.5 * slab_alloc,
    )
    return rates, 0.5 * (a_lock + f_lock), 0.5 * (a_barn + f_barn)

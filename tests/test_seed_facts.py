"""The kernel facts quoted in the seeds (shared/seeds/), reproduced by the model.

Each expected value is worked out here from mm/slub.c of the era, with the arithmetic in a
comment, and checked against both the JAX formulas (slabtune.model.policy) and the scalar
reference (slabtune.model.reference).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

from slabtune.model import policy, reference
from slabtune.model.profiles import PROFILES

#: One compiled scalar structure() serves every call below (all arguments are traced).
_jit_structure = jax.jit(policy.structure)


def structure(size: int, possible: int, present: int, online: int, profile: str,
              **kw) -> dict[str, int]:
    """One cache under one profile, from JAX and from the reference (which must agree)."""
    prof = PROFILES[profile]
    # Pass every keyword (as int32 scalars) so that all calls share one trace.
    args = dict(min_order=0, max_order=3, min_objects=0, early=False, is_kmalloc=False,
                is_bootstrap=False, explicit_sheaf=0)
    args.update(kw)
    traced = {k: jnp.int32(v) for k, v in args.items()}
    out = _jit_structure(jnp.int32(size), jnp.int32(possible), jnp.int32(present),
                         jnp.int32(online), policy.profile_arrays(prof), **traced)
    got = {f: int(getattr(out, f)) for f in reference.STRUCTURE_FIELDS}
    want = reference.structure(size, possible, present, online, prof, **kw)
    assert got == want, f"{profile} size {size}: jax {got} != reference {want}"
    return got


# ------------------------------------------------------- seed slub-order-nr-cpus-2021


@pytest.mark.parametrize("cpus", [8, 64, 224])
def test_v5_11_early_kmalloc_caches_see_one_cpu(cpus):
    # v5.11 used num_online_cpus(), which is 1 while start_kernel creates kmalloc caches:
    # min_objects = 4 * (fls(1) + 1) = 8, whatever the machine.
    # kmalloc-512: 8 * 512 = 4096 -> get_order = 0; 4096 % 512 = 0 <= 4096/16 -> order 0.
    s = structure(512, cpus, cpus, cpus, "v5.11", early=True)
    assert (s["nr_cpus"], s["min_objects"], s["order"], s["objs_per_slab"]) == (1, 8, 0, 8)
    # kmalloc-256: 8 * 256 = 2048 -> order 0; kmalloc-1k: 8 * 1024 = 8192 -> order 1;
    # kmalloc-2k: 16 KiB -> order 2; kmalloc-4k: cap 32768/4096 = 8, 32 KiB -> order 3.
    assert [structure(sz, cpus, cpus, cpus, "v5.11", early=True)["order"]
            for sz in (256, 1024, 2048, 4096)] == [0, 1, 2, 3]


@pytest.mark.parametrize("cpus", [64, 100, 127])
def test_v5_10_on_64_to_127_cpus_gives_kmalloc_512_order_2(cpus):
    # v5.10: nr_cpu_ids; fls(64..127) = 7 -> min_objects = 4 * 8 = 32 (cap 32768/512 = 64).
    # 32 * 512 = 16384 -> get_order = 2; 16384 % 512 = 0 -> order 2 ("kmalloc-512 goes from
    # order-0 (vanilla) to order-2 with the revert").
    s = structure(512, cpus, cpus, cpus, "v5.10")
    assert (s["nr_cpus"], s["min_objects"], s["order"], s["objs_per_slab"]) == (cpus, 32, 2, 32)
    # The same machine under v5.11 (early kmalloc cache) falls to order 0.
    assert structure(512, cpus, cpus, cpus, "v5.11", early=True)["order"] == 0


def test_v5_11_caches_created_after_smp_boot_see_online_cpus():
    # A cache created once 224 CPUs are online: fls(224) = 8 -> min_objects = 36;
    # 36 * 512 = 18432 -> get_order = 3; 32768 % 512 = 0 -> order 3.
    s = structure(512, 224, 224, 224, "v5.11", early=False)
    assert (s["nr_cpus"], s["min_objects"], s["order"]) == (224, 36, 3)


def test_v5_12_fix_uses_present_cpus_for_early_caches():
    # v5.12+ (v6.1 profile): num_present_cpus() = 224 even before onlining on x86, so the
    # kmalloc caches get min_objects 36 again -> kmalloc-512 order 3 as in v5.10.
    s = structure(512, 224, 224, 1, "v6.1", early=True)
    assert (s["nr_cpus"], s["min_objects"], s["order"]) == (224, 36, 3)
    assert structure(512, 224, 224, 224, "v5.10")["order"] == 3


@pytest.mark.parametrize("profile", ["v6.1", "v6.18"])
def test_present_1_falls_back_to_possible(profile):
    # num_present_cpus() <= 1 (arm64 marks CPUs present as it onlines them): nr_cpu_ids.
    # 64 possible: fls(64) = 7 -> min_objects 32 -> kmalloc-512 order 2 (16384 % 512 = 0).
    s = structure(512, 64, 1, 1, profile, early=True)
    assert (s["nr_cpus"], s["min_objects"], s["order"]) == (64, 32, 2)
    # present = 2 is trusted: fls(2) = 2 -> min_objects 12 -> 6144 -> order 1.
    s = structure(512, 64, 2, 2, profile)
    assert (s["nr_cpus"], s["min_objects"], s["order"]) == (2, 12, 1)


# ------------------------------------------------ seed slub-lockless-slowpaths-netperf-2011


def test_v3_1_on_16_cpus_netperf_orders_and_min_partial():
    # v3.1: nr_cpu_ids = 16 -> fls(16) = 5 -> min_objects = 4 * 6 = 24.
    # kmalloc-256: 24 * 256 = 6144 -> get_order 1; 8192 % 256 = 0 -> order 1.
    # kmalloc-1k: cap 32768/1024 = 32 -> 24; 24 KiB -> order 3; 32768 % 1024 = 0 -> 3.
    # kmalloc-4k: cap 32768/4096 = 8 -> 8; 32 KiB -> order 3.
    # min_partial = clamp(ilog2(size), 5, 10): ilog2 8, 10, 12 -> 8, 10, 10.
    got = {sz: structure(sz, 16, 16, 16, "v3.1") for sz in (256, 1024, 4096)}
    assert {sz: (s["order"], s["min_partial"]) for sz, s in got.items()} == {
        256: (1, 8), 1024: (3, 10), 4096: (3, 10)}
    # v3.1 predates per-CPU partial lists (v3.2) and sheaves.
    assert all(s["cpu_partial"] == 0 and s["sheaf_capacity"] == 0 for s in got.values())


# ------------------------------------------------------- seed slub-dynamic-min-partial-2008


@pytest.mark.parametrize("size,v2627,v31,current", [
    # v2.6.27: static MIN_PARTIAL = 5.  v3.1: clamp(ilog2, 5, 10).  current: clamp(ilog2/2).
    (8, 5, 5, 5),            # ilog2 3 -> 5; 3 // 2 = 1 -> 5
    (256, 5, 8, 5),          # ilog2 8 -> 8; 4 -> 5
    (4096, 5, 10, 6),        # ilog2 12 -> 10; 6
    (16384, 5, 10, 7),       # ilog2 14 -> 10; 7
    (1 << 20, 5, 10, 10),    # ilog2 20 -> 10; 10
    (3 << 20 >> 1, 5, 10, 10),  # 1.5 MiB: ilog2 20 -> 10; 10
    (2 << 20, 5, 10, 10),    # ilog2 21 -> 10; 21 // 2 = 10
])
def test_min_partial_eras(size, v2627, v31, current):
    assert structure(size, 4, 4, 4, "v2.6.27")["min_partial"] == v2627
    assert structure(size, 4, 4, 4, "v3.1")["min_partial"] == v31
    for profile in ("v5.10", "v6.1", "v6.18", "v7.0"):
        assert structure(size, 4, 4, 4, profile)["min_partial"] == current


# ------------------------------------------------------------------- per-CPU partial lists


def test_cpu_partial_tables_and_slab_limit():
    # v5.16+ (v6.1): 52 objects for 256 <= size < 1024; kmalloc-512 on 64 CPUs is order 2
    # with 16384 / 512 = 32 objects -> DIV_ROUND_UP(2 * 52, 32) = 4 slabs.
    s = structure(512, 64, 64, 64, "v6.1")
    assert (s["cpu_partial"], s["objs_per_slab"], s["cpu_partial_slabs"]) == (52, 32, 4)
    # The ladder 6 / 24 / 52 / 120 (>= PAGE_SIZE, >= 1024, >= 256, smaller).
    assert [structure(sz, 64, 64, 64, "v6.18")["cpu_partial"]
            for sz in (4096, 1024, 256, 192)] == [6, 24, 52, 120]
    # Before v5.16 the object table was 2 / 6 / 13 / 30, and the limit counted free
    # objects (put_cpu_partial(): drain once pobjects > cpu_partial): kmalloc-512 at order
    # 3 (64 objects) holds 13 + 1 slabs of one free object each, where v5.16's rule would
    # give DIV_ROUND_UP(26, 64) = 1.
    assert [structure(sz, 64, 64, 64, "v5.10")["cpu_partial"]
            for sz in (4096, 1024, 256, 192)] == [2, 6, 13, 30]
    s = structure(512, 224, 224, 224, "v5.10")
    assert (s["order"], s["objs_per_slab"], s["cpu_partial_slabs"]) == (3, 64, 14)
    # v7.0 removed per-CPU partial lists.
    assert structure(512, 64, 64, 64, "v7.0")["cpu_partial"] == 0


# ------------------------------------------------------------------------------- sheaves


@pytest.mark.parametrize("size,capacity", [
    (4096, 4),    # 32 + 4*8 = 64 bytes -> kmalloc-64 -> (64 - 32) / 8 = 4
    (1024, 12),   # 32 + 12*8 = 128 -> kmalloc-128 -> 12
    (256, 28),    # 32 + 26*8 = 240 -> kmalloc-256 -> (256 - 32) / 8 = 28
    (64, 60),     # 32 + 60*8 = 512 -> kmalloc-512 -> 60
])
def test_v7_0_default_sheaf_capacity_fills_its_kmalloc_bucket(size, capacity):
    assert structure(size, 8, 8, 8, "v7.0")["sheaf_capacity"] == capacity
    assert structure(size, 8, 8, 8, "v7.1")["sheaf_capacity"] == capacity


def test_sheaf_opt_in_and_exclusions():
    # v6.18: only caches created with an explicit capacity (maple_node: 32, taken as is).
    assert structure(256, 8, 8, 8, "v6.18", explicit_sheaf=32)["sheaf_capacity"] == 32
    assert structure(256, 8, 8, 8, "v6.18")["sheaf_capacity"] == 0
    # v7.0: max(default, explicit): maple_node (256 bytes) max(28, 32) = 32; a 64-byte
    # cache asking for 32 keeps the default 60.
    assert structure(256, 8, 8, 8, "v7.0", explicit_sheaf=32)["sheaf_capacity"] == 32
    assert structure(64, 8, 8, 8, "v7.0", explicit_sheaf=32)["sheaf_capacity"] == 60
    # Bootstrap caches (SLAB_NO_SHEAVES) get none.  kmalloc caches are skipped by
    # "if (!is_kmalloc_cache(s))" in calculate_sizes() but get the default afterwards from
    # bootstrap_kmalloc_sheaves() in kmem_cache_init() (v7.0; a 7.2.13 guest shows
    # kmalloc-256 with 28: tests/data/guest-v7.2-*.csv).
    assert structure(256, 8, 8, 8, "v7.0", is_bootstrap=True)["sheaf_capacity"] == 0
    assert structure(256, 8, 8, 8, "v7.0", is_kmalloc=True)["sheaf_capacity"] == 28
    # Before v6.18 there are no sheaves at all.
    assert structure(256, 8, 8, 8, "v6.1", explicit_sheaf=32)["sheaf_capacity"] == 0


# ------------------------------------------------------------------ calculate_order edges


def test_max_objs_per_page_early_return():
    # slub_min_order=10 (which raises slub_max_order to 10) for an 8-byte cache:
    # order_objects(10, 8) = 524288 > 32767 -> get_order(8 * 32767 = 262136) - 1 = 6 - 1 = 5,
    # so 131072 / 8 = 16384 objects.
    s = structure(8, 4, 4, 4, "v6.1", min_order=10, max_order=10)
    assert (s["order"], s["objs_per_slab"], s["leftover"]) == (5, 16384, 0)
    # v2.6.27 counted objects in 16 bits: get_order(8 * 65535 = 524280) - 1 = 7 - 1 = 6.
    s = structure(8, 4, 4, 4, "v2.6.27", min_order=10, max_order=10)
    assert (s["order"], s["objs_per_slab"]) == (6, 32768)


def test_objects_per_slab_capped_at_max_objs_per_page():
    # v6.1 (decrement loop) checks MAX_OBJS_PER_PAGE at slub_min_order only: with
    # slub_min_objects=32767 and slub_max_order=10 an 8-byte cache starts at
    # get_order(32767 * 8) = 6, whose 262144 / 8 = 32768 objects exceed 32767.
    s = structure(8, 4, 4, 4, "v6.1", max_order=10, min_objects=32767)
    assert (s["order"], s["objs_per_slab"], s["leftover"]) == (6, 32767, 8)
    # v6.8+ checks at the starting order: 32768 > 32767 -> get_order(262136) - 1 = 5.
    s = structure(8, 4, 4, 4, "v6.18", max_order=10, min_objects=32767)
    assert (s["order"], s["objs_per_slab"]) == (5, 16384)


def test_fallbacks_for_objects_larger_than_max_order():
    # 2 MiB object, slub_max_order 3: order_objects(3, 2 MiB) = 0.
    # v6.1: min_objects capped to 0, the loop never runs; one object within max order
    # fails; then one object at any order: get_order(2 MiB) = 9.
    s = structure(2 << 20, 8, 8, 8, "v6.1")
    assert (s["min_objects"], s["order"], s["objs_per_slab"], s["leftover"]) == (0, 9, 1, 0)
    # v6.18: cap at least 1; every fraction fails from order 9 > 3 -> get_order(size) = 9.
    s = structure(2 << 20, 8, 8, 8, "v6.18")
    assert (s["min_objects"], s["order"]) == (1, 9)
    # 5000 bytes with slub_max_order 0: nothing fits one page -> get_order(5000) = 1.
    assert structure(5000, 8, 8, 8, "v6.18", max_order=0)["order"] == 1
    assert structure(5000, 8, 8, 8, "v6.1", max_order=0)["order"] == 1


def test_v6_8_accepts_half_waste_where_v6_1_backs_off_min_objects():
    # 1536-byte objects, slub_max_order 1, 8 CPUs: min_objects = 4 * (fls(8) + 1) = 20,
    # capped to 8192 / 1536 = 5.
    # v6.1: min_objects 5 -> get_order(7680) = 1; 8192 % 1536 = 512 <= 8192/16 -> order 1.
    # v6.18: the same start, same answer; both agree at order 1.
    assert structure(1536, 8, 8, 8, "v6.1", max_order=1)["order"] == 1
    assert structure(1536, 8, 8, 8, "v6.18", max_order=1)["order"] == 1
    # 3000 bytes, slub_max_order 1: cap 8192 / 3000 = 2 -> get_order(6000) = 1;
    # (min_objects 20 capped to 2) 8192 % 3000 = 2192 > 8192/4 = 2048 fails 1/16, 1/8, 1/4.
    # v6.1 then tries min_objects 1 ... via the single-object fallback: first order from
    # get_order(3000) = 0 whose leftover is <= slab/1: order 0 (4096 % 3000 = 1096).
    assert structure(3000, 8, 8, 8, "v6.1", max_order=1)["order"] == 0
    # v6.18 keeps the start order 1 and accepts 2192 <= 8192/2 at fraction 2 -> order 1.
    assert structure(3000, 8, 8, 8, "v6.18", max_order=1)["order"] == 1

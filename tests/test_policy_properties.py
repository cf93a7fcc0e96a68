"""Property tests: the vectorised JAX formulas equal the scalar kernel reference everywhere.

``slabtune.model.policy`` (masked array code) and ``slabtune.model.reference`` (literal
transcriptions of mm/slub.c loops) are written independently; any input on which they
differ is a bug in one of them.  The JAX side runs in batches through one compiled call,
so hundreds of configurations cost one dispatch.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slabtune.model import policy, reference
from slabtune.model.profiles import MAX_PAGE_ORDER, PROFILES, detect_profile

#: Every named profile, plus a 6.12 kernel (v6.1's rules with v6.8's single-pass order loop,
#: per-CPU partial lists still present): a combination no named profile has.
PROFILE_LIST = list(PROFILES.values()) + [detect_profile("6.12.0-27-cloud-amd64")]
STACKED = policy.stack_profiles(PROFILE_LIST)
MAX_SIZE = 2 << 20  # 2 MiB
MAX_CPUS = 8192
MAX_MIN_OBJECTS = 32767
BATCH = 256


class Config(NamedTuple):
    """One structural configuration: cache size, topology, boot parameters, profile."""

    size: int
    possible: int
    present: int
    online: int
    profile: int  # index into PROFILE_LIST
    min_order: int
    max_order: int
    min_objects: int
    early: bool
    is_kmalloc: bool
    is_bootstrap: bool
    explicit_sheaf: int


def couple_orders(min_order: int, max_order: int, min_parsed_last: bool) -> tuple[int, int]:
    """The boot-parameter coupling of setup_slub_min_order()/setup_slub_max_order():
    parsing slub_min_order raises slub_max_order to it, parsing slub_max_order lowers
    slub_min_order to it; whichever is parsed last wins."""
    if min_order > max_order:
        if min_parsed_last:
            max_order = min_order
        else:
            min_order = max_order
    return min_order, max_order


@jax.jit
def _jax_structure(cols: dict) -> policy.Structure:
    """policy.structure on a batch; each row picks its profile from the stacked table."""
    p = jax.tree.map(lambda field: field[cols["profile"]], STACKED)
    return policy.structure(
        cols["size"], cols["possible"], cols["present"], cols["online"], p,
        min_order=cols["min_order"], max_order=cols["max_order"],
        min_objects=cols["min_objects"], early=cols["early"], is_kmalloc=cols["is_kmalloc"],
        is_bootstrap=cols["is_bootstrap"], explicit_sheaf=cols["explicit_sheaf"],
    )


def _ref_structure(c: Config) -> dict[str, int]:
    return reference.structure(
        c.size, c.possible, c.present, c.online, PROFILE_LIST[c.profile],
        min_order=c.min_order, max_order=c.max_order, min_objects=c.min_objects,
        early=c.early, is_kmalloc=c.is_kmalloc, is_bootstrap=c.is_bootstrap,
        explicit_sheaf=c.explicit_sheaf,
    )


def _columns(configs: list[Config], pad_to: int) -> dict:
    """Struct-of-arrays for a batch, padded (by repeating the first row) to ``pad_to``."""
    rows = list(configs) + [configs[0]] * (pad_to - len(configs))
    return {
        name: jnp.asarray(np.array([getattr(r, name) for r in rows], dtype=np.int32))
        for name in Config._fields
    }


def assert_batch_matches(configs: list[Config]) -> None:
    """Evaluate ``configs`` with JAX (in BATCH-sized calls) and with the reference; every
    field of every row must be equal."""
    for start in range(0, len(configs), BATCH):
        chunk = configs[start:start + BATCH]
        out = _jax_structure(_columns(chunk, BATCH))
        got = {f: np.asarray(getattr(out, f)) for f in reference.STRUCTURE_FIELDS}
        for i, c in enumerate(chunk):
            want = _ref_structure(c)
            have = {f: int(got[f][i]) for f in reference.STRUCTURE_FIELDS}
            assert have == want, (
                f"{PROFILE_LIST[c.profile].name} {c}: jax {have} != reference {want}"
            )


# ------------------------------------------------------------------------ strategies


@st.composite
def sizes(draw) -> int:
    """Object strides 8..2 MiB: log-uniform, word-aligned or not, and the boundaries
    (powers of two, PAGE_SIZE neighbours) where the formulas change behaviour."""
    kind = draw(st.integers(0, 3))
    if kind == 0:
        return draw(st.integers(8, MAX_SIZE))
    exp = draw(st.integers(3, 20))
    if kind == 1:
        return draw(st.integers(1 << exp, (2 << exp) - 1))
    if kind == 2:
        return 8 * draw(st.integers(1 << (exp - 3), (2 << (exp - 3)) - 1))
    return min(MAX_SIZE, max(8, (1 << exp) + draw(st.integers(-8, 8))))


@st.composite
def cpu_counts(draw) -> tuple[int, int, int]:
    """(possible, present, online) with 1 <= online <= present <= possible <= 8192,
    often present = 1 (architectures that mark CPUs present only as they online them)."""
    possible = draw(st.one_of(st.integers(1, MAX_CPUS),
                              st.integers(0, 13).map(lambda e: 1 << e)))
    present = draw(st.one_of(st.just(1), st.just(possible), st.integers(1, possible)))
    online = draw(st.one_of(st.just(1), st.just(present), st.integers(1, present)))
    return possible, present, online


@st.composite
def configs(draw) -> Config:
    size = draw(sizes())
    possible, present, online = draw(cpu_counts())
    raw_min = draw(st.integers(0, MAX_PAGE_ORDER))
    raw_max = draw(st.integers(0, MAX_PAGE_ORDER))
    # Mostly the coupled pair a current kernel's parser leaves; sometimes the raw pair, as
    # kernels before the coupling (and the formulas themselves) accept min > max.
    if draw(st.integers(0, 3)):
        min_order, max_order = couple_orders(raw_min, raw_max, draw(st.booleans()))
    else:
        min_order, max_order = raw_min, raw_max
    min_objects = draw(st.one_of(st.just(0), st.integers(1, MAX_MIN_OBJECTS),
                                 st.integers(1, 64)))
    return Config(
        size=size, possible=possible, present=present, online=online,
        profile=draw(st.integers(0, len(PROFILE_LIST) - 1)),
        min_order=min_order, max_order=max_order, min_objects=min_objects,
        early=draw(st.booleans()), is_kmalloc=draw(st.booleans()),
        is_bootstrap=draw(st.booleans()),
        explicit_sheaf=draw(st.one_of(st.just(0), st.integers(1, 512))),
    )


def random_configs(seed: int, n: int) -> list[Config]:
    """``n`` configurations from a numpy generator (same domain as :func:`configs`)."""
    rng = np.random.default_rng(seed)
    exp = rng.integers(3, 22, n)
    size = np.minimum(MAX_SIZE, rng.integers(1 << exp, 2 << exp))
    aligned = rng.random(n) < 0.5
    size = np.where(aligned, np.maximum(8, size & ~7), size)
    possible = np.where(rng.random(n) < 0.5, 1 << rng.integers(0, 14, n),
                        rng.integers(1, MAX_CPUS + 1, n))
    present = np.where(rng.random(n) < 0.25, 1, rng.integers(1, possible + 1))
    online = np.where(rng.random(n) < 0.25, 1, rng.integers(1, present + 1))
    raw_min = rng.integers(0, MAX_PAGE_ORDER + 1, n)
    raw_max = rng.integers(0, MAX_PAGE_ORDER + 1, n)
    min_last = rng.random(n) < 0.5
    min_objects = np.where(rng.random(n) < 0.5, 0,
                           np.where(rng.random(n) < 0.5, rng.integers(1, 65, n),
                                    rng.integers(1, MAX_MIN_OBJECTS + 1, n)))
    profile = rng.integers(0, len(PROFILE_LIST), n)
    flags = rng.random((n, 3)) < 0.5
    explicit = np.where(rng.random(n) < 0.5, 0, rng.integers(1, 513, n))
    out = []
    for i in range(n):
        lo, hi = int(raw_min[i]), int(raw_max[i])
        if i % 4:
            lo, hi = couple_orders(lo, hi, bool(min_last[i]))
        out.append(Config(
            int(size[i]), int(possible[i]), int(present[i]), int(online[i]), int(profile[i]),
            lo, hi, int(min_objects[i]), bool(flags[i, 0]), bool(flags[i, 1]),
            bool(flags[i, 2]), int(explicit[i]),
        ))
    return out


# ------------------------------------------------------------------------ properties


def test_reference_fields_are_policy_fields():
    assert reference.STRUCTURE_FIELDS == policy.Structure._fields


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.lists(configs(), min_size=1, max_size=48))
def test_jax_equals_reference_on_drawn_batches(batch):
    assert_batch_matches(batch)


@settings(max_examples=8, deadline=None)
@given(st.integers(0, 2**32 - 1))
def test_jax_equals_reference_on_random_batches(seed):
    assert_batch_matches(random_configs(seed, 4 * BATCH))


def test_jax_equals_reference_on_every_word_aligned_size_to_16k():
    """Every 8-byte stride up to 4 pages, every profile, a ladder of CPU counts, default
    boot parameters: the region where real caches live."""
    cfgs = [
        Config(size, cpus, cpus, cpus, p, 0, 3, 0, False, False, False, 0)
        for p in range(len(PROFILE_LIST))
        for size in range(8, 16385, 8)
        for cpus in (1, 2, 64, 8192)
    ]
    assert_batch_matches(cfgs)


@pytest.mark.parametrize("explicit", [0, 32])
@pytest.mark.parametrize("is_kmalloc,is_bootstrap", [(False, False), (True, False),
                                                     (False, True)])
def test_sheaf_capacity_matches_per_size_class(explicit, is_kmalloc, is_bootstrap):
    cfgs = [
        Config(size, 8, 8, 8, p, 0, 3, 0, False, is_kmalloc, is_bootstrap, explicit)
        for p in range(len(PROFILE_LIST))
        for size in (8, 255, 256, 1023, 1024, 4095, 4096, 65536)
    ]
    assert_batch_matches(cfgs)


def test_bit_helpers_match_reference():
    """fls, ilog2, get_order and order_objects on every value where they step."""
    xs = np.array(sorted({1, 2, 3} | {v + d for e in range(1, 31) for d in (-1, 0, 1)
                                       for v in [1 << e] if 0 < v + d < 2**31}), np.int32)
    j = jnp.asarray(xs)
    np.testing.assert_array_equal(np.asarray(policy.fls(j)), [reference.fls(int(x)) for x in xs])
    np.testing.assert_array_equal(np.asarray(policy.ilog2(j)),
                                  [reference.ilog2(int(x)) for x in xs])
    small = xs[xs <= (1 << 26)]
    np.testing.assert_array_equal(np.asarray(policy.get_order(jnp.asarray(small))),
                                  [reference.get_order(int(x)) for x in small])
    sz = jnp.asarray(np.arange(8, 70000, 7, dtype=np.int32))
    for order in range(MAX_PAGE_ORDER + 1):
        np.testing.assert_array_equal(np.asarray(policy.order_objects(order, sz)),
                                      [reference.order_objects(order, int(s))
                                       for s in np.asarray(sz)])


def test_objects_per_slab_and_leftover_match_reference_for_every_order():
    """Object counts (computed in float32 by the model) equal integer division, for every
    order 0..MAX_PAGE_ORDER, on word-aligned and odd sizes up to 2 MiB."""
    sz = np.unique(np.concatenate([np.arange(8, 70000, 7), np.arange(8, 1 << 21, 4093),
                                   (1 << np.arange(3, 22)) - 1, 1 << np.arange(3, 22),
                                   (1 << np.arange(3, 22)) + 1])).astype(np.int32)
    for prof in (PROFILES["v2.6.27"], PROFILES["v6.1"]):
        p = policy.profile_arrays(prof)
        for order in range(MAX_PAGE_ORDER + 1):
            got = np.asarray(policy.objects_per_slab(jnp.asarray(sz), order, p))
            want = [reference.objects_per_slab(int(s), order, prof) for s in sz]
            np.testing.assert_array_equal(got, want, err_msg=f"{prof.name} order {order}")
            got = np.asarray(policy.leftover_bytes(jnp.asarray(sz), order, p))
            want = [reference.leftover_bytes(int(s), order, prof) for s in sz]
            np.testing.assert_array_equal(got, want, err_msg=f"{prof.name} order {order}")


def test_order_table_is_exact_for_every_size_to_2mib():
    """The model's per-size order table and objects_per_slab (float32 quotients) equal
    integer arithmetic for every object size 1..2 MiB: object counts per order and the
    leftover verdicts per fraction, checked against numpy's integer division."""
    sz = np.arange(1, (2 << 20) + 1, dtype=np.int64)
    t = jax.jit(policy._order_table)(jnp.asarray(sz, jnp.int32))
    fits_want = [np.zeros(sz.shape, np.int64) for _ in t.fits]
    for order in range(MAX_PAGE_ORDER + 1):
        slab = 4096 << order
        np.testing.assert_array_equal(np.asarray(t.objs[order]), slab // sz,
                                      err_msg=f"order {order}")
        for i, fraction in enumerate((16, 8, 4, 2)):
            fits_want[i] |= np.where(slab % sz <= slab // fraction, 1 << order, 0)
    for got, want in zip(t.fits, fits_want):
        np.testing.assert_array_equal(np.asarray(got), want)
    # objects_per_slab divides in float32 too (capped at MAX_OBJS_PER_PAGE = 32767 in v6.1).
    per_order = jax.jit(lambda s, o, p: policy.objects_per_slab(s, o, p))
    p61 = policy.profile_arrays(PROFILES["v6.1"])
    for order in range(MAX_PAGE_ORDER + 1):
        got = np.asarray(per_order(jnp.asarray(sz, jnp.int32), order, p61))
        np.testing.assert_array_equal(got, np.minimum((4096 << order) // sz, 32767),
                                      err_msg=f"objects_per_slab order {order}")


def test_cpu_partial_slabs_matches_reference_for_every_slab_size():
    """DIV_ROUND_UP(2 * cpu_partial, objs_per_slab) for objs_per_slab 1..65535."""
    per = np.arange(1, 65536, dtype=np.int32)
    for prof in PROFILE_LIST:
        p = policy.profile_arrays(prof)
        for size in (64, 256, 1024, 4096):
            got = np.asarray(policy.cpu_partial_slabs(size, jnp.asarray(per), p))
            want = np.array([reference.cpu_partial_slabs(size, int(n), prof) for n in per])
            np.testing.assert_array_equal(got, want, err_msg=f"{prof.name} size {size}")


def test_kmalloc_size_roundup_matches_reference_on_every_size():
    """Every request 1..3 pages (all the small buckets, including kmalloc-96 and -192), and
    page-allocator sizes above KMALLOC_MAX_CACHE_SIZE."""
    n = np.concatenate([np.arange(1, 3 * 4096 + 1), (np.arange(3, 600) * 4096 + 1) // 1,
                        np.arange(3, 600) * 4096]).astype(np.int32)
    got = np.asarray(jax.jit(policy.kmalloc_size_roundup)(jnp.asarray(n)))
    want = [reference.kmalloc_size_roundup(int(x)) for x in n]
    np.testing.assert_array_equal(got, want)


# ------------------------------------------------------------------------ transformations


def _ref_grid(size_list, cpu_list, profiles, **kw) -> dict[str, np.ndarray]:
    shape = (len(profiles), len(size_list), len(cpu_list))
    out = {f: np.zeros(shape, dtype=np.int64) for f in reference.STRUCTURE_FIELDS}
    for i, prof in enumerate(profiles):
        for j, size in enumerate(size_list):
            for k, cpus in enumerate(cpu_list):
                row = reference.structure(size, cpus, cpus, cpus, prof, **kw)
                for f in reference.STRUCTURE_FIELDS:
                    out[f][i, j, k] = row[f]
    return out


GRID_SIZES = [8, 24, 96, 192, 256, 424, 512, 700, 1024, 2048, 3000, 4096, 8192, 12288,
              65536, 1 << 21]
GRID_CPUS = [1, 2, 3, 8, 63, 64, 127, 128, 1000, 8192]


def test_broadcast_sizes_by_cpus_by_profiles_under_jit():
    """(profiles, sizes, cpus) from three broadcast axes in one jitted call."""
    p = policy.expand_profile(STACKED, 2)
    s = jnp.asarray(GRID_SIZES, jnp.int32)[None, :, None]
    c = jnp.asarray(GRID_CPUS, jnp.int32)[None, None, :]
    fn = jax.jit(lambda s, c, p: policy.structure(s, c, c, c, p, min_objects=0))
    out = fn(s, c, p)
    want = _ref_grid(GRID_SIZES, GRID_CPUS, PROFILE_LIST)
    for f in reference.STRUCTURE_FIELDS:
        # Each field keeps the axes it depends on (nr_cpus has no size axis, min_partial
        # no CPU axis); it must broadcast to the full grid with the reference's values.
        got = np.broadcast_to(np.asarray(getattr(out, f)), want[f].shape)
        np.testing.assert_array_equal(got, want[f], err_msg=f)
    assert np.asarray(out.order).shape == (len(PROFILE_LIST), len(GRID_SIZES), len(GRID_CPUS))


def test_vmap_over_profiles_sizes_and_cpus():
    """Nested vmap (profiles outermost) gives the same grid as the scalar loop."""
    def one(size, cpus, p):
        return policy.structure(size, cpus, cpus, cpus, p, min_order=1, max_order=4)

    f = jax.vmap(jax.vmap(jax.vmap(one, in_axes=(None, 0, None)),
                          in_axes=(0, None, None)), in_axes=(None, None, 0))
    out = jax.jit(f)(jnp.asarray(GRID_SIZES, jnp.int32), jnp.asarray(GRID_CPUS, jnp.int32),
                     STACKED)
    want = _ref_grid(GRID_SIZES, GRID_CPUS, PROFILE_LIST, min_order=1, max_order=4)
    for fld in reference.STRUCTURE_FIELDS:
        got = np.asarray(getattr(out, fld))
        assert got.shape == want[fld].shape, fld
        np.testing.assert_array_equal(got, want[fld], err_msg=fld)


def test_eager_scalar_call_matches_reference():
    """Without jit or vmap, one scalar configuration per profile."""
    for prof in PROFILE_LIST:
        out = policy.structure(4096, 64, 1, 1, policy.profile_arrays(prof), early=True,
                               explicit_sheaf=32)
        want = reference.structure(4096, 64, 1, 1, prof, early=True, explicit_sheaf=32)
        assert {f: int(getattr(out, f)) for f in reference.STRUCTURE_FIELDS} == want, prof.name

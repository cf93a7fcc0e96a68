"""`kernel check` on a kernel with sheaves on every cache: snapshots of 7.2.13 guests.

The fixtures are REAL snapshots of qemu (TCG) guests, taken with ``slabtune guest boot
--workload none --accel tcg`` (``--cpus N --nodes K [--memoryless 1]``):

* ``guest-v7.2-<topology>.csv``: our own build of Debian's linux-source-7.2 (7.2.13-1,
  release ``7.2.13-slabtune``, scripts/build-kernels.sh), as the guest boots it.  Caches
  are merged, so the kmalloc caches appear under their merged names (``:0000008`` is
  kmalloc-8 with the caches merged into it).
* ``guest-v7.2-<topology>-nomerge.csv``: the same kernel and topologies with
  ``slab_nomerge`` appended to the guest's command line (a throwaway wrapper around
  ``guest boot``), so every cache, kmalloc-8 .. kmalloc-8k and kmalloc-rcl-* included, has
  its own name and row.
* ``guest-v7.2-cloud-4cpu-2node-memoryless.csv``: Debian unstable's binary
  linux-image-7.2.13+deb14-cloud-amd64 (its vmlinuz, fetched with ``apt-get download``
  through the private apt configuration scripts/build-kernels.sh writes), booted the same
  way; its configuration names kmalloc-*, kmalloc-cg-*, kmalloc-rcl-* and dma-kmalloc-*.

The expected sheaf capacities are restated here from calculate_sheaf_capacity() of 7.2.13's
mm/slub.c (lines 7795-7840), independently of the model's formulas.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import polars as pl
import pytest

from slabtune.kernel import check, snapshot
from slabtune.model import profiles

DATA = Path(__file__).parent / "data"

#: fixture -> (present CPUs, nodes, nodes with memory, caches)
FIXTURES = {
    "guest-v7.2-4cpu-2node-memoryless.csv": (4, 2, "0", 55),
    "guest-v7.2-8cpu-2node.csv": (8, 2, "0-1", 55),
    "guest-v7.2-16cpu-4node.csv": (16, 4, "0-3", 55),
    "guest-v7.2-4cpu-2node-memoryless-nomerge.csv": (4, 2, "0", 76),
    "guest-v7.2-8cpu-2node-nomerge.csv": (8, 2, "0-1", 76),
    "guest-v7.2-16cpu-4node-nomerge.csv": (16, 4, "0-3", 76),
    "guest-v7.2-cloud-4cpu-2node-memoryless.csv": (4, 2, "0", 203),
}
#: the fixtures in which the kmalloc caches have their own names
NAMED_KMALLOC = [f for f in FIXTURES if "nomerge" in f or "cloud" in f]
KMALLOC_SIZES = (8, 16, 32, 64, 96, 128, 192, 256, 512, 1024, 2048, 4096, 8192)


def _read(name: str) -> pl.DataFrame:
    return snapshot.read_snapshot(DATA / name)


def _kmalloc_bucket(n: int) -> int:
    """kmalloc_size_roundup() for the small sizes a sheaf takes."""
    return next(b for b in KMALLOC_SIZES if b >= n)


def kernel_sheaf_capacity(stride: int, requested: int = 0) -> int:
    """calculate_sheaf_capacity() of 7.2.13: 4/12/26/60 objects by stride, raised until
    the sheaf (a 32-byte header and 8 bytes per object) fills its kmalloc bucket, then at
    least the creator's request."""
    base = 4 if stride >= 4096 else 12 if stride >= 1024 else 26 if stride >= 256 else 60
    return max((_kmalloc_bucket(32 + 8 * base) - 32) // 8, requested)


def _row(df: pl.DataFrame, cache: str) -> dict:
    return df.filter(pl.col("cache") == cache).row(0, named=True)


@pytest.mark.parametrize("name", list(FIXTURES))
def test_every_cache_matches_in_every_field(name):
    present, nodes, memory, n = FIXTURES[name]
    df = _read(name)
    r = check.check_snapshot(df)
    (b,) = r.boots
    assert b.kernel_release.startswith("7.2.13") and b.profile == "v7.1"
    assert (b.present, b.nr_cpu_ids, b.nodes, b.nodes_with_memory) == (present, present, nodes,
                                                                      memory)
    assert tuple(b.params) == (0, 3, 0)
    assert (r.caches, r.comparable, r.matched) == (n, n, n) and df.height == n
    assert r.ok and not r.mismatches and not r.not_comparable
    assert {f: (c.matched, c.total) for f, c in r.fields.items()} == {
        f: (n, n) for f in check.COMPARED_FIELDS}


@pytest.mark.parametrize("name", list(FIXTURES))
def test_sheaf_capacities_follow_the_kernel_rule(name):
    """Every cache but the two bootstrap ones has sheaves; maple_node asks for 32 (above its
    default 28), vm_area_struct for 32 (below its default 60)."""
    df = _read(name)
    for row in df.iter_rows(named=True):
        if row["cache"] in ("kmem_cache", "kmem_cache_node"):
            assert row["sheaf_capacity"] == 0
        else:
            want = kernel_sheaf_capacity(row["slab_size"], check.explicit_sheaf(row["cache"]))
            assert row["sheaf_capacity"] == want, row["cache"]
    maple, vma = _row(df, "maple_node"), _row(df, "vm_area_struct")
    assert (maple["slab_size"], maple["sheaf_capacity"]) == (256, 32)
    assert kernel_sheaf_capacity(256) == 28
    assert (vma["slab_size"], vma["sheaf_capacity"]) == (192, 60)


@pytest.mark.parametrize("name", NAMED_KMALLOC)
def test_kmalloc_caches_have_default_sheaves(name):
    """kmalloc caches get sheaves (bootstrap_kmalloc_sheaves(), v7.0), at the default
    capacity for their size: kmalloc-8 .. kmalloc-192 60, kmalloc-256 and 512 28, 1k and 2k
    12, 4k and 8k 4; the model predicts the same."""
    df = _read(name)
    kmalloc = df.filter(pl.col("cache").map_elements(check.is_kmalloc, return_dtype=pl.Boolean))
    normal = {r["cache"]: r for r in kmalloc.iter_rows(named=True)
              if r["cache"].startswith("kmalloc-") and r["cache"][8:9].isdigit()}
    assert len(normal) == 13
    got = {int(c[8:].replace("k", "")) * (1024 if c.endswith("k") else 1): r["sheaf_capacity"]
           for c, r in normal.items()}
    assert got == {8: 60, 16: 60, 32: 60, 64: 60, 96: 60, 128: 60, 192: 60, 256: 28, 512: 28,
                   1024: 12, 2048: 12, 4096: 4, 8192: 4}
    assert all(r["sheaf_capacity"] == kernel_sheaf_capacity(r["slab_size"])
               for r in kmalloc.iter_rows(named=True))
    assert kmalloc.height >= 26  # kmalloc-rcl-* too (and kmalloc-cg-*, dma-kmalloc-* in cloud)


@pytest.mark.parametrize("name", NAMED_KMALLOC)
def test_a_profile_without_kmalloc_sheaves_misses_exactly_the_kmalloc_caches(name):
    """The fixtures tell the rules apart: a v7.1 with kmalloc caches left without sheaves
    (the model's v7.x profiles before these snapshots) mismatches every kmalloc cache's
    sheaf_capacity and nothing else."""
    df = _read(name)
    old = dataclasses.replace(profiles.get_profile("v7.1"), sheaves_on_kmalloc=False)
    r = check.check_snapshot(df, old)
    kmalloc = {c for c in df["cache"] if check.is_kmalloc(c)}
    assert {m.cache for m in r.mismatches} == kmalloc
    assert {(m.field, m.model) for m in r.mismatches} == {("sheaf_capacity", 0)}


def test_merged_kmalloc_caches_are_checked_under_their_merged_names():
    """With merging (the guest's default) kmalloc-8 is /sys/kernel/slab/:0000008 (kmalloc-8
    is a link to it), predicted like any cache of its stride: the same capacity."""
    df = _read("guest-v7.2-4cpu-2node-memoryless.csv")
    k8 = _row(df, ":0000008")
    assert (k8["slab_size"], k8["sheaf_capacity"]) == (8, 60) and k8["aliases"] >= 1
    assert not any(c.startswith("kmalloc-") for c in df["cache"])


def test_v7_0_rules_give_the_same_structure():
    """v7.0 and v7.1 differ in where barns live, not in structure: checked as v7.0 the
    snapshots match too."""
    for name in ("guest-v7.2-16cpu-4node-nomerge.csv",
                 "guest-v7.2-cloud-4cpu-2node-memoryless.csv"):
        r = check.check_snapshot(_read(name), "v7.0")
        assert r.ok and r.matched == r.caches == FIXTURES[name][3]


def test_topology_changes_orders():
    """The three topologies size slabs differently (min_objects 4 * (fls(present) + 1)):
    e.g. kmalloc-256 is order 0 with 4 CPUs and order 1 with 8 and 16."""
    orders = [_row(_read(f"guest-v7.2-{t}-nomerge.csv"), "kmalloc-256")["order"]
              for t in ("4cpu-2node-memoryless", "8cpu-2node", "16cpu-4node")]
    assert orders == [0, 1, 1]


@pytest.mark.parametrize("release,profile", [
    ("7.2.13-slabtune", "v7.1"),
    ("7.2.13+deb14-cloud-amd64", "v7.1"),
    ("7.1.4", "v7.1"),
    ("7.0.0-rc3", "v7.0"),
    ("6.19.2", "v6.18"),
])
def test_release_maps_to_profile(release, profile):
    p = profiles.detect_profile(release)
    assert p.name == profile
    assert p.sheaves_on_kmalloc == (p.sheaves == "all")

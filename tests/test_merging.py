"""The cache-merging model (model/merging.py) against real /sys/kernel/slab data.

* ``guest-v7.2-<topology>[-nomerge].csv`` (see tests/test_check_v72.py): the lab's 7.2.13
  build booted with and without ``slab_nomerge``.  The nomerge boot gives every cache's
  name and aligned size; the merged boot's rows are what merging made of them: a ``:`` row
  per merged kmem_cache whose ``aliases`` column counts the names symlinked to it, an own
  row per unmergeable cache.  The model, fed the nomerge boot's sizes and the captured
  per-cache facts (model/slab_merge_facts.csv), must rebuild the merged boot exactly.
* ``model/slab_merge_facts.csv``: the capture of a 6.18 distribution host
  (kernel/slab_aliases.py), one row per name and the directory it resolves to.
"""

from __future__ import annotations

import csv
from collections import Counter
from pathlib import Path

import pytest

from slabtune.model import merging as m

DATA = Path(__file__).parent / "data"
TOPOLOGIES = ("8cpu-2node", "16cpu-4node", "4cpu-2node-memoryless")
#: A 7.2.13 cache the 6.18 capture has no row for: kernel/exec_state.c exec_state_init()
#: creates it with SLAB_HWCACHE_ALIGN | SLAB_PANIC | SLAB_ACCOUNT, no ctor, no usercopy.
SOURCE_ONLY = {"task_exec_state": ""}


def _rows(name: str) -> list[dict[str, str]]:
    with open(DATA / name, newline="") as fh:
        return [r for r in csv.DictReader(fh) if r.get("phase", "before") == "before"]


def _lab_facts(nomerge_rows) -> list[m.CacheMergeFacts]:
    """The nomerge boot's caches in creation order (the kmalloc caches first:
    kmem_cache_init() creates them before any other), with the captured facts and the
    boot's own aligned sizes."""
    names = sorted((r["cache"] for r in nomerge_rows), key=lambda n: m.kmalloc_kind(n) is None)
    sizes = {r["cache"]: int(r["slab_size"]) for r in nomerge_rows}
    facts = m.captured_facts(names, m.LAB, sizes)
    out = []
    for n, f in zip(names, facts):
        if f is None:
            f = m.CacheMergeFacts(n, sizes[n], SOURCE_ONLY[n])
        out.append(f)
    return out


def _predicted(facts, nomerge: bool):
    by_name = {f.name: f for f in facts}
    groups = m.groups(m.merge_roots(facts, m.LAB, nomerge))
    named = sorted(r for r in groups if m.unmergeable(by_name[r], m.LAB, nomerge))
    merged = Counter()
    for r, members in groups.items():
        if r not in named:
            f = by_name[r]
            merged[(f.flags, m.aligned_size(f.size, f.align))] += len(members)
    return named, dict(merged)


def _observed(rows):
    named = sorted(r["cache"] for r in rows if m.parse_unique_id(r["cache"]) is None)
    merged = {m.parse_unique_id(r["cache"]): int(r["aliases"]) for r in rows
              if m.parse_unique_id(r["cache"]) is not None}
    return named, merged


@pytest.mark.parametrize("topology", TOPOLOGIES)
def test_merge_groups_rebuild_the_merged_boot(topology):
    facts = _lab_facts(_rows(f"guest-v7.2-{topology}-nomerge.csv"))
    named, merged = _predicted(facts, nomerge=False)
    obs_named, obs_merged = _observed(_rows(f"guest-v7.2-{topology}.csv"))
    assert named == obs_named
    assert merged == obs_merged
    # the merged boot holds every name of the nomerge boot
    assert len(named) + sum(merged.values()) == len(facts)
    assert len(merged) + len(named) < len(facts)      # merging really happened


@pytest.mark.parametrize("topology", TOPOLOGIES)
def test_nomerge_keeps_every_cache_apart(topology):
    rows = _rows(f"guest-v7.2-{topology}-nomerge.csv")
    assert "slab_nomerge" in rows[0]["cmdline"].split()
    named, merged = _predicted(_lab_facts(rows), nomerge=True)
    assert (named, merged) == _observed(rows)
    assert merged == {}


def test_capture_own_directories_are_the_unmergeable_caches():
    """On the 6.18 distribution host a cache keeps its own directory exactly when the
    model finds it unmergeable from its files (ctor, usercopy, RCU, debug flags) and the
    source-only facts (bootstrap, sheaf requests, SLAB_NO_MERGE creators)."""
    config = m.MergeConfig(True, True, (6, 18))
    with open(m.FACTS_FILE, newline="") as fh:
        rows = [r for r in csv.DictReader(fh) if m.parse_unique_id(r["name"]) is None]
    assert len(rows) > 300
    for r in rows:
        own = r["target"] == r["name"]
        assert m.unmergeable(m.facts_from_row(r, config), config, False) == own, r["name"]


def test_capture_groups_are_its_symlinks():
    """Merging the captured names in any order groups them as the host's symlinks do."""
    config = m.MergeConfig(True, True, (6, 18))
    with open(m.FACTS_FILE, newline="") as fh:
        rows = [r for r in csv.DictReader(fh) if m.parse_unique_id(r["name"]) is None]
    facts = [m.facts_from_row(r, config) for r in rows]
    groups = m.groups(m.merge_roots(facts, config, False))
    observed = Counter(r["target"] for r in rows)
    target = {r["name"]: r["target"] for r in rows}
    assert sorted(len(v) for v in groups.values()) == sorted(observed.values())
    for members in groups.values():
        assert len({target[n] for n in members}) == 1


@pytest.mark.parametrize("fixture", ["guest-v6.1-4cpu-2node.csv", "guest-v6.12-4cpu-2node.csv",
                                     "guest-v7.2-cloud-4cpu-2node-memoryless.csv"])
def test_distro_kmalloc_caches_never_merge(fixture):
    """Debian's kernels (HARDENED_USERCOPY: kmalloc caches carry usersize) keep every
    kmalloc cache under its own name; the model says the same from the captured facts."""
    rows = _rows(fixture)
    kmalloc = [r["cache"] for r in rows if m.kmalloc_kind(r["cache"]) is not None]
    assert kmalloc
    version = tuple(int(x) for x in rows[0]["kernel_release"].split(".")[:2])
    config = m.MergeConfig(True, True, version)
    for f in m.captured_facts(kmalloc, config):
        if f is not None:
            assert m.unmergeable(f, config, False), f.name


def test_find_mergeable_states_the_kernel_conditions():
    cfg = m.LAB
    k192 = m.CacheMergeFacts("kmalloc-192", 192)
    k256 = m.CacheMergeFacts("kmalloc-256", 256)
    # SLAB_HWCACHE_ALIGN: 136 bytes at 64-byte alignment is 192
    cred = m.CacheMergeFacts("cred", 136, align=64)
    assert m.find_mergeable(cred, [k192, k256], cfg, False) == 0
    # 248 rounds to 248: kmalloc-256 is a word larger, not a target
    assert m.find_mergeable(m.CacheMergeFacts("bio-248", 248), [k256], cfg, False) is None
    # SLAB_MERGE_SAME flags must match
    assert m.find_mergeable(m.CacheMergeFacts("d", 192, "a"), [k192], cfg, False) is None
    # the newest candidate wins
    other = m.CacheMergeFacts("pid", 192)
    assert m.find_mergeable(cred, [k192, other], cfg, False) == 1
    # unmergeable new or existing caches, usercopy only under HARDENED_USERCOPY
    assert m.find_mergeable(m.CacheMergeFacts("x", 192, never=True), [k192], cfg, False) is None
    assert m.find_mergeable(cred, [m.CacheMergeFacts("y", 192, usersize=8)], cfg, False) == 0
    assert m.find_mergeable(cred, [m.CacheMergeFacts("y", 192, usersize=8)], m.DISTRO,
                            False) is None
    assert m.find_mergeable(cred, [k192], cfg, True) is None


@pytest.mark.parametrize("fixture", ["guest-v6.1-4cpu-2node.csv", "guest-v6.12-4cpu-2node.csv",
                                     "guest-v7.2-cloud-4cpu-2node-memoryless.csv",
                                     "host_snapshot_6.18.csv"])
def test_distro_boots_keep_apart_what_the_model_keeps_apart(fixture):
    """In Debian's merged boots (6.1, 6.12, 7.2 cloud kernels and the 6.18 host) every cache
    under its own name, where the capture knows it, is one the model finds unmergeable at
    that version (e.g. key_jar, SLAB_NO_MERGE in 7.2 but merged on the 6.18 host)."""
    rows = _rows(fixture)
    version = tuple(int(x) for x in rows[0]["kernel_release"].split(".")[:2])
    config = m.MergeConfig(True, True, version)
    own = [r["cache"] for r in rows if m.parse_unique_id(r["cache"]) is None]
    facts = [f for f in m.captured_facts(own, config) if f is not None]
    assert len(facts) > 80
    assert [f.name for f in facts if not m.unmergeable(f, config, False)] == []

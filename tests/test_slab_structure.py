"""SLAB's structural rules (model/slab.py) against /proc/slabinfo of the lab's 6.1-slab kernel.

Fixtures (tests/data/guest-v6.1-slab-*.csv), each the ``before`` snapshot of one boot of
the 6.1-slab build (Debian linux-source-6.1 6.1.192, CONFIG_SLAB) under qemu/TCG with
512 MiB, written by ``slabtune guest boot --kernel 6.1-slab --workload none``:

* ``1cpu-1node``: ``--cpus 1`` (one possible CPU: no shared arrays);
* ``1of2cpu-1node``: ``--cpus 1 --possible 2`` (one present CPU, two possible: shared
  arrays, since enable_cpucache() asks num_possible_cpus());
* ``2cpu-1node``: the older fixture of tests/test_slabinfo.py (hackbench boot);
* ``4cpu-2node``: ``--cpus 4 --nodes 2``;
* ``8cpu-4node-memoryless``: ``--cpus 8 --nodes 4 --memoryless 3``;
* ``2cpu-2node-maxorder0`` and ``1cpu-1node-maxorder3``: ``--cpus 2 --nodes 2`` and
  ``--cpus 1`` with ``slab_max_order=0`` / ``=3`` added to the guest's command line by
  hand (guest.py takes SLUB parameters only; the snapshot's cmdline column records it).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from slabtune.errors import SlabtuneError
from slabtune.kernel import check, snapshot
from slabtune.model import profiles, slab

DATA = Path(__file__).parent / "data"
FIXTURES = sorted(DATA.glob("guest-v6.1-slab-*.csv"))
BEFORE = [p for p in FIXTURES if not p.stem.endswith("-after")]
V61 = profiles.SLAB_PROFILES["slab-v6.1"]
V2633 = profiles.SLAB_PROFILES["slab-v2.6.33"]
V31 = profiles.SLAB_PROFILES["slab-v3.1"]


def test_the_fixtures_are_there():
    names = {p.stem.removeprefix("guest-v6.1-slab-") for p in BEFORE}
    assert {"1cpu-1node", "4cpu-2node", "8cpu-4node-memoryless", "1of2cpu-1node",
            "2cpu-2node-maxorder0", "1cpu-1node-maxorder3", "2cpu-1node"} <= names


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: p.stem)
def test_every_cache_of_a_fixture_matches_in_all_five_columns(path):
    df = snapshot.read_snapshot(path)
    r = check.check_snapshot(df, None, str(path))
    print(f"{path.name}: {r.summary()}")
    assert [b.profile for b in r.boots] == ["slab-v6.1"]
    assert r.not_comparable == ()
    assert r.mismatches == ()
    assert r.comparable == r.matched == r.caches == df.height
    assert {f: (c.matched, c.total) for f, c in r.fields.items()} == {
        f: (df.height, df.height) for f in check.SLAB_COMPARED_FIELDS}


@pytest.mark.parametrize("path", BEFORE, ids=lambda p: p.stem)
def test_the_model_predicts_each_row_by_itself(path):
    """The same comparison without check.py: model/slab.py's functions against each row."""
    df = snapshot.read_snapshot(path)
    first = df.row(0, named=True)
    params = slab.parse_cmdline(first["cmdline"], V61)
    possible = len(snapshot.parse_cpulist(first["cpus_possible"]))
    by_stride = by_facts = 0
    for row in df.iter_rows(named=True):
        facts = slab.known_facts(row["cache"], V61)
        lay, = slab.layout_candidates(row["slab_size"], V61, params.max_order, facts)
        tun = slab.cpucache_tunables(row["slab_size"], possible)
        assert (lay.order, lay.num, tun.limit, tun.batchcount, tun.shared) == (
            row["order"], row["objs_per_slab"], row["limit"], row["batchcount"],
            row["sharedfactor"]), row["cache"]
        free = slab.layout_candidates(row["slab_size"], V61, params.max_order)
        if len(free) == 1:
            by_stride += 1
        else:
            by_facts += 1
            # what the facts decide is one of the geometries the stride allows
            assert (lay.order, lay.num) in {(x.order, x.num) for x in free}
    print(f"{path.name}: {by_stride} caches decided by the stride alone, {by_facts} by "
          "creation facts (kmalloc names and V61_CACHE_FACTS)")
    assert by_stride >= 40


def test_the_facts_table_is_needed_only_where_the_stride_leaves_a_choice():
    df = snapshot.read_snapshot(DATA / "guest-v6.1-slab-1cpu-1node.csv")
    strides = dict(zip(df["cache"], df["slab_size"], strict=True))
    for name in slab.V61_CACHE_FACTS:
        assert len(slab.layout_candidates(strides[name], V61, 1)) > 1, name


def test_max_order_moves_the_caches_that_want_bigger_slabs():
    rows = {}
    for tag in ("1cpu-1node", "2cpu-2node-maxorder0", "1cpu-1node-maxorder3"):
        df = snapshot.read_snapshot(DATA / f"guest-v6.1-slab-{tag}.csv")
        rows[tag] = {r["cache"]: (r["order"], r["objs_per_slab"]) for r in df.iter_rows(named=True)}
    assert rows["1cpu-1node"]["task_struct"] == (1, 2)
    assert rows["2cpu-2node-maxorder0"]["task_struct"] == (0, 1)
    assert rows["1cpu-1node-maxorder3"]["task_struct"] == (3, 11)
    assert rows["1cpu-1node-maxorder3"]["sighand_cache"] == (2, 7)
    # kmalloc-8k needs order 1 whatever the cap: an order that holds nothing is skipped
    assert {r["kmalloc-8k"] for r in rows.values()} == {(1, 1)}
    for mo, want in ((0, (0, 1)), (1, (1, 2)), (3, (3, 11))):
        lay = slab.slab_layout(2816, V61, mo, slab.V61_CACHE_FACTS["task_struct"])
        assert (lay.order, lay.num) == want


# --------------------------------------------------------------------------- rules


@pytest.mark.parametrize("size,limit", [(32, 120), (256, 120), (257, 54), (1024, 54),
                                        (1025, 24), (4096, 24), (4097, 8), (131072, 8),
                                        (131073, 1)])
def test_enable_cpucache_limit_by_size(size, limit):
    t = slab.cpucache_tunables(size, 2)
    assert (t.limit, t.batchcount) == (limit, (limit + 1) // 2)
    assert t.shared == (8 if size <= 4096 else 0)
    assert slab.cpucache_tunables(size, 1).shared == 0
    assert slab.cpucache_tunables(size, 2, debug=True).limit == min(limit, 32)


def test_v61_placements():
    # kmalloc-32: 128 index bytes do not fit in a 32-byte object and an off-slab freelist
    # (kmalloc-128) is not worth it: on slab, 4096 / 33 = 124
    assert slab.slab_layout(32, V61, 1, slab.kmalloc_facts("kmalloc-32")) == \
        slab.SlabLayout(0, 124, 4, "on_slab")
    assert slab.slab_layout(64, V61, 1, slab.kmalloc_facts("kmalloc-64")).placement == \
        "objfreelist"
    # a constructor rules the object freelist out: 1024-byte objects go off slab (4 a slab,
    # no room left for 4 index bytes) ...
    ctor = slab.CacheFacts(object_size=1024, no_objfreelist=True)
    assert slab.slab_layout(1024, V61, 1, ctor) == slab.SlabLayout(0, 4, 0, "off_slab")
    # ... but 704-byte ones stay on slab: the leftover holds the freelist anyway
    ctor = slab.CacheFacts(object_size=704, no_objfreelist=True)
    assert slab.slab_layout(704, V61, 1, ctor).placement == "on_slab"
    # SLAB_NOLEAKTRACE never goes off slab: on slab, 3 a page waste 1021 bytes (more than
    # 1/8), so order 1: 7 objects, 1017 bytes left
    leak = slab.CacheFacts(object_size=1024, no_objfreelist=True, noleaktrace=True)
    assert slab.slab_layout(1024, V61, 1, leak) == slab.SlabLayout(1, 7, 1017, "on_slab")
    # SLAB_RECLAIM_ACCOUNT takes the first order that holds an object
    assert slab.slab_layout(704, V61, 1, slab.CacheFacts(704, reclaim=True)).order == 0
    assert slab.slab_layout(704, V61, 1, slab.CacheFacts(704)).order == 1


@pytest.mark.parametrize("size,align,num,order", [
    (32, 32, 112, 0), (64, 64, 59, 0), (128, 64, 30, 0), (192, 64, 20, 0), (256, 64, 15, 0),
    (512, 64, 8, 0), (1024, 64, 4, 0), (2048, 64, 2, 0), (4096, 64, 1, 0), (8192, 64, 1, 1),
    (16384, 64, 1, 2), (131072, 64, 1, 5)])
def test_v2633_kmalloc_geometry(size, align, num, order):
    """The size-N caches of a 2.6.3x x86-64 kernel, from cache_estimate() by hand: on slab
    below 512 bytes, (4096 - 48) / (size + 4) objects less one when the struct slab and
    bufctls rounded up to the alignment do not fit (size-64: 59, block 320 bytes); off slab
    from 512 on."""
    for prof in (V2633, V31):
        lay = slab.slab_layout(size, prof, 1, slab.CacheFacts(object_size=size, align=align))
        assert (lay.num, lay.order) == (num, order)
        assert lay.placement == ("on_slab" if size < 512 else "off_slab")


def test_v2633_off_slab_moves_back_on_slab_when_the_leftover_holds_it():
    # 700-byte objects: 5 a page, 596 bytes left, the 68-byte block (48 + 5 * 4, aligned
    # to 8: 72) fits, so it goes on slab with the same order and count
    lay = slab.slab_layout(704, V2633, 0, slab.CacheFacts(object_size=700))
    assert lay == slab.SlabLayout(0, 5, 4096 - 5 * 704 - 72, "on_slab")


def test_structure_of_one_cache_on_a_numa_machine():
    s = slab.structure(256, 8, (2, 2, 2, 2), V61, 1, slab.kmalloc_facts("kmalloc-256"))
    assert (s.order, s.objs_per_slab, s.limit, s.batchcount, s.shared) == (0, 16, 120, 60, 8)
    assert s.shared_entries == 480
    assert s.alien_limit == 12
    assert s.free_limit == ((1 + 2) * 60 + 16,) * 4
    one = slab.structure(8192, 1, (1,), V61, 1, slab.kmalloc_facts("kmalloc-8k"))
    assert (one.limit, one.batchcount, one.shared, one.alien_limit) == (8, 4, 0, 0)
    assert slab.structure(256, 8, (4, 4), V61, use_alien_caches=False).alien_limit == 0
    assert slab.alien_limit(1, 2) == 1


def test_profiles_and_detection():
    assert set(profiles.SLAB_PROFILES) == {"slab-v2.6.33", "slab-v3.1", "slab-v6.1"}
    assert profiles.get_any_profile("slab-v6.1") is V61
    assert profiles.get_any_profile("v6.1") is profiles.PROFILES["v6.1"]
    assert profiles.is_slab(V61) and not profiles.is_slab(profiles.PROFILES["v6.1"])
    assert not V2633.memoryless_fallback and V31.memoryless_fallback
    assert slab.detect_slab_profile("6.1.192-slabtune-slab") is V61
    assert slab.detect_slab_profile("3.2.0-4-amd64") is V31
    assert slab.detect_slab_profile("2.6.35") is V2633
    for bad, msg in (("6.8.0", "removed in v6.8"), ("2.4.37", "older than every SLAB"),
                     ("linux", "cannot read")):
        with pytest.raises(profiles.UnknownProfileError, match=msg):
            slab.detect_slab_profile(bad)
    with pytest.raises(profiles.UnknownProfileError, match="'slab-v6.1' is a SLAB profile"):
        profiles.get_profile("slab-v6.1")


def test_slab_cmdline():
    assert slab.parse_cmdline("console=ttyS0", V61) == slab.SlabParams(1, True)
    assert slab.parse_cmdline("slab_max_order=0 noaliencache", V61) == slab.SlabParams(0, False)
    assert slab.parse_cmdline("slab-max-order=3 slab_max_order=2", V61).max_order == 2
    # no slab_max_order= parameter before v3.4: the kernel ignores it
    assert slab.parse_cmdline("slab_max_order=0", V31).max_order == 1
    assert slab.parse_cmdline("x", V61, ram_bytes=32 << 20).max_order == 0
    with pytest.raises(SlabtuneError, match=r"cmdline slab_max_order=11: must be an integer "
                                            r"in 0\.\.10"):
        slab.parse_cmdline("slab_max_order=11", V61)


# --------------------------------------------------------------------------- kernel check


def test_check_refuses_a_profile_of_the_other_allocator():
    slab_df = snapshot.read_snapshot(DATA / "guest-v6.1-slab-1cpu-1node.csv")
    with pytest.raises(SlabtuneError) as err:
        check.check_snapshot(slab_df, "v6.1", "snap.csv")
    assert str(err.value) == ("snap.csv: a SLAB snapshot (/proc/slabinfo) cannot be checked "
                              "against SLUB profile v6.1 (SLAB profiles: slab-v2.6.33, "
                              "slab-v3.1, slab-v6.1)")
    slub_df = snapshot.read_snapshot(DATA / "guest-v6.1-4cpu-2node.csv")
    with pytest.raises(SlabtuneError, match="a SLUB snapshot .* cannot be checked against "
                                            "SLAB profile slab-v6.1"):
        check.check_snapshot(slub_df, "slab-v6.1", "snap.csv")


def test_an_unknown_cache_the_stride_does_not_decide_is_set_aside():
    df = snapshot.read_snapshot(DATA / "guest-v6.1-slab-1cpu-1node.csv")
    df = df.with_columns(df["cache"].replace("files_cache", "my_cache"))
    r = check.check_snapshot(df, None, "x")
    assert [n.cache for n in r.not_comparable] == ["my_cache"]
    assert "allows order 1 x 11, order 0 x 5" in r.not_comparable[0].reason
    assert r.matched == r.comparable == df.height - 1


def test_cli_kernel_check_on_a_slab_snapshot():
    path = DATA / "guest-v6.1-slab-8cpu-4node-memoryless.csv"
    p = subprocess.run([sys.executable, "-m", "slabtune.cli", "kernel", "check", "--snapshot",
                        str(path)], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert "profile slab-v6.1" in lines[0] and "slab_max_order 1, alien caches on" in lines[0]
    assert lines[-1] == "matched 56/56 caches (56 comparable, 0 not comparable, 1 boot)"

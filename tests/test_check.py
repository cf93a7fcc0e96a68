"""`kernel check`: the model against real kernel snapshots, per-boot grouping, exclusions,
the CLI's output and exit codes, and bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

from slabtune.errors import SlabtuneError
from slabtune.kernel import check, snapshot
from slabtune.kernel.host import take_snapshot

DATA = Path(__file__).parent / "data"
FIXTURE = DATA / "host_snapshot_6.18.csv"
SLAB = Path("/sys/kernel/slab")
LIVE = SLAB.is_dir() and os.access(SLAB, os.R_OK | os.X_OK)
SLABTUNE = Path(sys.executable).parent / "slabtune"


@pytest.fixture(scope="module")
def host_df() -> pl.DataFrame:
    return snapshot.read_snapshot(FIXTURE)


# --------------------------------------------------------------------------- kernel rules
# An independent scalar restatement of calculate_order() of mm/slub.c (v6.8 .. v6.18), used
# to derive what a kernel with other parameters or another topology would report.

PAGE = 4096


def _get_order(n: int) -> int:
    order = 0
    while (PAGE << order) < n:
        order += 1
    return order


def _calc_slab_order(size, min_order, max_order, fraction):
    for order in range(min_order, max_order + 1):
        slab = PAGE << order
        if slab % size <= slab // fraction:
            return order
    return max_order + 1


def kernel_618_order(size, present, possible, min_order=0, max_order=3, min_objects=0):
    """calculate_order() of v6.18: nr_cpus = num_present_cpus() (nr_cpu_ids if <= 1)."""
    if not min_objects:
        nr = present if present > 1 else possible
        min_objects = 4 * (nr.bit_length() + 1)
    max_objects = max((PAGE << max_order) // size, 1)
    min_objects = min(min_objects, max_objects)
    min_order = max(min_order, _get_order(min_objects * size))
    if (PAGE << min_order) // size > 32767:
        return _get_order(size * 32767) - 1
    for fraction in (16, 8, 4, 2):
        order = _calc_slab_order(size, min_order, max_order, fraction)
        if order <= max_order:
            return order
    return _get_order(size)


def relabel_boot(df: pl.DataFrame, **cols) -> pl.DataFrame:
    return df.with_columns(*(pl.lit(v).alias(k) for k, v in cols.items()))


def with_kernel_values(df: pl.DataFrame, present: int, possible: int, **params) -> pl.DataFrame:
    """Replace order and objs_per_slab by what calculate_order() gives for these inputs."""
    orders = [kernel_618_order(s, present, possible, **params) for s in df["slab_size"]]
    objs = [min((PAGE << o) // s, 32767) for o, s in zip(orders, df["slab_size"])]
    return df.with_columns(pl.Series("order", orders, pl.Int64),
                           pl.Series("objs_per_slab", objs, pl.Int64))


def test_scalar_rules_reproduce_the_host(host_df):
    """The restatement above is right: it gives the host's own orders."""
    again = with_kernel_values(host_df, 2, 2)
    assert again["order"].to_list() == host_df["order"].to_list()
    assert again["objs_per_slab"].to_list() == host_df["objs_per_slab"].to_list()


# --------------------------------------------------------------------------- host


def test_host_fixture_every_cache_matches(host_df):
    """Every cache of the 6.18 host, the two with opt-in sheaves included: their creators'
    requests (32, model/caches.py) are what v6.18 takes as the capacity."""
    r = check.check_snapshot(host_df)
    assert len(r.boots) == 1 and r.boots[0].profile == "v6.18"
    assert (r.caches, r.comparable, r.matched) == (235, 235, 235)
    assert r.ok and not r.mismatches and not r.not_comparable
    assert {f: (c.matched, c.total) for f, c in r.fields.items()} == {
        f: (235, 235) for f in check.COMPARED_FIELDS}
    opt_in = host_df.filter(pl.col("sheaf_capacity") > 0)
    assert sorted(zip(opt_in["cache"], opt_in["sheaf_capacity"])) == [
        ("maple_node", 32), ("vm_area_struct", 32)]
    assert check.explicit_sheaf("maple_node") == check.explicit_sheaf("vm_area_struct") == 32
    b = r.boots[0]
    assert (b.nr_cpu_ids, b.present, b.online, b.nodes) == (2, 2, 2, 1)
    assert tuple(b.params) == (0, 3, 0)


@pytest.mark.skipif(not LIVE, reason="/sys/kernel/slab is not readable here")
def test_live_host_check():
    df = take_snapshot()
    r = check.check_snapshot(df)
    debug = pl.sum_horizontal(*snapshot.DEBUG_FLAG_COLUMNS) > 0
    known = [n for n in df["cache"] if check.explicit_sheaf(n)]
    explicit = (pl.col("sheaf_capacity").fill_null(0) > 0) & ~pl.col("cache").is_in(known)
    if r.boots[0].profile != "v6.18":
        explicit = pl.lit(False)
    expected = set(df.filter(debug | explicit)["cache"])
    assert {n.cache for n in r.not_comparable} == expected
    assert r.comparable == df.height - len(expected)
    assert r.ok, r.mismatches[:5]


def test_older_profile_reports_sheaf_mismatches(host_df):
    """Under v6.1 (no sheaves) the two opt-in caches are comparable and disagree."""
    r = check.check_snapshot(host_df, "v6.1")
    assert not r.ok and r.comparable == 235 and r.matched == 233
    assert sorted((m.cache, m.field, m.kernel, m.model) for m in r.mismatches) == [
        ("maple_node", "sheaf_capacity", 32, 0), ("vm_area_struct", "sheaf_capacity", 32, 0)]


def test_debug_flags_are_not_comparable(host_df):
    # synthetic: one real row with red_zone/poison marked set, to exercise the exclusion
    df = host_df.with_columns(
        pl.when(pl.col("cache") == "dentry").then(1).otherwise(pl.col(c)).alias(c)
        for c in ("red_zone", "poison"))
    r = check.check_snapshot(df)
    reasons = {n.cache: n.reason for n in r.not_comparable}
    assert "debug flags set (red_zone, poison)" in reasons["dentry"]
    assert (r.comparable, r.matched) == (234, 234)


def test_opt_in_capacity_the_model_does_not_know_is_set_aside(host_df):
    """Under v6.18 a cache with sheaves whose creator's request the model does not know
    (synthetic: dentry marked with 16) is set aside; maple_node's known 32 is compared."""
    df = host_df.with_columns(
        pl.when(pl.col("cache") == "dentry").then(16).otherwise(pl.col("sheaf_capacity"))
        .alias("sheaf_capacity"))
    r = check.check_snapshot(df)
    assert [(n.cache, n.reason) for n in r.not_comparable] == [
        ("dentry", "explicit sheaf capacity 16 set by the cache's creator, not known to the "
                   "model (opt-in sheaves)")]
    assert r.ok and (r.comparable, r.matched) == (234, 234)


def test_no_sheaf_file_skips_that_field(host_df):
    df = host_df.with_columns(pl.lit(None, pl.Int64).alias("sheaf_capacity"))
    r = check.check_snapshot(df, "v6.1")
    assert r.ok and r.fields["sheaf_capacity"].total == 0 and r.fields["order"].total == 235


# --------------------------------------------------------------------------- several boots
# SYNTHETIC fixtures for the grouping logic only: real host rows plus copies standing for
# other boots, whose order/objs_per_slab are recomputed with the kernel rules above (not
# measured).  Real multi-kernel snapshots come from the qemu guest validator.


def _insert_before_dashdash(cmdline: str, extra: str) -> str:
    head, sep, tail = cmdline.partition(" -- ")
    return f"{head} {extra}{sep}{tail}"


GUEST = DATA / "guest-v6.1-4cpu-2node.csv"


@pytest.mark.skipif(not GUEST.exists(), reason="no committed guest snapshot")
def test_real_two_kernel_snapshot(tmp_path, host_df):
    """Two REAL boots in one file: this host (6.18, 2 CPUs, 1 node) and a qemu guest of
    Debian's 6.1 kernel (4 CPUs, node 1 memoryless, slub_max_order=2) recorded by the guest
    validator.  Each boot is detected and checked on its own profile, cmdline and topology."""
    guest = snapshot.read_snapshot(GUEST)
    both = tmp_path / "two-kernels.csv"
    pl.concat([host_df, guest], how="diagonal_relaxed").write_csv(both)
    r = check.check_snapshot(snapshot.read_snapshot(both))
    assert [(b.profile, b.present, b.nodes, b.params.max_order) for b in r.boots] == [
        ("v6.18", 2, 1, 3), ("v6.1", 4, 2, 2)]
    assert r.boots[1].caches == guest.height
    assert (r.caches, r.comparable) == (235 + guest.height, 235 + guest.height)
    assert r.ok and r.matched == r.comparable
    # 6.1 has no sheaf_capacity file: that field is compared for the host's caches only
    assert r.fields["sheaf_capacity"].total == 235
    assert r.fields["order"].total == 235 + guest.height


GUEST_612 = DATA / "guest-v6.12-4cpu-2node.csv"


@pytest.mark.skipif(not (GUEST.exists() and GUEST_612.exists()), reason="no guest snapshots")
def test_real_three_kernel_snapshot(tmp_path, host_df):
    """Three REAL boots (6.18 host, 6.1 and 6.12 guests) in one parquet file."""
    parts = [host_df, snapshot.read_snapshot(GUEST), snapshot.read_snapshot(GUEST_612)]
    path = tmp_path / "three.parquet"
    pl.concat(parts, how="diagonal_relaxed").write_parquet(path)
    r = check.check_snapshot(snapshot.read_snapshot(path))
    assert [b.profile for b in r.boots] == ["v6.18", "v6.1", "v6.12"]
    assert [b.caches for b in r.boots] == [p.height for p in parts]
    assert r.ok and r.matched == r.comparable == sum(p.height for p in parts)


def test_two_boots_each_checked_with_its_own_cmdline(host_df):
    line = _insert_before_dashdash(host_df["cmdline"][0], "slub_max_order=1")
    boot1 = with_kernel_values(relabel_boot(host_df, cmdline=line), 2, 2, max_order=1)
    changed = (boot1["order"] != host_df["order"]).sum()
    assert changed >= 10  # the parameter matters to this fixture
    r = check.check_snapshot(pl.concat([host_df, boot1]))
    assert len(r.boots) == 2 and r.boots[1].params.max_order == 1
    assert (r.caches, r.comparable, r.matched) == (470, 470, 470)
    assert r.ok


def test_boot_values_are_not_mixed_up(host_df):
    """The second boot claims slub_max_order=1 but carries the first boot's values: only
    its caches whose order the parameter changes mismatch, and only in order/objs."""
    line = _insert_before_dashdash(host_df["cmdline"][0], "slub_max_order=1")
    boot1 = relabel_boot(host_df, cmdline=line)
    expected = with_kernel_values(boot1, 2, 2, max_order=1)
    differs = set(expected.filter(expected["order"] != host_df["order"])["cache"])
    r = check.check_snapshot(pl.concat([host_df, boot1]))
    assert {m.boot for m in r.mismatches} == {1}
    assert {m.cache for m in r.mismatches if m.field == "order"} == differs
    assert {m.field for m in r.mismatches} <= {"order", "objs_per_slab"}
    assert r.matched == 470 - len(differs)


def test_boots_differ_by_topology(host_df):
    # a boot with 64 present CPUs: min_objects 4 * (fls(64) + 1) = 32
    boot1 = relabel_boot(host_df, cpus_possible="0-63", cpus_present="0-63", cpus_online="0-63")
    boot1 = with_kernel_values(boot1, 64, 64)
    assert (boot1["order"] != host_df["order"]).sum() >= 10
    r = check.check_snapshot(pl.concat([boot1, host_df]))
    assert [b.present for b in r.boots] == [64, 2]
    assert r.ok and r.matched == 470


def test_parameters_after_dashdash_are_ignored(host_df):
    boot1 = relabel_boot(host_df, cmdline=host_df["cmdline"][0] + " slub_max_order=1")
    r = check.check_snapshot(pl.concat([host_df, boot1]))
    assert len(r.boots) == 2 and r.boots[1].params.max_order == 3 and r.ok


# --------------------------------------------------------------------------- errors


def test_library_errors(host_df):
    with pytest.raises(SlabtuneError, match="--profile: unknown kernel profile 'v9'"):
        check.check_snapshot(host_df, "v9")
    bad = relabel_boot(host_df, kernel_release="custom-kernel")
    with pytest.raises(SlabtuneError, match="boot 0 \\(custom-kernel\\).*pass --profile"):
        check.check_snapshot(bad)
    line = _insert_before_dashdash(host_df["cmdline"][0], "slub_max_order=11")
    with pytest.raises(SlabtuneError, match="slub_max_order=11: must be an integer in 0..10"):
        check.check_snapshot(relabel_boot(host_df, cmdline=line))
    with pytest.raises(SlabtuneError, match="present"):
        check.check_snapshot(relabel_boot(host_df, cpus_present="0-7"))


def test_is_kmalloc_and_early():
    for name in ("kmalloc-64", "dma-kmalloc-8k", "kmalloc-rcl-1k", "kmalloc-cg-96"):
        assert check.is_kmalloc(name) and check.is_early(name)
    assert not check.is_kmalloc("kmalloc_buckets") and not check.is_kmalloc("memdup_user-64")
    assert check.is_bootstrap("kmem_cache_node") and not check.is_bootstrap("kmalloc-8")
    assert check.is_early("kmem_cache") and not check.is_early("ext4_inode_cache")


def test_v511_early_caches_see_one_cpu(host_df):
    """Under v5.11's num_online_cpus() rule early caches size for 1 CPU, others for 2."""
    sizes = host_df["slab_size"].to_numpy()
    names = host_df["cache"].to_list()
    from slabtune.model.bootparams import SlubParams
    from slabtune.model.profiles import get_profile
    from slabtune.model.topology import Topology
    topo = Topology.uniform(64)
    pred = check.predict_boot(sizes, names, topo, get_profile("v5.11"), SlubParams())
    i = names.index("kmalloc-512")
    # v5.11 decrement loop, size 512: min_objects 4*(fls(1)+1) = 8 fits order 0 (8 objects)
    assert pred["order"][i] == 0
    j = names.index("ext4_inode_cache")
    pred64 = check.predict_boot(sizes, ["x"] * len(names), topo, get_profile("v5.11"),
                                SlubParams())
    assert pred64["order"][i] == 2  # late: 64 CPUs, 4 * (fls(64) + 1) = 32 objects, 16 KiB
    assert pred["order"][j] == pred64["order"][j]


# --------------------------------------------------------------------------- CLI


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(SLABTUNE), *args], capture_output=True, text=True, timeout=120)


def _one_error_line(proc, pattern: str):
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert lines[0].startswith("slabtune: error: ")
    assert pattern in lines[0], lines[0]


@pytest.mark.slow
def test_cli_check_fixture_text_and_json(tmp_path, host_df):
    proc = run_cli("kernel", "check", "--snapshot", str(FIXTURE))
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert lines[-1].startswith("matched 235/235 caches")
    assert lines[0].startswith("boot 0: 6.18.44-fc-v509 profile v6.18")
    proc = run_cli("kernel", "check", "--snapshot", str(FIXTURE), "--json")
    assert proc.returncode == 0
    out = json.loads(proc.stdout)
    assert {k: out[k] for k in ("boots", "caches", "comparable", "matched")} == {
        "boots": 1, "caches": 235, "comparable": 235, "matched": 235}
    assert out["fields"]["order"] == {"matched": 235, "total": 235}
    assert out["mismatches"] == [] and out["not_comparable"] == []
    debug = tmp_path / "debug.csv"
    host_df.with_columns(pl.when(pl.col("cache") == "dentry").then(1)
                         .otherwise(pl.col("poison")).alias("poison")).write_csv(debug)
    proc = run_cli("kernel", "check", "--snapshot", str(debug), "--json")
    assert proc.returncode == 0
    (aside,) = json.loads(proc.stdout)["not_comparable"]
    assert set(aside) == {"boot", "cache", "reason"} and aside["cache"] == "dentry"


@pytest.mark.slow
def test_cli_mismatch_exits_1_with_table():
    proc = run_cli("kernel", "check", "--snapshot", str(FIXTURE), "--profile", "v6.1")
    assert proc.returncode == 1
    assert "mismatches (2):" in proc.stdout
    assert any(line.split()[1:] == ["maple_node", "sheaf_capacity", "32", "0"]
               for line in proc.stdout.splitlines() if "maple_node" in line)
    proc = run_cli("kernel", "check", "--snapshot", str(FIXTURE), "--profile", "v6.1", "--json")
    assert proc.returncode == 1
    assert json.loads(proc.stdout)["mismatches"][0] == {
        "boot": 0, "cache": "maple_node", "field": "sheaf_capacity", "kernel": 32, "model": 0}


@pytest.mark.slow
@pytest.mark.skipif(not LIVE, reason="/sys/kernel/slab is not readable here")
def test_cli_snapshot_then_check(tmp_path):
    out = tmp_path / "host.parquet"
    proc = run_cli("kernel", "snapshot", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    assert pl.read_parquet(out).columns[:15] == list(snapshot.SNAPSHOT_COLUMNS)
    proc = run_cli("kernel", "check", "--snapshot", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    proc = run_cli("kernel", "check")
    assert proc.returncode == 0 and "matched" in proc.stdout.splitlines()[-1]


def test_cli_bad_inputs(tmp_path, host_df):
    _one_error_line(run_cli("kernel", "check", "--snapshot", str(FIXTURE), "--profile", "v9"),
                    "unknown kernel profile 'v9'")
    zero = tmp_path / "zero.csv"
    host_df.with_columns(
        pl.when(pl.col("cache") == "dentry").then(0).otherwise(pl.col("slab_size"))
        .alias("slab_size")).write_csv(zero)
    _one_error_line(run_cli("kernel", "check", "--snapshot", str(zero)),
                    "(cache dentry): slab_size is 0 (must be >= 1)")
    big = tmp_path / "big.csv"
    line = _insert_before_dashdash(host_df["cmdline"][0], "slub_max_order=11")
    relabel_boot(host_df, cmdline=line).write_csv(big)
    _one_error_line(run_cli("kernel", "check", "--snapshot", str(big)),
                    "cmdline slub_max_order=11: must be an integer in 0..10")
    _one_error_line(run_cli("kernel", "check", "--snapshot", str(tmp_path / "absent.csv")),
                    "absent.csv: cannot read snapshot: no such file")
    junk = tmp_path / "junk.parquet"
    junk.write_bytes(b"not a parquet file at all")
    _one_error_line(run_cli("kernel", "check", "--snapshot", str(junk)),
                    "junk.parquet: malformed snapshot")
    ragged = tmp_path / "ragged.csv"
    ragged.write_text("kernel_release,cmdline\n6.1\n")
    _one_error_line(run_cli("kernel", "check", "--snapshot", str(ragged)), "ragged.csv")
    _one_error_line(run_cli("kernel", "snapshot", "--out", str(tmp_path / "s.txt")),
                    "unknown snapshot format '.txt'")

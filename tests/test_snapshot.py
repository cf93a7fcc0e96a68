"""The snapshot format: kernel list helpers, sysfs snapshots of this host, CSV/parquet I/O and
validation of bad files."""

from __future__ import annotations

import os
from pathlib import Path

import polars as pl
import pytest
from hypothesis import given
from hypothesis import strategies as st

from slabtune.errors import SlabtuneError
from slabtune.kernel import host, snapshot

DATA = Path(__file__).parent / "data"
FIXTURE = DATA / "host_snapshot_6.18.csv"
SLAB = Path("/sys/kernel/slab")
LIVE = SLAB.is_dir() and os.access(SLAB, os.R_OK | os.X_OK)
live = pytest.mark.skipif(not LIVE, reason="/sys/kernel/slab is not readable here")


# --------------------------------------------------------------------------- kernel lists


@pytest.mark.parametrize("text, ids", [
    ("0-3,8", (0, 1, 2, 3, 8)),
    ("0", (0,)),
    ("", ()),
    ("0,2", (0, 2)),
    ("0-1", (0, 1)),
    ("4-7,0-1", (0, 1, 4, 5, 6, 7)),
    ("0-7:2/4", (0, 1, 4, 5)),  # bitmap_parselist group syntax: 2 of every 4
    (" 0-63\n", tuple(range(64))),
])
def test_parse_cpulist(text, ids):
    assert snapshot.parse_cpulist(text) == ids


@pytest.mark.parametrize("ids, text", [
    ([0, 1, 2, 3, 8], "0-3,8"),
    ([5], "5"),
    ([], ""),
    ([3, 1, 2, 2, 7, 9, 8], "1-3,7-9"),
    (range(8192), "0-8191"),
])
def test_format_cpulist(ids, text):
    assert snapshot.format_cpulist(ids) == text


@pytest.mark.parametrize("bad", ["3-1", "a", "0-", "1,,2", "-1", "0-3:5/4", "0x1"])
def test_parse_cpulist_rejects(bad):
    with pytest.raises(ValueError):
        snapshot.parse_cpulist(bad)


@given(st.sets(st.integers(0, 600), max_size=80))
def test_cpulist_round_trip(ids):
    text = snapshot.format_cpulist(ids)
    assert snapshot.parse_cpulist(text) == tuple(sorted(ids))
    # %*pbl never prints two adjacent items that could merge into one range
    parts = text.split(",") if text else []
    assert len(parts) == len(set(parts))


# --------------------------------------------------------------------------- host topology


@live
def test_host_topology_matches_sysfs():
    cpu = Path("/sys/devices/system/cpu")
    h = host.read_host_topology()
    possible = snapshot.parse_cpulist((cpu / "possible").read_text())
    present = snapshot.parse_cpulist((cpu / "present").read_text())
    online = snapshot.parse_cpulist((cpu / "online").read_text())
    assert h.cpus_possible == (cpu / "possible").read_text().strip()
    assert h.topology.possible == max(possible) + 1  # nr_cpu_ids
    assert h.topology.present == len(present)
    assert h.topology.online == len(online)
    assert sum(h.topology.node_cpus) == len(present)
    mem = set(snapshot.parse_cpulist(h.nodes_with_memory))
    assert {h.node_ids[i] for i in h.topology.memory_nodes} == mem


def test_topology_from_lists_memoryless_and_gaps():
    # node 2 has CPUs but no memory; node ids 0 and 2 become dense indexes 0 and 1
    topo, ids = host.topology_from_lists("0-7", "0-7", "0-5", "0", "0,2",
                                         {0: "0-3", 2: "4-7"})
    assert ids == (0, 2)
    assert topo.node_cpus == (4, 4)
    assert topo.node_has_memory == (True, False)
    assert (topo.possible, topo.present, topo.online) == (8, 8, 6)
    assert topo.cpus_on_memoryless_nodes == 4


def test_topology_from_lists_nr_cpu_ids_and_unmapped_cpus():
    # possible 0-63 with 4 present: nr_cpu_ids is 64; CPU 3 is on no node list (offline
    # CPUs are unmapped on x86) and lands on the first CPU node
    topo, _ = host.topology_from_lists("0-63", "0-3", "0-2", "0-1", "0-1", {0: "0-1", 1: "2"})
    assert (topo.possible, topo.present, topo.online) == (64, 4, 3)
    assert topo.node_cpus == (3, 1)


def test_topology_from_lists_even_spread_without_node_lists():
    topo, _ = host.topology_from_lists("0-9", "0-9", "0-9", "0-1", "0-1")
    assert topo.node_cpus == (5, 5)


@pytest.mark.parametrize("args, field", [
    (("", "0", "0", "0", "0"), "cpus_possible"),
    (("0-3", "0-5", "0-3", "0", "0"), "present"),
    (("0-3", "0-3", "x", "0", "0"), "'x'"),
])
def test_topology_from_lists_rejects(args, field):
    with pytest.raises(SlabtuneError, match=field):
        host.topology_from_lists(*args)


def test_host_reader_names_missing_tree(tmp_path):
    with pytest.raises(SlabtuneError, match="possible"):
        host.read_host_topology(tmp_path)
    with pytest.raises(SlabtuneError, match="sys/kernel/slab"):
        host.read_slab_caches(tmp_path)


# --------------------------------------------------------------------------- live snapshot


def _first_int(path: Path) -> int:
    return int(path.read_text().split()[0])


@live
def test_live_snapshot_matches_sysfs():
    df = host.take_snapshot()
    real = sorted(p.name for p in SLAB.iterdir() if p.is_dir() and not p.is_symlink())
    links = [p for p in SLAB.iterdir() if p.is_symlink()]
    assert tuple(df.columns[: len(snapshot.SNAPSHOT_COLUMNS)]) == snapshot.SNAPSHOT_COLUMNS
    # caches come and go; compare names that exist both before and after
    assert abs(df.height - len(real)) <= 2
    assert df["kernel_release"].unique().to_list() == [os.uname().release]
    assert df["cmdline"][0] == Path("/proc/cmdline").read_text().strip()
    assert df["cpus_online"][0] == Path("/sys/devices/system/cpu/online").read_text().strip()
    assert abs(int(df["aliases"].sum()) - len(links)) <= 2
    row = df.filter(pl.col("cache") == "kmalloc-64").row(0, named=True)
    for col in ("object_size", "slab_size", "order", "objs_per_slab", "min_partial",
                "cpu_partial"):
        assert row[col] == _first_int(SLAB / "kmalloc-64" / col), col
    has_sheaf = (SLAB / "kmalloc-64" / "sheaf_capacity").exists()
    assert (row["sheaf_capacity"] is not None) == has_sheaf


@live
def test_live_snapshot_round_trips(tmp_path):
    df = host.take_snapshot()
    for name in ("s.csv", "s.parquet"):
        path = snapshot.write_snapshot(df, tmp_path / name)
        back = snapshot.read_snapshot(path)
        assert back.equals(df), name


# --------------------------------------------------------------------------- fixture


def test_committed_fixture_reads():
    df = snapshot.read_snapshot(FIXTURE)
    assert df.height == 235
    assert df["kernel_release"].unique().to_list() == ["6.18.44-fc-v509"]
    assert tuple(df.columns[:15]) == snapshot.SNAPSHOT_COLUMNS
    sheaf = df.filter(pl.col("sheaf_capacity") > 0)["cache"].sort().to_list()
    assert sheaf == ["maple_node", "vm_area_struct"]
    assert df["cmdline"][0].startswith("mitigations=auto")
    assert df.schema["slab_size"] == pl.Int64 and df.schema["cpus_possible"] == pl.String


def test_csv_with_empty_sheaf_capacity_is_null(tmp_path):
    """A kernel without sheaves (before v6.18) has no sheaf_capacity file: empty cells."""
    df = snapshot.read_snapshot(FIXTURE).with_columns(
        pl.lit(None, pl.Int64).alias("sheaf_capacity"))
    path = snapshot.write_snapshot(df, tmp_path / "old.csv")
    text = path.read_text().splitlines()
    assert text[1].split(",")[-11] == ""  # sheaf_capacity sits before the 10 extras
    back = snapshot.read_snapshot(path)
    assert back["sheaf_capacity"].null_count() == back.height


# --------------------------------------------------------------------------- bad files


def _write_csv(tmp_path, df: pl.DataFrame, name="bad.csv") -> Path:
    path = tmp_path / name
    df.write_csv(path)
    return path


@pytest.fixture(scope="module")
def fixture_df():
    return snapshot.read_snapshot(FIXTURE)


def _set(df: pl.DataFrame, cache: str, col: str, value) -> pl.DataFrame:
    return df.with_columns(
        pl.when(pl.col("cache") == cache).then(pl.lit(value)).otherwise(pl.col(col)).alias(col))


@pytest.mark.parametrize("col, value, pattern", [
    ("slab_size", 0, r"cache kmalloc-64\): slab_size is 0 \(must be >= 1\)"),
    ("object_size", -8, r"cache kmalloc-64\): object_size is -8"),
    ("objs_per_slab", 0, r"cache kmalloc-64\): objs_per_slab is 0"),
    ("order", -1, r"cache kmalloc-64\): order is -1"),
])
def test_bad_values_name_cache_and_column(tmp_path, fixture_df, col, value, pattern):
    path = _write_csv(tmp_path, _set(fixture_df, "kmalloc-64", col, value))
    with pytest.raises(SlabtuneError, match=pattern):
        snapshot.read_snapshot(path)


def test_non_integer_names_column(tmp_path, fixture_df):
    df = fixture_df.with_columns(pl.col("order").cast(pl.String))
    df = _set(df, "dentry", "order", "three")
    with pytest.raises(SlabtuneError,
                       match=r"cache dentry\): column order: 'three' is not an integer"):
        snapshot.read_snapshot(_write_csv(tmp_path, df))


def test_missing_column(tmp_path, fixture_df):
    with pytest.raises(SlabtuneError, match="missing column.*objs_per_slab"):
        snapshot.read_snapshot(_write_csv(tmp_path, fixture_df.drop("objs_per_slab")))


def test_slab_size_below_object_size(tmp_path, fixture_df):
    df = _set(fixture_df, "kmalloc-64", "slab_size", 32)
    with pytest.raises(SlabtuneError, match="slab_size 32 is smaller than object_size 64"):
        snapshot.read_snapshot(_write_csv(tmp_path, df))


def test_bad_cpu_list(tmp_path, fixture_df):
    df = fixture_df.with_columns(pl.lit("0-x").alias("cpus_present"))
    with pytest.raises(SlabtuneError, match="column cpus_present: '0-x' is not kernel list"):
        snapshot.read_snapshot(_write_csv(tmp_path, df))


def test_duplicate_cache(tmp_path, fixture_df):
    df = pl.concat([fixture_df, fixture_df.head(1)])
    with pytest.raises(SlabtuneError, match="appears twice"):
        snapshot.read_snapshot(_write_csv(tmp_path, df))


@pytest.mark.parametrize("content, pattern", [
    (b"", "malformed snapshot"),
    (b"kernel_release,cache\n6.1,x\n", "missing column"),
    (b"\x00\xff\xfe garbage \x00\n\x01", "malformed snapshot|missing column"),
])
def test_malformed_csv(tmp_path, content, pattern):
    path = tmp_path / "m.csv"
    path.write_bytes(content)
    with pytest.raises(SlabtuneError, match=pattern) as err:
        snapshot.read_snapshot(path)
    assert str(path) in str(err.value) and "\n" not in str(err.value)


def test_malformed_parquet(tmp_path):
    path = tmp_path / "m.parquet"
    path.write_bytes(b"PAR1 this is not parquet")
    with pytest.raises(SlabtuneError, match="m.parquet: malformed snapshot"):
        snapshot.read_snapshot(path)


def test_unreadable_paths(tmp_path):
    with pytest.raises(SlabtuneError, match="no such file"):
        snapshot.read_snapshot(tmp_path / "absent.csv")
    (tmp_path / "d.csv").mkdir()
    with pytest.raises(SlabtuneError, match="is a directory"):
        snapshot.read_snapshot(tmp_path / "d.csv")
    with pytest.raises(SlabtuneError, match=r"unknown snapshot format '.json'"):
        snapshot.read_snapshot(tmp_path / "x.json")


def test_write_refuses_missing_directory(tmp_path, fixture_df):
    with pytest.raises(SlabtuneError, match="does not exist"):
        snapshot.write_snapshot(fixture_df, tmp_path / "no" / "s.csv")

"""SLAB snapshots: /proc/slabinfo of a CONFIG_SLAB kernel (the "6.1-slab" build), which has
no /sys/kernel/slab.

The fixtures come from one real boot of 6.1-slab (``slabtune guest boot --kernel
~/.cache/slabtune/kernels/6.1-slab/bzImage --cpus 2 --accel tcg``, hackbench by default):
``slabinfo-v6.1-slab.txt`` is the ``before`` dump's /proc/slabinfo as the guest's /init read
it (its ``H`` and ``P`` records, one line each, as the shell's ``read`` returned them),
``guest-v6.1-slab-2cpu-1node.csv`` the before snapshot of the same boot and ``-after.csv``
the snapshot after the hackbench round.  Expected values below are read off the text.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

from slabtune.errors import SlabtuneError
from slabtune.kernel import build, check, guest, snapshot

DATA = Path(__file__).parent / "data"
SLABINFO = DATA / "slabinfo-v6.1-slab.txt"
FIXTURE = DATA / "guest-v6.1-slab-2cpu-1node.csv"
FIXTURE_AFTER = DATA / "guest-v6.1-slab-2cpu-1node-after.csv"
PAGE_SIZE = 4096
BOOT = {"kernel_release": "6.1.192-slabtune-slab", "cmdline": "console=ttyS0 panic=-1",
        "cpus_possible": "0-1", "cpus_present": "0-1", "cpus_online": "0-1",
        "nodes_with_memory": "0", "nodes_with_cpu": "0"}


def _text_fields(name: str) -> list[str]:
    """The whitespace-separated fields of cache ``name``'s line in the fixture text."""
    for line in SLABINFO.read_text().splitlines():
        if line.split()[:1] == [name]:
            return line.split()
    raise AssertionError(f"{name} not in {SLABINFO}")


# --------------------------------------------------------------------------- the parser


def test_fixture_text_is_slabinfo_2_1():
    lines = SLABINFO.read_text().splitlines()
    assert lines[0] == "slabinfo - version: 2.1"
    assert snapshot.slabinfo_version(lines[0]) == "2.1"
    assert lines[1].startswith("# name            <active_objs> <num_objs> <objsize>")


def test_parse_kmalloc_512_as_the_kernel_printed_it():
    rows = {r["cache"]: r for r in snapshot.parse_slabinfo(SLABINFO.read_text())}
    f = _text_fields("kmalloc-512")
    # name active num objsize objperslab pagesperslab : tunables l b s : slabdata a n avail
    assert f[3:6] == ["512", "8", "1"] and f[8:11] == ["54", "27", "8"]
    r = rows["kmalloc-512"]
    assert (r["slab_size"], r["objs_per_slab"], r["order"]) == (512, 8, 0)
    assert (r["limit"], r["batchcount"], r["sharedfactor"]) == (54, 27, 8)
    assert (r["objects"], r["total_objects"]) == (int(f[1]), int(f[2]))
    assert (r["active_slabs"], r["slabs"], r["shared_avail"]) == tuple(map(int, f[13:16]))
    assert r["allocator"] == "slab"


def test_parse_every_line_of_the_fixture():
    text = SLABINFO.read_text()
    rows = snapshot.parse_slabinfo(text)
    cache_lines = [ln for ln in text.splitlines()[2:] if ln.strip()]
    assert [r["cache"] for r in rows] == [ln.split()[0] for ln in cache_lines]
    assert len(rows) > 40
    for r, ln in zip(rows, cache_lines):
        f = ln.split()
        assert r["slab_size"] == int(f[3]) and r["objs_per_slab"] == int(f[4])
        assert PAGE_SIZE << r["order"] == PAGE_SIZE * int(f[5])
        assert r["total_objects"] == r["slabs"] * r["objs_per_slab"]   # num_objs
        assert r["objs_per_slab"] * r["slab_size"] <= PAGE_SIZE << r["order"]
    by = {r["cache"]: r for r in rows}
    # objsize is the cache's size (the stride), not the object size: kmalloc-96 objects
    # take a 128-byte, cache-line aligned stride under SLAB.
    assert by["kmalloc-96"]["slab_size"] == int(_text_fields("kmalloc-96")[3]) == 128
    # an order-1 cache as printed: pagesperslab 2
    assert by["task_struct"]["order"] == 1 and _text_fields("task_struct")[5] == "2"


def test_parse_statistics_variant_and_bad_lines():
    """CONFIG_DEBUG_SLAB prints "2.1 (statistics)" and two more groups per line."""
    text = ("slabinfo - version: 2.1 (statistics)\n# name ...\n"
            "kmalloc-64 100 128 64 64 1 : tunables 120 60 8 : slabdata 2 2 0 : globalstat "
            "300 128 2 0 0 0 0 0 0 : cpustat 250 10 240 5\n")
    (r,) = snapshot.parse_slabinfo(text)
    assert (r["cache"], r["objects"], r["total_objects"], r["slabs"]) == ("kmalloc-64", 100,
                                                                          128, 2)
    with pytest.raises(ValueError, match="version '2.0' is not supported"):
        snapshot.parse_slabinfo("slabinfo - version: 2.0\n")
    with pytest.raises(ValueError, match="line 2: not a /proc/slabinfo cache line"):
        snapshot.parse_slabinfo("slabinfo - version: 2.1\nkmalloc-64 1 2 3\n")
    with pytest.raises(ValueError, match="pagesperslab 3 is not a power of two"):
        snapshot.parse_slabinfo_line("x 1 1 64 1 3 : tunables 1 1 0 : slabdata 1 1 0")
    with pytest.raises(ValueError, match="cache x: a field is not an integer"):
        snapshot.parse_slabinfo_line("x 1 1 64 1 one : tunables 1 1 0 : slabdata 1 1 0")
    with pytest.raises(ValueError, match="empty"):
        snapshot.parse_slabinfo("\n")


# --------------------------------------------------------------------------- console records


def _console(token: str = "t0k", count: int | None = None) -> str:
    text = SLABINFO.read_text().splitlines()
    n = len(text) - 2 if count is None else count
    lines = ["[    0.000000] Linux version 6.1.192-slabtune-slab", f"@@ST S {token} 1.25"]
    for phase in ("before", "after", "flushed"):
        for k, col in (("release", "kernel_release"), ("cmdline", "cmdline"),
                       ("cpus_possible", "cpus_possible"), ("cpus_present", "cpus_present"),
                       ("cpus_online", "cpus_online"), ("has_memory", "nodes_with_memory"),
                       ("has_cpu", "nodes_with_cpu")):
            lines.append(f"@@ST I {phase} {k} {BOOT[col]}")
        lines += [f"@@ST H {phase} {ln}" for ln in text[:2]]
        lines += [f"@@ST P {phase} {ln}" for ln in text[2:]]
        lines.append(f"@@ST N {phase} {n}")
    lines.append(f"@@ST E {token}")
    return "\r\n".join(lines) + "\r\n"


def test_guest_console_slabinfo_records_make_a_slab_frame():
    parsed = guest.parse_console(_console(), "t0k")
    assert parsed.slabinfo_header["before"][0] == "slabinfo - version: 2.1"
    df = guest.snapshot_frame(parsed, "before", "tcg")
    assert df.columns == (list(snapshot.SNAPSHOT_COLUMNS) + list(snapshot.EXTRA_COLUMNS)
                          + list(snapshot.SLAB_COLUMNS) + ["phase", "accelerator"])
    assert df["cache"].to_list() == sorted(df["cache"].to_list())
    assert snapshot.allocator(df) == "slab" and set(df["allocator"]) == {"slab"}
    for c in snapshot.SLAB_NULL_COLUMNS + snapshot.DEBUG_FLAG_COLUMNS + ("partial", "aliases"):
        assert df[c].null_count() == df.height, c
    k = df.filter(pl.col("cache") == "kmalloc-512").row(0, named=True)
    assert (k["slab_size"], k["objs_per_slab"], k["order"], k["limit"], k["batchcount"],
            k["sharedfactor"]) == (512, 8, 0, 54, 27, 8)
    assert k["kernel_release"] == BOOT["kernel_release"]
    snapshot.validate_snapshot(df)


def test_guest_console_slabinfo_count_and_header_are_checked():
    with pytest.raises(guest.ConsoleParseError, match="init counted 99"):
        guest.parse_console(_console(count=99), "t0k")
    with pytest.raises(guest.ConsoleParseError, match="before its header"):
        guest.parse_console("@@ST P before kmalloc-8 1 1 8 1 1 : tunables 1 1 0 : "
                            "slabdata 1 1 0\n", "t0k")
    with pytest.raises(guest.ConsoleParseError, match="version '3.0'"):
        guest.parse_console("@@ST H before slabinfo - version: 3.0\n", "t0k")


def test_init_script_reads_slabinfo_without_sysfs_and_flushes_through_it():
    script = guest.init_script("abc123", (guest.WorkloadSpec(),))
    assert "  if [ ! -d /sys/kernel/slab ]; then" in script
    assert "done < /proc/slabinfo" in script
    assert 'echo "$c $l $b $s" > /proc/slabinfo 2>/dev/null' in script
    assert (script.index("dump after") < script.index('echo "$c $l $b $s" > /proc/slabinfo')
            < script.index("dump flushed"))


# --------------------------------------------------------------------------- snapshot files


def test_fixture_snapshot_matches_the_text():
    df = snapshot.read_snapshot(FIXTURE)
    assert snapshot.allocator(df) == "slab"
    assert set(df["phase"]) == {"before"}
    text = snapshot.slabinfo_frame(SLABINFO.read_text(), BOOT)
    assert df.select(text.columns).equals(text)
    k = df.filter(pl.col("cache") == "kmalloc-512").row(0, named=True)
    assert (k["objs_per_slab"], PAGE_SIZE << k["order"], k["limit"], k["batchcount"]) == \
        (8, PAGE_SIZE, 54, 27)


def test_fixture_after_hackbench_moved_kmalloc_512():
    before = snapshot.read_snapshot(FIXTURE)
    after = snapshot.read_snapshot(FIXTURE_AFTER)
    assert before["cache"].to_list() == after["cache"].to_list()
    j = before.join(after, on="cache", suffix="_after")
    k = j.filter(pl.col("cache") == "kmalloc-512").row(0, named=True)
    assert k["total_objects_after"] > k["total_objects"]
    assert (j["order"] == j["order_after"]).all()
    assert (j["objs_per_slab"] == j["objs_per_slab_after"]).all()


@pytest.mark.parametrize("suffix", [".csv", ".parquet"])
def test_slab_snapshot_round_trips(tmp_path, suffix):
    df = snapshot.read_snapshot(FIXTURE)
    path = snapshot.write_snapshot(df, tmp_path / f"s{suffix}")
    back = snapshot.read_snapshot(path)
    assert back.equals(df)
    assert back.schema["allocator"] == pl.String and back.schema["limit"] == pl.Int64
    assert back["object_size"].null_count() == back.height


def test_slab_rows_only_may_leave_slub_columns_empty(tmp_path):
    df = snapshot.read_snapshot(FIXTURE)
    bad = df.with_columns(pl.lit("slub").alias("allocator"))
    with pytest.raises(SlabtuneError, match=r"row 1 \(cache Acpi-Operand\): column "
                                            "object_size is empty"):
        snapshot.validate_snapshot(bad, "x")
    odd = df.with_columns(pl.lit("slob").alias("allocator"))
    with pytest.raises(SlabtuneError, match="column allocator: 'slob' is not one of slub, slab"):
        snapshot.validate_snapshot(odd, "x")
    neg = df.with_columns(pl.lit(-1).alias("limit"))
    with pytest.raises(SlabtuneError, match="limit is -1"):
        snapshot.validate_snapshot(neg, "x")


# --------------------------------------------------------------------------- kernel check


def test_check_takes_a_slab_snapshot_with_a_slab_profile_only():
    """Issue 14: a SLAB snapshot is checked against slab-v6.1 (the rules and the other
    fixtures are in tests/test_slab_structure.py); a SLUB profile is refused."""
    df = snapshot.read_snapshot(FIXTURE)
    for profile in (None, "slab-v6.1"):
        r = check.check_snapshot(df, profile, "snap.csv")
        assert r.ok and r.matched == r.caches == df.height
    with pytest.raises(SlabtuneError) as err:
        check.check_snapshot(df, "v6.1", "snap.csv")
    assert str(err.value) == ("snap.csv: a SLAB snapshot (/proc/slabinfo) cannot be checked "
                              "against SLUB profile v6.1 (SLAB profiles: slab-v2.6.33, "
                              "slab-v3.1, slab-v6.1)")


def test_cli_kernel_check_on_a_slab_snapshot_with_a_slub_profile_exits_2_with_one_line():
    p = subprocess.run([sys.executable, "-m", "slabtune.cli", "kernel", "check", "--snapshot",
                        str(FIXTURE), "--profile", "v6.1"], capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 2, p.stderr
    assert p.stdout == ""
    assert p.stderr.strip().splitlines() == [
        f"slabtune: error: {FIXTURE}: a SLAB snapshot (/proc/slabinfo) cannot be checked "
        "against SLUB profile v6.1 (SLAB profiles: slab-v2.6.33, slab-v3.1, slab-v6.1)"]


# --------------------------------------------------------------------------- a real boot


@pytest.mark.guest
@pytest.mark.slow
def test_61_slab_kernel_boots_and_snapshots_slabinfo(tmp_path):
    bz = build.kernel_path("6.1-slab")
    if bz is None:
        pytest.skip("the 6.1-slab kernel is not built; run scripts/build-kernels.sh --only "
                    "6.1-slab")
    try:
        assets = guest.find_assets(kernel=bz)
    except SlabtuneError as exc:
        pytest.skip(f"guest stack not installed ({exc}); run scripts/install-guest-deps.sh")
    from slabtune.model.topology import Topology

    spec = guest.GuestSpec(topology=Topology.uniform(2), workloads=(guest.WorkloadSpec(),),
                           timeout_s=180, accel="tcg")
    r = guest.boot_guest(spec, assets)
    assert r.ok, f"{r.error}\n{r.console_tail}"
    for df in (r.before, r.after, r.flushed):
        assert snapshot.allocator(df) == "slab"
        assert df["kernel_release"][0] == build.build_info("6.1-slab")["kernel_release"]
        km = df.filter(pl.col("cache").str.starts_with("kmalloc-"))
        assert km.height >= 10 and "kmalloc-512" in km["cache"].to_list()
        assert (km["objs_per_slab"] * km["slab_size"]
                <= pl.Series([PAGE_SIZE << o for o in km["order"]])).all()
        assert (df["total_objects"] == df["slabs"] * df["objs_per_slab"]).all()
    k = r.before.filter(pl.col("cache") == "kmalloc-512").row(0, named=True)
    assert (k["slab_size"], k["objs_per_slab"]) == (512, 8)
    path = snapshot.write_snapshot(r.before, tmp_path / "b.csv")
    assert snapshot.read_snapshot(path).equals(r.before)
    # flushing the per-CPU and shared arrays leaves no object in the shared arrays
    assert r.flushed["shared_avail"].sum() == 0

"""The qemu guest validator: real Debian kernels booted under qemu with chosen topologies and
slub_* parameters, the static workload inside, /sys/kernel/slab read before and after and
checked against the policy model.

Boots need qemu, a bzImage and a static busybox (scripts/install-guest-deps.sh, which
``./dev test`` runs first); those tests are marked ``guest`` and skip with the reason when
the pieces are missing.  Parsing, the initramfs, qemu arguments and refusal of bad input run
everywhere.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from pathlib import Path

import polars as pl
import pytest

from slabtune.errors import SlabtuneError
from slabtune.kernel import check, guest, snapshot
from slabtune.kernel.host import topology_from_lists
from slabtune.model import bootparams, profiles
from slabtune.model.topology import Topology

DATA = Path(__file__).parent / "data"
FIXTURE = DATA / "guest-v6.1-4cpu-2node.csv"
FIXTURE_AFTER = DATA / "guest-v6.1-4cpu-2node-after.csv"
FIXTURE_612 = DATA / "guest-v6.12-4cpu-2node.csv"
#: The optional 6.12 kernel (scripts/install-guest-deps.sh --with-6.12).
KERNEL_612 = guest.cache_dir() / "bzImage-6.12"


def _assets_or_none():
    try:
        return guest.find_assets()
    except SlabtuneError as exc:
        return str(exc)


_ASSETS = _assets_or_none()
needs_guest = pytest.mark.skipif(
    isinstance(_ASSETS, str),
    reason=f"guest stack not installed ({_ASSETS}); run scripts/install-guest-deps.sh")

#: 4 CPUs on 2 nodes, node 1 memoryless (CPUs 2-3 have no local memory).
MEMLESS = Topology.uniform(4, nodes=2, memoryless_nodes=(1,))


# --------------------------------------------------------------------------- fake inputs


def _fake_bzimage(path: Path, release: str) -> Path:
    """A file with just an x86 boot header naming ``release`` (enough for profile
    detection; never booted)."""
    img = bytearray(0x400)
    img[0x202:0x206] = b"HdrS"
    img[0x20E:0x210] = (0x300 - 0x200).to_bytes(2, "little")
    text = f"{release} (builder@example) #1 SMP".encode() + b"\0"
    img[0x300:0x300 + len(text)] = text
    path.write_bytes(bytes(img))
    return path


def _sentinel_assets(tmp_path: Path, release: str = "6.1.0-56-cloud-amd64"
                     ) -> tuple[guest.GuestAssets, Path]:
    """Assets whose "qemu" only records that it ran (and exits 0 printing nothing)."""
    ran = tmp_path / "qemu-ran"
    qemu = tmp_path / "qemu"
    qemu.write_text(f"#!/bin/sh\necho ran > {ran}\n")
    qemu.chmod(0o755)
    for name in ("busybox", "workload"):
        (tmp_path / name).write_bytes(b"\x7fELF")
    assets = guest.GuestAssets(qemu=qemu, kernel=_fake_bzimage(tmp_path / "bzImage", release),
                           busybox=tmp_path / "busybox", workload=tmp_path / "workload")
    return assets, ran


# --------------------------------------------------------------------------- refusal


@pytest.mark.parametrize("params, pattern", [
    ({"slub_debug": 1}, "slub_debug.*not allowed"),
    ({"init": 1}, "'init' is not allowed"),
    ({"slub_max_order": 11}, r"slub_max_order: 11 is outside 0..10"),
    ({"slub_min_objects": "8 init=/bin/sh"}, "slub_min_objects.*not an integer"),
    ({"slab_max_order": 2}, "slab_max_order.*not allowed for kernel profile v6.1"),
    ({"slub_min_order": 3, "slub_max_order": 1}, "slub_min_order: 3 is above slub_max_order 1"),
])
def test_disallowed_boot_param_refused_before_qemu(tmp_path, params, pattern):
    assets, ran = _sentinel_assets(tmp_path)
    spec = guest.GuestSpec(topology=MEMLESS, boot_params=params, accel="tcg", timeout_s=5)
    with pytest.raises(SlabtuneError, match=pattern):
        guest.boot_guest(spec, assets)
    assert not ran.exists()


def test_sentinel_qemu_does_run_for_valid_params(tmp_path):
    """Control for the refusal test: with valid parameters the same assets do start "qemu",
    and a qemu that prints nothing is a failed result with a reason, not an exception."""
    assets, ran = _sentinel_assets(tmp_path)
    spec = guest.GuestSpec(topology=MEMLESS, boot_params={"slub_max_order": 2}, accel="tcg",
                       timeout_s=5, retries=1)
    r = guest.boot_guest(spec, assets)
    assert ran.exists()
    assert not r.ok and r.attempts == 2 and r.returncode == 0
    assert "before init started" in r.error
    assert "slub_max_order=2" in r.qemu_argv[r.qemu_argv.index("-append") + 1]


def test_slab_spelling_allowed_on_newer_kernel_and_rendered_canonically(tmp_path):
    assets, _ = _sentinel_assets(tmp_path, release="6.12.57+deb13-cloud-amd64")
    prof = guest.kernel_profile(assets.kernel)
    assert prof.version == (6, 12) and "slab" in prof.boot_param_prefixes
    assert guest.guest_cmdline({"slab_max_order": 2}, MEMLESS, prof) == \
        "console=ttyS0 panic=-1 slub_max_order=2"


@pytest.mark.parametrize("w, pattern", [
    (guest.WorkloadSpec(mode="fork; reboot"), "workload.mode"),
    (guest.WorkloadSpec(groups=0), "workload.groups"),
    (guest.WorkloadSpec(msg_size=(1 << 20) + 1), "workload.msg_size"),
    (guest.WorkloadSpec(mode="crosscpu", cpu_a=0), "workload.cpu_a"),
])
def test_bad_workload_refused_before_qemu(tmp_path, w, pattern):
    assets, ran = _sentinel_assets(tmp_path)
    with pytest.raises(SlabtuneError, match=pattern):
        guest.boot_guest(guest.GuestSpec(topology=MEMLESS, workloads=(w,), accel="tcg"), assets)
    assert not ran.exists()


def test_not_a_bzimage_is_refused(tmp_path):
    k = tmp_path / "vmlinux"
    k.write_bytes(b"\0" * 4096)
    with pytest.raises(SlabtuneError, match="kernel: .* is not a bzImage"):
        guest.kernel_profile(k)


def test_missing_assets_name_the_piece(tmp_path, monkeypatch):
    monkeypatch.setenv("SLABTUNE_CACHE", str(tmp_path))
    with pytest.raises(SlabtuneError, match=r"kernel: .*nope.* is not a file; run scripts/install"):
        guest.find_assets(kernel=tmp_path / "nope", busybox=tmp_path / "nope2",
                      workload=tmp_path / "nope3", qemu="/bin/true")


# --------------------------------------------------------------------------- qemu arguments


def test_topology_args_memoryless_node():
    assert guest.topology_qemu_args(MEMLESS, 512) == [
        "-m", "512M", "-smp", "cpus=4,maxcpus=4,sockets=4,cores=1,threads=1",
        "-object", "memory-backend-ram,id=mem0,size=512M", "-numa", "node,nodeid=0,memdev=mem0",
        "-numa", "node,nodeid=1",
        "-numa", "cpu,node-id=0,socket-id=0", "-numa", "cpu,node-id=0,socket-id=1",
        "-numa", "cpu,node-id=1,socket-id=2", "-numa", "cpu,node-id=1,socket-id=3",
    ]


def test_topology_args_cpuless_node_and_hotplug_cpus():
    """Node 1 has memory and no CPUs; CPUs 3-5 are possible but not present (they go to the
    first node with CPUs); memory splits evenly in 2 MiB granules, the rest to node 0."""
    t = Topology(possible=6, present=3, online=3, node_cpus=(3, 0), node_has_memory=(True, True))
    args = guest.topology_qemu_args(t, 510)
    assert args[:4] == ["-m", "510M", "-smp", "cpus=3,maxcpus=6,sockets=6,cores=1,threads=1"]
    assert "memory-backend-ram,id=mem0,size=256M" in args
    assert "memory-backend-ram,id=mem1,size=254M" in args
    cpus = [a for a in args if a.startswith("cpu,")]
    assert cpus == [f"cpu,node-id=0,socket-id={s}" for s in range(6)]


def test_a_slit_goes_to_qemu_as_numa_dist_entries():
    """Every off-diagonal SLIT entry, asymmetric ones included, is one ``-numa dist``; the
    local 10 is not passed (qemu's default)."""
    t = Topology.uniform(4, 3, memoryless_nodes=(1,),
                         distances=[[10, 12, 32], [12, 10, 32], [31, 32, 10]])
    args = guest.topology_qemu_args(t, 512)
    dist = [args[i + 1] for i, a in enumerate(args) if a == "-numa"
            and args[i + 1].startswith("dist,")]
    assert dist == ["dist,src=0,dst=1,val=12", "dist,src=0,dst=2,val=32",
                    "dist,src=1,dst=0,val=12", "dist,src=1,dst=2,val=32",
                    "dist,src=2,dst=0,val=31", "dist,src=2,dst=1,val=32"]
    assert not any(a.startswith("dist,") for a in guest.topology_qemu_args(
        Topology.uniform(4, 3, memoryless_nodes=(1,)), 512))


def test_single_node_has_no_numa_args_and_online_below_present_sets_maxcpus():
    t = Topology(possible=4, present=4, online=2, node_cpus=(4,), node_has_memory=(True,))
    assert "-numa" not in guest.topology_qemu_args(t)
    assert guest.guest_cmdline({}, t, profiles.get_profile("v6.1")) == \
        "console=ttyS0 panic=-1 maxcpus=2"


@pytest.mark.parametrize("mem", [0, 64, 10**6, True, "512"])
def test_bad_memory_refused(mem):
    with pytest.raises(SlabtuneError, match="memory_mib"):
        guest.topology_qemu_args(MEMLESS, mem)


# --------------------------------------------------------------------------- initramfs


def _busybox() -> str | None:
    if not isinstance(_ASSETS, str):
        return str(_ASSETS.busybox)
    return shutil.which("busybox")


@pytest.mark.skipif(_busybox() is None, reason="no busybox to unpack the archive with")
def test_cpio_newc_unpacks_with_busybox_cpio(tmp_path):
    entries = [guest._dir("bin"), guest._dir("etc"),
               guest._file("bin/tool", b"#!/bin/sh\necho hi\n"),
               guest._file("etc/odd", b"x" * 5, mode=0o640), guest._link("bin/sh", "tool"),
               guest._file("etc/empty", b"", mode=0o600)]
    archive = guest.cpio_newc(entries)
    assert len(archive) % 4 == 0 and archive.startswith(b"070701")
    out = tmp_path / "root"
    out.mkdir()
    proc = subprocess.run([_busybox(), "cpio", "-i", "-d", "-H", "newc"], input=archive,
                          cwd=out, capture_output=True)
    assert proc.returncode == 0, proc.stderr
    assert (out / "bin/tool").read_bytes() == b"#!/bin/sh\necho hi\n"
    assert stat.S_IMODE((out / "bin/tool").stat().st_mode) == 0o755
    assert (out / "etc/odd").read_bytes() == b"xxxxx"
    assert stat.S_IMODE((out / "etc/odd").stat().st_mode) == 0o640
    assert os.readlink(out / "bin/sh") == "tool"
    assert (out / "etc/empty").read_bytes() == b""


def test_init_script_uses_only_validated_words():
    w = guest.WorkloadSpec(mode="crosscpu", groups=3, loops=7, msg_size=512, cpu_a=0, cpu_b=2)
    script = guest.init_script("abc123", (w,))
    assert ("/bin/workload --mode crosscpu --transport socket --groups 3 --fds 4 --loops 7 "
            "--size 512 --cpu-a 0 --cpu-b 2 > /tmp/w0.out 2>&1") in script
    assert (script.index("dump warm > /dev/null") < script.index("dump before")
            < script.index("/bin/workload") < script.index("dump after")
            < script.index('> "$d/cpu_partial"') < script.index("dump flushed"))
    assert script.rstrip().splitlines()[-2:] == ["poweroff -f", "sleep 60"]
    with pytest.raises(SlabtuneError, match="token"):
        guest.init_script("x; reboot")


# --------------------------------------------------------------------------- console parsing


def _console(token="t0k", count_before=2):
    noise = "[    1.234567] random: crng init done\r\n"
    lines = [
        "[    0.000000] Linux version 6.1.0\r\n",
        f"@@ST S {token} 1.50\r\n",
        "@@ST I before release 6.1.0-56-cloud-amd64\r\n",
        "@@ST I before cmdline console=ttyS0 panic=-1 slub_max_order=2\r\n",
        "@@ST I before cpus_possible 0-3\r\n", "@@ST I before cpus_present 0-3\r\n",
        "@@ST I before cpus_online 0-3\r\n", "@@ST I before has_memory 0\r\n",
        "@@ST I before has_cpu 0-1\r\n",
        noise,
        "@@ST A before kmalloc-64x kmalloc-64\r\n",
        "@@ST C before kmalloc-64 object_size=64 slab_size=64 order=0 objs_per_slab=64 "
        "min_partial=5 cpu_partial=120 sheaf_capacity=NA slabs=3 objects=150 "
        "total_objects=192 partial=1 sanity_checks=0 red_zone=0 poison=0 store_user=0 trace=0\r\n",
        "@@ST C before task_struct object_size=9984 slab_size=10112 order=2 objs_per_slab=1 "
        "min_partial=6 cpu_partial=6 sheaf_capacity=NA slabs=1 objects=1 "
        "total_objects=1 partial=0 sanity_checks=0 red_zone=0 poison=0 store_user=0 trace=0\r\n",
        f"@@ST N before {count_before}\r\n",
        "@@ST W 0 begin\r\n",
        '@@ST J 0 {"mode": "hackbench", "messages": 10, "wall_s": 0.5}\r\n',
        "@@ST W 0 rc 0\r\n",
        f"@@ST E {token}\r\n",
    ]
    return "".join(lines)


def test_parse_console_builds_snapshot_frame():
    parsed = guest.parse_console(_console(), "t0k")
    assert parsed.started and parsed.ended and parsed.guest_uptime_at_start == 1.5
    assert parsed.workloads == [{"mode": "hackbench", "messages": 10, "wall_s": 0.5}]
    assert parsed.workload_rc == [0]
    df = guest.snapshot_frame(parsed, "before", "tcg")
    assert df.columns[:len(snapshot.SNAPSHOT_COLUMNS)] == list(snapshot.SNAPSHOT_COLUMNS)
    assert df["cache"].to_list() == ["kmalloc-64", "task_struct"]
    assert df["sheaf_capacity"].null_count() == 2
    assert df["aliases"].to_list() == [1, 0]
    assert df["objects"].to_list() == [150, 1]
    assert set(df["phase"]) == {"before"} and set(df["accelerator"]) == {"tcg"}
    assert df["nodes_with_cpu"][0] == "0-1"
    snapshot.validate_snapshot(df)  # the frame satisfies the snapshot contract


def test_parse_console_rejects_truncated_dump_and_foreign_token():
    with pytest.raises(guest.ConsoleParseError, match="2 cache records, init counted 3"):
        guest.parse_console(_console(count_before=3), "t0k")
    other = guest.parse_console(_console(token="old"), "t0k")
    assert not other.started and not other.ended
    with pytest.raises(guest.ConsoleParseError, match="malformed"):
        guest.parse_console("@@ST C before x order=zero\n", "t0k")


# --------------------------------------------------------------------------- committed fixture


def test_committed_guest_snapshot_matches_model():
    """The saved 6.1 guest snapshot (4 CPUs, node 1 memoryless, slub_max_order=2) matches
    the model in every cache, and slub_max_order=2 mattered: under the default 3 some of
    these caches would have had another order."""
    df = snapshot.read_snapshot(FIXTURE)
    res = check.check_snapshot(df)
    assert res.caches == res.comparable == res.matched == df.height > 100
    assert res.boots[0].params == bootparams.SlubParams(0, 2, 0)
    first = df.row(0, named=True)
    assert (first["nodes_with_memory"], first["nodes_with_cpu"]) == ("0", "0-1")
    topo, _ = topology_from_lists(*(first[c] for c in snapshot.BOOT_COLUMNS[2:]))
    default = check.predict_boot(df["slab_size"].to_numpy(), df["cache"].to_list(), topo,
                                 profiles.get_profile("v6.1"), bootparams.SlubParams())
    differs = int((default["order"] != df["order"].to_numpy()).sum())
    assert differs >= 10


def test_committed_612_guest_snapshot_matches_model():
    """A 6.12 guest (same topology, slab_max_order=2): the v6.8+ single-pass order rules."""
    df = snapshot.read_snapshot(FIXTURE_612)
    res = check.check_snapshot(df)
    assert res.boots[0].profile == "v6.12"
    assert res.caches == res.comparable == res.matched == df.height > 100


def test_committed_guest_snapshot_counters_moved():
    before = snapshot.read_snapshot(FIXTURE)
    after = snapshot.read_snapshot(FIXTURE_AFTER)
    assert before["cache"].to_list() == after["cache"].to_list()
    j = before.join(after, on="cache", suffix="_after")
    skb = j.filter(pl.col("cache") == "skbuff_head_cache").row(0, named=True)
    assert skb["total_objects_after"] > skb["total_objects"]
    # structure does not change at run time
    assert (j["order"] == j["order_after"]).all()


# --------------------------------------------------------------------------- real boots


@pytest.fixture(scope="module")
def memless_boot():
    """One 6.1 boot: 4 CPUs on 2 nodes, node 1 memoryless, slub_max_order=2, running a
    hackbench round and a cross-CPU-free round between the dumps."""
    spec = guest.GuestSpec(
        topology=MEMLESS, boot_params={"slub_max_order": 2},
        workloads=(guest.WorkloadSpec(groups=2, fds=4, loops=200),
                   guest.WorkloadSpec(mode="crosscpu", groups=4, loops=2000, msg_size=512)),
        timeout_s=180)
    return guest.boot_guest(spec)


@pytest.mark.guest
@pytest.mark.slow
@needs_guest
def test_memoryless_guest_matches_model(memless_boot):
    r = memless_boot
    assert r.ok, f"{r.error}\n{r.console_tail}"
    assert r.accelerator in ("kvm", "tcg")
    assert r.accelerator == ("kvm" if guest.probe_kvm().usable else "tcg")
    assert set(r.before["accelerator"]) == {r.accelerator}
    first = r.before.row(0, named=True)
    assert first["kernel_release"].startswith("6.1.")
    assert "slub_max_order=2" in first["cmdline"].split()
    assert (first["cpus_possible"], first["cpus_present"], first["cpus_online"]) == ("0-3",) * 3
    # node 1 has CPUs but no memory
    assert (first["nodes_with_memory"], first["nodes_with_cpu"]) == ("0", "0-1")
    for frame in (r.before, r.after):
        res = check.check_snapshot(frame.drop("phase", "accelerator"), profile=None)
        assert res.boots[0].profile == "v6.1"
        assert res.boots[0].params == bootparams.SlubParams(0, 2, 0)
        assert res.comparable > 100
        assert res.matched == res.comparable, res.mismatches[:5]
        # caches the formulas cannot know are only those with debug flags
        assert all("debug flags" in n.reason for n in res.not_comparable)


@pytest.mark.guest
@pytest.mark.slow
@needs_guest
def test_memoryless_guest_workload_timing_and_counters(memless_boot):
    r = memless_boot
    assert r.ok, r.error
    hb, cross = r.workloads
    assert hb["mode"] == "hackbench" and cross["mode"] == "crosscpu"
    assert hb["cpus_online"] == cross["cpus_online"] == 4
    assert hb["messages"] == 2 * 4 * 4 * 200 and hb["bytes"] == hb["messages"] * 100
    assert cross["messages"] == 4 * 2000 and cross["processes"] == 8
    assert hb["wall_s"] > 0 and cross["wall_s"] > 0
    j = r.before.join(r.after, on="cache", suffix="_after")
    skb = j.filter(pl.col("cache") == "skbuff_head_cache").row(0, named=True)
    assert skb["total_objects_after"] > skb["total_objects"]
    moved = j.filter(pl.col("objects") != pl.col("objects_after"))["cache"].to_list()
    assert "skbuff_head_cache" in moved and len(moved) >= 5
    # the dump to /dev/null made the sysfs inodes before "before": the dumps themselves no
    # longer move inode_cache by thousands (one inode per /sys/kernel/slab file read)
    ino = j.filter(pl.col("cache") == "inode_cache").row(0, named=True)
    assert abs(ino["objects_after"] - ino["objects"]) < 100
    # writing cpu_partial back ran flush_all(): the free skbs on the CPU slabs that the
    # after-dump counted as objects are on the node partial lists (or freed) now
    f = r.flushed.filter(pl.col("cache") == "skbuff_head_cache").row(0, named=True)
    assert f["objects"] < skb["objects_after"]
    assert f["total_objects"] <= skb["total_objects_after"]
    assert (j["order"] == j["order_after"]).all()
    assert r.boot_seconds is not None and 0 < r.boot_seconds < r.total_seconds


@pytest.mark.guest
@pytest.mark.slow
@needs_guest
def test_hotplug_and_cpuless_node_guest_matches_model():
    """4 of 8 possible CPUs present, 2 brought online (maxcpus=2), node 1 with memory and
    no CPUs, slub_min_order=1.  6.1 sizes slabs from the present CPUs (4: min_objects 16),
    not the possible (8: 20) or online ones (2: 12); the node masks show the CPU-less node."""
    t = Topology(possible=8, present=4, online=2, node_cpus=(4, 0), node_has_memory=(True, True))
    r = guest.boot_guest(guest.GuestSpec(topology=t, boot_params={"slub_min_order": 1},
                                         timeout_s=180))
    assert r.ok, f"{r.error}\n{r.console_tail}"
    first = r.before.row(0, named=True)
    assert (first["cpus_possible"], first["cpus_present"], first["cpus_online"]) == \
        ("0-7", "0-3", "0-1")
    assert (first["nodes_with_memory"], first["nodes_with_cpu"]) == ("0-1", "0")
    res = check.check_snapshot(r.before)
    assert res.boots[0].params == bootparams.SlubParams(1, 3, 0)
    assert res.comparable > 100 and res.matched == res.comparable, res.mismatches[:5]
    # the CPU count rule mattered: counting possible or online CPUs would mispredict
    sizes, names = r.before["slab_size"].to_numpy(), r.before["cache"].to_list()
    for n in (8, 2):
        other = Topology(possible=n, present=n, online=n, node_cpus=(n, 0),
                         node_has_memory=(True, True))
        pred = check.predict_boot(sizes, names, other, profiles.get_profile("v6.1"),
                                  bootparams.SlubParams(1, 3, 0))
        assert (pred["order"] != r.before["order"].to_numpy()).any()


@pytest.mark.guest
@pytest.mark.slow
@needs_guest
def test_timeout_fails_cleanly_with_console_tail():
    spec = guest.GuestSpec(topology=Topology.uniform(1), timeout_s=1.0, retries=1, accel="tcg")
    r = guest.boot_guest(spec)
    assert not r.ok and r.timed_out
    assert r.attempts == 2 and len(r.attempt_errors) == 2
    assert r.error.startswith("timed out after")
    assert r.before is None and r.after is None and r.workloads == []
    assert isinstance(r.console_tail, str)
    assert r.total_seconds < 15
    assert "-accel" in r.qemu_argv and "tcg,thread=multi" in r.qemu_argv


@pytest.mark.guest
@pytest.mark.slow
@needs_guest
def test_kvm_probe_is_cached_and_explains_itself():
    first = guest.probe_kvm()
    again = guest.probe_kvm()
    assert again is first
    assert first.reason
    if not first.usable:
        assert "/dev/kvm" in first.reason or "probe boot failed" in first.reason


@pytest.mark.guest
@pytest.mark.slow
@needs_guest
@pytest.mark.skipif(not KERNEL_612.exists(),
                    reason="no 6.12 kernel; run scripts/install-guest-deps.sh --with-6.12")
def test_612_kernel_override_and_slab_spelling():
    """--kernel style override: boot the 6.12 image; its profile allows the slab_* spelling,
    which reaches the kernel as slub_max_order (both names work from v6.8)."""
    assets = guest.find_assets(kernel=KERNEL_612)
    r = guest.boot_guest(guest.GuestSpec(topology=MEMLESS, boot_params={"slab_max_order": 2},
                                 timeout_s=180), assets)
    assert r.ok, f"{r.error}\n{r.console_tail}"
    assert r.kernel == str(KERNEL_612.resolve())
    res = check.check_snapshot(r.before)
    assert res.boots[0].profile == "v6.12"
    assert res.boots[0].params == bootparams.SlubParams(0, 2, 0)
    assert res.comparable > 100 and res.matched == res.comparable, res.mismatches[:5]


# --------------------------------------------------------------------------- CLI


def _cli(*args):
    import sys

    return subprocess.run([sys.executable, "-m", "slabtune.cli", *args], capture_output=True,
                          text=True, timeout=300)


@pytest.mark.parametrize("args, pattern", [
    (["--param", "slub_debug=1"], "boot parameter 'slub_debug' is not allowed"),
    (["--param", "slub_max_order"], "--param: 'slub_max_order' is not NAME=VALUE"),
    (["--nodes", "2", "--memoryless", "0,1", "--cpus", "2"], "memoryless_nodes: every node"),
    (["--kernel", "/nonexistent/bzImage"], "kernel: /nonexistent/bzImage is not a file"),
])
def test_cli_guest_boot_bad_input_is_one_line(args, pattern):
    p = _cli("guest", "boot", *args)
    assert p.returncode == 2
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("slabtune: error: ")
    assert pattern in lines[0]


@pytest.mark.guest
@pytest.mark.slow
@needs_guest
def test_cli_guest_boot_writes_checkable_snapshot(tmp_path):
    out = tmp_path / "g.parquet"
    p = _cli("guest", "boot", "--cpus", "2", "--param", "slub_min_objects=8", "--workload",
             "none", "--out", str(out), "--json")
    assert p.returncode == 0, p.stderr
    summary = __import__("json").loads(p.stdout)
    assert summary["ok"] and summary["caches"] > 100
    assert "slub_min_objects=8" in summary["cmdline"]
    res = check.check_snapshot(snapshot.read_snapshot(out))
    assert res.boots[0].params == bootparams.SlubParams(0, 3, 8)
    assert res.matched == res.comparable > 100


def test_slab_kernel_boot_parameters_are_slabs_own():
    """The lab's SLAB build takes mm/slab.c's slab_max_order= (v3.4 on); SLUB's
    parameters and SLAB's /proc/slabinfo tunables are refused naming the knob."""
    prof = profiles.SLAB_PROFILES["slab-v6.1"]
    t = Topology.uniform(2, 1)
    assert guest.guest_cmdline({"slab_max_order": "0"}, t, prof) == \
        "console=ttyS0 panic=-1 slab_max_order=0"
    for bad, what in (({"slub_max_order": 1}, "slub_max_order"),
                      ({"limit": 5}, "limit"), ({"slab_max_order": "x"}, "slab_max_order")):
        with pytest.raises(SlabtuneError, match=f"^{what}: "):
            guest.guest_cmdline(bad, t, prof)
    with pytest.raises(SlabtuneError, match="^slab_max_order: "):
        guest.guest_cmdline({"slab_max_order": 1},
                            t, profiles.SLAB_PROFILES["slab-v2.6.33"])

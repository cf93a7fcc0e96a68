"""The User Mode Linux runner (kernel/uml.py) and ``slabtune calibrate uml``.

The fast tests boot nothing: the command line and its checks, the static-busybox check,
the module build's ARCH=um, the parsing of a UML console into a result and its timing
figures, the calibration rows, the CSV, and the command's one-line errors.  One slow guest
test boots the 7.2-uml kernel with 2 CPUs when scripts/build-kernels.sh has built it.
"""

from __future__ import annotations

import json
import struct
import subprocess
from pathlib import Path

import pytest

from slabtune import cli
from slabtune.errors import SlabtuneError
from slabtune.kernel import build, lab_boot, labmod, uml

# --------------------------------------------------------------------------- command line


def test_argv_is_the_kernel_and_validated_words():
    argv = uml.uml_argv("/k/linux", "/t/initrd.cpio", "/t", cpus=2, memory_mib=256,
                        umid="slabtune-ab12", nice=10)
    assert argv == ["nice", "-n", "10", "/k/linux", "mem=256M", "ncpus=2", "seccomp=on",
                    "initrd=/t/initrd.cpio", "uml_dir=/t", "umid=slabtune-ab12",
                    "con0=fd:0,fd:1"]
    assert uml.uml_argv("/k/linux", "/t/i", "/t", cpus=1, nice=None)[0] == "/k/linux"


@pytest.mark.parametrize("kw, match", [
    ({"cpus": 0}, r"cpus: 0 is not an integer in 1\.\.16"),
    ({"cpus": 17}, r"cpus: 17 is not an integer in 1\.\.16"),
    ({"cpus": True}, "cpus: True"),
    ({"cpus": "2"}, "cpus: '2'"),
    ({"memory_mib": 8}, "memory_mib: 8"),
    ({"umid": "a b"}, "umid: 'a b'"),
    ({"umid": "x;rm"}, "umid: 'x;rm'"),
    ({"nice": 20}, "nice: 20"),
    ({"initrd": "/t/in rd"}, "initrd: '/t/in rd'"),
    ({"initrd": "relative.cpio"}, "initrd: 'relative.cpio'"),
    ({"uml_dir": "/t/../etc"}, "uml_dir: '/t/../etc'"),
    ({"kernel": "/k/linux mem=1G"}, "kernel: '/k/linux mem=1G'"),
])
def test_argv_refuses_bad_values(kw, match):
    args = {"kernel": "/k/linux", "initrd": "/t/i", "uml_dir": "/t", "cpus": 2,
            "max_cpus": 16, **kw}
    with pytest.raises(uml.UmlError, match=match) as info:
        uml.uml_argv(args.pop("kernel"), args.pop("initrd"), args.pop("uml_dir"), **args)
    assert "\n" not in str(info.value)


def _elf(path: Path, interp: bool) -> Path:
    """A minimal ELF64 header with one program header (PT_INTERP or PT_LOAD)."""
    ph = struct.pack("<IIQQQQQQ", 3 if interp else 1, 0, 0, 0, 0, 0, 0, 0)
    head = (b"\x7fELF" + bytes([2, 1, 1]) + bytes(9)
            + struct.pack("<HHIQQQIHHHHHH", 2, 62, 1, 0, 64, 0, 0, 64, 56, 1, 0, 0, 0))
    path.write_bytes(head + ph)
    return path


def test_busybox_must_be_static(tmp_path):
    static = _elf(tmp_path / "static", interp=False)
    assert uml.find_busybox(static) == static.resolve()
    with pytest.raises(uml.UmlError, match="not a statically linked"):
        uml.find_busybox(_elf(tmp_path / "dynamic", interp=True))
    (tmp_path / "text").write_text("#!/bin/sh\n")
    with pytest.raises(uml.UmlError, match="not a statically linked"):
        uml.find_busybox(tmp_path / "text")
    with pytest.raises(uml.UmlError, match="is not a file"):
        uml.find_busybox(tmp_path / "absent")


def test_kernel_image_names_what_is_missing(tmp_path, monkeypatch):
    monkeypatch.setenv("SLABTUNE_CACHE", str(tmp_path))
    with pytest.raises(uml.UmlError, match=r"not built yet \(scripts/build-kernels.sh "
                                           r"--only 7\.2-uml\)"):
        uml.kernel_image()
    with pytest.raises(uml.UmlError, match=r"kernel 7\.2: not a User Mode Linux kernel"):
        uml.kernel_image("7.2")
    with pytest.raises(uml.UmlError, match="unknown kernel '9.9'"):
        uml.kernel_image("9.9")
    assert uml.nr_cpus() == uml.UML_MAX_CPUS          # no config: arch/um's bound
    (tmp_path / "kernels" / "7.2-uml").mkdir(parents=True)
    (tmp_path / "kernels" / "7.2-uml" / "config").write_text("CONFIG_NR_CPUS=16\n")
    assert uml.nr_cpus() == 16


def test_lab_boot_refuses_a_uml_kernel():
    with pytest.raises(lab_boot.LabBootError, match="a User Mode Linux kernel"):
        lab_boot.resolve_kernel("7.2-uml")


def test_module_build_passes_arch_um(tmp_path, monkeypatch):
    """build_module runs ``make -C <tree> ARCH=um M=...`` for a UML kernel, plain make for
    an x86 one."""
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "Module.symvers").write_text("")
    monkeypatch.setattr(build, "build_tree", lambda name: tree)
    monkeypatch.setattr(labmod.native, "build_dir", lambda: tmp_path / "out")
    calls = []

    def fake_run(argv, **kw):
        calls.append(argv)
        out = Path(next(a for a in argv if a.startswith("M="))[2:])
        (out / "slabtune_lab.ko").write_bytes(b"ko")
        return subprocess.CompletedProcess(argv, 0)

    monkeypatch.setattr(labmod.subprocess, "run", fake_run)
    labmod.build_module("7.2-uml")
    labmod.build_module("7.2")
    assert "ARCH=um" in calls[0] and not any(a.startswith("ARCH=") for a in calls[1])
    assert calls[0][1:4] == ["-C", str(tree), "ARCH=um"]


# --------------------------------------------------------------------------- results


def _worker(w: int, cpu: int, allocs: int, frees: int, **kw) -> str:
    rec = {"run": 1, "w": w, "cpu": cpu, "node": 0, "role": "x", "allocs": allocs,
           "frees": frees, "drain_frees": 0, "idle": 0, "ops_ns": 0, "ns": 0,
           "alloc_ns": 0, "free_ns": 0, "clock_ps": 50000, "alloc_long": 0,
           "alloc_long_ns": 0, "free_long": 0, "free_long_ns": 0, **kw}
    return "slabtune_lab: worker " + json.dumps(rec)


def _console(token: str, workers: list[str], allocs: int, counters: dict[str, tuple[int, int]],
             end: bool = True) -> str:
    done = {"run": 1, "status": 0, "kind": "producer_consumer", "allocs": allocs,
            "frees": allocs}
    lines = [f"@@LAB S {token}", "@@LAB I release 7.2.13-slabtune-uml",
             "@@LAB X base", "@@LAB R probe_insmod 0", "@@LAB X before"]
    lines += [f"@@LAB C after {k} {v[1]} C0={v[1]}" for k, v in counters.items()]
    lines += ["@@LAB C after order 3", "@@LAB N after", "@@LAB R insmod 0"]
    lines += [f"@@LAB K [    0.5] {w}" for w in workers]
    lines += [f"@@LAB K [    0.5] slabtune_lab: done {json.dumps(done)}"]
    if end:
        lines.append(f"@@LAB E {token}")
    return "\n".join(lines) + "\n"


def _result(text: str, stderr: str = "", rc: int | None = 0, timed_out: bool = False):
    return lab_boot.console_result(text, stderr, "tok", rc, timed_out, 0.7,
                                   kernel=Path("/k/linux"), cache="slabtune_lab",
                                   params=["kind=local"], argv=["/k/linux"], accel="uml",
                                   cmdline="ncpus=2", sysfs={}, runner="uml")


PC_WORKERS = [
    _worker(0, 0, 1000, 0, alloc_ns=150_000, ops_ns=2_000_000, alloc_long=2,
            alloc_long_ns=9_000_000),
    _worker(1, 1, 0, 1000, free_ns=100_000, clock_ps=52000, free_long=0),
]
PC_COUNTERS = {"alloc_fastpath": (0, 1000), "free_fastpath": (0, 1000),
               "barn_get": (0, 36), "sheaf_refill": (0, 1), "alloc_slab": (0, 4)}


def test_a_uml_console_reads_as_a_lab_result():
    res = _result(_console("tok", PC_WORKERS, 1000, PC_COUNTERS))
    assert res.ok, res.error
    assert (res.accel, res.release, res.missing) == ("uml", "7.2.13-slabtune-uml",
                                                     ["base", "before"])
    assert lab_boot.counter_deltas(res)["barn_get"] == 36
    t = uml.timing(res)
    # each worker's own empty bracket (50 and 52 ns) comes off its own calls; the median
    # of them is reported
    assert t["clock_ns"] == pytest.approx(51.0)
    assert t["alloc_ns_per_call"] == pytest.approx(150_000 / 998 - 50.0)
    assert t["free_ns_per_call"] == pytest.approx(100 - 52.0)
    assert t["ns_per_pair"] == pytest.approx(t["alloc_ns_per_call"] + t["free_ns_per_call"])
    assert t["ns_per_pair_all"] == pytest.approx(9_250_000 / 1000 - 50.0 - 52.0)
    assert t["loop_ns_per_alloc"] == pytest.approx(2000.0)
    assert (t["alloc_long"], t["free_long"], t["pairs"]) == (2, 0, 1000)
    row = uml.calibration_row("producer_consumer", 2, 3, res)
    assert (row["scenario"], row["cpus"], row["run"], row["ok"]) == ("producer_consumer", 2,
                                                                     3, 1)
    assert row["barn_get_per_pair"] == pytest.approx(0.036)
    assert row["alloc_fastpath_per_pair"] == 1.0 and row["free_slowpath_per_pair"] == 0.0


@pytest.mark.parametrize("kw, error", [
    ({"text": "", "stderr": "Checking that seccomp filters can be installed...\n"
                            "SECCOMP userspace requested but not functional!", "rc": 1},
     "uml exited with 1 before init started: SECCOMP userspace requested but not "
     "functional!"),
    ({"text": "@@LAB S tok\n", "rc": 0}, "no end marker (uml exited with 0)"),
    ({"text": "@@LAB S tok\n", "rc": None, "timed_out": True}, "timed out after 1 s"),
])
def test_a_failed_uml_boot_is_one_clear_line(kw, error):
    res = _result(**kw)
    assert not res.ok and res.error == error
    assert "\n" not in res.error
    assert uml.timing(res)["ns_per_pair"] is None


def test_summary_takes_medians_of_the_runs_that_worked():
    rows = [{"scenario": "local", "cpus": 1, "run": i, "ok": 1, "ns_per_pair": v,
             "alloc_slab_per_pair": 0.1 * i} for i, v in enumerate((30.0, 35.0, 31.0), 1)]
    rows.append({"scenario": "local", "cpus": 1, "run": 4, "ok": 0, "ns_per_pair": None,
                 "alloc_slab_per_pair": None})
    (s,) = uml.summary(rows)
    assert (s["runs"], s["ns_per_pair"]) == (3, 31.0)
    assert s["alloc_slab_per_pair"] == pytest.approx(0.2)


def test_csv_round_trip_with_its_header(tmp_path):
    res = _result(_console("tok", PC_WORKERS, 1000, PC_COUNTERS))
    rows = [uml.calibration_row("producer_consumer", 2, 1, res)]
    path = tmp_path / "data" / "uml.csv"
    uml.write_csv(rows, path, ["made by a test", "second line"])
    text = path.read_text()
    assert text.startswith("# made by a test\n# second line\nscenario,cpus,run,ok,pairs,")
    (back,) = uml.read_csv(path)
    assert back["scenario"] == "producer_consumer" and float(back["barn_get_per_pair"]) == 0.036
    assert float(back["ns_per_pair"]) == pytest.approx(rows[0]["ns_per_pair"], rel=1e-5)
    with pytest.raises(uml.UmlError):
        uml.write_csv([], path, [])


def test_calibrate_refuses_bad_plans():
    with pytest.raises(uml.UmlError, match="runs: 0"):
        uml.calibrate([1], 0)
    with pytest.raises(uml.UmlError, match="scenario: 'nope'"):
        uml.calibrate([1], 1, scenarios=["nope"])
    with pytest.raises(uml.UmlError, match="producer_consumer needs 2"):
        uml.calibrate([1], 1, scenarios=["producer_consumer"])


# --------------------------------------------------------------------------- the command


@pytest.mark.parametrize("argv, msg", [
    (["--runs", "x"], "--runs: 'x' is not an integer"),
    (["--runs", "0"], "--runs: 0 is outside 1..1000"),
    (["--cpus", "0"], "--cpus: 0 is outside 1..16"),
    (["--cpus", "2", "--cpus", "99"], "--cpus: 99 is outside 1..16"),
    (["--scenario", "rr"], "--scenario: 'rr' is not one of local, local_burst_256, "
                           "local_burst_1024, producer_consumer, local_burst_1024_order1, "
                           "local_burst_1024_order2, local_burst_1024_order3"),
    (["--nice", "-1"], "--nice: -1 is outside 0..19"),
    (["--out", "/nonexistent-dir/x.csv"], "--out: directory /nonexistent-dir does not exist"),
])
def test_command_bad_input_is_one_line(argv, msg, monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(uml, "kernel_image", lambda name=uml.UML_KERNEL: Path("/k/linux"))
    monkeypatch.setattr(uml, "nr_cpus", lambda name=uml.UML_KERNEL: 16)
    monkeypatch.setattr(uml, "calibrate", lambda *a, **k: pytest.fail("must not run"))
    monkeypatch.chdir(tmp_path)
    out = [] if "--out" in argv else ["--out", str(tmp_path / "x.csv")]
    assert cli.main(["calibrate", "uml", *argv, *out]) == 2
    err = capsys.readouterr().err
    assert err == f"slabtune: error: {msg}\n"


def test_command_without_the_kernel_is_one_line(monkeypatch, capsys, tmp_path):
    monkeypatch.setenv("SLABTUNE_CACHE", str(tmp_path))
    assert cli.main(["calibrate", "uml"]) == 2
    assert capsys.readouterr().err == ("slabtune: error: kernel 7.2-uml: not built yet "
                                       "(scripts/build-kernels.sh --only 7.2-uml)\n")


def test_command_prints_the_table_and_writes_the_csv(monkeypatch, capsys, tmp_path):
    res = _result(_console("tok", PC_WORKERS, 1000, PC_COUNTERS))
    rows = [uml.calibration_row("producer_consumer", 2, r, res) for r in (1, 2)]
    monkeypatch.setattr(uml, "kernel_image", lambda name=uml.UML_KERNEL: Path("/k/linux"))
    monkeypatch.setattr(uml, "nr_cpus", lambda name=uml.UML_KERNEL: 16)
    seen = {}

    def fake(cpus, runs, **kw):
        seen.update(cpus=cpus, runs=runs, **kw)
        return rows, [res, res]

    monkeypatch.setattr(uml, "calibrate", fake)
    (tmp_path / "calibrate" / "data").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    assert cli.main(["calibrate", "uml", "--cpus", "2", "--runs", "2",
                     "--scenario", "producer_consumer"]) == 0
    assert seen["cpus"] == [2] and seen["runs"] == 2
    assert seen["scenarios"] == ["producer_consumer"]
    out = capsys.readouterr().out
    assert out.splitlines()[0].split()[:4] == ["scenario", "cpus", "runs", "ns/pair"]
    assert out.splitlines()[1].split()[:3] == ["producer_consumer", "2", "2/2"]
    (csv_path,) = (tmp_path / "calibrate" / "data").glob("uml-7.2-*.csv")
    text = csv_path.read_text()
    assert text.startswith("# slabtune calibrate uml: ")
    assert len(uml.read_csv(csv_path)) == 2


# --------------------------------------------------------------------------- a real boot


@pytest.mark.slow
@pytest.mark.guest
def test_uml_smp_run_moves_the_counters_by_its_own_ops():
    """Boot 7.2-uml with 2 virtual CPUs and run producer_consumer on a 512-byte cache of
    the module's own (sender on CPU 0, receiver on CPU 1, 20000 allocations).  The cache
    exists only for the run, so every SLUB_STATS count of it is the module's: the
    allocations the counters saw (alloc_fastpath + alloc_slowpath) and the frees
    (free_fastpath + free_slowpath) equal the module's own, up to 1 in 1000 lost per-CPU
    increments (mm/slub.c stat() is a read-modify-write), the sender's CPU allocated and
    the receiver's freed, and the timed calls give a plausible ns per pair."""
    _need_uml_kernel()
    ops = 20_000
    res = uml.run_lab({"kind": "producer_consumer", "depth": 32}, cpus=2, ops=ops, seed=3,
                      timeout_s=120)
    assert res.ok, res.error + "\n" + res.console_tail
    assert res.release.endswith("-slabtune-uml")
    done = res.done
    assert done["allocs"] == done["frees"] == ops
    assert [w["cpu"] for w in res.workers] == [0, 1]
    for names, want in ((("alloc_fastpath", "alloc_slowpath"), done["allocs"]),
                        (("free_fastpath", "free_slowpath"), done["frees"])):
        moved = sum(res.delta(n) for n in names)
        assert want - want // 1000 <= moved <= want, (names, moved)
    allocs = res.per_cpu_delta("alloc_fastpath")
    frees = res.per_cpu_delta("free_fastpath")
    assert allocs.get(0, 0) >= ops - ops // 1000 and allocs.get(1, 0) == 0
    assert frees.get(1, 0) >= ops - ops // 1000 and frees.get(0, 0) == 0
    t = uml.timing(res)
    assert 0 < t["clock_ns"] < 10_000
    assert 1 < t["alloc_ns_per_call"] < 100_000 and 1 < t["free_ns_per_call"] < 100_000
    assert res.seconds < 60


# --------------------------------------------------------------------------- a candidate's knobs


def test_argv_carries_checked_boot_parameters():
    argv = uml.uml_argv("/k/linux", "/t/i", "/t", cpus=1, nice=None,
                        boot_params={"slub_max_order": 1, "slub_min_objects": 16})
    assert argv[-2:] == ["slub_max_order=1", "slub_min_objects=16"]
    for bad, match in (({"init": 1}, "boot parameter 'init'"),
                       ({"slub_max_order mem": 1}, "boot parameter 'slub_max_order mem'"),
                       ({"slub_max_order": "1 init=/x"}, "slub_max_order: '1 init=/x'"),
                       ({"slub_max_order": -1}, "slub_max_order: -1")):
        with pytest.raises(uml.UmlError, match=match) as info:
            uml.uml_argv("/k/linux", "/t/i", "/t", cpus=1, boot_params=bad)
        assert "\n" not in str(info.value)


def _need_uml_kernel():
    if build.kernel_path(uml.UML_KERNEL) is None or build.build_tree(uml.UML_KERNEL) is None:
        pytest.skip(f"kernel {uml.UML_KERNEL} is not built; run scripts/build-kernels.sh "
                    f"--only {uml.UML_KERNEL}")
    try:
        uml.find_busybox()
    except SlabtuneError as exc:
        pytest.skip(f"no static busybox ({exc})")


def test_boot_parameters_are_checked_against_the_kernel_profile():
    _need_uml_kernel()
    assert uml.kernel_profile().name == "v7.1"
    assert uml.checked_boot_params({"slab_max_order": 2}) == {"slub_max_order": 2}
    with pytest.raises(SlabtuneError, match="boot parameter slub_max_order: 11 is outside"):
        uml.checked_boot_params({"slub_max_order": 11})
    with pytest.raises(SlabtuneError, match="'slub_debug' is not allowed"):
        uml.checked_boot_params({"slub_debug": 1})
    with pytest.raises(uml.UmlError, match="policy.params.min_partial: a cache of the "
                                           "module's own"):
        uml.run_lab({"kind": "local", "live": 8}, cpus=1, sysfs={"min_partial": 2})


@pytest.mark.slow
@pytest.mark.guest
def test_uml_run_applies_boot_parameters_and_sysfs_values():
    """Boot 7.2-uml with slub_min_order=2 and min_partial 9 written to kmalloc-512: the
    cache's sysfs files after the run show both, and the command line carries the
    parameter."""
    _need_uml_kernel()
    res = uml.run_lab({"kind": "local", "live": 64, "burst": 64}, cpus=1,
                      cache_doc={"name": "kmalloc-512"}, ops=5000,
                      boot_params={"slub_min_order": 2}, sysfs={"min_partial": 9})
    assert res.ok, res.error + "\n" + res.console_tail
    assert "slub_min_order=2" in res.cmdline.split()
    assert res.value("after", "order") == 2
    assert res.value("after", "min_partial") == 9
    assert uml.timing(res)["ns_per_pair"] > 0

"""slabtune's own guest kernels (kernel/build.py, scripts/build-kernels.sh, kernel/configs/).

The fast tests build nothing: the kernel table, the required options of the config
fragments, the inputs hash (Python and the script agree; it moves with every input), the
script's .config check, the private apt configuration, and ensure_kernel's up-to-date and
failure paths against a fake script.  One slow guest test boots the cached 6.1 kernel when
scripts/build-kernels.sh has built it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from slabtune.errors import SlabtuneError
from slabtune.kernel import build

SCRIPT = build.BUILD_SCRIPT

#: Options every kernel must end up with (the lab's needs; see kernel/configs/base.config).
REQUIRED_ALL = {
    "CONFIG_64BIT": "y", "CONFIG_SMP": "y", "CONFIG_HOTPLUG_CPU": "y",
    "CONFIG_HYPERVISOR_GUEST": "y", "CONFIG_KVM_GUEST": "y",
    "CONFIG_NUMA": "y", "CONFIG_ACPI": "y", "CONFIG_ACPI_NUMA": "y",
    "CONFIG_X86_64_ACPI_NUMA": "y", "CONFIG_PCI": "y",
    "CONFIG_SYSFS": "y", "CONFIG_PROC_FS": "y", "CONFIG_PROC_SYSCTL": "y",
    "CONFIG_DEVTMPFS": "y", "CONFIG_TMPFS": "y",
    "CONFIG_PRINTK": "y", "CONFIG_TTY": "y", "CONFIG_SERIAL_8250": "y",
    "CONFIG_SERIAL_8250_CONSOLE": "y", "CONFIG_BLK_DEV_INITRD": "y", "CONFIG_RD_GZIP": "y",
    "CONFIG_BINFMT_ELF": "y", "CONFIG_BINFMT_SCRIPT": "y",
    "CONFIG_NET": "y", "CONFIG_UNIX": "y", "CONFIG_FUTEX": "y",
    "CONFIG_MODULES": "y", "CONFIG_MODULE_UNLOAD": "y", "CONFIG_KALLSYMS": "y",
}
REQUIRED_SLUB = {"CONFIG_SLUB": "y", "CONFIG_SLUB_STATS": "y", "CONFIG_SLUB_DEBUG": "y",
                 "CONFIG_SLUB_TINY": None}
REQUIRED_SLAB = {"CONFIG_SLAB": "y", "CONFIG_SLUB": None}

needs_bash = pytest.mark.skipif(shutil.which("bash") is None or shutil.which("sha256sum") is None,
                                reason="bash and sha256sum are needed to run build-kernels.sh")


def merged_fragments(name: str, config_dir: Path | None = None) -> dict[str, str | None]:
    """The options a kernel's fragments ask for, later fragments winning (None: not set)."""
    out: dict[str, str | None] = {}
    for frag in build.KERNELS[name].fragments:
        for line in ((config_dir or build.CONFIG_DIR) / frag).read_text().splitlines():
            line = line.strip()
            if line.startswith("CONFIG_") and "=" in line:
                key, value = line.split("=", 1)
                out[key] = value
            elif line.startswith("# CONFIG_") and line.endswith(" is not set"):
                out[line[2:].split()[0]] = None
    return out


def run_script(*args: str, cache: Path, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), *args, "--cache", str(cache)],
                          capture_output=True, text=True, timeout=120, **kw)


# --------------------------------------------------------------------------- the table


def test_table_lists_the_kernels():
    assert list(build.KERNELS) == ["6.1", "6.1-slab", "6.12", "7.2", "7.2-uml"]
    k = build.KERNELS
    assert [s.arch for s in k.values()] == ["x86"] * 4 + ["um"]
    assert (k["7.2-uml"].package, k["7.2-uml"].suite, k["7.2-uml"].fragments) == (
        "linux-source-7.2", "unstable", ("uml.config", "slub.config"))
    assert (k["7.2"].image, k["7.2-uml"].image) == ("bzImage", "linux")
    assert (k["6.1"].package, k["6.1"].suite, k["6.1"].allocator) == (
        "linux-source-6.1", "bookworm", "slub")
    assert (k["6.1-slab"].package, k["6.1-slab"].allocator) == ("linux-source-6.1", "slab")
    assert k["6.12"].package == "linux-source-6.12"
    assert (k["7.2"].package, k["7.2"].suite) == ("linux-source-7.2", "unstable")
    for spec in k.values():
        for frag in spec.fragments:
            assert (build.CONFIG_DIR / frag).is_file(), frag


def test_table_rejects_a_malformed_line(tmp_path):
    bad = tmp_path / "kernels.tsv"
    bad.write_text("6.1 linux-source-6.1 bookworm slob base.config\n")
    with pytest.raises(build.KernelBuildError, match="kernels.tsv:1"):
        build.read_table(bad)
    bad.write_text("7.2-uml linux-source-7.2 unstable slub uml.config arm64\n")
    with pytest.raises(build.KernelBuildError, match=r"kernels.tsv:1: .*\[x86\|um\]"):
        build.read_table(bad)
    assert build.read_table(tmp_path / "absent.tsv") == {}


def test_table_arch_defaults_to_x86(tmp_path):
    tsv = tmp_path / "kernels.tsv"
    tsv.write_text("6.1 linux-source-6.1 bookworm slub base.config\n"
                   "u linux-source-7.2 unstable slub uml.config um\n")
    table = build.read_table(tsv)
    assert (table["6.1"].arch, table["u"].arch) == ("x86", "um")


# --------------------------------------------------------------------------- config fragments


#: What the User Mode Linux kernel needs instead of base.config's x86 guest options.
REQUIRED_UML = {
    "CONFIG_64BIT": "y", "CONFIG_SMP": "y", "CONFIG_SYSFS": "y", "CONFIG_PROC_FS": "y",
    "CONFIG_PROC_SYSCTL": "y", "CONFIG_DEVTMPFS": "y", "CONFIG_TMPFS": "y",
    "CONFIG_PRINTK": "y", "CONFIG_TTY": "y", "CONFIG_STDERR_CONSOLE": "y",
    "CONFIG_BLK_DEV_INITRD": "y", "CONFIG_BINFMT_ELF": "y", "CONFIG_BINFMT_SCRIPT": "y",
    "CONFIG_MODULES": "y", "CONFIG_MODULE_UNLOAD": "y", "CONFIG_KALLSYMS": "y",
    "CONFIG_CC_OPTIMIZE_FOR_PERFORMANCE": "y", "CONFIG_LOCALVERSION": '"-slabtune-uml"',
}


def test_uml_fragments_hold_the_required_options():
    opts = merged_fragments("7.2-uml")
    for key, value in {**REQUIRED_UML, **REQUIRED_SLUB}.items():
        assert key in opts, f"7.2-uml: {key} missing"
        assert opts[key] == value, f"7.2-uml: {key}={opts[key]} (want {value})"
    assert 8 <= int(opts["CONFIG_NR_CPUS"]) <= 64       # arch/um/Kconfig: NR_CPUS_RANGE_END
    # nothing of base.config's x86 guest (qemu's ACPI, serial port, KVM)
    assert not {"CONFIG_ACPI", "CONFIG_SERIAL_8250", "CONFIG_KVM_GUEST"} & set(opts)


@pytest.mark.parametrize("name", ["6.1", "6.1-slab", "6.12", "7.2"])
def test_fragments_hold_the_required_options(name):
    opts = merged_fragments(name)
    required = dict(REQUIRED_ALL)
    required.update(REQUIRED_SLAB if build.KERNELS[name].allocator == "slab" else REQUIRED_SLUB)
    for key, value in required.items():
        assert key in opts, f"{name}: {key} missing from {build.KERNELS[name].fragments}"
        assert opts[key] == value, f"{name}: {key}={opts[key]} (want {value})"
    assert int(opts["CONFIG_NR_CPUS"]) >= 256
    assert 1 << int(opts["CONFIG_NODES_SHIFT"]) >= 64


def test_cpu_partial_only_where_it_exists():
    for name in ("6.1", "6.12"):
        assert merged_fragments(name).get("CONFIG_SLUB_CPU_PARTIAL") == "y"
    # 7.2 has sheaves instead of per-CPU partial lists; SLAB has neither.
    for name in ("7.2", "6.1-slab"):
        assert "CONFIG_SLUB_CPU_PARTIAL" not in merged_fragments(name)


def test_slab_kernel_names_itself():
    assert merged_fragments("6.1-slab")["CONFIG_LOCALVERSION"] == '"-slabtune-slab"'
    assert merged_fragments("6.1")["CONFIG_LOCALVERSION"] == '"-slabtune"'


# --------------------------------------------------------------------------- inputs hash


@pytest.fixture
def config_copy(tmp_path, monkeypatch):
    """A private copy of kernel/configs and of the script, which build.py then hashes."""
    cfg = tmp_path / "configs"
    shutil.copytree(build.CONFIG_DIR, cfg)
    script = tmp_path / "build-kernels.sh"
    shutil.copy(build.BUILD_SCRIPT, script)
    monkeypatch.setattr(build, "CONFIG_DIR", cfg)
    monkeypatch.setattr(build, "BUILD_SCRIPT", script)
    return cfg, script


def test_hash_changes_with_each_input(config_copy):
    cfg, script = config_copy
    base = build.inputs_hash("6.1", "6.1.192-2")
    assert base == build.inputs_hash("6.1", "6.1.192-2")
    assert build.inputs_hash("6.1", "6.1.193-1") != base
    assert build.inputs_hash("6.1-slab", "6.1.192-2") != base

    slub = cfg / "slub.config"
    slub.write_text(slub.read_text() + "CONFIG_SLUB_DEBUG_ON=y\n")
    changed = build.inputs_hash("6.1", "6.1.192-2")
    assert changed != base
    script.write_text(script.read_text() + "\n# edited\n")
    assert build.inputs_hash("6.1", "6.1.192-2") not in (base, changed)


def test_hash_ignores_unrelated_fragment(config_copy):
    cfg, _ = config_copy
    before = build.inputs_hash("6.1-slab", "6.1.192-2")
    (cfg / "slub-cpu-partial.config").write_text("CONFIG_SLUB_CPU_PARTIAL=y\n# x\n")
    assert build.inputs_hash("6.1-slab", "6.1.192-2") == before
    assert build.inputs_hash("6.1", "6.1.192-2") != before


@needs_bash
@pytest.mark.parametrize("name", ["6.1", "6.1-slab", "7.2", "7.2-uml"])
def test_python_and_script_hash_agree(name, tmp_path):
    proc = run_script("--inputs-hash", name, "--version", "9.9.9-1", cache=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == build.inputs_hash(name, "9.9.9-1")


def test_manifest_names_every_input():
    text = build.inputs_manifest("6.1", "6.1.192-2")
    assert "package linux-source-6.1" in text and "version 6.1.192-2" in text
    for f in ("scripts/build-kernels.sh", "kernel/configs/base.config",
              "kernel/configs/slub.config", "kernel/configs/slub-cpu-partial.config"):
        assert f"file {f} " in text
    assert "arch" not in text                       # x86 manifests read as before
    uml = build.inputs_manifest("7.2-uml", "7.2.13-1")
    assert "\narch um\n" in uml and "file kernel/configs/uml.config " in uml


# --------------------------------------------------------------------------- .config check


def _config_from(opts: dict[str, str | None]) -> str:
    return "".join(f"{k}={v}\n" if v is not None else f"# {k} is not set\n"
                   for k, v in opts.items())


@needs_bash
def test_script_verifies_that_options_stuck(tmp_path):
    opts = merged_fragments("6.1")
    good = tmp_path / "good.config"
    good.write_text(_config_from(opts))
    proc = run_script("--verify", "6.1", str(good), cache=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"checked {len(opts)} options" in proc.stdout

    dropped = dict(opts)
    del dropped["CONFIG_X86_64_ACPI_NUMA"]          # Kconfig dropped it silently
    dropped["CONFIG_SLUB_TINY"] = "y"               # a "not set" line that got set
    bad = tmp_path / "bad.config"
    bad.write_text(_config_from(dropped))
    proc = run_script("--verify", "6.1", str(bad), cache=tmp_path)
    assert proc.returncode == 1
    missing = [ln for ln in proc.stdout.splitlines() if ln.startswith("MISSING")]
    assert len(missing) == 2
    assert "CONFIG_X86_64_ACPI_NUMA=y" in missing[0] or "CONFIG_X86_64_ACPI_NUMA=y" in missing[1]
    assert any("# CONFIG_SLUB_TINY is not set" in ln for ln in missing)


@needs_bash
def test_script_later_fragment_wins(tmp_path):
    opts = merged_fragments("6.1-slab")       # LOCALVERSION from slab.config, not base.config
    cfg = tmp_path / "slab.config"
    cfg.write_text(_config_from(opts))
    assert run_script("--verify", "6.1-slab", str(cfg), cache=tmp_path).returncode == 0


# --------------------------------------------------------------------------- private apt


def _machine_has_apt() -> bool:
    if shutil.which("apt-get") is None or shutil.which("apt-config") is None:
        return False
    proc = subprocess.run(["apt-get", "indextargets", "--no-release-info", "--format",
                           "$(RELEASE)", "Identifier: Packages"], capture_output=True,
                          text=True, timeout=60)
    return proc.returncode == 0 and bool(proc.stdout.strip())


@needs_bash
@pytest.mark.skipif(not _machine_has_apt(), reason="needs a Debian host with apt sources")
def test_private_apt_config_stays_in_the_cache(tmp_path):
    cache = tmp_path / "cache"
    proc = run_script("--apt-config", "unstable", cache=cache)
    assert proc.returncode == 0, proc.stderr
    conf = Path(proc.stdout.strip())
    private = cache.resolve() / "apt" / "unstable"
    assert conf == private / "apt.conf"
    text = conf.read_text()
    sources = (private / "etc" / "sources.list").read_text()
    machine_apt = re.compile(r'(^|["\s=])/etc/apt\b')     # a path that starts at /etc/apt
    assert not machine_apt.search(text) and not machine_apt.search(sources)
    assert " unstable main" in sources
    assert "signed-by=/usr/share/keyrings/debian-archive-keyring.gpg" in sources
    # The mirror is the one the machine's own sources use.
    machine = subprocess.run(["apt-get", "indextargets", "--no-release-info", "--format",
                              "$(REPO_URI)", "Identifier: Packages"], capture_output=True,
                             text=True, timeout=60).stdout.split()
    mirror = sources.split("] ", 1)[1].split()[0]
    assert mirror in machine
    # What apt itself resolves: every Dir:: file and directory is inside the private tree.
    dump = subprocess.run(["apt-config", "dump"], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "APT_CONFIG": str(conf)}).stdout
    for line in dump.splitlines():
        key, _, value = line.partition(" ")
        value = value.strip('";')
        if key.startswith(("Dir::Etc", "Dir::State", "Dir::Cache", "Dir::Log")) \
                and value.startswith("/"):
            assert value.startswith(str(private)), line
        assert not value.startswith("/etc/apt"), line
    for key in ("Dir::Etc", "Dir::State", "Dir::Cache", "Dir::Etc::SourceParts",
                "Dir::Etc::Parts", "Dir::Etc::main", "Dir::Etc::PreferencesParts"):
        assert f'{key} "{private}/' in text


# --------------------------------------------------------------------------- cache and ensure


def _fake_build(cache: Path, name: str, inputs_hash: str) -> Path:
    d = cache / "kernels" / name
    d.mkdir(parents=True)
    (d / "bzImage").write_bytes(b"not really a kernel")
    (d / "build").mkdir()
    (d / "build" / "Module.symvers").write_text("")
    (d / "build.json").write_text(json.dumps({
        "name": name, "version": "6.1.192-2", "inputs_hash": inputs_hash,
        "log": str(d / "build.log")}))
    return d / "bzImage"


def test_kernel_path_of_a_uml_kernel_is_its_executable(tmp_path, monkeypatch):
    monkeypatch.setenv("SLABTUNE_CACHE", str(tmp_path))
    d = _fake_build(tmp_path, "7.2-uml", "0" * 64).parent
    assert build.kernel_path("7.2-uml") is None          # a bzImage is not its image
    (d / "linux").write_bytes(b"\x7fELF not really")
    assert build.kernel_path("7.2-uml") == d / "linux"
    assert build.kernel_arch("7.2-uml") == "um" and build.kernel_arch("7.2") == "x86"


def test_nothing_built_reads_as_none(tmp_path, monkeypatch):
    monkeypatch.setenv("SLABTUNE_CACHE", str(tmp_path))
    assert build.kernel_path("6.1") is None
    assert build.build_info("6.1") is None
    (tmp_path / "kernels" / "6.1").mkdir(parents=True)
    (tmp_path / "kernels" / "6.1" / "build.json").write_text("{not json")
    assert build.build_info("6.1") is None


def test_kernel_path_and_is_current(tmp_path, monkeypatch):
    monkeypatch.setenv("SLABTUNE_CACHE", str(tmp_path))
    bz = _fake_build(tmp_path, "6.1", build.inputs_hash("6.1", "6.1.192-2"))
    assert build.kernel_path("6.1") == bz
    assert build.build_info("6.1")["version"] == "6.1.192-2"
    assert build.is_current("6.1", "6.1.192-2")
    assert not build.is_current("6.1", "6.1.193-1")
    assert build.build_tree("6.1") == tmp_path / "kernels" / "6.1" / "build"
    (tmp_path / "kernels" / "6.1" / "build" / "Module.symvers").unlink()
    assert build.build_tree("6.1") is None
    assert not build.is_current("6.1", "6.1.192-2")      # modules need the tree: rebuild


def test_unknown_kernel_is_one_clear_error():
    with pytest.raises(SlabtuneError, match=r"unknown kernel '5\.10' \(known: 6\.1, "):
        build.ensure_kernel("5.10")


def _fake_script(path: Path, body: str) -> Path:
    path.write_text("#!/usr/bin/env bash\n"
                    'if [ "$1" = --source-version ]; then echo 6.1.192-2; exit 0; fi\n'
                    + body)
    return path


@needs_bash
def test_ensure_kernel_skips_a_current_build(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SLABTUNE_CACHE", str(tmp_path))
    script = _fake_script(tmp_path / "build-kernels.sh", "echo SHOULD-NOT-RUN >&2; exit 1\n")
    monkeypatch.setattr(build, "BUILD_SCRIPT", script)
    bz = _fake_build(tmp_path, "6.1", build.inputs_hash("6.1", "6.1.192-2"))
    assert build.ensure_kernel("6.1") == bz
    assert "SHOULD-NOT-RUN" not in capsys.readouterr().err


@needs_bash
def test_ensure_kernel_failure_names_the_log(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SLABTUNE_CACHE", str(tmp_path))
    log = tmp_path / "kernels" / "6.1" / "build.log"
    script = _fake_script(tmp_path / "build-kernels.sh", (
        'echo "build-kernels: 6.1: configure (3 s, 3 s in all)" >&2\n'
        f'echo "build-kernels: 6.1: compile failed (exit 2 after 9 s): '
        f'mm/slub.c:1: error: boom; log: {log}" >&2\n'
        'echo "build-kernels: failed: 6.1" >&2\nexit 1\n'))
    monkeypatch.setattr(build, "BUILD_SCRIPT", script)
    with pytest.raises(build.KernelBuildError) as info:
        build.ensure_kernel("6.1")
    msg = str(info.value)
    assert "\n" not in msg
    assert msg.startswith("kernel 6.1: build failed after ")
    assert "compile failed" in msg and f"log: {log}" in msg
    err = capsys.readouterr().err
    assert "configure (3 s" in err and "building from linux-source-6.1 6.1.192-2" in err


@needs_bash
def test_ensure_kernel_rebuilds_when_stale(tmp_path, monkeypatch):
    monkeypatch.setenv("SLABTUNE_CACHE", str(tmp_path))
    _fake_build(tmp_path, "6.1", "0" * 64)          # built from other inputs
    # The fake build writes a build.json with today's hash, as the real script does.
    script = _fake_script(tmp_path / "build-kernels.sh", (
        'cache=; while [ $# -gt 0 ]; do [ "$1" = --cache ] && cache=$2; shift; done\n'
        'cp "$cache/next-build.json" "$cache/kernels/6.1/build.json"\n'))
    monkeypatch.setattr(build, "BUILD_SCRIPT", script)
    want = build.inputs_hash("6.1", "6.1.192-2")
    (tmp_path / "next-build.json").write_text(json.dumps({"inputs_hash": want}))
    assert build.ensure_kernel("6.1", progress=open(os.devnull, "w")) == (
        tmp_path / "kernels" / "6.1" / "bzImage")
    assert build.build_info("6.1") == {"inputs_hash": want}


# --------------------------------------------------------------------------- boot


BOOT_INIT = r"""#!/bin/sh
PATH=/bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
echo 1 > /proc/sys/kernel/printk
read r < /proc/sys/kernel/osrelease; echo "@@KB release $r"
v=NA; [ -r /sys/devices/system/node/has_memory ] && read v < /sys/devices/system/node/has_memory
echo "@@KB has_memory $v"
v=NA; [ -r /sys/devices/system/node/has_cpu ] && read v < /sys/devices/system/node/has_cpu
echo "@@KB has_cpu $v"
for c in kmalloc-64 kmalloc-512; do
  for a in alloc_fastpath free_fastpath alloc_slowpath free_slowpath cpu_partial_alloc; do
    v=NA; [ -r /sys/kernel/slab/$c/$a ] && read v < /sys/kernel/slab/$c/$a
    echo "@@KB stat $c $a ${v%% *}"
  done
done
[ -r /proc/slabinfo ] && { read l < /proc/slabinfo; echo "@@KB slabinfo $l"; }
echo "@@KB end"
sync
poweroff -f
sleep 60
"""


@pytest.mark.slow
@pytest.mark.guest
def test_cached_61_kernel_boots_with_slub_stats():
    from slabtune.kernel import guest
    from slabtune.model.topology import Topology

    bz = build.kernel_path("6.1")
    if bz is None:
        pytest.skip("the 6.1 kernel is not built; run scripts/build-kernels.sh --only 6.1")
    try:
        assets = guest.find_assets(kernel=bz)
    except SlabtuneError as exc:
        pytest.skip(f"guest stack not installed ({exc}); run scripts/install-guest-deps.sh")
    topology = Topology.uniform(4, nodes=2, memoryless_nodes=(1,))
    with tempfile.TemporaryDirectory(prefix="slabtune-kbuild-") as tmp:
        initrd = Path(tmp) / "initrd.cpio"
        initrd.write_bytes(guest.build_initramfs(assets.busybox, BOOT_INIT))
        console = Path(tmp) / "console.log"
        argv = guest.qemu_argv(assets, initrd, console, "console=ttyS0 panic=-1", topology,
                               512, "tcg")
        subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=120)
        text = console.read_text(errors="replace")
    records = [ln.split(" ", 1)[1] for ln in text.splitlines() if ln.startswith("@@KB ")]
    assert "end" in records, text[-3000:]
    info = build.build_info("6.1")
    assert f"release {info['kernel_release']}" in records
    assert "has_memory 0" in records and "has_cpu 0-1" in records   # node 1 memoryless
    stats = {tuple(r.split()[1:3]): r.split()[3] for r in records if r.startswith("stat ")}
    assert len(stats) == 10
    for (cache, attr), value in stats.items():
        assert value != "NA", f"/sys/kernel/slab/{cache}/{attr} missing (SLUB_STATS off?)"
        assert int(value) >= 0
    assert int(stats[("kmalloc-64", "alloc_fastpath")]) > 0
    assert "slabinfo slabinfo - version: 2.1" in records

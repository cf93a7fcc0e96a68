"""The lab module (native/lab/slabtune_lab.c, kernel/labmod.py, kernel/lab_boot.py).

The fast tests boot nothing: how each workload kind of a config lands on the guest's CPUs
(module_params, cache_params, config_params), that the kinds and defaults agree with the
model's constructors, one-line errors naming the field, the module build's stamp and
failure paths against a fake kernel tree, the printk and console parsers and the /init's
refusal of anything but key=value words.  The slow guest tests build the module for each
built kernel and boot it.
"""

from __future__ import annotations

import inspect
import json
import shutil
import subprocess
from pathlib import Path

import pytest

from slabtune.errors import SlabtuneError
from slabtune.kernel import build, lab_boot, labmod
from slabtune.model import workloads
from slabtune.model.topology import Topology

#: 4 CPUs on 2 nodes, node 1 without memory: CPUs 0-1 on node 0, 2-3 on node 1.
T4 = Topology.uniform(4, 2, memoryless_nodes=[1])
T4_TABLE = {"cpus": 4, "nodes": 2, "memoryless_nodes": [1]}


def roles(params: list[str]) -> dict[str, str]:
    return dict(p.split("=", 1) for p in params)


# --------------------------------------------------------------------------- the model


def test_kinds_and_defaults_are_the_models():
    assert set(labmod.KIND_DEFAULTS) == set(workloads.BUILDERS)
    for kind, defaults in labmod.KIND_DEFAULTS.items():
        sig = inspect.signature(workloads.BUILDERS[kind])
        model = {n: p.default for n, p in sig.parameters.items() if n != "topology"}
        assert defaults == model, kind
        assert tuple(defaults) == workloads.spec_params(kind)


def test_probabilities_are_quantised_as_the_model_does():
    for p in (0.0, 0.1, 0.25, 0.5, 0.9, 1.0, 1 / 3):
        got = roles(labmod.module_params({"kind": "local", "alloc_prob": p}, T4))
        assert int(got["alloc_prob"]) == workloads._prob("alloc_prob", p)


# --------------------------------------------------------------------------- module_params


def test_local_runs_on_every_online_cpu():
    got = roles(labmod.module_params({"kind": "local", "live": 8, "burst": 4,
                                      "alloc_prob": 0.75}, T4, ops=500, seed=7))
    assert got == {"kind": "local", "cpus": "0-3", "live": "8", "burst": "4",
                   "alloc_prob": "49152", "ops": "500", "seed": "7", "ring": "lockless",
                   "drain": "hold"}
    online3 = Topology.uniform(4, 2, memoryless_nodes=[1], online=3)
    assert roles(labmod.module_params({"kind": "local"}, online3))["cpus"] == "0-2"


def test_producer_consumer_halves_each_node():
    got = roles(labmod.module_params({"kind": "producer_consumer", "depth": 16,
                                      "cross_node": 0.25}, T4))
    assert (got["cpus"], got["cpus_b"], got["depth"], got["cross_node"]) == \
        ("0,2", "1,3", "16", "16384")
    # a node's only CPU both sends and receives; 3 CPUs: 2 send, 1 receives
    t = Topology.uniform(4, 2, node_cpus=[1, 3])
    got = roles(labmod.module_params({"kind": "producer_consumer"}, t))
    assert (got["cpus"], got["cpus_b"]) == ("0-2", "0,3")


def test_request_response_interrupt_cpu_and_threads():
    got = roles(labmod.module_params({"kind": "request_response", "irq_free": 0.5,
                                      "irq_self_free": 0.125, "live": 4}, T4))
    assert (got["cpus"], got["cpus_b"]) == ("1-3", "0")   # threads=16 capped at CPUs - 1
    assert (got["irq_free"], got["irq_self_free"], got["live"]) == ("32768", "8192", "4")
    t8 = Topology.uniform(8, 4, memoryless_nodes=[2, 3])
    got = roles(labmod.module_params({"kind": "request_response", "threads": 2}, t8))
    assert (got["cpus"], got["cpus_b"]) == ("1-2", "0")
    one = Topology.uniform(1)
    got = roles(labmod.module_params({"kind": "request_response"}, one))
    assert (got["cpus"], got["cpus_b"]) == ("0", "0")


def test_block_io_completion_cpus():
    got = roles(labmod.module_params({"kind": "block_io"}, T4))
    assert (got["cpus"], got["cpus_b"], got["depth"]) == ("1-3", "0", "32")
    got = roles(labmod.module_params({"kind": "block_io", "completion_remote": True}, T4))
    assert (got["cpus"], got["cpus_b"]) == ("0-1,3", "2")
    t8 = Topology.uniform(8, 4, memoryless_nodes=[2, 3])
    got = roles(labmod.module_params({"kind": "block_io", "completion_remote": True,
                                      "completions": 3}, t8))
    assert (got["cpus"], got["cpus_b"]) == ("0-3,7", "4-6")
    # no memoryless node: remote completions go to another memory node
    t2 = Topology.uniform(4, 2)
    got = roles(labmod.module_params({"kind": "block_io", "completion_remote": True}, t2))
    assert got["cpus_b"] == "2"
    # three or more memory nodes: class 1 stands for several, so the completion CPU stays
    # on the first memory node, where only its own node's objects are local (as the model
    # places it, model/workloads.py block_io)
    t16 = Topology.uniform(16, 4)
    got = roles(labmod.module_params({"kind": "block_io", "completion_remote": True}, t16))
    assert (got["cpus"], got["cpus_b"]) == ("1-15", "0")
    _, lay = workloads.block_io(t16, completion_remote=True)
    assert int(lay.node[0]) == workloads.NODE_MEM0 and float(lay.weight[0]) == 1.0
    assert float(lay.weight[lay.node == workloads.NODE_MEM0].sum()) == 4.0
    # completions that do not fit on the first node go to the other memory nodes
    got = roles(labmod.module_params({"kind": "block_io", "completion_remote": True,
                                      "completions": 4}, t16))
    assert got["cpus_b"] == "4-7"


def test_topology_table_maps_like_the_topology():
    for kind in labmod.KIND_DEFAULTS:
        assert labmod.module_params({"kind": kind}, T4_TABLE) == \
            labmod.module_params({"kind": kind}, T4)


def test_other_ns_becomes_work_ns_and_ring_passes():
    got = roles(labmod.module_params({"kind": "local", "other_ns": 12.6}, T4, ring="spinlock"))
    assert (got["work_ns"], got["ring"]) == ("13", "spinlock")
    assert "work_ns" not in roles(labmod.module_params({"kind": "local"}, T4))


def test_lockstep_is_a_module_parameter_only_when_asked():
    """The step barrier (lockstep=1) goes to insmod only for a lockstep run, after the
    window's ops; the module declares the parameter and documents its done record's
    ``lockstep`` and ``steps``."""
    eager = {"kind": "block_io", "drain": "eager"}
    free = labmod.module_params(eager, T4, ops=100, warmup=25)
    step = labmod.module_params(eager, T4, ops=100, warmup=25, lockstep=True)
    assert "lockstep" not in roles(free)
    assert step[:-1] == free and step[-1] == "lockstep=1"
    src = labmod.native.source("lab/slabtune_lab.c").read_text()
    assert "module_param(lockstep, bool" in src
    assert '\\"lockstep\\":%d,\\"steps\\":%lu' in src


def test_drain_hold_is_a_module_parameter_and_eager_passes_what_it_did_before():
    """``drain = "hold"`` (the default) becomes the module's ``drain=hold``; in lockstep
    with a warm-up also ``end_park=1`` (the window ends before the drain).  ``eager``
    passes nothing, so an eager config's parameters are those from before ``drain``
    existed (the module's default is eager); the module declares both parameters and
    reports them in its done record."""
    doc = {"kind": "producer_consumer", "depth": 1024}
    hold = labmod.module_params(doc, T4, ops=100, warmup=25, lockstep=True)
    eager = labmod.module_params({**doc, "drain": "eager"}, T4, ops=100, warmup=25,
                                 lockstep=True)
    assert hold == eager + ["drain=hold", "end_park=1"]
    assert eager == ["kind=producer_consumer", "cpus=0,2", "cpus_b=1,3", "depth=1024",
                     "cross_node=0", "ops=100", "seed=1", "ring=lockless", "warmup=25",
                     "lockstep=1"]
    # no end park without lockstep or without a warm-up (nothing to end)
    assert labmod.module_params(doc, T4, ops=100, warmup=25)[-1] == "drain=hold"
    assert labmod.module_params(doc, T4, ops=100, lockstep=True)[-1] == "drain=hold"
    src = labmod.native.source("lab/slabtune_lab.c").read_text()
    assert 'static char *drain = "eager";' in src
    assert "module_param(end_park, bool" in src
    assert '\\"drain\\":\\"%s\\",\\"end_park\\":%d,' in src


def test_cpu_list():
    assert labmod.cpu_list([0, 1, 2, 5, 7, 8]) == "0-2,5,7-8"
    assert labmod.cpu_list([3, 1]) == "3,1"
    assert labmod.cpu_list([]) == ""


def test_cache_params():
    assert labmod.cache_params({"name": "kmalloc-512"}) == ["size=512"]
    assert labmod.cache_params({"name": "kmalloc-1k"}) == ["size=1024"]
    assert labmod.cache_params({"size": 700}) == [
        "own_cache=1", "size=700", "cache_name=slabtune_lab", "cache_flags=no_merge",
        "keep_cache=1"]
    assert "cache_flags=no_merge" not in labmod.cache_params({"size": 700}, no_merge=False)


def test_config_params_from_a_config_document():
    doc = {"topology": T4_TABLE, "cache": {"name": "kmalloc-256"},
           "policy": {"profile": "v7.0"},
           "workload": {"kind": "block_io", "depth": 8, "completion_remote": True,
                        "drain": "eager"},
           "run": {"steps": 300, "seed": 5, "ops_per_step": 4}}
    got = roles(labmod.config_params(doc))
    # the counted window is the config's 300 steps x 4 ops; before it, a quarter of the
    # steps (75) x 4 ops of warm-up
    assert got == {"size": "256", "kind": "block_io", "cpus": "0-1,3", "cpus_b": "2",
                   "depth": "8", "ops": "1200", "seed": "5", "ring": "lockless",
                   "warmup": "300"}


def test_every_key_simconfig_accepts_maps():
    from slabtune.sweeps import simconfig

    for kind in simconfig.WORKLOAD_KINDS:
        keys = simconfig.workload_param_names(kind)
        assert set(keys) == set(labmod.KIND_DEFAULTS[kind])


@pytest.mark.parametrize("doc, field", [
    ({"kind": "nope"}, "workload.kind"),
    ({}, "workload.kind"),
    ({"kind": "local", "burts": 3}, "workload.burts"),
    ({"kind": "local", "live": 0}, "workload.live"),
    ({"kind": "local", "live": 2.5}, "workload.live"),
    ({"kind": "local", "alloc_prob": 1.5}, "workload.alloc_prob"),
    ({"kind": "local", "alloc_prob": True}, "workload.alloc_prob"),
    ({"kind": "local", "burst": -1}, "workload.burst"),
    ({"kind": "producer_consumer", "depth": 0}, "workload.depth"),
    ({"kind": "producer_consumer", "depth": labmod.MAX_LIVE + 1}, "workload.depth"),
    ({"kind": "producer_consumer", "cross_node": -0.1}, "workload.cross_node"),
    ({"kind": "request_response", "threads": 0}, "workload.threads"),
    ({"kind": "request_response", "irq_free": "0.9"}, "workload.irq_free"),
    ({"kind": "request_response", "irq_self_free": 2}, "workload.irq_self_free"),
    ({"kind": "block_io", "completions": 3}, "workload.completions"),
    ({"kind": "block_io", "completion_remote": 1}, "workload.completion_remote"),
    ({"kind": "local", "other_ns": -1.0}, "workload.other_ns"),
    ({"kind": "local", "drain": "lazy"}, "workload.drain"),
    ({"kind": "block_io", "drain": 1}, "workload.drain"),
    ({"kind": "local", "live": 4, "burst": 9}, "workload.burst"),
    ({"kind": "local", "other_ns": float("nan")}, "workload.other_ns"),
])
def test_bad_workload_values_name_the_field(doc, field):
    with pytest.raises(SlabtuneError) as exc:
        labmod.module_params(doc, T4)
    msg = str(exc.value)
    assert msg.startswith(field + ":"), msg
    assert "\n" not in msg


@pytest.mark.parametrize("call, field", [
    (lambda: labmod.module_params({"kind": "local"}, Topology.uniform(65)), "topology"),
    (lambda: labmod.module_params({"kind": "producer_consumer"}, Topology.uniform(1)),
     "workload.kind"),
    (lambda: labmod.module_params({"kind": "block_io"}, Topology.uniform(1)), "workload.kind"),
    (lambda: labmod.module_params({"kind": "local"}, T4, ring="mutex"), "ring"),
    (lambda: labmod.module_params({"kind": "local"}, T4, ops=0), "ops"),
    (lambda: labmod.module_params({"kind": "local"}, {"cpus": 4, "node_cpus": [4, 0]}),
     "topology.node_cpus"),
    (lambda: labmod.module_params({"kind": "local"}, {"cpus": 0}), "topology.cpus"),
    (lambda: labmod.module_params({"kind": "local"}, object()), "topology"),
    (lambda: labmod.cache_params({"name": "maple_node"}), "cache.name"),
    (lambda: labmod.cache_params({"name": "kmalloc-512", "size": 512}), "cache"),
    (lambda: labmod.cache_params({"size": 2}), "cache.size"),
    (lambda: labmod.cache_params({"nme": "x"}), "cache.nme"),
    (lambda: labmod.config_params({"topology": T4_TABLE, "cache": {"size": 64}}),
     "[workload]"),
    (lambda: labmod.config_params({"topology": T4_TABLE, "cache": {"size": 64},
                                   "workload": {"kind": "local"}, "run": {"steps": 0}}),
     "run.steps"),
])
def test_bad_values_are_one_line_naming_the_field(call, field):
    with pytest.raises(SlabtuneError) as exc:
        call()
    msg = str(exc.value)
    assert msg.startswith(field + ":"), msg
    assert "\n" not in msg


# --------------------------------------------------------------------------- building


def _fake_tree(root: Path, fail: bool = False) -> Path:
    """A directory that answers ``make -C tree M=dir modules`` like a kernel tree would
    (writes dir/slabtune_lab.ko and counts its runs), or fails with a compiler error."""
    tree = root / "tree"
    tree.mkdir()
    (tree / "Module.symvers").write_text("")
    (tree / ".config").write_text("CONFIG_SLUB=y\n")
    recipe = ("\t@echo 'slabtune_lab.c:1:1: error: boom'; exit 1" if fail else
              "\t@echo built >> $(M)/runs; touch $(M)/slabtune_lab.ko")
    (tree / "Makefile").write_text(f"modules:\n{recipe}\n")
    return tree


needs_make = pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")


@needs_make
def test_build_module_is_rebuilt_only_when_its_inputs_change(tmp_path, monkeypatch):
    monkeypatch.setenv("SLABTUNE_CACHE", str(tmp_path / "cache"))
    tree = _fake_tree(tmp_path)
    monkeypatch.setattr(build, "build_tree", lambda name: tree)
    ko = labmod.build_module("6.12")
    assert ko == tmp_path / "cache" / "build" / "lab" / "6.12" / "slabtune_lab.ko"
    assert (ko.parent / "slabtune_lab.c").read_bytes() == \
        labmod.native.source("lab/slabtune_lab.c").read_bytes()
    labmod.build_module("6.12")
    assert (ko.parent / "runs").read_text().count("built") == 1
    (tree / ".config").write_text("CONFIG_SLUB=y\nCONFIG_X=y\n")
    labmod.build_module("6.12")
    assert (ko.parent / "runs").read_text().count("built") == 2


@needs_make
def test_failed_build_is_one_line_naming_the_log(tmp_path, monkeypatch):
    monkeypatch.setenv("SLABTUNE_CACHE", str(tmp_path / "cache"))
    tree = _fake_tree(tmp_path, fail=True)
    monkeypatch.setattr(build, "build_tree", lambda name: tree)
    with pytest.raises(labmod.LabError) as exc:
        labmod.build_module("6.12")
    msg = str(exc.value)
    log = tmp_path / "cache" / "build" / "lab" / "6.12" / "build.log"
    assert "\n" not in msg and msg.endswith(f"log: {log}") and "error: boom" in msg
    assert log.is_file()


def test_build_module_refuses_unknown_and_unbuilt_kernels(monkeypatch):
    with pytest.raises(labmod.LabError, match="^kernel: unknown kernel 'nope'"):
        labmod.build_module("nope")
    monkeypatch.setattr(build, "build_tree", lambda name: None)
    with pytest.raises(labmod.LabError, match="^kernel 6.12: no kept build tree"):
        labmod.build_module("6.12")


def test_module_source_is_package_data():
    src = labmod.native.source("lab/slabtune_lab.c")
    assert src.is_file() and "MODULE_LICENSE(\"GPL\")" in src.read_text()
    assert labmod.native.source("lab/Kbuild").read_text().strip() == "obj-m += slabtune_lab.o"
    text = (Path(__file__).resolve().parent.parent / "pyproject.toml").read_text()
    assert '"lab/*.c", "lab/Kbuild"' in text


# --------------------------------------------------------------------------- parsing


def test_parse_printk_keeps_the_last_run():
    log = [
        "[    1.0] slabtune_lab: worker {\"run\":1,\"w\":0,\"allocs\":1}",
        "[    1.1] slabtune_lab: done {\"run\":1,\"status\":0,\"allocs\":1}",
        "[    2.0] slabtune_lab: worker {\"run\":2,\"w\":0,\"allocs\":5}",
        "[    2.1] slabtune_lab: worker {\"run\":2,\"w\":1,\"allocs\":6}",
        "[    2.2] slabtune_lab: done {\"run\":2,\"status\":0,\"allocs\":11}",
        "[    2.3] unrelated: line",
    ]
    got = labmod.parse_printk(log)
    assert [w["allocs"] for w in got["workers"]] == [5, 6]
    assert got["done"]["allocs"] == 11 and got["errors"] == []
    err = labmod.parse_printk("slabtune_lab: error {\"run\":1,\"field\":\"cpus\",\"msg\":\"x\"}")
    assert err["errors"] == [{"run": 1, "field": "cpus", "msg": "x"}] and err["done"] is None
    with pytest.raises(labmod.LabError, match="malformed done line"):
        labmod.parse_printk("slabtune_lab: done {not json")


def test_init_script_takes_only_key_value_words():
    script = lab_boot.init_script("abc123", "kmalloc-512", ["kind=local", "cpus=0-3"])
    assert "( insmod /lib/slabtune_lab.ko kind=local cpus=0-3; echo $? > /tmp/rc ) &\n" \
        in script
    assert "D=/sys/kernel/slab/kmalloc-512" in script
    # the sampling loop waits on a FIFO read with a timeout, no sleep fork
    assert "read -t 0.05 v <> /tmp/tick" in script
    assert "sleep" not in script.split("mkfifo")[1].split("poweroff")[0]
    s2 = lab_boot.init_script("abc123", "kmalloc-512", [], sysfs={"min_partial": 7})
    assert 'echo 7 > "$D/min_partial"; echo "$M R set_min_partial $?"' in s2
    assert s2.index("min_partial") < s2.index("dump base")
    for bad in ({"order": 1}, {"min_partial": -1}, {"min_partial": "5; reboot"}):
        with pytest.raises(lab_boot.LabBootError, match="^policy.params."):
            lab_boot.init_script("abc123", "kmalloc-512", [], sysfs=bad)
    for bad in (["kind=local;reboot"], ["cpus=$(x)"], ["kind local"], ["=1"]):
        with pytest.raises(lab_boot.LabBootError, match="^params:"):
            lab_boot.init_script("abc123", "kmalloc-512", bad)
    with pytest.raises(lab_boot.LabBootError, match="^cache:"):
        lab_boot.init_script("abc123", "kmalloc 512", [])
    with pytest.raises(lab_boot.LabBootError, match="^token:"):
        lab_boot.init_script("a-b", "kmalloc-512", [])


def test_init_script_is_valid_shell(tmp_path):
    sh = shutil.which("sh")
    if sh is None:
        pytest.skip("no sh")
    for allocator in ("slub", "slab"):
        f = tmp_path / f"init-{allocator}"
        f.write_text(lab_boot.init_script("abc123", "kmalloc-512", ["kind=local"],
                                          allocator=allocator))
        assert subprocess.run([sh, "-n", str(f)]).returncode == 0


def test_slab_init_reads_the_caches_slabinfo_line(tmp_path):
    """On SLAB the /init's ``dump`` prints the cache's /proc/slabinfo line and ``sample``
    its num_slabs (the 14th field after the name) with active_objs and num_objs: run the
    two shell functions on a copy of a 6.1 SLAB /proc/slabinfo."""
    sh = shutil.which("sh")
    if sh is None:
        pytest.skip("no sh")
    script = lab_boot.init_script("abc123", "slabtune_lab", [], allocator="slab")
    assert "/sys/kernel/slab/slabtune_lab/" not in script.split("dump warm")[1]
    funcs = script[script.index("line() {"):script.index("dump warm")]
    info = tmp_path / "slabinfo"
    info.write_text(
        "slabinfo - version: 2.1\n"
        "# name <active_objs> <num_objs> <objsize> ...\n"
        "kmalloc-512 60 64 512 8 1 : tunables 54 27 8 : slabdata 8 8 0\n"
        "slabtune_lab 253 370 3000 5 4 : tunables 24 12 8 : slabdata 70 74 16\n")
    body = (funcs.replace("/proc/slabinfo", str(info))
            + 'M=@@LAB; C=slabtune_lab; dump after; sample; echo "$v"\n'
            + 'C=nothing; dump before\n')
    out = subprocess.run([sh, "-c", body], capture_output=True, text=True).stdout
    assert out.splitlines() == [
        "@@LAB C after slabinfo 253 370 3000 5 4 : tunables 24 12 8 : slabdata 70 74 16",
        "@@LAB N after", "74 A=253 O=370", "@@LAB X before"]
    with pytest.raises(lab_boot.LabBootError, match="^policy.params.min_partial: a SLUB"):
        lab_boot.init_script("abc123", "slabtune_lab", [], sysfs={"min_partial": 1},
                             allocator="slab")


def test_slab_init_writes_the_tunables_line_before_the_first_dump(tmp_path):
    """On SLAB the /init writes ``<cache> <limit> <batchcount> <shared>`` to /proc/slabinfo
    (slabinfo_write(), 6.1 mm/slab.c) before ``dump base``, from checked ints: the three
    together (the kernel parses one line of all three), a line the kernel would ignore
    (batchcount above limit, limit 0, shared < 0) or a non-integer is refused in one line
    naming the field; a SLUB kernel takes none, and SLAB no sysfs file."""
    s = lab_boot.init_script("abc123", "kmalloc-512", [], allocator="slab",
                             slabinfo={"limit": 12, "batchcount": 4, "shared": 2})
    line = 'echo "$C 12 4 2" > /proc/slabinfo; echo "$M R set_slabinfo $?"'
    assert line in s and s.index(line) < s.index("dump base")
    assert "/proc/slabinfo; " not in lab_boot.init_script("abc123", "kmalloc-512", [],
                                                           allocator="slab")
    # the line the shell writes, run on a file standing in for /proc/slabinfo
    sh = shutil.which("sh")
    if sh is not None:
        out = tmp_path / "slabinfo"
        body = f'M=@@LAB; C=kmalloc-512; {line.replace("/proc/slabinfo", str(out))}\n'
        r = subprocess.run([sh, "-c", body], capture_output=True, text=True)
        assert r.stdout == "@@LAB R set_slabinfo 0\n"
        assert out.read_text() == "kmalloc-512 12 4 2\n"
    for bad, field in (({"limit": 12, "batchcount": 4}, "shared"),
                       ({"limit": 4, "batchcount": 12, "shared": 0}, "batchcount"),
                       ({"limit": 0, "batchcount": 0, "shared": 0}, "batchcount"),
                       ({"limit": 4, "batchcount": 2, "shared": -1}, "batchcount"),
                       ({"limit": 5000, "batchcount": 2, "shared": 0}, "limit"),
                       ({"limit": "4; reboot", "batchcount": 2, "shared": 0}, "limit"),
                       ({"limit": 4, "batchcount": True, "shared": 0}, "batchcount"),
                       ({"limit": 4, "batchcount": 2, "shared": 0, "order": 1}, "order")):
        with pytest.raises(lab_boot.LabBootError, match=f"^policy.params.{field}: "):
            lab_boot.init_script("abc123", "kmalloc-512", [], allocator="slab", slabinfo=bad)
    with pytest.raises(lab_boot.LabBootError, match="^policy.params.limit: a SLAB "
                                                    "/proc/slabinfo tunable; a SLUB kernel"):
        lab_boot.init_script("abc123", "kmalloc-512", [],
                             slabinfo={"limit": 12, "batchcount": 4, "shared": 2})


def test_a_tunables_line_the_guest_does_not_show_fails_the_run():
    """The run fails in one line when the write failed (no such cache: -EINVAL) or the
    cache's /proc/slabinfo line at ``base`` does not show the three values written."""
    tun = {"limit": 12, "batchcount": 4, "shared": 2}
    shown = "60 64 512 8 1 : tunables {} {} {} : slabdata 8 8 0"
    assert lab_boot.slabinfo_mismatch(shown.format(12, 4, 2), "kmalloc-512", tun) is None
    why = lab_boot.slabinfo_mismatch(shown.format(54, 27, 8), "kmalloc-512", tun)
    assert why == ("policy.params.limit: /proc/slabinfo shows kmalloc-512 with limit 54 "
                   "batchcount 27 shared 8, not the 12 4 2 written")
    assert "shared 8" in lab_boot.slabinfo_mismatch(shown.format(12, 4, 8), "kmalloc-512",
                                                    tun)
    text = "\n".join(["@@LAB S t1", "@@LAB R set_slabinfo 1", "@@LAB E t1"])
    r = lab_boot.console_result(text, "", "t1", 0, False, 1.0, kernel="k",
                                cache="kmalloc-512", params=[], argv=[], accel="tcg",
                                cmdline="", sysfs={}, slabinfo=tun)
    assert not r.ok and r.error == ("policy.params.limit: writing 'kmalloc-512 12 4 2' to "
                                    "/proc/slabinfo failed")
    text = "\n".join(["@@LAB S t1", "@@LAB R set_slabinfo 0",
                      "@@LAB C base slabinfo " + shown.format(54, 27, 8), "@@LAB E t1"])
    r = lab_boot.console_result(text, "", "t1", 0, False, 1.0, kernel="k",
                                cache="kmalloc-512", params=[], argv=[], accel="tcg",
                                cmdline="", sysfs={}, slabinfo=tun)
    assert not r.ok and r.error.startswith("policy.params.limit: /proc/slabinfo shows")


def test_parse_console_and_counters():
    text = "\n".join([
        "[    0.5] some kernel line",
        "@@LAB S tok1",
        "@@LAB I release 7.2.13-slabtune",
        "@@LAB C base alloc_fastpath 100 C0=60 C1=40",
        "@@LAB C before alloc_fastpath 103 C0=62 C1=41",
        "@@LAB N before",
        "@@LAB R insmod 0",
        "@@LAB C after alloc_fastpath 1103 C0=562 C1=541",
        "@@LAB C after order 0",
        "@@LAB K [    3.0] slabtune_lab: done {\"run\":1,\"status\":0,\"allocs\":1000}",
        "@@LAB E tok1",
    ])
    p = lab_boot.parse_console(text, "tok1")
    assert p["started"] and p["ended"] and p["rc"] == {"insmod": 0}
    assert p["info"]["release"] == "7.2.13-slabtune"
    assert p["dumps"]["after"]["alloc_fastpath"] == "1103 C0=562 C1=541"
    assert labmod.parse_printk(p["log"])["done"]["allocs"] == 1000
    assert not lab_boot.parse_console(text, "tok2")["started"]
    assert lab_boot.counter_total("1103 C0=562 C1=541") == 1103
    assert lab_boot.counter_total(None) is None
    assert lab_boot.counter_per_cpu("1103 C0=562 C1=541") == {0: 562, 1: 541}


def test_end_park_dumps_the_window_end_and_measure_stops_there(tmp_path):
    """With ``end_park=1`` the /init watches /proc/slabtune_lab once the window is open,
    dumps ``end`` when it reads ``ended`` and resumes the drain; the counters, ops and
    memory samples of :func:`lab_boot.measure` then run from ``window`` to ``end``, so the
    drain (every live set freed: here 400 frees, 4 empty slabs given back) stays out.
    Without the parameter the /init is the one from before (no ``ended`` watch)."""
    plain = lab_boot.init_script("abc123", "slabtune_lab", ["kind=local", "drain=hold"])
    parked = lab_boot.init_script("abc123", "slabtune_lab", ["kind=local", "drain=hold",
                                                             "end_park=1"])
    assert "ended" not in plain and "dump end" not in plain
    assert "dump end" in parked and "resume_end" in parked
    sh = shutil.which("sh")
    if sh is not None:
        f = tmp_path / "init"
        f.write_text(parked)
        assert subprocess.run([sh, "-n", str(f)]).returncode == 0
    done = {"run": 1, "status": 0, "allocs": 1400, "frees": 1400, "warmup": 100,
            "warm_allocs": 400, "warm_frees": 0, "window": 1, "lockstep": 1,
            "drain": "hold", "end_park": 1, "end_allocs": 1400, "end_frees": 1000,
            "ended": 1}
    lines = ["@@LAB S tok1",
             "@@LAB C before alloc_fastpath 0", "@@LAB C before alloc_slowpath 0",
             "@@LAB C before slabs 0", "@@LAB R insmod 0",
             "@@LAB P 0 50", "@@LAB P 1 50"]
    lines += ["@@LAB C window alloc_slowpath 400", "@@LAB C window alloc_fastpath 0",
              "@@LAB C window alloc_slab 50", "@@LAB C window free_slowpath 0",
              "@@LAB I window_sample 2", "@@LAB P 2 52", "@@LAB P 3 54",
              "@@LAB C end alloc_slowpath 1000", "@@LAB C end alloc_fastpath 400",
              "@@LAB C end alloc_slab 60", "@@LAB C end free_slowpath 1000",
              "@@LAB I end_sample 4", "@@LAB P 4 10",
              "@@LAB C after alloc_slowpath 1000", "@@LAB C after alloc_fastpath 400",
              "@@LAB C after alloc_slab 60", "@@LAB C after free_slowpath 1400",
              "@@LAB C after order 0", "@@LAB C after slabs 0",
              "@@LAB K [ 3.0] slabtune_lab: done " + json.dumps(done), "@@LAB E tok1"]
    kw = dict(kernel="k", cache="slabtune_lab", params=[], argv=[], accel="tcg",
              cmdline="", sysfs={})
    r = lab_boot.console_result("\n".join(lines), "", "tok1", 0, False, 1.0, **kw)
    assert r.ok, r.error
    assert (r.window_at, r.end_at) == (2, 4)
    m = lab_boot.measure(r)
    assert m["ops"] == 1400 + 1000 - 400 and m["warmup_ops"] == 400
    assert m["counters"]["free_slowpath"] == 1000          # not the drain's 400 more
    assert m["alloc_fastpath_frac"] == pytest.approx(400 / 1000)
    assert m["slab_allocs_per_kop"] == pytest.approx(1000 * 10 / 2000)
    assert m["memory_bytes"] == pytest.approx(53 * 4096)   # samples 52, 54: not the 10
    # an end park the /init did not dump fails the run
    no_end = [ln for ln in lines if " end " not in ln and "end_sample" not in ln]
    r = lab_boot.console_result("\n".join(no_end), "", "tok1", 0, False, 1.0, **kw)
    assert not r.ok and "end_park" in r.error


# --------------------------------------------------------------------------- in a guest

GUEST_KERNELS = ("6.1", "6.12", "7.2")


@pytest.mark.slow
@pytest.mark.guest
@pytest.mark.parametrize("kernel", GUEST_KERNELS)
def test_module_moves_the_counters_by_its_own_ops(kernel):
    """Boot ``kernel`` (4 CPUs, node 1 memoryless) and run producer_consumer on kmalloc-512
    (senders 0 and 2, receivers 1 and 3, half the messages across nodes, 3000 allocations
    per sender).  The allocations the counters saw between the ``before`` and ``after``
    dumps (alloc_fastpath + alloc_slowpath) and the frees (free_fastpath + free_slowpath)
    must equal the module's own, within a tolerance from what else runs in the guest:

    * above: the module's load (and the ``dmesg | grep`` that reads its lines) allocate a
      few kmalloc-512 objects of their own.  The /init measures that cost on the same boot
      by loading and unloading the module once without a run between its ``base`` and
      ``before`` dumps (``probe``: a handful on 6.1-7.2), and the test allows twice that
      plus 64 for the run's own bookkeeping (4 kthreads, vmalloc'd rings); the dumps
      themselves use the shell's ``read`` builtin and fork nothing;
    * below: SLUB_STATS increments are per-CPU read-modify-writes that may lose a count
      when preempted (mm/slub.c stat()), so 1 in 1000 may be missing.
    """
    if build.kernel_path(kernel) is None or build.build_tree(kernel) is None:
        pytest.skip(f"kernel {kernel} is not built; run scripts/build-kernels.sh --only "
                    f"{kernel}")
    from slabtune.kernel import guest

    ops = 3000
    try:
        result = lab_boot.boot_lab(kernel, {"kind": "producer_consumer", "depth": 32,
                                            "cross_node": 0.5}, T4, ops=ops, seed=3,
                                   timeout_s=400)
    except guest.GuestError as exc:
        pytest.skip(f"guest stack not installed ({exc})")
    assert result.ok, result.error + "\n" + result.console_tail
    done = result.done
    assert done["allocs"] == done["frees"] == 2 * ops
    assert [w["cpu"] for w in result.workers] == [0, 2, 1, 3]
    assert {"alloc_fastpath", "alloc_slowpath", "free_fastpath", "free_slowpath",
            "alloc_slab", "free_slab"} <= set(result.files)
    for names, want in ((("alloc_fastpath", "alloc_slowpath"), done["allocs"]),
                        (("free_fastpath", "free_slowpath"), done["frees"])):
        moved = sum(result.delta(n) for n in names)
        probe = sum(result.delta(n, "base", "before") for n in names)
        assert want - want // 1000 <= moved <= want + 2 * probe + 64, (names, moved, probe)
    # the senders' CPUs did the allocations, the receivers' the frees
    per_cpu = result.per_cpu_delta("alloc_fastpath")
    slow = result.per_cpu_delta("alloc_slowpath")
    for cpu in (0, 2):
        assert per_cpu.get(cpu, 0) + slow.get(cpu, 0) >= ops


@pytest.mark.slow
@pytest.mark.guest
def test_held_run_keeps_its_live_set_and_ends_its_window_before_the_drain():
    """Boot 6.1 (4 CPUs, node 1 memoryless) and run local churn with ``drain = "hold"``,
    ``live`` 256, in lockstep: 500 warm-up steps, 2000 counted.  The module's rule
    (workloads.hold_levels): each worker's cap is 256 + 8 and its hold 256 - 8, which its
    worker records report.  The window ends at the end park: ops are exactly 4 * 2000 (one
    op per step: never below the hold with nothing to allocate, never at the cap with
    nothing to free), and the mean slab memory in it holds the four live sets, 4 * 256
    objects of 512 bytes, and less than one slab per CPU more than that (order 1, 16
    objects per slab on 4 CPUs) plus the per-CPU partial slabs."""
    if build.kernel_path("6.1") is None or build.build_tree("6.1") is None:
        pytest.skip("kernel 6.1 is not built; run scripts/build-kernels.sh --only 6.1")
    from slabtune.kernel import guest

    steps, warm = 2000, 500
    try:
        result = lab_boot.boot_lab("6.1", {"kind": "local", "live": 256}, T4,
                                   cache_doc={"size": 512}, ops=steps, warmup=warm,
                                   lockstep=True, seed=3, timeout_s=600)
    except guest.GuestError as exc:
        pytest.skip(f"guest stack not installed ({exc})")
    assert result.ok, result.error + "\n" + result.console_tail
    assert "drain=hold" in result.params and "end_park=1" in result.params
    assert [(w["cap"], w["hold"]) for w in result.workers] == [(264, 248)] * 4
    assert result.dumps["end"] and result.done["ended"] == 1
    m = lab_boot.measure(result)
    assert m["ops"] == 4 * steps and m["warmup_ops"] == 4 * warm
    live_bytes = 4 * 256 * 512
    assert live_bytes <= m["memory_bytes"] <= live_bytes * 1.25, m["memory_bytes"]

"""``slabtune simulate``: CONFIG.toml parsing, round trips, bad input through the real CLI,
and one real run whose structural fields follow the kernel's rules."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import tomli_w

from slabtune.sweeps import simconfig

ROOT = Path(__file__).resolve().parents[1]

BASE = {
    "topology": {"cpus": 8, "nodes": 2},
    "cache": {"name": "kmalloc-512"},
    "policy": {"profile": "v5.11"},
    "workload": {"kind": "producer_consumer", "depth": 16},
    "run": {"steps": 300, "seed": 7},
}


def _doc(**changes):
    doc = json.loads(json.dumps(BASE))
    for path, value in changes.items():
        *head, last = path.split("__")
        t = doc
        for h in head:
            t = t.setdefault(h, {})
        if value is None:
            t.pop(last, None)
        else:
            t[last] = value
    return doc


def _cli(*args, env: dict | None = None):
    """The real CLI in a subprocess; ``env``: variables set over this process's."""
    return subprocess.run([sys.executable, "-m", "slabtune", *args], capture_output=True,
                          text=True, cwd=ROOT, timeout=600,
                          env=None if env is None else {**os.environ, **env})


# --------------------------------------------------------------------------- parsing


def test_examples_parse():
    for path in sorted((ROOT / "examples").glob("*.toml")):
        spec = simconfig.load(path)
        assert spec.steps > 0, path


@pytest.mark.parametrize("doc", [
    BASE,
    _doc(topology__nodes=4, topology__memoryless_nodes=[1, 3], policy__profile="v7.0",
         policy__params={"memoryless_fallback": False, "sheaf_capacity": 40},
         cache={"name": "maple_node"}, workload={"kind": "block_io", "depth": 8,
                                                 "completion_remote": True}),
    _doc(topology={"cpus": 6, "nodes": 2, "node_cpus": [4, 2], "possible": 16},
         cache={"size": 700}, policy={"profile": "v6.1",
                                      "params": {"slub_min_order": 1, "min_partial": 7,
                                                 "cpu_partial": 30}},
         workload={"kind": "local", "live": 12, "burst": 4, "other_ns": 250.0}),
    _doc(policy={"profile": "v7.0", "params": {"slab_max_order": 2,
                                               "barns_on_memoryless_nodes": True}},
         workload={"kind": "request_response", "threads": 40, "irq_free": 0.5}),
])
def test_toml_round_trip(tmp_path, doc):
    f = tmp_path / "c.toml"
    f.write_text(tomli_w.dumps(doc))
    spec = simconfig.load(f)
    again = tmp_path / "again.toml"
    again.write_text(tomli_w.dumps(spec.to_doc()))
    assert simconfig.load(again) == spec


def test_knobs_act_through_profile_data():
    spec = simconfig.parse_doc(_doc(
        topology__memoryless_nodes=[1], policy={"profile": "v7.0", "params": {
            "memoryless_fallback": False, "barns_on_memoryless_nodes": True}}))
    assert spec.profile.memoryless_fallback is False
    assert spec.profile.barns == "all_nodes" and spec.profile.memoryless_cpus_use_sheaves
    assert spec.boot.max_order == 3 and spec.boot_given == {}


# --------------------------------------------------------------------------- bad input


BAD = [
    ({"topology": {"cpus": 10, "nodes": 2, "node_cpus": [4, 4]}}, "topology.node_cpus"),
    ({"topology": {"cpus": 8, "nodes": 2, "memoryless_nodes": [5]}},
     "topology.memoryless_nodes"),
    ({"topology": {"cpus": 8, "nodes": 2, "memoryless_nodes": [0, 1]}},
     "topology.memoryless_nodes"),
    ({"workload": {"kind": "producer_consumer", "cross_node": -0.5}}, "workload.cross_node"),
    ({"workload": {"kind": "local", "other_ns": -3.0}}, "workload.other_ns"),
    ({"workload": {"kind": "local", "burts": 4}}, "workload.burts"),
    ({"workload": {"kind": "disk"}}, "workload.kind"),
    ({"policy": {"profile": "v7.0", "params": {"sheaf_capacity": 0}}},
     "policy.params.sheaf_capacity"),
    ({"policy": {"profile": "v5.10", "params": {"slub_min_ordr": 1}}},
     "policy.params.slub_min_ordr"),
    ({"policy": {"profile": "v5.10", "params": {"slab_max_order": 1}}},
     "policy.params.slab_max_order"),
    ({"policy": {"profile": "v5.10", "params": {"slub_max_order": 11}}}, "slub_max_order"),
    ({"cache": {"name": "kmalloc-3000"}}, "cache.name"),
    ({"run": {"steps": 0}}, "run.steps"),
    ({"runn": {"steps": 10}}, "config.runn"),
]


@pytest.mark.parametrize("change, field", BAD)
def test_bad_config_is_one_line_naming_the_field(tmp_path, change, field):
    doc = json.loads(json.dumps(BASE))
    doc.update(change)
    f = tmp_path / "bad.toml"
    f.write_text(tomli_w.dumps(doc))
    with pytest.raises(simconfig.ConfigError, match=field.replace(".", r"\.")):
        simconfig.load(f)


@pytest.mark.parametrize("change, field", [BAD[0], BAD[1], BAD[3], BAD[5], BAD[7]])
def test_bad_config_through_the_real_cli(tmp_path, change, field):
    doc = json.loads(json.dumps(BASE))
    doc.update(change)
    f = tmp_path / "bad.toml"
    f.write_text(tomli_w.dumps(doc))
    r = _cli("simulate", str(f), "--json")
    assert r.returncode == 2
    assert r.stdout == ""
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("slabtune: error: "), r.stderr
    assert field in lines[0] and "Traceback" not in r.stderr


def test_bad_cost_file_through_the_real_cli(tmp_path):
    f = tmp_path / "ok.toml"
    f.write_text(tomli_w.dumps(BASE))
    cost = tmp_path / "cost.toml"
    cost.write_text("[cost]\nlist_lock_hold_ns = -5.0\n")
    r = _cli("simulate", str(f), "--cost", str(cost))
    assert r.returncode == 2
    assert "cost.list_lock_hold_ns" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_bad_dynamics_engine_through_the_real_cli(tmp_path):
    """An unknown SLABTUNE_DYNAMICS_ENGINE is bad input: one line naming the variable and
    the engines it takes, exit 2, nothing on stdout."""
    f = tmp_path / "ok.toml"
    f.write_text(tomli_w.dumps(BASE))
    r = _cli("simulate", str(f), "--json", env={"SLABTUNE_DYNAMICS_ENGINE": "xla"})
    assert r.returncode == 2 and r.stdout == ""
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("slabtune: error: SLABTUNE_DYNAMICS_ENGINE")
    assert "'xla'" in lines[0] and "native" in lines[0] and "jax" in lines[0]


def test_invalid_toml_names_the_file(tmp_path):
    f = tmp_path / "broken.toml"
    f.write_text("[topology\ncpus = 4\n")
    with pytest.raises(simconfig.ConfigError, match="broken.toml"):
        simconfig.load(f)


# --------------------------------------------------------------------------- a real run


@pytest.fixture(scope="module")
def hackbench_rows(tmp_path_factory):
    """v5.10 against v5.11 on 224 CPUs, run through the real CLI."""
    out = {}
    d = tmp_path_factory.mktemp("sim")
    for prof in ("v5.10", "v5.11"):
        f = d / f"{prof}.toml"
        f.write_text(tomli_w.dumps(_doc(topology={"cpus": 224, "nodes": 2},
                                        policy={"profile": prof})))
        r = _cli("simulate", str(f), "--json")
        assert r.returncode == 0, r.stderr
        out[prof] = json.loads(r.stdout)
    return out


def test_simulate_json_has_structure_and_metrics(hackbench_rows):
    row = hackbench_rows["v5.11"]
    for key in ("alloc_fastpath_frac", "free_fastpath_frac", "slab_allocs_per_kop",
                "memory_bytes", "overhead_frac", "ns_per_op", "order", "objs_per_slab",
                "min_partial", "cpu_partial", "sheaf_capacity", "page_allocs_per_kop_by_order",
                "list_lock_per_kop", "list_lock_rho", "config"):
        assert key in row, key
    assert 0.0 <= row["alloc_fastpath_frac"] <= 1.0
    assert 0.0 <= row["free_fastpath_frac"] <= 1.0
    assert row["memory_bytes"] > 0 and row["ns_per_op"] > 0
    assert len(row["page_allocs_per_kop_by_order"]) == 11


def test_v5_11_kmalloc_caches_get_order0_and_more_page_allocator_calls(hackbench_rows):
    old, new = hackbench_rows["v5.10"], hackbench_rows["v5.11"]
    # v5.10: min_objects = 4 * (fls(224) + 1) = 36 -> 36 * 512 B needs order 3 (64 objects);
    # v5.11: one online CPU at boot -> 4 * (fls(1) + 1) = 8 -> order 0 (8 objects).
    assert (old["nr_cpus"], old["min_objects"], old["order"], old["objs_per_slab"]) == \
        (224, 36, 3, 64)
    assert (new["nr_cpus"], new["min_objects"], new["order"], new["objs_per_slab"]) == (1, 8, 0, 8)
    # Order-0 slabs hold 8x fewer objects: in steady state 8x the page allocator calls;
    # over this short run the initial fill of the live set dilutes the ratio.
    assert new["slab_allocs_per_kop"] > 3 * old["slab_allocs_per_kop"]
    assert new["page_allocs_per_kop_by_order"][0] == pytest.approx(new["slab_allocs_per_kop"])
    assert new["alloc_fastpath_frac"] < old["alloc_fastpath_frac"]
    assert new["ns_per_op"] > old["ns_per_op"]


@pytest.mark.slow
def test_simulate_text_output(tmp_path):
    f = tmp_path / "c.toml"
    f.write_text(tomli_w.dumps(_doc(topology={"cpus": 224, "nodes": 2})))
    r = _cli("simulate", str(f))
    assert r.returncode == 0, r.stderr
    assert "structure" in r.stdout and "order=0" in r.stdout and "ns_per_op" in r.stdout
    # The cost line names what the packaged table's fitted constants were fitted to (UML
    # timings of the real allocator), and never calls them published figures.
    cost_line = next(line for line in r.stdout.splitlines() if line.startswith("cost "))
    assert "cost_default.toml" in cost_line and "published" not in cost_line
    assert "fitted: alloc_fast_ns" in cost_line and "User Mode Linux" in cost_line

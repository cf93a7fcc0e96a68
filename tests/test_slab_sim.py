"""SLAB through ``slabtune simulate`` (issue 14 item 3): a config with a SLAB profile runs
model/slab_dynamics.py, its rows are priced by the same metrics as SLUB's, and the
numa_mem_id() switch (``memoryless_fallback``) reaches the model.

The counters are checked against slab_dynamics.simulate_batch run directly on the config
the spec implies, so the wiring (structure, tunables, switch, seed) is what is tested; the
rows against the same counters priced by metrics.compute through slub_view.
"""

from __future__ import annotations

import contextlib
import io
import json

import jax
import numpy as np
import pytest
import tomli_w

from slabtune import cli
from slabtune.model import profiles, slab
from slabtune.model import slab_dynamics as sd
from slabtune.model.topology import Topology
from slabtune.sweeps import simconfig, simulate

DOC = {
    "topology": {"cpus": 16, "nodes": 3, "node_cpus": [0, 8, 8], "memoryless_nodes": [1, 2]},
    "cache": {"name": "kmalloc-256"},
    "policy": {"profile": "slab-v2.6.33", "params": {"memoryless_fallback": False}},
    "workload": {"kind": "local", "live": 40},
    "run": {"steps": 400, "seed": 3},
}


def _doc(**over):
    return {**DOC, **over}


def _cli_json(tmp_path, doc) -> dict:
    p = tmp_path / "c.toml"
    p.write_text(tomli_w.dumps(doc))
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = cli.main(["simulate", str(p), "--json"])
    assert rc == 0, err.getvalue()
    return json.loads(out.getvalue())


def _direct(profile: str, fallback: bool, steps: int, seed: int):
    """The same run built by hand from the model's own entry points."""
    prof = profiles.SLAB_PROFILES[profile]
    topo = Topology.uniform(16, 3, node_cpus=(0, 8, 8), memoryless_nodes=(1, 2))
    st = sd.structure_for(256, topo, prof, facts=slab.known_facts("kmalloc-256", prof)
                          or slab.NO_FACTS)
    cfg = sd.config_from(st, prof, topo, {"kind": "local", "live": 40},
                         memoryless_fallback=fallback)
    c = sd.simulate_batch(jax.vmap(jax.random.key)(np.array([seed], np.uint32)),
                          sd.stack_configs([cfg]), steps)
    return st, cfg, {k: np.asarray(v)[0] for k, v in c._asdict().items()}


def _weighted_kop(cfg, c, name):
    w = np.asarray(cfg.rep_weight, np.float64)
    return 1000 * (w * c[name]).sum() / (w * c["ops"]).sum()


@pytest.mark.parametrize("profile", list(profiles.SLAB_PROFILES))
@pytest.mark.parametrize("fallback", [False, True])
def test_cli_rows_are_the_slab_models_counters(tmp_path, profile, fallback):
    doc = _doc(policy={"profile": profile, "params": {"memoryless_fallback": fallback}})
    row = _cli_json(tmp_path, doc)
    st, cfg, c = _direct(profile, fallback, 400, 3)
    assert row["allocator"] == "SLAB"
    assert (row["order"], row["objs_per_slab"], row["limit"], row["batchcount"],
            row["shared"]) == (st.order, st.objs_per_slab, st.limit, st.batchcount, st.shared)
    w = np.asarray(cfg.rep_weight, np.float64)
    hit = (w * c["alloc_fast"]).sum() / (w * c["allocs"]).sum()
    assert row["alloc_fastpath_frac"] == pytest.approx(hit, rel=1e-5)
    for metric, name in (("list_lock_per_kop", "list_lock"), ("slab_allocs_per_kop",
                                                              "slab_alloc"),
                         ("remote_frees_per_kop", "remote_free"),
                         ("barn_lock_per_kop", "alien_lock")):
        assert row[metric] == pytest.approx(_weighted_kop(cfg, c, name), rel=1e-5), metric
    assert row["config"]["knobs"] == {"memoryless_fallback": fallback}
    assert row["ns_per_op"] > 0 and row["memory_bytes"] > 0


def test_simulate_specs_counters_equal_simulate_batch_exactly():
    """Every counter and gauge of the sweep path equals the model's own batch run."""
    spec = simconfig.parse_doc(_doc())
    structs, cfgs, counters = simulate.simulate_specs([spec])
    _, _, want = _direct("slab-v2.6.33", False, 400, 3)
    got = sd.counters_numpy(counters[0])
    assert set(got) == set(want)
    for k in want:
        np.testing.assert_array_equal(got[k], want[k], err_msg=k)


def test_the_numa_mem_id_switch_is_the_memoryless_penalty():
    """All CPUs on memoryless nodes: without numa_mem_id() (v2.6.33 default) no array hit
    and every free is an alien free, so the modelled time per op is far above the fixed
    kernel's; with the fix the arrays hit as on a machine with memory everywhere."""
    cost, _ = simconfig.load_cost(None)
    specs = [simconfig.parse_doc(_doc(policy={"profile": "slab-v2.6.33",
                                              "params": {"memoryless_fallback": fb}}))
             for fb in (False, True)]
    assert specs[0].profile.memoryless_fallback is False
    assert specs[1].profile.memoryless_fallback is True
    old, fixed = simulate.run(specs, cost)
    assert old["alloc_fastpath_frac"] == 0.0 and fixed["alloc_fastpath_frac"] > 0.9
    assert old["ns_per_op"] > 5 * fixed["ns_per_op"]
    # the profile default is the kernel's: v2.6.33 has no fix, v3.1 has it
    assert not simconfig.parse_doc(_doc(policy={"profile": "slab-v2.6.33"})).profile \
        .memoryless_fallback
    assert simconfig.parse_doc(_doc(policy={"profile": "slab-v3.1"})).profile \
        .memoryless_fallback


def test_mixed_batches_keep_spec_order_and_slub_rows():
    """SLAB and SLUB specs in one call run in separate batches; each row is what that spec
    alone gives."""
    cost, _ = simconfig.load_cost(None)
    slub = simconfig.parse_doc(_doc(policy={"profile": "v6.1"}))
    slab_spec = simconfig.parse_doc(_doc())
    rows = simulate.run([slub, slab_spec, slub], cost)
    assert [r["allocator"] for r in rows] == ["SLUB", "SLAB", "SLUB"]
    alone = simulate.run([slub], cost)[0]
    assert rows[0]["ns_per_op"] == alone["ns_per_op"] == rows[2]["ns_per_op"]
    assert rows[1]["ns_per_op"] == simulate.run([slab_spec], cost)[0]["ns_per_op"]


def test_the_spec_round_trips_and_bad_slab_input_is_one_line():
    spec = simconfig.parse_doc(_doc(policy={"profile": "slab-v6.1", "params": {
        "slab_max_order": 1, "limit": 40, "batchcount": 20, "shared": 0}}))
    assert spec.boot_given == {"slab_max_order": 1}
    assert spec.knobs == {"limit": 40, "batchcount": 20, "shared": 0}
    assert simconfig.parse_doc(spec.to_doc()) == spec
    with pytest.raises(simconfig.ConfigError, match=r"^policy.params.limit: batchcount 60 "
                                                    r"is above limit 30"):
        simconfig.parse_doc(_doc(policy={"profile": "slab-v6.1", "params": {"limit": 30}}))
    with pytest.raises(simconfig.ConfigError, match="^run.ops_per_step: 4 with SLAB"):
        simconfig.parse_doc(_doc(run={"steps": 10, "ops_per_step": 4}))

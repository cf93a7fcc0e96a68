"""The dynamics run length b (``ops_per_step``) as a knob of ``slabtune simulate`` configs
([run] ops_per_step) and of dynamics sweep specs ([sweep] ops_per_step)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import tomli_w

from slabtune.sweeps import evaluators, grid, simconfig, simulate
from slabtune.sweeps import spec as sweep_spec

BASE = {
    "topology": {"cpus": 16, "nodes": 2},
    "cache": {"name": "kmalloc-512"},
    "policy": {"profile": "v6.1"},
    "workload": {"kind": "producer_consumer", "depth": 64},
    "run": {"steps": 200, "seed": 3},
}

SPEC = """
[sweep]
name = "b"
evaluator = "dynamics"
chunk_size = 4
steps = 150
{extra}
[topology]
cpus = [16]
[cache]
cache = ["kmalloc-256"]
[kernel]
profile = ["v6.1", "v7.0"]
[workload]
workload = ["local", "producer_consumer"]
"""


def _doc(**run):
    doc = json.loads(json.dumps(BASE))
    doc["run"].update(run)
    return doc


def test_run_table_ops_per_step_round_trips(tmp_path):
    f = tmp_path / "c.toml"
    f.write_text(tomli_w.dumps(_doc(ops_per_step=32)))
    spec = simconfig.load(f)
    assert spec.ops_per_step == 32
    assert spec.to_doc()["run"]["ops_per_step"] == 32
    assert spec.describe()["run"]["ops_per_step"] == 32
    again = tmp_path / "again.toml"
    again.write_text(tomli_w.dumps(spec.to_doc()))
    assert simconfig.load(again) == spec
    # left out, it is 1 and the written config does not mention it
    plain = simconfig.parse_doc(_doc())
    assert plain.ops_per_step == 1 and "ops_per_step" not in plain.to_doc()["run"]


@pytest.mark.parametrize("bad", [0, 1025, -1, 2.5, "16"])
def test_bad_run_ops_per_step_names_the_field(bad):
    with pytest.raises(simconfig.ConfigError, match=r"run\.ops_per_step"):
        simconfig.parse_doc(_doc(ops_per_step=bad))


def test_simulate_runs_b_ops_per_rep_per_step():
    """The same config at b = 1 and b = 16: every rep does at most b ops a step, and the
    senders of producer_consumer (depth 64) do far more than one."""
    specs = [simconfig.parse_doc(_doc(ops_per_step=b)) for b in (1, 16)]
    _, cfgs, counters = simulate.simulate_specs(specs)
    assert [int(c.ops_per_step) for c in cfgs] == [1, 16]
    one, many = (np.asarray(c.ops) for c in counters)
    assert one.max() <= 200 and many.max() <= 16 * 200
    assert many.sum() > 4 * one.sum()
    rows = simulate.run(specs, simconfig.load_cost(None)[0])
    assert rows[1]["config"]["run"]["ops_per_step"] == 16
    for row in rows:
        assert 0.0 <= row["alloc_fastpath_frac"] <= 1.0 and row["memory_bytes"] > 0


def test_sweep_spec_ops_per_step():
    plain = sweep_spec.parse(SPEC.format(extra=""))
    spec = sweep_spec.parse(SPEC.format(extra="ops_per_step = 64"))
    assert plain.ops_per_step == 1 and spec.ops_per_step == 64
    # a spec without the key keeps the hash it always had; with it, the hash differs
    assert "ops_per_step" not in plain.to_dict()
    assert spec.hash != plain.hash
    assert sweep_spec.from_dict(spec.to_dict()) == spec


@pytest.mark.parametrize("extra, field", [
    ("ops_per_step = 0", "sweep.ops_per_step"),
    ("ops_per_step = 5000", "sweep.ops_per_step"),
    ("ops_per_step = 1.5", "sweep.ops_per_step"),
])
def test_bad_sweep_ops_per_step_names_the_field(extra, field):
    with pytest.raises(sweep_spec.SpecError, match=field.replace(".", r"\.")):
        sweep_spec.parse(SPEC.format(extra=extra))


def test_structural_sweep_rejects_ops_per_step():
    text = SPEC.format(extra="ops_per_step = 4").replace('evaluator = "dynamics"',
                                                         'evaluator = "structural"')
    text = text.replace("steps = 150\n", "").split("[workload]")[0]
    with pytest.raises(sweep_spec.SpecError, match=r"sweep\.ops_per_step"):
        sweep_spec.parse(text)


@pytest.mark.slow
def test_dynamics_evaluator_uses_the_spec_run_length():
    """The same chunk at b = 1 and b = 64: the runs change the counters the metrics come
    from (here the fast-path fractions move, and stay fractions)."""
    out = {}
    for b in (1, 64):
        spec = sweep_spec.parse(SPEC.format(extra=f"ops_per_step = {b}"))
        ch = grid.chunk(spec, 0)
        out[b] = evaluators.EVALUATORS["dynamics"].evaluate(spec, ch)
    a1, a64 = out[1]["alloc_fastpath_frac"], out[64]["alloc_fastpath_frac"]
    assert np.all((a64 >= 0) & (a64 <= 1))
    assert not np.array_equal(a1, a64)


# ---- the static run bound: one-op batches compile the single pick (model/dynamics.py)


def _bound_configs():
    """Distinct configurations that exercise sheaves, per-CPU partial lists, memoryless
    nodes and remote frees (every one at b = 1)."""
    import jax  # noqa: F401  (the model imports it anyway)

    from slabtune.model import dynamics, policy, profiles
    from slabtune.model.topology import Topology

    out = []
    topo = Topology.uniform(64, 2, memoryless_nodes=(1,))
    for prof_name, size, wl in (("v6.1", 512, {"kind": "producer_consumer", "cross_node": 0.5}),
                                ("v7.0", 128, {"kind": "local", "live": 300, "burst": 50}),
                                ("v3.1", 1024, {"kind": "block_io", "completion_remote": True}),
                                ("v7.1", 64, {"kind": "request_response", "threads": 64})):
        prof = profiles.get_profile(prof_name)
        st = policy.structure(size, topo.possible, topo.present, topo.online,
                          policy.profile_arrays(prof), explicit_sheaf=32 if size <= 256 else 0)
        out.append(dynamics.config_from(st, prof, topo, wl))
    return out


def test_run_bound_is_one_only_for_one_op_batches():
    from slabtune.model import dynamics

    cfgs = _bound_configs()
    assert dynamics.run_bound(dynamics.stack_configs(cfgs)) == 1
    mixed = cfgs[:3] + [cfgs[3]._replace(ops_per_step=np.int32(64))]
    assert dynamics.run_bound(dynamics.stack_configs(mixed)) == dynamics.MAX_OPS_PER_STEP


def test_one_op_bound_gives_the_general_counters_bit_for_bit():
    """b = 1 compiled with the static bound 1 (single pick) and with the general bound
    (systematic sampling over slabs and node classes): the same counters, every field."""
    import jax

    from slabtune.model import dynamics

    batch = dynamics.stack_configs(_bound_configs())
    keys = jax.random.split(jax.random.key(5), 4)
    one = dynamics.counters_numpy(dynamics.simulate_batch(keys, batch, 600, max_run=1))
    gen = dynamics.counters_numpy(dynamics.simulate_batch(keys, batch, 600,
                                                          max_run=dynamics.MAX_OPS_PER_STEP))
    assert one["ops"].sum() > 4 * 600 and one["remote_free"].sum() > 0
    for k in one:
        np.testing.assert_array_equal(one[k], gen[k], err_msg=k)


@pytest.mark.slow
def test_mixed_batch_takes_the_general_path():
    """A batch of b = 1 and b = 64 configurations: each gives the counters it gives alone
    (its b = 1 members those of the one-op compile)."""
    import jax

    from slabtune.model import dynamics

    cfgs = _bound_configs()
    mixed = [cfgs[0], cfgs[1]._replace(ops_per_step=np.int32(64)), cfgs[2],
             cfgs[3]._replace(ops_per_step=np.int32(64))]
    keys = jax.random.split(jax.random.key(7), 4)
    got = dynamics.counters_numpy(dynamics.simulate_batch(keys, dynamics.stack_configs(mixed), 300))
    assert got["ops"][1].max() > 300                 # the b = 64 members did runs
    for i, cfg in enumerate(mixed):
        alone = dynamics.counters_numpy(dynamics.simulate(keys[i], cfg, 300))
        for k in alone:
            np.testing.assert_array_equal(got[k][i], alone[k], err_msg=f"{i} {k}")


def test_v618_opt_in_members_run_apart_from_one_op_members():
    """A b = 1 batch with a v6.18 opt-in cache (sheaves beside the CPU slab: a free can
    flush ``cap`` objects, so it needs the general run form) runs that member apart:
    every member gives the counters it gives alone."""
    import jax

    from slabtune.model import dynamics, policy, profiles
    from slabtune.model.topology import Topology

    topo = Topology.uniform(16, 1)
    prof = profiles.get_profile("v6.18")
    st = policy.structure(256, topo.possible, topo.present, topo.online,
                          policy.profile_arrays(prof), explicit_sheaf=8)
    opt_in = dynamics.config_from(st, prof, topo, {"kind": "producer_consumer", "depth": 40},
                                  barn_max_full=1)
    cfgs = _bound_configs()
    mixed = [cfgs[0], opt_in, cfgs[1]]
    batch = dynamics.stack_configs(mixed)
    assert list(dynamics._general(batch)) == [False, True, False]
    keys = jax.random.split(jax.random.key(11), 3)
    got = dynamics.counters_numpy(dynamics.simulate_batch(keys, batch, 300))
    assert got["sheaf_flush"][1].sum() > 0
    for i, cfg in enumerate(mixed):
        alone = dynamics.counters_numpy(dynamics.simulate(keys[i], cfg, 300))
        for k in alone:
            np.testing.assert_array_equal(got[k][i], alone[k], err_msg=f"{i} {k}")


def test_one_op_bound_refuses_longer_runs():
    import jax

    from slabtune.errors import SlabtuneError
    from slabtune.model import dynamics

    cfg = _bound_configs()[0]._replace(ops_per_step=np.int32(8))
    with pytest.raises(SlabtuneError, match="max_run"):
        dynamics.simulate(jax.random.key(0), cfg, 10, max_run=1)


def _opt_in_configs():
    """v6.18 opt-in caches (sheaves beside the CPU slab) on one and two memory nodes,
    with frees of every kind: local, cross-node producer/consumer, remote completions."""
    from slabtune.model import dynamics, policy, profiles
    from slabtune.model.topology import Topology

    prof = profiles.get_profile("v6.18")
    out = []
    for topo, wl in ((Topology.uniform(16, 1), {"kind": "producer_consumer", "depth": 40}),
                     (Topology.uniform(8, 2), {"kind": "producer_consumer",
                                               "cross_node": 0.5}),
                     (Topology.uniform(16, 4), {"kind": "block_io",
                                                "completion_remote": True}),
                     (Topology.uniform(64, 2, memoryless_nodes=(1,)),
                      {"kind": "local", "live": 300, "burst": 50})):
        st = policy.structure(256, topo.possible, topo.present, topo.online,
                              policy.profile_arrays(prof), explicit_sheaf=8)
        out.append(dynamics.config_from(st, prof, topo, wl, barn_max_full=1))
    return out


def test_run_form_is_the_cheapest_exact_one():
    """One-op batches without opt-in caches trace neither longer runs nor the opt-in
    terms; an opt-in cache at b = 1 keeps one-op picks with the general slab-free split;
    b > 1 takes the general form; a mixed batch runs as one group per form."""
    from slabtune.model import dynamics

    big = dynamics.MAX_OPS_PER_STEP
    plain, opt = _bound_configs(), _opt_in_configs()
    assert dynamics.run_form(dynamics.stack_configs(plain)) == (1, 1, False)
    assert dynamics.run_form(dynamics.stack_configs(opt)) == (1, big, True)
    assert dynamics.run_form(dynamics.stack_configs(
        opt + [plain[0]._replace(ops_per_step=np.int32(4))])) == (big, big, True)
    mixed = [opt[0], plain[0], plain[1]._replace(ops_per_step=np.int32(4)), opt[1]]
    groups = dynamics._form_groups(dynamics.stack_configs(mixed))
    assert [(tuple(f), list(i)) for f, i in groups] == [
        ((1, 1, False), [1]), ((1, big, True), [0, 3]), ((big, big, True), [2])]


def test_opt_in_form_gives_the_general_counters_bit_for_bit():
    """v6.18 opt-in caches at b = 1 in their own form (one-op picks, a flush's ``cap``
    objects split over one node class) and in the general form: the same counters, every
    field; and one-op configurations without the opt-in terms traced give what they give
    with them."""
    import jax

    from slabtune.errors import SlabtuneError
    from slabtune.model import dynamics

    big = dynamics.MAX_OPS_PER_STEP
    batch = dynamics.stack_configs(_opt_in_configs())
    keys = jax.random.split(jax.random.key(13), 4)
    own = dynamics.counters_numpy(dynamics.simulate_batch(keys, batch, 800))
    gen = dynamics.counters_numpy(dynamics.simulate_batch(keys, batch, 800, max_run=big))
    assert (own["sheaf_flush"].sum(1) > 0).sum() >= 3 and own["remote_free"].sum() > 0
    assert own["cpu_partial_drain"].sum() > 0
    for k in own:
        np.testing.assert_array_equal(own[k], gen[k], err_msg=k)
    # the opt-in form passed by a caller (the sweep evaluator inside its jit) is exact for
    # the plain one-op configurations beside them too
    both = _opt_in_configs() + _bound_configs()
    batch = dynamics.stack_configs(both)
    keys = jax.random.split(jax.random.key(19), len(both))
    form = dynamics.run_form(batch)
    assert form == (1, big, True)
    mixed = dynamics.counters_numpy(dynamics.simulate_batch(keys, batch, 500, max_run=form))
    gen = dynamics.counters_numpy(dynamics.simulate_batch(keys, batch, 500, max_run=big))
    for k in mixed:
        np.testing.assert_array_equal(mixed[k], gen[k], err_msg=k)
    with pytest.raises(SlabtuneError, match="narrower"):
        dynamics.simulate_batch(keys, batch, 10, max_run=dynamics.RunForm(1, 1, True))
    plain = dynamics.stack_configs(_bound_configs())
    keys = jax.random.split(jax.random.key(17), 4)
    lean = dynamics.counters_numpy(dynamics.simulate_batch(keys, plain, 400))
    full = dynamics.counters_numpy(dynamics._simulate_batch(keys, plain, 400,
                                                            dynamics.RunForm(1, 1, True)))
    for k in lean:
        np.testing.assert_array_equal(lean[k], full[k], err_msg=k)

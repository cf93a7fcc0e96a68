"""The C event-by-event engine (native/dynsim.c) equals the JAX dynamics model exactly.

Same keys, same configurations: every event counter and every float32 gauge equal, bit for
bit (test_reference_sim compares the Python reference's gauges by their integer sums).
The grid covers every SLUB profile, the sheaf and CPU-slab paths, memoryless nodes and
each workload kind, at one op per step and at run lengths the JAX step computes in closed
form; SLAB's engine gets the same on SLAB's profiles.
"""

from __future__ import annotations

import itertools

import jax
import numpy as np
import pytest

from slabtune.model import dynamics, policy, profiles, reference_sim
from slabtune.model.topology import Topology
from slabtune.sweeps import dynsim

PROFILES = tuple(profiles.PROFILES)
TOPOS = (Topology.uniform(16, 1), Topology.uniform(64, 2, memoryless_nodes=(1,)),
         Topology.uniform(24, 3, memoryless_nodes=(2,)), Topology.uniform(16, 2),
         Topology.uniform(16, 4))
WORKLOADS = tuple(dict(w, drain="eager") for w in (
    {"kind": "local", "live": 40}, {"kind": "local", "live": 70, "burst": 20},
    {"kind": "producer_consumer", "depth": 50, "cross_node": 0.3},
    {"kind": "request_response", "threads": 6, "irq_free": 0.8},
    {"kind": "block_io", "depth": 20, "completion_remote": True}))
#: The same kinds held at their declared occupancy (workloads.hold_levels).
HELD = tuple(dict(w, drain="hold") for w in WORKLOADS)


def _grid(b: int) -> list:
    out = []
    for prof_name, size, topo, wl in itertools.product(PROFILES, (64, 1024), TOPOS, WORKLOADS):
        prof = profiles.get_profile(prof_name)
        st = policy.structure(size, topo.possible, topo.present, topo.online,
                              policy.profile_arrays(prof),
                              explicit_sheaf=32 if size <= 256 else 0)
        out.append(dynamics.config_from(st, prof, topo, wl, ops_per_step=b))
    return out


def _assert_equal(a, c, steps):
    """Every field equal, the float32 gauges bit for bit (the C side averages its integer
    sums as XLA:CPU does); ``steps`` names the run in the message."""
    for f in dynamics.Counters._fields:
        x, y = np.asarray(getattr(a, f)), np.asarray(getattr(c, f))
        assert x.shape == y.shape and x.dtype == y.dtype, f
        np.testing.assert_array_equal(x, y, err_msg=f"{f} ({steps} steps)")


@pytest.mark.parametrize("b, steps", [(1, 1500), (7, 400), (64, 150)])
def test_equals_jax_model(b, steps):
    cfgs = _grid(b)
    batch = dynamics.stack_configs(cfgs)
    keys = jax.random.split(jax.random.key(b), len(cfgs))
    want = dynamics.simulate_batch(keys, batch, steps)
    got = dynsim.simulate_batch(keys, batch, steps)
    _assert_equal(want, got, steps)
    ops = np.asarray(got.ops)
    # the grid and run lengths reach every path: each event counter is nonzero somewhere
    assert ops.sum() > len(cfgs) * steps
    for f in dynamics.COUNTER_FIELDS:
        assert np.asarray(getattr(got, f)).sum() > 0, f


@pytest.mark.parametrize("b, steps", [(1, 600), (7, 200)])
def test_held_workloads_equal_jax_model_and_reference(b, steps):
    """drain = "hold": a freer frees only above its hold, a run at most the excess; the C
    engine equals the JAX model bit for bit and the reference on its draws."""
    cfgs = []
    for prof_name, topo, wl in itertools.product(("v3.1", "v6.1", "v6.18", "v7.0", "v7.1"),
                                                 TOPOS[1:3], HELD):
        prof = profiles.get_profile(prof_name)
        st = policy.structure(256, topo.possible, topo.present, topo.online,
                              policy.profile_arrays(prof),
                              explicit_sheaf=32 if prof_name == "v6.18" else 0)
        cfgs.append(dynamics.config_from(st, prof, topo, wl, ops_per_step=b))
    assert all(np.asarray(c.workload.hold).any() for c in cfgs)
    batch = dynamics.stack_configs(cfgs)
    keys = jax.random.split(jax.random.key(40 + b), len(cfgs))
    got = dynsim.simulate_batch(keys, batch, steps)
    _assert_equal(dynamics.simulate_batch(keys, batch, steps), got, steps)
    for i in range(0, len(cfgs), 7):
        want = reference_sim.run(np.asarray(dynamics.draws(keys[i], steps)), cfgs[i])
        for f in dynamics.COUNTER_FIELDS:
            np.testing.assert_array_equal(np.asarray(getattr(got, f))[i], want[f], err_msg=f)
    # held: every freer keeps at least its hold pending once the senders have filled
    frees, allocs = np.asarray(got.frees).sum(), np.asarray(got.allocs).sum()
    assert 0 < frees < allocs


def test_equals_reference_on_its_draws():
    cfgs = _grid(1)[::17]
    steps = 120
    keys = jax.random.split(jax.random.key(11), len(cfgs))
    got = dynsim.simulate_batch(keys, dynamics.stack_configs(cfgs), steps)
    for i, cfg in enumerate(cfgs):
        want = reference_sim.run(np.asarray(dynamics.draws(keys[i], steps)), cfg)
        for f in dynamics.COUNTER_FIELDS:
            np.testing.assert_array_equal(np.asarray(getattr(got, f))[i], want[f], err_msg=f)
        np.testing.assert_array_equal(got.list_lock_node[i], want["list_lock_node"])


def test_threads_do_not_change_results():
    cfgs = _grid(1)[:40]
    batch = dynamics.stack_configs(cfgs)
    keys = jax.random.split(jax.random.key(5), len(cfgs))
    one = dynsim.simulate_batch(keys, batch, 80, threads=1)
    three = dynsim.simulate_batch(keys, batch, 80, threads=3)
    _assert_equal(one, three, 80)


def test_gauge_sums_carry_past_20_bits():
    """A long run's gauge sums pass 2**20 (the model's int32 split): the float32 averages
    still match the model's."""
    cfg = _grid(1)[0]
    steps = 8000
    keys = jax.random.split(jax.random.key(2), 1)
    batch = dynamics.stack_configs([cfg])
    want = dynamics.simulate_batch(keys, batch, steps)
    got = dynsim.simulate_batch(keys, batch, steps)
    assert float(np.asarray(got.objects_inuse).sum()) * steps > 1 << dynamics.GAUGE_SHIFT
    _assert_equal(want, got, steps)


def test_unbatched_config_is_refused():
    cfg = _grid(1)[0]
    keys = jax.random.split(jax.random.key(0), 1)
    with pytest.raises(dynsim.DynsimError, match="objs_per_slab"):
        dynsim.simulate_batch(keys, cfg, 10)


def test_build_is_cached(tmp_path, monkeypatch):
    monkeypatch.setenv("SLABTUNE_CACHE", str(tmp_path))
    lib = dynsim.build()
    stamp = lib.with_suffix(".stamp").read_text()
    mtime = lib.stat().st_mtime_ns
    assert dynsim.build() == lib and lib.stat().st_mtime_ns == mtime
    assert len(stamp) == 64


# --------------------------------------------------------------------------- engines


def test_engine_choice(monkeypatch):
    monkeypatch.delenv(dynsim.ENGINE_ENV, raising=False)
    assert dynsim.engine() == ("native" if jax.default_backend() == "cpu" else "jax")
    assert dynsim.engine("jax") == "jax"
    monkeypatch.setenv(dynsim.ENGINE_ENV, "native")
    assert dynsim.engine() == "native"
    monkeypatch.setenv(dynsim.ENGINE_ENV, "xla")
    with pytest.raises(dynsim.DynsimError, match=dynsim.ENGINE_ENV):
        dynsim.engine()


def test_sweep_evaluation_same_metrics_either_engine():
    """The sweep evaluator's metrics are the same from either engine (the counters are
    equal; the metrics agree to float32 rounding, jitted apart from the simulation)."""
    from slabtune.sweeps import evaluators

    cfgs = _grid(1)[::9]
    batch = dynamics.stack_configs(cfgs)
    index = np.arange(len(cfgs), dtype=np.uint32)
    pcp = np.full(len(cfgs), 3, np.int32)
    osz = np.full(len(cfgs), 256.0, np.float32)
    cost = evaluators._default_cost()
    bound = dynamics.run_form(batch)
    a = evaluators._dynamics_fn(120, bound, "jax")(np.uint32(7), index, batch, cost, pcp, osz)
    b = evaluators._dynamics_fn(120, bound, "native")(np.uint32(7), index, batch, cost, pcp,
                                                      osz)
    for f in a._fields:
        np.testing.assert_allclose(np.asarray(getattr(a, f)), np.asarray(getattr(b, f)),
                                   rtol=1e-5, atol=1e-6, err_msg=f)


# --------------------------------------------------------------------------- SLAB


def _slab_grid() -> list:
    """SLAB configurations over every SLAB profile, topologies with memoryless nodes,
    each workload kind, two sizes, reap intervals (none, short, long), the numa_mem_id()
    switch both ways and small tunables (so arrays refill, flush and drain often)."""
    from slabtune.model import slab_dynamics as sd

    topos = (Topology.uniform(1, 1), Topology.uniform(16, 2),
             Topology.uniform(64, 2, memoryless_nodes=(1,)),
             Topology.uniform(16, 3, node_cpus=(0, 8, 8), memoryless_nodes=(1, 2)),
             Topology.uniform(32, 4, memoryless_nodes=(1, 3)), Topology.uniform(16, 4))
    out = []
    combos = itertools.product(profiles.SLAB_PROFILES, topos, WORKLOADS, (64, 1024))
    for i, (name, topo, wl, size) in enumerate(combos):
        prof = profiles.SLAB_PROFILES[name]
        if wl["kind"] in ("producer_consumer", "block_io") and topo.present < 2:
            continue
        kw = dict(reap_interval=(0, 7, 40)[i % 3])
        if i % 4 == 1:
            kw.update(limit=12, batchcount=4, shared=2)
        if i % 5 == 2:
            kw.update(memoryless_fallback=bool(i % 2))
        out.append(sd.config_from(sd.structure_for(size, topo, prof), prof, topo, wl, **kw))
    return out


def test_slab_engine_equals_slab_model():
    from slabtune.model import slab_dynamics as sd

    cfgs = _slab_grid()
    batch = sd.stack_configs(cfgs)
    keys = jax.random.split(jax.random.key(21), len(cfgs))
    steps = 400
    want = sd.simulate_batch(keys, batch, steps)
    got = dynsim.simulate_slab_batch(keys, batch, steps)
    for f in want._fields:
        x, y = np.asarray(getattr(want, f)), np.asarray(getattr(got, f))
        assert x.shape == y.shape and x.dtype == y.dtype, f
        np.testing.assert_array_equal(x, y, err_msg=f)
    for f in sd.COUNTER_FIELDS:
        assert np.asarray(getattr(got, f)).sum() > 0, f
    # seeds work as keys do
    seeds = np.asarray(jax.vmap(sd.seed_of)(keys), np.uint32)
    again = dynsim.simulate_slab_batch(seeds, batch, steps)
    np.testing.assert_array_equal(again.ops, got.ops)


def test_slab_sweep_evaluation_same_metrics_either_engine():
    from slabtune.model import slab_dynamics as sd
    from slabtune.sweeps import evaluators

    cfgs = _slab_grid()[::11]
    batch = sd.stack_configs(cfgs)
    index = np.arange(len(cfgs), dtype=np.uint32)
    pcp = np.full(len(cfgs), 3, np.int32)
    osz = np.full(len(cfgs), 256.0, np.float32)
    cost = evaluators._default_cost()
    a = evaluators._slab_dynamics_fn(200, "jax")(np.uint32(9), index, batch, cost, pcp, osz)
    b = evaluators._slab_dynamics_fn(200, "native")(np.uint32(9), index, batch, cost, pcp, osz)
    for f in a._fields:
        np.testing.assert_allclose(np.asarray(getattr(a, f)), np.asarray(getattr(b, f)),
                                   rtol=1e-5, atol=1e-6, err_msg=f)

"""Workloads keep the occupancy they declare (issue 32, item 1), in every engine.

Under ``drain = "hold"`` (the default) ``live`` (local, request_response) and ``depth``
(producer_consumer, block_io) are the objects each allocating CPU keeps outstanding, not
caps: model/workloads.py ``hold_levels`` caps a sender at ``L + h`` and lets each freer free
only above its share of the senders' ``L - h``.  After a warm-up (every sender fills its
live set: about ``L`` ops, twice that here) the mean of the
allocating reps' outstanding objects over a window of ``L`` ops is measured from the
engines' own time-summed gauge (``objects_inuse``: the window's sum is the difference of
two runs of the same draws) or, in the Python references, from ``out`` after every step,
and must lie within 5% of the declared value.  ``drain = "eager"`` keeps the old meaning:
a producer/consumer of depth 1024 then keeps a handful in flight.
"""

from __future__ import annotations

import contextlib
import io

import jax
import numpy as np
import pytest
import tomli_w

from slabtune import cli
from slabtune.model import dynamics, policy, profiles, reference_sim, slab_reference, workloads
from slabtune.model import slab_dynamics as sd
from slabtune.model.topology import Topology
from slabtune.sweeps import dynsim

ONE_NODE = Topology.uniform(16, 1)
TWO_NODES = Topology.uniform(16, 2)
TOL = 0.05
SLAB_PROFILE = "slab-v6.1"

#: kind -> (topology, workload table without its occupancy, the occupancy's parameter).
#: request_response with 7 threads on 16 CPUs: one thread per thread rep, so the
#: interrupt CPU's declared live set is ``live`` too (workloads.request_response).
KINDS = {
    "local": (ONE_NODE, {"kind": "local"}, "live"),
    "local_burst": (ONE_NODE, {"kind": "local"}, "live"),
    "pc_same_node": (ONE_NODE, {"kind": "producer_consumer"}, "depth"),
    "pc_cross_node": (TWO_NODES, {"kind": "producer_consumer", "cross_node": 0.5}, "depth"),
    "request_response": (ONE_NODE, {"kind": "request_response", "threads": 7}, "live"),
    "block_io": (ONE_NODE, {"kind": "block_io"}, "depth"),
}


def _workload(kind: str, declared: int, drain: str = "hold") -> tuple[Topology, dict]:
    topo, wl, param = KINDS[kind]
    wl = dict(wl, **{param: declared}, drain=drain)
    if kind == "local_burst":
        wl["burst"] = declared // 4
    return topo, wl


def _slub_cfg(kind: str, declared: int, drain: str = "hold", b: int = 1):
    topo, wl = _workload(kind, declared, drain)
    prof = profiles.get_profile("v6.1")
    st = policy.structure(256, topo.possible, topo.present, topo.online,
                          policy.profile_arrays(prof))
    return dynamics.config_from(st, prof, topo, wl, ops_per_step=b)


def _slab_cfg(kind: str, declared: int):
    topo, wl = _workload(kind, declared)
    prof = profiles.SLAB_PROFILES[SLAB_PROFILE]
    return sd.config_from(sd.structure_for(256, topo, prof), prof, topo, wl)


def _senders(cfg) -> np.ndarray:
    """The reps that allocate (active, alloc_p > 0)."""
    wl = cfg.workload
    return np.flatnonzero((np.asarray(wl.active) > 0) & (np.asarray(wl.alloc_p) > 0))


def _run_length(declared: int) -> int:
    """Run length of the JAX and C SLUB checks: runs of ``L // 32`` ops (8 at 256, 32 at
    1024) fill a live set in 32 steps whatever ``L``, so every declared value runs the
    same step counts and the JAX model compiles once (the references and SLAB run one op
    per step)."""
    return declared // 32


def _steps(declared: int, b: int = 1) -> tuple[int, int]:
    """(warm-up, window) in steps at runs of ``b`` ops: 2L and L ops per rep."""
    return 2 * declared // b, declared // b


def _window(g1, g2, warm, window):
    """Mean per rep over the window from two runs' time-averaged gauges."""
    return (np.asarray(g2, np.float64) * (warm + window)
            - np.asarray(g1, np.float64) * warm) / window


def occupancy_jax(cfgs, declared: int) -> np.ndarray:
    warm, window = _steps(declared, int(cfgs[0].ops_per_step))
    batch = dynamics.stack_configs(cfgs)
    keys = jax.random.split(jax.random.key(declared), len(cfgs))
    g1 = dynamics.simulate_batch(keys, batch, warm).objects_inuse
    g2 = dynamics.simulate_batch(keys, batch, warm + window).objects_inuse
    return _window(g1, g2, warm, window)


def occupancy_c(cfgs, declared: int) -> np.ndarray:
    warm, window = _steps(declared, int(cfgs[0].ops_per_step))
    batch = dynamics.stack_configs(cfgs)
    keys = jax.random.split(jax.random.key(declared), len(cfgs))
    g1 = dynsim.simulate_batch(keys, batch, warm).objects_inuse
    g2 = dynsim.simulate_batch(keys, batch, warm + window).objects_inuse
    return _window(g1, g2, warm, window)


def occupancy_reference(cfg, declared: int) -> np.ndarray:
    warm, window = _steps(declared)
    w = np.asarray(dynamics.draws(jax.random.key(declared), warm + window))
    sim = reference_sim.RefSim(cfg)
    tot = np.zeros(workloads.R)
    for t in range(warm + window):
        sim.step(w[t])
        if t >= warm:
            tot += sim.out
    return tot / window


def occupancy_slab_jax(cfgs, declared: int) -> np.ndarray:
    warm, window = _steps(declared)
    batch = sd.stack_configs(cfgs)
    keys = jax.random.split(jax.random.key(declared), len(cfgs))
    g1 = sd.simulate_batch(keys, batch, warm).objects_inuse
    g2 = sd.simulate_batch(keys, batch, warm + window).objects_inuse
    return _window(g1, g2, warm, window)


def occupancy_slab_reference(cfg, declared: int) -> np.ndarray:
    warm, window = _steps(declared)
    w = np.asarray(sd.draws(jax.random.key(declared), warm + window))
    sim = slab_reference.SlabRefSim(cfg)
    tot = np.zeros(workloads.R)
    for t in range(warm + window):
        sim.step(t, w[t])
        if t >= warm:
            tot += sim.out
    return tot / window


def occupancy_slab_c(cfgs, declared: int) -> np.ndarray:
    warm, window = _steps(declared)
    batch = sd.stack_configs(cfgs)
    keys = jax.random.split(jax.random.key(declared), len(cfgs))
    g1 = dynsim.simulate_slab_batch(keys, batch, warm).objects_inuse
    g2 = dynsim.simulate_slab_batch(keys, batch, warm + window).objects_inuse
    return _window(g1, g2, warm, window)


def _assert_holds(cfg, mean, declared, what):
    """The allocating reps' mean occupancy is within TOL of the declared value.  The rule
    bounds their sum (the freers hold their shares of every sender's L - h, the senders
    stop at L + h); which sender's objects a free takes is drawn by the objects pending,
    so one sender's own count wanders about that mean (up to ~6% here)."""
    reps = _senders(cfg)
    assert len(reps) > 0
    got = np.asarray(mean)[reps]
    assert abs(got.mean() - declared) <= TOL * declared, (what, declared, got.round(1))


# --------------------------------------------------------------------------- the rule


def test_hold_levels_follow_the_declared_occupancy():
    # local, random interleaving: a band of L // 32 either side, the rep its own freer
    wl, _ = workloads.local(ONE_NODE, live=256)
    assert set(wl.live_target[wl.active > 0]) == {256 + 8}
    assert set(wl.hold[wl.active > 0]) == {256 - 8}
    # local bursts of 64 cycle the live set between 256 - 32 and 256 + 32
    wl, _ = workloads.local(ONE_NODE, live=256, burst=64)
    assert set(wl.live_target[wl.active > 0]) == {288}
    assert set(wl.hold[wl.active > 0]) == {224}
    # producer/consumer on one node: four senders spread their messages over four
    # receivers alike, so each receiver holds one sender's L - h
    wl, _ = workloads.producer_consumer(ONE_NODE, depth=1024)
    assert list(wl.live_target) == [1024 + 32] * 4 + [0] * 4
    assert list(wl.hold) == [0] * 4 + [1024 - 32] * 4
    # block_io: the completion CPU holds every submitter's L - h
    wl, _ = workloads.block_io(ONE_NODE, depth=256)
    subs = int(((wl.active > 0) & (wl.alloc_p > 0)).sum())
    assert wl.hold[0] == subs * (256 - 8)
    # eager is the old workload: the declared value a cap, nothing held
    wl, _ = workloads.producer_consumer(ONE_NODE, depth=1024, drain="eager")
    assert list(wl.live_target) == [1024] * 4 + [0] * 4 and not wl.hold.any()


def test_request_response_holds_are_each_freers_share():
    """Thread rep r frees (1 - irq_free) of its own objects and 1/(n-1) of the interrupt
    CPU's (irq_self_free 0); the interrupt CPU frees irq_free of every thread's."""
    wl, _ = workloads.request_response(ONE_NODE, threads=7, live=256, irq_free=0.75)
    floor = 256 - 8
    assert wl.hold[0] == round(0.75 * floor * 7)
    assert set(wl.hold[1:8]) == {round(0.25 * floor + floor / 7)}


def test_a_burst_above_twice_live_is_refused_when_holding():
    with pytest.raises(workloads.WorkloadError, match="burst"):
        workloads.local(ONE_NODE, live=64, burst=129)
    workloads.local(ONE_NODE, live=64, burst=128)
    workloads.local(ONE_NODE, live=64, burst=129, drain="eager")
    with pytest.raises(workloads.WorkloadError, match="drain"):
        workloads.block_io(ONE_NODE, drain="lazy")


# --------------------------------------------------------------------------- engines


@pytest.mark.parametrize("declared", [256, 1024])
def test_c_engine_keeps_the_declared_occupancy(declared):
    cfgs = [_slub_cfg(k, declared, b=_run_length(declared)) for k in KINDS]
    for cfg, kind, a in zip(cfgs, KINDS, occupancy_c(cfgs, declared)):
        _assert_holds(cfg, a, declared, kind)


@pytest.mark.slow
@pytest.mark.parametrize("declared", [256, 1024])
def test_jax_model_keeps_the_declared_occupancy(declared):
    """The JAX model (one compile for both sizes: the same step counts) equals the C
    engine's occupancy and keeps the declared value."""
    cfgs = [_slub_cfg(k, declared, b=_run_length(declared)) for k in KINDS]
    got = occupancy_jax(cfgs, declared)
    np.testing.assert_allclose(got, occupancy_c(cfgs, declared), rtol=1e-6)
    for cfg, kind, a in zip(cfgs, KINDS, got):
        _assert_holds(cfg, a, declared, kind)


def test_eager_drain_keeps_only_a_few_in_flight():
    """The old meaning, kept by drain = "eager": receivers free whatever is pending, so a
    sender of depth 1024 keeps a few objects in flight, not 1024."""
    cfg = _slub_cfg("pc_same_node", 1024, drain="eager", b=_run_length(1024))
    got = occupancy_c([cfg], 1024)[0][_senders(cfg)]
    assert np.all(got < 0.05 * 1024), got


@pytest.mark.parametrize("kind", list(KINDS))
def test_reference_keeps_the_declared_occupancy(kind):
    cfg = _slub_cfg(kind, 256)
    _assert_holds(cfg, occupancy_reference(cfg, 256), 256, kind)


@pytest.mark.slow
@pytest.mark.parametrize("kind", list(KINDS))
def test_reference_keeps_a_declared_occupancy_of_1024(kind):
    cfg = _slub_cfg(kind, 1024)
    _assert_holds(cfg, occupancy_reference(cfg, 1024), 1024, kind)


SLAB_KINDS = ["local", "local_burst", "pc_same_node", "pc_cross_node"]


@pytest.mark.parametrize("declared", [256, 1024])
def test_slab_engines_keep_the_declared_occupancy(declared):
    """slabdyn.c at both sizes, SLAB's Python reference at 256 (one op per step)."""
    cfgs = [_slab_cfg(k, declared) for k in SLAB_KINDS]
    for cfg, kind, a in zip(cfgs, SLAB_KINDS, occupancy_slab_c(cfgs, declared)):
        _assert_holds(cfg, a, declared, kind)
    if declared == 256:
        for cfg, kind in zip(cfgs, SLAB_KINDS):
            _assert_holds(cfg, occupancy_slab_reference(cfg, declared), declared, kind)


@pytest.mark.slow
@pytest.mark.parametrize("declared", [256, 1024])
def test_slab_jax_model_keeps_the_declared_occupancy(declared):
    cfgs = [_slab_cfg(k, declared) for k in SLAB_KINDS]
    got = occupancy_slab_jax(cfgs, declared)
    np.testing.assert_allclose(got, occupancy_slab_c(cfgs, declared), rtol=1e-6)
    for cfg, kind, a in zip(cfgs, SLAB_KINDS, got):
        _assert_holds(cfg, a, declared, kind)


# --------------------------------------------------------------------------- bad input


def test_bogus_drain_is_a_one_line_error(tmp_path):
    doc = {"topology": {"cpus": 4}, "cache": {"name": "kmalloc-256"},
           "policy": {"profile": "v6.1"},
           "workload": {"kind": "producer_consumer", "depth": 64, "drain": "bogus"},
           "run": {"steps": 10}}
    path = tmp_path / "sim.toml"
    path.write_text(tomli_w.dumps(doc))
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = cli.main(["simulate", str(path)])
    lines = [ln for ln in err.getvalue().splitlines() if ln.strip()]
    assert rc == 2 and len(lines) == 1, err.getvalue()
    assert lines[0].startswith("slabtune: error: ") and "workload.drain" in lines[0]
    assert "bogus" in lines[0] and "Traceback" not in err.getvalue()

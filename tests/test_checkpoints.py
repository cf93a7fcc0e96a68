"""Run lengths as data (model/runlen.py, issue 35 item 2) and runs that stop at several
checkpoints in one engine call (issue 32 item 7): the counters at each checkpoint are those
of a run of that length, bit for bit, in both engines; the counted window of one call is
the three runs' window; a new run length compiles nothing."""

from __future__ import annotations

import functools

import jax
import numpy as np
import pytest

from slabtune.model import dynamics, policy, profiles, slab_dynamics
from slabtune.model.topology import Topology
from slabtune.sweeps import dynsim
from slabtune.sweeps import window as sw

WORKLOADS = ({"kind": "local", "live": 40, "burst": 8},
             {"kind": "producer_consumer", "depth": 30, "cross_node": 0.5})


@functools.lru_cache(maxsize=1)
def _slub():
    top = Topology.uniform(4, 2)
    out = []
    for name in ("v6.1", "v6.18"):
        prof = profiles.get_profile(name)
        st = policy.structure(256, top.possible, top.present, top.online,
                              policy.profile_arrays(prof))
        out += [dynamics.config_from(st, prof, top, wl) for wl in WORKLOADS]
    return dynamics.stack_configs(out), jax.random.split(jax.random.key(5), len(out))


@functools.lru_cache(maxsize=1)
def _slab():
    top = Topology.uniform(4, 2)
    prof = profiles.SLAB_PROFILES["slab-v6.1"]
    st = slab_dynamics.structure_for(256, top, prof)
    out = [slab_dynamics.config_from(st, prof, top, wl) for wl in WORKLOADS]
    return slab_dynamics.stack_configs(out), jax.random.split(jax.random.key(6), len(out))


def _equal(a, b, what):
    for f in type(a)._fields:
        x, y = np.asarray(getattr(a, f)), np.asarray(getattr(b, f))
        assert x.dtype == y.dtype and np.array_equal(x, y), f"{what}: {f}"


@pytest.mark.parametrize("engine", ["native", "jax"])
def test_slub_checkpoints_are_the_runs_of_those_lengths(engine):
    cfgs, keys = _slub()
    marks = (0, 1, 37, 37, 90)
    got = dynsim.run_batch_at(keys, cfgs, marks, engine)
    assert len(got) == len(marks)
    for n, c in zip(marks, got):
        _equal(c, dynsim.run_batch(keys, cfgs, n, engine), f"{engine} at {n}")
    assert np.asarray(got[-1].alloc_fast).sum() > 0


@pytest.mark.parametrize("engine", ["native", "jax"])
def test_slab_checkpoints_are_the_runs_of_those_lengths(engine):
    cfgs, keys = _slab()
    marks = (0, 45, 120)
    got = dynsim.run_slab_batch_at(keys, cfgs, marks, engine)
    for n, c in zip(marks, got):
        _equal(c, dynsim.run_slab_batch(keys, cfgs, n, engine), f"{engine} at {n}")


@pytest.mark.parametrize("engine", ["native", "jax"])
def test_checkpoints_per_configuration(engine):
    """(B, C) rows: each configuration stops at its own checkpoints."""
    cfgs, keys = _slub()
    rows = np.array([[10, 30, 50], [0, 20, 70], [10, 30, 50], [5, 5, 64]])
    got = dynsim.run_batch_at(keys, cfgs, rows, engine)
    for b, row in enumerate(rows):
        one = jax.tree_util.tree_map(lambda x, b=b: np.asarray(x)[b:b + 1], cfgs)
        for k, n in enumerate(row):
            want = dynsim.run_batch(keys[b:b + 1], one, int(n), engine)
            row_k = type(want)(**{f: np.asarray(getattr(got[k], f))[b:b + 1]
                                  for f in want._fields})
            _equal(row_k, want, f"{engine} config {b} at {n}")


def test_one_call_window_is_the_three_runs_window():
    """sweeps/window.py run_window: the counters of one call at warm-up, middle and end give
    the window and halves the three separate runs gave, per configuration's own schedule."""
    cfgs, keys = _slub()
    warm, steps = np.array([16, 0, 40, 16]), np.array([40, 30, 20, 41])
    got = sw.run_window(keys, cfgs, warm, steps)
    for b in range(len(warm)):
        one = jax.tree_util.tree_map(lambda x, b=b: np.asarray(x)[b:b + 1], cfgs)
        w, n = int(warm[b]), int(steps[b])
        early, mid, late = (dynsim.run_batch(keys[b:b + 1], one, m) for m in
                            (w, w + n // 2, w + n))
        want = sw.Windowed(sw.window_counters(early, late, w, w + n),
                           sw.window_counters(early, mid, w, w + n // 2),
                           sw.window_counters(mid, late, w + n // 2, w + n))
        for g, x in zip(got, want):
            _equal(type(x)(**{f: np.asarray(getattr(g, f))[b:b + 1] for f in x._fields}), x,
                   f"config {b}")


def test_bad_checkpoints_are_one_line_errors():
    cfgs, keys = _slub()
    for bad in ((30, 10), (-1, 5), ()):
        with pytest.raises(dynsim.DynsimError, match=r"^steps: .* not non-decreasing"):
            dynsim.run_batch_at(keys, cfgs, bad, "native")


def test_a_new_run_length_compiles_nothing():
    """The jitted entry points take the run length as a traced value: after one run, runs
    of other lengths reuse its compiled program (jax.jit's cache holds one entry more per
    compiled variant), and pre-drawn words of lengths in one bucket share one too."""
    cfgs, keys = _slub()
    one = jax.tree_util.tree_map(lambda x: np.asarray(x)[:1], cfgs)
    dynamics.simulate_batch(keys[:1], one, 11)
    dynamics.simulate(keys[0], jax.tree_util.tree_map(lambda x: x[0], one), 11)
    batch = dynamics._simulate_batch_at._cache_size()
    single = dynamics._simulate._cache_size()
    for n in (12, 29, 64, 3):
        dynamics.simulate_batch(keys[:1], one, n)
        dynamics.simulate(keys[0], jax.tree_util.tree_map(lambda x: x[0], one), n)
    assert dynamics._simulate_batch_at._cache_size() == batch
    assert dynamics._simulate._cache_size() == single
    scfgs, skeys = _slab()
    slab_dynamics.simulate_batch(skeys, scfgs, 5)
    sb = slab_dynamics._simulate_batch_at._cache_size()
    for n in (6, 50, 1):
        slab_dynamics.simulate_batch(skeys, scfgs, n)
    assert slab_dynamics._simulate_batch_at._cache_size() == sb
    cfg = jax.tree_util.tree_map(lambda x: x[0], one)
    w = dynamics.draws(keys[0], 64)
    dynamics.simulate_draws(w[:40], cfg)
    drawn = dynamics._simulate_draws._cache_size()
    for n in (1, 33, 64):
        dynamics.simulate_draws(w[:n], cfg)
    assert dynamics._simulate_draws._cache_size() == drawn

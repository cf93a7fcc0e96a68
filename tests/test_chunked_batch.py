"""The chunked batch of ``dynamics._simulate_batch`` (issue 15 item 5) gives the counters of
one plain scan over the whole batch, bit for bit."""

from __future__ import annotations

import itertools
import os

import numpy as np

WORKLOADS = ({"kind": "local", "live": 64}, {"kind": "local", "live": 300, "burst": 50},
             {"kind": "producer_consumer", "cross_node": 0.3},
             {"kind": "request_response", "threads": 64},
             {"kind": "block_io", "completion_remote": True})


def _configs():
    """Every era's paths (CPU slab, per-CPU partial lists, sheaves with and without a
    barn, memoryless CPUs, remote frees) on a 64-CPU two-node machine, node 1 memoryless."""
    from slabtune.model import dynamics, policy, profiles
    from slabtune.model.topology import Topology

    topo = Topology.uniform(64, 2, memoryless_nodes=(1,))
    out = []
    for name, size, wl in itertools.product(("v3.1", "v6.1", "v6.18", "v7.0", "v7.1"),
                                            (64, 1024), WORKLOADS):
        prof = profiles.get_profile(name)
        st = policy.structure(size, topo.possible, topo.present, topo.online,
                              policy.profile_arrays(prof), explicit_sheaf=32 if size <= 256 else 0)
        out.append(dynamics.config_from(st, prof, topo, wl))
    return out


def test_chunks_are_equal_and_cover_the_batch():
    from slabtune.model import dynamics

    assert dynamics._chunks(1000, 1024, False) == (1, 1000)
    assert dynamics._chunks(10_000, 1024, False) == (10, 1000)
    assert dynamics._chunks(1025, 1024, False) == (2, 513)
    # on the CPU a size is a whole number of vectors and never a multiple of 256
    assert dynamics._chunks(1000, 1024) == (1, 1008)
    assert dynamics._chunks(1024, 1024) == (1, 1040)
    assert dynamics._chunks(1025, 1024) == (2, 528)
    assert dynamics._chunks(10_000, 256) == (40, 272)
    for n in (1, 7, 512, 1024, 1025, 4096, 4097, 5000, 100_000):
        k, c = dynamics._chunks(n)
        assert c <= dynamics.CHUNK and k * c >= n > (k - 1) * c
        assert c % dynamics.ALIGN == 0 and c % dynamics.ALIAS != 0


def test_chunked_batch_gives_the_counters_of_one_scan():
    """50 configurations in chunks of 16 (the last padded with 14 copies): every counter
    equal to the unchunked run's."""
    import jax

    from slabtune.model import dynamics

    batch = dynamics.stack_configs(_configs())
    keys = jax.random.split(jax.random.key(11), 50)
    one = dynamics.counters_numpy(dynamics._simulate_batch(keys, batch, 300, 1, 1024))
    got = dynamics.counters_numpy(dynamics._simulate_batch(keys, batch, 300, 1, 16))
    assert one["ops"].sum() > 50 * 300 and one["alloc_slow"].sum() > 0
    for k in one:
        np.testing.assert_array_equal(got[k], one[k], err_msg=k)


def test_threaded_parts_give_the_counters_of_one_call(monkeypatch):
    """simulate_batch over 3 threads (50 configurations in parts of 17, the last padded):
    every counter equal to one call's."""
    import jax

    from slabtune.model import dynamics

    batch = dynamics.stack_configs(_configs())
    keys = jax.random.split(jax.random.key(17), 50)
    one = dynamics.counters_numpy(dynamics.simulate_batch(keys, batch, 200))
    monkeypatch.setattr(dynamics, "_parts", lambda n: 3)
    got = dynamics.counters_numpy(dynamics.simulate_batch(keys, batch, 200))
    assert one["ops"].sum() > 50 * 200
    for k in one:
        np.testing.assert_array_equal(got[k], one[k], err_msg=k)


def test_parts_keep_half_a_chunk_each(monkeypatch):
    from slabtune.model import dynamics

    assert dynamics.PART_MIN == dynamics.CHUNK // 2
    assert dynamics._parts(dynamics.PART_MIN * 2 - 1) == 1
    assert 1 <= dynamics._parts(100 * dynamics.CHUNK) <= (os.cpu_count() or 1)
    monkeypatch.setattr(dynamics, "usable_cpus", lambda: 2)
    assert dynamics._parts(990) == 2 and dynamics._parts(959) == 1

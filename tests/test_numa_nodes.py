"""Memoryless nodes and their memory node: the kernel's fallback order (topology), the
rep layouts that split memoryless CPUs by it (workloads), and the host's SLIT (kernel.host).

The fallback orders below were printed by the kernels themselves ("Fallback order for
Node N:" in build_zonelists()), booting the lab's bzImages with no initramfs under qemu
TCG, q35, 128 MiB per memory node, one CPU per CPU node (``-numa node,nodeid=N[,memdev=]``,
``-numa cpu,node-id=N,socket-id=N``, ``-numa dist,...`` for a SLIT).  CPU nodes come first
and CPU-less memory nodes last, so Linux's node ids (SRAT order: CPUs, then memory) equal
qemu's.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest

from slabtune.errors import SlabtuneError
from slabtune.kernel import host
from slabtune.model import dynamics, policy, profiles, reference_sim, workloads
from slabtune.model.topology import (
    Topology,
    TopologyError,
    fallback_orders,
    numa_mem_ids,
)

#: The seed's machine (sheaves-cross-cpu-regression-2026): 128 CPUs on 8 nodes, memory
#: on nodes 0 and 4 only.
SEED = Topology.uniform(128, 8, memoryless_nodes=(1, 2, 3, 5, 6, 7))


def _zonelist(order, memoryless_self=None):
    """A kernel's printed fallback list less the memoryless node itself, which 6.1.192
    lists first (its find_next_best_node() did not skip a memoryless local node; it has
    no zones, so the zonelist is the same)."""
    return tuple(n for n in order if n != memoryless_self)


# --------------------------------------------------------------------------- kernel facts


def test_seed_machine_splits_memoryless_nodes_three_and_three():
    # by hand, default distances (no SLIT): node 1 scores node 0 at (20 + 1) * 64 (node 0
    # is below it) and node 4 at 20 * 64 + node_load[4] = 1281 (node 0's list charged
    # node 4): node 4; likewise nodes 2 and 3.  Nodes 5-7 see both below them (21 * 64)
    # and pick the less loaded: node 4 carries 4 charges by then, node 0 at most 3.
    assert numa_mem_ids(SEED) == (0, 4, 4, 4, 4, 0, 0, 0)
    # the kernels' own lists, 8 nodes of one CPU, memory on 0 and 4
    v61 = {0: (0, 4), 1: (1, 4, 0), 2: (2, 4, 0), 3: (3, 4, 0), 4: (4, 0),
           5: (5, 0, 4), 6: (6, 0, 4), 7: (7, 0, 4)}
    ml = set(SEED.memoryless_nodes)
    assert fallback_orders(SEED) == tuple(
        _zonelist(v61[n], n if n in ml else None) for n in range(8))
    # the load rule of 2.6.23..5.15 (assign a count-down) deals them out the same way
    assert numa_mem_ids(SEED, node_load="assign") == numa_mem_ids(SEED)


def test_equidistant_memoryless_nodes_alternate_over_the_memory_nodes():
    # a sweep's layout: the highest-numbered nodes memoryless; each memoryless node sees
    # both memory nodes below it at 21, and node_load alternates the pick
    t = Topology.uniform(64, 8, memoryless_nodes=(2, 3, 4, 5, 6, 7))
    assert numa_mem_ids(t) == (0, 1, 0, 1, 0, 1, 0, 1)
    # a single memory node serves every memoryless node
    assert numa_mem_ids(Topology.uniform(16, 4, memoryless_nodes=(1, 2, 3))) == (0,) * 4


def test_fallback_orders_match_kernel_7_2_without_the_cpu_penalty():
    # nodes 0-2 one CPU each (node 1 memoryless), nodes 3 and 4 memory without CPUs.
    # 7.2.13 printed: 0: 0 2 3 4 / 1: 3 4 2 0 / 2: 2 4 3 0 / 3: 3 4 0 2 / 4: 4 0 2 3
    t = Topology.uniform(3, 5, memoryless_nodes=(1,), node_cpus=(1, 1, 1, 0, 0))
    kernel = ((0, 2, 3, 4), (3, 4, 2, 0), (2, 4, 3, 0), (3, 4, 0, 2), (4, 0, 2, 3))
    assert fallback_orders(t) == kernel
    # with the CPUs in the node masks the penalty would send node 1 to node 4: x86 builds
    # the zonelists before any CPU is in a node's mask
    assert numa_mem_ids(t, cpus_in_node_masks=True)[1] == 4
    assert numa_mem_ids(t)[1] == 3


def test_slit_decides_and_is_read_from_the_memoryless_node_row():
    # nodes 0 and 3 have memory; node 2 is near node 0 by its own row (15) though node 0's
    # row puts it at 40.  7.2.13 printed: 0: 0 3 / 1: 3 0 / 2: 0 3 / 3: 3 0
    d = [[10, 30, 40, 20], [30, 10, 20, 20], [15, 20, 10, 25], [20, 20, 25, 10]]
    t = Topology.uniform(4, 4, memoryless_nodes=(1, 2), distances=d)
    assert fallback_orders(t) == ((0, 3), (3, 0), (0, 3), (3, 0))
    assert numa_mem_ids(t) == (0, 3, 0, 3)
    # without the SLIT node 2 prefers the node above it
    assert numa_mem_ids(Topology.uniform(4, 4, memoryless_nodes=(1, 2))) == (0, 3, 3, 3)


def test_distance_defaults_and_slit():
    t = Topology.uniform(4, 2)
    assert (t.distance(0, 0), t.distance(0, 1)) == (10, 20)
    t = Topology.uniform(4, 2, distances=[[10, 32], [32, 10]])
    assert t.distances == ((10, 32), (32, 10)) and t.distance(1, 0) == 32


@pytest.mark.parametrize("d, words", [
    ([[10, 20]], "has 1 rows but there are 2 nodes"),
    ([[10, 20], [20]], "row 1 has 1 entries"),
    ([[10, 20], [20, 11]], "[1][1] = 11"),
    ([[10, 10], [20, 10]], "[0][1] = 10 is outside 11..254"),
    ([[10, 255], [20, 10]], "[0][1] = 255 is outside 11..254"),
    ([[10, 20.0], [20, 10]], "[0][1] = 20.0 is not an integer"),
    ([[10, True], [20, 10]], "is not an integer"),
    ("10 20", "is not a list of rows"),
    ([10, 20], "row 0 (10) is not a list"),
])
def test_bad_distances_name_the_field(d, words):
    with pytest.raises(TopologyError, match="distances") as err:
        Topology.uniform(4, 2, distances=d)
    assert words in str(err.value)


def test_asymmetric_slit_is_accepted_as_the_kernel_accepts_it():
    t = Topology.uniform(4, 2, distances=[[10, 20], [30, 10]])
    assert (t.distance(0, 1), t.distance(1, 0)) == (20, 30)


def test_fallback_rule_names_its_options():
    with pytest.raises(TopologyError, match="node_load"):
        fallback_orders(SEED, node_load="sum")


# --------------------------------------------------------------------------- rep layouts


def _by_mem(lay, memless: bool) -> dict[int, float]:
    out: dict[int, float] = {}
    for w, ml, m in zip(lay.weight, lay.memoryless, lay.mem_node):
        if w > 0 and bool(ml) == memless:
            out[int(m)] = out.get(int(m), 0.0) + float(w)
    return out


@pytest.mark.parametrize("kind", list(workloads.BUILDERS))
def test_seed_layouts_split_memoryless_cpus_by_their_memory_node(kind):
    # request_response with a thread on every CPU (its default 16 stay on nodes 0 and 4)
    params = {"threads": 200} if kind == "request_response" else {}
    wl, lay = workloads.build(kind, SEED, **params)
    assert float(np.sum(lay.weight)) == pytest.approx(128.0)
    assert list(lay.node_weight) == [1.0, 1.0, 3.0, 3.0]
    assert list(lay.node_has_memory) == [1, 1, 0, 0]
    # memoryless reps sit in class 2 or 3 by their memory node's class (so a memoryless
    # node's barn only holds its own memory node's objects) ...
    for n, m, ml in zip(lay.node, lay.mem_node, lay.memoryless):
        assert bool(ml) == (int(n) in workloads.MEMLESS_CLASSES)
        if ml:
            assert int(n) == workloads.MEMLESS_CLASSES[int(m)]
    # ... and take their slabs from node 0 (class 0) or node 4 (class 1), half each
    assert _by_mem(lay, True) == {0: pytest.approx(48.0), 1: pytest.approx(48.0)}


def test_producer_consumer_pairs_within_a_memory_group():
    wl, lay = workloads.producer_consumer(SEED)
    send = [(int(lay.node[r]), int(lay.mem_node[r])) for r in range(4)]
    assert send == list(workloads.GROUPS)
    # each sender's receivers are the receivers of its own group
    for r in range(4):
        cum = wl.free_cum[r]
        j = int(np.argmax(cum > 0))
        assert cum[j] == workloads.PROB_ONE
        assert (int(lay.node[j]), int(lay.mem_node[j])) == send[r]


def test_single_memory_node_layout_is_unchanged():
    t = Topology.uniform(64, 2, memoryless_nodes=(1,))
    _, lay = workloads.local(t)
    assert set(int(m) for m in lay.mem_node) == {0}
    assert list(lay.node_weight) == [1.0, 0.0, 1.0, 0.0]
    assert list(lay.node_has_memory) == [1, 1, 0, 1]  # class 3 stays padding


def test_cpu_less_memory_node_serving_memoryless_cpus_counts_in_class_one():
    # node 2 has memory and no CPUs; memoryless node 1 allocates from it (node 0 is
    # below node 1: 21 against 20)
    t = Topology.uniform(8, 3, memoryless_nodes=(1,), node_cpus=(4, 4, 0))
    assert numa_mem_ids(t) == (0, 2, 2)
    g = workloads.node_groups(t)
    assert g["nodes"] == [1, 1, 0, 1]
    assert g["group_cpus"][(workloads.NODE_MEMLESS_OTHER, workloads.NODE_MEM_OTHER)] == 4
    _, lay = workloads.local(t)
    assert _by_mem(lay, True) == {1: pytest.approx(4.0)}
    # a CPU-less memory node no memoryless node uses takes no part, as before: node 1
    # and node 0 are both below memoryless node 2 (21 each) and node_load picks node 0
    t = Topology.uniform(8, 3, memoryless_nodes=(2,), node_cpus=(4, 0, 4))
    assert numa_mem_ids(t) == (0, 1, 0)
    assert workloads.node_groups(t)["nodes"] == [1, 0, 1, 0]
    assert workloads.node_groups(t)["has_memory"] == [True, True, False, True]


def test_block_io_completions_take_the_first_memoryless_cpus():
    # completion CPUs on memoryless nodes: the first ones in node order (node 1, whose
    # memory node is 4), as the lab module places them; 20 of them spill onto node 2
    wl, lay = workloads.block_io(SEED, completion_remote=True, completions=20)
    comp = [r for r in range(workloads.R) if wl.alloc_p[r] == 0 and lay.weight[r] > 0]
    assert sum(float(lay.weight[r]) for r in comp) == pytest.approx(20.0)
    assert {int(lay.mem_node[r]) for r in comp} == {1}
    assert float(np.sum(lay.weight)) == pytest.approx(128.0)


#: 16 CPUs on 4 memory nodes: class 1 stands for nodes 1-3 (the lab's pc-16cpu-4node).
FOUR = Topology.uniform(16, 4)


def _free_to(wl):
    """Row r: the share of rep r's objects each rep frees (from the cumulative rows)."""
    cum = np.asarray(wl.free_cum, np.float64) / workloads.PROB_ONE
    return np.diff(np.concatenate([np.zeros((workloads.R, 1)), cum], axis=1), axis=1)


def test_reps_of_a_class_of_several_nodes_sit_on_nodes_of_their_own():
    _, lay = workloads.producer_consumer(FOUR, cross_node=0.5)
    senders, receivers = range(4), range(4, 8)
    for side in (senders, receivers):
        # one rep per node, each two CPUs: node 0 (class 0), nodes 1-3 (class 1, homes 0-2)
        assert [(int(lay.node[r]), int(lay.home[r])) for r in side] == \
            [(0, 0), (1, 0), (1, 1), (1, 2)]
        assert [float(lay.weight[r]) for r in side] == [2.0] * 4
    np.testing.assert_array_equal(lay.mem_home, lay.home)
    # a class of one node keeps every rep at home 0
    _, lay2 = workloads.producer_consumer(Topology.uniform(8, 2), cross_node=0.5)
    assert not np.any(lay2.home) and not np.any(lay2.mem_home)


def test_a_memoryless_node_takes_the_home_of_its_own_memory_node():
    # node 2 has memory and no CPUs and is memoryless node 3's nearest (15 against 20);
    # class 1 is nodes 1 and 2.  Node 1's reps sit on node 1 (home 0: only nodes with
    # CPUs take reps), node 3's slabs come from node 2 (mem_home 1), so node 3's CPUs
    # see node 1's objects as remote, as numa_mem_id() = 2 does
    d = [[10, 20, 20, 20], [20, 10, 20, 20], [20, 20, 10, 15], [20, 20, 15, 10]]
    t = Topology.uniform(12, 4, node_cpus=(4, 4, 0, 4), memoryless_nodes=(3,), distances=d)
    assert numa_mem_ids(t)[3] == 2
    _, lay = workloads.producer_consumer(t, cross_node=0.5)
    on1 = [r for r in range(workloads.R) if lay.weight[r] > 0 and lay.node[r] == 1]
    on3 = [r for r in range(workloads.R) if lay.weight[r] > 0 and lay.node[r] == 3]
    assert on1 and on3
    assert {int(lay.mem_home[r]) for r in on1} == {0}
    assert {int(lay.mem_home[r]) for r in on3} == {1}
    assert {int(lay.mem_node[r]) for r in on1 + on3} == {1}


def test_producer_consumer_spreads_the_cross_node_share_over_every_other_node():
    # the lab module's routing (native/lab/slabtune_lab.c): half to the receivers of the
    # sender's node, half spread alike over the 6 receiving CPUs of the three other nodes
    wl, _ = workloads.producer_consumer(FOUR, cross_node=0.5)
    f = _free_to(wl)
    for s in range(4):
        assert f[s, 4 + s] == pytest.approx(0.5, abs=1e-4)
        others = [4 + j for j in range(4) if j != s]
        np.testing.assert_allclose(f[s, others], 1 / 6, atol=1e-4)
    # so every receiving node frees as many objects as one sender allocates (by node
    # class it had been class 0's receivers: 0.5 + 3 x 0.5, two a step)
    np.testing.assert_allclose(f[:4, 4:].sum(axis=0), 1.0, atol=1e-3)


def test_frees_between_nodes_of_one_class_are_remote_on_7x():
    # v7.1 on 16 CPUs of 4 nodes, half the messages across nodes: the kernel counts half
    # the frees fast (lab pc-16cpu-4node, 7.2: 49.5% of frees fast), since free_to_pcs()
    # takes only objects of the CPU's own node (slab_nid() == numa_mem_id()); with class
    # 1 as one node, frees from nodes 1-3 to each other had gone into the sheaves
    prof = profiles.get_profile("v7.1")
    st = policy.structure(512, 16, 16, 16, policy.profile_arrays(prof))
    cfg = dynamics.config_from(st, prof, FOUR, {"kind": "producer_consumer", "depth": 64,
                                                "cross_node": 0.5, "drain": "eager"})
    steps = 3000
    c = dynamics.counters_numpy(dynamics.simulate(jax.random.key(4), cfg, steps))
    w = np.asarray(cfg.rep_weight, np.float64)
    frees = (w * c["frees"]).sum()
    assert (w * c["remote_free"]).sum() / frees == pytest.approx(0.5, abs=0.03)
    assert (w * c["free_fast"]).sum() / frees == pytest.approx(0.5, abs=0.03)
    # and every sender keeps its pace: one allocation a step (the kernel's 8 senders
    # allocate 9,860-10,000 times in 10,000 steps), not throttled at its depth
    assert np.all(c["allocs"][:4] >= 0.97 * steps)
    # the same config with every rep at home 0 (class 1 as one node): fewer remote frees
    flat = cfg._replace(rep_mem_home=np.zeros_like(cfg.rep_mem_home))
    c0 = dynamics.counters_numpy(dynamics.simulate(jax.random.key(4), flat, steps))
    assert (w * c0["remote_free"]).sum() / (w * c0["frees"]).sum() < 0.3


def test_slab_frees_between_nodes_of_one_class_are_alien():
    # SLAB's cache_free_alien(): an object of another node than numa_mem_id() goes to an
    # alien array, whichever class the two nodes are in
    from slabtune.model import slab_dynamics as sd

    prof = profiles.SLAB_PROFILES["slab-v6.1"]
    cfg = sd.config_from(sd.structure_for(512, FOUR, prof), prof, FOUR,
                         {"kind": "producer_consumer", "depth": 64, "cross_node": 0.5})
    c = sd.counters_numpy(sd.simulate_batch(jax.vmap(jax.random.key)(np.array([2], np.uint32)),
                                            sd.stack_configs([cfg]), 2000))
    w = np.asarray(cfg.rep_weight, np.float64)
    rate = (w * c["remote_free"][0]).sum() / (w * c["frees"][0]).sum()
    assert rate == pytest.approx(0.5, abs=0.03)
    assert c["alien_lock"][0].sum() == c["remote_free"][0].sum()


@pytest.mark.parametrize("profile", ["v2.6.27", "v5.10", "v6.18", "v7.0", "v7.1"])
@pytest.mark.parametrize("wl", [{"kind": "producer_consumer", "depth": 40, "cross_node": 0.3},
                                {"kind": "block_io", "depth": 20, "completion_remote": True,
                                 "completions": 3}])
def test_dynamics_equal_reference_with_memoryless_reps_on_both_memory_classes(profile, wl):
    # the seed's layout at 32 CPUs: memoryless reps with mem_node 0 and 1 side by side
    topo = Topology.uniform(32, 8, memoryless_nodes=(1, 2, 3, 5, 6, 7))
    prof = profiles.get_profile(profile)
    st = policy.structure(256, topo.possible, topo.present, topo.online,
                          policy.profile_arrays(prof))
    cfg = dynamics.config_from(st, prof, topo, wl)
    assert {int(m) for m, ml in zip(cfg.rep_mem_node, cfg.rep_memoryless) if ml} <= {0, 1}
    steps = 200
    w = dynamics.draws(jax.random.key(7), steps)
    got = dynamics.counters_numpy(dynamics.simulate_draws(w, cfg))
    want = reference_sim.run(w, cfg)
    gauges = {name for name, _ in dynamics.GAUGE_FIELDS}
    for k in want:
        if k in gauges:
            np.testing.assert_array_equal(np.rint(got[k] * steps), np.rint(want[k] * steps),
                                          err_msg=k)
        else:
            np.testing.assert_array_equal(got[k], want[k], err_msg=k)
    assert want["ops"].sum() > 0


# --------------------------------------------------------------------------- host SLIT


def test_topology_from_lists_reads_the_distance_lines():
    # online nodes 0, 2 and 5 (ids need not be dense); node 5 has memory only
    topo, ids = host.topology_from_lists(
        "0-7", "0-7", "0-7", "0,5", "0,2", {0: "0-3", 2: "4-7", 5: ""},
        "0,2,5", {0: "10 21 31", 2: "21 10 17", 5: "31 17 10"})
    assert ids == (0, 2, 5)
    assert topo.distances == ((10, 21, 31), (21, 10, 17), (31, 17, 10))
    assert numa_mem_ids(topo) == (0, 2, 2)
    # a missing line: no SLIT, the kernel's defaults
    topo, _ = host.topology_from_lists("0-7", "0-7", "0-7", "0,5", "0,2",
                                       {0: "0-3", 2: "4-7", 5: ""}, "0,2,5",
                                       {0: "10 21 31", 2: "21 10 17"})
    assert topo.distances is None


@pytest.mark.parametrize("line, words", [("10 x 31", "not a list of numbers"),
                                         ("10 21", "2 entries but 3 online nodes"),
                                         ("10 21 9", "distances: [0][2] = 9")])
def test_topology_from_lists_rejects_bad_distance_lines(line, words):
    with pytest.raises(SlabtuneError, match="distance") as err:
        host.topology_from_lists("0-7", "0-7", "0-7", "0,5", "0,2",
                                 {0: "0-3", 2: "4-7", 5: ""}, "0,2,5",
                                 {0: line, 2: "21 10 17", 5: "31 17 10"})
    assert words in str(err.value)


def test_read_host_topology_reads_node_distance_files(tmp_path):
    cpu = tmp_path / "sys/devices/system/cpu"
    node = tmp_path / "sys/devices/system/node"
    cpu.mkdir(parents=True)
    for f, v in (("possible", "0-3"), ("present", "0-3"), ("online", "0-3")):
        (cpu / f).write_text(v + "\n")
    node.mkdir(parents=True)
    for f, v in (("online", "0-1"), ("has_memory", "0"), ("has_cpu", "0-1")):
        (node / f).write_text(v + "\n")
    for n, cl, dist in ((0, "0-1", "10 16"), (1, "2-3", "16 10")):
        (node / f"node{n}").mkdir()
        (node / f"node{n}" / "cpulist").write_text(cl + "\n")
        (node / f"node{n}" / "distance").write_text(dist + "\n")
    h = host.read_host_topology(tmp_path)
    assert h.topology.distances == ((10, 16), (16, 10))
    assert h.node_distances == ("10 16", "16 10")
    assert h.topology.memoryless_nodes == (1,)


# --------------------------------------------------------------------------- SLUB profiles


def test_every_slub_profile_serves_memoryless_cpus_from_their_per_cpu_cache():
    # node_match(c, NUMA_NO_NODE) matches any slab from v2.6.24 on: no SLUB era had SLAB's
    # numa_node_id()-only per-CPU arrays, v2.6.27 included
    assert all(p.memoryless_fallback for p in profiles.PROFILES.values())


def test_memoryless_fallback_false_stays_an_override():
    from slabtune.sweeps import simconfig

    topo = Topology.uniform(8, 2, memoryless_nodes=(1,))
    prof = profiles.get_profile("v2.6.27")
    st = policy.structure(256, topo.possible, topo.present, topo.online,
                          policy.profile_arrays(prof))
    wl = {"kind": "local"}
    on = dynamics.config_from(st, prof, topo, wl)
    off = dynamics.config_from(st, simconfig.apply_knobs(prof, {"memoryless_fallback": False}),
                               topo, wl)
    assert int(np.asarray(on.memoryless_fallback)) == 1
    assert int(np.asarray(off.memoryless_fallback)) == 0

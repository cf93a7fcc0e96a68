"""The native validator (native/slubsim.c) measured on the real binary.

Properties restated from mm/slub.c (v6.8..v7.1 shapes; older eras through the knobs), each
checked on counters the binary prints:

* a CPU whose live set fits in its CPU slab allocates from its lockless freelist every time
  after the first allocation (one slow path, one slab), and frees straight back to it;
* with no per-CPU partial lists (v3.1), an object freed by another CPU than the one whose
  CPU slab it came from never takes the free fast path;
* empty slabs beyond min_partial go back to the page allocator; none do while the node keeps
  fewer than min_partial partial slabs (v3.1's ``>``); before v3.1 every slab __slab_free()
  empties goes back;
* sheaves absorb local frees (v7.0);
* in v7.0 CPUs on memoryless nodes free around their sheaves (every free is "remote"), in
  v7.1 they free into them;
* without the numa_mem_id() fix (memoryless_fallback = false: SLAB before v2.6.35; no SLUB
  profile) a CPU on a memoryless node never allocates from a CPU slab;
* slab memory is never below the bytes of live objects;

and, under the seed scenarios of slabtune.model.scenarios, fast-path fractions within
5 percentage points of the model's (reps weighted by the CPUs they stand for).
"""

from __future__ import annotations

import dataclasses
import subprocess

import numpy as np
import pytest

from slabtune.sweeps import simconfig
from slabtune.validate import native as native_driver

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def binary():
    return native_driver.build()


def _spec(profile: str, workload: dict, *, cpus: int = 2, nodes: int = 1, memoryless=(),
          cache: dict | None = None, params: dict | None = None, steps: int = 2000,
          seed: int = 7):
    """A config of the model's; a workload table without ``drain`` frees eagerly (these
    properties were stated for freers that free whatever is pending)."""
    doc = {
        "topology": {"cpus": cpus, "nodes": nodes, "memoryless_nodes": list(memoryless)},
        "cache": cache or {"name": "kmalloc-256"},
        "policy": {"profile": profile, "params": params or {}},
        "workload": {"drain": "eager", **workload},
        "run": {"steps": steps, "seed": seed},
    }
    return simconfig.parse_doc(doc)


def _run(spec, binary, **replace) -> tuple[native_driver.NativeConfig, native_driver.NativeResult]:
    cfg = dataclasses.replace(native_driver.config_for_spec(spec), **replace)
    return cfg, native_driver.run(cfg, binary=binary)


def _threads(res: native_driver.NativeResult, **where) -> list[dict]:
    return [t for t in res.per_thread
            if t["active"] and all(t[k] == v for k, v in where.items())]


# --------------------------------------------------------------------------- CPU slab


def test_live_set_inside_one_slab_is_all_fast_path(binary):
    spec = _spec("v6.1", {"kind": "local", "live": 8}, cpus=1)
    cfg, res = _run(spec, binary)
    assert cfg.objs > 8  # the live set fits one slab (kmalloc-256: 32 per order-1 slab)
    c = res.counters
    assert c["allocs"] > 900 and c["frees"] > 900
    assert c["alloc_slowpath"] == 1 and c["alloc_slab"] == 1
    assert c["alloc_fastpath"] == c["allocs"] - 1
    assert c["free_fastpath"] == c["frees"] and c["free_slowpath"] == 0
    assert c["list_lock"] == 1  # the one get_partial_node() that found the list empty


def test_remote_frees_without_cpu_partial_are_all_slow(binary):
    spec = _spec("v3.1", {"kind": "producer_consumer", "depth": 64}, cpus=2)
    cfg, res = _run(spec, binary)
    assert cfg.cpu_partial_slabs == 0
    (prod,) = [t for t in _threads(res) if t["counters"]["allocs"] > 0]
    (cons,) = [t for t in _threads(res) if t["counters"]["frees"] > 0]
    assert prod["rep"] != cons["rep"] and cons["counters"]["allocs"] == 0
    assert cons["counters"]["frees"] > 1000
    assert cons["counters"]["free_fastpath"] == 0
    assert cons["counters"]["free_slowpath"] == cons["counters"]["frees"]
    # most frees land on the producer's frozen CPU slab, the rest on full or partial slabs
    c = res.counters
    assert c["free_frozen"] > 0 and c["alloc_refill"] > 0
    assert c["cpu_partial_free"] == 0 and c["cpu_partial_alloc"] == 0


def test_a_class_node_meets_min_partial_for_each_node_it_stands_for(binary):
    """The twin's nodes are the model's classes; on 16 CPUs of 4 nodes class 1's reps sit
    on nodes 1-3, so its node keeps min_partial for each (dynamics.node_min_partial): the
    flags carry the model's per-node threshold, the binary echoes it, and a run that
    compares class 1 with one node's min_partial instead discards more empty slabs."""
    from slabtune.model import dynamics
    spec = _spec("v6.1", {"kind": "producer_consumer", "depth": 64, "cross_node": 0.5},
                 cpus=16, nodes=4, cache={"name": "kmalloc-512"},
                 params={"slub_max_order": 0}, steps=3000, seed=1)
    sim = native_driver.sim_config_for_spec(spec)
    cfg = native_driver.config_for_spec(spec)
    mp = int(np.asarray(sim.min_partial))
    assert cfg.node_min_partial[:2] == (mp, 3 * mp)
    assert cfg.node_min_partial == tuple(int(x) for x in dynamics.node_min_partial(
        np.asarray(sim.min_partial), np.asarray(sim.list_nodes)))
    res = native_driver.run(dataclasses.replace(cfg, serial=1), binary=binary)
    assert res.raw["config"]["node_min_partial"] == list(cfg.node_min_partial)
    one = native_driver.run(dataclasses.replace(cfg, serial=1, node_min_partial=()),
                            binary=binary)
    assert one.raw["config"]["node_min_partial"] == [-1] * cfg.nodes
    assert one.counters["free_slab"] > res.counters["free_slab"]


def test_remote_frees_fill_the_per_cpu_partial_list(binary):
    # A sender and a receiver that also churns objects of its own, so that it frees the
    # sender's objects at half the sender's pace: the sender's slabs fill up and leave it
    # full, and the receiver's first free to each moves it to the receiver's per-CPU
    # partial list (put_cpu_partial, no list_lock).
    spec = _spec("v6.1", {"kind": "producer_consumer", "depth": 64}, cpus=2)
    cfg = native_driver.config_for_spec(spec)
    assert cfg.cpu_partial_slabs > 0
    R = cfg.reps
    send = [r for r in range(R) if cfg.active[r] and cfg.alloc_p[r] > 0]
    recv = [r for r in range(R) if cfg.active[r] and cfg.alloc_p[r] == 0]
    assert len(send) == len(recv) == 1
    s, c = send[0], recv[0]
    alloc_p, live, cum = list(cfg.alloc_p), list(cfg.live_target), list(cfg.free_cum)
    alloc_p[c], live[c] = 1 << 15, 8
    cum[c * R:(c + 1) * R] = [0 if j < c else 1 << 16 for j in range(R)]
    cfg = dataclasses.replace(cfg, alloc_p=tuple(alloc_p), live_target=tuple(live),
                              free_cum=tuple(cum))
    res = native_driver.run(cfg, binary=binary)
    (ks,) = [t["counters"] for t in res.per_thread if t["rep"] == s]
    (kc,) = [t["counters"] for t in res.per_thread if t["rep"] == c]
    assert ks["frees"] == 0 and kc["frees"] > 1000
    assert ks["deactivate_full"] > 0
    assert kc["cpu_partial_free"] > 0
    # the receiver's own objects come from its CPU slab and go back to it: the only free
    # fast paths; the sender's objects never do
    assert 0 < kc["free_fastpath"] <= kc["frees"] - kc["cpu_partial_free"] - kc["free_frozen"]
    assert res.counters["cpu_partial_alloc"] > 0 or res.counters["cpu_partial_drain"] > 0


def test_oldest_first_frees_empty_whole_slabs(binary):
    # free_order=1: a receiver frees the oldest object handed to it (the lab module's FIFO
    # rings), so a slab's objects, handed out one after another, come back together and
    # its slab empties; drawn at random they come back spread over many slabs, and
    # some are still in the sender's CPU slab (refilled from it, ALLOC_REFILL).  Order-0
    # slabs of 8 objects, 4 senders and 4 receivers on 2 nodes, half across.
    spec = _spec("v6.1", {"kind": "producer_consumer", "depth": 64, "cross_node": 0.5},
                 cpus=8, nodes=2, cache={"size": 512}, params={"slub_max_order": 0},
                 steps=4000, seed=1)
    _, rand = _run(spec, binary, serial=1, free_order=0)
    cfg, fifo = _run(spec, binary, serial=1, free_order=1)
    assert cfg.objs == 8
    r, f = rand.counters, fifo.counters
    assert f["frees"] > 15000 and r["frees"] > 15000
    assert f["free_slab"] > 1.5 * r["free_slab"]
    assert f["alloc_refill"] < 0.75 * r["alloc_refill"]


# --------------------------------------------------------------------------- min_partial


def _burst_spec(min_partial: int, profile: str = "v3.1"):
    # v3.1, v2.6.27: no per-CPU partial lists, so every slab that empties is on the node list.
    return _spec(profile, {"kind": "local", "live": 320, "burst": 320}, cpus=1,
                 params={"min_partial": min_partial}, steps=1280)


@pytest.mark.parametrize("profile,kept", [("v3.1", 5), ("v2.6.27", 0)])
def test_empty_slabs_beyond_min_partial_go_back(binary, profile, kept):
    cfg, res = _run(_burst_spec(5, profile), binary)
    c = res.counters
    assert cfg.min_partial == 5 and 320 // cfg.objs >= 8
    # two bursts of 320 allocations then 320 frees: each free phase empties the slabs
    assert c["free_slab"] > 0
    assert c["alloc_slab"] > 320 // cfg.objs
    # v3.1's __slab_free discards when n->nr_partial > min_partial, the emptied slab
    # counted, so the node ends with min_partial partial slabs (all empty here); 2.6.27's
    # discards every slab it empties and keeps none
    assert res.raw["final_nr_partial"][0] == kept
    assert res.live_object_bytes == 0
    assert res.final_slab_bytes < res.peak_slab_bytes


def test_no_slab_goes_back_while_node_keeps_fewer_than_min_partial(binary):
    cfg, res = _run(_burst_spec(1000), binary)
    c = res.counters
    assert c["free_slab"] == 0
    # the second burst reuses the slabs kept on the partial list: no new slabs
    assert c["alloc_slab"] == -(-320 // cfg.objs)
    assert res.final_slab_bytes == res.peak_slab_bytes


# --------------------------------------------------------------------------- sheaves


def test_sheaves_absorb_local_frees(binary):
    spec = _spec("v7.0", {"kind": "local", "live": 16}, cpus=1, cache={"size": 256})
    cfg, res = _run(spec, binary)
    assert cfg.sheaf_capacity > 16 and cfg.cpu_slab == 0
    c = res.counters
    # one refill fills the main sheaf; the live set then cycles through it.  The refill
    # replaced the empty main sheaf; the allocation it served is still a fast path to
    # SLUB_STATS (alloc_from_pcs()), so no allocation is a slow path
    assert c["sheaf_refill"] == 1 and c["sheaf_alloc_replace"] == 1
    assert c["alloc_slowpath"] == 0 and c["alloc_fastpath"] == c["allocs"]
    assert c["free_fastpath"] == c["frees"] > 900
    # list_lock twice: finding the node list empty, then putting what is left of the last
    # new slab on it
    assert c["alloc_slab"] == -(-cfg.sheaf_capacity // cfg.objs)
    assert c["list_lock"] == 1 + (cfg.sheaf_capacity % cfg.objs != 0)
    assert c["sheaf_flush"] == 0


def test_sheaves_spill_to_barn_and_back(binary):
    # bursts of 4 sheaves' worth: frees fill main, swap to spare, then park full sheaves in
    # the barn; the next allocation burst takes them back
    spec = _spec("v7.0", {"kind": "local", "live": 240, "burst": 240}, cpus=1,
                 cache={"size": 256}, steps=1920)
    cfg, res = _run(spec, binary)
    c = res.counters
    assert cfg.sheaf_capacity * 4 <= 240
    assert c["barn_put"] > 0 and c["barn_get"] > 0 and c["sheaf_swap"] > 0
    assert c["barn_put_fail"] == 0  # never more than 10 full sheaves
    assert c["sheaf_refill"] == c["barn_get_fail"]


def _memoryless_spec(profile: str, **kw):
    return _spec(profile, {"kind": "local", "live": 32}, cpus=4, nodes=2, memoryless=[1],
                 cache={"size": 256}, **kw)


def test_v70_memoryless_cpus_bypass_sheaves_v71_do_not(binary):
    cfg0, res0 = _run(_memoryless_spec("v7.0"), binary)
    cfg1, res1 = _run(_memoryless_spec("v7.1"), binary)
    for res in (res0, res1):
        assert _threads(res, node=0) and _threads(res, node=2)
    for t in _threads(res0, node=2):  # memoryless node class: every free is remote
        k = t["counters"]
        assert k["remote_free"] == k["frees"] > 0
        assert k["free_fastpath"] == 0
    for t in _threads(res1, node=2):
        k = t["counters"]
        assert k["remote_free"] == 0
        assert k["free_fastpath"] >= 0.9 * k["frees"]
    for res in (res0, res1):  # CPUs on the memory node keep their sheaves either way
        for t in _threads(res, node=0):
            assert t["counters"]["free_fastpath"] >= 0.9 * t["counters"]["frees"]
    assert res1.counters["free_fastpath"] > res0.counters["free_fastpath"]


def test_without_numa_mem_id_memoryless_cpus_never_use_a_cpu_slab(binary):
    cfg, res = _run(_spec("v2.6.27", {"kind": "local", "live": 16}, cpus=4, nodes=2,
                          memoryless=[1], params={"memoryless_fallback": False}), binary)
    off = [t for t in _threads(res, node=2)]
    assert off and all(cfg.rep_alloc_local[t["rep"]] == 0 for t in off)
    for t in off:
        k = t["counters"]
        assert k["allocs"] > 0 and k["alloc_fastpath"] == 0
        assert k["direct_alloc"] == k["allocs"] and k["list_lock"] >= k["allocs"]
    _, fixed = _run(_spec("v2.6.27", {"kind": "local", "live": 16}, cpus=4, nodes=2,
                          memoryless=[1], params={"memoryless_fallback": True}), binary)
    assert fixed.counters["direct_alloc"] == 0
    assert fixed.counters["alloc_fastpath"] > res.counters["alloc_fastpath"]


# --------------------------------------------------------------------------- memory


@pytest.mark.parametrize("profile,workload", [
    ("v6.1", {"kind": "local", "live": 100, "burst": 50}),
    ("v7.0", {"kind": "producer_consumer", "depth": 40}),
    ("v3.1", {"kind": "request_response", "threads": 4}),
])
def test_peak_slab_memory_covers_live_objects(binary, profile, workload):
    _, res = _run(_spec(profile, workload, cpus=4, cache={"size": 512}), binary)
    assert res.peak_live_object_bytes > 0
    assert res.peak_slab_bytes >= res.peak_live_object_bytes
    assert res.final_slab_bytes >= res.live_object_bytes
    assert res.peak_slab_bytes % res.raw["slab_bytes"] == 0
    assert res.wall_seconds > 0 and res.ns_per_op > 0


@pytest.mark.parametrize("sync_every", [0, 1, 7])
@pytest.mark.parametrize("profile,workload,topo", [
    ("v6.1", {"kind": "producer_consumer", "depth": 40, "cross_node": 0.5},
     {"cpus": 4, "nodes": 2}),
    ("v7.0", {"kind": "block_io", "completion_remote": True},
     {"cpus": 8, "nodes": 4, "memoryless": [1, 3]}),
    ("v3.1", {"kind": "request_response", "threads": 8}, {"cpus": 4, "nodes": 2}),
])
def test_objects_and_slabs_are_conserved(binary, profile, workload, topo, sync_every):
    # free-running threads (sync_every 0) as the validate command's timing runs use them
    spec = _spec(profile, workload, cache={"size": 512}, steps=1500, **topo)
    cfg, res = _run(spec, binary, sync_every=sync_every)
    c = res.counters
    live = c["allocs"] - c["frees"]
    assert live == sum(t["outstanding"] for t in res.per_thread)
    assert res.live_object_bytes == live * cfg.size
    assert res.final_slab_bytes == (c["alloc_slab"] - c["free_slab"]) * res.raw["slab_bytes"]
    assert c["ops"] == c["allocs"] + c["frees"]
    assert c["alloc_fastpath"] + c["alloc_slowpath"] == c["allocs"]
    assert c["free_fastpath"] + c["free_slowpath"] == c["frees"]


def test_serial_mode_is_repeatable_and_in_rep_order(binary):
    # reps take turns 0..R-1 every step (the model's order): two runs give the same counters
    spec = _spec("v6.1", {"kind": "producer_consumer", "depth": 16, "cross_node": 0.5},
                 cpus=4, nodes=2, steps=800)
    cfg, a = _run(spec, binary, serial=1)
    _, b = _run(spec, binary, serial=1)
    assert a.per_thread == b.per_thread and a.counters == b.counters
    assert a.peak_slab_bytes == b.peak_slab_bytes
    # in rep order a receiver (reps 4..7) sees the messages its senders sent in the same
    # step, so no step of a busy receiver is wasted once messages flow
    frees = sum(t["counters"]["frees"] for t in a.per_thread)
    assert frees >= a.counters["allocs"] - sum(cfg.live_target)


def test_held_queues_keep_their_depth(binary):
    # drain = "hold" (model workloads.hold_levels, the binary's --hold): receivers free only
    # above their share of the senders' depth - h, so each sender keeps its depth in flight
    # (within h = depth // 32) where eager receivers keep a few
    depth = 256
    spec = _spec("v6.1", {"kind": "producer_consumer", "depth": depth, "drain": "hold"},
                 cpus=4, nodes=1, steps=3 * depth)
    cfg, res = _run(spec, binary, serial=1)
    assert set(cfg.hold) == {0, depth - depth // 32}
    send = [t["outstanding"] for t in _threads(res) if cfg.alloc_p[t["rep"]] > 0]
    assert send and all(n <= depth + depth // 32 for n in send)
    assert abs(sum(send) / len(send) - depth) <= 0.05 * depth, send
    eager = _spec("v6.1", {"kind": "producer_consumer", "depth": depth}, cpus=4,
                  steps=3 * depth)
    _, res = _run(eager, binary, serial=1)
    assert all(t["outstanding"] < depth // 8 for t in res.per_thread
               if t["active"] and t["counters"]["allocs"] > 0)


# --------------------------------------------------------------------------- interface


def test_build_is_cached(binary):
    before = binary.stat().st_mtime_ns
    assert native_driver.build() == binary
    assert binary.stat().st_mtime_ns == before


@pytest.mark.parametrize("args,needle", [
    (["--size=256", "--objs=16", "--bogus=1"], "unknown option 'bogus'"),
    (["--size=25x", "--objs=16"], "size: '25x' is not an integer"),
    (["--size=256", "--objs=64", "--order=1"], "objs: 64 objects of 256 bytes"),
    (["--size=256", "--objs=16", "--reps=2", "--free_cum=1,2,3"], "free_cum: 3 values"),
    (["--size=256", "--objs=16", "--steps=0"], "steps: 0 is outside"),
    (["--size=256", "--objs=16", "--pin_cpu=-2"], "pin_cpu: -2 is outside"),
])
def test_bad_flags_exit_2_with_one_line(binary, args, needle):
    proc = subprocess.run([str(binary), *args, "--free_cum=65536"] if "--reps=2" not in args
                          else [str(binary), *args], capture_output=True, text=True)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0] and proc.stdout == ""


def test_build_failure_is_one_slabtune_error(tmp_path):
    bad = tmp_path / "broken.c"
    bad.write_text("int main(void) { return undeclared_thing; }\n")
    with pytest.raises(native_driver.NativeError) as err:
        native_driver.build(out=tmp_path / "broken", source=bad)
    msg = str(err.value)
    assert msg.startswith("native build: gcc failed on broken.c: ")
    assert "undeclared_thing" in msg and "\n" not in msg
    assert not (tmp_path / "broken").exists()


def test_run_error_is_one_slabtune_error(binary):
    with pytest.raises(native_driver.NativeError,
                       match=r"slubsim exited 2: slubsim: unknown option"):
        native_driver.run_args(["--size=64", "--objs=1", "--nope=3"], binary=binary)


def test_key_value_file_matches_flags(binary, tmp_path):
    spec = _spec("v6.1", {"kind": "local", "live": 8}, cpus=1, steps=300)
    cfg = native_driver.config_for_spec(spec)
    f = tmp_path / "cfg.txt"
    f.write_text("# slubsim config\n" + "\n".join(a[2:] for a in cfg.args()) + "\n")
    a = native_driver.run_args([f"--config={f}"], binary=binary)
    b = native_driver.run(cfg, binary=binary).raw
    assert a["config"] == b["config"]
    assert a["counters"]["alloc_slowpath"] == b["counters"]["alloc_slowpath"] == 1


# --------------------------------------------------------------------------- vs the model

#: Arms where the native allocator and the model disagree by more than 5 points, with the
#: cause.  Measured 2026-11-24 in serial mode (deterministic), after the partial lists
#: became fill levels (issue 13 item 4; model minus native, alloc fast path): v5.11@224
#: +3.8 points, v5.11@8 +0.8, static -0.5 (3.9 with packed lists), kmalloc-256@160 -2.7
#: (+4.2 packed), kmalloc-1k@160 -5.8 (+1.7 packed), kmalloc-4k@160 +9.5 (+9.2 packed).
#: The same with 3 and 4 fill levels.
#: (The netperf arms at 160 threads, 16 CPUs on 4 nodes, departed too until a run took only
#: its own node's share of class 1's list (dynamics.home_share, 2026-11-28): kmalloc-4k
#: alloc fast 43.7% in the model against 38.7% here, kmalloc-1k 86.0% against 92.5%;
#: 39.4% and 91.1% since.)
KNOWN_MODEL_DEPARTURES: dict = {}


#: The twin's workload (native/slubsim.c step()) still frees a uniformly drawn pending
#: object; the model's frees go oldest first per (allocating, freeing) pair since
#: 2026-11-25 (dynamics.fifo_split, as the lab module's rings and the kernel's queues do).
#: These arms then differ by more than 5 points (model / twin %): v5.11@224 alloc
#: 81.6 / 68.7, the 2008 local churn (2.6.27, whose __slab_free() discards every slab it
#: empties on both sides) alloc 82.4 / 83.9 and free 40.1 / 50.0.  With the
#: twin moved to FIFO as well (tried the same day), nine arms differ by 7-13 alloc points,
#: the model below the twin in eight: real lists empty a FIFO pair's oldest slab, which
#: the model's node levels (frees spread evenly) do not (docs/MODEL.md "What the model
#: leaves out").  So the twin stays uniform until the model walks node lists per FIFO pair.
_UNIFORM_TWIN = (
    "the native twin frees a uniformly drawn pending object, the model a pair's oldest "
    "(dynamics.fifo_split); the same workload on both sides needs the model's node-list "
    "walk per FIFO pair first")
for _key in (("slub-order-nr-cpus-2021", "v5.11@224"),
             ("slub-dynamic-min-partial-2008", "static"),
             ("slub-dynamic-min-partial-2008", "dynamic"),
             ("slab-netio-2008", "SLUB static"), ("slab-netio-2008", "SLUB dynamic")):
    KNOWN_MODEL_DEPARTURES[_key] = _UNIFORM_TWIN


def _arms():
    """Every SLUB arm of the seed scenarios: the native allocator is SLUB's twin (SLAB's
    arms are checked against the SLAB reference simulator, tests/test_slab_dynamics.py)."""
    from slabtune.model import profiles, scenarios

    out = []
    for sc in scenarios.SCENARIOS:
        for name, arm in sc["arms"].items():
            if not profiles.is_slab(profiles.get_any_profile(arm["policy"]["profile"])):
                out.append((sc["name"], name, arm))
    return out


@pytest.fixture(scope="module")
def scenario_runs(binary):
    """Every seed scenario arm: the model's weighted fast-path fractions from
    ``slabtune simulate``'s pipeline (one batched call), and the native allocator's."""
    from slabtune.sweeps import simulate

    arms = _arms()
    specs = []
    for _, _, arm in arms:
        arm = dict(arm)
        patch = arm.pop("profile_patch", None)
        specs.append(native_driver.patched_spec(simconfig.parse_doc(arm), patch))
    cost, _ = simconfig.load_cost()
    preds = simulate.run(specs, cost)
    out = {}
    for (sc, name, _), spec, pred in zip(arms, specs, preds):
        # serial: the reps take their turns in the model's order, so the run is repeatable
        cfg = dataclasses.replace(native_driver.config_for_spec(spec), serial=1)
        res = native_driver.run(cfg, binary=binary)
        model = (pred["alloc_fastpath_frac"], pred["free_fastpath_frac"])
        out[(sc, name)] = (model, native_driver.fastpath_fractions(res, cfg.rep_weight), res)
    return out


def _arm_params():
    params = []
    for sc, name, _ in _arms():
        why = KNOWN_MODEL_DEPARTURES.get((sc, name))
        marks = [pytest.mark.xfail(reason=why, strict=False)] if why else []
        params.append(pytest.param(sc, name, id=f"{sc}:{name}", marks=marks))
    return params


@pytest.mark.slow
@pytest.mark.parametrize("scenario,arm", _arm_params())
def test_fast_path_fractions_match_the_model(scenario_runs, scenario, arm):
    model, native, res = scenario_runs[(scenario, arm)]
    assert res.counters["allocs"] > 0
    for what, m, n in zip(("alloc", "free"), model, native):
        assert abs(m - n) <= 0.05, (f"{what} fast path: model {m:.3f}, native {n:.3f}")


# --------------------------------------------------------------------------- timing


def test_timed_calls_account_for_every_op_on_one_pinned_cpu(binary):
    """time_ops times every slab_alloc()/slab_free() call (or counts it apart when it spanned
    an interruption); pin_cpu puts every thread on one CPU, where the threads take turns, so
    the time spent inside the allocator cannot exceed the run's wall time."""
    import os

    cpu = min(os.sched_getaffinity(0))
    spec = _spec("v6.1", {"kind": "local", "live": 64, "burst": 32}, cpus=4, steps=20000)
    cfg, res = _run(spec, binary, sync_every=0, time_ops=1, pin_cpu=cpu)
    c, raw = res.counters, res.raw
    assert raw["op_timed"] + raw["op_dropped"] == c["ops"] == c["allocs"] + c["frees"]
    threads = _threads(res)
    assert len(threads) == 4 and {t["ran_on"] for t in threads} == {cpu}
    for t in threads:
        assert t["op_timed"] + t["op_dropped"] == t["counters"]["ops"] == 20000
    assert 0 < raw["op_ns"] <= res.wall_seconds * 1e9
    pair = native_driver.op_ns_per_pair(res, cfg.rep_weight)
    assert pair == pytest.approx(2.0 * raw["op_ns"] / raw["op_timed"], rel=1e-3)


def test_timing_does_not_change_what_the_allocator_does(binary):
    """In serial mode the run is deterministic: timing each call leaves every counter as it
    was; an untimed run has nothing to report as allocator time."""
    spec = _spec("v6.18", {"kind": "producer_consumer", "depth": 8}, cpus=4, steps=3000)
    _, plain = _run(spec, binary, serial=1)
    _, timed = _run(spec, binary, serial=1, time_ops=1)
    assert timed.counters == plain.counters
    assert [t["counters"] for t in timed.per_thread] == [t["counters"] for t in plain.per_thread]
    assert "op_ns" not in plain.raw and timed.raw["op_timed"] > 0
    with pytest.raises(native_driver.NativeError, match="time_ops=1"):
        native_driver.op_ns_per_pair(plain)

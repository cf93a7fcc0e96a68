"""``slabtune validate``: real guest and host validation on the session's Ray instance, the
stored rows, the error report recomputed from them, and refusal of bad input.

Guest boots need qemu, a bzImage and busybox (scripts/install-guest-deps.sh); those tests are
marked ``guest`` and skip with the reason when the pieces are missing.  The module boots
three guests in all: the baseline and one candidate on a 2-CPU topology whose node 1 has no
memory, and one guest that is made to time out.
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from slabtune import cli
from slabtune.errors import SlabtuneError
from slabtune.model import profiles
from slabtune.results import store
from slabtune.validate import candidates, dispatch, plan, predict, report, schema
from slabtune.validate import spec as validate_spec
from slabtune.validate import tasks as kernel_tasks


def _guest_missing() -> str | None:
    return plan.guest_available()


_GUEST_WHY = _guest_missing()
needs_guest = pytest.mark.skipif(_GUEST_WHY is not None,
                                 reason=f"guest stack not installed ({_GUEST_WHY})")

#: One memoryless topology (node 1 has CPUs, no memory) and a short hackbench.
SMALL_SPEC = """
[validate]
timeout_s = 240
retries = 1
memory_mib = 384

[[validate.workload]]
mode = "hackbench"
groups = 1
fds = 2
loops = 50

[fleet]
profile = "v6.18"

[[fleet.topology]]
name = "memoryless-2x2"
cpus = 2
nodes = 2
memoryless_nodes = [1]

[[fleet.workload]]
name = "hackbench-socket"
foreign_free = 0.5
[fleet.workload.caches]
skbuff_head_cache = { live_per_cpu = 64, ops = 1.0 }
"kmalloc-512" = { live_per_cpu = 64, ops = 1.0 }
"""

CANDIDATES = """
[[candidate]]
id = "order1"
boot = { slub_max_order = 1, slub_min_objects = 8 }
knobs = { min_partial_lo = 3 }
"""


def _cli(argv, capsys) -> tuple[int, str, str]:
    rc = cli.main(argv)
    out, err = capsys.readouterr()
    return rc, out, err


# --------------------------------------------------------------------------- pure parts


def test_spearman_matches_scipy_with_ties():
    stats = pytest.importorskip("scipy.stats")
    x = [3.0, 1.0, 4.0, 1.0, 5.0, 9.0, 2.0, 6.0]
    y = [2.0, 7.0, 1.0, 8.0, 2.0, 8.0, 1.0, 8.0]
    assert report.spearman(x, y) == pytest.approx(stats.spearmanr(x, y).statistic, abs=1e-12)
    assert report.spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert report.spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    assert report.average_ranks([5, 1, 5, 2]) == [3.5, 1.0, 3.5, 2.0]
    assert report.spearman([1, 2], [2, 1]) is None          # too few pairs
    assert report.spearman([1, 1, 1], [1, 2, 3]) is None    # constant side


def test_spearman_ceiling_is_what_prediction_ties_allow():
    """Three pairs predicted fast and thirteen tied slower (a top-3 whose candidates are
    one configuration to the workload): the best measured order correlates at the
    point-biserial value: the gap of the groups' mean ranks (9 - 1) * sqrt(p q) / the sd
    of the ranks 0..15, p = 3/16, q = 13/16, sd = sqrt((16^2 - 1) / 12)."""
    x = [57.2] * 3 + [59.97] * 13
    want = (9 - 1) * math.sqrt(3 / 16 * 13 / 16) / math.sqrt((16 ** 2 - 1) / 12)
    assert report.spearman_ceiling(x) == pytest.approx(want, abs=1e-12)     # 0.677
    assert report.spearman_ceiling([1.0, 3.0, 2.0, 5.0]) == pytest.approx(1.0)
    assert report.spearman_ceiling([2.0, 2.0, 2.0]) is None
    rng = np.random.default_rng(0)
    for _ in range(200):
        y = rng.normal(size=16).tolist()
        assert report.spearman(x, y) <= report.spearman_ceiling(x) + 1e-12


def test_predictions_within_the_rig_noise_become_ties():
    # three groups the rig resolves (51.4, 57.2, 60.0 ns), hundredths apart inside one
    x = [57.164, 51.384, 57.198, 60.012, 57.175]
    assert report.tie_within(x, 0.29) == [57.164, 51.384, 57.164, 60.012, 57.164]
    assert report.tie_within(x, 0.0) == x
    # neighbours chain: each step is within the resolution, so one group
    assert report.tie_within([0.0, 0.2, 0.4, 0.6], 0.3) == [0.0] * 4
    # the measured order inside a tied group no longer counts against the model
    meas = [57.2, 51.2, 56.6, 59.9, 57.0]     # the group measured in reverse
    assert report.spearman(x, meas) < 1.0
    assert report.spearman(report.tie_within(x, 0.29), meas) == pytest.approx(
        report.spearman_ceiling(report.tie_within(x, 0.29)))
    # the noise: median over calibration configurations of stdev / sqrt(runs)
    rig = {"calibration": [{"runs": [1.0, 2.0, 3.0]}, {"runs": [2.0, 2.0]}, {"runs": [5.0]}]}
    assert report.rig_resolution(rig) == pytest.approx((1 / math.sqrt(3) + 0.0) / 2)
    assert report.rig_resolution(None) is None
    assert report.rig_resolution({"calibration": [{"runs": [5.0]}]}) is None


def test_live_objects_come_from_the_flushed_dump():
    assert predict.live_objects({"objects": 296}, {"objects": 8}) == (8, "flushed")
    n, src = predict.live_objects({"objects": 296}, None)
    assert n == 296 and src.startswith("after (includes free objects on per-CPU slabs")


# skbuff_head_cache on v6.1 (slab_size 256): 4 CPUs give min_objects 4 * (fls(4) + 1) = 16,
# so order 0 (4096 bytes, 16 objects, no leftover); set_cpu_partial() gives 52 objects, so
# cpu_partial_slabs C = DIV_ROUND_UP(2 * 52, 16) = 7; min_partial = clamp(ilog2(256) / 2, 5,
# 10) = 5.  After a workload that freed what it allocated, every CPU retains its CPU slab and
# its per-CPU partial list at put_cpu_partial()'s mean (C+1)(C+2)/(3(C+3)) = 72/30 = 2.4
# slabs, whole (nearly empty) slabs, and the node half of its 5 empty slabs.
SKB_61 = dict(name="skbuff_head_cache", object_size=232, size=256, early=False)


def _memory_61(cpus: int, live: int, traffic):
    from slabtune.model.caches import CacheInfo
    from slabtune.model.topology import Topology

    topo = Topology(cpus, cpus, cpus, (cpus,), (True,))
    return float(predict.predicted_slab_bytes(profiles.get_profile("v6.1"), topo, {},
                                        [CacheInfo(**SKB_61)], [live], traffic)[0])


@pytest.mark.slow
def test_drained_cache_retains_whole_per_cpu_partial_slabs_as_put_cpu_partial_allows():
    per_cpu = 1 + 2.4
    # churned on every CPU: 8 live objects + 4 * 3.4 slabs + min_partial = 5 empty node
    # slabs (at the end of a workload the node list ends full: nothing takes them back)
    full = 8 * 256 + (4 * per_cpu + 5) * 4096                        # 78233.6
    assert _memory_61(4, 8, [math.inf]) == pytest.approx(full, rel=1e-6)
    assert _memory_61(4, 8, None) == pytest.approx(full, rel=1e-6)  # None: all churned
    # 40 objects of traffic touch at most ceil(40 / 16) = 3 slabs: 3 per-CPU slabs, no
    # empty node slab, whatever the 4 CPUs could hold
    assert _memory_61(4, 8, [40]) == 8 * 256 + 3 * 4096 == 14336
    # one CPU: 3.4 per-CPU slabs; 80 objects touch 5 slabs, leaving 1.6 of the node's 5
    assert _memory_61(1, 8, [math.inf]) == pytest.approx(8 * 256 + (per_cpu + 5) * 4096)
    assert _memory_61(1, 8, [80]) == pytest.approx(8 * 256 + 5 * 4096)
    # a slab's worth of objects on top of the retained ones is packed
    assert _memory_61(1, 8 + 16, [math.inf]) - _memory_61(1, 8, [math.inf]) == 16 * 256


def test_dump_traffic_is_the_larger_net_change_of_objects_and_slab_objects():
    assert predict.dump_traffic({"objects": 100, "total_objects": 128},
                          {"objects": 90, "total_objects": 160}) == 32
    assert predict.dump_traffic({"objects": 16, "total_objects": 16},
                          {"objects": 40, "total_objects": 16}) == 24
    assert predict.dump_traffic({"objects": 5, "total_objects": 16},
                          {"objects": 5, "total_objects": 16}) == 0


def _mem_row(cand, topo, cache, pred, meas, status="ok", target="guest"):
    return {**{k: None for k in schema.ROW_SCHEMA}, "task": 0, "candidate": cand, "topology": topo,
            "target": target, "status": status, "cache": cache, "field": schema.MEMORY_FIELD,
            "predicted": float(pred), "measured": float(meas), "comparable": True}


def test_report_memory_figure_is_the_workload_caches_and_all_driven_is_secondary():
    rows = schema.frame([
        _mem_row("a", "t1", "skbuff_head_cache", 110, 100),
        _mem_row("a", "t1", "dentry", 300, 100),
        _mem_row("a", "t2", "kmalloc-cg-512", 80, 100),      # kmalloc-512's accounted twin
        _mem_row("a", "t2", "kmalloc-512", 100, 100),
        _mem_row("a", "t3", "dentry", 150, 100),              # no workload cache: listed
        _mem_row("a", "t4", "skbuff_head_cache", 1, 100, target="native"),
    ])
    wl = {"skbuff_head_cache", "kmalloc-512", "kmalloc-cg-512"}
    assert report.accounted_twin("kmalloc-512") == "kmalloc-cg-512"
    assert report.accounted_twin("kmalloc-cg-512") is None \
        and report.accounted_twin("dentry") is None
    m = report.memory(rows, wl)
    # t1: skbuff only, +10%; t2: (80 + 100 - 200) / 200 = -10%
    assert m["pairs"] == 2
    assert m["median_rel_err"] == pytest.approx(0.10)
    assert m["signed_err"]["min"] == pytest.approx(-0.10)
    assert m["signed_err"]["max"] == pytest.approx(0.10)
    assert m["over_predicted_pairs"] == 1
    assert m["workload_caches_with_rows"] == ["kmalloc-512", "kmalloc-cg-512", "skbuff_head_cache"]
    assert m["pairs_without_workload_caches"] == [{"candidate": "a", "topology": "t3"}]
    # secondary: every driven cache; t1 (410 - 200) / 200, t2 -10%, t3 +50%
    a = m["all_driven"]
    assert a["pairs"] == 3 and a["median_rel_err"] == pytest.approx(0.5)
    assert a["signed_err"]["max"] == pytest.approx(1.05)


def test_report_reads_workload_caches_and_memoryless_topologies_from_the_spec():
    text = validate_spec.load_spec("validate_quick").text
    assert report.workload_caches(text) == {"skbuff_head_cache", "kmalloc-512", "kmalloc-cg-512"}
    assert report.memoryless_topologies(text) == {"memoryless-4x2"}
    d = report.distribution([0.3, -0.1, 0.2, float("nan"), 0.5])
    assert d == {"n": 4, "min": -0.1, "q1": pytest.approx(0.125), "median": pytest.approx(0.25),
                 "q3": pytest.approx(0.35), "max": 0.5}
    assert report.distribution([]) is None


def test_validate_quick_spec_has_four_small_topologies_one_memoryless():
    spec = validate_spec.load_spec("validate_quick")
    topos = [t.topology for t in spec.fleet.topologies]
    assert len(topos) == 4
    assert all(t.present <= 4 for t in topos)
    assert sum(1 for t in topos if t.memoryless_nodes and t.cpus_on_memoryless_nodes) == 1
    assert spec.workloads and spec.workloads[0].mode == "hackbench"


def test_validate_quick_boots_each_pair_three_times_and_small_spec_once():
    assert validate_spec.load_spec("validate_quick").boots == 3
    assert validate_spec.parse_spec(SMALL_SPEC, "small").boots == 1


def test_memory_over_boots_is_the_median_per_cache_of_the_boots_that_drove_it():
    def mem(cache, pred, meas):
        return {**{k: None for k in schema.ROW_SCHEMA}, "cache": cache,
                "field": schema.MEMORY_FIELD,
                "predicted": float(pred), "measured": float(meas), "note": "n"}

    one = [mem("skbuff_head_cache", 100, 90)]
    assert kernel_tasks.median_over_boots([one], 1) == one          # one boot: rows as they are
    boots = [[mem("skbuff_head_cache", 100, 8192), mem("dentry", 10, 4096)],
             [mem("skbuff_head_cache", 104, 16384)],
             [mem("skbuff_head_cache", 102, 12288), mem("dentry", 12, 8192)]]
    out = {r["cache"]: r for r in kernel_tasks.median_over_boots(boots, 3)}
    assert set(out) == {"skbuff_head_cache", "dentry"}
    skb, den = out["skbuff_head_cache"], out["dentry"]
    assert (skb["measured"], skb["predicted"]) == (12288.0, 102.0)
    assert skb["note"].startswith("median of 3 of 3 boots (measured 8192, 16384, 12288)")
    # driven in two of the three boots: the median of those two
    assert (den["measured"], den["predicted"]) == (6144.0, 11.0)
    assert den["note"].startswith("median of 2 of 3 boots")
    # a pair whose later boots failed: one good boot of 3 is still marked as such
    assert kernel_tasks.median_over_boots([one], 3)[0]["note"].startswith("median of 1 of 3 boots")


def test_plan_always_includes_baseline_and_host_only_runs_it():
    spec = validate_spec.load_spec("validate_quick")
    cands = candidates.with_baseline(candidates.parse_candidates(
        {"candidate": [{"id": "a", "boot": {"slab_max_order": 2}}]}, "t"))
    assert [c.id for c in cands] == ["baseline", "a"]
    assert cands[1].boot == {"slub_max_order": 2}      # canonical spelling
    tasks = plan.plan_tasks(cands, spec, ("guest", "host"))
    guest = [t for t in tasks if t.target == "guest"]
    host = [t for t in tasks if t.target == "host"]
    assert len(guest) == 2 * 4
    assert {(t.candidate.id, t.topology) for t in host} == {("baseline", "host")}
    assert [t.index for t in tasks] == list(range(len(tasks)))


@pytest.mark.parametrize("name, text, field", [
    ("bad.toml", "[[candidate]\nid = 1", "not valid TOML"),
    ("bad.json", "{\"candidate\": [", "not valid JSON"),
    ("unknown.toml", "[[candidate]]\nid = \"a\"\ncolour = 1", "candidate[0].colour"),
    ("knob.toml", "[[candidate]]\nid = \"a\"\nknobs = { min_partial_lo = 99 }",
     "candidate[0].knobs.min_partial_lo"),
    ("noknob.toml", "[[candidate]]\nid = \"a\"\nknobs = { frobnicate = 1 }",
     "candidate[0].knobs.frobnicate"),
    ("dup.json", json.dumps([{"id": "a"}, {"id": "a"}]), "candidate[1].id"),
    ("reserved.toml", "[[candidate]]\nid = \"baseline\"", "candidate[0].id"),
    ("range.toml", "[[candidate]]\nid = \"a\"\nboot = { slub_max_order = 11 }",
     "candidate[0].boot"),
    ("empty.toml", "", "at least one [[candidate]]"),
])
def test_malformed_candidate_file_is_one_line(tmp_path, capsys, name, text, field):
    f = tmp_path / name
    f.write_text(text)
    rc, out, err = _cli(["validate", "--candidate", str(f), "--topologies", "validate_quick",
                         "--target", "host", "--out", str(tmp_path / "runs")], capsys)
    assert rc == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("slabtune: error: ")
    assert field in lines[0]
    assert not (tmp_path / "runs").exists()


def test_disallowed_boot_parameter_refused_before_anything_runs(tmp_path, capsys):
    f = tmp_path / "c.toml"
    f.write_text("[[candidate]]\nid = \"dbg\"\nboot = { slub_debug = 1 }\n")
    rc, _, err = _cli(["validate", "--candidate", str(f), "--topologies", "validate_quick",
                       "--target", "guest", "--out", str(tmp_path / "runs")], capsys)
    assert rc == 2
    assert "slub_debug" in err and "not allowed" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "runs").exists()


@needs_guest
def test_spelling_the_guest_kernel_lacks_is_refused_before_qemu(tmp_path):
    """slab_max_order is a v6.8+ alias: fine in a candidate file, refused for the 6.1 guest
    by the preflight, before the run directory (and so any task) exists."""
    from slabtune.kernel import guest as qemu_guest

    prof = qemu_guest.kernel_profile(qemu_guest.find_assets().kernel)
    if "slab" in prof.boot_param_prefixes:
        pytest.skip(f"guest kernel {prof.name} accepts slab_* names")
    cands = candidates.parse_candidates(
        {"candidate": [{"id": "a", "boot": {"slab_max_order": 1}}]}, "t")
    # the file parser canonicalises to slub_*; a spelling check happens on the raw names
    assert cands[0].boot == {"slub_max_order": 1}
    bad = candidates.Candidate("raw", {"slab_max_order": 1})
    with pytest.raises(SlabtuneError, match="candidate raw: boot parameter 'slab_max_order'"):
        dispatch.validate([bad], validate_spec.load_spec("validate_quick"), ("guest",),
                          out_dir=tmp_path / "runs")
    assert not (tmp_path / "runs").exists()


def test_report_refuses_a_sweep_run(tmp_path, capsys):
    run = store.create_run(tmp_path, spec={"name": "s", "chunk_size": 1, "evaluator": "x"},
                           spec_hash="0" * 16, spec_text="", n_chunks=0, columns=[],
                           versions={}, git_revision=None)
    rc, _, err = _cli(["validate", "report", str(run.path), "--out", str(tmp_path)], capsys)
    assert rc == 2 and "is not a validation run" in err


# --------------------------------------------------------------------------- real runs


@pytest.fixture(scope="module")
def guest_run(ray_local, tmp_path_factory):
    """The baseline and one candidate on a memoryless 2-CPU guest, and the host."""
    tmp = tmp_path_factory.mktemp("validate")
    spec = validate_spec.parse_spec(SMALL_SPEC, "small")
    cf = tmp / "cands.toml"
    cf.write_text(CANDIDATES)
    cands = candidates.load_candidate_file(cf)
    res = dispatch.validate(cands, spec, ("guest", "host"), out_dir=tmp / "runs")
    return res


@pytest.mark.guest
@pytest.mark.ray
@pytest.mark.slow
@needs_guest
def test_guest_and_host_rows_match_the_model(guest_run):
    res = guest_run
    assert res.tasks == 3 and res.failed == 0
    run = store.open_run(res.run_dir)
    assert run.complete and schema.is_validate_run(run)
    rows = run.collect()
    assert set(rows["status"]) == {"ok"}
    for (cand, target), g in rows.group_by("candidate", "target"):
        s = g.filter(pl.col("field").is_in(list(schema.STRUCTURAL_FIELDS)) & pl.col("comparable"))
        assert s.height > 300, (cand, target)
        # every structural field of every comparable cache: predicted == measured
        bad = s.filter(pl.col("predicted") != pl.col("measured"))
        assert bad.is_empty(), bad.head(5)
    guest = rows.filter(pl.col("target") == "guest")
    assert set(guest["topology"]) == {"memoryless-2x2"}
    assert set(guest["kernel_release"].str.slice(0, 2)) == {"6."}
    order = guest.filter((pl.col("field") == "order") & pl.col("comparable"))
    # the candidate's slub_max_order=1 reached the kernel; the baseline has higher orders
    assert order.filter(pl.col("candidate") == "order1")["measured"].max() <= 1
    assert order.filter(pl.col("candidate") == "baseline")["measured"].max() >= 2
    p = json.loads(guest.filter(pl.col("candidate") == "order1")["params"][0])
    assert p == {"slub_max_order": 1, "slub_min_objects": 8, "min_partial_lo": 3}
    applied = json.loads(guest.filter(pl.col("candidate") == "order1")["applied"][0])
    assert applied["boot"] == {"slub_max_order": 1, "slub_min_objects": 8}
    assert applied["not_applied"] == {"min_partial_lo": 3}


@pytest.mark.guest
@pytest.mark.ray
@pytest.mark.slow
@needs_guest
def test_guest_memory_and_cost_rows(guest_run):
    rows = store.open_run(guest_run.run_dir).collect().filter(pl.col("target") == "guest")
    # hackbench over sockets drives skbuff_head_cache.  A cache is compared when its counts
    # moved between the dumps; hackbench frees every skb it sends, so in one boot the
    # after-dump's counts can land on the before-dump's (seen once in a CI run), and the
    # memory row of that boot is then missing: asked of either guest, not of each.
    skb = rows.filter((pl.col("field") == schema.MEMORY_FIELD)
                      & (pl.col("cache") == "skbuff_head_cache"))
    assert skb.height >= 1
    for cand in ("baseline", "order1"):
        r = rows.filter(pl.col("candidate") == cand)
        mem = r.filter(pl.col("field") == schema.MEMORY_FIELD)
        assert mem.height >= 1
        orders = dict(r.filter(pl.col("field") == "order").select("cache", "measured").iter_rows())
        for c, m, pred, note in mem.select("cache", "measured", "predicted", "note").iter_rows():
            slab = 4096 << int(orders[c])
            assert m > 0 and m % slab == 0, c        # whole slabs of the measured order
            assert pred > 0
            # live objects: the count after flush_all(), which leaves out the free objects
            # that sat on per-CPU slabs; the after-dump's slabs are the measured bytes
            live = int(note.split("live objects ")[1].split(" ")[0])
            after = int(note.split("after-dump objects ")[1].split(",")[0])
            slabs = int(note.split(", slabs ")[1])
            node_partial = int(note.split("node partial slabs ")[1].split(",")[0])
            assert "(flushed)" in note and m == slabs * slab
            assert 0 <= node_partial <= slabs
            if c == "skbuff_head_cache":
                # every skb hackbench sent was freed; free objects left on the CPU slabs
                # counted in the after-dump's objects, not after the flush
                assert live < after
            churned = c in report.workload_caches(SMALL_SPEC)
            assert ("workload cache, churned on every CPU" in note) == churned
            assert ("traffic >= " in note) != churned
        cost = r.filter(pl.col("field") == schema.COST_FIELD)
        assert cost.height == 1 and cost["measured"][0] > 0 and cost["predicted"][0] > 0
        acc = cost["accelerator"][0]
        assert cost["comparable"][0] == (acc == "kvm")


@pytest.mark.guest
@pytest.mark.ray
@pytest.mark.slow
@needs_guest
def test_report_json_recomputed_from_rows(guest_run, capsys):
    rc, out, _ = _cli(["validate", "report", str(guest_run.run_dir), "--json"], capsys)
    assert rc == 0
    rep = json.loads(out)
    for key in ("structural_match_rate", "spearman_time", "speed_source",
                "median_mem_rel_err", "native_fastpath_max_abs_diff_pp", "pairs"):
        assert key in rep
    rows = pl.concat([pl.read_parquet(p) for p in sorted(Path(guest_run.run_dir)
                                                         .glob("part-*.parquet"))])
    s = [r for r in rows.iter_rows(named=True) if r["target"] == "guest" and r["comparable"]
         and r["field"] in schema.STRUCTURAL_FIELDS]
    assert rep["structural_match_rate"] == sum(r["predicted"] == r["measured"] for r in s) / len(s)
    assert rep["structural_match_rate"] == 1.0
    wl = report.workload_caches(SMALL_SPEC)
    for caches, fig in ((wl, rep), (None, rep["memory"]["all_driven"])):
        sums: dict = {}
        for r in rows.iter_rows(named=True):
            if (r["target"] == "guest" and r["field"] == schema.MEMORY_FIELD
                    and (caches is None or r["cache"] in caches)):
                p, m = sums.get((r["candidate"], r["topology"]), (0.0, 0.0))
                sums[(r["candidate"], r["topology"])] = (p + r["predicted"], m + r["measured"])
        errs = [abs(p - m) / m for p, m in sums.values()]
        key = "median_mem_rel_err" if caches is wl else "median_rel_err"
        assert fig[key] == pytest.approx(statistics.median(errs), rel=1e-12)
    assert rep["memory_pairs"] == 2 and rep["memory"]["pairs_without_workload_caches"] == []
    accels = set(rows.filter(pl.col("target") == "guest")["accelerator"])
    if accels == {"tcg"}:
        # TCG timings do not count and there is no native run here
        assert rep["speed_source"] is None and rep["spearman_time"] is None
        assert rep["speed"]["guest_tcg_pairs"] == 2
    assert rep["native_fastpath_max_abs_diff_pp"] is None
    assert len(rep["pairs"]) == 3 and rep["failed"] == 0
    host = [p for p in rep["pairs"] if p["target"] == "host"][0]
    assert host["candidate"] == "baseline" and host["structural_total"] > 100
    assert host["structural_matched"] == host["structural_total"]
    assert not math.isnan(rep["median_mem_rel_err"])
    rc, text, _ = _cli(["validate", "report", str(guest_run.run_dir)], capsys)
    assert rc == 0 and "structural (guest snapshots): " in text and "100.0%" in text


@pytest.mark.guest
@pytest.mark.ray
@pytest.mark.slow
@needs_guest
def test_failing_task_is_recorded_with_its_console_tail(ray_local, tmp_path, capsys):
    spec_text = SMALL_SPEC.replace("timeout_s = 240", "timeout_s = 1").replace(
        "retries = 1", "retries = 0")
    f = tmp_path / "spec.toml"
    f.write_text(spec_text)
    cf = tmp_path / "none.json"
    cf.write_text(json.dumps({"candidate": [{"id": "order2", "boot": {"slub_max_order": 2}}]}))
    rc, out, _ = _cli(["validate", "--candidate", str(cf), "--topologies", str(f),
                       "--target", "guest", "--out", str(tmp_path / "runs"), "--json"], capsys)
    assert rc == 1
    res = json.loads(out)
    assert res["tasks"] == 2 and res["failed"] == 2
    run = store.open_run(res["run_dir"])
    assert run.complete                       # failed tasks are stored, not dropped
    rows = run.collect()
    assert rows.height == 2 and set(rows["status"]) == {"failed"}
    assert set(rows["candidate"]) == {"baseline", "order2"}
    for r in rows.iter_rows(named=True):
        assert r["error"].startswith("timed out after")
        assert isinstance(r["console_tail"], str)
        assert r["attempts"] == 1
    states = [run.manifest["chunks"]["states"][str(i)] for i in range(2)]
    assert {s["status"] for s in states} == {"failed"}
    rep = report.report(run)
    assert [t["candidate"] for t in rep["failed_tasks"]] == ["baseline", "order2"]
    assert rep["structural_match_rate"] is None
    assert all(p["status"] == "failed" and p["error"] for p in rep["pairs"])


@pytest.mark.slow
def test_top_k_candidates_from_a_study():
    from slabtune.results import pareto
    from slabtune.tuner import space, study

    spec = study.load_spec("tune_quick")
    runner, _ = study.create_or_resume(spec, "v-test", "memory:")
    runner.run(32, 32)
    cands = candidates.candidates_from_study(runner.study, 3)
    front = pareto.study_pareto(runner.study)
    assert 1 <= len(cands) == min(3, len(front["points"]))
    b = front["baseline"]
    gain = {p["trial"]: (1 - p["memory"] / b["memory"]) + (1 - p["time"] / b["time"])
            for p in front["points"]}
    ranked = sorted(gain, key=lambda t: (-gain[t], t))[:3]
    assert [c.id for c in cands] == [f"trial-{t}" for t in ranked]
    defaults = space.baseline_values(spec.fleet.profile)
    for c in cands:
        assert all(space.KNOBS[k].reach == "boot" and v != defaults[k] for k, v in c.boot.items())
        assert all(space.KNOBS[k].reach != "boot" for k in c.knobs)
    with pytest.raises(SlabtuneError, match="--top"):
        candidates.candidates_from_study(runner.study, 0)


_NATIVE_WHY = plan.native_available()
needs_native = pytest.mark.skipif(_NATIVE_WHY is not None,
                                  reason=f"native target unavailable ({_NATIVE_WHY})")

NATIVE_SPEC = SMALL_SPEC + """
[[fleet.topology]]
name = "smp-2"
cpus = 2

[validate.native]
cache = "kmalloc-512"
steps = 400
timing_steps = 20000
timing_repeats = 3
calibration_runs = 8
workload = { kind = "local", live = 32, burst = 16, drain = "eager" }
"""


@pytest.mark.ray
@pytest.mark.slow
@needs_native
def test_native_rows_and_speed_figures(ray_local, tmp_path):
    """Baseline and one candidate whose sysfs knobs reach the native allocator, on two
    topologies: fast-path fractions from the binary's counters against the model's, the
    measured ns per op beside the modelled one, and the report's native figures."""
    spec = validate_spec.parse_spec(NATIVE_SPEC, "native")
    cands = candidates.parse_candidates({"candidate": [
        {"id": "mp", "boot": {"slub_max_order": 1},
         "knobs": {"min_partial_lo": 1, "min_partial_hi": 1, "cpu_partial_256": 8,
                   "order_objects_mul": 2}}]}, "t")
    res = dispatch.validate(cands, spec, ("native",), out_dir=tmp_path / "runs")
    assert res.tasks == 4 and res.failed == 0
    run = store.open_run(res.run_dir)
    rows = run.collect()
    assert set(rows["field"]) == {"native_cost", "native_cost_packaged", "native_cost_prior",
                                  "alloc_fastpath_pct", "free_fastpath_pct"}
    # the packaged-table and prior-constant rows are labelled diagnostics, never counted;
    # all three share the measurement: the median of 3 interleaved runs of timed calls
    prior = rows.filter(pl.col("field") == "native_cost_prior")
    packaged = rows.filter(pl.col("field") == "native_cost_packaged")
    cost = rows.filter(pl.col("field") == "native_cost")
    assert not prior["comparable"].any() and not packaged["comparable"].any()
    assert cost["comparable"].all()
    for _key, g in rows.filter(pl.col("field").str.starts_with("native_cost")).group_by(
            "candidate", "topology"):
        assert g.height == 3 and g["measured"].n_unique() == 1
        note = g["note"][0]
        runs = [float(x) for x in note.split("; runs ")[1].split(";")[0].split(", ")]
        assert len(runs) == 3 and "3 interleaved runs x 20000 steps" in note
        assert g["measured"][0] == pytest.approx(statistics.median(runs), abs=0.06)
    mp = rows.filter(pl.col("candidate") == "mp")
    applied = json.loads(mp["applied"][0])
    # kmalloc-512: min_partial clamp(ilog2(512) / 2, 1, 1) = 1; cpu_partial 8 objects
    assert applied["applied"] == {"slub_max_order": 1, "min_partial": 1, "cpu_partial": 8}
    assert applied["not_applied"] == {"order_objects_mul": 2}
    for r in rows.iter_rows(named=True):
        assert r["measured"] > 0 and r["predicted"] > 0
        if r["field"].endswith("_pct"):
            assert 0 <= r["measured"] <= 100 and 0 <= r["predicted"] <= 100
    rep = report.report(run)
    assert rep["speed_source"] == "native"
    assert rep["spearman_time"] == pytest.approx(
        report.spearman(cost["predicted"].to_list(), cost["measured"].to_list()))
    lab = rep["speed"]["native_labelled"]
    assert lab["memoryless_topologies"] == ["memoryless-2x2"]
    # without the memoryless topology two pairs remain: too few for a rank correlation
    assert lab["without_memoryless"] == {"spearman": None, "pairs": 2}
    assert lab["prior_constants"]["pairs"] == 4
    assert lab["prior_constants"]["spearman"] == pytest.approx(
        report.spearman(prior["predicted"].to_list(), prior["measured"].to_list()))
    assert lab["packaged_constants"]["spearman"] == pytest.approx(
        report.spearman(packaged["predicted"].to_list(), packaged["measured"].to_list()))
    # the rig table is stored with the run and re-derived by the report: the native
    # figure's predictions are the stored calibration's constants times each pair's
    # features, fitted on 8 configurations none of which is a pair's
    stored = run.manifest["native_rig"]
    rig = json.loads(json.dumps(rep, default=str))["native_rig"]
    assert rig["constants"] == stored["constants"] and rig["runs"] == 8
    assert rig["r2"] == pytest.approx(stored["r2"], abs=1e-9)
    assert len(rig["calibration"]) == 8
    assert all(c["fitted"] == pytest.approx(s["fitted"]) and c["measured"] == s["measured"]
               for c, s in zip(rig["calibration"], stored["calibration"]))
    assert {"sheaf_swap_ns", "barn_lock_hold_ns"} <= set(rig["not_identified"])
    text = report.format_report(rep)
    assert "rig cost table (native figure): R^2" in text and "packaged (server)" in text
    assert "under the rig cost table" in rep["sources"]["spearman_time"]
    # a run stored before the rig table ranked the packaged table, and says so
    del run.manifest["native_rig"]
    assert "before the rig cost table" in report.report(run)["sources"]["spearman_time"]
    fp = rows.filter(pl.col("field").str.ends_with("_pct"))
    assert rep["native_fastpath_max_abs_diff_pp"] == pytest.approx(
        max(abs(p - m) for p, m in zip(fp["predicted"], fp["measured"])))
    assert rep["structural_match_rate"] is None and rep["median_mem_rel_err"] is None


@pytest.mark.parametrize("patch, field", [
    (("timeout_s = 240", "timeout_s = -1"), "validate.timeout_s"),
    (("retries = 1", "retries = 9"), "validate.retries"),
    (("retries = 1", "retries = 1\nboots = 0"), "validate.boots"),
    (("retries = 1", "retries = 1\nboots = 10"), "validate.boots"),
    (("retries = 1", "retries = 1\nboots = \"3\""), "validate.boots"),
    (("loops = 50", "loops = 0"), "validate.workload[0]"),
    (("[fleet]", "[validate.native]\ncache = \"dentry\"\n[fleet]"), "validate.native.cache"),
    (("[fleet]", "[validate.native]\nsteps = 0\n[fleet]"), "validate.native.steps"),
    (("[fleet]", "[validate.native]\ncalibration_runs = 1\n[fleet]"),
     "validate.native.calibration_runs"),
    (("cpus = 2", "cpus = 300"), "fleet.topology memoryless-2x2"),
])
def test_bad_validation_spec_names_the_field(tmp_path, capsys, patch, field):
    f = tmp_path / "spec.toml"
    f.write_text(SMALL_SPEC.replace(*patch))
    cf = tmp_path / "c.toml"
    cf.write_text(CANDIDATES)
    rc, _, err = _cli(["validate", "--candidate", str(cf), "--topologies", str(f),
                       "--target", "host", "--out", str(tmp_path / "runs")], capsys)
    assert rc == 2 and len(err.strip().splitlines()) == 1
    assert field in err
    assert not (tmp_path / "runs").exists()


@needs_native
def test_native_workload_that_cannot_run_on_a_topology_is_refused_up_front(tmp_path):
    spec = validate_spec.parse_spec(NATIVE_SPEC.replace('kind = "local", live = 32, burst = 16',
                                            'kind = "producer_consumer", depth = 8').replace(
        "cpus = 2\n\n[validate", "cpus = 1\n\n[validate"), "n")
    with pytest.raises(SlabtuneError, match=r"baseline \(native, smp-2\)"
                                            r".*validate.native.workload"):
        dispatch.validate([], spec, ("native",), out_dir=tmp_path / "runs")
    assert not (tmp_path / "runs").exists()


# --------------------------------------------------------------------------- --spread


def _front(n: int) -> list[dict]:
    """A synthetic Pareto front of n points: memory rises with the index, time falls."""
    return [{"trial": 100 - i, "memory": 1.0 + i, "time": 50.0 - i} for i in range(n)]


@pytest.mark.parametrize("n, k", [(9, 3), (10, 4), (7, 7), (5, 2), (100, 6)])
def test_spread_pick_takes_both_extremes_and_spaces_the_rest_evenly(n, k):
    front = _front(n)
    picked = candidates.spread_pick(list(reversed(front)), k)
    by_mem = sorted(front, key=lambda p: p["memory"])
    pos = [by_mem.index(p) for p in picked]
    assert len(picked) == k and len(set(pos)) == k
    assert pos == sorted(pos) and pos[0] == 0 and pos[-1] == n - 1
    gaps = [b - a for a, b in zip(pos, pos[1:])]
    assert max(gaps) - min(gaps) <= 1          # evenly spaced by rank
    assert candidates.spread_pick(front, 1) == [by_mem[0]]


def test_spread_pick_takes_a_small_front_whole_and_breaks_ties_by_trial():
    front = _front(3)
    assert candidates.spread_pick(front, 5) == sorted(front, key=lambda p: p["memory"])
    twins = [{"trial": 7, "memory": 2.0, "time": 3.0}, {"trial": 4, "memory": 2.0, "time": 3.0}]
    assert [p["trial"] for p in candidates.spread_pick(twins, 1)] == [4]
    with pytest.raises(SlabtuneError, match="--spread"):
        candidates.spread_pick(front, 0)


@pytest.mark.slow
def test_spread_candidates_from_a_study_are_on_the_front_and_deterministic():
    import random

    from slabtune.results import pareto
    from slabtune.tuner import study

    spec = study.load_spec("tune_quick")
    runner, _ = study.create_or_resume(spec, "v-spread", "memory:")
    runner.run(128, 64)
    pts = pareto.study_pareto(runner.study)["points"]
    assert len(pts) >= 4
    cands, size = candidates.spread_candidates(runner.study, 4)
    assert size == len(pts)
    ids = [c.id for c in cands]
    on_front = {f"trial-{p['trial']}": p for p in pts}
    assert len(ids) == 4 == len(set(ids)) and set(ids) <= set(on_front)
    lo_mem = min(pts, key=lambda p: (p["memory"], p["trial"]))
    lo_time = min(pts, key=lambda p: (p["time"], p["trial"]))
    assert {f"trial-{lo_mem['trial']}", f"trial-{lo_time['trial']}"} <= set(ids)
    assert [c.id for c in candidates.spread_candidates(runner.study, 4)[0]] == ids
    shuffled = list(pts)
    random.Random(1).shuffle(shuffled)
    assert [f"trial-{p['trial']}" for p in candidates.spread_pick(shuffled, 4)] == ids
    whole, _ = candidates.spread_candidates(runner.study, len(pts) + 3)
    assert sorted(c.id for c in whole) == sorted(on_front)
    # the same knobs as --top gives for the same trial
    top = {c.id: c for c in candidates.candidates_from_study(runner.study, len(pts))}
    assert all(top[c.id] == c for c in cands)


def test_spread_pick_skips_a_point_whose_key_was_picked_for_the_next_along_the_front():
    front = _front(10)
    by_mem = sorted(front, key=lambda p: p["memory"])
    # positions 0..9 by memory; 1 and 2 validate the same configuration as 0, 5 as 4
    same = {0: "a", 1: "a", 2: "a", 3: "b", 4: "c", 5: "c", 6: "d", 7: "e", 8: "f", 9: "g"}
    key = {p["trial"]: same[i] for i, p in enumerate(by_mem)}
    plain = candidates.spread_pick(front, 4)
    assert [by_mem.index(p) for p in plain] == [0, 3, 6, 9]
    picked = candidates.spread_pick(front, 6, lambda p: key[p["trial"]])
    pos = [by_mem.index(p) for p in picked]
    # plain targets 0, 9, 2, 4, 5, 7: 2 is a's twin -> 3; 5 is c's twin -> 6
    assert pos == [0, 3, 4, 6, 7, 9]
    assert len({key[p["trial"]] for p in picked}) == 6
    # 7 distinct configurations: K = 9 gives all 7, K = 1 the lowest-memory one
    every = candidates.spread_pick(front, 9, lambda p: key[p["trial"]])
    assert len(every) == 7 and len({key[p["trial"]] for p in every}) == 7
    assert candidates.spread_pick(front, 1, lambda p: key[p["trial"]]) == [by_mem[0]]


@pytest.mark.slow
def test_spread_on_a_real_study_gives_distinct_validated_configurations():
    """A real 128-trial study: the picks validate distinct configurations, and a twin of
    every front point (the same trial parameters, a hair more memory) is never picked
    beside its original, while the plain pick does take twins."""
    from slabtune.tuner import study

    spec = study.load_spec("tune_quick")
    runner, _ = study.create_or_resume(spec, "v-distinct", "memory:")
    runner.run(128, 64)
    vspec = validate_spec.load_spec("validate_quick")
    pts = candidates._front_points(runner.study)
    cands = {p["trial"]: c for p, c in zip(pts, candidates._trial_candidates(runner.study, pts))}
    keys = {t: candidates.validated_key(vspec, c) for t, c in cands.items()}
    distinct = len(set(keys.values()))
    picked, size = candidates.spread_candidates(runner.study, 4, vspec)
    assert size == len(pts)
    got = {keys[int(c.id.split("-")[1])] for c in picked}
    assert len(got) == len(picked) == min(4, distinct)
    whole, _ = candidates.spread_candidates(runner.study, size + 3, vspec)
    assert len(whole) == distinct
    twins = [{**p, "trial": 10_000 + p["trial"], "memory": p["memory"] * (1 + 1e-9)}
             for p in pts]

    def key(p):
        return keys[p["trial"] % 10_000]

    k = min(len(pts), 6)
    six = candidates.spread_pick(pts + twins, k, key)
    assert len(six) == len({key(p) for p in six}) == min(k, distinct)
    # asked for every point, the plain pick takes each twin beside its original
    n = 2 * len(pts)
    assert len(candidates.spread_pick(pts + twins, n)) == n
    both = candidates.spread_pick(pts + twins, n, key)
    assert len(both) == len({key(p) for p in both}) == distinct


@pytest.mark.parametrize("argv, field", [
    (["--spread", "0"], "--spread"),
    (["--spread", "-2"], "--spread"),
    (["--top", "2", "--spread", "2"], "--spread"),
    (["--top", "0"], "--top"),
])
def test_bad_spread_is_one_line_before_anything_runs(tmp_path, capsys, argv, field):
    rc, out, err = _cli(["validate", "--study", "none", "--storage",
                         f"sqlite:///{tmp_path / 'none.db'}", "--topologies", "validate_quick",
                         "--target", "host", "--out", str(tmp_path / "runs"), *argv], capsys)
    assert rc == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"slabtune: error: {field}:")
    assert not (tmp_path / "runs").exists() and not (tmp_path / "none.db").exists()


def test_spread_with_a_candidate_file_is_refused(tmp_path, capsys):
    f = tmp_path / "c.toml"
    f.write_text(CANDIDATES)
    rc, out, err = _cli(["validate", "--candidate", str(f), "--spread", "2", "--topologies",
                         "validate_quick", "--target", "host"], capsys)
    assert rc == 2 and err.strip().startswith("slabtune: error: --spread: only with --study")

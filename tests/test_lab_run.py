"""``slabtune lab run``: a simulation config on the real allocator beside the model.

Fast tests check the arithmetic of both sides (measured figures from a lab boot's dumps,
the model's counters per 1000 ops, the store rows, the report) and the bad-input paths;
the slow ``guest`` tests boot the lab kernels under qemu.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

from slabtune.errors import SlabtuneError
from slabtune.kernel import build, lab_boot, labmod
from slabtune.validate import lab

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples" / "lab"

CONFIG = """
[topology]
cpus = 4
nodes = 2
memoryless_nodes = [1]

[cache]
name = "kmalloc-512"

[policy]
profile = "v6.1"

[workload]
kind = "producer_consumer"
depth = 16
drain = "eager"

[run]
steps = 1500
seed = 2
"""


def _result(**kw) -> lab_boot.LabBootResult:
    base = dict(ok=True, error="", kernel="k", release="6.1.192", cache="kmalloc-512",
                files=[], dumps={"base": {}, "before": {}, "after": {}}, missing=[],
                samples=[], done=None, workers=[], module_errors=[], insmod_rc=0, params=[],
                qemu_argv=[], accel="tcg", seconds=1.0, console_tail="")
    base.update(kw)
    return lab_boot.LabBootResult(**base)


def test_measure_reads_the_kernel_counters_as_the_model_names_them():
    """Fractions from alloc/free fast and slow paths, new slabs per 1000 of the module's
    ops, and memory as the mean sampled slab count above the pre-run count times the slab
    size (order 1: 8 KiB)."""
    before = {"alloc_fastpath": "100 C0=100", "alloc_slowpath": "10 C0=10",
              "free_fastpath": "5 C1=5", "free_slowpath": "0", "alloc_slab": "3 C0=3",
              "slabs": "20 N0=20", "order": "1"}
    after = {"alloc_fastpath": "1000 C0=600 C2=400", "alloc_slowpath": "110 C0=110",
             "free_fastpath": "205 C1=205", "free_slowpath": "900 C1=900",
             "alloc_slab": "23 C0=23", "slabs": "21 N0=21", "order": "1",
             "object_size": "512"}
    r = _result(dumps={"base": before, "before": before, "after": after},
                samples=["30 N0=30", "40 N0=30 N1=10", "bad"],
                done={"allocs": 1000, "frees": 1000, "status": 0})
    m = lab_boot.measure(r)
    assert m["alloc_fastpath_frac"] == pytest.approx(900 / 1000)
    assert m["free_fastpath_frac"] == pytest.approx(200 / 1100)
    assert m["ops"] == 2000
    assert m["slab_allocs_per_kop"] == pytest.approx(1000 * 20 / 2000)
    assert m["samples"] == 2
    assert m["memory_bytes"] == pytest.approx((35 - 20) * 8192)
    assert m["peak_slabs"] == 20
    # only SLUB_STATS files are counters; structure files (slabs, order) are not
    assert m["counters"] == {"alloc_fastpath": 900, "alloc_slowpath": 100, "free_fastpath": 200,
                             "free_slowpath": 900, "alloc_slab": 20}
    # the same window per CPU: only the CPUs (and counters) that moved
    assert m["counters_per_cpu"] == {"alloc_fastpath": {"0": 500, "2": 400},
                                     "alloc_slowpath": {"0": 100}, "free_fastpath": {"1": 200},
                                     "free_slowpath": {"1": 900}, "alloc_slab": {"0": 20}}
    # an unsampled run has no memory figure rather than a wrong one
    assert lab_boot.measure(_result(dumps=r.dumps, done=r.done))["memory_bytes"] is None


def test_a_warmed_run_counts_from_the_window_dump():
    """With a warm-up, counters count from the ``window`` dump (taken while the workers
    were parked after their warm-up ops), ops exclude the warm-up's, and memory averages
    the samples taken after the window opened; the pre-run slabs stay the base."""
    before = {"alloc_slab": "0", "alloc_fastpath": "0", "slabs": "2 N0=2", "order": "0"}
    window = {"alloc_slab": "15 C0=15", "alloc_fastpath": "700 C0=700", "slabs": "17"}
    after = {"alloc_slab": "16 C0=16", "alloc_fastpath": "3000 C0=3000", "slabs": "3",
             "order": "0"}
    text = "\n".join(["@@LAB S tok", "@@LAB P 0 9", "@@LAB P 1 17",
                      *[f"@@LAB C window {k} {v}" for k, v in window.items()],
                      "@@LAB N window", "@@LAB I window_sample 1", "@@LAB R resume 0",
                      "@@LAB P 2 17", "@@LAB P 3 19", "@@LAB E tok"])
    parsed = lab_boot.parse_console(text, "tok")
    assert parsed["window_at"] == 2 and parsed["dumps"]["window"] == window
    r = _result(dumps={"base": before, "before": before, "window": window, "after": after},
                samples=parsed["samples"], window_at=parsed["window_at"],
                done={"allocs": 1500, "frees": 1500, "warm_allocs": 400, "warm_frees": 350,
                      "warmup": 100, "window": 1, "status": 0})
    m = lab_boot.measure(r)
    assert m["ops"] == 3000 - 750 and m["warmup_ops"] == 750
    assert m["counters"]["alloc_slab"] == 1
    assert m["counters_per_cpu"] == {"alloc_slab": {"0": 1}, "alloc_fastpath": {"0": 2300}}
    assert m["slab_allocs_per_kop"] == pytest.approx(1000 / 2250)
    assert m["memory_bytes"] == pytest.approx((18 - 2) * 4096)
    # a window the 50 ms sampler never saw (a loaded host) counts its starting dump's slabs
    short = _result(dumps=r.dumps, samples=parsed["samples"][:2], window_at=2, done=r.done)
    assert lab_boot.measure(short)["samples"] == 1
    assert lab_boot.measure(short)["memory_bytes"] == pytest.approx((17 - 2) * 4096)
    # without a window dump the run counts from ``before`` as a run without warm-up does
    r0 = _result(dumps={"base": before, "before": before, "after": after},
                 done={"allocs": 1500, "frees": 1500, "status": 0})
    assert lab_boot.measure(r0)["counters"]["alloc_slab"] == 16


def test_a_slab_run_measures_slabinfo():
    """On SLAB (no SLUB_STATS) memory is the window's mean num_slabs over the pre-run
    count times pagesperslab pages, active objects likewise; the fast paths and slab
    allocations are None, the structure is the end's slabinfo line."""
    line = "{} {} 3000 5 4 : tunables 24 12 8 : slabdata {} {} 0"
    r = _result(cache="slabtune_lab", missing=["base", "before"],
                dumps={"base": {}, "before": {},
                       "window": {"slabinfo": line.format(40, 50, 10, 10)},
                       "after": {"slabinfo": line.format(30, 60, 12, 12)}},
                samples=["9 A=30 O=45", "10 A=40 O=50", "12 A=50 O=60", "14 A=60 O=70"],
                window_at=2, done={"allocs": 100, "frees": 100, "warm_allocs": 20,
                                   "warm_frees": 15, "warmup": 10, "window": 1})
    m = lab_boot.measure(r)
    assert m["memory_bytes"] == pytest.approx(13 * 4 * 4096)
    assert m["active_objects"] == pytest.approx(55)
    assert m["ops"] == 165 and m["warmup_ops"] == 35 and m["peak_slabs"] == 14
    assert m["structure"] == {"order": 2, "objs_per_slab": 5, "limit": 24, "batchcount": 12,
                              "sharedfactor": 8}
    assert m["slabinfo"]["window"]["slabs"] == 10 and m["slabinfo"]["after"]["objects"] == 30
    assert m["alloc_fastpath_frac"] is None and m["slab_allocs_per_kop"] is None


def test_the_x86_slab_kernel_runs_without_the_numa_mem_id_fix():
    """x86 has no CONFIG_HAVE_MEMORYLESS_NODES (ia64 and powerpc select it in 6.1), so the
    lab's SLAB kernel treats a memoryless node as its CPUs' local node whatever the
    config's memoryless_fallback says: its arrays never hold an object there and node 0's
    shared array fills with the alien frees.  On local-4cpu-ml the model then holds far
    more than with the fix (the kernel held 184 KiB; the model with the fix 64 KiB)."""
    from slabtune.model import profiles

    prof = lab.release_profile("6.1.192" + "-slab")
    assert profiles.is_slab(prof) and prof.memoryless_fallback is False
    assert lab.release_profile("6.1.192").memoryless_fallback is True   # SLUB untouched
    doc = lab.load_config(EXAMPLES / "local-4cpu-ml.toml").doc
    on = dict(doc, policy={"profile": "slab-v6.1", "params": {"memoryless_fallback": True}})
    assert lab.spec_for(on, prof).profile.memoryless_fallback is False
    fixed = profiles.SLAB_PROFILES["slab-v6.1"]
    (x86, with_fix) = lab.predict([(on, prof), (on, fixed)], windows=[True, True])
    assert x86["memory_bytes"] > 2 * with_fix["memory_bytes"]


def test_model_window_leaves_the_start_up_slabs_in_the_warm_up():
    """The model's counted window (validate/lab.py window_counters): on local churn over
    8 CPUs with memory the kernel allocated 8 slabs in the whole run, all at start-up (the
    report card's boots: alloc_slab 8, peak 8); the model's whole run does the same and
    its window after the warm-up allocates none.  Events of the warm-up plus the window
    are the whole run's."""
    from slabtune.kernel import labmod
    from slabtune.model import profiles
    from slabtune.sweeps import simulate

    doc = lab.load_config(EXAMPLES / "local-8cpu-2node.toml").doc
    spec = lab.spec_for(doc, profiles.get_profile("v6.1"))
    w = labmod.warmup_steps(spec.steps)
    assert w == spec.steps // 4
    import dataclasses

    specs = [dataclasses.replace(spec, steps=n) for n in (w, w + spec.steps)]
    _, cfgs, (early, late) = simulate.simulate_specs(specs)
    win = lab.window_counters(early, late, w, w + spec.steps)
    weight = cfgs[0].rep_weight
    assert float((late.slab_alloc * weight).sum()) == 8
    assert float((win.slab_alloc * weight).sum()) == 0
    for name in ("ops", "allocs", "frees", "alloc_fast", "slab_alloc"):
        assert (getattr(early, name) + getattr(win, name) == getattr(late, name)).all()
    # a gauge's window average and the warm-up's make up the whole run's time average
    assert (early.slabs_total * w + win.slabs_total * spec.steps) / (w + spec.steps) \
        == pytest.approx(late.slabs_total, rel=1e-5)
    [p] = lab.predict([(doc, profiles.get_profile("v6.1"))])
    assert p["slab_allocs_per_kop"] == 0


def test_console_samples_are_parsed_in_order():
    text = "\n".join(["@@LAB S tok", "@@LAB P 0 12 N0=12", "noise @@LAB P 1 99",
                      "@@LAB P 1 14 N0=10 N1=4", "@@LAB E tok"])
    parsed = lab_boot.parse_console(text, "tok")
    assert parsed["samples"] == ["12 N0=12", "14 N0=10 N1=4"]


def test_predicted_counters_agree_with_the_models_own_fractions():
    """The per-1000-op counters are the metrics' weighted sums: alloc_fastpath over
    alloc_fastpath + alloc_slowpath is the model's alloc_fastpath_frac, and alloc_slab per
    1000 ops its slab_allocs_per_kop.  On a v7.x profile the sheaf refills and flushes are
    counted in objects, sheaves times capacity, as the kernel's stat_add() does."""
    cfg = lab.parse_config(CONFIG, "t")
    from slabtune.model import profiles

    p61, p71 = lab.predict([(cfg.doc, None), (cfg.doc, profiles.get_profile("v7.1"))])
    for p in (p61, p71):
        c = p["counters_per_kop"]
        frac = c["alloc_fastpath"] / (c["alloc_fastpath"] + c["alloc_slowpath"])
        assert frac == pytest.approx(p["alloc_fastpath_frac"], rel=1e-5)
        assert c["alloc_slab"] == pytest.approx(p["slab_allocs_per_kop"], rel=1e-5)
    assert p61["profile"] == "v6.1" and p71["profile"] == "v7.1"
    assert p61["structure"]["sheaf_capacity"] == 0
    assert p61["counters_per_kop"]["barn_get"] == 0
    cap = p71["structure"]["sheaf_capacity"]
    assert cap > 0
    assert p71["counters_per_kop"]["sheaf_refill"] % cap == pytest.approx(0, abs=1e-3) or \
        (p71["counters_per_kop"]["sheaf_refill"] / cap) > 0


def test_combine_scales_the_model_to_the_measured_ops_and_rows_keep_both():
    cfg = lab.parse_config(CONFIG, "t")
    pred = lab.predict([(cfg.doc, None)])[0]
    measured = {"alloc_fastpath_frac": 0.9, "free_fastpath_frac": 0.0,
                "slab_allocs_per_kop": 12.0, "memory_bytes": 4096.0, "ops": 4000,
                "order": 0, "samples": 3, "peak_slabs": 2,
                "counters": {"alloc_fastpath": 1800, "alloc_slowpath": 200,
                             "free_frozen": 7}}
    rec = {"index": 0, "kernel": "6.1", "ok": True, "error": "", "release": "6.1.192",
           "accelerator": "lab-tcg", "attempts": 1, "seconds": 2.0, "console_tail": "",
           "measured": measured, "cmdline": "console=ttyS0", "module_params": ["kind=x"]}
    full = lab.combine(rec, cfg, pred)
    assert full["predicted"]["counters"]["alloc_fastpath"] == pytest.approx(
        pred["counters_per_kop"]["alloc_fastpath"] * 4)
    assert full["measured"]["counters_per_kop"]["alloc_fastpath"] == pytest.approx(450.0)
    rows = lab.rows_of(full, {"task": 0, "candidate": "t", "topology": "x"})
    df = pl.DataFrame(rows, schema=lab_schema(), orient="row")
    assert set(df["target"]) == {"lab"} and set(df["kernel"]) == {"6.1"}
    assert set(df["config_hash"]) == {cfg.config_hash}
    fr = df.filter(pl.col("field") == "alloc_fastpath_frac").row(0, named=True)
    assert fr["measured"] == 0.9 and fr["predicted"] == pytest.approx(
        pred["alloc_fastpath_frac"])
    # a counter the model has no counterpart for is kept, not compared
    ff = df.filter(pl.col("field") == "counters.free_frozen").row(0, named=True)
    assert ff["measured"] == 7 and ff["predicted"] is None and ff["comparable"] is False
    # a failed run is one failed row with the reason
    bad = lab.combine({**rec, "ok": False, "error": "timed out after 300 s",
                       "measured": None, "console_tail": "Kernel panic"}, cfg, pred)
    (only,) = lab.rows_of(bad, {"task": 0})
    assert only["status"] == "failed" and only["error"] == "timed out after 300 s"
    assert "Kernel panic" in only["console_tail"]


def lab_schema():
    from slabtune.validate.schema import ROW_SCHEMA

    return ROW_SCHEMA


def test_summary_gives_points_for_fractions_and_relative_errors_otherwise():
    rows = []
    for task, (mf, pf, ms, ps) in enumerate([(0.90, 0.95, 10.0, 5.0), (0.50, 0.48, 4.0, 6.0),
                                             (0.70, 0.70, 0.0, 1.0)]):
        for field, m, p in (("alloc_fastpath_frac", mf, pf), ("slab_allocs_per_kop", ms, ps)):
            rows.append({"task": task, "kernel": "6.1", "profile": "v6.1", "target": "lab",
                         "status": "ok", "accelerator": "lab-tcg", "field": field,
                         "measured": m, "predicted": p, "comparable": True})
    rows.append({"task": 9, "kernel": "6.1", "profile": "v6.1", "target": "lab",
                 "status": "failed", "field": "task"})
    df = pl.DataFrame(rows, schema={**lab_schema()}, orient="row") if False else \
        pl.DataFrame([{**{k: None for k in lab_schema()}, **r} for r in rows],
                     schema=lab_schema(), orient="row")
    s = lab.summary(df)
    assert s["sources"] == ["lab-tcg"] and s["failed"] == 1 and s["runs"] == 3
    (k,) = s["by_kernel"]
    a = k["figures"]["alloc_fastpath_frac"]
    assert a["unit"] == "pp" and a["worst"] == pytest.approx(5.0)
    assert a["median"] == pytest.approx(2.0)
    sl = k["figures"]["slab_allocs_per_kop"]
    assert sl["n"] == 2 and sl["median"] == pytest.approx(0.5) and sl["measured_zero"] == 1
    assert any("6.1 (profile v6.1, 3 runs)" in line for line in lab.format_summary(s))


def test_by_kind_groups_the_card_by_kernel_and_workload_kind():
    """lab.by_kind: per (kernel, workload.kind) the median and worst |predicted -
    measured|, points for fractions, relative otherwise (a measured 0 counted apart);
    failed runs left out; format_by_kind prints one Markdown row per group."""
    def rec(kernel, kind, alloc, slabs, ok=True):
        (ma, pa), (ms, ps) = alloc, slabs
        fig = lambda a, s: {"alloc_fastpath_frac": a, "free_fastpath_frac": 0.0,  # noqa: E731
                            "slab_allocs_per_kop": s, "memory_bytes": 4096.0}
        return {"kernel": kernel, "ok": ok, "config": {"doc": {"workload": {"kind": kind}}},
                "measured": fig(ma, ms), "predicted": fig(pa, ps)}
    recs = [rec("6.1", "producer_consumer", (0.90, 0.95), (10.0, 5.0)),
            rec("6.1", "producer_consumer", (0.50, 0.48), (4.0, 6.0)),
            rec("6.1", "producer_consumer", (0.70, 0.70), (0.0, 1.0)),
            rec("6.1", "local", (1.0, 1.0), (2.0, 2.0)),
            rec("7.2", "producer_consumer", (1.0, 0.9), (1.0, 1.0)),
            rec("6.1", "local", (0.0, 1.0), (1.0, 9.0), ok=False)]
    rows = lab.by_kind(recs)
    assert [(r["kernel"], r["kind"], r["runs"]) for r in rows] == [
        ("6.1", "local", 1), ("6.1", "producer_consumer", 3), ("7.2", "producer_consumer", 1)]
    pc = rows[1]["figures"]
    assert pc["alloc_fastpath_frac"]["median"] == pytest.approx(2.0)
    assert pc["alloc_fastpath_frac"]["worst"] == pytest.approx(5.0)
    assert pc["slab_allocs_per_kop"]["median"] == pytest.approx(0.5)   # of 0.5 and 0.5
    assert pc["slab_allocs_per_kop"]["n"] == 2 and pc["slab_allocs_per_kop"]["measured_zero"] == 1
    assert rows[0]["figures"]["alloc_fastpath_frac"]["worst"] == 0.0  # the failed run is out
    lines = lab.format_by_kind(rows)
    assert len(lines) == 2 + 3
    assert lines[3].startswith("| 6.1 | producer_consumer | 3 | 2.0 / 5.0 pp |")
    assert lines[4].startswith("| 7.2 | producer_consumer | 1 | 10.0 / 10.0 pp |")


@pytest.mark.parametrize("patch, field", [
    ('memoryless_fallback = true', "policy.params.memoryless_fallback"),
    ('slub_max_order = 99', "policy.params"),
])
def test_configs_the_lab_cannot_run_are_refused_naming_the_field(patch, field):
    text = CONFIG.replace('profile = "v6.1"', f'profile = "v6.1"\n[policy.params]\n{patch}')
    with pytest.raises(SlabtuneError, match=f"^t: {field}"):
        lab.parse_config(text, "t")


def test_other_lab_refusals():
    with pytest.raises(SlabtuneError, match="^t: cache.name: 'dentry' is not a kmalloc cache"):
        lab.parse_config(CONFIG.replace('"kmalloc-512"', '"dentry"'), "t")
    own = CONFIG.replace('name = "kmalloc-512"', "size = 200").replace(
        'profile = "v6.1"', 'profile = "v6.1"\n[policy.params]\nmin_partial = 3')
    with pytest.raises(SlabtuneError, match="^t: policy.params.min_partial: the lab sets "
                                            "sysfs values on kmalloc caches only"):
        lab.parse_config(own, "t")
    with pytest.raises(SlabtuneError, match="^t: not valid TOML"):
        lab.parse_config("[topology", "t")
    with pytest.raises(lab_boot.LabBootError, match="^--kernel 9.9: neither a lab kernel"):
        lab_boot.resolve_kernel("9.9")
    with pytest.raises(lab_boot.LabBootError, match="is not one of the built lab kernels"):
        lab_boot.resolve_kernel(str(ROOT / "README.md"))


def test_a_slab_config_takes_the_slabinfo_tunables_of_a_kmalloc_cache():
    """A SLAB config's limit, batchcount, shared are what the lab writes: all three, the
    ones it leaves out at the cache's own enable_cpucache() values (kmalloc-512 on 2 CPUs:
    54, 27, 8), as the model's config_from() takes them.  On an own cache (it exists only
    during the run), with a SLUB knob, and a config the kernel would ignore: one line
    naming the field."""
    cfg = lab.parse_config(SLAB_TUNED_CONFIG, "t")
    args = lab.boot_args(cfg.doc)
    assert args["slabinfo"] == {"limit": 12, "batchcount": 4, "shared": 2}
    assert args["sysfs"] == {}
    only = lab.parse_config(SLAB_TUNED_CONFIG.replace("limit = 12\nbatchcount = 4\n", ""),
                            "t")
    assert lab.boot_args(only.doc)["slabinfo"] == {"limit": 54, "batchcount": 27, "shared": 2}
    plain = SLAB_TUNED_CONFIG.replace("limit = 12\nbatchcount = 4\nshared = 2\n", "")
    assert lab.boot_args(lab.parse_config(plain, "t").doc)["slabinfo"] == {}
    for text, msg in (
            (SLAB_TUNED_CONFIG.replace('name = "kmalloc-512"', "size = 300"),
             "policy.params.limit: the lab sets /proc/slabinfo tunables on kmalloc caches"),
            (SLAB_TUNED_CONFIG.replace("shared = 2", "shared = 2\nmin_partial = 3"),
             "policy.params.min_partial: min_partial is a SLUB knob .*profile slab-v6.1"),
            (SLAB_TUNED_CONFIG.replace("shared = 2", "shared = 2\nmemoryless_fallback = true"),
             "policy.params.memoryless_fallback: a model knob the real kernel has no setting"),
            (SLAB_TUNED_CONFIG.replace("limit = 12\n", "").replace("batchcount = 4",
                                                                    "batchcount = 60"),
             "policy.params.batchcount: batchcount 60 is above limit 54"),
            (CONFIG.replace('profile = "v6.1"', 'profile = "v6.1"\n[policy.params]\nlimit = 4'),
             "policy.params.limit: limit is a SLAB knob .*profile v6.1 is SLUB")):
        with pytest.raises(SlabtuneError, match=f"^t: {msg}"):
            lab.parse_config(text, "t")


def test_a_retuned_limit_keeps_the_alien_arrays_enable_cpucache_made():
    """A /proc/slabinfo write re-sizes the per-CPU and shared arrays but not the alien ones:
    setup_kmem_cache_node() (6.1 mm/slab.c) installs the alien arrays it allocates only on
    a node without any, and every node of a live cache has them since its first
    enable_cpucache().  So on two nodes kmalloc-512 keeps 12-entry alien arrays at limit 1
    (alloc_alien_cache() would make 1-entry ones), in the lab's model side too."""
    from slabtune.model import slab
    from slabtune.sweeps import simconfig, simulate

    assert slab.retuned_alien_limit(12, 1) == 12
    assert slab.retuned_alien_limit(1, 54) == 1
    assert slab.retuned_alien_limit(0, 54) == 0
    doc = lab.parse_config(SLAB_TUNED_CONFIG.replace("cpus = 2", "cpus = 4\nnodes = 2")
                           .replace("limit = 12\nbatchcount = 4", "limit = 1\nbatchcount = 1"),
                           "t").doc
    spec = simconfig.parse_doc(doc)
    st = simulate.structure_of(spec)
    assert st.alien_limit == 12
    assert simulate.structure_row(spec, st)["alien_limit"] == 12
    assert int(simulate.sim_config(spec, st).alien_limit) == 12
    assert lab.boot_args(doc)["slabinfo"] == {"limit": 1, "batchcount": 1, "shared": 2}


def test_a_config_of_the_other_allocator_than_the_kernel_is_refused_up_front():
    """``lab run`` of a SLAB config with tunables on a SLUB kernel, or of a SLUB config with
    sysfs knobs on the SLAB kernel, is refused before anything runs, naming the knob and
    the kernel's profile."""
    from slabtune.model import profiles

    slab_cfg = lab.parse_config(SLAB_TUNED_CONFIG, "t")
    with pytest.raises(SlabtuneError, match="^t on --kernel 6.1: policy.params.limit: limit "
                                            "is a SLAB knob .*; profile v6.1 is SLUB$"):
        lab.check_allocator(slab_cfg, "6.1", profiles.get_profile("v6.1"))
    slub_cfg = lab.parse_config(CONFIG.replace(
        'profile = "v6.1"', 'profile = "v6.1"\n[policy.params]\nmin_partial = 3'), "u")
    with pytest.raises(SlabtuneError, match="^u on --kernel 6.1-slab: "
                                            "policy.params.min_partial: min_partial is a "
                                            "SLUB knob .*; profile slab-v6.1 is SLAB$"):
        lab.check_allocator(slub_cfg, "6.1-slab", profiles.SLAB_PROFILES["slab-v6.1"])
    lab.check_allocator(slab_cfg, "6.1-slab", profiles.SLAB_PROFILES["slab-v6.1"])


def test_every_example_config_is_runnable_on_the_lab():
    files = sorted(EXAMPLES.glob("*.toml"))
    assert len(files) == 24
    kinds, topos = set(), set()
    for f in files:
        cfg = lab.load_config(f)
        kinds.add(cfg.doc["workload"]["kind"])
        topos.add(lab.topology_label(cfg.doc))
    assert kinds == {"local", "producer_consumer", "request_response", "block_io"}
    assert topos == {"4cpu-2node-ml1", "8cpu-2node", "16cpu-4node", "16cpu-2node",
                     "8cpu-4node", "4cpu-1node", "8cpu-2node-ml1"}
    # the six configs at the fleet's live sets (tests/test_lab_fidelity_1k.py) hold them
    # (drain = "hold"), and the module gets drain=hold and, in lockstep, the end park
    fleet = [f for f in files if "-1k-" in f.stem]
    assert len(fleet) == 6
    for f in fleet:
        doc = lab.load_config(f).doc
        assert doc["workload"]["drain"] == "hold"
        args = lab.boot_args(doc)
        params = labmod.module_params(args["workload_doc"], args["topology"],
                                      warmup=args["warmup"], lockstep=True)
        assert params[-3:-1] == ["drain=hold", "end_park=1"], f.stem
    # the four order-0 configs boot with slub_max_order=0 and the model sizes 8-object slabs
    from slabtune.sweeps import simulate
    order0 = [f for f in files if f.stem.endswith("-order0")]
    assert len(order0) == 4
    for f in order0:
        doc = lab.load_config(f).doc
        assert lab.boot_args(doc)["boot_params"] == {"slub_max_order": 0}
        st = simulate.structure_of(lab.spec_for(doc))
        assert (int(st.order), int(st.objs_per_slab)) == (0, 8)
    # the order-1 config: 16 objects per 8 KiB slab; the 8-CPU four-node one the kernel's
    # own order, 2 (min_objects 4 * (fls(8) + 1) = 20 objects of 512 bytes)
    for name, param, want in (("pc-16cpu-4node-order1", {"slub_max_order": 1}, (1, 16)),
                              ("pc-8cpu-4node", {}, (2, 32))):
        doc = lab.load_config(EXAMPLES / f"{name}.toml").doc
        assert lab.boot_args(doc)["boot_params"] == param
        st = simulate.structure_of(lab.spec_for(doc))
        assert (int(st.order), int(st.objs_per_slab)) == want


def _cli(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "slabtune", *args], capture_output=True,
                          text=True, cwd=cwd, timeout=600)


def test_cli_bad_input_is_one_line_and_exit_2(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text(CONFIG.replace("depth = 16", "depth = -1"))
    out = tmp_path / "runs"
    out.mkdir()
    (out / "keep.txt").write_text("x")
    r = _cli("lab", "run", str(bad), "--out", str(out))
    assert r.returncode == 2, r.stderr
    assert r.stderr.count("\n") == 1 and "workload.depth" in r.stderr
    assert sorted(p.name for p in out.iterdir()) == ["keep.txt"]
    r = _cli("lab", "run", str(EXAMPLES / "pc-4cpu-ml.toml"), "--kernel", "8.8",
             "--out", str(out))
    assert r.returncode == 2 and "--kernel 8.8" in r.stderr
    r = _cli("lab", "run", "--out", str(out))
    assert r.returncode == 2 and "CONFIG.toml: give at least one config" in r.stderr
    r = _cli("lab", "show", "nothing-like-this", "--out", str(out))
    assert r.returncode == 2
    r = _cli("lab", "run", str(EXAMPLES / "pc-4cpu-ml.toml"), "--schedule", "barrier",
             "--out", str(out))
    assert r.returncode == 2 and "--schedule" in r.stderr
    r = _cli("lab", "run", "--resume", "x", "--schedule", "lockstep", "--out", str(out))
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "--schedule" in r.stderr
    r = _cli("lab", "show", "x", "--schedule", "lockstep", "--out", str(out))
    assert r.returncode == 2 and "--schedule does not apply" in r.stderr
    assert sorted(p.name for p in out.iterdir()) == ["keep.txt"]


# --------------------------------------------------------------------------- guests


def _lab_run(tmp_path, kernels, *extra):
    """``lab run --json`` of CONFIG on ``kernels`` under TCG into tmp_path/runs."""
    _need(kernels)
    cfg = tmp_path / "pc.toml"
    cfg.write_text(CONFIG)
    return _cli("lab", "run", str(cfg), *[a for k in kernels for a in ("--kernel", k)],
                "--json", "--accel", "tcg", "--out", str(tmp_path / "runs"), *extra)


def _need(kernels):
    for k in kernels:
        if build.kernel_path(k) is None or build.build_tree(k) is None:
            pytest.skip(f"kernel {k} is not built; run scripts/build-kernels.sh --only {k}")


@pytest.mark.slow
@pytest.mark.guest
def test_lab_run_on_a_memoryless_node_matches_the_modules_own_ops(tmp_path):
    """``lab run --json`` of a 4-CPU producer/consumer config with node 1 memoryless on the
    6.1 and 7.2 lab kernels: the kernel counted the module's allocations and frees (fast
    plus slow, within the allowance of test_lab_module), the memory was sampled, the model
    was run under each kernel's own profile, and each pair left its rows in the store.
    Then the run is cut short by hand (one pair's part removed) and resumed: only that
    pair boots again."""
    r = _lab_run(tmp_path, ("6.1", "7.2"))
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    recs = {x["kernel"]: x for x in doc["records"]}
    assert set(recs) == {"6.1", "7.2"}
    for k, rec in recs.items():
        assert rec["ok"] and rec["accelerator"] == "lab-tcg"
        m, p = rec["measured"], rec["predicted"]
        # 2 senders x (375 warm-up + 1500 counted) ops, every one an allocation: 3750
        # allocations and 3750 frees in all; the window has 3000 allocations and the frees
        # that were not done before the workers parked (the objects in flight then too)
        assert m["ops"] + m["warmup_ops"] == 7500
        window_frees = m["ops"] - 3000
        assert 3000 <= window_frees <= 3000 + 2 * 16
        allocs = m["counters"]["alloc_fastpath"] + m["counters"]["alloc_slowpath"]
        frees = m["counters"]["free_fastpath"] + m["counters"]["free_slowpath"]
        for moved, want in ((allocs, 3000), (frees, window_frees)):
            assert want - 3 <= moved <= want + 128, (k, moved)
        assert m["samples"] >= 1 and m["memory_bytes"] is not None
        assert set(lab.COMPARED) <= set(p) and p["counters"]["alloc_fastpath"] > 0
        assert rec["config"]["hash"] and rec["config"]["doc"]["workload"]["depth"] == 16
    assert recs["6.1"]["profile"] == "v6.1"
    assert recs["7.2"]["predicted"]["structure"]["sheaf_capacity"] > 0
    # 7.2 counts sheaf and barn events, 6.1 per-CPU partial ones
    assert "barn_get" in recs["7.2"]["measured"]["counters"]
    assert "cpu_partial_alloc" in recs["6.1"]["measured"]["counters"]
    from slabtune.results import store

    run = store.open_run(doc["run_dir"])
    rows = run.collect()
    assert set(rows["kernel"]) == {"6.1", "7.2"} and set(rows["accelerator"]) == {"lab-tcg"}
    assert rows.filter(pl.col("field") == "alloc_fastpath_frac").height == 2
    # cut the second pair out, resume: one boot, the first pair's record unchanged
    st = run.manifest["chunks"]["states"].pop("1")
    (run.path / st["part"]).unlink()
    run.save()
    r2 = _cli("lab", "run", "--resume", str(run.path), "--json", "--out", str(tmp_path / "runs"))
    assert r2.returncode == 0, r2.stderr
    again = {x["kernel"]: x for x in json.loads(r2.stdout)["records"]}
    assert again["6.1"]["measured"] == recs["6.1"]["measured"]
    assert again["7.2"]["ok"]
    assert store.open_run(run.path).collect().height == rows.height
    shown = _cli("lab", "show", str(run.path), "--markdown")
    card, _, kinds = shown.stdout.partition("per kernel and workload kind")
    assert shown.returncode == 0 and card.count("| 6.1 |") == 1
    # then one row per kernel and workload kind: this run's one config, on both kernels
    kind = recs["6.1"]["config"]["doc"]["workload"]["kind"]
    assert kinds.count(f"| 6.1 | {kind} | 1 |") == 1 and kinds.count(f"| 7.2 | {kind} | 1 |") == 1


SLAB_CONFIG = """
[topology]
cpus = 4
nodes = 1

[cache]
size = 3000

[policy]
profile = "slab-v6.1"

[policy.params]
slab_max_order = 2

[workload]
kind = "producer_consumer"
depth = 16
drain = "eager"

[run]
steps = 1200
seed = 3
"""


@pytest.mark.slow
@pytest.mark.guest
def test_lab_run_on_the_slab_kernel_reads_slabinfo_against_the_model(tmp_path):
    """``lab run --kernel 6.1-slab`` of a SLAB config: a 3000-byte cache of the module's own
    with ``slab_max_order=2`` on the command line, producer/consumer on 4 CPUs of one node.
    SLAB's calculate_slab_order() (mm/slab.c, 6.1) stops at order 1 by default (2 objects,
    2192 bytes left over); allowed order 2 it takes 5 objects per 16 KiB slab.  The
    kernel's /proc/slabinfo must show the model's structure exactly (order, objperslab,
    limit, batchcount, sharedfactor), num_objs = num_slabs * objperslab in both dumps, and
    at the window's start (every worker parked) the active objects are the module's
    outstanding ones (allocated in the warm-up, not yet freed) plus at most what the 4
    per-CPU arrays (limit each) and the node's shared array (shared * batchcount) hold."""
    _need(("6.1-slab",))
    cfg = tmp_path / "slab.toml"
    cfg.write_text(SLAB_CONFIG)
    r = _cli("lab", "run", str(cfg), "--kernel", "6.1-slab", "--json", "--accel", "tcg",
             "--out", str(tmp_path / "runs"))
    assert r.returncode == 0, r.stderr
    rec = json.loads(r.stdout)
    assert rec["ok"], rec["error"]
    assert "slab_max_order=2" in rec["cmdline"] and rec["profile"] == "slab-v6.1"
    m, p = rec["measured"], rec["predicted"]
    want = {"order": 2, "objs_per_slab": 5, "limit": 24, "batchcount": 12, "shared": 8}
    assert p["structure"] == want
    assert m["structure"] == {**{k: want[k] for k in want if k != "shared"},
                              "sharedfactor": want["shared"]}
    for phase in ("window", "after"):
        info = m["slabinfo"][phase]
        assert info["total_objects"] == info["slabs"] * 5
    # 2 senders x (300 warm-up + 1200 counted) allocations, and as many frees
    assert m["ops"] + m["warmup_ops"] == 2 * 2 * 1500
    assert m["samples"] >= 1 and m["memory_bytes"] is not None
    assert m["active_objects"] is not None and p["active_objects"] > 0
    outstanding = 2 * 300 - (m["warmup_ops"] - 2 * 300)
    assert 0 <= outstanding <= 2 * 16
    cached = m["slabinfo"]["window"]["objects"] - outstanding
    assert 0 <= cached <= 4 * want["limit"] + want["shared"] * want["batchcount"]
    # the fast paths and slab allocations are not measured (no CONFIG_DEBUG_SLAB)
    assert m["alloc_fastpath_frac"] is None and m["counters"] == {}
    from slabtune.results import store

    rows = store.open_run(next((tmp_path / "runs").iterdir())).collect()
    struct = rows.filter(pl.col("field").str.starts_with("slabinfo."))
    assert struct.height == 5 and (struct["measured"] == struct["predicted"]).all()
    assert rows.filter(pl.col("field") == "active_objects")["comparable"].to_list() == [True]


#: kmalloc-512 on 2 CPUs of one node with non-default /proc/slabinfo tunables: limit 12,
#: batchcount 4, shared 2 (enable_cpucache() of 6.1 gives 54, 27, 8 for 512 bytes on SMP);
#: paced (other_ns) so that /proc/slabinfo is sampled in the window.
SLAB_TUNED_CONFIG = """
[topology]
cpus = 2

[cache]
name = "kmalloc-512"

[policy]
profile = "slab-v6.1"

[policy.params]
limit = 12
batchcount = 4
shared = 2

[workload]
kind = "local"
live = 64
burst = 32
drain = "eager"
other_ns = 50000.0

[run]
steps = 2000
seed = 1
"""


@pytest.mark.slow
@pytest.mark.guest
def test_lab_run_writes_the_slab_tunables_and_the_model_runs_them(tmp_path):
    """``lab run --kernel 6.1-slab`` of a kmalloc-512 config with tunables 12 / 4 / 2: the
    guest writes ``kmalloc-512 12 4 2`` to /proc/slabinfo before the run
    (slabinfo_write() -> do_tune_cpucache()), so the cache's dumped line shows limit 12,
    batchcount 4, sharedfactor 2, and the model's structure and dynamics run the same
    three (its refills per 1000 ops are those of batchcount 4, not of the default 27)."""
    _need(("6.1-slab",))
    cfg = tmp_path / "tuned.toml"
    cfg.write_text(SLAB_TUNED_CONFIG)
    r = _cli("lab", "run", str(cfg), "--kernel", "6.1-slab", "--json", "--accel", "tcg",
             "--out", str(tmp_path / "runs"))
    assert r.returncode == 0, r.stderr
    rec = json.loads(r.stdout)
    assert rec["ok"], rec["error"]
    assert rec["slabinfo"] == {"limit": 12, "batchcount": 4, "shared": 2}
    m, p = rec["measured"], rec["predicted"]
    assert p["structure"] == {"order": 0, "objs_per_slab": 8, "limit": 12, "batchcount": 4,
                              "shared": 2}
    assert m["structure"] == {"order": 0, "objs_per_slab": 8, "limit": 12, "batchcount": 4,
                              "sharedfactor": 2}
    for phase in ("window", "after"):
        info = m["slabinfo"][phase]
        assert (info["limit"], info["batchcount"], info["sharedfactor"]) == (12, 4, 2)
    assert m["active_objects"] is not None and m["memory_bytes"] is not None
    print(f"tuned 12/4/2: active objects predicted {p['active_objects']:.1f} measured "
          f"{m['active_objects']:.1f}; memory predicted {p['memory_bytes']:.0f} measured "
          f"{m['memory_bytes']:.0f}; {rec['seconds']:.0f} s boot")
    # the model's side of the same document without the tunables refills 27 at a time
    doc = json.loads(json.dumps(rec["config"]["doc"]))
    doc["policy"]["params"] = {}
    (base,) = lab.predict([(doc, lab.kernel_profile("6.1-slab"))])
    assert base["structure"]["batchcount"] == 27
    refills = ("refill_shared", "refill_slabs", "refill_grow")
    tuned = sum(p["counters_per_kop"][k] for k in refills)
    default = sum(base["counters_per_kop"][k] for k in refills)
    assert tuned > default
    from slabtune.results import store

    rows = store.open_run(next((tmp_path / "runs").iterdir())).collect()
    struct = rows.filter(pl.col("field").str.starts_with("slabinfo."))
    assert struct.height == 5 and (struct["measured"] == struct["predicted"]).all()
    applied = json.loads(rows["applied"][0])
    assert applied["slabinfo"] == {"limit": 12, "batchcount": 4, "shared": 2}
    assert applied["sysfs"] == {}


BIO_ONE_NODE = """
[topology]
cpus = 4
nodes = 1

[cache]
size = 512

[policy]
profile = "v6.1"

[workload]
kind = "block_io"
depth = 32
drain = "eager"
other_ns = 50000.0

[run]
steps = 1500
seed = 1
"""


@pytest.mark.slow
@pytest.mark.guest
def test_lockstep_block_io_on_6_1_meets_the_models_fifo_frees(tmp_path):
    """``lab run --schedule lockstep`` of block I/O on 4 CPUs of one node (CPU 0 completes
    what CPUs 1-3 submit, 32 requests each in flight, 16 objects per slab) on 6.1.

    The schedule: the module gets ``lockstep=1`` (every worker one op or none per step at
    a barrier) and the rows carry the ``lab-tcg-lockstep`` label.  The kernel: a
    submitter's requests come back in the order it sent them, so the frees go to its older
    slabs (on CPU 0's per-CPU partial list, frozen: ``free_frozen``) and a submitter
    refills its CPU slab from slabs that collected many frees (6.1 ___slab_alloc()); about
    92% of allocations stay fast (91.9% in lockstep; 92.3% and 92.6% in runs of 1500 ops
    per submitter, lockstep and free-running, 2026-11-25).  The model
    with a pair's frees oldest first (dynamics.fifo_split) predicts 93.1%; drawing the
    freed objects uniformly, as it did before, sent half the completions to the
    submitter's current CPU slab and gave 82.7%.  The test allows 3 points."""
    _need(("6.1",))
    cfg = tmp_path / "bio.toml"
    cfg.write_text(BIO_ONE_NODE)
    r = _cli("lab", "run", str(cfg), "--kernel", "6.1", "--schedule", "lockstep", "--json",
             "--accel", "tcg", "--out", str(tmp_path / "runs"))
    assert r.returncode == 0, r.stderr
    rec = json.loads(r.stdout)
    assert rec["ok"] and rec["accelerator"] == "lab-tcg-lockstep"
    assert "lockstep=1" in rec["module_params"]
    m, p = rec["measured"], rec["predicted"]
    assert m["counters"]["free_frozen"] > 0.8 * m["ops"] / 2
    assert abs(m["alloc_fastpath_frac"] - p["alloc_fastpath_frac"]) < 0.03, \
        (m["alloc_fastpath_frac"], p["alloc_fastpath_frac"])
    from slabtune.results import store

    run = store.open_run(rec["run_dir"])
    assert run.manifest["spec"]["schedule"] == "lockstep"
    assert set(run.collect()["accelerator"]) == {"lab-tcg-lockstep"}


@pytest.mark.slow
@pytest.mark.guest
def test_lockstep_warm_up_starts_the_window_from_the_models_state(tmp_path):
    """``examples/lab/pc-4cpu-ml.toml`` on 7.2 in lockstep: senders on CPU 0 (node 0) and
    CPU 2 (memoryless node 1), receivers on CPUs 1 and 3.  The objects in circulation are
    what the senders' sheaf refills brought in before the receivers' full sheaves came
    back through the barns; the window only moves them around (barn_get = barn_put within
    a few per CPU).  So the slabs the window holds are set by the warm-up's schedule: with
    a free-running warm-up the senders refilled 15 sheaves and the barns held 9 full ones
    at the window's start, 240 KiB of slabs against the model's 114 KiB (2026-11-28); with
    the barrier from the first step 136 KiB against 114 (118 against 109 counting from
    the first step).  The test allows the model 35%."""
    _need(("7.2",))
    r = _cli("lab", "run", str(EXAMPLES / "pc-4cpu-ml.toml"), "--kernel", "7.2", "--schedule",
             "lockstep", "--json", "--accel", "tcg", "--out", str(tmp_path / "runs"))
    assert r.returncode == 0, r.stderr
    rec = json.loads(r.stdout)
    m, p = rec["measured"], rec["predicted"]
    per_cpu = m["counters_per_cpu"]
    assert set(per_cpu["alloc_fastpath"]) == {"0", "2"}
    assert set(per_cpu["free_fastpath"]) == {"1", "3"}
    puts, gets = m["counters"]["barn_put"], m["counters"]["barn_get"]
    assert puts > 600 and abs(puts - gets) < 0.05 * puts
    assert abs(m["memory_bytes"] - p["memory_bytes"]) < 0.35 * p["memory_bytes"], (
        m["memory_bytes"], p["memory_bytes"])


@pytest.mark.slow
@pytest.mark.guest
def test_a_boot_that_times_out_is_a_failed_row_after_one_retry(tmp_path):
    """A 1 s limit cannot fit a boot: the pair is retried once (a boot flake), then stored
    as one failed row with the error and the console tail; exit 1."""
    r = _lab_run(tmp_path, ("7.2",), "--timeout", "1")
    assert r.returncode == 1, r.stderr
    rec = json.loads(r.stdout)
    assert rec["ok"] is False and rec["error"].startswith("timed out after")
    assert rec["attempts"] == lab_boot.BOOT_ATTEMPTS == 2
    from slabtune.results import store

    run = store.open_run(rec["run_dir"])
    assert run.complete
    (row,) = run.collect().iter_rows(named=True)
    assert row["status"] == "failed" and row["error"] == rec["error"]
    assert isinstance(row["console_tail"], str) and row["kernel"] == "7.2"


VALIDATE_SPEC = """
[validate]
timeout_s = 300

[validate.native]
cache = "kmalloc-512"
steps = 1500
seed = 2
workload = { kind = "producer_consumer", depth = 16 }

[fleet]
profile = "v6.1"

[[fleet.topology]]
name = "memoryless-4"
cpus = 4
nodes = 2
memoryless_nodes = [1]

[[fleet.workload]]
name = "pc"
[fleet.workload.caches]
"kmalloc-512" = { live_per_cpu = 16, ops = 1.0 }
"""


@pytest.mark.slow
@pytest.mark.guest
def test_validate_target_lab_compares_every_built_kernel(tmp_path):
    """``validate --target lab``: the baseline and one candidate (slub_max_order=0 on the
    command line, min_partial 2 written to sysfs) on a memoryless topology, every built lab
    kernel booted per pair; the report gives per kernel the fast-path differences in
    points and names the source."""
    kernels = [k for k in lab.LAB_KERNELS if build.kernel_path(k) is not None
               and build.build_tree(k) is not None]
    if not kernels:
        pytest.skip("no lab kernel is built; run scripts/build-kernels.sh")
    spec = tmp_path / "spec.toml"
    spec.write_text(VALIDATE_SPEC)
    cand = tmp_path / "c.json"
    cand.write_text(json.dumps({"candidate": [{"id": "order0",
                                                "boot": {"slub_max_order": 0},
                                                "knobs": {"min_partial_lo": 2,
                                                          "min_partial_hi": 2}}]}))
    r = _cli("validate", "--candidate", str(cand), "--topologies", str(spec), "--target",
             "lab", "--out", str(tmp_path / "runs"), "--json")
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)
    assert res["tasks"] == 2 and res["failed"] == 0
    from slabtune.results import store

    rows = store.open_run(res["run_dir"]).collect()
    assert set(rows["target"]) == {"lab"} and set(rows["kernel"]) == set(kernels)
    order0 = rows.filter((pl.col("candidate") == "order0")
                         & (pl.col("field") == "alloc_fastpath_frac"))
    assert order0.height == len(kernels)
    # the boot parameter on the command line; the searched min_partial knobs give
    # kmalloc-512 min_partial 2, written to its sysfs file on every kernel
    for a in order0["applied"]:
        applied = json.loads(a)
        assert "slub_max_order=0" in applied["cmdline"]
        assert applied["sysfs"] == {"min_partial": 2}
    base = rows.filter((pl.col("candidate") == "baseline")
                       & (pl.col("field") == "alloc_fastpath_frac"))
    assert all(json.loads(a)["sysfs"] == {} for a in base["applied"])
    rep = _cli("validate", "report", res["run_dir"], "--json")
    assert rep.returncode == 0, rep.stderr
    labrep = json.loads(rep.stdout)["lab"]
    assert labrep["runs"] == 2 * len(kernels) and labrep["failed"] == 0
    assert set(labrep["sources"]) <= {"lab-tcg", "lab-kvm"} and labrep["sources"]
    assert {k["kernel"] for k in labrep["by_kernel"]} == set(kernels)
    for k in labrep["by_kernel"]:
        assert k["figures"]["alloc_fastpath_frac"]["unit"] == "pp"
        assert 0 <= k["figures"]["alloc_fastpath_frac"]["worst"] <= 100
    text = _cli("validate", "report", res["run_dir"])
    assert "lab (the real allocator, source lab-" in text.stdout
    assert "not the kernel" in text.stdout


def test_guest_boot_takes_a_lab_kernel_by_name():
    from slabtune.commands.guest import _kernel_arg

    assert _kernel_arg(None) is None
    assert _kernel_arg("/some/bzImage") == "/some/bzImage"
    for name in ("6.1", "7.2"):
        if build.kernel_path(name) is None:
            with pytest.raises(lab_boot.LabBootError, match=f"--kernel {name}: not built yet"):
                _kernel_arg(name)
        else:
            assert _kernel_arg(name) == str(build.kernel_path(name))


def test_show_repredict_sets_todays_model_beside_stored_measurements(tmp_path):
    """A stored lab run's measurements stay as booted; ``--repredict`` runs today's model
    under the profile of each record's kernel release (7.2.13 -> v7.1)."""
    from slabtune.model import profiles
    from slabtune.results import store
    from slabtune.validate.schema import frame

    cfg = lab.parse_config(CONFIG, "t")
    measured = {"alloc_fastpath_frac": 1.0, "free_fastpath_frac": 1.0,
                "slab_allocs_per_kop": 0.5, "memory_bytes": 8192.0, "ops": 6000, "order": 1,
                "samples": 4, "peak_slabs": 3, "counters": {"alloc_fastpath": 3000}}
    old_pred = {k: 0.0 for k in lab.COMPARED}
    old_pred.update(profile="v6.1", structure={}, counters_per_kop={})
    rec = lab.combine({"index": 0, "kernel": "7.2", "ok": True, "error": "",
                       "release": "7.2.13-slabtune", "accelerator": "lab-tcg", "attempts": 1,
                       "seconds": 3.0, "console_tail": "", "measured": measured,
                       "cmdline": "", "module_params": []}, cfg, old_pred)
    run = store.create_run(tmp_path, spec={"name": "lab", "chunk_size": 1}, spec_hash="0" * 64,
                           spec_text="{}", n_chunks=1, columns=[], versions={},
                           git_revision=None, extra={"kind": "lab"})
    run.write_part(0, frame(lab.rows_of(rec, {"task": 0})), status="ok",
                   record={k: v for k, v in rec.items() if k != "console_tail"})
    shown = lab.stored_run(store.open_run(run.path))
    assert shown.records[0]["predicted"]["alloc_fastpath_frac"] == 0.0
    again = lab.stored_run(store.open_run(run.path), repredict=True).records[0]
    want = lab.predict([(cfg.doc, profiles.get_profile("v7.1"))])[0]
    assert again["profile"] == "v7.1"
    assert again["predicted"]["alloc_fastpath_frac"] == pytest.approx(want["alloc_fastpath_frac"])
    assert again["measured"]["counters"] == measured["counters"]
    assert again["measured"]["counters_per_kop"]["alloc_fastpath"] == pytest.approx(500.0)
    r = _cli("lab", "show", str(run.path), "--repredict", "--markdown")
    assert r.returncode == 0, r.stderr
    assert "| 7.2 | t |" in r.stdout and "100.0% / " in r.stdout
    bad = _cli("lab", "run", str(EXAMPLES / "pc-4cpu-ml.toml"), "--repredict")
    assert bad.returncode == 2 and "--repredict: only with" in bad.stderr

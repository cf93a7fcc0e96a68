"""``slabtune validate`` with a SLAB fleet profile (issue 14 item 4): the spec and candidate
files take SLAB profiles, SLUB knobs on them are one-line errors, only the lab target runs
(its 6.1-slab kernel), and the report labels the SLAB rows and says what they compare.
The slow ``guest`` test boots the 6.1-slab lab kernel under qemu.
"""


from __future__ import annotations

import json

import polars as pl
import pytest

from slabtune import cli
from slabtune.errors import SlabtuneError
from slabtune.model import profiles
from slabtune.validate import candidates, lab, plan, report
from slabtune.validate import spec as validate_spec
from slabtune.validate.schema import ROW_SCHEMA

#: One small topology, the lab module's local churn on kmalloc-512, paced (other_ns) so
#: that /proc/slabinfo is sampled in the window.
SLAB_SPEC = """
[validate]
timeout_s = 300
retries = 0
memory_mib = 256
accel = "auto"

[fleet]
profile = "slab-v6.1"

[[fleet.topology]]
name = "smp-2"
cpus = 2

[[fleet.workload]]
name = "local"
[fleet.workload.caches]
"kmalloc-512" = { live_per_cpu = 64, ops = 1.0 }

[validate.native]
cache = "kmalloc-512"
steps = 4000
seed = 0
workload = { kind = "local", live = 64, burst = 32, drain = "eager", other_ns = 50000.0 }
"""


def _cli(argv, capsys) -> tuple[int, str, str]:
    rc = cli.main(argv)
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.mark.parametrize("name", ["slab-v2.6.33", "slab-v3.1", "slab-v6.1"])
def test_spec_takes_each_slab_profile(name):
    spec = validate_spec.parse_spec(SLAB_SPEC.replace("slab-v6.1", name), "s")
    assert spec.fleet.profile is profiles.SLAB_PROFILES[name]
    assert validate_spec.is_slab_spec(spec)
    assert spec.fleet.topology_names == ("smp-2",)
    assert [c.name for c in spec.fleet.caches] == ["kmalloc-512"]
    # a SLUB spec is unchanged
    slub = validate_spec.parse_spec(SLAB_SPEC.replace("slab-v6.1", "v6.1"), "s")
    assert slub.fleet.profile is profiles.get_profile("v6.1")
    assert not validate_spec.is_slab_spec(slub)


def test_slab_spec_refuses_a_sweep_fleet_and_unknown_profiles():
    with pytest.raises(SlabtuneError, match="fleet.sweep: a SLAB fleet"):
        validate_spec.parse_spec(SLAB_SPEC.replace('profile = "slab-v6.1"',
                                                   'profile = "slab-v6.1"\nsweep = "quick"'),
                                 "s")
    with pytest.raises(SlabtuneError, match="fleet.profile: unknown kernel profile 'slab-v9'"):
        validate_spec.parse_spec(SLAB_SPEC.replace("slab-v6.1", "slab-v9"), "s")


def test_slab_candidates_keep_slab_names_and_refuse_slub_knobs():
    prof = profiles.SLAB_PROFILES["slab-v6.1"]
    (c,) = candidates.parse_candidates({"candidate": [{"id": "o1",
                                                       "boot": {"slab_max_order": 1}}]},
                                       "f", prof)
    assert dict(c.boot) == {"slab_max_order": 1} and dict(c.knobs) == {}
    # the same file on a SLUB spec canonicalises to slub_max_order, as before
    (s,) = candidates.parse_candidates({"candidate": [{"id": "o1",
                                                       "boot": {"slab_max_order": 1}}]}, "f")
    assert dict(s.boot) == {"slub_max_order": 1}
    for entry, where, text in (
            ({"boot": {"slub_max_order": 1}}, "boot.slub_max_order",
             "slub_max_order is a SLUB knob"),
            ({"boot": {"slub_min_objects": 4}}, "boot.slub_min_objects",
             "slub_min_objects is a SLUB knob"),
            ({"knobs": {"min_partial_lo": 3}}, "knobs.min_partial_lo",
             "min_partial_lo is a SLUB search knob"),
            ({"knobs": {"sheaf_page": 8}}, "knobs.sheaf_page", "a SLUB search knob"),
            ({"boot": {"limit": 60}}, "boot.limit", "not a boot parameter of SLAB profile"),
            ({"boot": {"slab_max_order": 11}}, "boot.slab_max_order", "above 10")):
        with pytest.raises(SlabtuneError) as err:
            candidates.parse_candidates({"candidate": [{"id": "x", **entry}]}, "f", prof)
        msg = str(err.value)
        assert f"candidate[0].{where}" in msg and text in msg and "\n" not in msg
        if "SLUB" in text:
            assert "profile slab-v6.1 is SLAB" in msg
    # slab_max_order= came in v3.4: the 2.6.33 profile has no boot parameter
    with pytest.raises(SlabtuneError, match="not a boot parameter of SLAB profile "
                                            r"slab-v2.6.33 \(boot parameters: none\)"):
        candidates.parse_candidates({"candidate": [{"boot": {"slab_max_order": 1}}]}, "f",
                                    profiles.SLAB_PROFILES["slab-v2.6.33"])


def test_cli_slub_knob_on_a_slab_spec_is_one_line_exit_2(tmp_path, capsys):
    spec = tmp_path / "slab.toml"
    spec.write_text(SLAB_SPEC)
    f = tmp_path / "c.toml"
    f.write_text('[[candidate]]\nid = "c"\nknobs = { cpu_partial_1k = 6 }\n')
    rc, _, err = _cli(["validate", "--candidate", str(f), "--topologies", str(spec),
                       "--target", "lab", "--out", str(tmp_path / "runs")], capsys)
    assert rc == 2 and len(err.strip().splitlines()) == 1
    assert "knobs.cpu_partial_1k" in err and "profile slab-v6.1 is SLAB" in err
    assert not (tmp_path / "runs").exists()


def test_only_the_lab_target_runs_a_slab_spec():
    spec = validate_spec.parse_spec(SLAB_SPEC, "s")
    (c,) = candidates.parse_candidates({"candidate": [{"id": "o1",
                                                       "boot": {"slab_max_order": 1}}]},
                                       "f", spec.fleet.profile)
    cands = candidates.with_baseline([c])
    kept, skipped = plan.slab_targets(spec, ("guest", "host", "native", "lab", "uml"))
    assert kept == ("lab",) and set(skipped) == {"guest", "host", "native", "uml"}
    tasks = plan.plan_tasks(cands, spec, ("guest", "host", "native", "lab"))
    assert [(t.candidate.id, t.topology, t.target) for t in tasks] == [
        ("baseline", "smp-2", "lab"), ("o1", "smp-2", "lab")]
    # the native target alone is refused before anything runs, in one line with the reason
    with pytest.raises(SlabtuneError) as err:
        plan.preflight(cands, spec, ("native",))
    assert str(err.value) == ("--target native: spec s has the SLAB profile slab-v6.1: the "
                              "native allocator is a userspace twin of the SLUB model; SLAB "
                              "has none (use --target lab)")
    # a SLUB spec keeps every target
    slub = validate_spec.parse_spec(SLAB_SPEC.replace("slab-v6.1", "v6.1"), "s")
    assert plan.slab_targets(slub, ("guest", "native")) == (("guest", "native"), {})


def test_the_lab_pair_of_a_slab_candidate_is_a_slab_simulation():
    """The lab document of a SLAB pair sets only the boot parameter (no sysfs knob: SLAB
    has no /sys/kernel/slab) under the SLAB profile, so sweeps/simulate runs its SLAB
    branch; the boot puts ``slab_max_order=1`` on the kernel command line."""
    from slabtune.sweeps import simconfig, simulate

    spec = validate_spec.parse_spec(SLAB_SPEC, "s")
    (c,) = candidates.parse_candidates({"candidate": [{"id": "o1",
                                                       "boot": {"slab_max_order": 1}}]},
                                       "f", spec.fleet.profile)
    assert lab.lab_cache_values(spec, c) == {}
    assert candidates.applied_values(spec, c, {}) == {"slab_max_order": 1}
    doc = lab.validate_doc(spec, c, "smp-2", spec.fleet.profile)
    assert doc["policy"] == {"profile": "slab-v6.1", "params": {"slab_max_order": 1}}
    assert simulate.is_slab_spec(simconfig.parse_doc(doc))
    args = lab.boot_args(doc)
    assert args["boot_params"] == {"slab_max_order": 1} and args["sysfs"] == {}


def test_slab_candidates_take_the_slabinfo_tunables():
    """A SLAB candidate's knobs are the /proc/slabinfo tunables (limit, batchcount, shared,
    in the tuner's ranges); what validation applies of them is
    slab_objectives.tunables_of()'s rule with the cache's own values left to the cache: a
    limit alone brings batchcount (limit + 1) / 2, the -1 a study stores for "the cache's
    own" applies nothing.  The lab document carries them on a kmalloc cache, the lab
    writes all three (the cache's own shared, 8 on 2 CPUs) and the model runs the same."""
    spec = validate_spec.parse_spec(SLAB_SPEC, "s")
    prof = spec.fleet.profile
    (c,) = candidates.parse_candidates(
        {"candidate": [{"id": "t", "boot": {"slab_max_order": 1}, "knobs": {"limit": 20}}]},
        "f", prof)
    assert dict(c.knobs) == {"limit": 20}
    assert candidates.applied_values(spec, c, None) == {"slab_max_order": 1, "limit": 20,
                                                        "batchcount": 10}
    assert candidates.slab_applied_tunables({"limit": -1, "batchcount": -1,
                                             "shared": -1}) == {}
    assert candidates.slab_applied_tunables({"limit": -1, "batchcount": 6,
                                             "shared": 0}) == {"batchcount": 6, "shared": 0}
    assert candidates.slab_applied_tunables({"limit": 7, "batchcount": 3,
                                             "shared": -1}) == {"limit": 7, "batchcount": 3}
    key = json.loads(candidates.validated_key(spec, c))
    assert key["caches"]["kmalloc-512"] == {"slab_max_order": 1, "limit": 20, "batchcount": 10}
    doc = lab.validate_doc(spec, c, "smp-2", prof)
    assert doc["policy"]["params"] == {"slab_max_order": 1, "limit": 20, "batchcount": 10}
    args = lab.boot_args(doc, prof)
    assert args["slabinfo"] == {"limit": 20, "batchcount": 10, "shared": 8}
    assert args["sysfs"] == {} and args["boot_params"] == {"slab_max_order": 1}
    (pred,) = lab.predict([(doc, prof)])
    assert pred["structure"] == {"order": 0, "objs_per_slab": 8, "limit": 20,
                                 "batchcount": 10, "shared": 8}
    # a baseline writes nothing
    base = lab.validate_doc(spec, candidates.BASELINE, "smp-2", prof)
    assert base["policy"]["params"] == {} and lab.boot_args(base, prof)["slabinfo"] == {}
    for entry, where, text in (
            ({"knobs": {"batchcount": 30, "limit": 20}}, "knobs.batchcount", "above limit 20"),
            ({"knobs": {"limit": 0}}, "knobs.limit", "outside 1.."),
            ({"knobs": {"shared": "8"}}, "knobs.shared", "not an integer"),
            ({"knobs": {"slab_max_order": 1}}, "knobs.slab_max_order", "put it under boot"),
            ({"knobs": {"cpu_partial": 4}}, "knobs.cpu_partial",
             "cpu_partial is a SLUB knob")):
        with pytest.raises(SlabtuneError) as err:
            candidates.parse_candidates({"candidate": [{"id": "x", **entry}]}, "f", prof)
        msg = str(err.value)
        assert f"candidate[0].{where}" in msg and text in msg and "\n" not in msg
    # the reverse: a SLAB tunable on a SLUB spec names the knob and the profile
    with pytest.raises(SlabtuneError, match=r"candidate\[0\]\.knobs\.limit: limit is a SLAB "
                                            "knob .*; profile v6.1 is SLUB"):
        candidates.parse_candidates({"candidate": [{"knobs": {"limit": 4}}]}, "f",
                                    profiles.get_profile("v6.1"))


def test_candidates_of_a_slab_study_carry_their_trials_tunables(tmp_path):
    """A SLAB study's front points (slab_max_order and the tunables searched) become lab
    pairs whose documents and /proc/slabinfo lines are the trials' values; ``--spread``
    with the spec picks distinct validated configurations (validated_key on a SLAB spec)."""
    import tomli_w

    from slabtune.tuner import study as studies

    doc = {"fleet": {"profile": "slab-v6.1",
                     "topology": [{"name": "smp-2", "cpus": 2, "weight": 1.0}],
                     "workload": [{"name": "w", "weight": 1.0, "foreign_free": 0.0,
                                   "churn": 0.0, "caches": {"kmalloc-512": {
                                       "live_per_cpu": 64, "ops": 1.0}}}]},
           "search": {"sampler": "nsga2", "seed": 1, "knobs": {
               "slab_max_order": {"low": 0, "high": 2}, "limit": {"choices": [4, 16, 54]},
               "batchcount": {"choices": [1, 8, 27]}, "shared": {"choices": [0, 8]}}},
           "objectives": {"set": "structural"}}
    tspec = studies.parse_spec(tomli_w.dumps(doc), "s")
    runner, _ = studies.create_or_resume(tspec, "s", f"journal:{tmp_path / 's.log'}")
    runner.run(16, 16)
    spec = validate_spec.parse_spec(SLAB_SPEC, "v")
    picked, n = candidates.spread_candidates(runner.study, 3, spec)
    assert n >= 2 and len(picked) == min(3, n)
    keys = [candidates.validated_key(spec, c) for c in picked]
    assert len(set(keys)) == len(keys)
    by_trial = {t.number: t.params for t in runner.study.trials}
    for c in picked:
        p = by_trial[int(c.id.split("-")[1])]
        tun = {k: p[k] for k in ("limit", "batchcount", "shared")}
        d = lab.validate_doc(spec, c, "smp-2", spec.fleet.profile)
        assert {k: d["policy"]["params"][k] for k in tun} == tun
        assert lab.boot_args(d, spec.fleet.profile)["slabinfo"] == tun
        (pred,) = lab.predict([(d, spec.fleet.profile)])
        assert {k: pred["structure"][k] for k in tun} == tun


def test_cli_slab_tunable_on_a_slub_spec_is_one_line_exit_2(tmp_path, capsys):
    spec = tmp_path / "slub.toml"
    spec.write_text(SLAB_SPEC.replace("slab-v6.1", "v6.1"))
    f = tmp_path / "c.toml"
    f.write_text('[[candidate]]\nid = "c"\nknobs = { limit = 6 }\n')
    rc, _, err = _cli(["validate", "--candidate", str(f), "--topologies", str(spec),
                       "--target", "lab", "--out", str(tmp_path / "runs")], capsys)
    assert rc == 2 and len(err.strip().splitlines()) == 1
    assert "knobs.limit" in err and "profile v6.1 is SLUB" in err
    assert not (tmp_path / "runs").exists()


def _slab_rows() -> pl.DataFrame:
    """Lab rows of one SLAB pair as lab.rows_of writes them: memory and active objects
    measured, the fast paths and slab allocations None (no DEBUG_SLAB statistics)."""
    cfg = lab.config_from_doc({"topology": {"cpus": 2}, "cache": {"size": 512},
                               "policy": {"profile": "slab-v6.1", "params": {}},
                               "workload": {"kind": "local", "live": 64, "burst": 32},
                               "run": {"steps": 100, "seed": 0}}, "b@smp-2")
    struct = {"order": 0, "objs_per_slab": 8, "limit": 54, "batchcount": 27, "shared": 8}
    pred = {"alloc_fastpath_frac": 1.0, "free_fastpath_frac": 1.0, "slab_allocs_per_kop": 0.0,
            "memory_bytes": 32768.0, "active_objects": 64.0, "profile": "slab-v6.1",
            "structure": struct, "counters_per_kop": {"slab_alloc": 0.0}}
    measured = {"alloc_fastpath_frac": None, "free_fastpath_frac": None,
                "slab_allocs_per_kop": None, "memory_bytes": 40960.0, "active_objects": 80.0,
                "ops": 1000, "counters": {},
                "structure": {"order": 0, "objs_per_slab": 8, "limit": 54, "batchcount": 27,
                              "sharedfactor": 4}}
    rec = {"index": 0, "kernel": "6.1-slab", "ok": True, "error": "", "release": "6.1.192",
           "accelerator": "lab-tcg", "attempts": 1, "seconds": 2.0, "console_tail": "",
           "measured": measured, "cmdline": "console=ttyS0", "module_params": []}
    rows = lab.rows_of(lab.combine(rec, cfg, pred),
                       {"task": 0, "candidate": "baseline", "topology": "smp-2"})
    return pl.DataFrame(rows, schema=ROW_SCHEMA, orient="row")


def test_report_labels_slab_rows_with_what_they_compare():
    s = report.lab_part(_slab_rows())
    (k,) = s["by_kernel"]
    assert k["allocator"] == "SLAB" and k["profile"] == "slab-v6.1"
    assert k["compared"] == ["memory_bytes", "active_objects", "structure"]
    assert set(k["not_compared"]) == {"alloc_fastpath_frac", "free_fastpath_frac",
                                      "slab_allocs_per_kop"}
    # |32768 - 40960| / 40960 and |64 - 80| / 80
    assert k["figures"]["memory_bytes"]["median"] == pytest.approx(0.2)
    assert k["figures"]["active_objects"]["median"] == pytest.approx(0.2)
    # sharedfactor 4 measured against 8 predicted: 4 of 5 structure fields match
    assert k["structure"] == {"matched": 4, "compared": 5}
    (p,) = k["pairs"]
    assert p["memory_bytes"] == {"predicted": 32768.0, "measured": 40960.0}
    lines = report.format_lab(s)
    assert lines[1] == ("  6.1-slab (allocator SLAB, profile slab-v6.1, 1 runs): compared "
                        "memory_bytes 20% / 20%; active_objects 20% / 20%; /proc/slabinfo "
                        "structure 4 of 5 exact")
    assert "not compared: alloc_fastpath_frac, free_fastpath_frac, slab_allocs_per_kop" \
        in lines[2] and "CONFIG_DEBUG_SLAB" in lines[2]
    assert lines[3] == ("    baseline smp-2: predicted / measured memory 32.0 KiB / 40.0 KiB; "
                        "active objects 64.0 / 80.0; structure 4 of 5")


# --------------------------------------------------------------------------- guests


@pytest.mark.slow
@pytest.mark.guest
@pytest.mark.ray
def test_validate_target_lab_boots_the_slab_kernel(tmp_path, capsys, ray_local):
    """``validate --target lab`` of one candidate (slab_max_order=1, limit 20, shared 4) on
    a 2-CPU SLAB spec boots 6.1-slab twice (baseline and candidate) and stores SLAB rows:
    kmalloc-512's /proc/slabinfo structure is the model's (baseline: order 0, 8 objects,
    limit 54, batchcount 27, sharedfactor 8, enable_cpucache() of 6.1 for a 512-byte cache
    on SMP; the candidate's line ``kmalloc-512 20 10 4`` written before its run, batchcount
    (limit + 1) / 2), the candidate's boot parameter is on the command line, and the memory
    and active objects sampled in the window are near the model's (local churn on a UMA
    topology, where the lab card's SLAB rows agree within a few percent)."""
    from slabtune.kernel import build

    if build.kernel_path("6.1-slab") is None:
        pytest.skip("kernel 6.1-slab is not built; run scripts/build-kernels.sh --only 6.1-slab")
    if lab.lab_available() is not None:
        pytest.skip(lab.lab_available())
    spec = tmp_path / "slab.toml"
    spec.write_text(SLAB_SPEC)
    cand = tmp_path / "c.toml"
    cand.write_text('[[candidate]]\nid = "o1"\nboot = { slab_max_order = 1 }\n'
                    'knobs = { limit = 20, shared = 4 }\n')
    out = tmp_path / "runs"
    rc, stdout, err = _cli(["validate", "--candidate", str(cand), "--topologies", str(spec),
                            "--target", "lab,native", "--out", str(out), "--json"], capsys)
    assert rc == 0, err
    run_dir = json.loads(stdout)["run_dir"]
    rc, stdout, err = _cli(["validate", "report", run_dir, "--out", str(out), "--json"], capsys)
    assert rc == 0, err
    rep = json.loads(stdout)
    assert rep["failed"] == 0 and rep["tasks"] == 2
    assert rep["skipped_targets"] == {"native": plan.SLAB_SKIPPED["native"]}
    (k,) = rep["lab"]["by_kernel"]
    assert (k["kernel"], k["allocator"], k["profile"]) == ("6.1-slab", "SLAB", "slab-v6.1")
    assert k["compared"] == ["memory_bytes", "active_objects", "structure"]
    assert k["structure"] == {"matched": 10, "compared": 10}
    assert [p["candidate"] for p in k["pairs"]] == ["baseline", "o1"]
    for p in k["pairs"]:
        for f in ("memory_bytes", "active_objects"):
            v = p[f]
            assert v["measured"] is not None and v["measured"] > 0
            assert abs(v["predicted"] - v["measured"]) <= 0.25 * v["measured"], (f, v)
    from slabtune.results import store

    rows = store.resolve_run(run_dir, out).collect()
    assert set(rows["target"]) == {"lab"} and set(rows["kernel"]) == {"6.1-slab"}
    applied = {c: json.loads(a) for c, a in rows.select("candidate", "applied").unique()
               .iter_rows()}
    assert applied["o1"]["cmdline"].split()[-1] == "slab_max_order=1"
    assert "slab_max_order" not in applied["baseline"]["cmdline"]
    assert applied["o1"]["sysfs"] == {}
    assert applied["o1"]["slabinfo"] == {"limit": 20, "batchcount": 10, "shared": 4}
    assert "slabinfo" not in applied["baseline"]
    o1 = rows.filter((pl.col("candidate") == "o1") & pl.col("field").str.starts_with(
        "slabinfo."))
    assert dict(zip(o1["field"], o1["measured"])) == {
        "slabinfo.order": 0, "slabinfo.objs_per_slab": 8, "slabinfo.limit": 20,
        "slabinfo.batchcount": 10, "slabinfo.sharedfactor": 4}
    rc, text, _ = _cli(["validate", "report", run_dir, "--out", str(out)], capsys)
    assert "target native skipped: the native allocator is a userspace twin" in text
    assert "6.1-slab (allocator SLAB, profile slab-v6.1, 2 runs): compared memory_bytes" in text

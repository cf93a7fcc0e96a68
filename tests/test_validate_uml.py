"""``validate --target uml``: candidates timed on the real 7.2 allocator in User Mode Linux.

The fast tests boot nothing: which topologies UML can express, the option checks, the rows
a pair's runs give, and the command's one-line errors.  The slow test validates a small
candidate list for real (the 7.2-uml kernel booted for every run, a second or less each),
checks the stored rows, the report's ``speed_source`` and Spearman, a resumed run that was
cut short, and ``report --repredict``; it skips where scripts/build-kernels.sh has not built
the UML kernel.
"""

from __future__ import annotations

import json
import shutil

import polars as pl
import pytest

from slabtune import cli
from slabtune.errors import SlabtuneError
from slabtune.kernel import build
from slabtune.kernel import uml as uml_kernel
from slabtune.model.topology import Topology
from slabtune.results import store
from slabtune.validate import uml
from slabtune.validate.schema import row

SPEC = """
[fleet]
profile = "v7.1"

[[fleet.topology]]
name = "up-1"
cpus = 1

[[fleet.topology]]
name = "smp-2"
cpus = 2

[[fleet.topology]]
name = "numa-4x2"
cpus = 4
nodes = 2

[[fleet.workload]]
name = "burst"
churn = 1.0
[fleet.workload.caches]
"kmalloc-512" = { live_per_cpu = 1024, ops = 1.0 }

[validate.native]
cache = "kmalloc-512"
steps = 2000
workload = { kind = "local", live = 1024, burst = 1024 }
"""

CANDIDATES = """
[[candidate]]
id = "order0"
boot = { slub_max_order = 0 }

[[candidate]]
id = "order2"
boot = { slub_min_order = 2 }
knobs = { min_partial_lo = 9, min_partial_hi = 9, order_objects_mul = 6 }
"""


def _cli(argv, capsys) -> tuple[int, str, str]:
    rc = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


def _uml_missing() -> str | None:
    if build.kernel_path(uml_kernel.UML_KERNEL) is None \
            or build.build_tree(uml_kernel.UML_KERNEL) is None:
        return (f"kernel {uml_kernel.UML_KERNEL} is not built; run scripts/build-kernels.sh "
                f"--only {uml_kernel.UML_KERNEL}")
    return uml.uml_available()


def _files(tmp_path, spec: str = SPEC) -> tuple:
    (tmp_path / "spec.toml").write_text(spec)
    (tmp_path / "cands.toml").write_text(CANDIDATES)
    return tmp_path / "spec.toml", tmp_path / "cands.toml"


# --------------------------------------------------------------------------- pure parts


def test_topologies_uml_cannot_express_are_skipped_with_their_reason():
    assert uml.expressible(Topology.uniform(2), limit=2) is None
    assert "UML has no NUMA" in uml.expressible(Topology.uniform(4, 2), limit=16)
    ml = Topology.uniform(4, 2, memoryless_nodes=(1,))
    assert "UML has no NUMA" in uml.expressible(ml, limit=16)
    assert "more than the 2 virtual CPUs" in uml.expressible(Topology.uniform(4), limit=2)
    hot = Topology.uniform(2, possible=4)
    assert "UML brings up every CPU" in uml.expressible(hot, limit=16)


@pytest.mark.parametrize("args, msg", [
    ((0, None, None), "--uml-runs: 0 is outside 1..50"),
    ((3, 10, None), "--uml-ops: 10 is outside 1000..10000000"),
    ((3, None, 65), "--uml-max-cpus: 65 is outside 1..64"),
    ((True, None, None), "--uml-runs: True"),
])
def test_options_are_checked(args, msg):
    with pytest.raises(SlabtuneError, match=msg):
        uml.check_options(*args)
    assert uml.check_options(None, None, None)["runs"] == uml.DEFAULT_RUNS


def _td() -> dict:
    return {"index": 3, "candidate": {"id": "c", "boot": {}, "knobs": {}},
            "topology": "up-1", "target": "uml",
            "uml": {"doc": {"cache": {"name": "kmalloc-512"}},
                    "applied": {"boot": {}, "sysfs": {}, "not_applied": {}},
                    "predicted": {"ns_per_pair": 100.0, "profile": "v7.1",
                                  "counters_per_pair": {"alloc_slab": 0.01,
                                                        "cpu_partial_drain": 0.0}}}}


def _good(rnd: int, ns: float) -> dict:
    return {"round": rnd, "ok": True, "ns_per_pair": ns, "ns_per_pair_all": ns + 5,
            "alloc_long": 1, "free_long": 0, "release": "7.2.13-slabtune-uml",
            "cmdline": "mem=256M ncpus=1", "seconds": 0.5,
            "counters_per_pair": {"alloc_slab": 0.02 * (rnd + 1)}}


def test_a_pair_is_the_median_of_its_good_runs():
    runs = [_good(0, 120.0), {"round": 1, "ok": False, "error": "timed out after 120 s",
                              "seconds": 120.0}, _good(2, 100.0), _good(3, 140.0)]
    rows = uml.pair_rows(_td(), runs, 4)
    by = {r["field"]: r for r in rows}
    t = by[uml.UML_FIELD]
    assert (t["predicted"], t["measured"], t["comparable"]) == (100.0, 120.0, True)
    assert t["accelerator"] == "uml" and t["attempts"] == 4 and t["kernel"] == "7.2-uml"
    assert t["note"].startswith("3 of 4 runs good (1 failed: timed out after 120 s)")
    assert by[uml.UML_ALL_FIELD]["measured"] == 125.0
    assert by[uml.UML_ALL_FIELD]["comparable"] is False
    assert by["uml_counters.alloc_slab"]["measured"] == pytest.approx(0.06)
    # a counter the kernel has no file for is not measured, not a zero
    drain = by["uml_counters.cpu_partial_drain"]
    assert drain["measured"] is None and drain["comparable"] is False
    assert set(rows[0]) == set(row(_td()))


def test_a_pair_without_a_good_run_is_one_failed_row():
    rows = uml.pair_rows(_td(), [{"round": 0, "ok": False, "error": "no end marker",
                                  "console_tail": "x" * 5000}], 1)
    assert len(rows) == 1 and rows[0]["status"] == "failed"
    assert rows[0]["error"] == "no good run of 1: no end marker"


# --------------------------------------------------------------------------- bad input


@pytest.mark.parametrize("extra, msg", [
    (["--target", "umlx"], "--target: 'umlx' is not one of guest, host, native, lab, uml"),
    (["--target", "uml", "--uml-runs", "0"], "--uml-runs: 0 is outside 1..50"),
    (["--target", "uml", "--repredict"], "--repredict: only with 'validate report RUN'"),
])
def test_bad_input_is_one_line_and_exit_2(extra, msg, tmp_path, capsys):
    spec, cands = _files(tmp_path)
    rc, out, err = _cli(["validate", "--candidate", cands, "--topologies", spec,
                         "--out", tmp_path / "runs", *extra], capsys)
    assert rc == 2 and out == ""
    assert err == f"slabtune: error: {msg}\n"
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


@pytest.mark.parametrize("change, msg", [
    # a cache the UML kernel's lab module cannot drive
    (("kmalloc-512", "kmalloc-300"), None),
    # every topology needs NUMA
    (("cpus = 1\n", "cpus = 2\nnodes = 2\n"), None),
])
def test_what_uml_cannot_run_is_refused_before_any_boot(change, msg, tmp_path, capsys):
    why = _uml_missing()
    if why:
        pytest.skip(why)
    if change[1] == "kmalloc-300":
        text = SPEC.replace('"kmalloc-512" = {', 'dentry = {').replace(
            'cache = "kmalloc-512"', 'cache = "dentry"')
        msg = "candidate baseline (uml, up-1): cache.name: 'dentry' is not a kmalloc cache"
    else:
        text = SPEC.replace('name = "up-1"\ncpus = 1\n', 'name = "up-1"\ncpus = 2\nnodes = 2\n')
        text = text.replace('name = "smp-2"\ncpus = 2\n', 'name = "smp-2"\ncpus = 2\nnodes = 2\n')
        msg = ("--target uml: no topology of spec spec can run under UML (up-1: 2 nodes: "
               "UML has no NUMA")
    spec, cands = _files(tmp_path, text)
    rc, out, err = _cli(["validate", "--candidate", cands, "--topologies", spec,
                         "--target", "uml", "--out", tmp_path / "runs"], capsys)
    assert rc == 2 and err.startswith(f"slabtune: error: {msg}") and err.count("\n") == 1


# --------------------------------------------------------------------------- a real run


@pytest.mark.slow
@pytest.mark.guest
def test_validate_target_uml_times_the_real_allocator(ray_local, tmp_path, capsys):
    """The baseline and two candidates on a 1-CPU and a 2-CPU topology (the NUMA one is
    skipped with its reason), 2 interleaved runs each: every pair stores the model's ns per
    pair beside the median measured one and its counters; boot parameters reach UML's
    command line and min_partial the cache's sysfs file; the report's speed source is uml
    with a Spearman over 6 pairs.  Then the run is cut short by hand (the last pair's part,
    its chunk state and its second round removed) and resumed: that pair runs one round
    more and no row is written twice.  ``report --repredict`` gives the same predictions
    as were stored (the model did not change in between)."""
    why = _uml_missing()
    if why:
        pytest.skip(why)
    spec, cands = _files(tmp_path)
    rc, out, err = _cli(["validate", "--candidate", cands, "--topologies", spec,
                         "--target", "uml", "--uml-runs", "2", "--uml-ops", "20000",
                         "--uml-max-cpus", "2", "--out", tmp_path / "runs", "--json"], capsys)
    assert rc == 0, err
    res = json.loads(out)
    assert (res["tasks"], res["failed"]) == (6, 0)
    run = store.open_run(res["run_dir"])
    meta = run.manifest["spec"]
    assert meta["uml_topologies"] == ["up-1", "smp-2"]
    assert [s["topology"] for s in meta["uml_skipped"]] == ["numa-4x2"]
    assert meta["uml_profile"] == "v7.1" and meta["uml_runs"] == 2
    rows = run.collect()
    assert set(rows["target"]) == {"uml"} and set(rows["status"]) == {"ok"}
    t = rows.filter(pl.col("field") == uml.UML_FIELD)
    assert t.height == 6 and t["comparable"].all()
    assert (t["predicted"] > 0).all() and (t["measured"] > 0).all()
    assert set(t["accelerator"]) == {"uml"} and set(t["profile"]) == {"v7.1"}
    for r in t.iter_rows(named=True):
        applied = json.loads(r["applied"])
        if r["candidate"] == "order0":
            assert "slub_max_order=0" in applied["cmdline"].split()
            assert applied["sysfs"] == {}
        elif r["candidate"] == "order2":
            assert "slub_min_order=2" in applied["cmdline"].split()
            assert applied["sysfs"] == {"min_partial": 9}
            assert applied["not_applied"] == {"order_objects_mul": 6}
    counters = rows.filter(pl.col("field") == "uml_counters.alloc_slab")
    assert counters.height == 6 and counters["comparable"].all()
    assert all(len(v) == 2 and all(x["ok"] for x in v)
               for v in run.manifest["uml_runs"].values())

    rc, out, err = _cli(["validate", "report", res["run_dir"], "--json"], capsys)
    assert rc == 0, err
    rep = json.loads(out)
    assert rep["speed_source"] == "uml" and rep["speed"]["pairs"] == 6
    assert isinstance(rep["spearman_time"], float) and -1 <= rep["spearman_time"] <= 1
    assert rep["uml"]["spearman"] == rep["spearman_time"]
    assert rep["uml"]["candidates"] == 3 and rep["uml"]["noise"]["median_rel_sd"] is not None
    assert rep["uml"]["skipped_topologies"][0]["topology"] == "numa-4x2"
    rc, text, err = _cli(["validate", "report", res["run_dir"]], capsys)
    assert "source uml" in text and "skipped topology numa-4x2: 2 nodes" in text

    # cut the run short: the last pair lost its part and its second round
    last = str(run.n_chunks - 1)
    state = run.manifest["chunks"]["states"].pop(last)
    (run.path / state["part"]).unlink()
    run.manifest["uml_runs"][last] = [x for x in run.manifest["uml_runs"][last]
                                      if x["round"] == 0]
    run.manifest["ended"] = None
    run.save()
    rc, out, err = _cli(["validate", "--resume", res["run_dir"], "--json"], capsys)
    assert rc == 0, err
    assert json.loads(out) == {"run_dir": res["run_dir"], "tasks": 6, "failed": 0}
    again = store.open_run(res["run_dir"])
    assert again.complete
    rows2 = again.collect()
    assert rows2.height == rows.height
    assert rows2.group_by("task", "field").len()["len"].max() == 1
    assert sorted(x["round"] for x in again.manifest["uml_runs"][last]) == [0, 1]
    assert again.manifest["attempts"][-1].get("resumed") is True

    from slabtune.validate import report

    fresh = report.report(again)
    redo = report.report(again, repredict=True)
    assert redo["uml"]["repredicted"] is True
    for a, b in zip(fresh["uml"]["pair_table"], redo["uml"]["pair_table"]):
        assert b["predicted_ns"] == pytest.approx(a["predicted_ns"], rel=1e-5)
        assert b["measured_ns"] == a["measured_ns"]
    shutil.rmtree(tmp_path / "runs", ignore_errors=True)


# --------------------------------------------------------------------------- the rig term


def test_the_uml_prediction_is_the_model_price_plus_the_rig_term_per_irq_off_section():
    """UML costs ``uml_section_ns`` more per lock section taken with interrupts off
    (7.2's list_lock, barn lock and zone->lock are all spin_lock_irqsave): the predicted
    UML time of a pair is the model's hardware time plus that constant times the pair's
    irq-off sections.  Computed here independently: the constant from the packaged cost
    file's header (where calibrate fit writes it), the sections from the model's own
    per-1000-ops lock figures (metrics.compute: list_lock_per_kop, barn_lock_per_kop,
    zone_lock_per_kop) of the same simulation, times 2 / 1000 per pair."""
    import re
    import tomllib

    from slabtune.model import profiles
    from slabtune.sweeps import simconfig, simulate
    from slabtune.validate import lab
    from slabtune.validate.candidates import parse_candidates
    from slabtune.validate.spec import parse_spec

    header = simconfig.default_cost_text()
    (rig_ns,) = map(float, re.findall(r"^#\s+uml_section_ns = ([0-9.]+) ns", header, re.M))
    assert 0 < rig_ns <= 600
    prof = profiles.PROFILES["v7.1"]
    spec = parse_spec(SPEC, "spec")
    cands = parse_candidates(tomllib.loads(CANDIDATES), "cands", prof)
    docs = [uml.pair_doc(spec, c, t, prof)[0] for c in cands for t in ("up-1", "smp-2")]
    got = uml.predict(docs, prof)
    cost, _ = simconfig.load_cost(None)
    rows = simulate.run([lab.spec_for(d, prof) for d in docs], cost)
    for p, m in zip(got, rows):
        sections = 2.0 / 1000.0 * (m["list_lock_per_kop"] + m["barn_lock_per_kop"]
                                   + m["zone_lock_per_kop"])
        assert sections > 0.01    # bursts of 1024 take the barn and the list_lock
        assert p["table_ns_per_pair"] == pytest.approx(m["ns_per_op"], rel=1e-6)
        assert p["rig_events_per_pair"]["uml_section_ns"] == pytest.approx(sections, rel=1e-4)
        assert p["ns_per_pair"] == pytest.approx(m["ns_per_op"] + rig_ns * sections, rel=1e-5)
        assert p["rig"] == {"values": {"uml_section_ns": rig_ns},
                            "source": "cost_default.toml header"}


def test_the_rig_term_is_read_from_the_cost_file_header(tmp_path):
    # a table fitted with the rig term names it in its header; one that does not gives the
    # table's price alone, and says so
    line = ("#   uml_section_ns = 321.5 ns, what UML adds to each lock section taken with "
            "interrupts off\n")
    named = tmp_path / "named.toml"
    named.write_text(line + "[cost]\nalloc_fast_ns = 10\n")
    assert uml.rig_term(str(named)) == {"values": {"uml_section_ns": 321.5},
                                        "source": f"{named} header"}
    bare = tmp_path / "bare.toml"
    bare.write_text("[cost]\nalloc_fast_ns = 10\n")
    assert uml.rig_term(str(bare))["values"] == {}
    assert "none named in" in uml.rig_term(str(bare))["source"]
    bad = tmp_path / "bad.toml"
    bad.write_text(line.replace("321.5", "900") + "[cost]\n")
    with pytest.raises(SlabtuneError, match=r"bad.toml: uml_section_ns: '900' in the header "
                                            r"is not a number in 0-600 ns"):
        uml.rig_term(str(bad))


def test_the_report_gives_rank_and_absolute_agreement():
    # three pairs: predicted 150 (table 100) against 120 measured, 300 (table 250) against
    # 400, 450 (table 400) against 500
    def td(i: int, table: float, rig: float) -> dict:
        t = _td()
        t["index"] = i
        t["candidate"] = {"id": f"c{i}", "boot": {}, "knobs": {}}
        t["uml"]["predicted"].update(
            ns_per_pair=table + rig, table_ns_per_pair=table,
            rig_events_per_pair={"uml_section_ns": rig / 500.0},
            rig={"values": {"uml_section_ns": 500.0}, "source": "cost_default.toml header"})
        return t

    rows = [r for i, (table, rig, ns) in enumerate([(100.0, 50.0, 120.0),
                                                    (250.0, 50.0, 400.0),
                                                    (400.0, 50.0, 500.0)])
            for r in uml.pair_rows(td(i, table, rig), [_good(0, ns)], 1)]
    by = {(r["task"], r["field"]): r for r in rows}
    assert by[(0, uml.UML_FIELD)]["predicted"] == 150.0
    assert "the table's 100.0 ns + the rig term (uml_section_ns 500 ns x 0.1000 per pair; " \
        "cost_default.toml header)" in by[(0, uml.UML_FIELD)]["note"]
    assert by[(0, uml.UML_TABLE_FIELD)]["predicted"] == 100.0
    assert by[(0, uml.UML_TABLE_FIELD)]["comparable"] is False
    from slabtune.validate.schema import ROW_SCHEMA

    s = uml.summary(pl.DataFrame(rows, schema=ROW_SCHEMA))
    assert s["spearman"] == pytest.approx(1.0)
    assert s["ratio"] == {"median": pytest.approx(0.9), "min": pytest.approx(0.75),
                          "max": pytest.approx(1.25)}
    assert s["table_alone"] == {"pairs": 3, "spearman": pytest.approx(1.0),
                                "ratio": {"median": pytest.approx(0.8),
                                          "min": pytest.approx(0.625),
                                          "max": pytest.approx(100 / 120)}}
    assert [p["ratio"] for p in s["pair_table"]] == [pytest.approx(1.25), pytest.approx(0.75),
                                                     pytest.approx(0.9)]
    assert [p["table_ns"] for p in s["pair_table"]] == [100.0, 250.0, 400.0]
    text = "\n".join(uml.format_summary(s))
    assert "predicted / measured ns per pair (the model's price plus UML's rig term per " \
           "irq-off lock section): median 0.90 (0.75-1.25); the table's price alone: median " \
           "0.80 (0.62-0.83), Spearman 1.000" in text

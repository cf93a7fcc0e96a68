"""Bad input through the real CLI: each case fails with one stderr line
``slabtune: error: ...`` naming the file or field, exit status 2, no traceback, and leaves
what was already written as it was.  The cases are the ones a new user met: grids far
beyond memory, NaN/inf numbers, files where directories go (and the reverse), study names
used as paths, torn journal records, boot parameters checked before a kernel is looked
for, odd topologies, bad snapshots, binary TOML, in-memory and half-created studies,
SIGTERM with a local Ray running, and random malformed TOML/CSV (hypothesis).

Commands run in-process through :func:`slabtune.cli.main` unless a test needs a process of
its own (signals).  The hypothesis tests stub the model stage (simulate.run, the study's
creation, check.predict_boot) so no JAX runs in their loop; BAD_INPUT_EXAMPLES=N runs N
examples per target instead of 100."""

from __future__ import annotations

import contextlib
import csv
import glob
import io
import json
import math
import os
import shlex
import signal
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import numpy as np
import pytest
import tomli_w
from _cli import error_line, run
from conftest import _pids_naming
from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st

from slabtune import cli
from slabtune.commands import jsonout
from slabtune.commands.tune import next_hint
from slabtune.results import store
from slabtune.sweeps.spec import MAX_GRID_ROWS

ROOT = Path(__file__).resolve().parents[1]
DATA = Path(__file__).parent / "data"
SNAPSHOT = DATA / "host_snapshot_6.18.csv"
EXAMPLE = ROOT / "examples" / "hackbench-v5.11.toml"
TUNE_QUICK = ROOT / "sweeps" / "tune_quick.toml"


def snapshot_tree(path: Path) -> dict[str, bytes]:
    """Every file under ``path`` with its bytes (what 'nothing written is lost' compares)."""
    return {str(p.relative_to(path)): p.read_bytes()
            for p in sorted(path.rglob("*")) if p.is_file()}


def sim_doc(**tables) -> dict:
    """The hackbench example config with some tables replaced."""
    doc = tomllib.loads(EXAMPLE.read_text())
    doc.update(tables)
    return doc


def write_toml(path: Path, doc: dict) -> Path:
    path.write_text(tomli_w.dumps(doc))
    return path


# --------------------------------------------------------------------------- 1: huge grids


BIG_SPEC = """
[sweep]
name = "big"
chunk_size = 4194304
[topology]
cpus = { range = [1, 8192] }
nodes = { range = [1, 64] }
[cache]
size = { range = [8, 4096] }
[kernel]
profile = "all"
[boot]
min_order = { range = [0, 10] }
max_order = { range = [0, 10] }
min_objects = { range = [0, 100] }
"""
BIG_PRODUCT = 8192 * 64 * 4089 * 8 * 11 * 11 * 101


def test_sweep_run_refuses_a_grid_over_the_limit_before_writing(tmp_path):
    spec = tmp_path / "big.toml"
    spec.write_text(BIG_SPEC)
    out = tmp_path / "runs"
    (out / "earlier").mkdir(parents=True)
    (out / "earlier" / "keep.txt").write_text("results of an earlier run")
    before = snapshot_tree(out)
    rc, stdout, err = run("sweep", "run", spec, "--out", out, "--quiet")
    line = error_line(rc, err, "big.toml: grid:", str(BIG_PRODUCT), str(MAX_GRID_ROWS))
    assert "over the limit" in line and stdout == ""
    assert snapshot_tree(out) == before           # no run directory, nothing removed


def test_sweep_plan_sizes_a_grid_over_the_limit_and_says_run_would_refuse(tmp_path):
    spec = tmp_path / "big.toml"
    spec.write_text(BIG_SPEC)
    rc, out, err = run("sweep", "plan", spec)
    assert rc == 0 and err == ""
    assert f"configs: {BIG_PRODUCT} before exclusions" in out
    assert f"limit: {MAX_GRID_ROWS} configurations per sweep run" in out
    assert "refused: sweep run would refuse this grid" in out
    rc, out, _ = run("sweep", "plan", spec, "--json")
    doc = json.loads(out)
    assert rc == 0 and doc["product"] == BIG_PRODUCT and doc["configs"] is None
    assert doc["max_configs"] == MAX_GRID_ROWS and "over the limit" in doc["refused"]
    rc, out, _ = run("sweep", "plan", "quick", "--json")
    assert rc == 0 and json.loads(out)["refused"] is None


def test_pending_chunks_are_lazy_whatever_the_grid(tmp_path):
    # a list of every pending chunk index of this run would need terabytes
    run_ = store.Run(tmp_path, {"run_id": "r", "chunks": {"total": 10**13, "states": {
        "0": {"state": "done", "rows": 1}, "2": {"state": "failed"}}}})
    pending = run_.iter_pending()
    assert [next(pending) for _ in range(3)] == [1, 2, 3]
    assert run_.pending_count() == 10**13 - 1


def test_a_range_far_beyond_an_axis_is_refused_before_it_is_expanded(tmp_path):
    spec = tmp_path / "wide.toml"
    spec.write_text(BIG_SPEC.replace("range = [1, 8192]", "range = [1, 1000000000000]"))
    rc, _, err = run("sweep", "plan", spec)
    error_line(rc, err, "wide.toml: topology.cpus: value 8193 is outside 1..8192")
    spec.write_text(BIG_SPEC.replace("{ range = [1, 8192] }",
                                     "{ logrange = [1, 8192], factor = 1.0000000001 }"))
    rc, _, err = run("sweep", "plan", spec)
    error_line(rc, err, "topology.cpus.factor", "at most")


# --------------------------------------------------------------------------- 2: NaN and inf


@pytest.mark.parametrize("literal", ["nan", "inf", "-inf"])
def test_simulate_refuses_non_finite_numbers_in_a_config(tmp_path, literal):
    cfg = tmp_path / "sim.toml"
    cfg.write_text(EXAMPLE.read_text().replace("other_ns = 0.0", f"other_ns = {literal}"))
    rc, out, err = run("simulate", cfg, "--json")
    error_line(rc, err, "sim.toml", "workload.other_ns", "not a finite number")
    assert out == ""


@pytest.mark.parametrize("literal", ["nan", "inf"])
def test_simulate_refuses_non_finite_cost_constants(tmp_path, literal):
    cost = tmp_path / "cost.toml"
    cost.write_text(f"[cost]\nalloc_fast_ns = {literal}\n")
    rc, out, err = run("simulate", EXAMPLE, "--cost", cost, "--json")
    error_line(rc, err, "cost.toml", "cost.alloc_fast_ns", "not a finite number")
    assert out == ""


def test_sweep_spec_refuses_a_non_finite_logrange_factor(tmp_path):
    spec = tmp_path / "nan.toml"
    spec.write_text((ROOT / "sweeps" / "quick.toml").read_text().replace(
        "factor = 2", "factor = nan"))
    rc, _, err = run("sweep", "plan", spec)
    error_line(rc, err, "nan.toml: topology.cpus.factor", "finite")


@pytest.mark.parametrize("old, new, field", [
    ("weight = 2.0", "weight = nan", "fleet.topology[0].weight"),
    ("weight = 2.0", "weight = inf", "fleet.topology[0].weight"),
    ("foreign_free = 0.6", "foreign_free = nan", "fleet.workload[0].foreign_free"),
    ('"kmalloc-256" = { live_per_cpu = 4096', '"kmalloc-256" = { live_per_cpu = inf',
     "fleet.workload[0].caches.kmalloc-256.live_per_cpu"),
    ("max_regression = 0.25", "max_regression = nan", "objectives.max_regression"),
])
def test_tune_spec_refuses_non_finite_numbers(tmp_path, monkeypatch, old, new, field):
    monkeypatch.chdir(tmp_path)
    spec = tmp_path / "t.toml"
    text = TUNE_QUICK.read_text()
    assert old in text
    spec.write_text(text.replace(old, new, 1))
    rc, _, err = run("tune", spec, "--trials", "1", "--storage", "memory:")
    error_line(rc, err, field)
    assert not (tmp_path / "runs").exists()


VALIDATE_SPEC = """
[validate]
timeout_s = 60
[validate.native.workload]
kind = "local"
live = 64
[fleet]
profile = "v6.18"
[[fleet.topology]]
name = "two"
cpus = 2
[[fleet.workload]]
name = "w"
[fleet.workload.caches]
"kmalloc-512" = { live_per_cpu = 64, ops = 1.0 }
"""
CANDIDATE = '[[candidate]]\nid = "o1"\nboot = { slub_max_order = 1 }\n'


@pytest.mark.parametrize("old, new, field", [
    ("timeout_s = 60", "timeout_s = nan", "validate.timeout_s"),
    ("live = 64", "live = 64\nother_ns = inf", "validate.native.workload.other_ns"),
    ("ops = 1.0", "ops = nan", "fleet.workload[0].caches.kmalloc-512.ops"),
])
def test_validate_spec_refuses_non_finite_numbers(tmp_path, old, new, field):
    spec = tmp_path / "v.toml"
    spec.write_text(VALIDATE_SPEC.replace(old, new))
    cand = tmp_path / "c.toml"
    cand.write_text(CANDIDATE)
    rc, _, err = run("validate", "--candidate", cand, "--topologies", spec,
                     "--out", tmp_path / "runs", "--target", "native")
    error_line(rc, err, field)
    assert not (tmp_path / "runs").exists()


def test_json_output_never_prints_bare_nan_or_infinity():
    text = jsonout.dumps({"a": float("nan"), "b": [np.float32("inf"), 1.5],
                          "c": np.array([1.0, -np.inf]), "d": {"e": -math.inf}})
    assert json.loads(text, parse_constant=lambda c: pytest.fail(f"bare {c}")) == {
        "a": None, "b": [None, 1.5], "c": [1.0, None], "d": {"e": None}}


@pytest.mark.parametrize("argv", [["simulate"], ["kernel", "check"], ["sweep", "plan"],
                                  ["sweep", "run"], ["tune"], ["pareto"], ["results", "list"],
                                  ["results", "show"],
                                  ["reproduce"], ["validate"], ["guest", "boot"]])
def test_every_json_help_says_how_non_finite_numbers_print(argv, capsys):
    with pytest.raises(SystemExit):
        cli.main([*argv, "--help"])
    assert jsonout.NON_FINITE_HELP in " ".join(capsys.readouterr().out.split())


# --------------------------------------------------------------------------- 3: paths


def _existing(tmp_path: Path) -> tuple[Path, Path]:
    f = tmp_path / "afile"
    f.write_text("already here")
    d = tmp_path / "adir"
    d.mkdir()
    return f, d


PATH_CASES = [
    # (argv with {file} / {dir} placeholders, needles)
    (["sweep", "run", "quick", "--out", "{file}"], ["--out: {file} is a file, not a directory"]),
    (["sweep", "run", "quick", "--out", "{file}/sub"],
     ["--out: {file}/sub: {file} is a file, not a directory"]),
    (["main", "--out", "{file}"], ["--out: {file} is a file, not a directory"]),
    (["tune", "tune_quick", "--trials", "0", "--run-dir", "{file}"],
     ["--run-dir: {file} is a file, not a directory"]),
    (["tune", "tune_quick", "--trials", "0", "--run-dir", "{file}/x"],
     ["--run-dir: {file}/x: {file} is a file"]),
    (["tune", "tune_quick", "--trials", "0", "--storage", "journal:{file}/s.log"],
     ["storage:", "{file} is a file, not a directory"]),
    (["tune", "tune_quick", "--trials", "0", "--storage", "journal:{dir}"],
     ["storage:", "needs a file path"]),
    (["tune", "{dir}", "--trials", "0"], ["spec: {dir}", "is a directory"]),
    (["kernel", "snapshot", "--out", "{dir}"], ["--out: {dir} is a directory, not a file"]),
    (["kernel", "snapshot", "--out", "{file}/s.csv"], ["--out: {file}/s.csv: {file} is a file"]),
    (["kernel", "check", "--snapshot", "{dir}/x.csv"], ["{dir}/x.csv", "no such file"]),
    (["kernel", "check", "--snapshot", "{dir}"], ["{dir}", "unknown snapshot format"]),
    (["kernel", "check", "--snapshot", "{file}/x.csv"],
     ["{file}/x.csv: cannot read snapshot: {file} is a file, not a directory"]),
    (["simulate", "{dir}"], ["config: {dir} is a directory, not a file"]),
    (["simulate", "{file}/c.toml"], ["config: {file}/c.toml: a parent of it is a file"]),
    (["simulate", str(EXAMPLE), "--cost", "{dir}"], ["cost: {dir} is a directory, not a file"]),
    (["reproduce", "--cost", "{dir}"], ["cost: {dir} is a directory, not a file"]),
    (["reproduce", "--fit-cost", "{dir}"], ["--fit-cost: {dir} is a directory, not a file"]),
    (["sweep", "plan", "{dir}"], ["spec: {dir} is a directory, not a file"]),
    (["results", "list", "--out", "{file}"], ["--out: {file} is a file, not a directory"]),
    (["results", "show", "x", "--out", "{file}"], ["--out: {file} is a file, not a directory"]),
    (["plot", "orders", "--out", "{dir}"], ["--out: {dir} is a directory, not a file"]),
    (["plot", "pareto", "--study", "s", "--out", "{file}/p.html"], ["--out:", "is a file"]),
    (["export", "--study", "s", "--trial", "0", "--format", "json", "--out", "{dir}"],
     ["--out: {dir} is a directory, not a file"]),
    (["pareto", "--run", "{file}"], ["run: {file} is not a directory"]),
    (["validate", "--candidate", "{dir}", "--topologies", "validate_quick"],
     ["--candidate: {dir} is a directory, not a file"]),
    (["validate", "--candidate", "{file}", "--topologies", "validate_quick", "--out", "{file}"],
     ["--out: {file} is a file, not a directory"]),
    (["validate", "report", "r", "--out", "{file}"], ["--out: {file} is a file, not a directory"]),
    (["guest", "boot", "--out", "{dir}"], ["--out: {dir} is a directory, not a file"]),
    (["guest", "boot", "--after", "{file}/a.csv"], ["--after: {file}/a.csv: {file} is a file"]),
]


@pytest.mark.parametrize("argv, needles", PATH_CASES, ids=[" ".join(a[:2]) + f"-{i}"
                                                           for i, (a, _) in
                                                           enumerate(PATH_CASES)])
def test_files_and_directories_in_the_wrong_place(tmp_path, monkeypatch, argv, needles):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SLABTUNE_CACHE", str(tmp_path / "cache"))
    f, d = _existing(tmp_path)
    fill = lambda s: s.replace("{file}", str(f)).replace("{dir}", str(d))  # noqa: E731
    rc, _, err = run(*[fill(a) for a in argv])
    error_line(rc, err, *[fill(n) for n in needles])
    assert f.read_text() == "already here" and list(d.iterdir()) == []
    assert not (tmp_path / "runs").exists()


# --------------------------------------------------------------------------- 4: study names


@pytest.mark.parametrize("name", ["../../x", "..", ".hidden", "a/b", "a b", "x" * 200, ""])
def test_study_names_that_are_not_names_are_refused(tmp_path, monkeypatch, name):
    work = tmp_path / "a" / "b"
    work.mkdir(parents=True)
    monkeypatch.chdir(work)
    rc, _, err = run("tune", "tune_quick", "--trials", "0", "--study", name)
    error_line(rc, err, "--study")
    rc, _, err = run("pareto", "--study", name)
    error_line(rc, err, "--study")
    assert set(tmp_path.rglob("*")) == {tmp_path / "a", work}   # nothing written


def test_next_hints_are_shell_quoted():
    url = "journal:/tmp/my dir/it's.log"
    hint = next_hint("s1", url, url)
    assert hint.startswith("next: ")
    assert shlex.split(hint[len("next: "):]) == ["slabtune", "pareto", "--study", "s1",
                                                 "--storage", url]
    assert next_hint("s1", None, "sqlite:///x/study.db") == "next: slabtune pareto --study s1"
    note = next_hint("s1", "memory:", "memory:")
    assert not note.startswith("next:") and "gone" in note


@pytest.mark.slow
def test_an_in_memory_study_gets_no_next_hint(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    rc, out, err = run("tune", "tune_quick", "--trials", 0, "--storage", "memory:")
    assert rc == 0, err
    assert "next:" not in err and "gone" in err and "memory" in err
    assert not (tmp_path / "runs").exists()


# --------------------------------------------------------------- 5, 7g, 7h: tune storages


def _journal_trials(path: Path, name: str = "s") -> int:
    import optuna

    from slabtune.tuner import study as studies

    st_ = studies.open_storage(f"journal:{path}", create=False)
    return len(optuna.load_study(study_name=name, storage=st_).trials)


@pytest.mark.slow
def test_a_torn_journal_record_is_cut_off_and_kept_and_the_study_stays_readable(tmp_path):
    log = tmp_path / "study.log"
    url = f"journal:{log}"
    rc, _, err = run("tune", "tune_quick", "--trials", 4, "--batch", 4, "--study", "s",
                     "--storage", url)
    assert rc == 0, err
    intact = log.read_bytes()
    assert intact.endswith(b"\n") and _journal_trials(log) == 4

    # an intact journal is resumed as is: no note, no copy, nothing rewritten
    rc, _, err = run("tune", "tune_quick", "--trials", 2, "--batch", 2, "--study", "s",
                     "--storage", url)
    assert rc == 0 and "slabtune: note" not in err
    assert not list(tmp_path.glob("study.log.torn-*"))
    resumed = log.read_bytes()
    assert resumed.startswith(intact) and _journal_trials(log) == 6

    # a crash mid-write: the last record is half there, without its newline
    torn = b'{"op_code": 5, "worker_id": "w", "trial_id": 6, "sta'
    log.write_bytes(resumed + torn)
    rc, _, err = run("pareto", "--study", "s", "--storage", url, "--json")   # reading only
    assert rc == 0, err
    assert log.read_bytes() == resumed + torn
    rc, _, err = run("tune", "tune_quick", "--trials", 2, "--batch", 2, "--study", "s",
                     "--storage", url)
    assert rc == 0, err
    notes = [ln for ln in err.splitlines() if ln.startswith("slabtune: note")]
    assert len(notes) == 1 and notes[0].startswith("slabtune: note: journal")
    [copy] = tmp_path.glob("study.log.torn-*")
    assert copy.read_bytes() == torn and str(copy) in notes[0]
    after = log.read_bytes()
    assert after.startswith(resumed) and after.endswith(b"\n")
    assert _journal_trials(log) == 8
    rc, out, err = run("pareto", "--study", "s", "--storage", url, "--json")
    assert rc == 0 and json.loads(out)["study"] == "s"


def test_torn_tail_offset_finds_the_start_of_the_partial_record(tmp_path):
    from slabtune.tuner.study import repair_torn_journal, torn_tail_offset

    log = tmp_path / "j.log"
    for content, offset in ((b"", None), (b"{}\n", None), (b"{}\n{\"a", 3), (b"{\"a", 0),
                            (b"x" * 70000 + b"\n" + b"y" * 70000, 70001)):
        log.write_bytes(content)
        assert torn_tail_offset(log, block=4096) == offset, content[:8]
    log.write_bytes(b"{}\n{}\n")
    assert repair_torn_journal(log) is None and log.read_bytes() == b"{}\n{}\n"


@pytest.mark.parametrize("attrs", [{}, {"slabtune_spec": "x"}])
def test_a_study_killed_while_being_created_is_called_incomplete(tmp_path, monkeypatch,
                                                                  attrs):
    import optuna

    from slabtune.tuner import study as studies

    monkeypatch.chdir(tmp_path)
    log = tmp_path / "s.log"
    url = f"journal:{log}"
    st_ = studies.open_storage(url)
    s = optuna.create_study(study_name="s", storage=st_, directions=["minimize"] * 2)
    for k, v in attrs.items():
        s.set_user_attr(k, v)
    rc, _, err = run("pareto", "--study", "s", "--storage", url)
    line = error_line(rc, err, "'s'", "incomplete")
    assert shlex.join(["slabtune", "tune", "SPEC", "--study", "s", "--storage", url]) in line
    assert "not created by slabtune" not in line


@pytest.mark.slow
def test_an_incomplete_study_is_finished_by_tune_with_its_name(tmp_path, monkeypatch):
    import optuna

    from slabtune.tuner import study as studies

    monkeypatch.chdir(tmp_path)
    url = f"journal:{tmp_path / 's.log'}"
    optuna.create_study(study_name="s", storage=studies.open_storage(url),
                        directions=["minimize"] * 2)
    rc, _, err = run("tune", "tune_quick", "--trials", 2, "--batch", 2, "--study", "s",
                     "--storage", url)
    assert rc == 0, err
    rc, _, err = run("pareto", "--study", "s", "--storage", url)
    assert rc == 0, err


# --------------------------------------------------------------------------- 6: guest --param


@pytest.mark.parametrize("param, needle", [
    ("slub_max_order=11", "boot parameter slub_max_order: 11 is outside 0..10"),
    ("slab_min_objects=-1", "boot parameter slab_min_objects: -1 is outside"),
    ("slub_min_order=two", "boot parameter slub_min_order: 'two' is not an integer"),
    ("slub_debug=1", "boot parameter 'slub_debug' is not allowed by any kernel profile"),
])
def test_guest_boot_checks_params_before_looking_for_a_kernel(tmp_path, monkeypatch, param,
                                                              needle):
    monkeypatch.setenv("SLABTUNE_CACHE", str(tmp_path / "empty-cache"))
    # the same machine state with a good parameter: the error is the missing kernel
    rc, _, err = run("guest", "boot", "--param", "slub_max_order=2", "--workload", "none")
    assert "not found" in error_line(rc, err) and "--param" not in err
    rc, _, err = run("guest", "boot", "--param", param, "--workload", "none")
    line = error_line(rc, err, "--param:", needle)
    assert "not found" not in line


# --------------------------------------------------------------------------- 7: smaller cases


def test_sim_config_nodes_with_neither_cpus_nor_memory_are_refused(tmp_path):
    cfg = write_toml(tmp_path / "c.toml", sim_doc(topology={
        "cpus": 2, "nodes": 4, "memoryless_nodes": [2, 3]}))
    rc, _, err = run("simulate", cfg)
    error_line(rc, err, "c.toml", "topology.memoryless_nodes: node 2", "neither CPUs nor memory")
    # a node with memory and no CPUs is a real thing (CXL memory) and stays accepted
    from slabtune.sweeps import simconfig

    spec = simconfig.load(write_toml(tmp_path / "ok.toml", sim_doc(topology={
        "cpus": 2, "nodes": 3, "memoryless_nodes": [1], "node_cpus": [1, 1, 0]})))
    assert spec.topology.node_cpus == (1, 1, 0)


def test_fleet_nodes_with_neither_cpus_nor_memory_are_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    spec = tmp_path / "t.toml"
    spec.write_text(TUNE_QUICK.read_text().replace(
        "cpus = 96\nnodes = 2\nmemoryless_nodes = [1]",
        "cpus = 1\nnodes = 2\nmemoryless_nodes = [1]"))
    rc, _, err = run("tune", spec, "--trials", "0", "--storage", "memory:")
    error_line(rc, err, "fleet.topology[3]", "node 1 would have neither CPUs nor memory")


def test_duplicate_memoryless_nodes_are_an_error(tmp_path, monkeypatch):
    cfg = write_toml(tmp_path / "c.toml", sim_doc(topology={
        "cpus": 8, "nodes": 4, "memoryless_nodes": [1, 3, 1]}))
    rc, _, err = run("simulate", cfg)
    error_line(rc, err, "topology.memoryless_nodes: node 1 is listed twice")
    monkeypatch.chdir(tmp_path)
    spec = tmp_path / "t.toml"
    spec.write_text(TUNE_QUICK.read_text().replace("memoryless_nodes = [1]",
                                                   "memoryless_nodes = [1, 1]"))
    rc, _, err = run("tune", spec, "--trials", "0", "--storage", "memory:")
    error_line(rc, err, "fleet.topology[3]", "node 1 is listed twice")


def _snapshot_rows(n: int = 3) -> tuple[list[str], list[list[str]]]:
    with open(SNAPSHOT, newline="") as fh:
        rows = list(csv.reader(fh))
    return rows[0], rows[1:n + 1]


def _write_csv(path: Path, header, rows) -> Path:
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(header)
        w.writerows(rows)
    return path


@pytest.mark.parametrize("column, value, needle", [
    ("order", "4000000000", "order is 4000000000 (must be <= 20"),
    ("order", "21", "order is 21 (must be <= 20"),
    ("objs_per_slab", "40000", "objs_per_slab is 40000"),
    ("slab_size", "4294967296", "slab_size is 4294967296"),
    ("order", "-1", "order is -1 (must be >= 0)"),
])
def test_snapshot_values_no_kernel_reports_are_bad_input(tmp_path, column, value, needle):
    header, rows = _snapshot_rows()
    rows[1][header.index(column)] = value
    snap = _write_csv(tmp_path / "s.csv", header, rows)
    rc, out, err = run("kernel", "check", "--snapshot", snap)
    error_line(rc, err, str(snap), f"row 2 (cache {rows[1][header.index('cache')]})", needle)
    assert out == ""


def test_a_sweep_of_impossible_configurations_only_is_refused_and_writes_nothing(tmp_path):
    spec = tmp_path / "imp.toml"
    spec.write_text('[sweep]\nname = "imp"\n[topology]\ncpus = [2, 4]\nnodes = 2\n'
                    'memoryless_nodes = [2, 3]\n[cache]\ncache = "kmalloc-64"\n'
                    '[kernel]\nprofile = "v6.1"\n')
    out = tmp_path / "runs"
    out.mkdir()
    (out / "keep").write_text("x")
    rc, _, err = run("sweep", "plan", spec)
    assert rc == 0
    rc, stdout, err = run("sweep", "run", spec, "--out", out, "--quiet")
    error_line(rc, err, "imp.toml: grid: every one of the 4 configurations", "nothing to run")
    assert stdout == "" and snapshot_tree(out) == {"keep": b"x"}


BINARY = b"\xff\xfe\x00\x81[sweep]\x00\xc3("


@pytest.mark.parametrize("argv, field", [
    (["simulate", "{bin}"], "config: {bin} is not UTF-8"),
    (["simulate", str(EXAMPLE), "--cost", "{bin}"], "cost: {bin} is not UTF-8"),
    (["reproduce", "--cost", "{bin}"], "cost: {bin} is not UTF-8"),
    (["sweep", "plan", "{bin}"], "spec: {bin} is not UTF-8"),
    (["sweep", "run", "{bin}", "--out", "runs"], "spec: {bin} is not UTF-8"),
    (["tune", "{bin}", "--trials", "0"], "spec: {bin} is not UTF-8"),
    (["validate", "--candidate", "{bin}", "--topologies", "validate_quick"],
     "--candidate: {bin} is not UTF-8"),
    (["validate", "--candidate", str(ROOT / "README.md"), "--topologies", "{bin}"],
     "--topologies: {bin} is not UTF-8"),
])
def test_binary_toml_names_the_file(tmp_path, monkeypatch, argv, field):
    monkeypatch.chdir(tmp_path)
    b = tmp_path / "bin.toml"
    b.write_bytes(BINARY)
    rc, _, err = run(*[a.replace("{bin}", str(b)) for a in argv])
    error_line(rc, err, field.replace("{bin}", str(b)))
    assert "codec" not in err and not (tmp_path / "runs").exists()


def test_binary_cost_file_named_by_a_tune_spec(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "c.toml").write_bytes(BINARY)
    spec = tmp_path / "t.toml"
    spec.write_text(TUNE_QUICK.read_text() + 'cost = "c.toml"\n')
    rc, _, err = run("tune", spec, "--trials", "0", "--storage", "memory:")
    error_line(rc, err, "objectives.cost: c.toml is not UTF-8")


@pytest.mark.parametrize("drop", ["sheaf_capacity", "kernel_release", "order"])
def test_a_snapshot_header_one_column_short_names_the_column(tmp_path, drop):
    header, rows = _snapshot_rows()
    short = [c for c in header if c != drop]
    snap = _write_csv(tmp_path / "s.csv", short, rows)     # the rows keep every field
    rc, _, err = run("kernel", "check", "--snapshot", snap)
    line = error_line(rc, err, str(snap), f"missing column(s) {drop}")
    assert "Schema" not in line


def test_a_snapshot_header_short_of_an_extra_column_names_the_row(tmp_path):
    header, rows = _snapshot_rows()
    snap = _write_csv(tmp_path / "s.csv", header[:-1], rows)
    rc, _, err = run("kernel", "check", "--snapshot", snap)
    error_line(rc, err, str(snap), f"row 1: {len(header)} fields but the header names "
                                   f"{len(header) - 1} columns")


# --------------------------------------------------------------------------- 8: SIGTERM


def _ray_started(out: Path) -> bool:
    """Whether the run's manifest records its Ray session (saved once ``ray.init`` has
    returned, before any chunk is done)."""
    for m in out.glob("*/manifest.json"):
        with contextlib.suppress(OSError, ValueError):
            if "ray" in json.loads(m.read_text()):
                return True
    return False


@pytest.mark.slow
@pytest.mark.ray
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_a_terminating_signal_during_a_sweep_shuts_down_the_local_ray(tmp_path, sig):
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled"}
    env.pop("RAY_ADDRESS", None)
    proc = subprocess.Popen([sys.executable, "-m", "slabtune", "sweep", "run", "fleet",
                             "--out", str(tmp_path / "runs")],
                            cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not _ray_started(tmp_path / "runs"):
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "Ray did not start"
            time.sleep(0.1)
        [tmp] = glob.glob(f"/tmp/slt-ray-{proc.pid}-*")
        assert _pids_naming(f"{tmp}/"), "no Ray process runs in the local instance's temp dir"
        assert proc.poll() is None, "the sweep ended before the test could signal it"
        t0 = time.monotonic()
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=60)
        took = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 128 + sig, err
    assert f"slabtune: terminated by {sig.name}" in err and "Traceback" not in err
    assert took < 30
    assert not os.path.exists(tmp)
    for _ in range(50):                  # Ray's processes of this instance are gone too
        if not _pids_naming(f"{tmp}/"):
            break
        time.sleep(0.2)
    assert _pids_naming(f"{tmp}/") == []
    [run_dir] = (tmp_path / "runs").iterdir()
    assert store.open_run(run_dir).manifest["ended"] is None     # partial, resumable


# --------------------------------------------------------------------------- 9: hypothesis


class _Valid(Exception):
    """Raised by the stubbed model stage: the input got through every check."""


def _leaf_paths(doc, prefix=()):
    """Paths (keys and list indices) of every value in a TOML document."""
    out = []
    items = doc.items() if isinstance(doc, dict) else enumerate(doc)
    for k, v in items:
        p = prefix + (k,)
        out.append(p)
        if isinstance(v, (dict, list)):
            out.extend(_leaf_paths(v, p))
    return out


def _set(doc, path, value):
    t = doc
    for k in path[:-1]:
        t = t[k]
    t[path[-1]] = value


_SCALARS = st.one_of(
    st.sampled_from([float("nan"), float("inf"), float("-inf"), -1, 0, 2**63 - 1, -2**63,
                     4_000_000_000, 1e300, -0.5, True, False, "", "all", "kmalloc",
                     "v6.18", "../x", "nan"]),
    st.integers(-10, 10_000), st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=8))
_VALUES = st.one_of(
    _SCALARS, st.lists(_SCALARS, max_size=3),
    st.fixed_dictionaries({"range": st.lists(st.integers(-2, 64), min_size=0, max_size=3)}),
    st.fixed_dictionaries({"logrange": st.lists(st.integers(-1, 64), max_size=3),
                           "factor": _SCALARS}),
    st.dictionaries(st.sampled_from(["low", "high", "step", "choices", "x"]), _SCALARS,
                    max_size=2))


@st.composite
def _mutated_toml(draw, texts: list[str]) -> str:
    """A built-in TOML text, either broken as text (a slice cut, bytes inserted, cut short)
    or well-formed with one value, anywhere in it, replaced by a wrong type or value."""
    text = draw(st.sampled_from(texts))
    if draw(st.booleans()):
        i = draw(st.integers(0, len(text)))
        how = draw(st.sampled_from(["cut", "insert", "truncate"]))
        if how == "cut":
            return text[:i] + text[i + draw(st.integers(1, 40)):]
        if how == "insert":
            return text[:i] + draw(st.sampled_from(["=", "[", "]]", '"', "{", "\n[x", "= nan",
                                                    "\x00", "é", "[[", "\\"])) + text[i:]
        return text[:i]
    doc = tomllib.loads(text)
    path = draw(st.sampled_from(_leaf_paths(doc)))
    _set(doc, path, draw(_VALUES))
    try:
        return tomli_w.dumps(doc)
    except (TypeError, ValueError):      # a shape TOML cannot write (tomli_w refuses it)
        assume(False)


def _texts(*paths: Path) -> list[str]:
    return [p.read_text() for p in paths]


_SIM_TEXTS = _texts(*sorted((ROOT / "examples").glob("*.toml")))
_SWEEP_TEXTS = _texts(*(ROOT / "sweeps" / f"{n}.toml"
                        for n in ("quick", "fleet", "seeds", "memoryless", "dynamics_bench")))
_TUNE_TEXTS = _texts(*sorted((ROOT / "sweeps").glob("tune_*.toml")))


def _one_line_or_valid(argv) -> str:
    """Run the CLI; malformed input must give one clean error line (exit 2).  Returns
    'error' or 'valid' (the input reached the stubbed model stage)."""
    try:
        rc, _, err = run(*argv)
    except _Valid:
        rc = 0
    event("valid" if rc == 0 else "error")
    if rc == 0:
        return "valid"
    error_line(rc, err)
    return "error"


#: Examples per target (BAD_INPUT_EXAMPLES=2000 for a longer hunt by hand).
_EXAMPLES = int(os.environ.get("BAD_INPUT_EXAMPLES", "100"))
_FAST = settings(max_examples=_EXAMPLES, deadline=None, database=None,
                 suppress_health_check=[HealthCheck.too_slow,
                                        HealthCheck.function_scoped_fixture])


@pytest.fixture
def stubbed_model(monkeypatch):
    """The model stages of simulate, tune and kernel check raise _Valid instead of
    compiling and running JAX."""
    from slabtune.kernel import check
    from slabtune.sweeps import simulate
    from slabtune.tuner import study

    def valid(*_a, **_k):
        raise _Valid

    monkeypatch.setattr(simulate, "run", valid)
    monkeypatch.setattr(study, "create_or_resume", valid)
    monkeypatch.setattr(check, "predict_boot", valid)


def _in_tmp(text: str | bytes, name: str, fn):
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / name
        p.write_bytes(text if isinstance(text, bytes) else text.encode("utf-8", "replace"))
        return fn(p)


@_FAST
@given(text=_mutated_toml(_SIM_TEXTS))
def test_random_bad_sim_configs(stubbed_model, text):
    _in_tmp(text, "c.toml", lambda p: _one_line_or_valid(["simulate", p, "--json"]))


@_FAST
@given(text=_mutated_toml(["[cost]\nalloc_fast_ns = 2.5\nqueueing = 1.0\n[fitted]\n"
                           'alloc_fast_ns = "x"\n']))
def test_random_bad_cost_files(stubbed_model, text):
    _in_tmp(text, "cost.toml", lambda p: _one_line_or_valid(["simulate", EXAMPLE, "--cost", p]))


@_FAST
@given(text=_mutated_toml(_SWEEP_TEXTS))
def test_random_bad_sweep_specs(text):
    _in_tmp(text, "s.toml", lambda p: _one_line_or_valid(["sweep", "plan", p]))


@_FAST
@given(text=_mutated_toml(_TUNE_TEXTS))
def test_random_bad_tune_specs(stubbed_model, text):
    _in_tmp(text, "t.toml", lambda p: _one_line_or_valid(["tune", p, "--trials", "1"]))


_HEADER, _ROWS = _snapshot_rows(4)


@st.composite
def _mutated_csv(draw) -> bytes:
    """The first rows of a real snapshot with a column dropped from the header or the rows,
    a cell replaced, or the text cut or broken."""
    header, rows = list(_HEADER), [list(r) for r in _ROWS]
    how = draw(st.sampled_from(["header", "cell", "cell", "row", "text"]))
    if how == "header":
        del header[draw(st.integers(0, len(header) - 1))]
    elif how == "cell":
        r, c = draw(st.integers(0, len(rows) - 1)), draw(st.integers(0, len(header) - 1))
        rows[r][c] = draw(st.one_of(st.sampled_from(
            ["", "nan", "inf", "-1", "4000000000", "1e9", "99999999999999999999", "0-3,x",
             "7-1", "v1.0", "abc", "2", "0"]), st.text(max_size=6)))
    elif how == "row":
        del rows[draw(st.integers(0, len(rows) - 1))][draw(st.integers(0, len(header) - 1))]
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(header)
    w.writerows(rows)
    data = buf.getvalue().encode("utf-8", "surrogatepass")
    if how == "text":
        i = draw(st.integers(0, len(data)))
        data = data[:i] + draw(st.binary(max_size=6)) + data[i + draw(st.integers(0, 20)):]
    return data


@_FAST
@given(data=_mutated_csv())
def test_random_bad_snapshots(stubbed_model, data):
    _in_tmp(data, "s.csv", lambda p: _one_line_or_valid(["kernel", "check", "--snapshot", p]))


@pytest.mark.parametrize("distances, needle", [
    ([[10, 20]], "topology.distances: has 1 rows but there are 2 nodes"),
    ([[10, 20], [20, 12]], "topology.distances: [1][1] = 12"),
    ([[10, 300], [20, 10]], "topology.distances: [0][1] = 300 is outside 11..254"),
    ([[10, 20.5], [20, 10]], "topology.distances: [0][1] = 20.5 is not an integer"),
    ([10, 20], "topology.distances: must be a list of rows"),
    ("near", "topology.distances: must be a list of rows"),
])
def test_sim_config_bad_distances_are_one_line(tmp_path, distances, needle):
    cfg = write_toml(tmp_path / "c.toml", sim_doc(topology={
        "cpus": 8, "nodes": 2, "memoryless_nodes": [1], "distances": distances}))
    rc, out, err = run("simulate", cfg)
    error_line(rc, err, "c.toml", needle)
    assert out == ""


def test_fleet_bad_distances_name_the_topology(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    spec = tmp_path / "t.toml"
    spec.write_text(TUNE_QUICK.read_text().replace(
        "cpus = 96\nnodes = 2\nmemoryless_nodes = [1]",
        "cpus = 96\nnodes = 2\nmemoryless_nodes = [1]\ndistances = [[10, 20], [20, 9]]"))
    rc, _, err = run("tune", spec, "--trials", "0", "--storage", "memory:")
    error_line(rc, err, "fleet.topology[3]", "distances: [1][1] = 9")


# --------------------------------------------------------------------------- issue 33 item 7

@pytest.mark.parametrize("value", ["[2147483648]", "{ gt = -9223372036854775808 }",
                                   "{ le = 2147483648 }"])
def test_exclude_integers_outside_int32_are_refused(tmp_path, value):
    spec = tmp_path / "s.toml"
    spec.write_text('[sweep]\nname = "x"\nevaluator = "structural"\n[topology]\ncpus = [1, 2]\n'
                    '[cache]\ncache = ["kmalloc-64"]\n[kernel]\nprofile = "v6.18"\n'
                    f"[[exclude]]\ncpus = {value}\n")
    rc, _, err = run("sweep", "plan", spec)
    error_line(rc, err, "exclude[0].cpus.", "outside the int32 range")


@pytest.mark.parametrize("seed", ["-1", str(2 ** 32), "99999999999999999999"])
def test_a_search_seed_out_of_range_is_refused_before_the_study_is_created(
        tmp_path, monkeypatch, seed):
    monkeypatch.chdir(tmp_path)
    spec = tmp_path / "t.toml"
    spec.write_text(TUNE_QUICK.read_text().replace("seed = 0", f"seed = {seed}"))
    rc, _, err = run("tune", spec, "--trials", "1")
    error_line(rc, err, "search.seed", "outside 0..4294967295")
    assert not (tmp_path / "runs").exists()


def test_a_fleet_from_the_seeds_sweep_has_one_topology_per_machine():
    """possible = 0 means 'as many as present': seeds.toml's possible = [0, 256] at 256
    CPUs named one machine twice, and `[fleet] sweep = "seeds"` always failed."""
    from slabtune.tuner.fleet import parse_fleet

    fleet = parse_fleet({"sweep": "seeds", "profile": "v6.18"})
    names = [t.name for t in fleet.topologies]
    assert len(names) == len(set(names))
    assert "256cpu" in names and not any(n.startswith("256cpu-256possible") for n in names)


def test_a_memoryless_node_that_is_not_an_integer_says_so(tmp_path, monkeypatch):
    cfg = write_toml(tmp_path / "c.toml", sim_doc(topology={
        "cpus": 8, "nodes": 4, "memoryless_nodes": [1.0]}))
    rc, _, err = run("simulate", cfg)
    error_line(rc, err, "topology.memoryless_nodes: 1.0 is not a node id")
    monkeypatch.chdir(tmp_path)
    spec = tmp_path / "t.toml"
    spec.write_text(TUNE_QUICK.read_text().replace("memoryless_nodes = [1]",
                                                   "memoryless_nodes = [1.0]"))
    rc, _, err = run("tune", spec, "--trials", "0", "--storage", "memory:")
    error_line(rc, err, "fleet.topology[3].memoryless_nodes: 1.0 is not a node id")


def test_two_spellings_of_one_cache_in_a_workload_are_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    spec = tmp_path / "t.toml"
    text = TUNE_QUICK.read_text()
    line = '"kmalloc-64" = { live_per_cpu = 8192, ops = 1.0 }'
    assert line in text
    spec.write_text(text.replace(line, line + '\n"kmalloc-1k" = { live_per_cpu = 8 }\n'
                                 '"kmalloc-1024" = { live_per_cpu = 8 }', 1))
    rc, _, err = run("tune", spec, "--trials", "0", "--storage", "memory:")
    error_line(rc, err, "caches.kmalloc-1024: names cache kmalloc-1k again")


def test_jax_platforms_naming_a_missing_backend_is_one_line(tmp_path):
    """JAX_PLATFORMS=cuda on a machine without CUDA: JAX raises a bare AssertionError while
    choosing its backend (in a process of its own: this one's JAX is already set up)."""
    env = dict(os.environ, JAX_PLATFORMS="cuda")
    p = subprocess.run([sys.executable, "-m", "slabtune", "simulate", str(EXAMPLE)],
                       capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600)
    try:
        import jax
        jax.devices("gpu")
        pytest.skip("this machine has a GPU backend")
    except RuntimeError:
        pass
    error_line(p.returncode, p.stderr, "JAX_PLATFORMS='cuda'", "cannot start that backend")


@pytest.mark.parametrize("value, needle", [("0", "0 ns"), ("inf", "'inf'"), ("-5", "'-5'"),
                                           ("1e308", "1e+308 ns"), ("nan", "'nan'")])
def test_calibrate_fit_refuses_an_impossible_timing_and_writes_nothing(tmp_path, value, needle):
    src = ROOT / "calibrate" / "data" / "uml-7.2-2026-11-24.csv"
    lines = src.read_text().splitlines(keepends=True)
    body = [i for i, ln in enumerate(lines) if not ln.startswith("#")]
    header = lines[body[0]].strip().split(",")
    cells = lines[body[1]].rstrip("\n").split(",")
    assert cells[header.index("ok")] == "1"
    cells[header.index("free_ns_per_call")] = value
    lines[body[1]] = ",".join(cells) + "\n"
    data = tmp_path / "bad.csv"
    data.write_text("".join(lines))
    out = tmp_path / "cost.toml"
    rc, _, err = run("calibrate", "fit", "--data", data, "--out", out)
    error_line(rc, err, "free_ns_per_call", needle, "scenario")
    assert not out.exists()


# --------------------------------------------------------------------------- issue 33 item 4

CHUNKY_SPEC = """
[sweep]
name = "chunky"
evaluator = "structural"
chunk_size = 1
[topology]
cpus = { range = [1, 8192] }
nodes = { range = [1, 64] }
[cache]
size = { range = [8, 4096] }
[kernel]
profile = "v6.18"
"""


def test_a_grid_cut_into_too_many_chunks_is_refused_before_a_run_exists(tmp_path,
                                                                        monkeypatch):
    monkeypatch.chdir(tmp_path)
    spec = tmp_path / "chunky.toml"
    spec.write_text(CHUNKY_SPEC)
    chunks = 8192 * 64 * (4096 - 8 + 1)
    rc, out, err = run("sweep", "plan", spec)
    assert rc == 0 and f"refused: sweep run would refuse this grid: sweep.chunk_size: " \
                       f"{chunks:,} chunks" in out
    rc, _, err = run("sweep", "run", spec, "--out", tmp_path / "runs")
    error_line(rc, err, "sweep.chunk_size", f"{chunks:,} chunks", "SLABTUNE_MAX_CHUNKS")
    assert not (tmp_path / "runs").exists()


def test_a_limit_is_raised_or_lowered_by_its_variable_and_a_bad_value_is_named(
        tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SLABTUNE_MAX_CHUNKS", "1")          # quick.toml has 2 chunks
    rc, _, err = run("sweep", "run", "quick", "--out", tmp_path / "runs")
    error_line(rc, err, "sweep.chunk_size", "2 chunks", "over the limit of 1")
    monkeypatch.setenv("SLABTUNE_MAX_CHUNKS", "lots")
    rc, _, err = run("sweep", "run", "quick", "--out", tmp_path / "runs")
    error_line(rc, err, "SLABTUNE_MAX_CHUNKS: 'lots' is not an integer")
    assert not (tmp_path / "runs").exists()


def test_a_simulation_over_the_model_bound_is_refused_before_it_runs(tmp_path):
    cfg = write_toml(tmp_path / "c.toml", sim_doc(run={"steps": 10_000_000,
                                                       "ops_per_step": 1024, "seed": 1}))
    t0 = time.perf_counter()
    rc, _, err = run("simulate", cfg)
    error_line(rc, err, "run.steps", "modelled ops", "SLABTUNE_MAX_MODEL_OPS")
    assert time.perf_counter() - t0 < 60        # refused, not run (the run takes hours)


@pytest.mark.parametrize("argv, needle", [
    (["--sampler", "population", "--generations", "1", "--population", "100000000"],
     "--population: 100,000,000 candidates per generation is over the limit of 65,536"),
    (["--trials", "10000000"], "--trials: 10,000,000 trials in one call is over the limit"),
])
def test_tune_bounds_are_checked_before_the_study_is_created(tmp_path, monkeypatch, argv,
                                                             needle):
    monkeypatch.chdir(tmp_path)
    rc, _, err = run("tune", TUNE_QUICK, *argv)
    error_line(rc, err, needle)
    assert not (tmp_path / "runs").exists()


def test_ray_address_auto_with_a_stale_cluster_file_fails_fast(tmp_path, monkeypatch):
    """A ray_current_cluster file naming a cluster that is gone: ray.init hung over 3
    minutes; the address it resolves to is probed first."""
    import socket

    from slabtune.errors import SlabtuneError
    from slabtune.sweeps import dispatch

    with socket.socket() as s:           # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    (tmp_path / "ray").mkdir()
    (tmp_path / "ray" / "ray_current_cluster").write_text(f"127.0.0.1:{port}")
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path))
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    t0 = time.perf_counter()
    try:
        dispatch._probe("auto")
    except SlabtuneError as err:
        assert f":{port}" in str(err) and "--ray-address: cannot connect to auto" in str(err)
    else:
        pytest.skip("a live Ray cluster on this machine answers 'auto'")
    assert time.perf_counter() - t0 < 30


def test_a_pinned_guest_workload_cpu_beyond_a_topology_is_refused():
    """cpu_a/cpu_b pin the guest workload to CPUs: one past a fleet topology's online CPUs
    made every guest of it fail after booting; now it is refused when the spec is read."""
    from slabtune.errors import SlabtuneError
    from slabtune.validate.spec import load_spec, parse_spec

    text = (ROOT / "sweeps" / "validate_quick.toml").read_text()
    base = load_spec("validate_quick")
    smallest = min(base.fleet.topologies, key=lambda t: t.topology.online)
    n = smallest.topology.online
    pinned = text.replace('mode = "hackbench"', f'mode = "crosscpu"\ncpu_a = 0\ncpu_b = {n}', 1)
    with pytest.raises(SlabtuneError, match=rf"validate.workload\[0\].cpu_b: CPU {n} does not "
                                            rf"exist on fleet.topology {smallest.name}"):
        parse_spec(pinned, "v")
    assert parse_spec(pinned.replace(f"cpu_b = {n}", f"cpu_b = {n - 1}"), "v").workloads[0] \
        .cpu_b == n - 1

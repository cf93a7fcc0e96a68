"""Results a user can browse: ``results list`` shows tune studies with their trial counts and
failed runs with the error they recorded; ``results export`` writes every trial of a study
to parquet; every stored column has a unit, in docs/SPECS.md and in the files' arrow field
metadata."""

from __future__ import annotations

import functools
import json
import re
from pathlib import Path

import optuna
import pyarrow.parquet as pq
import pytest
from _cli import error_line, run

from slabtune.results import columns, pareto, store
from slabtune.sweeps import spec as sweep_spec
from slabtune.tuner import space
from slabtune.tuner import study as studies

ROOT = Path(__file__).resolve().parents[1]

# --------------------------------------------------------------------------- column docs


def _specs_tables() -> dict[str, dict[str, str]]:
    """docs/SPECS.md 'Stored columns': store heading -> {column: unit}."""
    text = (ROOT / "docs" / "SPECS.md").read_text()
    section = text.split("## Stored columns", 1)[1].split("\n## ", 1)[0]
    out: dict[str, dict[str, str]] = {}
    current = None
    for line in section.splitlines():
        m = re.match(r"### (.+)", line)
        if m:
            current = out.setdefault(m.group(1).strip(), {})
            continue
        m = re.match(r"\| `([^`]+)` \| ([^|]+) \|", line)
        if m and current is not None:
            current[m.group(1)] = m.group(2).strip()
    return out


def test_specs_md_gives_every_stored_column_with_its_unit():
    """The reference and the table the files carry agree column for column."""
    tables = _specs_tables()
    assert set(tables) == set(columns.STORES) | {"Tune knob columns"}
    for store_name, cols in columns.STORES.items():
        assert tables[store_name] == {k: c.unit for k, c in cols.items()}, store_name
    assert tables["Tune knob columns"] == columns.KNOB_UNITS


def test_every_column_a_store_can_write_has_a_unit():
    """Every sweep axis (common and the dynamics workload axes), every metric of every
    evaluator, every validation row column and every tune knob is in the table."""
    from slabtune.sweeps.evaluators import EVALUATORS
    from slabtune.validate.schema import ROW_SCHEMA

    axes = set(sweep_spec.COMMON_AXES)
    for ev in EVALUATORS.values():
        axes |= set(ev.extra_axes())
        assert set(ev.metrics()) - {"min_objects"} <= set(columns.SWEEP_METRICS), ev.name
    assert axes == set(columns.SWEEP_AXES)
    assert set(ROW_SCHEMA) == set(columns.VALIDATE_ROWS)
    assert set(space.KNOBS) | set(space.SLAB_KNOBS) == set(columns.KNOB_UNITS)
    assert all(columns.part_column(c) is not None for c in ROW_SCHEMA)


_GRID = """
[sweep]
name = "alias"
[topology]
cpus = [1, 64]
[cache]
cache = "kmalloc-64"
[kernel]
profile = "v6.1"
[boot]
"""


def test_boot_axes_take_the_tune_knob_names():
    """Each kernel name of a sweep boot axis is a tune knob, the axis's doc names it, and a
    spec spelling it so is the same grid (same axes, same hash) as one using the axis name;
    both spellings at once is one error naming both."""
    for knob, axis in columns.ALIASES.items():
        assert knob in space.KNOBS and axis in sweep_spec.COMMON_AXES
        assert knob in columns.SWEEP_AXES[axis].doc
        a = sweep_spec.parse(_GRID + f"{knob} = [0, 2]\n")
        b = sweep_spec.parse(_GRID + f"{axis} = [0, 2]\n")
        assert a.axes == b.axes and a.hash == b.hash
        with pytest.raises(sweep_spec.SpecError, match=f"boot.{knob}: give it or boot.{axis}"):
            sweep_spec.parse(_GRID + f"{knob} = 1\n{axis} = 1\n")


# --------------------------------------------------------------------------- a study

SPEC = """
[fleet]
profile = "v6.1"
[[fleet.topology]]
name = "small-2"
cpus = 2
[[fleet.topology]]
name = "big-64x2"
cpus = 64
nodes = 2
[[fleet.workload]]
[fleet.workload.caches]
"kmalloc-64" = { live_per_cpu = 1024 }
"kmalloc-1k" = { live_per_cpu = 256 }
[search]
seed = 3
[search.knobs]
slub_max_order = { low = 0, high = 3 }
slub_min_objects = { choices = [0, 8, 32] }
min_partial_lo = { low = 0, high = 10 }
cpu_partial_small = { low = 0, high = 240, step = 8 }
[objectives]
max_regression = 0.05
"""


@functools.cache
def _study(root: str):
    """A study in ``root/runs/browse`` (SQLite, the default storage): 24 sampled trials,
    two recorded with only some knobs (as exhaustive and population searches record), and
    one failed trial added through Optuna's API."""
    spec = studies.parse_spec(SPEC, "browse")
    # a named writer: its seed stream, and so the trials, are the same on every run
    runner, url = studies.create_or_resume(spec, "browse", None, Path(root) / "runs" / "browse",
                                           writer="browse-fixture")
    runner.run(24, 8)
    part = {"slub_max_order": 1, "min_partial_lo": 2}
    runner.record([part], runner.evaluate([part]))
    # v6.1's own slub_max_order (PAGE_ALLOC_COSTLY_ORDER, 3) with every other knob at its
    # default is the baseline: no regression (excess -max_regression), so the study
    # holds a feasible trial whatever its sampled trials are
    same = {"slub_max_order": 3}
    runner.record([same], runner.evaluate([same]))
    runner.study.add_trial(optuna.trial.create_trial(
        state=optuna.trial.TrialState.FAIL, params={"slub_max_order": 2},
        distributions={"slub_max_order": runner.distributions["slub_max_order"]}))
    return runner.study, url


@pytest.fixture(scope="module")
def browse(tmp_path_factory):
    root = tmp_path_factory.mktemp("browse")
    study, url = _study(str(root))
    return root, study, url


@pytest.mark.slow
def test_results_list_shows_the_study_and_its_counts(browse):
    root, study, _url = browse
    rc, out, err = run("results", "list", "--out", root / "runs")
    assert rc == 0, err
    (line,) = [ln for ln in out.splitlines() if ln.startswith("study ")]
    front = len(study.best_trials)
    assert line.startswith(f"study browse  trials 27 (complete 26, fail 1)  front {front}  "
                           "spec browse, profile v6.1  ")
    assert line.endswith(str(root / "runs" / "browse"))
    rc, out, _ = run("results", "list", "--out", root / "runs", "--json")
    (rec,) = json.loads(out)
    assert rec["kind"] == "study" and rec["states"] == {"complete": 26, "fail": 1}
    rc, out, err = run("results", "list", "--out", root / "elsewhere", "--storage", _url)
    assert rc == 0, err
    assert out.startswith("study browse  trials 27 (complete 26, fail 1)")
    assert out.rstrip().endswith(_url)


@pytest.mark.slow
def test_results_export_writes_every_trial_with_units(browse, tmp_path):
    root, study, url = browse
    out = tmp_path / "browse.parquet"
    rc, text, err = run("results", "export", "--run", root / "runs" / "browse", "--out", out)
    assert rc == 0, err
    assert text.startswith(f"wrote 27 trials (26 complete) of study browse to {out}")
    table = pq.read_table(out)
    df = __import__("polars").from_arrow(table)
    trials = {t.number: t for t in study.get_trials(deepcopy=False)}
    assert df["trial"].to_list() == sorted(trials)
    points = pareto.all_points(study).to_dicts()
    by_trial = {r["trial"]: r for r in df.to_dicts()}
    front_reach = studies.front_report(study)["front_reach"]
    for p in points:
        row, t = by_trial[p["trial"]], trials[p["trial"]]
        assert (row["memory"], row["time"]) == (p["memory"], p["time"]) == tuple(t.values)
        assert row["feasible"] == p["feasible"] and row["pareto"] == p["pareto"]
        assert row["regression_excess"] == max(t.constraints.values())
        for i, name in enumerate(("small-2", "big-64x2")):
            assert row[f"memory@{name}"] == t.user_attrs["per_topology"]["memory"][i]
            assert row[f"time@{name}"] == t.user_attrs["per_topology"]["time"][i]
        for k in ("slub_max_order", "slub_min_objects", "min_partial_lo", "cpu_partial_small"):
            assert row[k] == t.params.get(k)
        if p["pareto"]:
            assert row["reach"] == front_reach[p["trial"]]
        assert row["reach"] in ("default", "boot", "sysfs", "boot+sysfs")
    assert not all(r["feasible"] for r in points) and any(r["feasible"] for r in points)
    failed = df.filter(df["state"] == "fail").to_dicts()
    assert [(r["slub_max_order"], r["memory"], r["reach"]) for r in failed] == [(2, None, None)]
    partial, same = by_trial[max(trials) - 2], by_trial[max(trials) - 1]
    assert partial["slub_min_objects"] is None and partial["min_partial_lo"] == 2
    assert same["slub_max_order"] == 3 and same["min_partial_lo"] is None
    # no regression: the excess is 0 - max_regression
    assert same["regression_excess"] == pytest.approx(-0.05) and same["feasible"]
    meta = {f.name: {k.decode(): v.decode() for k, v in (f.metadata or {}).items()}
            for f in table.schema}
    assert meta["memory"]["unit"] == "fraction" and meta["time"]["unit"] == "ns per op"
    assert meta["memory@big-64x2"] == {"unit": "fraction",
                                       "doc": "fleet memory overhead on topology big-64x2"}
    assert meta["slub_max_order"]["unit"] == "page order"
    assert meta["cpu_partial_small"]["unit"] == "objects"
    assert all(meta[c].get("unit") for c in df.columns)
    info = {k.decode(): v.decode() for k, v in table.schema.metadata.items()}
    assert info["slabtune_study"] == "browse" and info["slabtune_storage"] == url
    assert json.loads(info["slabtune_baseline"])["memory"] == \
        study.user_attrs["slabtune_baseline"]["memory"]


def test_results_export_refuses_what_it_cannot_write(tmp_path):
    rc, _out, err = run("results", "export", "--study", "nope", "--storage",
                        f"journal:{tmp_path / 'absent.log'}", "--out", tmp_path / "x.parquet")
    error_line(rc, err, "journal file does not exist")
    rc, _out, err = run("results", "export", "--study", "nope", "--out", tmp_path)
    error_line(rc, err, "--out", "directory")


# --------------------------------------------------------------------------- runs


def test_failed_run_lists_its_recorded_error(tmp_path):
    """A chunk that failed for good (the state and error sweeps/runner.py records) makes the
    run ``failed`` with that error, not "partial, rows 0"; a validate task's stored error
    counts too."""
    run_ = store.create_run(tmp_path, spec={"name": "s", "chunk_size": 1}, spec_hash="ab" * 8,
                            spec_text="", n_chunks=3, columns=[["cpus", "int32", None]],
                            versions={}, git_revision=None)
    st = run_.manifest["chunks"]["states"]
    st["2"] = {"state": "failed", "error": "chunk 2: failed after 4 attempts: OSError: boom\n"
               "second line", "when": "t"}
    run_.save()
    rc, out, err = run("results", "list", "--out", tmp_path)
    assert rc == 0, err
    lines = out.splitlines()
    assert re.match(rf"{run_.run_id}  failed    rows +0  chunks 0/3 ", lines[0])
    assert lines[1] == ("    error: chunk 2: chunk 2: failed after 4 attempts: OSError: boom | "
                        "second line")
    s = store.open_run(run_.path).summary()
    assert (s["state"], s["errors"]) == ("failed", 1)
    import polars as pl

    run_.write_part(0, pl.DataFrame({"cpus": pl.Series([1], dtype=pl.Int32)}),
                    status="failed", error="guest: timed out after 120.0 s")
    assert store.open_run(run_.path).errors() == [
        (0, "guest: timed out after 120.0 s"), (2, st["2"]["error"])]
    rc, out, _ = run("results", "list", "--out", tmp_path)
    assert "    error (2 chunks recorded errors): chunk 0: guest: timed out" in out
    rc, out, _ = run("results", "show", run_.path)
    assert "state: failed" in out.splitlines()
    assert "error (2 chunks recorded one; the first): chunk 0: guest: timed out after " \
           "120.0 s" in out.splitlines()
    assert "  cpus: int32  1..1  [CPUs]" in out.splitlines()


def test_sweep_parts_carry_units(tmp_path):
    """A part written by the store names each column's unit in its arrow field metadata;
    polars reads it back unchanged (an Enum stays an Enum)."""
    import polars as pl

    df = pl.DataFrame({"cpus": pl.Series([8], dtype=pl.Int32),
                       "cache": pl.Series(["kmalloc-64"], dtype=pl.Enum(["kmalloc-64"])),
                       "order": pl.Series([1], dtype=pl.Int32),
                       "ns_per_op": pl.Series([12.5], dtype=pl.Float32)})
    name, _ = store.write_part_file(tmp_path, 0, df)
    schema = pq.read_schema(tmp_path / name)
    units = {f.name: (f.metadata or {}).get(b"unit", b"").decode() for f in schema}
    assert units == {"cpus": "CPUs", "cache": "-", "order": "page order",
                     "ns_per_op": "ns per alloc+free pair"}
    assert pl.read_parquet(tmp_path / name).equals(df)


def test_unreadable_study_databases_are_listed_as_damaged(tmp_path):
    """A study.db that is empty (a tune killed before its first write) or not a database
    is one ``damaged:`` line each, naming the directory; it is not modified, and a run
    beside them is listed as usual."""
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "study.db").write_bytes(b"")
    (tmp_path / "text").mkdir()
    (tmp_path / "text" / "study.db").write_text("notes, not a database\n")
    run_ = store.create_run(tmp_path, spec={"name": "s", "chunk_size": 1}, spec_hash="cd" * 8,
                            spec_text="", n_chunks=1, columns=[["cpus", "int32", None]],
                            versions={}, git_revision=None)
    rc, out, err = run("results", "list", "--out", tmp_path)
    assert rc == 0, err
    lines = out.splitlines()
    assert lines[0].startswith(f"{run_.run_id}  partial ")
    assert lines[1] == (f"damaged: {tmp_path / 'empty'}: empty study database (a tune "
                        "stopped before its first write)")
    assert lines[2].startswith(f"damaged: {tmp_path / 'text'}: ") and "study.db" in lines[2]
    assert (tmp_path / "empty" / "study.db").stat().st_size == 0
    assert (tmp_path / "text" / "study.db").read_text() == "notes, not a database\n"

"""Several writers of one stored study without Ray: two plain ``tune`` processes at once
on one SQLite study, and the pieces ``tune --workers`` gives its workers (their storage
URL, their seeds, their shares of the trials)."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys

import optuna
import pytest

from slabtune.errors import SlabtuneError
from slabtune.tuner import study as studies
from slabtune.tuner import workers


def _tune(cwd, *args) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    return subprocess.Popen([sys.executable, "-m", "slabtune", "tune", "tune_quick", *args],
                            cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


@pytest.mark.slow
def test_two_tune_processes_on_one_study_add_distinct_trials(tmp_path):
    """Both run at once on the study a first process created: each says it added its own
    600, and the study holds 1,200 trials numbered 0..1199 with 1,200 distinct params (on
    the code before: 8,192 trials asked by two processes stored 557 repeats, under 7,104
    distinct numbers)."""
    url = "sqlite:///s.db"
    first = _tune(tmp_path, "--trials", "0", "--study", "s", "--storage", url)
    assert first.wait(timeout=600) == 0, first.stderr.read()
    procs = [_tune(tmp_path, "--trials", "600", "--batch", "50", "--study", "s", "--storage",
                   url, "--json") for _ in range(2)]
    docs = []
    for p in procs:
        out, err = p.communicate(timeout=900)
        assert p.returncode == 0, err[-3000:]
        docs.append(json.loads(out))
    assert [d["added"] for d in docs] == [600, 600]
    assert max(d["trials"] for d in docs) == 1200
    study = optuna.load_study(study_name="s", storage=f"sqlite:///{tmp_path / 's.db'}")
    trials = study.get_trials(deepcopy=False)
    assert sorted(t.number for t in trials) == list(range(1200))
    assert len({studies.params_key(t.params) for t in trials}) == 1200
    with sqlite3.connect(tmp_path / "s.db") as db:       # no two rows share a number
        assert db.execute("select count(distinct number) from trials").fetchone() == (1200,)


def test_writer_seeds_differ_by_writer_and_study_and_keep_an_unseeded_space_unseeded():
    seeds = {studies.writer_seed(1, study, w) for study in ("a", "b") for w in ("x", "y")}
    assert len(seeds) == 4 and all(0 <= s < 2 ** 32 for s in seeds)
    assert studies.writer_seed(1, "a", "x") == studies.writer_seed(1, "a", "x")
    assert studies.writer_seed(None, "a", "x") is None


def test_workers_get_absolute_file_storages(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert workers.shared_url("sqlite:///s.db") == f"sqlite:///{tmp_path / 's.db'}"
    assert workers.shared_url("journal:j.log") == f"journal:{tmp_path / 'j.log'}"
    assert workers.shared_url("j.journal") == f"journal:{tmp_path / 'j.journal'}"
    assert workers.shared_url("sqlite:////abs/s.db") == "sqlite:////abs/s.db"
    pg = "postgresql://u:secret@db/slab"
    assert workers.shared_url(pg) == pg
    with pytest.raises(SlabtuneError, match=r"^--workers: storage 'memory:'"):
        workers.shared_url("memory:")


@pytest.mark.parametrize("n, k, want", [(200, 2, [100, 100]), (7, 3, [3, 2, 2]),
                                        (2, 4, [1, 1, 0, 0])])
def test_trials_split_between_workers(n, k, want):
    assert workers.split(n, k) == want and sum(want) == n


@pytest.mark.parametrize("argv, needles", [
    (["--workers", "0", "--trials", "4"], ["--workers: 0 must be at least 1"]),
    (["--workers", "2", "--exhaustive"], ["--workers: not with --exhaustive"]),
    (["--ray-address", "127.0.0.1:1", "--sampler", "population", "--generations", "1"],
     ["--ray-address: not with --sampler population"]),
    (["--workers", "2", "--trials", "4", "--storage", "memory:"],
     ["--workers: storage 'memory:' is in this process's memory"]),
])
def test_bad_worker_options_are_one_line_before_any_study(tmp_path, monkeypatch, argv,
                                                          needles):
    from _cli import error_line, run

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    rc, _, err = run("tune", "tune_quick", *argv)
    error_line(rc, err, *needles)
    assert not (tmp_path / "runs").exists()

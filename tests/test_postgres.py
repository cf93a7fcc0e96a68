"""Optuna studies on a real PostgreSQL server (issue 34, item 4): Debian's server, started by
the project's own scripts/install-postgres.sh in a private cluster, holds a study that
``tune`` fills (two processes at once among them), ``pareto`` and ``export`` read; the
storage URL's password appears in no output, file or stored row.  Without PostgreSQL (the
script cannot install it) the tests skip, saying why."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import optuna
import pytest
import sqlalchemy as sa
from _cli import error_line
from _cli import run as run_here
from _tune_helpers import run_cli, workdir

from slabtune.errors import SlabtuneError
from slabtune.tuner import study as studies

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "install-postgres.sh"
TRIALS, BATCH = 24, 12


@pytest.fixture(scope="module")
def pg():
    """(URL with password, password): a fresh private cluster for this module, stopped and
    removed after it."""
    where = Path(tempfile.mkdtemp(prefix="slabtune-pg-"))
    proc = subprocess.run(["bash", str(SCRIPT), "start", "--dir", str(where)],
                          capture_output=True, text=True, timeout=900)
    try:
        if proc.returncode == 3:
            pytest.skip(f"no PostgreSQL server: {proc.stderr.strip()}")
        assert proc.returncode == 0, proc.stderr
        url = (where / "url").read_text().strip()
        password = (where / "password").read_text().strip()
        assert len(password) == 32 and password not in proc.stdout + proc.stderr
        assert proc.stdout.strip() == url.replace(password, "***")
        yield url, password
    finally:
        subprocess.run(["bash", str(SCRIPT), "stop", "--dir", str(where)],
                       capture_output=True, timeout=120)
        shutil.rmtree(where, ignore_errors=True)


def _tune(url: str, name: str) -> list[str]:
    return ["tune", "tune_quick", "--trials", str(TRIALS), "--batch", str(BATCH), "--study",
            name, "--storage", url, "--json"]


def _no_secret(password: str, *texts: str) -> None:
    for t in texts:
        assert password not in t, t


def _files_without(root: Path, password: str) -> int:
    """Every file under ``root`` is free of ``password``; returns how many were read."""
    n = 0
    for f in root.rglob("*"):
        if f.is_file():
            assert password.encode() not in f.read_bytes(), f
            n += 1
    return n


@pytest.mark.slow
def test_tune_pareto_export_and_two_writers_on_postgresql(pg, tmp_path):
    url, password = pg
    first = run_cli(*_tune(url, "pg"), cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    out = json.loads(first.stdout)
    assert out["trials"] == TRIALS
    assert out["storage"] == url.replace(password, "***")
    outputs = [first.stdout, first.stderr]

    # two tune processes on the one study at once: every trial of both is stored, numbered
    # without a gap or a repeat
    env = dict(os.environ, JAX_COMPILATION_CACHE_DIR=str(workdir() / "jax-cache"))
    cli = [sys.executable, "-c", "import sys, slabtune.cli as c; "
           "raise SystemExit(c.main(sys.argv[1:]))"]
    procs = [subprocess.Popen(cli + _tune(url, "pg"), cwd=tmp_path, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    for p in procs:
        so, se = p.communicate(timeout=900)
        assert p.returncode == 0, se
        outputs += [so, se]
    stored = optuna.load_study(study_name="pg", storage=studies.driver_url(url))
    trials = stored.get_trials(deepcopy=False)
    assert len(trials) == 3 * TRIALS
    assert sorted(t.number for t in trials) == list(range(3 * TRIALS))
    assert all(t.state == optuna.trial.TrialState.COMPLETE for t in trials)

    # pareto reads the front Optuna computes (feasible trials only, equal points folded)
    par = run_cli("pareto", "--study", "pg", "--storage", url, "--json", cwd=tmp_path)
    assert par.returncode == 0, par.stderr
    rep = json.loads(par.stdout)
    shown = {p["trial"] for p in rep["points"]} | {t for p in rep["points"]
                                                   for t in p.get("same_as", ())}
    assert shown == {t.number for t in stored.best_trials}
    exp = run_cli("export", "--study", "pg", "--storage", url, "--trial",
                  str(rep["points"][0]["trial"]), "--format", "json", cwd=tmp_path)
    assert exp.returncode == 0, exp.stderr
    assert json.loads(exp.stdout)["trial"] == rep["points"][0]["trial"]
    outputs += [par.stdout, par.stderr, exp.stdout, exp.stderr]

    # the password is in no output, no file the commands wrote, and no stored row
    _no_secret(password, *outputs)
    assert "***" in first.stdout
    _files_without(tmp_path, password)
    engine = sa.create_engine(studies.driver_url(url))
    try:
        with engine.connect() as con:
            tables = sa.inspect(con).get_table_names()
            assert {"studies", "trials", "study_user_attributes"} <= set(tables)
            for table in tables:
                rows = con.execute(sa.text(f'SELECT * FROM "{table}"')).all()
                _no_secret(password, repr(rows))
    finally:
        engine.dispose()


def test_bad_credentials_are_one_line_without_the_password(pg):
    url, password = pg
    wrong = "Wr0ngPassw0rdNotStored"
    bad = url.replace(password, wrong)
    rc, out, err = run_here("pareto", "--study", "none", "--storage", bad)
    line = error_line(rc, err, "storage: 'postgresql://slabtune:***@",
                      "password authentication failed")
    _no_secret(wrong, out, err)
    rc, out, err = run_here("pareto", "--study", "no-such-study", "--storage", url)
    line = error_line(rc, err, "no study named 'no-such-study'")
    _no_secret(password, out, err, line)


def test_mysql_urls_go_to_pymysql_and_hide_the_password():
    """No MySQL server here: a refused connection shows the driver slabtune names (PyMySQL,
    the mysql extra) in one line, the password masked."""
    pytest.importorskip("pymysql")
    with socket_closed_port() as port:
        rc, out, err = run_here("pareto", "--study", "x", "--storage",
                                f"mysql://slab:Sekr1tMy@127.0.0.1:{port}/db")
    error_line(rc, err, "storage: 'mysql://slab:***@127.0.0.1", "pymysql",
               "Can't connect to MySQL server")
    _no_secret("Sekr1tMy", out, err)
    assert studies.driver_url("mysql://a@h/d") == "mysql+pymysql://a@h/d"
    assert studies.driver_url("postgresql://a@h/d") == "postgresql+psycopg://a@h/d"
    assert studies.driver_url("postgresql+psycopg2://a@h/d") == "postgresql+psycopg2://a@h/d"


@pytest.mark.parametrize("url, module, hint", [
    ("postgresql://u:Pw0rdX@127.0.0.1:1/d", "psycopg", "pip install 'slabtune[postgres]'"),
    ("mysql://u:Pw0rdX@127.0.0.1:1/d", "pymysql", "pip install 'slabtune[mysql]'"),
    ("postgresql+psycopg2://u:Pw0rdX@127.0.0.1:1/d", "psycopg2",
     "install the Python module psycopg2"),
])
def test_a_missing_driver_names_what_to_install(monkeypatch, url, module, hint):
    monkeypatch.setitem(sys.modules, module, None)     # as if it were not installed
    with pytest.raises(SlabtuneError) as err:
        studies.open_storage(url)
    msg = str(err.value)
    assert f"driver ({module}) is not installed" in msg and hint in msg, msg
    assert "Pw0rdX" not in msg and ":***@" in msg


class socket_closed_port:
    """A port on 127.0.0.1 nothing listens on (bound, then closed)."""

    def __enter__(self) -> int:
        import socket

        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.close()
        return port

    def __exit__(self, *exc) -> None:
        return None


def test_a_driver_message_loses_the_password_in_every_form():
    url = "postgresql://u:p%40ss%2Fw0rd@127.0.0.1/d"     # the password is p@ss/w0rd
    msg = "connect u:p%40ss%2Fw0rd / p@ss/w0rd / p%40ss%2Fw0rd failed"
    assert studies.scrub(msg, url) == "connect u:*** / *** / *** failed"
    assert studies.scrub(msg, "postgresql://u@127.0.0.1/d") == msg     # no password
    assert studies.scrub("x", "journal:runs/j.log") == "x"

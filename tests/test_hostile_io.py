"""Hostile paths through the real CLI (issue 33): every command's output path and input
file, against a device (/dev/null, /dev/full, /dev/zero), a FIFO, a directory, a symbolic
link (to a regular file or to a device), a file over the size bound, a text file or a
foreign SQLite database as an Optuna storage, and damaged run directories.

Each case: exit 2, one stderr line ``slabtune: error: ...`` naming the field, no traceback,
and the target untouched: a device is still that device, a link still the same link, a
FIFO still a FIFO, another file's bytes unchanged, nothing new beside it.  Every refusal
happens before the command's real work, so no case compiles JAX or starts Ray; the table
runs in a few seconds."""

from __future__ import annotations

import json
import os
import resource
import sqlite3
import stat
from pathlib import Path

import polars as pl
import pytest
from _cli import error_line as one_error
from _cli import run

from slabtune.errors import SlabtuneError
from slabtune.results import safeio, store

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "hackbench-v5.11.toml"
TUNE_QUICK = ROOT / "sweeps" / "tune_quick.toml"
SNAPSHOT = Path(__file__).parent / "data" / "host_snapshot_6.18.csv"


def fingerprint(p: Path):
    """What must not change about a path: its type, device number, link target, bytes."""
    st = os.lstat(p)
    fp = {"mode": stat.S_IFMT(st.st_mode), "rdev": st.st_rdev, "ino": st.st_ino}
    if stat.S_ISLNK(st.st_mode):
        fp["link"] = os.readlink(p)
    elif stat.S_ISREG(st.st_mode):
        fp["bytes"] = p.read_bytes()
    return fp


def listing(d: Path) -> list[str]:
    return sorted(os.listdir(d))


# --------------------------------------------------------------------------- outputs

#: Commands that write a user-named file, with OUT where the path goes.
OUTPUT_COMMANDS = [
    ["kernel", "snapshot", "--out", "OUT"],
    ["export", "--study", "s", "--trial", "0", "--format", "grub", "--out", "OUT"],
    ["plot", "orders", "--out", "OUT"],
    ["plot", "pareto", "--study", "s", "--out", "OUT"],
    ["reproduce", "--fit-cost", "OUT"],
    ["calibrate", "fit", "--out", "OUT"],
    ["calibrate", "uml", "--out", "OUT"],
    ["guest", "boot", "--out", "OUT"],
]


def _hostile_out(kind: str, d: Path) -> tuple[Path, list[Path]]:
    """An output path of ``kind`` under ``d`` and the paths that must stay as they are."""
    victim = d / "victim.csv"
    victim.write_bytes(b"another program's file\n")
    if kind in ("/dev/null", "/dev/full"):
        return Path(kind), [Path(kind), victim]
    p = d / "out.csv"
    if kind == "link-to-file":
        p.symlink_to(victim)
    elif kind == "link-to-device":
        p.symlink_to("/dev/null")
    elif kind == "dangling-link":
        p.symlink_to(d / "nowhere.csv")
    elif kind == "fifo":
        os.mkfifo(p)
    elif kind == "directory":
        p.mkdir()
    return p, [p, victim]


OUT_KINDS = ["/dev/null", "/dev/full", "link-to-file", "link-to-device", "dangling-link",
             "fifo", "directory"]


@pytest.mark.parametrize("kind", OUT_KINDS)
@pytest.mark.parametrize("argv", OUTPUT_COMMANDS, ids=lambda a: " ".join(a[:2]))
def test_an_output_that_is_not_a_regular_file_is_refused_and_left_as_it_was(
        tmp_path, monkeypatch, argv, kind):
    monkeypatch.chdir(tmp_path)
    out, keep = _hostile_out(kind, tmp_path)
    before = {p: fingerprint(p) for p in keep}
    names = listing(tmp_path)
    rc, _, err = run(*[str(out) if a == "OUT" else a for a in argv])
    flag = argv[argv.index("OUT") - 1]
    one_error(rc, err, flag, str(out))
    assert {p: fingerprint(p) for p in keep} == before
    assert listing(tmp_path) == names             # no temporary file left, nothing created


def test_a_name_too_long_for_the_filesystem_is_one_line(tmp_path):
    rc, _, err = run("export", "--study", "s", "--trial", "0", "--format", "json",
                     "--out", tmp_path / ("x" * 300 + ".json"))
    one_error(rc, err, "too long")


def test_write_atomic_replaces_a_regular_file_keeping_its_mode(tmp_path):
    out = tmp_path / "out.txt"
    out.write_text("old\n")
    out.chmod(0o640)
    safeio.write_atomic(out, "new\n")
    assert out.read_text() == "new\n" and stat.S_IMODE(out.stat().st_mode) == 0o640
    assert listing(tmp_path) == ["out.txt"]


def test_a_planted_link_at_a_temporary_name_is_never_followed(tmp_path):
    """calibrate fit used OUT.tmp, a fixed name: a link planted there made it overwrite the
    link's target.  The temporary name is now random and opened O_EXCL|O_NOFOLLOW."""
    victim = tmp_path / "victim"
    victim.write_bytes(b"keep me")
    out = tmp_path / "cost.toml"
    for name in ("cost.toml.tmp", ".cost.toml.tmp"):
        (tmp_path / name).symlink_to(victim)
    safeio.write_atomic(out, "x = 1\n")
    assert victim.read_bytes() == b"keep me" and out.read_text() == "x = 1\n"
    assert all((tmp_path / n).is_symlink() for n in ("cost.toml.tmp", ".cost.toml.tmp"))


def test_a_write_error_is_one_line_and_leaves_no_partial_file(tmp_path, monkeypatch):
    """A write that fails midway (EFBIG here, from a file size limit: ENOSPC and EIO take
    the same path) is one line naming the path; the old file is intact and the temporary
    file is gone."""
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "snap.csv"
    out.write_text("old contents\n")
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (4096, hard))
    try:
        rc, _, err = run("kernel", "snapshot", "--out", out)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    one_error(rc, err, str(out), "too large")
    assert out.read_text() == "old contents\n"
    assert listing(tmp_path) == ["snap.csv"]


# --------------------------------------------------------------------------- inputs

def _hostile_in(kind: str, d: Path, suffix: str) -> Path:
    p = d / f"in{suffix}"
    if kind == "/dev/zero":
        return Path("/dev/zero")
    if kind == "link-to-zero":
        p.symlink_to("/dev/zero")
    elif kind == "fifo":
        os.mkfifo(p)
    elif kind == "directory":
        p.mkdir()
    elif kind == "huge":
        with open(p, "wb") as fh:     # sparse: no disk used, no time spent
            fh.truncate((safeio.DATA_LIMIT if suffix == ".csv" else safeio.TEXT_LIMIT) + 1)
    return p


IN_KINDS = ["/dev/zero", "link-to-zero", "fifo", "directory", "huge"]
#: Commands that read a user-named file, with IN where it goes, its suffix, and the field.
INPUT_COMMANDS = [
    (["simulate", "IN"], ".toml", "config"),
    (["simulate", str(EXAMPLE), "--cost", "IN"], ".toml", "cost"),
    (["reproduce", "--cost", "IN"], ".toml", "cost"),
    (["sweep", "plan", "IN"], ".toml", "spec"),
    (["sweep", "run", "IN"], ".toml", "spec"),
    (["tune", "IN", "--trials", "1"], ".toml", "spec"),
    (["kernel", "check", "--snapshot", "IN"], ".csv", "snapshot"),
    (["lab", "run", "IN"], ".toml", "CONFIG"),
    (["validate", "--candidate", "IN", "--topologies", "validate_quick"], ".json", "--candidate"),
    (["calibrate", "fit", "--data", "IN"], ".csv", "--data"),
]


@pytest.mark.parametrize("kind", IN_KINDS)
@pytest.mark.parametrize("argv, suffix, field", INPUT_COMMANDS,
                         ids=[" ".join(c[0][:2]) + f"-{i}" for i, c in enumerate(INPUT_COMMANDS)])
def test_an_input_that_is_not_a_bounded_regular_file_is_refused_before_reading(
        tmp_path, monkeypatch, argv, suffix, field, kind):
    monkeypatch.chdir(tmp_path)
    src = _hostile_in(kind, tmp_path, suffix)
    names = listing(tmp_path)
    rc, _, err = run(*[str(src) if a == "IN" else a for a in argv])
    line = one_error(rc, err, field)
    assert str(src) in line or src.name in line, line
    assert listing(tmp_path) == names


def test_read_bounded_refuses_a_file_that_grows_past_the_limit_while_read(tmp_path):
    p = tmp_path / "f"
    p.write_bytes(b"x" * 100)
    assert safeio.read_bounded(p, 100, "f") == b"x" * 100
    with pytest.raises(SlabtuneError, match="f: .* 100 bytes, over the 99-byte limit"):
        safeio.read_bounded(p, 99, "f")


# --------------------------------------------------------------------------- storages

def _foreign_sqlite(p: Path) -> bytes:
    con = sqlite3.connect(p)
    con.execute("CREATE TABLE people (name TEXT)")
    con.execute("INSERT INTO people VALUES ('ada')")
    con.commit()
    con.close()
    return p.read_bytes()


@pytest.mark.parametrize("argv", [
    ["tune", str(TUNE_QUICK), "--trials", "1", "--storage", "STORAGE"],
    ["export", "--study", "s", "--trial", "0", "--format", "json", "--storage", "STORAGE"],
    ["pareto", "--study", "s", "--storage", "STORAGE"],
], ids=["tune", "export", "pareto"])
@pytest.mark.parametrize("kind", ["text-journal", "foreign-sqlite", "text-as-sqlite",
                                  "zero-journal", "fifo-journal", "zero-sqlite"])
def test_a_storage_that_is_not_optunas_is_refused_before_anything_is_written(
        tmp_path, monkeypatch, argv, kind):
    """A plain text file as a journal, another program's SQLite database, a text file as
    SQLite, a device or FIFO: refused, the file's bytes and the folder as they were (no
    Optuna tables added, no torn-tail side file, no study.db)."""
    monkeypatch.chdir(tmp_path)
    notes = tmp_path / "notes.txt"
    notes.write_text("shopping: milk\nbread")             # no newline at the end: 'torn'
    other = tmp_path / "other.db"
    _foreign_sqlite(other)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    url = {"text-journal": f"journal:{notes}", "foreign-sqlite": f"sqlite:///{other}",
           "text-as-sqlite": f"sqlite:///{notes}", "zero-journal": "journal:/dev/zero",
           "fifo-journal": f"journal:{fifo}", "zero-sqlite": "sqlite:////dev/zero"}[kind]
    before = {p: fingerprint(p) for p in (notes, other, fifo)}
    names = listing(tmp_path)
    rc, _, err = run(*[url if a == "STORAGE" else a for a in argv])
    one_error(rc, err, "storage:")
    assert {p: fingerprint(p) for p in (notes, other, fifo)} == before
    assert listing(tmp_path) == names


def test_an_optuna_journal_and_a_new_file_are_accepted(tmp_path):
    from slabtune.tuner import storage_guard

    j = tmp_path / "j.log"
    storage_guard.check_journal("journal:j", j)                      # missing: fine
    j.write_text("")
    storage_guard.check_journal("journal:j", j)                      # empty: fine
    j.write_text(json.dumps({"op_code": 0, "worker_id": "w", "study_name": "s"}) + "\n")
    storage_guard.check_journal("journal:j", j)
    db = tmp_path / "s.db"
    con = sqlite3.connect(db)
    con.execute("CREATE TABLE studies (study_id INTEGER)")
    con.execute("CREATE TABLE alembic_version (version_num TEXT)")
    con.commit()
    con.close()
    storage_guard.check_sqlite("sqlite:///s.db", db)


# --------------------------------------------------------------------------- damaged runs

SPEC = {"name": "s", "chunk_size": 3, "evaluator": "structural"}
COLUMNS = [("cpus", "int32", None), ("order", "int32", None)]


def _run_with_parts(out: Path, parts: int = 3) -> store.Run:
    run = store.create_run(out, spec=SPEC, spec_hash="ab" * 32, spec_text="[sweep]",
                           n_chunks=parts, columns=COLUMNS, versions={}, git_revision=None)
    for i in range(parts):
        run.write_part(i, pl.DataFrame([pl.Series("cpus", [i, i + 1], pl.Int32),
                                        pl.Series("order", [0, 1], pl.Int32)]))
    run.finish()
    return run


def test_results_list_reports_a_damaged_run_on_its_own_line_and_lists_the_rest(tmp_path):
    good = _run_with_parts(tmp_path)
    bad = tmp_path / "s-bad"
    bad.mkdir()
    (bad / "manifest.json").write_text("{not json")
    edited = tmp_path / "s-edited"
    edited.mkdir()
    m = json.loads((good.path / "manifest.json").read_text())
    m["chunks"]["total"] = "many"
    (edited / "manifest.json").write_text(json.dumps(m))
    rc, out, err = run("results", "list", "--out", tmp_path)
    assert rc == 0 and err == ""
    lines = out.splitlines()
    assert lines[0].startswith(good.run_id) and "complete" in lines[0]
    assert [ln.split(":", 1)[0] for ln in lines[1:]] == ["damaged", "damaged"]
    assert str(bad) in lines[1] and "unreadable" in lines[1]
    assert str(edited) in lines[2] and "chunks.total" in lines[2]
    rc, out, _ = run("results", "list", "--out", tmp_path, "--json")
    rows = json.loads(out)
    assert [r["state"] for r in rows] == ["complete", "damaged", "damaged"]


@pytest.mark.parametrize("damage", ["truncate", "edit", "delete", "swap"])
def test_results_show_names_a_damaged_part(tmp_path, damage):
    run_ = _run_with_parts(tmp_path)
    part = run_.path / "part-000001.parquet"
    if damage == "truncate":
        part.write_bytes(part.read_bytes()[:-20])
    elif damage == "edit":
        data = bytearray(part.read_bytes())
        data[40] ^= 0xFF
        part.write_bytes(bytes(data))
    elif damage == "delete":
        part.unlink()
    else:                                  # another chunk's rows under this chunk's name
        part.write_bytes((run_.path / "part-000002.parquet").read_bytes())
    rc, _, err = run("results", "show", run_.path)
    one_error(rc, err, "chunk 1", "part-000001.parquet")


def test_a_manifest_naming_a_part_outside_the_run_is_refused(tmp_path):
    run_ = _run_with_parts(tmp_path)
    mf = run_.path / "manifest.json"
    m = json.loads(mf.read_text())
    m["chunks"]["states"]["0"]["part"] = "../../etc/passwd"
    mf.write_text(json.dumps(m))
    rc, _, err = run("results", "show", run_.path)
    one_error(rc, err, "chunks.states.0.part", "part-000000.parquet")


# --------------------------------------------------------------------------- tampered studies

TAMPERING = {
    "unknown param": "UPDATE trial_params SET param_name = 'bogus' WHERE param_id = "
                     "(SELECT MIN(param_id) FROM trial_params)",
    "one value": "DELETE FROM trial_values WHERE objective = 1 AND trial_id = "
                 "(SELECT MIN(trial_id) FROM trials)",
    "one objective": "DELETE FROM study_directions WHERE objective = 1",
    "param out of range": "UPDATE trial_params SET param_value = 99, distribution_json = "
                          "'{\"name\": \"IntDistribution\", \"attributes\": {\"log\": false, "
                          "\"step\": 1, \"low\": 0, \"high\": 99}}' WHERE param_name = "
                          "'slub_max_order'",
    "broken distribution": "UPDATE trial_params SET distribution_json = '{}' WHERE param_id = "
                           "(SELECT MIN(param_id) FROM trial_params)",
    "fraction": "UPDATE trial_params SET param_value = param_value + 0.5 WHERE param_name = "
                "'slub_max_order' AND trial_id = (SELECT MAX(trial_id) FROM trials)",
}
NEEDLES = {"unknown param": "param 'bogus' is not a knob", "one value": "1 objective values",
           "one objective": "has 1 objectives", "param out of range":
           "slub_max_order = 99 is outside", "broken distribution": "do not decode",
           "fraction": "is stored as a fraction"}


@pytest.fixture(scope="module")
def tune_run(tmp_path_factory):
    """A tune run directory with a real SQLite study.db of 8 tune_quick trials."""
    from _tune_helpers import quick_study

    from slabtune.tuner import study as studies

    _study, _url, runner = quick_study()
    run_dir = tmp_path_factory.mktemp("tune") / "t"
    r, _ = studies.create_or_resume(runner.spec, "t", None, run_dir, evaluator=runner.evaluator)
    r.run(8, 8)
    return run_dir


@pytest.mark.slow
@pytest.mark.parametrize("what", list(TAMPERING))
def test_a_tampered_study_is_one_line_in_every_reader(tmp_path, tune_run, what):
    import shutil

    run_dir = tmp_path / "t"
    shutil.copytree(tune_run, run_dir)
    con = sqlite3.connect(run_dir / "study.db")
    with con:
        assert con.execute(TAMPERING[what]).rowcount >= 1
    con.close()
    for argv in (["export", "--run", run_dir, "--trial", "0", "--format", "json"],
                 ["pareto", "--run", run_dir],
                 ["plot", "fleet", "--run", run_dir, "--out", tmp_path / "f.html"]):
        rc, _, err = run(*argv)
        one_error(rc, err, NEEDLES[what])
    assert not (tmp_path / "f.html").exists()


@pytest.fixture(scope="module")
def journal_run(tmp_path_factory) -> Path:
    """A journal (``journal:PATH``) study of 8 tune_quick trials written by ``tune`` (one
    CREATE_TRIAL record per trial, its params inside), plus one trial asked and told
    through Optuna's own API (one SET_TRIAL_PARAM record per param)."""
    import optuna

    from slabtune.tuner import study as studies

    path = tmp_path_factory.mktemp("journal") / "j.log"
    rc, _, err = run("tune", "tune_quick", "--trials", "8", "--batch", "8",
                     "--storage", f"journal:{path}", "--study", "j")
    assert rc == 0, err
    st = optuna.load_study(study_name="j", storage=studies.open_storage(f"journal:{path}"))
    first = st.trials[0]
    trial = st.ask(studies.load_spec("tune_quick").space.distributions())
    for k, v in first.user_attrs.items():      # a trial as tune writes one, off the front
        trial.set_user_attr(k, v)
    st.tell(trial, [v + 1.0 for v in first.values])
    return path


def _ops(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.parametrize("op", ["create_trial", "set_trial_param"])
def test_a_fraction_in_a_journal_is_one_line_naming_the_trial_and_param(tmp_path,
                                                                        journal_run, op):
    """A journal's int param edited to a fraction: Optuna reads it back as int(value), so
    export, pareto and plot used 2 for 2.5 silently.  The stored value is read from the
    journal's own records (a tune batch's CREATE_TRIAL params, a plain ask's
    SET_TRIAL_PARAM) and refused naming the trial and the param."""
    import optuna

    from slabtune.tuner import study as studies

    ops = _ops(journal_run)
    if op == "create_trial":   # the last trial tune wrote: trial 7
        i = max(k for k, o in enumerate(ops) if "slub_max_order" in o.get("params", {}))
        ops[i]["params"]["slub_max_order"] += 0.5
        number = 7
    else:                      # the trial asked through Optuna: trial 8
        i = max(k for k, o in enumerate(ops) if o.get("param_name") == "slub_max_order")
        ops[i]["param_value_internal"] += 0.5
        number = 8
    stored = next(v for v in (ops[i].get("params", {}).get("slub_max_order"),
                              ops[i].get("param_value_internal")) if v is not None)
    path = tmp_path / "j.log"
    journal = f"journal:{path}"
    path.write_text("".join(json.dumps(o) + "\n" for o in _ops(journal_run)))
    rc, _, err = run("pareto", "--study", "j", "--storage", journal)   # control: untampered
    assert rc == 0, err
    path.write_text("".join(json.dumps(o) + "\n" for o in ops))
    # what Optuna itself reads back: the edit truncated to an int, nothing to see
    read = optuna.load_study(study_name="j", storage=studies.open_storage(journal, False))
    assert read.trials[number].params["slub_max_order"] == int(stored)
    for argv in (["export", "--trial", "0", "--format", "json"], ["pareto"],
                 ["plot", "fleet", "--out", tmp_path / "f.html"]):
        rc, out, err = run(*argv, "--study", "j", "--storage", journal)
        one_error(rc, err, f"trial {number}:", "'slub_max_order'", f"= {stored!r}",
                  "stored as a fraction")
        assert out == ""
    assert not (tmp_path / "f.html").exists()


def test_a_failed_journal_write_in_tune_names_the_storage(tmp_path, journal_run):
    """tune appending a batch to a journal that cannot grow (EFBIG from a file size limit
    here; ENOSPC and EIO take the same path) is one line naming the storage: it was the
    system's words alone ("File too large").  The records already there still read."""
    from slabtune.tuner import study as studies

    path = tmp_path / "j.log"
    path.write_bytes(journal_run.read_bytes())
    size = path.stat().st_size
    journal = f"journal:{path}"
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (size + 512, hard))   # a batch is ~16 KiB
    try:
        rc, _, err = run("tune", "tune_quick", "--trials", "8", "--batch", "8",
                         "--storage", journal, "--study", "j")
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    one_error(rc, err, f"storage: {journal!r}", "cannot write", "too large")
    assert path.stat().st_size == size + 512          # a torn record, cut at the limit
    rc, out, err = run("pareto", "--study", "j", "--storage", journal, "--json")
    assert rc == 0, err
    read = studies.load_study("j", journal)
    assert len(read.trials) == 9                      # 8 from tune, 1 asked: none lost
    data = path.read_bytes()
    assert data.startswith(journal_run.read_bytes()) and not data.endswith(b"\n")


def test_a_failed_sqlite_commit_in_tune_names_the_storage(tmp_path):
    """The same for a SQLite study past the file size limit: Optuna's StorageInternalError
    (from SQLAlchemy's "disk I/O error") was a traceback; now one line naming the storage,
    and the database keeps its 8 trials (the batch's transaction rolled back)."""
    from slabtune.tuner import study as studies

    db = tmp_path / "s.db"
    url = f"sqlite:///{db}"
    rc, _, err = run("tune", "tune_quick", "--trials", "8", "--batch", "8", "--storage", url,
                     "--study", "s")
    assert rc == 0, err
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (db.stat().st_size + 4096, hard))
    try:
        rc, _, err = run("tune", "tune_quick", "--trials", "640", "--batch", "64",
                         "--storage", url, "--study", "s")
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    one_error(rc, err, f"storage: {url!r}", "cannot write", "disk I/O error")
    assert len(studies.load_study("s", url).trials) == 8


def test_a_storage_url_in_a_message_has_its_password_masked():
    from slabtune.tuner.study import shown_url

    assert shown_url("postgresql://tuner:s3cret@db.example/slab") == \
        "postgresql://tuner:***@db.example/slab"
    assert shown_url("journal:/runs/a@b.log") == "journal:/runs/a@b.log"
    assert shown_url("sqlite:///runs/t/study.db") == "sqlite:///runs/t/study.db"


@pytest.mark.parametrize("record", [{"ok": True, "kernel": "7.2"}, "not a record", [1, 2]])
def test_lab_show_of_a_malformed_record_is_one_line(tmp_path, record):
    run_ = store.create_run(tmp_path, spec={"name": "lab", "chunk_size": 1, "evaluator": "lab"},
                            spec_hash="cd" * 32, spec_text="", n_chunks=1, columns=[],
                            versions={}, git_revision=None, extra={"kind": "lab"})
    run_.manifest["chunks"]["states"]["0"] = {"state": "failed", "record": record}
    run_.save()
    for extra in ([], ["--json"]):
        rc, out, err = run("lab", "show", run_.path, "--out", tmp_path, *extra)
        one_error(rc, err, "lab show:", "chunk 0: record", "malformed" if isinstance(
            record, dict) else "not a table")
        assert out == ""


@pytest.mark.parametrize("kind", ["fifo", "device"])
def test_kernel_snapshot_root_with_a_planted_fifo_or_device_is_one_line(tmp_path, monkeypatch,
                                                                        kind):
    """A tree copied from a guest (--root) is input too: a FIFO where a sysfs file belongs
    blocked the command forever, a link to /dev/zero never ended."""
    monkeypatch.chdir(tmp_path)
    cpu = tmp_path / "root/sys/devices/system/cpu"
    cpu.mkdir(parents=True)
    if kind == "fifo":
        os.mkfifo(cpu / "possible")
    else:
        (cpu / "possible").symlink_to("/dev/zero")
    rc, _, err = run("kernel", "snapshot", "--root", tmp_path / "root", "--out", "s.csv")
    one_error(rc, err, "--root", "possible", "FIFO" if kind == "fifo" else "character device")
    assert not (tmp_path / "s.csv").exists()


def test_a_front_trial_without_per_topology_values_is_one_line(tmp_path, journal_run):
    """A trial told through Optuna's own API carries no per-topology values: on the front
    it made pareto raise KeyError.  It is refused naming the trial and the attribute."""
    import shutil

    import optuna

    from slabtune.tuner import study as studies

    path = tmp_path / "j.log"
    shutil.copy(journal_run, path)
    journal = f"journal:{path}"
    st = optuna.load_study(study_name="j", storage=studies.open_storage(journal, False))
    best = min(st.best_trials, key=lambda t: t.values[0])
    trial = st.ask(studies.load_spec("tune_quick").space.distributions())
    st.tell(trial, [v - 1.0 for v in best.values])     # dominates: on the front
    rc, out, err = run("pareto", "--study", "j", "--storage", journal)
    one_error(rc, err, f"trial {trial.number}:", "per_topology")
    assert out == ""


def test_a_storage_password_is_never_printed():
    """A storage URL's password appears in no error and no ``next:`` hint: an RDB that
    cannot be opened (nothing listens on port 1, or no driver) and the hint after a study
    both show ``***`` in its place."""
    from slabtune.commands.tune import next_hint

    url = "postgresql://alice:s3cret-pw@127.0.0.1:1/slab"
    rc, out, err = run("pareto", "--study", "x", "--storage", url)
    line = one_error(rc, err, "alice:***@127.0.0.1")
    assert "s3cret-pw" not in out + err, line
    hint = next_hint("x", url, url)
    assert "s3cret-pw" not in hint and "alice:***@" in hint

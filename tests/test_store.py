"""The results store: atomic parts, manifest states, scans, run lookup and locking.
No JAX, no Ray (the store must not need them)."""

from __future__ import annotations

import json
import subprocess
import sys

import polars as pl
import pytest

from slabtune.results import store

SPEC = {"name": "s", "chunk_size": 3, "evaluator": "structural"}
COLUMNS = [("cpus", "int32", None), ("profile", "enum", ["v6.1", "v7.0"]), ("order", "int32", None)]


def _run(tmp_path, n_chunks=3):
    return store.create_run(tmp_path, spec=SPEC, spec_hash="ab" * 32, spec_text="[sweep]",
                            n_chunks=n_chunks, columns=COLUMNS, versions={"polars": pl.__version__},
                            git_revision=None)


def _df(cpus, profiles, orders):
    return pl.DataFrame([pl.Series("cpus", cpus, pl.Int32),
                         pl.Series("profile", profiles, pl.Enum(["v6.1", "v7.0"])),
                         pl.Series("order", orders, pl.Int32)])


def test_store_does_not_import_jax():
    code = ("import sys; import slabtune.results.store, slabtune.sweeps.spec, "
            "slabtune.sweeps.grid; print('jax' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_parts_manifest_and_scan(tmp_path):
    run = _run(tmp_path)
    assert run.path.parent == tmp_path and run.run_id.startswith("s-")
    assert run.pending_chunks() == [0, 1, 2] and run.rows == 0
    assert run.scan().collect().schema == pl.Schema({"cpus": pl.Int32,
                                                     "profile": pl.Enum(["v6.1", "v7.0"]),
                                                     "order": pl.Int32})
    run.write_part(1, _df([4, 8], ["v7.0", "v6.1"], [1, 2]))
    run.write_part(0, _df([1], ["v6.1"], [0]))
    with pytest.raises(store.StoreError, match="chunk 1: already written"):
        run.write_part(1, _df([4], ["v7.0"], [1]))
    with pytest.raises(store.StoreError, match="not done"):
        run.finish()
    again = store.open_run(run.path)
    assert again.done_chunks() == [0, 1] and again.pending_chunks() == [2]
    assert again.rows == 3
    df = again.scan().collect()
    assert df["cpus"].to_list() == [1, 4, 8]  # chunk order, not write order
    assert df["profile"].to_list() == ["v6.1", "v7.0", "v6.1"]
    assert not again.complete
    again.write_part(2, _df([], [], []))
    again.finish()
    done = store.open_run(run.path)
    assert done.complete and done.manifest["rows"] == 3 and done.manifest["ended"]
    mf = json.loads((run.path / "manifest.json").read_text())
    assert mf["chunks"]["states"]["0"] == {**mf["chunks"]["states"]["0"], "state": "done",
                                           "rows": 1, "part": "part-000000.parquet"}


def test_unlisted_parts_and_temporaries_are_ignored(tmp_path):
    run = _run(tmp_path)
    run.write_part(0, _df([1], ["v6.1"], [0]))
    # a part written by a killed process before the manifest flipped, and a temp file
    _df([9, 9], ["v7.0", "v7.0"], [9, 9]).write_parquet(run.path / "part-000001.parquet")
    (run.path / ".part-000002.parquet.tmp-123").write_bytes(b"half")
    again = store.open_run(run.path)
    assert again.scan().collect()["cpus"].to_list() == [1]
    assert again.clean_temporaries() == 1
    assert not list(run.path.glob(".*.tmp-*"))


def test_a_part_written_elsewhere_is_read_once_committed(tmp_path):
    """A worker writes a part with write_part_file (no manifest); the driver commits it.
    Until then it is not read; a retry replaces it; a wrong or missing part is refused."""
    run = _run(tmp_path)
    name, size = store.write_part_file(run.path, 1, _df([7], ["v7.0"], [2]))
    assert name == "part-000001.parquet" and size == (run.path / name).stat().st_size
    assert run.scan().collect().height == 0
    assert not list(run.path.glob(".*.tmp-*"))
    store.write_part_file(run.path, 1, _df([8], ["v7.0"], [3]))      # a retried chunk
    with pytest.raises(store.StoreError, match="chunk 0: part 'part-000001.parquet' is not"):
        run.commit_part(0, name, 1)
    with pytest.raises(store.StoreError, match="chunk 2: part .*part-000002.parquet is missing"):
        run.commit_part(2, "part-000002.parquet", 1)
    run.commit_part(1, name, 1, device="cpu")
    with pytest.raises(store.StoreError, match="chunk 1: already written"):
        run.commit_part(1, name, 1)
    again = store.open_run(run.path)
    assert again.scan().collect()["cpus"].to_list() == [8]
    assert again.manifest["chunks"]["states"]["1"]["device"] == "cpu" and again.rows == 1
    assert again.parquet_bytes() == (run.path / name).stat().st_size
    assert again.summary()["parquet_bytes"] == again.parquet_bytes()


def test_resolve_and_list_runs(tmp_path):
    a = _run(tmp_path)
    b = _run(tmp_path)  # same second: gets a distinct id
    assert a.run_id != b.run_id
    assert store.resolve_run(a.path).run_id == a.run_id
    assert store.resolve_run(b.run_id, tmp_path).run_id == b.run_id
    with pytest.raises(store.StoreError, match="matches 2 runs"):
        store.resolve_run("s-", tmp_path)
    with pytest.raises(store.StoreError, match="no run 'zz'"):
        store.resolve_run("zz", tmp_path)
    (tmp_path / "junk").mkdir()
    df = store.list_runs(tmp_path)
    assert df.height == 2 and set(df["state"]) == {"partial"}
    assert store.list_runs(tmp_path / "absent").height == 0


def test_open_run_rejects_non_runs(tmp_path):
    with pytest.raises(store.StoreError, match="not a run directory"):
        store.open_run(tmp_path)
    (tmp_path / "manifest.json").write_text("{not json")
    with pytest.raises(store.StoreError, match="unreadable"):
        store.open_run(tmp_path)


def test_one_writer_at_a_time(tmp_path):
    run = _run(tmp_path)
    with run.lock():
        with pytest.raises(store.StoreError, match="another process is writing it"):
            with store.open_run(run.path).lock():
                pass
    with run.lock():  # released
        pass


def test_package_exports_are_lazy():
    import slabtune.results as results_pkg

    assert results_pkg.open_run is store.open_run
    with pytest.raises(AttributeError):
        results_pkg.nonesuch  # noqa: B018


def _done_run(tmp_path):
    run = _run(tmp_path)
    for i in range(3):
        run.write_part(i, _df([i, i + 1], ["v6.1", "v7.0"], [0, i]))
    return run


def test_a_part_carries_its_size_and_sha256(tmp_path):
    import hashlib

    run = _done_run(tmp_path)
    st = store.open_run(run.path).manifest["chunks"]["states"]["1"]
    data = (run.path / "part-000001.parquet").read_bytes()
    assert st["bytes"] == len(data) and st["sha256"] == hashlib.sha256(data).hexdigest()
    assert store.open_run(run.path).damaged_parts() == []


def test_a_resumed_run_computes_a_damaged_part_again(tmp_path, capsys):
    """Truncated part 0, edited part 2: clean_temporaries (the start of every resumed
    attempt) puts both chunks back to pending with a note naming the part; part 1 stays."""
    run = _done_run(tmp_path)
    p0, p2 = run.path / "part-000000.parquet", run.path / "part-000002.parquet"
    p0.write_bytes(p0.read_bytes()[:30])
    data = bytearray(p2.read_bytes())
    data[len(data) // 2] ^= 1
    p2.write_bytes(bytes(data))
    again = store.open_run(run.path)
    assert [(i, n) for i, n, _ in again.damaged_parts()] == [(0, p0.name), (2, p2.name)]
    with pytest.raises(store.StoreError, match="chunk 0: .*part-000000.parquet is .* bytes"):
        again.verify()
    again.clean_temporaries()
    err = capsys.readouterr().err
    assert "part-000000.parquet" in err and "part-000002.parquet" in err
    again = store.open_run(run.path)
    assert again.pending_chunks() == [0, 2] and again.done_chunks() == [1]
    again.write_part(0, _df([0, 1], ["v6.1", "v7.0"], [0, 0]))
    assert again.damaged_parts() == []


def test_a_manifest_from_before_checksums_is_checked_by_row_counts(tmp_path):
    run = _done_run(tmp_path)
    mf = run.path / store.MANIFEST
    m = json.loads(mf.read_text())
    for st in m["chunks"]["states"].values():
        del st["sha256"], st["bytes"]
    m["chunks"]["states"]["1"]["rows"] = 5                # the part holds 2
    mf.write_text(json.dumps(m))
    old = store.open_run(run.path)
    assert [(i, why) for i, _, why in old.damaged_parts()] == [
        (1, "holds 2 rows, the manifest says 5")]
    (run.path / "part-000002.parquet").write_bytes(b"PAR1 not parquet")
    assert [i for i, _, _ in store.open_run(run.path).damaged_parts()] == [1, 2]

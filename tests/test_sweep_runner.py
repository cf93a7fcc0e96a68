"""The sweep runner on a real in-process Ray (session fixture ``ray_local``): rows against
the scalar reference, retries of failing tasks, resume, and the CLI's run/plan/results."""

from __future__ import annotations

import io
import json
import os

import polars as pl
import pytest

from slabtune import cli
from slabtune.errors import SlabtuneError
from slabtune.model import caches, profiles, reference
from slabtune.results import store
from slabtune.sweeps import grid, runner
from slabtune.sweeps import spec as sweep_spec
from slabtune.sweeps.progress import Progress, format_eta

pytestmark = pytest.mark.ray

SMALL = """
[sweep]
name = "small"
chunk_size = 100

[topology]
cpus = [1, 2, 6, 64, 512]
possible = [0, 64]

[cache]
cache = ["kmalloc-8", "kmalloc-96", "kmalloc-8k", "maple_node", "kmem_cache", "skbuff_head_cache"]

[kernel]
profile = ["v2.6.27", "v5.10", "v5.11", "v6.18", "v7.0"]

[boot]
min_order = [0, 2]
max_order = [1, 3]

[policy]
explicit_sheaf = [-1, 40]

[[exclude]]
min_order = { gt = "max_order" }
"""


@pytest.fixture(scope="module")
def small_spec():
    return sweep_spec.parse(SMALL, "small.toml")


@pytest.fixture(scope="module")
def small_run(ray_local, small_spec, tmp_path_factory):
    out = tmp_path_factory.mktemp("runs")
    res = runner.run_sweep(small_spec, out, spec_text=SMALL, progress=False)
    return res


def _expected(row: dict) -> dict:
    """The scalar reference's prediction for one output row."""
    info = caches.get_cache(row["cache"])
    cpus = row["cpus"]
    possible = row["possible"] or cpus
    explicit = info.explicit_sheaf if row["explicit_sheaf"] < 0 else row["explicit_sheaf"]
    want = reference.structure(info.size, possible, cpus, cpus,
                       profiles.get_profile(row["profile"]),
                       row["min_order"], row["max_order"], 0, info.early, info.is_kmalloc,
                       info.is_bootstrap, explicit)
    want["slab_size"] = info.size
    return want


def test_rows_match_the_scalar_reference(small_run, small_spec):
    run = store.open_run(small_run.run_dir)
    assert run.complete and small_run.chunks_run == grid.n_chunks(small_spec) > 3
    df = run.collect()
    assert df.height == small_run.rows == grid.count_rows(small_spec)
    assert df.columns == list(small_spec.axis_names) + list(small_spec.metrics)
    assert df.select(small_spec.axis_names).is_duplicated().sum() == 0
    assert (df["min_order"] <= df["max_order"]).all()
    for row in df.iter_rows(named=True):
        want = _expected(row)
        got = {k: row[k] for k in want}
        assert got == want, row


def test_known_kernel_values_appear(small_run):
    df = store.open_run(small_run.run_dir).collect()

    def one(**kw):
        sel = df.filter(**kw)
        assert sel.height == 1, kw
        return sel.row(0, named=True)

    # seed slub-order-nr-cpus-2021: kmalloc caches are early, so v5.11 sizes them for one
    # online CPU whatever the machine: min_objects 4 * (fls(1) + 1) = 8, capped at the 4
    # objects of 8 KiB an order-3 slab holds.
    r = one(cache="kmalloc-8k", cpus=64, possible=0, profile="v5.11", min_order=0, max_order=3,
            explicit_sheaf=-1)
    assert (r["nr_cpus"], r["order"], r["objs_per_slab"]) == (1, 3, 4)
    # maple_node asks for 32 sheaf objects (v6.18 opt-in); v7.0 gives every non-kmalloc cache
    # max(default, explicit) = max(26 rounded up to a kmalloc-256 sheaf = 28, 32) = 32.
    assert one(cache="maple_node", cpus=6, possible=0, profile="v6.18", min_order=0,
               max_order=3, explicit_sheaf=-1)["sheaf_capacity"] == 32
    assert one(cache="maple_node", cpus=6, possible=0, profile="v7.0", min_order=0,
               max_order=3, explicit_sheaf=-1)["sheaf_capacity"] == 32
    # kmem_cache is a bootstrap cache: no sheaves even in v7.0
    assert one(cache="kmem_cache", cpus=6, possible=0, profile="v7.0", min_order=0,
               max_order=3, explicit_sheaf=40)["sheaf_capacity"] == 0


def test_manifest_records_the_run(small_run, small_spec):
    m = store.open_run(small_run.run_dir).manifest
    assert m["spec_hash"] == small_spec.hash and m["spec_text"] == SMALL
    assert m["versions"]["ray"] and m["versions"]["jax"] and m["versions"]["polars"]
    assert m["devices"] and all(d == "cpu" or d.startswith("gpu:") for d in m["devices"])
    assert m["started"] <= m["ended"]
    assert len(m["chunks"]["states"]) == m["chunks"]["total"] == grid.n_chunks(small_spec)
    assert sum(s["rows"] for s in m["chunks"]["states"].values()) == small_run.rows


@pytest.mark.slow
def test_failed_tasks_are_retried_and_written_once(ray_local, small_spec, small_run, tmp_path):
    markers = tmp_path / "markers"
    markers.mkdir()
    res = runner.run_sweep(small_spec, tmp_path / "runs", progress=False,
                           fail_once_dir=str(markers))
    n = grid.n_chunks(small_spec)
    assert sorted(p.name for p in markers.iterdir()) == sorted(f"failed-{i}" for i in range(n))
    got = store.open_run(res.run_dir).collect()
    want = store.open_run(small_run.run_dir).collect()
    assert got.equals(want)
    assert len(list(res.run_dir.glob("part-*.parquet"))) == n


@pytest.mark.slow
def test_a_chunk_that_always_fails_is_recorded_and_resumed(ray_local, small_spec, small_run,
                                                          tmp_path):
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    (hooks / "always-2").touch()
    with pytest.raises(SlabtuneError, match=r"chunk 2: failed after 4 attempts: .*injected "
                                            r"permanent failure of chunk 2"):
        runner.run_sweep(small_spec, tmp_path / "runs", progress=False,
                         fail_once_dir=str(hooks))
    (run_dir,) = (tmp_path / "runs").iterdir()
    run = store.open_run(run_dir)
    assert run.chunk_state(2) == "failed" and 2 in run.pending_chunks()
    assert "permanent failure" in run.manifest["chunks"]["states"]["2"]["error"]
    (hooks / "always-2").unlink()
    res = runner.run_sweep(small_spec, tmp_path / "runs", resume=run_dir.name, progress=False,
                           fail_once_dir=str(hooks))
    assert store.open_run(res.run_dir).collect().equals(
        store.open_run(small_run.run_dir).collect())


def test_resume_of_a_partial_run_recomputes_only_missing_chunks(ray_local, small_spec,
                                                               small_run, tmp_path):
    # An interrupted run: chunks 0 and 2 written, the rest never started.  Build it with the
    # store from the finished run's parts, as the runner would have left it.
    src = store.open_run(small_run.run_dir)
    part = store.create_run(tmp_path, spec=small_spec.to_dict(), spec_hash=small_spec.hash,
                            spec_text=SMALL, n_chunks=src.n_chunks,
                            columns=src.manifest["columns"], versions={}, git_revision=None)
    for i in (0, 2):
        part.write_part(i, pl.read_parquet(src.path / f"part-{i:06d}.parquet"))
    res = runner.run_sweep(small_spec, tmp_path, resume=part.run_id, progress=False)
    assert res.run_dir == part.path
    assert res.chunks_run == src.n_chunks - 2
    assert store.open_run(part.path).collect().equals(src.collect())
    # resuming a complete run computes nothing and changes no row
    again = runner.run_sweep(small_spec, tmp_path, resume=str(part.path), progress=False)
    assert again.chunks_run == 0 and again.rows == src.rows


def test_workers_on_other_hosts_send_rows_back(ray_local, small_spec, small_run, tmp_path,
                                                monkeypatch):
    """Where Ray's nodes are not all this host, the driver writes the parts from the
    returned columns: the same rows as the parts the workers wrote themselves."""
    from slabtune.sweeps import dispatch

    assert store.open_run(small_run.run_dir).manifest["attempts"][-1]["workers_write_parts"]
    monkeypatch.setattr(dispatch, "workers_see", lambda path: False)
    res = runner.run_sweep(small_spec, tmp_path, progress=False)
    run = store.open_run(res.run_dir)
    assert run.manifest["attempts"][-1]["workers_write_parts"] is False
    assert run.collect().equals(store.open_run(small_run.run_dir).collect())


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_a_signal_dropped_in_a_gc_callback_is_raised_again_by_the_wait_loop():
    """A raising handler that runs inside a garbage-collector callback has its exception
    printed and dropped; the chunk loop's latch raises it again at its next step."""
    import gc
    import signal

    from slabtune.sweeps import dispatch

    class Stop(Exception):
        pass

    def handler(signum, frame):
        raise Stop(signum)

    def callback(phase, info):
        if phase == "start" and not sent:
            sent.append(True)
            os.kill(os.getpid(), signal.SIGHUP)     # handled here, inside the callback

    sent: list = []
    previous = signal.signal(signal.SIGHUP, handler)
    try:
        with dispatch._latched_signals() as check:
            check()                                  # nothing noted yet
            gc.callbacks.append(callback)
            try:
                gc.collect()
            finally:
                gc.callbacks.remove(callback)
            assert sent
            with pytest.raises(Stop):
                check()
        assert signal.getsignal(signal.SIGHUP) is handler
    finally:
        signal.signal(signal.SIGHUP, previous)


def test_resume_with_another_spec_is_refused(ray_local, small_run):
    other = sweep_spec.parse(SMALL.replace("[1, 2, 6, 64, 512]", "[1, 2]"))
    with pytest.raises(sweep_spec.SpecError, match="--resume: run .* different spec"):
        runner.run_sweep(other, small_run.run_dir.parent, resume=str(small_run.run_dir),
                         progress=False)


def test_one_compiled_evaluator_per_chunk_shape():
    from slabtune.sweeps import evaluators

    spec = sweep_spec.load("seeds")  # 6 chunks, the last one partly padding and exclusions
    fn = evaluators._structural_fn()
    before = fn._cache_size()
    shapes = set()
    for i in range(grid.n_chunks(spec)):
        ch = grid.chunk(spec, i)
        shapes.add(len(ch.keep))
        evaluators.EVALUATORS["structural"].evaluate(spec, ch)
    assert shapes == {grid.bucket(spec.chunk_size)}
    assert fn._cache_size() - before <= 1  # at most one new compilation for the whole sweep


# --------------------------------------------------------------------------- CLI


def _main(capsys, *argv):
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_run_json_and_results(ray_local, tmp_path, capsys):
    spec = tmp_path / "tiny.toml"
    spec.write_text(SMALL.replace("chunk_size = 100", "chunk_size = 1000"))
    code, out, err = _main(capsys, "sweep", "run", str(spec), "--out", str(tmp_path / "r"),
                           "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert set(doc) >= {"run_dir", "rows"}
    assert pl.scan_parquet(os.path.join(doc["run_dir"], "part-*.parquet")).select(
        pl.len()).collect().item() == doc["rows"]

    code, out, _ = _main(capsys, "results", "list", "--out", str(tmp_path / "r"), "--json")
    runs = json.loads(out)
    assert code == 0 and len(runs) == 1 and runs[0]["state"] == "complete"
    assert runs[0]["rows"] == doc["rows"]

    code, out, _ = _main(capsys, "results", "show", runs[0]["run_id"], "--out",
                         str(tmp_path / "r"))
    assert code == 0
    assert f"rows: {doc['rows']}" in out and "order: int32  0..3" in out


def test_cli_bad_spec_fails_cleanly_and_leaves_runs_alone(small_run, tmp_path, capsys):
    before = {p.name: p.read_bytes() for p in small_run.run_dir.iterdir()}
    bad = tmp_path / "bad.toml"
    bad.write_text(SMALL.replace("max_order = [1, 3]", "max_order = [1, 30]"))
    code, out, err = _main(capsys, "sweep", "run", str(bad), "--out",
                           str(small_run.run_dir.parent))
    assert code == 2 and out == ""
    assert err.strip() == "slabtune: error: bad.toml: boot.max_order: value 30 is outside 0..10"
    after = {p.name: p.read_bytes() for p in small_run.run_dir.iterdir()}
    assert before == after
    assert [r.run_id for r in store.iter_runs(small_run.run_dir.parent)] == [
        small_run.run_dir.name]


def test_cli_plan(capsys):
    code, out, _ = _main(capsys, "sweep", "plan", "fleet", "--json")
    doc = json.loads(out)
    assert code == 0
    assert doc["configs"] == 2**20 and doc["chunks"] == 8
    assert 0 < doc["est_memory_bytes"] < 8 * 2**30
    code, out, _ = _main(capsys, "sweep", "plan", "seeds")
    assert code == 0 and "configs: 12160 (10880 of 23040 excluded)" in out


# --------------------------------------------------------------------------- progress


def test_plain_progress_lines_when_not_a_terminal():
    buf = io.StringIO()
    p = Progress(1000, 4, stream=buf, tty=False, interval=0.0)
    for _ in range(4):
        p.update(250)
    lines = buf.getvalue().splitlines()
    assert len(lines) == 4 and all(ln.startswith("progress: ") for ln in lines)
    assert lines[-1].startswith("progress: 1000/1000 configs (100.0%), chunk 4/4,")
    assert "\r" not in buf.getvalue()


def test_terminal_progress_redraws_one_line():
    buf = io.StringIO()
    p = Progress(100, 2, stream=buf, tty=True)
    p.update(50)
    p.update(50)
    text = buf.getvalue()
    assert text.count("\r") == 2 and text.endswith("\n") and "[" + "#" * 30 + "]" in text


def test_eta_format():
    assert [format_eta(x) for x in (5, 75, 7300, float("nan"))] == ["5s", "1m15s", "2h01m", "?"]


# --------------------------------------------------------------------------- dynamics

DYN = """
[sweep]
name = "dyn"
evaluator = "dynamics"
chunk_size = 8
seed = 7
steps = 300

[topology]
cpus = [8]
nodes = [2]
memoryless_nodes = [0, 1]

[cache]
cache = ["maple_node", "kmalloc-256"]

[kernel]
profile = ["v6.1", "v7.0", "v7.1"]

[workload]
workload = ["local", "block_io"]
"""

needs_dynamics = pytest.mark.skipif("dynamics" not in __import__(
    "slabtune.sweeps.evaluators", fromlist=["EVALUATORS"]).EVALUATORS,
    reason="the dynamics model is not installed")


def _in_process(spec) -> pl.DataFrame:
    from slabtune.sweeps.dispatch import chunk_task

    d = {**spec.to_dict(), "_hash": spec.hash}
    return pl.concat([runner.frame(spec, chunk_task(d, i)["columns"])
                      for i in range(grid.n_chunks(spec))])


@pytest.fixture(scope="module")
def dyn_frame():
    return _in_process(sweep_spec.parse(DYN))


@pytest.mark.slow
@needs_dynamics
def test_dynamics_rows_do_not_depend_on_chunking(dyn_frame):
    other = _in_process(sweep_spec.parse(DYN.replace("chunk_size = 8", "chunk_size = 5")))
    assert dyn_frame.height == 24 and other.equals(dyn_frame)
    assert dyn_frame.schema["ns_per_op"] == pl.Float32
    assert dyn_frame.schema["order"] == pl.Int32


@needs_dynamics
def test_dynamics_shows_the_sheaves_memoryless_regression(dyn_frame):
    """seed sheaves-cross-cpu-regression-2026: with CPUs on a memoryless node, v7.0 frees
    of maple_node objects bypass the sheaves (remote frees); v7.1 lets them use sheaves."""
    def one(**kw):
        sel = dyn_frame.filter(cache="maple_node", workload="local", **kw)
        assert sel.height == 1
        return sel.row(0, named=True)

    v70, v71 = one(memoryless_nodes=1, profile="v7.0"), one(memoryless_nodes=1, profile="v7.1")
    assert v70["remote_frees_per_kop"] > 100 and v71["remote_frees_per_kop"] == 0
    assert v70["free_fastpath_frac"] < 0.9 <= v71["free_fastpath_frac"]
    assert v70["ns_per_op"] > v71["ns_per_op"]
    assert one(memoryless_nodes=0, profile="v7.0")["remote_frees_per_kop"] == 0
    no_sheaf = dyn_frame.filter(pl.col("sheaf_capacity") == 0)
    assert no_sheaf.height > 0 and (no_sheaf["sheaf_bytes"] == 0).all()


@pytest.mark.slow
@needs_dynamics
def test_dynamics_sweep_on_ray_matches_in_process(ray_local, dyn_frame, tmp_path):
    res = runner.run_sweep(sweep_spec.parse(DYN), tmp_path, progress=False)
    assert store.open_run(res.run_dir).collect().equals(dyn_frame)


def test_steps_belong_to_the_dynamics_evaluator():
    with pytest.raises(sweep_spec.SpecError, match="sweep.steps: the structural evaluator"):
        sweep_spec.parse(SMALL.replace("chunk_size = 100", "chunk_size = 100\nsteps = 10"))


@needs_dynamics
def test_dynamics_spec_names_a_workload_the_topology_cannot_run():
    bad = DYN.replace("cpus = [8]", "cpus = [1, 8]").replace("nodes = [2]", "nodes = [1]") \
        .replace("memoryless_nodes = [0, 1]", "memoryless_nodes = [0]") \
        .replace('["local", "block_io"]', '["local", "producer_consumer"]')
    with pytest.raises(sweep_spec.SpecError,
                       match=r"workload.producer_consumer: .*needs at least 2 "
                             r"CPUs \(at cpus=1"):
        sweep_spec.parse(bad, "bad.toml")

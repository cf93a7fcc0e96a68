"""Sweeps against a separate Ray head (``ray start --head`` on 127.0.0.1, fixture
``ray_head``), driven through the real CLI in subprocesses: --ray-address, RAY_ADDRESS, and
a driver SIGKILLed after some chunks whose run --resume completes with exactly the rows of
an uninterrupted run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from slabtune.results import store
from slabtune.sweeps import grid, runner
from slabtune.sweeps import spec as sweep_spec

pytestmark = [pytest.mark.ray, pytest.mark.slow]

SPEC = """
[sweep]
name = "cluster"
chunk_size = 256

[topology]
cpus = { logrange = [1, 4096], factor = 4 }
nodes = [1, 2]
memoryless_nodes = [0, 1]

[cache]
cache = ["kmalloc", "maple_node"]

[kernel]
profile = ["v5.10", "v5.11", "v6.18", "v7.1"]
"""


def cli(*args, env_extra=None, timeout=240):
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env.update({"RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled"})
    env.update(env_extra or {})
    return subprocess.run([sys.executable, "-m", "slabtune", *args], capture_output=True,
                          text=True, timeout=timeout, env=env)


@pytest.fixture(scope="module")
def spec_file(tmp_path_factory):
    p = tmp_path_factory.mktemp("spec") / "cluster.toml"
    p.write_text(SPEC)
    return p


@pytest.fixture(scope="module")
def full_run(ray_head, spec_file, tmp_path_factory):
    """An uninterrupted run on the head, via --ray-address."""
    out = tmp_path_factory.mktemp("runs")
    proc = cli("sweep", "run", str(spec_file), "--out", str(out), "--ray-address", ray_head,
               "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


def test_sweep_on_a_ray_head(full_run, ray_head):
    spec = sweep_spec.parse(SPEC)
    assert grid.n_chunks(spec) > 4
    run = store.open_run(full_run["run_dir"])
    assert run.complete and full_run["rows"] == grid.count_rows(spec) == run.collect().height
    assert run.manifest["ray"] == {"mode": "cluster", "address": ray_head}


def test_ray_address_from_the_environment(ray_head, spec_file, tmp_path, full_run):
    proc = cli("sweep", "run", str(spec_file), "--out", str(tmp_path), "--json",
               env_extra={"RAY_ADDRESS": ray_head})
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(proc.stdout)
    run = store.open_run(doc["run_dir"])
    assert run.manifest["ray"]["mode"] == "cluster"
    assert run.collect().equals(store.open_run(full_run["run_dir"]).collect())


def test_killed_run_resumes_to_exactly_the_uninterrupted_rows(ray_head, spec_file, tmp_path,
                                                              full_run):
    proc = cli("sweep", "run", str(spec_file), "--out", str(tmp_path), "--ray-address",
               ray_head, env_extra={runner.KILL_AFTER_ENV: "3"})
    assert proc.returncode == -signal.SIGKILL, (proc.returncode, proc.stderr[-2000:])
    (run_dir,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    killed = store.open_run(run_dir)
    assert killed.done_chunks() and len(killed.done_chunks()) == 3
    assert killed.manifest["ended"] is None and not killed.complete
    kept = {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in killed.part_paths()}

    listing = cli("results", "list", "--out", str(tmp_path))
    assert listing.returncode == 0 and " partial " in listing.stdout

    proc = cli("sweep", "run", str(spec_file), "--out", str(tmp_path), "--ray-address",
               ray_head, "--resume", run_dir.name, "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(proc.stdout)
    assert doc["run_dir"] == str(run_dir)
    assert doc["chunks_run"] == killed.n_chunks - 3
    resumed = store.open_run(run_dir)
    assert resumed.complete and len(resumed.manifest["attempts"]) == 2
    # completed chunks were not recomputed: their parts are the same files
    assert {n: (p.stat().st_ino, p.stat().st_mtime_ns)
            for n, p in ((p.name, p) for p in resumed.part_paths()) if n in kept} == kept
    got = resumed.collect()
    want = store.open_run(full_run["run_dir"]).collect()
    assert got.height == want.height == doc["rows"]
    assert got.equals(want)
    assert got.select(list(sweep_spec.parse(SPEC).axis_names)).is_duplicated().sum() == 0


def test_unreachable_address_is_one_error_line(tmp_path, spec_file):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = cli("sweep", "run", str(spec_file), "--out", str(tmp_path), "--ray-address",
               f"127.0.0.1:{port}", timeout=180)
    assert proc.returncode == 2, proc.stderr[-2000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("slabtune: error: --ray-address: cannot connect to 127.0.0.1:")
    assert "Traceback" not in proc.stderr

"""Shared fixtures.  Ray is imported only inside the Ray fixtures, so test modules that do
not use them pay nothing.

* ``ray_local``: one in-process Ray instance for the whole test session (ray.init takes
  about 5 s and 870 MB), with usage stats and token auth off and a temp dir of its own.
* ``ray_head``: a separate head started with ``ray start --head --block`` on 127.0.0.1 in a
  process group and temp dir of its own; it is ended by signalling that process group and
  any process still naming its temp dir.  Never ``ray stop`` (that stops every Ray on the
  machine, other people's included).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

VENV_BIN = Path(sys.executable).parent
RAY_ENV = {"RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def ray_local():
    """An in-process local Ray instance, shared by the session; yields its temp dir."""
    import ray

    for k, v in RAY_ENV.items():
        os.environ.setdefault(k, v)
    if ray.is_initialized():
        yield None
        return
    tmp = tempfile.mkdtemp(prefix="slt-rl-", dir="/tmp")
    ray.init(num_cpus=2, _temp_dir=tmp, include_dashboard=False, log_to_driver=False,
             configure_logging=False)
    try:
        yield tmp
    finally:
        ray.shutdown()
        shutil.rmtree(tmp, ignore_errors=True)


def _pids_naming(text: str) -> list[int]:
    """Processes whose command line contains ``text`` (our own temp dir)."""
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == os.getpid():
            continue
        try:
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in cmd:
            out.append(int(d.name))
    return out


def end_ray_process(proc, log, tmp: str) -> None:
    """End a ``ray start --block`` process: signal its process group, then anything still
    naming its temp dir ``tmp`` (never ``ray stop``); close its log."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    for _ in range(20):
        left = _pids_naming(tmp)
        if not left:
            break
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.25)
    log.close()


@pytest.fixture(scope="session")
def ray_head():
    """A Ray head on 127.0.0.1 (1 CPU) in its own process group; yields "127.0.0.1:PORT"."""
    tmp = tempfile.mkdtemp(prefix="slt-rh-", dir="/tmp")
    port = _free_port()
    env = {**os.environ, **RAY_ENV}
    env.pop("RAY_ADDRESS", None)
    cmd = [str(VENV_BIN / "ray"), "start", "--head", "--block", "--port", str(port),
           "--num-cpus", "1", "--temp-dir", tmp, "--node-ip-address", "127.0.0.1",
           "--include-dashboard=false", "--disable-usage-stats"]
    log = open(Path(tmp) / "ray-start.log", "w+")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                            start_new_session=True)
    address = f"127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            log.seek(0)
            text = log.read()
            if "Ray runtime started" in text:
                break
            if proc.poll() is not None:
                pytest.fail(f"ray start exited with {proc.returncode}:\n{text[-2000:]}")
            if time.monotonic() > deadline:
                pytest.fail(f"ray start did not come up in 90 s:\n{text[-2000:]}")
            time.sleep(0.25)
        yield address
    finally:
        end_ray_process(proc, log, tmp)
        shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture(scope="session")
def reproduce_rows():
    """One in-process run of ``slabtune reproduce --json`` (the packaged cost table, default
    work mode), as the JSON rows it prints; shared by the SLUB and SLAB reproduce tests."""
    import contextlib
    import io
    import json

    from slabtune import cli

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert cli.main(["reproduce", "--json"]) == 0
    return json.loads(buf.getvalue())


#: Memory mappings above which the suite's process drops JAX's compiled programs after a
#: test module (:func:`_maps_guard`).
MAPS_CLEAR = 30000


@pytest.fixture(scope="module", autouse=True)
def _maps_guard(request):
    """After each test module: when this process holds more than :data:`MAPS_CLEAR` memory
    mappings (lines of /proc/self/maps), ``jax.clear_caches()``.  Each compiled dynamics
    program holds ~500-1,150 mappings for the process's life and vm.max_map_count is
    65,530 (issue 35); programs of distinct batch shapes and forms still add up over the
    suite's one process.  Measured (tests/soak_mappings.py): clearing left 556 of 5,540.
    Below the threshold nothing is dropped, so modules keep sharing compiled programs.
    With ``SLABTUNE_MAPS_LOG=FILE``, append ``MODULE MAPPINGS [cleared N]`` to FILE."""
    yield
    with open("/proc/self/maps") as f:
        n = sum(1 for _ in f)
    line = f"{request.module.__name__} {n}"
    if n > MAPS_CLEAR and "jax" in sys.modules:
        sys.modules["jax"].clear_caches()
        with open("/proc/self/maps") as f:
            line += f" cleared {sum(1 for _ in f)}"
    path = os.environ.get("SLABTUNE_MAPS_LOG")
    if path:
        with open(path, "a") as out:
            out.write(line + "\n")

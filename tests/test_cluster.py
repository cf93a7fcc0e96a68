"""Ray commands on a real two-node cluster, run from a directory neither node started in.

The fixture ``cluster`` starts a head (``ray start --head --block``, its dashboard on
127.0.0.1 for Ray's state API) from one temporary directory and a second node (``ray start
--address``) from another, each in a process group and temp dir of its own, each with one
CPU; the commands run through the real CLI in subprocesses whose working directory is a
third.  A Ray worker starts in the directory its node was started from, so a relative run
directory or storage path would be the wrong one there.  Where the tasks ran is read back
from Ray's state API (``ray.util.state``), which needs ``ray[default]`` (the ``cluster``
extra).  Never ``ray stop``: it stops every Ray on the machine.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import polars as pl
import pytest
from conftest import RAY_ENV, VENV_BIN, _free_port, end_ray_process

from slabtune import __version__
from slabtune.results import store
from slabtune.sweeps import grid
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
profile = ["v5.10", "v6.18"]
"""


def _start(cmd: list[str], cwd: Path, tmp: str, ready: str = "Ray runtime started"):
    """``ray start ... --block`` in its own process group; returns (process, log)."""
    env = {**os.environ, **RAY_ENV}
    env.pop("RAY_ADDRESS", None)
    log = open(Path(tmp) / "ray-start.log", "w+")
    proc = subprocess.Popen(cmd, cwd=cwd, stdout=log, stderr=subprocess.STDOUT, env=env,
                            start_new_session=True)
    deadline = time.monotonic() + 120
    while True:
        log.seek(0)
        text = log.read()
        if ready in text:
            return proc, log
        if proc.poll() is not None:
            pytest.fail(f"{cmd[:3]} exited with {proc.returncode}:\n{text[-2000:]}")
        if time.monotonic() > deadline:
            pytest.fail(f"{cmd[:3]} did not come up in 120 s:\n{text[-2000:]}")
        time.sleep(0.25)


#: Run in a private mount namespace: hide argv[1] under an empty tmpfs, then exec the rest.
_MASK = ("import os, subprocess, sys; subprocess.run(['mount', '-t', 'tmpfs', 'slt-mask', "
         "sys.argv[1]], check=True); os.execvp(sys.argv[2], sys.argv[2:])")


def _can_mask(path: Path) -> bool:
    """Whether this machine lets us mount over ``path`` in a private mount namespace
    (root, and unshare installed): the second node then plays a machine that does not
    share the commands' directory."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return False
    probe = subprocess.run(["unshare", "-m", "--propagation", "private", sys.executable,
                            "-c", _MASK, str(path), "true"], capture_output=True)
    return probe.returncode == 0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """``{"address", "dashboard", "cwd", "masked", "shared"}``: a head and a second node on
    127.0.0.1, started from two directories; ``cwd`` is a third, for the commands.  Where
    the machine allows it (``masked``), the second node sees an empty directory at ``cwd``,
    as a machine without a shared file system would; both see ``shared``."""
    pytest.importorskip("ray.dashboard", reason="the state API needs ray[default]")
    head_dir = tmp_path_factory.mktemp("head-cwd")
    node_dir = tmp_path_factory.mktemp("node-cwd")
    cwd = tmp_path_factory.mktemp("user-cwd")
    tmps = [tempfile.mkdtemp(prefix="slt-ch-", dir="/tmp"),
            tempfile.mkdtemp(prefix="slt-cn-", dir="/tmp")]
    port, dash = _free_port(), _free_port()
    ray = str(VENV_BIN / "ray")
    common = ["--block", "--num-cpus", "1", "--node-ip-address", "127.0.0.1",
              "--disable-usage-stats", "--resources", '{"uml": 1, "qemu": 1}']
    started = []
    try:
        started.append(_start([ray, "start", "--head", "--port", str(port), "--temp-dir",
                               tmps[0], "--dashboard-host", "127.0.0.1", "--dashboard-port",
                               str(dash), "--ray-client-server-port", str(_free_port()),
                               "--dashboard-agent-listen-port", str(_free_port()), *common],
                              head_dir, tmps[0]) + (tmps[0],))
        node = [ray, "start", "--address", f"127.0.0.1:{port}", "--temp-dir", tmps[1],
                "--dashboard-agent-listen-port", str(_free_port()), *common]
        masked = _can_mask(cwd)
        if masked:      # this node sees an empty file system at the commands' directory
            node = ["unshare", "-m", "--propagation", "private", sys.executable, "-c",
                    _MASK, str(cwd), *node]
        started.append(_start(node, node_dir, tmps[1]) + (tmps[1],))
        shared = tmp_path_factory.mktemp("shared")
        yield {"address": f"127.0.0.1:{port}", "dashboard": f"http://127.0.0.1:{dash}",
               "cwd": cwd, "dirs": (head_dir, node_dir), "masked": masked, "shared": shared}
    finally:
        for proc, log, tmp in reversed(started):
            end_ray_process(proc, log, tmp)
        for tmp in tmps:
            shutil.rmtree(tmp, ignore_errors=True)


def cli(cluster, *args, env_extra=None, timeout=600):
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env.update(RAY_ENV)
    env.update(env_extra or {})
    return subprocess.run([sys.executable, "-m", "slabtune", *args], capture_output=True,
                          text=True, timeout=timeout, env=env, cwd=cluster["cwd"])


def where_tasks_ran(cluster, name: str, driver_pid: int) -> dict:
    """``{node_id: finished tasks}`` of the tasks called ``name`` of the job whose driver
    had ``driver_pid``, and that job's runtime_env, from Ray's state API."""
    from ray.util.state import list_jobs, list_tasks

    addr = cluster["dashboard"]
    job = [j for j in list_jobs(address=addr, detail=True)
           if j.driver_info is not None and int(j.driver_info.pid) == driver_pid]
    assert len(job) == 1, [(j.job_id, j.driver_info) for j in list_jobs(address=addr)]
    deadline = time.monotonic() + 60       # task events reach the state API in batches
    while True:
        tasks = list_tasks(address=addr, filters=[("job_id", "=", job[0].job_id),
                                                  ("name", "=", name)], limit=10_000)
        if tasks and all(t.state == "FINISHED" for t in tasks) or time.monotonic() > deadline:
            break
        time.sleep(1)
    nodes: dict = {}
    for t in tasks:
        assert t.state == "FINISHED", (t.name, t.state)
        nodes[t.node_id] = nodes.get(t.node_id, 0) + 1
    return {"nodes": nodes, "runtime_env": job[0].runtime_env or {}}


def _run_with_pid(cluster, *args, env_extra=None):
    """Run the CLI like :func:`cli`, returning the process result and the driver's pid."""
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env.update(RAY_ENV)
    env.update(env_extra or {})
    proc = subprocess.Popen([sys.executable, "-m", "slabtune", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, cwd=cluster["cwd"])
    out, err = proc.communicate(timeout=600)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err), proc.pid


def test_sweep_from_a_third_directory_runs_on_both_nodes(cluster):
    """The default --out (runs) is this directory's; chunks ran on both nodes; where a node
    does not see the directory (``masked``) every task sent its rows back and the driver
    wrote the parts, else the workers wrote them; the SLABTUNE_* settings reached the job's
    runtime_env, a relative cache path made absolute."""
    cwd = cluster["cwd"]
    (cwd / "cluster.toml").write_text(SPEC)
    proc, pid = _run_with_pid(cluster, "sweep", "run", "cluster.toml", "--ray-address",
                              cluster["address"], "--json",
                              env_extra={"SLABTUNE_JAX_CACHE": "jaxc",
                                         "SLABTUNE_MAX_CHUNKS": "1000"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(proc.stdout)
    run_dir = Path(doc["run_dir"])
    assert run_dir.is_absolute() and run_dir.parent == cwd / "runs"
    run = store.open_run(run_dir)
    spec = sweep_spec.parse(SPEC)
    assert run.complete and doc["rows"] == grid.count_rows(spec) == run.collect().height
    assert run.manifest["attempts"][-1]["workers_write_parts"] is (not cluster["masked"])
    seen = where_tasks_ran(cluster, "chunk_task", pid)
    assert sum(seen["nodes"].values()) == grid.n_chunks(spec)
    assert len(seen["nodes"]) == 2, seen
    env_vars = seen["runtime_env"]["env_vars"]
    assert env_vars["SLABTUNE_JAX_CACHE"] == str(cwd / "jaxc")
    assert env_vars["SLABTUNE_MAX_CHUNKS"] == "1000"
    for d in cluster["dirs"]:           # nothing went where a node was started
        assert not (d / "runs").exists() and not (d / "jaxc").exists()


def test_tune_workers_share_one_storage_without_repeats(cluster):
    """tune --workers 2 on the cluster, a relative journal path into the directory both
    nodes see: both workers on it (one per node, one CPU each), each with its own seed,
    every trial stored once and counted."""
    rel = f"../{cluster['shared'].name}/w2.log"
    proc, pid = _run_with_pid(cluster, "tune", "tune_quick", "--trials", "200", "--batch",
                              "25", "--workers", "2", "--ray-address", cluster["address"],
                              "--study", "w2", "--storage", f"journal:{rel}", "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(proc.stdout)
    assert doc["storage"] == f"journal:{cluster['shared'] / 'w2.log'}"
    assert doc["added"] == doc["trials"] == 200
    reps = doc["workers"]
    assert [r["added"] for r in reps] == [100, 100]
    assert doc["duplicates"] == sum(r["duplicates"] for r in reps)
    assert len({r["seed"] for r in reps}) == 2 and len({r["node"] for r in reps}) == 2
    import optuna

    study = optuna.load_study(study_name="w2", storage=optuna.storages.JournalStorage(
        optuna.storages.journal.JournalFileBackend(str(cluster["shared"] / "w2.log"))))
    trials = study.get_trials(deepcopy=False)
    keys = [tuple(sorted(t.params.items())) for t in trials]
    assert len(trials) == 200 and len(set(keys)) == 200
    assert sorted(t.number for t in trials) == list(range(200))
    seen = where_tasks_ran(cluster, "worker_task", pid)
    assert sorted(seen["nodes"].values()) == [1, 1]


def test_tune_workers_refuse_a_storage_a_node_does_not_see(cluster):
    """A SQLite file in the commands' directory, which the second node does not see: one
    line naming the node and the directory, before any worker starts."""
    if not cluster["masked"]:
        pytest.skip("this machine cannot hide a directory from one node (needs root and "
                    "unshare)")
    proc = cli(cluster, "tune", "tune_quick", "--trials", "20", "--workers", "2",
               "--ray-address", cluster["address"], "--study", "blind", "--storage",
               "sqlite:///blind.db")
    assert proc.returncode == 2, proc.stderr[-3000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith(f"slabtune: error: --storage: sqlite:///{cluster['cwd']}/blind.db: "
                           "1 Ray node(s) (first: "), last
    assert f"do not see {cluster['cwd']}; give a storage every node reaches" in last
    assert "Traceback" not in proc.stderr
    import optuna

    stored = optuna.load_study(study_name="blind",
                               storage=f"sqlite:///{cluster['cwd'] / 'blind.db'}")
    assert stored.trials == []


def test_main_from_a_third_directory(cluster):
    """slabtune main --ray-address: its sweep's chunks ran on the cluster's nodes, and every
    file it lists is under this directory's runs/."""
    proc, pid = _run_with_pid(cluster, "main", "--ray-address", cluster["address"],
                              "--trials", "64")
    assert proc.returncode in (0, 1), proc.stderr[-3000:]   # 1: this host's kernel differs
    listed = [ln.split(": ", 1)[1] for ln in proc.stdout.split("wrote:\n", 1)[1].splitlines()
              if ": " in ln]
    assert listed and all((cluster["cwd"] / p).resolve().is_relative_to(cluster["cwd"] / "runs")
                          for p in listed), listed
    seen = where_tasks_ran(cluster, "chunk_task", pid)
    assert len(seen["nodes"]) == 2, seen


def test_validate_host_and_uml_from_a_third_directory(cluster):
    """validate (host and uml targets) on the cluster from a third directory: the run
    directory under it, the host task and the UML round as Ray tasks of the job."""
    from slabtune.validate.uml import uml_available

    if uml_available() is not None:
        pytest.skip(uml_available())
    cwd = cluster["cwd"]
    (cwd / "cand.toml").write_text('[[candidate]]\nid = "a"\nboot = { slub_min_objects = 16 }\n')
    proc, pid = _run_with_pid(cluster, "validate", "--candidate", "cand.toml", "--topologies",
                              "validate_quick", "--target", "host,uml", "--uml-runs", "1",
                              "--uml-ops", "2000", "--ray-address", cluster["address"],
                              "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(proc.stdout)
    run_dir = Path(doc["run_dir"])
    assert run_dir.parent == cwd / "runs"
    run = store.open_run(run_dir)
    assert run.complete and run.manifest["attempts"][-1]["ray"]["mode"] == "cluster"
    assert doc["failed"] == 0
    assert sum(where_tasks_ran(cluster, "run_task", pid)["nodes"].values()) == 1   # host
    assert sum(where_tasks_ran(cluster, "run_round", pid)["nodes"].values()) == 1  # uml


def test_a_node_with_another_slabtune_stops_the_command_in_one_line(tmp_path):
    """A head whose workers import another slabtune (PYTHONPATH puts a stub of version
    0.0.0 first): the sweep stops before its first chunk with one line naming the node,
    both versions and what to install."""
    stub = tmp_path / "stub" / "slabtune"
    stub.mkdir(parents=True)
    (stub / "__init__.py").write_text('__version__ = "0.0.0"\n')
    tmp = tempfile.mkdtemp(prefix="slt-cb-", dir="/tmp")
    port = _free_port()
    env_before = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = str(stub.parent)      # inherited by the head's raylet only
    try:
        proc, log = _start([str(VENV_BIN / "ray"), "start", "--head", "--block", "--port",
                            str(port), "--num-cpus", "1", "--temp-dir", tmp,
                            "--node-ip-address", "127.0.0.1", "--include-dashboard=false",
                            "--disable-usage-stats", "--ray-client-server-port",
                            str(_free_port())], tmp_path, tmp)
    finally:
        if env_before is None:
            os.environ.pop("PYTHONPATH")
        else:
            os.environ["PYTHONPATH"] = env_before
    try:
        (tmp_path / "cluster.toml").write_text(SPEC)
        env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
        env.update(RAY_ENV)
        res = subprocess.run([sys.executable, "-m", "slabtune", "sweep", "run", "cluster.toml",
                              "--ray-address", f"127.0.0.1:{port}", "--out", "runs"],
                             cwd=tmp_path, env=env, capture_output=True, text=True,
                             timeout=300)
    finally:
        end_ray_process(proc, log, tmp)
        shutil.rmtree(tmp, ignore_errors=True)
    assert res.returncode == 2, res.stderr[-3000:]
    last = res.stderr.strip().splitlines()[-1]
    assert last.startswith("slabtune: error: --ray-address: "), last
    assert last.endswith(f") runs slabtune 0.0.0, this driver {__version__}; install the "
                         "same one there"), last
    assert "(node " in last
    assert "Traceback" not in res.stderr
    (run_dir,) = (tmp_path / "runs").iterdir()
    assert not store.open_run(run_dir).done_chunks()


def test_lab_run_from_a_third_directory(cluster):
    """lab run of one config on two kernels: one boot per node (each offers one qemu), the
    run directory under this directory, both boots measured."""
    from slabtune.validate.lab import lab_available

    if lab_available() is not None:
        pytest.skip(lab_available())
    config = Path(__file__).resolve().parent.parent / "examples" / "lab" / "local-4cpu-ml.toml"
    proc, pid = _run_with_pid(cluster, "lab", "run", str(config), "--kernel", "7.2",
                              "--kernel", "6.12", "--ray-address", cluster["address"],
                              "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(proc.stdout)
    assert Path(doc["run_dir"]).parent == cluster["cwd"] / "runs"
    assert [(r["kernel"], r["ok"]) for r in doc["records"]] == [("7.2", True), ("6.12", True)]
    assert sorted(where_tasks_ran(cluster, "run_boot", pid)["nodes"].values()) == [1, 1]


#: One 1-CPU topology, one boot per pair, a short hackbench: the smallest guest validation
#: the spec accepts that still drives skbuff_head_cache (boots run under TCG here).
GUEST_SPEC = """
[validate]
timeout_s = 900
retries = 1
boots = 1
memory_mib = 384

[[validate.workload]]
mode = "hackbench"
groups = 1
fds = 2
loops = 20

[fleet]
profile = "v6.18"

[[fleet.topology]]
name = "up-1"
cpus = 1

[[fleet.workload]]
name = "hackbench-socket"
foreign_free = 0.5
[fleet.workload.caches]
skbuff_head_cache = { live_per_cpu = 64, ops = 1.0 }
"kmalloc-512" = { live_per_cpu = 64, ops = 1.0 }
"""


def _cache_copy(where: Path) -> Path:
    """A slabtune cache at ``where`` whose entries link to this user's (the built kernels,
    busybox, the workload binary), for a ``SLABTUNE_CACHE`` only some nodes see."""
    from slabtune.native import cache_dir

    real = cache_dir()
    where.mkdir(exist_ok=True)
    for entry in real.iterdir():
        if not (where / entry.name).exists():
            (where / entry.name).symlink_to(entry)
    return where


@pytest.mark.guest
def test_validate_guest_refuses_a_node_without_the_cache(cluster):
    """SLABTUNE_CACHE in the commands' directory, which the second node does not see: one
    line naming that node, its cache and the missing kernel, before any guest boots and
    before the run directory is made."""
    from slabtune.validate.plan import guest_available

    if guest_available() is not None:
        pytest.skip(guest_available())
    if not cluster["masked"]:
        pytest.skip("this machine cannot hide a directory from one node (needs root and "
                    "unshare)")
    from ray.util.state import list_nodes

    cwd = cluster["cwd"]
    (cwd / "guest.toml").write_text(GUEST_SPEC)
    (cwd / "cand.toml").write_text('[[candidate]]\nid = "order1"\n'
                                   'boot = { slub_max_order = 1 }\n')
    cache = _cache_copy(cwd / "blind-cache")
    proc = cli(cluster, "validate", "--candidate", "cand.toml", "--topologies", "guest.toml",
               "--target", "guest", "--ray-address", cluster["address"], "--out", "blind-runs",
               env_extra={"SLABTUNE_CACHE": str(cache)})
    assert proc.returncode == 2, proc.stderr[-3000:]
    last = proc.stderr.strip().splitlines()[-1]
    (other,) = [n for n in list_nodes(address=cluster["dashboard"]) if not n.is_head_node]
    assert last.startswith("slabtune: error: --target guest: 1 Ray node(s) (first: "), last
    assert f", node {other.node_id[:8]}, cache {cache}) cannot boot a guest: kernel: not " \
           "found; run scripts/install-guest-deps.sh" in last, last
    assert "Traceback" not in proc.stderr
    assert not (cwd / "blind-runs").exists()


@pytest.mark.guest
def test_validate_guest_from_a_third_directory(cluster):
    """validate --target guest of one candidate (and the baseline, always validated) on a
    1-CPU guest, from a third directory: two boots as run_task tasks of the job on the
    cluster's nodes (each node offers one qemu), both rows back in the run directory under
    this directory, the candidate's slub_max_order=1 measured in the guest's caches."""
    from slabtune.validate.plan import guest_available
    from slabtune.validate.schema import MEMORY_FIELD, STRUCTURAL_FIELDS

    if guest_available() is not None:
        pytest.skip(guest_available())
    cwd = cluster["cwd"]
    (cwd / "guest.toml").write_text(GUEST_SPEC)
    (cwd / "cand.toml").write_text('[[candidate]]\nid = "order1"\n'
                                   'boot = { slub_max_order = 1 }\n')
    cache = _cache_copy(cluster["shared"] / "cache")      # every node sees this one
    t0 = time.monotonic()
    proc, pid = _run_with_pid(cluster, "validate", "--candidate", "cand.toml", "--topologies",
                              "guest.toml", "--target", "guest", "--ray-address",
                              cluster["address"], "--json",
                              env_extra={"SLABTUNE_CACHE": str(cache)})
    wall = time.monotonic() - t0
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(proc.stdout)
    run_dir = Path(doc["run_dir"])
    assert run_dir.parent == cwd / "runs"
    run = store.open_run(run_dir)
    assert run.complete and run.manifest["attempts"][-1]["ray"]["mode"] == "cluster"
    assert doc["tasks"] == 2 and doc["failed"] == 0, doc
    assert run.manifest["spec"]["guest_kernel"] == str((cache / "bzImage").resolve())
    seen = where_tasks_ran(cluster, "run_task", pid)
    assert sum(seen["nodes"].values()) == 2, seen
    assert seen["runtime_env"]["env_vars"]["SLABTUNE_CACHE"] == str(cache)
    assert sum(where_tasks_ran(cluster, "guest_node_check", pid)["nodes"].values()) == 2
    rows = run.collect()
    assert set(rows["target"]) == {"guest"} and set(rows["status"]) == {"ok"}
    assert set(rows["topology"]) == {"up-1"}
    assert set(rows["candidate"]) == {"baseline", "order1"}
    assert set(rows["accelerator"]) <= {"tcg", "kvm"}
    for cand, g in rows.group_by("candidate"):
        s = g.filter(pl.col("field").is_in(list(STRUCTURAL_FIELDS)) & pl.col("comparable"))
        assert s.height > 300, cand
        assert s.filter(pl.col("predicted") != pl.col("measured")).is_empty(), cand
    order = rows.filter((pl.col("field") == "order") & pl.col("comparable"))
    assert order.filter(pl.col("candidate") == "order1")["measured"].max() <= 1
    assert order.filter(pl.col("candidate") == "baseline")["measured"].max() >= 2
    assert rows.filter(pl.col("field") == MEMORY_FIELD).height >= 1
    boot_s = rows.group_by("candidate").agg(pl.col("seconds").max())
    print(f"guest validation on the cluster: {wall:.0f} s, boots {boot_s.rows()}, "
          f"nodes {seen['nodes']}")


#: The guest spec with the shortest native timing the spec accepts a rank from: one timed
#: run of 100,000 steps per pair, two calibration runs for the rig table.
NATIVE_SPEC = GUEST_SPEC.replace("memory_mib = 384\n", """memory_mib = 384

[validate.native]
cache = "kmalloc-512"
steps = 2000
timing_steps = 100000
timing_repeats = 1
calibration_runs = 2
""")


def test_validate_native_from_a_third_directory(cluster):
    """validate --target native of one candidate (and the baseline) on one topology from a
    third directory: the model's predictions and the native batch as one Ray task each of
    the job, both pairs' rows back in the run directory under this directory, the
    allocator's fast-path counters equal to the model's."""
    from slabtune.validate.plan import native_available

    if native_available() is not None:
        pytest.skip(native_available())
    cwd = cluster["cwd"]
    (cwd / "native.toml").write_text(NATIVE_SPEC)
    (cwd / "cand.toml").write_text('[[candidate]]\nid = "order1"\n'
                                   'boot = { slub_max_order = 1 }\n')
    t0 = time.monotonic()
    proc, pid = _run_with_pid(cluster, "validate", "--candidate", "cand.toml", "--topologies",
                              "native.toml", "--target", "native", "--ray-address",
                              cluster["address"], "--json")
    wall = time.monotonic() - t0
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(proc.stdout)
    assert Path(doc["run_dir"]).parent == cwd / "runs"
    assert doc["tasks"] == 2 and doc["failed"] == 0, doc
    run = store.open_run(Path(doc["run_dir"]))
    assert run.complete and run.manifest["attempts"][-1]["ray"]["mode"] == "cluster"
    assert sum(where_tasks_ran(cluster, "native_model_task", pid)["nodes"].values()) == 1
    assert sum(where_tasks_ran(cluster, "run_native_batch", pid)["nodes"].values()) == 1
    rows = run.collect()
    assert set(rows["target"]) == {"native"} and set(rows["status"]) == {"ok"}
    assert set(rows["candidate"]) == {"baseline", "order1"}
    pct = rows.filter(pl.col("field").str.ends_with("_fastpath_pct"))
    assert pct.height == 4, pct
    # the model counts in float32: its fraction equals the counters' to float32 rounding
    assert pct["predicted"].to_list() == pytest.approx(pct["measured"].to_list(), rel=1e-6)
    cost = rows.filter(pl.col("field") == "native_cost")
    assert cost.height == 2 and (cost["measured"] > 0).all()
    print(f"native validation on the cluster: {wall:.0f} s")

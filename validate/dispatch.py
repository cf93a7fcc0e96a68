"""Run a validation: plan the tasks, dispatch them as Ray tasks (guests on nodes with qemu, one
native batch after them), store each task's rows atomically as it finishes, resume a run.
"""


from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from slabtune.errors import SlabtuneError
from slabtune.validate.candidates import Candidate, with_baseline
from slabtune.validate.native_tasks import native_model_task, run_native_batch
from slabtune.validate.plan import Task, guest_available, plan_tasks, preflight
from slabtune.validate.schema import MAX_RETRIES, QEMU_RESOURCE, failed_rows, frame
from slabtune.validate.spec import ValidateSpec
from slabtune.validate.tasks import run_task

# --------------------------------------------------------------------------- dispatch


@dataclasses.dataclass(frozen=True)
class ValidateResult:
    run_dir: Path
    tasks: int
    failed: int


def _task_dict(t: Task, spec: ValidateSpec, timeout_s: float | None) -> dict:
    return {"index": t.index, "candidate": t.candidate.to_json(), "topology": t.topology,
            "target": t.target, "spec_text": spec.text, "spec_name": spec.name,
            "timeout_s": timeout_s}


def _guest_options(task: dict, spec: ValidateSpec, use_resource: bool, node_cpus: int) -> dict:
    present = spec.topology(task["topology"]).present
    opts: dict[str, Any] = {"num_cpus": max(1, min(present, node_cpus))}
    if use_resource:
        opts["resources"] = {QEMU_RESOURCE: 1}
    return opts


def local_resources() -> dict[str, float]:
    """Custom resources to declare on a local Ray instance: ``qemu`` (one guest at a time
    per two cores) when qemu and a kernel are installed, ``uml`` (one UML round at a time)
    when the UML kernel is built."""
    from slabtune.validate.uml import UML_RESOURCE, uml_available

    out = {}
    if guest_available() is None:
        out[QEMU_RESOURCE] = float(max(1, (os.cpu_count() or 1) // 2))
    if uml_available() is None:
        out[UML_RESOURCE] = 1.0
    return out


def guest_node_check() -> dict:
    """Runs once on each node that can take a guest (see :func:`check_guest_nodes`): the
    node, its host, its cache directory and why it cannot boot one (the
    :func:`slabtune.kernel.guest.find_assets` call a guest task makes there), or None."""
    import socket

    import ray

    from slabtune.kernel import guest

    try:
        guest.find_assets()
        why = None
    except SlabtuneError as err:
        why = str(err)
    return {"node": ray.get_runtime_context().get_node_id(), "host": socket.gethostname(),
            "cache": str(guest.cache_dir()), "why": why}


def check_guest_nodes() -> None:
    """Fail up front, in one line naming the node, when a node of the cluster that would
    take guest tasks (those offering ``qemu``; every node when none does) cannot boot one:
    no qemu there, or no kernel or busybox in that node's cache (``SLABTUNE_CACHE`` of the
    job's runtime_env, else its user's ``~/.cache/slabtune``).  A guest task would
    otherwise fail on it after its retries, its pair stored as failed."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    nodes = [n for n in ray.nodes() if n.get("Alive")]
    nodes = [n for n in nodes if QEMU_RESOURCE in n.get("Resources", {})] or nodes
    task = ray.remote(max_retries=0)(guest_node_check)
    refs = [task.options(num_cpus=0, scheduling_strategy=NodeAffinitySchedulingStrategy(
                n["NodeID"], soft=False)).remote() for n in nodes]
    try:
        got = ray.get(refs, timeout=300)
    except (ray.exceptions.RayError, TimeoutError) as err:
        raise SlabtuneError(f"--target guest: a node's guest check failed: "
                            f"{ray_error_lines(err)[0]}") from None
    blind = [g for g in got if g["why"] is not None]
    if blind:
        b = blind[0]
        raise SlabtuneError(f"--target guest: {len(blind)} Ray node(s) (first: {b['host']}, "
                            f"node {b['node'][:8]}, cache {b['cache']}) cannot boot a guest: "
                            f"{b['why']}")


def validate(cands: Sequence[Candidate], spec: ValidateSpec, targets: Sequence[str],
             out_dir: str | os.PathLike = "runs", ray_address: str | None = None,
             timeout_s: float | None = None, source: str = "",
             uml_opts: dict | None = None) -> ValidateResult:
    """Run every task on Ray (a local instance unless an address is given, or the instance
    already initialised in this process) and store the rows; see the module docstring.
    ``uml_opts``: the uml target's runs, ops and CPU limit
    (:func:`slabtune.validate.uml.check_options`)."""
    from slabtune.results import store
    from slabtune.sweeps.dispatch import ray_session
    from slabtune.sweeps.runner import git_revision, package_versions

    out_dir = os.path.abspath(out_dir)    # the run directory named the same from any cwd
    cands = with_baseline(cands)
    info = preflight(cands, spec, targets, uml_opts)
    tasks = plan_tasks(cands, spec, targets, info.get("uml_topologies"))
    if not tasks:
        raise SlabtuneError("--target: no task to run (host runs only the baseline)")
    meta = {"name": f"validate-{spec.name}", "evaluator": "validate", "chunk_size": 1,
            "spec_name": spec.name,
            "targets": list(targets), "topologies": [t.name for t in spec.fleet.topologies],
            "candidates": [c.to_json() for c in cands], "source": source,
            "plan": [[t.candidate.id, t.topology, t.target] for t in tasks], **info}
    spec_hash = hashlib.sha256(json.dumps([meta, spec.text], sort_keys=True).encode()).hexdigest()
    # the run directory is made once Ray is up, so a bad --ray-address leaves nothing behind
    with ray_session(ray_address, resources=local_resources()) as sess:
        if sess["mode"] == "cluster" and any(t.target == "guest" for t in tasks):
            check_guest_nodes()
        run = store.create_run(out_dir, spec=meta, spec_hash=spec_hash, spec_text=spec.text,
                               n_chunks=len(tasks), columns=[], versions=package_versions(),
                               git_revision=git_revision(), extra={"kind": "validate"})
        with run.lock():
            run.start_attempt(ray=sess)
            failed = _dispatch(run, tasks, spec, targets, timeout_s)
            run.finish()
    return ValidateResult(run.path, len(tasks), failed)


def resume(ref: str, out_dir: str | os.PathLike = "runs", ray_address: str | None = None,
           timeout_s: float | None = None) -> ValidateResult:
    """Finish an interrupted validation run: its spec, candidates, targets and plan are the
    manifest's; only the tasks not done run (a uml pair also keeps the runs its finished
    rounds stored), so no row is written twice.  ``failed`` counts every failed task of
    the run, the earlier ones included."""
    from slabtune.results import store
    from slabtune.sweeps.dispatch import ray_session
    from slabtune.validate.schema import is_validate_run, task_table
    from slabtune.validate.spec import parse_spec

    run = store.resolve_run(ref, out_dir)
    if not is_validate_run(run):
        raise SlabtuneError(f"--resume: {run.path} is not a validation run")
    meta = run.manifest["spec"]
    name = meta.get("spec_name") or str(meta["name"]).removeprefix("validate-")
    spec = parse_spec(run.manifest["spec_text"], name)
    cands = {c["id"]: Candidate.from_json(c) for c in meta["candidates"]}
    tasks = [Task(i, cands[c], topo, target) for i, (c, topo, target)
             in enumerate(meta["plan"])]
    targets = list(meta["targets"])
    with ray_session(ray_address, resources=local_resources()) as sess:
        if sess["mode"] == "cluster" and any(t.target == "guest" and
                                             run.chunk_state(t.index) != "done" for t in tasks):
            check_guest_nodes()
        with run.lock():
            run.clean_temporaries()
            run.start_attempt(ray=sess, resumed=True)
            _dispatch(run, [t for t in tasks if run.chunk_state(t.index) != "done"], spec,
                      targets, timeout_s)
            run.finish()
    failed = sum(1 for t in task_table(run) if t["status"] == "failed")
    return ValidateResult(run.path, len(tasks), failed)


def ray_error_lines(err) -> tuple[str, list[str]]:
    """The last non-empty line of a Ray error (its class name when it has none), and all
    its non-empty lines (for a console tail)."""
    lines = [ln for ln in str(err).strip().splitlines() if ln.strip()]
    return (lines[-1] if lines else err.__class__.__name__), lines


def ray_failure(err) -> tuple[str, list[str]]:
    """The one-line error of a task Ray gave up on after its retries, and the lines."""
    last, lines = ray_error_lines(err)
    return f"failed after {MAX_RETRIES + 1} attempts: {last}", lines


def model_task(what: str, fn, *args):
    """Run ``fn(*args)`` (a batch of the model's predictions) as one Ray task on one CPU;
    its failure is one SlabtuneError line naming ``what``."""
    import ray

    task = ray.remote(max_retries=MAX_RETRIES, retry_exceptions=[OSError])(fn)
    try:
        return ray.get(task.options(num_cpus=1).remote(*args))
    except ray.exceptions.RayError as err:
        raise SlabtuneError(f"{what}: the model's predictions failed: "
                            f"{ray_error_lines(err)[0]}") from None


def qemu_placement(flag: str, needed: bool) -> tuple[bool, int]:
    """Whether the Ray cluster offers the ``qemu`` resource, and the most CPUs of one live
    node.  A cluster of several nodes without it cannot place boots (``needed``): one error
    line naming ``flag``."""
    import ray

    nodes = [n for n in ray.nodes() if n.get("Alive")]
    node_cpus = int(max((n["Resources"].get("CPU", 1) for n in nodes), default=1))
    use_qemu = QEMU_RESOURCE in ray.cluster_resources()
    if needed and not use_qemu and len(nodes) > 1:
        raise SlabtuneError(f"{flag}: no Ray node offers the {QEMU_RESOURCE!r} resource "
                            "(start workers with --resources='{\"qemu\": 1}')")
    return use_qemu, node_cpus


def _dispatch(run, tasks: Sequence[Task], spec: ValidateSpec, targets: Sequence[str],
              timeout_s: float | None) -> int:
    """Submit every task to the current Ray session, store each as it finishes; returns the
    number of failed tasks."""
    import ray

    failed = 0
    use_qemu, node_cpus = qemu_placement("--target guest/lab",
                                         "guest" in targets or "lab" in targets)
    remote = ray.remote(max_retries=MAX_RETRIES,
                        retry_exceptions=[OSError, subprocess.SubprocessError])(run_task)
    tds = [_task_dict(t, spec, timeout_s) for t in tasks]
    nat = [td for td in tds if td["target"] == "native"]
    if nat:
        filled = model_task("native", native_model_task, nat, spec.text, spec.name)
        for td in nat:
            td.update(filled["pairs"][td["index"]])
    labs = [td for td in tds if td["target"] == "lab"]
    if labs:
        from slabtune.validate.lab import validate_predictions

        kernels = list(run.manifest["spec"].get("lab_kernels") or [])
        preds = model_task("lab", validate_predictions, labs, kernels, spec.text, spec.name)
        for td in labs:
            td["lab_kernels"] = kernels
            td["lab_predicted"] = {str(k): v for k, v in preds[td["index"]].items()}

    umls = [td for td in tds if td["target"] == "uml"]
    if umls:
        from slabtune.validate import uml

        filled_uml = model_task("uml", uml.model_task, umls, spec.text, spec.name)
        for td in umls:
            td["uml"] = filled_uml[td["index"]]

    def store(td: dict, rows: list[dict], **info) -> int:
        bad = any(r["status"] == "failed" for r in rows)
        st = next((r for r in rows if r["status"] == "failed"), None)
        run.write_part(td["index"], frame(rows), status="failed" if bad else "ok",
                       candidate=td["candidate"]["id"], topology=td["topology"],
                       target=td["target"], error=st["error"] if st else None, **info)
        return int(bad)

    refs = {}
    for td in tds:
        if td["target"] in ("native", "uml"):
            continue
        opts = (_guest_options(td, spec, use_qemu, node_cpus)
                if td["target"] in ("guest", "lab") else {"num_cpus": 1})
        refs[remote.options(**opts).remote(td)] = td
    while refs:
        ready, _ = ray.wait(list(refs), num_returns=1)
        for ref in ready:
            td = refs.pop(ref)
            try:
                rows = ray.get(ref)["rows"]
            except ray.exceptions.RayError as err:
                msg, lines = ray_failure(err)
                rows = failed_rows(td, msg, console_tail="\n".join(lines[-20:]))
            failed += store(td, rows)
    if nat:
        # one task for every native pair, once the guests are done: its timing runs take
        # turns (see run_native_batch) and no guest competes with them for the cores
        batch = ray.remote(max_retries=MAX_RETRIES, retry_exceptions=[OSError])(
            run_native_batch).options(num_cpus=max(1, node_cpus))
        try:
            res = ray.get(batch.remote(nat, filled["calibration"], filled["pcp_batch"]))
            got = res["rows"]
            if res["rig"] is not None:
                # the rig table and its calibration, so the report re-derives its figures
                run.manifest["native_rig"] = res["rig"]
        except ray.exceptions.RayError as err:
            msg, lines = ray_failure(err)
            got = {td["index"]: failed_rows(td, msg, console_tail="\n".join(lines[-20:]))
                   for td in nat}
        for td in nat:
            failed += store(td, got[td["index"]])
    if umls:
        # after the guests and the native batch: the UML rounds time the allocator, so
        # nothing else of the run may share the cores with them
        failed += uml.dispatch(run, umls, spec, {"runs": run.manifest["spec"]["uml_runs"],
                                                 "ops": run.manifest["spec"]["uml_ops"]},
                               timeout_s, node_cpus, store)
    return failed

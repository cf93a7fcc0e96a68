"""``tune --workers N [--ray-address ADDR]``: N study writers as Ray tasks on one storage.

Optuna's distributed pattern: every worker opens the same RDB or journal storage, loads the
study by name and adds trials to it; nothing passes between the workers but the storage.
Each worker is a :class:`slabtune.tuner.study.StudyRunner` with a writer nonce of its own,
so it draws from its own seed stream and skips the candidates any writer already stored
(:meth:`StudyRunner.run`).  The driver creates the study (spec, baseline) first, splits the
trials between the workers and adds up what they report.

A worker needs the storage at the same URL as the driver: a relative SQLite or journal path
is made absolute here, and on a cluster every node must see the file (checked up front,
one line); a database server (``postgresql://``) every node reaches needs no shared file
system.  A ``memory:`` study lives in one process and cannot take workers.
"""

from __future__ import annotations

import os
from pathlib import Path

from slabtune.errors import SlabtuneError


def storage_file(url: str) -> Path | None:
    """The file a SQLite or journal storage URL names (as the URL spells it), else None."""
    url = url.strip()
    if url.startswith("journal:"):
        path = url[len("journal:"):]
        return Path(path[2:] if path.startswith("//") else path)
    if "://" not in url and url.endswith((".log", ".journal", ".jsonl")):
        return Path(url)
    if url.startswith("sqlite:///"):
        path = url[len("sqlite:///"):]
        return Path(path) if path not in ("", ":memory:") else None
    return None


def shared_url(url: str) -> str:
    """``url`` as a worker elsewhere must see it: a relative SQLite or journal path made
    absolute from this process's working directory (a worker's is where ``ray start`` ran);
    other URLs unchanged.  An in-memory storage is one line naming ``--workers``."""
    from slabtune.tuner.study import is_in_memory_url, shown_url

    if is_in_memory_url(url):
        raise SlabtuneError(f"--workers: storage {shown_url(url)!r} is in this process's "
                            "memory; give one the workers share (sqlite:///PATH, "
                            "postgresql://..., journal:PATH)")
    path = storage_file(url)
    if path is None or path.is_absolute():
        return url
    path = Path(os.path.abspath(path))
    return f"sqlite:///{path}" if url.strip().startswith("sqlite:") else f"journal:{path}"


def split(n: int, workers: int) -> list[int]:
    """``n`` trials over ``workers``: as even as whole trials allow, the larger shares
    first."""
    return [n // workers + (1 if i < n % workers else 0) for i in range(workers)]


def worker_task(study_name: str, url: str, n_trials: int, batch: int, writer: str) -> dict:
    """One study writer (runs as a Ray task): load the study, add ``n_trials`` trials with
    its own seed stream, and report where it ran and what it added."""
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    import socket

    import optuna
    import ray

    from slabtune.sweeps.evaluators import configure_jax
    from slabtune.tuner import study as studies

    configure_jax()
    storage = studies.open_storage(url, create=False)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.load_study(study_name=study_name, storage=storage)
    runner = studies.StudyRunner(studies.study_spec(study), study, url=url, storage=storage,
                                 writer=writer)
    runner.run(n_trials, batch)
    return {"writer": writer, "seed": runner.seed, "added": runner.added,
            "duplicates": runner.duplicates, "node": ray.get_runtime_context().get_node_id(),
            "host": socket.gethostname(), "pid": os.getpid()}


def run(study_name: str, url: str, n_trials: int, batch: int, workers: int,
        ray_address: str | None = None) -> list[dict]:
    """Run ``workers`` :func:`worker_task` tasks on Ray (a local instance unless an address
    is given or ``RAY_ADDRESS`` is set), ``n_trials`` between them (a worker whose share is
    0 is not started); returns their reports in worker order.  A worker that fails is one
    SlabtuneError line naming it (the trials the others stored stay stored)."""
    import ray

    from slabtune.sweeps.dispatch import device_options, probe_nodes, ray_session
    from slabtune.tuner.study import new_writer_id, shown_url

    if workers < 1:
        raise SlabtuneError(f"--workers: {workers} must be at least 1")
    url = shared_url(url)
    nonce = new_writer_id()
    with ray_session(ray_address) as sess:
        path = storage_file(url)
        if sess["mode"] == "cluster" and path is not None:
            blind = [p for p in probe_nodes(path.parent) if not p["sees"]]
            if blind:
                raise SlabtuneError(
                    f"--storage: {shown_url(url)}: {len(blind)} Ray node(s) (first: "
                    f"{blind[0]['host']}, node {blind[0]['node'][:8]}) do not see "
                    f"{path.parent}; give a storage every node reaches (postgresql://..., "
                    "or a file on a shared file system mounted at the same path)")
        task = ray.remote(max_retries=0)(worker_task).options(
            **device_options(ray.cluster_resources()))
        refs = [task.remote(study_name, url, n, batch, f"{nonce}-{i}")
                for i, n in enumerate(split(n_trials, workers)) if n > 0]
        out = []
        for i, ref in enumerate(refs):
            try:
                out.append(ray.get(ref))
            except ray.exceptions.RayError as err:
                lines = [ln for ln in str(err).strip().splitlines() if ln.strip()]
                if sess["mode"] != "local":   # a local instance ends with its session
                    for r in refs[i + 1:]:
                        ray.cancel(r, force=True)
                raise SlabtuneError(f"--workers: worker {i} failed: "
                                    f"{lines[-1] if lines else err}") from None
    return out

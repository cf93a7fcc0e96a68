"""Ray dispatch of chunks.

By default a sweep starts an in-process local Ray instance (usage stats off, token auth off
for local use, a temp dir of its own, ``num_cpus`` of the machine) and shuts it down at the
end; with an address (``--ray-address`` or ``RAY_ADDRESS``) it connects to that cluster and
leaves it running, passes the driver's SLABTUNE_* settings to its workers (a job-level
``runtime_env``: :func:`worker_env`) and checks that every node runs this slabtune
(:func:`probe_nodes`).  If Ray is already initialised in this process (a test session, a
notebook) that instance is used as is.

Each chunk is one Ray task, retried on failure (``max_retries``; exceptions included); the
driver collects results as they finish, with a bounded number in flight, so memory stays at
a few chunks whatever the grid size.  When every node sees the run directory
(:func:`workers_see`) the tasks write their parts into it and return only their names
(:func:`chunk_task`).  On a cluster with GPUs each task asks for one GPU (Ray hides GPUs
from tasks that do not), unless ``SLABTUNE_DEVICE=cpu``.
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import signal
import socket
import tempfile
import threading
import time
import warnings
from collections.abc import Iterable, Iterator
from typing import Any

from slabtune.errors import SlabtuneError

#: Set to "cpu" to keep chunk tasks off the cluster's GPUs (default "auto": use them).
DEVICE_ENV = "SLABTUNE_DEVICE"
#: Attempts beyond the first for a failing chunk task.
MAX_RETRIES = 3

_SPEC_CACHE: dict[str, Any] = {}
#: Mode of the innermost :func:`ray_session` ("local", "cluster", "existing"; None outside).
_session_mode: list[str] = []


class ChunkFailed(SlabtuneError):
    """A chunk task failed on every attempt; ``index`` names the chunk."""

    def __init__(self, index: int, message: str):
        super().__init__(message)
        self.index = index


def chunk_task(spec_dict: dict, index: int, fail_once_dir: str | None = None,
               part_dir: str | None = None) -> dict:
    """Evaluate chunk ``index`` of a spec; runs inside a Ray worker (or in-process).

    Returns the kept rows' axis columns (int32 values / codes) and the spec's metrics, plus
    where it ran and how long the grid and model steps took.  With ``part_dir`` (a run
    directory this process can write) the task writes the rows there as the chunk's parquet
    part itself and returns only its name, row count and size: a chunk's columns (56 MB for
    2^20 structural rows) then never cross Ray's object store, and the parquet encoding runs
    on every worker instead of in the driver alone.  ``fail_once_dir`` is a test hook: the
    first attempt of each chunk raises after leaving a marker file there, and every attempt
    of chunk ``i`` raises while a file ``always-i`` is there.
    """
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    from slabtune.sweeps import grid
    from slabtune.sweeps.evaluators import EVALUATORS, device_name
    from slabtune.sweeps.spec import from_dict

    key = spec_dict.get("_hash") or repr(spec_dict)
    spec = _SPEC_CACHE.get(key)
    if spec is None:
        spec = _SPEC_CACHE[key] = from_dict(spec_dict)
    if fail_once_dir is not None:
        marker = os.path.join(fail_once_dir, f"failed-{index}")
        if os.path.exists(os.path.join(fail_once_dir, f"always-{index}")):
            raise RuntimeError(f"injected permanent failure of chunk {index} (test hook)")
        if not os.path.exists(marker):
            open(marker, "w").close()
            raise RuntimeError(f"injected failure of chunk {index} (test hook)")
    import jax  # noqa: F401  (the first import in a worker is start-up, not model time)

    t0 = time.perf_counter()
    ch = grid.chunk(spec, index)
    t1 = time.perf_counter()
    metrics = EVALUATORS[spec.evaluator].evaluate(spec, ch)
    t2 = time.perf_counter()
    if ch.keep.all():        # no exclusions here: views, not copies through a mask
        pick = slice(None)
    elif not ch.keep[ch.n_product:].any() and ch.keep[:ch.n_product].all():
        pick = slice(0, ch.n_product)
    else:
        pick = ch.keep
    cols = {name: ch.columns[name][pick] for name in spec.axis_names}
    for m in spec.metrics:
        cols[m] = metrics[m][pick]
    out = {"index": index, "n_product": ch.n_product, "device": device_name(),
           "pid": os.getpid(), "grid_s": t1 - t0, "model_s": t2 - t1}
    if part_dir is None:
        out["columns"] = cols
        return out
    from slabtune.results import store
    from slabtune.sweeps.runner import frame

    df = frame(spec, cols)
    out["part"], out["bytes"] = store.write_part_file(part_dir, index, df)
    out["rows"] = df.height
    out["write_s"] = time.perf_counter() - t2
    return out


@contextlib.contextmanager
def ray_session(address: str | None = None, num_cpus: int | None = None,
                resources: dict | None = None) -> Iterator[dict]:
    """Yield a Ray session description; start or connect as the module docstring says.
    ``resources`` are custom resources a local instance declares (e.g. ``{"qemu": 1}``)."""
    ray = _import_ray_for_driver()
    if ray.is_initialized():
        if address:
            raise SlabtuneError("--ray-address: Ray is already initialised in this process")
        yield {"mode": "existing", "address": None}
        return
    address = address or os.environ.get("RAY_ADDRESS") or None
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    tmp = None
    sigterm = _own_sigterm_handler()
    try:
        if address:
            _probe(address)
            try:
                _init(ray, sigterm, address=address, log_to_driver=False,
                      configure_logging=False, runtime_env={"env_vars": worker_env()})
            except (ConnectionError, RuntimeError, ValueError) as err:
                raise SlabtuneError(f"--ray-address: cannot connect to {address}: "
                                    f"{str(err).splitlines()[0] if str(err) else err}") from None
            info = {"mode": "cluster", "address": address}
            check_workers()
        else:
            _remove_stale_temp_dirs()
            tmp = tempfile.mkdtemp(prefix=f"{_TMP_PREFIX}{os.getpid()}-", dir="/tmp")
            with warnings.catch_warnings():
                # Ray starts its daemons with fork+exec; JAX (already imported by the driver)
                # warns about any fork, but an exec'd child shares none of its threads.
                warnings.filterwarnings("ignore", message=r"os\.fork\(\) was called",
                                        category=RuntimeWarning)
                _init(ray, sigterm, num_cpus=num_cpus or os.cpu_count() or 1, _temp_dir=tmp,
                      resources=dict(resources or {}), include_dashboard=False,
                      log_to_driver=False, configure_logging=False)
            info = {"mode": "local", "address": None}
        _restore_sigterm_handler(sigterm)
        _session_mode.append(info["mode"])
        try:
            yield info
        finally:
            _session_mode.pop()
    finally:
        if ray.is_initialized() or tmp:   # tmp: also a local instance half started
            ray.shutdown()
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)


#: Ray's driver installs a C-level handler for SIGTERM (and fatal signals) that aborts the
#: process, bypassing every ``finally`` (a local Ray would then outlive the driver).  This
#: variable, set while Ray is first imported, keeps it out of the driver only: Ray reads it
#: at import, and its workers (started later, without it) keep their crash reports.
_NO_DRIVER_SIGNAL_HANDLER = "RAY_DISABLE_FAILURE_SIGNAL_HANDLER"


def _import_ray_for_driver():
    """``import ray`` so that the driver keeps Python's signal handling (see
    :data:`_NO_DRIVER_SIGNAL_HANDLER`); a Ray imported earlier is used as it is."""
    import sys

    if "ray" in sys.modules:
        import ray

        return ray
    had = os.environ.get(_NO_DRIVER_SIGNAL_HANDLER)
    os.environ.setdefault(_NO_DRIVER_SIGNAL_HANDLER, "1")
    try:
        import ray
    finally:
        if had is None:
            os.environ.pop(_NO_DRIVER_SIGNAL_HANDLER, None)
    return ray


def _own_sigterm_handler():
    """The process's Python SIGTERM handler (the CLI's, which raises so that this
    function's ``finally`` shuts Ray down), or None when there is none to keep or this is
    not the main thread."""
    if threading.current_thread() is not threading.main_thread():
        return None
    handler = signal.getsignal(signal.SIGTERM)
    return handler if callable(handler) else None


def _init(ray, sigterm, **kwargs) -> None:
    """``ray.init(**kwargs)``.  While it runs, Ray's own SIGTERM handler is in place
    (``sys.exit(15)``); a SIGTERM then is handed to ``sigterm``, the handler ``ray.init``
    displaced, so the command ends as any other SIGTERM ends it."""
    try:
        ray.init(**kwargs)
    except SystemExit as exc:
        if sigterm is not None and exc.code == signal.SIGTERM:
            sigterm(signal.SIGTERM, None)
        raise


def _restore_sigterm_handler(handler) -> None:
    """Put back the handler ``ray.init`` replaced with its own ``sys.exit(15)``, so a SIGTERM
    ends the command as the CLI says (status 143, Ray shut down by the ``finally``)."""
    if handler is not None and signal.getsignal(signal.SIGTERM) is not handler:
        signal.signal(signal.SIGTERM, handler)


_TMP_PREFIX = "slt-ray-"


def _remove_stale_temp_dirs() -> None:
    """Remove local-Ray temp dirs of drivers that died without cleaning up (SIGKILL): their
    names carry the driver's pid, and Ray's own processes share the driver's fate."""
    for d in glob.glob(f"/tmp/{_TMP_PREFIX}*-*"):
        pid = os.path.basename(d)[len(_TMP_PREFIX):].split("-", 1)[0]
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            shutil.rmtree(d, ignore_errors=True)
        except PermissionError:
            continue


def _probe(address: str, timeout: float = 5.0) -> None:
    """Fail fast on a ``host:port`` nobody listens on (ray.init would retry for minutes).
    ``auto`` is first resolved as ray.init resolves it (the last ``ray start``'s address in
    Ray's temp dir, ray_current_cluster, or a running GCS): a stale file naming a cluster
    that is gone made ray.init hang for over 3 minutes."""
    shown = address
    if address == "auto":
        try:
            from ray._private.services import canonicalize_bootstrap_address
        except ImportError:           # another Ray layout: leave it to ray.init
            return
        try:
            resolved = canonicalize_bootstrap_address("auto")
        except (ConnectionError, ValueError) as err:
            raise SlabtuneError(f"--ray-address: auto: {_first_line(err)}") from None
        if not resolved:
            return
        address, shown = resolved, f"auto ({resolved}, from Ray's ray_current_cluster file)"
    if "://" in address or ":" not in address:
        return
    host, _, port = address.rpartition(":")
    try:
        port_no = int(port)
    except ValueError:
        raise SlabtuneError(f"--ray-address: {address!r} is not HOST:PORT") from None
    try:
        with socket.create_connection((host, port_no), timeout=timeout):
            pass
    except OSError as err:
        raise SlabtuneError(f"--ray-address: cannot connect to {shown}: "
                            f"{err.strerror or err}") from None


def _first_line(err: BaseException) -> str:
    return (str(err).strip().splitlines() or [err.__class__.__name__])[0]


#: Signals whose Python handlers :func:`_latched_signals` guards while chunks run.
_LATCHED = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)


@contextlib.contextmanager
def _latched_signals() -> Iterator[Any]:
    """Make a terminating signal's handler stick while the driver waits on chunks.

    A Python signal handler that raises (the CLI's does, to shut a local Ray down) runs at
    whatever bytecode the main thread executes next.  A driver that only waits on Ray and
    commits parts spends much of its Python time in garbage-collector callbacks (JAX
    installs one), and an exception raised there is printed and dropped: the sweep would
    run on to the end.  So each handler is wrapped to note the signal, and the yielded
    ``check()``, called at every step of the wait loop, calls the noted handler again,
    where its exception does propagate.  Handlers are put back on the way out unless the
    handler itself changed them (the CLI's resets its signal to the default action)."""
    latched: list = []
    wrapped: dict = {}
    if threading.current_thread() is threading.main_thread():
        for sig in _LATCHED:
            prev = signal.getsignal(sig)
            if not callable(prev):
                continue

            def note(signum, frame, _prev=prev):
                latched.append((signum, _prev))
                _prev(signum, frame)

            signal.signal(sig, note)
            wrapped[sig] = (note, prev)

    def check() -> None:
        if latched:
            signum, handler = latched[0]
            handler(signum, None)

    try:
        yield check
    finally:
        for sig, (note, prev) in wrapped.items():
            if signal.getsignal(sig) is note:
                signal.signal(sig, prev)


def _remote():
    import ray

    return ray.remote(max_retries=MAX_RETRIES, retry_exceptions=True)(chunk_task)


#: Settings a cluster's workers take from the driver's environment (a job-level Ray
#: ``runtime_env``): every variable whose name starts so (SLABTUNE_CACHE, SLABTUNE_JAX_CACHE,
#: SLABTUNE_DYNAMICS_ENGINE, SLABTUNE_DEVICE, the SLABTUNE_MAX_* limits).
WORKER_ENV_PREFIX = "SLABTUNE_"
#: Of those, the ones naming a directory: a relative one is made absolute from the driver's
#: working directory (a worker's is where ``ray start`` ran).
_PATH_ENV = ("SLABTUNE_CACHE", "SLABTUNE_JAX_CACHE")


def worker_env(environ=None) -> dict[str, str]:
    """The SLABTUNE_* settings of this process, as a cluster's workers are to see them."""
    environ = os.environ if environ is None else environ
    out = {}
    for k, v in environ.items():
        if not k.startswith(WORKER_ENV_PREFIX):
            continue
        if k in _PATH_ENV and v not in ("", "0", "off"):
            v = os.path.abspath(os.path.expanduser(v))
        out[k] = v
    return out


def node_probe(path: str | None, token: str | None) -> dict:
    """Runs once on each node (see :func:`probe_nodes`): the node, its host, the slabtune
    it imports, and whether ``path/.probe-<token>`` holds ``token`` there (the node sees
    the driver's run directory)."""
    import ray

    from slabtune import __version__

    sees = None
    if path is not None:
        try:
            with open(os.path.join(path, f".probe-{token}")) as fh:
                sees = fh.read() == token
        except OSError:
            sees = False
    return {"node": ray.get_runtime_context().get_node_id(), "host": socket.gethostname(),
            "slabtune": __version__, "sees": sees}


def probe_nodes(path: str | os.PathLike | None = None) -> list[dict]:
    """One :func:`node_probe` task pinned to each live node of the current session.  A node
    whose workers cannot import slabtune, or import another version than this driver's,
    is one SlabtuneError line naming the node (the remedy is to install the same slabtune
    there).  With ``path`` (a directory this process can write), each result says whether
    that node sees it."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from slabtune import __version__

    token = None
    if path is not None:
        token = os.urandom(8).hex()
        probe = os.path.join(os.fspath(path), f".probe-{token}")
        with open(probe, "w") as fh:
            fh.write(token)
    task = ray.remote(max_retries=0)(node_probe)
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    try:
        refs = {task.options(num_cpus=0, scheduling_strategy=NodeAffinitySchedulingStrategy(
                    n["NodeID"], soft=False)).remote(
                    None if path is None else os.fspath(path), token): n for n in nodes}
        out = []
        for ref, n in refs.items():
            where = f"{n.get('NodeManagerAddress', '?')} (node {n['NodeID'][:8]})"
            try:
                got = ray.get(ref, timeout=120)
            except (ray.exceptions.RayError, TimeoutError) as err:
                lines = [ln.strip() for ln in str(err).splitlines() if ln.strip()]
                why = lines[-1] if lines else err.__class__.__name__
                raise SlabtuneError(f"--ray-address: the workers of {where} cannot run "
                                    f"slabtune ({why}); install it there (docs/CLUSTER.md)"
                                    ) from None
            if got["slabtune"] != __version__:
                raise SlabtuneError(f"--ray-address: {where} runs slabtune {got['slabtune']}, "
                                    f"this driver {__version__}; install the same one there")
            out.append(got)
        return out
    finally:
        if path is not None:
            with contextlib.suppress(OSError):
                os.unlink(probe)


def check_workers() -> None:
    """Fail up front, in one line, when a node of the cluster cannot run slabtune's tasks
    (:func:`probe_nodes`); a task would otherwise fail on it, after its retries, mid-run."""
    probe_nodes()


def workers_see(path: str | os.PathLike) -> bool:
    """Whether every live node of the current Ray session sees the directory ``path`` (this
    host's, or a shared file system mounted at the same path), so its workers can write
    into the run directory the driver reads.  A local instance always does."""
    if _session_mode and _session_mode[-1] == "local":
        return True
    return all(p["sees"] for p in probe_nodes(path))


def device_options(resources: dict) -> dict:
    """Ray options of a task that runs the JAX model: one whole GPU where the cluster has
    GPUs (Ray hides GPUs from tasks that do not ask for one) unless ``SLABTUNE_DEVICE=cpu``,
    else one CPU."""
    if int(resources.get("GPU", 0)) > 0 and os.environ.get(DEVICE_ENV, "auto") != "cpu":
        return {"num_gpus": 1}
    return {"num_cpus": 1}


def run_chunks(spec_dict: dict, indices: Iterable[int], max_in_flight: int | None = None,
               fail_once_dir: str | None = None, part_dir: str | None = None) -> Iterator[dict]:
    """Run chunk tasks on the current Ray session, yielding results as they finish; with
    ``part_dir`` the tasks write their parts there (see :func:`chunk_task`)."""
    import ray

    resources = ray.cluster_resources()
    opts = device_options(resources)
    task = _remote().options(**opts)
    if max_in_flight is None:
        slots = int(resources.get("GPU", 0)) if "num_gpus" in opts else \
            int(resources.get("CPU", 1))
        max_in_flight = max(2, 2 * slots)
    spec_ref = ray.put(spec_dict)
    it = iter(indices)
    refs: dict = {}

    def submit() -> bool:
        i = next(it, None)
        if i is None:
            return False
        refs[task.remote(spec_ref, i, fail_once_dir, part_dir)] = i
        return True

    for _ in range(max_in_flight):
        if not submit():
            break
    try:
        with _latched_signals() as check:
            while refs:
                check()
                ready, _ = ray.wait(list(refs), num_returns=1)
                check()
                for ref in ready:
                    i = refs.pop(ref)
                    try:
                        res = ray.get(ref)
                    except ray.exceptions.RayError as err:
                        lines = [ln for ln in str(err).strip().splitlines() if ln.strip()]
                        raise ChunkFailed(i, f"chunk {i}: failed after {MAX_RETRIES + 1} "
                                             f"attempts: {lines[-1] if lines else err}") from None
                    submit()
                    yield res
    finally:
        # A local instance is shut down next, which ends its tasks; cancelling them first
        # races with their replies inside Ray (a failed internal check aborts the driver).
        local = bool(_session_mode) and _session_mode[-1] == "local"
        if ray.is_initialized() and not local:
            for ref in refs:
                ray.cancel(ref, force=True)

"""The ``slabtune`` command line: parses arguments, calls the library, prints.

Each command group lives in a module of :mod:`slabtune.commands` that exposes
``register(subparsers)``; the handler it sets as ``func`` returns the exit code.
Errors a user can cause (bad input, unreadable files, impossible topologies) print one line
``slabtune: error: ...`` and exit 2, without a traceback; so does any ``OSError`` that
reaches the top (a full disk, an I/O error, a name too long), naming the path.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import os
import signal
import sys
import threading

from slabtune import __version__
from slabtune.errors import SlabtuneError

#: Command modules under slabtune.commands, in the order --help lists them.
COMMAND_MODULES = (
    "main_job",
    "kernel",
    "guest",
    "sweep",
    "results",
    "tune",
    "pareto",
    "plot",
    "export",
    "validate",
    "lab",
    "calibrate",
    "simulate",
    "reproduce",
)

#: Exceptions from the libraries below the CLI that mean "bad input", not "bug".
_USER_ERRORS = (SlabtuneError, ValueError, FileNotFoundError, PermissionError, IsADirectoryError,
                NotADirectoryError, FileExistsError)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="slabtune",
        description="Sweep, tune and validate Linux SLUB slab policies with a vectorised JAX "
                    "model.",
        epilog="environment: RAY_ADDRESS joins a Ray cluster (as --ray-address does); "
               "SLABTUNE_CACHE holds kernels, guest files and native builds (default "
               "~/.cache/slabtune); SLABTUNE_JAX_CACHE is JAX's persistent compilation "
               "cache directory (default ~/.cache/slabtune/jax; off: none); "
               "SLABTUNE_DYNAMICS_ENGINE=auto|jax|native picks what runs dynamics batches "
               "outside jit (auto: the C engine native/dynsim.c on a CPU backend, the JAX "
               "model on an accelerator; the counters are the same).",
    )
    parser.add_argument("--version", action="version", version=f"slabtune {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(f"slabtune.commands.{name}").register(sub)
    return parser


#: Exit status when the reader of our stdout went away (as if killed by SIGPIPE: 128 + 13).
EXIT_BROKEN_PIPE = 141


def _quiet_stdout() -> None:
    """Point stdout at /dev/null so the interpreter's final flush cannot fail again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


#: Signals that end a command the way Ctrl-C does: the ``finally`` blocks run (a local Ray
#: is shut down, a run's manifest stays consistent), then the exit status is 128 + signal.
TERMINATING_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


class Terminated(KeyboardInterrupt):
    """Raised in the main thread by SIGTERM or SIGHUP (see :data:`TERMINATING_SIGNALS`)."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


#: The terminating signal this process received, if any: code between the handler and
#: :func:`_run` (Ray's blocking calls) may turn :class:`Terminated` into a plain
#: KeyboardInterrupt, so the exit status is decided from this.
_received: list[int] = []


#: True between a collection's "start" and "stop" phases (:func:`_gc_phase`).
_collecting: list[bool] = [False]


def _gc_phase(phase: str, info: dict) -> None:
    """A gc callback that records whether a collection is running: the finalizers
    (``__del__``) and weakref callbacks it runs are places where Python prints and drops
    an exception raised, as it does in gc callbacks."""
    _collecting[0] = phase == "start"


def _in_gc_callback(frame) -> bool:
    """Whether ``frame`` or a caller of it runs a garbage-collector callback (JAX installs
    one), or a collection is running its finalizers, where Python prints and drops any
    exception raised."""
    if _collecting[0]:
        return True
    codes = {getattr(cb, "__code__", None) for cb in gc.callbacks}
    while frame is not None:
        if frame.f_code in codes:
            return True
        frame = frame.f_back
    return False


def _redeliver(signum: int) -> None:
    """Send ``signum`` to this process again unless a handler has taken it since."""
    if not _received:
        os.kill(os.getpid(), signum)


def _terminate(signum, frame) -> None:
    """Turn the signal into :class:`Terminated`; a second one while cleaning up takes the
    default action (ends the process at once).  A signal that lands in a garbage-collector
    callback is delivered again 50 ms later instead: raised there, the exception would be
    printed and dropped and the command would run on to its end; so is one that lands
    while a collection runs finalizers (a ``__del__`` drops it the same way)."""
    if _in_gc_callback(frame):
        threading.Timer(0.05, _redeliver, (signum,)).start()
        return
    signal.signal(signum, signal.SIG_DFL)
    _received.append(signum)
    raise Terminated(signum)


def _install_signal_handlers() -> dict:
    """Handle TERMINATING_SIGNALS in this (main) thread; returns the previous handlers."""
    if threading.current_thread() is not threading.main_thread():
        return {}
    previous = {}
    for sig in TERMINATING_SIGNALS:
        previous[sig] = signal.getsignal(sig)
        signal.signal(sig, _terminate)
    if _gc_phase not in gc.callbacks:
        gc.callbacks.insert(0, _gc_phase)
    return previous


def _restore_signal_handlers(previous: dict) -> None:
    for sig, handler in previous.items():
        if handler is not None:
            signal.signal(sig, handler)
    if previous and _gc_phase in gc.callbacks:
        gc.callbacks.remove(_gc_phase)
        _collecting[0] = False


def _jax_backend_failure() -> str | None:
    """Why JAX cannot start a backend in this process, or None when it can (or was never
    imported): asked again with ``jax.devices()`` after a command failed, since JAX strips
    its own frames from the traceback of the error it raised.  JAX_PLATFORMS naming a
    platform this machine lacks fails so: ``cuda`` without CUDA (an AssertionError in
    xla_bridge.backends, jax 0.4-0.7), an unknown name (RuntimeError "Unable to initialize
    backend")."""
    if "jax" not in sys.modules:
        return None
    try:
        sys.modules["jax"].devices()
    except Exception as err:  # noqa: BLE001 - whatever the backend set-up raises
        return (str(err).strip().splitlines() or ["no backend of that name is installed"])[0]
    return None


def main(argv=None) -> int:
    """Run one command; ``slabtune ... | head`` ends quietly when ``head`` stops reading.
    SIGTERM and SIGHUP end it like Ctrl-C (cleanup runs), with status 128 + signal."""
    _received.clear()
    previous = _install_signal_handlers()
    try:
        return _run(argv)
    except BrokenPipeError:
        _quiet_stdout()
        return EXIT_BROKEN_PIPE
    finally:
        _restore_signal_handlers(previous)


def _run(argv) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except BrokenPipeError:
        raise                                # main(): the reader went away, not an error
    except _USER_ERRORS + (OSError,) as err:
        # OSError: the backstop for a system error no caller turned into its own line
        # (ENOSPC, EIO, ENAMETOOLONG, EROFS...): the path and the system's words, exit 2.
        msg = str(err) or err.__class__.__name__
        if isinstance(err, OSError) and (err.filename or err.strerror):
            where = f"{err.filename}: " if err.filename else ""
            if err.filename2:
                where = f"{err.filename} -> {err.filename2}: "
            msg = f"{where}{err.strerror or msg}"
        print(f"slabtune: error: {msg.splitlines()[0] if msg else msg}", file=sys.stderr)
        return 2
    except (RuntimeError, AssertionError):
        why = _jax_backend_failure()
        if why is None:
            raise
        want = os.environ.get("JAX_PLATFORMS", "")
        print(f"slabtune: error: JAX_PLATFORMS={want!r}: JAX cannot start that backend "
              f"here ({why}); unset it or use JAX_PLATFORMS=cpu", file=sys.stderr)
        return 2
    except KeyboardInterrupt as err:
        signum = err.signum if isinstance(err, Terminated) else \
            (_received[0] if _received else None)
        if signum is None:
            print("slabtune: interrupted", file=sys.stderr)
            return 130
        print(f"slabtune: terminated by {signal.Signals(signum).name}", file=sys.stderr)
        return 128 + signum


if __name__ == "__main__":
    raise SystemExit(main())

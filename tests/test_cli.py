"""The CLI's process-level behaviour: exit codes and streams of the real ``slabtune`` script."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

SLABTUNE = Path(sys.executable).with_name("slabtune")


def _run_into_closed_pipe(*args: str) -> subprocess.CompletedProcess:
    """Run slabtune with stdout on a pipe whose reader is already gone (``| head`` that quit)."""
    r, w = os.pipe()
    os.close(r)
    try:
        return subprocess.run([str(SLABTUNE), *args], stdout=w, stderr=subprocess.PIPE,
                              text=True, timeout=120)
    finally:
        os.close(w)


DATA = Path(__file__).parent / "data"


def test_large_output_into_closed_pipe_ends_quietly_with_sigpipe_status():
    # kernel check --json prints a report of every cache of the snapshot (tens of KiB)
    done = _run_into_closed_pipe("kernel", "check", "--snapshot",
                                 str(DATA / "host_snapshot_6.18.csv"), "--json")
    assert done.returncode == 141
    assert done.stderr == ""


def test_help_into_closed_pipe_is_quiet():
    # argparse swallows the failed write of --help itself; nothing may reach stderr
    done = _run_into_closed_pipe("--help")
    assert done.returncode in (0, 141)
    assert done.stderr == ""


def test_bad_input_still_one_line_and_exit_2():
    done = subprocess.run([str(SLABTUNE), "simulate", "/nonexistent/config.toml"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("slabtune: error: ")
    assert "/nonexistent/config.toml" in lines[0]


def _collect_under_handlers(setup, teardown=lambda: None):
    """Install slabtune's signal handlers, run ``setup()`` (which arranges for a signal to
    land during the next collection), collect, and wait up to 5 s for cli.Terminated.
    Returns (the Terminated raised or None, the exceptions Python dropped as unraisable,
    cli._received)."""
    import gc
    import time

    from slabtune import cli

    dropped = []
    old_hook = sys.unraisablehook
    sys.unraisablehook = dropped.append
    cli._received.clear()
    previous = cli._install_signal_handlers()
    raised = None
    try:
        setup()
        try:
            gc.collect()
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:
                time.sleep(0.01)
        except cli.Terminated as err:
            raised = err
    finally:
        teardown()
        cli._restore_signal_handlers(previous)
        sys.unraisablehook = old_hook
    return raised, dropped, list(cli._received)


def test_a_signal_landing_in_a_gc_callback_is_raised_outside_it():
    """A SIGHUP handled while a garbage-collector callback runs (JAX installs one, and
    Python prints and drops what such a callback raises) is delivered again outside it:
    the command still ends as terminated, and nothing was dropped."""
    import gc
    import signal

    sent = []

    def send_once(phase, info):
        if phase == "start" and not sent:
            sent.append(1)
            os.kill(os.getpid(), signal.SIGHUP)
            sum(range(100))          # bytecode inside the callback: the handler runs here

    raised, dropped, received = _collect_under_handlers(
        lambda: gc.callbacks.append(send_once), lambda: gc.callbacks.remove(send_once))
    assert sent and raised is not None and raised.signum == signal.SIGHUP
    assert received == [signal.SIGHUP]
    assert dropped == []


def test_a_signal_landing_in_a_finalizer_during_a_collection_is_raised_outside_it():
    """A SIGTERM handled while a collection runs a ``__del__`` (Python prints and drops what
    a finalizer raises) is delivered again after the collection: the command still ends as
    terminated, and nothing was dropped."""
    import gc
    import signal

    from slabtune import cli

    sent = []

    class Cycle:
        def __init__(self):
            self.me = self

        def __del__(self):
            if not sent:
                sent.append(1)
                os.kill(os.getpid(), signal.SIGTERM)
                sum(range(100))      # bytecode inside the finalizer: the handler runs here

    raised, dropped, received = _collect_under_handlers(Cycle)
    assert sent and raised is not None and raised.signum == signal.SIGTERM
    assert received == [signal.SIGTERM]
    assert dropped == []
    assert cli._gc_phase not in gc.callbacks

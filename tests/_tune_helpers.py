"""Helpers shared by the tune/pareto/charts/export tests: one quick-spec study per test
process (journal storage in a temp dir, built once) and a CLI runner.

The CLI runner builds the parser from the four command modules these tests exercise, so the
tests do not depend on other command groups being importable."""

from __future__ import annotations

import atexit
import functools
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

QUICK_TRIALS = 320
QUICK_BATCH = 64
CLI_MODULES = ("tune", "pareto", "plot", "export")
_SNIPPET = ("import sys, slabtune.cli as c; c.COMMAND_MODULES = {mods!r}; "
            "raise SystemExit(c.main(sys.argv[1:]))")


@functools.cache
def workdir() -> Path:
    path = Path(tempfile.mkdtemp(prefix="slabtune-tune-tests-"))
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path


@functools.cache
def quick_study():
    """(study, storage_url, runner): QUICK_TRIALS trials of the built-in quick spec."""
    from slabtune.tuner import study

    spec = study.load_spec("tune_quick")
    url = f"journal:{workdir() / 'quick.log'}"
    runner, url = study.create_or_resume(spec, "quick", url)
    runner.run(QUICK_TRIALS, QUICK_BATCH)
    return runner.study, url, runner


def run_cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """Run ``slabtune ARGS`` in a fresh interpreter; JAX compilations are cached on disk
    between these runs."""
    env = dict(os.environ)
    env.setdefault("JAX_COMPILATION_CACHE_DIR", str(workdir() / "jax-cache"))
    return subprocess.run(
        [sys.executable, "-c", _SNIPPET.format(mods=CLI_MODULES), *args],
        cwd=str(cwd or workdir()), env=env, capture_output=True, text=True, timeout=600)


def assert_clean_error(proc: subprocess.CompletedProcess, *needles: str) -> None:
    """A user error: exit 2, one stderr line starting 'slabtune: error:', no traceback."""
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("slabtune: error: "), lines[0]
    assert "Traceback" not in proc.stderr
    for n in needles:
        assert n in lines[0], (n, lines[0])


#: A one-machine v6.18 fleet whose spec opts in to kernel-change knobs ([search] reach =
#: "kernel"): the reach tests of pareto and export.
KERNEL_SPEC = """
[fleet]
profile = "v6.18"
[[fleet.topology]]
name = "laptop-8"
cpus = 8
[[fleet.workload]]
[fleet.workload.caches]
dentry = { live_per_cpu = 4096 }
"kmalloc-64" = { live_per_cpu = 2048 }
[search]
reach = "kernel"
[search.knobs]
slub_min_objects = { choices = [0, 16] }
order_objects_mul = { low = 1, high = 8 }
"""

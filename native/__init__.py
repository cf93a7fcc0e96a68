"""The C sources slabtune compiles on first use: ``workload.c`` (the static guest workload),
``slubsim.c`` (the userspace allocator) and ``dynsim.c`` (the dynamics model played event by
event, :mod:`slabtune.sweeps.dynsim`).  They ship as package data, so an install from
a wheel finds them as well as a source checkout does; binaries go to the user cache
(:func:`build_dir`), never beside the sources, which may be read-only."""

from __future__ import annotations

import os
from importlib import resources
from pathlib import Path


def cache_dir() -> Path:
    """slabtune's cache: ``$SLABTUNE_CACHE``, else ``~/.cache/slabtune`` (guest kernels,
    busybox, compiled native binaries)."""
    env = os.environ.get("SLABTUNE_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "slabtune"


def source(name: str) -> Path:
    """The path of the packaged C source ``name`` (``workload.c``, ``slubsim.c``,
    ``dynsim.c``)."""
    return Path(str(resources.files(__name__).joinpath(name)))


def build_dir() -> Path:
    """Where compiled native binaries go: ``<cache_dir>/build``."""
    return cache_dir() / "build"

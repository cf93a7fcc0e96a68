"""The C sources slabtune compiles on first use: ``workload.c`` (the static guest workload),
``slubsim.c`` (the userspace allocator), ``dynsim.c`` and ``slabdyn.c`` (the SLUB and SLAB
dynamics models played event by event, :mod:`slabtune.sweeps.dynsim`).  They ship as
package data, so an install from a wheel finds them as well as a source checkout does;
binaries go to the user cache (:func:`build_dir`), never beside the sources, which may be
read-only."""

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
    ``dynsim.c``, ``slabdyn.c``)."""
    return Path(str(resources.files(__name__).joinpath(name)))


def build_dir() -> Path:
    """Where compiled native binaries go: ``<cache_dir>/build``."""
    return cache_dir() / "build"


class BuildFailed(RuntimeError):
    """gcc is missing or failed; the message is one line (callers wrap it in their own
    error type, which names the step)."""


def one_line(text: str, limit: int = 600) -> str:
    """The end of a tool's stderr as one line (lines joined with ' / ')."""
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return " / ".join(lines)[-limit:] or "(no stderr)"


def compile_cached(src: Path, out: Path, cflags: tuple[str, ...], force: bool = False) -> Path:
    """Compile ``src`` with ``$CC`` (default gcc) and ``cflags`` into ``out`` unless ``out``
    was built from the same source, headers beside it, compiler name and flags (a
    ``.stamp`` file beside ``out`` holds their sha256).  The output is written to a
    temporary name and renamed, so processes building at once (Ray workers) never load a
    half-written file."""
    import hashlib
    import shutil
    import subprocess

    cc = shutil.which(os.environ.get("CC", "gcc")) or shutil.which("gcc")
    if cc is None:
        raise BuildFailed("gcc is not installed")
    h = hashlib.sha256(Path(src).read_bytes())
    for header in sorted(Path(src).parent.glob("*.h")):
        h.update(header.name.encode() + header.read_bytes())
    h.update(" ".join((Path(cc).name,) + tuple(cflags)).encode())
    stamp, want = out.with_suffix(".stamp"), h.hexdigest()
    if not force and out.exists() and stamp.exists() and stamp.read_text() == want:
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f"{out.name}.tmp{os.getpid()}")
    proc = subprocess.run([cc, *cflags, "-o", str(tmp), str(src)], capture_output=True,
                          text=True)
    if proc.returncode != 0:
        tmp.unlink(missing_ok=True)
        raise BuildFailed(f"gcc failed on {Path(src).name}: {one_line(proc.stderr)}")
    os.replace(tmp, out)
    stamp.write_text(want)
    return out

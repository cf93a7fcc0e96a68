"""slabtune's own guest kernels, built from Debian's ``linux-source-X`` packages.

``scripts/build-kernels.sh`` does the work: it downloads a source package with
``apt-get download`` (the machine's apt for Debian 12, a private apt configuration under the
cache for unstable), configures ``make tinyconfig`` plus the fragments of
``kernel/configs/`` (checking that every option stuck), builds out of tree, and writes
``<cache>/kernels/<name>/bzImage`` and ``build.json`` beside it.  The build tree stays, so
modules can be built against it.  A kernel of arch ``um`` (the table's last column) is built
with ``make ARCH=um`` instead: its image is ``<cache>/kernels/<name>/linux``, a User Mode
Linux executable that kernel/uml.py runs as a host process.

This module is the Python side: the table of kernels (``kernel/configs/kernels.tsv``, which
the script reads too), where a built kernel is, whether it is current, and
:func:`ensure_kernel`, which runs the script when a kernel is missing or its inputs changed.

A kernel's inputs are its config fragments, the build script, and its source package and
version; :func:`inputs_hash` hashes them exactly as the script does, and a kernel is current
when the hash stored in its build.json matches.  The configs and the script live in the
source checkout (they are not package data), so building needs one; reading what was built
does not.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import TextIO

from slabtune.errors import SlabtuneError
from slabtune.native import cache_dir

#: The source checkout's kernel configs and build script.
CONFIG_DIR = Path(__file__).resolve().parent / "configs"
BUILD_SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "build-kernels.sh"
#: Version line of the inputs manifest (bump when the manifest's format changes).
_MANIFEST_HEADER = "slabtune-kernel-inputs 1"
#: Seconds allowed for asking apt which version a build would use.
_VERSION_TIMEOUT_S = 300


class KernelBuildError(SlabtuneError):
    """A kernel cannot be found, looked up or built; the message is one line and names the
    build log when there is one."""


@dataclasses.dataclass(frozen=True)
class KernelSpec:
    """One line of kernel/configs/kernels.tsv."""

    name: str
    #: the Debian binary package holding /usr/src/<package>.tar.xz
    package: str
    #: the Debian suite it comes from (the machine's own, or one reached privately)
    suite: str
    #: "slub" or "slab"
    allocator: str
    #: files of kernel/configs/, applied in order on top of tinyconfig
    fragments: tuple[str, ...]
    #: "x86" (a bzImage for qemu) or "um" (a User Mode Linux executable)
    arch: str = "x86"

    @property
    def image(self) -> str:
        """The file name of the built kernel under :func:`kernel_dir`."""
        return IMAGES[self.arch]


#: arch -> the file name a built kernel of that arch has under kernel_dir().
IMAGES = {"x86": "bzImage", "um": "linux"}


def read_table(path: Path | None = None) -> dict[str, KernelSpec]:
    """Parse kernels.tsv (``#`` comments; name, package, suite, allocator, comma-separated
    fragments, and optionally arch, x86 when left out); an absent file gives an empty
    table."""
    path = path or CONFIG_DIR / "kernels.tsv"
    try:
        text = path.read_text()
    except FileNotFoundError:
        return {}
    table: dict[str, KernelSpec] = {}
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        fields = line.split()
        if len(fields) == 5:
            fields.append("x86")
        if len(fields) != 6 or fields[3] not in ("slub", "slab") or fields[5] not in IMAGES:
            raise KernelBuildError(f"{path}:{lineno}: expected name package suite "
                                   f"slub|slab fragments [x86|um], got {line!r}")
        name, package, suite, allocator, frags, arch = fields
        table[name] = KernelSpec(name, package, suite, allocator, tuple(frags.split(",")),
                                 arch)
    return table


#: name -> KernelSpec: 6.1, 6.1-slab, 6.12, 7.2 (x86), 7.2-uml (um).
KERNELS: dict[str, KernelSpec] = read_table()


def _spec(name: str) -> KernelSpec:
    spec = KERNELS.get(name)
    if spec is None:
        known = ", ".join(KERNELS) or f"none: no {CONFIG_DIR / 'kernels.tsv'}"
        raise KernelBuildError(f"kernel: unknown kernel {name!r} (known: {known})")
    return spec


def kernel_dir(name: str) -> Path:
    """``<cache>/kernels/<name>``: bzImage (or linux, arch um), build.json, build.log,
    config, build/."""
    return cache_dir() / "kernels" / name


def build_info(name: str) -> dict | None:
    """The build.json of a built kernel (package, version, inputs_hash, config_hash,
    kernel_release, built_at, build_seconds, bzimage, build_dir, source_dir, log), or None
    when it was never built (or the file is unreadable)."""
    try:
        info = json.loads((kernel_dir(name) / "build.json").read_text())
    except (OSError, ValueError):
        return None
    return info if isinstance(info, dict) else None


def kernel_path(name: str) -> Path | None:
    """The cached image of ``name`` if it was built (current or not), else None: the
    bzImage of an x86 kernel, the ``linux`` executable of a User Mode Linux one."""
    spec = KERNELS.get(name)
    image = kernel_dir(name) / (spec.image if spec is not None else IMAGES["x86"])
    if image.is_file() and build_info(name) is not None:
        return image
    return None


def kernel_arch(name: str) -> str:
    """``x86`` or ``um`` for a kernel of the table (KernelBuildError for another name)."""
    return _spec(name).arch


def build_tree(name: str) -> Path | None:
    """The kept build tree of ``name`` (``make -C <tree> M=...`` builds modules against it),
    or None when it is missing."""
    tree = kernel_dir(name) / "build"
    return tree if (tree / "Module.symvers").exists() else None


def _built_from(name: str, want: str) -> bool:
    info = build_info(name)
    return (kernel_path(name) is not None and build_tree(name) is not None
            and info is not None and info.get("inputs_hash") == want)


def log_path(name: str) -> Path:
    """Where the full output of ``name``'s last build goes."""
    return kernel_dir(name) / "build.log"


def _sha256_file(path: Path) -> str:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError as exc:
        raise KernelBuildError(f"kernel: cannot read {path}: {exc.strerror}") from None


def inputs_manifest(name: str, version: str) -> str:
    """The text whose sha256 is :func:`inputs_hash` (the script writes the same text at the
    top of each build log)."""
    spec = _spec(name)
    lines = [_MANIFEST_HEADER, f"name {name}", f"package {spec.package}",
             f"version {version}", f"allocator {spec.allocator}"]
    # an arch line only where it is not x86, so x86 manifests read as before
    lines += [f"arch {spec.arch}"] if spec.arch != "x86" else []
    lines += [f"file scripts/build-kernels.sh {_sha256_file(BUILD_SCRIPT)}"]
    lines += [f"file kernel/configs/{f} {_sha256_file(CONFIG_DIR / f)}" for f in spec.fragments]
    return "\n".join(lines) + "\n"


def source_version(name: str) -> str:
    """The version of ``name``'s source package a build would use now (apt's candidate; for
    a privately reached suite the private package lists are fetched once when missing)."""
    _spec(name)
    proc = _script(["--source-version", name], capture=True, timeout=_VERSION_TIMEOUT_S)
    version = proc.stdout.strip()
    if proc.returncode != 0 or not version:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise KernelBuildError(f"kernel {name}: cannot look up the source version: "
                               f"{last.removeprefix('build-kernels: ')}")
    return version


def inputs_hash(name: str, version: str | None = None) -> str:
    """sha256 of the config fragments, the build script, and the source package and version
    (looked up with :func:`source_version` when not given)."""
    if version is None:
        version = source_version(name)
    return hashlib.sha256(inputs_manifest(name, version).encode()).hexdigest()


def is_current(name: str, version: str | None = None) -> bool:
    """Whether ``name`` is built, its build tree kept, and its build.json records today's
    inputs."""
    return _built_from(name, inputs_hash(name, version))


def _script(args: list[str], capture: bool, timeout: float | None = None
            ) -> subprocess.CompletedProcess:
    if not BUILD_SCRIPT.is_file():
        raise KernelBuildError(f"kernel: {BUILD_SCRIPT} not found; building kernels needs "
                               "slabtune's source checkout")
    argv = ["bash", str(BUILD_SCRIPT), *args, "--cache", str(cache_dir())]
    try:
        return subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=capture,
                              text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise KernelBuildError(f"kernel: {' '.join(args)} took more than {timeout:.0f} s"
                               ) from None


def ensure_kernel(name: str, jobs: int = 2, progress: TextIO | None = None) -> Path:
    """The image of ``name`` (:func:`kernel_path`), built first when missing or stale (its
    inputs hash differs from build.json's).  The script's progress lines (step, seconds) go
    to ``progress`` (stderr by default); the full build output goes to the build log.  Raises
    KernelBuildError with one line naming the log when the build fails."""
    progress = progress or sys.stderr
    spec = _spec(name)
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise KernelBuildError(f"jobs: {jobs!r} is not a positive integer")
    version = source_version(name)
    want = inputs_hash(name, version)
    image = kernel_dir(name) / spec.image
    if _built_from(name, want):
        return image
    info = build_info(name)
    if info is None:
        why = "not built yet"
    elif build_tree(name) is None:
        why = "its build tree is missing"
    elif info.get("version") != version:
        why = f"source {info.get('version')} -> {version}"
    else:
        why = "config fragments or build script changed"
    t0 = time.monotonic()
    print(f"slabtune: kernel {name}: building from {spec.package} {version} ({why}); "
          f"a few minutes with make -j{jobs}", file=progress, flush=True)
    rc, last = _run_build(name, jobs, progress)
    elapsed = time.monotonic() - t0
    log = log_path(name)
    if rc != 0:
        cause = last.removeprefix("build-kernels: ") if last else f"exit status {rc}"
        if "log:" not in cause:
            cause += f"; log: {log}"
        raise KernelBuildError(f"kernel {name}: build failed after {elapsed:.0f} s: {cause}")
    if not _built_from(name, want):
        raise KernelBuildError(f"kernel {name}: the build script finished but build.json does "
                               f"not record inputs {want[:12]}; log: {log}")
    print(f"slabtune: kernel {name}: ready in {elapsed:.0f} s: {image}",
          file=progress, flush=True)
    return image


def _run_build(name: str, jobs: int, progress: TextIO) -> tuple[int, str]:
    """Run the script for one kernel, echoing its lines; return its exit status and its last
    failure line (or last line).  Ctrl-C stops the whole build (its process group)."""
    if not BUILD_SCRIPT.is_file():
        raise KernelBuildError(f"kernel: {BUILD_SCRIPT} not found; building kernels needs "
                               "slabtune's source checkout")
    argv = ["bash", str(BUILD_SCRIPT), "--only", name, "--jobs", str(jobs),
            "--cache", str(cache_dir())]
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    last = failure = ""
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            progress.write(line)
            progress.flush()
            if line.strip():
                last = line.strip()
                if " failed" in last or "error:" in last:
                    failure = failure or last
        rc = proc.wait()
    except BaseException:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        proc.wait()
        raise
    return rc, failure or last

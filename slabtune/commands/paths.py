"""Checks of the paths a command is given, before it does any work.

Each check raises one :class:`SlabtuneError` line naming the option and the path: a
directory where a file is expected, a file where a directory is expected, a path that runs
through a file, a missing input or a missing parent directory of an output.
"""

from __future__ import annotations

from pathlib import Path

from slabtune.errors import SlabtuneError


def file_in_the_way(path: Path) -> Path | None:
    """``path`` or its nearest existing ancestor when that is not a directory, else None."""
    for p in (path, *path.parents):
        if p.exists() or p.is_symlink():
            return None if p.is_dir() else p
    return None


def _through_file(flag: str, path: Path) -> None:
    """Fail when an ancestor of ``path`` is a file (``path`` cannot exist under it)."""
    blocker = file_in_the_way(path.parent)
    if blocker is not None:
        raise SlabtuneError(f"{flag}: {path}: {blocker} is a file, not a directory")


def output_dir(flag: str, path) -> Path:
    """A directory the command creates or writes into: missing is fine, a file is not."""
    return _not_a_file(flag, Path(path))


def input_dir(flag: str, path) -> Path:
    """A directory the command reads (missing is left to the command): not a file."""
    return _not_a_file(flag, Path(path))


def _not_a_file(flag: str, p: Path) -> Path:
    """``p`` unless it, or a directory it would sit in, is a file."""
    if p.exists() and not p.is_dir():
        raise SlabtuneError(f"{flag}: {p} is a file, not a directory")
    _through_file(flag, p)
    return p


def output_file(flag: str, path) -> Path:
    """A file the command writes: not a directory, in a directory that exists, and not an
    existing device, FIFO, socket or symbolic link (slabtune.results.safeio.check_output:
    the one rule of every written file), checked before any work."""
    from slabtune.results.safeio import check_output

    p = Path(path)
    if p.is_dir() and not p.is_symlink():
        raise SlabtuneError(f"{flag}: {p} is a directory, not a file")
    _through_file(flag, p)
    parent = p.parent if str(p.parent) else Path(".")
    if not parent.is_dir():
        raise SlabtuneError(f"{flag}: directory {parent} does not exist")
    return check_output(p, flag)


def input_file(flag: str, path) -> Path:
    """A file the command reads: it exists and is not a directory."""
    p = Path(path)
    if p.is_dir():
        raise SlabtuneError(f"{flag}: {p} is a directory, not a file")
    _through_file(flag, p)
    if not p.exists():
        raise SlabtuneError(f"{flag}: {p}: no such file")
    return p

"""The one way slabtune writes a file a user named, and reads one a user gave.

Writing (:func:`write_atomic`): an existing target that is not a regular file (a device such
as ``/dev/null`` or ``/dev/full``, a FIFO, a socket, a directory, or a symbolic link to
anything) is refused, so a command never replaces a node other programs use nor follows a
planted link.  The bytes go to a temporary file created beside the target with a unique
name (``O_CREAT | O_EXCL | O_NOFOLLOW``: never an existing file, never through a link), are
fsynced, and the temporary file is renamed over the target (``os.replace``): a reader sees
the old file or the whole new one.  Any ``OSError`` on the way (ENOSPC, EIO, EFBIG,
ENAMETOOLONG, EROFS, EACCES ...) is one :class:`OutputError` line naming the path, and the
temporary file is removed.

Reading (:func:`read_bounded`, :func:`check_input`): the path must name a regular file (a
link to one is fine) no larger than a limit, checked with ``fstat`` on a descriptor opened
``O_NONBLOCK`` before a byte is read, so ``/dev/zero`` or a FIFO is one line instead of an
endless read or a blocked command.

Imports nothing of slabtune but the error type (results may import only model).
"""

from __future__ import annotations

import errno
import os
import secrets
import stat
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from slabtune.errors import SlabtuneError

#: Default size bound of a text input (a spec, config, cost file, candidate, CSV): 16 MiB.
#: No shipped input is near it (the largest spec is a few KiB).
TEXT_LIMIT = 16 << 20
#: Default size bound of a data input (a snapshot, a part): 1 GiB.
DATA_LIMIT = 1 << 30

#: Longest part of the target's name kept in a temporary name, so that a target whose name
#: is near NAME_MAX still gets a temporary name the filesystem takes.
_TMP_STEM = 64


class OutputError(SlabtuneError):
    """An output path that must not be written, or a write that failed."""


class InputError(SlabtuneError):
    """An input path that is not a bounded regular file, or a read that failed."""


def kind_of(mode: int) -> str:
    """What a ``st_mode`` names, in words (``stat.S_IS*``)."""
    for test, word in ((stat.S_ISREG, "a regular file"), (stat.S_ISDIR, "a directory"),
                       (stat.S_ISLNK, "a symbolic link"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISFIFO, "a FIFO"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return word
    return "not a regular file"


def _why(err: OSError) -> str:
    return err.strerror or errno.errorcode.get(err.errno or 0, "") or str(err)


def check_output(path, field: str = "out") -> Path:
    """``path`` if a command may write it: missing, or an existing regular file (not a
    link), in a directory that exists.  Anything else is one :class:`OutputError` naming
    ``field`` and the path.  Nothing is created."""
    p = Path(path)
    try:
        st = os.lstat(p)
    except FileNotFoundError:
        st = None
    except OSError as err:
        raise OutputError(f"{field}: {p}: {_why(err)}") from None
    if st is not None and not stat.S_ISREG(st.st_mode):
        what = kind_of(st.st_mode)
        if stat.S_ISLNK(st.st_mode):
            what += f" (to {os.readlink(p)})"
        raise OutputError(f"{field}: {p} is {what}, not a regular file; refusing to "
                          "replace it")
    parent = p.parent if str(p.parent) else Path(".")
    if not parent.is_dir():
        raise OutputError(f"{field}: {p}: directory {parent} does not exist")
    return p


def write_atomic(path, data: bytes | str | Callable[[BinaryIO], None],
                 field: str = "out", mode: int | None = None) -> Path:
    """Write ``data`` (bytes, text as UTF-8, or a function that writes to a binary file
    object) to ``path`` atomically: :func:`check_output`, a unique temporary file beside
    it (``O_EXCL | O_NOFOLLOW``), fsync, ``os.replace``.  An existing regular target keeps
    its permission bits (else ``mode``, default 0o666 less the umask).  Returns ``path``.
    Any OSError is one :class:`OutputError` naming ``field`` and the path; the temporary
    file is removed and the target is as it was."""
    p = check_output(path, field)
    try:
        keep = stat.S_IMODE(os.stat(p).st_mode)
    except OSError:
        keep = None
    tmp = p.with_name(f".{p.name[:_TMP_STEM]}.{secrets.token_hex(6)}.tmp")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(tmp, flags, 0o666 if mode is None else mode)
    except OSError as err:
        raise OutputError(f"{field}: cannot write {p}: {_why(err)}") from None
    try:
        with os.fdopen(fd, "wb") as fh:
            if keep is not None:
                os.fchmod(fh.fileno(), keep)
            if callable(data):
                data(fh)
            else:
                fh.write(data.encode() if isinstance(data, str) else data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, p)
    except OSError as err:
        _remove(tmp)
        raise OutputError(f"{field}: cannot write {p}: {_why(err)}") from None
    except BaseException:
        _remove(tmp)
        raise
    return p


def _remove(tmp: Path) -> None:
    try:
        os.unlink(tmp)
    except OSError:
        pass


def _open_regular(path, limit: int, what: str) -> tuple[int, int]:
    """A descriptor of ``path`` opened without blocking, and its size, once ``fstat`` says
    it is a regular file no larger than ``limit``; else one :class:`InputError`."""
    p = os.fspath(path)
    try:
        fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise InputError(f"{what}: {p}: no such file") from None
    except IsADirectoryError:
        raise InputError(f"{what}: {p} is a directory, not a file") from None
    except NotADirectoryError:
        raise InputError(f"{what}: {p}: a parent of it is a file, not a directory") from None
    except OSError as err:
        raise InputError(f"{what}: {p}: cannot read: {_why(err)}") from None
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise InputError(f"{what}: {p} is a directory, not a file")
        if not stat.S_ISREG(st.st_mode):
            raise InputError(f"{what}: {p} is {kind_of(st.st_mode)}, not a regular file")
        if st.st_size > limit:
            raise InputError(f"{what}: {p} is {st.st_size:,} bytes, over the {limit:,}-byte "
                             "limit for it")
    except BaseException:
        os.close(fd)
        raise
    return fd, st.st_size


def check_input(path, limit: int = DATA_LIMIT, what: str = "input") -> Path:
    """``path`` once it names a regular file of at most ``limit`` bytes (for readers that
    take a path: polars, SQLite); else one :class:`InputError` naming ``what``."""
    fd, _ = _open_regular(path, limit, what)
    os.close(fd)
    return Path(path)


def read_bounded(path, limit: int = TEXT_LIMIT, what: str = "input") -> bytes:
    """The bytes of ``path``, a regular file of at most ``limit`` bytes (checked before
    reading, and again while reading in case it grows).  Each way it fails is one
    :class:`InputError` naming ``what`` and the path."""
    fd, _ = _open_regular(path, limit, what)
    try:
        with os.fdopen(fd, "rb") as fh:
            data = fh.read(limit + 1)
    except OSError as err:
        raise InputError(f"{what}: {os.fspath(path)}: cannot read: {_why(err)}") from None
    if len(data) > limit:
        raise InputError(f"{what}: {os.fspath(path)} grew past the {limit:,}-byte limit "
                         "while being read")
    return data

"""Refuse a storage that is not an Optuna study store before anything is written to it.

Optuna (5.0) appends to any file named as a journal and creates its 12 tables in any SQLite
database: ``--storage journal:notes.txt`` or ``--storage sqlite:///other.db`` would modify
another program's file and then fail.  These checks read, never write:

- a journal (:func:`check_journal`): missing, or a regular file that is empty or whose first
  line is a JSON object with an ``op_code`` (what ``JournalStorage._write_log`` appends,
  ``{"op_code": ..., "worker_id": ..., ...}`` one per line, optuna/storages/journal/
  _storage.py);
- a SQLite file (:func:`check_sqlite`): missing, empty, or a SQLite database (opened
  read-only) with no tables or with Optuna's ``studies`` and ``alembic_version`` tables.
"""

from __future__ import annotations

import json
import os
import sqlite3
import stat
from pathlib import Path
from urllib.parse import quote

from slabtune.errors import SlabtuneError
from slabtune.results.safeio import kind_of

#: How far into a journal its first line must end (Optuna's first record, create_study,
#: is well under 1 KiB).
FIRST_LINE_LIMIT = 1 << 20


def _regular(url: str, path: Path) -> os.stat_result | None:
    """``path``'s stat when it is a regular file (a link to one is fine), None when it does
    not exist; anything else (a device, a FIFO, a directory) is one SlabtuneError."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    except OSError as err:
        raise SlabtuneError(f"storage: {url!r}: {path}: {err.strerror or err}") from None
    if not stat.S_ISREG(st.st_mode):
        raise SlabtuneError(f"storage: {url!r}: {path} is {kind_of(st.st_mode)}, not a "
                            "regular file")
    return st


def check_journal(url: str, path: Path) -> None:
    """A journal file that is missing, empty or starts with an Optuna journal record;
    anything else is one SlabtuneError naming the storage (nothing is written)."""
    st = _regular(url, path)
    if st is None or st.st_size == 0:
        return
    with open(path, "rb") as fh:
        head = fh.read(FIRST_LINE_LIMIT)
    line, nl, _ = head.partition(b"\n")
    try:
        rec = json.loads(line) if nl or len(head) < FIRST_LINE_LIMIT else None
    except ValueError:
        rec = None
    if not isinstance(rec, dict) or "op_code" not in rec:
        raise SlabtuneError(f"storage: {url!r}: {path} is not an Optuna journal (its first "
                            "line is not a journal record); refusing to append to it")


def check_sqlite(url: str, path: Path) -> None:
    """A SQLite study file that is missing, empty, or a database with no tables or with
    Optuna's tables; another program's database (or a file that is not SQLite) is one
    SlabtuneError naming the storage, before Optuna creates a table in it."""
    st = _regular(url, path)
    if st is None or st.st_size == 0:
        return
    try:
        con = sqlite3.connect(f"file:{quote(str(path))}?mode=ro", uri=True)
        try:
            tables = {r[0] for r in con.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table'")}
        finally:
            con.close()
    except sqlite3.Error as err:
        raise SlabtuneError(f"storage: {url!r}: {path} is not a SQLite database ({err})"
                            ) from None
    if tables and not {"studies", "alembic_version"} <= tables:
        shown = ", ".join(sorted(tables)[:5]) + (" ..." if len(tables) > 5 else "")
        raise SlabtuneError(f"storage: {url!r}: {path} is another program's SQLite database "
                            f"(tables {shown}; no Optuna studies table); refusing to add "
                            "Optuna's tables to it")

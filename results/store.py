"""The results store: one directory per sweep run, parquet parts and a JSON manifest.

Layout of a run directory::

    <out>/<spec>-<YYYYmmddTHHMMSS>-<hash8>/
        manifest.json          spec, hash, versions, git revision, devices, times, chunk states
        part-000000.parquet    rows of chunk 0 (axis columns, then metrics)
        part-000001.parquet    ...

Parts and the manifest are written to a temporary name in the same directory and renamed
(``os.replace``, through :func:`slabtune.results.safeio.write_atomic`), so a reader or a
resumed run never sees half a file.  A part marked done carries its size and sha256 in the
manifest: ``results show`` refuses a run whose part differs (naming it) and ``--resume``
computes that chunk again (:meth:`Run.damaged_parts`); a manifest from before the checksums
is checked by its parts' row counts.  A chunk's part is
written before its state flips to ``done``, by the driver (:meth:`Run.write_part`) or by a
worker on the same host (:func:`write_part_file`, then the driver's :meth:`Run.commit_part`);
a run killed in between recomputes that chunk on ``--resume`` and replaces the part with
identical rows, so no row is lost or doubled.  Only parts whose chunk is ``done`` in the
manifest are read; each chunk has one part file, so a glob over ``part-*.parquet`` never
holds a row twice either.

This module never imports JAX.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import fcntl
import hashlib
import itertools
import json
import socket
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import polars as pl

from slabtune.errors import SlabtuneError
from slabtune.results import columns
from slabtune.results.safeio import read_bounded, write_atomic

MANIFEST = "manifest.json"
FORMAT = 1
_PART = "part-{:06d}.parquet"
_DTYPES = {"int32": pl.Int32, "int64": pl.Int64, "float32": pl.Float32, "float64": pl.Float64}


class StoreError(SlabtuneError):
    """A run directory that is missing, locked or inconsistent."""


def now_iso() -> str:
    """UTC time, ISO 8601 with seconds."""
    return _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")


#: Largest manifest read (a run of 10^6 chunks writes about 150 MB of states).
MANIFEST_LIMIT = 512 << 20


def _atomic_write(path: Path, data: bytes) -> None:
    write_atomic(path, data, "run")


def file_digest(path: Path) -> tuple[int, str]:
    """A file's size in bytes and sha256 (hex), read in 1 MiB blocks."""
    h, n = hashlib.sha256(), 0
    with open(path, "rb") as fh:
        while block := fh.read(1 << 20):
            h.update(block)
            n += len(block)
    return n, h.hexdigest()


def write_part_file(run_dir, i: int, df: pl.DataFrame) -> tuple[str, int]:
    """Write chunk ``i``'s rows to its part in ``run_dir`` under a temporary name and rename
    it into place; returns the part's name and size in bytes.  Each column carries its
    unit and meaning as arrow field metadata (:mod:`slabtune.results.columns`).  It does
    not touch the manifest: a part not yet marked done is never read, and the chunk's next
    attempt replaces it with the same rows.  Safe to call from a worker process."""
    name = _PART.format(i)
    path = Path(run_dir) / name
    schema = columns.arrow_schema(df, columns.field_metadata(df.columns, columns.part_column))
    write_atomic(path, lambda fh: df.write_parquet(fh, statistics=True, arrow_schema=schema),
                 "run")
    return name, path.stat().st_size


@dataclasses.dataclass
class Run:
    """An open run directory.  Build one with :func:`create_run` or :func:`open_run`."""

    path: Path
    manifest: dict

    # ------------------------------------------------------------------ reading

    @property
    def run_id(self) -> str:
        return self.manifest["run_id"]

    @property
    def n_chunks(self) -> int:
        return int(self.manifest["chunks"]["total"])

    def chunk_state(self, i: int) -> str:
        return self.manifest["chunks"]["states"].get(str(i), {}).get("state", "pending")

    def done_chunks(self) -> list[int]:
        return sorted(int(k) for k, v in self.manifest["chunks"]["states"].items()
                      if v.get("state") == "done")

    def _done_set(self) -> set[int]:
        return {int(k) for k, v in self.manifest["chunks"]["states"].items()
                if v.get("state") == "done"}

    def iter_pending(self) -> Iterator[int]:
        """Chunks not done yet, in order, lazily: memory grows with the chunks done, never
        with the chunks of the grid (a run may have billions).  The done set is taken
        when this is called; chunks finished while iterating are still yielded."""
        done = self._done_set()
        return (i for i in range(self.n_chunks) if i not in done)

    def pending_count(self) -> int:
        """How many chunks are not done."""
        return self.n_chunks - len(self._done_set())

    def pending_chunks(self) -> list[int]:
        """Every chunk not done, as a list (for small runs and tests; see
        :meth:`iter_pending`)."""
        return list(self.iter_pending())

    @property
    def complete(self) -> bool:
        return self.manifest.get("ended") is not None and self.pending_count() == 0

    @property
    def rows(self) -> int:
        """Rows written so far (sum over done chunks)."""
        return sum(int(v["rows"]) for v in self.manifest["chunks"]["states"].values()
                   if v.get("state") == "done")

    def part_paths(self) -> list[Path]:
        return [self.path / self.manifest["chunks"]["states"][str(i)]["part"]
                for i in self.done_chunks()]

    def parquet_bytes(self) -> int:
        """Bytes on disk of the done chunks' parts (file sizes; no part is opened)."""
        return sum(p.stat().st_size for p in self.part_paths() if p.is_file())

    def scan(self) -> pl.LazyFrame:
        """A polars LazyFrame over every completed part, in chunk order."""
        parts = self.part_paths()
        if not parts:
            return pl.LazyFrame(schema=self.schema())
        return pl.scan_parquet([str(p) for p in parts])

    def collect(self) -> pl.DataFrame:
        """``scan().collect()``."""
        return self.scan().collect()

    def schema(self) -> dict[str, pl.DataType]:
        """Column names and polars types, from the manifest."""
        out = {}
        for name, kind, cats in self.manifest["columns"]:
            out[name] = pl.Enum(cats) if kind == "enum" else _DTYPES.get(kind, pl.Int32)
        return out

    # ------------------------------------------------------------------ writing

    def write_part(self, i: int, df: pl.DataFrame, **info: Any) -> Path:
        """Write chunk ``i``'s rows atomically, then mark it done in the manifest."""
        if self.chunk_state(i) == "done":
            raise StoreError(f"chunk {i}: already written in run {self.run_id}")
        name, _ = write_part_file(self.path, i, df)
        return self.commit_part(i, name, df.height, **info)

    def commit_part(self, i: int, name: str, rows: int, **info: Any) -> Path:
        """Mark chunk ``i`` done once its part ``name`` is in place, written by
        :func:`write_part_file` here or in a worker process that shares the directory."""
        if self.chunk_state(i) == "done":
            raise StoreError(f"chunk {i}: already written in run {self.run_id}")
        if name != _PART.format(i):
            raise StoreError(f"chunk {i}: part {name!r} is not this chunk's part")
        path = self.path / name
        if not path.is_file():
            raise StoreError(f"chunk {i}: part {path} is missing")
        size, digest = file_digest(path)
        state = {"state": "done", "rows": int(rows), "part": name, "written": now_iso()}
        state.update(info)
        state.update(bytes=size, sha256=digest)
        self.manifest["chunks"]["states"][str(i)] = state
        self.save()
        return path

    def save(self) -> None:
        """Write the manifest atomically."""
        _atomic_write(self.path / MANIFEST,
                      json.dumps(self.manifest, indent=1, sort_keys=False).encode())

    def start_attempt(self, **info: Any) -> None:
        """Record that a process (fresh or resumed) starts working on the run."""
        self.manifest.setdefault("attempts", []).append({"started": now_iso(), **info})
        self.manifest["ended"] = None
        self.save()

    def finish(self) -> None:
        """Stamp the end time once every chunk is done."""
        if self.pending_count():
            first = list(itertools.islice(self.iter_pending(), 5))
            raise StoreError(f"run {self.run_id}: chunks {first} not done")
        self.manifest["ended"] = now_iso()
        self.manifest["rows"] = self.rows
        self.save()

    def clean_temporaries(self) -> int:
        """Before a resumed attempt: remove temporary files a killed writer left behind
        (returns how many), and put every chunk whose part is damaged
        (:meth:`damaged_parts`) back to pending, with a note on stderr naming the part, so
        this attempt computes it again."""
        n = 0
        for pattern in (".*.tmp-*", ".*.tmp"):
            for p in self.path.glob(pattern):
                p.unlink(missing_ok=True)
                n += 1
        damaged = self.damaged_parts()
        for i, name, why in damaged:
            print(f"slabtune: note: run {self.run_id}: {name} {why}; chunk {i} is computed "
                  "again", file=sys.stderr)
            self.manifest["chunks"]["states"][str(i)] = {
                "state": "damaged", "part": name, "error": why, "when": now_iso()}
        if damaged:
            self.save()
        return n

    def damaged_parts(self) -> list[tuple[int, str, str]]:
        """``(chunk, part, what is wrong)`` for every done chunk whose part is missing, or
        differs from the size and sha256 the manifest recorded when it was written (a
        truncated or edited part); a manifest written before checksums (no ``sha256``) is
        checked by the part's parquet row count instead."""
        out = []
        for i in self.done_chunks():
            st = self.manifest["chunks"]["states"][str(i)]
            name = st["part"]
            path = self.path / name
            if not path.is_file() or path.is_symlink():
                out.append((i, name, "is missing (or not a regular file)"))
                continue
            if "sha256" in st:
                size, digest = file_digest(path)
                if size != st.get("bytes", size):
                    out.append((i, name, f"is {size} bytes, the manifest says {st['bytes']} "
                                          "(truncated or edited)"))
                elif digest != st["sha256"]:
                    out.append((i, name, "differs from the sha256 in the manifest (edited or "
                                         "damaged)"))
                continue
            try:
                n = pl.scan_parquet(str(path)).select(pl.len()).collect().item()
            except (pl.exceptions.PolarsError, OSError) as err:
                out.append((i, name, f"is not readable parquet ({_first_line(err)})"))
                continue
            if n != int(st["rows"]):
                out.append((i, name, f"holds {n} rows, the manifest says {st['rows']}"))
        return out

    def verify(self) -> None:
        """Raise one StoreError naming the first damaged part (and how many there are)."""
        bad = self.damaged_parts()
        if bad:
            i, name, why = bad[0]
            more = f" ({len(bad) - 1} more damaged parts)" if len(bad) > 1 else ""
            raise StoreError(f"run {self.run_id}: chunk {i}: {self.path / name} {why}{more}; "
                             "sweep run --resume computes it again")

    # ------------------------------------------------------------------ locking

    def lock(self):
        """An exclusive, non-blocking lock on the run (one writer at a time)."""
        return _RunLock(self.path / ".lock", self.run_id)

    def errors(self) -> list[tuple[int, str]]:
        """``(chunk, error)`` for every chunk that recorded an error, in chunk order: a
        chunk that failed for good (``failed``, sweeps/runner.py), a part found damaged on
        resume (``damaged``), and a done chunk whose task failed and stored its error with
        its rows (validate and lab runs: ``status`` failed)."""
        out = []
        for k, v in self.manifest["chunks"]["states"].items():
            err = v.get("error")
            if not err:
                continue
            if v.get("state") in ("failed", "damaged") or v.get("status") == "failed":
                out.append((int(k), str(err)))
        return sorted(out)

    def state(self) -> str:
        """``complete``; ``failed`` when a chunk failed for good and the run was not
        finished since; else ``partial`` (stopped, or still running)."""
        if self.complete:
            return "complete"
        if any(v.get("state") == "failed" for v in self.manifest["chunks"]["states"].values()):
            return "failed"
        return "partial"

    def summary(self) -> dict:
        """A JSON-able summary of the run, with its first recorded error (:meth:`errors`)
        and how many chunks recorded one."""
        m = self.manifest
        errors = self.errors()
        return {
            "run_id": m["run_id"],
            "run_dir": str(self.path),
            "spec": m["spec"]["name"],
            "spec_hash": m["spec_hash"],
            "evaluator": m["spec"].get("evaluator"),
            "state": self.state(),
            "errors": len(errors),
            "error": f"chunk {errors[0][0]}: {errors[0][1]}" if errors else None,
            "rows": self.rows,
            "chunks_done": len(self.done_chunks()),
            "chunks": self.n_chunks,
            "parquet_bytes": self.parquet_bytes(),
            "started": m["started"],
            "ended": m.get("ended"),
            "devices": m.get("devices", []),
            "git_revision": m.get("git_revision"),
        }


class _RunLock:
    def __init__(self, path: Path, run_id: str):
        self.path, self.run_id, self.fh = path, run_id, None

    def __enter__(self):
        self.fh = open(self.path, "w")
        try:
            fcntl.flock(self.fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self.fh.close()
            raise StoreError(f"run {self.run_id}: another process is writing it") from None
        return self

    def __exit__(self, *exc):
        fcntl.flock(self.fh, fcntl.LOCK_UN)
        self.fh.close()


def file_in_the_way(path: Path) -> Path | None:
    """``path`` itself or the nearest existing ancestor of it when that is not a directory
    (a file where a directory is needed), else None."""
    for p in (path, *path.parents):
        if p.exists() or p.is_symlink():
            return None if p.is_dir() else p
    return None


def make_out_dir(out: Path, field: str = "out") -> None:
    """Create the directory that holds run directories (and its parents); a file in the way
    or a failed mkdir is one StoreError naming ``field`` and the path."""
    blocker = file_in_the_way(out)
    if blocker == out:
        raise StoreError(f"{field}: {out} is a file, not a directory")
    if blocker is not None:
        raise StoreError(f"{field}: {out}: {blocker} is a file, not a directory")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise StoreError(f"{field}: cannot create {out}: {err.strerror or err}") from None


def run_id_for(spec_name: str, spec_hash: str, when: _dt.datetime | None = None) -> str:
    when = when or _dt.datetime.now(_dt.UTC)
    return f"{spec_name}-{when.strftime('%Y%m%dT%H%M%S')}-{spec_hash[:8]}"


def create_run(out_dir, *, spec: dict, spec_hash: str, spec_text: str, n_chunks: int,
               columns: list, versions: dict, git_revision: str | None,
               extra: dict | None = None) -> Run:
    """Create a fresh run directory under ``out_dir`` with an initial manifest.

    ``columns`` is ``[(name, "int32"|"int64"|"float32"|"float64"|"enum", categories|None),
    ...]`` in output order.
    """
    out = Path(out_dir)
    make_out_dir(out)
    base = run_id_for(spec["name"], spec_hash)
    run_id, k = base, 1
    while True:
        try:
            (out / run_id).mkdir()
            break
        except FileExistsError:
            k += 1
            run_id = f"{base}.{k}"
        except OSError as err:
            raise StoreError(f"run: cannot create {out / run_id}: {err.strerror or err}") from None
    manifest = {
        "format": FORMAT,
        "run_id": run_id,
        "spec": spec,
        "spec_hash": spec_hash,
        "spec_text": spec_text,
        "columns": [list(c) for c in columns],
        "versions": versions,
        "git_revision": git_revision,
        "host": socket.gethostname(),
        "devices": [],
        "started": now_iso(),
        "ended": None,
        "rows": None,
        "chunks": {"total": n_chunks, "chunk_size": spec["chunk_size"], "states": {}},
        **(extra or {}),
    }
    run = Run(out / run_id, manifest)
    run.save()
    return run


def open_run(path) -> Run:
    """Open an existing run directory (read its manifest)."""
    p = Path(path)
    mf = p / MANIFEST
    if not mf.is_file():
        raise StoreError(f"run: {p} is not a run directory (no {MANIFEST})")
    try:
        manifest = json.loads(read_bounded(mf, MANIFEST_LIMIT, "run"))
    except SlabtuneError as err:
        raise StoreError(str(err)) from None
    except (OSError, ValueError) as err:
        raise StoreError(f"run: {mf} is unreadable: {_first_line(err)}") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        got = manifest.get("format") if isinstance(manifest, dict) else type(manifest).__name__
        raise StoreError(f"run: {mf} has format {got!r}, expected {FORMAT}")
    check_manifest(manifest, mf)
    return Run(p, manifest)


def _first_line(err: BaseException) -> str:
    return (str(err).strip().splitlines() or [err.__class__.__name__])[0]


def check_manifest(m: dict, where) -> None:
    """The fields a reader relies on have their types, and every done chunk names its own
    part file (never a path elsewhere); else one StoreError naming the field."""
    def bad(field: str, what: str) -> StoreError:
        return StoreError(f"run: {where}: {field} {what} (a damaged or edited manifest)")

    for key in ("run_id", "spec_hash", "started"):
        if not isinstance(m.get(key), str):
            raise bad(key, "is missing or not a string")
    spec = m.get("spec")
    if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
        raise bad("spec.name", "is missing or not a string")
    cols = m.get("columns")
    if not isinstance(cols, list) or not all(
            isinstance(c, list) and len(c) == 3 and isinstance(c[0], str) for c in cols):
        raise bad("columns", "is not a list of [name, type, categories]")
    chunks = m.get("chunks")
    if not isinstance(chunks, dict):
        raise bad("chunks", "is missing")
    total = chunks.get("total")
    if isinstance(total, bool) or not isinstance(total, int) or total < 0:
        raise bad("chunks.total", "is not a count")
    states = chunks.get("states")
    if not isinstance(states, dict):
        raise bad("chunks.states", "is not a table")
    for k, v in states.items():
        if not k.isdigit() or not isinstance(v, dict) or int(k) >= max(total, 1):
            raise bad(f"chunks.states.{k}", "is not a chunk of this run")
        if v.get("state") == "done":
            if v.get("part") != _PART.format(int(k)):
                raise bad(f"chunks.states.{k}.part", f"{str(v.get('part'))[:60]!r} is not "
                          f"{_PART.format(int(k))}")
            r = v.get("rows")
            if isinstance(r, bool) or not isinstance(r, int) or r < 0:
                raise bad(f"chunks.states.{k}.rows", "is not a count")


def resolve_run(ref, out_dir="runs") -> Run:
    """A run from a path, a run id under ``out_dir``, or a unique prefix of one."""
    p = Path(ref)
    if (p / MANIFEST).is_file():
        return open_run(p)
    out = Path(out_dir)
    if (out / str(ref) / MANIFEST).is_file():
        return open_run(out / str(ref))
    matches = [r for r in iter_runs(out_dir) if r.run_id.startswith(str(ref))]
    if len(matches) == 1:
        return matches[0]
    if not matches:
        raise StoreError(f"run: no run {str(ref)!r} (as a path or under {out})")
    raise StoreError(f"run: {str(ref)!r} matches {len(matches)} runs under {out}")


def iter_runs(out_dir="runs") -> Iterator[Run]:
    """Every readable run under ``out_dir``, oldest first."""
    return iter([r for r, _ in scan_runs(out_dir) if r is not None])


def scan_runs(out_dir="runs") -> list[tuple[Run | None, str | None]]:
    """Every directory under ``out_dir`` with a manifest, oldest first: ``(run, None)`` for
    a readable one, ``(None, "DIR: what is wrong")`` for a damaged one (after the readable
    ones), so one damaged run never hides the others."""
    out = Path(out_dir)
    if not out.is_dir():
        return []
    runs, damaged = [], []
    for d in sorted(out.iterdir()):
        if (d / MANIFEST).exists():
            try:
                runs.append(open_run(d))
            except StoreError as err:
                damaged.append((None, f"{d}: {str(err).removeprefix('run: ')}"))
    runs.sort(key=lambda r: (r.manifest.get("started") or "", r.run_id))
    return [(r, None) for r in runs] + damaged


def list_runs(out_dir="runs") -> pl.DataFrame:
    """One row per readable run under ``out_dir`` (see :meth:`Run.summary`)."""
    rows = [r.summary() for r in iter_runs(out_dir)]
    schema = {"run_id": pl.String, "run_dir": pl.String, "spec": pl.String,
              "spec_hash": pl.String, "evaluator": pl.String, "state": pl.String,
              "rows": pl.Int64, "chunks_done": pl.Int64, "chunks": pl.Int64,
              "started": pl.String, "ended": pl.String}
    return pl.DataFrame([{k: r[k] for k in schema} for r in rows], schema=schema)

"""Optuna studies over SLUB policies: spec loading, storage, batched ask -> evaluate -> tell.

A tune spec is a TOML file with ``[fleet]`` (:mod:`slabtune.validate`), ``[search]``
(:mod:`slabtune.tuner.space`) and an optional ``[objectives]`` table.  A study has two
objectives, both minimised: fleet memory overhead (overhead bytes / live bytes) and modelled
ns per op.  Trials are asked ``batch`` at a time with the space's plain distributions, the
batch is evaluated in one vectorised model call, and each trial is told back with its values
and its per-topology objectives as user attrs.  The study's own user attrs keep the spec
text and the baseline (the unmodified profile's objectives), so ``pareto``, ``plot`` and
``export`` need only the study name and storage; the study opens in optuna-dashboard as is.

Storage: a SQLite file ``study.db`` in the run directory (``runs/<study>/``) by default; any
RDB URL (``sqlite:///...``, ``postgresql://...`` and ``mysql://...`` with their drivers named,
:func:`driver_url`), ``journal:PATH`` (or a path ending in ``.log``/``.journal``) for a
journal file, or ``memory:`` for an in-memory study.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as _dt
import hashlib
import json
import logging
import os
import shlex
import sys
import tomllib
import warnings
from collections.abc import Mapping
from importlib import resources
from pathlib import Path

import numpy as np
import optuna

from slabtune.errors import SlabtuneError
from slabtune.model import bootparams, profiles, slab
from slabtune.sweeps.spec import SpecError, check_name, read_text_file
from slabtune.tuner import constraints, optuna_internals, storage_guard
from slabtune.tuner import fleet as fleets
from slabtune.tuner import objectives as fleet_objectives
from slabtune.tuner import space as search_space

DIRECTIONS = ("minimize", "minimize")
OBJECTIVE_NAMES = ("memory", "time")
ATTR_SPEC = "slabtune_spec"
ATTR_BASELINE = "slabtune_baseline"
ATTR_TOPOLOGIES = "slabtune_topologies"
ATTR_PROFILE = "slabtune_profile"
#: The sweep spec the fleet was taken from ([fleet] sweep), as SweepSpec.to_dict() at creation.
ATTR_FLEET_SWEEP = "slabtune_fleet_sweep"
#: The text of the cost file [objectives] cost named, as read at creation.
ATTR_COST = "slabtune_cost"
#: Trial user attr: per-topology objectives {"memory": [...], "time": [...]} (lists aligned
#: with the study's ATTR_TOPOLOGIES).
ATTR_TOPO = "per_topology"
ATTR_EXCESS = "regression_excess"
#: Trial user attr of a failed dynamics-set trial: why (points not in steady state,
#: objectives.DynamicsObjectives.check), one line.
ATTR_NOT_STEADY = "not_steady"


def _trial_attrs(ev: fleet_objectives.Evaluation, i: int) -> dict:
    """Row ``i``'s per-topology objectives, and why it failed where it is not in steady
    state."""
    attrs = {ATTR_TOPO: {"memory": ev.memory_topo[i].tolist(), "time": ev.time_topo[i].tolist()}}
    if ev.notes is not None and ev.notes[i]:
        attrs[ATTR_NOT_STEADY] = ev.notes[i]
    return attrs
DEFAULT_RUNS = Path("runs")
DB_NAME = "study.db"


@dataclasses.dataclass(frozen=True)
class TuneSpec:
    """A parsed tune spec and its source text (stored with the study)."""

    name: str
    text: str
    fleet: fleets.Fleet
    space: search_space.SearchSpace
    objectives: fleet_objectives.ObjectiveSpec
    #: The sweep spec ``[fleet] sweep`` named, as :meth:`SweepSpec.to_dict` (None without).
    fleet_sweep: dict | None = None
    #: The text of the cost file ``[objectives] cost`` named (None: the packaged table).
    cost_text: str | None = None

    def cost(self):
        """The cost constants of the time objective: the packaged table, overridden by the
        constants of the cost file ``[objectives] cost`` named."""
        from slabtune.sweeps import simconfig

        if self.cost_text is None:
            return simconfig.load_cost()[0]
        return simconfig.load_cost_text(self.cost_text,
                                        f"objectives.cost {self.objectives.cost}")[0]


def builtin_spec_path(name: str) -> Path | None:
    """The path of a built-in spec (``tune_quick`` or ``tune_quick.toml``), or None."""
    stem = name[:-5] if name.endswith(".toml") else name
    if "/" in stem:
        return None
    p = resources.files("slabtune.sweeps").joinpath(f"{stem}.toml")
    return Path(str(p)) if p.is_file() else None


def parse_spec(text: str, name: str = "spec", fleet_sweep: dict | None = None,
               cost_text: str | None = None, stored: bool = False) -> TuneSpec:
    """Parse tune-spec text; every error is one line naming the field.  ``fleet_sweep``:
    the sweep spec its ``[fleet] sweep`` named when the study was created (kept in the
    study), used instead of loading that name again; ``cost_text`` likewise for the cost
    file ``[objectives] cost`` names (a relative path is read from the working directory).
    ``stored``: the spec of an existing study (kept as it was created; it may search kernel
    knobs without ``[search] reach``, from before that rule)."""
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise SlabtuneError(f"{name}: not valid TOML ({err})") from None
    unknown = set(doc) - {"fleet", "search", "objectives", "tune"}
    if unknown:
        raise SlabtuneError(f"{name}: unknown table [{sorted(unknown)[0]}] "
                            "(expected [fleet], [search], [objectives], [tune])")
    if "fleet" not in doc:
        raise SlabtuneError(f"{name}: missing the [fleet] table")
    if "search" not in doc:
        raise SlabtuneError(f"{name}: missing the [search] table")
    sweep = None
    if isinstance(doc["fleet"], dict) and "sweep" in doc["fleet"]:
        if fleet_sweep is not None:
            from slabtune.sweeps import spec as sweep_spec
            sweep = sweep_spec.from_dict(fleet_sweep)
        else:
            sweep = fleets.load_sweep(doc["fleet"]["sweep"])
    fleet = fleets.parse_fleet(doc["fleet"], sweep)
    space = search_space.parse_search(doc["search"], fleet.profile, stored)
    objectives = fleet_objectives.parse_objectives(doc.get("objectives"))
    if objectives.cost is None:
        cost_text = None
    elif cost_text is None:
        cost_text = read_text_file(objectives.cost, "objectives.cost")
    out = TuneSpec(name=name, text=text, fleet=fleet, space=space, objectives=objectives,
                   fleet_sweep=sweep.to_dict() if sweep is not None else None,
                   cost_text=cost_text)
    if cost_text is not None:
        out.cost()    # a bad constant is an error now, naming the file and the constant
    return out


def spec_file(ref: str, field: str = "spec") -> Path:
    """The file a spec reference names: a path, else a built-in spec of that name.  Errors
    are one line naming ``field``."""
    path = Path(ref)
    if not path.exists():
        builtin = builtin_spec_path(ref)
        if builtin is None:
            raise SlabtuneError(f"{field}: {ref}: no such file or built-in spec")
        path = builtin
    if path.is_dir():
        raise SlabtuneError(f"{field}: {ref}: is a directory")
    return path


def load_spec(ref: str) -> TuneSpec:
    """Load a spec from a file path or a built-in name (``tune_quick``)."""
    path = spec_file(ref)
    return parse_spec(read_text_file(path, "spec"), path.stem)


# --------------------------------------------------------------------------- storage


def default_run_dir(study_name: str, runs: Path = DEFAULT_RUNS) -> Path:
    return runs / study_name


def default_storage_url(run_dir: Path) -> str:
    return f"sqlite:///{run_dir.resolve() / DB_NAME}"


#: Storage URLs of an in-memory study (gone when the process ends).
MEMORY_URLS = ("memory:", ":memory:", "inmemory")


def is_in_memory_url(url: str) -> bool:
    """Whether ``url`` names an in-memory storage."""
    return url.strip() in MEMORY_URLS


def open_storage(url: str, create: bool = True) -> optuna.storages.BaseStorage:
    """Open a storage by URL; a bad URL or unreachable database raises one SlabtuneError
    line naming the storage."""
    if not isinstance(url, str) or not url.strip():
        raise SlabtuneError("storage: empty storage URL")
    url = url.strip()
    if is_in_memory_url(url):
        return optuna.storages.InMemoryStorage()
    journal = None
    if url.startswith("journal:"):
        journal = url[len("journal:"):]
        if journal.startswith("//"):
            journal = journal[2:]
    elif "://" not in url and url.endswith((".log", ".journal", ".jsonl")):
        journal = url
    if journal is not None:
        return _open_journal(url, journal, create)
    if "://" not in url:
        raise SlabtuneError(f"storage: {shown_url(url)!r} is not a storage URL (use "
                            "sqlite:///PATH, postgresql://..., mysql://..., journal:PATH or "
                            "memory:)")
    if url.startswith("sqlite:///"):
        path = Path(url[len("sqlite:///"):])
        if str(path) not in ("", ":memory:"):
            _check_parent(url, path)
            if not create and not path.exists():
                raise SlabtuneError(f"storage: {shown_url(url)!r}: database file does not exist")
            storage_guard.check_sqlite(url, path)      # not another program's database
    try:
        storage = optuna.storages.RDBStorage(driver_url(url))
    except ImportError as err:
        raise SlabtuneError(_missing_driver(url, err)) from None
    except Exception as err:  # noqa: BLE001 - SQLAlchemy/driver errors vary by backend
        raise SlabtuneError(f"storage: {shown_url(url)!r}: "
                            f"{scrub(_first_line(err), url)}") from None
    if url.startswith("sqlite:"):
        _sqlite_wal(storage)
    return storage


def _check_parent(url: str, path: Path) -> None:
    """The directory a storage file goes in exists (and is not a file)."""
    parent = path.parent
    if parent.exists() and not parent.is_dir():
        raise SlabtuneError(f"storage: {shown_url(url)!r}: {parent} is a file, not a directory")
    if not parent.is_dir():
        raise SlabtuneError(f"storage: {shown_url(url)!r}: directory {parent} does not exist")


def _open_journal(url: str, journal: str, create: bool) -> optuna.storages.BaseStorage:
    """A journal file storage.  Opened to write (``create``), a file whose last record was
    torn by a crash is repaired first (:func:`repair_torn_journal`), since a record appended
    after the torn bytes would make the whole file unreadable."""
    path = Path(journal)
    if not journal or path.is_dir():
        raise SlabtuneError(f"storage: {shown_url(url)!r}: journal storage needs a file path")
    _check_parent(url, path)
    if not create and not path.exists():
        raise SlabtuneError(f"storage: {shown_url(url)!r}: journal file does not exist")
    storage_guard.check_journal(url, path)             # not a text file, device or FIFO
    from optuna.storages.journal import JournalFileBackend, JournalStorage
    if create:
        moved = repair_torn_journal(path)
        if moved is not None:
            print(f"slabtune: note: journal {path} ended in a torn record (a crash mid-write); "
                  f"cut it off and kept its bytes in {moved}", file=sys.stderr)
    try:
        return JournalStorage(JournalFileBackend(str(path)))
    except Exception as err:  # noqa: BLE001 - any backend failure is a bad storage
        raise SlabtuneError(f"storage: {shown_url(url)!r}: {_first_line(err)}") from None


def torn_tail_offset(path: Path, block: int = 1 << 16) -> int | None:
    """Where a journal's torn last record starts (just after its last newline), or None
    when the file is empty or ends with a newline.  Optuna's reader skips such a tail, but
    the next append would glue a record onto it and make every later read fail."""
    size = path.stat().st_size
    if size == 0:
        return None
    with open(path, "rb") as fh:
        fh.seek(size - 1)
        if fh.read(1) == b"\n":
            return None
        end = size
        while end > 0:
            start = max(0, end - block)
            fh.seek(start)
            nl = fh.read(end - start).rfind(b"\n")
            if nl >= 0:
                return start + nl + 1
            end = start
    return 0


def repair_torn_journal(path: Path) -> Path | None:
    """Cut a torn last record off a journal file (under Optuna's own journal lock), after
    copying its bytes to ``<file>.torn-<UTC time>`` beside it; returns that copy, or None
    when the file is intact.  Nothing Optuna can read is removed: it never reads a last
    line without a newline."""
    if not path.is_file() or torn_tail_offset(path) is None:
        return None
    from optuna.storages.journal import JournalFileSymlinkLock

    lock = JournalFileSymlinkLock(str(path))
    lock.acquire()
    try:
        keep = torn_tail_offset(path)   # again, under the lock
        if keep is None:
            return None
        stamp = _dt.datetime.now(_dt.UTC).strftime("%Y%m%dT%H%M%S")
        copy = path.with_name(f"{path.name}.torn-{stamp}")
        k = 1
        while copy.exists():
            k += 1
            copy = path.with_name(f"{path.name}.torn-{stamp}.{k}")
        with open(path, "r+b") as fh:
            fh.seek(keep)
            torn = fh.read()
            with open(copy, "wb") as out:
                out.write(torn)
                out.flush()
                os.fsync(out.fileno())
            fh.truncate(keep)
            fh.flush()
            os.fsync(fh.fileno())
        return copy
    finally:
        lock.release()


def _sqlite_wal(storage: optuna.storages.RDBStorage) -> None:
    """Put a SQLite study database in WAL mode with synchronous=NORMAL: every ask, param,
    attr and tell is its own transaction, and the default rollback journal syncs each one
    to disk several times.  The file stays a plain SQLite database (optuna-dashboard and
    other readers open it unchanged; WAL also lets them read while a study runs)."""
    import sqlalchemy

    def on_connect(dbapi_conn, _record):
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute("PRAGMA synchronous=NORMAL")
        cur.close()

    sqlalchemy.event.listen(storage.engine, "connect", on_connect)
    storage.engine.dispose()


#: The driver slabtune names for a plain RDB URL scheme, and the extra that installs it:
#: ``scheme -> (SQLAlchemy driver, module, extra)``.  SQLAlchemy 2.1 itself takes psycopg (3)
#: for postgresql:// (2.0 took psycopg2) and mysqlclient for mysql:// (a C build against
#: MySQL's headers); naming the driver makes the URL mean one thing on every SQLAlchemy 2.x.
PLAIN_DRIVERS = {"postgresql": ("psycopg", "psycopg", "postgres"),
                 "mysql": ("pymysql", "pymysql", "mysql")}


def driver_url(url: str) -> str:
    """The URL given to SQLAlchemy: a plain ``postgresql://`` or ``mysql://`` URL with its
    driver named (:data:`PLAIN_DRIVERS`); any other URL, or one naming a driver
    (``postgresql+psycopg2://``), as it is."""
    scheme, sep, rest = url.partition("://")
    if sep and scheme in PLAIN_DRIVERS:
        return f"{scheme}+{PLAIN_DRIVERS[scheme][0]}://{rest}"
    return url


def _missing_driver(url: str, err: ImportError) -> str:
    """One line for an RDB URL whose driver module is not installed: the module and, for a
    driver slabtune names, the extra that installs it."""
    cause: BaseException | None = err
    module = None
    while cause is not None and module is None:
        module = getattr(cause, "name", None)
        cause = cause.__cause__
    dialect = url.partition("://")[0].partition("+")[0]
    extra = next((x for s, (_d, m, x) in PLAIN_DRIVERS.items()
                  if s == dialect and m == module), None)
    how = (f"pip install 'slabtune[{extra}]'" if extra else
           f"install the Python module {module}" if module else "install its driver")
    return (f"storage: {shown_url(url)!r}: the {dialect} driver "
            f"{'(' + module + ') ' if module else ''}is not installed; {how}")


def scrub(text: str, url: str) -> str:
    """``text`` (a driver's message about ``url``) with ``url``'s password masked wherever
    it appears, as given or percent-decoded."""
    if "://" not in url or "@" not in url:
        return text
    try:
        import sqlalchemy

        password = sqlalchemy.engine.make_url(url).password
    except Exception:  # noqa: BLE001 - not a URL SQLAlchemy parses: take what may be one
        creds = url.split("://", 1)[1].rsplit("@", 1)[0]
        password = creds.partition(":")[2] or None
    if not password:
        return text
    from urllib.parse import quote, unquote

    for form in sorted({password, quote(password, safe=""), unquote(password)}, key=len,
                       reverse=True):
        if form:
            text = text.replace(form, "***")
    return text


def shown_url(url: str) -> str:
    """A storage URL as messages show it: an RDB URL's password masked (``***``)."""
    if "://" in url and "@" in url:
        try:
            import sqlalchemy

            return sqlalchemy.engine.make_url(url).render_as_string(hide_password=True)
        except Exception:  # noqa: BLE001 - not a URL SQLAlchemy parses: hide what may be one
            return url.split("://", 1)[0] + "://***@" + url.rsplit("@", 1)[1]
    return url


@contextlib.contextmanager
def storage_writes(url: str | None):
    """A failed write to the study's storage is one SlabtuneError naming the storage: a
    journal file on a full disk, past a file size limit or with an I/O error (``OSError``:
    the system's words alone, "File too large", did not say which file), or a database
    whose commit failed (Optuna's StorageInternalError, SQLAlchemy's errors: a traceback)."""
    try:
        yield
    except Exception as err:  # noqa: BLE001 - filtered just below
        rdb = isinstance(err, optuna.exceptions.StorageInternalError) or any(
            c.__module__.startswith("sqlalchemy.") for c in type(err).__mro__)
        if not (rdb or isinstance(err, OSError)):
            raise
        why = err.strerror if isinstance(err, OSError) and err.strerror else \
            _first_line(err.__cause__ or err)
        raise SlabtuneError(f"storage: {shown_url(url or 'the study storage')!r}: cannot "
                            f"write: {scrub(why, url or '')}") from None


def _first_line(err: BaseException) -> str:
    msg = str(err).strip() or err.__class__.__name__
    return msg.splitlines()[0]


def resolve_storage(study_name: str | None, storage: str | None, run_dir: str | Path | None,
                    create: bool) -> tuple[str, Path | None]:
    """The storage URL to use: ``storage`` if given, else the run directory's study.db (the
    run directory defaulting to ``runs/<study>``)."""
    if storage:
        return storage, Path(run_dir) if run_dir else None
    if run_dir is None:
        if study_name is None:
            raise SlabtuneError("study: give --study NAME or --run RUN_DIR")
        run_dir = default_run_dir(check_study_name(study_name))
    run_dir = Path(run_dir)
    if run_dir.exists() and not run_dir.is_dir():
        raise SlabtuneError(f"run: {run_dir} is a file, not a directory")
    if create:
        try:
            run_dir.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise SlabtuneError(f"run: cannot create {run_dir}: {err.strerror or err}") from None
    elif not (run_dir / DB_NAME).is_file():
        raise SlabtuneError(f"run: {run_dir} has no {DB_NAME} (not a tune run directory)")
    return default_storage_url(run_dir), run_dir


#: Longest study name accepted: it names a directory (``runs/<study>``).
MAX_STUDY_NAME = 128


def check_study_name(name) -> str:
    """A study name, checked as sweep names are (:func:`slabtune.sweeps.spec.check_name`:
    letters, digits, '-', '_', '.'), and not starting with '.' (no ``..``, nothing hidden),
    at most :data:`MAX_STUDY_NAME` characters: it becomes the directory ``runs/<study>``."""
    try:
        check_name("--study", name)
    except SpecError as err:
        raise SlabtuneError(str(err)) from None
    if name.startswith("."):
        raise SlabtuneError(f"--study: {name!r} must not start with '.'")
    if len(name) > MAX_STUDY_NAME:
        raise SlabtuneError(f"--study: {len(name)} characters; at most {MAX_STUDY_NAME}")
    return name


def load_study(study_name: str | None, storage: str | None,
               run_dir: str | Path | None = None) -> optuna.Study:
    """Open an existing slabtune study (read side: pareto, plot, export)."""
    url, _ = resolve_storage(study_name, storage, run_dir, create=False)
    st = open_storage(url, create=False)
    if study_name is None:
        names = optuna.get_all_study_names(st)
        if len(names) != 1:
            raise SlabtuneError(f"study: {shown_url(url)} holds {len(names)} studies; pick one "
                                "with --study")
        study_name = names[0]
    try:
        study = optuna.load_study(study_name=study_name, storage=st)
    except KeyError:
        raise SlabtuneError(f"study: no study named {study_name!r} in {shown_url(url)}") from None
    except ValueError as err:   # a journal or database it cannot replay
        raise SlabtuneError(f"storage: {shown_url(url)!r}: unreadable: "
                            f"{scrub(_first_line(err), url)}") from None
    _check_stored_name(study.study_name, url)
    _check_readable(study, url)
    if not is_complete(study):
        raise SlabtuneError(_not_a_slabtune_study(study, url))
    check_stored_trials(study)
    return study


def _check_readable(study: optuna.Study, url: str) -> None:
    """The study's attributes and trials decode (Optuna raises KeyError or a JSON error on
    an edited distribution or attribute); else one line naming the storage."""
    try:
        _ = study.user_attrs
        study.get_trials(deepcopy=False)
    except (KeyError, ValueError, TypeError) as err:
        raise SlabtuneError(f"storage: {shown_url(url)!r}: study {study.study_name}: its stored "
                            f"attributes or trials do not decode (a damaged or edited "
                            f"database): {_first_line(err)}") from None


def check_stored_trials(study: optuna.Study) -> None:
    """A study read back holds what slabtune wrote: two objectives (memory, time), and in
    every complete trial two values and params that are knobs of its space, in range
    (:func:`_checked_params`).  A tampered or foreign study is one line naming the trial and
    the field, before pareto, plot or export reads it (they raised KeyError, IndexError)."""
    if len(study.directions) != len(OBJECTIVE_NAMES):
        raise SlabtuneError(f"study: {study.study_name} has {len(study.directions)} "
                            f"objectives; a slabtune study has {len(OBJECTIVE_NAMES)} "
                            f"({', '.join(OBJECTIVE_NAMES)})")
    spec = study_spec(study)
    for ft in study.get_trials(deepcopy=False,
                               states=(optuna.trial.TrialState.COMPLETE,)):
        if len(ft.values or ()) != len(OBJECTIVE_NAMES):
            raise SlabtuneError(f"trial {ft.number}: {len(ft.values or ())} objective values, "
                                f"not {len(OBJECTIVE_NAMES)} ({', '.join(OBJECTIVE_NAMES)})")
        _checked_params(spec, ft)
    for number, name, value in optuna_internals.stored_param_values(study) or ():
        if not value.is_integer():        # every knob is an integer: 2.5 would read as 2
            raise SlabtuneError(f"trial {number}: param {ascii(name)[:60]} = {value!r} is "
                                "stored as a fraction; every knob is an integer")


def _check_stored_name(name, url: str) -> None:
    """A study name read from a storage is a name slabtune could have created
    (:func:`check_study_name`): it reaches exported boot and system files, so one with
    newlines, quotes or shell metacharacters is refused, shown escaped and cut short."""
    try:
        check_study_name(name)
    except SlabtuneError:
        shown = ascii(name) if len(str(name)) <= 60 else ascii(str(name)[:60]) + "..."
        raise SlabtuneError(f"study: the study name stored in {shown_url(url)} ({shown}) is "
                            "not a plain name (letters, digits, '-', '_', '.'); refusing to read it"
                            ) from None


def is_complete(study: optuna.Study) -> bool:
    """Whether :func:`create_or_resume` finished creating the study: its spec and baseline
    are stored (a process killed in its first moments leaves a study without them)."""
    attrs = study.user_attrs
    return ATTR_SPEC in attrs and ATTR_BASELINE in attrs


def _not_a_slabtune_study(study: optuna.Study, url: str) -> str:
    """Why a study cannot be read: left incomplete by a killed ``tune`` (no trials, no or
    only some of slabtune's attrs) and how to finish or remove it, or made by another tool."""
    name = study.study_name
    attrs = study.user_attrs
    mine = [k for k in attrs if k.startswith("slabtune_")]
    if len(study.get_trials(deepcopy=False)) == 0 and (mine or not attrs):
        restart = shlex.join(["slabtune", "tune", "SPEC", "--study", name, "--storage",
                              shown_url(url)])
        return (f"study: {name!r} in {shown_url(url)} is incomplete: it was created, then its "
                "process stopped before slabtune tune stored its spec and baseline; finish "
                f"creating it with '{restart}' (SPEC: the spec it was started with) or remove "
                "it with optuna.delete_study")
    return f"study: {name!r} was not created by slabtune tune"


def study_spec(study: optuna.Study) -> TuneSpec:
    """The tune spec a study was created from, with the sweep spec its fleet came from as
    it was then (:data:`ATTR_FLEET_SWEEP`)."""
    return parse_spec(study.user_attrs[ATTR_SPEC],
                      study.user_attrs.get("slabtune_spec_name", "spec"),
                      study.user_attrs.get(ATTR_FLEET_SWEEP),
                      study.user_attrs.get(ATTR_COST), stored=True)


# --------------------------------------------------------------------------- running


def effective_params(params: Mapping[str, int], spec: TuneSpec) -> dict[str, int]:
    """Trial params as the kernel sees them: boot parameters applied in command-line order
    (min_order, max_order, min_objects) with the profile's setup_slub_* semantics, so a
    min_order above max_order is adjusted as v6.7+ kernels do (earlier kernels keep both).
    A SLAB profile's knobs reach the kernel as they are (slab_max_order is searched within
    the 0..10 slab_max_order_setup() keeps)."""
    out = dict(params)
    if profiles.is_slab(spec.fleet.profile):
        return out
    boot = {k: int(v) for k, v in params.items() if search_space.KNOBS[k].reach == "boot"}
    if boot:
        sp = bootparams.SlubParams()
        for suffix in bootparams.PARAM_SUFFIXES:
            key = f"slub_{suffix}"
            if key in boot:
                sp = bootparams.apply_param(sp, suffix, boot[key], spec.fleet.profile)
        for suffix, v in zip(bootparams.PARAM_SUFFIXES, sp):
            out[f"slub_{suffix}"] = int(v)
    return out


_EVALUATORS: dict[tuple[str, str, str | None], fleet_objectives.FleetEvaluator] = {}


def evaluator_for(spec: TuneSpec) -> fleet_objectives.FleetEvaluator:
    """One evaluator (one compiled model) per spec text and cost table in a process."""
    key = (spec.text, spec.objectives.name, spec.cost_text)
    if key not in _EVALUATORS:
        _EVALUATORS[key] = fleet_objectives.FleetEvaluator(spec.fleet, spec.objectives,
                                                           cost=spec.cost())
    return _EVALUATORS[key]


class StudyRunner:
    """A study bound to its spec and evaluator.

    Asking and telling go to an in-memory study (the study itself when its storage is in
    memory, else a mirror of it); each finished batch is then written to the study's own
    storage in one go (:func:`write_trials`).  Asking straight from an RDB or journal
    storage costs a dozen transactions (or fsyncs) per trial, and every ask re-reads the
    batch's still-running trials; the mirror makes it one transaction per batch.  A stored
    study may have other writers (``tune --workers``, a second ``tune``): the mirror takes
    in what they stored before each batch, and this runner's seed stream is its own
    (:func:`writer_seed`).

    A batch is asked and told through the sampler and storage interfaces that
    ``Study.ask``/``Study.tell`` use, in the same order (so the trials are those of a plain
    ask-B-then-tell-B loop with the same seed), without their per-trial bookkeeping: the
    relative search space is inferred once per batch (it depends only on finished trials,
    and none finish inside a batch), params are drawn for all knobs at once, and no
    ``Trial`` objects are built.
    """

    def __init__(self, spec: TuneSpec, study: optuna.Study,
                 evaluator: fleet_objectives.FleetEvaluator | None = None,
                 url: str | None = None, storage: optuna.storages.BaseStorage | None = None,
                 writer: str | None = None):
        self.spec = spec
        self.study = study
        self.url = url          # named by a write error (storage_writes)
        self.evaluator = evaluator or evaluator_for(spec)
        self.distributions = spec.space.distributions()
        #: Trials this runner added to the study, and asked candidates it skipped because a
        #: trial of the study (any writer's, its own included) already has their params.
        self.added = 0
        self.duplicates = 0
        self.writer = None
        self.seed = spec.space.seed
        self._storage = storage
        self._seen: set = set()
        self._stored_n = 0
        if optuna_internals.in_memory(study):
            self._asker = study
        else:
            # A stored study may have other writers (tune --workers, a second tune): each
            # draws from its own seed stream, and skips the params any writer stored.
            self.writer = writer or new_writer_id()
            self.seed = writer_seed(spec.space.seed, study.study_name, self.writer)
            self._asker = optuna.create_study(
                sampler=search_space.make_sampler(dataclasses.replace(spec.space,
                                                                      seed=self.seed)),
                directions=list(DIRECTIONS))
            self._sync(force=True)

    def evaluate(self, params_list) -> fleet_objectives.Evaluation:
        return self.evaluator.evaluate([effective_params(p, self.spec) for p in params_list])

    def ask_batch(self, k: int) -> list[optuna.trial.FrozenTrial]:
        """Create ``k`` running trials in the in-memory asker with sampled params, as ``k``
        calls of ``Study.ask(distributions)`` would (same sampler calls in the same order)."""
        return optuna_internals.ask_batch(self._asker, self.distributions, k)

    def tell_batch(self, trials, ev: fleet_objectives.Evaluation,
                   excess: np.ndarray | None) -> list:
        """Complete the asked ``trials`` with the batch's objectives, per-topology user attr
        and regression constraint (:mod:`slabtune.tuner.constraints`), as
        ``Trial.set_user_attr`` and ``Study.tell`` would; a non-finite objective fails the
        trial as ``Study.tell`` does.  Returns the finished trials."""
        user_attrs = [_trial_attrs(ev, i) for i in range(len(trials))]
        values = [[float(ev.memory[i]), float(ev.time[i])] for i in range(len(trials))]
        system = None if excess is None else [constraints.system_attrs(x) for x in excess]
        return optuna_internals.tell_batch(self._asker, trials, values, user_attrs, system)

    def record(self, params_list, ev: fleet_objectives.Evaluation,
               user_attrs=None) -> list[optuna.trial.FrozenTrial]:
        """Add finished trials for policies evaluated outside the sampler (the exhaustive
        front, the population search): ``params_list[i]`` (the searched knobs, or a subset
        of them) with row ``i`` of ``ev`` as its objectives and per-topology user attr,
        its regression constraint, and ``user_attrs[i]`` besides.  Built with
        ``optuna.trial.create_trial`` and the study's own distributions, written in one go
        (:func:`optuna_internals.write_trials`); a non-finite objective is a failed trial.
        Returns the trials."""
        constrained = self.spec.objectives.max_regression is not None
        excess = self.evaluator.regression_excess(ev) if constrained else None
        trials = []
        for i, params in enumerate(params_list):
            values = [float(ev.memory[i]), float(ev.time[i])]
            ok = all(np.isfinite(values))
            attrs = _trial_attrs(ev, i)
            if user_attrs is not None:
                attrs.update(user_attrs[i])
            trials.append(optuna.trial.create_trial(
                state=optuna.trial.TrialState.COMPLETE if ok else optuna.trial.TrialState.FAIL,
                values=values if ok else None, params=dict(params),
                distributions={k: self.distributions[k] for k in params},
                user_attrs=attrs,
                system_attrs=None if excess is None else constraints.system_attrs(excess[i])))
        if not trials:
            return trials
        if self._asker is self.study:
            self.study.add_trials(trials)
        else:
            with storage_writes(self.url):
                optuna_internals.write_trials(self.study, trials)
            self._asker.add_trials(trials)
            self._stored_n += len(trials)
            self._seen.update(params_key(t.params) for t in trials)
        self.added += len(trials)
        return trials

    def run(self, n_trials: int, batch: int = 64) -> int:
        """Ask ``batch`` trials, evaluate them in one model call, tell them back (and write
        them to the storage); repeat until ``n_trials`` more trials are complete.  Returns
        the number told."""
        if n_trials < 0:
            raise SlabtuneError(f"trials: {n_trials} is negative")
        if batch < 1:
            raise SlabtuneError(f"batch: {batch} must be at least 1")
        done = idle = 0
        constrained = self.spec.objectives.max_regression is not None
        while done < n_trials:
            k = min(batch, n_trials - done)
            trials = self.ask_batch(k)
            if self._asker is not self.study:
                self._sync()
                trials = self._skip_seen(trials)
                if not trials:
                    idle += 1
                    if idle >= MAX_IDLE_BATCHES:    # the sampler finds nothing new
                        break
                    continue
                idle = 0
            ev = self.evaluate([t.params for t in trials])
            excess = self.evaluator.regression_excess(ev) if constrained else None
            told = self.tell_batch(trials, ev, excess)
            if self._asker is not self.study:
                with storage_writes(self.url):
                    optuna_internals.write_trials(self.study, told)
                self._stored_n += len(told)
            done += len(trials)
        self.added += done
        return done

    def _sync(self, force: bool = False) -> None:
        """Mirror the finished trials other writers stored since the last look (all of
        them when ``force``): the sampler learns from them and their params count as
        seen.  Trial numbers of a study run 0, 1, ... in the order trials are stored, so
        the new ones are read by number from :attr:`_stored_n` on; without another
        writer this is one lookup of a number not yet there."""
        if force or self._storage is None:
            stored = self.study.get_trials(deepcopy=False)
        else:
            st, stored = self._storage, []
            sid = st.get_study_id_from_name(self.study.study_name)
            while True:
                try:
                    tid = st.get_trial_id_from_study_id_trial_number(sid, self._stored_n
                                                                     + len(stored))
                except KeyError:
                    break
                stored.append(st.get_trial(tid))
            if not stored:
                return
        self._stored_n = (stored[-1].number + 1) if stored else self._stored_n
        new = []
        for t in stored:
            key = params_key(t.params)
            if t.state in _FINISHED and key not in self._seen:
                self._seen.add(key)
                new.append(t)
        if new:
            self._asker.add_trials(new)

    def _skip_seen(self, trials: list) -> list:
        """The asked ``trials`` whose params no stored trial and no earlier one of the
        batch has; the others are counted in :attr:`duplicates` and failed in the mirror
        (so the sampler asks again), never evaluated or stored."""
        keep = []
        for t in trials:
            key = params_key(t.params)
            if key in self._seen:
                self.duplicates += 1
                self._asker.tell(t.number, state=optuna.trial.TrialState.FAIL)
            else:
                self._seen.add(key)
                keep.append(t)
        return keep


#: A stored study's writer gives up after this many batches in a row whose every candidate
#: was already stored (a small space the sampler has covered).
MAX_IDLE_BATCHES = 8


def params_key(params: Mapping) -> tuple:
    """A trial's params as a hashable key: two trials with equal keys are the same
    candidate."""
    return tuple(sorted(params.items()))


def new_writer_id() -> str:
    """A nonce naming one writer of a stored study (a process, a Ray worker)."""
    return os.urandom(6).hex()


def writer_seed(seed: int | None, study_name: str, writer: str) -> int | None:
    """The sampler seed of one writer of a stored study: ``[search] seed``, the study name
    and the writer's nonce hashed (SHA-256) into 0..2^32-1, numpy's RandomState range, so
    writers of one study draw different streams; an unseeded space stays unseeded."""
    if seed is None:
        return None
    digest = hashlib.sha256(f"{seed}\0{study_name}\0{writer}".encode()).digest()
    return int.from_bytes(digest[:4], "little")


_FINISHED = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED,
             optuna.trial.TrialState.FAIL)


def _baseline_attr(ev: fleet_objectives.Evaluation) -> dict:
    return {"memory": float(ev.memory[0]), "time": float(ev.time[0]),
            "memory_topo": [float(x) for x in ev.memory_topo[0]],
            "time_topo": [float(x) for x in ev.time_topo[0]]}


def default_study_name(spec: TuneSpec) -> str:
    return f"{spec.name}-{_dt.datetime.now(_dt.UTC).strftime('%Y%m%d-%H%M%S')}"


def create_or_resume(spec: TuneSpec, study_name: str | None, storage: str | None,
                     run_dir: str | Path | None = None,
                     evaluator: fleet_objectives.FleetEvaluator | None = None,
                     writer: str | None = None) -> tuple[StudyRunner, str]:
    """Create a study (or resume the one called ``study_name``) and return its runner and
    storage URL.  Resuming requires the same spec the study was created with.  ``writer``
    names this writer of a stored study (its seed stream, :func:`writer_seed`); by default a
    fresh nonce, so a stored study's trials differ from run to run."""
    name = check_study_name(study_name) if study_name else default_study_name(spec)
    url, _rd = resolve_storage(name, storage, run_dir, create=True)
    st = open_storage(url, create=True)
    sampler = search_space.make_sampler(spec.space)
    optuna.logging.set_verbosity(logging.WARNING)
    try:
        study = optuna.create_study(study_name=name, storage=st, sampler=sampler,
                                    directions=list(DIRECTIONS), load_if_exists=True)
    except Exception as err:  # noqa: BLE001 - storage backends fail in many ways
        raise SlabtuneError(f"storage: {shown_url(url)!r}: "
                            f"{scrub(_first_line(err), url)}") from None
    if [d.name.lower() for d in study.directions] != list(DIRECTIONS):
        raise SlabtuneError(f"study: {name!r} exists with other directions")
    stored = study.user_attrs.get(ATTR_SPEC)
    if stored is not None and stored != spec.text:
        raise SlabtuneError(f"study: {name!r} was created with a different spec; "
                            "resume it with the same spec file")
    if is_complete(study) and study.user_attrs.get(ATTR_COST) != spec.cost_text:
        raise SlabtuneError(f"objectives.cost: {spec.objectives.cost} is not the cost file "
                            f"study {name!r} was created with (its text changed)")
    evaluator = evaluator or evaluator_for(spec)
    new = stored is None or not is_complete(study)   # new, or created by a killed process
    baseline = _baseline_attr(evaluator.baseline) if new else None   # before any write
    with storage_writes(url):
        if new:
            study.set_user_attr(ATTR_SPEC, spec.text)
            study.set_user_attr("slabtune_spec_name", spec.name)
            if spec.fleet_sweep is not None:
                study.set_user_attr(ATTR_FLEET_SWEEP, spec.fleet_sweep)
            if spec.cost_text is not None:
                study.set_user_attr(ATTR_COST, spec.cost_text)
            study.set_user_attr(ATTR_PROFILE, spec.fleet.profile.name)
            study.set_user_attr(ATTR_TOPOLOGIES, list(spec.fleet.topology_names))
            study.set_user_attr(ATTR_BASELINE, baseline)
            study.set_user_attr("slabtune_objectives", {
                "set": spec.objectives.name, "max_regression": spec.objectives.max_regression,
                "cost": spec.objectives.cost or "packaged", "names": list(OBJECTIVE_NAMES)})
        if not study.metric_names:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                study.set_metric_names(list(OBJECTIVE_NAMES))
    return StudyRunner(spec, study, evaluator, url, storage=st, writer=writer), url


def get_trial(study: optuna.Study, number: int) -> optuna.trial.FrozenTrial:
    """A complete trial by number; unknown or unfinished trials raise one line."""
    for t in study.get_trials(deepcopy=False):
        if t.number == number:
            if t.state != optuna.trial.TrialState.COMPLETE:
                raise SlabtuneError(f"trial: {number} is {t.state.name.lower()}, not complete")
            return t
    raise SlabtuneError(f"trial: no trial {number} in study {study.study_name!r}")


def _gains(study: optuna.Study, ft: optuna.trial.FrozenTrial) -> dict:
    """Per-topology gains of a trial against the study's baseline (fractions, + = better)."""
    b = study.user_attrs[ATTR_BASELINE]
    topos = study.user_attrs[ATTR_TOPOLOGIES]
    topo = ft.user_attrs.get(ATTR_TOPO, {})
    mt, tt = topo.get("memory", []), topo.get("time", [])
    return {name: {"memory": 1.0 - mt[i] / b["memory_topo"][i],
                   "time": 1.0 - tt[i] / b["time_topo"][i]}
            for i, name in enumerate(topos) if i < len(mt) and i < len(tt)}


def _slab_candidate(study: optuna.Study, number: int, ft, spec: TuneSpec, eff):
    """:func:`candidate` of a SLAB study: ``slab_max_order`` as its boot parameter when it
    differs from the default, and, when a tunable was searched, each fleet cache's
    (limit, batchcount, shared) as /proc/slabinfo takes them (the fleet's first topology,
    like SLUB's sysfs values)."""
    from slabtune.results import export
    from slabtune.tuner import slab_objectives

    base = search_space.baseline_values(spec.fleet.profile)
    boot = {k: int(eff[k]) for k in ft.params
            if search_space.SLAB_KNOBS[k].reach == "boot" and int(eff[k]) != base[k]}
    slabinfo: dict[str, tuple[int, int, int]] = {}
    if set(ft.params) & set(slab.SLAB_TUNABLES):
        vals = dict(base) | {k: int(v) for k, v in eff.items()}
        structs = slab_objectives.policy_structures(
            spec.fleet, {k: np.array([v]) for k, v in vals.items()})[0][0]
        for c, st in zip(spec.fleet.caches, structs):
            if st is None:
                raise SlabtuneError(f"trial {number}: the kernel refuses its tunables for "
                                    f"cache {c.name} (batchcount above limit)")
            slabinfo[c.name] = (st.limit, st.batchcount, st.shared)
    b = study.user_attrs[ATTR_BASELINE]
    return export.ExportedPolicy(study=study.study_name, trial=number, profile=spec.fleet.profile,
                                 memory=float(ft.values[0]), time=float(ft.values[1]),
                                 baseline={"memory": b["memory"], "time": b["time"]},
                                 boot=boot, sysfs={}, kernel_change=(), gains=_gains(study, ft),
                                 params={k: int(v) for k, v in ft.params.items()},
                                 slabinfo=slabinfo)


def as_json(obj) -> str:
    return json.dumps(obj, indent=2, sort_keys=False, default=lambda o: np.asarray(o).tolist())


def _checked_params(spec: TuneSpec, ft: optuna.trial.FrozenTrial) -> dict[str, int]:
    """A stored trial's params, each a knob of the study's space holding an integer in its
    range; a tampered trial is one line naming the trial and the param."""
    dists = spec.space.distributions()
    out = {}
    for k, v in ft.params.items():
        if k not in dists:
            raise SlabtuneError(f"trial {ft.number}: param {ascii(k)[:60]} is not a knob the "
                                f"study searches ({', '.join(dists)})")
        d = dists[k]
        ok = not isinstance(v, bool) and (isinstance(v, int)
                                          or isinstance(v, float) and v.is_integer())
        if ok and isinstance(d, optuna.distributions.CategoricalDistribution):
            ok = int(v) in d.choices
        elif ok:
            ok = d.low <= int(v) <= d.high and (int(v) - d.low) % d.step == 0
        if not ok:
            raise SlabtuneError(f"trial {ft.number}: param {k} = {ascii(v)[:40]} is outside "
                                "the study's range for it")
        out[k] = int(v)
    return out


def deploy(spec: TuneSpec, params_list) -> list:
    """:class:`slabtune.tuner.reach.Deploy` (live and inert changed knobs, reach, settings)
    of trial params, boot parameters taken as the kernel applies them."""
    from slabtune.tuner import reach

    return reach.deploy_of(spec.fleet, [effective_params(p, spec) for p in params_list])


def front_report(study: optuna.Study) -> dict:
    """:func:`slabtune.results.pareto.study_pareto` with each point's reach, the settings
    it changes under their kernel names (and the legend of those names), its changed and
    inert knobs; points with equal objectives collapsed to the one changing the fewest
    knobs.  ``front_reach`` gives the reach of every front trial, collapsed ones included."""
    from slabtune.results import pareto

    spec = study_spec(study)
    seen: dict[int, dict] = {}

    def annotate(points):
        got = deploy(spec, [p["params"] for p in points])
        for p, d in zip(points, got):
            seen[p["trial"]] = d.as_dict()
        return seen

    rep = pareto.study_pareto(study, annotate)
    rep["legend"] = search_space.legend(spec.fleet.profile)
    rep["front_reach"] = {t: d["reach"] for t, d in seen.items()}
    rep["search_reach"] = spec.space.reach
    return rep


def candidate(study: optuna.Study, number: int):
    """Everything :mod:`slabtune.results.export` needs about trial ``number``: effective boot
    parameters that differ from the kernel defaults, per-cache sysfs values of the searched
    sysfs knob families (from the model), the live knobs that need a kernel change (a knob
    set to no effect on the fleet, :mod:`slabtune.tuner.reach`, is not one), its reach and
    gains.  Params a study does not search, or out of range, are refused."""
    from slabtune.results import export

    spec = study_spec(study)
    ft = get_trial(study, number)
    params = _checked_params(spec, ft)
    eff = effective_params(params, spec)
    dep = deploy(spec, [params])[0]
    profile = spec.fleet.profile
    if profiles.is_slab(profile):
        return dataclasses.replace(_slab_candidate(study, number, ft, spec, eff),
                                   reach=dep.reach)
    base = search_space.baseline_values(profile)
    boot = {k: int(eff[k]) for k in search_space.KNOBS if search_space.KNOBS[k].reach == "boot"
            and k in eff and int(eff[k]) != base[k]}
    searched = set(params)
    per_cache = None
    sysfs: dict[str, dict[str, int]] = {}
    for attr, family in export.SYSFS_FAMILIES.items():
        if not searched & set(family):
            continue
        if attr == "cpu_partial" and not profile.has_cpu_partial:
            continue
        if per_cache is None:
            per_cache = fleet_objectives.cache_values(spec.fleet, eff)
        for cache, vals in per_cache.items():
            sysfs.setdefault(cache, {})[attr] = vals[attr]
    kernel = tuple(export.KernelChange(k, int(eff[k]), base[k], search_space.KNOBS[k].doc)
                   for k in dep.live if search_space.KNOBS[k].reach == "kernel")
    b = study.user_attrs[ATTR_BASELINE]
    gains = _gains(study, ft)
    return export.ExportedPolicy(study=study.study_name, trial=number, profile=profile,
                       memory=float(ft.values[0]), time=float(ft.values[1]),
                       baseline={"memory": b["memory"], "time": b["time"]}, boot=boot,
                       sysfs=sysfs, kernel_change=kernel, gains=gains,
                       params=params, reach=dep.reach)

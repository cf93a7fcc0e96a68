"""The only module that leans on Optuna's private interfaces: batched ask, tell and write.

A tune batch asks B trials, evaluates them in one model call and writes them in one go.
Optuna's public API does each of those one trial at a time (``Study.ask``, ``Study.tell``,
``Study.add_trials``), with a storage round trip per param and attr.  The functions here do
the same steps through the sampler and storage interfaces those methods use, which are not
public: ``Study._storage``, ``Study._study_id``, ``Study._thread_local``,
``BaseGASampler._get_generation_key``, ``distributions._get_single_value``,
``BaseDistribution._contains``, the journal storage's ``_backend``, ``_replay_result``,
``_thread_lock``, ``_sync_with_backend`` and ``JournalStorageReplayResult`` (its
``_apply_*`` hooks, ``_trials``, ``_study_id_to_trial_ids``), and the RDB models and scoped
session.  :func:`check` names each of them; tests/test_optuna_internals.py runs it and
round-trips batches through every storage kind, so an Optuna release that moves one fails
there, loudly, before it corrupts a study.  pyproject.toml bounds Optuna to the releases
those tests cover.  Constraints are not among them: they are stored and read through
Optuna's public trial attributes (:mod:`slabtune.tuner.constraints`).
"""

from __future__ import annotations

import datetime as _dt
import json
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import optuna

#: Optuna releases the tests of this module were run against (pyproject.toml's bound).
TESTED = ">=5.0,<5.1"


def check() -> None:
    """Raise RuntimeError naming the first private Optuna interface this module uses that
    the installed Optuna lacks."""
    need = [
        (optuna.distributions, "_get_single_value"),
        (optuna.distributions.BaseDistribution, "_contains"),
        (optuna.samplers.BaseGASampler, "_get_generation_key"),
        (optuna.storages.JournalStorage, "_sync_with_backend"),
    ]
    for owner, name in need:
        if not hasattr(owner, name):
            raise RuntimeError(f"optuna {optuna.__version__}: {owner.__name__}.{name} is gone; "
                               f"slabtune.tuner.optuna_internals was written for {TESTED}")
    try:
        from optuna.storages._rdb import models
        from optuna.storages._rdb.storage import _create_scoped_session  # noqa: F401
    except ImportError as err:
        raise RuntimeError(f"optuna {optuna.__version__}: {err}; "
                           f"slabtune.tuner.optuna_internals was written for {TESTED}") from None
    for model in ("StudyModel", "TrialModel", "TrialParamModel", "TrialValueModel",
                  "TrialUserAttributeModel", "TrialSystemAttributeModel"):
        if not hasattr(models, model):
            raise RuntimeError(f"optuna {optuna.__version__}: _rdb.models.{model} is gone")
    with tempfile.TemporaryDirectory() as tmp:
        storage = optuna.storages.JournalStorage(
            optuna.storages.journal.JournalFileBackend(str(Path(tmp) / "check.log")))
        study = optuna.create_study(storage=storage)
        for attr in ("_storage", "_study_id", "_thread_local"):
            if not hasattr(study, attr):
                raise RuntimeError(f"optuna {optuna.__version__}: Study.{attr} is gone")
        for attr in ("_backend", "_replay_result", "_thread_lock"):
            if not hasattr(storage, attr):
                raise RuntimeError(f"optuna {optuna.__version__}: JournalStorage.{attr} is gone")
        replay = storage._replay_result
        for attr in ("_apply_create_trial", "_apply_set_trial_param", "_trials",
                     "_study_id_to_trial_ids"):
            if not hasattr(replay, attr):
                raise RuntimeError(f"optuna {optuna.__version__}: "
                                   f"JournalStorageReplayResult.{attr} is gone")


def in_memory(study: optuna.Study) -> bool:
    """Whether ``study`` keeps its trials in memory (so it can be asked directly)."""
    return isinstance(study._storage, optuna.storages.InMemoryStorage)


def ask_batch(study: optuna.Study,
              distributions: Mapping[str, optuna.distributions.BaseDistribution],
              k: int) -> list[optuna.trial.FrozenTrial]:
    """Create ``k`` running trials in ``study`` (in-memory) with sampled params, as ``k``
    calls of ``Study.ask(distributions)`` would: the same sampler calls in the same order,
    without building ``Trial`` objects.  The relative search space is inferred once per
    batch (it depends only on finished trials, and none finish inside a batch)."""
    storage, sid, sampler = study._storage, study._study_id, study.sampler
    out, space, generation = [], None, None
    ga = isinstance(sampler, optuna.samplers.BaseGASampler)
    for _ in range(k):
        study._thread_local.cached_all_trials = None   # Study.ask: re-read once a trial
        tid = storage.create_new_trial(sid)
        if generation is not None:
            # a GA sampler's generation of a new trial depends only on finished trials
            # (BaseGASampler.get_trial_generation), so it is the batch's first trial's;
            # stored as the sampler stores it instead of rescanning every trial
            storage.set_trial_system_attr(tid, sampler._get_generation_key(), generation)
        ft = storage.get_trial(tid)
        sampler.before_trial(study, ft)
        if space is None:
            space = sampler.infer_relative_search_space(study, ft)
        rel = sampler.sample_relative(study, ft, space)
        if ga and generation is None:
            generation = sampler.get_trial_generation(study, storage.get_trial(tid))
        for name, dist in distributions.items():
            if dist.single():
                value = optuna.distributions._get_single_value(dist)
            elif name in rel and dist._contains(dist.to_internal_repr(rel[name])):
                value = rel[name]
            else:
                value = sampler.sample_independent(study, ft, name, dist)
            storage.set_trial_param(tid, name, dist.to_internal_repr(value), dist)
        out.append(storage.get_trial(tid))
    return out


def tell_batch(study: optuna.Study, trials: Sequence[optuna.trial.FrozenTrial],
               values: Sequence[Sequence[float]], user_attrs: Sequence[Mapping],
               system_attrs: Sequence[Mapping] | None = None) -> list:
    """Complete the asked ``trials`` of ``study`` (in-memory) with their objective
    ``values``, user attrs and (optionally) system attrs (a trial's constraints,
    :mod:`slabtune.tuner.constraints`), as ``Trial.set_user_attr`` and ``Study.tell`` would;
    a non-finite objective fails the trial as ``Study.tell`` does.  Returns the finished
    trials."""
    storage, sampler = study._storage, study.sampler
    done = []
    for i, ft in enumerate(trials):
        study._thread_local.cached_all_trials = None   # as Study.tell
        tid = ft._trial_id
        for k, v in user_attrs[i].items():
            storage.set_trial_user_attr(tid, k, v)
        for k, v in (system_attrs[i] if system_attrs is not None else {}).items():
            storage.set_trial_system_attr(tid, k, v)
        vals = [float(v) for v in values[i]]
        state = optuna.trial.TrialState.COMPLETE
        if not all(np.isfinite(vals)):
            state, vals = optuna.trial.TrialState.FAIL, None
        sampler.after_trial(study, storage.get_trial(tid), state, vals)
        storage.set_trial_state_values(tid, state, vals)
        done.append(storage.get_trial(tid))
    return done


def write_trials(study: optuna.Study, trials) -> None:
    """Add finished trials to ``study``'s storage in one write where the backend allows it:
    one transaction for an RDB, one append (one lock, one fsync) for a journal file; the
    rows and log records are Optuna's own (``add_trial``'s), only grouped.  Other storages
    get ``Study.add_trials``."""
    trials = list(trials)
    if not trials:
        return
    storage = study._storage
    rdb = getattr(storage, "_backend", None)   # Optuna wraps an RDBStorage in a cache
    if isinstance(storage, optuna.storages.JournalStorage):
        _write_journal(storage, study._study_id, trials)
    elif isinstance(rdb, optuna.storages.RDBStorage):
        _write_rdb(rdb, study._study_id, trials)
    else:
        study.add_trials(trials)


def _write_rdb(storage: optuna.storages.RDBStorage, study_id: int, trials) -> None:
    """All ``trials`` in one transaction with one multi-row INSERT per table, into the rows
    RDBStorage.create_new_trial writes for a template trial (its models, its value and
    distribution encodings).  create_new_trial itself looks up every param and attr row
    before writing it: a dozen round trips per trial that a batch of new trials does not
    need."""
    import sqlalchemy as sa
    from optuna.storages._rdb import models
    from optuna.storages._rdb.storage import _create_scoped_session

    def utc(d):   # RDBStorage keeps naive UTC (models.TrialModel.datetime_start)
        return None if d is None else d.astimezone(_dt.UTC).replace(tzinfo=None)

    with _create_scoped_session(storage.scoped_session) as session:
        models.StudyModel.find_or_raise_by_id(study_id, session, for_update=True)
        # Rows first, numbered -1, -2, ...: the INSERT takes the database's write lock
        # (SQLite's driver begins the transaction only there, so a count read before it
        # could be stale and two writers would store the same trial numbers), then the
        # trials already stored are counted and the numbers set.
        session.execute(sa.insert(models.TrialModel), [
            {"number": -1 - i, "study_id": study_id, "state": t.state,
             "_datetime_start_utc": utc(t.datetime_start),
             "_datetime_complete_utc": utc(t.datetime_complete)}
            for i, t in enumerate(trials)])
        first = session.scalar(sa.select(sa.func.count(models.TrialModel.trial_id))
                               .where(models.TrialModel.study_id == study_id,
                                      models.TrialModel.number >= 0))
        temp = dict(session.execute(
            sa.select(models.TrialModel.number, models.TrialModel.trial_id)
            .where(models.TrialModel.study_id == study_id,
                   models.TrialModel.number < 0)).all())
        ids = {first + i: temp[-1 - i] for i in range(len(trials))}
        session.execute(sa.update(models.TrialModel), [
            {"trial_id": tid, "number": n} for n, tid in ids.items()])
        params, values, uattrs, sattrs = [], [], [], []
        for i, t in enumerate(trials):
            tid = ids[first + i]
            for name, value in t.params.items():
                dist = t.distributions[name]
                params.append({"trial_id": tid, "param_name": name,
                               "param_value": dist.to_internal_repr(value),
                               "distribution_json":
                                   optuna.distributions.distribution_to_json(dist)})
            for obj, v in enumerate(t.values or ()):
                stored, kind = models.TrialValueModel.value_to_stored_repr(v)
                values.append({"trial_id": tid, "objective": obj, "value": stored,
                               "value_type": kind})
            uattrs += [{"trial_id": tid, "key": k, "value_json": json.dumps(v)}
                       for k, v in t.user_attrs.items()]
            sattrs += [{"trial_id": tid, "key": k, "value_json": json.dumps(v)}
                       for k, v in t.system_attrs.items()]
        for model, rows in ((models.TrialParamModel, params), (models.TrialValueModel, values),
                            (models.TrialUserAttributeModel, uattrs),
                            (models.TrialSystemAttributeModel, sattrs)):
            if rows:
                session.execute(sa.insert(model), rows)


class _LogBuffer:
    """A journal backend stand-in that keeps appended log records (see _write_journal)."""

    def __init__(self):
        self.logs: list[dict] = []

    def append_logs(self, logs) -> None:
        self.logs.extend(logs)

    def read_logs(self, log_number_from: int):
        return iter(())


def _write_journal(storage, study_id: int, trials) -> None:
    """All ``trials`` in one journal append: JournalStorage.create_new_trial builds each
    record (into a buffer), then the records go to the file under one lock and one fsync
    and are replayed once.  Single writer: the storage must not be used by another thread
    meanwhile."""
    backend = storage._backend
    buf = _LogBuffer()
    replay = storage._replay_result
    if not hasattr(replay, "_last_created_trial_id_by_this_process"):
        # create_new_trial reads the id of the last trial it replayed; none is replayed
        # while records go to the buffer, and the id is not used here
        replay._last_created_trial_id_by_this_process = -1
    storage._backend = buf
    try:
        for t in trials:
            storage.create_new_trial(study_id, template_trial=t)
    finally:
        storage._backend = backend
    backend.append_logs(buf.logs)
    with storage._thread_lock:
        storage._sync_with_backend()


def stored_param_values(study: optuna.Study) -> list[tuple[int, str, float]] | None:
    """``(trial number, param name, stored value)`` of every param of ``study`` as its
    storage holds it (the internal float): read from the RDB's rows, or replayed from a
    journal's records (:func:`_journal_param_values`); None for another storage.  Reading a
    trial, Optuna turns an IntDistribution's stored value into ``int(value)``
    (``IntDistribution.to_external_repr``), so a value edited to 2.5 reads back as 2: only
    the stored value shows the edit."""
    import sqlalchemy as sa
    from optuna.storages._rdb import models
    from optuna.storages._rdb.storage import _create_scoped_session

    if isinstance(study._storage, optuna.storages.JournalStorage):
        return _journal_param_values(study._storage, study._study_id)
    rdb = getattr(study._storage, "_backend", None)
    if not isinstance(rdb, optuna.storages.RDBStorage):
        return None
    with _create_scoped_session(rdb.scoped_session) as session:
        rows = session.execute(
            sa.select(models.TrialModel.number, models.TrialParamModel.param_name,
                      models.TrialParamModel.param_value)
            .join(models.TrialParamModel,
                  models.TrialParamModel.trial_id == models.TrialModel.trial_id)
            .where(models.TrialModel.study_id == study._study_id)).all()
    return [(int(n), str(k), float(v)) for n, k, v in rows]


def _journal_param_values(storage, study_id: int) -> list[tuple[int, str, float]]:
    """The params of study ``study_id`` as a journal storage's records hold them: its log
    is replayed again (``_backend.read_logs(0)``) by Optuna's own
    ``JournalStorageReplayResult``, noting the internal value each applied record carries:
    ``params`` of a CREATE_TRIAL record (``create_new_trial`` with a template trial, what
    :func:`write_trials` appends) and ``param_value_internal`` of a SET_TRIAL_PARAM one
    (``set_trial_param``).  Records the replay skips (a finished trial's, an incompatible
    distribution) are skipped here too, so the values are those of the trials Optuna reads.
    The replay's worker id is new, so no record counts as this process's own."""
    import uuid

    from optuna.storages.journal._storage import JournalStorageReplayResult

    raw: dict[int, dict[str, object]] = {}     # trial id -> param -> stored value

    class _Raw(JournalStorageReplayResult):
        def _apply_create_trial(self, log):
            tid = len(self._trials)
            super()._apply_create_trial(log)
            if tid in self._trials:
                raw[tid] = dict(log.get("params") or {})

        def _apply_set_trial_param(self, log):
            tid = log["trial_id"]
            before = self._trials.get(tid)
            super()._apply_set_trial_param(log)
            if self._trials.get(tid) is not before:    # applied: the trial was replaced
                raw.setdefault(tid, {})[log["param_name"]] = log["param_value_internal"]

    replay = _Raw(f"slabtune-check-{uuid.uuid4()}-")
    with storage._thread_lock:
        replay.apply_logs(storage._backend.read_logs(0))
    out = []
    for tid in replay._study_id_to_trial_ids.get(study_id, ()):
        number = replay._trials[tid].number
        for name, value in raw.get(tid, {}).items():
            try:
                out.append((int(number), str(name), float(value)))
            except (TypeError, ValueError):   # Optuna's own read refuses these first
                continue
    return out

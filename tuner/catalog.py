"""The tune studies a user has: each study of a storage with its trial counts, and the
studies of every tune run directory (``<out>/<study>/study.db``) for ``results list``, and
every trial of one study as a frame for ``results export``.

Read only: a storage is opened as the read commands open it (:func:`study.open_storage`
with ``create=False``), an empty ``study.db`` (a ``tune`` killed before it wrote anything)
is reported, not opened (Optuna would create its tables in it).
"""

from __future__ import annotations

from pathlib import Path

import optuna
import polars as pl

from slabtune.errors import SlabtuneError
from slabtune.tuner import space as search_space
from slabtune.tuner import study as studies

_STATES = {s: s.name.lower() for s in optuna.trial.TrialState}


def storage_studies(url: str) -> list[dict]:
    """One summary per study of the storage at ``url``: name, trials (all), trial counts by
    state, Pareto-front size, the spec and kernel profile it was created with (None for a
    study another tool made) and the storage as messages show it (password masked)."""
    st = studies.open_storage(url, create=False)
    out = []
    for name in sorted(optuna.get_all_study_names(st)):
        study = optuna.load_study(study_name=name, storage=st)
        trials = study.get_trials(deepcopy=False)
        counts: dict[str, int] = {}
        for t in trials:
            counts[_STATES[t.state]] = counts.get(_STATES[t.state], 0) + 1
        attrs = study.user_attrs
        complete = counts.get("complete", 0)
        out.append({
            "kind": "study", "study": name, "storage": studies.shown_url(url),
            "trials": len(trials), "states": counts,
            "front": len(study.best_trials) if complete and len(study.directions) > 1 else 0,
            "spec": attrs.get("slabtune_spec_name"), "profile": attrs.get(studies.ATTR_PROFILE),
            "slabtune": studies.is_complete(study),
        })
    return out


def run_dir_studies(out_dir) -> list[tuple[dict | None, str | None]]:
    """The studies of every tune run directory under ``out_dir`` (a directory holding
    ``study.db``), by directory name: ``(summary, None)`` per study, or ``(None, "DIR:
    what is wrong")`` for a database that cannot be read, so one damaged study never hides
    the others."""
    out = Path(out_dir)
    if not out.is_dir():
        return []
    rows: list[tuple[dict | None, str | None]] = []
    for d in sorted(out.iterdir()):
        db = d / studies.DB_NAME
        if not d.is_dir() or not (db.exists() or db.is_symlink()):
            continue
        try:
            if db.is_file() and db.stat().st_size == 0:
                raise SlabtuneError("empty study database (a tune stopped before its "
                                    "first write)")
            found = storage_studies(studies.default_storage_url(d))
        except SlabtuneError as err:
            rows.append((None, f"{d}: {str(err).removeprefix('storage: ')}"))
            continue
        except Exception as err:  # noqa: BLE001 - a database Optuna cannot read, any way
            why = (str(err).strip().splitlines() or [type(err).__name__])[0]
            rows.append((None, f"{d}: {studies.DB_NAME} is unreadable: {why}"))
            continue
        rows += [(dict(r, run_dir=str(d)), None) for r in found]
    return rows


def trials_frame(study: optuna.Study) -> tuple[pl.DataFrame, dict[str, str]]:
    """Every trial of a slabtune study as one row (``results export``), and the knob
    columns' meanings (knob -> what it sets).  Columns: trial, state, one per knob of the
    study's space (null where a trial did not set it: the exhaustive and population
    searches record subspaces), memory, time, ``memory@T`` and ``time@T`` for each fleet
    topology T, regression_excess and feasible, pareto, reach (of complete trials; null
    for the others) and not_steady.  Units: :mod:`slabtune.results.columns`."""
    spec = studies.study_spec(study)
    knobs = list(spec.space.distributions())
    topos = list(study.user_attrs.get(studies.ATTR_TOPOLOGIES) or [])
    trials = study.get_trials(deepcopy=False)
    complete = [t for t in trials if t.state == optuna.trial.TrialState.COMPLETE]
    front = {t.number for t in study.best_trials} if complete else set()
    reach = {}
    if complete:
        got = studies.deploy(spec, [dict(t.params) for t in complete])
        reach = {t.number: d.reach for t, d in zip(complete, got)}
    data: dict[str, list] = {c: [] for c in ("trial", "state", *knobs, "memory", "time")}
    for prefix in ("memory", "time"):
        for name in topos:
            data[f"{prefix}@{name}"] = []
    for c in ("regression_excess", "feasible", "pareto", "reach", "not_steady"):
        data[c] = []
    for t in trials:
        ok = t.state == optuna.trial.TrialState.COMPLETE and t.values is not None
        data["trial"].append(t.number)
        data["state"].append(_STATES[t.state])
        for k in knobs:
            v = t.params.get(k)
            data[k].append(None if v is None else int(v))
        data["memory"].append(float(t.values[0]) if ok else None)
        data["time"].append(float(t.values[1]) if ok else None)
        per = t.user_attrs.get(studies.ATTR_TOPO) or {}
        for prefix in ("memory", "time"):
            vals = per.get(prefix) if isinstance(per, dict) else None
            for i, name in enumerate(topos):
                ok_v = isinstance(vals, list) and i < len(vals)
                data[f"{prefix}@{name}"].append(float(vals[i]) if ok_v else None)
        cons = t.constraints
        excess = max(cons.values()) if cons else None
        data["regression_excess"].append(None if excess is None else float(excess))
        data["feasible"].append(excess is None or excess <= 0)
        data["pareto"].append(t.number in front)
        data["reach"].append(reach.get(t.number))
        data["not_steady"].append(t.user_attrs.get(studies.ATTR_NOT_STEADY))
    schema = {"trial": pl.Int64, "state": pl.String, **{k: pl.Int64 for k in knobs},
              **{c: pl.Float64 for c in data if c in ("memory", "time", "regression_excess")
                 or "@" in c},
              "feasible": pl.Boolean, "pareto": pl.Boolean, "reach": pl.String,
              "not_steady": pl.String}
    table = search_space.knobs_for(spec.fleet.profile)
    docs = {k: table[k].doc for k in knobs}
    return pl.DataFrame(data, schema={c: schema[c] for c in data}), docs

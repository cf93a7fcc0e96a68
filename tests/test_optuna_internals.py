"""The private Optuna interfaces slabtune.tuner.optuna_internals leans on: present, and
behaving like the public API they stand in for.  An Optuna release that moves one fails
here first; pyproject.toml bounds Optuna to the releases these tests were run against."""

from __future__ import annotations

import optuna
import pytest
from packaging.specifiers import SpecifierSet

from slabtune.tuner import constraints, optuna_internals

DISTS = {
    "order": optuna.distributions.IntDistribution(0, 4),
    "objects": optuna.distributions.IntDistribution(4, 64, step=4),
    "fixed": optuna.distributions.IntDistribution(3, 3),
    "scale": optuna.distributions.FloatDistribution(0.5, 2.0),
}


def _objectives(params: dict) -> list[float]:
    return [float((params["order"] - 2) ** 2 + params["scale"]),
            float(params["objects"] / (1 + params["order"]))]


def _sampler(kind: str):
    if kind == "nsga2":
        return optuna.samplers.NSGAIISampler(seed=7, population_size=8)
    return optuna.samplers.TPESampler(seed=7, n_startup_trials=4)


def test_installed_optuna_is_the_tested_range_and_has_every_private_interface():
    assert optuna.__version__ in SpecifierSet(optuna_internals.TESTED)
    optuna_internals.check()


def test_check_names_a_missing_interface(monkeypatch):
    monkeypatch.delattr(optuna.distributions, "_get_single_value")
    with pytest.raises(RuntimeError, match="_get_single_value is gone"):
        optuna_internals.check()


@pytest.mark.parametrize("kind", ["nsga2", "tpe"])
def test_batched_ask_and_tell_draw_the_trials_of_a_plain_ask_tell_loop(kind):
    """B asks then B tells through the internals give the params and values of the same
    loop written with Study.ask / Study.tell and the same seed."""
    batch, rounds = 8, 4
    plain = optuna.create_study(directions=["minimize", "minimize"], sampler=_sampler(kind))
    for _ in range(rounds):
        asked = [plain.ask(DISTS) for _ in range(batch)]
        for t in asked:
            plain.tell(t, _objectives(t.params))
    fast = optuna.create_study(directions=["minimize", "minimize"], sampler=_sampler(kind))
    for _ in range(rounds):
        asked = optuna_internals.ask_batch(fast, DISTS, batch)
        optuna_internals.tell_batch(fast, asked, [_objectives(t.params) for t in asked],
                                    [{"n": t.number} for t in asked],
                                    [constraints.system_attrs(0.0)] * len(asked))
    assert [t.params for t in fast.trials] == [t.params for t in plain.trials]
    assert [t.values for t in fast.trials] == [t.values for t in plain.trials]
    assert all(t.user_attrs == {"n": t.number} for t in fast.trials)
    # the constraint is one Optuna reads (FrozenTrial.constraints, so best_trials honours it)
    assert all(t.constraints == {"0": 0.0} for t in fast.trials)


def test_a_non_finite_objective_fails_the_trial():
    study = optuna.create_study(directions=["minimize", "minimize"])
    asked = optuna_internals.ask_batch(study, DISTS, 2)
    told = optuna_internals.tell_batch(study, asked, [[float("nan"), 1.0], [1.0, 2.0]],
                                       [{}, {}])
    assert told[0].state == optuna.trial.TrialState.FAIL and told[0].values is None
    assert told[1].state == optuna.trial.TrialState.COMPLETE and told[1].values == [1.0, 2.0]


@pytest.mark.parametrize("kind", ["sqlite", "journal", "memory"])
def test_one_go_writes_read_back_as_stock_optuna_stores_them(kind, tmp_path):
    source = optuna.create_study(directions=["minimize", "minimize"], sampler=_sampler("tpe"))
    asked = optuna_internals.ask_batch(source, DISTS, 12)
    done = optuna_internals.tell_batch(source, asked, [_objectives(t.params) for t in asked],
                                       [{"topo": [1.5, 2.5]} for _ in asked],
                                       [constraints.system_attrs(float(i) - 5)
                                        for i in range(len(asked))])
    if kind == "sqlite":
        storage = optuna.storages.RDBStorage(f"sqlite:///{tmp_path / 's.db'}")
    elif kind == "journal":
        storage = optuna.storages.JournalStorage(
            optuna.storages.journal.JournalFileBackend(str(tmp_path / "j.log")))
    else:
        storage = optuna.storages.InMemoryStorage()
    target = optuna.create_study(study_name="t", storage=storage,
                                 directions=["minimize", "minimize"])
    optuna_internals.write_trials(target, done[:5])
    optuna_internals.write_trials(target, done[5:])
    if kind == "sqlite":
        reread = optuna.load_study(study_name="t", storage=f"sqlite:///{tmp_path / 's.db'}")
    elif kind == "journal":
        reread = optuna.load_study(study_name="t", storage=optuna.storages.JournalStorage(
            optuna.storages.journal.JournalFileBackend(str(tmp_path / "j.log"))))
    else:
        reread = target
    got = reread.trials
    assert [t.number for t in got] == list(range(12))
    for a, b in zip(got, done):
        assert a.state == b.state and a.params == b.params
        assert a.distributions == b.distributions and a.values == b.values
        assert a.user_attrs == b.user_attrs and a.system_attrs == b.system_attrs
        assert a.datetime_start == b.datetime_start

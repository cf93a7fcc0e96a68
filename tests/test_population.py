"""The vectorised population search (tune --sampler population): reproducible for a seed,
resumable without duplicates, never marking a dominated point as front, and finding the
exhaustive front of a small space."""

from __future__ import annotations

import numpy as np
import pytest
from _tune_helpers import assert_clean_error, run_cli
from test_exhaustive import TINY_KNOBS, tiny_spec

from slabtune.tuner import constraints, exhaustive, population
from slabtune.tuner import front as fronts
from slabtune.tuner import grid as grids
from slabtune.tuner import study as studies

POP = 64


def _state_arrays(state):
    return [np.asarray(x) for x in state]


def test_same_seed_same_search_and_another_seed_another():
    spec = tiny_spec()
    ev = studies.evaluator_for(spec)
    grid = grids.grid_of(spec.space)
    runs = []
    for seed in (3, 3, 4):
        s = population.Search(ev, grid, seed, POP)      # a new compiled loop each time
        state, sampled = s.advance(s.initial(), 6)
        runs.append((_state_arrays(state), sampled))
    (a, sa), (b, sb), (c, _) = runs
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)
    np.testing.assert_array_equal(sa, sb)
    assert not np.array_equal(a[0], c[0])


def test_resumed_search_equals_one_run_and_records_no_duplicates(tmp_path):
    spec = tiny_spec()
    url = f"journal:{tmp_path / 'pop.log'}"
    r1, _ = studies.create_or_resume(spec, "pop", url)
    first = population.run(r1, 5, population=POP, sample=8)
    assert first.generations == (0, 5)
    r2, _ = studies.create_or_resume(spec, "pop", url)       # as a new process would
    second = population.run(r2, 7, population=POP, sample=8)
    assert second.generations == (5, 12)
    whole, _ = studies.create_or_resume(spec, "whole", "memory:")
    population.run(whole, 12, population=POP, sample=8)
    resumed = r2.study.user_attrs[population.ATTR_STATE]
    once = whole.study.user_attrs[population.ATTR_STATE]
    for k in ("generation", "pop", "obj", "exc", "arch", "arch_obj", "arch_ok"):
        assert resumed[k] == once[k], k
    keys = [tuple(sorted(t.params.items())) for t in r2.study.trials]
    assert len(keys) == len(set(keys))
    assert {t.user_attrs[population.ATTR_RECORDED_AT] for t in r2.study.trials} == {5, 12}
    # a population of another size is not the same search
    with pytest.raises(Exception, match="population 64, this call 32"):
        population.run(r2, 1, population=32)


def test_front_marks_are_never_dominated():
    spec = tiny_spec(TINY_KNOBS + "min_partial_lo = { low = 0, high = 10 }\n")
    runner, _ = studies.create_or_resume(spec, "marks", "memory:")
    for _ in range(3):
        population.run(runner, 3, population=POP, sample=16)
    trials = runner.study.trials
    marked = [t for t in trials if population.ATTR_FRONT_GEN in t.user_attrs]
    assert marked
    for t in marked:
        assert t.constraints and constraints.feasible(t)
        upto = [u for u in trials if u.user_attrs[population.ATTR_RECORDED_AT]
                <= t.user_attrs[population.ATTR_RECORDED_AT] and constraints.feasible(u)]
        v = np.array(t.values)
        for u in upto:
            w = np.array(u.values)
            assert not ((w <= v).all() and (w < v).any()), (t.number, u.number)
    last = max(t.user_attrs[population.ATTR_RECORDED_AT] for t in trials)
    best = {t.number for t in runner.study.best_trials}
    assert {t.number for t in marked if t.user_attrs[population.ATTR_RECORDED_AT] == last} \
        <= best


def test_population_finds_the_exhaustive_front_of_a_small_space():
    spec = tiny_spec()
    exact, _ = studies.create_or_resume(spec, "exact", "memory:")
    exhaustive.run(exact, grids.grid_of(spec.space))
    runner, _ = studies.create_or_resume(spec, "pop", "memory:")
    population.run(runner, 20, population=POP)
    ev = runner.evaluator
    base = np.array([ev.baseline.memory[0], ev.baseline.time[0]])

    def hv(study):
        vals = np.array([t.values for t in study.best_trials])
        return fronts.hypervolume(vals / base, (1.2, 1.2))

    assert hv(runner.study) >= 0.999 * hv(exact.study)
    assert hv(runner.study) <= hv(exact.study) * (1 + 1e-6)


def test_archive_keeps_one_point_per_objective_vector():
    spec = tiny_spec()
    ev = studies.evaluator_for(spec)
    s = population.Search(ev, grids.grid_of(spec.space), 0, POP, archive=8)
    state, _ = s.advance(s.initial(), 8)
    _, obj = population.archive_front(state)
    assert len(obj) <= 8
    assert fronts.nondominated(obj).all()          # distinct and mutually non-dominated


@pytest.mark.parametrize("args, needle", [
    (["--sampler", "population"], "--generations: required"),
    (["--sampler", "population", "--generations", "-1"], "--generations: -1 is negative"),
    (["--sampler", "population", "--generations", "1", "--population", "2"],
     "--population: 2 must be at least 4"),
    (["--sampler", "population", "--generations", "1", "--record-sample", "-3"],
     "--record-sample: -3"),
    (["--sampler", "population", "--generations", "1", "--trials", "8"],
     "--trials: not with --sampler population"),
    (["--trials", "8", "--generations", "2"], "--generations: only with --sampler population"),
    (["--sampler", "nsga3", "--trials", "8"], "invalid choice"),
])
def test_cli_bad_population_input_is_one_line(args, needle):
    proc = run_cli("tune", "tune_quick", *args, "--storage", "memory:")
    if needle == "invalid choice":      # argparse's own usage error: exit 2, no traceback
        assert proc.returncode == 2 and needle in proc.stderr
        assert "Traceback" not in proc.stderr
    else:
        assert_clean_error(proc, needle)


def test_cli_population_study_reads_back_with_pareto(tmp_path):
    url = f"sqlite:///{tmp_path / 'p.db'}"
    args = ("tune", "tune_quick", "--sampler", "population", "--generations", "2",
            "--population", "128", "--study", "p", "--storage", url)
    proc = run_cli(*args)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("population: generations 0..2 (256 candidates evaluated)")
    again = run_cli(*args, "--json")
    assert again.returncode == 0, again.stderr
    assert '"generation": 4' in again.stdout
    pareto = run_cli("pareto", "--study", "p", "--storage", url)
    assert pareto.returncode == 0 and "on the Pareto front" in pareto.stdout

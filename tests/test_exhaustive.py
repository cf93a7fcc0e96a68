"""The exhaustive front (tune --exhaustive) and the array helpers it shares with the population
search: grids, fronts and hypervolume."""

from __future__ import annotations

import numpy as np
import optuna
import pytest
from _tune_helpers import assert_clean_error, run_cli

from slabtune.tuner import exhaustive
from slabtune.tuner import front as fronts
from slabtune.tuner import grid as grids
from slabtune.tuner import study as studies

#: tune_quick's fleet and objectives on a 180-point space.
TINY_KNOBS = """slub_min_order = { low = 0, high = 2 }
slub_max_order = { low = 0, high = 4 }
slub_min_objects = { choices = [0, 8, 32] }
cpu_partial_small = { low = 0, high = 240, step = 80 }
"""


def tiny_spec(knobs: str = TINY_KNOBS) -> studies.TuneSpec:
    text = studies.spec_file("tune_quick").read_text()
    head, rest = text.split("[search.knobs]\n")
    tail = rest[rest.index("[objectives]"):]
    return studies.parse_spec(f"{head}[search.knobs]\n{knobs}\n{tail}", "tiny")


def brute_force(runner, grid):
    """Every point's objectives one policy at a time through the trial path
    (effective_params + FleetEvaluator.evaluate), and the feasible mask."""
    params = [grid.params(g) for g in grid.genomes_of(np.arange(grid.size))]
    ev = runner.evaluator.evaluate([studies.effective_params(p, runner.spec) for p in params])
    obj = np.stack([ev.memory, ev.time], 1)
    ok = runner.evaluator.regression_excess(ev) <= 0
    return params, obj, ok


def test_grid_values_are_the_trial_path_effective_params():
    spec = tiny_spec("""slub_min_order = { low = 0, high = 5 }
slub_max_order = { low = 0, high = 5 }
min_partial_lo = { choices = [1, 7] }
""")
    grid = grids.grid_of(spec.space)
    assert grid.size == 6 * 6 * 2
    genomes = grid.genomes_of(np.arange(grid.size))
    vals = grids.knob_values(grid, genomes)
    jvals = grids.jnp_knob_values(grid, genomes)
    base = grid.baseline
    for i, g in enumerate(genomes):
        want = dict(base)
        want.update(studies.effective_params(grid.params(g), spec))
        assert {k: int(v[i]) for k, v in vals.items()} == want
        assert {k: int(v[i]) for k, v in jvals.items()} == want
    # mixed radix, last knob fastest, and back
    assert grid.params(genomes[1]) == {"slub_min_order": 0, "slub_max_order": 0,
                                       "min_partial_lo": 7}


def test_nondominated_and_hypervolume_by_definition():
    rng = np.random.default_rng(0)
    obj = rng.integers(0, 12, size=(400, 2)).astype(float)   # many ties and equal points
    assert (fronts.nondominated(obj) == fronts.nondominated_bruteforce(obj)).all()
    pts = np.array([[1.0, 3.0], [2.0, 2.0], [3.0, 1.0], [2.5, 2.5], [5.0, 0.5]])
    # ref (4, 4): strips x 1..2, 2..3, 3..4 of heights 1, 2, 3; (2.5, 2.5) is dominated
    # and (5, .5) lies outside the box
    assert fronts.hypervolume(pts, (4.0, 4.0)) == pytest.approx(1 + 2 + 3)
    assert fronts.hypervolume(np.zeros((0, 2)), (1, 1)) == 0.0


def test_exhaustive_front_is_the_brute_force_front():
    spec = tiny_spec()
    runner, _ = studies.create_or_resume(spec, "exh", "memory:")
    grid = exhaustive.plan(spec, spec.space.names)
    assert grid.size == 180
    res = exhaustive.run(runner, grid, chunk=64)        # three chunks, the last padded
    assert res.done and res.evaluated == 180
    params, obj, ok = brute_force(runner, grid)
    np.testing.assert_allclose(
        np.array([t.values for t in sorted(runner.study.trials,
                                           key=lambda t: t.user_attrs["slabtune_point"])]),
        obj[sorted(t.user_attrs["slabtune_point"] for t in runner.study.trials)], rtol=1e-6)
    keep = np.zeros(len(obj), bool)
    keep[np.flatnonzero(ok)[fronts.nondominated_bruteforce(obj[ok])]] = True
    want = {tuple(sorted(params[i].items())) for i in np.flatnonzero(keep)}
    got = {tuple(sorted(t.params.items())) for t in runner.study.best_trials}
    assert got == want
    assert res.front == len(want) == len(runner.study.best_trials)
    # each front trial carries what a sampled trial carries
    t = runner.study.best_trials[0]
    assert set(t.params) == set(spec.space.names)
    assert t.distributions == {k: spec.space.distributions()[k] for k in t.params}
    assert len(t.user_attrs[studies.ATTR_TOPO]["memory"]) == len(spec.fleet.topologies)


def test_interrupted_exhaustive_resumes_without_duplicates(tmp_path):
    spec = tiny_spec()
    url = f"journal:{tmp_path / 'exh.log'}"
    runner, _ = studies.create_or_resume(spec, "exh", url)
    grid = exhaustive.plan(spec, spec.space.names)
    first = exhaustive.run(runner, grid, chunk=32, max_chunks=2)
    assert not first.done and first.evaluated == 64
    again, _ = studies.create_or_resume(spec, "exh", url)     # a new process, in effect
    rest = exhaustive.run(again, grid, chunk=32)
    assert rest.done and rest.evaluated == 180 - 64
    points = [t.user_attrs["slabtune_point"] for t in again.study.trials]
    assert len(points) == len(set(points))
    assert exhaustive.run(again, grid, chunk=32).evaluated == 0
    whole, _ = studies.create_or_resume(spec, "whole", "memory:")
    exhaustive.run(whole, grid, chunk=32)
    key = lambda s: {tuple(sorted(t.params.items())) for t in s.best_trials}  # noqa: E731
    assert key(again.study) == key(whole.study)


def test_boot_subspace_keeps_other_knobs_at_baseline():
    spec = studies.load_spec("tune_quick")
    knobs = exhaustive.subspace(spec, "boot")
    assert knobs == ("slub_min_order", "slub_max_order", "slub_min_objects")
    grid = exhaustive.plan(spec, knobs)
    runner, _ = studies.create_or_resume(spec, "boot", "memory:")
    exhaustive.run(runner, grid)
    for t in runner.study.trials:
        assert set(t.params) == set(knobs)
    # the unmodified kernel is one of the points, and nothing on the front is dominated
    # by it (beyond float noise: batches of other shapes round differently, ~1e-7)
    base = runner.evaluator.baseline
    b = np.array([base.memory[0], base.time[0]])
    for t in runner.study.best_trials:
        v = np.array(t.values)
        assert not ((b <= v).all() and (b * (1 + 1e-6) < v).any())


def test_cli_refuses_a_space_too_large_in_one_line(tmp_path):
    proc = run_cli("tune", "tune_quick", "--exhaustive", "--run-dir", str(tmp_path / "r"))
    assert_clean_error(proc, "--exhaustive", "tune_quick", "3,401,219,250 points",
                       "--max-points")
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("args, needle", [
    (["--exhaustive", "--knobs", "nosuch"], "--knobs: 'nosuch'"),
    (["--exhaustive", "--knobs", "boot", "--max-points", "10"], "90 points"),
    (["--exhaustive", "--trials", "4"], "--trials: not with --exhaustive"),
    (["--knobs", "boot", "--trials", "4"], "--knobs: only with --exhaustive"),
    (["--exhaustive", "--sampler", "population"], "not both"),
])
def test_cli_bad_exhaustive_input_is_one_line(args, needle, tmp_path):
    assert_clean_error(run_cli("tune", "tune_quick", *args, "--storage", "memory:"), needle)


def test_cli_exhaustive_boot_front_reads_back_with_pareto_and_export(tmp_path):
    db = tmp_path / "s.db"
    url = f"sqlite:///{db}"
    proc = run_cli("tune", "tune_quick", "--exhaustive", "--knobs", "boot", "--study", "b",
                   "--storage", url)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[0].startswith(
        "exhaustive: space tune_quick [slub_min_order,slub_max_order,slub_min_objects] has "
        "90 points")
    again = run_cli("tune", "tune_quick", "--exhaustive", "--knobs", "boot", "--study", "b",
                    "--storage", url)
    assert again.returncode == 0 and "0 trials added" in again.stdout
    study = optuna.load_study(study_name="b", storage=url)
    points = [t.user_attrs["slabtune_point"] for t in study.trials]
    assert len(points) == len(set(points))
    pareto = run_cli("pareto", "--study", "b", "--storage", url)
    assert pareto.returncode == 0 and f"{len(study.best_trials)} on the Pareto front" in \
        pareto.stdout
    number = study.best_trials[0].number
    export = run_cli("export", "--study", "b", "--storage", url, "--trial", str(number),
                     "--format", "json")
    assert export.returncode == 0, export.stderr

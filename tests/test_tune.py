"""Tune studies: search spaces, fleet objectives, batched ask/tell, storage and resume."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import optuna
import pytest

from _tune_helpers import QUICK_TRIALS, assert_clean_error, quick_study, run_cli, workdir
from slabtune.errors import SlabtuneError
from slabtune.model import profiles as P
from slabtune.model import reference as R
from slabtune.tuner import objectives as O
from slabtune.tuner import space as S
from slabtune.tuner import study as ST


def test_quick_study_finds_points_dominating_the_default_policy():
    study, _url, runner = quick_study()
    complete = study.get_trials(states=(optuna.trial.TrialState.COMPLETE,))
    assert len(complete) == QUICK_TRIALS
    base = study.user_attrs[ST.ATTR_BASELINE]
    ev = runner.evaluator.evaluate([{}])
    assert base["memory"] == pytest.approx(ev.memory[0])
    assert base["time"] == pytest.approx(ev.time[0])
    better = [t for t in study.best_trials
              if (t.values[0] <= base["memory"] and t.values[1] <= base["time"])
              and (t.values[0] < base["memory"] or t.values[1] < base["time"])]
    assert better, "no Pareto point dominates the default policy"


def test_pareto_points_respect_the_regression_limit_per_topology():
    study, _url, runner = quick_study()
    limit = runner.spec.objectives.max_regression
    assert limit == 0.25
    base = study.user_attrs[ST.ATTR_BASELINE]
    infeasible = 0
    for t in study.get_trials(states=(optuna.trial.TrialState.COMPLETE,)):
        topo = t.user_attrs[ST.ATTR_TOPO]
        worst = max(max(m / b for m, b in zip(topo["memory"], base["memory_topo"])),
                    max(x / b for x, b in zip(topo["time"], base["time_topo"]))) - 1.0
        assert t.constraints[ST.ATTR_EXCESS] == pytest.approx(worst - limit, abs=1e-9)
        infeasible += worst > limit
    assert infeasible > 0  # the limit binds somewhere in the search
    for t in study.best_trials:
        assert t.constraints[ST.ATTR_EXCESS] <= 0


def test_trial_values_are_the_weighted_fleet_aggregate():
    study, _url, runner = quick_study()
    w = np.array([t.weight for t in runner.spec.fleet.topologies])
    w = w / w.sum()
    for t in study.trials[:20]:
        topo = t.user_attrs[ST.ATTR_TOPO]
        assert t.values[0] == pytest.approx(float(np.dot(w, topo["memory"])))
        assert t.values[1] == pytest.approx(float(np.dot(w, topo["time"])))


def test_one_batched_call_equals_one_call_per_policy():
    _study, _url, runner = quick_study()
    params = [t.params for t in runner.study.trials[:12]]
    batch = runner.evaluate(params)
    for i, p in enumerate(params):
        one = runner.evaluate([p])
        np.testing.assert_allclose(batch.memory_topo[i], one.memory_topo[0], rtol=1e-6)
        np.testing.assert_allclose(batch.time_topo[i], one.time_topo[0], rtol=1e-6)


def test_order_coefficients_reproduce_the_kernel_heuristic():
    """mul * (fls(nr_cpus) + add) at (4, 1) is the kernel's own min_objects; other
    coefficients equal an explicit slub_min_objects of that value (checked against the
    scalar reference)."""
    _study, _url, runner = quick_study()
    fleet = runner.spec.fleet
    prof = fleet.profile
    for mul, add in ((4, 1), (8, 0), (1, 3)):
        got = O.cache_values(fleet, {"order_objects_mul": mul, "order_objects_add": add})
        topo = fleet.topologies[0].topology
        for c in fleet.caches:
            nr = R.order_nr_cpus(topo.possible, topo.present, topo.online, prof, c.early)
            mo = 0 if (mul, add) == (4, 1) else mul * (R.fls(nr) + add)
            want = R.structure(c.size, topo.possible, topo.present, topo.online, prof,
                               min_objects=mo, early=c.early, is_kmalloc=c.is_kmalloc,
                               explicit_sheaf=c.explicit_sheaf)
            assert got[c.name]["order"] == want["order"], (mul, add, c.name)
            assert got[c.name]["objs_per_slab"] == want["objs_per_slab"]


def test_sysfs_knobs_change_min_partial_and_cpu_partial_as_the_reference_does():
    _study, _url, runner = quick_study()
    fleet = runner.spec.fleet
    knobs = {"min_partial_divisor": 1, "min_partial_lo": 2, "min_partial_hi": 7,
             "cpu_partial_small": 16, "cpu_partial_256": 8, "cpu_partial_1k": 4,
             "cpu_partial_page": 2}
    prof = dataclasses.replace(fleet.profile, min_partial_divisor=1, min_partial_lo=2,
                               min_partial_hi=7, cpu_partial_objects=(2, 4, 8, 16))
    got = O.cache_values(fleet, knobs)
    for c in fleet.caches:
        assert got[c.name]["min_partial"] == R.min_partial(c.size, prof)
        assert got[c.name]["cpu_partial"] == R.cpu_partial_objects(c.size, prof)


def test_effective_boot_params_follow_the_kernel_setup_order():
    spec = ST.load_spec("tune_quick")  # v6.18: min > max moves min down to max
    eff = ST.effective_params({"slub_min_order": 3, "slub_max_order": 1}, spec)
    assert (eff["slub_min_order"], eff["slub_max_order"]) == (1, 1)
    old = dataclasses.replace(spec, fleet=dataclasses.replace(spec.fleet,
                                                              profile=P.get_profile("v6.1")))
    eff = ST.effective_params({"slub_min_order": 3, "slub_max_order": 1}, old)
    assert (eff["slub_min_order"], eff["slub_max_order"]) == (3, 1)


@pytest.mark.parametrize("knobs, needle", [
    ('nosuch = {}', "search.knobs.nosuch: unknown knob"),
    ('slub_max_order = { low = 0, high = 11 }', "search.knobs.slub_max_order.high: 11 is outside"),
    ('cpu_partial_small = { low = 0, high = 10, step = 3 }', "search.knobs.cpu_partial_small.step"),
    ('slub_min_objects = { choices = [0, 40000] }', "search.knobs.slub_min_objects.choices"),
    ('barn_max_full = { low = 0, high = 4 }', "search.knobs.barn_max_full: profile v6.1 has no barns"),
])
def test_bad_search_spaces_name_the_field(knobs, needle):
    text = ('[fleet]\nprofile = "v6.1"\n[[fleet.topology]]\ncpus = 4\n[[fleet.workload]]\n'
            '[fleet.workload.caches]\n"kmalloc-64" = { live_per_cpu = 100 }\n'
            f'[search.knobs]\n{knobs}\n')
    with pytest.raises(SlabtuneError) as err:
        ST.parse_spec(text)
    assert needle in str(err.value)


def test_space_uses_plain_optuna_distributions():
    spec = ST.load_spec("tune_quick")
    d = spec.space.distributions()
    assert isinstance(d["slub_max_order"], optuna.distributions.IntDistribution)
    assert isinstance(d["slub_min_objects"], optuna.distributions.CategoricalDistribution)
    assert {k.reach for k in spec.space.knobs} == {"boot", "sysfs", "kernel"}
    assert S.KNOBS["slub_min_order"].reach == "boot"
    assert S.KNOBS["min_partial_lo"].reach == "sysfs"
    assert S.KNOBS["sheaf_small"].reach == "kernel"


def test_resume_adds_trials_to_the_same_study():
    spec = ST.load_spec("tune_quick")
    url = f"journal:{workdir() / 'resume.log'}"
    r1, _ = ST.create_or_resume(spec, "resume-me", url)
    r1.run(10, 5)
    r2, _ = ST.create_or_resume(spec, "resume-me", url)
    assert r2.study._study_id == r1.study._study_id
    r2.run(7, 7)
    again = ST.load_study("resume-me", url)
    stored = again.get_trials(states=(optuna.trial.TrialState.COMPLETE,))
    assert [t.number for t in stored] == list(range(17))
    for t in stored:  # written whole: params, values, per-topology attrs, constraint
        assert set(t.params) == set(spec.space.names)
        assert len(t.user_attrs[ST.ATTR_TOPO]["memory"]) == len(spec.fleet.topologies)
        assert ST.ATTR_EXCESS in t.constraints
    assert r2._asker.trials[16].values == stored[16].values
    other = dataclasses.replace(spec, text=spec.text + "\n# changed\n")
    with pytest.raises(SlabtuneError, match="different spec"):
        ST.create_or_resume(other, "resume-me", url)


@pytest.mark.parametrize("url, needle", [
    ("bogus", "is not a storage URL"),
    ("nosuchdb://host/x", "storage: 'nosuchdb://host/x'"),
    ("sqlite:////nonexistent-dir-xyz/s.db", "does not exist"),
    ("journal:/nonexistent-dir-xyz/j.log", "does not exist"),
])
def test_bad_storage_urls_fail_with_one_line(url, needle):
    with pytest.raises(SlabtuneError) as err:
        ST.open_storage(url)
    assert needle in str(err.value)
    assert "\n" not in str(err.value)


def test_cli_tune_defaults_to_sqlite_in_the_run_dir_and_resumes(tmp_path):
    p1 = run_cli("tune", "tune_quick", "--trials", "6", "--batch", "3", "--study", "cli1",
                 "--json", cwd=tmp_path)
    assert p1.returncode == 0, p1.stderr
    out = json.loads(p1.stdout)
    db = tmp_path / "runs" / "cli1" / "study.db"
    assert out == {"study": "cli1", "storage": f"sqlite:///{db}", "trials": 6}
    assert db.read_bytes()[:16] == b"SQLite format 3\x00"
    p2 = run_cli("tune", "tune_quick", "--trials", "4", "--study", "cli1", "--json", cwd=tmp_path)
    assert p2.returncode == 0, p2.stderr
    assert json.loads(p2.stdout)["trials"] == 10
    # the file is a plain Optuna RDB study: another reader opens it with the stock API
    s = optuna.load_study(study_name="cli1", storage=f"sqlite:///{db}")
    assert len(s.trials) == 10 and s.metric_names == ["memory", "time"]


def test_cli_tune_bad_input_is_one_line(tmp_path):
    assert_clean_error(run_cli("tune", "tune_quick", "--trials", "1", "--storage", "bogus://",
                               cwd=tmp_path), "storage")
    assert_clean_error(run_cli("tune", "no-such-spec", "--trials", "1", cwd=tmp_path), "spec")
    bad = tmp_path / "bad.toml"
    bad.write_text(ST.load_spec("tune_quick").text.replace(
        "slub_max_order = { low = 0, high = 4 }", "slub_max_order = { low = 0, high = 40 }"))
    assert_clean_error(run_cli("tune", str(bad), "--trials", "1", cwd=tmp_path),
                       "search.knobs.slub_max_order.high: 40 is outside")


def test_tpe_sampler_runs_batched_on_the_same_fleet():
    _study, _url, runner = quick_study()
    spec = ST.load_spec("tune_quick")
    tpe = ST.parse_spec(spec.text.replace('sampler = "nsga2"', 'sampler = "tpe"'), "tpe")
    assert tpe.space.sampler == "tpe"
    r, _ = ST.create_or_resume(tpe, "tpe", "memory:", evaluator=runner.evaluator)
    assert isinstance(r.study.sampler, optuna.samplers.TPESampler)
    r.run(24, 8)
    done = r.study.get_trials(states=(optuna.trial.TrialState.COMPLETE,))
    assert len(done) == 24 and len({tuple(sorted(t.params.items())) for t in done}) > 12


V70_SPEC = """
[fleet]
profile = "v7.0"
[[fleet.topology]]
name = "two-node"
cpus = 16
nodes = 2
[[fleet.topology]]
name = "memoryless"
cpus = 16
nodes = 2
memoryless_nodes = [1]
[[fleet.workload]]
[fleet.workload.caches]
maple_node = { live_per_cpu = 512 }
dentry = { live_per_cpu = 4096 }
[search]
seed = 1
[search.knobs]
sheaf_small = { low = 4, high = 120 }
sheaf_256 = { low = 4, high = 60 }
barn_max_full = { low = 0, high = 40 }
min_partial_lo = { low = 0, high = 10 }
"""


def test_sheaf_and_barn_knobs_on_v7_0():
    """v7.0 has sheaves on every non-kmalloc cache and no per-CPU partial lists: sheaf
    capacities follow the searched base (rounded to a kmalloc bucket), barns cost memory,
    and the memoryless topology pays remote frees that bypass sheaves."""
    spec = ST.parse_spec(V70_SPEC, "v70")
    ev = ST.evaluator_for(spec)
    base = ev.evaluate([{}])
    small = O.cache_values(spec.fleet, {"sheaf_small": 4, "sheaf_256": 4})
    big = O.cache_values(spec.fleet, {"sheaf_small": 120, "sheaf_256": 60})
    prof = spec.fleet.profile
    assert small["dentry"]["sheaf_capacity"] == R.sheaf_capacity(192, dataclasses.replace(
        prof, sheaf_base_capacity=(4, 12, 4, 4)))
    assert big["dentry"]["sheaf_capacity"] > small["dentry"]["sheaf_capacity"]
    assert all(v["cpu_partial"] == 0 for v in big.values())
    mem = ev.evaluate([{"barn_max_full": 0}, {"barn_max_full": 40}]).memory_topo
    assert (mem[1] > mem[0]).all()  # fuller barns hold more parked objects
    # the memoryless topology is slower than the same machine with memory on both nodes
    assert base.time_topo[0, 1] > base.time_topo[0, 0]
    r, _ = ST.create_or_resume(spec, "v70", "memory:", evaluator=ev)
    r.run(8, 8)
    t = next(t for t in r.study.trials if t.params["sheaf_small"] != 60)
    c = ST.candidate(r.study, t.number)
    assert "sheaf_small" in [k.knob for k in c.kernel_change]
    assert all(set(v) == {"min_partial"} for v in c.sysfs.values())  # no cpu_partial in v7.0
    assert c.boot == {}

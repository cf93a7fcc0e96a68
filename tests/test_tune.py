"""Tune studies: search spaces, fleet objectives, batched ask/tell, storage and resume."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import optuna
import pytest
from _tune_helpers import (
    QUICK_TRIALS,
    assert_clean_error,
    quick_study,
    run_cli,
    workdir,
)

from slabtune.errors import SlabtuneError
from slabtune.model import profiles, reference, retention
from slabtune.tuner import constraints, objectives, space
from slabtune.tuner import fleet as fleets
from slabtune.tuner import study as studies


def test_quick_study_finds_points_dominating_the_default_policy():
    study, _url, runner = quick_study()
    complete = study.get_trials(states=(optuna.trial.TrialState.COMPLETE,))
    assert len(complete) == QUICK_TRIALS
    base = study.user_attrs[studies.ATTR_BASELINE]
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
    base = study.user_attrs[studies.ATTR_BASELINE]
    infeasible = 0
    for t in study.get_trials(states=(optuna.trial.TrialState.COMPLETE,)):
        topo = t.user_attrs[studies.ATTR_TOPO]
        worst = max(max(m / b for m, b in zip(topo["memory"], base["memory_topo"])),
                    max(x / b for x, b in zip(topo["time"], base["time_topo"]))) - 1.0
        assert constraints.excess(t) == pytest.approx(worst - limit, abs=1e-9)
        infeasible += worst > limit
    assert infeasible > 0  # the limit binds somewhere in the search
    for t in study.best_trials:
        assert constraints.excess(t) <= 0


def test_trial_values_are_the_weighted_fleet_aggregate():
    study, _url, runner = quick_study()
    w = np.array([t.weight for t in runner.spec.fleet.topologies])
    w = w / w.sum()
    for t in study.trials[:20]:
        topo = t.user_attrs[studies.ATTR_TOPO]
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


def _plain_loop(spec, evaluator, n_trials, batch):
    """The natural Optuna usage: Study.ask B trials, evaluate them, Trial.set_user_attr,
    Trial.set_constraint and Study.tell each (what the batched runner must reproduce)."""
    study = optuna.create_study(sampler=space.make_sampler(spec.space),
                                directions=list(studies.DIRECTIONS))
    dists = spec.space.distributions()
    done = 0
    while done < n_trials:
        k = min(batch, n_trials - done)
        trials = [study.ask(dists) for _ in range(k)]
        ev = evaluator.evaluate([studies.effective_params(t.params, spec) for t in trials])
        excess = evaluator.regression_excess(ev)
        for i, tr in enumerate(trials):
            tr.set_user_attr(studies.ATTR_TOPO, {"memory": ev.memory_topo[i].tolist(),
                                            "time": ev.time_topo[i].tolist()})
            tr.set_constraint(studies.ATTR_EXCESS, float(excess[i]))
            study.tell(tr, [float(ev.memory[i]), float(ev.time[i])])
        done += k
    return study.trials


@pytest.mark.parametrize("sampler", ["nsga2", "tpe"])
def test_batched_runner_gives_the_trials_of_plain_ask_and_tell(sampler):
    """The bulk ask/tell path draws the same params from the same sampler and seed as
    Study.ask/Study.tell would (NSGA-II past its first generation: 120 trials, population
    50), and stores the same values, attrs and constraints."""
    _study, _url, quick = quick_study()
    spec = studies.load_spec("tune_quick")
    spec = studies.parse_spec(spec.text.replace('sampler = "nsga2"', f'sampler = "{sampler}"'),
                              sampler)
    runner, _ = studies.create_or_resume(spec, f"same-{sampler}", "memory:",
                                    evaluator=quick.evaluator)
    runner.run(120, 40)
    ours = runner.study.trials
    plain = _plain_loop(spec, quick.evaluator, 120, 40)
    assert len(ours) == len(plain) == 120
    gen_key = "NSGAIISampler:generation"
    if sampler == "nsga2":
        assert {t.system_attrs[gen_key] for t in ours} == {0, 1}
    for a, b in zip(ours, plain):
        assert a.number == b.number and a.state == b.state
        assert a.params == b.params and a.distributions == b.distributions
        assert a.values == b.values
        assert a.user_attrs == b.user_attrs
        # the plain loop stores the excess with Trial.set_constraint ("constraints:NAME");
        # the runner stores Optuna's list form (tuner/constraints.py): same values
        assert list(a.constraints.values()) == list(b.constraints.values())
        def rest(t):
            return {k: v for k, v in t.system_attrs.items() if not k.startswith("constraints")}
        assert rest(a) == rest(b)


def test_tell_batch_fails_a_non_finite_trial_as_study_tell_does():
    _study, _url, quick = quick_study()
    spec = studies.load_spec("tune_quick")
    runner, _ = studies.create_or_resume(spec, "nan", "memory:", evaluator=quick.evaluator)
    asked = runner.ask_batch(2)
    ev = quick.evaluator.evaluate([t.params for t in asked])
    ev = ev._replace(memory=np.array([np.nan, ev.memory[1]]))
    told = runner.tell_batch(asked, ev, None)
    plain = optuna.create_study(directions=list(studies.DIRECTIONS))
    with pytest.warns(UserWarning):
        plain.tell(plain.ask(), [float("nan"), 1.0])
    assert told[0].state == plain.trials[0].state == optuna.trial.TrialState.FAIL
    assert told[0].values is None and plain.trials[0].values is None
    assert told[1].state == optuna.trial.TrialState.COMPLETE
    assert told[1].values == [float(ev.memory[1]), float(ev.time[1])]


@pytest.mark.parametrize("kind", ["sqlite", "journal"])
def test_batches_written_in_one_go_read_back_whole(kind, tmp_path):
    """write_trials (one transaction / one journal append per batch) stores what the
    in-memory asker holds, readable by a fresh stock Optuna reader."""
    _study, _url, quick = quick_study()
    spec = studies.load_spec("tune_quick")
    url = f"sqlite:///{tmp_path / 's.db'}" if kind == "sqlite" else f"journal:{tmp_path / 'j.log'}"
    runner, _ = studies.create_or_resume(spec, "bulk", url, evaluator=quick.evaluator)
    runner.run(70, 32)
    storage = (optuna.storages.RDBStorage(url) if kind == "sqlite" else
               optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(
                   str(tmp_path / "j.log"))))
    stored = optuna.load_study(study_name="bulk", storage=storage).trials
    # the mirror also holds, failed, the asked candidates it skipped because an earlier
    # trial had their params (StudyRunner._skip_seen): those are never stored
    mirror = [t for t in runner._asker.trials if t.state != optuna.trial.TrialState.FAIL]
    assert runner.duplicates == len(runner._asker.trials) - len(mirror)
    assert [t.number for t in stored] == list(range(70)) and len(mirror) == 70
    for a, b in zip(stored, mirror):
        assert a.state == b.state == optuna.trial.TrialState.COMPLETE
        assert a.params == b.params and a.distributions == b.distributions
        assert a.values == b.values
        assert a.user_attrs == b.user_attrs and a.system_attrs == b.system_attrs
        assert a.datetime_start == b.datetime_start
        assert a.datetime_complete == b.datetime_complete
    # a resumed runner's sampler sees them all
    again, _ = studies.create_or_resume(spec, "bulk", url, evaluator=quick.evaluator)
    assert len(again._asker.trials) == 70


def test_local_topologies_solve_one_representative_exactly(monkeypatch):
    """Topologies without memoryless CPUs are solved with rep 0 alone; forcing both reps
    everywhere gives the same objectives."""
    _study, _url, runner = quick_study()
    spec = runner.spec
    assert any(t.topology.cpus_on_memoryless_nodes for t in spec.fleet.topologies)
    params = [t.params for t in runner.study.trials[:16]]
    split = runner.evaluate(params)
    full = objectives.solve_reps
    monkeypatch.setattr(objectives, "solve_reps",
                        lambda *a: full(*a[:-1], np.ones_like(a[-1], dtype=bool)))
    both = objectives.FleetEvaluator(spec.fleet, spec.objectives).evaluate(
        [studies.effective_params(p, spec) for p in params])
    np.testing.assert_allclose(split.time_topo, both.time_topo, rtol=2e-6)
    np.testing.assert_array_equal(split.memory_topo, both.memory_topo)


def test_order_coefficients_reproduce_the_kernel_heuristic():
    """mul * (fls(nr_cpus) + add) at (4, 1) is the kernel's own min_objects; other
    coefficients equal an explicit slub_min_objects of that value (checked against the
    scalar reference)."""
    _study, _url, runner = quick_study()
    fleet = runner.spec.fleet
    prof = fleet.profile
    for mul, add in ((4, 1), (8, 0), (1, 3)):
        got = objectives.cache_values(fleet, {"order_objects_mul": mul, "order_objects_add": add})
        topo = fleet.topologies[0].topology
        for c in fleet.caches:
            nr = reference.order_nr_cpus(topo.possible, topo.present, topo.online, prof, c.early)
            mo = 0 if (mul, add) == (4, 1) else mul * (reference.fls(nr) + add)
            want = reference.structure(c.size, topo.possible, topo.present, topo.online, prof,
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
    got = objectives.cache_values(fleet, knobs)
    for c in fleet.caches:
        assert got[c.name]["min_partial"] == reference.min_partial(c.size, prof)
        assert got[c.name]["cpu_partial"] == reference.cpu_partial_objects(c.size, prof)


def test_effective_boot_params_follow_the_kernel_setup_order():
    spec = studies.load_spec("tune_quick")  # v6.18: min > max moves min down to max
    eff = studies.effective_params({"slub_min_order": 3, "slub_max_order": 1}, spec)
    assert (eff["slub_min_order"], eff["slub_max_order"]) == (1, 1)
    old = dataclasses.replace(spec, fleet=dataclasses.replace(spec.fleet,
                                                              profile=profiles.get_profile("v6.1")))
    eff = studies.effective_params({"slub_min_order": 3, "slub_max_order": 1}, old)
    assert (eff["slub_min_order"], eff["slub_max_order"]) == (3, 1)


@pytest.mark.parametrize("knobs, needle", [
    ('nosuch = {}', "search.knobs.nosuch: unknown knob"),
    ('slub_max_order = { low = 0, high = 11 }', "search.knobs.slub_max_order.high: 11 is outside"),
    ('cpu_partial_small = { low = 0, high = 10, step = 3 }', "search.knobs.cpu_partial_small.step"),
    ('slub_min_objects = { choices = [0, 40000] }', "search.knobs.slub_min_objects.choices"),
    ('barn_max_full = { low = 0, high = 4 }',
     "search.knobs.barn_max_full: profile v6.1 has no barns"),
])
def test_bad_search_spaces_name_the_field(knobs, needle):
    text = ('[fleet]\nprofile = "v6.1"\n[[fleet.topology]]\ncpus = 4\n[[fleet.workload]]\n'
            '[fleet.workload.caches]\n"kmalloc-64" = { live_per_cpu = 100 }\n'
            f'[search.knobs]\n{knobs}\n')
    with pytest.raises(SlabtuneError) as err:
        studies.parse_spec(text)
    assert needle in str(err.value)


def test_space_uses_plain_optuna_distributions():
    spec = studies.load_spec("tune_quick")
    d = spec.space.distributions()
    assert isinstance(d["slub_max_order"], optuna.distributions.IntDistribution)
    assert isinstance(d["slub_min_objects"], optuna.distributions.CategoricalDistribution)
    assert {k.reach for k in spec.space.knobs} == {"boot", "sysfs"}
    assert space.KNOBS["slub_min_order"].reach == "boot"
    assert space.KNOBS["min_partial_lo"].reach == "sysfs"
    assert space.KNOBS["sheaf_small"].reach == "kernel"


def test_resume_adds_trials_to_the_same_study():
    spec = studies.load_spec("tune_quick")
    url = f"journal:{workdir() / 'resume.log'}"
    r1, _ = studies.create_or_resume(spec, "resume-me", url)
    r1.run(10, 5)
    r2, _ = studies.create_or_resume(spec, "resume-me", url)
    assert r2.study._study_id == r1.study._study_id
    r2.run(7, 7)
    again = studies.load_study("resume-me", url)
    stored = again.get_trials(states=(optuna.trial.TrialState.COMPLETE,))
    assert [t.number for t in stored] == list(range(17))
    for t in stored:  # written whole: params, values, per-topology attrs, constraint
        assert set(t.params) == set(spec.space.names)
        assert len(t.user_attrs[studies.ATTR_TOPO]["memory"]) == len(spec.fleet.topologies)
        assert len(t.constraints) == 1  # the regression excess (tuner/constraints.py)
    told = [t for t in r2._asker.trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert len(told) == 17 and told[-1].values == stored[16].values  # skipped repeats fail
    other = dataclasses.replace(spec, text=spec.text + "\n# changed\n")
    with pytest.raises(SlabtuneError, match="different spec"):
        studies.create_or_resume(other, "resume-me", url)


@pytest.mark.parametrize("url, needle", [
    ("bogus", "is not a storage URL"),
    ("nosuchdb://host/x", "storage: 'nosuchdb://host/x'"),
    ("sqlite:////nonexistent-dir-xyz/s.db", "does not exist"),
    ("journal:/nonexistent-dir-xyz/j.log", "does not exist"),
])
def test_bad_storage_urls_fail_with_one_line(url, needle):
    with pytest.raises(SlabtuneError) as err:
        studies.open_storage(url)
    assert needle in str(err.value)
    assert "\n" not in str(err.value)


@pytest.mark.slow
def test_cli_tune_defaults_to_sqlite_in_the_run_dir_and_resumes(tmp_path):
    p1 = run_cli("tune", "tune_quick", "--trials", "6", "--batch", "3", "--study", "cli1",
                 "--json", cwd=tmp_path)
    assert p1.returncode == 0, p1.stderr
    out = json.loads(p1.stdout)
    db = tmp_path / "runs" / "cli1" / "study.db"
    assert out == {"study": "cli1", "storage": f"sqlite:///{db}", "trials": 6, "added": 6,
                   "duplicates": 0}
    assert db.read_bytes()[:16] == b"SQLite format 3\x00"
    p2 = run_cli("tune", "tune_quick", "--trials", "4", "--study", "cli1", "--json", cwd=tmp_path)
    assert p2.returncode == 0, p2.stderr
    assert json.loads(p2.stdout)["trials"] == 10 and json.loads(p2.stdout)["added"] == 4
    # the file is a plain Optuna RDB study: another reader opens it with the stock API
    s = optuna.load_study(study_name="cli1", storage=f"sqlite:///{db}")
    assert len(s.trials) == 10 and s.metric_names == ["memory", "time"]


@pytest.mark.slow
def test_cli_tune_bad_input_is_one_line(tmp_path):
    assert_clean_error(run_cli("tune", "tune_quick", "--trials", "1", "--storage", "bogus://",
                               cwd=tmp_path), "storage")
    assert_clean_error(run_cli("tune", "no-such-spec", "--trials", "1", cwd=tmp_path), "spec")
    bad = tmp_path / "bad.toml"
    bad.write_text(studies.load_spec("tune_quick").text.replace(
        "slub_max_order = { low = 0, high = 4 }", "slub_max_order = { low = 0, high = 40 }"))
    assert_clean_error(run_cli("tune", str(bad), "--trials", "1", cwd=tmp_path),
                       "search.knobs.slub_max_order.high: 40 is outside")


def test_tpe_sampler_runs_batched_on_the_same_fleet():
    _study, _url, runner = quick_study()
    spec = studies.load_spec("tune_quick")
    tpe = studies.parse_spec(spec.text.replace('sampler = "nsga2"', 'sampler = "tpe"'), "tpe")
    assert tpe.space.sampler == "tpe"
    r, _ = studies.create_or_resume(tpe, "tpe", "memory:", evaluator=runner.evaluator)
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
reach = "kernel"
[search.knobs]
sheaf_small = { low = 4, high = 120 }
sheaf_256 = { low = 4, high = 60 }
barn_max_full = { low = 0, high = 40 }
min_partial_lo = { low = 0, high = 10 }
"""


@pytest.mark.slow
def test_sheaf_and_barn_knobs_on_v7_0():
    """v7.0 has sheaves on every non-kmalloc cache and no per-CPU partial lists: sheaf
    capacities follow the searched base (rounded to a kmalloc bucket), barns cost memory,
    and the memoryless topology pays remote frees that bypass sheaves."""
    spec = studies.parse_spec(V70_SPEC, "v70")
    ev = studies.evaluator_for(spec)
    base = ev.evaluate([{}])
    small = objectives.cache_values(spec.fleet, {"sheaf_small": 4, "sheaf_256": 4})
    big = objectives.cache_values(spec.fleet, {"sheaf_small": 120, "sheaf_256": 60})
    prof = spec.fleet.profile
    assert small["dentry"]["sheaf_capacity"] == reference.sheaf_capacity(192, dataclasses.replace(
        prof, sheaf_base_capacity=(4, 12, 4, 4)))
    assert big["dentry"]["sheaf_capacity"] > small["dentry"]["sheaf_capacity"]
    assert all(v["cpu_partial"] == 0 for v in big.values())
    mem = ev.evaluate([{"barn_max_full": 0}, {"barn_max_full": 40}]).memory_topo
    assert (mem[1] > mem[0]).all()  # fuller barns hold more parked objects
    # the memoryless topology is slower than the same machine with memory on both nodes
    assert base.time_topo[0, 1] > base.time_topo[0, 0]
    r, _ = studies.create_or_resume(spec, "v70", "memory:", evaluator=ev)
    r.run(8, 8)
    # a sheaf_small that changes dentry's capacity (after the kmalloc round-up) is a kernel
    # change; one that rounds to the kernel's capacity changes nothing and is not listed
    cap = lambda p: objectives.cache_values(spec.fleet, p)["dentry"]["sheaf_capacity"]  # noqa: E731
    t = next(t for t in r.study.trials if cap(t.params) != cap({}))
    c = studies.candidate(r.study, t.number)
    assert "sheaf_small" in [k.knob for k in c.kernel_change] and c.reach == "kernel"
    same = {"sheaf_small": next(v for v in range(4, 121) if v != 60 and cap({"sheaf_small": v})
                                == cap({}))}
    assert studies.deploy(spec, [same])[0].inert == ("sheaf_small",)
    assert all(set(v) == {"min_partial"} for v in c.sysfs.values())  # no cpu_partial in v7.0
    assert c.boot == {}


SWEEP_FLEET_SPEC = """
[fleet]
sweep = "{sweep}"
{extra}
[search]
seed = 0
[search.knobs]
slub_min_order = {{ low = 0, high = 2 }}
min_partial_lo = {{ low = 0, high = 10 }}
"""


def _sweep_spec(sweep: str, extra: str = "") -> studies.TuneSpec:
    return studies.parse_spec(SWEEP_FLEET_SPEC.format(sweep=sweep, extra=extra), "sweep-fleet")


def test_fleet_from_the_quick_sweep_spec_takes_its_topologies_and_caches():
    from slabtune.sweeps import spec as sweep_spec

    spec = _sweep_spec("quick")
    fleet = spec.fleet
    quick = sweep_spec.load("quick")
    # quick.toml: cpus = { logrange = [1, 8192], factor = 2 }, single-node topologies
    assert [t.topology.present for t in fleet.topologies] == [1 << i for i in range(14)]
    assert all(t.topology.nodes == 1 and t.weight == 1.0 for t in fleet.topologies)
    assert [c.name for c in fleet.caches] == list(quick.axis("cache").values)
    assert fleet.profile.name == "v6.18"   # in quick's profile axis ("all")
    (wl,) = fleet.workloads
    assert set(wl.live_per_cpu) == {fleets.SWEEP_LIVE_PER_CPU} and len(set(wl.ops)) == 1
    builtin = studies.load_spec("tune_sweep_quick").fleet   # the built-in spec of this form
    assert builtin.topology_names == fleet.topology_names and builtin.caches == fleet.caches
    ev = objectives.FleetEvaluator(fleet, spec.objectives).baseline
    assert ev.memory_topo.shape == (1, 14) and np.all(np.isfinite(ev.time_topo))
    assert np.all(ev.memory_topo > 0) and np.all(ev.time_topo > 0)


def test_fleet_from_a_sweep_spec_file_keeps_possible_memoryless_topologies(tmp_path):
    sweep = tmp_path / "ml.toml"
    sweep.write_text("""
[sweep]
name = "ml"
evaluator = "structural"
[topology]
cpus_per_node = [2, 8]
nodes = [1, 2, 4]
memoryless_nodes = [0, 1, 4]
[cache]
cache = ["maple_node", "kmalloc-256"]
[kernel]
profile = ["v6.18", "v7.0"]
[[exclude]]
profile = "v7.0"
nodes = 4
""")
    fleet = _sweep_spec(str(sweep), 'profile = "v7.0"\ntopology_weight = "cpus"').fleet
    got = {(t.topology.present, t.topology.nodes, t.topology.nodes - len(t.topology.memory_nodes))
           for t in fleet.topologies}
    # 2 sizes x (1 node: 0 memoryless; 2 nodes: 0 or 1 memoryless); 4 nodes excluded on v7.0,
    # memoryless >= nodes impossible
    assert got == {(2, 1, 0), (8, 1, 0), (4, 2, 0), (4, 2, 1), (16, 2, 0), (16, 2, 1)}
    for t in fleet.topologies:
        assert t.weight == t.topology.present
        if t.topology.nodes == 2 and len(t.topology.memory_nodes) == 1:
            assert t.topology.node_has_memory == (True, False)  # the highest node
    # on v6.18 the exclusion does not apply: 4 nodes with 0 or 1 memoryless, 2 sizes
    assert len(_sweep_spec(str(sweep), 'profile = "v6.18"').fleet.topologies) == 6 + 4


def test_fleet_from_a_sweep_spec_with_inline_workloads():
    extra = ('[[fleet.workload]]\nname = "net"\n[fleet.workload.caches]\n'
             '"kmalloc-256" = { live_per_cpu = 64, ops = 2.0 }')
    fleet = _sweep_spec("quick", extra).fleet
    assert [c.name for c in fleet.caches] == ["kmalloc-256"]
    assert fleet.workloads[0].live_per_cpu == (64.0,) and len(fleet.topologies) == 14


@pytest.mark.parametrize("sweep, extra, needle", [
    ("no-such-sweep", "", "fleet.sweep: spec: 'no-such-sweep' is neither a file"),
    ("{nocpu}", "", "fleet.sweep: nocpu.toml: topology.cpus"),
    ("{allout}", "", "fleet.sweep: sweep spec allout leaves no topology"),
    ("fleet", "", "fleet.sweep: sweep spec fleet has 8192 topologies; a fleet takes at most 256"),
    ("{nocache}", "", "fleet.sweep: nocache.toml: cache.cache: give exactly one of"),
    ("quick", 'profile = "v9.9"', "fleet.profile: unknown kernel profile"),
    ("memoryless", 'profile = "v6.18"\ntopology_weight = "machines"',
     "fleet.topology_weight: 'machines' is not one of uniform, cpus"),
    ("quick", "[[fleet.topology]]\ncpus = 4", "fleet.topology: give either"),
])
def test_bad_sweep_fleets_name_the_field(sweep, extra, needle, tmp_path):
    files = {
        "nocpu": '[cache]\ncache = ["kmalloc-64"]\n',
        "allout": '[topology]\ncpus = [4, 8]\n[cache]\ncache = ["kmalloc-64"]\n'
                  '[[exclude]]\ncpus = { le = 8 }\n',
        "nocache": '[topology]\ncpus = [4, 8]\n',
    }
    for name, body in files.items():
        (tmp_path / f"{name}.toml").write_text(
            f'[sweep]\nname = "{name}"\nevaluator = "structural"\n{body}'
            '[kernel]\nprofile = "v6.18"\n')
    sweep = sweep.format(**{n: str(tmp_path / f"{n}.toml") for n in files})
    with pytest.raises(SlabtuneError) as err:
        _sweep_spec(sweep, extra)
    assert needle in str(err.value)
    assert "\n" not in str(err.value)


def test_sweep_fleet_profile_must_be_one_the_sweep_covers():
    # dynamics_bench.toml: profile = ["v5.10", "v5.11", "v6.1", "v6.18", "v7.0", "v7.1"]
    with pytest.raises(SlabtuneError, match=r"^fleet.profile: v3.1 is not among the profiles "
                                            r"of sweep spec dynamics_bench \(v5.10, "):
        _sweep_spec("dynamics_bench", 'profile = "v3.1"')
    assert _sweep_spec("dynamics_bench", 'profile = "v6.1"').fleet.profile.name == "v6.1"


@pytest.mark.slow
def test_cli_tune_with_a_sweep_fleet(tmp_path):
    spec = tmp_path / "swept.toml"
    spec.write_text(SWEEP_FLEET_SPEC.format(sweep="quick", extra=""))
    p = run_cli("tune", str(spec), "--trials", "8", "--batch", "8", "--study", "swept",
                "--json", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["trials"] == 8
    s = optuna.load_study(study_name="swept", storage=json.loads(p.stdout)["storage"])
    assert len(s.user_attrs[studies.ATTR_TOPOLOGIES]) == 14
    assert_clean_error(run_cli("tune", str(spec).replace("swept", "x"), "--trials", "1",
                               cwd=tmp_path), "spec")
    bad = tmp_path / "bad.toml"
    bad.write_text(SWEEP_FLEET_SPEC.format(sweep="nope", extra=""))
    assert_clean_error(run_cli("tune", str(bad), "--trials", "1", cwd=tmp_path), "fleet.sweep")


@pytest.mark.slow
def test_study_keeps_the_sweep_its_fleet_came_from(tmp_path):
    """A fleet from a sweep spec named by a relative path: the study keeps that sweep spec,
    so pareto and export read the study from any directory, even after the file is gone."""
    work = tmp_path / "work"
    work.mkdir()
    (work / "mine.toml").write_text(
        '[sweep]\nname = "mine"\nevaluator = "structural"\n'
        '[topology]\ncpus = [4, 64]\n[cache]\ncache = ["kmalloc-256"]\n'
        '[kernel]\nprofile = ["v6.18"]\n')
    spec = work / "swept.toml"
    spec.write_text(SWEEP_FLEET_SPEC.format(sweep="mine.toml", extra=""))
    p = run_cli("tune", "swept.toml", "--trials", "8", "--batch", "8", "--study", "rel",
                "--json", cwd=work)
    assert p.returncode == 0, p.stderr
    storage = json.loads(p.stdout)["storage"]
    s = optuna.load_study(study_name="rel", storage=storage)
    kept = s.user_attrs[studies.ATTR_FLEET_SWEEP]
    assert kept["name"] == "mine"
    (work / "mine.toml").unlink()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    p = run_cli("pareto", "--study", "rel", "--storage", storage, "--json", cwd=elsewhere)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["points"]
    spec2 = studies.study_spec(s)
    assert [t.topology.present for t in spec2.fleet.topologies] == [4, 64]
    assert spec2.fleet_sweep == kept


def test_structural_memory_steady_retention_worked_by_hand():
    """The tuner's fleet is in the steady state: each CPU retains its CPU slab and its
    per-CPU partial list at put_cpu_partial()'s mean length (C+1)(C+2)/(3(C+3)) for
    C = cpu_partial_slabs, half free (slub_set_cpu_partial()'s assumption), and each node
    with memory half of min_partial empty slabs.  skbuff_head_cache (256 bytes) on v6.1
    with 4 CPUs: order 0, 16 objects, cpu_partial 52 objects, so C = DIV_ROUND_UP(104, 16)
    = 7 (mean list 2.4 slabs); min_partial clamp(8 / 2, 5, 10) = 5."""
    from slabtune.model.caches import CacheInfo
    from slabtune.model.topology import Topology

    fleet = fleets.Fleet(profiles.get_profile("v6.1"),
                    (fleets.FleetTopology("smp-4", Topology(4, 4, 4, (4,), (True,)), 1.0),),
                    (CacheInfo("skbuff_head_cache", 232, 256, early=False),),
                    (fleets.FleetWorkload("w", 1.0, (64.0,), (1.0,), 0.5, 0.3),))
    ev = objectives.FleetEvaluator(fleet)
    overhead = 4 * (1 + 2.4) * 4096 * 0.5 + 5 / 2 * 4096        # 27852.8 + 10240
    live = 4 * 64 * 256
    assert float(ev.baseline.memory_topo[0, 0]) == pytest.approx(overhead / live, rel=1e-6)
    # the list's mean: a walk kept at 0 and restarted at 1 from C; none without lists
    lists = np.asarray(retention.per_cpu_partial_list_slabs(np.array([0, 1, 2, 7, 13])))
    np.testing.assert_allclose(lists, [0.0, 0.5, 0.8, 2.4, 14 * 15 / 48], rtol=1e-6)
    # drained (a finished workload): the same slabs, whole
    assert retention.retained_free_fraction("drained") == 1.0
    assert retention.retained_free_fraction("steady") == 0.5
    with pytest.raises(SlabtuneError, match="state"):
        retention.retained_free_fraction("idle")
    # the node's empty slabs: half way to min_partial under churn (get_partial_node() takes
    # them back), at min_partial once the workload has ended (discard only beyond it)
    assert float(retention.node_retained_slabs(5, "steady")) == 2.5
    assert float(retention.node_retained_slabs(5, "drained")) == 5.0
    assert float(retention.node_retained_slabs(10)) == 5.0
    with pytest.raises(SlabtuneError, match="state"):
        retention.node_retained_slabs(5, "idle")


def test_structural_memory_on_v7_has_no_cpu_slab_worked_by_hand():
    """From v7.0 every cache has sheaves and no CPU slab or per-CPU partial list (7.2.13 has
    no struct kmem_cache_cpu).  skbuff_head_cache (256 bytes) on v7.1 with 4 CPUs on one
    node: order 0, 16 objects, default sheaf capacity 26 rounded up to 28 (a 32 + 8 * 26 =
    240-byte sheaf is a 256-byte kmalloc object); min_partial 5.  Steady overhead: per CPU
    a main and a spare sheaf (2 * 256 bytes) and 28 objects (7168 bytes), the node's
    barn at half of its 10 full and 10 empty sheaves (5 * (256 + 7168) + 5 * 256), half of
    min_partial empty slabs (2.5 * 4096); and no CPU slab or per-CPU partial list, which
    v6.18 (opt-in sheaves, none for this cache) still charges as v6.1 does (the test above:
    4 CPUs * (1 + 2.4) slabs, half free)."""
    from slabtune.model.caches import CacheInfo
    from slabtune.model.topology import Topology

    def overhead(name):
        fleet = fleets.Fleet(profiles.get_profile(name),
                        (fleets.FleetTopology("smp-4", Topology(4, 4, 4, (4,), (True,)), 1.0),),
                        (CacheInfo("skbuff_head_cache", 232, 256, early=False),),
                        (fleets.FleetWorkload("w", 1.0, (64.0,), (1.0,), 0.5, 0.3),))
        return float(objectives.FleetEvaluator(fleet).baseline.memory_topo[0, 0])

    live = 4 * 64 * 256
    v71 = 4 * (2 * 256 + 28 * 256) + 5 * (256 + 28 * 256) + 5 * 256 + 2.5 * 4096
    assert overhead("v7.1") == pytest.approx(v71 / live, rel=1e-6)
    assert not profiles.get_profile("v7.0").has_cpu_slab
    assert profiles.get_profile("v6.18").has_cpu_slab and profiles.get_profile("v6.1").has_cpu_slab
    v618 = 4 * (1 + 2.4) * 4096 * 0.5 + 2.5 * 4096
    assert overhead("v6.18") == pytest.approx(v618 / live, rel=1e-6)
    assert float(retention.per_cpu_retained_slabs(7, cpu_slab=False)) == pytest.approx(2.4)


#: Every allocator op pays 10 ns whichever path it takes (fast or slow); nothing else costs
#: anything (no page allocator, no lock holds, no line transfers, so no queueing).
_PATH_NS = ("alloc_fast_ns", "free_fast_ns", "alloc_slow_ns", "free_slow_ns")
FLAT_COST = "[cost]\n" + "".join(
    f"{k} = {10.0 if k in _PATH_NS else 0.0}\n"
    for k in ("alloc_fast_ns", "free_fast_ns", "alloc_slow_ns", "free_slow_ns", "sheaf_swap_ns",
              "sheaf_object_ns", "cpu_partial_drain_ns", "list_lock_hold_ns",
              "barn_lock_hold_ns", "line_local_ns", "line_remote_ns", "pcp_call_ns",
              "buddy_call_ns", "zone_lock_hold_ns", "page_setup_ns", "object_setup_ns"))


def _spec_with_cost(path: str) -> str:
    text = studies.builtin_spec_path("tune_quick").read_text()
    assert "[objectives]\n" in text
    return text.replace("[objectives]\n", f'[objectives]\ncost = "{path}"\n', 1)


@pytest.mark.slow
def test_study_under_a_cost_file_keeps_it_and_prices_every_op_by_it(tmp_path):
    """[objectives] cost: the time objective is priced by that table.  Under FLAT_COST
    every op takes exactly one path (an alloc or free is fast or slow, never both, never
    twice), so every policy's time is 10 ns/op on every topology, while memory, which no
    cost constant touches, is the packaged study's.  The study keeps the file's text:
    after the file is gone, the spec read back from the study still prices by it."""
    work = tmp_path / "work"
    work.mkdir()
    (work / "flat.toml").write_text(FLAT_COST)
    (work / "spec.toml").write_text(_spec_with_cost("flat.toml"))
    p = run_cli("tune", "spec.toml", "--trials", "64", "--batch", "32", "--study", "flat",
                "--json", cwd=work)
    assert p.returncode == 0, p.stderr
    storage = json.loads(p.stdout)["storage"]
    s = optuna.load_study(study_name="flat", storage=storage)
    times = [t.values[1] for t in s.trials]
    assert len(times) == 64
    np.testing.assert_allclose(times, 10.0, rtol=1e-5)
    assert s.user_attrs[studies.ATTR_BASELINE]["time"] == pytest.approx(10.0, rel=1e-5)
    assert s.user_attrs[studies.ATTR_COST] == FLAT_COST
    assert s.user_attrs["slabtune_objectives"]["cost"] == "flat.toml"
    packaged = objectives.FleetEvaluator(studies.load_spec("tune_quick").fleet)
    params = [studies.effective_params(t.params, studies.study_spec(s)) for t in s.trials[:8]]
    np.testing.assert_allclose([t.values[0] for t in s.trials[:8]],
                               packaged.evaluate(params).memory, rtol=1e-6)
    (work / "flat.toml").unlink()
    spec = studies.study_spec(s)
    assert spec.cost_text == FLAT_COST
    assert float(np.asarray(studies.evaluator_for(spec).baseline.time)[0]) == pytest.approx(10.0)
    # resuming with the same (now missing) file is an error naming the field
    assert_clean_error(run_cli("tune", "spec.toml", "--trials", "1", "--study", "flat",
                               "--storage", storage, cwd=work), "objectives.cost")
    # ... and with a different file of that name
    (work / "flat.toml").write_text(FLAT_COST.replace("10.0", "20.0"))
    assert_clean_error(run_cli("tune", "spec.toml", "--trials", "1", "--study", "flat",
                               "--storage", storage, cwd=work), "objectives.cost")
    assert len(optuna.load_study(study_name="flat", storage=storage).trials) == 64


@pytest.mark.parametrize("cost, field", [
    (None, "objectives.cost: nope.toml"),
    ("[cost]\nfree_slow_ns = -5.0\n", "free_slow_ns"),
    ("[cost]\nfrobnicate_ns = 1.0\n", "frobnicate_ns"),
])
def test_bad_cost_file_is_one_line_naming_it(tmp_path, cost, field):
    name = "nope.toml" if cost is None else "bad.toml"
    if cost is not None:
        (tmp_path / name).write_text(cost)
    (tmp_path / "spec.toml").write_text(_spec_with_cost(name))
    p = run_cli("tune", "spec.toml", "--trials", "1", "--json", cwd=tmp_path)
    assert_clean_error(p, field)
    assert not (tmp_path / "runs").exists()


# --------------------------------------------------------------------------- reach


@pytest.mark.parametrize("reaches, want", [
    ((), "default"), (("boot",), "boot"), (("sysfs", "sysfs"), "sysfs"),
    (("sysfs", "boot"), "boot+sysfs"), (("boot", "sysfs", "kernel"), "kernel"),
    (("kernel",), "kernel"), (("slabinfo", "boot"), "boot+slabinfo"),
])
def test_policy_reach_is_the_most_a_changed_knob_needs(reaches, want):
    assert space.policy_reach(reaches) == want
    assert space.is_stock(want) == (want != "kernel")


def test_builtin_tune_specs_search_only_what_a_stock_kernel_takes():
    """Every built-in spec's knobs are boot parameters, sysfs files or /proc/slabinfo
    tunables, so every point of their fronts deploys on the kernel as built."""
    for name in ("tune_quick", "tune_dynamics", "tune_sweep_quick", "tune_slab_quick"):
        spec = studies.load_spec(name)
        assert spec.space.reach == "stock", name
        assert {k.reach for k in spec.space.knobs} <= {"boot", "sysfs", "slabinfo"}, name


_REACH_SPEC = ('[fleet]\nprofile = "v6.18"\n[[fleet.topology]]\ncpus = 8\n[[fleet.workload]]\n'
               '[fleet.workload.caches]\ndentry = { live_per_cpu = 1000 }\n'
               '"kmalloc-64" = { live_per_cpu = 1000 }\n[search]\n{reach}[search.knobs]\n'
               'slub_min_objects = { choices = [0, 16] }\n{knobs}\n')


def _reach_spec(reach: str, knobs: str) -> str:
    return _REACH_SPEC.replace("{reach}", reach).replace("{knobs}", knobs)


@pytest.mark.parametrize("knob", ["order_objects_mul = { low = 1, high = 8 }",
                                  "sheaf_small = { low = 0, high = 64 }",
                                  "barn_max_full = {}"])
def test_a_kernel_knob_needs_the_explicit_opt_in(knob):
    name = knob.split()[0]
    with pytest.raises(SlabtuneError) as err:
        studies.parse_spec(_reach_spec("", knob))
    msg = str(err.value)
    assert msg.startswith(f"search.knobs.{name}: needs a rebuilt kernel") and "\n" not in msg
    assert 'reach = "kernel"' in msg
    spec = studies.parse_spec(_reach_spec('reach = "kernel"\n', knob))
    assert spec.space.reach == "kernel" and name in spec.space.names
    with pytest.raises(SlabtuneError, match="search.reach: 'rebuilt' is not one of stock, kernel"):
        studies.parse_spec(_reach_spec('reach = "rebuilt"\n', knob))


def test_a_stored_spec_from_before_the_opt_in_still_reads():
    """Studies created when kernel knobs needed no opt-in keep opening (pareto, export):
    their stored spec reads with reach "kernel"."""
    text = _reach_spec("", "order_objects_mul = { low = 1, high = 8 }")
    spec = studies.parse_spec(text, stored=True)
    assert spec.space.reach == "kernel"


def test_live_knobs_follow_what_the_kernel_reads():
    """A changed knob counts only where the kernel reads it for some fleet cache:
    calculate_order() takes slub_min_objects over 4 * (fls(nr_cpus) + 1), so the
    coefficients are inert once it is set; the fleet (dentry 192 B, kmalloc-64) has no
    cache >= PAGE_SIZE, so set_cpu_partial()'s page class is inert; min_partial_lo above
    every cache's clamp(ilog2(size) / 2, 5, 10) changes every cache's value."""
    from slabtune.tuner import reach

    spec = studies.parse_spec(_reach_spec(
        'reach = "kernel"\n', "order_objects_mul = {}\ncpu_partial_page = {}\n"
        "cpu_partial_small = {}\nmin_partial_lo = {}"))
    got = reach.deploy_of(spec.fleet, [
        {"slub_min_objects": 16, "order_objects_mul": 7},
        {"slub_min_objects": 0, "order_objects_mul": 7},
        {"cpu_partial_page": 100, "min_partial_lo": 7},
        {"cpu_partial_small": 100},
        {"slub_min_objects": 16},
        {},
    ])
    assert [(d.live, d.inert, d.reach) for d in got] == [
        (("slub_min_objects",), ("order_objects_mul",), "boot"),
        (("order_objects_mul",), (), "kernel"),
        (("min_partial_lo",), ("cpu_partial_page",), "sysfs"),
        (("cpu_partial_small",), (), "sysfs"),
        (("slub_min_objects",), (), "boot"),
        ((), (), "default"),
    ]
    assert got[0].changed == 2 and got[4].changed == 1
    assert got[1].settings == {"min_objects rule": "7*(fls+1)"}
    assert got[2].settings == {"min_partial": "ilog2/2 in 7..10"}
    assert got[4].settings == {"slab_min_objects=": "16"}


@pytest.mark.slow
def test_cli_tune_refuses_a_kernel_knob_without_the_opt_in(tmp_path):
    bad = tmp_path / "kernel.toml"
    bad.write_text(studies.load_spec("tune_quick").text.replace(
        "[search.knobs]\n", "[search.knobs]\norder_objects_mul = { low = 1, high = 8 }\n"))
    assert_clean_error(run_cli("tune", str(bad), "--trials", "1", cwd=tmp_path),
                       "search.knobs.order_objects_mul: needs a rebuilt kernel")
    assert not (tmp_path / "runs").exists()

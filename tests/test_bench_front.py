"""benchmarks/bench_front.py runs end to end on tiny budgets and prints the JSON the issue
asks for; its hypervolume readings are those of the studies it fills."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent


def _bench():
    spec = importlib.util.spec_from_file_location("bench_front",
                                                  ROOT / "benchmarks" / "bench_front.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_enumerable_spec_keeps_the_fleet_and_replaces_the_knobs():
    bench = _bench()
    spec = bench.enum_spec("tune_quick", bench.ENUM_KNOBS["structural"])
    from slabtune.tuner import study as studies

    quick = studies.load_spec("tune_quick")
    assert spec.fleet == quick.fleet and spec.objectives == quick.objectives
    assert spec.space.names == ("slub_min_order", "slub_max_order", "slub_min_objects",
                                "cpu_partial_small")


def test_json_has_seconds_to_99pct_per_method_and_the_speedup(capsys):
    bench = _bench()
    bench.ENUM_KNOBS = dict(bench.ENUM_KNOBS, structural="""slub_min_order = { low = 0, high = 2 }
slub_max_order = { low = 0, high = 4 }
""")
    assert bench.main(["--sets", "structural", "--budget-structural", "0.5",
                       "--budget-enumerable", "0.5", "--population", "64", "--json"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    entry = out["structural"]
    assert set(entry["seconds_to_99pct"]) == set(bench.METHODS)
    assert entry["seconds_to_99pct"]["exhaustive"] is None      # not enumerable
    assert "speedup_vs_optuna" in entry and "speedup_is_lower_bound" in entry
    exact = entry["exact"]
    assert exact["space_size"] == 15 and exact["exact_front_size"] >= 1
    # nothing beats the exact front of the space it enumerated
    assert max(exact["hv_share_of_exact"].values()) <= 1 + 1e-6
    assert exact["hv_share_of_exact"]["exhaustive"] == 1.0


def test_hypervolume_of_a_study_counts_only_feasible_trials():
    import optuna

    from slabtune.tuner import study as studies

    bench = _bench()
    study = optuna.create_study(directions=["minimize", "minimize"])
    for values, excess in (([1.0, 1.0], 0.1), ([2.0, 2.0], -0.1)):
        study.add_trial(optuna.trial.create_trial(values=values,
                                                  constraints={studies.ATTR_EXCESS: excess}))
    curve = bench.Curve(np.array([2.0, 2.0]))
    curve.read(1.0, study)
    # only (2, 2) counts: normalised (1, 1) against the reference (1.2, 1.2)
    assert abs(curve.final - 0.04) < 1e-12


def test_slab_allocator_searches_tune_slab_quick_and_a_wider_space():
    """``--allocator slab``: the enumerable space is tune_slab_quick's own (4 x 6 x 6 x 4
    points), the searched one its knobs widened, both on its fleet with the set asked for."""
    bench = _bench()
    from slabtune.model import profiles
    from slabtune.tuner.grid import grid_of

    for set_name in ("structural", "dynamics"):
        searched, enumerable = bench.specs_for("slab", set_name)
        for spec in (searched, enumerable):
            assert profiles.is_slab(spec.fleet.profile)
            assert spec.objectives.name == set_name
        assert grid_of(enumerable.space).size == 4 * 6 * 6 * 4
        assert grid_of(searched.space).size == 11 * 512 * 256 * 65
        assert searched.fleet == enumerable.fleet

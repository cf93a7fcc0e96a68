"""The mapping soak of tests/test_soak_mappings.py, run as a process of its own: 50 distinct
run lengths through each entry point that takes one, and 20 objective instances, printing
the process's memory-mapping count (lines of /proc/self/maps) after each phase as one JSON
line.  ``python tests/soak_mappings.py [RUNS] [INSTANCES]``.

Each compiled dynamics program holds hundreds of mappings for the process's life (issue
35); before run lengths became traced values every distinct length compiled another, and
every objective instance its own jitted functions.
"""

from __future__ import annotations

import gc
import json
import sys
import tomllib


def maps() -> int:
    with open("/proc/self/maps") as f:
        return sum(1 for _ in f)


FLEET = """[fleet]
profile = "v6.18"

[[fleet.topology]]
name = "box-4"
cpus = 4
weight = 1.0

[[fleet.workload]]
name = "local"
foreign_free = 0.0
churn = 0.5
[fleet.workload.caches]
"kmalloc-256" = {{ live_per_cpu = {live} }}

[objectives]
set = "{set}"
{extra}
"""


def main(runs: int = 50, instances: int = 20) -> None:
    import jax
    import numpy as np

    from slabtune.model import dynamics, policy, profiles, slab_dynamics
    from slabtune.model.topology import Topology
    from slabtune.tuner import fleet as fleets
    from slabtune.tuner import objectives

    out = {"start": maps()}
    top = Topology.uniform(4, 2)
    prof = profiles.get_profile("v6.18")
    st = policy.structure(256, top.possible, top.present, top.online,
                          policy.profile_arrays(prof))
    cfg = dynamics.config_from(st, prof, top, {"kind": "local", "live": 48, "burst": 8})
    keys = jax.vmap(jax.random.key)(np.arange(4))
    cfgs = dynamics.stack_configs([cfg] * 4)
    lengths = [20 + 3 * i for i in range(runs)]
    for i, n in enumerate(lengths):
        dynamics.simulate_batch(keys, cfgs, n)
        dynamics.simulate(keys[0], cfg, n)
        if i == 0:
            out["slub_first"] = maps()
    out["slub"] = maps()
    w = dynamics.draws(keys[0], max(lengths))
    for n in lengths:
        dynamics.simulate_draws(w[:n], cfg)
    out["slub_draws"] = maps()
    sprof = profiles.SLAB_PROFILES["slab-v6.1"]
    scfg = slab_dynamics.config_from(slab_dynamics.structure_for(256, top, sprof), sprof, top,
                                     {"kind": "local", "live": 48, "burst": 8})
    scfgs = slab_dynamics.stack_configs([scfg] * 4)
    for i, n in enumerate(lengths):
        slab_dynamics.simulate_batch(keys, scfgs, n)
        if i == 0:
            out["slab_first"] = maps()
    out["slab_batch"] = maps()
    sw = slab_dynamics.draws(keys[0], max(lengths))
    for n in lengths:
        slab_dynamics.simulate_draws(sw[:n], scfg)
    out["slab"] = maps()
    for i in range(instances):
        kind = ("structural", "dynamics")[i % 2]
        # the structural instances evaluate one fleet (one compiled program, shared); the
        # dynamics instances fleets of one shape with other live sets and seeds
        extra = f"seed = {i}" if kind == "dynamics" else ""
        live = 64 + 8 * i if kind == "dynamics" else 64
        doc = tomllib.loads(FLEET.format(live=live, set=kind, extra=extra))
        ev = objectives.FleetEvaluator(fleets.parse_fleet(doc["fleet"], None),
                                       objectives.parse_objectives(doc["objectives"]))
        ev.evaluate([{}, {}, {}])
        if i < 2:
            out[f"objective_first_{kind}"] = maps()
    out["objectives"] = maps()
    # what a jax.clear_caches() (a teardown safety net) would give back
    jax.clear_caches()
    gc.collect()
    out["cleared"] = maps()
    print(json.dumps(out))


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:3]))

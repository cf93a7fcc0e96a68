"""Sweeps over SLAB profiles (issue 14 item 4): a spec's profile axis takes slab-* names
(and the group "slab"), the structural evaluator gives SLAB's calculate_slab_order() rows,
the dynamics evaluator runs model/slab_dynamics.py on them, and SLUB rows of a mixed grid
are what they are without the SLAB rows.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest

from slabtune.model import caches, cost, metrics, profiles, slab
from slabtune.model import slab_dynamics as sd
from slabtune.model.topology import Topology
from slabtune.sweeps import evaluators, grid
from slabtune.sweeps import spec as sweep_spec

STRUCT = """
[sweep]
name = "s"
evaluator = "structural"
[topology]
cpus = [1, 4, 64]
nodes = [1, 2]
[cache]
cache = ["kmalloc-64", "kmalloc-4k", "maple_node", "task_struct"]
[kernel]
profile = ["v6.1", "slab"]
"""

DYN = """
[sweep]
name = "d"
evaluator = "dynamics"
steps = 300
seed = 7
[topology]
cpus = [4]
nodes = [1, 2]
memoryless_nodes = [0, 1]
[cache]
cache = ["kmalloc-256", "kmalloc-4k"]
[kernel]
profile = ["v6.1", "slab-v2.6.33"]
[workload]
workload = ["local", "producer_consumer"]
"""


def _rows(spec, ch):
    cols = ch.columns
    names = {k: spec.axis(k).values for k in ("profile", "cache", "workload")
             if k in cols}
    for r in np.flatnonzero(ch.keep):
        row = {k: names[k][cols[k][r]] for k in names}
        row.update({k: int(cols[k][r]) for k in ("nodes", "memoryless_nodes") if k in cols})
        row["cpus"] = int(cols["cpus"][r])
        yield r, row


def test_profile_axis_takes_slab_names_and_group():
    spec = sweep_spec.parse(STRUCT)
    assert spec.axis("profile").values == ("v6.1",) + tuple(profiles.SLAB_PROFILES)


def test_structural_rows_are_calculate_slab_order():
    spec = sweep_spec.parse(STRUCT)
    ch = grid.chunk(spec, 0)
    res = evaluators.EVALUATORS["structural"].evaluate(spec, ch)
    seen = 0
    for r, row in _rows(spec, ch):
        if row["profile"] not in profiles.SLAB_PROFILES:
            continue
        prof = profiles.SLAB_PROFILES[row["profile"]]
        t = Topology.uniform(row["cpus"], row["nodes"])
        facts = slab.known_facts(row["cache"], prof) or slab.NO_FACTS
        st = slab.structure(caches.get_cache(row["cache"]).size, t.possible, t.node_cpus,
                            prof, facts=facts)
        got = {f: int(res[f][r]) for f in evaluators.STRUCTURE_FIELDS}
        assert got == dict.fromkeys(evaluators.STRUCTURE_FIELDS, 0) | {
            "nr_cpus": t.possible, "order": st.order, "objs_per_slab": st.objs_per_slab,
            "leftover": st.left_over}, row
        seen += 1
    assert seen == 3 * 4 * 3 * 2


def test_dynamics_slab_rows_are_the_slab_model_and_slub_rows_unchanged():
    spec = sweep_spec.parse(DYN)
    ch = grid.chunk(spec, 0)
    ev = evaluators.EVALUATORS["dynamics"]
    res = ev.evaluate(spec, ch)
    table = evaluators._default_cost()
    slab_mask = evaluators.slab_row_mask(spec, ch.columns)
    # SLUB rows: the same chunk with the SLAB rows excluded gives the same numbers
    alone = ev.evaluate(spec, ch._replace(keep=ch.keep & ~slab_mask))
    slub = np.flatnonzero(ch.keep & ~slab_mask)
    for m in ("alloc_fastpath_frac", "ns_per_op", "memory_bytes"):
        np.testing.assert_array_equal(res[m][slub], alone[m][slub], err_msg=m)
    # SLAB rows: built by hand from the model's entry points, with the grid's random keys
    checked = 0
    for r, row in _rows(spec, ch):
        if row["profile"] not in profiles.SLAB_PROFILES:
            continue
        prof = profiles.SLAB_PROFILES[row["profile"]]
        nodes, ml = row["nodes"], row["memoryless_nodes"]
        t = Topology.uniform(row["cpus"], nodes,
                             memoryless_nodes=tuple(range(nodes - ml, nodes)))
        size = {"kmalloc-256": 256, "kmalloc-4k": 4096}[row["cache"]]
        st = sd.structure_for(size, t, prof,
                              facts=slab.known_facts(row["cache"], prof) or slab.NO_FACTS)
        cfg = sd.config_from(st, prof, t, {"kind": row["workload"]})
        key = jax.random.fold_in(jax.random.key(spec.seed), np.uint32(ch.start + r))
        c = sd.simulate(key, cfg, spec.steps)
        cnt, view = sd.slub_view(c, cfg)
        m = metrics.compute(cnt, view, table, pcp_max=cost.pcp_max_order(prof.version),
                            object_size=size, steps=spec.steps)
        w = np.asarray(cfg.rep_weight, np.float64)
        hit = (w * np.asarray(c.alloc_fast)).sum() / (w * np.asarray(c.allocs)).sum()
        assert float(res["alloc_fastpath_frac"][r]) == pytest.approx(hit, rel=1e-5), row
        assert float(res["ns_per_op"][r]) == pytest.approx(float(m.ns_per_op), rel=1e-4), row
        assert float(res["memory_bytes"][r]) == pytest.approx(float(m.memory_bytes),
                                                              rel=1e-5), row
        checked += 1
    # cpus x (1 node, 2 nodes, 2 nodes one memoryless) x caches x SLAB profiles x workloads
    assert checked == 1 * 3 * 2 * 1 * 2


@pytest.mark.parametrize("axis, value, knob", [
    ("min_order", "[0, 1]", "slub_min_order"),
    ("max_order", "1", "slub_max_order"),
    ("min_objects", "[0, 8]", "slub_min_objects"),
])
def test_a_slub_boot_axis_on_an_all_slab_grid_is_one_line(axis, value, knob):
    text = STRUCT.replace('profile = ["v6.1", "slab"]', 'profile = "slab"') + \
        f"[boot]\n{axis} = {value}\n"
    with pytest.raises(sweep_spec.SpecError) as err:
        sweep_spec.parse(text)
    msg = str(err.value)
    assert "\n" not in msg
    assert msg.endswith(f"boot.{axis}: {knob} is a SLUB knob ({slab.SLUB_ONLY_KNOBS[knob]});"
                        " profile slab-v2.6.33 is SLAB"), msg
    # beside a SLUB profile the axis applies to the SLUB rows
    sweep_spec.parse(text.replace('profile = "slab"', 'profile = ["v6.1", "slab"]'))


def test_the_builtin_slab_vs_slub_spec_loads():
    spec = sweep_spec.load("slab_vs_slub")
    assert set(spec.axis("profile").values) == {"v6.1", "slab-v6.1", "v3.1", "slab-v3.1"}
    assert grid.count_rows(spec) == 14 * 4 * 4 * 2 - 4 * 4

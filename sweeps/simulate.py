"""Run validated simulation configurations: structure, dynamics, metrics.

:class:`~slabtune.sweeps.simconfig.SimSpec` -> structural prediction
(:func:`slabtune.model.policy.structure`) -> :class:`~slabtune.model.dynamics.SimConfig` ->
counters (:func:`slabtune.model.dynamics.simulate_batch`) -> metrics
(:func:`slabtune.model.metrics.compute`).  Configurations are run as one padded batch per
step count, so a handful of configurations share one compiled program (and JAX's persistent
compilation cache, see :func:`slabtune.sweeps.evaluators.configure_jax`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from slabtune.model import cost as C
from slabtune.model import profiles as P
from slabtune.sweeps.simconfig import ConfigError, SimSpec

#: Configurations per compiled batch (padded by repeating the first).
BATCH = 16

STRUCT_FIELDS = ("nr_cpus", "min_objects", "order", "objs_per_slab", "leftover",
                 "min_partial", "cpu_partial", "cpu_partial_slabs", "sheaf_capacity")


def effective_profile(spec: SimSpec) -> P.KernelProfile:
    """The spec's profile with the sysfs-style overrides that act through profile data
    (a cpu_partial override is the same number in every size class)."""
    prof = spec.profile
    if "cpu_partial" in spec.knobs:
        v = spec.knobs["cpu_partial"]
        prof = dataclasses.replace(prof, cpu_partial_objects=(v, v, v, v))
    return prof


def structure_of(spec: SimSpec):
    """The structural prediction for the spec's cache, topology, profile and boot params."""
    from slabtune.model import policy as PL

    prof = effective_profile(spec)
    t, c, b = spec.topology, spec.cache, spec.boot
    return PL.structure(c.size, t.possible, t.present, t.online, PL.profile_arrays(prof),
                        min_order=b.min_order, max_order=b.max_order,
                        min_objects=b.min_objects, early=c.early, is_kmalloc=c.is_kmalloc,
                        is_bootstrap=c.is_bootstrap, explicit_sheaf=c.explicit_sheaf)


def sim_config(spec: SimSpec, structure):
    """The dynamics configuration of a spec."""
    from slabtune.model import dynamics as D
    from slabtune.model import workloads as W

    kw: dict[str, Any] = {}
    if "min_partial" in spec.knobs:
        kw["min_partial"] = spec.knobs["min_partial"]
    if "sheaf_capacity" in spec.knobs:
        kw["sheaf_capacity"] = spec.knobs["sheaf_capacity"]
    try:
        workload = W.build(spec.workload_kind, spec.topology, **spec.workload_params)
    except W.WorkloadError as err:
        raise ConfigError(f"workload.{err}") from None
    return D.config_from(structure, effective_profile(spec), spec.topology, workload, **kw)


def run(specs: list[SimSpec], cost: C.CostParams) -> list[dict[str, Any]]:
    """Simulate every spec; return one flat dict per spec: the structural fields, the
    metrics (``page_allocs_per_kop_by_order`` as a list) and the configuration."""
    import jax

    from slabtune.sweeps.evaluators import configure_jax

    configure_jax()
    from slabtune.model import dynamics as D
    from slabtune.model import metrics as M

    structs = [structure_of(s) for s in specs]
    cfgs = [sim_config(s, st) for s, st in zip(specs, structs)]
    results: list[dict[str, Any] | None] = [None] * len(specs)
    by_steps: dict[int, list[int]] = {}
    for i, s in enumerate(specs):
        by_steps.setdefault(s.steps, []).append(i)
    batch_metrics = jax.jit(jax.vmap(
        lambda cnt, cfg, pcp, osz, steps, other: M.compute(
            cnt, cfg, cost, pcp_max=pcp, object_size=osz, steps=steps, other_ns=other)))
    for steps, idx in by_steps.items():
        for lo in range(0, len(idx), BATCH):
            chunk = idx[lo:lo + BATCH]
            pad = chunk + [chunk[0]] * (BATCH - len(chunk))
            stacked = D.stack_configs([cfgs[i] for i in pad])
            keys = jax.vmap(jax.random.key)(np.array([specs[i].seed for i in pad], np.uint32))
            counters = D.simulate_batch(keys, stacked, steps)
            pcp = np.array([C.pcp_max_order(specs[i].profile.version) for i in pad], np.int32)
            osz = np.array([specs[i].cache.object_size for i in pad], np.float32)
            stp = np.full(len(pad), steps, np.float32)
            other = np.array([specs[i].other_ns for i in pad], np.float32)
            met = batch_metrics(counters, stacked, pcp, osz, stp, other)
            met = {k: np.asarray(v) for k, v in met._asdict().items()}
            for j, i in enumerate(chunk):
                row: dict[str, Any] = {f: int(np.asarray(getattr(structs[i], f)))
                                       for f in STRUCT_FIELDS}
                for k, v in met.items():
                    row[k] = v[j].tolist() if v[j].ndim else float(v[j])
                row["config"] = specs[i].describe()
                results[i] = row
    return results  # type: ignore[return-value]

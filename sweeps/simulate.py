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
import functools
from typing import Any

import numpy as np

from slabtune.model import cost as cost_model
from slabtune.model import policy, profiles
from slabtune.model.constants import STRUCTURE_FIELDS
from slabtune.sweeps.simconfig import ConfigError, SimSpec

#: Configurations per compiled batch (padded by repeating the first).
BATCH = 16



def effective_profile(spec: SimSpec) -> profiles.KernelProfile:
    """The spec's profile with the sysfs-style overrides that act through profile data
    (a cpu_partial override is the same number in every size class)."""
    prof = spec.profile
    if "cpu_partial" in spec.knobs:
        v = spec.knobs["cpu_partial"]
        prof = dataclasses.replace(prof, cpu_partial_objects=(v, v, v, v))
    return prof


def structure_of(spec: SimSpec):
    """The structural prediction for the spec's cache, topology, profile and boot params."""

    prof = effective_profile(spec)
    t, c, b = spec.topology, spec.cache, spec.boot
    return policy.structure(c.size, t.possible, t.present, t.online, policy.profile_arrays(prof),
                        min_order=b.min_order, max_order=b.max_order,
                        min_objects=b.min_objects, early=c.early, is_kmalloc=c.is_kmalloc,
                        is_bootstrap=c.is_bootstrap, explicit_sheaf=c.explicit_sheaf)


def sim_config(spec: SimSpec, structure):
    """The dynamics configuration of a spec."""
    from slabtune.model import dynamics, workloads

    kw: dict[str, Any] = {}
    if "min_partial" in spec.knobs:
        kw["min_partial"] = spec.knobs["min_partial"]
    if "sheaf_capacity" in spec.knobs:
        kw["sheaf_capacity"] = spec.knobs["sheaf_capacity"]
    try:
        workload = workloads.build(spec.workload_kind, spec.topology, **spec.workload_params)
    except workloads.WorkloadError as err:
        raise ConfigError(f"workload.{err}") from None
    return dynamics.config_from(structure, effective_profile(spec), spec.topology, workload,
                         ops_per_step=spec.ops_per_step, **kw)


def simulate_specs(specs: list[SimSpec]):
    """Structure, dynamics configuration and counters of every spec (one padded batch per
    step count); returns three lists in the order of ``specs``."""
    import jax

    from slabtune.sweeps.evaluators import configure_jax

    configure_jax()
    from slabtune.model import dynamics

    structs = [structure_of(s) for s in specs]
    cfgs = [sim_config(s, st) for s, st in zip(specs, structs)]
    counters: list[Any] = [None] * len(specs)
    by_steps: dict[int, list[int]] = {}
    for i, s in enumerate(specs):
        by_steps.setdefault(s.steps, []).append(i)
    for steps, idx in by_steps.items():
        for lo in range(0, len(idx), BATCH):
            chunk = idx[lo:lo + BATCH]
            pad = chunk + [chunk[0]] * (BATCH - len(chunk))
            stacked = dynamics.stack_configs([cfgs[i] for i in pad])
            keys = jax.vmap(jax.random.key)(np.array([specs[i].seed for i in pad], np.uint32))
            out = dynamics.simulate_batch(keys, stacked, steps)
            for j, i in enumerate(chunk):
                counters[i] = jax.tree_util.tree_map(lambda x, j=j: np.asarray(x[j]), out)
    return structs, cfgs, counters


@functools.lru_cache(maxsize=1)
def _metrics_fn():
    import jax

    from slabtune.model import metrics

    return jax.jit(jax.vmap(
        lambda cnt, cfg, cost, pcp, osz, steps, other: metrics.compute(
            cnt, cfg, cost, pcp_max=pcp, object_size=osz, steps=steps, other_ns=other),
        in_axes=(0, 0, None, 0, 0, 0, 0)))


def _batch_metrics(*args):
    return _metrics_fn()(*args)


def metrics_of(specs: list[SimSpec], structs, cfgs, counters, cost: cost_model.CostParams
               ) -> list[dict[str, Any]]:
    """One flat dict per spec: structural fields, metrics (the by-order vector as a list)
    and the configuration spelled out."""
    import jax

    from slabtune.model import dynamics

    n = len(specs)
    pad = list(range(n)) + [0] * (-n % BATCH)
    stacked = dynamics.stack_configs([cfgs[i] for i in pad])
    cnts = jax.tree_util.tree_map(lambda *xs: np.stack(xs), *[counters[i] for i in pad])
    pcp = np.array([cost_model.pcp_max_order(specs[i].profile.version) for i in pad], np.int32)
    osz = np.array([specs[i].cache.object_size for i in pad], np.float32)
    stp = np.array([specs[i].steps for i in pad], np.float32)
    other = np.array([specs[i].other_ns for i in pad], np.float32)
    met = _batch_metrics(cnts, stacked, cost, pcp, osz, stp, other)
    met = {k: np.asarray(v) for k, v in met._asdict().items()}
    results = []
    for i in range(n):
        row: dict[str, Any] = {f: int(np.asarray(getattr(structs[i], f))) for f in STRUCTURE_FIELDS}
        for k, v in met.items():
            row[k] = v[i].tolist() if v[i].ndim else float(v[i])
        row["config"] = specs[i].describe()
        results.append(row)
    return results


def run(specs: list[SimSpec], cost: cost_model.CostParams) -> list[dict[str, Any]]:
    """Simulate every spec and compute its metrics (see :func:`metrics_of`)."""
    structs, cfgs, counters = simulate_specs(specs)
    return metrics_of(specs, structs, cfgs, counters, cost)

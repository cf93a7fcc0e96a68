"""Run validated simulation configurations: structure, dynamics, metrics.

:class:`~slabtune.sweeps.simconfig.SimSpec` -> structural prediction
(:func:`slabtune.model.policy.structure`) -> :class:`~slabtune.model.dynamics.SimConfig` ->
counters (:func:`slabtune.model.dynamics.simulate_batch`) -> metrics
(:func:`slabtune.model.metrics.compute`).  Configurations are run as one padded batch per
step count, so a handful of configurations share one compiled program (and JAX's persistent
compilation cache, see :func:`slabtune.sweeps.evaluators.configure_jax`).

A spec whose profile is SLAB (:func:`slabtune.model.profiles.is_slab`) takes the SLAB path
instead: :func:`slabtune.model.slab.structure` -> :class:`~slabtune.model.slab_dynamics.
SlabSimConfig` -> :func:`slabtune.model.slab_dynamics.simulate_batch`, SLAB and SLUB specs
in separate batches; the SLAB counters are priced by the same
:func:`slabtune.model.metrics.compute` through
:func:`slabtune.model.slab_dynamics.slub_view`.  For a SLAB spec, ``structs[i]`` is a
:class:`~slabtune.model.slab.SlabStructure`, ``cfgs[i]`` a ``SlabSimConfig`` and
``counters[i]`` ``SlabCounters`` (``slub_view(counters[i], cfgs[i])`` gives them in SLUB's
types).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import numpy as np

from slabtune.model import cost as cost_model
from slabtune.model import limits, policy, profiles, slab
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


def is_slab_spec(spec: SimSpec) -> bool:
    """Whether the spec runs SLAB (mm/slab.c) rather than SLUB."""
    return profiles.is_slab(spec.profile)


def slab_structure_of(spec: SimSpec) -> slab.SlabStructure:
    """SLAB's structure of the spec's cache on its topology: calculate_slab_order() under
    ``slab_max_order`` (the kernel's default cap when not given) with the cache's creation
    facts where known (6.1 kmalloc freelist caches), enable_cpucache()'s tunables."""
    t, c = spec.topology, spec.cache
    facts = slab.known_facts(c.name, spec.profile) or slab.NO_FACTS
    return slab.structure(c.size, t.possible, t.node_cpus, spec.profile,
                          max_order=spec.boot_given.get("slab_max_order"), facts=facts)


def structure_of(spec: SimSpec):
    """The structural prediction for the spec's cache, topology, profile and boot params."""
    if is_slab_spec(spec):
        return slab_structure_of(spec)
    prof = effective_profile(spec)
    t, c, b = spec.topology, spec.cache, spec.boot
    return policy.structure(c.size, t.possible, t.present, t.online, policy.profile_arrays(prof),
                        min_order=b.min_order, max_order=b.max_order,
                        min_objects=b.min_objects, early=c.early, is_kmalloc=c.is_kmalloc,
                        is_bootstrap=c.is_bootstrap, explicit_sheaf=c.explicit_sheaf)


def _workload(spec: SimSpec):
    from slabtune.model import workloads

    try:
        return workloads.build(spec.workload_kind, spec.topology, **spec.workload_params)
    except workloads.WorkloadError as err:
        raise ConfigError(f"workload.{err}") from None


def slab_sim_config(spec: SimSpec, structure: slab.SlabStructure):
    """The SLAB dynamics configuration of a spec: the /proc/slabinfo tunables it gives
    (limit, batchcount, shared) over the cache's own, the numa_mem_id() switch from its
    profile (``memoryless_fallback`` applied), no cache_reap() run."""
    from slabtune.model import slab_dynamics

    kw = {k: spec.knobs[k] for k in slab.SLAB_TUNABLES if k in spec.knobs}
    return slab_dynamics.config_from(structure, spec.profile, spec.topology, _workload(spec),
                                     **kw)


def sim_config(spec: SimSpec, structure):
    """The dynamics configuration of a spec."""
    from slabtune.model import dynamics

    if is_slab_spec(spec):
        return slab_sim_config(spec, structure)
    kw: dict[str, Any] = {}
    if "min_partial" in spec.knobs:
        kw["min_partial"] = spec.knobs["min_partial"]
    if "sheaf_capacity" in spec.knobs:
        kw["sheaf_capacity"] = spec.knobs["sheaf_capacity"]
    workload = _workload(spec)
    return dynamics.config_from(structure, effective_profile(spec), spec.topology, workload,
                         ops_per_step=spec.ops_per_step, **kw)


def bursts_together(cfg):
    """``cfg`` (a SLUB or SLAB SimConfig) with every bursty rep's first burst a whole one,
    all starting at once, instead of :func:`slabtune.model.workloads.burst_phase_first`'s
    spread: the lab's lockstep schedule, whose workers step together from the first op."""
    return cfg._replace(workload=cfg.workload._replace(phase_first=cfg.workload.burst))


def simulate_specs(specs: list[SimSpec], together=None):
    """Structure, dynamics configuration and counters of every spec (one padded batch per
    step count); returns three lists in the order of ``specs``.  ``together`` (one bool per
    spec, default none): those specs' bursty reps start in step (:func:`bursts_together`).
    Refused before anything runs when the batch is over model.limits' ``model_ops``."""
    limits.check("model_ops", sum(limits.model_ops(s.topology.present, s.steps, s.ops_per_step)
                                  for s in specs),
                 "run.steps", f" of {len(specs)} config{'s' if len(specs) != 1 else ''}")
    import jax

    from slabtune.sweeps.evaluators import configure_jax

    configure_jax()
    from slabtune.model import dynamics, slab_dynamics
    from slabtune.sweeps import dynsim

    structs = [structure_of(s) for s in specs]
    cfgs = [sim_config(s, st) for s, st in zip(specs, structs)]
    if together is not None:
        cfgs = [bursts_together(c) if t else c for c, t in zip(cfgs, together)]
    counters: list[Any] = [None] * len(specs)
    by_steps: dict[tuple[bool, int], list[int]] = {}
    for i, s in enumerate(specs):
        by_steps.setdefault((is_slab_spec(s), s.steps), []).append(i)
    for (is_slab, steps), idx in by_steps.items():
        model = slab_dynamics if is_slab else dynamics
        for lo in range(0, len(idx), BATCH):
            chunk = idx[lo:lo + BATCH]
            pad = chunk + [chunk[0]] * (BATCH - len(chunk))
            stacked = model.stack_configs([cfgs[i] for i in pad])
            keys = jax.vmap(jax.random.key)(np.array([specs[i].seed for i in pad], np.uint32))
            out = (dynsim.run_slab_batch(keys, stacked, steps) if is_slab
                   else dynsim.run_batch(keys, stacked, steps))
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


def structure_row(spec: SimSpec, struct) -> dict[str, Any]:
    """The structural columns of a result row (:data:`STRUCTURE_FIELDS`, plus
    ``allocator``).  A SLAB structure fills the ones SLAB has (order, objects per slab,
    leftover; nr_cpus is its possible CPUs, which enable_cpucache() reads) and 0 for SLUB's
    own (min_objects, partial lists, sheaves), and adds its array tunables as the run
    uses them (the spec's /proc/slabinfo overrides over the cache's own: limit,
    batchcount, sharedfactor, and the alien array entries do_tune_cpucache() sizes from
    the limit)."""
    if not isinstance(struct, slab.SlabStructure):
        row: dict[str, Any] = {f: int(np.asarray(getattr(struct, f)))
                               for f in STRUCTURE_FIELDS}
        row["allocator"] = "SLUB"
        return row
    row = dict.fromkeys(STRUCTURE_FIELDS, 0)
    row.update(nr_cpus=spec.topology.possible, order=struct.order,
               objs_per_slab=struct.objs_per_slab, leftover=struct.left_over)
    row.update(allocator="SLAB", limit=struct.limit, batchcount=struct.batchcount,
               shared=struct.shared)
    row.update({k: spec.knobs[k] for k in slab.SLAB_TUNABLES if k in spec.knobs})
    row["alien_limit"] = slab.retuned_alien_limit(int(struct.alien_limit), row["limit"])
    return row


def _priced(specs, cfgs, counters, idx):
    """Stacked (Counters, SimConfig) of specs ``idx`` in SLUB's types (SLAB's through
    :func:`slabtune.model.slab_dynamics.slub_view`)."""
    import jax

    from slabtune.model import dynamics, slab_dynamics

    stack = lambda xs: jax.tree_util.tree_map(lambda *a: np.stack(a), *xs)  # noqa: E731
    if is_slab_spec(specs[idx[0]]):
        c, cfg = slab_dynamics.slub_view(stack([counters[i] for i in idx]),
                                         slab_dynamics.stack_configs([cfgs[i] for i in idx]))
        return jax.tree_util.tree_map(np.asarray, c), jax.tree_util.tree_map(np.asarray, cfg)
    return stack([counters[i] for i in idx]), dynamics.stack_configs([cfgs[i] for i in idx])


def metrics_of(specs: list[SimSpec], structs, cfgs, counters, cost: cost_model.CostParams
               ) -> list[dict[str, Any]]:
    """One flat dict per spec: structural fields (:func:`structure_row`), metrics (the
    by-order vector as a list) and the configuration spelled out.  SLAB and SLUB specs are
    priced in separate batches by the same :func:`slabtune.model.metrics.compute`."""
    n = len(specs)
    results: list[Any] = [None] * n
    groups: dict[bool, list[int]] = {}
    for i, s in enumerate(specs):
        groups.setdefault(is_slab_spec(s), []).append(i)
    for idx in groups.values():
        pad = idx + [idx[0]] * (-len(idx) % BATCH)
        cnts, stacked = _priced(specs, cfgs, counters, pad)
        pcp = np.array([cost_model.pcp_max_order(specs[i].profile.version) for i in pad],
                       np.int32)
        osz = np.array([specs[i].cache.object_size for i in pad], np.float32)
        stp = np.array([specs[i].steps for i in pad], np.float32)
        other = np.array([specs[i].other_ns for i in pad], np.float32)
        met = _batch_metrics(cnts, stacked, cost, pcp, osz, stp, other)
        met = {k: np.asarray(v) for k, v in met._asdict().items()}
        for j, i in enumerate(idx):
            row = structure_row(specs[i], structs[i])
            for k, v in met.items():
                row[k] = v[j].tolist() if v[j].ndim else float(v[j])
            row["config"] = specs[i].describe()
            results[i] = row
    return results


def run(specs: list[SimSpec], cost: cost_model.CostParams) -> list[dict[str, Any]]:
    """Simulate every spec and compute its metrics (see :func:`metrics_of`)."""
    structs, cfgs, counters = simulate_specs(specs)
    return metrics_of(specs, structs, cfgs, counters, cost)

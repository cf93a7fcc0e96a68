"""The model's side of a validation pair: predicted cost and slab memory for exactly what the
target ran.
"""


from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from slabtune.model import profiles
from slabtune.model.topology import Topology
from slabtune.validate.spec import parse_spec

# --------------------------------------------------------------------------- model side


@functools.lru_cache(maxsize=64)
def _evaluator(profile_name: str, spec_text: str, topology_name: str):
    """A cost/memory Evaluator for one topology of the spec under one profile (cached per
    worker process: building one compiles the objective)."""
    from slabtune.tuner import fleet as fleets
    from slabtune.tuner import objectives

    spec = parse_spec(spec_text, "spec")
    topo = next(t for t in spec.fleet.topologies if t.name == topology_name)
    fleet = dataclasses.replace(spec.fleet, profile=profiles.get_profile(profile_name),
                                topologies=(fleets.FleetTopology(topo.name, topo.topology, 1.0),))
    return objectives.FleetEvaluator(fleet)


def predicted_cost(profile: profiles.KernelProfile, spec_text: str, topology_name: str,
                   params: Mapping[str, int]) -> float:
    """Modelled ns per op of the spec's model workload for a policy on one topology."""
    ev = _evaluator(profile.name, spec_text, topology_name)
    return float(ev.evaluate([dict(params)]).time_topo[0, 0])


def predicted_slab_bytes(profile: profiles.KernelProfile, topology: Topology,
                         boot: Mapping[str, int], caches: Sequence, live_objects: Sequence[int],
                         traffic: Sequence[float] | None = None) -> np.ndarray:
    """The structural memory model's slab bytes (live + overhead) per cache at the end of a
    workload (``state="drained"`` of :func:`slabtune.model.retention.structural_memory`)
    when each holds ``live_objects`` objects spread over the topology's CPUs.  ``traffic``
    (per cache: objects allocated during the workload, ``inf`` for a cache the workload
    churns; None: every cache churned) bounds the slabs the CPUs and nodes retain.
    ``caches`` are :class:`slabtune.model.caches.CacheInfo`."""
    from slabtune.model import policy, retention
    from slabtune.tuner import fleet as fleets
    from slabtune.tuner import objectives
    from slabtune.tuner.space import baseline_values

    cpus = max(topology.present, 1)
    wl = fleets.FleetWorkload("measured", 1.0, tuple(float(n) / cpus for n in live_objects),
                    tuple(1.0 for _ in caches), 0.5, 0.0)
    fleet = fleets.Fleet(profile, (fleets.FleetTopology("t", topology, 1.0),), tuple(caches), (wl,))
    fa = fleets.fleet_arrays(fleet)
    vals = baseline_values(profile)
    vals.update({k: int(v) for k, v in boot.items()})
    prof = policy.profile_arrays(profile)
    st, _ = objectives.policy_structure({k: np.array([v], np.int32) for k, v in vals.items()},
                                        prof, fa)
    tr = None if traffic is None else np.asarray(traffic, np.float32)
    overhead, live = retention.structural_memory(st, fa,
                                         np.array([vals["barn_max_full"]], np.float32),
                                         np.array([vals["barn_max_empty"]], np.float32),
                                         prof.barns, state="drained", traffic=tr,
                                         cpu_slab=profile.has_cpu_slab)
    return np.asarray(overhead + live, np.float64)[0, 0, 0, :]


def dump_traffic(before: Mapping[str, Any], after: Mapping[str, Any]) -> int:
    """The fewest objects a cache can have allocated between two dumps: every object that
    the dumps show allocated or freed in between (``objects``), or every object of the slabs
    created or discarded in between (``total_objects``: a slab is allocated only for an
    allocation and discarded only after frees), whichever is more.  A lower bound: objects
    allocated and freed again between the dumps leave no trace in either count."""
    d_obj = abs(int(after.get("objects") or 0) - int(before.get("objects") or 0))
    d_tot = abs(int(after.get("total_objects") or 0) - int(before.get("total_objects") or 0))
    return max(d_obj, d_tot)


def live_objects(after: Mapping[str, Any], flushed: Mapping[str, Any] | None) -> tuple[int, str]:
    """The objects a cache really had allocated at the after-dump, and where that count
    came from.

    sysfs ``objects`` (show_slab_objects() with SO_ALL|SO_OBJECTS) is the node's
    total_objects minus the free objects of its *node* partial lists: the free objects of
    a CPU slab and of the per-CPU partial slabs count as allocated.  After flush_all()
    (the guest's ``flushed`` dump, see :func:`slabtune.kernel.guest.init_script`) those
    slabs sit on the node partial lists or went back to the page allocator, so the flushed
    ``objects`` is the allocated count.  Without a flushed dump (an older run, a kernel
    whose cpu_partial cannot be written) the after-dump's count is used and said so."""
    if flushed is not None and flushed.get("objects") is not None:
        return int(flushed["objects"]), "flushed"
    return int(after.get("objects") or 0), "after (includes free objects on per-CPU slabs)"

"""What deploying a policy takes: the knobs it changes that change something on the fleet
(*live*), the ones it sets to no effect (*inert*), its reach (:func:`space.policy_reach`)
and its settings as a kernel engineer names them (:func:`space.settings`).

A changed SLUB knob is live when putting it back to the kernel's value changes the structure
(order, objects per slab, min_partial, cpu_partial, sheaf capacity...: policy.Structure) of
some (topology, cache) point of the fleet: e.g. calculate_order() never reads
``order_objects_*`` once ``slub_min_objects`` is set, and a cpu_partial size class no fleet
cache falls in changes nothing.  Two exceptions not in the structure: ``slub_nomerge`` is
live when some fleet caches merge (find_mergeable(); tuner/fleet.py merge_roots), barn
limits whenever the profile has barns.  A changed SLAB knob is always live.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping, Sequence

import numpy as np

from slabtune.model import policy, profiles
from slabtune.tuner import space as search_space
from slabtune.tuner.fleet import Fleet, fleet_arrays

#: Changed knobs whose effect the structure does not show (see the module docstring).
_NOT_STRUCTURAL = ("slub_nomerge", "barn_max_full", "barn_max_empty")


@dataclasses.dataclass(frozen=True)
class Deploy:
    """One policy: its live and inert changed knobs, reach and engineer-named settings."""

    live: tuple[str, ...]
    inert: tuple[str, ...]
    reach: str
    settings: Mapping[str, str]

    @property
    def changed(self) -> int:
        """Knobs that differ from the kernel's values (live or not)."""
        return len(self.live) + len(self.inert)

    #: ``inert`` as a kernel engineer names them (space.engineer_name).
    inert_names: tuple[str, ...] = ()

    def as_dict(self) -> dict:
        return {"reach": self.reach, "settings": dict(self.settings), "knobs": list(self.live),
                "inert": list(self.inert), "inert_names": list(self.inert_names),
                "changed": self.changed}


def changed_knobs(values: Mapping[str, int], base: Mapping[str, int]) -> list[str]:
    """Knobs whose value differs from ``base`` (the kernel's), in ``values`` order."""
    return [k for k, v in values.items() if k in base and int(v) != int(base[k])]


def _merges(fleet: Fleet) -> bool:
    roots = fleet_arrays(fleet).merge_root
    return roots is not None and bool((roots != np.arange(len(roots))).any())


def _bucket(n: int) -> int:
    """Rows padded to a power of two (at least 16), so a few compiled shapes serve all."""
    return max(16, 1 << (n - 1).bit_length())


@functools.lru_cache(maxsize=8)
def _structure_fn(fleet: Fleet):
    """A jitted map from every knob's (B,) values to the fleet's structure fields, stacked
    as (B, fields, T * K) (tuner.objectives.policy_structure)."""
    import jax
    import jax.numpy as jnp

    from slabtune.tuner.objectives import policy_structure

    prof, fa = policy.profile_arrays(fleet.profile), fleet_arrays(fleet)

    def fn(vals):
        st, _ = policy_structure(vals, prof, fa)
        b = next(iter(vals.values())).shape[0]
        shape = jnp.broadcast_shapes((b, 1, 1), *(jnp.shape(a) for a in st))
        return jnp.stack([jnp.broadcast_to(a, shape).reshape(b, -1).astype(jnp.int32)
                          for a in st], axis=1)

    jitted = jax.jit(fn)
    return lambda vals: np.asarray(jitted(vals))


def live_split(fleet: Fleet, policies: Sequence[Mapping[str, int]]
               ) -> list[tuple[list[str], list[str]]]:
    """``(live, inert)`` changed knobs of each policy (effective values of the searched
    knobs; the rest at the baseline), in one structure evaluation of every policy and of
    each with one changed knob put back."""
    prof = fleet.profile
    base = search_space.baseline_values(prof)
    full = [dict(base) | {k: int(v) for k, v in p.items()} for p in policies]
    changed = [changed_knobs(f, base) for f in full]
    if profiles.is_slab(prof):
        return [(c, []) for c in changed]
    rows, where, own = [], [], []
    for f, ch in zip(full, changed):
        i = len(own)
        own.append(len(rows))
        rows.append(f)
        for k in ch:
            if k not in _NOT_STRUCTURAL:
                rows.append(f | {k: base[k]})
                where.append((i, k, len(rows) - 1))
    out = []
    if where:
        n = _bucket(len(rows))
        rows_p = rows + [rows[-1]] * (n - len(rows))
        vals = {k: np.array([r[k] for r in rows_p], np.int32) for k in base}
        st = _structure_fn(fleet)(vals)   # (rows, fields, T*K)
    dead = {(i, k) for i, k, r in where if np.array_equal(st[r], st[own[i]])}
    merges = _merges(fleet) if any("slub_nomerge" in c for c in changed) else False
    for i, ch in enumerate(changed):
        live = [k for k in ch if (i, k) not in dead and (k != "slub_nomerge" or merges)]
        out.append((live, [k for k in ch if k not in live]))
    return out


def deploy_of(fleet: Fleet, policies: Sequence[Mapping[str, int]]) -> list[Deploy]:
    """:class:`Deploy` of each policy (effective values of its searched knobs)."""
    prof = fleet.profile
    table = search_space.knobs_for(prof)
    base = search_space.baseline_values(prof)
    out = []
    for p, (live, inert) in zip(policies, live_split(fleet, policies)):
        values = dict(base) | {k: int(v) for k, v in p.items()}
        out.append(Deploy(live=tuple(live), inert=tuple(inert),
                          reach=search_space.policy_reach(table[k].reach for k in live),
                          settings=search_space.settings(values, live, prof),
                          inert_names=tuple(search_space.engineer_name(k, prof)
                                            for k in inert)))
    return out

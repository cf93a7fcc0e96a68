"""Evaluator registry: which model turns a chunk of axis columns into metric columns.

An evaluator maps a :class:`~slabtune.sweeps.grid.Chunk` (dict of numpy arrays, padded to a
shape bucket) to a dict of metric arrays of the same length.  The JAX model is imported only
inside :meth:`Evaluator.evaluate`, so specs can be validated and planned without JAX.

* ``structural``: :func:`slabtune.model.policy.structure` on flat int32 arrays, with the
  profile fields gathered per row from every known profile stacked together, so one jitted
  function per chunk shape serves every spec.
* ``dynamics``: registered when :mod:`slabtune.model.dynamics` is available.
"""

from __future__ import annotations

import functools
import os
from typing import TYPE_CHECKING

import numpy as np

from slabtune.model import caches as C
from slabtune.model import profiles as P

if TYPE_CHECKING:  # pragma: no cover
    from slabtune.sweeps.grid import Chunk
    from slabtune.sweeps.spec import AxisDef, SweepSpec

#: Structure fields, in the order the structural evaluator emits them.
STRUCTURE_FIELDS = ("nr_cpus", "min_objects", "order", "objs_per_slab", "leftover",
                    "min_partial", "cpu_partial", "cpu_partial_slabs", "sheaf_capacity")


class Evaluator:
    """Base class: a named model evaluation over chunks."""

    name = ""

    def metrics(self) -> tuple[str, ...]:
        """Every metric column this evaluator can produce, in output order."""
        raise NotImplementedError

    def extra_axes(self) -> dict[str, "AxisDef"]:
        """Axes this evaluator understands beyond :data:`spec.COMMON_AXES`."""
        return {}

    def required_axes(self) -> tuple[str, ...]:
        return ()

    def check(self, spec: "SweepSpec") -> None:
        """Raise SpecError for a spec this evaluator cannot run."""

    def evaluate(self, spec: "SweepSpec", chunk: "Chunk") -> dict[str, np.ndarray]:
        """Metric arrays (every metric) for every padded row of ``chunk``."""
        raise NotImplementedError


def cache_inputs(spec: "SweepSpec", cols: dict) -> dict[str, np.ndarray]:
    """Per-row cache facts: stride, kmalloc, early, bootstrap and the creator's sheaf
    capacity, from a ``cache`` axis (looked up in model.caches) or a ``size`` axis (an
    anonymous cache created after SMP bring-up)."""
    if "cache" in cols:
        infos = [C.get_cache(n) for n in spec.axis("cache").values]
        code = cols["cache"]

        def lut(f):
            return np.asarray([int(f(c)) for c in infos], np.int32)[code]

        out = dict(size=lut(lambda c: c.size), is_kmalloc=lut(lambda c: c.is_kmalloc),
                   early=lut(lambda c: c.early), is_bootstrap=lut(lambda c: c.is_bootstrap),
                   explicit_sheaf=lut(lambda c: c.explicit_sheaf))
    else:
        size = cols["size"].astype(np.int32)
        zero = np.zeros_like(size)
        out = dict(size=size, is_kmalloc=zero, early=zero, is_bootstrap=zero, explicit_sheaf=zero)
    knob = cols["explicit_sheaf"]
    out["explicit_sheaf"] = np.where(knob >= 0, knob, out["explicit_sheaf"]).astype(np.int32)
    return out


def topology_inputs(cols: dict) -> dict[str, np.ndarray]:
    """possible / present / online CPUs per row (online = present; possible 0 = present)."""
    from slabtune.sweeps.grid import present_cpus

    present = present_cpus(cols).astype(np.int32)
    possible = np.where(cols["possible"] > 0, cols["possible"], present).astype(np.int32)
    return dict(possible=possible, present=present, online=present)


def profile_index(spec: "SweepSpec", cols: dict) -> np.ndarray:
    """Index of each row's profile in :data:`profiles.PROFILES` (the stacking order)."""
    order = list(P.PROFILES)
    lut = np.asarray([order.index(n) for n in spec.axis("profile").values], np.int32)
    return lut[cols["profile"]]


#: Environment variable naming the persistent compilation cache ("off" disables it).
CACHE_ENV = "SLABTUNE_JAX_CACHE"


def compile_cache_dir() -> str | None:
    """Where compiled evaluators persist between processes (each Ray worker compiles the
    same functions; with the cache only the first process on a machine pays)."""
    path = os.environ.get(CACHE_ENV)
    if path is None:
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        path = os.path.join(base, "slabtune", "jax")
    return None if path in ("", "0", "off") else path


@functools.lru_cache(maxsize=1)
def configure_jax() -> None:
    """Turn on JAX's persistent compilation cache once per process (see compile_cache_dir)."""
    import jax

    path = compile_cache_dir()
    if path and jax.config.jax_compilation_cache_dir is None:
        try:
            os.makedirs(path, exist_ok=True)
        except OSError:
            return
        jax.config.update("jax_compilation_cache_dir", path)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)


@functools.lru_cache(maxsize=1)
def _stacked_profiles():
    from slabtune.model import policy

    return policy.stack_profiles(list(P.PROFILES.values()))


@functools.lru_cache(maxsize=1)
def _structural_fn():
    import jax

    from slabtune.model import policy

    configure_jax()

    def run(stack, pidx, size, possible, present, online, min_order, max_order, min_objects,
            early, is_kmalloc, is_bootstrap, explicit):
        prof = policy.ProfileArrays(*(f[pidx] for f in stack))
        return policy.structure(size, possible, present, online, prof, min_order, max_order,
                                min_objects, early.astype(bool), is_kmalloc.astype(bool),
                                is_bootstrap.astype(bool), explicit)

    return jax.jit(run)


class Structural(Evaluator):
    """Slab order, objects per slab, leftover, min_partial, cpu_partial, sheaf capacity."""

    name = "structural"

    def metrics(self):
        return ("slab_size",) + STRUCTURE_FIELDS

    def evaluate(self, spec, chunk):
        cols = chunk.columns
        cache = cache_inputs(spec, cols)
        topo = topology_inputs(cols)
        out = _structural_fn()(
            _stacked_profiles(), profile_index(spec, cols), cache["size"], topo["possible"],
            topo["present"], topo["online"], cols["min_order"], cols["max_order"],
            cols["min_objects"], cache["early"], cache["is_kmalloc"], cache["is_bootstrap"],
            cache["explicit_sheaf"])
        res = {"slab_size": cache["size"]}
        for f in STRUCTURE_FIELDS:
            res[f] = np.asarray(getattr(out, f), dtype=np.int32)
        return res


#: Registered evaluators by name.
EVALUATORS: dict[str, Evaluator] = {"structural": Structural()}


def device_name() -> str:
    """The JAX default device of this process, e.g. ``cpu`` or ``gpu:NVIDIA H100``."""
    import jax

    d = jax.devices()[0]
    kind = getattr(d, "device_kind", "") or ""
    return d.platform if d.platform == "cpu" else f"{d.platform}:{kind}"

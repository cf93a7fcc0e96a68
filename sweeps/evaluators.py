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

from slabtune.model import caches, constants, profiles

if TYPE_CHECKING:  # pragma: no cover
    from slabtune.sweeps.grid import Chunk
    from slabtune.sweeps.spec import AxisDef, SweepSpec

#: Structure fields, in the order the structural evaluator emits them.
STRUCTURE_FIELDS = constants.STRUCTURE_FIELDS


class Evaluator:
    """Base class: a named model evaluation over chunks."""

    name = ""
    #: Whether [sweep] steps means anything to this evaluator.
    uses_steps = False

    def metrics(self) -> tuple[str, ...]:
        """Every metric column this evaluator can produce, in output order."""
        raise NotImplementedError

    def metric_dtype(self, name: str) -> str:
        """Column type of a metric: "int32" or "float32"."""
        return "int32"

    def extra_axes(self) -> dict[str, AxisDef]:
        """Axes this evaluator understands beyond :data:`spec.COMMON_AXES`."""
        return {}

    def required_axes(self) -> tuple[str, ...]:
        return ()

    def check(self, spec: SweepSpec) -> None:
        """Raise SpecError for a spec this evaluator cannot run."""

    def evaluate(self, spec: SweepSpec, chunk: Chunk) -> dict[str, np.ndarray]:
        """Metric arrays (every metric) for every padded row of ``chunk``."""
        raise NotImplementedError


def cache_inputs(spec: SweepSpec, cols: dict) -> dict[str, np.ndarray]:
    """Per-row cache facts: stride, kmalloc, early, bootstrap and the creator's sheaf
    capacity, from a ``cache`` axis (looked up in model.caches) or a ``size`` axis (an
    anonymous cache created after SMP bring-up)."""
    if "cache" in cols:
        infos = [caches.get_cache(n) for n in spec.axis("cache").values]
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


def profile_index(spec: SweepSpec, cols: dict) -> np.ndarray:
    """Index of each row's profile in :data:`profiles.PROFILES` (the stacking order); 0 for
    a SLAB profile's rows, whose structure :func:`slab_structure_columns` computes."""
    order = list(profiles.PROFILES)
    lut = np.asarray([order.index(n) if n in order else 0
                      for n in spec.axis("profile").values], np.int32)
    return lut[cols["profile"]]


def slab_row_mask(spec: SweepSpec, cols: dict) -> np.ndarray:
    """Whether each row's profile is a SLAB one (:data:`profiles.SLAB_PROFILES`)."""
    lut = np.asarray([n in profiles.SLAB_PROFILES for n in spec.axis("profile").values])
    return lut[cols["profile"]]


def _cache_names(spec: SweepSpec, cols: dict, rows) -> list[str | None]:
    """The cache name of each of ``rows`` (None on a ``size`` axis)."""
    if "cache" not in cols:
        return [None] * len(rows)
    names = spec.axis("cache").values
    return [names[cols["cache"][r]] for r in rows]


@functools.lru_cache(maxsize=4096)
def slab_structure(profile: str, size: int, possible: int, node_cpus: tuple[int, ...],
                   cache: str | None):
    """SLAB's structure (:func:`slabtune.model.slab.structure`) of a cache of stride
    ``size`` under ``profile`` with ``possible`` CPUs on nodes of ``node_cpus``: the
    kernel's default order cap, the cache's creation facts where known."""
    from slabtune.model import slab

    prof = profiles.SLAB_PROFILES[profile]
    facts = (slab.known_facts(cache, prof) if cache else None) or slab.NO_FACTS
    return slab.structure(size, possible, node_cpus, prof, facts=facts)


def _row_topology(row: dict):
    """The uniform topology of one row (see :func:`_build_workload`)."""
    from slabtune.model.topology import Topology

    nodes = row.get("nodes") or 1
    ml = row.get("memoryless_nodes") or 0
    cpus = row["cpus"]
    return Topology.uniform(cpus, nodes, memoryless_nodes=memoryless_node_ids(nodes, ml),
                            possible=max(row.get("possible") or 0, cpus))


def _grid_row(spec: SweepSpec, cols: dict, r: int, present: int) -> dict:
    """The topology and workload axes of row ``r`` (spec defaults where not swept)."""
    defaults = dict(spec.defaults)
    row = {k: (int(cols[k][r]) if k in cols else defaults.get(k)) for k in (
        "nodes", "memoryless_nodes", "possible", *WORKLOAD_PARAMS)}
    row["cpus"] = int(present)
    return row


def slab_structure_columns(spec: SweepSpec, cols: dict, res: dict) -> None:
    """Overwrite the structural fields of the SLAB rows of ``res`` in place with SLAB's
    (:func:`slabtune.sweeps.simulate.structure_row`'s mapping: nr_cpus is the possible
    CPUs, order, objects per slab and leftover are calculate_slab_order()'s, SLUB's own
    fields are 0).  Rows of impossible topologies (never kept) are left as they are."""
    from slabtune.sweeps import grid

    mask = slab_row_mask(spec, cols) & ~grid.impossible_topology(cols)
    if not mask.any():
        return
    rows = np.flatnonzero(mask)
    topo = topology_inputs(cols)
    cache = cache_inputs(spec, cols)
    names = spec.axis("profile").values
    for f in STRUCTURE_FIELDS:
        res[f][rows] = 0
    for r, cname in zip(rows, _cache_names(spec, cols, rows)):
        t = _row_topology(_grid_row(spec, cols, r, topo["present"][r]))
        st = slab_structure(names[cols["profile"][r]], int(cache["size"][r]), t.possible,
                            tuple(t.node_cpus), cname)
        res["nr_cpus"][r] = t.possible
        res["order"][r], res["objs_per_slab"][r] = st.order, st.objs_per_slab
        res["leftover"][r] = st.left_over


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

    return policy.stack_profiles(list(profiles.PROFILES.values()))


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


def structural_columns(spec: SweepSpec, cols: dict) -> dict[str, np.ndarray]:
    """``slab_size`` and every structural field of a chunk's rows, from one compiled call."""
    cache = cache_inputs(spec, cols)
    topo = topology_inputs(cols)
    out = _structural_fn()(
        _stacked_profiles(), profile_index(spec, cols), cache["size"], topo["possible"],
        topo["present"], topo["online"], cols["min_order"], cols["max_order"],
        cols["min_objects"], cache["early"], cache["is_kmalloc"], cache["is_bootstrap"],
        cache["explicit_sheaf"])
    res = {"slab_size": cache["size"]}
    for f in STRUCTURE_FIELDS:
        res[f] = np.array(getattr(out, f), dtype=np.int32)
    slab_structure_columns(spec, cols, res)
    return res


class Structural(Evaluator):
    """Slab order, objects per slab, leftover, min_partial, cpu_partial, sheaf capacity."""

    name = "structural"

    def metrics(self):
        return ("slab_size",) + STRUCTURE_FIELDS

    def evaluate(self, spec, chunk):
        return structural_columns(spec, chunk.columns)


# --------------------------------------------------------------------------- dynamics

#: Workload parameters a dynamics spec may sweep: axis name -> (constructor parameter,
#: divisor).  Probabilities are given in percent (integers) and divided by 100.  A parameter
#: applies to the workload kinds whose constructor takes it and is ignored by the others.
WORKLOAD_PARAMS = {
    "live": ("live", 1), "depth": ("depth", 1), "threads": ("threads", 1),
    "burst": ("burst", 1), "completion_remote": ("completion_remote", 1),
    "alloc_prob_pct": ("alloc_prob", 100), "cross_node_pct": ("cross_node", 100),
    "irq_free_pct": ("irq_free", 100),
}
_PARAM_BOUNDS = {"live": (1, 1 << 20), "depth": (1, 1 << 20), "threads": (1, 1 << 16),
                 "burst": (0, 1 << 20), "completion_remote": (0, 1),
                 "alloc_prob_pct": (0, 100), "cross_node_pct": (0, 100),
                 "irq_free_pct": (0, 100)}


def _dynamics_available() -> bool:
    import importlib.util

    return all(importlib.util.find_spec(f"slabtune.model.{m}") is not None
               for m in ("dynamics", "metrics", "workloads", "cost"))


def memoryless_node_ids(nodes: int, memoryless: int) -> tuple[int, ...]:
    """The spec's convention: the highest-numbered ``memoryless`` nodes have no memory."""
    return tuple(range(nodes - memoryless, nodes))


class Dynamics(Evaluator):
    """Per-CPU alloc/free streams simulated for ``[sweep] steps`` steps, runs of up to
    ``[sweep] ops_per_step`` ops per rep per step
    (:func:`slabtune.model.dynamics.simulate_batch`) on the structural prediction, then
    machine-wide metrics (:func:`slabtune.model.metrics.compute`) with the packaged cost
    constants.  Each configuration's random stream is fixed by the spec's seed and the
    configuration's index in the grid, so a chunk's rows do not depend on the chunking."""

    name = "dynamics"
    uses_steps = True

    def metrics(self):
        from slabtune.model import metrics as model_metrics

        return ("slab_size",) + STRUCTURE_FIELDS + tuple(model_metrics.SCALAR_METRICS)

    def metric_dtype(self, name):
        return "int32" if name == "slab_size" or name in STRUCTURE_FIELDS else "float32"

    def extra_axes(self):
        from slabtune.model import workloads
        from slabtune.sweeps.spec import AxisDef, ChoiceAxis

        axes = {"workload": ChoiceAxis("workload", str, default=None, doc="workload kind",
                                       values=tuple(workloads.BUILDERS))}
        for name, (lo, hi) in _PARAM_BOUNDS.items():
            axes[name] = AxisDef("workload", int, lo, hi, None, f"workload parameter {name}")
        return axes

    def required_axes(self):
        return ("workload",)

    def check(self, spec):
        """Build every (topology, workload) combination of the grid once, so that a
        workload a topology cannot run (e.g. producer_consumer on one CPU) fails at load
        time naming the axes, not in a Ray task."""
        from slabtune.sweeps import grid
        from slabtune.sweeps.spec import SpecError

        keys = [a.name for a in spec.axes if a.name in (
            "cpus", "cpus_per_node", "nodes", "memoryless_nodes", "possible", "workload",
            *WORKLOAD_PARAMS)]
        combos = 1
        for k in keys:
            combos *= len(spec.axis(k))
        if combos > 20000:
            return  # too many to pre-build; tasks report failures instead
        import itertools

        defaults = dict(spec.defaults)
        for values in itertools.product(*(spec.axis(k).values for k in keys)):
            row = {**defaults, **dict(zip(keys, values))}
            cols = {k: np.asarray([v]) for k, v in row.items() if not isinstance(v, str)}
            if grid.impossible_topology(cols)[0] or _excluded_combo(spec, keys, values):
                continue
            row["cpus"] = int(grid.present_cpus(cols)[0])
            try:
                _build_workload(row)
            except ValueError as err:
                where = ", ".join(f"{k}={row[k]}" for k in keys)
                raise SpecError(f"workload.{row['workload']}: {err} (at {where}; exclude "
                                f"these combinations with [[exclude]])") from None

    def evaluate(self, spec, chunk):
        """SLUB rows through :mod:`slabtune.model.dynamics`, SLAB rows through
        :mod:`slabtune.model.slab_dynamics` (each group padded to the chunk's length by
        repeating one of its rows, so both compile once per chunk shape); both priced by
        :func:`slabtune.model.metrics.compute`."""
        cols = chunk.columns
        n = len(chunk.keep)
        res = structural_columns(spec, cols)
        names = self.metrics()[1 + len(STRUCTURE_FIELDS):]
        for m in names:
            res[m] = np.zeros(n, np.float32)
        slab_mask = slab_row_mask(spec, cols)
        for is_slab in (False, True):
            kept = np.flatnonzero(chunk.keep & (slab_mask == is_slab))
            if kept.size == 0:
                continue
            rows = np.where(chunk.keep & (slab_mask == is_slab), np.arange(n), kept[0])
            met = (self._slab if is_slab else self._slub)(spec, chunk, res, rows)
            for m in names:
                res[m][kept] = np.asarray(met[m], np.float32)[kept]
        return res

    def _workloads(self, spec, cols, rows):
        """(Topology, (Workload, RepLayout)) of every row of ``rows``, built once per
        distinct topology and workload."""
        topo = topology_inputs(cols)
        wl_names = spec.axis("workload").values
        built: dict = {}
        out = []
        for r in rows:
            row = _grid_row(spec, cols, r, topo["present"][r])
            row["workload"] = wl_names[cols["workload"][r]]
            key = tuple(sorted((k, v) for k, v in row.items() if v is not None))
            if key not in built:
                built[key] = _build_workload(row)
            out.append(built[key])
        return out

    def _pcp(self, spec, cols, rows):
        from slabtune.model import cost as cost_model

        prof_names = spec.axis("profile").values
        return np.asarray([cost_model.pcp_max_order(profiles.get_any_profile(p).version)
                           for p in prof_names], np.int32)[cols["profile"][rows]]

    def _slub(self, spec, chunk, res, rows):
        from slabtune.model import dynamics, policy
        from slabtune.sweeps import dynsim

        cols = chunk.columns
        prof_names = spec.axis("profile").values
        cfgs = []
        for r, (t, wl) in zip(rows, self._workloads(spec, cols, rows)):
            s_r = policy.Structure(*(res[f][r] for f in STRUCTURE_FIELDS))
            prof = profiles.get_profile(prof_names[cols["profile"][r]])
            cfgs.append(dynamics.config_from(s_r, prof, t, wl, ops_per_step=spec.ops_per_step))
        stacked = dynamics.stack_configs(cfgs)
        index = (chunk.start + rows).astype(np.uint32)
        fn = _dynamics_fn(spec.steps, dynamics.run_form(stacked), dynsim.engine())
        out = fn(np.uint32(spec.seed), index, stacked, _default_cost(),
                 self._pcp(spec, cols, rows),
                 _object_sizes(spec, cols)[rows].astype(np.float32))
        return out._asdict()

    def _slab(self, spec, chunk, res, rows):
        from slabtune.model import slab_dynamics
        from slabtune.sweeps import dynsim

        cols = chunk.columns
        prof_names = spec.axis("profile").values
        cache = cache_inputs(spec, cols)
        cnames = _cache_names(spec, cols, rows)
        cfgs = []
        for r, cname, (t, wl) in zip(rows, cnames, self._workloads(spec, cols, rows)):
            name = prof_names[cols["profile"][r]]
            st = slab_structure(name, int(cache["size"][r]), t.possible, tuple(t.node_cpus),
                                cname)
            cfgs.append(slab_dynamics.config_from(st, profiles.SLAB_PROFILES[name], t, wl))
        stacked = slab_dynamics.stack_configs(cfgs)
        index = (chunk.start + rows).astype(np.uint32)
        out = _slab_dynamics_fn(spec.steps, dynsim.engine())(
            np.uint32(spec.seed), index, stacked, _default_cost(),
            self._pcp(spec, cols, rows), _object_sizes(spec, cols)[rows].astype(np.float32))
        return out._asdict()


def _excluded_combo(spec: SweepSpec, keys: list[str], values) -> bool:
    """Whether an ``[[exclude]]`` table that tests only the axes ``keys`` drops the rows
    with these ``values`` (so :meth:`Dynamics.check` does not build what the grid never
    runs, e.g. producer_consumer at cpus = 1)."""
    import dataclasses

    from slabtune.sweeps import grid

    cols = {k: np.asarray([spec.axis(k).values.index(v) if spec.axis(k).kind is str else v],
                          np.int64) for k, v in zip(keys, values)}
    for ex in spec.exclude:
        names = {t[0] for t in ex.tests} | {t[2][1] for t in ex.tests
                                            if isinstance(t[2], tuple) and t[2][:1] == ("axis",)}
        if names <= set(keys) and grid.excluded(dataclasses.replace(spec, exclude=(ex,)),
                                                cols)[0]:
            return True
    return False


def _object_sizes(spec, cols) -> np.ndarray:
    """Bytes of one object per row (live bytes), from the cache table or the size axis."""
    if "cache" in cols:
        lut = np.asarray([caches.get_cache(n).object_size for n in spec.axis("cache").values])
        return lut[cols["cache"]]
    return cols["size"]


def _build_workload(row: dict):
    """(Topology, (Workload, RepLayout)) of one row: a uniform topology whose
    highest-numbered ``memoryless_nodes`` nodes have no memory, and the workload kind built
    on it with the parameters the row sets (those the kind takes)."""
    from slabtune.model import workloads

    t = _row_topology(row)
    kind = row["workload"]
    accepted = workloads.spec_params(kind)
    params = {}
    for axis, (param, div) in WORKLOAD_PARAMS.items():
        v = row.get(axis)
        if v is None or param not in accepted:
            continue
        params[param] = bool(v) if param == "completion_remote" else (v / div if div > 1 else v)
    return t, workloads.build(kind, t, **params)


@functools.lru_cache(maxsize=1)
def _default_cost():
    from slabtune.sweeps import simconfig

    return simconfig.load_cost()[0]


def _engine_fn(engine: str, simulate_jax, simulate_native, metrics_of):
    """The evaluation ``(seed, index, cfgs, cost, pcp, object_size, steps) -> metrics`` of a
    dynamics batch: keys folded from ``seed`` per grid index, counters, then
    ``metrics_of(counters, cfgs, cost, pcp, object_size, steps)``.  With the ``jax`` engine
    one jitted function around ``simulate_jax(keys, cfgs, steps)``, ``steps`` traced (one
    compiled program for every run length: model/runlen.py); with ``native`` the keys and
    the metrics are jitted and the counters come from ``simulate_native`` (C, the same
    counters)."""
    import jax

    configure_jax()

    def keys_of(seed, index):
        base = jax.random.key(seed)
        return jax.vmap(lambda i: jax.random.fold_in(base, i))(index)

    if engine == "native":
        jkeys, jmetrics = jax.jit(keys_of), jax.jit(metrics_of)

        def run_native(seed, index, cfgs, cost, pcp, object_size, steps):
            counters = simulate_native(jkeys(seed, index), cfgs, int(steps))
            return jmetrics(counters, cfgs, cost, pcp, object_size, steps)

        return run_native

    def run(seed, index, cfgs, cost, pcp, object_size, steps):
        counters = simulate_jax(keys_of(seed, index), cfgs, steps)
        return metrics_of(counters, cfgs, cost, pcp, object_size, steps)

    return jax.jit(run)


def _batch_metrics(counters, cfgs, cost, pcp, object_size, steps):
    """:func:`slabtune.model.metrics.compute` over a batch (vmapped; ``pcp`` and
    ``object_size`` per configuration)."""
    import jax

    from slabtune.model import metrics as model_metrics

    return jax.vmap(lambda cnt, cfg, pm, osz: model_metrics.compute(
        cnt, cfg, cost, pcp_max=pm, object_size=osz, steps=steps))(
            counters, cfgs, pcp, object_size)


def _dynamics_fn(steps: int, max_run, engine: str = "jax"):
    """The SLUB dynamics evaluation for ``steps`` steps: :func:`_dynamics_engine_fn`'s, the
    same compiled program for every ``steps``."""
    return functools.partial(_dynamics_engine_fn(max_run, engine), steps=steps)


@functools.lru_cache(maxsize=8)
def _dynamics_engine_fn(max_run, engine: str = "jax"):
    """The SLUB dynamics evaluation (:func:`_engine_fn`); ``max_run`` is the batch's static
    form (:func:`slabtune.model.dynamics.run_form`: one-op batches compile the one-op pick,
    v6.18 opt-in caches their own form) or an int run bound."""
    from slabtune.model import dynamics
    from slabtune.sweeps import dynsim

    return _engine_fn(engine, lambda k, c, s: dynamics.simulate_batch(k, c, s, max_run),
                      dynsim.simulate_batch, _batch_metrics)


def _slab_dynamics_fn(steps: int, engine: str = "jax"):
    """The SLAB dynamics evaluation for ``steps`` steps: :func:`_slab_engine_fn`'s, the
    same compiled program for every ``steps``."""
    return functools.partial(_slab_engine_fn(engine), steps=steps)


@functools.lru_cache(maxsize=8)
def _slab_engine_fn(engine: str = "jax"):
    """The SLAB dynamics evaluation (:func:`_engine_fn`):
    :func:`slabtune.model.slab_dynamics.simulate_batch` (or C, the same counters), then
    :func:`slabtune.model.metrics.compute` through
    :func:`slabtune.model.slab_dynamics.slub_view`."""
    from slabtune.model import slab_dynamics
    from slabtune.sweeps import dynsim

    def metrics_of(counters, cfgs, cost, pcp, object_size, steps):
        counters, view = slab_dynamics.slub_view(counters, cfgs)
        return _batch_metrics(counters, view, cost, pcp, object_size, steps)

    return _engine_fn(engine, slab_dynamics.simulate_batch, dynsim.simulate_slab_batch,
                      metrics_of)


#: Registered evaluators by name.
EVALUATORS: dict[str, Evaluator] = {"structural": Structural()}
if _dynamics_available():
    EVALUATORS["dynamics"] = Dynamics()


def device_name() -> str:
    """The JAX default device of this process, e.g. ``cpu`` or ``gpu:NVIDIA H100``."""
    import jax

    d = jax.devices()[0]
    kind = getattr(d, "device_kind", "") or ""
    return d.platform if d.platform == "cpu" else f"{d.platform}:{kind}"

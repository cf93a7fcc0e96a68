"""The dynamics model played event by event in C (``native/dynsim.c``), for the CPU.

:func:`simulate_batch` takes what :func:`slabtune.model.dynamics.simulate_batch` takes
(keys, batch-major :class:`~slabtune.model.dynamics.SimConfig`, steps) and returns the
same :class:`~slabtune.model.dynamics.Counters`, equal exactly: the C code plays the
rules of :mod:`slabtune.model.reference_sim` one operation at a time over the same random
words.  The JAX model stays the model (it runs inside jit, under vmap and on GPUs); this
is an executor for the CPU, where XLA:CPU is bound by the memory traffic of the batched
step (benchmarks/README.md, ``bench_dynamics.py``).  SLAB has the same pair:
:func:`simulate_slab_batch` (``native/slabdyn.c``, the rules of
:mod:`slabtune.model.slab_reference`) and :func:`run_slab_batch`.

The shared library is compiled on first use into the user cache, like the native
allocator (:func:`build`; gcc and a C library are all it needs).
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

import numpy as np

from slabtune import native as native_sources
from slabtune.errors import SlabtuneError
from slabtune.model import dynamics, workloads

CFLAGS = ("-O2", "-Wall", "-Wextra", "-shared", "-fPIC", "-pthread", "-ffp-contract=off")

#: One configuration's row of int32 values, in the order dynsim.c reads them (its
#: ``F_*`` enum): (SimConfig or Workload field, length).
CFG_FIELDS = (
    ("objs_per_slab", 1), ("sheaf_capacity", 1), ("cpu_slab", 1), ("min_partial", 1),
    ("cpu_partial_slabs", 1), ("remote_free_bypasses_sheaf", 1), ("slab_alloc_single", 1),
    ("pc_empty_locks", 1), ("barn_max_full", 1), ("barn_max_empty", 1),
    ("memoryless_cpus_use_sheaves", 1), ("memoryless_fallback", 1), ("barns", 1),
    ("ops_per_step", 1), ("rep_node", dynamics.R), ("rep_mem_node", dynamics.R),
    ("rep_memoryless", dynamics.R), ("node_has_memory", dynamics.N),
    ("alloc_p", dynamics.R), ("free_cum", dynamics.R * dynamics.R),
    ("live_target", dynamics.R), ("burst", dynamics.R), ("active", dynamics.R),
)
NCFG = sum(n for _, n in CFG_FIELDS)
_WORKLOAD = set(workloads.Workload._fields)


class DynsimError(SlabtuneError):
    """The native dynamics engine failed to build or run; the message names the step."""


def _lib_path() -> Path:
    return native_sources.build_dir() / "libdynsim.so"


def build(force: bool = False) -> Path:
    """Compile the packaged dynsim.c into the user cache (:func:`slabtune.native.build_dir`)
    unless the library there was built from the same source and flags
    (:func:`slabtune.native.compile_cached`)."""
    try:
        return native_sources.compile_cached(native_sources.source("dynsim.c"), _lib_path(),
                                             CFLAGS, force)
    except native_sources.BuildFailed as e:
        raise DynsimError(f"dynsim build: {e}") from None


_LIB: ctypes.CDLL | None = None


def _lib() -> ctypes.CDLL:
    """The loaded library (built on first use), its constants checked against the model's."""
    global _LIB
    if _LIB is None:
        lib = ctypes.CDLL(str(build()))
        abi = np.zeros(8, np.int32)
        lib.dynsim_abi(abi.ctypes.data_as(ctypes.c_void_p))
        want = [dynamics.R, dynamics.N, dynamics.K, dynamics.LEVELS,
                len(dynamics.COUNTER_FIELDS), NCFG]
        if list(abi[:6]) != want:
            raise DynsimError(f"dynsim: library constants {list(abi[:6])} are not the "
                              f"model's {want} (R, N, K, LEVELS, counters, config row)")
        lib.dynsim_run.restype = ctypes.c_int
        lib.dynsim_run.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int] + \
            [ctypes.c_void_p] * 7
        _LIB = lib
    return _LIB


def config_rows(cfgs: dynamics.SimConfig) -> np.ndarray:
    """The batch-major configurations as (B, NCFG) int32 rows (:data:`CFG_FIELDS`)."""
    cols = []
    for name, n in CFG_FIELDS:
        a = np.asarray(getattr(cfgs.workload if name in _WORKLOAD else cfgs, name))
        if a.ndim == 0 or a.size != a.shape[0] * n:
            raise DynsimError(f"dynsim: {name} has shape {a.shape}, not (B,) + {n} values "
                              "per configuration (stack_configs() makes a batch)")
        cols.append(a.reshape(a.shape[0], n))
    if len({c.shape[0] for c in cols}) != 1:
        raise DynsimError("dynsim: the fields of the batch differ in length")
    return np.ascontiguousarray(np.concatenate(cols, axis=1), np.int32)


def seeds_of(keys) -> np.ndarray:
    """The (B,) uint32 stream seeds of jax.random keys (:func:`dynamics.seed_of`)."""
    import jax

    return np.asarray(jax.vmap(dynamics.seed_of)(keys), np.uint32)


def simulate_batch(keys, cfgs: dynamics.SimConfig, steps: int,
                   threads: int | None = None) -> dynamics.Counters:
    """What :func:`slabtune.model.dynamics.simulate_batch` returns for the same keys,
    configurations and steps (NumPy arrays, batch-major), computed by dynsim.c on
    ``threads`` threads (default: the CPUs this process may use)."""
    seeds = np.ascontiguousarray(seeds_of(keys))
    rows = config_rows(cfgs)
    B, R, N = len(seeds), dynamics.R, dynamics.N
    if rows.shape[0] != B:
        raise DynsimError(f"dynsim: {rows.shape[0]} configurations for {B} keys")
    b = rows[:, [i for i, (f, _) in enumerate(CFG_FIELDS) if f == "ops_per_step"][0]]
    for x in b:
        dynamics.check_ops_per_step(int(x))
    if threads is None:
        threads = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") \
            else (os.cpu_count() or 1)
    nc = len(dynamics.COUNTER_FIELDS)
    counts = np.zeros((B, nc, R), np.int32)
    lock_node = np.zeros((B, N), np.int32)
    out = np.zeros((B, R), np.int32)
    g_rep = np.zeros((B, 3, R), np.int64)
    g_node = np.zeros((B, 3, N), np.int64)
    ptr = [x.ctypes.data_as(ctypes.c_void_p)
           for x in (seeds, rows, counts, lock_node, out, g_rep, g_node)]
    if _lib().dynsim_run(B, int(steps), int(threads), *ptr) != 0:
        raise DynsimError("dynsim: a worker thread could not allocate its scratch memory")
    return _counters(counts, lock_node, out, g_rep, g_node, steps)


def _gauge(sums: np.ndarray, steps: int) -> np.ndarray:
    """Time averages as the model computes them (dynamics._finish: float32 of the high and
    low parts of the sum, split at GAUGE_SHIFT, over the steps)."""
    hi, lo = np.divmod(sums, 1 << dynamics.GAUGE_SHIFT)
    scale = np.float32(1 << dynamics.GAUGE_SHIFT)
    return (hi.astype(np.float32) * scale + lo.astype(np.float32)) / np.float32(max(steps, 1))


def _counters(counts, lock_node, out, g_rep, g_node, steps) -> dynamics.Counters:
    c = {name: counts[:, k] for k, name in enumerate(dynamics.COUNTER_FIELDS)}
    g, gn = _gauge(g_rep, steps), _gauge(g_node, steps)
    return dynamics.Counters(
        **c, list_lock_node=lock_node,
        slabs_total=gn[:, 0], objects_inuse=g[:, 0], empty_slabs_kept=gn[:, 1],
        cpu_partial_slabs_held=g[:, 1], sheaf_objects_held=g[:, 2],
        barn_objects_held=gn[:, 2], outstanding=out)


# --------------------------------------------------------------------------- engines

#: Which executor runs a SLUB dynamics batch: ``auto`` (this module on the CPU, the JAX
#: model on an accelerator), ``jax`` (always the JAX model) or ``native`` (always this
#: module).  Chosen by ``SLABTUNE_DYNAMICS_ENGINE``; the counters are the same either way.
ENGINES = ("auto", "jax", "native")
ENGINE_ENV = "SLABTUNE_DYNAMICS_ENGINE"
_FELL_BACK: list[str] = []


def engine(choice: str | None = None) -> str:
    """``jax`` or ``native`` for ``choice`` (default ``$SLABTUNE_DYNAMICS_ENGINE``, else
    ``auto``).  ``auto`` takes ``native`` when JAX's default backend is the CPU and the
    library builds (a failed build falls back to ``jax`` once, with a warning); an unknown
    name is a one-line error naming the variable."""
    name = (choice if choice is not None else os.environ.get(ENGINE_ENV, "auto")).strip()
    if name not in ENGINES:
        raise DynsimError(f"{ENGINE_ENV}: {name!r} is not one of {', '.join(ENGINES)}")
    if name != "auto":
        return name
    import jax

    if jax.default_backend() != "cpu":
        return "jax"
    if _FELL_BACK:
        return "jax"
    try:
        _lib()
    except (DynsimError, OSError) as e:
        import warnings

        _FELL_BACK.append(str(e))
        warnings.warn(f"dynamics runs on the JAX model: the native engine failed ({e})",
                      RuntimeWarning, stacklevel=2)
        return "jax"
    return "native"


def run_batch(keys, cfgs: dynamics.SimConfig, steps: int,
              engine_name: str | None = None) -> dynamics.Counters:
    """Counters of a SLUB batch (what :func:`slabtune.model.dynamics.simulate_batch`
    returns) from the engine :func:`engine` picks; callers outside jit use this."""
    if engine(engine_name) == "native":
        return simulate_batch(keys, cfgs, steps)
    return dynamics.simulate_batch(keys, cfgs, steps)


# --------------------------------------------------------------------------- SLAB

#: One SLAB configuration's row (``native/slabdyn.c``'s ``F_*`` enum): SlabSimConfig,
#: slab_dynamics.derived() or Workload field, and its length.
CFG_SLAB_FIELDS = (
    ("objs_per_slab", 1), ("limit", 1), ("batchcount", 1), ("shared_entries", 1),
    ("alien_limit", 1), ("reap_interval", 1), ("old_locks", 1), ("free_on_empty", 1),
    ("free_limit", dynamics.N), ("rep_node", dynamics.R), ("rep_mem_node", dynamics.R),
    ("local", dynamics.R), ("alloc_local", dynamics.R), ("first", dynamics.R),
    ("alloc_p", dynamics.R), ("free_cum", dynamics.R * dynamics.R),
    ("live_target", dynamics.R), ("burst", dynamics.R), ("active", dynamics.R),
)
NCFG_SLAB = sum(n for _, n in CFG_SLAB_FIELDS)
_SLAB_LIB: ctypes.CDLL | None = None


def build_slab(force: bool = False) -> Path:
    """Compile the packaged slabdyn.c into the user cache, as :func:`build` does dynsim.c."""
    try:
        return native_sources.compile_cached(native_sources.source("slabdyn.c"),
                                             native_sources.build_dir() / "libslabdyn.so",
                                             CFLAGS, force)
    except native_sources.BuildFailed as e:
        raise DynsimError(f"slabdyn build: {e}") from None


def _slab_lib() -> ctypes.CDLL:
    """The loaded SLAB library, its constants checked against slab_dynamics'."""
    global _SLAB_LIB
    if _SLAB_LIB is None:
        from slabtune.model import slab_dynamics as sd

        lib = ctypes.CDLL(str(build_slab()))
        abi = np.zeros(8, np.int32)
        lib.slabdyn_abi(abi.ctypes.data_as(ctypes.c_void_p))
        want = [sd.R, sd.N, sd.K, len(sd.COUNTER_FIELDS), NCFG_SLAB,
                len(sd.REP_GAUGES) * 10 + len(sd.NODE_GAUGES)]
        if list(abi[:6]) != want:
            raise DynsimError(f"slabdyn: library constants {list(abi[:6])} are not the "
                              f"model's {want}")
        lib.slabdyn_run.restype = ctypes.c_int
        lib.slabdyn_run.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int] + \
            [ctypes.c_void_p] * 7
        _SLAB_LIB = lib
    return _SLAB_LIB


def slab_config_rows(cfgs) -> np.ndarray:
    """Batch-major SLAB configurations as (B, NCFG_SLAB) int32 rows."""
    from slabtune.model import slab_dynamics as sd

    dv = sd.derived(jax_free(cfgs))
    cols = []
    for name, n in CFG_SLAB_FIELDS:
        if name in dv:
            a = np.asarray(dv[name]).T           # derived() is batch-minor for a batch
        else:
            a = np.asarray(getattr(cfgs.workload if name in _WORKLOAD else cfgs, name))
        if a.ndim == 0 or a.size != a.shape[0] * n:
            raise DynsimError(f"slabdyn: {name} has shape {a.shape}, not (B,) + {n} values "
                              "per configuration (stack_configs() makes a batch)")
        cols.append(a.reshape(a.shape[0], n))
    if len({c.shape[0] for c in cols}) != 1:
        raise DynsimError("slabdyn: the fields of the batch differ in length")
    return np.ascontiguousarray(np.concatenate(cols, axis=1), np.int32)


def jax_free(cfgs):
    """The configuration's leaves as NumPy arrays, batch-minor (what slab_dynamics.derived
    takes for a batch: the rep and node axes first)."""
    import jax

    return jax.tree_util.tree_map(lambda x: np.moveaxis(np.asarray(x), 0, -1), cfgs)


def simulate_slab_batch(keys_or_seeds, cfgs, steps: int, threads: int | None = None):
    """What :func:`slabtune.model.slab_dynamics.simulate_batch` returns for the same keys
    (or uint32 seeds), configurations and steps, computed by slabdyn.c."""
    import jax

    from slabtune.model import slab_dynamics as sd

    x = np.asarray(keys_or_seeds) if not isinstance(keys_or_seeds, jax.Array) else keys_or_seeds
    if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
        seeds = np.asarray(jax.vmap(sd.seed_of)(x), np.uint32)
    else:
        seeds = np.asarray(x, np.uint32)
    seeds = np.ascontiguousarray(seeds)
    rows = slab_config_rows(cfgs)
    B, R, N = len(seeds), sd.R, sd.N
    if rows.shape[0] != B:
        raise DynsimError(f"slabdyn: {rows.shape[0]} configurations for {B} seeds")
    if threads is None:
        threads = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") \
            else (os.cpu_count() or 1)
    counts = np.zeros((B, len(sd.COUNTER_FIELDS), R), np.int32)
    lock_node = np.zeros((B, N), np.int32)
    out = np.zeros((B, R), np.int32)
    g_rep = np.zeros((B, len(sd.REP_GAUGES), R), np.int64)
    g_node = np.zeros((B, len(sd.NODE_GAUGES), N), np.int64)
    ptr = [a.ctypes.data_as(ctypes.c_void_p)
           for a in (seeds, rows, counts, lock_node, out, g_rep, g_node)]
    if _slab_lib().slabdyn_run(B, int(steps), int(threads), *ptr) != 0:
        raise DynsimError("slabdyn: could not allocate the worker threads")
    c = {name: counts[:, k] for k, name in enumerate(sd.COUNTER_FIELDS)}
    g, gn = _gauge(g_rep, steps), _gauge(g_node, steps)
    c.update({name: g[:, k] for k, name in enumerate(sd.REP_GAUGES)})
    c.update({name: gn[:, k] for k, name in enumerate(sd.NODE_GAUGES)})
    return sd.SlabCounters(**c, list_lock_node=lock_node, outstanding=out)


def run_slab_batch(keys_or_seeds, cfgs, steps: int, engine_name: str | None = None):
    """Counters of a SLAB batch from the engine :func:`engine` picks (callers outside jit)."""
    from slabtune.model import slab_dynamics as sd

    if engine(engine_name) == "native":
        return simulate_slab_batch(keys_or_seeds, cfgs, steps)
    return sd.simulate_batch(keys_or_seeds, cfgs, steps)

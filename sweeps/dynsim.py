"""The dynamics models played event by event in C, for the CPU.

:func:`simulate_batch` takes what :func:`slabtune.model.dynamics.simulate_batch` takes
(keys, batch-major :class:`~slabtune.model.dynamics.SimConfig`, steps) and returns the
same :class:`~slabtune.model.dynamics.Counters`, equal exactly: ``native/dynsim.c`` plays
the rules of :mod:`slabtune.model.reference_sim` one operation at a time over the same
random words.  SLAB has the same pair: :func:`simulate_slab_batch` (``native/slabdyn.c``,
the rules of :mod:`slabtune.model.slab_reference`).  The JAX models stay the models (they
run inside jit, under vmap and on GPUs); these are executors for the CPU, where XLA:CPU is
bound by the memory traffic of the batched step (benchmarks/README.md,
``bench_dynamics.py``).  :func:`run_batch` and :func:`run_slab_batch` pick the engine
(:func:`engine`).

The shared libraries are compiled on first use into the user cache, like the native
allocator (:func:`slabtune.native.compile_cached`; gcc and a C library are all they need).
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from slabtune import native as native_sources
from slabtune.errors import SlabtuneError
from slabtune.model import dynamics, workloads

CFLAGS = ("-O2", "-Wall", "-Wextra", "-shared", "-fPIC", "-pthread", "-ffp-contract=off")
R, N = dynamics.R, dynamics.N

#: One SLUB configuration's row of int32 values, in the order dynsim.c reads them (its
#: ``F_*`` enum): (SimConfig or Workload field, length).
CFG_FIELDS = (
    ("objs_per_slab", 1), ("sheaf_capacity", 1), ("cpu_slab", 1), ("min_partial", 1),
    ("cpu_partial_slabs", 1), ("remote_free_bypasses_sheaf", 1), ("slab_alloc_single", 1),
    ("pc_empty_locks", 1), ("take_objects", 1), ("barn_max_full", 1), ("barn_max_empty", 1),
    ("memoryless_cpus_use_sheaves", 1), ("memoryless_fallback", 1), ("barns", 1),
    ("ops_per_step", 1), ("free_discard_offset", 1), ("remote_node_defrag_ratio", 1),
    ("rep_node", R), ("rep_mem_node", R),
    ("rep_memoryless", R),
    ("node_has_memory", N), ("alloc_p", R), ("free_cum", R * R), ("live_target", R),
    ("hold", R), ("burst", R), ("active", R), ("phase_first", R), ("rep_mem_home", R),
    ("lag_mul", R * R), ("lag_freers", 1), ("list_nodes", N),
)
NCFG = sum(n for _, n in CFG_FIELDS)
#: One SLAB configuration's row (slabdyn.c's ``F_*`` enum): SlabSimConfig,
#: slab_dynamics.derived() or Workload field, and its length.
CFG_SLAB_FIELDS = (
    ("objs_per_slab", 1), ("limit", 1), ("batchcount", 1), ("shared_entries", 1),
    ("alien_limit", 1), ("reap_interval", 1), ("old_locks", 1), ("free_on_empty", 1),
    ("free_limit", N), ("rep_node", R), ("rep_mem_node", R), ("local", R),
    ("alloc_local", R), ("first", R), ("alloc_p", R), ("free_cum", R * R),
    ("live_target", R), ("hold", R), ("burst", R), ("active", R), ("phase_first", R),
    ("rep_mem_home", R),
)
NCFG_SLAB = sum(n for _, n in CFG_SLAB_FIELDS)
_WORKLOAD = set(workloads.Workload._fields)


class DynsimError(SlabtuneError):
    """A native dynamics engine failed to build or run; the message names the step."""


# --------------------------------------------------------------------------- libraries


def _build(name: str, force: bool) -> Path:
    """``native/<name>.c`` compiled into ``<build_dir>/lib<name>.so``."""
    try:
        return native_sources.compile_cached(native_sources.source(f"{name}.c"),
                                             native_sources.build_dir() / f"lib{name}.so",
                                             CFLAGS, force)
    except native_sources.BuildFailed as e:
        raise DynsimError(f"{name} build: {e}") from None


def build(force: bool = False) -> Path:
    """Compile the packaged dynsim.c into the user cache (:func:`slabtune.native.build_dir`)
    unless the library there was built from the same sources and flags."""
    return _build("dynsim", force)


def build_slab(force: bool = False) -> Path:
    """Compile the packaged slabdyn.c, as :func:`build` does dynsim.c."""
    return _build("slabdyn", force)


def _abi_dynsim() -> list[int]:
    return [R, N, dynamics.K, dynamics.LEVELS, len(dynamics.COUNTER_FIELDS), NCFG]


def _abi_slabdyn() -> list[int]:
    from slabtune.model import slab_dynamics as sd

    return [sd.R, sd.N, sd.K, len(sd.COUNTER_FIELDS), NCFG_SLAB,
            len(sd.REP_GAUGES) * 10 + len(sd.NODE_GAUGES)]


_ABI: dict[str, Callable[[], list[int]]] = {"dynsim": _abi_dynsim, "slabdyn": _abi_slabdyn}
_LIBS: dict[str, ctypes.CDLL] = {}


def _load(name: str) -> ctypes.CDLL:
    """The library ``name`` (built on first use), its constants (``<name>_abi``) checked
    against the model's; ``<name>_run_at`` typed."""
    if name not in _LIBS:
        lib = ctypes.CDLL(str(_build(name, False)))
        abi = np.zeros(8, np.int32)
        getattr(lib, f"{name}_abi")(abi.ctypes.data_as(ctypes.c_void_p))
        want = _ABI[name]()
        if list(abi[:len(want)]) != want:
            raise DynsimError(f"{name}: library constants {list(abi[:len(want)])} are not "
                              f"the model's {want}")
        run = getattr(lib, f"{name}_run_at")
        run.restype = ctypes.c_int
        run.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_void_p, ctypes.c_int] \
            + [ctypes.c_void_p] * 7
        _LIBS[name] = lib
    return _LIBS[name]


# --------------------------------------------------------------------------- rows and runs


def _rows(fields, lookup: Callable[[str], Any], what: str) -> np.ndarray:
    """(B, sum of lengths) int32 rows from ``lookup(field)`` (batch-major arrays)."""
    cols = []
    for name, n in fields:
        a = np.asarray(lookup(name))
        if a.ndim == 0 or a.size != a.shape[0] * n:
            raise DynsimError(f"{what}: {name} has shape {a.shape}, not (B,) + {n} values "
                              "per configuration (stack_configs() makes a batch)")
        cols.append(a.reshape(a.shape[0], n))
    if len({c.shape[0] for c in cols}) != 1:
        raise DynsimError(f"{what}: the fields of the batch differ in length")
    return np.ascontiguousarray(np.concatenate(cols, axis=1), np.int32)


def config_rows(cfgs: dynamics.SimConfig) -> np.ndarray:
    """The batch-major SLUB configurations as (B, NCFG) int32 rows (:data:`CFG_FIELDS`)."""
    return _rows(CFG_FIELDS, lambda f: getattr(cfgs.workload if f in _WORKLOAD else cfgs, f),
                 "dynsim")


def slab_config_rows(cfgs) -> np.ndarray:
    """Batch-major SLAB configurations as (B, NCFG_SLAB) int32 rows; the derived values
    (numa_mem_id(), the node's first rep) from :func:`slabtune.model.slab_dynamics.derived`."""
    import jax

    from slabtune.model import slab_dynamics as sd

    minor = jax.tree_util.tree_map(lambda x: np.moveaxis(np.asarray(x), 0, -1), cfgs)
    dv = {k: np.asarray(v).T for k, v in sd.derived(minor).items()}    # back to batch-major
    return _rows(CFG_SLAB_FIELDS, lambda f: dv[f] if f in dv else
                 getattr(cfgs.workload if f in _WORKLOAD else cfgs, f), "slabdyn")


def checkpoint_steps(checkpoints, B: int | None = None) -> np.ndarray:
    """``checkpoints`` as an int32 array: a step count or a (C,) sequence of them, or with
    ``B`` also (B, C) rows, one per configuration, broadcast to (B, C).  Refused with a
    one-line error unless each row is at least one non-negative, non-decreasing count."""
    ck = np.asarray(checkpoints)
    ck = ck.reshape(-1) if ck.ndim < 2 else ck
    ck = ck.astype(np.int64)
    if ck.ndim > 2 or ck.shape[-1] < 1 or (ck < 0).any() or (np.diff(ck, axis=-1) < 0).any() \
            or (ck >= 1 << 31).any() or (B is None and ck.ndim != 1):
        raise DynsimError(f"steps: {ck.tolist()} are not non-decreasing step counts")
    if B is not None:
        if ck.ndim == 2 and ck.shape[0] != B:
            raise DynsimError(f"steps: {ck.shape[0]} rows of checkpoints for {B} "
                              f"configurations")
        ck = np.broadcast_to(ck, (B, ck.shape[-1]))
    return np.ascontiguousarray(ck.astype(np.int32))


def _run(name: str, seeds, rows, checkpoints, threads, shape: tuple[int, int, int]) -> tuple:
    """Run library ``name`` over (B,) seeds and (B, ·) rows to each of ``checkpoints``
    ((C,) or per configuration (B, C), :func:`checkpoint_steps`) in one pass; ``shape``:
    counters, rep gauges, node gauges.  Returns the (B, C) checkpoints, counts (C, B, ·, R),
    lock_node (C, B, N), outstanding (C, B, R) and the gauge sums (C, B, ·, R),
    (C, B, ·, N)."""
    seeds = np.ascontiguousarray(np.asarray(seeds, np.uint32))
    B = len(seeds)
    ck = checkpoint_steps(checkpoints, B)
    C = ck.shape[1]
    if rows.shape[0] != B:
        raise DynsimError(f"{name}: {rows.shape[0]} configurations for {B} seeds")
    nc, nrg, nng = shape
    out = (np.zeros((C, B, nc, R), np.int32), np.zeros((C, B, N), np.int32),
           np.zeros((C, B, R), np.int32), np.zeros((C, B, nrg, R), np.int64),
           np.zeros((C, B, nng, N), np.int64))
    ptr = [a.ctypes.data_as(ctypes.c_void_p) for a in (seeds, rows) + out]
    threads = dynamics.usable_cpus() if threads is None else int(threads)
    if getattr(_load(name), f"{name}_run_at")(B, C, ck.ctypes.data_as(ctypes.c_void_p),
                                               threads, *ptr) != 0:
        raise DynsimError(f"{name}: a worker thread could not allocate its scratch memory")
    return (ck,) + out


def _gauge(sums: np.ndarray, steps) -> np.ndarray:
    """Time averages as the models compute them (dynamics._finish: float32 of the high and
    low parts of the sum, split at GAUGE_SHIFT, over the steps), bit for bit: XLA:CPU
    divides by the constant step count as a multiplication by its float32 reciprocal, so
    this does too (a true division differs in the last place for about one value in ten;
    tests/test_dynsim.py compares the floats exactly).  ``steps``: one count, or (B,) for
    sums laid out (B, ...)."""
    hi, lo = np.divmod(sums, 1 << dynamics.GAUGE_SHIFT)
    scale = np.float32(1 << dynamics.GAUGE_SHIFT)
    steps = np.asarray(steps, np.int64)
    steps = steps.reshape(steps.shape + (1,) * (sums.ndim - steps.ndim))
    inv = np.float32(1) / np.maximum(steps, 1).astype(np.float32)
    return (hi.astype(np.float32) * scale + lo.astype(np.float32)) * inv


def seeds_of(keys) -> np.ndarray:
    """The (B,) uint32 stream seeds of jax.random keys (:func:`dynamics.seed_of`)."""
    import jax

    return np.asarray(jax.vmap(dynamics.seed_of)(keys), np.uint32)


# --------------------------------------------------------------------------- SLUB


def simulate_batch(keys, cfgs: dynamics.SimConfig, steps: int,
                   threads: int | None = None) -> dynamics.Counters:
    """What :func:`slabtune.model.dynamics.simulate_batch` returns for the same keys,
    configurations and steps (NumPy arrays, batch-major), computed by dynsim.c on
    ``threads`` threads (default: the CPUs this process may use)."""
    return simulate_batch_at(keys, cfgs, (steps,), threads)[0]


def simulate_batch_at(keys, cfgs: dynamics.SimConfig, checkpoints,
                      threads: int | None = None) -> tuple:
    """:func:`simulate_batch` after each of ``checkpoints`` steps (non-decreasing; (C,), or
    (B, C) per configuration), from one run of each configuration to its last: a tuple of
    :class:`~slabtune.model.dynamics.Counters`, one per checkpoint."""
    rows = config_rows(cfgs)
    for b in np.unique(rows[:, [f for f, _ in CFG_FIELDS].index("ops_per_step")]):
        dynamics.check_ops_per_step(int(b))
    ck, counts, lock_node, out, g_rep, g_node = _run(
        "dynsim", seeds_of(keys), rows, checkpoints, threads,
        (len(dynamics.COUNTER_FIELDS), 3, 3))
    res = []
    for i in range(ck.shape[1]):
        c = {name: counts[i][:, k] for k, name in enumerate(dynamics.COUNTER_FIELDS)}
        g, gn = _gauge(g_rep[i], ck[:, i]), _gauge(g_node[i], ck[:, i])
        res.append(dynamics.Counters(
            **c, list_lock_node=lock_node[i],
            slabs_total=gn[:, 0], objects_inuse=g[:, 0], empty_slabs_kept=gn[:, 1],
            cpu_partial_slabs_held=g[:, 1], sheaf_objects_held=g[:, 2],
            barn_objects_held=gn[:, 2], outstanding=out[i]))
    return tuple(res)


# --------------------------------------------------------------------------- SLAB


def simulate_slab_batch(keys_or_seeds, cfgs, steps: int, threads: int | None = None):
    """What :func:`slabtune.model.slab_dynamics.simulate_batch` returns for the same keys
    (or uint32 seeds), configurations and steps, computed by slabdyn.c."""
    return simulate_slab_batch_at(keys_or_seeds, cfgs, (steps,), threads)[0]


def simulate_slab_batch_at(keys_or_seeds, cfgs, checkpoints, threads: int | None = None):
    """:func:`simulate_slab_batch` after each of ``checkpoints`` steps, from one run: a
    tuple of SLAB counters, one per checkpoint."""
    import jax

    from slabtune.model import slab_dynamics as sd

    x = keys_or_seeds if isinstance(keys_or_seeds, jax.Array) else np.asarray(keys_or_seeds)
    seeds = jax.vmap(sd.seed_of)(x) if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key) \
        else x
    ck, counts, lock_node, out, g_rep, g_node = _run(
        "slabdyn", np.asarray(seeds, np.uint32), slab_config_rows(cfgs), checkpoints, threads,
        (len(sd.COUNTER_FIELDS), len(sd.REP_GAUGES), len(sd.NODE_GAUGES)))
    res = []
    for i in range(ck.shape[1]):
        c = {name: counts[i][:, k] for k, name in enumerate(sd.COUNTER_FIELDS)}
        g, gn = _gauge(g_rep[i], ck[:, i]), _gauge(g_node[i], ck[:, i])
        c.update({name: g[:, k] for k, name in enumerate(sd.REP_GAUGES)})
        c.update({name: gn[:, k] for k, name in enumerate(sd.NODE_GAUGES)})
        res.append(sd.SlabCounters(**c, list_lock_node=lock_node[i], outstanding=out[i]))
    return tuple(res)


# --------------------------------------------------------------------------- engines

#: Which executor runs a dynamics batch: ``auto`` (these C engines on the CPU, the JAX
#: models on an accelerator), ``jax`` (always the JAX models) or ``native`` (always C).
#: Chosen by ``SLABTUNE_DYNAMICS_ENGINE``; the counters are the same either way.
ENGINES = ("auto", "jax", "native")
ENGINE_ENV = "SLABTUNE_DYNAMICS_ENGINE"
_FELL_BACK: list[str] = []


def engine(choice: str | None = None) -> str:
    """``jax`` or ``native`` for ``choice`` (default ``$SLABTUNE_DYNAMICS_ENGINE``, else
    ``auto``).  ``auto`` takes ``native`` when JAX's default backend is the CPU and the
    libraries build (a failed build falls back to ``jax`` once, with a warning); an unknown
    name is a one-line error naming the variable."""
    name = (choice if choice is not None else os.environ.get(ENGINE_ENV, "auto")).strip()
    if name not in ENGINES:
        raise DynsimError(f"{ENGINE_ENV}: {name!r} is not one of {', '.join(ENGINES)}")
    if name != "auto":
        return name
    import jax

    if jax.default_backend() != "cpu" or _FELL_BACK:
        return "jax"
    try:
        _load("dynsim")
        _load("slabdyn")
    except (DynsimError, OSError) as e:
        import warnings

        _FELL_BACK.append(str(e))
        warnings.warn(f"dynamics runs on the JAX models: the native engine failed ({e})",
                      RuntimeWarning, stacklevel=2)
        return "jax"
    return "native"


def run_batch(keys, cfgs: dynamics.SimConfig, steps: int,
              engine_name: str | None = None) -> dynamics.Counters:
    """Counters of a SLUB batch (what :func:`slabtune.model.dynamics.simulate_batch`
    returns) from the engine :func:`engine` picks; callers outside jit use this."""
    return run_batch_at(keys, cfgs, (steps,), engine_name)[0]


def run_batch_at(keys, cfgs: dynamics.SimConfig, checkpoints,
                 engine_name: str | None = None) -> tuple:
    """:func:`run_batch` after each of ``checkpoints`` steps (non-decreasing; (C,), or
    (B, C) per configuration), from one engine call: a tuple of counters, one per
    checkpoint.  The JAX model runs one call per distinct row of checkpoints
    (:func:`_by_rows`)."""
    if engine(engine_name) == "native":
        return simulate_batch_at(keys, cfgs, checkpoints)
    return _by_rows(dynamics.simulate_batch_at, keys, cfgs, checkpoints)


def run_slab_batch(keys_or_seeds, cfgs, steps: int, engine_name: str | None = None):
    """Counters of a SLAB batch from the engine :func:`engine` picks (callers outside jit)."""
    return run_slab_batch_at(keys_or_seeds, cfgs, (steps,), engine_name)[0]


def run_slab_batch_at(keys_or_seeds, cfgs, checkpoints, engine_name: str | None = None):
    """:func:`run_slab_batch` after each of ``checkpoints`` steps, from one engine call."""
    from slabtune.model import slab_dynamics as sd

    if engine(engine_name) == "native":
        return simulate_slab_batch_at(keys_or_seeds, cfgs, checkpoints)
    return _by_rows(sd.simulate_batch_at, keys_or_seeds, cfgs, checkpoints)


def _by_rows(run_at, keys, cfgs, checkpoints) -> tuple:
    """``run_at(keys, cfgs, checkpoints)`` of a JAX model for (C,) checkpoints, or for (B, C)
    rows one call per distinct row, the counters put back in the batch's order."""
    import jax

    ck = np.asarray(checkpoints)
    if ck.ndim < 2:
        return run_at(keys, cfgs, checkpoint_steps(ck))
    ck = checkpoint_steps(ck, len(ck))
    rows, inv = np.unique(ck, axis=0, return_inverse=True)
    inv = inv.reshape(-1)
    if len(rows) == 1:
        return run_at(keys, cfgs, rows[0])
    parts, order = [], []
    for r, row in enumerate(rows):
        sel = np.flatnonzero(inv == r)
        parts.append(run_at(np.asarray(keys)[sel] if not isinstance(keys, jax.Array)
                            else keys[sel], jax.tree_util.tree_map(
                                lambda x, sel=sel: np.asarray(x)[sel], cfgs), row))
        order.append(sel)
    back = np.argsort(np.concatenate(order))
    return jax.tree_util.tree_map(lambda *xs: np.concatenate(
        [np.asarray(x) for x in xs])[back], *parts)

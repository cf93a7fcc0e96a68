"""Native validator: build and run ``native/slubsim.c``, a userspace SLUB-like allocator.

The binary takes every policy number as a flag and derives none: this module computes them
with the model (:func:`slabtune.model.policy.structure` for order, objects per slab,
min_partial, cpu_partial_slabs and sheaf capacity; :func:`slabtune.model.dynamics.config_from`
and the workload constructors of :mod:`slabtune.model.workloads` for the CPU -> node mapping
and the workload's probabilities), so each formula lives in one place.

One thread runs per active representative CPU ("rep") of the model's workload; with
``sync_every = 1`` the threads meet at a barrier after every step, as the model's reps each
do one operation per step.  The binary prints one JSON object (see :class:`NativeResult`).

Interface for other modules:

* :func:`build` -> path of the binary (rebuilt when the source or flags change);
* :func:`config_for_spec` (a :class:`~slabtune.sweeps.simconfig.SimSpec`) or
  :func:`config_from_sim` (a model :class:`~slabtune.model.dynamics.SimConfig`) ->
  :class:`NativeConfig`;
* :func:`run` -> :class:`NativeResult` with ``counters``, ``per_thread``, ``wall_seconds``,
  ``ns_per_op``, ``peak_slab_bytes`` ...; :func:`fastpath_fractions` of a result.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
from pathlib import Path
from typing import Any

import numpy as np

from slabtune import native as native_sources
from slabtune.errors import SlabtuneError

CFLAGS = ("-O2", "-Wall", "-Wextra", "-pthread")
#: Counters the binary prints (SLUB_STATS-style names where the kernel has one).
COUNTERS = (
    "ops", "allocs", "frees", "alloc_fastpath", "alloc_slowpath", "free_fastpath",
    "free_slowpath", "alloc_refill", "alloc_slab", "free_slab", "free_frozen",
    "cpu_partial_alloc", "cpu_partial_free", "cpu_partial_node", "cpu_partial_drain",
    "deactivate_full", "sheaf_swap", "sheaf_refill", "sheaf_flush", "barn_get",
    "barn_get_fail", "barn_put", "barn_put_fail", "remote_free", "list_lock",
    "list_lock_remote", "zone_lock", "direct_alloc", "sheaf_alloc_replace",
    "sheaf_free_replace",
)
_TAIL = 600


class NativeError(SlabtuneError):
    """The native allocator failed to build or run; the message names the step."""


# --------------------------------------------------------------------------- build


def build(force: bool = False, out: Path | None = None, source: Path | None = None) -> Path:
    """Compile the packaged slubsim.c (``gcc -O2 -pthread``) into the user cache
    (:func:`slabtune.native.build_dir`) unless the binary
    there was built from the same source and flags (a stamp file records their hash)."""
    out = Path(out) if out is not None else native_sources.build_dir() / "slubsim"
    src = Path(source) if source is not None else native_sources.source("slubsim.c")
    try:
        return native_sources.compile_cached(src, out, CFLAGS, force)
    except native_sources.BuildFailed as e:
        raise NativeError(f"native build: {e}") from None


# --------------------------------------------------------------------------- config


@dataclasses.dataclass(frozen=True)
class NativeConfig:
    """Every flag of the binary.  Per-rep tuples have ``reps`` entries, ``free_cum`` has
    ``reps * reps`` (row-major: row r is the cumulative free_to distribution of rep r's
    objects, out of 65536).  ``rep_barn`` is the node whose barn a rep uses, -1 for none;
    ``rep_local_node`` is what the sheaf's remote-free test takes as numa_mem_id();
    ``rep_alloc_local`` 0 makes a rep allocate one object per list_lock (no numa_mem_id()
    fix on a memoryless node); ``rep_mem_home`` tells the nodes of one class apart for the
    remote-free test (workloads.rep_homes).  ``node_min_partial`` (per node, empty: min_partial
    everywhere) is the model's dynamics.node_min_partial: a node that stands for several
    nodes' lists meets min_partial for each.  ``rep_weight`` is not passed: it is the number
    of real CPUs each rep stands for, used to weight per-thread counters like the model's.
    ``time_ops``
    1 makes the binary time every slab_alloc()/slab_free() call on its own (see
    :func:`op_ns_per_pair`); meant with ``serial`` 1, where no call waits for another
    thread, so a call longer than the binary's cap (50 us) was interrupted and is left
    out (counted in ``op_dropped``)."""

    size: int
    order: int
    objs: int
    min_partial: int
    cpu_partial_slabs: int
    sheaf_capacity: int
    cpu_slab: int
    barn_max_full: int
    barn_max_empty: int
    remote_free_bypasses_sheaf: int
    slab_alloc_single: int
    pc_empty_locks: int
    free_discard_offset: int
    nodes: int
    rep_node: tuple[int, ...]
    rep_mem_node: tuple[int, ...]
    rep_local_node: tuple[int, ...]
    rep_barn: tuple[int, ...]
    rep_alloc_local: tuple[int, ...]
    rep_mem_home: tuple[int, ...]
    alloc_p: tuple[int, ...]
    live_target: tuple[int, ...]
    burst: tuple[int, ...]
    active: tuple[int, ...]
    free_cum: tuple[int, ...]
    phase_first: tuple[int, ...]
    node_min_partial: tuple[int, ...] = ()
    hold: tuple[int, ...] = ()
    rep_weight: tuple[float, ...] = ()
    steps: int = 1000
    seed: int = 0
    sync_every: int = 1
    partial_fill: int = 1
    partial_pick: int = 0
    free_order: int = 0
    serial: int = 0
    time_ops: int = 0
    pin_cpu: int = -1

    @property
    def reps(self) -> int:
        return len(self.rep_node)

    def args(self) -> list[str]:
        """The binary's argument list (``--key=value``; lists comma separated)."""
        out = []
        for f in dataclasses.fields(self):
            if f.name == "rep_weight":
                continue
            v = getattr(self, f.name)
            if isinstance(v, tuple) and not v:
                continue                 # an optional list left at the binary's default
            if isinstance(v, tuple):
                v = ",".join(str(int(x)) for x in v)
            out.append(f"--{f.name}={int(v) if not isinstance(v, str) else v}")
        out.append(f"--reps={self.reps}")
        return out


def _ints(x) -> tuple[int, ...]:
    """Integers of an array, or of a tuple of scalars, flattened."""
    return tuple(int(v) for v in np.asarray(x).reshape(-1))


def config_from_sim(sim, size: int, *, steps: int, seed: int = 0, sync_every: int = 1,
                    partial_fill: int = 1) -> NativeConfig:
    """Flags for one model :class:`~slabtune.model.dynamics.SimConfig` of a cache of object
    stride ``size``.  The per-rep switches (numa_mem_id() for the sheaf test, direct node
    allocation without the memoryless fix, which barn a rep sees) come from the model's own
    derivation (``dynamics._derived``), not re-derived here."""
    import jax
    import jax.numpy as jnp

    from slabtune.model import dynamics

    # _derived works on batch-minor configs ((R, B) per-rep fields): a batch of one.  On an
    # unbatched config its node-class masks broadcast wrongly (every rep then "had" a barn)
    d = dynamics._derived(dynamics._batch_minor(dynamics._one(
        jax.tree_util.tree_map(jnp.asarray, sim))))
    node = _ints(sim.rep_node)
    has_barn = tuple(bool(x) for x in _ints(d["has_barn"]))
    wl = sim.workload
    return NativeConfig(
        size=int(size),
        order=int(np.asarray(sim.order)),
        objs=int(np.asarray(sim.objs_per_slab)),
        min_partial=int(np.asarray(sim.min_partial)),
        cpu_partial_slabs=int(np.asarray(sim.cpu_partial_slabs)),
        sheaf_capacity=int(np.asarray(sim.sheaf_capacity)),
        cpu_slab=int(np.asarray(sim.cpu_slab)),
        barn_max_full=int(np.asarray(sim.barn_max_full)),
        barn_max_empty=int(np.asarray(sim.barn_max_empty)),
        remote_free_bypasses_sheaf=int(np.asarray(sim.remote_free_bypasses_sheaf)),
        slab_alloc_single=int(np.asarray(sim.slab_alloc_single)),
        pc_empty_locks=int(np.asarray(sim.pc_empty_locks)),
        free_discard_offset=int(np.asarray(sim.free_discard_offset)),
        nodes=len(np.asarray(sim.node_has_memory)),
        rep_node=node,
        rep_mem_node=_ints(sim.rep_mem_node),
        rep_local_node=_ints(d["local_node"]),
        rep_barn=tuple(n if b else -1 for n, b in zip(node, has_barn)),
        rep_alloc_local=_ints(d["alloc_local"]),
        rep_mem_home=_ints(sim.rep_mem_home),
        alloc_p=_ints(wl.alloc_p),
        live_target=_ints(wl.live_target),
        hold=_ints(wl.hold),
        burst=_ints(wl.burst),
        phase_first=_ints(wl.phase_first),
        active=_ints(wl.active),
        free_cum=_ints(wl.free_cum),
        node_min_partial=_ints(d["min_partial"]),
        rep_weight=tuple(float(w) for w in np.asarray(sim.rep_weight)),
        steps=int(steps),
        seed=int(seed),
        sync_every=int(sync_every),
        partial_fill=int(partial_fill),
    )


def patched_spec(spec, profile_patch: dict | None = None):
    """``spec`` with ``profile_patch`` (fields of KernelProfile, e.g. a scenario's kernel
    patch) applied to its profile."""
    if not profile_patch:
        return spec
    return dataclasses.replace(spec, profile=dataclasses.replace(spec.profile, **profile_patch))


def sim_config_for_spec(spec, profile_patch: dict | None = None):
    """The model's SimConfig of a :class:`~slabtune.sweeps.simconfig.SimSpec`, built exactly
    as ``slabtune simulate`` builds it (:func:`slabtune.sweeps.simulate.structure_of` and
    :func:`~slabtune.sweeps.simulate.sim_config`: structure from the policy formulas, knobs
    as sysfs overrides), after applying ``profile_patch``."""
    from slabtune.model import policy
    from slabtune.sweeps import simulate

    spec = patched_spec(spec, profile_patch)
    st = simulate.structure_of(spec)
    return simulate.sim_config(spec, policy.Structure(*(np.asarray(x) for x in st)))


def config_for_spec(spec, profile_patch: dict | None = None, *, sync_every: int = 1,
                    steps: int | None = None) -> NativeConfig:
    """Flags for a validated simulation spec (topology, cache, profile, boot parameters,
    knobs, workload, steps, seed)."""
    sim = sim_config_for_spec(spec, profile_patch)
    return config_from_sim(sim, spec.cache.size, steps=steps or spec.steps, seed=spec.seed,
                           sync_every=sync_every)


# --------------------------------------------------------------------------- run


@dataclasses.dataclass(frozen=True)
class NativeResult:
    """What one run of the binary printed."""

    counters: dict[str, int]
    per_thread: list[dict[str, Any]]
    wall_seconds: float
    ns_per_op: float
    threads: int
    peak_slab_bytes: int
    final_slab_bytes: int
    live_object_bytes: int
    peak_live_object_bytes: int
    raw: dict[str, Any]


def run_args(args: list[str], timeout: float = 300.0, binary: Path | None = None) -> dict:
    """Run the binary with an argument list (no shell) and return its parsed JSON."""
    exe = Path(binary) if binary is not None else build()
    try:
        proc = subprocess.run([str(exe), *args], capture_output=True, text=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired:
        raise NativeError(f"native run: slubsim exceeded its {timeout:g} s timeout") from None
    if proc.returncode != 0:
        raise NativeError(f"native run: slubsim exited {proc.returncode}: "
                          f"{native_sources.one_line(proc.stderr, _TAIL)}")
    try:
        return json.loads(proc.stdout)
    except json.JSONDecodeError as err:
        raise NativeError(f"native run: output is not JSON ({err})") from None


def run(cfg: NativeConfig, timeout: float = 300.0, binary: Path | None = None) -> NativeResult:
    """Run one configuration."""
    out = run_args(cfg.args(), timeout=timeout, binary=binary)
    return NativeResult(
        counters={k: int(v) for k, v in out["counters"].items()},
        per_thread=list(out.get("per_thread", [])),
        wall_seconds=float(out["wall_seconds"]),
        ns_per_op=float(out["ns_per_op"]),
        threads=int(out["threads"]),
        peak_slab_bytes=int(out["peak_slab_bytes"]),
        final_slab_bytes=int(out["final_slab_bytes"]),
        live_object_bytes=int(out["live_object_bytes"]),
        peak_live_object_bytes=int(out["peak_live_object_bytes"]),
        raw=out,
    )


def op_ns_per_pair(res: NativeResult, weights=None) -> float:
    """Nanoseconds spent inside the allocator per alloc+free pair, from a ``time_ops`` run:
    twice the mean time of one slab_alloc()/slab_free() call, per-thread means weighted by
    ``weights`` (the CPUs each rep stands for) and ops as the model weights its reps."""
    rows = [r for r in res.per_thread if r.get("op_timed")]
    if not rows:
        raise NativeError("native run: no timed allocator calls (run with time_ops=1)")
    num = den = 0.0
    for r in rows:
        w = 1.0 if weights is None else float(weights[int(r["rep"])])
        num += w * float(r["op_ns"])
        den += w * float(r["op_timed"])
    return 2.0 * num / den if den > 0 else float("nan")


def _ratio(num: float, den: float) -> float:
    return float(num) / float(den) if den > 0 else float("nan")


def fastpath_fractions(res: NativeResult, weights=None) -> tuple[float, float]:
    """(alloc, free) fast-path fractions.  With ``weights`` (one per rep: the CPUs each rep
    stands for) per-thread counts are weighted as the model weights its reps."""
    if weights is None:
        c = res.counters
        return _ratio(c["alloc_fastpath"], c["allocs"]), _ratio(c["free_fastpath"], c["frees"])
    sums = {k: 0.0 for k in ("alloc_fastpath", "allocs", "free_fastpath", "frees")}
    for row in res.per_thread:
        w = float(weights[int(row["rep"])])
        for k in sums:
            sums[k] += w * row["counters"][k]
    return (_ratio(sums["alloc_fastpath"], sums["allocs"]),
            _ratio(sums["free_fastpath"], sums["frees"]))

"""Structural configurations per second: the JAX model against the scalar kernel reference.

One grid of 10^6 configurations (125 object sizes x 20 CPU counts x 50 boot-parameter sets
x 8 kernel profiles) is evaluated by ``policy.structure`` under ``jax.jit`` as four
broadcast axes, in three ways:

* ``jax fresh``: a plain jitted call; each field keeps the axes it depends on (nr_cpus has
  no size axis, min_partial no CPU axis) and XLA allocates new output buffers every call;
* ``jax donated``: every field broadcast to the full grid, the previous call's outputs
  donated as the next call's buffers (what a chunked sweep loop does);
* ``jax flat``: one row per configuration (struct of arrays, each row gathering its
  profile), outputs donated: the layout the sweep runner feeds.

Each is timed as the median of ``--runs`` calls after a compile call.  The scalar
reference (``slabtune.model.reference``) runs on a random sample of the same grid and its
per-configuration rate is extrapolated.  The sample's JAX values must equal the reference's
(the run fails otherwise).  Targets, for the plain jitted broadcast call (``jax fresh``):
>= 1e7 configs/s and >= 100x the reference; the other modes are printed beside it.

    .venv/bin/python benchmarks/bench_structural.py [--runs 7] [--sample 3000]

Prints a table and, last, one JSON line.  Runs on the 2-core machine share it with other
work: the load average is printed beside the numbers.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from slabtune.model import policy
from slabtune.model import reference as reference_formulas
from slabtune.model.profiles import PROFILES

#: The mode the targets are stated for: a plain jitted call on the broadcast grid.
HEADLINE = "jax fresh"
TARGET_RATE = 1e7
TARGET_RATIO = 100.0


class Grid(NamedTuple):
    """The benchmark grid, one numpy array per axis (boot parameters share an axis)."""

    sizes: np.ndarray
    cpus: np.ndarray
    min_order: np.ndarray
    max_order: np.ndarray
    min_objects: np.ndarray
    profiles: tuple

    @property
    def shape(self) -> tuple[int, int, int, int]:
        return (len(self.profiles), len(self.sizes), len(self.cpus), len(self.min_order))

    @property
    def n(self) -> int:
        return int(np.prod(self.shape))


def build_grid(n_sizes: int = 125) -> Grid:
    """125 word-aligned sizes log-spaced over 8 B..2 MiB, 20 CPU counts 1..8192, 50 boot
    parameter sets (10 coupled slub_min_order/slub_max_order pairs x 5 slub_min_objects),
    every profile: 125 * 20 * 50 * 8 = 10^6 configurations."""
    k = n_sizes
    while True:
        sizes = np.unique(8 * np.round(np.geomspace(1, 1 << 18, k)).astype(np.int64))
        if len(sizes) >= n_sizes:
            break
        k += 1
    sizes = sizes[np.round(np.linspace(0, len(sizes) - 1, n_sizes)).astype(int)]
    cpus = np.array([1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 224, 256, 512, 1024,
                     4096, 8192])
    pairs = [(0, 3), (0, 0), (0, 1), (0, 2), (0, 5), (0, 10), (1, 3), (2, 3), (3, 3), (5, 5)]
    min_objs = [0, 4, 16, 64, 1024]
    boot = [(lo, hi, mo) for lo, hi in pairs for mo in min_objs]
    lo, hi, mo = (np.array(col) for col in zip(*boot))
    return Grid(sizes.astype(np.int32), cpus.astype(np.int32), lo.astype(np.int32),
                hi.astype(np.int32), mo.astype(np.int32), tuple(PROFILES.values()))


def _axes(grid: Grid):
    """The grid's axes as broadcastable int32 device arrays: (profile, size, cpu, boot)."""
    s = jnp.asarray(grid.sizes)[:, None, None]
    c = jnp.asarray(grid.cpus)[None, :, None]
    lo, hi, mo = (jnp.asarray(a)[None, None, :] for a in
                  (grid.min_order, grid.max_order, grid.min_objects))
    p = policy.expand_profile(policy.stack_profiles(grid.profiles), 3)
    return s, c, lo, hi, mo, p


class Timing(NamedTuple):
    """Wall seconds of the first (compiling) call, then wall and process-CPU seconds of
    each timed call.  CPU seconds count every thread; on a busy machine they show the work
    done where wall time also shows the waiting."""

    first_s: float
    wall_s: list
    cpu_s: list


def _timed(call, runs: int) -> Timing:
    """Time ``call`` (which blocks until its results are ready) ``runs`` times."""
    t0 = time.perf_counter()
    call()
    first = time.perf_counter() - t0
    wall, cpu = [], []
    for _ in range(runs):
        c0, t0 = time.process_time(), time.perf_counter()
        call()
        wall.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    return Timing(first, wall, cpu)


def bench_jax_fresh(grid: Grid, runs: int):
    s, c, lo, hi, mo, p = _axes(grid)
    fn = jax.jit(lambda s, c, lo, hi, mo, p: policy.structure(s, c, c, c, p, lo, hi, mo))
    return _timed(lambda: jax.block_until_ready(fn(s, c, lo, hi, mo, p)), runs)


def bench_jax_donated(grid: Grid, runs: int):
    s, c, lo, hi, mo, p = _axes(grid)
    shape = grid.shape

    def full(s, c, lo, hi, mo, p, previous):
        del previous  # donated: its buffers receive this call's outputs
        out = policy.structure(s, c, c, c, p, lo, hi, mo)
        return policy.Structure(*(jnp.broadcast_to(f, shape) for f in out))

    fn = jax.jit(full, donate_argnums=(6,))
    state = {"out": policy.Structure(*(jnp.zeros(shape, jnp.int32)
                                       for _ in policy.Structure._fields))}

    def call():
        state["out"] = fn(s, c, lo, hi, mo, p, state["out"])
        jax.block_until_ready(state["out"])

    return _timed(call, runs)


def _flat_columns(grid: Grid) -> dict:
    """One row per configuration, in the grid's (profile, size, cpu, boot) order."""
    P, S, C, B = grid.shape
    idx = np.indices(grid.shape).reshape(4, -1)
    return {
        "profile": jnp.asarray(idx[0].astype(np.int32)),
        "size": jnp.asarray(grid.sizes[idx[1]]),
        "cpus": jnp.asarray(grid.cpus[idx[2]]),
        "min_order": jnp.asarray(grid.min_order[idx[3]]),
        "max_order": jnp.asarray(grid.max_order[idx[3]]),
        "min_objects": jnp.asarray(grid.min_objects[idx[3]]),
    }


def bench_jax_flat(grid: Grid, runs: int):
    cols = _flat_columns(grid)
    table = policy.stack_profiles(grid.profiles)
    n = grid.n

    def rows(cols, table, previous):
        del previous
        p = jax.tree.map(lambda f: f[cols["profile"]], table)
        c = cols["cpus"]
        out = policy.structure(cols["size"], c, c, c, p, cols["min_order"],
                               cols["max_order"], cols["min_objects"])
        return policy.Structure(*(jnp.broadcast_to(f, (n,)) for f in out))

    fn = jax.jit(rows, donate_argnums=(2,))
    state = {"out": policy.Structure(*(jnp.zeros((n,), jnp.int32)
                                       for _ in policy.Structure._fields))}

    def call():
        state["out"] = fn(cols, table, state["out"])
        jax.block_until_ready(state["out"])

    return _timed(call, runs)


def sample_indices(grid: Grid, k: int, seed: int) -> np.ndarray:
    """``k`` random grid points as (k, 4) indices (profile, size, cpu, boot)."""
    rng = np.random.default_rng(seed)
    return np.stack([rng.integers(0, d, k) for d in grid.shape], axis=1)


def bench_reference(grid: Grid, idx: np.ndarray, runs: int = 3):
    """:class:`Timing` of passes of the scalar reference over the sampled configurations,
    and the reference's rows."""
    args = [
        (int(grid.sizes[si]), int(grid.cpus[ci]), grid.profiles[pi], int(grid.min_order[bi]),
         int(grid.max_order[bi]), int(grid.min_objects[bi]))
        for pi, si, ci, bi in idx
    ]
    results = []

    def one_pass():
        results.clear()
        for size, cpus, prof, lo, hi, mo in args:
            results.append(reference_formulas.structure(size, cpus, cpus, cpus, prof, lo, hi, mo))

    timing = _timed(one_pass, runs)
    return timing, list(results)


def check_sample(grid: Grid, idx: np.ndarray, want: list[dict]) -> int:
    """Count sampled configurations where the jitted grid and the reference differ."""
    s, c, lo, hi, mo, p = _axes(grid)
    out = jax.jit(lambda s, c, lo, hi, mo, p: policy.structure(s, c, c, c, p, lo, hi, mo))(
        s, c, lo, hi, mo, p)
    full = {f: np.broadcast_to(np.asarray(getattr(out, f)), grid.shape)
            for f in reference_formulas.STRUCTURE_FIELDS}
    bad = 0
    for (pi, si, ci, bi), row in zip(idx, want):
        got = {f: int(full[f][pi, si, ci, bi]) for f in reference_formulas.STRUCTURE_FIELDS}
        bad += got != row
    return bad


def _summary(t: Timing, configs: int) -> dict:
    """Medians (and the fastest call) of a :class:`Timing` as rates over ``configs``."""
    med = statistics.median(t.wall_s)
    cpu = statistics.median(t.cpu_s)
    return {"median_s": round(med, 6), "min_s": round(min(t.wall_s), 6),
            "first_call_s": round(t.first_s, 4), "cpu_median_s": round(cpu, 6),
            "rate": round(configs / med), "cpu_rate": round(configs / max(cpu, 1e-9))}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=7, help="timed JAX calls per mode (median)")
    ap.add_argument("--sample", type=int, default=3000,
                    help="configurations the scalar reference evaluates")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    if args.runs < 1 or args.sample < 1:
        print("bench_structural: error: --runs and --sample must be >= 1", file=sys.stderr)
        return 2

    grid = build_grid()
    n = grid.n
    load = os.getloadavg()
    print(f"grid: {' x '.join(map(str, grid.shape))} (profiles x sizes x cpus x boot) = {n}"
          f" configurations; jax {jax.__version__} on {jax.devices()[0].platform}, "
          f"{len(os.sched_getaffinity(0))} cores, load average {load[0]:.1f}")

    modes = {}
    for name, fn in (("jax fresh", bench_jax_fresh), ("jax donated", bench_jax_donated),
                     ("jax flat", bench_jax_flat)):
        t = fn(grid, args.runs)
        modes[name] = _summary(t, n)

    idx = sample_indices(grid, args.sample, args.seed)
    ref_timing, ref_rows = bench_reference(grid, idx, runs=3)
    reference = _summary(ref_timing, args.sample)
    mismatches = check_sample(grid, idx, ref_rows)

    print(f"{'mode':<13}{'median s':>10}{'min s':>9}{'first s':>9}{'configs/s':>12}"
          f"{'vs ref':>9}{'configs/cpu-s':>15}{'vs ref':>9}")
    for name, m in list(modes.items()) + [("reference", reference)]:
        per = n if name != "reference" else args.sample
        print(f"{name:<13}{m['median_s']:>10.4f}{m['min_s']:>9.4f}{m['first_call_s']:>9.2f}"
              f"{m['rate']:>12.3g}{m['rate'] / reference['rate']:>8.0f}x"
              f"{m['cpu_rate']:>15.3g}{m['cpu_rate'] / reference['cpu_rate']:>8.0f}x"
              + ("" if per == n else f"   ({per} sampled configurations)"))
    best = max(modes, key=lambda k: modes[k]["rate"])
    head = modes[HEADLINE]
    print(f"headline ({HEADLINE}: jax.jit(policy.structure) on the broadcast grid): "
          f"{head['rate']:.3g} configs/s, {head['rate'] / reference['rate']:.0f}x the "
          f"reference")
    for name, m in modes.items():
        ok_rate = m["rate"] >= TARGET_RATE
        ok_ratio = m["rate"] / reference["rate"] >= TARGET_RATIO
        print(f"targets [{name}]: >= {TARGET_RATE:.0e}/s {'met' if ok_rate else 'MISSED'}, "
              f">= {TARGET_RATIO:.0f}x {'met' if ok_ratio else 'MISSED'}")
    print(f"sample agreement: {args.sample - mismatches}/{args.sample} configurations equal")

    record = {
        "benchmark": "structural",
        "configs": n,
        "grid": list(grid.shape),
        "runs": args.runs,
        "jax": modes,
        "reference": dict(reference, sample=args.sample),
        "ratio": {k: round(m["rate"] / reference["rate"], 1) for k, m in modes.items()},
        "cpu_ratio": {k: round(m["cpu_rate"] / reference["cpu_rate"], 1)
                      for k, m in modes.items()},
        "best_mode": best,
        "headline": {"mode": HEADLINE, "rate": head["rate"],
                     "ratio": round(head["rate"] / reference["rate"], 1),
                     "meets_targets": head["rate"] >= TARGET_RATE
                     and head["rate"] / reference["rate"] >= TARGET_RATIO},
        "targets": {"rate": TARGET_RATE, "ratio": TARGET_RATIO},
        "mismatches": mismatches,
        "cores": len(os.sched_getaffinity(0)),
        "load_average_1m": round(load[0], 2),
        "jax_version": jax.__version__,
        "python": platform.python_version(),
    }
    print(json.dumps(record, sort_keys=True))
    return 1 if mismatches else 0


if __name__ == "__main__":
    sys.exit(main())

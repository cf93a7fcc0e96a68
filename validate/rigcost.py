"""The rig cost table of ``slabtune validate --target native``: the cost model's constants as
the native timing rig pays them, fitted by non-negative least squares on calibration runs
of that rig.

The rig (``native/slubsim.c``, every thread pinned to one CPU, each allocator call timed
alone) moves no cache line between CPUs and never queues on a lock, so its prediction is
the model's counters priced by :func:`slabtune.model.cost.rig_cost` (line costs 0, no
queueing).  Under that table ns per pair is linear in the
:data:`~slabtune.model.cost.RIG_FREE` constants: a configuration's *features* are its ns
per pair under the unit tables (:func:`unit_tables`), the fit (:func:`fit`) regresses the
measured ns of calibration runs (:func:`calibration_policies`, never a validated pair's
configuration, :func:`native_key`) on them, and :func:`predict` prices a pair.
:func:`model_pair_ns` is the one place that reads the model's ns per alloc+free pair.
docs/MODEL.md, "The native rig's cost table", gives the method and what the runs identify;
the tuner keeps the server tables.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from slabtune.errors import SlabtuneError

#: Slab orders, cpu_partial (objects) and min_partial values the calibration draws from:
#: orders 0..3 are served by the pcp lists on v5.13+ profiles, 4 by the buddy lists;
#: cpu_partial 0 sends every partial slab to the node list (list_lock), large values keep
#: them per CPU; min_partial 0 discards every empty slab (page allocator traffic).
CAL_ORDERS = (0, 1, 2, 3, 4)
CAL_CPU_PARTIAL = (0, 4, 13, 30, 64, 120)
CAL_MIN_PARTIAL = (0, 1, 2, 5, 10)
#: Relative tolerance under which two feature columns count as proportional (aliased).
ALIAS_TOL = 1e-6
#: Ridge weight of :func:`fit` on unit-norm feature columns: small enough to leave the fit
#: unchanged (R^2 to 4 decimals on real calibrations), large enough to pick one table
#: where the runs do not tell constants apart.
RIDGE = 1e-8


def model_pair_ns(metrics_row: Mapping[str, Any]) -> float:
    """The model's ns per alloc+free pair from a :func:`slabtune.sweeps.simulate.run` row:
    its ``ns_per_op`` metric, which is already per pair (twice the weighted mean per op),
    the unit of :func:`slabtune.validate.native.op_ns_per_pair`."""
    return float(metrics_row["ns_per_op"])


def unit_tables(pcp_batch: float) -> list:
    """One rig table per :data:`~slabtune.model.cost.RIG_FREE` constant, that constant 1
    and the others 0 (``pcp_batch`` fixed)."""
    from slabtune.model import cost

    return [cost.rig_cost({k: 1.0}, pcp_batch) for k in cost.RIG_FREE]


def calibration_policies(n: int, seed: int, topologies: Sequence[str],
                         has_cpu_partial: bool = True) -> list[tuple[str, dict[str, int]]]:
    """A seeded pool of ``(topology, policy params)`` for calibration runs, at least ``n``
    long, from which :func:`choose_calibration` takes ``n`` (callers first drop those equal
    to a pair): the slab order pinned by ``slub_min_order = slub_max_order``, cycling
    through :data:`CAL_ORDERS` and the topologies so every order runs on every topology.
    The first two passes through the orders pin a per-CPU partial list of one slab (the
    smallest nonzero cpu_partial, which drains whenever a CPU frees into a second slab:
    a CPU's own frees stay on its own list, dynamics._own_first, so larger lists seldom
    drain) with the smallest and then the largest min_partial (a drained slab that
    empties goes to the page allocator, or stays on the node list); later entries draw
    cpu_partial and min_partial from :data:`CAL_CPU_PARTIAL` and :data:`CAL_MIN_PARTIAL`.
    Up to four times ``n`` distinct entries are returned (fewer only when the grid of
    topologies x values is smaller)."""
    if n < 1:
        raise SlabtuneError(f"validate.native.calibration_runs: {n} must be at least 1")
    if not topologies:
        raise SlabtuneError("validate.native: no topology to calibrate on")
    rng = np.random.default_rng(seed)
    out: list[tuple[str, dict[str, int]]] = []
    seen: set = set()
    tries = 0
    while len(out) < 4 * n and tries < 400 * n:
        i = tries
        tries += 1
        order = CAL_ORDERS[i % len(CAL_ORDERS)]
        topo = topologies[(i // len(CAL_ORDERS)) % len(topologies)]
        pinned = i < 2 * len(CAL_ORDERS)
        drawn_mp = int(rng.choice(CAL_MIN_PARTIAL))
        params = {"slub_min_order": order, "slub_max_order": order,
                  "min_partial": (drawn_mp if not pinned else min(CAL_MIN_PARTIAL)
                                  if i < len(CAL_ORDERS) else max(CAL_MIN_PARTIAL))}
        if has_cpu_partial:
            drawn = int(rng.choice(CAL_CPU_PARTIAL))
            params["cpu_partial"] = (min(v for v in CAL_CPU_PARTIAL if v > 0)
                                     if pinned else drawn)
        key = (topo, tuple(sorted(params.items())))
        if key not in seen:
            seen.add(key)
            out.append((topo, params))
    return out


def choose_calibration(pool_features, pair_features, n: int, first: int = 0) -> list[int]:
    """Indices of ``n`` pool entries to calibrate on (all of them when the pool is not
    larger): the first ``first`` entries, then greedily the entry that brings the pairs'
    features (``pair_features``) nearest the calibration's span (:func:`span_residual`),
    and once they lie in it (or none brings them nearer), the entry farthest from the span
    so far, which separates most constants for :func:`fit`; ties go to the earlier entry.
    A random draw of calibration runs can miss what a validated configuration exercises
    (its drains, or its page traffic relative to its slow paths), and then the pair's
    prediction rests on constants no run separated."""
    pool = np.asarray(pool_features, np.float64)
    pairs = np.asarray(pair_features, np.float64).reshape(-1, pool.shape[-1])
    if len(pool) <= n:
        return list(range(len(pool)))
    chosen = list(range(min(first, n)))
    while len(chosen) < n:
        rest = [j for j in range(len(pool)) if j not in chosen]
        now = span_residual(pool[chosen], pairs) if chosen and len(pairs) else None
        best = None
        if now is not None and now > 1e-9:
            res = [span_residual(pool[chosen + [j]], pairs) for j in rest]
            k = int(np.argmin(res))
            if res[k] < now - 1e-9:
                best = rest[k]
        if best is None:
            far = np.array([span_residual(pool[chosen], pool[j][None]) if chosen else 1.0
                            for j in rest])
            best = rest[int(np.argmax(np.where(far > 1e-9, far, 0.0)))]
        chosen.append(best)
    return sorted(chosen)


def native_key(topology: str, sim_cfg) -> tuple:
    """What makes two native runs the same run: the topology (and with it the workload the
    spec builds on it) and the effective per-cache configuration the model hands the
    binary (order, objects per slab, min_partial, cpu_partial slabs, sheaf capacity)."""
    return (topology,) + tuple(int(np.asarray(getattr(sim_cfg, f))) for f in (
        "order", "objs_per_slab", "min_partial", "cpu_partial_slabs", "sheaf_capacity"))


def features_of(specs: Sequence, pcp_batch: float, simulated=None) -> np.ndarray:
    """ns per pair of every spec under every unit table (shape ``(len(specs),
    len(RIG_FREE))``), from one simulation of the batch (``simulated``: the
    ``(structs, cfgs, counters)`` of :func:`slabtune.sweeps.simulate.simulate_specs`, if
    already run)."""
    from slabtune.sweeps import simulate

    structs, cfgs, counters = simulated or simulate.simulate_specs(list(specs))
    cols = [[model_pair_ns(r) for r in simulate.metrics_of(list(specs), structs, cfgs, counters, t)]
            for t in unit_tables(pcp_batch)]
    return np.asarray(cols, np.float64).T


def aliases(x: np.ndarray, names: Sequence[str]) -> tuple[list[str], dict[str, str]]:
    """Constants no run exercises (an all-zero feature column) and constants whose column
    is proportional to an earlier one's (``name -> the earlier name``): neither can be told
    apart by any fit on these runs."""
    unused = [n for j, n in enumerate(names) if not np.any(x[:, j] > 0)]
    alias: dict[str, str] = {}
    reps: list[int] = []
    for j, n in enumerate(names):
        if n in unused:
            continue
        u = x[:, j] / np.linalg.norm(x[:, j])
        for r in reps:
            v = x[:, r] / np.linalg.norm(x[:, r])
            if abs(1.0 - float(u @ v)) < ALIAS_TOL:
                alias[n] = names[r]
                break
        else:
            reps.append(j)
    return unused, alias


def fit(features, measured, names: Sequence[str] | None = None) -> dict[str, Any]:
    """Non-negative least squares (``scipy.optimize.nnls``) of ``measured`` ns per pair
    against ``features`` (rows: calibration runs; columns: ``names``, default
    :data:`~slabtune.model.cost.RIG_FREE`), no intercept (every call's fixed cost, the
    timer's included, falls on the alloc and free path constants, one of each per pair).

    Constants no run exercises and constants aliased with an earlier one
    (:func:`aliases`) stay 0 and are listed; the columns fitted are scaled to unit norm
    for the solve.  ``rank`` is the numerical rank of the fitted columns: below their count,
    some combination of constants is not identified (a vanishing ridge, :data:`RIDGE`,
    then takes the smallest of the equally good tables; predictions for configurations
    inside the calibration's span are not affected).  ``stderr`` is each fitted constant's
    standard error from the residual variance (pseudo-inverse of the normal matrix): a
    constant the runs barely separate from another shows it there.  ``r2`` is
    1 - SS_res / SS_tot over the calibration runs (None with fewer than 2 runs or no
    spread)."""
    from scipy.optimize import nnls

    from slabtune.model import cost

    names = list(names or cost.RIG_FREE)
    x = np.asarray(features, np.float64)
    y = np.asarray(measured, np.float64)
    if x.ndim != 2 or x.shape != (len(y), len(names)):
        raise SlabtuneError(f"rig fit: features {x.shape} do not match {len(y)} runs x "
                            f"{len(names)} constants")
    if not np.all(np.isfinite(x)) or not np.all(np.isfinite(y)):
        raise SlabtuneError("rig fit: a feature or a measurement is not finite")
    unused, alias = aliases(x, names)
    cols = [j for j, n in enumerate(names) if n not in unused and n not in alias]
    theta = np.zeros(len(names))
    stderr = np.zeros(len(names))
    rank = 0
    if cols:
        scale = np.linalg.norm(x[:, cols], axis=0)
        xs = x[:, cols] / scale
        # a vanishing ridge (RIDGE on unit-norm columns) breaks ties only: where the runs
        # leave a combination of constants undetermined, the smallest table is taken
        k = len(cols)
        sol, _ = nnls(np.vstack([xs, math.sqrt(RIDGE) * np.eye(k)]),
                      np.concatenate([y, np.zeros(k)]))
        theta[cols] = sol / scale
        sv = np.linalg.svd(xs, compute_uv=False)
        rank = int(np.sum(sv > sv[0] * 1e-6))
        dof = len(y) - rank
        if dof > 0:
            sigma2 = float(np.sum((y - xs @ sol) ** 2)) / dof
            cov = sigma2 * np.linalg.pinv(xs.T @ xs, rcond=1e-12)
            stderr[cols] = np.sqrt(np.clip(np.diag(cov), 0.0, None)) / scale
    fitted = x @ theta
    r2 = r_squared(fitted.tolist(), y.tolist())
    return {"constants": {n: float(v) for n, v in zip(names, theta)},
            "stderr": {names[j]: float(stderr[j]) for j in cols},
            "fitted_constants": [names[j] for j in cols],
            "not_identified": unused, "aliased": alias, "rank": rank,
            "r2": r2, "fitted": [float(v) for v in fitted], "runs": int(len(y))}


def predict(features, constants: Mapping[str, float],
            names: Sequence[str] | None = None) -> np.ndarray:
    """Rig-table ns per pair of configurations from their features: features x constants
    (the model under ``rig_cost(constants)``, by linearity)."""
    from slabtune.model import cost

    names = list(names or cost.RIG_FREE)
    theta = np.array([float(constants.get(n, 0.0)) for n in names])
    return np.asarray(features, np.float64).reshape(-1, len(names)) @ theta


def r_squared(fitted: Sequence[float], measured: Sequence[float]) -> float | None:
    """1 - SS_res / SS_tot of ``fitted`` against ``measured`` (None when undefined), as
    :func:`fit` reports it; the report recomputes it from the stored calibration."""
    y = [float(v) for v in measured]
    if len(y) < 2:
        return None
    m = sum(y) / len(y)
    tot = sum((v - m) ** 2 for v in y)
    if tot <= 0:
        return None
    res = sum((v - f) ** 2 for v, f in zip(y, fitted))
    return 1.0 - res / tot if math.isfinite(res) else None


def span_residual(cal_features, features) -> float | None:
    """How far configurations lie outside what the calibration pins down: the largest, over
    ``features`` rows, of the relative distance from a row to the span of the calibration
    rows.  Near 0, every prediction is the same for every table that fits the calibration
    equally well (the constants it leaves unidentified do not move it); larger, some of a
    prediction rests on constants no calibration run separated."""
    a = np.asarray(cal_features, np.float64)
    f = np.asarray(features, np.float64)
    if a.size == 0 or f.size == 0:
        return None
    a = a.reshape(-1, f.shape[-1])
    coef, *_ = np.linalg.lstsq(a.T, f.T, rcond=None)
    resid = np.linalg.norm(a.T @ coef - f.T, axis=0)
    norm = np.linalg.norm(f, axis=1)
    rel = np.where(norm > 0, resid / np.where(norm > 0, norm, 1.0), 0.0)
    return float(rel.max())

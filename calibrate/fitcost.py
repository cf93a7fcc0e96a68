"""A reproducible, physically bounded fit of a few cost constants to the headline ratios.

``slabtune reproduce --fit-cost OUT.toml`` runs this.  The procedure:

1. Simulate every arm of the seed scenarios once (:func:`slabtune.calibrate.reproduce.
   simulate_arms`).  The dynamics counters do not depend on the cost constants; the cost
   model is applied afterwards (:func:`slabtune.model.metrics.compute`), so every trial
   of the fit costs one batched metrics call, not a simulation.
2. Start from :data:`PRIOR`: one order-of-magnitude value per constant for a 2020s server
   core, each with a physical range.  Only the constants in :data:`FREE` (at most four,
   one per mechanism that sets a headline ratio) move; the rest stay at their prior value.
3. Minimise, with Nelder-Mead from a fixed start for a fixed number of iterations, the
   squared log error of every headline ratio plus a weak pull (:data:`PRIOR_WEIGHT`)
   of each free constant towards its prior value.  Free constants move in log space
   through a logistic map onto their range, so they can never leave it; the physical
   orderings (:func:`constraint_violations`) are a penalty and are checked again on the
   result.
4. Write a cost TOML: every constant with its range, a ``[fitted]`` table naming the free
   constants and what they were fitted to, and a header saying how to remake it.

The objective is deterministic (fixed start, fixed simplex, fixed iterations, float32
metrics from fixed counters), so the same counters give the same file.
"""


from __future__ import annotations

import math
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from slabtune.calibrate import reproduce
from slabtune.errors import SlabtuneError
from slabtune.model import cost
from slabtune.model.priors import (
    PRIOR,
    REMOTE_OVER_LOCAL,
    constraint_violations,
    prior_values,
)

#: The constants the fit moves, one per mechanism that sets a headline ratio: slow frees
#: pace hackbench on v5.10 (receivers free into senders' slabs); the node list_lock paces
#: it on v5.11 (order-0 slabs); the memory node's list_lock taken from memoryless nodes
#: paces v7.0 sheaves; the barn lock paces barns on memoryless nodes.  The list_lock's
#: mechanism is the lines its section moves (``list_lock_lines``), not its hold: a
#: contended section's cost is the lines the previous holder wrote, local on v5.11,
#: cross-node for memoryless CPUs on v7.0, so one count sets both (the hold stays at its
#: prior, the list work of one slab).
FREE: tuple[str, ...] = ("free_slow_ns", "list_lock_lines", "line_remote_ns",
                         "barn_lock_hold_ns")
#: Weight of the pull of each free constant towards its prior, per squared log unit.
PRIOR_WEIGHT = 0.01
#: Penalty per squared log unit by which a physical ordering is broken.
CONSTRAINT_WEIGHT = 100.0
#: Nelder-Mead iterations (fixed: no tolerance stops the search early).
ITERATIONS = 300
#: Initial simplex step of each free constant, in logistic units.
SIMPLEX_STEP = 0.5
#: Largest ordering break (log units) the soft penalty leaves at an optimum on the boundary;
#: :func:`enforce_orderings` moves a fitted constant onto the boundary across that much.
SLACK_LOG = 0.01


def _sig4(x: float, up: bool) -> float:
    """``x`` to 4 significant digits, rounded up or down (never across a bound)."""
    e = math.floor(math.log10(abs(x))) - 3
    q = x / 10.0 ** e
    return float(f"{(math.ceil(q) if up else math.floor(q)) * 10.0 ** e:.4g}")


def enforce_orderings(values: dict[str, float], free=FREE) -> dict[str, float]:
    """Put a fitted table that breaks a physical ordering by at most :data:`SLACK_LOG` (the
    soft penalty's slack at an optimum on the boundary, plus rounding) on the boundary: the
    free constant of the pair moves, rounded to 4 digits on the safe side.  Larger breaks
    are left for :func:`constraint_violations` to report."""
    v = dict(values)
    need = REMOTE_OVER_LOCAL * v["line_local_ns"]
    if v["line_remote_ns"] < need <= v["line_remote_ns"] * math.exp(SLACK_LOG):
        if "line_remote_ns" in free:
            v["line_remote_ns"] = _sig4(need, up=True)
        elif "line_local_ns" in free:
            v["line_local_ns"] = _sig4(v["line_remote_ns"] / REMOTE_OVER_LOCAL, up=False)
    for fast, slow in (("alloc_fast_ns", "alloc_slow_ns"), ("free_fast_ns", "free_slow_ns")):
        if v[slow] < v[fast] <= v[slow] * math.exp(SLACK_LOG):
            if slow in free:
                v[slow] = _sig4(v[fast], up=True)
            elif fast in free:
                v[fast] = _sig4(v[slow], up=False)
    return v


def to_bounded(z, free=FREE) -> np.ndarray:
    """Unconstrained search coordinates -> constants inside their ranges (a logistic map
    onto ``[log lo, log hi]``)."""
    lo = np.array([PRIOR[k].lo for k in free])
    hi = np.array([PRIOR[k].hi for k in free])
    u = 1.0 / (1.0 + np.exp(-np.asarray(z, np.float64)))
    # exp(log(lo)) may round just below lo: clip to the range itself.
    return np.clip(np.exp(np.log(lo) + (np.log(hi) - np.log(lo)) * u), lo, hi)


def from_bounded(x, free=FREE) -> np.ndarray:
    """Inverse of :func:`to_bounded` (values at a range's edge are moved 1% inside)."""
    lo = np.log([PRIOR[k].lo for k in free])
    hi = np.log([PRIOR[k].hi for k in free])
    u = np.clip((np.log(x) - lo) / (hi - lo), 0.01, 0.99)
    return np.log(u / (1.0 - u))


def headline_log_errors(rows: list[dict[str, Any]]) -> list[float]:
    """log(model ratio / published ratio) of every headline row (inf for a ratio <= 0)."""
    out = []
    for r in rows:
        if r["headline"] and r["published_ratio"]:
            mr = r["model_ratio"]
            out.append(math.log(mr / r["published_ratio"]) if mr > 0 and math.isfinite(mr)
                       else math.inf)
    return out


def objective(values: dict[str, float], rows, free=FREE) -> float:
    """Squared log error of the headline ratios, plus the weak pull of the free constants
    towards their priors, plus the penalty of broken physical orderings."""
    fit = sum(e * e for e in headline_log_errors(rows))
    pull = sum(math.log(values[k] / PRIOR[k].value) ** 2 for k in free)
    broken = sum(size * size for _, size in constraint_violations(values, free))
    return fit + PRIOR_WEIGHT * pull + CONSTRAINT_WEIGHT * broken


class FitResult(NamedTuple):
    """The fitted table and the comparison before and after."""

    values: dict[str, float]
    free: tuple[str, ...]
    objective: float
    evaluations: int
    rows: list            # reproduce rows under the fitted constants
    residuals: list       # headline log errors under the fitted constants
    work: str = "none"    # the arms' work mode (slabtune.model.scenarios.WORK_MODES)


def cost_of(values: dict[str, float]) -> cost.CostParams:
    """:class:`~slabtune.model.cost.CostParams` from a complete ``{name: value}`` table."""
    return cost.cost_from_mapping(values)


def fit(arms, free=FREE, iterations: int = ITERATIONS) -> FitResult:
    """Fit the ``free`` constants to the headline ratios of the simulated ``arms``."""
    from scipy.optimize import minimize


    unknown = [k for k in free if k not in PRIOR]
    if unknown:
        raise SlabtuneError(f"fit: {unknown[0]} is not a cost constant")
    base = prior_values()

    def table(z) -> dict[str, float]:
        return {**base, **{k: float(v) for k, v in zip(free, to_bounded(z, free))}}

    def rows_of(values):
        return reproduce.compare(arms.scenarios, reproduce.arm_metrics(arms, cost_of(values)),
                          work=arms.work)["rows"]

    if not headline_log_errors(rows_of(base)):
        raise SlabtuneError("fit: the scenarios have no headline row to fit to")

    def f(z):
        values = table(z)
        return objective(values, rows_of(values), free)

    z0 = from_bounded(np.array([base[k] for k in free]), free)
    simplex = np.vstack([z0] + [z0 + SIMPLEX_STEP * e for e in np.eye(len(free))])
    res = minimize(f, z0, method="Nelder-Mead",
                   options={"maxiter": iterations, "maxfev": 10 * iterations + 10,
                            "xatol": 0.0, "fatol": 0.0, "initial_simplex": simplex})
    # Round to 4 significant digits, as the file stores them, and judge that table.
    values = {k: (float(f"{v:.4g}") if k in free else v) for k, v in table(res.x).items()}
    values = enforce_orderings(values, free)
    broken = constraint_violations(values, free)
    if broken:
        raise SlabtuneError(f"fit: the result breaks a physical ordering: {broken[0][0]}")
    rows = rows_of(values)
    return FitResult(values, tuple(free), objective(values, rows, free), int(res.nfev), rows,
                     headline_log_errors(rows), arms.work)


def fitted_note(free=FREE) -> str:
    """What the free constants were fitted to (one text, shared by all of them)."""
    return ("headline ratios of slabtune reproduce (2.88x hackbench v5.11/v5.10 on 224 "
            "CPUs; 13M->25M and 24M->29M IOPS of sheaves-cross-cpu-regression-2026), "
            f"jointly: {', '.join(free)}, each within its physical range")


def _work_text(work: str) -> str:
    return ("each scenario's derived other_ns (slabtune.model.scenarios, work)"
            if work == "derived" else "none (other_ns = 0 on every arm)")


def to_toml(result: FitResult, command: str) -> str:
    """The cost file of a fit: a header on how it was made, ``[cost]`` with every
    constant and its range, ``[fitted]`` naming the free constants."""
    res = ", ".join(f"{e:+.3f}" for e in result.residuals)
    lines = [
        "# Cost constants of the slabtune cost model (ns unless stated); every name is",
        "# documented in slabtune.model.cost.DOCS.  Written by",
        f"#   {command}",
        "# (slabtune.calibrate.fitcost).  Constants not listed under [fitted] are the",
        "# order-of-magnitude values of slabtune.model.priors.PRIOR for a 2020s server core;",
        f"# the {len(result.free)} under [fitted] were fitted jointly to the headline ratios",
        "# (squared log error, a weak pull towards the prior value, Nelder-Mead from the prior",
        f"# values for {ITERATIONS} iterations, each constant held inside its range).  Every",
        "# scenario uses the same numbers.  Remake this file with the command above.",
        "# Work outside the allocator per op on the scenario arms:",
        f"#   {_work_text(result.work)}.",
        f"# Headline residuals, log(model ratio / published ratio): {res}.",
        "",
        "[cost]",
    ]
    for name in cost.FIELDS:
        p, v = PRIOR[name], result.values[name]
        rng = f"range {p.lo:g}-{p.hi:g}" if p.lo != p.hi else "fixed"
        tag = "fitted, " if name in result.free else ""
        lines.append(f"{name} = {v!r}  # {tag}{rng}: {p.why}")
    lines += ["", "[fitted]"]
    note = fitted_note(result.free)
    for name in result.free:
        lines.append(f'{name} = "{note}"')
    return "\n".join(lines) + "\n"


def check_out_path(path: str | Path) -> Path:
    """The output path of ``--fit-cost``, checked before any work: its folder exists and it
    is not itself a folder."""
    p = Path(path)
    if p.is_dir():
        raise SlabtuneError(f"--fit-cost {p}: is a directory")
    if not p.parent.is_dir():
        raise SlabtuneError(f"--fit-cost {p}: directory {p.parent} does not exist")
    return p

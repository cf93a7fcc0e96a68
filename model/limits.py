"""The bounds on the work one command may start, in one place (issue 33 item 4).

Each bound is checked before the work starts (before a run directory, a study or a Ray
instance exists) and refused with one line naming the field, the size asked for and how to
allow more: every limit has an environment variable that raises it
(``SLABTUNE_MAX_<NAME>=N``), for a user who really wants a bigger run.  The grid's own size
bound (``sweeps.spec.MAX_GRID_ROWS``, 10^10 configurations) and the per-field ranges of the
spec parsers stay where they are; these are the products of fields no single range bounds.

- ``model_ops`` (10^10): CPUs x steps x ops per step, summed over the configs of one
  model call: ``simulate``, ``lab run`` and ``validate --target lab`` predictions
  (sweeps.simulate.simulate_specs; ``lab run`` also before its run directory exists).
- ``chunks`` (10^6): chunks of one sweep, each a Ray task and a manifest state:
  ``sweep plan`` and ``sweep run`` (sweeps.spec.check_grid_size).
- ``population`` (65,536): candidates per generation of ``tune --sampler population``.
- ``trials`` (10^6): trials added by one ``tune --trials`` call.

The ``model_ops`` default is about 75 s of the C dynamics engine on this project's 2-core
host (measured 2026-11-28: 224 CPUs x 200,000 steps x 64 ops, 2.9e9 rep-ops, in 22 s after
start-up); the issue's runaway (10^7 steps x 1024 ops) is over 8x it.
"""

from __future__ import annotations

import dataclasses
import os

from slabtune.errors import SlabtuneError


@dataclasses.dataclass(frozen=True)
class Limit:
    """One bound: its default and the environment variable that overrides it."""

    default: int
    env: str
    #: What is counted, as the refusal names it (plural noun phrase).
    what: str


LIMITS = {
    "model_ops": Limit(10_000_000_000, "SLABTUNE_MAX_MODEL_OPS",
                       "modelled ops (CPUs x steps x ops per step, summed over the configs)"),
    "chunks": Limit(1_000_000, "SLABTUNE_MAX_CHUNKS", "chunks (one Ray task each)"),
    "population": Limit(65_536, "SLABTUNE_MAX_POPULATION", "candidates per generation"),
    "trials": Limit(1_000_000, "SLABTUNE_MAX_TRIALS", "trials in one call"),
}


def limit(name: str) -> int:
    """The bound called ``name``: its environment variable when set (an integer >= 1, else
    one error naming the variable), else its default."""
    lim = LIMITS[name]
    raw = os.environ.get(lim.env, "").strip()
    if not raw:
        return lim.default
    try:
        v = int(raw.replace("_", ""), 10)
    except ValueError:
        raise SlabtuneError(f"{lim.env}: {raw!r} is not an integer") from None
    if v < 1:
        raise SlabtuneError(f"{lim.env}: {v} must be at least 1")
    return v


def check(name: str, value: int, field: str, detail: str = "") -> None:
    """Refuse ``value`` over the bound ``name`` with one line naming ``field``, the value
    (and ``detail``, how it was counted) and the variable that allows more."""
    cap = limit(name)
    if value > cap:
        lim = LIMITS[name]
        raise SlabtuneError(f"{field}: {value:,} {lim.what}{detail} is over the limit of "
                            f"{cap:,}; set {lim.env}={value} to allow it")


def model_ops(cpus: int, steps: int, ops_per_step: int = 1) -> int:
    """The work of one dynamics run: every CPU's rep does ``ops_per_step`` ops in each of
    ``steps`` steps (the model's step loop, model.dynamics)."""
    return int(cpus) * int(steps) * int(ops_per_step)

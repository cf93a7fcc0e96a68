"""Counted windows of dynamics runs: the model's counters over steps ``a..b`` of a run, as
the lab counts the kernel's after a warm-up, and runs that return a window and its two
halves (the steady-state check of the ``dynamics`` objective set, tuner/objectives.py).

Both engines draw step t's random words from (seed, t) alone, whatever the run's length
(model/dynamics.py), so runs of one configuration and seed to different lengths share
their first steps exactly, and a window is the difference of two runs
(:func:`window_counters`).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np


def window_counters(early, late, steps_early: int, steps_late: int):
    """The model's counters over steps ``steps_early``..``steps_late`` of one run, from its
    counters after ``steps_early`` steps (``early``) and after ``steps_late`` (``late``):
    the two runs share their first steps (model/dynamics.py draws step t's random words
    from (seed, t) alone, whatever the run's length), so events subtract exactly and a
    gauge's window average is its two time sums' difference over the window's steps;
    ``outstanding`` is the end's.  The lab's counted window (kernel/lab_boot.py
    :func:`~slabtune.kernel.lab_boot.measure`) on the model's side; SLUB's
    :class:`~slabtune.model.dynamics.Counters` or SLAB's counters, any batch shape."""
    from slabtune.model import dynamics, slab_dynamics

    gauges = ({name for name, _ in dynamics.GAUGE_FIELDS} if isinstance(late, dynamics.Counters)
              else set(slab_dynamics.REP_GAUGES + slab_dynamics.NODE_GAUGES))
    span = float(steps_late - steps_early)
    out = {}
    for name in type(late)._fields:
        a, b = np.asarray(getattr(early, name)), np.asarray(getattr(late, name))
        if name == "outstanding":
            out[name] = b
        elif name in gauges:
            out[name] = ((b.astype(np.float64) * steps_late - a.astype(np.float64) * steps_early)
                         / span).astype(b.dtype)
        else:
            out[name] = b - a
    return type(late)(**out)


class Windowed(NamedTuple):
    """Counters of a batch over a counted window and over its two halves."""

    window: object
    first: object
    second: object


def run_window(keys, cfgs, warmup: int, steps: int, run=None) -> Windowed:
    """Counters of a batch over steps ``warmup``..``warmup + steps`` and over its two
    halves (``steps // 2`` steps, then the rest), from three runs of ``run(keys, cfgs,
    steps)`` (default :func:`slabtune.sweeps.dynsim.run_batch`; SLAB's
    :func:`~slabtune.sweeps.dynsim.run_slab_batch` works alike) to ``warmup``, ``warmup +
    steps // 2`` and ``warmup + steps`` steps, subtracted by :func:`window_counters`.  The
    engines return only a run's end, so the three runs replay their shared first steps:
    about ``3 * warmup + 1.5 * steps`` steps in all."""
    if run is None:
        from slabtune.sweeps import dynsim

        run = dynsim.run_batch
    if steps < 2:
        raise ValueError(f"steps: {steps} is fewer than the 2 steps of two halves")
    mid, end = warmup + steps // 2, warmup + steps
    late = run(keys, cfgs, end)
    middle = run(keys, cfgs, mid)
    if warmup > 0:
        early = run(keys, cfgs, warmup)
    else:
        early = type(late)(**{n: np.zeros_like(np.asarray(getattr(late, n)))
                              for n in type(late)._fields})
    return Windowed(window=window_counters(early, late, warmup, end),
                    first=window_counters(early, middle, warmup, mid),
                    second=window_counters(middle, late, mid, end))

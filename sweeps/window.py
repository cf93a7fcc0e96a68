"""Counted windows of dynamics runs: the model's counters over steps ``a..b`` of a run, as
the lab counts the kernel's after a warm-up, and runs that return a window and its two
halves (the steady-state check of the ``dynamics`` objective set, tuner/objectives.py).

Both engines draw step t's random words from (seed, t) alone, whatever the run's length
(model/dynamics.py), so a run's counters at a checkpoint are those of a run of that length,
and a window is the difference of the counters at two checkpoints of one run
(:func:`window_counters`).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np


def window_counters(early, late, steps_early, steps_late):
    """The model's counters over steps ``steps_early``..``steps_late`` of one run, from its
    counters after ``steps_early`` steps (``early``) and after ``steps_late`` (``late``):
    the two runs share their first steps (model/dynamics.py draws step t's random words
    from (seed, t) alone, whatever the run's length), so events subtract exactly and a
    gauge's window average is its two time sums' difference over the window's steps;
    ``outstanding`` is the end's.  The lab's counted window (kernel/lab_boot.py
    :func:`~slabtune.kernel.lab_boot.measure`) on the model's side; SLUB's
    :class:`~slabtune.model.dynamics.Counters` or SLAB's counters, any batch shape; the
    step counts are numbers, or (B,) per configuration of counters laid out (B, ...)."""
    from slabtune.model import dynamics, slab_dynamics

    gauges = ({name for name, _ in dynamics.GAUGE_FIELDS} if isinstance(late, dynamics.Counters)
              else set(slab_dynamics.REP_GAUGES + slab_dynamics.NODE_GAUGES))
    out = {}
    for name in type(late)._fields:
        a, b = np.asarray(getattr(early, name)), np.asarray(getattr(late, name))
        if name == "outstanding":
            out[name] = b
        elif name in gauges:
            s0, s1 = (np.asarray(s, np.float64) for s in (steps_early, steps_late))
            s0, s1 = (s.reshape(s.shape + (1,) * (b.ndim - s.ndim)) for s in (s0, s1))
            out[name] = ((b.astype(np.float64) * s1 - a.astype(np.float64) * s0)
                         / (s1 - s0)).astype(b.dtype)
        else:
            out[name] = b - a
    return type(late)(**out)


class Windowed(NamedTuple):
    """Counters of a batch over a counted window and over its two halves."""

    window: object
    first: object
    second: object


def run_window(keys, cfgs, warmup, steps, run=None) -> Windowed:
    """Counters of a batch over steps ``warmup``..``warmup + steps`` and over its two
    halves (``steps // 2`` steps, then the rest; both numbers, or (B,) per configuration),
    from one engine call
    ``run(keys, cfgs, checkpoints)`` (default :func:`slabtune.sweeps.dynsim.run_batch_at`;
    SLAB's :func:`~slabtune.sweeps.dynsim.run_slab_batch_at` works alike) returning the
    counters at ``warmup``, ``warmup + steps // 2`` and ``warmup + steps`` steps of one run,
    subtracted by :func:`window_counters`: ``warmup + steps`` steps in all (three runs to
    the three checkpoints replayed their shared first steps, about ``3 * warmup + 1.5 *
    steps``), the same counters."""
    if run is None:
        from slabtune.sweeps import dynsim

        run = dynsim.run_batch_at
    warmup, steps = np.asarray(warmup, np.int64), np.asarray(steps, np.int64)
    if (steps < 2).any():
        raise ValueError(f"steps: {steps.min()} is fewer than the 2 steps of two halves")
    mid, end = warmup + steps // 2, warmup + steps
    early, middle, late = run(keys, cfgs, np.stack(np.broadcast_arrays(warmup, mid, end), -1))
    return Windowed(window=window_counters(early, late, warmup, end),
                    first=window_counters(early, middle, warmup, mid),
                    second=window_counters(middle, late, mid, end))

"""The regression constraint of a trial: how it is stored, and read back.

A trial whose objectives regress some topology by more than ``[objectives] max_regression``
is infeasible: its excess (:meth:`FleetEvaluator.regression_excess`, > 0 when it regresses
too far) is stored as an Optuna trial constraint.  Three readers must agree on it:

- Optuna 5.0 itself (``FrozenTrial.constraints``, read by NSGA-II, TPE and
  ``Study.best_trials``; optuna/study/_constrained_optimization.py
  ``_get_constraints_from_system_attrs``), which reads the system attr ``"constraints"``
  (a list: what a sampler's ``constraints_func`` stores, samplers/_base.py
  ``_process_constraints_after_trial``) and the per-name ``"constraints:NAME"`` attrs
  ``Trial.set_constraint`` writes;
- optuna-dashboard 0.21, which reads only the list (``_serializer.serialize_frozen_trial``
  sends ``trial_system_attrs.get("constraints", [])``; its Pareto-front plot takes the
  trials whose values are all <= 0 as feasible);
- optuna.visualization.plot_pareto_front (the dashboard's server-side plot), which reads
  ``FrozenTrial.constraints``.

So the excess is stored once, as the one-element list ``{"constraints": [excess]}``:
``FrozenTrial.constraints`` then reads ``{"0": excess}``.  Studies written before this
stored it as ``"constraints:regression_excess"``; Optuna reads both, and
:func:`feasible` and :func:`excess` read both through ``FrozenTrial.constraints``.
"""

from __future__ import annotations

import math

#: The system attr holding a trial's constraint values as a list (Optuna's and the
#: dashboard's shared format, see the module docstring).
KEY = "constraints"


def system_attrs(excess: float) -> dict[str, list[float]]:
    """The system attrs that store regression ``excess`` as a trial's one constraint."""
    value = float(excess)
    if math.isnan(value):       # Optuna refuses a NaN constraint (Trial.set_constraint)
        raise ValueError("regression excess is NaN")
    return {KEY: [value]}


def feasible(trial) -> bool:
    """Whether an Optuna ``FrozenTrial`` meets every constraint it has (values <= 0), as
    ``Study.best_trials`` decides it; a trial without constraints is feasible."""
    return all(v <= 0 for v in trial.constraints.values())


def excess(trial) -> float:
    """A trial's largest constraint value (its regression excess), 0.0 without one."""
    return max(trial.constraints.values(), default=0.0)

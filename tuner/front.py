"""Two-objective Pareto fronts and hypervolume on arrays (numpy), both objectives minimised.

With two objectives the non-dominated points of a set are found with one sort: order the
points by the first objective (ties by the second); a point is dominated exactly when some
point before it has a second objective at or below its own, so the test is a strict
comparison with the running minimum of the points before it.  A point equal to an earlier
one on both objectives is dropped too, so a front holds one point per objective vector (the
first in the input's order).
"""

from __future__ import annotations

import numpy as np


def order2(obj: np.ndarray) -> np.ndarray:
    """Indices sorting (N, 2) ``obj`` by the first objective, then the second, then the
    input position (a stable lexicographic order)."""
    return np.lexsort((np.arange(len(obj)), obj[:, 1], obj[:, 0]))


def nondominated(obj: np.ndarray) -> np.ndarray:
    """(N,) bool: the points of (N, 2) ``obj`` no other point dominates, one per objective
    vector (the first of equal ones)."""
    obj = np.asarray(obj, np.float64)
    keep = np.zeros(len(obj), bool)
    if len(obj) == 0:
        return keep
    order = order2(obj)
    f2 = obj[order, 1]
    before = np.concatenate([[np.inf], np.minimum.accumulate(f2)[:-1]])
    keep[order] = f2 < before
    return keep


def nondominated_bruteforce(obj: np.ndarray) -> np.ndarray:
    """The same as :func:`nondominated` by the definition, pair by pair (O(N^2); tests)."""
    obj = np.asarray(obj, np.float64)
    n = len(obj)
    keep = np.ones(n, bool)
    for i in range(n):
        le = (obj <= obj[i]).all(1)
        lt = (obj < obj[i]).any(1)
        if (le & lt).any():
            keep[i] = False
        elif (obj[:i] == obj[i]).all(1).any():
            keep[i] = False
    return keep


def hypervolume(obj: np.ndarray, ref) -> float:
    """Area dominated by (N, 2) ``obj`` and bounded by the point ``ref`` (points not
    strictly below ``ref`` on both objectives add nothing)."""
    obj = np.asarray(obj, np.float64)
    ref = np.asarray(ref, np.float64)
    if len(obj) == 0:
        return 0.0
    obj = obj[(obj < ref).all(1)]
    if len(obj) == 0:
        return 0.0
    f = obj[nondominated(obj)]
    f = f[np.argsort(f[:, 0])]           # f2 then falls strictly
    widths = np.diff(np.concatenate([f[:, 0], [ref[0]]]))
    return float(np.sum(widths * (ref[1] - f[:, 1])))


class RunningFront:
    """The front of every point added so far (feasible points only), kept small: each
    :meth:`add` merges the new points with the current front."""

    def __init__(self):
        self.obj = np.zeros((0, 2))
        self.payload = np.zeros((0,), np.int64)

    def add(self, obj: np.ndarray, payload: np.ndarray) -> np.ndarray:
        """Merge points (with an int payload each, e.g. their point number); returns the
        payloads of the added points that are on the new front."""
        obj = np.asarray(obj, np.float64).reshape(-1, 2)
        payload = np.asarray(payload, np.int64)
        if len(obj) == 0:
            return payload[:0]
        all_obj = np.concatenate([self.obj, obj])
        all_pl = np.concatenate([self.payload, payload])
        keep = nondominated(all_obj)
        new = keep[len(self.obj):]
        self.obj, self.payload = all_obj[keep], all_pl[keep]
        return payload[new]

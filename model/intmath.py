"""Exact integer division on int32 arrays without integer divides.

x86 has no vector integer divide, so XLA emits one scalar division per element for
``a // b`` on integer arrays; in the policy formulas and the dynamics step that was most of
the cost.  These helpers divide in float32 and correct the quotient by one integer step,
which is exact whenever the float32 quotient lies within one of the true quotient: for every
|a| < 2^24, and for a power of two |a| <= 2^30 while |a / b| < 2^24.  Every model formula
that divides integers uses them; model/reference.py and model/reference_sim.py, the
plain-Python twins, use Python's own ``//``.
"""

from __future__ import annotations

import jax.numpy as jnp

_I32 = jnp.int32


def floor_div(a, b):
    """floor(a / b) for int32 ``a`` and ``b > 0`` (exact within the bounds above)."""
    a = jnp.asarray(a).astype(_I32)
    b = jnp.asarray(b).astype(_I32)
    x = a.astype(jnp.float32) / b.astype(jnp.float32)
    t = x.astype(_I32)                              # truncation: a vector convert
    q = t - (x < t.astype(jnp.float32)).astype(_I32)  # floor(x) (jnp.floor is a libm call)
    r = a - q * b
    return q + (r >= b).astype(_I32) - (r < 0).astype(_I32)


def ceil_div(a, b):
    """ceil(a / b) for int32 ``a`` and ``b > 0``: DIV_ROUND_UP for a >= 0."""
    return -floor_div(-jnp.asarray(a).astype(_I32), b)

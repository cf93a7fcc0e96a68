"""Run lengths as data: what lets one compiled dynamics program serve every run length.

A run's length (its steps) is a traced int32 value in the JAX models (model/dynamics.py,
model/slab_dynamics.py), not a static argument or an array shape: XLA:CPU keeps every
compiled variant for the process's life, each dynamics step holds ~500-1,150 memory
mappings, and a process that compiled one variant per run length ran out of mappings
(vm.max_map_count, 65,530; issue 35).  So the step loop is a ``lax.fori_loop`` with a traced
bound (:func:`advance`), a run can stop at several checkpoints in one call (the counted
window of tuner/objectives.py and its halves), random words given by the caller are padded
to a few bucket lengths (:func:`pad_words`), and the words of a run are drawn in blocks of
one compiled shape (:func:`blocked_draws`).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax

#: Pre-drawn words are padded to the next power of two of at least this many steps
#: (:func:`pad_words`): runs of 1..64 steps share one compiled shape, each doubling another.
BUCKET_MIN = 64
#: Steps per compiled block of :func:`blocked_draws`.
DRAW_BLOCK = 256


def bucket(steps: int) -> int:
    """The padded length of ``steps`` pre-drawn steps: the next power of two, at least
    :data:`BUCKET_MIN`."""
    return max(BUCKET_MIN, 1 << max(int(steps) - 1, 0).bit_length())


def pad_words(w):
    """``(padded, steps)``: the words ``w`` (steps first) padded with zeros to
    :func:`bucket` steps, and their true step count as an int32 array (a traced run
    length; the padding is never read)."""
    w = jnp.asarray(w)
    n = w.shape[0]
    pad = jnp.zeros((bucket(n) - n,) + w.shape[1:], w.dtype)
    return jnp.concatenate([w, pad]), jnp.asarray(n, jnp.int32)


def advance(state, t0, t1, body):
    """``state`` after steps ``t0`` .. ``t1 - 1`` of ``body(t, state)`` (t int32; either
    bound may be traced; none when ``t1 <= t0``)."""
    return lax.fori_loop(jnp.asarray(t0, jnp.int32), jnp.asarray(t1, jnp.int32), body, state)


def checkpoints(steps) -> jnp.ndarray:
    """``steps`` (a run length or a sequence of them, concrete or traced) as a (C,) int32
    vector of checkpoints."""
    return jnp.reshape(jnp.asarray(steps, jnp.int32), (-1,))


def inv_steps(steps):
    """The float32 reciprocal of ``max(steps, 1)``.  A gauge's time average is its sum
    times this reciprocal, not divided by the step count: XLA:CPU rewrote the division by a
    constant step count as this multiplication, and the C engines (sweeps/dynsim.py
    ``_gauge``) reproduce it bit for bit, so a traced run length keeps the same floats."""
    den = jnp.maximum(jnp.asarray(steps, jnp.int32), 1).astype(jnp.float32)
    return jnp.float32(1) / den


def blocked_draws(words_at, key, seed_of, steps: int) -> jnp.ndarray:
    """All words of a run, ``(steps, ...)``: ``words_at(seed, t)`` for t in 0..steps-1 with
    ``seed = seed_of(key)``, computed in blocks of :data:`DRAW_BLOCK` steps by one compiled
    function per model (whatever ``steps``) and cut to length."""
    blocks = [_draw_block(words_at, seed_of, key, jnp.uint32(t0))
              for t0 in range(0, max(int(steps), 0), DRAW_BLOCK)]
    if not blocks:
        return _draw_block(words_at, seed_of, key, jnp.uint32(0))[:0]
    return jnp.concatenate(blocks)[:steps]


@functools.partial(jax.jit, static_argnums=(0, 1))
def _draw_block(words_at, seed_of, key, t0):
    seed = seed_of(key)
    return jax.vmap(lambda t: words_at(seed, t))(t0 + jnp.arange(DRAW_BLOCK, dtype=jnp.uint32))


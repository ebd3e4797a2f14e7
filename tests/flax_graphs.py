"""A Flax model as the optimized graph the cost-model tests lower (shared by their fixtures)."""

import jax
import jax.numpy as jnp

from npujax.frontends.flax import trace_flax
from npujax.ir.passes import optimize


def traced(model, shape):
    """``(graph, params)`` of ``model`` traced at a float32 input of ``shape``, then optimized
    (BN folded, activations fused). Flax's layers need standard dtype promotion to trace."""
    with jax.numpy_dtype_promotion("standard"):
        g, p = trace_flax(model, jnp.zeros(shape, jnp.float32))
    return optimize(g, p)

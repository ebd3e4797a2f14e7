"""Gemm on activations of rank > 2 (a transformer's ``[batch, tokens, d]``): the product runs
on flattened rows, so the kernel gradient is one 2-D product (no two-axis contraction and
transpose, which XLA:CPU compiled into copies and products outside YNNPACK); and attention's
MatMul of two activations, whose second operand's cotangent reads a kept transposed copy."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np

from npujax.ir.graph import Node
from npujax.ops.registry import run_op

NODE = Node("fc", "Gemm", ("x",), ("y",), params=("kernel", "bias"))


def _loss(x, kernel, bias):
    (y,) = run_op(NODE, [x], {"kernel": kernel, "bias": bias})
    return jnp.sum(jnp.sin(y))


def test_rank3_gemm_values_and_gradients_match_matmul():
    rng = np.random.default_rng(0)
    x, w, b = (jnp.asarray(rng.normal(size=s), jnp.float32) for s in ((3, 5, 4), (4, 6), (6,)))
    (y,) = run_op(NODE, [x], {"kernel": w, "bias": b})
    assert y.shape == (3, 5, 6)
    np.testing.assert_allclose(y, jnp.matmul(x, w) + b[None, None], rtol=1e-6, atol=1e-6)
    got = jax.grad(_loss, argnums=(0, 1, 2))(x, w, b)
    want = jax.grad(lambda x, w, b: jnp.sum(jnp.sin(jnp.matmul(x, w) + b[None, None])),
                    argnums=(0, 1, 2))(x, w, b)
    for g, r in zip(got, want):
        np.testing.assert_allclose(g, r, rtol=1e-5, atol=1e-5)


def test_rank3_gemm_kernel_gradient_contracts_one_axis():
    args = (jnp.ones((2, 3, 4)), jnp.ones((4, 6)), jnp.ones(6))
    jaxpr = str(jax.make_jaxpr(jax.grad(_loss, argnums=1))(*args))
    contracted = re.findall(r"dimension_numbers=\(\((\[[^]]*\]), ", jaxpr)
    assert contracted and all("," not in c for c in contracted), jaxpr


MATMUL = Node("scores", "MatMul", ("a", "b"), ("y",))


def _attention_loss(a, b):
    (y,) = run_op(MATMUL, [a, b], {})
    return jnp.sum(jnp.sin(y))


def test_batched_matmul_of_activations_differentiates_as_matmul_in_both_modes():
    """Attention's activation x activation MatMul: its second operand's cotangent reads a kept
    transposed copy of the first (a form XLA:CPU hands to YNNPACK); gradients, and the
    forward-over-reverse Hessian-vector products the HAWQ sensitivity takes, are matmul's."""
    rng = np.random.default_rng(1)
    a, b = (jnp.asarray(rng.normal(size=s), jnp.float32) for s in ((2, 3, 5, 4), (2, 3, 4, 6)))
    ref = lambda a, b: jnp.sum(jnp.sin(jnp.matmul(a, b)))  # noqa: E731
    got, want = jax.grad(_attention_loss, (0, 1))(a, b), jax.grad(ref, (0, 1))(a, b)
    for g, r in zip(got, want):
        np.testing.assert_allclose(g, r, rtol=1e-5, atol=1e-5)
    tangents = (jnp.ones_like(a), jnp.ones_like(b))
    hvp = jax.jvp(jax.grad(_attention_loss, (0, 1)), (a, b), tangents)[1]
    hvp_ref = jax.jvp(jax.grad(ref, (0, 1)), (a, b), tangents)[1]
    for g, r in zip(hvp, hvp_ref):
        np.testing.assert_allclose(g, r, rtol=1e-4, atol=1e-4)
    jaxpr = str(jax.make_jaxpr(jax.grad(_attention_loss, 1))(a, b))
    assert "optimization_barrier" in jaxpr  # the kept copy (not folded back into the product)

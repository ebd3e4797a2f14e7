import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from npujax.frontends.flax import trace_flax
from npujax.ir.passes import optimize
from npujax.models.cnn import DigitsCNN
from npujax.plan import lower
from npujax.quantize import quant_spec
from npujax.search import expected_latency, latency_table


@pytest.fixture(scope="module")
def graph():
    with jax.numpy_dtype_promotion("standard"):
        g, p = trace_flax(DigitsCNN(rngs=nnx.Rngs(0)), jnp.zeros((1, 8, 8, 1), jnp.float32))
    return optimize(g, p)[0]


def test_relaxed_equals_exact_at_one_hot(graph, edge_spec):
    cands = (2, 4, 8)
    table = latency_table(graph, edge_spec, cands)
    for choice in itertools.product(range(3), repeat=len(table.layers)):
        probs = jax.nn.one_hot(jnp.asarray(choice), 3)
        policy = {n: cands[c] for n, c in zip(table.layers, choice)}
        exact = lower(graph, edge_spec, quant_spec(graph, policy, 8)).latency_s
        assert float(expected_latency(probs, table)) == pytest.approx(exact, rel=1e-6)
        assert table.latency_s(policy) == pytest.approx(exact, rel=1e-6)


def test_gradient_orders_candidates_like_exact_latency(graph, edge_spec):
    table = latency_table(graph, edge_spec, (2, 4, 8))
    probs = jnp.full((len(table.layers), 3), 1 / 3, jnp.float32)
    g = np.asarray(jax.grad(expected_latency)(probs, table))
    sec = np.asarray(table.seconds)
    for i in range(len(table.layers)):
        assert np.array_equal(np.argsort(g[i], kind="stable"), np.argsort(sec[i], kind="stable"))


def test_gradient_matches_finite_differences(graph, edge_spec):
    table = latency_table(graph, edge_spec, (2, 4, 8))

    def f(logits):
        return expected_latency(jax.nn.softmax(logits, axis=-1), table) * 1e6  # µs

    logits = jnp.asarray(np.random.default_rng(0).normal(size=(len(table.layers), 3)),
                         jnp.float32)
    g = np.asarray(jax.grad(f)(logits))
    eps = 1e-2
    for idx in [(0, 0), (2, 1), (3, 2)]:
        d = np.zeros(logits.shape, np.float32)
        d[idx] = eps
        fd = (float(f(logits + d)) - float(f(logits - d))) / (2 * eps)
        assert g[idx] == pytest.approx(fd, rel=0.01, abs=1e-4)

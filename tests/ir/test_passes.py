"""Graph passes on a traced model: BatchNorm folding and epilogue fusion keep its function."""

import jax.numpy as jnp
import numpy as np
import pytest

from npujax.ir.execute import execute
from npujax.ir.passes import fold_batchnorm, optimize
from tests.helpers import traced_digits_cnn

pytestmark = pytest.mark.flax_model


@pytest.fixture(scope="module")
def traced():
    return traced_digits_cnn()


def test_optimized_graph_folds_bn_fuses_relu_and_matches(traced):
    model, (graph, params) = traced
    g2, p2 = optimize(graph, params)
    assert [(n.name, n.op, tuple(n.attrs.get("epilogue", ()))) for n in g2.nodes] == [
        ("conv1", "Conv", ("Relu",)), ("conv2", "Conv", ("Relu",)),
        ("avgpool_0", "AveragePool", ()), ("reshape_0", "Reshape", ()),
        ("fc1", "Gemm", ("Relu",)), ("fc2", "Gemm", ()),
    ]
    x = jnp.asarray(np.random.default_rng(1).uniform(size=(7, 8, 8, 1)), jnp.float32)
    model.eval()  # (calling it in train mode would update the BN running statistics)
    want = np.asarray(model(x))
    np.testing.assert_allclose(np.asarray(execute(g2, p2, x)), want, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(np.asarray(execute(graph, params, x)), want, rtol=1e-5, atol=1e-5)


def test_bn_scale_zero_folds_without_nan(traced):
    _, (graph, params) = traced
    params = {k: dict(v) for k, v in params.items()}
    params["bn1"]["scale"] = jnp.zeros_like(params["bn1"]["scale"])
    params["bn1"]["var"] = jnp.zeros_like(params["bn1"]["var"])
    g2, p2 = fold_batchnorm(graph, params)
    assert np.all(np.isfinite(np.asarray(p2["conv1"]["kernel"])))
    x = jnp.ones((2, 8, 8, 1), jnp.float32)
    np.testing.assert_allclose(np.asarray(execute(g2, p2, x)),
                               np.asarray(execute(graph, params, x)), rtol=1e-4, atol=1e-4)

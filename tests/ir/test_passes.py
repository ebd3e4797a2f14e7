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


def test_bn_fold_on_the_host_equals_the_traced_fold(traced, monkeypatch):
    """Concrete float32 weights fold with numpy (no program to compile); traced ones fold in
    one jitted program. The kernels agree bit for bit; the biases to XLA's fused multiply-add."""
    import jax

    from npujax.ir import passes

    _, (graph, params) = traced
    with monkeypatch.context() as m:
        m.setattr(passes, "_fold_params", lambda *a, **k: pytest.fail("compiled a fold"))
        host = fold_batchnorm(graph, params)[1]
    traced_fold = jax.jit(lambda p: fold_batchnorm(graph, p)[1])(params)
    folded = [k for k, v in host.items() if "kernel" in v and "bias" in v]
    assert folded
    for k in folded:
        np.testing.assert_array_equal(np.asarray(host[k]["kernel"]),
                                      np.asarray(traced_fold[k]["kernel"]))
        np.testing.assert_allclose(np.asarray(host[k]["bias"]), np.asarray(traced_fold[k]["bias"]),
                                   rtol=1e-6, atol=1e-7)

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from npujax.errors import UnsupportedOpError
from npujax.frontends.flax import trace_flax
from npujax.ir.execute import execute
from tests.helpers import digits_cnn, traced_digits_cnn

pytestmark = pytest.mark.flax_model


@pytest.fixture(scope="module")
def traced():
    return traced_digits_cnn()


def test_demo_cnn_graph_layers_and_shapes(traced):
    _, (graph, params) = traced
    assert [(n.name, n.op) for n in graph.nodes] == [
        ("conv1", "Conv"), ("bn1", "BatchNormalization"), ("relu_0", "Relu"),
        ("conv2", "Conv"), ("bn2", "BatchNormalization"), ("relu_1", "Relu"),
        ("avgpool_0", "AveragePool"), ("reshape_0", "Reshape"),
        ("fc1", "Gemm"), ("relu_2", "Relu"), ("fc2", "Gemm"),
    ]
    shape = lambda name: graph.tensors[graph.node(name).outputs[0]].shape  # noqa: E731
    assert shape("conv1") == (1, 8, 8, 16)
    assert shape("conv2") == (1, 8, 8, 32)
    assert shape("avgpool_0") == (1, 4, 4, 32)
    assert shape("reshape_0") == (1, 512)
    assert shape("fc1") == (1, 128) and shape("fc2") == (1, 10)
    assert params["conv1"]["kernel"].shape == (3, 3, 1, 16)
    assert graph.node("conv1").attrs["padding"] == [[1, 1], [1, 1]]
    assert set(params["bn1"]) == {"scale", "bias", "mean", "var"}


def test_trace_leaves_the_model_untouched():
    m = digits_cnn()
    m.train()
    trace_flax(m, jnp.zeros((1, 8, 8, 1), jnp.float32))
    assert m.bn1.use_running_average is False


class LinenNet(nn.Module):
    @nn.compact
    def __call__(self, x, train: bool = False):
        x = nn.Conv(4, (3, 3), strides=(2, 2), padding="VALID", name="stem")(x)
        x = nn.BatchNorm(use_running_average=not train, name="bn")(x)
        x = nn.max_pool(nn.relu(x), (2, 2), strides=(1, 1))
        x = x.reshape((x.shape[0], -1))
        return nn.Dense(3, name="head")(x)


def test_linen_model_traces():
    net = LinenNet()
    x = jnp.asarray(np.random.default_rng(3).normal(size=(2, 9, 9, 2)), jnp.float32)
    variables = net.init(jax.random.key(0), x)
    graph, params = trace_flax(net, x[:1], variables=variables, train=False)
    assert [n.op for n in graph.nodes] == ["Conv", "BatchNormalization", "Relu", "MaxPool",
                                           "Reshape", "Gemm"]
    assert graph.node("stem").attrs["strides"] == [2, 2]
    np.testing.assert_allclose(np.asarray(execute(graph, params, x)),
                               np.asarray(net.apply(variables, x, train=False)), rtol=1e-5,
                               atol=1e-5)


class CumsumNet(nnx.Module):
    def __init__(self, rngs):
        self.fc = nnx.Linear(4, 4, rngs=rngs)

    def __call__(self, x):
        return jnp.cumsum(self.fc(x), axis=-1)


def test_unsupported_primitive_is_named():
    with pytest.raises(UnsupportedOpError, match="cumsum"):
        trace_flax(CumsumNet(nnx.Rngs(0)), jnp.ones((1, 4), jnp.float32))

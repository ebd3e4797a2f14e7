import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from npujax.errors import ConfigError, GraphError, ShapeError, UnsupportedOpError
from npujax.frontends.flax import trace_flax
from npujax.ir.passes import fold_batchnorm, optimize
from npujax.models.cnn import DigitsCNN
from npujax.quantize.calibrate import calibrate
from npujax.quantize.execute import execute
from npujax.quantize.model_file import load_graph, save_graph
from npujax.quantize.spec import quant_spec

pytestmark = pytest.mark.flax_model


def _model(seed=0):
    m = DigitsCNN(rngs=nnx.Rngs(seed))
    rng = np.random.default_rng(seed)
    for bn in (m.bn1, m.bn2):  # non-trivial running statistics so folding is really tested
        n = bn.mean[...].shape[0]
        bn.mean[...] = jnp.asarray(rng.normal(size=n), jnp.float32)
        bn.var[...] = jnp.asarray(rng.uniform(0.5, 2.0, n), jnp.float32)
        bn.scale[...] = jnp.asarray(rng.normal(size=n), jnp.float32)
        bn.bias[...] = jnp.asarray(rng.normal(size=n), jnp.float32)
    return m


@pytest.fixture(scope="module")
def traced():
    m = _model()
    x = jnp.asarray(np.random.default_rng(0).uniform(size=(1, 8, 8, 1)), jnp.float32)
    return m, trace_flax(m, x)


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


def test_trace_leaves_the_model_untouched():
    m = _model()
    m.train()
    trace_flax(m, jnp.zeros((1, 8, 8, 1), jnp.float32))
    assert m.bn1.use_running_average is False


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


def test_quantized_error_shrinks_with_bits(traced):
    _, (graph, params) = traced
    g, p = optimize(graph, params)
    x = jnp.asarray(np.random.default_rng(2).uniform(size=(32, 8, 8, 1)), jnp.float32)
    ref = np.asarray(execute(g, p, x))
    errs = []
    for bits in (4, 6, 8):
        q = quant_spec(g, bits, 8)
        qs = calibrate(g, p, [x], q)
        errs.append(np.abs(np.asarray(execute(g, p, x, quant=q, qstate=qs)) - ref).mean())
    assert errs[0] > errs[1] > errs[2] > 0
    assert errs[2] < 0.05 * np.abs(ref).mean()


def test_execute_is_jittable_and_differentiable(traced):
    _, (graph, params) = traced
    g, p = optimize(graph, params)
    q = quant_spec(g, 8, 8)
    x = jnp.ones((4, 8, 8, 1), jnp.float32)
    qs = calibrate(g, p, [x], q)
    grads = jax.jit(jax.grad(lambda pp: jnp.sum(execute(g, pp, x, quant=q, qstate=qs))))(p)
    assert set(grads) == set(p)
    assert all(np.all(np.isfinite(np.asarray(v))) for d in grads.values() for v in d.values())


def test_execute_errors(traced):
    _, (graph, params) = traced
    with pytest.raises(ShapeError, match="batch, 8, 8, 1"):
        execute(graph, params, jnp.ones((2, 9, 8, 1), jnp.float32))
    g, p = optimize(graph, params)
    with pytest.raises(ConfigError, match="calibration"):
        execute(g, p, jnp.ones((1, 8, 8, 1), jnp.float32), quant=quant_spec(g, 8, 8))
    with pytest.raises(ConfigError, match="unknown"):
        quant_spec(g, {"conv1": 8, "nope": 4})


def test_save_load_round_trip(tmp_path, traced):
    _, (graph, params) = traced
    g, p = optimize(graph, params)
    save_graph(tmp_path / "m.npz", g, p, meta={"k": 1})
    g2, p2, qs, meta = load_graph(tmp_path / "m.npz")
    assert meta == {"k": 1} and qs == {}
    assert [n.name for n in g2.nodes] == [n.name for n in g.nodes]
    x = jnp.ones((3, 8, 8, 1), jnp.float32)
    np.testing.assert_array_equal(np.asarray(execute(g2, p2, x)), np.asarray(execute(g, p, x)))


def test_load_errors(tmp_path):
    with pytest.raises(GraphError, match="does not exist"):
        load_graph(tmp_path / "missing.npz")
    bad = tmp_path / "bad.npz"
    bad.write_bytes(b"not a zip")
    with pytest.raises(GraphError, match="not an npujax graph"):
        load_graph(bad)


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

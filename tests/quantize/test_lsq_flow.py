"""LSQ / LSQ+ in the model flow: calibration initialises the learned steps, QAT learns them
(loss down, steps > 0, finite gradients), and conversion / ONNX export deploy the learned grid."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from npujax.backends.integer import convert, execute_integer
from npujax.backends.onnx_export import to_onnx
from npujax.errors import ConfigError
from npujax.frontends.flax import trace_flax
from npujax.ir.execute import execute, tap
from npujax.ir.passes import fold_batchnorm
from npujax.models.cnn import DigitsCNN
from npujax.numerics import FP8_E4M3FN, MIN_SCALE, IntFormat
from npujax.ops import gemm_nodes
from npujax.quantize.calibrate import calibrate
from npujax.quantize.quantizers import merge_learned, split_learned
from npujax.quantize.spec import LayerQuant, quant_spec
from npujax.quantize.train import TrainConfig, cross_entropy, train_graph
from tests.onnx_models import ort_run

pytestmark = pytest.mark.flax_model


@pytest.fixture(scope="module")
def model():
    m = DigitsCNN(rngs=nnx.Rngs(0))
    rng = np.random.default_rng(0)
    x = rng.uniform(size=(64, 8, 8, 1)).astype(np.float32)
    y = rng.integers(0, 10, 64).astype(np.int32)
    graph, params = fold_batchnorm(*trace_flax(m, x[:1]))
    return graph, params, x, y


# LSQ+ repeats the flow with a learned offset; slower, so it runs with the integration tests.
@pytest.fixture(scope="module", params=["lsq", pytest.param("lsq+", marks=pytest.mark.integration)])
def trained(model, request):
    graph, params, x, y = model
    q = quant_spec(graph, 4, 4, quantizer=request.param)
    qstate = calibrate(graph, params, [x], q)
    p2, qs2, _ = train_graph(graph, params, x, y, quant=q, qstate=qstate, config=TrainConfig(
        steps=15, learning_rate=2e-3, batch_size=64))
    return request.param, q, qstate, p2, qs2


def _run(graph, p, q, qs, x, taps=()):
    observe = tap(taps) if taps else None
    return jax.jit(lambda p, qs, v: execute(graph, p, v, quant=q, qstate=qs, observe=observe))(
        p, qs, jnp.asarray(x))


def _loss(graph, p, q, qs, x, y):
    return float(cross_entropy(_run(graph, p, q, qs, x), y))


def test_calibration_initialises_learned_entries(model, trained):
    graph, params, *_ = model
    method, q, qstate, *_ = trained
    for node in gemm_nodes(graph):
        e = qstate[node.name]
        c = np.shape(params[node.name]["kernel"])[-1]
        assert e.weight_step.shape == (c,) and e.weight_step.dtype == jnp.float32
        # minmax init: the PTQ grid, max|w| / Q_p per output channel
        w = np.asarray(params[node.name]["kernel"]).reshape(-1, c)
        np.testing.assert_allclose(e.weight_step, np.abs(w).max(0) / 7, rtol=1e-6)
        if method == "lsq+":
            np.testing.assert_allclose(e.act_offset,
                                       -float(e.act_zero_point) * float(e.act_scale))


def test_lsq_qat_lowers_loss_and_learns_positive_steps(model, trained):
    graph, params, x, y = model
    method, q, qstate, p2, qs2 = trained
    assert _loss(graph, p2, q, qs2, x, y) < _loss(graph, params, q, qstate, x, y)
    for name, e in qs2.items():
        for k in ("act_scale", "weight_step"):
            assert np.all(np.asarray(getattr(e, k)) >= MIN_SCALE), (name, k)
            assert not np.allclose(np.asarray(getattr(e, k)),
                                   np.asarray(getattr(qstate[name], k))), (name, k)
        np.testing.assert_array_equal(e.act_zero_point, qstate[name].act_zero_point)
    learned, full = split_learned(q, qs2)
    assert all(k != "act_zero_point" for e in learned.values() for k in e)
    grads = jax.jit(jax.grad(lambda s: cross_entropy(
        execute(graph, p2, jnp.asarray(x), quant=q, qstate=merge_learned(s, full)), y)))(learned)
    leaves = jax.tree.leaves(grads)
    assert all(np.all(np.isfinite(np.asarray(g))) for g in leaves)
    assert any(np.any(np.asarray(g) != 0) for g in leaves)


def test_convert_and_export_use_the_learned_steps(model, trained):
    graph, _, x, _ = model
    method, q, _, p2, qs2 = trained
    names = [n.name for n in gemm_nodes(graph)]
    imodel = convert(graph, p2, q, qs2)
    for name in names:
        np.testing.assert_array_equal(imodel.layers[name].weight_scale, qs2[name].weight_step)
        np.testing.assert_array_equal(imodel.layers[name].input_scale, qs2[name].act_scale)
    fq_out, fq_taps = _run(graph, p2, q, qs2, x, taps=tuple(names))
    int_out, int_taps = jax.jit(lambda v: execute_integer(imodel, v, taps=names))(x)
    # Every layer input on the learned grid: LSQ's first layer sees the same float input and
    # grid (exact); one requantization is within one step; deeper layers within two (at 4 bits
    # a one-code difference upstream moves later values across rounding edges -- the same
    # figures as STE at W4A4). LSQ+ also rounds -offset/step to an integer zero point.
    limit = {"conv1": 0.0, "conv2": 1.0} if method == "lsq" else {}
    for name in names:
        s = float(qs2[name].act_scale)
        d = np.abs(np.asarray(int_taps[name][0]) - np.asarray(fq_taps[name][0])) / s
        assert d.max() <= limit.get(name, 2.0 if method == "lsq" else 2.5) + 1e-3, name
    assert np.all(np.isfinite(np.asarray(int_out)))
    if method == "lsq":  # ONNX QDQ on the learned grid: onnxruntime reproduces fake-quant
        model_ = to_onnx(graph, p2, q, qs2, int32_bias=False, requantize_outputs=False)
        blob = model_.SerializeToString()  # unoptimized: ORT computes the QDQ graph as written
        ort = np.concatenate([ort_run(blob, {graph.inputs[0]: x[i:i + 1]}, True)[0]
                              for i in range(4)])
        np.testing.assert_allclose(ort, np.asarray(fq_out)[:4], atol=1e-5)


def test_lsq_configuration_errors(model):
    graph, params, x, y = model
    with pytest.raises(ConfigError, match="unknown quantizer .pact."):
        LayerQuant(weight=IntFormat(4), quantizer="pact")
    with pytest.raises(ConfigError, match="FP8"):
        LayerQuant(weight=FP8_E4M3FN, quantizer="lsq")
    with pytest.raises(ConfigError, match="per-block"):
        LayerQuant(weight=IntFormat(4), quantizer="lsq", weight_block_size=8)
    q = quant_spec(graph, 4, 4, quantizer="lsq")
    qstate = calibrate(graph, params, [x], q)
    bare = {k: e._replace(weight_step=None) for k, e in qstate.items()}
    with pytest.raises(ConfigError, match="weight_step"):
        execute(graph, params, jnp.asarray(x), quant=q, qstate=bare)

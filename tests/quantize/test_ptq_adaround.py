"""AdaRound (Nagel et al. 2020, arXiv:2004.10568): hard-rounded weights exactly on the layer's
grid, and a lower layer reconstruction error than rounding to nearest."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from npujax.errors import ConfigError
from npujax.ir.execute import execute
from npujax.ir.graph import Graph, TensorType
from npujax.numerics import fake_quant
from npujax.quantize.calibrate import calibrate
from npujax.quantize.methods import PTQ_METHODS
from npujax.quantize.methods.adaround import AdaRound, rectified_sigmoid
from npujax.quantize.quantizers import STEState
from npujax.quantize.quantizers.fixed import FixedGrid
from npujax.quantize.spec import quant_spec
from tests.quantize.ptq_graphs import correlated_inputs, gemm, linear


def test_rectified_sigmoid_reaches_0_and_1():
    v = jnp.asarray([-10.0, 0.0, 10.0])
    np.testing.assert_allclose(rectified_sigmoid(v), [0.0, 0.5, 1.0], atol=1e-6)


def test_adaround_weights_on_grid_and_below_nearest_mse():
    rng = np.random.default_rng(0)
    k, n = 32, 16
    graph = linear(k, n)
    params = {"fc": {"kernel": (rng.normal(size=(k, n)) / np.sqrt(k)).astype(np.float32),
                     "bias": np.zeros(n, np.float32)}}
    x = correlated_inputs(rng, 512, k)
    # W4A8 (per-channel weights); the input grid of the calibrated min-max range
    quant = quant_spec(graph, 4, 8)
    lo, hi = float(min(x.min(), 0)), float(x.max())
    qstate = {"fc": STEState(np.float32((hi - lo) / 255), np.int32(round(-lo * 255 / (hi - lo))))}
    step = PTQ_METHODS["adaround"](iterations=300, learning_rate=1e-2).apply(
        graph, params, quant, [x], qstate)
    lq, state = step.quant["fc"], step.qstate["fc"]
    assert isinstance(lq.quantizer, FixedGrid)
    w = np.asarray(params["fc"]["kernel"])
    wq = np.asarray(step.params["fc"]["kernel"])
    s = np.asarray(state.weight_scale)
    # the grid is the calibrated min-max per-channel grid, and the weights lie on it exactly
    np.testing.assert_array_equal(s, np.abs(w).max(axis=0) * np.float32(1 / 7))
    codes = np.round(wq / s)  # grid points are the float32 products code * scale
    np.testing.assert_array_equal(codes * s, wq)
    assert np.abs(codes).max() <= 7
    np.testing.assert_array_equal(  # the layer's own fake-quant leaves them as they are
        lq.quantizer.quantize_kernel(graph.node("fc"), lq, jnp.asarray(wq), state), wq)
    # each weight is rounded down or up (never further)
    assert np.all(np.abs(codes - w / s) < 1)
    # layer reconstruction (on the quantized inputs the layer reads) beats round-to-nearest
    xq = np.asarray(fake_quant(jnp.asarray(x), qstate["fc"].act_scale,
                               qstate["fc"].act_zero_point, quant["fc"].act))
    rtn = np.asarray(fake_quant(jnp.asarray(w), jnp.asarray(s), jnp.zeros(n, jnp.int32),
                                quant["fc"].weight, 1))
    mse_rtn = np.mean((xq @ rtn - x @ w) ** 2)
    mse_ada = np.mean((xq @ wq - x @ w) ** 2)
    assert mse_ada < 0.8 * mse_rtn, (mse_ada, mse_rtn)  # measured 0.6x at 300 iterations
    assert "(AdaRound)" in step.notes[0]


def test_adaround_needs_the_calibrated_state():
    graph = linear(4, 2)
    params = {"fc": {"kernel": np.ones((4, 2), np.float32), "bias": np.zeros(2, np.float32)}}
    with pytest.raises(ConfigError, match="after calibration"):
        AdaRound(iterations=1).apply(graph, params, quant_spec(graph, 4, 8),
                                     [np.ones((2, 4), np.float32)], None)


@pytest.mark.parametrize("field, value", [("iterations", 0), ("reg_weight", -1.0),
                                          ("warmup", 1.0), ("zeta", 1.0), ("gamma", 0.0),
                                          ("beta_start", 1.0), ("learning_rate", float("nan"))])
def test_adaround_config_errors_name_the_field(field, value):
    with pytest.raises(ConfigError, match=f"AdaRound.{field}"):
        AdaRound(**{field: value})


def test_defaults_are_the_papers():
    m = AdaRound()
    assert (m.zeta, m.gamma, m.reg_weight, m.beta_start, m.beta_end, m.warmup, m.iterations,
            m.learning_rate) == (1.1, -0.1, 0.01, 20.0, 2.0, 0.2, 10000, 1e-3)
    assert m.stage == "post_calibration"


def test_adaround_runs_layer_by_layer_on_the_quantized_model():
    rng = np.random.default_rng(1)
    graph = Graph((gemm("fc1", "x", "h", relu=True), gemm("fc2", "h", "y")), ("x",), ("y",),
                  {"x": TensorType((1, 8), "float32"), "h": TensorType((1, 6), "float32"),
                   "y": TensorType((1, 3), "float32")})
    params = {n: {"kernel": rng.normal(size=s).astype(np.float32),
                  "bias": np.zeros(s[1], np.float32)} for n, s in (("fc1", (8, 6)),
                                                                    ("fc2", (6, 3)))}
    x = correlated_inputs(rng, 64, 8)
    quant = quant_spec(graph, 3, 8)
    qstate = calibrate(graph, params, [x], quant)
    step = AdaRound(iterations=5, batch_size=16).apply(graph, params, quant, [x], qstate)
    assert [n.split(":")[0] for n in step.notes] == ["fc1", "fc2"]
    for name in ("fc1", "fc2"):
        s = np.asarray(step.qstate[name].weight_scale)
        wq = np.asarray(step.params[name]["kernel"])
        np.testing.assert_array_equal(np.round(wq / s) * s, wq)
        # the calibrated input grid is kept
        assert step.qstate[name].act_scale == qstate[name].act_scale
    y = jax.jit(lambda p, s: execute(graph, p, x, quant=step.quant, qstate=s))(step.params,
                                                                           step.qstate)
    assert np.all(np.isfinite(np.asarray(y)))

"""SmoothQuant (Xiao et al. 2023, arXiv:2211.10438): the float function kept, the outlier
channel's activation range moved into the weights, and W8A8 SQNR improved."""

import jax
import numpy as np
import pytest

from npujax.errors import ConfigError
from npujax.ir.execute import execute, tap
from npujax.quantize.calibrate import calibrate
from npujax.quantize.methods import PTQ_METHODS
from npujax.quantize.methods.smoothquant import SmoothQuant, smoothing_scales
from npujax.quantize.spec import quant_spec
from tests.quantize.ptq_graphs import mlp_block


def test_scales_balance_activation_and_weight_maxima():
    rng = np.random.default_rng(0)
    xmax, wmax = rng.uniform(0.1, 50, 12), rng.uniform(0.01, 1, 12)
    s = smoothing_scales(xmax, wmax, 0.5)
    np.testing.assert_allclose(s, np.sqrt(xmax) / np.sqrt(wmax), rtol=1e-6)  # the paper's s_j
    # at alpha = 0.5 both maxima become sqrt(max|X_j| max|W_j|) (section 4)
    np.testing.assert_allclose(xmax / s, wmax * s, rtol=1e-5)
    np.testing.assert_allclose(smoothing_scales(xmax, wmax, 0.8), xmax ** 0.8 / wmax ** 0.2,
                               rtol=1e-5)
    assert smoothing_scales(np.zeros(2), np.ones(2), 0.5).tolist() == [1.0, 1.0]


@pytest.fixture(scope="module")
def outlier_block():
    rng = np.random.default_rng(0)
    graph, params = mlp_block(rng)
    params["ln"]["scale"][3] = 40.0  # one outlier channel in the LayerNorm output (fc1's input)
    x = rng.normal(size=(32, 4, 16)).astype(np.float32)
    return graph, params, x


def test_smoothquant_keeps_float_and_lifts_w8a8(outlier_block):
    graph, params, x = outlier_block
    quant = quant_spec(graph, 8, 8)  # W8A8: per-channel weights, per-tensor activations
    skip = SmoothQuant().apply(graph, params, quant, [x], None)  # the paper's code: fold only
    assert "folded into LayerNormalization 'ln'" in skip.notes[0]
    assert "fc2: not smoothed" in skip.notes[1] and skip.graph is not graph
    np.testing.assert_array_equal(skip.params["fc2"]["kernel"], params["fc2"]["kernel"])
    step = PTQ_METHODS["smoothquant"](unfoldable="mul").apply(graph, params, quant, [x], None)
    assert "folded into LayerNormalization 'ln'" in step.notes[0]
    assert "fc2: an explicit Mul" in step.notes[1]
    assert [n.op for n in step.graph.nodes].count("Mul") == 1

    def run(g, p, q=None):
        qs = None if q is None else calibrate(g, p, [x], q)
        out, taps = jax.jit(lambda p, s, v: execute(g, p, v, quant=q, qstate=s,
                                                     observe=tap(["fc1"])))(p, qs, x)
        return np.asarray(out), np.asarray(taps["fc1"][0])

    y0, h0 = run(graph, params)
    y1, h1 = run(step.graph, step.params)
    np.testing.assert_allclose(y1, y0, rtol=0, atol=1e-5 * np.abs(y0).max())
    # the outlier channel: max over median of fc1's per-channel input range shrinks
    ratio = [np.max(a) / np.median(a) for a in (np.abs(h).reshape(-1, 16).max(0)
                                               for h in (h0, h1))]
    assert ratio[1] < ratio[0] / 4, ratio  # measured 38 -> 6.3
    sqnr = [10 * np.log10(np.sum(y0 ** 2) / np.sum((run(g, p, quant)[0] - y0) ** 2))
            for g, p in ((graph, params), (step.graph, step.params))]
    assert sqnr[1] > sqnr[0] + 5, sqnr  # measured 32.9 -> 41.0 dB (39.5 folding only)
    assert jax.tree.structure(step.params) == jax.tree.structure(params)


@pytest.mark.parametrize("field, value", [("alpha", 1.5), ("alpha", "0.5"),
                                          ("unfoldable", "fold")])
def test_smoothquant_config_errors_name_the_field(field, value):
    with pytest.raises(ConfigError, match=f"SmoothQuant.{field}"):
        SmoothQuant(**{field: value})

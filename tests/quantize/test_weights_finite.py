"""Non-finite and overflowing weights are refused with the layer named (issue #11, class 9)."""

from __future__ import annotations

import numpy as np
import pytest

from npujax import calibrate, quant_spec
from npujax.errors import CalibrationError
from npujax.frontends.onnx import from_onnx
from npujax.quantize.train import TrainConfig, train_graph
from npujax.quantize.weights import MAX_ABS_WEIGHT, check_weights
from tests import hostile_inputs as hi


@pytest.fixture(scope="module")
def model():
    return from_onnx(hi.conv(1, 6, c_in=2, c_out=3))


@pytest.mark.parametrize("value, match", [(np.inf, "non-finite"), (np.nan, "non-finite"),
                                          (3.0e38, "overflow")])
def test_bad_weight_is_refused_by_calibration_and_training(model, value, match):
    graph, params = model
    (name,) = params
    kernel = np.array(params[name]["kernel"])
    kernel.flat[5] = value
    bad = {name: {**params[name], "kernel": kernel}}
    x = np.ones((2, 2, 6, 6), np.float32)
    with pytest.raises(CalibrationError, match=f"{name}.*kernel.*{match}"):
        calibrate(graph, bad, [x], quant_spec(graph, 2, 8))
    with pytest.raises(CalibrationError, match=name):
        train_graph(graph, bad, x, np.zeros((2, 3, 6, 6), np.float32), config=TrainConfig(
            steps=1, loss_fn=lambda out, y: ((out - y) ** 2).mean()))


def test_weights_at_the_limit_quantize_to_finite_values(model):
    graph, params = model
    (name,) = params
    kernel = np.full(np.shape(params[name]["kernel"]), MAX_ABS_WEIGHT, np.float32)
    kernel.flat[0] = -MAX_ABS_WEIGHT
    check_weights({name: {"kernel": kernel}})
    import jax.numpy as jnp

    from npujax.numerics import IntFormat
    from npujax.quantize.quantizers.base import quantize_weight

    for bits in (2, 3):  # int2/int3 turned values near the float32 maximum into -inf
        q = np.asarray(quantize_weight(jnp.asarray(kernel), IntFormat(bits), 0))
        assert np.all(np.isfinite(q))

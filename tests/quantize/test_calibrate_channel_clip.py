"""calibrate warns when a clipping observer's per-tensor range saturates whole channels."""

import warnings

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from npujax.calib import percentile_observer
from npujax.frontends.onnx import from_onnx
from npujax.quantize.calibrate import ChannelClipWarning, calibrate
from npujax.quantize.spec import quant_spec


@pytest.fixture(scope="module")
def gemm():
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array((rng.normal(size=(512, 8)) / 8).astype(np.float32), "w")
    g = helper.make_graph(
        [helper.make_node("Gemm", ["x", "w"], ["y"], name="fc")],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [64, 512])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [64, 8])],
        [w],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    graph, params = from_onnx(m.SerializeToString(), {"x": (64, 512)})
    x = rng.normal(size=(64, 512)).astype(np.float32)
    x[:, 5] = 8.0  # one outlier channel: 0.2 % of the values, beyond the 99th percentile
    return graph, params, quant_spec(graph), x


def _warnings(gemm, observer):
    graph, params, q, x = gemm
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        calibrate(graph, params, [x[:32], x[32:]], q, observer=observer)
    return [str(r.message) for r in rec if issubclass(r.category, ChannelClipWarning)]


def test_saturated_channel_is_named(gemm):
    (msg,) = _warnings(gemm, lambda: percentile_observer(99.0))
    assert "fc (input: 1 channel(s), e.g. channel 5 with mean 8 outside" in msg, msg
    assert "observer='minmax'" in msg


def test_minmax_never_warns(gemm):
    assert _warnings(gemm, "minmax") == []

"""Fake-quant models the biases a QDQ file stores (int32 on the accumulator's grid), so the
accuracy ``npujax quantize`` reports is the accuracy of the file it writes.

The mechanism (found on PP-OCR cls, docs/results/quantization.md): the file holds each bias as
``round(b / (s_x * s_w))`` int32 codes; fake-quant with the float bias differs by up to half a
code per output channel, enough to move an example near a decision boundary (PP-OCR cls: 99.50 %
in fake-quant, 99.00 % for its file in onnxruntime, one line of 200).
"""

import jax
import numpy as np
import pytest

from npujax.backends.onnx_export import exported_biases, to_onnx
from npujax.ir.execute import execute
from npujax.quantize.calibrate import calibrate
from npujax.quantize.ptq import deployed_biases
from npujax.quantize.spec import quant_spec
from tests.quantize.ptq_graphs import linear, separable_net


@pytest.fixture(scope="module")
def net():
    rng = np.random.default_rng(0)
    graph, params = separable_net(rng)
    for k in params:  # biases off the int32 grid, large enough to matter at 4 bits
        params[k]["bias"] = rng.normal(0, 0.3, params[k]["bias"].shape).astype(np.float32)
    x = rng.normal(size=(32, 8, 8, 3)).astype(np.float32)
    quant = quant_spec(graph, 4, 4)
    qstate = calibrate(graph, params, [x], quant)
    return graph, params, quant, qstate, x


def _ort(model, x):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.intra_op_num_threads = 1
    s = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return s.run(None, {"x": x})[0]


def test_deployed_biases_are_the_files_and_make_fake_quant_compute_it(net):
    graph, params, quant, qstate, x = net
    model = to_onnx(graph, params, quant, qstate, requantize_outputs=False)
    written = exported_biases(model)
    assert set(written) == {"c1", "dw", "pw", "fc"}  # depthwise and dense too
    deployed = deployed_biases(graph, params, quant, qstate)
    for k, b in written.items():
        np.testing.assert_array_equal(np.asarray(deployed[k]["bias"]), b)  # bit for bit
        assert not np.array_equal(np.asarray(params[k]["bias"]), b)  # off-grid floats moved
    y_file = _ort(model, x)
    run = jax.jit(lambda p: execute(graph, p, x, quant=quant, qstate=qstate))
    y_deployed, y_float_bias = np.asarray(run(deployed)), np.asarray(run(params))
    near = np.abs(y_file - y_deployed).max()
    assert near < 1e-5, near  # float summation order only
    assert np.abs(y_file - y_float_bias).max() > 100 * near  # the mechanism: float biases
    # already on the grid they stay there (the workflow applies them after every step)
    again = deployed_biases(graph, deployed, quant, qstate)
    for k in written:
        np.testing.assert_array_equal(np.asarray(again[k]["bias"]),
                                      np.asarray(deployed[k]["bias"]))


def test_quantize_model_reports_the_model_it_writes():
    """The pipeline's params are the file's (without deployed_biases its fake-quant accuracy
    was measured with float biases), so onnxruntime computes what it reports."""
    from npujax.workflows.quantize import QuantizeConfig, quantize_model

    rng = np.random.default_rng(1)
    graph = linear(6, 4)
    params = {"fc": {"kernel": rng.normal(size=(6, 4)).astype(np.float32),
                     "bias": rng.normal(0, 0.3, 4).astype(np.float32)}}
    x = rng.normal(size=(16, 6)).astype(np.float32)
    y = np.asarray(execute(graph, params, x)).argmax(-1)
    r = quantize_model(graph, params, quant_spec(graph, 4, 4), x, x, y, QuantizeConfig(
        npu=None, ort_examples=16, sensitivity_examples=16, batch_size=16))
    written = exported_biases(r.onnx)
    assert set(written) == {"fc"}
    np.testing.assert_array_equal(np.asarray(r.params["fc"]["bias"]), written["fc"])
    assert max(v["max_abs_diff"] for v in r.ort.values()) < 1e-5

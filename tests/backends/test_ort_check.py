"""run_onnxruntime_levels on models with a fixed batch: an export that folds its traced batch
(PP-OCR cls imported at batch 1) declares ``x: [1, ...]``, and ``npujax quantize``'s onnxruntime
check fed it the whole evaluation batch, failing after all the work (onnxruntime's
INVALID_ARGUMENT 'Got: 200 Expected: 1')."""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from npujax.backends.ort_check import ORT_LEVELS, run_onnxruntime_levels
from npujax.errors import ConfigError

pytest.importorskip("onnxruntime")

W = np.arange(6, dtype=np.float32).reshape(3, 2) / 7 - 0.3


def _model(batch) -> bytes:
    """y = Relu(x @ W), x: [batch, 3] (an int batch is fixed, a string dynamic)."""
    g = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Relu", ["h"], ["y"])],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 2])],
        [numpy_helper.from_array(W, "w")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.checker.check_model(m)
    return m.SerializeToString()


X = np.random.default_rng(0).normal(size=(6, 3)).astype(np.float32)
WANT = np.maximum(X @ W, 0)


@pytest.mark.parametrize("batch", [1, 2, "batch"])
def test_every_level_runs_all_examples_at_a_fixed_or_dynamic_batch(batch):
    out = run_onnxruntime_levels(_model(batch), {"x": X})
    assert list(out) == list(ORT_LEVELS)
    for ys in out.values():
        assert ys[0].shape == (6, 2)
        np.testing.assert_allclose(ys[0], WANT, rtol=1e-6, atol=1e-6)


def test_a_fixed_batch_that_does_not_divide_the_examples_is_a_clear_error():
    with pytest.raises(ConfigError, match="fixed batch of \\[4\\].*6 examples"):
        run_onnxruntime_levels(_model(4), {"x": X})


def test_one_rounding_tie_passes_and_an_export_fault_does_not():
    """quantize's check: one example beyond the bound (a flipped code at a rounding tie) is
    allowed per 100 (at least one); a fault that moves every example is not."""
    from npujax.workflows.quantize import ORT_OUTLIERS, ort_outliers

    rng = np.random.default_rng(0)
    want = rng.random((64, 2)).astype(np.float32)
    tie = want.copy()
    tie[5, 1] += 0.036  # PP-OCR cls's softmax: one example of 64
    assert ort_outliers(tie, want, 0.02) == (1, 1, pytest.approx(0.036, rel=1e-5))
    assert ort_outliers(want[:, ::-1], want, 0.02)[0] > 50  # a swapped layout: every example
    allowed = ort_outliers(want, want, 0.0)[1]
    assert allowed == 1 and ort_outliers(np.zeros((500, 1)), np.zeros((500, 1)), 0.0)[1] == \
        int(ORT_OUTLIERS * 500)
    nan = want.copy()
    nan[0, 0] = np.nan  # a NaN is beyond any bound
    assert ort_outliers(nan, want, 1.0)[0] == 1

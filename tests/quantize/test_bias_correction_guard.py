"""The bias-correction guard keeps the uncorrected biases where the correction lowers the
output SQNR on the calibration data, and the corrected ones where it raises it."""

import dataclasses

import numpy as np

from npujax.ir.graph import Graph, TensorType
from npujax.quantize.calibrate import calibrate
from npujax.quantize.ptq import guarded_bias_correction, ptq
from npujax.quantize.spec import quant_spec
from tests.quantize.ptq_graphs import F32, gemm


def _two_layers():
    """``fc2(ReLU(fc1(x)))``, 1 -> 1 -> 1, identity weights, zero biases."""
    g = Graph((gemm("fc1", "x", "h", relu=True), gemm("fc2", "h", "y")), ("x",), ("y",),
              {t: TensorType((1, 1), F32) for t in ("x", "h", "y")})
    one = {"kernel": np.ones((1, 1), np.float32), "bias": np.zeros(1, np.float32)}
    return g, {"fc1": dict(one), "fc2": dict(one)}


def test_guard_keeps_the_uncorrected_biases_where_the_correction_hurts():
    # fc1's input is clipped to [-4, 4]: the examples at -10 read -4, a +6 shift that the ReLU
    # zeroes anyway. The correction removes the mean shift (+3) from fc1's bias, which moves
    # the live examples (2 -> -1) under the ReLU; fc2's correction then adds back their mean.
    # The uncorrected model is exact up to rounding at the output; the corrected one is not.
    g, params = _two_layers()
    q = quant_spec(g, 8, 8)
    q["fc1"] = dataclasses.replace(q["fc1"], act_range=(-4.0, 4.0))
    x = np.array([[-10.0], [2.0]] * 4, np.float32)
    batches = [x[:4], x[4:]]
    qstate = calibrate(g, params, batches, q)
    kept, check = guarded_bias_correction(g, params, q, batches, qstate, mode="model")
    assert check.sqnr_db_corrected < check.sqnr_db_uncorrected - 10, check
    assert not check.kept and kept is params
    assert "kept the uncorrected" in check.describe()
    # ptq() guards by default
    guarded, _ = ptq(g, params, batches, q)
    assert np.array_equal(guarded["fc1"]["bias"], params["fc1"]["bias"])


def test_guard_keeps_a_correction_that_helps():
    # the same model without the clip (min-max ranges): only the input codes' rounding shifts
    # fc1's output; removing the mean shift lowers the error at the output
    g, params = _two_layers()
    q = quant_spec(g, 4, 4)
    x = np.linspace(0.3, 2.0, 16, dtype=np.float32)[:, None]
    qstate = calibrate(g, params, [x], q)
    kept, check = guarded_bias_correction(g, params, q, [x], qstate, mode="model")
    assert check.kept and check.sqnr_db_corrected >= check.sqnr_db_uncorrected, check
    assert float(kept["fc1"]["bias"][0]) != 0.0

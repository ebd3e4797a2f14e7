"""The real PP-OCRv4 text recogniser (a PP-LCNetV3 conv backbone and two SVTR transformer
blocks, issue 12's pretrained transformer): strict import equal to onnxruntime, its LayerNorms
fused, no CPU fallback on the transformer edge preset, and a W8A8 QDQ export whose Q/DQ pairs
equal npujax's fake-quant bit for bit and whose per-timestep argmax agrees with it."""

from __future__ import annotations

import collections

import jax
import numpy as np
import onnxruntime as ort
import pytest

from npujax.backends.onnx_export import to_onnx
from npujax.backends.ort_check import qdq_pair_mismatches
from npujax.ir.execute import execute
from npujax.plan import lower
from npujax.quantize.calibrate import calibrate
from npujax.quantize.spec import SOFTMAX_RANGE, quant_spec
from tests.onnx_models import text_images

pytestmark = pytest.mark.integration


def _ort_lines(model, x: np.ndarray) -> np.ndarray:
    """onnxruntime on each line of ``x`` (the model keeps its imported batch of 1), in one
    session (as :func:`tests.onnx_models.ort_run` sets it up; building one takes longer than a
    line's run)."""
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 2
    src = model if isinstance(model, bytes) else str(model)
    sess = ort.InferenceSession(src, opts, providers=["CPUExecutionProvider"])
    return np.concatenate([sess.run(None, {"x": xi[None]})[0] for xi in x])


def test_rec_import_matches_onnxruntime(ppocr_rec):
    path, graph, params = ppocr_rec
    x = text_images(48, 320, 2, seed=11, fit=True)
    y = np.asarray(jax.jit(lambda p, x: execute(graph, p, x))(params, x))
    ref = _ort_lines(path, x)
    assert y.shape == ref.shape == (2, 40, 6625)  # 40 timesteps x 6,625 CTC classes
    # float32 after ~340 nodes: measured max abs error 2.3e-5 of the max probability.
    for yi, ri in zip(y, ref):
        assert np.abs(yi - ri).max() <= 1e-4 * np.abs(ri).max()
    np.testing.assert_array_equal(y.argmax(-1), ref.argmax(-1))
    assert (ref.argmax(-1) != 0).sum() >= 10  # the lines are read: not all CTC blank


def test_rec_layernorms_fused_and_no_fallback_on_transformer_preset(ppocr_rec):
    _, graph, _ = ppocr_rec
    ops = collections.Counter(n.op for n in graph.nodes)
    # 2 blocks x 2 pre-norms + the final norm, each from ReduceMean/Sub/Pow/ReduceMean/Add/Sqrt/Div
    assert ops["LayerNormalization"] == 5
    assert ops["ReduceMean"] == ops["Pow"] == ops["Sqrt"] == ops["CpuFallback"] == 0
    assert ops["MatMul"] == 4 and ops["Softmax"] == 3  # Q K^T, P V per block; attention + head
    s = lower(graph, "edge_transformer_16x16")
    assert [r.name for r in s.layers if r.device != "npu"] == []
    assert {"LayerNormalization", "Softmax", "MatMul"} <= {r.op for r in s.layers}


def test_rec_qdq_export_argmax_matches_fake_quant(ppocr_rec):
    _, graph, params = ppocr_rec
    q = quant_spec(graph)  # W8A8: every Conv/Gemm and attention's two-activation MatMuls
    attention = [n for n in q if graph.node(n).op == "MatMul"]
    assert len(attention) == 4
    assert sum(q[n].act_range == SOFTMAX_RANGE for n in attention) == 2  # P of P V: [0, 1]
    qstate = calibrate(graph, params, [text_images(48, 320, 4, seed=3, fit=True)], q)
    x = text_images(48, 320, 3, seed=11, fit=True)
    yq = np.asarray(jax.jit(lambda p, x: execute(graph, p, x, quant=q, qstate=qstate))(params, x))
    # Float biases and no output requantization: the fake-quant model execute computes.
    model = to_onnx(graph, params, q, qstate, int32_bias=False,
                    requantize_outputs=False).SerializeToString()
    # The semantics, teacher-forced: every Q/DQ pair that onnxruntime runs, fed its own input
    # tensor, returns fake-quant's values bit for bit (measured: 0 of 5.5 M on this line; the
    # weights' DequantizeLinear: 0 of 2.7 M, experiments/transformer_quant/ppocr_rec_qdq_gap.py).
    # One pair per layer's input and per attention MatMul's second operand.
    check = qdq_pair_mismatches(model, graph, q, qstate, {"x": x[:1]})
    assert len(check.pairs) == len(q) + len(attention)
    assert check.values > 5_000_000 and check.mismatches == 0, (check.first_mismatch,
                                                                check.mismatches)
    yo = _ort_lines(model, x)
    assert yo.shape == yq.shape == (3, 40, 6625)
    # End to end the codes drift apart: one float-rounding flip (1 code, at a rounding boundary)
    # spreads to thousands of codes 20 layers on, so a few timesteps move. Measured on 36
    # held-out lines (1,440 timesteps): onnxruntime vs fake-quant 97.8 % (default graph
    # optimizations), 98.3 % (none), and fake-quant vs itself compiled for a vmapped batch of 3
    # instead of 1, no export involved: 97.4 %. Issue 12's 99 % is below that noise floor, so
    # the bound (these 3 lines: 120/120) leaves room for other CPUs' kernels; a wrong grid,
    # axis or operand order falls far below it (float vs fake-quant is ~90 %), and the
    # bit-exact check above is the test of the export's semantics.
    assert (yo.argmax(-1) == yq.argmax(-1)).mean() >= 0.95
    # not a collapsed model (entropy calibration read every timestep as blank, 100 % agreement,
    # before exact zeros were binned on the positive side)
    assert (yq.argmax(-1) != 0).sum() >= 10

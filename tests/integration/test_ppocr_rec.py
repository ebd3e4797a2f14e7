"""The real PP-OCRv4 text recogniser (a PP-LCNetV3 conv backbone and two SVTR transformer
blocks, issue 12's pretrained transformer): strict import equal to onnxruntime, its LayerNorms
fused, no CPU fallback on the transformer edge preset, and a W8A8 QDQ export whose Q/DQ pairs
equal npujax's fake-quant bit for bit and whose per-timestep argmax agrees with it."""

from __future__ import annotations

import collections

import jax
import numpy as np
import onnx
import onnxruntime as ort
import pytest

from npujax.backends.onnx_export import to_onnx
from npujax.plan import lower
from npujax.quantize.calibrate import calibrate
from npujax.quantize.execute import execute, layer_state
from npujax.quantize.spec import SOFTMAX_RANGE, quant_spec
from tests.onnx_models import ort_run, text_images

pytestmark = pytest.mark.integration


def _ort_lines(model, x: np.ndarray) -> np.ndarray:
    """onnxruntime on each line of ``x`` (the model keeps its imported batch of 1)."""
    return np.concatenate([ort_run(model, {"x": xi[None]})[0] for xi in x])


def _quantizer_mismatches(graph, q, qstate, model: bytes, x: np.ndarray) -> tuple[int, int]:
    """Teacher-forced check of every exported ``QuantizeLinear -> DequantizeLinear`` pair:
    npujax's fake-quant (the layer's own quantizer, as ``execute`` calls it) applied to the tensor
    that onnxruntime (graph optimizations off) feeds that pair, against what the pair returns.
    Returns ``(values that differ, values compared)``; the float values must be bit-identical
    (same grid, zero point, rounding half to even, saturation), whatever the upstream float
    rounding did."""
    m = onnx.load_from_string(model)
    dq_of = {n.input[0]: n for n in m.graph.node if n.op_type == "DequantizeLinear"}
    pairs = []
    for n in m.graph.node:
        layer, _, what = n.name.rpartition("/")
        if n.op_type == "QuantizeLinear" and what in ("act_quant", "operand_quant"):
            pairs.append((layer, what, n.input[0], dq_of[n.output[0]].output[0]))
    m.graph.output.extend(onnx.ValueInfoProto(name=t) for _, _, *ts in pairs for t in ts)
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(m.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    got = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, {"x": x})))

    def fake_quant_all(ins):  # one jitted program (op by op, 55 shapes compile for minutes)
        out = []
        for (layer, what, *_), v in zip(pairs, ins):
            lq, state = q[layer], layer_state(q, qstate, layer)
            quantizer = lq.quantizer
            fq = quantizer.quantize_input if what == "act_quant" else quantizer.quantize_operand
            out.append(fq(graph.node(layer), lq, v, state))
        return out

    ys = jax.jit(fake_quant_all)([got[t_in] for _, _, t_in, _ in pairs])
    bad = sum(int((np.asarray(y) != got[t_dq]).sum()) for y, (*_, t_dq) in zip(ys, pairs))
    total = sum(int(np.size(y)) for y in ys)
    assert len(pairs) == len(q) + sum(graph.node(n).op == "MatMul" for n in q)
    return bad, total


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
    # tensor, returns fake-quant's values bit for bit (measured: 0 of 5.5 M on this line).
    bad, total = _quantizer_mismatches(graph, q, qstate, model, x[:1])
    assert total > 5_000_000 and bad == 0, (bad, total)
    yo = _ort_lines(model, x)
    assert yo.shape == yq.shape == (3, 40, 6625)
    # End to end the codes drift apart: one float-rounding flip (1 code, at a rounding boundary)
    # spreads to thousands of codes 20 layers on, so a few timesteps move. Measured on 12
    # held-out lines (480 timesteps): onnxruntime vs fake-quant 470/480 (default graph
    # optimizations), 474/480 (none), and fake-quant vs itself compiled for a vmapped batch of 3
    # instead of 1, no export involved: 466/480. Issue 12's 99 % is inside that noise floor, so
    # the bound (these 3 lines: 120/120) leaves room for other CPUs' kernels; a wrong grid,
    # axis or operand order falls far below it (float vs fake-quant is ~90 %), and the
    # bit-exact check above is the test of the export's semantics.
    assert (yo.argmax(-1) == yq.argmax(-1)).mean() >= 0.95
    # not a collapsed model (entropy calibration reads every timestep as blank: 100 % agreement)
    assert (yq.argmax(-1) != 0).sum() >= 10

"""ONNX LSTM and GRU (issue 28, item 2): imported strictly, equal to onnxruntime for every
attribute that changes the numbers, refused where they are not imported, costed by their MACs."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

from npujax.errors import GraphError, UnsupportedOpError
from npujax.frontends.onnx import from_onnx
from npujax.ir.execute import execute
from npujax.plan.workload import workloads
from tests.helpers import assert_close
from tests.onnx_models import ort_run

S, B, IN, H = 5, 3, 3, 4  # steps, batch, input, hidden
GATES = {"LSTM": 4, "GRU": 3}
OUTS = {"LSTM": ["Y", "Y_h", "Y_c"], "GRU": ["Y", "Y_h"]}


def rnn(op, direction="forward", *, layout=0, bias=True, lens=None, states="const",
        peephole=False, seed=0, **attrs) -> tuple[onnx.ModelProto, dict]:
    """An ``op`` node with its weights as initializers; ``states``: None, ``"const"`` or
    ``"input"`` (the initial states fed at run time); ``lens``: constant sequence lengths, or
    ``"input"``. Returns the model and its feeds."""
    rng = np.random.default_rng(seed)
    dirs, g = 2 if direction == "bidirectional" else 1, GATES[op]
    f32 = lambda *s: (rng.normal(size=s) * 0.5).astype(np.float32)  # noqa: E731
    x_shape = (B, S, IN) if layout else (S, B, IN)
    st_shape = (B, dirs, H) if layout else (dirs, B, H)
    inits = [nh.from_array(f32(dirs, g * H, IN), "W"), nh.from_array(f32(dirs, g * H, H), "R")]
    ins, inputs = ["x", "W", "R"], [h.make_tensor_value_info("x", T.FLOAT, x_shape)]
    feeds = {"x": f32(*x_shape)}
    ins.append("B" if bias else "")
    if bias:
        inits.append(nh.from_array(f32(dirs, 2 * g * H), "B"))
    if lens is None:
        ins.append("")
    elif isinstance(lens, str):
        ins.append("lens")
        inputs.append(h.make_tensor_value_info("lens", T.INT32, [B]))
        feeds["lens"] = np.asarray([S, 2, 1], np.int32)[:B]
    else:
        ins.append("lens")
        inits.append(nh.from_array(np.asarray(lens, np.int32), "lens"))
    for k in ("h0", "c0")[:GATES[op] - 2]:
        if states is None:
            ins.append("")
        elif states == "input":
            ins.append(k)
            inputs.append(h.make_tensor_value_info(k, T.FLOAT, st_shape))
            feeds[k] = f32(*st_shape)
        else:
            ins.append(k)
            inits.append(nh.from_array(f32(*st_shape), k))
    if peephole:
        ins.append("P")
        inits.append(nh.from_array(f32(dirs, 3 * H), "P"))
    while ins and not ins[-1]:
        ins.pop()
    node = h.make_node(op, ins, OUTS[op], hidden_size=H, direction=direction, layout=layout,
                       **attrs)
    graph = h.make_graph([node], "rnn", inputs,
                         [h.make_tensor_value_info(o, T.FLOAT, None) for o in OUTS[op]], inits)
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 14)]), feeds


def ours(model, feeds):
    graph, params = from_onnx(model)  # strict: an unsupported op or feature raises
    assert [n.op for n in graph.nodes] == [model.graph.node[0].op_type]
    ys = execute(graph, params, [feeds[t] for t in graph.inputs])
    return [np.asarray(y) for y in ys]


CASES = [
    ("LSTM", "forward", dict()),
    ("LSTM", "reverse", dict(bias=False, states=None)),
    ("LSTM", "forward", dict(input_forget=1, peephole=True)),
    ("LSTM", "bidirectional", dict(lens=[S, 2, 0], peephole=True)),
    ("LSTM", "bidirectional", dict(lens="input", states="input")),
    ("GRU", "forward", dict(linear_before_reset=1)),
    ("GRU", "reverse", dict(lens=[1, S, 3])),
    ("GRU", "bidirectional", dict(states="input", bias=False)),
    ("GRU", "bidirectional", dict(lens="input", linear_before_reset=1)),
]


@pytest.mark.parametrize("op, direction, kw", CASES)
def test_equal_to_onnxruntime(op, direction, kw):
    model, feeds = rnn(op, direction, **kw)
    for y, ref in zip(ours(model, feeds), ort_run(model.SerializeToString(), feeds), strict=True):
        assert y.shape == ref.shape
        assert_close(y, ref, rtol=1e-5, atol=2e-6)


@pytest.mark.parametrize("op", ["LSTM", "GRU"])
def test_batch_major_layout_is_the_time_major_one_transposed(op):
    """layout=1 (onnxruntime runs only layout 0): the same numbers, batch first, for the
    input, the initial states and every output."""
    model, feeds = rnn(op, "bidirectional", lens=[S, 2, 1], states="input")
    refs = ort_run(model.SerializeToString(), feeds)
    model1, _ = rnn(op, "bidirectional", layout=1, lens=[S, 2, 1], states="input")
    ys = ours(model1, {"x": feeds["x"].transpose(1, 0, 2),
                       **{k: v.transpose(1, 0, 2) for k, v in feeds.items() if k != "x"}})
    assert_close(ys[0], refs[0].transpose(2, 0, 1, 3), rtol=1e-5, atol=2e-6)
    for y, ref in zip(ys[1:], refs[1:], strict=True):
        assert_close(y, ref.transpose(1, 0, 2), rtol=1e-5, atol=2e-6)


@pytest.mark.parametrize("attrs, match", [
    (dict(activations=["Relu", "Tanh", "Tanh"]), "activations"),
    (dict(clip=3.0), "clip"),
])
def test_non_default_features_are_refused(attrs, match):
    model, _ = rnn("LSTM", **attrs)
    with pytest.raises(UnsupportedOpError, match=match):
        from_onnx(model)


def test_sequence_lengths_beyond_the_sequence_are_refused():
    with pytest.raises(GraphError, match="sequence_lens"):
        from_onnx(rnn("GRU", lens=[S + 1, 1, 1])[0])


def test_default_activations_spelled_out_are_accepted():
    model, feeds = rnn("GRU", "bidirectional", activations=["Sigmoid", "Tanh"] * 2)
    (y, _), ref = ours(model, feeds), ort_run(model.SerializeToString(), feeds)
    assert_close(y, ref[0], rtol=1e-5, atol=2e-6)


@pytest.mark.parametrize("op", ["LSTM", "GRU"])
def test_costed_by_macs_on_the_host_and_the_array(op, edge_spec):
    """gates x (input + hidden) x hidden x seq x directions x batch MACs; on the host CPU
    2 x MACs operations (not one per output element); on an NPU that lists the op, a GEMM."""
    graph, _ = from_onnx(rnn(op, "bidirectional")[0])
    macs = GATES[op] * (IN + H) * H * S * 2 * B
    (cpu,) = workloads(graph, edge_spec)
    assert cpu.device == "cpu" and cpu.macs == macs and cpu.cpu_ops == 2 * macs
    npu_spec = edge_spec.with_fields({"ops.supported": (*edge_spec.ops.supported, op)})
    (npu,) = workloads(graph, npu_spec)
    assert npu.device == "npu" and npu.kind == "gemm" and npu.macs == macs
    assert (npu.M, npu.groups) == (S * B, 2) and npu.K >= IN + H and npu.N >= GATES[op] * H


def test_exported_model_runs_in_onnxruntime():
    import npujax

    model, feeds = rnn("LSTM", "bidirectional", lens="input", states="input", peephole=True)
    exported = npujax.to_onnx(*from_onnx(model))
    for y, ref in zip(ort_run(exported.SerializeToString(), feeds),
                      ort_run(model.SerializeToString(), feeds), strict=True):
        np.testing.assert_array_equal(y, ref)

"""Control flow and integer logic in imported ONNX models (issue 28, item 2): an ``If`` whose
condition is known at import is inlined (its branch's own initializers and the outer tensors it
reads), and comparisons keep ONNX's integer semantics, vs onnxruntime."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

from npujax.errors import UnsupportedOpError
from npujax.frontends.onnx import from_onnx
from npujax.ir.execute import execute
from tests.helpers import assert_close
from tests.onnx_models import ort_run

COMPARISONS = ["Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual"]


def _vi(name, shape, dtype=T.FLOAT):
    return h.make_tensor_value_info(name, dtype, shape)


def _model(nodes, inputs, outputs, inits=()) -> onnx.ModelProto:
    g = h.make_graph(nodes, "m", inputs, outputs, list(inits))
    return h.make_model(g, opset_imports=[h.make_opsetid("", 17)])


def _branch(name, op, value, extra=(), width=4):
    """A branch ``y = op(x, k) [then extra nodes]`` with its own initializer ``k`` (named as an
    outer initializer too) that reads the outer graph's run-time ``x``."""
    k = nh.from_array(np.full((width,), value, np.float32), "k")
    nodes = [h.make_node(op, ["x", "k"], [f"{name}_y"]), *extra]
    out = extra[-1].output[0] if extra else f"{name}_y"
    return h.make_graph(nodes, name, [], [_vi(out, [2, width])], [k])


def _if_model(width: int) -> onnx.ModelProto:
    """``cond = Shape(x)[1] == 4`` (known once the input shape is), then ``x * 3`` (and a nested
    If on a constant) else ``x + 5``; then ``+ k`` with the outer ``k``."""
    inner = h.make_node("If", ["true"], ["inner_y"],
                        then_branch=_branch("inner_then", "Sub", 1.0, width=width),
                        else_branch=_branch("inner_else", "Add", 100.0, width=width))
    add = h.make_node("Add", ["then_y", "inner_y"], ["then_sum"])
    nodes = [h.make_node("Shape", ["x"], ["s"]),
             h.make_node("Gather", ["s", "one"], ["w"], axis=0),
             h.make_node("Equal", ["w", "four"], ["cond"]),
             h.make_node("If", ["cond"], ["b"],
                         then_branch=_branch("then", "Mul", 3.0, [inner, add], width=width),
                         else_branch=_branch("else", "Add", 5.0, width=width)),
             h.make_node("Add", ["b", "k"], ["y"])]
    inits = [nh.from_array(np.asarray(1, np.int64), "one"),
             nh.from_array(np.asarray(4, np.int64), "four"),
             nh.from_array(np.asarray(True), "true"),
             nh.from_array(np.full((width,), 0.25, np.float32), "k")]
    return _model(nodes, [_vi("x", [2, width])], [_vi("y", None)], inits)


@pytest.mark.parametrize("width", [4, 3])
def test_if_on_a_condition_known_at_import_is_inlined(width):
    m = _if_model(width)
    graph, params = from_onnx(m)  # strict
    assert "If" not in {n.op for n in graph.nodes} and "CpuFallback" not in {
        n.op for n in graph.nodes}
    x = np.random.default_rng(0).normal(size=(2, width)).astype(np.float32)
    (ref,) = ort_run(m.SerializeToString(), {"x": x})
    assert_close(execute(graph, params, x), ref)
    if width == 4:  # inlined nodes carry the If's name
        assert any(n.name.startswith("If_3/") for n in graph.nodes)


def test_if_on_a_run_time_condition_is_refused():
    m = _model([h.make_node("ReduceSum", ["x"], ["s"], keepdims=0),
                h.make_node("Greater", ["s", "zero"], ["cond"]),
                h.make_node("If", ["cond"], ["y"], then_branch=_branch("t", "Mul", 2.0),
                            else_branch=_branch("e", "Add", 1.0))],
               [_vi("x", [2, 4])], [_vi("y", None)],
               [nh.from_array(np.asarray(0.0, np.float32), "zero")])
    with pytest.raises(UnsupportedOpError, match="'If'"):
        from_onnx(m)


@pytest.mark.parametrize("dtype", [T.INT32, T.INT64])
def test_integer_comparisons_are_exact(dtype):
    """2**24 + 1 and 2**24 are equal as float32, not as integers (onnxruntime: not)."""
    np_dtype = onnx.helper.tensor_dtype_to_np_dtype(dtype)
    a = np.asarray([2**24 + 1, -7, 5, 2**31 - 1, -2**31, 0], np_dtype)
    b = np.asarray([2**24, -7, 6, 2**31 - 2, -2**31 + 1, 0], np_dtype)
    nodes = [h.make_node(op, ["a", "b"], [op]) for op in COMPARISONS]
    nodes += [h.make_node("Equal", ["a", "c"], ["EqualConst"]),  # a run-time vs a constant
              h.make_node("Where", ["Less", "x", "zero"], ["masked"])]  # used as a mask
    m = _model(nodes, [_vi("a", [6], dtype), _vi("b", [6], dtype), _vi("x", [6])],
               [_vi(o, None, T.BOOL) for o in [*COMPARISONS, "EqualConst"]]
               + [_vi("masked", None)],
               [nh.from_array(np.asarray([5], np_dtype), "c"),
                nh.from_array(np.asarray(0.0, np.float32), "zero")])
    graph, params = from_onnx(m)
    x = np.arange(6, dtype=np.float32)
    ys = execute(graph, params, [a, b, x])
    refs = ort_run(m.SerializeToString(), {"a": a, "b": b, "x": x})
    for y, ref in zip(ys, refs, strict=True):
        assert np.asarray(y).dtype == ref.dtype
        np.testing.assert_array_equal(np.asarray(y), ref)
    assert not np.asarray(ys[0])[0]  # (2**24 + 1 == 2**24 is false)


def test_an_int64_constant_jax_cannot_hold_is_refused():
    m = _model([h.make_node("Less", ["a", "c"], ["y"])], [_vi("a", [2], T.INT64)],
               [_vi("y", None, T.BOOL)], [nh.from_array(np.asarray([2**40], np.int64), "c")])
    with pytest.raises(UnsupportedOpError, match="'c'.*32 bits"):
        from_onnx(m)

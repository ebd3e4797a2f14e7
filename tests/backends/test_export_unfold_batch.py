"""A model imported at batch 1 whose Reshape folds the batch (PaddlePaddle's
``x.reshape([x.shape[0], -1])`` exported as the literal ``[1, C]``, as in PP-OCR cls) exports
with a dynamic batch: the Reshape is rewritten with ONNX's 0 where its leading axis is proved to
be the batch (``unfold_batch``), and left fixed where the batch moved (a Transpose that swaps it
with a size-1 axis, whose rewrite would mix examples)."""

import jax
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from npujax.backends.onnx_export import to_onnx
from npujax.frontends.onnx import from_onnx
from npujax.ir.execute import execute
from npujax.ir.passes import optimize, unfold_batch

ort = pytest.importorskip("onnxruntime")
RNG = np.random.default_rng(0)
W = RNG.normal(size=(4, 3, 3, 3)).astype(np.float32)
F = RNG.normal(size=(4, 2)).astype(np.float32)


def _onnx(path, swap):
    """conv 3x3 (3->4) -> GlobalAveragePool -> [Transpose(1,0,2,3)] -> Reshape [1, 4] -> MatMul."""
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("GlobalAveragePool", ["c"], ["p"])]
    src = "p"
    if swap:  # [1, 4, 1, 1] -> [4, 1, 1, 1] -> transpose back axes 0/2: the batch sits on axis 2
        nodes += [helper.make_node("Transpose", ["p"], ["t"], perm=[2, 1, 0, 3])]
        src = "t"
    nodes += [helper.make_node("Reshape", [src, "s"], ["r"]),
              helper.make_node("MatMul", ["r", "f"], ["y"])]
    g = helper.make_graph(nodes, "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3, 6, 6])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 2])],
                          [numpy_helper.from_array(W, "w"), numpy_helper.from_array(F, "f"),
                           numpy_helper.from_array(np.array([1, 4], np.int64), "s")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, path)
    return optimize(*from_onnx(path, {"x": [1, 3, 6, 6]}))


def test_a_folded_batch_is_unfolded_and_the_file_runs_at_any_batch(tmp_path):
    graph, params = _onnx(tmp_path / "m.onnx", swap=False)
    (reshape,) = [n for n in graph.nodes if n.op == "Reshape"]
    assert reshape.attrs["shape"] == [1, 4]  # folded at import
    new, _ = unfold_batch(graph, params)
    assert [n.attrs["shape"] for n in new.nodes if n.op == "Reshape"] == [[0, 4]]
    model = to_onnx(graph, params, dynamic_batch=True)
    assert model.graph.input[0].type.tensor_type.shape.dim[0].dim_param == "batch"
    assert model.graph.output[0].type.tensor_type.shape.dim[0].dim_param == "batch"
    x = RNG.normal(size=(5, 3, 6, 6)).astype(np.float32)
    got = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]
                               ).run(None, {"x": x})[0]
    want = np.asarray(jax.jit(lambda v: execute(graph, params, v))(x))  # per example (vmap)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_a_reshape_whose_leading_axis_is_not_the_batch_stays_fixed(tmp_path):
    graph, params = _onnx(tmp_path / "m.onnx", swap=True)
    new, _ = unfold_batch(graph, params)
    assert new is graph  # the rewrite would be syntactically possible, but is not proved
    model = to_onnx(graph, params, dynamic_batch=True)
    assert model.graph.input[0].type.tensor_type.shape.dim[0].dim_value == 1

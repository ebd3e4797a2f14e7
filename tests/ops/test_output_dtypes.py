"""Every imported op keeps ONNX's output dtype (issue 28): an einsum of bfloat16 operands
returned float32, the 2 wrong answers left in the onnx backend node suite."""

from __future__ import annotations

import jax
import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

from npujax.frontends.onnx import from_onnx
from npujax.ir.execute import execute


@pytest.mark.parametrize("name", ["test_einsum_batch_matmul_bfloat16",
                                  "test_einsum_transpose_bfloat16"])
def test_bfloat16_einsum_node_cases(name):
    from tests.onnx_claimed import CLAIMED
    from tests.onnx_conformance import node_case, run_case

    assert name in CLAIMED
    run_case(node_case(name))  # dtype and values as onnx's reference


def test_a_float16_graph_keeps_float16_and_matches_onnxruntime():
    ort = pytest.importorskip("onnxruntime")
    w = nh.from_array((np.arange(12).reshape(4, 3) % 5 / 4).astype(np.float16), "w")
    nodes = [h.make_node("MatMul", ["x", "w"], ["m"]), h.make_node("Relu", ["m"], ["r"]),
             h.make_node("Einsum", ["r", "r"], ["e"], equation="bij,bkj->bik"),
             h.make_node("Transpose", ["e"], ["y"], perm=[0, 2, 1])]
    model = h.make_model(h.make_graph(
        nodes, "g", [h.make_tensor_value_info("x", T.FLOAT16, [2, 5, 4])],
        [h.make_tensor_value_info("y", T.FLOAT16, None)], [w]),
        opset_imports=[h.make_opsetid("", 17)])
    x = (np.arange(40).reshape(2, 5, 4) % 7 / 3 - 1).astype(np.float16)
    want = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})[0]
    graph, params = from_onnx(onnx.ModelProto.FromString(model.SerializeToString()))
    assert {t.dtype for t in graph.tensors.values()} == {"float16"}
    got = np.asarray(jax.jit(lambda v: execute(graph, params, v))(x))
    assert got.dtype == want.dtype == np.float16
    np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32), rtol=2e-3,
                               atol=2e-3)

"""Transformer operators (LayerNormalization, RMSNormalization, Gelu, Where, Gather, Expand,
Einsum, activation x activation MatMul, Softmax): import against onnxruntime, export round trip
through onnxruntime, and their cost classes in the NPU model."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from npujax.backends.onnx_export import to_onnx
from npujax.errors import UnsupportedOpError
from npujax.frontends.onnx import from_onnx
from npujax.ir.execute import execute
from npujax.ops.einsum import canonical_equation, einsum_dims
from npujax.plan import workloads
from tests.onnx_models import ort_run

pytestmark = pytest.mark.integration  # onnxruntime sessions

EINSUMS = ("bhqd,bhkd->bhqk", "bhqk,bhkd->bhqd", "...ij,...jk->...ik", "bqhd,bkhd->bhqk",
           "ij,jk")


def _vi(name, dtype=TensorProto.FLOAT, shape=None):
    return helper.make_tensor_value_info(name, dtype, shape)


def _model(nodes, inputs, outputs, inits=(), opset=23):
    m = helper.make_model(helper.make_graph(nodes, "tr", inputs, outputs, list(inits)),
                          opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 10
    return m.SerializeToString()


@pytest.fixture(scope="module")
def case():
    """One ONNX model holding every new operator in the forms transformers use."""
    rng = np.random.default_rng(0)
    f = lambda *s: rng.normal(size=s).astype(np.float32)  # noqa: E731
    feeds = {"x": f(2, 5, 8), "q": f(1, 2, 5, 4), "k": f(1, 2, 5, 4), "ids": np.array(
        [[3, 0, 9, -1, 2]], np.int64), "c": f(3, 4, 4)}
    init = {
        "ln_s": f(8), "ln_b": f(8), "ln2_s": f(8),  # axis -2: [5, 8] normalized, scale bcast
        "table": f(10, 8), "mask": np.tril(np.ones((5, 5), bool)), "neg": np.float32(-1e9),
        "shape": np.array([2, 1, 5, 8], np.int64), "pick": np.array(-1, np.int64),
        "w": f(4, 4),
    }
    n = helper.make_node
    nodes = [
        n("LayerNormalization", ["x", "ln_s", "ln_b"], ["ln"], axis=-1, epsilon=1e-5),
        n("LayerNormalization", ["x", "ln2_s"], ["ln2"], axis=-2, epsilon=1e-3),
        n("RMSNormalization", ["x", "ln_s"], ["rms"], epsilon=1e-6),
        n("Gelu", ["x"], ["gelu"]),
        n("Gelu", ["x"], ["gelu_tanh"], approximate="tanh"),
        n("Gather", ["table", "ids"], ["emb"], axis=0),
        n("Gather", ["x", "pick"], ["last"], axis=1),  # a token pick, negative index
        n("Einsum", ["q", "k"], ["scores"], equation="bhqd,bhkd->bhqk"),
        n("Where", ["mask", "scores", "neg"], ["masked"]),
        n("Softmax", ["masked"], ["probs"], axis=-1),
        n("MatMul", ["probs", "k"], ["ctx"]),  # activation x activation, batched
        n("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
        n("MatMul", ["q", "kt"], ["qk"]),
        n("MatMul", ["c", "w"], ["cw"]),  # by a constant: a Gemm
        n("Einsum", ["c", "c"], ["cc"], equation="...ij,...jk->...ik"),
        n("Expand", ["ln2", "shape"], ["expanded"]),
    ]
    outputs = ["ln", "ln2", "rms", "gelu", "gelu_tanh", "emb", "last", "probs", "ctx", "qk",
               "cw", "cc", "expanded"]
    model = _model(nodes, [_vi("x", shape=[2, 5, 8]), _vi("q", shape=[1, 2, 5, 4]),
                           _vi("k", shape=[1, 2, 5, 4]), _vi("ids", TensorProto.INT64, [1, 5]),
                           _vi("c", shape=[3, 4, 4])],
                   [_vi(o) for o in outputs],
                   [numpy_helper.from_array(v, k) for k, v in init.items()])
    graph, params = from_onnx(model)
    return model, feeds, outputs, graph, params


def test_ops_are_single_nodes(case):
    _, _, _, graph, params = case
    ops = [n.op for n in graph.nodes]
    for op in ("LayerNormalization", "RMSNormalization", "Gelu", "Gather", "Einsum", "Where",
               "Softmax", "MatMul", "Expand", "Gemm"):
        assert op in ops, op
    assert "CpuFallback" not in ops
    ln = graph.node("LayerNormalization_0")
    assert set(params[ln.name]) == {"scale", "bias"} and ln.attrs["axis"] == 2


def test_numerics_match_onnxruntime(case):
    model, feeds, outputs, graph, params = case
    refs = dict(zip(outputs, ort_run(model, feeds)))
    ys = dict(zip(graph.outputs, execute(graph, params, [feeds[i] for i in graph.inputs])))
    errs = {}
    for name in outputs:
        y, want = np.asarray(ys[name]), refs[name]
        assert y.shape == want.shape, name
        errs[name] = float(np.max(np.abs(y - want)))
        np.testing.assert_allclose(y, want, rtol=1e-5, atol=2e-6, err_msg=name)
    assert max(errs.values()) < 1e-5, errs


def test_export_round_trip_in_onnxruntime(case):
    """to_onnx (opset 17: Gelu and RMSNormalization written out) runs in onnxruntime with the
    same outputs as npujax."""
    _, feeds, _, graph, params = case
    exported = to_onnx(graph, params)
    ops = {n.op_type for n in exported.graph.node}
    assert {"LayerNormalization", "Einsum", "Gather", "Where", "Expand"} <= ops
    got = ort_run(exported.SerializeToString(), {i: feeds[i] for i in graph.inputs})
    want = execute(graph, params, [feeds[i] for i in graph.inputs])
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, np.asarray(w), rtol=1e-5, atol=2e-6)


def test_cost_classes(case, edge_spec):
    _, _, _, graph, _ = case
    spec = edge_spec.with_fields({"ops.supported": [
        *edge_spec.ops.supported, "MatMul", "Einsum", "Softmax", "LayerNormalization",
        "RMSNormalization", "Gelu", "Where", "Gather", "Expand", "Transpose"]})
    rows = {}
    for w in workloads(graph, spec):
        rows.setdefault(w.op, w)  # the first of each operator
    for op in ("MatMul", "Einsum"):
        assert rows[op].kind == "gemm" and rows[op].device == "npu"
    scores = rows["Einsum"]
    assert (scores.groups, scores.M, scores.K, scores.N) == (2, 5, 4, 5)
    for op in ("Softmax", "LayerNormalization", "RMSNormalization", "Gelu"):
        assert rows[op].kind == "vector" and rows[op].special_ops > 0, op
    assert rows["Softmax"].special_ops == 2 * 5 * 5 + 2 * 5  # exp per element, 1/x per row
    assert rows["LayerNormalization"].special_ops == 2 * 5  # one rsqrt per row


@pytest.mark.parametrize("eq", EINSUMS)
def test_einsum_equations(eq):
    shapes = {"bhqd,bhkd->bhqk": [(1, 2, 3, 4), (1, 2, 5, 4)],
              "bhqk,bhkd->bhqd": [(1, 2, 3, 5), (1, 2, 5, 4)],
              "...ij,...jk->...ik": [(2, 3, 4), (2, 4, 5)],
              "bqhd,bkhd->bhqk": [(1, 3, 2, 4), (1, 5, 2, 4)], "ij,jk": [(3, 4), (4, 5)]}
    canon = canonical_equation(eq, shapes[eq])
    assert "..." not in canon and "->" in canon
    batch, lf, k, rf = einsum_dims(canon)
    assert len(k) == 1 and len(lf) == 1 and len(rf) == 1


def test_einsum_refusals():
    with pytest.raises(UnsupportedOpError, match="summed within one"):
        einsum_dims("ij,jk->k")
    with pytest.raises(UnsupportedOpError, match="diagonal"):
        einsum_dims("ii,ij->ij")


def test_scalar_graph_input_runs():
    """A rank-0 graph input (onnx's test_einsum_scalar, a one-operand permutation of a float64
    scalar, run here in float32) executes: it has no batch axis to map over (was an IndexError
    in execute)."""
    from npujax.frontends.onnx import from_onnx
    from npujax.ir.execute import execute
    from tests.onnx_conformance import load_case, node_case

    model, (x,), (want,) = load_case(node_case("test_einsum_scalar"))
    graph, params = from_onnx(model)
    assert graph.tensors[graph.inputs[0]].shape == ()
    y = execute(graph, params, np.asarray(x, np.float32))
    assert np.shape(y) == () and float(y) == np.float32(want)

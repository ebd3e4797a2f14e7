"""Fusion of the decomposed LayerNorm (both variance forms) and GELU (erf and tanh) that exporters
write: fires exactly when the subgraph equals the fused op, and the result equals onnxruntime
on the unfused model; near misses stay unfused and exact."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from npujax.frontends.onnx import from_onnx
from npujax.ir.execute import execute
from tests.onnx_models import ort_run

D = 8
RNG = np.random.default_rng(0)
X = RNG.normal(1.0, 2.0, (2, 3, D)).astype(np.float32)


def _layernorm_nodes(variance="centred", axes=(-1,), eps_where="var",
                     scale_shape=(D,), square="Pow", recip=False):
    n = helper.make_node
    nodes = [n("ReduceMean", ["x", "axes"], ["mean"], keepdims=1),
             n("Sub", ["x", "mean"], ["d"])]
    sq = (lambda a, o: n("Pow", [a, "two"], [o])) if square == "Pow" else (
        lambda a, o: n("Mul", [a, a], [o]))
    if variance == "centred":
        nodes += [sq("d", "d2"), n("ReduceMean", ["d2", "axes2"], ["var"], keepdims=1)]
    else:  # E[x^2] - E[x]^2
        nodes += [sq("x", "x2"), n("ReduceMean", ["x2", "axes2"], ["ex2"], keepdims=1),
                  sq("mean", "m2"), n("Sub", ["ex2", "m2"], ["var"])]
    if eps_where == "var":
        nodes += [n("Add", ["var", "eps"], ["ve"]), n("Sqrt", ["ve"], ["std"])]
    else:  # epsilon added to the standard deviation: not LayerNorm
        nodes += [n("Sqrt", ["var"], ["s0"]), n("Add", ["s0", "eps"], ["std"])]
    if recip:
        nodes += [n("Reciprocal", ["std"], ["inv"]), n("Mul", ["d", "inv"], ["norm"])]
    else:
        nodes += [n("Div", ["d", "std"], ["norm"])]
    nodes += [n("Mul", ["norm", "gamma"], ["scaled"]), n("Add", ["scaled", "beta"], ["y"])]
    inits = {"axes": np.array(axes, np.int64), "axes2": np.array([-1], np.int64),
             "two": np.float32(2.0), "eps": np.float32(1e-5),
             "gamma": RNG.normal(size=scale_shape).astype(np.float32),
             "beta": RNG.normal(size=(D,)).astype(np.float32)}
    return nodes, inits


def _gelu_nodes(form="erf", order="x_c_half"):
    n = helper.make_node
    if form == "erf":
        nodes = [n("Div", ["x", "sqrt2"], ["a"]), n("Erf", ["a"], ["f"])]
    else:
        nodes = [n("Pow", ["x", "three"], ["x3"]), n("Mul", ["x3", "c"], ["cx3"]),
                 n("Add", ["x", "cx3"], ["s"]), n("Mul", ["s", "k"], ["t"]),
                 n("Tanh", ["t"], ["f"])]
    nodes.append(n("Add", ["f", "one"], ["c1"]))
    if order == "x_c_half":
        nodes += [n("Mul", ["x", "c1"], ["xc"]), n("Mul", ["xc", "half"], ["y"])]
    else:  # (x * 0.5) * c
        nodes += [n("Mul", ["x", "half"], ["xh"]), n("Mul", ["xh", "c1"], ["y"])]
    inits = {"sqrt2": np.float32(np.sqrt(2.0)), "one": np.float32(1.0),
             "half": np.float32(0.5), "three": np.float32(3.0), "c": np.float32(0.044715),
             "k": np.float32(np.sqrt(2.0 / np.pi))}
    return nodes, inits


def _model(nodes, inits):
    used = {i for nd in nodes for i in nd.input}
    g = helper.make_graph(
        nodes, "fusion", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(X.shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items() if k in used])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])
    m.ir_version = 8
    return m.SerializeToString()


def _check(nodes, inits):
    model = _model(nodes, inits)
    graph, params = from_onnx(model)
    # onnxruntime's own LayerNorm fusion fires on the cube near miss too (its result there is
    # a LayerNorm, not the model), so the reference runs unoptimized
    want = ort_run(model, {"x": X}, disable_optimizations=True)[0]
    got = np.asarray(execute(graph, params, X))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    return Counter(n.op for n in graph.nodes), graph, params


@pytest.mark.parametrize("kw", [
    {}, {"variance": "raw"}, {"square": "Mul"}, {"recip": True},
    {"variance": "raw", "square": "Mul", "recip": True}, {"scale_shape": (1, 1, D)},
])
def test_layernorm_fuses(kw):
    ops, graph, params = _check(*_layernorm_nodes(**kw))
    assert ops == {"LayerNormalization": 1}, ops
    (node,) = graph.nodes
    assert node.attrs["axis"] == 2 and node.attrs["epsilon"] == pytest.approx(1e-5)
    assert set(params[node.name]) == {"scale", "bias"}


@pytest.mark.parametrize("kw, scale_kept", [
    ({"axes": (-2,)}, False),            # mean over another axis than the variance
    ({"exponent": 3.0}, False),          # a cube, not a square
    ({"eps_where": "std"}, False),       # epsilon outside the square root
    ({"scale_shape": (3, D)}, True),     # a scale over a non-normalized axis: affine not fused
])
def test_layernorm_near_misses_stay_exact(kw, scale_kept):
    exponent = kw.pop("exponent", None)
    nodes, inits = _layernorm_nodes(**kw)
    if exponent is not None:
        inits["two"] = np.float32(exponent)
    ops, _, _ = _check(nodes, inits)
    if scale_kept:
        assert ops["LayerNormalization"] == 1 and ops["Mul"] == 1 and ops["Add"] == 1
    else:
        assert "LayerNormalization" not in ops and ops["ReduceMean"] == 2


@pytest.mark.parametrize("form", ["erf", "tanh"])
@pytest.mark.parametrize("order", ["x_c_half", "half_first"])
def test_gelu_fuses(form, order):
    ops, graph, _ = _check(*_gelu_nodes(form, order))
    assert ops == {"Gelu": 1}, ops
    assert graph.nodes[0].attrs["approximate"] == ("none" if form == "erf" else "tanh")


def test_gelu_near_miss_stays_exact():
    nodes, inits = _gelu_nodes("erf")
    inits["sqrt2"] = np.float32(1.5)  # not sqrt(2): some other function
    ops, _, _ = _check(nodes, inits)
    assert "Gelu" not in ops and ops["Erf"] == 1

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


def _gelu_nodes(form="erf", order="x_c_half", cube="pow", const_first=False, erf_pre="div"):
    """GELU as exporters write it. ``const_first``: every constant the first operand of its Mul
    or Add; ``cube``: ``x^3`` as ``Pow(x, 3)``, ``(x*x)*x`` or ``x*(x*x)``; ``erf_pre``: ``x /
    sqrt 2`` as a Div or a Mul by ``1/sqrt 2``; ``order``: how ``x``, 0.5 and ``1 + f`` are
    multiplied (``div2``: ``(x * c) / 2``)."""
    n = helper.make_node

    def op(kind, a, c, out):  # a binary node of a tensor and a constant, in the chosen order
        return n(kind, [c, a] if const_first and kind in ("Mul", "Add") else [a, c], [out])

    if form == "erf":
        nodes = [op("Div", "x", "sqrt2", "a") if erf_pre == "div"
                 else op("Mul", "x", "inv_sqrt2", "a"), n("Erf", ["a"], ["f"])]
    else:
        if cube == "pow":
            nodes = [n("Pow", ["x", "three"], ["x3"])]
        else:
            nodes = [n("Mul", ["x", "x"], ["xx"]),
                     n("Mul", ["xx", "x"] if cube == "xx_x" else ["x", "xx"], ["x3"])]
        nodes += [op("Mul", "x3", "c", "cx3"),
                  n("Add", ["cx3", "x"] if const_first else ["x", "cx3"], ["s"]),
                  op("Mul", "s", "k", "t"), n("Tanh", ["t"], ["f"])]
    nodes.append(op("Add", "f", "one", "c1"))
    if order == "x_c_half":
        nodes += [n("Mul", ["x", "c1"], ["xc"]), op("Mul", "xc", "half", "y")]
    elif order == "div2":
        nodes += [n("Mul", ["c1", "x"], ["xc"]), n("Div", ["xc", "two"], ["y"])]
    else:  # (x * 0.5) * c
        nodes += [op("Mul", "x", "half", "xh"), n("Mul", ["xh", "c1"], ["y"])]
    inits = {"sqrt2": np.float32(np.sqrt(2.0)), "inv_sqrt2": np.float32(1 / np.sqrt(2.0)),
             "one": np.float32(1.0), "half": np.float32(0.5), "two": np.float32(2.0),
             "three": np.float32(3.0), "c": np.float32(0.044715),
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


@pytest.mark.parametrize("form, kw", [
    ("erf", dict(erf_pre="mul", const_first=True)),  # Mul(1/sqrt 2, x): the constant first
    ("erf", dict(erf_pre="mul", order="div2")),
    ("erf", dict(const_first=True, order="half_first")),
    ("tanh", dict(cube="xx_x")),  # x^3 written x*x*x
    ("tanh", dict(cube="x_xx", const_first=True)),
    ("tanh", dict(const_first=True, order="half_first")),
    ("tanh", dict(cube="xx_x", const_first=True, order="div2")),
])
def test_gelu_fuses_up_to_commutativity_and_spelling(form, kw):
    """Every constant first or second in its Mul/Add, x^3 as Pow or x*x*x, a division by a
    constant or a product by its reciprocal: the same GELU, one vector layer."""
    ops, graph, _ = _check(*_gelu_nodes(form, **kw))
    assert ops == {"Gelu": 1}, ops
    assert graph.nodes[0].attrs["approximate"] == ("none" if form == "erf" else "tanh")


@pytest.mark.parametrize("case", ["half_is_quarter", "cube_of_another_tensor", "div_by_3",
                                  "sqrt2_first_in_div"])
def test_gelu_near_misses_of_the_spellings_stay_exact(case):
    """A wrong constant or another input is not GELU, whatever the operand order."""
    form = "erf" if case in ("div_by_3", "sqrt2_first_in_div") else "tanh"
    nodes, inits = _gelu_nodes(form, const_first=True, cube="xx_x", order="div2")
    if case == "half_is_quarter":
        inits["two"] = np.float32(4.0)
    elif case == "div_by_3":
        inits["two"] = np.float32(3.0)
    elif case == "sqrt2_first_in_div":  # sqrt 2 / x: Div does not commute
        nodes[0] = helper.make_node("Div", ["sqrt2", "x"], ["a"])
    else:  # (x * x) * relu(x): not x^3
        nodes[1] = helper.make_node("Mul", ["xx", "rx"], ["x3"])
        nodes.insert(0, helper.make_node("Relu", ["x"], ["rx"]))
    ops, _, _ = _check(nodes, inits)
    assert "Gelu" not in ops and ops[form.capitalize()] == 1

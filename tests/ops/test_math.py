"""Elementwise math operators (npujax/ops/math.py): numerics against onnxruntime at the edge
values the ONNX spec defines, Pow broadcasting and types, Flax tracing, ONNX round trip, and
their placement by the latency model."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from onnx import TensorProto, helper, numpy_helper

from npujax.backends.onnx_export import to_onnx
from npujax.frontends.flax import trace_flax
from npujax.frontends.onnx import from_onnx
from npujax.ir.execute import execute
from npujax.ops.math import onnx_pow
from npujax.plan import lower, workloads
from tests.helpers import assert_close
from tests.onnx_models import ort_run

UNARY = ("Exp", "Log", "Sqrt", "Reciprocal", "Neg", "Abs", "Erf")
MATH_OPS = (*UNARY, "Pow")

# Edge values: signed zeros, +-1, infinities, NaN, tiny and huge normals, Exp's overflow edge
# (88.72), and a negative input whose Exp underflows to 0 (XLA flushes subnormal results to zero,
# onnxruntime does not, so inputs with a subnormal Exp, -103 < x < -87.3, are avoided).
EDGE = np.array([0.0, -0.0, 1.0, -1.0, 0.5, -2.5, 3.0, np.inf, -np.inf, np.nan, 1e-30, -1e-30,
                 88.0, 89.0, -87.0, -104.0, 1e30, -1e30, 6.0, -6.0], np.float32)
# Pow's special cases (C pow): base, exponent.
POW_EDGE = np.array([
    [-2.0, 3.0], [-8.0, 1 / 3], [0.0, -1.0], [-0.0, -1.0], [0.0, 0.0], [0.0, 2.0], [-0.0, 3.0],
    [np.nan, 0.0], [np.nan, 1.0], [1.0, np.nan], [1.0, np.inf], [-1.0, np.inf], [-1.0, -np.inf],
    [np.inf, -1.0], [np.inf, 0.5], [-np.inf, 3.0], [-np.inf, 2.0], [-np.inf, -3.0], [2.0, 0.5],
    [0.5, np.inf], [2.0, -np.inf], [3.0, 6.0], [-3.0, 2.0], [10.0, 38.0], [10.0, 39.0],
], np.float32)


def _vi(name, dtype=TensorProto.FLOAT, shape=None):
    return helper.make_tensor_value_info(name, dtype, shape)


def _model(nodes, inputs, outputs, inits=()):
    m = helper.make_model(helper.make_graph(nodes, "math", inputs, outputs, list(inits)),
                          opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m.SerializeToString()


@pytest.fixture(scope="module")
def case():
    """One ONNX model with every operator: the unary ones on edge and random values; Pow on its
    special cases, broadcast both ways, by a constant float scalar and a constant int64 vector."""
    rng = np.random.default_rng(0)
    x = np.stack([EDGE, rng.normal(0.0, 3.0, EDGE.size).astype(np.float32)])  # [2, 20]
    feeds = {
        "x": x,
        "b": POW_EDGE[None, :, 0], "e": POW_EDGE[None, :, 1],  # [1, 25] each
        "p": rng.uniform(0.1, 3.0, (3, 1)).astype(np.float32),  # [3, 1] ^ [1, 4] -> [3, 4]
        "q": rng.uniform(-3.0, 3.0, (1, 4)).astype(np.float32),
    }
    nodes = [helper.make_node(op, ["x"], [op], name=op.lower()) for op in UNARY]
    nodes += [
        helper.make_node("Pow", ["b", "e"], ["pow_edge"], name="pow_edge"),
        helper.make_node("Pow", ["p", "q"], ["pow_bcast"], name="pow_bcast"),
        helper.make_node("Pow", ["x", "c_scalar"], ["pow_scalar"], name="pow_scalar"),
        helper.make_node("Pow", ["x", "c_ints"], ["pow_ints"], name="pow_ints"),
    ]
    inits = [numpy_helper.from_array(np.array(1.5, np.float32), "c_scalar"),  # x^1.5: NaN x<0
             numpy_helper.from_array(np.arange(-10, 10, dtype=np.int64) % 5 - 2, "c_ints")]
    outputs = [*UNARY, "pow_edge", "pow_bcast", "pow_scalar", "pow_ints"]
    model = _model(nodes, [_vi(k, shape=list(v.shape)) for k, v in feeds.items()],
                   [_vi(o) for o in outputs], inits)
    graph, params = from_onnx(model)
    xs = [feeds[n] for n in graph.inputs]
    return model, feeds, outputs, graph, params, xs


def _assert_same(y, want, name):
    y = np.asarray(y)
    assert y.shape == want.shape and y.dtype == want.dtype, (name, y.shape, y.dtype)
    # NaN, +-inf and the sign of zeros exactly; finite values to float32 tolerance
    # (measured vs onnxruntime: Log and Erf 2.4e-7 relative, the rest exact)
    assert_close(y, want, err_msg=name)
    keep = ~np.isnan(want)
    np.testing.assert_array_equal(np.signbit(y[keep]), np.signbit(want[keep]), err_msg=name)


def test_numerics_match_onnxruntime(case):
    model, feeds, outputs, graph, params, xs = case
    refs = dict(zip(outputs, ort_run(model, feeds)))
    ys = dict(zip(graph.outputs, execute(graph, params, xs)))
    for name in outputs:
        _assert_same(ys[name], refs[name], name)
    assert ys["pow_bcast"].shape == (3, 4) and ys["pow_ints"].shape == (2, 20)
    # the spec's special values are really exercised
    assert np.isnan(refs["Log"][0, 3]) and refs["Log"][0, 0] == -np.inf
    assert refs["Reciprocal"][0, 1] == -np.inf and refs["Exp"][0, 13] == np.inf
    assert refs["pow_edge"][0, 7] == 1.0 and np.isnan(refs["pow_edge"][0, 1])


def test_jit_and_gradients(case):
    _, _, outputs, graph, params, xs = case

    @jax.jit
    def run(xs, x_grad):
        def loss(x):
            return sum(jnp.sum(y) for y in execute(graph, params, [x, *xs[1:]]))

        return execute(graph, params, xs), jax.grad(loss)(x_grad)

    c = 0.7  # every operator is defined and smooth there
    ys, g = run(xs, jnp.full((1, 20), c, jnp.float32))
    for y, want in zip(ys, execute(graph, params, xs)):  # jit changes no bit
        np.testing.assert_array_equal(np.asarray(y), np.asarray(want))
    n = np.arange(-10, 10) % 5 - 2  # the int64 exponents
    want = (np.exp(c) + 1 / c + 0.5 / np.sqrt(c) - 1 / c**2 - 1 + 1  # Exp .. Abs
            + 2 / np.sqrt(np.pi) * np.exp(-c * c) + 1.5 * np.sqrt(c)  # Erf, x^1.5
            + n * c ** (n - 1.0))  # x^n
    assert_close(np.asarray(g)[0], want)


def test_integer_base_pow_matches_onnxruntime():
    x = np.repeat(np.arange(-3, 4, dtype=np.int32), 7)
    for y, t in ((np.tile(np.array([0, 1, 2, 3, 5, -1, -2], np.int32), 7), TensorProto.INT32),
                 (np.tile(np.array([0, 1, 2, 0.5, 2.5, -1, 1.5], np.float32), 7),
                  TensorProto.FLOAT)):
        model = _model([helper.make_node("Pow", ["x", "y"], ["z"])],
                       [_vi("x", TensorProto.INT32, [49]), _vi("y", t, [49])],
                       [_vi("z", TensorProto.INT32, [49])])
        (want,) = ort_run(model, {"x": x, "y": y})
        got = np.asarray(onnx_pow(jnp.asarray(x), jnp.asarray(y)))
        assert got.dtype == np.int32
        np.testing.assert_array_equal(got, want)  # 0^-1 and (-3)^0.5 too (the int32 minimum)


def test_onnx_round_trip(case):
    model, feeds, outputs, graph, params, xs = case
    assert [n.op for n in graph.nodes] == [*UNARY, "Pow", "Pow", "Pow", "Pow"]
    exported = to_onnx(graph, params).SerializeToString()
    for y, want in zip(ort_run(exported, feeds), ort_run(model, feeds)):
        np.testing.assert_array_equal(y, want)
    g2, p2 = from_onnx(exported)
    assert [(n.op, n.inputs) for n in g2.nodes] == [(n.op, n.inputs) for n in graph.nodes]
    assert g2.constants["c_ints"].dtype == np.int64  # the exponent keeps its own type
    for y, want in zip(execute(g2, p2, xs), execute(graph, params, xs)):
        np.testing.assert_array_equal(np.asarray(y), np.asarray(want))


class _Block(nnx.Module):
    """A GELU/LayerNorm-like tail written with the math functions."""

    def __init__(self, rngs):
        self.fc = nnx.Linear(8, 8, rngs=rngs)

    def __call__(self, x):
        h = self.fc(x)
        g = 0.5 * h * (1.0 + jax.lax.erf(h * 0.7071067811865476))
        s = jnp.sqrt(jnp.abs(g) + 1.0)
        return jnp.exp(-s) + jnp.log(s) + jnp.power(s, h) + s**0.5


@pytest.mark.flax_model
def test_flax_model_traces_to_named_ops():
    model = _Block(nnx.Rngs(0))
    x = jnp.asarray(np.random.default_rng(1).normal(size=(2, 8)), jnp.float32)
    graph, params = trace_flax(model, x)  # checks its output on x
    ops = [n.op for n in graph.nodes]
    assert "JaxPrimitive" not in ops
    assert {"Erf", "Sqrt", "Abs", "Exp", "Neg", "Log", "Pow"} <= set(ops)
    x2 = jnp.asarray(np.random.default_rng(2).normal(size=(2, 8)), jnp.float32)
    assert_close(execute(graph, params, x2), model(x2))  # and on another input


@pytest.fixture(scope="module")
def gemm_chain():
    """Gemm -> Exp -> Erf -> Pow(., 2) -> Sqrt -> Reciprocal -> Log -> Abs -> Neg."""
    w = numpy_helper.from_array(np.full((16, 32), 0.01, np.float32), "w")
    two = numpy_helper.from_array(np.array(2.0, np.float32), "two")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["t0"], name="fc")]
    chain = ["Exp", "Erf", "Pow", "Sqrt", "Reciprocal", "Log", "Abs", "Neg"]
    for i, op in enumerate(chain):
        ins = [f"t{i}", "two"] if op == "Pow" else [f"t{i}"]
        out = "y" if i == len(chain) - 1 else f"t{i + 1}"
        nodes.append(helper.make_node(op, ins, [out], name=op.lower()))
    model = _model(nodes, [_vi("x", shape=[4, 16])], [_vi("y")], [w, two])
    graph, _ = from_onnx(model)
    return graph, [n.lower() for n in chain]


def test_latency_model_places_math_on_vector_unit_only_if_supported(gemm_chain, edge_spec):
    graph, names = gemm_chain
    # edge_16x16 does not list them: each falls back to the host CPU
    rows = {w.name: w for w in workloads(graph, edge_spec)}
    for n in names:
        assert rows[n].device == "cpu" and "not supported by edge_16x16" in rows[n].reason
    spec = edge_spec.with_fields({"ops.supported": [*edge_spec.ops.supported, *MATH_OPS]})
    rows = {w.name: w for w in workloads(graph, spec)}
    for n in names:  # on the vector unit, fused into the GEMM's output stage (no DRAM traffic)
        w = rows[n]
        assert (w.device, w.kind, w.fused_into, w.in_elems, w.out_elems) == (
            "npu", "vector", "fc", 0, 0)
        assert w.vector_ops == 4 * 32
    lanes = spec.vector.lanes
    on_npu = {r.name: r for r in lower(graph, spec).layers}
    on_cpu = {r.name: r for r in lower(graph, edge_spec).layers}
    for n in names:
        assert on_npu[n].costs.compute_cycles == -(-4 * 32 // lanes)
        assert on_npu[n].costs.fallback_cycles == 0 and on_npu[n].costs.transfer_cycles == 0
        assert on_cpu[n].costs.fallback_cycles > 0
    assert (sum(r.latency_s for r in on_npu.values())
            < sum(r.latency_s for r in on_cpu.values()))

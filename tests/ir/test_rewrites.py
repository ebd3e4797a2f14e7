"""Exact rewrites (npujax.ir.rewrites) against onnxruntime on the original ONNX operator, and the
per-layer choice between rewrite and host fallback (npujax.plan.decompose)."""

from __future__ import annotations

import jax
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import npujax
from npujax.errors import ConfigError, UnsupportedOpError
from npujax.frontends.onnx import from_onnx
from npujax.hw.spec import load_npu_spec
from npujax.ir.rewrites import REWRITES, apply_rewrite
from npujax.plan import decompose_unsupported as decompose
from npujax.plan import workloads

BASE = ["Conv", "Gemm", "Add", "Mul", "Max", "Min", "Relu", "Sigmoid"]


def _spec(supported=BASE, kernel=3, policy="rewrite_or_refuse", **more):
    return load_npu_spec("edge_16x16").with_fields(
        {"ops.supported": list(supported), "ops.conv_max_kernel": kernel,
         "ops.unsupported": policy, **more})


def _model(node, x_shape, y_shape, inits=(), opset=20):
    g = helper.make_graph(
        [node], "t", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, y_shape)],
        [numpy_helper.from_array(a, n) for n, a in inits])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 9
    onnx.checker.check_model(m)
    return m


def _check(model, spec, x, rule, rtol=1e-5, atol=1e-6):
    """The rewritten graph (every unsupported op rewritten) equals onnxruntime's original."""
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    ref = sess.run(None, {"x": x})[0]
    graph, params = from_onnx(model)
    dec = decompose(graph, spec, params)
    assert [c.rule for c in dec.choices] == [rule]
    assert all(c.choice == "rewrite" for c in dec.choices)
    ops = {n.op for n in dec.graph.nodes}
    assert ops <= set(spec.ops.supported), ops
    y = np.asarray(jax.jit(lambda p, v: npujax.execute(dec.graph, p, v))(dec.params, x))
    np.testing.assert_allclose(y, ref, rtol=rtol, atol=atol)
    return dec


RNG = np.random.default_rng(0)


@pytest.mark.parametrize("alpha", [0.0, 3.0])
def test_leaky_relu_is_max(alpha):
    x = RNG.normal(size=(2, 3, 5)).astype(np.float32)
    m = _model(helper.make_node("LeakyRelu", ["x"], ["y"], alpha=alpha), [2, 3, 5], [2, 3, 5])
    dec = _check(m, _spec(), x, "leaky_relu_max", rtol=0, atol=0)  # bit-exact
    assert {n.op for n in dec.graph.nodes} == {"Mul", "Max" if alpha <= 1 else "Min"}


def test_leaky_relu_negative_alpha_refused():
    m = _model(helper.make_node("LeakyRelu", ["x"], ["y"], alpha=-0.5), [1, 4], [1, 4])
    graph, _ = from_onnx(m)
    with pytest.raises(UnsupportedOpError, match="alpha = -0.5 < 0"):
        decompose(graph, _spec())


@pytest.mark.parametrize("k,stride,dil,pads,group,bias", [
    (5, 1, 2, [1, 0, 4, 2], 2, True),    # dilated, grouped, asymmetric padding
    (7, 2, 1, [3, 1, 2, 3], 4, False),   # strided depthwise
])
def test_large_kernel_conv_is_sum_of_3x3(k, stride, dil, pads, group, bias):
    cin, cout = 4, 4 if group == 4 else 6
    x = RNG.normal(size=(1, cin, 13, 11)).astype(np.float32)
    w = RNG.normal(size=(cout, cin // group, k, k)).astype(np.float32)
    b = RNG.normal(size=(cout,)).astype(np.float32)
    ins = ["x", "w"] + (["b"] if bias else [])
    node = helper.make_node("Conv", ins, ["y"], strides=[stride] * 2, dilations=[dil] * 2,
                            pads=pads, group=group, kernel_shape=[k, k])
    eff = dil * (k - 1) + 1
    ho = (13 + pads[0] + pads[2] - eff) // stride + 1
    wo = (11 + pads[1] + pads[3] - eff) // stride + 1
    inits = [("w", w)] + ([("b", b)] if bias else [])
    m = _model(node, [1, cin, 13, 11], [1, cout, ho, wo], inits, opset=17)
    dec = _check(m, _spec(), x, "large_kernel_conv", rtol=1e-4, atol=1e-4)
    tiles = [n for n in dec.graph.nodes if n.op == "Conv"]
    assert len(tiles) == (-(-k // 3)) ** 2
    assert sum(n.attrs["kernel_shape"][2] * n.attrs["kernel_shape"][3] for n in tiles) == k * k
    # the same MACs as the original: no zero taps
    orig, _ = from_onnx(m)
    macs = lambda g: sum(w.macs for w in workloads(g))  # noqa: E731
    assert macs(dec.graph) == macs(orig)


def test_large_kernel_conv_stride_refused():
    w = np.ones((2, 2, 5, 5), np.float32)
    m = _model(helper.make_node("Conv", ["x", "w"], ["y"], strides=[4, 4]), [1, 2, 9, 9],
               [1, 2, 2, 2], [("w", w)], opset=17)
    graph, _ = from_onnx(m)
    with pytest.raises(UnsupportedOpError, match="stride 4 > max 2"):
        decompose(graph, _spec())


@pytest.mark.parametrize("k,stride,pads,include,ceil", [
    (3, 1, [1, 1, 1, 1], 1, 0),   # one divisor: a 1/9 filter
    (3, 2, [1, 1, 1, 1], 0, 0),   # the padding does not count: a per-pixel 1/count
    (3, 2, [0, 1, 1, 0], 1, 1),   # the ceil_mode overhang does not count either
])
def test_avgpool_is_depthwise_conv(k, stride, pads, include, ceil):
    x = RNG.normal(size=(1, 3, 9, 8)).astype(np.float32)
    node = helper.make_node("AveragePool", ["x"], ["y"], kernel_shape=[k, k],
                            strides=[stride] * 2, pads=pads, count_include_pad=include,
                            ceil_mode=ceil)
    rnd = (lambda v: -(-v // stride)) if ceil else (lambda v: v // stride)
    y_shape = [1, 3] + [rnd(n + pads[i] + pads[i + 2] - k) + 1 for i, n in enumerate((9, 8))]
    m = _model(node, [1, 3, 9, 8], y_shape, opset=19)
    dec = _check(m, _spec(), x, "avgpool_depthwise")
    convs = [n for n in dec.graph.nodes if n.op == "Conv"]
    assert len(convs) == 1 and convs[0].attrs["groups"] == 3


@pytest.mark.parametrize("approximate,supported", [
    ("none", BASE + ["Erf"]),
    ("tanh", BASE),                                   # through Sigmoid
    ("tanh", [o for o in BASE if o != "Sigmoid"] + ["Tanh"]),
])
def test_gelu_from_elementwise(approximate, supported):
    x = (RNG.normal(size=(2, 64)) * 3).astype(np.float32)
    m = _model(helper.make_node("Gelu", ["x"], ["y"], approximate=approximate), [2, 64],
               [2, 64])
    _check(m, _spec(supported), x, "gelu_elementwise", rtol=1e-5, atol=2e-6)


def test_gelu_erf_without_erf_refused():
    m = _model(helper.make_node("Gelu", ["x"], ["y"]), [2, 8], [2, 8])
    graph, _ = from_onnx(m)
    with pytest.raises(UnsupportedOpError, match="lacks Erf"):
        decompose(graph, _spec())


def test_hard_sigmoid_is_clip():
    x = (RNG.normal(size=(2, 16)) * 4).astype(np.float32)
    m = _model(helper.make_node("HardSigmoid", ["x"], ["y"], alpha=0.25, beta=0.4), [2, 16],
               [2, 16], opset=17)
    _check(m, _spec(BASE + ["Clip"]), x, "hard_sigmoid_clip", rtol=0, atol=1e-7)


def test_layer_norm_from_reductions():
    x = RNG.normal(size=(2, 5, 8)).astype(np.float32) * 3 + 1
    s, bias = RNG.normal(size=(8,)).astype(np.float32), RNG.normal(size=(8,)).astype(np.float32)
    m = _model(helper.make_node("LayerNormalization", ["x", "s", "b"], ["y"], axis=-1,
                                epsilon=1e-5), [2, 5, 8], [2, 5, 8], [("s", s), ("b", bias)],
               opset=17)
    _check(m, _spec(BASE + ["ReduceMean", "Sub", "Sqrt", "Reciprocal"]), x,
           "layer_norm_elementwise", rtol=1e-5, atol=1e-5)


def test_registry_one_rule_per_op():
    assert set(REWRITES) == {"LeakyRelu", "Conv", "AveragePool", "Gelu", "HardSigmoid",
                             "LayerNormalization"}
    w = np.ones((2, 2, 3, 3), np.float32)
    g, _ = from_onnx(_model(helper.make_node("Conv", ["x", "w"], ["y"]), [1, 2, 5, 5],
                            [1, 2, 3, 3], [("w", w)], opset=17))
    with pytest.raises(UnsupportedOpError, match="kernel already fits"):
        apply_rewrite(g, None, g.nodes[0].name, REWRITES["Conv"], _spec().ops)


def _chain(k=5, hw=16):
    """conv(k x k) -> LeakyRelu -> conv 3x3, for the cost decisions."""
    w1 = RNG.normal(size=(8, 8, k, k)).astype(np.float32)
    w2 = RNG.normal(size=(8, 8, 3, 3)).astype(np.float32)
    p = k // 2
    g = helper.make_graph(
        [helper.make_node("Conv", ["x", "w1"], ["a"], pads=[p] * 4),
         helper.make_node("LeakyRelu", ["a"], ["b"], alpha=0.1),
         helper.make_node("Conv", ["b", "w2"], ["y"], pads=[1] * 4)], "chain",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, hw, hw])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, hw, hw])],
        [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    return from_onnx(m)[0]


def test_lower_chooses_the_cheaper_and_reports_why():
    graph = _chain()
    fb = npujax.lower(graph, _spec(policy="fallback"))
    rw = npujax.lower(graph, _spec(policy="rewrite_or_fallback"))
    assert fb.rewrites == () and fb.to_dict()["rewrites"] == []
    by = {c.node: c for c in rw.rewrites}
    assert {c.choice for c in by.values()} == {"rewrite"}
    assert rw.latency_s < fb.latency_s
    assert all(c.rewrite_s < c.fallback_s and "µs" in c.reason for c in by.values())
    # a host fast enough and a free link make the fallback the cheaper: it is kept
    fast = _spec(policy="rewrite_or_fallback", **{"host.cpu_ops_per_s": 1e16,
                                                  "host.link_bytes_per_s": 1e15,
                                                  "host.link_latency_s": 0.0})
    kept = npujax.lower(graph, fast)
    assert {c.choice for c in kept.rewrites} == {"fallback"}
    assert kept.latency_s == npujax.lower(graph, fast.with_fields(
        {"ops.unsupported": "fallback"})).latency_s


def test_rest_of_graph_partition_counts():
    """Under rest_of_graph a fallback sends every later layer to the host too: the rewrite's
    saving includes them."""
    graph = _chain()
    spec = _spec(policy="rewrite_or_fallback", **{"ops.fallback": "rest_of_graph"})
    s = npujax.lower(graph, spec)
    assert [c.choice for c in s.rewrites] == ["rewrite", "rewrite"]
    assert all(r.device == "npu" for r in s.layers)


def test_default_policy_changes_nothing():
    graph = _chain()
    spec = load_npu_spec("edge_16x16")
    assert spec.ops.unsupported == "fallback"
    assert decompose(graph, spec).graph is graph  # the default rewrites nothing
    with pytest.raises(ConfigError, match="unsupported"):
        spec.with_fields({"ops.unsupported": "sometimes"})

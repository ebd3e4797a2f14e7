"""The integer Conv/Gemm with ``requant="float"`` equals onnxruntime's QLinearConv and
QLinearMatMul bit for bit (uint8 activations, int8 per-channel weights, int32 bias), and the
whole exported demo CNN equals onnxruntime's execution of it."""

import jax.numpy as jnp
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from npujax.backends.integer import _int_gemm, convert, execute_integer
from npujax.backends.onnx_export import to_onnx
from npujax.ir.graph import Node
from tests.helpers import jit_optimized

N, H, W, CI, CO = 2, 6, 6, 3, 4
CONV = Node("c", "Conv", ("x",), ("y",), attrs={
    "strides": [1, 1], "padding": [[1, 1], [1, 1]], "dilations": [1, 1], "groups": 1,
    "data_layout": "NHWC", "kernel_layout": "HWIO"})


def npujax_conv(xq, xs, xz, wq, ws, bq, ys, yz):
    acc = _int_gemm(CONV, jnp.asarray(xq, jnp.int32) - jnp.int32(xz), jnp.asarray(wq, jnp.int32))
    acc = acc + jnp.asarray(bq, jnp.int32).reshape(1, 1, 1, -1)
    mult = (np.float32(xs) * ws.astype(np.float32)) / np.float32(ys)  # as convert() computes it
    r = jnp.round(acc.astype(jnp.float32) * jnp.asarray(mult).reshape(1, 1, 1, -1))
    return np.asarray(jnp.clip(r.astype(jnp.int32) + jnp.int32(yz), 0, 255)).astype(np.uint8)


def ort_qlinearconv(xq, xs, xz, wq, ws, bq, ys, yz):
    inits = [
        numpy_helper.from_array(np.float32(xs), "xs"),
        numpy_helper.from_array(np.uint8(xz), "xz"),
        numpy_helper.from_array(np.ascontiguousarray(wq.transpose(3, 2, 0, 1)), "w"),  # OIHW
        numpy_helper.from_array(ws.astype(np.float32), "ws"),
        numpy_helper.from_array(np.zeros(CO, np.int8), "wz"),
        numpy_helper.from_array(np.float32(ys), "ys"),
        numpy_helper.from_array(np.uint8(yz), "yz"),
        numpy_helper.from_array(bq.astype(np.int32), "b"),
    ]
    node = helper.make_node("QLinearConv", ["x", "xs", "xz", "w", "ws", "wz", "ys", "yz", "b"],
                            ["y"], pads=[1, 1, 1, 1], kernel_shape=[3, 3])
    g = helper.make_graph([node], "qconv",
                          [helper.make_tensor_value_info("x", TensorProto.UINT8, (N, CI, H, W))],
                          [helper.make_tensor_value_info("y", TensorProto.UINT8, (N, CO, H, W))],
                          initializer=inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])
    m.ir_version = 10
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    (y,) = sess.run(None, {"x": np.ascontiguousarray(xq.transpose(0, 3, 1, 2))})
    return y.transpose(0, 2, 3, 1)


@given(seed=st.integers(0, 2**31 - 1), xz=st.integers(0, 255), yz=st.integers(0, 255),
       ys=st.sampled_from([0.01, 0.05, 0.1, 0.37, 1.0]))
@settings(max_examples=15, deadline=None)
def test_integer_conv_equals_onnxruntime_qlinearconv(seed, xz, yz, ys):
    rng = np.random.default_rng(seed)
    xq = rng.integers(0, 256, (N, H, W, CI)).astype(np.uint8)
    wq = rng.integers(-127, 128, (3, 3, CI, CO)).astype(np.int8)
    xs = np.float32(rng.uniform(0.001, 0.05))
    ws = rng.uniform(0.001, 0.02, CO).astype(np.float32)
    bq = rng.integers(-5000, 5000, CO).astype(np.int32)
    want = ort_qlinearconv(xq, xs, xz, wq, ws, bq, np.float32(ys), yz)
    got = npujax_conv(xq, xs, xz, wq, ws, bq, np.float32(ys), yz)
    np.testing.assert_array_equal(got, want)


@pytest.fixture(scope="module")
def digits_w8a8():
    """The demo's pipeline (npujax.workflows.demo.run_demo, steps 1-4) with 2 float epochs:
    DigitsCNN trained in Flax, traced, BN folded and epilogues fused, PTQ W8A8 calibrated on 8
    batches of 64 training images."""
    from npujax.data.datasets import load_digits_nhwc
    from npujax.frontends.flax import trace_flax
    from npujax.ir.passes import optimize
    from npujax.models.train import train_float
    from npujax.quantize.calibrate import calibrate
    from npujax.quantize.spec import quant_spec

    data = load_digits_nhwc(seed=0)
    model = train_float(data, epochs=2, learning_rate=3e-3, batch_size=64, seed=0)
    graph, params = optimize(*trace_flax(model, data.x_test[:1]))
    q8 = quant_spec(graph, 8, 8)
    calib = [data.x_train[i * 64:(i + 1) * 64] for i in range(8)]
    return graph, params, q8, calibrate(graph, params, calib, q8), data.x_test


def test_digits_cnn_integer_path_equals_onnxruntime_bit_for_bit(digits_w8a8, tmp_path):
    """The whole demo CNN (conv-ReLU, conv-ReLU, avg pool, flatten, dense-ReLU, dense) exported
    as QDQ and run by onnxruntime (default optimizations: QLinearConv, QLinearAveragePool, QGemm)
    equals ``execute_integer(convert(..., requant="float"))`` on every logit of all 360 test
    images. Before the exporter put Q/DQ on the GEMM outputs (so ORT ran conv2 in float before
    its float pool) and before the integer path modelled QLinearAveragePool's float arithmetic
    and divided as ORT does, 81.6% of the logits were identical (max |diff| 0.0089)."""
    graph, params, q8, qstate, x = digits_w8a8
    onnx_model = to_onnx(graph, params, q8, qstate)
    opts = ort.SessionOptions()  # default: all graph optimizations
    opts.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    sess = ort.InferenceSession(onnx_model.SerializeToString(), opts,
                                providers=["CPUExecutionProvider"])
    # every layer runs in an integer kernel: nothing is left in float between Q and DQ
    ops = sorted(n.op_type for n in onnx.load(opts.optimized_model_filepath).graph.node)
    assert ops == ["QGemm", "QGemm", "QLinearAveragePool", "QLinearConv", "QLinearConv",
                   "QuantizeLinear", "Reshape"], ops
    name = graph.inputs[0]
    want = np.concatenate([sess.run(None, {name: xi[None]})[0] for xi in x])
    integer = convert(graph, params, q8, qstate, requant="float")
    got = np.asarray(jit_optimized(lambda v: execute_integer(integer, v))(jnp.asarray(x)))
    # Same int32 accumulators, the same final float32 multiply: identical, not just close.
    np.testing.assert_array_equal(got, want)

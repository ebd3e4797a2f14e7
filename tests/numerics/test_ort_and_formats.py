"""quantize/dequantize/fake_quant against onnxruntime's QuantizeLinear/DequantizeLinear (opset 21)
and a numpy reference: per-tensor, per-channel on any axis, per-block, int4/uint4/int16, exact
ties, values beyond the range, FP8 saturation; stochastic rounding statistics."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from onnx import TensorProto, helper

from npujax.errors import QuantizationError
from npujax.numerics import (
    FP8_E4M3FN,
    FP8_E5M2,
    IntFormat,
    dequantize,
    fake_quant,
    qparams_from_range,
    quantize,
)

SHAPE = (3, 4, 6)  # fixed, so each jitted/ORT function compiles once

_ONNX_TYPE = {
    "int8": TensorProto.INT8, "uint8": TensorProto.UINT8, "int16": TensorProto.INT16,
    "uint16": TensorProto.UINT16, "int4": TensorProto.INT4, "uint4": TensorProto.UINT4,
    "float8_e4m3fn": TensorProto.FLOAT8E4M3FN, "float8_e5m2": TensorProto.FLOAT8E5M2,
}


def _onnx_name(fmt):
    if isinstance(fmt, IntFormat):
        return f"{'int' if fmt.signed else 'uint'}{fmt.bits}"
    return fmt.name


def ort_qdq(type_name, axis, block_size, zp):
    """An in-memory ONNX model x, scale -> (QuantizeLinear codes cast to float, DequantizeLinear);
    the zero point is an initializer (onnxruntime's Python API takes no 4-bit inputs)."""
    qt = _ONNX_TYPE[type_name]
    param_shape = zp.shape
    attrs = {} if axis is None else {"axis": axis}
    if block_size is not None:
        attrs["block_size"] = block_size
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, SHAPE)
    s = helper.make_tensor_value_info("s", TensorProto.FLOAT, param_shape)
    z = helper.make_tensor("z", qt, param_shape, zp.reshape(-1).tolist())
    q_out = helper.make_tensor_value_info("qf", TensorProto.FLOAT, SHAPE)
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, SHAPE)
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"], **attrs),
        helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"], **attrs),
        helper.make_node("Cast", ["q"], ["qf"], to=TensorProto.FLOAT),
    ]
    graph = helper.make_graph(nodes, "qdq", [x, s], [q_out, y], initializer=[z])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    onnx.checker.check_model(model)
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def run_ort(fmt, x, scale, zp, axis=None, block_size=None):
    zp = np.asarray(zp, np.float32 if isinstance(fmt, type(FP8_E5M2)) else np.int64)
    sess = ort_qdq(_onnx_name(fmt), axis, block_size, zp)
    qf, y = sess.run(None, {"x": x, "s": np.asarray(scale, np.float32)})
    return qf, y


@functools.cache
def jitted(fmt, axis, block_size):
    def f(x, s, z):
        q = quantize(x, s, z, fmt, axis, block_size=block_size)
        return q, dequantize(q, s, z, axis, block_size=block_size), fake_quant(
            x, s, z, fmt, axis, block_size=block_size)
    return jax.jit(f)


def check_against_ort(fmt, x, scale, zp, axis=None, block_size=None):
    qf, y = run_ort(fmt, x, scale, zp, axis, block_size)
    zj = jnp.asarray(np.asarray(zp, np.float32 if isinstance(fmt, type(FP8_E5M2)) else np.int32))
    q, dq, fq = jitted(fmt, axis, block_size)(jnp.asarray(x), jnp.asarray(scale), zj)
    np.testing.assert_array_equal(np.asarray(q).astype(np.float32), qf)
    np.testing.assert_array_equal(np.asarray(dq), y)
    np.testing.assert_array_equal(np.asarray(fq), y)


INT_FORMATS = [IntFormat(8), IntFormat(8, signed=False), IntFormat(4), IntFormat(4, signed=False),
               IntFormat(16), IntFormat(16, signed=False)]

values = hnp.arrays(np.float32, SHAPE,
                    elements=st.floats(-300, 300, width=32, allow_subnormal=False))
# Scales that are powers of two times small odd numbers make exact ties x/scale = k + 1/2 common.
scales = st.sampled_from([0.5, 0.25, 1.0, 2.0, 0.375, 0.1, 3.0, 0.0078125, 1.7])


def _with_ties(x, scale, draw_ties):
    """Replace some entries by exact ties (k + 1/2) * scale and some by values far beyond."""
    x = x.copy()
    flat = x.reshape(-1)
    k = np.arange(flat.size) % 40 - 20
    tie = ((k + 0.5) * np.float32(scale)).astype(np.float32)
    exact = (tie / np.float32(scale)) == (k + 0.5)
    mask = (np.arange(flat.size) % 3 == 0) & exact & draw_ties
    flat[mask] = tie[mask]
    flat[::11] = np.float32(1e6) * np.sign(flat[::11] + 0.5)
    return x


@pytest.mark.parametrize("fmt", INT_FORMATS, ids=str)
@given(x=values, scale=scales, zp_frac=st.floats(0, 1), ties=st.booleans())
@settings(max_examples=15, deadline=None)
def test_per_tensor_equals_onnxruntime(fmt, x, scale, zp_frac, ties):
    zp = int(round(fmt.qmin + zp_frac * (fmt.qmax - fmt.qmin)))
    x = _with_ties(x, scale, ties)
    check_against_ort(fmt, x, np.float32(scale), zp)


@pytest.mark.parametrize("fmt", [IntFormat(8), IntFormat(4), IntFormat(8, signed=False)], ids=str)
@pytest.mark.parametrize("axis", [0, 1, 2])
@given(x=values, data=st.data())
@settings(max_examples=8, deadline=None)
def test_per_channel_equals_onnxruntime(fmt, axis, x, data):
    n = SHAPE[axis]
    scale = np.asarray(data.draw(st.lists(scales, min_size=n, max_size=n)), np.float32)
    zp = np.asarray(data.draw(st.lists(st.integers(fmt.qmin, fmt.qmax), min_size=n, max_size=n)))
    check_against_ort(fmt, _with_ties(x, 0.5, True), scale, zp, axis=axis)


@pytest.mark.parametrize("fmt", [IntFormat(8), IntFormat(4, signed=False)], ids=str)
@pytest.mark.parametrize("axis,block", [(2, 4), (1, 2), (2, 3)])
@given(x=values, data=st.data())
@settings(max_examples=6, deadline=None)
def test_per_block_equals_onnxruntime(fmt, axis, block, x, data):
    pshape = list(SHAPE)
    pshape[axis] = -(-SHAPE[axis] // block)
    n = int(np.prod(pshape))
    scale = np.asarray(data.draw(st.lists(scales, min_size=n, max_size=n)), np.float32)
    zp = np.asarray(data.draw(st.lists(st.integers(fmt.qmin, fmt.qmax), min_size=n, max_size=n)))
    check_against_ort(fmt, x, scale.reshape(pshape), zp.reshape(pshape), axis=axis,
                      block_size=block)


@pytest.mark.parametrize("fmt", [FP8_E4M3FN, FP8_E5M2], ids=str)
@given(x=hnp.arrays(np.float32, SHAPE, elements=st.floats(-1e5, 1e5, width=32)),
       scale=scales)
@settings(max_examples=15, deadline=None)
def test_fp8_saturates_like_onnxruntime(fmt, x, scale):
    x = x.copy()
    x.reshape(-1)[::5] = np.float32(3e5)  # far beyond both formats' ranges
    x.reshape(-1)[1::7] = np.float32(-3e5)
    check_against_ort(fmt, x, np.float32(scale), np.float32(0.0))


def test_fp8_saturation_values():
    x = jnp.asarray([1000.0, -1000.0, 449.0, 1e9], jnp.float32)
    q = quantize(x, jnp.float32(1.0), jnp.float32(0.0), FP8_E4M3FN)
    assert q.dtype == jnp.float8_e4m3fn
    np.testing.assert_array_equal(np.asarray(q, np.float32), [448, -448, 448, 448])
    q = quantize(jnp.asarray([1e6, -1e6], jnp.float32), jnp.float32(1.0), jnp.float32(0.0),
                 FP8_E5M2)
    np.testing.assert_array_equal(np.asarray(q, np.float32), [57344, -57344])
    s, z = qparams_from_range(jnp.float32(-3.0), jnp.float32(896.0), FP8_E4M3FN, True)
    assert float(s) == 2.0 and int(z) == 0


def test_fp8_ste_gradient():
    x = jnp.asarray([1.0, 447.0, 448.0, 449.0, -500.0], jnp.float32)
    g = jax.grad(lambda v: jnp.sum(fake_quant(v, jnp.float32(1.0), jnp.float32(0.0),
                                              FP8_E4M3FN)))(x)
    np.testing.assert_array_equal(np.asarray(g), [1, 1, 1, 0, 0])


def test_block_shape_mismatch_raises():
    with pytest.raises(QuantizationError, match="per-block scale must have shape"):
        quantize(jnp.ones(SHAPE, jnp.float32), jnp.ones((3, 4, 3), jnp.float32),
                 jnp.zeros((3, 4, 3), jnp.int32), IntFormat(8), axis=2, block_size=4)


def test_stochastic_rounding_is_unbiased_with_bernoulli_variance():
    # floor(v + u): rounds up with probability frac(v), so E[x_hat] = x and
    # Var[x_hat] = s^2 * p (1 - p) per element (Gupta et al. 2015).
    fmt = IntFormat(8)
    s = 0.5
    x = jnp.full((200_000,), 0.3 * s + 2 * s, jnp.float32)  # frac = 0.3
    out = np.asarray(fake_quant(x, jnp.float32(s), jnp.int32(0), fmt, key=jax.random.key(0)))
    assert set(np.unique(out)) == {2 * s, 3 * s}
    np.testing.assert_allclose(out.mean(), float(x[0]), atol=4 * s * np.sqrt(0.21 / out.size))
    np.testing.assert_allclose(out.var(), s**2 * 0.21, rtol=0.03)
    # gradient is still the STE
    g = jax.grad(lambda v: jnp.sum(fake_quant(v, jnp.float32(s), jnp.int32(0), fmt,
                                              key=jax.random.key(1))))(x[:4])
    np.testing.assert_array_equal(np.asarray(g), np.ones(4, np.float32))

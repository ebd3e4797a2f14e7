"""Int4 weight-only and blocked-quantization ONNX (issue 28, item 3): opset-21 blocked
``DequantizeLinear`` (the partial last block included), npujax's own blocked export imported
back, and onnxruntime's ``com.microsoft.MatMulNBits`` with its documented defaults, vs
onnxruntime."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

from npujax.backends.onnx_export import to_onnx
from npujax.errors import UnsupportedOpError
from npujax.frontends.onnx import from_onnx
from npujax.ir.execute import execute
from npujax.quantize.calibrate import calibrate
from npujax.quantize.spec import quant_spec
from tests.helpers import assert_close
from tests.onnx_models import ort_run

K, N, BLOCK = 10, 3, 4  # K is not a multiple of the block: the last block has 2 rows


def _model(nodes, inputs, inits, opset=21, ms=False) -> onnx.ModelProto:
    g = h.make_graph(nodes, "m", inputs, [h.make_tensor_value_info("y", T.FLOAT, None)], inits)
    ops = [h.make_opsetid("", opset)] + ([h.make_opsetid("com.microsoft", 1)] if ms else [])
    return h.make_model(g, opset_imports=ops)


def _check(m, feeds, **tol):
    graph, params = from_onnx(m)  # strict
    y = execute(graph, params, [feeds[t] for t in graph.inputs])
    (ref,) = ort_run(m.SerializeToString(), feeds)
    assert np.asarray(y).shape == ref.shape
    assert_close(y, ref, **tol)
    return graph


@pytest.mark.parametrize("dtype, zero_point, axis", [
    (T.INT8, True, 0), (T.UINT4, True, 0), (T.INT4, False, 1), (T.UINT8, True, 1)])
def test_blocked_dequantize_of_weights_vs_onnxruntime(dtype, zero_point, axis):
    rng = np.random.default_rng(dtype)
    info = {T.INT8: (-128, 127), T.UINT8: (0, 255), T.INT4: (-8, 7), T.UINT4: (0, 15)}[dtype]
    shape = (K, N) if axis == 0 else (N, K)  # K blocked: MatMul weight, or Gemm's transB
    blocks = list(shape)
    blocks[axis] = -(-K // BLOCK)
    np_dtype = np.int8 if info[0] < 0 else np.uint8
    q = nh.from_array(rng.integers(*info, size=shape, endpoint=True).astype(np_dtype), "q")
    q.data_type = dtype  # (4-bit codes: onnx packs them from the int8/uint8 values)
    if dtype in (T.INT4, T.UINT4):
        q = h.make_tensor("q", dtype, shape, nh.to_array(q).reshape(-1).tolist())
    inits = [q, nh.from_array(rng.uniform(0.01, 0.1, size=blocks).astype(np.float32), "s")]
    ins = ["q", "s"]
    if zero_point:
        zp = h.make_tensor("z", dtype, blocks,
                           rng.integers(*info, size=blocks, endpoint=True).reshape(-1).tolist())
        inits.append(zp)
        ins.append("z")
    mm = (h.make_node("MatMul", ["x", "w"], ["y"]) if axis == 0
          else h.make_node("Gemm", ["x", "w"], ["y"], transB=1))
    m = _model([h.make_node("DequantizeLinear", ins, ["w"], axis=axis, block_size=BLOCK), mm],
               [h.make_tensor_value_info("x", T.FLOAT, [2, K])], inits)
    graph = _check(m, {"x": rng.normal(size=(2, K)).astype(np.float32)})
    assert [n.op for n in graph.nodes] == ["Gemm"]  # the weights folded, a weight layer


def test_blocked_dequantize_at_run_time_vs_onnxruntime():
    rng = np.random.default_rng(1)
    s = rng.uniform(0.01, 0.1, size=(2, 3)).astype(np.float32)
    z = rng.integers(-5, 5, size=(2, 3)).astype(np.int8)
    m = _model([h.make_node("DequantizeLinear", ["x", "s", "z"], ["y"], axis=1,
                            block_size=BLOCK)],
               [h.make_tensor_value_info("x", T.INT8, [2, K])],
               [nh.from_array(s, "s"), nh.from_array(z, "z")])
    _check(m, {"x": rng.integers(-128, 127, size=(2, K)).astype(np.int8)})


def test_npujax_blocked_export_imports_back():
    """npujax's own export writes the blocked DequantizeLinear: it imports again, strictly,
    and computes what onnxruntime computes on the export."""
    rng = np.random.default_rng(2)
    w = rng.normal(size=(K, N)).astype(np.float32)
    m = _model([h.make_node("MatMul", ["x", "w"], ["y"])],
               [h.make_tensor_value_info("x", T.FLOAT, [1, K])], [nh.from_array(w, "w")],
               opset=17)
    graph, params = from_onnx(m)
    q = quant_spec(graph, weight_block_size=BLOCK)
    x = rng.normal(size=(8, K)).astype(np.float32)
    qstate = calibrate(graph, params, [jnp.asarray(x)], q)
    exported = to_onnx(graph, params, q, qstate)
    assert any(a.name == "block_size" for n in exported.graph.node for a in n.attribute)
    _check(exported, {"x": x[:1]}, rtol=1e-5, atol=1e-6)


def _pack(codes: np.ndarray, bits: int) -> np.ndarray:
    """Pack unsigned ``bits``-bit codes along the last axis, low bits first (ORT's layout)."""
    b = ((codes[..., None] >> np.arange(bits)) & 1).astype(np.uint8)
    return np.packbits(b.reshape(*codes.shape[:-1], -1), axis=-1, bitorder="little")


def _nbits(bits=4, k=40, block=16, zero_points=None, bias=False, g_idx=False):
    rng = np.random.default_rng(bits * 10 + k)
    nb = -(-k // block)
    codes = rng.integers(0, 2**bits, size=(N, nb * block))
    b = _pack(codes.reshape(N, nb, block), bits)  # [N, k_blocks, block * bits / 8]
    inits = [nh.from_array(b, "b"),
             nh.from_array(rng.uniform(0.01, 0.1, size=(N, nb)).astype(np.float32), "s")]
    ins = ["a", "b", "s"]
    if zero_points == "packed":
        zp = _pack(rng.integers(0, 2**bits, size=(N, nb)), bits)  # [N, ceil(nb * bits / 8)]
        inits.append(nh.from_array(zp, "z"))
        ins.append("z")
    elif zero_points == "float":
        inits.append(nh.from_array(rng.uniform(0, 2**bits, size=(N, nb)).astype(np.float32),
                                   "z"))
        ins.append("z")
    if g_idx:
        inits.append(nh.from_array((np.arange(k) // block).astype(np.int32), "g"))
        ins += [""] * (4 - len(ins)) + ["g"]
    if bias:
        inits.append(nh.from_array(rng.normal(size=N).astype(np.float32), "bias"))
        ins += [""] * (5 - len(ins)) + ["bias"]
    node = h.make_node("MatMulNBits", ins, ["y"], domain="com.microsoft", K=k, N=N, bits=bits,
                       block_size=block)
    m = _model([node], [h.make_tensor_value_info("a", T.FLOAT, [2, 3, k])], inits, ms=True)
    return m, {"a": rng.normal(size=(2, 3, k)).astype(np.float32)}


@pytest.mark.parametrize("bits, k, zero_points, bias", [
    (4, 40, None, False),  # the default zero point 2**(bits - 1), a partial last block
    (4, 40, "packed", True),  # 3 blocks: packed zero points [N, ceil(3 * 4 / 8)] = [N, 2]
    (4, 32, "float", False),
    (8, 40, "packed", False),
    (2, 48, "packed", True),
])
def test_matmul_nbits_vs_onnxruntime(bits, k, zero_points, bias):
    m, feeds = _nbits(bits, k, zero_points=zero_points, bias=bias)
    graph = _check(m, feeds, rtol=1e-5, atol=1e-5)
    assert [n.op for n in graph.nodes] == ["Gemm"]


def test_matmul_nbits_with_g_idx_is_refused():
    m, _ = _nbits(g_idx=True)
    with pytest.raises(UnsupportedOpError, match="g_idx"):
        from_onnx(m)

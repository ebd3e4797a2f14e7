"""JAX implementations of the operators that ONNX models bring in (registered into ``OPS``).

Semantics follow the ONNX operator specification (https://onnx.ai/onnx/operators/); every
attribute is static and resolved by :func:`npujax.from_onnx` at import time (pads, output
sizes, slice bounds, axes), so each function here is a plain, jit-able, differentiable JAX
expression of its array inputs. Layouts are ONNX's: channels first (``[N, C, *spatial]``).
"""

from __future__ import annotations

import base64

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from npujax.errors import UnsupportedOpError
from npujax.ir.graph import Node
from npujax.ops.core import _register, align_ranks, apply_epilogue
from npujax.quant.core import true_divide

__all__: list[str] = []


@_register("ConvTranspose")
def _conv_transpose(node: Node, inputs, params):
    """ONNX ConvTranspose as a dilated-input convolution.

    ``kernel`` is ONNX's ``[C_in, C_out/groups, *k]``. With ``lhs_dilation = strides`` and the
    spatially flipped kernel, the begin/end padding per spatial axis is
    ``dilation*(k-1) - pad_begin`` and ``dilation*(k-1) - pad_end + output_padding``.
    """
    a = node.attrs
    (x,) = inputs
    w = params["kernel"]
    g = int(a["groups"])
    c_in, c_out_g, *k = w.shape
    # [g, C_in/g, C_out/g, *k] -> [g, C_out/g, C_in/g, *k] -> [C_out, C_in/g, *k], flipped.
    w = jnp.reshape(w, (g, c_in // g, c_out_g, *k))
    w = jnp.swapaxes(w, 1, 2).reshape((g * c_out_g, c_in // g, *k))
    w = jnp.flip(w, axis=tuple(range(2, w.ndim)))
    pads = [
        (d * (kk - 1) - pb, d * (kk - 1) - pe + op)
        for kk, d, (pb, pe), op in zip(k, a["dilations"], a["pads"], a["output_padding"])
    ]
    layout = "NC" + "DHW"[3 - len(k):]
    y = lax.conv_general_dilated(
        x, w, window_strides=(1,) * len(k), padding=pads, lhs_dilation=tuple(a["strides"]),
        rhs_dilation=tuple(a["dilations"]),
        dimension_numbers=(layout, "OI" + layout[2:], layout), feature_group_count=g,
    )
    if "bias" in params:
        y = y + jnp.reshape(params["bias"], (1, -1) + (1,) * len(k))
    return [apply_epilogue(node, y)]


@_register("MatMul")
def _matmul(node: Node, inputs, params):
    """numpy ``matmul`` of two activations (ONNX MatMul; weights become ``Gemm`` nodes)."""
    a, b = inputs
    if a.ndim > 2 and b.ndim > 2:
        a, b = align_ranks(a, b)
    return [jnp.matmul(a, b)]


@_register("LeakyRelu")
def _leaky_relu(node: Node, inputs, params):
    x = inputs[0]
    return [jnp.where(x >= 0, x, x * jnp.asarray(node.attrs["alpha"], x.dtype))]


@_register("PRelu")
def _prelu(node: Node, inputs, params):
    x, slope = align_ranks(*inputs)
    return [jnp.where(x >= 0, x, x * slope)]


@_register("HardSigmoid")
def _hard_sigmoid(node: Node, inputs, params):
    x = inputs[0]
    alpha = jnp.asarray(node.attrs["alpha"], x.dtype)
    beta = jnp.asarray(node.attrs["beta"], x.dtype)
    return [jnp.clip(alpha * x + beta, jnp.asarray(0, x.dtype), jnp.asarray(1, x.dtype))]


@_register("HardSwish")
def _hard_swish(node: Node, inputs, params):
    x = inputs[0]
    one_sixth = jnp.asarray(1.0 / 6.0, x.dtype)
    return [x * jnp.clip(x * one_sixth + jnp.asarray(0.5, x.dtype), jnp.asarray(0, x.dtype),
                         jnp.asarray(1, x.dtype))]


@_register("GlobalAveragePool")
def _global_avg_pool(node: Node, inputs, params):
    x = inputs[0]
    return [jnp.mean(x, axis=tuple(range(2, x.ndim)), keepdims=True)]


@_register("Concat")
def _concat(node: Node, inputs, params):
    return [jnp.concatenate(list(inputs), axis=int(node.attrs["axis"]))]


@_register("Split")
def _split(node: Node, inputs, params):
    x = inputs[0]
    bounds = np.cumsum(node.attrs["sizes"])[:-1].tolist()
    return list(jnp.split(x, bounds, axis=int(node.attrs["axis"])))


@_register("Slice")
def _slice(node: Node, inputs, params):
    """``x[start:end:step]`` per axis, bounds clamped by ONNX rules at import (end -1: none)."""
    x = inputs[0]
    index = [slice(None)] * x.ndim
    for ax, s, e, st in zip(node.attrs["axes"], node.attrs["starts"], node.attrs["ends"],
                            node.attrs["steps"]):
        index[ax] = slice(s, None if e < 0 else e, st)
    return [x[tuple(index)]]


@_register("Flatten")
def _flatten(node: Node, inputs, params):
    x = inputs[0]
    axis = int(node.attrs["axis"]) % (x.ndim + 1) if x.ndim else 0
    return [jnp.reshape(x, (int(np.prod(x.shape[:axis], dtype=np.int64)), -1))]


@_register("Squeeze")
def _squeeze(node: Node, inputs, params):
    return [jnp.squeeze(inputs[0], axis=tuple(node.attrs["axes"]))]


@_register("Unsqueeze")
def _unsqueeze(node: Node, inputs, params):
    return [jnp.expand_dims(inputs[0], axis=tuple(node.attrs["axes"]))]


@_register("Pad")
def _pad(node: Node, inputs, params):
    """ONNX Pad (constant, reflect, edge, wrap); negative pads crop."""
    x = inputs[0]
    pads = [tuple(p) for p in node.attrs["pads"]]
    crop = tuple(slice(-min(b, 0), x.shape[i] + min(e, 0) if e < 0 else None)
                 for i, (b, e) in enumerate(pads))
    x = x[crop]
    pads = [(max(b, 0), max(e, 0)) for b, e in pads]
    mode = node.attrs["mode"]
    if mode == "constant":
        return [jnp.pad(x, pads, constant_values=jnp.asarray(node.attrs["value"], x.dtype))]
    return [jnp.pad(x, pads, mode={"reflect": "reflect", "edge": "edge", "wrap": "wrap"}[mode])]


def _source_coords(out_len: int, in_len: int, scale: float, mode: str) -> np.ndarray:
    """Input coordinate of every output index (ONNX Resize ``coordinate_transformation_mode``)."""
    x = np.arange(out_len, dtype=np.float64)
    if mode == "asymmetric":
        return x / scale
    if mode == "half_pixel":
        return (x + 0.5) / scale - 0.5
    if mode == "pytorch_half_pixel":
        return (x + 0.5) / scale - 0.5 if out_len > 1 else np.zeros_like(x)
    if mode == "align_corners":  # the spec's length_resized is scale * in_len (a float)
        den = scale * in_len - 1
        return x * (in_len - 1) / den if out_len > 1 and den != 0 else np.zeros_like(x)
    if mode == "half_pixel_symmetric":
        adjustment = out_len / (scale * in_len)
        offset = in_len / 2.0 * (1.0 - adjustment)
        return offset + (x + 0.5) / scale - 0.5
    raise UnsupportedOpError(f"Resize coordinate_transformation_mode {mode!r} is not supported.")


def _nearest(c: np.ndarray, rule: str) -> np.ndarray:
    frac = c - np.floor(c)
    if rule == "floor":
        return np.floor(c)
    if rule == "ceil":
        return np.ceil(c)
    if rule == "round_prefer_floor":
        return np.where(frac == 0.5, np.floor(c), np.round(c))
    if rule == "round_prefer_ceil":
        return np.where(frac == 0.5, np.ceil(c), np.round(c))
    raise UnsupportedOpError(f"Resize nearest_mode {rule!r} is not supported.")


@_register("Resize")
def _resize(node: Node, inputs, params):
    """ONNX Resize, ``nearest`` or ``linear`` (separable per axis), static ``sizes``/``scales``.

    Nearest gathers the rounded source index; linear blends the two neighbours, with the source
    coordinate clamped to the input (edge values outside).
    """
    a = node.attrs
    x = inputs[0]
    for ax, (out_len, scale) in enumerate(zip(a["sizes"], a["scales"])):
        in_len = x.shape[ax]
        if out_len == in_len and scale == 1.0:
            continue
        c = _source_coords(out_len, in_len, scale, a["coordinate_transformation_mode"])
        if a["mode"] == "nearest":
            idx = np.clip(_nearest(c, a["nearest_mode"]), 0, in_len - 1).astype(np.int32)
            x = jnp.take(x, jnp.asarray(idx), axis=ax)
            continue
        c = np.clip(c, 0, in_len - 1)
        lo = np.floor(c).astype(np.int32)
        hi = np.minimum(lo + 1, in_len - 1)
        w = (c - lo).astype(np.float32)
        shape = [1] * x.ndim
        shape[ax] = out_len
        wj = jnp.asarray(w.reshape(shape), x.dtype)
        x0 = jnp.take(x, jnp.asarray(lo), axis=ax)
        x1 = jnp.take(x, jnp.asarray(hi), axis=ax)
        x = x0 + (x1 - x0) * wj
    return [x]


def _per_axis(v: jax.Array, x: jax.Array, axis: int) -> jax.Array:
    if v.ndim == 0 or x.ndim == 0:
        return v
    shape = [1] * x.ndim
    shape[axis % x.ndim] = -1
    return jnp.reshape(v, shape)


@_register("QuantizeLinear")
def _quantize_linear(node: Node, inputs, params):
    """``saturate(round_half_to_even(x / scale) + zero_point)`` cast to the integer type."""
    x, scale = inputs[0], inputs[1]
    dtype = np.dtype(node.attrs["dtype"])
    axis = int(node.attrs.get("axis", 1))
    scale = _per_axis(scale, x, axis).astype(x.dtype)
    q = jnp.round(true_divide(x, scale))  # correctly rounded, as ONNX and onnxruntime divide
    if len(inputs) > 2:
        q = q + _per_axis(inputs[2], x, axis).astype(q.dtype)
    info = np.iinfo(dtype)
    q = jnp.clip(q, jnp.asarray(info.min, q.dtype), jnp.asarray(info.max, q.dtype))
    return [q.astype(dtype)]


@_register("DequantizeLinear")
def _dequantize_linear(node: Node, inputs, params):
    """``(x - zero_point) * scale`` in float32."""
    x, scale = inputs[0], inputs[1]
    axis = int(node.attrs.get("axis", 1))
    xf = x.astype(jnp.float32)
    if len(inputs) > 2:
        xf = xf - _per_axis(inputs[2], x, axis).astype(jnp.float32)
    return [xf * _per_axis(scale, x, axis).astype(jnp.float32)]


@_register("Cast")
def _cast(node: Node, inputs, params):
    return [inputs[0].astype(np.dtype(node.attrs["to"]))]


@_register("CpuFallback")
def _cpu_fallback(node: Node, inputs, params):
    """An operator npujax does not implement, run on the host by ``onnx.reference``.

    The output shapes/dtypes come from ONNX shape inference at import (``attrs['output_types']``).
    Differentiation through it is not defined (it is a ``pure_callback``).
    """
    a = node.attrs
    out_specs = [jax.ShapeDtypeStruct(tuple(s), np.dtype(d)) for s, d in a["output_types"]]
    model_bytes = base64.b64decode(a["onnx_model"])

    def host(*arrays):
        from onnx.reference import ReferenceEvaluator

        sess = ReferenceEvaluator(model_bytes)
        feeds = {f"in{i}": np.asarray(v) for i, v in enumerate(arrays)}
        outs = sess.run(None, feeds)
        return tuple(np.asarray(o, s.dtype).reshape(s.shape) for o, s in zip(outs, out_specs))

    return list(jax.pure_callback(host, tuple(out_specs), *inputs))

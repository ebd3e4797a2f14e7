"""QuantizeLinear and DequantizeLinear as graph operators (an imported QDQ model's activations).

``QuantizeLinear``: ``saturate(round_half_to_even(x / scale) + zero_point)`` cast to the integer
type (the division correctly rounded, as ONNX and onnxruntime compute it); ``DequantizeLinear``:
``(x - zero_point) * scale`` in float32; per tensor or per ``axis``. Constant weights behind a
DequantizeLinear are folded to float32 at import. Source: the ONNX QuantizeLinear /
DequantizeLinear specification (opset 21). Integer types only.

Blocked ``DequantizeLinear`` (opset 21, ``block_size = B > 0``, as npujax's own per-block export
and int4 weight-only LLMs write it): ``scale`` and ``zero_point`` have ``x``'s rank with
``ceil(x.shape[axis] / B)`` entries along ``axis``, each applying to ``B`` consecutive indices of
``x`` along it; the last block is partial when ``B`` does not divide the axis
(:func:`expand_blocks`). Blocked QuantizeLinear is not imported.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import numpy as np

from npujax.errors import GraphError, UnsupportedOpError
from npujax.numerics.core import true_divide
from npujax.ops.registry import OpDef, onnx_importer, register

if TYPE_CHECKING:
    from npujax.ir.graph import Node

__all__ = ["expand_blocks", "check_blocks"]


def check_blocks(x_shape: Sequence[int], p_shape: Sequence[int], axis: int, block_size: int,
                 what: str) -> None:
    """Check a blocked Q/DQ parameter's shape: ``x``'s with ``ceil(x[axis] / block_size)``
    along ``axis``.

    Raises:
      GraphError: another shape, naming ``what`` and the shape expected.
    """
    want = list(x_shape)
    want[axis] = -(-int(x_shape[axis]) // block_size)
    if list(p_shape) != want:
        raise GraphError(f"{what} has shape {list(p_shape)}; with block_size {block_size} on "
                         f"axis {axis} of an input of shape {list(x_shape)} it must be {want}.")


def expand_blocks(p: Any, length: int, axis: int, block_size: int) -> Any:
    """A blocked parameter repeated ``block_size`` times along ``axis`` and cut to ``length``
    (the partial last block); numpy or JAX arrays.

    Example:
      >>> expand_blocks(np.array([1, 2]), 3, 0, 2)
      array([1, 1, 2])
    """
    xp = np if isinstance(p, np.ndarray) else jnp
    rep = xp.repeat(p, block_size, axis=axis)
    return xp.take(rep, xp.arange(length), axis=axis)


def _per_axis(v: jax.Array, x: jax.Array, axis: int) -> jax.Array:
    if v.ndim == 0 or x.ndim == 0:
        return v
    shape = [1] * x.ndim
    shape[axis % x.ndim] = -1
    return jnp.reshape(v, shape)


def _quantize_linear(node: Node, inputs: Sequence[jax.Array], params: Mapping[str, jax.Array]):
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


def _dequantize_linear(node: Node, inputs: Sequence[jax.Array],
                       params: Mapping[str, jax.Array]):
    x, scale = inputs[0], inputs[1]
    axis = int(node.attrs.get("axis", 1))
    xf = x.astype(jnp.float32)
    block = int(node.attrs.get("block_size", 0))
    if block:
        axis %= x.ndim
        s = expand_blocks(scale, x.shape[axis], axis, block).astype(jnp.float32)
        if len(inputs) > 2:
            xf = xf - expand_blocks(inputs[2], x.shape[axis], axis, block).astype(jnp.float32)
        return [xf * s]
    if len(inputs) > 2:
        xf = xf - _per_axis(inputs[2], x, axis).astype(jnp.float32)
    return [xf * _per_axis(scale, x, axis).astype(jnp.float32)]


@onnx_importer("QuantizeLinear")
def _import_quantize_linear(ctx: Any, n: Any, a: Mapping[str, Any]) -> None:
    if a.get("block_size", 0):
        raise UnsupportedOpError("blocked QuantizeLinear (block_size > 0) is not supported.")
    ctx.const(n.input[1], "y_scale")
    zp = ctx.opt_const(2, "y_zero_point")
    if zp is not None:
        dtype = zp.dtype
    elif "output_dtype" in a and a["output_dtype"]:
        dtype = ctx.np_dtype(a["output_dtype"])
    else:
        dtype = np.dtype(np.uint8)
    if np.dtype(dtype).kind not in "iu":
        raise UnsupportedOpError(f"QuantizeLinear to {np.dtype(dtype)} is not supported "
                                 "(integer types only).")
    ins = [n.input[0], n.input[1]] + ([n.input[2]] if zp is not None else [])
    ctx.emit("QuantizeLinear", ins, [n.output[0]],
             {"axis": int(a.get("axis", 1)), "dtype": str(np.dtype(dtype))})


@onnx_importer("DequantizeLinear")
def _import_dequantize_linear(ctx: Any, n: Any, a: Mapping[str, Any]) -> None:
    scale = ctx.const(n.input[1], "x_scale")
    zp = ctx.opt_const(2, "x_zero_point")
    ins = [n.input[0], n.input[1]] + ([n.input[2]] if zp is not None else [])
    attrs: dict[str, Any] = {"axis": int(a.get("axis", 1))}
    block = int(a.get("block_size", 0))
    if block:
        x_shape = ctx.shape(n.input[0])
        attrs["axis"] %= len(x_shape)
        for v, what in ((scale, "x_scale"), (zp, "x_zero_point")):
            if v is not None:
                check_blocks(x_shape, v.shape, attrs["axis"], block,
                             f"node {ctx.node_name!r} (DequantizeLinear): its {what}")
        attrs["block_size"] = block
    ctx.emit("DequantizeLinear", ins, [n.output[0]], attrs)


def _export(w: Any, node: Node) -> None:
    block = {"block_size": int(node.attrs["block_size"])} if node.attrs.get("block_size") else {}
    w.add(node.op, list(node.inputs), list(node.outputs), node.name,
          axis=int(node.attrs.get("axis", 1)), **block)


register(
    OpDef(name="QuantizeLinear", run=_quantize_linear, cost="vector", export=_export),
    OpDef(name="DequantizeLinear", run=_dequantize_linear, cost="vector", export=_export,
          integers=True),  # (integer codes in, float out: exactly as onnx.reference)
)

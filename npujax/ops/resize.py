"""ONNX Resize (``nearest`` and separable ``linear``) with static output sizes.

The source coordinate of every output index follows ``coordinate_transformation_mode``
(asymmetric, half_pixel, pytorch_half_pixel, align_corners, half_pixel_symmetric); nearest
gathers the rounded source index (``nearest_mode``), linear blends the two neighbours with the
coordinate clamped to the input. Source: https://onnx.ai/onnx/operators/onnx__Resize.html.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import numpy as np

from npujax.errors import GraphError, UnsupportedOpError
from npujax.ops.registry import OpDef, onnx_importer, register

if TYPE_CHECKING:
    from npujax.ir.graph import Node


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


def _resize(node: Node, inputs: Sequence[jax.Array], params: Mapping[str, jax.Array]):
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


@onnx_importer("Resize")
def _import_resize(ctx: Any, n: Any, a: Mapping[str, Any]) -> None:
    shape = ctx.shape(n.input[0])
    rank = len(shape)
    mode = a.get("mode", "nearest")
    if mode not in ("nearest", "linear"):
        raise UnsupportedOpError(f"Resize mode {mode!r} is not supported (nearest, linear are).")
    if a.get("antialias", 0):
        raise UnsupportedOpError("Resize with antialias=1 is not supported.")
    if a.get("keep_aspect_ratio_policy", "stretch") != "stretch":
        raise UnsupportedOpError("Resize keep_aspect_ratio_policy other than 'stretch' is not "
                                 "supported.")
    if ctx.opset < 11:
        scales, sizes = ctx.const(n.input[1], "scales"), None
        coord, nearest = "asymmetric", "floor"
    else:
        scales = ctx.opt_const(2, "scales")
        sizes = ctx.opt_const(3, "sizes")
        coord = a.get("coordinate_transformation_mode", "half_pixel")
        nearest = a.get("nearest_mode", "round_prefer_floor")
    if coord == "tf_crop_and_resize":
        raise UnsupportedOpError("Resize coordinate_transformation_mode 'tf_crop_and_resize' is "
                                 "not supported.")
    axes = [int(x) % rank for x in a.get("axes", range(rank))]
    full_scales, full_sizes = [1.0] * rank, list(shape)
    if sizes is not None and sizes.size:
        for ax, s in zip(axes, sizes.tolist()):
            full_sizes[ax] = int(s)
            full_scales[ax] = int(s) / shape[ax]
    elif scales is not None and scales.size:
        for ax, s in zip(axes, scales.tolist()):
            full_scales[ax] = float(s)
            full_sizes[ax] = int(math.floor(shape[ax] * float(s)))
    else:
        raise GraphError("Resize needs either scales or sizes.")
    ctx.emit("Resize", [n.input[0]], [n.output[0]], {
        "mode": mode, "coordinate_transformation_mode": coord, "nearest_mode": nearest,
        "scales": full_scales, "sizes": full_sizes,
    })


def _export_resize(w: Any, node: Node) -> None:
    a = node.attrs
    w.add("Resize", [*node.inputs, "", "", w.i64(node, "sizes", a["sizes"])],
          list(node.outputs), node.name, mode=a["mode"], nearest_mode=a["nearest_mode"],
          coordinate_transformation_mode=a["coordinate_transformation_mode"])


register(OpDef(name="Resize", run=_resize, cost="vector", export=_export_resize))

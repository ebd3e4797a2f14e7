"""Normalizations: BatchNormalization (running statistics), LayerNormalization, RMSNormalization.

ONNX semantics (https://onnx.ai/onnx/operators/):

* ``BatchNormalization``: ``y = (x - mean) / sqrt(var + epsilon) * scale + bias`` per channel
  on ``attrs['axis']``. After import or tracing, :func:`npujax.ir.fold_batchnorm` folds it into
  the preceding Conv/Gemm as NPU compilers do; an unfolded one runs on the vector unit.
* ``LayerNormalization`` (opset 17; Ba et al. 2016, arXiv:1607.06450): over the axes
  ``[axis, rank)``, ``y = (x - E[x]) / sqrt(Var[x] + epsilon) * scale + bias`` with the biased
  variance, computed in float32 (``stash_type`` 1); ``scale``/``bias`` broadcast to the
  normalized shape.
* ``RMSNormalization`` (opset 23; Zhang and Sennrich 2019, arXiv:1910.07467): ``y = x /
  sqrt(E[x^2] + epsilon) * scale`` over ``[axis, rank)``.

``scale`` and ``bias`` are params (trainable, role ``scale``/``bias``). On the NPU they run on the
vector unit: per element a few ALU operations (sums, subtraction, squares, the affine) and per
normalized row one reciprocal square root on the special-function unit
(:class:`~npujax.ops.registry.VectorWork`). Quantization schemes leave them in float (only the
GEMM layers' inputs and kernels are quantized).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from npujax.errors import UnsupportedOpError
from npujax.ops.registry import OpDef, VectorWork, onnx_importer, register

if TYPE_CHECKING:
    from npujax.ir.graph import Node


def _batchnorm(node: Node, inputs: Sequence[jax.Array], params: Mapping[str, jax.Array]):
    (x,) = inputs
    axis = node.attrs["axis"] % x.ndim
    shape = [1] * x.ndim
    shape[axis] = -1
    # "inv_std" = rsqrt(var + epsilon), when the caller computed it already (execute computes
    # every BatchNormalization's at once: one XLA kernel instead of one per node)
    inv = params["inv_std"] if "inv_std" in params else \
        lax.rsqrt(params["var"] + node.attrs["epsilon"])
    y = (x - params["mean"].reshape(shape)) * inv.reshape(shape)
    if "scale" in params:
        y = y * params["scale"].reshape(shape)
    if "bias" in params:
        y = y + params["bias"].reshape(shape)
    return [y]


@onnx_importer("BatchNormalization", weights=True)
def _import_batchnorm(ctx: Any, n: Any, a: Mapping[str, Any]) -> None:
    if a.get("training_mode", 0) or len(n.output) > 1 and any(n.output[1:]):
        raise UnsupportedOpError("BatchNormalization in training mode (running-statistics "
                                 "outputs) is not supported; export the model for inference.")
    roles = ("scale", "bias", "mean", "var")
    params = {r: ctx.const(t, r) for r, t in zip(roles, n.input[1:5])}
    ctx.emit("BatchNormalization", [n.input[0]], [n.output[0]],
             {"axis": 1, "epsilon": float(a.get("epsilon", 1e-5))}, params)


def _export_batchnorm(w: Any, node: Node) -> None:
    p = w.params[node.name]
    c = np.asarray(p["mean"]).shape[0]
    rank = len(w.graph.tensors[node.inputs[0]].shape)
    x, y, _ = w.to_channels_first(node, node.attrs["axis"] % rank, rank)
    ins = [x]
    for role, default in (("scale", 1.0), ("bias", 0.0), ("mean", None), ("var", None)):
        v = np.asarray(p[role], np.float32) if role in p else np.full((c,), default, np.float32)
        ins.append(w.init(f"{node.name}.{role}", v))
    w.add("BatchNormalization", ins, [y], node.name, epsilon=float(node.attrs["epsilon"]))
    w.flush()


# --------------------------------------------------------------------------------------------
# LayerNormalization, RMSNormalization


def _norm_axes(node: Node, ndim: int) -> tuple[int, ...]:
    return tuple(range(int(node.attrs["axis"]) % ndim, ndim))


def _affine(y: jax.Array, params: Mapping[str, jax.Array]) -> jax.Array:
    for role, fn in (("scale", jnp.multiply), ("bias", jnp.add)):
        if role in params:
            v = params[role].astype(y.dtype)
            y = fn(y, jnp.reshape(v, (1,) * (y.ndim - v.ndim) + v.shape))
    return y


def layer_norm(x: jax.Array, axes: tuple[int, ...], epsilon: float) -> jax.Array:
    """ONNX LayerNormalization without the affine part: ``(x - E[x]) / sqrt(Var[x] + eps)``.

    Args:
      x: float array of any shape.
      axes: the normalized axes (the trailing ``[axis, rank)``).
      epsilon: added to the biased variance.

    Returns:
      float array of ``x``'s shape and dtype, each normalized row with mean 0 and variance
      ``Var / (Var + eps)``.
    """
    xf = x.astype(jnp.float32)
    mean = jnp.mean(xf, axis=axes, keepdims=True)
    d = xf - mean
    var = jnp.mean(d * d, axis=axes, keepdims=True)
    return (d / jnp.sqrt(var + jnp.float32(epsilon))).astype(x.dtype)


def rms_norm(x: jax.Array, axes: tuple[int, ...], epsilon: float) -> jax.Array:
    """ONNX RMSNormalization without the scale: ``x / sqrt(E[x^2] + eps)`` over ``axes``."""
    xf = x.astype(jnp.float32)
    ms = jnp.mean(xf * xf, axis=axes, keepdims=True)
    return (xf / jnp.sqrt(ms + jnp.float32(epsilon))).astype(x.dtype)


def _layernorm(node: Node, inputs: Sequence[jax.Array], params: Mapping[str, jax.Array]):
    x = inputs[0]
    return [_affine(layer_norm(x, _norm_axes(node, x.ndim), node.attrs["epsilon"]), params)]


def _rmsnorm(node: Node, inputs: Sequence[jax.Array], params: Mapping[str, jax.Array]):
    x = inputs[0]
    return [_affine(rms_norm(x, _norm_axes(node, x.ndim), node.attrs["epsilon"]), params)]


def _norm_work(alu_per_elem: int):
    def work(node: Node, ins: Sequence[tuple[int, ...]], outs: Sequence[tuple[int, ...]]
             ) -> VectorWork:
        shape = ins[0]
        axis = int(node.attrs["axis"]) % len(shape)
        rows = int(np.prod(shape[:axis], dtype=np.int64))
        elems = int(np.prod(shape, dtype=np.int64))
        alu = alu_per_elem + ("scale" in node.params) + ("bias" in node.params)
        return VectorWork(alu * elems, rows)

    return work


def _import_norm(op: str, has_bias: bool):
    def importer(ctx: Any, n: Any, a: Mapping[str, Any]) -> None:
        if int(a.get("stash_type", 1)) != 1:
            raise UnsupportedOpError(f"{op} with stash_type={a['stash_type']} (statistics in "
                                     "another type than float32) is not supported.")
        params = {}
        scale = ctx.opt_const(1, "scale")
        if scale is not None:
            params["scale"] = scale
        bias = ctx.opt_const(2, "bias B") if has_bias else None
        if bias is not None:
            params["bias"] = bias
        rank = len(ctx.shape(n.input[0]))
        ctx.emit(op, [n.input[0]], [n.output[0]],
                 {"axis": int(a.get("axis", -1)) % rank,
                  "epsilon": float(a.get("epsilon", 1e-5))}, params)
        if len(n.output) > 1 and any(n.output[1:]):
            raise UnsupportedOpError(f"{op} with Mean/InvStdDev outputs (training) is not "
                                     "supported; export the model for inference.")

    return importer


onnx_importer("LayerNormalization", weights=True)(_import_norm("LayerNormalization", True))
onnx_importer("RMSNormalization", weights=True)(_import_norm("RMSNormalization", False))


def _norm_scale(w: Any, node: Node, role: str, default: float) -> str:
    x = w.graph.tensors[node.inputs[0]]
    axis = int(node.attrs["axis"]) % len(x.shape)
    if role in w.params.get(node.name, {}):
        v = np.asarray(w.params[node.name][role], np.float32)
    else:
        v = np.full(x.shape[axis:], default, np.float32)
    return w.init(f"{node.name}.{role}", v)


def _export_layernorm(w: Any, node: Node) -> None:
    ins = [node.inputs[0], _norm_scale(w, node, "scale", 1.0)]
    if "bias" in node.params:
        ins.append(_norm_scale(w, node, "bias", 0.0))
    w.add("LayerNormalization", ins, list(node.outputs), node.name,
          axis=int(node.attrs["axis"]), epsilon=float(node.attrs["epsilon"]))


def _export_rmsnorm(w: Any, node: Node) -> None:
    """Written out (RMSNormalization needs opset 23): Mul, ReduceMean, Add, Sqrt, Div, Mul."""
    x = node.inputs[0]
    rank = len(w.graph.tensors[x].shape)
    axes = list(range(int(node.attrs["axis"]) % rank, rank))
    t = {k: w.name(f"{node.name}/{k}") for k in ("sq", "ms", "eps", "rms", "norm")}
    w.add("Mul", [x, x], [t["sq"]], f"{node.name}/square")
    if w.opset >= 18:
        w.add("ReduceMean", [t["sq"], w.i64(node, "axes", axes)], [t["ms"]], f"{node.name}/mean",
              keepdims=1)
    else:
        w.add("ReduceMean", [t["sq"]], [t["ms"]], f"{node.name}/mean", axes=axes, keepdims=1)
    eps = w.init(f"{node.name}.epsilon", np.float32(node.attrs["epsilon"]))
    w.add("Add", [t["ms"], eps], [t["eps"]], f"{node.name}/add_eps")
    w.add("Sqrt", [t["eps"]], [t["rms"]], f"{node.name}/sqrt")
    w.add("Div", [x, t["rms"]], [t["norm"]], f"{node.name}/div")
    w.add("Mul", [t["norm"], _norm_scale(w, node, "scale", 1.0)], list(node.outputs),
          f"{node.name}/scale")


register(
    OpDef(name="BatchNormalization", run=_batchnorm, cost="vector", export=_export_batchnorm),
    OpDef(name="LayerNormalization", run=_layernorm, cost="vector", export=_export_layernorm,
          vector_work=_norm_work(7)),
    OpDef(name="RMSNormalization", run=_rmsnorm, cost="vector", export=_export_rmsnorm,
          vector_work=_norm_work(4)),
)

"""BatchNormalization with running statistics (inference form), ONNX semantics.

``y = (x - mean) / sqrt(var + epsilon) * scale + bias`` per channel on ``attrs['axis']``. After
import or tracing, :func:`npujax.fold_batchnorm` folds it into the preceding Conv/Gemm as NPU
compilers do; an unfolded one runs on the vector unit.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import jax
import numpy as np
from jax import lax

from npujax.errors import UnsupportedOpError
from npujax.ops.registry import OpDef, onnx_importer, register

if TYPE_CHECKING:
    from npujax.ir.graph import Node


def _batchnorm(node: Node, inputs: Sequence[jax.Array], params: Mapping[str, jax.Array]):
    (x,) = inputs
    axis = node.attrs["axis"] % x.ndim
    shape = [1] * x.ndim
    shape[axis] = -1
    inv = lax.rsqrt(params["var"] + node.attrs["epsilon"])
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


register(OpDef(name="BatchNormalization", run=_batchnorm, cost="vector",
               export=_export_batchnorm))

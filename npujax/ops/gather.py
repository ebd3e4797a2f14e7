"""Indexing and broadcasting: Gather (embeddings, token picks), Where (masks) and Expand.

ONNX semantics (https://onnx.ai/onnx/operators/):

* ``Gather(data, indices, axis)``: ``out[i..., j..., k...] = data[i..., indices[j...], k...]``
  with the output shape ``data.shape[:axis] + indices.shape + data.shape[axis+1:]``; negative
  indices count from the end. An embedding table is a param (role ``table``, trainable; the
  Flax tracer makes ``nnx.Embed``/``nn.Embed`` such a node, named by its module path) and the
  node then reads only ``indices``; otherwise ``data`` is the first input (an activation or a
  constant). A table may be quantized weight-only (``quant_spec(..., embedding_bits=b)``):
  symmetric per row (one scale per token's vector, the row-wise embedding quantization of
  FBGEMM and of LLM runtimes), exported as integer codes and a ``DequantizeLinear`` before the
  ``Gather``.
* ``Where(condition, X, Y)``: ``X`` where ``condition`` else ``Y``, multidirectional broadcasting
  (attention masks).
* ``Expand(input, shape)``: ``input`` broadcast with ``shape`` (bidirectionally: a 1 in ``shape``
  keeps the input's dimension); ``shape`` is static (``attrs['shape']``).

On the NPU they are data movement on the vector unit: one operation per output element. Gather
Expand acts on integer codes exactly (``codes="exact"``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import numpy as np

from npujax.ops.elementwise import align_ranks
from npujax.ops.registry import OpDef, onnx_importer, register

if TYPE_CHECKING:
    from npujax.ir.graph import Node

__all__ = ["onnx_gather"]


def onnx_gather(data: jax.Array, indices: jax.Array | np.ndarray, axis: int) -> jax.Array:
    """ONNX ``Gather``: ``jnp.take`` along ``axis`` with negative indices counted from the end.

    Args:
      data: array of rank r >= 1, any dtype.
      indices: integer array of any shape (values in ``[-data.shape[axis], data.shape[axis])``;
        out-of-range indices are clamped, where onnxruntime raises).
      axis: the gathered axis (negative counts from the end).

    Returns:
      array of shape ``data.shape[:axis] + indices.shape + data.shape[axis+1:]``, ``data``'s dtype.
    """
    axis = axis % data.ndim
    n = int(data.shape[axis])
    if isinstance(indices, np.ndarray):  # a constant: clamp before 64-bit values are narrowed
        indices = np.clip(indices, -n, n - 1)
    idx = jnp.asarray(indices).astype(jnp.int32)
    idx = jnp.where(idx < 0, idx + jnp.int32(n), idx)
    return jnp.take(data, idx, axis=axis, mode="clip")


def _gather(node: Node, inputs: Sequence[jax.Array], params: Mapping[str, jax.Array]):
    axis = int(node.attrs.get("axis", 0))
    if "table" in params:
        return [onnx_gather(params["table"], inputs[0], axis)]
    return [onnx_gather(inputs[0], inputs[1], axis)]


def _where(node: Node, inputs: Sequence[jax.Array], params: Mapping[str, jax.Array]):
    c, x, y = align_ranks(*inputs)
    return [jnp.where(c.astype(bool), x, y)]


def _expand(node: Node, inputs: Sequence[jax.Array], params: Mapping[str, jax.Array]):
    x = inputs[0]
    shape = np.broadcast_shapes(tuple(x.shape), tuple(int(d) for d in node.attrs["shape"]))
    return [jnp.broadcast_to(x, shape)]


@onnx_importer("Gather")
def _import_gather(ctx: Any, n: Any, a: Mapping[str, Any]) -> None:
    rank = len(ctx.shape(n.input[0]))
    ctx.emit("Gather", [n.input[0], n.input[1]], [n.output[0]],
             {"axis": int(a.get("axis", 0)) % rank})


@onnx_importer("Where")
def _import_where(ctx: Any, n: Any, a: Mapping[str, Any]) -> None:
    ctx.emit("Where", list(n.input[:3]), [n.output[0]])


@onnx_importer("Expand")
def _import_expand(ctx: Any, n: Any, a: Mapping[str, Any]) -> None:
    shape = [int(v) for v in ctx.const(n.input[1], "shape").reshape(-1).tolist()]
    ctx.emit("Expand", [n.input[0]], [n.output[0]], {"shape": shape})


def _export_gather(w: Any, node: Node) -> None:
    ins = list(node.inputs)
    if "table" in node.params:
        ins = [w.table(node), *ins]
    w.add("Gather", ins, list(node.outputs), node.name, axis=int(node.attrs.get("axis", 0)))


def _export_where(w: Any, node: Node) -> None:
    cond = node.inputs[0]
    if w.graph.tensors[cond].dtype != "bool":
        c = w.name(f"{cond}/bool")
        w.add("Cast", [cond], [c], f"{node.name}/cast", to=w.onnx_dtype(np.dtype(bool)))
        cond = c
    w.add("Where", [cond, *node.inputs[1:]], list(node.outputs), node.name)


def _export_expand(w: Any, node: Node) -> None:
    w.add("Expand", [*node.inputs, w.i64(node, "shape", node.attrs["shape"])],
          list(node.outputs), node.name)


register(
    OpDef(name="Gather", run=_gather, cost="vector", export=_export_gather, integers=True,
          index_inputs=(1,), weight_role="table",
          kernel_out_axis=lambda n: int(n.attrs.get("axis", 0)),
          kernel_in_axis=lambda n: 1 - int(n.attrs.get("axis", 0))),
    OpDef(name="Where", run=_where, cost="elementwise", export=_export_where,
          jax_primitives=(), integers=True),
    OpDef(name="Expand", run=_expand, cost="vector", export=_export_expand, codes="exact",
          integers=True),
)

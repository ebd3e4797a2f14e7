"""Reductions over static axes: ReduceSum, ReduceMax, ReduceMean (ONNX semantics, ``keepdims``),
and ArgMax / ArgMin over one axis.

ArgMax and ArgMin (https://onnx.ai/onnx/operators/onnx__ArgMax.html): the index of the first
largest (smallest) element along ``axis``, or of the last with ``select_last_index = 1``;
``keepdims`` keeps the axis as size 1. ONNX types the indices int64; without JAX's x64 mode
they are held as JAX's default integer, 32 bits, exactly (an index is below a dimension, and
dimensions are below 2**31), and exported as the int64 ArgMax followed by a Cast to that type.
Work: one comparison per input element (a segmentation model's ArgMax over 21 classes of a
513 x 513 map is 5.5 M comparisons, on the host CPU where the NPU has no such operator).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import numpy as np

from npujax.ops._onnx import attr_axes
from npujax.ops.registry import OpDef, VectorWork, onnx_importer, register

if TYPE_CHECKING:
    from npujax.ir.graph import Node

_FNS: dict[str, Callable[..., jax.Array]] = {
    "ReduceSum": jnp.sum, "ReduceMax": jnp.max, "ReduceMean": jnp.mean}


def _reduce(node: Node, inputs: Sequence[jax.Array], params: Mapping[str, jax.Array]):
    fn = _FNS[node.op]
    return [fn(inputs[0], axis=tuple(node.attrs["axes"]), keepdims=bool(node.attrs["keepdims"]))]


def _import_reduce(op: str):
    def importer(ctx: Any, n: Any, a: Mapping[str, Any]) -> None:
        rank = len(ctx.shape(n.input[0]))
        axes = attr_axes(ctx, n, a, 1)
        if not axes:
            if a.get("noop_with_empty_axes", 0):
                ctx.emit("Identity", [n.input[0]], [n.output[0]])
                return
            axes = list(range(rank))
        ctx.emit(op, [n.input[0]], [n.output[0]],
                 {"axes": sorted(x % rank for x in axes), "keepdims": int(a.get("keepdims", 1))})

    return importer


for _op in _FNS:
    onnx_importer(_op)(_import_reduce(_op))


def _export(w: Any, node: Node) -> None:
    a, ins, outs = node.attrs, list(node.inputs), list(node.outputs)
    # ReduceSum takes axes as an input since opset 13, ReduceMean/ReduceMax since 18
    if node.op == "ReduceSum" or w.opset >= 18:
        w.add(node.op, ins + [w.i64(node, "axes", a["axes"])], outs, node.name,
              keepdims=int(a["keepdims"]))
    else:
        w.add(node.op, ins, outs, node.name, axes=list(a["axes"]), keepdims=int(a["keepdims"]))


def _reduce_work(node: Node, ins: Sequence[tuple[int, ...]], outs: Sequence[tuple[int, ...]]
                 ) -> VectorWork:
    """One ALU operation per input element (each is added or compared once), plus ReduceMean's
    one multiply per output: a reduction's work is what it reads, not what it writes (a global
    mean over 7x7x1024 is 50,176 additions, not 1,024 operations)."""
    n_in = int(np.prod(ins[0], dtype=np.int64))
    n_out = int(np.prod(outs[0], dtype=np.int64)) if node.op == "ReduceMean" else 0
    return VectorWork(alu_ops=n_in + n_out, special_ops=0)


register(*(OpDef(name=name, run=_reduce, cost="vector", export=_export,
                 vector_work=_reduce_work) for name in _FNS))


def _arg(node: Node, inputs: Sequence[jax.Array], params: Mapping[str, jax.Array]):
    x, a = inputs[0], node.attrs
    axis = int(a["axis"])
    fn = jnp.argmax if node.op == "ArgMax" else jnp.argmin
    if a["select_last_index"]:  # the first index of the reversed axis is the last one
        idx = x.shape[axis] - 1 - fn(jnp.flip(x, axis), axis=axis)
    else:
        idx = fn(x, axis=axis)
    return [jnp.expand_dims(idx, axis) if a["keepdims"] else idx]


def _import_arg(ctx: Any, n: Any, a: Mapping[str, Any]) -> None:
    rank = len(ctx.shape(n.input[0]))
    ctx.emit(n.op_type, [n.input[0]], [n.output[0]], {
        "axis": int(a.get("axis", 0)) % rank, "keepdims": int(a.get("keepdims", 1)),
        "select_last_index": int(a.get("select_last_index", 0))})


def _export_arg(w: Any, node: Node) -> None:
    a, y = node.attrs, node.outputs[0]
    dtype = np.dtype(w.graph.tensors[y].dtype)
    out = y if dtype == np.int64 else w.name(f"{y}/int64")
    w.add(node.op, [node.inputs[0]], [out], node.name, axis=int(a["axis"]),
          keepdims=int(a["keepdims"]), select_last_index=int(a["select_last_index"]))
    if out != y:
        w.add("Cast", [out], [y], f"{node.name}/cast", to=w.onnx_dtype(dtype))


def _arg_work(node: Node, ins: Sequence[tuple[int, ...]], outs: Sequence[tuple[int, ...]]
              ) -> VectorWork:
    return VectorWork(alu_ops=int(np.prod(ins[0], dtype=np.int64)), special_ops=0)


for _op in ("ArgMax", "ArgMin"):
    onnx_importer(_op)(_import_arg)
    register(OpDef(name=_op, run=_arg, cost="vector", export=_export_arg,
                   vector_work=_arg_work, integers=True))

"""Reductions over static axes: ReduceSum, ReduceMax, ReduceMean (ONNX semantics, ``keepdims``)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp

from npujax.ops._onnx import attr_axes
from npujax.ops.registry import OpDef, onnx_importer, register

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


register(*(OpDef(name=name, run=_reduce, cost="vector", export=_export) for name in _FNS))

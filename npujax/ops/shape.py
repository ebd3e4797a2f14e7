"""Data-movement operators: Reshape, Flatten, Squeeze, Unsqueeze, Identity (relabel a buffer),
Transpose, Concat, Split, Slice, Pad and Cast (move or convert data).

Every attribute is static, resolved at import (ONNX) or trace (Flax) time: ``Reshape.shape`` uses
ONNX's 0 (copy the input dimension, used for the batch) and -1 (inferred); Slice bounds are
clamped by ONNX's rules (an end of -1 means "to the beginning" for negative steps); Pad supports
ONNX's constant, reflect, edge and wrap modes and negative (cropping) pads.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import numpy as np

from npujax.errors import GraphError, UnsupportedOpError
from npujax.ops._onnx import attr_axes, simple_importer
from npujax.ops.registry import OpDef, onnx_importer, register

if TYPE_CHECKING:
    from npujax.ir.graph import Node

_INT64_MIN = np.iinfo(np.int64).min


def _identity(node: Node, inputs: Sequence[jax.Array], params: Mapping[str, jax.Array]):
    return [inputs[0]]


def _reshape(node: Node, inputs: Sequence[jax.Array], params: Mapping[str, jax.Array]):
    x = inputs[0]
    shape = [x.shape[i] if s == 0 else s for i, s in enumerate(node.attrs["shape"])]
    return [jnp.reshape(x, shape)]


def _transpose(node: Node, inputs: Sequence[jax.Array], params: Mapping[str, jax.Array]):
    return [jnp.transpose(inputs[0], node.attrs["perm"])]


def _flatten(node: Node, inputs: Sequence[jax.Array], params: Mapping[str, jax.Array]):
    x = inputs[0]
    axis = int(node.attrs["axis"]) % (x.ndim + 1) if x.ndim else 0
    return [jnp.reshape(x, (int(np.prod(x.shape[:axis], dtype=np.int64)), -1))]


def _squeeze(node: Node, inputs: Sequence[jax.Array], params: Mapping[str, jax.Array]):
    return [jnp.squeeze(inputs[0], axis=tuple(node.attrs["axes"]))]


def _unsqueeze(node: Node, inputs: Sequence[jax.Array], params: Mapping[str, jax.Array]):
    return [jnp.expand_dims(inputs[0], axis=tuple(node.attrs["axes"]))]


def _concat(node: Node, inputs: Sequence[jax.Array], params: Mapping[str, jax.Array]):
    return [jnp.concatenate(list(inputs), axis=int(node.attrs["axis"]))]


def _split(node: Node, inputs: Sequence[jax.Array], params: Mapping[str, jax.Array]):
    x = inputs[0]
    bounds = np.cumsum(node.attrs["sizes"])[:-1].tolist()
    return list(jnp.split(x, bounds, axis=int(node.attrs["axis"])))


def _slice(node: Node, inputs: Sequence[jax.Array], params: Mapping[str, jax.Array]):
    """``x[start:end:step]`` per axis, bounds clamped by ONNX rules at import (end -1: none)."""
    x = inputs[0]
    index: list[slice] = [slice(None)] * x.ndim
    for ax, s, e, st in zip(node.attrs["axes"], node.attrs["starts"], node.attrs["ends"],
                            node.attrs["steps"]):
        index[ax] = slice(s, None if e < 0 else e, st)
    return [x[tuple(index)]]


def _pad(node: Node, inputs: Sequence[jax.Array], params: Mapping[str, jax.Array]):
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


def _cast(node: Node, inputs: Sequence[jax.Array], params: Mapping[str, jax.Array]):
    return [inputs[0].astype(np.dtype(node.attrs["to"]))]


# --------------------------------------------------------------------------------------------
# ONNX import


@onnx_importer("Reshape")
def _import_reshape(ctx: Any, n: Any, a: Mapping[str, Any]) -> None:
    shape = [int(v) for v in ctx.const(n.input[1], "shape").tolist()]
    if a.get("allowzero", 0) and 0 in shape:
        raise UnsupportedOpError("Reshape with allowzero=1 and a 0 in the shape is not supported.")
    ctx.emit("Reshape", [n.input[0]], [n.output[0]], {"shape": shape})


@onnx_importer("Flatten")
def _import_flatten(ctx: Any, n: Any, a: Mapping[str, Any]) -> None:
    rank = len(ctx.shape(n.input[0]))
    axis = int(a.get("axis", 1))
    ctx.emit("Flatten", [n.input[0]], [n.output[0]], {"axis": axis + rank if axis < 0 else axis})


@onnx_importer("Transpose")
def _import_transpose(ctx: Any, n: Any, a: Mapping[str, Any]) -> None:
    rank = len(ctx.shape(n.input[0]))
    perm = [int(p) for p in a.get("perm", list(range(rank))[::-1])]
    ctx.emit("Transpose", [n.input[0]], [n.output[0]], {"perm": perm})


@onnx_importer("Squeeze")
def _import_squeeze(ctx: Any, n: Any, a: Mapping[str, Any]) -> None:
    shape = ctx.shape(n.input[0])
    axes = attr_axes(ctx, n, a, 1)
    axes = [i for i, d in enumerate(shape) if d == 1] if axes is None else \
        sorted(x % len(shape) for x in axes)
    ctx.emit("Squeeze", [n.input[0]], [n.output[0]], {"axes": axes})


@onnx_importer("Unsqueeze")
def _import_unsqueeze(ctx: Any, n: Any, a: Mapping[str, Any]) -> None:
    rank = len(ctx.shape(n.input[0]))
    axes = attr_axes(ctx, n, a, 1) or []
    out_rank = rank + len(axes)
    ctx.emit("Unsqueeze", [n.input[0]], [n.output[0]],
             {"axes": sorted(x % out_rank for x in axes)})


@onnx_importer("Concat")
def _import_concat(ctx: Any, n: Any, a: Mapping[str, Any]) -> None:
    rank = len(ctx.shape(n.input[0]))
    ctx.emit("Concat", list(n.input), [n.output[0]], {"axis": int(a["axis"]) % rank})


@onnx_importer("Split")
def _import_split(ctx: Any, n: Any, a: Mapping[str, Any]) -> None:
    rank = len(ctx.shape(n.input[0]))
    axis = int(a.get("axis", 0)) % rank
    dim = ctx.shape(n.input[0])[axis]
    sizes = a.get("split")
    if sizes is None:
        s = ctx.opt_const(1, "split")
        sizes = None if s is None else s.tolist()
    if sizes is None:
        k = int(a.get("num_outputs", len(n.output)))
        chunk = -(-dim // k)
        sizes = [min(chunk, dim - i * chunk) for i in range(k)]
    ctx.emit("Split", [n.input[0]], list(n.output),
             {"axis": axis, "sizes": [int(v) for v in sizes]})


@onnx_importer("Slice")
def _import_slice(ctx: Any, n: Any, a: Mapping[str, Any]) -> None:
    shape = ctx.shape(n.input[0])
    if ctx.opset < 10:
        starts, ends = a["starts"], a["ends"]
        axes = a.get("axes", list(range(len(starts))))
        steps = [1] * len(starts)
    else:
        starts = ctx.const(n.input[1], "starts").tolist()
        ends = ctx.const(n.input[2], "ends").tolist()
        ax = ctx.opt_const(3, "axes")
        axes = list(range(len(starts))) if ax is None else ax.tolist()
        st = ctx.opt_const(4, "steps")
        steps = [1] * len(starts) if st is None else st.tolist()
    rs, re_, rax, rst = [], [], [], []
    for s, e, ax, step in zip(starts, ends, axes, steps):
        ax = int(ax) % len(shape)
        d = shape[ax]
        if step == 0:
            raise GraphError("Slice step must not be 0.")
        s = s + d if s < 0 else s
        e = e + d if e < 0 else e
        if step > 0:
            s, e = min(max(s, 0), d), min(max(e, 0), d)
        else:
            s, e = min(max(s, 0), d - 1), min(max(e, -1), d - 1)
        rax.append(ax)
        rs.append(int(s))
        re_.append(int(e))
        rst.append(int(step))
    ctx.emit("Slice", [n.input[0]], [n.output[0]],
             {"axes": rax, "starts": rs, "ends": re_, "steps": rst})


@onnx_importer("Pad")
def _import_pad(ctx: Any, n: Any, a: Mapping[str, Any]) -> None:
    rank = len(ctx.shape(n.input[0]))
    if ctx.opset < 11:
        pads, value = list(a["pads"]), float(a.get("value", 0.0))
        axes = list(range(rank))
    else:
        pads = ctx.const(n.input[1], "pads").tolist()
        v = ctx.opt_const(2, "constant_value")
        value = 0 if v is None else v.item()
        ax = ctx.opt_const(3, "axes")
        axes = list(range(rank)) if ax is None else [int(x) % rank for x in ax.tolist()]
    pairs = [[0, 0] for _ in range(rank)]
    for i, ax in enumerate(axes):
        pairs[ax] = [int(pads[i]), int(pads[i + len(axes)])]
    ctx.emit("Pad", [n.input[0]], [n.output[0]],
             {"pads": pairs, "mode": a.get("mode", "constant"), "value": value})


@onnx_importer("Cast")
def _import_cast(ctx: Any, n: Any, a: Mapping[str, Any]) -> None:
    dtype = ctx.np_dtype(int(a["to"]))
    if dtype.kind not in "iufb":
        raise UnsupportedOpError(f"Cast to {dtype} is not supported.")
    ctx.emit("Cast", [n.input[0]], [n.output[0]], {"to": str(dtype)})


onnx_importer("Identity")(simple_importer("Identity"))


# --------------------------------------------------------------------------------------------
# ONNX export


def _export_identity(w: Any, node: Node) -> None:
    w.add("Identity", list(node.inputs), list(node.outputs), node.name)


def _export_reshape(w: Any, node: Node) -> None:
    w.add("Reshape", [*node.inputs, w.i64(node, "shape", node.attrs["shape"])],
          list(node.outputs), node.name)


def _export_flatten(w: Any, node: Node) -> None:
    w.add("Flatten", list(node.inputs), list(node.outputs), node.name,
          axis=int(node.attrs["axis"]))


def _export_transpose(w: Any, node: Node) -> None:
    w.add("Transpose", list(node.inputs), list(node.outputs), node.name,
          perm=list(node.attrs["perm"]))


def _export_axes(w: Any, node: Node) -> None:  # Squeeze, Unsqueeze (axes as an input)
    w.add(node.op, [*node.inputs, w.i64(node, "axes", node.attrs["axes"])],
          list(node.outputs), node.name)


def _export_concat(w: Any, node: Node) -> None:
    w.add("Concat", list(node.inputs), list(node.outputs), node.name,
          axis=int(node.attrs["axis"]))


def _export_split(w: Any, node: Node) -> None:
    w.add("Split", [*node.inputs, w.i64(node, "split", node.attrs["sizes"])],
          list(node.outputs), node.name, axis=int(node.attrs["axis"]))


def _export_slice(w: Any, node: Node) -> None:
    a = node.attrs
    ends = [e if e >= 0 else _INT64_MIN for e in a["ends"]]
    w.add("Slice", [*node.inputs, w.i64(node, "starts", a["starts"]), w.i64(node, "ends", ends),
                    w.i64(node, "axes", a["axes"]), w.i64(node, "steps", a["steps"])],
          list(node.outputs), node.name)


def _export_pad(w: Any, node: Node) -> None:
    a = node.attrs
    pads = [p[0] for p in a["pads"]] + [p[1] for p in a["pads"]]
    extra = []
    if a["mode"] == "constant":
        extra = [w.init(f"{node.name}.value", a["value"],
                        np.dtype(w.graph.tensors[node.inputs[0]].dtype))]
    w.add("Pad", [*node.inputs, w.i64(node, "pads", pads), *extra], list(node.outputs),
          node.name, mode=a["mode"])


def _export_cast(w: Any, node: Node) -> None:
    w.add("Cast", list(node.inputs), list(node.outputs), node.name,
          to=w.onnx_dtype(np.dtype(node.attrs["to"])))


register(
    OpDef(name="Identity", run=_identity, cost="free", export=_export_identity,
          unary=lambda x: x, codes="exact", integers=True),
    OpDef(name="Reshape", run=_reshape, cost="free", export=_export_reshape, codes="exact",
          integers=True),
    OpDef(name="Flatten", run=_flatten, cost="free", export=_export_flatten, integers=True),
    OpDef(name="Squeeze", run=_squeeze, cost="free", export=_export_axes, integers=True),
    OpDef(name="Unsqueeze", run=_unsqueeze, cost="free", export=_export_axes, integers=True),
    OpDef(name="Transpose", run=_transpose, cost="vector", export=_export_transpose,
          codes="exact", integers=True),
    OpDef(name="Concat", run=_concat, cost="vector", export=_export_concat, integers=True),
    OpDef(name="Split", run=_split, cost="vector", export=_export_split, integers=True),
    OpDef(name="Slice", run=_slice, cost="vector", export=_export_slice, integers=True),
    OpDef(name="Pad", run=_pad, cost="vector", export=_export_pad),
    OpDef(name="Cast", run=_cast, cost="vector", export=_export_cast, integers=True),
)

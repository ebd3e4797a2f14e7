"""Comparisons: Equal, Less, Greater, LessOrEqual, GreaterOrEqual (a boolean tensor out).

ONNX semantics (https://onnx.ai/onnx/operators/onnx__Equal.html and its siblings): both
operands of one type (integers, floats, and booleans for ``Equal``), numpy (multidirectional)
broadcasting, ``bool`` out. Integers are compared as integers, exactly: ``Equal(16777217,
16777216)`` is false, as in onnxruntime, where a comparison through float32 would call them
equal. Floats follow IEEE 754 (NaN compares unequal and unordered). These are what control
logic in exported models writes (Silero VAD's ``Equal`` on a sampling rate, masks of valid
positions); one ALU operation per output element on the vector unit (``elementwise``).

Without JAX's x64 mode a 64-bit integer is held as 32 bits: a constant operand whose values do
not fit is refused at import (never compared wrapped).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import numpy as np

from npujax.errors import UnsupportedOpError
from npujax.ops.elementwise import align_ranks
from npujax.ops.registry import OpDef, onnx_importer, register

if TYPE_CHECKING:
    from npujax.ir.graph import Node


def _compare(fn: Callable[[jax.Array, jax.Array], jax.Array]):
    def run(node: Node, inputs: Sequence[jax.Array], params: Mapping[str, jax.Array]):
        a, b = align_ranks(*inputs)
        if a.dtype != b.dtype:  # one ONNX type, held alike (int64 as JAX's default integer)
            b = b.astype(a.dtype)
        return [fn(a, b)]

    return run


def _import(ctx: Any, n: Any, a: Mapping[str, Any]) -> None:
    for t in n.input[:2]:
        c = ctx.consts.get(t)
        dtype = c.dtype if c is not None else np.dtype(ctx.types[t].dtype)
        if dtype.kind not in "iufb":
            raise UnsupportedOpError(f"{n.op_type} of {dtype} tensors ({t!r}) is not supported "
                                     "(numbers and booleans only).")
        if (c is not None and c.dtype.kind in "iu" and c.dtype.itemsize == 8 and c.size
                and not jax.config.read("jax_enable_x64")
                and (c.min() < np.iinfo(np.int32).min or c.max() > np.iinfo(np.int32).max)):
            raise UnsupportedOpError(
                f"node {ctx.node_name!r} ({n.op_type}) compares with the int64 constant {t!r}, "
                "whose values do not fit the 32 bits JAX holds it in unless 64-bit types are on "
                "(jax.config.update('jax_enable_x64', True)).")
    ctx.emit(n.op_type, [n.input[0], n.input[1]], [n.output[0]])


def _export(w: Any, node: Node) -> None:
    w.add(node.op, list(node.inputs), list(node.outputs), node.name)


for _name, _fn in (("Equal", jnp.equal), ("Less", jnp.less), ("Greater", jnp.greater),
                   ("LessOrEqual", jnp.less_equal), ("GreaterOrEqual", jnp.greater_equal)):
    register(OpDef(name=_name, run=_compare(_fn), cost="elementwise", export=_export,
                   integers=True))
    onnx_importer(_name)(_import)

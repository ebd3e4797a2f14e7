"""Binary elementwise operators with ONNX (numpy) broadcasting: Add, Sub, Mul, Div, Max, Min.

They run on the NPU's vector unit and fuse into the output stage of the GEMM that produced their
inputs (cost class ``elementwise``). ``Div`` of floats is correctly rounded, as onnxruntime's is
(XLA alone would multiply by the reciprocal of a broadcast divisor; see
:func:`npujax.numerics.core.true_divide`); of integers it truncates toward zero and keeps the
integer type, as ONNX (C) does. All six keep ONNX's integer semantics (``integers=True``).
``Max``/``Min`` are variadic as in ONNX.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp

from npujax.numerics.core import true_divide
from npujax.ops._onnx import simple_importer
from npujax.ops.registry import OpDef, onnx_importer, register

if TYPE_CHECKING:
    from npujax.ir.graph import Node

__all__ = ["align_ranks"]


def align_ranks(*xs: jax.Array) -> list[jax.Array]:
    """Prepend unit axes so all operands have the same rank (ONNX/numpy broadcasting, explicit)."""
    rank = max(jnp.ndim(x) for x in xs)
    return [jnp.reshape(x, (1,) * (rank - jnp.ndim(x)) + tuple(jnp.shape(x))) for x in xs]


def _divide(a: jax.Array, b: jax.Array) -> jax.Array:
    """ONNX Div: correctly rounded for floats, as onnxruntime's; for integers the C division
    (truncation toward zero), in the operands' integer type."""
    dtype = jnp.result_type(a, b)
    if not jnp.issubdtype(dtype, jnp.floating):
        shape = jnp.broadcast_shapes(jnp.shape(a), jnp.shape(b))
        return jax.lax.div(jnp.broadcast_to(jnp.asarray(a, dtype), shape),
                           jnp.broadcast_to(jnp.asarray(b, dtype), shape))
    shape = jnp.broadcast_shapes(jnp.shape(a), jnp.shape(b))
    return true_divide(jnp.broadcast_to(jnp.asarray(a, dtype), shape), b)


def _binary(fn: Callable[[jax.Array, jax.Array], jax.Array]):
    def run(node: Node, inputs: Sequence[jax.Array], params: Mapping[str, jax.Array]):
        return [functools.reduce(fn, align_ranks(*inputs))]

    return run


def _export(w: Any, node: Node) -> None:
    w.add(node.op, list(node.inputs), list(node.outputs), node.name)


for _name, _fn, _prim in (("Add", jnp.add, "add"), ("Sub", jnp.subtract, "sub"),
                          ("Mul", jnp.multiply, "mul"), ("Div", _divide, "div"),
                          ("Max", jnp.maximum, "max"), ("Min", jnp.minimum, "min")):
    register(OpDef(name=_name, run=_binary(_fn), cost="elementwise", export=_export,
                   jax_primitives=(_prim,), integers=True))
    onnx_importer(_name)(simple_importer(_name))

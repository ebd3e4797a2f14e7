"""Elementwise math: Exp, Log, Sqrt, Reciprocal, Neg, Abs, Erf (unary) and Pow (binary).

These are what transformer blocks and exporters write around the GEMMs (GELU's ``Erf``,
LayerNorm's ``Pow``/``Sqrt``/``Reciprocal``, softmax written out with ``Exp``). Like ``Add`` and
``Mul`` they run on the NPU's vector unit and fuse into the output stage of the GEMM that
produced their input (cost class ``elementwise``) when a preset lists them in
``[ops] supported``; otherwise they fall back to the host CPU.

Semantics are those of the ONNX operators (https://onnx.ai/onnx/operators/) with IEEE 754
special values, as onnxruntime and ``onnx.reference`` compute them:

============  ===========  ===================================================================
operator      y            special values
============  ===========  ===================================================================
Exp           e^x          exp(-inf) = 0, exp(inf) = inf, overflow (x > 88.72 in float32) = inf
Log           ln x         log(+-0) = -inf, log(x < 0) = NaN, log(inf) = inf
Sqrt          sqrt(x)      sqrt(-0) = -0, sqrt(x < 0) = NaN
Reciprocal    1 / x        1 / +-0 = +-inf, 1 / +-inf = +-0 (correctly rounded division)
Neg           -x           also integers (two's complement: -min wraps to min)
Abs           abs(x)       also integers (abs(min) wraps to min)
Erf           erf(x)       erf(+-inf) = +-1
Pow           x^y          C ``pow``: x^(+-0) = 1 and 1^y = 1 even for NaN; x < 0 with a
                           non-integer y is NaN; 0^(y < 0) = inf; (-inf)^3 = -inf
============  ===========  ===================================================================

XLA on the CPU flushes subnormal float32 values to zero (as NPU vector units commonly do) where
onnxruntime keeps them: ``Exp(-100)`` is 0, not 3.7e-44; results of normal size are the same.

``Pow`` broadcasts its operands multidirectionally (numpy rules) and its result has the type of
the base ``X``; the exponent ``Y`` may be another type (ONNX ``T1``) and a run-time tensor or a
constant. A float base is raised in the wider of the two float types (an integer exponent is
converted to the base's type, exact below 2^24). An integer base follows onnxruntime, which
computes ``pow`` in double and truncates toward zero: integer exponents give the exact integer
power (``x^(y < 0)`` truncates to 0 except for ``x = +-1``), float exponents truncate the
float32 power (exact while it is below 2^24). A power that is not a finite number (``0^(y < 0)``,
``x < 0`` with a non-integer ``y``) has no integer value -- C leaves the conversion undefined --
and is the type's minimum, as onnxruntime gives on x86.

The JAX primitives ``exp``, ``log``, ``sqrt``, ``neg``, ``abs``, ``erf`` and ``pow`` are these
operators one to one, so :func:`npujax.trace_flax` maps them onto named nodes. (``rsqrt``,
``integer_pow``, ``square`` and ``erfc`` are not one ONNX operator each and stay JAX primitives.)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
from jax import lax

from npujax.ops._onnx import simple_importer
from npujax.ops.elementwise import align_ranks
from npujax.ops.registry import OpDef, onnx_importer, register

if TYPE_CHECKING:
    from npujax.ir.graph import Node

__all__ = ["onnx_pow"]


def _reciprocal(x: jax.Array) -> jax.Array:
    """ONNX Reciprocal: ``1 / x``, correctly rounded (a true division, not an approximation)."""
    return lax.div(jnp.ones_like(x), x)


def _int_pow(x: jax.Array, y: jax.Array) -> jax.Array:
    """Integer base and integer exponent: the exact power; for ``y < 0`` the truncated one
    (``1`` for ``x = 1``, ``+-1`` for ``x = -1``, the type's minimum for ``x = 0``, else 0)."""
    y = y.astype(x.dtype)
    pos = jnp.power(x, jnp.maximum(y, jnp.zeros_like(y)))
    one, zero = jnp.ones_like(x), jnp.zeros_like(x)
    lowest = jnp.full_like(x, jnp.iinfo(x.dtype).min)
    odd = (y % 2) != 0
    neg = jnp.where(x == 1, one, jnp.where(x == -1, jnp.where(odd, -one, one),
                                           jnp.where(x == 0, lowest, zero)))
    return jnp.where(y >= 0, pos, neg)


def onnx_pow(x: jax.Array, y: jax.Array) -> jax.Array:
    """ONNX ``Pow``: ``x ** y`` with multidirectional broadcasting, in ``x``'s dtype.

    Args:
      x: the base, any shape; float or integer dtype (ONNX ``T``).
      y: the exponent, any shape broadcastable with ``x``; float or integer dtype (ONNX ``T1``),
        independent of ``x``'s.

    Returns:
      ``x ** y`` of shape ``broadcast(x.shape, y.shape)`` and ``x``'s dtype. Special values
      follow C ``pow`` (see the module docstring).

    Example:
      >>> onnx_pow(jnp.asarray([[-2.0], [4.0]]), jnp.asarray([3, -1]))  # doctest: +SKIP
      Array([[-8. , -0.5 ], [64. ,  0.25]], dtype=float32)

    References:
      ONNX ``Pow`` (opset 15), https://onnx.ai/onnx/operators/onnx__Pow.html.
    """
    x, y = align_ranks(jnp.asarray(x), jnp.asarray(y))
    shape = jnp.broadcast_shapes(x.shape, y.shape)
    x, y = jnp.broadcast_to(x, shape), jnp.broadcast_to(y, shape)
    if jnp.issubdtype(x.dtype, jnp.floating):
        wide = (jnp.promote_types(x.dtype, y.dtype) if jnp.issubdtype(y.dtype, jnp.floating)
                else x.dtype)
        return lax.pow(x.astype(wide), y.astype(wide)).astype(x.dtype)
    if jnp.issubdtype(y.dtype, jnp.integer):
        return _int_pow(x, y)
    f = jnp.promote_types(y.dtype, jnp.float32)
    r = lax.pow(x.astype(f), y.astype(f))
    lowest = jnp.full_like(x, jnp.iinfo(x.dtype).min)
    return jnp.where(jnp.isfinite(r), jnp.trunc(r).astype(x.dtype), lowest)


def _unary(fn: Callable[[jax.Array], jax.Array]):
    def run(node: Node, inputs: Sequence[jax.Array], params: Mapping[str, jax.Array]):
        return [fn(inputs[0])]

    return run


def _pow(node: Node, inputs: Sequence[jax.Array], params: Mapping[str, jax.Array]):
    return [onnx_pow(inputs[0], inputs[1])]


def _export(w: Any, node: Node) -> None:
    w.add(node.op, list(node.inputs), list(node.outputs), node.name)


#: name, function of one array, JAX primitive (None: not one primitive).
_UNARY: tuple[tuple[str, Callable[[jax.Array], jax.Array], str | None], ...] = (
    ("Exp", jnp.exp, "exp"),
    ("Log", jnp.log, "log"),
    ("Sqrt", jnp.sqrt, "sqrt"),
    ("Reciprocal", _reciprocal, None),  # JAX writes 1/x as integer_pow(x, -1) or a div
    ("Neg", jnp.negative, "neg"),
    ("Abs", jnp.abs, "abs"),
    ("Erf", lax.erf, "erf"),
)

for _name, _fn, _prim in _UNARY:
    # Neg and Abs wrap in two's complement on integers, as ONNX (C) does; the others take floats
    register(OpDef(name=_name, run=_unary(_fn), cost="elementwise", export=_export, unary=_fn,
                   jax_primitives=(_prim,) if _prim else (), integers=_name in ("Neg", "Abs")))
    onnx_importer(_name)(simple_importer(_name))
register(OpDef(name="Pow", run=_pow, cost="elementwise", export=_export,
               jax_primitives=("pow",), integers=True))  # onnx_pow: exact integer powers
onnx_importer("Pow")(simple_importer("Pow"))

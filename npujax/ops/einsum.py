"""Einsum of two operands on the MAC array (ONNX Einsum, the equations transformers use).

An equation such as ``bhqd,bhkd->bhqk`` (attention scores), ``bhqk,bhkd->bhqd`` (scores times
values), ``bsd,df->bsf`` (a projection) or ``...ij,...jk->...ik`` is a batched GEMM: letters in
both operands and the output are batch dimensions (``groups``), letters in both operands but not
the output are contracted (``K``), and the letters of one operand that the output keeps are its
free dimensions (``M`` for the first, ``N`` for the second). The importer resolves ``...`` and an
implicit output (ONNX: the letters used once, in alphabetical order) against the static shapes,
so ``attrs['equation']`` is always explicit. Equations with a letter summed within one operand,
repeated letters in an operand (diagonals) or other than two operands are not imported (a
one-operand permutation becomes a ``Transpose``).

Source: ONNX Einsum (opset 12), https://onnx.ai/onnx/operators/onnx__Einsum.html.
"""

from __future__ import annotations

import string
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import numpy as np

from npujax.errors import UnsupportedOpError
from npujax.ops.registry import ArrayWork, OpDef, onnx_importer, register

if TYPE_CHECKING:
    from npujax.ir.graph import Node

__all__ = ["canonical_equation", "einsum_dims"]


def canonical_equation(equation: str, shapes: Sequence[Sequence[int]]) -> str:
    """``equation`` with ``...`` replaced by letters and the output made explicit.

    Args:
      equation: an ONNX/numpy einsum equation (spaces allowed).
      shapes: the static shapes of the operands.

    Returns:
      the explicit equation, e.g. ``"abij,abjk->abik"`` for ``"...ij,...jk"`` on rank-4 operands.

    Raises:
      UnsupportedOpError: an operand's rank does not match its term, or there are no letters left
        to name the ``...`` dimensions.
    """
    eq = equation.replace(" ", "")
    lhs, arrow, out = eq.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(shapes):
        raise UnsupportedOpError(f"Einsum equation {equation!r} has {len(terms)} operands, "
                                 f"got {len(shapes)}.")
    used = set(eq) - set(".,->")
    free = [c for c in string.ascii_letters if c not in used]
    n_ell = max((len(s) - (len(t) - 3) for t, s in zip(terms, shapes) if "..." in t), default=0)
    if n_ell > len(free):
        raise UnsupportedOpError(f"Einsum equation {equation!r}: too many '...' dimensions.")
    ell = "".join(free[:n_ell])
    new_terms = []
    for t, s in zip(terms, shapes):
        if "..." in t:
            k = len(s) - (len(t) - 3)
            t = t.replace("...", ell[n_ell - k:] if k else "")
        if len(t) != len(s):
            raise UnsupportedOpError(f"Einsum equation {equation!r}: term {t!r} does not match "
                                     f"an operand of rank {len(s)}.")
        new_terms.append(t)
    if arrow:
        out = out.replace("...", ell)
    else:
        letters = "".join(new_terms)
        out = ell + "".join(sorted(c for c in set(letters) if letters.count(c) == 1
                                   and c not in ell))
    return ",".join(new_terms) + "->" + out


def einsum_dims(equation: str) -> tuple[str, str, str, str]:
    """``(batch, lhs_free, contracted, rhs_free)`` letters of an explicit two-operand equation.

    Raises:
      UnsupportedOpError: not two operands, a repeated letter within a term, or a letter summed
        within a single operand.
    """
    lhs, _, out = equation.partition("->")
    terms = lhs.split(",")
    if len(terms) != 2:
        raise UnsupportedOpError(f"Einsum {equation!r}: only two-operand equations run on the "
                                 "MAC array.")
    a, b = terms
    for t in (a, b, out):
        if len(set(t)) != len(t):
            raise UnsupportedOpError(f"Einsum {equation!r}: a letter repeated within one term "
                                     "(a diagonal) is not supported.")
    lone = [c for c in a + b if c not in out and not (c in a and c in b)]
    if lone:
        raise UnsupportedOpError(f"Einsum {equation!r}: letters {lone} are summed within one "
                                 "operand; write that reduction as a ReduceSum.")
    batch = "".join(c for c in out if c in a and c in b)
    lf = "".join(c for c in a if c in out and c not in b)
    k = "".join(c for c in a if c in b and c not in out)
    rf = "".join(c for c in b if c in out and c not in a)
    return batch, lf, k, rf


def _einsum(node: Node, inputs: Sequence[jax.Array], params: Mapping[str, jax.Array]):
    a, b = inputs
    return [jnp.einsum(node.attrs["equation"], a, b)]


def _einsum_work(node: Node, ins: Sequence[tuple[int, ...]], outs: Sequence[tuple[int, ...]],
                 align: int) -> ArrayWork:
    """``groups`` GEMMs ``[M, K] x [K, N]`` (batch, first-operand, contracted, second-operand
    letters); the second operand is the array's stationary operand."""
    eq = node.attrs["equation"]
    batch, lf, kk, rf = einsum_dims(eq)
    ta, tb = eq.partition("->")[0].split(",")
    size = {c: int(d) for t, s in zip((ta, tb), ins) for c, d in zip(t, s)}
    prod = lambda cs: int(np.prod([size[c] for c in cs], dtype=np.int64))  # noqa: E731
    G, M, K, N = prod(batch), prod(lf), prod(kk), prod(rf)
    return ArrayWork(M, K, N, G, G * M * K * N, G * K * N, 0)


@onnx_importer("Einsum")
def _import_einsum(ctx: Any, n: Any, a: Mapping[str, Any]) -> None:
    shapes = [ctx.shape(t) for t in n.input]
    eq = canonical_equation(str(a["equation"]), shapes)
    if len(shapes) == 1:
        src, out = eq.split("->")
        if sorted(src) != sorted(out) or len(set(src)) != len(src):
            raise UnsupportedOpError(f"one-operand Einsum {eq!r} that is not a permutation.")
        ctx.emit("Transpose", [n.input[0]], [n.output[0]], {"perm": [src.index(c) for c in out]})
        return
    einsum_dims(eq)  # refuses what the array cannot run
    ctx.emit("Einsum", list(n.input), [n.output[0]], {"equation": eq})


def _export_einsum(w: Any, node: Node) -> None:
    a, b = node.inputs
    w.add("Einsum", [w.qdq_input(node, a), w.qdq_operand(node, b)], list(node.outputs),
          node.name, equation=node.attrs["equation"])


register(OpDef(name="Einsum", run=_einsum, cost="array", export=_export_einsum,
               array_work=_einsum_work, quantized_operands=True))

"""Activations and normalising functions: Relu, Relu6, Sigmoid, Tanh (fusible into a GEMM's
output stage), Clip, LeakyRelu, PRelu, HardSigmoid, HardSwish, Gelu and Softmax.

Semantics follow ONNX: ``Clip`` is ``min(max(x, lo), hi)`` (so ``hi`` wins when ``lo > hi``),
``HardSigmoid`` is ``clip(alpha x + beta, 0, 1)``, ``HardSwish`` is ``x * clip(x/6 + 1/2, 0, 1)``,
``Softmax`` with ``coerce_2d`` (opset < 13) normalises over the whole trailing block
``[prod(shape[:axis]), rest]``. ``Relu6`` (``clip(x, 0, 6)``) has no ONNX operator and exports
as ``Clip``. ``Gelu`` (opset 20; Hendrycks and Gimpel 2016, arXiv:1606.08415) is
``x/2 (1 + erf(x/sqrt 2))`` (``approximate="none"``) or ``x/2 (1 + tanh(sqrt(2/pi) (x + 0.044715
x^3)))`` (``"tanh"``); it exports written out (Erf/Tanh, Mul, Add) so the model keeps opset 17.

On the vector unit, Softmax costs per element a max, a subtraction, an exponential (special
function), a sum and a multiplication, plus one reciprocal per row; Gelu an erf or tanh and a few
multiply-adds per element (:class:`~npujax.ops.registry.VectorWork`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import numpy as np

from npujax.errors import UnsupportedOpError
from npujax.ops._onnx import simple_importer
from npujax.ops.elementwise import align_ranks
from npujax.ops.registry import OpDef, VectorWork, is_forward_only, onnx_importer, register

if TYPE_CHECKING:
    from npujax.ir.graph import Node
    from npujax.numerics.fixed_point import QTensor


def _unary(fn: Callable[[jax.Array], jax.Array]):
    def run(node: Node, inputs: Sequence[jax.Array], params: Mapping[str, jax.Array]):
        return [fn(inputs[0])]

    return run


def _relu6(x: jax.Array) -> jax.Array:
    return jnp.clip(x, 0.0, 6.0)


def _relu_codes(node: Node, v: QTensor) -> QTensor:
    """ReLU on codes: ``max(q, z)`` (quantization is monotone and maps 0 to the zero point)."""
    return v._replace(codes=jnp.maximum(v.codes, v.zero_point << v.frac_bits))


def _clip(node: Node, inputs: Sequence[jax.Array], params: Mapping[str, jax.Array]):
    x = inputs[0]
    lo, hi = node.attrs.get("min"), node.attrs.get("max")
    # ONNX Clip: min(max(x, lo), hi), so hi wins when lo > hi.
    if lo is not None:
        x = jnp.maximum(x, jnp.asarray(lo, x.dtype))
    if hi is not None:
        x = jnp.minimum(x, jnp.asarray(hi, x.dtype))
    return [x]


def _leaky_relu(node: Node, inputs: Sequence[jax.Array], params: Mapping[str, jax.Array]):
    x = inputs[0]
    return [jnp.where(x >= 0, x, x * jnp.asarray(node.attrs["alpha"], x.dtype))]


def _prelu(node: Node, inputs: Sequence[jax.Array], params: Mapping[str, jax.Array]):
    x, slope = align_ranks(*inputs)
    return [jnp.where(x >= 0, x, x * slope)]


def _hard_sigmoid(node: Node, inputs: Sequence[jax.Array], params: Mapping[str, jax.Array]):
    x = inputs[0]
    alpha = jnp.asarray(node.attrs["alpha"], x.dtype)
    beta = jnp.asarray(node.attrs["beta"], x.dtype)
    return [jnp.clip(alpha * x + beta, jnp.asarray(0, x.dtype), jnp.asarray(1, x.dtype))]


def _hard_swish(node: Node, inputs: Sequence[jax.Array], params: Mapping[str, jax.Array]):
    x = inputs[0]
    one_sixth = jnp.asarray(1.0 / 6.0, x.dtype)
    return [x * jnp.clip(x * one_sixth + jnp.asarray(0.5, x.dtype), jnp.asarray(0, x.dtype),
                         jnp.asarray(1, x.dtype))]


def _softmax(node: Node, inputs: Sequence[jax.Array], params: Mapping[str, jax.Array]):
    x = inputs[0]
    axis = node.attrs.get("axis", -1) % max(x.ndim, 1)
    if node.attrs.get("coerce_2d") and axis != x.ndim - 1:
        flat = jnp.reshape(x, (int(np.prod(x.shape[:axis], dtype=np.int64)), -1))
        return [jnp.reshape(jax.nn.softmax(flat, axis=-1), x.shape)]
    if (is_forward_only() and 1 < x.shape[axis] <= _PAIRWISE_SOFTMAX_MAX
            and jnp.issubdtype(x.dtype, jnp.floating)):
        return [_pairwise_softmax(x, axis)]
    return [jax.nn.softmax(x, axis=axis)]


#: In a forward-only trace, a Softmax over at most this many elements is pairwise
#: (:func:`_pairwise_softmax`).
_PAIRWISE_SOFTMAX_MAX = 8


def _pairwise_softmax(x: jax.Array, axis: int) -> jax.Array:
    """Softmax over a short ``axis`` as ``1 / sum_j exp(x_j - x_i)``: one reduction, which
    XLA:CPU compiles with the exponentials into one loop kernel, where ``jax.nn.softmax``'s
    maximum, exponentials and sum take three (about 15 ms of compilation each; PP-OCR cls's
    2-class head). No maximum is needed: the ``j = i`` term is 1, so the sum is at least 1, and a
    term that overflows gives the 0 the limit has. An infinite input (a ``-inf`` attention
    mask) makes ``inf - inf`` differences, taken as 0: a masked element gets 0, as in
    ``jax.nn.softmax``; a row masked whole gets ``1/n`` where ``jax.nn.softmax`` gives NaN.
    Values agree with ``jax.nn.softmax`` to float rounding; ``n^2`` exponentials per row of
    ``n``."""
    diff = jnp.expand_dims(x, axis) - jnp.expand_dims(x, axis + 1)  # [..., i, j, ...]: x_j - x_i
    diff = jnp.where(jnp.isnan(diff), jnp.zeros((), diff.dtype), diff)
    return 1.0 / jnp.sum(jnp.exp(diff), axis=axis + 1)


_SQRT_2_OVER_PI = 0.7978845608028654


def gelu(x: jax.Array, approximate: str = "none") -> jax.Array:
    """ONNX Gelu (opset 20): the exact (erf) form or the tanh approximation.

    Args:
      x: float array.
      approximate: ``"none"`` (``x/2 (1 + erf(x/sqrt 2))``) or ``"tanh"``.

    Returns:
      float array of ``x``'s shape and dtype.

    References:
      Hendrycks and Gimpel 2016, arXiv:1606.08415; ONNX Gelu,
      https://onnx.ai/onnx/operators/onnx__Gelu.html.
    """
    return jax.nn.gelu(x, approximate=approximate == "tanh")


def _gelu(node: Node, inputs: Sequence[jax.Array], params: Mapping[str, jax.Array]):
    return [gelu(inputs[0], node.attrs.get("approximate", "none"))]


def _per_elem(alu: int, special: int):
    def work(node: Node, ins: Sequence[tuple[int, ...]], outs: Sequence[tuple[int, ...]]
             ) -> VectorWork:
        n = int(np.prod(outs[0], dtype=np.int64))
        return VectorWork(alu * n, special * n)

    return work


def _softmax_work(node: Node, ins: Sequence[tuple[int, ...]], outs: Sequence[tuple[int, ...]]
                  ) -> VectorWork:
    shape = outs[0]
    n = int(np.prod(shape, dtype=np.int64))
    rows = n // max(int(shape[int(node.attrs.get("axis", -1)) % len(shape)]), 1) if shape else 1
    return VectorWork(4 * n, n + rows)


# --------------------------------------------------------------------------------------------
# ONNX


@onnx_importer("Clip")
def _import_clip(ctx: Any, n: Any, a: Mapping[str, Any]) -> None:
    if ctx.opset < 11:
        lo, hi = a.get("min"), a.get("max")
    else:
        lo, hi = ctx.opt_const(1, "min"), ctx.opt_const(2, "max")
        lo = None if lo is None else lo.item()
        hi = None if hi is None else hi.item()
    ctx.emit("Clip", [n.input[0]], [n.output[0]], {"min": lo, "max": hi})


@onnx_importer("Softmax")
def _import_softmax(ctx: Any, n: Any, a: Mapping[str, Any]) -> None:
    legacy = ctx.opset < 13
    ctx.emit("Softmax", [n.input[0]], [n.output[0]],
             {"axis": int(a.get("axis", 1 if legacy else -1)), "coerce_2d": legacy})


@onnx_importer("Gelu")
def _import_gelu(ctx: Any, n: Any, a: Mapping[str, Any]) -> None:
    approx = a.get("approximate", "none")
    if approx not in ("none", "tanh"):
        raise UnsupportedOpError(f"Gelu approximate={approx!r}; ONNX defines 'none' and 'tanh'.")
    ctx.emit("Gelu", [n.input[0]], [n.output[0]], {"approximate": approx})


for _op in ("Relu", "Sigmoid", "Tanh", "HardSwish", "PRelu"):
    onnx_importer(_op)(simple_importer(_op))
onnx_importer("LeakyRelu")(simple_importer("LeakyRelu", alpha=0.01))
onnx_importer("HardSigmoid")(simple_importer("HardSigmoid", alpha=0.2, beta=0.5))


def _export_plain(w: Any, node: Node) -> None:
    w.add(node.op, list(node.inputs), list(node.outputs), node.name)


def _export_relu6(w: Any, node: Node) -> None:
    lo, hi = w.init(f"{node.name}.min", np.float32(0)), w.init(f"{node.name}.max", np.float32(6))
    w.add("Clip", [*node.inputs, lo, hi], list(node.outputs), node.name)


def _export_clip(w: Any, node: Node) -> None:
    a = node.attrs
    dt = np.dtype(w.graph.tensors[node.inputs[0]].dtype)
    lo = "" if a.get("min") is None else w.init(f"{node.name}.min", a["min"], dt)
    hi = "" if a.get("max") is None else w.init(f"{node.name}.max", a["max"], dt)
    w.add("Clip", [*node.inputs, lo, hi], list(node.outputs), node.name)


def _export_leaky_relu(w: Any, node: Node) -> None:
    w.add("LeakyRelu", list(node.inputs), list(node.outputs), node.name,
          alpha=float(node.attrs["alpha"]))


def _export_hard_sigmoid(w: Any, node: Node) -> None:
    w.add("HardSigmoid", list(node.inputs), list(node.outputs), node.name,
          alpha=float(node.attrs["alpha"]), beta=float(node.attrs["beta"]))


def _export_gelu(w: Any, node: Node) -> None:
    """Written out at opset 17 (Gelu needs 20): ``x * 0.5 * (1 + erf(x / sqrt 2))`` or the tanh
    form ``x * 0.5 * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3)))``."""
    x, name = node.inputs[0], node.name
    t = lambda k: w.name(f"{name}/{k}")  # noqa: E731
    c = lambda k, v: w.init(f"{name}.{k}", np.float32(v))  # noqa: E731
    if node.attrs.get("approximate", "none") == "tanh":
        x3, a, s_, inner, th = t("x3"), t("ax3"), t("sum"), t("inner"), t("tanh")
        w.add("Pow", [x, c("three", 3.0)], [x3], f"{name}/cube")
        w.add("Mul", [x3, c("a", 0.044715)], [a], f"{name}/mul_a")
        w.add("Add", [x, a], [s_], f"{name}/add_x")
        w.add("Mul", [s_, c("k", _SQRT_2_OVER_PI)], [inner], f"{name}/mul_k")
        w.add("Tanh", [inner], [th], f"{name}/tanh")
        f = th
    else:
        scaled, f = t("scaled"), t("erf")
        w.add("Div", [x, c("sqrt2", np.sqrt(2.0))], [scaled], f"{name}/div")
        w.add("Erf", [scaled], [f], f"{name}/erf")
    one, half, hx = t("one_plus"), t("half"), c("half", 0.5)
    w.add("Add", [f, c("one", 1.0)], [one], f"{name}/add_one")
    w.add("Mul", [x, hx], [half], f"{name}/mul_half")
    w.add("Mul", [half, one], list(node.outputs), name)


def _export_softmax(w: Any, node: Node) -> None:
    a, ins, outs = node.attrs, list(node.inputs), list(node.outputs)
    shape = w.graph.tensors[ins[0]].shape
    axis = int(a.get("axis", -1)) % len(shape)
    if a.get("coerce_2d") and axis != len(shape) - 1:
        flat = w.name(f"{node.name}/flat")
        sm = w.name(f"{node.name}/softmax")
        w.add("Flatten", ins, [flat], f"{node.name}/flatten", axis=axis)
        w.add("Softmax", [flat], [sm], node.name, axis=-1)
        w.add("Reshape", [sm, w.i64(node, "shape", shape)], outs, f"{node.name}/reshape")
    else:
        w.add("Softmax", ins, outs, node.name, axis=axis)


register(
    OpDef(name="Relu", run=_unary(jax.nn.relu), cost="elementwise", export=_export_plain,
          unary=jax.nn.relu, epilogue=True, codes="exact", run_codes=_relu_codes),
    OpDef(name="Relu6", run=_unary(_relu6), cost="elementwise", export=_export_relu6,
          unary=_relu6, epilogue=True),
    OpDef(name="Sigmoid", run=_unary(jax.nn.sigmoid), cost="elementwise", export=_export_plain,
          unary=jax.nn.sigmoid, epilogue=True, jax_primitives=("logistic",)),
    OpDef(name="Tanh", run=_unary(jnp.tanh), cost="elementwise", export=_export_plain,
          unary=jnp.tanh, epilogue=True, jax_primitives=("tanh",)),
    OpDef(name="Clip", run=_clip, cost="elementwise", export=_export_clip),
    OpDef(name="LeakyRelu", run=_leaky_relu, cost="elementwise", export=_export_leaky_relu),
    OpDef(name="PRelu", run=_prelu, cost="elementwise", export=_export_plain),
    OpDef(name="HardSigmoid", run=_hard_sigmoid, cost="elementwise",
          export=_export_hard_sigmoid),
    OpDef(name="HardSwish", run=_hard_swish, cost="elementwise", export=_export_plain),
    OpDef(name="Gelu", run=_gelu, cost="elementwise", export=_export_gelu,
          vector_work=_per_elem(5, 1)),
    OpDef(name="Softmax", run=_softmax, cost="vector", export=_export_softmax,
          vector_work=_softmax_work),
)

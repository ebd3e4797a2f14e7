"""GELU from elementwise operators the NPU runs.

ONNX Gelu (opset 20): ``approximate="none"``: ``y = 0.5 x (1 + erf(x / sqrt 2))``;
``approximate="tanh"``: ``y = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))``
(Hendrycks and Gimpel 2016, arXiv:1606.08415, section 2).

* erf form: ``Mul, Erf, Add, Mul`` (needs ``Erf``). No finite combination of the usual NPU
  activations (Sigmoid, Tanh, Relu, Mul, Add) equals erf, so without ``Erf`` it is refused
  (the tanh form differs from it by up to 4.7e-4, no rewrite but another model).
* tanh form: with ``Sigmoid``, through the identity ``(1 + tanh u) / 2 = sigmoid(2 u)``:
  ``y = x * sigmoid(2 sqrt(2/pi) x (1 + 0.044715 x^2))``; else with ``Tanh`` as written.

Both are the operator's own formula, reassociated: exact up to float rounding.
"""

from __future__ import annotations

import numpy as np

from npujax.hw.spec import OpsSpec
from npujax.ir.graph import Graph, Node, Params
from npujax.ir.rewrites.base import Builder, Replacement, Rewrite, register_rewrite

_K = float(np.sqrt(2.0 / np.pi))


def _needs(node: Node, ops: OpsSpec) -> tuple[str, ...]:
    """The operators the rewrite of ``node`` uses on ``ops`` (the first form available)."""
    if node.attrs.get("approximate", "none") == "tanh":
        return ("Mul", "Add", "Sigmoid") if "Sigmoid" in ops.supported else ("Mul", "Add", "Tanh")
    return ("Mul", "Add", "Erf")


@register_rewrite
class GeluElementwise(Rewrite):
    """GELU (erf or tanh form) as Mul/Add and Erf, Sigmoid or Tanh."""

    name = "gelu_elementwise"
    op = "Gelu"
    formula = "0.5x(1+erf(x/sqrt2)); tanh form: x*sigmoid(2*sqrt(2/pi)*x*(1+0.044715x^2))"
    source = "ONNX Gelu (opset 20); Hendrycks & Gimpel, arXiv:1606.08415"

    def refuse(self, graph: Graph, node: Node, ops: OpsSpec) -> str:
        missing = [o for o in _needs(node, ops) if o not in ops.supported]
        if not missing:
            return ""
        if "Erf" in missing:
            return ("the NPU lacks Erf, and no exact rewrite of erf-form GELU into the "
                    "operators it runs exists")
        return f"the NPU lacks {', '.join(missing)}"

    def replace(self, graph: Graph, node: Node, params: Params | None,
                ops: OpsSpec) -> Replacement:
        b = Builder(graph, node)
        (x,) = node.inputs
        y = node.outputs[0]
        need = _needs(node, ops)
        if "Erf" in need:
            s = b.add("Mul", (x, b.const("inv_sqrt2", 1.0 / np.sqrt(2.0))), "scale")
            e = b.add("Erf", (s,), "erf")
            one = b.add("Add", (e, b.const("one", 1.0)), "one_plus")
            h = b.add("Mul", (x, b.const("half", 0.5)), "half_x")
            b.add("Mul", (h, one), "mul", output=y)
        else:
            x2 = b.add("Mul", (x, x), "square")
            t = b.add("Mul", (x2, b.const("c", 0.044715)), "cubic_coef")
            t = b.add("Add", (t, b.const("one", 1.0)), "one_plus_c")
            u = b.add("Mul", (x, t), "inner")
            if "Sigmoid" in need:
                u2 = b.add("Mul", (u, b.const("two_k", 2.0 * _K)), "scale")
                s = b.add("Sigmoid", (u2,), "sigmoid")
                b.add("Mul", (x, s), "mul", output=y)
            else:
                uk = b.add("Mul", (u, b.const("k", _K)), "scale")
                th = b.add("Tanh", (uk,), "tanh")
                one = b.add("Add", (th, b.const("one_t", 1.0)), "one_plus")
                h = b.add("Mul", (x, b.const("half", 0.5)), "half_x")
                b.add("Mul", (h, one), "mul", output=y)
        return b.done()

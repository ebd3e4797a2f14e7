"""LeakyReLU as ``Max(x, alpha * x)`` (``Min`` for ``alpha > 1``).

ONNX LeakyRelu (opset 16): ``y = x`` for ``x >= 0``, ``alpha * x`` otherwise. For
``0 <= alpha <= 1``, ``alpha * x <= x`` exactly when ``x >= 0``, so ``max(x, alpha x)`` picks
the right branch; for ``alpha > 1`` the order flips and ``min(x, alpha x)`` does. A negative
``alpha`` has no such form and is refused. The product ``alpha * x`` is the only rounding, the
same one the operator makes: the rewrite is exact.
"""

from __future__ import annotations

from npujax.hw.spec import OpsSpec
from npujax.ir.graph import Graph, Node, Params
from npujax.ir.rewrites.base import Builder, Replacement, Rewrite, register_rewrite


@register_rewrite
class LeakyReluMax(Rewrite):
    """``LeakyRelu(x) = Max(x, alpha x)`` for ``0 <= alpha <= 1`` (``Min`` for ``alpha > 1``)."""

    name = "leaky_relu_max"
    op = "LeakyRelu"
    formula = "max(x, alpha*x)"
    source = "ONNX LeakyRelu (opset 16)"

    def refuse(self, graph: Graph, node: Node, ops: OpsSpec) -> str:
        alpha = float(node.attrs.get("alpha", 0.01))
        if alpha < 0:
            return f"alpha = {alpha} < 0 has no exact max/min form"
        pick = "Max" if alpha <= 1 else "Min"
        missing = [o for o in ("Mul", pick) if o not in ops.supported]
        return f"the NPU lacks {', '.join(missing)}" if missing else ""

    def replace(self, graph: Graph, node: Node, params: Params | None,
                ops: OpsSpec) -> Replacement:
        alpha = float(node.attrs.get("alpha", 0.01))
        b = Builder(graph, node)
        (x,) = node.inputs
        ax = b.add("Mul", (x, b.const("alpha", alpha)), "alpha_x")
        b.add("Max" if alpha <= 1 else "Min", (x, ax), "max" if alpha <= 1 else "min",
              output=node.outputs[0])
        return b.done()

"""HardSigmoid as ``Clip(alpha x + beta, 0, 1)``.

ONNX HardSigmoid (opset 6): ``y = max(0, min(1, alpha x + beta))``. Written as a ``Mul``, an
``Add`` and a ``Clip`` it is the same arithmetic in the same order: exact. (The Edge TPU runs
``Clip`` but not ``HardSigmoid``; under its one-partition fallback a HardSigmoid sends the rest
of the graph to the host.)
"""

from __future__ import annotations

from npujax.hw.spec import OpsSpec
from npujax.ir.graph import Graph, Node, Params
from npujax.ir.rewrites.base import Builder, Replacement, Rewrite, register_rewrite


@register_rewrite
class HardSigmoidClip(Rewrite):
    """``HardSigmoid(x) = Clip(alpha x + beta, 0, 1)``."""

    name = "hard_sigmoid_clip"
    op = "HardSigmoid"
    formula = "clip(alpha*x + beta, 0, 1)"
    source = "ONNX HardSigmoid (opset 6)"

    def refuse(self, graph: Graph, node: Node, ops: OpsSpec) -> str:
        missing = [o for o in ("Mul", "Add", "Clip") if o not in ops.supported]
        return f"the NPU lacks {', '.join(missing)}" if missing else ""

    def replace(self, graph: Graph, node: Node, params: Params | None,
                ops: OpsSpec) -> Replacement:
        b = Builder(graph, node)
        (x,) = node.inputs
        ax = b.add("Mul", (x, b.const("alpha", float(node.attrs.get("alpha", 0.2)))), "alpha_x")
        s = b.add("Add", (ax, b.const("beta", float(node.attrs.get("beta", 0.5)))), "plus_beta")
        b.add("Clip", (s,), "clip", attrs={"min": 0.0, "max": 1.0}, output=node.outputs[0])
        return b.done()

"""LayerNormalization from reductions and elementwise operators.

ONNX LayerNormalization (opset 17), over the axes ``[axis, rank)``:
``mean = ReduceMean(x)``, ``d = x - mean``, ``var = ReduceMean(d * d)``,
``y = d * Reciprocal(Sqrt(var + epsilon)) * scale + bias``: the specification's own function
body, with the division written as a product by the reciprocal (one more rounding: exact up to
float rounding). The scale and bias become constants; rewritten without parameters (for the
cost model, which reads shapes only) they are placeholders of their shapes.
"""

from __future__ import annotations

import numpy as np

from npujax.hw.spec import OpsSpec
from npujax.ir.graph import Graph, Node, Params
from npujax.ir.rewrites.base import Builder, Replacement, Rewrite, register_rewrite

_NEEDS = ("ReduceMean", "Sub", "Mul", "Add", "Sqrt", "Reciprocal")


@register_rewrite
class LayerNormElementwise(Rewrite):
    """``LayerNormalization`` as ReduceMean, Sub, Mul, Add, Sqrt and Reciprocal."""

    name = "layer_norm_elementwise"
    op = "LayerNormalization"
    formula = "(x-E[x]) * 1/sqrt(E[(x-E[x])^2]+eps) * scale + bias"
    source = "ONNX LayerNormalization (opset 17), its function body"

    def refuse(self, graph: Graph, node: Node, ops: OpsSpec) -> str:
        missing = [o for o in _NEEDS if o not in ops.supported]
        return f"the NPU lacks {', '.join(missing)}" if missing else ""

    def replace(self, graph: Graph, node: Node, params: Params | None,
                ops: OpsSpec) -> Replacement:
        b = Builder(graph, node)
        x = node.inputs[0]
        shape = tuple(int(d) for d in graph.tensors[x].shape)
        axes = list(range(int(node.attrs["axis"]) % len(shape), len(shape)))
        red = tuple(1 if i in axes else d for i, d in enumerate(shape))
        attrs = {"axes": axes, "keepdims": 1}
        mean = b.add("ReduceMean", (x,), "mean", attrs=attrs, shape=red)
        d = b.add("Sub", (x, mean), "centred", shape=shape)
        sq = b.add("Mul", (d, d), "square", shape=shape)
        var = b.add("ReduceMean", (sq,), "variance", attrs=attrs, shape=red)
        ve = b.add("Add", (var, b.const("epsilon", float(node.attrs["epsilon"]))), "plus_eps",
                   shape=red)
        sd = b.add("Sqrt", (ve,), "sqrt", shape=red)
        inv = b.add("Reciprocal", (sd,), "reciprocal", shape=red)
        affine = [r for r in ("scale", "bias") if r in node.params]
        y = b.add("Mul", (d, inv), "normalized", shape=shape,
                  output=None if affine else node.outputs[0])
        norm_shape = shape[axes[0]:]
        for i, (role, op) in enumerate((r, "Mul" if r == "scale" else "Add") for r in affine):
            value = (np.asarray(params[node.name][role]) if params is not None
                     else np.ones(norm_shape, np.float32))
            c = b.const(role, np.reshape(value, norm_shape))
            last = i == len(affine) - 1
            y = b.add(op, (y, c), role, shape=shape, output=node.outputs[0] if last else None)
        return b.done()

"""Average pooling as a depthwise convolution.

ONNX AveragePool (opset 19): each output is the sum of its window divided by a count: the
window's size with ``count_include_pad=1`` (the padding counts, the ``ceil_mode`` overhang does
not), else the number of the window's elements inside the input. A depthwise convolution
(``groups = C``, one ``k_h x k_w`` filter per channel) with the pool's strides, padding and
dilations computes the window sums. Where the count is the same for every output the filter is
``1 / count`` (one layer); where it varies (``count_include_pad=0`` with padding, or a
``ceil_mode`` overhang), the filter is ones and a ``Mul`` by the constant per-pixel
``1 / count`` follows (an elementwise op the GEMM's output stage fuses). Exact up to float
rounding (a product by ``1/count`` instead of a division). 4-D pools over H and W
(``NCHW`` or ``NHWC``) only.
"""

from __future__ import annotations

import numpy as np

from npujax.hw.spec import OpsSpec
from npujax.ir.graph import Graph, Node, Params
from npujax.ir.rewrites.base import Builder, Replacement, Rewrite, register_rewrite
from npujax.ops.pooling import avgpool_count


def _layout(node: Node) -> str | None:
    """``NCHW`` or ``NHWC`` from which axes the 4-D pool's window covers, else None."""
    a = node.attrs
    if len(a["window"]) != 4:
        return None
    moved = {i for i in range(4) if a["window"][i] != 1 or a["strides"][i] != 1
             or list(a["padding"][i]) != [0, 0]}
    if moved <= {2, 3}:
        return "NCHW"
    if moved <= {1, 2}:
        return "NHWC"
    return None


@register_rewrite
class AvgPoolDepthwise(Rewrite):
    """``AveragePool`` as a depthwise ``Conv`` (and a ``Mul`` by ``1/count`` where it varies)."""

    name = "avgpool_depthwise"
    op = "AveragePool"
    formula = "avgpool(x) = dwconv(x, 1/count) or dwconv(x, ones) * (1/count)"
    source = "ONNX AveragePool (opset 19), count_include_pad semantics"

    def refuse(self, graph: Graph, node: Node, ops: OpsSpec) -> str:
        layout = _layout(node)
        if layout is None:
            return "only 4-D pools over H and W are rewritten"
        h, w = layout.index("H"), layout.index("W")
        k = max(int(node.attrs["window"][h]), int(node.attrs["window"][w]))
        s = max(int(node.attrs["strides"][h]), int(node.attrs["strides"][w]))
        if k > ops.conv_max_kernel:
            return f"the {k}-wide window > conv_max_kernel {ops.conv_max_kernel}"
        if s > ops.conv_max_stride:
            return f"stride {s} > conv_max_stride {ops.conv_max_stride}"
        need = ["Conv"] + (["Mul"] if not self._uniform(graph, node) else [])
        missing = [o for o in need if o not in ops.supported]
        return f"the NPU lacks {', '.join(missing)}" if missing else ""

    @staticmethod
    def _count(graph: Graph, node: Node) -> np.ndarray:
        return np.asarray(avgpool_count(node, graph.tensors[node.inputs[0]].shape), np.float64)

    def _uniform(self, graph: Graph, node: Node) -> bool:
        c = self._count(graph, node)
        return bool(np.all(c == c.flat[0]))

    def replace(self, graph: Graph, node: Node, params: Params | None,
                ops: OpsSpec) -> Replacement:
        a = node.attrs
        layout = _layout(node)
        assert layout is not None
        h, w, ch = layout.index("H"), layout.index("W"), layout.index("C")
        x, y = node.inputs[0], node.outputs[0]
        c = int(graph.tensors[x].shape[ch])
        kh, kw = int(a["window"][h]), int(a["window"][w])
        dil = a.get("window_dilation", [1, 1, 1, 1])
        count = self._count(graph, node)
        uniform = bool(np.all(count == count.flat[0]))
        dtype = np.dtype(graph.tensors[x].dtype)
        value = 1.0 / float(count.flat[0]) if uniform else 1.0
        attrs = {"data_layout": layout, "kernel_layout": "OIHW",
                 "strides": [int(a["strides"][h]), int(a["strides"][w])],
                 "padding": [[int(p) for p in a["padding"][h]], [int(p) for p in a["padding"][w]]],
                 "dilations": [int(dil[h]), int(dil[w])], "groups": c,
                 "kernel_shape": [c, 1, kh, kw]}
        b = Builder(graph, node)
        p = None if params is None else {"kernel": np.full((c, 1, kh, kw), value, dtype)}
        if uniform:
            b.add("Conv", (x,), "depthwise", attrs=attrs, params=p, roles=("kernel",), output=y)
        else:
            s = b.add("Conv", (x,), "depthwise", attrs=attrs, params=p, roles=("kernel",))
            inv = (1.0 / count).astype(dtype)
            b.add("Mul", (s, b.const("inv_count", inv)), "divide", output=y)
        return b.done()

"""A convolution whose kernel is larger than the NPU's as a sum of small-kernel convolutions.

With ``t = ops.conv_max_kernel``, a ``K_h x K_w`` kernel is cut into tiles of at most
``t x t`` taps (rows ``[a t, min(K_h, (a+1) t))``, columns likewise; no zero taps, so no MAC is
added). Tile ``(a, b)`` is a convolution with the same stride ``s``, dilation ``d`` and groups
whose window starts ``d a t`` rows and ``d b t`` columns later: its top padding is
``p_top - d a t`` (negative: a crop of the input) and its bottom padding is chosen so it has the
original output size, ``(H_out - 1) s + d (k_tile - 1) + 1 - H - p_top'``. Since
``y[p] = sum_i w[i] x[s p + d i - p_top]`` splits over the kernel rows (and columns) exactly,
``y = sum_ab conv(x, w_ab)``: the first tile carries the bias, the partial sums are added in
order (``Add``), and the original's fused activations follow the last ``Add``. Exact up to float
rounding (another summation order). 2-D convolutions in ``NCHW`` or ``NHWC``; a stride larger
than the NPU's is refused (tiling does not shrink it). Source: the convolution's definition
(ONNX Conv, opset 11); the same split as TVM's and TensorRT's large-kernel decompositions.
"""

from __future__ import annotations

import math

from npujax.hw.spec import OpsSpec
from npujax.ir.graph import Graph, Node, Params
from npujax.ir.rewrites.base import Builder, Replacement, Rewrite, register_rewrite


def _kernel_hw(node: Node) -> tuple[int, int]:
    k, kl = node.attrs["kernel_shape"], node.attrs["kernel_layout"]
    return int(k[kl.index("H")]), int(k[kl.index("W")])


@register_rewrite
class LargeKernelConv(Rewrite):
    """A ``K x K`` Conv as ``ceil(K/t)^2`` convolutions of at most ``t x t`` taps and their sum."""

    name = "large_kernel_conv"
    op = "Conv"
    formula = "conv(x, w) = sum_ab conv(shift_ab(x), w_ab), tiles of <= t x t taps"
    source = "ONNX Conv (opset 11): the sum over kernel taps split by rows and columns"

    def refuse(self, graph: Graph, node: Node, ops: OpsSpec) -> str:
        a = node.attrs
        if a["data_layout"] not in ("NCHW", "NHWC") or len(a["strides"]) != 2:
            return f"only 2-D convolutions are split (layout {a['data_layout']})"
        if any(d != 1 for d in a.get("lhs_dilation", (1, 1))):
            return "a transposed (input-dilated) convolution is not split"
        if max(_kernel_hw(node)) <= ops.conv_max_kernel:
            return "the kernel already fits"
        if max(a["strides"]) > ops.conv_max_stride:
            return (f"stride {max(a['strides'])} > max {ops.conv_max_stride}: splitting the "
                    "kernel does not reduce the stride")
        missing = [o for o in ("Conv", "Add", *a.get("epilogue", ())) if o not in ops.supported]
        return f"the NPU lacks {', '.join(missing)}" if missing else ""

    def replace(self, graph: Graph, node: Node, params: Params | None,
                ops: OpsSpec) -> Replacement:
        a = node.attrs
        t = ops.conv_max_kernel
        layout, kl = a["data_layout"], a["kernel_layout"]
        x = node.inputs[0]
        y = node.outputs[0]
        xs, ys = graph.tensors[x].shape, graph.tensors[y].shape
        hi, wi = int(xs[layout.index("H")]), int(xs[layout.index("W")])
        ho, wo = int(ys[layout.index("H")]), int(ys[layout.index("W")])
        (sh, sw), (dh, dw) = a["strides"], a["dilations"]
        (pt, _), (pl, _) = a["padding"]
        kh, kw = _kernel_hw(node)
        kernel = params[node.name]["kernel"] if params is not None else None
        bias = params[node.name].get("bias") if params is not None else None
        epilogue = tuple(a.get("epilogue", ()))
        b = Builder(graph, node)
        total = None
        n_tiles = math.ceil(kh / t) * math.ceil(kw / t)
        i = 0
        for r0 in range(0, kh, t):
            for c0 in range(0, kw, t):
                th, tw = min(t, kh - r0), min(t, kw - c0)
                top, left = pt - dh * r0, pl - dw * c0
                bottom = (ho - 1) * sh + dh * (th - 1) + 1 - hi - top
                right = (wo - 1) * sw + dw * (tw - 1) + 1 - wi - left
                shape = list(a["kernel_shape"])
                shape[kl.index("H")], shape[kl.index("W")] = th, tw
                attrs = {**a, "kernel_shape": shape, "padding": [[top, bottom], [left, right]],
                         "epilogue": []}
                roles = ("kernel", "bias") if ("bias" in node.params and i == 0) else ("kernel",)
                p = None
                if kernel is not None:
                    idx = [slice(None)] * len(kl)
                    idx[kl.index("H")] = slice(r0, r0 + th)
                    idx[kl.index("W")] = slice(c0, c0 + tw)
                    p = {"kernel": kernel[tuple(idx)]}
                    if bias is not None and i == 0:
                        p["bias"] = bias
                last = i == n_tiles - 1
                part = b.add("Conv", (x,), f"tile{r0 // t}{c0 // t}", attrs=attrs, params=p,
                             roles=roles, shape=tuple(ys))
                if total is None:
                    total = part
                else:
                    out = y if (last and not epilogue) else None
                    total = b.add("Add", (total, part), f"sum{i}", output=out, shape=tuple(ys))
                i += 1
        assert total is not None
        for j, e in enumerate(epilogue):
            out = y if j == len(epilogue) - 1 else None
            total = b.add(e, (total,), e.lower(), output=out, shape=tuple(ys))
        return b.done()

"""A model as a SCALE-Sim topology: every Conv/Gemm layer of a Graph in SCALE-Sim's conv form.

Conv layers keep their geometry, the IFMAP pre-padded and cropped to the rows the convolution
reads (SCALE-Sim convolves "valid" and counts ``ceil((H - R + S) / S)`` outputs, one more than
ONNX/Flax where ``(H + pads - R)`` is not a multiple of the stride); a grouped convolution is one
layer per group (a depthwise one is a ``DP`` layer, which SCALE-Sim splits per channel itself);
dense layers and other GEMMs are SCALE-Sim's GEMM view (IFMAP ``M x K``, filter ``1 x K``).
Convolutions at a batch above 1 and layers with non-square strides or dilation, which
SCALE-Sim's conv form cannot describe, are written as their im2col GEMM (``M`` = batch x output
pixels), which SCALE-Sim maps identically.
"""

from __future__ import annotations

from npujax.errors import ConfigError
from npujax.ir.graph import Graph
from npujax.plan.workload import workloads
from npujax.systolic.scalesim_io import TopologyLayer

__all__ = ["graph_topology"]


def _valid(n: int, pad: int, k: int, s: int) -> int:
    out = (n + pad - k) // s + 1
    return (out - 1) * s + k


def graph_topology(graph: Graph) -> list[TopologyLayer]:
    """The GEMM layers of ``graph`` (optimized, BN folded) as SCALE-Sim topology layers.

    Returns:
      One :class:`~npujax.systolic.scalesim_io.TopologyLayer` per Conv/Gemm layer (per group for
      grouped convolutions), in execution order; write them with
      :func:`npujax.systolic.scalesim_io.write_topology`.

    Raises:
      ConfigError: a graph without Conv/Gemm layers.
    """
    layers: list[TopologyLayer] = []
    by_name = {n.name: n for n in graph.nodes}
    for w in workloads(graph):
        if w.kind != "gemm" or w.M < 1:
            continue
        node = by_name.get(w.name)
        a = node.attrs if node is not None else {}
        layout = a.get("data_layout", "")
        plain = (node is not None and node.op == "Conv" and len(layout) == 4
                 and len(set(a["strides"])) == 1 and set(a["dilations"]) == {1}
                 and set(a.get("lhs_dilation", [1])) == {1}
                 and graph.tensors[node.inputs[0]].shape[layout.index("N")] == 1)
        if not plain:
            layers += [TopologyLayer.gemm(w.name if w.groups == 1 else f"{w.name}_g{g}",
                                          w.M, w.K, w.N) for g in range(w.groups)]
            continue
        assert node is not None
        shape = dict(zip(layout, graph.tensors[node.inputs[0]].shape))
        klayout = a["kernel_layout"]
        kdims = dict(zip(klayout, a["kernel_shape"]))
        s = int(a["strides"][0])
        hs, ws = (layout.replace("N", "").replace("C", "").index(c) for c in "HW")
        pad_h, pad_w = (sum(a["padding"][i]) for i in (hs, ws))
        kh, kw = kdims["H"], kdims["W"]
        h, wd = _valid(shape["H"], pad_h, kh, s), _valid(shape["W"], pad_w, kw, s)
        cin = kdims["I"]
        groups = int(a["groups"])
        if groups > 1 and groups == shape["C"] and w.N == 1:  # depthwise
            layers.append(TopologyLayer.conv(f"DP_{w.name}", h, wd, kh, kw, groups, 1, s))
            continue
        for g in range(groups):
            name = w.name if groups == 1 else f"{w.name}_g{g}"
            layers.append(TopologyLayer.conv(name, h, wd, kh, kw, cin, w.N, s))
    if not layers:
        raise ConfigError("the model has no Conv/Gemm layer to write as a SCALE-Sim topology.")
    return layers

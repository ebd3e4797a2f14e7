"""Per-layer workloads of a Graph: GEMM shapes after im2col and element counts.

This is the bridge from the Graph to the NPU model: each costed node becomes one
:class:`Workload` of static integers. Shape-only nodes (Reshape, Identity) cost nothing on an NHWC
NPU and produce no workload.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from npujax.errors import UnsupportedOpError
from npujax.graph.ir import GEMM_OPS, Graph, Node

__all__ = ["Workload", "workloads", "FREE_OPS"]

#: Ops that only relabel a buffer (no data movement in NHWC) and so cost no time.
FREE_OPS = frozenset({"Reshape", "Identity", "Squeeze", "Flatten"})


@dataclasses.dataclass(frozen=True)
class Workload:
    """One costed layer.

    Attributes:
      name, op: the Graph node's name and operator.
      kind: ``"gemm"`` (runs on the MAC array) or ``"vector"`` (runs on the vector unit).
      M, K, N: GEMM extents after im2col (``M`` = batch x output pixels, ``K`` = C_in/groups x
        k_h x k_w, ``N`` = C_out/groups) for one group; 0 for vector layers.
      groups: number of independent GEMMs (conv groups; 1 otherwise).
      weight_elems: number of weight elements (0 for vector layers).
      bias_elems: number of bias elements (int32 on the NPU).
      in_elems, out_elems: activation elements read and written.
      vector_ops: elementwise operations for vector layers (``out_elems x window``).
      epilogue: activations fused into the layer's output stage.
    """

    name: str
    op: str
    kind: str
    M: int = 0
    K: int = 0
    N: int = 0
    groups: int = 1
    weight_elems: int = 0
    bias_elems: int = 0
    in_elems: int = 0
    out_elems: int = 0
    vector_ops: int = 0
    epilogue: tuple[str, ...] = ()

    @property
    def macs(self) -> int:
        """Multiply-accumulates: ``groups x M x K x N``."""
        return self.groups * self.M * self.K * self.N


def _gemm(graph: Graph, node: Node) -> Workload:
    x = graph.tensors[node.inputs[0]]
    y = graph.tensors[node.outputs[0]]
    if node.op == "Conv":
        a = node.attrs
        layout, klayout = a["data_layout"], a["kernel_layout"]
        groups = int(a["groups"])
        out = dict(zip(layout, y.shape))
        kshape = dict(zip(klayout, (int(d) for d in _kernel_shape(graph, node))))
        M = out["N"] * out["H"] * out["W"]
        K = kshape["I"] * kshape["H"] * kshape["W"]
        N = out["C"] // groups
        weight = kshape["O"] * kshape["I"] * kshape["H"] * kshape["W"]
        bias = out["C"]
    else:  # Gemm: x[..., K] @ kernel[K, N]
        K, N = int(x.shape[-1]), int(y.shape[-1])
        M = int(np.prod(x.shape[:-1]))
        groups, weight, bias = 1, K * N, N
    return Workload(
        node.name, node.op, "gemm", M=M, K=K, N=N, groups=groups, weight_elems=weight,
        bias_elems=bias if "bias" in node.params else 0, in_elems=x.size, out_elems=y.size,
        epilogue=tuple(node.attrs.get("epilogue", ())),
    )


def _kernel_shape(graph: Graph, node: Node) -> tuple[int, ...]:
    shape = node.attrs.get("kernel_shape")
    if shape is None:
        raise UnsupportedOpError(
            f"Conv node {node.name!r} lacks attrs['kernel_shape']; build graphs with "
            "npujax.graph importers (they record it)."
        )
    return tuple(shape)


def workloads(graph: Graph) -> list[Workload]:
    """The costed layers of ``graph`` in execution order.

    Run :func:`npujax.graph.optimize` first so BatchNorm is folded and activations are fused, as
    the NPU compiler would; otherwise they are costed as separate vector layers.

    Returns:
      One :class:`Workload` per Conv/Gemm node and per non-free vector op (pooling, elementwise,
      unfused activations, BatchNorm).
    """
    out = []
    for node in graph.nodes:
        if node.op in FREE_OPS:
            continue
        if node.op in GEMM_OPS:
            out.append(_gemm(graph, node))
            continue
        ins = sum(graph.tensors[t].size for t in node.inputs if t not in graph.constants)
        y = graph.tensors[node.outputs[0]].size
        window = int(np.prod(node.attrs.get("window", [1])))
        out.append(Workload(node.name, node.op, "vector", in_elems=ins, out_elems=y,
                            vector_ops=y * window))
    return out

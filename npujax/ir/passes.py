"""Graph rewrites: BatchNorm folding and activation-epilogue fusion.

Each pass is a pure function ``(graph, params) -> (graph, params)`` that returns new objects and
preserves the graph's function (up to float rounding).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from npujax.errors import ConfigError, GraphError
from npujax.ir.graph import Graph, Node, Params, TensorType
from npujax.ops import epilogue_ops, get_op, kernel_out_axis, quantized_ops

__all__ = [
    "fold_batchnorm",
    "fuse_epilogues",
    "optimize",
    "rebatch",
    "frozen_bn_stats",
]


def _single_consumer(graph: Graph, tensor: str) -> Node | None:
    users = graph.consumers(tensor)
    if len(users) != 1 or tensor in graph.outputs:
        return None
    return users[0]


def fold_batchnorm(graph: Graph, params: Params) -> tuple[Graph, Params]:
    """Fold each BatchNormalization that solely consumes a Conv/Gemm output into that layer.

    With ``inv = gamma / sqrt(var + eps)`` per output channel:
    ``kernel' = kernel * inv`` (along the kernel's output-channel axis) and
    ``bias' = (bias - mean) * inv + beta``. A zero ``gamma`` gives a zero channel, never NaN.

    Args:
      graph: a graph (BN nodes must use running statistics).
      params: its params.

    Returns:
      ``(graph, params)`` without the folded BN nodes; the Conv/Gemm nodes gain a ``bias``.

    References:
      Jacob et al. 2018, arXiv:1712.05877, section 3.2; Krishnamoorthi 2018, arXiv:1806.08342.
    """
    nodes = list(graph.nodes)
    params = {k: dict(v) for k, v in params.items()}
    gemm = quantized_ops()
    folds = []
    for node in graph.nodes:
        if node.op not in gemm or node.attrs.get("epilogue"):
            continue
        bn = _single_consumer(graph, node.outputs[0])
        if bn is None or bn.op != "BatchNormalization":
            continue
        out_ch_axis = -1 if node.op == "Gemm" else node.attrs["data_layout"].index("C")
        if bn.attrs["axis"] % len(graph.tensors[node.outputs[0]].shape) != out_ch_axis % len(
            graph.tensors[node.outputs[0]].shape
        ):
            continue
        folds.append((node.name, bn.name, kernel_out_axis(node), float(bn.attrs["epsilon"])))
        i = nodes.index(bn)
        nodes.pop(i)
        j = [n.name for n in nodes].index(node.name)
        nodes[j] = nodes[j].replace(outputs=bn.outputs, params=("kernel", "bias"))
    if folds:
        layers = {layer: params[layer] for layer, *_ in folds}
        bns = {bn: params.pop(bn) for _, bn, *_ in folds}
        params.update(_fold_params(layers, bns, folds=tuple(folds)))
    return graph.replace(nodes=tuple(nodes)), params


@functools.partial(jax.jit, static_argnames="folds")
def _fold_params(layers: Params, bns: Params, folds: tuple) -> Params:
    """The folded ``{"kernel", "bias"}`` of every layer in ``folds`` ((layer, bn, kernel output
    axis, epsilon) each), as one compiled program: eagerly, each fold's few ops compiled once per
    channel count (84 small programs on the PP-OCR classifier)."""
    out = {}
    for layer, bn, axis, eps in folds:
        p, b = layers[layer], bns[bn]
        # the barrier keeps XLA from rewriting 1 / sqrt into rsqrt (up to 4 ulp off on the CPU),
        # so the kernels equal the eager computation's bit for bit (the biases may differ in the
        # last bits: XLA fuses their multiply-add)
        inv = jnp.asarray(b.get("scale", 1.0)) * (
            1.0 / jax.lax.optimization_barrier(jnp.sqrt(b["var"] + eps)))
        shape = [1] * p["kernel"].ndim
        shape[axis] = -1
        bias = p.get("bias", jnp.zeros_like(b["mean"]))
        out[layer] = {
            "kernel": p["kernel"] * inv.reshape(shape),
            "bias": (bias - b["mean"]) * inv + b.get("bias", 0.0),
        }
    return out


def frozen_bn_stats(graph: Graph, params: Params) -> Params:
    """``params`` with every BatchNormalization's running ``mean``/``var`` gradient-stopped.

    Used by BN-folded QAT after the freeze step: the statistics stay fixed while the kernel and
    the BN scale/shift train through the fold.
    """
    out = dict(params)
    for n in graph.nodes:
        if n.op == "BatchNormalization" and n.name in params:
            p = dict(params[n.name])
            for k in ("mean", "var"):
                if k in p:
                    p[k] = jax.lax.stop_gradient(p[k])
            out[n.name] = p
    return out


def fuse_epilogues(graph: Graph, params: Params) -> tuple[Graph, Params]:
    """Fuse unary activations (Relu, Relu6, Sigmoid, Tanh) into the preceding Conv/Gemm node.

    A fused activation runs in the layer's output stage (the NPU's post-processing unit), so it
    costs no extra pass over memory; the node records it in ``attrs['epilogue']``.

    Returns:
      ``(graph, params)``; params are unchanged.
    """
    nodes = list(graph.nodes)
    gemm, epilogues = quantized_ops(), epilogue_ops()
    changed = True
    while changed:
        changed = False
        current = graph.replace(nodes=tuple(nodes))
        for node in current.nodes:
            if node.op not in gemm:
                continue
            act = _single_consumer(current, node.outputs[0])
            if act is None or act.op not in epilogues:
                continue
            epi = tuple(node.attrs.get("epilogue", ())) + (act.op,)
            fused = node.replace(outputs=act.outputs, attrs={**node.attrs, "epilogue": epi})
            nodes = [fused if n is node else n for n in nodes if n is not act]
            changed = True
            break
    return graph.replace(nodes=tuple(nodes)), params


def optimize(graph: Graph, params: Params) -> tuple[Graph, Params]:
    """The standard inference pipeline: :func:`fold_batchnorm` then :func:`fuse_epilogues`."""
    return fuse_epilogues(*fold_batchnorm(graph, params))


def rebatch(graph: Graph, batch: int) -> Graph:
    """The same graph with batch size ``batch`` (leading dimension of every activation tensor).

    Only the static shapes change (execution is batch-polymorphic already); use it to lower a
    graph at another inference batch size.

    Raises:
      ConfigError: ``batch`` < 1.
      GraphError: a node hard-codes the batch size (e.g. a Reshape with an explicit leading
        dimension); re-import the model with the wanted input shape instead.
    """
    if batch < 1:
        raise ConfigError(f"batch must be >= 1, got {batch}.")
    old = graph.tensors[graph.inputs[0]].shape[0] if graph.inputs else 1
    if batch == old:
        return graph
    for n in graph.nodes:
        if n.op == "Reshape" and n.attrs["shape"] and n.attrs["shape"][0] not in (0, -1):
            raise GraphError(
                f"node {n.name!r} reshapes to a fixed leading dimension "
                f"{n.attrs['shape'][0]}, so the graph cannot be re-batched; re-import the model "
                "with the wanted input shape."
            )
        if get_op(n.op, n.name).batch_dependent:
            raise GraphError(
                f"node {n.name!r} ({n.op}) may depend on the batch size; re-import the model "
                "with the wanted input shape."
            )
    tensors = {
        name: (TensorType((batch, *t.shape[1:]), t.dtype)
               if name not in graph.constants and t.shape and t.shape[0] == old else t)
        for name, t in graph.tensors.items()
    }
    return graph.replace(tensors=tensors)

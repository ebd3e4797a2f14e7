"""Graph rewrites: BatchNorm folding and activation-epilogue fusion.

Epilogue fusion here is a graph rewrite (an activation becomes its GEMM's ``attrs["epilogue"]``);
the decomposed LayerNorm/GELU patterns are fused in :mod:`npujax.ir.patterns`. What the NPU's
compiler fuses across layers (``ops.fusion``, :mod:`npujax.plan.passes.cross_layer`) is costed
by the plan, not rewritten here.

Each pass is a pure function ``(graph, params) -> (graph, params)`` that returns new objects and
preserves the graph's function (up to float rounding).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from npujax.errors import ConfigError, GraphError
from npujax.ir import absent
from npujax.ir.graph import Graph, Node, Params, TensorType
from npujax.ops import epilogue_ops, get_op, kernel_out_axis, quantized_ops

__all__ = [
    "fold_batchnorm",
    "fuse_epilogues",
    "optimize",
    "rebatch",
    "unfold_batch",
    "frozen_bn_stats",
    "absorb_transposes",
    "channels_last",
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
        if _on_host(layers, bns):
            host_layers, host_bns = jax.tree.map(np.asarray, (layers, bns))
            with np.errstate(divide="ignore", invalid="ignore"):  # as XLA's arithmetic
                params.update(jax.device_put(_fold_all(np, host_layers, host_bns, folds)))
        else:  # traced, or known by their shapes only (folded abstractly: npujax.ir.absent)
            params.update(absent.apply(_fold_params, layers, bns, folds=tuple(folds)))
    return graph.replace(nodes=tuple(nodes)), params


def _on_host(*trees: Any) -> bool:
    """Whether every leaf is a concrete float32 array: numpy's float32 arithmetic is IEEE's, as
    XLA's. Other dtypes (float64, which JAX narrows without x64; 16-bit floats) and traced
    values go through JAX."""
    leaves = jax.tree.leaves(trees, is_leaf=absent.is_absent)
    return all(isinstance(x, (np.ndarray, jax.Array)) and not isinstance(x, jax.core.Tracer)
               and np.dtype(x.dtype) == np.float32 for x in leaves)


def _fold_all(xp: Any, layers: Params, bns: Params, folds: Any,
              barrier: Callable[[Any], Any] = lambda v: v) -> Params:
    """The folded ``{"kernel", "bias"}`` of every layer in ``folds`` ((layer, bn, kernel output
    axis, epsilon) each), computed with the array module ``xp`` (numpy on the host, or
    jax.numpy in :func:`_fold_params`); ``barrier`` keeps XLA from rewriting ``1 / sqrt``."""
    out = {}
    for layer, bn, axis, eps in folds:
        p, b = layers[layer], bns[bn]
        scale = b.get("scale", 1.0)  # (a Python number: weak in numpy's and JAX's promotion)
        inv = (xp.asarray(scale) if not isinstance(scale, float) else scale) * (
            1.0 / barrier(xp.sqrt(b["var"] + eps)))
        shape = [1] * p["kernel"].ndim
        shape[axis] = -1
        bias = p.get("bias", xp.zeros_like(b["mean"]))
        out[layer] = {
            "kernel": p["kernel"] * xp.reshape(inv, shape),
            "bias": (bias - b["mean"]) * inv + b.get("bias", 0.0),
        }
    return out


@functools.partial(jax.jit, static_argnames="folds")
def _fold_params(layers: Params, bns: Params, folds: tuple) -> Params:
    """:func:`_fold_all` of traced weights as one program (eagerly, each fold's few ops
    compiled once per channel count: 84 small programs on the PP-OCR classifier). The barrier
    keeps XLA from rewriting 1 / sqrt into rsqrt (up to 4 ulp off on the CPU), so the kernels
    equal numpy's bit for bit (the biases may differ in the last bits: XLA fuses their
    multiply-add). Concrete float32 weights fold with numpy instead: compiling this
    program took 0.36 s of a fresh process's ``optimize`` of the classifier."""
    return _fold_all(jnp, layers, bns, folds, jax.lax.optimization_barrier)


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


#: Ops whose per-axis attributes are rewritten when a layout region changes axes.
_WINDOW_OPS = ("MaxPool", "AveragePool", "SumPool")
_PER_AXIS_ATTRS = ("window", "strides", "padding", "ceil_extra", "window_dilation")


def _layout_free(graph: Graph, node: Node) -> bool:
    """Whether ``node`` computes the same in any axis order (given its single activation)."""
    d = get_op(node.op, node.name)
    if d.unary is not None or node.op in ("Relu", "Clip", "LeakyRelu", "HardSigmoid"):
        return len([t for t in node.inputs if t not in graph.constants]) == 1 and all(
            graph.tensors[t].size == 1 for t in node.inputs[1:])
    if node.op in ("QuantizeLinear", "DequantizeLinear"):  # per tensor only
        return all(graph.tensors[t].size == 1 for t in node.inputs[1:])
    return False


def _relayout(graph: Graph, node: Node, perm: list[int]) -> Node | None:
    """``node`` rewritten to read and write tensors whose axis ``perm[i]`` is its axis ``i``
    (None if it cannot be)."""
    if _layout_free(graph, node):
        return node
    a = dict(node.attrs)
    if node.op == "ConvTranspose" and "data_layout" not in a:  # saved before it had one
        a["data_layout"] = "NC" + "DHW"[3 - len(a["strides"]):]
    if node.op in ("Conv", "ConvTranspose") and len(a["data_layout"]) == len(perm):
        layout = [""] * len(perm)
        for i, c in enumerate(a["data_layout"]):
            layout[perm[i]] = c
        a["data_layout"] = "".join(layout)
        return node.replace(attrs=a)
    if node.op in _WINDOW_OPS and len(a["window"]) == len(perm):
        for k in _PER_AXIS_ATTRS:
            if k in a:
                v = [None] * len(perm)
                for i, x in enumerate(a[k]):
                    v[perm[i]] = x
                a[k] = v
        return node.replace(attrs=a)
    if node.op == "BatchNormalization":
        a["axis"] = perm[int(a["axis"]) % len(perm)]
        return node.replace(attrs=a)
    return None


def absorb_transposes(graph: Graph, params: Params) -> tuple[Graph, Params]:
    """Remove layout Transposes: a Transpose whose output only flows through layout-aware or
    layout-free operators (Conv, pools, BatchNormalization, unary activations, per-tensor
    Quantize/DequantizeLinear) into Transposes with the inverse permutation is removed together
    with them, and the operators in between are rewritten for the original axis order (a Conv's
    ``data_layout``, a pool's per-axis windows).

    An NHWC model exported to ONNX (which has only NCHW Conv) and imported back thus loses the
    ``NHWC -> NCHW -> NHWC`` Transposes around its convolutions and pools, which would otherwise
    run as separate passes over memory (or on the host CPU) in :func:`npujax.lower`. The result
    computes the same function (the same operators on permuted axes).

    Returns:
      ``(graph, params)``; params are unchanged.
    """
    changed = True
    while changed:
        changed = False
        for t in graph.nodes:
            if t.op != "Transpose" or t.inputs[0] in graph.constants:
                continue
            new = _absorb(graph, t)
            if new is not None:
                graph, changed = new, True
                break
    return graph, params


def _absorb(graph: Graph, t: Node) -> Graph | None:
    """``graph`` without Transpose ``t`` and the inverse Transposes closing its region, or
    None when the region reaches an operator that depends on the axis order."""
    perm = [int(p) for p in t.attrs["perm"]]
    inverse = [perm.index(i) for i in range(len(perm))]
    region: dict[str, Node] = {}
    exits: list[Node] = []
    todo = [t.outputs[0]]
    seen: set[str] = set()
    while todo:
        tensor = todo.pop()
        if tensor in seen:
            continue
        seen.add(tensor)
        if tensor in graph.outputs:
            return None
        for c in graph.consumers(tensor):
            if c.op == "Transpose" and [int(p) for p in c.attrs["perm"]] == inverse:
                if c.outputs[0] in graph.outputs:
                    return None  # keep the model's output name
                exits.append(c)
                continue
            if c.inputs[0] != tensor or any(i in seen or i == tensor for i in c.inputs[1:]):
                return None  # the region tensor is not the node's activation
            new = _relayout(graph, c, perm)
            if new is None or len(c.outputs) != 1:
                return None
            region[c.name] = new
            todo.extend(c.outputs)
    if not exits:
        return None
    rename = {t.outputs[0]: t.inputs[0]}
    rename.update({e.outputs[0]: e.inputs[0] for e in exits})
    drop = {t.name} | {e.name for e in exits}
    nodes = []
    for n in graph.nodes:
        if n.name in drop:
            continue
        n = region.get(n.name, n)
        nodes.append(n.replace(inputs=tuple(rename.get(i, i) for i in n.inputs)))
    tensors = dict(graph.tensors)
    for n in region.values():
        for o in n.outputs:
            shape = graph.tensors[o].shape
            new_shape = [0] * len(shape)
            for i, d in enumerate(shape):
                new_shape[perm[i]] = d
            tensors[o] = TensorType(tuple(new_shape), graph.tensors[o].dtype)
    return graph.replace(nodes=tuple(nodes), tensors=tensors)


#: binary operators that compute elementwise on activations of one shape
_ELEMENTWISE_BINARY = ("Add", "Sub", "Mul", "Div", "Max", "Min")


def channels_last(graph: Graph, params: Params) -> tuple[Graph, Params]:
    """The same model computing on channels-last (NHWC) activations instead of NCHW.

    An ONNX export of a PyTorch model is NCHW throughout (ONNX's Conv has no other layout);
    the same architecture as a TensorFlow Lite model is NHWC, input included. On an NPU whose
    activations are NHWC (``layout.activation_layout``), :func:`npujax.lower` costs an NCHW
    model's input and output conversions as layers of their own, which an NHWC model of the
    same architecture does not have. This pass rewrites the whole graph the way an NHWC
    converter does (e.g. onnx2tf, TensorFlow Lite's converter): every 4-D activation, graph
    inputs and outputs included, is the old one transposed by ``(0, 2, 3, 1)``; a Conv's or
    ConvTranspose's ``data_layout`` becomes ``NHWC`` (its kernel stays), a Transpose of a 4-D
    activation takes the composed permutation (an Identity for ``(0, 2, 3, 1)``: the NHWC view
    a detection head reshapes is the activation itself), pools, BatchNorm
    and Concat/Split take the permuted axes, GlobalAveragePool becomes an ``AveragePool`` over
    the whole ``H x W`` window (Keras' form), and a Flatten or Reshape of a ``1 x 1`` spatial
    tensor is unchanged (both orders flatten alike). Layout-free operators (unary activations,
    elementwise operators between activations of one shape or with a scalar constant) are kept.
    The model then computes ``f(x.transpose(0, 2, 3, 1))`` where it computed ``f(x)`` (outputs
    of rank 4 transposed alike). A graph with no NCHW Conv and no GlobalAveragePool is
    returned unchanged.

    Args:
      graph: a graph from :func:`npujax.from_onnx` (after :func:`optimize` or before).
      params: its params (unchanged: kernels keep their ``kernel_layout``).

    Returns:
      ``(graph, params)``.

    Raises:
      GraphError: a 4-D activation reaches an operator whose meaning depends on the axis order
        and that this pass does not rewrite (named with its node), e.g. a Reshape of a spatial
        tensor, a Slice, a per-channel constant operand or a 4-D MatMul.
    """
    if not any((n.op == "Conv" and n.attrs.get("data_layout") == "NCHW")
               or n.op == "GlobalAveragePool" for n in graph.nodes):
        return graph, params
    perm = [0, 3, 1, 2]  # old axis i is new axis perm[i]
    moved = {t for t in graph.inputs if len(graph.tensors[t].shape) == 4}
    nodes = []
    for n in graph.nodes:
        acts = [t for t in n.inputs if t not in graph.constants]
        if not any(t in moved for t in acts):
            nodes.append(n)
            continue
        where = f"channels_last: node {n.name!r} ({n.op})"
        rank4_out = all(len(graph.tensors[o].shape) == 4 for o in n.outputs)
        new: Node | None = None
        if n.op == "Transpose":
            # old y = x_old.transpose(p) and x_old = x_new.transpose(0, 3, 1, 2): y is
            # x_new.transpose(q), q[i] = (0, 3, 1, 2)[p[i]], in its own (unmoved) order; the
            # NCHW -> NHWC Transpose before a detection head's Reshape becomes an Identity
            q = [(0, 3, 1, 2)[int(p)] for p in n.attrs["perm"]]
            nodes.append(n.replace(op="Identity", attrs={}) if q == [0, 1, 2, 3] else
                         n.replace(attrs={**n.attrs, "perm": q}))
            continue
        if n.op in ("Flatten", "Reshape"):
            shape = graph.tensors[n.inputs[0]].shape
            out_rank = len(graph.tensors[n.outputs[0]].shape)
            if math.prod(int(d) for d in shape[2:]) != 1 or out_rank == 4:
                raise GraphError(f"{where} reshapes a {shape} activation whose spatial size is "
                                 "not 1 x 1: its element order depends on the layout.")
            nodes.append(n)
            continue
        if n.op == "GlobalAveragePool":
            _, h, w = graph.tensors[n.inputs[0]].shape[1:]
            new = n.replace(op="AveragePool", attrs={
                "window": [1, h, w, 1], "strides": [1, 1, 1, 1], "padding": [[0, 0]] * 4,
                "window_dilation": [1, 1, 1, 1], "count_include_pad": 0,
                "ceil_extra": [0, 0, 0, 0]})
        elif n.op in ("Concat", "Split"):
            if all(t in moved for t in acts) and len(acts) == len(n.inputs):
                new = n.replace(attrs={**n.attrs, "axis": perm[int(n.attrs["axis"])]})
        elif n.op in _ELEMENTWISE_BINARY:
            shapes = {graph.tensors[t].shape for t in acts}
            consts_scalar = all(graph.tensors[t].size == 1 for t in n.inputs
                                if t in graph.constants)
            if all(t in moved for t in acts) and len(shapes) == 1 and consts_scalar:
                new = n
        elif len(acts) == 1 and acts[0] == n.inputs[0] and len(n.outputs) == 1:
            new = _relayout(graph, n, perm)
        if new is None or not rank4_out:
            raise GraphError(f"{where} reads a 4-D activation in a way that depends on the "
                             "axis order and cannot be rewritten channels-last.")
        nodes.append(new)
        moved.update(n.outputs)
    tensors = dict(graph.tensors)
    for t in moved:
        shape = graph.tensors[t].shape
        new_shape = [0] * 4
        for i, d in enumerate(shape):
            new_shape[perm[i]] = d
        tensors[t] = TensorType(tuple(new_shape), graph.tensors[t].dtype)
    return graph.replace(nodes=tuple(nodes), tensors=tensors), params


def optimize(graph: Graph, params: Params) -> tuple[Graph, Params]:
    """The standard inference pipeline: :func:`absorb_transposes`, :func:`fold_batchnorm`, then
    :func:`fuse_epilogues`."""
    return fuse_epilogues(*fold_batchnorm(*absorb_transposes(graph, params)))


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


def unfold_batch(graph: Graph, params: Params) -> tuple[Graph, Params]:
    """The same model with the traced batch size unfolded from its Reshape shapes, so that it
    runs (and exports, :func:`npujax.to_onnx`) at any batch size.

    An ONNX model imported at a fixed input shape (``--input-shape x=1,...``) often reshapes to
    a literal leading dimension: PaddlePaddle exports ``x.reshape([x.shape[0], -1])`` with the
    batch folded to ``[1, 200]``, which :func:`rebatch` refuses. A Reshape whose target shape
    starts with the traced batch ``b``, whose input's leading dimension is ``b``, and which
    keeps the product of the other dimensions, copies that leading axis: it is rewritten with
    ONNX's ``0`` (copy the input dimension) there. The rewrite is kept only if it is *proved* to
    make the leading axis the batch: abstract evaluation (``jax.eval_shape``, nothing computed)
    of the rewritten model at batch ``b + 1`` gives every activation the traced shape with only
    its leading dimension changed (a Reshape that moved the batch into another axis changes
    another dimension, and is refused), and :func:`rebatch` accepts the graph (no Reshape left
    with a literal leading dimension, no operator that depends on the batch). Otherwise the
    graph is returned unchanged.

    Args:
      graph: the model (its first input's leading dimension is the traced batch).
      params: its params (for the abstract evaluation; returned unchanged).

    Returns:
      ``(graph, params)``: ``graph`` itself when no Reshape folds the batch or the rewrite
      cannot be proved.

    References:
      ONNX Reshape (``0`` copies the input dimension, ``allowzero=0``),
      https://onnx.ai/onnx/operators/onnx__Reshape.html.
    """
    if not graph.inputs or not graph.tensors[graph.inputs[0]].shape:
        return graph, params
    b = graph.tensors[graph.inputs[0]].shape[0]
    nodes, changed = [], False
    for n in graph.nodes:
        shape = n.attrs.get("shape") if n.op == "Reshape" else None
        if shape and shape[0] == b and b > 0:
            t_in = graph.tensors[n.inputs[0]].shape
            t_out = graph.tensors[n.outputs[0]].shape
            if (t_in and t_out and t_in[0] == b and t_out[0] == b
                    and math.prod(t_in[1:]) == math.prod(t_out[1:])):
                n = n.replace(attrs={**n.attrs, "shape": [0, *shape[1:]]})
                changed = True
        nodes.append(n)
    if not changed:
        return graph, params
    new = graph.replace(nodes=tuple(nodes))
    try:
        rebatch(new, b + 1)
    except GraphError:
        return graph, params
    if not _leading_axis_is_batch(new, params, b):
        return graph, params
    return new, params


def _leading_axis_is_batch(graph: Graph, params: Params, batch: int) -> bool:
    """Whether ``graph`` evaluated (abstractly) at ``batch + 1`` examples gives every node
    output its declared shape with only a leading ``batch`` changed to ``batch + 1``."""
    from npujax.ir.execute import execute

    def observe(node, inputs, outputs):
        return None if outputs is None else tuple(outputs)

    xs = [jax.ShapeDtypeStruct((batch + 1, *graph.tensors[i].shape[1:]),
                               jnp.dtype(graph.tensors[i].dtype)) for i in graph.inputs]
    try:
        _, records = jax.eval_shape(lambda *a: execute(graph, params, list(a), observe=observe),
                                    *xs)
    except Exception:  # noqa: BLE001 -- any failure to trace at another batch: not proved
        return False
    for node in graph.nodes:
        for name, out in zip(node.outputs, records.get(node.name, ())):
            want = graph.tensors[name].shape
            if want and want[0] == batch:
                want = (batch + 1, *want[1:])
            if tuple(out.shape) != tuple(want):
                return False
    return True

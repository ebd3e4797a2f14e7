"""Per-layer workloads of a Graph on an NPU: device placement, aligned GEMM shapes, transfers.

This is the bridge from the Graph to the NPU model. Each costed node becomes one
:class:`Workload` of static integers:

* **Placement.** A node runs on the NPU if its operator is in ``spec.ops.supported`` and meets the
  constraints (Conv kernel size and stride); otherwise it falls back to the host CPU. Shape-only
  nodes (Reshape, Flatten, ...) cost nothing, and so does an activation ``QuantizeLinear ->
  DequantizeLinear`` pair of an imported QDQ model (:func:`grid_pairs`). An activation fused
  into a GEMM that the NPU's output stage cannot apply becomes its own layer (on the vector unit
  or the CPU).
* **Alignment.** Channels are padded to ``spec.layout.channel_alignment`` (and to ``c0`` in the
  ``NC1HWC0`` layout): compute and bytes use the padded counts, so latency is a staircase in the
  channel count (63 and 64 channels cost the same, 65 costs a whole extra block).
* **Layout.** If the NPU keeps activations in another layout than the model (e.g. NHWC vs an ONNX
  model's NCHW), a transform layer is added where tensors enter or leave the NPU.
* **Elementwise fusion.** An elementwise op on the NPU whose activation inputs all come from the
  current fusion group (a GEMM and the elementwise ops already fused after it) joins the group:
  it costs vector-unit cycles but no DRAM traffic (``fused_into`` names the group's layer). So
  hard-swish written as ``x * clip(x + 3, 0, 6) / 6`` after a convolution stays on chip, while a
  residual ``Add`` that also reads an older tensor is costed with its DRAM reads. What joins a
  group is the preset's ``ops.fusion`` (:data:`~npujax.hw.FUSION_LEVELS`): nothing for ``none``;
  for ``residual`` and ``layer`` also an elementwise op with some inputs from outside the group
  (a residual ``Add``: it reads only those from DRAM, and the activation after it joins too).
* **Transfers.** A CPU layer receives every input produced on the NPU and returns every output
  consumed there over the host link (``link_in_elems``, ``link_out_elems``, ``link_transfers``).
"""

from __future__ import annotations

import dataclasses
import math
import weakref
from typing import Any

import numpy as np

from npujax.errors import LimitError
from npujax.hw.spec import FUSION_LEVELS, NpuSpec
from npujax.ir.graph import Graph, Node
from npujax.limits import MAX_EXACT_COUNT
from npujax.ops import OPS, get_op

__all__ = ["Workload", "workloads", "model_layout", "CPU_OPS_PER_SPECIAL"]

#: Host-CPU operations one special function (exp, erf, tanh, reciprocal, rsqrt) costs: a
#: vectorised polynomial evaluation of about ten multiply-adds (as in SLEEF or Eigen's exp).
CPU_OPS_PER_SPECIAL = 10


@dataclasses.dataclass(frozen=True)
class Workload:
    """One costed layer.

    Attributes:
      name, op: the Graph node's name and operator (layout transforms: ``<tensor>:layout``).
      kind: ``"gemm"`` (MAC array), ``"vector"`` (vector unit), ``"layout"`` (layout transform
        on the vector unit).
      device: ``"npu"`` or ``"cpu"``; ``reason`` says why a layer fell back to the CPU.
      M, K, N: GEMM extents after im2col and channel padding (``M`` = batch x output pixels,
        ``K`` = C_in/groups x k_h x k_w, ``N`` = C_out/groups), for one group; 0 otherwise.
      groups: number of independent GEMMs (conv groups; 1 otherwise).
      macs: true multiply-accumulates (unpadded).
      weight_elems, bias_elems: weight and (int32) bias elements moved from DRAM (padded).
      in_elems, out_elems: activation elements read and written (padded).
      vector_ops: elementwise (ALU) operations for vector/layout layers.
      special_ops: special-function evaluations (exp, erf, tanh, reciprocal, rsqrt) of a
        vector layer (Softmax, LayerNorm, GELU; :class:`~npujax.ops.VectorWork`).
      cpu_ops: operations if run on the CPU (2 per MAC; a special function counts
        :data:`CPU_OPS_PER_SPECIAL`).
      link_in_elems, link_out_elems, link_transfers: host-link traffic of a CPU layer.
      epilogue: activations applied in the layer's output stage.
      producer: index (in the workload list) of the layer that produced this layer's first
        activation input, -1 for a graph input; used to cost precision conversions.
      fused_into: for an elementwise layer fused into a preceding GEMM's output stage, that
        layer's name (its DRAM traffic is then zero, or that of its inputs from outside the group).
      inputs: per activation input read from DRAM, ``(row, elems)``: the index of the row that
        produced it (-1 for a graph input) and its (padded) elements; inputs from the row's own
        fusion group are left out. Used by the cross-layer schedule
        (:mod:`npujax.plan.passes.cross_layer`).
      out_rows: batch x height of a 4-D output (the rows a depth-first stripe splits), else 0.
      window_rows, stride_rows: the kernel (window) height and stride of a Conv or pooling
        layer along H (1 for other layers): a stripe of ``h`` output rows reads
        ``(h - 1) * stride_rows + window_rows`` input rows.
      graph_output: the row's output is a graph output (it must reach DRAM).
      window_cols: the kernel width of a Conv (1 for other layers).
      out_cols: width of a 4-D output (``F``), else 0.
      images: batch of a 4-D output (``N``), else 0; ``out_rows / images`` is the output
        height ``E``. The row-stationary dataflow reads the conv geometry from these
        (:func:`npujax.systolic.rs_conv`).
    """

    name: str
    op: str
    kind: str
    device: str = "npu"
    reason: str = ""
    M: int = 0
    K: int = 0
    N: int = 0
    groups: int = 1
    macs: int = 0
    weight_elems: int = 0
    bias_elems: int = 0
    in_elems: int = 0
    out_elems: int = 0
    vector_ops: int = 0
    special_ops: int = 0
    cpu_ops: int = 0
    link_in_elems: int = 0
    link_out_elems: int = 0
    link_transfers: int = 0
    epilogue: tuple[str, ...] = ()
    producer: int = -1
    fused_into: str = ""
    inputs: tuple[tuple[int, int], ...] = ()
    out_rows: int = 0
    window_rows: int = 1
    stride_rows: int = 1
    graph_output: bool = False
    window_cols: int = 1
    out_cols: int = 0
    images: int = 0


def _pad(c: int, align: int) -> int:
    return -(-c // align) * align


def model_layout(graph: Graph) -> str:
    """The model's own activation layout: that of its first Conv, else ``NHWC``."""
    for n in graph.nodes:
        if n.op == "Conv":
            return n.attrs["data_layout"]
    return "NHWC"


def _align(spec: NpuSpec | None) -> int:
    if spec is None:
        return 1
    a = spec.layout.channel_alignment
    if spec.layout.activation_layout == "NC1HWC0":
        a = int(np.lcm(a, spec.layout.c0))
    return a


def _padded_elems(shape: tuple[int, ...], layout: str, align: int) -> int:
    """Elements of an activation tensor with its channel dimension padded."""
    if align == 1 or len(shape) < 2:
        return math.prod(int(d) for d in shape)
    c_axis = layout.index("C") if len(shape) == 4 else len(shape) - 1
    c = shape[c_axis]
    rest = math.prod(int(d) for i, d in enumerate(shape) if i != c_axis)
    return rest * _pad(c, align)  # (exact Python ints: no int64 wrap, no 0 // 0)


def _placement(node: Node, spec: NpuSpec | None, graph_constants=frozenset()) -> str:
    """'' if the NPU runs ``node``, else the reason it falls back to the CPU."""
    if node.op == "CpuFallback":
        return f"{node.attrs.get('onnx_op', 'operator')} has no npujax implementation"
    if spec is None:
        if OPS[node.op].cost == "host":
            return f"{node.op} has no NPU model"
        return ""
    if node.op == "Div" and node.inputs[1] in graph_constants and "Mul" in spec.ops.supported:
        return ""  # a division by a constant is a multiplier (requantization scale) on an NPU
    if node.op not in spec.ops.supported:
        return f"{node.op} not supported by {spec.name}"
    if node.op == "Conv":
        k = node.attrs["kernel_shape"]
        kl = node.attrs["kernel_layout"]
        kh, kw = k[kl.index("H")], k[kl.index("W")]
        if max(kh, kw) > spec.ops.conv_max_kernel:
            return f"{kh}x{kw} kernel > max {spec.ops.conv_max_kernel}"
        if max(node.attrs["strides"]) > spec.ops.conv_max_stride:
            return f"stride {max(node.attrs['strides'])} > max {spec.ops.conv_max_stride}"
    if node.op == "Resize" and spec.ops.resize_max_scale > 0:
        scale = max(float(x) for x in node.attrs["scales"])
        if scale > spec.ops.resize_max_scale:
            return f"{scale:.3g}x resize > max {spec.ops.resize_max_scale:g}x"
    return ""


def _rows(graph: Graph, node: Node, layout: str) -> dict[str, Any]:
    """``out_rows``, ``window_rows`` and ``stride_rows`` of a node (see :class:`Workload`)."""
    y = graph.tensors[node.outputs[0]].shape
    if len(y) != 4:
        return {}
    h = layout.index("H")
    out: dict[str, Any] = {"out_rows": int(y[0]) * int(y[h]), "images": int(y[0]),
                           "out_cols": int(y[layout.index("W")])}
    a = node.attrs
    if node.op == "Conv":
        k = a["kernel_shape"][a["kernel_layout"].index("H")]
        kw = a["kernel_shape"][a["kernel_layout"].index("W")]
        out.update(window_rows=int(k), window_cols=int(kw), stride_rows=int(a["strides"][0]))
    elif "window" in a and len(a["window"]) == 4:
        out.update(window_rows=int(a["window"][h]), stride_rows=int(a["strides"][h]))
    return out


def _array_work(graph: Graph, node: Node, align: int) -> dict:
    fn = get_op(node.op, node.name).array_work
    assert fn is not None
    w = fn(node, [graph.tensors[t].shape for t in node.inputs],
           [graph.tensors[t].shape for t in node.outputs], align)
    return dict(w._asdict(), cpu_ops=2 * w.macs)


def grid_pairs(graph: Graph) -> frozenset[str]:
    """The nodes of the activation ``QuantizeLinear -> DequantizeLinear`` pairs of ``graph``.

    In a QDQ model (``to_onnx`` with a QuantSpec, onnxruntime's quantizer) such a pair states
    the grid of an integer tensor; an integer NPU holds that tensor as codes already (its input
    quantization is the producer's requantization epilogue), so the pair is no computation and
    the NPU model costs it like a Reshape, ``free``: a QDQ export lowers like the quantized graph
    it came from. A QuantizeLinear whose codes reach anything but a DequantizeLinear, or a graph
    output, is not a pair (it stays a vector-unit layer).

    Returns:
      The names of the QuantizeLinear and DequantizeLinear nodes of the pairs.
    """
    out: set[str] = set()
    for n in graph.nodes:
        if n.op != "QuantizeLinear" or n.inputs[0] in graph.constants \
                or n.outputs[0] in graph.outputs:
            continue
        users = graph.consumers(n.outputs[0])
        if users and all(u.op == "DequantizeLinear" for u in users):
            out.add(n.name)
            out.update(u.name for u in users)
    return frozenset(out)


def lowering_cost(graph: Graph) -> dict[str, str]:
    """``{node: cost class}`` as the NPU model sees it: the operator's class
    (:data:`npujax.ops.registry.CostClass`), ``free`` for the nodes of :func:`grid_pairs`."""
    pairs = grid_pairs(graph)
    return {n.name: "free" if n.name in pairs else get_op(n.op, n.name).cost
            for n in graph.nodes}


def _reaches_npu(graph: Graph, tensor: str, placements: dict[str, str],
                 cost: dict[str, str]) -> bool:
    """Whether ``tensor`` is a graph output or read by an NPU node (looking through free ops)."""
    if tensor in graph.outputs:
        return True
    for c in graph.consumers(tensor):
        if cost[c.name] == "free":
            if any(_reaches_npu(graph, t, placements, cost) for t in c.outputs):
                return True
        elif not placements[c.name]:
            return True
    return False


#: ``{graph: {spec: workloads}}``: graphs and specs are immutable, so a graph lowered again
#: (a sweep over precisions, a search) reuses its workloads; entries die with their graph.
_CACHE: weakref.WeakKeyDictionary[Graph, dict[Any, tuple[Workload, ...]]] = \
    weakref.WeakKeyDictionary()


def workloads(graph: Graph, spec: NpuSpec | None = None) -> list[Workload]:
    """The costed layers of ``graph`` on ``spec``, in execution order.

    Run :func:`npujax.optimize` first so BatchNorm is folded and activations are fused, as
    the NPU compiler would; otherwise they are costed as separate layers.

    Args:
      graph: the model graph.
      spec: the NPU; ``None`` places everything on an NPU with no alignment, layout or operator
        constraints (the bare GEMM/roofline view).

    Returns:
      One :class:`Workload` per costed node, plus layout-transform and unfused-epilogue layers.

    Raises:
      LimitError: a layer whose MACs, operations, GEMM extents or tensor elements exceed 2**53
        (:data:`npujax.limits.MAX_EXACT_COUNT`), beyond which counts would not be exact.
    """
    try:
        key: Any = spec
        per_graph = _CACHE.setdefault(graph, {})
        hit = per_graph.get(key)
    except TypeError:  # a spec with traced or array fields: not hashable, not cached
        return _workloads(graph, spec)
    if hit is None:
        hit = per_graph[key] = tuple(_workloads(graph, spec))
    return list(hit)


def _workloads(graph: Graph, spec: NpuSpec | None) -> list[Workload]:
    align = _align(spec)
    m_layout = model_layout(graph)
    npu_layout = spec.layout.activation_layout if spec else m_layout
    device: dict[str, str] = {t: "npu" for t in graph.inputs}
    made_by: dict[str, int] = {}
    device.update({t: "const" for t in graph.constants})
    rows: list[Workload] = []
    pending_layout_in: set[str] = set(graph.inputs)

    padded: dict[str, int] = {}

    def act_elems(t: str) -> int:
        if t not in padded:
            padded[t] = _padded_elems(graph.tensors[t].shape, m_layout, align)
        return padded[t]

    def layout_row(t: str, direction: str) -> None:
        shape = graph.tensors[t].shape
        if npu_layout == m_layout or len(shape) != 4:
            return
        n = act_elems(t)
        target = npu_layout if direction == "in" else m_layout
        rows.append(Workload(f"{t}:{direction}", f"To{target}", "layout", in_elems=n,
                             out_elems=n, vector_ops=n, producer=made_by.get(t, -1),
                             inputs=((made_by.get(t, -1), n),)))

    cost = lowering_cost(graph)
    placements = {n.name: _placement(n, spec, graph.constants) for n in graph.nodes
                  if cost[n.name] != "free"}
    if spec is not None and spec.ops.fallback == "rest_of_graph":
        # one partition: the first unsupported operator and every operator after it run on
        # the host (the Coral Edge TPU compiler's documented behaviour)
        first = next((n for n in graph.nodes if placements.get(n.name)), None)
        if first is not None:
            after = False
            for n in graph.nodes:
                after = after or n is first
                if after and n.name in placements and not placements[n.name]:
                    placements[n.name] = (f"after {first.name!r} ({first.op}), the first "
                                          f"layer {spec.name} leaves to the host")
    level = FUSION_LEVELS.index(spec.ops.fusion) if spec else FUSION_LEVELS.index("elementwise")
    residual = level >= FUSION_LEVELS.index("residual")
    group: set[str] = set()  # tensors of the current fusion group (a GEMM and its elementwise ops)
    group_head = ""
    for node in graph.nodes:
        if cost[node.name] == "free":
            for t in node.outputs:
                device[t] = device.get(node.inputs[0], "npu")
                if node.inputs[0] in made_by:
                    made_by[t] = made_by[node.inputs[0]]
                if node.inputs[0] in group:
                    group.add(t)
            continue
        reason = placements[node.name]
        dev = "cpu" if reason else "npu"
        ins = [t for t in node.inputs if t not in graph.constants]
        if cost[node.name] == "array":
            ins = ins[:1]  # a second operand (MatMul, Einsum) is the array's stationary operand
        if dev == "npu":
            for t in ins:
                if t in pending_layout_in:  # a graph input entering the NPU
                    layout_row(t, "in")
                    pending_layout_in.discard(t)
                elif device.get(t) == "cpu":
                    layout_row(t, "in")
        base: dict = {}
        if cost[node.name] == "array":
            base = _array_work(graph, node, align if dev == "npu" else 1)
            kind = "gemm"
        else:
            kind = "vector"
            vw = get_op(node.op, node.name).vector_work
            if vw is not None:
                work = vw(node, [graph.tensors[t].shape for t in node.inputs],
                          [graph.tensors[t].shape for t in node.outputs])
                base = dict(vector_ops=work.alu_ops, special_ops=work.special_ops,
                            cpu_ops=work.alu_ops + CPU_OPS_PER_SPECIAL * work.special_ops)
            else:
                y = graph.tensors[node.outputs[0]]
                window = math.prod(int(d) for d in node.attrs.get("window", [1]))
                ops = y.size * window
                base = dict(vector_ops=ops, cpu_ops=ops)
        elems_in = sum(act_elems(t) if dev == "npu" else graph.tensors[t].size for t in ins)
        y_elems = sum(act_elems(t) if dev == "npu" else graph.tensors[t].size
                      for t in node.outputs)
        fused_into = ""
        from_dram = ins
        if dev == "npu" and kind == "gemm":
            group, group_head = set(node.outputs), node.name
        elif (dev == "npu" and cost[node.name] == "elementwise" and group and ins and level
              and (all(t in group for t in ins) or (residual and any(t in group for t in ins)))):
            fused_into = group_head  # stays on chip: no DRAM traffic but its outside inputs'
            from_dram = [t for t in ins if t not in group]
            elems_in, y_elems = sum(act_elems(t) for t in from_dram), 0
            group |= set(node.outputs)
        else:
            group, group_head = set(), ""
        link: dict[str, Any] = {}
        if dev == "cpu":
            to_cpu = [t for t in ins if device.get(t) == "npu"]
            back = [t for t in node.outputs if _reaches_npu(graph, t, placements, cost)]
            for t in to_cpu:
                if t in pending_layout_in:
                    pending_layout_in.discard(t)
                else:
                    layout_row(t, "out")
            link = dict(link_in_elems=sum(graph.tensors[t].size for t in to_cpu),
                        link_out_elems=sum(graph.tensors[t].size for t in back),
                        link_transfers=len(to_cpu) + len(back))
        epilogue = tuple(node.attrs.get("epilogue", ()))
        fused = tuple(e for e in epilogue if spec is None or e in spec.ops.fused_activations)
        rows.append(Workload(node.name, node.op, kind, device=dev, reason=reason,
                             in_elems=elems_in, out_elems=y_elems,
                             epilogue=fused if dev == "npu" else epilogue,
                             producer=made_by.get(ins[0], -1) if ins else -1,
                             fused_into=fused_into,
                             inputs=tuple((made_by.get(t, -1), act_elems(t)) for t in from_dram),
                             **_rows(graph, node, m_layout), **base, **link))
        if dev == "npu":
            for e in epilogue:
                if e in fused:
                    continue
                assert spec is not None  # without a spec every epilogue is fused
                e_dev = "npu" if e in spec.ops.supported else "cpu"
                n_out = y_elems
                extra: dict[str, Any] = {}
                if e_dev == "cpu":
                    extra = dict(link_in_elems=n_out, link_out_elems=n_out, link_transfers=2)
                rows.append(Workload(f"{node.name}/{e}", e, "vector", device=e_dev,
                                     reason="" if e_dev == "npu" else
                                     f"{e} not supported by {spec.name}",
                                     in_elems=n_out, out_elems=n_out, vector_ops=n_out,
                                     cpu_ops=n_out, producer=len(rows) - 1,
                                     inputs=((len(rows) - 1, n_out),),
                                     out_rows=rows[-1].out_rows, **extra))
        for t in node.outputs:
            device[t] = dev
            made_by[t] = len(rows) - 1
    for t in graph.outputs:
        if t in made_by:
            i = made_by[t]
            rows[i] = dataclasses.replace(rows[i], graph_output=True)
        if device.get(t) == "npu":
            layout_row(t, "out")
    for w in rows:  # int64 cost arithmetic is exact to 2**63; npujax promises 2**53
        for field in ("macs", "in_elems", "out_elems", "weight_elems", "vector_ops", "cpu_ops",
                      "M", "K", "N"):  # (the float64 ceil_div is exact to 2**53, npujax._relax)
            if getattr(w, field) > MAX_EXACT_COUNT:
                raise LimitError(
                    f"layer {w.name!r} ({w.op}) has {getattr(w, field):,} {field}, more than "
                    f"the 2**53 the cost model counts exactly; lower the batch size or the "
                    "input resolution (or split the layer).")
    return rows

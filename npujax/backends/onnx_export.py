"""Export a (quantized) npujax Graph as a standard ONNX QDQ model that onnxruntime runs.

Each quantized GEMM node (Conv, Gemm; see :func:`npujax.quant_spec`) becomes the QDQ
pattern onnxruntime and NPU compilers recognise:

* input activation: ``QuantizeLinear -> DequantizeLinear`` with the calibrated per-tensor
  ``act_scale``/``act_zero_point`` (uint8 for unsigned formats, int8 for signed);
* weight: an int8 initializer ``round(w / scale)`` with the same symmetric per-channel min-max
  scale ``execute`` uses, then ``DequantizeLinear`` with ``axis`` = the output-channel axis
  (0 for Conv ``OIHW``, 1 for Gemm ``[K, N]``);
* bias: an int32 initializer ``round(b / (act_scale * weight_scale))``, zero point 0, dequantized
  with that per-channel scale (the integer-NPU convention, where the bias is added to the int32
  accumulator).

FP8 layers (E4M3FN / E5M2) export the same pattern with float8 codes and float8 zero points
(``float8e4m3fn`` / ``float8e5m2``, opset 19) and a float bias; per-block weights
(``weight_block_size``) export a ``DequantizeLinear`` with the ``block_size`` attribute (opset 21
blocked quantization, ``axis`` = the input-channel axis: 1 for ``OIHW``, 0 for ``[K, N]``) and a
float bias. Models with such layers are written at opset :data:`QDQ_EXTENDED_OPSET`; others keep
:data:`EXPORT_OPSET`. Each layer is written on the grid its quantizer deploys (``act_grid``,
``weight_grid``): LSQ/LSQ+ layers with their learned steps.

Formats of 9-16 bits are stored in int16/uint16, which ``QuantizeLinear`` takes from opset 21
(the file is then written at :data:`QDQ_EXTENDED_OPSET`). Formats narrower than 8 bits are
stored in int8/uint8 (their codes fit); an activation format
narrower than 8 bits gets a ``Clip`` to its float range before ``QuantizeLinear``, so the codes
stay in the format's range. All other nodes map back to their ONNX operators. The file is written
atomically. Source of the semantics: the ONNX operator specification
(https://onnx.ai/onnx/operators/) and onnxruntime's QDQ format
(https://onnxruntime.ai/docs/performance/model-optimizations/quantization.html).
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from npujax._atomic import atomic_write_bytes
from npujax.backends.integer import requant_target
from npujax.errors import ConfigError, GraphError, NpujaxError, UnsupportedOpError
from npujax.ir.execute import layer_state
from npujax.ir.graph import SHAPES_ONLY_SOURCE, Graph, Node, Params, fresh_name
from npujax.numerics import FloatFormat, IntFormat
from npujax.numerics.fixed_point import quantize_bias
from npujax.ops import OPS, kernel_out_axis
from npujax.quantize.quantizers import QState
from npujax.quantize.spec import LayerQuant, QuantSpec

__all__ = ["to_onnx", "exported_biases", "EXPORT_OPSET", "QDQ_EXTENDED_OPSET"]

#: ONNX opset of exported models (HardSwish needs 14; ReduceMean keeps ``axes`` as attribute).
EXPORT_OPSET = 17
#: Opset of models with FP8 (needs 19) or per-block (needs 21) quantized layers.
QDQ_EXTENDED_OPSET = 21


def _int_dtype(fmt: IntFormat | FloatFormat) -> np.dtype:
    if isinstance(fmt, FloatFormat):
        return np.dtype(fmt.storage_dtype)
    if fmt.bits > 8:
        return np.dtype(np.int16 if fmt.signed else np.uint16)
    return np.dtype(np.int8 if fmt.signed else np.uint8)


class _Writer:
    """The ONNX graph being written; each operator's ``export(writer, node)`` calls these.

    Attributes:
      graph, params: the model being exported.
      quant, qstate: its quantization spec and (deployment) state.
      opset: the ONNX opset being written.
      nodes: the ONNX nodes written so far.
    """

    def __init__(self, graph: Graph, params: Params, quant: QuantSpec, qstate: Any,
                 int32_bias: bool, opset: int):
        self.graph, self.params = graph, params
        self.quant, self.qstate = quant, qstate
        self.int32_bias = int32_bias
        self.opset = opset
        self.nodes: list[onnx.NodeProto] = []
        self.inits: dict[str, onnx.TensorProto] = {}
        self.used: set[str] = set(graph.tensors) | {n.name for n in graph.nodes}
        # node names are their own ONNX namespace: a layer's node keeps the layer's name
        self.node_names: set[str] = set()
        self._after: list[onnx.NodeProto] = []

    # -- names, initializers, nodes
    def name(self, base: str) -> str:
        """A new unique ONNX name starting with ``base``."""
        return fresh_name(base, self.used)

    def init(self, base: str, value: Any, dtype: Any = None) -> str:
        """Add an initializer; returns its (unique) name."""
        arr = np.asarray(value, dtype)
        name = self.name(base)
        self.inits[name] = numpy_helper.from_array(arr, name)
        return name

    def i64(self, node: Node, what: str, value: Any) -> str:
        """An int64 initializer ``<node>.<what>`` (shapes, axes, pads as ONNX inputs)."""
        return self.init(f"{node.name}.{what}", np.asarray(value, np.int64))

    def add(self, op: str, inputs: list[str], outputs: list[str], name: str, **attrs: Any) -> None:
        """Add an ONNX node (its name made unique among the nodes)."""
        self.nodes.append(helper.make_node(op, inputs, outputs,
                                           name=fresh_name(name, self.node_names), **attrs))

    @staticmethod
    def onnx_dtype(dtype: np.dtype) -> int:
        """The ONNX element type of a numpy dtype."""
        return helper.np_dtype_to_tensor_dtype(np.dtype(dtype))

    def param(self, node: Node, role: str) -> np.ndarray:
        """A parameter of ``node`` as float32 numpy."""
        return np.asarray(self.params[node.name][role], np.float32)

    def layer_quant(self, node: Node) -> LayerQuant | None:
        """How ``node`` is quantized (None: float)."""
        return self.quant.get(node.name)

    def state(self, name: str) -> Any:
        """The quantization state of layer ``name`` (None if it has none)."""
        return layer_state(self.quant, self.qstate, name)

    def act_grid(self, name: str) -> tuple[np.ndarray, int]:
        """The deployed input grid ``(scale, zero_point)`` of layer ``name``.

        Raises:
          ConfigError: the layer quantizes its input but has no calibrated state.
        """
        lq = self.quant[name]
        state = self.state(name)
        if state is None:
            raise ConfigError(f"layer {name!r} quantizes its input but qstate has no entry "
                              "for it; pass the result of npujax.calibrate as qstate.")
        s, z = lq.quantizer.act_grid(lq, state)
        return np.asarray(s, np.float32).reshape(()), int(np.asarray(z).reshape(()))

    # -- layout helpers
    def to_channels_first(self, node: Node, axis: int, rank: int
                          ) -> tuple[str, str, list[int] | None]:
        """Input name and output name for an op whose channels sit on ``axis`` (not 1).

        Adds ``Transpose`` nodes so the ONNX op sees ``[N, C, *spatial]`` (the one after the op
        is written by :meth:`flush`); returns ``(x, y, perm)`` where ``perm`` maps the
        channels-first axes back to the node's axes, or ``(input, output, None)`` when the
        channels are already on axis 1.
        """
        if axis == 1:
            return node.inputs[0], node.outputs[0], None
        perm = [0, axis] + [i for i in range(1, rank) if i != axis]
        x = self.name(f"{node.inputs[0]}/nchw")
        self.add("Transpose", [node.inputs[0]], [x], f"{node.name}/to_nchw", perm=perm)
        y = self.name(f"{node.outputs[0]}/nchw")
        self._after = [helper.make_node("Transpose", [y], [node.outputs[0]],
                                        name=fresh_name(f"{node.name}/from_nchw",
                                                        self.node_names),
                                        perm=list(np.argsort(perm)))]
        return x, y, perm

    def flush(self) -> None:
        """Write the nodes :meth:`to_channels_first` deferred."""
        self.nodes.extend(self._after)
        self._after = []

    def epilogue(self, node: Node, y: str, out: str) -> None:
        """The activations fused into ``node`` (``attrs['epilogue']``), from ``y`` to ``out``,
        each written by its operator's exporter."""
        epi = list(node.attrs.get("epilogue", ()))
        for i, op in enumerate(epi):
            nxt = out if i == len(epi) - 1 else self.name(f"{node.name}/{op}")
            act = Node(f"{node.name}/{op}", op, (y,), (nxt,))
            export = OPS[op].export
            assert export is not None, op
            export(self, act)
            y = nxt

    # -- quantization (QDQ)
    def _qdq(self, x: str, out: str | None, fmt: IntFormat | FloatFormat, layer: str,
             prefix: str, what: str, grid: tuple[np.ndarray, int] | None = None) -> str:
        """``[Clip ->] QuantizeLinear -> DequantizeLinear`` of ``x`` on the input grid of
        ``layer`` (or ``grid``; the Clip only for integer formats narrower than their storage
        type)."""
        dt = _int_dtype(fmt)
        s, zp = self.act_grid(layer) if grid is None else grid
        scale = self.init(f"{prefix}.{what}_scale", s)
        zero = self.init(f"{prefix}.{what}_zero_point", zp, dt)
        if isinstance(fmt, IntFormat) and (fmt.qmin, fmt.qmax) != (int(np.iinfo(dt).min),
                                                                  int(np.iinfo(dt).max)):
            lo = self.init(f"{prefix}.{what}_min", np.float32((fmt.qmin - zp) * s))
            hi = self.init(f"{prefix}.{what}_max", np.float32((fmt.qmax - zp) * s))
            clipped = self.name(f"{x}/clip")
            self.add("Clip", [x, lo, hi], [clipped], f"{prefix}/{what}_clip")
            x = clipped
        q = self.name(f"{prefix}/{what}_q")
        dq = out if out is not None else self.name(f"{prefix}/{what}_dq")
        self.add("QuantizeLinear", [x, scale, zero], [q], f"{prefix}/{what}_quant")
        self.add("DequantizeLinear", [q, scale, zero], [dq], f"{prefix}/{what}_dequant")
        return dq

    def qdq_input(self, node: Node, x: str) -> str:
        """``x`` through the QDQ pair of ``node``'s input grid, or ``x`` if it is not quantized.

        Raises:
          ConfigError: the layer quantizes its input but qstate has no entry for it.
        """
        lq = self.layer_quant(node)
        if lq is None or lq.act is None:
            return x
        return self._qdq(x, None, lq.act, node.name, node.name, "act")

    def qdq_operand(self, node: Node, x: str) -> str:
        """``x``, the second operand of a GEMM of two activations (MatMul, Einsum), through the
        QDQ pair of its calibrated grid, or ``x`` if it is not quantized.

        Raises:
          ConfigError: no calibrated operand grid, or a search mixture.
        """
        lq = self.layer_quant(node)
        if lq is None or not lq.weight_candidates:
            return x
        if len(lq.weight_candidates) != 1:
            raise ConfigError(f"layer {node.name!r} has several candidate operand formats (a "
                              "search mixture); fix one width per layer before exporting.")
        s, z = lq.quantizer.operand_grid(node, lq, self.state(node.name))
        grid = np.asarray(s, np.float32).reshape(()), int(np.asarray(z).reshape(()))
        return self._qdq(x, None, lq.weight_candidates[0], node.name, node.name, "operand",
                         grid)

    def requantize_output(self, node: Node, target: str) -> None:
        """``QuantizeLinear -> DequantizeLinear`` on ``node``'s output, on the grid of the GEMM
        that reads it through code ops (where the integer path requantizes; see
        :func:`npujax.backends.integer.requant_target`).

        onnxruntime fuses ``DQ -> Conv/Gemm [-> Relu] -> Q`` into QLinearConv/QGemm, and
        ``DQ -> AveragePool -> Q`` into QLinearAveragePool; without this pair a GEMM followed by
        a pool would run in float (MLAS sgemm), whose rounding no integer model reproduces.
        """
        out = node.outputs[0]
        pre = self.name(f"{out}/pre_q")
        (producer,) = [n for n in self.nodes if out in n.output]
        producer.output[list(producer.output).index(out)] = pre
        act = self.quant[target].act
        assert act is not None
        self._qdq(pre, out, act, target, node.name, "out")

    def table(self, node: Node) -> str:
        """Name of an embedding Gather's table: a float initializer, or integer codes and a
        per-row ``DequantizeLinear`` when the spec quantizes it (``embedding_bits``)."""
        if self.layer_quant(node) is None:
            return self.init(f"{node.name}.table", self.param(node, "table"))
        axis = kernel_out_axis(node)
        return self.weights(node, self.param(node, "table"), axis, 1 - axis)[0]

    def weights(self, node: Node, kernel: np.ndarray, axis: int, in_axis: int
                ) -> tuple[str, str | None]:
        """Names of ``node``'s weight and bias: float initializers, or integer initializers and
        ``DequantizeLinear`` for a quantized layer (``axis``: output channels, ``in_axis``:
        input channels of ``kernel``).

        Raises:
          ConfigError: the layer has several candidate formats (a search mixture).
        """
        lq = self.layer_quant(node)
        act_scale = None
        if self.int32_bias and lq is not None and lq.act is not None \
                and self.state(node.name) is not None:
            act_scale = self.act_grid(node.name)[0]
        bias = self.param(node, "bias") if "bias" in self.params[node.name] else None
        fmts = lq.weight_candidates if lq is not None else ()
        if not fmts:
            b = None if bias is None else self.init(f"{node.name}.bias", bias)
            return self.init(f"{node.name}.kernel", kernel), b
        assert lq is not None
        if len(fmts) > 1:
            raise ConfigError(
                f"layer {node.name!r} has {len(fmts)} candidate weight formats (a search "
                "mixture); choose one width per layer (quant_spec(graph, weight_bits={...})) "
                "before exporting.")
        fmt = fmts[0]
        per_channel = lq.weight_per_channel
        grid = lq.quantizer.weight_grid(
            node, lq, kernel, self.state(node.name), out_axis=axis, in_axis=in_axis)
        scale = np.asarray(grid.scale, np.float32)
        zp = np.asarray(grid.zero_point, np.int32)
        qaxis, block = grid.axis, grid.block_size
        dt = _int_dtype(fmt)
        if block is not None:
            act_scale = None  # no per-channel bias scale: the bias stays float
            sb = np.repeat(scale, block, axis=qaxis)[tuple(
                slice(0, kernel.shape[qaxis]) if i == qaxis else slice(None)
                for i in range(kernel.ndim))]
            zb = np.zeros_like(sb, np.int32)
        else:
            shape = [1] * kernel.ndim
            if per_channel:
                shape[axis] = -1
            sb, zb = scale.reshape(shape), zp.reshape(shape)
        if isinstance(fmt, FloatFormat):
            act_scale = None  # FP8 layers keep a float bias, as fake-quant execute computes
            q = np.clip(kernel / sb, -fmt.max, fmt.max).astype(dt)
        else:
            q = np.clip(np.round(kernel / sb) + zb, fmt.qmin, fmt.qmax)
        wq = self.init(f"{node.name}.kernel_q", q, dt)
        ws = self.init(f"{node.name}.kernel_scale", scale)
        wz = self.init(f"{node.name}.kernel_zero_point", np.zeros_like(zp) if isinstance(
            fmt, FloatFormat) else zp, dt)
        wdq = self.name(f"{node.name}.kernel_dq")
        attrs = ({"axis": qaxis, "block_size": block} if block is not None
                 else {"axis": axis} if per_channel else {})
        self.add("DequantizeLinear", [wq, ws, wz], [wdq], f"{node.name}/weight_dequant", **attrs)
        if bias is None:
            return wdq, None
        if act_scale is None:
            return wdq, self.init(f"{node.name}.bias", bias)
        bscale = (act_scale * scale * np.ones_like(bias)).astype(np.float32)
        bq = quantize_bias(bias, act_scale, scale)  # the codes convert() adds to the accumulator
        if np.abs(bq).max() > np.iinfo(np.int32).max:
            # A channel with (near-)zero weights has a tiny scale: its bias does not fit in int32.
            return wdq, self.init(f"{node.name}.bias", bias)
        bqn = self.init(f"{node.name}.bias_q", bq, np.int32)
        bs = self.init(f"{node.name}.bias_scale", bscale)
        bz = self.init(f"{node.name}.bias_zero_point", np.zeros_like(bq, np.int32))
        bdq = self.name(f"{node.name}.bias_dq")
        self.add("DequantizeLinear", [bqn, bs, bz], [bdq], f"{node.name}/bias_dequant", axis=0)
        return wdq, bdq


#: ONNX operators that compute the same in any axis order (with scalar extra inputs).
_LAYOUT_FREE = {"Relu", "Clip", "Sigmoid", "Tanh", "LeakyRelu", "HardSigmoid", "HardSwish",
                "Identity", "Cast", "QuantizeLinear", "DequantizeLinear"}


def _perm(node: onnx.NodeProto) -> list[int]:
    return [list(a.ints) for a in node.attribute if a.name == "perm"][0]


def _sink_transposes(nodes: list[onnx.NodeProto], inits: dict[str, onnx.TensorProto],
                     outputs: set[str], used: set[str]) -> list[onnx.NodeProto]:
    """``nodes`` with layout Transposes moved down through layout-free operators (activations,
    per-tensor Q/DQ) and inverse pairs removed, so an NHWC model keeps a Transpose only where its
    layout really changes (at the input, before a Flatten/Reshape), not around every Conv/pool."""

    def scalar(name: str) -> bool:
        return name == "" or (name in inits and int(np.prod(inits[name].dims)) == 1)

    nodes = list(nodes)
    changed = True
    while changed:
        changed = False
        users: dict[str, list[int]] = {}
        for i, n in enumerate(nodes):
            for t in n.input:
                users.setdefault(t, []).append(i)
        for i, t in enumerate(nodes):
            out = t.output[0] if t.op_type == "Transpose" else None
            if out is None or out in outputs or len(users.get(out, [])) != 1:
                continue
            j = users[out][0]
            c = nodes[j]
            if c.op_type == "Transpose":
                q = _perm(c)
                if [_perm(t)[k] for k in q] != list(range(len(q))) or c.output[0] in outputs:
                    continue
                src, dst = t.input[0], c.output[0]
                for n in nodes:
                    for k, v in enumerate(n.input):
                        if v == dst:
                            n.input[k] = src
                nodes = [n for k, n in enumerate(nodes) if k not in (i, j)]
                changed = True
                break
            if c.op_type in _LAYOUT_FREE and list(c.input).index(out) == 0 and all(
                    scalar(v) for v in c.input[1:]) and len(c.output) == 1:
                new = fresh_name(f"{c.output[0]}/pre_transpose", used)
                orig = c.output[0]
                c.input[0], c.output[0] = t.input[0], new
                t.input[0], t.output[0] = new, orig
                nodes.pop(i)
                nodes.insert(j, t)  # after c (which moved up one place)
                changed = True
                break
    return nodes


def _batch_is_free(graph: Graph) -> bool:
    """Whether the graph runs at any batch size (no shape folds the traced batch)."""
    from npujax.ir.passes import rebatch

    if not graph.inputs:
        return False
    for n in graph.nodes:
        # a batch-1 constant concatenated along another axis (a ViT's class token, folded by
        # the tracer): the executor broadcasts it (ir.execute._folded_concat_input), an ONNX
        # Concat does not, so such a file runs at its traced batch only
        for t in n.inputs if n.op == "Concat" else ():
            v = graph.constants.get(t)
            if v is not None and np.ndim(v) and np.shape(v)[0] == 1 \
                    and n.attrs.get("axis", 0) % np.ndim(v) != 0:
                return False
    try:
        rebatch(graph, graph.tensors[graph.inputs[0]].shape[0] + 1)
    except NpujaxError:
        return False
    return True


def to_onnx(
    graph: Graph,
    params: Params,
    quant: QuantSpec | None = None,
    qstate: QState | None = None,
    path: str | os.PathLike[str] | None = None,
    *,
    int32_bias: bool = True,
    requantize_outputs: bool = True,
    dynamic_batch: bool = True,
    full_check: bool = False,
) -> onnx.ModelProto:
    """Write ``graph`` with ``params`` as an ONNX model, in QDQ form for the layers in ``quant``.

    Args:
      graph: the (optimized) model; Conv may be NCHW/OIHW or NHWC/HWIO (ONNX Conv is NCHW:
        Transposes are added where the layout changes).
      params: its float params.
      quant: ``{node: LayerQuant}`` as from :func:`npujax.quant_spec`; None exports float.
        Each layer needs a single weight format (not a search mixture).
      qstate: calibrated ``{node: {"act_scale", "act_zero_point"}}`` (from
        :func:`npujax.quantize.calibrate`) for every layer whose ``LayerQuant.act`` is set.
      path: where to write the ``.onnx`` file (atomically); None only returns the model.
      int32_bias: quantize the biases of quantized layers to int32 (scale = activation scale x
        weight scale, the integer-NPU convention). False keeps float biases, which is what
        :func:`npujax.ir.execute.execute`'s fake-quant computes (for a like-for-like comparison). A
        bias that would overflow int32 (a channel whose weights are all ~0) stays float.
      requantize_outputs: put ``QuantizeLinear -> DequantizeLinear`` (the consumer's grid) on
        the output of every quantized GEMM that :func:`npujax.convert` requantizes to its
        consumer's grid (:func:`npujax.backends.integer.requant_target`), so that onnxruntime runs
        it in its integer kernels and its result equals ``execute_integer(convert(...,
        requant="float"))`` bit for bit. False leaves those outputs in float, which is the
        fake-quant model :func:`npujax.ir.execute.execute` computes (a GEMM followed by a pool then
        runs in float in onnxruntime).
      dynamic_batch: write the batch dimension of the inputs and outputs as the symbolic
        ``"batch"`` (onnxruntime then runs the model at any batch size). Reshapes that fold
        the traced batch into a literal leading dimension are written with ONNX's ``0`` where
        that axis is proved to be the batch (:func:`npujax.ir.passes.unfold_batch`); a graph
        whose shapes still fold it (see :func:`npujax.rebatch`) keeps its fixed batch.
      full_check: also run ``onnx.checker.check_model(full_check=True)`` (strict shape
        inference over every node) on the finished model, ``value_info`` included.

    Returns:
      The ``onnx.ModelProto`` (opset :data:`EXPORT_OPSET`, or :data:`QDQ_EXTENDED_OPSET` when a
      layer has an FP8 format or per-block weights), checked by ``onnx.checker``. Inputs and
      outputs keep the graph's tensor names (a traced Flax model's are its call argument's name
      and ``output``); ``value_info`` holds the shape-inferred type of every intermediate
      tensor, so tools that need shapes (ZigZag, Netron) read them without running inference.
      Layout Transposes of NHWC Conv/pool nodes are moved through activations and per-tensor
      Q/DQ and cancelled in inverse pairs, so they remain only where the layout changes (after
      the input, before a Flatten/Reshape).

    Raises:
      ConfigError: a quantized layer has no qstate entry or several candidate formats.
      UnsupportedOpError: a node has no ONNX equivalent (e.g. a raw ``JaxPrimitive``).
      GraphError: the graph was imported for its shapes only (``from_onnx(...,
        weights="shapes")``): it has no weight values.
    """
    if graph.source == SHAPES_ONLY_SOURCE:
        raise GraphError("to_onnx: this graph was imported for its shapes only (its ONNX "
                         "external-data files were missing, so its weights have no values); "
                         "place the data files next to the model and import it again to export "
                         "it.")
    quant = quant or {}
    if dynamic_batch:
        from npujax.ir.passes import unfold_batch

        graph, params = unfold_batch(graph, params)
    # float8, blocked weights and 9-16-bit integers (int16/uint16 Q/DQ) need opset 21
    extended = any(lq.weight_block_size is not None or any(
        isinstance(f, FloatFormat) or (isinstance(f, IntFormat) and f.bits > 8)
        for f in (*lq.weight_candidates, lq.act) if f is not None)
        for lq in quant.values())
    w = _Writer(graph, params, quant, qstate, int32_bias,
                QDQ_EXTENDED_OPSET if extended else EXPORT_OPSET)
    used = {t for n in graph.nodes for t in n.inputs} | set(graph.outputs)
    for name, t in graph.constants.items():
        if name in used:
            w.inits[name] = numpy_helper.from_array(np.asarray(t), name)
    for node in graph.nodes:
        export = OPS[node.op].export if node.op in OPS else None
        if export is None:
            raise UnsupportedOpError(f"node {node.name!r} has operator {node.op!r}, which "
                                     "to_onnx cannot export.")
        export(w, node)
        target = requant_target(graph, quant, node)[0] if requantize_outputs else None
        if target is not None and w.state(target) is not None:
            w.requantize_output(node, target)

    free = dynamic_batch and _batch_is_free(graph)
    batch = graph.tensors[graph.inputs[0]].shape[0] if graph.inputs else None

    def vi(name):
        t = graph.tensors[name]
        shape: list[int | str] = list(t.shape)
        if free and shape and shape[0] == batch:
            shape[0] = "batch"
        return helper.make_tensor_value_info(
            name, helper.np_dtype_to_tensor_dtype(np.dtype(t.dtype)), shape)

    nodes = _sink_transposes(w.nodes, w.inits, set(graph.outputs), w.used)
    g = helper.make_graph(nodes, f"npujax_{graph.source or 'graph'}",
                          [vi(i) for i in graph.inputs], [vi(o) for o in graph.outputs],
                          list(w.inits.values()))
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", w.opset)],
                              producer_name="npujax")
    model.ir_version = 8 if w.opset == EXPORT_OPSET else 10  # float8 and opset 21 need IR 10
    onnx.checker.check_model(model)
    inferred = onnx.shape_inference.infer_shapes(model, check_type=True, data_prop=True)
    known = {v.name for v in (*g.input, *g.output)} | set(w.inits)
    model.graph.value_info.extend(v for v in inferred.graph.value_info if v.name not in known)
    if full_check:
        onnx.checker.check_model(model, full_check=True)
    if path is not None:
        atomic_write_bytes(path, model.SerializeToString())
    return model




def exported_biases(model: onnx.ModelProto | bytes) -> dict[str, np.ndarray]:
    """The int32 biases a :func:`to_onnx` file holds, dequantized: ``{layer: bias}``.

    ``bias = (bias_q - zero_point) * bias_scale`` of each layer's ``<layer>/bias_dequant`` node,
    float32 of the layer's bias shape. Substituted into the params, they make npujax's fake-quant
    :func:`npujax.ir.execute.execute` compute what the file computes (the float bias would add
    up to half a bias step more or less per channel).

    Args:
      model: a model written by :func:`to_onnx` (or its serialized bytes).

    Returns:
      ``{layer name: float32 bias}`` for every layer whose bias was quantized to int32.
    """
    if isinstance(model, bytes):
        model = onnx.load_from_string(model)
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    out = {}
    for n in model.graph.node:
        if n.op_type == "DequantizeLinear" and n.name.endswith("/bias_dequant"):
            q, s, z = (inits[i] for i in n.input)
            out[n.name[:-len("/bias_dequant")]] = (
                (q.astype(np.int64) - z.astype(np.int64)) * s.astype(np.float64)
            ).astype(np.float32)
    return out

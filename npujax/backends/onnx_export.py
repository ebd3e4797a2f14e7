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
:data:`EXPORT_OPSET`. LSQ/LSQ+ layers export their learned steps (see
:func:`npujax.quantize.learned_steps.deploy_qstate`).

Formats narrower than 8 bits are stored in int8/uint8 (their codes fit); an activation format
narrower than 8 bits gets a ``Clip`` to its float range before ``QuantizeLinear``, so the codes
stay in the format's range. All other nodes map back to their ONNX operators. The file is written
atomically. Source of the semantics: the ONNX operator specification
(https://onnx.ai/onnx/operators/) and onnxruntime's QDQ format
(https://onnxruntime.ai/docs/performance/model-optimizations/quantization.html).
"""

from __future__ import annotations

import base64
import os
from collections.abc import Mapping
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from npujax._atomic import atomic_write_bytes
from npujax.backends.integer import quantize_bias, requant_target
from npujax.errors import ConfigError, UnsupportedOpError
from npujax.ir.graph import Graph, Node, Params
from npujax.ops.core import out_channel_view
from npujax.quant import FloatFormat, IntFormat
from npujax.quantize.execute import LayerQuant, QuantSpec, layer_weight_qparams
from npujax.quantize.learned_steps import deploy_qstate

__all__ = ["to_onnx", "EXPORT_OPSET", "QDQ_EXTENDED_OPSET"]

#: ONNX opset of exported models (HardSwish needs 14; ReduceMean keeps ``axes`` as attribute).
EXPORT_OPSET = 17
#: Opset of models with FP8 (needs 19) or per-block (needs 21) quantized layers.
QDQ_EXTENDED_OPSET = 21
_INT64_MIN = np.iinfo(np.int64).min


class _Writer:
    def __init__(self, graph: Graph, params: Params, int32_bias: bool):
        self.int32_bias = int32_bias
        self.graph = graph
        self.params = params
        self.nodes: list[onnx.NodeProto] = []
        self.inits: dict[str, onnx.TensorProto] = {}
        self.used: set[str] = set(graph.tensors) | {n.name for n in graph.nodes}

    def name(self, base: str) -> str:
        n, i = base, 1
        while n in self.used:
            n, i = f"{base}_{i}", i + 1
        self.used.add(n)
        return n

    def init(self, base: str, value: Any, dtype: Any = None) -> str:
        arr = np.asarray(value, dtype)
        name = self.name(base)
        self.inits[name] = numpy_helper.from_array(arr, name)
        return name

    def add(self, op: str, inputs: list[str], outputs: list[str], name: str, **attrs) -> None:
        self.nodes.append(helper.make_node(op, inputs, outputs, name=self.name(name), **attrs))

    def param(self, node: Node, role: str) -> np.ndarray:
        return np.asarray(self.params[node.name][role], np.float32)


def _int_dtype(fmt: IntFormat | FloatFormat) -> np.dtype:
    if isinstance(fmt, FloatFormat):
        return np.dtype(fmt.storage_dtype)
    if fmt.bits > 8:
        return np.dtype(np.int16 if fmt.signed else np.uint16)
    return np.dtype(np.int8 if fmt.signed else np.uint8)


def _qdq(w: _Writer, x: str, out: str | None, fmt: IntFormat | FloatFormat, qs, prefix: str,
         what: str) -> str:
    """``[Clip ->] QuantizeLinear -> DequantizeLinear`` of ``x`` on the grid ``qs`` (the Clip
    only for integer formats narrower than their storage type)."""
    dt = _int_dtype(fmt)
    s = np.asarray(qs["act_scale"], np.float32).reshape(())
    zp = int(np.asarray(qs["act_zero_point"]).reshape(()))
    scale = w.init(f"{prefix}.{what}_scale", s)
    zero = w.init(f"{prefix}.{what}_zero_point", zp, dt)
    if isinstance(fmt, IntFormat) and (fmt.qmin, fmt.qmax) != (int(np.iinfo(dt).min),
                                                              int(np.iinfo(dt).max)):
        lo = w.init(f"{prefix}.{what}_min", np.float32((fmt.qmin - zp) * s))
        hi = w.init(f"{prefix}.{what}_max", np.float32((fmt.qmax - zp) * s))
        clipped = w.name(f"{x}/clip")
        w.add("Clip", [x, lo, hi], [clipped], f"{prefix}/{what}_clip")
        x = clipped
    q = w.name(f"{prefix}/{what}_q")
    dq = out if out is not None else w.name(f"{prefix}/{what}_dq")
    w.add("QuantizeLinear", [x, scale, zero], [q], f"{prefix}/{what}_quant")
    w.add("DequantizeLinear", [q, scale, zero], [dq], f"{prefix}/{what}_dequant")
    return dq


def _qdq_input(w: _Writer, node: Node, x: str, lq: LayerQuant, qstate) -> str:
    if lq.act is None:
        return x
    if qstate is None or node.name not in qstate:
        raise ConfigError(f"layer {node.name!r} quantizes its input but qstate has no entry for "
                          "it; pass the result of npujax.quantize.calibrate as qstate.")
    return _qdq(w, x, None, lq.act, qstate[node.name], node.name, "act")


def _requantize_output(w: _Writer, node: Node, lq: LayerQuant, qs) -> None:
    """``QuantizeLinear -> DequantizeLinear`` on ``node``'s output, on the grid of the GEMM that
    reads it through code ops (where the integer path requantizes; see
    :func:`npujax.backends.integer.requant_target`).

    onnxruntime fuses ``DQ -> Conv/Gemm [-> Relu] -> Q`` into QLinearConv/QGemm, and
    ``DQ -> AveragePool -> Q`` into QLinearAveragePool; without this pair a GEMM followed by a
    pool would run in float (MLAS sgemm), whose rounding no integer model reproduces.
    """
    out = node.outputs[0]
    pre = w.name(f"{out}/pre_q")
    (producer,) = [n for n in w.nodes if out in n.output]
    producer.output[list(producer.output).index(out)] = pre
    _qdq(w, pre, out, lq.act, qs, node.name, "out")


def _weights(w: _Writer, node: Node, lq: LayerQuant | None, kernel: np.ndarray, axis: int,
             act_scale: np.ndarray | None, qstate=None,
             in_axis: int = 0) -> tuple[str, str | None]:
    if not w.int32_bias:
        act_scale = None
    """Weight (and bias) tensor names: float initializers, or int initializers + DQ."""
    bias = w.param(node, "bias") if "bias" in w.params[node.name] else None
    fmts = lq.weight_candidates if lq is not None else ()
    if not fmts:
        b = None if bias is None else w.init(f"{node.name}.bias", bias)
        return w.init(f"{node.name}.kernel", kernel), b
    if len(fmts) > 1:
        raise ConfigError(
            f"layer {node.name!r} has {len(fmts)} candidate weight formats (a search mixture); "
            "choose one width per layer (quant_spec(graph, weight_bits={...})) before exporting.")
    fmt = fmts[0]
    per_channel = lq.weight_per_channel
    scale, zp, qaxis, block = layer_weight_qparams(
        node, lq, kernel, (qstate or {}).get(node.name), out_axis=axis, in_axis=in_axis)
    scale = np.asarray(scale, np.float32)
    zp = np.asarray(zp, np.int32)
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
    wq = w.init(f"{node.name}.kernel_q", q, dt)
    ws = w.init(f"{node.name}.kernel_scale", scale)
    wz = w.init(f"{node.name}.kernel_zero_point", np.zeros_like(zp) if isinstance(
        fmt, FloatFormat) else zp, dt)
    wdq = w.name(f"{node.name}.kernel_dq")
    attrs = ({"axis": qaxis, "block_size": block} if block is not None
             else {"axis": axis} if per_channel else {})
    w.add("DequantizeLinear", [wq, ws, wz], [wdq], f"{node.name}/weight_dequant", **attrs)
    if bias is None:
        return wdq, None
    if act_scale is None:
        return wdq, w.init(f"{node.name}.bias", bias)
    bscale = (act_scale * scale * np.ones_like(bias)).astype(np.float32)
    bq = quantize_bias(bias, act_scale, scale)  # the codes convert() adds to the accumulator
    if np.abs(bq).max() > np.iinfo(np.int32).max:
        # A channel with (near-)zero weights has a tiny scale: its bias does not fit in int32.
        return wdq, w.init(f"{node.name}.bias", bias)
    bqn = w.init(f"{node.name}.bias_q", bq, np.int32)
    bs = w.init(f"{node.name}.bias_scale", bscale)
    bz = w.init(f"{node.name}.bias_zero_point", np.zeros_like(bq, np.int32))
    bdq = w.name(f"{node.name}.bias_dq")
    w.add("DequantizeLinear", [bqn, bs, bz], [bdq], f"{node.name}/bias_dequant", axis=0)
    return wdq, bdq


def _act_scale(lq: LayerQuant | None, node: Node, qstate) -> np.ndarray | None:
    if lq is None or lq.act is None or qstate is None or node.name not in qstate:
        return None
    return np.asarray(qstate[node.name]["act_scale"], np.float32).reshape(())


def _epilogue(w: _Writer, node: Node, y: str, out: str) -> None:
    epi = list(node.attrs.get("epilogue", ()))
    for i, op in enumerate(epi):
        nxt = out if i == len(epi) - 1 else w.name(f"{node.name}/{op}")
        if op == "Relu6":
            lo, hi = w.init(f"{node.name}.relu6_min", np.float32(0)), w.init(
                f"{node.name}.relu6_max", np.float32(6))
            w.add("Clip", [y, lo, hi], [nxt], f"{node.name}/{op}")
        else:
            w.add(op, [y], [nxt], f"{node.name}/{op}")
        y = nxt


def _conv(w: _Writer, node: Node, lq, qstate) -> None:
    a = node.attrs
    layout, klayout = a["data_layout"], a["kernel_layout"]
    nsp = len(layout) - 2
    channels_first = "NC" + "DHW"[3 - nsp:]
    kernel = w.param(node, "kernel")
    kernel = np.transpose(kernel, [klayout.index(c) for c in "OI" + channels_first[2:]])
    if any(d != 1 for d in a.get("lhs_dilation", [1] * nsp)):
        raise UnsupportedOpError(f"node {node.name!r}: Conv with lhs_dilation cannot be exported.")
    x = node.inputs[0]
    if layout != channels_first:
        perm = [layout.index(c) for c in channels_first]
        t = w.name(f"{x}/to_nchw")
        w.add("Transpose", [x], [t], f"{node.name}/to_nchw", perm=perm)
        x = t
    x = _qdq_input(w, node, x, lq, qstate) if lq is not None else x
    kname, bname = _weights(w, node, lq, kernel, 0, _act_scale(lq, node, qstate), qstate, 1)
    padding = [list(p) for p in a["padding"]]
    pads = [p[0] for p in padding] + [p[1] for p in padding]
    y = w.name(f"{node.name}/conv") if (a.get("epilogue") or layout != channels_first) else \
        node.outputs[0]
    w.add("Conv", [x, kname] + ([bname] if bname else []), [y], node.name,
          strides=list(a["strides"]), pads=pads, dilations=list(a["dilations"]),
          group=int(a["groups"]), kernel_shape=list(kernel.shape[2:]))
    if layout != channels_first:
        back = [channels_first.index(c) for c in layout]
        t = w.name(f"{node.name}/to_layout") if a.get("epilogue") else node.outputs[0]
        w.add("Transpose", [y], [t], f"{node.name}/from_nchw", perm=back)
        y = t
    if a.get("epilogue"):
        _epilogue(w, node, y, node.outputs[0])


def _gemm(w: _Writer, node: Node, lq, qstate) -> None:
    x = _qdq_input(w, node, node.inputs[0], lq, qstate) if lq is not None else node.inputs[0]
    kname, bname = _weights(w, node, lq, w.param(node, "kernel"), 1,
                            _act_scale(lq, node, qstate), qstate, 0)
    rank = len(w.graph.tensors[node.inputs[0]].shape)
    y = w.name(f"{node.name}/gemm") if node.attrs.get("epilogue") else node.outputs[0]
    if rank == 2:
        w.add("Gemm", [x, kname] + ([bname] if bname else []), [y], node.name)
    else:
        mm = w.name(f"{node.name}/matmul") if bname else y
        w.add("MatMul", [x, kname], [mm], node.name)
        if bname:
            w.add("Add", [mm, bname], [y], f"{node.name}/bias")
    if node.attrs.get("epilogue"):
        _epilogue(w, node, y, node.outputs[0])


def _conv_transpose(w: _Writer, node: Node, lq, qstate) -> None:
    """ConvTranspose; quantized as Conv is (input QDQ, int8 kernel + DequantizeLinear, int32
    bias). Per-channel weights of an ungrouped ConvTranspose dequantize along axis 1 of the
    ``[C_in, C_out, *k]`` kernel. DequantizeLinear has one scale per index of one axis, which a
    grouped kernel ``[C_in, C_out/g, *k]`` lacks (see :func:`npujax.ops.core.out_channel_view`):
    its codes are stored as ``[C_out, C_in/g, *k]``, dequantized along axis 0, and moved back by
    Reshape-Transpose-Reshape (exact; onnxruntime runs ConvTranspose in float either way)."""
    a = node.attrs
    nsp = len(a["strides"])
    x = _qdq_input(w, node, node.inputs[0], lq, qstate) if lq is not None else node.inputs[0]
    kernel = w.param(node, "kernel")
    per_channel = lq is not None and lq.weight_per_channel and bool(lq.weight_candidates)
    view, axis, _ = out_channel_view(node, kernel) if per_channel else (kernel, 1, None)
    kname, bname = _weights(w, node, lq, view, axis, _act_scale(lq, node, qstate))
    if view is not kernel:
        g = int(a["groups"])
        c_in, c_out_g, *k = kernel.shape
        shape1 = w.init(f"{node.name}.kernel_grouped_shape", np.asarray(
            [g, c_out_g, c_in // g, *k], np.int64))
        shape2 = w.init(f"{node.name}.kernel_shape", np.asarray(kernel.shape, np.int64))
        t1, t2, t3 = (w.name(f"{node.name}.kernel_{s}") for s in ("grouped", "swapped", "onnx"))
        w.add("Reshape", [kname, shape1], [t1], f"{node.name}/kernel_group")
        w.add("Transpose", [t1], [t2], f"{node.name}/kernel_swap",
              perm=[0, 2, 1] + list(range(3, 3 + len(k))))
        w.add("Reshape", [t2, shape2], [t3], f"{node.name}/kernel_ungroup")
        kname = t3
    pads = [p[0] for p in a["pads"]] + [p[1] for p in a["pads"]]
    y = w.name(f"{node.name}/convt") if a.get("epilogue") else node.outputs[0]
    w.add("ConvTranspose", [x, kname] + ([bname] if bname else []), [y], node.name,
          strides=list(a["strides"]), pads=pads, dilations=list(a["dilations"]),
          output_padding=list(a["output_padding"]), group=int(a["groups"]),
          kernel_shape=list(a["kernel_shape"][2:2 + nsp]))
    if a.get("epilogue"):
        _epilogue(w, node, y, node.outputs[0])


def _to_channels_first(w: _Writer, node: Node, axis: int, rank: int):
    """Input name and output name for an op whose channels sit on ``axis`` (not 1).

    Adds ``Transpose`` nodes so the ONNX op sees ``[N, C, *spatial]``; returns
    ``(x, y, perm)`` where ``perm`` maps the channels-first axes back to the node's axes, or
    ``(input, output, None)`` when the channels are already on axis 1.
    """
    if axis == 1:
        return node.inputs[0], node.outputs[0], None
    perm = [0, axis] + [i for i in range(1, rank) if i != axis]
    x = w.name(f"{node.inputs[0]}/nchw")
    w.add("Transpose", [node.inputs[0]], [x], f"{node.name}/to_nchw", perm=perm)
    y = w.name(f"{node.outputs[0]}/nchw")
    w.nodes_after = [helper.make_node("Transpose", [y], [node.outputs[0]],
                                      name=w.name(f"{node.name}/from_nchw"),
                                      perm=list(np.argsort(perm)))]
    return x, y, perm


def _flush(w: _Writer) -> None:
    w.nodes.extend(getattr(w, "nodes_after", []))
    w.nodes_after = []


def _batchnorm(w: _Writer, node: Node, lq, qstate) -> None:
    p = w.params[node.name]
    c = np.asarray(p["mean"]).shape[0]
    rank = len(w.graph.tensors[node.inputs[0]].shape)
    x, y, _ = _to_channels_first(w, node, node.attrs["axis"] % rank, rank)
    ins = [x]
    for role, default in (("scale", 1.0), ("bias", 0.0), ("mean", None), ("var", None)):
        v = np.asarray(p[role], np.float32) if role in p else np.full((c,), default, np.float32)
        ins.append(w.init(f"{node.name}.{role}", v))
    w.add("BatchNormalization", ins, [y], node.name, epsilon=float(node.attrs["epsilon"]))
    _flush(w)


def _pool(w: _Writer, node: Node, lq, qstate) -> None:
    a = node.attrs
    rank = len(a["window"])
    def plain(i):
        return a["window"][i] == 1 and a["strides"][i] == 1 and list(a["padding"][i]) == [0, 0]

    if not plain(0) or not (plain(1) or plain(rank - 1)):
        raise UnsupportedOpError(f"node {node.name!r}: {node.op} pooling over the batch or "
                                 "without a channel axis cannot be exported as an ONNX pool.")
    axis = 1 if plain(1) else rank - 1
    x, y, perm = _to_channels_first(w, node, axis, rank)
    perm = perm or list(range(rank))
    win = [a["window"][i] for i in perm][2:]
    strides = [a["strides"][i] for i in perm][2:]
    padding = [list(a["padding"][i]) for i in perm][2:]
    extra = [list(a.get("ceil_extra", [0] * rank))[i] for i in perm][2:]
    pads = [p[0] for p in padding] + [p[1] - e for p, e in zip(padding, extra)]
    attrs = {"kernel_shape": win, "strides": strides, "pads": pads, "ceil_mode": int(any(extra))}
    dil = [list(a.get("window_dilation", [1] * rank))[i] for i in perm][2:]
    if any(d != 1 for d in dil):
        attrs["dilations"] = dil
    if node.op == "AveragePool":
        attrs["count_include_pad"] = int(a.get("count_include_pad", 1))
    w.add(node.op, [x], [y], node.name, **attrs)
    _flush(w)


def _i64(w: _Writer, node: Node, what: str, v) -> str:
    return w.init(f"{node.name}.{what}", np.asarray(v, np.int64))


def _generic(w: _Writer, node: Node, lq, qstate) -> None:
    a, op, ins, outs = node.attrs, node.op, list(node.inputs), list(node.outputs)
    if op in ("Relu", "Sigmoid", "Tanh", "Identity", "Add", "Sub", "Mul", "Div", "Max", "Min",
              "GlobalAveragePool", "HardSwish", "PRelu", "MatMul"):
        w.add(op, ins, outs, node.name)
    elif op == "Relu6":
        w.add("Clip", ins + [w.init(f"{node.name}.min", np.float32(0)),
                             w.init(f"{node.name}.max", np.float32(6))], outs, node.name)
    elif op == "Clip":
        dt = np.dtype(w.graph.tensors[ins[0]].dtype)
        lo = "" if a.get("min") is None else w.init(f"{node.name}.min", a["min"], dt)
        hi = "" if a.get("max") is None else w.init(f"{node.name}.max", a["max"], dt)
        w.add("Clip", ins + [lo, hi], outs, node.name)
    elif op == "LeakyRelu":
        w.add(op, ins, outs, node.name, alpha=float(a["alpha"]))
    elif op == "HardSigmoid":
        w.add(op, ins, outs, node.name, alpha=float(a["alpha"]), beta=float(a["beta"]))
    elif op == "Softmax":
        shape = w.graph.tensors[ins[0]].shape
        axis = int(a.get("axis", -1)) % len(shape)
        if a.get("coerce_2d") and axis != len(shape) - 1:
            flat = w.name(f"{node.name}/flat")
            sm = w.name(f"{node.name}/softmax")
            w.add("Flatten", ins, [flat], f"{node.name}/flatten", axis=axis)
            w.add("Softmax", [flat], [sm], node.name, axis=-1)
            w.add("Reshape", [sm, _i64(w, node, "shape", shape)], outs, f"{node.name}/reshape")
        else:
            w.add("Softmax", ins, outs, node.name, axis=axis)
    elif op == "Reshape":
        w.add(op, ins + [_i64(w, node, "shape", a["shape"])], outs, node.name)
    elif op == "Flatten":
        w.add(op, ins, outs, node.name, axis=int(a["axis"]))
    elif op == "Transpose":
        w.add(op, ins, outs, node.name, perm=list(a["perm"]))
    elif op in ("Squeeze", "Unsqueeze"):
        w.add(op, ins + [_i64(w, node, "axes", a["axes"])], outs, node.name)
    elif op == "Concat":
        w.add(op, ins, outs, node.name, axis=int(a["axis"]))
    elif op == "Split":
        w.add(op, ins + [_i64(w, node, "split", a["sizes"])], outs, node.name,
              axis=int(a["axis"]))
    elif op == "Slice":
        ends = [e if e >= 0 else _INT64_MIN for e in a["ends"]]
        w.add(op, ins + [_i64(w, node, "starts", a["starts"]), _i64(w, node, "ends", ends),
                         _i64(w, node, "axes", a["axes"]), _i64(w, node, "steps", a["steps"])],
              outs, node.name)
    elif op == "Pad":
        pads = [p[0] for p in a["pads"]] + [p[1] for p in a["pads"]]
        extra = []
        if a["mode"] == "constant":
            extra = [w.init(f"{node.name}.value", a["value"],
                            np.dtype(w.graph.tensors[ins[0]].dtype))]
        w.add(op, ins + [_i64(w, node, "pads", pads)] + extra, outs, node.name, mode=a["mode"])
    elif op == "Resize":
        w.add(op, ins + ["", "", _i64(w, node, "sizes", a["sizes"])], outs, node.name,
              mode=a["mode"], nearest_mode=a["nearest_mode"],
              coordinate_transformation_mode=a["coordinate_transformation_mode"])
    elif op in ("ReduceMean", "ReduceMax") and w.opset >= 18:  # axes became an input
        w.add(op, ins + [_i64(w, node, "axes", a["axes"])], outs, node.name,
              keepdims=int(a["keepdims"]))
    elif op in ("ReduceMean", "ReduceMax"):
        w.add(op, ins, outs, node.name, axes=list(a["axes"]), keepdims=int(a["keepdims"]))
    elif op == "ReduceSum":
        w.add(op, ins + [_i64(w, node, "axes", a["axes"])], outs, node.name,
              keepdims=int(a["keepdims"]))
    elif op in ("QuantizeLinear", "DequantizeLinear"):
        w.add(op, ins, outs, node.name, axis=int(a.get("axis", 1)))
    elif op == "Cast":
        w.add(op, ins, outs, node.name,
              to=helper.np_dtype_to_tensor_dtype(np.dtype(a["to"])))
    elif op == "CpuFallback":
        sub = onnx.load_from_string(base64.b64decode(a["onnx_model"]))
        (orig,) = sub.graph.node
        rename = {f"in{k}": t for k, t in enumerate(ins)}
        rename.update({f"out{k}": t for k, t in enumerate(outs)})
        n = onnx.NodeProto()
        n.CopyFrom(orig)
        del n.input[:]
        n.input.extend(rename.get(t, "") for t in orig.input)
        del n.output[:]
        n.output.extend(rename[t] for t in orig.output)
        n.name = w.name(node.name)
        w.nodes.append(n)
    else:
        raise UnsupportedOpError(f"node {node.name!r} has operator {op!r}, which to_onnx cannot "
                                 "export.")


_EXPORTERS = {"Conv": _conv, "Gemm": _gemm, "ConvTranspose": _conv_transpose,
              "BatchNormalization": _batchnorm, "MaxPool": _pool, "AveragePool": _pool}


def to_onnx(
    graph: Graph,
    params: Params,
    quant: QuantSpec | None = None,
    qstate: Mapping[str, Mapping[str, Any]] | None = None,
    path: str | os.PathLike[str] | None = None,
    *,
    int32_bias: bool = True,
    requantize_outputs: bool = True,
) -> onnx.ModelProto:
    """Write ``graph`` with ``params`` as an ONNX model, in QDQ form for the layers in ``quant``.

    Args:
      graph, params: the (optimized) model; Conv may be NCHW/OIHW or NHWC/HWIO (Transposes are
        added around NHWC convs).
      quant: ``{node: LayerQuant}`` as from :func:`npujax.quant_spec`; None exports float.
        Each layer needs a single weight format (not a search mixture).
      qstate: calibrated ``{node: {"act_scale", "act_zero_point"}}`` (from
        :func:`npujax.quantize.calibrate`) for every layer whose ``LayerQuant.act`` is set.
      path: where to write the ``.onnx`` file (atomically); None only returns the model.
      int32_bias: quantize the biases of quantized layers to int32 (scale = activation scale x
        weight scale, the integer-NPU convention). False keeps float biases, which is what
        :func:`npujax.quantize.execute`'s fake-quant computes (for a like-for-like comparison). A
        bias that would overflow int32 (a channel whose weights are all ~0) stays float.
      requantize_outputs: put ``QuantizeLinear -> DequantizeLinear`` (the consumer's grid) on
        the output of every quantized GEMM that :func:`npujax.convert` requantizes to its
        consumer's grid (:func:`npujax.backends.integer.requant_target`), so that onnxruntime runs
        it in its integer kernels and its result equals ``execute_integer(convert(...,
        requant="float"))`` bit for bit. False leaves those outputs in float, which is the
        fake-quant model :func:`npujax.quantize.execute` computes (a GEMM followed by a pool then
        runs in float in onnxruntime).

    Returns:
      The ``onnx.ModelProto`` (opset :data:`EXPORT_OPSET`, or :data:`QDQ_EXTENDED_OPSET` when a
      layer has an FP8 format or per-block weights), checked by ``onnx.checker``.

    Raises:
      ConfigError: a quantized layer has no qstate entry or several candidate formats.
      UnsupportedOpError: a node has no ONNX equivalent (e.g. a raw ``JaxPrimitive``).
    """
    quant = quant or {}
    qstate = deploy_qstate(quant, qstate)
    w = _Writer(graph, params, int32_bias)
    w.opset = EXPORT_OPSET
    if any(lq.weight_block_size is not None or any(
            isinstance(f, FloatFormat) for f in (*lq.weight_candidates, lq.act))
           for lq in quant.values()):
        w.opset = QDQ_EXTENDED_OPSET
    used = {t for n in graph.nodes for t in n.inputs} | set(graph.outputs)
    for name, t in graph.constants.items():
        if name in used:
            w.inits[name] = numpy_helper.from_array(np.asarray(t), name)
    for node in graph.nodes:
        _EXPORTERS.get(node.op, _generic)(w, node, quant.get(node.name), qstate)
        target = requant_target(graph, quant, node)[0] if requantize_outputs else None
        if target is not None and qstate is not None and target in qstate:
            _requantize_output(w, node, quant[target], qstate[target])

    def vi(name):
        t = graph.tensors[name]
        return helper.make_tensor_value_info(
            name, helper.np_dtype_to_tensor_dtype(np.dtype(t.dtype)), list(t.shape))

    g = helper.make_graph(w.nodes, f"npujax_{graph.source or 'graph'}",
                          [vi(i) for i in graph.inputs], [vi(o) for o in graph.outputs],
                          list(w.inits.values()))
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", w.opset)],
                              producer_name="npujax")
    model.ir_version = 8 if w.opset == EXPORT_OPSET else 10  # float8 and opset 21 need IR 10
    onnx.checker.check_model(model)
    if path is not None:
        atomic_write_bytes(path, model.SerializeToString())
    return model



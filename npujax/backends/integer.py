"""Integer-only execution of a converted (PTQ or QAT) model: int8 codes, int32 accumulation.

``convert(graph, params, quant, qstate)`` turns every quantized GEMM node (Conv, Gemm) into an
:class:`IntegerLayer` and every quantized GEMM of two activations (attention's MatMul/Einsum)
into an :class:`IntegerMatMul` (both operands' codes, int32 accumulation, a dequantized
output); ``execute_integer(model, x)`` runs the graph with

* activations as integer codes (the consumer's calibrated per-tensor ``scale``/``zero_point``),
* weights as int8 codes (symmetric, narrow range, per output channel: zero point 0),
* ``acc = sum((q_x - z_x) * q_w)`` accumulated in int32, plus an int32 bias
  ``round_half_even(bias / (s_x * s_w))`` whose scale is input scale x weight scale,
* requantization of ``acc`` to the next layer's input grid: ``q_y = clamp(z_y + R(acc, M))``
  with the real multiplier ``M = s_x * s_w / s_y`` (per output channel), where ``R`` is

  - ``requant="fixed_point"`` (default; gemmlowp/TFLite): ``M = m0 * 2^-n`` with ``m0`` a Q31
    int32 in ``[2^30, 2^31)``; ``R = RoundingDivideByPOT(SaturatingRoundingDoublingHighMul(acc,
    m0), n)`` -- the doubling high multiply rounds half away from zero (gemmlowp's nudge), the
    power-of-two division rounds half away from zero too. Integer arithmetic only.
  - ``requant="float"`` (ONNX Runtime's QLinearConv/QLinearMatMul, MLAS ``RequantizeOutput``):
    ``R = round_half_even(float32(acc) * float32(M))`` with ``M`` computed in float32 as
    ``(s_x * s_w) / s_y``. This is the choice to use when comparing with ORT on a QDQ model
    after ORT fuses DequantizeLinear-Conv-QuantizeLinear into QLinearConv.

A fused ReLU/ReLU6 epilogue becomes a clamp of the codes (``>= z_y`` / ``<= z_y +
round(6 / s_y)``), exact because quantization is monotone. A GEMM whose output reaches exactly
one quantized GEMM through code ops only (:func:`requant_target`) is requantized to that
consumer's input grid. Between GEMMs, Reshape, Transpose, Identity, MaxPool and ReLU act on
codes exactly (they commute with saturation). At most one AveragePool may lie on the way; there
the two modes differ, each modelling its target:

* ``requant="fixed_point"`` (an NPU with an int32 pooling unit): the GEMM requantizes with 8
  extra fraction bits and does not saturate; the pool sums in int32 and divides with round half
  to even, then the codes saturate. The average of unsaturated values is rounded once, as the
  fake-quant model's float pool is, so the codes stay within one step of fake-quant.
* ``requant="float"`` (onnxruntime running the QDQ model :func:`npujax.to_onnx` writes,
  which has ``QuantizeLinear -> DequantizeLinear`` on such a GEMM's output): the GEMM output
  saturates to the consumer's grid at once (QLinearConv/QGemm); the pool is ORT's
  QLinearAveragePool in float32 -- ``v = s * float(q - z)`` summed over the window in row-major
  order, divided by the count, ``nearbyint(v / s + z)`` -- bit for bit (not for a window that
  covers the whole input, which ORT sends to its integer global-pool kernel). Rounding twice
  and saturating before the pool can move a pooled code by more than a step from fake-quant
  where the GEMM's output exceeds the (post-pool) calibrated range.

A GEMM whose output does not reach exactly one quantized GEMM through those ops (the last layer,
residual branches) returns ``float32(acc) * s_x * s_w`` -- its dequantized accumulator -- and any
other operator runs in float on dequantized values (as ORT runs an operator it has no QLinear
kernel for between DequantizeLinear and QuantizeLinear). Divisions by scales are correctly
rounded (:func:`npujax.numerics.core.true_divide`) as ORT's are.

Overflow: with ``b_x``-bit activations and ``b_w``-bit weights, ``|acc| <= K * 2^b_x *
2^(b_w - 1)`` (K the reduction length); :func:`convert` raises if that bound could exceed
``2^31 - 1`` (for 8-bit codes: K > 66,052), instead of wrapping silently.

References:
  Jacob et al. 2018, arXiv:1712.05877 (sections 2.2-2.4: integer-only arithmetic, the fixed-point
  multiplier, int32 bias); gemmlowp ``fixedpoint.h``; TFLite ``QuantizeMultiplier``;
  ONNX QLinearConv / QLinearMatMul.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from npujax.errors import ConfigError, QuantizationError
from npujax.ir.execute import as_inputs, layer_state
from npujax.ir.graph import Graph, Node, Params
from npujax.numerics import IntFormat, dequantize, quantize
from npujax.numerics.fixed_point import (
    QTensor,
    quantize_bias,
    quantize_multiplier,
    requantize,
    saturate,
)
from npujax.ops import (
    OPS,
    apply_epilogue,
    embedding_nodes,
    gemm_nodes,
    kernel_out_axis,
    operand_quantized_ops,
    quantized_ops,
    run_op,
)
from npujax.ops.gemm import dense_conv
from npujax.quantize.quantizers import QState
from npujax.quantize.spec import QuantSpec
from npujax.quantize.weights import check_weights

__all__ = ["IntegerLayer", "IntegerMatMul", "IntegerModel", "convert", "execute_integer",
           "requant_target"]

_INT_EPILOGUES = frozenset({"Relu", "Relu6"})
_POOL_FRAC_BITS = 8


def _weight_codes(w: np.ndarray, scale: np.ndarray, fmt: IntFormat, axis: int) -> np.ndarray:
    """:func:`npujax.numerics.quantize` of a kernel with zero point 0, in numpy on the host: the
    same true float32 division, round half to even and clip, without compiling a program per
    kernel shape (``convert`` on the PP-OCR classifier: 39 compilations)."""
    shape = [1] * w.ndim
    shape[axis] = -1
    v = np.round(w / scale.reshape(shape)) + np.float32(0.0)
    return np.clip(v, fmt.qmin, fmt.qmax).astype(fmt.storage_dtype)


# --------------------------------------------------------------------------------------------
# The converted model.


@dataclasses.dataclass(frozen=True)
class IntegerLayer:
    """One GEMM node in integer form.

    Attributes:
      weight: int8/int16 weight codes (kernel layout of the node), zero point 0.
      weight_scale: float32 ``[C_out]`` per-channel weight scales.
      bias: int32 ``[C_out]`` bias at scale ``input_scale * weight_scale``.
      input_scale, input_zero_point, input_format: the activation grid of the layer's input.
      output: name of the layer whose input grid the output is requantized to, or None when the
        output is the dequantized accumulator (float32).
      output_scale, output_zero_point, output_format: that grid (None when ``output`` is None).
      m0, shift: int32 ``[C_out]`` fixed-point multipliers; ``multiplier``: float32 ``[C_out]``
        (both include the factor ``2^output_frac_bits``).
      output_frac_bits: extra fraction bits of the requantized output (8 when an AveragePool
        follows, so the average is rounded once, not twice; else 0).
    """

    weight: jax.Array
    weight_scale: jax.Array
    bias: jax.Array
    input_scale: jax.Array
    input_zero_point: jax.Array
    input_format: IntFormat
    output: str | None = None
    output_scale: jax.Array | None = None
    output_zero_point: jax.Array | None = None
    output_format: IntFormat | None = None
    m0: jax.Array | None = None
    shift: jax.Array | None = None
    multiplier: jax.Array | None = None
    output_frac_bits: int = 0


@dataclasses.dataclass(frozen=True)
class IntegerMatMul:
    """A GEMM of two activations (MatMul, Einsum: attention's ``Q K^T``, ``P V``) in integer
    form: both operands quantized per tensor on their calibrated grids, ``acc = sum((q_a - z_a)
    * (q_b - z_b))`` in int32, the output the dequantized accumulator ``float32(acc) * s_a *
    s_b`` (the vector unit's softmax or the next GEMM's input quantization follow in float).

    Attributes:
      input_scale, input_zero_point, input_format: the first operand's grid.
      operand_scale, operand_zero_point, operand_format: the second operand's grid.
    """

    input_scale: jax.Array
    input_zero_point: jax.Array
    input_format: IntFormat
    operand_scale: jax.Array
    operand_zero_point: jax.Array
    operand_format: IntFormat


@dataclasses.dataclass(frozen=True)
class IntegerModel:
    """A graph whose quantized GEMM nodes run in integers (see :func:`convert`).

    Attributes:
      graph: the graph (unchanged).
      params: float params of the nodes that are not converted.
      layers: ``{node_name: IntegerLayer}``.
      requant: ``"fixed_point"`` (gemmlowp/TFLite) or ``"float"`` (ONNX Runtime).
      matmuls: ``{node_name: IntegerMatMul}``, the quantized GEMMs of two activations.
    """

    graph: Graph
    params: Params
    layers: Mapping[str, IntegerLayer]
    requant: str = "fixed_point"
    matmuls: Mapping[str, IntegerMatMul] = dataclasses.field(default_factory=dict)


def _is_integer_layer(lq: Any) -> bool:
    return (lq is not None and isinstance(lq.act, IntFormat) and len(lq.weight_candidates) == 1
            and isinstance(lq.weight_candidates[0], IntFormat) and lq.weight_candidates[0].signed)


def requant_target(graph: Graph, quant: QuantSpec, node: Node) -> tuple[str | None, bool]:
    """The layer whose input grid ``node``'s output is requantized to (or None), and whether an
    AveragePool lies on the way.

    That is the one quantized GEMM reading ``node``'s output through code ops only (Reshape,
    Transpose, Identity, MaxPool, Relu, at most one AveragePool), when ``node`` is itself an
    integer GEMM layer with at most a ReLU/ReLU6 epilogue. :func:`convert` requantizes there and
    :func:`npujax.to_onnx` writes ``QuantizeLinear -> DequantizeLinear`` there.
    """
    gemm = quantized_ops()
    if node.op not in gemm or not _is_integer_layer(quant.get(node.name)):
        return None, False
    if any(e not in _INT_EPILOGUES for e in node.attrs.get("epilogue", ())):
        return None, False
    t = node.outputs[0]
    pooled = False
    while True:
        users = graph.consumers(t)
        if len(users) != 1 or t in graph.outputs:
            return None, False
        (u,) = users
        codes = OPS[u.op].codes if u.op in OPS else None
        if codes is not None and len(u.inputs) == 1:
            if codes == "rounding":
                if pooled:  # one pooling step keeps the single-rounding guarantee
                    return None, False
                pooled = True
            t = u.outputs[0]
            continue
        lq = quant.get(u.name)
        if u.op in gemm and lq is not None and isinstance(lq.act, IntFormat) \
                and u.inputs[0] == t:
            return u.name, pooled
        return None, False


def _reduction_length(node: Node, kernel: np.ndarray) -> int:
    return int(kernel.size // kernel.shape[kernel_out_axis(node)])


def convert(
    graph: Graph,
    params: Params,
    quant: QuantSpec,
    qstate: QState,
    *,
    requant: str = "fixed_point",
) -> IntegerModel:
    """Convert a calibrated fake-quant model into integer layers (weights to codes, int32 bias).

    Every node of ``quant`` with a single integer weight format and an integer activation
    format becomes an :class:`IntegerLayer`; the weight grid is exactly the one
    :func:`npujax.ir.execute.execute` fake-quantizes with, so the integer model reproduces the
    fake-quant model up to the rounding of the requantization (within one output step).

    Args:
      graph: the (BN-folded) model.
      params: its float params.
      quant: the quantization spec; layers must have per-channel symmetric weights.
      qstate: the layers' calibrated (or learned) states, from :func:`npujax.calibrate` or QAT.
      requant: ``"fixed_point"`` or ``"float"`` (see module docstring).

    Returns:
      An :class:`IntegerModel`.

    Raises:
      ConfigError: unknown ``requant``, a mixture of weight formats, a missing qstate entry.
      QuantizationError: if int32 accumulation could overflow for a layer; for FP8 or
        per-block (``weight_block_size``) layers, which the int-only path does not support.
      CalibrationError: a NaN/inf or too large weight (names the layer).

    Each layer converts on the grid its quantizer deploys (``act_grid``/``weight_grid``):
    LSQ/LSQ+ layers with their learned steps (weight zero point 0).

    References:
      Jacob et al. 2018, arXiv:1712.05877, section 2.
    """
    if requant not in ("fixed_point", "float"):
        raise ConfigError(f"requant must be 'fixed_point' or 'float', got {requant!r}.")
    check_weights(params)
    layers: dict[str, IntegerLayer] = {}

    def act_grid(name: str) -> tuple[jax.Array, jax.Array]:
        lq = quant[name]
        s, z = lq.quantizer.act_grid(lq, layer_state(quant, qstate, name))
        return jnp.asarray(s, jnp.float32), jnp.asarray(z, jnp.int32)

    for node in gemm_nodes(graph):
        lq = quant.get(node.name)
        if lq is None or lq.act is None or len(lq.weight_candidates) != 1:
            if lq is not None and len(lq.weight_candidates) > 1:
                raise ConfigError(
                    f"layer {node.name!r} has {len(lq.weight_candidates)} candidate weight "
                    "formats; fix one precision (quant_spec(graph, policy)) before converting."
                )
            continue
        if node.name not in qstate:
            raise ConfigError(f"qstate has no entry for layer {node.name!r}; calibrate first.")
        wfmt = lq.weight_candidates[0]
        if not (isinstance(wfmt, IntFormat) and isinstance(lq.act, IntFormat)) \
                or lq.weight_block_size is not None:
            raise QuantizationError(
                f"layer {node.name!r}: the integer path is int-only with per-channel/per-tensor "
                f"weight scales, got weight {wfmt}, activation {lq.act}, weight_block_size "
                f"{lq.weight_block_size}; run this model with fake-quant execute "
                "(npujax.execute) or export it with npujax.to_onnx instead.")
        if not (isinstance(wfmt, IntFormat) and wfmt.signed and isinstance(lq.act, IntFormat)):
            raise ConfigError(
                f"layer {node.name!r}: the integer path needs signed integer weights (zero point "
                f"0) and integer activations, got weight {wfmt} and activation {lq.act}; use "
                "IntFormat(b, narrow_range=True) weights or keep this model in fake-quant."
            )
        p = params[node.name]
        axis = kernel_out_axis(node)
        w = np.asarray(p["kernel"], np.float32)
        ws_h = np.asarray(lq.quantizer.weight_grid(
            node, lq, w, layer_state(quant, qstate, node.name)).scale, np.float32)
        c_out = w.shape[axis]
        ws_h = np.broadcast_to(ws_h, (c_out,))
        # device arrays without a program per shape (jnp.asarray of numpy compiles one)
        ws, wq = jax.device_put(np.array(ws_h)), jax.device_put(_weight_codes(w, ws_h, wfmt, axis))
        s_in, z_in = act_grid(node.name)
        k = _reduction_length(node, w)
        bound = k * (2 ** lq.act.bits) * (2 ** (wfmt.bits - 1))
        if bound > 2**31 - 1:
            raise QuantizationError(
                f"layer {node.name!r}: int32 accumulation could overflow (K={k}, "
                f"{lq.act.bits}-bit activations, {wfmt.bits}-bit weights: |acc| <= {bound}); "
                "lower the bit widths or split the reduction."
            )
        bias = np.asarray(p.get("bias", np.zeros((c_out,), np.float32)), np.float32)
        bias_q = jax.device_put(
            np.clip(quantize_bias(bias, s_in, ws_h), -(2**31), 2**31 - 1).astype(np.int32))
        layer = IntegerLayer(weight=wq, weight_scale=ws, bias=bias_q, input_scale=s_in,
                             input_zero_point=z_in, input_format=lq.act)
        nxt, pooled = requant_target(graph, quant, node)
        if nxt is not None and nxt in qstate:
            fb = _POOL_FRAC_BITS if pooled and requant == "fixed_point" else 0
            s_out, z_out = act_grid(nxt)
            out_fmt = quant[nxt].act
            assert isinstance(out_fmt, IntFormat)  # requant_target only returns integer layers
            # float32 as ORT's QLinearConv / QGemm compute it: (s_x * s_w) / s_y
            mult32 = (np.float32(s_in) * ws_h) / np.float32(s_out)
            mult32 = mult32 * np.float32(2**fb)
            m0, shift = quantize_multiplier(
                np.float64(s_in) * ws_h.astype(np.float64) / np.float64(s_out) * 2.0**fb)
            layer = dataclasses.replace(
                layer, output=nxt, output_scale=s_out, output_zero_point=z_out,
                output_format=out_fmt, m0=jax.device_put(m0), shift=jax.device_put(shift),
                multiplier=jax.device_put(mult32.astype(np.float32)), output_frac_bits=fb)
        layers[node.name] = layer
    rest = {k: v for k, v in params.items() if k not in layers}
    for node in embedding_nodes(graph):  # a quantized table: its grid values (Gather is exact)
        lq = quant.get(node.name)
        if lq is not None and lq.weight_candidates:
            t = jnp.asarray(params[node.name]["table"], jnp.float32)
            rest[node.name] = {**rest[node.name], "table": lq.quantizer.quantize_kernel(
                node, lq, t, layer_state(quant, qstate, node.name))}
    matmuls = {n.name: _convert_matmul(graph, n, quant, qstate)
               for n in graph.nodes if n.op in operand_quantized_ops() and n.name in quant}
    return IntegerModel(graph=graph, params=rest, layers=layers, requant=requant,
                        matmuls=matmuls)


def _convert_matmul(graph: Graph, node: Node, quant: QuantSpec, qstate: QState
                    ) -> IntegerMatMul:
    """The integer form of a quantized GEMM of two activations (see :class:`IntegerMatMul`)."""
    lq = quant[node.name]
    fmts = lq.weight_candidates
    if not (isinstance(lq.act, IntFormat) and len(fmts) == 1 and isinstance(fmts[0], IntFormat)):
        raise QuantizationError(
            f"layer {node.name!r} ({node.op} of two activations): the integer path needs one "
            f"integer format per operand, got {lq.act} and {fmts}; quantize both operands "
            "(quant_spec) or keep this model in fake-quant.")
    if node.name not in qstate:
        raise ConfigError(f"qstate has no entry for layer {node.name!r}; calibrate first.")
    state = layer_state(quant, qstate, node.name)
    sa, za = lq.quantizer.act_grid(lq, state)
    sb, zb = lq.quantizer.operand_grid(node, lq, state)
    k = OPS[node.op].array_work(node, [graph.tensors[t].shape for t in node.inputs],  # type: ignore[misc]
                                [graph.tensors[t].shape for t in node.outputs], 1).K
    bound = k * (2 ** lq.act.bits) * (2 ** fmts[0].bits)
    if bound > 2**31 - 1:
        raise QuantizationError(
            f"layer {node.name!r}: int32 accumulation could overflow (K={k}, {lq.act.bits}- and "
            f"{fmts[0].bits}-bit operands: |acc| <= {bound}); lower the bit widths.")
    return IntegerMatMul(jnp.asarray(sa, jnp.float32), jnp.asarray(za, jnp.int32), lq.act,
                         jnp.asarray(sb, jnp.float32), jnp.asarray(zb, jnp.int32), fmts[0])


def _run_matmul(node: Node, mm: IntegerMatMul, a: Any, b: Any) -> tuple[jax.Array, jax.Array]:
    """``(first operand as computed with, output)`` of an :class:`IntegerMatMul`."""
    qa = quantize(_to_float(a), mm.input_scale, mm.input_zero_point, mm.input_format)
    qb = quantize(_to_float(b), mm.operand_scale, mm.operand_zero_point, mm.operand_format)
    ia = qa.astype(jnp.int32) - mm.input_zero_point
    ib = qb.astype(jnp.int32) - mm.operand_zero_point
    (acc,) = run_op(node, [ia, ib], {})  # int32 x int32 -> int32 (bounded by convert)
    y = acc.astype(jnp.float32) * (mm.input_scale * mm.operand_scale)
    return dequantize(qa, mm.input_scale, mm.input_zero_point), y


# --------------------------------------------------------------------------------------------
# Execution.


def _to_float(v: Any) -> jax.Array:
    if isinstance(v, QTensor):
        return dequantize(saturate(v), v.scale, v.zero_point)
    return v


def _channel_shape(node: Node, ndim: int) -> list[int]:
    shape = [1] * ndim
    shape[node.attrs["data_layout"].index("C") if node.op == "Conv" else ndim - 1] = -1
    return shape


def _int_gemm(node: Node, x: jax.Array, w: jax.Array) -> jax.Array:
    """The node's GEMM on int32 operands with int32 accumulation (no bias, no epilogue)."""
    if node.op == "Gemm":
        return jnp.matmul(x, w, preferred_element_type=jnp.int32)
    return dense_conv(x, w, node.attrs, preferred_element_type=jnp.int32)


def _run_layer(model: IntegerModel, node: Node, layer: IntegerLayer, v: Any) -> Any:
    if isinstance(v, QTensor) and v.owner == node.name:
        codes = saturate(v)
    else:
        codes = quantize(_to_float(v), layer.input_scale, layer.input_zero_point,
                         layer.input_format)
    x_in = dequantize(codes, layer.input_scale, layer.input_zero_point)
    xi = codes.astype(jnp.int32) - layer.input_zero_point
    acc = _int_gemm(node, xi, layer.weight.astype(jnp.int32))
    cshape = _channel_shape(node, acc.ndim)
    acc = acc + layer.bias.reshape(cshape)
    if layer.output is None:
        y = acc.astype(jnp.float32) * (layer.input_scale * layer.weight_scale).reshape(cshape)
        return x_in, apply_epilogue(node, y)
    fmt, zp, s_out = layer.output_format, layer.output_zero_point, layer.output_scale
    assert fmt is not None and zp is not None and s_out is not None  # set with layer.output
    if model.requant == "float":
        assert layer.multiplier is not None
        r = jnp.round(acc.astype(jnp.float32) * layer.multiplier.reshape(cshape)).astype(jnp.int32)
    else:
        assert layer.m0 is not None and layer.shift is not None
        r = requantize(acc, layer.m0.reshape(cshape), layer.shift.reshape(cshape))
    fb = layer.output_frac_bits
    q = r + (zp << fb)  # int32
    for e in node.attrs.get("epilogue", ()):
        q = jnp.maximum(q, zp << fb)
        if e == "Relu6":
            six = jnp.round(jnp.float32(6.0 * 2**fb) / s_out).astype(jnp.int32)
            q = jnp.minimum(q, six + (zp << fb))
    if fb == 0:
        q = jnp.clip(q, fmt.qmin, fmt.qmax)  # QuantizeLinear saturates
    return x_in, QTensor(q, s_out, zp, fmt, layer.output, fb)


def _run_codes(node: Node, v: QTensor) -> QTensor:
    """An operator on integer codes: its ``run_codes``, or (data movement) ``run`` on the codes."""
    d = OPS[node.op]
    if d.run_codes is not None:
        return d.run_codes(node, v)
    (out,) = d.run(node, [v.codes], {})
    return v._replace(codes=out)


def execute_integer(
    model: IntegerModel,
    x: jax.Array | Sequence[jax.Array],
    *,
    taps: Collection[str] = (),
) -> Any:
    """Run an :class:`IntegerModel` (integer GEMMs; see the module docstring for the rules).

    Args:
      model: from :func:`convert`.
      x: float32 input batch ``(batch, ...)`` (quantized by the first layer's input grid).
      taps: node names whose first input and output should also be returned (float32,
        dequantized; for an integer layer the input is the quantized input it computed with).

    Returns:
      The graph output (float32; dequantized codes or dequantized accumulators), and with
      ``taps`` a pair ``(output, {node: (input, output)})`` as
      ``execute(..., observe=tap(taps))`` (:func:`npujax.ir.execute.tap`).
    """
    graph = model.graph
    env: dict[str, Any] = {k: jnp.asarray(v) for k, v in graph.constants.items()}
    env.update(zip(graph.inputs, as_inputs(graph, x)))
    tapped = {}
    for node in graph.nodes:
        ins = [env[t] for t in node.inputs]
        layer = model.layers.get(node.name)
        x_in = None
        if layer is not None:
            x_in, out = _run_layer(model, node, layer, ins[0])
            outs = [out]
        elif node.name in model.matmuls:
            x_in, out = _run_matmul(node, model.matmuls[node.name], ins[0], ins[1])
            outs = [out]
        elif (node.op in OPS and OPS[node.op].codes is not None and len(ins) == 1
              and isinstance(ins[0], QTensor)):
            outs = [_run_codes(node, ins[0])]
        else:
            outs = run_op(node, [_to_float(v) for v in ins], dict(model.params.get(node.name, {})))
        env.update(zip(node.outputs, outs))
        if node.name in taps:
            tapped[node.name] = (_to_float(ins[0]) if x_in is None else x_in, _to_float(outs[0]))
    results = tuple(_to_float(env[t]) for t in graph.outputs)
    result = results[0] if len(results) == 1 else results
    return (result, tapped) if taps else result

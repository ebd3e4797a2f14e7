"""Integer-only execution of a converted (PTQ or QAT) model: int8 codes, int32 accumulation.

``convert(graph, params, quant, qstate)`` turns every quantized GEMM node (Conv, Gemm) into an
:class:`IntegerLayer`; ``execute_integer(model, x)`` runs the graph with

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
rounded (:func:`npujax.quant.core.true_divide`) as ORT's are.

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
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from npujax.errors import ConfigError, QuantizationError
from npujax.ir.graph import GEMM_OPS, Graph, Node, Params
from npujax.ops.core import _dense_conv, apply_epilogue, avgpool_count, kernel_out_axis, run_op
from npujax.quant import IntFormat, dequantize, quantize
from npujax.quant.core import true_divide
from npujax.quantize.execute import QuantSpec, _as_inputs, layer_weight_qparams
from npujax.quantize.learned_steps import deploy_qstate

__all__ = [
    "IntegerLayer",
    "IntegerModel",
    "convert",
    "execute_integer",
    "quantize_bias",
    "quantize_multiplier",
    "requant_target",
    "requantize",
    "rounding_doubling_high_mul",
    "rounding_divide_by_pot",
]

_CODE_OPS = frozenset({"Reshape", "Transpose", "Identity", "MaxPool", "Relu", "AveragePool"})
_INT_EPILOGUES = frozenset({"Relu", "Relu6"})
_POOL_FRAC_BITS = 8


# --------------------------------------------------------------------------------------------
# Fixed-point arithmetic (gemmlowp / TFLite), int32 only (no 64-bit JAX types needed).


def quantize_multiplier(m: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Split real multipliers ``0 < M`` into a Q31 ``m0`` and a shift: ``M ~= m0 * 2^(shift-31)``.

    Args:
      m: float array of positive multipliers (computed in float64 on the host).

    Returns:
      ``(m0, shift)``: int32 arrays; ``m0`` in ``[2^30, 2^31 - 1]``, ``shift`` the power of two
      (negative for ``M < 0.5``), as TFLite's ``QuantizeMultiplier``.

    Raises:
      QuantizationError: if some multiplier is not positive and finite.
    """
    m = np.asarray(m, np.float64)
    if not np.all(np.isfinite(m) & (m > 0)):
        raise QuantizationError(f"requantization multipliers must be positive and finite, got {m}.")
    frac, exp = np.frexp(m)  # m = frac * 2^exp, frac in [0.5, 1)
    m0 = np.round(frac * 2.0**31).astype(np.int64)
    carry = m0 == 2**31
    m0 = np.where(carry, m0 // 2, m0)
    exp = np.where(carry, exp + 1, exp)
    return m0.astype(np.int32), exp.astype(np.int32)


def rounding_doubling_high_mul(a: jax.Array, b: jax.Array) -> jax.Array:
    """gemmlowp ``SaturatingRoundingDoublingHighMul`` for int32 ``a`` and positive int32 ``b``.

    ``round(a * b / 2^31)`` with ties away from zero, computed exactly with 16-bit limbs in
    uint32 (the 64-bit product never materialises). ``b > 0`` so the single saturating case
    (``a = b = -2^31``) cannot occur.
    """
    a = jnp.asarray(a, jnp.int32)
    b = jnp.asarray(b, jnp.int32)
    neg = a < 0
    ua = jnp.where(neg, -a, a)  # |a|; -2^31 wraps to itself, read as uint32 it is 2^31
    ua = lax.bitcast_convert_type(ua, jnp.uint32)  # -2^31 -> 2^31 as uint32: exact
    ub = lax.bitcast_convert_type(b, jnp.uint32)
    m16 = jnp.uint32(0xFFFF)
    a1, a0 = ua >> 16, ua & m16
    b1, b0 = ub >> 16, ub & m16
    p00, p01, p10, p11 = a0 * b0, a0 * b1, a1 * b0, a1 * b1
    mid = (p00 >> 16) + (p01 & m16) + (p10 & m16)
    lo = (mid << 16) | (p00 & m16)
    hi = p11 + (p01 >> 16) + (p10 >> 16) + (mid >> 16)
    # positive: floor((P + 2^30) / 2^31); negative: -floor((P + 2^30 - 1) / 2^31)
    nudge = jnp.where(neg, jnp.uint32(2**30 - 1), jnp.uint32(2**30))
    lo2 = lo + nudge
    hi2 = hi + (lo2 < lo).astype(jnp.uint32)
    q = (hi2 << 1) | (lo2 >> 31)
    q = lax.bitcast_convert_type(q, jnp.int32)
    return jnp.where(neg, -q, q)


def rounding_divide_by_pot(x: jax.Array, exponent: jax.Array) -> jax.Array:
    """gemmlowp ``RoundingDivideByPOT``: ``x / 2^exponent`` rounded half away from zero (int32)."""
    x = jnp.asarray(x, jnp.int32)
    exponent = jnp.asarray(exponent, jnp.int32)
    mask = (jnp.int32(1) << exponent) - 1
    remainder = x & mask
    threshold = (mask >> 1) + (x < 0).astype(jnp.int32)
    return (x >> exponent) + (remainder > threshold).astype(jnp.int32)


def requantize(acc: jax.Array, m0: jax.Array, shift: jax.Array) -> jax.Array:
    """``acc * M`` rounded, ``M = m0 * 2^(shift - 31)`` (TFLite ``MultiplyByQuantizedMultiplier``).

    Args:
      acc: int32 accumulators.
      m0, shift: from :func:`quantize_multiplier`, broadcastable against ``acc``.

    Returns:
      int32 array, ``acc * M`` rounded (gemmlowp rounding, see module docstring).
    """
    left = jnp.maximum(shift, 0)
    right = jnp.maximum(-shift, 0)
    return rounding_divide_by_pot(rounding_doubling_high_mul(acc << left, m0), right)


def quantize_bias(bias: np.ndarray, act_scale: Any, weight_scale: Any) -> np.ndarray:
    """int32-grid bias codes ``round_half_even(b / (s_x * s_w))``, as int64 (not yet clipped).

    The scale ``s_x * s_w`` is the float32 product (ONNX's QDQ bias convention; what
    onnxruntime's kernels assume), and the division is done in float64 on the host so that
    :func:`convert` and :func:`npujax.to_onnx` write the same codes.

    Args:
      bias: float32 ``[C_out]``.
      act_scale: the layer's input scale (float32 scalar).
      weight_scale: float32 ``[C_out]`` (or scalar) weight scales.
    """
    scale = np.float32(np.asarray(act_scale, np.float32).reshape(())) * np.asarray(
        weight_scale, np.float32)
    scale = np.broadcast_to(scale, np.shape(bias)).astype(np.float32)
    return np.round(np.asarray(bias, np.float64) / scale.astype(np.float64)).astype(np.int64)


# --------------------------------------------------------------------------------------------
# The converted model.


class QTensor(NamedTuple):
    """int32 codes on a per-tensor grid (``owner``: the layer whose input qparams they use).

    ``codes`` count steps of ``scale / 2^frac_bits`` (``frac_bits`` > 0 only between a GEMM and
    an AveragePool, see the module docstring) and are not yet saturated.
    """

    codes: jax.Array
    scale: jax.Array
    zero_point: jax.Array
    fmt: IntFormat
    owner: str
    frac_bits: int = 0  # codes with frac_bits == 0 are saturated (QuantizeLinear)


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
class IntegerModel:
    """A graph whose quantized GEMM nodes run in integers (see :func:`convert`).

    Attributes:
      graph: the graph (unchanged).
      params: float params of the nodes that are not converted.
      layers: ``{node_name: IntegerLayer}``.
      requant: ``"fixed_point"`` (gemmlowp/TFLite) or ``"float"`` (ONNX Runtime).
    """

    graph: Graph
    params: Params
    layers: Mapping[str, IntegerLayer]
    requant: str = "fixed_point"


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
    if node.op not in GEMM_OPS or not _is_integer_layer(quant.get(node.name)):
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
        if u.op in _CODE_OPS and len(u.inputs) == 1:
            if u.op == "AveragePool":
                if pooled:  # one pooling step keeps the single-rounding guarantee
                    return None, False
                pooled = True
            t = u.outputs[0]
            continue
        lq = quant.get(u.name)
        if u.op in GEMM_OPS and lq is not None and isinstance(lq.act, IntFormat) \
                and u.inputs[0] == t:
            return u.name, pooled
        return None, False


def _reduction_length(node: Node, kernel: np.ndarray) -> int:
    return int(kernel.size // kernel.shape[kernel_out_axis(node)])


def convert(
    graph: Graph,
    params: Params,
    quant: QuantSpec,
    qstate: Mapping[str, Mapping[str, jax.Array]],
    *,
    requant: str = "fixed_point",
) -> IntegerModel:
    """Convert a calibrated fake-quant model into integer layers (weights to codes, int32 bias).

    Every node of ``quant`` with a single integer weight format and an integer activation
    format becomes an :class:`IntegerLayer`; the weight grid is exactly the one
    :func:`npujax.quantize.execute` fake-quantizes with, so the integer model reproduces the
    fake-quant model up to the rounding of the requantization (within one output step).

    Args:
      graph, params: the (BN-folded) model and its float params.
      quant: the quantization spec; layers must have per-channel symmetric weights.
      qstate: calibrated activation qparams ``{layer: {"act_scale", "act_zero_point"}}``.
      requant: ``"fixed_point"`` or ``"float"`` (see module docstring).

    Returns:
      An :class:`IntegerModel`.

    Raises:
      ConfigError: unknown ``requant``, a mixture of weight formats, a missing qstate entry.
      QuantizationError: if int32 accumulation could overflow for a layer; for FP8 or
        per-block (``weight_block_size``) layers, which the int-only path does not support.

    LSQ/LSQ+ layers convert with their learned steps (weight zero point 0), see
    :func:`npujax.quantize.learned_steps.deploy_qstate`.

    References:
      Jacob et al. 2018, arXiv:1712.05877, section 2.
    """
    if requant not in ("fixed_point", "float"):
        raise ConfigError(f"requant must be 'fixed_point' or 'float', got {requant!r}.")
    layers: dict[str, IntegerLayer] = {}
    qstate = deploy_qstate(quant, qstate)
    for node in graph.gemm_nodes:
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
                "(npujax.quantize.execute) or export it with npujax.to_onnx instead.")
        if not (isinstance(wfmt, IntFormat) and wfmt.signed and isinstance(lq.act, IntFormat)):
            raise ConfigError(
                f"layer {node.name!r}: the integer path needs signed integer weights (zero point "
                f"0) and integer activations, got weight {wfmt} and activation {lq.act}; use "
                "IntFormat(b, narrow_range=True) weights or keep this model in fake-quant."
            )
        p = params[node.name]
        axis = kernel_out_axis(node)
        w = jnp.asarray(p["kernel"], jnp.float32)
        ws = layer_weight_qparams(node, lq, w, qstate.get(node.name))[0]
        c_out = w.shape[axis]
        ws = jnp.broadcast_to(ws, (c_out,))
        wq = quantize(w, ws, jnp.zeros((c_out,), jnp.int32), wfmt, axis)
        s_in = jnp.asarray(qstate[node.name]["act_scale"], jnp.float32)
        z_in = jnp.asarray(qstate[node.name]["act_zero_point"], jnp.int32)
        k = _reduction_length(node, np.asarray(w))
        bound = k * (2 ** lq.act.bits) * (2 ** (wfmt.bits - 1))
        if bound > 2**31 - 1:
            raise QuantizationError(
                f"layer {node.name!r}: int32 accumulation could overflow (K={k}, "
                f"{lq.act.bits}-bit activations, {wfmt.bits}-bit weights: |acc| <= {bound}); "
                "lower the bit widths or split the reduction."
            )
        bias = np.asarray(p.get("bias", np.zeros((c_out,), np.float32)), np.float32)
        bias_q = jnp.asarray(np.clip(quantize_bias(bias, s_in, ws), -(2**31), 2**31 - 1),
                             jnp.int32)
        layer = IntegerLayer(weight=wq, weight_scale=ws, bias=bias_q, input_scale=s_in,
                             input_zero_point=z_in, input_format=lq.act)
        nxt, pooled = requant_target(graph, quant, node)
        if nxt is not None and nxt in qstate:
            fb = _POOL_FRAC_BITS if pooled and requant == "fixed_point" else 0
            s_out = jnp.asarray(qstate[nxt]["act_scale"], jnp.float32)
            z_out = jnp.asarray(qstate[nxt]["act_zero_point"], jnp.int32)
            # float32 as ORT's QLinearConv / QGemm compute it: (s_x * s_w) / s_y
            mult32 = (np.float32(s_in) * np.asarray(ws, np.float32)) / np.float32(s_out)
            mult32 = mult32 * np.float32(2**fb)
            m0, shift = quantize_multiplier(
                np.float64(s_in) * np.asarray(ws, np.float64) / np.float64(s_out) * 2.0**fb)
            layer = dataclasses.replace(
                layer, output=nxt, output_scale=s_out, output_zero_point=z_out,
                output_format=quant[nxt].act, m0=jnp.asarray(m0), shift=jnp.asarray(shift),
                multiplier=jnp.asarray(mult32, jnp.float32), output_frac_bits=fb)
        layers[node.name] = layer
    rest = {k: v for k, v in params.items() if k not in layers}
    return IntegerModel(graph=graph, params=rest, layers=layers, requant=requant)


# --------------------------------------------------------------------------------------------
# Execution.


def _div_round_half_even(n: jax.Array, d: jax.Array) -> jax.Array:
    """``n / d`` for int32 ``n`` and positive int32 ``d``, rounded half to even."""
    q = jnp.floor_divide(n, d)
    r = n - q * d
    up = (2 * r > d) | ((2 * r == d) & (q % 2 == 1))
    return q + up.astype(jnp.int32)


def _saturate(v: QTensor) -> jax.Array:
    """The codes (fraction bits rounded off) clamped to their format, in its storage dtype."""
    c = v.codes if v.frac_bits == 0 else _div_round_half_even(v.codes, 2**v.frac_bits)
    return jnp.clip(c, v.fmt.qmin, v.fmt.qmax).astype(v.fmt.storage_dtype)


def _to_float(v: Any) -> jax.Array:
    if isinstance(v, QTensor):
        return dequantize(_saturate(v), v.scale, v.zero_point)
    return v


def _channel_shape(node: Node, ndim: int) -> list[int]:
    shape = [1] * ndim
    shape[node.attrs["data_layout"].index("C") if node.op == "Conv" else ndim - 1] = -1
    return shape


def _int_gemm(node: Node, x: jax.Array, w: jax.Array) -> jax.Array:
    """The node's GEMM on int32 operands with int32 accumulation (no bias, no epilogue)."""
    if node.op == "Gemm":
        return jnp.matmul(x, w, preferred_element_type=jnp.int32)
    return _dense_conv(x, w, node.attrs, preferred_element_type=jnp.int32)


def _run_layer(model: IntegerModel, node: Node, layer: IntegerLayer, v: Any) -> Any:
    if isinstance(v, QTensor) and v.owner == node.name:
        codes = _saturate(v)
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
    fmt, zp = layer.output_format, layer.output_zero_point
    if model.requant == "float":
        r = jnp.round(acc.astype(jnp.float32) * layer.multiplier.reshape(cshape)).astype(jnp.int32)
    else:
        r = requantize(acc, layer.m0.reshape(cshape), layer.shift.reshape(cshape))
    fb = layer.output_frac_bits
    q = r + (zp << fb)  # int32
    for e in node.attrs.get("epilogue", ()):
        q = jnp.maximum(q, zp << fb)
        if e == "Relu6":
            six = jnp.round(jnp.float32(6.0 * 2**fb) / layer.output_scale).astype(jnp.int32)
            q = jnp.minimum(q, six + (zp << fb))
    if fb == 0:
        q = jnp.clip(q, fmt.qmin, fmt.qmax)  # QuantizeLinear saturates
    return x_in, QTensor(q, layer.output_scale, zp, fmt, layer.output, fb)


def _window_sum_in_order(node: Node, v: jax.Array) -> jax.Array:
    """Sum over each pooling window, adding the elements in row-major window order as ORT's
    pool loops do (padding adds zeros)."""
    a = node.attrs
    v = jnp.pad(v, [tuple(p) for p in a["padding"]])
    dil = tuple(a.get("window_dilation", (1,) * v.ndim))
    out_shape = [(v.shape[i] - (a["window"][i] - 1) * dil[i] - 1) // a["strides"][i] + 1
                 for i in range(v.ndim)]
    total = None
    for offset in np.ndindex(*a["window"]):
        start = [o * d for o, d in zip(offset, dil)]
        limit = [b + (n - 1) * st + 1 for b, n, st in zip(start, out_shape, a["strides"])]
        term = lax.slice(v, start, limit, tuple(a["strides"]))
        total = term if total is None else total + term
    return total


def _avgpool_codes(node: Node, v: QTensor) -> QTensor:
    """``DQ -> AveragePool -> Q`` on one grid (see the module docstring for the two modes)."""
    a = node.attrs
    count = avgpool_count(node, v.codes.shape)
    x = v.codes - (v.zero_point << v.frac_bits)
    if v.frac_bits == 0:  # saturated codes: onnxruntime's QLinearAveragePool, float32
        xd = v.scale * x.astype(jnp.float32)
        avg = true_divide(_window_sum_in_order(node, xd), count)
        q = jnp.round(true_divide(avg, v.scale) + v.zero_point.astype(jnp.float32))
        q = q.astype(jnp.int32)
    else:  # int32 pooling unit: one rounding of the unsaturated sum
        s = lax.reduce_window(x, jnp.int32(0), lax.add, tuple(a["window"]), tuple(a["strides"]),
                              [tuple(p) for p in a["padding"]],
                              window_dilation=tuple(a.get("window_dilation", (1,) * x.ndim)))
        d = jnp.asarray(count, jnp.int32) * jnp.int32(2**v.frac_bits)
        q = _div_round_half_even(s, d) + v.zero_point
    return v._replace(codes=jnp.clip(q, v.fmt.qmin, v.fmt.qmax), frac_bits=0)


def _code_op(node: Node, v: QTensor) -> QTensor:
    if node.op == "AveragePool":
        return _avgpool_codes(node, v)
    if node.op == "Relu":
        return v._replace(codes=jnp.maximum(v.codes, v.zero_point << v.frac_bits))
    if node.op == "MaxPool":
        a = node.attrs
        init = jnp.asarray(jnp.iinfo(v.codes.dtype).min, v.codes.dtype)
        c = lax.reduce_window(v.codes, init, lax.max, tuple(a["window"]), tuple(a["strides"]),
                              [tuple(p) for p in a["padding"]])
        return v._replace(codes=c)
    (out,) = run_op(node, [v.codes], {})  # Reshape / Transpose / Identity move codes only
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
      ``taps`` a pair ``(output, {node: (input, output)})`` as :func:`npujax.quantize.execute`.
    """
    graph = model.graph
    env: dict[str, Any] = {k: jnp.asarray(v) for k, v in graph.constants.items()}
    env.update(zip(graph.inputs, _as_inputs(graph, x)))
    tapped = {}
    for node in graph.nodes:
        ins = [env[t] for t in node.inputs]
        layer = model.layers.get(node.name)
        x_in = None
        if layer is not None:
            x_in, out = _run_layer(model, node, layer, ins[0])
            outs = [out]
        elif node.op in _CODE_OPS and len(ins) == 1 and isinstance(ins[0], QTensor):
            outs = [_code_op(node, ins[0])]
        else:
            outs = run_op(node, [_to_float(v) for v in ins], dict(model.params.get(node.name, {})))
        env.update(zip(node.outputs, outs))
        if node.name in taps:
            tapped[node.name] = (_to_float(ins[0]) if x_in is None else x_in, _to_float(outs[0]))
    result = tuple(_to_float(env[t]) for t in graph.outputs)
    result = result[0] if len(result) == 1 else result
    return (result, tapped) if taps else result

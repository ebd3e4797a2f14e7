"""Integer arithmetic of quantized inference: fixed-point requantization, bias codes and
integer tensors on a per-tensor grid.

* :func:`quantize_multiplier`, :func:`rounding_doubling_high_mul`,
  :func:`rounding_divide_by_pot`, :func:`requantize`: gemmlowp / TFLite fixed-point
  multiplication by a real multiplier ``M = m0 * 2^(shift - 31)`` in int32 only (Jacob et al.
  2018, arXiv:1712.05877, section 2.2; gemmlowp ``fixedpoint.h``; TFLite
  ``QuantizeMultiplier``/``MultiplyByQuantizedMultiplier``).
* :func:`quantize_bias`: int32 bias codes at scale ``s_x * s_w`` (ONNX's QDQ bias convention).
* :func:`div_round_half_even`: exact integer division rounded half to even.
* :class:`QTensor`: int32 codes with their grid, as the integer path passes them between
  operators (:mod:`npujax.backends.integer`; the code-level operator implementations in
  :mod:`npujax.ops`).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from npujax.errors import QuantizationError
from npujax.numerics.formats import IntFormat

__all__ = [
    "QTensor",
    "quantize_multiplier",
    "rounding_doubling_high_mul",
    "rounding_divide_by_pot",
    "requantize",
    "quantize_bias",
    "div_round_half_even",
    "saturate",
]


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
      m0: the Q31 multiplier from :func:`quantize_multiplier`, broadcastable against ``acc``.
      shift: its shift from :func:`quantize_multiplier`, broadcastable against ``acc``.

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


def div_round_half_even(n: jax.Array, d: jax.Array) -> jax.Array:
    """``n / d`` for int32 ``n`` and positive int32 ``d``, rounded half to even."""
    q = jnp.floor_divide(n, d)
    r = n - q * d
    up = (2 * r > d) | ((2 * r == d) & (q % 2 == 1))
    return q + up.astype(jnp.int32)


class QTensor(NamedTuple):
    """int32 codes on a per-tensor grid (``owner``: the layer whose input qparams they use).

    ``codes`` count steps of ``scale / 2^frac_bits`` (``frac_bits`` > 0 only between a GEMM and
    an AveragePool, see :mod:`npujax.backends.integer`) and are not yet saturated.
    """

    codes: jax.Array
    scale: jax.Array
    zero_point: jax.Array
    fmt: IntFormat
    owner: str
    frac_bits: int = 0  # codes with frac_bits == 0 are saturated (QuantizeLinear)


def saturate(v: QTensor) -> jax.Array:
    """The codes (fraction bits rounded off, half to even) clamped to their format, in its
    storage dtype."""
    c = v.codes if v.frac_bits == 0 else div_round_half_even(v.codes, 2**v.frac_bits)
    return jnp.clip(c, v.fmt.qmin, v.fmt.qmax).astype(v.fmt.storage_dtype)

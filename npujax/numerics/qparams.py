"""Scale and zero point from an observed value range."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike

from npujax.errors import QuantizationError
from npujax.numerics.finite import check_finite, label, max_scale
from npujax.numerics.formats import FloatFormat, Format

__all__ = ["qparams_from_range", "weight_qparams", "MIN_SCALE"]

#: Smallest scale ever returned: float32 machine epsilon (as PyTorch's observers use). A zero
#: range (all-zero tensor, dead channel) then gives a finite positive scale and exact zeros.
MIN_SCALE = float(jnp.finfo(jnp.float32).eps)


def qparams_from_range(
    min_val: jax.Array,
    max_val: jax.Array,
    fmt: Format,
    symmetric: bool,
    *,
    name: str | None = None,
) -> tuple[jax.Array, jax.Array]:
    """Scale and zero point that map ``[min_val, max_val]`` onto ``fmt``'s code range.

    The range is first widened to contain 0 (so 0.0 is exactly representable, as zero padding and
    ReLU outputs require).

    * asymmetric: ``scale = (max - min) / (qmax - qmin)``,
      ``zero_point = clip(qmin - round(min / scale), qmin, qmax)``;
    * symmetric: ``scale = max(|min|, |max|) / ((qmax - qmin) / 2)``, zero point at the middle
      code (0 for signed formats, ``(qmin + qmax + 1) // 2`` for unsigned);
    * FP8 (:class:`FloatFormat`, always symmetric): ``scale = max(|min|, |max|) / fmt.max``,
      zero point 0.

    The scale is at most :func:`~npujax.numerics.finite.max_scale` (every code dequantizes to a
    finite float32; ``npujax/numerics/finite.py``): this binds only for ranges near the float32
    maximum, whose far end then saturates. A range wider than the float32 maximum is divided
    before it is subtracted, ``max / n - min / n`` (ordinary ranges keep ``(max - min) / n``
    bit for bit).

    Args:
      min_val: the range's minimum, a float32 scalar (per-tensor) or ``[C]`` array
        (per-channel).
      max_val: its maximum, same shape.
      fmt: target integer format.
      symmetric: symmetric (weights) or asymmetric (activations) mapping.
      name: the tensor's name, for error messages.

    Returns:
      ``(scale, zero_point)``: float32 scale in ``[MIN_SCALE, max_scale]`` and int32 zero
      point, both of the input's shape. Never NaN, even for an empty (min > max after an
      all-NaN-free empty update) or zero range.

    Raises:
      QuantizationError: a concrete (not traced) minimum or maximum holding NaN or inf (the
        message names the channel).

    References:
      Jacob et al. 2018, arXiv:1712.05877, section 2.1; Krishnamoorthi 2018, arXiv:1806.08342.
    """
    for role, v in (("minimum", min_val), ("maximum", max_val)):
        check_finite(v, f"{label('range', name)} {role}", 0 if np.ndim(v) == 1 else None)
    lo = jnp.minimum(jnp.asarray(min_val, jnp.float32), 0.0)
    hi = jnp.maximum(jnp.asarray(max_val, jnp.float32), 0.0)
    top = max_scale(fmt, symmetric or isinstance(fmt, FloatFormat))
    if isinstance(fmt, FloatFormat):
        scale = jnp.clip(jnp.maximum(-lo, hi) / fmt.max, MIN_SCALE, top)
        return scale, jnp.zeros(jnp.shape(scale), jnp.int32)
    if symmetric:
        amax = jnp.maximum(-lo, hi)
        scale = jnp.clip(amax / ((fmt.qmax - fmt.qmin) / 2.0), MIN_SCALE, top)
        mid = 0 if fmt.signed else (fmt.qmin + fmt.qmax + 1) // 2
        zero_point = jnp.full(jnp.shape(scale), mid, jnp.int32)
    else:
        n = float(fmt.qmax - fmt.qmin)
        width = hi - lo  # inf only for a range wider than the float32 maximum
        scale = jnp.where(jnp.isfinite(width), width / n, hi / n - lo / n)
        scale = jnp.clip(scale, MIN_SCALE, top)
        zero_point = jnp.clip(fmt.qmin - jnp.round(lo / scale), fmt.qmin, fmt.qmax)
        zero_point = zero_point.astype(jnp.int32)
    return scale, zero_point


def weight_qparams(
    w: ArrayLike, fmt: Format, axis: int | None, *, block_size: int | None = None,
    name: str | None = None,
) -> tuple[jax.Array, jax.Array]:
    """Symmetric min-max scale for a weight tensor, per channel along ``axis`` (or per tensor),
    or per block of ``block_size`` consecutive elements along ``axis``.

    Per block (ONNX opset-21 blocked quantization), ``axis`` is the blocked axis (the kernel's
    input channels) and the scale has ``w``'s rank with ``ceil(w.shape[axis] / block_size)``
    entries on ``axis``: one scale per block and per position on every other axis,
    ``amax(|block|) / (qmax - qmin) * 2`` (integers) or ``amax(|block|) / fmt.max`` (FP8).

    Args:
      w: float weight array (e.g. HWIO conv kernel, ``[in, out]`` dense kernel).
      fmt: target format (usually signed, narrow range), integer or FP8.
      axis: output-channel axis for per-channel scales, the blocked axis with ``block_size``,
        ``None`` for one scale.
      block_size: block length along ``axis`` (>= 1), or None.
      name: the weight's name (e.g. ``"conv1/kernel"``), for error messages.

    Returns:
      ``(scale, zero_point)`` of shape ``[w.shape[axis]]`` (or scalars, or the per-block shape
      above), gradient-stopped; float32 and int32; every scale finite and at most
      :func:`~npujax.numerics.finite.max_scale`. A concrete ``w`` (not traced) is computed in
      numpy, bit for bit as the jnp code runs eagerly, without compiling (see
      ``_host_weight_qparams``).

    Raises:
      QuantizationError: ``block_size`` without an axis, or not a positive int; a concrete
        ``w`` holding NaN or inf (the message names the weight and the channel or block; a
        traced one cannot be checked: ``npujax/numerics/finite.py``).
    """
    if not isinstance(w, jax.core.Tracer):  # a concrete weight: on the host, no compilation
        a = np.asarray(w, np.float32)
        check_finite(a, label("weight", name), axis, block_size=block_size)
        s, z = _host_weight_qparams(a, fmt, axis, block_size)
        return jax.device_put(s), jax.device_put(z)  # (jnp.asarray compiles per shape)
    return _jnp_weight_qparams(w, fmt, axis, block_size)


def _jnp_weight_qparams(w: ArrayLike, fmt: Format, axis: int | None, block_size: int | None
                        ) -> tuple[jax.Array, jax.Array]:
    w = jax.lax.stop_gradient(jnp.asarray(w, jnp.float32))
    if block_size is not None:
        return _block_qparams(w, fmt, axis, block_size)
    if axis is None:
        return qparams_from_range(jnp.min(w), jnp.max(w), fmt, symmetric=True)
    axis = axis % w.ndim
    reduce = tuple(i for i in range(w.ndim) if i != axis)
    return qparams_from_range(jnp.min(w, axis=reduce), jnp.max(w, axis=reduce), fmt, True)


def _check_block(axis: int | None, block_size: int) -> None:
    if axis is None:
        raise QuantizationError(f"block_size={block_size} needs the blocked axis; pass axis=.")
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
        raise QuantizationError(f"block_size must be a positive int, got {block_size!r}.")


def _host_weight_qparams(w: np.ndarray, fmt: Format, axis: int | None,
                         block_size: int | None) -> tuple[np.ndarray, np.ndarray]:
    """:func:`weight_qparams` of a concrete array, in numpy on the host, bit for bit what the
    jnp code computes op by op (eagerly), without compiling one XLA program per weight shape
    (a model's export or conversion compiled ~170 of them).

    The one rounding step is ``amax / d`` (``d = (qmax - qmin) / 2`` or ``fmt.max``). Eager
    XLA divides a scalar (or one-element array) exactly, but rewrites the division of a larger
    array by the broadcast ``d`` into a multiplication by the float32 reciprocal ``1 / d``
    (which differs from the true quotient in the last bit for a few percent of the values), so
    this does the same. Min, max, negation and the clamp to :data:`MIN_SCALE` are exact.
    """
    zero = np.float32(0.0)
    if block_size is not None:  # as _block_qparams: qparams_from_range(-amax, amax)
        a, axis = _abs_blocks(np, w, axis, block_size)
        hi = np.max(a, axis=axis + 1)
        lo = -hi
    else:
        reduce = None if axis is None else tuple(i for i in range(w.ndim) if i != axis % w.ndim)
        lo, hi = np.min(w, axis=reduce), np.max(w, axis=reduce)
    amax = np.maximum(-np.minimum(lo, zero), np.maximum(hi, zero))  # as qparams_from_range
    amax = np.asarray(amax, np.float32)
    if isinstance(fmt, FloatFormat):
        d = np.float32(fmt.max)
    else:
        d = np.float32((fmt.qmax - fmt.qmin) / 2.0)
    q = amax / d if amax.size == 1 else amax * (np.float32(1.0) / d)
    scale = np.clip(q, np.float32(MIN_SCALE), np.float32(max_scale(fmt, True)))
    scale = scale.astype(np.float32)
    mid = 0 if isinstance(fmt, FloatFormat) or fmt.signed else (fmt.qmin + fmt.qmax + 1) // 2
    return scale, np.full(scale.shape, mid, np.int32)


def _abs_blocks(xp, w, axis: int | None, block_size: int):
    """``(|w| with axis split into (blocks, block_size), the axis as a non-negative int)``, the
    last block zero-padded (zeros never raise a block's amax); ``xp`` is numpy or jax.numpy."""
    _check_block(axis, block_size)
    assert axis is not None
    axis %= w.ndim
    n = w.shape[axis]
    nb = -(-n // block_size)
    pad = [(0, nb * block_size - n if i == axis else 0) for i in range(w.ndim)]
    a = xp.abs(xp.pad(w, pad))
    return a.reshape(w.shape[:axis] + (nb, block_size) + w.shape[axis + 1:]), axis


def _block_qparams(w: jax.Array, fmt: Format, axis: int | None, block_size: int):
    a, axis = _abs_blocks(jnp, w, axis, block_size)
    amax = jnp.max(a, axis=axis + 1)
    return qparams_from_range(-amax, amax, fmt, symmetric=True)

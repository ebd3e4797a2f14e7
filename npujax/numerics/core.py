"""quantize / dequantize / fake_quant with ONNX QuantizeLinear-DequantizeLinear semantics.

Forward semantics follow the ONNX operator specification (QuantizeLinear, DequantizeLinear,
opset 21):

    q = saturate(round_half_to_even(x / scale) + zero_point)        # to [qmin, qmax]
    x_hat = (q - zero_point) * scale

``x / scale`` is a true float32 division (as ONNX Runtime computes it), so exact ties
``x / scale = k + 1/2`` round to the even ``k``. For FP8 formats the rounding is to the nearest
representable FP8 value (ties to even) after saturation to ``[-max, max]`` (``saturate=1``).

Granularity, chosen by the shape of ``scale`` / ``zero_point``:

* per-tensor: scalars, ``axis=None``;
* per-channel: 1-D arrays of length ``x.shape[axis]``, any ``axis``;
* per-block: ``block_size=B`` and arrays of ``x``'s rank whose ``axis`` dimension is
  ``ceil(x.shape[axis] / B)`` (ONNX opset-21 blocked quantization); element ``i`` along ``axis``
  uses parameter ``i // B``.

The gradient of :func:`fake_quant` is the straight-through estimator (STE) of Bengio et al. 2013
(arXiv:1308.3432) in the clipped form used for QAT by Jacob et al. 2018 (arXiv:1712.05877):
``d x_hat / d x = 1`` where the rounded value ``round(x/scale) + zero_point`` lies in
``[qmin, qmax]`` (bounds included), ``0`` outside. It is defined with :func:`jax.custom_vjp`, not
by differentiating ``jnp.clip``. The scale and zero point receive zero gradient here (learned step
sizes are :func:`npujax.numerics.lsq_fake_quant`).
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax import lax
from jax.typing import ArrayLike

from npujax.errors import QuantizationError
from npujax.numerics.finite import check_finite, label, saturate
from npujax.numerics.formats import FloatFormat, Format

__all__ = ["quantize", "dequantize", "fake_quant", "broadcast_qparam", "true_divide"]


def broadcast_qparam(
    p: jax.Array, shape: tuple[int, ...], axis: int | None, name: str,
    block_size: int | None = None,
) -> jax.Array:
    """Reshape a per-tensor, per-channel or per-block parameter to broadcast against ``shape``.

    Args:
      p: scalar, ``[shape[axis]]`` (per-channel) or, with ``block_size``, an array of
        ``len(shape)`` dims whose ``axis`` dim is ``ceil(shape[axis] / block_size)``.
      shape: shape of the tensor being quantized.
      axis: channel/block axis, ``None`` for per-tensor.
      name: parameter name for error messages.
      block_size: block length along ``axis`` for per-block parameters.

    Returns:
      ``p`` reshaped (and, per block, repeated) so that it broadcasts against ``shape``.

    Raises:
      QuantizationError: if the parameter's shape does not match the granularity.
    """
    p = jnp.asarray(p)
    ndim = len(shape)
    if axis is None:
        if block_size is not None:
            raise QuantizationError(f"block_size={block_size} needs an axis; pass axis=<int>.")
        if p.ndim != 0:
            raise QuantizationError(
                f"{name} has shape {p.shape} but axis=None (per-tensor) needs a scalar; "
                "pass axis=<channel axis> for per-channel quantization."
            )
        return p
    if not -ndim <= axis < ndim:
        raise QuantizationError(f"axis={axis} is out of range for a {ndim}-D input.")
    axis %= ndim
    if block_size is not None:
        if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
            raise QuantizationError(f"block_size must be a positive int, got {block_size!r}.")
        nb = math.ceil(shape[axis] / block_size)
        want = tuple(nb if i == axis else s for i, s in enumerate(shape))
        if p.shape != want:
            raise QuantizationError(
                f"per-block {name} must have shape {want} (input {tuple(shape)}, axis {axis}, "
                f"block_size {block_size}), got {p.shape}."
            )
        return jnp.repeat(p, block_size, axis=axis, total_repeat_length=nb * block_size)[
            tuple(slice(0, shape[axis]) if i == axis else slice(None) for i in range(ndim))
        ]
    if p.ndim != 1:
        raise QuantizationError(
            f"per-channel {name} must be 1-D (one value per channel), got shape {p.shape}."
        )
    if p.shape[0] != shape[axis]:
        raise QuantizationError(
            f"per-channel {name} has {p.shape[0]} values but input axis {axis} "
            f"has {shape[axis]} channels."
        )
    out = [1] * ndim
    out[axis] = p.shape[0]
    return p.reshape(out)


def _check_float(x: jax.Array) -> None:
    if not jnp.issubdtype(jnp.asarray(x).dtype, jnp.floating):
        raise QuantizationError(
            f"expected a floating-point input, got dtype {jnp.asarray(x).dtype}."
        )


def _check_values(x, scale, zero_point, axis, block_size, name):
    """Refuse concrete NaN inputs and non-finite grids, naming the channel (finite.py)."""
    check_finite(x, label("input", name), axis, allow_inf=True, block_size=None)
    grid_axis = None if block_size is not None or jnp.ndim(scale) == 0 else 0
    check_finite(scale, label("scale", name), grid_axis, positive=True, show_axis=False)
    check_finite(zero_point, label("zero_point", name), grid_axis, show_axis=False)


def true_divide(x: jax.Array, d: ArrayLike) -> jax.Array:
    """``x / d`` correctly rounded (IEEE), elementwise, ``d`` broadcast against ``x``.

    XLA rewrites a division by a broadcast (a per-tensor or per-channel scale) into a
    multiplication by the reciprocal, which differs from ``x / d`` in the last bit for about a
    third of the values -- enough to move a quantized code at a rounding tie. ONNX
    QuantizeLinear and onnxruntime divide, so codes that must match them bit for bit divide by
    the full-shape divisor, hidden from that rewrite by an optimization barrier.
    """
    d = jnp.broadcast_to(jnp.asarray(d, x.dtype), x.shape)
    return x / lax.optimization_barrier(d)


def _scaled(x, scale, zero_point, axis, block_size):
    s = broadcast_qparam(scale, x.shape, axis, "scale", block_size).astype(x.dtype)
    z = broadcast_qparam(zero_point, x.shape, axis, "zero_point", block_size).astype(x.dtype)
    return true_divide(x, s), s, z


def _round(v, fmt: Format, noise):
    """Round ``v`` onto ``fmt``'s grid (before saturation for integers)."""
    if isinstance(fmt, FloatFormat):
        v = jnp.clip(v, -fmt.max, fmt.max)
        return v.astype(fmt.storage_dtype).astype(v.dtype)
    if noise is not None:
        return jnp.floor(v + noise)  # stochastic rounding: P(up) = frac(v)
    return jnp.round(v)  # jnp.round rounds half to even, as ONNX QuantizeLinear requires


def quantize(
    x: jax.Array,
    scale: jax.Array,
    zero_point: jax.Array,
    fmt: Format,
    axis: int | None = None,
    *,
    block_size: int | None = None,
    name: str | None = None,
) -> jax.Array:
    """Quantize floats to codes (ONNX QuantizeLinear): ``saturate(round(x / scale) + zero_point)``.

    Args:
      x: float array of any shape.
      scale: positive float scalar, ``[x.shape[axis]]`` per channel, or per block (see module).
      zero_point: integer-valued, same shape as ``scale``, inside ``[qmin, qmax]``; must be 0 for
        FP8 formats.
      fmt: :class:`IntFormat` or :class:`FloatFormat` of the codes.
      axis: channel/block axis, ``None`` for per-tensor.
      block_size: block length along ``axis`` for per-block parameters.
      name: the tensor's name, for error messages.

    Returns:
      Codes of ``fmt.storage_dtype`` (int8/uint8/int16/uint16 or float8), same shape as ``x``.
      Sub-byte integer codes (e.g. int4) are stored in int8/uint8 within ``[qmin, qmax]``.

    Raises:
      QuantizationError: if ``x`` is not floating point or parameter shapes do not match; a
        concrete ``x`` holding NaN, or a concrete scale that is not finite and > 0, or zero
        point that is not finite (``npujax/numerics/finite.py``; +-inf inputs saturate).

    Examples:
      >>> quantize(jnp.array([0.25, 0.75, 10.0]), 0.5, 0, IntFormat(8))
      Array([0, 2, 20], dtype=int8)

    References:
      ONNX QuantizeLinear (opset 21); Jacob et al. 2018, arXiv:1712.05877.
    """
    _check_float(x)
    _check_values(x, scale, zero_point, axis, block_size, name)
    x = jnp.asarray(x)
    v, _, z = _scaled(x, scale, zero_point, axis, block_size)
    if isinstance(fmt, FloatFormat):
        return (_round(v, fmt, None) + z).astype(fmt.storage_dtype)
    return jnp.clip(jnp.round(v) + z, fmt.qmin, fmt.qmax).astype(fmt.storage_dtype)


def dequantize(
    q: jax.Array,
    scale: jax.Array,
    zero_point: jax.Array,
    axis: int | None = None,
    *,
    block_size: int | None = None,
) -> jax.Array:
    """Map codes back to float32 (ONNX DequantizeLinear): ``(q - zero_point) * scale``.

    Args:
      q: integer or float8 codes of any shape.
      scale: float32 scalar, per-channel ``[q.shape[axis]]`` or per-block array.
      zero_point: same shape as ``scale``.
      axis: channel/block axis, ``None`` for per-tensor.
      block_size: block length along ``axis`` for per-block parameters.

    Returns:
      float32 array with the shape of ``q``.
    """
    q = jnp.asarray(q)
    s = broadcast_qparam(scale, q.shape, axis, "scale", block_size).astype(jnp.float32)
    if jnp.issubdtype(q.dtype, jnp.integer):
        z = broadcast_qparam(zero_point, q.shape, axis, "zero_point", block_size)
        return (q.astype(jnp.int32) - z.astype(jnp.int32)).astype(jnp.float32) * s
    z = broadcast_qparam(zero_point, q.shape, axis, "zero_point", block_size)
    return (q.astype(jnp.float32) - z.astype(jnp.float32)) * s


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5, 6))
def _fake_quant(x, scale, zero_point, noise, fmt, axis, block_size):
    return _fake_quant_fwd(x, scale, zero_point, noise, fmt, axis, block_size)[0]


def _fake_quant_fwd(x, scale, zero_point, noise, fmt, axis, block_size):
    v, s, z = _scaled(x, scale, zero_point, axis, block_size)
    if isinstance(fmt, FloatFormat):
        inside = jnp.abs(v) <= fmt.max
        out = _round(v, fmt, None) * s
    else:
        r = _round(v, fmt, noise) + z
        inside = (r >= fmt.qmin) & (r <= fmt.qmax)
        out = (jnp.clip(r, fmt.qmin, fmt.qmax) - z) * s
    # a grid a given scale stretches past the float range saturates (npujax/numerics/finite.py)
    return saturate(out), (inside, scale, zero_point, noise)


def _fake_quant_bwd(fmt, axis, block_size, res, g):
    inside, scale, zero_point, noise = res
    return (
        jnp.where(inside, g, jnp.zeros_like(g)),
        jnp.zeros_like(scale),
        jnp.zeros_like(zero_point),
        None if noise is None else jnp.zeros_like(noise),
    )


_fake_quant.defvjp(_fake_quant_fwd, _fake_quant_bwd)


def fake_quant(
    x: jax.Array,
    scale: jax.Array,
    zero_point: jax.Array,
    fmt: Format,
    axis: int | None = None,
    *,
    block_size: int | None = None,
    key: jax.Array | None = None,
    name: str | None = None,
) -> jax.Array:
    """Quantize then dequantize in float (simulated quantization) with a straight-through gradient.

    ``x_hat = (saturate(round(x / scale) + zero_point) - zero_point) * scale``, equal to
    ``dequantize(quantize(x, ...), ...)`` computed in ``x.dtype``. With ``key`` the rounding is
    stochastic, ``floor(x / scale + u)`` with ``u ~ U[0, 1)``, so ``E[x_hat] = x`` inside the range
    (Gupta et al. 2015). Gradient (STE, see module docstring): 1 where the rounded value lies in
    ``[qmin, qmax]`` (bounds included; for FP8 where ``|x / scale| <= max``), 0 outside; zero for
    ``scale`` and ``zero_point``.

    Args:
      x: float array of any shape.
      scale: positive float scalar, per-channel ``[x.shape[axis]]`` array, or per-block array.
      zero_point: integer-valued, same shape as ``scale`` (any numeric dtype); 0 for FP8.
      fmt: the simulated :class:`IntFormat` or :class:`FloatFormat`.
      axis: channel/block axis, ``None`` for per-tensor.
      block_size: block length along ``axis`` for per-block parameters.
      key: a ``jax.random`` key for stochastic rounding (integer formats only); None rounds to
        nearest, ties to even.
      name: the tensor's name, for error messages.

    Returns:
      Array of ``x``'s shape and dtype whose values lie on the grid ``scale * (k - zero_point)``,
      saturated to the dtype's finite range (a finite ``x`` never gives inf or NaN; ``+-inf``
      saturates to the grid's ends).

    Raises:
      QuantizationError: if ``x`` is not floating point, parameter shapes do not match, or
        stochastic rounding is asked of an FP8 format; a concrete (not traced) ``x`` holding
        NaN, scale that is not finite and > 0, or zero point that is not finite (the message
        names the channel; inside ``jit`` nothing can be checked: ``npujax/numerics/
        finite.py``).

    References:
      ONNX QuantizeLinear/DequantizeLinear; Jacob et al. 2018, arXiv:1712.05877; Gupta et al.
      2015, "Deep Learning with Limited Numerical Precision", arXiv:1502.02551.
    """
    _check_float(x)
    _check_values(x, scale, zero_point, axis, block_size, name)
    x = jnp.asarray(x)
    zero_point = jnp.asarray(zero_point)
    if not jnp.issubdtype(zero_point.dtype, jnp.floating):
        zero_point = zero_point.astype(x.dtype)
    noise = None
    if key is not None:
        if isinstance(fmt, FloatFormat):
            raise QuantizationError(
                f"stochastic rounding is implemented for integer formats, not {fmt}; "
                "drop key= for FP8."
            )
        noise = jax.random.uniform(key, x.shape, x.dtype)
    return _fake_quant(x, jnp.asarray(scale, x.dtype), zero_point, noise, fmt, axis, block_size)

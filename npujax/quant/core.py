"""quantize / dequantize / fake_quant with ONNX QuantizeLinear-DequantizeLinear semantics.

Forward semantics follow the ONNX operator specification (QuantizeLinear, DequantizeLinear,
opset 13+):

    q = saturate(round_half_to_even(x / scale) + zero_point)        # to [qmin, qmax]
    x_hat = (q - zero_point) * scale

``scale`` and ``zero_point`` are scalars (per-tensor) or 1-D arrays of length ``x.shape[axis]``
(per-channel along ``axis``).

The gradient of :func:`fake_quant` is the straight-through estimator (STE) of Bengio et al. 2013
("Estimating or Propagating Gradients Through Stochastic Neurons", arXiv:1308.3432) in the clipped
form used for QAT by Jacob et al. 2018 (arXiv:1712.05877): ``d x_hat / d x = 1`` where the rounded
value ``round(x/scale) + zero_point`` lies in ``[qmin, qmax]`` (bounds included), ``0`` outside.
It is defined with :func:`jax.custom_vjp`, not by differentiating ``jnp.clip``. The scale and zero
point receive zero gradient here (learned step sizes are LSQ, a separate operator).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from npujax.errors import QuantizationError
from npujax.quant.formats import IntFormat

__all__ = ["quantize", "dequantize", "fake_quant"]


def _broadcast_param(p: jax.Array, ndim: int, axis: int | None, name: str) -> jax.Array:
    """Reshape a per-tensor or per-channel parameter so it broadcasts against an ``ndim`` array."""
    p = jnp.asarray(p)
    if axis is None:
        if p.ndim != 0:
            raise QuantizationError(
                f"{name} has shape {p.shape} but axis=None (per-tensor) needs a scalar; "
                "pass axis=<channel axis> for per-channel quantization."
            )
        return p
    if p.ndim != 1:
        raise QuantizationError(
            f"per-channel {name} must be 1-D (one value per channel), got shape {p.shape}."
        )
    if not -ndim <= axis < ndim:
        raise QuantizationError(f"axis={axis} is out of range for a {ndim}-D input.")
    shape = [1] * ndim
    shape[axis] = p.shape[0]
    return p.reshape(shape)


def _check(x: jax.Array, scale: jax.Array, axis: int | None) -> None:
    x = jnp.asarray(x)
    if not jnp.issubdtype(x.dtype, jnp.floating):
        raise QuantizationError(f"expected a floating-point input, got dtype {x.dtype}.")
    if axis is not None:
        ax = axis % x.ndim if x.ndim else axis
        if jnp.ndim(scale) == 1 and jnp.shape(scale)[0] != x.shape[ax]:
            raise QuantizationError(
                f"per-channel scale has {jnp.shape(scale)[0]} values but input axis {axis} "
                f"has {x.shape[ax]} channels."
            )


def _rounded(x, scale, zero_point, axis):
    s = _broadcast_param(scale, x.ndim, axis, "scale").astype(x.dtype)
    z = _broadcast_param(zero_point, x.ndim, axis, "zero_point").astype(x.dtype)
    # jnp.round rounds half to even, as ONNX QuantizeLinear requires.
    return jnp.round(x / s) + z, s, z


def quantize(
    x: jax.Array,
    scale: jax.Array,
    zero_point: jax.Array,
    fmt: IntFormat,
    axis: int | None = None,
) -> jax.Array:
    """Quantize floats to integer codes (ONNX QuantizeLinear).

    Args:
      x: float array of any shape.
      scale: positive float32 scalar, or shape ``[x.shape[axis]]`` for per-channel.
      zero_point: integer-valued scalar or ``[x.shape[axis]]`` array, inside ``[qmin, qmax]``.
      fmt: the integer format of the codes.
      axis: channel axis for per-channel parameters, ``None`` for per-tensor.

    Returns:
      Integer codes of ``fmt.storage_dtype`` (int8/uint8/int16/uint16), same shape as ``x``.

    Raises:
      QuantizationError: if ``x`` is not floating point or parameter shapes do not match.

    Example:
      >>> quantize(jnp.array([0.25, 0.75, 10.0]), 0.5, 0, IntFormat(8))
      Array([0, 2, 20], dtype=int8)
    """
    _check(x, scale, axis)
    v, _, _ = _rounded(jnp.asarray(x), scale, zero_point, axis)
    return jnp.clip(v, fmt.qmin, fmt.qmax).astype(fmt.storage_dtype)


def dequantize(
    q: jax.Array, scale: jax.Array, zero_point: jax.Array, axis: int | None = None
) -> jax.Array:
    """Map integer codes back to float32 (ONNX DequantizeLinear): ``(q - zero_point) * scale``.

    Args:
      q: integer codes of any shape and integer dtype.
      scale: float32 scalar or per-channel ``[q.shape[axis]]`` array.
      zero_point: integer scalar or per-channel array.
      axis: channel axis for per-channel parameters, ``None`` for per-tensor.

    Returns:
      float32 array with the shape of ``q``.
    """
    q = jnp.asarray(q)
    s = _broadcast_param(scale, q.ndim, axis, "scale").astype(jnp.float32)
    z = _broadcast_param(zero_point, q.ndim, axis, "zero_point").astype(jnp.int32)
    return (q.astype(jnp.int32) - z).astype(jnp.float32) * s


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def _fake_quant(x, scale, zero_point, fmt, axis):
    v, s, z = _rounded(x, scale, zero_point, axis)
    return (jnp.clip(v, fmt.qmin, fmt.qmax) - z) * s


def _fake_quant_fwd(x, scale, zero_point, fmt, axis):
    v, s, z = _rounded(x, scale, zero_point, axis)
    inside = (v >= fmt.qmin) & (v <= fmt.qmax)
    out = (jnp.clip(v, fmt.qmin, fmt.qmax) - z) * s
    return out, (inside, scale, zero_point)


def _fake_quant_bwd(fmt, axis, res, g):
    inside, scale, zero_point = res
    return (
        jnp.where(inside, g, jnp.zeros_like(g)),
        jnp.zeros_like(scale),
        jnp.zeros_like(zero_point),
    )


_fake_quant.defvjp(_fake_quant_fwd, _fake_quant_bwd)


def fake_quant(
    x: jax.Array,
    scale: jax.Array,
    zero_point: jax.Array,
    fmt: IntFormat,
    axis: int | None = None,
) -> jax.Array:
    """Quantize then dequantize in float (simulated quantization) with a straight-through gradient.

    Equal to ``dequantize(quantize(x, scale, zero_point, fmt, axis), scale, zero_point, axis)``
    computed in ``x.dtype``. Gradient (STE, see module docstring): 1 where the rounded value lies in
    ``[fmt.qmin, fmt.qmax]`` (bounds included), 0 outside; zero for ``scale`` and ``zero_point``.

    Args:
      x: float array of any shape.
      scale: positive float scalar or per-channel ``[x.shape[axis]]`` array.
      zero_point: integer-valued scalar or per-channel array (any numeric dtype).
      fmt: the simulated integer format.
      axis: channel axis for per-channel parameters, ``None`` for per-tensor.

    Returns:
      Array of ``x``'s shape and dtype whose values lie on the grid ``scale * (k - zero_point)``.

    Raises:
      QuantizationError: if ``x`` is not floating point or parameter shapes do not match.

    References:
      ONNX QuantizeLinear/DequantizeLinear; Jacob et al. 2018, arXiv:1712.05877.
    """
    _check(x, scale, axis)
    x = jnp.asarray(x)
    zero_point = jnp.asarray(zero_point)
    if not jnp.issubdtype(zero_point.dtype, jnp.floating):
        zero_point = zero_point.astype(x.dtype)
    return _fake_quant(x, jnp.asarray(scale, x.dtype), zero_point, fmt, axis)

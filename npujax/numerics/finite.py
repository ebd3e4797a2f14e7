"""Finite in, finite out: the checks and bounds that keep quantization grids finite.

Two rules, for every function of :mod:`npujax.numerics`:

* **A non-finite value is refused where it is known.** A NaN or inf in a weight makes its
  channel's scale NaN or inf and every output of the channel NaN, silently. A concrete (eager)
  value that defines a grid -- a weight, a range's minimum or maximum, an LSQ step's data, a
  given scale, step or zero point -- and a NaN input to be quantized raise
  :class:`~npujax.errors.QuantizationError` naming the tensor and the channel (or element) of
  the first bad value (:func:`check_finite`). Inside ``jit`` the values are not known and
  nothing can be raised: a NaN there propagates. npujax's graph-level entry points
  (``calibrate``, QAT's ``train_graph``, ``convert``) check every weight eagerly before they
  trace (``npujax.quantize.weights.check_weights``) and calibration refuses non-finite
  activations (``npujax.calib.check_finite_state``), so their traced grids are finite.
  ``+-inf`` *inputs* to :func:`~npujax.numerics.fake_quant` saturate to the grid's ends, as
  ONNX QuantizeLinear saturates.
* **No finite input gives a non-finite output.** A scale computed from finite values is at
  most :func:`max_scale`, the largest float32 scale whose every code ``(q - zero_point) x
  scale`` is finite (a symmetric int2 grid of a range near the float32 maximum reached ``-2 x
  scale``, -inf; an asymmetric range wider than the float32 maximum overflowed ``max - min``,
  a NaN scale). Values beyond the clamped grid saturate. Fake-quant outputs are saturated to
  the float type's finite range, so a finite but too large given scale or LSQ step saturates
  too.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike

from npujax.errors import QuantizationError
from npujax.numerics.formats import FloatFormat, Format

__all__ = ["FLOAT32_MAX", "max_scale", "scale_bound", "saturate", "check_finite", "is_concrete",
           "label"]

#: The largest finite float32.
FLOAT32_MAX = float(np.finfo(np.float32).max)


def max_scale(fmt: Format, symmetric: bool) -> float:
    """The largest float32 scale whose every code dequantizes to a finite float32.

    ``m x scale <= FLOAT32_MAX`` for ``m`` the largest ``|q - zero_point|`` of the grid:
    ``fmt.max`` (FP8), the distance from the middle code to the farther end (symmetric), or
    ``qmax - qmin`` (asymmetric: its zero point may be any code).
    """
    if isinstance(fmt, FloatFormat):
        return scale_bound(float(fmt.max))
    if symmetric:
        mid = 0 if fmt.signed else (fmt.qmin + fmt.qmax + 1) // 2
        return scale_bound(max(mid - fmt.qmin, fmt.qmax - mid))
    return scale_bound(fmt.qmax - fmt.qmin)


def scale_bound(m: float) -> float:
    """The largest float32 ``s`` with ``m x s <= FLOAT32_MAX`` (``m`` a code's largest
    ``|q - zero_point|``, >= 1)."""
    s = np.float32(FLOAT32_MAX / m)
    while float(s) * m > FLOAT32_MAX:  # exact in float64 (24 + 17 bits)
        s = np.nextafter(s, np.float32(0.0))
    return float(s)


def saturate(x: jax.Array) -> jax.Array:
    """``x`` clipped to its float type's finite range (NaN stays NaN)."""
    big = float(jnp.finfo(x.dtype).max)
    return jnp.clip(x, -big, big)


def label(role: str, name: str | None) -> str:
    """``role`` or ``role 'name'``, for messages (``weight 'conv1/kernel'``)."""
    return role if name is None else f"{role} {name!r}"


def is_concrete(x: ArrayLike) -> bool:
    """Whether ``x``'s values are known (not traced under ``jit``/``grad``/``vmap``)."""
    return not isinstance(x, jax.core.Tracer)


def check_finite(x: ArrayLike, name: str, axis: int | None = None, *,
                 block_size: int | None = None, allow_inf: bool = False,
                 positive: bool = False, show_axis: bool = True) -> None:
    """Refuse a concrete ``x`` holding NaN or inf (or a value <= 0 with ``positive``).

    A traced ``x`` is not checked (its values are not known; see the module docstring).

    Args:
      x: the array.
      name: what it is, for the message (``"weight 'conv1/kernel'"``, ``"scale"``).
      axis: its channel axis (the message names the channel), or None (the element).
      block_size: with ``axis``, the block length along it (the message names the block).
      allow_inf: refuse only NaN (inputs to be quantized: +-inf saturate).
      positive: also refuse values <= 0 (scales, steps).
      show_axis: name the axis with the channel (not for a ``[C]`` per-channel parameter).

    Raises:
      QuantizationError: naming ``name``, the count, the first bad value and where it is.
    """
    if not is_concrete(x):
        return
    a = np.asarray(x)
    if not np.issubdtype(a.dtype, np.floating) or a.size == 0:
        return
    bad = np.isnan(a) if allow_inf else ~np.isfinite(a)
    rule = "NaN" if allow_inf else "NaN or inf"
    if positive:
        bad |= ~(a > 0)
        rule += " or <= 0"
    if not bad.any():
        return
    index = tuple(int(i) for i in np.argwhere(bad)[0])
    if axis is None or a.ndim == 0:
        where = f"element {index}" if a.ndim else "its value"
    elif block_size is not None:
        where = f"block {index[axis] // block_size} along axis {axis} (element {index})"
    else:
        where = f"channel {index[axis]}" + (f" (axis {axis})" if show_axis else "")
    raise QuantizationError(
        f"{name} holds {int(bad.sum())} value(s) that are {rule} (first: {a[index]} at "
        f"{where}); quantization needs finite values: a NaN or inf makes the scale and every "
        "output of its channel NaN. Fix or retrain the model, or clean the data.")

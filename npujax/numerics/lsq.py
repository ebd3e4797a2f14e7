"""Learned step size quantization: LSQ (Esser et al. 2020) and LSQ+ (Bhalgat et al. 2020).

Forward, with ``Q_n = -qmin`` and ``Q_p = qmax`` of the format, step ``s`` and offset ``beta``
(LSQ+; ``beta = 0`` gives LSQ):

    v = (x - beta) / s
    x_hat = clip(round(v), -Q_n, Q_p) * s + beta          # round half to even

Backward (``custom_vjp``; ``g`` is the gradient scale):

* ``d x_hat / d x    = 1`` if ``-Q_n < v < Q_p`` else ``0``                         (STE)
* ``d x_hat / d s    = g * (round(v) - v)`` if ``-Q_n < v < Q_p``, ``g * (-Q_n)`` if
  ``v <= -Q_n``, ``g * Q_p`` if ``v >= Q_p``
* ``d x_hat / d beta = 0`` inside, ``g * 1`` where ``v <= -Q_n`` or ``v >= Q_p``

(the conditions are on the unrounded ``v``, exactly as in the papers; :func:`fake_quant`'s STE
instead tests the rounded value, as ONNX-style QAT does).

``g = 1 / sqrt(N * Q_p)`` by default, ``N`` the number of elements of ``x`` (weights: the weight
count; activations: pass ``grad_scale`` for the features per step if you want the paper's
per-layer choice). The step actually used is ``max(s, MIN_SCALE)``, so it can never be <= 0
whatever the optimizer does to the stored parameter; the gradient still reaches ``s`` when the
clamp is active, so a step pushed too low can recover.

References:
  Esser et al. 2020, "Learned Step Size Quantization", arXiv:1902.08153 (eq. 3, section 2.2).
  Bhalgat et al. 2020, "LSQ+: Improving low-bit quantization through learnable offsets and
  better initialization", arXiv:2004.09576 (eq. 4-6).
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp

from npujax.errors import QuantizationError
from npujax.numerics.core import broadcast_qparam, true_divide
from npujax.numerics.finite import check_finite, label, saturate, scale_bound
from npujax.numerics.formats import IntFormat
from npujax.numerics.qparams import MIN_SCALE

__all__ = ["lsq_fake_quant", "lsq_init_step"]


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def _lsq(x, step, offset, fmt, grad_scale):
    return _lsq_fwd(x, step, offset, fmt, grad_scale)[0]


def _lsq_fwd(x, step, offset, fmt, grad_scale):
    s = jnp.maximum(step, MIN_SCALE)
    # a true division: XLA's reciprocal of a step above 2**126 is a subnormal, flushed to 0
    v = true_divide(x - offset, s)
    r = jnp.round(v)
    below, above = v <= fmt.qmin, v >= fmt.qmax  # the papers' conditions, on v
    out = saturate(jnp.clip(r, fmt.qmin, fmt.qmax) * s + offset)  # finite (finite.py)
    return out, (v, r, below, above, step, offset)


def _sum_to(g, like):
    """Reduce a broadcast gradient back to the parameter's shape."""
    like = jnp.asarray(like)
    if like.ndim == 0:
        return jnp.sum(g).astype(like.dtype)
    axes = tuple(i for i in range(g.ndim) if like.shape[i] == 1 and g.shape[i] != 1)
    return jnp.sum(g, axis=axes, keepdims=True).astype(like.dtype)


def _lsq_bwd(fmt, grad_scale, res, g):
    v, r, below, above, step, offset = res
    inside = ~(below | above)
    zero = jnp.zeros_like(g)
    dx = jnp.where(inside, g, zero)
    ds_elem = jnp.where(below, float(fmt.qmin), jnp.where(above, float(fmt.qmax), r - v))
    dstep = _sum_to(g * ds_elem * grad_scale, step)
    doff = _sum_to(jnp.where(inside, zero, g) * grad_scale, offset)
    return dx, dstep, doff


_lsq.defvjp(_lsq_fwd, _lsq_bwd)


def lsq_fake_quant(
    x: jax.Array,
    step: jax.Array,
    fmt: IntFormat,
    grad_scale: float | None = None,
    *,
    offset: jax.Array | None = None,
    axis: int | None = None,
) -> jax.Array:
    """Fake-quantize with a learned step (LSQ) and optionally a learned offset (LSQ+).

    ``x_hat = clip(round((x - offset) / step), qmin, qmax) * step + offset``; gradients as in the
    module docstring (the papers' straight-through estimator for ``x``, their step and offset
    gradients, scaled by ``grad_scale``).

    Args:
      x: float array of any shape (weights or activations).
      step: positive float32 scalar, or ``[x.shape[axis]]`` per channel.
      fmt: the integer format (``Q_n = -qmin``, ``Q_p = qmax``; unsigned formats: ``Q_n = 0``).
      grad_scale: scale of the step/offset gradients; default ``1 / sqrt(x.size * Q_p)``.
      offset: LSQ+ learnable offset ``beta`` (float, same shape as ``step``); None for LSQ.
      axis: channel axis for per-channel ``step``/``offset``; None for per-tensor.

    Returns:
      ``x``'s shape and dtype, on the grid ``step * k + offset``.

    Raises:
      QuantizationError: if ``x`` is not floating point, ``fmt`` is not an IntFormat, or the
        step's shape does not match ``axis``; a concrete step or offset that is not finite, or
        a concrete ``x`` holding NaN (``npujax/numerics/finite.py``; outputs are saturated to
        the float range, so finite values never give inf).

    References:
      Esser et al. 2020, arXiv:1902.08153; Bhalgat et al. 2020, arXiv:2004.09576.
    """
    check_finite(x, "input", axis, allow_inf=True)
    param_axis = None if jnp.ndim(step) == 0 else 0
    check_finite(step, "step", param_axis, show_axis=False)
    if offset is not None:
        check_finite(offset, "offset", None if jnp.ndim(offset) == 0 else 0, show_axis=False)
    x = jnp.asarray(x)
    if not jnp.issubdtype(x.dtype, jnp.floating):
        raise QuantizationError(f"lsq_fake_quant needs a floating-point input, got {x.dtype}.")
    if not isinstance(fmt, IntFormat):
        raise QuantizationError(f"LSQ learns an integer grid; got format {fmt}. Use IntFormat.")
    if grad_scale is None:
        grad_scale = 1.0 / math.sqrt(max(x.size, 1) * max(fmt.qmax, 1))
    step = broadcast_qparam(jnp.asarray(step, x.dtype), x.shape, axis, "step")
    off = jnp.zeros_like(step) if offset is None else broadcast_qparam(
        jnp.asarray(offset, x.dtype), x.shape, axis, "offset")
    return _lsq(x, step, off, fmt, float(grad_scale))


def lsq_init_step(x: jax.Array, fmt: IntFormat, axis: int | None = None, *,
                  name: str | None = None) -> jax.Array:
    """LSQ's initial step ``2 * mean(|x|) / sqrt(Q_p)`` (per tensor, or per channel on ``axis``).

    Args:
      x: float array (weights, or a first activation batch).
      fmt: the integer format.
      axis: channel axis for a per-channel step.
      name: the tensor's name, for error messages.

    Returns:
      float32 step, scalar or ``[x.shape[axis]]``, at least ``MIN_SCALE`` and at most the
      largest step whose every code is a finite float32 (the mean is taken of ``|x| / 2**64``,
      so a sum of values near the float32 maximum does not overflow).

    Raises:
      QuantizationError: a concrete ``x`` holding NaN or inf (the message names the channel).

    References:
      Esser et al. 2020, arXiv:1902.08153, section 2.1.
    """
    check_finite(x, label("input", name), axis)
    x = jnp.abs(jnp.asarray(x, jnp.float32))
    axes = None if axis is None else tuple(i for i in range(x.ndim) if i != axis % x.ndim)
    mean = jnp.mean(x * 2.0**-64, axis=axes) * 2.0**64  # (powers of two: exact)
    top = scale_bound(max(-fmt.qmin, fmt.qmax, 1))
    return jnp.clip(2.0 * mean / math.sqrt(max(fmt.qmax, 1)), MIN_SCALE, top)

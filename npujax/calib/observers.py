"""Range observers as (init, update) pairs of pure functions over batches.

An observer's state is a pytree ``{"min": f32[...], "max": f32[...]}`` (scalars per-tensor, or one
value per channel), so observers run under ``jit`` and compose like optax transformations. The
scale and zero point follow from the state with :func:`npujax.numerics.qparams_from_range`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from npujax.errors import CalibrationError

__all__ = ["Observer", "ObserverState", "minmax_observer", "ema_minmax_observer",
           "mean_minmax_observer", "check_finite_state", "reduce_axes"]

ObserverState = dict[str, jax.Array]


def _state_range(state: ObserverState, fmt: Any = None, symmetric: bool = False):
    """The observed ``(min, max)`` as stored in the state (min-max style observers)."""
    return state["min"], state["max"]


class Observer(NamedTuple):
    """A calibration observer: ``state = init(x)``; ``state = update(state, x)`` per batch.

    ``init`` uses only ``x``'s shape (no statistics are taken from it); ``update`` folds one
    batch into the state. Both are pure and jit-able. ``compute_range(state, fmt, symmetric)``
    turns the final state into the clipping range ``(min, max)`` for a target format (min-max
    observers return the stored extremes; histogram observers choose a clipping range, e.g. the
    one that minimises the quantization MSE for ``fmt``). Every state holds ``"min"`` and
    ``"max"``, so :func:`check_finite_state` applies to all observers.
    """

    init: Callable[[jax.Array], ObserverState]
    update: Callable[[ObserverState, jax.Array], ObserverState]
    compute_range: Callable[..., tuple[jax.Array, jax.Array]] = _state_range


def reduce_axes(x: jax.Array, axis: int | None) -> tuple[int, ...]:
    if axis is None:
        return tuple(range(x.ndim))
    if not -x.ndim <= axis < x.ndim:
        raise CalibrationError(f"observer axis={axis} is out of range for a {x.ndim}-D tensor.")
    axis %= x.ndim
    return tuple(i for i in range(x.ndim) if i != axis)


def _init(axis: int | None) -> Callable[[jax.Array], ObserverState]:
    def init(x: jax.Array) -> ObserverState:
        shape = () if axis is None else (jnp.shape(x)[axis],)
        return {
            "min": jnp.full(shape, jnp.inf, jnp.float32),
            "max": jnp.full(shape, -jnp.inf, jnp.float32),
        }

    return init


def minmax_observer(axis: int | None = None) -> Observer:
    """Running minimum and maximum over all batches (TensorRT/PyTorch "MinMax" calibration).

    Args:
      axis: channel axis for per-channel ranges; ``None`` for per-tensor.

    Returns:
      An :class:`Observer`. Its state after ``update`` holds the elementwise min/max seen so far
      (``+inf``/``-inf`` before any update).
    """

    def update(state: ObserverState, x: jax.Array) -> ObserverState:
        x = jnp.asarray(x, jnp.float32)
        axes = reduce_axes(x, axis)
        return {
            "min": jnp.minimum(state["min"], jnp.min(x, axis=axes)),
            "max": jnp.maximum(state["max"], jnp.max(x, axis=axes)),
        }

    return Observer(_init(axis), update)


def ema_minmax_observer(decay: float = 0.99, axis: int | None = None) -> Observer:
    """Exponential moving average of per-batch min/max (TF QAT's moving-average ranges).

    ``m <- decay * m + (1 - decay) * batch_min`` (the first batch initialises the average).

    Args:
      decay: averaging constant in ``[0, 1)``.
      axis: channel axis for per-channel ranges; ``None`` for per-tensor.

    Raises:
      CalibrationError: if ``decay`` is outside ``[0, 1)``.

    References:
      Jacob et al. 2018, arXiv:1712.05877, section 3.1.
    """
    if not 0.0 <= decay < 1.0:
        raise CalibrationError(f"EMA decay must be in [0, 1), got {decay}.")

    def update(state: ObserverState, x: jax.Array) -> ObserverState:
        x = jnp.asarray(x, jnp.float32)
        axes = reduce_axes(x, axis)
        lo, hi = jnp.min(x, axis=axes), jnp.max(x, axis=axes)
        first = jnp.isinf(state["min"])
        return {
            "min": jnp.where(first, lo, decay * state["min"] + (1 - decay) * lo),
            "max": jnp.where(first, hi, decay * state["max"] + (1 - decay) * hi),
        }

    return Observer(_init(axis), update)


def mean_minmax_observer(axis: int | None = None) -> Observer:
    """The mean over examples of each example's minimum and maximum (NNCF's ``MEAN_MINMAX``).

    Each example (index of axis 0, the batch) contributes its own min and max (over its other
    axes, or per channel along ``axis``); the range is their average over all examples seen,
    so it does not depend on how the examples are batched. One outlier example moves the
    range by ``1/n`` of its excess, not all the way as with :func:`minmax_observer`: the
    activation range NNCF's post-training quantization uses by default for per-tensor
    activations (weights keep min-max).

    Args:
      axis: channel axis for per-channel ranges (not 0, the batch); ``None`` for per-tensor.

    Returns:
      An :class:`Observer`. Its state holds the running sums of the per-example extremes
      (``"sum_min"``, ``"sum_max"``), the example count ``"n"``, and ``"min"``/``"max"``: the
      current averages (``+inf``/``-inf`` before any update).

    Raises:
      CalibrationError: ``axis`` 0 (the batch), or a batch without a batch axis (a scalar).

    References:
      NNCF, ``nncf.quantization.range_estimator.RangeEstimatorParametersSet.MEAN_MINMAX`` and
      ``MinMaxQuantization._get_range_estimator_parameters`` (per-tensor activations; NNCF
      3.4.0); OpenVINO POT's default ``mean`` of ``min``/``max`` activation statistics.
    """
    if axis == 0:
        raise CalibrationError("mean_minmax_observer: axis 0 is the batch (examples are "
                               "averaged over it); pass the channel axis, e.g. -1.")

    def init(x: jax.Array) -> ObserverState:
        shape = () if axis is None else (jnp.shape(x)[axis],)
        return {"min": jnp.full(shape, jnp.inf, jnp.float32),
                "max": jnp.full(shape, -jnp.inf, jnp.float32),
                "sum_min": jnp.zeros(shape, jnp.float32),
                "sum_max": jnp.zeros(shape, jnp.float32),
                "n": jnp.zeros((), jnp.float32)}

    def update(state: ObserverState, x: jax.Array) -> ObserverState:
        x = jnp.asarray(x, jnp.float32)
        if x.ndim < 1:
            raise CalibrationError("mean_minmax_observer needs batched tensors (axis 0 = "
                                   "examples); got a scalar.")
        keep = {0} if axis is None else {0, axis % x.ndim}
        axes = tuple(i for i in range(x.ndim) if i not in keep)
        lo, hi = jnp.min(x, axis=axes), jnp.max(x, axis=axes)  # [batch] or [batch, C]
        n = state["n"] + x.shape[0]
        s_lo, s_hi = state["sum_min"] + jnp.sum(lo, 0), state["sum_max"] + jnp.sum(hi, 0)
        return {"min": s_lo / n, "max": s_hi / n, "sum_min": s_lo, "sum_max": s_hi, "n": n}

    return Observer(init, update)


def check_finite_state(state: Any, layer: str) -> None:
    """Raise :class:`CalibrationError` naming ``layer`` if an observed range holds NaN or inf.

    Called on the host after each calibration batch, so the error names the first layer and batch
    whose data was bad instead of producing NaN scales later.
    """
    for key in ("min", "max"):
        v = np.asarray(jax.device_get(state[key]))  # on the host: no program per shape
        if not np.all(np.isfinite(v)):
            raise CalibrationError(
                f"calibration data reaching layer {layer!r} contains NaN or inf "
                f"(observed {key}={v}); clean the calibration set or check the layer's input."
            )

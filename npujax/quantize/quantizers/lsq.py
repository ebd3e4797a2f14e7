"""Learned step size quantization in the model flow: LSQ (Esser et al. 2020) and LSQ+ (Bhalgat
et al. 2020).

The learned values are the layer's state, trained by QAT next to the weights:

=================  ===============  ==========================================================
field              shape, dtype     meaning
=================  ===============  ==========================================================
``act_scale``      f32[]            activation step ``s`` (learned)
``act_zero_point`` i32[]            calibrated integer zero point ``z`` (fixed; the LSQ grid is
                                    ``(clip(round(x / s) + z, qmin, qmax) - z) * s``)
``act_offset``     f32[]            LSQ+ only: learned offset ``beta``, initialised to
                                    ``-z * s`` (the calibrated grid)
``weight_step``    f32[C_out] / []  weight step per output channel (per tensor when
                                    ``weight_per_channel=False``), zero point 0 (learned)
``operand_scale``  f32[]            a GEMM of two activations (attention's ``Q K^T``,
                                    ``P V``): the second operand's step (learned), from its
                                    calibrated grid
``operand_zero_``  i32[]            its calibrated zero point (fixed; 0 for a signed operand)
``point``
=================  ===============  ==========================================================

Attention operands: both operands of a GEMM of two activations learn their steps as an
activation does (the first through ``act_scale``, the second through ``operand_scale``; gradient
scale ``1 / sqrt(features per sample * Q_p)``), as in the LSQ-quantized transformers of Q-ViT
(Li et al. 2022, arXiv:2210.06707). An operand with a fixed range (a softmax output's [0, 1],
``LayerQuant.act_range`` / ``operand_range``) keeps its fixed grid: its step gets no gradient
(the deployed grid stays 1/255 at 8 bits, as integer softmax kernels assume).

Initialisation (``LSQ.init_state``, the :meth:`Quantizer.init_state` that :func:`npujax.calibrate`
calls): the activation step is the calibrated scale (whatever observer chose it); the weight step
is the symmetric per-channel min-max scale ``max|w| / Q_p`` (``weight_init="minmax"``, the
default), so LSQ fine-tuning starts exactly from the PTQ grid and the STE/LSQ comparison starts
from the same model; ``weight_init="lsq"`` uses the paper's ``2 * mean|w| / sqrt(Q_p)`` (section
2.1), which clips the largest weights from the start. The activation gradient scale is the paper's
``1 / sqrt(features per sample * Q_p)``.

Deployment: scale = the learned step (clamped to ``MIN_SCALE`` as :func:`npujax.numerics.
lsq_fake_quant` uses it), weight zero point 0, so an LSQ-trained model deploys on exactly the grid
it trained on. LSQ+'s real-valued offset is deployed as the integer zero point
``clip(round(-beta / s), qmin, qmax)``: the only place where the deployed grid can differ from
the trained one (a shift of at most half a step).

References:
  Esser et al. 2020, "Learned Step Size Quantization", arXiv:1902.08153.
  Bhalgat et al. 2020, "LSQ+: Improving low-bit quantization through learnable offsets and
  better initialization", arXiv:2004.09576.
"""

from __future__ import annotations

import dataclasses
import math
from typing import ClassVar, NamedTuple, final

import jax
import jax.numpy as jnp
import numpy as np

from npujax.errors import ConfigError
from npujax.numerics import (
    MIN_SCALE,
    FloatFormat,
    IntFormat,
    lsq_fake_quant,
    lsq_init_step,
    weight_qparams,
)
from npujax.ops import kernel_out_axis
from npujax.quantize.quantizers.base import (
    Quantizer,
    WeightGrid,
    calibrated_grid,
    missing_grid,
    missing_operand_grid,
    operand_qparams,
    register_quantizer,
)

__all__ = ["LSQ", "LSQPlus", "LSQState", "LSQPlusState"]


class LSQState(NamedTuple):
    """Learned steps of an LSQ layer (see the module table)."""

    act_scale: jax.Array | None = None
    act_zero_point: jax.Array | None = None
    weight_step: jax.Array | None = None
    operand_scale: jax.Array | None = None
    operand_zero_point: jax.Array | None = None


class LSQPlusState(NamedTuple):
    """Learned steps and activation offset of an LSQ+ layer (see the module table)."""

    act_scale: jax.Array | None = None
    act_zero_point: jax.Array | None = None
    act_offset: jax.Array | None = None
    weight_step: jax.Array | None = None
    operand_scale: jax.Array | None = None
    operand_zero_point: jax.Array | None = None


_STEPS = ("act_scale", "weight_step", "operand_scale")


def _grad_scale(x: jax.Array, fmt: IntFormat) -> float:
    """LSQ's activation gradient scale ``1 / sqrt(features per sample * Q_p)``."""
    return 1.0 / math.sqrt(max(x.size // max(x.shape[0], 1), 1) * max(fmt.qmax, 1))


@dataclasses.dataclass(frozen=True)
class LSQ(Quantizer):
    """Learned activation and weight steps (Esser et al. 2020).

    Attributes:
      weight_init: ``"minmax"`` (``max|w| / Q_p`` per channel: the PTQ grid) or ``"lsq"``
        (``2 * mean|w| / sqrt(Q_p)``).
    """

    weight_init: str = "minmax"
    name = "lsq"
    # the base class's types: LSQPlus overrides both
    state_type: ClassVar[type] = LSQState
    learned_fields: ClassVar[tuple[str, ...]] = ("act_scale", "weight_step", "operand_scale")
    quantizes_operands = True

    def __post_init__(self) -> None:
        if self.weight_init not in ("minmax", "lsq"):
            raise ConfigError(f"weight_init must be 'minmax' or 'lsq', got {self.weight_init!r}.")

    def validate(self, lq) -> None:
        fp8 = [f for f in (*lq.weight_candidates, lq.act) if isinstance(f, FloatFormat)]
        why = ("an FP8 format" if fp8 else "a weight-format mixture"
               if len(lq.weight_candidates) > 1 or lq.act_candidates else "per-block weights"
               if lq.weight_block_size is not None else "stochastic rounding"
               if lq.stochastic_rounding else None)
        if why:
            raise ConfigError(f"quantizer {self.name!r} learns an integer grid per tensor/"
                              f"channel and does not support {why}; use quantizer='ste' for "
                              "this layer.")

    def _weight_step(self, node, lq, kernel):
        if lq.weight is None or kernel is None:
            return None
        (fmt,) = lq.weight_candidates
        axis = kernel_out_axis(node) if lq.weight_per_channel else None
        step = (weight_qparams(kernel, fmt, axis)[0] if self.weight_init == "minmax"
                else lsq_init_step(kernel, fmt, axis))
        return jnp.asarray(step, jnp.float32)

    def init_state(self, node, lq, kernel, *, act_range=None, act_grid=None):
        s, z = calibrated_grid(lq, act_range, act_grid)
        return LSQState(s, z, self._weight_step(node, lq, kernel))

    def _offset(self, x, state):
        """The activation offset: ``-z * s`` (LSQ's fixed zero point on the learned step)."""
        step = jnp.maximum(jnp.asarray(state.act_scale, x.dtype), MIN_SCALE)
        return -jnp.asarray(state.act_zero_point).astype(x.dtype) * step

    def quantize_input(self, node, lq, x, state, key=None):
        if lq.act is None:
            return x
        if state is None or state.act_scale is None:
            raise missing_grid(node)
        step, offset = state.act_scale, self._offset(x, state)
        if lq.act_range is not None:  # a fixed range (softmax output): not learned
            step, offset = jax.lax.stop_gradient(step), jax.lax.stop_gradient(offset)
        return lsq_fake_quant(x, step, lq.act, _grad_scale(x, lq.act), offset=offset)

    def init_operand(self, node, lq, state, operand_range):
        """``state`` with the second operand's calibrated grid (its initial learned step)."""
        if not lq.weight_candidates:
            return state
        (fmt,) = lq.weight_candidates
        s, z = operand_qparams(lq, fmt, operand_range)
        return (state or self.state_type())._replace(
            operand_scale=jnp.asarray(s, jnp.float32), operand_zero_point=z)

    def quantize_operand(self, node, lq, x, state, key=None):
        """The second activation operand on its learned grid ``(clip(round(x / s) + z) - z) *
        s`` (LSQ gradients; a fixed range keeps its step)."""
        if not lq.weight_candidates:
            return x
        if state is None or getattr(state, "operand_scale", None) is None:
            raise missing_operand_grid(node)
        (fmt,) = lq.weight_candidates
        step = jnp.maximum(jnp.asarray(state.operand_scale, x.dtype), MIN_SCALE)
        if lq.operand_range is not None:
            step = jax.lax.stop_gradient(step)
        offset = -jnp.asarray(state.operand_zero_point).astype(x.dtype) * step
        return lsq_fake_quant(x, step, fmt, _grad_scale(x, fmt), offset=offset)

    def operand_grid(self, node, lq, state):
        s, z = super().operand_grid(node, lq, state)
        return jnp.maximum(jnp.asarray(s, jnp.float32), MIN_SCALE), z

    def quantize_kernel(self, node, lq, w, state, key=None):
        if lq.weight is None:
            return w
        if state is None or getattr(state, "weight_step", None) is None:
            raise ConfigError(
                f"layer {node.name!r} learns its weight step (quantizer {self.name!r}) but its "
                "state has no 'weight_step'; calibrate with this quant spec (npujax.calibrate "
                "initialises it).")
        (fmt,) = lq.weight_candidates
        axis = kernel_out_axis(node) if lq.weight_per_channel else None
        return lsq_fake_quant(w, state.weight_step, fmt, axis=axis)

    def act_grid(self, lq, state):
        s, z = super().act_grid(lq, state)
        return jnp.maximum(jnp.asarray(s, jnp.float32), MIN_SCALE), z

    def weight_grid(self, node, lq, w, state, *, out_axis=None, in_axis=None):
        if state is None or getattr(state, "weight_step", None) is None:
            return super().weight_grid(node, lq, w, state, out_axis=out_axis, in_axis=in_axis)
        axis = (kernel_out_axis(node) if out_axis is None else out_axis) \
            if lq.weight_per_channel else None
        # on the host (exact): export and conversion compiled a program per channel count
        s = np.maximum(np.asarray(state.weight_step, np.float32), np.float32(MIN_SCALE))
        return WeightGrid(jax.device_put(s), jax.device_put(np.zeros(s.shape, np.int32)), axis,
                          None)

    def project(self, learned):
        return {k: jnp.maximum(v, MIN_SCALE) if k in _STEPS else v for k, v in learned.items()}


@final
@dataclasses.dataclass(frozen=True)
class LSQPlus(LSQ):
    """LSQ with a learned activation offset (Bhalgat et al. 2020)."""

    name = "lsq+"
    state_type = LSQPlusState
    learned_fields = ("act_scale", "act_offset", "weight_step", "operand_scale")

    def init_state(self, node, lq, kernel, *, act_range=None, act_grid=None):
        s, z = calibrated_grid(lq, act_range, act_grid)
        offset = None
        if s is not None:
            offset = -jnp.asarray(z).astype(jnp.float32) * jnp.asarray(s, jnp.float32)
        return LSQPlusState(s, z, offset, self._weight_step(node, lq, kernel))

    def init_operand(self, node, lq, state, operand_range):
        """As LSQ's (the second operand learns its step; its zero point stays calibrated)."""
        return super().init_operand(node, lq, state, operand_range)

    def _offset(self, x, state):
        return state.act_offset

    def act_grid(self, lq, state):
        s, _ = super().act_grid(lq, state)
        z = jnp.round(-jnp.asarray(state.act_offset, jnp.float32) / s)
        return s, jnp.clip(z, lq.act.qmin, lq.act.qmax).astype(jnp.int32)


register_quantizer(LSQ())
register_quantizer(LSQPlus())

"""Straight-through fake quantization (STE) with a calibrated activation grid.

The input activation is fake-quantized per tensor with the calibrated ``scale``/``zero_point``
(``fake_quant``: ONNX QuantizeLinear/DequantizeLinear forward, clipped straight-through
gradient); the kernel with a symmetric min-max scale recomputed from the current weights, per
output channel, per tensor or per block (so QAT sees the grid that conversion uses). Stochastic
rounding applies when :func:`npujax.execute` gets a ``key``.

References:
  Bengio et al. 2013, arXiv:1308.3432 (the straight-through estimator); Jacob et al. 2018,
  arXiv:1712.05877 (QAT with fake quantization); Krishnamoorthi 2018, arXiv:1806.08342.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, NamedTuple, final

import jax

from npujax.quantize.quantizers.base import Quantizer, calibrated_grid, register_quantizer

if TYPE_CHECKING:
    pass

__all__ = ["STE", "STEState"]


class STEState(NamedTuple):
    """Calibrated input grid of an STE layer (both None for weight-only quantization).

    Attributes:
      act_scale: float32 scalar scale of the input activation.
      act_zero_point: int32 scalar zero point.
      operand_scale, operand_zero_point: the grid of the second activation operand of a GEMM of
        two activations (MatMul, Einsum); None for other layers.
    """

    act_scale: jax.Array | None = None
    act_zero_point: jax.Array | None = None
    operand_scale: jax.Array | None = None
    operand_zero_point: jax.Array | None = None


@final
@dataclasses.dataclass(frozen=True)
class STE(Quantizer):
    """Calibrated activation grid, min-max weight grid, straight-through gradients."""

    name = "ste"
    state_type = STEState
    quantizes_operands = True

    def init_state(self, node, lq, kernel, *, act_range=None, act_grid=None) -> STEState:
        return STEState(*calibrated_grid(lq, act_range, act_grid))

    def quantize_input(self, node, lq, x, state, key=None):
        return self._calibrated_input(node, lq, x, state, key)

    def quantize_kernel(self, node, lq, w, state, key=None):
        if not lq.weight_candidates:
            return w
        return self._kernel(node, lq, w, key)

    def init_operand(self, node, lq, state, operand_range) -> STEState:
        return self._with_operand_grid(lq, state, operand_range)


register_quantizer(STE())

"""Fake quantization on a weight grid that a PTQ method fixed (AdaRound, GPTQ).

:class:`~npujax.quantize.quantizers.ste.STE` recomputes the symmetric min-max weight scale from
the current kernel. That is right for a kernel that is still float, but not for one that a
post-training method has already rounded onto a chosen grid: AdaRound may round the largest
weight of a channel down, and GPTQ's error feedback moves weights after their group's scale was
chosen, so the min-max scale of the rounded kernel can differ from the grid it lies on. This
quantizer keeps that grid in its state, so :func:`npujax.execute`, :func:`npujax.convert` and
:func:`npujax.to_onnx` use exactly the codes the method chose.

=====================  ==================  ====================================================
field                  shape, dtype        meaning
=====================  ==================  ====================================================
``act_scale``          f32[]               calibrated input grid (as STE's)
``act_zero_point``     i32[]
``weight_scale``       f32 per granularity  the fixed weight scale: ``[]`` per tensor, ``[C_out]``
                                           per channel (the kernel's output axis), the
                                           per-block shape of :func:`npujax.numerics.
                                           weight_qparams` with ``weight_block_size``
``weight_zero_point``  i32, same shape     its zero point (0 for signed formats)
``operand_scale``,     f32[], i32[]        a GEMM of two activations: its second operand's grid
``operand_zero_point``
=====================  ==================  ====================================================

A state without ``weight_scale`` (e.g. right after :func:`npujax.calibrate`) quantizes the
kernel as STE does (min-max). Gradients are straight-through.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple, final

import jax
import numpy as np

from npujax.numerics import fake_quant
from npujax.ops import kernel_in_axis, kernel_out_axis
from npujax.quantize.quantizers.base import (
    Quantizer,
    WeightGrid,
    calibrated_grid,
    register_quantizer,
)

__all__ = ["FixedGrid", "FixedGridState", "grid_axis"]


class FixedGridState(NamedTuple):
    """A layer's calibrated input grid and fixed weight grid (see the module table)."""

    act_scale: jax.Array | None = None
    act_zero_point: jax.Array | None = None
    weight_scale: jax.Array | None = None
    weight_zero_point: jax.Array | None = None
    operand_scale: jax.Array | None = None
    operand_zero_point: jax.Array | None = None


def grid_axis(node, lq, *, out_axis: int | None = None, in_axis: int | None = None
              ) -> int | None:
    """The kernel axis a layer's weight grid runs along: the input-channel axis per block, the
    output-channel axis per channel, None per tensor (``out_axis``/``in_axis`` default to the
    node's kernel layout; pass them for a transposed kernel view)."""
    if lq.weight_block_size is not None:
        return kernel_in_axis(node) if in_axis is None else in_axis
    if lq.weight_per_channel:
        return kernel_out_axis(node) if out_axis is None else out_axis
    return None


@final
@dataclasses.dataclass(frozen=True)
class FixedGrid(Quantizer):
    """Calibrated activation grid and a weight grid fixed by a PTQ method; straight-through
    gradients."""

    name = "fixed"
    state_type = FixedGridState
    quantizes_operands = True

    def init_state(self, node, lq, kernel, *, act_range=None, act_grid=None) -> FixedGridState:
        return FixedGridState(*calibrated_grid(lq, act_range, act_grid))

    def quantize_input(self, node, lq, x, state, key=None):
        return self._calibrated_input(node, lq, x, state, key)

    def quantize_kernel(self, node, lq, w, state, key=None):
        if not lq.weight_candidates:
            return w
        if state is None or getattr(state, "weight_scale", None) is None:
            return self._kernel(node, lq, w, key)
        (fmt,) = lq.weight_candidates
        return fake_quant(w, state.weight_scale, state.weight_zero_point, fmt,
                          grid_axis(node, lq), block_size=lq.weight_block_size, key=key,
                          name=f"{node.name}/kernel")

    def weight_grid(self, node, lq, w, state, *, out_axis=None, in_axis=None) -> WeightGrid:
        if state is None or getattr(state, "weight_scale", None) is None:
            return super().weight_grid(node, lq, w, state, out_axis=out_axis, in_axis=in_axis)
        axis = grid_axis(node, lq, out_axis=out_axis, in_axis=in_axis)
        s = np.asarray(state.weight_scale, np.float32)
        z = np.asarray(state.weight_zero_point, np.int32)
        return WeightGrid(jax.device_put(s), jax.device_put(z), axis, lq.weight_block_size)

    def init_operand(self, node, lq, state, operand_range) -> FixedGridState:
        return self._with_operand_grid(lq, state, operand_range)


register_quantizer(FixedGrid())

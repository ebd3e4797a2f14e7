"""A differentiable mixture over candidate widths: the layer form of mixed-precision search.

The kernel is ``sum_i weight_probs[i] * Q_i(w)`` over the candidate weight formats (min-max
grids per output channel, straight-through gradients), and with ``act_candidates`` the input is
``sum_j act_probs[j] * fake_quant(x, grid_j)`` with one calibrated grid per candidate over the
same observed range (EdMIPS: Cai and Vasconcelos, "Rethinking Differentiable Search for
Mixed-Precision Neural Networks", CVPR 2020). The probabilities are part of the state: a search
writes its current probabilities (e.g. a softmax over learned logits) into the state it passes to
:func:`npujax.execute`; calibration initialises them uniform. A mixture has no single deployed
grid: fix one width per layer before converting or exporting.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, NamedTuple, final

import jax
import jax.numpy as jnp

from npujax.errors import ConfigError
from npujax.numerics import IntFormat, fake_quant, qparams_from_range
from npujax.ops import out_channel_view
from npujax.quantize.quantizers.base import (
    Quantizer,
    calibrated_grid,
    missing_grid,
    missing_operand_grid,
    operand_qparams,
    quantize_weight,
    register_quantizer,
)

if TYPE_CHECKING:
    from npujax.quantize.spec import LayerQuant

__all__ = ["Mixture", "MixtureState", "set_probabilities"]


class MixtureState(NamedTuple):
    """State of a search-mixture layer.

    Attributes:
      act_scale, act_zero_point: the input grid of the widest activation format (``lq.act``;
        what a run without a mixture uses).
      act_scales, act_zero_points: f32[n_a] / i32[n_a], one grid per activation candidate over
        the same range (None without ``act_candidates``).
      weight_probs: f32[n_w] mixture weights over the weight candidates (None: one format).
      act_probs: f32[n_a] mixture weights over the activation candidates.
      operand_scales, operand_zero_points: f32[n_w] / i32[n_w], the grid of a GEMM of two
        activations' second operand per weight candidate, over the same observed range (None
        for other layers).
    """

    act_scale: jax.Array | None = None
    act_zero_point: jax.Array | None = None
    act_scales: jax.Array | None = None
    act_zero_points: jax.Array | None = None
    weight_probs: jax.Array | None = None
    act_probs: jax.Array | None = None
    operand_scales: jax.Array | None = None
    operand_zero_points: jax.Array | None = None


@final
@dataclasses.dataclass(frozen=True)
class Mixture(Quantizer):
    """Probability-weighted mixture of STE fake-quant over candidate widths (EdMIPS)."""

    name = "mixture"
    state_type = MixtureState
    quantizes_operands = True

    def validate(self, lq) -> None:
        if lq.act_candidates:
            ok = all(isinstance(f, IntFormat) for f in lq.act_candidates)
            if not ok or not isinstance(lq.act, IntFormat) or lq.act != max(
                    lq.act_candidates, key=lambda f: f.bits):
                raise ConfigError("act_candidates must be integer formats with act the widest "
                                  f"of them; got act={lq.act}, candidates={lq.act_candidates}.")

    def init_state(self, node, lq, kernel, *, act_range=None, act_grid=None) -> MixtureState:
        s, z = calibrated_grid(lq, act_range, act_grid)
        scales = zps = aprobs = None
        if lq.act_candidates:
            if act_range is None:
                raise ConfigError(f"layer {node.name!r} mixes {len(lq.act_candidates)} "
                                  "activation widths, whose grids come from the observed range; "
                                  "calibrate it (npujax.calibrate) with this quant spec.")
            grids = [qparams_from_range(act_range[0], act_range[1], f, lq.act_symmetric)
                     for f in lq.act_candidates]
            scales = jnp.stack([g[0] for g in grids])
            zps = jnp.stack([g[1] for g in grids])
            aprobs = jnp.full(len(grids), 1.0 / len(grids), jnp.float32)
        n_w = len(lq.weight_candidates)
        wprobs = jnp.full(n_w, 1.0 / n_w, jnp.float32) if n_w > 1 else None
        return MixtureState(s, z, scales, zps, wprobs, aprobs)

    def quantize_input(self, node, lq, x, state, key=None):
        if lq.act is None:
            return x
        if state is None or state.act_scale is None:
            raise missing_grid(node)
        if not lq.act_candidates:
            return fake_quant(x, state.act_scale, state.act_zero_point, lq.act, key=key)
        if state.act_probs is None or state.act_scales is None:
            raise ConfigError(
                f"layer {node.name!r} mixes {len(lq.act_candidates)} activation widths; its "
                "state needs act_probs and the per-candidate act_scales/act_zero_points "
                "(calibrate with this quant spec).")
        return sum(state.act_probs[j] * fake_quant(x, state.act_scales[j],
                                                   state.act_zero_points[j], f, key=key)
                   for j, f in enumerate(lq.act_candidates))

    def quantize_kernel(self, node, lq, w, state, key=None):
        fmts = lq.weight_candidates
        if not fmts:
            return w
        if len(fmts) == 1:
            return self._kernel(node, lq, w, key)
        if state is None or state.weight_probs is None:
            raise ConfigError(
                f"layer {node.name!r} has {len(fmts)} candidate weight formats but its state "
                "has no weight_probs; calibrate with this quant spec or set the probabilities "
                "(state._replace(weight_probs=...)).")
        axis, back = None, (lambda v: v)
        if lq.weight_per_channel:
            w, axis, back = out_channel_view(node, w)
        return back(sum(state.weight_probs[i] * quantize_weight(w, f, axis)
                        for i, f in enumerate(fmts)))

    def init_operand(self, node, lq, state, operand_range) -> MixtureState:
        if not lq.weight_candidates:
            return state
        grids = [operand_qparams(lq, f, operand_range) for f in lq.weight_candidates]
        return (state or MixtureState())._replace(
            operand_scales=jnp.stack([g[0] for g in grids]),
            operand_zero_points=jnp.stack([g[1] for g in grids]))

    def quantize_operand(self, node, lq, x, state, key=None):
        fmts = lq.weight_candidates
        if not fmts:
            return x
        if state is None or state.operand_scales is None:
            raise missing_operand_grid(node)
        if len(fmts) == 1:
            return fake_quant(x, state.operand_scales[0], state.operand_zero_points[0],
                              fmts[0], key=key)
        if state.weight_probs is None:
            raise ConfigError(f"layer {node.name!r} has {len(fmts)} candidate operand formats "
                              "but its state has no weight_probs; calibrate with this quant "
                              "spec.")
        return sum(state.weight_probs[i] * fake_quant(x, state.operand_scales[i],
                                                      state.operand_zero_points[i], f, key=key)
                   for i, f in enumerate(fmts))

    def operand_grid(self, node, lq, state):
        if len(lq.weight_candidates) != 1:
            raise ConfigError(
                f"layer {node.name!r} has {len(lq.weight_candidates)} candidate operand formats "
                "(a search mixture); choose one width per layer before converting or "
                "exporting.")
        if state is None or state.operand_scales is None:
            raise missing_operand_grid(node)
        return state.operand_scales[0], state.operand_zero_points[0]

    def weight_grid(self, node, lq, w, state, *, out_axis=None, in_axis=None):
        if len(lq.weight_candidates) > 1:
            raise ConfigError(
                f"layer {node.name!r} has {len(lq.weight_candidates)} candidate weight formats "
                "(a search mixture); choose one width per layer (quant_spec(graph, "
                "weight_bits={...})) before converting or exporting.")
        return super().weight_grid(node, lq, w, state, out_axis=out_axis, in_axis=in_axis)


register_quantizer(Mixture())


def set_probabilities(
    quant: Mapping[str, LayerQuant], qstate: Mapping[str, Any],
    weight_probs: Mapping[str, jax.Array] | None = None,
    act_probs: Mapping[str, jax.Array] | None = None,
) -> dict[str, Any]:
    """``qstate`` with the mixture probabilities of its search-mixture layers replaced.

    Args:
      quant: the spec (layers with several weight candidates take ``weight_probs[layer]``,
        layers with ``act_candidates`` take ``act_probs[layer]``).
      qstate: the calibrated states (:class:`MixtureState` for the mixture layers).
      weight_probs: ``{layer: f32[n]}`` probabilities of the weight candidates (e.g. softmax
        of logits); a layer not named keeps its probabilities.
      act_probs: the same for the activation candidates.

    Returns:
      A new qstate (differentiable w.r.t. the probabilities; works under ``jit``).
    """
    out = dict(qstate)
    for name, lq in quant.items():
        changes = {}
        if weight_probs is not None and name in weight_probs and len(lq.weight_candidates) > 1:
            changes["weight_probs"] = weight_probs[name]
        if act_probs is not None and name in act_probs and lq.act_candidates:
            changes["act_probs"] = act_probs[name]
        if changes:
            out[name] = lq.quantizer.coerce(out[name], name)._replace(**changes)
    return out

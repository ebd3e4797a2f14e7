"""Post-training calibration of a Graph's activation ranges."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from npujax._progress import track
from npujax.calib import Observer, check_finite_state, get_observer, minmax_observer
from npujax.errors import CalibrationError
from npujax.ir.graph import Graph, Params
from npujax.ops import OPS, weight_role
from npujax.quant import IntFormat
from npujax.quantize.execute import execute
from npujax.quantize.spec import QuantSpec
from npujax.quantize.weights import check_weights

__all__ = ["calibrate"]


def calibrate(
    graph: Graph,
    params: Params,
    batches: Iterable[ArrayLike],
    quant: QuantSpec,
    *,
    observer: str | Callable[[], Observer] = minmax_observer,
    progress: bool = False,
) -> dict[str, Any]:
    """Observe the input activation of every quantized layer over ``batches`` (float model).

    Args:
      graph: the (optimized) float model.
      params: its params.
      batches: iterable of input batches ``(batch, ...)`` float32; at least one.
      quant: the quantization spec; layers with an ``act`` format are observed.
      observer: factory of the per-layer observer (default min-max, per tensor), or a name from
        :data:`npujax.calib.OBSERVERS` (``"minmax"``, ``"ema"``, ``"percentile"``, ``"mse"``,
        ``"entropy"``). The final range is chosen per layer for that layer's activation format.
      progress: show a progress bar (rich) on stderr.

    Returns:
      qstate ``{layer: state}`` for :func:`npujax.execute`: every layer of ``quant`` gets its
      quantizer's initial state (:meth:`~npujax.quantize.quantizers.Quantizer.init_state`) from
      the observed range of its input (a fixed ``act_range``, e.g. a softmax output's [0, 1],
      instead where the layer has one; a GEMM of two activations also gets its second operand's
      grid, :meth:`~npujax.quantize.quantizers.Quantizer.init_operand`): the calibrated grid
      ``act_scale`` f32[] /
      ``act_zero_point`` i32[] (FP8 activations: ``act_scale = amax / fmt.max``, zero point 0),
      and per quantizer the initial LSQ ``weight_step`` and LSQ+ ``act_offset``, or a search
      mixture's per-candidate grids and uniform probabilities.

    Raises:
      CalibrationError: no batches, an empty batch, a batch that is a tuple of arrays (an
        ``(inputs, targets)`` pair), NaN/inf reaching a layer, or a NaN/inf or
        too large weight (:func:`npujax.quantize.weights.check_weights`; names the layer).
    """
    check_weights(params)  # weights are checked like activations are (names the layer)
    # observed tensors: (layer, tap index) -- 0 the input, 2 a two-activation GEMM's 2nd operand
    keys = [(n, 0) for n, lq in quant.items() if lq.act is not None and lq.act_range is None]
    operands = [n for n, lq in quant.items()
                if lq.weight_candidates and OPS[graph.node(n).op].quantized_operands]
    keys += [(n, 2) for n in operands if quant[n].operand_range is None]
    for n in operands:  # refuse before running anything
        if not quant[n].quantizer.quantizes_operands:
            quant[n].quantizer.init_operand(graph.node(n), quant[n], None, (0.0, 0.0))
    names = sorted({n for n, _ in keys})
    if isinstance(observer, str):
        name = observer
        observer = lambda: get_observer(name)  # noqa: E731
    obs = {k: observer() for k in keys}
    run = jax.jit(lambda p, x: execute(graph, p, x, taps=names)[1])
    update = jax.jit(lambda states, taps: {k: obs[k].update(states[k], taps[k[0]][k[1]])
                                           for k in keys})
    states = None
    count = 0
    for i, x in enumerate(track(batches, "calibrating", progress)):
        if isinstance(x, tuple | list) and x and all(hasattr(v, "shape") for v in x):
            raise CalibrationError(
                f"calibration batch {i} is a {type(x).__name__} of {len(x)} arrays, like the "
                "(inputs, targets) batches of a training loader; calibration observes the "
                "inputs only: pass (x for x, _ in loader).")
        if jnp.shape(x)[:1] == (0,):
            raise CalibrationError(f"calibration batch {i} is empty (0 examples); pass only "
                                   "non-empty batches (e.g. slice up to len(x), not past it).")
        taps = run(params, jnp.asarray(x, jnp.float32))
        if states is None:
            states = {k: obs[k].init(taps[k[0]][k[1]]) for k in keys}
        states = update(states, taps)
        for k in keys:
            check_finite_state(states[k], k[0])
        count += 1
    if count == 0:
        raise CalibrationError("calibration needs at least one batch; the iterator was empty.")
    qstate: dict[str, Any] = {}
    for n, lq in quant.items():
        act_range = None
        if lq.act is not None and lq.act_range is not None:
            act_range = tuple(jnp.float32(v) for v in lq.act_range)
        elif (n, 0) in obs:
            assert states is not None
            act_range = obs[n, 0].compute_range(states[n, 0], lq.act, lq.act_symmetric)
        node = graph.node(n)
        kernel = params.get(n, {}).get(weight_role(node))
        qstate[n] = lq.quantizer.init_state(
            node, lq, None if kernel is None else jnp.asarray(kernel, jnp.float32),
            act_range=act_range)
        if n in operands:
            if lq.operand_range is not None:
                r = tuple(jnp.float32(v) for v in lq.operand_range)
            else:
                assert states is not None
                fmt = lq.weight_candidates[-1]
                r = obs[n, 2].compute_range(states[n, 2], fmt,
                                            not isinstance(fmt, IntFormat) or fmt.signed)
            qstate[n] = lq.quantizer.init_operand(node, lq, qstate[n], r)
    return qstate

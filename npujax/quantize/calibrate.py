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
      the observed range of its input: the calibrated grid ``act_scale`` f32[] /
      ``act_zero_point`` i32[] (FP8 activations: ``act_scale = amax / fmt.max``, zero point 0),
      and per quantizer the initial LSQ ``weight_step`` and LSQ+ ``act_offset``, or a search
      mixture's per-candidate grids and uniform probabilities.

    Raises:
      CalibrationError: no batches, an empty batch, NaN/inf reaching a layer, or a NaN/inf or
        too large weight (:func:`npujax.quantize.weights.check_weights`; names the layer).
    """
    check_weights(params)  # weights are checked like activations are (names the layer)
    names = [n for n, lq in quant.items() if lq.act is not None]
    if isinstance(observer, str):
        name = observer
        observer = lambda: get_observer(name)  # noqa: E731
    obs = {n: observer() for n in names}
    run = jax.jit(lambda p, x: execute(graph, p, x, taps=names)[1])
    update = jax.jit(lambda states, taps: {n: obs[n].update(states[n], taps[n][0]) for n in names})
    states = None
    count = 0
    for i, x in enumerate(track(batches, "calibrating", progress)):
        if jnp.shape(x)[:1] == (0,):
            raise CalibrationError(f"calibration batch {i} is empty (0 examples); pass only "
                                   "non-empty batches (e.g. slice up to len(x), not past it).")
        taps = run(params, jnp.asarray(x, jnp.float32))
        if states is None:
            states = {n: obs[n].init(taps[n][0]) for n in names}
        states = update(states, taps)
        for n in names:
            check_finite_state(states[n], n)
        count += 1
    if count == 0:
        raise CalibrationError("calibration needs at least one batch; the iterator was empty.")
    qstate: dict[str, Any] = {}
    for n, lq in quant.items():
        act_range = None
        if n in obs:
            assert states is not None
            act_range = obs[n].compute_range(states[n], lq.act, lq.act_symmetric)
        kernel = params.get(n, {}).get("kernel")
        qstate[n] = lq.quantizer.init_state(
            graph.node(n), lq, None if kernel is None else jnp.asarray(kernel, jnp.float32),
            act_range=act_range)
    return qstate

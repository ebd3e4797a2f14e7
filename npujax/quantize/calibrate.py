"""Post-training calibration of a Graph's activation ranges."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable

import jax
import jax.numpy as jnp

from npujax.calib.observers import Observer, check_finite_state, get_observer, minmax_observer
from npujax.errors import CalibrationError
from npujax.ir.graph import Graph, Params
from npujax.quant.qparams import qparams_from_range
from npujax.quantize.execute import QuantSpec, execute
from npujax.quantize.learned_steps import init_lsq_state

__all__ = ["calibrate"]


def calibrate(
    graph: Graph,
    params: Params,
    batches: Iterable[jax.Array],
    quant: QuantSpec,
    *,
    observer: str | Callable[[], Observer] = minmax_observer,
    progress: bool = False,
) -> dict[str, dict[str, jax.Array]]:
    """Observe the input activation of every quantized layer over ``batches`` (float model).

    Args:
      graph, params: the (optimized) float model.
      batches: iterable of input batches ``(batch, ...)`` float32; at least one.
      quant: the quantization spec; layers with an ``act`` format are observed.
      observer: factory of the per-layer observer (default min-max, per tensor), or a name from
        :data:`npujax.calib.OBSERVERS` (``"minmax"``, ``"ema"``, ``"percentile"``, ``"mse"``,
        ``"entropy"``). The final range is chosen per layer for that layer's activation format.
      progress: show a progress bar (rich) on stderr.

    Returns:
      qstate ``{layer: {"act_scale": f32[], "act_zero_point": i32[]}}`` for :func:`execute`
      (FP8 activations: ``act_scale = amax / fmt.max``, zero point 0); layers with
      ``act_candidates`` (a search mixture) also get ``"act_scales"`` f32[n] and
      ``"act_zero_points"`` i32[n], one grid per candidate over the same range. Layers with
      ``method="lsq"``/``"lsq+"`` also get their initial ``weight_step`` (per-channel min-max)
      and LSQ+ ``act_offset`` (see :func:`npujax.quantize.learned_steps.init_lsq_state`).

    Raises:
      CalibrationError: no batches, an empty batch, or NaN/inf reaching a layer (names the
        layer).
    """
    names = [n for n, lq in quant.items() if lq.act is not None]
    if isinstance(observer, str):
        name = observer
        observer = lambda: get_observer(name)
    obs = {n: observer() for n in names}
    run = jax.jit(lambda p, x: execute(graph, p, x, taps=names)[1])
    update = jax.jit(lambda states, taps: {n: obs[n].update(states[n], taps[n][0]) for n in names})
    states = None
    count = 0
    it = batches
    if progress and sys.stderr.isatty():
        from rich.console import Console
        from rich.progress import track

        it = track(batches, description="calibrating", transient=True,
                   console=Console(stderr=True))
    for i, x in enumerate(it):
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
    qstate = {}
    for n in names:
        lo, hi = obs[n].compute_range(states[n], quant[n].act, quant[n].act_symmetric)
        scale, zp = qparams_from_range(lo, hi, quant[n].act, quant[n].act_symmetric)
        qstate[n] = {"act_scale": scale, "act_zero_point": zp}
        if quant[n].act_candidates:  # a search mixture: one grid per candidate, same range
            grids = [qparams_from_range(lo, hi, f, quant[n].act_symmetric)
                     for f in quant[n].act_candidates]
            qstate[n]["act_scales"] = jnp.stack([g[0] for g in grids])
            qstate[n]["act_zero_points"] = jnp.stack([g[1] for g in grids])
    if any(lq.method != "ste" for lq in quant.values()):
        qstate = init_lsq_state(graph, params, quant, qstate)
    return qstate

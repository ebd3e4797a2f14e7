"""Post-training quantization: calibrate, bias correction, per-layer SQNR error report.

The PTQ flow is ``params, qstate = ptq(graph, params, batches, quant)`` (calibration, then
empirical bias correction), then :func:`npujax.backends.integer.convert` for integer execution.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike

from npujax.calib.observers import Observer
from npujax.errors import CalibrationError
from npujax.ir.execute import execute, layer_state, tap
from npujax.ir.graph import Graph, Node, Params
from npujax.numerics import IntFormat
from npujax.ops import gemm_nodes, run_op
from npujax.quantize.calibrate import calibrate
from npujax.quantize.quantizers import QState
from npujax.quantize.spec import QuantSpec

__all__ = ["bias_correction", "ptq", "layer_sqnr", "sqnr_db"]


def _channel_axis(node: Node, ndim: int) -> int:
    return node.attrs["data_layout"].index("C") if node.op == "Conv" else ndim - 1


def bias_correction(
    graph: Graph, params: Params, quant: QuantSpec, batches: Sequence[ArrayLike],
    qstate: QState | None = None,
) -> Params:
    """Remove the mean output shift that weight quantization causes, per output channel.

    For each quantized layer with input ``x`` (float model, calibration data):
    ``bias' = bias - E[W_q x - W x]``, the expectation over the batch and spatial positions,
    ``W_q`` the fake-quantized weights the quantized model uses.

    Args:
      graph: the BN-folded float model.
      params: its params.
      quant: the quantization spec (layers with a single weight format are corrected).
      batches: calibration input batches, float32 ``(batch, ...)``.
      qstate: the calibrated states (the weight grid of a learned-step layer); layers without
        one use their quantizer's initial state.

    Returns:
      New params with corrected (or added) ``bias`` for every corrected layer.

    Raises:
      CalibrationError: if ``batches`` is empty.

    References:
      Nagel et al. 2019, "Data-Free Quantization Through Weight Equalization and Bias
      Correction", arXiv:1906.04721, section 4.2 (the empirical variant with data).
    """
    names = [n.name for n in gemm_nodes(graph)
             if n.name in quant and len(quant[n.name].weight_candidates) == 1]
    nodes = {n.name: n.replace(attrs={k: v for k, v in n.attrs.items() if k != "epilogue"})
             for n in gemm_nodes(graph) if n.name in names}

    def shift(p, x):
        _, taps = execute(graph, p, x, observe=tap(names))
        out = {}
        for name in names:
            node, xin = nodes[name], taps[name][0]
            pf = {"kernel": p[name]["kernel"]}
            lq, w = quant[name], p[name]["kernel"]
            state = layer_state(quant, qstate, name)
            if state is None:
                state = lq.quantizer.init_state(node, lq, w)
            pq = {"kernel": lq.quantizer.quantize_kernel(node, lq, w, state)}
            d = run_op(node, [xin], pq)[0] - run_op(node, [xin], pf)[0]
            ax = _channel_axis(node, d.ndim)
            out[name] = jnp.mean(d, axis=tuple(i for i in range(d.ndim) if i != ax))
        return out

    fn = jax.jit(shift)
    # the per-channel shifts are summed and applied on the host (float32 add, divide and
    # subtract round as XLA's do): eagerly each op compiled a program per layer shape
    total: dict[str, np.ndarray] | None = None
    count = 0
    for x in batches:
        s = {k: np.asarray(v) for k, v in fn(params, jnp.asarray(x, jnp.float32)).items()}
        total = s if total is None else {k: total[k] + s[k] for k in total}
        count += 1
    if total is None:  # (count == 0)
        raise CalibrationError("bias correction needs at least one batch; the iterator was empty.")
    new = {k: dict(v) for k, v in params.items()}
    for name in names:
        mean_shift = total[name] / np.float32(count)
        b = np.asarray(new[name]["bias"]) if "bias" in new[name] else np.zeros_like(mean_shift)
        new[name]["bias"] = jax.device_put(b - mean_shift)
    return new


def ptq(
    graph: Graph,
    params: Params,
    batches: Iterable[ArrayLike],
    quant: QuantSpec,
    *,
    observer: str | Callable[[], Observer] = "minmax",
    bias_correct: bool = True,
    progress: bool = False,
) -> tuple[Params, dict[str, Any]]:
    """Calibrate activation ranges, then (optionally) correct biases: the PTQ flow.

    Args:
      graph: the BN-folded float model.
      params: its params.
      batches: calibration batches (iterated once; kept in memory for bias correction).
      quant: the quantization spec.
      observer: observer name or factory (see :func:`npujax.quantize.calibrate`).
      bias_correct: apply :func:`bias_correction` after calibration.
      progress: progress bar during calibration.

    Returns:
      ``(params, qstate)`` ready for :func:`npujax.ir.execute.execute` or
      :func:`npujax.backends.integer.convert`.

    Raises:
      CalibrationError: empty data, or NaN/inf reaching a layer (named).
    """
    batches = list(batches)
    qstate = calibrate(graph, params, batches, quant, observer=observer, progress=progress)
    if bias_correct:
        params = bias_correction(graph, params, quant, batches, qstate)
    return params, qstate


def sqnr_db(signal: float, noise: float) -> float:
    """``10 log10(signal / noise)`` in dB from summed squares: ``inf`` for no noise, ``-inf``
    for no signal (never NaN)."""
    if noise <= 0.0:
        return math.inf
    if signal <= 0.0:
        return -math.inf
    return 10.0 * math.log10(signal / noise)


def layer_sqnr(
    graph: Graph,
    params: Params,
    quant: QuantSpec,
    qstate: QState,
    batches: Iterable[ArrayLike],
    *,
    isolated: bool = False,
) -> list[dict[str, Any]]:
    """Per-layer SQNR of the quantized vs the float output on calibration data, worst first.

    ``SQNR = 10 log10(sum y_float^2 / sum (y_quant - y_float)^2)`` in dB over all batches, for
    the output of every quantized layer. By default the quantized model is the whole model
    (errors accumulate along the network, as deployed); with ``isolated=True`` only that layer
    is quantized (its own sensitivity).

    Args:
      graph: the model.
      params: its params.
      quant: its quantization spec.
      qstate: its calibrated states.
      batches: calibration batches.
      isolated: quantize one layer at a time instead of all at once.

    Returns:
      Rows ``{"name", "op", "weight_bits", "act_bits", "sqnr_db"}``, sorted by ``sqnr_db``
      ascending (the layers that lose most first).

    References:
      Wu et al. 2020, arXiv:2004.09602 (per-layer sensitivity); Nagel et al. 2021,
      arXiv:2106.08295, section 4.
    """
    names = [n for n in quant if quant[n].weight is not None or quant[n].act is not None]
    specs = {n: {n: quant[n]} for n in names} if isolated else {"all": dict(quant)}

    def stats(p, x):
        _, ft = execute(graph, p, x, observe=tap(names))
        out = {}
        for key, q in specs.items():
            _, qt = execute(graph, p, x, quant=q, qstate=qstate, observe=tap(names))
            for n in (names if key == "all" else [key]):
                yf, yq = ft[n][1], qt[n][1]
                out[n] = (jnp.sum(yf * yf), jnp.sum((yq - yf) ** 2))
        return out

    fn = jax.jit(stats)
    acc: dict[str, list[float]] = {n: [0.0, 0.0] for n in names}
    count = 0
    for x in batches:
        for n, (s, e) in fn(params, jnp.asarray(x, jnp.float32)).items():
            acc[n][0] += float(s)
            acc[n][1] += float(e)
        count += 1
    if count == 0:
        raise CalibrationError("layer_sqnr needs at least one batch; the iterator was empty.")
    rows = []
    for n in names:
        lq = quant[n]
        wb = [f.bits for f in lq.weight_candidates if isinstance(f, IntFormat)]
        rows.append({
            "name": n,
            "op": graph.node(n).op,
            "weight_bits": wb[0] if len(wb) == 1 else (wb or None),
            "act_bits": lq.act.bits if isinstance(lq.act, IntFormat) else None,
            "sqnr_db": sqnr_db(*acc[n]),
        })
    return sorted(rows, key=lambda r: r["sqnr_db"])

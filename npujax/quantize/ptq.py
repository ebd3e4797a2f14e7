"""Post-training quantization: calibrate, bias correction, per-layer SQNR error report.

The PTQ flow is ``params, qstate = ptq(graph, params, batches, quant)`` (calibration, then
empirical bias correction, sequential by default as in ``npujax quantize``), then
:func:`npujax.backends.integer.convert` for integer execution.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike

from npujax._xla_options import cpu_legacy_emitters
from npujax.calib.observers import Observer
from npujax.errors import CalibrationError
from npujax.ir.execute import execute, layer_state, tap
from npujax.ir.graph import Graph, Node, Params
from npujax.numerics import FloatFormat, IntFormat
from npujax.numerics.fixed_point import quantize_bias
from npujax.ops import gemm_nodes, out_channel_view, run_op
from npujax.quantize.calibrate import calibrate
from npujax.quantize.methods._common import LayerPass
from npujax.quantize.quantizers import QState
from npujax.quantize.spec import QuantSpec

#: What :func:`bias_correction` removes (its ``mode``).
BIAS_CORRECTION_MODES = ("weights", "layer", "model")

__all__ = ["BIAS_CORRECTION_MODES", "CorrectionCheck", "bias_correction",
           "guarded_bias_correction", "deployed_biases", "ptq", "layer_sqnr", "sqnr_db"]

log = logging.getLogger(__name__)


def _channel_axis(node: Node, ndim: int) -> int:
    return node.attrs["data_layout"].index("C") if node.op == "Conv" else ndim - 1


def bias_correction(
    graph: Graph, params: Params, quant: QuantSpec, batches: Sequence[ArrayLike],
    qstate: QState | None = None,
    *,
    mode: str = "weights",
) -> Params:
    """Remove the mean output shift that quantization causes, per output channel.

    For each quantized layer: ``bias' = bias - E[y_q - y]``, the expectation over the
    calibration batches and spatial positions, ``y = W x`` the layer's output in the float
    model (pre-activation) and ``y_q`` its quantized counterpart, by ``mode``:

    - ``"weights"``: ``y_q = W_q x``, the weight quantization error alone, with the float
      model's input ``x`` (Nagel et al. 2019's empirical bias correction; every layer at once);
    - ``"layer"``: ``y_q = W_q Q(x)``, with the layer's own input quantization too;
    - ``"model"``: ``y_q = W_q x_q``, ``x_q`` the layer's input as the quantized model computes
      it with every earlier layer already corrected: layers are corrected one at a time in
      graph order (the sequential empirical bias correction of AIMET and NNCF's
      ``BiasCorrection``). This also removes the mean shift that activation quantization
      upstream causes (a global average pool keeps it while averaging the random error
      away: the squeeze-excitation layers of a MobileNetV3), which ``"weights"`` leaves. It
      runs the float model once, then the quantized model once, layer by layer: the
      calibration set's activations that cross each corrected layer are held in memory
      between layers (on PP-OCR rec, 256 lines at 48 x 320: see
      ``docs/results/quantization.md``).

    Args:
      graph: the BN-folded float model.
      params: its params.
      quant: the quantization spec (layers with a single weight format are corrected).
      batches: calibration input batches, float32 ``(batch, ...)``.
      qstate: the calibrated states (the weight grid of a learned-step layer; the input grids,
        which ``"layer"`` and ``"model"`` need); layers without one use their quantizer's
        initial state.
      mode: one of :data:`BIAS_CORRECTION_MODES`. Default ``"weights"``, the one mode that
        needs no ``qstate`` (the paper's, on float activations alone); :func:`ptq` and
        ``npujax quantize`` pass ``"model"``, their default.

    Returns:
      New params with corrected (or added) ``bias`` for every corrected layer.

    Raises:
      CalibrationError: if ``batches`` is empty, ``mode`` is unknown, or ``"layer"`` /
        ``"model"`` without ``qstate``.

    References:
      Nagel et al. 2019, "Data-Free Quantization Through Weight Equalization and Bias
      Correction", arXiv:1906.04721, section 4.2 (the empirical variant with data); NNCF
      3.4, ``nncf.quantization.algorithms.bias_correction`` (sequential, on the quantized
      model's statistics); AIMET ``bias_correction.correct_bias`` (empirical).
    """
    if mode not in BIAS_CORRECTION_MODES:
        raise CalibrationError(f"bias correction mode {mode!r}: choose one of "
                               f"{list(BIAS_CORRECTION_MODES)}.")
    if mode != "weights" and qstate is None:
        raise CalibrationError(f"bias correction mode {mode!r} quantizes the layers' inputs: "
                               "pass the calibrated qstate (npujax.quantize.calibrate).")
    layers = _Corrected(graph, params, quant, qstate)
    names, nodes = layers.names, layers.nodes

    def shift(p, x):  # "weights", "layer": every layer at once, float inputs
        _, taps = execute(graph, p, x, observe=tap(names))
        out = {}
        for name in names:
            node, xin, lq = nodes[name], taps[name][0], quant[name]
            xq = (lq.quantizer.quantize_input(node, lq, xin, layers.state(name, p))
                  if mode == "layer" and lq.act is not None else xin)
            d = run_op(node, [xq], layers.kernel(name, p))[0] - run_op(
                node, [xin], {"kernel": p[name]["kernel"]})[0]
            out[name] = layers.channel_mean(name, d)
        return out

    if mode != "model":
        new = _copy(params)
        _correct(new, names, _means(jax.jit(shift), params, batches))
        return new
    return _sequential(graph, params, quant, qstate, batches, layers)


class CorrectionCheck(NamedTuple):
    """What :func:`guarded_bias_correction` measured and kept.

    Attributes:
      mode: the correction's mode (:data:`BIAS_CORRECTION_MODES`).
      kept: True when the corrected biases were kept; False when the correction lowered the
        output SQNR on the calibration data and the uncorrected biases were kept.
      sqnr_db_uncorrected: the quantized model's output SQNR against the float model on the
        calibration data (dB) without the correction.
      sqnr_db_corrected: the same with it.
    """

    mode: str
    kept: bool
    sqnr_db_uncorrected: float
    sqnr_db_corrected: float

    def describe(self) -> str:
        """One line for a report: both SQNRs and what was kept."""
        return (f"bias correction ({self.mode}): output SQNR against float on the calibration "
                f"data {self.sqnr_db_uncorrected:.1f} dB uncorrected, "
                f"{self.sqnr_db_corrected:.1f} dB corrected: "
                + ("kept the corrected biases" if self.kept else
                   "the correction lowers it, kept the uncorrected biases"))


def guarded_bias_correction(
    graph: Graph, params: Params, quant: QuantSpec, batches: Sequence[ArrayLike],
    qstate: QState,
    *,
    mode: str = "model",
    reference: tuple[Graph, Params] | None = None,
) -> tuple[Params, CorrectionCheck]:
    """:func:`bias_correction`, kept only where it does not lower the output SQNR.

    The correction removes each layer's mean output shift, which lowers each layer's own
    squared error, but not always the model's: downstream of a clipped input, a ReLU may have
    zeroed the examples that carry the shift, and removing it then moves the live ones (PP-OCR
    cls with entropy calibration: the sequential correction lowered the output SQNR from 8.9
    to 6.3 dB). So the quantized model's outputs are compared with the float model's on the
    calibration ``batches`` with and without the correction,
    ``SQNR = 10 log10(sum y_float^2 / sum (y_quant - y_float)^2)`` over every output and
    batch, and the corrected biases are kept unless their SQNR is lower. This costs one float
    and two quantized forward passes of ``batches`` (one program per batch shape).

    Args:
      graph: the BN-folded model to correct.
      params: its params (the biases to correct).
      quant: its quantization spec.
      batches: the calibration batches, float32 ``(batch, ...)``; the correction's and the
        comparison's data.
      qstate: the calibrated states.
      mode: the correction's mode, one of :data:`BIAS_CORRECTION_MODES`.
      reference: the float model ``(graph, params)`` to compare against, when it is not
        ``(graph, params)`` (a post-calibration method, e.g. AdaRound, has moved the
        weights).

    Returns:
      ``(params, check)``: the kept params and a :class:`CorrectionCheck`.

    Raises:
      CalibrationError: see :func:`bias_correction`.
    """
    corrected = bias_correction(graph, params, quant, batches, qstate, mode=mode)
    g_ref, p_ref = (graph, params) if reference is None else reference

    # two programs per batch shape, the quantized one run with either set of biases (one
    # program computing all three outputs compiled the quantized model twice); compiling is
    # most of the guard's cost, so with XLA:CPU's faster-compiling emitters (a last-bit
    # difference in an output moves the SQNRs compared by far less than a correction does)
    opts = cpu_legacy_emitters()
    run_float = jax.jit(lambda p, x: jax.tree.leaves(execute(g_ref, p, x)),
                        compiler_options=opts)
    run_quant = jax.jit(lambda p, s, x: jax.tree.leaves(execute(graph, p, x, quant=quant,
                                                                qstate=s)),
                        compiler_options=opts)
    sums = np.zeros(3)
    for x in batches:
        x = jnp.asarray(x, jnp.float32)
        yf = [np.asarray(y, np.float64) for y in run_float(p_ref, x)]
        sums[0] += sum(float(np.sum(y * y)) for y in yf)
        for i, p in ((1, params), (2, corrected)):
            yq = run_quant(p, qstate, x)
            sums[i] += sum(float(np.sum((np.asarray(a, np.float64) - b) ** 2))
                           for a, b in zip(yq, yf, strict=True))
    before, after = sqnr_db(sums[0], sums[1]), sqnr_db(sums[0], sums[2])
    check = CorrectionCheck(mode, bool(after >= before), before, after)
    if not check.kept:
        log.warning("%s", check.describe())
    return (corrected if check.kept else params), check


class _Corrected:
    """The layers :func:`bias_correction` corrects (GEMMs with a kernel and a single weight
    format, in graph order) and their quantized kernels."""

    def __init__(self, graph: Graph, params: Params, quant: QuantSpec, qstate: QState | None):
        self.quant, self.qstate = quant, qstate
        self.names = [n.name for n in gemm_nodes(graph)
                      if n.name in quant and len(quant[n.name].weight_candidates) == 1
                      and "kernel" in params.get(n.name, {})]
        # pre-activation: the epilogue (a fused ReLU) left out
        self.nodes = {n.name: n.replace(attrs={k: v for k, v in n.attrs.items()
                                               if k != "epilogue"})
                      for n in gemm_nodes(graph) if n.name in self.names}

    def state(self, name: str, p: Params) -> Any:
        state = layer_state(self.quant, self.qstate, name)
        if state is None:
            lq = self.quant[name]
            state = lq.quantizer.init_state(self.nodes[name], lq, p[name]["kernel"])
        return state

    def kernel(self, name: str, p: Params) -> dict[str, jax.Array]:
        """``{"kernel": W_q}``, the layer's fake-quantized kernel (no bias)."""
        node, lq, w = self.nodes[name], self.quant[name], p[name]["kernel"]
        return {"kernel": lq.quantizer.quantize_kernel(node, lq, w, self.state(name, p))}

    def channel_mean(self, name: str, d: jax.Array) -> jax.Array:
        """``d``'s mean over every axis but the output channels'."""
        ax = _channel_axis(self.nodes[name], d.ndim)
        return jnp.mean(d, axis=tuple(i for i in range(d.ndim) if i != ax))


def _copy(params: Params) -> Params:
    return {k: dict(v) for k, v in params.items()}


def _correct(new: Params, names: Sequence[str], shifts: dict[str, np.ndarray]) -> None:
    """``bias -= shift`` for each layer of ``names`` (a zero bias added where none is)."""
    for name in names:
        b = (np.asarray(new[name]["bias"]) if "bias" in new[name]
             else np.zeros_like(shifts[name]))
        new[name]["bias"] = jax.device_put(b - shifts[name])


def _means(fn: Callable[..., dict[str, jax.Array]], p: Params,
           batches: Sequence[ArrayLike]) -> dict[str, np.ndarray]:
    """The mean of ``fn(p, x)``'s per-batch channel means over ``batches``."""
    # summed and divided on the host (float32 add and divide round as XLA's do): eagerly
    # each op compiled a program per layer shape
    total: dict[str, np.ndarray] | None = None
    count = 0
    for x in batches:
        s = {k: np.asarray(v) for k, v in fn(p, jnp.asarray(x, jnp.float32)).items()}
        total = s if total is None else {k: total[k] + s[k] for k in total}
        count += 1
    if total is None:  # (count == 0)
        raise CalibrationError("bias correction needs at least one batch; the iterator "
                               "was empty.")
    return {k: v / np.float32(count) for k, v in total.items()}


def _float_means(graph: Graph, params: Params, batches: Sequence[ArrayLike],
                 layers: _Corrected) -> dict[str, np.ndarray]:
    """``E[W x]`` per output channel of every corrected layer, in the float model."""
    names, nodes = layers.names, layers.nodes

    def float_mean(p, x):
        _, taps = execute(graph, p, x, observe=tap(names))
        return {n: layers.channel_mean(n, run_op(nodes[n], [taps[n][0]],
                                                 {"kernel": p[n]["kernel"]})[0])
                for n in names}

    return _means(jax.jit(float_mean), params, batches)


def _sequential(graph: Graph, params: Params, quant: QuantSpec, qstate: QState | None,
                batches: Sequence[ArrayLike], layers: _Corrected) -> Params:
    """``"model"`` mode in one layer-by-layer pass over the calibration data.

    The quantized model runs in graph order, in pieces that end at a corrected layer, over
    every batch, holding each batch's live activations between pieces (a tensor is dropped
    after its last reader): a piece measures its last layer's ``E[W_q x_q]``, the layer's
    bias is corrected, and the next piece starts by running that layer with its corrected
    bias. So each layer sees every corrected layer upstream of it corrected, as
    :func:`_sequential_in_waves` (the former form: one whole quantized run per wave) does,
    at the cost of about one quantized run plus each corrected layer once more. The pass is
    :class:`~npujax.quantize.methods._common.LayerPass` (AdaRound's and GPTQ's), each piece
    reducing its layer's output to the per-channel mean (:meth:`LayerPass.layer_reduce`).
    """
    y_float = _float_means(graph, params, batches, layers)
    new = _copy(params)
    if not layers.names:
        return new
    lp = LayerPass(graph, batches)
    for name in layers.names:
        def output_mean(x, p, name=name):  # E[W_q x_q] per channel, in the batch's piece
            y = run_op(layers.nodes[name], [x], layers.kernel(name, p))[0]
            return layers.channel_mean(name, y)

        means = lp.layer_reduce(name, new, quant, qstate, output_mean)
        total = np.zeros_like(y_float[name])  # (0 + m is m: summed as _means sums)
        for m in means:
            total = total + np.asarray(m)
        _correct(new, [name], {name: total / np.float32(len(means)) - y_float[name]})
    return new


def _sequential_in_waves(graph: Graph, params: Params, quant: QuantSpec, qstate: QState | None,
                         batches: Sequence[ArrayLike]) -> Params:
    """``"model"`` mode as it was first written (kept to test :func:`_sequential` against, and
    for ``experiments/bench/bias_correction_one_pass.py``): in waves of layers none of which
    feeds another (through any path), each wave measured by a whole quantized run of every
    batch with every earlier wave corrected. Same result as :func:`_sequential` up to float
    rounding; one quantized run per wave (47 on PP-OCR rec)."""
    layers = _Corrected(graph, params, quant, qstate)
    names, nodes = layers.names, layers.nodes
    wave: dict[str, int] = {}
    level: dict[str, int] = {}  # tensor -> corrected layers on its longest path
    for node in graph.nodes:
        lv = max((level.get(t, 0) for t in node.inputs), default=0)
        if node.name in nodes:
            wave[node.name] = lv
            lv += 1
        level.update((t, lv) for t in node.outputs)
    y_float = _float_means(graph, params, batches, layers)

    def quant_mean(p, x):  # E[y_q], the quantized model's input (fake-quantized)
        _, taps = execute(graph, p, x, quant=quant, qstate=qstate, observe=tap(names))
        return {n: layers.channel_mean(n, run_op(nodes[n], [taps[n][0]], layers.kernel(n, p))[0])
                for n in names}

    q_fn = jax.jit(quant_mean)
    new = _copy(params)
    for k in sorted(set(wave.values())):
        group = [n for n in names if wave[n] == k]
        y_q = _means(q_fn, new, batches)
        _correct(new, group, {n: y_q[n] - y_float[n] for n in group})
    return new


def deployed_biases(graph: Graph, params: Params, quant: QuantSpec, qstate: QState) -> Params:
    """``params`` with every bias that a QDQ file stores as int32 replaced by its value there.

    :func:`npujax.to_onnx` (``int32_bias=True``, the default) writes the bias of a layer with a
    quantized input and a single integer per-tensor or per-channel weight format as the codes
    ``round_half_even(b / (s_x * s_w))`` (:func:`npujax.numerics.fixed_point.quantize_bias`)
    dequantized by ``s_x * s_w`` (float32 product), the convention of integer NPUs and of
    onnxruntime's QLinearConv/QGemm, where the bias is added to the int32 accumulator. A float
    bias differs from it by up to half that step per output channel: fake-quant with the float
    bias is then not the model the file computes, and an example near a decision boundary (or
    an activation code at a rounding tie downstream) can come out differently. With these
    biases, :func:`npujax.ir.execute.execute`'s fake-quant computes what the file computes up
    to float summation order.

    Layers the exporter leaves with a float bias keep theirs: no quantized input, FP8 or
    per-block weights, several candidate formats (a search mixture), or codes beyond int32 (a
    channel whose weights are all ~0).

    Args:
      graph: the model.
      params: its params (float32 ``bias [C_out]`` where a layer has one).
      quant: its quantization spec.
      qstate: its calibrated states (the input grid ``s_x``; the weight grid ``s_w`` from the
        layer's quantizer, :meth:`~npujax.quantize.quantizers.Quantizer.weight_grid`).

    Returns:
      New params (the others shared); float32 biases on the int32 grid.

    References:
      ONNX ``DequantizeLinear`` and onnxruntime's QDQ format (bias: int32, scale =
      input scale x weight scale, zero point 0); Jacob et al. 2018, arXiv:1712.05877, section
      2.4 (int32 bias on the accumulator's grid).
    """
    new = dict(params)
    for node in gemm_nodes(graph):
        lq = quant.get(node.name)
        state = layer_state(quant, qstate, node.name) if lq is not None else None
        ps = params.get(node.name, {})
        if (lq is None or lq.act is None or state is None or "bias" not in ps
                or "kernel" not in ps or len(lq.weight_candidates) != 1
                or isinstance(lq.weight_candidates[0], FloatFormat)
                or lq.weight_block_size is not None):
            continue
        s_x = np.asarray(lq.quantizer.act_grid(lq, state)[0], np.float32).reshape(())
        kernel = np.asarray(ps["kernel"], np.float32)
        # per tensor the axes are unused (the exporter's view: a grouped ConvTranspose has no
        # single output-channel axis)
        view, axis, _ = (out_channel_view(node, kernel) if lq.weight_per_channel
                         else (kernel, 0, None))
        grid = lq.quantizer.weight_grid(node, lq, view, state, out_axis=axis, in_axis=0)
        s_w = np.asarray(grid.scale, np.float32)
        bias = np.asarray(ps["bias"], np.float32)
        codes = quantize_bias(bias, s_x, s_w)
        if codes.size and np.abs(codes).max() > np.iinfo(np.int32).max:
            continue
        step = np.broadcast_to(s_x * s_w, bias.shape).astype(np.float32)
        value = (codes.astype(np.float64) * step.astype(np.float64)).astype(np.float32)
        new[node.name] = {**ps, "bias": jax.device_put(value)}
    return new


def ptq(
    graph: Graph,
    params: Params,
    batches: Iterable[ArrayLike],
    quant: QuantSpec,
    *,
    observer: str | Callable[[], Observer] = "minmax",
    bias_correct: bool = True,
    bias_correction_mode: str = "model",
    bias_correction_guard: bool = True,
    progress: bool = False,
) -> tuple[Params, dict[str, Any]]:
    """Calibrate activation ranges, then (optionally) correct biases: the PTQ flow.

    The defaults are ``npujax quantize``'s (:class:`npujax.workflows.quantize.QuantizeConfig`):
    min-max calibration and the sequential bias correction (``"model"``), chosen on held-out
    validation data (``docs/results/quantization.md``, "Choosing the default").

    Args:
      graph: the BN-folded float model.
      params: its params.
      batches: calibration batches (iterated once; kept in memory for bias correction).
      quant: the quantization spec.
      observer: observer name or factory (see :func:`npujax.quantize.calibrate`).
      bias_correct: apply :func:`bias_correction` after calibration.
      bias_correction_mode: its ``mode``, one of :data:`BIAS_CORRECTION_MODES`; default
        ``"model"`` (each layer's mean output shift in the quantized model, layer after layer,
        in one layer-by-layer quantized pass over ``batches``); ``"weights"`` is the
        weight-only correction of Nagel et al. 2019 (one float pass), the default before
        2026-12-02.
      bias_correction_guard: keep the correction only if it does not lower the output SQNR
        on ``batches`` (:func:`guarded_bias_correction`; a warning says when it was dropped).
      progress: progress bar during calibration.

    Returns:
      ``(params, qstate)`` ready for :func:`npujax.ir.execute.execute` or
      :func:`npujax.backends.integer.convert`.

    Raises:
      CalibrationError: empty data, NaN/inf reaching a layer (named), or an unknown
        ``bias_correction_mode``.
    """
    if bias_correct and bias_correction_mode not in BIAS_CORRECTION_MODES:
        raise CalibrationError(f"bias correction mode {bias_correction_mode!r}: choose one of "
                               f"{list(BIAS_CORRECTION_MODES)}.")
    batches = list(batches)
    qstate = calibrate(graph, params, batches, quant, observer=observer, progress=progress)
    if bias_correct and bias_correction_guard:
        params, _ = guarded_bias_correction(graph, params, quant, batches, qstate,
                                            mode=bias_correction_mode)
    elif bias_correct:
        params = bias_correction(graph, params, quant, batches, qstate,
                                 mode=bias_correction_mode)
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

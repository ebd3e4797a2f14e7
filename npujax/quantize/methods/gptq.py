"""GPTQ: weight-only quantization with second-order error feedback (Frantar et al. 2023).

For a linear layer with weights ``W`` (``d_row`` outputs x ``d_col`` inputs, the paper's
orientation; npujax's Gemm kernel is ``W^T``) and calibration inputs ``X`` (``d_col`` x ``n``),
GPTQ quantizes ``W`` column by column, minimizing ``|| W X - Q X ||^2``. After a column is
rounded, its error is spread over the columns not yet quantized through the inverse Hessian of
that objective, ``H = 2 X X^T``. Algorithm 1 of the paper:

* dampening: ``H += percdamp * mean(diag H) * I`` (``percdamp = 0.01``); inputs that are never
  non-zero (``H_jj = 0``) get ``H_jj = 1`` and zero weights;
* ``U = Cholesky(H^-1)^T`` (upper), computed once;
* for each column ``j``: ``Q_:j = quant(W_:j)``, ``E_:j = (W_:j - Q_:j) / U_jj``,
  ``W_:,j: -= E_:j U_j,j:``; lazily within blocks of ``block_size`` (128) columns, whose
  accumulated errors update the remaining columns at once, ``W_:,i2: -= E U_i1:i2,i2:``
  (section 3, "lazy batch-updates" and "Cholesky reformulation").

Grid: the layer's integer format (``bits``: 4 or 3 in the paper; signed, narrow range,
symmetric, zero point 0 as npujax's weight grids are), one scale per output row and group of
``group_size`` consecutive input columns (default 128), the min-max ``max |w| / qmax`` of the
group's weights when its first column is reached, with all error feedback so far applied
(as Algorithm 1 without lazy batching; the reference code reads the columns past the current
block before that block's lazy update, which differs only for a group that starts inside a
block and ends past it). With ``act_order`` the columns are processed by
decreasing ``H_jj`` and the group scales are fixed up front from the original weights (the
reference code's ``static_groups``), so each group stays contiguous in the input dimension and
deploys as ONNX opset-21 blocked ``DequantizeLinear`` (``axis`` 0 of the ``[K, N]`` kernel,
``block_size = group_size``, the last block partial when ``K`` is not a multiple of it).

Sequential: layers are quantized in graph order and each reads its inputs from the model whose
preceding layers are already quantized (the reference implementation's order); layers that do
not feed each other (a block's Q, K and V projections) get their inputs from one run
(one run of the model per such wave). GPTQ runs on
Gemm layers (the paper's transformer linear layers); Conv layers are left as they are (a note
says so). The computation is float64 numpy on the host.

References:
  Frantar, Ashkboos, Hoefler, Alistarh 2023, "GPTQ: Accurate Post-Training Quantization for
  Generative Pre-trained Transformers", arXiv:2210.17323, section 3 and Algorithm 1; the
  reference code https://github.com/IST-DASLab/gptq (``gptq.py``: dampening, dead inputs,
  groups, ``act_order``, ``static_groups``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, ClassVar

import jax
import numpy as np
from jax.typing import ArrayLike

from npujax._progress import track
from npujax.errors import ConfigError
from npujax.ir.execute import layer_state
from npujax.ir.graph import Graph, Params
from npujax.numerics import MIN_SCALE, IntFormat, check_bits
from npujax.quantize.methods._common import (
    LayerPass,
    check_batches,
    copy_params,
    is_int,
    is_number,
    layer_taps,
    require,
    waves,
)
from npujax.quantize.methods.base import PTQMethod, PTQStep, Stage
from npujax.quantize.quantizers.fixed import FixedGrid, FixedGridState
from npujax.quantize.spec import LayerQuant, QuantSpec

__all__ = ["GPTQ", "gptq_quantize", "group_scales"]


def group_scales(w: np.ndarray, fmt: IntFormat, group_size: int) -> np.ndarray:
    """Symmetric min-max scales ``max |w| / qmax`` of ``w`` ``[rows, cols]`` per row and group
    of ``group_size`` columns: float32 ``[rows, ceil(cols / group_size)]``, at least
    :data:`~npujax.numerics.MIN_SCALE`."""
    rows, cols = w.shape
    ng = -(-cols // group_size)
    a = np.zeros((rows, ng * group_size))
    a[:, :cols] = np.abs(w)
    amax = a.reshape(rows, ng, group_size).max(axis=2)
    d = (fmt.qmax - fmt.qmin) / 2.0
    return np.maximum(amax / d, MIN_SCALE).astype(np.float32)


def _quant(w: np.ndarray, s: np.ndarray, fmt: IntFormat) -> np.ndarray:
    """Codes ``clip(round(w / s), qmin, qmax)`` (half to even)."""
    return np.clip(np.round(w / s), fmt.qmin, fmt.qmax)


def gptq_quantize(w: np.ndarray, h: np.ndarray, fmt: IntFormat, *, group_size: int,
                  block_size: int = 128, percdamp: float = 0.01, act_order: bool = False
                  ) -> tuple[np.ndarray, np.ndarray]:
    """GPTQ of one weight matrix (Algorithm 1, see the module docstring).

    Args:
      w: weights ``[rows, cols]`` (outputs x inputs), float.
      h: the Hessian ``2 X X^T / n`` ``[cols, cols]`` of the inputs.
      fmt: the signed integer format.
      group_size: columns per scale group (``cols`` or more: one group per row).
      block_size: columns per lazy batch update.
      percdamp: the dampening, a fraction of ``mean(diag H)``.
      act_order: process columns by decreasing ``diag H`` (static group scales).

    Returns:
      ``(codes, scales)``: int codes ``[rows, cols]`` (float64 holding integers in ``[qmin,
      qmax]``) and float32 scales ``[rows, groups]``; the quantized weights are
      ``codes * scales`` repeated over each group's columns.

    Raises:
      ConfigError: the dampened Hessian is not positive definite (non-finite inputs).
    """
    w = np.array(w, np.float64)
    h = np.array(h, np.float64)
    rows, cols = w.shape
    dead = np.diag(h) == 0
    h[dead, dead] = 1.0
    w[:, dead] = 0.0
    ng = -(-cols // group_size)
    scales = np.zeros((rows, ng), np.float32)
    perm = np.argsort(-np.diag(h), kind="stable") if act_order else np.arange(cols)
    if act_order:
        scales[:] = group_scales(w, fmt, group_size)
        w, h = w[:, perm], h[np.ix_(perm, perm)]
    h[np.diag_indices(cols)] += percdamp * np.mean(np.diag(h))
    try:
        hinv = np.linalg.inv(np.linalg.cholesky(h))  # L^-1, so H^-1 = L^-T L^-1
        u = np.linalg.cholesky(hinv.T @ hinv).T  # upper Cholesky factor of H^-1
    except np.linalg.LinAlgError as e:
        raise ConfigError("GPTQ: the dampened Hessian of the layer's inputs is not positive "
                          "definite; raise percdamp or check the calibration data.") from e
    codes = np.zeros((rows, cols))
    for i1 in range(0, cols, block_size):
        i2 = min(i1 + block_size, cols)
        w1 = w[:, i1:i2].copy()
        err = np.zeros((rows, i2 - i1))
        for i in range(i2 - i1):
            col = int(perm[i1 + i])
            g = col // group_size
            if not act_order and col % group_size == 0:
                # the group's weights with every error so far fed back (the columns past this
                # block have not received this block's lazy update yet)
                past = max(min(cols, col + group_size) - i2, 0)
                later = w[:, i2:i2 + past] - err[:, :i] @ u[i1:i1 + i, i2:i2 + past]
                current = np.concatenate([w1[:, i:], later], axis=1)[:, :group_size]
                scales[:, g] = group_scales(current, fmt, group_size)[:, 0]
            s = scales[:, g].astype(np.float64)
            q = _quant(w1[:, i], s, fmt)
            codes[:, i1 + i] = q
            d = (w1[:, i] - q * s) / u[i1 + i, i1 + i]
            w1[:, i:] -= np.outer(d, u[i1 + i, i1 + i:i2])
            err[:, i] = d
        w[:, i2:] -= err @ u[i1:i2, i2:]
    if act_order:
        codes = codes[:, np.argsort(perm)]
    return codes, scales


@dataclasses.dataclass(frozen=True, kw_only=True)
class GPTQ(PTQMethod):
    """GPTQ weight-only quantization of every Gemm layer (Frantar et al. 2023; see the module
    docstring).

    ``post_calibration``: sets each Gemm layer's weight format to ``bits`` with per-group
    scales (``weight_block_size = group_size``), its kernel to the GPTQ-quantized one and its
    quantizer to :class:`~npujax.quantize.quantizers.fixed.FixedGrid` holding the group scales
    (so :func:`npujax.to_onnx` writes exactly these codes as blocked ``DequantizeLinear``).

    Attributes:
      bits: weight width (the paper's 4 and 3; 2-8).
      group_size: input columns per scale (paper: 128); None: one scale per output channel.
      act_order: columns by decreasing Hessian diagonal, static group scales.
      percdamp: dampening as a fraction of the mean Hessian diagonal (paper: 0.01).
      block_size: columns per lazy batch update (paper: 128).
      weight_only: drop the layers' activation quantization (the paper's setting); False keeps
        ``quant``'s input formats (then calibrate first).
      progress: show a progress bar over the layers.

    Raises:
      ConfigError: a field out of range (named).
    """

    name: ClassVar[str] = "gptq"
    stage: ClassVar[Stage] = "post_calibration"

    bits: int = 4
    group_size: int | None = 128
    act_order: bool = False
    percdamp: float = 0.01
    block_size: int = 128
    weight_only: bool = True
    progress: bool = False

    def __post_init__(self) -> None:
        c = "GPTQ"
        require(is_int(self.bits) and 2 <= self.bits <= 8, c, "bits", self.bits,
                "an int in [2, 8] (paper: 4 or 3)")
        check_bits(self.bits, "GPTQ.bits")
        require(self.group_size is None or (is_int(self.group_size) and self.group_size >= 1),
                c, "group_size", self.group_size, "an int >= 1 or None (paper: 128)")
        require(isinstance(self.act_order, bool), c, "act_order", self.act_order,
                "True or False")
        require(is_number(self.percdamp) and 0 < self.percdamp <= 1, c, "percdamp",
                self.percdamp, "a fraction in (0, 1] (paper: 0.01)")
        require(is_int(self.block_size) and self.block_size >= 1, c, "block_size",
                self.block_size, "an int >= 1 (paper: 128)")
        require(isinstance(self.weight_only, bool), c, "weight_only", self.weight_only,
                "True or False")
        require(isinstance(self.progress, bool), c, "progress", self.progress, "True or False")

    @property
    def format(self) -> IntFormat:
        """The weight format: signed, narrow range, ``bits`` wide."""
        return IntFormat(self.bits, narrow_range=True)

    def apply(self, graph: Graph, params: Params, quant: QuantSpec,
              batches: Sequence[ArrayLike], qstate: dict[str, Any] | None) -> PTQStep:
        """Quantize every Gemm layer of ``quant`` that has a weight format, first to last.

        Returns:
          A :class:`~npujax.quantize.methods.PTQStep`; notes per layer: ``"fc1: int4, groups of
          128, output SQNR 18.2 dB (nearest 15.1 dB)"`` (on the calibration inputs).

        Raises:
          ConfigError: ``weight_only=False`` with input formats but no ``qstate``.
          CalibrationError: empty, NaN or inf batches.
        """
        return self._apply(graph, params, quant, batches, qstate)

    def _apply(self, graph: Graph, params: Params, quant: QuantSpec,
               batches: Sequence[ArrayLike], qstate: dict[str, Any] | None, *,
               one_pass: bool = True) -> PTQStep:
        """:meth:`apply`; ``one_pass=False`` runs the model once per wave of layers instead of
        once layer by layer (the former form: the same result up to float rounding; kept for
        tests and ``experiments/bench/ptq_one_pass.py``)."""
        data = check_batches(batches, "GPTQ")
        names = [n.name for n in graph.nodes if n.op == "Gemm" and n.name in quant
                 and quant[n.name].weight_candidates]
        skipped = [n.name for n in graph.nodes if n.op != "Gemm" and n.name in quant
                   and quant[n.name].weight_candidates]
        if not self.weight_only and qstate is None \
                and any(quant[n].act is not None for n in names):
            raise ConfigError("GPTQ with weight_only=False runs after calibration: pass the "
                              "calibrated qstate of this quant spec.")
        quant = dict(quant)
        qstate = dict(qstate or {})
        p = copy_params(params)
        done: dict[str, LayerQuant] = {}
        notes: list[str] = []
        if one_pass:
            run = LayerPass(graph, data)
            for name in track(names, "GPTQ", self.progress):
                # the input in the model whose earlier layers are quantized (and its own input
                # fake-quantized when it keeps its input format)
                own = {} if self.weight_only else {name: quant[name]}
                x = run.layer_input(name, p, {**done, **own}, qstate)
                self._layer(name, quant, qstate, p, x, done, notes)
        else:
            for wave in track(waves(graph, names), "GPTQ", self.progress):
                # the wave's inputs in the model whose earlier waves are quantized (and their
                # own input fake-quantized when they keep their input format); one run each
                own = {} if self.weight_only else {n: quant[n] for n in wave}
                taps = layer_taps(graph, p, data, wave, {**done, **own}, qstate)
                for name in wave:
                    self._layer(name, quant, qstate, p, taps[name][0], done, notes)
        notes += [f"{n}: left to the spec (GPTQ quantizes Gemm layers)" for n in skipped]
        return PTQStep(graph, p, quant, qstate, tuple(notes))

    def _layer(self, name: str, quant: dict[str, LayerQuant], qstate: dict[str, Any],
               p: Params, x: np.ndarray, done: dict[str, LayerQuant], notes: list[str]) -> None:
        """GPTQ one layer, updating ``p``, ``quant``, ``qstate``, ``done`` and ``notes``."""
        fmt = self.format
        old = quant[name]
        kernel = np.asarray(p[name]["kernel"], np.float32)  # [K, N]
        k_in = kernel.shape[0]
        group = self.group_size if self.group_size is not None else k_in
        lq = dataclasses.replace(
            old, weight=fmt, quantizer=FixedGrid(), weight_per_channel=True,
            act=None if self.weight_only else old.act,
            act_candidates=(), weight_block_size=self.group_size)
        state = layer_state(quant, qstate, name) if lq.act is not None else None
        x = x.reshape(-1, k_in).astype(np.float64)
        hess = 2.0 * (x.T @ x) / x.shape[0]
        codes, scales = gptq_quantize(kernel.T, hess, fmt, group_size=group,
                                      block_size=self.block_size, percdamp=self.percdamp,
                                      act_order=self.act_order)
        s_rep = np.repeat(scales, group, axis=1)[:, :k_in]
        wq = (codes.astype(np.float32) * s_rep).T.astype(np.float32)  # [K, N]
        if self.group_size is None:
            scale = scales[:, 0]  # per output channel: [N]
        else:
            scale = np.ascontiguousarray(scales.T)  # per block: [ceil(K / g), N]
        s_rtn = np.repeat(group_scales(kernel.T, fmt, group), group, axis=1)[:, :k_in]
        rtn = (_quant(kernel.T, s_rtn, fmt) * s_rtn).T  # round to nearest, same groups
        y = x @ kernel.astype(np.float64)
        sq = [10 * np.log10(np.sum(y * y) / max(np.sum((x @ v - y) ** 2), 1e-300))
              for v in (wq.astype(np.float64), rtn)]
        p[name]["kernel"] = jax.device_put(wq)
        act: tuple[Any, Any] = (None, None)
        if lq.act is not None:
            act = old.quantizer.act_grid(old, state)
        qstate[name] = FixedGridState(act[0], act[1], jax.device_put(scale.astype(
            np.float32)), jax.device_put(np.zeros(scale.shape, np.int32)))
        quant[name] = done[name] = lq
        grouping = "per channel" if self.group_size is None else \
            f"groups of {self.group_size}"
        notes.append(f"{name}: int{self.bits}, {grouping}, output SQNR {sq[0]:.1f} dB "
                     f"(nearest {sq[1]:.1f} dB)")

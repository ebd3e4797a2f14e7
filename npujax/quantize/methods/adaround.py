"""AdaRound: learned rounding of each layer's weights (Nagel et al. 2020).

Rounding every weight to the nearest grid point is not what minimizes a layer's output error.
AdaRound learns, per weight, whether to round down or up. With the layer's fixed grid
(scale ``s``, zero point ``z``) it optimizes a continuous ``V`` (one per weight):

    ``W~ = s * (clip(floor(W / s) + h(V) + z, qmin, qmax) - z)``
    ``h(V) = clip(sigmoid(V) (zeta - gamma) + gamma, 0, 1)``     (the rectified sigmoid)

minimizing the reconstruction of the layer's output plus a regularizer that drives ``h`` to 0
or 1:

    ``|| f(W x + b) - f(W~ x~ + b) ||^2 + lambda * sum_ij (1 - |2 h(V_ij) - 1|^beta)``

``f`` is the activation fused into the layer (the paper's reconstruction of the output after the
activation function). The target ``f(W x + b)`` is the float model's output on the float input
``x``; the quantized layer reads ``x~``, its input in the model whose preceding layers are
already AdaRounded (and whose activations are fake-quantized as ``quant`` says, the layer's own
input included): the paper's recommended "asymmetric reconstruction" (layers that do not feed
each other get their inputs from one run of the model). The squared error is
summed over each example's output and averaged over the mini-batch (drawn with replacement).
``beta`` is annealed linearly from ``beta_start`` (20) to ``beta_end`` (2) after a warm-up (the
first 20 % of the iterations) in which the regularizer is off; then the weights are rounded
hard, ``h = 1[V >= 0]``. ``V`` starts where ``h(V)`` equals the fractional part of ``W / s``
(the soft-rounded kernel starts at the float kernel). Adam (optax), learning rate 1e-3.

The layer keeps its grid: the result's kernels lie exactly on it, and the method switches the
layer to quantizer :class:`~npujax.quantize.quantizers.fixed.FixedGrid` with that grid in its
state (a min-max grid recomputed from the rounded kernel could differ where AdaRound rounded a
channel's largest weight down).

References:
  Nagel, Amjad, van Baalen, Louizos, Blankevoort 2020, "Up or Down? Adaptive Rounding for
  Post-Training Quantization", arXiv:2004.10568 (the method, and its defaults: zeta = 1.1,
  gamma = -0.1, lambda = 0.01, beta from 20 to 2, 10k iterations, Adam, 20 % warm-up).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike

from npujax._progress import track
from npujax.errors import ConfigError
from npujax.ir.execute import layer_state
from npujax.ir.graph import Graph, Node, Params
from npujax.numerics import IntFormat, broadcast_qparam, fake_quant
from npujax.ops import run_op
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
from npujax.quantize.quantizers.fixed import FixedGrid, FixedGridState, grid_axis
from npujax.quantize.spec import LayerQuant, QuantSpec

__all__ = ["AdaRound", "adaround_layer", "rectified_sigmoid"]


def rectified_sigmoid(v: jax.Array, zeta: float = 1.1, gamma: float = -0.1) -> jax.Array:
    """``h(V) = clip(sigmoid(V) (zeta - gamma) + gamma, 0, 1)`` (AdaRound's rectified sigmoid)."""
    return jnp.clip(jax.nn.sigmoid(v) * (zeta - gamma) + gamma, 0.0, 1.0)


def _layers(graph: Graph, quant: QuantSpec) -> list[Node]:
    return [n for n in graph.nodes if n.op in ("Conv", "Gemm") and n.name in quant
            and len(quant[n.name].weight_candidates) == 1
            and isinstance(quant[n.name].weight_candidates[0], IntFormat)]


def adaround_layer(node: Node, kernel: ArrayLike, bias: ArrayLike | None, scale: ArrayLike,
                   zero_point: ArrayLike, fmt: IntFormat, axis: int | None,
                   block_size: int | None, x_quant: ArrayLike, y_float: ArrayLike,
                   method: AdaRound) -> jax.Array:
    """AdaRound one layer: its hard-rounded kernel on the given grid.

    Args:
      node: the layer (Conv or Gemm; its fused activation is part of the reconstruction).
      kernel: its float kernel, f32 in the node's kernel layout.
      bias: its bias ``[C_out]`` or None.
      scale: the grid's scale (scalar, per channel on ``axis`` or per block).
      zero_point: its zero point, same shape.
      fmt: the integer weight format.
      axis: the grid's kernel axis (None: per tensor).
      block_size: the block length along ``axis`` (None: not per block).
      x_quant: the layer's inputs ``(n, ...)`` as the quantized model feeds it.
      y_float: the float layer's outputs ``(n, ...)`` on the float inputs (the target).
      method: the hyper-parameters.

    Returns:
      f32 kernel of ``kernel``'s shape whose values are ``s * (k - z)`` with integer codes ``k``
      in ``[qmin, qmax]``.
    """
    fixed = {} if bias is None else {"bias": jnp.asarray(bias, jnp.float32)}
    x = jnp.asarray(x_quant, jnp.float32)
    y = jnp.asarray(y_float, jnp.float32)
    n = x.shape[0]
    batch = min(method.batch_size, n)
    iters = method.iterations
    warm = int(round(method.warmup * iters))
    zeta, gamma = method.zeta, method.gamma
    import optax  # here: npujax.lower and the rest of PTQ do not need it (0.05 s to import)

    opt = optax.adam(method.learning_rate)

    def run(w, scale, zero_point, fixed, x, y):
        s = broadcast_qparam(scale, w.shape, axis, "scale", block_size)
        z = broadcast_qparam(zero_point.astype(jnp.float32), w.shape, axis, "zero_point",
                             block_size)
        floor = jnp.floor(w / s)
        rest = jnp.clip(w / s - floor, 1e-6, 1.0 - 1e-6)
        v0 = -jnp.log((zeta - gamma) / (rest - gamma) - 1.0)  # h(v0) = rest: W~ = W

        def soft(v):
            h = rectified_sigmoid(v, zeta, gamma)
            return s * (jnp.clip(floor + h + z, fmt.qmin, fmt.qmax) - z)

        def loss(v, xb, yb, beta, lam):
            out = run_op(node, [xb], {"kernel": soft(v), **fixed})[0]
            rec = jnp.sum((out - yb) ** 2) / xb.shape[0]
            h = rectified_sigmoid(v, zeta, gamma)
            return rec + lam * jnp.sum(1.0 - jnp.abs(2.0 * h - 1.0) ** beta)

        def step(carry, t):
            v, state = carry
            idx = jax.random.randint(jax.random.fold_in(jax.random.PRNGKey(method.seed), t),
                                     (batch,), 0, n)
            # beta: linear from beta_start to beta_end after the warm-up; no regularizer before
            rel = jnp.clip((t.astype(jnp.float32) - warm) / max(iters - warm, 1), 0.0, 1.0)
            beta = method.beta_end + (method.beta_start - method.beta_end) * (1.0 - rel)
            lam = jnp.where(t < warm, 0.0, method.reg_weight)
            g = jax.grad(loss)(v, x[idx], y[idx], beta, lam)
            upd, state = opt.update(g, state, v)
            return (optax.apply_updates(v, upd), state), None

        v = jax.lax.scan(step, (v0, opt.init(v0)), jnp.arange(iters))[0][0]
        codes = jnp.clip(floor + (v >= 0).astype(jnp.float32) + z, fmt.qmin, fmt.qmax)
        return (codes - z) * s

    with jax.numpy_dtype_promotion("standard"):  # optax's Adam mixes int counts and floats
        return jax.jit(run)(jnp.asarray(kernel, jnp.float32), jnp.asarray(scale, jnp.float32),
                            jnp.asarray(zero_point, jnp.int32), fixed, x, y)


@dataclasses.dataclass(frozen=True, kw_only=True)
class AdaRound(PTQMethod):
    """AdaRound, layer by layer in graph order (Nagel et al. 2020; see the module docstring).

    ``post_calibration``: every Conv/Gemm layer of ``quant`` with one integer weight format is
    rounded on its quantizer's grid (``weight_grid``: min-max per channel, tensor or block, or a
    learned LSQ step), then switched to the :class:`~npujax.quantize.quantizers.fixed.FixedGrid`
    quantizer holding that grid.

    Attributes:
      iterations: Adam steps per layer (paper: 10,000; tests use a few hundred).
      batch_size: examples per step, drawn from the calibration data (paper: 32).
      learning_rate: Adam's learning rate (paper: 1e-3).
      reg_weight: ``lambda``, the regularizer's weight (paper: 0.01).
      beta_start, beta_end: the annealed exponent ``beta`` (paper: 20 -> 2).
      warmup: fraction of the iterations without the regularizer (paper: 0.2).
      zeta, gamma: the rectified sigmoid's stretch (paper: 1.1, -0.1).
      seed: seed of the mini-batch sampling.
      progress: show a progress bar over the layers.

    Raises:
      ConfigError: a field out of range (named).
    """

    name: ClassVar[str] = "adaround"
    stage: ClassVar[Stage] = "post_calibration"

    iterations: int = 10000
    batch_size: int = 32
    learning_rate: float = 1e-3
    reg_weight: float = 0.01
    beta_start: float = 20.0
    beta_end: float = 2.0
    warmup: float = 0.2
    zeta: float = 1.1
    gamma: float = -0.1
    seed: int = 0
    progress: bool = False

    def __post_init__(self) -> None:
        c = "AdaRound"
        require(is_int(self.iterations) and self.iterations >= 1, c, "iterations",
                self.iterations, "an int >= 1 (paper: 10000)")
        require(is_int(self.batch_size) and self.batch_size >= 1, c, "batch_size",
                self.batch_size, "an int >= 1 (paper: 32)")
        require(is_number(self.learning_rate) and self.learning_rate > 0, c, "learning_rate",
                self.learning_rate, "a finite number > 0 (paper: 1e-3)")
        require(is_number(self.reg_weight) and self.reg_weight >= 0, c, "reg_weight",
                self.reg_weight, "a finite number >= 0 (paper: 0.01)")
        for f in ("beta_start", "beta_end"):
            v = getattr(self, f)
            require(is_number(v) and v > 0, c, f, v, "a finite number > 0 (paper: 20 -> 2)")
        require(self.beta_start >= self.beta_end, c, "beta_start", self.beta_start,
                f">= beta_end ({self.beta_end}): beta is annealed downwards")
        require(is_number(self.warmup) and 0 <= self.warmup < 1, c, "warmup", self.warmup,
                "a fraction in [0, 1) (paper: 0.2)")
        require(is_number(self.zeta) and self.zeta > 1, c, "zeta", self.zeta,
                "a number > 1 (paper: 1.1), so h reaches 1")
        require(is_number(self.gamma) and self.gamma < 0, c, "gamma", self.gamma,
                "a number < 0 (paper: -0.1), so h reaches 0")
        require(is_int(self.seed), c, "seed", self.seed, "an int")
        require(isinstance(self.progress, bool), c, "progress", self.progress, "True or False")

    def apply(self, graph: Graph, params: Params, quant: QuantSpec,
              batches: Sequence[ArrayLike], qstate: dict[str, Any] | None) -> PTQStep:
        """Round every eligible layer (see the class docstring), first to last.

        Returns:
          A :class:`~npujax.quantize.methods.PTQStep`: params with the rounded kernels, ``quant``
          with those layers on ``FixedGrid``, their states holding the grid, and per layer a
          note ``"conv1: output MSE 1.2e-3 (nearest) -> 4.0e-4 (AdaRound), 8 % rounded the other
          way"``.

        Raises:
          ConfigError: ``qstate`` is None while layers quantize their inputs (calibrate first).
          CalibrationError: empty, NaN or inf batches.
        """
        return self._apply(graph, params, quant, batches, qstate)

    def _apply(self, graph: Graph, params: Params, quant: QuantSpec,
               batches: Sequence[ArrayLike], qstate: dict[str, Any] | None, *,
               one_pass: bool = True) -> PTQStep:
        """:meth:`apply`; ``one_pass=False`` runs the model once per wave of layers instead of
        once layer by layer, with every layer's float input and output computed first and held
        together (the former form: the same result up to float rounding, its memory the
        whole model's taps over all the calibration data; kept for tests and
        ``experiments/bench/ptq_one_pass.py``)."""
        data = check_batches(batches, "AdaRound")
        layers = _layers(graph, quant)
        if qstate is None and any(quant[n.name].act is not None for n in layers):
            raise ConfigError("AdaRound runs after calibration: pass the calibrated qstate "
                              "(npujax.calibrate) of this quant spec.")
        qstate = dict(qstate or {})
        quant = dict(quant)
        p = copy_params(params)
        done: dict[str, LayerQuant] = {}
        notes: list[str] = []
        nodes = {n.name: n for n in layers}
        grouped = waves(graph, list(nodes))
        # a first wave that quantizes nothing reads the float inputs
        first = grouped[0] if grouped else []
        floats = set() if any(quant[n].act is not None for n in first) else set(first)
        if one_pass:
            # two passes side by side, layer by layer: the float model's (each layer's target,
            # computed right before the layer is optimized) and the quantized model's, so that
            # what is held is one layer's tensors and the activations crossing it
            ref = LayerPass(graph, data)
            run = LayerPass(graph, data)
            for name in track([n.name for n in layers], "AdaRound", self.progress):
                x, y = ref.layer_io(name, params, {}, None)
                # the input as the quantized model feeds it: every layer before it AdaRounded
                xq = x if name in floats else run.layer_input(name, p, {**done, name: quant[name]},
                                                              qstate)
                del x
                self._layer(nodes[name], quant, qstate, p, xq, y, done, notes)
                del xq, y
        else:
            float_io = layer_taps(graph, params, data, [n.name for n in layers])
            for wave in track(grouped, "AdaRound", self.progress):
                # the inputs as the quantized model feeds them (earlier waves AdaRounded; the
                # layers of one wave do not feed each other, so one run serves them all)
                taps = (float_io if set(wave) <= floats else
                        layer_taps(graph, p, data, wave, {**done, **{n: quant[n] for n in wave}},
                                   qstate))
                for name in wave:
                    self._layer(nodes[name], quant, qstate, p, taps[name][0], float_io[name][1],
                                done, notes)
        if not layers:
            notes.append("adaround: no Conv/Gemm layer with an integer weight format")
        return PTQStep(graph, p, quant, qstate, tuple(notes))

    def _layer(self, node: Node, quant: dict[str, LayerQuant], qstate: dict[str, Any],
               p: Params, xq: np.ndarray, y: np.ndarray, done: dict[str, LayerQuant],
               notes: list[str]) -> None:
        """AdaRound one layer, updating ``p``, ``quant``, ``qstate``, ``done`` and ``notes``."""
        name, lq = node.name, quant[node.name]
        (fmt,) = lq.weight_candidates
        assert isinstance(fmt, IntFormat)  # (_layers keeps integer formats only)
        state = layer_state(quant, qstate, name)
        w = np.asarray(p[name]["kernel"], np.float32)
        grid = lq.quantizer.weight_grid(node, lq, w, state)
        bias = p[name].get("bias")
        wq = adaround_layer(node, w, bias, grid.scale, grid.zero_point, fmt, grid_axis(node, lq),
                            lq.weight_block_size, xq, y, self)
        mse, other = _compare(node, lq, min(self.batch_size, len(xq)), jnp.asarray(w), wq,
                              grid.scale, grid.zero_point,
                              {} if bias is None else {"bias": jnp.asarray(bias)},
                              jnp.asarray(xq), jnp.asarray(y))
        p[name]["kernel"] = jax.device_put(np.asarray(wq, np.float32))
        act = (None, None) if lq.act is None else lq.quantizer.act_grid(lq, state)
        qstate[name] = FixedGridState(act[0], act[1], grid.scale, grid.zero_point,
                                      getattr(state, "operand_scale", None),
                                      getattr(state, "operand_zero_point", None))
        quant[name] = done[name] = dataclasses.replace(lq, quantizer=FixedGrid())
        notes.append(f"{name}: output MSE {float(mse[0]):.3g} (nearest) -> {float(mse[1]):.3g} "
                     f"(AdaRound), {100 * float(other):.1f} % rounded the other way")


@functools.partial(jax.jit, static_argnums=(0, 1, 2))
def _compare(node: Node, lq: LayerQuant, chunk: int, w, wq, scale, zero_point, fixed, x, y):
    """``([MSE nearest, MSE AdaRound], fraction of weights rounded the other way)`` on the
    layer's quantized inputs vs its float outputs, ``chunk`` examples at a time (the layer run
    on all of them at once took up to 25x its input's memory: XLA:CPU's grouped convolutions,
    1.5 GB for a 56 MB input on PP-OCR rec)."""
    (fmt,) = lq.weight_candidates
    rtn = fake_quant(w, scale, zero_point, fmt, grid_axis(node, lq),
                     block_size=lq.weight_block_size)
    n = x.shape[0]
    pieces = -(-n // chunk)
    pad = pieces * chunk - n
    xs = jnp.pad(x, [(0, pad)] + [(0, 0)] * (x.ndim - 1)).reshape(pieces, chunk, *x.shape[1:])
    ys = jnp.pad(y, [(0, pad)] + [(0, 0)] * (y.ndim - 1)).reshape(pieces, chunk, *y.shape[1:])
    valid = (jnp.arange(pieces * chunk) < n).reshape(pieces, chunk)

    def sse(args):  # [nearest, AdaRound] squared error summed over the chunk's real examples
        xb, yb, ok = args
        return jnp.stack([
            jnp.sum(jnp.where(ok, jnp.sum(((run_op(node, [xb], {"kernel": k, **fixed})[0] - yb)
                                           ** 2).reshape(chunk, -1), axis=1), 0.0))
            for k in (rtn, wq)])

    mse = jnp.sum(jax.lax.map(sse, (xs, ys, valid)), axis=0) / y.size
    return mse, jnp.mean((wq != rtn).astype(jnp.float32))

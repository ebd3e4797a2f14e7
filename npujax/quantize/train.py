"""Training and evaluation of a Graph with optax: float fine-tuning and QAT.

QAT here is fake-quant fine-tuning: :func:`npujax.execute` inserts fake-quant operators
(straight-through gradients, see :mod:`npujax.numerics.core`) on every quantized layer's weights and
input activation, and optax updates the float "shadow" weights (Jacob et al. 2018,
arXiv:1712.05877; Krishnamoorthi 2018, arXiv:1806.08342). With the STE, activation ranges stay
at their calibrated values; a quantizer with ``learned_fields`` (LSQ, LSQ+) learns them jointly
with the weights (Esser et al. 2020, arXiv:1902.08153; Bhalgat et al. 2020, arXiv:2004.09576;
see :mod:`npujax.quantize.quantizers.lsq`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Literal, overload

import jax
import numpy as np
import optax

from npujax._progress import progress_bar
from npujax.errors import ConfigError, ShapeError
from npujax.ir.execute import execute
from npujax.ir.graph import Graph, Params
from npujax.ir.passes import fold_batchnorm, frozen_bn_stats
from npujax.quantize.parallel import Devices, data_parallel
from npujax.quantize.quantizers import QState, merge_learned, split_learned
from npujax.quantize.spec import QuantSpec
from npujax.quantize.weights import check_weights

__all__ = ["batch_iterator", "train_graph", "evaluate", "cross_entropy"]

log = logging.getLogger(__name__)


def batch_iterator(
    x: np.ndarray, y: np.ndarray, batch_size: int, seed: int
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Endless shuffled mini-batches; each epoch is a new permutation (seeded, reproducible).

    Raises:
      ShapeError: if ``x`` and ``y`` have different lengths or are empty.
      ConfigError: if ``batch_size`` < 1.
    """
    if len(x) != len(y) or len(x) == 0:
        raise ShapeError(f"x and y must be non-empty and of equal length, got {len(x)}, {len(y)}.")
    if batch_size < 1:
        raise ConfigError(f"batch_size must be >= 1, got {batch_size}.")
    rng = np.random.default_rng(seed)
    bs = min(batch_size, len(x))
    while True:
        perm = rng.permutation(len(x))
        for i in range(0, len(x) - bs + 1, bs):
            idx = perm[i : i + bs]
            yield x[idx], y[idx]


def cross_entropy(logits: jax.Array, labels: jax.Array) -> jax.Array:
    """Mean softmax cross-entropy with integer labels (``optax``)."""
    return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()


def _is_batches(x: Any) -> bool:
    """Whether ``x`` is an iterable of batches rather than an array of inputs: an iterator or a
    loader without a length, or a sequence whose first item is a pair of arrays."""
    if not hasattr(x, "__len__") or not hasattr(x, "__getitem__"):
        return True
    first = x[0] if len(x) else None
    return isinstance(first, tuple | list) and len(first) == 2 and all(
        hasattr(v, "shape") for v in first)


# The result's type follows return_qstate: params alone, or (params, qstate).
@overload
def train_graph(
    graph: Graph, params: Params, x: np.ndarray | Iterable[tuple[Any, Any]],
    y: np.ndarray | None = ..., *, steps: int | None = ...,
    learning_rate: float = ..., batch_size: int = ..., quant: QuantSpec | None = ...,
    qstate: QState | None = ..., seed: int = ..., progress: bool = ..., description: str = ...,
    fold_bn: bool = ..., loss_fn: Callable[[jax.Array, jax.Array], jax.Array] | None = ...,
    return_qstate: Literal[False] = ..., optimizer: optax.GradientTransformation | None = ...,
    devices: Devices = ...,
) -> Params: ...
@overload
def train_graph(
    graph: Graph, params: Params, x: np.ndarray | Iterable[tuple[Any, Any]],
    y: np.ndarray | None = ..., *, steps: int | None = ...,
    learning_rate: float = ..., batch_size: int = ..., quant: QuantSpec | None = ...,
    qstate: QState | None = ..., seed: int = ..., progress: bool = ..., description: str = ...,
    fold_bn: bool = ..., loss_fn: Callable[[jax.Array, jax.Array], jax.Array] | None = ...,
    return_qstate: Literal[True], optimizer: optax.GradientTransformation | None = ...,
    devices: Devices = ...,
) -> tuple[Params, dict[str, Any]]: ...
@overload
def train_graph(
    graph: Graph, params: Params, x: np.ndarray | Iterable[tuple[Any, Any]],
    y: np.ndarray | None = ..., *, steps: int | None = ...,
    learning_rate: float = ..., batch_size: int = ..., quant: QuantSpec | None = ...,
    qstate: QState | None = ..., seed: int = ..., progress: bool = ..., description: str = ...,
    fold_bn: bool = ..., loss_fn: Callable[[jax.Array, jax.Array], jax.Array] | None = ...,
    return_qstate: bool = ..., optimizer: optax.GradientTransformation | None = ...,
    devices: Devices = ...,
) -> Params | tuple[Params, dict[str, Any]]: ...
def train_graph(
    graph: Graph,
    params: Params,
    x: np.ndarray | Iterable[tuple[Any, Any]],
    y: np.ndarray | None = None,
    *,
    steps: int | None = None,
    learning_rate: float = 1e-4,
    batch_size: int = 64,
    quant: QuantSpec | None = None,
    qstate: QState | None = None,
    seed: int = 0,
    progress: bool = False,
    description: str = "training",
    fold_bn: bool = False,
    loss_fn: Callable[[jax.Array, jax.Array], jax.Array] | None = None,
    return_qstate: bool = False,
    optimizer: optax.GradientTransformation | None = None,
    devices: Devices = None,
) -> Params | tuple[Params, dict[str, Any]]:
    """Fine-tune ``params`` of ``graph`` with an optax optimizer (default: Adam with a
    cosine-decayed learning rate).

    Args:
      graph: the model graph.
      params: initial params ``{node: {role: array}}``.
      x: training inputs ``(n, ...)`` float32 (with ``y``), or any iterable of ``(inputs,
        targets)`` batches (a data loader; then ``y`` is None).
      y: integer labels ``(n,)`` (or the targets of ``loss_fn``); None when ``x`` yields batches.
      steps: optimizer steps (>= 1). Required with arrays and with the default optimizer (its
        schedule needs the length); with batches and an ``optimizer``, None trains until the
        iterable is exhausted.
      learning_rate: peak learning rate of the default optimizer (unused with ``optimizer``).
      batch_size: mini-batch size (arrays only).
      quant: fake-quant placement; None trains in float. Layers with ``stochastic_rounding``
        round stochastically, a fresh key per step from ``seed``.
      qstate: the layers' calibrated states (from :func:`npujax.calibrate`).
      seed: shuffling seed.
      progress: show a progress bar with the running loss.
      description: label of the progress bar.
      fold_bn: train an unfolded graph (Conv/Gemm followed by BatchNormalization) through its
        BN-folded form: every step folds the BN running statistics (frozen, no gradient) and the
        trainable BN scale/shift into the kernel and bias before fake-quantization, so QAT sees
        the weight grid deployment uses (Krishnamoorthi 2018, arXiv:1806.08342, section 3.2;
        Jacob et al. 2018, section 3.2). A BN scale of zero folds to a zero channel, not NaN.
      loss_fn: ``loss_fn(output, target_batch) -> f32[]``; softmax cross-entropy by default
        (e.g. a distillation loss from :mod:`npujax.search.objective`).
      return_qstate: also return the qstate with the learned state fields (each quantizer's
        ``learned_fields``, e.g. LSQ's ``act_scale`` and ``weight_step``), which are optimised
        jointly with the params by the same Adam and projected after each update (LSQ: steps
        ``>= MIN_SCALE``). Required when ``quant`` has such layers, so learned steps are never
        dropped silently.
      optimizer: any optax ``GradientTransformation`` (e.g. ``optax.adamw(1e-4)``, a chain with
        clipping); it trains the params and the learned quantizer fields together.
      devices: data-parallel training (:mod:`npujax.quantize.parallel`): ``"all"`` local
        devices, a count, or a list of ``jax.Device``; every global batch is split over them on
        a ``Mesh`` axis ``data`` and the state replicated, so the result equals the one-device
        run on the same global batches up to float rounding (the batch mean is summed in
        another order). None (default): one device.

    Returns:
      The trained params (unfolded when ``fold_bn``; fold them with
      :func:`npujax.ir.fold_batchnorm` for deployment); with ``return_qstate``, the pair
      ``(params, qstate)``.

    Raises:
      ConfigError: ``steps`` < 1 or missing where required, ``y`` given with an iterable of
        batches, a batch that is not an ``(inputs, targets)`` pair, an ``optimizer`` that is
        not an optax ``GradientTransformation``,
        LSQ layers in ``quant`` without ``return_qstate=True``, no batch at all, or
        with ``devices``, a batch not divisible by the device count.
      CalibrationError: a NaN/inf or too large weight (names the layer).
    """
    check_weights(params)
    arrays = y is not None
    if arrays and not isinstance(x, np.ndarray | jax.Array) and _is_batches(x):
        raise ConfigError(f"train_graph: y is given with an iterable of batches as x (a "
                          f"{type(x).__name__}); pass arrays x and y, or batches of "
                          "(inputs, targets) as x with y=None.")
    if optimizer is not None and not (callable(getattr(optimizer, "init", None))
                                      and callable(getattr(optimizer, "update", None))):
        raise ConfigError(f"optimizer must be an optax GradientTransformation (e.g. "
                          f"optax.adam(1e-3)), got {type(optimizer).__name__} {optimizer!r}.")
    if not arrays and isinstance(x, np.ndarray | jax.Array):
        raise ConfigError("train_graph got input arrays without targets y; pass y, or an "
                          "iterable of (inputs, targets) batches as x.")
    if steps is None and (arrays or optimizer is None):
        raise ConfigError("steps is required with arrays (x, y) and with the default "
                          "optimizer (its cosine schedule needs the length).")
    if steps is not None and steps < 1:
        raise ConfigError(f"steps must be >= 1, got {steps}.")
    quant = quant or {}
    learned, full = split_learned(quant, qstate)
    if learned and not return_qstate:
        raise ConfigError(f"layers {sorted(learned)} learn their quantization steps (LSQ); pass "
                          "return_qstate=True and use the returned qstate with the params.")
    opt = optimizer if optimizer is not None else optax.adam(
        optax.cosine_decay_schedule(learning_rate, steps))
    dp = data_parallel(devices)
    if dp is not None and arrays:  # before any compilation
        dp.check(min(batch_size, len(np.asarray(x))), "batch_size")
    # one compiled program (eagerly the optimizer's zeros compile one per parameter shape)
    opt_state = jax.jit(opt.init)((params, learned))

    run_graph, transform = graph, lambda p: p
    if fold_bn:
        run_graph = fold_batchnorm(graph, params)[0]
        transform = lambda p: fold_batchnorm(graph, frozen_bn_stats(graph, p))[1]

    task = cross_entropy if loss_fn is None else loss_fn
    stochastic = any(lq.stochastic_rounding for lq in quant.values())

    @jax.jit
    def step(state, opt_state, xb, yb, key):
        def objective(st):
            p, lq = st
            qs = merge_learned(lq, full) if lq else qstate
            logits = execute(run_graph, transform(p), xb, quant=quant, qstate=qs,
                             key=key if stochastic else None)
            return task(logits, yb)

        loss, grads = jax.value_and_grad(objective)(state)
        updates, opt_state = opt.update(grads, opt_state, state)
        p, lq = optax.apply_updates(state, updates)
        lq = {n: quant[n].quantizer.project(v) for n, v in lq.items()}
        return (p, lq), opt_state, loss

    batches: Iterator[tuple[Any, Any]] = (
        batch_iterator(np.asarray(x), np.asarray(y), batch_size, seed) if arrays
        else iter(x))
    base_key = jax.random.key(seed)
    state: Any = (params, learned)
    place: Callable[[Any], Any] = to_device
    if dp is not None:
        state, opt_state, base_key = dp.replicate((state, opt_state, base_key))
        place = dp.shard
    done = 0
    with progress_bar(progress, description, steps) as advance:
        for i, batch in enumerate(batches):
            if steps is not None and i >= steps:
                break
            if not isinstance(batch, tuple | list) or len(batch) != 2:
                raise ConfigError(f"train_graph: batch {i} of the iterable is a "
                                  f"{type(batch).__name__}, not a pair (inputs, targets); "
                                  "yield (x, y) pairs, e.g. zip(x_batches, y_batches).")
            xb, yb = batch
            state, opt_state, loss = step(state, opt_state, place(xb), place(yb),
                                          jax.random.fold_in(base_key, i))
            advance(loss)
            done += 1
    if done == 0:
        raise ConfigError("train_graph got no training batch; the iterable was empty.")
    if steps is not None and done < steps:
        log.warning(f"train_graph: the iterable of batches ended after {done} of the {steps} "
                    "steps asked for (a default optimizer's cosine schedule did not reach its "
                    "end); pass a longer (or repeating) iterable, or steps=None with an "
                    "optimizer to train until it ends.")
    params, learned = state
    if return_qstate:
        return params, merge_learned(learned, full)
    return params


def to_device(a: Any) -> jax.Array:
    """``jnp.asarray(a)`` without compiling: ``jnp.asarray`` of a numpy array compiles a small
    program per shape and dtype (jax 0.10), ``jax.device_put`` of it does not (same values,
    dtypes canonicalized alike: float64 as float32 unless x64 is on)."""
    return a if isinstance(a, jax.Array) else jax.device_put(np.asarray(a))


def evaluate(
    graph: Graph,
    params: Params,
    x: np.ndarray,
    y: np.ndarray,
    *,
    quant: QuantSpec | None = None,
    qstate: QState | None = None,
    batch_size: int = 512,
) -> float:
    """Top-1 accuracy of ``graph`` on ``(x, y)`` (float, or fake-quant with ``quant``).

    Args:
      graph: the model.
      params: its params.
      x: inputs ``(n, ...)`` float32.
      y: integer labels ``(n,)``.
      quant: the fake-quant spec (None: float).
      qstate: its states.
      batch_size: evaluation batch size.

    Returns:
      The fraction of correct top-1 predictions.
    """
    fn = jax.jit(lambda p, xb: execute(graph, p, xb, quant=quant, qstate=qstate))
    y = np.asarray(y)
    correct = 0
    for i in range(0, len(x), batch_size):
        logits = np.asarray(fn(params, to_device(x[i : i + batch_size])))
        # counted on the host: eager jnp ops compiled three programs per batch shape
        correct += int(np.sum(np.argmax(logits, -1) == y[i : i + batch_size]))
    return correct / len(x)

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

import dataclasses
import logging
import math
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, NamedTuple

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

__all__ = ["TrainConfig", "TrainResult", "batch_iterator", "train_graph", "evaluate",
           "cross_entropy"]

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


@dataclasses.dataclass(frozen=True, kw_only=True)
class TrainConfig:
    """How :func:`train_graph` trains: optimizer, schedule, batches, seed, display; validated once.

    What is trained (the graph, its params, the fake-quant placement ``quant`` and its calibrated
    ``qstate``) and the data are :func:`train_graph`'s arguments, so one config serves a float
    fine-tune and every QAT variant of a model.

    Attributes:
      steps: optimizer steps (int >= 1). None trains until an iterable of batches ends; it needs
        an ``optimizer`` (the default optimizer's cosine schedule needs the length) and batches
        (with arrays ``x, y``, :func:`train_graph` asks for ``steps``).
      learning_rate: peak learning rate (finite, > 0) of the default optimizer, Adam with a
        cosine-decayed schedule over ``steps``; unused with ``optimizer``.
      batch_size: mini-batch size in examples (>= 1) when the data are arrays (capped at their
        length); an iterable's batches keep their own size.
      seed: seed (int in ``[0, 2**32)``) of the shuffling of arrays and of the per-step keys of
        layers with ``stochastic_rounding``.
      optimizer: any optax ``GradientTransformation`` (e.g. ``optax.adamw(1e-4)``, a chain with
        clipping); it trains the params and the learned quantizer fields together. None: Adam
        on the cosine schedule above.
      loss_fn: ``loss_fn(output, target_batch) -> f32[]``; None: softmax cross-entropy with
        integer labels (:func:`cross_entropy`). E.g. a distillation loss from
        :mod:`npujax.search.objective`.
      fold_bn: train an unfolded graph (Conv/Gemm followed by BatchNormalization) through its
        BN-folded form: every step folds the BN running statistics (frozen, no gradient) and the
        trainable BN scale/shift into the kernel and bias before fake-quantization, so QAT sees
        the weight grid deployment uses (Krishnamoorthi 2018, arXiv:1806.08342, section 3.2;
        Jacob et al. 2018, section 3.2). A BN scale of zero folds to a zero channel, not NaN.
      devices: data-parallel training (:mod:`npujax.quantize.parallel`): ``"all"`` local
        devices, a count (>= 1), or a sequence of ``jax.Device`` (kept as a tuple); every
        global batch is split over them on a ``Mesh`` axis ``data`` and the state replicated,
        so the result equals the one-device run on the same global batches up to float
        rounding (the batch mean is summed in another order). None: one device.
      progress: show a progress bar with the running loss.
      description: label of the progress bar.

    Raises:
      ConfigError: a field of the wrong type or out of range (the message names the field,
        the value received and the fix), or ``steps=None`` without an ``optimizer``.

    Examples:
      >>> import optax
      >>> from npujax.quantize import TrainConfig
      >>> TrainConfig(steps=500, learning_rate=1e-4, batch_size=64).seed
      0
      >>> TrainConfig(optimizer=optax.sgd(0.1)).steps is None  # until the batches end
      True
    """

    steps: int | None = None
    learning_rate: float = 1e-4
    batch_size: int = 64
    seed: int = 0
    optimizer: optax.GradientTransformation | None = None
    loss_fn: Callable[[jax.Array, jax.Array], jax.Array] | None = None
    fold_bn: bool = False
    devices: Devices = None
    progress: bool = False
    description: str = "training"

    def __post_init__(self) -> None:
        def whole(name: str, lo: int, fix: str) -> None:
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int | np.integer) or v < lo:
                raise ConfigError(f"TrainConfig.{name} must be an int >= {lo}, got {v!r}; "
                                  f"{fix}.")

        if self.steps is not None:
            whole("steps", 1, "pass the number of optimizer steps, e.g. steps=1000 (or None "
                              "with an optimizer to train until the batches end)")
        elif self.optimizer is None:
            raise ConfigError("TrainConfig.steps is None, but the default optimizer's cosine "
                              "schedule needs the length; pass steps=N, or an optimizer "
                              "(e.g. optax.adam(1e-4)) to train until the batches end.")
        lr = self.learning_rate
        if (isinstance(lr, bool) or not isinstance(lr, int | float | np.floating)
                or not math.isfinite(lr) or not lr > 0):
            raise ConfigError(f"TrainConfig.learning_rate must be a finite number > 0, got "
                              f"{lr!r}; pass e.g. learning_rate=1e-4.")
        whole("batch_size", 1, "pass e.g. batch_size=64")
        whole("seed", 0, "pass a seed in [0, 2**32), e.g. seed=0")
        if self.seed >= 2**32:
            raise ConfigError(f"TrainConfig.seed must be in [0, 2**32), got {self.seed}; pass "
                              "a smaller seed.")
        opt = self.optimizer
        if opt is not None and not (callable(getattr(opt, "init", None))
                                    and callable(getattr(opt, "update", None))):
            raise ConfigError(f"TrainConfig.optimizer must be an optax GradientTransformation "
                              f"(e.g. optax.adam(1e-3)), got {type(opt).__name__} {opt!r}.")
        if self.loss_fn is not None and not callable(self.loss_fn):
            raise ConfigError(f"TrainConfig.loss_fn must be a function loss_fn(output, "
                              f"targets) -> f32[], got {type(self.loss_fn).__name__} "
                              f"{self.loss_fn!r}; pass None for softmax cross-entropy.")
        for name in ("fold_bn", "progress"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"TrainConfig.{name} must be True or False, got "
                                  f"{getattr(self, name)!r}.")
        if not isinstance(self.description, str):
            raise ConfigError(f"TrainConfig.description must be a str (the progress bar's "
                              f"label), got {self.description!r}.")
        dev = self.devices
        if isinstance(dev, Sequence) and not isinstance(dev, str):
            if not dev:
                raise ConfigError("TrainConfig.devices is an empty sequence; pass None (one "
                                  "device), 'all', a count or a list of jax devices.")
            object.__setattr__(self, "devices", tuple(dev))
        elif not (dev is None or dev == "all" or (isinstance(dev, int | np.integer)
                                                  and not isinstance(dev, bool) and dev >= 1)):
            raise ConfigError(f"TrainConfig.devices must be None (one device), 'all', a count "
                              f">= 1 or a list of jax devices, got {dev!r}.")


class TrainResult(NamedTuple):
    """What :func:`train_graph` returns.

    Attributes:
      params: the trained params ``{node: {role: array}}`` (unfolded when the config's
        ``fold_bn``; fold them with :func:`npujax.ir.fold_batchnorm` for deployment).
      qstate: the ``qstate`` passed in (``{layer: state}``, empty when None) with each
        quantizer's ``learned_fields`` (e.g. LSQ's ``act_scale`` and ``weight_step``) replaced
        by their trained values; use it with ``params``. Fields no quantizer learns are the
        calibrated ones, unchanged.
      steps: the optimizer steps taken (int; fewer than ``config.steps`` only when an iterable
        of batches ended first, which is logged as a warning).
    """

    params: Params
    qstate: dict[str, Any]
    steps: int


def train_graph(
    graph: Graph,
    params: Params,
    x: np.ndarray | Iterable[tuple[Any, Any]],
    y: np.ndarray | None = None,
    *,
    quant: QuantSpec | None = None,
    qstate: QState | None = None,
    config: TrainConfig,
) -> TrainResult:
    """Fine-tune ``params`` of ``graph`` with an optax optimizer (default: Adam with a
    cosine-decayed learning rate), in float or through fake-quant (QAT).

    Every step minimises ``loss_fn(execute(graph, params, xb, quant, qstate), yb)`` over the
    params and the learned quantizer fields of ``qstate`` (each quantizer's ``learned_fields``,
    e.g. LSQ's steps), which are projected after each update (LSQ: steps ``>= MIN_SCALE``).

    Args:
      graph: the model graph.
      params: initial params ``{node: {role: array}}``.
      x: training inputs ``(n, ...)`` float32 (with ``y``), or any iterable of ``(inputs,
        targets)`` batches (a data loader; then ``y`` is None).
      y: integer labels ``(n,)`` (or the targets of the config's ``loss_fn``); None when ``x``
        yields batches.
      quant: fake-quant placement (:func:`npujax.quant_spec`); None trains in float. Layers
        with ``stochastic_rounding`` round stochastically, a fresh key per step from the
        config's ``seed``.
      qstate: the layers' calibrated states (from :func:`npujax.calibrate`).
      config: how to train (:class:`TrainConfig`: steps, optimizer, batch size, seed, ...).

    Returns:
      A :class:`TrainResult`: the trained ``params``, the ``qstate`` with its learned fields
      and the number of ``steps`` taken.

    Raises:
      ConfigError: ``steps`` missing with arrays, ``y`` given with an iterable of batches, a
        batch that is not an ``(inputs, targets)`` pair, no batch at all, or with ``devices``,
        a batch not divisible by the device count (bad config fields raise in
        :class:`TrainConfig`).
      CalibrationError: a NaN/inf or too large weight (names the layer).

    Examples:
      >>> import numpy as np, npujax  # doctest: +SKIP
      >>> q = npujax.quant_spec(graph, 8, 8)  # doctest: +SKIP
      >>> qstate = npujax.calibrate(graph, params, [x[:256]], q)  # doctest: +SKIP
      >>> result = npujax.train_graph(graph, params, x, y, quant=q, qstate=qstate,
      ...                             config=npujax.TrainConfig(steps=500))  # doctest: +SKIP
      >>> from npujax.quantize import evaluate  # doctest: +SKIP
      >>> evaluate(graph, result.params, x_test, y_test, quant=q,
      ...          qstate=result.qstate)  # doctest: +SKIP
    """
    if not isinstance(config, TrainConfig):
        raise ConfigError(f"train_graph's config must be a TrainConfig, got "
                          f"{type(config).__name__}; pass config=TrainConfig(steps=...).")
    steps, optimizer, batch_size, seed = (config.steps, config.optimizer, config.batch_size,
                                          config.seed)
    check_weights(params)
    arrays = y is not None
    if arrays and not isinstance(x, np.ndarray | jax.Array) and _is_batches(x):
        raise ConfigError(f"train_graph: y is given with an iterable of batches as x (a "
                          f"{type(x).__name__}); pass arrays x and y, or batches of "
                          "(inputs, targets) as x with y=None.")
    if not arrays and isinstance(x, np.ndarray | jax.Array):
        raise ConfigError("train_graph got input arrays without targets y; pass y, or an "
                          "iterable of (inputs, targets) batches as x.")
    if steps is None and arrays:
        raise ConfigError("train_graph got arrays (x, y) and TrainConfig.steps=None; pass "
                          "TrainConfig(steps=N) (None trains until an iterable of batches "
                          "ends).")
    quant = quant or {}
    learned, full = split_learned(quant, qstate)
    opt = optimizer if optimizer is not None else optax.adam(
        optax.cosine_decay_schedule(config.learning_rate, steps))
    dp = data_parallel(config.devices)
    if dp is not None and arrays:  # before any compilation
        dp.check(min(batch_size, len(np.asarray(x))), "batch_size")
    # one compiled program (eagerly the optimizer's zeros compile one per parameter shape)
    opt_state = jax.jit(opt.init)((params, learned))

    run_graph, transform = graph, lambda p: p
    if config.fold_bn:
        run_graph = fold_batchnorm(graph, params)[0]
        transform = lambda p: fold_batchnorm(graph, frozen_bn_stats(graph, p))[1]

    task = cross_entropy if config.loss_fn is None else config.loss_fn
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
    with progress_bar(config.progress, config.description, steps) as advance:
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
                    "end); pass a longer (or repeating) iterable, or TrainConfig(steps=None, "
                    "optimizer=...) to train until it ends.")
    params, learned = state
    return TrainResult(params=params, qstate=merge_learned(learned, full), steps=done)


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

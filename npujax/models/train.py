"""Float training of a Flax NNX model with optax (the starting point of PTQ and QAT)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import optax
from flax import nnx

from npujax._progress import progress_bar
from npujax.data.datasets import Dataset
from npujax.models.cnn import DigitsCNN
from npujax.quantize.train import batch_iterator, cross_entropy

__all__ = ["train_float"]


def train_float(
    data: Dataset, *, epochs: int, learning_rate: float, batch_size: int, seed: int,
    progress: bool = False, model: nnx.Module | None = None,
    optimizer: optax.GradientTransformation | None = None,
    augment: Callable[[np.ndarray, np.random.Generator], np.ndarray] | None = None,
) -> nnx.Module:
    """Train ``model`` in float with optax Adam and a cosine-decayed learning rate.

    Args:
      data: the training split is used (``x_train`` float32 ``(n, ...)``, ``y_train`` int32).
      epochs: passes over the training data.
      learning_rate: peak learning rate.
      batch_size: mini-batch size.
      seed: initialisation (of the default model) and shuffling seed.
      progress: show a progress bar.
      model: an ``nnx.Module`` mapping a batch to logits; default a new :class:`DigitsCNN`.
      optimizer: any optax transformation instead of the default (then ``learning_rate`` is
        unused), e.g. AdamW with warm-up for a transformer.
      augment: ``augment(x_batch, rng) -> x_batch`` applied to every training batch (numpy,
        same shape), e.g. random shifts; ``rng`` is seeded from ``seed``.

    Returns:
      The trained model, in eval mode (BatchNorm trained in training mode, then frozen).
    """
    model = model if model is not None else DigitsCNN(rngs=nnx.Rngs(seed))
    steps_per_epoch = max(1, len(data.x_train) // batch_size)
    if optimizer is None:
        optimizer = optax.adam(optax.cosine_decay_schedule(learning_rate,
                                                           epochs * steps_per_epoch))
    # built as one compiled program: eagerly the optimizer's zeros compile one program per
    # parameter shape (the state is the same, zeros and a step count)
    opt = nnx.jit(lambda m: nnx.Optimizer(m, optimizer, wrt=nnx.Param))(model)
    rng = np.random.default_rng(seed)

    @nnx.jit
    def step(model, optimizer, x, y):
        loss, grads = nnx.value_and_grad(lambda m: cross_entropy(m(x), y))(model)
        optimizer.update(model, grads)
        return loss

    model.train()
    batches = batch_iterator(data.x_train, data.y_train, batch_size, seed)
    with progress_bar(progress, "float training", epochs * steps_per_epoch) as advance:
        for _ in range(epochs * steps_per_epoch):
            x, y = next(batches)
            advance(step(model, opt, x if augment is None else augment(x, rng), y))
    model.eval()
    return model

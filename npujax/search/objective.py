"""The task loss of a precision search, for labelled and for unlabelled (imported) models.

A model trained here comes with labels; an imported ONNX model usually comes with calibration
images only. Without labels the float model is its own teacher (knowledge distillation, Hinton et
al. 2015; the data-free quantization literature, e.g. ZeroQ, Cai et al. CVPR 2020, measures
sensitivity the same way):

* a classifier (rank-2 output: logits, or probabilities when the graph ends in ``Softmax``) is
  trained and analysed with the cross-entropy against the float model's top-1 classes
  (pseudo-labels);
* any other output (a detection map, features) with the mean squared error to the float
  output, normalized by the float output's variance over the batch (so 1.0 means "as far off as
  predicting the mean").

At the float weights a distillation loss has zero gradient, so the empirical Fisher used for
activation sensitivity would be zero; for dense outputs :func:`fisher_targets` therefore samples
targets from the Gaussian model ``N(teacher, var(teacher))`` (the "true Fisher" rather than the
empirical one, Martens 2020, "New insights and perspectives on the natural gradient method").
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from npujax.errors import ConfigError, ShapeError
from npujax.ir.execute import execute
from npujax.ir.graph import Graph, Params

__all__ = ["LOSS_KINDS", "TaskLoss", "task_loss", "search_targets", "fisher_targets"]

#: Output kinds: classifier logits, classifier probabilities (graph ends in Softmax), dense.
LOSS_KINDS = ("logits", "probabilities", "dense")


@dataclasses.dataclass(frozen=True)
class TaskLoss:
    """``loss(output, target) -> f32[]`` for one output kind (see :data:`LOSS_KINDS`).

    Attributes:
      kind: ``logits`` (softmax cross-entropy with int labels), ``probabilities`` (negative
        log-probability of int labels, probabilities clipped at 1e-12 so a zero never gives inf) or
        ``dense`` (variance-normalized mean squared error to a float target of the output's shape).
    """

    kind: str

    def __post_init__(self) -> None:
        if self.kind not in LOSS_KINDS:
            raise ConfigError(f"loss kind must be one of {LOSS_KINDS}, got {self.kind!r}.")

    @property
    def classification(self) -> bool:
        """Whether targets are integer class labels."""
        return self.kind != "dense"

    def __call__(self, out: jax.Array, target: jax.Array | np.ndarray) -> jax.Array:
        if self.kind == "logits":
            logp = jax.nn.log_softmax(out, axis=-1)
        elif self.kind == "probabilities":
            logp = jnp.log(jnp.maximum(out, jnp.float32(1e-12)))
        else:
            var = jax.lax.stop_gradient(jnp.var(target)) + jnp.float32(1e-12)
            return jnp.mean(jnp.square(out - target)) / var
        picked = jnp.take_along_axis(logp, target[:, None].astype(jnp.int32), axis=-1)
        return -jnp.mean(picked)


def task_loss(graph: Graph, kind: str | None = None) -> TaskLoss:
    """The loss for ``graph``'s single output; ``kind=None`` picks it from the graph.

    Auto: ``probabilities`` if the output is produced by a ``Softmax`` node (through
    ``Identity`` nodes), ``logits`` for other
    rank-2 outputs ``[batch, classes]``, ``dense`` otherwise.

    Raises:
      ConfigError: a graph with several outputs, or an unknown ``kind``.
    """
    if len(graph.outputs) != 1:
        raise ConfigError(f"precision search needs a single-output graph; this one has "
                          f"{len(graph.outputs)} outputs {graph.outputs}.")
    if kind is not None:
        return TaskLoss(kind)
    out = graph.outputs[0]
    producers = {t: n for n in graph.nodes for t in n.outputs}
    producer = producers.get(out)
    while producer is not None and producer.op == "Identity":
        producer = producers.get(producer.inputs[0])
    if producer is not None and producer.op == "Softmax":
        return TaskLoss("probabilities")
    return TaskLoss("logits" if len(graph.tensors[out].shape) == 2 else "dense")


def _float_outputs(graph: Graph, params: Params, x: np.ndarray, batch: int) -> np.ndarray:
    run = jax.jit(lambda p, xb: execute(graph, p, xb))
    return np.concatenate([np.asarray(run(params, x[i:i + batch]))
                           for i in range(0, len(x), batch)])


def search_targets(
    graph: Graph,
    params: Params,
    x: np.ndarray,
    y: np.ndarray | None,
    loss: TaskLoss,
    batch: int = 64,
) -> np.ndarray:
    """Targets for ``loss``: the labels ``y`` when given, else the float model's own outputs.

    Args:
      graph: the float model (the teacher when ``y`` is None).
      params: its params.
      x: inputs ``[n, ...]`` float32.
      y: int labels ``[n]`` or None.
      loss: from :func:`task_loss`.
      batch: teacher evaluation batch size.

    Returns:
      int32 ``[n]`` labels (classification: ``y`` or the teacher's top-1) or float32 teacher
      outputs ``[n, ...]`` (dense).

    Raises:
      ConfigError: labels given for a dense output.
      ShapeError: ``y`` of another length than ``x``.
    """
    if y is not None:
        if not loss.classification:
            raise ConfigError("labels were given but the model's output is dense (not a "
                              "classifier); search it without labels (distillation from the "
                              "float model).")
        y = np.asarray(y)
        if y.shape != (len(x),):
            raise ShapeError(f"labels must have shape ({len(x)},), got {y.shape}.")
        return y.astype(np.int32)
    teacher = _float_outputs(graph, params, np.asarray(x, np.float32), batch)
    if loss.classification:
        return teacher.argmax(-1).astype(np.int32)
    return teacher.astype(np.float32)


def fisher_targets(targets: np.ndarray, loss: TaskLoss, seed: int = 0) -> np.ndarray:
    """Targets whose loss gradient samples the Fisher information at the float model.

    Labels are returned unchanged; dense teacher outputs ``t`` become ``t + std(t) * e`` with
    ``e ~ N(0, 1)`` (seeded), the Gaussian model matching :class:`TaskLoss`'s normalization.
    """
    if loss.classification:
        return targets
    rng = np.random.default_rng(seed)
    noise = rng.standard_normal(targets.shape).astype(np.float32)
    return (targets + np.float32(targets.std()) * noise).astype(np.float32)

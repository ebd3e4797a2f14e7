"""QAT fine-tuning of a model with a precision policy, and its accuracy and modelled latency
(what ``npujax qat --policy`` runs)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import jax

from npujax.errors import ConfigError
from npujax.hw.spec import NpuSpec
from npujax.ir.execute import execute
from npujax.ops import gemm_nodes
from npujax.plan.lower import lower
from npujax.quantize.calibrate import calibrate
from npujax.quantize.model_file import save_graph
from npujax.quantize.parallel import Devices
from npujax.quantize.train import TrainConfig, evaluate, train_graph
from npujax.search.objective import search_targets, task_loss
from npujax.search.policy import PrecisionPolicy
from npujax.workflows.inputs import LoadedModel

__all__ = ["PolicyQATResult", "qat_with_policy"]


@dataclasses.dataclass(frozen=True)
class PolicyQATResult:
    """Outcome of :func:`qat_with_policy`.

    Attributes:
      metric: what ``score`` measures: ``test accuracy`` (labelled data), top-1 agreement with
        the float model, or the normalized MSE to it (unlabelled data).
      score: its value on the held-out data.
      latency_s: modelled latency of the policy (s).
      int8_latency_s: modelled latency at uniform 8 bits (s).
      params: the fine-tuned params.
      qstate: the calibrated states of the policy's spec.
    """

    metric: str
    score: float
    latency_s: float
    int8_latency_s: float
    params: Any
    qstate: Any

    @property
    def speedup_vs_int8(self) -> float:
        """``int8_latency_s / latency_s``."""
        return self.int8_latency_s / self.latency_s


def qat_with_policy(model: LoadedModel, policy: PrecisionPolicy, spec: NpuSpec, *,
                    steps: int = 300, seed: int = 0, progress: bool = False,
                    out: str | Path | None = None, devices: Devices = None
                    ) -> PolicyQATResult:
    """Calibrate ``model`` with the policy's spec, QAT-fine-tune it and score it.

    Unlabelled data is fine-tuned by distillation from the model's float outputs
    (:mod:`npujax.search.objective`).

    Args:
      model: the model and its data (:func:`npujax.workflows.inputs.load_model_and_data`).
      policy: per-layer widths (from ``npujax search``).
      spec: the NPU for the modelled latency.
      steps: QAT steps.
      seed: shuffling seed.
      progress: progress bar.
      out: write ``model.npz`` (graph, fine-tuned params, states and the policy) there.
      devices: data-parallel QAT over these devices (``"all"``, a count; see
        :class:`npujax.quantize.TrainConfig`); None: one device.

    Returns:
      A :class:`PolicyQATResult`.

    Raises:
      ConfigError: a policy for another model (other layer names).
    """
    graph, params = model.graph, model.params
    layers = {n.name for n in gemm_nodes(graph)}
    if set(policy.weight_bits) != layers:
        def some(names):
            names = sorted(names)
            return ", ".join(names[:6]) + (f", ... ({len(names)} layers)" if len(names) > 6 else "")

        raise ConfigError(f"the policy is for another model: it names layers "
                          f"{some(policy.weight_bits)}; the model has {some(layers)}.")
    x, y, xte, yte = model.x_train, model.y_train, model.x_test, model.y_test
    task = task_loss(graph)
    targets = search_targets(graph, params, x, y, task)
    q = policy.quant_spec(graph)
    qstate = calibrate(graph, params, [x[i:i + 64] for i in range(0, min(len(x), 512), 64)], q)
    tuned = train_graph(graph, params, x, targets, quant=q, qstate=qstate, config=TrainConfig(
        steps=steps, learning_rate=1e-4, seed=seed, loss_fn=task, progress=progress,
        description="QAT with policy", devices=devices)).params
    if yte is not None:
        metric, score = "test accuracy", evaluate(graph, tuned, xte, yte, quant=q, qstate=qstate)
    else:
        teacher = search_targets(graph, params, xte, None, task)
        if task.classification:
            metric = "top-1 agreement with the float model on held-out data"
            score = evaluate(graph, tuned, xte, teacher, quant=q, qstate=qstate)
        else:
            metric = "normalized MSE to the float model on held-out data"
            fq = jax.jit(lambda p, xb: execute(graph, p, xb, quant=q, qstate=qstate))
            score = float(task(fq(tuned, xte), teacher))
    lat = lower(graph, spec, q).latency_s
    int8 = lower(graph, spec).latency_s
    if out is not None:
        save_graph(Path(out) / "model.npz", graph, tuned, qstate,
                   meta={**model.meta, "policy": dict(policy.weight_bits),
                         "act_policy": dict(policy.act_bits), metric: score})
    return PolicyQATResult(metric, score, lat, int8, tuned, qstate)

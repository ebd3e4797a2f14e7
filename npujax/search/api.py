"""One entry point for every precision searcher: :func:`search_precision`."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

import numpy as np

from npujax.errors import ConfigError
from npujax.hw.spec import NpuSpec, as_spec
from npujax.ir.graph import Graph, Params
from npujax.plan.lower import lower
from npujax.quantize.quantizers import QState
from npujax.search.base import SearchProblem
from npujax.search.config import SearchConfig
from npujax.search.cost import latency_table, policy_latency_s
from npujax.search.objective import TaskLoss, search_targets, task_loss
from npujax.search.policy import PrecisionPolicy
from npujax.search.registry import SEARCHERS
from npujax.search.report import SearchReport
from npujax.search.solvers import check_budget

__all__ = ["search_precision"]


def search_precision(
    graph: Graph,
    params: Params,
    spec: NpuSpec | str,
    x: np.ndarray | Iterable[Any],
    y: np.ndarray | None,
    qstate: QState,
    config: SearchConfig | None = None,
    *,
    loss: TaskLoss | None = None,
) -> SearchReport:
    """Choose per-layer weight (and activation) widths that meet a latency budget on ``spec``.

    Args:
      graph: the optimized float (or QAT) model.
      params: its params.
      spec: the NPU whose latency model (:func:`npujax.lower`) is the cost (an
        :class:`~npujax.hw.NpuSpec`, or a preset name or TOML path).
      x: training/calibration inputs ``(n, ...)``, or any iterable (a data loader) of input
        batches or of ``(inputs, labels)`` batches; an iterable is read once and its batches
        concatenated (the searchers pass over the data several times), its labels used as
        ``y``.
      y: their integer labels; ``y=None`` (an unlabelled, e.g. imported, model) distils from the
        float model instead: its top-1 classes as labels for a classifier, its outputs
        (variance-normalized MSE) otherwise (:mod:`npujax.search.objective`).
      qstate: calibrated states of a single-width quantization of the model (its activation
        grids).
      config: the searcher and its settings (:class:`SearchConfig`; default: HAWQ-V3's integer
        program at 75 % of the INT8 latency).
      loss: a :class:`TaskLoss` object, overriding ``config.loss``.

    Returns:
      A :class:`SearchReport`: the policy, its exact lowered latency, the INT8 latency, whether
      the budget is met and the searcher's details.

    Raises:
      ConfigError: an infeasible budget (checked before any costly analysis), labels for a dense
        output, a graph with several outputs, a bad pinned layer.
      ShapeError: labels of another length than ``x``.
    """
    x, y = _materialize(x, y)
    config = config or SearchConfig()
    spec = as_spec(spec)
    task = loss if loss is not None else task_loss(graph, config.loss)
    targets = search_targets(graph, params, x, y, task)
    int8 = lower(graph, spec, dataflow=config.dataflow).latency_s
    budget_s = config.budget_s if config.budget_s is not None else config.budget_ratio * int8
    table = latency_table(graph, spec, config.candidates, config.act_candidates,
                          config.dataflow)
    fastest = check_budget(table, budget_s, config.pinned)
    problem = SearchProblem(graph=graph, params=params, spec=spec, x=np.asarray(x),
                            targets=targets, qstate=qstate, task=task, table=table,
                            budget_s=float(budget_s), fastest_s=fastest, pinned=config.pinned)
    outcome = SEARCHERS[config.method].search(problem, config)
    exact = policy_latency_s(graph, spec, outcome.choice, config.dataflow)
    report = SearchReport(
        policy=PrecisionPolicy({n: int(c[0]) for n, c in outcome.choice.items()},
                               {n: int(c[1]) for n, c in outcome.choice.items()}),
        method=config.method, npu=spec.name, loss=task.kind, distilled=y is None,
        budget_s=float(budget_s), latency_s=exact, int8_latency_s=int8, pinned=config.pinned,
        details=outcome.details, params=outcome.params)
    policy = dataclasses.replace(report.policy, meta=report.meta())
    return dataclasses.replace(report, policy=policy)


def _materialize(x: Any, y: np.ndarray | None) -> tuple[np.ndarray, np.ndarray | None]:
    """``(x, y)`` as arrays: an array as it is, an iterable of batches concatenated."""
    if hasattr(x, "shape") and hasattr(x, "dtype"):
        return np.asarray(x), y
    if not isinstance(x, Iterable):
        raise ConfigError(f"x must be an array or an iterable of batches, got {type(x).__name__}.")
    xs, ys = [], []
    for batch in x:
        if isinstance(batch, tuple) and len(batch) == 2:
            xs.append(np.asarray(batch[0]))
            ys.append(np.asarray(batch[1]))
        else:
            xs.append(np.asarray(batch))
    if not xs:
        raise ConfigError("the data iterable yielded no batch; give at least one.")
    if ys and len(ys) != len(xs):
        raise ConfigError("the data iterable mixes (inputs, labels) pairs and bare inputs.")
    if ys and y is not None:
        raise ConfigError("the batches carry labels and y is given too; pass y=None.")
    return np.concatenate(xs), (np.concatenate(ys) if ys else y)

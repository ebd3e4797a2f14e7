"""One entry point for the three precision searchers, returning a :class:`PrecisionPolicy`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from npujax.errors import ConfigError
from npujax.hw.spec import NpuSpec
from npujax.ir.graph import Graph, Params
from npujax.ops import gemm_nodes
from npujax.plan.latency import lower
from npujax.quantize.execute import execute
from npujax.search.cost import latency_table, policy_latency_s
from npujax.search.gradient import gradient_search
from npujax.search.objective import TaskLoss, fisher_targets, search_targets, task_loss
from npujax.search.policy import PrecisionPolicy
from npujax.search.sensitivity import (
    activation_sensitivity,
    hawq_sensitivity,
    hessian_traces,
    loss_sensitivity,
    weight_perturbation,
)
from npujax.search.solvers import (
    check_budget,
    fit_exact_budget,
    greedy_policy,
    ilp_policy,
)

__all__ = ["SEARCHERS", "search_precision"]

#: Searcher names accepted by :func:`search_precision`.
SEARCHERS = ("gradient", "ilp", "greedy")
#: Sensitivity measures of the ``ilp`` and ``greedy`` searchers.
SENSITIVITIES = ("hessian", "loss")


def search_precision(
    graph: Graph,
    params: Params,
    spec: NpuSpec,
    x: np.ndarray,
    y: np.ndarray | None,
    qstate: Mapping[str, Mapping[str, jax.Array]],
    *,
    method: str = "ilp",
    loss: str | TaskLoss | None = None,
    sensitivity: str = "hessian",
    pinned: Mapping[str, int | tuple[int, int]] | None = None,
    budget_s: float | None = None,
    budget_ratio: float = 0.75,
    candidates: Sequence[int] = (2, 4, 8),
    act_candidates: Sequence[int] = (8,),
    sensitivity_samples: int = 16,
    sensitivity_batch: int = 256,
    steps: int = 300,
    seed: int = 0,
    progress: bool = False,
) -> PrecisionPolicy:
    """Choose per-layer weight (and activation) widths that meet a latency budget on ``spec``.

    Args:
      graph, params: the optimized float (or QAT) model.
      spec: the NPU whose latency model (:func:`npujax.plan.lower`) is the cost.
      x, y: training/calibration inputs and integer labels; ``y=None`` (an unlabelled, e.g.
        imported, model) distils from the float model instead: its top-1 classes as labels for a
        classifier, its outputs (variance-normalized MSE) otherwise
        (:mod:`npujax.search.objective`).
      qstate: calibrated activation ranges.
      method: ``gradient`` (learned weight and activation widths, EdMIPS-style), ``ilp`` (HAWQ-V3
        integer program over Hessian-trace sensitivities) or ``greedy`` (by sensitivity).
      loss: the task loss: a :class:`TaskLoss`, one of its kinds (``logits``,
        ``probabilities``, ``dense``), or None to infer it from the graph's output.
      sensitivity: what ``ilp``/``greedy`` minimise: ``hessian`` (HAWQ-V3: Hutchinson trace x
        weight perturbation, plus the empirical-Fisher activation term) or ``loss`` (the
        measured loss increase with one layer quantized at a time,
        :func:`npujax.search.loss_sensitivity`).
      pinned: ``{layer: w or (w, a)}`` layers every searcher must keep at that choice (e.g.
        the first and last layers at ``(8, 8)``, the convention of HAWQ-V3 and HAQ); the
        choice must be among the candidates.
      budget_s: latency budget (s); default ``budget_ratio`` x the uniform 8-bit latency.
      budget_ratio: see ``budget_s``.
      candidates: candidate weight widths.
      act_candidates: candidate activation widths.
      sensitivity_samples: Hutchinson probes for the Hessian traces.
      sensitivity_batch: examples used by the sensitivity analysis.
      steps: optimisation steps of the gradient searcher.
      seed: random seed.
      progress: show progress bars.

    Returns:
      A :class:`PrecisionPolicy` whose ``meta`` records the method, budget, the exact modelled
      latency of the policy and that of uniform 8-bit.

    Raises:
      ConfigError: unknown method or loss kind, infeasible budget, labels for a dense output, a
        graph with several outputs.
      ShapeError: labels of another length than ``x``.
    """
    if method not in SEARCHERS:
        raise ConfigError(f"unknown search method {method!r}; use one of {', '.join(SEARCHERS)}.")
    if sensitivity not in SENSITIVITIES:
        raise ConfigError(f"unknown sensitivity {sensitivity!r}; use one of "
                          f"{', '.join(SENSITIVITIES)}.")
    layers = [n.name for n in gemm_nodes(graph)]
    task = loss if isinstance(loss, TaskLoss) else task_loss(graph, loss)
    targets = search_targets(graph, params, x, y, task)
    int8 = lower(graph, spec).latency_s
    if budget_s is None:
        if not 0 < budget_ratio <= 1:
            raise ConfigError(f"budget_ratio must be in (0, 1], got {budget_ratio}.")
        budget_s = budget_ratio * int8
    extra: dict = {}
    if method == "gradient":
        res = gradient_search(graph, params, x, targets, spec, qstate, candidates=candidates,
                              act_bits=tuple(act_candidates), budget_s=budget_s, steps=steps,
                              seed=seed, loss_fn=task, pinned=pinned, progress=progress)
        wbits, abits = dict(res.policy), dict(res.act_policy)
        extra = {"probabilities": {n: [float(v) for v in p] for n, p in res.probs.items()},
                 "act_probabilities": {n: [float(v) for v in p]
                                       for n, p in res.act_probs.items()},
                 "candidates": sorted({int(w) for w, _ in res.table.candidates}),
                 "act_candidates": sorted({int(a) for _, a in res.table.candidates}),
                 "final_lambda": res.lam}
    else:
        table = latency_table(graph, spec, candidates, tuple(act_candidates))
        fastest = check_budget(table, budget_s, pinned)  # before the costly sensitivities
        n = min(sensitivity_batch, len(x))
        xb, yb = jnp.asarray(x[:n], jnp.float32), jnp.asarray(targets[:n])
        if sensitivity == "loss":
            omega = loss_sensitivity(graph, params, xb, yb, layers, candidates, act_candidates,
                                     loss_fn=task, progress=progress)
        else:
            traces = hessian_traces(lambda p, b: task(execute(graph, p, b[0]), b[1]),
                                    params, (xb, yb), layers, samples=sensitivity_samples,
                                    seed=seed, progress=progress)
            w_omega = hawq_sensitivity(traces, weight_perturbation(graph, params, layers,
                                                                   candidates))
            a_omega = activation_sensitivity(
                graph, params, xb, jnp.asarray(fisher_targets(targets[:n], task, seed)), layers,
                act_candidates, loss_fn=task)
            omega = {ln: {(w, a): w_omega[ln][w] + a_omega[ln][a] for w in candidates
                          for a in act_candidates} for ln in layers}
        solver = ilp_policy if method == "ilp" else greedy_policy
        choice, _ = fit_exact_budget(lambda b: solver(table, omega, b, pinned),
                                     lambda c: policy_latency_s(graph, spec, c), budget_s, fastest)
        wbits = {ln: int(c[0]) for ln, c in choice.items()}
        abits = {ln: int(c[1]) for ln, c in choice.items()}
        extra = {"sensitivity": sensitivity}
    exact = lower(graph, spec, weight_bits=wbits, act_bits=abits).latency_s
    meta = {"method": method, "npu": spec.name, "loss": task.kind,
            "pinned": {k: list(v) if isinstance(v, tuple) else v
                       for k, v in (pinned or {}).items()},
            "labels": "given" if y is not None else "float model (distillation)",
            "budget_s": float(budget_s), "budget_met": bool(exact <= budget_s * (1 + 1e-9)),
            "latency_s": exact, "int8_latency_s": int8, "speedup_vs_int8": int8 / exact, **extra}
    return PrecisionPolicy(wbits, abits, meta)


"""The ``npujax codesign`` workflow: sensitivities of a model, the gradient co-design of
:func:`codesign`, and its outputs written as one folder (atomically):

* ``preset.toml`` — the chosen hardware, a complete preset every command loads (``--npu``);
* ``policy.json`` — the chosen per-layer widths (``npujax qat --policy``, ``npujax lower``);
* ``codesign.json`` — the budgets, the base and chosen designs, every exact evaluation, the
  relaxed trajectory;
* ``pareto.png`` — objective against area: the exactly evaluated designs, their Pareto front, the
  relaxed trajectory and the budget.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import jax.numpy as jnp
import numpy as np

from npujax._atomic import atomic_write_text, staged_dir
from npujax.explore.pareto import pareto_front
from npujax.hw.spec import NpuSpec, spec_to_toml
from npujax.ir.graph import Graph, Params
from npujax.ops import gemm_nodes
from npujax.report.plots import new_figure, save_figure
from npujax.search.codesign import CodesignConfig, CodesignResult, codesign
from npujax.search.objective import search_targets, task_loss
from npujax.search.policy import save_policy
from npujax.search.sensitivity import loss_sensitivity

__all__ = ["model_sensitivity", "run_codesign", "write_codesign", "OUTPUTS"]

#: The files ``npujax codesign --out DIR`` writes.
OUTPUTS = ("preset.toml", "policy.json", "codesign.json", "pareto.png")


def model_sensitivity(graph: Graph, params: Params, x: np.ndarray, y: np.ndarray | None,
                      candidates: Sequence[int], *, examples: int = 256, progress: bool = False
                      ) -> dict[str, dict[tuple[int, int], float]]:
    """Per-layer loss increase at every (w, a) pair of ``candidates``
    (:func:`npujax.search.loss_sensitivity` on the first ``examples`` inputs; an unlabelled
    model is measured against its float outputs, as ``npujax search`` does)."""
    task = task_loss(graph)
    n = min(examples, len(x))
    targets = search_targets(graph, params, x[:n], None if y is None else y[:n], task)
    layers = [nd.name for nd in gemm_nodes(graph)]
    return loss_sensitivity(graph, params, jnp.asarray(x[:n], jnp.float32),
                            jnp.asarray(targets), layers, candidates, candidates, loss_fn=task,
                            progress=progress)


def run_codesign(graph: Graph, params: Params, base: NpuSpec, x: np.ndarray,
                 y: np.ndarray | None, config: CodesignConfig, out: str | Path | None = None, *,
                 examples: int = 256, progress: bool = False,
                 meta: Mapping[str, Any] | None = None) -> CodesignResult:
    """Measure the sensitivities, co-design, and write :data:`OUTPUTS` to ``out`` (if given).

    Raises:
      ConfigError: see :func:`codesign`.
      OutputError: ``out`` cannot be written (nothing is left half-written).
    """
    sens = model_sensitivity(graph, params, x, y, config.candidates, examples=examples,
                             progress=progress)
    result = codesign(graph, base, sens, config)
    if out is not None:
        write_codesign(out, result, config, {**(meta or {}), "sensitivity_examples":
                                             min(examples, len(x))})
    return result


def write_codesign(out: str | Path, result: CodesignResult, config: CodesignConfig,
                   meta: Mapping[str, Any]) -> None:
    """Write :data:`OUTPUTS` for ``result`` into the folder ``out`` as one transaction."""
    best = result.best
    obj = config.objective
    prov = {"source": "npujax codesign", "objective": obj, "area_budget_mm2": config.area_mm2,
            "power_budget_w": config.power_w, "bandwidth_class": best.bandwidth.name,
            "latency_s": best.latency_s, "energy_j": best.energy_j, "edp_js": best.edp_js,
            "area_mm2": best.area_mm2, "loss_increase": best.loss_increase, "npu": best.spec.name}
    doc = {
        **dict(meta),
        "config": {k: (list(v) if isinstance(v, tuple) else v)
                   for k, v in dataclasses.asdict(config).items() if k != "bandwidth_classes"},
        "bandwidth_classes": [dataclasses.asdict(c) for c in config.bandwidth_classes],
        "exact_evaluations": result.exact_evaluations,
        "gradient_steps": config.steps,
        "best": best.summary(),
        "base": result.base.summary(),
        "improvement_vs_base": result.base.objective(obj) / best.objective(obj),
        "evaluated": [d.summary() for d in result.evaluated],
        "trajectory": result.trajectory,
    }
    with staged_dir(out) as stage:
        comment = (f"Chosen by 'npujax codesign' from {meta.get('base', best.spec.name)}: "
                   f"objective {obj}, area budget {config.area_mm2:g} mm^2\n"
                   f"(incl. the {best.bandwidth.name} DRAM PHY, {best.bandwidth.phy_area_mm2:g} "
                   f"mm^2, which this preset's area does not model).")
        atomic_write_text(stage / "preset.toml", spec_to_toml(best.spec, comment))
        save_policy(stage / "policy.json", dataclasses.replace(best.policy, meta=prov))
        atomic_write_text(stage / "codesign.json", json.dumps(doc, indent=2) + "\n")
        plot_codesign(stage / "pareto.png", result, config)


def plot_codesign(path: Path, result: CodesignResult, config: CodesignConfig) -> None:
    """Objective against area: exact designs, their Pareto front, the relaxed path."""
    obj = config.objective
    units = {"latency": "s", "energy": "J", "edp": "J s"}[obj]
    ds = list(result.evaluated)
    area = np.asarray([d.area_mm2 for d in ds])
    val = np.asarray([d.objective(obj) for d in ds])
    fig, ax = new_figure(6.5, 4.5)
    tr = result.trajectory
    ax.plot(tr["area_mm2"], tr["objective"], "-", color="0.6", lw=1,
            label="relaxed path (gradient steps)")
    front = pareto_front(np.stack([val, area], 1))
    order = front[np.argsort(area[front], kind="stable")]
    ax.plot(area[order], val[order], "o-", color="C3", ms=4, label="Pareto front (exact)")
    for src, marker in (("base", "s"), ("gradient", "o")):
        m = [i for i, d in enumerate(ds) if d.source == src]
        ax.scatter(area[m], val[m], marker=marker, s=30, zorder=3,
                   label=f"{src} ({'INT8 ' if src == 'base' else ''}exact)")
    ax.scatter([result.best.area_mm2], [result.best.objective(obj)], marker="*", s=160,
               color="C2", zorder=4, label="chosen")
    ax.axvline(config.area_mm2, color="k", ls="--", lw=1, label="area budget")
    ax.set_yscale("log")
    ax.set_xlabel("area (mm$^2$, incl. DRAM PHY)")
    ax.set_ylabel(f"{obj} ({units})")
    ax.set_title(f"co-design: {result.exact_evaluations} exact evaluations, "
                 f"{len(tr['objective'])} gradient steps")
    ax.legend(fontsize=8, loc="upper right")  # (not "best": slow on many points, and warns)
    save_figure(fig, path)

"""The greedy precision searcher: narrow layers one step at a time by sensitivity.

Start at the widest widths and repeatedly move the layer to the faster candidate with the best
latency saved per unit of added sensitivity, until the budget is met (the baseline of
sensitivity-ranking tools such as AIMET's and MCT's mixed-precision searches).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, final

import numpy as np

from npujax.search.base import Pinned, Searcher, SearchOutcome, SearchProblem
from npujax.search.cost import LatencyTable
from npujax.search.sensitivity import layer_sensitivity
from npujax.search.solvers import allowed_mask, fit_policy, sensitivity_matrix

if TYPE_CHECKING:
    from npujax.search.config import SearchConfig

__all__ = ["greedy_policy", "GreedySearcher"]


def greedy_policy(
    table: LatencyTable, sensitivity: Mapping[str, Mapping[Any, float]], budget_s: float,
    pinned: Pinned | None = None,
) -> dict[str, tuple[int, int]]:
    """Narrow layers one step at a time, best latency saved per sensitivity added first.

    Args and Returns as :func:`npujax.search.ilp.ilp_policy`.
    """
    lat, omega = sensitivity_matrix(table, sensitivity, budget_s, pinned)
    allowed = allowed_mask(table, pinned)
    order = sorted(range(len(table.candidates)), key=lambda i: (sum(table.candidates[i]), -i))
    pos = np.asarray([[j for j in order if allowed[i, j]][-1] for i in range(len(table.layers))])
    total = lat[np.arange(len(pos)), pos].sum() + table.fixed_s
    while total > budget_s * (1 + 1e-12):
        best, best_score = None, -np.inf
        for i in range(len(pos)):
            for j in range(lat.shape[1]):  # any candidate that is faster than the current one
                saved = lat[i, pos[i]] - lat[i, j]
                if saved <= 0 or not allowed[i, j]:
                    continue
                score = saved / max(omega[i, j] - omega[i, pos[i]], 1e-30)
                if score > best_score:
                    best, best_score = (i, j), score
        if best is None:  # cannot happen when the budget is feasible; guards rounding
            break
        i, j = best
        total -= lat[i, pos[i]] - lat[i, j]
        pos[i] = j
    return {n: table.candidates[int(p)] for n, p in zip(table.layers, pos)}


@final
class GreedySearcher(Searcher):
    """Narrow layers one step at a time by latency saved per sensitivity added."""

    name = "greedy"
    summary = "narrow layers greedily by sensitivity"

    def search(self, problem: SearchProblem, config: SearchConfig) -> SearchOutcome:
        omega = layer_sensitivity(problem, config)
        choice = fit_policy(problem, config.dataflow,
                            lambda b: greedy_policy(problem.table, omega, b, problem.pinned))
        return SearchOutcome(choice, {"sensitivity": config.sensitivity})

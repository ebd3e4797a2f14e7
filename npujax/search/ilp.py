"""HAWQ-V3's integer program: the exact optimum of the sensitivity under a latency budget.

``minimise sum_l Omega_l(b_l)  subject to  sum_l T_l(b_l) + fixed <= budget``, one candidate per
layer, with ``Omega`` HAWQ-V3's Hessian-weighted perturbation (or the measured loss increase,
:func:`npujax.search.loss_sensitivity`) and ``T`` the exact per-layer latencies; solved with
SciPy's HiGHS MILP solver (Yao et al., "HAWQ-V3: Dyadic Neural Network Quantization", ICML 2021,
arXiv:2011.10680).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, final

import numpy as np

from npujax.errors import ConfigError
from npujax.search.base import Pinned, Searcher, SearchOutcome, SearchProblem
from npujax.search.cost import LatencyTable
from npujax.search.sensitivity import layer_sensitivity
from npujax.search.solvers import allowed_mask, fit_policy, sensitivity_matrix

if TYPE_CHECKING:
    from npujax.search.config import SearchConfig

__all__ = ["ilp_policy", "IlpSearcher"]


def ilp_policy(
    table: LatencyTable, sensitivity: Mapping[str, Mapping[Any, float]], budget_s: float,
    pinned: Pinned | None = None,
) -> dict[str, tuple[int, int]]:
    """Minimise ``sum_l Omega_l(b_l)`` subject to ``latency <= budget_s`` exactly (MILP).

    Args:
      table: exact per-layer, per-candidate latencies (:func:`npujax.search.latency_table`).
      sensitivity: ``{layer: {(w, a): Omega}}`` or ``{layer: {w: Omega}}``.
      budget_s: latency budget (s).
      pinned: ``{layer: w or (w, a)}`` layers held at one choice.

    Returns:
      ``{layer: (weight_bits, act_bits)}``.

    Raises:
      ConfigError: infeasible budget, missing sensitivities, a bad pinned entry.
    """
    from scipy.optimize import Bounds, LinearConstraint, milp

    lat, omega = sensitivity_matrix(table, sensitivity, budget_s, pinned)
    allowed = allowed_mask(table, pinned)
    n_layers, n_cand = lat.shape
    one_hot = np.zeros((n_layers, n_layers * n_cand))
    for i in range(n_layers):
        one_hot[i, i * n_cand:(i + 1) * n_cand] = 1.0
    constraints = [
        LinearConstraint(one_hot, 1.0, 1.0),
        # in µs, never below the fastest policy (feasible by _check) and with a relative slack
        # of 1e-7 so that a budget equal to the fastest latency survives the solver's tolerances
        LinearConstraint(lat.reshape(1, -1) * 1e6, -np.inf,
                         max(budget_s - table.fixed_s,
                             np.where(allowed, lat, np.inf).min(axis=1).sum()) * 1e6
                         * (1 + 1e-7) + 1e-9),
    ]
    res = milp(omega.reshape(-1), constraints=constraints,
               integrality=np.ones(n_layers * n_cand),
               bounds=Bounds(0, allowed.reshape(-1).astype(np.float64)))
    if not res.success:
        raise ConfigError(f"the integer program found no policy: {res.message}")
    choice = np.asarray(res.x).reshape(n_layers, n_cand).argmax(axis=1)
    return {n: table.candidates[int(c)] for n, c in zip(table.layers, choice)}


@final
class IlpSearcher(Searcher):
    """HAWQ-V3: the integer program over per-layer sensitivities (:func:`ilp_policy`)."""

    name = "ilp"
    summary = "HAWQ-V3 integer program over per-layer sensitivities"

    def search(self, problem: SearchProblem, config: SearchConfig) -> SearchOutcome:
        omega = layer_sensitivity(problem, config)
        choice = fit_policy(problem, config.dataflow,
                            lambda b: ilp_policy(problem.table, omega, b, problem.pinned))
        return SearchOutcome(choice, {"sensitivity": config.sensitivity})

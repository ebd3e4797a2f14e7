"""What the searchers share: the candidates a layer may take (pins), the budget's feasibility, the
sensitivity matrix, and the seam between a latency table and the exact lowering
(:func:`fit_exact_budget`).

A policy chooses one candidate ``(weight, act)`` width pair per layer so that the modelled
latency ``sum_l T_l(b_l) + fixed`` meets a budget, trading off a per-layer sensitivity
``Omega_l(b)`` (:mod:`npujax.search.ilp`, :mod:`npujax.search.greedy`) or the learned
probabilities (:mod:`npujax.search.gradient`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from npujax.errors import ConfigError
from npujax.search.base import Pinned, SearchProblem
from npujax.search.cost import LatencyTable, policy_latency_s

__all__ = ["fastest_latency_s", "allowed_mask", "fit_exact_budget", "check_budget",
           "sensitivity_matrix", "fit_policy"]


def allowed_mask(table: LatencyTable, pinned: Pinned | None = None) -> np.ndarray:
    """bool ``[L, n]``: which candidates each layer may take (all, or only its pinned choice).

    Raises:
      ConfigError: a pinned layer that is not in the table, or a pinned choice that is not
        among the candidates.
    """
    mask = np.ones((len(table.layers), len(table.candidates)), bool)
    for layer, choice in (pinned or {}).items():
        if layer not in table.layers:
            raise ConfigError(f"pinned layer {layer!r} is not a GEMM layer; layers: "
                              f"{list(table.layers)}.")
        i = table.layers.index(layer)
        if isinstance(choice, (int, np.integer)) and (int(choice), int(choice)) in \
                table.candidates and len({a for _, a in table.candidates}) > 1:
            choice = (int(choice), int(choice))  # "8 bits" = W8A8 when activations vary
        mask[i] = False
        mask[i, table.column(choice)] = True
    return mask


def fastest_latency_s(table: LatencyTable, pinned: Pinned | None = None) -> float:
    """The lowest latency any policy over ``table`` (respecting ``pinned``) can reach (s)."""
    sec = np.where(allowed_mask(table, pinned), np.asarray(table.seconds, np.float64), np.inf)
    return float(sec.min(axis=1).sum() + table.fixed_s)


def check_budget(table: LatencyTable, budget_s: float, pinned: Pinned | None = None) -> float:
    """The fastest latency over ``table`` (s), after checking that ``budget_s`` can be met.

    Raises:
      ConfigError: ``budget_s`` below the fastest policy the candidates (and pins) allow.
    """
    best = fastest_latency_s(table, pinned)
    if budget_s < best * (1 - 1e-9):
        raise ConfigError(
            f"latency budget {budget_s * 1e6:.3f} µs is below the fastest policy the candidates "
            f"{table.candidates} allow ({best * 1e6:.3f} µs); raise the budget or add narrower "
            "candidates."
        )
    return best


def sensitivity_matrix(table: LatencyTable, sensitivity: Mapping[str, Mapping[Any, float]],
                       budget_s: float, pinned: Pinned | None = None
                       ) -> tuple[np.ndarray, np.ndarray]:
    """``(latency, omega)``: float64 ``[L, n]`` seconds and sensitivities of every candidate,
    after checking the budget and that every layer has a sensitivity.

    Raises:
      ConfigError: an infeasible budget, or a layer without sensitivities.
    """
    missing = [n for n in table.layers if n not in sensitivity]
    if missing:
        raise ConfigError(f"sensitivity has no entry for layers {missing}.")
    check_budget(table, budget_s, pinned)
    lat = np.asarray(table.seconds, np.float64)
    omega = np.asarray([[float(_omega(sensitivity[n], c)) for c in table.candidates]
                        for n in table.layers], np.float64)
    return lat, omega


def _omega(per_layer: Mapping, choice: tuple[int, int]) -> float:
    """Sensitivity of a (w, a) choice: keyed by the pair, or by the weight width alone."""
    if choice in per_layer:
        return per_layer[choice]
    return per_layer[choice[0]]


def fit_exact_budget(
    solve: Callable[[float], dict],
    exact_latency_s: Callable[[dict], float],
    budget_s: float,
    floor_s: float,
    max_rounds: int = 8,
) -> tuple[dict, float]:
    """Solve against the table, then tighten the table budget until the *exact* latency fits.

    The table's per-layer latencies ignore what couples layers in the exact lowering
    (precision conversions where a tensor is read at two widths, vector layers at other than the
    widest width), so a table-feasible policy can exceed the budget by a little. Each round
    lowers the table budget by the measured excess and solves again.

    Args:
      solve: ``solve(table_budget_s) -> policy``.
      exact_latency_s: ``exact_latency_s(policy) -> s`` (e.g. :func:`npujax.plan.lower`).
      budget_s: the budget the exact latency must meet (s).
      floor_s: the lowest table budget that is still feasible (s).
      max_rounds: re-solves at most.

    Returns:
      ``(policy, exact latency)``; the latency may still exceed ``budget_s`` when no table
      budget down to ``floor_s`` gives a fitting policy (callers report it).
    """
    target = budget_s
    choice = solve(target)
    lat = exact_latency_s(choice)
    for _ in range(max_rounds):
        if lat <= budget_s * (1 + 1e-9) or target <= floor_s:
            break
        target = max(floor_s, target - (lat - budget_s))
        new = solve(target)
        if new == choice:
            continue
        choice, lat = new, exact_latency_s(new)
    return choice, lat


def fit_policy(problem: SearchProblem, dataflow: str | None,
               solve: Callable[[float], dict]) -> dict:
    """:func:`fit_exact_budget` for a search problem: ``solve(table_budget_s) -> policy`` is
    re-solved until the exact lowering (:func:`npujax.search.policy_latency_s`) meets
    ``problem.budget_s``.

    Returns:
      ``{layer: (weight_bits, act_bits)}``.
    """
    choice, _ = fit_exact_budget(
        solve, lambda c: policy_latency_s(problem.graph, problem.spec, c, dataflow),
        problem.budget_s, problem.fastest_s)
    return choice

"""Combinatorial precision searchers over a latency table and per-layer sensitivities.

Both choose one candidate weight width per layer so that the modelled latency
``sum_l T_l(b_l) + fixed`` meets a budget, trading off a per-layer sensitivity ``Omega_l(b)``
(e.g. HAWQ-V3's Hessian-weighted perturbation, :func:`npujax.search.hawq_sensitivity`):

* :func:`ilp_policy` — the exact optimum of HAWQ-V3's integer linear program
  (Yao et al., ICML 2021, arXiv:2011.10680), solved with SciPy's HiGHS MILP solver;
* :func:`greedy_policy` — start at the widest widths and repeatedly move the layer to the faster
  candidate with the best latency saved per unit of added sensitivity (the baseline of
  sensitivity-ranking tools).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np

from npujax.errors import ConfigError
from npujax.search.cost import LatencyTable

__all__ = ["ilp_policy", "greedy_policy", "fastest_latency_s", "allowed_mask", "Pinned",
           "fit_exact_budget", "check_budget"]


#: ``{layer: weight_bits or (weight_bits, act_bits)}``: layers whose choice is fixed (e.g. the
#: first and last layers at 8 bits, as HAWQ-V3 and HAQ keep them).
Pinned = Mapping[str, "int | tuple[int, int]"]


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


def _check(table: LatencyTable, sensitivity: Mapping[str, Mapping[int, float]], budget_s: float,
           pinned: Pinned | None = None):
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


def ilp_policy(
    table: LatencyTable, sensitivity: Mapping[str, Mapping[int, float]], budget_s: float,
    pinned: Pinned | None = None,
) -> dict[str, int]:
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

    lat, omega = _check(table, sensitivity, budget_s, pinned)
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


def greedy_policy(
    table: LatencyTable, sensitivity: Mapping[str, Mapping[int, float]], budget_s: float,
    pinned: Pinned | None = None,
) -> dict[str, int]:
    """Narrow layers one step at a time, best latency saved per sensitivity added first.

    Args and Returns as :func:`ilp_policy`.
    """
    lat, omega = _check(table, sensitivity, budget_s, pinned)
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

"""Mixture-of-experts routing for the latency model: how many experts a step touches and how
many tokens each gets (:func:`expected_experts`, :func:`expert_loads`).

A step routes ``n`` tokens (``batch x tokens``), each to ``k`` distinct experts of ``E``. Only
the experts that receive a token read their weights, so the weight bytes of a step are those of
the *distinct* experts touched, and the MACs those of the ``n k`` token-expert assignments.

**Uniform routing.** If each token picks its ``k`` experts uniformly among the ``C(E, k)``
subsets, independently of the other tokens, a given expert is left out by one token with
probability ``C(E-1, k) / C(E, k) = (E - k) / E``, by all ``n`` tokens with ``((E - k) / E)^n``,
and by linearity of expectation

    E[distinct experts] = E * (1 - (1 - k / E)^n)

(the occupancy problem: Feller, *An Introduction to Probability Theory and Its Applications*,
vol. 1, 3rd ed., 1968, ch. II.11 and IV.2; for ``k = 1`` the classic ``E (1 - (1 - 1/E)^n)``).
``tests/models/test_moe.py`` checks it against a Monte Carlo of random routings.

**Measured loads.** A router is not uniform. Given the measured fraction ``f_e`` of the
token-expert assignments that go to expert ``e`` (``sum f_e = 1``), a token picks ``e`` with
probability ``q_e = k f_e`` (at most 1), and ``E[distinct] = sum_e (1 - (1 - q_e)^n)`` (tokens
independent; the uniform case is ``f_e = 1 / E``).

**The costed routing.** The cost program counts whole GEMMs, so a step is costed with whole
expert counts: the routings with ``floor(E[distinct])`` and ``ceil(E[distinct])`` experts
(:func:`costed_experts`), each with the ``n k`` assignments spread over its experts as evenly
as possible (uniform) or in proportion to ``f_e`` over the most loaded ones (measured), and
their latencies weighted by the fractional part (:func:`npujax.models.serving.lower_decoder`).
MACs are exact in each; the weighted weight bytes equal the expectation exactly. (The latency
is interpolated linearly in the expert count: exact where the step's time is linear in the
weight bytes it reads, a memory-bound decode step.)
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from npujax.errors import ConfigError

__all__ = ["expected_experts", "costed_experts", "expert_loads", "check_loads"]


def check_loads(loads: Sequence[float], experts: int, k: int) -> np.ndarray:
    """Measured per-expert fractions of the assignments as a float64 ``[experts]`` array that
    sums to 1 (a list of counts is normalised).

    Raises:
      ConfigError: the wrong length, a negative or non-finite entry, all zero, or an expert
        picked by more than every token (``k f_e > 1``).
    """
    f = np.asarray(loads, np.float64)
    if f.shape != (experts,) or not np.all(np.isfinite(f)) or np.any(f < 0) or f.sum() <= 0:
        raise ConfigError(f"expert loads must be {experts} non-negative numbers (one per "
                          f"routed expert, fractions or token counts), got {len(f)} "
                          f"({list(f[:4])}...).")
    f = f / f.sum()
    if np.any(k * f > 1 + 1e-9):
        raise ConfigError(f"expert loads: expert {int(np.argmax(f))} gets {f.max():.3f} of "
                          f"the assignments, more than 1/k = {1 / k:.3f}: each token picks "
                          f"{k} distinct experts, so none can take more than every token.")
    return f


def expected_experts(n: int, experts: int, k: int,
                     loads: Sequence[float] | None = None) -> float:
    """Expected distinct experts touched when ``n`` tokens are routed top-``k`` among
    ``experts`` (module docstring): ``E (1 - (1 - k/E)^n)`` uniform, ``sum_e (1 - (1 -
    k f_e)^n)`` with measured fractions ``loads``.

    Raises:
      ConfigError: ``n < 1``, ``k`` outside ``[1, experts]``, or bad ``loads``
        (:func:`check_loads`).
    """
    if n < 1 or not 1 <= k <= experts:
        raise ConfigError(f"routing needs n >= 1 tokens and 1 <= k <= experts; got n={n}, "
                          f"k={k}, experts={experts}.")
    if loads is None:
        return float(experts * (1.0 - (1.0 - k / experts) ** n))
    q = np.minimum(k * check_loads(loads, experts, k), 1.0)
    return float(np.sum(1.0 - (1.0 - q) ** n))


def costed_experts(n: int, experts: int, k: int, loads: Sequence[float] | None = None
                   ) -> tuple[tuple[int, float], ...]:
    """The whole expert counts a step is costed at and their weights: ``((floor(D), 1 - a),
    (ceil(D), a))`` with ``D = E[distinct]`` and ``a`` its fractional part (one entry when ``D``
    is whole), so that the weighted weight bytes equal the expectation exactly.

    Example:
      >>> costed_experts(4, 8, 2)   # E[distinct] = 8 (1 - 0.75^4) = 5.47
      ((5, 0.53125), (6, 0.46875))
    """
    d = expected_experts(n, experts, k, loads)
    lo = int(np.floor(d + 1e-12))
    a = d - lo
    if a < 1e-9 or lo >= min(experts, n * k):
        return ((min(lo, experts, n * k), 1.0),)
    return ((lo, 1.0 - a), (lo + 1, a))


def expert_loads(n: int, experts: int, k: int, loads: Sequence[float] | None = None, *,
                 distinct: int | None = None) -> tuple[tuple[int, int], ...]:
    """The costed routing of ``n`` tokens (module docstring): ``((experts, tokens each), ...)``
    per load class, the ``n k`` assignments over ``D`` experts (``distinct``, default
    ``round(E[distinct])``).

    Example:
      >>> expert_loads(4, 8, 2)   # E[distinct] = 8 (1 - 0.75^4) = 5.47 -> 5 experts, 8 tokens
      ((2, 1), (3, 2))
    """
    total = n * k
    d = int(round(expected_experts(n, experts, k, loads))) if distinct is None else distinct
    d = max(min(d, experts, total), k if n >= 1 else 1)
    if loads is None:
        per = np.full(d, total // d, np.int64)
        per[: total - int(per.sum())] += 1
    else:
        f = check_loads(loads, experts, k)
        top = np.sort(f)[::-1][:d]
        top = top / top.sum() if top.sum() > 0 else np.full(d, 1.0 / d)
        per = np.maximum(np.floor(top * total).astype(np.int64), 1)
        while per.sum() > total:  # (the floor of 1 can overshoot)
            per[int(np.argmax(per))] -= 1
        rem = total - int(per.sum())
        order = np.argsort(-(top * total - per))
        per[order[:rem]] += 1
    values, counts = np.unique(per, return_counts=True)
    return tuple((int(c), int(v)) for v, c in zip(values, counts))

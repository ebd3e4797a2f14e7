"""Shape buckets (npujax.plan.buckets): the dynamic programme against brute force."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from npujax.errors import ConfigError
from npujax.plan.buckets import ShapeCosts, bucket_plans, optimal_buckets, switch_reload_s


def _brute(lat, p, k):
    """Every set of at most k buckets containing the largest shape; each shape padded to the
    cheapest bucket that holds it."""
    n = len(lat)
    best = (float("inf"), ())
    for m in range(1, k + 1):
        for rest in itertools.combinations(range(n - 1), m - 1):
            ends = (*rest, n - 1)
            c = sum(p[i] * min(lat[e] for e in ends if e >= i) for i in range(n))
            best = min(best, (c, ends))
    return best


@pytest.mark.parametrize("seed", range(40))
def test_dp_equals_brute_force(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 8))
    if seed % 2:  # latency not monotone in the shape (alignment staircases)
        lat = rng.uniform(1, 10, n)
    else:
        lat = np.sort(rng.uniform(1, 10, n))
    p = rng.dirichlet(np.ones(n))
    for k in range(1, n + 2):
        cost, ends = optimal_buckets(lat, p, k)
        ref, _ = _brute(lat, p, min(k, n))
        assert cost == pytest.approx(ref, rel=1e-12)
        assert ends[-1] == n - 1 and len(ends) <= k
        # the plan's own cost, each shape to its nearest bucket, is what the DP says
        own = sum(p[i] * lat[next(e for e in ends if e >= i)] for i in range(n))
        assert own == pytest.approx(cost, rel=1e-12)


def test_plans_report_waste_and_compile():
    costs = ShapeCosts(("8", "16", "32"), (0.5, 0.3, 0.2), (1.0, 2.0, 4.0), (10, 20, 40),
                       (100.0, 200.0, 400.0))
    one, three = bucket_plans(costs, [1, 3], compile_s=2.0, inferences=100)
    assert one.buckets == ("32",) and one.latency_s == pytest.approx(4.0)
    assert one.wasted_macs == pytest.approx(0.5 * 30 + 0.3 * 20)
    assert one.compile_s == pytest.approx(0.02)
    assert three.buckets == ("8", "16", "32") and three.wasted_macs == 0
    assert three.latency_s == pytest.approx(0.5 + 0.6 + 0.8)
    assert three.total_s == pytest.approx(1.9 + 0.06)
    assert switch_reload_s([0.5, 0.5], 1.0) == pytest.approx(0.5)


def test_bad_inputs_refused():
    with pytest.raises(ConfigError, match="sum to 1"):
        ShapeCosts(("a",), (0.5,), (1.0,), (1,), (1.0,))
    costs = ShapeCosts(("a",), (1.0,), (1.0,), (1,), (1.0,))
    with pytest.raises(ConfigError, match=">= 1"):
        bucket_plans(costs, [0])
    with pytest.raises(ConfigError, match="inferences"):
        bucket_plans(costs, [1], inferences=0)

"""The vectorised Pareto front equals the row-by-row scan it replaced and the definition
(brute force), order included, on small random tables with ties, duplicates, infinities,
signed zeros and NaN."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from npujax.errors import ShapeError
from npujax.explore import pareto_front


def row_by_row(objectives):
    """The implementation before the vectorised one (npujax 0.x, explore/sweep.py), verbatim."""
    obj = np.asarray(objectives, np.float64)
    order = np.lexsort(obj.T[::-1])
    front: list[int] = []
    for i in order:
        if front:
            f = obj[front]
            dominated = np.all(f <= obj[i], axis=1) & np.any(f < obj[i], axis=1)
            if dominated.any():
                continue
        front.append(int(i))
    return np.asarray(front, np.int64)


def brute_force(obj):
    """The rows no other row dominates (all minimised), by the definition."""
    return {i for i, p in enumerate(obj)
            if not np.any(np.all(obj <= p, 1) & np.any(obj < p, 1))}


# few distinct values, so ties and duplicate rows are common
VALUES = st.sampled_from([0.0, -0.0, 1.0, 2.0, 3.0, np.inf, -np.inf, np.nan])
TABLES = st.integers(1, 4).flatmap(lambda k: hnp.arrays(
    np.float64, st.tuples(st.integers(0, 20), st.just(k)), elements=VALUES))


@settings(max_examples=100, deadline=None)
@given(TABLES)
def test_equals_the_row_by_row_scan_and_the_definition(obj):
    front = pareto_front(obj)
    assert front.dtype == np.int64
    assert front.tolist() == row_by_row(obj).tolist()
    assert set(front.tolist()) == brute_force(obj)


@pytest.mark.parametrize("k", [2, 3])
def test_larger_random_tables(k):
    rng = np.random.default_rng(k)
    obj = rng.integers(0, 50, (3000, k)).astype(float)
    assert pareto_front(obj).tolist() == row_by_row(obj).tolist()


@pytest.mark.parametrize("shape", [(5,), (5, 0), (2, 3, 4)])
def test_a_table_of_another_shape_is_refused(shape):
    with pytest.raises(ShapeError, match=r"\[n, k\]"):
        pareto_front(np.zeros(shape))

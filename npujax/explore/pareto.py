"""The Pareto front of a table of objectives, vectorised.

Row ``j`` *dominates* row ``i`` when it is at least as good in every objective and better in one
(all minimised). The front is every row no other row dominates; equal rows are all kept.

Sorting the rows lexicographically (first objective, then the next, ...) puts every row after
all the rows that dominate it, so a row is on the front iff no row before it dominates it:

* one objective: the rows equal to the minimum;
* two objectives (Kung, Luccio and Preparata's maxima algorithm, J. ACM 22(4), 1975, §2): a row
  is dominated iff a row with a smaller first objective has a second objective no larger, or a
  row with the same first objective has a smaller second; a running minimum of the second
  objective over the sorted rows answers both for all rows at once, in ``O(n log n)``;
* more objectives: the sorted rows are culled in order, each row still standing is on the
  front and removes at once (numpy broadcasting) every later row it dominates; ``O(n · f)``
  comparisons for a front of ``f`` rows, most rows falling to the first few.

A row holding NaN compares false with everything, so (as a row-by-row scan would find) it is
never dominated and dominates nothing: it is kept.
"""

from __future__ import annotations

import numpy as np

from npujax.errors import ShapeError

__all__ = ["pareto_front"]

def pareto_front(objectives: np.ndarray) -> np.ndarray:
    """Indices of the Pareto-optimal rows of ``objectives`` (all minimised): no other row is at
    least as good in every objective and better in one. Rows with equal objectives are all
    kept.

    Args:
      objectives: ``[n, k]`` numbers (any real dtype; compared as float64), ``k >= 1``.

    Returns:
      int64 ``[f]`` row indices, sorted by the objectives lexicographically (the first, then
      the next on ties), equal rows by index.

    Raises:
      ShapeError: ``objectives`` is not two-dimensional with at least one column.

    Example:
      >>> pareto_front(np.array([[1.0, 3.0], [2.0, 2.0], [2.0, 3.0], [1.0, 3.0]])).tolist()
      [0, 3, 1]
    """
    obj = np.asarray(objectives, np.float64)
    if obj.ndim != 2 or obj.shape[1] < 1:
        raise ShapeError(f"pareto_front takes an [n, k] array of objectives (k >= 1), got "
                         f"shape {obj.shape}.")
    order = np.lexsort(obj.T[::-1])
    if len(order) == 0:
        return order.astype(np.int64)
    srt = obj[order]
    nan = np.asarray(np.isnan(srt).any(axis=1))
    keep = nan.copy()  # a row holding NaN is never dominated
    finite = np.flatnonzero(~nan)  # NaN sorts last: these lead, in order
    keep[finite] = _non_dominated(srt[finite])
    return order[keep].astype(np.int64)


def _non_dominated(srt: np.ndarray) -> np.ndarray:
    """Whether each row of lexicographically sorted, NaN-free ``srt`` ``[n, k]`` is dominated
    by no other row."""
    n, k = srt.shape
    if n == 0:
        return np.zeros(0, bool)
    if k == 1:
        return srt[:, 0] == srt[0, 0]
    if k == 2:
        a, b = srt[:, 0], srt[:, 1]
        # first row of each run of equal first objectives (the run's smallest second objective)
        new = np.empty(n, bool)
        new[0] = True
        np.not_equal(a[1:], a[:-1], out=new[1:])
        start = np.maximum.accumulate(np.where(new, np.arange(n), 0))
        # the smallest second objective over the rows of strictly smaller first objective
        # (none for the first run)
        before = np.minimum.accumulate(b)[np.maximum(start - 1, 0)]
        return ((start == 0) | (before > b)) & (b == b[start])
    index, rows, i = np.arange(n), srt, 0
    while i < len(rows):  # rows[i] is on the front: drop the rows after it that it dominates
        p, rest = rows[i], rows[i + 1:]
        dominated = (p <= rest).all(axis=1) & (p < rest).any(axis=1)
        if dominated.any():
            kept = np.concatenate([np.ones(i + 1, bool), ~dominated])
            rows, index = rows[kept], index[kept]
        i += 1
    keep = np.zeros(n, bool)
    keep[index] = True
    return keep

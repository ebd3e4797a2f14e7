"""Changing input shapes: recompile per shape, or pad to a few buckets.

A model compiled for static shapes (most NPU toolchains: the Edge TPU compiler, TensorRT
without dynamic profiles, TFLite delegates) recompiles or reloads when the input shape changes.
Given a distribution of input shapes ``s_1 < ... < s_n`` (sequence lengths or resolutions that
each contain the smaller, with probabilities ``p_i``), the deployment either compiles one model
per shape, or pads every input to the smallest of ``k`` compiled *buckets* that holds it (and
spends the padded shape's MACs and bytes). Per inference the expected cost is

    E[latency] = sum_i p_i latency(bucket(s_i)) + k * compile_s / inferences,

the compile (or reload) time ``compile_s`` (``host.shape_compile_s``) amortised over the
``inferences`` a compiled model serves. Recompiling per shape is the ``k = n`` plan.

The buckets are chosen exactly by dynamic programming over the sorted shapes: a bucket that
covers shapes ``i..j`` costs ``latency(s_j) * (p_i + ... + p_j)``, and ``f(m, j) = min_i
f(m-1, i-1) + latency(s_j) P(i..j)`` is the cheapest plan of at most ``m`` buckets of the
first ``j`` shapes (``O(k n^2)``). A bucket whose latency is not below that of a larger bucket
serves nothing the larger one would not serve faster, so the best plan's latencies increase
with the shape and each shape goes to the nearest bucket: the contiguous split is exact even
when latency is not monotone in the shape (``tests/plan/test_buckets.py`` checks it against
brute force). The latencies come from the one cost program at each shape
(:func:`npujax.lower`), padding waste from its MACs and DRAM bytes there.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from npujax.errors import ConfigError

__all__ = ["BucketPlan", "ShapeCosts", "optimal_buckets", "bucket_plans", "switch_reload_s"]


@dataclasses.dataclass(frozen=True)
class ShapeCosts:
    """The model's cost at each distinct input shape of a distribution (sorted, smallest first).

    Attributes:
      shapes: the shapes' labels (e.g. ``"48x320"``), in increasing order.
      probabilities: their probabilities (summing to 1).
      latency_s: the lowered latency at each shape (s).
      macs: MACs at each shape.
      dram_bytes: DRAM bytes per inference at each shape.
    """

    shapes: tuple[str, ...]
    probabilities: tuple[float, ...]
    latency_s: tuple[float, ...]
    macs: tuple[int, ...]
    dram_bytes: tuple[float, ...]

    def __post_init__(self) -> None:
        n = len(self.shapes)
        if n == 0:
            raise ConfigError("the shape distribution is empty; give at least one shape.")
        for f in ("probabilities", "latency_s", "macs", "dram_bytes"):
            if len(getattr(self, f)) != n:
                raise ConfigError(f"ShapeCosts.{f} has {len(getattr(self, f))} entries for "
                                  f"{n} shapes.")
        p = np.asarray(self.probabilities, float)
        if np.any(~np.isfinite(p)) or np.any(p < 0) or not math.isclose(p.sum(), 1.0,
                                                                          rel_tol=1e-6):
            raise ConfigError(f"the shape probabilities must be >= 0 and sum to 1, got "
                              f"{list(self.probabilities)} (sum {p.sum():g}); normalise them.")
        if np.any(~np.isfinite(self.latency_s)) or np.any(np.asarray(self.latency_s) < 0):
            raise ConfigError("every shape's latency must be finite and >= 0.")


@dataclasses.dataclass(frozen=True)
class BucketPlan:
    """The best plan with at most ``k`` buckets.

    Attributes:
      k: the largest number of buckets allowed.
      buckets: the compiled shapes (labels), smallest first; ``len(buckets) <= k``.
      assignment: per input shape, the index (into ``buckets``) it is padded to.
      latency_s: expected latency per inference of the padded inputs (s).
      compile_s: expected compile (reload) time per inference, ``len(buckets) * compile_s /
        inferences`` (s).
      total_s: ``latency_s + compile_s``.
      wasted_macs, wasted_dram_bytes: expected padded MACs and DRAM bytes per inference, above
        those of the unpadded shape.
    """

    k: int
    buckets: tuple[str, ...]
    assignment: tuple[int, ...]
    latency_s: float
    compile_s: float
    total_s: float
    wasted_macs: float
    wasted_dram_bytes: float

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return {**dataclasses.asdict(self), "buckets": list(self.buckets),
                "assignment": list(self.assignment)}


def optimal_buckets(latency_s: Sequence[float] | np.ndarray,
                    probabilities: Sequence[float] | np.ndarray, k: int
                    ) -> tuple[float, tuple[int, ...]]:
    """The exact minimum of ``sum_i p_i latency(bucket(i))`` over plans of at most ``k`` buckets.

    Args:
      latency_s: ``[n]`` latency at each shape, the shapes in increasing order.
      probabilities: ``[n]`` their probabilities (>= 0).
      k: the largest number of buckets, >= 1.

    Returns:
      ``(expected latency, bucket end indices)``: the indices of the bucket shapes, increasing,
      the last one ``n - 1`` (every shape must fit in some bucket).

    Raises:
      ConfigError: ``k < 1`` or inputs of different lengths.
    """
    lat = np.asarray(latency_s, float)
    p = np.asarray(probabilities, float)
    n = lat.size
    if k < 1 or p.size != n or n == 0:
        raise ConfigError(f"optimal_buckets needs k >= 1 (got {k}) and one probability per "
                          f"latency (got {p.size} and {n}).")
    k = min(k, n)
    cum = np.concatenate([[0.0], np.cumsum(p)])
    inf = float("inf")
    f = np.full((k + 1, n + 1), inf)  # f[m, j]: first j shapes in at most m buckets
    arg = np.zeros((k + 1, n + 1), int)
    f[:, 0] = 0.0
    for m in range(1, k + 1):
        for j in range(1, n + 1):
            best, at = f[m - 1, j], -1  # fewer buckets (at most m - 1)
            for i in range(j):  # the last bucket covers shapes i..j-1, its shape j-1
                c = f[m - 1, i] + lat[j - 1] * (cum[j] - cum[i])
                if c < best:
                    best, at = c, i
            f[m, j], arg[m, j] = best, at
    ends: list[int] = []
    m, j = k, n
    while j > 0:
        if arg[m, j] < 0:
            m -= 1
            continue
        ends.append(j - 1)
        j, m = arg[m, j], m - 1
    return float(f[k, n]), tuple(sorted(ends))


def switch_reload_s(probabilities: Sequence[float], compile_s: float) -> float:
    """Expected reload time per inference when one compiled model is resident and the next
    input's shape is drawn independently: ``compile_s * (1 - sum_i p_i^2)`` (the probability
    that it differs from the previous one)."""
    p = np.asarray(probabilities, float)
    return float(compile_s * (1.0 - np.sum(p * p)))


def bucket_plans(costs: ShapeCosts, ks: Sequence[int], *, compile_s: float = 0.0,
                 inferences: float = 1000.0) -> list[BucketPlan]:
    """The best plan for each ``k`` in ``ks`` (``k`` larger than the shapes: one per shape).

    Args:
      costs: the model's cost at each shape (:class:`ShapeCosts`).
      ks: bucket counts, each >= 1.
      compile_s: compile or reload time per compiled shape (s), >= 0
        (``host.shape_compile_s``).
      inferences: inferences a compiled model serves (amortises ``compile_s``), > 0.

    Returns:
      One :class:`BucketPlan` per ``k``.

    Raises:
      ConfigError: a ``k < 1``, a negative ``compile_s`` or ``inferences <= 0``.
    """
    if compile_s < 0 or not math.isfinite(compile_s):
        raise ConfigError(f"compile_s must be a finite number >= 0, got {compile_s}.")
    if not inferences > 0:
        raise ConfigError(f"inferences must be > 0, got {inferences}.")
    p = np.asarray(costs.probabilities, float)
    macs = np.asarray(costs.macs, float)
    dram = np.asarray(costs.dram_bytes, float)
    out = []
    for k in ks:
        if int(k) < 1:
            raise ConfigError(f"a bucket count must be >= 1, got {k}.")
        lat, ends = optimal_buckets(costs.latency_s, p, int(k))
        assign = tuple(next(b for b, e in enumerate(ends) if e >= i)
                       for i in range(len(costs.shapes)))
        padded = np.asarray([ends[a] for a in assign])
        comp = len(ends) * compile_s / inferences
        out.append(BucketPlan(
            int(k), tuple(costs.shapes[e] for e in ends), assign, lat, comp, lat + comp,
            float(np.sum(p * (macs[padded] - macs))), float(np.sum(p * (dram[padded] - dram)))))
    return out

"""Baselines of the co-design (:mod:`npujax.search.codesign`): random search and grid search
over the same space (array rows and columns, SRAM bytes, bandwidth class, per-layer (w, a)
widths), with the same budgets and the same exact evaluator (one :func:`npujax.lower` per
design), for the comparison of ``docs/results/codesign.md``."""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from npujax.hw.spec import NpuSpec
from npujax.ir.graph import Graph
from npujax.search.codesign import CodesignConfig, Design, _Problem

__all__ = ["random_search", "grid_search"]


def _sample(p: _Problem, rng: np.random.Generator) -> tuple[int, int, list[int], int, list[int]]:
    cfg = p.config
    lo, hi = cfg.dim_range
    slo, shi = cfg.sram_range_bytes

    def log_uniform(a: float, b: float) -> float:
        return float(np.exp(rng.uniform(math.log(a), math.log(b))))

    r, c = int(round(log_uniform(lo, hi))), int(round(log_uniform(lo, hi)))
    sram = [max(slo, int(log_uniform(slo, shi) // 1024) * 1024) for _ in range(3)]
    k = int(rng.integers(len(p.classes)))
    choice = [int(v) for v in rng.integers(len(p.pairs), size=len(p.names))]
    return r, c, sram, k, choice


def random_search(graph: Graph, base: NpuSpec, sensitivity: Mapping[str, Mapping[Any, float]],
                  config: CodesignConfig, evaluations: int, seed: int = 0,
                  max_draws: int = 1_000_000) -> list[Design]:
    """Random search over :func:`codesign`'s space with ``evaluations`` exact evaluations.

    Rows, columns and SRAM bytes are drawn log-uniformly in their ranges (SRAM in whole KiB),
    the bandwidth class and each layer's (w, a) pair uniformly. Draws over the area budget or
    the accuracy constraint are rejected before any evaluation (they are cheap to check), so
    every evaluation is spent on a design that may be feasible (power is checked after).

    Returns:
      The evaluated designs, in order (fewer than ``evaluations`` when ``max_draws`` draws
      found no more candidates).
    """
    p = _Problem(graph, base, sensitivity, config)
    rng = np.random.default_rng(seed)
    out: list[Design] = []
    for _ in range(max_draws):
        if len(out) >= evaluations:
            break
        r, c, sram, k, choice = _sample(p, rng)
        if float(p.omega[np.arange(len(choice)), choice].sum()) > config.max_loss_increase:
            continue
        spec = p.exact_spec(r, c, sram, k)
        if p.total_area(spec, k) > config.area_mm2:
            continue
        out.append(p.evaluate(spec, k, choice, "random"))
    return out


def grid_search(graph: Graph, base: NpuSpec, sensitivity: Mapping[str, Mapping[Any, float]],
                config: CodesignConfig, evaluations: int) -> list[Design]:
    """Grid search with at most ``evaluations`` exact evaluations.

    The grid: rows and columns at powers of two in the range, the three SRAM buffers at one
    shared size (powers of four KiB), every bandwidth class and every *uniform* (w, a) pair (a
    per-layer grid has ``n^G`` points). Points over the area or accuracy budget are dropped
    without evaluation; if more remain than ``evaluations``, an evenly spaced subset of them
    (in grid order) is evaluated.

    Returns:
      The evaluated designs.
    """
    p = _Problem(graph, base, sensitivity, config)
    lo, hi = config.dim_range
    dims = [2 ** i for i in range(int(math.log2(lo)), int(math.log2(hi)) + 1) if lo <= 2 ** i <= hi]
    slo, shi = config.sram_range_bytes
    srams = [4 ** i * 1024 for i in range(12) if slo <= 4 ** i * 1024 <= shi]
    G = len(p.names)
    points = []
    for r, c, s, k, j in itertools.product(dims, dims, srams, range(len(p.classes)),
                                           range(len(p.pairs))):
        if float(p.omega[:, j].sum()) > config.max_loss_increase:
            continue
        spec_area = p.total_area(_cheap_spec(p, r, c, s, k), k)
        if spec_area <= config.area_mm2:
            points.append((r, c, s, k, j))
    if len(points) > evaluations:
        idx = np.linspace(0, len(points) - 1, evaluations).round().astype(int)
        points = [points[i] for i in idx]
    return [p.evaluate(p.exact_spec(r, c, (s, s, s), k), k, [j] * G, "grid")
            for r, c, s, k, j in points]


def _cheap_spec(p: _Problem, r: int, c: int, s: int, k: int) -> NpuSpec:
    return p.exact_spec(r, c, (s, s, s), k)

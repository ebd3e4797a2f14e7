"""npujax's closed-form GEMM figures restated in SCALE-Sim 3.0.0's report conventions.

SCALE-Sim (Samajdar et al., arXiv:1811.02883; the ``scalesim`` package, version 3.0.0) reports per
layer in ``COMPUTE_REPORT.csv`` and ``DETAILED_ACCESS_REPORT.csv``. Its figures differ from
:func:`npujax.systolic.gemm_cycles` by fixed, documented conventions, all read from its source:

* ``Total Cycles`` is the 0-based cycle stamp of the last OFMAP write: ``compute_cycles - 1``.
* ``Overall Util %`` = 100 x MACs / (``Total Cycles`` x R x C) (so it uses the offset count).
* ``Mapping Efficiency %`` = 100 x npujax's ``mapping_efficiency``.
* ``Compute Util %`` is the mean over folds of ``used PEs x T / (R x C x L)``, where L is the
  length of one of its per-fold demand matrices *before* skewing plus its width minus one: the
  fold length (``fill + T + drain``) for output stationary, but ``fold + C - 1`` for weight and
  input stationary (it measures the filter / ifmap demand matrix, whose C - 1 skew rows are
  counted again).
* ``SRAM IFMAP Reads`` / ``SRAM Filter Reads`` are npujax's ``sram_reads_a`` / ``sram_reads_b``.
* ``SRAM OFMAP Writes`` is ``sram_writes_out``, except for output stationary where SCALE-Sim adds
  ``R + C`` per fold (the height plus width of its padded output block,
  ``systolic_compute_os.create_ofmap_demand_mat``); these are not data writes.

Use this module to compare with SCALE-Sim one to one; use :func:`gemm_cycles` for the physics.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from npujax._exact import count, exact, real
from npujax.systolic.dataflow import Dataflow, gemm_cycles, get_dataflow

__all__ = ["scalesim_report"]


@exact
def scalesim_report(M, K, N, rows, cols, dataflow: str | Dataflow) -> dict[str, jax.Array]:
    """SCALE-Sim 3.0.0's per-layer report figures for an ``[M,K] x [K,N]`` GEMM (pure jnp).

    Args:
      M: GEMM rows (for a conv layer: output pixels), >= 1.
      K: the reduction extent (for a conv layer: the window size), >= 1.
      N: GEMM columns (for a conv layer: filters), >= 1.
      rows: array height in PEs, >= 1.
      cols: array width in PEs, >= 1.
      dataflow: a :class:`Dataflow` or its name (static).

    Returns:
      dict: int64 (exact, ``npujax._exact``) ``total_cycles``, ``sram_ifmap_reads``,
      ``sram_filter_reads``, ``sram_ofmap_writes``; float64 percentages ``overall_util_pct``,
      ``mapping_efficiency_pct``, ``compute_util_pct``. ``stall_cycles`` is 0 (SCALE-Sim's CALC
      bandwidth mode sizes the DRAM interface so that nothing stalls).

    Raises:
      ConfigError: unknown dataflow name.
    """
    df = get_dataflow(dataflow)
    g = gemm_cycles(M, K, N, rows, cols, df)
    M, K, N, rows, cols = (count(v) for v in (M, K, N, rows, cols))
    _, _, t = df.map_gemm(M, K, N)
    pes = real(rows * cols)
    macs = real(M) * real(K) * real(N)
    is_os = df.layout[2] == "K"  # the reduction streams in time: outputs stay in the PEs
    util_len = g["fold_cycles"] + (0 if is_os else cols - 1)
    ofmap_writes = g["sram_writes_out"] + (g["folds"] * (rows + cols) if is_os else 0)
    return {
        "total_cycles": g["scalesim_cycles"],
        "stall_cycles": jnp.zeros_like(g["folds"]),
        "overall_util_pct": 100.0 * macs / (real(g["scalesim_cycles"]) * pes),
        "mapping_efficiency_pct": 100.0 * g["mapping_efficiency"],
        "compute_util_pct": 100.0 * g["mapping_efficiency"] * real(t) / real(util_len),
        "sram_ifmap_reads": g["sram_reads_a"],
        "sram_filter_reads": g["sram_reads_b"],
        "sram_ofmap_writes": ofmap_writes,
    }

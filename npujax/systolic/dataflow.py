"""Systolic-array dataflows and the fold-based compute-cycle model.

A GEMM ``out[M, N] = a[M, K] @ b[K, N]`` (a convolution after im2col: M = batch x output pixels,
K = C_in/groups x k_h x k_w, N = C_out) is mapped onto an R x C PE array by a dataflow, which
chooses which two GEMM dimensions are laid out spatially (on the array rows and columns) and which
one streams in time (Samajdar et al., "SCALE-Sim: Systolic CNN Accelerator Simulator",
arXiv:1811.02883; Samajdar et al., ISPASS 2020):

===================  ======================  ======================  =============
dataflow             array rows hold (S_R)   array cols hold (S_C)   time (T)
===================  ======================  ======================  =============
weight_stationary    K (reduction)           N (filters)             M (pixels)
output_stationary    M (pixels)              N (filters)             K (reduction)
input_stationary     K (reduction)           M (pixels)              N (filters)
===================  ======================  ======================  =============

When S_R > R or S_C > C the mapping is *folded*: ``ceil(S_R / R) * ceil(S_C / C)`` folds run one
after another. Each fold costs ``2R + C + T - 2`` cycles (SCALE-Sim's analytical runtime with the
array dimensions): a *fill* of R cycles (stationary operands loaded / skewed into the rows), T
cycles of *streaming*, and a *drain* of R + C - 2 cycles for the last partial sums to ripple out.

All functions here are pure ``jnp`` over (possibly traced) integers, so they ``jit`` and ``vmap``
over layers and hardware configurations.
"""

from __future__ import annotations

import abc
from typing import ClassVar, final

import jax
import jax.numpy as jnp

from npujax.errors import ConfigError
from npujax.hw.spec import DATAFLOWS

__all__ = [
    "Dataflow",
    "WeightStationary",
    "OutputStationary",
    "InputStationary",
    "get_dataflow",
    "gemm_cycles",
]


def _ceil_div(a, b):
    return (a + b - 1) // b


class Dataflow(abc.ABC):
    """How a GEMM's three dimensions map onto an R x C systolic array.

    Subclasses only state the mapping; the fold and fill/drain arithmetic is shared.
    """

    name: ClassVar[str]

    @abc.abstractmethod
    def map_gemm(self, M, K, N):
        """Return ``(S_R, S_C, T)``: the GEMM extents on array rows, array columns and time."""

    def fill_cycles(self, rows, cols):
        """Cycles to load/skew the stationary operand into the array before streaming (R)."""
        del cols
        return rows

    def drain_cycles(self, rows, cols):
        """Cycles for the last results to leave the array after streaming (R + C - 2)."""
        return rows + cols - 2

    def fold_cycles(self, rows, cols, temporal):
        """Cycles of one fold: fill + T + drain = ``2R + C + T - 2``."""
        return self.fill_cycles(rows, cols) + temporal + self.drain_cycles(rows, cols)

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


@final
class WeightStationary(Dataflow):
    """Weights stay in the PEs (TPU v1); K on rows, N on columns, pixels M stream in time."""

    name = "weight_stationary"

    def map_gemm(self, M, K, N):
        return K, N, M


@final
class OutputStationary(Dataflow):
    """Partial sums stay in the PEs (ShiDianNao); M on rows, N on columns, K streams in time."""

    name = "output_stationary"

    def map_gemm(self, M, K, N):
        return M, N, K


@final
class InputStationary(Dataflow):
    """Input pixels stay in the PEs; K on rows, M on columns, filters N stream in time."""

    name = "input_stationary"

    def map_gemm(self, M, K, N):
        return K, M, N


_BY_NAME: dict[str, Dataflow] = {
    d.name: d for d in (WeightStationary(), OutputStationary(), InputStationary())
}
assert tuple(sorted(_BY_NAME)) == tuple(sorted(DATAFLOWS))


def get_dataflow(dataflow: str | Dataflow) -> Dataflow:
    """The :class:`Dataflow` for a name (``weight_stationary``, ``ws``, ...) or instance.

    Raises:
      ConfigError: for an unknown name (the message lists the valid ones).
    """
    if isinstance(dataflow, Dataflow):
        return dataflow
    aliases = {"ws": "weight_stationary", "os": "output_stationary", "is": "input_stationary"}
    key = aliases.get(str(dataflow).lower(), str(dataflow).lower())
    if key not in _BY_NAME:
        raise ConfigError(
            f"unknown dataflow {dataflow!r}; use one of {', '.join(DATAFLOWS)} (or ws/os/is)."
        )
    return _BY_NAME[key]


def gemm_cycles(M, K, N, rows, cols, dataflow: str | Dataflow) -> dict[str, jax.Array]:
    """Compute cycles of an ``[M,K] x [K,N]`` GEMM on a ``rows x cols`` array.

    Args:
      M, K, N: GEMM extents (int scalars or arrays, may be traced), >= 1.
      rows, cols: array height and width in PEs (int scalars or arrays, may be traced), >= 1.
      dataflow: a :class:`Dataflow` or its name (static).

    Returns:
      dict of int32 arrays (broadcast over the inputs) ``folds``, ``compute_cycles`` and float32
      ``mapping_efficiency`` (fraction of PEs holding work, averaged over folds) and
      ``utilization`` (MACs / (compute_cycles x rows x cols)); ``utilization <=
      mapping_efficiency <= 1``.

    Example:
      >>> int(gemm_cycles(64, 9, 16, 16, 16, "output_stationary")["compute_cycles"])
      220
    """
    df = get_dataflow(dataflow)
    M, K, N, rows, cols = (jnp.asarray(v, jnp.int32) for v in (M, K, N, rows, cols))
    s_r, s_c, t = df.map_gemm(M, K, N)
    folds = _ceil_div(s_r, rows) * _ceil_div(s_c, cols)
    cycles = folds * df.fold_cycles(rows, cols, t)
    pes = (rows * cols).astype(jnp.float32)
    mapping = (s_r * s_c).astype(jnp.float32) / (folds.astype(jnp.float32) * pes)
    macs = M.astype(jnp.float32) * K.astype(jnp.float32) * N.astype(jnp.float32)
    util = macs / (cycles.astype(jnp.float32) * pes)
    return {
        "folds": folds,
        "compute_cycles": cycles,
        "mapping_efficiency": mapping,
        "utilization": util,
    }

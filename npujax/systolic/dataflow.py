"""Systolic-array dataflows and the closed-form fold model, exact to SCALE-Sim's cycle count.

A GEMM ``out[M, N] = a[M, K] @ b[K, N]`` (a convolution after im2col: M = batch x output
pixels, K = C_in/groups x k_h x k_w, N = C_out/groups) is mapped onto an R x C PE array by a
dataflow, which lays two GEMM dimensions out spatially (on the array rows and columns) and streams
the third in time (Samajdar et al., "SCALE-Sim: Systolic CNN Accelerator Simulator",
arXiv:1811.02883):

=================  ==============  ==============  ==========  ====  =========
dataflow           rows hold S_R   cols hold S_C   time T      fill  drain
=================  ==============  ==============  ==========  ====  =========
weight_stationary  K (reduction)   N (filters)     M (pixels)  R     R + C - 2
output_stationary  M (pixels)      N (filters)     K           0     R + C - 2
input_stationary   K (reduction)   M (pixels)      N           R     R + C - 2
=================  ==============  ==============  ==========  ====  =========

When S_R > R or S_C > C the mapping is *folded*: ``folds = ceil(S_R / R) * ceil(S_C / C)`` folds
run one after another, and each fold costs ``fill + T + drain`` cycles:

* weight/input stationary: the stationary operand is shifted into the R rows (*fill*, R cycles),
  then T vectors stream through (T cycles), and the last one needs R + C - 2 cycles of skew to
  reach the far corner and leave the array (*drain*): ``2R + C + T - 2`` per fold.
* output stationary: both operands stream in skewed, nothing is preloaded (fill 0); the last
  partial sum is complete R + C - 2 cycles after the last operand enters: ``R + C + T - 2``.

``compute_cycles = folds x (fill + T + drain)`` counts cycles 1..n from the first operand request to
the last output write. SCALE-Sim 3.0.0 reports the same run as ``Total Cycles`` = the 0-based index
of the last output write = ``compute_cycles - 1`` (one cycle per GEMM, not per fold; its per-fold
demand matrices have exactly ``fill + T + drain`` rows and its compute report takes the largest
cycle stamp of the OFMAP writes). :func:`gemm_cycles` returns both (``scalesim_cycles``); the
cross-check in ``tests/systolic/test_scalesim_reference.py`` shows agreement on every stored case.

SRAM traffic follows from the mapping alone: an operand is read again for every fold of the
GEMM dimension it does *not* contain (``a[M,K]`` once per fold of N, ``b[K,N]`` once per fold of
M) and the output is written once per fold of K (partial sums go back to the output buffer
between K folds). A dimension folds ``ceil(D/R)`` times on the rows, ``ceil(D/C)`` on the
columns, once in time.

All functions here are pure ``jnp`` over (possibly traced) integers, so they ``jit`` and
``vmap`` over layers and hardware configurations. Counts are exact int64, computed under a scoped
``jax.enable_x64`` (see ``npujax._exact``; exact up to 2**53 whatever JAX's config).
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Sequence
from typing import Any, ClassVar, final

import jax
import jax.numpy as jnp
import numpy as np

from npujax import _relax
from npujax._exact import exact, real
from npujax.errors import ConfigError

__all__ = [
    "Dataflow",
    "DATAFLOWS",
    "WeightStationary",
    "OutputStationary",
    "InputStationary",
    "RowStationary",
    "DATAFLOW_NAMES",
    "get_dataflow",
    "get_systolic_dataflow",
    "gemm_cycles",
    "SCALESIM_CYCLE_OFFSET",
    "Roles",
]

#: ``compute_cycles - SCALESIM_CYCLE_OFFSET`` is SCALE-Sim 3.0.0's ``Total Cycles`` for one GEMM.
SCALESIM_CYCLE_OFFSET = 1


_ceil_div = _relax.ceil_div  # exact (float64 division, npujax._relax); straight-through relaxed


def choose(cond: bool | jax.Array, if_true: Callable[[], Any],
           if_false: Callable[[], Any]) -> Any:
    """``if_true()`` where ``cond`` holds, else ``if_false()``: the one branch formula of the
    three systolic dataflows, static or as data.

    A static dataflow's :meth:`Dataflow.on` is a Python bool: then only the chosen thunk runs,
    so the traced program is that dataflow's alone, operation for operation. With
    :class:`Roles` it is a traced bool array: both thunks run and ``jnp.where`` selects each
    element's, exactly (a select rounds nothing).
    """
    if cond is True:
        return if_true()
    if cond is False:
        return if_false()
    return jnp.where(cond, if_true(), if_false())


def both(a: bool | jax.Array, b: bool | jax.Array) -> bool | jax.Array:
    """``a and b`` for :func:`choose`'s conditions: a Python bool where either settles it."""
    if a is False or b is False:
        return False
    if a is True:
        return b
    return a if b is True else a & b


def either(a: bool | jax.Array, b: bool | jax.Array) -> bool | jax.Array:
    """``a or b`` for :func:`choose`'s conditions: a Python bool where either settles it."""
    if a is True or b is True:
        return True
    if a is False:
        return b
    return a if b is False else a | b


def negate(a: bool | jax.Array) -> bool | jax.Array:
    """``not a`` for :func:`choose`'s conditions (``~`` on a Python bool would be -2)."""
    return (not a) if isinstance(a, bool) else ~a


class Dataflow(abc.ABC):
    """How a GEMM's three dimensions map onto an R x C systolic array.

    A subclass states only its mapping (:meth:`map_gemm`, as the dimension names in
    :attr:`layout`) and its fill cost; the fold, drain and SRAM arithmetic is shared here.
    """

    name: ClassVar[str]
    #: GEMM dimension names on (array rows, array columns, time), e.g. ``("K", "N", "M")``.
    layout: ClassVar[tuple[str, str, str]]

    def on(self, axis: int, dim: str) -> bool | jax.Array:
        """Whether GEMM dimension ``dim`` ("M", "K" or "N") lies on ``axis`` (0 the array rows,
        1 its columns, 2 time): a Python bool here, a traced bool array for :class:`Roles`."""
        return self.layout[axis] == dim

    def is_(self, name: str) -> bool | jax.Array:
        """Whether this is dataflow ``name`` (canonical): a Python bool here, a traced bool
        array for :class:`Roles`."""
        return self.name == name

    def pick(self, axis: int, ext: dict[str, Any]) -> Any:
        """The value of ``ext`` (``{"M": .., "K": .., "N": ..}``) for the dimension on ``axis``
        (see :meth:`on`): that entry itself for a static dataflow, an exact select for
        :class:`Roles`."""
        return choose(self.on(axis, "M"), lambda: ext["M"],
                      lambda: choose(self.on(axis, "K"), lambda: ext["K"], lambda: ext["N"]))

    def map_gemm(self, M, K, N):
        """Return ``(S_R, S_C, T)``: the GEMM extents on array rows, array columns and time."""
        ext = {"M": M, "K": K, "N": N}
        return tuple(self.pick(axis, ext) for axis in range(3))

    @abc.abstractmethod
    def fill_cycles(self, rows, cols):
        """Cycles before the first streamed operand enters a fold (preloading the stationary)."""

    def drain_cycles(self, rows, cols):
        """Cycles after the last streamed operand enters until the last result leaves: R + C - 2."""
        return rows + cols - 2

    def fold_cycles(self, rows, cols, temporal):
        """Cycles of one fold: ``fill + T + drain``."""
        return self.fill_cycles(rows, cols) + temporal + self.drain_cycles(rows, cols)

    def dim_folds(self, dim: str, extent, rows, cols, *, bound: int | None = None):
        """How many times GEMM dimension ``dim`` ("M", "K" or "N") of size ``extent`` folds
        (``bound``: a static upper bound of ``extent``, see ``npujax._relax.ceil_div``)."""
        return choose(self.on(0, dim), lambda: _ceil_div(extent, rows, bound=bound),
                      lambda: choose(self.on(1, dim), lambda: _ceil_div(extent, cols, bound=bound),
                                     lambda: jnp.ones_like(extent)))

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


@final
class WeightStationary(Dataflow):
    """Weights stay in the PEs (TPU v1); K on rows, N on columns, pixels M stream in time.

    Fill: the R rows of a weight tile are shifted in from the top, one row per cycle (R cycles).
    """

    name = "weight_stationary"
    layout = ("K", "N", "M")

    def fill_cycles(self, rows, cols):
        del cols
        return rows


@final
class OutputStationary(Dataflow):
    """Partial sums stay in the PEs (ShiDianNao); M on rows, N on columns, K streams in time.

    Fill: none, both operands stream in skewed from the left and top edges.
    """

    name = "output_stationary"
    layout = ("M", "N", "K")

    def fill_cycles(self, rows, cols):
        del cols
        return jnp.zeros_like(rows)


@final
class InputStationary(Dataflow):
    """Input pixels stay in the PEs; K on rows, M on columns, filters N stream in time.

    Fill: the R rows of an im2col input tile are shifted in (R cycles), as weights are in WS.
    """

    name = "input_stationary"
    layout = ("K", "M", "N")

    def fill_cycles(self, rows, cols):
        del cols
        return rows


@final
class RowStationary(Dataflow):
    """Eyeriss's row stationary (Chen et al., ISCA 2016): 1-D row primitives on PE sets.

    A convolution's cycles, mapping and buffer accesses come from
    :func:`npujax.systolic.rs_conv` (the cost program reads the layer's conv geometry). This
    class states the GEMM-level view that the DRAM mapper and the energy pass use: partial sums
    stay on chip for the whole reduction (the paper's processing order finishes all channels of
    a block of filters in the global buffer before moving on), so at the buffer level a tile
    of output pixels x filters is stationary, as in output stationary (M on rows, N on
    columns, K in time, no preload). There is no systolic emulator for it.
    """

    name = "row_stationary"
    layout = ("M", "N", "K")

    def fill_cycles(self, rows, cols):
        del cols
        return jnp.zeros_like(rows)


@final
class Roles(Dataflow):
    """One of the systolic dataflows (:data:`DATAFLOWS`) chosen by data: a traced int32 index.

    Weight, output and input stationary differ only in which GEMM dimension lies on the array
    rows, the columns and in time (:attr:`Dataflow.layout`) and in the fill (none for output
    stationary). Every branch of the fold, SRAM and DRAM formulas on the layout chooses between
    values computed by the same operations, so with the layout as data each branch is an exact
    ``jnp.where``. The formulas are written once, every branch through :func:`choose` on
    :meth:`Dataflow.on` (a Python bool for a static dataflow, which then traces its own
    operations alone; a traced bool here): :func:`gemm_cycles`,
    :func:`npujax.systolic.gemm_memory` and
    :func:`npujax.systolic.gemm_mapping` given a ``Roles`` return each element's own
    dataflow's figures bit for bit (``tests/systolic/test_roles.py``), and a program that takes
    its dataflow per configuration compiles the formulas once instead of once per dataflow
    (the design-space sweep: ``experiments/dataflow_roles``).

    Not for the emulator or the register model (static dataflows only), and not for
    ``row_stationary`` (its own closed form).
    """

    name = "roles"
    layout = None  # type: ignore[assignment]  # data: see :meth:`on`

    def __init__(self, index: Any):
        self.index = jnp.asarray(index, jnp.int32)
        lay = jnp.asarray(_LAYOUTS)[self.index]
        self._lay = (lay[..., 0], lay[..., 1], lay[..., 2])

    @classmethod
    def of(cls, names: Sequence[str], index: Any) -> Roles:
        """The roles of ``names[index]`` (``index`` traced int, into ``names``, each one of
        :data:`DATAFLOWS`).

        Raises:
          ConfigError: a name that is not a systolic GEMM dataflow.
        """
        canon = [get_systolic_dataflow(n).name for n in names]
        return cls(jnp.asarray(np.asarray([DATAFLOWS.index(n) for n in canon], np.int32))[
            jnp.asarray(index, jnp.int32)])

    def is_(self, name: str) -> jax.Array:
        """bool ``[*index.shape]``: the dataflow is ``name`` (one of :data:`DATAFLOWS`)."""
        return self.index == DATAFLOWS.index(name)

    def on(self, axis: int, dim: str) -> jax.Array:
        """bool ``[*index.shape]``: GEMM dimension ``dim`` ("M", "K" or "N") lies on ``axis``
        (0 the array rows, 1 its columns, 2 time)."""
        return self._lay[axis] == "MKN".index(dim)

    def fill_cycles(self, rows, cols):
        del cols
        return choose(self.is_("output_stationary"), lambda: jnp.zeros_like(rows), lambda: rows)

    def __repr__(self) -> str:
        return "Roles(<traced>)"


_BY_NAME: dict[str, Dataflow] = {
    d.name: d for d in (WeightStationary(), OutputStationary(), InputStationary(),
                        RowStationary())
}
#: The systolic GEMM dataflows (weight, output, input stationary): the emulator, the register
#: model and SCALE-Sim's cross-check cover exactly these, and "every dataflow" comparisons of
#: :func:`npujax.lower` default to them.
DATAFLOWS = ("weight_stationary", "output_stationary", "input_stationary")
#: Every dataflow name, for presets (``[array] dataflow``) and the command line: the systolic
#: ones and Eyeriss's ``row_stationary`` (:func:`npujax.systolic.rs_conv`).
DATAFLOW_NAMES = tuple(_BY_NAME)
#: ``[dataflow, (rows, cols, time)]``: the GEMM dimension (0 M, 1 K, 2 N) of each of
#: :data:`DATAFLOWS` on the array rows, columns and in time (:class:`Roles`).
_LAYOUTS = np.asarray([["MKN".index(d) for d in _BY_NAME[n].layout] for n in DATAFLOWS],
                      np.int32)
_ALIASES = {"".join(w[0] for w in name.split("_")): name for name in DATAFLOW_NAMES}


def get_dataflow(dataflow: str | Dataflow) -> Dataflow:
    """The :class:`Dataflow` for a name (``weight_stationary``, ``ws``, ...) or instance.

    Raises:
      ConfigError: for an unknown name (the message lists the valid ones).
    """
    if isinstance(dataflow, Dataflow):
        return dataflow
    key = _ALIASES.get(str(dataflow).lower(), str(dataflow).lower())
    if key not in _BY_NAME:
        raise ConfigError(
            f"unknown dataflow {dataflow!r}; use one of {', '.join(DATAFLOW_NAMES)} "
            f"(or ws/os/is/rs)."
        )
    return _BY_NAME[key]


def get_systolic_dataflow(dataflow: str | Dataflow) -> Dataflow:
    """:func:`get_dataflow`, for the systolic dataflows only (the emulator and register model).

    Raises:
      ConfigError: an unknown name, or ``row_stationary`` (no systolic emulation: its costs
        are the closed form of :func:`npujax.systolic.rs_conv`).
    """
    df = get_dataflow(dataflow)
    if df.name not in DATAFLOWS:
        raise ConfigError(
            f"dataflow {df.name!r} has no systolic emulator or register model (its cycles are "
            f"the closed form of npujax.systolic.rs_conv); emulate with one of "
            f"{', '.join(DATAFLOWS)}.")
    return df


@exact
def gemm_cycles(
    M, K, N, rows, cols, dataflow: str | Dataflow, *, bound: int | None = None
) -> dict[str, jax.Array]:
    """Compute cycles, efficiency and SRAM traffic of an ``[M,K] x [K,N]`` GEMM on an array.

    Args:
      M: rows of ``a`` and of the output (int scalar or array, may be traced), >= 1.
      K: the reduction extent (columns of ``a``, rows of ``b``), same kind, >= 1.
      N: columns of ``b`` and of the output, same kind, >= 1.
      rows: array height in PEs (int scalar or array, may be traced), >= 1.
      cols: array width in PEs, same kind, >= 1.
      dataflow: a :class:`Dataflow` or its name (static).
      bound: a static upper bound of ``M``, ``K`` and ``N`` (Python int) or None; up to 2**50
        the fold counts take the one-rounding float64 division (``npujax._relax.ceil_div``;
        the same values, fewer operations). It must hold: a smaller bound gives wrong counts.

    Returns:
      dict of arrays broadcast over the inputs. int64 (exact, see ``npujax._exact``):
      ``folds``; ``fold_cycles`` (fill + T + drain); ``compute_cycles`` (folds x fold_cycles,
      cycles); ``scalesim_cycles``
      (``compute_cycles - 1``, SCALE-Sim's ``Total Cycles``); ``sram_reads_a`` (reads of the
      ``[M,K]`` operand, SCALE-Sim's IFMAP reads), ``sram_reads_b`` (the ``[K,N]`` operand, its
      Filter reads), ``sram_writes_out`` (output writes incl. partial sums), all in elements.
      float64: ``mapping_efficiency`` (fraction of PEs holding work, averaged over folds) and
      ``utilization`` (MACs / (compute_cycles x rows x cols)); ``utilization <=
      mapping_efficiency <= 1``.

    Raises:
      ConfigError: unknown dataflow name.

    Examples:
      >>> int(gemm_cycles(64, 9, 16, 16, 16, "output_stationary")["compute_cycles"])
      156

    References:
      Samajdar et al., arXiv:1811.02883 (the fold model); SCALE-Sim 3.0.0
      ``scalesim/compute/systolic_compute_{ws,os,is}.py`` (the per-fold demand matrices whose row
      counts give ``fill + T + drain``).
    """
    df = get_dataflow(dataflow)
    M, K, N, rows, cols = (_relax.count(v) for v in (M, K, N, rows, cols))
    s_r, s_c, t = df.map_gemm(M, K, N)
    folds = _ceil_div(s_r, rows, bound=bound) * _ceil_div(s_c, cols, bound=bound)
    per_fold = df.fold_cycles(rows, cols, t)
    cycles = folds * per_fold
    pes = real(rows * cols)
    mapping = real(s_r * s_c) / (real(folds) * pes)
    macs = real(M) * real(K) * real(N)
    util = macs / (real(cycles) * pes)
    return {
        "folds": folds,
        "fold_cycles": per_fold + jnp.zeros_like(folds),
        "compute_cycles": cycles,
        "scalesim_cycles": cycles - SCALESIM_CYCLE_OFFSET,
        "mapping_efficiency": mapping,
        "utilization": util,
        "sram_reads_a": M * K * df.dim_folds("N", N, rows, cols, bound=bound),
        "sram_reads_b": K * N * df.dim_folds("M", M, rows, cols, bound=bound),
        "sram_writes_out": M * N * df.dim_folds("K", K, rows, cols, bound=bound),
    }

"""The workloads as the cost model reads them: one ``[L]`` column per field (:class:`LayerTable`).

The cost and energy models (:func:`~npujax.plan.layer_costs`, :func:`~npujax.plan.layer_energy`)
read a workload list only through these columns. Built from a list with numpy columns
(:func:`layer_table`), they enter a traced program as constants, exactly as the list's numbers
would. Passed to ``jax.jit`` as an argument instead, the columns are traced: then one compiled
program serves *every* workload list of at most the table's length (shorter ones padded with
inert rows, see :func:`layer_table`), with the same numbers bit for bit, where a constant table
compiles once per list. :func:`npujax.lower` evaluates its cost program this way, so lowering
another model, batch or resolution reuses the compiled program (in the process, and through
JAX's persistent compilation cache of the command line across processes).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

from npujax.plan.workload import Workload

__all__ = ["LayerTable", "layer_table", "table_length", "SHAPE_FIELDS", "STRUCTURE_FIELDS"]

#: The numeric :class:`~npujax.plan.Workload` fields the cost model reads (the ``shapes`` of
#: :func:`~npujax.plan.layer_costs`).
SHAPE_FIELDS = ("M", "K", "N", "groups", "macs", "weight_elems", "bias_elems", "in_elems",
                "out_elems", "vector_ops", "special_ops", "cpu_ops", "link_in_elems",
                "link_out_elems", "link_transfers", "window_rows", "window_cols", "stride_rows",
                "out_rows", "out_cols", "images")

#: The workloads' structure as the cost model reads it: on the NPU (bool), a GEMM (bool, its
#: ``kind``), fused into a preceding layer's output stage (bool), the producer's row and the
#: first consumer's row (int, -1 for none).
STRUCTURE_FIELDS = ("npu", "gemm", "fused", "producer", "first_consumer")

#: The row a table is padded with: on the CPU with no work (every cost and energy 0).
_INERT = Workload(name="", op="", kind="vector", device="cpu")

#: Shortest padded table: the lengths are powers of two from here (at most 2x the rows).
MIN_LENGTH = 16


@dataclasses.dataclass(frozen=True)
class LayerTable:
    """``[L]`` columns of a workload list: a pytree (the columns are its leaves).

    The numeric columns (int64 ``[L]``) are the :class:`~npujax.plan.Workload` fields of the
    same names, :data:`SHAPE_FIELDS`: ``M``, ``K``, ``N``, ``groups``, ``macs``,
    ``weight_elems``, ``bias_elems``, ``in_elems``, ``out_elems``, ``vector_ops``,
    ``special_ops``, ``cpu_ops``, ``link_in_elems``, ``link_out_elems``, ``link_transfers``, and
    the conv geometry the row-stationary dataflow reads: ``window_rows``, ``window_cols``,
    ``stride_rows``, ``out_rows``, ``out_cols``, ``images``.

    Attributes:
      npu: bool ``[L]``, the layer runs on the NPU (``device == "npu"``).
      gemm: bool ``[L]``, the layer is a GEMM (``kind == "gemm"``, wherever it runs).
      fused: bool ``[L]``, fused into a preceding GEMM's output stage (``fused_into``).
      producer: int32 ``[L]``, row of the layer producing the first activation input, -1 none.
      first_consumer: int32 ``[L]``, row of the first layer reading the output, -1 none.
      small: static: every numeric field is at most ``npujax._relax.ONE_ROUNDING_BOUND``
        (2**50), so the fold counts take the one-rounding division (same counts, fewer
        operations). It is part of the program's key, not a traced value.
    """

    M: Any
    K: Any
    N: Any
    groups: Any
    macs: Any
    weight_elems: Any
    bias_elems: Any
    in_elems: Any
    out_elems: Any
    vector_ops: Any
    special_ops: Any
    cpu_ops: Any
    link_in_elems: Any
    link_out_elems: Any
    link_transfers: Any
    window_rows: Any
    window_cols: Any
    stride_rows: Any
    out_rows: Any
    out_cols: Any
    images: Any
    npu: Any
    gemm: Any
    fused: Any
    producer: Any
    first_consumer: Any
    small: bool = True

    def __len__(self) -> int:
        return int(np.shape(self.M)[0])

    def bound(self, *names: str) -> int | None:
        """A static upper bound of the named numeric columns (at least 1) for
        ``npujax._relax.ceil_div``: their maximum when the columns are numpy arrays, 2**50
        for traced columns of a ``small`` table, else None."""
        from npujax._relax import ONE_ROUNDING_BOUND

        cols = [getattr(self, n) for n in names]
        if all(isinstance(c, np.ndarray) for c in cols):
            return max([1] + [int(np.max(c, initial=0)) for c in cols])
        return ONE_ROUNDING_BOUND if self.small else None


jax.tree_util.register_dataclass(
    LayerTable, data_fields=[*SHAPE_FIELDS, *STRUCTURE_FIELDS], meta_fields=["small"])


def table_length(rows: int) -> int:
    """The padded length of a table of ``rows`` layers: the next power of two, at least
    :data:`MIN_LENGTH`."""
    return max(MIN_LENGTH, 1 << max(rows - 1, 0).bit_length())


def layer_table(layers: Sequence[Workload] | LayerTable, length: int | None = None
                ) -> LayerTable:
    """The :class:`LayerTable` (numpy columns) of ``layers``, padded to ``length`` rows.

    The padding rows are inert (on the CPU, with no work: every cost and energy is 0) and no
    real row refers to them; drop them from the results (``[:len(layers)]``).

    Args:
      layers: the workloads (:func:`npujax.plan.workloads`); a table is returned as it is.
      length: the rows to pad to (at least ``len(layers)``), e.g. :func:`table_length`; None
        does not pad.

    Returns:
      The table: int64 numeric columns, bool flags, int32 producer and first-consumer rows.

    Raises:
      ValueError: ``length`` shorter than the workload list.
    """
    from npujax._relax import ONE_ROUNDING_BOUND

    if isinstance(layers, LayerTable):
        return layers
    rows = list(layers)
    if length is not None:
        if length < len(rows):
            raise ValueError(f"layer_table: length {length} < {len(rows)} layers")
        rows += [_INERT] * (length - len(rows))
    first = [-1] * len(rows)
    for j, w in enumerate(layers):
        if w.producer >= 0 and first[w.producer] < 0:
            first[w.producer] = j
    cols: dict[str, Any] = {f: np.asarray([getattr(w, f) for w in rows], np.int64).reshape(-1)
                            for f in SHAPE_FIELDS}
    small = max([1] + [int(np.max(c, initial=0)) for c in cols.values()]) <= ONE_ROUNDING_BOUND
    return LayerTable(
        **cols,
        npu=np.asarray([w.device == "npu" for w in rows], bool).reshape(-1),
        gemm=np.asarray([w.kind == "gemm" for w in rows], bool).reshape(-1),
        fused=np.asarray([bool(w.fused_into) for w in rows], bool).reshape(-1),
        producer=np.asarray([w.producer for w in rows], np.int32).reshape(-1),
        first_consumer=np.asarray(first, np.int32).reshape(-1),
        small=small)

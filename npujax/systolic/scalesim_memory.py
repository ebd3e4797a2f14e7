"""SCALE-Sim 3.0.0's DRAM side in its estimate-bandwidth ("CALC") mode, restated per layer.

:func:`npujax.systolic.scalesim_report` gives SCALE-Sim's compute-side figures; this module adds
what its double-buffered scratchpad reports about DRAM (in the ``scalesim`` package:
``memory/double_buffered_scratchpad_mem.py``, ``read_buffer_estimate_bw.py``,
``write_buffer.py``): the DRAM start/stop cycles and access counts of each operand and
``Total Cycles (incl. prefetch)`` = OFMAP DRAM stop cycle - min(IFMAP, filter DRAM start cycle).

Facts of SCALE-Sim's CALC mode that the figures follow (word = 1 byte, half of each SRAM active):

* **Reads (IFMAP, filter).** An SRAM of ``S`` bytes is tracked as 100 sets of
  ``I = floor(S / 100)`` distinct addresses; 50 sets are the active buffer, 50 the prefetch
  buffer; the DRAM interface moves 10 words per cycle; the DRAM port has a latency of 1 cycle.
  If the operand has ``D < 50 I`` distinct addresses, all of them are fetched *before* cycle 0:
  ``ceil(ceil(D / I) I / 10)`` cycles ending at cycle -1, ``D`` DRAM reads. Otherwise the first
  50 sets are fetched in the ``ceil(50 I / 10)`` cycles before the operand's first demand cycle
  ``f``, and later sets stream during compute, re-reading addresses evicted from the active
  window.
* **Writes (OFMAP).** Every OFMAP demand element is stored in lines of ``C`` words (the array
  width); when more than half the OFMAP SRAM holds undrained data and no drain is running, the
  open line is closed and ``ceil(S_ofmap / 2 / C)`` lines are written to DRAM, one per cycle.
  After the last compute cycle the remaining lines drain the same way, back to back, even while
  an earlier drain still runs (the OFMAP stop cycle is the later of the two ends). A drain
  counts full lines and the valid words of its last line (a line closed early counts as full when
  it is not the last of its drain), which is why SCALE-Sim's ``DRAM OFMAP Writes`` can exceed the
  SRAM writes by a few words.
* **Demand timing.** Each fold's OFMAP demand matrix is a prefix of empty rows, then a block of
  valid rows over the used columns, skewed one row per column: weight stationary ``2R - 1`` empty
  rows, then M rows; output stationary ``K - 1`` empty rows, then the fold's used M rows at the
  bottom of an R-row block; input stationary ``2R - 1`` empty rows, then N rows. The first demand
  of the stationary operand (ws filter, is IFMAP) is at cycle ``R - min(R, K)``, of the streamed
  operand at ``R`` (ws, is) or 0 (os).

Exact (equal to SCALE-Sim) for ``Total Cycles (incl. prefetch)``, the OFMAP DRAM columns, and the
read columns of an operand with ``D < 50 I``. For a larger operand, npujax reports its
compulsory reads ``D`` (SCALE-Sim re-reads what leaves its active window, so its count is at least
this) and the last compute cycle as its stop cycle: ``ScaleSimMemory.reads_exact`` says which.
Only CALC mode is modelled (no stalls); SCALE-Sim's USER mode with a given DRAM bandwidth is not.
"""

from __future__ import annotations

import dataclasses
import math
from collections import deque

import numpy as np

from npujax.errors import ConfigError

__all__ = ["ScaleSimMemory", "scalesim_memory", "distinct_ifmap_words"]

_READ_WORDS_PER_CYCLE = 10  # SCALE-Sim's CALC-mode IFMAP/filter DRAM interface
_SETS = 100
_ACTIVE_SETS = 50


@dataclasses.dataclass(frozen=True, kw_only=True)
class ScaleSimMemory:
    """SCALE-Sim's DRAM figures for one layer (cycles are its 0-based stamps; negative = before
    compute starts; counts in words).

    Attributes:
      total_cycles_incl_prefetch: OFMAP DRAM stop - min(IFMAP, filter DRAM start).
      ifmap_dram: (start cycle, stop cycle, reads).
      filter_dram: (start cycle, stop cycle, reads).
      ofmap_dram: (start cycle, stop cycle, writes).
      ifmap_sram, filter_sram, ofmap_sram: (start cycle, stop cycle) of the array's SRAM
        requests (reads are stamped one cycle after their demand: SCALE-Sim's hit latency).
      reads_exact: (IFMAP, filter): whether that operand's read figures equal SCALE-Sim's (its
        distinct addresses fit in half its SRAM); the start cycles and the incl.-prefetch total
        are exact either way.
    """

    total_cycles_incl_prefetch: int
    ifmap_dram: tuple[int, int, int]
    filter_dram: tuple[int, int, int]
    ofmap_dram: tuple[int, int, int]
    ifmap_sram: tuple[int, int]
    filter_sram: tuple[int, int]
    ofmap_sram: tuple[int, int]
    reads_exact: tuple[bool, bool]


def _touched(extent: int, out: int, window: int, stride: int) -> int:
    """Positions of an axis of ``extent`` read by ``out`` windows of ``window`` at ``stride``."""
    starts = np.arange(out, dtype=np.int64)[:, None] * stride + np.arange(window)[None, :]
    return int(np.unique(starts[starts < extent]).size)


def distinct_ifmap_words(ifmap_h: int, ifmap_w: int, filt_h: int, filt_w: int, channels: int,
                         stride: int) -> int:
    """Distinct IFMAP addresses SCALE-Sim's im2col reads (its outputs per axis are
    ``ceil((H - R + S) / S)``; window positions outside the IFMAP are empty requests).

    For a GEMM in SCALE-Sim's conv view (IFMAP ``M x K``, filter ``1 x K``) this is ``M K``.
    """
    oh = math.ceil((ifmap_h - filt_h + stride) / stride)
    ow = math.ceil((ifmap_w - filt_w + stride) / stride)
    return (_touched(ifmap_h, oh, filt_h, stride) * _touched(ifmap_w, ow, filt_w, stride)
            * channels)


class _OfmapStream:
    """The OFMAP demand of a layer as cumulative element counts per cycle (fold by fold)."""

    def __init__(self, M: int, K: int, N: int, rows: int, cols: int, dataflow: str):
        R, C = rows, cols
        if dataflow == "ws":    # folds: N blocks (outer) x K blocks; block M rows valid
            outer, inner, prefix, block = N, K, 2 * R - 1, M
        elif dataflow == "is":  # folds: M blocks (outer) x K blocks; block N rows valid
            outer, inner, prefix, block = M, K, 2 * R - 1, N
        else:                   # os: folds: N blocks (outer) x M blocks; block R rows
            outer, inner, prefix, block = N, M, K - 1, R
        n_out, n_in = -(-outer // C), -(-inner // R)
        used_cols = [min(C, outer - i * C) for i in range(n_out)]
        if dataflow == "os":    # the fold's used rows sit at the bottom of its R-row block
            used_rows = [min(R, inner - i * R) for i in range(n_in)]
            valid = [(R - r, R) for r in used_rows]
        else:
            used_rows = [block] * n_in
            valid = [(0, block)] * n_in
        height = prefix + block + C - 1
        y = np.arange(height, dtype=np.int64)
        types: dict[tuple[int, int, int], int] = {}
        self.patterns: list[np.ndarray] = []  # cumulative elements within a fold, per row
        seq = []
        for u in used_cols:
            for a, b in valid:
                key = (u, a, b)
                if key not in types:
                    lo = np.maximum(0, y - prefix - b + 1)
                    hi = np.minimum(u - 1, y - prefix - a)
                    types[key] = len(self.patterns)
                    self.patterns.append(np.cumsum(np.maximum(0, hi - lo + 1)))
                seq.append(types[key])
        self.fold_type = np.asarray(seq, np.int64)
        elems = np.asarray([p[-1] for p in self.patterns], np.int64)[self.fold_type]
        self.fold_end = np.cumsum(elems)                       # elements through fold f
        self.fold_start_elems = self.fold_end - elems
        self.height = height
        self.total = int(self.fold_end[-1])
        self.last_cycle = height * len(seq) - 1

    def count_through(self, cycle: int) -> int:
        """Elements demanded at cycles <= ``cycle``."""
        if cycle < 0:
            return 0
        f, y = divmod(min(cycle, self.last_cycle), self.height)
        return int(self.fold_start_elems[f] + self.patterns[self.fold_type[f]][y])

    def cycle_of(self, k: int) -> int:
        """The cycle of the ``k``-th demanded element (1-based)."""
        f = int(np.searchsorted(self.fold_end, k, side="left"))
        local = k - int(self.fold_start_elems[f])
        y = int(np.searchsorted(self.patterns[self.fold_type[f]], local, side="left"))
        return f * self.height + y


def _ofmap_drains(stream: _OfmapStream, cols: int, sram_bytes: int) -> tuple[int, int, int]:
    """(start, stop, writes) of the OFMAP DRAM traffic of SCALE-Sim's write buffer."""
    total = sram_bytes
    active = math.ceil(total * 0.5)
    drain_words = total - active
    lines_per_drain = max(1, math.ceil(drain_words / cols))
    queue: deque[list[int]] = deque()  # runs of [lines, valid words per line]
    flushed = drained = writes = 0
    drain_end, first_start, last_stop, max_stop = 0, None, None, -1

    def close(upto: int) -> None:
        nonlocal flushed
        seg = upto - flushed
        if seg // cols:
            queue.append([seg // cols, cols])
        if seg % cols:
            queue.append([1, seg % cols])
        flushed = upto

    def drain(start: int) -> int:
        nonlocal first_start, last_stop, max_stop, writes
        n, last_valid = 0, cols
        while queue and n < lines_per_drain:
            run = queue[0]
            take = min(run[0], lines_per_drain - n)
            n += take
            last_valid = run[1]
            run[0] -= take
            if not run[0]:
                queue.popleft()
        size = n * cols - (cols - last_valid)
        writes += size
        first_start = start if first_start is None else first_start
        last_stop = start + n - 1
        max_stop = max(max_stop, last_stop)
        return size

    while True:
        k = max(drained + drain_words + 1, stream.count_through(drain_end - 1) + 1)
        if k > stream.total:
            break
        cycle = stream.cycle_of(k)
        close(k)
        drained += drain(cycle)
        assert last_stop is not None
        drain_end = last_stop
    close(stream.total)
    cycle = stream.last_cycle
    while queue:
        drain(cycle)
        assert last_stop is not None
        cycle = last_stop + 1
    assert first_start is not None
    return first_start, max_stop, writes


def _reads(distinct: int, sram_bytes: int, first_demand: int,
           last_cycle: int) -> tuple[tuple[int, int, int], bool]:
    per_set = sram_bytes // _SETS
    if per_set < 1:
        raise ConfigError(f"SCALE-Sim SRAM of {sram_bytes} bytes is below its 100-set "
                          "granularity; give at least 1 kB.")
    if distinct < _ACTIVE_SETS * per_set:
        cycles = math.ceil(math.ceil(distinct / per_set) * per_set / _READ_WORDS_PER_CYCLE)
        return (-cycles, -1, distinct), True
    cycles = math.ceil((_SETS - _ACTIVE_SETS) * per_set / _READ_WORDS_PER_CYCLE)
    return (first_demand - cycles, last_cycle, distinct), False


def scalesim_memory(*, M: int, K: int, N: int, ifmap_distinct: int, rows: int, cols: int,
                    dataflow: str, ifmap_sram_kb: int, filter_sram_kb: int,
                    ofmap_sram_kb: int) -> ScaleSimMemory:
    """SCALE-Sim 3.0.0's CALC-mode DRAM figures for an ``[M, K] x [K, N]`` layer.

    Args:
      M: GEMM rows (conv: output pixels as SCALE-Sim counts them).
      K: the reduction (conv: window size).
      N: GEMM columns (conv: filters).
      ifmap_distinct: distinct IFMAP words (:func:`distinct_ifmap_words`; ``M K`` for a GEMM).
      rows: array height (PEs).
      cols: array width (PEs).
      dataflow: ``"ws"``, ``"os"`` or ``"is"``.
      ifmap_sram_kb: IFMAP SRAM size in kB (1024 bytes; 1-byte words).
      filter_sram_kb: filter SRAM size in kB.
      ofmap_sram_kb: OFMAP SRAM size in kB.

    Returns:
      :class:`ScaleSimMemory` (plain Python ints).

    Raises:
      ConfigError: unknown dataflow, an SRAM below 1 kB.
    """
    if dataflow not in ("ws", "os", "is"):
        raise ConfigError(f"SCALE-Sim dataflow must be ws, os or is, got {dataflow!r}.")
    stream = _OfmapStream(M, K, N, rows, cols, dataflow)
    ofmap = _ofmap_drains(stream, cols, ofmap_sram_kb * 1024)
    stationary_first = rows - min(rows, K)
    f_ifmap = {"ws": rows, "os": 0, "is": stationary_first}[dataflow]
    f_filter = {"ws": stationary_first, "os": 0, "is": rows}[dataflow]
    ifmap, ifmap_ok = _reads(ifmap_distinct, ifmap_sram_kb * 1024, f_ifmap, stream.last_cycle)
    filt, filt_ok = _reads(K * N, filter_sram_kb * 1024, f_filter, stream.last_cycle)
    ifmap_sram, filter_sram = _sram_read_spans(M, K, N, rows, cols, dataflow, stream)
    return ScaleSimMemory(
        total_cycles_incl_prefetch=ofmap[1] - min(ifmap[0], filt[0]),
        ifmap_dram=ifmap, filter_dram=filt, ofmap_dram=ofmap,
        ifmap_sram=ifmap_sram, filter_sram=filter_sram,
        ofmap_sram=(stream.cycle_of(1), stream.cycle_of(stream.total)),
        reads_exact=(ifmap_ok, filt_ok))


def _sram_read_spans(M: int, K: int, N: int, R: int, C: int, dataflow: str,
                     stream: _OfmapStream) -> tuple[tuple[int, int], tuple[int, int]]:
    """First and last SRAM read stamps of the IFMAP and filter demand matrices.

    Per fold, an operand's valid demand starts ``a`` rows in and spans ``rows`` rows, skewed over
    ``w`` columns or not (the stationary operand is shifted in unskewed, flipped so that a
    partial fold's padding comes first).
    """
    used_r_first, used_r_last = min(R, K), K - (-(-K // R) - 1) * R  # K folds on the rows
    used_m_last = M - (-(-M // R) - 1) * R
    last_start = stream.last_cycle + 1 - stream.height
    n_used_last = N - (-(-N // C) - 1) * C

    Fold = tuple[int, int, int, bool]

    def span(first: Fold, last: Fold) -> tuple[int, int]:
        a1, rows1, w1, skew1 = last
        return first[0] + 1, last_start + a1 + rows1 - 1 + (w1 - 1 if skew1 else 0) + 1

    if dataflow == "ws":  # folds: N blocks x K blocks
        ifmap = span((R, M, used_r_first, True), (R, M, used_r_last, True))
        filt = span((R - used_r_first, 0, 0, False), (R - used_r_last, used_r_last, 0, False))
    elif dataflow == "is":  # folds: M blocks x K blocks
        ifmap = span((R - used_r_first, 0, 0, False), (R - used_r_last, used_r_last, 0, False))
        filt = span((R, N, used_r_first, True), (R, N, used_r_last, True))
    else:  # os: folds: N blocks x M blocks
        ifmap = span((0, K, min(R, M), True), (0, K, used_m_last, True))
        filt = span((0, K, min(C, N), True), (0, K, n_used_last, True))
    return ifmap, filt

"""SCALE-Sim's own files in and out: its architecture config (``.cfg``), its topologies (conv and
GEMM forms) and its report CSVs, so researchers move between the two tools.

Formats as SCALE-Sim 3.0.0 reads and writes them (``scalesim/scale_config.py``,
``scalesim/topology_utils.py``, ``scalesim/simulator.py``):

* config: an INI file; ``[architecture_presets]`` ``ArrayHeight``, ``ArrayWidth``,
  ``IfmapSramSzkB``, ``FilterSramSzkB``, ``OfmapSramSzkB``, ``Dataflow`` (``ws``/``os``/``is``),
  ``Bandwidth`` (words per cycle); ``[general] run_name``.
* conv topology: a header row, then ``name, IFMAP height, IFMAP width, filter height, filter
  width, channels, filters, stride,`` (every row ends with a comma; SCALE-Sim drops the last
  field). Convolutions are "valid": the IFMAP is given pre-padded, and SCALE-Sim counts
  ``ceil((H - R + S) / S)`` output rows. A layer whose name contains ``DP`` is depthwise: one
  single-channel layer per channel (``<name>Channel_<i>``).
* GEMM topology: header ``Layer, M, N, K,`` then ``name, M, N, K,`` rows.
* reports: ``COMPUTE_REPORT.csv``, ``BANDWIDTH_REPORT.csv``, ``DETAILED_ACCESS_REPORT.csv``.

The per-layer figures come from :func:`npujax.systolic.scalesim_report` (the compute side) and
:mod:`npujax.systolic.scalesim_memory` (the DRAM side of SCALE-Sim's estimate-bandwidth mode):
SCALE-Sim's conventions restated in closed form, equal to SCALE-Sim's own on the reference cases
in ``tests/systolic/data``, including ``Total Cycles (incl. prefetch)``. One approximation:
an operand with more distinct words than half its SRAM is re-read by SCALE-Sim as its sets
rotate; npujax reports its compulsory reads (``ScaleSimReports.approximate_reads`` names those
layers).
"""

from __future__ import annotations

import configparser
import csv
import dataclasses
import math
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from npujax._atomic import atomic_write_text
from npujax.errors import ConfigError
from npujax.systolic.scalesim import scalesim_report

__all__ = ["ScaleSimConfig", "ScaleSimReports", "TopologyLayer", "read_scalesim_config",
           "read_topology", "write_topology", "write_scalesim_reports", "read_report",
           "REPORT_FILES"]

#: The report files :func:`write_scalesim_reports` writes.
REPORT_FILES = ("COMPUTE_REPORT.csv", "BANDWIDTH_REPORT.csv", "DETAILED_ACCESS_REPORT.csv")


@dataclasses.dataclass(frozen=True, kw_only=True)
class ScaleSimConfig:
    """The architecture of a SCALE-Sim config file (the fields npujax's model uses).

    Attributes:
      run_name: ``[general] run_name``.
      rows, cols: ``ArrayHeight`` x ``ArrayWidth`` PEs.
      dataflow: ``"ws"``, ``"os"`` or ``"is"``.
      ifmap_sram_kb, filter_sram_kb, ofmap_sram_kb: SRAM sizes in kB.
      bandwidth_words_per_cycle: the ``Bandwidth`` entry (USER mode), or None (CALC).
      interface_bandwidth: ``[run_presets] InterfaceBandwidth``: ``"CALC"`` (SCALE-Sim sizes the
        DRAM interface so that nothing stalls; the mode npujax's reports follow) or ``"USER"``.
    """

    run_name: str
    rows: int
    cols: int
    dataflow: str
    ifmap_sram_kb: int
    filter_sram_kb: int
    ofmap_sram_kb: int
    bandwidth_words_per_cycle: float | None = None
    interface_bandwidth: str = "CALC"


@dataclasses.dataclass(frozen=True, kw_only=True)
class TopologyLayer:
    """One SCALE-Sim layer as a GEMM ``[M, K] x [K, N]`` (conv fields kept when given).

    Attributes:
      name: the layer name.
      M: output pixels (conv) or GEMM rows.
      K: window size ``R x S x C`` (conv) or the reduction extent.
      N: filters (conv) or GEMM columns.
      ifmap_h, ifmap_w, filt_h, filt_w, channels, stride: the conv form (pre-padded IFMAP);
        for a GEMM, SCALE-Sim's own conv view (``ifmap = M x K``, ``filter = 1 x K``).
    """

    name: str
    M: int
    K: int
    N: int
    ifmap_h: int
    ifmap_w: int
    filt_h: int
    filt_w: int
    channels: int
    stride: int

    @classmethod
    def conv(cls, name: str, ifmap_h: int, ifmap_w: int, filt_h: int, filt_w: int,
             channels: int, filters: int, stride: int) -> TopologyLayer:
        """A conv layer; ``M`` counts SCALE-Sim's ``ceil((H - R + S) / S)`` output rows."""
        oh = math.ceil((ifmap_h - filt_h + stride) / stride)
        ow = math.ceil((ifmap_w - filt_w + stride) / stride)
        return cls(name=name, M=oh * ow, K=filt_h * filt_w * channels, N=filters,
                   ifmap_h=ifmap_h, ifmap_w=ifmap_w, filt_h=filt_h, filt_w=filt_w,
                   channels=channels, stride=stride)

    @classmethod
    def gemm(cls, name: str, M: int, K: int, N: int) -> TopologyLayer:
        """A GEMM layer (SCALE-Sim's conv view: IFMAP ``M x K``, filter ``1 x K``)."""
        return cls(name=name, M=M, K=K, N=N, ifmap_h=M, ifmap_w=K, filt_h=1, filt_w=K,
                   channels=1, stride=1)


def read_scalesim_config(path: str | os.PathLike[str]) -> ScaleSimConfig:
    """Read a SCALE-Sim ``.cfg`` file.

    Raises:
      ConfigError: a missing file, section or key, or a value out of range (names the file and
        the key).
    """
    cp = configparser.ConfigParser()
    if not cp.read(path):
        raise ConfigError(f"SCALE-Sim config {str(path)!r} does not exist or cannot be read.")

    def get(section: str, key: str) -> str:
        try:
            return cp.get(section, key).strip()
        except (configparser.NoSectionError, configparser.NoOptionError):
            raise ConfigError(f"SCALE-Sim config {str(path)!r} has no [{section}] {key}; "
                              "see scalesim's configs/ for the format.") from None

    def positive(key: str) -> int:
        v = get("architecture_presets", key)
        try:
            n = int(v)
        except ValueError:
            n = 0
        if n < 1:
            raise ConfigError(f"SCALE-Sim config {str(path)!r}: [architecture_presets] {key} "
                              f"must be a positive integer, got {v!r}.")
        return n

    df = get("architecture_presets", "Dataflow").lower()
    if df not in ("ws", "os", "is"):
        raise ConfigError(f"SCALE-Sim config {str(path)!r}: Dataflow must be ws, os or is, "
                          f"got {df!r}.")
    bw = None
    if cp.has_option("architecture_presets", "Bandwidth"):
        try:
            bw = float(get("architecture_presets", "Bandwidth").split(",")[0])
        except ValueError:
            bw = None
    name = get("general", "run_name") if cp.has_option("general", "run_name") else "npujax"
    mode = "CALC"
    if cp.has_option("run_presets", "InterfaceBandwidth"):
        mode = get("run_presets", "InterfaceBandwidth").upper()
        if mode not in ("CALC", "USER"):
            raise ConfigError(f"SCALE-Sim config {str(path)!r}: [run_presets] "
                              f"InterfaceBandwidth must be CALC or USER, got {mode!r}.")
    return ScaleSimConfig(run_name=name, rows=positive("ArrayHeight"),
                          cols=positive("ArrayWidth"), dataflow=df,
                          ifmap_sram_kb=positive("IfmapSramSzkB"),
                          filter_sram_kb=positive("FilterSramSzkB"),
                          ofmap_sram_kb=positive("OfmapSramSzkB"),
                          bandwidth_words_per_cycle=bw, interface_bandwidth=mode)


def read_topology(path: str | os.PathLike[str]) -> list[TopologyLayer]:
    """Read a SCALE-Sim topology, conv or GEMM form (told apart by the header: ``M, N, K``).

    Depthwise layers (``DP`` in the name) become one single-channel layer per channel, as in
    SCALE-Sim.

    Raises:
      ConfigError: a missing file, a row with too few or non-integer fields (names the line).
    """
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise ConfigError(f"cannot read topology {str(path)!r}: {e.strerror}.") from None
    rows = [r for r in text.splitlines() if r.strip()]
    if not rows:
        raise ConfigError(f"topology {str(path)!r} is empty.")
    header = [h.strip().lower() for h in rows[0].split(",")]
    gemm = header[1:4] == ["m", "n", "k"]
    need = 4 if gemm else 8
    layers: list[TopologyLayer] = []
    for lineno, row in enumerate(rows[1:], start=2):
        fields = [f.strip() for f in row.split(",")]
        if fields and fields[-1] == "":
            fields = fields[:-1]
        try:
            nums = [int(f) for f in fields[1:need]]
        except ValueError:
            nums = []
        if len(fields) < need or len(nums) != need - 1 or min(nums) < 1:
            raise ConfigError(f"topology {str(path)!r} line {lineno}: expected {need} fields "
                              f"({', '.join(rows[0].split(',')[:need])}) with positive integers, "
                              f"got {row.strip()!r}.")
        name = fields[0]
        if gemm:
            m, n, k = nums
            layers.append(TopologyLayer.gemm(name, m, k, n))
        elif "DP" in name:
            h, w, fh, fw, c, f, s = nums
            layers += [TopologyLayer.conv(f"{name}Channel_{i}", h, w, fh, fw, 1, f, s)
                       for i in range(c)]
        else:
            layers.append(TopologyLayer.conv(name, *nums))
    return layers


def write_topology(layers: Sequence[TopologyLayer], path: str | os.PathLike[str]) -> None:
    """Write ``layers`` as a SCALE-Sim conv-form topology (atomically), rows ending in a comma
    as SCALE-Sim's reader expects."""
    lines = ["Layer name, IFMAP Height, IFMAP Width, Filter Height, Filter Width, Channels, "
             "Num Filter, Stride,"]
    for ly in layers:
        lines.append(f"{ly.name}, {ly.ifmap_h}, {ly.ifmap_w}, {ly.filt_h}, {ly.filt_w}, "
                     f"{ly.channels}, {ly.N}, {ly.stride},")
    atomic_write_text(path, "\n".join(lines) + "\n")


def _fmt(v: float) -> str:
    """A figure as SCALE-Sim prints it: integers plain, percentages as Python floats."""
    return str(int(v)) if float(v).is_integer() else repr(float(v))


_COMPUTE_COLUMNS = ("Total Cycles (incl. prefetch)", "Total Cycles", "Stall Cycles",
                    "Overall Util %", "Mapping Efficiency %", "Compute Util %")
_BANDWIDTH_COLUMNS = ("Avg IFMAP SRAM BW", "Avg FILTER SRAM BW", "Avg OFMAP SRAM BW",
                      "Avg IFMAP DRAM BW", "Avg FILTER DRAM BW", "Avg OFMAP DRAM BW")
_DETAIL_COLUMNS = tuple(
    f"{mem} {op} {what}"
    for mem in ("SRAM", "DRAM")
    for op, verb in (("IFMAP", "Reads"), ("Filter", "Reads"), ("OFMAP", "Writes"))
    for what in ("Start Cycle", "Stop Cycle", verb))


@dataclasses.dataclass(frozen=True)
class ScaleSimReports:
    """What :func:`write_scalesim_reports` wrote.

    Attributes:
      files: the report file names, in ``out_dir``.
      approximate_reads: names of the layers with an operand larger than half its SRAM, whose
        DRAM read columns are npujax's compulsory reads (SCALE-Sim re-reads evicted data; see
        :mod:`npujax.systolic.scalesim_memory`).
    """

    files: tuple[str, ...]
    approximate_reads: tuple[str, ...]


def _line(cells: Sequence[object]) -> str:
    return ", ".join(_fmt(c) if isinstance(c, float) else str(c) for c in cells) + ","


def write_scalesim_reports(layers: Sequence[TopologyLayer], config: ScaleSimConfig,
                           out_dir: str | os.PathLike[str]) -> ScaleSimReports:
    """Write SCALE-Sim 3.0.0's report CSVs for ``layers`` on ``config``'s array into ``out_dir``.

    The columns and their order are SCALE-Sim's (CALC bandwidth mode, no sparsity):
    ``COMPUTE_REPORT.csv``: ``LayerID, Total Cycles (incl. prefetch), Total Cycles, Stall
    Cycles, Overall Util %, Mapping Efficiency %, Compute Util %`` (equal to SCALE-Sim's own on
    every reference case in ``tests/systolic/data``). ``BANDWIDTH_REPORT.csv``: the average
    SRAM and DRAM words per cycle of each operand. ``DETAILED_ACCESS_REPORT.csv``: start cycle,
    stop cycle and count of the SRAM and DRAM accesses of each operand. Figures from
    :func:`npujax.systolic.scalesim_report` and
    :func:`npujax.systolic.scalesim_memory.scalesim_memory`. Every file written atomically.

    Returns:
      :class:`ScaleSimReports`.

    Raises:
      ConfigError: no layers.
    """
    from npujax.systolic.scalesim_memory import distinct_ifmap_words, scalesim_memory

    if not layers:
        raise ConfigError("the topology has no layer to report.")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    # padded to a power of two (with 1x1x1 GEMMs) so that topologies of similar length share
    # one compiled program
    size = 1 << max(3, (len(layers) - 1).bit_length())
    M, K, N = (np.array([getattr(ly, f) for ly in layers] + [1] * (size - len(layers)), np.int64)
               for f in "MKN")
    r = {k: np.asarray(v)[:len(layers)]
         for k, v in scalesim_report(M, K, N, config.rows, config.cols, config.dataflow).items()}
    compute = ["LayerID, " + ", ".join(_COMPUTE_COLUMNS) + ","]
    bandwidth = ["LayerID, " + ", ".join(_BANDWIDTH_COLUMNS) + ","]
    detail = ["LayerID, " + ", ".join(_DETAIL_COLUMNS) + ","]
    approximate = []
    for i, ly in enumerate(layers):
        mem = scalesim_memory(
            M=ly.M, K=ly.K, N=ly.N, rows=config.rows, cols=config.cols, dataflow=config.dataflow,
            ifmap_distinct=distinct_ifmap_words(ly.ifmap_h, ly.ifmap_w, ly.filt_h, ly.filt_w,
                                                ly.channels, ly.stride),
            ifmap_sram_kb=config.ifmap_sram_kb, filter_sram_kb=config.filter_sram_kb,
            ofmap_sram_kb=config.ofmap_sram_kb)
        if not all(mem.reads_exact):
            approximate.append(ly.name)
        cyc = int(r["total_cycles"][i])
        compute.append(_line([i, mem.total_cycles_incl_prefetch, cyc, int(r["stall_cycles"][i]),
                              float(r["overall_util_pct"][i]),
                              float(r["mapping_efficiency_pct"][i]),
                              float(r["compute_util_pct"][i])]))
        sram = [int(r[k][i]) for k in ("sram_ifmap_reads", "sram_filter_reads",
                                       "sram_ofmap_writes")]
        dram = [mem.ifmap_dram, mem.filter_dram, mem.ofmap_dram]
        bandwidth.append(_line([i, *(float(v / cyc) for v in sram),
                                *(float(n / (stop - start + 1)) for start, stop, n in dram)]))
        spans = [mem.ifmap_sram, mem.filter_sram, mem.ofmap_sram]
        detail.append(_line([i, *(x for (a, b), n in zip(spans, sram) for x in (a, b, n)),
                             *(x for d in dram for x in d)]))
    for name, lines in zip(REPORT_FILES, (compute, bandwidth, detail)):
        atomic_write_text(out / name, "\n".join(lines) + "\n")
    return ScaleSimReports(files=REPORT_FILES, approximate_reads=tuple(approximate))


def read_report(path: str | os.PathLike[str]) -> list[dict[str, float]]:
    """Rows of a SCALE-Sim (or npujax-written) report CSV as ``{column: value}``."""
    with open(path) as f:
        rows = list(csv.reader(f))
    header = [h.strip() for h in rows[0] if h.strip()]
    return [dict(zip(header, (float(v) for v in row if v.strip()))) for row in rows[1:] if row]

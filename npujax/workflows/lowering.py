"""The lowering report, written once: lower a model in every dataflow, show the tables, write
the files (used by ``npujax lower`` and ``npujax demo``), and the input-resolution sweep."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from npujax.frontends.onnx import from_onnx
from npujax.hw.spec import NpuSpec
from npujax.ir.graph import Graph
from npujax.ir.passes import optimize
from npujax.plan.lower import Schedule, lower
from npujax.quantize.spec import QuantSpec
from npujax.report import (
    dataflow_table,
    layer_table,
    plot_breakdown,
    plot_layer_latency,
    plot_roofline,
    write_json,
    write_layers_csv,
)
from npujax.systolic.dataflow import DATAFLOWS

__all__ = ["Lowering", "lower_dataflows", "print_lowering", "write_lowering",
           "import_onnx_for_lowering", "resolution_sweep", "print_resolution_sweep"]


@dataclasses.dataclass(frozen=True)
class Lowering:
    """A model lowered at one dataflow and, for comparison, at every dataflow.

    Attributes:
      schedule: the schedule at the chosen dataflow.
      by_dataflow: ``{dataflow: schedule}`` for every dataflow.
    """

    schedule: Schedule
    by_dataflow: dict[str, Schedule]


def lower_dataflows(graph: Graph, spec: NpuSpec, quant: QuantSpec | None = None, *,
                    dataflow: str | None = None, batch: int | None = None) -> Lowering:
    """:func:`npujax.lower` at ``dataflow`` (default the preset's) and at every dataflow."""
    schedule = lower(graph, spec, quant, dataflow=dataflow, batch=batch)
    by_df = {df: lower(graph, spec, quant, dataflow=df, batch=batch) for df in DATAFLOWS}
    return Lowering(schedule, by_df)


def print_lowering(console: Console, lowering: Lowering, title: str) -> None:
    """The per-layer table, the dataflow comparison and the layers that fall back to the CPU."""
    s = lowering.schedule
    console.print(layer_table(s, title))
    console.print(dataflow_table(lowering.by_dataflow, reference=s.dataflow))
    cpu = [r for r in s.layers if r.device == "cpu"]
    if cpu:
        console.print(f"{len(cpu)} layer(s) fall back to the host CPU: "
                      + "; ".join(f"{r.name} ({r.reason})" for r in cpu[:8])
                      + (" ..." if len(cpu) > 8 else ""))


def write_lowering(out: str | Path, lowering: Lowering, spec: NpuSpec,
                   extra: Mapping[str, Any] | None = None) -> list[str]:
    """Write ``schedule.json`` (with the per-dataflow latencies and ``extra``), ``layers.csv``
    and the plots ``layer_latency.png``, ``breakdown.png``, ``roofline.png`` (each atomically).

    Returns:
      The names of the files written.
    """
    out = Path(out)
    s = lowering.schedule
    write_json(out / "schedule.json", {
        **s.to_dict(),
        "dataflow_latency_s": {df: x.latency_s for df, x in lowering.by_dataflow.items()},
        **dict(extra or {})})
    write_layers_csv(out / "layers.csv", s)
    plot_layer_latency(out / "layer_latency.png", {s.dataflow: s})
    plot_breakdown(out / "breakdown.png", s)
    plot_roofline(out / "roofline.png", s, spec.peak_macs_per_s, spec.memory.dram_bytes_per_s)
    return ["schedule.json", "layers.csv", "layer_latency.png", "breakdown.png", "roofline.png"]


def import_onnx_for_lowering(path: str | Path, shapes: Mapping[str, Sequence[int]] | None,
                             batch: int | None) -> Graph:
    """An ONNX model as an optimized graph for the latency model: unsupported operators kept as
    CPU fallbacks, optionally at another batch size."""
    graph, params = from_onnx(path, shapes or None, unsupported="fallback", batch=batch)
    return optimize(graph, params)[0]


def resolution_sweep(
    path: str | Path, graph: Graph, spec: NpuSpec, batch: int | None,
    precision: Callable[[Graph], QuantSpec | None], dataflow: str | None = None,
) -> dict[str, dict[str, Any]]:
    """Latency at half, the given and double input resolution (H and W of the 4-D inputs).

    Args:
      path: the ONNX model, re-imported at each resolution.
      graph: the model imported at the given resolution.
      spec: the NPU.
      batch: import batch size (None: the given shapes').
      precision: the quantization spec of an imported graph (e.g. from command-line widths).
      dataflow: overrides the preset's dataflow.

    Returns:
      ``{"0.5" | "1.0" | "2.0": {"input_shapes", "latency_s", "macs", "memory_bound_layers",
      "layers"}}``.
    """
    base = {t: graph.tensors[t].shape for t in graph.inputs}
    rows: dict[str, dict[str, Any]] = {}
    for factor in (0.5, 1.0, 2.0):
        shapes = {t: (sh[0], sh[1], max(1, int(sh[2] * factor)), max(1, int(sh[3] * factor)))
                  if len(sh) == 4 else sh for t, sh in base.items()}
        g = graph if factor == 1.0 else import_onnx_for_lowering(path, shapes, batch)
        sched = lower(g, spec, precision(g), dataflow=dataflow)
        rows[str(factor)] = {"input_shapes": {k: list(v) for k, v in shapes.items()},
                             "latency_s": sched.latency_s, "macs": sched.macs,
                             "memory_bound_layers": sum(r.bound == "memory"
                                                        for r in sched.layers),
                             "layers": len(sched.layers)}
    return rows


def print_resolution_sweep(console: Console, rows: Mapping[str, Mapping[str, Any]]) -> None:
    """The sweep as a table, with how to read it."""
    t = Table(title="resolution sweep (H and W scaled; pixels x4 per step)", title_justify="left")
    for col in ("scale", "input", "MACs", "latency µs", "× vs 1.0", "memory-bound"):
        t.add_column(col, justify="right")
    ref = rows["1.0"]["latency_s"]
    for f, r in rows.items():
        t.add_row(f"{float(f):g}",
                  "; ".join(f"{k}={tuple(v)}" for k, v in r["input_shapes"].items()),
                  f"{r['macs']:,}", f"{r['latency_s'] * 1e6:,.1f}",
                  f"{r['latency_s'] / ref:.2f}", f"{r['memory_bound_layers']}/{r['layers']}")
    console.print(t)
    console.print("latency growing ~4x per doubling means compute- or activation-bound; much "
                  "less means weight-bandwidth or fixed overheads (fallback, transfers) dominate.")

"""The lowering workflows: an ONNX model imported for the latency model, and the
input-resolution sweep (used by ``npujax lower``). The tables and files are
:mod:`npujax.report.lowering`'s; the decoder graphs :mod:`npujax.models.decoders`'."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from npujax.frontends.onnx import from_onnx
from npujax.hw.spec import NpuSpec
from npujax.ir.graph import Graph
from npujax.ir.passes import optimize
from npujax.plan.lower import lower
from npujax.quantize.spec import QuantSpec

__all__ = ["import_onnx_for_lowering", "resolution_sweep"]


def import_onnx_for_lowering(path: str | Path, shapes: Mapping[str, Sequence[int]] | None,
                             batch: int | None) -> Graph:
    """An ONNX model as an optimized graph for the latency model: unsupported operators kept as
    CPU fallbacks, optionally at another batch size. Latency needs only shapes, so weights whose
    external-data file is absent are kept by their shapes only, never allocated (with a
    warning; ``from_onnx(weights="shapes")``, :mod:`npujax.ir.absent`)."""
    graph, params = from_onnx(path, shapes or None, unsupported="fallback", batch=batch,
                              weights="shapes")
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

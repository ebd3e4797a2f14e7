"""The lowering workflows: an ONNX model imported for the latency model, and the
input-resolution sweep (used by ``npujax lower``). The tables and files are
:mod:`npujax.report.lowering`'s; the decoder graphs :mod:`npujax.models.decoders`'."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from npujax.frontends.onnx import from_onnx
from npujax.hw.spec import NpuSpec
from npujax.ir.absent import shapes_only
from npujax.ir.graph import Graph
from npujax.ir.passes import optimize
from npujax.plan.host_pipeline import HostStage, PipelineReport, host_pipeline
from npujax.plan.lower import Schedule, lower
from npujax.plan.thermal import SustainedReport, sustained
from npujax.quantize.spec import QuantSpec

__all__ = ["import_onnx_for_lowering", "resolution_sweep", "sustained_lowering",
           "pipeline_lowering"]


def import_onnx_for_lowering(path: str | Path, shapes: Mapping[str, Sequence[int]] | None,
                             batch: int | None) -> Graph:
    """An ONNX model as an optimized graph for the latency model: unsupported operators kept as
    CPU fallbacks, optionally at another batch size. Latency needs only shapes, so weights whose
    external-data file is absent are kept by their shapes only, never allocated (with a
    warning; ``from_onnx(weights="shapes")``, :mod:`npujax.ir.absent`)."""
    graph, params = from_onnx(path, shapes or None, unsupported="fallback", batch=batch,
                              weights="shapes")
    # the passes need the weights' shapes only (the params are dropped): folding them by their
    # shapes (npujax.ir.absent) compiles nothing (a jitted fold per model: 0.1 CPU s)
    return optimize(graph, shapes_only(params))[0]


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


def sustained_lowering(graph: Graph, spec: NpuSpec, quant: QuantSpec | None, seconds: float,
                       cold: Schedule, dataflow: str | None = None,
                       batch: int | None = None) -> SustainedReport:
    """``lower --sustained``: the graph lowered at every DVFS step's clock (the one cost
    program each time) and the thermal model after ``seconds`` (:mod:`npujax.plan.thermal`).

    Args:
      graph: the optimized graph, as for :func:`npujax.lower`.
      spec: the NPU, with its ``[thermal]`` section (none: nothing throttles).
      quant: the precision, as for :func:`npujax.lower`.
      seconds: time of continuous inference from ambient (s).
      cold: the schedule at the nominal clock (that lowering, reused).
      dataflow: as for :func:`npujax.lower`.
      batch: as for :func:`npujax.lower`.

    Raises:
      ConfigError: ``seconds`` negative or not finite.
    """
    def at(s: NpuSpec) -> tuple[float, float]:
        sched = cold if s is spec else lower(graph, s, quant, dataflow=dataflow, batch=batch)
        return sched.latency_s, sched.energy_j

    return sustained(spec, seconds, at)


def pipeline_lowering(graph: Graph, spec: NpuSpec, schedule: Schedule,
                      stages: Sequence[HostStage], *, act_bits: int = 8,
                      zero_copy: bool = False) -> PipelineReport:
    """``lower --host-stage``: the pipeline around the NPU of a lowered graph
    (:mod:`npujax.plan.host_pipeline`), its input and output sizes from the graph's first input
    and output (every input and output copied, at ``act_bits``)."""
    import math

    def nbytes(names: Sequence[str]) -> float:
        return sum(math.prod(graph.tensors[t].shape) for t in names) * act_bits / 8.0

    return host_pipeline(spec, schedule.latency_s, stages,
                         graph.tensors[graph.inputs[0]].shape,
                         graph.tensors[graph.outputs[0]].shape,
                         input_bytes=nbytes(graph.inputs), output_bytes=nbytes(graph.outputs),
                         act_bits=act_bits, zero_copy=zero_copy)

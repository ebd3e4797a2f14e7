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
from npujax.plan.coresident import CoResidency
from npujax.plan.lower import Schedule, lower
from npujax.plan.memory import MemoryReport
from npujax.plan.pipeline import CoreSchedule
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
           "import_onnx_for_lowering", "resolution_sweep", "print_resolution_sweep",
           "print_edges", "print_memory", "print_core_schedules", "print_coresidency",
           "DecoderLowering", "decoder_graph", "decoder_precision", "decoder_figures"]


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
    CPU fallbacks, optionally at another batch size. Latency needs only shapes, so weights whose
    external-data file is absent are zeros (with a warning; ``from_onnx(weights="shapes")``)."""
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


def _kib(nbytes: float) -> str:
    return f"{nbytes / 1024:,.1f}"


def print_edges(console: Console, schedule: Schedule, limit: int = 40) -> None:
    """Where each activation lived (``layer`` fusion): placement and DRAM bytes saved per edge,
    largest savings first, and the totals against the layer-by-layer schedule."""
    if not schedule.edges:
        return
    t = Table(title=f"activations between layers ({schedule.fusion} fusion)", title_justify="left")
    for col in ("producer", "consumers", "KiB", "placement", "stripes", "DRAM KiB saved"):
        t.add_column(col, justify="left" if col in ("producer", "consumers", "placement")
                     else "right")
    for e in sorted(schedule.edges, key=lambda e: -e.dram_bytes_saved)[:limit]:
        t.add_row(e.producer, ", ".join(e.consumers), _kib(e.tensor_bytes), e.placement,
                  f"{e.stripes} x {e.stripe_rows} rows" if e.stripes else "",
                  _kib(e.dram_bytes_saved))
    console.print(t)
    n = len(schedule.edges)
    kept = sum(e.placement != "dram" for e in schedule.edges)
    line = f"{kept}/{n} activations stayed on chip"
    if n > limit:
        line += f" (table: the {limit} largest savings)"
    if schedule.unfused_dram_bytes is not None and schedule.unfused_latency_s is not None:
        line += (f"; DRAM {schedule.unfused_dram_bytes / 1e6:,.2f} -> "
                 f"{schedule.dram_bytes / 1e6:,.2f} MB, latency "
                 f"{schedule.unfused_latency_s * 1e6:,.1f} -> {schedule.latency_s * 1e6:,.1f} µs "
                 "against the layer-by-layer schedule")
    console.print(line)


def print_memory(console: Console, reports: Mapping[str, MemoryReport]) -> None:
    """Peak SRAM and DRAM per model, and what would have to spill where a model cannot fit."""
    t = Table(title="memory", title_justify="left")
    for col in ("model", "weights KiB", "DRAM act. peak KiB", "DRAM footprint KiB",
                "DRAM capacity KiB", "SRAM peak KiB", "SRAM KiB", "fits"):
        t.add_column(col, justify="left" if col == "model" else "right")
    for name, m in reports.items():
        t.add_row(name, _kib(m.weight_bytes), _kib(m.dram_activation_peak_bytes),
                  _kib(m.dram_footprint_bytes),
                  _kib(m.dram_capacity_bytes) if m.dram_capacity_bytes else "unlimited",
                  _kib(m.sram_peak_bytes), _kib(m.sram_capacity_bytes),
                  "yes" if m.fits else "NO")
    console.print(t)
    for name, m in reports.items():
        if m.spill:
            console.print(f"{name} does not fit the DRAM: the weights of "
                          + ", ".join(f"{n} ({_kib(b)} KiB)" for n, b in m.spill[:6])
                          + (" ..." if len(m.spill) > 6 else "")
                          + " would stay in host memory")


def print_core_schedules(console: Console, schedules: Mapping[str, CoreSchedule],
                         chosen: str | None = None) -> None:
    """Layer-split vs pipelined multi-core schedules: latency, period, throughput, stages."""
    t = Table(title="multi-core schedules", title_justify="left")
    for col in ("schedule", "cores", "latency µs", "period µs", "inferences/s", "stages (layers)",
                "DRAM-bound period"):
        t.add_column(col, justify="left" if col == "schedule" else "right")
    for kind, s in schedules.items():
        mark = " *" if kind == chosen else ""
        t.add_row(kind + mark, str(s.cores), f"{s.latency_s * 1e6:,.1f}",
                  f"{s.period_s * 1e6:,.1f}", f"{s.throughput_per_s:,.1f}",
                  " + ".join(str(len(x)) for x in s.stages),
                  "yes" if s.dram_s >= s.period_s * (1 - 1e-9) else "no")
    console.print(t)
    if chosen:
        console.print(f"* chosen: {chosen}")


def print_coresidency(console: Console, co: CoResidency) -> None:
    """Each model's latency alone and together, its cores, bandwidth and weights."""
    t = Table(title=f"{len(co.models)} models on {co.npu} ({co.sharing})", title_justify="left")
    for col in ("model", "alone µs", "together µs", "slowdown", "cores", "DRAM GB/s",
                "weights", "DRAM footprint KiB"):
        t.add_column(col, justify="left" if col in ("model", "weights") else "right")
    for m in co.models:
        t.add_row(m.name, f"{m.alone_s * 1e6:,.1f}", f"{m.together_s * 1e6:,.1f}",
                  f"{m.slowdown:.2f}x", str(m.cores), f"{m.dram_bytes_per_s / 1e9:.2f}",
                  m.weights, _kib(m.memory.dram_footprint_bytes))
    console.print(t)
    cap = ("unlimited" if not co.dram_capacity_bytes
           else f"{co.dram_capacity_bytes / 1e6:,.1f} MB")
    console.print(f"DRAM: {co.dram_footprint_bytes / 1e6:,.2f} MB held together (capacity {cap})")


# --------------------------------------------------------------------------------------------
# LLM decoders: prefill and decode.


@dataclasses.dataclass(frozen=True)
class DecoderLowering:
    """A decoder phase lowered, with the figures of merit of LLM serving.

    Attributes:
      config: the decoder's shapes (:class:`npujax.models.transformer.DecoderConfig`).
      phase: ``"prefill"`` or ``"decode"``.
      seq_len: prompt tokens per sequence (prefill).
      kv_len: cached positions per sequence (decode).
      batch: sequences per step.
      kv_bits: the width of the attention MatMuls' operands (the KV cache).
      tokens_per_s: tokens processed per second: ``batch * seq_len / latency`` (prefill) or
        ``batch / latency`` (decode: one new token per sequence per step).
      kv_cache_bytes_per_token: bytes of K and V cache read per generated token and sequence
        (decode: ``2 * layers * kv_len * kv_heads * head_dim * kv_bits / 8``; prefill: 0, the
        keys and values are computed, not read).
    """

    config: Any
    phase: str
    seq_len: int
    kv_len: int
    batch: int
    kv_bits: int
    tokens_per_s: float
    kv_cache_bytes_per_token: float

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready figures (the config by its fields)."""
        d = dataclasses.asdict(self)
        d["config"] = dataclasses.asdict(self.config)
        return d


def decoder_graph(config: Any, *, phase: str, seq_len: int, kv_len: int, batch: int) -> Graph:
    """The optimized graph of the reference decoder (:class:`npujax.models.transformer.Decoder`)
    for one phase, traced from Flax (the same path as any model), with zero weights: the
    latency model needs the shapes only. The weights are materialised as float32 zeros during
    the trace (about 2 GB for Qwen2.5-0.5B, 5 GB for Llama-3.2-1B; ``tiny`` is instant).

    Args:
      config: a :class:`~npujax.models.transformer.DecoderConfig` or a name of
        :data:`~npujax.models.transformer.DECODER_CONFIGS`.
      phase: ``"prefill"`` (``seq_len`` tokens) or ``"decode"`` (one token, ``kv_len`` cached).
      seq_len: prompt length (prefill).
      kv_len: cached positions (decode).
      batch: sequences per step.

    Raises:
      ConfigError: an unknown config name, phase or a non-positive length.
    """
    import jax
    import jax.numpy as jnp
    import numpy as np
    from flax import nnx

    from npujax.errors import ConfigError
    from npujax.frontends.flax import trace_flax
    from npujax.models.transformer import DECODER_CONFIGS, Decoder

    if isinstance(config, str):
        if config not in DECODER_CONFIGS:
            raise ConfigError(f"unknown decoder config {config!r}; use one of "
                              f"{sorted(DECODER_CONFIGS)}.")
        config = DECODER_CONFIGS[config]
    cfg = config
    graphdef, state = nnx.split(nnx.eval_shape(lambda: Decoder(
        cfg, phase=phase, seq_len=seq_len, kv_len=kv_len, batch=batch, rngs=nnx.Rngs(0))))
    state = jax.tree.map(lambda s: jax.device_put(np.zeros(s.shape, s.dtype)), state)
    model = nnx.merge(graphdef, state)
    tokens = jnp.zeros((batch, seq_len if phase == "prefill" else 1), jnp.int32)
    return optimize(*trace_flax(model, tokens, check=False))[0]


def decoder_precision(graph: Graph, weight_bits: int, act_bits: int, kv_bits: int
                      ) -> dict[str, Any] | None:
    """The spec of a decoder lowering: the linear layers at ``weight_bits``/``act_bits``
    (weight-only int4: 4/16), both operands of the attention MatMuls (the KV cache, whichever
    operand the tracer made it) at ``kv_bits``. None when everything is 8 bits."""
    from npujax.ops import operand_quantized_ops
    from npujax.quantize.spec import quant_spec

    if weight_bits == act_bits == kv_bits == 8:
        return None
    q = quant_spec(graph, weight_bits, act_bits)
    kv = quant_spec(graph, kv_bits, kv_bits)
    att = {n.name for n in graph.nodes if n.op in operand_quantized_ops()}
    return {n: kv[n] if n in att else lq for n, lq in q.items()}


def decoder_figures(schedule: Schedule, config: Any, *, phase: str, seq_len: int, kv_len: int,
                    batch: int, kv_bits: int) -> DecoderLowering:
    """Tokens per second and KV-cache bytes per token of a lowered decoder phase."""
    tokens = batch * (seq_len if phase == "prefill" else 1)
    kv = (2 * config.layers * kv_len * config.kv_heads * config.head_dim * kv_bits / 8
          if phase == "decode" else 0.0)
    return DecoderLowering(config, phase, seq_len, kv_len, batch, kv_bits,
                           tokens / schedule.latency_s, kv)

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
from npujax.plan.lower import Schedule, lower, lower_by_dataflow
from npujax.plan.memory import MemoryReport
from npujax.plan.pipeline import CoreSchedule
from npujax.quantize.spec import QuantSpec
from npujax.report import (
    dataflow_table,
    layer_table,
    plot_breakdown,
    plot_layer_latency,
    plot_roofline,
    print_table,
    write_json,
    write_layers_csv,
)
from npujax.systolic.dataflow import DATAFLOWS, get_dataflow

__all__ = ["Lowering", "lower_dataflows", "print_lowering", "write_lowering",
           "import_onnx_for_lowering", "resolution_sweep", "print_resolution_sweep",
           "print_edges", "print_attention", "print_memory", "print_core_schedules",
           "print_coresidency",
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
    """:func:`npujax.lower` at ``dataflow`` (default the preset's) and at every dataflow, the
    costs of all dataflows evaluated in one compiled call (:func:`npujax.plan.lower_by_dataflow`).
    """
    by_df = lower_by_dataflow(graph, spec, quant, dataflows=DATAFLOWS, batch=batch)
    return Lowering(by_df[get_dataflow(dataflow or spec.array.dataflow).name], by_df)


def print_lowering(console: Console, lowering: Lowering, title: str) -> None:
    """The per-layer table, the dataflow comparison and the layers that fall back to the CPU."""
    s = lowering.schedule
    print_table(console, layer_table(s, title))
    print_table(console, dataflow_table(lowering.by_dataflow, reference=s.dataflow))
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
        "dataflow_energy_j": {df: x.energy_j for df, x in lowering.by_dataflow.items()},
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


def print_resolution_sweep(console: Console, rows: Mapping[str, Mapping[str, Any]],
                           title: str = "") -> None:
    """The sweep as a table (``title`` prefixes its heading), with how to read it."""
    t = Table(title=f"{title}resolution sweep (H and W scaled; pixels x4 per step)",
              title_justify="left")
    for col in ("scale", "input", "MACs", "latency µs", "× vs 1.0", "memory-bound"):
        t.add_column(col, justify="right")
    ref = rows["1.0"]["latency_s"]
    for f, r in rows.items():
        t.add_row(f"{float(f):g}",
                  "; ".join(f"{k}={tuple(v)}" for k, v in r["input_shapes"].items()),
                  f"{r['macs']:,}", f"{r['latency_s'] * 1e6:,.1f}",
                  f"{r['latency_s'] / ref:.2f}", f"{r['memory_bound_layers']}/{r['layers']}")
    print_table(console, t)
    console.print("latency growing ~4x per doubling means compute- or activation-bound; much "
                  "less means weight-bandwidth or fixed overheads (fallback, transfers) dominate.")


def _kib(nbytes: float) -> str:
    return f"{nbytes / 1024:,.1f}"


def print_edges(console: Console, schedule: Schedule, limit: int = 40) -> None:
    """Where each activation lived (``layer`` fusion): placement and DRAM bytes saved per edge
    (the write and the reads avoided, less re-read weights; they add up to the total saving),
    largest savings first, and the totals against the same layers with every activation through
    DRAM (the ``residual`` fusion level: the baseline ``Schedule.unfused_*``)."""
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
    print_table(console, t)
    n = len(schedule.edges)
    kept = sum(e.placement != "dram" for e in schedule.edges)
    line = f"{kept}/{n} activations stayed on chip"
    if n > limit:
        line += f" (table: the {limit} largest savings)"
    if schedule.unfused_dram_bytes is not None and schedule.unfused_latency_s is not None:
        line += (f"; DRAM {schedule.unfused_dram_bytes / 1e6:,.2f} -> "
                 f"{schedule.dram_bytes / 1e6:,.2f} MB, latency "
                 f"{schedule.unfused_latency_s * 1e6:,.1f} -> {schedule.latency_s * 1e6:,.1f} µs "
                 "against the same layers with every activation through DRAM (the residual "
                 "fusion level, --fusion residual)")
    console.print(line)


def print_attention(console: Console, schedule: Schedule, limit: int = 8) -> None:
    """The attention blocks (``ops.attention_fusion``): how each ran (``on_chip``, ``flash`` or
    ``unfused``), FlashAttention's blocks and the DRAM bytes saved against the unfused chain
    (:mod:`npujax.plan.passes.attention`); one row per distinct outcome when blocks repeat."""
    if not schedule.attention:
        return
    t = Table(title=f"attention blocks (attention_fusion = {schedule.attention_fusion})",
              title_justify="left")
    for col in ("Q·Kᵀ", "P·V", "layers fused", "mode", "B_r x B_c", "T_r x T_c",
                "DRAM KiB saved"):
        t.add_column(col, justify="left" if col in ("Q·Kᵀ", "P·V", "mode") else "right")
    for a in schedule.attention[:limit]:
        t.add_row(a.qk, a.pv, str(len(a.layers)) if a.mode != "unfused" else "0", a.mode,
                  f"{a.query_block} x {a.key_block}", f"{a.query_blocks} x {a.key_blocks}",
                  _kib(a.dram_bytes_saved))
    print_table(console, t)
    n = len(schedule.attention)
    fused = sum(a.mode != "unfused" for a in schedule.attention)
    saved = sum(a.dram_bytes_saved for a in schedule.attention)
    line = f"{fused}/{n} attention blocks fused, {saved / 1e6:,.2f} MB DRAM saved"
    if n > limit:
        line += f" (table: the first {limit})"
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
    print_table(console, t)
    for name, m in reports.items():
        if m.activation_spill:
            console.print(
                f"{name} does not fit the DRAM: its activations alone need "
                f"{m.dram_activation_peak_bytes / 1e6:,.2f} MB at their peak, more than the "
                f"{m.dram_capacity_bytes / 1e6:,.2f} MB capacity, so spilling weights is not "
                f"enough: all weights ({_kib(m.weight_bytes)} KiB) and the activations of "
                + _spill_list(m.activation_spill) + " would have to live in host memory")
        elif m.spill:
            console.print(f"{name} does not fit the DRAM: the weights of "
                          + _spill_list(m.spill) + " would stay in host memory")


def _spill_list(items: Sequence[tuple[str, float]], limit: int = 6) -> str:
    return (", ".join(f"{n} ({_kib(b)} KiB)" for n, b in items[:limit])
            + (f" and {len(items) - limit} more" if len(items) > limit else ""))


def print_core_schedules(console: Console, schedules: Mapping[str, CoreSchedule],
                         chosen: str | None = None, title: str = "") -> None:
    """Layer-split vs pipelined multi-core schedules: latency, period, throughput, stages
    (``title`` prefixes the table's heading)."""
    t = Table(title=f"{title}multi-core schedules", title_justify="left")
    for col in ("schedule", "cores", "latency µs", "period µs", "inferences/s", "stages (layers)",
                "DRAM-bound period"):
        t.add_column(col, justify="left" if col == "schedule" else "right")
    for kind, s in schedules.items():
        mark = " *" if kind == chosen else ""
        t.add_row(kind + mark, str(s.cores), f"{s.latency_s * 1e6:,.1f}",
                  f"{s.period_s * 1e6:,.1f}", f"{s.throughput_per_s:,.1f}",
                  " + ".join(str(len(x)) for x in s.stages),
                  "yes" if s.dram_s >= s.period_s * (1 - 1e-9) else "no")
    print_table(console, t)
    if chosen:
        console.print(f"* chosen: {chosen}")


def print_coresidency(console: Console, co: CoResidency) -> None:
    """Each model's latency alone and together, its cores, bandwidth and weights."""
    t = Table(title=f"{len(co.models)} models on {co.npu} ({co.sharing})", title_justify="left")
    for col in ("model", "alone µs", "together µs", "slowdown", "cores", "DRAM GB/s",
                "weights", "DRAM footprint KiB", "fits"):
        t.add_column(col, justify="left" if col in ("model", "weights") else "right")
    for m in co.models:
        t.add_row(m.name, f"{m.alone_s * 1e6:,.1f}", f"{m.together_s * 1e6:,.1f}",
                  f"{m.slowdown:.2f}x", str(m.cores), f"{m.dram_bytes_per_s / 1e9:.2f}",
                  m.weights, _kib(m.memory.dram_footprint_bytes), "yes" if m.fits else "NO")
    print_table(console, t)
    if not co.dram_capacity_bytes:
        console.print(f"DRAM: {co.dram_footprint_bytes / 1e6:,.2f} MB held together "
                      "(capacity unlimited)")
        return
    cap = co.dram_capacity_bytes / 1e6
    line = (f"DRAM: {co.dram_footprint_bytes / 1e6:,.2f} MB with every model's weights in DRAM; "
            f"{co.dram_held_bytes / 1e6:,.2f} MB held by the models that fit (capacity "
            f"{cap:,.1f} MB)")
    if any(m.weights == "host" for m in co.models):
        line += " with the weights of " + ", ".join(
            m.name for m in co.models if m.weights == "host") + " in host memory"
    console.print(line + ("" if co.fits else "; the deployment does NOT fit the DRAM"))
    for m in co.models:
        if not m.fits:
            alone = m.memory.dram_activation_peak_bytes
            why = (f"its activations alone need {alone / 1e6:,.2f} MB"
                   if alone > co.dram_capacity_bytes else
                   f"its activations ({alone / 1e6:,.2f} MB) do not fit beside the models "
                   "before it")
            console.print(f"{m.name} does not fit the DRAM ({cap:,.1f} MB): {why}, even with "
                          "its weights in host memory")


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
      macs: multiply-accumulates of the step (all layers).
      dram_bytes: DRAM bytes the step moves (the schedule's, all layers).
      roofline_s: the roofline bound of the whole step, ``max(macs / peak MAC rate, dram_bytes
        / DRAM bandwidth)`` (s; Williams et al. 2009, "Roofline", CACM 52(4)); the modelled
        latency is never below it. NaN when lowered without a spec.
      bound: ``"compute"`` or ``"memory"``: which roof is the higher (``""`` without a spec).
      arithmetic_intensity: ``macs / dram_bytes`` (MACs per byte); the step is compute-bound
        above the spec's ridge point ``peak MAC rate / bandwidth``.
    """

    config: Any
    phase: str
    seq_len: int
    kv_len: int
    batch: int
    kv_bits: int
    tokens_per_s: float
    kv_cache_bytes_per_token: float
    macs: float = float("nan")
    dram_bytes: float = float("nan")
    roofline_s: float = float("nan")
    bound: str = ""
    arithmetic_intensity: float = float("nan")

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


def kv_cache_operands(graph: Graph) -> dict[str, int]:
    """``{attention MatMul: operand index}``: the operand of each GEMM of two activations that
    is read from a key/value cache, i.e. whose value comes, through ops exact on integer codes
    (Reshape, Transpose, ...), from a Concat of a graph constant (the cached positions) with
    the new ones. Empty for a graph without a cache (a prefill, an encoder)."""
    from npujax.ops import OPS, operand_quantized_ops

    def from_cache(t: str) -> bool:
        while (p := graph.producer(t)) is not None:
            if p.op == "Concat":
                return any(i in graph.constants for i in p.inputs)
            if OPS[p.op].codes != "exact" or not p.inputs:
                return False
            t = p.inputs[0]
        return False

    out = {}
    for n in graph.nodes:
        if n.op in operand_quantized_ops():
            idx = [i for i in (0, 1) if from_cache(n.inputs[i])]
            if len(idx) == 1:
                out[n.name] = idx[0]
    return out


def decoder_precision(graph: Graph, weight_bits: int, act_bits: int, kv_bits: int
                      ) -> dict[str, Any] | None:
    """The spec of a decoder lowering: the linear layers at ``weight_bits``/``act_bits``
    (weight-only int4: 4/16); in each attention MatMul the operand read from the KV cache
    (:func:`kv_cache_operands`: K in ``Q K^T``, V in ``P V`` of a decode step) at ``kv_bits``
    and the other (the new token's query, the softmax output) at ``act_bits``. A prefill
    computes its keys and values (no cache operand): both attention operands at ``act_bits``.
    None when everything is 8 bits.

    Where the operands sit on the array follows the cost model's GEMM mapping (the first
    operand streams, ``M x K`` at its width; the second is the stationary one, ``K x N``): the
    traced decode attention streams the cache (``M = kv_len + 1`` positions, or ``K`` for
    ``P V``) past the one-token operand, so each cached element is read once per step at
    ``kv_bits``.
    """
    from npujax.numerics import IntFormat
    from npujax.ops import operand_quantized_ops
    from npujax.quantize.spec import for_operands, quant_spec

    if weight_bits == act_bits == kv_bits == 8:
        return None
    q = quant_spec(graph, weight_bits, act_bits)
    cache = kv_cache_operands(graph)
    for n in graph.nodes:
        if n.op not in operand_quantized_ops():
            continue
        first, second = act_bits, act_bits
        if n.name in cache:
            first, second = (kv_bits, act_bits) if cache[n.name] == 0 else (act_bits, kv_bits)
        lq = dataclasses.replace(q[n.name], act=IntFormat(first, signed=False),
                                 weight=IntFormat(second, narrow_range=True))
        q[n.name] = for_operands(graph, n.name, lq, second)
    return q


def decoder_figures(schedule: Schedule, config: Any, *, phase: str, seq_len: int, kv_len: int,
                    batch: int, kv_bits: int, spec: NpuSpec | None = None) -> DecoderLowering:
    """Tokens per second, KV-cache bytes per token and (with ``spec``) the roofline bound of a
    lowered decoder phase (see :class:`DecoderLowering`)."""
    tokens = batch * (seq_len if phase == "prefill" else 1)
    kv = (2 * config.layers * kv_len * config.kv_heads * config.head_dim * kv_bits / 8
          if phase == "decode" else 0.0)
    roof: dict[str, Any] = {}
    if spec is not None:
        macs, nbytes = float(schedule.macs), float(schedule.dram_bytes)
        compute_s, memory_s = macs / spec.peak_macs_per_s, nbytes / spec.memory.dram_bytes_per_s
        roof = {"macs": macs, "dram_bytes": nbytes, "roofline_s": max(compute_s, memory_s),
                "bound": "compute" if compute_s >= memory_s else "memory",
                "arithmetic_intensity": macs / nbytes if nbytes else float("inf")}
    return DecoderLowering(config, phase, seq_len, kv_len, batch, kv_bits,
                           tokens / schedule.latency_s, kv, **roof)

"""The lowering report as text and files: the tables ``npujax lower`` and ``npujax demo`` print
(per layer, per dataflow, activations between layers, attention blocks, memory, multi-core
schedules, co-resident models, the resolution sweep) and the files they write."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from npujax.report.files import write_json, write_layers_csv
from npujax.report.plots import plot_breakdown, plot_layer_latency, plot_roofline
from npujax.report.tables import dataflow_table, layer_table, print_table

if TYPE_CHECKING:
    from npujax.hw.spec import NpuSpec
    from npujax.plan.coresident import CoResidency
    from npujax.plan.host_pipeline import PipelineReport
    from npujax.plan.lower import Lowering, Schedule
    from npujax.plan.memory import MemoryReport
    from npujax.plan.pipeline import CoreSchedule
    from npujax.plan.thermal import SustainedReport

__all__ = ["print_lowering", "summary_line", "write_lowering", "print_resolution_sweep",
           "print_sram_split", "print_edges", "print_rewrites", "print_shape_buckets",
           "print_attention", "print_memory", "print_core_schedules", "print_coresidency",
           "print_sustained", "print_host_pipeline"]


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


def summary_line(schedule: Schedule, model: str, npu: str,
                 core_schedule: Mapping[str, Any] | None = None) -> str:
    """One line a user reads first: latency per inference (per batch where the batch is larger
    than 1), throughput in inferences per second, energy, the largest share of the latency
    breakdown, and how many layers run on the host.

    Args:
      schedule: the lowered schedule.
      model: the model's name as the user gave it.
      npu: the preset's name.
      core_schedule: the multi-core schedule ``--schedule`` chose
        (:meth:`npujax.plan.CoreSchedule.to_dict`), whose latency and throughput then replace
        the single schedule's; None for none.

    Example: ``mobilenet.onnx on coral_edgetpu: 2.412 ms per inference (415/s), 0.31 mJ;
    largest share: dma 44 %; 0 of 31 layers on the host``; at batch 8: ``0.049 ms per batch of
    8 (161,785 inferences/s), 0.0272 mJ per batch; ...``.
    """
    s = schedule
    parts = s.breakdown_s()
    total = sum(parts.values())
    top = max(parts, key=parts.__getitem__) if total > 0 else None
    share = f"; largest share: {top} {100 * parts[top] / total:.0f} %" if top else ""
    host = sum(r.device != "npu" for r in s.layers)
    latency, rate, how = s.latency_s, s.throughput_per_s, ""
    if core_schedule is not None:
        latency, rate = core_schedule["latency_s"], core_schedule["throughput_per_s"]
        how = f" ({core_schedule['kind']} on {core_schedule['cores']} cores)"
    per = "per inference" if s.batch == 1 else f"per batch of {s.batch}"
    return (f"{model} on {npu}{how}: {latency * 1e3:,.3f} ms {per} "
            f"({rate:,.0f} inferences/s), {s.energy_j * 1e3:,.3g} mJ"
            f"{'' if s.batch == 1 else ' per batch'}{share}; {host} of {len(s.layers)} layers "
            "on the host")


def schedule_record(lowering: Lowering, extra: Mapping[str, Any] | None = None) -> dict:
    """``schedule.json``'s content: the schedule, its per-dataflow latencies (s) and energies
    (J), and ``extra`` (e.g. a decoder step's figures)."""
    return {**lowering.schedule.to_dict(),
            "dataflow_latency_s": {df: x.latency_s for df, x in lowering.by_dataflow.items()},
            "dataflow_energy_j": {df: x.energy_j for df, x in lowering.by_dataflow.items()},
            **dict(extra or {})}


def write_lowering(out: str | Path, lowering: Lowering, spec: NpuSpec,
                   extra: Mapping[str, Any] | None = None) -> list[str]:
    """Write ``schedule.json`` (with the per-dataflow latencies and ``extra``), ``layers.csv``
    and the plots ``layer_latency.png``, ``breakdown.png``, ``roofline.png`` (each atomically).

    Returns:
      The names of the files written.
    """
    out = Path(out)
    s = lowering.schedule
    write_json(out / "schedule.json", schedule_record(lowering, extra))
    write_layers_csv(out / "layers.csv", s)
    plot_layer_latency(out / "layer_latency.png", {s.dataflow: s})
    plot_breakdown(out / "breakdown.png", s)
    plot_roofline(out / "roofline.png", s, spec.peak_macs_per_s, spec.memory.dram_bytes_per_s)
    return ["schedule.json", "layers.csv", "layer_latency.png", "breakdown.png", "roofline.png"]


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


def print_rewrites(console: Console, schedule: Schedule) -> None:
    """The unsupported layers under the preset's ``ops.unsupported`` policy: rewritten or sent
    to the host, the whole graph's latency either way, and why (nothing under ``fallback``)."""
    if not schedule.rewrites:
        return
    t = Table(title="unsupported layers: rewrite or fallback", title_justify="left")
    for col in ("layer", "op", "rule", "choice", "graph µs, fallback", "graph µs, rewrite",
                "why"):
        t.add_column(col, justify="left" if col in ("layer", "op", "rule", "choice", "why")
                     else "right")
    fmt = (lambda v: "" if v is None else f"{v * 1e6:,.2f}")  # noqa: E731
    for c in schedule.rewrites:
        t.add_row(escape(c.node), c.op, c.rule or "-", c.choice, fmt(c.fallback_s),
                  fmt(c.rewrite_s), escape(c.reason))
    t.caption = ("graph µs: the whole graph's latency with this layer sent to the host or "
                 "rewritten, the layers above already decided")
    print_table(console, t)


def print_shape_buckets(console: Console, report: Mapping[str, Any], title: str = "") -> None:
    """``--shapes``: latency per input shape, the best buckets per ``k``, recompiling per
    shape, and the recommendation (:func:`npujax.workflows.shape_buckets.shape_bucket_report`)."""
    t = Table(title=f"{title}input shapes", title_justify="left")
    for col in ("shape", "probability", "MACs", "latency µs"):
        t.add_column(col, justify="right")
    for r in report["shapes"]:
        t.add_row(r["shape"], f"{r['probability']:.3f}", f"{r['macs']:,}",
                  f"{r['latency_s'] * 1e6:,.1f}")
    print_table(console, t)
    t = Table(title=f"{title}buckets (compile {report['compile_s']:g} s per shape over "
                    f"{report['inferences']:g} inferences)", title_justify="left")
    for col in ("plan", "buckets", "mean latency µs", "mean compile µs", "mean total µs",
                "wasted MMACs", "wasted DRAM KiB"):
        t.add_column(col, justify="right")
    plans = [(f"k<={p['k']}", p) for p in report["plans"]]
    plans.append(("per shape", report["recompile_per_shape"]))
    for label, p in plans:
        t.add_row(label, " ".join(p["buckets"]), f"{p['latency_s'] * 1e6:,.1f}",
                  f"{p['compile_s'] * 1e6:,.1f}", f"{p['total_s'] * 1e6:,.1f}",
                  f"{p['wasted_macs'] / 1e6:,.2f}", _kib(p["wasted_dram_bytes"]))
    print_table(console, t)
    best = report["recommended"]
    console.print(f"recommended: buckets {' '.join(best['buckets'])} "
                  f"({best['total_s'] * 1e6:,.1f} µs expected per inference); one resident "
                  f"model reloaded on every shape change: "
                  f"{report['reload_on_change_s'] * 1e6:,.1f} µs.")


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


def print_sram_split(console: Console, schedule: Schedule) -> None:
    """The split of a shared on-chip SRAM the compiler was modelled to choose for this model
    (``Schedule.sram_split``; nothing on a preset with fixed buffers)."""
    sp = schedule.sram_split
    if not sp:
        return
    act = sp["ifmap_sram_bytes"] + sp["ofmap_sram_bytes"]
    console.print(
        f"on-chip SRAM {_kib(sp['onchip_sram_bytes'])} KiB split for this model (the fastest "
        f"of the modelled splits, memory.sram_split = per_model): activations {_kib(act)} KiB "
        f"({sp['activation_share']:.1%} of what the filter buffer leaves), filter buffer "
        f"{_kib(sp['filter_sram_bytes'])} KiB, parameter cache "
        f"{_kib(sp['parameter_cache_bytes'])} KiB", soft_wrap=True)


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


def print_sustained(console: Console, rep: SustainedReport) -> None:
    """``lower --sustained``: each DVFS step, then the state after the seconds asked."""
    s = rep.state
    if not rep.modelled:
        console.print(f"sustained after {rep.seconds:g} s: {s.latency_s * 1e3:,.3f} ms, the "
                      "cold latency (the preset has no \\[thermal] section: nothing throttles)")
        return
    t = Table(title=f"thermal throttling (ambient {rep.thermal.ambient_c:g} C, R_ja "
                    f"{rep.thermal.junction_to_ambient_k_per_w:g} K/W, tau "
                    f"{rep.thermal.time_constant_s:g} s)", title_justify="left")
    for col in ("step", "above C", "clock MHz", "latency ms", "energy mJ", "power W",
                "steady C"):
        t.add_column(col, justify="right")
    for i, (f, lat, e, p, c) in enumerate(zip(rep.clocks_hz, rep.latency_s, rep.energy_j,
                                               rep.power_w, rep.steady_temperature_c,
                                               strict=True)):
        above = "-" if i == 0 else f"{rep.thermal.dvfs_thresholds_c[i - 1]:g}"
        t.add_row(str(i), above, f"{f / 1e6:,.2f}", f"{lat * 1e3:,.3f}", f"{e * 1e3:,.3f}",
                  f"{p:,.3f}", f"{c:,.1f}")
    print_table(console, t)
    first = ("never" if s.first_throttle_s == float("inf")
             else f"after {s.first_throttle_s:,.1f} s")
    cycle = (f"a limit cycle between steps {s.steady_step - 1} and {s.steady_step} (mean "
             f"latency)" if s.limit_cycle else f"step {s.steady_step}")
    console.print(f"cold {rep.latency_s[0] * 1e3:,.3f} ms; first throttle {first}; after "
                  f"{rep.seconds:g} s: {s.latency_s * 1e3:,.3f} ms at step {s.step}, "
                  f"{s.temperature_c:,.1f} C; steady: {s.steady_latency_s * 1e3:,.3f} ms, "
                  f"{s.steady_temperature_c:,.1f} C, {cycle}")


def print_host_pipeline(console: Console, rep: PipelineReport) -> None:
    """``lower --host-stage``: the frame's stages, then synchronous vs overlapped figures."""
    total = rep.latency_s
    bound = rep.bounding_stage
    t = Table(title=f"pipeline around the NPU (batch {rep.batch})", title_justify="left")
    for col in ("stage", "runs on", "ms", "share", "Mops", "MB", "bound", "what"):
        t.add_column(col, justify="left" if col in ("stage", "runs on", "what") else "right")
    for s in rep.stages:
        mark = " *" if s is bound else ""
        t.add_row(s.name + mark, s.resource, f"{s.seconds * 1e3:,.3f}",
                  f"{s.seconds / total:.0%}" if total > 0 else "-", f"{s.ops / 1e6:,.2f}",
                  f"{s.bytes / 1e6:,.2f}", s.bound, s.detail)
    print_table(console, t)
    console.print(f"synchronous: {total * 1e3:,.3f} ms end to end, "
                  f"{rep.throughput_fps(False):,.1f} frames/s (every stage in turn)")
    console.print(f"asynchronous, double-buffered: {total * 1e3:,.3f} ms end to end, "
                  f"{rep.throughput_fps(True):,.1f} frames/s, bounded by {bound.name} "
                  f"({bound.seconds * 1e3:,.3f} ms)")

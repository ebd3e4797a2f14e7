"""Human-readable tables of a Schedule (rich)."""

from __future__ import annotations

from collections.abc import Mapping

from rich.console import JustifyMethod
from rich.table import Table

from npujax.plan.lower import Schedule

__all__ = ["layer_table", "dataflow_table"]


def _us(seconds: float) -> str:
    return f"{seconds * 1e6:,.3f}"


def _uj(joules: float) -> str:
    return f"{joules * 1e6:,.3f}"


def layer_table(schedule: Schedule, title: str | None = None) -> Table:
    """Per-layer table: name, op, device, GEMM shape, MACs, bits, cycles, latency (µs), bound,
    utilization, energy (µJ).

    ``compute`` are array (or vector-unit) cycles including fill/drain; ``other`` are the exposed
    DMA latency, stalls, CPU fallback and host transfers. The last rows are the end-to-end total
    (the sum of the per-layer latencies) and its breakdown; the caption also gives the energy
    per inference with its breakdown (:data:`npujax.plan.ENERGY_BREAKDOWN`), the energy-delay
    product and the preset's modelled area.
    """
    t = Table(title=title or f"{schedule.npu} — {schedule.dataflow}", title_justify="left")
    columns: list[tuple[str, JustifyMethod]] = [
        ("layer", "left"), ("op", "left"), ("dev", "left"), ("M", "right"), ("K", "right"),
        ("N", "right"), ("MACs", "right"), ("W", "right"), ("A", "right"),
        ("compute cyc", "right"), ("memory cyc", "right"), ("other cyc", "right"),
        ("latency µs", "right"), ("bound", "left"), ("util", "right"), ("energy µJ", "right")]
    for col, justify in columns:
        # fold: a narrow terminal wraps a cell's digits instead of cutting them off
        t.add_column(col, justify=justify, overflow="fold")
    for r in schedule.layers:
        gemm = r.kind == "gemm"
        op = r.op + ("+" + "+".join(r.epilogue) if r.epilogue else "")
        c = r.costs
        other = c.dma_cycles + c.stall_cycles + c.fallback_cycles + c.transfer_cycles
        t.add_row(
            r.name, op, r.device, str(r.M) if gemm else "", str(r.K) if gemm else "",
            str(r.N) if gemm else "", f"{r.macs:,}" if r.macs else "",
            str(r.weight_bits) if gemm else "", str(r.act_bits),
            f"{c.compute_cycles:,}", f"{c.memory_cycles:,.0f}", f"{other:,.0f}",
            _us(r.latency_s), r.bound, f"{c.utilization:.1%}" if gemm and r.device == "npu" else "",
            _uj(r.energy_j),
        )
    t.add_section()
    t.add_row("total", "", "", "", "", "", f"{schedule.macs:,}", "", "",
              f"{sum(r.costs.compute_cycles for r in schedule.layers):,}",
              f"{sum(r.costs.memory_cycles for r in schedule.layers):,.0f}", "",
              _us(schedule.latency_s), "", "", _uj(schedule.energy_j))
    parts = ", ".join(f"{k} {v * 1e6:,.3f}" for k, v in schedule.breakdown_s().items() if v)
    energy = ", ".join(f"{k} {v * 1e6:,.3f}" for k, v in schedule.energy_breakdown_j().items()
                       if v)
    t.caption = (f"latency breakdown (µs): {parts}; throughput {schedule.throughput_per_s:,.0f}/s"
                 f"\nenergy {_uj(schedule.energy_j)} µJ per inference ({energy}); "
                 f"EDP {schedule.edp_js:.4g} J·s; area {schedule.area_mm2:,.3f} mm²")
    return t


def dataflow_table(schedules: Mapping[str, Schedule], reference: str | None = None) -> Table:
    """End-to-end totals of the same model under several dataflows, side by side."""
    t = Table(title="end-to-end latency by dataflow", title_justify="left")
    for col in ("dataflow", "compute cycles", "latency µs", "memory-bound", "vs ref", "energy µJ",
                "EDP J·s"):
        t.add_column(col, justify="left" if col == "dataflow" else "right", overflow="fold")
    ref = schedules[reference].latency_s if reference is not None and reference in schedules \
        else None
    for name, s in schedules.items():
        mem = sum(1 for r in s.layers if r.bound == "memory")
        ratio = f"{s.latency_s / ref:.2f}×" if ref else ""
        t.add_row(name, f"{sum(r.costs.compute_cycles for r in s.layers):,}", _us(s.latency_s),
                  f"{mem}/{len(s.layers)}", ratio, _uj(s.energy_j), f"{s.edp_js:.4g}")
    return t

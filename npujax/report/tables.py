"""Human-readable tables of a Schedule (rich)."""

from __future__ import annotations

from collections.abc import Mapping

from rich.console import Console, JustifyMethod
from rich.table import Table

from npujax.plan.lower import Schedule

__all__ = ["layer_table", "dataflow_table", "print_table", "plain_table"]


def _us(seconds: float) -> str:
    return f"{seconds * 1e6:,.3f}"


def _uj(joules: float) -> str:
    return f"{joules * 1e6:,.3f}"


#: Short forms of :data:`npujax.plan.lower.ACTIVATION_PLACEMENTS` for the ``acts`` column.
_PLACE = {"dram": "D", "sram": "S", "depth_first": "DF", "fused": "F", "attention": "A",
          "host": "H"}


def layer_table(schedule: Schedule, title: str | None = None) -> Table:
    """Per-layer table: name, op, device, GEMM shape, MACs, bits, cycles, latency (µs), bound,
    utilization, energy (µJ), and where the layer's input and output activations lived
    (``acts``, :func:`npujax.plan.lower.activation_placements`).

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
        ("latency µs", "right"), ("bound", "left"), ("util", "right"), ("energy µJ", "right"),
        ("acts", "left")]
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
            _uj(r.energy_j), f"{_PLACE[r.input_placement]}→{_PLACE[r.output_placement]}",
        )
    t.add_section()
    t.add_row("total", "", "", "", "", "", f"{schedule.macs:,}", "", "",
              f"{sum(r.costs.compute_cycles for r in schedule.layers):,}",
              f"{sum(r.costs.memory_cycles for r in schedule.layers):,.0f}", "",
              _us(schedule.latency_s), "", "", _uj(schedule.energy_j), "")
    parts = ", ".join(f"{k} {v * 1e6:,.3f}" for k, v in schedule.breakdown_s().items() if v)
    energy = ", ".join(f"{k} {v * 1e6:,.3f}" for k, v in schedule.energy_breakdown_j().items()
                       if v)
    t.caption = (f"latency breakdown (µs): {parts}; throughput {schedule.throughput_per_s:,.0f}/s"
                 f"\nenergy {_uj(schedule.energy_j)} µJ per "
                 f"{'inference' if schedule.batch == 1 else f'batch of {schedule.batch}'} "
                 f"({energy}); "
                 f"EDP {schedule.edp_js:.4g} J·s; area {schedule.area_mm2:,.3f} mm²"
                 "\nacts: where the layer's input and output activations lived (D DRAM, S SRAM, "
                 "DF depth-first stripes, F fused output stage, A attention kernel, H host)")
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


def print_table(console: Console, table: Table) -> None:
    """``console.print(table)``, the same text in a fraction of the time where it can be.

    rich lays a table out cell by cell (about 1.6 ms a row: half a second for the 319 layers of
    the PP-OCR detector). Where the output has no colours and the table fits the console's
    width, which is what a pipe, a file or a CI log gets (``npujax.cli._common.console``), the
    table is written as :func:`plain_table` renders it: the same characters as rich's. Anything
    else (a terminal, colours, wrapping, a table option :func:`plain_table` does not handle)
    goes to rich.
    """
    plain = None
    if console.color_system is None and not console.is_terminal and not console.is_jupyter:
        plain = plain_table(table, console.width, console)
    if plain is None:
        console.print(table)
    else:
        console.out(plain, highlight=False, end="")


def _plain_cell(console: Console, cell: object) -> str | None:
    """A cell's text as rich would print it (its markup and emoji codes applied), or None when
    it is not a single-line string."""
    if not isinstance(cell, str):
        return None
    if "[" in cell or ":" in cell:  # markup or an emoji code: as rich reads it
        cell = console.render_str(cell).plain
    return None if "\n" in cell else cell


def plain_table(table: Table, width: int, console: Console) -> str | None:
    """The text of ``table`` exactly as rich prints it without colours on a console ``width``
    cells wide, or None where that takes rich's own layout (a table wider than ``width``, a
    title or caption line wider than the table, multi-line or non-string cells, or any option
    other than those of the tables in this module: heavy-headed box, one space of padding,
    header shown, no footer, no lines between rows, natural width). ``console`` reads the
    cells' markup and emoji codes as rich does.
    """
    from rich import box as rich_box
    from rich.cells import cell_len

    if (table.box is not rich_box.HEAVY_HEAD or table.padding != (0, 1, 0, 1)
            or not table.show_header or table.show_footer or not table.show_edge
            or table.show_lines or table.leading or table.collapse_padding or not table.pad_edge
            or table.expand or table.width is not None or table.min_width is not None
            or table.row_styles or table.title_justify not in ("left", "center", "right")
            or table.caption_justify not in ("left", "center", "right")):
        return None
    cols = table.columns
    if not cols or any(c.width is not None or c.min_width is not None
                       or c.max_width is not None or c.ratio is not None
                       or c.justify not in ("left", "right", "center") for c in cols):
        return None
    texts: list[list[str]] = []
    for c in cols:
        cells = [_plain_cell(console, x) for x in (c.header, *c._cells)]
        if any(x is None for x in cells):
            return None
        texts.append(cells)  # type: ignore[arg-type]
    widths = [max(cell_len(x) for x in cells) for cells in texts]
    total = sum(widths) + 3 * len(widths) + 1
    if total > width:
        return None

    def just(text: str, w: int, how: str) -> str:
        pad = w - cell_len(text)
        if how == "right":
            return " " * pad + text
        if how == "center":
            return " " * (pad // 2) + text + " " * (pad - pad // 2)
        return text + " " * pad

    def rule(left: str, fill: str, mid: str, right: str) -> str:
        return left + mid.join(fill * (w + 2) for w in widths) + right

    def row(i: int, edge: str) -> str:
        return edge + edge.join(" " + just(t[i], w, c.justify) + " "
                                for t, w, c in zip(texts, widths, cols)) + edge

    def around(text: object, how: str) -> list[str] | None:
        if text is None or text == "":
            return []
        if not isinstance(text, str):
            return None
        lines = console.render_str(text).plain.split("\n")
        if any(cell_len(x) > total for x in lines):
            return None
        return [just(x, total, how) for x in lines]

    title = around(table.title, table.title_justify)
    caption = around(table.caption, table.caption_justify)
    if title is None or caption is None:
        return None
    lines = [*title, rule("┏", "━", "┳", "┓"), row(0, "┃"), rule("┡", "━", "╇", "┩")]
    n_rows = len(texts[0]) - 1
    for r in range(n_rows):
        lines.append(row(r + 1, "│"))
        if table.rows[r].end_section and r < n_rows - 1:
            lines.append(rule("├", "─", "┼", "┤"))
    lines += [rule("└", "─", "┴", "┘"), *caption]
    return "\n".join(lines) + "\n"

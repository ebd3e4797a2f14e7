"""print_table writes the same characters as rich's own table layout where the output has no
colours and the table fits (the fast path of `npujax lower`'s long tables), and leaves every
other case to rich."""

import io

from rich.console import Console
from rich.table import Table

from npujax.plan import LayerCosts, LayerReport, Schedule
from npujax.report import dataflow_table, layer_table, print_table
from npujax.report.tables import plain_table


def _schedule(names, dataflow="output_stationary"):
    rows = []
    for i, name in enumerate(names):
        c = LayerCosts(compute_cycles=100 + 7 ** i, fill_drain_cycles=10, convert_cycles=0.0,
                       dma_cycles=5.0, stall_cycles=float(i % 7), fallback_cycles=0.0,
                       transfer_cycles=0.0, latency_cycles=float(105 + i + i % 7),
                       memory_cycles=float(50 + 3 * i), dram_bytes=float(1000 + i),
                       weight_dram_bytes=0.0,
                       refetch_factor=1.0, sram_peak_bytes=0.0, folds=1, utilization=0.5,
                       mapping_efficiency=0.9)
        gemm = i % 2 == 0
        rows.append(LayerReport(name=name, op="Conv" if gemm else "Relu",
                                kind="gemm" if gemm else "vector", device="npu", reason="",
                                M=8 * i, K=8, N=8, macs=512 * (i + 1), weight_bits=8, act_bits=8,
                                costs=c, latency_s=c.latency_cycles / 1e9,
                                bound="memory" if i % 3 == 0 else "compute",
                                epilogue=("Relu",) if i == 2 else ()))
    return Schedule("npu", dataflow, 1e9, 1, tuple(rows))


def _both(table_fn, width=10_000):
    """(rich's text, print_table's text) of the same table on a colourless console."""
    out = []
    for fn in (lambda c, t: c.print(t), print_table):
        buf = io.StringIO()
        fn(Console(file=buf, width=width, color_system=None), table_fn())
        out.append(buf.getvalue())
    return out


# names with rich markup, an emoji code, a colon, a wide character and a long name
NAMES = ["x:in", "conv[bold]1[/bold]", "p2o.Conv.0 :smile:", "层", "a" * 40, "[0]", "relu"]


def test_layer_and_dataflow_tables_match_rich():
    s = _schedule(NAMES)
    rich_text, ours = _both(lambda: layer_table(s, "m.onnx on npu — µs [x]"))
    assert ours == rich_text and "┡" in ours and "├" in ours and "latency breakdown" in ours
    by_df = {d: _schedule(NAMES, d) for d in ("weight_stationary", "output_stationary")}
    rich_text, ours = _both(lambda: dataflow_table(by_df, reference="output_stationary"))
    assert ours == rich_text and "1.00×" in ours


def test_titles_justified_and_sections_match_rich():
    def table():
        t = Table(title="right", title_justify="right", caption="one\n2nd line",
                  caption_justify="left")
        t.add_column("k", justify="center")
        t.add_column("value", justify="right")
        for i in range(5):
            t.add_row(str(i), f"{10 ** i:,}", end_section=i == 1)
        return t
    rich_text, ours = _both(table)
    assert ours == rich_text
    assert plain_table(table(), 100, Console(file=io.StringIO(), color_system=None)) == ours


def test_what_it_does_not_lay_out_goes_to_rich():
    s = _schedule(NAMES)
    console = Console(file=io.StringIO(), width=60, color_system=None)
    assert plain_table(layer_table(s), 60, console) is None  # wider than the console
    rich_text, ours = _both(lambda: layer_table(s), width=60)  # rich wraps the cells
    assert ours == rich_text
    t = Table(show_lines=True)
    t.add_column("a")
    t.add_row("1")
    assert plain_table(t, 100, console) is None


def test_summary_line_says_per_batch_and_the_chosen_core_schedule():
    """The headline of `npujax lower`: at batch 8 the latency and energy are a batch's, and
    the throughput counts inferences; a chosen multi-core schedule replaces the figures."""
    import dataclasses

    from npujax.report.lowering import summary_line

    one = _schedule(["a", "b", "c"])
    line = summary_line(one, "m.onnx", "npu")
    assert " ms per inference (" in line and "inferences/s" in line and "per batch" not in line
    eight = dataclasses.replace(one, batch=8)
    line = summary_line(eight, "m.onnx", "npu")
    assert " ms per batch of 8 (" in line and " mJ per batch;" in line
    rate = f"{eight.throughput_per_s:,.0f} inferences/s"
    assert rate in line and eight.throughput_per_s == 8 * one.throughput_per_s
    pipe = {"kind": "pipeline", "cores": 4, "latency_s": 0.0509165, "throughput_per_s": 55.8}
    line = summary_line(one, "m.onnx", "npu", pipe)
    assert "(pipeline on 4 cores): 50.917 ms per inference (56 inferences/s)" in line

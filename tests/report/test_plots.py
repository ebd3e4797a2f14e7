"""Plots: drawn with the object API (the caller's matplotlib backend is never switched), returned
as figures, written atomically, and readable for large models (the slowest layers only)."""

import matplotlib

from npujax.plan import LayerCosts, LayerReport, Schedule
from npujax.report import plot_breakdown, plot_layer_latency, plot_roofline
from npujax.report.plots import MAX_BARS, MAX_LABELS


def _schedule(n):
    rows = []
    for i in range(n):
        c = LayerCosts(compute_cycles=100 + i, fill_drain_cycles=10, convert_cycles=0.0,
                       dma_cycles=5.0, stall_cycles=float(i % 7), fallback_cycles=0.0,
                       transfer_cycles=0.0, latency_cycles=float(105 + i + i % 7),
                       memory_cycles=float(50 + 3 * i), dram_bytes=float(1000 + i),
                       weight_dram_bytes=0.0,
                       refetch_factor=1.0, sram_peak_bytes=0.0, folds=1, utilization=0.5,
                       mapping_efficiency=0.9)
        rows.append(LayerReport(name=f"l{i}", op="Conv", kind="gemm", device="npu", reason="",
                                M=8, K=8, N=8, macs=512 * (i + 1), weight_bits=8, act_bits=8,
                                costs=c, latency_s=c.latency_cycles / 1e9,
                                bound="memory" if i % 3 == 0 else "compute"))
    return Schedule("npu", "output_stationary", 1e9, 1, tuple(rows))


def test_large_models_plot_the_slowest_layers_and_keep_the_backend(tmp_path):
    before = matplotlib.get_backend()
    big = _schedule(150)
    fig = plot_layer_latency(tmp_path / "lat.png", {"a": big, "b": big})
    ax = fig.axes[0]
    names = [t.get_text() for t in ax.get_xticklabels()]
    assert len(names) == MAX_BARS and names[-1] == "l149"  # the slowest, in graph order
    assert "40 slowest of 150" in ax.get_title()
    assert fig.get_size_inches()[0] < 60 and (tmp_path / "lat.png").stat().st_size > 10_000
    fig = plot_breakdown(None, big)  # draws without writing
    assert len(fig.axes[0].get_xticks()) == MAX_BARS
    fig = plot_roofline(tmp_path / "roof.png", big, 256e9, 6.4e9)
    assert len(fig.axes[0].texts) == MAX_LABELS
    assert matplotlib.get_backend() == before
    assert not list(tmp_path.glob(".*.tmp"))  # atomic writes left no temporary files


def test_small_models_plot_every_layer():
    fig = plot_layer_latency(None, {"x": _schedule(5)})
    assert [t.get_text() for t in fig.axes[0].get_xticklabels()] == [f"l{i}" for i in range(5)]
    assert "slowest" not in fig.axes[0].get_title()


def test_schedule_and_reports_render_as_html_tables_in_notebooks():
    """Jupyter shows a cell's value through ``_repr_html_``; plots are Figures (shown inline)."""
    from npujax.plan import MemoryReport
    from npujax.search import PrecisionPolicy, SearchReport

    s = _schedule(3)
    page = s._repr_html_()
    assert page.count("<tr>") == 1 + 3 and "l2" in page and "output_stationary" in page
    assert "<td style=\"text-align:right\">1,536</td>" in page  # MACs of l2, separated
    mem = MemoryReport(weight_bytes=2048.0, dram_activation_peak_bytes=1024.0,
                       dram_footprint_bytes=3072.0, dram_capacity_bytes=0.0,
                       sram_peak_bytes=512.0, sram_capacity_bytes=4096.0, fits=True,
                       spill=(("fc<1>", 1024.0),))
    page = mem._repr_html_()
    assert "weight KiB</td><td style=\"text-align:right\">2</td>" in page and "fc&lt;1&gt;" in page
    rep = SearchReport(policy=PrecisionPolicy({"l0": 4, "l1": 8}, {"l0": 8, "l1": 8}),
                       method="ilp", npu="npu", loss="logits", distilled=True, budget_s=1e-6,
                       latency_s=2e-6, int8_latency_s=3e-6, pinned=None, details={})
    assert "NOT met" in rep._repr_html_() and rep._repr_html_().count("<tr>") == 3

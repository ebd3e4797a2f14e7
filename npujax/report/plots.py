"""Plots people would rather look at than read (matplotlib, written atomically as PNG).

Every plot is drawn with matplotlib's object API on its own ``Figure`` (never ``pyplot``), so it
neither switches nor uses the caller's backend (a notebook keeps its own), and is returned as
well as saved: ``fig = plot_breakdown(None, schedule)`` only draws it.
"""

from __future__ import annotations

import io
import math
import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from npujax._atomic import atomic_write_bytes
from npujax.plan.costs import BREAKDOWN
from npujax.plan.lower import Schedule

if TYPE_CHECKING:  # matplotlib is imported when a plot is drawn (0.3 s: not for every command)
    from matplotlib.figure import Figure

__all__ = ["plot_layer_latency", "plot_breakdown", "plot_roofline", "plot_measured_vs_modelled",
           "new_figure", "save_figure", "MAX_BARS"]

Where = str | os.PathLike[str] | None

#: Per-layer bar plots show at most this many layers (the slowest, in graph order); a 237-layer
#: detector would otherwise make an unreadable 30,000-pixel-wide picture.
MAX_BARS = 40
#: The roofline names at most this many layers (the slowest).
MAX_LABELS = 12


def _slowest(rows: Sequence[Any], n: int) -> list[int]:
    """Indices of the ``n`` slowest rows, in graph order."""
    order = sorted(range(len(rows)), key=lambda i: -rows[i].latency_s)[:n]
    return sorted(order)


def _shown(total: int, shown: int) -> str:
    return "" if shown == total else f" (the {shown} slowest of {total} layers)"


def new_figure(width: float, height: float) -> tuple[Figure, Any]:
    """A figure of ``width x height`` inches with one axes, on its own Agg canvas."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height))
    FigureCanvasAgg(fig)
    return fig, fig.add_subplot()


def save_figure(fig: Figure, path: Where, *, tight: bool = True) -> Figure:
    """Write ``fig`` as a PNG at ``path`` atomically (nothing when ``path`` is None); returns it.

    ``tight``: fit the margins to the labels first (``Figure.tight_layout``, which draws the
    figure once more to measure them); False keeps the margins the caller set."""
    if tight:
        fig.tight_layout()
    if path is not None:
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=120)
        atomic_write_bytes(path, buf.getvalue())
    return fig


def plot_layer_latency(
    path: Where, schedules: Mapping[str, Schedule], title: str = ""
) -> Figure:
    """Grouped bars of per-layer latency (µs), one group per layer and one bar per schedule.

    Memory-bound layers are hatched ``//`` and CPU-fallback layers ``xx``, so a reader sees where
    DRAM bandwidth or operator support is the bottleneck.
    All schedules must have the same layers (e.g. INT8 vs mixed precision, or dataflows).
    Returns the figure (saved at ``path`` unless None).
    """
    from matplotlib.patches import Patch

    labels = list(schedules)
    first = schedules[labels[0]].layers
    keep = _slowest(first, MAX_BARS)
    names = [first[i].name for i in keep]
    x = np.arange(len(names))
    width = 0.8 / len(labels)
    fig, ax = new_figure(max(6.0, 1.1 * len(names) + 2), 4.2)
    handles = []
    hatched = set()
    for i, label in enumerate(labels):
        rows = [schedules[label].layers[k] for k in keep]
        lat = [r.latency_s * 1e6 for r in rows]
        color = f"C{i}"
        bars = ax.bar(x + (i - (len(labels) - 1) / 2) * width, lat, width, color=color)
        for b, r in zip(bars, rows):
            if r.bound in _HATCH:
                b.set_hatch(_HATCH[r.bound])
                hatched.add(r.bound)
        handles.append(Patch(color=color,
                             label=f"{label} (total {schedules[label].latency_s * 1e6:.2f} µs)"))
    handles += [Patch(facecolor="white", edgecolor="black", hatch=_HATCH[b], label=what)
                for b, what in (("memory", "memory-bound"), ("fallback", "CPU fallback"))
                if b in hatched]
    ax.set_xticks(x, names, rotation=30, ha="right")
    ax.set_ylabel("latency (µs)")
    npu = schedules[labels[0]].npu
    ax.set_title((title or f"per-layer latency on {npu}") + _shown(len(first), len(keep)))
    ax.legend(handles=handles, fontsize=8, loc="upper right")  # (see plot_breakdown)
    ax.grid(axis="y", alpha=0.3)
    return save_figure(fig, path)


_HATCH = {"memory": "//", "fallback": "xx"}
_BREAKDOWN_COLORS = {"compute": "C0", "fill_drain": "C9", "convert": "C8", "dma": "C7",
                     "stall": "C3", "fallback": "C1", "transfer": "C5"}


def plot_breakdown(path: Where, schedule: Schedule, title: str = "") -> Figure:
    """Stacked bars of each layer's latency split into compute, fill/drain, DMA, stall, CPU
    fallback and host transfer (µs); the stacks sum to the layer latencies. Returns the figure
    (saved at ``path`` unless None)."""
    keep = _slowest(schedule.layers, MAX_BARS)
    rows = [schedule.layers[k] for k in keep]
    x = np.arange(len(rows))
    fig, ax = new_figure(max(7.5, 0.55 * len(rows) + 2), 4.4)
    bottom = np.zeros(len(rows))
    for part in BREAKDOWN:
        vals = np.asarray([r.breakdown()[part] / schedule.clock_hz * 1e6 for r in rows])
        if vals.any():
            ax.bar(x, vals, 0.8, bottom=bottom, label=part.replace("_", "/"),
                   color=_BREAKDOWN_COLORS[part])
            bottom += vals
    ax.set_xticks(x, [r.name for r in rows], rotation=45, ha="right", fontsize=7)
    ax.set_ylabel("latency (µs)")
    ax.set_title((title or f"latency breakdown on {schedule.npu} ({schedule.dataflow})\n"
                           f"total {schedule.latency_s * 1e6:.2f} µs")
                 + _shown(len(schedule.layers), len(rows)), fontsize=10)
    # a fixed place: matplotlib times its search for the "best" one and warns when it is slow
    # (a loaded machine turned that warning into a failed test)
    ax.legend(fontsize=8, loc="upper right")
    ax.grid(axis="y", alpha=0.3)
    return save_figure(fig, path)


def plot_roofline(
    path: Where, schedule: Schedule, peak_macs_per_s: float,
    dram_bytes_per_s: float, title: str = "",
) -> Figure:
    """The roofline of the NPU with each NPU GEMM layer as a point.

    x: arithmetic intensity (MACs per DRAM byte); y: attained MAC/s (MACs / layer latency).
    The roof is ``min(peak, intensity x bandwidth)``; the distance below it is lost to fill/drain,
    poor mapping, alignment padding and exposed DMA (Williams et al., CACM 2009). Every GEMM layer
    is a point; the :data:`MAX_LABELS` slowest are named. Returns the
    figure (saved at ``path`` unless None).
    """
    pts = [r for r in schedule.layers
           if r.kind == "gemm" and r.device == "npu" and r.costs.dram_bytes]
    fig, ax = new_figure(6.4, 4.6)
    ai = np.asarray([r.macs / r.costs.dram_bytes for r in pts]) if pts else np.asarray([1.0])
    lo, hi = min(ai.min(), peak_macs_per_s / dram_bytes_per_s) / 4, max(ai.max(), 1.0) * 4
    xs = np.geomspace(lo, max(hi, 4 * peak_macs_per_s / dram_bytes_per_s), 200)
    ax.loglog(xs, np.minimum(peak_macs_per_s, xs * dram_bytes_per_s), "k-", lw=1.5,
              label="roof: min(peak, AI × bandwidth)")
    named = {pts[i].name for i in _slowest(pts, MAX_LABELS)}  # the slowest, so labels stay legible
    for r in pts:
        perf = r.macs / r.latency_s
        ax.plot(r.macs / r.costs.dram_bytes, perf, "o",
                color="C3" if r.bound == "memory" else "C0")
        if r.name in named:
            ax.annotate(r.name, (r.macs / r.costs.dram_bytes, perf), fontsize=7, xytext=(3, 3),
                        textcoords="offset points")
    ax.set_xlabel("arithmetic intensity (MACs / DRAM byte)")
    ax.set_ylabel("attained MAC/s")
    ax.set_title(title or f"roofline of {schedule.npu} (red: memory-bound layers)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    return save_figure(fig, path)


def plot_measured_vs_modelled(
    path: Where, measured_s: Any, modelled_s: Mapping[str, Any], title: str = "", *,
    what: str = "latency per layer", unit: str = "µs", labels: Sequence[str] | None = None,
) -> Figure:
    """Log-log scatter of measured against modelled latency, one series per entry of
    ``modelled_s`` (e.g. ``{"before fit": ..., "after fit": ...}``), with the identity line
    and ±25 % bands, so a reader sees both the scale error and the points the model ranks wrong.

    Args:
      path: PNG to write (None: only draw).
      measured_s: float ``[P]`` measured seconds.
      modelled_s: ``{label: float [P] modelled seconds}``, each aligned with ``measured_s``.
      title: the plot title.
      what: what a point is, for the axis labels (``latency per layer``, ``time per
        inference``).
      unit: ``µs`` or ``ms``.
      labels: ``[P]`` names written beside the points of the last series (e.g. model names),
        or None.

    Returns:
      The figure.

    Raises:
      ValueError: an unknown ``unit``.
    """
    scale = {"µs": 1e6, "ms": 1e3}.get(unit)
    if scale is None:
        raise ValueError(f"unit must be 'µs' or 'ms', got {unit!r}")
    m = np.asarray(measured_s, np.float64) * scale
    fig, ax = new_figure(5.6, 5.0)
    allv = [m] + [np.asarray(v, np.float64) * scale for v in modelled_s.values()]
    lo = max(min(float(np.min(v[v > 0])) for v in allv if np.any(v > 0)) / 1.5, 1e-6)
    hi = max(float(np.max(v[np.isfinite(v)])) for v in allv) * 1.5
    xs = np.geomspace(lo, hi, 50)
    ax.loglog(xs, xs, "k-", lw=1, label="modelled = measured")
    ax.fill_between(xs, xs / 1.25, xs * 1.25, color="0.85", label="±25 %")
    markers = "o^sv"
    last = np.asarray(m)
    for i, (label, v) in enumerate(modelled_s.items()):
        last = np.asarray(v, np.float64) * scale
        ax.loglog(m, last, markers[i % 4], ms=4, alpha=0.75, color=f"C{i}", label=label)
    # the label of a point almost on top of one already labelled (within 2 % of the axes in
    # both directions: VGG16/19, the two SSDs of a table) goes a line higher per such point
    near = 0.02 * math.log10(hi / lo)
    placed: list[tuple[float, float]] = []  # labelled points, in decades
    for x, y, text in zip(m, last, labels or ()):
        if np.isfinite(y) and y > 0:
            lx, ly = math.log10(x), math.log10(y)
            above = sum(abs(px - lx) < near and abs(py - ly) < near for px, py in placed)
            placed.append((lx, ly))
            ax.annotate(text, (x, y), fontsize=6, xytext=(3, -3 + 8 * above),
                        textcoords="offset points")
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    ax.set_xlabel(f"measured {what} ({unit})")
    ax.set_ylabel(f"modelled {what} ({unit})")
    ax.set_title(title or f"measured vs modelled {what}", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="upper left")
    return save_figure(fig, path)

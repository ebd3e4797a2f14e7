"""Plots people would rather look at than read (matplotlib, written atomically as PNG)."""

from __future__ import annotations

import io
import os
from collections.abc import Mapping

import numpy as np

from npujax._atomic import atomic_write_bytes
from npujax.plan.latency import Schedule

__all__ = ["plot_layer_latency"]


def plot_layer_latency(
    path: str | os.PathLike[str], schedules: Mapping[str, Schedule], title: str = ""
) -> None:
    """Grouped bars of per-layer latency (µs), one group per layer and one bar per schedule.

    Memory-bound layers are hatched ``//`` and CPU-fallback layers ``xx``, so a reader sees where
    DRAM bandwidth or operator support is the bottleneck.
    All schedules must have the same layers (e.g. INT8 vs mixed precision, or dataflows).
    """
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    labels = list(schedules)
    names = [r.name for r in schedules[labels[0]].layers]
    x = np.arange(len(names))
    width = 0.8 / len(labels)
    fig, ax = plt.subplots(figsize=(max(6.0, 1.1 * len(names) + 2), 4.2))
    from matplotlib.patches import Patch

    handles = []
    for i, label in enumerate(labels):
        rows = schedules[label].layers
        lat = [r.latency_s * 1e6 for r in rows]
        color = f"C{i}"
        bars = ax.bar(x + (i - (len(labels) - 1) / 2) * width, lat, width, color=color)
        for b, r in zip(bars, rows):
            if r.bound == "memory":
                b.set_hatch("//")
            elif r.bound == "fallback":
                b.set_hatch("xx")
        handles.append(Patch(color=color,
                             label=f"{label} (total {schedules[label].latency_s * 1e6:.2f} µs)"))
    handles += [Patch(facecolor="white", edgecolor="black", hatch="//", label="memory-bound"),
                Patch(facecolor="white", edgecolor="black", hatch="xx", label="CPU fallback")]
    ax.set_xticks(x, names, rotation=30, ha="right")
    ax.set_ylabel("latency (µs)")
    npu = schedules[labels[0]].npu
    ax.set_title(title or f"per-layer latency on {npu}")
    ax.legend(handles=handles, fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=120)
    plt.close(fig)
    atomic_write_bytes(path, buf.getvalue())

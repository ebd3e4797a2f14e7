"""The per-layer quantization error report: SQNR table (Markdown, CSV, rich) and bar plot."""

from __future__ import annotations

import csv
import io
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.table import Table

from npujax._atomic import atomic_write_text
from npujax.report.plots import new_figure, save_figure

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["sqnr_table", "sqnr_markdown", "plot_layer_sqnr", "write_sqnr_report"]

_COLS = ("name", "op", "weight_bits", "act_bits", "sqnr_db")


def sqnr_table(rows: Sequence[dict[str, Any]],
               title: str = "per-layer SQNR (worst first)") -> Table:
    """A rich table of :func:`npujax.quantize.ptq.layer_sqnr` rows."""
    t = Table(title=title)
    for c in ("layer", "op", "W bits", "A bits", "SQNR (dB)"):
        t.add_column(c, justify="right" if c != "layer" else "left")
    for r in rows:
        t.add_row(r["name"], r["op"], str(r["weight_bits"]), str(r["act_bits"]),
                  f"{r['sqnr_db']:.2f}")
    return t


def sqnr_markdown(rows: Sequence[dict[str, Any]]) -> str:
    """The rows as a Markdown table (worst layer first)."""
    lines = ["| layer | op | W bits | A bits | SQNR (dB) |", "|---|---|---:|---:|---:|"]
    lines += [f"| {r['name']} | {r['op']} | {r['weight_bits']} | {r['act_bits']} | "
              f"{r['sqnr_db']:.2f} |" for r in rows]
    return "\n".join(lines) + "\n"


def plot_layer_sqnr(path: str | os.PathLike[str] | None, rows: Sequence[dict[str, Any]],
                    title: str = "per-layer SQNR, quantized vs float output") -> Figure:
    """Horizontal bars of SQNR (dB) per layer, worst at the top; returns the figure (a PNG
    written atomically at ``path`` unless None)."""
    names = [r["name"] for r in rows][::-1]
    vals = [min(r["sqnr_db"], 200.0) for r in rows][::-1]
    fig, ax = new_figure(7, 0.45 * len(rows) + 1.5)
    ax.barh(names, vals, color=["tab:red" if v < 20 else "tab:blue" for v in vals])
    ax.set_xlabel("SQNR (dB); red: below 20 dB")
    ax.set_title(title)
    return save_figure(fig, path)


def write_sqnr_report(out_dir: str | os.PathLike[str], rows: Sequence[dict[str, Any]]) -> None:
    """Write ``sqnr.md``, ``sqnr.csv`` and ``sqnr.png`` into ``out_dir`` (each atomically)."""
    out = Path(out_dir)
    atomic_write_text(out / "sqnr.md", sqnr_markdown(rows))
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=list(_COLS), lineterminator="\n")
    w.writeheader()
    for r in rows:
        w.writerow({k: r[k] for k in _COLS})
    atomic_write_text(out / "sqnr.csv", buf.getvalue())
    plot_layer_sqnr(out / "sqnr.png", rows)

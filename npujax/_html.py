"""HTML tables for Jupyter: the ``_repr_html_`` of schedules and reports.

Notebooks call ``_repr_html_`` on the value of a cell's last expression; the result objects of
npujax (:class:`npujax.plan.Schedule`, :class:`npujax.plan.MemoryReport`,
:class:`npujax.search.SearchReport`) return one of these tables, so ``schedule`` alone in a cell
shows the per-layer table. Cells are HTML-escaped.
"""

from __future__ import annotations

import html
from collections.abc import Iterable, Sequence

__all__ = ["html_table", "fmt"]


def fmt(v: object) -> str:
    """A cell as a reader wants it: thousands separators, 4 significant digits for fractions."""
    if isinstance(v, bool) or v is None:
        return "" if v is None else str(v)
    if isinstance(v, int):
        return f"{v:,}"
    if isinstance(v, float):
        if v.is_integer() and abs(v) < 1e15:
            return f"{int(v):,}"
        return f"{v:,.4g}" if abs(v) < 1e4 else f"{v:,.0f}"
    return str(v)


def html_table(caption: str, header: Sequence[str], rows: Iterable[Sequence[object]],
               numeric: Sequence[bool] | None = None) -> str:
    """An HTML ``<table>`` with a caption; ``numeric`` columns are right-aligned."""
    right = list(numeric) if numeric is not None else [False] * len(header)
    style = ['style="text-align:right"' if r else 'style="text-align:left"' for r in right]
    head = "".join(f"<th {s}>{html.escape(h)}</th>" for h, s in zip(header, style))
    body = "".join(
        "<tr>" + "".join(f"<td {s}>{html.escape(fmt(c))}</td>" for c, s in zip(row, style))
        + "</tr>" for row in rows)
    return (f"<table><caption style=\"text-align:left\">{html.escape(caption)}</caption>"
            f"<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>")

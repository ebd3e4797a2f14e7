"""Helpers shared by the ONNX importers of several op families (no ``onnx`` import needed).

An importer is ``fn(ctx, node, attrs)``: ``node`` is the ``onnx.NodeProto`` (only ``.input`` and
``.output`` are read), ``attrs`` its attributes as Python values, and ``ctx`` the importer state
of :mod:`npujax.frontends.onnx` (``const``, ``opt_const``, ``shape``, ``emit``, ``tmp``,
``new_const``, ``np_dtype``, ``opset``, ``node_name``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from npujax.errors import UnsupportedOpError

__all__ = ["conv_pads", "attr_axes", "simple_importer"]


def conv_pads(a: Mapping[str, Any], in_spatial: Sequence[int], k: Sequence[int],
              strides: Sequence[int], dil: Sequence[int]) -> list[list[int]]:
    """``[[begin, end], ...]`` per spatial axis from ONNX ``pads``/``auto_pad`` (Conv, pools)."""
    n = len(k)
    auto = a.get("auto_pad", "NOTSET")
    if auto in ("NOTSET", ""):
        p = list(a.get("pads", [0] * 2 * n))
        return [[int(p[i]), int(p[i + n])] for i in range(n)]
    if auto == "VALID":
        return [[0, 0] for _ in range(n)]
    if auto in ("SAME_UPPER", "SAME_LOWER"):
        out = []
        for size, kk, s, d in zip(in_spatial, k, strides, dil):
            o = -(-size // s)
            total = max(0, (o - 1) * s + (kk - 1) * d + 1 - size)
            small, big = total // 2, total - total // 2
            out.append([small, big] if auto == "SAME_UPPER" else [big, small])
        return out
    raise UnsupportedOpError(f"auto_pad={auto!r} is not an ONNX auto_pad mode.")


def attr_axes(ctx: Any, n: Any, a: Mapping[str, Any], idx: int) -> list[int] | None:
    """``axes`` from the attribute (older opsets) or the constant input ``idx`` (newer ones)."""
    if "axes" in a:
        return [int(v) for v in a["axes"]]
    v = ctx.opt_const(idx, "axes")
    return None if v is None else [int(x) for x in v.reshape(-1).tolist()]


def simple_importer(op: str, **defaults: Any) -> Callable[[Any, Any, Mapping[str, Any]], None]:
    """An importer that emits ``op`` with the node's inputs, outputs and the named attributes
    (their ONNX defaults given as keyword arguments)."""

    def importer(ctx: Any, n: Any, a: Mapping[str, Any]) -> None:
        attrs = {k: a.get(k, v) for k, v in defaults.items()}
        ctx.emit(op, list(n.input), list(n.output), attrs)

    return importer

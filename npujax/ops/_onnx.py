"""Helpers shared by the ONNX importers of several op families (no ``onnx`` import needed).

An importer is ``fn(ctx, node, attrs)``: ``node`` is the ``onnx.NodeProto`` (only ``.input`` and
``.output`` are read), ``attrs`` its attributes as Python values, and ``ctx`` the importer state
of :mod:`npujax.frontends.onnx` (``const``, ``opt_const``, ``shape``, ``emit``, ``tmp``,
``new_const``, ``np_dtype``, ``opset``, ``node_name``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from npujax.errors import GraphError, UnsupportedOpError

__all__ = ["conv_pads", "attr_axes", "simple_importer", "iter_onnx_tensors",
           "refuse_external_data", "reference_evaluator"]

_EXTERNAL = 1  # onnx.TensorProto.EXTERNAL


def iter_onnx_tensors(model: Any) -> Iterator[tuple[str, Any]]:
    """Every ``TensorProto`` of an ONNX ``ModelProto``, at any depth, with where it sits.

    Walks the main graph, the graphs of ``training_info`` and the nodes of local functions;
    in each graph its initializers, sparse initializers (values and indices) and every node
    attribute holding tensors (``t``, ``tensors``, ``sparse_tensor``, ``sparse_tensors``) or
    subgraphs (``g``, ``graphs``: the branches of ``If``, the bodies of ``Loop``/``Scan``,
    recursively). Iterative, so a deeply nested model cannot exhaust the Python stack.
    """
    graphs: list[tuple[str, Any]] = [("graph", model.graph)]
    for i, ti in enumerate(getattr(model, "training_info", ())):
        graphs += [(f"training_info[{i}].initialization", ti.initialization),
                   (f"training_info[{i}].algorithm", ti.algorithm)]
    node_lists: list[tuple[str, Any]] = [(f"function {f.name!r}", f.node)
                                         for f in getattr(model, "functions", ())]
    while graphs or node_lists:
        if graphs:
            where, g = graphs.pop()
            for t in g.initializer:
                yield f"{where} initializer {t.name!r}", t
            for s in g.sparse_initializer:
                yield f"{where} sparse initializer {s.values.name!r}", s.values
                yield f"{where} sparse initializer {s.values.name!r} (indices)", s.indices
            node_lists.append((where, g.node))
            continue
        where, nodes = node_lists.pop()
        for n in nodes:
            at = f"{where} node {n.name or n.op_type!r}"
            for a in n.attribute:
                if a.HasField("t"):
                    yield f"{at} attribute {a.name!r}", a.t
                for t in a.tensors:
                    yield f"{at} attribute {a.name!r}", t
                sparse = [a.sparse_tensor] if a.HasField("sparse_tensor") else []
                for s in [*sparse, *a.sparse_tensors]:
                    yield f"{at} attribute {a.name!r}", s.values
                    yield f"{at} attribute {a.name!r} (indices)", s.indices
                if a.HasField("g"):
                    graphs.append((f"{at} subgraph {a.name!r}", a.g))
                graphs.extend((f"{at} subgraph {a.name!r}[{k}]", g)
                              for k, g in enumerate(a.graphs))


def refuse_external_data(model: Any, what: str) -> None:
    """Raise if any tensor of ``model`` (at any depth) still points at an external file.

    ``onnx.reference`` resolves external data against the process's working directory; npujax
    reads external data itself, confined to the model's folder, before anything is evaluated,
    so a model that reaches an evaluator with an external tensor is refused.

    Raises:
      GraphError: an external-data tensor, naming where it sits.
    """
    for where, t in iter_onnx_tensors(model):
        if t.data_location == _EXTERNAL:
            loc = next((e.value for e in t.external_data if e.key == "location"), "")
            raise GraphError(
                f"{what}: {where} keeps its data in external file {loc!r}; npujax evaluates "
                "only models whose external data it has read from the model's own folder "
                "(load the model from its path with npujax.from_onnx).")


def reference_evaluator(model: Any, what: str) -> Any:
    """An ``onnx.reference.ReferenceEvaluator`` of ``model`` (a ``ModelProto`` or its bytes),
    after :func:`refuse_external_data`: the only way npujax builds one.

    Raises:
      GraphError: not an ONNX model, or a tensor with external data.
    """
    import onnx
    from onnx.reference import ReferenceEvaluator

    if isinstance(model, bytes):
        try:
            model = onnx.load_from_string(model)
        except Exception as e:
            raise GraphError(f"{what}: not a valid ONNX model ({type(e).__name__}).") from None
    refuse_external_data(model, what)
    return ReferenceEvaluator(model)


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

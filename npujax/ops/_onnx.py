"""Helpers shared by the ONNX importers of several op families (no ``onnx`` import needed).

An importer is ``fn(ctx, node, attrs)``: ``node`` is the ``onnx.NodeProto`` (only ``.input`` and
``.output`` are read), ``attrs`` its attributes as Python values, and ``ctx`` the importer state
of :mod:`npujax.frontends.onnx` (``const``, ``opt_const``, ``shape``, ``emit``, ``tmp``,
``new_const``, ``np_dtype``, ``opset``, ``node_name``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from npujax.errors import GraphError, UnsupportedOpError

__all__ = ["conv_pads", "attr_axes", "simple_importer", "iter_onnx_tensors",
           "refuse_external_data", "reference_evaluator"]

_EXTERNAL = 1  # onnx.TensorProto.EXTERNAL


_TENSOR = "onnx.TensorProto"
#: How a field reads in a tensor's location (others: the field's name, ``_`` as spaces).
_LABELS = {"g": "subgraph", "graphs": "subgraph", "t": "tensor", "tensors": "tensor",
           "attribute_proto": "default attribute", "functions": "function"}


def _repeated(field: Any) -> bool:
    rep = getattr(field, "is_repeated", None)  # protobuf >= 5 (upb); older: label
    return bool(rep) if rep is not None else field.label == field.LABEL_REPEATED


@functools.cache
def _tensor_fields(descriptor: Any) -> tuple[Any, ...]:
    """The message fields of ``descriptor`` through which a ``TensorProto`` can be reached (at
    any depth, through recursive types too), found from the protobuf descriptors."""
    reachable, todo = {descriptor.full_name: descriptor}, [descriptor]
    while todo:  # every message type below descriptor
        for f in todo.pop().fields:
            m = f.message_type
            if m is not None and m.full_name not in reachable:
                reachable[m.full_name] = m
                todo.append(m)
    holds = {_TENSOR}  # the types that hold a tensor at some depth: grown to a fixed point
    grew = True
    while grew:
        grew = False
        for name, d in reachable.items():
            if name not in holds and any(f.message_type is not None
                                         and f.message_type.full_name in holds
                                         for f in d.fields):
                holds.add(name)
                grew = True
    return tuple(f for f in descriptor.fields
                 if f.message_type is not None and f.message_type.full_name in holds)


def _step(where: str, field: str, index: int | None, child: Any) -> str:
    """``where`` extended by one field: its label and the child's name (or its index)."""
    label = _LABELS.get(field, field.replace("_", " "))
    name = ""
    if field != "graph" and "name" in child.DESCRIPTOR.fields_by_name:
        name = child.name or (child.op_type if field == "node" else "")
    part = f"{label} {name!r}" if name else label if index is None else f"{label}[{index}]"
    return f"{where} {part}" if where else part


def iter_onnx_tensors(model: Any) -> Iterator[tuple[str, Any]]:
    """Every ``TensorProto`` of an ONNX ``ModelProto``, at any depth, with where it sits.

    The walk follows the protobuf descriptors, not a list of fields: every field through which
    a tensor can be reached is visited (initializers, sparse initializers' values and indices,
    node attributes ``t``/``tensors``/``sparse_tensor(s)``, the subgraphs ``g``/``graphs`` of
    ``If``/``Loop``/``Scan`` recursively, functions' nodes and default attributes, training
    graphs), so a field a later ONNX adds is walked too. Iterative, so a deeply nested model
    cannot exhaust the Python stack.
    """
    stack: list[tuple[str, Any]] = [("", model)]
    while stack:
        where, msg = stack.pop()
        below = []
        for f in _tensor_fields(msg.DESCRIPTOR):
            if _repeated(f):
                items: list[tuple[int | None, Any]] = list(enumerate(getattr(msg, f.name)))
            elif msg.HasField(f.name):
                items = [(None, getattr(msg, f.name))]
            else:
                continue
            for i, child in items:
                at = _step(where, f.name, i, child)
                if child.DESCRIPTOR.full_name == _TENSOR:
                    yield at, child
                else:
                    below.append((at, child))
        stack.extend(reversed(below))  # depth first, in the file's order


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

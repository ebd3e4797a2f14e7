"""The Graph's structure as JSON: nodes, tensor types, inputs and outputs.

:func:`graph_to_doc` and :func:`graph_from_doc` turn a :class:`~npujax.ir.graph.Graph` (without
its constants, which are arrays) into a JSON-serialisable dict and back. The model file
(:func:`npujax.save_graph`) stores this document next to the params, constants and quantization
state.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from npujax.errors import GraphError
from npujax.ir.graph import Graph, Node, TensorType
from npujax.limits import check_elements

__all__ = ["graph_to_doc", "graph_from_doc", "check_doc"]


def graph_to_doc(graph: Graph) -> dict[str, Any]:
    """The graph's structure as a JSON-serialisable dict (constants are not included).

    Raises:
      GraphError: the graph has a node that cannot be serialised (a raw JAX primitive).
    """
    nodes = []
    for n in graph.nodes:
        if n.op == "JaxPrimitive":
            raise GraphError(
                f"node {n.name!r} is a raw JAX primitive ({n.attrs['primitive'].name}) and cannot "
                "be saved; only graphs made of npujax operators can be serialised."
            )
        nodes.append({"name": n.name, "op": n.op, "inputs": list(n.inputs),
                      "outputs": list(n.outputs), "attrs": dict(n.attrs),
                      "params": list(n.params)})
    return {
        "source": graph.source,
        "inputs": list(graph.inputs),
        "outputs": list(graph.outputs),
        "tensors": {
            k: {"shape": list(t.shape), "dtype": t.dtype} for k, t in graph.tensors.items()
        },
        "nodes": nodes,
    }


def _expect(value: Any, kind: type | tuple[type, ...], where: str) -> Any:
    if not isinstance(value, kind) or isinstance(value, bool) and kind is not bool:
        names = " or ".join(k.__name__ for k in (kind if isinstance(kind, tuple) else (kind,)))
        raise GraphError(f"malformed graph document: {where} must be a {names}, got "
                         f"{type(value).__name__}.")
    return value


def _names(value: Any, where: str) -> list[str]:
    for i, v in enumerate(_expect(value, list, where)):
        _expect(v, str, f"{where}[{i}]")
    return value


def check_doc(doc: Any) -> None:
    """Validate a graph document against its schema (every key present with its type, shapes of
    non-negative ints within :mod:`npujax.limits`, known dtypes, unique tensor names).

    Raises:
      GraphError: the first violation, naming the key.
      LimitError: a declared tensor over ``max_tensor_elements``.
    """
    _expect(doc, dict, "the document")
    for key in ("source", "inputs", "outputs", "tensors", "nodes"):
        if key not in doc:
            raise GraphError(f"malformed graph document: the key {key!r} is missing.")
    _expect(doc["source"], str, "'source'")
    _names(doc["inputs"], "'inputs'")
    _names(doc["outputs"], "'outputs'")
    for name, t in _expect(doc["tensors"], dict, "'tensors'").items():
        where = f"tensors[{name!r}]"
        _expect(t, dict, where)
        shape = _expect(t.get("shape"), list, f"{where}['shape']")
        for d in shape:
            _expect(d, int, f"{where}['shape'] entries")
        check_elements(shape, f"{where}")
        try:
            np.dtype(_expect(t.get("dtype"), str, f"{where}['dtype']"))
        except TypeError:
            raise GraphError(f"malformed graph document: {where} has an unknown dtype "
                             f"{t['dtype']!r}.") from None
    produced: set[str] = set()
    for i, n in enumerate(_expect(doc["nodes"], list, "'nodes'")):
        where = f"nodes[{i}]"
        _expect(n, dict, where)
        for key, kind in (("name", str), ("op", str), ("inputs", list), ("outputs", list),
                          ("attrs", dict), ("params", list)):
            if key not in n:
                raise GraphError(f"malformed graph document: {where} has no {key!r}.")
            _expect(n[key], kind, f"{where}[{key!r}]")
        for key in ("inputs", "outputs", "params"):
            _names(n[key], f"node {n['name']!r} {key}")
        for t in n["outputs"]:
            if t in produced or t in doc["inputs"]:
                raise GraphError(f"malformed graph document: tensor {t!r} is produced twice.")
            if t not in doc["tensors"]:
                raise GraphError(f"malformed graph document: node {n['name']!r} output {t!r} "
                                 "has no entry in 'tensors'.")
            produced.add(t)
    for t in doc["inputs"]:
        if t not in doc["tensors"]:
            raise GraphError(f"malformed graph document: input {t!r} has no entry in 'tensors'.")


def graph_from_doc(doc: Mapping[str, Any], constants: Mapping[str, np.ndarray]) -> Graph:
    """The :class:`Graph` of a :func:`graph_to_doc` dict, with its constant arrays.

    Raises:
      GraphError: a malformed document (:func:`check_doc`: a missing key, a wrong type, a node
        reading an unknown tensor).
      LimitError: a declared tensor over ``max_tensor_elements``.
    """
    check_doc(doc)
    try:
        nodes = tuple(
            Node(n["name"], n["op"], tuple(n["inputs"]), tuple(n["outputs"]), n["attrs"],
                 tuple(n["params"]))
            for n in doc["nodes"]
        )
        tensors = {k: TensorType(tuple(t["shape"]), t["dtype"])
                   for k, t in doc["tensors"].items()}
        return Graph(nodes, tuple(doc["inputs"]), tuple(doc["outputs"]), tensors,
                     dict(constants), doc["source"])
    except (KeyError, TypeError) as e:
        raise GraphError(f"malformed graph document: missing or wrong field {e}.") from None

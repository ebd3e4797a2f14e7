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

__all__ = ["graph_to_doc", "graph_from_doc"]


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


def graph_from_doc(doc: Mapping[str, Any], constants: Mapping[str, np.ndarray]) -> Graph:
    """The :class:`Graph` of a :func:`graph_to_doc` dict, with its constant arrays.

    Raises:
      GraphError: a malformed document (a missing key, a node reading an unknown tensor).
    """
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

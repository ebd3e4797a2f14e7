"""Save and load a Graph with its params (and optional quantization state) as one ``.npz`` file.

The file holds the graph structure as JSON (``__graph__``), params as ``param/<node>/<role>``,
constants as ``const/<name>`` and calibrated activation ranges as ``qstate/<node>/<key>``. It is
written atomically. Graphs containing raw JAX primitives (``JaxPrimitive`` nodes) cannot be saved.
"""

from __future__ import annotations

import io
import json
import os
import zipfile
from typing import Any

import jax
import numpy as np

from npujax._atomic import atomic_write_bytes
from npujax.errors import GraphError
from npujax.ir.graph import Graph, Node, Params, TensorType

__all__ = ["save_graph", "load_graph", "FORMAT_VERSION"]

FORMAT_VERSION = 1


def save_graph(
    path: str | os.PathLike[str],
    graph: Graph,
    params: Params,
    qstate: dict[str, dict[str, Any]] | None = None,
    meta: dict[str, Any] | None = None,
) -> None:
    """Write ``graph``, ``params`` (and ``qstate``, ``meta``) to ``path`` (an ``.npz`` file).

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
    doc = {
        "format_version": FORMAT_VERSION,
        "source": graph.source,
        "inputs": list(graph.inputs),
        "outputs": list(graph.outputs),
        "tensors": {
            k: {"shape": list(t.shape), "dtype": t.dtype} for k, t in graph.tensors.items()
        },
        "nodes": nodes,
        "meta": meta or {},
    }
    arrays: dict[str, np.ndarray] = {
        "__graph__": np.frombuffer(json.dumps(doc).encode("utf-8"), np.uint8)
    }
    for node, roles in params.items():
        for role, v in roles.items():
            arrays[f"param/{node}/{role}"] = np.asarray(jax.device_get(v))
    for name, v in graph.constants.items():
        arrays[f"const/{name}"] = np.asarray(v)
    for node, d in (qstate or {}).items():
        for key, v in d.items():
            arrays[f"qstate/{node}/{key}"] = np.asarray(jax.device_get(v))
    buf = io.BytesIO()
    np.savez_compressed(buf, **arrays)
    atomic_write_bytes(path, buf.getvalue())


def load_graph(path: str | os.PathLike[str]) -> tuple[Graph, Params, dict, dict]:
    """Read a file written by :func:`save_graph`.

    Returns:
      ``(graph, params, qstate, meta)``.

    Raises:
      GraphError: the file is missing, not an npujax graph file, or of an unknown version.
    """
    try:
        data = np.load(path, allow_pickle=False)
        doc = json.loads(bytes(data["__graph__"]).decode("utf-8"))
    except FileNotFoundError:
        raise GraphError(f"model file {str(path)!r} does not exist.") from None
    except (KeyError, ValueError, OSError, zipfile.BadZipFile, UnicodeDecodeError,
            AttributeError, TypeError):
        raise GraphError(
            f"{str(path)!r} is not an npujax graph file; pass a model.npz written by "
            "'npujax demo' or npujax.save_graph."
        ) from None
    if doc.get("format_version") != FORMAT_VERSION:
        raise GraphError(
            f"{str(path)!r} has graph format version {doc.get('format_version')}, this npujax "
            f"reads version {FORMAT_VERSION}."
        )
    params: Params = {}
    constants: dict[str, np.ndarray] = {}
    qstate: dict[str, dict[str, Any]] = {}
    for key in data.files:
        kind, _, rest = key.partition("/")
        if kind == "param":
            node, _, role = rest.rpartition("/")
            params.setdefault(node, {})[role] = jax.numpy.asarray(data[key])
        elif kind == "const":
            constants[rest] = data[key]
        elif kind == "qstate":
            node, _, k = rest.rpartition("/")
            qstate.setdefault(node, {})[k] = jax.numpy.asarray(data[key])
    nodes = tuple(
        Node(n["name"], n["op"], tuple(n["inputs"]), tuple(n["outputs"]), n["attrs"],
             tuple(n["params"]))
        for n in doc["nodes"]
    )
    tensors = {k: TensorType(tuple(t["shape"]), t["dtype"]) for k, t in doc["tensors"].items()}
    graph = Graph(nodes, tuple(doc["inputs"]), tuple(doc["outputs"]), tensors, constants,
                  doc["source"])
    return graph, params, qstate, doc.get("meta", {})

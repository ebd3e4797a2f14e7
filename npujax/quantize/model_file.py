"""The model file: a Graph with its params, constants and quantization state in one ``.npz``.

The file holds the graph structure as JSON (``__graph__``, see :mod:`npujax.ir.serialize`),
params as ``param/<node>/<role>``, constants as ``const/<name>`` and each quantized layer's state
as ``qstate/<node>/<field>`` with its quantizer's name in the JSON (``qstate_quantizers``), so
:func:`load_graph` returns the same typed states. It is written atomically. Files of format
version 1 (before typed states) are read too: a state's quantizer is then inferred from its
fields.
"""

from __future__ import annotations

import io
import json
import os
import zipfile
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np

from npujax._atomic import atomic_write_bytes
from npujax.errors import GraphError
from npujax.ir.graph import Graph, Params
from npujax.ir.serialize import graph_from_doc, graph_to_doc
from npujax.quantize.quantizers import QUANTIZERS, QState

__all__ = ["save_graph", "load_graph", "FORMAT_VERSION"]

FORMAT_VERSION = 2


def _quantizer_of(state: Any) -> str:
    for name, q in QUANTIZERS.items():
        if type(state) is q.state_type:
            return name
    raise GraphError(f"cannot save a quantization state of type {type(state).__name__}; "
                     "states come from npujax.calibrate or QAT.")


def save_graph(
    path: str | os.PathLike[str],
    graph: Graph,
    params: Params,
    qstate: QState | None = None,
    meta: Mapping[str, Any] | None = None,
) -> None:
    """Write ``graph``, ``params`` (and ``qstate``, JSON-serialisable ``meta``) to ``path``.

    Args:
      path: the ``.npz`` file (written atomically).
      graph: the model.
      params: its params.
      qstate: the layers' quantization states (from :func:`npujax.calibrate` or QAT).
      meta: free-form provenance (e.g. the searched precision policy).

    Raises:
      GraphError: the graph has a node that cannot be serialised (a raw JAX primitive), or a
        state that no registered quantizer owns.
    """
    doc = {"format_version": FORMAT_VERSION, **graph_to_doc(graph), "meta": dict(meta or {}),
           "qstate_quantizers": {n: _quantizer_of(s) for n, s in (qstate or {}).items()}}
    arrays: dict[str, np.ndarray] = {
        "__graph__": np.frombuffer(json.dumps(doc).encode("utf-8"), np.uint8)
    }
    for node, roles in params.items():
        for role, v in roles.items():
            arrays[f"param/{node}/{role}"] = np.asarray(jax.device_get(v))
    for name, c in graph.constants.items():
        arrays[f"const/{name}"] = np.asarray(c)
    for node, state in (qstate or {}).items():
        for field, v in state._asdict().items():
            if v is not None:
                arrays[f"qstate/{node}/{field}"] = np.asarray(jax.device_get(v))
    buf = io.BytesIO()
    # numpy types **kwds as also possibly ``allow_pickle``; these keys are prefixed, never that
    np.savez_compressed(buf, **arrays)  # type: ignore[arg-type]
    atomic_write_bytes(path, buf.getvalue())


def _infer_quantizer(fields: Mapping[str, Any]) -> str:
    """The quantizer of a version-1 state, from its keys."""
    if "act_scales" in fields:
        return "mixture"
    if "act_offset" in fields:
        return "lsq+"
    if "weight_step" in fields:
        return "lsq"
    return "ste"


def load_graph(path: str | os.PathLike[str]) -> tuple[Graph, Params, dict[str, Any], dict]:
    """Read a file written by :func:`save_graph`.

    Returns:
      ``(graph, params, qstate, meta)``; ``qstate`` holds typed states.

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
    version = doc.get("format_version") if isinstance(doc, dict) else None
    if version not in (1, FORMAT_VERSION):
        raise GraphError(
            f"{str(path)!r} has graph format version {version}, this npujax reads versions 1 "
            f"and {FORMAT_VERSION}."
        )
    params: Params = {}
    constants: dict[str, np.ndarray] = {}
    raw: dict[str, dict[str, Any]] = {}
    for key in data.files:
        kind, _, rest = key.partition("/")
        if kind == "param":
            node, _, role = rest.rpartition("/")
            params.setdefault(node, {})[role] = jax.numpy.asarray(data[key])
        elif kind == "const":
            constants[rest] = data[key]
        elif kind == "qstate":
            node, _, k = rest.rpartition("/")
            raw.setdefault(node, {})[k] = jax.numpy.asarray(data[key])
    names = doc.get("qstate_quantizers", {})
    for node in names:
        raw.setdefault(node, {})
    qstate = {}
    for node, fields in raw.items():
        name = names.get(node) or _infer_quantizer(fields)
        q = QUANTIZERS.get(name)
        if q is None:
            raise GraphError(f"{str(path)!r}: layer {node!r} was saved with quantizer {name!r}, "
                             f"which this npujax does not have ({sorted(QUANTIZERS)}).")
        qstate[node] = q.coerce(fields, node)
    return graph_from_doc(doc, constants), params, qstate, doc.get("meta", {})

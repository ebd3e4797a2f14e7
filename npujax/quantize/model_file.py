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
from npujax.errors import GraphError, NpujaxError
from npujax.ir.graph import Graph, Params
from npujax.ir.serialize import graph_from_doc, graph_to_doc
from npujax.ir.validate import check_graph
from npujax.limits import ByteBudget, check_bytes, check_elements
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


def _read_arrays(path: str | os.PathLike[str]) -> dict[str, np.ndarray]:
    """Every array of the ``.npz`` at ``path``, each checked against :mod:`npujax.limits` from
    its header before it is read, and every failure (missing, not a zip, damaged, pickled)
    named."""
    where = str(path)
    if not os.path.exists(path):
        raise GraphError(f"model file {where!r} does not exist.")
    if not os.path.isfile(path):
        raise GraphError(f"model file {where!r} is not a file (a folder?); pass the model.npz "
                         "written by 'npujax demo' or npujax.save_graph.")
    check_bytes(os.path.getsize(path), f"model file {where!r}", limit="max_model_bytes")
    budget = ByteBudget(f"the arrays of {where!r}")
    arrays: dict[str, np.ndarray] = {}
    try:
        with zipfile.ZipFile(path) as z:
            for info in z.infolist():
                if not info.filename.endswith(".npy"):
                    raise GraphError(f"{where!r} holds {info.filename!r}, which is not an array.")
                key = info.filename[:-4]
                with z.open(info) as f:
                    version = np.lib.format.read_magic(f)
                    shape, _, dtype = (np.lib.format.read_array_header_1_0(f) if version == (1, 0)
                                       else np.lib.format.read_array_header_2_0(f))
                if dtype.hasobject:
                    raise GraphError(f"{where!r}: array {key!r} holds Python objects; model "
                                     "files hold numbers only.")
                nbytes = check_elements(shape, f"array {key!r} of {where!r}") * dtype.itemsize
                budget.take(max(nbytes, info.file_size), f"array {key!r} of {where!r}")
                with z.open(info) as f:
                    arrays[key] = np.lib.format.read_array(f, allow_pickle=False)
    except NpujaxError:
        raise
    except Exception as e:  # any failure to parse these untrusted bytes: zip, CRC, zlib, the
        # .npy header (numpy parses it as a Python literal: SyntaxError, TokenError, ...)
        raise GraphError(
            f"{where!r} is not an npujax graph file, or a damaged one ({type(e).__name__}: {e}); "
            "pass a model.npz written by 'npujax demo' or npujax.save_graph (commands that "
            "take a model also read .onnx files, keras:NAME and zoo:NAME).") from None
    return arrays


def load_graph(path: str | os.PathLike[str]) -> tuple[Graph, Params, dict[str, Any], dict]:
    """Read a file written by :func:`save_graph`, validating all of it before it is trusted.

    Each array's size is checked against :mod:`npujax.limits` from its header before it is read;
    the graph document against its schema (:func:`npujax.ir.serialize.check_doc`); the
    constants, parameters (shape and dtype) and every node's declared types against what its
    operator computes (:func:`npujax.ir.validate.check_graph`); the quantization states against
    their quantizers.

    Returns:
      ``(graph, params, qstate, meta)``; ``qstate`` holds typed states.

    Raises:
      GraphError: the file is missing, a folder, not an npujax graph file, damaged, of an
        unknown version, or inconsistent (the message names the key, node or array).
      LimitError: an array or the file over :mod:`npujax.limits`.
    """
    arrays = _read_arrays(path)
    where = str(path)
    try:
        doc = json.loads(bytes(arrays["__graph__"]).decode("utf-8"))
    except (KeyError, ValueError, UnicodeDecodeError, TypeError):
        raise GraphError(
            f"{where!r} is not an npujax graph file; pass a model.npz written by "
            "'npujax demo' or npujax.save_graph (commands that take a model also read .onnx "
            "files, keras:NAME and zoo:NAME)."
        ) from None
    version = doc.get("format_version") if isinstance(doc, dict) else None
    if version not in (1, FORMAT_VERSION):
        raise GraphError(
            f"{where!r} has graph format version {version}, this npujax reads versions 1 "
            f"and {FORMAT_VERSION}."
        )
    for key in ("meta", "qstate_quantizers"):
        if not isinstance(doc.get(key, {}), dict):
            raise GraphError(f"{where!r}: {key!r} must be a JSON object.")
    params: Params = {}
    constants: dict[str, np.ndarray] = {}
    raw: dict[str, dict[str, Any]] = {}
    for key, value in arrays.items():
        kind, _, rest = key.partition("/")
        if kind == "param":
            node, _, role = rest.rpartition("/")
            params.setdefault(node, {})[role] = value
        elif kind == "const":
            constants[rest] = value
        elif kind == "qstate":
            node, _, k = rest.rpartition("/")
            raw.setdefault(node, {})[k] = value
        elif key != "__graph__":
            raise GraphError(f"{where!r} holds an unknown array {key!r}.")
    graph = graph_from_doc(doc, constants)
    check_graph(graph, params, where)
    names = doc.get("qstate_quantizers", {})
    for node in names:
        raw.setdefault(node, {})
    node_names = {n.name for n in graph.nodes}
    qstate = {}
    for node, fields in raw.items():
        if node not in node_names:
            raise GraphError(f"{where!r}: a quantization state for {node!r}, which is not a node.")
        for k, v in fields.items():
            if not np.issubdtype(v.dtype, np.number) or not np.all(np.isfinite(v)):
                raise GraphError(f"{where!r}: quantization state {node}/{k} is not finite "
                                 "numbers.")
        name = names.get(node) or _infer_quantizer(fields)
        q = QUANTIZERS.get(name) if isinstance(name, str) else None
        if q is None:
            raise GraphError(f"{where!r}: layer {node!r} was saved with quantizer {name!r}, "
                             f"which this npujax does not have ({sorted(QUANTIZERS)}).")
        try:
            # (device_put: jnp.asarray of a numpy array compiles a program per shape)
            qstate[node] = q.coerce({k: jax.device_put(v) for k, v in fields.items()}, node)
        except TypeError as e:
            raise GraphError(f"{where!r}: the quantization state of {node!r} is incomplete "
                             f"({e}).") from None
    return graph, {n: {r: jax.device_put(v) for r, v in ps.items()}
                   for n, ps in params.items()}, qstate, doc.get("meta", {})

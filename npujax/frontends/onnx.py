"""Import an ONNX model as an npujax :class:`~npujax.Graph` (the twin of ``trace_flax``).

The importer specialises the model to static input shapes: every ``Shape``/``Gather``/``Concat``
(...) subgraph that only depends on shapes and constants is folded into a constant, every pad,
output size and slice bound is resolved, and each tensor gets a static :class:`TensorType`.
Weights of Conv, ConvTranspose, Gemm (MatMul by a constant) and BatchNormalization become the
params pytree ``{node: {role: array}}`` (roles ``kernel``, ``bias``, ``scale``, ``mean``,
``var``), so QAT, calibration and precision search work unchanged; any other constant lands in
``Graph.constants``.

Source of the semantics: the ONNX operator specification, https://onnx.ai/onnx/operators/.
"""

from __future__ import annotations

import base64
import logging
import math
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import onnx
from onnx import helper, numpy_helper

from npujax import _program_cache
from npujax.errors import ConfigError, GraphError, NpujaxError, UnsupportedOpError
from npujax.ir.absent import AbsentArray, is_absent
from npujax.ir.graph import SHAPES_ONLY_SOURCE, Graph, Node, Params, TensorType, fresh_name
from npujax.ir.patterns import fuse_transformer_patterns
from npujax.limits import ByteBudget, check_bytes, check_elements
from npujax.ops import ONNX_DOMAIN_IMPORTERS, ONNX_IMPORTERS, ONNX_WEIGHT_OPS, get_op, run_op
from npujax.ops._onnx import iter_onnx_tensors, reference_evaluator, refuse_external_data
from npujax.ops.qdq import check_blocks, expand_blocks
from npujax.ops.registry import NARROW_FLOATS

__all__ = ["from_onnx", "SUPPORTED_ONNX_OPS", "load_onnx_model", "parse_input_shapes",
           "batch_input_shapes", "SHAPES_ONLY_SOURCE"]

log = logging.getLogger(__name__)


_URL = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*://")


def load_onnx_model(path_or_model: str | os.PathLike[str] | bytes | onnx.ModelProto,
                    *, missing_data: str = "error",
                    placeholders: list[str] | None = None) -> onnx.ModelProto:
    """Read an ONNX model (a local path, serialized bytes or a ``ModelProto``), with its weights.

    External-data tensors, wherever they sit (initializers, node attributes, sparse tensors,
    the subgraphs of ``If``/``Loop``/``Scan`` at any depth, functions and their default
    attributes: every field ``npujax.ops._onnx.iter_onnx_tensors`` walks), are read only
    from files inside the model's folder: a location that is absolute or escapes the folder
    (``../``, symlinks) is refused, URLs are never fetched, and a model given in memory may not
    have any.
    Each length is checked against the tensor's declared size, the file's size and
    :mod:`npujax.limits` before it is read.

    ``missing_data="absent"`` (for shape-only uses such as the latency model) keeps a
    floating-point or <= 8-bit integer tensor whose external file is *absent* from the model's
    folder by its declared dims and type only, without data (nothing is allocated; the importer
    makes it an :class:`~npujax.ir.absent.AbsentArray`), and appends its location to
    ``placeholders``; every other check still applies, and a missing int16/32/64 tensor is still
    an error (its values may be shapes or indices).

    Raises:
      GraphError: the path is a URL or does not exist, the file is not a valid ONNX protobuf, or an
        external-data location is missing, outside the model's folder or of the wrong length.
      LimitError: a tensor or the model's tensors together exceed :mod:`npujax.limits`.
    """
    if isinstance(path_or_model, onnx.ModelProto):
        model, base = path_or_model, None  # (external data would be refused: nothing changes)
    elif isinstance(path_or_model, bytes):
        model, base = _parse(path_or_model, "<bytes>"), None
    else:
        text = os.fspath(path_or_model)
        if _URL.match(text):
            raise GraphError(
                f"{text!r} is a URL; npujax only reads local ONNX files. Download the model "
                "yourself and pass its path."
            )
        path = Path(text)
        if not path.is_file():
            if text.startswith("zoo:") and not path.exists():
                raise GraphError(
                    f"{text!r} names a model of the zoo, which the command line resolves; in "
                    f"Python pass its file: str(npujax.models.zoo.fetch_model({text[4:]!r})).")
            raise GraphError(f"ONNX model {text!r} does not exist or is not a file.")
        check_bytes(path.stat().st_size, f"ONNX file {text!r}", limit="max_model_bytes")
        model, base = _parse(path.read_bytes(), text), path.resolve().parent
    if missing_data not in ("error", "absent"):
        raise GraphError(f"missing_data={missing_data!r}; use 'error' or 'absent'.")
    _load_external_data(model, base, placeholders if missing_data == "absent" else None)
    refuse_external_data(model, "ONNX model")  # the invariant every evaluation relies on
    return model


def _parse(data: bytes, where: str) -> onnx.ModelProto:
    try:
        model = onnx.load_from_string(data)
    except Exception as e:  # protobuf raises DecodeError (and friends) on garbage
        raise GraphError(
            f"{where} is not a valid ONNX model ({type(e).__name__}: {e}); expected a serialized "
            "onnx.ModelProto as written by onnx.save."
        ) from None
    if not model.HasField("graph") or not model.graph.node:
        raise GraphError(f"{where} is not a valid ONNX model: it has no graph or no nodes.")
    return model


def _tensor_nbytes(t: onnx.TensorProto, where: str) -> int | None:
    """Bytes of a tensor's data from its declared dims and type (None for strings)."""
    if t.data_type in (onnx.TensorProto.STRING, onnx.TensorProto.UNDEFINED):
        return None
    try:
        dtype = np.dtype(helper.tensor_dtype_to_np_dtype(t.data_type))
    except Exception:
        raise GraphError(f"{where} has an unknown data type {t.data_type}.") from None
    n = check_elements(list(t.dims), where)
    bits = 4 if t.data_type in (onnx.TensorProto.INT4, onnx.TensorProto.UINT4) else None
    return (n * bits + 7) // 8 if bits else n * dtype.itemsize


#: The ``doc_string`` of a tensor whose external data is absent (``missing_data="absent"``):
#: it has dims and a type but no data, and imports as an :class:`~npujax.ir.absent.AbsentArray`.
_ABSENT = "npujax: external data absent, shape only"

_PLACEHOLDER_TYPES = {onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16,
                      onnx.TensorProto.DOUBLE, onnx.TensorProto.INT8, onnx.TensorProto.UINT8,
                      onnx.TensorProto.INT4, onnx.TensorProto.UINT4}


def _load_external_data(model: onnx.ModelProto, base: Path | None,
                        placeholders: list[str] | None = None) -> None:
    """Read every external-data tensor of ``model`` (at any depth: subgraphs of ``If``/``Loop``/
    ``Scan``, attribute tensors, sparse tensors, functions) from inside ``base``, checking its
    length against the tensor's declared size, the file's size and the limits before reading;
    afterwards no tensor of the model refers to a file."""
    budget = ByteBudget("the model's tensors")
    for where, t in iter_onnx_tensors(model):
        nbytes = _tensor_nbytes(t, where)
        if t.data_location != onnx.TensorProto.EXTERNAL:
            if nbytes is not None:  # already in memory (parsed): counted, not re-checked
                budget.used += nbytes
            continue
        info = {e.key: e.value for e in t.external_data}
        loc = info.get("location", "")
        if base is None:
            raise GraphError(
                f"{where} keeps its data in external file {loc!r}, but the model was passed in "
                "memory; pass the model's path so its folder can be read.")
        if not loc or _URL.match(loc) or os.path.isabs(loc) or "\0" in loc:
            raise GraphError(
                f"{where} points at external data {loc!r}; only relative paths inside the "
                f"model's folder {str(base)!r} are read.")
        target = (base / loc).resolve()
        if not target.is_relative_to(base):
            raise GraphError(
                f"{where} points at external data {loc!r}, which resolves outside the model's "
                f"folder {str(base)!r}; refusing to read it.")
        if not target.exists() and placeholders is not None and nbytes is not None \
                and t.data_type in _PLACEHOLDER_TYPES:
            # known by its shape and type only: nothing is read or allocated (npujax.ir.absent)
            t.data_location = onnx.TensorProto.DEFAULT
            del t.external_data[:]
            t.doc_string = _ABSENT
            placeholders.append(f"{where} ({loc})")
            continue
        if not target.is_file():
            raise GraphError(f"external data file {loc!r} of {where} does not exist or is not "
                             "a regular file; place it next to the model (only latency needs no "
                             "weights: `npujax lower` imports such a model for its shapes).")
        if nbytes is None:
            raise GraphError(f"{where}: external data of string tensors is not supported.")
        try:
            offset = int(info.get("offset", 0))
            length = int(info["length"]) if "length" in info else None
        except ValueError:
            raise GraphError(f"{where}: external-data offset/length {info.get('offset')!r}/"
                             f"{info.get('length')!r} are not whole numbers.") from None
        size = target.stat().st_size
        if length is None:
            length = size - offset
        if offset < 0 or length < 0 or offset + length > size:
            raise GraphError(
                f"{where}: external data {loc!r} at offset {offset} with length {length} does "
                f"not lie inside the file ({size} bytes).")
        if length != nbytes:
            raise GraphError(
                f"{where}: external data {loc!r} holds {length} bytes, but the tensor's dims "
                f"{list(t.dims)} need {nbytes}.")
        budget.take(nbytes, f"{where} (external data {loc!r})")
        with open(target, "rb") as f:
            f.seek(offset)
            data = f.read(length)
        if len(data) != length:
            raise GraphError(f"{where}: external data {loc!r} was shorter than announced.")
        t.raw_data = data
        t.data_location = onnx.TensorProto.DEFAULT
        del t.external_data[:]


def _to_array(t: onnx.TensorProto, where: str) -> np.ndarray:
    """``numpy_helper.to_array`` with the declared size checked first and errors named; a
    tensor whose external data is absent is an :class:`~npujax.ir.absent.AbsentArray`; never
    of a tensor that still points at a file (``numpy_helper`` would read it relative to the
    working directory: :func:`load_onnx_model` reads external data, from the model's folder)."""
    if t.doc_string == _ABSENT and not t.raw_data:
        _tensor_nbytes(t, where)  # (max_tensor_elements: declared, never materialized)
        return AbsentArray(tuple(t.dims), helper.tensor_dtype_to_np_dtype(t.data_type),
                           f"{where}")  # type: ignore[return-value]
    if t.data_location == onnx.TensorProto.EXTERNAL:
        raise GraphError(f"{where} keeps its data in an external file npujax has not read from "
                         "the model's folder; load the model from its path (npujax.from_onnx).")
    nbytes = _tensor_nbytes(t, where)
    if nbytes is not None:
        check_bytes(nbytes, where)
    try:
        return numpy_helper.to_array(t)
    except Exception as e:
        raise GraphError(f"{where} cannot be read: {type(e).__name__}: {e}") from None


def parse_input_shapes(specs: Sequence[str]) -> dict[str, tuple[int, ...]]:
    """Parse command-line shapes ``["NAME=1,3,224,224", ...]`` into ``{name: shape}``.

    Raises:
      ConfigError: a spec without ``=``, an empty name, a non-integer or non-positive dimension,
        or the same name twice.
    """
    shapes: dict[str, tuple[int, ...]] = {}
    for spec in specs:
        name, sep, dims = spec.partition("=")
        name = name.strip()
        try:
            shape = tuple(int(d) for d in dims.split(",")) if sep and dims.strip() else None
        except ValueError:
            shape = None
        if not name or shape is None or any(d <= 0 for d in shape):
            raise ConfigError(
                f"input shape {spec!r} is not NAME=D1,D2,...; e.g. --input-shape x=1,3,224,224 "
                "(positive integers, the input's name as in the ONNX model).")
        if name in shapes:
            raise ConfigError(f"input shape for {name!r} is given twice.")
        shapes[name] = shape
    return shapes


def _freeze(v: Any) -> Any:
    """A hashable, exact stand-in for an attribute value (TypeError for an unknown kind)."""
    if isinstance(v, np.ndarray):
        return ("ndarray", v.dtype.str, v.shape, v.tobytes())
    if isinstance(v, (list, tuple)):
        return (type(v).__name__, tuple(_freeze(x) for x in v))
    if isinstance(v, dict):
        return ("dict", tuple(sorted((str(k), _freeze(x)) for k, x in v.items())))
    if v is None or isinstance(v, (bool, int, float, str, bytes, np.generic)):
        return (type(v).__name__, v)
    raise TypeError(f"no signature for {type(v).__name__}")


def _signature(node: Node, specs: Sequence[jax.ShapeDtypeStruct],
               params: Mapping[str, Any]) -> Any:
    """What a node's output shapes depend on: its op, attributes, which inputs are given, and
    the shapes and dtypes of its inputs and parameters (never their values: shape inference
    sees them abstractly), and JAX's 64-bit mode. None when an attribute cannot be keyed."""
    try:
        attrs = _freeze(dict(node.attrs))
    except TypeError:
        return None
    return (node.op, attrs, tuple(bool(t) for t in node.inputs), len(node.outputs),
            tuple((tuple(s.shape), str(s.dtype)) for s in specs),
            tuple((k, tuple(v.shape), str(v.dtype)) for k, v in params.items()),
            bool(jax.config.read("jax_enable_x64")))


# ---------------------------------------------------------------------------------------------
# The importer state


def _onnx_output_types(node: Node, specs: Sequence[jax.ShapeDtypeStruct], outs: Any) -> Any:
    """The outputs' types as ONNX types them: an operator whose floating inputs are one 16-bit
    type (``float16``, ``bfloat16``) gives that type where npujax computed float32
    (:func:`npujax.ops.run_op` widens them; ONNX's type constraints tie a floating output to its
    floating inputs), except ``Cast``, whose ``to`` decides."""
    narrow = {str(s.dtype) for s in specs if jnp.issubdtype(s.dtype, jnp.floating)}
    if node.op == "Cast" or len(narrow) != 1 or not narrow <= NARROW_FLOATS:
        return outs
    (dtype,) = narrow
    return [jax.ShapeDtypeStruct(o.shape, np.dtype(dtype)) if o.dtype == np.float32 else o
            for o in outs]


class _Ctx:
    def __init__(self, model: onnx.ModelProto, unsupported: str):
        self.model = model
        self.opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")),
                          1)
        self.unsupported = unsupported
        # (numpy arrays, or AbsentArray for weights known by their shapes only)
        self.consts: dict[str, Any] = {}
        self.types: dict[str, TensorType] = {}
        self.nodes: list[Node] = []
        self.params: Params = {}
        self.names: set[str] = set()
        self.budget = ByteBudget("the model's constant-folded values")
        self.graph_inputs: set[str] = set()
        self.onnx_node = onnx.NodeProto()  # the node being converted (set per node)
        self.node_name = ""
        # output shapes by node signature: most nodes repeat one (the same activation or
        # elementwise op on the same shapes), and tracing each costs more than the import
        self.shape_cache: dict[Any, Any] = {}

    # -- helpers used by the converters
    def const(self, name: str, what: str) -> np.ndarray:
        if name not in self.consts:
            raise UnsupportedOpError(
                f"node {self.node_name!r} ({self.onnx_node.op_type}): its {what} {name!r} must be "
                "a constant (initializer, Constant node or foldable shape computation), but it is "
                "computed at run time."
            )
        return self.consts[name]

    def opt_const(self, idx: int, what: str) -> np.ndarray | None:
        ins = self.onnx_node.input
        if idx >= len(ins) or not ins[idx]:
            return None
        return self.const(ins[idx], what)

    def shape(self, name: str) -> tuple[int, ...]:
        if name in self.consts:
            return tuple(self.consts[name].shape)
        return self.types[name].shape

    def unique(self, base: str) -> str:
        """A new unique node or tensor name starting with ``base``."""
        return fresh_name(base, self.names)

    def emit(self, op: str, inputs: Sequence[str], outputs: Sequence[str],
             attrs: Mapping[str, Any] | None = None, params: Mapping[str, np.ndarray] | None = None,
             name: str | None = None) -> Node:
        name = self.unique(name or self.node_name)
        p = {k: v.astype(np.float32) if is_absent(v) else jnp.asarray(v, jnp.float32)
             for k, v in (params or {}).items()}
        node = Node(name, op, tuple(inputs), tuple(outputs), dict(attrs or {}), tuple(p))
        if p:
            self.params[name] = p
        specs = [self._spec(t) for t in node.inputs]
        self._check_integers(op, node.inputs, specs)
        to = np.dtype(node.attrs["to"]) if op == "Cast" and "to" in node.attrs else None
        if (to is not None and to.kind in "iu" and to.itemsize == 8
                and not jax.config.read("jax_enable_x64")):
            raise UnsupportedOpError(
                f"node {self.node_name!r} (Cast) makes a {to} tensor at run time; JAX narrows it "
                "to 32 bits unless 64-bit types are on (jax.config.update('jax_enable_x64', "
                "True)).")
        try:
            key = _signature(node, specs, p)
            outs = self.shape_cache.get(key) if key is not None else None
            if outs is None and key is not None:  # traced by an earlier process
                kept = _program_cache.kept_shapes(key)
                if kept is not None and len(kept) == len(node.outputs):
                    outs = [jax.ShapeDtypeStruct(shape, np.dtype(d)) for shape, d in kept]
                    self.shape_cache[key] = outs
            if outs is None:
                get_op(op, name)
                outs = _onnx_output_types(node, specs, jax.eval_shape(
                    lambda xs, pp: run_op(node, xs, pp), specs,
                    {k: jax.ShapeDtypeStruct(v.shape, v.dtype) for k, v in p.items()}))
                if key is not None:
                    self.shape_cache[key] = outs
                    _program_cache.keep_shapes(key, [(o.shape, str(o.dtype)) for o in outs])
        except UnsupportedOpError:
            raise
        except Exception as e:
            raise GraphError(
                f"node {self.node_name!r} ({self.onnx_node.op_type}) cannot be built with input "
                f"shapes {[tuple(s.shape) for s in specs]}: {type(e).__name__}: {e}"
            ) from None
        for t, o in zip(node.outputs, outs):
            check_elements(o.shape, f"node {self.node_name!r} ({self.onnx_node.op_type}) "
                                    f"output {t!r}")
            self.types[t] = TensorType(tuple(int(d) for d in o.shape), str(o.dtype))
        self.nodes.append(node)
        return node

    def _check_integers(self, op: str, inputs: Sequence[str],
                        specs: Sequence[jax.ShapeDtypeStruct]) -> None:
        """Refuse an op without exact integer semantics on an integer tensor computed at run
        time, and 64-bit integers JAX would silently narrow (x64 disabled)."""
        opdef = get_op(op, self.node_name)
        for i, (t, sp) in enumerate(zip(inputs, specs)):
            if t in self.consts or not (jnp.issubdtype(sp.dtype, jnp.integer)
                                        or sp.dtype == np.bool_):
                continue
            where = f"node {self.node_name!r} ({self.onnx_node.op_type})"
            if not opdef.integers:
                raise UnsupportedOpError(
                    f"{where} reads the integer tensor {t!r} ({sp.dtype}); npujax's {op} is not "
                    "exact on integers (ONNX keeps integer semantics), so it is refused rather "
                    "than approximated in float.")
            if (np.dtype(sp.dtype).itemsize == 8 and i not in opdef.index_inputs
                    and t not in self.graph_inputs and not jax.config.read("jax_enable_x64")):
                # (a graph input's values are checked to fit 32 bits when it is fed: as_inputs)
                raise UnsupportedOpError(
                    f"{where} reads the 64-bit tensor {t!r} ({sp.dtype}) at run time; JAX "
                    "narrows it to 32 bits unless 64-bit types are on (jax.config.update("
                    "'jax_enable_x64', True)).")

    def _spec(self, t: str) -> jax.ShapeDtypeStruct:
        if t in self.consts:
            c = self.consts[t]
            return jax.ShapeDtypeStruct(c.shape, c.dtype)
        tt = self.types[t]
        return jax.ShapeDtypeStruct(tt.shape, np.dtype(tt.dtype))

    def tmp(self, base: str) -> str:
        """A new unique tensor name for an intermediate result."""
        return self.unique(f"{base}:tmp")

    def new_const(self, value: np.ndarray, what: str) -> str:
        """Add a constant tensor made by an importer; returns its (unique) name."""
        name = self.unique(f"{self.node_name}:{what}")
        self.consts[name] = value
        return name

    @staticmethod
    def np_dtype(elem_type: int) -> np.dtype:
        """The numpy dtype of an ONNX ``TensorProto`` element type code."""
        return np.dtype(helper.tensor_dtype_to_np_dtype(elem_type))


def _attrs(node: onnx.NodeProto) -> dict[str, Any]:
    out = {}
    for a in node.attribute:
        v = helper.get_attribute_value(a)
        if isinstance(v, bytes):
            v = v.decode()
        out[a.name] = v
    return out


#: ONNX operators (default domain) that import as npujax nodes (one importer each in
#: :mod:`npujax.ops`); ``Constant`` and shape computations on constants are folded at import.
SUPPORTED_ONNX_OPS = frozenset(ONNX_IMPORTERS) | {"Constant"}


# ---------------------------------------------------------------------------------------------


def _constant_value(n: onnx.NodeProto) -> np.ndarray:
    a = n.attribute[0] if n.attribute else None
    if a is None:
        raise GraphError(f"Constant node {n.name!r} has no value attribute.")
    if a.name == "value":
        return _to_array(a.t, f"Constant node {n.name!r}")
    v = helper.get_attribute_value(a)
    if a.name == "value_float":
        return np.asarray(v, np.float32)
    if a.name == "value_floats":
        return np.asarray(v, np.float32)
    if a.name in ("value_int", "value_ints"):
        return np.asarray(v, np.int64)
    raise UnsupportedOpError(f"Constant node {n.name!r} with attribute {a.name!r} is not "
                             "supported.")


def _fold_dequantize(ctx: _Ctx, n: onnx.NodeProto) -> None:
    """Fold DequantizeLinear of a constant (a QDQ model's weights) into float32 values: per
    tensor, per axis, or per block (opset 21 ``block_size``, the last block partial when it
    does not divide the axis)."""
    a = _attrs(n)
    x = ctx.consts[n.input[0]]
    scale = ctx.consts[n.input[1]].astype(np.float32)
    zp = ctx.consts[n.input[2]] if len(n.input) > 2 and n.input[2] else np.zeros((), x.dtype)
    block = int(a.get("block_size", 0))
    if block:
        axis = int(a.get("axis", 1)) % max(x.ndim, 1)
        what = f"node {ctx.node_name!r} (DequantizeLinear)"
        check_blocks(x.shape, scale.shape, axis, block, f"{what}: its x_scale")
        scale = expand_blocks(scale, x.shape[axis], axis, block)
        if zp.ndim:
            check_blocks(x.shape, zp.shape, axis, block, f"{what}: its x_zero_point")
            zp = expand_blocks(zp, x.shape[axis], axis, block)
    elif scale.ndim == 1 and x.ndim > 1:
        shape = [1] * x.ndim
        shape[int(a.get("axis", 1)) % x.ndim] = -1
        scale, zp = scale.reshape(shape), zp.reshape(shape)
    ctx.consts[n.output[0]] = ((x.astype(np.float64) - zp.astype(np.float64)) * scale
                               ).astype(np.float32)


#: Most loop iterations a constant-folded ``Loop`` may run (its trip count must be a constant).
MAX_FOLD_LOOP_ITERATIONS = 2**16
_SHAPE_CONST_ELEMS = 4096  # integer constants up to this size join shape inference as values


def _range_bytes(ctx: _Ctx, n: onnx.NodeProto) -> list[int | None]:
    """The bytes of a folded ``Range``: ``max(ceil((limit - start) / delta), 0)`` elements,
    computed from its values (exact Python integers for integer inputs, float64 for floats, as
    ``numpy.arange`` and onnxruntime size it), whatever ONNX shape inference can tell."""
    what = f"node {ctx.node_name!r} (Range)"
    vals = [ctx.consts[t] for t in n.input[:3]]
    if len(vals) != 3 or any(v.size != 1 for v in vals):
        raise GraphError(f"{what}: start, limit and delta must be scalars, got shapes "
                         f"{[list(v.shape) for v in vals]}.")
    dtype = vals[0].dtype
    count: int | None
    if dtype.kind in "iu":
        start, limit, delta = (int(v.reshape(())) for v in vals)
        count = -((limit - start) // -delta) if delta else None
    else:
        fstart, flimit, fdelta = (float(v.reshape(())) for v in vals)
        finite = all(np.isfinite(v) for v in (fstart, flimit, fdelta))
        count = math.ceil((flimit - fstart) / fdelta) if fdelta and finite else None
    if count is None:
        raise GraphError(f"{what} has start {vals[0].item()}, limit {vals[1].item()}, delta "
                         f"{vals[2].item()}; ONNX Range needs a non-zero, finite delta and "
                         "finite bounds.")
    elems = check_elements([max(count, 0)], f"{what} output {n.output[0]!r}")
    return [elems * dtype.itemsize]


#: Operators whose folded output size npujax computes from their input values itself (ONNX
#: shape inference cannot always: a float ``Range``, or ``limit - start`` overflowing int64).
_VALUE_SIZED = {"Range": _range_bytes}


def _fold_absent(ctx: _Ctx, n: onnx.NodeProto, ins: list[str], what: str) -> None:
    """A node on constants of which some have no values (:class:`~npujax.ir.absent.
    AbsentArray`): its outputs are absent too, of the shapes and types ONNX shape inference
    gives (a ``Shape`` or ``Size`` of one is known from its dims)."""
    c = ctx.consts[ins[0]]
    if n.op_type in ("Shape", "Size"):
        shape = np.asarray(c.shape, np.int64)
        a = _attrs(n)
        ctx.consts[n.output[0]] = (np.asarray(shape.prod(), np.int64) if n.op_type == "Size"
                                   else shape[a.get("start", 0):a.get("end", None)])
        return
    for o, t in zip([o for o in n.output if o], _fold_output_types(ctx, n, ins)):
        if t is None:
            raise GraphError(f"{what} computes {o!r} from a weight imported for its shape only, "
                             "and its output's shape is not known without the values; place "
                             "the model's external-data files next to it.")
        ctx.consts[o] = AbsentArray(t[0], t[1], f"the output {o!r} of {what}")


def _fold_output_types(ctx: _Ctx, n: onnx.NodeProto, ins: list[str]
                       ) -> list[tuple[list[int], np.dtype] | None]:
    """``(dims, dtype)`` of each output of a node on constants by ONNX shape inference, with
    its small inputs as values (integers decide shapes, floats such as a Resize's scales too;
    absent ones only by their types); None where it gives no static shape."""
    vis, inits = [], []
    for i in ins:
        c = ctx.consts[i]
        if not is_absent(c) and c.dtype.kind in "iubf" and c.size <= _SHAPE_CONST_ELEMS:
            inits.append(numpy_helper.from_array(c, i))
        vis.append(helper.make_tensor_value_info(
            i, helper.np_dtype_to_tensor_dtype(c.dtype), c.shape))
    outs = [o for o in n.output if o]
    g = helper.make_graph([n], "bound", vis,
                          [helper.make_tensor_value_info(o, onnx.TensorProto.UNDEFINED, None)
                           for o in outs], inits)
    m = helper.make_model(g, opset_imports=list(ctx.model.opset_import))
    try:
        inferred = onnx.shape_inference.infer_shapes(m, data_prop=True)
    except Exception as e:
        raise GraphError(f"node {ctx.node_name!r} ({n.op_type}) has only constant inputs but "
                         f"ONNX shape inference rejects it: {type(e).__name__}: {e}") from None
    types = {v.name: v.type.tensor_type for v in [*inferred.graph.output,
                                                  *inferred.graph.value_info]}
    out: list[tuple[list[int], np.dtype] | None] = []
    for o in outs:
        tt = types.get(o)
        if (tt is None or not tt.HasField("shape") or tt.elem_type == 0
                or not all(d.HasField("dim_value") for d in tt.shape.dim)):
            out.append(None)
            continue
        dims = [d.dim_value for d in tt.shape.dim]
        check_elements(dims, f"node {ctx.node_name!r} ({n.op_type}) output {o!r}")
        dtype = (np.dtype(object) if tt.elem_type == onnx.TensorProto.STRING
                 else np.dtype(helper.tensor_dtype_to_np_dtype(tt.elem_type)))
        out.append((dims, dtype))
    return out


def _fold_output_bytes(ctx: _Ctx, n: onnx.NodeProto, ins: list[str]) -> list[int | None]:
    """The bytes of each output of a node about to be folded, from the values it is folded
    from: npujax's own count (:data:`_VALUE_SIZED`), else ONNX shape inference with its small
    inputs as values (integers decide shapes, floats such as a Resize's scales too); None where
    it cannot tell."""
    if n.op_type in _VALUE_SIZED:
        return _VALUE_SIZED[n.op_type](ctx, n)
    return [None if t is None else math.prod(t[0]) * (1 if t[1] == np.dtype(object)
                                                      else t[1].itemsize)
            for t in _fold_output_types(ctx, n, ins)]


def _fold(ctx: _Ctx, n: onnx.NodeProto) -> None:
    """Evaluate a node whose inputs are all constants with onnx's reference implementation.

    The size of every output is known before anything is evaluated (from the values it is
    folded from: :func:`_fold_output_bytes`) and checked against :mod:`npujax.limits`; a node
    whose output size cannot be bounded, or a ``Loop`` of more than
    :data:`MAX_FOLD_LOOP_ITERATIONS`, is refused.
    """
    if n.op_type == "DequantizeLinear":
        _fold_dequantize(ctx, n)
        return

    ins = [i for i in n.input if i]
    what = f"node {ctx.node_name!r} ({n.op_type})"
    if any(is_absent(ctx.consts[i]) for i in ins):
        _fold_absent(ctx, n, ins, what)
        return
    if n.op_type == "Loop":
        trip = ctx.consts[n.input[0]] if n.input and n.input[0] else None
        if trip is None or trip.size != 1 or int(trip.reshape(-1)[0]) > MAX_FOLD_LOOP_ITERATIONS:
            raise GraphError(
                f"{what} is a Loop on constants whose trip count "
                f"{'is not given' if trip is None else int(trip.reshape(-1)[0])} exceeds the "
                f"{MAX_FOLD_LOOP_ITERATIONS} iterations npujax folds at import.")
    for o, nbytes in zip([o for o in n.output if o], _fold_output_bytes(ctx, n, ins)):
        if nbytes is None:
            raise GraphError(
                f"{what} has only constant inputs, but the size of its output {o!r} cannot be "
                "known before evaluating it (ONNX shape inference gives no static shape); "
                "npujax folds only values it can bound (see docs/errors.md, limits).")
        ctx.budget.take(nbytes, f"the constant-folded output {o!r} of {what}")
    inputs = [helper.make_tensor_value_info(i, helper.np_dtype_to_tensor_dtype(
        ctx.consts[i].dtype), ctx.consts[i].shape) for i in ins]
    outputs = [helper.make_tensor_value_info(o, onnx.TensorProto.UNDEFINED, None)
               for o in n.output if o]
    g = helper.make_graph([n], "fold", inputs, outputs)
    m = helper.make_model(g, opset_imports=list(ctx.model.opset_import))
    try:
        res = reference_evaluator(m, what).run(None, {i: ctx.consts[i] for i in ins})
    except GraphError:
        raise
    except Exception as e:
        raise GraphError(f"{what} has only constant inputs but could not be folded: "
                         f"{type(e).__name__}: {e}") from None
    for o, v in zip([o for o in n.output if o], res):
        ctx.consts[o] = np.asarray(v)


def _fallback(ctx: _Ctx, n: onnx.NodeProto) -> None:
    """Keep an unsupported node as an opaque ``CpuFallback`` node (shapes by ONNX inference).

    The node is stored as a one-node ONNX model whose inputs are ``in0, in1, ...`` (the present
    inputs, in order) and outputs ``out0, out1, ...``.
    """
    feeds: list[str] = []
    vis: list[onnx.ValueInfoProto] = []
    renamed: list[str] = []
    for t in n.input:
        if not t:
            renamed.append("")
            continue
        k = len(feeds)
        spec = ctx._spec(t)
        vis.append(helper.make_tensor_value_info(
            f"in{k}", helper.np_dtype_to_tensor_dtype(np.dtype(spec.dtype)), spec.shape))
        renamed.append(f"in{k}")
        feeds.append(t)
    node = onnx.NodeProto()
    node.CopyFrom(n)
    del node.input[:]
    node.input.extend(renamed)
    del node.output[:]
    node.output.extend(f"out{j}" for j in range(len(n.output)))
    outs = [helper.make_tensor_value_info(f"out{j}", onnx.TensorProto.UNDEFINED, None)
            for j in range(len(n.output))]
    m = helper.make_model(helper.make_graph([node], "fallback", vis, outs),
                          opset_imports=list(ctx.model.opset_import))
    what = (f"node {ctx.node_name!r} has operator {n.op_type!r}, which npujax cannot execute, "
            "and ONNX shape inference")
    try:
        inferred = onnx.shape_inference.infer_shapes(m, strict_mode=True)
    except Exception as e:
        raise UnsupportedOpError(f"{what} cannot type it for a CPU fallback: {e}") from None
    types = []
    for o in inferred.graph.output:
        tt = o.type.tensor_type
        dims = [d.dim_value if d.HasField("dim_value") else None for d in tt.shape.dim]
        if not tt.HasField("shape") or None in dims or tt.elem_type == 0:
            raise UnsupportedOpError(f"{what} gives no static output shape for a CPU fallback.")
        types.append([dims, str(np.dtype(helper.tensor_dtype_to_np_dtype(tt.elem_type)))])
    ctx.emit("CpuFallback", feeds, list(n.output), {
        "onnx_op": n.op_type, "output_types": types,
        "onnx_model": base64.b64encode(m.SerializeToString()).decode(),
    })


#: Operators with a sliding window: ``strides``/``dilations``/``kernel_shape`` >= 1, ``pads`` >= 0,
#: and an empty output (a window larger than its padded input) is an error.
_WINDOW_OPS = frozenset({"Conv", "ConvTranspose", "MaxPool", "AveragePool", "LpPool",
                         "ConvInteger", "QLinearConv", "DeformConv", "MaxUnpool", "Col2Im"})


#: Of those, the ones on the MAC array: an empty output is an error. (An empty pooling output
#: is legal ONNX: onnxruntime runs PP-OCR's classifier at half resolution that way.)
_GEMM_WINDOW_OPS = frozenset({"Conv", "ConvTranspose", "ConvInteger", "QLinearConv",
                              "DeformConv"})


def _check_attrs(name: str, n: onnx.NodeProto, a: Mapping[str, Any], rank: int | None) -> None:
    """The ONNX rules on window attributes (values and lengths for an input of ``rank``
    dimensions), checked before any importer runs."""
    if n.op_type not in _WINDOW_OPS:
        return
    spatial = None if rank is None else rank - 2
    if spatial is not None and spatial < 1:
        raise GraphError(f"node {name!r} ({n.op_type}) needs an input of rank >= 3 "
                         f"(N, C, spatial...), got rank {rank}.")
    for key, low, per in (("strides", 1, 1), ("dilations", 1, 1), ("kernel_shape", 1, 1),
                          ("pads", 0, 2), ("output_padding", 0, 1)):
        if key in a:
            v = a[key]
            if not isinstance(v, list) or not all(isinstance(d, int) and d >= low for d in v):
                raise GraphError(f"node {name!r} ({n.op_type}): {key}={v} must be a list of "
                                 f"integers >= {low} (ONNX {n.op_type}).")
            if spatial is not None and len(v) != per * spatial:
                raise GraphError(f"node {name!r} ({n.op_type}): {key}={v} must have "
                                 f"{per * spatial} entries for {spatial} spatial dimension(s).")
    if "group" in a and (not isinstance(a["group"], int) or a["group"] < 1):
        raise GraphError(f"node {name!r} ({n.op_type}): group={a['group']} must be >= 1.")


def _check_arity(name: str, n: onnx.NodeProto, opset: int) -> None:
    """The node's inputs against its ONNX schema: their number, and required ones present."""
    try:
        schema = onnx.defs.get_schema(n.op_type, opset, n.domain or "")
    except Exception:
        return  # not an ONNX operator: refused or kept as a fallback later
    count = len(n.input)
    if not schema.min_input <= count <= schema.max_input:
        raise GraphError(f"node {name!r} ({n.op_type}) has {count} inputs; ONNX {n.op_type} "
                         f"(opset {opset}) takes {schema.min_input} to {schema.max_input}.")
    have = {a.name for a in n.attribute}
    missing = sorted(k for k, a in schema.attributes.items() if a.required and k not in have)
    if missing:
        raise GraphError(f"node {name!r} ({n.op_type}) lacks the required attribute(s) "
                         f"{missing} of ONNX {n.op_type}.")
    single = onnx.defs.OpSchema.FormalParameterOption.Single
    for i, p in enumerate(schema.inputs):
        if p.option == single and i < count and not n.input[i]:
            raise GraphError(f"node {name!r} ({n.op_type}): its required input {i} "
                             f"({p.name!r}) is empty.")


def _check_opset(model: onnx.ModelProto) -> int:
    """The model's default-domain opset, which must be declared once and known to onnx."""
    versions = [o.version for o in model.opset_import if o.domain in ("", "ai.onnx")]
    newest = onnx.defs.onnx_opset_version()
    if len(versions) != 1:
        raise GraphError(
            f"the model declares {'no' if not versions else len(versions)} opset version(s) for "
            "the default ONNX domain; a model must declare exactly one (onnx.helper.make_model("
            "..., opset_imports=[onnx.helper.make_opsetid('', 17)])).")
    if not 1 <= versions[0] <= newest:
        raise GraphError(f"the model declares ONNX opset {versions[0]}, which does not exist "
                         f"(this onnx knows 1-{newest}).")
    return versions[0]


def _graph_inputs(ctx: _Ctx, model: onnx.ModelProto,
                  input_shapes: Mapping[str, Sequence[int]] | None) -> list[str]:
    inits = {t.name for t in model.graph.initializer}
    names = []
    given = dict(input_shapes or {})
    declared = [vi.name for vi in model.graph.input if vi.name not in inits]
    unknown = sorted(set(given) - set(declared))
    if unknown:  # before any other input error: a misspelt name is the likelier mistake
        raise GraphError(f"input shapes are given for {unknown} (--input-shape NAME=..., or "
                         f"from_onnx's input_shapes), which are not inputs of the model; its "
                         f"inputs are {declared}.")
    for vi in model.graph.input:
        if vi.name in inits:
            continue
        tt = vi.type.tensor_type
        dims = [d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else None
                for d in tt.shape.dim]
        if vi.name in given:
            shape = tuple(int(d) for d in given.pop(vi.name))
            if len(shape) != len(dims) or any(d is not None and d != s
                                              for d, s in zip(dims, shape)):
                declared = [d if d is not None else "?" for d in dims]
                raise GraphError(
                    f"the shape {shape} given for input {vi.name!r} (--input-shape "
                    f"{vi.name}=..., or from_onnx's input_shapes) does not match the model's "
                    f"declared shape {declared}; give {len(dims)} dimensions, the declared "
                    "ones as they are.")
        elif dims and dims[0] is None and None not in dims[1:]:
            # only the batch is symbolic (as npujax.to_onnx and most exporters write it):
            # specialise to batch 1, like --batch's default (input_shapes sets another)
            shape = (1, *(d for d in dims[1:] if d is not None))
        elif None in dims:
            example = ",".join(str(d) if d is not None else "N" for d in dims)
            raise GraphError(
                f"model input {vi.name!r} has dynamic dimensions "
                f"{[d if d is not None else '?' for d in dims]}; pass its static shape, e.g. "
                f"from_onnx(path, input_shapes={{{vi.name!r}: ({example.replace(',', ', ')})}}) "
                f"or on the command line --input-shape {vi.name}={example} (with numbers for N)."
            )
        else:
            shape = tuple(d for d in dims if d is not None)  # (no dim is None on this branch)
        dtype = helper.tensor_dtype_to_np_dtype(tt.elem_type) if tt.elem_type else np.float32
        check_elements(shape, f"model input {vi.name!r}")
        ctx.types[vi.name] = TensorType(shape, str(np.dtype(dtype)))
        names.append(vi.name)
    return names


def dynamic_input_shape(path: str | os.PathLike[str], shape: Sequence[int]
                        ) -> dict[str, tuple[int, ...]] | None:
    """``{input: shape}`` for a single-input ONNX model whose input has a dynamic dimension
    (e.g. a benchmark table's ``1 x C x H x W``); None when the input is static or the model
    has several inputs (its own shapes, or explicit ones, apply).

    Raises:
      GraphError: an unreadable model (as :func:`load_onnx_model`).
    """
    m = load_onnx_model(path)
    inits = {i.name for i in m.graph.initializer}
    ins = [i for i in m.graph.input if i.name not in inits]
    if len(ins) != 1:
        return None
    dims = ins[0].type.tensor_type.shape.dim
    if all(d.HasField("dim_value") for d in dims):
        return None
    return {ins[0].name: tuple(int(d) for d in shape)}


def batch_input_shapes(model: onnx.ModelProto, shapes: Mapping[str, Sequence[int]] | None,
                       batch: int) -> dict[str, tuple[int, ...]]:
    """Input shapes with the leading (batch) dimension set to ``batch``: the given shapes, and
    the declared shapes of inputs not given whose other dimensions are static.

    Raises:
      ConfigError: ``batch`` < 1.
    """
    if batch < 1:
        raise ConfigError(f"batch must be >= 1, got {batch}.")
    out = {k: tuple(int(d) for d in v) for k, v in (shapes or {}).items()}
    inits = {i.name for i in model.graph.initializer}
    for inp in model.graph.input:
        if inp.name in inits:
            continue
        if inp.name in out:
            out[inp.name] = (batch, *out[inp.name][1:])
        else:
            dims = [d.dim_value if d.dim_value > 0 else None
                    for d in inp.type.tensor_type.shape.dim]
            rest = [d for d in dims[1:] if d is not None]
            if dims and len(rest) == len(dims) - 1:
                out[inp.name] = (batch, *rest)
    return out


def from_onnx(
    path_or_model: str | os.PathLike[str] | bytes | onnx.ModelProto,
    input_shapes: Mapping[str, Sequence[int]] | None = None,
    *,
    unsupported: str = "error",
    batch: int | None = None,
    weights: str = "required",
) -> tuple[Graph, Params]:
    """Import an ONNX model as ``(Graph, params)``, specialised to static input shapes.

    Args:
      path_or_model: path of a ``.onnx`` file (external data only from its folder), serialized
        bytes, or an ``onnx.ModelProto``.
      input_shapes: ``{input_name: shape}`` for inputs whose declared shape has dynamic
        dimensions (e.g. ``{"x": (1, 3, 48, 192)}``); also overrides fully static inputs. An
        input whose only dynamic dimension is the leading (batch) one needs none: it is
        imported at batch 1 (or ``batch``).
      unsupported: ``"error"`` (default) raises on an operator npujax cannot execute;
        ``"fallback"`` keeps it as an opaque ``CpuFallback`` node (``attrs['onnx_op']``) with
        output shapes from ONNX shape inference, executed on the host by ``onnx.reference`` and
        costed by the NPU model as host-CPU fallback.
      batch: import at this batch size: the leading dimension of every input (given in
        ``input_shapes`` or declared with static other dimensions) is set to it
        (:func:`batch_input_shapes`).
      weights: ``"required"`` (default): every external-data file must be present.
        ``"shapes"``: a weight whose external file is absent (e.g. ZigZag's shipped workloads)
        is imported by its shape and type only, with a warning, for what needs only shapes
        (:func:`npujax.lower`): an :class:`~npujax.ir.absent.AbsentArray` in ``params`` or
        ``Graph.constants``, never allocated (whatever its size); the graph's ``source`` is
        then :data:`SHAPES_ONLY_SOURCE` and :func:`npujax.execute` refuses it.

    Decomposed LayerNorms and GELUs are fused into single ops where they are exactly that
    (:func:`npujax.ir.patterns.fuse_transformer_patterns`).

    The graph is specialised to the input shapes: shape computations are folded with them, so
    executing with another batch size works only where no folded shape depends on the batch
    (import once per batch size otherwise).

    Returns:
      ``(graph, params)``: ``graph.source == "onnx"``; tensor names are the ONNX names; node names
      are the ONNX node names (made unique; ``<op>_<i>`` when empty). ``params[node]`` holds
      float32 ``kernel`` (Conv: ONNX ``[C_out, C_in/groups, kh, kw]``, layout ``OIHW``; Gemm:
      ``[K, N]``; ConvTranspose: ``[C_in, C_out/groups, kh, kw]``), ``bias``, and BatchNorm's
      ``scale``/``bias``/``mean``/``var``.

    Raises:
      GraphError: malformed file, a URL, an external-data path outside the model's folder, a
        tensor read before it is produced (missing initializer), a dynamic non-batch input
        dimension not given in ``input_shapes``.
      UnsupportedOpError: an operator (or an operator feature) npujax cannot execute, naming the
        node and the operator, unless ``unsupported="fallback"``.

    Examples:
      >>> graph, params = from_onnx("cls.onnx", {"x": (1, 3, 48, 192)})  # doctest: +SKIP
      >>> y = npujax.execute(graph, params, x)  # doctest: +SKIP
    """
    if unsupported not in ("error", "fallback"):
        raise GraphError(f"unsupported={unsupported!r}; use 'error' or 'fallback'.")
    if weights not in ("required", "shapes"):
        raise GraphError(f"weights={weights!r}; use 'required' or 'shapes'.")
    missing: list[str] = []
    model = load_onnx_model(path_or_model,
                            missing_data="absent" if weights == "shapes" else "error",
                            placeholders=missing)
    if missing:
        log.warning(f"{len(missing)} weight tensors have no data ({missing[0]}"
                    f"{', ...' if len(missing) > 1 else ''}): imported for their shapes only "
                    "(latency is exact; executing the model needs the external-data files).")
    if batch is not None:
        input_shapes = batch_input_shapes(model, input_shapes, batch) or None
    _check_opset(model)
    ctx = _Ctx(model, unsupported)
    for o in model.opset_import:
        if o.domain not in ("", "ai.onnx") and any(
                n.domain == o.domain and (n.domain, n.op_type) not in ONNX_DOMAIN_IMPORTERS
                for n in model.graph.node):
            if unsupported != "fallback":
                raise UnsupportedOpError(
                    f"the model uses operators of domain {o.domain!r}; npujax imports only the "
                    "default ONNX domain and "
                    f"{sorted(f'{d}.{t}' for d, t in ONNX_DOMAIN_IMPORTERS)} (use "
                    "unsupported='fallback' to keep the others as CPU nodes).")
    for t in model.graph.initializer:
        if t.name in ctx.consts:
            raise GraphError(f"two initializers are named {t.name!r}; tensor names must be "
                             "unique.")
        ctx.consts[t.name] = _to_array(t, f"initializer {t.name!r}")
    names = [vi.name for vi in model.graph.input]
    if len(set(names)) != len(names):
        raise GraphError(f"the model declares the input(s) "
                         f"{sorted({x for x in names if names.count(x) > 1})} twice.")
    inputs = _graph_inputs(ctx, model, input_shapes)
    ctx.graph_inputs = set(inputs)
    for i, n in enumerate(model.graph.node):
        _import_node(ctx, n, n.name or f"{n.op_type}_{i}")
    outputs = [o.name for o in model.graph.output]
    for o in outputs:
        if o not in ctx.types and o not in ctx.consts:
            raise GraphError(f"graph output {o!r} is produced by no node.")
        dt = ctx.consts[o].dtype if o in ctx.consts else np.dtype(ctx.types[o].dtype)
        if dt.itemsize == 8 and dt.kind in "iu" and not jax.config.read("jax_enable_x64"):
            raise UnsupportedOpError(
                f"graph output {o!r} is {dt}, which JAX narrows to 32 bits unless 64-bit types "
                "are on (jax.config.update('jax_enable_x64', True)).")
    used = {t for node in ctx.nodes for t in node.inputs} | set(outputs)
    constants = {k: v for k, v in ctx.consts.items() if k in used}
    tensors = dict(ctx.types)
    for k, v in constants.items():
        tensors[k] = TensorType(tuple(int(d) for d in v.shape), str(v.dtype))
    graph = Graph(nodes=tuple(ctx.nodes), inputs=tuple(inputs), outputs=tuple(outputs),
                  tensors=tensors, constants=constants,
                  source=SHAPES_ONLY_SOURCE if missing else "onnx")
    return fuse_transformer_patterns(*_fold_bias_adds(graph, ctx.params))


def _rename_inputs(g: onnx.GraphProto, rename: Mapping[str, str]) -> None:
    """Rename the tensors that the nodes of ``g`` and of its nested subgraphs read (in place),
    except where a nested subgraph defines a tensor of that name itself (its own scope)."""
    for node in g.node:
        node.input[:] = [rename.get(t, t) for t in node.input]
        for a in node.attribute:
            for sub in ([a.g] if a.HasField("g") else []) + list(a.graphs):
                own = ({t.name for t in sub.initializer} | {t.name for t in sub.input}
                       | {t for m in sub.node for t in m.output})
                _rename_inputs(sub, {k: v for k, v in rename.items() if k not in own})


def _inline_if(ctx: _Ctx, n: onnx.NodeProto) -> None:
    """Import an ``If`` whose condition is a constant as the branch it takes.

    The branch's initializers become constants and its nodes are imported in place of the
    ``If`` (folded, inlined or converted like any other node; names ``<If>/<node>``), reading the
    outer graph's tensors where the branch refers to them; its outputs become the ``If``'s. A
    branch tensor whose name the outer graph already uses is renamed.

    Raises:
      GraphError: a condition that is not one element, a branch whose outputs do not match the
        ``If``'s.
    """
    what = f"node {ctx.node_name!r} (If)"
    cond = ctx.consts[n.input[0]]
    if cond.size != 1:
        raise GraphError(f"{what}: its condition {n.input[0]!r} has shape {list(cond.shape)}; "
                         "ONNX If needs a single element.")
    taken = "then_branch" if bool(cond.reshape(-1)[0]) else "else_branch"
    attr = next((a for a in n.attribute if a.name == taken), None)
    if attr is None or not attr.HasField("g"):
        raise GraphError(f"{what} has no {taken} graph.")
    g = onnx.GraphProto()
    g.CopyFrom(attr.g)
    if len(g.output) != len(n.output):
        raise GraphError(f"{what}: its {taken} has {len(g.output)} outputs, the If has "
                         f"{len(n.output)}.")
    if g.sparse_initializer:
        raise UnsupportedOpError(f"{what}: its {taken} has sparse initializers, which npujax "
                                 "does not import.")
    prefix, outer = ctx.node_name, (ctx.onnx_node, ctx.node_name)
    produced = [t for node in g.node for t in node.output if t]
    local = [t.name for t in g.initializer] + produced
    outs: dict[str, str] = {}
    for o, t in zip(g.output, n.output):
        outs.setdefault(o.name, t)  # (an output listed twice is copied below)
    rename: dict[str, str] = {}
    for t in local:
        if t in outs and t in produced:
            rename[t] = outs[t]  # the branch writes the If's output itself
        elif t in ctx.consts or t in ctx.types or t in set(n.output):
            rename[t] = ctx.unique(f"{prefix}/{t}")
    _rename_inputs(g, rename)
    for node in g.node:
        node.output[:] = [rename.get(t, t) for t in node.output]
    for t in g.initializer:
        ctx.consts[rename.get(t.name, t.name)] = _to_array(t, f"{what} {taken} initializer "
                                                              f"{t.name!r}")
    for i, node in enumerate(g.node):
        _import_node(ctx, node, f"{prefix}/{node.name or f'{node.op_type}_{i}'}")
    ctx.onnx_node, ctx.node_name = outer
    for o, t in zip(g.output, n.output):
        src = rename.get(o.name, o.name)
        if src == t or not t:
            continue
        if src in ctx.consts:
            ctx.consts[t] = ctx.consts[src]
        elif src in ctx.types:
            ctx.emit("Identity", [src], [t], name=f"{prefix}/{o.name}")
        else:
            raise GraphError(f"{what}: its {taken} output {o.name!r} is produced by no node.")


def _import_node(ctx: _Ctx, n: onnx.NodeProto, name: str) -> None:
    """Import one ONNX node (of the main graph, or of an inlined ``If`` branch) into ``ctx``:
    record a constant, fold it, inline it, or convert it with its registered importer."""
    ctx.onnx_node, ctx.node_name = n, name
    unsupported, opset = ctx.unsupported, ctx.opset
    if n.domain in ("", "ai.onnx"):
        _check_arity(ctx.node_name, n, opset)
    for t in n.input:
        if t and t not in ctx.consts and t not in ctx.types:
            raise GraphError(
                f"node {ctx.node_name!r} ({n.op_type}) reads tensor {t!r}, which is neither a "
                "graph input, an initializer nor the output of an earlier node (a missing "
                "initializer, or nodes out of topological order).")
    for t in n.output:
        if t and (t in ctx.consts or t in ctx.types):
            raise GraphError(
                f"node {ctx.node_name!r} ({n.op_type}) writes tensor {t!r}, which an "
                "initializer, a graph input or an earlier node already defines; tensor "
                "names must be unique (SSA).")
    if n.op_type == "Constant":
        ctx.consts[n.output[0]] = _constant_value(n)
        return
    if n.op_type in ("Shape", "Size") and n.input[0] in ctx.types:
        shape = np.asarray(ctx.types[n.input[0]].shape, np.int64)
        if n.op_type == "Size":
            ctx.consts[n.output[0]] = np.asarray(shape.prod(), np.int64)
        else:
            a = _attrs(n)
            ctx.consts[n.output[0]] = shape[a.get("start", 0):a.get("end", None)]
        return
    if n.op_type == "If" and n.domain in ("", "ai.onnx") and n.input[0] in ctx.consts:
        _inline_if(ctx, n)
        return
    present = [t for t in n.input if t]
    if (n.op_type not in ONNX_WEIGHT_OPS and n.domain in ("", "ai.onnx")
            and present and all(t in ctx.consts for t in present)):
        _fold(ctx, n)
        return
    conv = (ONNX_IMPORTERS.get(n.op_type) if n.domain in ("", "ai.onnx")
            else ONNX_DOMAIN_IMPORTERS.get((n.domain, n.op_type)))
    if conv is None:
        if unsupported == "fallback":
            _fallback(ctx, n)
            return
        raise UnsupportedOpError(
            f"node {ctx.node_name!r} has operator {n.op_type!r}"
            f"{' (domain ' + repr(n.domain) + ')' if n.domain else ''}, which npujax cannot "
            f"import; supported: {sorted(SUPPORTED_ONNX_OPS)}. Pass unsupported='fallback' "
            "to keep it as a CPU-fallback node.")
    attrs = _attrs(n)
    rank = len(ctx.shape(n.input[0])) if n.input and n.input[0] else None
    _check_attrs(ctx.node_name, n, attrs, rank)
    try:
        conv(ctx, n, attrs)
        if n.op_type in _GEMM_WINDOW_OPS:
            for t in n.output:
                if t in ctx.types and 0 in ctx.types[t].shape:
                    raise GraphError(
                        f"node {ctx.node_name!r} ({n.op_type}) has an empty output "
                        f"{list(ctx.types[t].shape)}: its (dilated) kernel is larger than "
                        "its padded input.")
    except UnsupportedOpError as e:
        msg = str(e)
        if ctx.node_name not in msg:
            msg = f"node {ctx.node_name!r} ({n.op_type}): {msg}"
        if unsupported == "fallback":
            _fallback(ctx, n)
            return
        raise UnsupportedOpError(msg) from None
    except NpujaxError:
        raise
    except (KeyError, TypeError, ValueError, IndexError) as e:
        # an importer met an attribute or input of a shape the checks above let through
        raise GraphError(f"node {ctx.node_name!r} ({n.op_type}) cannot be imported: "
                         f"{type(e).__name__}: {e}") from None


def _fold_bias_adds(graph: Graph, params: Params) -> tuple[Graph, Params]:
    """Fold ``Add(conv_or_gemm_output, constant per-channel vector)`` into the layer's bias.

    This is how exporters often write a bias (e.g. MatMul + Add); as a bias it stays in params
    (trainable, int32 on the NPU) instead of a separate vector pass.
    """
    nodes = list(graph.nodes)
    params = {k: dict(v) for k, v in params.items()}
    constants = dict(graph.constants)
    for node in graph.nodes:
        if node.op not in ("Conv", "Gemm") or node.attrs.get("epilogue"):
            continue
        out = node.outputs[0]
        users = [n for n in nodes if out in n.inputs]
        if len(users) != 1 or out in graph.outputs or users[0].op != "Add":
            continue
        add = users[0]
        other = add.inputs[1] if add.inputs[0] == out else add.inputs[0]
        if other not in constants or add.inputs[0] == add.inputs[1]:
            continue
        c = constants[other]
        y = graph.tensors[out].shape
        ch = y[1] if node.op == "Conv" else y[-1]
        want = (ch,) if node.op == "Gemm" else (ch,) + (1,) * (len(y) - 2)
        if c.shape[-len(want):] != want or c.size != ch or c.ndim > len(y):
            continue
        p = params[node.name]
        extra = np.asarray(c.reshape(-1), np.float32)
        bias = p.get("bias")
        if bias is not None and is_absent(bias):  # (known by its shape: added abstractly)
            p["bias"] = bias + extra
        else:  # in numpy (the same float32 sums): an eager jnp add compiled one program per
            # channel count, 27 for the PP-OCR classifier (0.7 s of a cold sweep's CPU), and so
            # does jnp.asarray of a numpy array (jax's `stage`, 13 there): device_put copies
            base = np.zeros((ch,), np.float32) if bias is None else np.asarray(bias, np.float32)
            p["bias"] = jax.device_put(base + extra)
        i = next(k for k, n in enumerate(nodes) if n is add)
        nodes.pop(i)
        j = next(k for k, n in enumerate(nodes) if n.name == node.name)
        nodes[j] = nodes[j].replace(outputs=add.outputs, params=tuple(p))
    used = {t for n in nodes for t in n.inputs} | set(graph.outputs)
    constants = {k: v for k, v in constants.items() if k in used}
    tensors = {k: v for k, v in graph.tensors.items()
               if k in used or any(k in n.outputs for n in nodes) or k in graph.inputs}
    return graph.replace(nodes=tuple(nodes), constants=constants, tensors=tensors), params

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

from npujax.errors import ConfigError, GraphError, UnsupportedOpError
from npujax.ir.graph import Graph, Node, Params, TensorType, fresh_name
from npujax.ops import ONNX_IMPORTERS, ONNX_WEIGHT_OPS, get_op

__all__ = ["from_onnx", "SUPPORTED_ONNX_OPS", "load_onnx_model", "parse_input_shapes",
           "batch_input_shapes"]

_URL = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*://")


def load_onnx_model(path_or_model: str | os.PathLike[str] | bytes | onnx.ModelProto
                    ) -> onnx.ModelProto:
    """Read an ONNX model (a local path, serialized bytes or a ``ModelProto``), with its weights.

    External-data tensors are read only from files inside the model's folder: a location that is
    absolute or escapes the folder (``../``, symlinks) is refused, and URLs are never fetched.

    Raises:
      GraphError: the path is a URL or does not exist, the file is not a valid ONNX protobuf, or an
        external-data location is missing or outside the model's folder.
    """
    if isinstance(path_or_model, onnx.ModelProto):
        model, base = path_or_model, None
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
            raise GraphError(f"ONNX model {text!r} does not exist or is not a file.")
        model, base = _parse(path.read_bytes(), text), path.resolve().parent
    _load_external_data(model, base)
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


def _all_tensors(model: onnx.ModelProto):
    yield from model.graph.initializer
    for node in model.graph.node:
        for attr in node.attribute:
            if attr.HasField("t"):
                yield attr.t


def _load_external_data(model: onnx.ModelProto, base: Path | None) -> None:
    for t in _all_tensors(model):
        if t.data_location != onnx.TensorProto.EXTERNAL:
            continue
        info = {e.key: e.value for e in t.external_data}
        loc = info.get("location", "")
        if base is None:
            raise GraphError(
                f"tensor {t.name!r} keeps its data in external file {loc!r}, but the model was "
                "passed in memory; pass the model's path so its folder can be read."
            )
        if _URL.match(loc) or os.path.isabs(loc):
            raise GraphError(
                f"tensor {t.name!r} points at external data {loc!r}; only relative paths inside "
                f"the model's folder {str(base)!r} are read."
            )
        target = (base / loc).resolve()
        if not target.is_relative_to(base):
            raise GraphError(
                f"tensor {t.name!r} points at external data {loc!r}, which resolves outside the "
                f"model's folder {str(base)!r}; refusing to read it."
            )
        if not target.is_file():
            raise GraphError(f"external data file {loc!r} of tensor {t.name!r} does not exist.")
        offset, length = int(info.get("offset", 0)), info.get("length")
        with open(target, "rb") as f:
            f.seek(offset)
            data = f.read(int(length) if length is not None else -1)
        t.raw_data = data
        t.data_location = onnx.TensorProto.DEFAULT
        del t.external_data[:]


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


# ---------------------------------------------------------------------------------------------
# The importer state


class _Ctx:
    def __init__(self, model: onnx.ModelProto, unsupported: str):
        self.model = model
        self.opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")),
                          1)
        self.unsupported = unsupported
        self.consts: dict[str, np.ndarray] = {}
        self.types: dict[str, TensorType] = {}
        self.nodes: list[Node] = []
        self.params: Params = {}
        self.names: set[str] = set()
        self.onnx_node = onnx.NodeProto()  # the node being converted (set per node)
        self.node_name = ""

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
        p = {k: jnp.asarray(v, jnp.float32) for k, v in (params or {}).items()}
        node = Node(name, op, tuple(inputs), tuple(outputs), dict(attrs or {}), tuple(p))
        if p:
            self.params[name] = p
        specs = [self._spec(t) for t in node.inputs]
        try:
            run = get_op(op, name).run
            outs = jax.eval_shape(lambda xs, pp: run(node, xs, pp), specs, p)
        except UnsupportedOpError:
            raise
        except Exception as e:
            raise GraphError(
                f"node {self.node_name!r} ({self.onnx_node.op_type}) cannot be built with input "
                f"shapes {[tuple(s.shape) for s in specs]}: {type(e).__name__}: {e}"
            ) from None
        for t, o in zip(node.outputs, outs):
            self.types[t] = TensorType(tuple(int(d) for d in o.shape), str(o.dtype))
        self.nodes.append(node)
        return node

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
        return numpy_helper.to_array(a.t)
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
    """Fold DequantizeLinear of a constant (a QDQ model's weights) into float32 values."""
    a = _attrs(n)
    if a.get("block_size", 0):
        raise UnsupportedOpError(f"node {ctx.node_name!r}: blocked DequantizeLinear is not "
                                 "supported.")
    x = ctx.consts[n.input[0]]
    scale = ctx.consts[n.input[1]].astype(np.float32)
    zp = ctx.consts[n.input[2]] if len(n.input) > 2 and n.input[2] else np.zeros((), x.dtype)
    if scale.ndim == 1 and x.ndim > 1:
        shape = [1] * x.ndim
        shape[int(a.get("axis", 1)) % x.ndim] = -1
        scale, zp = scale.reshape(shape), zp.reshape(shape)
    ctx.consts[n.output[0]] = ((x.astype(np.float64) - zp.astype(np.float64)) * scale
                               ).astype(np.float32)


def _fold(ctx: _Ctx, n: onnx.NodeProto) -> None:
    """Evaluate a node whose inputs are all constants with onnx's reference implementation."""
    from onnx.reference import ReferenceEvaluator

    if n.op_type == "DequantizeLinear":
        _fold_dequantize(ctx, n)
        return

    ins = [i for i in n.input if i]
    inputs = [helper.make_tensor_value_info(i, helper.np_dtype_to_tensor_dtype(
        ctx.consts[i].dtype), ctx.consts[i].shape) for i in ins]
    outputs = [helper.make_tensor_value_info(o, onnx.TensorProto.UNDEFINED, None)
               for o in n.output if o]
    g = helper.make_graph([n], "fold", inputs, outputs)
    m = helper.make_model(g, opset_imports=list(ctx.model.opset_import))
    try:
        res = ReferenceEvaluator(m).run(None, {i: ctx.consts[i] for i in ins})
    except Exception as e:
        raise GraphError(f"node {ctx.node_name!r} ({n.op_type}) has only constant inputs but "
                         f"could not be folded: {type(e).__name__}: {e}") from None
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


def _graph_inputs(ctx: _Ctx, model: onnx.ModelProto,
                  input_shapes: Mapping[str, Sequence[int]] | None) -> list[str]:
    inits = {t.name for t in model.graph.initializer}
    names = []
    given = dict(input_shapes or {})
    declared = [vi.name for vi in model.graph.input if vi.name not in inits]
    unknown = sorted(set(given) - set(declared))
    if unknown:  # before any other input error: a misspelt name is the likelier mistake
        raise GraphError(f"input_shapes names {unknown}, which are not inputs of the model; its "
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
                raise GraphError(
                    f"input_shapes[{vi.name!r}] = {shape} does not match the model's declared "
                    f"shape {[d if d is not None else '?' for d in dims]}.")
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
        ctx.types[vi.name] = TensorType(shape, str(np.dtype(dtype)))
        names.append(vi.name)
    return names


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
    model = load_onnx_model(path_or_model)
    if batch is not None:
        input_shapes = batch_input_shapes(model, input_shapes, batch) or None
    ctx = _Ctx(model, unsupported)
    for o in model.opset_import:
        if o.domain not in ("", "ai.onnx") and any(n.domain == o.domain for n in model.graph.node):
            if unsupported != "fallback":
                raise UnsupportedOpError(
                    f"the model uses operators of domain {o.domain!r}; npujax imports only the "
                    "default ONNX domain (use unsupported='fallback' to keep them as CPU nodes).")
    for t in model.graph.initializer:
        ctx.consts[t.name] = numpy_helper.to_array(t)
    inputs = _graph_inputs(ctx, model, input_shapes)
    for i, n in enumerate(model.graph.node):
        ctx.onnx_node, ctx.node_name = n, n.name or f"{n.op_type}_{i}"
        for t in n.input:
            if t and t not in ctx.consts and t not in ctx.types:
                raise GraphError(
                    f"node {ctx.node_name!r} ({n.op_type}) reads tensor {t!r}, which is neither a "
                    "graph input, an initializer nor the output of an earlier node (a missing "
                    "initializer, or nodes out of topological order).")
        if n.op_type == "Constant":
            ctx.consts[n.output[0]] = _constant_value(n)
            continue
        if n.op_type in ("Shape", "Size") and n.input[0] in ctx.types:
            shape = np.asarray(ctx.types[n.input[0]].shape, np.int64)
            if n.op_type == "Size":
                ctx.consts[n.output[0]] = np.asarray(shape.prod(), np.int64)
            else:
                a = _attrs(n)
                ctx.consts[n.output[0]] = shape[a.get("start", 0):a.get("end", None)]
            continue
        present = [t for t in n.input if t]
        if (n.op_type not in ONNX_WEIGHT_OPS and n.domain in ("", "ai.onnx")
                and present and all(t in ctx.consts for t in present)):
            _fold(ctx, n)
            continue
        conv = ONNX_IMPORTERS.get(n.op_type) if n.domain in ("", "ai.onnx") else None
        if conv is None:
            if unsupported == "fallback":
                _fallback(ctx, n)
                continue
            raise UnsupportedOpError(
                f"node {ctx.node_name!r} has operator {n.op_type!r}"
                f"{' (domain ' + repr(n.domain) + ')' if n.domain else ''}, which npujax cannot "
                f"import; supported: {sorted(SUPPORTED_ONNX_OPS)}. Pass unsupported='fallback' "
                "to keep it as a CPU-fallback node.")
        try:
            conv(ctx, n, _attrs(n))
        except UnsupportedOpError as e:
            msg = str(e)
            if ctx.node_name not in msg:
                msg = f"node {ctx.node_name!r} ({n.op_type}): {msg}"
            if unsupported == "fallback":
                _fallback(ctx, n)
                continue
            raise UnsupportedOpError(msg) from None
    outputs = [o.name for o in model.graph.output]
    for o in outputs:
        if o not in ctx.types and o not in ctx.consts:
            raise GraphError(f"graph output {o!r} is produced by no node.")
    used = {t for node in ctx.nodes for t in node.inputs} | set(outputs)
    constants = {k: v for k, v in ctx.consts.items() if k in used}
    tensors = dict(ctx.types)
    for k, v in constants.items():
        tensors[k] = TensorType(tuple(int(d) for d in v.shape), str(v.dtype))
    graph = Graph(nodes=tuple(ctx.nodes), inputs=tuple(inputs), outputs=tuple(outputs),
                  tensors=tensors, constants=constants, source="onnx")
    return _fold_bias_adds(graph, ctx.params)


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
        p["bias"] = p.get("bias", jnp.zeros((ch,), jnp.float32)) + jnp.asarray(
            c.reshape(-1), jnp.float32)
        i = next(k for k, n in enumerate(nodes) if n is add)
        nodes.pop(i)
        j = next(k for k, n in enumerate(nodes) if n.name == node.name)
        nodes[j] = nodes[j].replace(outputs=add.outputs, params=tuple(p))
    used = {t for n in nodes for t in n.inputs} | set(graph.outputs)
    constants = {k: v for k, v in constants.items() if k in used}
    tensors = {k: v for k, v in graph.tensors.items()
               if k in used or any(k in n.outputs for n in nodes) or k in graph.inputs}
    return graph.replace(nodes=tuple(nodes), constants=constants, tensors=tensors), params

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

from npujax.errors import GraphError, UnsupportedOpError
from npujax.ir.graph import Graph, Node, Params, TensorType
from npujax.ops.core import OPS

__all__ = ["from_onnx", "SUPPORTED_ONNX_OPS", "load_onnx_model", "parse_input_shapes"]

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
    from npujax.errors import ConfigError

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
        self.onnx_node: onnx.NodeProto | None = None
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
        name, i = base, 1
        while name in self.names:
            name, i = f"{base}_{i}", i + 1
        self.names.add(name)
        return name

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
            outs = jax.eval_shape(lambda xs, pp: OPS[op](node, xs, pp), specs, p)
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
        return self.unique(f"{base}:tmp")


def _attrs(node: onnx.NodeProto) -> dict[str, Any]:
    out = {}
    for a in node.attribute:
        v = helper.get_attribute_value(a)
        if isinstance(v, bytes):
            v = v.decode()
        out[a.name] = v
    return out


# ---------------------------------------------------------------------------------------------
# Converters: fn(ctx, onnx_node, attrs) -> None (they call ctx.emit)


def _conv_pads(a: Mapping[str, Any], in_spatial: Sequence[int], k: Sequence[int],
               strides: Sequence[int], dil: Sequence[int]) -> list[list[int]]:
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


def _conv(ctx: _Ctx, n: onnx.NodeProto, a: dict) -> None:
    w = ctx.const(n.input[1], "weight W")
    b = ctx.opt_const(2, "bias B")
    k = list(w.shape[2:])
    nsp = len(k)
    strides = list(a.get("strides", [1] * nsp))
    dil = list(a.get("dilations", [1] * nsp))
    x_shape = ctx.shape(n.input[0])
    pads = _conv_pads(a, x_shape[2:], k, strides, dil)
    layout = "NC" + "DHW"[3 - nsp:] if nsp <= 3 else None
    if layout is None:
        raise UnsupportedOpError(f"Conv with {nsp} spatial dimensions is not supported.")
    params = {"kernel": w}
    if b is not None:
        params["bias"] = b
    ctx.emit("Conv", [n.input[0]], [n.output[0]], {
        "data_layout": layout, "kernel_layout": "OI" + layout[2:], "strides": strides,
        "padding": pads, "dilations": dil, "groups": int(a.get("group", 1)),
        "kernel_shape": [int(d) for d in w.shape],
    }, params)


def _conv_transpose(ctx: _Ctx, n: onnx.NodeProto, a: dict) -> None:
    w = ctx.const(n.input[1], "weight W")
    b = ctx.opt_const(2, "bias B")
    k = list(w.shape[2:])
    nsp = len(k)
    g = int(a.get("group", 1))
    strides = list(a.get("strides", [1] * nsp))
    dil = list(a.get("dilations", [1] * nsp))
    opad = list(a.get("output_padding", [0] * nsp))
    in_sp = ctx.shape(n.input[0])[2:]
    auto = a.get("auto_pad", "NOTSET")
    eff = [(kk - 1) * d + 1 for kk, d in zip(k, dil)]
    if "output_shape" in a or auto in ("SAME_UPPER", "SAME_LOWER"):
        out_sp = list(a["output_shape"])[-nsp:] if "output_shape" in a else \
            [i * s for i, s in zip(in_sp, strides)]
        pads = []
        for j, (i, s, e, op, o) in enumerate(zip(in_sp, strides, eff, opad, out_sp)):
            total = s * (i - 1) + op + e - o
            # A requested output larger than the transposed conv's gets zeros at the end (as
            # onnxruntime's ComputeTransposePadAndOutputShape does).
            opad[j] += max(0, -total)
            total = max(0, total)
            if auto == "SAME_UPPER":
                pads.append([total // 2, total - total // 2])
            else:  # SAME_LOWER, and NOTSET with output_shape (ONNX: extra pad at the beginning)
                pads.append([total - total // 2, total // 2])
    elif auto == "VALID":
        pads = [[0, 0] for _ in range(nsp)]
    else:
        p = list(a.get("pads", [0] * 2 * nsp))
        pads = [[int(p[i]), int(p[i + nsp])] for i in range(nsp)]
    params = {"kernel": w}
    if b is not None:
        params["bias"] = b
    ctx.emit("ConvTranspose", [n.input[0]], [n.output[0]], {
        "strides": strides, "dilations": dil, "pads": pads, "output_padding": opad,
        "groups": g, "kernel_shape": [int(d) for d in w.shape],
    }, params)


def _gemm(ctx: _Ctx, n: onnx.NodeProto, a: dict) -> None:
    alpha, beta = float(a.get("alpha", 1.0)), float(a.get("beta", 1.0))
    x = n.input[0]
    if a.get("transA", 0):
        t = ctx.tmp(x)
        ctx.emit("Transpose", [x], [t], {"perm": [1, 0]}, name=f"{ctx.node_name}/transA")
        x = t
    c = ctx.opt_const(2, "C") if len(n.input) > 2 and n.input[2] in ctx.consts else None
    has_c = len(n.input) > 2 and bool(n.input[2])
    if n.input[1] in ctx.consts:
        w = ctx.consts[n.input[1]].astype(np.float32)
        w = (w.T if a.get("transB", 0) else w) * np.float32(alpha)
        N = w.shape[1]
        params = {"kernel": w}
        bias_is_vector = c is not None and c.size in (1, N) and (c.ndim < 2 or c.shape[0] == 1)
        if bias_is_vector:
            params["bias"] = np.broadcast_to(c.astype(np.float32).reshape(-1) * beta, (N,))
        if not has_c or bias_is_vector:
            ctx.emit("Gemm", [x], [n.output[0]], {}, params)
            return
        y = ctx.tmp(n.output[0])
        ctx.emit("Gemm", [x], [y], {}, params)
    else:
        b = n.input[1]
        if a.get("transB", 0):
            t = ctx.tmp(b)
            ctx.emit("Transpose", [b], [t], {"perm": [1, 0]}, name=f"{ctx.node_name}/transB")
            b = t
        y = ctx.tmp(n.output[0]) if (alpha != 1.0 or has_c) else n.output[0]
        ctx.emit("MatMul", [x, b], [y], name=f"{ctx.node_name}/matmul")
        if alpha != 1.0:
            s = _new_const(ctx, np.asarray(alpha, np.float32), "alpha")
            y2 = ctx.tmp(n.output[0]) if has_c else n.output[0]
            ctx.emit("Mul", [y, s], [y2], name=f"{ctx.node_name}/alpha")
            y = y2
        if not has_c:
            return
    cname = n.input[2]
    if beta != 1.0:
        if cname in ctx.consts:
            cname = _new_const(ctx, (ctx.consts[cname] * np.float32(beta)).astype(np.float32),
                               "beta_C")
        else:
            s = _new_const(ctx, np.asarray(beta, np.float32), "beta")
            t = ctx.tmp(cname)
            ctx.emit("Mul", [cname, s], [t], name=f"{ctx.node_name}/beta")
            cname = t
    ctx.emit("Add", [y, cname], [n.output[0]], name=f"{ctx.node_name}/bias")


def _new_const(ctx: _Ctx, value: np.ndarray, what: str) -> str:
    name = ctx.unique(f"{ctx.node_name}:{what}")
    ctx.consts[name] = value
    return name


def _matmul(ctx: _Ctx, n: onnx.NodeProto, a: dict) -> None:
    b = ctx.consts.get(n.input[1])
    if b is not None and b.ndim == 2 and len(ctx.shape(n.input[0])) >= 2:
        ctx.emit("Gemm", [n.input[0]], [n.output[0]], {}, {"kernel": b})
    else:
        ctx.emit("MatMul", [n.input[0], n.input[1]], [n.output[0]])


def _batchnorm(ctx: _Ctx, n: onnx.NodeProto, a: dict) -> None:
    if a.get("training_mode", 0) or len(n.output) > 1 and any(n.output[1:]):
        raise UnsupportedOpError("BatchNormalization in training mode (running-statistics "
                                 "outputs) is not supported; export the model for inference.")
    roles = ("scale", "bias", "mean", "var")
    params = {r: ctx.const(t, r) for r, t in zip(roles, n.input[1:5])}
    ctx.emit("BatchNormalization", [n.input[0]], [n.output[0]],
             {"axis": 1, "epsilon": float(a.get("epsilon", 1e-5))}, params)


def _clip(ctx: _Ctx, n: onnx.NodeProto, a: dict) -> None:
    if ctx.opset < 11:
        lo, hi = a.get("min"), a.get("max")
    else:
        lo, hi = ctx.opt_const(1, "min"), ctx.opt_const(2, "max")
        lo = None if lo is None else lo.item()
        hi = None if hi is None else hi.item()
    ctx.emit("Clip", [n.input[0]], [n.output[0]], {"min": lo, "max": hi})


def _simple(op: str, **defaults: Any):
    def conv(ctx: _Ctx, n: onnx.NodeProto, a: dict) -> None:
        attrs = {k: a.get(k, v) for k, v in defaults.items()}
        ctx.emit(op, list(n.input), list(n.output), attrs)

    return conv


def _softmax(ctx: _Ctx, n: onnx.NodeProto, a: dict) -> None:
    legacy = ctx.opset < 13
    ctx.emit("Softmax", [n.input[0]], [n.output[0]],
             {"axis": int(a.get("axis", 1 if legacy else -1)), "coerce_2d": legacy})


def _split(ctx: _Ctx, n: onnx.NodeProto, a: dict) -> None:
    rank = len(ctx.shape(n.input[0]))
    axis = int(a.get("axis", 0)) % rank
    dim = ctx.shape(n.input[0])[axis]
    sizes = a.get("split")
    if sizes is None:
        s = ctx.opt_const(1, "split")
        sizes = None if s is None else s.tolist()
    if sizes is None:
        k = int(a.get("num_outputs", len(n.output)))
        chunk = -(-dim // k)
        sizes = [min(chunk, dim - i * chunk) for i in range(k)]
    ctx.emit("Split", [n.input[0]], list(n.output), {"axis": axis, "sizes": [int(v) for v in
                                                                          sizes]})


def _slice(ctx: _Ctx, n: onnx.NodeProto, a: dict) -> None:
    shape = ctx.shape(n.input[0])
    if ctx.opset < 10:
        starts, ends = a["starts"], a["ends"]
        axes = a.get("axes", list(range(len(starts))))
        steps = [1] * len(starts)
    else:
        starts = ctx.const(n.input[1], "starts").tolist()
        ends = ctx.const(n.input[2], "ends").tolist()
        ax = ctx.opt_const(3, "axes")
        axes = list(range(len(starts))) if ax is None else ax.tolist()
        st = ctx.opt_const(4, "steps")
        steps = [1] * len(starts) if st is None else st.tolist()
    rs, re_, rax, rst = [], [], [], []
    for s, e, ax, st in zip(starts, ends, axes, steps):
        ax = int(ax) % len(shape)
        d = shape[ax]
        if st == 0:
            raise GraphError("Slice step must not be 0.")
        s = s + d if s < 0 else s
        e = e + d if e < 0 else e
        if st > 0:
            s, e = min(max(s, 0), d), min(max(e, 0), d)
        else:
            s, e = min(max(s, 0), d - 1), min(max(e, -1), d - 1)
        rax.append(ax)
        rs.append(int(s))
        re_.append(int(e))
        rst.append(int(st))
    ctx.emit("Slice", [n.input[0]], [n.output[0]],
             {"axes": rax, "starts": rs, "ends": re_, "steps": rst})


def _pool(ctx: _Ctx, n: onnx.NodeProto, a: dict) -> None:
    if len(n.output) > 1 and n.output[1]:
        raise UnsupportedOpError("MaxPool with the Indices output is not supported.")
    shape = ctx.shape(n.input[0])
    k = list(a["kernel_shape"])
    nsp = len(k)
    strides = list(a.get("strides", [1] * nsp))
    dil = list(a.get("dilations", [1] * nsp))
    eff = [(kk - 1) * d + 1 for kk, d in zip(k, dil)]
    auto = a.get("auto_pad", "NOTSET")
    ceil = bool(a.get("ceil_mode", 0))
    pads = _conv_pads(a, shape[2:], k, strides, dil)
    extra = []
    for size, e, s, (pb, pe) in zip(shape[2:], eff, strides, pads):
        if auto in ("SAME_UPPER", "SAME_LOWER"):
            out = -(-size // s)
        elif auto == "VALID":
            out = (size - e) // s + 1
        else:
            span = size + pb + pe - e
            out = (-(-span // s) if ceil else span // s) + 1
            if ceil and (out - 1) * s >= size + pb:
                out -= 1  # the last window must start inside the input or the begin padding
        extra.append(max(0, (out - 1) * s + e - (size + pb + pe)))
    attrs = {
        "window": [1, 1, *k], "strides": [1, 1, *strides],
        "padding": [[0, 0], [0, 0]] + [[pb, pe + x] for (pb, pe), x in zip(pads, extra)],
        "window_dilation": [1, 1, *dil],
    }
    if n.op_type == "AveragePool":
        attrs["count_include_pad"] = int(a.get("count_include_pad", 0))
        attrs["ceil_extra"] = [0, 0, *extra]
    ctx.emit(n.op_type, [n.input[0]], [n.output[0]], attrs)


def _reshape(ctx: _Ctx, n: onnx.NodeProto, a: dict) -> None:
    shape = [int(v) for v in ctx.const(n.input[1], "shape").tolist()]
    if a.get("allowzero", 0) and 0 in shape:
        raise UnsupportedOpError("Reshape with allowzero=1 and a 0 in the shape is not supported.")
    ctx.emit("Reshape", [n.input[0]], [n.output[0]], {"shape": shape})


def _axes(ctx: _Ctx, n: onnx.NodeProto, a: dict, idx: int) -> list[int] | None:
    if "axes" in a:
        return [int(v) for v in a["axes"]]
    v = ctx.opt_const(idx, "axes")
    return None if v is None else [int(x) for x in v.reshape(-1).tolist()]


def _squeeze(ctx: _Ctx, n: onnx.NodeProto, a: dict) -> None:
    shape = ctx.shape(n.input[0])
    axes = _axes(ctx, n, a, 1)
    axes = [i for i, d in enumerate(shape) if d == 1] if axes is None else \
        sorted(x % len(shape) for x in axes)
    ctx.emit("Squeeze", [n.input[0]], [n.output[0]], {"axes": axes})


def _unsqueeze(ctx: _Ctx, n: onnx.NodeProto, a: dict) -> None:
    rank = len(ctx.shape(n.input[0]))
    axes = _axes(ctx, n, a, 1) or []
    out_rank = rank + len(axes)
    ctx.emit("Unsqueeze", [n.input[0]], [n.output[0]],
             {"axes": sorted(x % out_rank for x in axes)})


def _transpose(ctx: _Ctx, n: onnx.NodeProto, a: dict) -> None:
    rank = len(ctx.shape(n.input[0]))
    perm = [int(p) for p in a.get("perm", list(range(rank))[::-1])]
    ctx.emit("Transpose", [n.input[0]], [n.output[0]], {"perm": perm})


def _reduce_mean(ctx: _Ctx, n: onnx.NodeProto, a: dict) -> None:
    rank = len(ctx.shape(n.input[0]))
    axes = _axes(ctx, n, a, 1)
    if not axes:
        if a.get("noop_with_empty_axes", 0):
            ctx.emit("Identity", [n.input[0]], [n.output[0]])
            return
        axes = list(range(rank))
    ctx.emit("ReduceMean", [n.input[0]], [n.output[0]],
             {"axes": sorted(x % rank for x in axes), "keepdims": int(a.get("keepdims", 1))})


def _pad(ctx: _Ctx, n: onnx.NodeProto, a: dict) -> None:
    rank = len(ctx.shape(n.input[0]))
    if ctx.opset < 11:
        pads, value = list(a["pads"]), float(a.get("value", 0.0))
        axes = list(range(rank))
    else:
        pads = ctx.const(n.input[1], "pads").tolist()
        v = ctx.opt_const(2, "constant_value")
        value = 0 if v is None else v.item()
        ax = ctx.opt_const(3, "axes")
        axes = list(range(rank)) if ax is None else [int(x) % rank for x in ax.tolist()]
    pairs = [[0, 0] for _ in range(rank)]
    for i, ax in enumerate(axes):
        pairs[ax] = [int(pads[i]), int(pads[i + len(axes)])]
    ctx.emit("Pad", [n.input[0]], [n.output[0]],
             {"pads": pairs, "mode": a.get("mode", "constant"), "value": value})


def _resize(ctx: _Ctx, n: onnx.NodeProto, a: dict) -> None:
    shape = ctx.shape(n.input[0])
    rank = len(shape)
    mode = a.get("mode", "nearest")
    if mode not in ("nearest", "linear"):
        raise UnsupportedOpError(f"Resize mode {mode!r} is not supported (nearest, linear are).")
    if a.get("antialias", 0):
        raise UnsupportedOpError("Resize with antialias=1 is not supported.")
    if a.get("keep_aspect_ratio_policy", "stretch") != "stretch":
        raise UnsupportedOpError("Resize keep_aspect_ratio_policy other than 'stretch' is not "
                                 "supported.")
    if ctx.opset < 11:
        scales, sizes = ctx.const(n.input[1], "scales"), None
        coord, nearest = "asymmetric", "floor"
    else:
        scales = ctx.opt_const(2, "scales")
        sizes = ctx.opt_const(3, "sizes")
        coord = a.get("coordinate_transformation_mode", "half_pixel")
        nearest = a.get("nearest_mode", "round_prefer_floor")
    if coord == "tf_crop_and_resize":
        raise UnsupportedOpError("Resize coordinate_transformation_mode 'tf_crop_and_resize' is "
                                 "not supported.")
    axes = [int(x) % rank for x in a.get("axes", range(rank))]
    full_scales, full_sizes = [1.0] * rank, list(shape)
    if sizes is not None and sizes.size:
        for ax, s in zip(axes, sizes.tolist()):
            full_sizes[ax] = int(s)
            full_scales[ax] = int(s) / shape[ax]
    elif scales is not None and scales.size:
        for ax, s in zip(axes, scales.tolist()):
            full_scales[ax] = float(s)
            full_sizes[ax] = int(math.floor(shape[ax] * float(s)))
    else:
        raise GraphError("Resize needs either scales or sizes.")
    ctx.emit("Resize", [n.input[0]], [n.output[0]], {
        "mode": mode, "coordinate_transformation_mode": coord, "nearest_mode": nearest,
        "scales": full_scales, "sizes": full_sizes,
    })


def _quantize_linear(ctx: _Ctx, n: onnx.NodeProto, a: dict) -> None:
    if a.get("block_size", 0):
        raise UnsupportedOpError("blocked QuantizeLinear (block_size > 0) is not supported.")
    scale = ctx.const(n.input[1], "y_scale")
    zp = ctx.opt_const(2, "y_zero_point")
    if zp is not None:
        dtype = zp.dtype
    elif "output_dtype" in a and a["output_dtype"]:
        dtype = helper.tensor_dtype_to_np_dtype(a["output_dtype"])
    else:
        dtype = np.dtype(np.uint8)
    if np.dtype(dtype).kind not in "iu":
        raise UnsupportedOpError(f"QuantizeLinear to {np.dtype(dtype)} is not supported "
                                 "(integer types only).")
    ins = [n.input[0], n.input[1]] + ([n.input[2]] if zp is not None else [])
    del scale
    ctx.emit("QuantizeLinear", ins, [n.output[0]],
             {"axis": int(a.get("axis", 1)), "dtype": str(np.dtype(dtype))})


def _dequantize_linear(ctx: _Ctx, n: onnx.NodeProto, a: dict) -> None:
    if a.get("block_size", 0):
        raise UnsupportedOpError("blocked DequantizeLinear (block_size > 0) is not supported.")
    ctx.const(n.input[1], "x_scale")
    zp = ctx.opt_const(2, "x_zero_point")
    ins = [n.input[0], n.input[1]] + ([n.input[2]] if zp is not None else [])
    ctx.emit("DequantizeLinear", ins, [n.output[0]], {"axis": int(a.get("axis", 1))})


def _cast(ctx: _Ctx, n: onnx.NodeProto, a: dict) -> None:
    dtype = np.dtype(helper.tensor_dtype_to_np_dtype(int(a["to"])))
    if dtype.kind not in "iufb":
        raise UnsupportedOpError(f"Cast to {dtype} is not supported.")
    ctx.emit("Cast", [n.input[0]], [n.output[0]], {"to": str(dtype)})


def _flatten(ctx: _Ctx, n: onnx.NodeProto, a: dict) -> None:
    rank = len(ctx.shape(n.input[0]))
    axis = int(a.get("axis", 1))
    ctx.emit("Flatten", [n.input[0]], [n.output[0]], {"axis": axis + rank if axis < 0 else axis})


def _concat(ctx: _Ctx, n: onnx.NodeProto, a: dict) -> None:
    rank = len(ctx.shape(n.input[0]))
    ctx.emit("Concat", list(n.input), [n.output[0]], {"axis": int(a["axis"]) % rank})


_CONVERTERS = {
    "Conv": _conv,
    "ConvTranspose": _conv_transpose,
    "Gemm": _gemm,
    "MatMul": _matmul,
    "BatchNormalization": _batchnorm,
    "Relu": _simple("Relu"),
    "Sigmoid": _simple("Sigmoid"),
    "Tanh": _simple("Tanh"),
    "Identity": _simple("Identity"),
    "HardSwish": _simple("HardSwish"),
    "LeakyRelu": _simple("LeakyRelu", alpha=0.01),
    "HardSigmoid": _simple("HardSigmoid", alpha=0.2, beta=0.5),
    "PRelu": _simple("PRelu"),
    "Clip": _clip,
    "Softmax": _softmax,
    "Add": _simple("Add"),
    "Sub": _simple("Sub"),
    "Mul": _simple("Mul"),
    "Div": _simple("Div"),
    "Max": _simple("Max"),
    "Min": _simple("Min"),
    "Concat": _concat,
    "Split": _split,
    "Slice": _slice,
    "MaxPool": _pool,
    "AveragePool": _pool,
    "GlobalAveragePool": _simple("GlobalAveragePool"),
    "Reshape": _reshape,
    "Flatten": _flatten,
    "Transpose": _transpose,
    "Squeeze": _squeeze,
    "Unsqueeze": _unsqueeze,
    "Pad": _pad,
    "Resize": _resize,
    "ReduceMean": _reduce_mean,
    "QuantizeLinear": _quantize_linear,
    "DequantizeLinear": _dequantize_linear,
    "Cast": _cast,
}

#: ONNX operators (default domain) that import as npujax nodes; ``Constant`` and shape
#: computations on constants are folded at import.
SUPPORTED_ONNX_OPS = frozenset(_CONVERTERS) | {"Constant"}

#: Ops whose constant inputs are weights (params), so they are never folded into a constant.
_WEIGHT_OPS = frozenset({"Conv", "ConvTranspose", "Gemm", "MatMul", "BatchNormalization"})


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
    feeds, vis, renamed = [], [], []
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
        elif None in dims:
            example = ",".join(str(d) if d is not None else "N" for d in dims)
            raise GraphError(
                f"model input {vi.name!r} has dynamic dimensions "
                f"{[d if d is not None else '?' for d in dims]}; pass its static shape, e.g. "
                f"from_onnx(path, input_shapes={{{vi.name!r}: ({example.replace(',', ', ')})}}) "
                f"or on the command line --input-shape {vi.name}={example} (with numbers for N)."
            )
        else:
            shape = tuple(dims)
        dtype = helper.tensor_dtype_to_np_dtype(tt.elem_type) if tt.elem_type else np.float32
        ctx.types[vi.name] = TensorType(shape, str(np.dtype(dtype)))
        names.append(vi.name)
    if given:
        raise GraphError(f"input_shapes names {sorted(given)}, which are not inputs of the model;"
                         f" its inputs are {names}.")
    return names


def from_onnx(
    path_or_model: str | os.PathLike[str] | bytes | onnx.ModelProto,
    input_shapes: Mapping[str, Sequence[int]] | None = None,
    *,
    unsupported: str = "error",
) -> tuple[Graph, Params]:
    """Import an ONNX model as ``(Graph, params)``, specialised to static input shapes.

    Args:
      path_or_model: path of a ``.onnx`` file (external data only from its folder), serialized
        bytes, or an ``onnx.ModelProto``.
      input_shapes: ``{input_name: shape}`` for inputs whose declared shape has dynamic
        dimensions (e.g. ``{"x": (1, 3, 48, 192)}``); also overrides fully static inputs.
      unsupported: ``"error"`` (default) raises on an operator npujax cannot execute;
        ``"fallback"`` keeps it as an opaque ``CpuFallback`` node (``attrs['onnx_op']``) with
        output shapes from ONNX shape inference, executed on the host by ``onnx.reference`` and
        costed by the NPU model as host-CPU fallback.

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
        tensor read before it is produced (missing initializer), a dynamic input dimension not
        given in ``input_shapes``.
      UnsupportedOpError: an operator (or an operator feature) npujax cannot execute, naming the
        node and the operator, unless ``unsupported="fallback"``.

    Example:
      >>> graph, params = from_onnx("cls.onnx", {"x": (1, 3, 48, 192)})  # doctest: +SKIP
      >>> y = npujax.quantize.execute(graph, params, x)  # doctest: +SKIP
    """
    if unsupported not in ("error", "fallback"):
        raise GraphError(f"unsupported={unsupported!r}; use 'error' or 'fallback'.")
    model = load_onnx_model(path_or_model)
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
        if (n.op_type not in _WEIGHT_OPS and n.domain in ("", "ai.onnx")
                and present and all(t in ctx.consts for t in present)):
            _fold(ctx, n)
            continue
        conv = _CONVERTERS.get(n.op_type) if n.domain in ("", "ai.onnx") else None
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

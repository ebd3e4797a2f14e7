"""Build a Graph from a Flax model by tracing it — the model is never rewritten.

The model is traced once with :func:`jax.make_jaxpr` on an example input. Calls of the standard
parameterised layers (``Conv``, ``Linear``/``Dense``, ``LinearGeneral``/``DenseGeneral``,
``BatchNorm``, ``LayerNorm``, ``RMSNorm``, ``Embed``; NNX and Linen) and of the functions
``jax.nn.gelu`` and ``jax.nn.softmax`` (also reached as ``nnx.gelu``, ``nn.softmax``, and from
``nnx.MultiHeadAttention``) are intercepted only to wrap them in a :func:`jax.named_scope` that
marks their equations; each marked group becomes one Graph node (``Gemm``, ``LayerNormalization``,
``Gelu``, ``Softmax``, ``Gather``, ...) carrying the module path as its name and the module's
parameters. Every other equation is mapped primitive by primitive onto Graph operators:

* ``dot_general`` of two activations (attention's ``Q K^T`` and ``P V``, any batch and
  contracting dimensions) becomes a ``MatMul``, with ``Transpose`` nodes (layout work, costed on
  the vector unit) where the operands are not in ``[batch..., M, K] x [batch..., K, N]`` order and
  ``Reshape`` nodes where several dimensions merge; by a constant it becomes a ``Gemm`` whose
  kernel is a param;
* ``select_n`` (masks) becomes ``Where``, ``broadcast_in_dim`` a ``Reshape`` and ``Expand``,
  ``slice``/``concatenate``/``split``/``pad`` their ONNX twins (rotary embeddings, head splits);
* the primitives that are not one ONNX operator are written with ones that are: ``rsqrt`` as
  ``Sqrt`` and ``Reciprocal``, ``square`` and ``integer_pow`` by 2 as ``Mul``, other integer
  powers as ``Pow``, ``erfc`` as ``1 - Erf``; ``stop_gradient`` is the identity at inference.

Calls (``jit``, ``custom_jvp``) are inlined. Equations that depend only on constants are folded
(a causal mask, rotary tables). The result is checked against the model's own output on the
example input, so a tracing mistake can never pass silently.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import re
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend import core as jex
from jax.typing import ArrayLike

from npujax.errors import GraphError, UnsupportedOpError
from npujax.frontends._patterns import fuse_hard_sigmoids, fuse_pools_relu6_means
from npujax.ir import absent
from npujax.ir.absent import AbsentArray, is_absent
from npujax.ir.execute import execute
from npujax.ir.graph import Graph, Node, Params, TensorType, fresh_name
from npujax.ops import OPS

__all__ = ["trace_flax"]

_MARK = "npujaxleaf"
#: XLA options of the programs the tracer compiles to run once (constant folding, the check
#: against the model): LLVM at -O0 compiles in about half the time; the float semantics (no
#: fast math) are unchanged
_RUN_ONCE = {"xla_backend_optimization_level": 0}
_MARK_RE = re.compile(_MARK + r"(\d+)")


@dataclasses.dataclass
class _Leaf:
    op: str
    path: str
    module: Any
    params: dict[str, np.ndarray]
    attrs: dict[str, Any]


def _value(v: Any) -> np.ndarray | AbsentArray | None:
    if v is None:
        return None
    if hasattr(v, "get_value"):
        v = v.get_value()
    if isinstance(v, jax.core.Tracer):  # a model traced with its weights' shapes only
        return AbsentArray(v.shape, np.float32, "a weight of a model traced without weights")
    return np.asarray(v, np.float32)


def _host(v: Any, dtype: Any = None) -> Any:
    """``v`` as a numpy array (of ``dtype``), or still absent (:mod:`npujax.ir.absent`)."""
    if is_absent(v):
        return v if dtype is None else v.astype(dtype)
    return np.asarray(v, dtype)


def _device(v: Any) -> Any:
    """``v`` on the device, or still absent (never allocated)."""
    return v if is_absent(v) else jax.device_put(v)


# --------------------------------------------------------------------------------------------
# Interception: wrap known layers in a marker scope, record module, path and parameters.


def _nnx_leaf_types() -> dict[type, str]:
    from flax import nnx

    return {nnx.Conv: "Conv", nnx.Linear: "Gemm", nnx.LinearGeneral: "Gemm",
            nnx.BatchNorm: "BatchNormalization", nnx.LayerNorm: "LayerNormalization",
            nnx.RMSNorm: "RMSNormalization", nnx.Embed: "Gather"}


def _norm_axis(m: Any, op: str) -> int | None:
    """The ONNX ``axis`` of a Flax LayerNorm/RMSNorm normalizing the trailing axes ``[axis,
    rank)`` with scale and bias on the same axes; None for any other configuration."""
    red, feat = m.reduction_axes, m.feature_axes
    red = (red,) if isinstance(red, int) else tuple(red)
    feat = (feat,) if isinstance(feat, int) else tuple(feat)
    if any(a >= 0 for a in red + feat) or sorted(red) != list(range(-len(red), 0)):
        return None
    if sorted(feat) != sorted(red) and not (op == "LayerNormalization" and feat == (-1,)
                                            and red == (-1,)):
        return None
    return min(red)


def _leaf_params(op: str, m: Any, get: Callable[[str], Any]) -> tuple[dict, dict] | None:
    """``(params, attrs)`` of a leaf layer (``get(name)`` reads its variables), or None when
    the layer's options have no single Graph operator (it is then traced primitive by
    primitive)."""
    if op == "BatchNormalization":
        return ({r: get(r) for r in ("scale", "bias", "mean", "var")},
                {"epsilon": float(m.epsilon), "axis": int(m.axis)})
    if op in ("LayerNormalization", "RMSNormalization"):
        axis = _norm_axis(m, op)
        if axis is None:
            return None
        names = ("scale", "bias") if op == "LayerNormalization" else ("scale",)
        return {r: get(r) for r in names}, {"epsilon": float(m.epsilon), "axis": axis}
    if op == "Gather":
        return {"table": get("embedding")}, {"axis": 0}
    return {"kernel": get("kernel"), "bias": get("bias")}, {}


def _nnx_leaf(op: str, path: str, m: Any) -> _Leaf | None:
    got = _leaf_params(op, m, lambda r: _value(getattr(m, r, None)))
    if got is None:
        return None
    params, attrs = got
    return _Leaf(op, path, m, {k: v for k, v in params.items() if v is not None}, attrs)


#: Functions intercepted like layers: ``(module, name)`` where they are looked up, and the op.
_FUNCTIONS = {"gelu": "Gelu", "softmax": "Softmax"}


def _function_attrs(op: str, args: tuple, kwargs: dict) -> dict | None:
    """The Graph attributes of an intercepted function call, or None to trace it primitive by
    primitive (options the Graph operator does not have)."""
    if op == "Gelu":
        approximate = kwargs.get("approximate", args[1] if len(args) > 1 else True)
        if set(kwargs) - {"approximate"} or len(args) > 2:
            return None
        return {"approximate": "tanh" if approximate else "none"}
    axis = kwargs.get("axis", args[1] if len(args) > 1 else -1)
    if isinstance(axis, tuple) and len(axis) == 1:
        axis = axis[0]
    if set(kwargs) - {"axis"} or len(args) > 2 or not isinstance(axis, int):
        return None  # softmax with where= (a mask inside the softmax) or several axes
    return {"axis": int(axis)}


@contextlib.contextmanager
def _intercept_functions(leaves: list[_Leaf]) -> Iterator[None]:
    """Wrap ``jax.nn.gelu``/``softmax`` (and their aliases in ``flax.nnx`` and ``flax.linen``)
    in marker scopes for the trace, and restore them after."""
    import flax.linen as nn
    from flax import nnx

    patched: list[tuple[Any, str, Any]] = []

    def make(op: str, orig: Callable) -> Callable:
        def wrapped(*args, **kwargs):
            attrs = _function_attrs(op, args, kwargs)
            if attrs is None:
                return orig(*args, **kwargs)
            leaves.append(_Leaf(op, "", None, {}, attrs))
            with jax.named_scope(f"{_MARK}{len(leaves) - 1}"):
                return orig(*args, **kwargs)

        return wrapped

    # jax.nn.dot_product_attention (which nnx.MultiHeadAttention calls) reaches softmax by
    # its name in jax's own module
    import jax._src.nn.functions as jax_nn_impl

    try:
        for name, op in _FUNCTIONS.items():
            orig = getattr(jax.nn, name)
            fn = make(op, orig)
            for mod in (jax.nn, nnx, nn, jax_nn_impl):
                if getattr(mod, name, None) is orig:
                    patched.append((mod, name, orig))
                    setattr(mod, name, fn)
        yield
    finally:
        for mod, name, orig in patched:
            setattr(mod, name, orig)


@contextlib.contextmanager
def _intercept_nnx(model: Any, leaves: list[_Leaf]) -> Iterator[None]:
    from flax import nnx

    types = _nnx_leaf_types()
    paths = {}
    for path, node in nnx.iter_graph(model):
        if type(node) in types:
            paths[id(node)] = "/".join(str(p) for p in path) or type(node).__name__
    originals = {cls: cls.__call__ for cls in types}

    def make(cls: type, orig: Callable) -> Callable:
        def wrapped(self, *args, **kwargs):
            leaf = _nnx_leaf(types[cls], paths[id(self)], self) if id(self) in paths else None
            if leaf is None:
                return orig(self, *args, **kwargs)
            leaves.append(leaf)
            with jax.named_scope(f"{_MARK}{len(leaves) - 1}"):
                return orig(self, *args, **kwargs)

        return wrapped

    try:
        for cls, orig in originals.items():
            # deliberate interception: the layer classes' __call__ is patched for the trace
            cls.__call__ = make(cls, orig)  # type: ignore[method-assign]
        yield
    finally:
        for cls, orig in originals.items():
            cls.__call__ = orig  # type: ignore[method-assign]  # (restored)


@contextlib.contextmanager
def _scope_nnx_modules(model: Any, scopes: dict[str, str]) -> Iterator[None]:
    """Run every submodule's ``__call__`` in a :func:`jax.named_scope` of its path for the
    trace (NNX pushes none), so the equations of a module's own code carry its path; records
    ``{name stack: module path}`` in ``scopes``. Nested modules push the part of their path
    below their caller's, so the name stack is the module path."""
    from flax import nnx

    paths: dict[int, str] = {}
    types: set[type] = set()
    for path, node in nnx.iter_graph(model):
        if isinstance(node, nnx.Module) and path:  # (the model itself: the top level)
            paths[id(node)] = "/".join(str(p) for p in path)
            scopes[paths[id(node)]] = paths[id(node)]
            types.add(type(node))
    types = {c for c in types if any("__call__" in k.__dict__ for k in c.__mro__[:-1])}
    originals = {c: (c.__dict__.get("__call__"), c.__call__) for c in types}
    stack: list[str] = [""]

    def make(orig: Callable) -> Callable:
        def wrapped(self, *args, **kwargs):
            path = paths.get(id(self))
            if path is None or path == stack[-1]:  # not in the model, or super().__call__
                return orig(self, *args, **kwargs)
            top = stack[-1]
            rel = path[len(top) + 1:] if top and path.startswith(top + "/") else path
            stack.append(path)
            try:
                with jax.named_scope(rel):
                    return orig(self, *args, **kwargs)
            finally:
                stack.pop()

        return wrapped

    try:
        for c, (_, orig) in originals.items():
            c.__call__ = make(orig)  # type: ignore[method-assign]  # (restored below)
        yield
    finally:
        for c, (own, _) in originals.items():
            if own is None:
                del c.__call__
            else:
                c.__call__ = own  # type: ignore[method-assign]


def _linen_module_scopes(model: Any, variables: Any) -> dict[str, str]:
    """``{name stack: module path}`` of a Linen model's submodules that hold variables (Linen
    names its modules' scopes ``<root>/<path>`` while ``flax_profile`` is on, the default)."""
    root = getattr(model, "name", None) or type(model).__name__
    out: dict[str, str] = {}

    def walk(d: Any, path: tuple[str, ...]) -> None:
        if path:
            out["/".join((root, *path))] = "/".join(path)
        if isinstance(d, Mapping):
            for k, v in d.items():
                if isinstance(v, Mapping):
                    walk(v, (*path, str(k)))

    for tree in (variables or {}).values():
        walk(tree, ())
    return out


def _scope_prefix(scope: str, scopes: Mapping[str, str]) -> str:
    """The base-name prefix of a node traced from an equation of name stack ``scope``:
    ``"<module path>/"`` of the innermost module it ran in (``scopes``: name stack -> module
    path), ``""`` at the top level; leaf markers and other scopes (an einsum's) are skipped."""
    parts = [p for p in scope.split("/") if p]
    best = ""
    for k in range(1, len(parts) + 1):
        best = scopes.get("/".join(parts[:k]), best)
    return f"{best}/" if best else ""


def _linen_interceptor(variables: Any, leaves: list[_Leaf]) -> Callable:
    import flax.linen as nn

    types = {nn.Conv: "Conv", nn.Dense: "Gemm", nn.DenseGeneral: "Gemm",
             nn.BatchNorm: "BatchNormalization", nn.LayerNorm: "LayerNormalization",
             nn.RMSNorm: "RMSNormalization", nn.Embed: "Gather"}

    def lookup(collection: str, path: tuple[str, ...]) -> dict:
        d = variables.get(collection, {})
        for p in path:
            d = d.get(p, {})
        return d

    def interceptor(next_fun, args, kwargs, context):
        m = context.module
        op = types.get(type(m))
        if op is None or context.method_name != "__call__":
            return next_fun(*args, **kwargs)
        path = tuple(m.path)
        p, stats = lookup("params", path), lookup("batch_stats", path)
        got = _leaf_params(op, m, lambda r: _value(stats.get(r) if r in ("mean", "var")
                                                    else p.get(r)))
        if got is None:
            return next_fun(*args, **kwargs)
        params, attrs = got
        leaves.append(_Leaf(op, "/".join(path) or type(m).__name__, m,
                            {k: v for k, v in params.items() if v is not None}, attrs))
        with jax.named_scope(f"{_MARK}{len(leaves) - 1}"):
            return next_fun(*args, **kwargs)

    return interceptor


# --------------------------------------------------------------------------------------------
# Flattening the jaxpr: inline calls, name every value.


@dataclasses.dataclass
class _Eqn:
    prim: Any
    params: dict[str, Any]
    ins: list[Any]  # tensor names (str) or _Const
    outs: list[str]
    scope: str


@dataclasses.dataclass(eq=False)
class _Const:
    # a numpy array, or an AbsentArray (a weight known by its shape only); None until
    # :meth:`_Flattener.fold` evaluates a folded equation
    value: Any


_CALL_PRIMS = {"pjit", "jit", "closed_call", "core_call", "custom_jvp_call", "custom_vjp_call",
               "remat", "checkpoint", "custom_lin"}


def _inner_jaxpr(eqn) -> Any:
    for key in ("jaxpr", "call_jaxpr", "fun_jaxpr"):
        j = eqn.params.get(key)
        if j is not None:
            return j
    return None


class _Flattener:
    def __init__(self) -> None:
        self.eqns: list[_Eqn] = []
        self.types: dict[str, TensorType] = {}
        self._ids = itertools.count()
        # equations of constants only, in order: (primitive, params, ins, outs), folded by fold()
        self.folded: list[tuple[Any, dict[str, Any], list[_Const], list[_Const]]] = []

    def fresh(self, aval) -> str:
        name = f"t{next(self._ids)}"
        self.types[name] = TensorType(tuple(int(d) for d in aval.shape), str(aval.dtype))
        return name

    def run(self, jaxpr, consts, env: dict, scope: str) -> None:
        for v, c in zip(jaxpr.constvars, consts):
            env[v] = _Const(np.asarray(c))
        for eqn in jaxpr.eqns:
            ins = [_Const(np.asarray(v.val)) if isinstance(v, jex.Literal) else env[v]
                   for v in eqn.invars]
            s = scope + "/" + str(eqn.source_info.name_stack)
            inner = _inner_jaxpr(eqn) if eqn.primitive.name in _CALL_PRIMS else None
            if inner is not None:
                closed = inner if hasattr(inner, "jaxpr") else jex.ClosedJaxpr(inner, ())
                sub_env = dict(zip(closed.jaxpr.invars, ins[-len(closed.jaxpr.invars):]))
                self.run(closed.jaxpr, closed.consts, sub_env, s)
                for o, io in zip(eqn.outvars, closed.jaxpr.outvars):
                    env[o] = (_Const(np.asarray(io.val)) if isinstance(io, jex.Literal)
                              else sub_env[io])
                continue
            if all(isinstance(i, _Const) for i in ins):
                # constant folding, evaluated by fold() once the whole jaxpr is flattened
                outs_c = [_Const(None) for _ in eqn.outvars]
                self.folded.append((eqn.primitive, dict(eqn.params), ins, outs_c))
                env.update(zip(eqn.outvars, outs_c))
                continue
            outs = [self.fresh(o.aval) for o in eqn.outvars]
            env.update(zip(eqn.outvars, outs))
            self.eqns.append(_Eqn(eqn.primitive, dict(eqn.params), ins, outs, s))


    def fold(self) -> None:
        """Evaluate the constant-only equations (a causal mask, rotary tables, a kernel's
        reshape) as ONE jitted program, the known constants as its arguments: evaluating them
        one by one compiled an XLA program per primitive and shape (seconds for a small
        transformer)."""
        if not self.folded:
            return
        # equations on weights known by their shapes only fold abstractly (npujax.ir.absent)
        absent_ids: set[int] = set()
        folded = []
        for prim, params, ins, outs in self.folded:
            if any(id(c) in absent_ids or is_absent(c.value) for c in ins):
                for o, v in zip(outs, absent.bind(prim, [c.value for c in ins], params,
                                                  "a value folded from a model's weights")):
                    o.value = v
                    absent_ids.add(id(o))
            else:
                folded.append((prim, params, ins, outs))
        self.folded = []
        if not folded:
            return
        known: dict[int, int] = {}  # id(_Const) -> argument index
        args: list[np.ndarray] = []
        for _, _, ins, _ in folded:
            for c in ins:
                if c.value is not None and id(c) not in known:
                    known[id(c)] = len(args)
                    args.append(c.value)

        def evaluate(vals: list[jax.Array]) -> list[jax.Array]:
            env: dict[int, jax.Array] = {}
            results: list[jax.Array] = []
            for prim, params, ins, outs in folded:
                res = prim.bind(*[vals[known[id(c)]] if id(c) in known else env[id(c)]
                                  for c in ins], **params)
                res = res if prim.multiple_results else [res]
                env.update(zip((id(o) for o in outs), res))
                results.extend(res)
            return results

        values = jax.jit(evaluate, compiler_options=_RUN_ONCE)(args)
        for o, v in zip((o for _, _, _, outs in folded for o in outs), values):
            o.value = np.asarray(v)


# --------------------------------------------------------------------------------------------
# Mapping groups and primitives to Graph nodes.


def _layout(spec: tuple[int, ...], letters: str) -> str:
    out = [""] * len(spec)
    for letter, dim in zip(letters, spec):
        out[dim] = letter
    return "".join(out)


def _conv_attrs(e: _Eqn, path: str) -> dict[str, Any]:
    dn = e.params["dimension_numbers"]
    if len(dn.lhs_spec) != 4:
        raise UnsupportedOpError(
            f"layer {path!r}: only 2-D convolutions are supported, got a "
            f"{len(dn.lhs_spec) - 2}-D one."
        )
    if e.params.get("batch_group_count", 1) != 1:
        raise UnsupportedOpError(f"layer {path!r}: batch_group_count != 1 is not supported.")
    return {
        "data_layout": _layout(dn.lhs_spec, "NCHW"),
        "kernel_layout": _layout(dn.rhs_spec, "OIHW"),
        "strides": [int(s) for s in e.params["window_strides"]],
        "padding": [[int(a), int(b)] for a, b in e.params["padding"]],
        "dilations": [int(d) for d in e.params["rhs_dilation"]],
        "lhs_dilation": [int(d) for d in e.params["lhs_dilation"]],
        "groups": int(e.params["feature_group_count"]),
    }


_GROUP_PRIMS: dict[str, set[str] | None] = {
    "Conv": {"conv_general_dilated", "reshape", "add", "broadcast_in_dim", "convert_element_type"},
    "Gemm": {"dot_general", "reshape", "add", "broadcast_in_dim", "convert_element_type"},
    "BatchNormalization": {"reshape", "sub", "add", "mul", "rsqrt", "broadcast_in_dim",
                           "convert_element_type", "div", "sqrt"},
    # normalizations, embeddings and the functions compute with many primitives; the check
    # against the model's output at the end of the trace is their test
    "LayerNormalization": None, "RMSNormalization": None, "Gather": None, "Gelu": None,
    "Softmax": None,
}


def _leaf_nodes(leaf: _Leaf, eqns: list[_Eqn], ext_in: list[str], ext_out: list[str],
                b: _Builder) -> tuple[list[Node], int, dict[str, np.ndarray]]:
    """The Graph nodes of one intercepted layer or function (a ``LinearGeneral`` may need a
    Reshape on either side of its Gemm), the index of the main node and its params."""
    what = f"layer {leaf.path!r} ({type(leaf.module).__name__})" if leaf.module is not None \
        else f"jax.nn.{leaf.op.lower()}"
    allowed = _GROUP_PRIMS[leaf.op]
    extra = {e.prim.name for e in eqns} - allowed if allowed is not None else set()
    if extra:
        raise UnsupportedOpError(
            f"{what} computes with {sorted(extra)}, which npujax's {leaf.op} node does not "
            "model (e.g. circular padding, masking or precision options); use standard options "
            "or file an issue with the model."
        )
    if len(ext_in) != 1 or len(ext_out) != 1:
        raise UnsupportedOpError(
            f"{what} must read one activation and write one output, it reads "
            f"{len(ext_in)} and writes {len(ext_out)}."
        )
    name = leaf.path or b.name(leaf.op.lower())
    attrs = dict(leaf.attrs)
    params = dict(leaf.params)
    x, y = ext_in[0], ext_out[0]
    pre: list[Node] = []
    post: list[Node] = []
    if leaf.op == "Conv":
        (conv,) = [e for e in eqns if e.prim.name == "conv_general_dilated"]
        attrs.update(_conv_attrs(conv, leaf.path))
        attrs["kernel_shape"] = [int(d) for d in leaf.params["kernel"].shape]
    elif leaf.op == "Gemm":
        (dot,) = [e for e in eqns if e.prim.name == "dot_general"]
        (lc, rc), (lb, rb) = dot.params["dimension_numbers"]
        kernel = leaf.params["kernel"]
        xs = b.types[x].shape
        nc = len(lc)
        if (lb or rb or tuple(rc) != tuple(range(nc))
                or sorted(int(a) for a in lc) != list(range(len(xs) - nc, len(xs)))):
            raise UnsupportedOpError(
                f"{what}: only dense layers contracting the input's trailing axes with the "
                "kernel's leading axes (no batch axes) are supported.")
        k = int(np.prod(kernel.shape[:nc]))
        out_features = tuple(int(d) for d in kernel.shape[nc:])
        n = int(np.prod(out_features))
        # the contracted input axes in the kernel's order
        order = [int(a) for a in lc]
        if order != sorted(order):
            perm = list(range(len(xs) - nc)) + order
            t = b.tensor(tuple(xs[i] for i in perm), b.types[x].dtype)
            pre.append(Node(f"{name}/in_transpose", "Transpose", (x,), (t,), {"perm": perm}))
            x = t
        lead = tuple(b.types[x].shape[:len(xs) - nc])
        if nc != 1:
            t = b.tensor(lead + (k,), b.types[x].dtype)
            pre.append(Node(f"{name}/in_reshape", "Reshape", (x,), (t,),
                            {"shape": b.reshape_attr(lead + (k,), b.types[x].shape)}))
            x = t
        params["kernel"] = kernel.reshape(k, n)
        if "bias" in params:
            params["bias"] = params["bias"].reshape(n)
        if len(out_features) != 1:
            t = b.tensor(lead + (n,), b.types[y].dtype)
            post.append(Node(f"{name}/out_reshape", "Reshape", (t,), (y,),
                             {"shape": b.reshape_attr(lead + out_features, lead + (n,))}))
            y = t
    elif leaf.module is None and b.types[x].shape != b.types[y].shape:
        # a function under vmap (e.g. softmax inside jax.nn.dot_product_attention) may move
        # the mapped axis: the op on the input as it is, then that transpose
        perms = [e.params["permutation"] for e in eqns if e.prim.name == "transpose"
                 and e.ins[0] == ext_in[0] and len(e.params["permutation"]) == len(
                     b.types[x].shape)]
        if not perms:
            raise UnsupportedOpError(f"{what} changes the shape of its input.")
        perm = [int(a) for a in perms[0]]
        t = b.tensor(b.types[x].shape, b.types[y].dtype)
        post.append(Node(f"{name}/transpose", "Transpose", (t,), (y,), {"perm": perm}))
        y = t
    if leaf.op == "Softmax":  # the reduced axis, also when vmap moved it
        axes = [e.params["axes"] for e in eqns if e.prim.name == "reduce_max"
                and e.ins[0] == ext_in[0]]
        if len(axes) == 1 and len(axes[0]) == 1:
            attrs["axis"] = int(axes[0][0])
    main = Node(name, leaf.op, (x,), (y,), attrs, tuple(params))
    return [*pre, main, *post], len(pre), params


#: JAX primitives that map one to one onto a registered operator (``OpDef.jax_primitives``).
_PRIMITIVE_OPS = {prim: d.name for d in OPS.values() for prim in d.jax_primitives}
#: Elementwise primitives without a registered operator, kept as exact ``JaxPrimitive`` nodes
#: (those with one, e.g. exp or erf, map through ``OpDef.jax_primitives`` first; rsqrt, square,
#: integer_pow and erfc are written with ONNX operators by ``_Builder.primitive``).
_UNARY_PRIMS = {"sign", "floor", "ceil", "round", "sin", "cos", "log1p", "expm1", "erf_inv",
                "is_finite"}
#: Primitives that are the identity at inference.
_IDENTITY_PRIMS = {"convert_element_type", "copy", "copy_p", "optimization_barrier",
                   "stop_gradient", "reduce_precision"}


def _window_attrs(e: _Eqn) -> dict[str, Any]:
    if any(d != 1 for d in e.params["base_dilation"]) or any(
        d != 1 for d in e.params["window_dilation"]
    ):
        raise UnsupportedOpError("dilated pooling windows are not supported.")
    return {
        "window": [int(w) for w in e.params["window_dimensions"]],
        "strides": [int(s) for s in e.params["window_strides"]],
        "padding": [[int(a), int(b)] for a, b in e.params["padding"]],
    }


def _scope_label(scope: str) -> tuple[str | None, bool]:
    """The innermost :func:`jax.named_scope` of an equation's scope (the markers left out), and
    whether it is the outermost one (the model's own, not a layer's)."""
    names = [c for c in scope.split("/") if c and not _MARK_RE.fullmatch(c)]
    return (names[-1] if names else None), len(names) == 1


class _Builder:
    def __init__(self, types: dict[str, TensorType], batch: int,
                 scope_names: bool = False) -> None:
        self.nodes: list[Node] = []
        self.taken: set[str] = set()  # the names of ``nodes``
        self.constants: dict[str, np.ndarray] = {}
        self.params: Params = {}
        self.types = types
        self.batch = batch
        self.alias: dict[str, str] = {}
        self.scope_names = scope_names
        #: with ``scope_names``: the label (:func:`_scope_label`) of the equation being built,
        #: and whether it is the outermost scope
        self.scope: str | None = None
        self.scope_outer = False
        self.prefix = ""  # the module path of the equation being mapped (_scope_prefix)
        self._counts: dict[str, int] = {}
        self._tensors = itertools.count()

    def name(self, base: str) -> str:
        """A new node's name: ``<prefix><base>_<k>`` (``prefix`` the module path, or empty),
        or with ``scope_names`` the scope's label, else ``<label>/<base>``
        (``<label>/<base>_1``, ...; always so in the outermost scope, the model's, which many
        nodes share)."""
        if self.scope_names and self.scope:
            first = (self.scope if self.scope not in self.taken and not self.scope_outer
                     else f"{self.scope}/{base}")
            return fresh_name(first, set(self.taken))
        base = self.prefix + base
        k = self._counts.get(base, 0)
        self._counts[base] = k + 1
        return f"{base}_{k}"

    def tensor(self, shape: tuple[int, ...], dtype: str) -> str:
        """A new intermediate tensor of the given type."""
        name = f"u{next(self._tensors)}"
        self.types[name] = TensorType(tuple(int(d) for d in shape), str(dtype))
        return name

    def reshape_attr(self, shape: tuple[int, ...], src: tuple[int, ...]) -> list[int]:
        """A Reshape's ``shape`` from ``src``, keeping a leading batch dimension (ONNX's 0)."""
        out = [int(d) for d in shape]
        if out and src and out[0] == src[0] == self.batch:
            out[0] = 0
        return out

    def ref(self, x: Any) -> str:
        if isinstance(x, _Const):
            name = f"const_{len(self.constants)}"
            self.constants[name] = _host(x.value)
            self.types[name] = TensorType(tuple(x.value.shape), str(x.value.dtype))
            return name
        return self.alias.get(x, x)

    def shape(self, x: Any) -> tuple[int, ...]:
        return tuple(x.value.shape) if isinstance(x, _Const) else self.types[self.ref(x)].shape

    def dtype(self, x: Any) -> str:
        return str(x.value.dtype) if isinstance(x, _Const) else self.types[self.ref(x)].dtype

    def add(self, op: str, ins: list[Any], outs: list[str], attrs=None, base=None,
            params=None) -> None:
        name = self.name(base or op.lower())
        self.nodes.append(Node(name, op, tuple(self.ref(i) for i in ins), tuple(outs),
                               attrs or {}, tuple(params or ())))
        self.taken.add(name)
        if params:
            self.params[name] = {k: _device(v) for k, v in params.items()}

    def step(self, op: str, ins: list[Any], shape: tuple[int, ...], dtype: str, attrs=None,
             base=None) -> str:
        """Add a node with one new intermediate output; returns the output's name."""
        t = self.tensor(shape, dtype)
        self.add(op, ins, [t], attrs, base)
        return t

    # -- dot_general

    def _operand(self, x: Any, perm: list[int], shape: tuple[int, ...], base: str) -> Any:
        """``x`` transposed by ``perm`` and reshaped to ``shape``: numpy for a constant, else
        Transpose/Reshape nodes (only where needed)."""
        if isinstance(x, _Const):
            return _Const(np.ascontiguousarray(np.transpose(x.value, perm)).reshape(shape))
        src = self.shape(x)
        if perm != sorted(perm):
            x = self.step("Transpose", [x], tuple(src[i] for i in perm), self.dtype(x),
                          {"perm": perm}, base=f"{base}_transpose")
        if self.shape(x) != tuple(shape):
            x = self.step("Reshape", [x], shape, self.dtype(x),
                          {"shape": self.reshape_attr(shape, self.shape(x))},
                          base=f"{base}_reshape")
        return x

    def dot_general(self, e: _Eqn) -> None:
        """``dot_general`` as ``[batch..., M, K] x [batch..., K, N]``: a MatMul of two
        activations, or a Gemm when the second operand is a constant 2-D kernel."""
        (lc, rc), (lb, rb) = e.params["dimension_numbers"]
        lc, rc, lb, rb = ([int(a) for a in v] for v in (lc, rc, lb, rb))
        lhs, rhs = e.ins
        ls, rs = self.shape(lhs), self.shape(rhs)
        lf = [i for i in range(len(ls)) if i not in lc and i not in lb]
        rf = [i for i in range(len(rs)) if i not in rc and i not in rb]
        batch = tuple(ls[i] for i in lb)
        size = lambda s, ax: int(np.prod([s[i] for i in ax], dtype=np.int64))  # noqa: E731
        M, K, N = size(ls, lf), size(ls, lc), size(rs, rf)
        out = e.outs[0]
        out_shape = self.types[out].shape
        dtype = self.types[out].dtype
        if isinstance(lhs, _Const) and not isinstance(rhs, _Const):
            raise UnsupportedOpError(
                f"dot_general of a constant by an activation (in scope "
                f"{e.scope.strip('/') or '<top>'}) is not supported; write it activation first.")
        rhs2 = self._operand(rhs, rb + rc + rf, batch + (K, N), "matmul_b")
        if isinstance(rhs2, _Const) and not batch:
            # activation x constant kernel: a Gemm over the flattened leading dimensions
            lhs2 = self._operand(lhs, lf + lc, tuple(ls[i] for i in lf) + (K,), "gemm_in")
            lead = tuple(ls[i] for i in lf)
            y = out if lead + (N,) == out_shape else self.tensor(lead + (N,), dtype)
            self.add("Gemm", [lhs2], [y], {}, base="gemm",
                     params={"kernel": _host(rhs2.value, np.float32)})
            if y != out:
                self.add("Reshape", [y], [out],
                         {"shape": self.reshape_attr(out_shape, lead + (N,))})
            return
        lhs2 = self._operand(lhs, lb + lf + lc, batch + (M, K), "matmul_a")
        mm = batch + (M, N)
        y = out if mm == out_shape else self.tensor(mm, dtype)
        self.add("MatMul", [lhs2, rhs2], [y])
        if y != out:
            self.add("Reshape", [y], [out], {"shape": self.reshape_attr(out_shape, mm)})

    # -- everything else

    def primitive(self, e: _Eqn) -> None:
        p = e.prim.name
        ins, outs = e.ins, e.outs
        if p in _IDENTITY_PRIMS:
            if isinstance(ins[0], str):
                self.alias[outs[0]] = self.ref(ins[0])
                return
        if p == "max" and any(
            isinstance(i, _Const) and i.value.size == 1 and float(i.value) == 0.0 for i in ins
        ):
            x = [i for i in ins if isinstance(i, str)][0]
            return self.add("Relu", [x], outs)
        if p in _PRIMITIVE_OPS:
            return self.add(_PRIMITIVE_OPS[p], ins, outs)
        if p == "dot_general":
            return self.dot_general(e)
        x = ins[0]
        out_type = self.types[outs[0]]
        shape, dtype = out_type.shape, out_type.dtype
        if p == "rsqrt":
            t = self.step("Sqrt", [x], shape, dtype, base="rsqrt_sqrt")
            return self.add("Reciprocal", [t], outs, base="rsqrt")
        if p == "square" or (p == "integer_pow" and e.params["y"] == 2):
            return self.add("Mul", [x, x], outs, base=p)
        if p == "integer_pow":
            y = int(e.params["y"])
            if y == -1:
                return self.add("Reciprocal", [x], outs, base=p)
            return self.add("Pow", [x, _Const(np.asarray(y, np.float32))], outs, base=p)
        if p == "erfc":
            t = self.step("Erf", [x], shape, dtype, base="erfc_erf")
            return self.add("Sub", [_Const(np.asarray(1.0, np.float32)), t], outs, base="erfc")
        if p == "select_n" and len(ins) == 3:
            return self.add("Where", [ins[0], ins[2], ins[1]], outs)
        if p == "broadcast_in_dim":
            dims = [int(d) for d in e.params["broadcast_dimensions"]]
            src = self.shape(x)
            unit = [1] * len(shape)
            for d, n in zip(dims, src):
                unit[d] = n
            if tuple(unit) != src and int(np.prod(src)) == int(np.prod(unit)) and dims == sorted(
                    dims):
                x = self.step("Reshape", [x], tuple(unit), dtype,
                              {"shape": self.reshape_attr(tuple(unit), src)}) \
                    if tuple(unit) != shape else x
            elif tuple(unit) != src:
                raise UnsupportedOpError(f"broadcast_in_dim with dimensions {dims} reorders axes.")
            if tuple(unit) == shape:
                if x is ins[0]:
                    return self.add("Reshape", [x], outs,
                                    {"shape": self.reshape_attr(shape, src)})
                self.alias[outs[0]] = self.ref(x)
                return
            expand = [1 if u == s else s for u, s in zip(unit, shape)]
            return self.add("Expand", [x], outs, {"shape": expand})
        if p == "slice":
            st = e.params["strides"] or [1] * len(e.params["start_indices"])
            axes, starts, ends, steps = [], [], [], []
            for ax, (a, z, k) in enumerate(zip(e.params["start_indices"],
                                               e.params["limit_indices"], st)):
                if (a, z, k) != (0, self.shape(x)[ax], 1):
                    axes.append(ax)
                    starts.append(int(a))
                    ends.append(int(z))
                    steps.append(int(k))
            return self.add("Slice", [x], outs,
                            {"axes": axes, "starts": starts, "ends": ends, "steps": steps})
        if p == "concatenate":
            return self.add("Concat", list(ins), outs, {"axis": int(e.params["dimension"])})
        if p == "split":
            return self.add("Split", [x], outs, {"axis": int(e.params["axis"]),
                                                 "sizes": [int(v) for v in e.params["sizes"]]})
        if p == "pad" and isinstance(ins[1], _Const):
            cfg = e.params["padding_config"]
            if all(int(i) == 0 for _, _, i in cfg):
                return self.add("Pad", [x], outs, {
                    "pads": [[int(lo), int(hi)] for lo, hi, _ in cfg], "mode": "constant",
                    "value": float(ins[1].value)})
        if p == "reduce_window_max":
            return self.add("MaxPool", ins, outs, _window_attrs(e))
        if p == "reduce_window_sum":
            return self.add("SumPool", ins, outs, _window_attrs(e))
        if p == "reshape":
            new = [int(d) for d in e.params["new_sizes"]]
            src = self.types[self.ref(ins[0])].shape
            if src and new and src[0] == new[0] == self.batch:
                new[0] = 0  # keep the batch dimension (ONNX Reshape "copy" semantics)
            return self.add("Reshape", ins[:1], outs, {"shape": new})
        if p == "transpose":
            perm = [int(a) for a in e.params["permutation"]]
            return self.add("Transpose", ins, outs, {"perm": perm})
        if p in ("reduce_sum", "reduce_max"):
            op = "ReduceSum" if p == "reduce_sum" else "ReduceMax"
            return self.add(op, ins, outs, {"axes": [int(a) for a in e.params["axes"]],
                                            "keepdims": False})
        if p == "squeeze":
            new = list(shape)
            if new and new[0] == self.batch:
                new[0] = 0
            return self.add("Reshape", ins, outs, {"shape": new}, base="squeeze")
        if p in _UNARY_PRIMS or (p == "clamp"):
            if p == "clamp" and isinstance(ins[0], _Const) and isinstance(ins[2], _Const):
                return self.add("Clip", [ins[1]], outs,
                                {"min": float(ins[0].value), "max": float(ins[2].value)})
            return self.add("JaxPrimitive", ins, outs,
                            {"primitive": e.prim, "primitive_params": e.params}, base=p)
        raise UnsupportedOpError(
            f"JAX primitive {p!r} (in scope {e.scope.strip('/') or '<top>'}) has no npujax "
            "Graph operator; it may depend on the batch size or be outside the supported set. "
            "Express it with standard layers/ops or file an issue naming the primitive."
        )


def _fuse_average_pools(nodes: list[Node], graph_outputs: set[str], constants) -> list[Node]:
    """SumPool followed by division by the window size is an AveragePool (flax's avg_pool)."""
    out: list[Node] = []
    by_output: dict[str, Node] = {}
    for n in nodes:
        if n.op == "Div" and n.inputs[0] in by_output and n.inputs[1] in constants:
            pool = by_output[n.inputs[0]]
            divisor = np.asarray(constants[n.inputs[1]])
            users = [m for m in nodes if pool.outputs[0] in m.inputs]
            if (divisor.size == 1
                    and float(divisor.reshape(())) == float(np.prod(pool.attrs["window"]))
                    and len(users) == 1 and pool.outputs[0] not in graph_outputs):
                idx = out.index(pool)
                out[idx] = Node(pool.name.replace("sumpool", "avgpool"), "AveragePool",
                                pool.inputs, n.outputs, pool.attrs)
                continue
        if n.op == "SumPool":
            by_output[n.outputs[0]] = n
        out.append(n)
    return out


def _argument_name(model: Any) -> str:
    """The name of the first argument of the model's ``__call__`` (``"x"`` if unnamed)."""
    import inspect

    try:
        params = list(inspect.signature(type(model).__call__).parameters.values())[1:]
    except (TypeError, ValueError):
        params = []
    ok = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return ok[0] if ok and ok[0].isidentifier() else "x"


def _name_interface(graph: Graph, input_name: str) -> Graph:
    """``graph`` with its input named after the model's argument and its outputs ``output``
    (``output_0``, ``output_1``, ... for several), so exports carry meaningful names."""
    taken = set(graph.tensors) | {n.name for n in graph.nodes}
    ins = [input_name] if len(graph.inputs) == 1 else [
        f"{input_name}_{i}" for i in range(len(graph.inputs))]
    outs = ["output"] if len(graph.outputs) == 1 else [
        f"output_{i}" for i in range(len(graph.outputs))]
    rename: dict[str, str] = {}
    for old, new in zip((*graph.inputs, *graph.outputs), ins + outs):
        if old not in rename and old not in graph.constants:
            rename[old] = fresh_name(new, taken)
    r = lambda t: rename.get(t, t)  # noqa: E731
    nodes = tuple(n.replace(inputs=tuple(map(r, n.inputs)), outputs=tuple(map(r, n.outputs)))
                  for n in graph.nodes)
    tensors = {r(k): v for k, v in graph.tensors.items()}
    return graph.replace(nodes=nodes, inputs=tuple(map(r, graph.inputs)),
                         outputs=tuple(map(r, graph.outputs)), tensors=tensors)


def trace_flax(
    model: Any,
    example_input: ArrayLike,
    *,
    variables: Any = None,
    check: bool = True,
    weights: str = "values",
    **apply_kwargs: Any,
) -> tuple[Graph, Params]:
    """Trace a Flax model into a :class:`Graph` and its params pytree.

    Args:
      model: an ``flax.nnx.Module`` (traced in eval mode on a copy, the original is untouched) or
        a ``flax.linen.Module`` (then ``variables`` is required; BatchNorm must be called with
        ``use_running_average=True`` via ``apply_kwargs``, e.g. ``train=False``).
      example_input: array ``(batch, ...)``, float (converted to float32) or integer (token
        ids, kept); fixes the non-batch shapes of the graph.
      variables: Linen variables ``{"params": ..., "batch_stats": ...}``.
      check: run the graph on ``example_input`` and compare with the model (recommended; both
        run jitted, one compile each, with the weights as arguments).
      weights: ``"values"`` (default), or ``"shapes"`` (an ``nnx.Module``, which may be
        abstract, e.g. from ``nnx.eval_shape``): the weights are traced by their shapes only and
        never allocated; ``params`` then hold :class:`~npujax.ir.absent.AbsentArray` leaves,
        for what needs only shapes (:func:`npujax.lower`; an LLM decoder), and
        :func:`npujax.execute` refuses them (``check`` is skipped).
      **apply_kwargs: extra keyword arguments for the Linen ``apply``.

    Returns:
      ``(graph, params)``: node names are module paths (``conv1``, ``block/bn``) for layers and
      ``<module path>/<op>_<k>`` for ops traced primitive by primitive in a submodule's
      ``__call__`` (``blocks/0/attn/matmul_0``: a rule ``attn/.*`` reaches them; ``<op>_<k>`` in
      the model's own; Linen: the innermost module with variables, while Linen's
      ``flax_profile`` names its scopes, the default); the input tensor is named after the
      model's call argument (``x``), the output ``output`` (``output_<i>`` for several); params
      are ``{node: {role: float32 array}}``.

    Raises:
      UnsupportedOpError: a primitive or layer option has no Graph operator (names it).
      GraphError: the traced graph does not reproduce the model's output.
    """
    x = jnp.asarray(example_input)
    if not jnp.issubdtype(x.dtype, jnp.integer):
        x = x.astype(jnp.float32)  # token ids stay integers
    leaves: list[_Leaf] = []
    scopes: dict[str, str] = {}  # name stack -> module path (_scope_prefix)
    from flax import nnx  # (flax >= 0.11, a dependency, always has nnx)

    if weights not in ("values", "shapes"):
        raise GraphError(f"weights={weights!r}; use 'values' or 'shapes'.")
    if weights == "shapes":
        if not isinstance(model, nnx.Module):
            raise GraphError("trace_flax(weights='shapes') traces an nnx.Module.")
        graphdef, state = nnx.split(model)
        specs = jax.tree.map(lambda v: jax.ShapeDtypeStruct(v.shape, v.dtype), state)

        def abstract_fn(inp, st):
            m = nnx.merge(graphdef, st)  # (the weights are the trace's abstract arguments)
            m.eval()
            with _scope_nnx_modules(m, scopes), _intercept_nnx(m, leaves), \
                    _intercept_functions(leaves):
                return m(inp)

        return _trace_jaxpr(abstract_fn, x, leaves, reference=lambda inp: None,
                            source="flax.nnx", input_name=_argument_name(model), check=False,
                            scopes=scopes, weights=specs)
    if isinstance(model, nnx.Module):
        model = nnx.clone(model)
        model.eval()
        source = "flax.nnx"

        def fn(inp):
            with _scope_nnx_modules(model, scopes), _intercept_nnx(model, leaves), \
                    _intercept_functions(leaves):
                return model(inp)

        graphdef, state = nnx.split(model)
        # jitted with the state as an argument: one compiled program instead of one per
        # primitive, and no weights baked into it as constants
        run_model = jax.jit(lambda st, inp: nnx.merge(graphdef, st)(inp),
                            compiler_options=_RUN_ONCE)
        reference = lambda inp: run_model(state, inp)  # noqa: E731
    else:
        import flax.linen as nn

        if not isinstance(model, nn.Module) or variables is None:
            raise GraphError(
                "trace_flax needs an nnx.Module, or a linen.Module together with variables=; "
                f"got {type(model).__name__} and variables={'set' if variables else 'None'}."
            )
        source = "flax.linen"
        scopes.update(_linen_module_scopes(model, variables))
        interceptor = _linen_interceptor(variables, leaves)

        def fn(inp):
            with nn.intercept_methods(interceptor), _intercept_functions(leaves):
                return model.apply(variables, inp, **apply_kwargs)

        run_apply = jax.jit(lambda v, inp: model.apply(v, inp, **apply_kwargs),
                            compiler_options=_RUN_ONCE)
        reference = lambda inp: run_apply(variables, inp)  # noqa: E731

    return _trace_jaxpr(fn, x, leaves, reference=reference, source=source,
                        input_name=_argument_name(model), check=check, scopes=scopes)


def _trace_jaxpr(
    fn: Callable[..., Any],
    x: jax.Array,
    leaves: list[_Leaf],
    *,
    reference: Callable[[jax.Array], Any],
    source: str,
    input_name: str,
    check: bool,
    scope_names: bool = False,
    peepholes: bool = False,
    scopes: Mapping[str, str] | None = None,
    weights: Any = None,
) -> tuple[Graph, Params]:
    """The tracer's core, shared by the frontends: ``fn`` (the model with its layers
    intercepted, appending to ``leaves``) traced on ``x`` into a Graph and its params.

    Args:
      fn: the model as a function of one array; intercepted layers and functions run inside a
        ``npujaxleaf<k>`` :func:`jax.named_scope`, ``k`` their index in ``leaves``.
      x: the example input.
      leaves: filled by ``fn`` while it is traced.
      reference: the model itself (jitted), for the check.
      source: the Graph's ``source``.
      input_name: the name of the graph's input tensor.
      check: compare the graph's output on ``x`` with ``reference``'s.
      scope_names: name the nodes that are not intercepted layers after the innermost
        :func:`jax.named_scope` they were traced in (Keras names every layer call's scope after
        the layer: ``Conv1_relu``, ``block_2_add``; a second node of one scope is
        ``<scope>/<op>``), instead of ``<op>_<k>``.
      scopes: ``{name stack: module path}`` of a Flax model's modules (:func:`_scope_prefix`):
        nodes traced primitive by primitive inside a module are named
        ``<module path>/<op>_<k>``; None or empty: ``<op>_<k>``.
      peepholes: write an average pool that does not count the padding as ``AveragePool``,
        relu6 as ``Relu6`` (or ``Clip``), a mean as ``ReduceMean`` or a global ``AveragePool``
        (:func:`~npujax.frontends._patterns.fuse_pools_relu6_means`), hard sigmoid and hard
        swish as ``HardSigmoid`` and ``HardSwish``
        (:func:`~npujax.frontends._patterns.fuse_hard_sigmoids`).
      weights: None, or the pytree of ``jax.ShapeDtypeStruct`` that ``fn`` takes as its second
        argument: the weights traced by their shapes only (absent constants of the graph).

    Raises:
      UnsupportedOpError, GraphError: as :func:`trace_flax`.
    """
    closed = jax.make_jaxpr(fn)(x) if weights is None else jax.make_jaxpr(fn)(x, weights)
    flat = _Flattener()
    in_name = flat.fresh(closed.jaxpr.invars[0].aval)
    env: dict[Any, Any] = {closed.jaxpr.invars[0]: in_name}
    for v in closed.jaxpr.invars[1:]:  # weights known by their shapes only
        try:
            dtype = np.dtype(v.aval.dtype)
        except TypeError:  # (a PRNG key: no numpy dtype; never read in eval mode)
            dtype = np.dtype(np.uint32)
        env[v] = _Const(AbsentArray(v.aval.shape, dtype,
                                    "a weight of a model traced without weights"))
    flat.run(closed.jaxpr, closed.consts, env, "")
    flat.fold()
    out_refs = [env[v] if not isinstance(v, jex.Literal) else _Const(np.asarray(v.val))
                for v in closed.jaxpr.outvars]
    if any(isinstance(o, _Const) for o in out_refs):
        raise GraphError("the model returns a constant that does not depend on its input.")

    builder = _Builder(flat.types, batch=int(x.shape[0]), scope_names=scope_names)
    group_of = []
    for e in flat.eqns:
        m = _MARK_RE.search(e.scope)
        group_of.append(int(m.group(1)) if m else None)

    used_outside: dict[int, set[str]] = {}
    produced: dict[int, set[str]] = {}
    for e, g in zip(flat.eqns, group_of):
        if g is not None:
            produced.setdefault(g, set()).update(e.outs)
    for e, g in zip(flat.eqns, group_of):
        for i in e.ins:
            if isinstance(i, str):
                for gg, outs in produced.items():
                    if gg != g and i in outs:
                        used_outside.setdefault(gg, set()).add(i)
    for o in out_refs:
        for gg, outs in produced.items():
            if o in outs:
                used_outside.setdefault(gg, set()).add(o)

    done: set[int] = set()
    params: Params = {}
    for idx, (e, g) in enumerate(zip(flat.eqns, group_of)):
        if g in done:
            continue
        if scope_names:
            builder.scope, builder.scope_outer = _scope_label(e.scope)
        # nodes traced inside a module are named <module path>/<op>_<k> (a layer: its path)
        builder.prefix = _scope_prefix(e.scope, scopes) if scopes and (
            g is None or leaves[g].module is None) else ""
        if g is None:
            builder.primitive(e)
            continue
        done.add(g)
        eqns = [ee for ee, gg in zip(flat.eqns[idx:], group_of[idx:]) if gg == g]
        ext_in: list[str] = []
        for ee in eqns:
            for i in ee.ins:
                if isinstance(i, str) and i not in produced[g] and i not in ext_in:
                    ext_in.append(i)
        ext_out = [o for ee in eqns for o in ee.outs if o in used_outside.get(g, set())]
        nodes, k, leaf_params = _leaf_nodes(leaves[g], eqns, [builder.ref(i) for i in ext_in],
                                            ext_out, builder)
        main = nodes[k]
        if main.name in builder.taken:  # a layer called twice
            new = (fresh_name(main.name, set(builder.taken)) if scope_names
                   else builder.name(main.name))
            nodes = [n.replace(name=new + n.name[len(main.name):]) for n in nodes]
            main = nodes[k]
        builder.nodes.extend(nodes)
        builder.taken.update(n.name for n in nodes)
        if leaf_params:
            params[main.name] = {k: _device(v) for k, v in leaf_params.items()}

    params.update(builder.params)
    outputs = tuple(builder.ref(o) for o in out_refs)
    nodes = _fuse_average_pools(builder.nodes, set(outputs), builder.constants)
    if peepholes:
        nodes = fuse_pools_relu6_means(nodes, set(outputs), builder.constants, builder.types)
        nodes = fuse_hard_sigmoids(nodes, set(outputs), builder.constants)
    tensors = {name: t for name, t in builder.types.items()}
    graph = Graph(tuple(nodes), (in_name,), outputs, tensors, builder.constants, source)
    graph = _name_interface(graph, input_name)

    if check:
        want = np.asarray(reference(x))
        got = np.asarray(jax.jit(lambda p, inp: execute(graph, p, inp),
                                compiler_options=_RUN_ONCE)(params, x))
        if want.shape != got.shape:
            diff = f"shape {got.shape} instead of {want.shape}"
        elif not np.allclose(got, want, rtol=1e-4, atol=1e-4):
            diff = f"max abs difference {np.max(np.abs(got - want)):.3g}"
        else:
            diff = None
        if diff:
            raise GraphError(
                f"the traced graph does not reproduce the model's output on the example input "
                f"({diff}); please report the model so the tracer can be fixed."
            )
    return graph, params

"""Build a Graph from a Flax model by tracing it — the model is never rewritten.

The model is traced once with :func:`jax.make_jaxpr` on an example input. Calls of the standard
parameterised layers (``Conv``, ``Linear``/``Dense``, ``BatchNorm``; NNX and Linen) are
intercepted only to wrap them in a :func:`jax.named_scope` that marks their equations; each marked
group becomes one Graph node carrying the module path as its name and the module's parameters.
Every other equation (activations, pooling, reshapes, elementwise arithmetic) is mapped primitive
by primitive onto Graph operators; calls (``jit``, ``custom_jvp``) are inlined. Equations that
depend only on constants are folded. The result is checked against the model's own output on the
example input, so a tracing mistake can never pass silently.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import re
from collections.abc import Callable, Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend import core as jex
from jax.typing import ArrayLike

from npujax.errors import GraphError, UnsupportedOpError
from npujax.ir.graph import Graph, Node, Params, TensorType, fresh_name
from npujax.ops import OPS
from npujax.quantize.execute import execute

__all__ = ["trace_flax"]

_MARK = "npujaxleaf"
_MARK_RE = re.compile(_MARK + r"(\d+)")


@dataclasses.dataclass
class _Leaf:
    op: str
    path: str
    module: Any
    params: dict[str, np.ndarray]
    attrs: dict[str, Any]


def _value(v: Any) -> np.ndarray | None:
    if v is None:
        return None
    if hasattr(v, "get_value"):
        v = v.get_value()
    return np.asarray(v, np.float32)


# --------------------------------------------------------------------------------------------
# Interception: wrap known layers in a marker scope, record module, path and parameters.


def _nnx_leaf_types() -> dict[type, str]:
    from flax import nnx

    return {nnx.Conv: "Conv", nnx.Linear: "Gemm", nnx.BatchNorm: "BatchNormalization"}


def _nnx_leaf(op: str, path: str, m: Any) -> _Leaf:
    if op == "BatchNormalization":
        params = {
            "scale": _value(m.scale),
            "bias": _value(m.bias),
            "mean": _value(m.mean),
            "var": _value(m.var),
        }
        attrs = {"epsilon": float(m.epsilon), "axis": int(m.axis)}
    else:
        params = {"kernel": _value(m.kernel), "bias": _value(m.bias)}
        attrs = {}
    return _Leaf(op, path, m, {k: v for k, v in params.items() if v is not None}, attrs)


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
            if id(self) not in paths:
                return orig(self, *args, **kwargs)
            leaves.append(_nnx_leaf(types[cls], paths[id(self)], self))
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


def _linen_interceptor(variables: Any, leaves: list[_Leaf]) -> Callable:
    import flax.linen as nn

    types = {nn.Conv: "Conv", nn.Dense: "Gemm", nn.BatchNorm: "BatchNormalization"}

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
        p = lookup("params", path)
        if op == "BatchNormalization":
            s = lookup("batch_stats", path)
            params = {"scale": p.get("scale"), "bias": p.get("bias")}
            params.update(mean=s.get("mean"), var=s.get("var"))
            attrs = {"epsilon": float(m.epsilon), "axis": int(m.axis)}
        else:
            params = {"kernel": p.get("kernel"), "bias": p.get("bias")}
            attrs = {}
        arrays = {k: _value(v) for k, v in params.items()}
        leaves.append(_Leaf(op, "/".join(path) or type(m).__name__, m,
                            {k: v for k, v in arrays.items() if v is not None}, attrs))
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


@dataclasses.dataclass
class _Const:
    value: np.ndarray


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
                # constant folding: evaluate the primitive on the constants now
                res = eqn.primitive.bind(*[jnp.asarray(i.value) for i in ins], **eqn.params)
                res = res if eqn.primitive.multiple_results else [res]
                for o, r in zip(eqn.outvars, res):
                    env[o] = _Const(np.asarray(r))
                continue
            outs = [self.fresh(o.aval) for o in eqn.outvars]
            env.update(zip(eqn.outvars, outs))
            self.eqns.append(_Eqn(eqn.primitive, dict(eqn.params), ins, outs, s))


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


_GROUP_PRIMS = {
    "Conv": {"conv_general_dilated", "reshape", "add", "broadcast_in_dim", "convert_element_type"},
    "Gemm": {"dot_general", "reshape", "add", "broadcast_in_dim", "convert_element_type"},
    "BatchNormalization": {"reshape", "sub", "add", "mul", "rsqrt", "broadcast_in_dim",
                           "convert_element_type", "div", "sqrt"},
}


def _leaf_node(leaf: _Leaf, eqns: list[_Eqn], ext_in: list[str], ext_out: list[str]) -> Node:
    prims = {e.prim.name for e in eqns}
    extra = prims - _GROUP_PRIMS[leaf.op]
    if extra:
        raise UnsupportedOpError(
            f"layer {leaf.path!r} ({type(leaf.module).__name__}) computes with {sorted(extra)}, "
            f"which npujax's {leaf.op} node does not model (e.g. circular padding, masking or "
            "precision options); use standard options or file an issue with the model."
        )
    if len(ext_in) != 1 or len(ext_out) != 1:
        raise UnsupportedOpError(
            f"layer {leaf.path!r} must read one activation and write one output, it reads "
            f"{len(ext_in)} and writes {len(ext_out)}."
        )
    attrs = dict(leaf.attrs)
    if leaf.op == "Conv":
        (conv,) = [e for e in eqns if e.prim.name == "conv_general_dilated"]
        attrs.update(_conv_attrs(conv, leaf.path))
        attrs["kernel_shape"] = [int(d) for d in leaf.params["kernel"].shape]
    elif leaf.op == "Gemm":
        (dot,) = [e for e in eqns if e.prim.name == "dot_general"]
        (lc, rc), (lb, rb) = dot.params["dimension_numbers"]
        kernel = leaf.params["kernel"]
        if lb or rb or kernel.ndim != 2 or tuple(rc) != (0,):
            raise UnsupportedOpError(
                f"layer {leaf.path!r}: only dense layers with a 2-D [in, out] kernel are supported."
            )
    return Node(leaf.path, leaf.op, tuple(ext_in), tuple(ext_out), attrs, tuple(leaf.params))


#: JAX primitives that map one to one onto a registered operator (``OpDef.jax_primitives``).
_PRIMITIVE_OPS = {prim: d.name for d in OPS.values() for prim in d.jax_primitives}
#: Elementwise primitives without a registered operator, kept as exact ``JaxPrimitive`` nodes
#: (those with one, e.g. exp or erf, map through ``OpDef.jax_primitives`` first).
_UNARY_PRIMS = {"rsqrt", "sign", "floor", "ceil", "round", "integer_pow", "sin", "cos",
                "square", "log1p", "expm1", "stop_gradient", "erf_inv", "is_finite"}


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


class _Builder:
    def __init__(self, types: dict[str, TensorType], batch: int) -> None:
        self.nodes: list[Node] = []
        self.constants: dict[str, np.ndarray] = {}
        self.types = types
        self.batch = batch
        self.alias: dict[str, str] = {}
        self._counts: dict[str, int] = {}

    def name(self, base: str) -> str:
        k = self._counts.get(base, 0)
        self._counts[base] = k + 1
        return f"{base}_{k}"

    def ref(self, x: Any) -> str:
        if isinstance(x, _Const):
            name = f"const_{len(self.constants)}"
            self.constants[name] = np.asarray(x.value)
            self.types[name] = TensorType(tuple(x.value.shape), str(x.value.dtype))
            return name
        return self.alias.get(x, x)

    def add(self, op: str, ins: list[Any], outs: list[str], attrs=None, base=None) -> None:
        name = self.name(base or op.lower())
        self.nodes.append(Node(name, op, tuple(self.ref(i) for i in ins), tuple(outs),
                               attrs or {}))

    def primitive(self, e: _Eqn) -> None:
        p = e.prim.name
        ins, outs = e.ins, e.outs
        if p in ("convert_element_type", "copy", "copy_p", "optimization_barrier"):
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
        if p == "reduce_window_max":
            return self.add("MaxPool", ins, outs, _window_attrs(e))
        if p == "reduce_window_sum":
            return self.add("SumPool", ins, outs, _window_attrs(e))
        if p == "reshape":
            src, dst = self.types[self.ref(ins[0])].shape, e.params["new_sizes"]
            shape = [int(d) for d in dst]
            if src and shape and src[0] == shape[0] == self.batch:
                shape[0] = 0  # keep the batch dimension (ONNX Reshape "copy" semantics)
            return self.add("Reshape", ins[:1], outs, {"shape": shape})
        if p == "transpose":
            perm = [int(a) for a in e.params["permutation"]]
            return self.add("Transpose", ins, outs, {"perm": perm})
        if p in ("reduce_sum", "reduce_max"):
            op = "ReduceSum" if p == "reduce_sum" else "ReduceMax"
            return self.add(op, ins, outs, {"axes": [int(a) for a in e.params["axes"]],
                                            "keepdims": False})
        if p == "squeeze":
            shape = list(self.types[outs[0]].shape)
            if shape and shape[0] == self.batch:
                shape[0] = 0
            return self.add("Reshape", ins, outs, {"shape": shape}, base="squeeze")
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
            if (divisor.size == 1 and float(divisor) == float(np.prod(pool.attrs["window"]))
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
    **apply_kwargs: Any,
) -> tuple[Graph, Params]:
    """Trace a Flax model into a :class:`Graph` and its params pytree.

    Args:
      model: an ``flax.nnx.Module`` (traced in eval mode on a copy, the original is untouched) or
        a ``flax.linen.Module`` (then ``variables`` is required; BatchNorm must be called with
        ``use_running_average=True`` via ``apply_kwargs``, e.g. ``train=False``).
      example_input: float32 array ``(batch, ...)``; fixes the non-batch shapes of the graph.
      variables: Linen variables ``{"params": ..., "batch_stats": ...}``.
      check: run the graph on ``example_input`` and compare with the model (recommended).
      **apply_kwargs: extra keyword arguments for the Linen ``apply``.

    Returns:
      ``(graph, params)``: node names are module paths (``conv1``, ``block/bn``) for layers and
      ``<op>_<k>`` for functional ops; the input tensor is named after the model's call argument
      (``x``), the output ``output`` (``output_<i>`` for several); params are
      ``{node: {role: float32 array}}``.

    Raises:
      UnsupportedOpError: a primitive or layer option has no Graph operator (names it).
      GraphError: the traced graph does not reproduce the model's output.
    """
    x = jnp.asarray(example_input, jnp.float32)
    leaves: list[_Leaf] = []
    from flax import nnx  # (flax >= 0.11, a dependency, always has nnx)

    if isinstance(model, nnx.Module):
        model = nnx.clone(model)
        model.eval()
        source = "flax.nnx"

        def fn(inp):
            with _intercept_nnx(model, leaves):
                return model(inp)

        reference = lambda inp: model(inp)  # noqa: E731
    else:
        import flax.linen as nn

        if not isinstance(model, nn.Module) or variables is None:
            raise GraphError(
                "trace_flax needs an nnx.Module, or a linen.Module together with variables=; "
                f"got {type(model).__name__} and variables={'set' if variables else 'None'}."
            )
        source = "flax.linen"
        interceptor = _linen_interceptor(variables, leaves)

        def fn(inp):
            with nn.intercept_methods(interceptor):
                return model.apply(variables, inp, **apply_kwargs)

        reference = lambda inp: model.apply(variables, inp, **apply_kwargs)  # noqa: E731

    closed = jax.make_jaxpr(fn)(x)
    flat = _Flattener()
    in_name = flat.fresh(closed.jaxpr.invars[0].aval)
    env = {closed.jaxpr.invars[0]: in_name}
    flat.run(closed.jaxpr, closed.consts, env, "")
    out_refs = [env[v] if not isinstance(v, jex.Literal) else _Const(np.asarray(v.val))
                for v in closed.jaxpr.outvars]
    if any(isinstance(o, _Const) for o in out_refs):
        raise GraphError("the model returns a constant that does not depend on its input.")

    builder = _Builder(flat.types, batch=int(x.shape[0]))
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
        if g is None:
            builder.primitive(e)
            continue
        if g in done:
            continue
        done.add(g)
        eqns = [ee for ee, gg in zip(flat.eqns[idx:], group_of[idx:]) if gg == g]
        ext_in: list[str] = []
        for ee in eqns:
            for i in ee.ins:
                if isinstance(i, str) and i not in produced[g] and i not in ext_in:
                    ext_in.append(i)
        ext_out = [o for ee in eqns for o in ee.outs if o in used_outside.get(g, set())]
        node = _leaf_node(leaves[g], eqns, [builder.ref(i) for i in ext_in], ext_out)
        if node.name in {n.name for n in builder.nodes}:
            node = node.replace(name=builder.name(node.name))  # a layer called twice
        builder.nodes.append(node)
        params[node.name] = {k: jnp.asarray(v) for k, v in leaves[g].params.items()}

    outputs = tuple(builder.ref(o) for o in out_refs)
    nodes = _fuse_average_pools(builder.nodes, set(outputs), builder.constants)
    tensors = {name: t for name, t in builder.types.items()}
    graph = Graph(tuple(nodes), (in_name,), outputs, tensors, builder.constants, source)
    graph = _name_interface(graph, _argument_name(model))

    if check:
        want = np.asarray(reference(x))
        got = np.asarray(execute(graph, params, x))
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

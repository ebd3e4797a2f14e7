"""Pattern fusion: the decomposed LayerNorm and GELU that ONNX exporters write become one op.

Exporters (PyTorch's among them) often write LayerNorm and GELU as chains of elementwise
operators. NPU compilers recognise them and run one normalization or activation; so does
:func:`fuse_transformer_patterns`:

* **LayerNorm**, ``(x - E[x]) / sqrt(Var[x] + eps) [* scale] [+ bias]`` with the variance
  written either ``E[(x - E[x])^2]`` or ``E[x^2] - E[x]^2``; squares as ``Pow(., 2)`` or
  ``Mul(d, d)``; the division as ``Div`` or a multiplication by ``Reciprocal(Sqrt(.))``.
* **GELU**, ``x * 0.5 * (1 + erf(x / sqrt 2))`` and
  ``x * 0.5 * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3)))``, up to commutativity and equivalent
  spellings: a constant may be either operand of its ``Mul`` or ``Add``, a multiplication by a
  constant may be written as a ``Div`` by its reciprocal (``x / sqrt 2``, ``... / 2``), ``x^3``
  as ``Pow(x, 3)`` or ``x * x * x`` (either grouping), and the three factors ``x``, 0.5 and
  ``1 + f`` multiplied in any order and grouping.

A fusion fires only when every condition that makes the subgraph *equal* to the fused op holds:
both reductions over the same trailing axes ``[a, rank)`` with ``keepdims=1``; the centred
tensor is ``x`` minus that same mean; the exponent exactly 2; epsilon a scalar constant added to
the variance (not to the standard deviation); the scale and bias constants that broadcast over
the normalized axes only; GELU's constants equal to float32 rounding; every intermediate used
only inside the pattern. A near miss stays unfused, so the graph computes exactly what the model
wrote. Sources: ONNX LayerNormalization (opset 17) and Gelu (opset 20) specifications.

This is graph pattern fusion (it rewrites the Graph). It is not the cost model's fusion: the
preset knobs ``ops.fusion`` and ``ops.attention_fusion`` and the cross-layer placement of
:mod:`npujax.plan.passes.cross_layer` change costs, never the graph.
"""

from __future__ import annotations

from collections.abc import Callable

import jax.numpy as jnp
import numpy as np

from npujax.ir.graph import Graph, Node, Params

__all__ = ["fuse_transformer_patterns"]

_SQRT2 = float(np.sqrt(2.0))
_TANH_K = float(np.sqrt(2.0 / np.pi))


class _View:
    """Producer/consumer lookups over a graph and its constants."""

    def __init__(self, graph: Graph) -> None:
        self.g = graph
        self.prod = {t: n for n in graph.nodes for t in n.outputs}
        self.users: dict[str, list[Node]] = {}
        for n in graph.nodes:
            for t in n.inputs:
                self.users.setdefault(t, []).append(n)

    def node(self, t: str, op: str | tuple[str, ...]) -> Node | None:
        n = self.prod.get(t)
        ops = (op,) if isinstance(op, str) else op
        return n if n is not None and n.op in ops else None

    def const(self, t: str) -> np.ndarray | None:
        return self.g.constants.get(t)

    def scalar(self, t: str, value: float, rtol: float = 0.0) -> bool:
        c = self.const(t)
        return (c is not None and c.size == 1 and np.issubdtype(c.dtype, np.floating)
                and bool(np.isclose(float(c.reshape(())), value, rtol=rtol, atol=0.0)))

    def other(self, n: Node, t: str) -> str | None:
        """The other input of a binary node that reads ``t`` once."""
        if len(n.inputs) != 2 or n.inputs[0] == n.inputs[1] or t not in n.inputs:
            return None
        return n.inputs[1] if n.inputs[0] == t else n.inputs[0]

    def private(self, t: str, inside: set[str]) -> bool:
        """``t`` is read only by the nodes named in ``inside`` and is no graph output."""
        return t not in self.g.outputs and all(u.name in inside for u in self.users.get(t, ()))


def _mean(v: _View, t: str, x: str | None = None) -> tuple[Node, int] | None:
    """The ReduceMean producing ``t`` (of ``x`` if given) over trailing axes with keepdims."""
    n = v.node(t, "ReduceMean")
    if n is None or (x is not None and n.inputs[0] != x) or not int(n.attrs["keepdims"]):
        return None
    rank = len(v.g.tensors[n.inputs[0]].shape)
    axes = sorted(int(a) % rank for a in n.attrs["axes"])
    if not axes or axes != list(range(axes[0], rank)):
        return None
    return n, axes[0]


def _square_of(v: _View, t: str) -> tuple[Node, str] | None:
    """``(node, base)`` if ``t`` is ``Pow(base, 2)`` or ``Mul(base, base)``."""
    n = v.node(t, ("Pow", "Mul"))
    if n is None:
        return None
    if n.op == "Mul" and len(n.inputs) == 2 and n.inputs[0] == n.inputs[1]:
        return n, n.inputs[0]
    if n.op == "Pow" and v.scalar(n.inputs[1], 2.0):
        return n, n.inputs[0]
    return None


def _affine_const(v: _View, t: str | None, x_shape: tuple[int, ...], axis: int
                  ) -> np.ndarray | None:
    """A scale/bias constant broadcasting over the normalized axes only, as ``shape[axis:]``."""
    c = None if t is None else v.const(t)
    if c is None or not np.issubdtype(c.dtype, np.floating):
        return None
    norm = tuple(x_shape[axis:])
    lead = c.shape[:max(c.ndim - len(norm), 0)]
    if any(d != 1 for d in lead) or c.ndim > len(x_shape):
        return None
    tail = c.shape[len(lead):]
    if any(d not in (1, n) for d, n in zip(tail[::-1], norm[::-1])):
        return None
    return np.broadcast_to(c.reshape(tail), norm).astype(np.float32)


def _layer_norm(v: _View, div: Node) -> tuple[list[Node], Node, dict] | None:
    """Match a LayerNorm ending at ``div`` (``Div(d, sqrt)`` or ``Mul(d, Reciprocal(sqrt))``)."""
    if div.op == "Div":
        d, std_t = div.inputs
        recip = None
    else:
        recip = next((v.node(t, "Reciprocal") for t in div.inputs if v.node(t, "Reciprocal")),
                     None)
        if recip is None or len(div.inputs) != 2:
            return None
        d = v.other(div, recip.outputs[0]) or ""
        std_t = recip.inputs[0]
    sub, sqrt = v.node(d, "Sub"), v.node(std_t, "Sqrt")
    if sub is None or sqrt is None:
        return None
    x, mean_t = sub.inputs
    m = _mean(v, mean_t, x)
    add = v.node(sqrt.inputs[0], "Add")
    if m is None or add is None:
        return None
    mean, axis = m
    eps_t = next((t for t in add.inputs if v.const(t) is not None), None)
    var_t = v.other(add, eps_t) if eps_t else None
    if eps_t is None or var_t is None or v.const(eps_t).size != 1:  # type: ignore[union-attr]
        return None
    eps = float(v.const(eps_t).reshape(()))  # type: ignore[union-attr]
    vm = _mean(v, var_t)
    sq = _square_of(v, vm[0].inputs[0]) if vm is not None else None
    if vm is not None and vm[1] == axis and sq is not None and sq[1] == d:
        # Var = E[(x - E[x])^2]
        nodes = [mean, sub, add, sqrt, vm[0], sq[0], div] + ([recip] if recip else [])
    else:  # Var = E[x^2] - E[x]^2
        var_sub = v.node(var_t, "Sub")
        if var_sub is None:
            return None
        vm2 = _mean(v, var_sub.inputs[0], None)
        sqx = _square_of(v, vm2[0].inputs[0]) if vm2 else None
        sqm = _square_of(v, var_sub.inputs[1])
        if (vm2 is None or sqx is None or sqm is None or vm2[1] != axis or sqx[1] != x
                or sqm[1] != mean_t):
            return None
        nodes = [mean, sub, add, sqrt, div, vm2[0], sqx[0], sqm[0], var_sub] + (
            [recip] if recip else [])
    inside = {n.name for n in nodes}
    for n in nodes:
        if n is not div and not all(v.private(t, inside) for t in n.outputs):
            return None
    return nodes, div, {"x": x, "axis": axis, "epsilon": eps}


def _affine_tail(v: _View, out: Node, x_shape: tuple[int, ...], axis: int,
                 ) -> tuple[list[Node], Node, dict[str, np.ndarray]]:
    """Absorb a following ``Mul`` by a scale and ``Add`` of a bias (each when it qualifies)."""
    nodes: list[Node] = []
    params: dict[str, np.ndarray] = {}
    last = out
    for op, role in (("Mul", "scale"), ("Add", "bias")):
        t = last.outputs[0]
        users = v.users.get(t, [])
        if t in v.g.outputs or len(users) != 1 or users[0].op != op:
            continue
        c = _affine_const(v, v.other(users[0], t), x_shape, axis)
        if c is None:
            continue
        params[role] = c
        nodes.append(users[0])
        last = users[0]
    return nodes, last, params


def _scaled(v: _View, n: Node | None, factor: float, rtol: float = 0.0) -> str | None:
    """The tensor ``n`` multiplies by ``factor``: ``Mul`` by a scalar constant equal to it
    (either operand), or ``Div`` by one equal to its reciprocal; None otherwise."""
    if n is None or len(n.inputs) != 2 or n.inputs[0] == n.inputs[1]:
        return None
    a, b = n.inputs
    if n.op == "Mul":
        if v.scalar(b, factor, rtol) and v.const(a) is None:
            return a
        if v.scalar(a, factor, rtol) and v.const(b) is None:
            return b
    if n.op == "Div" and v.scalar(b, 1.0 / factor, rtol) and v.const(a) is None:
        return a
    return None


def _cube_of(v: _View, t: str) -> tuple[list[Node], str] | None:
    """``(nodes, base)`` if ``t`` is ``base^3``: ``Pow(base, 3)``, or ``x * x * x`` grouped either
    way (``x * (x * x)``, the square also as ``Pow(x, 2)``)."""
    n = v.node(t, ("Pow", "Mul"))
    if n is None:
        return None
    if n.op == "Pow":
        return ([n], n.inputs[0]) if v.scalar(n.inputs[1], 3.0) else None
    if len(n.inputs) != 2:
        return None
    for sq_t, base in (n.inputs, n.inputs[::-1]):
        sq = _square_of(v, sq_t)
        if sq is not None and sq[1] == base and sq_t != base:
            return [n, sq[0]], base
    return None


def _half_product(v: _View, c: str, x: str) -> tuple[list[Node], Node] | None:
    """The nodes computing ``x * 0.5 * c`` from ``c``'s only consumer on: the three factors in
    any order and grouping, the 0.5 a ``Mul`` by 0.5 or a ``Div`` by 2; ``(nodes, last)``."""
    users = v.users.get(c, [])
    if len(users) != 1:
        return None
    m1 = users[0]

    def only_user(n: Node) -> Node | None:
        u = v.users.get(n.outputs[0], [])
        return u[0] if len(u) == 1 else None

    if _scaled(v, m1, 0.5) == c:  # (c * 0.5) * x
        m2 = only_user(m1)
        if m2 is not None and m2.op == "Mul" and v.other(m2, m1.outputs[0]) == x:
            return [m1, m2], m2
        return None
    if m1.op != "Mul":
        return None
    o = v.other(m1, c)
    if o is None:
        return None
    if o == x:  # (x * c) * 0.5
        m2 = only_user(m1)
        if m2 is not None and _scaled(v, m2, 0.5) == m1.outputs[0]:
            return [m1, m2], m2
        return None
    h = v.prod.get(o)  # (x * 0.5) * c
    if h is not None and _scaled(v, h, 0.5) == x:
        return [h, m1], m1
    return None


def _gelu(v: _View, act: Node) -> tuple[list[Node], Node, str, str] | None:
    """Match a GELU around the ``Erf`` or ``Tanh`` node ``act``: ``(nodes, last, x,
    approximate)``. Up to commutativity (a constant either operand of its ``Mul``/``Add``) and
    equivalent spellings (a division by a constant or a product by its reciprocal; ``x^3`` as
    ``Pow`` or ``x * x * x``); a different constant or input is no match."""
    nodes = [act]
    if act.op == "Erf":
        pre = v.node(act.inputs[0], ("Div", "Mul"))
        x = _scaled(v, pre, 1 / _SQRT2, 1e-6)
        if pre is None or x is None:
            return None
        nodes.append(pre)
        approximate = "none"
    else:
        k = v.node(act.inputs[0], ("Mul", "Div"))
        s = v.node(_scaled(v, k, _TANH_K, 1e-6) or "", "Add")
        if k is None or s is None or len(s.inputs) != 2:
            return None
        found = None
        for x, cx3 in (s.inputs, s.inputs[::-1]):
            cube_mul = v.node(cx3, ("Mul", "Div"))
            cube = _cube_of(v, _scaled(v, cube_mul, 0.044715, 1e-6) or "")
            if cube_mul is not None and cube is not None and cube[1] == x:
                found = x, [cube_mul, *cube[0]]
                break
        if found is None:
            return None
        x = found[0]
        nodes += [k, s, *found[1]]
        approximate = "tanh"
    if v.const(x) is not None:
        return None
    one = v.users.get(act.outputs[0], [])
    if len(one) != 1 or one[0].op != "Add" or not v.scalar(v.other(one[0], act.outputs[0])
                                                              or "", 1.0):
        return None
    nodes.append(one[0])
    got = _half_product(v, one[0].outputs[0], x)
    if got is None:
        return None
    nodes += got[0]
    last = got[1]
    inside = {n.name for n in nodes}
    for n in nodes:
        if n is not last and not all(v.private(t, inside) for t in n.outputs):
            return None
    return nodes, last, x, approximate


def _rewrite(graph: Graph, params: Params, match: Callable[[_View, Node], tuple | None]
             ) -> tuple[Graph, Params, int]:
    count = 0
    while True:
        v = _View(graph)
        for n in graph.nodes:
            got = match(v, n)
            if got is None:
                continue
            remove, new, new_params = got
            gone = {r.name for r in remove}
            nodes = []
            for m in graph.nodes:
                if m.name == new.name:
                    nodes.append(new)
                elif m.name not in gone:
                    nodes.append(m)
            graph = graph.replace(nodes=tuple(nodes))
            params = dict(params)
            if new_params:
                params[new.name] = new_params
            count += 1
            break
        else:
            break
    used = {t for n in graph.nodes for t in n.inputs} | set(graph.outputs)
    live = used | {t for n in graph.nodes for t in n.outputs} | set(graph.inputs)
    graph = graph.replace(constants={k: c for k, c in graph.constants.items() if k in used},
                          tensors={k: t for k, t in graph.tensors.items() if k in live})
    return graph, params, count


def _match_layer_norm(v: _View, n: Node) -> tuple | None:
    if n.op not in ("Div", "Mul"):
        return None
    got = _layer_norm(v, n)
    if got is None:
        return None
    nodes, div, info = got
    x_shape = v.g.tensors[info["x"]].shape
    tail, last, p = _affine_tail(v, div, x_shape, info["axis"])
    new = Node(f"{div.name}/layernorm", "LayerNormalization", (info["x"],), last.outputs,
               {"axis": info["axis"], "epsilon": info["epsilon"]}, tuple(p))
    # the fused node takes the place of the pattern's last node
    new = new.replace(name=(last.name if last is not div else div.name))
    return [*nodes, *tail], new, {k: jnp.asarray(a) for k, a in p.items()}


def _match_gelu(v: _View, n: Node) -> tuple | None:
    if n.op not in ("Erf", "Tanh"):
        return None
    got = _gelu(v, n)
    if got is None:
        return None
    nodes, last, x, approximate = got
    new = Node(last.name, "Gelu", (x,), last.outputs, {"approximate": approximate})
    return nodes, new, None


def fuse_transformer_patterns(graph: Graph, params: Params) -> tuple[Graph, Params]:
    """Fuse decomposed LayerNorms and GELUs into ``LayerNormalization`` and ``Gelu`` nodes.

    Args:
      graph: an imported or traced graph.
      params: its params.

    Returns:
      ``(graph, params)``: each fused node takes the name of the pattern's last node; a
      LayerNorm's absorbed scale and bias become its params (``scale``, ``bias``, float32
      ``shape[axis:]``). Subgraphs that miss any condition (module docstring) are unchanged.
    """
    graph, params, _ = _rewrite(graph, params, _match_layer_norm)
    graph, params, _ = _rewrite(graph, params, _match_gelu)
    return graph, params

"""Patterns of traced jax.numpy code written as the operators an NPU compiler sees.

The tracer (:mod:`npujax.frontends.flax`) maps JAX primitives one by one; a few common
functions arrive as several primitives: ``jax.nn.relu6`` as max then min, ``jnp.mean`` as a sum
and a division, Keras' average pooling with ``padding="same"`` as a window sum divided by a
window count, ``jax.nn.hard_sigmoid`` and ``hard_silu`` as add, relu6, divide (and multiply).
The functions here rewrite the traced node list (``Relu6``, ``AveragePool``, ``ReduceMean``,
``HardSigmoid``, ``HardSwish``), each keeping the function of the graph (the trace's check
against the model's output covers them). The Keras frontend uses them; the Flax frontend does
not yet (its graphs are unchanged).
"""

from __future__ import annotations

import numpy as np

from npujax.ir.graph import Node, TensorType
from npujax.ops.pooling import avgpool_count

__all__ = ["fuse_pools_relu6_means", "fuse_hard_sigmoids"]


def _scalar(constants: dict[str, np.ndarray], name: str) -> float | None:
    """The value of a one-element constant, else None."""
    v = constants.get(name)
    return float(np.asarray(v).reshape(())) if v is not None and np.size(v) == 1 else None


def fuse_pools_relu6_means(nodes: list[Node], graph_outputs: set[str],
                           constants: dict[str, np.ndarray],
                           types: dict[str, TensorType]) -> list[Node]:
    """Patterns of jax.numpy written as the operators an NPU compiler sees:

    * a window sum divided by the count of the window's elements inside the input (Keras'
      average pooling with ``padding="same"``): ``AveragePool`` (``count_include_pad=0``);
    * ``min(max(x, 0), c)`` (``jax.nn.relu6``, Keras' ``ReLU(max_value=c)``): ``Relu6`` (c = 6,
      an activation a GEMM fuses) or ``Clip``;
    * ``sum(x, axes)`` divided by the number of summed elements (``jnp.mean``; with a Reshape
      restoring the reduced axes between them or not): the global average pooling of a 4-D
      tensor (axes 1, 2 or 2, 3) as an ``AveragePool`` over the whole image (then a
      ``<name>/reshape`` unless the axes are kept), any other mean as ``ReduceMean``.
    """
    users: dict[str, list[Node]] = {}
    for n in nodes:
        for t in n.inputs:
            users.setdefault(t, []).append(n)

    def sole_user(n: Node, op: str) -> Node | None:
        u = users.get(n.outputs[0], [])
        if len(u) == 1 and u[0].op == op and n.outputs[0] not in graph_outputs:
            return u[0]
        return None

    dropped: set[int] = set()
    replaced: dict[int, list[Node]] = {}
    for n in nodes:
        if n.op == "SumPool" and (d := sole_user(n, "Div")) is not None:
            divisor = constants.get(d.inputs[1]) if d.inputs[0] == n.outputs[0] else None
            pool = Node(n.name, "AveragePool", n.inputs, d.outputs,
                        {**n.attrs, "count_include_pad": 0})
            count = avgpool_count(pool, types[n.inputs[0]].shape)
            out = tuple(types[d.outputs[0]].shape)
            if (divisor is not None and divisor.ndim <= len(out)
                    and np.broadcast_shapes(divisor.shape, count.shape, out) == out
                    and bool(np.all(divisor == count))):
                replaced[id(n)] = [pool]
                dropped.add(id(d))
        elif n.op == "Relu" and (m := sole_user(n, "Min")) is not None:
            hi = _scalar(constants, m.inputs[1]) if m.inputs[0] == n.outputs[0] else None
            if hi is not None and hi >= 0:
                op, attrs = ("Relu6", {}) if hi == 6.0 else ("Clip", {"min": 0.0, "max": hi})
                replaced[id(n)] = [Node(n.name, op, n.inputs, m.outputs, attrs)]
                dropped.add(id(m))
        elif n.op == "ReduceSum" and not n.attrs["keepdims"]:
            src = types[n.inputs[0]].shape
            axes = [int(a) for a in n.attrs["axes"]]
            keep = tuple(1 if i in axes else d for i, d in enumerate(src))
            r = sole_user(n, "Reshape")
            if r is not None and types[r.outputs[0]].shape != keep:
                continue
            d = sole_user(r or n, "Div")
            if (d is None or d.inputs[0] != (r or n).outputs[0]
                    or _scalar(constants, d.inputs[1]) != float(np.prod([src[a] for a in axes]))):
                continue
            dropped.update({id(d)} | ({id(r)} if r is not None else set()))
            if len(src) != 4 or sorted(axes) not in ([1, 2], [2, 3]):
                replaced[id(n)] = [Node(n.name, "ReduceMean", n.inputs, d.outputs,
                                        {"axes": axes, "keepdims": int(r is not None)})]
                continue
            window = [size if i in axes else 1 for i, size in enumerate(src)]
            pool_attrs = {"window": window, "strides": [1] * 4, "padding": [[0, 0]] * 4}
            if r is not None:
                replaced[id(n)] = [Node(n.name, "AveragePool", n.inputs, d.outputs, pool_attrs)]
                continue
            pooled = f"{n.outputs[0]}_kept"
            types[pooled] = TensorType(keep, types[n.outputs[0]].dtype)
            flat = [int(v) for v in types[d.outputs[0]].shape]
            replaced[id(n)] = [
                Node(n.name, "AveragePool", n.inputs, (pooled,), pool_attrs),
                Node(f"{n.name}/reshape", "Reshape", (pooled,), d.outputs,
                     {"shape": [0, *flat[1:]] if flat[0] == keep[0] else flat})]
    return [m for n in nodes if id(n) not in dropped for m in replaced.get(id(n), [n])]


def fuse_hard_sigmoids(nodes: list[Node], graph_outputs: set[str],
                       constants: dict[str, np.ndarray]) -> list[Node]:
    """``relu6(x + 3) / 6`` (``jax.nn.hard_sigmoid``; also ``* (1/6)``) as ``HardSigmoid``, and
    ``x * hard_sigmoid(x)`` (``jax.nn.hard_silu``, MobileNetV3's hard swish) as ``HardSwish``
    (after :func:`fuse_pools_relu6_means` has made the ``Relu6``)."""
    users: dict[str, list[Node]] = {}
    for n in nodes:
        for t in n.inputs:
            users.setdefault(t, []).append(n)

    def sole_user(n: Node, *ops: str) -> Node | None:
        u = users.get(n.outputs[0], [])
        ok = len(u) == 1 and u[0].op in ops and n.outputs[0] not in graph_outputs
        return u[0] if ok else None

    def other(n: Node, t: str) -> str | None:
        """The input of a two-input ``n`` that is not ``t``."""
        if len(n.inputs) != 2 or t not in n.inputs:
            return None
        return n.inputs[1] if n.inputs[0] == t else n.inputs[0]

    names = {n.name for n in nodes}
    dropped: set[int] = set()
    replaced: dict[int, Node] = {}
    for a in nodes:
        if a.op != "Add" or (r := sole_user(a, "Relu6")) is None:
            continue
        x = next((t for t in a.inputs if t not in constants), None)
        c = other(a, x) if x is not None else None
        if x is None or c is None or _scalar(constants, c) != 3.0:
            continue
        d = sole_user(r, "Div", "Mul")
        k = other(d, r.outputs[0]) if d is not None else None
        if d is None or k is None or (d.op == "Div" and (d.inputs[0] != r.outputs[0]
                                                          or _scalar(constants, k) != 6.0)):
            continue
        if d.op == "Mul" and not np.isclose(_scalar(constants, k) or 0.0, 1.0 / 6.0,
                                            rtol=1e-6, atol=0.0):
            continue
        m = sole_user(d, "Mul")
        m = m if m is not None and other(m, d.outputs[0]) == x else None
        chain = [a, r, d] + ([m] if m is not None else [])
        op = "HardSigmoid" if m is None else "HardSwish"
        # the name of a layer of the chain (Keras' Activation("hard_silu"); the ReLU layer of
        # MobileNetV3's `ReLU(6.0)(x + 3.0) * (1 / 6)`), else <scope>/hardswish
        name = next((n.name for n in chain if "/" not in n.name),
                    f"{a.name.rsplit('/', 1)[0]}/{op.lower()}")
        if name in names - {n.name for n in chain}:
            name = a.name
        if m is None:
            node = Node(name, op, (x,), d.outputs, {"alpha": 1.0 / 6.0, "beta": 0.5})
        else:
            node = Node(name, op, (x,), m.outputs, {})
            dropped.add(id(m))
        replaced[id(a)] = node
        dropped.update({id(r), id(d)})
    return [replaced.get(id(n), n) for n in nodes if id(n) not in dropped]

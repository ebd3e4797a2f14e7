"""Check a Graph against its arrays: what a model file must satisfy before it is trusted.

A model file is as untrusted as an ONNX file: its JSON may declare shapes its arrays do not
have, a kernel may have the wrong shape or dtype, an attribute may be nonsense. :func:`check_graph`
re-derives every node's output types with ``jax.eval_shape`` (no data is computed or allocated)
from the declared input types and the actual parameter arrays, and compares them with the
declared types, so any of these ends in one :class:`~npujax.errors.GraphError` naming the node.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import numpy as np

from npujax.errors import GraphError, NpujaxError
from npujax.ir.graph import Graph
from npujax.ops.registry import get_op

__all__ = ["check_graph"]

_WINDOW_OPS = frozenset({"Conv", "ConvTranspose"})  # (empty pooling outputs are legal ONNX)


def _spec(shape, dtype) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(tuple(int(d) for d in shape), np.dtype(dtype))


def check_graph(graph: Graph, params: Mapping[str, Mapping[str, Any]], where: str) -> None:
    """Validate ``graph`` with ``params``: constants and parameters match what the nodes need,
    and every node's declared output types are what its operator computes.

    Args:
      graph: the graph (e.g. just read from a model file).
      params: ``{node: {role: array}}``; arrays need ``shape`` and ``dtype`` only.
      where: the file or source named in error messages.

    Raises:
      GraphError: the first mismatch, naming the node or tensor, what was declared and what
        was found.
      UnsupportedOpError: a node with an operator npujax does not have.
    """
    for name, c in graph.constants.items():
        decl = graph.tensors.get(name)
        if decl is None or tuple(decl.shape) != tuple(c.shape) or np.dtype(decl.dtype) != c.dtype:
            said = f"{decl.dtype}{list(decl.shape)}" if decl else "nothing"
            raise GraphError(f"{where}: constant {name!r} is {c.dtype}{list(c.shape)} but the "
                             f"graph declares {said}.")
    nodes = {n.name: n for n in graph.nodes}
    extra = sorted(set(params) - set(nodes))
    if extra:
        raise GraphError(f"{where}: parameters for {extra}, which are not nodes of the graph.")
    for node in graph.nodes:
        have = dict(params.get(node.name, {}))
        if sorted(have) != sorted(node.params):
            raise GraphError(f"{where}: node {node.name!r} ({node.op}) needs parameters "
                             f"{sorted(node.params)}, the file has {sorted(have)}.")
        for role, v in have.items():
            if not hasattr(v, "shape") or not np.issubdtype(np.dtype(v.dtype), np.floating):
                raise GraphError(f"{where}: parameter {node.name}/{role} has dtype "
                                 f"{getattr(v, 'dtype', None)}; parameters are float arrays.")
        run = get_op(node.op, node.name).run
        ins = [_spec(graph.tensors[t].shape, graph.tensors[t].dtype) for t in node.inputs]
        ps = {k: _spec(v.shape, v.dtype) for k, v in have.items()}
        try:
            outs = jax.eval_shape(lambda xs, pp, n=node, f=run: f(n, xs, pp), ins, ps)
        except NpujaxError as e:
            raise GraphError(f"{where}: node {node.name!r} ({node.op}): {e}") from None
        except Exception as e:
            raise GraphError(f"{where}: node {node.name!r} ({node.op}) does not accept its "
                             f"declared inputs {[tuple(s.shape) for s in ins]} and parameters "
                             f"{ {k: tuple(s.shape) for k, s in ps.items()} }: "
                             f"{type(e).__name__}: {e}") from None
        if len(outs) != len(node.outputs):
            raise GraphError(f"{where}: node {node.name!r} ({node.op}) computes {len(outs)} "
                             f"outputs, the graph declares {len(node.outputs)}.")
        for t, o in zip(node.outputs, outs):
            if node.op in _WINDOW_OPS and 0 in o.shape:
                raise GraphError(f"{where}: node {node.name!r} ({node.op}) has an empty output "
                                 f"{list(o.shape)}: its kernel is larger than its padded input.")
            d = graph.tensors[t]  # (check_doc: every output is declared)
            if tuple(d.shape) != tuple(o.shape) or np.dtype(d.dtype) != np.dtype(o.dtype):
                raise GraphError(f"{where}: node {node.name!r} ({node.op}) computes {t!r} as "
                                 f"{o.dtype}{list(o.shape)}, the graph declares "
                                 f"{d.dtype}{list(d.shape)}.")

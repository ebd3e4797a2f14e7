"""The interface of an exact rewrite: an operator the NPU lacks, written as operators it has.

A compiler that meets an operator its NPU does not run can fall back to the host CPU, rewrite
the operator into ones the NPU runs, or refuse the model. A :class:`Rewrite` is one such rule:
:meth:`Rewrite.refuse` says whether it applies to a node (``""``) or why not, and
:meth:`Rewrite.replace` returns the :class:`Replacement` nodes (with their new tensors,
constants and parameters) that compute the same function *exactly*, up to float rounding.
Each rule lives in one file of this package and registers itself in :data:`REWRITES`;
:func:`apply_rewrite` splices a replacement into a graph. Which rule to use and whether a
rewrite beats the host fallback is the cost program's decision
(:mod:`npujax.plan.decompose`), never a rule's.
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np

from npujax.errors import GraphError
from npujax.hw.spec import OpsSpec
from npujax.ir.graph import Graph, Node, Params, TensorType

__all__ = ["Rewrite", "Replacement", "REWRITES", "register_rewrite", "rewrite_for",
           "apply_rewrite"]


@dataclasses.dataclass(frozen=True)
class Replacement:
    """What replaces one node.

    Attributes:
      nodes: the new nodes in topological order; the last writes the old node's outputs.
      tensors: the :class:`TensorType` of every new intermediate tensor and constant.
      constants: the new constant arrays (float32 scalars and per-pixel divisors).
      params: ``{new node: {role: array}}`` for the new nodes that read weights (empty when the
        graph is rewritten for costing alone, without parameters).
    """

    nodes: tuple[Node, ...]
    tensors: Mapping[str, TensorType]
    constants: Mapping[str, np.ndarray] = dataclasses.field(default_factory=dict)
    params: Params = dataclasses.field(default_factory=dict)


class Rewrite(abc.ABC):
    """One exact rewrite rule of one operator.

    Class attributes:
      name: the rule's registry name (e.g. ``leaky_relu_max``).
      op: the Graph operator it rewrites (e.g. ``LeakyRelu``).
      formula: the identity it applies, for reports.
      source: the specification the identity follows.
    """

    name: ClassVar[str]
    op: ClassVar[str]
    formula: ClassVar[str]
    source: ClassVar[str]

    @abc.abstractmethod
    def refuse(self, graph: Graph, node: Node, ops: OpsSpec) -> str:
        """``""`` if the rule rewrites ``node`` exactly into operators ``ops`` runs, else why not
        (one sentence naming the attribute or missing operator)."""

    @abc.abstractmethod
    def replace(self, graph: Graph, node: Node, params: Params | None,
                ops: OpsSpec) -> Replacement:
        """The nodes computing ``node``'s function (call only where :meth:`refuse` is ``""``).

        Args:
          graph: the graph holding ``node`` (for tensor shapes).
          node: the node to rewrite.
          params: the graph's params, or None to rewrite the structure alone (for costing).
          ops: the NPU's operator constraints.
        """


#: ``{operator: rule}``: the one rule per operator (:func:`register_rewrite`).
REWRITES: dict[str, Rewrite] = {}


def register_rewrite(cls: type[Rewrite]) -> type[Rewrite]:
    """Class decorator: register one instance of ``cls`` for its ``op``."""
    if cls.op in REWRITES:
        raise GraphError(f"a rewrite of {cls.op} is already registered "
                         f"({REWRITES[cls.op].name}); one rule per operator.")
    REWRITES[cls.op] = cls()
    return cls


def rewrite_for(op: str) -> Rewrite | None:
    """The registered rule of operator ``op``, or None."""
    return REWRITES.get(op)


class Builder:
    """Fresh names, tensors and constants for one replacement (used by the rules)."""

    def __init__(self, graph: Graph, node: Node) -> None:
        self.graph, self.node = graph, node
        self.taken = set(graph.tensors) | {n.name for n in graph.nodes}
        self.nodes: list[Node] = []
        self.tensors: dict[str, TensorType] = {}
        self.constants: dict[str, np.ndarray] = {}
        self.params: Params = {}
        self.dtype = graph.tensors[node.outputs[0]].dtype

    def fresh(self, suffix: str) -> str:
        base, i = f"{self.node.name}/{suffix}", 1
        name = base
        while name in self.taken:
            name, i = f"{base}_{i}", i + 1
        self.taken.add(name)
        return name

    def const(self, suffix: str, value: Any) -> str:
        """A float constant tensor (a scalar or an array) of the node's dtype."""
        arr = np.asarray(value, dtype=self.dtype)
        name = self.fresh(suffix)
        self.constants[name] = arr
        self.tensors[name] = TensorType(tuple(int(d) for d in arr.shape), str(arr.dtype))
        return name

    def add(self, op: str, inputs: tuple[str, ...], suffix: str, *,
            shape: tuple[int, ...] | None = None, output: str | None = None,
            attrs: Mapping[str, Any] | None = None, params: Mapping[str, Any] | None = None,
            roles: tuple[str, ...] = ()) -> str:
        """Append a node; returns its output tensor (``output`` if given, else a new one of
        ``shape``, default the rewritten node's output shape). ``roles`` are the parameter
        roles it reads, ``params`` their arrays (None when rewriting without parameters)."""
        name = self.fresh(suffix)
        if output is None:
            output = self.fresh(f"{suffix}_out")
            sh = shape if shape is not None else self.graph.tensors[self.node.outputs[0]].shape
            self.tensors[output] = TensorType(tuple(int(d) for d in sh), self.dtype)
        self.nodes.append(Node(name, op, inputs, (output,), dict(attrs or {}), roles))
        if params is not None:
            self.params[name] = dict(params)
        return output

    def done(self) -> Replacement:
        return Replacement(tuple(self.nodes), self.tensors, self.constants, self.params)


def apply_rewrite(graph: Graph, params: Params | None, node_name: str, rule: Rewrite,
                  ops: OpsSpec) -> tuple[Graph, Params | None]:
    """``graph`` (and ``params``) with node ``node_name`` replaced by ``rule``'s nodes.

    Raises:
      UnsupportedOpError: the rule refuses the node (its message says why).
    """
    from npujax.errors import UnsupportedOpError

    node = graph.node(node_name)
    why = rule.refuse(graph, node, ops)
    if why:
        raise UnsupportedOpError(f"rewrite {rule.name} of node {node_name!r} ({node.op}): {why}")
    rep = rule.replace(graph, node, params, ops)
    nodes: list[Node] = []
    for n in graph.nodes:
        nodes.extend(rep.nodes if n is node else (n,))
    new_graph = graph.replace(nodes=tuple(nodes), tensors={**graph.tensors, **rep.tensors},
                              constants={**graph.constants, **rep.constants})
    if params is None:
        return new_graph, None
    out = {k: v for k, v in params.items() if k != node_name}
    out.update(rep.params)
    return new_graph, out

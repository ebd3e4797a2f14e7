"""Activation memory over time: which tensors are alive at each step of the execution order."""

from __future__ import annotations

import weakref

from npujax.ir.graph import Graph
from npujax.plan.workload import lowering_cost

__all__ = ["peak_activation_bytes"]


_PEAK: weakref.WeakKeyDictionary[Graph, dict[int, int]] = weakref.WeakKeyDictionary()


def peak_activation_bytes(graph: Graph, act_bits: int = 8) -> int:
    """Peak bytes of live activations when the nodes run in graph order.

    A tensor is live from the step that produces it (graph inputs: from the start) until the last
    step that reads it (graph outputs: until the end). Shape-only ops (Reshape, ...) alias their
    input and add nothing. Weights and constants are not activations and are not counted.

    Args:
      graph: the model graph.
      act_bits: bits per activation element.

    Returns:
      The peak over all steps of the summed live activation sizes (bytes, rounded up).
    """
    per_graph = _PEAK.setdefault(graph, {})  # graphs are immutable: once per (graph, width)
    if act_bits not in per_graph:
        per_graph[act_bits] = _peak(graph, act_bits)
    return per_graph[act_bits]


def _peak(graph: Graph, act_bits: int) -> int:
    cost = lowering_cost(graph)
    alias: dict[str, str] = {}

    def root(t: str) -> str:
        while t in alias:
            t = alias[t]
        return t

    for n in graph.nodes:
        if cost[n.name] == "free":
            alias[n.outputs[0]] = n.inputs[0]
    last_use: dict[str, int] = {}
    for i, n in enumerate(graph.nodes):
        for t in n.inputs:
            if t not in graph.constants:
                last_use[root(t)] = i
    end = len(graph.nodes)
    for t in graph.outputs:
        last_use[root(t)] = end
    size = {t: -(-graph.tensors[t].size * act_bits // 8) for t in graph.tensors}
    live = {root(t) for t in graph.inputs}
    peak = sum(size[t] for t in live)
    for i, n in enumerate(graph.nodes):
        if cost[n.name] != "free":
            live |= {root(t) for t in n.outputs}
        peak = max(peak, sum(size[t] for t in live))
        live = {t for t in live if last_use.get(t, -1) > i}
    return int(peak)

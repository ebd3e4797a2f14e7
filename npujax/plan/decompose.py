"""Decompose instead of falling back: per layer, the cheaper of the host fallback and a rewrite.

A compiler that meets an operator its NPU does not run can fall back to the host CPU, rewrite
the operator into ones the NPU runs (:mod:`npujax.ir.rewrites`), or refuse. With the preset's
``ops.unsupported = "rewrite_or_fallback"``, :func:`decompose` walks the graph's unsupported
layers in order; for each with a rule that applies, it lowers the whole graph with the layer
rewritten and with it on the host, through the one cost program (so the host link's
transfers, the ``rest_of_graph`` partition that a fallback starts, fusion and invocation
overheads all count), and keeps the cheaper (a tie keeps the fallback). Later decisions see
the earlier ones. ``rewrite_or_refuse`` rewrites every layer a rule applies to and raises for
any other unsupported layer; ``fallback`` (the default) changes nothing.

The decision takes concrete hardware numbers, so it is made by :func:`npujax.lower` (on the
first dataflow asked for); a sweep over traced specs costs the graph it is given (call
:func:`npujax.plan.decompose_unsupported` first, for one spec, to sweep the rewritten graph).
:func:`choose_rewrites` is the decision given a latency function;
:func:`npujax.plan.decompose_unsupported` calls it with :func:`npujax.lower`'s.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from npujax.errors import UnsupportedOpError
from npujax.hw.spec import NpuSpec, as_spec
from npujax.ir.graph import Graph, Params
from npujax.ir.rewrites import apply_rewrite, rewrite_for
from npujax.plan.workload import lowering_cost, workloads

if TYPE_CHECKING:
    from npujax.quantize.spec import QuantSpec

__all__ = ["RewriteChoice", "Decomposition", "choose_rewrites", "CHOICES"]

#: What happened to an unsupported layer (``RewriteChoice.choice``).
CHOICES = ("rewrite", "fallback", "refused")


@dataclasses.dataclass(frozen=True)
class RewriteChoice:
    """The decision for one unsupported layer.

    Attributes:
      node, op: the original layer and its operator.
      rule: the rewrite rule considered ("" if none applies).
      choice: ``rewrite`` or ``fallback`` (:data:`CHOICES`).
      fallback_s, rewrite_s: the whole graph's latency (s) with this layer on the host and with
        it rewritten (the others as decided); ``rewrite_s`` None where no rule applies.
      reason: why (the rule's refusal, or the comparison).
      nodes: the layers the rewrite made (empty for a fallback).
    """

    node: str
    op: str
    rule: str
    choice: str
    fallback_s: float | None
    rewrite_s: float | None
    reason: str
    nodes: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return {**dataclasses.asdict(self), "nodes": list(self.nodes)}


@dataclasses.dataclass(frozen=True)
class Decomposition:
    """The graph with the chosen rewrites, its params (None if none were given), the choices,
    and the quantization spec with each rewritten layer's entry copied to the GEMMs it became."""

    graph: Graph
    params: Params | None
    choices: tuple[RewriteChoice, ...]
    quant: Any = None


def _unsupported(graph: Graph, spec: NpuSpec) -> list[str]:
    """The layers that ``spec`` sends to the host for themselves (not the ``rest_of_graph``
    partition behind them), in graph order."""
    per_op = spec if spec.ops.fallback == "per_op" else \
        spec.with_fields({"ops.fallback": "per_op"})
    nodes = {n.name for n in graph.nodes}
    return [w.name for w in workloads(graph, per_op) if w.device == "cpu" and w.name in nodes]


def _quant_for(quant: Any, old: str, new_gemms: list[str]) -> Any:
    if quant is None or old not in quant:
        return quant
    lq = quant[old]
    out = {k: v for k, v in quant.items() if k != old}
    out.update({n: lq for n in new_gemms})
    return out


def choose_rewrites(graph: Graph, spec: NpuSpec | str,
                    latency: Callable[[Graph, Any, NpuSpec], float],
                    params: Params | None = None, quant: QuantSpec | None = None, *,
                    policy: str | None = None) -> Decomposition:
    """Rewrite, fall back or refuse each unsupported layer as ``spec.ops.unsupported`` says.

    Args:
      graph: an optimized graph.
      spec: the NPU (an :class:`~npujax.hw.NpuSpec`, a preset name or a TOML path).
      latency: ``(graph, quant, spec) -> seconds``, the whole graph's latency on ``spec``
        (whose ``ops.unsupported`` is ``fallback``), e.g. :func:`npujax.lower`'s.
      params: the graph's params, rewritten along (new kernels for split convolutions and
        pools); None rewrites the structure alone, enough for the cost model.
      quant: the layers' precision; a rewritten GEMM's entry carries over to the GEMMs it
        becomes.
      policy: overrides ``spec.ops.unsupported`` (:data:`~npujax.hw.UNSUPPORTED_POLICIES`).

    Returns:
      A :class:`Decomposition`: the graph to lower, its params, one :class:`RewriteChoice` per
      unsupported layer that has a rule (and, under ``rewrite_or_fallback``, per other
      unsupported layer, with ``rule=""``).

    Raises:
      UnsupportedOpError: under ``rewrite_or_refuse``, a layer the NPU does not run that no
        rule rewrites (the message names it and the rule's refusal).
      ConfigError: as :func:`npujax.lower`.
    """
    spec = as_spec(spec)
    policy = policy or spec.ops.unsupported
    choices: list[RewriteChoice] = []
    if policy == "fallback":
        return Decomposition(graph, params, (), quant)
    base = spec.with_fields({"ops.unsupported": "fallback"})

    cost = lowering_cost(graph)
    now = latency(graph, quant, base) if policy == "rewrite_or_fallback" else None
    for name in _unsupported(graph, spec):
        node = graph.node(name)
        if cost.get(name) == "free":
            continue
        rule = rewrite_for(node.op)
        op = node.attrs.get("onnx_op", node.op) if node.op == "CpuFallback" else node.op
        why = rule.refuse(graph, node, spec.ops) if rule is not None else \
            f"no rewrite rule for {op}"
        if why:
            if policy == "rewrite_or_refuse":
                raise UnsupportedOpError(
                    f"layer {name!r} ({node.op}) does not run on {spec.name} and cannot be "
                    f"rewritten: {why}. Use ops.unsupported = 'rewrite_or_fallback' to send it "
                    "to the host, or a preset that runs it.")
            choices.append(RewriteChoice(name, node.op, rule.name if rule else "", "fallback",
                                         now, None, why))
            continue
        assert rule is not None  # (no refusal: a rule applies)
        before = {n.name for n in graph.nodes}
        g2, p2 = apply_rewrite(graph, params, name, rule, spec.ops)
        made = tuple(n.name for n in g2.nodes if n.name not in before)
        gemms = [n.name for n in g2.nodes if n.name in made and
                 lowering_cost(g2).get(n.name) == "array"]
        q2 = _quant_for(quant, name, gemms)
        if policy == "rewrite_or_refuse":
            graph, params, quant = g2, p2, q2
            choices.append(RewriteChoice(name, node.op, rule.name, "rewrite", None, None,
                                         "the preset refuses host fallback", made))
            continue
        new = latency(g2, q2, base)
        assert now is not None
        if new < now:
            why = (f"{rule.formula}: {new * 1e6:,.2f} µs < {now * 1e6:,.2f} µs with the "
                   "host fallback")
            choices.append(RewriteChoice(name, node.op, rule.name, "rewrite", now, new, why, made))
            graph, params, quant, now = g2, p2, q2, new
        else:
            why = (f"the host fallback ({now * 1e6:,.2f} µs) is not slower than the rewrite "
                   f"{rule.formula} ({new * 1e6:,.2f} µs)")
            choices.append(RewriteChoice(name, node.op, rule.name, "fallback", now, new, why))
    return Decomposition(graph, params, tuple(choices), quant)

"""Sweeps over model shapes (sequence length, resolution) in one compiled cost program.

:func:`npujax.lower` compiles one cost program per workload list, because the workloads' sizes
are constants of it. A sweep over a transformer's sequence length changes only the sizes, not
the structure (the same layers, devices, producers and fusion groups), so :func:`sweep_shapes`
stacks the sizes (:data:`~npujax.plan.costs.SHAPE_FIELDS`) of every point into ``[S, L]``
arrays and evaluates the one cost program (:func:`~npujax.plan.program_costs`) on them with
``jax.vmap``: one compilation for the whole sweep instead of one per point, with the same
numbers (bit for bit) as lowering each point. Given the points' graphs, it fuses their
attention blocks as the preset's ``ops.attention_fusion`` declares (the attention pass on the
traced sizes), as ``lower`` does; a preset with ``layer`` fusion is refused by the program (its
cross-layer placement is costed on static sizes: lower each point).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import TYPE_CHECKING

import jax
import jax.numpy as jnp
import numpy as np

from npujax.errors import ConfigError
from npujax.hw.spec import NpuSpec, as_spec
from npujax.ir.graph import Graph
from npujax.plan.costs import SHAPE_FIELDS, LayerCosts
from npujax.plan.lower import layer_bits
from npujax.plan.passes.attention import AttentionChain, attention_chains, fuses
from npujax.plan.passes.base import LATENCY
from npujax.plan.program import check_program, program_cost
from npujax.plan.workload import Workload, workloads

if TYPE_CHECKING:
    from npujax.quantize.spec import QuantSpec

__all__ = ["sweep_shapes", "structure"]


def structure(layers: Sequence[Workload]) -> tuple:
    """What must agree between the points of a shape sweep: every layer's name, operator,
    kind, device, producer, fused group and epilogue."""
    return tuple((w.name, w.op, w.kind, w.device, w.producer, w.fused_into, w.epilogue)
                 for w in layers)


@functools.lru_cache(maxsize=16)
def _program(layers: tuple[Workload, ...], dataflow: str | None,
             chains: tuple[AttentionChain, ...]):
    def one(spec, wb, ab, shapes):
        return program_cost(layers, spec, wb, ab, dataflow, chains=chains, mode=LATENCY,
                            shapes=shapes).costs

    return jax.jit(jax.vmap(one, in_axes=(None, None, None, 0)))


def _static(chain: AttentionChain) -> AttentionChain:
    """A chain without its sizes (what must agree between the points)."""
    return chain._replace(key_len=0, query_rows=0, head_dim=0, groups=0)


def sweep_shapes(points: Sequence[Graph | Sequence[Workload]], spec: NpuSpec | str,
                 quant: QuantSpec | None = None, *, dataflow: str | None = None) -> LayerCosts:
    """The per-layer costs of every point of a shape sweep, in one vmapped program.

    Args:
      points: the sweep's points, e.g. one traced graph per sequence length: optimized
        :class:`~npujax.ir.Graph` s (their workloads built on ``spec``; their attention blocks
        fused as ``spec.ops.attention_fusion`` declares) or workload lists
        (:func:`npujax.plan.workloads`); all of the same :func:`structure`.
      spec: the NPU (an :class:`~npujax.hw.NpuSpec`, a preset name or a TOML path).
      quant: the precision (the same layer names at every point); None: 8 bits.
      dataflow: overrides the preset's dataflow.

    Returns:
      :class:`~npujax.plan.LayerCosts` of ``[S, L]`` arrays (the counts in 64 bits, exact);
      ``latency_cycles.sum(-1) / clock_hz`` is each point's latency, equal to
      ``npujax.lower(graph_s, spec, quant).latency_s``.

    Raises:
      ConfigError: no points; points of different structure or attention blocks (another
        layer list: lower them separately); a spec with ``layer`` fusion; workload lists with
        a Softmax on the NPU when the spec fuses attention (the blocks are recognised on the
        graph: pass the graphs).
    """
    spec = as_spec(spec)
    if not points:
        raise ConfigError("sweep_shapes needs at least one point (a graph or workload list).")
    graphs = [p if isinstance(p, Graph) else None for p in points]
    lists = [workloads(p, spec) if isinstance(p, Graph) else list(p) for p in points]
    first = tuple(lists[0])
    ref = structure(first)
    for i, p in enumerate(lists[1:], 1):
        if structure(p) != ref:
            raise ConfigError(f"point {i} of the shape sweep has another layer structure than "
                              "point 0 (layers, devices or fusion differ); lower it on its own.")
    chains: tuple[AttentionChain, ...] = ()
    if fuses(spec):
        if any(g is None for g in graphs):
            if any(w.op == "Softmax" and w.device == "npu" for w in first):
                raise ConfigError(
                    f"{spec.name!r} fuses attention (ops.attention_fusion = "
                    f"{spec.ops.attention_fusion!r}) and its blocks are recognised on the "
                    "graph: pass the points' graphs to sweep_shapes, not their workload lists.")
        else:
            found = [attention_chains(g, w) for g, w in zip(graphs, lists) if g is not None]
            chains = found[0]
            for i, c in enumerate(found[1:], 1):
                if tuple(map(_static, c)) != tuple(map(_static, chains)):
                    raise ConfigError(f"point {i} of the shape sweep has other attention blocks "
                                      "than point 0; lower it on its own.")
    check_program(spec, chains, LATENCY, shapes=True)  # e.g. layer fusion: static sizes only
    wb, ab = layer_bits(list(first), quant)
    with jax.enable_x64(True):
        shapes = {f: jnp.asarray(np.asarray([[getattr(w, f) for w in p] for p in lists],
                                            np.int64)) for f in SHAPE_FIELDS}
        costs = _program(first, dataflow, chains)(spec, jnp.asarray(wb), jnp.asarray(ab),
                                                   shapes)
        return jax.tree.map(np.asarray, costs)

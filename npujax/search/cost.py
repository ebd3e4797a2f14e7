"""Differentiable latency cost of per-layer bit-width choices, from the same lowering as ``lower``.

For GEMM layer ``l`` with candidate weight widths ``b_1..b_n`` and selection probabilities
``p_l`` (a softmax over learned logits), the relaxed latency is the expectation

    E[latency] = sum_l sum_i p_li * latency_l(b_i)  +  latency of the other (vector) layers,

where ``latency_l(b_i)`` is the exact per-layer latency of :func:`npujax.plan.layer_costs`
(the same numbers ``npujax lower`` prints). At one-hot ``p`` it equals the exact latency of that
policy; its gradient w.r.t. the logits orders candidates as their exact latencies do. This is the
expected-cost relaxation of differentiable NAS (FBNet: Wu et al., CVPR 2019; EdMIPS: Cai and
Vasconcelos, CVPR 2020).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from npujax.graph.ir import Graph
from npujax.hw.spec import NpuSpec
from npujax.plan.latency import HwParams, layer_costs
from npujax.plan.workload import workloads

__all__ = ["LatencyTable", "latency_table", "expected_latency"]


@dataclasses.dataclass(frozen=True)
class LatencyTable:
    """Exact per-layer latencies for every candidate weight width.

    Attributes:
      layers: GEMM layer names, in graph order (rows of ``seconds``).
      candidates: candidate weight widths (columns of ``seconds``).
      seconds: float32 ``[L, n]``, latency of layer ``l`` at width ``candidates[i]`` (s).
      fixed_s: latency of the layers whose cost does not depend on weight bits (s).
    """

    layers: tuple[str, ...]
    candidates: tuple[int, ...]
    seconds: jax.Array
    fixed_s: float

    def latency_s(self, policy: dict[str, int]) -> float:
        """Exact latency of a one-hot policy ``{layer: weight_bits}`` (s)."""
        cols = [self.candidates.index(int(policy[n])) for n in self.layers]
        return float(np.sum(np.asarray(self.seconds)[np.arange(len(cols)), cols]) + self.fixed_s)


def latency_table(
    graph: Graph,
    spec: NpuSpec,
    candidates: Sequence[int],
    act_bits: int = 8,
    dataflow: str | None = None,
) -> LatencyTable:
    """Tabulate exact GEMM-layer latency per candidate weight width on ``spec``.

    Args:
      graph: optimized graph (BN folded, activations fused).
      spec: the NPU.
      candidates: candidate weight widths, e.g. ``(2, 4, 8)``.
      act_bits: activation width of every layer.
      dataflow: overrides the preset's dataflow.

    Returns:
      A :class:`LatencyTable`.
    """
    layers = workloads(graph, spec)
    gemm = [i for i, w in enumerate(layers) if w.kind == "gemm"]
    hw = HwParams.from_spec(spec)
    df = dataflow or spec.array.dataflow
    cols = []
    for b in candidates:
        c = layer_costs(layers, hw, jnp.full(len(layers), float(b)),
                        jnp.full(len(layers), float(act_bits)), df,
                        spec.array.precision_scaling)
        cols.append(c["latency_cycles"] / spec.array.clock_hz)
    table = jnp.stack(cols, axis=1)  # [all layers, n]
    fixed = float(sum(float(table[i, 0]) for i in range(len(layers)) if i not in gemm))
    return LatencyTable(
        tuple(layers[i].name for i in gemm), tuple(int(b) for b in candidates),
        table[jnp.asarray(gemm, jnp.int32)], fixed,
    )


def expected_latency(probs: jax.Array, table: LatencyTable) -> jax.Array:
    """Relaxed latency (s): ``sum(probs * table.seconds) + table.fixed_s``.

    Args:
      probs: float32 ``[L, n]`` selection probabilities (rows sum to 1).
      table: from :func:`latency_table`.

    Returns:
      float32 scalar, differentiable w.r.t. ``probs``.
    """
    return jnp.sum(probs * table.seconds) + table.fixed_s

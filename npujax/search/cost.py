"""Differentiable latency cost of per-layer bit-width choices, from the same lowering as ``lower``.

For GEMM layer ``l`` with candidate (weight, activation) widths ``c_1..c_n`` and selection
probabilities ``p_l`` (a softmax over learned logits), the relaxed latency is the expectation

    E[latency] = sum_l sum_i p_li * latency_l(c_i)  +  latency of the other (vector) layers,

where ``latency_l(c_i)`` is the exact per-layer latency of :func:`npujax.plan.layer_costs`
(the same numbers ``npujax lower`` prints). At one-hot ``p`` it equals the exact latency of that
policy; its gradient w.r.t. the logits orders candidates as their exact latencies do. This is the
expected-cost relaxation of differentiable NAS (FBNet: Wu et al., CVPR 2019; EdMIPS: Cai and
Vasconcelos, CVPR 2020).

A layer's latency depends only on its own widths (a GEMM's output stage requantizes for free, so
chains of layers never pay conversions); vector layers (pooling, ...) are costed at the widest
activation candidate, an upper bound. The table holds the per-layer latencies of the one cost
program (:func:`npujax.plan.program_costs`, the numbers ``lower`` reports): layer fusion when
``ops.fusion = "layer"``, the attention blocks fused as ``ops.attention_fusion`` declares, each
column with every layer at that candidate. Which activations stay on chip and how an attention block
is tiled depend on the neighbours' widths too, so on such a preset the table is exact at uniform
policies (equal to ``lower``'s per-layer latencies, to float32) and an approximation for mixed ones.
:func:`npujax.plan.lower` gives the exact latency of the final policy.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from npujax.errors import ConfigError
from npujax.hw.spec import NpuSpec
from npujax.ir.graph import Graph
from npujax.plan.lower import lower
from npujax.plan.passes.base import LATENCY
from npujax.plan.program import network, program_cost
from npujax.quantize.spec import quant_spec

__all__ = ["LatencyTable", "latency_table", "expected_latency", "policy_latency_s"]


Choice = tuple[int, int]  # (weight_bits, act_bits)


@dataclasses.dataclass(frozen=True)
class LatencyTable:
    """Exact per-layer latencies for every candidate (weight, activation) width pair.

    Attributes:
      layers: GEMM layer names, in graph order (rows of ``seconds``).
      candidates: ``(weight_bits, act_bits)`` per column of ``seconds``.
      seconds: float32 ``[L, n]``, latency of layer ``l`` with candidate ``i`` (s).
      fixed_s: latency of the layers whose cost does not depend on the choice (s).
    """

    layers: tuple[str, ...]
    candidates: tuple[Choice, ...]
    seconds: jax.Array
    fixed_s: float

    @property
    def weight_candidates(self) -> tuple[int, ...]:
        """The distinct weight widths, in column order."""
        return tuple(dict.fromkeys(w for w, _ in self.candidates))

    def column(self, choice: int | Sequence[int]) -> int:
        """Column of a choice: ``(w, a)``, or ``w`` when there is one activation width."""
        if isinstance(choice, (int, np.integer)):
            cols = [i for i, (w, _) in enumerate(self.candidates) if w == int(choice)]
            if len(cols) != 1:
                raise ConfigError(
                    f"weight width {choice} matches {len(cols)} candidates {self.candidates}; "
                    "give (weight_bits, act_bits)."
                )
            return cols[0]
        key = (int(choice[0]), int(choice[1]))
        if key not in self.candidates:
            raise ConfigError(f"{key} is not among the candidates {self.candidates}.")
        return self.candidates.index(key)

    def latency_s(self, policy: Mapping[str, int | Sequence[int]]) -> float:
        """Latency of a one-hot policy ``{layer: w or (w, a)}`` under this table (s)."""
        cols = [self.column(policy[n]) for n in self.layers]
        sec = np.asarray(self.seconds, np.float64)
        return float(np.sum(sec[np.arange(len(cols)), cols]) + self.fixed_s)


def latency_table(
    graph: Graph,
    spec: NpuSpec,
    candidates: Sequence[int],
    act_bits: int | Sequence[int] = 8,
    dataflow: str | None = None,
) -> LatencyTable:
    """Tabulate exact GEMM-layer latency for every (weight, activation) candidate on ``spec``.

    Args:
      graph: optimized graph (BN folded, activations fused).
      spec: the NPU.
      candidates: candidate weight widths, e.g. ``(2, 4, 8)``.
      act_bits: one activation width, or the candidate activation widths.
      dataflow: overrides the preset's dataflow.

    Returns:
      A :class:`LatencyTable` with one column per (weight, activation) pair.
    """
    acts = (act_bits,) if isinstance(act_bits, int) else tuple(act_bits)
    pairs = tuple((int(w), int(a)) for w, a in itertools.product(candidates, acts))
    if not pairs:
        raise ConfigError("latency_table needs at least one candidate width.")
    layers, chains = network(graph, spec)
    gemm = [i for i, w in enumerate(layers) if w.kind == "gemm"]
    n = len(layers)

    @jax.vmap  # every (w, a) column in one compiled program (op by op: ~100 compilations)
    def column(w, a):
        c = program_cost(layers, spec, jnp.full(n, w), jnp.full(n, a), dataflow,
                         chains=chains, mode=LATENCY).costs
        return (c.latency_cycles / spec.array.clock_hz).astype(jnp.float32)

    with jax.enable_x64(True):  # float64 as in lower, then the table's float32 seconds
        ws, acts_ = (jnp.asarray([p[i] for p in pairs], jnp.float64) for i in (0, 1))
        # [all layers, n], on the host: indexing it eagerly compiled ~10 programs per shape
        table = np.asarray(jax.jit(column)(ws, acts_)).T
    widest = pairs.index((pairs[0][0], max(acts)))
    fixed = float(sum(float(table[i, widest]) for i in range(n) if i not in gemm))
    return LatencyTable(tuple(layers[i].name for i in gemm), pairs,
                        jax.device_put(table[np.asarray(gemm, np.int64)]), fixed)


def expected_latency(probs: jax.Array, table: LatencyTable) -> jax.Array:
    """Relaxed latency (s): ``sum(probs * table.seconds) + table.fixed_s``.

    Args:
      probs: float32 ``[L, n]`` selection probabilities (rows sum to 1).
      table: from :func:`latency_table`.

    Returns:
      float32 scalar, differentiable w.r.t. ``probs``.
    """
    return jnp.sum(probs * table.seconds) + table.fixed_s


def policy_latency_s(graph: Graph, spec: NpuSpec, choice: Mapping[str, Sequence[int]],
                     dataflow: str | None = None) -> float:
    """Exact lowered latency (s) of a ``{layer: (weight_bits, act_bits)}`` policy on ``spec``
    (:func:`npujax.plan.lower`, including the precision conversions the table leaves out)."""
    quant = quant_spec(graph, {n: int(c[0]) for n, c in choice.items()},
                       {n: int(c[1]) for n, c in choice.items()})
    return lower(graph, spec, quant, dataflow=dataflow).latency_s

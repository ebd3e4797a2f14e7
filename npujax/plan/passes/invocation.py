"""A fixed cost per inference: the host's call into the NPU and its round trips.

Every inference of an accelerator attached to a host pays a fixed cost besides its layers: the
runtime's invocation (a driver call, command submission, the completion interrupt or poll) and
the link's round trips that carry the graph's input in and its output back. A model of a few
milliseconds notices it: the Coral Edge TPU runs MobileNet v1 and v2 in 2.4 and 2.6 ms on both of
its hosts (Coral's benchmarks page, Table 1), 0.4-0.5 ms more than their layers
(docs/results/fidelity.md). The preset states it as ``host.invocation_overhead_s`` (default 0:
none), a traced field that ``fit --table`` can fit where the table has enough small models to
identify it (Coral's two MobileNets do not: ±90 %).

The pass adds ``invocation_overhead_s x clock_hz`` cycles to the first layer's host-transfer time
(``transfer_cycles``) and latency, once per inference, so the schedule's total, the report's
``transfer`` column and every consumer of the one cost program include it. With the default 0 the
costs are unchanged bit for bit (``x + 0.0``). Not modelled: overlap of one inference's overhead
with the previous inference's layers (pipelined invocations; npujax models one inference at a
time).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from npujax._exact import real
from npujax.hw.spec import NpuSpec
from npujax.plan.passes.base import (
    CostMode,
    CostPass,
    PassInput,
    ProgramCosts,
    maybe_nonzero,
    once_per_inference,
)

if TYPE_CHECKING:
    from npujax.plan.passes.attention import AttentionChain

__all__ = ["PASS"]


def _apply(inp: PassInput, state: ProgramCosts) -> ProgramCosts:
    spec = inp.spec
    cycles = real(spec.host.invocation_overhead_s) * real(spec.array.clock_hz)
    return state._replace(costs=once_per_inference(state.costs, "transfer_cycles", cycles))


def _applies(spec: NpuSpec, chains: tuple[AttentionChain, ...], mode: CostMode) -> bool:
    return maybe_nonzero(spec.host.invocation_overhead_s)


#: The per-inference overhead as a cost pass, after the weights' streaming.
PASS = CostPass("invocation", 50, _applies, _apply)

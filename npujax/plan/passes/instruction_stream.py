"""The compiled instruction stream, read from off-chip memory on every inference.

Some NPUs keep no program on chip: the runtime sends the compiled instructions with every
inference. The Coral Edge TPU's runtime (libedgetpu) does: a compiled model holds a
``PARAMETER_CACHING`` executable, run once to fill the parameter cache, and an
``EXECUTION_ONLY`` executable, whose instruction bitstream is sent to the device on every
inference, ahead of the input, over the same link as the streamed parameters. Public USB
captures of Coral's own files show transfers of exactly the bitstreams' sizes on every inference
(RingCanary/coral-usb-oxidized, ``docs/usb_executable_transport_correlation.md``):
``mobilenet_v1_1.0_224_quant_edgetpu`` sends 225,824 B of instructions and 150,528 B of input
per inference, ``mobilenet_v2_1.0_224_inat_bird_quant_edgetpu`` 272,144 B of instructions,
``inception_v1_224_quant_edgetpu`` 357,856 B (in two chunks) plus 393,664 B of parameters it
does not cache. A single Dense layer compiles to 4-11 kB (the same repository's
``dense_instruction_size_table.tsv``). At a few hundred MB/s that is 0.5-0.9 ms of a 2-4 ms
inference.

A preset states it as ``memory.instruction_bytes_per_op`` (default 0: none, the pass does not
run): the bytes of instructions per NPU operation, an NPU layer not fused into another's output
stage (what a TFLite operator is). The pass adds
``operations x instruction_bytes_per_op / dram_bytes_per_s`` to the first layer's ``dma_cycles``
and latency, once per inference: the instructions are read from the NPU's off-chip memory (on
the Edge TPU, host memory across USB or PCIe, the ``dram_bytes_per_s`` of its presets) before
the layers run, not overlapped with them (the USB captures show the bitstream sent before the
input). The field and the rate are traced: ``jax.vmap`` over stacked specs, a fit of the rate
and the relaxed mode follow it; the operation count is a sum of the layer table's structure, so
a traced layer table works too.

Not modelled: the instruction bytes' energy (their DRAM reads and the instruction memory), a
per-operator size (a convolution's loops may compile to more than a Dense layer's), and overlap
with the previous inference (npujax models one inference at a time).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import jax.numpy as jnp

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
from npujax.plan.table import LayerTable

if TYPE_CHECKING:
    from npujax.plan.passes.attention import AttentionChain

__all__ = ["PASS", "npu_operations"]


def npu_operations(layers: Any) -> Any:
    """The NPU operations of a workload list or :class:`~npujax.plan.LayerTable`: layers on the
    NPU that are not fused into another layer's output stage (int, traced with a traced table)."""
    if isinstance(layers, LayerTable):
        return jnp.sum(jnp.asarray(layers.npu) & ~jnp.asarray(layers.fused))
    return sum(w.device == "npu" and not w.fused_into for w in layers)


def _apply(inp: PassInput, state: ProgramCosts) -> ProgramCosts:
    spec = inp.spec
    seconds = (real(npu_operations(inp.layers)) * real(spec.memory.instruction_bytes_per_op)
               / real(spec.memory.dram_bytes_per_s))
    return state._replace(costs=once_per_inference(state.costs, "dma_cycles",
                                                   seconds * real(spec.array.clock_hz)))


def _applies(spec: NpuSpec, chains: tuple[AttentionChain, ...], mode: CostMode) -> bool:
    return maybe_nonzero(spec.memory.instruction_bytes_per_op)


#: The per-inference instruction stream as a cost pass, after the fixed cost per inference.
PASS = CostPass("instruction_stream", 55, _applies, _apply)

"""Weights held in an on-chip parameter cache, the rest streamed on every inference.

Some NPUs keep a model's weights on chip between inferences. The Coral Edge TPU's compiler
caches parameters in about 8 MB of on-chip SRAM (its logs offer 6.9-7.9 MiB for them), and the
parameters that do not fit stream from host memory over USB or PCIe on every inference; VGG16's
time on the USB Accelerator is its weight bytes over the host link (Coral's benchmarks page;
``docs/results/fidelity.md``). The preset says so with ``memory.parameter_cache``
(:data:`~npujax.hw.PARAMETER_CACHES`) and
``memory.parameter_cache_bytes``:

* **Residency.** The cache is filled in schedule order with whole layers' weights and biases
  (``weight_elems x w_bits/8 + bias_elems x accumulator_bits/8``), as long as the running total
  fits: a layer whose parameters would overflow it, and every layer after it, stream. (Layer
  order is this model's assumption; the Edge TPU compiler does not document its order.)
* **Cached layers** read no weights from DRAM: the layer's weight traffic
  (``LayerCosts.weight_dram_bytes``: the stationary operand's tiled reads, re-fetches included,
  and the biases) is removed.
* **Streamed layers**, with ``streams_from_dram``, keep their DRAM traffic; with
  ``streams_from_host`` their weight traffic leaves DRAM and their parameters cross the host
  link once per inference: ``transfer += (link_latency_s + bytes / link_bytes_per_s) x clock``,
  not overlapped with compute (a conservative bound; the Edge TPU's overlap is not published).

Not modelled: the weights a depth-first pair of the cross-layer placement re-reads per stripe
are still read from DRAM for cached layers (pessimistic).

The changed rows are re-priced by the one recombination (:func:`npujax.plan.recombine.repriced`),
and the energy pass charges the streamed bytes at ``host_link_pj_per_byte``. Residency is a
piecewise-constant decision (no gradient); the costs follow it, so the relaxed mode, ``jax.vmap``
over stacked specs (``parameter_cache_bytes`` is a traced field, a sweep axis) and a traced layer
table all work.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import jax
import jax.numpy as jnp

from npujax._exact import real
from npujax.hw.spec import NpuSpec
from npujax.plan.passes.base import CostMode, CostPass, PassInput, ProgramCosts
from npujax.plan.recombine import repriced
from npujax.plan.table import layer_table

if TYPE_CHECKING:
    from npujax.plan.passes.attention import AttentionChain

__all__ = ["PASS", "weight_bytes"]


def weight_bytes(inp: PassInput) -> jax.Array:
    """float64 ``[L]`` parameter bytes of each NPU GEMM layer at its width (0 elsewhere)."""
    t = layer_table(inp.layers)
    acc = real(inp.spec.array.accumulator_bits)
    npu_gemm = jnp.asarray(t.npu) & jnp.asarray(t.gemm)
    return jnp.where(npu_gemm, real(t.weight_elems) * real(inp.weight_bits) / 8.0
                     + real(t.bias_elems) * acc / 8.0, 0.0)


def _apply(inp: PassInput, state: ProgramCosts) -> ProgramCosts:
    spec, costs = inp.spec, state.costs
    w_bytes = weight_bytes(inp)
    # whole layers in schedule order while the running total fits (a prefix of the layers)
    fill = jnp.cumsum(w_bytes) <= real(spec.memory.parameter_cache_bytes)
    cached = jax.lax.stop_gradient(fill & (w_bytes > 0))
    streamed = jax.lax.stop_gradient(~fill & (w_bytes > 0))
    w_traffic = real(state.unfused.weight_dram_bytes)
    from_host = spec.memory.parameter_cache == "streams_from_host"
    off = cached | streamed if from_host else cached
    dram = jnp.maximum(real(costs.dram_bytes) - jnp.where(off, w_traffic, 0.0), 0.0)
    link = jnp.where(streamed, w_bytes, 0.0) if from_host else jnp.zeros_like(w_bytes)
    h = spec.host
    clock = real(spec.array.clock_hz)
    transfer = real(costs.transfer_cycles) + jnp.where(
        link > 0, (real(h.link_latency_s) + link / real(h.link_bytes_per_s)) * clock, 0.0)
    out = repriced(costs._replace(transfer_cycles=transfer), spec, off, dram)
    out = out._replace(weight_dram_bytes=jnp.where(off, 0.0, real(out.weight_dram_bytes)))
    return state._replace(costs=out, streamed_weight_bytes=link)


def _applies(spec: NpuSpec, chains: tuple[AttentionChain, ...], mode: CostMode) -> bool:
    return spec.memory.parameter_cache != "none"


#: The parameter cache as a cost pass, after the cross-layer placement (at static sizes: the
#: residency is decided on the workloads' parameter counts).
PASS = CostPass("weight_stream", 40, _applies, _apply, traced_shapes=False)

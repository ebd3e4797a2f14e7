"""One recombination of a layer's compute, memory, DMA and stall time into its latency.

Every cost pass that changes a layer's DRAM traffic or compute (the per-layer model of
:mod:`npujax.plan.costs`, cross-layer placement, attention kernels, weight streaming) turns
the new figures into the layer's latency here, so the passes cannot disagree on how time
adds up. Compute and DMA are double-buffered and overlap, except the first tiles in and the last
tile out (``exposed``), which cannot overlap compute and come with the first-access latency
``dram_latency_s``:

    dma     = dram_latency x clock + exposed            (layers that touch DRAM)
    stall   = max(memory - exposed, compute) - compute  (memory time compute does not hide)
    latency = compute + convert + dma + stall + fallback + transfer

so ``latency = max(compute + dma, memory + access latency)`` on a layer with no conversion or
host time (the roofline bound is never crossed: Williams, Waterman and Patterson, "Roofline",
CACM 2009).

Exact and relaxed forms side by side: in the exact mode ``max`` is ``jnp.maximum``; in the
relaxed mode (``npujax/_relax.py``) it is ``npujax._relax.smooth_max``, the same value bit for
bit with the gradient of a log-sum-exp, so a descent sees both sides near the ridge.

:func:`recombine` is that rule; :func:`repriced` applies it to a pass's new DRAM bytes and
compute on the rows it changed, keeping the exposed part of the layer-by-layer schedule (capped
by the new memory time) and dropping the DMA latency of a row left with no DRAM traffic.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp

from npujax import _relax
from npujax._exact import count, real
from npujax.hw.spec import NpuSpec

if TYPE_CHECKING:
    from npujax.plan.costs import LayerCosts

__all__ = ["recombine", "repriced"]


def recombine(compute: jax.Array, memory: jax.Array, exposed: jax.Array, dma_on: jax.Array,
              access_cycles: Any, convert: jax.Array, fallback: jax.Array,
              transfer: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """``(dma, stall, latency)`` cycles of layers from their parts (see the module doc).

    Args:
      compute: float64 ``[L]`` compute cycles (MAC array or vector unit).
      memory: float64 ``[L]`` DRAM time of the layer's traffic (cycles).
      exposed: float64 ``[L]`` cycles of the first tiles in and the last tile out, which do
        not overlap compute (at most ``memory``).
      dma_on: bool ``[L]``: the layer pays the DRAM access latency (it moves DRAM bytes).
      access_cycles: float64 scalar, the first-access latency ``dram_latency_s x clock_hz``.
      convert: float64 ``[L]`` precision-conversion cycles.
      fallback: float64 ``[L]`` host-CPU cycles.
      transfer: float64 ``[L]`` NPU <-> host transfer cycles.

    Returns:
      ``(dma_cycles, stall_cycles, latency_cycles)``, float64 ``[L]``; exact and relaxed
      (``npujax._relax.smooth_max``) values are the same bit for bit.
    """
    dma = jnp.where(dma_on, access_cycles + exposed, 0.0)
    stall = _relax.smooth_max(memory - exposed, compute) - compute
    latency = compute + convert + dma + stall + fallback + transfer
    return dma, stall, latency


def repriced(base: LayerCosts, spec: NpuSpec, touched: jax.Array, dram_bytes: jax.Array,
             compute_cycles: Any = None) -> LayerCosts:
    """``base`` with the rows ``touched`` re-priced at new DRAM bytes (and compute).

    The exposed DMA of the layer-by-layer schedule is kept, capped by the new memory time; a
    row left with no DRAM traffic pays no access latency. Call inside the 64-bit scope
    (``npujax._exact.exact``).

    Args:
      base: the costs before the pass (``[L]`` arrays; counts exact).
      spec: the NPU (numeric fields may be traced or batched).
      touched: bool ``[L]``, the rows the pass changed (the others keep ``base`` bit for bit).
      dram_bytes: float64 ``[L]`` DRAM bytes after the pass.
      compute_cycles: float64 ``[L]`` compute cycles after the pass (whole numbers), or None
        to keep ``base``'s.

    Returns:
      The :class:`~npujax.plan.LayerCosts` with ``dram_bytes``, ``memory_cycles``,
      ``dma_cycles``, ``stall_cycles``, ``latency_cycles`` (and ``compute_cycles``) replaced on
      the touched rows.
    """
    a, m = spec.array, spec.memory
    clock = real(a.clock_hz)
    bpc = real(m.dram_bytes_per_s) / clock
    lat0 = real(m.dram_latency_s) * clock
    tc = real(base.compute_cycles) if compute_cycles is None else compute_cycles
    has_dma = base.dma_cycles > 0
    exposed = jnp.where(has_dma, jnp.maximum(real(base.dma_cycles) - lat0, 0.0), 0.0)
    memory = dram_bytes / bpc
    exposed = jnp.minimum(exposed, memory)
    dma, stall, latency = recombine(tc, memory, exposed, has_dma & (dram_bytes > 0), lat0,
                                    real(base.convert_cycles), real(base.fallback_cycles),
                                    real(base.transfer_cycles))

    def pick(new: jax.Array, old: jax.Array) -> jax.Array:
        return jnp.where(touched, new, real(old))

    out = base._replace(dram_bytes=pick(dram_bytes, base.dram_bytes),
                        memory_cycles=pick(memory, base.memory_cycles),
                        dma_cycles=pick(dma, base.dma_cycles),
                        stall_cycles=pick(stall, base.stall_cycles),
                        latency_cycles=pick(latency, base.latency_cycles))
    if compute_cycles is not None:
        # the counts' own type: int64 exact, float64 relaxed (an int64 cast cuts the gradient)
        new = (count(compute_cycles) if jnp.issubdtype(base.compute_cycles.dtype, jnp.integer)
               else real(compute_cycles))
        out = out._replace(compute_cycles=jnp.where(touched, new, base.compute_cycles))
    return out

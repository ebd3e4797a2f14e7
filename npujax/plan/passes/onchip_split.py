"""One on-chip SRAM shared by the parameter cache and the activations, split per model.

Some NPUs have one on-chip SRAM that holds both the parameters cached between inferences and
the activations of the running inference. The Coral Edge TPU has about 8 MB on chip (Coral's
datasheets); its compiler reports, per model, how much of it went to caching parameters
("On-chip memory used for caching model parameters", "On-chip memory remaining for caching
model parameters" in ``edgetpu_compiler``'s log, 6.9-7.9 MiB for large models), so the rest
holds activations, and what one use takes the other cannot. A preset says so with
``memory.sram_split = "per_model"`` and the SRAM's size, ``memory.onchip_sram_bytes`` (default
``fixed``: the buffers and the cache as the preset sizes them, and this pass does not run).

The split is the compiler's decision, per model. This pass models it as the choice, among
:data:`ACTIVATION_SHARES` of the SRAM left beside the filter buffer, that minimises the model's
total latency under the rest of the cost program:

* candidate ``s``: ``ifmap_sram_bytes = ofmap_sram_bytes = s x (onchip - filter) / 2`` and
  ``parameter_cache_bytes = (1 - s) x (onchip - filter)`` (the filter buffer,
  ``filter_sram_bytes``, is the array's weight staging and stays as given);
* every other pass of the program runs at each candidate (a ``jax.lax.map`` loop over the
  candidates: the placement of activations, ``passes/cross_layer.py``; the parameter cache,
  ``passes/weight_stream.py``; the fixed cost per inference, the energy), and the candidate of the
  smallest summed latency is the model's answer (its costs, edges and streamed bytes).

A model that fits on chip with room to spare (MobileNet, SqueezeNet) runs as with separate
buffers; a model whose parameters fill the cache gives activations only what saves more time than
the parameters it pushes onto the link cost (DenseNet's growing concatenations against its
8 MB of parameters). The choice is piecewise constant (no gradient); the costs follow the chosen
candidate, so the relaxed mode, ``jax.vmap`` over stacked specs (``onchip_sram_bytes`` is a
traced field) and a traced layer table (where the other passes allow one) all work. The ``[memory]``
buffer and cache sizes of a preset with ``onchip_sram_bytes > 0`` are overridden by the split.

Not modelled: a split that changes from layer to layer (the parameter cache is filled once
and kept across inferences, so one split per model is the compiler's only choice for it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp

from npujax._exact import real
from npujax.hw.fields import replace_traced
from npujax.hw.spec import NpuSpec
from npujax.plan.passes.base import CostMode, CostPass, PassInput, ProgramCosts

if TYPE_CHECKING:
    from npujax.plan.passes.attention import AttentionChain

__all__ = ["PASS", "ACTIVATION_SHARES", "split_spec"]

#: The activations' share of the on-chip SRAM beside the filter buffer, one candidate each
#: (the rest caches parameters): from a sliver (a full parameter cache) to three quarters.
ACTIVATION_SHARES = (1 / 32, 1 / 16, 1 / 8, 3 / 16, 1 / 4, 3 / 8, 1 / 2, 3 / 4)


def split_spec(spec: NpuSpec, share: Any) -> NpuSpec:
    """``spec`` with its unified SRAM split: a share ``share`` (in (0, 1), may be traced) of
    ``onchip_sram_bytes - filter_sram_bytes`` to the activations (half ifmap, half ofmap
    buffer), the rest to the parameter cache, and ``sram_split`` set to ``fixed`` (the split
    made: separate buffers from here on)."""
    mem = spec.memory
    free = jnp.maximum(real(mem.onchip_sram_bytes) - real(mem.filter_sram_bytes), 0.0)
    act = real(share) * free
    half = jnp.maximum(act / 2.0, 1.0)
    return replace_traced(spec, {"memory.sram_split": "fixed", "memory.ifmap_sram_bytes": half,
                                 "memory.ofmap_sram_bytes": half,
                                 "memory.parameter_cache_bytes": free - act})


def _apply(inp: PassInput, state: ProgramCosts) -> ProgramCosts:
    from npujax.plan.program import program_cost  # the composer imports the passes

    def at(share: jax.Array) -> ProgramCosts:
        return program_cost(inp.layers, split_spec(inp.spec, share), inp.weight_bits,
                            inp.act_bits, inp.dataflow, chains=inp.chains, mode=inp.mode,
                            shapes=inp.shapes)

    shares = jnp.asarray(ACTIVATION_SHARES, jnp.float64)
    every = jax.lax.map(at, shares)
    total = jnp.sum(real(every.costs.latency_cycles), axis=-1)
    k = jnp.argmin(jax.lax.stop_gradient(total))
    # the other passes' answer at the preset's own sizes (``state``) is not used: the
    # compiler drops it
    return jax.tree.map(lambda x: x[k], every)._replace(sram_split=shares[k])


def _applies(spec: NpuSpec, chains: tuple[AttentionChain, ...], mode: CostMode) -> bool:
    return spec.memory.sram_split == "per_model"


#: The unified SRAM's split as a cost pass, last: it runs the program's other passes at each
#: candidate split and keeps the fastest.
PASS = CostPass("onchip_split", 95, _applies, _apply)

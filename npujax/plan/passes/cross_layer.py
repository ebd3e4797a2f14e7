"""Across layers: activations kept in on-chip SRAM between layers, and depth-first tiling.

:func:`npujax.plan.layer_costs` costs each layer as if it ran alone: it reads its inputs from
DRAM and writes its output back. An NPU compiler that fuses layers (the preset's
``ops.fusion = "layer"``, :data:`~npujax.hw.FUSION_LEVELS`) keeps a producer's output in SRAM for
its consumers instead. This module decides, per activation tensor (an *edge* from the row that
produces it to the rows that read it), where it lives, and corrects the per-layer costs:

* ``sram`` — the whole tensor stays on chip from its producer to its last consumer. The
  producer does not write it and its consumers do not read it from DRAM (for a GEMM consumer
  the whole input-operand traffic, re-fetches included, as :func:`layer_costs` computes it
  for the layer with that input removed).
* ``depth_first`` — the tensor does not fit whole, but its only consumer runs right after its
  producer and both are spatial (Conv, pooling, elementwise on 4-D tensors): the pair runs
  stripe by stripe (layer-fused / depth-first tiling, Goetschalckx and Verhelst, JETCAS 2019;
  DeFiNES, Mei et al., HPCA 2023). A stripe of ``h`` output rows of the consumer needs
  ``(h - 1) * stride + window`` rows of the tensor; the ``window - stride`` overlap rows (the
  halo) stay cached in the stripe buffer for the next stripe. Recomputing the halo instead
  frees no SRAM in a pair (the consumer needs those rows resident either way), so caching
  always wins here. ``h`` is the largest whose stripe fits; the cost of fusing is that the two
  layers' weights are re-read from DRAM for every stripe unless they fit together in half the
  filter SRAM. A pair is fused depth-first only when those extra weight bytes are at most the
  bytes the consumer no longer reads, so the consumer never gets slower.
* ``dram`` — as in the layer-by-layer schedule.

**Capacity** (accounting for tiling). Every step (row) of the schedule occupies its working
set, ``LayerCosts.sram_peak_bytes`` (the GEMM's tiled operand buffers), out of the total SRAM
``(ifmap + filter + ofmap) x cores``. Tensors are considered smallest first; a tensor takes
``sram`` when it fits beside the working set and the tensors already kept on chip at every step
of its lifetime, else ``depth_first`` with the largest stripe that fits at its producer and
consumer, else ``dram``. A tensor kept whole *is* its GEMM writer's output buffer and its GEMM
consumers' input buffer: at those steps it needs only what it exceeds their staging
(``min(bytes, ofmap SRAM)`` at the writer, ``min(bytes, ifmap SRAM)`` at a consumer), which the
working set already counts (before 0.2.0 it was counted twice, so a 1.4 MB residual tensor of
ResNet-50 at 299x299 went to DRAM on the 4 MiB of activation SRAM that holds it).
The decision is a ``lax.scan`` over the tensors in jnp: sizes, widths
and capacities may be traced (``jax.vmap`` over stacked specs, ``jax.jit``), and the costs are
piecewise in them (``jnp.where`` masks), so the gradient search sees the scheduled latency.
Decisions are piecewise constant in the bit widths: their gradient is that of the chosen
branch, the decision itself has none.

**Latency.** With ``dram_bytes`` reduced (and re-read weights added), a layer's memory time
``memory = dram_bytes / bandwidth``, its exposed DMA ``min(exposed, memory)`` and its stall
``max(0, memory - exposed - compute)`` are recomputed by the one recombination
(:func:`npujax.plan.recombine.repriced`); a layer left with no DRAM traffic at all pays no DMA
latency. Fusion therefore never increases a layer's DRAM bytes or latency (property-tested).

**As a pass** (:data:`PASS`): the one cost program (:mod:`npujax.plan.program`) runs it where the
preset's ``ops.fusion`` is ``layer``, for every consumer (``lower``, the design-space sweep,
codesign, ``fit``, the search's latency table, the gradient checks); in the relaxed mode its
decisions carry no gradient and its costs follow the chosen branch. It needs static workloads
and sizes, so the shape sweep (:func:`npujax.plan.sweep_shapes`) refuses it.

**Not modelled.** Depth-first chains longer than a pair (each pair of a chain is decided on its
own, which counts the middle layer's weight re-reads twice: pessimistic), overlap of the two
layers' compute in a fused pair, and stripes of a GEMM changing its fold efficiency.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import TYPE_CHECKING, Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from npujax._exact import REAL, one_hot, put, real, take
from npujax.hw.spec import NpuSpec
from npujax.plan.costs import LayerCosts, layer_costs
from npujax.plan.passes.base import CostMode, CostPass, PassInput, ProgramCosts
from npujax.plan.recombine import repriced
from npujax.plan.workload import Workload
from npujax.systolic.dataflow import Dataflow

if TYPE_CHECKING:
    from npujax.plan.passes.attention import AttentionChain

__all__ = ["Edge", "EdgeCosts", "PLACEMENTS", "PASS", "cross_layer_edges"]

#: Where an activation tensor lives between its producer and its consumers (``EdgeCosts.mode``
#: indexes this tuple).
PLACEMENTS = ("dram", "sram", "depth_first")


class Edge(NamedTuple):
    """One activation tensor between NPU rows that a fusing compiler may keep on chip (static).

    Attributes:
      producer: row index of the layer whose output it is.
      writer: row that writes it to DRAM in the layer-by-layer schedule (the fusion group's
        head when the producer is an elementwise op fused into a GEMM's output stage).
      consumers: rows that read it from DRAM in the layer-by-layer schedule.
      elems: its elements (channel padding included).
      depth_first: whether the pair (producer, its single consumer) can run depth-first.
      rows: batch x height of the tensor (the rows a stripe splits).
      window_rows, stride_rows: the consumer's kernel height and stride.
      consumer_rows: batch x height of the consumer's output.
    """

    producer: int
    writer: int
    consumers: tuple[int, ...]
    elems: int
    depth_first: bool
    rows: int
    window_rows: int
    stride_rows: int
    consumer_rows: int


class EdgeCosts(NamedTuple):
    """Per-edge decisions and bytes from the cross-layer pass: ``[E]`` arrays, edges in the
    order of :func:`cross_layer_edges`; ``sram_bytes`` is ``[L]``.

    Attributes:
      mode: int32 index into :data:`PLACEMENTS`.
      tensor_bytes: float, the tensor's bytes at its width.
      stripe_rows: float, output rows of the consumer per stripe (depth-first), else 0.
      stripes: float, stripes of a depth-first pair, else 0 (1 for ``sram``).
      saved_bytes: float, DRAM bytes saved (reads and write avoided, less re-read weights):
        the edge's share of each layer's saving, so that they add up to the schedule's
        ``sum(layer_costs.dram_bytes) - sum(costs.dram_bytes)`` exactly (a writer's output,
        written once, is shared among the edges it feeds).
      extra_weight_bytes: float, weight bytes re-read for the stripes of a depth-first pair.
      sram_bytes: float ``[L]``, SRAM occupied at each row: its working set plus the tensors
        kept on chip (whole or a stripe) while it runs.
      sram_capacity: float scalar, the total SRAM ``(ifmap + filter + ofmap) x cores``.
    """

    mode: Any
    tensor_bytes: Any
    stripe_rows: Any
    stripes: Any
    saved_bytes: Any
    extra_weight_bytes: Any
    sram_bytes: Any
    sram_capacity: Any


def _real(x) -> jax.Array:
    return real(x)  # float64 inside the exact scope (npujax._exact)


@functools.lru_cache(maxsize=64)
def cross_layer_edges(layers: tuple[Workload, ...]) -> tuple[Edge, ...]:
    """The activation tensors a fusing compiler may keep on chip, smallest first.

    A tensor qualifies when its producer and all its readers run on the NPU (not a layout
    transform, not the host CPU) and it is not a graph output (which must reach DRAM).

    Args:
      layers: workloads from :func:`npujax.plan.workloads` (a tuple: the result is cached).

    Returns:
      The :class:`Edge` s, sorted by ``(elems, producer)``.
    """
    readers: dict[int, list[tuple[int, int]]] = {}
    for j, w in enumerate(layers):
        for p, n in w.inputs:
            if p >= 0:
                readers.setdefault(p, []).append((j, n))
    index = {w.name: i for i, w in enumerate(layers)}
    edges = []
    for p, rs in readers.items():
        w = layers[p]
        cons = tuple(sorted({j for j, _ in rs}))
        if (w.device != "npu" or w.kind == "layout" or w.graph_output
                or any(layers[j].device != "npu" or layers[j].kind == "layout" for j in cons)):
            continue
        writer = index.get(w.fused_into, p) if w.fused_into else p
        elems = max(n for _, n in rs)
        c = cons[0]
        between = range(p + 1, c)
        adjacent = len(cons) == 1 and all(layers[i].fused_into == layers[writer].name
                                          for i in between)
        dfs = (adjacent and w.out_rows > 0 and layers[c].out_rows > 0
               and not layers[c].fused_into and elems % w.out_rows == 0)
        edges.append(Edge(p, writer, cons, int(elems), bool(dfs), int(max(w.out_rows, 1)),
                          int(layers[c].window_rows), int(layers[c].stride_rows),
                          int(max(layers[c].out_rows, 1))))
    return tuple(sorted(edges, key=lambda e: (e.elems, e.producer)))


def _apply(inp: PassInput, state: ProgramCosts) -> ProgramCosts:
    """The cross-layer placement on the per-layer costs; with attention kernels (the attention
    pass ran before), the schedule with the fused blocks as its boundaries when it moves no more
    DRAM bytes and takes no longer than the layer schedule without them."""
    layers = inp.workloads
    edges = cross_layer_edges(layers)
    spec, wb, ab, df = inp.spec, inp.weight_bits, inp.act_bits, inp.dataflow
    base = state.unfused
    costs, ec = _place(layers, edges, spec, wb, ab, df, base, base, None)
    att = state.attention
    if att is None:
        return state._replace(costs=costs, edges=ec)
    # the fused attention blocks as boundaries of the cross-layer schedule: no tensor that a
    # fused block's rows produce, write or read is kept on chip by the layer schedule
    chains = inp.chains
    member = np.zeros((len(chains), len(layers)))
    for i, c in enumerate(chains):
        member[i, list(c.rows)] = 1.0
    on_row = jnp.sum(jnp.asarray(member, REAL) * (att.mode > 0).astype(REAL)[:, None],
                     axis=0) > 0  # [L]
    touches = np.zeros((len(edges), len(layers)))
    for i, e in enumerate(edges):
        touches[i, [e.producer, e.writer, *e.consumers]] = 1.0
    blocked = jnp.sum(jnp.asarray(touches, REAL) * on_row.astype(REAL)[None, :], axis=1) > 0
    costs2, ec2 = _place(layers, edges, spec, wb, ab, df, state.costs, base, blocked)
    # the compiler keeps the schedule with the attention kernels only when it moves no more
    # DRAM bytes and takes no longer than the layer schedule without them (piecewise constant)
    use = jax.lax.stop_gradient(
        (jnp.sum(costs2.latency_cycles) <= jnp.sum(costs.latency_cycles))
        & (jnp.sum(costs2.dram_bytes) <= jnp.sum(costs.dram_bytes)))
    pick = functools.partial(jax.tree.map, lambda new, old: jnp.where(use, new, old))
    att = att._replace(mode=jnp.where(use, att.mode, 0).astype(jnp.int32),
                       saved_bytes=jnp.where(use, att.saved_bytes, 0.0))
    return state._replace(costs=pick(costs2, costs), edges=pick(ec2, ec), attention=att)


def _applies(spec: NpuSpec, chains: tuple[AttentionChain, ...], mode: CostMode) -> bool:
    return spec.ops.fusion == "layer"


#: Cross-layer placement as a cost pass: where ``ops.fusion = "layer"``, after the attention
#: pass. Its edges are static (not on a traced layer table), and it places tensors of static
#: sizes (not with traced shapes).
PASS = CostPass("cross_layer", 30, _applies, _apply, traced_layers=False, traced_shapes=False)


def _place(layers: tuple[Workload, ...], edges: tuple[Edge, ...], spec: NpuSpec,
           weight_bits: jax.Array, act_bits: jax.Array, dataflow: str | Dataflow | None,
           base: LayerCosts, unfused: LayerCosts, blocked: Any
           ) -> tuple[LayerCosts, EdgeCosts]:
    """The cross-layer placement on top of the per-layer costs ``base`` (``unfused``: the
    layer-by-layer costs, for the GEMMs' input traffic); ``blocked``: None or bool ``[E]``,
    edges that must stay in DRAM."""
    L, E = len(layers), len(edges)
    m, a = spec.memory, spec.array
    cores = _real(a.cores)
    cap = (_real(m.ifmap_sram_bytes) + _real(m.filter_sram_bytes)
           + _real(m.ofmap_sram_bytes)) * cores
    if E == 0:
        none = jnp.zeros(0, REAL)
        return base, EdgeCosts(jnp.zeros(0, jnp.int32), none, none, none, none, none,
                               base.sram_peak_bytes, cap)
    wb, ab = _real(weight_bits), _real(act_bits)
    is_gemm = np.asarray([w.kind == "gemm" and w.device == "npu" for w in layers])
    # the traffic of a GEMM's input operand, re-fetches included: the layer with and without it
    no_input = tuple(dataclasses.replace(w, in_elems=0) if g else w
                     for w, g in zip(layers, is_gemm))
    rd_a = jnp.maximum(unfused.dram_bytes - layer_costs(no_input, spec, weight_bits, act_bits,
                                                        dataflow).dram_bytes, 0.0)
    w_bytes = _real([w.weight_elems for w in layers]) * wb / 8.0
    out_bytes = _real([w.out_elems for w in layers]) * ab / 8.0

    # static per-edge arrays
    live = np.zeros((E, L), bool)
    reads = np.zeros((E, L), np.float64)  # 1 where a consumer reads the edge
    for i, e in enumerate(edges):
        live[i, min(e.writer, e.producer):max(e.consumers) + 1] = True
        reads[i, list(e.consumers)] = 1.0
    first = np.asarray([e.consumers[0] for e in edges])
    writer = np.asarray([e.writer for e in edges])
    # gathers and scatters as masked sums with static one-hot matrices (npujax/_exact.py)
    at_first, at_writer = one_hot(first, L), one_hot(writer, L)  # [E, L]
    elems = _real([e.elems for e in edges])
    width = take(at_first, ab)
    t_bytes = elems * width / 8.0
    row_bytes = t_bytes / _real([e.rows for e in edges])
    k = _real([e.window_rows for e in edges])
    s = _real([e.stride_rows for e in edges])
    hc = _real([e.consumer_rows for e in edges])
    dfs_ok = jnp.asarray([e.depth_first for e in edges])
    gemm_c = jnp.asarray(is_gemm[first])
    read_first = jnp.where(gemm_c, take(at_first, rd_a), t_bytes)  # the consumer's saving
    pair_w = take(at_writer, w_bytes) + take(at_first, w_bytes)
    w_fit = pair_w <= _real(m.filter_sram_bytes) * cores / 2.0
    free0 = cap - base.sram_peak_bytes
    # a tensor kept whole on chip is its writer's output buffer and its GEMM consumers' input
    # buffer: the staging those working sets count for it is not needed twice
    sram_a, sram_o = _real(m.ifmap_sram_bytes) * cores, _real(m.ofmap_sram_bytes) * cores
    gemm_rows = jnp.asarray(is_gemm, REAL)
    stage_o = (jnp.minimum(t_bytes, sram_o)[:, None] * jnp.asarray(at_writer)
               * gemm_rows[None, :])
    stage_a = (jnp.minimum(t_bytes, sram_a)[:, None] * jnp.asarray(reads)
               * gemm_rows[None, :])
    credit = stage_o + stage_a  # [E, L]

    def decide(occ, x):
        live_e, nbytes, rb, ke, se, hce, ok, saves, pw, fit, free_e, cred = x
        avail_whole = jnp.min(jnp.where(live_e, free0 - occ + cred, jnp.inf))
        avail = jnp.min(jnp.where(live_e, free0 - occ, jnp.inf))
        whole = free_e & (nbytes <= avail_whole)
        ok = ok & free_e
        h = jnp.clip(jnp.floor((avail / rb - ke) / se) + 1.0, 1.0, hce)
        n_s = jnp.ceil(hce / h)
        extra = jnp.where(fit, 0.0, (n_s - 1.0) * pw)
        dfs = ok & ~whole & (avail >= ke * rb) & (extra <= saves)
        claim = jnp.where(whole, jnp.maximum(nbytes - cred, 0.0),
                          jnp.where(dfs, ((h - 1.0) * se + ke) * rb, 0.0))
        mode = jnp.where(whole, 1, jnp.where(dfs, 2, 0)).astype(jnp.int32)
        stripes = jnp.where(dfs, n_s, jnp.where(whole, 1.0, 0.0))
        return occ + jnp.where(live_e, claim, 0.0), (mode, jnp.where(dfs, h, 0.0), stripes)

    # the decisions are piecewise constant: no gradient flows through them (and the scan is
    # never transposed); the costs below stay differentiable in the chosen branch
    sg = jax.lax.stop_gradient
    free0 = sg(free0)
    occ, (mode, h, n_s) = jax.lax.scan(
        decide, jnp.zeros(L, REAL),
        (jnp.asarray(live), sg(t_bytes), sg(row_bytes), k, s, hc, dfs_ok, sg(read_first),
         sg(pair_w), sg(w_fit),
         jnp.ones(E, bool) if blocked is None else ~sg(blocked), sg(credit)))
    extra = jnp.where((mode == 2) & ~w_fit, (n_s - 1.0) * pair_w, 0.0)
    on = (mode > 0).astype(REAL)
    per_read = jnp.where(jnp.asarray(is_gemm)[None, :], rd_a[None, :],
                         elems[:, None] * ab[None, :] / 8.0) * jnp.asarray(reads)
    read_saved = jnp.sum(on[:, None] * per_read, axis=0)
    writes = put(at_writer, on * t_bytes)
    write_saved = jnp.minimum(writes, out_bytes)
    extra_l = put(at_first, extra)
    dram = jnp.maximum(base.dram_bytes - read_saved - write_saved + extra_l, 0.0)
    touched = (read_saved > 0) | (write_saved > 0) | (extra_l > 0)

    costs = repriced(base, spec, touched, dram)
    # each edge's share of the bytes its layers really saved: its reads avoided, its part of
    # the (capped) write avoided at the writer, less its re-read weights, scaled per layer where
    # the layer's DRAM bytes bottomed out at zero; the shares add up to the schedule's saving
    # (a writer's output counted once however many edges it feeds)
    wshare = jnp.where(writes > 0, write_saved / jnp.where(writes > 0, writes, 1.0), 0.0)
    net = (on[:, None] * per_read
           + (on * t_bytes)[:, None] * jnp.asarray(at_writer) * wshare[None, :]
           - extra[:, None] * jnp.asarray(at_first))  # [E, L]
    claimed = read_saved + write_saved - extra_l
    actual = jnp.where(touched, base.dram_bytes - dram, 0.0)
    ratio = jnp.where(claimed > 0, actual / jnp.where(claimed > 0, claimed, 1.0), 1.0)
    saved = jnp.sum(net * ratio[None, :], axis=1)
    return costs, EdgeCosts(mode, t_bytes, h, n_s, saved, extra,
                            base.sram_peak_bytes + occ, cap)

"""Attention fusion: the Q·Kᵀ → (scale, mask) → Softmax → P·V chain as one kernel.

Layer by layer (:func:`npujax.plan.layer_costs`) an attention block's score tensor
``[heads, S_q, S_k]`` is written to DRAM by the Q·Kᵀ MatMul, read and written back by every
vector op after it (scale, mask, Softmax, the transpose of P) and read by the P·V MatMul. A
compiler that fuses attention (the preset's ``ops.attention_fusion``,
:data:`~npujax.hw.ATTENTION_FUSIONS`) runs the chain as one kernel instead:

* **Blocks** (Dao et al., "FlashAttention", NeurIPS 2022, Algorithm 1): with ``M`` the on-chip
  SRAM in elements, ``(ifmap + filter + ofmap) x cores / (a_bits / 8)``, and ``d`` the head
  dimension, a query block has ``B_r = min(floor(M / 4d), d, query rows)`` rows. A key block
  has ``B_c`` columns, the most whose score tile ``[B_r, B_c]`` fits both the ofmap SRAM at the
  accumulator width (the scores) and the ifmap SRAM at the activation width (the
  probabilities, the P·V GEMM's operand), at most ``S_k``.
* **Scores fit** (``B_c = S_k``, ``on_chip`` and ``flash``): a query block's whole score rows
  stay in SRAM. The two GEMMs keep their own traffic (their tiled reads of Q, K, V and the
  write of O) less the score tensor's: Q·Kᵀ does not write the scores (``groups x M x N x
  a_bits/8``, whole bursts), P·V does not read P (its elements once; any re-fetch of P by the
  P·V mapping is kept, a conservative saving) and the ops between them move nothing. Their
  compute is unchanged.
* **Scores do not fit** (``flash`` only): FlashAttention tiling in FlashAttention-2's loop
  order (Dao, ICLR 2024, arXiv:2307.08691: the outer loop over query blocks, so Q is read and O
  written once; FlashAttention's Algorithm 1 loops over K/V blocks outside and re-reads Q and O
  instead). For each of ``T_r = ceil(rows / B_r)`` query blocks, K and V are streamed in
  ``T_c = ceil(S_k / B_c)`` blocks with the online-softmax rescaling: DRAM bytes
  ``Q + O + T_r x (K + V)`` (each tensor's elements at its width, whole bursts; Q·Kᵀ carries
  ``Q + T_r K``, P·V ``T_r V + O``), and extra vector work on the Softmax row: per query row
  and extra key block, one exp of the max difference (a special function) and ``d + 2``
  multiply-adds rescaling the output row and the running sum.
  Chosen only when it moves no more bytes and takes no longer than the unfused chain; else
  the chain stays layer by layer.

Rows with DRAM traffic left are re-priced by the one recombination
(:func:`npujax.plan.recombine.repriced`); rows left with none pay no DMA latency. Fusion
therefore never increases a chain's DRAM bytes or latency (tested).

**Recognised chains** (:func:`attention_chains`, static, from the graph): a Softmax on the
NPU whose input comes, through Transpose, Mul, Div, Add, Sub and Where ops (their other
operands constants) and free reshapes, from a MatMul/Einsum (Q·Kᵀ), and whose output reaches,
through Transposes and reshapes, a MatMul/Einsum (P·V); every tensor in between has that one
consumer and is not a graph output. Q·Kᵀ's streamed dimension ``M`` or its ``N`` must equal
``S_k`` (the Softmax axis) to tell K from Q.

**Pure jnp** (:func:`attention_costs`): the blocks, the decision and the costs are jnp of the
spec's numeric fields and the bit widths (jit, ``jax.vmap`` over stacked specs, the relaxed
mode); the chain detection is Python on the static graph. The pass (:data:`PASS`) runs where the
spec's ``ops.attention_fusion`` is not ``none`` and the graph has chains, for every consumer of
the one cost program (:mod:`npujax.plan.program`); under ``layer`` fusion a fused block is a
boundary of the cross-layer schedule (:mod:`npujax.plan.passes.cross_layer`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from npujax import _relax
from npujax._exact import REAL, exact, one_hot, put, real, take
from npujax.errors import ConfigError
from npujax.hw.spec import ATTENTION_FUSIONS, NpuSpec
from npujax.ir.graph import Graph
from npujax.ops import OPS
from npujax.plan.costs import LayerCosts
from npujax.plan.passes.base import CostMode, CostPass, PassInput, ProgramCosts
from npujax.plan.recombine import repriced
from npujax.plan.workload import Workload

__all__ = ["AttentionChain", "AttentionCosts", "ATTENTION_MODES", "PASS", "fuses",
           "attention_chains",
           "attention_costs"]

#: How a chain ran (``AttentionCosts.mode`` indexes this tuple).
ATTENTION_MODES = ("unfused", "on_chip", "flash")

#: Ops allowed between Q·Kᵀ and the Softmax (scale and mask) with constant other operands.
_PRE = frozenset({"Transpose", "Mul", "Div", "Add", "Sub", "Where"})
_GEMM = frozenset({"MatMul", "Einsum"})


class AttentionChain(NamedTuple):
    """One recognised attention block (static row indices into the workloads).

    Attributes:
      qk: row of the Q·Kᵀ MatMul.
      softmax: row of the Softmax.
      pv: row of the P·V MatMul.
      rows: every row of the chain, ``qk`` and ``pv`` included, in execution order.
      key_len: ``S_k``, the Softmax axis.
      query_rows: score rows per group of the Q·Kᵀ GEMM (queries x heads sharing one K).
      head_dim: ``d``, Q·Kᵀ's contracted dimension.
      groups: Q·Kᵀ's groups (heads, or KV heads under grouped-query attention).
      k_is_input: K is Q·Kᵀ's streamed operand (its ``in_elems``), else its second operand.
      p_is_input: P is P·V's streamed operand, else its second operand.
    """

    qk: int
    softmax: int
    pv: int
    rows: tuple[int, ...]
    key_len: int
    query_rows: int
    head_dim: int
    groups: int
    k_is_input: bool
    p_is_input: bool


class AttentionCosts(NamedTuple):
    """Per-chain decisions of :func:`attention_costs`: ``[C]`` arrays, chains in order.

    Attributes:
      mode: int32 index into :data:`ATTENTION_MODES`.
      query_block: float, ``B_r`` rows per query block.
      key_block: float, ``B_c`` keys per block (``S_k`` when the scores fit).
      query_blocks: float, ``T_r``.
      key_blocks: float, ``T_c`` (1 when the scores fit).
      saved_bytes: float, DRAM bytes the chain no longer moves (0 when unfused).
    """

    mode: Any
    query_block: Any
    key_block: Any
    query_blocks: Any
    key_blocks: Any
    saved_bytes: Any


def attention_chains(graph: Graph, layers: Sequence[Workload]) -> tuple[AttentionChain, ...]:
    """The attention blocks of ``graph`` whose ops all run on the NPU (see the module doc).

    Args:
      graph: the optimized graph the workloads were built from.
      layers: its workloads (:func:`npujax.plan.workloads`).

    Returns:
      The :class:`AttentionChain` s, in the order of their Softmax.
    """
    index = {w.name: i for i, w in enumerate(layers)}

    def npu(node) -> bool:
        i = index.get(node.name)
        return i is not None and layers[i].device == "npu"

    # producers and readers in one pass (graph.producer/consumers scan every node per call)
    producer = {t: n for n in graph.nodes for t in n.outputs}
    readers: dict[str, list] = {}
    for n in graph.nodes:
        for t in dict.fromkeys(n.inputs):
            readers.setdefault(t, []).append(n)

    def single(t: str):
        cs = readers.get(t, [])
        return cs[0] if len(cs) == 1 and t not in graph.outputs else None

    chains = []
    for node in graph.nodes:
        if node.op != "Softmax" or not npu(node):
            continue
        mid = [node.name]
        t, qk = node.inputs[0], None
        while True:  # back to Q·Kᵀ
            p = producer.get(t)
            if p is None or single(t) is None:
                break
            if p.op in _GEMM and npu(p):
                qk = p
                break
            free = OPS[p.op].cost == "free"
            data = [x for x in p.inputs if x not in graph.constants]
            if not (free or (p.op in _PRE and npu(p))) or len(data) != 1:
                break
            if not free:
                mid.append(p.name)
            t = data[0]
        t, pv = node.outputs[0], None
        while qk is not None:  # forward to P·V
            c = single(t)
            if c is None:
                break
            if c.op in _GEMM and npu(c):
                pv = c
                break
            if not (OPS[c.op].cost == "free" or (c.op == "Transpose" and npu(c))):
                break
            if OPS[c.op].cost != "free":
                mid.append(c.name)
            t = c.outputs[0]
        if qk is None or pv is None:
            continue
        w = layers[index[qk.name]]
        shape = graph.tensors[node.inputs[0]].shape
        s_k = int(shape[int(node.attrs.get("axis", -1))])
        if w.M == s_k:
            k_in, rows = True, w.N
        elif w.N == s_k:
            k_in, rows = False, w.M
        else:
            continue
        idx = tuple(sorted([index[qk.name], index[pv.name], *(index[n] for n in mid)]))
        chains.append(AttentionChain(index[qk.name], index[node.name], index[pv.name], idx,
                                     s_k, int(rows), int(w.K), int(w.groups), k_in,
                                     pv.inputs[0] == t))
    return tuple(chains)


@exact
def attention_costs(
    layers: Sequence[Workload],
    chains: Sequence[AttentionChain],
    spec: NpuSpec,
    base: LayerCosts,
    weight_bits: jax.Array,
    act_bits: jax.Array,
    capability: str | None = None,
    *,
    shapes: Mapping[str, jax.Array] | None = None,
) -> tuple[LayerCosts, AttentionCosts]:
    """Per-layer costs with the attention chains fused (pure jnp; jit, vmap over ``spec``).

    Args:
      layers: static workloads (from :func:`npujax.plan.workloads`).
      chains: static chains from :func:`attention_chains`.
      spec: the NPU; numeric fields may be traced or batched.
      base: the layer-by-layer :class:`~npujax.plan.LayerCosts` (``[L]`` arrays, exact
        counts) of ``layers`` on ``spec``.
      weight_bits: float ``[L]`` second-operand width per layer (Q of Q·Kᵀ, P or V of P·V).
      act_bits: float ``[L]`` activation width per layer.
      capability: one of :data:`~npujax.hw.ATTENTION_FUSIONS` (static); default the spec's
        ``ops.attention_fusion``.
      shapes: the traced workload sizes ``{field: [L]}`` that ``base`` was computed with
        (:data:`~npujax.plan.costs.SHAPE_FIELDS`, as ``layer_costs(..., shapes=)``; a
        sequence-length sweep, :func:`npujax.plan.sweep_shapes`): the chains' extents are
        taken from them instead of from ``chains`` and ``layers``. Default: the static sizes.

    Returns:
      ``(costs, chains)``: ``base`` with the chains' rows' ``compute_cycles``, ``dram_bytes``,
      ``memory_cycles``, ``dma_cycles``, ``stall_cycles`` and ``latency_cycles`` replaced where
      a chain is fused, and the :class:`AttentionCosts` (float64, int32 mode).

    Raises:
      ConfigError: an unknown capability.

    References:
      Dao, Fu, Ermon, Rudra and Ré, "FlashAttention: Fast and Memory-Efficient Exact Attention
      with IO-Awareness", NeurIPS 2022 (arXiv:2205.14135), Algorithm 1 (block sizes, online
      softmax); Dao, "FlashAttention-2", ICLR 2024 (arXiv:2307.08691), Algorithm 1 (loop order).
    """
    cap_name = capability or spec.ops.attention_fusion
    if cap_name not in ATTENTION_FUSIONS:
        raise ConfigError(f"unknown attention fusion {cap_name!r}; use one of "
                          f"{ATTENTION_FUSIONS}.")
    L, C = len(layers), len(chains)
    z = jnp.zeros(C, REAL)
    if cap_name == "none" or C == 0:
        return base, AttentionCosts(jnp.zeros(C, jnp.int32), z, z, z, z, z)
    m, a, v = spec.memory, spec.array, spec.vector
    cores = real(a.cores)
    wb, ab = real(weight_bits), real(act_bits)
    burst = real(spec.layout.dram_burst_bytes)

    def bursts(nbytes):
        return jnp.ceil(nbytes / burst) * burst

    qk = np.asarray([c.qk for c in chains])
    pv = np.asarray([c.pv for c in chains])
    sm = np.asarray([c.softmax for c in chains])
    k_in = jnp.asarray([c.k_is_input for c in chains])
    p_in = jnp.asarray([c.p_is_input for c in chains])

    def size(field):  # a GEMM extent per layer as float64 [L], static or traced (shapes)
        if shapes is not None and field in shapes:
            return real(shapes[field])
        return real(np.asarray([getattr(w, field) for w in layers], np.float64))

    M, K, N, G = size("M"), size("K"), size("N"), size("groups")
    # the chain's extents: S_k is Q·Kᵀ's M when K is its streamed operand, else its N
    s_k = jnp.where(k_in, M[qk], N[qk])
    rows = jnp.where(k_in, N[qk], M[qk])
    d, g = K[qk], G[qk]
    # the operands as the GEMMs move them (groups x extents, as the mapping's traffic; the
    # layout's channel padding of the workloads' element counts is not DRAM traffic of a GEMM)
    k_el, q_el, s_el = g * s_k * d, g * rows * d, g * M[qk] * N[qk]
    mk, kn = G[pv] * M[pv] * K[pv], G[pv] * K[pv] * N[pv]
    p_el, v_el = jnp.where(p_in, mk, kn), jnp.where(p_in, kn, mk)
    o_el = G[pv] * M[pv] * N[pv]
    # values that depend on the widths are indexed by masked sums (npujax/_exact.py)
    at_qk, at_pv, at_sm = (one_hot(ix, L) for ix in (qk, pv, sm))
    a_qk, w_qk, a_pv, w_pv = take(at_qk, ab), take(at_qk, wb), take(at_pv, ab), take(at_pv, wb)
    k_w, q_w = jnp.where(k_in, a_qk, w_qk), jnp.where(k_in, w_qk, a_qk)
    p_w, v_w = jnp.where(p_in, a_pv, w_pv), jnp.where(p_in, w_pv, a_pv)

    # FlashAttention's blocks (Algorithm 1) at this SRAM
    sram = (real(m.ifmap_sram_bytes) + real(m.filter_sram_bytes)
            + real(m.ofmap_sram_bytes)) * cores
    m_elems = jnp.floor(sram / (a_qk / 8.0))
    b_r = jnp.maximum(jnp.minimum(jnp.minimum(jnp.floor(m_elems / (4.0 * d)), d), rows), 1.0)
    tile = jnp.minimum(real(m.ofmap_sram_bytes) * cores / (real(a.accumulator_bits) / 8.0),
                       real(m.ifmap_sram_bytes) * cores / (p_w / 8.0))
    b_c = jnp.clip(jnp.floor(tile / b_r), 1.0, s_k)
    t_r = jnp.ceil(rows / b_r)
    t_c = jnp.ceil(s_k / b_c)
    fits = t_c <= 1.0

    # per-row candidate costs of the fused chains (each chain fused as its capability allows)
    member = _membership(chains, L)  # [C, L]

    def per_chain(x):  # [L] -> [C] sums over each chain's rows
        return jnp.sum(member * x[None, :], axis=1)

    base_dram = real(base.dram_bytes)
    dram_qk, dram_pv = take(at_qk, base_dram), take(at_pv, base_dram)
    s_write = jnp.minimum(bursts(s_el * a_qk / 8.0), dram_qk)
    p_read = jnp.minimum(bursts(p_el * p_w / 8.0), dram_pv)
    on_qk, on_pv = dram_qk - s_write, dram_pv - p_read
    fl_qk = bursts(q_el * q_w / 8.0) + t_r * bursts(k_el * k_w / 8.0)
    fl_pv = t_r * bursts(v_el * v_w / 8.0) + bursts(o_el * a_pv / 8.0)
    dram = put(at_qk, jnp.where(fits, on_qk, fl_qk)) + put(at_pv, jnp.where(fits, on_pv, fl_pv))
    # online softmax (FlashAttention Algorithm 1, lines 10-12): per query row and extra key
    # block, exp(m_old - m_new) and a rescale of the d output values and the running sum
    extra_blocks = jnp.where(fits, 0.0, t_c - 1.0)
    alu = extra_blocks * rows * g * (d + 2.0)
    special = _relax.ceil(extra_blocks * rows * g * real(v.special_cycles_per_elem))
    rescale = jnp.ceil((alu + special) / (real(v.lanes) * cores))
    tc = real(base.compute_cycles) + put(at_sm, rescale)

    touched = jnp.ones(L, bool)
    fused = repriced(base, spec, touched, dram, tc)
    latency = fused.latency_cycles

    # the decision per chain: on_chip when the scores fit; flash tiling when allowed and no
    # worse than layer by layer (piecewise constant: no gradient through it)
    sg = jax.lax.stop_gradient
    unfused_bytes, fused_bytes = per_chain(base_dram), per_chain(dram)
    unfused_lat, fused_lat = per_chain(real(base.latency_cycles)), per_chain(latency)
    no_worse = sg((fused_bytes <= unfused_bytes) & (fused_lat <= unfused_lat))
    flash_ok = cap_name == "flash"
    mode = jnp.where(fits & no_worse, 1, jnp.where(flash_ok & ~fits & no_worse, 2, 0))
    mode = mode.astype(jnp.int32)
    on_row = jnp.sum(member * (mode > 0).astype(REAL)[:, None], axis=0) > 0
    costs = repriced(base, spec, on_row, dram, tc)
    saved = jnp.where(mode > 0, unfused_bytes - fused_bytes, 0.0)
    return costs, AttentionCosts(mode, b_r, jnp.where(fits, s_k, b_c), t_r, t_c, saved)


def _membership(chains: Sequence[AttentionChain], length: int) -> jax.Array:
    """float64 ``[C, length]``: 1.0 where row ``j`` belongs to chain ``i``. Chains that share
    no row (as :func:`attention_chains` finds them) get it computed in the program from each
    row's chain (an ``[L]`` constant, not ``C x L``); overlapping ones as a constant."""
    n = len(chains)
    owner = np.full(length, n, np.int64)  # n: in no chain (a column one_hot then drops)
    for i, c in enumerate(chains):
        rows = list(c.rows)
        if (owner[rows] < n).any():
            dense = np.zeros((n, length))
            for k, ch in enumerate(chains):
                dense[k, list(ch.rows)] = 1.0
            return jnp.asarray(dense, REAL)
        owner[rows] = i
    return one_hot(owner, n + 1)[:, :n].T


def fuses(spec: NpuSpec) -> bool:
    """Whether ``spec``'s compiler runs attention blocks as kernels (``ops.attention_fusion``
    other than ``none``): where it does, a cost program needs the graph's chains."""
    return spec.ops.attention_fusion != "none"


def _applies(spec: NpuSpec, chains: tuple[AttentionChain, ...], mode: CostMode) -> bool:
    return bool(chains) and fuses(spec)


def _apply(inp: PassInput, state: ProgramCosts) -> ProgramCosts:
    costs, att = attention_costs(inp.workloads, inp.chains, inp.spec, state.costs,
                                 inp.weight_bits, inp.act_bits, shapes=inp.shapes)
    return state._replace(costs=costs, attention=att)


#: The attention kernels as a cost pass (chains are static: not on a traced layer table).
PASS = CostPass("attention", 20, _applies, _apply, traced_layers=False)

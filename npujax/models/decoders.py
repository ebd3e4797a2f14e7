"""LLM decoders for the latency model: the reference decoder's graph for a prefill or a decode
step (:func:`decoder_graph`), the operands its attention reads from the KV cache
(:func:`kv_cache_operands`), the quantization spec of a decoder lowering
(:func:`decoder_precision`) and the figures of merit of LLM serving (:func:`decoder_figures`)."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from npujax.errors import ConfigError
from npujax.ir.graph import Graph
from npujax.ir.passes import optimize
from npujax.models.llm_graph import KV_CACHE
from npujax.numerics import IntFormat
from npujax.ops import OPS, operand_quantized_ops
from npujax.quantize.spec import for_operands, quant_spec

if TYPE_CHECKING:
    from npujax.hw.spec import NpuSpec
    from npujax.plan.lower import Schedule

__all__ = ["DecoderLowering", "decoder_graph", "resolve_config", "kv_bytes_per_token",
           "kv_cache_operands", "decoder_precision", "decoder_figures"]


@dataclasses.dataclass(frozen=True)
class DecoderLowering:
    """A decoder phase lowered, with the figures of merit of LLM serving.

    Attributes:
      config: the decoder's shapes (:class:`npujax.models.transformer.DecoderConfig`).
      phase: ``"prefill"`` or ``"decode"``.
      seq_len: prompt tokens per sequence (prefill).
      kv_len: cached positions per sequence (decode).
      batch: sequences per step.
      kv_bits: the width of the attention MatMuls' operands (the KV cache).
      tokens_per_s: tokens processed per second: ``batch * seq_len / latency`` (prefill) or
        ``batch / latency`` (decode: one new token per sequence per step).
      kv_cache_bytes_per_token: bytes of K and V cache read per generated token and sequence
        (decode: ``2 * layers * kv_len * kv_heads * head_dim * kv_bits / 8``, a sliding-window
        layer counting ``min(kv_len, window - 1)`` positions; prefill: 0, the keys and values
        are computed, not read).
      macs: multiply-accumulates of the step (all layers).
      dram_bytes: DRAM bytes the step moves (the schedule's, all layers).
      roofline_s: the roofline bound of the whole step, ``max(macs / peak MAC rate, dram_bytes
        / DRAM bandwidth)`` (s; Williams et al. 2009, "Roofline", CACM 52(4)); the modelled
        latency is never below it. NaN when lowered without a spec.
      bound: ``"compute"`` or ``"memory"``: which roof is the higher (``""`` without a spec).
      arithmetic_intensity: ``macs / dram_bytes`` (MACs per byte); the step is compute-bound
        above the spec's ridge point ``peak MAC rate / bandwidth``.
    """

    config: Any
    phase: str
    seq_len: int
    kv_len: int
    batch: int
    kv_bits: int
    tokens_per_s: float
    kv_cache_bytes_per_token: float
    macs: float = float("nan")
    dram_bytes: float = float("nan")
    roofline_s: float = float("nan")
    bound: str = ""
    arithmetic_intensity: float = float("nan")

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready figures (the config by its fields)."""
        d = dataclasses.asdict(self)
        d["config"] = dataclasses.asdict(self.config)
        return d


def decoder_graph(config: Any, *, phase: str, seq_len: int = 1, kv_len: int = 0,
                  batch: int = 1, kv_lens: Sequence[int] | None = None,
                  expert_loads: Sequence[float] | None = None, logits: str = "auto",
                  experts_touched: int | None = None, kv_cache: str = "copy") -> Graph:
    """The optimized graph of one step of a decoder, built from its shapes alone
    (:func:`npujax.models.llm_graph.build_decoder_graph`: no Flax model, no weight allocated;
    for the reference configs the same graph as tracing :class:`~npujax.models.transformer.
    Decoder`).

    Args:
      config: a :class:`~npujax.models.transformer.DecoderConfig`, a shipped name
        (:data:`~npujax.models.transformer.DECODER_CONFIGS`) or a ``config.json`` path
        (:func:`npujax.models.hf_config.load_decoder`).
      phase: ``"prefill"`` (``seq_len`` new tokens per sequence: a whole prompt, or with
        ``kv_lens`` a chunk of a chunked prefill against the chunks before) or ``"decode"``
        (one token against ``kv_len`` cached).
      seq_len: new tokens per sequence (prefill).
      kv_len: cached positions of every sequence (decode; a prefill ignores it).
      batch: sequences per step.
      kv_lens: one cache length per sequence instead of ``kv_len``/``batch`` (sorted here).
      expert_loads: measured per-expert fractions of a mixture of experts' assignments
        (:func:`npujax.models.moe.expert_loads`); None: uniform routing.
      logits: which positions' logits the step computes (``build_decoder_graph``'s).
      experts_touched: distinct experts per MoE layer (default ``round(E[distinct])``;
        :func:`npujax.models.moe.expert_loads`).
      kv_cache: ``"copy"`` (the traced graph's per-step copy of the cache) or ``"in_place"``
        (:func:`~npujax.models.llm_graph.build_decoder_graph`).

    Raises:
      ConfigError: an unknown config name, phase or a non-positive length.
    """
    from npujax.models.llm_graph import build_decoder_graph
    from npujax.models.moe import expert_loads as routing

    cfg = resolve_config(config)
    if phase not in ("prefill", "decode"):
        raise ConfigError(f"phase must be 'prefill' or 'decode', got {phase!r}.")
    tokens = seq_len if phase == "prefill" else 1
    if kv_lens is not None:
        lens = sorted(kv_lens)
    else:  # (a prefill's kv_len is ignored: a whole prompt; chunks give kv_lens)
        lens = [kv_len if phase == "decode" else 0] * batch
    if tokens < 1 or not lens or min(lens) < 0 or (phase == "decode" and min(lens) < 1):
        raise ConfigError(f"seq_len, kv_len and batch must be >= 1 (kv_len >= 0 for a "
                          f"prefill), got {seq_len}, {kv_len if kv_lens is None else lens}, "
                          f"{len(lens)}.")
    loads = (routing(tokens * len(lens), cfg.experts, cfg.experts_per_token, expert_loads,
                     distinct=experts_touched) if cfg.moe_layers else ())
    graph, params = build_decoder_graph(cfg, tokens=tokens, kv_lens=lens, expert_loads=loads,
                                        logits=logits, kv_cache=kv_cache)
    return optimize(graph, params)[0]


def resolve_config(config: Any) -> Any:
    """A :class:`~npujax.models.transformer.DecoderConfig` from itself, a shipped name or a
    ``config.json`` path (:func:`npujax.models.hf_config.load_decoder`)."""
    if isinstance(config, (str, os.PathLike)):
        from npujax.models.hf_config import load_decoder

        return load_decoder(config)
    return config


def kv_bytes_per_token(cfg: Any, kv_len: int, kv_bits: int) -> float:
    """KV-cache bytes one sequence's decode step reads at ``kv_len`` cached positions:
    ``sum_i 2 kv_heads head_dim L_i kv_bits / 8``, ``L_i = min(kv_len, window - 1)`` on a
    sliding-window layer, ``kv_len`` on the others."""
    w = cfg.sliding_window
    per = [min(kv_len, w - 1) if (w and i in cfg.local_layers) else kv_len
           for i in range(cfg.layers)]
    return 2 * cfg.kv_heads * cfg.head_dim * sum(per) * kv_bits / 8


def kv_cache_operands(graph: Graph) -> dict[str, int]:
    """``{attention MatMul: operand index}``: the operand of each GEMM of two activations that
    is read from a key/value cache, i.e. whose value comes, through ops exact on integer codes
    (Reshape, Transpose, ...), from a Concat of a graph constant (the cached positions) with
    the new ones, or is a cache read in place (a graph input in a
    :data:`~npujax.models.llm_graph.KV_CACHE` scope). Empty for a graph without a cache (a
    prefill, an encoder)."""
    def from_cache(t: str) -> bool:
        if t in graph.inputs:  # a cache read in place (npujax.models.llm_graph)
            return f"/{KV_CACHE}/" in t
        while (p := graph.producer(t)) is not None:
            if p.op == "Concat":
                return any(i in graph.constants for i in p.inputs)
            if OPS[p.op].codes != "exact" or not p.inputs:
                return False
            t = p.inputs[0]
        return False

    out = {}
    for n in graph.nodes:
        if n.op in operand_quantized_ops():
            idx = [i for i in (0, 1) if from_cache(n.inputs[i])]
            if len(idx) == 1:
                out[n.name] = idx[0]
    return out


def decoder_precision(graph: Graph, weight_bits: int, act_bits: int, kv_bits: int
                      ) -> dict[str, Any] | None:
    """The spec of a decoder lowering: the linear layers at ``weight_bits``/``act_bits``
    (weight-only int4: 4/16); in each attention MatMul the operand read from the KV cache
    (:func:`kv_cache_operands`: K in ``Q K^T``, V in ``P V`` of a decode step) at ``kv_bits``
    and the other (the new token's query, the softmax output) at ``act_bits``. A prefill
    computes its keys and values (no cache operand): both attention operands at ``act_bits``.
    None when everything is 8 bits.

    Where the operands sit on the array follows the cost model's GEMM mapping (the first
    operand streams, ``M x K`` at its width; the second is the stationary one, ``K x N``): the
    traced decode attention streams the cache (``M = kv_len + 1`` positions, or ``K`` for
    ``P V``) past the one-token operand, so each cached element is read once per step at
    ``kv_bits``. The batched MatMuls of a mixture of experts take their expert weights (a
    constant second operand) at ``weight_bits``.
    """
    if weight_bits == act_bits == kv_bits == 8:
        return None
    q = quant_spec(graph, weight_bits, act_bits)
    cache = kv_cache_operands(graph)
    for n in graph.nodes:
        if n.op not in operand_quantized_ops():
            continue
        first, second = act_bits, act_bits
        if n.name in cache:
            first, second = (kv_bits, act_bits) if cache[n.name] == 0 else (act_bits, kv_bits)
        elif n.inputs[1] in graph.constants:  # a mixture of experts' weights
            second = weight_bits
        lq = dataclasses.replace(q[n.name], act=IntFormat(first, signed=False),
                                 weight=IntFormat(second, narrow_range=True))
        q[n.name] = for_operands(graph, n.name, lq, second)
    return q


def decoder_figures(schedule: Schedule, config: Any, *, phase: str, seq_len: int, kv_len: int,
                    batch: int, kv_bits: int, spec: NpuSpec | None = None) -> DecoderLowering:
    """Tokens per second, KV-cache bytes per token and (with ``spec``) the roofline bound of a
    lowered decoder phase (see :class:`DecoderLowering`)."""
    tokens = batch * (seq_len if phase == "prefill" else 1)
    kv = kv_bytes_per_token(config, kv_len, kv_bits) if phase == "decode" else 0.0
    roof: dict[str, Any] = {}
    if spec is not None:
        macs, nbytes = float(schedule.macs), float(schedule.dram_bytes)
        compute_s, memory_s = macs / spec.peak_macs_per_s, nbytes / spec.memory.dram_bytes_per_s
        roof = {"macs": macs, "dram_bytes": nbytes, "roofline_s": max(compute_s, memory_s),
                "bound": "compute" if compute_s >= memory_s else "memory",
                "arithmetic_intensity": macs / nbytes if nbytes else float("inf")}
    return DecoderLowering(config, phase, seq_len, kv_len, batch, kv_bits,
                           tokens / schedule.latency_s, kv, **roof)

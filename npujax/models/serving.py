"""LLM serving figures on an NPU: a prefill (whole or chunked) or a decode step of a batch,
lowered by the one cost program, with time to first token, tokens/s per sequence and in
aggregate, the weight bytes a step reads and the memory the model and its KV cache hold
against the preset's DRAM capacity (:func:`lower_decoder`).

Closed forms (per sequence; ``d`` hidden, ``hd`` head dim, ``KV`` key/value heads, ``L_i`` the
cache positions layer ``i`` keeps: ``min(kv_len, window - 1)`` for a sliding-window layer):

* KV cache read per generated token: ``sum_i 2 KV hd L_i kv_bits / 8`` bytes;
* weights read per step: every linear layer's ``K x N`` once (the LM head included; the
  embedding's rows are gathered, not read whole), a mixture-of-experts layer's router, shared
  expert and the *distinct* routed experts touched (:mod:`npujax.models.moe`), at
  ``weight_bits``; with per-group scales (``weight_group_size = G``) each layer also reads
  ``ceil(K / G) x N`` 16-bit scales (symmetric int4/int8 with float16 scales, as GPTQ/AWQ
  checkpoints store them; Frantar et al. 2022, arXiv:2210.17323);
* memory held: all parameters at ``weight_bits`` (+ scales) plus the KV cache of every
  sequence after the step.

The scale bytes are part of the weight bytes reported; the cost program's latency does not read
them (it has no per-group weight format yet): the report gives their DRAM time separately.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

from npujax.errors import ConfigError, LimitError
from npujax.models.decoders import (
    decoder_graph,
    decoder_precision,
    kv_bytes_per_token,
    resolve_config,
)
from npujax.models.moe import costed_experts, expected_experts

__all__ = ["ServingReport", "lower_decoder", "kv_bytes_per_token", "weight_elems_per_step"]


def _linears(cfg: Any, experts: float) -> list[tuple[int, int, float]]:
    """``(K, N, count)`` of every weight matrix a step reads (``experts``: distinct routed
    experts per MoE layer)."""
    d, hd = cfg.d_model, cfg.head_dim
    out: list[tuple[int, int, float]] = []
    for i in range(cfg.layers):
        out += [(d, cfg.heads * hd, 1), (d, cfg.kv_heads * hd, 2), (cfg.heads * hd, d, 1)]
        if i in cfg.moe_layers:
            out += [(d, cfg.experts, 1), (d, cfg.expert_d_ff, 2 * experts),
                    (cfg.expert_d_ff, d, experts)]
            if cfg.shared_d_ff:
                out += [(d, cfg.shared_d_ff, 2), (cfg.shared_d_ff, d, 1)]
                if cfg.shared_expert_gate:
                    out.append((d, 1, 1))
        else:
            out += [(d, cfg.d_ff, 2), (cfg.d_ff, d, 1)]
    return out + [(d, cfg.vocab, 1)]


def weight_elems_per_step(cfg: Any, experts: float = 0.0) -> float:
    """Weight elements a step reads (module docstring; ``experts``: distinct routed experts
    per MoE layer, e.g. :func:`npujax.models.moe.expected_experts`)."""
    return sum(k * n * c for k, n, c in _linears(cfg, experts))


def _scale_bytes(cfg: Any, experts: float, group: int) -> float:
    return sum(math.ceil(k / group) * n * c * 2 for k, n, c in _linears(cfg, experts)) \
        if group else 0.0


@dataclasses.dataclass(frozen=True)
class ServingReport:
    """Serving figures of one lowered step (see the module docstring).

    Attributes:
      phase: ``"prefill"`` or ``"decode"``.
      batch: sequences.
      seq_len: prompt tokens per sequence (prefill).
      kv_lens: cached positions per sequence (decode; sorted).
      prefill_chunk: tokens per chunk of a chunked prefill (0: one pass).
      chunk_latency_s: each chunk's latency (s; one entry without chunking).
      latency_s: the step's latency (s; a prefill: all chunks, the time to first token).
      ttft_s: time to first token (s; prefill), NaN for a decode step.
      tokens_per_s_per_sequence: ``seq_len / ttft`` (prefill) or ``1 / latency`` (decode).
      tokens_per_s: in aggregate, ``batch x`` the above.
      parameters: the model's parameters.
      expected_experts: distinct routed experts a MoE layer touches in expectation (0: dense).
      costed_experts: ``((experts, weight), ...)``: the whole expert counts the step was
        costed at and the weights of their latencies (:func:`npujax.models.moe.
        costed_experts`; the first step's for a chunked prefill); empty for a dense model.
      weight_bytes_per_step: weights read per step (a chunk of a chunked prefill), scales
        included (expected experts).
      scale_bytes_per_step: the per-group scales' part of it.
      kv_cache_bytes_per_token: KV bytes read per generated token, mean over sequences.
      weights_bytes: all parameters at ``weight_bits`` with scales (bytes held in DRAM).
      kv_cache_bytes: the KV cache of every sequence after the step (bytes held).
      dram_capacity_bytes: the preset's ``memory.dram_bytes`` (0: not stated).
    """

    phase: str
    batch: int
    seq_len: int
    kv_lens: tuple[int, ...]
    prefill_chunk: int
    chunk_latency_s: tuple[float, ...]
    latency_s: float
    ttft_s: float
    tokens_per_s_per_sequence: float
    tokens_per_s: float
    parameters: int
    expected_experts: float
    costed_experts: tuple[tuple[int, float], ...]
    weight_bytes_per_step: float
    scale_bytes_per_step: float
    kv_cache_bytes_per_token: float
    weights_bytes: float
    kv_cache_bytes: float
    dram_capacity_bytes: float

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields (``ttft_s`` None for a decode step)."""
        d = dataclasses.asdict(self)
        d["ttft_s"] = None if math.isnan(self.ttft_s) else self.ttft_s
        return d


def _footprint(cfg: Any, kv_after: Sequence[int], weight_bits: int, kv_bits: int,
               group: int) -> tuple[float, float]:
    w = cfg.parameters() * weight_bits / 8 + _scale_bytes(cfg, cfg.experts, group)
    kv = sum(kv_bytes_per_token(cfg, L, kv_bits) for L in kv_after)
    return w, kv


def lower_decoder(config: Any, spec: Any, *, phase: str, seq_len: int = 128,
                  kv_lens: Sequence[int] = (1024,), weight_bits: int = 8, act_bits: int = 8,
                  kv_bits: int = 8, weight_group_size: int = 0, prefill_chunk: int = 0,
                  expert_loads: Sequence[float] | None = None, dataflow: str | None = None,
                  kv_cache: str = "copy") -> tuple[Any, ServingReport]:
    """Lower a prefill or a decode step of a batch and its serving figures.

    Args:
      config: a :class:`~npujax.models.transformer.DecoderConfig`, a shipped name or a
        ``config.json`` path.
      spec: the NPU (:class:`~npujax.hw.NpuSpec`).
      phase: ``"prefill"`` (``seq_len`` prompt tokens per sequence; ``kv_lens`` gives the
        batch) or ``"decode"`` (one token per sequence against ``kv_lens``).
      seq_len: prompt tokens (prefill).
      kv_lens: one cache length per sequence (its length is the batch; a prefill uses only
        its length).
      weight_bits: width of the linear layers' weights
        (:func:`npujax.models.decoders.decoder_precision`).
      act_bits: width of their activations.
      kv_bits: width of the KV cache.
      weight_group_size: input channels per weight scale (0: per channel, no scale bytes).
      prefill_chunk: chunked prefill, tokens per chunk (0: one pass); each chunk attends to
        the chunks before it, only the last computes logits.
      expert_loads: measured per-expert fractions (:mod:`npujax.models.moe`).
      dataflow: overrides the preset's.
      kv_cache: ``"copy"`` (the traced graph's per-step copy of the cache) or ``"in_place"``
        (the new positions written into the cache, read where it lies;
        :func:`npujax.models.llm_graph.build_decoder_graph`).

    Returns:
      ``(lowering, report)``: the :class:`npujax.plan.lower.Lowering` of the step (the first
      chunk's for a chunked prefill; for a mixture of experts the one at the lower whole
      expert count) and the :class:`ServingReport`, whose latencies weight the expert counts.

    Raises:
      ConfigError: a bad length, chunk or group size (see
        :func:`~npujax.models.decoders.decoder_graph`).
      LimitError: the weights and the KV cache do not fit the preset's DRAM capacity (the
        message gives both and how to shrink them).
    """
    from npujax.plan.lower import lower_dataflows

    cfg = resolve_config(config)
    lens = tuple(sorted(int(x) for x in kv_lens))
    b = len(lens)
    if weight_group_size < 0 or prefill_chunk < 0:
        raise ConfigError(f"weight_group_size and prefill_chunk must be >= 0, got "
                          f"{weight_group_size}, {prefill_chunk}.")
    tokens = seq_len if phase == "prefill" else 1
    kv_after = [seq_len] * b if phase == "prefill" else [L + 1 for L in lens]
    w_bytes, kv_bytes = _footprint(cfg, kv_after, weight_bits, kv_bits, weight_group_size)
    cap = float(spec.memory.dram_bytes)
    if cap and w_bytes + kv_bytes > cap:
        raise LimitError(
            f"{cfg.source or 'the decoder'} needs {w_bytes / 2**30:.2f} GiB of weights "
            f"({weight_bits}-bit) and {kv_bytes / 2**30:.2f} GiB of KV cache ({b} sequences, "
            f"{kv_bits}-bit) = {(w_bytes + kv_bytes) / 2**30:.2f} GiB, over {spec.name}'s "
            f"DRAM capacity memory.dram_bytes = {cap / 2**30:.2f} GiB; use fewer or shorter "
            "sequences, --kv-bits 4, --weight-bits 4, or a preset with more memory.")

    def one(n: int, cached: list[int], logits: str, touched: int | None) -> Any:
        if phase == "decode":
            g = decoder_graph(cfg, phase="decode", kv_lens=cached, expert_loads=expert_loads,
                              experts_touched=touched, kv_cache=kv_cache)
        else:
            g = decoder_graph(cfg, phase="prefill", seq_len=n, kv_lens=cached,
                              expert_loads=expert_loads, logits=logits,
                              experts_touched=touched, kv_cache=kv_cache)
        return lower_dataflows(g, spec, decoder_precision(g, weight_bits, act_bits, kv_bits),
                               dataflow=dataflow)

    def step(n: int, cached: list[int], logits: str
             ) -> tuple[Any, float, tuple[tuple[int, float], ...]]:
        """(the lowering, the latency, the expert counts and weights) of one step: a mixture of
        experts at the whole counts around the expectation, weighted (moe.costed_experts)."""
        if not cfg.moe_layers:
            r = one(n, cached, logits, None)
            return r, float(r.schedule.latency_s), ()
        mix = costed_experts(b * n, cfg.experts, cfg.experts_per_token, expert_loads)
        rs = [one(n, cached, logits, d) for d, _ in mix]
        return rs[0], sum(w * float(r.schedule.latency_s) for r, (_, w) in zip(rs, mix)), mix

    if phase == "prefill" and prefill_chunk and prefill_chunk < seq_len:
        starts = list(range(0, seq_len, prefill_chunk))
        steps = [step(min(prefill_chunk, seq_len - s0), [s0] * b,
                      "last" if s0 == starts[-1] else "none") for s0 in starts]
        tokens = min(prefill_chunk, seq_len)
    elif phase == "prefill":
        steps = [step(seq_len, [0] * b, "last")]
    elif phase == "decode":
        steps = [step(1, list(lens), "all")]
    else:
        raise ConfigError(f"phase must be 'prefill' or 'decode', got {phase!r}.")
    chunks = tuple(lat for _, lat, _ in steps)
    latency = sum(chunks)
    n = b * tokens
    ex = expected_experts(n, cfg.experts, cfg.experts_per_token, expert_loads) \
        if cfg.moe_layers else 0.0
    costed = steps[0][2]
    scales = _scale_bytes(cfg, ex, weight_group_size)
    per_seq = (seq_len if phase == "prefill" else 1) / latency
    report = ServingReport(
        phase=phase, batch=b, seq_len=seq_len if phase == "prefill" else 0,
        kv_lens=lens if phase == "decode" else (),
        prefill_chunk=prefill_chunk if phase == "prefill" else 0, chunk_latency_s=chunks,
        latency_s=latency, ttft_s=latency if phase == "prefill" else float("nan"),
        tokens_per_s_per_sequence=per_seq, tokens_per_s=b * per_seq,
        parameters=cfg.parameters(), expected_experts=ex, costed_experts=costed,
        weight_bytes_per_step=weight_elems_per_step(cfg, ex) * weight_bits / 8 + scales,
        scale_bytes_per_step=scales,
        kv_cache_bytes_per_token=(sum(kv_bytes_per_token(cfg, L, kv_bits) for L in lens) / b
                                  if phase == "decode" else 0.0),
        weights_bytes=w_bytes, kv_cache_bytes=kv_bytes, dram_capacity_bytes=cap)
    return steps[0][0], report

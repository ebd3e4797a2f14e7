"""Prefill and decode latency of a decoder-only LLM on the transformer-capable presets.

Usage: python experiments/transformer_quant/lower_decoders.py [--config qwen2.5-0.5b]

Builds the decoder's graph from the shapes of a public config (no weights;
``npujax.models.llm_graph``) for a prefill at several prompt lengths (the last position's
logits) and one decode step, lowers it on edge_transformer_16x16 and
datacenter_128x128 at W8A8, with 4-bit weights (int8 compute, an 8- or 16-bit KV cache) and
weight-only int4 (16-bit activations), and prints markdown tables. The KV cache is the K/V
operand of the decode step's attention MatMuls (``--kv-bits``); the query and the softmax output
take the activation width. ``--seq-lens ""`` lowers the decode step only
(docs/results/transformers.md).
"""

from __future__ import annotations

import argparse
import time

from npujax.hw import load_npu_spec
from npujax.models.decoders import decoder_figures, decoder_graph, decoder_precision
from npujax.models.transformer import DECODER_CONFIGS
from npujax.plan import lower

PRESETS = ("edge_transformer_16x16", "datacenter_128x128")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="qwen2.5-0.5b", choices=sorted(DECODER_CONFIGS))
    ap.add_argument("--seq-lens", default="16,128,1024")
    ap.add_argument("--kv-len", type=int, default=1024)
    a = ap.parse_args()
    cfg = DECODER_CONFIGS[a.config]
    print(f"{a.config}: {cfg.source}\n")
    print("| phase | preset | precision | latency ms | tokens/s | KV bytes/token | "
          "memory-bound layers | roofline bound |")
    print("|---|---|---|---|---|---|---|---|")
    runs = [("prefill", int(s)) for s in a.seq_lens.split(",") if s] + [("decode", 1)]
    for phase, seq in runs:
        t = time.time()
        g = decoder_graph(cfg, phase=phase, seq_len=seq, kv_len=a.kv_len, batch=1)
        traced = time.time() - t
        for preset in PRESETS:
            spec = load_npu_spec(preset)
            for label, bits in (("W8A8, KV 8", (8, 8, 8)), ("W4A8, KV 8", (4, 8, 8)),
                                ("W4A8, KV 16", (4, 8, 16)), ("W4A16, KV 8", (4, 16, 8))):
                if phase == "prefill" and bits != (8, 8, 8):
                    continue
                s = lower(g, spec, decoder_precision(g, *bits))
                f = decoder_figures(s, cfg, phase=phase, seq_len=seq, kv_len=a.kv_len, batch=1,
                                    kv_bits=bits[2], spec=spec)
                shape = f"{seq} tokens" if phase == "prefill" else f"kv {a.kv_len}"
                mem = sum(r.bound == "memory" for r in s.layers)
                print(f"| {phase} ({shape}) | {preset} | {label} | {s.latency_s * 1e3:,.3f} | "
                      f"{f.tokens_per_s:,.0f} | {f.kv_cache_bytes_per_token:,.0f} | "
                      f"{mem}/{len(s.layers)} | {f.bound} ({f.roofline_s * 1e3:,.3f} ms) |",
                      flush=True)
        print(f"<!-- built {phase} in {traced:.1f} s -->", flush=True)


if __name__ == "__main__":
    main()

"""Attention fusion on an LLM prefill: each transformer preset as shipped (its
``ops.attention_fusion``) against the same preset with ``"none"`` (every attention block layer by
layer, the scores through DRAM).

Usage: python experiments/transformer_quant/attention_fusion.py [--config qwen2.5-0.5b]
           [--seq-lens 512,1024,2048] [--npu edge_transformer_16x16,datacenter_128x128]

Builds the decoder's graph from the shapes of a public config (no weights;
``npujax.models.llm_graph``) once per prompt length, lowers it at W8A8 on each preset with
and without attention fusion and prints the markdown table of docs/results/transformers.md
("Attention fusion").
"""

from __future__ import annotations

import argparse
import collections
import time

from npujax.hw import load_npu_spec
from npujax.models.decoders import decoder_graph
from npujax.models.transformer import DECODER_CONFIGS
from npujax.plan import lower


def _blocks(schedule) -> str:
    """'24/24 on_chip, 64 x 512, 56 x 1' (the most common outcome) for the table."""
    att = schedule.attention
    if not att:
        return "none recognised"
    fused = [a for a in att if a.mode != "unfused"]
    if not fused:
        return f"0/{len(att)} fused"
    (mode, br, bc, tr, tc), _ = collections.Counter(
        (a.mode, a.query_block, a.key_block, a.query_blocks, a.key_blocks) for a in fused
    ).most_common(1)[0]
    return f"{len(fused)}/{len(att)} {mode}, {br} × {bc}, {tr} × {tc}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="qwen2.5-0.5b", choices=sorted(DECODER_CONFIGS))
    ap.add_argument("--seq-lens", default="512,1024,2048")
    ap.add_argument("--npu", default="edge_transformer_16x16,datacenter_128x128")
    a = ap.parse_args()
    cfg = DECODER_CONFIGS[a.config]
    specs = [load_npu_spec(n) for n in a.npu.split(",")]
    print(f"{a.config}: {cfg.source}; prefill, batch 1, W8A8\n")
    print(
        "| seq len | preset (attention_fusion) | latency ms none → fused | tokens/s none → "
        "fused | DRAM GB none → fused | blocks fused (mode, `B_r × B_c`, `T_r × T_c`) |"
    )
    print("|---|---|---|---|---|---|")
    for seq in (int(s) for s in a.seq_lens.split(",")):
        t = time.time()
        g = decoder_graph(cfg, phase="prefill", seq_len=seq, kv_len=1, batch=1)
        traced = time.time() - t
        for spec in specs:
            before = lower(g, spec.with_fields({"ops.attention_fusion": "none"}))
            after = lower(g, spec)
            print(
                f"| {seq} | {spec.name} ({spec.ops.attention_fusion}) | "
                f"{before.latency_s * 1e3:,.3f} → {after.latency_s * 1e3:,.3f} | "
                f"{seq / before.latency_s:,.0f} → {seq / after.latency_s:,.0f} | "
                f"{before.dram_bytes / 1e9:,.3f} → {after.dram_bytes / 1e9:,.3f} | "
                f"{_blocks(after)} |",
                flush=True,
            )
        print(f"<!-- built {seq} tokens in {traced:.0f} s -->", flush=True)


if __name__ == "__main__":
    main()

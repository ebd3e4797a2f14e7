"""Benchmark: building and lowering an LLM decoder (24 layers: Qwen2.5-0.5B shapes), the steady
``lower`` after compilation, and a sweep over the prefill sequence length lowered point by point
(one compiled cost program per length) vs vmapped (:func:`npujax.plan.sweep_shapes`: one program
for the whole sweep) -- both measured in one run, with the sweep's table on each preset.

Usage: python experiments/bench/decoder_lowering.py [--config qwen2.5-0.5b]
           [--seq-lens 16,32,...] [--npu edge_transformer_16x16,datacenter_128x128]

Targets (issue 12): steady ``lower`` < 100 ms; the sweep vmapped rather than re-traced.
Prints the timings and, per preset, latency / tokens/s / roofline bound per sequence length
(where prefill turns compute-bound).
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from npujax.hw import load_npu_spec
from npujax.models.decoders import decoder_graph
from npujax.models.transformer import DECODER_CONFIGS
from npujax.plan import lower, sweep_shapes, workloads


def timed(fn):
    t = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="qwen2.5-0.5b", choices=sorted(DECODER_CONFIGS))
    ap.add_argument("--seq-lens", default="16,64,256,1024,2048")
    ap.add_argument("--npu", default="edge_transformer_16x16,datacenter_128x128")
    ap.add_argument("--repeats", type=int, default=5)
    a = ap.parse_args()
    cfg = DECODER_CONFIGS[a.config]
    seqs = [int(s) for s in a.seq_lens.split(",")]
    specs = [load_npu_spec(n) for n in a.npu.split(",")]
    print(f"{a.config}: {cfg.layers} layers, d_model {cfg.d_model}; prefill, batch 1")

    graphs, trace_s = [], []
    for s in seqs:  # the graph is per shape (static shapes); the cost program is not
        g, t = timed(lambda s=s: decoder_graph(cfg, phase="prefill", seq_len=s, kv_len=1,
                                               batch=1))
        graphs.append(g)
        trace_s.append(t)
        print(f"  built seq {s}: {len(g.nodes)} nodes, {t:.2f} s", flush=True)
    spec = specs[0]
    ref = len(seqs) // 2
    _, first = timed(lambda: lower(graphs[ref], spec))
    steady = statistics.median(timed(lambda: lower(graphs[ref], spec))[1]
                               for _ in range(a.repeats))
    print(f"lower (seq {seqs[ref]}, {spec.name}): first {first:.2f} s (compiles), steady "
          f"{steady * 1e3:.1f} ms (median of {a.repeats}; target < 100 ms)")

    for spec in specs:
        pts = [workloads(g, spec) for g in graphs]
        per_point, t_points = timed(lambda spec=spec: [lower(g, spec).latency_s for g in graphs])
        # the graphs, so the preset's attention fusion applies as in lower
        costs, t_sweep = timed(lambda spec=spec: sweep_shapes(graphs, spec))
        _, t_sweep2 = timed(lambda spec=spec: sweep_shapes(graphs, spec))
        lat = costs.latency_cycles.sum(-1) / spec.array.clock_hz
        same = np.allclose(lat, per_point, rtol=1e-12)
        print(f"\n{spec.name}: sweep of {len(seqs)} lengths: point by point {t_points:.2f} s "
              f"({len(seqs)} cost programs), vmapped {t_sweep:.2f} s first / "
              f"{t_sweep2 * 1e3:.1f} ms steady (1 program; {t_points / t_sweep:.1f}x / "
              f"{t_points / t_sweep2:.0f}x); same latencies: {same}")
        print(f"| seq len | latency ms | tokens/s | MACs/byte (ridge "
              f"{spec.ridge_macs_per_byte:.0f}) | roofline bound | modelled / roofline | "
              "time in compute-bound layers |\n|---|---|---|---|---|---|---|")
        busy = costs.compute_cycles >= costs.memory_cycles  # per layer (NPU layers)
        for i, s in enumerate(seqs):
            cyc = costs.latency_cycles[i]
            sched_macs = float(sum(w.macs for w in pts[i]))
            nbytes = float(costs.dram_bytes[i].sum())
            comp, mem = sched_macs / spec.peak_macs_per_s, nbytes / spec.memory.dram_bytes_per_s
            print(f"| {s} | {lat[i] * 1e3:,.3f} | {s / lat[i]:,.0f} | "
                  f"{sched_macs / nbytes:,.1f} | {'compute' if comp >= mem else 'memory'} | "
                  f"{lat[i] / max(comp, mem):.2f} | "
                  f"{100 * cyc[busy[i]].sum() / cyc.sum():.0f} % |")
    print(f"\nbuilding the graphs: {sum(trace_s):.1f} s for {len(seqs)} lengths "
          f"({statistics.median(trace_s):.2f} s median)")


if __name__ == "__main__":
    main()

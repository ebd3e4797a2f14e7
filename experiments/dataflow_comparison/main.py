"""Compare weight/output/input stationary on ResNet-18, MobileNetV2, transformer blocks and PP-OCR.

CNNs (hand-listed GEMMs, experiments/networks.py): for 16x16, 32x32 and 128x128 arrays, each
dataflow and each DRAM-level mapping (``scalesim``: SCALE-Sim's fixed fold order, ``best``: the
closed-form mapper; npujax.systolic.mapping), compute cycles (closed form, exact to SCALE-Sim,
plus the fill/drain the mapper's chunks repeat) and total cycles with DRAM stalls, summed over
the layers.

Transformers (traced graphs, every operator included): a BERT-base encoder block (LayerNorm,
nnx.MultiHeadAttention with its softmax, GELU MLP) and one Qwen2.5-0.5B decoder block (RMSNorm,
grouped-query attention with rotary embeddings, SwiGLU) in prefill and in decode, traced from
Flax and lowered with npujax.lower on the edge_transformer_16x16 preset resized to each array
(SRAM, DRAM bandwidth and vector lanes scaled as for the CNNs), so softmax, normalization and the
attention's data movement run on the vector unit next to the GEMMs on the array. They use the
preset's mapping (``best``).

PP-OCR: the classifier and detector (the zoo's ONNX models, if they can be fetched) lowered end
to end on edge_16x16 per dataflow and mapping, and a per-layer breakdown of the detector's DRAM
traffic that explains why weight stationary is slow in SCALE-Sim's order.

Tables go to docs/results/dataflows.md (the prose there is written by hand after reading them,
between the markers this script leaves alone) and plots to docs/results/dataflows_*.png.

Usage: PYTHONPATH=. python experiments/dataflow_comparison/main.py [--out docs/results] [--small]
       [--skip-ppocr]
"""

from __future__ import annotations

import argparse
import dataclasses
import io
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "experiments"))

from networks import NETWORKS  # noqa: E402

from npujax._atomic import atomic_write_bytes, atomic_write_text  # noqa: E402
from npujax.hw import DATAFLOWS, MAPPINGS, NpuSpec, load_npu_spec  # noqa: E402
from npujax.ir.graph import Graph  # noqa: E402
from npujax.plan import Schedule, lower_by_dataflow  # noqa: E402
from npujax.systolic import gemm_mapping  # noqa: E402

SHORT = {"weight_stationary": "WS", "output_stationary": "OS", "input_stationary": "IS"}

# Hardware per array size (int8 operands and outputs, 3 separate double-buffered SRAMs as in
# SCALE-Sim; DRAM bandwidth in bytes per array cycle). 16x16 is the edge_16x16 preset
# (128 KiB SRAMs, 6.4 GB/s at 1 GHz); the larger ones scale SRAM and bandwidth with the array.
HARDWARE = {
    16: {"sram": 128 * 1024, "bw": 6.4},
    32: {"sram": 512 * 1024, "bw": 16.0},
    128: {"sram": 8 * 1024 * 1024, "bw": 64.0},
}
BEGIN, END = "<!-- tables:begin -->", "<!-- tables:end -->"
#: The traced transformer workloads' base preset (resized per array size by :func:`spec_for`).
TRANSFORMER_PRESET = "edge_transformer_16x16"
#: Prompt length of the decoder's prefill and cached positions of its decode step.
PREFILL_TOKENS, DECODE_KV = 128, 1024


def spec_for(size: int) -> NpuSpec:
    """The transformer preset at ``size`` x ``size``: :data:`HARDWARE`'s SRAMs and bandwidth, and
    as many vector lanes as array columns (one output row per cycle)."""
    base = load_npu_spec(TRANSFORMER_PRESET)
    if size == base.array.rows:
        return base
    hw = HARDWARE[size]
    return base.with_fields({
        "array.rows": size, "array.cols": size, "vector.lanes": size,
        "memory.ifmap_sram_bytes": hw["sram"], "memory.filter_sram_bytes": hw["sram"],
        "memory.ofmap_sram_bytes": hw["sram"],
        "memory.dram_bytes_per_s": hw["bw"] * base.array.clock_hz,
    }, name=f"edge_transformer_{size}x{size}")


def encoder_graph(seq: int = 128, d_model: int = 768, heads: int = 12, d_ff: int = 3072) -> Graph:
    """One pre-norm encoder block at BERT-base sizes (Devlin et al. 2019; Vaswani et al. 2017),
    traced from Flax NNX with zero weights (only the shapes matter for the latency)."""
    import jax.numpy as jnp
    from flax import nnx

    from npujax.frontends.flax import trace_flax
    from npujax.ir.passes import optimize

    class EncoderBlock(nnx.Module):
        def __init__(self, rngs: nnx.Rngs):
            self.ln1 = nnx.LayerNorm(d_model, rngs=rngs)
            self.attn = nnx.MultiHeadAttention(num_heads=heads, in_features=d_model,
                                               decode=False, rngs=rngs)
            self.ln2 = nnx.LayerNorm(d_model, rngs=rngs)
            self.fc1 = nnx.Linear(d_model, d_ff, rngs=rngs)
            self.fc2 = nnx.Linear(d_ff, d_model, rngs=rngs)

        def __call__(self, h):
            h = h + self.attn(self.ln1(h))
            return h + self.fc2(nnx.gelu(self.fc1(self.ln2(h)), approximate=False))

    graphdef, state = nnx.split(nnx.eval_shape(lambda: EncoderBlock(nnx.Rngs(0))))
    state = jax.tree.map(lambda v: jnp.zeros(v.shape, v.dtype), state)
    block = nnx.merge(graphdef, state)
    return optimize(*trace_flax(block, jnp.zeros((1, seq, d_model), jnp.float32), check=False))[0]


def decoder_block_graph(phase: str, config: str = "qwen2.5-0.5b", prefill_tokens: int =
                        PREFILL_TOKENS, kv_len: int = DECODE_KV) -> Graph:
    """One decoder block of ``config`` (Qwen2.5-0.5B: its config.json shapes, see
    ``npujax.models.transformer.DECODER_CONFIGS``) in ``phase``, traced from the reference Flax
    decoder; the vocabulary is cut to 1,024 since the embedding and LM head are not reported."""
    from npujax.models.decoders import decoder_graph
    from npujax.models.transformer import DECODER_CONFIGS

    cfg = dataclasses.replace(DECODER_CONFIGS[config], layers=1, vocab=1024)
    return decoder_graph(cfg, phase=phase, seq_len=prefill_tokens if phase == "prefill" else 1,
                         kv_len=kv_len, batch=1)


def _block_layers(schedule: Schedule, decoder: bool) -> list:
    """The block's layers: a decoder's without its embedding, final norm and LM head."""
    layers = list(schedule.layers)
    if not decoder:
        return layers
    names = [r.name for r in layers]
    start = next(i for i, n in enumerate(names) if n.startswith("blocks/"))
    return layers[start:names.index("norm")]


def evaluate_traced(graph: Graph, size: int, decoder: bool = False,
                    mapping: str | None = None) -> dict[str, dict]:
    """Per dataflow, the per-layer figures of ``graph`` lowered on :func:`spec_for` ``(size)``
    under ``mapping`` (None: the preset's, ``best``): array cycles (``compute``: GEMM layers'
    array cycles, vector layers' lane cycles), latency cycles (``total``, with stalls, DMA and
    conversions) and DRAM bytes, plus the layer kinds. All dataflows come from one compiled
    call (:func:`npujax.plan.lower_by_dataflow`)."""
    spec = spec_for(size)
    out = {}
    for df, schedule in lower_by_dataflow(graph, spec, dataflows=DATAFLOWS,
                                          mapping=mapping).items():
        rows = _block_layers(schedule, decoder)
        get = lambda f: np.asarray([getattr(r.costs, f) for r in rows], np.float64)  # noqa: E731,B023
        out[df] = {"compute": get("compute_cycles"), "total": get("latency_cycles"),
                   "stall": get("stall_cycles"), "dram": get("dram_bytes"),
                   "macs": np.asarray([r.macs for r in rows], np.float64),
                   "gemm": np.asarray([r.kind == "gemm" for r in rows]),
                   "ops": [r.op for r in rows], "pes": size * size}
    return out


#: Traced transformer workloads: name -> (graph builder, decoder?, title).
TRACED = {
    "transformer_encoder": (encoder_graph, False,
                            "transformer encoder block (traced; BERT-base, 128 tokens)"),
    "decoder_prefill": (lambda: decoder_block_graph("prefill"), True,
                        f"Qwen2.5-0.5B decoder block, prefill ({PREFILL_TOKENS} tokens; traced)"),
    "decoder_decode": (lambda: decoder_block_graph("decode"), True,
                       f"Qwen2.5-0.5B decoder block, decode (1 token, {DECODE_KV} cached; "
                       "traced)"),
}
#: The same workloads at test sizes (``--small``: the whole script in seconds).
TRACED_SMALL = {
    "transformer_encoder": (lambda: encoder_graph(16, 64, 4, 128), False,
                            "transformer encoder block (traced; d_model 64, 16 tokens)"),
    "decoder_prefill": (lambda: decoder_block_graph("prefill", "tiny", 16, 64), True,
                        "tiny decoder block, prefill (16 tokens; traced)"),
    "decoder_decode": (lambda: decoder_block_graph("decode", "tiny", 16, 64), True,
                       "tiny decoder block, decode (1 token, 64 cached; traced)"),
}


def evaluate(layers, size: int, dataflow: str, mapping: str = "best"):
    # (the extents are constants of the program: XLA folds most of the mapping model at
    # compile time, faster than compiling it for traced extents)
    M, K, N, G, U = (jnp.asarray([lay[i] for lay in layers], jnp.int32) for i in range(1, 6))
    hw = HARDWARE[size]
    with jax.enable_x64(True):  # float64 results (a jit outside x64 returns float32)
        m = jax.jit(lambda: gemm_mapping(M, K, N, size, size, dataflow, sram_bytes_a=hw["sram"],
                                         sram_bytes_b=hw["sram"], sram_bytes_out=hw["sram"],
                                         dram_bytes_per_cycle=hw["bw"], unique_elems_a=U,
                                         mapping=mapping))()
        m = jax.tree.map(np.asarray, m)
    g = np.asarray(G, np.float64)
    busy = (np.asarray(m["compute_cycles"], np.float64)
            + np.asarray(m["extra_fill_drain_cycles"], np.float64))
    return {"compute": busy * g,
            "total": np.asarray(m["total_cycles"], np.float64) * g,
            "dram": np.asarray(m["dram_bytes"], np.float64) * g,
            "macs": np.asarray([lay[1] * lay[2] * lay[3] * lay[4] for lay in layers], np.float64)}


def _plot(path, net, res, mapping: str = "best"):
    """Bar plot of ``res`` ({(array size, dataflow, mapping): figures}): compute and total cycles
    under ``mapping`` per array size and dataflow, and (where ``res`` has them) black marks at
    the total cycles in SCALE-Sim's fold order. Written atomically to ``path`` (PNG)."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    sizes = sorted({size for size, _, _ in res})
    fig, ax = plt.subplots(figsize=(7, 3.8))
    width = 0.26
    for i, df in enumerate(DATAFLOWS):
        x = np.arange(len(sizes)) + (i - 1) * width
        comp = [res[(s, df, mapping)]["compute"].sum() for s in sizes]
        tot = [res[(s, df, mapping)]["total"].sum() for s in sizes]
        ax.bar(x, tot, width, color=f"C{i}", alpha=0.35)
        ax.bar(x, comp, width, color=f"C{i}", label=f"{SHORT[df]} ({df})")
        if mapping != "scalesim" and all((s, df, "scalesim") in res for s in sizes):
            ref = [res[(s, df, "scalesim")]["total"].sum() for s in sizes]
            ax.plot(x, ref, "k_", markersize=14,
                    label="SCALE-Sim order, total" if i == 0 else None)
    ax.set_yscale("log")
    ax.set_xticks(np.arange(len(sizes)), [f"{s}x{s}" for s in sizes])
    ax.set_ylabel("cycles (solid: compute, light: + DRAM stalls)")
    ax.set_title(f"{net}: cycles per inference by dataflow ({mapping} mapping)")
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3, which="both")
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    atomic_write_bytes(path, buf.getvalue())


def _bold(v, best):
    return f"**{v:,.0f}**" if v == best else f"{v:,.0f}"


def _bold(v, best):
    return f"**{v:,.0f}**" if v == best else f"{v:,.0f}"


def tables(all_res) -> str:
    """Markdown tables of the hand-listed CNNs: ``all_res`` {net: (layers, {(size, dataflow,
    mapping): figures of :func:`evaluate`})}, both mappings per array size (bold: best dataflow)."""
    out = []
    for net, (layers, res) in all_res.items():
        macs = sum(lay[1] * lay[2] * lay[3] * lay[4] for lay in layers)
        out.append(f"### {net} ({len(layers)} GEMM layers, {macs / 1e9:.3f} GMACs)\n")
        out.append("| array | mapping | dataflow | compute cycles | total cycles (with stalls) "
                   "| stall % | utilization | DRAM MB | layers won (total) |")
        out.append("|---|---|---|---:|---:|---:|---:|---:|---:|")
        for s in sorted(HARDWARE):
            for mp in MAPPINGS[::-1]:  # scalesim (before) then best (after)
                tot = np.stack([res[(s, df, mp)]["total"] for df in DATAFLOWS])
                wins = np.bincount(np.argmin(tot, axis=0), minlength=3)
                best_c = min(res[(s, df, mp)]["compute"].sum() for df in DATAFLOWS)
                best_t = min(res[(s, df, mp)]["total"].sum() for df in DATAFLOWS)
                for i, df in enumerate(DATAFLOWS):
                    r = res[(s, df, mp)]
                    c, t = r["compute"].sum(), r["total"].sum()
                    util = macs / (c * s * s)
                    out.append(f"| {s}x{s} | {mp} | {SHORT[df]} | {_bold(c, best_c)} | "
                               f"{_bold(t, best_t)} | {100 * (t - c) / t:.1f} | {util:.3f} | "
                               f"{r['dram'].sum() / 1e6:.2f} | {wins[i]} |")
        out.append("")
    return "\n".join(out)


PPOCR = {"ppocr_cls": {"x": (1, 3, 48, 192)}, "ppocr_det": {"x": (1, 3, 640, 640)}}


def ppocr_tables() -> str:
    """End-to-end lowering of the PP-OCR models on edge_16x16 per dataflow and mapping, and the
    detector's per-layer DRAM breakdown (the layers where WS and OS differ most)."""
    from npujax.frontends.onnx import from_onnx
    from npujax.hw import load_npu_spec
    from npujax.ir.passes import optimize
    from npujax.models.zoo import fetch_model
    from npujax.plan import lower, workloads

    spec = load_npu_spec("edge_16x16")
    out = ["### PP-OCR on edge_16x16 (end to end: `npujax lower`, INT8)\n",
           "| model | mapping | dataflow | latency (ms) | compute + fill/drain (ms) | stall (ms) "
           "| DRAM MB |", "|---|---|---|---:|---:|---:|---:|"]
    graphs = {}
    for name, shapes in PPOCR.items():
        try:
            graph, params = from_onnx(fetch_model(name), shapes, unsupported="fallback")
        except Exception as e:  # noqa: BLE001  (no network and no cached copy: skip, say why)
            out.append(f"| {name} | - | - | not available: {type(e).__name__} | | | |")
            continue
        graph, _ = optimize(graph, params)
        graphs[name] = graph
        for mp in MAPPINGS[::-1]:
            for df in DATAFLOWS:
                sch = lower(graph, spec, dataflow=df, mapping=mp)
                b = sch.breakdown_s()
                out.append(f"| {name} | {mp} | {SHORT[df]} | {sch.latency_s * 1e3:.2f} | "
                           f"{(b['compute'] + b['fill_drain']) * 1e3:.2f} | "
                           f"{b['stall'] * 1e3:.2f} | {sch.dram_bytes / 1e6:.1f} |")
        # Eyeriss's row stationary on the same 16x16 array and buffers (its own buffer-level
        # order, npujax.systolic.rs_dram: the mapping option does not apply)
        sch = lower(graph, spec, dataflow="row_stationary")
        b = sch.breakdown_s()
        out.append(f"| {name} | own (RS) | RS | {sch.latency_s * 1e3:.2f} | "
                   f"{(b['compute'] + b['fill_drain']) * 1e3:.2f} | "
                   f"{b['stall'] * 1e3:.2f} | {sch.dram_bytes / 1e6:.1f} |")
    if "ppocr_det" not in graphs:
        return "\n".join(out) + "\n"
    # per-layer breakdown of the detector: the GEMM layers with the largest WS - OS gap
    graph = graphs["ppocr_det"]
    sched = {(df, mp): lower(graph, spec, dataflow=df, mapping=mp)
             for df in ("weight_stationary", "output_stationary") for mp in MAPPINGS}
    by_name = {w.name: w for w in workloads(graph, spec)}
    rows = [(a.latency_s - b.latency_s, a, b) for a, b in zip(
        sched[("weight_stationary", "scalesim")].layers,
        sched[("output_stationary", "scalesim")].layers) if a.kind == "gemm"]
    rows.sort(key=lambda r: -r[0])
    gap = sum(r[0] for r in rows)
    bw = spec.dram_bytes_per_cycle
    out += ["", "### ppocr_det on edge_16x16: where weight stationary loses (SCALE-Sim order)\n",
            f"The {min(8, len(rows))} GEMM layers with the largest WS - OS latency gap (of "
            f"{len(rows)}; they make {sum(r[0] for r in rows[:8]) / gap:.0%} of the whole "
            f"{gap * 1e3:.1f} ms gap). WS DRAM MB split into the im2col input read (*in*), "
            "the weights (*w*), the int32 partial sums spilled and read back (*psum*) and the "
            "output written; *best* is the mapper's WS (chunks of pixels).\n",
            "| layer | M x K x N | WS latency (ms) | WS in / w / psum / out (MB) | OS latency (ms) "
            "| OS DRAM MB | WS best: latency (ms), DRAM MB, chunks |",
            "|---|---|---:|---|---:|---:|---|"]
    best_ws = {r.name: r for r in sched[("weight_stationary", "best")].layers}
    for _, a, b in rows[:8]:
        w = by_name[a.name]
        m = gemm_mapping(w.M, w.K, w.N, 16, 16, "weight_stationary",
                         sram_bytes_a=spec.memory.ifmap_sram_bytes,
                         sram_bytes_b=spec.memory.filter_sram_bytes,
                         sram_bytes_out=spec.memory.ofmap_sram_bytes, dram_bytes_per_cycle=bw,
                         unique_elems_a=w.in_elems / w.groups, mapping="scalesim")
        mb = gemm_mapping(w.M, w.K, w.N, 16, 16, "weight_stationary",
                          sram_bytes_a=spec.memory.ifmap_sram_bytes,
                          sram_bytes_b=spec.memory.filter_sram_bytes,
                          sram_bytes_out=spec.memory.ofmap_sram_bytes, dram_bytes_per_cycle=bw,
                          unique_elems_a=w.in_elems / w.groups)
        g = w.groups
        psum = 2 * float(m["dram_read_bytes_out"]) * g
        wr = float(m["dram_write_bytes_out"]) * g - psum / 2
        c = best_ws[a.name]
        out.append(f"| {a.name} | {w.M} x {w.K} x {w.N} | {a.latency_s * 1e3:.2f} | "
                   f"{float(m['dram_read_bytes_a']) * g / 1e6:.1f} / "
                   f"{float(m['dram_read_bytes_b']) * g / 1e6:.2f} / {psum / 1e6:.1f} / "
                   f"{wr / 1e6:.1f} | {b.latency_s * 1e3:.2f} | "
                   f"{float(b.costs.dram_bytes) / 1e6:.1f} | {c.latency_s * 1e3:.2f}, "
                   f"{float(c.costs.dram_bytes) / 1e6:.1f}, {int(mb['chunks'])} |")
    return "\n".join(out) + "\n"


def traced_tables(all_res, titles, mapping: str, ref=None) -> str:
    """Markdown tables of the traced blocks: ``all_res`` {net: {(size, dataflow): figures}} of
    :func:`evaluate_traced` under ``mapping``; ``ref`` (optional, same layout) the same lowered in
    SCALE-Sim's fold order, shown as one more column of total cycles."""
    out = []
    for net, res in all_res.items():
        rr = (ref or {}).get(net)
        sizes = sorted({size for size, _ in res})
        r0 = res[(sizes[0], DATAFLOWS[0])]
        macs = r0["macs"].sum()
        vec_ops = sorted({op for op, g in zip(r0["ops"], r0["gemm"]) if not g})
        out.append(f"### {titles[net]}: {int(r0['gemm'].sum())} GEMM + "
                   f"{int((~r0['gemm']).sum())} vector layers, {macs / 1e9:.3f} GMACs "
                   f"({mapping} mapping)\n")
        out.append(f"Vector layers: {', '.join(vec_ops)}.\n")
        out.append("| array | dataflow | GEMM array cycles | vector cycles | total cycles (with "
                   "stalls) | vector % of total | stall % | GEMM utilization | DRAM MB | "
                   "GEMM layers won |" + (" total cycles, SCALE-Sim order |" if rr else ""))
        out.append("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|" + ("---:|" if rr else ""))
        for s in sizes:
            g = res[(s, DATAFLOWS[0])]["gemm"]
            tot = np.stack([res[(s, df)]["total"][g] for df in DATAFLOWS])
            wins = np.bincount(np.argmin(tot, axis=0), minlength=3)
            best = min(res[(s, df)]["total"].sum() for df in DATAFLOWS)
            for i, df in enumerate(DATAFLOWS):
                r = res[(s, df)]
                gc, vc, t = r["compute"][g].sum(), r["compute"][~g].sum(), r["total"].sum()
                vt = r["total"][~g].sum()
                tt = f"**{t:,.0f}**" if t == best else f"{t:,.0f}"
                out.append(f"| {s}x{s} | {SHORT[df]} | {gc:,.0f} | {vc:,.0f} | {tt} | "
                           f"{100 * vt / t:.1f} | {100 * r['stall'].sum() / t:.1f} | "
                           f"{macs / (gc * r['pes']):.3f} | {r['dram'].sum() / 1e6:.2f} | "
                           f"{wins[i]} |"
                           + (f" {rr[(s, df)]['total'].sum():,.0f} |" if rr else ""))
        out.append("")
    return "\n".join(out)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=str(ROOT / "docs/results"))
    p.add_argument("--small", action="store_true",
                   help="transformer blocks at test sizes on the 16x16 array only and no PP-OCR "
                        "(for tests)")
    p.add_argument("--skip-ppocr", action="store_true",
                   help="no PP-OCR tables (lowering the detector takes minutes)")
    args = p.parse_args(argv)
    out = Path(args.out)
    all_res = {}
    for net, make in NETWORKS.items():
        layers = make()
        res = {(s, df, mp): evaluate(layers, s, df, mp)
               for s in HARDWARE for df in DATAFLOWS for mp in MAPPINGS}
        all_res[net] = (layers, res)
        _plot(out / f"dataflows_{net}.png", net, res)
    traced, traced_ref, titles = {}, {}, {}
    mapping = spec_for(min(HARDWARE)).memory.mapping  # lower() uses the preset's mapping
    for net, (build, decoder, title) in (TRACED_SMALL if args.small else TRACED).items():
        titles[net] = title
        graph = build()
        # --small: the smallest array only (each array size compiles the cost model of the
        # three dataflows once, ~3 s on the 2-core machine)
        sizes = [min(HARDWARE)] if args.small else sorted(HARDWARE)
        res = {(s, df): r for s in sizes
               for df, r in evaluate_traced(graph, s, decoder).items()}
        traced[net] = res
        plot_res = {(s, df, mapping): r for (s, df), r in res.items()}
        if not args.small and mapping != "scalesim":  # the "before" column (skipped in tests)
            traced_ref[net] = {(s, df): r for s in sizes
                               for df, r in evaluate_traced(graph, s, decoder,
                                                            "scalesim").items()}
            plot_res.update({(s, df, "scalesim"): r for (s, df), r in traced_ref[net].items()})
        _plot(out / f"dataflows_{net}.png", net, plot_res, mapping)
    body = tables(all_res) + "\n" + traced_tables(traced, titles, mapping, traced_ref)
    if not (args.small or args.skip_ppocr):
        body += "\n" + ppocr_tables()
    print(body)
    md = out / "dataflows.md"
    text = md.read_text() if md.exists() else f"# Dataflow comparison\n\n{BEGIN}\n{END}\n"
    head, rest = text.split(BEGIN, 1)
    tail = rest.split(END, 1)[1]
    atomic_write_text(md, f"{head}{BEGIN}\n{body}\n{END}{tail}")


if __name__ == "__main__":
    main()

"""Across layers on real models: fusion gains, multi-core pipelining, two models on one NPU.

Usage:  python experiments/scheduling/main.py [--out scheduling_tables.md]
                                              [--plots scheduling_plots]

(``docs/results/scheduling.md`` was made with ``--plots docs/results``, which replaces the
committed PNGs; the default writes them to a folder of their own.)

Models: the PP-OCR detector (1x3x640x640) and direction classifier (1x3x48x192) from the zoo,
and the ResNet-style CNN of the precision-search experiment (stem + two residual blocks, width
32, on 28x28 MNIST-5k images; random weights: latency does not depend on them). Writes the
Markdown tables and two plots (``scheduling_fusion.png``, ``scheduling_pipeline.png``).
"""

from __future__ import annotations

import argparse
import datetime
import time
from pathlib import Path

import jax
import jax.numpy as jnp
from flax import nnx

from npujax._atomic import atomic_write_text
from npujax.frontends.flax import trace_flax
from npujax.hw import list_presets, load_npu_spec
from npujax.ir.passes import optimize
from npujax.models.cnn import SmallResNet
from npujax.models.zoo import fetch_model
from npujax.plan import core_schedules, lower, lower_models
from npujax.workflows.lowering import import_onnx_for_lowering

LEVELS = ("elementwise", "residual", "layer")


def models() -> dict:
    with jax.numpy_dtype_promotion("standard"):
        g, p = trace_flax(SmallResNet(rngs=nnx.Rngs(0), in_shape=(28, 28, 1), width=32),
                          jnp.zeros((1, 28, 28, 1), jnp.float32))
    return {
        "mnist-resnet": optimize(g, p)[0],
        "ppocr_cls": import_onnx_for_lowering(fetch_model("ppocr_cls"), {"x": (1, 3, 48, 192)},
                                              None),
        "ppocr_det": import_onnx_for_lowering(fetch_model("ppocr_det"),
                                              {"x": (1, 3, 640, 640)}, None),
    }


def fusion_table(graphs: dict) -> tuple[list[str], dict]:
    lines = ["| model | preset | declared | latency µs: elementwise / residual / layer | "
             "DRAM MB: elementwise / residual / layer | layer vs elementwise | on chip | "
             "depth-first |", "|---|---|---|---|---|---|---|---|"]
    data: dict = {}
    for name, g in graphs.items():
        for preset in list_presets():
            spec = load_npu_spec(preset)
            s = {lv: lower(g, spec, fusion=lv) for lv in LEVELS}
            data[(name, preset)] = s
            lay = s["layer"]
            n = len(lay.edges)
            lines.append(
                f"| {name} | {preset} | {spec.ops.fusion} | "
                + " / ".join(f"{s[lv].latency_s * 1e6:,.1f}" for lv in LEVELS) + " | "
                + " / ".join(f"{s[lv].dram_bytes / 1e6:,.2f}" for lv in LEVELS) + " | "
                + f"{s['elementwise'].latency_s / lay.latency_s:.2f}x faster, "
                f"{1 - lay.dram_bytes / s['elementwise'].dram_bytes:.0%} less DRAM | "
                f"{sum(e.placement == 'sram' for e in lay.edges)}/{n} | "
                f"{sum(e.placement == 'depth_first' for e in lay.edges)}/{n} |")
    return lines, data


def pipeline_table(graphs: dict) -> tuple[list[str], dict]:
    lines = ["| model | fusion | cores | core link | layer-split latency µs | layer-split inf/s | "
             "pipeline latency µs | pipeline inf/s | stages | better for throughput |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    data: dict = {}
    base = load_npu_spec("edge_16x16")
    for name in ("ppocr_cls", "ppocr_det"):
        for fusion in ("elementwise", "layer"):
            for cores in (2, 4):
                for link in (0.0, 32e9):
                    spec = base.with_fields({"array.cores": cores,
                                             "memory.core_link_bytes_per_s": link})
                    cs = core_schedules(graphs[name], spec, fusion=fusion)
                    sp, pp = cs["layer_split"], cs["pipeline"]
                    data[(name, fusion, cores, link)] = cs
                    better = "pipeline" if pp.period_s < sp.period_s else "layer_split"
                    lines.append(
                        f"| {name} | {fusion} | {cores} | "
                        f"{'DRAM' if not link else f'{link / 1e9:g} GB/s'} | "
                        f"{sp.latency_s * 1e6:,.0f} | {sp.throughput_per_s:,.1f} | "
                        f"{pp.latency_s * 1e6:,.0f} | {pp.throughput_per_s:,.1f} | "
                        f"{' + '.join(str(len(s)) for s in pp.stages)} | {better} |")
    return lines, data


def coresidency_table(graphs: dict) -> list[str]:
    lines = ["| preset | cores | fusion | sharing | model | alone µs | together µs | slowdown | "
             "cores used | DRAM GB/s | weights | fits |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    pair = {"det": graphs["ppocr_det"], "cls": graphs["ppocr_cls"]}
    cases = [("edge_16x16", 2, "elementwise"), ("edge_16x16", 2, "layer"),
             ("edge_16x16", 4, "layer"), ("tpu_v1", 2, "layer")]
    for preset, cores, fusion in cases:
        spec = load_npu_spec(preset).with_fields({"array.cores": cores})
        for sharing in ("time_multiplexed", "core_partitioned"):
            co = lower_models(pair, spec, sharing=sharing, fusion=fusion)
            for m in co.models:
                lines.append(f"| {preset} | {cores} | {fusion} | {sharing} | {m.name} | "
                             f"{m.alone_s * 1e6:,.1f} | {m.together_s * 1e6:,.1f} | "
                             f"{m.slowdown:.2f}x | {m.cores} | {m.dram_bytes_per_s / 1e9:.2f} | "
                             f"{m.weights} | {'yes' if m.fits else 'no'} |")
    # a DRAM too small for both models' weights: tpu_v1 with 8 MB
    spec = load_npu_spec("tpu_v1").with_fields({"memory.dram_bytes": 8e6})
    co = lower_models(pair, spec)
    for m in co.models:
        lines.append(f"| tpu_v1, 8 MB DRAM | 1 | layer | time_multiplexed | {m.name} | "
                     f"{m.alone_s * 1e6:,.1f} | {m.together_s * 1e6:,.1f} | {m.slowdown:.2f}x | "
                     f"{m.cores} | {m.dram_bytes_per_s / 1e9:.2f} | {m.weights} "
                     f"(swap {m.swap_s * 1e6:,.0f} µs) | {'yes' if m.fits else 'no'} |")
    for m in co.models:
        lines.append(f"<!-- 8 MB: {m.name} DRAM activation peak "
                     f"{m.memory.dram_activation_peak_bytes / 1e6:,.2f} MB, weights "
                     f"{m.memory.weight_bytes / 1e6:,.2f} MB -->")
    return lines


def plots(fusion: dict, pipe: dict, folder: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")  # a script, not the library: it may pick its backend
    import matplotlib.pyplot as plt
    import numpy as np

    presets = list_presets()
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    for ax, what, label in ((axes[0], "latency_s", "latency (ms)"),
                            (axes[1], "dram_bytes", "DRAM traffic (MB)")):
        x = np.arange(len(presets))
        for k, lv in enumerate(LEVELS):
            vals = [getattr(fusion[("ppocr_det", p)][lv], what) * (1e3 if what == "latency_s"
                                                                    else 1e-6) for p in presets]
            ax.bar(x + (k - 1) * 0.27, vals, 0.27, label=lv)
        ax.set_xticks(x, presets, rotation=20, fontsize=8)
        ax.set_ylabel(label)
        ax.set_yscale("log")
    axes[0].legend(title="fusion", fontsize=8)
    fig.suptitle("PP-OCR detector (1x3x640x640) per preset and fusion level")
    fig.tight_layout()
    fig.savefig(folder / "scheduling_fusion.png", dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(6.5, 3.8))
    for fusion in ("elementwise", "layer"):
        for kind, style in (("layer_split", "o-"), ("pipeline", "s--")):
            ys = [pipe[("ppocr_cls", fusion, c, 32e9)][kind].throughput_per_s for c in (2, 4)]
            ax.plot([2, 4], ys, style, label=f"{kind}, {fusion} fusion")
    ax.set_xlabel("cores (edge_16x16, 32 GB/s core link)")
    ax.set_ylabel("PP-OCR classifier inferences/s")
    ax.set_xticks([2, 4])
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(folder / "scheduling_pipeline.png", dpi=110)
    plt.close(fig)
    return ["scheduling_fusion.png", "scheduling_pipeline.png"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="scheduling_tables.md")
    ap.add_argument("--plots", default="scheduling_plots",
                    help="folder for the PNGs (created; default scheduling_plots)")
    args = ap.parse_args()
    t0 = time.perf_counter()
    graphs = models()
    f_lines, f_data = fusion_table(graphs)
    p_lines, p_data = pipeline_table(graphs)
    c_lines = coresidency_table(graphs)
    Path(args.plots).mkdir(parents=True, exist_ok=True)
    names = plots(f_data, p_data, Path(args.plots))
    text = "\n".join([
        "<!-- generated by experiments/scheduling/main.py on "
        f"{datetime.date.today().isoformat()} in {time.perf_counter() - t0:.0f} s -->",
        "", "### Fusion levels on every preset (INT8)", "", *f_lines,
        "", "### Layer-split vs pipelined on edge_16x16 with more cores", "", *p_lines,
        "", "### PP-OCR detector + classifier sharing one NPU", "", *c_lines, ""])
    atomic_write_text(args.out, text)
    print(text)
    print("wrote", args.out, *names)


if __name__ == "__main__":
    main()

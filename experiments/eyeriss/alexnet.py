"""npujax's row-stationary model vs the Eyeriss chip on AlexNet's five CONV layers (batch 4).

Usage:
    PYTHONPATH=. python experiments/eyeriss/alexnet.py [--out docs/results]
        [--zigzag docs/results/row_stationary_zigzag.json]

Each CONV layer of AlexNet (Krizhevsky et al., NIPS 2012: the original two-group CONV2, CONV4 and
CONV5, 227 x 227 input) is one single-Conv ONNX model at batch N = 4, lowered by
:func:`npujax.lower` on the ``eyeriss`` preset (``configs/npu/eyeriss.toml``) at 16-bit weights
and activations, the chip's fixed-point width. The reference is the per-layer table of Chen et
al., JSSC 2017 (AlexNet CONV layers at 200 MHz, batch 4): processing latency, active PEs, GLB
("buffer") accesses and DRAM accesses in MB. Prints the table, writes ``row_stationary.json`` and
``row_stationary_alexnet.png`` into ``--out``; the prose is in docs/results/row_stationary.md.
"""

from __future__ import annotations

import argparse
import io
import json
import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from npujax._atomic import atomic_write_bytes, atomic_write_text
from npujax.frontends.onnx import from_onnx
from npujax.hw import load_npu_spec
from npujax.ir.passes import optimize
from npujax.plan import lower
from npujax.quantize import quant_spec
from npujax.systolic import rs_conv

#: AlexNet's CONV layers: (name, C_in, H_in (padded input is H_in + 2 pad), M, kernel, stride,
#: pad, groups).
LAYERS = (
    ("CONV1", 3, 227, 96, 11, 4, 0, 1),
    ("CONV2", 96, 27, 256, 5, 1, 2, 2),
    ("CONV3", 256, 13, 384, 3, 1, 1, 1),
    ("CONV4", 384, 13, 384, 3, 1, 1, 2),
    ("CONV5", 384, 13, 256, 3, 1, 1, 2),
)
BATCH = 4

#: Chen et al., JSSC 2017, the table of AlexNet CONV layers on Eyeriss at 200 MHz, 1 V, batch 4:
#: processing latency (ms), active PEs (of 168), global-buffer accesses (MB) and DRAM accesses
#: (MB, read + written, after run-length compression); totals 115.3 ms (34.7 frames/s), 208.5 MB
#: and 15.4 MB (0.0029 DRAM accesses per MAC, as the abstract states).
PAPER = {
    "CONV1": dict(latency_ms=20.9, active_pes=154, glb_mb=18.5, dram_mb=5.0, mmacs=422),
    "CONV2": dict(latency_ms=41.9, active_pes=135, glb_mb=77.6, dram_mb=4.0, mmacs=896),
    "CONV3": dict(latency_ms=23.6, active_pes=156, glb_mb=50.2, dram_mb=3.0, mmacs=598),
    "CONV4": dict(latency_ms=18.4, active_pes=156, glb_mb=37.4, dram_mb=2.1, mmacs=449),
    "CONV5": dict(latency_ms=10.5, active_pes=156, glb_mb=24.9, dram_mb=1.3, mmacs=299),
}


def conv_model(cin: int, hw: int, cout: int, k: int, s: int, pad: int, groups: int
               ) -> onnx.ModelProto:
    """One Conv (no bias) with a constant weight, batch :data:`BATCH`, NCHW."""
    w = np.random.default_rng(0).normal(0, 0.1, (cout, cin // groups, k, k)).astype(np.float32)
    node = helper.make_node("Conv", ["x", "w"], ["y"], name="conv", kernel_shape=[k, k],
                            pads=[pad] * 4, strides=[s, s], group=groups)
    g = helper.make_graph([node], "conv",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                         [BATCH, cin, hw, hw])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                          [numpy_helper.from_array(w, "w")])
    return onnx.shape_inference.infer_shapes(
        helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]))


def run(npu: str = "eyeriss") -> list[dict]:
    """Lower every layer on ``npu`` and return one row per layer (npujax and the paper)."""
    spec = load_npu_spec(npu)
    a = spec.array
    rows = []
    for name, cin, hw, cout, k, s, pad, groups in LAYERS:
        graph = optimize(*from_onnx(conv_model(cin, hw, cout, k, s, pad, groups)))[0]
        sched = lower(graph, spec, quant_spec(graph, 16, 16))
        conv = [r for r in sched.layers if r.op == "Conv"][0]
        e = (hw + 2 * pad - k) // s + 1
        m = rs_conv(BATCH, cin // groups, cout // groups, k, k, e, e, a.rows, a.cols,
                    ifmap_spad=a.ifmap_spad_words, filter_spad=a.filter_spad_words,
                    psum_spad=a.psum_spad_words, stride=s)
        glb_words = groups * sum(float(m[f]) for f in ("glb_reads_ifmap", "glb_reads_filter",
                                                       "glb_reads_psum", "glb_writes_psum"))
        p = PAPER[name]
        rows.append(dict(
            layer=name, macs_m=conv.macs / 1e6, paper_mmacs=p["mmacs"],
            compute_ms=conv.costs.compute_cycles / a.clock_hz * 1e3,
            latency_ms=conv.latency_s * 1e3, paper_latency_ms=p["latency_ms"],
            active_pes=int(m["active_pes"]), paper_active_pes=p["active_pes"],
            p=int(m["p"]), q=int(m["q"]), utilization=conv.costs.utilization,
            glb_mb=glb_words * 2 / 1e6, paper_glb_mb=p["glb_mb"],
            dram_mb=conv.costs.dram_bytes / 1e6, paper_dram_mb=p["dram_mb"], bound=conv.bound))
    return rows


def table(rows: list[dict]) -> str:
    """The Markdown comparison table (errors relative to the paper)."""
    err = lambda x, y: f"{100 * (x / y - 1):+.0f}%"  # noqa: E731
    out = ["| layer | MACs (M) | latency npujax (ms) | paper (ms) | error | DRAM npujax (MB) | "
           "paper (MB) | error | GLB npujax (MB) | paper (MB) | active PEs npujax / paper | "
           "p, q | bound |",
           "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|"]
    for r in rows:
        out.append(
            f"| {r['layer']} | {r['macs_m']:.0f} | {r['latency_ms']:.1f} | "
            f"{r['paper_latency_ms']} | {err(r['latency_ms'], r['paper_latency_ms'])} | "
            f"{r['dram_mb']:.2f} | {r['paper_dram_mb']} | {err(r['dram_mb'], r['paper_dram_mb'])} "
            f"| {r['glb_mb']:.1f} | {r['paper_glb_mb']} | {r['active_pes']} / "
            f"{r['paper_active_pes']} | {r['p']}, {r['q']} | {r['bound']} |")
    tot = {k: sum(r[k] for r in rows) for k in ("latency_ms", "paper_latency_ms", "dram_mb",
                                                 "paper_dram_mb", "glb_mb", "paper_glb_mb",
                                                 "macs_m")}
    out.append(f"| total | {tot['macs_m']:.0f} | {tot['latency_ms']:.1f} | "
               f"{tot['paper_latency_ms']:.1f} | {err(tot['latency_ms'], tot['paper_latency_ms'])}"
               f" | {tot['dram_mb']:.2f} | {tot['paper_dram_mb']:.1f} | "
               f"{err(tot['dram_mb'], tot['paper_dram_mb'])} | {tot['glb_mb']:.1f} | "
               f"{tot['paper_glb_mb']:.1f} | | | |")
    return "\n".join(out)


def plot(rows: list[dict], zigzag: list[dict] | None = None) -> bytes:
    """Latency and DRAM traffic per layer, npujax vs the chip (matplotlib object API)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(9, 3.6))
    x = np.arange(len(rows))
    for ax, (ours, paper, label) in zip(fig.subplots(1, 2), (
            ("latency_ms", "paper_latency_ms", "latency per batch of 4 (ms)"),
            ("dram_mb", "paper_dram_mb", "DRAM traffic (MB)"))):
        w = 0.27 if zigzag else 0.4
        ax.bar(x - w / 2 if not zigzag else x - w, [r[ours] for r in rows], w,
               label="npujax (row_stationary)")
        ax.bar(x + w / 2 if not zigzag else x, [r[paper] for r in rows], w,
               label="Eyeriss chip (JSSC 2017)")
        if zigzag and ours == "latency_ms":
            ax.bar(x + w, [z["latency_ms_200MHz"] for z in zigzag], w,
                   label="ZigZag, eyeriss_like (RS unrolling)")
        ax.set_xticks(x, [r["layer"] for r in rows])
        ax.set_ylabel(label)
        ax.grid(axis="y", alpha=0.3)
    fig.axes[0].legend(fontsize=8)
    fig.suptitle("AlexNet CONV layers on Eyeriss (12x14 PEs, 200 MHz, batch 4)")
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    return buf.getvalue()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("docs/results"))
    ap.add_argument("--zigzag", type=Path, default=None,
                    help="JSON of experiments/eyeriss/zigzag_alexnet.py (ZigZag bars in the plot)")
    args = ap.parse_args(argv)
    rows = run()
    text = table(rows)
    print(text)
    zz = json.loads(args.zigzag.read_text()) if args.zigzag else None
    png = plot(rows, zz)  # everything computed before anything is written
    args.out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(args.out / "row_stationary.json", json.dumps(rows, indent=1) + "\n")
    atomic_write_bytes(args.out / "row_stationary_alexnet.png", png)
    return 0


if __name__ == "__main__":
    sys.exit(main())

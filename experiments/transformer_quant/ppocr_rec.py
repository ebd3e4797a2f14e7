"""PP-OCRv4 text recogniser (a real pretrained conv + transformer model) through npujax.

Usage: python experiments/transformer_quant/ppocr_rec.py [--width 320] [--lines 6]
       [--calib 4] [--observer minmax]

Fetches ``zoo:ppocr_rec`` (``ch_PP-OCRv4_rec_infer.onnx`` from ``rapidocr-onnxruntime==1.4.4``),
imports it strictly (``unsupported="error"``: no CPU-fallback node) at ``[1, 3, 48, width]``,
and prints the markdown of the PP-OCRv4 rec section of docs/results/transformers.md:

1. float: npujax vs onnxruntime on rendered text lines, each fitted into the 48 x width crop as a
   detected line is (max abs error / max |reference|, per-timestep argmax agreement, and the
   lines read by CTC greedy decoding with the model's own character list);
2. graph: LayerNorms fused to single ops, operators left from the decomposed pattern;
3. lowering on edge_transformer_16x16 and datacenter_128x128: latency, CPU-fallback layers, and
   the per-operator-class breakdown;
4. W8A8 (every Conv/Gemm, attention's two-activation MatMuls with both operands on static
   calibrated grids and the softmax output on its fixed [0, 1] grid): min-max calibration on a
   few lines, then per-timestep argmax agreement of fake-quant with float, and of onnxruntime
   running the QDQ export with fake-quant (like-for-like export: float biases and no output
   requantization; and the integer-deployment export: int32 biases, requantized outputs).
"""

from __future__ import annotations

import argparse
import collections
import time

import jax
import numpy as np
import onnx
import onnxruntime as ort

from npujax.backends.onnx_export import to_onnx
from npujax.data.images import text_images
from npujax.frontends.onnx import from_onnx
from npujax.ir.execute import execute
from npujax.ir.passes import optimize
from npujax.models.zoo import fetch_model
from npujax.plan import lower
from npujax.quantize.calibrate import calibrate
from npujax.quantize.spec import quant_spec

PRESETS = ("edge_transformer_16x16", "datacenter_128x128")


def ort_run(model: str | bytes, x: np.ndarray, optimized: bool = True) -> np.ndarray:
    """onnxruntime (CPU) on each example of ``x`` in turn (the model has a fixed batch of 1)."""
    opts = ort.SessionOptions()
    if not optimized:
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(model, opts, providers=["CPUExecutionProvider"])
    return np.concatenate([sess.run(None, {"x": xi[None]})[0] for xi in x])


def agree(a: np.ndarray, b: np.ndarray) -> str:
    """Per-timestep argmax agreement of two ``[n, T, classes]`` outputs, as 'k/N (p %)'."""
    eq = a.argmax(-1) == b.argmax(-1)
    return f"{int(eq.sum())}/{eq.size} ({100 * eq.mean():.2f} %)"


def ctc_greedy(y: np.ndarray, charset: list[str]) -> list[str]:
    """PaddleOCR's CTC greedy decoding of ``[n, T, classes]`` probabilities: argmax per
    timestep, repeats collapsed, blanks (class 0) dropped; class ``i`` is ``charset[i - 1]`` (the
    model's ``character`` metadata, then a space)."""
    out = []
    for seq in y.argmax(-1):
        keep = [int(c) for i, c in enumerate(seq) if c != 0 and (i == 0 or c != seq[i - 1])]
        out.append("".join(charset[c - 1] for c in keep))
    return out


def same_text(a: list[str], b: list[str]) -> str:
    """Lines read identically, as 'k/N'."""
    return f"{sum(u == v for u, v in zip(a, b))}/{len(a)}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--width", type=int, default=320)
    ap.add_argument("--lines", type=int, default=6, help="test lines (rendered text)")
    ap.add_argument("--calib", type=int, default=4, help="calibration lines")
    ap.add_argument("--observer", default="minmax", help="calibration observer")
    a = ap.parse_args()
    path = str(fetch_model("ppocr_rec"))
    t = time.time()
    raw, raw_params = from_onnx(path, {"x": (1, 3, 48, a.width)})  # strict: unsupported="error"
    t_import = time.time() - t
    graph, params = optimize(raw, raw_params)
    ops = collections.Counter(n.op for n in graph.nodes)
    left = {op: ops[op] for op in ("ReduceMean", "Pow", "Sqrt", "Erf", "CpuFallback")}
    print(f"imported in {t_import:.1f} s: {len(raw.nodes)} nodes ({len(graph.nodes)} after "
          f"optimize), LayerNormalization {ops['LayerNormalization']}, left of the decomposed "
          f"patterns: {left}\n")

    meta = {p.key: p.value for p in onnx.load(path).metadata_props}
    charset = meta["character"].splitlines() + [" "]
    x = text_images(48, a.width, a.lines, seed=11, fit=True)
    ref = ort_run(path, x)
    y = np.asarray(jax.jit(lambda p, x: execute(graph, p, x))(params, x))
    rel = np.abs(y - ref).max(axis=(1, 2)) / np.abs(ref).max(axis=(1, 2))
    big = np.abs(ref) > 1e-3
    elem = (np.abs(y - ref)[big] / np.abs(ref)[big]).max()
    print("| check | value |\n|---|---|")
    print(f"| float vs onnxruntime, max abs error / max abs output, worst of {a.lines} lines "
          f"(1x3x48x{a.width}) | {rel.max():.2e} |")
    print(f"| float vs onnxruntime, max elementwise relative error where p > 1e-3 | {elem:.2e} |")
    print(f"| float vs onnxruntime, argmax per timestep | {agree(y, ref)} |")
    text = ctc_greedy(y, charset)
    print(f"| float vs onnxruntime, lines read identically (CTC greedy) | "
          f"{same_text(text, ctc_greedy(ref, charset))} |")

    q = quant_spec(graph)
    xc = text_images(48, a.width, a.calib, seed=3, fit=True)
    t = time.time()
    qstate = calibrate(graph, params, [xc], q, observer=a.observer)
    yq = np.asarray(jax.jit(lambda p, x: execute(graph, p, x, quant=q, qstate=qstate))(params, x))
    t_q = time.time() - t
    kinds = collections.Counter(graph.node(n).op for n in q)
    print(f"| W8A8 layers | {len(q)} ({', '.join(f'{k} {v}' for k, v in kinds.items())}) |")
    print(f"| W8A8 fake-quant vs float, argmax per timestep | {agree(yq, y)} |")
    qtext = ctc_greedy(yq, charset)
    print(f"| W8A8 fake-quant vs float, lines read identically | {same_text(qtext, text)} |")
    for label, kw in (("like-for-like QDQ (float bias, no output requant)",
                       dict(int32_bias=False, requantize_outputs=False)),
                      ("deployment QDQ (int32 bias, requantized outputs)", {})):
        model = to_onnx(graph, params, q, qstate, **kw).SerializeToString()
        for optimized in (True, False):
            yo = ort_run(model, x, optimized)
            top2 = np.sort(yq, axis=-1)[..., -2:]
            margin = (top2[..., 1] - top2[..., 0])[yo.argmax(-1) != yq.argmax(-1)]
            worst = f"; fake-quant top-2 margin there <= {margin.max():.2f}" if margin.size else ""
            print(f"| onnxruntime {label}, {'default' if optimized else 'no'} graph "
                  f"optimizations, vs fake-quant: argmax per timestep; lines read identically | "
                  f"{agree(yo, yq)}{worst}; {same_text(ctc_greedy(yo, charset), qtext)} |")
    print(f"\n<!-- calibration ({a.observer}) on {a.calib} lines + fake-quant run: {t_q:.0f} s -->")
    for label, lines in (("onnxruntime float", ctc_greedy(ref, charset)), ("npujax W8A8", qtext)):
        print(f"<!-- {label} reads: {lines} -->")
    print()

    for preset in PRESETS:
        s = lower(graph, preset, q)
        cpu = sum(r.device != "npu" for r in s.layers)
        print(f"### {preset}: {s.latency_s * 1e3:.3f} ms W8A8, {s.macs / 1e6:.1f} MMACs, "
              f"{len(s.layers)} layers, {cpu} CPU-fallback layers\n")
        print("| operator | layers | on | latency ms | share |\n|---|---|---|---|---|")
        by: dict[tuple[str, str], list[float]] = collections.defaultdict(lambda: [0, 0.0])
        for r in s.layers:
            by[(r.op, r.device)][0] += 1
            by[(r.op, r.device)][1] += r.latency_s
        for (op, dev), (n, lat) in sorted(by.items(), key=lambda kv: -kv[1][1]):
            print(f"| {op} | {int(n)} | {dev} | {lat * 1e3:.4f} | {lat / s.latency_s:.1%} |")
        print()


if __name__ == "__main__":
    main()

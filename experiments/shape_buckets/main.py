"""Shape buckets for the PP-OCRv4 text recogniser (input 1x3x48xW, W the text line's width):
expected latency per inference against the number of buckets, for several compile times.

Run: PYTHONPATH=. python3 experiments/shape_buckets/main.py \
         --model ~/.cache/npujax/ch_PP-OCRv4_rec_infer.onnx --out docs/results
Writes realities_shape_buckets.png and realities_shape_buckets.json.

The width distribution is assumed (text lines of a document page, most short); the compile
times are assumed too (a reload of a compiled model of the order of 0.1-10 s).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from npujax.hw.spec import load_npu_spec  # noqa: E402
from npujax.workflows.lowering import import_onnx_for_lowering  # noqa: E402
from npujax.workflows.shape_buckets import shape_bucket_report, shape_costs  # noqa: E402

WIDTHS = {80: 6, 120: 5, 160: 4, 200: 3, 240: 3, 320: 2, 400: 1, 480: 1, 640: 1}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--npu", default="edge_16x16")
    ap.add_argument("--out", default="docs/results")
    args = ap.parse_args()
    spec = load_npu_spec(args.npu)
    total = sum(WIDTHS.values())
    dist = [((48, w), c / total) for w, c in WIDTHS.items()]
    costs = shape_costs(lambda s: import_onnx_for_lowering(args.model, s, None),
                        {"x": (1, 3, 48, 320)}, dist, spec, lambda g: None)
    ks = list(range(1, len(WIDTHS) + 1))
    fig, ax = plt.subplots(figsize=(6.5, 4))
    reports = {}
    for compile_s in (0.0, 0.5, 2.0, 10.0):
        rep = shape_bucket_report(costs, ks, compile_s, 1000)
        reports[str(compile_s)] = rep
        ax.plot(ks, [p["total_s"] * 1e3 for p in rep["plans"]], marker="o",
                label=f"compile {compile_s:g} s / 1000 inferences")
        best = rep["recommended"]
        print(compile_s, "recommended", best["buckets"], f"{best['total_s'] * 1e3:.2f} ms",
              "reload on change", f"{rep['reload_on_change_s'] * 1e3:.1f} ms")
    ax.set_xlabel("buckets k (k = 9: recompile per shape)")
    ax.set_ylabel("expected time per inference (ms)")
    ax.set_title(f"PP-OCRv4 recogniser, 48xW text lines, {spec.name}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    fig.savefig(out / "realities_shape_buckets.png", dpi=120)
    (out / "realities_shape_buckets.json").write_text(json.dumps(reports, indent=1))


if __name__ == "__main__":
    main()

"""Rewrite or fall back: per rule, a conv -> op -> conv chain lowered with the op on the host
and rewritten, on edge_16x16 restricted to conv_max_kernel = 3 and without the op, with the
host fallback per operator and as one rest-of-graph partition (the Coral compiler's).

Second, a real model: the PP-OCRv4 text recogniser (1x3x48x320) on the Coral Dev Board preset,
whose HardSigmoid and LayerNormalization the Edge TPU does not run (its compiler's one
partition then sends the rest of the graph to the Cortex-A53 host): the whole graph's latency
after each per-layer decision.

Run: PYTHONPATH=. python3 experiments/rewrites/main.py \
         --rec ~/.cache/npujax/ch_PP-OCRv4_rec_infer.onnx --out docs/results
Writes realities_rewrites.png and realities_rewrites.json.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import npujax  # noqa: E402
from npujax.frontends.onnx import from_onnx  # noqa: E402
from npujax.hw.spec import load_npu_spec  # noqa: E402

SUPPORTED = ["Conv", "Gemm", "Add", "Mul", "Max", "Min", "Relu", "Sigmoid", "Clip"]
C, HW = 32, 56


def chain(kind: str):
    rng = np.random.default_rng(0)
    w = lambda k: numpy_helper.from_array(  # noqa: E731
        rng.normal(size=(C, C, k, k)).astype(np.float32), f"w{k}")
    nodes, inits, mid = [], [w(3)], "a"
    if kind == "LeakyRelu":
        nodes = [helper.make_node("LeakyRelu", ["a"], ["b"], alpha=0.1)]
    elif kind == "Conv 7x7":
        nodes = [helper.make_node("Conv", ["a", "w7"], ["b"], pads=[3] * 4)]
        inits.append(w(7))
    elif kind == "AveragePool":
        nodes = [helper.make_node("AveragePool", ["a"], ["b"], kernel_shape=[3, 3],
                                  pads=[1] * 4, count_include_pad=0)]
    elif kind == "Gelu (tanh)":
        nodes = [helper.make_node("Gelu", ["a"], ["b"], approximate="tanh")]
    g = helper.make_graph(
        [helper.make_node("Conv", ["x", "w3"], [mid], pads=[1] * 4), *nodes,
         helper.make_node("Conv", ["b", "w3"], ["y"], pads=[1] * 4)], "chain",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, C, HW, HW])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, C, HW, HW])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 20)])
    return from_onnx(m)[0]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="docs/results")
    ap.add_argument("--rec", required=True, help="ch_PP-OCRv4_rec_infer.onnx")
    args = ap.parse_args()
    out = Path(args.out)
    base = load_npu_spec("edge_16x16").with_fields(
        {"ops.supported": SUPPORTED, "ops.conv_max_kernel": 3})
    kinds = ["LeakyRelu", "Conv 7x7", "AveragePool", "Gelu (tanh)"]
    rows = []
    for scope in ("per_op", "rest_of_graph"):
        for kind in kinds:
            g = chain(kind)
            res = {}
            for policy in ("fallback", "rewrite_or_fallback"):
                s = npujax.lower(g, base.with_fields({"ops.fallback": scope,
                                                      "ops.unsupported": policy}))
                res[policy] = s
            choice = res["rewrite_or_fallback"].rewrites[0]
            rows.append({"scope": scope, "op": kind,
                         "fallback_us": res["fallback"].latency_s * 1e6,
                         "chosen_us": res["rewrite_or_fallback"].latency_s * 1e6,
                         "choice": choice.choice, "rule": choice.rule, "why": choice.reason})
            print(rows[-1])
    from npujax.workflows.lowering import import_onnx_for_lowering

    rec = import_onnx_for_lowering(args.rec, {"x": (1, 3, 48, 320)}, None)
    coral = load_npu_spec("coral_devboard")
    fb = npujax.lower(rec, coral)
    rw = npujax.lower(rec, coral.with_fields({"ops.unsupported": "rewrite_or_fallback"}))
    steps = [{"layer": c.node, "op": c.op, "rule": c.rule, "choice": c.choice,
              "fallback_us": c.fallback_s * 1e6,
              "rewrite_us": None if c.rewrite_s is None else c.rewrite_s * 1e6}
             for c in rw.rewrites]
    real = {"model": "PP-OCRv4 rec 1x3x48x320", "npu": coral.name,
            "fallback_us": fb.latency_s * 1e6, "chosen_us": rw.latency_s * 1e6,
            "cpu_layers_fallback": sum(r.device == "cpu" for r in fb.layers),
            "cpu_layers_chosen": sum(r.device == "cpu" for r in rw.layers), "steps": steps}
    print({k: v for k, v in real.items() if k != "steps"})
    fig, axes = plt.subplots(1, 3, figsize=(15, 3.9),
                             gridspec_kw={"width_ratios": [1, 1, 1.1]})
    axes[1].sharey(axes[0])
    ax = axes[2]
    ys = [fb.latency_s * 1e3] + [(s["rewrite_us"] if s["choice"] == "rewrite"
                                  else s["fallback_us"]) / 1e3 for s in steps]
    ax.plot(range(len(ys)), ys, marker="o")
    abbr = {"HardSigmoid": "HardSig", "LayerNormalization": "LN"}
    ax.set_xticks(range(len(ys)), ["fallback"] + [
        f"{abbr.get(s['op'], s['op'])} {s['layer'].split('.')[-1]}" for s in steps],
        fontsize=8, rotation=35, ha="right")
    ax.set_xlabel("after the decision for layer ...", fontsize=8)
    ax.set_ylabel("whole-model latency (ms)")
    ax.set_title(f"PP-OCRv4 rec on {coral.name}: after each rewrite", fontsize=9)
    for ax, scope in zip(axes[:2], ("per_op", "rest_of_graph")):
        r = [x for x in rows if x["scope"] == scope]
        i = np.arange(len(r))
        ax.bar(i - 0.2, [x["fallback_us"] for x in r], 0.4, label="host fallback")
        ax.bar(i + 0.2, [x["chosen_us"] for x in r], 0.4, label="rewrite or fallback (chosen)")
        ax.set_xticks(i, [x["op"] for x in r], rotation=15)
        ax.set_yscale("log")
        ax.set_title(f"ops.fallback = {scope}")
        ax.set_ylabel("latency of conv → op → conv (µs)")
    axes[0].legend(fontsize=8)
    fig.suptitle(f"left: conv → op → conv on edge_16x16 with conv_max_kernel = 3 and without "
                 f"the op ({C} ch, {HW}x{HW}); right: a real model")
    fig.tight_layout()
    out.mkdir(parents=True, exist_ok=True)
    fig.savefig(out / "realities_rewrites.png", dpi=120)
    (out / "realities_rewrites.json").write_text(json.dumps({"chains": rows, "ppocr_rec": real},
                                                            indent=1))


if __name__ == "__main__":
    main()

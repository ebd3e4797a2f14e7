"""The four PTQ methods of npujax.quantize.methods on small models: one figure, one JSON.

Usage: python experiments/ptq_methods/main.py [--out docs/results] [--adaround-iterations 2000]

* CLE: per-tensor weights (W8/W6/W4, A8), output SQNR before and after cross-layer
  equalization on the tests' MobileNet block with deliberately unbalanced channels (the figure)
  and accuracy and logit SQNR on the demo's digits CNN (the JSON);
* AdaRound: the digits CNN at W4A8 (per-channel weights), per-layer SQNR (whole model
  quantized) and accuracy, rounding to nearest vs AdaRound;
* SmoothQuant: a pre-norm transformer MLP block with three outlier channels in its LayerNorm
  output (as LLM activations have), W8A8 output SQNR vs the migration strength alpha;
* GPTQ: the digits CNN's dense layers, weight-only int4 and int3 (groups of 128), layer
  output SQNR and accuracy, round-to-nearest vs GPTQ.

Writes <out>/ptq_methods.png and <out>/ptq_methods.json (atomically).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import time
from pathlib import Path

import jax
import numpy as np
from flax import nnx
from matplotlib.figure import Figure

from npujax._atomic import atomic_write_bytes, atomic_write_text
from npujax.data.datasets import load_digits_nhwc
from npujax.frontends.flax import trace_flax
from npujax.ir.execute import execute, tap
from npujax.ir.passes import optimize
from npujax.models.cnn import DigitsCNN
from npujax.models.train import train_float
from npujax.quantize.calibrate import calibrate
from npujax.quantize.methods import PTQ_METHODS
from npujax.quantize.quantizers import STE
from npujax.quantize.spec import quant_spec
from npujax.quantize.train import evaluate

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))
from tests.quantize.ptq_graphs import mlp_block, separable_net  # noqa: E402


def _sqnr(ref: np.ndarray, y: np.ndarray) -> float:
    return 10 * math.log10(float(np.sum(ref ** 2)) / float(np.sum((y - ref) ** 2)))


def _layer_sqnr(graph, params, qparams, quant, qstate, x):
    """Per-layer output SQNR (dB) of the quantized model (``qparams``: AdaRound's rounded
    kernels) against the float model with the original ``params``. (``layer_sqnr`` compares
    both runs on one set of params, which after AdaRound are already rounded.)"""
    names = list(quant)
    _, ft = execute(graph, params, x, observe=tap(names))
    _, qt = execute(graph, qparams, x, quant=quant, qstate=qstate, observe=tap(names))
    return {n: _sqnr(np.asarray(ft[n][1]), np.asarray(qt[n][1])) for n in names}


def digits_model(seed: int = 0):
    data = load_digits_nhwc(seed=seed)
    with jax.numpy_dtype_promotion("standard"):
        model = train_float(data, epochs=30, learning_rate=3e-3, batch_size=64, seed=seed,
                            model=DigitsCNN(rngs=nnx.Rngs(seed)))
        graph, params = optimize(*trace_flax(model, data.x_test[:1]))
    return data, graph, params


def run_cle(data, graph, params, calib):
    xte, yte = data.x_test, data.y_test
    y0 = np.asarray(execute(graph, params, xte))
    step = PTQ_METHODS["cle"]().apply(graph, params, quant_spec(graph, 8, 8), calib, None)
    rows = []
    for bits in (8, 6, 4):
        q = {n: dataclasses.replace(lq, weight_per_channel=False)
             for n, lq in quant_spec(graph, bits, 8).items()}
        row = {"weight_bits": bits}
        for key, (g, p) in {"before": (graph, params), "after": (step.graph, step.params)}.items():
            qs = calibrate(g, p, calib, q)
            row[f"acc_{key}"] = evaluate(g, p, xte, yte, quant=q, qstate=qs)
            row[f"sqnr_{key}"] = _sqnr(y0, np.asarray(execute(g, p, xte, quant=q, qstate=qs)))
        rows.append(row)
    return {"rows": rows, "notes": list(step.notes)}


def run_cle_separable():
    """The test's MobileNet block (conv -> depthwise -> pointwise) with output channel i of the
    first conv scaled by f_i (10^-1.5 .. 10^1.5) and the depthwise channel by 1 / f_i: the same
    function, weight ranges 1000x apart."""
    rng = np.random.default_rng(0)
    graph, p = separable_net(rng)
    f = (10.0 ** np.linspace(-1.5, 1.5, 8)).astype(np.float32)
    p["c1"]["kernel"] = p["c1"]["kernel"] * f
    p["c1"]["bias"] = (rng.normal(size=8) * 0.3 * f).astype(np.float32)
    p["dw"]["kernel"] = p["dw"]["kernel"] / f
    p["dw"]["bias"] = np.full(8, 3.0, np.float32)
    x = rng.normal(size=(128, 8, 8, 3)).astype(np.float32)
    calib, test = [x[:64]], x[64:]
    y0 = np.asarray(execute(graph, p, test))
    step = PTQ_METHODS["cle"]().apply(graph, p, quant_spec(graph, 8, 8), calib, None)
    rows = []
    for bits in (8, 6, 4):
        q = {n: dataclasses.replace(lq, weight_per_channel=False)
             for n, lq in quant_spec(graph, bits, 8).items()}
        row = {"weight_bits": bits}
        for key, (g, pp) in {"before": (graph, p), "after": (step.graph, step.params)}.items():
            qs = calibrate(g, pp, calib, q)
            row[f"sqnr_{key}"] = _sqnr(y0, np.asarray(execute(g, pp, test, quant=q, qstate=qs)))
        rows.append(row)
    return {"rows": rows, "notes": list(step.notes)}


def run_adaround(data, graph, params, calib, iterations):
    q = quant_spec(graph, 4, 8)
    qs = calibrate(graph, params, calib, q)
    t = time.perf_counter()
    step = PTQ_METHODS["adaround"](iterations=iterations).apply(graph, params, q, calib, qs)
    seconds = time.perf_counter() - t
    out = {"iterations": iterations, "seconds": seconds, "notes": list(step.notes)}
    for key, (p, qq, ss) in {"nearest": (params, q, qs),
                             "adaround": (step.params, step.quant, step.qstate)}.items():
        out[f"acc_{key}"] = evaluate(graph, p, data.x_test, data.y_test, quant=qq, qstate=ss)
        out[f"sqnr_{key}"] = _layer_sqnr(graph, params, p, qq, ss, data.x_test)
    return out


def run_smoothquant():
    rng = np.random.default_rng(0)
    graph, params = mlp_block(rng, d=64, hidden=256, tokens=16)
    params["ln"]["scale"][[3, 17, 40]] = [30.0, -20.0, 45.0]  # outlier channels
    x = rng.normal(size=(64, 16, 64)).astype(np.float32)
    calib, test = [x[:32]], x[32:]
    q = quant_spec(graph, 8, 8)
    y0 = np.asarray(execute(graph, params, test))
    qs = calibrate(graph, params, calib, q)
    base = _sqnr(y0, np.asarray(execute(graph, params, test, quant=q, qstate=qs)))
    alphas = [0.0, 0.25, 0.5, 0.75, 1.0]
    curves = {}
    for mode in ("skip", "mul"):
        curves[mode] = []
        for a in alphas:
            step = PTQ_METHODS["smoothquant"](alpha=a, unfoldable=mode).apply(
                graph, params, q, calib, None)
            s = calibrate(step.graph, step.params, calib, q)
            curves[mode].append(_sqnr(y0, np.asarray(
                execute(step.graph, step.params, test, quant=q, qstate=s))))
    return {"alphas": alphas, "no_smoothing": base, "sqnr": curves}


def run_gptq(data, graph, params, calib):
    out = {}
    y0 = np.asarray(execute(graph, params, data.x_test))
    dense = {n: lq for n, lq in quant_spec(graph, 8, 8).items() if graph.node(n).op == "Gemm"}
    for bits in (4, 3):  # the convolutions stay float
        step = PTQ_METHODS["gptq"](bits=bits).apply(graph, params, dense, calib, None)
        # round to nearest on the same format: weight-only, per group of 128, min-max
        rtn = {n: dataclasses.replace(lq, quantizer=STE()) for n, lq in step.quant.items()}
        acc_g = evaluate(graph, step.params, data.x_test, data.y_test, quant=step.quant,
                         qstate=step.qstate)
        acc_r = evaluate(graph, params, data.x_test, data.y_test, quant=rtn, qstate={})
        out[f"int{bits}"] = {
            "notes": list(step.notes), "acc_gptq": acc_g, "acc_nearest": acc_r,
            "logit_sqnr_gptq": _sqnr(y0, np.asarray(execute(
                graph, step.params, data.x_test, quant=step.quant, qstate=step.qstate))),
            "logit_sqnr_nearest": _sqnr(y0, np.asarray(execute(
                graph, params, data.x_test, quant=rtn, qstate={}))),
        }
    return out


def figure(res) -> bytes:
    fig = Figure(figsize=(12, 8.5), layout="constrained")
    ax = fig.subplots(2, 2)
    a = ax[0, 0]
    rows = res["cle_separable"]["rows"]
    xs = np.arange(len(rows))
    a.bar(xs - 0.2, [r["sqnr_before"] for r in rows], 0.4, label="per-tensor weights")
    a.bar(xs + 0.2, [r["sqnr_after"] for r in rows], 0.4, label="after CLE")
    a.set_xticks(xs, [f"W{r['weight_bits']}A8" for r in rows])
    a.set_ylabel("output SQNR (dB)")
    a.set_title("CLE: conv-depthwise-pointwise block, channel ranges 1000x apart")
    a.legend()
    a = ax[0, 1]
    ada = res["adaround"]
    names = list(ada["sqnr_nearest"])
    xs = np.arange(len(names))
    a.bar(xs - 0.2, [ada["sqnr_nearest"][n] for n in names], 0.4,
          label=f"nearest ({100 * ada['acc_nearest']:.1f}%)")
    a.bar(xs + 0.2, [ada["sqnr_adaround"][n] for n in names], 0.4,
          label=f"AdaRound ({100 * ada['acc_adaround']:.1f}%)")
    a.set_xticks(xs, names)
    a.set_ylabel("layer output SQNR (dB), whole model W4A8")
    a.set_title(f"AdaRound: digits CNN W4A8, {ada['iterations']} iterations/layer")
    a.legend()
    a = ax[1, 0]
    sq = res["smoothquant"]
    a.plot(sq["alphas"], sq["sqnr"]["skip"], "o-", label="folded into LayerNorm (fc1)")
    a.plot(sq["alphas"], sq["sqnr"]["mul"], "s-", label="+ explicit Mul before fc2")
    a.axhline(sq["no_smoothing"], color="gray", ls="--", label="no smoothing")
    a.set_xlabel("migration strength alpha")
    a.set_ylabel("W8A8 output SQNR (dB)")
    a.set_title("SmoothQuant: MLP block with 3 outlier channels")
    a.legend()
    a = ax[1, 1]
    g = res["gptq"]
    labels, near, gp = [], [], []
    for fmt, r in g.items():
        labels.append(fmt)
        near.append(r["logit_sqnr_nearest"])
        gp.append(r["logit_sqnr_gptq"])
    xs = np.arange(len(labels))
    a.bar(xs - 0.2, near, 0.4, label="round to nearest")
    a.bar(xs + 0.2, gp, 0.4, label="GPTQ")
    for i, fmt in enumerate(labels):
        a.annotate(f"{100 * g[fmt]['acc_nearest']:.1f}%", (i - 0.2, near[i]), ha="center",
                   va="bottom", fontsize=8)
        a.annotate(f"{100 * g[fmt]['acc_gptq']:.1f}%", (i + 0.2, gp[i]), ha="center",
                   va="bottom", fontsize=8)
    a.set_xticks(xs, [f"{lab} weight-only" for lab in labels])
    a.set_ylabel("logit SQNR (dB)")
    a.set_title("GPTQ: digits CNN dense layers (convs float), groups of 128")
    a.legend()
    import io

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    return buf.getvalue()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(HERE.parents[1] / "docs" / "results"))
    ap.add_argument("--adaround-iterations", type=int, default=2000)
    args = ap.parse_args()
    t0 = time.perf_counter()
    data, graph, params = digits_model()
    calib = [data.x_train[i * 64:(i + 1) * 64] for i in range(4)]  # 256 training images
    float_acc = evaluate(graph, params, data.x_test, data.y_test)
    res = {"float_accuracy": float_acc}
    res["cle"] = run_cle(data, graph, params, calib)
    res["cle_separable"] = run_cle_separable()
    print("cle separable", json.dumps(res["cle_separable"]["rows"]))
    print("cle", json.dumps(res["cle"]["rows"]))
    res["gptq"] = run_gptq(data, graph, params, calib)
    print("gptq", json.dumps(res["gptq"], indent=1))
    res["smoothquant"] = run_smoothquant()
    print("smoothquant", json.dumps(res["smoothquant"]))
    res["adaround"] = run_adaround(data, graph, params, calib, args.adaround_iterations)
    print("adaround", json.dumps(res["adaround"], indent=1))
    res["seconds"] = time.perf_counter() - t0
    out = Path(args.out)
    atomic_write_bytes(out / "ptq_methods.png", figure(res))
    atomic_write_text(out / "ptq_methods.json", json.dumps(res, indent=1) + "\n")
    print(f"float accuracy {float_acc:.4f}; wrote {out}/ptq_methods.png in {res['seconds']:.0f} s")


if __name__ == "__main__":
    main()

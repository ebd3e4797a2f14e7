"""GPTQ vs round-to-nearest, int4 weight-only, on PP-OCR rec's real pretrained MatMul weights
(issue 29, "GPTQ vs round-to-nearest").

Reads ``WORK/ppocr_rec/float.onnx``, ``calib.npy`` (the 256 calibration lines) and ``eval.npz``
(held-out rendered lines ``x`` and their strings ``text``) written by ``compare.py prepare
--models ppocr_rec``. For every Gemm layer of the imported model (the ONNX MatMuls with a
constant weight: the SVTR neck's qkv / proj / fc1 / fc2 and the CTC head), int4 signed
narrow-range weights with per-output-row scales per group of ``--group-size`` input columns:

* RTN: round to nearest on the min-max grid of each group (``npujax.quantize.methods.gptq``'s
  ``group_scales``; the same grid GPTQ starts from);
* GPTQ: ``npujax.quantize.methods.GPTQ(bits=4, group_size=G).apply`` (sequential, the
  reference's order: each layer's Hessian from the model whose earlier layers are quantized),
  and the variants ``--variants`` names (act-order, other dampening, per-channel).

Per layer: the output SQNR ``10 log10(|Y|^2 / |X W_q - Y|^2)`` with ``X`` the layer's input in
the *float* model on the held-out lines (the same ``X`` for every variant, so the column
isolates the weights' error) and ``Y = X W``. End to end: exact-match accuracy and character
error rate of the whole model with only these layers' weights replaced (activations and
convolutions float), CTC greedy decoding with the dictionary in the file's metadata, as
``compare.py`` scores. Writes ``WORK/gptq_rec.json`` and the figure ``--png``.

Usage::

    PYTHONPATH=. python3 experiments/quantize_peers/gptq_rec.py --work /tmp/qpeers \\
        --png docs/results/quantization_gptq_rec.png
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))


def _cpu() -> float:
    t = os.times()
    return t.user + t.system


def _rtn(kernel: np.ndarray, bits: int, group: int) -> np.ndarray:
    """Round-to-nearest int ``bits`` of a ``[K, N]`` kernel, groups of ``group`` input rows
    per output column (the grid GPTQ starts from)."""
    from npujax.numerics import IntFormat
    from npujax.quantize.methods.gptq import _quant, group_scales

    fmt = IntFormat(bits, narrow_range=True)
    w = kernel.T.astype(np.float64)
    s = np.repeat(group_scales(w, fmt, group), group, axis=1)[:, :w.shape[1]]
    return (_quant(w, s, fmt) * s).T.astype(np.float32)


def _sqnr(x: np.ndarray, w: np.ndarray, wq: np.ndarray) -> float:
    x = x.reshape(-1, w.shape[0]).astype(np.float64)
    y = x @ w.astype(np.float64)
    return float(10 * np.log10(np.sum(y * y) / max(np.sum((x @ wq.astype(np.float64) - y) ** 2),
                                                    1e-300)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--bits", type=int, default=4)
    ap.add_argument("--group-size", type=int, default=128)
    ap.add_argument("--batch", type=int, default=16, help="lines per model run")
    ap.add_argument("--variants", default="act_order,damp0.1,per_channel",
                    help="more GPTQ settings: act_order, dampN (percdamp N), per_channel")
    ap.add_argument("--png", type=Path, default=Path("docs/results/quantization_gptq_rec.png"))
    a = ap.parse_args()

    import jax
    from compare import _ctc_greedy, _edit_distance

    from npujax.frontends.onnx import from_onnx
    from npujax.ir.execute import execute
    from npujax.ir.passes import optimize
    from npujax.quantize.methods import GPTQ
    from npujax.quantize.methods._common import layer_taps
    from npujax.quantize.spec import quant_spec

    d = a.work / "ppocr_rec"
    import onnx

    meta = onnx.load(str(d / "float.onnx"), load_external_data=False).metadata_props
    chars = ["<blank>"] + next(p.value for p in meta if p.key == "character").split("\n") + [" "]
    graph, params = optimize(*from_onnx(d / "float.onnx", {"x": [1, 3, 48, 320]}))
    gemms = [n.name for n in graph.nodes if n.op == "Gemm"]
    print(f"{len(gemms)} Gemm layers: " + ", ".join(
        f"{n} {tuple(params[n]['kernel'].shape)}" for n in gemms), flush=True)
    xc = np.load(d / "calib.npy")
    ev = np.load(d / "eval.npz")
    xe, text = ev["x"], [str(t) for t in ev["text"]]
    cal = [xc[i:i + a.batch] for i in range(0, len(xc), a.batch)]
    held = [xe[i:i + a.batch] for i in range(0, len(xe), a.batch)]

    run = jax.jit(lambda p, x: execute(graph, p, x))

    def score(p) -> tuple[float, float]:
        out = np.concatenate([np.asarray(run(p, jax.numpy.asarray(b))) for b in held])
        got = [t.strip() for t in _ctc_greedy(out, chars)]
        em = 100 * float(np.mean([g == t for g, t in zip(got, text)]))
        cer = 100 * sum(_edit_distance(g, t) for g, t in zip(got, text)) / sum(map(len, text))
        return em, cer

    t = time.perf_counter()
    x_held = {n: v[0] for n, v in layer_taps(graph, params, held, gemms).items()}
    print(f"held-out layer inputs in {time.perf_counter() - t:.0f} s", flush=True)
    res = {"bits": a.bits, "group_size": a.group_size, "calib_lines": len(xc),
           "eval_lines": len(xe), "layers": gemms, "shapes": {
               n: list(params[n]["kernel"].shape) for n in gemms}, "runs": {}}
    res["runs"]["float"] = dict(zip(("exact_match", "cer"), score(params)))
    print(f"float: {res['runs']['float']}", flush=True)

    def record(label: str, kernels: dict[str, np.ndarray], seconds: tuple[float, float]):
        p = {k: dict(v) for k, v in params.items()}
        for n, k in kernels.items():
            p[n]["kernel"] = jax.device_put(k)
        em, cer = score(p)
        sq = {n: _sqnr(x_held[n], np.asarray(params[n]["kernel"]), kernels[n]) for n in gemms}
        res["runs"][label] = {"exact_match": em, "cer": cer, "sqnr_db": sq,
                              "seconds": seconds[0], "cpu_seconds": seconds[1]}
        print(f"{label}: exact {em:.1f} %, CER {cer:.2f} %, SQNR dB "
              + " ".join(f"{v:.1f}" for v in sq.values())
              + f" ({seconds[0]:.0f} s, {seconds[1]:.0f} CPU s)", flush=True)

    q = {n: lq for n, lq in quant_spec(graph, a.bits, 8).items() if n in gemms}
    for label, group in ((f"RTN g{a.group_size}", a.group_size),
                         ("RTN per channel", None)):
        t0, c0 = time.perf_counter(), _cpu()
        ks = {n: _rtn(np.asarray(params[n]["kernel"]), a.bits,
                      group or params[n]["kernel"].shape[0]) for n in gemms}
        record(label, ks, (time.perf_counter() - t0, _cpu() - c0))
    variants = [("", {})] + [(v, {"act_order": True} if v == "act_order" else
                              {"group_size": None} if v == "per_channel" else
                              {"percdamp": float(v[4:])})
                             for v in a.variants.split(",") if v]
    for v, kw in variants:
        kw = {"group_size": a.group_size, **kw}
        label = f"GPTQ g{a.group_size}" if not v else \
            f"GPTQ {'per channel' if v == 'per_channel' else f'g{a.group_size} {v}'}"
        t0, c0 = time.perf_counter(), _cpu()
        step = GPTQ(bits=a.bits, **kw).apply(graph, params, q, cal, None)
        ks = {n: np.asarray(step.params[n]["kernel"]) for n in gemms}
        record(label, ks, (time.perf_counter() - t0, _cpu() - c0))
        res["runs"][label]["notes"] = list(step.notes)
    (a.work / "gptq_rec.json").write_text(json.dumps(res, indent=1))
    plot(res, a.png, a.group_size)


def plot(res: dict, out: Path, group: int) -> None:
    """Per-layer output SQNR, RTN vs GPTQ (matplotlib's object API)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    layers = res["layers"]
    labels = [k for k in res["runs"] if k != "float"]
    fig = Figure(figsize=(10, 4.2))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    h = 0.8 / len(labels)
    for j, k in enumerate(labels):
        r = res["runs"][k]
        ax.bar(np.arange(len(layers)) + j * h, [r["sqnr_db"][n] for n in layers], width=h,
               label=f"{k} (CER {r['cer']:.2f} %)")
    ax.set_xticks(np.arange(len(layers)) + 0.4 - h / 2,
                  [f"{n}\n{tuple(res['shapes'][n])}" for n in layers], fontsize=6, rotation=30,
                  ha="right")
    ax.set_ylabel("output SQNR on held-out lines (dB)")
    ax.set_title(f"PP-OCRv4 rec, int{res['bits']} weight-only: GPTQ vs round-to-nearest per "
                 f"MatMul (float CER {res['runs']['float']['cer']:.2f} %, "
                 f"{res['eval_lines']} lines)", fontsize=9)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()

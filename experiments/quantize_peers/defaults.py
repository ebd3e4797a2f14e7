"""npujax's W8A8 PTQ settings side by side on held-out *validation* data (issue 29).

``compare.py`` reports on each model's evaluation split; a default chosen there would be
tuned to the test set. This script scores npujax's fake-quant (the model its QDQ file
computes: int32 biases, :func:`npujax.quantize.ptq.deployed_biases`) under each setting on
``WORK/MODEL/valid.npz`` (written by ``compare.py prepare``: examples that are neither
calibration nor evaluation examples), calibrated on the same ``calib.npy`` as every tool.
Per setting: top-1 accuracy, flips (examples whose top-1 differs from the float model's; how
many of them the change fixed and broke), the mean change of each class's probability and
the mean KL divergence of the softmax from the float model's, on the validation data; the
evaluation split's accuracy and flips are printed too, for reference only.

Settings: each observer in ``--observers`` without bias correction and with each
``--bias-correction`` mode of :func:`npujax.quantize.ptq.bias_correction` (CPU and wall
seconds per setting: the bias correction and the scoring, after the calibration).

Usage::

    PYTHONPATH=. python3 experiments/quantize_peers/defaults.py --work /work/qpeers2 \\
        --model ppocr_cls --observers minmax,mean_minmax
"""
from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np


def _softmax(z: np.ndarray) -> np.ndarray:
    z = z - z.max(-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(-1, keepdims=True)


def _probs(y: np.ndarray) -> np.ndarray:
    """Class probabilities of a model's outputs (PP-OCR cls ends in a Softmax; the ViT and the
    CNN give logits)."""
    y = np.asarray(y, np.float64)
    if np.all(y >= 0) and np.allclose(y.sum(-1), 1.0, atol=1e-4):
        return y
    return _softmax(y)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--model", required=True, choices=("ppocr_cls", "vit_mnist", "digits"))
    ap.add_argument("--observers", default="minmax")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--bias-correction", default="weights",
                    help="bias correction modes to compare with none "
                    "(npujax.quantize.ptq.BIAS_CORRECTION_MODES), comma-separated")
    ap.add_argument("--json", type=Path, default=None, help="also write the rows here")
    a = ap.parse_args()

    from prepared import load_prepared

    from npujax.quantize.calibrate import calibrate
    from npujax.quantize.ptq import bias_correction, deployed_biases
    from npujax.workflows.quantize import _predict

    graph, params, quant, cal, d = load_prepared(a.work, a.model, a.batch)
    sets = {k: np.load(d / f"{k}.npz") for k in ("valid", "eval")}
    ref = {k: _probs(_predict(graph, params, v["x"], a.batch)) for k, v in sets.items()}
    rows = [{"setting": "float",
             **{f"{k}_accuracy": 100 * float(np.mean(ref[k].argmax(-1) == v["y"]))
                for k, v in sets.items()}}]
    print(json.dumps(rows[-1]), flush=True)
    for obs in a.observers.split(","):
        qstate = calibrate(graph, params, cal, quant, observer=obs)
        for bc in [None, *a.bias_correction.split(",")]:
            t0, c0 = time.perf_counter(), os.times()
            p = (params if bc is None
                 else bias_correction(graph, params, quant, cal, qstate, mode=bc))
            p = deployed_biases(graph, p, quant, qstate)
            row = {"setting": obs + ("" if bc is None else f", bias correction ({bc})")}
            for k, v in sets.items():
                pr = _probs(_predict(graph, p, v["x"], a.batch, quant, qstate))
                kl = np.sum(ref[k] * (np.log(ref[k] + 1e-12) - np.log(pr + 1e-12)), -1)
                ok_f, ok_q = ref[k].argmax(-1) == v["y"], pr.argmax(-1) == v["y"]
                row |= {f"{k}_accuracy": 100 * float(np.mean(ok_q)),
                        f"{k}_flips": int(np.sum(pr.argmax(-1) != ref[k].argmax(-1))),
                        f"{k}_fixed": int(np.sum(ok_q & ~ok_f)),
                        f"{k}_broken": int(np.sum(ok_f & ~ok_q)),
                        # the mean change of each class's probability (a systematic shift
                        # towards one class flips examples one way)
                        f"{k}_mean_dprob": np.round(np.mean(pr - ref[k], 0), 5).tolist(),
                        f"{k}_kl": float(np.mean(kl))}
            c1 = os.times()
            row["cpu_s"] = (c1.user + c1.system) - (c0.user + c0.system)
            row["wall_s"] = time.perf_counter() - t0
            rows.append(row)
            print(json.dumps(row), flush=True)
    if a.json is not None:
        a.json.write_text(json.dumps({"model": a.model, "rows": rows,
                                      "valid_examples": int(len(sets["valid"]["x"])),
                                      "eval_examples": int(len(sets["eval"]["x"]))}, indent=1))


if __name__ == "__main__":
    main()

"""The sequential bias correction (``--bias-correction model``) in waves and in one pass, in one
run.

``npujax.quantize.ptq.bias_correction(mode="model")`` used to run the whole quantized model
over the calibration data once per wave of corrected layers (layers none of which feeds
another: 47 waves on PP-OCR rec, 54 on PP-OCR cls); it now runs the quantized model once,
layer by layer, holding the live activations of every batch. The former form is kept as
``npujax.quantize.ptq._sequential_in_waves``. This script imports each model as ``npujax
quantize`` (or, for rec, ``experiments/quantize_peers/rec_api.py``) does, builds the W8A8 spec
(``quant_spec(graph, 8, 8)``), calibrates with min-max on the ``compare.py prepare`` work
folder's ``calib.npy`` (256 examples) and runs one correction, in a fresh Python process per
run (so each has its own peak RSS), the forms in turn: ``waves`` (before), ``one_pass``
(after), ``weights`` (the weight-only correction, for scale) and ``waves_half``: ``waves``
again on the same examples in batches of half the size (the same means, computed by other
programs: rounded differently), which shows how far float rounding alone moves the former
form's result (activation quantization turns a last-bit difference at a rounding tie into a
whole step, and each corrected layer passes it on). Per run: the CPU seconds (user + system,
``resource.getrusage``) and wall seconds of the correction alone; the
process's peak RSS (``ru_maxrss``: calibration included) and the peak RSS sampled every 20 ms
during the correction; the corrected biases and the quantized model's outputs on the first 32
calibration examples, which the parent compares. Printed:
per model, each form's figures and the largest remaining mean output shift against the float
model on those examples (``|mean(y_q - y)|`` per output, what the correction removes), the
ratio one_pass / waves (< 1: faster), and between one_pass and waves, and between
waves_half and waves, the largest difference of the biases (relative to the largest
correction) and of the outputs (relative to the largest output). The load average is printed
before and after each run (the machine is shared). Measured results:
``docs/results/quantization.md``.

Usage::

    PYTHONPATH=. python3 experiments/quantize_peers/compare.py prepare --work /tmp/qpeers \\
        --models digits,ppocr_cls,ppocr_rec --runs none
    PYTHONPATH=. python3 experiments/bench/bias_correction_one_pass.py --work /tmp/qpeers \\
        --models digits,ppocr_cls [--forms waves,one_pass,weights,waves_half] \
        [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]

#: How each model is imported and batched: ``npujax quantize``'s defaults (``unfold_batch``,
#: 64 examples per batch) for digits and cls; ``rec_api.py``'s (no unfold, 16 per batch) for
#: rec.
MODELS = {
    "digits": {"shape": None, "unfold": True, "batch": 64},
    "ppocr_cls": {"shape": [1, 3, 48, 192], "unfold": True, "batch": 64},
    "ppocr_rec": {"shape": [1, 3, 48, 320], "unfold": False, "batch": 16},
}

CHILD = r'''
import importlib, json, resource, sys, threading, time
import jax, numpy as np

def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime

def rss_kb():
    with open("/proc/self/status") as f:
        return next(int(v.split()[1]) for v in f if v.startswith("VmRSS:"))

from npujax.frontends.onnx import from_onnx
from npujax.ir.execute import execute
from npujax.ir.passes import optimize, unfold_batch
from npujax.quantize.calibrate import calibrate
from npujax.quantize.spec import quant_spec
ptq = importlib.import_module("npujax.quantize.ptq")

d, form, cfg, out = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), sys.argv[4]
shape = None if cfg["shape"] is None else {"x": cfg["shape"]}
graph, params = optimize(*from_onnx(d + "/float.onnx", shape))
if cfg["unfold"]:
    graph, params = unfold_batch(graph, params)
q = quant_spec(graph, 8, 8)
xc = np.load(d + "/calib.npy")
cal = [xc[i:i + cfg["batch"]] for i in range(0, len(xc), cfg["batch"])]
qstate = calibrate(graph, params, cal, q, observer="minmax")
jax.block_until_ready(qstate)
peak, stop = [rss_kb()], threading.Event()

def sample():
    while not stop.wait(0.02):
        peak[0] = max(peak[0], rss_kb())

rss0, maxrss0 = rss_kb(), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
th = threading.Thread(target=sample, daemon=True)
th.start()
c0, t0 = cpu(), time.perf_counter()
if form == "waves":
    new = ptq._sequential_in_waves(graph, params, q, qstate, cal)
else:
    new = ptq.bias_correction(graph, params, q, cal, qstate,
                              mode="model" if form == "one_pass" else "weights")
jax.block_until_ready(new)
c1, t1 = cpu(), time.perf_counter()
stop.set()
th.join()
peak[0] = max(peak[0], rss_kb())
y = np.asarray(jax.jit(lambda p: execute(graph, p, xc[:32], quant=q, qstate=qstate))(new))
y_float = np.asarray(jax.jit(lambda p: execute(graph, p, xc[:32]))(params))
shift = float(np.abs(np.mean(y - y_float, axis=tuple(range(y.ndim - 1)))).max())
biases = {k: np.asarray(v["bias"]) for k, v in new.items() if "bias" in v and k in q}
before = {k: np.asarray(params[k]["bias"]) if "bias" in params.get(k, {}) else
          np.zeros_like(v) for k, v in biases.items()}
np.savez(out, y=y, **{"b/" + k: v for k, v in biases.items()},
         **{"b0/" + k: v for k, v in before.items()})
print("RESULT " + json.dumps({
    "cpu_s": c1 - c0, "output_shift": shift, "wall_s": t1 - t0, "layers": len(biases),
    "rss_before_mb": rss0 / 1024,
    "peak_rss_during_mb": peak[0] / 1024, "maxrss_before_mb": maxrss0 / 1024,
    "process_peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
'''


def _run(work: Path, model: str, form: str, out: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "NPUJAX_COMPILE_CACHE": "off"}
    load0 = os.getloadavg()[0]
    cfg = dict(MODELS[model])
    if form == "waves_half":
        form, cfg["batch"] = "waves", cfg["batch"] // 2
    p = subprocess.run([sys.executable, "-c", CHILD, str(work / model), form, json.dumps(cfg),
                        str(out)], env=env, capture_output=True, text=True, check=False)
    if p.returncode:
        raise SystemExit(f"{model} {form}: failed\n{p.stderr[-3000:]}")
    line = next(v for v in p.stdout.splitlines() if v.startswith("RESULT "))
    return {**json.loads(line[len("RESULT "):]), "load": [load0, os.getloadavg()[0]]}


def _compare(a: Path, b: Path) -> dict:
    """The largest bias difference over the largest correction, and the largest output
    difference over the largest output, between the files of two runs."""
    fa, fb = np.load(a), np.load(b)
    keys = [k[2:] for k in fa.files if k.startswith("b/")]
    diff = max(float(np.abs(fa["b/" + k] - fb["b/" + k]).max()) for k in keys)
    corr = max(float(np.abs(fa["b/" + k] - fa["b0/" + k]).max()) for k in keys)
    dy = float(np.abs(fa["y"] - fb["y"]).max())
    return {"bias_max_abs_diff": diff, "largest_correction": corr,
            "bias_diff_relative": diff / corr if corr else 0.0, "output_max_abs_diff": dy,
            "output_diff_relative": dy / float(np.abs(fa["y"]).max())}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--work", type=Path, required=True, help="compare.py prepare's folder")
    ap.add_argument("--models", default="digits,ppocr_cls")
    ap.add_argument("--forms", default="waves,one_pass,weights,waves_half")
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    results: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        for model in a.models.split(","):
            res = results[model] = {}
            for form in a.forms.split(","):
                r = res[form] = _run(a.work, model, form, Path(tmp) / f"{model}_{form}.npz")
                print(f"{model:10s} {form:9s} {r['cpu_s']:8.1f} CPU s {r['wall_s']:8.1f} wall s"
                      f"  shift {r['output_shift']:.2e}  peak RSS during "
                      f"{r['peak_rss_during_mb']:7.0f} MB (before "
                      f"{r['rss_before_mb']:.0f}), process peak {r['process_peak_rss_mb']:.0f}"
                      f" MB  {r['layers']} layers  load {r['load'][0]:.1f}->{r['load'][1]:.1f}",
                      flush=True)
            if "waves" in res and "one_pass" in res:
                c = res["compare"] = _compare(Path(tmp) / f"{model}_waves.npz",
                                              Path(tmp) / f"{model}_one_pass.npz")
                w, o = res["waves"], res["one_pass"]
                res["ratio_cpu"] = o["cpu_s"] / w["cpu_s"]
                print(f"{model:10s} one_pass / waves: CPU {res['ratio_cpu']:.3f} "
                      f"(x{1 / res['ratio_cpu']:.1f} faster), wall "
                      f"{o['wall_s'] / w['wall_s']:.3f}, peak RSS during "
                      f"{o['peak_rss_during_mb'] / w['peak_rss_during_mb']:.2f}; biases differ "
                      f"by <= {c['bias_max_abs_diff']:.2e} ({c['bias_diff_relative']:.1e} of the "
                      f"largest correction {c['largest_correction']:.3g}), outputs by <= "
                      f"{c['output_max_abs_diff']:.2e} ({c['output_diff_relative']:.1e} of the "
                      "largest)", flush=True)
            if "waves" in res and "waves_half" in res:
                c = res["compare_half"] = _compare(Path(tmp) / f"{model}_waves.npz",
                                                   Path(tmp) / f"{model}_waves_half.npz")
                print(f"{model:10s} waves_half vs waves (rounding alone): biases differ by <= "
                      f"{c['bias_max_abs_diff']:.2e} ({c['bias_diff_relative']:.1e}), outputs "
                      f"by <= {c['output_max_abs_diff']:.2e} ({c['output_diff_relative']:.1e})",
                      flush=True)
            if "weights" in res and "one_pass" in res:
                print(f"{model:10s} one_pass / weights: CPU "
                      f"{res['one_pass']['cpu_s'] / res['weights']['cpu_s']:.2f}", flush=True)
    if a.json:
        a.json.write_text(json.dumps({"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                                      "results": results}, indent=1))


if __name__ == "__main__":
    main()

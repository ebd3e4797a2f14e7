"""AdaRound and GPTQ in waves and in one layer-by-layer pass, in one interleaved run.

``AdaRound`` and ``GPTQ`` (``npujax.quantize.methods``) used to run the (partly quantized)
model over the calibration data once per wave of layers (layers none of which feeds another);
they now run it once, layer by layer (``npujax.quantize.methods._common.LayerPass``, on
``execute_nodes`` as the sequential bias correction does). The former form is kept as
``_apply(..., one_pass=False)``. Each run is a fresh Python process (its own compilations,
``NPUJAX_COMPILE_CACHE=off``) that imports the model as ``npujax quantize`` does (cls:
``unfold_batch``, 64 per batch; rec: as ``experiments/quantize_peers/rec_api.py``, 16 per
batch), builds the W8A8 spec (``quant_spec(graph, 8, 8)``), calibrates with min-max on the
``compare.py prepare`` folder's ``calib.npy`` (``--examples`` of them) and times the method
alone: CPU seconds (user + system, ``resource.getrusage``) and wall seconds. The forms of one
case run back to back (waves, then one pass), the cases in turn. Printed per case: each form's
figures with the load average before and after, the ratio one_pass / waves (< 1: faster), and
the largest difference between the two forms' kernels (relative to the largest kernel value).

AdaRound runs ``--adaround-iterations`` Adam steps per layer (paper: 10,000): its per-layer
optimization is the same in both forms, the pass is what differs.

Usage::

    PYTHONPATH=. python3 experiments/bench/ptq_one_pass.py --work /work/qpeers2 \\
        --cases ppocr_cls:adaround,ppocr_rec:gptq [--examples 256] [--adaround-iterations 20]
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

MODELS = {
    "ppocr_cls": {"shape": [1, 3, 48, 192], "unfold": True, "batch": 64},
    "ppocr_rec": {"shape": [1, 3, 48, 320], "unfold": False, "batch": 16},
}

CHILD = r'''
import json, resource, sys, time
import jax, numpy as np

def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime

from npujax.frontends.onnx import from_onnx
from npujax.ir.passes import optimize, unfold_batch
from npujax.quantize.calibrate import calibrate
from npujax.quantize.methods import GPTQ, AdaRound
from npujax.quantize.spec import quant_spec

d, method, form, cfg, out = sys.argv[1:6]
cfg = json.loads(cfg)
graph, params = optimize(*from_onnx(d + "/float.onnx", {"x": cfg["shape"]}))
if cfg["unfold"]:
    graph, params = unfold_batch(graph, params)
q = quant_spec(graph, 8, 8)
xc = np.load(d + "/calib.npy")[:cfg["examples"]]
cal = [xc[i:i + cfg["batch"]] for i in range(0, len(xc), cfg["batch"])]
qstate = calibrate(graph, params, cal, q, observer="minmax")
jax.block_until_ready(qstate)
m = AdaRound(iterations=cfg["iterations"]) if method == "adaround" else GPTQ()
c0, t0 = cpu(), time.perf_counter()
step = m._apply(graph, params, q, cal, qstate, one_pass=form == "one_pass")
jax.block_until_ready(step.params)
c1, t1 = cpu(), time.perf_counter()
changed = sorted(n for n in step.quant if step.quant[n] is not q.get(n))
np.savez(out, **{n: np.asarray(step.params[n]["kernel"]) for n in changed})
print("RESULT " + json.dumps({"cpu_s": c1 - c0, "wall_s": t1 - t0, "layers": len(changed),
                              "maxrss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
                              / 1024}))
'''


def _run(work: Path, model: str, method: str, form: str, cfg: dict, out: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "NPUJAX_COMPILE_CACHE": "off"}
    load0 = os.getloadavg()[0]
    p = subprocess.run([sys.executable, "-c", CHILD, str(work / model), method, form,
                        json.dumps(cfg), str(out)], env=env, capture_output=True, text=True,
                       check=False)
    if p.returncode:
        raise SystemExit(f"{model} {method} {form}: failed\n{p.stderr[-3000:]}")
    line = next(v for v in p.stdout.splitlines() if v.startswith("RESULT "))
    return {**json.loads(line[len("RESULT "):]), "load": [load0, os.getloadavg()[0]]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--work", type=Path, required=True, help="compare.py prepare's folder")
    ap.add_argument("--cases", default="ppocr_cls:adaround,ppocr_rec:gptq",
                    help="MODEL:METHOD,... (methods: adaround, gptq)")
    ap.add_argument("--examples", type=int, default=256)
    ap.add_argument("--adaround-iterations", type=int, default=20)
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    results: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        for case in a.cases.split(","):
            model, method = case.split(":")
            cfg = {**MODELS[model], "examples": a.examples,
                   "iterations": a.adaround_iterations}
            res = results[case] = {}
            for form in ("waves", "one_pass"):
                r = res[form] = _run(a.work, model, method, form, cfg,
                                     Path(tmp) / f"{model}_{method}_{form}.npz")
                print(f"{case:20s} {form:9s} {r['cpu_s']:8.1f} CPU s {r['wall_s']:8.1f} wall s "
                      f"{r['layers']} layers, peak RSS {r['maxrss_mb']:.0f} MB, load "
                      f"{r['load'][0]:.1f}->{r['load'][1]:.1f}", flush=True)
            fa = np.load(Path(tmp) / f"{model}_{method}_waves.npz")
            fb = np.load(Path(tmp) / f"{model}_{method}_one_pass.npz")
            diff = max((float(np.abs(fa[k] - fb[k]).max()) for k in fa.files), default=0.0)
            top = max((float(np.abs(fa[k]).max()) for k in fa.files), default=1.0)
            differ = sum(int(np.any(fa[k] != fb[k])) for k in fa.files)
            res["ratio_cpu"] = res["one_pass"]["cpu_s"] / res["waves"]["cpu_s"]
            res["kernels_differing"] = differ
            res["kernel_max_abs_diff"] = diff
            print(f"{case:20s} one_pass / waves: CPU {res['ratio_cpu']:.3f} "
                  f"(x{1 / res['ratio_cpu']:.1f} faster), wall "
                  f"{res['one_pass']['wall_s'] / res['waves']['wall_s']:.3f}; kernels differ in "
                  f"{differ} of {len(fa.files)} layers, by <= {diff:.2e} ({diff / top:.1e} of "
                  "the largest)", flush=True)
    if a.json:
        a.json.write_text(json.dumps({"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                                      "examples": a.examples,
                                      "adaround_iterations": a.adaround_iterations,
                                      "results": results}, indent=1))


if __name__ == "__main__":
    main()

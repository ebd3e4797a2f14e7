"""The accuracy-bounded loop of ``npujax quantize`` before and after a change, in one run.

``npujax quantize --max-drop`` repeats calibration, the sequential bias correction
(``--bias-correction model``: one quantized forward pass of the calibration data per wave of
layers, 54 on PP-OCR cls) and the evaluation at every step. This script runs
:func:`npujax.workflows.quantize.quantize_model` with ``max_drop`` on PP-OCR cls (the
``compare.py prepare`` work folder's ``float.onnx``, ``calib.npy``, ``eval.npz``) at W8A6,
where the loop must take steps (fake-quant loses ~2.5 points to 6-bit activations: 3 steps,
``Conv@13``, ``Conv@2``, ``Conv@1``), in a fresh Python process per run, alternately with an
earlier checkout (``--before``) and this one, ``--repeats`` times. Per run: the CPU seconds
(user + system) of the ``quantize_model`` call and of the whole process, the steps, the
accuracy and the sha256 of the QDQ file; it prints the median CPU seconds per side, the ratio
after / before (< 1: faster) and whether every run wrote the same file with the same
accuracy. Measured results: ``docs/results/quantization.md`` ("The accuracy-bounded loop's
cost").

Usage::

    git worktree add /tmp/before main
    python experiments/bench/accuracy_control_steps.py --before /tmp/before \\
        --work /work/qpeers2 --repeats 1 --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

CHILD = r'''
import hashlib, json, resource, sys, time
import numpy as np

def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime

from npujax.frontends.onnx import from_onnx
from npujax.ir.passes import optimize
from npujax.quantize.spec import quant_spec
from npujax.workflows.quantize import QuantizeConfig, quantize_model

d, wbits, abits, max_drop = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
graph, params = optimize(*from_onnx(d + "/float.onnx", {"x": [1, 3, 48, 192]}))
xc = np.load(d + "/calib.npy")
ev = np.load(d + "/eval.npz")
config = QuantizeConfig(max_drop=max_drop, npu=None, ort_check=False)
c0, t0 = cpu(), time.perf_counter()
r = quantize_model(graph, params, quant_spec(graph, wbits, abits), xc, ev["x"], ev["y"], config)
c1, t1 = cpu(), time.perf_counter()
print("RESULT " + json.dumps({
    "quantize_cpu_s": c1 - c0, "quantize_wall_s": t1 - t0, "process_cpu_s": c1,
    "accuracy": r.accuracy, "float_accuracy": r.float_accuracy,
    "steps": [[s.layer, list(s.before), None if s.after is None else list(s.after),
               s.accuracy] for s in r.control.steps],
    "onnx_sha256": hashlib.sha256(r.onnx).hexdigest()}))
'''


def _run(checkout: Path, work: Path, wbits: int, abits: int, max_drop: float) -> dict:
    env = {**os.environ, "PYTHONPATH": str(checkout), "NPUJAX_COMPILE_CACHE": "off"}
    t = time.perf_counter()
    p = subprocess.run([sys.executable, "-c", CHILD, str(work / "ppocr_cls"), str(wbits),
                        str(abits), str(max_drop)], env=env, capture_output=True, text=True,
                       check=False)
    if p.returncode:
        raise SystemExit(f"{checkout}: failed\n{p.stderr[-3000:]}")
    line = next(v for v in p.stdout.splitlines() if v.startswith("RESULT "))
    out = json.loads(line[len("RESULT "):])
    out["wall_s"] = time.perf_counter() - t
    out["load_average"] = os.getloadavg()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--before", type=Path, required=True, help="an earlier checkout")
    ap.add_argument("--work", type=Path, required=True,
                    help="compare.py prepare's work folder (WORK/ppocr_cls)")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--weight-bits", type=int, default=8)
    ap.add_argument("--act-bits", type=int, default=6)
    ap.add_argument("--max-drop", type=float, default=1.0)
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    runs: dict[str, list[dict]] = {"before": [], "after": []}
    for i in range(a.repeats):
        for side, checkout in (("before", a.before), ("after", ROOT)):
            r = _run(checkout, a.work, a.weight_bits, a.act_bits, a.max_drop)
            runs[side].append(r)
            print(f"[{i}] {side}: quantize_model {r['quantize_cpu_s']:.1f} CPU s "
                  f"({r['quantize_wall_s']:.0f} s wall), process {r['process_cpu_s']:.1f} CPU s,"
                  f" accuracy {r['accuracy']:.2f} %, {len(r['steps'])} steps "
                  f"{[s[0] for s in r['steps']]}, load {r['load_average'][0]:.1f}", flush=True)
    med = {s: statistics.median(r["quantize_cpu_s"] for r in v) for s, v in runs.items()}
    same = len({(r["onnx_sha256"], r["accuracy"], json.dumps(r["steps"]))
                for v in runs.values() for r in v}) == 1
    print(f"quantize_model CPU s: before {med['before']:.1f}, after {med['after']:.1f}, "
          f"after / before {med['after'] / med['before']:.2f}; same file, steps and accuracy "
          f"in every run: {same}")
    if a.json:
        a.json.write_text(json.dumps({"runs": runs, "median_cpu_s": med,
                                      "ratio": med["after"] / med["before"],
                                      "identical": same,
                                      "settings": {"weight_bits": a.weight_bits,
                                                   "act_bits": a.act_bits,
                                                   "max_drop": a.max_drop}}, indent=1))


if __name__ == "__main__":
    main()

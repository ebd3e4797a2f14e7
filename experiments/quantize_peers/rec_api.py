"""npujax W8A8 on PP-OCR rec through the Python API, for when ``npujax quantize`` cannot run it.

``npujax quantize zoo:ppocr_rec`` was killed for memory on the shared 23 GB machine (9.9 GB
while XLA compiled its weight/activation sensitivity statistics: one program running the
model twice per quantized layer, 51 layers). This script does what that command does before
the sensitivity report, with the same functions: import, optimize, ``quant_spec(graph, 8,
8)`` (every GEMM, attention's two-activation MatMuls included), calibration (``--method``,
default minmax) on ``WORK/ppocr_rec/calib.npy``, the empirical bias correction
(``--bias-correction``, default ``model``, the command's), and ``npujax.to_onnx``;
it writes ``WORK/ppocr_rec/npujax_api_METHOD_bc_MODE/model.qdq.onnx`` and adds the run (wall
and CPU seconds) to ``runs.json``, so ``compare.py peers`` scores it like every other file.

Usage: PYTHONPATH=. python3 experiments/quantize_peers/rec_api.py --work /tmp/qpeers
[--method entropy] [--bias-correction weights]
"""
from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--method", default="minmax", help="calibration observer (as npujax "
                    "quantize --method)")
    ap.add_argument("--bias-correction", default="model",
                    help="bias correction mode (npujax.quantize.ptq.BIAS_CORRECTION_MODES); "
                    "default model, npujax quantize's and ptq()'s (the first published rec "
                    "figures used weights)")
    a = ap.parse_args()
    t0, c0 = time.perf_counter(), os.times()
    import npujax as nj
    from npujax.frontends.onnx import from_onnx
    from npujax.ir.passes import optimize
    from npujax.quantize.calibrate import calibrate
    from npujax.quantize.ptq import bias_correction
    from npujax.quantize.spec import quant_spec

    d = a.work / "ppocr_rec"
    graph, params = optimize(*from_onnx(d / "float.onnx", {"x": [1, 3, 48, 320]}))
    q = quant_spec(graph, 8, 8)
    xc = np.load(d / "calib.npy")
    cal = [xc[i:i + a.batch] for i in range(0, len(xc), a.batch)]
    qstate = calibrate(graph, params, cal, q, observer=a.method, progress=True)
    params = bias_correction(graph, params, q, cal, qstate, mode=a.bias_correction)
    out = d / f"npujax_api_{a.method}_bc_{a.bias_correction}"
    out.mkdir(exist_ok=True)
    nj.to_onnx(graph, params, q, qstate, path=out / "model.qdq.onnx")
    c1 = os.times()
    cpu = (c1.user + c1.system) - (c0.user + c0.system)
    wall = time.perf_counter() - t0
    (out / "quantize.json").write_text(json.dumps({"accuracy": None, "float_accuracy": None}))
    runs = json.loads((d / "runs.json").read_text())
    runs["npujax_runs"][f"npujax {a.method} --bias-correction {a.bias_correction} (Python API, "
                        "no sensitivity report)"] = {
        "dir": out.name, "seconds": wall, "cpu_seconds": cpu, "ok": True,
        "cmd": "experiments/quantize_peers/rec_api.py"
        f" --method {a.method} --bias-correction {a.bias_correction}"}
    (d / "runs.json").write_text(json.dumps(runs, indent=1))
    print(f"{len(q)} layers quantized; wrote {out / 'model.qdq.onnx'} in {wall:.0f} s "
          f"({cpu:.0f} CPU s)")


if __name__ == "__main__":
    main()

"""The bias-correction guard on a real model: per observer and correction mode, the output
SQNR against float on the calibration data (what the guard compares) and on the evaluation
split, and what the guard kept (issue 29).

Each setting calibrates W8A8 (``quant_spec(graph, 8, 8)``) on ``WORK/MODEL/calib.npy`` (256
examples, ``compare.py prepare``'s), runs
:func:`npujax.quantize.ptq.guarded_bias_correction` and scores the fake-quant model with the
biases the file holds (:func:`~npujax.quantize.ptq.deployed_biases`) on ``eval.npz``: output
SQNR and top-1 agreement with the float model (:func:`npujax.workflows.quantize.
output_vs_float`), for the uncorrected, the corrected and the kept biases. CPU seconds of the
correction and of the guard's passes are printed per setting, with the load average.

Usage::

    PYTHONPATH=. python3 experiments/quantize_peers/bias_correction_guard.py --work /work/qpeers2 \\
        [--model ppocr_cls] [--observers minmax,entropy] [--modes weights,model]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import time
from pathlib import Path


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--model", default="ppocr_cls")
    ap.add_argument("--observers", default="minmax,entropy")
    ap.add_argument("--modes", default="weights,model")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()

    from prepared import float_eval, load_prepared

    from npujax.quantize.calibrate import calibrate
    from npujax.quantize.ptq import bias_correction, deployed_biases, guarded_bias_correction
    from npujax.workflows.quantize import _predict, output_vs_float

    graph, params, quant, cal, d = load_prepared(a.work, a.model, a.batch)
    xe, y_float = float_eval(d, graph, params, a.batch)

    def score(p, qstate):
        p = deployed_biases(graph, p, quant, qstate)
        v = output_vs_float(_predict(graph, p, xe, a.batch, quant, qstate), y_float)
        return round(v["output_sqnr_db"], 2), round(v["top1_agreement"], 1)

    rows = []
    for obs in a.observers.split(","):
        qstate = calibrate(graph, params, cal, quant, observer=obs)
        base = score(params, qstate)
        print(f"{obs:8s} none     eval {base[0]:5.1f} dB {base[1]:5.1f} %", flush=True)
        for mode in a.modes.split(","):
            c0 = _cpu()
            corrected = bias_correction(graph, params, quant, cal, qstate, mode=mode)
            c1 = _cpu()
            kept, check = guarded_bias_correction(graph, params, quant, cal, qstate, mode=mode)
            c2 = _cpu()
            corr = score(corrected, qstate)
            row = {"observer": obs, "mode": mode, "kept": "corrected" if check.kept else
                   "uncorrected", "calib_sqnr_db": [round(check.sqnr_db_uncorrected, 2),
                                                    round(check.sqnr_db_corrected, 2)],
                   "eval_uncorrected": base, "eval_corrected": corr,
                   "eval_kept": corr if check.kept else base,
                   "correction_cpu_s": round(c1 - c0, 1),
                   "guard_cpu_s": round(c2 - c1 - (c1 - c0), 1),
                   "load": round(os.getloadavg()[0], 1)}
            rows.append(row)
            print(f"{obs:8s} {mode:8s} calibration {row['calib_sqnr_db'][0]:5.1f} -> "
                  f"{row['calib_sqnr_db'][1]:5.1f} dB, kept {row['kept']:11s} | eval "
                  f"uncorrected {base[0]:5.1f} dB {base[1]:5.1f} %, corrected {corr[0]:5.1f} dB "
                  f"{corr[1]:5.1f} %, kept {row['eval_kept'][0]:5.1f} dB | correction "
                  f"{row['correction_cpu_s']} CPU s, guard's passes ~{row['guard_cpu_s']} CPU s, "
                  f"load {row['load']}", flush=True)
    print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {_cpu():.0f} CPU s in all")
    if a.json:
        a.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()

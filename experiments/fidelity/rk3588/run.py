"""Predict the Rockchip RK3588 NPU's published times (docs/results/fidelity.md, RK3588).

The table (``table.csv`` here) is rknn_model_zoo's "Model performance benchmark (FPS)" for
"RK3588 @single_core" (github.com/airockchip/rknn_model_zoo, README.md, v2.3.2, 2025-04-09):
the INT8 rows, as ms = 1000 / FPS (model inference only, no pre- or post-processing, at the
maximum NPU frequency). A ``source`` names what npujax builds (``keras:NAME`` with random
weights; ``zoo:NAME`` the PaddleOCR ONNX file of npujax's zoo; ``onnx/NAME.onnx``, the
ResNet-50 v2 and YOLOv5 n/s/m/s-ReLU files built by ``build_onnx.py`` without torch, first if
missing) or is empty where npujax has no constructor of the architecture (YOLO v6-v8/X,
DeepLab and RetinaFace rows: skipped, never approximated). The one FP16 row npujax builds
(PP-OCRv4 rec) is predicted, not fitted: the RK3588's FP16 MAC rate is not published (the
preset's 8-bit array takes 4 passes).

It is what ``npujax fit --table`` does (the same :func:`table_network` per row, the same
:func:`fit_table`), with the rows built once, one leave-one-out fit per candidate field
(``FIELD_SETS``), and what the code before this change predicted (the preset with every layer
split over all three cores, ``array.cores_per_inference = 0``; and that with the rows built as
before: an NC1HWC0 device's input and output conversions charged, a zoo row's shape not
passed to its dynamic-input file, which failed to import).

Run from the repository root (needs the ``keras`` extra; a few minutes on 2 shared cores)::

    python experiments/fidelity/rk3588/run.py [--out experiments/fidelity/rk3588/out]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("KERAS_BACKEND", "jax")

HERE = Path(__file__).resolve().parent
TABLE = HERE / "table.csv"
PRESET = "rk3588_npu"
#: the candidate fields, one fit each: the unpublished numbers the preset assumes, of the kinds
#: the Coral run fitted (the DRAM rate the NPU sustains, the vector width, the fixed cost per
#: inference), one at a time and together (each leave-one-out fit needs more models than
#: fields: seven INT8 rows allow up to five).
FIELD_SETS = ("memory.dram_bytes_per_s", "vector.lanes", "host.invocation_overhead_s",
              "memory.dram_bytes_per_s,vector.lanes,host.invocation_overhead_s")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(HERE / "out"), help="output folder")
    ap.add_argument("--fields", default=";".join(FIELD_SETS),
                    help="field sets to fit, one fit each: ';' between sets, ',' within one")
    args = ap.parse_args()
    from rich.console import Console

    from npujax._atomic import staged_dir
    from npujax.cli import compile_cache
    from npujax.errors import NpujaxError
    from npujax.hw import fields, load_npu_spec
    from npujax.plan import network
    from npujax.plan.fit import fit_metrics
    from npujax.plan.fit_table import TableModel, fit_table, predict_model_s, read_table
    from npujax.workflows.fit_table import (
        TableFitRun,
        model_bound,
        print_table_fit,
        table_graph,
        table_network,
        write_table_fit,
    )

    compile_cache()
    con = Console(width=120)
    t0 = time.time()

    def say(line: str) -> None:
        print(f"[{time.time() - t0:6.0f} s] {line}", file=sys.stderr, flush=True)

    spec = load_npu_spec(PRESET)
    rows = read_table(TABLE)
    sys.path.insert(0, str(HERE))
    from build_onnx import build_all

    for path in build_all():
        say(f"built {path.name} (build_onnx.py)")
    used, models, skipped, wide = [], [], [], []
    for r in rows:
        if not r.source:
            skipped.append((r, "no constructor of the architecture in npujax (keras, zoo)"))
            continue
        if r.bits not in (None, 8):  # RK3588's FP16 MAC rate is not published
            skipped.append((r, f"{r.bits}-bit: predicted below, not fitted"))
            net = table_network(r, spec)
            wide.append(TableModel(r.model, r.group, net.layers, net.chains, r.measured_s,
                                   r.bits))
            continue
        say(f"building {r.model} ({r.source}, {r.input_hwc})")
        net = table_network(r, spec)
        macs = sum(w.macs for w in net.layers)
        say(f"  {len(net.layers)} layers, {macs / 1e9:.3f} GMACs")
        used.append(r)
        models.append(TableModel(r.model, r.group, net.layers, net.chains, r.measured_s))
    runs = {}
    for fset in [x for x in args.fields.split(";") if x]:
        res = fit_table(models, spec, [f for f in fset.split(",") if f], progress=say)
        runs[fset] = run = TableFitRun(str(TABLE), None, tuple(used), tuple(skipped), spec, res,
                                       tuple(model_bound(m, res.spec) for m in models), PRESET)
        con.rule(f"RK3588 @single_core ({PRESET}), {fset} fitted, leave-one-out")
        print_table_fit(con, run)
        for m in wide:  # not in the fit: the preset's fp16 rate is an assumption
            p = predict_model_s(m, res.spec)
            err = (p / m.measured_s - 1) * 100
            con.print(f"{m.name} ({m.bits}-bit, not fitted), with this fit: {p * 1e3:.2f} ms, "
                      f"measured {m.measured_s * 1e3:.2f} ms ({err:+.1f} %)")
    # what the code before this change did with this preset and table (no fit): every layer
    # split over the three cores (no array.cores_per_inference); and that with the rows built
    # as before: an NC1HWC0 device's input and output conversions charged, a zoo row's shape
    # not passed to its (dynamic-input) file, which then failed to import and was skipped
    every = fields.replace(spec, {"array.cores_per_inference": 0}, name="rk3588_all_cores")
    for label, old_build in (("every layer split over all 3 cores", False),
                             ("that, and the rows built as before", True)):
        meas, pred = [], []
        con.rule(f"the preset, {label} (no fit)")
        for r, m in zip(used, models):
            if old_build:
                row = r._replace(input_hwc=None) if r.source.startswith("zoo:") else r
                try:
                    net = network(table_graph(row, None), spec)
                except NpujaxError as e:
                    con.print(f"{m.name:32s} not built: {str(e)[:60]}...")
                    continue
                m = m._replace(layers=net.layers, chains=net.chains)
            p = predict_model_s(m, every)
            meas.append(m.measured_s)
            pred.append(p)
            con.print(f"{m.name:32s} measured {m.measured_s * 1e3:7.2f} ms  predicted "
                      f"{p * 1e3:7.2f} ms  {(p / m.measured_s - 1) * 100:+6.1f} %")
        mm = fit_metrics(meas, pred)
        con.print(f"MAPE {mm['mape']:.1f} % over {len(pred)} models")
    with staged_dir(Path(args.out)) as stage:
        for fset, run in runs.items():
            (stage / fset.replace(",", "+")).mkdir()
            write_table_fit(stage / fset.replace(",", "+"), run)
    say(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Predict the Coral Edge TPU's published times: the fidelity figures of docs/results/fidelity.md.

The table is Table 1 of coral.ai/docs/edgetpu/benchmarks (``coral_edgetpu_table1.csv`` here,
a copy of shared/fidelity's with a ``source`` column naming the architecture npujax builds:
``keras:NAME`` with random weights; ``onnx/NAME.onnx``, an ONNX export made once by
``export_onnx.py`` in its own venv (torchvision / timm constructors, random weights), or
written without torch by ``coral_build_onnx.py`` from the published definitions of the U-Net,
the two SSDs and DeepLab V3 (the files are not in git, ``onnx_manifest.json`` pins their
sha256 and says which script made each, checked here before use); or empty where npujax
builds no architecture (none left). The SSD rows' input is 300x300, the size of Coral's files, where
the published table labels them 224x224 (docs/results/fidelity.md says why). The ONNX
files are NCHW; like ``npujax fit --table`` (``table_network``), the script builds them
channels-last on this NHWC preset, as Coral's TensorFlow Lite models are, or, where
``channels_last`` cannot rewrite one (DeepLab's Resize), in its own layout without layout
conversions at its input and output.

1. **USB Accelerator** (``coral_edgetpu``): ``fit --table`` of the off-chip (USB) rate, the
   fixed cost per inference and the vector unit's width (``FIELDS``), leave-one-out over every
   row with an architecture.
2. **Dev Board** (``coral_devboard``): (a) predicted from the USB fit by changing only the host
   numbers (the Dev Board preset's CPU and PCIe link, the USB fit's invocation overhead: no
   Dev Board measurement used); (b) the same with the link rate refitted on the Dev Board's own
   rows, leave-one-out.

Run from the repository root (about 40 minutes on 2 shared CPU cores; needs the ``keras``
extra and the exports of ``export_onnx.py``)::

    python experiments/fidelity/coral.py [--out experiments/fidelity/out] [--loss linear]

(``--loss linear``: the least-squares fit of the figures before 2026-12-03; the default is
``fit_table``'s robust ``soft_l1``.)

It prints the tables of docs/results/fidelity.md and writes, per host, the fitted preset,
predictions.csv, fit.json and the log-log plot.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import pickle
import sys
import time
from pathlib import Path

os.environ.setdefault("KERAS_BACKEND", "jax")

HERE = Path(__file__).resolve().parent
TABLE = HERE / "coral_edgetpu_table1.csv"
MANIFEST = HERE / "onnx_manifest.json"
USB, DEV = "usb_accelerator_desktop", "dev_board"
#: the fitted fields: the off-chip rate (the device's only off-chip memory is the host's,
#: across the link; the VGG rows identify it), the fixed cost per inference (the small
#: models would identify it) and the vector unit's width (not published; the preset assumes
#: one lane per array column: the pooling, concatenation and BatchNorm work of the
#: concatenation-built models would identify it); a per-layer first-access latency
#: (memory.dram_latency_s) was tried and is not identified by this table (±72 %)
FIELDS = ("memory.dram_bytes_per_s", "host.invocation_overhead_s", "vector.lanes")


def check_exports(rows) -> None:
    """Every ONNX file the table names is the one ``onnx_manifest.json`` pins (sha256)."""
    manifest = {(HERE / m["file"]).resolve(): m for m in
                json.loads(MANIFEST.read_text())["models"].values()}
    for r in rows:
        if not r.source.endswith(".onnx"):
            continue
        path = Path(r.source).resolve()
        if path not in manifest:
            raise SystemExit(f"{r.model}: {path} is not in {MANIFEST.name}")
        if not path.exists():
            how = ("coral_build_onnx.py" if "built_by" in manifest[path] else
                   "export_onnx.py in its own venv")
            raise SystemExit(f"{r.model}: {path} is missing; run experiments/fidelity/{how} "
                             "(see its docstring)")
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        if digest != manifest[path]["sha256"]:
            raise SystemExit(f"{r.model}: {path} has sha256 {digest}, the manifest pins "
                             f"{manifest[path]['sha256']}; re-export it")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(HERE / "out"), help="output folder")
    ap.add_argument("--cache", default="", help="folder to keep each row's workloads in "
                    "(pickled, keyed by source and input shape; reused on the next run, which "
                    "then skips tracing the Keras models: about 10 minutes)")
    ap.add_argument("--loss", default=None, help="the fits' loss of the log ratios (default: "
                    "fit_table's, soft_l1; linear: least squares, the figures before 2026-12-03)")
    args = ap.parse_args()
    from rich.console import Console

    from npujax._atomic import staged_dir
    from npujax.cli import compile_cache
    from npujax.hw import fields, load_npu_spec
    from npujax.plan.fit import fit_metrics
    from npujax.plan.fit_table import (
        TABLE_LOSS,
        TableModel,
        TableRow,
        fit_table,
        predict_model_s,
        read_table,
    )
    from npujax.workflows.fit_table import (
        TableFitRun,
        model_bound,
        print_table_fit,
        table_network,
        write_table_fit,
    )

    compile_cache()  # a rerun skips compiling the models' cost programs
    loss = args.loss or TABLE_LOSS
    con = Console(width=120)
    t0 = time.time()

    def say(line: str) -> None:
        print(f"[{time.time() - t0:6.0f} s] {line}", file=sys.stderr, flush=True)

    usb_spec, dev_spec = load_npu_spec("coral_edgetpu"), load_npu_spec("coral_devboard")
    rows = read_table(TABLE)
    check_exports(rows)
    layout = usb_spec.layout.activation_layout
    nets = {}
    cache = Path(args.cache) if args.cache else None

    def build(r):
        # both presets have the same array, layout and operators: the same workloads
        key = hashlib.sha256(repr((r.source.replace(str(HERE), ""), r.input_hwc, layout,
                                   usb_spec.ops)).encode()).hexdigest()[:16]
        f = cache / f"{key}.pkl" if cache else None
        if f is not None and f.exists():
            return pickle.loads(f.read_bytes())
        say(f"building {r.model} ({r.source}, {r.input_hwc})")
        net = table_network(r, usb_spec)
        if f is not None:
            cache.mkdir(parents=True, exist_ok=True)
            f.write_bytes(pickle.dumps(net))
        return net

    for r in rows:
        if r.source and (r.source, r.input_hwc) not in nets:
            nets[r.source, r.input_hwc] = build(r)

    def models(host: str) -> tuple[list, list, list]:
        used, out, skipped = [], [], []
        for r in rows:
            if r.group != host:
                continue
            if not r.source:
                skipped.append((r, "no constructor of the exact architecture (export_onnx.py)"))
                continue
            net = nets[r.source, r.input_hwc]
            used.append(r)
            out.append(TableModel(r.model, host, net.layers, net.chains, r.measured_s))
        return used, out, skipped

    out = Path(args.out)
    results = {}
    # 1. USB Accelerator: fit, leave-one-out
    used, ms, skipped = models(USB)
    usb = fit_table(ms, usb_spec, FIELDS, loss=loss, progress=say)
    run = TableFitRun(str(TABLE), USB, tuple(used), tuple(skipped), usb_spec, usb,
                      tuple(model_bound(m, usb.spec) for m in ms))
    con.rule("USB Accelerator (coral_edgetpu), fitted, leave-one-out")
    print_table_fit(con, run)
    results["usb"] = run
    # sensitivity, not in the fit: SqueezeNet v1.1 in place of the v1.0 the table uses
    sq11 = TableRow("SqueezeNet v1.1", str(HERE / "onnx" / "squeezenet1_1.onnx"), (224, 224, 3),
                    2.1e-3, USB)
    check_exports([sq11])
    net = table_network(sq11, usb_spec)
    t = predict_model_s(TableModel(sq11.model, USB, net.layers, net.chains, 2.1e-3), usb.spec)
    con.print(f"sensitivity: SqueezeNet v1.1 with the USB fit: {t * 1e3:.2f} ms "
              f"(measured 2.1 ms for the table's SqueezeNet)")
    # side figure, not in the fit: the SSDs at the table's label, 224x224, instead of the
    # 300x300 of Coral's files (the row's input; docs/results/fidelity.md)
    for model, fname, ms_ in (("MobileNet v1 SSD", "ssd_mobilenet_v1_224.onnx", 6.5e-3),
                              ("MobileNet v2 SSD", "ssd_mobilenet_v2_224.onnx", 7.2e-3)):
        side = TableRow(f"{model} (224x224)", str(HERE / "onnx" / fname), (224, 224, 3), ms_,
                        USB)
        check_exports([side])
        net = table_network(side, usb_spec)
        t = predict_model_s(TableModel(side.model, USB, net.layers, net.chains, ms_), usb.spec)
        con.print(f"side figure: {side.model} with the USB fit: {t * 1e3:.2f} ms "
                  f"(measured {ms_ * 1e3:.1f} ms for the 300x300 file)")

    # 2a. Dev Board predicted from the USB fit: the USB fit's numbers (the invocation overhead
    # of the same runtime), the Dev Board's own host facts (its CPU, its PCIe link: the
    # off-chip rate is the link's, so it stays the Dev Board preset's)
    used, ms, skipped = models(DEV)
    moved = {f: v for f, v in usb.fitted.items() if f != "memory.dram_bytes_per_s"}
    dev_from_usb = fields.replace(dev_spec, moved, name="coral_devboard_from_usb_fit")
    pred = [predict_model_s(m, dev_from_usb) for m in ms]
    meas = [m.measured_s for m in ms]
    con.rule("Dev Board (coral_devboard), predicted from the USB fit, no Dev Board data")
    for r, p in zip(used, pred):
        con.print(f"{r.model:22s} measured {r.measured_s * 1e3:7.1f} ms  predicted "
                  f"{p * 1e3:7.1f} ms  {(p / r.measured_s - 1) * 100:+6.1f} %")
    m = fit_metrics(meas, pred)
    con.print(f"MAPE {m['mape']:.1f} %, Spearman {m['spearman']:.3f}")
    # 2b. Dev Board: the link refitted on its own rows (leave-one-out), the rest from the USB fit
    dev = fit_table(ms, dev_from_usb, ["memory.dram_bytes_per_s"], loss=loss, progress=say,
                    name="coral_devboard_fitted")
    run_dev = TableFitRun(str(TABLE), DEV, tuple(used), tuple(skipped), dev_from_usb, dev,
                          tuple(model_bound(x, dev.spec) for x in ms))
    con.rule("Dev Board: link refitted on its own rows, leave-one-out")
    print_table_fit(con, run_dev)
    with staged_dir(out) as stage:
        for key, r in (("usb", run), ("dev_board", run_dev)):
            (stage / key).mkdir()
            write_table_fit(stage / key, r)
    say(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

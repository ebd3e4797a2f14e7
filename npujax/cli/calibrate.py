"""``npujax calibrate``: PTQ calibration of a saved model with a per-layer SQNR report."""

from __future__ import annotations

import argparse

from npujax._lazy import names
from npujax.cli._common import (
    add_progress_arg,
    bits_spec,
    console,
    epilog,
    output_dir,
    positive_int,
    precision_from_bits,
    seed,
)
from npujax.errors import ConfigError

#: The files ``npujax calibrate --out`` writes.
CALIBRATE_FILES = ("model_calibrated.npz", "sqnr.md", "sqnr.csv", "sqnr.png")


def add_parser(sub: argparse._SubParsersAction) -> None:
    OBSERVERS = names("npujax.calib.registry", "OBSERVERS")
    BIAS_CORRECTION_MODES = names("npujax.quantize.ptq", "BIAS_CORRECTION_MODES")

    ca = sub.add_parser(
        "calibrate", help="PTQ-calibrate a saved model, print per-layer SQNR",
        description="Calibrate activation ranges of a saved npujax model (model.npz) on real "
                    "data, apply bias correction and report the per-layer SQNR of the quantized "
                    "vs float outputs.",
        epilog=epilog("npujax calibrate runs/<timestamp>/model.npz --observer entropy",
                      "npujax calibrate model.npz --weight-bits 4 --act-bits 8 --out calib/"),
        formatter_class=argparse.RawDescriptionHelpFormatter)
    ca.add_argument("model", help="model file written by 'npujax demo' (model.npz)")
    ca.add_argument("--data", choices=("digits", "mnist5k"), default="digits")
    ca.add_argument("--observer", default="minmax", choices=tuple(OBSERVERS),
                    help="calibration observer (default minmax)")
    ca.add_argument("--weight-bits", action="append",
                    help="8 (default), or per layer: fc1=4,fc2=8 (layers not named keep 8)")
    ca.add_argument("--act-bits", action="append", help="8 (default), or per layer: conv1=8")
    ca.add_argument("--batches", type=positive_int, default=8,
                    help="calibration batches (default 8)")
    ca.add_argument("--batch-size", type=positive_int, default=64,
                    help="calibration batch size (default 64)")
    ca.add_argument("--seed", type=seed, default=0, help="seed of the data split (default 0)")
    ca.add_argument("--no-bias-correction", action="store_true")
    ca.add_argument("--bias-correction", choices=BIAS_CORRECTION_MODES, default="model",
                    help="what bias correction removes (as npujax quantize): each layer's mean "
                    "output shift in the quantized model, layer after layer (model, the "
                    "default), the weights' alone (weights), or with the layer's own input "
                    "quantization (layer)")
    add_progress_arg(ca)
    ca.add_argument("--out", help="write model_calibrated.npz and the SQNR report here")
    ca.set_defaults(fn=run)


def run(args: argparse.Namespace) -> int:
    from npujax._atomic import staged_dir
    from npujax.data.datasets import load_digits_nhwc, load_mnist5k_nhwc
    from npujax.quantize.model_file import load_graph, save_graph
    from npujax.quantize.ptq import layer_sqnr, ptq
    from npujax.report import sqnr_table, write_sqnr_report

    out = output_dir(args.out, CALIBRATE_FILES)
    graph, params, _, meta = load_graph(args.model)
    data = (load_digits_nhwc if args.data == "digits" else load_mnist5k_nhwc)(seed=args.seed)
    want = graph.tensors[graph.inputs[0]].shape[1:]
    if tuple(data.x_train.shape[1:]) != tuple(want):
        raise ConfigError(f"the model takes inputs of shape {tuple(want)} but --data {args.data} "
                          f"has {tuple(data.x_train.shape[1:])}; pick the data set it was "
                          "trained on.")
    spec = precision_from_bits(graph, bits_spec(args.weight_bits or "8"),
                               bits_spec(args.act_bits or "8"))
    bs = args.batch_size
    batches = [data.x_train[i * bs:(i + 1) * bs] for i in range(args.batches)]
    params, qstate = ptq(graph, params, batches, spec, observer=args.observer,
                         bias_correct=not args.no_bias_correction,
                         bias_correction_mode=args.bias_correction, progress=not args.no_progress)
    rows = layer_sqnr(graph, params, spec, qstate, batches[:4])
    con = console()
    bc = ("no bias correction" if args.no_bias_correction
          else f"bias correction {args.bias_correction}")
    con.print(sqnr_table(rows, f"per-layer SQNR, {args.observer}, {bc} (worst first)"))
    if out is not None:
        with staged_dir(out) as stage:
            save_graph(stage / "model_calibrated.npz", graph, params, qstate,
                       meta={**meta, "observer": args.observer,
                             "bias_correction": ("none" if args.no_bias_correction
                                                 else args.bias_correction),
                             "weight_bits": ",".join(args.weight_bits or ["8"]),
                             "act_bits": ",".join(args.act_bits or ["8"])})
            write_sqnr_report(stage, rows)
        con.print(f"wrote {', '.join(str(out / n) for n in CALIBRATE_FILES)}")
    return 0

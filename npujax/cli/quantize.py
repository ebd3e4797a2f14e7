"""``npujax quantize``: a float model to a deployable QDQ ONNX file, with a per-layer report."""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import Any

from npujax._lazy import names
from npujax.cli._common import (
    add_data_args,
    add_progress_arg,
    bits_spec,
    console,
    epilog,
    finite_float,
    output_dir,
    positive_int,
    precision_from_bits,
    seed,
)
from npujax.errors import ConfigError

_RULE = re.compile(r"(?:w(\d+))?(?:a(\d+))?")


class _MethodFlag(argparse.Action):
    """``--NAME`` of a registered PTQ method: appends NAME to ``ptq_methods`` (command-line
    order is the order the methods of a stage run in)."""

    def __init__(self, option_strings, dest, **kwargs):
        super().__init__(option_strings, dest, nargs=0, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        chosen = list(getattr(namespace, "ptq_methods", None) or [])
        if self.dest not in chosen:
            chosen.append(self.dest)
        namespace.ptq_methods = chosen


def add_parser(sub: argparse._SubParsersAction) -> None:
    OBSERVERS = names("npujax.calib.registry", "OBSERVERS")
    PTQ_DOCS = names("npujax.quantize.methods", "PTQ_METHODS", "__doc__")
    PTQ_STAGES = names("npujax.quantize.methods", "PTQ_METHODS", "stage")
    BIAS_CORRECTION_MODES = names("npujax.quantize.ptq", "BIAS_CORRECTION_MODES")

    qu = sub.add_parser(
        "quantize", help="quantize a float model to a QDQ ONNX file with a per-layer report",
        description="Post-training quantization of an ONNX, saved (model.npz) or Keras model: "
                    "optional PTQ methods, calibration, bias correction, optionally an "
                    "accuracy-bounded loop that returns the most sensitive layers to higher "
                    "precision; writes model.qdq.onnx (checked in onnxruntime at every graph "
                    "optimization level against npujax's fake-quant outputs), layers.csv "
                    "(per-layer SQNR, weight-only vs activation-only sensitivity, bits, "
                    "latency), report.md and quantize.json (accuracy, modelled latency).",
        epilog=epilog(
            "npujax quantize runs/<timestamp>/model.npz --data digits --out quant/",
            "npujax quantize model.npz --weight-bits 4 --act-bits 8 --max-drop 1 --out q4/",
            "npujax quantize model.onnx --input-shape x=1,3,32,32 --data images/ --method "
            "entropy --rule '^conv1$:w8a8' --rule '.*:w4a8' --out q/",
            "npujax quantize model.npz --policy policy.json --npu bitserial_16x16 --out q/"),
        formatter_class=argparse.RawDescriptionHelpFormatter)
    qu.add_argument("model", help="an .onnx model, zoo:ppocr_cls / zoo:ppocr_det / zoo:ppocr_rec, "
                    "a model.npz written by 'npujax demo', or keras:NAME[:key=value...]")
    add_data_args(qu)
    qu.set_defaults(data=None)
    for action in qu._actions:
        if action.dest == "data":
            action.help = ("digits (default for model.npz), mnist5k, text, photos or lines "
                           "(images generated at the model's input size; lines: text lines as "
                           "PP-OCR rec's preprocessing makes them), FILE.npy / FILE.npz ('x' "
                           "inputs in the model's layout, optional 'y' int labels), or a folder "
                           "of images (resized, scaled as --image-normalization says, [-1, 1] by "
                           "default; labels from sub-folders named 0, 1, ...; see docs/quant.md)")
    precision = qu.add_argument_group("precision (one of: widths, rules, a policy)")
    precision.add_argument("--weight-bits", action="append",
                           help="8 (default), or per layer: fc1=4,fc2=8 (layers not named keep 8)")
    precision.add_argument("--act-bits", action="append", help="8 (default), or per layer")
    precision.add_argument("--rule", action="append", metavar="REGEX:wWaA",
                           help="a rule: layers whose name matches REGEX (searched) get W-bit "
                           "weights and A-bit inputs (w4a8; w8 alone keeps float inputs; "
                           "'float' keeps the layer float); the first matching rule wins, layers "
                           "no rule matches stay float; repeatable")
    precision.add_argument("--policy", help="a precision policy JSON written by 'npujax search'")
    qu.add_argument("--method", choices=OBSERVERS, default="minmax",
                    help="calibration observer (default minmax)")
    methods = qu.add_argument_group(
        "PTQ methods (pre-calibration ones rewrite the float model, post-calibration ones choose "
        "the weights; each stage runs in the order given)")
    for name, doc in PTQ_DOCS.items():
        # the docstring's first paragraph, without its pointers to the source
        doc = " ".join((doc or name).strip().split("\n\n")[0].split())
        doc = doc.replace("; see the module docstring", "").replace(
            " (see the module docstring)", "")
        methods.add_argument(f"--{name}", dest=name, action=_MethodFlag,
                             help=f"{doc} ({PTQ_STAGES[name].replace('_', '-')})")
    qu.add_argument("--no-bias-correction", action="store_true",
                    help="skip the empirical bias correction after calibration")
    qu.add_argument("--bias-correction", choices=BIAS_CORRECTION_MODES, default=None,
                    help="what bias correction removes: each layer's mean output shift in the "
                    "quantized model, layer after layer (model, the default), or the shift "
                    "its weight quantization alone causes (weights), or with its own input "
                    "quantization (layer)")
    qu.add_argument("--no-bias-correction-guard", action="store_true",
                    help="apply the bias correction even where it lowers the quantized model's "
                    "output SQNR against float on the calibration data (by default the "
                    "uncorrected biases are then kept, and the report says so)")
    qu.add_argument("--calib-examples", type=positive_int, default=256,
                    help="calibration examples from the training split (default 256)")
    qu.add_argument("--batch-size", type=positive_int, default=64,
                    help="examples per batch (default 64)")
    qu.add_argument("--max-drop", type=finite_float(0.0, low_open=False), metavar="POINTS",
                    help="with labels: return the most sensitive layers to 8 bits, then float, "
                    "until the accuracy drop is at most POINTS")
    qu.add_argument("--npu", default="edge_16x16",
                    help="preset name or TOML path for the modelled latency (default edge_16x16; "
                    "'none' skips it)")
    qu.add_argument("--requantize-outputs", action="store_true",
                    help="also requantize GEMM outputs to their consumer's grid in the file "
                    "(onnxruntime then runs them in integer kernels, as the integer path does; "
                    "differs more from fake-quant: raise --ort-tolerance)")
    qu.add_argument("--no-ort-check", action="store_true",
                    help="skip running the file in onnxruntime (needed when it is not installed)")
    qu.add_argument("--ort-tolerance", type=finite_float(), default=None,
                    help="allowed max |onnxruntime - npujax fake-quant| as a fraction of the "
                    "largest float output (default 0.02)")
    qu.add_argument("--seed", type=seed, default=0, help="seed of the data split (default 0)")
    qu.add_argument("--out", required=True, help="write the files here (all or none)")
    add_progress_arg(qu)
    qu.set_defaults(fn=run, ptq_methods=[])


def parse_rule(text: str) -> Any:
    """``REGEX:w4a8`` (``w8``, ``a8``, ``float``) as a :class:`npujax.QuantRule`.

    Raises:
      ConfigError: no ``:``, or a precision that is not ``wN``, ``aN``, ``wNaN`` or ``float``.
    """
    from npujax.quantize.rules import QuantRule

    pattern, sep, prec = text.rpartition(":")
    m = _RULE.fullmatch(prec.strip().lower())
    if not sep or not pattern or (prec.strip().lower() != "float" and (m is None or not any(
            m.groups()))):
        raise ConfigError(f"--rule {text!r}: write REGEX:w4a8 (weights 4, inputs 8 bits), "
                          "REGEX:w8 (float inputs), REGEX:a8 or REGEX:float.")
    if prec.strip().lower() == "float":
        return QuantRule(pattern=pattern, skip=True)
    assert m is not None
    w, a = (None if g is None else int(g) for g in m.groups())
    return QuantRule(pattern=pattern, weight_bits=w, act_bits=a)


def precision(args: argparse.Namespace, graph: Any) -> tuple[dict[str, Any], str]:
    """The QuantSpec and its label from ``--weight-bits/--act-bits``, ``--rule`` or ``--policy``.

    Raises:
      ConfigError: more than one of the three given; see :func:`parse_rule`,
        :func:`npujax.search.load_policy`.
    """
    given = [f for f, v in (("--weight-bits/--act-bits", args.weight_bits or args.act_bits),
                            ("--rule", args.rule), ("--policy", args.policy)) if v]
    if len(given) > 1:
        raise ConfigError(f"give the precision one way: {' or '.join(given)}, not both.")
    if args.rule:
        from npujax.quantize.rules import quant_spec_from_rules

        return quant_spec_from_rules(graph, [parse_rule(r) for r in args.rule]), \
            f"rules {' '.join(args.rule)}"
    if args.policy:
        from npujax.search import load_policy

        return load_policy(args.policy).quant_spec(graph), f"policy {Path(args.policy).name}"
    w, a = bits_spec(args.weight_bits or "8"), bits_spec(args.act_bits or "8")
    label = f"W{','.join(args.weight_bits or ['8'])} A{','.join(args.act_bits or ['8'])}"
    return precision_from_bits(graph, w, a), label


def run(args: argparse.Namespace) -> int:
    from npujax.frontends.onnx import parse_input_shapes
    from npujax.report.quantize import describe_vs_float, guard_line, layers_table
    from npujax.workflows.inputs import load_model_and_data
    from npujax.workflows.quantize import (
        ORT_TOLERANCE,
        QUANTIZE_FILES,
        QuantizeConfig,
        method_instances,
        quantize_model,
        write_quantize_outputs,
    )

    if args.no_bias_correction and (args.bias_correction or args.no_bias_correction_guard):
        other = ("--bias-correction " + args.bias_correction if args.bias_correction
                 else "--no-bias-correction-guard")
        raise ConfigError(f"--no-bias-correction skips the correction, {other} sets how it "
                          "runs: give one of them.")
    args.bias_correction = args.bias_correction or "model"
    out = output_dir(args.out, QUANTIZE_FILES)
    assert out is not None
    config = QuantizeConfig(
        observer=args.method, methods=method_instances(args.ptq_methods),
        bias_correction=not args.no_bias_correction,
        bias_correction_mode=args.bias_correction,
        bias_correction_guard=not args.no_bias_correction_guard,
        calib_examples=args.calib_examples,
        batch_size=args.batch_size, max_drop=args.max_drop,
        npu=None if args.npu == "none" else args.npu,
        requantize_outputs=args.requantize_outputs, ort_check=not args.no_ort_check,
        ort_tolerance=ORT_TOLERANCE if args.ort_tolerance is None else args.ort_tolerance,
        progress=not args.no_progress)
    m = load_model_and_data(args.model, data=args.data, examples=args.examples,
                            image_normalization=args.image_normalization,
                            input_shapes=parse_input_shapes(args.input_shape or []),
                            seed=args.seed, calibrate_act_bits=None,
                            progress=not args.no_progress)
    quant, label = precision(args, m.graph)
    result = quantize_model(m.graph, m.params, quant, m.x_train, m.x_test, m.y_test, config,
                            y_calib=m.y_train)
    name = Path(str(args.model)).name
    title = f"{name}, {label}, {args.method} calibration" + "".join(
        f", {n}" for n in args.ptq_methods) + (
        ", no bias correction" if args.no_bias_correction
        else f", bias correction {args.bias_correction}")
    files = write_quantize_outputs(out, result, title)
    con = console()
    con.print(layers_table(result.layers, f"{title} (worst layer first)"))
    if result.float_accuracy is not None:
        con.print(f"accuracy: float {result.float_accuracy:.2f} %, quantized "
                  f"{result.accuracy:.2f} % on {result.examples['evaluation']} held-out "
                  "examples")
    for n in result.notes:  # what each PTQ method did (or found nothing to do), as in report.md
        con.print(f"note: {n}")
    bc = result.calibration.get("bias_correction_guard")
    if bc is not None:
        con.print(guard_line(bc, result.calibration["bias_correction"]))
    if result.vs_float is not None:
        con.print(f"against float: {describe_vs_float(result.vs_float)}")
    if result.control is not None:
        c = result.control
        back = ", ".join(
            f"{s.layer}->" + ("float" if s.after is None else f"W{s.after[0]}A{s.after[1]}")
            for s in c.steps) or "none"
        con.print(f"accuracy control (max drop {c.max_drop:g}): {'met' if c.met else 'NOT met'}"
                  f"; returned {back}")
    if result.latency_s is not None:
        con.print(f"modelled latency on {result.npu}: {result.latency_s * 1e6:.3f} µs")
    if result.ort is not None:
        worst = max(float(v["max_abs_diff"] or 0.0) for v in result.ort.values())
        beyond = max(int(v.get("examples_beyond_bound") or 0) for v in result.ort.values())
        con.print(f"onnxruntime (4 optimization levels): max |diff| {worst:.3g}, bound "
                  f"{result.ort_bound:.3g}" + (f" (exceeded on {beyond} example(s): a rounding "
                                               "tie)" if beyond else ""))
    con.print(f"wrote {', '.join(str(out / f) for f in files)}")
    return 0

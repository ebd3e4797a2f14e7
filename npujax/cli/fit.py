"""``npujax fit``: fit a hardware preset to a measured per-layer profile."""

from __future__ import annotations

import argparse
import logging

from npujax._lazy import names
from npujax.cli._common import add_progress_arg, console, epilog, output_dir, positive_int
from npujax.errors import ConfigError

_log = logging.getLogger("npujax.fit")


def add_parser(sub: argparse._SubParsersAction) -> None:
    FITTABLE = names("npujax.plan.fit", "FITTABLE")

    fp = sub.add_parser(
        "fit", help="fit a preset's numbers to a measured per-layer profile",
        description="Fit the chosen numeric fields of a hardware preset (and, if allowed, an "
                    "efficiency factor per op class and a fixed per-layer overhead) to a "
                    "measured per-layer latency profile, by gradient descent (Adam) on the "
                    "log-latency error through the differentiable cost model, each value kept in "
                    "its physical range. PROFILE is a 'layer,latency_s' CSV (layer names as "
                    "'npujax lower' prints them, or ONNX node names: the nodes of one layer are "
                    "summed) or an onnxruntime profiling JSON. Writes the fitted preset "
                    "(fitted.toml, accepted by every --npu), fit.json, fit_layers.csv and the "
                    "scatter plot fit.png to --out. With --table instead: whole-model times of "
                    "a benchmark table, up to 5 fields fitted by robust (soft_l1, --loss) least "
                    "squares on log ratios through the relaxed cost model, judged "
                    "leave-one-out (fitted.toml, predictions.csv, fit.json, predictions.png). "
                    "See docs/fit.md.",
        epilog=epilog(
            "npujax fit --table experiments/fidelity/coral_edgetpu_table1.csv --group "
            "usb_accelerator_desktop --npu coral_edgetpu --params "
            "dram_bytes_per_s,invocation_overhead_s --out coral_fit/",
            "npujax fit profile.csv --model zoo:ppocr_cls --input-shape x=1,3,48,192 --npu "
            "edge_16x16 --params clock_hz,dram_bytes_per_s --out fitted/",
            "npujax fit onnxruntime_profile.json --model det.onnx --input-shape x=1,3,640,640 "
            "--npu cpu_preset.toml --params clock_hz,dram_bytes_per_s,lanes --efficiency "
            "--overhead --out cpu_fit/",
            "npujax lower zoo:ppocr_cls --input-shape x=1,3,48,192 --npu fitted/fitted.toml"),
        formatter_class=argparse.RawDescriptionHelpFormatter)
    fp.add_argument("profile", nargs="?",
                    help="measured profile: a 'layer,latency_s' CSV or an onnxruntime "
                    "profiling JSON (or give --table instead)")
    fp.add_argument("--model",
                    help="the profiled model: an .onnx file, zoo:NAME, keras:NAME or a "
                    "model.npz (with a profile)")
    fp.add_argument("--table", metavar="FILE.csv",
                    help="fit to whole-model times instead: a benchmark table with columns "
                    "model, measured_ms and optionally source (the model to build: keras:NAME, "
                    "zoo:NAME, an .onnx file; default the model column), input_shape "
                    "(224x224x3) and group or host; reports leave-one-out predictions "
                    "(docs/fit.md)")
    fp.add_argument("--group", help="with --table: fit the rows of this group (host) only")
    fp.add_argument("--loss", choices=names("npujax.plan.fit_table", "TABLE_LOSSES"),
                    default=None,
                    help="with --table: the loss of the log ratios log(predicted/measured) "
                    "(default soft_l1: robust, a row the model cannot explain pulls the fit "
                    "less; linear: least squares; huber, cauchy, arctan: scipy's)")
    fp.add_argument("--loss-scale", type=float, default=None, metavar="F",
                    help="with --table: the robust loss's scale in log ratio, errors well "
                    "beyond it count about linearly (default 0.1, a benchmark table's noise)")
    fp.add_argument("--input-shape", action="append", metavar="NAME=1,3,224,224",
                    help="static shape of an ONNX input (repeat for several inputs)")
    fp.add_argument("--npu", default="edge_16x16",
                    help="starting preset, name or TOML path (default: edge_16x16)")
    fp.add_argument("--params", required=True,
                    help="comma-separated fields to fit: "
                    + ", ".join(f.partition(".")[2] for f in FITTABLE))
    fp.add_argument("--bound", action="append", metavar="FIELD=LO:HI",
                    help="narrow a field's fit range (default: its physical range)")
    fp.add_argument("--efficiency", action="store_true",
                    help="also fit an efficiency factor per op class (conv, depthwise, matmul, "
                    "vector, layout, cpu); reported in fit.json, not in the preset")
    fp.add_argument("--overhead", action="store_true",
                    help="also fit a fixed per-layer overhead (s); reported in fit.json")
    fp.add_argument("--bits", type=positive_int, default=8,
                    help="width of every layer's weights and activations (default 8; 32 for "
                    "an fp32 runtime such as onnxruntime on a CPU)")
    fp.add_argument("--steps", type=positive_int, default=None,
                    help="Adam steps of a per-layer fit (default 400)")
    fp.add_argument("--learning-rate", type=float, default=None,
                    help="peak Adam learning rate on the bounded parameters (default 0.1)")
    fp.add_argument("--skip-unmatched", action="store_true",
                    help="skip (and list) profile names that match no layer instead of failing")
    fp.add_argument("--name", help="name of the fitted preset (default: <npu>_fitted)")
    fp.add_argument("--out", required=True, help="folder for fitted.toml and the report")
    add_progress_arg(fp)
    fp.set_defaults(fn=run)


def _bounds(specs: list[str] | None) -> dict[str, tuple[float, float]]:
    from npujax.plan.fit import resolve_fields

    out: dict[str, tuple[float, float]] = {}
    for s in specs or []:
        name, sep, rng = s.partition("=")
        lo, sep2, hi = rng.partition(":")
        try:
            if not (sep and sep2):
                raise ValueError
            out[resolve_fields([name])[0]] = (float(lo), float(hi))
        except ValueError:
            raise ConfigError(f"--bound {s!r}: write FIELD=LO:HI, e.g. clock_hz=1e8:5e9.") \
                from None
    return out


def run(args: argparse.Namespace) -> int:
    from npujax._atomic import staged_dir
    from npujax._progress import progress_bar
    from npujax.frontends.onnx import parse_input_shapes
    from npujax.workflows.fit import fit_profile, print_fit, write_fit

    if args.table:
        return _run_table(args)
    if not args.profile or not args.model:
        raise ConfigError("give a measured PROFILE and its --model, or a benchmark --table.")
    for flag, given in (("--group", args.group), ("--loss", args.loss),
                        ("--loss-scale", args.loss_scale)):
        if given is not None:
            raise ConfigError(f"{flag} applies to --table (a per-layer profile is fitted by "
                              "Adam on the mean squared log error).")
    args.steps = 400 if args.steps is None else args.steps
    args.learning_rate = 0.1 if args.learning_rate is None else args.learning_rate
    if not args.learning_rate > 0:
        raise ConfigError(f"--learning-rate must be > 0, got {args.learning_rate}.")
    from npujax.plan.fit import FitConfig, resolve_fields

    fields = resolve_fields([f for f in args.params.split(",") if f.strip()])  # fail fast
    config = FitConfig(efficiency=args.efficiency, overhead=args.overhead,
                       bounds=_bounds(args.bound), steps=args.steps,
                       learning_rate=args.learning_rate, name=args.name, bits=args.bits)
    out = output_dir(args.out)
    assert out is not None
    shapes = parse_input_shapes(args.input_shape or [])
    every = max(1, args.steps // 8)
    with progress_bar(not args.no_progress, "fit", args.steps) as advance:
        def progress(step: int, loss: float) -> None:
            advance(loss)
            if step % every == 0 or step == args.steps:
                _log.info("fit: step %d/%d, loss (mean squared log error) %.6g", step,
                          args.steps, loss)

        result = fit_profile(args.profile, args.model, args.npu, fields, config=config,
                             input_shapes=shapes,
                             on_unmatched="skip" if args.skip_unmatched else "error",
                             progress=progress)
    con = console()
    print_fit(con, result)
    with staged_dir(out) as stage:
        names = write_fit(stage, result)
    con.print(f"wrote {', '.join(str(out / n) for n in names)}")
    return 0


def _run_table(args: argparse.Namespace) -> int:
    """``npujax fit --table``: the model-level fit with leave-one-out predictions."""
    from npujax._atomic import staged_dir
    from npujax._progress import note
    from npujax.plan.fit import resolve_fields
    from npujax.workflows.fit_table import fit_benchmark_table, print_table_fit, write_table_fit

    if args.profile or args.model:
        raise ConfigError("--table replaces PROFILE and --model: the table names its models.")
    for flag, given in (("--efficiency", args.efficiency), ("--overhead", args.overhead),
                        ("--bound", args.bound), ("--skip-unmatched", args.skip_unmatched),
                        ("--input-shape", args.input_shape), ("--steps", args.steps),
                        ("--learning-rate", args.learning_rate)):
        if given is not None and given is not False:
            raise ConfigError(f"{flag} applies to a per-layer profile, not to --table (a "
                              "table's models are fitted through preset fields only, by "
                              "(robust) least squares).")
    fields = resolve_fields([f for f in args.params.split(",") if f.strip()])
    from npujax.plan.fit_table import TABLE_LOSS, TABLE_LOSS_SCALE

    loss = args.loss or TABLE_LOSS
    loss_scale = TABLE_LOSS_SCALE if args.loss_scale is None else args.loss_scale
    out = output_dir(args.out)
    assert out is not None
    con = console()

    def progress(line: str) -> None:  # plain lines on stderr: a table fit takes minutes
        note(f"fit: {line}", not args.no_progress)

    run_ = fit_benchmark_table(
        args.table, args.npu, fields, group=args.group, bits=args.bits, loss=loss,
        loss_scale=loss_scale, name=args.name, progress=progress)
    print_table_fit(con, run_)
    with staged_dir(out) as stage:
        names = write_table_fit(stage, run_)
    con.print(f"wrote {', '.join(str(out / n) for n in names)}")
    return 0

"""The ``npujax`` command line: thin argument parsing over the public API.

Every :class:`~npujax.errors.NpujaxError` becomes a one-line ``npujax: error: ...`` message on
stderr and the error's exit code (2 config, 3 quantization, 4 calibration, 5 graph, 6 unsupported
op, 7 shape); there is never a traceback for bad input.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from npujax.errors import ConfigError, NpujaxError

__all__ = ["main"]


def _console():
    from rich.console import Console

    # Pipes and CI logs get a wide fixed width so the per-layer table is not truncated.
    return Console(width=None if sys.stdout.isatty() else 150)


def _bits(text: str) -> int | dict[str, int]:
    """``8`` or ``fc1=4,fc2=8`` (layers not named keep 8 bits)."""
    try:
        if "=" not in text:
            return int(text)
        pairs = [kv.split("=", 1) for kv in text.split(",")]
        out = {k.strip(): int(v) for k, v in pairs}
    except ValueError:
        raise ConfigError(
            f"bad bit-width spec {text!r}; use a number (8) or layer=bits pairs (fc1=4,fc2=8)."
        ) from None
    if len(out) != len(pairs):
        raise ConfigError(f"bit-width spec {text!r} names a layer twice.")
    return out


def _cmd_demo(args: argparse.Namespace) -> int:
    from npujax.demo.pipeline import DemoConfig, run_demo

    overrides = {k: v for k, v in {
        "float_epochs": args.epochs, "qat_steps": args.qat_steps,
        "search_steps": args.search_steps, "finetune_steps": args.finetune_steps,
    }.items() if v is not None}
    config = DemoConfig(npu=args.npu, out=args.out, seed=args.seed,
                        progress=not args.no_progress, **overrides)
    run_demo(config, console=_console())
    return 0


def _cmd_lower(args: argparse.Namespace) -> int:
    from npujax.graph import load_graph
    from npujax.hw import DATAFLOWS, load_npu_spec
    from npujax.plan import lower
    from npujax.report import (
        dataflow_table,
        layer_table,
        plot_breakdown,
        plot_layer_latency,
        plot_roofline,
        write_json,
        write_layers_csv,
    )

    wbits = _bits(args.weight_bits) if args.weight_bits not in (None, "saved") else 8
    abits = _bits(args.act_bits) if args.act_bits else 8
    spec = load_npu_spec(args.npu)
    graph, _, _, meta = load_graph(args.model)
    if args.weight_bits == "saved":
        if "mixed_precision_policy" not in meta:
            raise ConfigError(f"{args.model} holds no saved precision policy; pass --weight-bits "
                              "8 or layer=bits pairs.")
        wbits = meta["mixed_precision_policy"]
    kw = dict(weight_bits=wbits, act_bits=abits, batch=args.batch)
    schedule = lower(graph, spec, dataflow=args.dataflow, **kw)
    by_df = {df: lower(graph, spec, dataflow=df, **kw) for df in DATAFLOWS}
    console = _console()
    console.print(layer_table(schedule, f"{Path(args.model).name} on {spec.name} "
                                        f"({schedule.dataflow})"))
    console.print(dataflow_table(by_df, reference=schedule.dataflow))
    if args.out:
        out = Path(args.out)
        write_json(out / "schedule.json", {**schedule.to_dict(), "dataflow_latency_s":
                                           {df: s.latency_s for df, s in by_df.items()}})
        write_layers_csv(out / "layers.csv", schedule)
        plot_layer_latency(out / "layer_latency.png", {schedule.dataflow: schedule})
        plot_breakdown(out / "breakdown.png", schedule)
        plot_roofline(out / "roofline.png", schedule, spec.peak_macs_per_s,
                      spec.memory.dram_bytes_per_s)
        console.print(f"wrote {out}/schedule.json, layers.csv, layer_latency.png, "
                      "breakdown.png, roofline.png")
    return 0


def _cmd_search(args: argparse.Namespace) -> int:
    from npujax.demo.data import load_digits_nhwc
    from npujax.graph import load_graph
    from npujax.hw import load_npu_spec
    from npujax.search import save_policy, search_precision

    cands = _int_list(args.candidates, "--candidates")
    acts = _int_list(args.act_candidates, "--act-candidates")
    spec = load_npu_spec(args.npu)
    graph, params, qstate, _ = load_graph(args.model)
    if not qstate:
        raise ConfigError(f"{args.model} has no calibration state; save the model with its "
                          "qstate (as 'npujax demo' does).")
    data = load_digits_nhwc(seed=args.seed)
    policy = search_precision(
        graph, params, spec, data.x_train, data.y_train, qstate, method=args.method,
        budget_s=args.budget_latency, budget_ratio=args.budget_ratio, candidates=cands,
        act_candidates=acts, steps=args.steps, sensitivity_samples=args.sensitivity_samples,
        seed=args.seed, progress=True)
    m = policy.meta
    print(f"{m['method']} on {m['npu']}: latency {m['latency_s'] * 1e6:.3f} µs "
          f"(budget {m['budget_s'] * 1e6:.3f} µs, INT8 {m['int8_latency_s'] * 1e6:.3f} µs, "
          f"{m['speedup_vs_int8']:.2f}x faster)")
    for layer in policy.weight_bits:
        print(f"  {layer:<16} W{policy.weight_bits[layer]} A{policy.act_bits[layer]}")
    save_policy(args.out, policy)
    print(f"wrote {args.out}")
    return 0


def _int_list(text: str, flag: str) -> tuple[int, ...]:
    try:
        return tuple(int(v) for v in text.split(","))
    except ValueError:
        raise ConfigError(
            f"{flag} takes comma-separated integers (e.g. 2,4,8), got {text!r}.") from None


def _cmd_presets(args: argparse.Namespace) -> int:
    from npujax.hw import list_presets, load_npu_spec

    for name in list_presets():
        print(f"{name:<20} {load_npu_spec(name).description}")
    return 0


def _cmd_calibrate(args: argparse.Namespace) -> int:
    from npujax.demo.data import load_digits_nhwc, load_mnist5k_nhwc
    from npujax.graph import layer_sqnr, load_graph, ptq, quant_spec, save_graph
    from npujax.report import sqnr_table, write_sqnr_report

    graph, params, _, meta = load_graph(args.model)
    data = (load_digits_nhwc if args.data == "digits" else load_mnist5k_nhwc)(seed=args.seed)
    want = graph.tensors[graph.inputs[0]].shape[1:]
    if tuple(data.x_train.shape[1:]) != tuple(want):
        raise ConfigError(f"the model takes inputs of shape {tuple(want)} but --data {args.data} "
                          f"has {tuple(data.x_train.shape[1:])}; pick the data set it was "
                          "trained on.")
    spec = quant_spec(graph, _bits(args.weight_bits), _bits(args.act_bits))
    bs = args.batch_size
    batches = [data.x_train[i * bs:(i + 1) * bs] for i in range(args.batches)]
    params, qstate = ptq(graph, params, batches, spec, observer=args.observer,
                         bias_correct=not args.no_bias_correction, progress=not args.no_progress)
    rows = layer_sqnr(graph, params, spec, qstate, batches[:4])
    console = _console()
    console.print(sqnr_table(rows, f"per-layer SQNR, {args.observer} calibration (worst first)"))
    if args.out:
        out = Path(args.out)
        save_graph(out / "model_calibrated.npz", graph, params, qstate,
                   meta={**meta, "observer": args.observer, "weight_bits": args.weight_bits,
                         "act_bits": args.act_bits})
        write_sqnr_report(out, rows)
        console.print(f"wrote {out}/model_calibrated.npz, sqnr.md, sqnr.csv, sqnr.png")
    return 0


def _cmd_qat(args: argparse.Namespace) -> int:
    import json

    from npujax._atomic import atomic_write_text
    from npujax.qat import load_qat_config, results_markdown, run_qat_experiment

    overrides = {"progress": not args.no_progress}
    config = load_qat_config(args.config, **overrides)
    console = _console()
    result = run_qat_experiment(config, console=console, out_dir=args.out)
    text = results_markdown([result])
    console.print(text)
    if args.out:
        out = Path(args.out)
        atomic_write_text(out / "quantization.md", text)
        atomic_write_text(out / "quantization.json", json.dumps(result, indent=1, default=str))
        console.print(f"wrote {out}/quantization.md, quantization.json")
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (exposed for documentation and tests)."""
    p = argparse.ArgumentParser(
        prog="npujax",
        description="Differentiable NPU modelling in JAX: QAT, mixed-precision search and "
                    "per-layer latency on a systolic-array NPU.",
    )
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    d = sub.add_parser("demo", help="train, quantize, search and lower a CNN on the digits data",
                       description="End-to-end run on scikit-learn's digits: float training, "
                                   "PTQ INT8, QAT W8A8, mixed-precision search, NPU lowering.")
    d.add_argument("--npu", default="edge_16x16", help="preset name or TOML path "
                   "(default: edge_16x16)")
    d.add_argument("--out", help="output folder (default: a new runs/<timestamp> folder)")
    d.add_argument("--seed", type=int, default=0)
    d.add_argument("--epochs", type=int, help="float training epochs (default 30)")
    d.add_argument("--qat-steps", type=int, help="QAT steps (default 300)")
    d.add_argument("--search-steps", type=int, help="precision search steps (default 300)")
    d.add_argument("--finetune-steps", type=int, help="fine-tune steps after search (default 300)")
    d.add_argument("--no-progress", action="store_true", help="hide progress bars")
    d.set_defaults(fn=_cmd_demo)

    lo = sub.add_parser("lower", help="per-layer NPU latency of a saved model",
                        description="Lower a saved npujax model (model.npz from 'npujax demo') "
                                    "onto a hardware preset and print the per-layer table.")
    lo.add_argument("model", help="model file written by 'npujax demo' (model.npz)")
    lo.add_argument("--npu", default="edge_16x16", help="preset name or TOML path")
    lo.add_argument("--dataflow", help="override the preset's dataflow "
                    "(weight_stationary, output_stationary, input_stationary)")
    lo.add_argument("--weight-bits", help="8 (default), per layer: fc1=4,fc2=8, or 'saved' for "
                    "the mixed-precision policy stored in the model file")
    lo.add_argument("--act-bits", help="8, or per layer: conv1=8")
    lo.add_argument("--batch", type=int, help="inference batch size (default: the model's)")
    lo.add_argument("--out", help="write schedule.json, layers.csv and plots (per-layer latency, "
                    "stacked breakdown, roofline) here")
    lo.set_defaults(fn=_cmd_lower)

    ca = sub.add_parser("calibrate", help="PTQ-calibrate a saved model, print per-layer SQNR",
                        description="Calibrate activation ranges of a saved npujax model "
                                    "(model.npz) on real data, apply bias correction and report "
                                    "the per-layer SQNR of the quantized vs float outputs.")
    ca.add_argument("model", help="model file written by 'npujax demo' (model.npz)")
    ca.add_argument("--data", choices=("digits", "mnist5k"), default="digits")
    ca.add_argument("--observer", default="minmax",
                    help="minmax, ema, percentile, mse or entropy (default minmax)")
    ca.add_argument("--weight-bits", default="8", help="8, or per layer: fc1=4,fc2=8")
    ca.add_argument("--act-bits", default="8", help="8, or per layer: conv1=8")
    ca.add_argument("--batches", type=int, default=8, help="calibration batches (default 8)")
    ca.add_argument("--batch-size", type=int, default=64)
    ca.add_argument("--seed", type=int, default=0)
    ca.add_argument("--no-bias-correction", action="store_true")
    ca.add_argument("--no-progress", action="store_true", help="hide progress bars")
    ca.add_argument("--out", help="write model_calibrated.npz and the SQNR report here")
    ca.set_defaults(fn=_cmd_calibrate)

    qa = sub.add_parser("qat", help="QAT fine-tuning vs PTQ observers, from a config file",
                        description="Train a CNN, then compare PTQ (min-max, percentile, MSE, "
                                    "entropy) with QAT at W8A8/W4A8/W4A4 as the TOML config says "
                                    "(keys: the fields of npujax.qat.QATConfig).")
    qa.add_argument("--config", required=True, help="TOML file (see "
                    "experiments/qat_finetune/config.toml)")
    qa.add_argument("--out", help="write quantization.md/.json and SQNR reports here")
    qa.add_argument("--no-progress", action="store_true", help="hide progress bars")
    qa.set_defaults(fn=_cmd_qat)

    se = sub.add_parser("search", help="choose per-layer bit widths for a latency budget",
                        description="Mixed-precision search on a saved model (model.npz from "
                                    "'npujax demo', trained on the digits data): per-layer "
                                    "weight/activation widths that meet a latency budget on "
                                    "the NPU, written as a policy JSON file.")
    se.add_argument("model", help="model file written by 'npujax demo' (model.npz)")
    se.add_argument("--npu", default="edge_16x16", help="preset name or TOML path")
    se.add_argument("--method", default="ilp", choices=["ilp", "greedy", "gradient"],
                    help="ilp: HAWQ-V3 integer program; greedy: by sensitivity; gradient: "
                         "learned widths (default ilp)")
    budget = se.add_mutually_exclusive_group()
    budget.add_argument("--budget-latency", type=float, help="latency budget in seconds")
    budget.add_argument("--budget-ratio", type=float, default=0.75,
                        help="budget as a fraction of the INT8 latency (default 0.75)")
    se.add_argument("--candidates", default="2,4,8", help="weight widths (default 2,4,8)")
    se.add_argument("--act-candidates", default="8", help="activation widths (default 8)")
    se.add_argument("--steps", type=int, default=300, help="gradient-search steps")
    se.add_argument("--sensitivity-samples", type=int, default=16,
                    help="Hutchinson probes for the Hessian traces (ilp, greedy; default 16)")
    se.add_argument("--seed", type=int, default=0)
    se.add_argument("--out", default="policy.json", help="policy file (default policy.json)")
    se.set_defaults(fn=_cmd_search)

    pr = sub.add_parser("presets", help="list the installed hardware presets")
    pr.set_defaults(fn=_cmd_presets)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``npujax`` console script; returns the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.fn(args) or 0)
    except NpujaxError as e:
        print(f"npujax: error: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print("npujax: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

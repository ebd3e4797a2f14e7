"""``npujax qat``: the QAT-vs-PTQ experiment from a config file, or QAT of a model with a
precision policy."""

from __future__ import annotations

import argparse
import contextlib
import json

from npujax.cli._common import (
    add_data_args,
    add_devices_arg,
    add_progress_arg,
    console,
    epilog,
    output_dir,
    positive_int,
    seed,
)
from npujax.errors import ConfigError


def add_parser(sub: argparse._SubParsersAction) -> None:
    qa = sub.add_parser(
        "qat", help="QAT vs PTQ experiment from a config file, or QAT of a model with a "
                    "precision policy",
        description="--config FILE: train a CNN, then compare PTQ (min-max, percentile, MSE, "
                    "entropy) with QAT at W8A8/W4A8/W4A4 as the TOML config says (keys: the "
                    "fields of QATConfig). --policy FILE --model MODEL: QAT-fine-tune a saved or "
                    "ONNX model with a policy from 'npujax search' and report accuracy and "
                    "modelled latency.",
        epilog=epilog(
            "npujax qat --config experiments/qat_finetune/config.toml --out qat_results/",
            "npujax qat --policy runs/policy.json --model runs/<timestamp>/model.npz "
            "--npu bitserial_16x16"),
        formatter_class=argparse.RawDescriptionHelpFormatter)
    qa.add_argument("--config", help="TOML file (see experiments/qat_finetune/config.toml)")
    qa.add_argument("--policy", help="precision policy JSON from 'npujax search': fine-tune "
                    "--model with it instead of running an experiment")
    qa.add_argument("--model", help="with --policy: model.npz written by 'npujax demo', an "
                    ".onnx model, zoo:ppocr_cls or keras:NAME[:key=value...] (unlabelled data: "
                    "fine-tuned by distillation from its float outputs)")
    add_data_args(qa)
    qa.add_argument("--npu", default="edge_16x16", help="with --policy: preset for the latency")
    qa.add_argument("--steps", type=positive_int, default=300,
                    help="with --policy: QAT steps (default 300)")
    qa.add_argument("--seed", type=seed, default=0,
                    help="seed of the data split and QAT (default 0)")
    qa.add_argument("--out", help="write quantization.md/.json and SQNR reports here (with "
                    "--policy: the fine-tuned model.npz)")
    add_devices_arg(qa)
    add_progress_arg(qa)
    qa.set_defaults(fn=run)


def _with_policy(args: argparse.Namespace) -> int:
    from npujax._atomic import staged_dir
    from npujax.frontends.onnx import parse_input_shapes
    from npujax.hw import load_npu_spec
    from npujax.search import load_policy
    from npujax.workflows.inputs import load_model_and_data
    from npujax.workflows.policy_qat import qat_with_policy

    if not args.model:
        raise ConfigError("--policy fine-tunes a model: pass --model model.npz or model.onnx.")
    policy = load_policy(args.policy)
    spec = load_npu_spec(args.npu)
    out = output_dir(args.out)  # a bad --out fails before the fine-tuning, not after it
    model = load_model_and_data(args.model, data=args.data, examples=args.examples,
                                image_normalization=args.image_normalization,
                                input_shapes=parse_input_shapes(args.input_shape or []),
                                seed=args.seed, calibrate_act_bits=None,
                                progress=not args.no_progress)
    try:
        with contextlib.ExitStack() as stack:
            stage = None if out is None else stack.enter_context(staged_dir(out))
            r = qat_with_policy(model, policy, spec, steps=args.steps, seed=args.seed,
                                devices=args.devices,
                                progress=not args.no_progress, out=stage)
    except ConfigError as e:
        raise ConfigError(f"{args.policy}: {e}") from None
    print(f"QAT with {args.policy}: {r.metric} {r.score:.4f}; modelled latency on {spec.name} "
          f"{r.latency_s * 1e6:.3f} µs ({r.speedup_vs_int8:.2f}x faster than INT8 "
          f"{r.int8_latency_s * 1e6:.3f} µs)")
    if args.out:
        print(f"wrote {args.out}/model.npz")
    return 0


def run(args: argparse.Namespace) -> int:
    from npujax._atomic import atomic_write_text, staged_dir
    from npujax.workflows.qat_experiment import (
        load_qat_config,
        results_markdown,
        run_qat_experiment,
    )

    if args.policy:
        return _with_policy(args)
    if not args.config:
        raise ConfigError("npujax qat needs --config FILE (an experiment) or --policy FILE "
                          "--model model.npz (fine-tune a saved model with a precision policy).")
    config = load_qat_config(args.config, progress=not args.no_progress)
    out = output_dir(args.out)
    con = console()
    with contextlib.ExitStack() as stack:  # --out: all of the files or none
        stage = None if out is None else stack.enter_context(staged_dir(out))
        result = run_qat_experiment(config, console=con, out_dir=stage)
        text = results_markdown([result])
        con.print(text)
        if stage is not None:
            atomic_write_text(stage / "quantization.md", text)
            atomic_write_text(stage / "quantization.json",
                              json.dumps(result, indent=1, default=str))
    if out is not None:
        con.print(f"wrote {out}/quantization.md, quantization.json")
    return 0

"""``npujax search``: per-layer bit widths for a latency budget, written as a policy file."""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from typing import Any

from npujax._lazy import names
from npujax.cli._common import (
    add_data_args,
    add_devices_arg,
    add_progress_arg,
    bits_spec,
    epilog,
    finite_float,
    int_list,
    output_file,
    positive_int,
    seed,
)
from npujax.errors import ConfigError


def add_parser(sub: argparse._SubParsersAction) -> None:
    SEARCHERS = names("npujax.search.registry", "SEARCHERS", "summary")
    SENSITIVITIES = names("npujax.search.config", "SENSITIVITIES")

    se = sub.add_parser(
        "search", help="choose per-layer bit widths for a latency budget",
        description="Mixed-precision search on a saved model (model.npz from 'npujax demo') or "
                    "an ONNX model: per-layer weight/activation widths that meet a latency "
                    "budget on the NPU, written as a policy JSON file. Unlabelled data (ONNX "
                    "models) is searched by distillation from the float model. Searchers: "
                    + "; ".join(f"{n}: {s}" for n, s in SEARCHERS.items()) + ".",
        epilog=epilog(
            "npujax search runs/<timestamp>/model.npz --npu bitserial_16x16 --act-candidates "
            "4,8 --budget-ratio 0.6 --out runs/policy.json",
            "npujax search zoo:ppocr_cls --input-shape x=1,3,48,192 --data text --method "
            "gradient --pin first-last --out runs/cls_policy.json"),
        formatter_class=argparse.RawDescriptionHelpFormatter)
    se.add_argument("model", help="model.npz written by 'npujax demo', an .onnx model, "
                    "zoo:ppocr_cls / zoo:ppocr_det / zoo:ppocr_rec (real models fetched with pip "
                    "once), or keras:NAME[:key=value...] (a Keras application)")
    add_data_args(se)
    se.add_argument("--sensitivity", choices=SENSITIVITIES, default="hessian",
                    help="ilp/greedy objective: hessian (HAWQ-V3 trace x perturbation, default) "
                         "or loss (measured loss increase, one layer quantized at a time)")
    se.add_argument("--sensitivity-batch", type=positive_int, default=256,
                    help="examples for the sensitivity analysis (ilp, greedy; default 256)")
    se.add_argument("--npu", default="edge_16x16",
                    help="preset name or TOML path (default: edge_16x16)")
    se.add_argument("--method", default="ilp", choices=tuple(SEARCHERS),
                    help="the searcher (default ilp)")
    budget = se.add_mutually_exclusive_group()
    budget.add_argument("--budget-latency", type=finite_float(), help="latency budget in seconds")
    budget.add_argument("--budget-ratio", type=finite_float(0.0, 1.0), default=0.75,
                        help="budget as a fraction of the INT8 latency (default 0.75)")
    se.add_argument("--candidates", type=int_list("--candidates"), default=(2, 4, 8),
                    help="weight widths (default 2,4,8)")
    se.add_argument("--act-candidates", type=int_list("--act-candidates"), default=(8,),
                    help="activation widths (default 8)")
    se.add_argument("--steps", type=positive_int, default=300, help="gradient-search steps")
    se.add_argument("--pin", help="layers held at fixed widths: 'sensitive' or 'sensitive:K' (the "
                    "K layers, default 2, whose weights or inputs at the narrowest candidate "
                    "widths move the output most, each measured alone: weights at 8 bits, "
                    "inputs at the widest --act-candidates), "
                    "'first-last' (the first and last GEMM layers at 8 bits) or layer=bits "
                    "pairs, e.g. conv1=8,fc2=8")
    se.add_argument("--sensitivity-samples", type=positive_int, default=16,
                    help="Hutchinson probes for the Hessian traces (ilp, greedy; default 16)")
    se.add_argument("--seed", type=seed, default=0,
                    help="seed of the data split, probes and mini-batches (default 0)")
    se.add_argument("--out", default="policy.json", help="policy file (default policy.json)")
    add_devices_arg(se)
    add_progress_arg(se)
    se.set_defaults(fn=run)


def run(args: argparse.Namespace) -> int:
    from npujax.frontends.onnx import parse_input_shapes
    from npujax.hw import load_npu_spec
    from npujax.ops import gemm_nodes
    from npujax.search import SearchConfig, save_policy, search_precision
    from npujax.workflows.inputs import load_model_and_data

    spec = load_npu_spec(args.npu)
    output_file(args.out)
    # the settings are checked before the data and model are loaded
    settings = dict(
        method=args.method, sensitivity=args.sensitivity, budget_s=args.budget_latency,
        budget_ratio=args.budget_ratio, candidates=args.candidates,
        act_candidates=args.act_candidates, steps=args.steps,
        sensitivity_samples=args.sensitivity_samples, sensitivity_batch=args.sensitivity_batch,
        seed=args.seed, progress=not args.no_progress, devices=args.devices)
    SearchConfig(**settings)
    m = load_model_and_data(args.model, data=args.data, examples=args.examples,
                            image_normalization=args.image_normalization,
                            input_shapes=parse_input_shapes(args.input_shape or []),
                            seed=args.seed, calibrate_act_bits=max(args.act_candidates),
                            progress=not args.no_progress)
    layers = [n.name for n in gemm_nodes(m.graph)]
    pinned: Mapping[str, int | tuple[int, int]] | None
    if args.pin in (None, ""):
        pinned = None
    elif args.pin == "first-last":
        pinned = {layers[0]: 8, layers[-1]: 8}
    elif args.pin == "sensitive" or args.pin.startswith("sensitive:"):
        pinned = _sensitive_pins(args, m, len(layers))
    else:
        pins = bits_spec(args.pin)
        if not isinstance(pins, dict):
            raise ConfigError(f"--pin takes layer=bits pairs, 'first-last' or "
                              f"'sensitive[:K]', got {args.pin!r}.")
        pinned = dict(pins)
    config = SearchConfig(
        method=args.method, pinned=pinned, sensitivity=args.sensitivity,
        budget_s=args.budget_latency, budget_ratio=args.budget_ratio,
        candidates=args.candidates, act_candidates=args.act_candidates, steps=args.steps,
        sensitivity_samples=args.sensitivity_samples, sensitivity_batch=args.sensitivity_batch,
        seed=args.seed, progress=not args.no_progress, devices=args.devices)
    # (None only when calibration found no layer: no states)
    report = search_precision(m.graph, m.params, spec, m.x_train, m.y_train, m.qstate or {},
                              config)
    save_policy(args.out, report.policy)  # before printing: a closed pipe must not lose it
    labels = ("targets from the float model (distillation)" if report.distilled
              else "the data's labels")
    print(f"{report.method} search on {report.npu} ({report.loss} loss, {labels}): latency "
          f"{report.latency_s * 1e6:.3f} µs (budget {report.budget_s * 1e6:.3f} µs, INT8 "
          f"{report.int8_latency_s * 1e6:.3f} µs, {report.speedup_vs_int8:.2f}x faster)")
    for layer in report.policy.weight_bits:
        print(f"  {layer:<16} W{report.policy.weight_bits[layer]} "
              f"A{report.policy.act_bits[layer]}")
    print(f"wrote {args.out}")
    return 0


def _sensitive_pins(args: argparse.Namespace, m: Any, layers: int
                    ) -> dict[str, int | tuple[int, int]]:
    """``--pin sensitive[:K]``: the K most sensitive layers (weights or inputs, each measured
    alone at the narrowest candidates) kept wide: weights at 8 bits, inputs at the widest
    activation candidate.

    Raises:
      ConfigError: K not a positive int.
    """
    from npujax.search.sensitivity import most_sensitive_layers

    _, _, k = args.pin.partition(":")
    try:
        count = int(k) if k else 2
    except ValueError:
        count = 0
    if count < 1:
        raise ConfigError(f"--pin {args.pin!r}: write sensitive or sensitive:K with K >= 1.")
    rows = most_sensitive_layers(m.graph, m.params, m.x_train[:256], min(args.candidates),
                                 min(args.act_candidates), min(count, layers))
    print("kept wide (most sensitive; weight-only / activation-only output SQNR): " + ", ".join(
        f"{r.name} ({r.weight_sqnr_db:.1f}/{r.act_sqnr_db:.1f} dB)" for r in rows))
    wide = (8, int(max(args.act_candidates)))  # weights 8, inputs the widest candidate
    return {r.name: wide for r in rows}

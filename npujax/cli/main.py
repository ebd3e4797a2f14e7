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
from npujax.ops import gemm_nodes

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
    from npujax.workflows.demo import DemoConfig, run_demo

    overrides = {k: v for k, v in {
        "float_epochs": args.epochs, "qat_steps": args.qat_steps,
        "search_steps": args.search_steps, "finetune_steps": args.finetune_steps,
        "search_method": args.search_method,
    }.items() if v is not None}
    config = DemoConfig(npu=args.npu, out=args.out, seed=args.seed,
                        progress=not args.no_progress, **overrides)
    run_demo(config, console=_console())
    return 0


def _cmd_lower(args: argparse.Namespace) -> int:
    from npujax.hw import DATAFLOWS, load_npu_spec
    from npujax.plan import lower
    from npujax.quantize.model_file import load_graph
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
    shapes = _input_shapes(args.input_shape)
    onnx_model = str(args.model).lower().endswith(".onnx")
    batch = args.batch
    if onnx_model:
        graph, meta = _import_onnx(args.model, shapes, args.batch), {}
        batch = None  # the batch is part of the imported shapes
    else:
        if shapes:
            raise ConfigError("--input-shape applies to .onnx models; a saved npujax model "
                              "has fixed shapes (use --batch to change the batch size).")
        graph, _, _, meta = load_graph(args.model)
    if args.weight_bits == "saved":
        if "mixed_precision_policy" not in meta:
            raise ConfigError(f"{args.model} holds no saved precision policy; pass --weight-bits "
                              "8 or layer=bits pairs.")
        wbits = meta["mixed_precision_policy"]
    kw = dict(weight_bits=wbits, act_bits=abits, batch=batch)
    schedule = lower(graph, spec, dataflow=args.dataflow, **kw)
    by_df = {df: lower(graph, spec, dataflow=df, **kw) for df in DATAFLOWS}
    console = _console()
    console.print(layer_table(schedule, f"{Path(args.model).name} on {spec.name} "
                                        f"({schedule.dataflow})"))
    console.print(dataflow_table(by_df, reference=schedule.dataflow))
    cpu = [r for r in schedule.layers if r.device == "cpu"]
    if cpu:
        console.print(f"{len(cpu)} layer(s) fall back to the host CPU: "
                      + "; ".join(f"{r.name} ({r.reason})" for r in cpu[:8])
                      + (" ..." if len(cpu) > 8 else ""))
    sweep = None
    if args.sweep_resolution:
        if not onnx_model:
            raise ConfigError("--sweep-resolution re-imports the model at other input sizes; "
                              "it needs an .onnx model.")
        sweep = _resolution_sweep(args.model, graph, spec, shapes, args.batch, args.dataflow,
                                  kw, console)
    if args.out:
        out = Path(args.out)
        write_json(out / "schedule.json", {**schedule.to_dict(), "dataflow_latency_s":
                                           {df: s.latency_s for df, s in by_df.items()},
                                           **({"resolution_sweep": sweep} if sweep else {})})
        write_layers_csv(out / "layers.csv", schedule)
        plot_layer_latency(out / "layer_latency.png", {schedule.dataflow: schedule})
        plot_breakdown(out / "breakdown.png", schedule)
        plot_roofline(out / "roofline.png", schedule, spec.peak_macs_per_s,
                      spec.memory.dram_bytes_per_s)
        console.print(f"wrote {out}/schedule.json, layers.csv, layer_latency.png, "
                      "breakdown.png, roofline.png")
    return 0


def _input_shapes(items: list[str] | None) -> dict[str, tuple[int, ...]]:
    """``["x=1,3,224,224", ...]`` -> ``{"x": (1, 3, 224, 224)}`` (ConfigError if malformed)."""
    from npujax.frontends.onnx import parse_input_shapes

    return parse_input_shapes(items or [])


def _import_onnx(path, shapes, batch):
    from npujax.frontends.onnx import from_onnx, load_onnx_model
    from npujax.ir.passes import optimize

    if batch is not None:
        model = load_onnx_model(path)
        inits = {i.name for i in model.graph.initializer}
        for inp in model.graph.input:
            if inp.name in inits:
                continue
            if inp.name in shapes:
                shapes[inp.name] = (batch, *shapes[inp.name][1:])
            else:
                dims = [d.dim_value if d.dim_value > 0 else None
                        for d in inp.type.tensor_type.shape.dim]
                if dims and all(d is not None for d in dims[1:]):
                    shapes[inp.name] = (batch, *dims[1:])
    graph, params = from_onnx(path, shapes or None, unsupported="fallback")
    return optimize(graph, params)[0]


def _resolution_sweep(path, graph, spec, shapes, batch, dataflow, kw, console) -> dict:
    """Latency at half, the given and double input resolution (H and W of the 4-D inputs)."""
    from rich.table import Table

    from npujax.plan import lower

    base = {t: graph.tensors[t].shape for t in graph.inputs}
    rows = {}
    for factor in (0.5, 1.0, 2.0):
        s = {t: (sh[0], sh[1], max(1, int(sh[2] * factor)), max(1, int(sh[3] * factor)))
             if len(sh) == 4 else sh for t, sh in base.items()}
        g = graph if factor == 1.0 else _import_onnx(path, dict(s), batch)
        sched = lower(g, spec, dataflow=dataflow, **{**kw, "batch": None})
        rows[factor] = {"input_shapes": {k: list(v) for k, v in s.items()},
                        "latency_s": sched.latency_s, "macs": sched.macs,
                        "memory_bound_layers": sum(r.bound == "memory" for r in sched.layers),
                        "layers": len(sched.layers)}
    t = Table(title="resolution sweep (H and W scaled; pixels x4 per step)", title_justify="left")
    for col in ("scale", "input", "MACs", "latency µs", "× vs 1.0", "memory-bound"):
        t.add_column(col, justify="right")
    ref = rows[1.0]["latency_s"]
    for f, r in rows.items():
        t.add_row(f"{f:g}", "; ".join(f"{k}={tuple(v)}" for k, v in r["input_shapes"].items()),
                  f"{r['macs']:,}", f"{r['latency_s'] * 1e6:,.1f}",
                  f"{r['latency_s'] / ref:.2f}", f"{r['memory_bound_layers']}/{r['layers']}")
    console.print(t)
    console.print("latency growing ~4x per doubling means compute- or activation-bound; much "
                  "less means weight-bandwidth or fixed overheads (fallback, transfers) dominate.")
    return {str(k): v for k, v in rows.items()}


def _load_for_search(args: argparse.Namespace, act_bits: int | None):
    """Model, data and calibration state for ``search`` and ``qat --policy``.

    Returns ``(graph, params, qstate, meta, (x_train, y_train, x_test, y_test))``; labels are None
    for unlabelled data (the searchers then distil from the float model). A model without
    calibration state is calibrated (min-max, ``act_bits``) unless ``act_bits`` is None (the
    caller calibrates with its own spec).
    """
    from npujax.data.sources import load_inputs
    from npujax.quantize.calibrate import calibrate
    from npujax.quantize.model_file import load_graph
    from npujax.quantize.spec import quant_spec

    if str(args.model).lower().endswith(".onnx"):
        from npujax.frontends.onnx import from_onnx
        from npujax.ir.passes import optimize

        if not args.data:
            raise ConfigError("an ONNX model needs calibration data: pass --data text, --data "
                              "photos (images generated at the model's input size) or --data "
                              "FILE.npy/.npz (your own preprocessed inputs).")
        graph, params = optimize(*from_onnx(args.model, _input_shapes(args.input_shape) or None))
        qstate, meta = None, {"source": str(args.model)}
    else:
        if args.input_shape:
            raise ConfigError("--input-shape applies to .onnx models; a saved npujax model has "
                              "fixed shapes.")
        graph, params, qstate, meta = load_graph(args.model)
    data = load_inputs(args.data or "digits", graph.tensors[graph.inputs[0]].shape,
                       n=args.examples, seed=args.seed)
    print(f"data {args.data or 'digits'}: {len(data[0])} examples for search/fine-tuning, "
          f"{len(data[2])} held out ({'labelled' if data[1] is not None else 'unlabelled'})")
    if not qstate and act_bits is not None:
        q = quant_spec(graph, 8, act_bits)
        x = data[0]
        qstate = calibrate(graph, params, [x[i:i + 32] for i in range(0, min(len(x), 128), 32)],
                           q, progress=not getattr(args, "no_progress", False))
        print(f"calibrated activation ranges (min-max) on {min(len(x), 128)} examples of "
              f"--data {args.data}")
    return graph, params, qstate, meta, data


def _cmd_search(args: argparse.Namespace) -> int:
    from npujax.hw import load_npu_spec
    from npujax.search import save_policy, search_precision

    cands = _int_list(args.candidates, "--candidates")
    acts = _int_list(args.act_candidates, "--act-candidates")
    spec = load_npu_spec(args.npu)
    graph, params, qstate, _, (x, y, _, _) = _load_for_search(args, max(acts))
    layers = [n.name for n in gemm_nodes(graph)]
    if args.pin in (None, ""):
        pinned = None
    elif args.pin == "first-last":
        pinned = {layers[0]: 8, layers[-1]: 8}
    else:
        pinned = _bits(args.pin)
        if not isinstance(pinned, dict):
            raise ConfigError(f"--pin takes layer=bits pairs or 'first-last', got {args.pin!r}.")
    policy = search_precision(
        graph, params, spec, x, y, qstate, method=args.method, pinned=pinned,
        sensitivity=args.sensitivity,
        budget_s=args.budget_latency, budget_ratio=args.budget_ratio, candidates=cands,
        act_candidates=acts, steps=args.steps, sensitivity_samples=args.sensitivity_samples,
        sensitivity_batch=args.sensitivity_batch, seed=args.seed, progress=True)
    save_policy(args.out, policy)  # before printing: a closed pipe must not lose the result
    m = policy.meta
    print(f"{m['method']} on {m['npu']} (loss: {m['loss']}, labels: {m['labels']}): latency "
          f"{m['latency_s'] * 1e6:.3f} µs (budget {m['budget_s'] * 1e6:.3f} µs, INT8 "
          f"{m['int8_latency_s'] * 1e6:.3f} µs, {m['speedup_vs_int8']:.2f}x faster)")
    for layer in policy.weight_bits:
        print(f"  {layer:<16} W{policy.weight_bits[layer]} A{policy.act_bits[layer]}")
    print(f"wrote {args.out}")
    return 0


def _zoo_model(name: str):
    """``zoo:NAME`` on the command line: the cached path of a real ONNX model of the zoo."""
    from npujax.models.zoo import MODELS, fetch_model

    if name not in MODELS:
        raise ConfigError(f"unknown zoo model {name!r}; known: {', '.join(sorted(MODELS))} "
                          "(write zoo:ppocr_cls).")
    return fetch_model(name)


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
    from npujax.data.datasets import load_digits_nhwc, load_mnist5k_nhwc
    from npujax.quantize.model_file import load_graph, save_graph
    from npujax.quantize.ptq import layer_sqnr, ptq
    from npujax.quantize.spec import quant_spec
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


def _qat_with_policy(args: argparse.Namespace) -> int:
    """Fine-tune a saved or ONNX model with a precision policy; report accuracy and latency."""
    import jax

    from npujax.hw import load_npu_spec
    from npujax.plan import lower
    from npujax.quantize.calibrate import calibrate
    from npujax.quantize.execute import execute
    from npujax.quantize.model_file import save_graph
    from npujax.quantize.spec import quant_spec
    from npujax.quantize.train import evaluate, train_graph
    from npujax.search import load_policy
    from npujax.search.objective import search_targets, task_loss

    if not args.model:
        raise ConfigError("--policy fine-tunes a model: pass --model model.npz or model.onnx.")
    policy = load_policy(args.policy)
    # no calibration here: it is done below with the policy's own spec
    graph, params, _, meta, (x, y, xte, yte) = _load_for_search(args, None)
    layers = {n.name for n in gemm_nodes(graph)}
    if set(policy.weight_bits) != layers:
        def some(names):
            names = sorted(names)
            return ", ".join(names[:6]) + (f", ... ({len(names)} layers)" if len(names) > 6 else "")

        raise ConfigError(f"policy {args.policy} is for another model: it names layers "
                          f"{some(policy.weight_bits)}; the model has {some(layers)}.")
    spec = load_npu_spec(args.npu)
    task = task_loss(graph)
    targets = search_targets(graph, params, x, y, task)
    q = quant_spec(graph, dict(policy.weight_bits), dict(policy.act_bits))
    qstate = calibrate(graph, params, [x[i:i + 64] for i in range(0, min(len(x), 512), 64)], q)
    tuned = train_graph(graph, params, x, targets, steps=args.steps, learning_rate=1e-4, quant=q,
                        qstate=qstate, seed=args.seed, loss_fn=task,
                        progress=not args.no_progress, description="QAT with policy")
    if yte is not None:
        what, score = "test accuracy", evaluate(graph, tuned, xte, yte, quant=q, qstate=qstate)
    else:
        teacher = search_targets(graph, params, xte, None, task)
        if task.classification:
            what = "top-1 agreement with the float model on held-out data"
            score = evaluate(graph, tuned, xte, teacher, quant=q, qstate=qstate)
        else:
            what = "normalized MSE to the float model on held-out data"
            out = jax.jit(lambda p, xb: execute(graph, p, xb, quant=q, qstate=qstate))(tuned, xte)
            score = float(task(out, teacher))
    lat = lower(graph, spec, weight_bits=dict(policy.weight_bits),
                act_bits=dict(policy.act_bits)).latency_s
    int8 = lower(graph, spec).latency_s
    if args.out:  # saved before printing: a closed pipe must not lose the fine-tuned model
        save_graph(Path(args.out) / "model.npz", graph, tuned, qstate,
                   meta={**meta, "policy": dict(policy.weight_bits),
                         "act_policy": dict(policy.act_bits), what: score})
    print(f"QAT with {args.policy}: {what} {score:.4f}; modelled latency on {spec.name} "
          f"{lat * 1e6:.3f} µs ({int8 / lat:.2f}x faster than INT8 {int8 * 1e6:.3f} µs)")
    if args.out:
        print(f"wrote {args.out}/model.npz")
    return 0


def _cmd_qat(args: argparse.Namespace) -> int:
    import json

    from npujax._atomic import atomic_write_text
    from npujax.workflows.qat_experiment import (
        load_qat_config,
        results_markdown,
        run_qat_experiment,
    )

    if args.policy:
        return _qat_with_policy(args)
    if not args.config:
        raise ConfigError("npujax qat needs --config FILE (an experiment) or --policy FILE "
                          "--model model.npz (fine-tune a saved model with a precision policy).")

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


def _data_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--input-shape", action="append", metavar="NAME=1,3,48,192",
                   help="static shape of an ONNX input with dynamic dimensions")
    p.add_argument("--data", help="digits (default for model.npz), mnist5k, text or photos "
                   "(images generated at the ONNX model's input size), or FILE.npy / FILE.npz "
                   "('x' inputs, optional 'y' int labels)")
    p.add_argument("--examples", type=int, default=256,
                   help="images generated for --data text/photos (default 256)")


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
    d.add_argument("--search-method", choices=("gradient", "ilp", "greedy"),
                   help="precision searcher (default gradient)")
    d.add_argument("--no-progress", action="store_true", help="hide progress bars")
    d.set_defaults(fn=_cmd_demo)

    lo = sub.add_parser("lower", help="per-layer NPU latency of an ONNX or saved model",
                        description="Lower an ONNX model or a saved npujax model (model.npz "
                                    "from 'npujax demo') onto a hardware preset and print the "
                                    "per-layer table: placement (NPU or CPU fallback), GEMM "
                                    "shape, cycles, latency breakdown, bound.")
    lo.add_argument("model", help="an .onnx model, zoo:ppocr_cls / zoo:ppocr_det, or a "
                    "model.npz written by 'npujax demo'")
    lo.add_argument("--input-shape", action="append", metavar="NAME=1,3,224,224",
                    help="static shape of an ONNX input (repeat for several inputs)")
    lo.add_argument("--sweep-resolution", action="store_true",
                    help="also lower at half and double the input resolution (ONNX models)")
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

    qa = sub.add_parser("qat", help="QAT vs PTQ experiment from a config file, or QAT of a "
                        "model with a precision policy",
                        description="--config FILE: train a CNN, then compare PTQ (min-max, "
                                    "percentile, MSE, entropy) with QAT at W8A8/W4A8/W4A4 as the "
                                    "TOML config says (keys: the fields of QATConfig). "
                                    "--policy FILE --model MODEL: QAT-fine-tune a saved or ONNX "
                                    "model with a policy from 'npujax search' and report accuracy "
                                    "and modelled latency.")
    qa.add_argument("--config", help="TOML file (see experiments/qat_finetune/config.toml)")
    qa.add_argument("--policy", help="precision policy JSON from 'npujax search': fine-tune "
                    "--model with it instead of running an experiment")
    qa.add_argument("--model", help="with --policy: model.npz written by 'npujax demo', an "
                    ".onnx model or zoo:ppocr_cls (unlabelled data: fine-tuned by distillation "
                    "from its float outputs)")
    _data_args(qa)
    qa.add_argument("--npu", default="edge_16x16", help="with --policy: preset for the latency")
    qa.add_argument("--steps", type=int, default=300, help="with --policy: QAT steps "
                    "(default 300)")
    qa.add_argument("--seed", type=int, default=0)
    qa.add_argument("--out", help="write quantization.md/.json and SQNR reports here")
    qa.add_argument("--no-progress", action="store_true", help="hide progress bars")
    qa.set_defaults(fn=_cmd_qat)

    se = sub.add_parser("search", help="choose per-layer bit widths for a latency budget",
                        description="Mixed-precision search on a saved model (model.npz from "
                                    "'npujax demo') or an ONNX model: per-layer weight/"
                                    "activation widths that meet a latency budget on the NPU, "
                                    "written as a policy JSON file. Unlabelled data (ONNX "
                                    "models) is searched by distillation from the float model.")
    se.add_argument("model", help="model.npz written by 'npujax demo', an .onnx model, or "
                    "zoo:ppocr_cls / zoo:ppocr_det (real models fetched with pip once)")
    _data_args(se)
    se.add_argument("--sensitivity", choices=("hessian", "loss"), default="hessian",
                    help="ilp/greedy objective: hessian (HAWQ-V3 trace x perturbation, default) "
                         "or loss (measured loss increase, one layer quantized at a time)")
    se.add_argument("--sensitivity-batch", type=int, default=256,
                    help="examples for the sensitivity analysis (ilp, greedy; default 256)")
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
    se.add_argument("--pin", help="layers held at fixed widths: 'first-last' (the first and last "
                    "GEMM layers at 8 bits) or layer=bits pairs, e.g. conv1=8,fc2=8")
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
        if str(getattr(args, "model", None) or "").startswith("zoo:"):
            args.model = str(_zoo_model(args.model[4:]))
        return int(args.fn(args) or 0)
    except NpujaxError as e:
        print(f"npujax: error: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print("npujax: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # e.g. `npujax search ... | head`: the reader left; outputs are already written
        # (atomically), so exit quietly as Unix tools do
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141


"""``npujax lower``: the per-layer NPU latency of an ONNX or saved model."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from npujax.cli._common import (
    bits_spec,
    console,
    epilog,
    output_dir,
    positive_int,
    precision_from_bits,
)
from npujax.errors import ConfigError


def add_parser(sub: argparse._SubParsersAction) -> None:
    from npujax.models.transformer import DECODER_CONFIGS
    from npujax.systolic import DATAFLOWS

    lo = sub.add_parser(
        "lower", help="per-layer NPU latency of an ONNX or saved model",
        description="Lower an ONNX model or a saved npujax model (model.npz from 'npujax demo') "
                    "onto a hardware preset and print the per-layer table: placement (NPU or CPU "
                    "fallback), GEMM shape, cycles, latency breakdown, bound.",
        epilog=epilog(
            "npujax lower runs/<timestamp>/model.npz --npu edge_16x16 --weight-bits fc1=4",
            "npujax lower zoo:ppocr_cls --input-shape x=1,3,48,192 --npu tpu_v1 --out lowered/",
            "npujax lower decoder:qwen2.5-0.5b --phase decode --kv-len 1024 --npu "
            "datacenter_128x128 --weight-bits 4 --act-bits 16 --kv-bits 8"),
        formatter_class=argparse.RawDescriptionHelpFormatter)
    lo.add_argument("model", help="an .onnx model, zoo:ppocr_cls / zoo:ppocr_det, a "
                    "model.npz written by 'npujax demo', or decoder:<config> (the reference "
                    f"LLM decoder at the shapes of {', '.join(sorted(DECODER_CONFIGS))})")
    lo.add_argument("--phase", choices=("prefill", "decode"), default="prefill",
                    help="decoder: a prefill of --seq-len tokens or one decode step against "
                    "--kv-len cached positions (default: prefill)")
    lo.add_argument("--seq-len", type=positive_int, default=128,
                    help="decoder: prompt tokens per sequence (default 128)")
    lo.add_argument("--kv-len", type=positive_int, default=1024,
                    help="decoder: cached positions of a decode step (default 1024)")
    lo.add_argument("--kv-bits", type=positive_int, default=8,
                    help="decoder: width of the attention MatMuls' operands, the KV cache "
                    "(default 8)")
    lo.add_argument("--input-shape", action="append", metavar="NAME=1,3,224,224",
                    help="static shape of an ONNX input (repeat for several inputs)")
    lo.add_argument("--sweep-resolution", action="store_true",
                    help="also lower at half and double the input resolution (ONNX models)")
    lo.add_argument("--npu", default="edge_16x16",
                    help="preset name or TOML path (default: edge_16x16)")
    lo.add_argument("--dataflow", help="override the preset's dataflow "
                    f"({', '.join(DATAFLOWS)})")
    lo.add_argument("--weight-bits", action="append",
                    help="8 (default), per layer: fc1=4,fc2=8 (layers not named keep 8; may be "
                    "repeated), or 'saved' for the mixed-precision policy in the model file")
    lo.add_argument("--act-bits", action="append",
                    help="8, or per layer: conv1=8 (may be repeated)")
    lo.add_argument("--batch", type=positive_int,
                    help="inference batch size (default: the model's)")
    lo.add_argument("--out", help="write schedule.json, layers.csv and plots (per-layer latency, "
                    "stacked breakdown, roofline) here")
    lo.set_defaults(fn=run)


def run(args: argparse.Namespace) -> int:
    from npujax.frontends.onnx import parse_input_shapes
    from npujax.hw import load_npu_spec
    from npujax.quantize.model_file import load_graph
    from npujax.workflows.lowering import (
        import_onnx_for_lowering,
        lower_dataflows,
        print_lowering,
        print_resolution_sweep,
        resolution_sweep,
        write_lowering,
    )

    if str(args.model).startswith("decoder:"):
        return _run_decoder(args)
    saved = args.weight_bits == ["saved"]
    wbits = bits_spec(args.weight_bits) if args.weight_bits and not saved else 8
    abits = bits_spec(args.act_bits) if args.act_bits else 8
    spec = load_npu_spec(args.npu)
    out = output_dir(args.out)
    shapes = parse_input_shapes(args.input_shape or [])
    onnx_model = str(args.model).lower().endswith(".onnx")
    batch = args.batch
    meta: dict[str, Any]
    if onnx_model:
        graph, meta = import_onnx_for_lowering(args.model, shapes, args.batch), {}
        batch = None  # the batch is part of the imported shapes
    else:
        if shapes:
            raise ConfigError("--input-shape applies to .onnx models; a saved npujax model "
                              "has fixed shapes (use --batch to change the batch size).")
        graph, _, _, meta = load_graph(args.model)
    if saved:
        if "mixed_precision_policy" not in meta:
            raise ConfigError(f"{args.model} holds no saved precision policy; pass --weight-bits "
                              "8 or layer=bits pairs.")
        wbits = meta["mixed_precision_policy"]

    def precision(g):
        default = not isinstance(wbits, dict) and not isinstance(abits, dict) \
            and wbits == abits == 8
        return None if default else precision_from_bits(g, wbits, abits)

    result = lower_dataflows(graph, spec, precision(graph), dataflow=args.dataflow, batch=batch)
    con = console()
    print_lowering(con, result, f"{Path(args.model).name} on {spec.name} "
                                f"({result.schedule.dataflow})")
    sweep = None
    if args.sweep_resolution:
        if not onnx_model:
            raise ConfigError("--sweep-resolution re-imports the model at other input sizes; "
                              "it needs an .onnx model.")
        sweep = resolution_sweep(args.model, graph, spec, args.batch, precision, args.dataflow)
        print_resolution_sweep(con, sweep)
    if out is not None:
        names = write_lowering(out, result, spec, {"resolution_sweep": sweep} if sweep else None)
        con.print(f"wrote {', '.join(str(out / n) for n in names)}")
    return 0


def _run_decoder(args: argparse.Namespace) -> int:
    """``npujax lower decoder:<config>``: a prefill or decode step of the reference decoder."""
    from npujax.hw import load_npu_spec
    from npujax.models.transformer import DECODER_CONFIGS
    from npujax.workflows.lowering import (
        decoder_figures,
        decoder_graph,
        decoder_precision,
        lower_dataflows,
        print_lowering,
        write_lowering,
    )

    name = str(args.model).split(":", 1)[1]
    if name not in DECODER_CONFIGS:
        raise ConfigError(f"unknown decoder config {name!r}; use one of "
                          f"{sorted(DECODER_CONFIGS)}.")
    if args.input_shape or args.sweep_resolution:
        raise ConfigError("--input-shape and --sweep-resolution apply to .onnx models; a "
                          "decoder's shapes are --seq-len, --kv-len and --batch.")
    widths = []
    for what, v in (("--weight-bits", args.weight_bits), ("--act-bits", args.act_bits)):
        b = bits_spec(v) if v else 8
        if not isinstance(b, int):
            raise ConfigError(f"{what} for a decoder is one width for every linear layer, "
                              f"got {v}.")
        widths.append(b)
    cfg = DECODER_CONFIGS[name]
    batch = args.batch or 1
    spec = load_npu_spec(args.npu)
    graph = decoder_graph(cfg, phase=args.phase, seq_len=args.seq_len, kv_len=args.kv_len,
                          batch=batch)
    quant = decoder_precision(graph, widths[0], widths[1], args.kv_bits)
    result = lower_dataflows(graph, spec, quant, dataflow=args.dataflow)
    fig = decoder_figures(result.schedule, cfg, phase=args.phase, seq_len=args.seq_len,
                          kv_len=args.kv_len, batch=batch, kv_bits=args.kv_bits)
    con = console()
    shape = (f"{args.seq_len} tokens" if args.phase == "prefill"
             else f"1 token, {args.kv_len} cached")
    print_lowering(con, result, f"{name} {args.phase} ({shape}, batch {batch}) on {spec.name} "
                                f"({result.schedule.dataflow})")
    con.print(f"{args.phase}: {result.schedule.latency_s * 1e3:,.3f} ms per step, "
              f"{fig.tokens_per_s:,.1f} tokens/s; KV cache read per token: "
              f"{fig.kv_cache_bytes_per_token:,.0f} bytes ({args.kv_bits}-bit); weights "
              f"{widths[0]}-bit, activations {widths[1]}-bit")
    out = output_dir(args.out)
    if out is not None:
        names = write_lowering(out, result, spec, {"decoder": fig.to_dict()})
        con.print(f"wrote {', '.join(str(out / n) for n in names)}")
    return 0

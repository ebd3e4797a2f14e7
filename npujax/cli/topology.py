"""``npujax topology``: any ONNX, saved or zoo model as a SCALE-Sim topology file."""

from __future__ import annotations

import argparse

from npujax.cli._common import console, epilog


def add_parser(sub: argparse._SubParsersAction) -> None:
    tp = sub.add_parser(
        "topology", help="write a model as a SCALE-Sim topology (conv form)",
        description="Write the Conv/Gemm layers of an ONNX model, a saved npujax model or a zoo "
                    "model as a SCALE-Sim topology CSV (conv form; dense layers in SCALE-Sim's "
                    "GEMM view), so the model runs in SCALE-Sim as in npujax.",
        epilog=epilog("npujax topology zoo:ppocr_cls --input-shape x=1,3,48,192 --out cls.csv"),
        formatter_class=argparse.RawDescriptionHelpFormatter)
    tp.add_argument("model", help="an .onnx model, zoo:NAME, a model.npz, or "
                    "keras:NAME[:key=value...] (a Keras application)")
    tp.add_argument("--input-shape", action="append", metavar="NAME=1,3,224,224",
                    help="static shape of an ONNX input (repeat for several inputs)")
    tp.add_argument("--out", required=True, help="the topology CSV to write")
    tp.set_defaults(fn=run)


def run(args: argparse.Namespace) -> int:
    from npujax.frontends.onnx import parse_input_shapes
    from npujax.ir.passes import optimize
    from npujax.plan.topology import graph_topology
    from npujax.systolic.scalesim_io import write_topology
    from npujax.workflows.inputs import load_model
    from npujax.workflows.lowering import import_onnx_for_lowering

    shapes = parse_input_shapes(args.input_shape or [])
    if str(args.model).lower().endswith(".onnx"):
        graph = import_onnx_for_lowering(args.model, shapes, None)
    else:
        graph, params, _, _ = load_model(args.model, shapes)
        graph = optimize(graph, params)[0]
    layers = graph_topology(graph)
    write_topology(layers, args.out)
    console().print(f"wrote {len(layers)} layers to {args.out}")
    return 0

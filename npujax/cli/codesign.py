"""``npujax codesign``: array shape, SRAM sizes, DRAM bandwidth class and per-layer widths,
chosen jointly by gradient under an area (and power) budget."""

from __future__ import annotations

import argparse

from npujax._lazy import names
from npujax.cli._common import (
    add_data_args,
    add_progress_arg,
    epilog,
    finite_float,
    int_list,
    output_dir,
    positive_int,
    seed,
)


def add_parser(sub: argparse._SubParsersAction) -> None:
    OBJECTIVES = names("npujax.search.codesign", "OBJECTIVES")

    co = sub.add_parser(
        "codesign", help="choose hardware and per-layer precision together by gradient",
        description="Hardware-precision co-design: array rows and columns, SRAM buffer sizes, a "
                    "DRAM bandwidth class and per-layer weight/activation widths, optimised "
                    "jointly by gradient through the relaxed cost model under an area (and "
                    "power) budget and an accuracy constraint (summed per-layer loss "
                    "increase), then rounded and evaluated exactly by 'npujax lower'. Writes "
                    "preset.toml (loadable by --npu), policy.json (for 'npujax qat --policy'), "
                    "codesign.json and pareto.png to --out.",
        epilog=epilog(
            "npujax codesign runs/<timestamp>/model.npz --npu bitserial_16x16 --area-mm2 4 "
            "--objective edp --candidates 2,4,8 --out runs/codesign",
            "npujax codesign model.npz --npu edge_16x16 --area-mm2 2 --power-w 0.5 "
            "--objective energy --out runs/cd_energy"),
        formatter_class=argparse.RawDescriptionHelpFormatter)
    co.add_argument("model", help="model.npz written by 'npujax demo', an .onnx model, "
                    "zoo:ppocr_cls / zoo:ppocr_det, or keras:NAME[:key=value...]")
    add_data_args(co)
    co.add_argument("--npu", default="edge_16x16",
                    help="base preset (name or TOML path): the start, and every field the "
                    "co-design does not choose (default edge_16x16)")
    co.add_argument("--area-mm2", type=finite_float(), required=True,
                    help="area budget (mm^2) of the modelled blocks plus the DRAM PHY")
    co.add_argument("--power-w", type=finite_float(), help="average power budget (W)")
    co.add_argument("--objective", choices=OBJECTIVES, default="latency",
                    help="what to minimise (default latency)")
    co.add_argument("--candidates", type=int_list("--candidates"), default=(2, 4, 8),
                    help="weight and activation widths (default 2,4,8)")
    co.add_argument("--max-loss-increase", type=finite_float(), default=0.05,
                    help="accuracy constraint: summed per-layer loss increase (nats, default "
                    "0.05)")
    co.add_argument("--steps", type=positive_int, default=200, help="gradient steps (default 200)")
    co.add_argument("--sensitivity-batch", type=positive_int, default=256,
                    help="examples of the sensitivity analysis (default 256)")
    co.add_argument("--seed", type=seed, default=0, help="seed of the data split (default 0)")
    co.add_argument("--out", required=True, help="output folder (replaced atomically)")
    add_progress_arg(co)
    co.set_defaults(fn=run)


def run(args: argparse.Namespace) -> int:
    from npujax.frontends.onnx import parse_input_shapes
    from npujax.hw import load_npu_spec
    from npujax.search.codesign import CodesignConfig
    from npujax.workflows.codesign import run_codesign
    from npujax.workflows.inputs import load_model_and_data

    spec = load_npu_spec(args.npu)
    config = CodesignConfig(area_mm2=args.area_mm2, power_w=args.power_w,
                            objective=args.objective, candidates=tuple(args.candidates),
                            max_loss_increase=args.max_loss_increase, steps=args.steps)
    output_dir(args.out)
    m = load_model_and_data(args.model, data=args.data, examples=args.examples,
                            image_normalization=args.image_normalization,
                            input_shapes=parse_input_shapes(args.input_shape or []),
                            seed=args.seed, progress=not args.no_progress)
    res = run_codesign(m.graph, m.params, spec, m.x_train, m.y_train, config, args.out,
                       examples=args.sensitivity_batch, progress=not args.no_progress,
                       meta={"model": str(args.model), "base": spec.name})
    b, base, obj = res.best, res.base, args.objective
    print(f"co-design on {spec.name} ({obj}): {b.spec.array.rows}x{b.spec.array.cols} array, "
          f"SRAM {b.spec.memory.ifmap_sram_bytes // 1024}/{b.spec.memory.filter_sram_bytes // 1024}"
          f"/{b.spec.memory.ofmap_sram_bytes // 1024} KiB, {b.bandwidth.name}; "
          f"{b.area_mm2:.3f} mm^2 of {args.area_mm2:g}")
    print(f"  latency {b.latency_s * 1e6:.3f} µs, energy {b.energy_j * 1e6:.3f} µJ, "
          f"power {b.power_w:.3f} W, loss increase {b.loss_increase:.4f} nats")
    print(f"  {obj}: {base.objective(obj) / b.objective(obj):.2f}x better than the base "
          f"preset at INT8 ({res.exact_evaluations} exact evaluations)")
    for layer in b.policy.weight_bits:
        print(f"  {layer:<16} W{b.policy.weight_bits[layer]} A{b.policy.act_bits[layer]}")
    print(f"wrote {args.out}/preset.toml, policy.json, codesign.json, pareto.png")
    return 0

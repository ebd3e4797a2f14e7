"""``npujax demo``: train, quantize, search and lower a CNN on the digits data."""

from __future__ import annotations

import argparse

from npujax._lazy import names
from npujax.cli._common import add_progress_arg, console, epilog, positive_int, seed


def add_parser(sub: argparse._SubParsersAction) -> None:
    SEARCHERS = names("npujax.search.registry", "SEARCHERS")

    d = sub.add_parser(
        "demo", help="train, quantize, search and lower a CNN on the digits data",
        description="End-to-end run on scikit-learn's digits: float training, PTQ INT8, QAT "
                    "W8A8, mixed-precision search, NPU lowering; writes a report, CSVs, plots "
                    "and the model file.",
        epilog=epilog("npujax demo", "npujax demo --npu bitserial_16x16 --search-method ilp "
                      "--out runs/demo_bitserial"),
        formatter_class=argparse.RawDescriptionHelpFormatter)
    d.add_argument("--npu", default="edge_16x16", help="preset name or TOML path "
                   "(default: edge_16x16)")
    d.add_argument("--out", help="output folder (default: a new runs/<timestamp> folder)")
    d.add_argument("--seed", type=seed, default=0,
                   help="seed of the split, initialisation and shuffling (default 0)")
    d.add_argument("--epochs", type=positive_int, help="float training epochs (default 30)")
    d.add_argument("--qat-steps", type=positive_int, help="QAT steps (default 300)")
    d.add_argument("--search-steps", type=positive_int,
                   help="precision search steps (default 300)")
    d.add_argument("--finetune-steps", type=positive_int,
                   help="fine-tune steps after search (default 300)")
    d.add_argument("--search-method", choices=tuple(SEARCHERS),
                   help="precision searcher (default gradient)")
    add_progress_arg(d)
    d.set_defaults(fn=run)


def run(args: argparse.Namespace) -> int:
    from npujax.workflows.demo import DemoConfig, run_demo

    overrides = {k: v for k, v in {
        "float_epochs": args.epochs, "qat_steps": args.qat_steps,
        "search_steps": args.search_steps, "finetune_steps": args.finetune_steps,
        "search_method": args.search_method,
    }.items() if v is not None}
    config = DemoConfig(npu=args.npu, out=args.out, seed=args.seed,
                        progress=not args.no_progress, **overrides)
    run_demo(config, console=console())
    return 0

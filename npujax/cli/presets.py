"""``npujax presets``: the installed hardware presets."""

from __future__ import annotations

import argparse

from npujax.cli._common import epilog


def add_parser(sub: argparse._SubParsersAction) -> None:
    pr = sub.add_parser("presets", help="list the installed hardware presets",
                        description="The hardware presets installed with npujax (name and "
                                    "description with its sources); --npu takes these names or a "
                                    "path to your own TOML file.",
                        epilog=epilog("npujax presets", "npujax lower model.onnx --npu tpu_v1"),
                        formatter_class=argparse.RawDescriptionHelpFormatter)
    pr.set_defaults(fn=run)


def run(args: argparse.Namespace) -> int:
    from npujax.hw import list_presets, load_npu_spec

    names = list_presets()
    width = max(map(len, names), default=0)
    for name in names:
        print(f"{name:<{width}}  {load_npu_spec(name).description}")
    return 0

"""Benchmark: are the relaxed cost model's gradients useful? Gradient vs exact secant (issue 13).

Usage:  python experiments/bench/gradients.py [--layers 150] [--seed 0] [--out table.md]
                                             [--count-slope unit|mean]

For every preset and ``--layers`` random layers (GEMMs of log-uniform M, K, N with random
groups, and vector layers), compares ``d latency / d p x one unit`` of the relaxed model
(``layer_costs(..., relaxed=True)``) with the exact model's change over that unit
(:func:`npujax.plan.gradcheck.secant_check`: one row/col/core/lane, one bit less, 1 % more SRAM,
bandwidth or clock) and prints the sign and magnitude (within 2x) agreement rates, per
parameter and overall, as a Markdown table. Target: sign >= 95 %, magnitude >= 80 %.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from npujax.hw import list_presets, load_npu_spec
from npujax.plan.gradcheck import STEPS, secant_check
from npujax.plan.workload import Workload


def random_layers(n: int, rng: np.random.Generator) -> list[Workload]:
    """``n`` independent layers: 80 % GEMMs (log-uniform extents), 20 % vector layers."""
    out = []
    for i in range(n):
        if rng.random() < 0.8:
            M, K, N = (int(np.exp(rng.uniform(0, np.log(hi)))) for hi in (2**16, 2**12, 2**11))
            g = int(rng.choice([1, 1, 1, 2, 4]))
            out.append(Workload(name=f"g{i}", op="Conv", kind="gemm", M=M, K=K, N=N, groups=g,
                                macs=M * K * N * g, weight_elems=K * N * g, bias_elems=N * g,
                                in_elems=M * K * g, out_elems=M * N * g, cpu_ops=2 * M * K * N * g))
        else:
            e = int(np.exp(rng.uniform(np.log(16), np.log(2**20))))
            out.append(Workload(name=f"v{i}", op="Add", kind="vector", in_elems=2 * e,
                                out_elems=e, vector_ops=e, cpu_ops=e))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=150)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--temperature", type=float, default=None)
    ap.add_argument("--count-slope", default="unit", choices=("unit", "mean"),
                    help="slope of fold counts w.r.t. rows/cols/cores/lanes (default unit)")
    ap.add_argument("--out", default=None, help="also write the Markdown table here")
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    totals: dict[str, np.ndarray] = {}
    lines = []
    t0 = time.perf_counter()
    for preset in list_presets():
        spec = load_npu_spec(preset)
        layers = random_layers(args.layers, rng)
        wb = rng.integers(2, spec.array.operand_bits + 1, args.layers).astype(float)
        ab = rng.integers(2, spec.array.operand_bits + 1, args.layers).astype(float)
        chk = secant_check(layers, spec, wb, ab, temperature=args.temperature,
                           count_slope=args.count_slope)
        r = chk.rates()["all"]
        lines.append(f"| {preset} | {r['cases']} | {r['sign']:.1%} | {r['magnitude']:.1%} |")
        for k, v in chk.rates().items():
            acc = totals.setdefault(k, np.zeros(3))
            acc += [v["cases"], v["sign"] * v["cases"] if v["cases"] else 0,
                    v["magnitude"] * v["cases"] if v["cases"] else 0]
    rows = ["| preset | informative cases | sign agrees | magnitude within 2x |",
            "|---|---:|---:|---:|", *lines, "",
            "| parameter (one unit) | informative cases | sign agrees | magnitude within 2x |",
            "|---|---:|---:|---:|"]
    for k in [*STEPS, "all"]:
        n, s, m = totals[k]
        unit = "" if k == "all" else " ({:+g}{})".format(
            STEPS[k][1], " x" if STEPS[k][0] == "scale" else "")
        rows.append(f"| {k}{unit} | {int(n)} | {s / max(n, 1):.1%} | {m / max(n, 1):.1%} |")
    text = "\n".join(rows)
    print(text)
    print(f"\n{args.layers} random layers x {len(list_presets())} presets, seed {args.seed}, "
          f"count slope {args.count_slope}, {time.perf_counter() - t0:.1f} s")
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()

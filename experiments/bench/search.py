"""Benchmark: cost of the precision searchers vs a QAT fine-tune of the same number of steps.

Usage:  python experiments/bench/search.py [--steps 200]

On the demo CNN (digits), in one run and on the same machine state: a W8A8 QAT fine-tune of
``--steps`` steps, the gradient search (joint weights + bit logits) of the same number of steps,
and the sensitivity-based searchers (Hessian traces + integer program / greedy). Prints each time
and its ratio to the QAT fine-tune (target for the gradient search: <= 2x).
"""

from __future__ import annotations

import argparse
import time

from npujax.data.datasets import load_digits_nhwc
from npujax.frontends.flax import trace_flax
from npujax.hw import load_npu_spec
from npujax.ir.passes import optimize
from npujax.models.train import train_float
from npujax.quantize.calibrate import calibrate
from npujax.quantize.spec import quant_spec
from npujax.quantize.train import TrainConfig, train_graph
from npujax.search import SearchConfig, search_precision


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--npu", default="bitserial_16x16")
    args = ap.parse_args()
    data = load_digits_nhwc()
    model = train_float(data, epochs=5, learning_rate=3e-3, batch_size=64, seed=0)
    graph, params = optimize(*trace_flax(model, data.x_test[:1]))
    q8 = quant_spec(graph, 8, 8)
    qstate = calibrate(graph, params, [data.x_train[:512]], q8)
    spec = load_npu_spec(args.npu)
    x, y = data.x_train, data.y_train

    def qat():
        train_graph(graph, params, x, y, quant=q8, qstate=qstate,
                    config=TrainConfig(steps=args.steps))

    runs = {
        "QAT W8A8": qat,
        "gradient search": lambda: search_precision(
            graph, params, spec, x, y, qstate, SearchConfig(
                method="gradient", budget_ratio=0.8, steps=args.steps)),
        "gradient search, W and A widths": lambda: search_precision(
            graph, params, spec, x, y, qstate, SearchConfig(
                method="gradient", budget_ratio=0.6, act_candidates=(4, 8), steps=args.steps)),
        "ILP (16 Hutchinson probes)": lambda: search_precision(
            graph, params, spec, x, y, qstate, SearchConfig(
                method="ilp", budget_ratio=0.6, act_candidates=(4, 8))),
        "greedy (16 Hutchinson probes)": lambda: search_precision(
            graph, params, spec, x, y, qstate, SearchConfig(
                method="greedy", budget_ratio=0.6, act_candidates=(4, 8))),
    }
    times = {}
    for name, fn in runs.items():
        fn()  # warm-up: compilation is not part of the per-run cost
        best = float("inf")
        for _ in range(3):
            t = time.perf_counter()
            fn()
            best = min(best, time.perf_counter() - t)
        times[name] = best
    ref = times["QAT W8A8"]
    for name, t in times.items():
        print(f"{name:<32} {t:7.2f} s  {t / ref:5.2f}x QAT ({args.steps} steps)")
    for name in ("gradient search", "gradient search, W and A widths"):
        ratio = times[name] / ref
        verdict = "met" if ratio <= 2 else "NOT met"
        print(f"{name} / QAT = {ratio:.2f}x [target <= 2x: {verdict}]")


if __name__ == "__main__":
    main()

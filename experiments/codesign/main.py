"""Gradient co-design of hardware and precision vs random search, grid search, precision-only and
hardware-only choices, on the demo digits CNN.

Usage:  python experiments/codesign/main.py [--out docs/results] [--qat-steps 300]
                                            [--seeds 5] [--steps 200]

For each (base preset, objective) setting, at the base preset's area ("equal area": its
modelled blocks plus the PHY of its DRAM class), with the accuracy constraint of a summed
per-layer loss increase of 0.05 nats (measured sensitivities of the trained model):

* **joint** — :func:`npujax.search.codesign.codesign` (array shape, SRAM sizes, bandwidth class
  and per-layer (w, a) widths from 2, 4, 8) and its number of exact evaluations ``E``;
* **hardware-only** — the same descent with every layer at W8A8;
* **precision-only** — the same descent with the base preset's hardware;
* **random search** — ``10 E`` and ``100 E`` exact evaluations (median and best over seeds), and
  how many evaluations random search needs to reach the joint result;
* **grid search** — ``10 E`` and ``100 E`` exact evaluations (powers of two, uniform widths).

Then the joint policy is QAT-fine-tuned on the digits and its test accuracy is reported next to
the objective. Writes ``codesign_<model>.md``, the same figures as ``codesign_<model>.json``
and one Pareto plot per setting into ``--out``
(``docs/results/codesign.md`` gathers them with a reading written by hand).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import time
from pathlib import Path

import numpy as np
from flax import nnx

from npujax._atomic import atomic_write_text
from npujax.data.datasets import load_digits_nhwc, load_mnist5k_nhwc
from npujax.frontends.flax import trace_flax
from npujax.hw import area_mm2, load_npu_spec
from npujax.ir.passes import optimize
from npujax.models.cnn import SmallResNet
from npujax.models.train import train_float
from npujax.quantize.calibrate import calibrate
from npujax.quantize.spec import quant_spec
from npujax.quantize.train import TrainConfig, evaluate, train_graph
from npujax.search.codesign import (
    BANDWIDTH_CLASSES,
    CodesignConfig,
    codesign,
)
from npujax.search.codesign_baselines import grid_search, random_search
from npujax.workflows.codesign import model_sensitivity, plot_codesign

SETTINGS = (("bitserial_16x16", "latency"), ("bitserial_16x16", "edp"), ("edge_16x16", "edp"))
UNITS = {"latency": ("µs", 1e6), "energy": ("µJ", 1e6), "edp": ("pJ·s", 1e12)}


def needed(designs, target: float, objective: str) -> int | None:
    """Evaluations random search needed to reach ``target`` (None: never)."""
    best = np.inf
    for i, d in enumerate(designs):
        if d.feasible:
            best = min(best, d.objective(objective))
        if best <= target * (1 + 1e-9):
            return i + 1
    return None


def best_of(designs, n: int, objective: str) -> float:
    """The best feasible objective among the first ``n`` designs (inf if none)."""
    vals = [d.objective(objective) for d in designs[:n] if d.feasible]
    return min(vals) if vals else float("inf")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="docs/results")
    ap.add_argument("--qat-steps", type=int, default=300)
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--model", choices=("digits", "mnist-resnet"), default="digits",
                    help="the demo CNN on the digits, or SmallResNet on MNIST-5k")
    ap.add_argument("--settings", default=",".join(f"{p}:{o}" for p, o in SETTINGS),
                    help="preset:objective pairs, comma-separated")
    args = ap.parse_args()
    out = Path(args.out)
    settings = [tuple(s.split(":")) for s in args.settings.split(",")]
    t0 = time.time()
    if args.model == "digits":
        data = load_digits_nhwc()
        model = train_float(data, epochs=30, learning_rate=3e-3, batch_size=64, seed=0)
    else:
        data = load_mnist5k_nhwc()
        model = train_float(data, epochs=8, learning_rate=3e-3, batch_size=64, seed=0,
                            model=SmallResNet(rngs=nnx.Rngs(0), in_shape=(28, 28, 1), width=32))
    graph, params = optimize(*trace_flax(model, data.x_test[:1]))
    float_acc = evaluate(graph, params, data.x_test, data.y_test)
    sens = model_sensitivity(graph, params, data.x_train, data.y_train, (2, 4, 8))
    calib = [data.x_train[i * 64:(i + 1) * 64] for i in range(8)]
    q8 = quant_spec(graph, 8, 8)
    qat = TrainConfig(steps=args.qat_steps, learning_rate=1e-4, seed=1)
    base_params = train_graph(graph, params, data.x_train, data.y_train, quant=q8,
                              qstate=calibrate(graph, params, calib, q8), config=qat).params

    def accuracy(policy) -> float:
        q = policy.quant_spec(graph)
        qs = calibrate(graph, params, calib, q)
        p = train_graph(graph, base_params, data.x_train, data.y_train, quant=q, qstate=qs,
                        config=dataclasses.replace(qat, seed=2)).params
        return evaluate(graph, p, data.x_test, data.y_test, quant=q, qstate=qs)

    lines = [
        "# Hardware-precision co-design by gradient",
        "",
        f"Measured by `python experiments/codesign/main.py --model {args.model}` (float accuracy "
        f"{float_acc:.4f}; every figure is an exact `npujax lower` evaluation; QAT "
        f"{args.qat_steps} steps from the W8A8 QAT model). Each setting's area budget is the "
        "base preset's modelled area plus the PHY of its DRAM class (\"equal area\"); the "
        "accuracy constraint is a summed per-layer loss increase of at most 0.05 nats "
        "(measured one layer at a time on 256 training images). The DRAM classes' PHY area and "
        "power are assumptions (see `npujax/search/codesign.py`, `BANDWIDTH_CLASSES`).",
        "",
        "*E* is the number of exact evaluations (`lower` calls) the gradient co-design spends "
        "(the base design plus the rounded neighbours of the relaxed optimum); its "
        f"{args.steps} gradient steps run the relaxed model, not `lower`. Random search: "
        f"median (best) of {args.seeds} seeds. \"random needs\" is the median number of "
        "exact evaluations random search needs to match the joint result (\">N\" when a seed "
        "never does within 100 E).",
        "",
    ]
    summary = ["| base | objective | joint | E | hardware-only (INT8) | precision-only | "
               "random 10E | random 100E | random needs | grid 10E | grid 100E | "
               "accuracy joint / INT8 base |",
               "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    details = []
    records = []
    for preset, objective in settings:
        spec = load_npu_spec(preset)
        k0 = int(np.argmin([abs(np.log(c.dram_bytes_per_s / spec.memory.dram_bytes_per_s))
                            for c in BANDWIDTH_CLASSES]))
        area = float(area_mm2(spec)) + BANDWIDTH_CLASSES[k0].phy_area_mm2
        cfg = CodesignConfig(area_mm2=area, objective=objective, steps=args.steps)
        t = time.time()
        joint = codesign(graph, spec, sens, cfg)
        t_joint = time.time() - t
        hw = codesign(graph, spec, sens, dataclasses.replace(cfg, precision=False))
        prec = codesign(graph, spec, sens, dataclasses.replace(cfg, hardware=False))
        E = joint.exact_evaluations
        target = joint.best.objective(objective)
        rand = [random_search(graph, spec, sens, cfg, 100 * E, seed=s)
                for s in range(args.seeds)]

        r10 = [best_of(r, 10 * E, objective) for r in rand]
        r100 = [best_of(r, 100 * E, objective) for r in rand]
        need = [needed(r, target, objective) for r in rand]
        g10 = best_of(grid_search(graph, spec, sens, cfg, 10 * E), 10 * E, objective)
        g100 = best_of(grid_search(graph, spec, sens, cfg, 100 * E), 100 * E,
                       objective)
        unit, scale = UNITS[objective]
        acc = accuracy(joint.best.policy)
        acc8 = accuracy(joint.base.policy)
        need_txt = (f">{100 * E}" if sorted(n or 10**9 for n in need)[len(need) // 2] == 10**9
                    else str(int(np.median([n or 10**9 for n in need]))))
        summary.append(
            f"| {preset} | {objective} ({unit}) | **{target * scale:.4g}** | {E} | "
            f"{hw.best.objective(objective) * scale:.4g} | "
            f"{prec.best.objective(objective) * scale:.4g} | "
            f"{np.median(r10) * scale:.4g} ({min(r10) * scale:.4g}) | "
            f"{np.median(r100) * scale:.4g} ({min(r100) * scale:.4g}) | {need_txt} | "
            f"{g10 * scale:.4g} | {g100 * scale:.4g} | {acc:.4f} / {acc8:.4f} |")
        b = joint.best
        a = b.spec.array
        m = b.spec.memory
        details += [
            f"### {preset}, {objective}, area budget {area:.3f} mm²",
            "",
            f"Base at INT8: {joint.base.objective(objective) * scale:.4g} {unit}. Joint: "
            f"{a.rows}x{a.cols} array, SRAM {m.ifmap_sram_bytes // 1024}/"
            f"{m.filter_sram_bytes // 1024}/{m.ofmap_sram_bytes // 1024} KiB, "
            f"{b.bandwidth.name}, {b.area_mm2:.3f} mm², latency {b.latency_s * 1e6:.3f} µs, "
            f"energy {b.energy_j * 1e6:.3f} µJ, loss increase {b.loss_increase:.4f}; policy "
            + ", ".join(f"{n} W{b.policy.weight_bits[n]}A{b.policy.act_bits[n]}"
                        for n in b.policy.weight_bits)
            + f". Hardware-only: {hw.best.spec.array.rows}x{hw.best.spec.array.cols}, "
            f"{hw.best.bandwidth.name}. Joint co-design took {t_joint:.1f} s (CPU, compile "
            f"included). Random-search evaluations needed per seed: {need}.",
            "",
            f"![{preset} {objective}](codesign_{args.model}_{preset}_{objective}.png)",
            "",
        ]
        records.append({
            "preset": preset, "objective": objective, "area_budget_mm2": area,
            "exact_evaluations": E, "base_int8": joint.base.summary(),
            "joint": b.summary(), "hardware_only": hw.best.summary(),
            "precision_only": prec.best.summary(),
            "random_10E": r10, "random_100E": r100, "random_needed": need,
            "grid_10E": g10, "grid_100E": g100,
            "accuracy_joint": acc, "accuracy_int8_base": acc8, "joint_seconds": t_joint,
        })
        plot_codesign(out / f"codesign_{args.model}_{preset}_{objective}.png", joint, cfg)
        print(summary[-1], flush=True)
    text = "\n".join(lines + summary + [""] + details
                     + [f"Total run time {time.time() - t0:.0f} s.", ""])
    atomic_write_text(out / f"codesign_{args.model}.md", text)
    atomic_write_text(out / f"codesign_{args.model}.json", json.dumps({
        "model": args.model, "float_accuracy": float_acc, "qat_steps": args.qat_steps,
        "seeds": args.seeds, "steps": args.steps, "max_loss_increase": 0.05,
        "date_utc": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "run_seconds": time.time() - t0, "settings": records,
    }, indent=1, default=float) + "\n")
    print(text)


if __name__ == "__main__":
    main()

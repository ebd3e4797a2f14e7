"""Pareto fronts of accuracy vs modelled latency for precision policies on three kinds of NPU.

Usage:  python experiments/precision_search/main.py [--models digits,mnist-resnet]
                                                  [--out docs/results] [--qat-steps 300]

Models: the demo CNN on the digits (``digits``) and a ResNet-style CNN (stem + two residual blocks
of width 32, :class:`npujax.models.cnn.SmallResNet`) on the 5,000-image MNIST subset
(``mnist-resnet``, 1,000 test images). For the int8 array (edge_16x16), the bit-composable array
(bitfusion_16x16) and the bit-serial array (bitserial_16x16): uniform INT8, uniform INT4 (first
and last layers at 8 bits), and the greedy, integer-program (HAWQ-V3) and gradient searchers at
several latency budgets, all with the first and last layers pinned at W8A8 (the convention of
HAWQ-V3 and HAQ). Every policy is QAT-fine-tuned for the same number of steps from the same W8A8
QAT model; accuracy is on the held-out test split, latency from npujax.plan.lower. Writes
precision_search.md (tables + Pareto points) and one Pareto plot per model and preset.
"""

from __future__ import annotations

import argparse
import dataclasses
import io
import time
from pathlib import Path

from flax import nnx

from npujax._atomic import atomic_write_bytes, atomic_write_text
from npujax.data.datasets import load_digits_nhwc, load_mnist5k_nhwc
from npujax.errors import ConfigError
from npujax.frontends.flax import trace_flax
from npujax.hw import load_npu_spec
from npujax.ir.passes import optimize
from npujax.models.cnn import SmallResNet
from npujax.models.train import train_float
from npujax.ops import gemm_nodes
from npujax.plan import lower
from npujax.quantize.calibrate import calibrate
from npujax.quantize.spec import quant_spec
from npujax.quantize.train import TrainConfig, evaluate, train_graph
from npujax.search import SearchConfig, search_precision

PRESETS = ("edge_16x16", "bitfusion_16x16", "bitserial_16x16")
BUDGETS = (0.85, 0.7, 0.55)


def pareto(points):
    """Indices of the points not dominated in (lower latency, higher accuracy)."""
    keep = []
    for i, (lat, acc) in enumerate(points):
        if not any((l2 <= lat and a2 >= acc) and (l2 < lat or a2 > acc)
                   for j, (l2, a2) in enumerate(points) if j != i):
            keep.append(i)
    return keep


#: name -> (description, data loader, model factory, float epochs)
MODELS = {
    "digits": ("Demo CNN on digits (360 test images: one image is 0.28 points)",
               load_digits_nhwc, None, 30),
    "mnist-resnet": ("ResNet-style CNN (width 32) on MNIST-5k (1,000 test images: one image is 0.1 "
                     "points)",
                     load_mnist5k_nhwc,
                     lambda: SmallResNet(rngs=nnx.Rngs(0), in_shape=(28, 28, 1), width=32), 8),
}


def run_model(name: str, qat_steps: int, search_steps: int) -> tuple[dict, list[dict], list]:
    """All policies of one model on the three presets: (info, rows, layer names)."""
    title, load, factory, epochs = MODELS[name]
    data = load()
    model = train_float(data, epochs=epochs, learning_rate=3e-3, batch_size=64, seed=0,
                        model=factory() if factory else None)
    graph, params = optimize(*trace_flax(model, data.x_test[:1]))
    layers = [n.name for n in gemm_nodes(graph)]
    float_acc = evaluate(graph, params, data.x_test, data.y_test)
    q8 = quant_spec(graph, 8, 8)
    calib = [data.x_train[i * 64:(i + 1) * 64] for i in range(8)]
    qstate = calibrate(graph, params, calib, q8)
    qat = TrainConfig(steps=qat_steps, learning_rate=1e-4, seed=1)
    base = train_graph(graph, params, data.x_train, data.y_train, quant=q8, qstate=qstate,
                       config=qat).params

    def finetune(wbits, abits):
        q = quant_spec(graph, wbits, abits)
        qs = calibrate(graph, params, calib, q)
        p = train_graph(graph, base, data.x_train, data.y_train, quant=q, qstate=qs,
                        config=dataclasses.replace(qat, seed=2)).params
        return evaluate(graph, p, data.x_test, data.y_test, quant=q, qstate=qs)

    rows = []
    search_s: dict[str, list[float]] = {}
    for preset in PRESETS:
        spec = load_npu_spec(preset)
        acts = (8,) if spec.array.precision_scaling == "fixed" else (4, 8)
        edge = (layers[0], layers[-1])
        policies = {
            "uniform INT8": ({n: 8 for n in layers}, {n: 8 for n in layers}),
            "uniform INT4 (first/last 8)": (
                {n: (8 if n in edge else 4) for n in layers},
                {n: (8 if n in edge or acts == (8,) else 4) for n in layers}),
        }
        for method in ("greedy", "ilp", "gradient"):
            for b in BUDGETS:
                try:
                    t = time.perf_counter()
                    pol = search_precision(graph, base, spec, data.x_train, data.y_train,
                                           qstate, SearchConfig(
                                               method=method, budget_ratio=b,
                                               act_candidates=acts, steps=search_steps,
                                               pinned={layers[0]: 8, layers[-1]: 8})).policy
                    dt = time.perf_counter() - t
                    search_s.setdefault(method, []).append(dt)
                    print(f"{name} {preset} {method} {b}: {dt:.1f} s", flush=True)
                except ConfigError as e:
                    print(f"{name} {preset} {method} {b}: skipped ({e})", flush=True)
                    continue
                policies[f"{method} @{b:.2f}"] = (dict(pol.weight_bits), dict(pol.act_bits))
        int8 = lower(graph, spec).latency_s
        for pname, (wb, ab) in policies.items():
            lat = lower(graph, spec, quant_spec(graph, wb, ab)).latency_s
            acc = finetune(wb, ab)
            rows.append(dict(preset=preset, policy=pname, latency_us=lat * 1e6,
                             speedup=int8 / lat, accuracy=acc, weight_bits=wb, act_bits=ab))
            print(f"{name:<12} {preset:<16} {pname:<28} {lat * 1e6:9.3f} µs "
                  f"{int8 / lat:5.2f}x acc {acc:.4f}", flush=True)
    info = dict(name=name, title=title, float_accuracy=float_acc,
                search_s={m: sum(v) / len(v) for m, v in search_s.items()})
    return info, rows, layers


def plot_front(path: Path, title: str, sub: list[dict], front: set[int]) -> None:
    """Accuracy vs latency scatter with the Pareto front starred."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    for i, r in enumerate(sub):
        kind = r["policy"].split(" ")[0]
        ax.scatter(r["latency_us"], r["accuracy"], marker="*" if i in front else "o",
                   s=90 if i in front else 40, label=kind,
                   color={"uniform": "k", "greedy": "C1", "ilp": "C0", "gradient": "C2"}[kind])
    h, lab = ax.get_legend_handles_labels()
    uniq = dict(zip(lab, h))
    ax.legend(uniq.values(), uniq.keys(), fontsize=8)
    ax.set_xlabel("modelled latency (µs)")
    ax.set_ylabel("test accuracy")
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    atomic_write_bytes(path, buf.getvalue())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="digits,mnist-resnet",
                    help=f"comma-separated subset of {','.join(MODELS)}")
    ap.add_argument("--out", default="docs/results")
    ap.add_argument("--qat-steps", type=int, default=300)
    ap.add_argument("--search-steps", type=int, default=300)
    args = ap.parse_args()
    names = [m.strip() for m in args.models.split(",")]
    bad = [m for m in names if m not in MODELS]
    if bad:
        raise SystemExit(f"unknown models {bad}; choose from {list(MODELS)}")
    out = Path(args.out)
    lines = ["# Precision search: accuracy vs modelled latency", "",
             f"Every policy QAT-fine-tuned {args.qat_steps} steps from the same W8A8 QAT model "
             "of its network; the searchers keep the first and last layers at W8A8 and choose "
             "weights from {2, 4, 8} and (bit-flexible presets) activations from {4, 8}. "
             "Generated by `python experiments/precision_search/main.py`. "
             "★ marks the Pareto front per model and preset.", ""]
    for name in names:
        info, rows, layers = run_model(name, args.qat_steps, args.search_steps)
        lines += [f"## {info['title']}", "",
                  f"Float accuracy {info['float_accuracy']:.4f}; GEMM layers "
                  f"{', '.join(layers)}. Mean search time per policy: "
                  + ", ".join(f"{m} {t:.1f} s" for m, t in info["search_s"].items()) + ".", "",
                  "| preset | policy | W bits | A bits | latency (µs) | × vs INT8 | accuracy |",
                  "|---|---|---|---|---|---|---|"]
        for preset in PRESETS:
            sub = [r for r in rows if r["preset"] == preset]
            front = set(pareto([(r["latency_us"], r["accuracy"]) for r in sub]))
            for i, r in enumerate(sub):
                star = " ★" if i in front else ""
                lines.append(
                    f"| {preset} | {r['policy']}{star} | "
                    f"{','.join(str(r['weight_bits'][n]) for n in layers)} | "
                    f"{','.join(str(r['act_bits'][n]) for n in layers)} | "
                    f"{r['latency_us']:.3f} | {r['speedup']:.2f} | {r['accuracy']:.4f} |")
            plot_front(out / f"precision_search_{name}_{preset}.png",
                       f"{name}: accuracy vs latency on {preset} (★: Pareto front)", sub, front)
        lines += ["", *(f"![{name} on {p}](precision_search_{name}_{p}.png)" for p in PRESETS),
                  ""]
        atomic_write_text(out / "precision_search.md", "\n".join(lines))
    print(f"wrote {out}/precision_search.md")


if __name__ == "__main__":
    main()

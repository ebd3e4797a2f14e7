"""A small ViT trained on MNIST-5k: float, PTQ W8A8, QAT W8A8 (every matmul -- attention's
``Q K^T`` and ``P V`` included -- and the softmax output at 8 bits) and a searched mixed-precision
policy QAT-fine-tuned, with its modelled latency on a bit-serial NPU.

Usage: python experiments/vit_mnist/main.py [--config config.toml] [--out docs/results]
       [--quick]   (a smoke run: 1 epoch, 20 QAT steps)

Writes <out>/vit_mnist.md (the table) and <out>/vit_mnist.json, and prints the table.
"""

from __future__ import annotations

import argparse
import json
import time
import tomllib
from pathlib import Path

import numpy as np
import optax
from flax import nnx
from rich.console import Console

import npujax as nj
from npujax._atomic import atomic_write_text
from npujax.data.datasets import load_mnist5k_nhwc
from npujax.models.train import train_float
from npujax.models.transformer import ViT
from npujax.quantize import evaluate

HERE = Path(__file__).resolve().parent


def load_config(path: str | Path) -> dict:
    """config.toml with the tables of ``path`` merged over it."""
    cfg = tomllib.loads((HERE / "config.toml").read_text())
    for k, v in tomllib.loads(Path(path).read_text()).items():
        cfg[k] = {**cfg.get(k, {}), **v}
    return cfg


def shift(x: np.ndarray, rng: np.random.Generator, pixels: int) -> np.ndarray:
    """The batch translated by one random offset of up to ``pixels`` (wrapping around)."""
    dy, dx = rng.integers(-pixels, pixels + 1, 2)
    return np.roll(x, (int(dy), int(dx)), axis=(1, 2))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=str(HERE / "config.toml"))
    ap.add_argument("--out", default=str(HERE.parents[1] / "docs" / "results"))
    ap.add_argument("--quick", action="store_true", help="1 epoch, 20 QAT steps (smoke test)")
    ap.add_argument("--float-model", help="reuse the float model saved here (npujax.save_graph "
                    "file; written after training when missing)")
    args = ap.parse_args()
    cfg = load_config(args.config)
    fl, qc, sc = cfg["float"], cfg["qat"], dict(cfg["search"])
    if args.quick:
        fl["epochs"], qc["steps"], cfg["mixed_qat"]["steps"] = 1, 20, 20
    con = Console()
    data = load_mnist5k_nhwc()
    x, y, xte, yte = data.x_train, data.y_train, data.x_test, data.y_test
    rows, res = [], {"config": cfg}

    t = time.time()
    if args.float_model and Path(args.float_model).exists():
        graph, params = nj.load_graph(args.float_model)[:2]
    else:
        steps = fl["epochs"] * (len(x) // fl["batch_size"])
        warm = min(fl["warmup_epochs"] * (len(x) // fl["batch_size"]), steps // 2)
        opt = optax.adamw(optax.warmup_cosine_decay_schedule(0.0, fl["learning_rate"], warm,
                                                             steps),
                          weight_decay=fl["weight_decay"])
        model = train_float(data, epochs=fl["epochs"], learning_rate=fl["learning_rate"],
                            batch_size=fl["batch_size"], seed=fl["seed"], progress=True,
                            model=ViT(**cfg["model"], rngs=nnx.Rngs(fl["seed"])), optimizer=opt,
                            augment=lambda xb, rng: shift(xb, rng, fl["shift_pixels"]))
        graph, params = nj.optimize(*nj.trace_flax(model, x[:1]))
        if args.float_model:
            nj.save_graph(args.float_model, graph, params)
    spec = nj.load_npu_spec(sc.pop("npu"))
    int8_s = nj.lower(graph, spec).latency_s
    acc = evaluate(graph, params, xte, yte)
    rows.append(("float", acc, None, f"{time.time() - t:.0f} s train"))
    con.print(f"float: {100 * acc:.1f} % ({time.time() - t:.0f} s)")

    calib = [x[i:i + 64] for i in range(0, 64 * qc["calibration_batches"], 64)]
    q8 = nj.quant_spec(graph, 8, 8)
    n_att = sum(graph.node(n).op == "MatMul" for n in q8)
    p8, qs8 = nj.ptq(graph, params, calib, q8)
    rows.append((f"PTQ W8A8 ({len(q8)} layers, {n_att} attention)",
                 evaluate(graph, p8, xte, yte, quant=q8, qstate=qs8), int8_s, ""))
    t = time.time()
    pq = nj.train_graph(graph, p8, x, y, quant=q8, qstate=qs8, config=nj.TrainConfig(
        steps=qc["steps"], learning_rate=qc["learning_rate"], progress=True,
        description="QAT W8A8")).params
    rows.append((f"QAT W8A8 ({qc['steps']} steps)",
                 evaluate(graph, pq, xte, yte, quant=q8, qstate=qs8), int8_s,
                 f"{time.time() - t:.0f} s"))
    con.print(f"PTQ / QAT W8A8: {100 * rows[-2][1]:.1f} / {100 * rows[-1][1]:.1f} %")

    t = time.time()
    sc["candidates"], sc["act_candidates"] = tuple(sc["candidates"]), tuple(sc["act_candidates"])
    report = nj.search_precision(graph, params, spec, x, y, qs8,
                                 nj.SearchConfig(**sc, progress=True))
    policy = report.policy
    mc = cfg["mixed_qat"]
    qm = policy.quant_spec(graph, quantizer=mc["quantizer"])
    pm, qsm = nj.ptq(graph, params, calib, qm)
    ptq_m = evaluate(graph, pm, xte, yte, quant=qm, qstate=qsm)
    pm, qsm, _ = nj.train_graph(graph, pm, x, y, quant=qm, qstate=qsm, config=nj.TrainConfig(
        steps=mc["steps"], learning_rate=mc["learning_rate"], progress=True,
        description="QAT mixed"))
    lat = nj.lower(graph, spec, qm).latency_s
    widths = sorted({(policy.weight_bits[n], policy.act_bits[n]) for n in qm})
    rows.append((f"mixed PTQ ({report.method}, budget {sc['budget_ratio']} x INT8)", ptq_m, lat,
                 ""))
    rows.append((f"mixed QAT ({mc['quantizer'].upper()}, {mc['steps']} steps)",
                 evaluate(graph, pm, xte, yte, quant=qm, qstate=qsm), lat,
                 f"{time.time() - t:.0f} s search + QAT"))
    res["policy"] = {n: [policy.weight_bits[n], policy.act_bits[n]] for n in qm}

    head = (f"| ViT on MNIST-5k (patch {cfg['model']['patch']}, d={cfg['model']['d_model']}, "
            f"{cfg['model']['layers']} blocks; {len(xte)} test images) | test accuracy % | "
            f"modelled latency on {spec.name} µs | speedup vs INT8 | time |\n|---|---|---|---|---|")
    lines = [f"| {name} | {100 * a:.1f} | {'' if s is None else f'{s * 1e6:.2f}'} | "
             f"{'' if s is None else f'{int8_s / s:.2f}x'} | {note} |"
             for name, a, s, note in rows]
    table = "\n".join([head, *lines]) + (
        f"\n\nMixed policy (weight, activation) widths used: {widths}; per layer in "
        "vit_mnist.json.\n")
    res["rows"] = [{"run": r[0], "accuracy": r[1], "latency_s": r[2]} for r in rows]
    out = Path(args.out)
    if not args.quick:
        atomic_write_text(out / "vit_mnist.md", "# ViT on MNIST-5k\n\nGenerated by `python "
                          "experiments/vit_mnist/main.py` (the setup and the reading: "
                          "transformers.md).\n\n" + table)
        atomic_write_text(out / "vit_mnist.json", json.dumps(res, indent=1, default=str))
    con.print(table)


if __name__ == "__main__":
    main()

"""Quantized attention, measured: a small ViT trained on the digits (float vs PTQ vs QAT at W8A8
and W4A8, every matmul -- attention included -- and the softmax output quantized), and the logits
SQNR of a decoder-only LLM (random initialisation) at W8A8 and W4A8.

Usage: python experiments/transformer_quant/main.py [--steps 1500] [--qat-steps 300]

Prints a markdown table (paste into docs/results/transformers.md).
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

import npujax as nj
from npujax.data.datasets import load_digits_nhwc
from npujax.models.train import train_float
from npujax.models.transformer import DECODER_CONFIGS, Decoder, ViT
from npujax.quantize.train import TrainConfig, train_graph


def accuracy(graph, params, x, y, **kw) -> float:
    run = jax.jit(lambda p, v: nj.execute(graph, p, v, **kw))
    logits = np.concatenate([np.asarray(run(params, x[i:i + 120])) for i in range(0, len(x), 120)])
    return float(np.mean(logits.argmax(-1) == y))


def sqnr_db(y, ref) -> float:
    y, ref = np.asarray(y, np.float64), np.asarray(ref, np.float64)
    return float(10 * np.log10(np.sum(ref ** 2) / np.sum((y - ref) ** 2)))


def vit_rows(steps: int, qat_steps: int) -> list[str]:
    data = load_digits_nhwc()
    t = time.time()
    model = ViT(image=8, patch=2, d_model=32, heads=4, d_ff=64, layers=2, rngs=nnx.Rngs(0))
    model = train_float(data, epochs=max(1, steps * 64 // len(data.x_train)), learning_rate=2e-3,
                        batch_size=64, seed=0, model=model)
    graph, params = nj.optimize(*nj.trace_flax(model, data.x_train[:1]))
    rows = [f"| float | - | {100 * accuracy(graph, params, data.x_test, data.y_test):.1f} | "
            f"{time.time() - t:.0f} s train |"]
    calib = [data.x_train[i:i + 128] for i in range(0, 512, 128)]
    for wb in (8, 4):
        q = nj.quant_spec(graph, wb, 8)
        n_att = sum(graph.node(n).op in ("MatMul", "Einsum") for n in q)
        p_ptq, qs = nj.ptq(graph, params, calib, q)
        acc = accuracy(graph, p_ptq, data.x_test, data.y_test, quant=q, qstate=qs)
        rows.append(f"| W{wb}A8 PTQ (min-max, bias corr.) | {len(q)} ({n_att} attention) | "
                    f"{100 * acc:.1f} | |")
        t = time.time()
        p_qat = train_graph(graph, p_ptq, data.x_train, data.y_train, quant=q, qstate=qs,
                            config=TrainConfig(steps=qat_steps, learning_rate=2e-4)).params
        acc = accuracy(graph, p_qat, data.x_test, data.y_test, quant=q, qstate=qs)
        rows.append(f"| W{wb}A8 QAT (STE, {qat_steps} steps) | {len(q)} ({n_att} attention) | "
                    f"{100 * acc:.1f} | {time.time() - t:.0f} s |")
    return rows


def decoder_rows() -> list[str]:
    cfg = DECODER_CONFIGS["tiny"]
    m = Decoder(cfg, phase="prefill", seq_len=16, rngs=nnx.Rngs(0))
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, cfg.vocab, (8, 16)), jnp.int32)
    graph, params = nj.optimize(*nj.trace_flax(m, tokens[:1]))
    ref = jax.jit(lambda p, x: nj.execute(graph, p, x))(params, tokens[4:])
    rows = []
    for wb in (8, 4):
        q = nj.quant_spec(graph, wb, 8)
        qs = nj.calibrate(graph, params, [tokens[:4]], q)
        y = jax.jit(lambda p, s, x: nj.execute(graph, p, x, quant=q, qstate=s))(  # noqa: B023
            params, qs, tokens[4:])
        no_att = {k: v for k, v in q.items() if graph.node(k).op not in ("MatMul", "Einsum")}
        y2 = jax.jit(lambda p, s, x: nj.execute(graph, p, x, quant=no_att, qstate=s))(  # noqa: B023
            params, qs, tokens[4:])
        rows.append(f"| tiny decoder W{wb}A8 | {sqnr_db(y, ref):.1f} dB | "
                    f"{sqnr_db(y2, ref):.1f} dB |")
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=1500, help="float training steps (batch 64)")
    ap.add_argument("--qat-steps", type=int, default=300)
    a = ap.parse_args()
    print("| ViT (digits 8x8, 2 blocks, d=32) | quantized layers | test accuracy % | time |")
    print("|---|---|---|---|")
    print("\n".join(vit_rows(a.steps, a.qat_steps)))
    print()
    print("| decoder (random init, 16 tokens) | logits SQNR, attention quantized | "
          "attention float |")
    print("|---|---|---|")
    print("\n".join(decoder_rows()))


if __name__ == "__main__":
    main()

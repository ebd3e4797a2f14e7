"""Time of one jitted QAT training step vs the float step on the same model, same run.

Usage: python experiments/bench/qat_step.py [--model lenet|resnet|vit] [--batch 64] [--repeats 50]

Both steps are ``value_and_grad`` of the cross-entropy of ``npujax.ir.execute.execute`` plus an Adam
update, jitted once; the QAT step adds W8A8 fake-quant (per-channel weight scales from the
current weights, calibrated per-tensor activation ranges, straight-through gradients; for the
ViT of experiments/vit_mnist also both operands of attention's ``Q K^T`` and ``P V`` and the
softmax output on its fixed grid). The two
are timed interleaved (median of ``repeats`` rounds, each step blocked on), so load on a shared
machine affects both alike. Prints the ratio; the target is <= 1.3x.
"""

from __future__ import annotations

import argparse
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from npujax.frontends.flax import trace_flax
from npujax.ir.execute import execute
from npujax.ir.passes import optimize
from npujax.models.cnn import LeNet, SmallResNet
from npujax.models.transformer import ViT
from npujax.quantize.calibrate import calibrate
from npujax.quantize.spec import quant_spec
from npujax.quantize.train import cross_entropy


def make_step(graph, opt, quant=None, qstate=None):
    @jax.jit
    def step(params, opt_state, x, y):
        loss, grads = jax.value_and_grad(
            lambda p: cross_entropy(execute(graph, p, x, quant=quant, qstate=qstate), y))(params)
        updates, opt_state = opt.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    return step


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", choices=("lenet", "resnet", "vit"), default="lenet")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=50)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.uniform(size=(args.batch, 28, 28, 1)), jnp.float32)
    y = jnp.asarray(rng.integers(0, 10, args.batch), jnp.int32)
    if args.model == "vit":  # the ViT of experiments/vit_mnist/config.toml
        model = ViT(image=28, patch=7, d_model=64, heads=4, d_ff=128, layers=2,
                    patch_embedding="linear", rngs=nnx.Rngs(0))
    else:
        cls = LeNet if args.model == "lenet" else SmallResNet
        model = cls(rngs=nnx.Rngs(0), in_shape=(28, 28, 1))
    model.eval()
    graph, params = optimize(*trace_flax(model, x[:1]))
    q = quant_spec(graph, 8, 8)
    qstate = calibrate(graph, params, [x], q)
    opt = optax.adam(1e-3)
    steps = {"float": make_step(graph, opt), "qat": make_step(graph, opt, q, qstate)}
    state = {k: (params, opt.init(params)) for k in steps}
    times = {k: [] for k in steps}
    for k, f in steps.items():  # compile and warm up
        for _ in range(3):
            p, s, loss = f(*state[k], x, y)
            jax.block_until_ready(loss)
    for _ in range(args.repeats):
        for k, f in steps.items():
            t = time.perf_counter()
            p, s, loss = f(*state[k], x, y)
            jax.block_until_ready((p, loss))
            times[k].append(time.perf_counter() - t)
    med = {k: statistics.median(v) for k, v in times.items()}
    ratio = med["qat"] / med["float"]
    print(f"model {args.model}, batch {args.batch}, {jax.default_backend()}: "
          f"float step {med['float'] * 1e3:.2f} ms, QAT W8A8 step {med['qat'] * 1e3:.2f} ms, "
          f"ratio {ratio:.2f}x (target <= 1.3x)")


if __name__ == "__main__":
    main()

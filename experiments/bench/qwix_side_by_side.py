"""npujax's ``quantize_model`` side by side with qwix's QAT on the same NNX models (digits): the
DigitsCNN and the ViT of ``npujax.models.transformer``.

Usage: python experiments/bench/qwix_side_by_side.py [--models cnn,vit] [--steps 200]
       [--repeats 30] [--out FILE.md]

Needs qwix (``pip install qwix``, the ``compare`` extra; not an npujax dependency). Both start
from the same float model (trained once here), quantize it W8A8 with the same rule in qwix's
vocabulary (``module_path=".*"``, ``weight_qtype="int8"``, ``act_qtype="int8"``), and train
with the same user-written NNX loop: ``nnx.Optimizer(qmodel, optax.adam(1e-4))``,
``nnx.value_and_grad``, ``nnx.jit``, the same batches. Reported: the lines of user code each
library needs (the functions ``npujax_setup`` / ``qwix_setup`` below, counted without blank
lines and comments),
test accuracy after the same steps (each evaluated by its own fake-quant model), and the QAT
step time, timed interleaved (one step of each per round, each blocked on; median of
``repeats`` rounds) so that load on a shared machine affects both alike.

Differences that stay: npujax folds BatchNorm into the conv (frozen statistics) and calibrates
static activation ranges, as the deployed integer model runs; qwix keeps BatchNorm separate and
quantizes activations with dynamic per-batch ranges. In the ViT, npujax also quantizes both
operands of attention's two activation-activation matmuls (static grids; the softmax output on
its fixed [0, 1] grid).
"""

from __future__ import annotations

import argparse
import inspect
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx


def npujax_setup(model, x_sample):
    import npujax

    rules = [npujax.QuantRule(module_path=".*", weight_qtype="int8", act_qtype="int8")]
    return npujax.quantize_model(model, rules, x_sample)


def qwix_setup(model, x_sample):
    import qwix

    rules = [qwix.QtRule(module_path=".*", weight_qtype="int8", act_qtype="int8")]
    return qwix.quantize_model(model, qwix.QtProvider(rules), x_sample)


def _user_lines(fn) -> int:
    src = inspect.getsource(fn).splitlines()[1:]  # without the def line
    return sum(1 for s in src if s.strip() and not s.strip().startswith("#"))


def train_step():
    @nnx.jit
    def step(qmodel, opt, x, y):
        def loss_fn(m):
            return optax.softmax_cross_entropy_with_integer_labels(m(x), y).mean()

        loss, grads = nnx.value_and_grad(loss_fn)(qmodel)
        opt.update(qmodel, grads)
        return loss

    return step


def accuracy(qmodel, x, y) -> float:
    logits = nnx.jit(lambda m, v: m(v))(qmodel, jnp.asarray(x))
    return float(jnp.mean(jnp.argmax(logits, -1) == jnp.asarray(y)))


def float_model(name: str, data):
    """The float model both libraries start from: trained here, in eval mode."""
    from npujax.models.train import train_float

    if name == "cnn":
        model = train_float(data, epochs=20, learning_rate=3e-3, batch_size=64, seed=0)
    else:  # the ViT of docs/results/transformers.md (digits 8x8, patch 2, 2 blocks, d=32)
        from npujax.models.transformer import ViT

        vit = ViT(image=8, patch=2, d_model=32, heads=4, d_ff=64, layers=2, rngs=nnx.Rngs(0))
        model = train_float(data, epochs=max(1, 1500 * 64 // len(data.x_train)),
                            learning_rate=2e-3, batch_size=64, seed=0, model=vit)
    model.eval()
    return model


def compare(name: str, data, args) -> dict[str, dict[str, float]]:
    """Accuracy before/after the same QAT steps and the interleaved median step time."""
    base = float_model(name, data)
    xs = jnp.asarray(data.x_train[:256])
    models = {"npujax": npujax_setup(nnx.clone(base), xs), "qwix": qwix_setup(nnx.clone(base),
                                                                              xs)}
    opts = {k: nnx.Optimizer(m, optax.adam(1e-4), wrt=nnx.Param) for k, m in models.items()}
    steps = {k: train_step() for k in models}
    rng = np.random.default_rng(0)
    float_acc = float(jnp.mean(jnp.argmax(base(jnp.asarray(data.x_test)), -1)
                               == jnp.asarray(data.y_test)))
    before = {k: accuracy(m, data.x_test, data.y_test) for k, m in models.items()}
    times: dict[str, list[float]] = {k: [] for k in models}
    for i in range(args.steps):
        idx = rng.choice(len(data.x_train), args.batch, replace=False)
        xb, yb = jnp.asarray(data.x_train[idx]), jnp.asarray(data.y_train[idx])
        for k in (("npujax", "qwix") if i % 2 == 0 else ("qwix", "npujax")):  # interleaved
            t0 = time.perf_counter()
            jax.block_until_ready(steps[k](models[k], opts[k], xb, yb))
            if i >= args.steps - args.repeats:
                times[k].append(time.perf_counter() - t0)
    after = {k: accuracy(m, data.x_test, data.y_test) for k, m in models.items()}
    return {k: {"float": float_acc, "before": before[k], "after": after[k],
                "step_s": statistics.median(times[k])} for k in models}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="cnn,vit", help="comma-separated: cnn, vit")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--out", help="also write the markdown table here")
    args = ap.parse_args()

    from npujax.data.datasets import load_digits_nhwc

    data = load_digits_nhwc()
    names = [m.strip() for m in args.models.split(",") if m.strip()]
    res = {name: compare(name, data, args) for name in names}
    lines = {"npujax": _user_lines(npujax_setup), "qwix": _user_lines(qwix_setup)}
    title = {"cnn": "DigitsCNN", "vit": "ViT"}
    rows = ["| | " + " | ".join(f"{title[n]}: npujax | {title[n]}: qwix" for n in names) + " |",
            "|---|" + "---|---|" * len(names)]

    def row(label, cell):
        rows.append(f"| {label} | " + " | ".join(f"{cell(n, 'npujax')} | {cell(n, 'qwix')}"
                                                 for n in names) + " |")

    row("user code to quantize (lines)", lambda n, k: lines[k])
    row("training loop", lambda n, k: "the same NNX loop")
    row("test accuracy, float model", lambda n, k: f"{res[n][k]['float']:.3f}")
    row("test accuracy, W8A8 before QAT", lambda n, k: f"{res[n][k]['before']:.3f}")
    row(f"test accuracy after {args.steps} QAT steps", lambda n, k: f"{res[n][k]['after']:.3f}")
    row(f"QAT step, median of {args.repeats} (ms)",
        lambda n, k: f"{1e3 * res[n][k]['step_s']:.2f}")
    row("step time ratio npujax / qwix",
        lambda n, k: f"{res[n]['npujax']['step_s'] / res[n]['qwix']['step_s']:.2f}"
        if k == "npujax" else "1")
    table = "\n".join(rows)
    print(table)
    if args.out:
        with open(args.out, "w") as f:
            f.write(table + "\n")


if __name__ == "__main__":
    main()

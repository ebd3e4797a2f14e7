"""Data-parallel QAT and precision search: 8 forced host devices give the one-device results for
the same global batches (to float rounding: the batch mean is summed per device, then across
devices, in another order than on one device)."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import jax
import numpy as np
import pytest

from npujax.errors import ConfigError
from npujax.quantize.parallel import data_parallel
from npujax.search import SearchConfig

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = """
import json, sys
import time
import jax, jax.numpy as jnp, numpy as np, optax
from flax import nnx
from npujax.data.datasets import load_digits_nhwc
from npujax.errors import ConfigError
from npujax.frontends.flax import trace_flax
from npujax.ir.passes import optimize
from npujax.models.cnn import DigitsCNN
from npujax.quantize import calibrate, evaluate, execute, quant_spec, train_graph, cross_entropy
from npujax.quantize import TrainConfig
from npujax.search import SearchConfig, search_precision

assert len(jax.local_devices()) == 8, jax.local_devices()
data = load_digits_nhwc()
g, p = optimize(*trace_flax(DigitsCNN(rngs=nnx.Rngs(0)), jnp.zeros((1, 8, 8, 1), jnp.float32)))
x, y = data.x_train[:256], data.y_train[:256]
q = quant_spec(g, 8, 8)
qs = calibrate(g, p, [x[:128]], q)
out = {}
runs = {}
for devices in (None, "all"):  # one device, then the batch split over 8
    t0 = time.perf_counter()
    # plain SGD: Adam divides by sqrt(v), so a gradient that is zero up to rounding (1e-12
    # on one device, -1e-12 on eight) becomes a full +-lr step; SGD keeps rounding at rounding
    tp = train_graph(g, p, x, y, quant=q, qstate=qs, config=TrainConfig(
        steps=6, batch_size=64, optimizer=optax.sgd(0.1), devices=devices)).params
    print("qat", devices, time.perf_counter() - t0, file=sys.stderr)
    leaf = tp["conv1"]["kernel"]
    # jitted, as a user evaluates (an eager execute compiles every op: ~12 s here)
    loss = float(jax.jit(lambda p, x, y: cross_entropy(execute(g, p, x, quant=q, qstate=qs),
                                                       y))(tp, jnp.asarray(x), jnp.asarray(y)))
    acc = evaluate(g, tp, data.x_test, data.y_test, quant=q, qstate=qs)
    pols = {}
    for method in ("ilp", "gradient"):
        # sensitivity "loss": one compiled program on the sharded batch (the Hessian variant
        # gives equal widths too, but its eager per-layer passes compile ~300 times)
        rep = search_precision(g, p, "edge_16x16", x, y, qs, SearchConfig(
            method=method, sensitivity="loss", candidates=(4, 8), budget_ratio=0.8,
            sensitivity_batch=64, steps=6, batch_size=32, devices=devices))
        pols[method] = {n: [rep.policy.weight_bits[n], rep.policy.act_bits[n]]
                        for n in rep.policy.weight_bits}
        if method == "gradient":
            pols["gradient_probabilities"] = rep.details["probabilities"]
        print(method, devices, time.perf_counter() - t0, file=sys.stderr)
    runs[str(devices)] = (tp, loss, acc, pols, len(leaf.sharding.device_set))
(p1, l1, a1, s1, d1), (p8, l8, a8, s8, d8) = runs["None"], runs["all"]
out["devices"] = [d1, d8]
out["max_param_diff"] = max(float(jnp.max(jnp.abs(a - b))) for a, b in
                            zip(jax.tree.leaves(p1), jax.tree.leaves(p8)))
out["max_param"] = max(float(jnp.max(jnp.abs(a))) for a in jax.tree.leaves(p1))
out["loss"] = [l1, l8]
out["accuracy"] = [a1, a8]
out["policies"] = [s1, s8]

# a quantized Flax model in the user's own nnx.jit loop: replicate its state, shard the batches
import npujax
from npujax.quantize import data_parallel
from npujax.quantize.rules import QuantRule
def flax_run(devices):
    m = DigitsCNN(rngs=nnx.Rngs(0))
    qm = npujax.quantize_model(m, [QuantRule(module_path=".*", weight_qtype="int8",
                                             act_qtype="int8")], x[:64])
    opt = nnx.Optimizer(qm, optax.sgd(0.1), wrt=nnx.Param)
    dp, place = data_parallel(devices), jnp.asarray
    if dp is not None:
        nnx.update(qm, dp.replicate(nnx.state(qm)))
        nnx.update(opt, dp.replicate(nnx.state(opt)))
        place = dp.shard

    @nnx.jit
    def step(qm, opt, xb, yb):
        def loss_fn(qm):
            return optax.softmax_cross_entropy_with_integer_labels(qm(xb), yb).mean()
        loss, grads = nnx.value_and_grad(loss_fn)(qm)
        opt.update(qm, grads)
        return loss

    losses = [float(step(qm, opt, place(x[i:i + 64]), place(y[i:i + 64])))
              for i in range(0, 192, 64)]
    return losses, m.fc2.kernel[...]
(fl1, fk1), (fl8, fk8) = flax_run(None), flax_run("all")
out["flax_losses"] = [fl1, fl8]
out["flax_kernel_diff"] = float(jnp.max(jnp.abs(fk1 - fk8)))
out["flax_kernel_max"] = float(jnp.max(jnp.abs(fk1)))
out["flax_devices"] = len(fk8.sharding.device_set)
try:
    train_graph(g, p, x, y, config=TrainConfig(steps=1, batch_size=60, devices="all"))
    out["indivisible"] = None
except ConfigError as e:
    out["indivisible"] = str(e)
json.dump(out, sys.stdout)
"""


@pytest.mark.integration  # one subprocess: 2 QAT runs and 4 searches
def test_eight_host_devices_equal_one_device():
    env = {**os.environ, "XLA_FLAGS": os.environ.get("XLA_FLAGS", "")
           + " --xla_force_host_platform_device_count=8"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    p = subprocess.run([sys.executable, "-c", textwrap.dedent(SCRIPT)], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stderr[-4000:]
    print(p.stderr[-2000:])
    r = json.loads(p.stdout)
    print({k: v for k, v in r.items() if k not in ("policies", "indivisible")})
    assert r["devices"] == [1, 8]  # the data-parallel params really live on 8 devices
    # QAT: same params, loss and accuracy after the same 6 global batches
    assert r["max_param_diff"] <= 1e-5 * max(1.0, r["max_param"]), r
    assert abs(r["loss"][0] - r["loss"][1]) <= 1e-5 * abs(r["loss"][0]), r["loss"]
    assert r["accuracy"][0] == r["accuracy"][1]
    # precision search: the same chosen widths (ILP on Hessian sensitivities; gradient search)
    one, eight = r["policies"]
    assert one["ilp"] == eight["ilp"] and one["gradient"] == eight["gradient"]
    for n, pr in one["gradient_probabilities"].items():
        assert max(abs(a - b) for a, b in zip(pr, eight["gradient_probabilities"][n])) < 1e-5
    # the Flax path (quantize_model in an nnx.jit loop): same losses and weights
    assert r["flax_devices"] == 8
    np.testing.assert_allclose(r["flax_losses"][1], r["flax_losses"][0], rtol=1e-5)
    assert r["flax_kernel_diff"] <= 1e-4 * max(1.0, r["flax_kernel_max"]), r
    assert "60 examples" in r["indivisible"] and "multiple of 8" in r["indivisible"]


def test_devices_option_is_validated():
    with pytest.raises(ConfigError, match="local device"):
        data_parallel(len(jax.local_devices()) + 1)
    with pytest.raises(ConfigError, match="'all'"):
        data_parallel("gpu")
    with pytest.raises(ConfigError, match="devices"):
        SearchConfig(devices=0)
    assert data_parallel(None) is None
    assert data_parallel(1).size == 1


def test_cli_devices_option_is_a_one_line_usage_error(capsys):
    from npujax.cli import main

    for cmd in (["search", "m.npz"], ["qat", "--policy", "p.json", "--model", "m.npz"]):
        with pytest.raises(SystemExit) as e:
            main([*cmd, "--devices", "two"])
        err = capsys.readouterr().err
        assert e.value.code == 2 and err.count("\n") == 1, err
        assert "--devices: takes 'all' or a device count >= 1, got 'two'" in err

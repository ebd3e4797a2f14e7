import json
import subprocess
import sys

import jax
import jax.numpy as jnp
import pytest
from flax import nnx

from npujax.data.datasets import load_digits_nhwc
from npujax.errors import ConfigError, QuantizationError
from npujax.frontends.flax import trace_flax
from npujax.hw import load_npu_spec
from npujax.ir.passes import optimize
from npujax.models.cnn import DigitsCNN
from npujax.quantize.calibrate import calibrate
from npujax.quantize.model_file import save_graph
from npujax.quantize.spec import quant_spec
from npujax.search import SEARCHERS, SearchConfig, load_policy, search_precision
from tests.helpers import run_cli

pytestmark = pytest.mark.flax_model


@pytest.fixture(scope="module")
def problem():
    data = load_digits_nhwc()
    g, p = optimize(*trace_flax(DigitsCNN(rngs=nnx.Rngs(0)), jnp.zeros((1, 8, 8, 1),
                                                                        jnp.float32)))
    x, y = data.x_train[:128], data.y_train[:128]
    qs = calibrate(g, p, [x], quant_spec(g, 8, 8))
    return g, p, x, y, qs


def test_gradient_search_learns_activation_widths_too(problem):
    """On a bit-serial array activations set the speed as much as weights: the gradient
    searcher mixes activation widths too (EdMIPS) and its policy meets the budget."""
    g, p, x, y, qs = problem
    spec = load_npu_spec("bitserial_16x16")
    rep = search_precision(g, p, spec, x, y, qs, SearchConfig(
        method="gradient", budget_ratio=0.5, act_candidates=(4, 8), steps=40))
    assert rep.latency_s <= 0.5 * rep.int8_latency_s * (1 + 1e-6) and rep.budget_met
    assert rep.details["act_candidates"] == [4, 8]
    assert all(len(v) == 2 and abs(sum(v) - 1) < 1e-5
               for v in rep.details["act_probabilities"].values())
    # pinned layers are held at their choice, with one-hot probabilities
    pinned = search_precision(g, p, spec, x, y, qs, SearchConfig(
        method="gradient", budget_ratio=0.6, act_candidates=(4, 8), steps=10,
        pinned={"conv1": 8, "fc2": 8}))
    pol = pinned.policy
    assert (pol.weight_bits["conv1"], pol.act_bits["conv1"]) == (8, 8)
    assert (pol.weight_bits["fc2"], pol.act_bits["fc2"]) == (8, 8)
    assert pinned.details["probabilities"]["conv1"] == [0.0, 0.0, 1.0]
    assert pol.meta["pinned"] == {"conv1": 8, "fc2": 8}  # provenance in the policy file
    # the activation logits were trained (they start uniform)
    assert any(abs(v[0] - 0.5) > 1e-3 for v in rep.details["act_probabilities"].values())


@pytest.mark.parametrize("method", sorted(SEARCHERS))
def test_every_searcher_meets_the_budget_and_keeps_pins(problem, method):
    """The contract of a registered searcher: a width pair for every layer, the budget met on
    the exact lowering, pinned layers at their choice."""
    g, p, x, y, qs = problem
    spec = load_npu_spec("bitserial_16x16")
    rep = search_precision(g, p, spec, x, y, qs, SearchConfig(
        method=method, budget_ratio=0.7, act_candidates=(4, 8), sensitivity_samples=2,
        sensitivity_batch=32, steps=30, pinned={"fc2": (8, 8)}))
    assert set(rep.policy.weight_bits) == {"conv1", "conv2", "fc1", "fc2"}
    assert (rep.policy.weight_bits["fc2"], rep.policy.act_bits["fc2"]) == (8, 8)
    assert rep.latency_s <= 0.7 * rep.int8_latency_s * (1 + 1e-6) and rep.budget_met
    assert rep.speedup_vs_int8 >= 1 / 0.7 * (1 - 1e-6)
    assert rep.method == method and rep.policy.meta["method"] == method


def test_gradient_searcher_through_the_same_interface(problem):
    g, p, x, y, qs = problem
    rep = search_precision(g, p, load_npu_spec("edge_16x16"), x, y, qs, SearchConfig(
        method="gradient", budget_ratio=0.8, steps=30))
    assert set(rep.policy.act_bits.values()) == {8}
    assert 0 < rep.latency_s <= rep.budget_s * (1 + 1e-6)
    assert rep.details["final_lambda"] >= 0 and rep.params is not None
    # the decoded policy is the most probable one within the budget: the argmax where it fits
    probs = rep.details["probabilities"]
    argmax = {n: rep.details["candidates"][int(max(range(3), key=lambda i: probs[n][i]))]
              for n in probs}
    from npujax.search import latency_table

    table = latency_table(g, load_npu_spec("edge_16x16"), (2, 4, 8), 8)
    if table.latency_s(argmax) <= rep.budget_s:
        assert dict(rep.policy.weight_bits) == argmax


def test_loss_sensitivity_ranks_narrow_widths_worse_and_drives_the_ilp(problem):
    g, p, x, y, qs = problem
    from npujax.quantize.train import TrainConfig, train_graph
    from npujax.search import loss_sensitivity

    p = train_graph(g, p, x, y, config=TrainConfig(steps=60, learning_rate=3e-3)).params
    om = loss_sensitivity(g, p, jnp.asarray(x), jnp.asarray(y), ["conv1", "fc2"], (2, 8), (4, 8))
    for layer in ("conv1", "fc2"):
        assert set(om[layer]) == {(2, 4), (2, 8), (8, 4), (8, 8)}
        assert min(om[layer].values()) >= 0.0
        assert om[layer][(2, 4)] > om[layer][(8, 8)]
    spec = load_npu_spec("bitserial_16x16")
    rep = search_precision(g, p, spec, x, y, qs, SearchConfig(
        method="ilp", sensitivity="loss", budget_ratio=0.6, act_candidates=(4, 8),
        sensitivity_batch=64))
    assert rep.details["sensitivity"] == "loss" and rep.budget_met
    with pytest.raises(ConfigError, match="unknown sensitivity"):
        SearchConfig(method="ilp", sensitivity="fisher")


def test_unknown_method_and_infeasible_budget(problem):
    g, p, x, y, qs = problem
    spec = load_npu_spec("edge_16x16")
    with pytest.raises(ConfigError, match="unknown search method"):
        SearchConfig(method="random")
    with pytest.raises(ConfigError, match="below the fastest"):
        search_precision(g, p, spec, x, y, qs, SearchConfig(
            method="ilp", budget_s=1e-9, sensitivity_samples=1, sensitivity_batch=8))
    with pytest.raises(QuantizationError, match="candidates"):
        SearchConfig(candidates=(1, 8))
    with pytest.raises(ConfigError, match="budget_ratio"):
        SearchConfig(budget_ratio=1.5)


def test_cli_search_writes_a_policy(problem, tmp_path):
    g, p, x, y, qs = problem
    with jax.numpy_dtype_promotion("standard"):
        save_graph(tmp_path / "m.npz", g, p, qs)
    r = run_cli("search", str(tmp_path / "m.npz"),
                "--npu", "bitfusion_16x16", "--method", "greedy", "--budget-ratio", "0.95",
                "--act-candidates", "4,8", "--sensitivity-samples", "2",
                "--out", str(tmp_path / "pol.json"))
    assert r.returncode == 0, r.stderr
    pol = load_policy(tmp_path / "pol.json")
    assert pol.meta["method"] == "greedy" and pol.meta["npu"] == "bitfusion_16x16"
    assert json.loads((tmp_path / "pol.json").read_text())["format"].startswith("npujax")
    qat = run_cli("qat", "--policy",
                  str(tmp_path / "pol.json"), "--model", str(tmp_path / "m.npz"),
                  "--npu", "bitfusion_16x16", "--steps", "5", "--no-progress",
                  "--out", str(tmp_path / "q"))
    assert qat.returncode == 0, qat.stderr
    assert "test accuracy" in qat.stdout and "faster than INT8" in qat.stdout
    assert (tmp_path / "q" / "model.npz").stat().st_size > 0
    # a reader that leaves early (`npujax search ... | head -0`): the policy is written first,
    # and the exit is quiet (141, as Unix tools exit on SIGPIPE), with no traceback
    piped = subprocess.Popen([sys.executable, "-m", "npujax.cli", "search", str(tmp_path / "m.npz"),
                              "--method", "greedy", "--sensitivity-samples", "2",
                              "--out", str(tmp_path / "piped.json")],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    piped.stdout.close()
    err = piped.stderr.read()
    piped.stderr.close()
    assert piped.wait(timeout=600) == 141 and "Traceback" not in err, err
    assert "Exception ignored" not in err, err
    assert load_policy(tmp_path / "piped.json").meta["method"] == "greedy"
    # (usage errors such as --candidates 2,x: tests/cli/test_cli.py, in-process)


def test_search_takes_a_data_iterator():
    """A data loader works as well as arrays: its (inputs, labels) batches are read once and
    concatenated (the searchers pass over the data several times); labels become ``y``."""
    import numpy as np

    from npujax.search.api import _materialize

    x, y = np.arange(5 * 4, dtype=np.float32).reshape(5, 4), np.arange(5)
    xs, ys = _materialize(((x[i:i + 2], y[i:i + 2]) for i in range(0, 5, 2)), None)
    np.testing.assert_array_equal(xs, x)
    np.testing.assert_array_equal(ys, y)
    xs, ys = _materialize(iter([x[:3], x[3:]]), y)
    np.testing.assert_array_equal(xs, x)
    assert ys is y
    with pytest.raises(ConfigError, match="y is given too"):
        _materialize([(x[:2], y[:2])], y)
    with pytest.raises(ConfigError, match="mixes"):
        _materialize([(x[:2], y[:2]), x[2:]], None)
    with pytest.raises(ConfigError, match="no batch"):  # search_precision reads it first
        search_precision(None, {}, "edge_16x16", iter([]), None, {})

"""PTQ flow (calibrate -> bias correction -> convert), per-layer rules on module paths (NNX and
Linen), the per-layer SQNR report."""

import inspect

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from npujax.backends.integer import convert, execute_integer
from npujax.errors import CalibrationError, ConfigError, QuantizationError
from npujax.frontends.flax import trace_flax
from npujax.ir.execute import execute
from npujax.ir.passes import optimize
from npujax.models.cnn import DigitsCNN
from npujax.numerics import IntFormat
from npujax.ops import gemm_nodes
from npujax.quantize.calibrate import calibrate
from npujax.quantize.ptq import bias_correction, layer_sqnr, ptq
from npujax.quantize.rules import QuantRule, first_last_rules, quant_spec_from_rules
from npujax.quantize.spec import LayerQuant, quant_spec
from npujax.report import write_sqnr_report


@pytest.fixture(scope="module")
def digits():
    m = DigitsCNN(rngs=nnx.Rngs(1))
    x = np.random.default_rng(1).uniform(size=(96, 8, 8, 1)).astype(np.float32)
    graph, params = optimize(*trace_flax(m, x[:1]))
    return graph, params, [x[:48], x[48:]]


def test_bias_correction_removes_the_mean_output_shift(digits):
    graph, params, batches = digits
    q = {"fc2": LayerQuant(weight=IntFormat(3, narrow_range=True))}  # coarse weights, last layer
    x = np.concatenate(batches)
    run_q = jax.jit(lambda p: execute(graph, p, x, quant=q))
    ref = np.asarray(jax.jit(lambda p: execute(graph, p, x))(params))
    shift = lambda p: np.mean(np.asarray(run_q(p)) - ref, axis=0)
    before = np.abs(shift(params)).max()
    corrected = bias_correction(graph, params, q, batches)
    after = np.abs(shift(corrected)).max()
    assert before > 1e-3 and after < 1e-5 + 1e-3 * before


def test_model_bias_correction_removes_the_whole_models_mean_shift(digits):
    # W4A4 everywhere: activation quantization upstream shifts the logits' mean, which the
    # weight-only correction leaves and the sequential one ("model") removes
    graph, params, batches = digits
    q = quant_spec(graph, 4, 4)
    qstate = calibrate(graph, params, batches, q)
    x = np.concatenate(batches)
    run_q = jax.jit(lambda p: execute(graph, p, x, quant=q, qstate=qstate))
    ref = np.asarray(jax.jit(lambda p: execute(graph, p, x))(params))
    shift = {m: np.abs(np.mean(np.asarray(run_q(bias_correction(
        graph, params, q, batches, qstate, mode=m))) - ref, axis=0)).max()
        for m in ("weights", "model")}
    assert shift["weights"] > 1e-3 and shift["model"] < 1e-2 * shift["weights"]
    with pytest.raises(CalibrationError, match="choose one of"):
        bias_correction(graph, params, q, batches, qstate, mode="sequential")
    with pytest.raises(CalibrationError, match="pass the calibrated qstate"):
        bias_correction(graph, params, q, batches, mode="model")
    # the Python API's PTQ and npujax quantize default to the same correction
    from npujax.workflows.quantize import QuantizeConfig

    default = inspect.signature(ptq).parameters["bias_correction_mode"].default
    assert default == QuantizeConfig().bias_correction_mode == "model"
    with pytest.raises(CalibrationError, match="choose one of"):
        ptq(graph, params, batches, q, bias_correction_mode="sequential")


def test_ptq_then_integer_execution(digits):
    graph, params, batches = digits
    q = quant_spec(graph, 8, 8)
    p2, qstate = ptq(graph, params, batches, q, observer="percentile")
    model = convert(graph, p2, q, qstate)
    x = batches[0]
    fq = np.asarray(jax.jit(lambda v: execute(graph, p2, v, quant=q, qstate=qstate))(x))
    out = np.asarray(jax.jit(lambda v: execute_integer(model, v))(x))
    assert np.mean(np.argmax(fq, -1) == np.argmax(out, -1)) >= 0.95


def test_rules_first_last_at_8_bits(digits):
    graph, _, _ = digits
    spec = quant_spec_from_rules(graph, first_last_rules(graph, 4, 4))
    assert {n: (lq.weight.bits, lq.act.bits) for n, lq in spec.items()} == {
        "conv1": (8, 8), "conv2": (4, 4), "fc1": (4, 4), "fc2": (8, 8)}
    spec = quant_spec_from_rules(graph, [QuantRule(pattern="^fc", weight_bits=4, act_bits=None),
                                         QuantRule(pattern="conv2", skip=True),
                                         QuantRule(pattern=".")])
    assert set(spec) == {"conv1", "fc1", "fc2"} and spec["fc1"].act is None


def test_rule_errors(digits):
    graph, _, _ = digits
    with pytest.raises(ConfigError, match="match no layer"):
        quant_spec_from_rules(graph, [QuantRule(pattern="fc9")])
    with pytest.raises(ConfigError, match="regex"):
        QuantRule(pattern="(")
    with pytest.raises(QuantizationError, match=r"QuantRule.weight_bits .*\[2, 16\]"):
        QuantRule(pattern=".", weight_bits=1)


class Block(nn.Module):
    features: int

    @nn.compact
    def __call__(self, x):
        x = nn.Conv(self.features, (3, 3), padding="SAME", name="conv")(x)
        return nn.relu(x)


class LinenNet(nn.Module):
    @nn.compact
    def __call__(self, x):
        x = Block(4, name="stem")(x)
        x = Block(8, name="body")(x)
        x = x.reshape((x.shape[0], -1))
        return nn.Dense(3, name="head")(x)


@pytest.mark.flax_model  # traces the Linen model inside the test
def test_linen_model_rules_by_module_path():
    net = LinenNet()
    x = jnp.asarray(np.random.default_rng(2).normal(size=(16, 6, 6, 2)), jnp.float32)
    variables = net.init(jax.random.key(0), x)
    graph, params = optimize(*trace_flax(net, x[:1], variables=variables))
    names = [n.name for n in gemm_nodes(graph)]
    assert names == ["stem/conv", "body/conv", "head"]
    spec = quant_spec_from_rules(graph, [QuantRule(pattern="^body/", weight_bits=4),
                                         QuantRule(pattern=".*", weight_bits=8)])
    assert spec["body/conv"].weight.bits == 4 and spec["head"].weight.bits == 8
    _, qstate = ptq(graph, params, [x], spec)
    rows = layer_sqnr(graph, params, spec, qstate, [x])
    assert [r["name"] for r in rows] and rows == sorted(rows, key=lambda r: r["sqnr_db"])


def test_sqnr_report_sorted_and_lower_bits_lose_more(digits, tmp_path):
    graph, params, batches = digits
    q8, q4 = quant_spec(graph, 8, 8), quant_spec(graph, 4, 8)
    _, qs = ptq(graph, params, batches, q8, bias_correct=False)
    r8 = {r["name"]: r["sqnr_db"] for r in layer_sqnr(graph, params, q8, qs, batches)}
    rows4 = layer_sqnr(graph, params, q4, qs, batches, isolated=True)
    assert [r["sqnr_db"] for r in rows4] == sorted(r["sqnr_db"] for r in rows4)
    assert all(np.isfinite(r["sqnr_db"]) for r in rows4)
    r4 = {r["name"]: r["sqnr_db"] for r in rows4}
    assert all(r4[n] < r8[n] for n in r8)
    assert r8["conv1"] > 30.0  # 8-bit first layer: well above 30 dB
    write_sqnr_report(tmp_path, rows4)
    assert (tmp_path / "sqnr.png").stat().st_size > 1000
    md = (tmp_path / "sqnr.md").read_text()
    assert md.splitlines()[2].startswith(f"| {rows4[0]['name']} |")
    assert len((tmp_path / "sqnr.csv").read_text().splitlines()) == 5

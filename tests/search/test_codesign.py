"""Hardware-precision co-design (npujax.search.codesign): budgets, exactness of the written
design, never worse than the base preset, and bad arguments."""

import dataclasses
import json

import jax.numpy as jnp
import pytest
from flax import nnx

from npujax.errors import ConfigError
from npujax.frontends.flax import trace_flax
from npujax.hw import area_mm2, load_npu_spec
from npujax.ir.passes import optimize
from npujax.models.cnn import DigitsCNN
from npujax.ops import gemm_nodes
from npujax.plan import lower
from npujax.search import load_policy
from npujax.search.codesign import (
    BANDWIDTH_CLASSES,
    CodesignConfig,
    codesign,
    evaluate_design,
)
from npujax.search.codesign_baselines import random_search
from npujax.workflows.codesign import OUTPUTS, write_codesign
from tests.helpers import run_cli

pytestmark = pytest.mark.flax_model

PAIRS = [(w, a) for w in (2, 4, 8) for a in (2, 4, 8)]


@pytest.fixture(scope="module")
def model():
    g, _ = optimize(*trace_flax(DigitsCNN(rngs=nnx.Rngs(0)), jnp.zeros((1, 8, 8, 1),
                                                                        jnp.float32)))
    names = [n.name for n in gemm_nodes(g)]
    # a synthetic sensitivity: noise power ~ 4^-bits, the last layer 10x more sensitive
    sens = {n: {(w, a): (10.0 if i == len(names) - 1 else 1.0) * (4.0 ** -w + 4.0 ** -a)
                for w, a in PAIRS} for i, n in enumerate(names)}
    return g, load_npu_spec("bitserial_16x16"), sens


@pytest.fixture(scope="module")
def problem(model):
    """One co-design run (~20-40 s of CPU, mostly compiling the relaxed model's gradient)."""
    g, spec, sens = model
    # "equal area": the base preset plus its DRAM interface's PHY (6.4 GB/s = lpddr4_x16)
    area = float(area_mm2(spec)) + BANDWIDTH_CLASSES[0].phy_area_mm2
    config = CodesignConfig(area_mm2=area, objective="edp", steps=40, max_loss_increase=0.05)
    return g, spec, sens, config, codesign(g, spec, sens, config)


@pytest.mark.integration


def test_codesign_meets_the_budgets_and_beats_the_base_at_equal_area(problem):
    g, spec, sens, config, res = problem
    best, base = res.best, res.base
    assert best.feasible and best.area_mm2 <= config.area_mm2
    assert best.loss_increase <= config.max_loss_increase
    # the base preset at INT8 is feasible here, so the result can only be better
    assert base.feasible and base.policy.weight_bits == dict.fromkeys(best.policy.weight_bits, 8)
    assert best.edp_js < base.edp_js
    assert best.source == "gradient"  # the descent found a better design than the start
    assert res.exact_evaluations == len(res.evaluated) <= 5
    assert len(res.trajectory["objective"]) == config.steps
    # the relaxed area ends within a few % of the budget (the penalty binds, not overshoots)
    assert res.trajectory["area_mm2"][-1] <= config.area_mm2 * 1.05


@pytest.mark.integration
def test_written_preset_and_policy_lower_to_the_reported_figures(problem, tmp_path):
    g, spec, sens, config, res = problem
    write_codesign(tmp_path / "cd", res, config, {"base": spec.name})
    assert all((tmp_path / "cd" / f).is_file() for f in OUTPUTS)
    chosen = load_npu_spec(tmp_path / "cd" / "preset.toml")
    assert chosen == res.best.spec
    policy = load_policy(tmp_path / "cd" / "policy.json")
    sched = lower(g, chosen, policy.quant_spec(g))
    assert sched.latency_s == res.best.latency_s and sched.energy_j == res.best.energy_j
    # the same design through the public single-design evaluator
    b = res.best.spec
    again = evaluate_design(
        g, spec, sens, config, rows=b.array.rows, cols=b.array.cols,
        sram_bytes=(b.memory.ifmap_sram_bytes, b.memory.filter_sram_bytes,
                    b.memory.ofmap_sram_bytes), bandwidth=res.best.bandwidth.name,
        policy={n: (policy.weight_bits[n], policy.act_bits[n]) for n in policy.weight_bits})
    assert again.edp_js == res.best.edp_js and again.area_mm2 == res.best.area_mm2


@pytest.mark.integration
def test_random_search_respects_the_budgets(model):
    g, spec, sens = model
    config = CodesignConfig(area_mm2=float(area_mm2(spec)) + 0.5, max_loss_increase=0.05)
    ds = random_search(g, spec, sens, config, evaluations=3, seed=1)
    assert len(ds) == 3 and all(d.area_mm2 <= config.area_mm2 for d in ds)
    assert all(d.loss_increase <= config.max_loss_increase for d in ds)
    # the power budget: average power (energy / latency) plus the DRAM PHY's
    d = ds[0]
    assert d.power_w == pytest.approx(d.energy_j / d.latency_s + d.bandwidth.phy_power_w)
    a, m = d.spec.array, d.spec.memory
    kw = dict(rows=a.rows, cols=a.cols, sram_bytes=(m.ifmap_sram_bytes, m.filter_sram_bytes,
                                                    m.ofmap_sram_bytes),
              bandwidth=d.bandwidth.name,
              policy={n: (d.policy.weight_bits[n], d.policy.act_bits[n])
                      for n in d.policy.weight_bits})
    for factor, ok in ((2.0, True), (0.5, False)):
        cfg = dataclasses.replace(config, power_w=d.power_w * factor)
        assert evaluate_design(g, spec, sens, cfg, **kw).feasible is ok
    with pytest.raises(ConfigError, match="bandwidth class"):
        evaluate_design(g, spec, sens, config, **{**kw, "bandwidth": "ddr9"})


@pytest.mark.parametrize("bad", [
    dict(area_mm2=-1.0), dict(area_mm2=float("nan")), dict(area_mm2=2.0, objective="speed"),
    dict(area_mm2=2.0, candidates=()), dict(area_mm2=2.0, candidates=(4, 4)),
    dict(area_mm2=2.0, candidates=(1, 8)), dict(area_mm2=2.0, power_w=0.0),
    dict(area_mm2=2.0, dim_range=(8, 4)), dict(area_mm2=2.0, bandwidth_classes=()),
])
def test_bad_settings_raise_config_error(bad):
    with pytest.raises(ConfigError):
        CodesignConfig(**bad)


@pytest.mark.integration
def test_infeasible_budgets_raise_config_error(model):
    g, spec, sens = model
    with pytest.raises(ConfigError, match="area budget"):
        codesign(g, spec, sens, CodesignConfig(area_mm2=1e-3, steps=1))
    with pytest.raises(ConfigError, match="accuracy constraint"):
        codesign(g, spec, sens, CodesignConfig(area_mm2=10.0, max_loss_increase=1e-9, steps=1))
    with pytest.raises(ConfigError, match="no entry"):
        codesign(g, spec, {}, CodesignConfig(area_mm2=10.0, steps=1))


def test_cli_refuses_bad_arguments(tmp_path):
    r = run_cli("codesign", "m.npz", "--area-mm2", "-1", "--out", str(tmp_path / "o"))
    assert r.returncode == 2 and "area-mm2" in r.stderr
    r = run_cli("codesign", "m.npz", "--area-mm2", "2", "--objective", "speed",
                "--out", str(tmp_path / "o"))
    assert r.returncode == 2 and "objective" in r.stderr
    r = run_cli("codesign", "m.npz", "--area-mm2", "2", "--candidates", "1,8",
                "--out", str(tmp_path / "o"))
    assert r.returncode == 2 and not (tmp_path / "o").exists()


@pytest.mark.integration
def test_cli_codesign_writes_loadable_outputs(model, tmp_path):
    """The command end to end: its preset loads as --npu and its policy drives lower."""
    import jax

    from npujax.data.datasets import load_digits_nhwc
    from npujax.quantize.calibrate import calibrate
    from npujax.quantize.model_file import save_graph
    from npujax.quantize.spec import quant_spec

    g, spec, _ = model
    _, p = optimize(*trace_flax(DigitsCNN(rngs=nnx.Rngs(0)), jnp.zeros((1, 8, 8, 1),
                                                                        jnp.float32)))
    x = load_digits_nhwc().x_train[:64]
    with jax.numpy_dtype_promotion("standard"):
        save_graph(tmp_path / "m.npz", g, p, calibrate(g, p, [x], quant_spec(g, 8, 8)))
    area = float(area_mm2(spec)) + BANDWIDTH_CLASSES[0].phy_area_mm2
    r = run_cli("codesign", str(tmp_path / "m.npz"), "--npu", "bitserial_16x16",
                "--area-mm2", str(area), "--objective", "latency", "--steps", "10",
                "--sensitivity-batch", "32", "--max-loss-increase", "0.5", "--no-progress",
                "--out", str(tmp_path / "cd"))
    assert r.returncode == 0, r.stderr
    assert "better than the base preset" in r.stdout
    chosen = load_npu_spec(tmp_path / "cd" / "preset.toml")
    policy = load_policy(tmp_path / "cd" / "policy.json")
    report = json.loads((tmp_path / "cd" / "codesign.json").read_text())
    assert report["best"]["area_mm2"] <= area
    assert lower(g, chosen, policy.quant_spec(g)).latency_s == report["best"]["latency_s"]


"""Cross-layer equalization and high-bias absorption (Nagel et al. 2019, arXiv:1906.04721,
section 4.1) against a numpy reference, on a MobileNet-like depthwise-separable net."""

import dataclasses

import jax
import numpy as np
import pytest

from npujax.errors import ConfigError
from npujax.ir.execute import execute
from npujax.quantize.methods import PTQ_METHODS
from npujax.quantize.methods.cle import (
    CrossLayerEqualization,
    equalization_pairs,
    equalize_pair,
)
from npujax.quantize.spec import quant_spec
from tests.quantize.ptq_graphs import separable_net


@pytest.fixture(scope="module")
def unbalanced():
    """The net with output channel i of c1 scaled by f_i and the depthwise channel by 1 / f_i
    (f from 10^-1.5 to 10^1.5: the same function, per-channel ranges 1000x apart), and a high
    depthwise bias (so ReLU's input is positive and absorbable)."""
    rng = np.random.default_rng(0)
    graph, params = separable_net(rng)
    f = (10.0 ** np.linspace(-1.5, 1.5, 8)).astype(np.float32)
    p = {k: dict(v) for k, v in params.items()}
    p["c1"]["kernel"] = np.asarray(p["c1"]["kernel"]) * f
    p["c1"]["bias"] = (rng.normal(size=8) * 0.3 * f).astype(np.float32)
    p["dw"]["kernel"] = np.asarray(p["dw"]["kernel"]) / f
    p["dw"]["bias"] = np.full(8, 3.0, np.float32)
    x = rng.normal(size=(16, 8, 8, 3)).astype(np.float32)
    return graph, p, x


class _Frozen(dict):
    """A quant spec usable as a static jit argument (hashed by identity)."""

    __hash__ = object.__hash__
    __eq__ = object.__eq__


def test_equalize_pair_matches_the_papers_scale():
    rng = np.random.default_rng(1)
    w1 = rng.normal(size=(5, 6)).astype(np.float32) * np.logspace(-2, 2, 6).astype(np.float32)
    b1 = rng.normal(size=6).astype(np.float32)
    w2 = rng.normal(size=(6, 4)).astype(np.float32)
    r1, r2 = np.abs(w1).max(axis=0), np.abs(w2).max(axis=1)
    s_ref = np.sqrt(r1.astype(np.float64) * r2) / r2  # the paper's s_i = sqrt(r1 r2) / r2
    w1n, b1n, w2n, s = equalize_pair(w1, b1, w2, 1, 0)
    np.testing.assert_allclose(s, s_ref, rtol=1e-6)
    # both ranges become sqrt(r1 r2), channel by channel
    np.testing.assert_allclose(np.abs(w1n).max(axis=0), np.sqrt(r1 * r2), rtol=1e-5)
    np.testing.assert_allclose(np.abs(w2n).max(axis=1), np.sqrt(r1 * r2), rtol=1e-5)
    np.testing.assert_allclose(b1n, b1 / s_ref, rtol=1e-6)
    x = rng.normal(size=(7, 5)).astype(np.float32)  # ReLU(x W1 + b1) W2 is unchanged
    np.testing.assert_allclose(np.maximum(x @ w1n + b1n, 0) @ w2n,
                               np.maximum(x @ w1 + b1, 0) @ w2, rtol=1e-5, atol=1e-5)


def test_cle_keeps_the_float_function_and_lifts_per_tensor_w8(unbalanced):
    graph, params, x = unbalanced
    assert [(p.first, p.second, p.relu) for p in equalization_pairs(graph, params)] == [
        ("c1", "dw", True), ("dw", "pw", True)]
    quant = {n: dataclasses.replace(lq, act=None, weight_per_channel=False)
             for n, lq in quant_spec(graph, 8, 8).items()}  # per-tensor W8, float activations
    step = PTQ_METHODS["cle"]().apply(graph, params, quant, [x], None)
    run = jax.jit(lambda g, p, q: execute(g, p, x, quant=q, qstate={}), static_argnums=(0, 2))
    y0 = np.asarray(run(graph, params, None))
    y1 = np.asarray(run(step.graph, step.params, None))
    np.testing.assert_allclose(y1, y0, rtol=0, atol=1e-5 * np.abs(y0).max())
    # per-channel weight ranges of c1 equalized with dw's (each sqrt(r1 r2)) after the sweeps
    r1 = np.abs(np.asarray(step.params["c1"]["kernel"])).max(axis=(0, 1, 2))
    r2 = np.abs(np.asarray(step.params["dw"]["kernel"])).max(axis=(0, 1, 2))
    assert np.abs(np.log(r1 / r2)).max() < 0.35  # (dw is also balanced against pw)
    assert r1.max() / r1.min() < 5 < 1000

    def sqnr(g, p):
        yq = np.asarray(run(g, p, _Frozen(quant)))
        return 10 * np.log10(np.sum(y0 ** 2) / np.sum((yq - y0) ** 2))

    before, after = sqnr(graph, params), sqnr(step.graph, step.params)
    assert after > before + 15, (before, after)  # measured 11 dB -> 40 dB
    # high-bias absorption: dw -> pw (no padding) moved c > 0 into pw's bias; c1 -> dw not
    # (the depthwise conv pads its input, so its border outputs would change)
    assert any("dw->pw: absorbed" in n for n in step.notes)
    assert any("c1->dw: no bias absorption" in n for n in step.notes)
    (note,) = [n for n in step.notes if n.startswith("dw->pw: absorbed")]
    assert int(note.split()[4]) >= 4, note  # "dw->pw: absorbed biases of N of 8 channels"


@pytest.mark.parametrize("field, value", [("num_sigma", -1.0), ("max_sweeps", 0),
                                          ("tolerance", 0.0), ("absorb_bias", 1)])
def test_cle_config_errors_name_the_field(field, value):
    with pytest.raises(ConfigError, match=f"CrossLayerEqualization.{field}"):
        CrossLayerEqualization(**{field: value})

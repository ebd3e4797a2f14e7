"""The precision search chooses widths for attention's MatMuls of two activations too."""

from __future__ import annotations

import pytest
from flax import nnx

from npujax.data.datasets import load_digits_nhwc
from npujax.frontends.flax import trace_flax
from npujax.ir.passes import optimize
from npujax.models.transformer import ViT
from npujax.plan import lower
from npujax.quantize.calibrate import calibrate
from npujax.quantize.spec import quant_spec
from npujax.search import SearchConfig, search_precision
from tests.helpers import numpy_init

pytestmark = pytest.mark.flax_model


def test_gradient_search_chooses_attention_widths():
    """The gradient searcher mixes the widths of the two-activation GEMMs' operands (calibrated
    per candidate), and the policy and lower agree on them. (The tiny ViT's latency is its
    vector work, so the budget is the INT8 latency; the ILP/Hessian path, which measures these
    layers' loss increase since they have no kernel, costs ~4x more and is not run here.)"""
    data = load_digits_nhwc()
    m = numpy_init(lambda: ViT(image=8, patch=4, d_model=16, heads=2, d_ff=32, layers=1,
                               rngs=nnx.Rngs(0)))
    g, p = optimize(*trace_flax(m, data.x_train[:1], check=False))
    x, y = data.x_train[:64], data.y_train[:64]
    qs = calibrate(g, p, [x], quant_spec(g, 8, 8))
    mms = [n.name for n in g.nodes if n.op in ("MatMul", "Einsum")]
    assert len(mms) == 2
    rep = search_precision(g, p, "bitserial_16x16", x, y, qs, SearchConfig(
        method="gradient", budget_ratio=1.0, steps=3))
    pol = rep.policy
    assert set(mms) <= set(pol.weight_bits) and rep.budget_met
    q = pol.quant_spec(g)
    assert {q[n].weight_bits for n in mms} <= {2, 4, 8}
    # the policy's attention widths are what lower costs
    s = lower(g, "bitserial_16x16", q)
    assert {r.name: r.weight_bits for r in s.layers if r.name in mms} == {
        n: pol.weight_bits[n] for n in mms}
    assert s.latency_s == pytest.approx(rep.latency_s, rel=1e-6)

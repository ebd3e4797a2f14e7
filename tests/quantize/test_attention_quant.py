"""Quantized attention: both operands of the MatMuls of two activations (``Q K^T``, ``P V``) on
static calibrated grids, the softmax output on its fixed [0, 1] grid, run by fake-quant, the
integer path and onnxruntime (the QDQ export) with the same numbers."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from npujax.backends.integer import convert, execute_integer
from npujax.backends.onnx_export import to_onnx
from npujax.errors import ConfigError
from npujax.frontends.flax import trace_flax
from npujax.ir.execute import execute, tap
from npujax.ir.passes import optimize
from npujax.models.transformer import DECODER_CONFIGS, Decoder
from npujax.numerics import IntFormat
from npujax.plan import lower
from npujax.quantize.calibrate import calibrate
from npujax.quantize.rules import QuantRule, quant_spec_from_rules
from npujax.quantize.spec import SOFTMAX_RANGE, quant_spec
from tests.helpers import numpy_init
from tests.onnx_models import ort_run

pytestmark = pytest.mark.flax_model


def _sqnr_db(y, ref):
    y, ref = np.asarray(y, np.float64), np.asarray(ref, np.float64)
    return 10 * np.log10(np.sum(ref**2) / np.sum((y - ref) ** 2))


@pytest.fixture(scope="module")
def decoder():
    """A 1-layer tiny decoder (prefill, 8 tokens), calibrated at W8A8 on 4 sequences."""
    cfg = dataclasses.replace(DECODER_CONFIGS["tiny"], layers=1)
    m = numpy_init(lambda: Decoder(cfg, phase="prefill", seq_len=8, rngs=nnx.Rngs(0)))
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, cfg.vocab, (4, 8)), jnp.int32)
    g, p = optimize(*trace_flax(m, tokens[:1], check=False))  # (checked in tests/frontends)
    q = quant_spec(g)
    qs = calibrate(g, p, [tokens], q)
    mms = [n.name for n in g.nodes if n.op == "MatMul"]
    run = jax.jit(lambda p, qs, x: execute(g, p, x, quant=q, qstate=qs, observe=tap(mms)))
    return g, p, q, qs, tokens, mms, run


def test_both_operands_quantized_and_the_softmax_on_its_fixed_grid(decoder):
    g, p, q, qs, tokens, mms, run = decoder
    assert len(mms) == 2 and set(mms) <= set(q)
    pv = [n for n in mms if q[n].operand_range == SOFTMAX_RANGE or q[n].act_range]
    assert len(pv) == 1  # P V reads the softmax; Q K^T does not
    (pv,) = pv
    (qk,) = set(mms) - {pv}
    lq = q[pv]
    assert lq.weight == IntFormat(8, signed=False) and lq.act == IntFormat(8, signed=False)
    s = qs[pv]
    assert float(s.operand_scale) == pytest.approx(1 / 255) and int(s.operand_zero_point) == 0
    assert q[qk].weight == IntFormat(8, narrow_range=True)  # K: signed, symmetric
    assert int(qs[qk].operand_zero_point) == 0 and qs[qk].act_scale is not None
    y, taps = run(p, qs, tokens)
    probs = np.asarray(taps[pv][2])  # the second operand as the array reads it
    codes = probs * 255
    np.testing.assert_allclose(codes, np.round(codes), atol=1e-3)
    assert probs.min() >= 0 and probs.max() <= 1 and len(np.unique(codes.round())) > 20
    a, sa, za = np.asarray(taps[qk][0]), float(qs[qk].act_scale), int(qs[qk].act_zero_point)
    ca = a / sa + za
    np.testing.assert_allclose(ca, np.round(ca), atol=2e-3)
    # quantizing the attention operands changes the output; float attention would not
    no_att = {k: v for k, v in q.items() if k not in mms}
    y_no = jax.jit(lambda p, qs, x: execute(g, p, x, quant=no_att, qstate=qs))(p, qs, tokens)
    assert np.abs(np.asarray(y) - np.asarray(y_no)).max() > 1e-4


def test_w8a8_sqnr_and_w4a8_keeps_attention_at_8_bits(decoder):
    g, p, q, qs, tokens, mms, run = decoder
    f = jax.jit(lambda p, x: execute(g, p, x))(p, tokens)
    y, _ = run(p, qs, tokens)
    assert _sqnr_db(y, f) > 25  # measured 30.4 dB (random weights)
    q4 = quant_spec(g, 4, 8)
    assert all(q4[n].weight_bits == 8 for n in mms)  # both operands are activations
    assert all(q4[n].weight_bits == 4 for n in q4 if n not in mms)
    rules = quant_spec_from_rules(g, [QuantRule(pattern=".*", weight_bits=4, act_bits=8)])
    assert {n: rules[n].weight for n in mms} == {n: q4[n].weight for n in mms}
    qs4 = calibrate(g, p, [tokens], q4)
    y4 = jax.jit(lambda p, qs, x: execute(g, p, x, quant=q4, qstate=qs))(p, qs4, tokens)
    assert 5 < _sqnr_db(y4, f) < _sqnr_db(y, f)
    # lower costs the attention operands at their widths
    s = lower(g, "edge_transformer_16x16", q4)
    assert {r.weight_bits for r in s.layers if r.name in mms} == {8}


def test_integer_path_and_onnxruntime_equal_fake_quant(decoder):
    g, p, q, qs, tokens, mms, run = decoder
    y = np.asarray(run(p, qs, tokens)[0])
    im = convert(g, p, q, qs, requant="float")
    assert set(im.matmuls) == set(mms)
    yi = np.asarray(jax.jit(lambda x: execute_integer(im, x))(tokens))
    model = to_onnx(g, p, q, qs).SerializeToString()
    ops = [n.op_type for n in __import__("onnx").load_from_string(model).graph.node]
    assert ops.count("QuantizeLinear") >= 2 * len(mms) + 7
    yo = np.concatenate([ort_run(model, {g.inputs[0]: np.asarray(t[None])})[0] for t in tokens])
    scale = np.abs(y).max()
    assert np.abs(yi - y).max() < 1e-5 * scale  # measured 2e-7 relative
    assert np.abs(yo - y).max() < 1e-5 * scale


def test_attention_without_operand_grids_is_refused(decoder):
    g, p, q, qs, tokens, mms, run = decoder
    # (every registered quantizer quantizes attention operands: LSQ learns their steps, see
    # test_transformer_quant_completeness.py)
    with pytest.raises(ConfigError, match="no calibrated grid"):  # (at trace time)
        jax.eval_shape(lambda: execute(g, p, tokens, quant=q, qstate={
            k: v._replace(operand_scale=None) for k, v in qs.items()}))


def test_weight_options_leave_the_operands_per_tensor(decoder):
    g, p, q, qs, tokens, mms, run = decoder
    qb = quant_spec(g, weight_block_size=8)  # blocks are for weights: operands stay per tensor
    assert all(qb[n].weight_block_size is None for n in mms)
    assert all(qb[n].weight_block_size == 8 for n in qb if n not in mms)

"""Quantization of the rest of a transformer: LSQ on attention's operands (learned steps, the
softmax's fixed grid kept), embedding tables quantized weight-only per row (fake-quant, integer
path and onnxruntime agree), and an int8 KV cache as the K/V operands of the decode MatMuls."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from npujax.backends.integer import convert, execute_integer
from npujax.backends.onnx_export import to_onnx
from npujax.frontends.flax import trace_flax
from npujax.hw import load_npu_spec
from npujax.ir.execute import execute, tap
from npujax.ir.passes import optimize
from npujax.models.decoders import decoder_graph, decoder_precision, kv_cache_operands
from npujax.models.transformer import DECODER_CONFIGS, Decoder
from npujax.numerics import IntFormat
from npujax.ops import embedding_nodes
from npujax.plan import layer_bits, workloads
from npujax.quantize.calibrate import calibrate
from npujax.quantize.quantizers import split_learned
from npujax.quantize.quantizers.lsq import LSQState
from npujax.quantize.spec import SOFTMAX_RANGE, quant_spec
from tests.helpers import numpy_init
from tests.onnx_models import ort_run

pytestmark = pytest.mark.flax_model


@pytest.fixture(scope="module")
def decoder():
    """A 1-layer tiny decoder (prefill, 8 tokens) and 4 token sequences."""
    cfg = dataclasses.replace(DECODER_CONFIGS["tiny"], layers=1)
    m = numpy_init(lambda: Decoder(cfg, phase="prefill", seq_len=8, rngs=nnx.Rngs(0)))
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, cfg.vocab, (4, 8)), jnp.int32)
    g, p = optimize(*trace_flax(m, tokens[:1], check=False))
    return g, p, tokens


def test_lsq_learns_attention_operand_steps_and_keeps_the_softmax_grid(decoder):
    g, p, tokens = decoder
    q = quant_spec(g, quantizer="lsq")
    qs = calibrate(g, p, [tokens], q)
    mms = [n.name for n in g.nodes if n.op == "MatMul"]
    (pv,) = [n for n in mms if SOFTMAX_RANGE in (q[n].act_range, q[n].operand_range)]
    (qk,) = set(mms) - {pv}
    assert all(isinstance(qs[n], LSQState) and qs[n].operand_scale is not None for n in mms)
    # the operand steps get gradients, except on the fixed softmax range
    def loss(s):
        y = execute(g, p, tokens, quant=q, qstate={
            **qs, qk: qs[qk]._replace(operand_scale=s[0]),
            pv: qs[pv]._replace(operand_scale=s[1], act_scale=s[2])})
        return jnp.sum(y ** 2), y

    steps = (qs[qk].operand_scale, qs[pv].operand_scale, qs[pv].act_scale)
    grads, y = jax.jit(jax.grad(loss, has_aux=True))(steps)
    assert np.isfinite(np.asarray(y)).all()
    fixed = [r == SOFTMAX_RANGE for r in (q[qk].operand_range, q[pv].operand_range,
                                         q[pv].act_range)]
    assert sum(fixed) == 1
    for gr, f in zip(grads, fixed):
        assert (float(gr) == 0.0) == f
    # QAT (train_graph) trains every operand step; a fixed one stays put (zero gradient)
    learned, _ = split_learned(q, qs)
    assert {"act_scale", "operand_scale"} <= set(learned[qk]) and "weight_step" not in learned[qk]
    # LSQ starts on the calibrated grid: K symmetric (zero point 0), the softmax's 1/255
    assert int(qs[qk].operand_zero_point) == 0 and float(qs[qk].operand_scale) > 0


def test_embedding_tables_quantized_per_row(decoder):
    g, p, tokens = decoder
    (emb,) = embedding_nodes(g)
    assert emb.name not in quant_spec(g)  # float tables unless asked
    q = quant_spec(g, embedding_bits=4)
    assert q[emb.name].weight == IntFormat(4, narrow_range=True) and q[emb.name].act is None
    qs = calibrate(g, p, [tokens], q)
    y, taps = jax.jit(lambda: execute(g, p, tokens, quant=q, qstate=qs, observe=tap([emb.name])))()
    rows = np.asarray(taps[emb.name][1]).reshape(-1, g.tensors[emb.outputs[0]].shape[-1])
    table = np.asarray(p[emb.name]["table"])
    scale = np.abs(table).max(axis=1) / 7  # symmetric per row, 4-bit narrow range
    ids = np.asarray(tokens).reshape(-1)
    codes = rows / scale[ids, None]
    np.testing.assert_allclose(codes, np.round(codes), atol=1e-4)
    assert np.abs(codes).max() == pytest.approx(7) and not np.allclose(rows, table[ids])
    # the integer path and onnxruntime read the same table
    y = np.asarray(y)
    im = convert(g, p, q, qs, requant="float")
    yi = np.asarray(jax.jit(lambda x: execute_integer(im, x))(tokens))
    model = to_onnx(g, p, q, qs).SerializeToString()
    yo = ort_run(model, {g.inputs[0]: np.asarray(tokens[:1])})[0]
    scale_y = np.abs(y).max()
    assert np.abs(yi - y).max() < 1e-5 * scale_y and np.abs(yo - y[:1]).max() < 1e-5 * scale_y
    spec = load_npu_spec("edge_transformer_16x16")  # the latency model accepts the spec
    assert layer_bits(workloads(g, spec), q)[0].min() == 8  # (the table is not a GEMM)


def test_int8_kv_cache_is_the_k_v_operand_of_the_decode_matmuls(decoder):
    assert kv_cache_operands(decoder[0]) == {}  # a prefill computes its keys and values
    g = decoder_graph("tiny", phase="decode", seq_len=1, kv_len=64, batch=1)
    cache = kv_cache_operands(g)
    mms = [n.name for n in g.nodes if n.op == "MatMul"]
    assert set(cache) == set(mms) and len(mms) == 2 * DECODER_CONFIGS["tiny"].layers
    q = decoder_precision(g, 8, 16, 8)  # W8A16 with an 8-bit cache
    for n in mms:
        kv, other = ((q[n].act, q[n].weight) if cache[n] == 0 else (q[n].weight, q[n].act))
        assert kv.bits == 8 and other.bits == 16

"""Latency of transformers on the transformer-capable presets: a traced decoder (prefill and
decode with a KV cache) runs entirely on the NPU, respects the roofline, gets faster with more
vector lanes and DRAM bandwidth, and its decode KV-cache traffic scales with the cache's bits."""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import pytest
from flax import nnx

from npujax.frontends.flax import trace_flax
from npujax.hw import load_npu_spec
from npujax.ir.passes import optimize
from npujax.models.transformer import DECODER_CONFIGS, Decoder
from npujax.numerics import IntFormat
from npujax.plan import lower
from npujax.quantize.spec import LayerQuant
from tests.helpers import numpy_init

pytestmark = pytest.mark.flax_model

PRESETS = ("edge_transformer_16x16", "datacenter_128x128")


@pytest.fixture(scope="module")
def decoder_graphs():
    cfg = dataclasses.replace(DECODER_CONFIGS["tiny"], layers=1)  # (one compile of lower each)
    out = {}
    for phase, n in (("prefill", 16), ("decode", 1)):
        m = numpy_init(lambda phase=phase: Decoder(cfg, phase=phase, seq_len=16,
                                                   kv_len=64, rngs=nnx.Rngs(0)))
        # (the trace-vs-model check is tests/frontends/test_flax_transformer.py's job)
        out[phase] = optimize(*trace_flax(m, jnp.zeros((1, n), jnp.int32), check=False))[0]
    return out


@pytest.mark.parametrize("npu", PRESETS)
def test_decoder_runs_on_the_npu_within_the_roofline(decoder_graphs, npu):
    spec = load_npu_spec(npu)
    for phase, graph in decoder_graphs.items():
        s = lower(graph, spec)
        assert [r.name for r in s.layers if r.device == "cpu"] == [], phase
        for r in s.layers:
            roof = max(r.macs / (spec.peak_macs_per_s / spec.array.clock_hz),
                       r.costs.dram_bytes / spec.dram_bytes_per_cycle)
            assert r.costs.latency_cycles >= roof * (1 - 1e-6), (phase, r.name)
        ops = {r.op for r in s.layers}
        assert {"MatMul", "Softmax", "RMSNormalization", "Gather"} <= ops
    dec, pre = (lower(decoder_graphs[p], spec) for p in ("decode", "prefill"))
    assert dec.macs < pre.macs


def test_monotone_in_lanes_and_bandwidth(decoder_graphs):
    spec = load_npu_spec("edge_transformer_16x16")
    g = decoder_graphs["prefill"]
    vec = lambda s: sum(r.latency_s for r in lower(g, s).layers  # noqa: E731
                        if r.op in ("Softmax", "RMSNormalization"))
    assert vec(spec.with_fields({"vector.lanes": 64})) < vec(spec)
    assert vec(spec.with_fields({"vector.special_cycles_per_elem": 1.0})) < vec(spec)
    assert lower(g, spec.with_fields({"memory.dram_bytes_per_s": 25.6e9})).latency_s < lower(
        g, spec).latency_s


def test_decode_kv_bytes_follow_the_cache_bits(decoder_graphs):
    """The attention MatMuls of a decode step read the KV cache (one of their two operands,
    whichever jnp.einsum made it): at 4 bits per operand they move about half the bytes of
    8 bits (up to burst rounding)."""
    g = decoder_graphs["decode"]
    mms = [n.name for n in g.nodes if n.op == "MatMul"]

    def kv_bytes(bits):
        q = {n: LayerQuant(weight=IntFormat(bits), act=IntFormat(bits, signed=False))
             for n in mms}
        s = lower(g, "edge_transformer_16x16", q)
        return sum(r.costs.dram_bytes for r in s.layers if r.op == "MatMul")

    b8, b4 = kv_bytes(8), kv_bytes(4)
    assert 0.4 * b8 < b4 < 0.65 * b8

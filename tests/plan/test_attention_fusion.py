"""Attention fusion (npujax.plan.passes.attention): the Q·Kᵀ → scale/mask → Softmax → P·V chain of a
traced decoder is recognised, fusing it never moves more DRAM bytes nor takes longer, on_chip
and flash agree when the scores fit, flash's bytes follow FlashAttention's formula, and
``none`` changes nothing.

The layer-by-layer costs are lowered once (one compiled program); the attention corrections
run eagerly on them (pure jnp, no compilation)."""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import numpy as np
import pytest

from npujax.errors import ConfigError
from npujax.hw import load_npu_spec, stack_specs
from npujax.models.decoders import decoder_graph
from npujax.models.transformer import DECODER_CONFIGS
from npujax.plan import LayerCosts, lower, workloads
from npujax.plan.lower import layer_bits
from npujax.plan.passes.attention import attention_chains, attention_costs

pytestmark = pytest.mark.flax_model

SEQ = 64
# ofmap 1 KiB: a query block's 64 scores at 32 bits (8 rows x 64 x 4 B = 2 KiB) do not fit
SMALL = {"memory.ofmap_sram_bytes": 1024}


@pytest.fixture(scope="module")
def case():
    """(graph, layers, chains, spec, widths, {fields: layer-by-layer LayerCosts})."""
    cfg = dataclasses.replace(DECODER_CONFIGS["tiny"], layers=1)  # one attention block
    graph = decoder_graph(cfg, phase="prefill", seq_len=SEQ, kv_len=1, batch=1)
    spec = load_npu_spec("edge_transformer_16x16").with_fields({"ops.attention_fusion": "none"})
    layers = workloads(graph, spec)
    wb, ab = layer_bits(layers, None)
    base = {}
    for name, fields in (("fits", {}), ("tiled", SMALL)):
        s = lower(graph, spec.with_fields(fields))  # (one program: only numbers change)
        base[name] = LayerCosts(*(np.asarray([getattr(r.costs, f) for r in s.layers])
                                  for f in LayerCosts._fields))
    return graph, layers, attention_chains(graph, layers), spec, (wb, ab), base


@functools.cache
def _jitted(layers, chains, cap):  # one small program per capability (the numbers traced)
    return jax.jit(lambda s, b, w, a: attention_costs(layers, chains, s, b, w, a, cap))


def _fuse(case, cap, which):
    graph, layers, chains, spec, (wb, ab), base = case
    s = spec.with_fields(SMALL if which == "tiled" else {})
    with jax.enable_x64(True):
        costs, att = _jitted(tuple(layers), chains, cap)(s, base[which], wb, ab)
        return (LayerCosts(*(np.asarray(v) for v in costs)),
                type(att)(*(np.asarray(v) for v in att)))


def test_the_chain_is_recognised(case):
    graph, layers, chains, *_ = case
    assert len(chains) == 1
    c = chains[0]
    names = [layers[i].name for i in c.rows]
    assert names == [f"blocks/0/attn/{n}" for n in (  # named by the module they ran in
        "matmul_0", "transpose_0", "mul_4", "where_0", "softmax_0", "matmul_b_transpose_1",
        "matmul_1")]
    # tiny: d_model 32, 4 heads of 8, 2 KV heads: 64 queries x 2 heads share each K
    assert (c.key_len, c.query_rows, c.head_dim, c.groups) == (SEQ, 128, 8, 2)
    assert c.k_is_input and not c.p_is_input


@pytest.mark.parametrize("which", ["fits", "tiled"])
@pytest.mark.parametrize("cap", ["on_chip", "flash"])
def test_fusion_never_increases_dram_bytes_or_latency(case, cap, which):
    base = case[-1][which]
    rows = list(case[2][0].rows)
    costs, att = _fuse(case, cap, which)
    assert costs.dram_bytes.sum() <= base.dram_bytes.sum()
    assert costs.latency_cycles.sum() <= base.latency_cycles.sum()
    assert costs.dram_bytes[rows].sum() <= base.dram_bytes[rows].sum()
    assert costs.latency_cycles[rows].sum() <= base.latency_cycles[rows].sum()
    outside = np.ones(len(base.dram_bytes), bool)
    outside[rows] = False
    for f in LayerCosts._fields:  # layers outside the chain are untouched
        np.testing.assert_array_equal(getattr(costs, f)[outside], getattr(base, f)[outside])
    saved = base.dram_bytes.sum() - costs.dram_bytes.sum()
    assert att.saved_bytes.sum() == saved
    assert (saved > 0) == (att.mode[0] > 0)


def test_on_chip_equals_flash_when_the_scores_fit(case):
    on, on_att = _fuse(case, "on_chip", "fits")
    fl, fl_att = _fuse(case, "flash", "fits")
    assert on_att.mode.tolist() == [1] == fl_att.mode.tolist()  # on_chip
    assert (on_att.key_block[0], on_att.key_blocks[0]) == (SEQ, 1)
    for f in LayerCosts._fields:
        np.testing.assert_array_equal(getattr(on, f), getattr(fl, f))
    # the vector ops between the GEMMs move nothing; the GEMMs' compute is unchanged
    mid = list(case[2][0].rows[1:-1])
    assert np.all(on.dram_bytes[mid] == 0) and np.all(on.dma_cycles[mid] == 0)
    np.testing.assert_array_equal(on.compute_cycles, case[-1]["fits"].compute_cycles)


def test_flash_bytes_follow_the_formula(case):
    base = case[-1]["tiled"]
    costs, att = _fuse(case, "flash", "tiled")
    assert att.mode.tolist() == [2]  # flash
    # by hand: d = 8; SRAM = 2 x 128 KiB + 1 KiB = 263168 int8 elements;
    # B_r = min(floor(263168 / (4 x 8)), d, 128 query rows) = 8;
    # B_c = floor(min(1024 B / 4 B, 128 KiB / 1 B) / 8) = 32; T_r = 128 / 8; T_c = 64 / 32
    got = (att.query_block[0], att.key_block[0], att.query_blocks[0], att.key_blocks[0])
    assert got == (8, 32, 16, 2)
    c = case[2][0]
    # K is Q·Kᵀ's streamed operand and Q its second; P is P·V's second, V its first. In
    # elements (2 KV-head groups): Q = 2 x 128 rows x 8, K = 2 x 64 keys x 8, V = 2 x 8 x 64,
    # O = 2 x 8 x 128 (int8 bytes, whole 64-byte bursts); K and V read T_r = 16 times
    assert costs.dram_bytes[c.qk] == 2048 + 16 * 1024  # Q + T_r K
    assert costs.dram_bytes[c.pv] == 16 * 1024 + 2048  # T_r V + O
    # online softmax: (T_c - 1) x 128 rows x 2 groups x (d + 2 ALU ops + one exp of
    # 4 lane cycles), over 16 lanes, as extra compute of the Softmax row
    extra = costs.compute_cycles[c.softmax] - base.compute_cycles[c.softmax]
    assert extra == math.ceil(128 * 2 * (8 + 2 + 4) / 16)


def test_on_chip_alone_leaves_a_tiled_chain_unfused(case):
    costs, att = _fuse(case, "on_chip", "tiled")
    assert att.mode.tolist() == [0] and att.saved_bytes.tolist() == [0.0]
    for f in LayerCosts._fields:
        np.testing.assert_array_equal(getattr(costs, f), getattr(case[-1]["tiled"], f))


def test_none_leaves_results_unchanged(case):
    costs, att = _fuse(case, "none", "fits")
    assert att.mode.tolist() == [0] and att.saved_bytes.tolist() == [0.0]
    for f in LayerCosts._fields:
        np.testing.assert_array_equal(getattr(costs, f), getattr(case[-1]["fits"], f))


@pytest.mark.integration
def test_lower_reports_the_fused_block(case):
    graph, spec = case[0], case[3]
    s = lower(graph, spec.with_fields({"ops.attention_fusion": "flash", **SMALL}))
    base = case[-1]["tiled"]
    (a,) = s.attention
    assert (a.qk, a.softmax, a.pv, a.mode) == ("blocks/0/attn/matmul_0", "blocks/0/attn/softmax_0",
                                               "blocks/0/attn/matmul_1", "flash")
    assert a.dram_bytes_saved == base.dram_bytes.sum() - s.dram_bytes > 0
    assert s.to_dict()["attention"][0]["mode"] == "flash"


def test_vmap_over_stacked_specs_decides_per_spec(case):
    graph, layers, chains, spec, (wb, ab), base = case
    specs = stack_specs([spec, spec.with_fields(SMALL)])
    both = jax.tree.map(lambda *x: np.stack(x), base["fits"], base["tiled"])
    with jax.enable_x64(True):
        costs, att = jax.vmap(_jitted(tuple(layers), chains, "flash"),
                              in_axes=(0, 0, None, None))(specs, both, wb, ab)
    assert np.asarray(att.mode).tolist() == [[1], [2]]  # on_chip at 128 KiB, flash at 1 KiB
    for i, which in enumerate(("fits", "tiled")):
        one, _ = _fuse(case, "flash", which)
        np.testing.assert_allclose(np.asarray(costs.latency_cycles)[i], one.latency_cycles,
                                   rtol=1e-6)


def test_unknown_capability_is_a_config_error(case):
    graph, layers, chains, spec, (wb, ab), base = case
    with pytest.raises(ConfigError, match="unknown attention_fusion 'fast'"):
        spec.with_fields({"ops.attention_fusion": "fast"})
    with pytest.raises(ConfigError, match="unknown attention fusion 'fast'"):
        attention_costs(layers, chains, spec, base["fits"], wb, ab, "fast")


def test_chain_membership_is_the_dense_matrix_disjoint_or_not():
    """The ``[C, L]`` membership is computed in the program from each row's chain; chains that
    share a row fall back to the constant. Both are the dense 0/1 matrix."""
    from types import SimpleNamespace

    from npujax._exact import exact
    from npujax.plan.passes.attention import _membership

    for rows in (((0, 2, 3), (5, 6)), ((0, 2), (2, 4)), ((1, 1, 3),)):
        chains = [SimpleNamespace(rows=r) for r in rows]
        dense = np.zeros((len(rows), 8))
        for i, r in enumerate(rows):
            dense[i, list(r)] = 1.0
        got = exact(jax.jit(lambda c=chains: _membership(c, 8)))()
        assert np.array_equal(np.asarray(got), dense)

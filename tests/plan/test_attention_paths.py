"""The attention pass on a traced one-block decoder: ``sweep_shapes`` over sequence lengths (the
chains' extents from the traced sizes), what the shape sweep refuses, and the ``layer`` fusion
schedule (a fused attention block is a boundary of the cross-layer schedule).

That every consumer (the search's latency table, the design-space sweep, codesign, fit) gets
the same numbers as ``lower`` is tests/plan/test_program_agreement.py. Each test here also checks
that the fusion changed the numbers, so that a path ignoring it fails."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from npujax.errors import ConfigError
from npujax.hw import load_npu_spec
from npujax.models.decoders import decoder_graph
from npujax.models.transformer import DECODER_CONFIGS
from npujax.plan import lower, sweep_shapes, workloads
from npujax.search import latency_table

pytestmark = pytest.mark.flax_model

SEQS = (32, 64)
# ofmap 1 KiB: a query block's score rows do not fit, so "flash" tiles (B_c < S_k)
SMALL = {"memory.ofmap_sram_bytes": 1024}
SPECS = {
    "edge (on_chip, as shipped)": ("edge_transformer_16x16", {}),
    "edge, flash-tiled": ("edge_transformer_16x16", {"ops.attention_fusion": "flash", **SMALL}),
    "datacenter (flash, as shipped)": ("datacenter_128x128", {}),
}


@pytest.fixture(scope="module")
def graphs():
    """``{seq_len: graph}`` of a one-block tiny decoder's prefill (one attention block)."""
    cfg = dataclasses.replace(DECODER_CONFIGS["tiny"], layers=1)
    return {s: decoder_graph(cfg, phase="prefill", seq_len=s, kv_len=1, batch=1) for s in SEQS}


def _spec(key, **extra):
    name, fields = SPECS[key]
    return load_npu_spec(name).with_fields({**fields, **extra})


def _none(spec):
    return spec.with_fields({"ops.attention_fusion": "none"})


def test_stock_transformer_presets_declare_attention_fusion():
    assert load_npu_spec("edge_transformer_16x16").ops.attention_fusion == "on_chip"
    assert load_npu_spec("bitserial_transformer_16x16").ops.attention_fusion == "on_chip"
    assert load_npu_spec("datacenter_128x128").ops.attention_fusion == "flash"


def test_sweep_shapes_equals_lower_at_each_length(graphs):
    spec = _spec("edge (on_chip, as shipped)")
    costs = sweep_shapes([graphs[s] for s in SEQS], spec)
    for i, s in enumerate(SEQS):
        sched = lower(graphs[s], spec)
        for f in ("latency_cycles", "dram_bytes", "compute_cycles"):  # per layer, bit for bit
            np.testing.assert_array_equal(getattr(costs, f)[i],
                                          [getattr(r.costs, f) for r in sched.layers])
        # (the totals up to the order of the sum)
        np.testing.assert_allclose(costs.latency_cycles[i].sum() / spec.array.clock_hz,
                                   sched.latency_s, rtol=1e-12)
        assert sched.dram_bytes < lower(graphs[s], _none(spec)).dram_bytes


def test_sweep_shapes_refuses_what_it_cannot_fuse(graphs):
    spec = _spec("edge (on_chip, as shipped)")
    lists = [workloads(graphs[s], spec) for s in SEQS]
    with pytest.raises(ConfigError, match="pass the points' graphs"):
        sweep_shapes(lists, spec)
    sweep_shapes(lists, _none(spec))  # nothing to fuse: workload lists suffice
    with pytest.raises(ConfigError, match="cannot follow traced shapes"):
        sweep_shapes([graphs[s] for s in SEQS], spec.with_fields({"ops.fusion": "layer"}))


@pytest.mark.integration  # compiles the layer schedule's programs (about 10 s unloaded)
@pytest.mark.parametrize("fits", [True, False])
def test_layer_fusion_with_attention_blocks(graphs, fits):
    g = graphs[64]
    spec = _spec("edge (on_chip, as shipped)", **{"ops.fusion": "layer",
                                                   "ops.attention_fusion": "flash",
                                                   **({} if fits else SMALL)})
    s, plain = lower(g, spec), lower(g, _none(spec))
    # never worse than the layer schedule alone; the table follows lower
    assert s.latency_s <= plain.latency_s and s.dram_bytes <= plain.dram_bytes
    table = latency_table(g, spec, (8,), 8)
    np.testing.assert_allclose(table.latency_s({n: 8 for n in table.layers}), s.latency_s,
                               rtol=1e-6)
    (a,) = s.attention
    if fits:  # the block runs as one kernel: faster, and no tensor it touches stays on chip
        assert a.mode == "on_chip" and s.latency_s < plain.latency_s
        rows = set(a.layers)
        touching = [e for e in s.edges if e.producer in rows or rows & set(e.consumers)]
        assert touching and all(e.placement == "dram" for e in touching)
        assert any(e.placement != "dram" for e in s.edges)  # the rest is still fused
    else:  # tiled, the kernel's K/V re-reads lose to the layer schedule: that one is kept
        assert a.mode == "unfused" and a.dram_bytes_saved == 0
        assert s.latency_s == plain.latency_s

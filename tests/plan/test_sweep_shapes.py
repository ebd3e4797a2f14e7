"""One vmapped cost program for a sweep over model shapes (:func:`npujax.plan.sweep_shapes`):
the same latencies as lowering each point, and points of another structure refused."""

from __future__ import annotations

import pytest

from npujax.errors import ConfigError
from npujax.ir.passes import rebatch
from npujax.plan import lower, sweep_shapes, workloads
from npujax.quantize.spec import quant_spec


def test_sweep_equals_lowering_each_point(small_resnet, edge_spec):
    g, _ = small_resnet
    graphs = [rebatch(g, b) for b in (1, 3)]
    q = quant_spec(g, 4, 8)
    costs = sweep_shapes([workloads(x, edge_spec) for x in graphs], edge_spec, q)
    assert costs.latency_cycles.shape == (2, len(workloads(g, edge_spec)))
    for i, x in enumerate(graphs):
        s = lower(x, edge_spec, q)
        assert costs.latency_cycles[i].sum() / edge_spec.array.clock_hz == s.latency_s
        assert costs.dram_bytes[i].sum() == s.dram_bytes
    assert costs.latency_cycles[1].sum() > 2 * costs.latency_cycles[0].sum()


def test_sweep_refuses_another_structure(small_resnet, edge_spec):
    g, _ = small_resnet
    w = workloads(g, edge_spec)
    with pytest.raises(ConfigError, match="point 1 .* another layer structure"):
        sweep_shapes([w, w[:-1]], edge_spec)
    with pytest.raises(ConfigError, match="at least one point"):
        sweep_shapes([], edge_spec)

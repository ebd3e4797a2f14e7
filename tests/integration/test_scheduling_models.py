"""Cross-layer scheduling on the real PP-OCR classifier (small: one model, one preset)."""

import pytest

from npujax.ir.passes import optimize
from npujax.plan import core_schedules, lower, lower_models, memory_report

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def cls_graph(ppocr_cls):
    _, graph, params = ppocr_cls
    return optimize(graph, params)[0]


def test_ppocr_cls_layer_fusion_pipeline_and_memory(cls_graph, edge_spec):
    plain = lower(cls_graph, edge_spec, fusion="residual")  # layer fusion's epilogues, no more
    fused = lower(cls_graph, edge_spec, fusion="layer")
    # every activation between NPU layers fits beside the working sets (docs/results/scheduling.md)
    assert fused.edges and all(e.placement == "sram" for e in fused.edges)
    assert fused.unfused_latency_s == pytest.approx(plain.latency_s, rel=1e-6)
    assert fused.dram_bytes < 0.3 * plain.dram_bytes and fused.latency_s < plain.latency_s
    m = memory_report(cls_graph, fused, edge_spec)
    assert m.fits and m.sram_peak_bytes <= m.sram_capacity_bytes
    two = edge_spec.with_fields({"array.cores": 2})
    cs = core_schedules(cls_graph, two, fusion="layer")
    assert cs["pipeline"].throughput_per_s > cs["layer_split"].throughput_per_s
    co = lower_models({"a": cls_graph, "b": cls_graph}, two, sharing="core_partitioned")
    assert all(x.together_s >= x.alone_s for x in co.models)

"""Multi-core pipelining, peak memory and co-resident models."""

import pytest
from flax import nnx
from hypothesis import given, settings
from hypothesis import strategies as st

from npujax.errors import ConfigError
from npujax.models.cnn import DigitsCNN
from npujax.plan import (
    best_core_schedule,
    core_schedules,
    lower,
    lower_models,
    memory_report,
)
from tests.flax_graphs import traced


def _trace(model, shape):
    return traced(model, shape)[0]


@pytest.fixture(scope="module")
def resnet(small_resnet):
    return small_resnet[0]


@pytest.fixture(scope="module")
def digits():
    return _trace(DigitsCNN(rngs=nnx.Rngs(0)), (1, 8, 8, 1))


def test_pipeline_stages_cover_the_layers_in_order(resnet, edge_spec):
    spec = edge_spec.with_fields({"array.cores": 4, "memory.core_link_bytes_per_s": 32e9})
    cs = core_schedules(resnet, spec)
    split, pipe = cs["layer_split"], cs["pipeline"]
    one = lower(resnet, edge_spec)
    assert split.period_s == split.latency_s == lower(resnet, spec).latency_s
    assert [n for s in pipe.stages for n in s] == [r.name for r in one.layers]
    assert 1 <= pipe.cores <= 4 and len(pipe.stage_s) == pipe.cores
    assert pipe.period_s == pytest.approx(max(max(pipe.stage_s), pipe.dram_s))
    assert pipe.latency_s == pytest.approx(sum(pipe.stage_s))
    assert pipe.throughput_per_s >= 1 / one.latency_s * (1 - 1e-9)
    assert best_core_schedule(cs, "throughput").period_s == min(split.period_s, pipe.period_s)
    assert best_core_schedule(cs, "latency").latency_s == min(split.latency_s, pipe.latency_s)
    with pytest.raises(ConfigError, match="objective"):
        best_core_schedule(cs, "energy")
    assert cs["pipeline"].to_dict()["throughput_per_s"] == pipe.throughput_per_s


@settings(max_examples=12, deadline=None)
@given(cores=st.integers(1, 4), link=st.sampled_from([0.0, 1e9, 1e11]),
       fusion=st.sampled_from(["elementwise", "layer"]), kib=st.sampled_from([4, 32, 128]))
def test_pipelined_throughput_at_least_single_core(resnet, edge_spec, cores, link, fusion, kib):
    spec = edge_spec.with_fields({
        "array.cores": cores, "memory.core_link_bytes_per_s": link,
        "memory.ifmap_sram_bytes": kib * 1024, "memory.ofmap_sram_bytes": kib * 1024})
    pipe = core_schedules(resnet, spec, fusion=fusion)["pipeline"]
    single = lower(resnet, spec.with_fields({"array.cores": 1}), fusion=fusion)
    assert pipe.throughput_per_s >= single.throughput_per_s * (1 - 1e-9)


def test_memory_report(resnet, edge_spec):
    s = lower(resnet, edge_spec)
    m = memory_report(resnet, s, edge_spec)
    assert m.fits and m.spill == () and m.dram_capacity_bytes == 0
    assert m.weight_bytes > 0 and m.dram_activation_peak_bytes > 0
    assert m.dram_footprint_bytes == pytest.approx(m.weight_bytes + m.dram_activation_peak_bytes)
    fused = lower(resnet, edge_spec, fusion="layer")
    mf = memory_report(resnet, fused, edge_spec)
    # activations kept on chip leave DRAM; the SRAM holds them instead
    assert mf.dram_activation_peak_bytes < m.dram_activation_peak_bytes
    assert 0 < mf.sram_peak_bytes <= mf.sram_capacity_bytes
    small = edge_spec.with_fields({"memory.dram_bytes": m.dram_footprint_bytes / 2})
    ms = memory_report(resnet, lower(resnet, small), small)
    assert not ms.fits and ms.spill
    assert sum(b for _, b in ms.spill) >= m.dram_footprint_bytes / 2 - m.dram_activation_peak_bytes


def test_two_models_time_multiplexed_and_core_partitioned(resnet, digits, edge_spec):
    spec = edge_spec.with_fields({"array.cores": 2})
    graphs = {"resnet": resnet, "digits": digits}
    tm = lower_models(graphs, spec)
    plain = {n: lower(g, spec).latency_s for n, g in graphs.items()}
    # 24 + 75 KiB of weights fit half of two cores' filter SRAM (128 KiB) together: they stay on
    # chip, and each model runs at its weights-resident speed, waiting for the other
    for m in tm.models:
        assert m.weights == "sram" and m.alone_s < plain[m.name] and m.slowdown >= 1
        assert m.together_s == pytest.approx(sum(x.alone_s for x in tm.models))
    # one core (64 KiB): only the ResNet's fit alone, and not both together
    one = lower_models(graphs, edge_spec)
    assert [m.alone_s < lower(graphs[m.name], edge_spec).latency_s for m in one.models] == [
        True, False]
    assert [m.weights for m in one.models] == ["dram", "dram"]
    assert one.models[0].together_s == pytest.approx(
        sum(lower(g, edge_spec).latency_s for g in graphs.values()))
    cp = lower_models(graphs, spec, sharing="core_partitioned")
    assert [m.cores for m in cp.models] == [1, 1]
    for m in cp.models:
        assert m.together_s >= m.alone_s
    assert cp.to_dict()["models"][0]["name"] == "resnet"
    with pytest.raises(ConfigError, match="core per model"):
        lower_models(graphs, edge_spec, sharing="core_partitioned")
    with pytest.raises(ConfigError, match="add up"):
        lower_models(graphs, spec, sharing="core_partitioned", cores=[2, 1])
    with pytest.raises(ConfigError, match="sharing"):
        lower_models(graphs, spec, sharing="spatial")
    # a DRAM too small for both: the second model's weights are swapped in from the host
    need = tm.models[0].memory.dram_footprint_bytes
    tight = edge_spec.with_fields({"memory.dram_bytes": need * 1.01})
    sw = lower_models(graphs, tight)
    assert sw.models[1].weights == "host"
    assert sw.models[1].swap_s > 0


@settings(max_examples=12, deadline=None)
@given(cores=st.integers(2, 4), sharing=st.sampled_from(["time_multiplexed", "core_partitioned"]),
       bw=st.sampled_from([1e8, 1e9, 6.4e9]), fusion=st.sampled_from(["elementwise", "layer"]),
       cap=st.sampled_from([0.0, 2e4, 1e9]))
def test_together_never_faster_than_alone(resnet, digits, edge_spec, cores, sharing, bw, fusion,
                                          cap):
    spec = edge_spec.with_fields({"array.cores": cores, "memory.dram_bytes_per_s": bw,
                                  "memory.dram_bytes": cap})
    co = lower_models({"resnet": resnet, "digits": digits}, spec, sharing=sharing, fusion=fusion)
    for m in co.models:
        assert m.together_s >= m.alone_s * (1 - 1e-9), m

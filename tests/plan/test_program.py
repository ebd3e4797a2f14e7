"""The one cost program's composer: which passes it finds, applies and refuses (no compilation)."""

from __future__ import annotations

import pytest

from npujax.errors import ConfigError
from npujax.hw import load_npu_spec
from npujax.plan.passes import registered
from npujax.plan.passes.attention import AttentionChain
from npujax.plan.passes.base import CostMode, CostPass
from npujax.plan.program import _check, active_passes, check_program, needs_static_layers

CHAIN = AttentionChain(0, 1, 2, (0, 1, 2), 8, 8, 4, 1, True, True)


def test_every_pass_module_is_registered_once_in_order():
    names = [p.name for p in registered()]
    assert names == ["attention", "cross_layer", "weight_stream", "invocation",
                     "instruction_stream", "energy", "onchip_split"]
    assert [p.order for p in registered()] == sorted(p.order for p in registered())


def test_only_the_spec_switches_and_the_mode_choose_the_passes():
    spec = load_npu_spec("edge_16x16")
    assert [p.name for p in active_passes(spec)] == ["energy"]
    assert [p.name for p in active_passes(spec, mode=CostMode(energy=False))] == []
    # attention: recognised chains run as kernels only where the preset fuses attention
    assert "attention" not in [p.name for p in active_passes(spec, (CHAIN,))]
    flash = spec.with_fields({"ops.attention_fusion": "flash"})
    assert "attention" in [p.name for p in active_passes(flash, (CHAIN,))]
    assert "attention" not in [p.name for p in active_passes(flash)]
    layer = spec.with_fields({"ops.fusion": "layer", "memory.parameter_cache": "streams_from_dram"})
    assert [p.name for p in active_passes(layer)] == ["cross_layer", "weight_stream", "energy"]
    assert needs_static_layers(layer) and not needs_static_layers(spec)
    # a fixed cost per inference: where the preset states one
    assert "invocation" in [p.name for p in active_passes(load_npu_spec("coral_edgetpu"))]
    # the instruction stream read per inference: where the preset states its size
    assert "instruction_stream" in [p.name for p in active_passes(load_npu_spec("coral_edgetpu"))]
    assert "instruction_stream" not in [p.name for p in active_passes(spec)]
    # one on-chip SRAM split per model: where the preset says so
    assert active_passes(load_npu_spec("coral_edgetpu"))[-1].name == "onchip_split"
    assert "onchip_split" not in [p.name for p in active_passes(spec)]


def test_a_pass_that_cannot_follow_the_mode_is_refused_by_name():
    spec = load_npu_spec("tpu_v1")  # layer fusion
    with pytest.raises(ConfigError, match="cross_layer .* cannot follow traced shapes"):
        check_program(spec, shapes=True)
    with pytest.raises(ConfigError, match="cross_layer .* static list"):
        check_program(spec, table=True)
    exact_only = CostPass("exact_only", 50, lambda s, c, m: True, lambda i, s: s, relaxed=False)
    with pytest.raises(ConfigError, match="exact_only .* no relaxed form"):
        _check(CostMode(relaxed=True), (exact_only,), spec, False, False)
    _check(CostMode(), (exact_only,), spec, False, False)  # the exact mode runs it
    with pytest.raises(ConfigError, match="count slope"):
        check_program(spec, mode=CostMode(count_slope="steep"))


def test_cores_per_inference_runs_one_inference_on_that_many_cores():
    """A three-core NPU whose runtime gives a model one core (RKNN's default core mask) costs
    a layer as the one-core NPU does, exact and traced (a fit's differentiable spec); 0 keeps
    every layer split over all the cores."""
    import dataclasses

    import numpy as np

    from npujax.hw import differentiable_spec, fields
    from npujax.plan.fit import predict_latency_s
    from npujax.plan.program import inference_cores
    from npujax.plan.workload import Workload

    base = load_npu_spec("edge_16x16")
    three = fields.replace(base, {"array.cores": 3})
    one_of_three = fields.replace(three, {"array.cores_per_inference": 1})
    one = fields.replace(base, {"array.cores": 1})
    fc = Workload("fc", "Gemm", "gemm", M=192, K=256, N=256, macs=192 * 256 * 256,
                  weight_elems=256 * 256, in_elems=192 * 256, out_elems=192 * 256)

    def t(s):
        return float(np.sum(predict_latency_s([fc], s)))

    assert t(one_of_three) == t(one) > t(three)
    assert inference_cores(three) is three
    assert float(inference_cores(differentiable_spec(one_of_three)).array.cores) == 1.0
    assert dataclasses.replace(one_of_three.array, cores_per_inference=0) == three.array

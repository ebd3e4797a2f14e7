"""Every consumer of the NPU model gets the same numbers from the one cost program.

For a covering set of cases (every shipped preset, every fusion level, every dataflow and three
model kinds: a residual CNN, a ViT block and a decoder step), ``lower``, the design-space sweep at
the preset's own point, codesign's exact evaluation, fit's forward pass (exact and relaxed) and the
precision search's latency table agree bit for bit (the shape sweep equals ``lower`` at every length
in tests/plan/test_sweep_shapes.py and test_attention_paths.py, and refuses layer fusion in
test_program.py). Before the one cost program the sweep and codesign ignored ``layer`` fusion
(DigitsCNN on ``tpu_v1``: 7.392 against ``lower``'s 7.228 us) and fit refused it; each test also
checks that the case's passes changed the numbers where they apply, so a consumer that skipped one
would fail.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import npujax
from npujax import _program_cache
from npujax.hw import differentiable_spec, list_presets, load_npu_spec
from npujax.hw.spec import FUSION_LEVELS
from npujax.plan import CostMode, lower, network, program_cost
from npujax.plan.fit import predict_latency_s
from npujax.plan.passes.energy import ENERGY_BREAKDOWN
from npujax.plan.program import totals
from npujax.search import latency_table
from npujax.search.codesign import BandwidthClass, CodesignConfig, evaluate_design
from npujax.systolic import DATAFLOW_NAMES

pytestmark = pytest.mark.flax_model

MODELS = ("resnet", "vit", "decoder")
PRESETS = tuple(list_presets())
#: One case per shipped preset (12 presets x 4 levels x 3 dataflows x 3 models would compile
#: ~1,200 programs): every fusion level, dataflow and model appears, and every pass runs: the
#: attention kernels on chip and flash-tiled inside layer fusion, a host-CPU fallback
#: (gemmini), precision scaling (bit fusion, bit-serial) and a parameter cache streaming the
#: rest of the weights over the host link.
CASES = [
    ("bitfusion_16x16", "none", "weight_stationary", "resnet", {}),
    ("bitserial_16x16", "elementwise", "output_stationary", "vit", {}),
    ("bitserial_transformer_16x16", "residual", "input_stationary", "decoder", {}),
    # the parameter cache streaming from DRAM, the invocation overhead, one partition
    ("coral_edgetpu", "elementwise", "weight_stationary", "resnet",
     {"memory.parameter_cache_bytes": 8192, "memory.sram_split": "fixed",
      "memory.onchip_sram_bytes": 0}),
    # the preset's one SRAM split per model (passes/onchip_split.py)
    ("coral_devboard", "elementwise", "output_stationary", "vit", {}),
    ("datacenter_128x128", "layer", "output_stationary", "decoder", {}),
    ("edge_16x16", "layer", "weight_stationary", "resnet",
     {"memory.parameter_cache": "streams_from_host", "memory.parameter_cache_bytes": 8192}),
    ("edge_transformer_16x16", "layer", "weight_stationary", "vit", {}),
    ("gemmini_16x16", "residual", "input_stationary", "resnet", {}),
    ("tpu_v1", "elementwise", "input_stationary", "vit", {}),
    # Eyeriss's row stationary: its own closed form (rs_conv, rs_dram) in every consumer
    ("eyeriss", "elementwise", "row_stationary", "resnet", {}),
    # three cores, one inference on one of them (array.cores_per_inference): every consumer
    # costs it on one core
    ("rk3588_npu", "residual", "weight_stationary", "resnet", {}),
]


def test_cases_cover_every_axis():
    for axis, values in ((0, PRESETS), (1, FUSION_LEVELS), (2, DATAFLOW_NAMES), (3, MODELS)):
        assert {c[axis] for c in CASES} == set(values)
    assert any(c[4] for c in CASES)  # the weight_stream pass


@pytest.fixture(scope="module")
def graphs(model_kinds):
    return model_kinds


def _tree_sum(x) -> float:
    """The sweep's fixed tree of additions (npujax.plan.layer_sums), in numpy."""
    x = np.asarray(x, np.float64)
    x = np.concatenate([x, np.zeros((1 << max(len(x) - 1, 0).bit_length()) - len(x))])
    while len(x) > 1:
        x = x[:len(x) // 2] + x[len(x) // 2:]
    return float(x[0])


@pytest.mark.parametrize("preset,fusion,dataflow,model,extra", CASES)
def test_consumers_agree_bit_for_bit(graphs, preset, fusion, dataflow, model, extra):
    """Compiled, every consumer agrees bit for bit; ``lower``'s default evaluation of the same
    program with numpy (npujax._jaxpr_numpy) equals it to float64 rounding."""
    graph = graphs[model]
    spec = load_npu_spec(preset).with_fields({"ops.fusion": fusion,
                                              "array.dataflow": dataflow, **extra})
    with _program_cache.numpy_evaluation(False):
        _consumers_agree(graph, spec, fusion, dataflow, extra)


def _consumers_agree(graph, spec, fusion, dataflow, extra):
    s = lower(graph, spec)
    fallbacks = len(_program_cache.numpy_fallbacks)
    with _program_cache.numpy_evaluation(True):
        by_numpy = lower(graph, spec)
    assert len(_program_cache.numpy_fallbacks) == fallbacks  # numpy ran every program
    for field in ("latency_cycles", "dram_bytes", "compute_cycles"):
        np.testing.assert_allclose([getattr(r.costs, field) for r in by_numpy.layers],
                                   [getattr(r.costs, field) for r in s.layers], rtol=1e-12)
    np.testing.assert_allclose([by_numpy.latency_s, by_numpy.energy_j],
                               [s.latency_s, s.energy_j], rtol=1e-12)
    cycles = np.asarray([r.costs.latency_cycles for r in s.layers])
    seconds = np.asarray([r.latency_s for r in s.layers])
    layers, chains = network(graph, spec)

    # the passes this case calls for changed lower's numbers (a consumer skipping one differs)
    if fusion == "layer" and any(e.placement != "dram" for e in s.edges):
        assert s.unfused_dram_bytes is not None and s.dram_bytes < s.unfused_dram_bytes
    if any(a.mode != "unfused" for a in s.attention):
        assert sum(a.dram_bytes_saved for a in s.attention) > 0
    if spec.memory.parameter_cache == "streams_from_host" and extra:
        # part of the weights cached, the rest over the host link: none from DRAM
        assert s.breakdown_s()["transfer"] > 0
        assert all(r.costs.weight_dram_bytes == 0 for r in s.layers)
    elif spec.memory.parameter_cache == "streams_from_dram" and extra:
        # the first layers' weights cached (no DRAM), the others' read from DRAM
        w = [r.costs.weight_dram_bytes for r in s.layers if r.kind == "gemm"]
        assert w[0] == 0 and w[-1] > 0

    # the design-space sweep at the preset's own point: the totals of the same per-layer numbers
    r = npujax.sweep(graph, spec, {"dataflow": [dataflow]})
    assert r.columns["latency_cycles"][0] == _tree_sum(cycles)
    assert r.columns["dram_bytes"][0] == _tree_sum([x.costs.dram_bytes for x in s.layers])
    energy = sum(_tree_sum([x.energy.breakdown()[k] for x in s.layers])
                 for k in ENERGY_BREAKDOWN)
    assert r.columns["energy_j"][0] == energy

    # fit's forward pass: the exact prediction, and (where a pass beyond the per-layer model
    # follows it: cross-layer placement, weight streaming) the relaxed model its descent uses
    assert np.array_equal(predict_latency_s(layers, spec, chains=chains), seconds)
    if fusion == "layer" or extra:
        n = len(layers)
        relaxed_mode = CostMode(relaxed=True, count_slope="mean", energy=False)
        with jax.enable_x64(True):
            relaxed = jax.jit(lambda h: program_cost(layers, h, jnp.full(n, 8.0),
                                                     jnp.full(n, 8.0), chains=chains,
                                                     mode=relaxed_mode))(
                differentiable_spec(spec, jnp.float64))
            assert np.array_equal(np.asarray(relaxed.costs.latency_cycles), cycles)
            # the program's totals: the sweep's fixed tree of additions
            assert float(totals(relaxed).latency_cycles) == r.columns["latency_cycles"][0]

    # the precision search's latency table at uniform widths (its seconds are float32)
    t = latency_table(graph, spec, (8,), 8)
    gemm = [i for i, w in enumerate(layers) if w.kind == "gemm"]
    assert np.array_equal(np.asarray(t.seconds)[:, 0], seconds[gemm].astype(np.float32))

    # codesign's exact evaluation of the base design
    names = [layers[i].name for i in gemm]
    cfg = CodesignConfig(area_mm2=1e6, candidates=(8,), max_loss_increase=1.0,
                         bandwidth_classes=(BandwidthClass("base", spec.memory.dram_bytes_per_s,
                                                           0.0, 0.0),))
    m = spec.memory
    d = evaluate_design(graph, spec, {n: {(8, 8): 0.0} for n in names}, cfg,
                        rows=spec.array.rows, cols=spec.array.cols,
                        sram_bytes=(m.ifmap_sram_bytes, m.filter_sram_bytes, m.ofmap_sram_bytes),
                        bandwidth="base", policy={n: (8, 8) for n in names})
    assert d.latency_s == s.latency_s and d.energy_j == s.energy_j

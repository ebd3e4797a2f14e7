"""The cost model under the two DRAM-level mappings: scalesim = SCALE-Sim's order (gemm_memory),
best never more DRAM bytes, and the mapper's extra fill/drain is counted in compute."""

import jax
import numpy as np
import pytest

from npujax.errors import ConfigError
from npujax.hw import load_npu_spec
from npujax.plan import layer_costs
from npujax.plan.workload import Workload
from npujax.systolic import gemm_cycles, gemm_memory


def _gemm(name, M, K, N, in_elems=None):
    return Workload(name=name, op="Conv", kind="gemm", M=M, K=K, N=N, groups=1, macs=M * K * N,
                    weight_elems=K * N, bias_elems=N, in_elems=in_elems or M * K,
                    out_elems=M * N, cpu_ops=2 * M * K * N)


# ppocr_det's 3x3 conv 96 -> 32 at 160x160 (WS spills partial sums in SCALE-Sim's order), a
# 1x1 conv and a small GEMM that fits everywhere
LAYERS = [_gemm("conv3x3", 25600, 864, 32, 25600 * 96), _gemm("conv1x1", 6400, 96, 96),
          _gemm("small", 64, 64, 64)]


def _costs(spec, df, mapping):
    n = len(LAYERS)
    bits = np.full(n, 8.0, np.float32)
    with jax.enable_x64(True):
        c = layer_costs(LAYERS, spec, bits, bits, df, mapping=mapping)
    return jax.tree.map(np.asarray, c)


@pytest.mark.parametrize("df", ["weight_stationary", "output_stationary", "input_stationary"])
def test_scalesim_is_gemm_memory_and_best_never_moves_more(df):
    spec = load_npu_spec("edge_16x16")
    ref, best = _costs(spec, df, "scalesim"), _costs(spec, df, "best")
    sram = spec.memory.ofmap_sram_bytes
    M, K, N, U = (np.asarray([getattr(w, f) for w in LAYERS]) for f in ("M", "K", "N",
                                                                         "in_elems"))
    g = gemm_cycles(M, K, N, 16, 16, df)
    m = gemm_memory(M, K, N, 16, 16, df, sram_bytes_a=sram, sram_bytes_b=sram,
                    sram_bytes_out=sram, dram_bytes_per_cycle=6.4, unique_elems_a=U)
    # scalesim: the fold model's cycles, gemm_memory's operand bytes (+ bias, whole bursts)
    np.testing.assert_array_equal(ref.compute_cycles, np.asarray(g["compute_cycles"]))
    extra = ref.dram_bytes - np.asarray(m["dram_bytes"])
    assert np.all((extra >= 0) & (extra <= 4 * 64 + 4 * N))
    assert np.all(best.dram_bytes <= ref.dram_bytes)
    assert np.all(best.compute_cycles >= ref.compute_cycles)  # chunks only add fill/drain
    np.testing.assert_array_equal(best.compute_cycles - best.fill_drain_cycles,
                                  ref.compute_cycles - ref.fill_drain_cycles)


def test_weight_stationary_spills_in_scalesim_order_only():
    spec = load_npu_spec("edge_16x16")
    ref = _costs(spec, "weight_stationary", "scalesim")
    best = _costs(spec, "weight_stationary", "best")
    assert ref.dram_bytes[0] > 100 * best.dram_bytes[0]  # 353 MB of partial sums vs 3.3 MB
    assert best.latency_cycles[0] < ref.latency_cycles[0] / 15
    assert best.fill_drain_cycles[0] == ref.fill_drain_cycles[0] + 37 * 108 * 46  # 38 chunks
    # the spec field selects it too, and an unknown name is refused
    via_spec = _costs(spec.with_fields({"memory.mapping": "scalesim"}), "weight_stationary", None)
    np.testing.assert_array_equal(via_spec.dram_bytes, ref.dram_bytes)
    with pytest.raises(ConfigError, match="mapping"):
        spec.with_fields({"memory.mapping": "greedy"})

"""Property-based checks of the cost model over random shapes and hardware (issue #11): every
figure finite and non-negative, utilization <= 1, latency at least the roofline bound, the
counts exact, and the monotonicity the model promises (more bandwidth never slows a layer, a
longer GEMM never takes fewer cycles). A fixed example budget keeps it under a few seconds."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from npujax.errors import ConfigError
from npujax.hw import list_presets, load_npu_spec
from npujax.plan.costs import layer_costs
from npujax.plan.workload import Workload

PRESETS = {p: load_npu_spec(p) for p in list_presets()}


def _gemm(M, K, N, groups=1):
    return Workload(name="g", op="Conv", kind="gemm", M=M, K=K, N=N, groups=groups,
                    macs=M * K * N * groups, weight_elems=K * N * groups, bias_elems=N * groups,
                    in_elems=M * K * groups, out_elems=M * N * groups, cpu_ops=2 * M * K * N)


def _costs(layer, spec, wb=8.0, ab=8.0):
    c = layer_costs([layer], spec, np.asarray([wb], np.float32), np.asarray([ab], np.float32))
    return {k: np.asarray(v)[0] for k, v in c._asdict().items()}


hw = st.fixed_dictionaries({
    "preset": st.sampled_from(sorted(PRESETS)),
    "array.rows": st.integers(1, 256), "array.cols": st.integers(1, 256),
    "array.clock_hz": st.floats(1e6, 5e9), "memory.dram_bytes_per_s": st.floats(1e6, 1e13),
    "memory.ifmap_sram_bytes": st.integers(64, 2**24),
})
shapes = st.tuples(st.integers(1, 2**24), st.integers(1, 2**14), st.integers(1, 2**12),
                   st.integers(1, 4))
bits = st.sampled_from([2.0, 4.0, 8.0, 16.0])


@given(hw=hw, shape=shapes, wb=bits, ab=bits)
@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_costs_are_finite_non_negative_and_above_the_roofline(hw, shape, wb, ab):
    spec = PRESETS[hw.pop("preset")].with_fields(hw)
    M, K, N, groups = shape
    c = _costs(_gemm(M, K, N, groups), spec, wb, ab)
    for k, v in c.items():
        assert np.isfinite(v) and v >= 0, (k, v)
    assert c["mapping_efficiency"] <= 1 + 1e-9
    if spec.array.precision_scaling == "fixed":  # (a bit-composable or bit-serial array does
        # several narrow MACs per PE and cycle: its utilization is against the native peak)
        assert c["utilization"] <= 1 + 1e-9
    peak = spec.array.rows * spec.array.cols * spec.array.cores  # MACs per cycle at width
    passes = math.ceil(wb / spec.array.operand_bits) * math.ceil(ab / spec.array.operand_bits)
    if spec.array.precision_scaling == "fixed":
        assert c["compute_cycles"] >= math.ceil(M * K * N * groups * passes / peak)
    assert c["latency_cycles"] >= c["memory_cycles"] * (1 - 1e-6)
    assert c["latency_cycles"] >= c["compute_cycles"] * (1 - 1e-6)
    assert int(c["dram_bytes"]) == c["dram_bytes"]  # whole bytes (bursts), exact


@given(hw=hw, shape=shapes)
@settings(max_examples=12, deadline=None)
def test_monotone_in_bandwidth_and_gemm_length(hw, shape):
    spec = PRESETS[hw.pop("preset")].with_fields(hw)
    M, K, N, groups = shape
    base = _costs(_gemm(M, K, N, groups), spec)
    faster = spec.with_fields({"memory.dram_bytes_per_s": spec.memory.dram_bytes_per_s * 2})
    assert _costs(_gemm(M, K, N, groups), faster)["latency_cycles"] <= \
        base["latency_cycles"] * (1 + 1e-6)
    assert _costs(_gemm(2 * M, K, N, groups), spec)["compute_cycles"] >= base["compute_cycles"]


@pytest.mark.parametrize("field, value", [
    ("array.clock_hz", 1e308), ("array.clock_hz", 1e-300), ("array.cols", 2**31),
    ("array.rows", 0), ("memory.dram_bytes_per_s", float("inf")),
    ("host.link_latency_s", 1e300), ("vector.lanes", 2**40), ("array.operand_bits", 1000),
])
def test_non_physical_hardware_values_are_refused(field, value):
    with pytest.raises(ConfigError, match=field.split(".")[1]):
        PRESETS["edge_16x16"].with_fields({field: value})

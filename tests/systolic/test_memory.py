"""Memory model: roofline bound, monotone in SRAM size and bandwidth, compulsory traffic, vmap."""

import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from npujax.hw import DATAFLOWS
from npujax.systolic import gemm_cycles
from npujax.systolic.memory import PSUM_BYTES, gemm_memory

dims = st.integers(1, 3000)
arr = st.sampled_from([4, 8, 16, 32, 128])
sram = st.sampled_from([256, 4096, 65536, 1 << 20, 1 << 24])
bw = st.sampled_from([0.5, 4.0, 32.0, 1024.0])


def _mem(M, K, N, R, C, df, s, b, **kw):
    return jax.tree.map(np.asarray, gemm_memory(
        M, K, N, R, C, df, sram_bytes_a=s, sram_bytes_b=s, sram_bytes_out=s,
        dram_bytes_per_cycle=b, **kw))


@given(M=dims, K=dims, N=dims, R=arr, C=arr, df=st.sampled_from(DATAFLOWS), s=sram, b=bw)
@settings(max_examples=150, deadline=None)
def test_invariants(M, K, N, R, C, df, s, b):
    m = _mem(M, K, N, R, C, df, s, b)
    compute = int(gemm_cycles(M, K, N, R, C, df)["compute_cycles"])
    tol = 1 + 1e-5
    assert int(m["compute_cycles"]) == compute
    assert m["total_cycles"] * tol >= max(compute, m["dram_bytes"] / b)   # roofline
    assert m["stall_cycles"] >= 0
    # compulsory traffic: every operand at least once
    assert m["dram_read_bytes_a"] * tol >= M * K and m["dram_read_bytes_b"] * tol >= K * N
    assert m["dram_write_bytes_out"] * tol >= M * N
    # more SRAM never adds DRAM traffic; more bandwidth never adds stalls
    bigger = _mem(M, K, N, R, C, df, s * 16, b)
    assert bigger["dram_bytes"] <= m["dram_bytes"] * tol
    faster = _mem(M, K, N, R, C, df, s, b * 4)
    assert faster["stall_cycles"] <= m["stall_cycles"] * tol


def test_huge_sram_gives_compulsory_traffic_only():
    for df in DATAFLOWS:
        m = _mem(300, 200, 100, 16, 16, df, 1 << 30, 8.0, elem_bytes_out=2)
        assert float(m["dram_bytes"]) == 300 * 200 + 200 * 100 + 2 * 300 * 100
        assert bool(m["resident_a"]) and bool(m["resident_b"]) and bool(m["resident_out"])


def test_tiny_sram_refetches_per_fold_and_spills_partial_sums():
    M, K, N, R, C = 64, 40, 48, 8, 16
    ws = _mem(M, K, N, R, C, "weight_stationary", 64, 8.0)
    g = gemm_cycles(M, K, N, R, C, "weight_stationary")
    assert float(ws["dram_read_bytes_a"]) == float(g["sram_reads_a"])  # re-read per N fold
    k_folds = 5
    assert float(ws["dram_read_bytes_out"]) == M * N * (k_folds - 1) * PSUM_BYTES
    os_ = _mem(M, K, N, R, C, "output_stationary", 64, 8.0)
    assert float(os_["dram_read_bytes_out"]) == 0.0  # K in time: no partial sums leave the PEs


def test_infinite_bandwidth_has_no_stalls():
    m = _mem(500, 300, 200, 16, 16, "output_stationary", 1 << 10, 1e30)
    assert float(m["stall_cycles"]) < 1e-6
    assert float(m["total_cycles"]) == float(m["compute_cycles"])


def test_vmaps_over_hardware_configurations():
    rows = jnp.asarray([8, 16, 32, 128], jnp.int32)
    srams = jnp.asarray([1 << 12, 1 << 15, 1 << 17, 1 << 20], jnp.float32)
    bws = jnp.asarray([2.0, 8.0, 16.0, 64.0], jnp.float32)
    f = jax.jit(jax.vmap(lambda r, s, b: gemm_memory(
        3136, 576, 64, r, r, "ws", sram_bytes_a=s, sram_bytes_b=s, sram_bytes_out=s,
        dram_bytes_per_cycle=b)["total_cycles"]))
    got = np.asarray(f(rows, srams, bws))
    for i in range(4):
        want = _mem(3136, 576, 64, int(rows[i]), int(rows[i]), "ws", float(srams[i]),
                    float(bws[i]))["total_cycles"]
        np.testing.assert_allclose(got[i], want, rtol=1e-6)

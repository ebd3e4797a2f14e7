"""DRAM-level mapper: never worse than SCALE-Sim's order, monotone in SRAM, scalesim mode unchanged,
vmap over hardware and gradients in the relaxed mode."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from npujax import _relax
from npujax.errors import ConfigError
from npujax.hw import DATAFLOWS
from npujax.systolic import gemm_mapping, gemm_memory
from npujax.systolic.mapping import stacked_search

dims = st.integers(1, 4000)
arr = st.sampled_from([4, 8, 16, 32])
sram = st.sampled_from([512, 8192, 131072, 1 << 20])


def _map(M, K, N, R, C, df, s, mapping="best", uniq=None, bw=6.4):
    return jax.tree.map(np.asarray, gemm_mapping(
        M, K, N, R, C, df, sram_bytes_a=s, sram_bytes_b=s, sram_bytes_out=s,
        dram_bytes_per_cycle=bw, unique_elems_a=uniq, mapping=mapping))


@functools.cache
def _batched(df, mapping):
    """One compiled call over a batch of layers (traced shapes, SRAM and array sizes)."""
    def run(M, K, N, R, C, s, uniq):
        m = gemm_mapping(M, K, N, R, C, df, sram_bytes_a=s, sram_bytes_b=s, sram_bytes_out=s,
                         dram_bytes_per_cycle=6.4, unique_elems_a=uniq, mapping=mapping)
        return {k: m[k] for k in ("dram_bytes", "dram_read_bytes_b", "dram_write_bytes_out",
                                  "total_cycles", "compute_cycles", "extra_fill_drain_cycles",
                                  "chunks")}
    return jax.jit(run)


layer = st.tuples(dims, dims, dims, arr, arr, sram, st.sampled_from([1, 9]))


@given(layers=st.lists(layer, min_size=16, max_size=16), df=st.sampled_from(DATAFLOWS))
@settings(max_examples=4, deadline=None)
def test_best_never_moves_more_bytes_than_scalesim_and_more_sram_never_adds(layers, df):
    M, K, N, R, C, s, dedup = (np.asarray(v, np.int64) for v in zip(*layers))
    uniq = np.maximum(M * K // dedup, 1)

    def run(mapping, sram):
        with jax.enable_x64(True):
            out = _batched(df, mapping)(M, K, N, R, C, sram, uniq)
        return jax.tree.map(np.asarray, out)

    best, ref, bigger = run("best", s), run("scalesim", s), run("best", 4 * s)
    assert np.all(best["dram_bytes"] <= ref["dram_bytes"])
    # compulsory traffic, and the roofline with the extra fill/drain cycles counted
    assert np.all(best["dram_read_bytes_b"] >= K * N) and np.all(
        best["dram_write_bytes_out"] >= M * N)
    assert np.all(best["total_cycles"] * (1 + 1e-9) >= np.maximum(
        best["compute_cycles"] + best["extra_fill_drain_cycles"], best["dram_bytes"] / 6.4))
    t_extent = {"weight_stationary": M, "input_stationary": N}.get(df, np.ones_like(M))
    assert np.all((best["chunks"] >= 1) & (best["chunks"] <= t_extent))
    assert np.all(bigger["dram_bytes"] <= best["dram_bytes"])


def test_scalesim_mode_is_gemm_memory_bit_for_bit():
    kw = dict(sram_bytes_a=4096, sram_bytes_b=8192, sram_bytes_out=2048,
              dram_bytes_per_cycle=3.0, unique_elems_a=700)
    for df in DATAFLOWS:
        ref = gemm_memory(300, 576, 100, 16, 8, df, **kw)
        got = gemm_mapping(300, 576, 100, 16, 8, df, mapping="scalesim", **kw)
        for k, v in ref.items():
            assert np.array_equal(np.asarray(got[k]), np.asarray(v)), (df, k)
        assert float(got["extra_fill_drain_cycles"]) == 0.0 and float(got["chunks"]) == 1.0


def test_weight_stationary_chunks_pixels_instead_of_spilling_partial_sums():
    # ppocr_det's 3x3 conv (160x160 pixels, 96 -> 32 channels) on edge_16x16: SCALE-Sim's order
    # spills the int32 partial sums of a 25,600 x 16 output slice once per K fold (54 folds);
    # the mapper runs chunks of 682 pixels whose partial sums and im2col input fit 64 KiB.
    M, K, N = 25600, 864, 32
    ref = _map(M, K, N, 16, 16, "ws", 131072, "scalesim", uniq=M * 96)
    best = _map(M, K, N, 16, 16, "ws", 131072, uniq=M * 96)
    assert ref["dram_read_bytes_out"] == M * N * 53 * 4
    assert best["dram_read_bytes_out"] == 0 and best["dram_bytes"] == M * 96 + K * N + M * N
    chunk = 65536 // (K // 9)  # im2col rows per chunk that fit the active ifmap half
    assert best["chunks"] == -(-M // chunk)
    assert best["extra_fill_drain_cycles"] == (best["chunks"] - 1) * 54 * 2 * (2 * 16 + 16 - 2)


def test_output_stationary_swaps_the_fold_order_when_the_input_does_not_fit():
    # a[M,K] is needed whole across the N folds in SCALE-Sim's order; rows-outer needs a slice
    best = _map(4096, 512, 48, 16, 16, "os", 65536)
    ref = _map(4096, 512, 48, 16, 16, "os", 65536, "scalesim")
    assert ref["dram_read_bytes_a"] == 4096 * 512 * 3 and not bool(best["rows_inner"])
    assert best["dram_read_bytes_a"] == 4096 * 512 and best["chunks"] == 1
    assert best["dram_read_bytes_b"] == ref["dram_read_bytes_b"] == 512 * 48


def test_vmap_over_sram_sizes_and_relaxed_gradients():
    def total(s):
        return gemm_mapping(25600, 864, 32, 16, 16, "ws", sram_bytes_a=s, sram_bytes_b=s,
                            sram_bytes_out=s, dram_bytes_per_cycle=6.4,
                            unique_elems_a=25600 * 96)["total_cycles"]

    sizes = jnp.asarray([16384.0, 131072.0, 1048576.0])
    swept = np.asarray(jax.jit(jax.vmap(total))(sizes))
    assert float(swept[1]) == 2953626.777777778  # compute 2,769,768 + extra 183,816 + epilogue
    assert swept[0] >= swept[1] >= swept[2]
    with _relax.relaxed():
        relaxed, g = jax.jit(jax.value_and_grad(total))(131072.0)
    assert float(relaxed) == float(swept[1])  # same forward value
    assert np.isfinite(float(g)) and float(g) < 0.0  # more SRAM: longer chunks, fewer fills


def test_unknown_mapping_is_a_config_error():
    with pytest.raises(ConfigError, match="scalesim"):
        gemm_mapping(8, 8, 8, 4, 4, "ws", sram_bytes_a=1, sram_bytes_b=1, sram_bytes_out=1,
                     dram_bytes_per_cycle=1.0, mapping="fastest")


@pytest.mark.integration  # 6-23 s on a loaded 2-core machine: two search programs compiled
@pytest.mark.parametrize("df", DATAFLOWS)
def test_unrolled_search_equals_the_stacked_one_bit_for_bit(df):
    """The candidates evaluated one by one (what runs) give every figure of the stacked search
    (the implementation before, :func:`stacked_search`) bit for bit, vmapped over random GEMMs
    and hardware with the extents bounded (the one-rounding fold counts), and the same relaxed
    gradient."""
    rng = np.random.default_rng(7)
    n = 512
    M, K, N = (rng.integers(1, 30000, n) for _ in range(3))
    R, C = (rng.choice([1, 3, 8, 16, 33, 128], n) for _ in range(2))
    s = rng.choice([256, 4096, 65536, 1 << 20], (3, n)).astype(np.float64)
    uniq = M * K / rng.choice([1.0, 9.0], n)
    bw = rng.uniform(0.5, 64.0, n)

    def run(*args):
        m, k, nn, r, c, sa, sb, so, u, b = args
        return gemm_mapping(m, k, nn, r, c, df, sram_bytes_a=sa, sram_bytes_b=sb,
                            sram_bytes_out=so, elem_bytes_a=0.5, dram_bytes_per_cycle=b,
                            unique_elems_a=u, bound=30000)

    args = (M, K, N, R, C, *s, uniq, bw)
    with jax.enable_x64(True):
        new = jax.jit(jax.vmap(run))(*args)
        with stacked_search(), _relax.corrected_division():
            old = jax.jit(jax.vmap(run))(*args)
    assert set(new) == set(old)
    for k in old:
        np.testing.assert_array_equal(np.asarray(new[k]), np.asarray(old[k]), err_msg=k)
    chosen = {(float(c), bool(r)) for c, r in zip(new["chunks"], new["rows_inner"])}
    assert len(chosen) >= (2 if df == "output_stationary" else 4)  # many candidates win

    def total(sram):
        return gemm_mapping(25600, 864, 32, 16, 16, df, sram_bytes_a=sram, sram_bytes_b=sram,
                            sram_bytes_out=sram, dram_bytes_per_cycle=6.4,
                            unique_elems_a=25600 * 96)["total_cycles"]

    with _relax.relaxed():
        g_new = jax.jit(jax.grad(total))(131072.0)
        with stacked_search():
            g_old = jax.jit(jax.grad(total))(131072.0)
    assert float(g_new) == float(g_old)


@pytest.mark.parametrize("unique_a,bytes_a", [(0.0, 1.0), (1.0, 0.0), (0.0, 0.0)])
def test_relaxed_gradient_is_finite_for_an_operand_with_no_bytes(unique_a, bytes_a):
    """A weight-stationary candidate whose input buffer has no per-row need (a layer with no
    input elements, as vector rows give the mapping) divided by zero, and the straight-through
    floor of the infinite quotient (``inf - inf``) made the relaxed gradient NaN: every gradient
    of codesign's descent on tpu_v1 (256x256) was NaN, crashing its rounding."""
    from npujax.systolic.dataflow import get_dataflow

    def traffic(rows):
        with _relax.relaxed():
            m = gemm_mapping(jnp.float64(1.0), jnp.float64(1.0), jnp.float64(1.0), rows,
                             jnp.float64(256.0), get_dataflow("ws"),
                             sram_bytes_a=jnp.float64(2**20), sram_bytes_b=jnp.float64(2**20),
                             sram_bytes_out=jnp.float64(2**20), elem_bytes_a=jnp.float64(bytes_a),
                             elem_bytes_b=jnp.float64(1.0), elem_bytes_out=jnp.float64(1.0),
                             dram_bytes_per_cycle=jnp.float64(10.0),
                             unique_elems_a=jnp.float64(unique_a))
        return m["dram_read_bytes_a"] + m["dram_read_bytes_b"] + m["extra_fill_drain_cycles"]

    with jax.enable_x64(True):
        assert bool(jnp.isfinite(jax.grad(traffic)(jnp.float64(256.0))))

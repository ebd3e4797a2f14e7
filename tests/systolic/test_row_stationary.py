"""Row stationary (Eyeriss): hand-worked cycle counts, folding and replication, invariants,
the JSSC paper's AlexNet mapping numbers, and the dataflow in the one cost program."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from npujax import _relax
from npujax.errors import ConfigError
from npujax.hw import load_npu_spec
from npujax.plan import Workload, layer_costs
from npujax.systolic import emulate_gemm, get_dataflow, rs_conv
from npujax.systolic.row_stationary import rs_dram

EYERISS = dict(ifmap_spad=12, filter_spad=224, psum_spad=24)


def _int(g, *keys):
    return tuple(int(g[k]) for k in keys)


def test_hand_worked_one_pass_bound():
    # N=1, C=2, M=3, R=2, S=3, E=4, F=5 on a 4x4 array, spads ifmap 6, filter 12, psum 2:
    # R'=2, bands=floor(4/2)=2, strips=ceil(4/4)=1, q=min(2, floor(6/3))=2,
    # p=min(3, 2, floor(12/(2*3)))=2 -> filter groups ceil(3/2)=2, channel groups 1.
    # job = F*M*(C*S + cgroups) + mgroups*cgroups*(R'-1) = 5*3*(2*3+1) + 2*1*1 = 107
    # one pass (p=2 filters, q=2 channels) = p*F*(q*S+1) + (R'-1) = 2*5*7 + 1 = 71
    # cycles = max(ceil(1*107 / 2 bands), 71) = 71 (the two filter groups run on two bands).
    g = rs_conv(1, 2, 3, 2, 3, 4, 5, 4, 4, ifmap_spad=6, filter_spad=12, psum_spad=2)
    assert _int(g, "bands", "strips", "q", "p") == (2, 1, 2, 2)
    assert int(g["compute_cycles"]) == 71
    # every PE works: 2 replicas of the 2 x 4 set fill the 4 x 4 array
    assert int(g["active_pes"]) == 16 and float(g["mapping_efficiency"]) == 1.0
    # 720 MACs = 1*3*2*2*3*4*5 in 71 cycles on 16 PEs
    assert float(g["utilization"]) == pytest.approx(720 / (71 * 16))
    # two images: 2 jobs x 107 = 214 cycles of band work over 2 bands = 107
    g2 = rs_conv(2, 2, 3, 2, 3, 4, 5, 4, 4, ifmap_spad=6, filter_spad=12, psum_spad=2)
    assert int(g2["compute_cycles"]) == 107
    # accumulation + hops: jobs*(F*M*cgroups + mgroups*cgroups*(R'-1)) = 2*(15 + 2) = 34 / 2
    assert int(g2["fill_drain_cycles"]) == 17


def test_folding_and_replication():
    # E = 10 > cols = 4: the 3 x 10 set folds into ceil(10/4) = 3 strips; rows = 4 hold one
    # band of R' = 3 rows: 3 strips x 1 band, active PEs 3 x 4 = 12.
    g = rs_conv(1, 1, 1, 3, 3, 10, 10, 4, 4, **EYERISS)
    assert _int(g, "bands", "strips", "row_folds", "active_pes") == (1, 3, 1, 12)
    # MACs: F*M*C*S = 30 per strip-job, 3 jobs + 1 pass of accumulation (F=10) each and
    # 2 hops: 3 * (10*1*(1*3+1) + 1*1*2) = 3 * 42 = 126 cycles
    assert int(g["compute_cycles"]) == 126
    # R = 5 > rows = 4: two row folds of R' = 4 (psums added in the buffer), bands = 1, and
    # the 4 x 2 set sits twice side by side in the 4 columns (2 slots)
    g = rs_conv(1, 1, 1, 5, 1, 2, 2, 4, 4, **EYERISS)
    assert _int(g, "row_folds", "bands", "active_pes") == (2, 1, 16)
    # 2 jobs x (F*M*(C*S+1) + 3 hops) = 2 * (2*2 + 3) = 14 cycles of work on 2 slots = 7
    assert int(g["compute_cycles"]) == 7
    # replication: a 3 x 13 set on 12 x 14 -> 4 replicas (AlexNet CONV3)
    g = rs_conv(1, 256, 384, 3, 3, 13, 13, 12, 14, **EYERISS)
    assert _int(g, "bands", "strips", "active_pes") == (4, 1, 156)
    # a filter row longer than the ifmap scratchpad is split into pieces of S' = 12:
    # ceil(30/12) = 3 jobs of 1*1*(1*12 + 1) = 13 cycles, on 3 of the 12 bands at once
    g = rs_conv(1, 1, 1, 1, 30, 1, 1, 12, 14, **EYERISS)
    assert int(g["compute_cycles"]) == 13


def test_invariants_random_layers():
    rng = np.random.default_rng(0)
    shape = (64,)
    n, C, M = (rng.integers(1, 9, shape), rng.integers(1, 70, shape), rng.integers(1, 70, shape))
    R, S = rng.integers(1, 14, shape), rng.integers(1, 14, shape)
    E, F = rng.integers(1, 60, shape), rng.integers(1, 60, shape)
    rows, cols = rng.integers(1, 16, shape), rng.integers(1, 16, shape)
    g = rs_conv(n, C, M, R, S, E, F, rows, cols, **EYERISS, stride=2)
    util = np.asarray(g["utilization"])
    assert np.all(util > 0) and np.all(util <= 1.0 + 1e-12)
    assert np.all(np.asarray(g["mapping_efficiency"]) <= 1.0)
    assert np.all(np.asarray(g["fill_drain_cycles"]) < np.asarray(g["compute_cycles"]))
    # MACs conserved: utilization x cycles x PEs is the layer's MACs exactly
    macs = n * M * C * R * S * E * F
    np.testing.assert_allclose(util * np.asarray(g["compute_cycles"]) * rows * cols, macs,
                               rtol=1e-12)
    # the scratchpads see 4 accesses per (padded) MAC; without padding exactly 4 x MACs
    fit = (R <= rows) & (S <= 12)
    np.testing.assert_allclose(np.asarray(g["spad_accesses"])[fit], 4.0 * macs[fit])
    # more columns never add cycles
    g1 = rs_conv(n, C, M, R, S, E, F, rows, cols + 1, **EYERISS, stride=2)
    assert np.all(np.asarray(g1["compute_cycles"]) <= np.asarray(g["compute_cycles"]))


#: AlexNet (two-group CONV2/4/5) at batch 4: (N, C per group, M per group, R=S, E=F, U, groups)
ALEXNET = {"CONV1": (4, 3, 96, 11, 55, 4, 1), "CONV2": (4, 48, 128, 5, 27, 1, 2),
           "CONV3": (4, 256, 384, 3, 13, 1, 1), "CONV4": (4, 192, 192, 3, 13, 1, 2),
           "CONV5": (4, 192, 128, 3, 13, 1, 2)}


def test_alexnet_mapping_matches_the_paper():
    # Chen et al., JSSC 2017: active PEs 154 (CONV1, 11 x 55 folded into strips), 135 (CONV2,
    # one 5 x 27 set over two bands), 156 (CONV3-5, 3 x 13 sets replicated 4x); the PE
    # interleaves q = 1, 2, 4 channels in CONV1-3 (its ifmap scratchpad of 12 holds q x S).
    # MACs 422, 896, 598, 449, 299 million.
    act, qs, macs = [], [], []
    for n, c, m, k, e, u, grp in ALEXNET.values():
        g = rs_conv(n, c, m, k, k, e, e, 12, 14, **EYERISS, stride=u)
        act.append(int(g["active_pes"]))
        qs.append(int(g["q"]))
        macs.append(round(grp * n * m * c * k * k * e * e / 1e6))
    assert act == [154, 135, 156, 156, 156]
    assert qs[:3] == [1, 2, 4]
    assert macs == [422, 896, 598, 449, 299]


def test_dram_order_hand_worked():
    # one strip (E = 13 <= 14 cols), psum block per image 13*13*2 = 338 B, capacity 3380 B:
    # n_b = 1 -> m = 10 (filters read 1 strip x 2 images = 2x, ifmap 1 x ceil(20/10) = 2x);
    # n_b = 2 -> m = 5 (filters once, ifmap ceil(20/5) = 4x).
    # weights 1000 B, ifmap 100 B: n_b=1 -> 2000 + 200 = 2200; n_b=2 -> 1000 + 400 = 1400.
    d = rs_dram(2, 8, 20, 3, 13, 13, 14, stride=1, ifmap_bytes=100.0, weight_bytes=1000.0,
                ofmap_bytes=50.0, psum_elem_bytes=2.0, psum_capacity_bytes=3380.0,
                ifmap_capacity_bytes=1.0, filter_capacity_bytes=1.0)
    assert float(d["image_block"]) == 2 and float(d["filter_block"]) == 5
    assert float(d["dram_read_bytes_filter"]) == 1000 and float(d["dram_read_bytes_ifmap"]) == 400
    assert float(d["dram_write_bytes_ofmap"]) == 50


def test_emulator_refuses_row_stationary():
    with pytest.raises(ConfigError, match="rs_conv"):
        emulate_gemm(np.ones((2, 2), np.int8), np.ones((2, 2), np.int8), 2, 2,
                     "row_stationary")


@pytest.fixture(scope="module")
def eyeriss_layers():
    conv = Workload(name="conv", op="Conv", kind="gemm", M=2 * 13 * 13, K=16 * 9, N=32,
                    macs=2 * 13 * 13 * 16 * 9 * 32, weight_elems=16 * 9 * 32,
                    in_elems=2 * 16 * 15 * 15, out_elems=2 * 32 * 13 * 13, out_rows=2 * 13,
                    window_rows=3, window_cols=3, out_cols=13, images=2)
    fc = Workload(name="fc", op="Gemm", kind="gemm", M=2, K=512, N=64, macs=2 * 512 * 64,
                  weight_elems=512 * 64, in_elems=2 * 512, out_elems=2 * 64, producer=0)
    return [conv, fc], load_npu_spec("eyeriss")


def test_cost_program_uses_rs(eyeriss_layers):
    layers, spec = eyeriss_layers
    wb = jnp.full((2,), 16.0)
    c = layer_costs(layers, spec, wb, wb)
    conv = rs_conv(2, 16, 32, 3, 3, 13, 13, 12, 14, **EYERISS)
    assert int(c.compute_cycles[0]) == int(conv["compute_cycles"])
    # FC as a 1 x 1 convolution with E = F = 1 over K = 512 channels for M = 2 images:
    # q = 12, p = min(64, 24, floor(224/12) = 18) = 18 -> job = 1*64*(512 + 43) = 35,520;
    # the 1 x 1 set on all 12 x 14 = 168 slots: ceil(71,040 / 168) = 423 cycles,
    # utilization 65,536 / (423 * 168) = 0.92
    fc = rs_conv(2, 512, 64, 1, 1, 1, 1, 12, 14, **EYERISS)
    assert int(c.compute_cycles[1]) == int(fc["compute_cycles"]) == 423
    assert float(c.utilization[1]) == pytest.approx(65536 / (423 * 168), rel=1e-6)
    # the FC layer streams its 64 KiB of weights once at 720 MB/s: memory bound
    assert float(c.memory_cycles[1]) > float(c.compute_cycles[1])
    assert get_dataflow(spec.array.dataflow).name == "row_stationary"


def test_relaxed_rs_same_values_useful_gradient():
    # relaxed: the same counts (whole numbers) and a gradient w.r.t. the array's size
    args = (4, 48, 128, 5, 5, 27, 27)

    def cycles(rows, cols):
        with _relax.relaxed():
            return rs_conv(*args, rows, cols, **EYERISS)["compute_cycles"]

    exact = int(rs_conv(*args, 12, 14, **EYERISS)["compute_cycles"])
    assert float(cycles(12.0, 14.0)) == exact
    d_rows, d_cols = jax.grad(cycles, argnums=(0, 1))(12.0, 14.0)
    # one more row gives no third band of 5 rows (0); fewer columns would add strips
    assert np.isfinite(float(d_rows)) and np.isfinite(float(d_cols)) and float(d_cols) <= 0

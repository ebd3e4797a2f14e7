"""Exact counts (issue #11, class 3): cycle, byte and MAC counts beyond 2**31 are exact on the
default (x64-disabled) JAX config, under jit, vmap and grad; beyond 2**53 a layer is refused."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from npujax.errors import LimitError
from npujax.frontends.onnx import from_onnx
from npujax.hw import stack_specs
from npujax.plan import layer_costs, lower, workloads
from npujax.systolic import DATAFLOWS, gemm_cycles, get_dataflow
from tests import hostile_inputs as hi


def _cycles(M, K, N, R, C, dataflow):
    """The fold model in Python integers (unbounded)."""
    df = get_dataflow(dataflow)
    s_r, s_c, t = df.map_gemm(M, K, N)
    fill = 0 if dataflow == "output_stationary" else R
    return math.ceil(s_r / R) * math.ceil(s_c / C) * (fill + t + R + C - 2)


@pytest.fixture(scope="module")
def big_conv():
    graph, _ = from_onnx(hi.conv(1, 4096))
    return graph


def test_issue_example_4096x4096_conv_is_exact_and_compute_bound(big_conv, edge_spec):
    """Was -1,753,219,072 compute cycles and 0.84 s; now 2,541,748,224 cycles, 2.54 s."""
    s = lower(big_conv, edge_spec)
    conv = next(r for r in s.layers if r.op == "Conv")
    assert conv.macs == 4096 * 4096 * 576 * 64
    want = _cycles(4096 * 4096, 576, 64, 16, 16, s.dataflow)
    assert conv.costs.compute_cycles == want == 2_541_748_224
    assert conv.bound == "compute" and conv.latency_s == pytest.approx(2.5417, rel=1e-3)
    assert conv.latency_s >= conv.macs / edge_spec.peak_macs_per_s
    assert 0 < conv.costs.utilization <= 1


def test_one_pe_array_counts_every_mac(edge_spec):
    one = edge_spec.with_fields({"array.rows": 1, "array.cols": 1})
    graph, _ = from_onnx(hi.conv(1, 1024))
    conv = next(r for r in lower(graph, one).layers if r.op == "Conv")
    assert conv.costs.compute_cycles == _cycles(1024 * 1024, 576, 64, 1, 1, "output_stationary")
    assert conv.costs.compute_cycles >= conv.macs > 2**35


def test_batch_beyond_int32_is_exact(edge_spec):
    m = hi.conv(1, 8, c_in=4, c_out=4)
    m.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "N"
    graph, _ = from_onnx(m, batch=2**31)
    conv = next(r for r in lower(graph, edge_spec).layers if r.op == "Conv")
    assert conv.M == 2**31 * 64 and conv.macs == 2**31 * 64 * 36 * 4
    # (K and N as mapped: channels padded to the preset's alignment)
    want = _cycles(conv.M, conv.K, conv.N, 16, 16, "output_stationary")
    assert conv.costs.compute_cycles == want > 2**40


def test_layer_beyond_2_53_macs_is_refused(edge_spec):
    graph, _ = from_onnx(hi.conv(2**20, 1024, c_in=64, c_out=64))
    with pytest.raises(LimitError, match="Conv.*2\\*\\*53"):
        workloads(graph, edge_spec)


def test_exact_under_jit_vmap_and_grad_on_the_default_config(big_conv, edge_spec):
    assert not jax.config.jax_enable_x64
    layers = workloads(big_conv, edge_spec)
    n = len(layers)
    conv = [w.op for w in layers].index("Conv")
    specs = stack_specs([edge_spec.with_fields({"array.rows": r, "array.cols": r})
                         for r in (4, 16, 64)])
    costs = jax.jit(jax.vmap(lambda s: layer_costs(layers, s, jnp.full(n, 8.0),
                                                   jnp.full(n, 8.0))))(specs)
    got = np.asarray(costs.compute_cycles)[:, conv]
    want = [_cycles(4096 * 4096, 576, 64, r, r, edge_spec.array.dataflow) for r in (4, 16, 64)]
    assert got.tolist() == want and max(want) > 2**33
    assert costs.compute_cycles.dtype == np.int64 and costs.latency_cycles.dtype == jnp.float32

    def total(wbits):
        return jnp.sum(layer_costs(layers, edge_spec, wbits, jnp.full(n, 8.0)).latency_cycles)

    g = jax.jit(jax.grad(total))(jnp.full(n, 8.0))
    assert g.dtype == jnp.float32 and np.all(np.isfinite(np.asarray(g)))


@given(M=st.integers(1, 2**40), K=st.integers(1, 2**20), N=st.integers(1, 2**20),
       R=st.integers(1, 256), C=st.integers(1, 256), df=st.sampled_from(DATAFLOWS))
@settings(max_examples=40, deadline=None)
def test_gemm_cycles_match_python_integers(M, K, N, R, C, df):
    want = _cycles(M, K, N, R, C, df)
    if want >= 2**62:
        return
    assert int(gemm_cycles(M, K, N, R, C, df)["compute_cycles"]) == want

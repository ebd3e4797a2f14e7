import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from hypothesis import given, settings
from hypothesis import strategies as st

from npujax.demo.model import DigitsCNN
from npujax.errors import ConfigError
from npujax.graph import optimize, trace_flax
from npujax.hw import DATAFLOWS
from npujax.plan import layer_costs, lower, workloads


@pytest.fixture(scope="module")
def graph():
    with jax.numpy_dtype_promotion("standard"):  # flax's avg_pool is not strict-promotion clean
        g, p = trace_flax(DigitsCNN(rngs=nnx.Rngs(0)), jnp.zeros((1, 8, 8, 1), jnp.float32))
    return optimize(g, p)[0]


def test_gemm_shapes_after_im2col(graph):
    w = {x.name: x for x in workloads(graph)}
    assert (w["conv1"].M, w["conv1"].K, w["conv1"].N) == (64, 9, 16)
    assert (w["conv2"].M, w["conv2"].K, w["conv2"].N) == (64, 144, 32)
    assert (w["fc1"].M, w["fc1"].K, w["fc1"].N) == (1, 512, 128)
    assert w["conv2"].macs == 64 * 144 * 32
    assert w["avgpool_0"].kind == "vector" and "reshape_0" not in w


@pytest.mark.parametrize("df", DATAFLOWS)
def test_roofline_lower_bound_and_sum(graph, edge_spec, df):
    s = lower(graph, edge_spec, dataflow=df)
    bw = edge_spec.memory.dram_bytes_per_s
    for r in s.layers:
        roof = max(r.macs / edge_spec.peak_macs_per_s, r.dram_bytes / bw)
        assert r.latency_s >= roof * (1 - 1e-6)
        assert r.latency_cycles == max(r.compute_cycles, r.memory_cycles)
        assert r.bound == ("compute" if r.compute_cycles >= r.memory_cycles else "memory")
    assert s.latency_s == pytest.approx(sum(r.latency_s for r in s.layers), rel=1e-12)
    assert s.latency_s >= s.macs / edge_spec.peak_macs_per_s


@given(bits=st.lists(st.sampled_from([2, 3, 4, 5, 6, 8]), min_size=4, max_size=4),
       layer=st.integers(0, 3))
@settings(max_examples=25, deadline=None)
def test_latency_non_increasing_as_weight_bits_drop(graph, edge_spec, bits, layer):
    names = [n.name for n in graph.gemm_nodes]
    policy = dict(zip(names, bits))
    base = lower(graph, edge_spec, weight_bits=policy)
    if policy[names[layer]] > 2:
        lower_bits = {**policy, names[layer]: policy[names[layer]] - 1}
        fewer = lower(graph, edge_spec, weight_bits=lower_bits)
        assert fewer.latency_s <= base.latency_s
        for a, b in zip(fewer.layers, base.layers):
            assert a.latency_s <= b.latency_s and a.dram_bytes <= b.dram_bytes


def test_memory_bound_layer_gets_faster_with_fewer_bits(graph, edge_spec):
    s8 = {r.name: r for r in lower(graph, edge_spec).layers}
    s4 = {r.name: r for r in lower(graph, edge_spec, weight_bits={"fc1": 4}).layers}
    assert s8["fc1"].bound == "memory"
    assert s4["fc1"].latency_s < s8["fc1"].latency_s
    assert s4["conv2"].latency_s == s8["conv2"].latency_s


def test_wide_operands_take_multiple_passes(graph, edge_spec):
    s8 = {r.name: r for r in lower(graph, edge_spec).layers}
    s16 = {r.name: r for r in lower(graph, edge_spec, weight_bits=16, act_bits=16).layers}
    assert s16["conv2"].compute_cycles == 4 * s8["conv2"].compute_cycles


def test_layer_costs_grad_and_vmap(graph, edge_spec):
    layers = workloads(graph)
    n = len(layers)

    def total(wbits):
        return jnp.sum(layer_costs(layers, edge_spec, wbits, jnp.full(n, 8.0))["latency_cycles"])

    g = jax.grad(total)(jnp.full(n, 8.0))
    assert np.all(np.isfinite(np.asarray(g))) and float(g[3]) > 0  # fc1 is memory-bound
    batch = jax.vmap(total)(jnp.stack([jnp.full(n, b) for b in (2.0, 4.0, 8.0)]))
    assert np.all(np.diff(np.asarray(batch)) >= 0)


def test_unknown_layer_in_bits(graph, edge_spec):
    with pytest.raises(ConfigError, match="unknown layers"):
        lower(graph, edge_spec, weight_bits={"nope": 4})

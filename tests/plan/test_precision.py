"""Hardware where bit widths change speed, and the cost of precision conversions."""

import jax
import jax.numpy as jnp
import pytest
from flax import nnx

from npujax.frontends.flax import trace_flax
from npujax.hw import load_npu_spec
from npujax.ir.passes import optimize
from npujax.models.cnn import DigitsCNN
from npujax.ops import gemm_nodes
from npujax.plan import lower
from npujax.quantize import quant_spec


def _trace(model, shape):
    with jax.numpy_dtype_promotion("standard"):
        g, p = trace_flax(model, jnp.zeros(shape, jnp.float32))
    return optimize(g, p)[0]


@pytest.fixture(scope="module")
def graph():
    return _trace(DigitsCNN(rngs=nnx.Rngs(0)), (1, 8, 8, 1))


def _q(graph, w=8, a=8):
    """The quant spec of widths ``w``/``a``: numbers, or ``{layer: bits}`` with the rest at 8."""
    names = [n.name for n in gemm_nodes(graph)]

    def full(v):
        return {n: v.get(n, 8) for n in names} if isinstance(v, dict) else v

    return quant_spec(graph, full(w), full(a))


def _stream(r):
    return r.costs.compute_cycles - r.costs.fill_drain_cycles


@pytest.mark.parametrize("w,a,factor", [(8, 8, 1), (4, 8, 2), (2, 8, 4), (4, 4, 4), (2, 2, 16),
                                        (3, 8, 2)])
def test_bit_composable_streaming_speedup(graph, w, a, factor):
    spec = load_npu_spec("bitfusion_16x16")
    base = {r.name: r for r in lower(graph, spec).layers}
    low = {r.name: r for r in lower(graph, spec, _q(graph, w, a)).layers}
    r8, rl = base["conv2"], low["conv2"]
    assert _stream(rl) == -(-_stream(r8) // factor)  # Bit Fusion: 16 bricks fuse per MAC
    assert rl.costs.fill_drain_cycles == r8.costs.fill_drain_cycles


@pytest.mark.parametrize("w,a", [(8, 8), (4, 8), (4, 4), (2, 2), (2, 8)])
def test_bit_serial_streaming_scales_with_bit_product(graph, w, a):
    spec = load_npu_spec("bitserial_16x16")
    r8 = {r.name: r for r in lower(graph, spec).layers}["conv2"]
    rl = {r.name: r for r in lower(graph, spec, _q(graph, w, a)).layers}["conv2"]
    assert _stream(rl) == -(-(_stream(r8) * w * a) // 64)


def test_fixed_array_gains_only_bandwidth(graph):
    spec = load_npu_spec("edge_16x16")
    r8 = {r.name: r for r in lower(graph, spec).layers}
    r2 = {r.name: r for r in lower(graph, spec, _q(graph, 2, 2)).layers}
    assert all(r2[n].costs.compute_cycles == r8[n].costs.compute_cycles for n in r8)
    assert r2["fc1"].latency_s < r8["fc1"].latency_s  # memory-bound: fewer bytes


def test_bit_flexible_hardware_rewards_low_precision_more(graph):
    ratios = {}
    for preset in ("edge_16x16", "bitfusion_16x16", "bitserial_16x16"):
        spec = load_npu_spec(preset)
        ratios[preset] = (lower(graph, spec).latency_s
                          / lower(graph, spec, _q(graph, 4, 4)).latency_s)
    assert ratios["bitserial_16x16"] > ratios["edge_16x16"]
    assert ratios["bitfusion_16x16"] > 1.0


def test_chains_never_convert(graph):
    spec = load_npu_spec("edge_16x16")
    for bits in ({"conv2": 4}, {"fc1": 4, "conv1": 2}, 4):
        rows = lower(graph, spec, _q(graph, a=bits)).layers
        assert all(r.costs.convert_cycles == 0 for r in rows)


class FanOut(nnx.Module):
    def __init__(self, rngs):
        self.c1 = nnx.Conv(16, 16, (3, 3), padding="SAME", rngs=rngs)
        self.c2 = nnx.Conv(16, 16, (3, 3), padding="SAME", rngs=rngs)

    def __call__(self, x):
        y = self.c1(x)
        return y + self.c2(y)


def test_tensor_read_at_two_widths_pays_a_conversion():
    g = _trace(FanOut(nnx.Rngs(0)), (1, 16, 16, 16))
    spec = load_npu_spec("edge_16x16")
    add = [n.name for n in g.nodes if n.op == "Add"][0]
    same = {r.name: r for r in lower(g, spec, _q(g, a={"c2": 8})).layers}
    mixed = {r.name: r for r in lower(g, spec, _q(g, a={"c2": 4})).layers}  # the add at c1's 8
    assert same[add].costs.convert_cycles == 0
    # c1 writes 4-bit for c2 (its first consumer); the 8-bit add re-reads and converts it
    assert mixed[add].costs.convert_cycles >= 16 * 16 * 16 / spec.vector.lanes
    assert mixed["c2"].costs.convert_cycles == 0
    r = mixed[add]
    assert sum(r.breakdown().values()) == pytest.approx(r.costs.latency_cycles, rel=1e-6)

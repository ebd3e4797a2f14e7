import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from hypothesis import given, settings
from hypothesis import strategies as st

from npujax.errors import ConfigError
from npujax.frontends.flax import trace_flax
from npujax.hw import DATAFLOWS, load_npu_spec, stack_specs
from npujax.ir.passes import optimize
from npujax.models.cnn import DigitsCNN
from npujax.numerics import IntFormat
from npujax.ops import gemm_nodes
from npujax.plan import BREAKDOWN, layer_costs, lower, workloads
from npujax.quantize import LayerQuant, quant_spec


def _trace(model, shape):
    with jax.numpy_dtype_promotion("standard"):  # flax's avg_pool is not strict-promotion clean
        g, p = trace_flax(model, jnp.zeros(shape, jnp.float32))
    return optimize(g, p)[0]


@pytest.fixture(scope="module")
def graph():
    return _trace(DigitsCNN(rngs=nnx.Rngs(0)), (1, 8, 8, 1))


def _with(spec, section, **changes):
    return dataclasses.replace(spec, **{section: dataclasses.replace(getattr(spec, section),
                                                                      **changes)})


def test_gemm_shapes_after_im2col(graph, edge_spec):
    w = {x.name: x for x in workloads(graph)}  # no alignment without a spec
    assert (w["conv1"].M, w["conv1"].K, w["conv1"].N) == (64, 9, 16)
    assert (w["conv2"].M, w["conv2"].K, w["conv2"].N) == (64, 144, 32)
    assert (w["fc1"].M, w["fc1"].K, w["fc1"].N) == (1, 512, 128)
    assert w["conv2"].macs == 64 * 144 * 32
    assert w["avgpool_0"].kind == "vector" and "reshape_0" not in w
    # on the edge NPU the single input channel is padded to the 16-channel alignment
    a = {x.name: x for x in workloads(graph, edge_spec)}
    assert (a["conv1"].K, a["conv1"].macs) == (16 * 9, 64 * 9 * 16)


@pytest.mark.parametrize("df", DATAFLOWS)
@pytest.mark.parametrize("preset", ["edge_16x16", "tpu_v1", "gemmini_16x16"])
def test_roofline_breakdown_and_sum(graph, df, preset):
    spec = load_npu_spec(preset)
    s = lower(graph, spec, dataflow=df)
    bw = spec.memory.dram_bytes_per_s
    for r in s.layers:
        b = r.breakdown()
        assert set(b) == set(BREAKDOWN)
        assert sum(b.values()) == pytest.approx(r.costs.latency_cycles, rel=1e-6)
        assert min(b.values()) >= 0
        roof = max(r.macs / spec.peak_macs_per_s, r.costs.dram_bytes / bw)
        assert r.latency_s >= roof * (1 - 1e-6)
        if r.device == "npu":
            # the first/last tiles (dma beyond the access latency) never overlap compute; a
            # layer whose activations all stay on chip (tpu_v1 fuses layers) has no DMA at all
            lat = spec.memory.dram_latency_s * spec.array.clock_hz
            c = r.costs
            assert c.latency_cycles == pytest.approx(
                max(c.compute_cycles + c.dma_cycles, c.memory_cycles + lat)
                if c.dram_bytes > 0 else c.compute_cycles + c.convert_cycles, rel=1e-5)
            assert r.bound == ("compute" if c.compute_cycles >= c.memory_cycles else "memory")
        else:
            assert r.bound == "fallback" and r.costs.fallback_cycles > 0
    assert s.latency_s == pytest.approx(sum(r.latency_s for r in s.layers), rel=1e-12)
    assert sum(s.breakdown_s().values()) == pytest.approx(s.latency_s, rel=1e-6)
    assert s.latency_s >= s.macs / spec.peak_macs_per_s
    assert s.throughput_per_s == pytest.approx(1 / s.latency_s)


@given(bits=st.lists(st.sampled_from([2, 3, 4, 5, 6, 8]), min_size=4, max_size=4),
       layer=st.integers(0, 3))
@settings(max_examples=20, deadline=None)
def test_latency_non_increasing_as_weight_bits_drop(graph, edge_spec, bits, layer):
    names = [n.name for n in gemm_nodes(graph)]
    policy = dict(zip(names, bits))
    base = lower(graph, edge_spec, quant_spec(graph, policy, 8))
    if policy[names[layer]] > 2:
        lower_bits = {**policy, names[layer]: policy[names[layer]] - 1}
        fewer = lower(graph, edge_spec, quant_spec(graph, lower_bits, 8))
        assert fewer.latency_s <= base.latency_s
        for a, b in zip(fewer.layers, base.layers):
            assert a.latency_s <= b.latency_s and a.costs.dram_bytes <= b.costs.dram_bytes


def test_memory_bound_layer_gets_faster_with_fewer_bits(graph, edge_spec):
    s8 = {r.name: r for r in lower(graph, edge_spec).layers}
    w4 = {n.name: 4 if n.name == "fc1" else 8 for n in gemm_nodes(graph)}
    s4 = {r.name: r for r in lower(graph, edge_spec, quant_spec(graph, w4, 8)).layers}
    assert s8["fc1"].bound == "memory"
    assert s4["fc1"].latency_s < s8["fc1"].latency_s
    assert s4["conv2"].latency_s == s8["conv2"].latency_s


def test_wide_operands_take_multiple_passes(graph, edge_spec):
    s8 = {r.name: r for r in lower(graph, edge_spec).layers}
    s16 = {r.name: r for r in lower(graph, edge_spec, quant_spec(graph, 16, 16)).layers}
    assert s16["conv2"].costs.compute_cycles == 4 * s8["conv2"].costs.compute_cycles


@pytest.mark.parametrize("factor", [1.5, 2.0, 10.0])
def test_non_increasing_in_bandwidth_and_host_speed(graph, edge_spec, factor):
    base = lower(graph, edge_spec).latency_s
    faster = _with(edge_spec, "memory",
                   dram_bytes_per_s=edge_spec.memory.dram_bytes_per_s * factor)
    assert lower(graph, faster).latency_s <= base
    g = load_npu_spec("gemmini_16x16")
    cpu = _with(g, "host", cpu_ops_per_s=g.host.cpu_ops_per_s * factor)
    assert lower(graph, cpu).latency_s <= lower(graph, g).latency_s


def test_unsupported_op_falls_back_with_transfer(graph, edge_spec):
    on_npu = {r.name: r for r in lower(graph, edge_spec).layers}
    no_pool = _with(edge_spec, "ops", supported=tuple(
        o for o in edge_spec.ops.supported if o != "AveragePool"))
    rows = {r.name: r for r in lower(graph, no_pool).layers}
    pool = rows["avgpool_0"]
    assert pool.device == "cpu" and pool.bound == "fallback" and "AveragePool" in pool.reason
    h = edge_spec.host
    min_transfer = 2 * h.link_latency_s  # to the host and back
    assert pool.costs.transfer_cycles / edge_spec.array.clock_hz >= min_transfer
    assert pool.latency_s >= on_npu["avgpool_0"].latency_s + min_transfer * 0.99


def test_kernel_constraint_forces_fallback(graph, edge_spec):
    small = _with(edge_spec, "ops", conv_max_kernel=1)
    rows = {r.name: r for r in lower(graph, small).layers}
    assert rows["conv2"].device == "cpu" and "kernel" in rows["conv2"].reason


def test_unfused_activation_costs_a_pass(graph, edge_spec):
    no_fuse = _with(edge_spec, "ops", fused_activations=())
    fused = lower(graph, edge_spec)
    unfused = lower(graph, no_fuse)
    names = [r.name for r in unfused.layers]
    assert "conv1/Relu" in names and "fc1/Relu" in names
    assert unfused.latency_s > fused.latency_s


class Wide(nnx.Module):
    def __init__(self, c, rngs):
        self.conv = nnx.Conv(16, c, (3, 3), padding="SAME", rngs=rngs)
        self.conv2 = nnx.Conv(c, 16, (1, 1), rngs=rngs)

    def __call__(self, x):
        return self.conv2(nnx.relu(self.conv(x)))


def test_channel_alignment_staircase(edge_spec):
    lat = {c: lower(_trace(Wide(c, nnx.Rngs(0)), (1, 16, 16, 16)), edge_spec).latency_s
           for c in (48, 63, 64, 65)}
    assert lat[63] == pytest.approx(lat[64], rel=1e-9)  # padded to the same 64 channels
    assert lat[65] > lat[64] * 1.05  # one more channel costs a whole 16-channel block
    assert lat[48] < lat[64]


def test_layout_transform_when_npu_layout_differs(graph, edge_spec):
    nchw = _with(edge_spec, "layout", activation_layout="NCHW")
    rows = lower(graph, nchw).layers
    layout_rows = [r for r in rows if r.kind == "layout"]
    assert len(layout_rows) == 1 and layout_rows[0].op == "ToNCHW"  # the 4-D input only
    assert lower(graph, nchw).latency_s > lower(graph, edge_spec).latency_s


@pytest.mark.parametrize("cores", [2, 4])
def test_multicore_speedup_bounded_by_core_count(cores):
    spec = load_npu_spec("tpu_v1")
    g = _trace(Wide(256, nnx.Rngs(0)), (4, 32, 32, 16))
    one = lower(g, spec).latency_s
    many = lower(g, _with(spec, "array", cores=cores)).latency_s
    assert many <= one
    assert one / many <= cores + 1e-9


def test_layer_costs_grad_and_vmap_over_hardware(graph, edge_spec):
    layers = workloads(graph, edge_spec)
    n = len(layers)

    def total(wbits, spec=edge_spec):
        c = layer_costs(layers, spec, wbits, jnp.full(n, 8.0), "output_stationary")
        return jnp.sum(c.latency_cycles)

    g = jax.jit(jax.grad(total))(jnp.full(n, 8.0))  # jitted: eagerly, ~200 op compilations
    fc1 = [w.name for w in layers].index("fc1")
    assert np.all(np.isfinite(np.asarray(g))) and float(g[fc1]) > 0  # fc1 is memory-bound
    batch = jax.jit(jax.vmap(total))(jnp.stack([jnp.full(n, b) for b in (2.0, 4.0, 8.0)]))
    assert np.all(np.diff(np.asarray(batch)) >= 0)
    # 64 hardware configurations (bandwidth x array size) in one jitted vmapped call over the
    # spec itself (a pytree: no mirror class)
    bws = np.repeat(np.geomspace(1e9, 1e11, 16).astype(np.float32), 4)
    sizes = np.tile(np.asarray([8, 16, 32, 64]), 16)
    specs = [edge_spec.with_fields({"memory.dram_bytes_per_s": float(b), "array.rows": int(s),
                                    "array.cols": int(s)}) for b, s in zip(bws, sizes)]
    out = jax.jit(jax.vmap(lambda s: total(jnp.full(n, 8.0), s)))(stack_specs(specs))
    assert out.shape == (64,)
    for i in (0, 21, 63):
        assert float(out[i]) == pytest.approx(lower(graph, specs[i]).latency_cycles, rel=1e-5)


def test_unknown_layer_in_quant_spec(graph, edge_spec):
    with pytest.raises(ConfigError, match="unknown layers"):
        lower(graph, edge_spec, {"nope": LayerQuant(weight=IntFormat(4))})
    with pytest.raises(ConfigError, match="without weights"):
        lower(graph, edge_spec, {"avgpool_0": LayerQuant(weight=IntFormat(4))})


def test_peak_activation_bytes(graph, edge_spec):
    from npujax.plan import peak_activation_bytes

    # conv1 output (8*8*16) and conv2 output (8*8*32) are alive together at 8 bits
    assert peak_activation_bytes(graph, 8) == 8 * 8 * 16 + 8 * 8 * 32
    assert peak_activation_bytes(graph, 16) == 2 * (8 * 8 * 16 + 8 * 8 * 32)
    assert lower(graph, edge_spec).peak_activation_bytes == 3072


def test_batch_scales_gemm_rows_and_throughput(graph, edge_spec):
    one = lower(graph, edge_spec)
    eight = lower(graph, edge_spec, batch=8)
    r1 = {r.name: r for r in one.layers}
    r8 = {r.name: r for r in eight.layers}
    assert r8["conv2"].M == 8 * r1["conv2"].M and r8["fc1"].M == 8
    assert eight.batch == 8 and eight.latency_s > one.latency_s
    # weights are read once per batch, so batching raises throughput on the memory-bound fc1
    assert eight.throughput_per_s > one.throughput_per_s
    with pytest.raises(ConfigError):
        lower(graph, edge_spec, batch=0)


@pytest.mark.parametrize("preset", ["edge_16x16", "gemmini_16x16"])
def test_non_increasing_in_sram_and_small_sram_refetches(graph, preset):
    spec = load_npu_spec(preset)
    sizes = [512, 2048, 8192, 32768, 131072, 1 << 22]
    lats, fetch = [], []
    for s in sizes:
        sp = _with(spec, "memory", ifmap_sram_bytes=s, filter_sram_bytes=s, ofmap_sram_bytes=s)
        sched = lower(graph, sp)
        lats.append(sched.latency_s)
        fetch.append({r.name: r.costs.refetch_factor for r in sched.layers})
    assert all(b <= a * (1 + 1e-9) for a, b in zip(lats, lats[1:]))
    assert lats[0] > lats[-1]
    assert max(fetch[0].values()) > 1.0  # the tiny SRAM re-fetches an operand
    big = lower(graph, _with(spec, "memory", ifmap_sram_bytes=1 << 22,
                             filter_sram_bytes=1 << 22, ofmap_sram_bytes=1 << 22))
    for r in big.layers:
        if r.device == "npu":
            assert r.costs.refetch_factor == pytest.approx(1.0, rel=1e-6)
            assert r.costs.sram_peak_bytes >= 0


class HardSwishNet(nnx.Module):
    def __init__(self, rngs):
        self.conv = nnx.Conv(16, 16, (3, 3), padding="SAME", rngs=rngs)
        self.conv2 = nnx.Conv(16, 16, (1, 1), rngs=rngs)

    def __call__(self, x):
        y = self.conv(x)
        y = y * jnp.clip(y + 3.0, 0.0, 6.0) / 6.0  # hard-swish as an exporter writes it
        return self.conv2(y) + y  # a residual add that re-reads y


def test_elementwise_chain_fuses_into_the_conv_but_residual_add_reads_dram(edge_spec):
    g = _trace(HardSwishNet(nnx.Rngs(0)), (1, 16, 16, 16))
    rows = lower(g, edge_spec).layers
    by_op = {}
    for r in rows:
        by_op.setdefault(r.op, []).append(r)
    assert by_op["Div"][0].device == "npu"  # a division by the constant 6 is a multiplier
    fused = [r for r in rows if r.kind == "vector" and r.costs.dram_bytes == 0]
    # add 3, max 0 (relu), min 6, multiply, multiply by 1/6: all on chip after the conv
    assert len(fused) == 5 and all(r.device == "npu" for r in fused)
    assert all(r.costs.dma_cycles == 0 and r.costs.compute_cycles > 0 for r in fused)
    last_add = [r for r in rows if r.op == "Add"][-1]
    assert last_add.costs.dram_bytes > 0  # conv2 output + y: the skip tensor comes from DRAM


def test_rest_of_graph_fallback_sends_every_later_layer_to_the_host(graph, edge_spec):
    """ops.fallback = rest_of_graph (the Edge TPU compiler's partition): the first unsupported
    operator and everything after it run on the host, each GEMM at 2 ops per MAC."""
    ops = [o for o in edge_spec.ops.supported if o != "AveragePool"]
    per_op = lower(graph, _with(edge_spec, "ops", supported=tuple(ops)))
    rest = lower(graph, _with(edge_spec, "ops", supported=tuple(ops), fallback="rest_of_graph"))
    names = [r.name for r in rest.layers]
    k = names.index("avgpool_0")
    assert [r.device for r in per_op.layers if r.kind != "layout"].count("cpu") == 1
    assert all(r.device == "npu" for r in rest.layers[:k] if r.kind != "layout")
    after = [r for r in rest.layers[k + 1:] if r.kind != "layout"]
    assert after and all(r.device == "cpu" and "avgpool_0" in r.reason for r in after)
    fc1 = {r.name: r for r in rest.layers}["fc1"]
    cpu_s = 2 * fc1.macs / edge_spec.host.cpu_ops_per_s
    assert fc1.costs.fallback_cycles / edge_spec.array.clock_hz == pytest.approx(cpu_s)


class Depthwise(nnx.Module):
    def __init__(self, c, rngs):
        self.dw = nnx.Conv(c, c, (3, 3), feature_group_count=c, padding="SAME", rngs=rngs)

    def __call__(self, x):
        return self.dw(x)


def test_block_diagonal_group_packing_on_weight_stationary():
    """array.group_packing = block_diagonal: a 3x3 depthwise layer of 40 channels on a 32x32
    weight-stationary array puts floor(32 / 9) = 3 channels on a fold: ceil(40 / 3) = 14 folds
    of the packed GEMM (M, 27, 3) instead of 40 folds of (M, 9, 1), the same weight bytes; the
    output-stationary array cannot pack and is unchanged."""
    g = _trace(Depthwise(40, nnx.Rngs(0)), (1, 8, 8, 40))
    base = dataclasses.replace(load_npu_spec("edge_16x16"), array=dataclasses.replace(
        load_npu_spec("edge_16x16").array, rows=32, cols=32, dataflow="weight_stationary"))
    base = _with(base, "layout", channel_alignment=1)
    packed = _with(base, "array", group_packing="block_diagonal")
    seq = {r.name: r for r in lower(g, base).layers}["dw"]
    pk = {r.name: r for r in lower(g, packed).layers}["dw"]
    assert (seq.costs.folds, pk.costs.folds) == (40, 14)
    fd = seq.costs.fill_drain_cycles // 40  # per fold: a function of the array only
    assert seq.costs.compute_cycles == 40 * (fd + 64)
    assert pk.costs.compute_cycles == 14 * (fd + 64)
    assert pk.costs.weight_dram_bytes == pytest.approx(seq.costs.weight_dram_bytes, rel=0.1)
    assert pk.macs == seq.macs and pk.costs.utilization > 2.5 * seq.costs.utilization
    os_ = _with(packed, "array", dataflow="output_stationary")
    os_seq = _with(base, "array", dataflow="output_stationary")
    assert lower(g, os_).latency_s == lower(g, os_seq).latency_s


def test_double_buffered_stationary_tile_hides_each_later_fill():
    """array.stationary_buffering = double (TPU v1's double-buffered weight tile): the 40
    folds of a 3x3 depthwise layer on a 32x32 weight-stationary array keep the first fold's
    fill (32 cycles, the rows) and hide each later one up to the fold's streaming: all of it
    at 8x8 pixels (64 streamed rows per fold), 16 of its 32 cycles at 4x4. Output stationary
    has no fill and is unchanged."""
    base = dataclasses.replace(load_npu_spec("edge_16x16"), array=dataclasses.replace(
        load_npu_spec("edge_16x16").array, rows=32, cols=32, dataflow="weight_stationary"))
    base = _with(base, "layout", channel_alignment=1)
    double = _with(base, "array", stationary_buffering="double")
    for hw, hidden in ((8, 39 * 32), (4, 39 * 16)):
        g = _trace(Depthwise(40, nnx.Rngs(0)), (1, hw, hw, 40))
        one = {r.name: r for r in lower(g, base).layers}["dw"]
        two = {r.name: r for r in lower(g, double).layers}["dw"]
        assert one.costs.folds == two.costs.folds == 40
        assert one.costs.compute_cycles - two.costs.compute_cycles == hidden
        assert one.costs.fill_drain_cycles - two.costs.fill_drain_cycles == hidden
    os_ = _with(base, "array", dataflow="output_stationary")
    assert (lower(g, _with(os_, "array", stationary_buffering="double")).latency_s
            == lower(g, os_).latency_s)


def test_host_fallback_is_a_roofline_of_operations_and_bytes(graph, edge_spec):
    """A layer on the host takes max(ops / cpu_ops_per_s, bytes / memory_bytes_per_s); with
    the host's memory not modelled (0, the default) only the operations count."""
    ops = tuple(o for o in edge_spec.ops.supported if o != "AveragePool")
    spec = _with(edge_spec, "ops", supported=ops)
    slow_mem = _with(spec, "host", memory_bytes_per_s=1e6)
    pool = {r.name: r for r in lower(graph, spec).layers}["avgpool_0"]
    pool_mem = {r.name: r for r in lower(graph, slow_mem).layers}["avgpool_0"]
    w = {x.name: x for x in workloads(graph, spec)}["avgpool_0"]
    clock = spec.array.clock_hz
    assert pool.costs.fallback_cycles == pytest.approx(w.cpu_ops / spec.host.cpu_ops_per_s
                                                       * clock)
    bytes_ = (w.in_elems + w.out_elems) * 8 / 8
    assert pool_mem.costs.fallback_cycles == pytest.approx(bytes_ / 1e6 * clock)
    assert pool_mem.bound == "fallback"


def test_host_elementwise_rate_prices_non_gemm_fallback_per_element(graph, edge_spec):
    """host.elementwise_elems_per_s: a fallback layer without MACs takes one element of its
    largest tensor per 1 / rate (still under the host's memory roofline); a GEMM on the host
    keeps its operations at cpu_ops_per_s; 0 (the default) changes nothing."""
    ops = tuple(o for o in edge_spec.ops.supported if o not in ("AveragePool", "Gemm"))
    spec = _with(edge_spec, "ops", supported=ops)
    slow = _with(spec, "host", elementwise_elems_per_s=1e6)
    base = {r.name: r for r in lower(graph, spec).layers}
    new = {r.name: r for r in lower(graph, slow).layers}
    w = {x.name: x for x in workloads(graph, spec)}
    clock = spec.array.clock_hz
    pool, fc = w["avgpool_0"], w["fc1"]
    assert pool.macs == 0 and fc.macs > 0
    assert fc.device == pool.device == "cpu"
    assert new["avgpool_0"].costs.fallback_cycles == pytest.approx(
        max(pool.in_elems, pool.out_elems) / 1e6 * clock)
    assert new["fc1"].costs.fallback_cycles == base["fc1"].costs.fallback_cycles
    assert (base["avgpool_0"].costs.fallback_cycles
            == pytest.approx(pool.cpu_ops / spec.host.cpu_ops_per_s * clock))


def test_resize_beyond_the_largest_scale_falls_back():
    """ops.resize_max_scale: a Resize upscaling by more than it on any axis runs on the host
    with the reason; one within it, or any with the default 0, stays on the NPU."""
    from onnx import TensorProto, helper, numpy_helper

    from npujax.frontends.onnx import from_onnx

    nodes = [helper.make_node("Resize", ["x", "", "s2"], ["a"], mode="linear"),
             helper.make_node("Resize", ["a", "", "s4"], ["b"], mode="linear")]
    inits = [numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "s2"),
             numpy_helper.from_array(np.array([1, 1, 1, 4], np.float32), "s4")]
    g = helper.make_graph(nodes, "t", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, [1, 16, 4, 4])], [helper.make_tensor_value_info(
            "b", TensorProto.FLOAT, None)], inits)
    graph, _ = from_onnx(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]))
    spec = load_npu_spec("coral_edgetpu")
    assert spec.ops.resize_max_scale == 2.0
    w = [x for x in workloads(graph, spec) if x.op == "Resize"]
    assert [x.device for x in w] == ["npu", "cpu"]
    assert "4x resize > max 2x" in w[1].reason
    any_scale = _with(spec, "ops", resize_max_scale=0.0)
    assert [x.device for x in workloads(graph, any_scale) if x.op == "Resize"] == ["npu"] * 2


def test_invocation_overhead_is_paid_once_per_inference(graph, edge_spec):
    """host.invocation_overhead_s (the invocation pass): once per inference, on the first
    layer's host-transfer time; the default 0 leaves every number as it was."""
    base = lower(graph, edge_spec)
    over = lower(graph, _with(edge_spec, "host", invocation_overhead_s=1e-3))
    assert over.latency_s == pytest.approx(base.latency_s + 1e-3, rel=1e-9)
    first, first0 = over.layers[0], base.layers[0]
    assert (first.costs.transfer_cycles - first0.costs.transfer_cycles
            == pytest.approx(1e-3 * edge_spec.array.clock_hz))
    assert [r.latency_s for r in over.layers[1:]] == [r.latency_s for r in base.layers[1:]]


def test_instruction_stream_is_read_once_per_inference(graph, edge_spec):
    """memory.instruction_bytes_per_op (the instruction_stream pass): the NPU operations'
    instructions read from off-chip memory once per inference, on the first layer's DMA time;
    a traced layer table counts the same operations; the default 0 changes nothing."""
    from npujax.plan import program_cost
    from npujax.plan.passes.instruction_stream import npu_operations
    from npujax.plan.table import layer_table

    ops = sum(w.device == "npu" and not w.fused_into for w in workloads(graph, edge_spec))
    assert 0 < ops == npu_operations(workloads(graph, edge_spec))
    base = lower(graph, edge_spec)
    spec = _with(edge_spec, "memory", instruction_bytes_per_op=4096.0)
    over = lower(graph, spec)
    dt = ops * 4096.0 / edge_spec.memory.dram_bytes_per_s
    assert over.latency_s == pytest.approx(base.latency_s + dt, rel=1e-9)
    first, first0 = over.layers[0], base.layers[0]
    assert (first.costs.dma_cycles - first0.costs.dma_cycles
            == pytest.approx(dt * edge_spec.array.clock_hz))
    assert [r.latency_s for r in over.layers[1:]] == [r.latency_s for r in base.layers[1:]]
    layers = workloads(graph, spec)
    wb = jnp.full(len(layers), 8.0, jnp.float32)
    with jax.enable_x64(True):
        table = layer_table(layers, 16)
        wb16 = jnp.full(16, 8.0, jnp.float32)
        traced = jax.jit(lambda t: program_cost(t, spec, wb16, wb16).costs.dma_cycles[0])(table)
        static = program_cost(layers, spec, wb, wb).costs.dma_cycles[0]
    assert float(traced) == pytest.approx(float(static), rel=1e-12)

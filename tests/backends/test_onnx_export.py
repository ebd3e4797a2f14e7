"""QDQ export: the real classifier imported, optimized, quantized, calibrated, exported, and run
by onnxruntime and by npujax again."""

from __future__ import annotations

import jax
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from npujax.backends.integer import convert, execute_integer, requant_target
from npujax.backends.onnx_export import to_onnx
from npujax.errors import ConfigError, UnsupportedOpError
from npujax.frontends.onnx import from_onnx
from npujax.ir.execute import execute
from npujax.ir.passes import optimize
from npujax.ops import gemm_nodes
from npujax.quantize.calibrate import calibrate
from npujax.quantize.spec import quant_spec
from tests.helpers import assert_close, jit_optimized
from tests.onnx_models import ort_run, text_images


@pytest.fixture(scope="module")
def cls_quantized(ppocr_cls):
    _, graph, params = ppocr_cls
    graph, params = optimize(graph, params)
    q = quant_spec(graph)
    xs = text_images(48, 192, 8, seed=2, flip_odd=True)
    qstate = calibrate(graph, params, [x[None] for x in xs[:4]], q)
    run = jax.jit(jax.vmap(lambda p, x, qs: execute(graph, p, x[None], quant=q, qstate=qs)[0],
                           in_axes=(None, 0, None)))
    run_float = jax.jit(jax.vmap(lambda p, x: execute(graph, p, x[None])[0], in_axes=(None, 0)))
    return graph, params, q, qstate, xs, np.asarray(run(params, xs, qstate)), np.asarray(
        run_float(params, xs))


@pytest.mark.integration
def test_cls_fake_quant_close_to_float(cls_quantized):
    *_, yq, yf = cls_quantized
    # int8 per-channel weights, uint8 activations, calibrated on 4 text images: measured
    # max |dp| 0.017; every orientation still right.
    assert np.abs(yq - yf).max() < 0.05
    np.testing.assert_array_equal(yf.argmax(1), ORIENTATION)
    np.testing.assert_array_equal(yq.argmax(1), ORIENTATION)


#: Classes of the 8 test images: upright text is class 0, text rotated by 180 degrees class 1.
ORIENTATION = [0, 1] * 4


@pytest.mark.integration
def test_qdq_export_structure_and_atomic_write(cls_quantized, tmp_path):
    graph, params, q, qstate, *_ = cls_quantized
    path = tmp_path / "cls_qdq.onnx"
    model = to_onnx(graph, params, q, qstate, path)
    assert path.is_file() and sorted(p.name for p in tmp_path.iterdir()) == ["cls_qdq.onnx"]
    onnx.checker.check_model(onnx.load(path))
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    nodes = {n.name: n for n in model.graph.node}
    conv = gemm_nodes(graph)[3]
    wq = inits[f"{conv.name}.kernel_q"]
    ws = inits[f"{conv.name}.kernel_scale"]
    assert wq.dtype == np.int8 and np.abs(wq).max() == 127 and ws.shape == (wq.shape[0],)
    wdq = nodes[f"{conv.name}/weight_dequant"]
    assert {a.name: a.i for a in wdq.attribute}["axis"] == 0  # OIHW: output channels
    bq, bs = inits[f"{conv.name}.bias_q"], inits[f"{conv.name}.bias_scale"]
    assert bq.dtype == np.int32
    act_scale = float(np.asarray(qstate[conv.name].act_scale))
    np.testing.assert_allclose(bs, act_scale * ws, rtol=1e-6)
    assert inits[f"{conv.name}.act_zero_point"].dtype == np.uint8
    # one QuantizeLinear per layer input, plus one on the output of each layer that the
    # integer path requantizes to its consumer's grid (onnxruntime fuses it into QLinearConv)
    n_q = sum(n.op_type == "QuantizeLinear" for n in model.graph.node)
    n_out = sum(requant_target(graph, q, n)[0] is not None for n in gemm_nodes(graph))
    assert n_out > 0 and sum(n.name.endswith("/out_quant") for n in model.graph.node) == n_out
    assert n_q == len(gemm_nodes(graph)) + n_out


@pytest.mark.integration
def test_qdq_round_trip_through_npujax_is_exact(cls_quantized):
    graph, params, q, qstate, xs, *_ = cls_quantized
    model = to_onnx(graph, params, q, qstate, int32_bias=False, requantize_outputs=False)
    g2, p2 = from_onnx(model)
    assert sum(n.op == "QuantizeLinear" for n in g2.nodes) == len(gemm_nodes(graph))
    y = np.asarray(jax.jit(lambda p, x: execute(g2, p, x))(p2, xs[:1]))
    ref = np.asarray(jax.jit(lambda p, x: execute(graph, p, x, quant=q, qstate=qstate))(
        params, xs[:1]))
    # Same XLA ops on the same values: measured exactly equal. (Not against the fixture's
    # vmapped run: a batch of 8 compiles to other XLA convolutions, whose last-bit differences
    # move a code at a rounding tie on image 0: 0.006 in p.)
    np.testing.assert_allclose(y, ref, rtol=0, atol=1e-6)


@pytest.mark.integration
@pytest.mark.parametrize("int32_bias", [True, False])
def test_qdq_export_runs_in_onnxruntime_close_to_fake_quant(cls_quantized, int32_bias):
    graph, params, q, qstate, xs, yq, _ = cls_quantized
    model = to_onnx(graph, params, q, qstate, int32_bias=int32_bias).SerializeToString()
    y = np.concatenate([ort_run(model, {"x": x[None]})[0] for x in xs])
    # Not bit-exact: onnxruntime's float conv accumulates in another order (and int32 biases
    # round), which flips a few activation codes by 1 LSB; flips compound over 54 quantized
    # layers. Measured max |dp|: 0.038 with int32 biases, 0.031 with float biases.
    assert np.abs(y - yq).max() < 0.05
    np.testing.assert_array_equal(y.argmax(1), ORIENTATION)


@pytest.mark.integration
def test_qdq_export_in_onnxruntime_equals_the_integer_path(cls_quantized):
    """onnxruntime fuses the exported QDQ groups it can into its integer kernels (here 15
    QLinearConv, the ReLU layers, and the QGemm; QLinearConv/QGemm requantize in float, as
    ``requant="float"`` does). The other 39 convs feed HardSwish, SE blocks or residual Adds:
    they have no calibrated output grid, so onnxruntime runs them in float (MLAS sgemm on
    dequantized values), which the integer path's dequantized accumulators equal only up to
    float rounding -- a value at a rounding tie of the next quantizer can flip a code. The digits
    CNN (tests/graph/test_integer_ort.py), all of whose layers ORT runs in integers, is exact."""
    graph, params, q, qstate, xs, *_ = cls_quantized
    model = to_onnx(graph, params, q, qstate).SerializeToString()
    integer = convert(graph, params, q, qstate, requant="float")
    run = jit_optimized(lambda x: execute_integer(integer, x))  # integer convs: -O2
    diff = []
    for x in xs[:4]:
        (y,) = ort_run(model, {"x": x[None]})
        got = np.asarray(run(x[None]))
        np.testing.assert_array_equal(got.argmax(1), y.argmax(1))
        diff.append(float(np.abs(got - y).max()))
    # Measured: three images equal up to the float softmax (<= 6e-8); on image 0 one code
    # flips in a float conv and propagates (0.013 in p).
    assert max(diff) < 0.05 and sum(d <= 1e-6 for d in diff) >= 2, diff


def _small_model():
    rng = np.random.default_rng(0)
    w = rng.normal(size=(8, 3, 3, 3)).astype(np.float32) * 0.3
    dw = rng.normal(size=(8, 1, 3, 3)).astype(np.float32) * 0.3
    fc = rng.normal(size=(8 * 4 * 4, 5)).astype(np.float32) * 0.1
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c1"], pads=[1, 1, 1, 1], name="conv1"),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("Conv", ["r1", "dw"], ["c2"], pads=[1, 1, 1, 1], group=8,
                         strides=[2, 2], name="dwconv"),
        helper.make_node("HardSwish", ["c2"], ["h"], name="hswish"),
        helper.make_node("AveragePool", ["h"], ["p"], kernel_shape=[2, 2], strides=[2, 2],
                         name="pool"),
        helper.make_node("Flatten", ["p"], ["f"], name="flatten"),
        helper.make_node("Gemm", ["f", "fc"], ["y"], name="fc"),
    ]
    g = helper.make_graph(nodes, "small",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 5])],
                          [numpy_helper.from_array(w, "w"), numpy_helper.from_array(dw, "dw"),
                           numpy_helper.from_array(fc, "fc")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def test_float_export_matches_and_low_bit_export_stays_in_range():
    m = _small_model()
    graph, params = optimize(*from_onnx(m))
    x = np.random.default_rng(1).normal(size=(4, 1, 3, 16, 16)).astype(np.float32)
    ref = np.concatenate([ort_run(m.SerializeToString(), {"x": xi})[0] for xi in x])
    exported = to_onnx(graph, params).SerializeToString()
    y = np.concatenate([ort_run(exported, {"x": xi})[0] for xi in x])
    assert_close(y, ref, rtol=1e-5, atol=1e-5)
    # 4-bit weights and 6-bit activations: stored in int8/uint8, codes within the narrow range.
    q = quant_spec(graph, weight_bits=4, act_bits=6)
    qstate = calibrate(graph, params, list(x), q)
    model = to_onnx(graph, params, q, qstate, int32_bias=False,
                    requantize_outputs=False)
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    assert all(np.abs(v).max() <= 7 for k, v in inits.items() if k.endswith("kernel_q"))
    assert any(n.name.endswith("/act_clip") for n in model.graph.node)
    yq = np.concatenate([np.asarray(execute(graph, params, xi, quant=q, qstate=qstate))
                         for xi in x])
    y = np.concatenate([ort_run(model.SerializeToString(), {"x": xi})[0] for xi in x])
    assert_close(y, yq, rtol=1e-4, atol=1e-4)


def test_9_to_16_bit_formats_export_as_int16_qdq_at_opset_21():
    """12-bit weights and 16-bit activations are stored in int16/uint16, which QuantizeLinear
    takes from opset 21; onnxruntime runs the file as npujax's fake-quant computes it (the
    quantize command raised onnx's shape-inference error on them)."""
    m = _small_model()
    graph, params = optimize(*from_onnx(m))
    x = np.random.default_rng(1).normal(size=(2, 1, 3, 16, 16)).astype(np.float32)
    q = quant_spec(graph, weight_bits=12, act_bits=16)
    qstate = calibrate(graph, params, list(x), q)
    model = to_onnx(graph, params, q, qstate, int32_bias=False, requantize_outputs=False)
    assert model.opset_import[0].version == 21
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    kernels = [v for k, v in inits.items() if k.endswith("kernel_q")]
    assert kernels and all(v.dtype == np.int16 for v in kernels)
    yq = np.concatenate([np.asarray(execute(graph, params, xi, quant=q, qstate=qstate))
                         for xi in x])
    y = np.concatenate([ort_run(model.SerializeToString(), {"x": xi})[0] for xi in x])
    assert_close(y, yq, rtol=1e-4, atol=1e-4)


def test_export_errors():
    graph, params = from_onnx(_small_model())
    q = quant_spec(graph)
    with pytest.raises(ConfigError, match="qstate has no entry"):
        to_onnx(graph, params, q, {})
    mixed = quant_spec(graph, weight_bits={n.name: (4, 8) for n in gemm_nodes(graph)})
    fake_qstate = {n.name: {"act_scale": np.float32(0.1), "act_zero_point": np.int32(0)}
                   for n in gemm_nodes(graph)}
    with pytest.raises(ConfigError, match="candidate weight formats"):
        to_onnx(graph, params, mixed, fake_qstate)
    bad = graph.replace(nodes=graph.nodes[:1] + (graph.nodes[1].replace(op="Mystery"),)
                        + graph.nodes[2:])
    with pytest.raises(UnsupportedOpError, match="'Mystery'"):
        to_onnx(bad, params)


@pytest.mark.flax_model
def test_flax_traced_nhwc_model_exports():
    """A traced Flax CNN (NHWC/HWIO, BatchNorm over axis -1) exports through Transposes."""
    import jax.numpy as jnp
    from flax import nnx

    from npujax.frontends.flax import trace_flax
    from npujax.models.cnn import DigitsCNN

    x = np.random.default_rng(0).uniform(size=(4, 1, 8, 8, 1)).astype(np.float32)
    graph, params = trace_flax(DigitsCNN(rngs=nnx.Rngs(0)), jnp.asarray(x[0]))
    name = graph.inputs[0]
    for g, p in ((graph, params), optimize(graph, params)):
        model = to_onnx(g, p).SerializeToString()
        for xi in x:
            assert_close(ort_run(model, {name: xi})[0], execute(g, p, xi), atol=1e-5)
    q = quant_spec(g)
    qstate = calibrate(g, p, list(x), q)
    model = to_onnx(g, p, q, qstate, int32_bias=False,
                    requantize_outputs=False).SerializeToString()
    for xi in x:
        # Few layers, float biases, no graph rewrites in onnxruntime: measured 1.5e-7.
        assert_close(ort_run(model, {name: xi}, disable_optimizations=True)[0],
                     execute(g, p, xi, quant=q, qstate=qstate), atol=1e-4)


def test_cpu_fallback_node_exports_back():
    node = helper.make_node("Softsign", ["x"], ["e"], name="softsign")  # has no npujax importer
    relu = helper.make_node("Relu", ["e"], ["y"], name="relu")
    g = helper.make_graph([node, relu], "fb",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    graph, params = from_onnx(m, unsupported="fallback")
    assert [n.op for n in graph.nodes] == ["CpuFallback", "Relu"]
    x = np.linspace(-2, 2, 6, dtype=np.float32).reshape(2, 3)
    exported = to_onnx(graph, params).SerializeToString()
    assert_close(ort_run(exported, {"x": x})[0], ort_run(m.SerializeToString(), {"x": x})[0])


def _conv_transpose_model(groups: int):
    rng = np.random.default_rng(groups)
    c_in, c_out_g = 4, 3
    w = rng.normal(size=(c_in, c_out_g, 3, 3)).astype(np.float32)
    w[: c_in // groups] *= 20.0  # the first group's channels are 20x larger than the others'
    b = rng.normal(size=(groups * c_out_g,)).astype(np.float32)
    node = helper.make_node("ConvTranspose", ["x", "w", "b"], ["y"], strides=[2, 2],
                            pads=[1, 1, 1, 1], output_padding=[1, 1], group=groups, name="up")
    g = helper.make_graph([node], "convt",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c_in, 5, 5])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT,
                                                         [1, groups * c_out_g, 10, 10])],
                          [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m, w


@pytest.mark.parametrize("groups", [1, 2])
def test_conv_transpose_per_channel_qdq_export_runs_in_onnxruntime(groups):
    from npujax.errors import QuantizationError
    from npujax.numerics import IntFormat
    from npujax.ops import kernel_out_axis, out_channel_view
    from npujax.quantize.quantizers import quantize_weight
    from npujax.quantize.spec import LayerQuant

    m, w = _conv_transpose_model(groups)
    graph, params = from_onnx(m)
    (node,) = graph.nodes
    # one scale per output channel o = i * (C_out/g) + j, i.e. kernel[i*C_in/g:(i+1)*C_in/g, j]
    view, axis, back = out_channel_view(node, w)
    assert axis == (0 if groups > 1 else 1) and view.shape[axis] == groups * 3
    np.testing.assert_array_equal(back(view), w)
    if groups > 1:  # axis 1 would share a scale between channel j of every group
        with pytest.raises(QuantizationError, match="out_channel_view"):
            kernel_out_axis(node)
    wq = np.asarray(quantize_weight(view, IntFormat(8, narrow_range=True), axis))
    step = np.abs(view).max(axis=tuple(i for i in range(4) if i != axis), keepdims=True) / 127
    assert np.all(np.abs(wq - view) <= step / 2 * (1 + 1e-6))
    q = {"up": LayerQuant(weight=IntFormat(8, narrow_range=True), act=IntFormat(8, signed=False))}
    x = np.random.default_rng(5).normal(size=(4, 1, 4, 5, 5)).astype(np.float32)
    qstate = calibrate(graph, params, list(x), q)
    for int32_bias in (False, True):
        model = to_onnx(graph, params, q, qstate, int32_bias=int32_bias)
        dq = [n for n in model.graph.node if n.name == "up/weight_dequant"][0]
        assert {a.name: a.i for a in dq.attribute}["axis"] == axis  # ONNX DQ axis 1: [C_in, C_out]
        model = model.SerializeToString()
        for xi in x:
            want = np.asarray(execute(graph, params, xi, quant=q, qstate=qstate))
            # onnxruntime runs ConvTranspose in float on the dequantized kernel: float rounding
            # (measured <= 2.3e-5 on outputs up to 180) and, with int32 biases, their rounding
            # to the grid s_x * s_w (measured 0.0028; half a step is up to 0.007 here)
            assert_close(ort_run(model, {"x": xi})[0], want, rtol=1e-5,
                         atol=1e-2 if int32_bias else 1e-5)


def test_a_folded_batch_1_concat_constant_keeps_the_fixed_batch(tmp_path):
    """A ViT's class token, a ``[1, 1, d]`` constant concatenated with ``[batch, n, d]`` patches,
    runs at any batch in npujax (broadcast) but not as an ONNX Concat: the file keeps batch 1
    (it declared a dynamic batch that onnxruntime refused at batch > 1)."""
    rng = np.random.default_rng(0)
    cls, w = rng.normal(size=(1, 1, 4)).astype(np.float32), rng.normal(
        size=(4, 2)).astype(np.float32)
    g = helper.make_graph(
        [helper.make_node("Concat", ["cls", "x"], ["c"], axis=1, name="cat"),
         helper.make_node("MatMul", ["c", "w"], ["y"], name="fc")], "tok",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 2])],
        [numpy_helper.from_array(cls, "cls"), numpy_helper.from_array(w, "w")])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]),
              tmp_path / "tok.onnx")
    graph, params = optimize(*from_onnx(tmp_path / "tok.onnx"))
    m = to_onnx(graph, params, path=tmp_path / "out.onnx")
    assert m.graph.input[0].type.tensor_type.shape.dim[0].dim_value == 1
    x = rng.normal(size=(1, 3, 4)).astype(np.float32)
    name = m.graph.input[0].name
    np.testing.assert_allclose(ort_run(tmp_path / "out.onnx", {name: x})[0],
                               np.concatenate([cls, x], 1) @ w, rtol=1e-5, atol=1e-5)

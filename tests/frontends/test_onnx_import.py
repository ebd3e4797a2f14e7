"""ONNX import: real models vs onnxruntime, own grouped/depthwise cases, conformance, errors."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from npujax.errors import GraphError, NpujaxError, UnsupportedOpError
from npujax.frontends.onnx import from_onnx
from npujax.ir.execute import execute
from npujax.ops import gemm_nodes
from tests.helpers import assert_close
from tests.onnx_claimed import CLAIMED
from tests.onnx_models import crops, ort_run, text_images, zoo_path

# ----------------------------------------------------------------------------------------------
# Real models


@pytest.mark.integration
def test_cls_structure(ppocr_cls):
    _, graph, params = ppocr_cls
    ops = [n.op for n in graph.nodes]
    assert ops.count("Conv") == 53 and ops.count("BatchNormalization") == 35
    assert ops.count("Gemm") == 1  # MatMul by a constant + Add -> Gemm with a bias
    assert "bias" in params[gemm_nodes(graph)[-1].name]
    assert graph.source == "onnx" and graph.tensors[graph.outputs[0]].shape == (1, 2)
    # Weights are params (trainable), the SE-block broadcast constants are Graph.constants.
    assert all("kernel" in params[n.name] for n in gemm_nodes(graph))
    assert not any(v.size > 10_000 for v in graph.constants.values())


@pytest.mark.integration
def test_cls_matches_onnxruntime(ppocr_cls):
    path, graph, params = ppocr_cls
    run = jax.jit(lambda p, x: execute(graph, p, x))
    xs = np.concatenate([text_images(48, 192, 4, flip_odd=True), crops(48, 192, 2)])
    ys = []
    for x in xs:
        y = np.asarray(run(params, x[None]))
        (ref,) = ort_run(path, {"x": x[None]})
        # float32, ~60 layers deep: measured max abs 2.1e-6 / rel 4.7e-6 on softmax outputs.
        assert_close(y, ref, rtol=1e-4, atol=1e-5)
        ys.append(y[0])
    # The model does its job: upright text -> class 0, text rotated by 180 degrees -> class 1.
    np.testing.assert_array_equal(np.argmax(ys[:4], axis=1), [0, 1, 0, 1])


@pytest.mark.integration
def test_det_matches_onnxruntime_small_input():
    path = zoo_path("ppocr_det")
    graph, params = from_onnx(path, {"x": (1, 3, 160, 160)})
    ops = [n.op for n in graph.nodes]
    assert ops.count("ConvTranspose") == 2 and ops.count("Resize") == 6
    x = text_images(160, 160, 1, seed=3)
    y = np.asarray(jax.jit(lambda p, x: execute(graph, p, x))(params, x))
    (ref,) = ort_run(path, {"x": x})
    assert y.shape == (1, 1, 160, 160) and (ref > 0.3).mean() > 0.01  # it finds the text
    # float32 probability map in [0, 1] after ~330 nodes: measured max abs 1.8e-5 at 320x320.
    assert_close(y, ref, rtol=1e-3, atol=1e-4)


# ----------------------------------------------------------------------------------------------
# Own cases checked against onnxruntime (grouped / depthwise conv: no onnx node case has them)


def _model(nodes, inputs, outputs, inits=(), opset=17):
    g = helper.make_graph(nodes, "t", inputs, outputs, list(inits))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    return m


def _check_vs_ort(model, feeds, rtol=1e-5, atol=1e-5):
    graph, params = from_onnx(model)
    y = execute(graph, params, [jnp.asarray(feeds[n]) for n in graph.inputs])
    ref = ort_run(model.SerializeToString(), feeds)
    ys = y if isinstance(y, tuple) else (y,)
    for a, b in zip(ys, ref):
        assert np.asarray(a).shape == b.shape
        assert_close(a, b, rtol=rtol, atol=atol)
    return graph, params


CONV_CASES = [
    # (C_in, C_out, groups, kernel, strides, dilations, pads or auto_pad)
    (8, 8, 8, (3, 3), (1, 1), (1, 1), [1, 1, 1, 1]),  # depthwise 3x3
    (8, 16, 8, (5, 5), (2, 2), (1, 1), [2, 2, 2, 2]),  # depthwise multiplier 2, stride 2
    (8, 8, 8, (3, 3), (2, 2), (1, 1), "SAME_UPPER"),
    (8, 8, 8, (3, 3), (2, 2), (1, 1), "SAME_LOWER"),
    (6, 9, 3, (3, 3), (1, 2), (2, 1), [2, 0, 1, 3]),  # grouped, dilated, asymmetric pads
    (6, 4, 2, (1, 1), (1, 1), (1, 1), "VALID"),  # grouped 1x1
    (4, 6, 1, (3, 2), (3, 1), (1, 1), "SAME_UPPER"),  # plain, odd shapes
    (4, 6, 2, (3, 3), (1, 1), (2, 3), [0, 1, 2, 0]),  # grouped, dilated (ORT: no SAME + dil)
]


@pytest.mark.parametrize("cin,cout,groups,k,strides,dil,pads", CONV_CASES)
def test_grouped_and_depthwise_conv_vs_onnxruntime(cin, cout, groups, k, strides, dil, pads):
    rng = np.random.default_rng(cin * cout + groups)
    w = rng.normal(size=(cout, cin // groups, *k)).astype(np.float32)
    b = rng.normal(size=(cout,)).astype(np.float32)
    attrs = {"group": groups, "kernel_shape": list(k), "strides": list(strides),
             "dilations": list(dil)}
    attrs.update({"auto_pad": pads} if isinstance(pads, str) else {"pads": pads})
    node = helper.make_node("Conv", ["x", "w", "b"], ["y"], **attrs)
    m = _model([node], [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, cin, 11, 13])],
               [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
               [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    x = rng.normal(size=(2, cin, 11, 13)).astype(np.float32)
    graph, params = _check_vs_ort(m, {"x": x})
    (conv,) = gemm_nodes(graph)
    assert conv.attrs["groups"] == groups and params[conv.name]["kernel"].shape == w.shape


@pytest.mark.parametrize("groups,strides,pads,out_pad", [
    (1, (2, 2), [0, 0, 0, 0], (0, 0)), (2, (2, 3), [1, 0, 0, 1], (1, 0)),
    (4, (1, 1), [1, 1, 1, 1], (0, 0)),
])
def test_conv_transpose_vs_onnxruntime(groups, strides, pads, out_pad):
    rng = np.random.default_rng(groups)
    w = rng.normal(size=(4, 6 // groups * (1 if groups != 4 else 2), 3, 3)).astype(np.float32)
    node = helper.make_node("ConvTranspose", ["x", "w"], ["y"], group=groups,
                            strides=list(strides), pads=pads, output_padding=list(out_pad))
    m = _model([node], [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 5, 6])],
               [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
               [numpy_helper.from_array(w, "w")])
    _check_vs_ort(m, {"x": rng.normal(size=(1, 4, 5, 6)).astype(np.float32)})


@pytest.mark.parametrize("trans_a,trans_b,alpha,beta,c_shape", [
    (0, 0, 1.0, 1.0, (5,)), (1, 1, 0.5, 2.0, (1, 5)), (0, 1, 1.0, 0.5, (3, 5)), (1, 0, 2.0, 1.0,
                                                                                None),
])
def test_gemm_with_weights_vs_onnxruntime(trans_a, trans_b, alpha, beta, c_shape):
    rng = np.random.default_rng(7)
    a_shape = (4, 3) if trans_a else (3, 4)
    b = rng.normal(size=(5, 4) if trans_b else (4, 5)).astype(np.float32)
    inits = [numpy_helper.from_array(b, "b")]
    ins = ["a", "b"]
    if c_shape is not None:
        inits.append(numpy_helper.from_array(rng.normal(size=c_shape).astype(np.float32), "c"))
        ins.append("c")
    node = helper.make_node("Gemm", ins, ["y"], transA=trans_a, transB=trans_b, alpha=alpha,
                            beta=beta)
    m = _model([node], [helper.make_tensor_value_info("a", TensorProto.FLOAT, list(a_shape))],
               [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    graph, _ = _check_vs_ort(m, {"a": rng.normal(size=a_shape).astype(np.float32)})
    assert len(gemm_nodes(graph)) == 1  # the weight stays a quantizable Gemm kernel


def test_pools_and_resize_vs_onnxruntime():
    rng = np.random.default_rng(3)
    nodes = [
        helper.make_node("AveragePool", ["x"], ["a"], kernel_shape=[3, 3], strides=[2, 2],
                         pads=[1, 1, 1, 1], ceil_mode=1, count_include_pad=1),
        helper.make_node("AveragePool", ["x"], ["b"], kernel_shape=[3, 2], strides=[2, 2],
                         pads=[1, 0, 1, 1], ceil_mode=1, count_include_pad=0),
        helper.make_node("MaxPool", ["x"], ["c"], kernel_shape=[3, 3], strides=[2, 2],
                         auto_pad="SAME_UPPER"),
        helper.make_node("Resize", ["x", "", "s"], ["d"], mode="linear",
                         coordinate_transformation_mode="half_pixel"),
        helper.make_node("Resize", ["x", "", "s"], ["e"], mode="nearest",
                         coordinate_transformation_mode="asymmetric", nearest_mode="floor"),
    ]
    outs = [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in "abcde"]
    scales = numpy_helper.from_array(np.array([1, 1, 2, 1.5], np.float32), "s")
    m = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 8, 9])],
               outs, [scales])
    _check_vs_ort(m, {"x": rng.normal(size=(1, 2, 8, 9)).astype(np.float32)})


def test_argmax_argmin_vs_onnxruntime_and_their_host_work():
    """ArgMax/ArgMin: ties resolved as onnxruntime does (first index, or the last with
    select_last_index), keepdims, negative axes; indices held as JAX's default integer
    (exact); one comparison per input element, the work a host that runs them does."""
    from npujax.plan.workload import workloads

    x = np.round(np.random.default_rng(4).normal(size=(2, 5, 3, 4)), 0).astype(np.float32)
    nodes = [helper.make_node("ArgMax", ["x"], ["a"], axis=1),
             helper.make_node("ArgMax", ["x"], ["b"], axis=-1, keepdims=0, select_last_index=1),
             helper.make_node("ArgMin", ["x"], ["c"], axis=2, keepdims=0)]
    m = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x.shape))],
               [helper.make_tensor_value_info(o, TensorProto.INT64, None) for o in "abc"])
    graph, params = _check_vs_ort(m, {"x": x})
    assert {graph.tensors[o].shape for o in "abc"} == {(2, 1, 3, 4), (2, 5, 3), (2, 5, 4)}
    assert [w.cpu_ops for w in workloads(graph)] == [x.size] * 3
    from npujax.backends.onnx_export import to_onnx

    back = to_onnx(graph, params, dynamic_batch=False).SerializeToString()
    for got, want in zip(ort_run(back, {"x": x}), ort_run(m.SerializeToString(), {"x": x})):
        np.testing.assert_array_equal(got, want)


def test_reductions_cost_the_elements_they_read():
    """A reduction's work is one operation per input element (plus ReduceMean's multiply per
    output): a global mean over (1, 64, 7, 7) is 3,136 additions and 64 multiplies, not 64
    operations (the old one-per-output count)."""
    from npujax.plan.workload import workloads

    x = np.random.default_rng(5).normal(size=(1, 64, 7, 7)).astype(np.float32)
    nodes = [helper.make_node("ReduceMean", ["x"], ["m"], axes=[2, 3]),
             helper.make_node("ReduceMax", ["x"], ["a"], axes=[1], keepdims=0),
             helper.make_node("ReduceSum", ["x", "ax"], ["s"], keepdims=1),
             helper.make_node("GlobalAveragePool", ["x"], ["g"])]
    m = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x.shape))],
               [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in "masg"],
               [numpy_helper.from_array(np.array([1], np.int64), "ax")], opset=13)
    graph, _ = _check_vs_ort(m, {"x": x})
    assert [w.cpu_ops for w in workloads(graph)] == [x.size + 64, x.size, x.size, x.size]


# ----------------------------------------------------------------------------------------------
# onnx backend node cases: a fast sample here, all claimed cases in tests/integration


def _sample(names):
    seen, out = set(), []
    for n in names:
        op = n.split("_")[1]
        if op not in seen:
            seen.add(op)
            out.append(n)
    return out


SAMPLE = _sample(CLAIMED) + ["test_conv_with_strides_and_asymmetric_padding",
                             "test_averagepool_2d_ceil", "test_resize_upsample_scales_linear",
                             "test_quantizelinear_axis", "test_gemm_all_attributes"]


@pytest.mark.parametrize("name", SAMPLE)
def test_onnx_node_case_sample(name):
    from tests.onnx_conformance import node_case, run_case

    assert name in CLAIMED
    run_case(node_case(name))


# ----------------------------------------------------------------------------------------------
# Errors


def _tiny(op="Relu", extra_inputs=(), inits=(), x_shape=(1, 2, 3, 3), **attrs):
    node = helper.make_node(op, ["x", *extra_inputs], ["y"], name="the_node", **attrs)
    return _model([node], [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x_shape))],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)


def test_malformed_file(tmp_path):
    p = tmp_path / "bad.onnx"
    p.write_bytes(b"\x08\x07definitely not a protobuf\xff\xff")
    with pytest.raises(GraphError, match="not a valid ONNX model"):
        from_onnx(p)
    with pytest.raises(GraphError, match="does not exist"):
        from_onnx(tmp_path / "missing.onnx")
    with pytest.raises(GraphError, match="URL"):
        from_onnx("https://example.com/model.onnx")
    with pytest.raises(GraphError, match=r"fetch_model\('ppocr_cls'\)"):
        from_onnx("zoo:ppocr_cls")


def test_missing_initializer_names_node_and_tensor():
    m = _tiny("Conv", ["w"])  # w is neither an input nor an initializer
    with pytest.raises(GraphError, match=r"'the_node' \(Conv\) reads tensor 'w'"):
        from_onnx(m)


def test_unsupported_op_error_and_fallback():
    m = _tiny("Softsign")  # any ONNX operator without an npujax importer
    with pytest.raises(UnsupportedOpError, match=r"node 'the_node' has operator 'Softsign'"):
        from_onnx(m)
    graph, params = from_onnx(m, unsupported="fallback")
    (node,) = graph.nodes
    assert node.op == "CpuFallback" and node.attrs["onnx_op"] == "Softsign"
    assert graph.tensors["y"].shape == (1, 2, 3, 3)
    x = np.linspace(-2, 2, 18, dtype=np.float32).reshape(1, 2, 3, 3)
    (ref,) = ort_run(m.SerializeToString(), {"x": x})
    assert_close(jax.jit(lambda x: execute(graph, params, x))(x), ref)


def test_unsupported_attribute_names_node():
    m = _tiny("Resize", ["", "s"], [numpy_helper.from_array(np.ones(4, np.float32), "s")],
              mode="cubic")
    with pytest.raises(UnsupportedOpError, match=r"'the_node'.*cubic"):
        from_onnx(m)


def test_dynamic_dimension_needs_input_shapes():
    m = _tiny(x_shape=("N", 2, "H", 3))
    with pytest.raises(GraphError, match=r"'x' has dynamic dimensions.*input_shapes=.*'x'"):
        from_onnx(m)
    graph, _ = from_onnx(m, {"x": (4, 2, 5, 3)})
    assert graph.tensors["y"].shape == (4, 2, 5, 3)
    with pytest.raises(GraphError, match=r"\(4, 3, 5, 3\) given for input 'x' \(--input-shape "
                       r"x=\.\.\., or from_onnx's input_shapes\) does not match"):
        from_onnx(m, {"x": (4, 3, 5, 3)})
    with pytest.raises(GraphError, match="give 4 dimensions"):
        from_onnx(m, {"x": (4, 2, 5)})
    with pytest.raises(GraphError, match="not inputs of the model"):
        from_onnx(m, {"x": (4, 2, 5, 3), "z": (1,)})


def test_external_data_must_stay_inside_model_folder(tmp_path):
    w = np.arange(18, dtype=np.float32).reshape(2, 1, 3, 3)
    m = _tiny("Conv", ["w"], [numpy_helper.from_array(w, "w")], group=2, pads=[1, 1, 1, 1])
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    onnx.save(m, model_dir / "ok.onnx", save_as_external_data=True, location="w.bin",
              size_threshold=0)
    graph, params = from_onnx(model_dir / "ok.onnx")
    np.testing.assert_array_equal(params[gemm_nodes(graph)[0].name]["kernel"], w)
    # Point the tensor at a file outside the folder.
    (tmp_path / "secret.bin").write_bytes(w.tobytes())
    m2 = onnx.load(model_dir / "ok.onnx", load_external_data=False)
    for e in m2.graph.initializer[0].external_data:
        if e.key == "location":
            e.value = "../secret.bin"
    onnx.save(m2, model_dir / "escape.onnx")
    with pytest.raises(GraphError, match="outside the model's folder"):
        from_onnx(model_dir / "escape.onnx")
    for e in m2.graph.initializer[0].external_data:
        if e.key == "location":
            e.value = str(tmp_path / "secret.bin")
    onnx.save(m2, model_dir / "absolute.onnx")
    with pytest.raises(GraphError, match="only relative paths"):
        from_onnx(model_dir / "absolute.onnx")


def test_errors_are_npujax_errors_with_exit_codes():
    assert issubclass(UnsupportedOpError, GraphError) and issubclass(GraphError, NpujaxError)


@pytest.mark.integration
def test_imported_graph_saves_and_loads(ppocr_cls, tmp_path):
    from npujax.quantize.model_file import load_graph, save_graph

    _, graph, params = ppocr_cls
    save_graph(tmp_path / "cls.npz", graph, params)
    loaded = load_graph(tmp_path / "cls.npz")
    g2, p2 = loaded[0], loaded[1]
    assert [n.op for n in g2.nodes] == [n.op for n in graph.nodes]
    x = crops(48, 192, 1, seed=9)
    y2 = jax.jit(lambda p, x: execute(g2, p, x))(p2, x)
    assert_close(y2, jax.jit(lambda p, x: execute(graph, p, x))(params, x), rtol=1e-6, atol=1e-7)


def test_parse_input_shapes_for_the_cli():
    from npujax.errors import ConfigError
    from npujax.frontends.onnx import parse_input_shapes

    assert parse_input_shapes(["x=1,3,48,192", "mask = 1,1"]) == {"x": (1, 3, 48, 192),
                                                                  "mask": (1, 1)}
    for bad in (["x"], ["x="], ["=1,2"], ["x=1,a"], ["x=1,0"], ["x=1", "x=2"]):
        with pytest.raises(ConfigError, match="input shape"):
            parse_input_shapes(bad)

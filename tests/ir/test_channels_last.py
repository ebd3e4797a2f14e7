"""channels_last: an NCHW ONNX graph rewritten to NHWC computes the same function on the
transposed input, checked against onnxruntime, and loses its input layout conversion on an
NHWC preset."""

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from npujax.errors import GraphError
from npujax.frontends.onnx import from_onnx
from npujax.hw import load_npu_spec
from npujax.ir.execute import execute
from npujax.ir.passes import channels_last, optimize
from npujax.plan.workload import workloads
from tests.helpers import assert_close
from tests.onnx_models import ort_run


def _model(tail: str = "gap"):
    """Conv+BN+Relu -> [Conv 1x1 | MaxPool] -> Concat -> Add(self) -> AveragePool -> GAP ->
    Flatten -> Gemm (GoogLeNet/SqueezeNet's operators), or a spatial Reshape at the end."""
    rng = np.random.default_rng(0)

    def init(name, *shape):
        return numpy_helper.from_array(rng.normal(size=shape).astype(np.float32), name)

    inits = [init("k1", 4, 3, 3, 3), init("b1", 4), init("k2", 5, 4, 1, 1),
             init("s", 4), init("o", 4), init("m", 4), numpy_helper.from_array(
                 rng.uniform(0.5, 1.5, 4).astype(np.float32), "v"),
             init("w", 6, 9), init("g", 6), numpy_helper.from_array(
                 np.array([1, -1], np.int64), "shape")]
    nodes = [
        helper.make_node("Conv", ["x", "k1", "b1"], ["c1"], pads=[1, 1, 1, 1], name="conv1"),
        helper.make_node("BatchNormalization", ["c1", "s", "o", "m", "v"], ["bn"], name="bn"),
        helper.make_node("Relu", ["bn"], ["r"], name="relu"),
        helper.make_node("Conv", ["r", "k2"], ["c2"], strides=[2, 2], name="conv2"),
        helper.make_node("MaxPool", ["r"], ["p"], kernel_shape=[2, 2], strides=[2, 2],
                         name="pool"),
        helper.make_node("Concat", ["c2", "p"], ["cat"], axis=1, name="cat"),
        helper.make_node("Add", ["cat", "cat"], ["add"], name="add"),
        helper.make_node("AveragePool", ["add"], ["ap"], kernel_shape=[3, 3], pads=[1, 1, 1, 1],
                         name="avg"),
    ]
    if tail == "gap":
        nodes += [helper.make_node("GlobalAveragePool", ["ap"], ["gp"], name="gap"),
                  helper.make_node("Flatten", ["gp"], ["fl"], axis=1, name="flat"),
                  helper.make_node("Gemm", ["fl", "w", "g"], ["y"], transB=1, name="fc")]
        out = [1, 6]
    else:  # flattening a 3x4 spatial map depends on the layout
        nodes += [helper.make_node("Reshape", ["ap", "shape"], ["y"], name="reshape")]
        out = [1, 108]
    graph = helper.make_graph(nodes, "nchw", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, [1, 3, 6, 8])], [helper.make_tensor_value_info(
            "y", TensorProto.FLOAT, out)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.fixture(scope="module")
def converted():
    model = _model()
    graph, params = optimize(*from_onnx(model))
    return model, graph, params, channels_last(graph, params)


def test_channels_last_computes_the_same_on_the_transposed_input(converted):
    model, graph, params, (g2, p2) = converted
    assert g2.tensors["x"].shape == (1, 6, 8, 3)
    ops = {n.name: n for n in g2.nodes}
    assert ops["conv1"].attrs["data_layout"] == "NHWC"
    assert ops["cat"].attrs["axis"] == 3
    assert ops["gap"].op == "AveragePool" and ops["gap"].attrs["window"] == [1, 3, 4, 1]
    x = np.random.default_rng(1).normal(size=(1, 3, 6, 8)).astype(np.float32)
    want = ort_run(model.SerializeToString(), {"x": x})[0]
    assert_close(execute(graph, params, x), want, atol=1e-4)
    assert_close(execute(g2, p2, x.transpose(0, 2, 3, 1)), want, atol=1e-4)


def test_channels_last_drops_the_input_layout_conversion_on_an_nhwc_npu(converted):
    _, graph, _, (g2, _) = converted
    spec = load_npu_spec("coral_edgetpu")
    assert spec.layout.activation_layout == "NHWC"
    before, after = workloads(graph, spec), workloads(g2, spec)
    assert [w.op for w in before if w.kind == "layout"] == ["ToNHWC"]
    assert [w.op for w in after if w.kind == "layout"] == []
    # the same layers and MACs otherwise
    assert [w.name for w in after] == [w.name for w in before if w.kind != "layout"]
    assert sum(w.macs for w in after) == sum(w.macs for w in before)


def test_channels_last_refuses_a_layout_dependent_reshape_and_keeps_nhwc_graphs():
    graph, params = optimize(*from_onnx(_model(tail="reshape")))
    with pytest.raises(GraphError, match="reshape"):
        channels_last(graph, params)
    g2, _ = channels_last(*optimize(*from_onnx(_model())))
    assert channels_last(g2, {})[0] is g2  # nothing NCHW left: unchanged


def test_channels_last_rewrites_a_conv_transpose_and_a_detection_heads_transpose():
    """A U-Net's ConvTranspose (TensorFlow's SAME crop: pads 0 before, 1 after, and a bias)
    runs NHWC, and an SSD head's NCHW -> NHWC Transpose before its Reshape becomes an
    Identity: the same numbers as onnxruntime on the transposed input, and the NHWC graph
    exports back to an ONNX model that onnxruntime runs alike."""
    from npujax.backends.onnx_export import to_onnx

    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.normal(size=s).astype(np.float32), n) for n, s in
             (("k", (4, 3, 3, 3)), ("kt", (4, 5, 3, 3)), ("bt", (5,)))]
    inits.append(numpy_helper.from_array(np.array([1, -1, 5], np.int64), "shape"))
    nodes = [helper.make_node("Conv", ["x", "k"], ["c"], pads=[1, 1, 1, 1], name="conv"),
             helper.make_node("ConvTranspose", ["c", "kt", "bt"], ["u"], strides=[2, 2],
                              pads=[0, 0, 1, 1], name="up"),
             helper.make_node("Transpose", ["u"], ["t"], perm=[0, 2, 3, 1], name="t"),
             helper.make_node("Reshape", ["t", "shape"], ["y"], name="r")]
    model = helper.make_model(helper.make_graph(
        nodes, "head", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 4, 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 96, 5])], inits),
        opset_imports=[helper.make_opsetid("", 13)])
    g2, p2 = channels_last(*optimize(*from_onnx(model)))
    ops = {n.name: n for n in g2.nodes}
    assert ops["up"].attrs["data_layout"] == "NHWC" and ops["t"].op == "Identity"
    x = np.random.default_rng(1).normal(size=(1, 3, 4, 6)).astype(np.float32)
    want = ort_run(model.SerializeToString(), {"x": x})[0]
    xt = x.transpose(0, 2, 3, 1)
    assert_close(execute(g2, p2, xt), want, atol=1e-4)
    back = to_onnx(g2, p2, dynamic_batch=False)
    assert_close(ort_run(back.SerializeToString(), {back.graph.input[0].name: xt})[0], want,
                 atol=1e-4)

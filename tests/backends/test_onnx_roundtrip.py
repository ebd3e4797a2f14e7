"""ONNX round trips that other tools accept: a symbolic batch that onnxruntime runs at any
batch, the model's input/output names, full value_info, Transposes only where the layout
changes, and a re-import that lowers like the traced graph (Conv+ReLU fusion kept)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from npujax.backends.onnx_export import to_onnx
from npujax.frontends.onnx import from_onnx
from npujax.ir.execute import execute
from npujax.ir.passes import absorb_transposes, optimize
from npujax.plan import lower
from npujax.quantize.calibrate import calibrate
from npujax.quantize.spec import quant_spec
from tests.helpers import assert_close
from tests.onnx_models import ort_run


@pytest.fixture(scope="module")
def digits():
    import jax
    from flax import nnx

    from npujax.frontends.flax import trace_flax
    from npujax.models.cnn import DigitsCNN

    with jax.numpy_dtype_promotion("standard"):  # flax's avg_pool divides by an int
        m = DigitsCNN(rngs=nnx.Rngs(0), width=4, hidden=16)
        x = np.random.default_rng(0).uniform(size=(7, 8, 8, 1)).astype(np.float32)
        graph, params = optimize(*trace_flax(m, x[:1]))
    return graph, params, x


def test_export_names_symbolic_batch_value_info_and_no_layout_noise(digits):
    graph, params, x = digits
    model = to_onnx(graph, params)
    g = model.graph
    assert [i.name for i in g.input] == ["x"] and [o.name for o in g.output] == ["output"]
    for v in (*g.input, *g.output):
        assert v.type.tensor_type.shape.dim[0].dim_param == "batch"
    # every intermediate tensor has a shape-inferred type (batch symbolic)
    typed = {v.name for v in g.value_info}
    outs = {t for n in g.node for t in n.output} - {"output"}
    assert outs <= typed
    assert all(v.type.tensor_type.shape.dim[0].dim_param == "batch" for v in g.value_info)
    # one Transpose into NCHW after the input, one back before the NHWC flatten; none around
    # each conv and pool
    ops = [n.op_type for n in g.node]
    assert ops.count("Transpose") == 2, ops
    assert ops[0] == "Transpose" and ops[ops.index("Reshape") - 1] == "Transpose"
    data = model.SerializeToString()
    for b in (1, 7):  # onnxruntime runs the one export at any batch
        assert_close(ort_run(data, {"x": x[:b]})[0], execute(graph, params, x[:b]), atol=1e-5)


def test_qdq_export_runs_at_batch_7(digits):
    graph, params, x = digits
    q = quant_spec(graph)
    qstate = calibrate(graph, params, [x], q)
    model = to_onnx(graph, params, q, qstate, int32_bias=False, requantize_outputs=False)
    assert [n.op_type for n in model.graph.node].count("Transpose") == 2
    got = ort_run(model.SerializeToString(), {"x": x}, disable_optimizations=True)[0]
    assert_close(got, execute(graph, params, x, quant=q, qstate=qstate), atol=1e-4)


def test_round_trip_lowers_like_the_traced_graph(digits, tmp_path):
    from npujax.hw import load_npu_spec

    graph, params, _ = digits
    spec = load_npu_spec("tpu_v1")
    to_onnx(graph, params, path=tmp_path / "m.onnx")
    g2, _ = optimize(*from_onnx(tmp_path / "m.onnx"))  # batch symbolic: imported at 1
    direct, back = lower(graph, spec), lower(g2, spec)
    assert abs(back.latency_s / direct.latency_s - 1) < 0.02
    assert [n.op for n in g2.nodes] == [n.op for n in graph.nodes]
    convs = [n for n in g2.nodes if n.op == "Conv"]
    assert convs and all(n.attrs.get("epilogue") == ("Relu",) for n in convs)
    # layers.csv: rounded cells (no 142.77777099609375 cycles), units in the column names
    from npujax.report import write_layers_csv

    write_layers_csv(tmp_path / "layers.csv", back)
    import csv

    rows = list(csv.DictReader((tmp_path / "layers.csv").read_text().splitlines()))
    assert "latency_cycles" in rows[0] and "latency_s" in rows[0]
    for row in rows:
        for col, v in row.items():
            if col.endswith("_cycles"):
                assert len(v.partition(".")[2]) <= 1, (col, v)  # 0.1 cycle
            elif v and v[0].isdigit():
                assert float(v) == float(f"{float(v):.6g}"), (col, v)  # 6 significant digits


def test_absorb_transposes_of_old_style_exports():
    """NHWC -> NCHW -> Conv -> NHWC pairs around every conv/pool (older exporters) vanish at
    import; the function is unchanged."""
    rng = np.random.default_rng(0)
    k = numpy_helper.from_array(rng.normal(size=(4, 2, 3, 3)).astype(np.float32), "k")
    to_nchw, to_nhwc = [0, 3, 1, 2], [0, 2, 3, 1]
    nodes = [
        helper.make_node("Transpose", ["x"], ["a"], perm=to_nchw, name="t1"),
        helper.make_node("Conv", ["a", "k"], ["b"], pads=[1, 1, 1, 1], name="conv"),
        helper.make_node("Transpose", ["b"], ["c"], perm=to_nhwc, name="t2"),
        helper.make_node("Relu", ["c"], ["d"], name="relu"),
        helper.make_node("Transpose", ["d"], ["e"], perm=to_nchw, name="t3"),
        helper.make_node("MaxPool", ["e"], ["f"], kernel_shape=[2, 2], strides=[2, 2],
                         name="pool"),
        helper.make_node("Transpose", ["f"], ["g"], perm=to_nhwc, name="t4"),
        helper.make_node("Relu", ["g"], ["y"], name="relu2"),
    ]
    g = helper.make_graph(nodes, "old", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, [1, 6, 6, 2])], [helper.make_tensor_value_info(
            "y", TensorProto.FLOAT, [1, 3, 3, 4])], [k])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    graph, params = from_onnx(model)
    absorbed, _ = absorb_transposes(graph, params)
    assert [n.op for n in absorbed.nodes] == ["Conv", "Relu", "MaxPool", "Relu"]
    assert absorbed.node("conv").attrs["data_layout"] == "NHWC"
    xv = rng.normal(size=(1, 6, 6, 2)).astype(np.float32)
    assert_close(execute(absorbed, params, xv), execute(graph, params, xv))
    assert_close(execute(absorbed, params, xv), ort_run(model.SerializeToString(), {"x": xv})[0],
                 atol=1e-5)
    onnx.checker.check_model(model)


def test_export_keeps_the_model_layer_names(digits, tmp_path):
    """The ONNX nodes of the layers carry the graph's names (not ``conv1_1``), so a re-imported
    model's layers are the model's: ``--weight-bits fc1=4`` and saved policies still match."""
    graph, params, _ = digits
    model = to_onnx(graph, params, path=tmp_path / "m.onnx")
    names = {n.name for n in model.graph.node}
    layers = [n.name for n in graph.nodes if n.params]
    assert layers and set(layers) <= names, sorted(names)
    g2, _ = optimize(*from_onnx(tmp_path / "m.onnx"))
    assert [n.name for n in g2.nodes] == [n.name for n in graph.nodes]


@pytest.mark.parametrize("requantize_outputs", [False, True])
def test_qdq_round_trip_lowers_like_the_quantized_graph(digits, tmp_path, requantize_outputs):
    """A quantized export (activation QuantizeLinear -> DequantizeLinear pairs) re-imported
    lowers like the graph it came from: each pair is the grid of an integer tensor the NPU
    already holds, not a host-CPU layer (before: 8.6x the latency, every Q and DQ on the CPU)."""
    from npujax.hw import load_npu_spec

    graph, params, x = digits
    spec = load_npu_spec("tpu_v1")
    q = quant_spec(graph)
    qstate = calibrate(graph, params, [x], q)
    to_onnx(graph, params, q, qstate, path=tmp_path / "q.onnx",
            requantize_outputs=requantize_outputs)
    g2, _ = optimize(*from_onnx(tmp_path / "q.onnx"))
    direct, back = lower(graph, spec, q), lower(g2, spec, quant_spec(g2))
    assert abs(back.latency_s / direct.latency_s - 1) < 0.02, (direct.latency_s, back.latency_s)
    assert all(r.device == "npu" for r in back.layers), [(r.name, r.reason) for r in back.layers]
    assert not any(r.op in ("QuantizeLinear", "DequantizeLinear") for r in back.layers)
    convs = [n for n in g2.nodes if n.op == "Conv"]
    assert convs and all(n.attrs.get("epilogue") == ("Relu",) for n in convs)

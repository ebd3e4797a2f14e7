"""A YOLOv8-style detection head (issue 28, item 1): anchors computed from feature-map shapes
(Shape -> Gather -> Cast -> Range), folded at import, and the DFL box decoding, vs onnxruntime.

The graph is what ultralytics' ``Detect`` head exports (``make_anchors``, ``DFL``,
``dist2bbox``) when the anchors are not baked in, as in the nudenet YOLOv8n detector: every
anchor tensor is a constant once the input shape is fixed, but ONNX shape inference alone cannot
size a float ``Range``'s output.
"""

from __future__ import annotations

import jax
import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

from npujax.errors import GraphError, LimitError
from npujax.frontends.onnx import from_onnx
from npujax.ir.execute import execute
from npujax.limits import limits
from tests.helpers import assert_close
from tests.onnx_models import ort_run

REG_MAX, NC = 16, 2  # DFL bins per box side, classes
NO = 4 * REG_MAX + NC  # outputs per anchor


def _c(name: str, value, dtype=np.int64) -> onnx.TensorProto:
    return nh.from_array(np.asarray(value, dtype), name)


def _model(nodes, inits, x_shape, opset=17) -> onnx.ModelProto:
    g = h.make_graph(nodes, "head", [h.make_tensor_value_info("x", T.FLOAT, x_shape)],
                     [h.make_tensor_value_info("y", T.FLOAT, None)], inits)
    return h.make_model(g, opset_imports=[h.make_opsetid("", opset)])


def _minimal(start=0.0, delta=1.0) -> onnx.ModelProto:
    """The issue's minimal case: Conv -> Shape -> Gather -> Cast -> Range -> Add."""
    nodes = [h.make_node("Conv", ["x", "w"], ["c"]),
             h.make_node("Shape", ["c"], ["s"]),
             h.make_node("Gather", ["s", "i3"], ["wd"], axis=0),
             h.make_node("Cast", ["wd"], ["wf"], to=T.FLOAT),
             h.make_node("Range", ["start", "wf", "delta"], ["r"]),
             h.make_node("ReduceSum", ["r"], ["rs"], keepdims=0),
             h.make_node("Add", ["c", "rs"], ["y"])]
    inits = [nh.from_array(np.ones((4, 3, 1, 1), np.float32), "w"), _c("i3", 3),
             _c("start", start, np.float32), _c("delta", delta, np.float32)]
    return _model(nodes, inits, [1, 3, 4, 6])


def _level(i: int, stride: int) -> tuple[list, list]:
    """One pyramid level: the feature convs (box + class branches, concatenated), its anchors
    and strides as ``make_anchors`` exports them, and its ``[1, NO, h*w]`` view."""
    p = f"l{i}"
    rng = np.random.default_rng(i)
    wb = (rng.normal(size=(4 * REG_MAX, 3, 3, 3)) * 0.3).astype(np.float32)
    wc = (rng.normal(size=(NC, 3, 3, 3)) * 0.3).astype(np.float32)
    conv = dict(strides=[stride, stride], pads=[1, 1, 1, 1])
    nodes = [
        h.make_node("Conv", ["x", f"{p}.wb"], [f"{p}.box"], **conv),
        h.make_node("Conv", ["x", f"{p}.wc"], [f"{p}.cls"], **conv),
        h.make_node("Concat", [f"{p}.box", f"{p}.cls"], [f"{p}.f"], axis=1),
        # _, _, h, w = feats[i].shape
        h.make_node("Shape", [f"{p}.f"], [f"{p}.shape"]),
        h.make_node("Gather", [f"{p}.shape", "i2"], [f"{p}.h"], axis=0),
        h.make_node("Gather", [f"{p}.shape", "i3"], [f"{p}.w"], axis=0),
        h.make_node("Cast", [f"{p}.h"], [f"{p}.hf"], to=T.FLOAT),
        h.make_node("Cast", [f"{p}.w"], [f"{p}.wf"], to=T.FLOAT),
        # sx = arange(w) + 0.5; sy = arange(h) + 0.5
        h.make_node("Range", ["zero", f"{p}.wf", "one"], [f"{p}.rx"]),
        h.make_node("Range", ["zero", f"{p}.hf", "one"], [f"{p}.ry"]),
        h.make_node("Add", [f"{p}.rx", "half"], [f"{p}.sx"]),
        h.make_node("Add", [f"{p}.ry", "half"], [f"{p}.sy"]),
        # sy, sx = meshgrid(sy, sx, indexing="ij")
        h.make_node("Unsqueeze", [f"{p}.h", "ax0"], [f"{p}.h1"]),
        h.make_node("Unsqueeze", [f"{p}.w", "ax0"], [f"{p}.w1"]),
        h.make_node("Concat", [f"{p}.h1", f"{p}.w1"], [f"{p}.hw"], axis=0),
        h.make_node("Reshape", [f"{p}.sy", "col"], [f"{p}.sy2"]),
        h.make_node("Reshape", [f"{p}.sx", "row"], [f"{p}.sx2"]),
        h.make_node("Expand", [f"{p}.sy2", f"{p}.hw"], [f"{p}.gy"]),
        h.make_node("Expand", [f"{p}.sx2", f"{p}.hw"], [f"{p}.gx"]),
        # stack((sx, sy), -1).view(-1, 2)
        h.make_node("Unsqueeze", [f"{p}.gx", "axm1"], [f"{p}.gx3"]),
        h.make_node("Unsqueeze", [f"{p}.gy", "axm1"], [f"{p}.gy3"]),
        h.make_node("Concat", [f"{p}.gx3", f"{p}.gy3"], [f"{p}.xy"], axis=-1),
        h.make_node("Reshape", [f"{p}.xy", "pairs"], [f"{p}.anchors"]),
        # full((h * w, 1), stride)
        h.make_node("Mul", [f"{p}.h", f"{p}.w"], [f"{p}.n"]),
        h.make_node("Unsqueeze", [f"{p}.n", "ax0"], [f"{p}.n1"]),
        h.make_node("Concat", [f"{p}.n1", "one_i"], [f"{p}.sshape"], axis=0),
        h.make_node("ConstantOfShape", [f"{p}.sshape"], [f"{p}.strides"],
                    value=nh.from_array(np.array([stride], np.float32))),
        # xi.view(shape[0], no, -1)
        h.make_node("Gather", [f"{p}.shape", "i0"], [f"{p}.b"], axis=0),
        h.make_node("Unsqueeze", [f"{p}.b", "ax0"], [f"{p}.b1"]),
        h.make_node("Concat", [f"{p}.b1", "no", "minus1"], [f"{p}.vshape"], axis=0),
        h.make_node("Reshape", [f"{p}.f", f"{p}.vshape"], [f"{p}.v"]),
    ]
    return nodes, [nh.from_array(wb, f"{p}.wb"), nh.from_array(wc, f"{p}.wc")]


def yolov8_head(hw: int = 32, strides=(8, 16)) -> onnx.ModelProto:
    """Detect's inference path: ``y = cat(dist2bbox(DFL(box), anchors) * strides,
    sigmoid(cls))``, ``[1, 4 + NC, anchors]``."""
    nodes, inits = [], []
    for i, s in enumerate(strides):
        n, w = _level(i, s)
        nodes += n
        inits += w
    levels = range(len(strides))
    dfl = np.arange(REG_MAX, dtype=np.float32).reshape(1, REG_MAX, 1, 1)
    nodes += [
        # anchors, strides = (x.transpose(0, 1) for x in make_anchors(...))
        h.make_node("Concat", [f"l{i}.anchors" for i in levels], ["anchors"], axis=0),
        h.make_node("Concat", [f"l{i}.strides" for i in levels], ["strides"], axis=0),
        h.make_node("Transpose", ["anchors"], ["anchors_t"], perm=[1, 0]),
        h.make_node("Transpose", ["strides"], ["strides_t"], perm=[1, 0]),
        h.make_node("Unsqueeze", ["anchors_t", "ax0"], ["anchors_b"]),
        # x_cat = cat([xi.view(b, no, -1)], 2); box, cls = x_cat.split((4 * reg_max, nc), 1)
        h.make_node("Concat", [f"l{i}.v" for i in levels], ["xcat"], axis=2),
        h.make_node("Split", ["xcat", "split"], ["box", "cls"], axis=1),
        # DFL: conv(x.view(b, 4, c1, a).transpose(2, 1).softmax(1)).view(b, 4, a)
        h.make_node("Reshape", ["box", "dfl_shape"], ["box4"]),
        h.make_node("Transpose", ["box4"], ["box_t"], perm=[0, 2, 1, 3]),
        h.make_node("Softmax", ["box_t"], ["prob"], axis=1),
        h.make_node("Conv", ["prob", "dfl_w"], ["dist4"]),
        h.make_node("Reshape", ["dist4", "dist_shape"], ["dist"]),
        # dist2bbox(xywh=True, dim=1)
        h.make_node("Split", ["dist", "two_two"], ["lt", "rb"], axis=1),
        h.make_node("Sub", ["anchors_b", "lt"], ["x1y1"]),
        h.make_node("Add", ["anchors_b", "rb"], ["x2y2"]),
        h.make_node("Add", ["x1y1", "x2y2"], ["s"]),
        h.make_node("Div", ["s", "two"], ["cxy"]),
        h.make_node("Sub", ["x2y2", "x1y1"], ["wh"]),
        h.make_node("Concat", ["cxy", "wh"], ["dbox0"], axis=1),
        h.make_node("Mul", ["dbox0", "strides_t"], ["dbox"]),
        h.make_node("Sigmoid", ["cls"], ["scores"]),
        h.make_node("Concat", ["dbox", "scores"], ["y"], axis=1),
    ]
    inits += [
        _c("i0", 0), _c("i2", 2), _c("i3", 3), _c("ax0", [0]), _c("axm1", [-1]),
        _c("col", [-1, 1]), _c("row", [1, -1]), _c("pairs", [-1, 2]), _c("one_i", [1]),
        _c("no", [NO]), _c("minus1", [-1]), _c("split", [4 * REG_MAX, NC]),
        _c("dfl_shape", [1, 4, REG_MAX, -1]), _c("dist_shape", [1, 4, -1]), _c("two_two", [2, 2]),
        _c("zero", 0.0, np.float32), _c("one", 1.0, np.float32), _c("half", 0.5, np.float32),
        _c("two", 2.0, np.float32), nh.from_array(dfl, "dfl_w"),
    ]
    return _model(nodes, inits, [1, 3, hw, hw])


def test_yolov8_head_imports_strictly_and_matches_onnxruntime():
    m = yolov8_head()
    graph, params = from_onnx(m)  # strict: no CPU-fallback node
    assert "CpuFallback" not in {n.op for n in graph.nodes}
    anchors = graph.constants["anchors_b"]  # folded: 4x4 + 2x2 anchor centres
    assert anchors.shape == (1, 2, 20)
    np.testing.assert_array_equal(anchors[0, :, :4], [[0.5, 1.5, 2.5, 3.5], [0.5] * 4])
    x = np.random.default_rng(0).normal(size=(1, 3, 32, 32)).astype(np.float32)
    (ref,) = ort_run(m.SerializeToString(), {"x": x})
    y = np.asarray(jax.jit(lambda p, v: execute(graph, p, v))(params, x))  # one program
    assert y.shape == ref.shape == (1, 4 + NC, 20)
    assert_close(y, ref, rtol=1e-5, atol=1e-5)


def test_range_is_sized_by_its_folded_values():
    graph, params = from_onnx(_minimal())
    assert graph.constants["rs"] == 15.0  # sum(range(6))
    m = _minimal(start=0.5, delta=2.0)  # ceil((6 - 0.5) / 2) = 3 elements
    graph, params = from_onnx(m)
    assert graph.constants["rs"] == 0.5 + 2.5 + 4.5
    x = np.random.default_rng(0).normal(size=(1, 3, 4, 6)).astype(np.float32)
    (ref,) = ort_run(m.SerializeToString(), {"x": x})
    assert_close(execute(graph, params, x), ref)


@pytest.mark.parametrize("start, delta", [(0.0, -1.0), (7.0, 1.0)])
def test_an_empty_range_folds_to_nothing(start, delta):
    graph, _ = from_onnx(_minimal(start, delta))
    assert graph.constants["rs"].shape == () and graph.constants["rs"] == 0


def test_a_huge_range_is_still_refused_before_folding():
    """The bomb guard: a Range's length comes from its values, and one too large is refused
    before anything is allocated."""
    with pytest.raises(LimitError, match="'r'.*Range"):
        from_onnx(_minimal(delta=1e-9))  # 6e9 float32 elements
    with limits(max_tensor_bytes="1KiB"), pytest.raises(LimitError, match="'r'"):
        from_onnx(_minimal(delta=0.01))  # 600 elements, 2,400 bytes


@pytest.mark.parametrize("start, limit, delta, error", [
    (-2**62, 2**62, 1, LimitError),  # limit - start overflows int64 in C++: counted exactly
    (0, 4, 0, GraphError),  # ONNX Range needs a non-zero delta
])
def test_integer_range_bounds_are_checked_exactly(start, limit, delta, error):
    nodes = [h.make_node("Range", ["a", "b", "d"], ["r"]),
             h.make_node("ReduceSum", ["r"], ["rs"], keepdims=0),
             h.make_node("Cast", ["rs"], ["rf"], to=T.FLOAT),
             h.make_node("Add", ["x", "rf"], ["y"])]
    m = _model(nodes, [_c("a", start), _c("b", limit), _c("d", delta)], [2])
    with pytest.raises(error, match="Range"):
        from_onnx(m)

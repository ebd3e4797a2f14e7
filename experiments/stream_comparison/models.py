"""Small float ONNX models built only from operators Stream 2.1.1 parses (Conv, Relu, Add)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def _conv(nodes, inits, name, x, y, cin, cout, k=3, stride=1):
    w = np.random.default_rng(len(inits)).normal(0, 0.1, (cout, cin, k, k)).astype(np.float32)
    inits.append(numpy_helper.from_array(w, f"{name}_w"))
    nodes.append(helper.make_node("Conv", [x, f"{name}_w"], [y], name=name, kernel_shape=[k, k],
                                  pads=[k // 2] * 4, strides=[stride, stride]))


def _save(nodes, inits, shape, out_shape, path):
    g = helper.make_graph(nodes, Path(path).stem,
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, out_shape)],
                          inits)
    m = onnx.shape_inference.infer_shapes(
        helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]))
    onnx.save(m, path)
    return path


def conv_chain(path, hw=64):
    """conv3x3 16->16 + ReLU, conv3x3 16->32 + ReLU, conv3x3 32->16 at hw x hw."""
    nodes, inits = [], []
    _conv(nodes, inits, "c1", "x", "t1", 16, 16)
    nodes.append(helper.make_node("Relu", ["t1"], ["t2"], name="r1"))
    _conv(nodes, inits, "c2", "t2", "t3", 16, 32)
    nodes.append(helper.make_node("Relu", ["t3"], ["t4"], name="r2"))
    _conv(nodes, inits, "c3", "t4", "y", 32, 16)
    return _save(nodes, inits, [1, 16, hw, hw], [1, 16, hw, hw], path)


def resnet_blocks(path, hw=56, width=32):
    """stem conv3x3 3->width + ReLU, then two residual blocks (conv-ReLU-conv, + skip, ReLU)."""
    nodes, inits = [], []
    _conv(nodes, inits, "stem", "x", "s0", 3, width)
    nodes.append(helper.make_node("Relu", ["s0"], ["b0"], name="stem_relu"))
    x = "b0"
    for b in (1, 2):
        _conv(nodes, inits, f"b{b}a", x, f"b{b}t", width, width)
        nodes.append(helper.make_node("Relu", [f"b{b}t"], [f"b{b}u"], name=f"b{b}relu_a"))
        _conv(nodes, inits, f"b{b}b", f"b{b}u", f"b{b}v", width, width)
        nodes.append(helper.make_node("Add", [x, f"b{b}v"], [f"b{b}s"], name=f"b{b}add"))
        y = "y" if b == 2 else f"b{b}o"
        nodes.append(helper.make_node("Relu", [f"b{b}s"], [y], name=f"b{b}relu"))
        x = y
    return _save(nodes, inits, [1, 3, hw, hw], [1, width, hw, hw], path)

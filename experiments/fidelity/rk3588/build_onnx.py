"""Build the ONNX rows of ``table.csv`` that npujax cannot build otherwise (no torch needed).

``resnet50-v2-7`` of the ONNX model zoo (the RKNN model zoo's ResNet row) is MXNet Gluon's
``resnet50_v2`` (He et al., "Identity Mappings in Deep Residual Networks", ECCV 2016: the
pre-activation ResNet): a BatchNorm without scale or shift on the input, a 7x7/2 convolution
of 64 channels, BatchNorm, ReLU, a 3x3/2 max pool, then stages of 3, 4, 6 and 3 bottleneck
blocks of 256, 512, 1024 and 2048 channels (the first block of stages 2-4 strides by 2 in its
3x3 convolution; the first block of each stage has a 1x1 projection shortcut, taken after the
block's pre-activation), a final BatchNorm and ReLU, global average pooling and a 1000-way
Dense. Each block is ``BN, ReLU, 1x1 (C/4), BN, ReLU, 3x3 (C/4, stride), BN, ReLU, 1x1 (C)``
plus the shortcut; convolutions have no bias (Gluon's ``use_bias=False``). 25.5 M parameters,
4.1 G MACs at 224 x 224, as the model zoo's card. keras.applications' ResNet50V2 is the same
design with the stride in the *last* block of each stage (3.5 G MACs), which is why it is not
used for this row.

Weights are random (``numpy.random.default_rng(0)``): only the architecture matters for time.
The file is written next to this script in ``onnx/`` (not in git, about 100 MB)::

    python experiments/fidelity/rk3588/build_onnx.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
OUT = HERE / "onnx" / "resnet50_v2.onnx"


def resnet50_v2(path: Path, hw: int = 224) -> Path:
    """Write Gluon's ``resnet50_v2`` (the docstring's layers) as an ONNX file, opset 13,
    input ``data`` ``[1, 3, hw, hw]`` float32, random weights; returns ``path``."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    nodes, inits = [], []
    count = {"n": 0}

    def name(kind: str) -> str:
        count["n"] += 1
        return f"{kind}{count['n']}"

    def const(arr: np.ndarray) -> str:
        n = name("w")
        inits.append(numpy_helper.from_array(arr.astype(np.float32), n))
        return n

    def conv(x: str, cin: int, cout: int, k: int, stride: int = 1) -> str:
        w = const(rng.standard_normal((cout, cin, k, k)) * np.sqrt(2.0 / (cin * k * k)))
        y = name("conv")
        nodes.append(helper.make_node("Conv", [x, w], [y], kernel_shape=[k, k],
                                      strides=[stride, stride], pads=[k // 2] * 4))
        return y

    def bn(x: str, c: int, affine: bool = True) -> str:
        g = const(rng.uniform(0.5, 1.5, c) if affine else np.ones(c))
        b = const(rng.uniform(-0.1, 0.1, c) if affine else np.zeros(c))
        m, v = const(np.zeros(c)), const(np.ones(c))
        y = name("bn")
        nodes.append(helper.make_node("BatchNormalization", [x, g, b, m, v], [y],
                                      epsilon=1e-5))
        return y

    def relu(x: str) -> str:
        y = name("relu")
        nodes.append(helper.make_node("Relu", [x], [y]))
        return y

    x = bn("data", 3, affine=False)
    x = relu(bn(conv(x, 3, 64, 7, 2), 64))
    y = name("pool")
    nodes.append(helper.make_node("MaxPool", [x], [y], kernel_shape=[3, 3], strides=[2, 2],
                                  pads=[1, 1, 1, 1]))
    x, cin = y, 64
    for stage, (blocks, cout) in enumerate(zip((3, 4, 6, 3), (256, 512, 1024, 2048))):
        mid = cout // 4
        for b in range(blocks):
            stride = 2 if b == 0 and stage > 0 else 1
            pre = relu(bn(x, cin))
            short = conv(pre, cin, cout, 1, stride) if b == 0 else x
            h = relu(bn(conv(pre, cin, mid, 1), mid))
            h = relu(bn(conv(h, mid, mid, 3, stride), mid))
            h = conv(h, mid, cout, 1)
            y = name("add")
            nodes.append(helper.make_node("Add", [h, short], [y]))
            x, cin = y, cout
    x = relu(bn(x, cin))
    g, f = name("gap"), name("flat")
    nodes.append(helper.make_node("GlobalAveragePool", [x], [g]))
    nodes.append(helper.make_node("Flatten", [g], [f], axis=1))
    w = const(rng.standard_normal((cin, 1000)) / np.sqrt(cin))
    bias = const(np.zeros(1000))
    nodes.append(helper.make_node("Gemm", [f, w, bias], ["logits"]))
    graph = helper.make_graph(
        nodes, "resnet50_v2", [helper.make_tensor_value_info("data", TensorProto.FLOAT,
                                                             [1, 3, hw, hw])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 1000])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    onnx.checker.check_model(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))
    return path


def main() -> int:
    p = resnet50_v2(OUT)
    print(f"wrote {p} ({p.stat().st_size / 1e6:.1f} MB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

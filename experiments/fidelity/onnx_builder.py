"""A small ONNX graph writer for the fidelity scripts that build architectures without torch.

Used by ``rk3588/build_onnx.py`` (Gluon's ResNet-50 v2, YOLOv5) and ``coral_build_onnx.py``
(the Coral table's U-Net, SSD and DeepLab rows). Weights are random
(``numpy.random.default_rng(0)``): only the architecture matters for time. ``onnx`` is
imported only when a node or file is written.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np


def same_pads(size: int, k: int, stride: int, dilation: int = 1) -> tuple[int, int]:
    """TensorFlow's ``SAME`` padding of one spatial axis: ``(before, after)``, the odd pixel
    after (bottom/right), output ``ceil(size / stride)``."""
    out = -(-size // stride)
    total = max((out - 1) * stride + (k - 1) * dilation + 1 - size, 0)
    return total // 2, total - total // 2


class Builder:
    """An ONNX graph under construction: nodes, initializers (random, ``default_rng(0)``) and
    fresh tensor names."""

    def __init__(self) -> None:
        self.rng = np.random.default_rng(0)
        self.nodes: list = []
        self.inits: list = []
        self.count = 0

    def name(self, kind: str) -> str:
        self.count += 1
        return f"{kind}{self.count}"

    def const(self, arr: np.ndarray) -> str:
        from onnx import numpy_helper

        n = self.name("w")
        self.inits.append(numpy_helper.from_array(arr.astype(np.float32), n))
        return n

    def int_const(self, arr) -> str:
        """An int64 initializer (shapes, axes, slice bounds)."""
        from onnx import numpy_helper

        n = self.name("i")
        self.inits.append(numpy_helper.from_array(np.asarray(arr, np.int64), n))
        return n

    def node(self, op: str, inputs: list[str], **attrs) -> str:
        from onnx import helper

        y = self.name(op.lower())
        self.nodes.append(helper.make_node(op, inputs, [y], **attrs))
        return y

    def conv(self, x: str, cin: int, cout: int, k: int, stride: int = 1, pad: int | None = None,
             bias: bool = False) -> str:
        """A ``k x k`` convolution, He-initialised weights, ``k // 2`` padding by default."""
        w = self.const(self.rng.standard_normal((cout, cin, k, k)) * np.sqrt(2.0 / (cin * k * k)))
        ins = [x, w] + ([self.const(self.rng.uniform(-0.1, 0.1, cout))] if bias else [])
        return self.node("Conv", ins, kernel_shape=[k, k], strides=[stride, stride],
                         pads=[k // 2 if pad is None else pad] * 4)

    def conv_same(self, x: str, size: int, cin: int, cout: int, k: int, stride: int = 1,
                  groups: int = 1, dilation: int = 1, bias: bool = False) -> str:
        """A ``k x k`` convolution with TensorFlow's ``SAME`` padding on a ``size x size``
        input (the odd pixel at the bottom/right, as a TFLite model pads), ``groups`` groups
        (``groups == cin == cout``: depthwise), He-initialised weights."""
        fan_in = cin // groups * k * k
        w = self.const(self.rng.standard_normal((cout, cin // groups, k, k))
                       * np.sqrt(2.0 / fan_in))
        ins = [x, w] + ([self.const(self.rng.uniform(-0.1, 0.1, cout))] if bias else [])
        lo, hi = same_pads(size, k, stride, dilation)
        return self.node("Conv", ins, kernel_shape=[k, k], strides=[stride, stride],
                         pads=[lo, lo, hi, hi], group=groups, dilations=[dilation, dilation])

    def conv_transpose_same(self, x: str, cin: int, cout: int, k: int, stride: int,
                            bias: bool = False) -> str:
        """Keras' ``Conv2DTranspose(cout, k, strides=stride, padding="same")``: output
        ``stride x`` the input; the full transposed output (``stride (n - 1) + k``) cropped by
        ``k - stride`` pixels as TensorFlow does (its forward ``SAME`` convolution pads
        ``(k - stride) // 2`` before, the rest after)."""
        w = self.const(self.rng.standard_normal((cin, cout, k, k)) * np.sqrt(2.0 / (cin * k * k)))
        ins = [x, w] + ([self.const(self.rng.uniform(-0.1, 0.1, cout))] if bias else [])
        lo = (k - stride) // 2
        hi = k - stride - lo
        return self.node("ConvTranspose", ins, kernel_shape=[k, k], strides=[stride, stride],
                         pads=[lo, lo, hi, hi])

    def bn(self, x: str, c: int, eps: float = 1e-3) -> str:
        """BatchNormalization with random scale and shift, zero mean, unit variance."""
        return self.node("BatchNormalization",
                         [x, self.const(self.rng.uniform(0.5, 1.5, c)),
                          self.const(self.rng.uniform(-0.1, 0.1, c)),
                          self.const(np.zeros(c)), self.const(np.ones(c))], epsilon=eps)

    def relu6(self, x: str) -> str:
        """ReLU6 as ONNX writes it (opset 13): ``Clip(x, 0, 6)``."""
        return self.node("Clip", [x, self.const(np.asarray(0.0)), self.const(np.asarray(6.0))])

    def save(self, path: Path, graph_name: str, inp: str, hw: int | tuple[int, int],
             outs: list[tuple[str, list[int]]], out_dtype: str = "float32") -> Path:
        """Check the model (opset 13, input ``inp`` ``[1, 3, h, w]``; ``hw`` is ``h = w`` or
        ``(h, w)``; outputs of ``out_dtype``) and write it."""
        import onnx
        from onnx import TensorProto, helper

        h, w = (hw, hw) if isinstance(hw, int) else hw
        otype = helper.np_dtype_to_tensor_dtype(np.dtype(out_dtype))
        graph = helper.make_graph(
            self.nodes, graph_name,
            [helper.make_tensor_value_info(inp, TensorProto.FLOAT, [1, 3, h, w])],
            [helper.make_tensor_value_info(o, otype, shape) for o, shape in outs],
            self.inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
        onnx.checker.check_model(model)
        path.parent.mkdir(parents=True, exist_ok=True)
        onnx.save(model, str(path))
        return path

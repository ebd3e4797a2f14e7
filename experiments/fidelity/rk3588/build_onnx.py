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

The YOLOv5 n, s, m and s-ReLU rows: :func:`yolov5` (its docstring has the layers).

Weights are random (``numpy.random.default_rng(0)``): only the architecture matters for time.
The files are written next to this script in ``onnx/`` (not in git, 250 MB in all), those
missing only::

    python experiments/fidelity/rk3588/build_onnx.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
OUT = HERE / "onnx" / "resnet50_v2.onnx"
sys.path.insert(0, str(HERE.parent))
from onnx_builder import Builder  # noqa: E402  (experiments/fidelity/onnx_builder.py)


def resnet50_v2(path: Path, hw: int = 224) -> Path:
    """Write Gluon's ``resnet50_v2`` (the docstring's layers) as an ONNX file, opset 13,
    input ``data`` ``[1, 3, hw, hw]`` float32, random weights; returns ``path``."""
    g = Builder()

    def bn(x: str, c: int, affine: bool = True) -> str:
        scale = g.const(g.rng.uniform(0.5, 1.5, c) if affine else np.ones(c))
        shift = g.const(g.rng.uniform(-0.1, 0.1, c) if affine else np.zeros(c))
        return g.node("BatchNormalization", [x, scale, shift, g.const(np.zeros(c)),
                                             g.const(np.ones(c))], epsilon=1e-5)

    def relu(x: str) -> str:
        return g.node("Relu", [x])

    x = bn("data", 3, affine=False)
    x = relu(bn(g.conv(x, 3, 64, 7, 2), 64))
    x = g.node("MaxPool", [x], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    cin = 64
    for stage, (blocks, cout) in enumerate(zip((3, 4, 6, 3), (256, 512, 1024, 2048))):
        mid = cout // 4
        for b in range(blocks):
            stride = 2 if b == 0 and stage > 0 else 1
            pre = relu(bn(x, cin))
            short = g.conv(pre, cin, cout, 1, stride) if b == 0 else x
            h = relu(bn(g.conv(pre, cin, mid, 1), mid))
            h = relu(bn(g.conv(h, mid, mid, 3, stride), mid))
            x, cin = g.node("Add", [g.conv(h, mid, cout, 1), short]), cout
    x = g.node("Flatten", [g.node("GlobalAveragePool", [relu(bn(x, cin))])], axis=1)
    w = g.const(g.rng.standard_normal((cin, 1000)) / np.sqrt(cin))
    logits = g.node("Gemm", [x, w, g.const(np.zeros(1000))])
    return g.save(path, "resnet50_v2", "data", hw, [(logits, [1, 1000])])


#: YOLOv5 v6.x model scales (ultralytics/yolov5 ``models/yolov5{n,s,m}.yaml``): depth and width
#: multiples.
YOLOV5_SCALES = {"n": (0.33, 0.25), "s": (0.33, 0.50), "m": (0.67, 0.75)}


def yolov5(path: Path, scale: str, act: str = "silu", hw: int = 640) -> Path:
    """Write YOLOv5 v6.x (``yolov5{scale}.yaml``) as an ONNX file, opset 13, input ``images``
    ``[1, 3, hw, hw]``, random weights, BatchNorm folded into the convolutions' biases (as an
    export is), ``act`` ``silu`` (``x * sigmoid(x)``, as torch exports it) or ``relu`` (Rockchip's
    ``yolov5s_relu``); the outputs are the three detection convolutions (255 channels at
    strides 8, 16, 32), the box decoding being post-processing (Rockchip's export,
    github.com/airockchip/yolov5). Returns ``path``.

    The layers (the yaml's backbone and head): Conv 6x6/2, Conv 3x3/2, C3 x3, Conv 3x3/2,
    C3 x6, Conv 3x3/2, C3 x9, Conv 3x3/2, C3 x3, SPPF (5x5 max pools), then the PANet head
    (1x1 Conv, nearest 2x upsampling, Concat, C3 without shortcuts; twice up, twice down with
    3x3/2 Convs) and three 1x1 detection convolutions; repeats ``max(round(n x depth), 1)``,
    channels ``ceil(c x width / 8) x 8``. C3: two 1x1 Convs of half the channels, one through
    ``n`` bottlenecks (1x1 then 3x3, residual Add in the backbone), concatenated, a 1x1 Conv.
    """
    import math

    depth, width = YOLOV5_SCALES[scale]
    g = Builder()

    def ch(c: int) -> int:
        return int(math.ceil(c * width / 8) * 8)

    def reps(n: int) -> int:
        return max(round(n * depth), 1)

    def conv(x: str, cin: int, cout: int, k: int, s: int = 1, p: int | None = None) -> str:
        y = g.conv(x, cin, cout, k, s, p, bias=True)
        if act == "relu":
            return g.node("Relu", [y])
        return g.node("Mul", [y, g.node("Sigmoid", [y])])

    def cat(xs: list[str]) -> str:
        return g.node("Concat", xs, axis=1)

    def c3(x: str, cin: int, cout: int, n: int, shortcut: bool = True) -> str:
        c_ = cout // 2
        a = conv(x, cin, c_, 1)
        for _ in range(n):
            h = conv(conv(a, c_, c_, 1), c_, c_, 3)
            a = g.node("Add", [a, h]) if shortcut else h
        return conv(cat([a, conv(x, cin, c_, 1)]), 2 * c_, cout, 1)

    def sppf(x: str, cin: int, cout: int) -> str:
        ys = [conv(x, cin, cin // 2, 1)]
        for _ in range(3):
            ys.append(g.node("MaxPool", [ys[-1]], kernel_shape=[5, 5], strides=[1, 1],
                             pads=[2, 2, 2, 2]))
        return conv(cat(ys), 4 * (cin // 2), cout, 1)

    def up(x: str) -> str:
        return g.node("Resize", [x, "", g.const(np.asarray([1.0, 1.0, 2.0, 2.0]))],
                      mode="nearest", coordinate_transformation_mode="asymmetric",
                      nearest_mode="floor")

    c64, c128, c256, c512, c1024 = (ch(c) for c in (64, 128, 256, 512, 1024))
    x = conv("images", 3, c64, 6, 2, 2)
    x = conv(x, c64, c128, 3, 2)
    x = c3(x, c128, c128, reps(3))
    x = conv(x, c128, c256, 3, 2)
    p3 = c3(x, c256, c256, reps(6))
    x = conv(p3, c256, c512, 3, 2)
    p4 = c3(x, c512, c512, reps(9))
    x = conv(p4, c512, c1024, 3, 2)
    x = c3(x, c1024, c1024, reps(3))
    x = sppf(x, c1024, c1024)
    h10 = conv(x, c1024, c512, 1)
    x = c3(cat([up(h10), p4]), 2 * c512, c512, reps(3), shortcut=False)
    h14 = conv(x, c512, c256, 1)
    small = c3(cat([up(h14), p3]), 2 * c256, c256, reps(3), shortcut=False)
    x = conv(small, c256, c256, 3, 2)
    medium = c3(cat([x, h14]), 2 * c256, c512, reps(3), shortcut=False)
    x = conv(medium, c512, c512, 3, 2)
    large = c3(cat([x, h10]), 2 * c512, c1024, reps(3), shortcut=False)
    outs = [(g.conv(t, c, 255, 1, bias=True), [1, 255, hw // st, hw // st])
            for t, c, st in ((small, c256, 8), (medium, c512, 16), (large, c1024, 32))]
    return g.save(path, f"yolov5{scale}", "images", hw, outs)


#: the YOLOv5 files of ``table.csv``: ``{file name: (scale, activation)}``
YOLOV5_FILES = {"yolov5n.onnx": ("n", "silu"), "yolov5s.onnx": ("s", "silu"),
                "yolov5m.onnx": ("m", "silu"), "yolov5s_relu.onnx": ("s", "relu")}


def build_all() -> list[Path]:
    """Every file of ``table.csv`` that is missing, in ``onnx/``; returns those written."""
    done = []
    if not OUT.exists():
        done.append(resnet50_v2(OUT))
    for fname, (scale, act) in YOLOV5_FILES.items():
        if not (OUT.parent / fname).exists():
            done.append(yolov5(OUT.parent / fname, scale, act))
    return done


def main() -> int:
    for p in build_all():
        print(f"wrote {p} ({p.stat().st_size / 1e6:.1f} MB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Layer lists (as per-group GEMMs) of the networks used by the experiments and benchmarks.

Every layer is ``(name, M, K, N, groups, in_elems)`` with ``M = batch x out_h x out_w``,
``K = C_in/groups x k_h x k_w``, ``N = C_out/groups`` (conv after im2col, see
``npujax.systolic.conv_gemm_shape``) and ``in_elems`` the distinct input elements per group
(``batch x H x W x C_in/groups`` for a conv, ``M x K`` for a GEMM) for the memory model.
Batch 1, 224 x 224 inputs for the CNNs.

Sources: ResNet-18/50 — He et al., "Deep Residual Learning", CVPR 2016 (Table 1, torchvision's
v1.5 layout: stride on the 3x3 conv); MobileNetV2 — Sandler et al., CVPR 2018 (Table 2,
width 1.0).
"""

from __future__ import annotations

from npujax.systolic import conv_gemm_shape

Layer = tuple[str, int, int, int, int, int]


def _conv(layers, name, hw, c_in, c_out, k, stride, groups=1):
    pad = k // 2
    s = conv_gemm_shape((1, hw, hw, c_in), (k, k, c_in // groups, c_out), stride=stride,
                        padding=pad, groups=groups)
    layers.append((name, s["M"], s["K"], s["N"], s["groups"], hw * hw * (c_in // groups)))
    return s["out_h"]


def resnet(depth: int = 18) -> list[Layer]:
    layers: list[Layer] = []
    hw = _conv(layers, "conv1", 224, 3, 64, 7, 2)
    hw = (hw + 2 - 3) // 2 + 1  # 3x3/2 max pool, pad 1
    blocks = {18: (2, 2, 2, 2), 50: (3, 4, 6, 3)}[depth]
    c_in = 64
    for stage, (n, width) in enumerate(zip(blocks, (64, 128, 256, 512)), start=1):
        for i in range(n):
            stride = 2 if (i == 0 and stage > 1) else 1
            p = f"layer{stage}.{i}"
            if depth == 18:
                out = width
                hw2 = _conv(layers, f"{p}.conv1", hw, c_in, width, 3, stride)
                _conv(layers, f"{p}.conv2", hw2, width, width, 3, 1)
            else:
                out = width * 4
                _conv(layers, f"{p}.conv1", hw, c_in, width, 1, 1)
                hw2 = _conv(layers, f"{p}.conv2", hw, width, width, 3, stride)
                _conv(layers, f"{p}.conv3", hw2, width, out, 1, 1)
            if stride != 1 or c_in != out:
                _conv(layers, f"{p}.downsample", hw, c_in, out, 1, stride)
            c_in, hw = out, hw2
    layers.append(("fc", 1, c_in, 1000, 1, c_in))
    return layers


def mobilenet_v2() -> list[Layer]:
    layers: list[Layer] = []
    hw = _conv(layers, "stem", 224, 3, 32, 3, 2)
    c_in = 32
    cfg = [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1),
           (6, 160, 3, 2), (6, 320, 1, 1)]  # (expansion t, channels c, repeats n, stride s)
    b = 0
    for t, c, n, s in cfg:
        for i in range(n):
            stride = s if i == 0 else 1
            hidden = c_in * t
            if t != 1:
                _conv(layers, f"block{b}.expand", hw, c_in, hidden, 1, 1)
            hw2 = _conv(layers, f"block{b}.depthwise", hw, hidden, hidden, 3, stride,
                        groups=hidden)
            _conv(layers, f"block{b}.project", hw2, hidden, c, 1, 1)
            c_in, hw, b = c, hw2, b + 1
    _conv(layers, "head", hw, c_in, 1280, 1, 1)
    layers.append(("fc", 1, 1280, 1000, 1, 1280))
    return layers


#: The hand-listed GEMM workloads of the dataflow comparison (its transformer blocks are traced
#: graphs instead, with their softmax and normalizations; see
#: experiments/dataflow_comparison/main.py).
NETWORKS = {
    "resnet18": lambda: resnet(18),
    "mobilenet_v2": mobilenet_v2,
}

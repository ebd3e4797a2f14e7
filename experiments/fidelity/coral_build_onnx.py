"""Build the Coral table's rows that no package constructs, from their published definitions.

Four rows of ``coral_edgetpu_table1.csv`` (Table 1 of coral.ai/docs/edgetpu/benchmarks) are
models of TensorFlow's own code bases, in no model package (keras.applications, torchvision,
timm). This script writes them as ONNX files (opset 13, NCHW, random weights from
``numpy.random.default_rng(0)``, no torch) with ``onnx_builder.Builder``; the files go to
``onnx/`` beside it (not in git) and ``onnx_manifest.json`` pins their sha256 (``"built_by":
"coral_build_onnx.py"``)::

    python experiments/fidelity/coral_build_onnx.py [--check] [--manifest]

(``--manifest``: pin the files' sha256 in ``onnx_manifest.json``; ``--check``: compare
npujax's executor with onnxruntime on each file and print the layers that ``coral_edgetpu``
puts on the host.) Every convolution pads as TensorFlow's
``SAME`` does (the odd pixel at the bottom/right), as the TFLite files do. Parameters and
MACs below are counted on the files by this script (``--check`` prints them; MACs of Conv,
ConvTranspose and Gemm only).

Counts (``count``: parameters, with BatchNorm folded, MACs of the convolutions):

=====================  ==========  ==========  ========  =====================================
file                   params      folded      G MACs    public figure
=====================  ==========  ==========  ========  =====================================
unet_mv2_128           6,504,227   6,455,299   0.586     6,504,227 (Keras' count_params)
ssd_mobilenet_v1_300   6,845,183   6,807,167   1.237     6.807 M, 2.494 GFLOPs (OpenVINO)
ssd_mobilenet_v2_300   6,103,999   6,047,647   0.773     none found (see below)
deeplab_v3_mnv2_513    2,146,645   2,097,013   2.741     2.75 B multiply-adds (quantize.md)
=====================  ==========  ==========  ========  =====================================

**U-Net MobileNet v2, 128x128** (Coral's ``keras_post_training_unet_mv2_128_quant_edgetpu``):
the model of TensorFlow's image-segmentation tutorial (tensorflow.org/tutorials/images/
segmentation, ``unet_model``). Encoder: ``keras.applications.MobileNetV2(input_shape=[128,
128, 3], include_top=False)`` up to the layers ``block_1_expand_relu`` (64x64x96),
``block_3_expand_relu`` (32x32x144), ``block_6_expand_relu`` (16x16x192),
``block_13_expand_relu`` (8x8x576) and ``block_16_project`` (4x4x320, the projection
convolution itself, before its BatchNorm, as the tutorial takes it). Decoder: four
``pix2pix.upsample`` blocks (tensorflow_examples: ``Conv2DTranspose(f, 3, strides=2,
padding="same", use_bias=False)``, BatchNorm, ReLU) of 512, 256, 128 and 64 filters, each
followed by a ``Concatenate`` with the skip of its size, then ``Conv2DTranspose(
output_channels, 3, strides=2, padding="same")`` to 128x128, ``output_channels = 3``
(the tutorial's ``OUTPUT_CLASSES = 3``: the Oxford-IIIT pets' pet / border / background).

**MobileNet v1 SSD and MobileNet v2 SSD** (Coral's ``ssd_mobilenet_v{1,2}_coco_quant_
postprocess_edgetpu``, trained from the TF Object Detection API's
``ssd_mobilenet_v1_quantized_300x300_coco14_sync.config`` and
``ssd_mobilenet_v2_quantized_300x300_coco.config``, tensorflow/models research/
object_detection/samples/configs): a 300x300 input (``fixed_shape_resizer``; coral.ai/models
gives "Input size: 300x300"; the benchmark table's "224x224" label is discussed in
docs/results/fidelity.md), 90 classes plus background (91 class slots), the feature
extractors ``ssd_mobilenet_v1`` (TF-slim MobileNet v1 to ``Conv2d_13_pointwise``, features
``Conv2d_11_pointwise`` 19x19x512 and ``Conv2d_13_pointwise`` 10x10x1024) and
``ssd_mobilenet_v2`` (TF-slim MobileNet v2 to ``layer_19``, the 1x1 convolution to 1280
channels; features ``layer_15/expansion_output`` 19x19x576 and ``layer_19`` 10x10x1280),
each followed by ``multi_resolution_feature_maps`` with ``layer_depth`` ``[-1, -1, 512, 256,
256, 128]`` (each new map: a 1x1 convolution to half the depth, then a 3x3 stride-2 ``SAME``
convolution, BatchNorm and ReLU6 after each), a ``convolutional_box_predictor`` of
``kernel_size: 1`` (two 1x1 convolutions with bias per map, ``4 A`` box codes and ``91 A``
class logits, no BatchNorm), anchors of ``ssd_anchor_generator`` (6 layers, scales 0.2-0.95,
aspect ratios 1, 2, 0.5, 3, 1/3 and an interpolated scale; 3 anchors in the lowest layer:
``A`` = 3, 6, 6, 6, 6, 6; 1917 anchors at 300x300), and the sigmoid score converter
(``score_converter: SIGMOID``, on the device as in the exported TFLite graph's
``raw_outputs/class_predictions``). The float ``ssd_mobilenet_v2_coco.config`` differs (a 3x3
box predictor and depthwise extra layers: 16.8 M parameters on OpenVINO's card); Coral's files
are quantization-aware-trained ("quant") models, whose configs are the ones above (no
published count of the quantized v2 was found to check against).

The post-processing, TFLite's ``TFLite_Detection_PostProcess`` custom operator, runs on the
host CPU (the Edge TPU compiler leaves custom operators to the CPU). It is written with the
standard operators it computes, in this order so that npujax's ``rest_of_graph`` partition
puts exactly these on the host: ``Cast`` to float of the device's two outputs (the custom
operator dequantizes its uint8 inputs: the host's first operation, and one the Edge TPU does
not run), box decoding of every anchor with the ``faster_rcnn_box_coder`` scales (10, 10, 5,
5: ``Slice``, ``Mul``, ``Add``, ``Exp``, ``Sub``, ``Concat``) and each anchor's best class
score (``Slice`` of the 90 classes, ``ReduceMax``). What the custom operator does after that
is not in the file: the fast path's (``use_regular_nms = false``, the export's default) sort
of the candidates and greedy suppression to 10 detections. ONNX writes it as
``NonMaxSuppression``, whose output size depends on the data; npujax's executor runs static
shapes only, and ``TopK`` is not one of its operators. Their work is bounded: a sort of at
most 1917 scores (about 21 k comparisons) and at most 1917 x 10 intersection-over-union
tests (about 15 operations each, 0.29 M), about 6 us at the preset's 5e10 operations/s
(0.1 % of the 6.5 ms measured): left out, which makes the host part a lower bound.

**DeepLab V3, 513x513** (Coral's ``deeplabv3_mnv2_pascal_quant_edgetpu``): TensorFlow's
DeepLab (tensorflow/models research/deeplab) ``mobilenetv2_coco_voc_trainaug_8bit``, the
quantized PASCAL VOC model of ``g3doc/quantize.md`` (trained with ``--model_variant=
mobilenet_v2 --output_stride=16``, 513x513 crops; 2.75 B multiply-adds, a 2.2 MB TFLite
file): TF-slim MobileNet v2 to ``layer_18`` (``feature_extractor.py``'s
``_MOBILENET_V2_FINAL_ENDPOINT``: block 16's output, 33x33x320) in its atrous form at output
stride 16 (block 13's depthwise convolution keeps stride 1, blocks 14-16 dilate by 2); the
MobileNet v2 variant of the ASPP head (``model.py`` without ``atrous_rates``: "MobileNet-v2
based models do not employ ASPP [atrous branches] and decoder modules", g3doc/model_zoo.md):
an image-pooling branch (33x33 average pool, 1x1 convolution to 256, BatchNorm, ReLU,
bilinear resize back to 33x33) concatenated with a 1x1 convolution to 256 (BatchNorm, ReLU),
a 1x1 projection to 256 (BatchNorm, ReLU), 1x1 logits of 21 classes with a bias; then, as
``export_model.py``'s ``predict_labels`` writes the exported graph, the logits resized
bilinearly to 513x513 (``align_corners=True``) and an ``ArgMax`` over the classes: the class
of each pixel, ``[1, 513, 513]``. The Edge TPU has no ArgMax: it runs on the host
(``coral_edgetpu``'s partition puts it there, the one operator after the resize).
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
OUT_DIR = HERE / "onnx"
sys.path.insert(0, str(HERE))
from onnx_builder import Builder  # noqa: E402

#: Keras / TF-slim MobileNet v2 inverted-residual stages after the first block:
#: (expansion, output channels, repeats, first stride) (Sandler et al. 2018, Table 2).
MOBILENET_V2_STAGES = ((6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1),
                       (6, 160, 3, 2), (6, 320, 1, 1))
#: TF-slim MobileNet v1's 13 depthwise-separable layers: (pointwise channels, stride).
MOBILENET_V1_LAYERS = ((64, 1), (128, 2), (128, 1), (256, 2), (256, 1), (512, 2),
                       (512, 1), (512, 1), (512, 1), (512, 1), (512, 1), (1024, 2), (1024, 1))
#: ``multi_resolution_feature_maps``' extra maps (``layer_depth`` after the two from the base)
SSD_EXTRA_DEPTHS = (512, 256, 256, 128)
SSD_CLASS_SLOTS = 91  # COCO's 90 classes plus the background


def _out(size: int, stride: int) -> int:
    return -(-size // stride)


def mobilenet_v2(g: Builder, x: str, size: int, last: str,
                 output_stride: int | None = None) -> tuple[dict, int]:
    """MobileNet v2 (alpha 1, Keras' and TF-slim's layers, no biases, BatchNorm epsilon 1e-3,
    ReLU6) from the image ``x`` (``size x size``) until the endpoint ``last``: Keras names
    ``block_{i}_expand_relu`` (expansion, BN, ReLU6) and ``block_{i}_project`` (the projection
    convolution before its BN), ``block_{i}_output`` (the block's output: TF-slim's
    ``layer_{i + 2}``), or ``out_relu`` (the 1x1 convolution to 1280 channels, BN, ReLU6:
    TF-slim's ``layer_19``). ``output_stride``: TF-slim's atrous form (DeepLab's): once the
    stride reached it, later strides are 1 and later depthwise convolutions dilate by the
    strides skipped (``mobilenet_base``). Returns ``({endpoint: (tensor, channels, size)},
    size)``."""
    ep: dict = {}
    state = {"stride": 2, "rate": 1}  # after the first convolution

    def block(x: str, cin: int, size: int, t: int, c: int, stride: int, i: int):
        h, e = x, cin
        if t != 1:
            e = cin * t
            h = g.relu6(g.bn(g.conv_same(x, size, cin, e, 1), e))
            ep[f"block_{i}_expand_relu"] = (h, e, size)
            if last == f"block_{i}_expand_relu":
                return None
        rate = 1
        if output_stride is not None and state["stride"] == output_stride:
            stride, rate, state["rate"] = 1, state["rate"], state["rate"] * stride
        else:
            state["stride"] *= stride
        h = g.relu6(g.bn(g.conv_same(h, size, e, e, 3, stride, groups=e, dilation=rate), e))
        size = _out(size, stride)
        p = g.conv_same(h, size, e, c, 1)
        ep[f"block_{i}_project"] = (p, c, size)
        if last == f"block_{i}_project":
            return None
        p = g.bn(p, c)
        if stride == 1 and cin == c:
            p = g.node("Add", [x, p])
        ep[f"block_{i}_output"] = (p, c, size)
        if last == f"block_{i}_output":
            return None
        return p, size

    x = g.relu6(g.bn(g.conv_same(x, size, 3, 32, 3, 2), 32))
    size = _out(size, 2)
    x, size = block(x, 32, size, 1, 16, 1, 0)
    cin, i = 16, 1
    for t, c, n, s in MOBILENET_V2_STAGES:
        for r in range(n):
            res = block(x, cin, size, t, c, s if r == 0 else 1, i)
            if res is None:
                return ep, size
            (x, size), cin, i = res, c, i + 1
    x = g.relu6(g.bn(g.conv_same(x, size, 320, 1280, 1), 1280))
    ep["out_relu"] = (x, 1280, size)
    if last != "out_relu":
        raise ValueError(f"unknown MobileNet v2 endpoint {last!r}")
    return ep, size


def unet_mv2(path: Path, hw: int = 128, output_channels: int = 3) -> Path:
    """Write the segmentation tutorial's U-Net (the docstring's layers), input ``[1, 3, hw,
    hw]``, output ``[1, output_channels, hw, hw]``; returns ``path``."""
    g = Builder()
    names = ("block_1_expand_relu", "block_3_expand_relu", "block_6_expand_relu",
             "block_13_expand_relu", "block_16_project")
    ep, _ = mobilenet_v2(g, "input", hw, last=names[-1])
    x, cin, _ = ep[names[-1]]
    for filters, skip in zip((512, 256, 128, 64), reversed(names[:-1])):
        s, sc, _ = ep[skip]
        x = g.node("Relu", [g.bn(g.conv_transpose_same(x, cin, filters, 3, 2), filters)])
        x, cin = g.node("Concat", [x, s], axis=1), filters + sc
    y = g.conv_transpose_same(x, cin, output_channels, 3, 2, bias=True)
    return g.save(path, "unet_mv2", "input", hw, [(y, [1, output_channels, hw, hw])])


def ssd_anchors(sizes: list[int], min_scale: float = 0.2, max_scale: float = 0.95,
                aspect_ratios: tuple[float, ...] = (1.0, 2.0, 0.5, 3.0, 0.3333)) -> np.ndarray:
    """The TF Object Detection API's ``ssd_anchor_generator`` anchors (``[N, 4]``: y and x
    centre, height, width, in the unit square) for square feature maps of ``sizes``: scales
    ``min + (max - min) i / (L - 1)``, each aspect ratio plus an interpolated scale
    ``sqrt(s_i s_{i+1})`` at ratio 1, the lowest layer reduced to ``(0.1, 1), (s, 2),
    (s, 0.5)``; order ``[map, y, x, anchor]`` (the box predictor's reshape)."""
    n = len(sizes)
    scales = [min_scale + (max_scale - min_scale) * i / (n - 1) for i in range(n)] + [1.0]
    out = []
    for layer, size in enumerate(sizes):
        s, s_next = scales[layer], scales[layer + 1]
        if layer == 0:
            specs = [(0.1, 1.0), (s, 2.0), (s, 0.5)]
        else:
            specs = [(s, a) for a in aspect_ratios] + [(math.sqrt(s * s_next), 1.0)]
        c = (np.arange(size) + 0.5) / size
        for yc in c:
            for xc in c:
                for sc, ar in specs:
                    out.append((yc, xc, sc / math.sqrt(ar), sc * math.sqrt(ar)))
    return np.asarray(out, np.float32)


def _ssd_head_and_postprocess(g: Builder, maps: list[tuple[str, int, int]]
                              ) -> list[tuple[str, list[int]]]:
    """The box predictor on ``maps`` (``(tensor, channels, size)``), the sigmoid, and the
    host's post-processing (the module docstring); returns the graph outputs."""
    boxes, scores = [], []
    per_map = [3] + [6] * (len(maps) - 1)
    for (t, c, _size), a in zip(maps, per_map):
        for code, outs in ((4, boxes), (SSD_CLASS_SLOTS, scores)):
            y = g.conv(t, c, a * code, 1, pad=0, bias=True)
            y = g.node("Transpose", [y], perm=[0, 2, 3, 1])
            outs.append(g.node("Reshape", [y, g.int_const([1, -1, code])]))
    anchors = ssd_anchors([s for _, _, s in maps])
    n = len(anchors)
    box = g.node("Concat", boxes, axis=1)
    score = g.node("Sigmoid", [g.node("Concat", scores, axis=1)])
    # the host: TFLite_Detection_PostProcess (the module docstring)
    box = g.node("Cast", [box], to=1)
    score = g.node("Cast", [score], to=1)

    def sl(x: str, lo: int, hi: int) -> str:
        return g.node("Slice", [x, g.int_const([lo]), g.int_const([hi]), g.int_const([2])])

    a_yx, a_hw = g.const(anchors[None, :, :2]), g.const(anchors[None, :, 2:])
    centre = g.node("Add", [g.node("Mul", [g.node("Mul", [sl(box, 0, 2),
                                                          g.const(np.asarray(0.1))]), a_hw]),
                            a_yx])
    half = g.node("Mul", [g.node("Mul", [g.node("Exp", [g.node("Mul", [
        sl(box, 2, 4), g.const(np.asarray(0.2))])]), a_hw]), g.const(np.asarray(0.5))])
    corners = g.node("Concat", [g.node("Sub", [centre, half]), g.node("Add", [centre, half])],
                     axis=2)
    best = g.node("ReduceMax", [sl(score, 1, SSD_CLASS_SLOTS)], axes=[2], keepdims=0)
    return [(corners, [1, n, 4]), (best, [1, n])]


def _ssd_extra_maps(g: Builder, x: str, c: int, size: int) -> list[tuple[str, int, int]]:
    maps = []
    for depth in SSD_EXTRA_DEPTHS:
        x = g.relu6(g.bn(g.conv_same(x, size, c, depth // 2, 1), depth // 2))
        x = g.relu6(g.bn(g.conv_same(x, size, depth // 2, depth, 3, 2), depth))
        c, size = depth, _out(size, 2)
        maps.append((x, c, size))
    return maps


def ssd_mobilenet_v1(path: Path, hw: int = 300) -> Path:
    """Write SSD MobileNet v1 (the docstring's layers), input ``[1, 3, hw, hw]``; outputs the
    decoded boxes ``[1, N, 4]`` and each anchor's best score ``[1, N]``; returns ``path``."""
    g = Builder()
    x = g.relu6(g.bn(g.conv_same("input", hw, 3, 32, 3, 2), 32))
    size, cin, maps = _out(hw, 2), 32, []
    for i, (c, s) in enumerate(MOBILENET_V1_LAYERS, 1):
        x = g.relu6(g.bn(g.conv_same(x, size, cin, cin, 3, s, groups=cin), cin))
        size = _out(size, s)
        x, cin = g.relu6(g.bn(g.conv_same(x, size, cin, c, 1), c)), c
        if i in (11, 13):
            maps.append((x, c, size))
    maps += _ssd_extra_maps(g, x, cin, size)
    return g.save(path, "ssd_mobilenet_v1", "input", hw, _ssd_head_and_postprocess(g, maps))


def ssd_mobilenet_v2(path: Path, hw: int = 300) -> Path:
    """Write SSD MobileNet v2 (the docstring's layers), input ``[1, 3, hw, hw]``; outputs as
    :func:`ssd_mobilenet_v1`; returns ``path``."""
    g = Builder()
    ep, _ = mobilenet_v2(g, "input", hw, last="out_relu")
    maps = [ep["block_13_expand_relu"], ep["out_relu"]]
    x, c, size = ep["out_relu"]
    maps += _ssd_extra_maps(g, x, c, size)
    return g.save(path, "ssd_mobilenet_v2", "input", hw, _ssd_head_and_postprocess(g, maps))


def deeplab_v3_mnv2(path: Path, hw: int = 513, classes: int = 21) -> Path:
    """Write DeepLab v3 with a MobileNet v2 backbone (the docstring's layers), input ``[1, 3,
    hw, hw]``, output the class of every pixel ``[1, hw, hw]`` (int64); returns ``path``."""
    g = Builder()
    ep, size = mobilenet_v2(g, "input", hw, last="block_16_output", output_stride=16)
    x, c, _ = ep["block_16_output"]

    def cbr(t: str, cin: int, cout: int) -> str:  # 1x1 convolution, BatchNorm, ReLU
        return g.node("Relu", [g.bn(g.conv_same(t, size, cin, cout, 1), cout, eps=1e-5)])

    def resize(t: str, ch: int, out: int) -> str:
        return g.node("Resize", [t, "", "", g.int_const([1, ch, out, out])], mode="linear",
                      coordinate_transformation_mode="align_corners")

    # the 1x1 branch first: Coral's compiled file (google-coral/test_data,
    # deeplabv3_mnv2_pascal_quant_edgetpu.tflite) runs it on the Edge TPU, before the image
    # pooling's resize, the first operator it leaves on the CPU with everything after it
    aspp0 = cbr(x, c, 256)
    pool = g.node("AveragePool", [x], kernel_shape=[size, size], strides=[1, 1])
    image = resize(cbr(pool, c, 256), 256, size)
    h = cbr(g.node("Concat", [image, aspp0], axis=1), 512, 256)
    logits = resize(g.conv(h, 256, classes, 1, pad=0, bias=True), classes, hw)
    labels = g.node("ArgMax", [logits], axis=1, keepdims=0)
    return g.save(path, "deeplab_v3_mnv2", "input", hw, [(labels, [1, hw, hw])],
                  out_dtype="int64")


#: the files of ``coral_edgetpu_table1.csv`` and the side figures: ``{file: (builder, hw)}``
FILES = {
    "unet_mv2_128.onnx": (unet_mv2, 128),
    "ssd_mobilenet_v1_300.onnx": (ssd_mobilenet_v1, 300),
    "ssd_mobilenet_v2_300.onnx": (ssd_mobilenet_v2, 300),
    "ssd_mobilenet_v1_224.onnx": (ssd_mobilenet_v1, 224),
    "ssd_mobilenet_v2_224.onnx": (ssd_mobilenet_v2, 224),
    "deeplab_v3_mnv2_513.onnx": (deeplab_v3_mnv2, 513),
}


def count(path: Path) -> tuple[int, int, int]:
    """``(parameters, parameters with BatchNorm folded, MACs)`` of an ONNX file: the weights,
    biases and BatchNorm scale, shift, mean and variance (as Keras' ``count_params``); the
    convolutions' weights plus one bias per output channel (as a deployed file has); the
    MACs of its Conv and ConvTranspose nodes (shapes by ONNX shape inference)."""
    import onnx
    from onnx import numpy_helper

    m = onnx.shape_inference.infer_shapes(onnx.load(str(path)))
    shapes = {v.name: [d.dim_value for d in v.type.tensor_type.shape.dim]
              for v in list(m.graph.value_info) + list(m.graph.input) + list(m.graph.output)}
    inits = {i.name: numpy_helper.to_array(i) for i in m.graph.initializer}
    weights = {n.input[k] for n in m.graph.node
               if n.op_type in ("Conv", "ConvTranspose", "BatchNormalization", "Gemm")
               for k in range(1, len(n.input))}
    params = sum(inits[w].size for w in weights if w in inits)
    macs = folded = 0
    for n in m.graph.node:
        if n.op_type == "Conv":
            w = inits[n.input[1]].shape
            macs += math.prod(shapes[n.output[0]]) * math.prod(w[1:])
            folded += math.prod(w) + w[0]
        elif n.op_type == "ConvTranspose":
            w = inits[n.input[1]].shape  # [cin, cout / group, kh, kw]
            macs += math.prod(shapes[n.input[0]]) * math.prod(w[1:])
            folded += math.prod(w) + w[1]
    return int(params), int(folded), int(macs)


#: public counts to compare with (``count``'s first or second figure, as the source counts)
PUBLISHED = {
    "unet_mv2_128": {"params": 6504227, "source": "Keras' count_params of the tutorial's "
                     "unet_model(3) (keras.applications.MobileNetV2 and the pix2pix decoder "
                     "built in Keras 3.x: 6,504,227, BatchNorm statistics included)"},
    "ssd_mobilenet_v1_300": {"params_folded": 6807000, "macs": 1247000000, "source":
                             "OpenVINO Open Model Zoo ssd_mobilenet_v1_coco (the TF model zoo's "
                             "float model of the same layers): 6.807 M params, 2.494 GFLOPs"},
    "deeplab_v3_mnv2_513": {"macs": 2750000000, "source": "tensorflow/models research/deeplab "
                            "g3doc/quantize.md, mobilenetv2_coco_voc_trainaug_8bit: output "
                            "stride 16, 2.75B multiply-adds, a 2.2 MB TFLite file"},
}


def write_manifest() -> Path:
    """Add (or refresh) the entries of :data:`FILES` in ``onnx_manifest.json``: file, builder,
    input, counts, sha256 and size; the export_onnx.py entries are kept as they are."""
    import hashlib
    import json

    path = HERE / "onnx_manifest.json"
    manifest = json.loads(path.read_text())
    for fname, (fn, hw) in FILES.items():
        f = OUT_DIR / fname
        params, folded, macs = count(f)
        entry = {
            "file": f"onnx/{fname}",
            "built_by": "coral_build_onnx.py (onnx_builder.Builder: no torch, random weights "
                        "numpy.random.default_rng(0), opset 13, float32, NCHW)",
            "constructor": f"coral_build_onnx.{fn.__name__}(hw={hw})",
            "input_nchw": [1, 3, hw, hw],
            "params": params,
            "params_bn_folded": folded,
            "macs": macs,
            "sha256": hashlib.sha256(f.read_bytes()).hexdigest(),
            "bytes": f.stat().st_size,
        }
        if f.stem in PUBLISHED:
            entry["published"] = PUBLISHED[f.stem]
        manifest["models"][f.stem] = entry
    manifest["models"] = dict(sorted(manifest["models"].items()))
    path.write_text(json.dumps(manifest, indent=1) + "\n")
    return path


def check(path: Path) -> None:
    """Print the file's parameters and MACs, npujax's executor against onnxruntime (largest
    absolute difference over the largest magnitude, per output), and the layers that
    ``coral_edgetpu`` puts on the host."""
    import jax.numpy as jnp
    import onnxruntime as ort

    import npujax

    params_n, folded, macs = count(path)
    print(f"{path.name}: {params_n:,} parameters ({folded:,} with BatchNorm folded), "
          f"{macs / 1e9:.3f} G MACs")
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    inp = sess.get_inputs()[0]
    x = np.random.default_rng(1).uniform(-1, 1, inp.shape).astype(np.float32)
    ref = sess.run(None, {inp.name: x})
    graph, params = npujax.from_onnx(str(path))
    got = npujax.execute(graph, params, jnp.asarray(x))
    got = got if isinstance(got, (list, tuple)) else [got]
    for o, r, y in zip(sess.get_outputs(), ref, got):
        y = np.asarray(y)
        if r.dtype.kind in "iu":  # labels: an argmax may flip where two logits nearly tie
            print(f"  {o.name} {list(r.shape)}: npujax vs onnxruntime, "
                  f"{int(np.sum(y != r)):,} of {r.size:,} elements differ")
            continue
        err = float(np.max(np.abs(y - r)) / max(np.max(np.abs(r)), 1e-30))
        print(f"  {o.name} {list(r.shape)}: npujax vs onnxruntime, max |diff| / max |ref| "
              f"= {err:.1e}")
    from npujax.plan.fit_table import TableRow
    from npujax.workflows.fit_table import table_network

    spec = npujax.load_npu_spec("coral_edgetpu")
    h, w = inp.shape[2:]
    net = table_network(TableRow(path.stem, str(path), (h, w, 3), 1e-3, ""), spec)
    host = [(w.name, w.op, w.reason) for w in net.layers if w.device == "cpu"]
    print(f"  on the host ({len(host)} layers of {len(net.layers)}):")
    for name, op, reason in host:
        print(f"    {name} ({op}): {reason}")


def build_all(force: bool = False) -> list[Path]:
    """Every file of :data:`FILES` that is missing (all with ``force``); returns those
    written."""
    done = []
    for fname, (fn, hw) in FILES.items():
        p = OUT_DIR / fname
        if force or not p.exists():
            done.append(fn(p, hw))
    return done


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--force", action="store_true", help="rewrite files that exist")
    ap.add_argument("--check", action="store_true", help="check each file (see the docstring)")
    ap.add_argument("--manifest", action="store_true",
                    help="pin the files' sha256 and counts in onnx_manifest.json")
    args = ap.parse_args()
    for p in build_all(args.force):
        print(f"wrote {p} ({p.stat().st_size / 1e6:.1f} MB)")
    if args.manifest:
        print(f"wrote {write_manifest()}")
    if args.check:
        for fname in FILES:
            check(OUT_DIR / fname)
    return 0


if __name__ == "__main__":
    sys.exit(main())

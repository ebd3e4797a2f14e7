"""Real ONNX models that ship inside pip packages (fetched and verified by
:func:`npujax.data.fetch.fetch_member`).

The three PaddleOCR models (Apache-2.0) inside the pure-Python wheel ``rapidocr-onnxruntime==1.4.4``
are npujax's real-model references; ``zoo:NAME`` on the command line names them.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from npujax.data.fetch import DownloadError, WheelMember, default_cache_dir, fetch_member

__all__ = ["ZooModel", "MODELS", "fetch_model", "default_cache_dir", "DownloadError"]

_WHEEL = "rapidocr-onnxruntime==1.4.4"


@dataclasses.dataclass(frozen=True, kw_only=True)
class ZooModel(WheelMember):
    """A model file inside a pinned wheel.

    Attributes:
      requirement, member, sha256: see :class:`~npujax.data.fetch.WheelMember`.
      input_name, input_shape: the (dynamic) model input and the static shape npujax uses.
    """

    input_name: str
    input_shape: tuple[int, ...]


#: The real ONNX models :func:`fetch_model` knows, by name.
MODELS: dict[str, ZooModel] = {
    # Text-orientation classifier (MobileNetV3-style, opset 11), output [1, 2] softmax.
    "ppocr_cls": ZooModel(
        requirement=_WHEEL,
        member="rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx",
        sha256="e47acedf663230f8863ff1ab0e64dd2d82b838fceb5957146dab185a89d6215c",
        input_name="x", input_shape=(1, 3, 48, 192),
    ),
    # PP-OCRv4 mobile text detector (DBNet-style, opset 12), output [1, 1, H, W] probability map.
    "ppocr_det": ZooModel(
        requirement=_WHEEL,
        member="rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx",
        sha256="d2a7720d45a54257208b1e13e36a8479894cb74155a5efe29462512d42f49da9",
        input_name="x", input_shape=(1, 3, 640, 640),
    ),
    # PP-OCRv4 mobile text recogniser (opset 12): a PP-LCNetV3 conv backbone and an SVTR neck
    # (two pre-norm transformer blocks: LayerNorm, 8-head self-attention, Swish MLP) before a CTC
    # head; output [1, W/8, 6625] per-timestep character probabilities (softmax). The width is
    # dynamic: 320 is PaddleOCR's default line width.
    "ppocr_rec": ZooModel(
        requirement=_WHEEL,
        member="rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx",
        sha256="48fc40f24f6d2a207a2b1091d3437eb3cc3eb6b676dc3ef9c37384005483683b",
        input_name="x", input_shape=(1, 3, 48, 320),
    ),
}


def fetch_model(name: str, cache_dir: str | os.PathLike[str] | None = None,
                *, timeout_s: float = 300.0) -> Path:
    """Path of the cached ``.onnx`` file of zoo model ``name``, downloading the wheel if needed
    (every model of the same wheel is cached from one download).

    Args:
      name: a key of :data:`MODELS` (``"ppocr_cls"``, ``"ppocr_det"``, ``"ppocr_rec"``).
      cache_dir: where models are cached (default :func:`default_cache_dir`).
      timeout_s: limit for the ``pip download`` call, in seconds.

    Returns:
      The path of the verified model file.

    Raises:
      KeyError: unknown ``name`` (lists the known ones).
      DownloadError: pip could not download the wheel (e.g. no network).
      FetchError: the member is missing, or the sha256 does not match the pinned one.
    """
    if name not in MODELS:
        raise KeyError(f"unknown zoo model {name!r}; known: {sorted(MODELS)}.")
    return fetch_member(MODELS[name], cache_dir, siblings=list(MODELS.values()),
                        timeout_s=timeout_s)

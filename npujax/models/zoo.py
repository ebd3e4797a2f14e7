"""Real ONNX models that ship inside pip packages, fetched with pip and checked by sha256.

The two PaddleOCR models (Apache-2.0) inside the pure-Python wheel ``rapidocr-onnxruntime==1.4.4``
are npujax's real-model references. :func:`fetch_model` runs ``pip download --no-deps`` of the
pinned wheel (only when the model is not cached yet), reads the member out of the wheel with
``zipfile``, checks its sha256 and caches the ``.onnx`` file; later calls work offline.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from npujax._atomic import atomic_write_bytes
from npujax.errors import FetchError

__all__ = ["ZooModel", "MODELS", "fetch_model", "default_cache_dir", "DownloadError"]

_WHEEL = "rapidocr-onnxruntime==1.4.4"


class DownloadError(FetchError):
    """pip could not download the wheel (no network, PyPI unreachable, pip missing)."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class ZooModel:
    """A model file inside a pinned wheel.

    Attributes:
      requirement: the pip requirement of the wheel (``name==version``).
      member: the file's path inside the wheel.
      sha256: hex digest of the file.
      input_name, input_shape: the (dynamic) model input and the static shape npujax uses.
    """

    requirement: str
    member: str
    sha256: str
    input_name: str
    input_shape: tuple[int, ...]


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
}


def default_cache_dir() -> Path:
    """``$NPUJAX_CACHE`` if set, else ``$XDG_CACHE_HOME/npujax`` or ``~/.cache/npujax``."""
    if os.environ.get("NPUJAX_CACHE"):
        return Path(os.environ["NPUJAX_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "npujax"


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def fetch_model(name: str, cache_dir: str | os.PathLike[str] | None = None,
                *, timeout_s: float = 300.0) -> Path:
    """Path of the cached ``.onnx`` file of zoo model ``name``, downloading the wheel if needed.

    Args:
      name: a key of :data:`MODELS` (``"ppocr_cls"``, ``"ppocr_det"``).
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
    m = MODELS[name]
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    target = cache / Path(m.member).name
    if target.is_file() and _sha256(target.read_bytes()) == m.sha256:
        return target
    with tempfile.TemporaryDirectory(prefix="npujax-fetch-") as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
               "--disable-pip-version-check", "-q", "-d", tmp, m.requirement]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise DownloadError(f"could not run pip to download {m.requirement}: {e}") from None
        wheels = list(Path(tmp).glob("*.whl"))
        if proc.returncode != 0 or not wheels:
            raise DownloadError(
                f"pip download {m.requirement} failed (exit {proc.returncode}); is PyPI "
                f"reachable? {proc.stderr.strip()[-500:]}"
            )
        # Cache every pinned model of this wheel, so one download serves them all.
        siblings = [z for z in MODELS.values() if z.requirement == m.requirement]
        try:
            with zipfile.ZipFile(wheels[0]) as zf:
                blobs = {z.member: zf.read(z.member) for z in siblings}
        except (KeyError, zipfile.BadZipFile) as e:
            raise FetchError(f"{wheels[0].name} lacks a readable model member: {e}") from None
    for z in siblings:
        digest = _sha256(blobs[z.member])
        if digest != z.sha256:
            raise FetchError(f"{z.member} from {z.requirement} has sha256 {digest}, expected "
                             f"{z.sha256}; refusing to use it.")
        atomic_write_bytes(cache / Path(z.member).name, blobs[z.member])
    return target

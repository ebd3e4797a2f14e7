"""Real image inputs for the imported OCR models, with no data download.

* :func:`text_images`: lines of words rendered by matplotlib (its bundled DejaVu font) in dark ink
  on paper-like backgrounds, optionally every other one rotated by 180 degrees -- labelled data for
  the PP-OCR text-orientation classifier (class 0 upright, class 1 rotated) and realistic inputs
  for the text detector.
* :func:`text_lines`: single text lines as a recogniser sees a detected line (PaddleOCR's rec
  preprocessing: full height, zero padding on the right), with their strings -- labelled data
  for the PP-OCR text recogniser.
* :func:`photo_crops`: crops of scikit-learn's two real photographs (``china``, ``flower``).
* :func:`image_folder`: a user's own folder of image files, preprocessed as described there.

All return ``[n, 3, h, w]`` float32 channels-first batches normalized as PaddleOCR feeds its
models, ``(pixel / 255 - 0.5) / 0.5`` (values in [-1, 1]).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from npujax.errors import ConfigError

__all__ = ["text_images", "text_lines", "photo_crops", "orientation_labels", "image_folder",
           "IMAGE_SUFFIXES", "IMAGE_NORMALIZATIONS"]

#: The image files :func:`image_folder` reads (by suffix, any case).
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp")

#: How :func:`image_folder` scales pixels, by name: ``(mean, std)`` per RGB channel, the input
#: being ``(pixel / 255 - mean) / std``.
#:
#: - ``"symmetric"`` (the default): ``pixel / 127.5 - 1``, values in [-1, 1]; PaddleOCR's, and
#:   Keras ``preprocess_input(mode="tf")``'s (Inception, MobileNet);
#: - ``"unit"``: ``pixel / 255``, values in [0, 1]; torchvision's ``ToTensor`` alone, Keras
#:   ``Rescaling(1 / 255)``;
#: - ``"imagenet"``: torchvision's ``Normalize`` with the ImageNet mean and standard deviation
#:   (timm's ``IMAGENET_DEFAULT_MEAN/STD``, Keras ``preprocess_input(mode="torch")``); RGB
#:   models only.
#:
#: (No name starts with ``-``, which a command line would read as an option.)
IMAGE_NORMALIZATIONS = {
    "symmetric": ((0.5, 0.5, 0.5), (0.5, 0.5, 0.5)),
    "unit": ((0.0, 0.0, 0.0), (1.0, 1.0, 1.0)),
    "imagenet": ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225)),
}

_WORDS = ("npujax systolic array quantization int8 latency roofline weight stationary ONNX "
          "export calibration observer fold tile SRAM DRAM bandwidth vector unit fallback "
          "accumulator scale zero point per channel gradient search Pareto front").split()


def _check(h: int, w: int, n: int) -> None:
    if h < 8 or w < 8 or n < 1:
        raise ConfigError(f"image size must be at least 8x8 and n >= 1, got {h}x{w}, n={n}.")


def _normalize(x: np.ndarray) -> np.ndarray:
    return ((x.astype(np.float32) / 255.0 - 0.5) / 0.5).astype(np.float32)


def text_images(h: int, w: int, n: int, seed: int = 0, flip_odd: bool = False,
                fit: bool = False) -> np.ndarray:
    """``n`` rendered text images.

    Args:
      h: image height in pixels (at least 8).
      w: image width in pixels (at least 8).
      n: number of images.
      seed: words, sizes, colours and positions.
      flip_odd: rotate every odd-indexed image by 180 degrees (see :func:`orientation_labels`).
      fit: shrink a line's font until the whole line lies inside the image, as a text
        recogniser sees a detected line (cropped to its box, resized to the model's height);
        otherwise a long line runs off the right edge, cut mid-character. The same seed draws
        the same words, colours and positions either way.

    Returns:
      float32 ``[n, 3, h, w]``, PaddleOCR-normalized to [-1, 1].

    Raises:
      ConfigError: an image smaller than 8x8 or ``n`` < 1.
    """
    _check(h, w, n)
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        fig = Figure(figsize=(w / 100, h / 100), dpi=100)
        canvas = FigureCanvasAgg(fig)  # also becomes fig.canvas
        fig.patch.set_facecolor(tuple(rng.uniform(0.8, 1.0, 3)))
        n_lines = max(1, h // 80)
        for j in range(n_lines):
            words = " ".join(rng.choice(_WORDS, size=int(rng.integers(2, 5))))
            size = int(rng.integers(12, 24)) if h >= 80 else int(h * 0.45)
            t = fig.text(rng.uniform(0.0, 0.2), 0.85 - j * 0.85 / n_lines if h >= 80 else 0.25,
                         words, fontsize=size, color=tuple(rng.uniform(0.0, 0.3, 3)))
            for _ in range(4 if fit else 0):  # glyph extents scale almost linearly in size
                box = t.get_window_extent(canvas.get_renderer())
                room = 0.97 * w - box.x0
                if box.x1 <= 0.97 * w or room <= 0:
                    break
                t.set_fontsize(t.get_fontsize() * room / box.width)
        canvas.draw()
        img = np.asarray(canvas.buffer_rgba())[..., :3].transpose(2, 0, 1)
        if flip_odd and i % 2:
            img = img[:, ::-1, ::-1]
        out.append(img)
    return _normalize(np.stack(out))


def text_lines(n: int, seed: int = 0, h: int = 48, w: int = 320
               ) -> tuple[np.ndarray, list[str]]:
    """``n`` rendered text lines as a text recogniser sees a detected line, and their strings.

    PaddleOCR's rec preprocessing (``resize_norm_img`` of ``tools/infer/predict_rec.py``,
    ``rec_image_shape = 3,48,320``): the line's crop is resized to height ``h`` keeping its
    aspect ratio, normalized ``(x / 255 - 0.5) / 0.5`` and padded on the right with zeros to
    width ``w``. Here each line is 2-4 words of this module's vocabulary in one font size
    (0.45 h), ink and background colours drawn as :func:`text_images` draws them, cropped with
    2-8 px margins and zero-padded to ``w``; a line whose crop would be wider than ``w`` is
    redrawn, so no line is squeezed or shrunk (:func:`text_images` with ``fit=True`` shrinks the
    font of a long line instead, which a recogniser misreads: PP-OCRv4 rec read 77.5 % of 40
    such lines exactly, and all of these).

    Args:
      n: number of lines (>= 1).
      seed: words, colours and margins.
      h: image height in pixels (at least 8).
      w: image width in pixels (at least 8).

    Returns:
      float32 ``[n, 3, h, w]`` (RGB, PaddleOCR-normalized to [-1, 1], zero padding on the
      right) and the ``n`` strings drawn.

    Raises:
      ConfigError: an image smaller than 8x8, ``n`` < 1, or a width too narrow for any line
        (after 100 redraws per line).
    """
    _check(h, w, n)
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    rng = np.random.default_rng(seed)
    xs: list[np.ndarray] = []
    strings: list[str] = []
    wide, tries = 4 * w, 0
    while len(xs) < n:
        bg = tuple(rng.uniform(0.8, 1.0, 3))
        words = " ".join(rng.choice(_WORDS, size=int(rng.integers(2, 5))))
        ink = tuple(rng.uniform(0.0, 0.3, 3))
        left, right = int(rng.integers(2, 9)), int(rng.integers(2, 9))
        fig = Figure(figsize=(wide / 100, h / 100), dpi=100)
        canvas = FigureCanvasAgg(fig)
        fig.patch.set_facecolor(bg)
        t = fig.text(left / wide, 0.25, words, fontsize=int(h * 0.45), color=ink)
        canvas.draw()
        x1 = int(np.ceil(t.get_window_extent(canvas.get_renderer()).x1)) + right
        if x1 > w:
            tries += 1
            if tries > 100 * n:
                raise ConfigError(f"text_lines: no line of 2-4 words fits {w} px at height {h}; "
                                  f"use a width of at least {4 * h} px.")
            continue
        img = np.asarray(canvas.buffer_rgba())[:, :x1, :3]
        out = np.zeros((3, h, w), np.float32)
        out[:, :, :x1] = _normalize(img).transpose(2, 0, 1)
        xs.append(out)
        strings.append(words)
    return np.stack(xs), strings


def orientation_labels(n: int) -> np.ndarray:
    """Labels of ``text_images(..., flip_odd=True)``: int32 ``[n]``, 0 upright, 1 rotated."""
    return (np.arange(n) % 2).astype(np.int32)


def photo_crops(h: int, w: int, n: int, seed: int = 0) -> np.ndarray:
    """``n`` random crops of scikit-learn's two real photographs, resized (nearest) to ``h x w``.

    Args:
      h: output height in pixels (at least 8).
      w: output width in pixels (at least 8).
      n: number of crops.
      seed: crop positions and sizes.

    Returns:
      float32 ``[n, 3, h, w]``, PaddleOCR-normalized to [-1, 1].

    Raises:
      ConfigError: an image smaller than 8x8 or ``n`` < 1.
    """
    _check(h, w, n)
    from sklearn.datasets import load_sample_images

    imgs = list(load_sample_images().images)
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        img = imgs[i % len(imgs)]
        ch = int(rng.integers(min(h, img.shape[0] // 2), img.shape[0] + 1))
        cw = min(img.shape[1], max(1, int(ch * w / h)))
        y0 = int(rng.integers(0, img.shape[0] - ch + 1))
        x0 = int(rng.integers(0, img.shape[1] - cw + 1))
        crop = img[y0:y0 + ch, x0:x0 + cw]
        out.append(crop[np.arange(h) * ch // h][:, np.arange(w) * cw // w].transpose(2, 0, 1))
    return _normalize(np.stack(out))


def image_folder(path: str | os.PathLike[str], input_shape: tuple[int, ...],
                 normalization: str = "symmetric") -> tuple[np.ndarray, np.ndarray | None]:
    """A folder of image files as a model's inputs (and labels, from class sub-folders).

    Preprocessing, in this order (one image at a time, with Pillow, which matplotlib requires):

    1. converted to RGB (3-channel models) or to 8-bit grayscale (1-channel models);
    2. resized to the model's ``H x W`` with bilinear interpolation (no crop, so the aspect
       ratio is not kept);
    3. normalized per channel, ``(pixel / 255 - mean) / std`` as ``normalization`` names it
       (:data:`IMAGE_NORMALIZATIONS`): by default as :func:`text_images`, ``(pixel / 255 -
       0.5) / 0.5``, values in [-1, 1]; ``"unit"``: ``pixel / 255``; ``"imagenet"``: the
       ImageNet mean and standard deviation (torchvision's ``Normalize``);
    4. laid out as the model takes it: ``[n, C, H, W]`` for an input shape ``(C, H, W)`` with
       ``C`` 1 or 3, else ``[n, H, W, C]`` (a channels-last model, ``C`` last).

    Labels follow torchvision's ``ImageFolder`` convention with the class number as the folder
    name: when every image lies in a sub-folder whose name is a non-negative integer
    (``DIR/0/a.png``, ``DIR/7/b.jpg``), that integer is its label; when all images lie in
    ``DIR`` itself there are no labels. Files are read in sorted path order.

    Args:
      path: the folder.
      input_shape: the model's per-example input shape, ``(C, H, W)`` or ``(H, W, C)``.
      normalization: a name of :data:`IMAGE_NORMALIZATIONS` (``"symmetric"``, ``"unit"`` or
        ``"imagenet"``), the scaling the model was trained with.

    Returns:
      ``(x, y)``: float32 inputs in the model's layout, and int32 labels ``[n]`` or None.

    Raises:
      ConfigError: no image file in the folder, a mix of top-level files and class folders,
        a class folder whose name is not an integer, an image Pillow cannot read, a model
        whose input is not an image (``C`` not 1 or 3), an unknown ``normalization``, or
        ``"imagenet"`` for a 1-channel model.
    """
    from PIL import Image, UnidentifiedImageError

    folder = Path(path)
    want = tuple(int(d) for d in input_shape)
    if len(want) != 3 or (want[0] not in (1, 3) and want[2] not in (1, 3)):
        raise ConfigError(f"--data {folder}: a folder of images feeds models taking (C, H, W) or "
                          f"(H, W, C) images with C = 1 or 3, but the model takes {want}; pass a "
                          ".npy/.npz file of inputs instead.")
    channels_first = want[0] in (1, 3)
    c, h, w = (want if channels_first else (want[2], want[0], want[1]))
    if normalization not in IMAGE_NORMALIZATIONS:
        raise ConfigError(f"image normalization {normalization!r}: choose one of "
                          f"{list(IMAGE_NORMALIZATIONS)} (the scaling the model was trained "
                          "with).")
    if normalization == "imagenet" and c != 3:
        raise ConfigError(f"--data {folder}: the imagenet normalization is per RGB channel, "
                          f"but the model takes {c}-channel images; use unit or symmetric.")
    files = sorted(f for f in folder.rglob("*")
                   if f.is_file() and f.suffix.lower() in IMAGE_SUFFIXES)
    if not files:
        raise ConfigError(f"--data {folder}: the folder holds no image file "
                          f"({', '.join(IMAGE_SUFFIXES)}).")
    depth = {len(f.relative_to(folder).parts) for f in files}
    if depth not in ({1}, {2}):
        raise ConfigError(f"--data {folder}: put the images either all in the folder itself "
                          "(unlabelled) or all in class sub-folders named 0, 1, ... (labelled), "
                          "not both or deeper.")
    labels = None
    if depth == {2}:
        names = sorted({f.parent.name for f in files})
        bad = [n for n in names if not n.isdigit()]
        if bad:
            raise ConfigError(f"--data {folder}: class sub-folders must be named by their class "
                              f"number (0, 1, ...), got {bad[:3]}.")
        labels = np.asarray([int(f.parent.name) for f in files], np.int32)
    out = np.empty((len(files), c, h, w), np.uint8)
    for i, f in enumerate(files):
        try:
            with Image.open(f) as img:
                a = np.asarray(img.convert("RGB" if c == 3 else "L").resize(
                    (w, h), Image.Resampling.BILINEAR), np.uint8)
        except (OSError, UnidentifiedImageError, ValueError) as e:
            raise ConfigError(f"--data {folder}: cannot read image {f}: {e}") from None
        out[i] = a.transpose(2, 0, 1) if a.ndim == 3 else a[None]
    mean, std = (np.asarray(v[:c], np.float32).reshape(1, c, 1, 1)
                 for v in IMAGE_NORMALIZATIONS[normalization])
    x = ((out.astype(np.float32) / np.float32(255.0) - mean) / std).astype(np.float32)
    if not channels_first:
        x = np.ascontiguousarray(x.transpose(0, 2, 3, 1))
    return x, labels

"""Named data sources for the command line: built-in real data or a user's ``.npy``/``.npz``."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from npujax.data.datasets import load_digits_nhwc, load_mnist5k_nhwc
from npujax.data.images import image_folder, photo_crops, text_images, text_lines
from npujax.errors import ConfigError, ShapeError
from npujax.limits import check_array_file, check_bytes

__all__ = ["DATA_SOURCES", "load_inputs"]

#: Built-in sources: name -> (layout, labelled).
DATA_SOURCES = {
    "digits": ("NHWC 8x8x1", True),
    "mnist5k": ("NHWC 28x28x1", True),
    "text": ("NCHW 3-channel rendered text lines, PaddleOCR-normalized", False),
    "photos": ("NCHW 3-channel crops of two photographs, PaddleOCR-normalized", False),
    "lines": ("NCHW 3-channel text lines as PP-OCR's rec preprocessing feeds a recogniser "
              "(full-height font, zero padding on the right), PaddleOCR-normalized", False),
}


def load_inputs(
    source: str,
    input_shape: tuple[int, ...],
    n: int = 256,
    seed: int = 0,
    image_normalization: str | None = None,
) -> tuple[np.ndarray, np.ndarray | None, np.ndarray, np.ndarray | None]:
    """Inputs (and labels where the source has them) for a model taking ``input_shape``.

    Args:
      source: ``digits``, ``mnist5k`` (labelled, their own train/test split), ``text``,
        ``photos`` or ``lines`` (unlabelled images generated at the model's size, NCHW or, for
        a model taking ``(H, W, 3)``, NHWC; see :mod:`npujax.data.images`: ``text`` fits
        whole lines of words into the image, the data for a text classifier or detector;
        ``lines`` draws them as PaddleOCR's rec preprocessing feeds a recogniser,
        :func:`~npujax.data.images.text_lines`; 80 % / 20 % split), the path of a ``.npy``
        file (inputs) or ``.npz`` file (``x``, optional int ``y``; 80 % / 20 % split), or a
        folder of images (:func:`npujax.data.images.image_folder`: its preprocessing, and
        labels from class sub-folders; 80 % / 20 % split). File inputs must be real numbers
        (int, uint or float; converted to float32).
      input_shape: the model's input shape ``(batch, ...)``; the batch size is ignored.
      n: examples generated for ``text``/``photos``/``lines``.
      seed: split and generation seed.
      image_normalization: for a folder of images, how its pixels are scaled, a name of
        :data:`npujax.data.images.IMAGE_NORMALIZATIONS` (``"symmetric"``, the default, ``"unit"``
        or ``"imagenet"``); None: the default. Other sources refuse it (their inputs are
        already scaled).

    Returns:
      ``(x_train, y_train, x_test, y_test)`` as float32 inputs and int32 labels (None when the
      source has no labels).

    Raises:
      ConfigError: unknown source, unreadable file, an ``.npz`` without ``x``, inputs of a
        dtype that is not a real number (bool, complex, strings, objects), no examples or only
        one, NaN or infinite inputs, ``lines`` at a width too narrow for a line of words,
        ``image_normalization`` for a source that is not a folder of images (or unknown).
      ShapeError: the data's per-example shape is not the model's; labels that are not ints
        of shape ``(n,)``.
      LimitError: generated images or a file's arrays over ``max_tensor_bytes`` (checked
        before they are made or read).
    """
    want = tuple(int(d) for d in input_shape[1:])
    if image_normalization is not None and not Path(source).is_dir():
        raise ConfigError(f"--image-normalization applies to a folder of images; --data "
                          f"{source} gives inputs already scaled (the generated sources as "
                          "PaddleOCR feeds its models, files as saved).")
    if source in ("digits", "mnist5k"):
        d = (load_digits_nhwc if source == "digits" else load_mnist5k_nhwc)(seed=seed)
        _check(source, d.x_train, want)
        return d.x_train, d.y_train, d.x_test, d.y_test
    if source in ("text", "photos", "lines"):
        channels_last = len(want) == 3 and want[0] != 3 and want[2] == 3  # a Keras model's
        if len(want) != 3 or (want[0] != 3 and not channels_last):
            raise ShapeError(f"--data {source} makes 3-channel NCHW (or NHWC) images, but the "
                             f"model takes inputs of shape {want}; pass a .npy/.npz file of "
                             "inputs instead.")
        # the images are materialized: n float32 arrays of the model's input size
        check_bytes(n * math.prod(want) * 4, f"--data {source}: {n} generated images of shape "
                    f"{list(want)} (float32)")
        hw = want[:2] if channels_last else want[1:]
        if source == "lines":
            x = text_lines(n, seed=seed, h=hw[0], w=hw[1])[0]
        else:
            x = (text_images if source == "text" else photo_crops)(hw[0], hw[1], n, seed=seed)
        y = None
        if channels_last:
            x = np.ascontiguousarray(x.transpose(0, 2, 3, 1))
    elif Path(source).is_dir():
        x, y = image_folder(source, want, image_normalization or "symmetric")
    else:
        path = Path(source)
        if path.suffix in (".npy", ".npz") and not path.exists():
            raise ConfigError(f"--data {source}: no such file (check the path; the generated "
                              f"sources are {sorted(DATA_SOURCES)}).")
        if path.suffix not in (".npy", ".npz") or not path.is_file():
            raise ConfigError(f"--data must be one of {sorted(DATA_SOURCES)}, an existing .npy/"
                              f".npz file of inputs or a folder of images, got {source!r}.")
        check_array_file(path)  # sizes from the headers, before anything is read
        try:
            loaded = np.load(path, allow_pickle=False)
        except (OSError, ValueError) as e:
            raise ConfigError(f"cannot read {path}: {e}") from None
        if isinstance(loaded, np.ndarray):
            x, y = loaded, None
        else:
            if "x" not in loaded:
                raise ConfigError(f"{path} must hold an array 'x' (inputs) and optionally 'y' "
                                  f"(int labels); it holds {sorted(loaded.files)}.")
            x, y = loaded["x"], (loaded["y"] if "y" in loaded else None)
        if x.dtype.kind not in "iuf":
            raise ConfigError(f"--data {path}: inputs 'x' must be real numbers (int, uint or "
                              f"float), got dtype {x.dtype}; convert them with "
                              "x.astype(np.float32) after your preprocessing.")
        if x.ndim == 0 or len(x) == 0:
            raise ConfigError(f"--data {path}: inputs 'x' hold no examples (shape {x.shape}); "
                              "save a batch (n, ...) with n >= 2.")
        x = np.asarray(x, np.float32)
        if y is not None:
            y = np.asarray(y)
            if y.shape != (len(x),) or not np.issubdtype(y.dtype, np.integer):
                raise ShapeError(f"{path}: 'y' must be int labels of shape ({len(x)},), got "
                                 f"{y.dtype} {y.shape}.")
            y = y.astype(np.int32)
    _check(source, x, want)
    if not np.isfinite(x).all():
        raise ConfigError(f"--data {source}: the inputs hold NaN or inf values.")
    if len(x) < 2:
        raise ConfigError(f"--data {source}: need at least 2 examples, got {len(x)}.")
    perm = np.random.default_rng(seed).permutation(len(x))
    cut = min(max(1, int(round(0.8 * len(x)))), len(x) - 1)  # at least one held out
    tr, te = perm[:cut], perm[cut:]
    return x[tr], None if y is None else y[tr], x[te], None if y is None else y[te]


def _check(source: str, x: np.ndarray, want: tuple[int, ...]) -> None:
    if tuple(x.shape[1:]) != want:
        raise ShapeError(f"--data {source} has examples of shape {tuple(x.shape[1:])}, the model "
                         f"takes {want}; pick data of the model's input size.")

"""The handwritten-digits data set that ships with scikit-learn (no download)."""

from __future__ import annotations

import dataclasses

import numpy as np

__all__ = ["Dataset", "load_digits_nhwc"]


@dataclasses.dataclass(frozen=True)
class Dataset:
    """A fixed train/test split.

    Attributes:
      x_train, x_test: float32 ``(n, 8, 8, 1)`` NHWC images scaled to [0, 1].
      y_train, y_test: int32 ``(n,)`` labels 0-9.
    """

    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray


def load_digits_nhwc(test_fraction: float = 0.2, seed: int = 0) -> Dataset:
    """Load scikit-learn's 1,797 real 8x8 digits (UCI optdigits test set, values 0-16).

    The split is stratified and seeded, so it is the same on every machine.

    Args:
      test_fraction: fraction of images held out for testing.
      seed: split seed.

    Returns:
      A :class:`Dataset` (1,437 train / 360 test images at the defaults).
    """
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    d = load_digits()
    x = (d.images.astype(np.float32) / 16.0)[..., None]
    y = d.target.astype(np.int32)
    xtr, xte, ytr, yte = train_test_split(
        x, y, test_size=test_fraction, random_state=seed, stratify=y
    )
    return Dataset(xtr, ytr, xte, yte)

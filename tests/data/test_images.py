"""Rendered text lines: ``fit=True`` keeps every line inside the crop, as a recogniser sees it;
the generated images in the layout of the model (NCHW, or NHWC for a Keras model)."""

import numpy as np

from npujax.data.images import text_images


def _ink_right_edge(x: np.ndarray) -> np.ndarray:
    """Per image: does any of the last 2 pixel columns differ from the background (top-left)?"""
    bg = x[:, :, :1, :1]
    return (np.abs(x[:, :, :, -2:] - bg) > 0.05).any(axis=(1, 2, 3))


def test_fit_keeps_lines_inside_the_image():
    plain = text_images(48, 320, 6, seed=11)
    fitted = text_images(48, 320, 6, seed=11, fit=True)
    assert _ink_right_edge(plain).sum() >= 2  # long lines run off the right edge, cut
    assert not _ink_right_edge(fitted).any()
    short = ~_ink_right_edge(plain)  # lines that fitted anyway are drawn unchanged
    np.testing.assert_array_equal(fitted[short], plain[short])


def test_generated_images_follow_the_model_layout():
    from npujax.data.sources import load_inputs

    nchw = load_inputs("photos", (1, 3, 16, 24), n=5)[0]
    nhwc = load_inputs("photos", (1, 16, 24, 3), n=5)[0]  # a Keras model's input
    assert nchw.shape == (4, 3, 16, 24) and nhwc.shape == (4, 16, 24, 3)
    np.testing.assert_array_equal(nhwc, nchw.transpose(0, 2, 3, 1))

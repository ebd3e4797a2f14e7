"""Rendered text lines: ``fit=True`` keeps every line inside the crop, as a recogniser sees it;
the generated images in the layout of the model (NCHW, or NHWC for a Keras model)."""

import numpy as np
import pytest

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


def test_data_lines_are_the_recognisers_text_lines_split_80_20():
    """``--data lines`` is :func:`text_lines` at the model's H x W (a recogniser's input), split
    80/20 like the other generated sources."""
    from npujax.data.images import text_lines
    from npujax.data.sources import load_inputs

    tr, y_tr, te, y_te = load_inputs("lines", (1, 3, 32, 256), n=5, seed=3)
    assert tr.shape == (4, 3, 32, 256) and te.shape == (1, 3, 32, 256) and y_tr is y_te is None
    ref = text_lines(5, seed=3, h=32, w=256)[0]
    got = np.concatenate([tr, te])
    assert sorted(map(bytes, got)) == sorted(map(bytes, ref))


def test_text_lines_are_full_height_and_zero_padded_as_paddleocr_feeds_rec():
    """Each line fills the height at one font size and ends before the zero padding (PaddleOCR's
    rec preprocessing); the strings are the drawn words; a too-narrow width is refused."""
    import pytest

    from npujax.data.images import _WORDS, text_lines
    from npujax.errors import ConfigError

    x, strings = text_lines(4, seed=5)
    assert x.shape == (4, 3, 48, 320) and x.dtype == np.float32 and len(strings) == 4
    assert all(2 <= len(s.split()) <= 4 and set(s.split()) <= set(_WORDS) for s in strings)
    for img in x:
        cols = np.flatnonzero((img != 0).any(axis=(0, 1)))  # drawn crop: columns 0..x1-1
        assert cols[0] == 0 and (img[:, :, cols[-1] + 1:] == 0).all()
        crop = img[:, :, : cols[-1] + 1]
        ink = (np.abs(crop - crop[:, :1, :1]) > 0.3).any(axis=(0, 2))  # rows with glyphs
        rows = np.flatnonzero(ink)
        assert rows[-1] - rows[0] + 1 >= 0.3 * 48  # a full-height font, not a shrunken one
        assert -1.0 <= img.min() and img.max() <= 1.0
    assert text_lines(4, seed=5)[1] == strings  # the seed decides
    with pytest.raises(ConfigError, match="width"):
        text_lines(1, seed=0, w=40)


def test_a_missing_data_file_is_named_as_missing(tmp_path):
    """``--data`` with a ``.npy``/``.npz`` path that does not exist says so (the generic "must be
    one of" read as if the path were the wrong kind of thing)."""
    import pytest

    from npujax.data.sources import load_inputs
    from npujax.errors import ConfigError

    with pytest.raises(ConfigError, match=r"nothere\.npy: no such file"):
        load_inputs(str(tmp_path / "nothere.npy"), (1, 3, 8, 8), n=4)
    with pytest.raises(ConfigError, match="must be one of"):  # not a data file at all
        load_inputs(str(tmp_path / "notes.txt"), (1, 3, 8, 8), n=4)


def test_image_folder_normalizations(tmp_path):
    # one RGB image of pixel (0, 128, 255): each scaling as its formula says, per channel
    from PIL import Image

    from npujax.data.images import image_folder
    from npujax.data.sources import load_inputs
    from npujax.errors import ConfigError

    (tmp_path / "d").mkdir()
    Image.new("RGB", (4, 4), (0, 128, 255)).save(tmp_path / "d" / "a.png")
    Image.new("RGB", (4, 4), (0, 128, 255)).save(tmp_path / "d" / "b.png")
    p = np.array([0, 128, 255], np.float32) / 255
    mean, std = np.array([0.485, 0.456, 0.406]), np.array([0.229, 0.224, 0.225])
    want = {"symmetric": (p - 0.5) / 0.5, "unit": p, "imagenet": (p - mean) / std}
    for name, v in want.items():
        x, _ = image_folder(tmp_path / "d", (3, 4, 4), name)
        np.testing.assert_allclose(x[0, :, 0, 0], v, rtol=1e-6, atol=1e-7, err_msg=name)
        x, _ = image_folder(tmp_path / "d", (4, 4, 3), name)  # channels last
        np.testing.assert_allclose(x[0, 0, 0, :], v, rtol=1e-6, atol=1e-7, err_msg=name)
    # the default is [-1, 1], as before
    xtr, _, xte, _ = load_inputs(str(tmp_path / "d"), (1, 3, 4, 4))
    np.testing.assert_array_equal(xtr[0], image_folder(tmp_path / "d", (3, 4, 4))[0][0])
    with pytest.raises(ConfigError, match="RGB"):
        image_folder(tmp_path / "d", (1, 4, 4), "imagenet")
    with pytest.raises(ConfigError, match="choose one of"):
        image_folder(tmp_path / "d", (3, 4, 4), "[0, 1]")
    with pytest.raises(ConfigError, match="applies to a folder of images"):
        load_inputs("digits", (1, 8, 8, 1), image_normalization="unit")

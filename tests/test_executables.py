"""The folder of compiled executables (:mod:`npujax._executables`): a second process (here: a
cleared in-memory table) loads the executable instead of tracing, and gets the same bits."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from npujax import _executables


@pytest.fixture
def folder(tmp_path):
    saved = _executables.folder()
    _executables.enable(tmp_path / "exe")
    _executables._LOADED.clear()
    yield tmp_path / "exe"
    _executables.enable(saved)
    _executables._LOADED.clear()


def _program(traces):
    def run(x, p):
        traces.append(1)
        return {"y": jnp.sin(x) * p["s"] + 1.0 / 3.0, "n": (x > 0).sum()}
    return jax.jit(run)


def test_off_returns_the_jitted_function(tmp_path):
    saved = _executables.folder()
    _executables.enable(None)
    try:
        f = _program([])
        assert _executables.compiled(f, "k", np.ones(3), {"s": 2.0}) is f
    finally:
        _executables.enable(saved)


def test_a_saved_executable_is_loaded_without_tracing_and_gives_the_same_bits(folder):
    x, p = np.linspace(-1.0, 2.0, 7, dtype=np.float32), {"s": np.float32(1.7)}
    traces: list[int] = []
    first = _executables.compiled(_program(traces), ("prog", 1), x, p)(x, p)
    assert len(traces) == 1 and len(list(folder.glob("*.exe"))) == 1
    _executables._LOADED.clear()  # as a fresh process
    again = _executables.compiled(_program(traces), ("prog", 1), x, p)(x, p)
    assert len(traces) == 1  # loaded, not traced
    for k in first:
        assert np.asarray(first[k]).tobytes() == np.asarray(again[k]).tobytes()


def test_the_key_holds_the_static_key_shapes_and_dtypes(folder):
    x, p = np.ones(4, np.float32), {"s": np.float32(2.0)}
    traces: list[int] = []
    _executables.compiled(_program(traces), "a", x, p)
    _executables.compiled(_program(traces), "b", x, p)  # another static key
    _executables.compiled(_program(traces), "a", np.ones(5, np.float32), p)  # another shape
    _executables.compiled(_program(traces), "a", x, {"s": np.float64(2.0)})  # another dtype
    with jax.enable_x64(True):  # the same arguments traced with 64-bit types
        _executables.compiled(_program(traces), "a", x, p)
    assert len(traces) == 5 and len(list(folder.glob("*.exe"))) == 5


def test_an_unreadable_file_is_compiled_again_and_replaced(folder):
    x, p = np.ones(3, np.float32), {"s": np.float32(0.5)}
    traces: list[int] = []
    _executables.compiled(_program(traces), "c", x, p)
    (path,) = folder.glob("*.exe")
    path.write_bytes(b"truncated")
    _executables._LOADED.clear()
    out = _executables.compiled(_program(traces), "c", x, p)(x, p)
    assert len(traces) == 2 and path.stat().st_size > 100
    np.testing.assert_array_equal(out["y"], np.sin(x) * 0.5 + np.float32(1.0 / 3.0))

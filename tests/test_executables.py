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
        key64 = _executables._key("a", None, (x, p))
    # each traced: none loaded another's executable (programs that JAX's compilation cache
    # already holds, such as "b", are not saved: see the next tests)
    assert len(traces) == 5
    keys = {_executables._key(*k) for k in [("a", None, (x, p)), ("b", None, (x, p)),
                                             ("a", None, (np.ones(5, np.float32), p)),
                                             ("a", None, (x, {"s": np.float64(2.0)}))]}
    assert len(keys | {key64}) == 5
    assert {f.stem for f in folder.glob("*.exe")} <= keys | {key64}


def test_an_unreadable_file_is_compiled_again_and_replaced(folder):
    x, p = np.ones(3, np.float32), {"s": np.float32(0.5)}
    traces: list[int] = []
    _executables.compiled(_program(traces), "c", x, p)
    (path,) = folder.glob("*.exe")
    path.write_bytes(b"truncated")
    _executables._LOADED.clear()
    out = _executables.compiled(_program(traces), "c", x, p)(x, p)
    # traced again; the file replaced, or removed where JAX's cache supplied the program
    assert len(traces) == 2 and (not path.exists() or path.stat().st_size > 100)
    np.testing.assert_array_equal(out["y"], np.sin(x) * 0.5 + np.float32(1.0 / 3.0))


def _reciprocal_program(c):
    """A program of its own (the constant ``c`` in it), so no earlier test compiled it."""
    return jax.jit(lambda x: {"y": (x / c + jnp.sqrt(x)) * 2.0})


def test_an_executable_from_jaxs_compilation_cache_is_not_saved(folder):
    """The same program compiled in an earlier process (as before an npujax upgrade changed
    the key): JAX's persistent compilation cache supplies it. Its serialized form lacks the
    kernels in jaxlib 0.10 (the loaded copy failed when run: ``Function ... not found``), so
    it is not saved; whatever is in the folder loads and runs with the same bits."""
    x = np.arange(1.0, 9.0, dtype=np.float32)
    c = np.float32(7.1231)
    want = np.asarray(_reciprocal_program(c)(x)["y"])  # compiled and written to JAX's cache
    got = _executables.compiled(_reciprocal_program(c), "from-cache", x)(x)
    np.testing.assert_array_equal(got["y"], want)
    # (the session's compilation cache is on, tests/conftest.py: it supplied the program)
    assert not (folder / f"{_executables._key('from-cache', None, (x,))}.exe").exists()
    _executables._LOADED.clear()  # as the next process
    again = _executables.compiled(_reciprocal_program(c), "from-cache", x)(x)
    np.testing.assert_array_equal(again["y"], want)


def test_a_file_that_fails_when_run_is_removed_and_compiled_again(folder):
    """A file as npujax before this check wrote it: an executable from JAX's compilation
    cache, serialized. Loading it must never make a run fail."""
    import pickle

    from jax.experimental.serialize_executable import serialize

    x = np.arange(1.0, 9.0, dtype=np.float32)
    c = np.float32(5.4321)
    want = np.asarray(_reciprocal_program(c)(x)["y"])
    from_cache = _reciprocal_program(c).trace(x).lower().compile()
    _executables.compiled(_reciprocal_program(c), "stale", x)  # (learns the file's path)
    path = folder / f"{_executables._key('stale', None, (x,))}.exe"
    folder.mkdir(parents=True, exist_ok=True)
    path.write_bytes(pickle.dumps(serialize(from_cache)))
    _executables._LOADED.clear()
    got = _executables.compiled(_reciprocal_program(c), "stale", x)(x)
    np.testing.assert_array_equal(got["y"], want)

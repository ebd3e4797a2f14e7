"""The folder of exported programs (:mod:`npujax._executables`): a second process (here: a
cleared in-memory table) loads the program instead of tracing, and gets the same bits; nothing
in the folder can run code, and a file that fails a check is compiled again."""

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
    assert len(traces) == 1 and len(list(folder.glob("*.jaxexport"))) == 1
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
    assert len(traces) == 5  # each traced: none loaded another's program
    keys = {_executables._key(*k) for k in [("a", None, (x, p)), ("b", None, (x, p)),
                                             ("a", None, (np.ones(5, np.float32), p)),
                                             ("a", None, (x, {"s": np.float64(2.0)}))]}
    assert len(keys | {key64}) == 5
    assert {f.stem for f in folder.glob("*.jaxexport")} == keys | {key64}


def test_an_unreadable_file_is_compiled_again_and_replaced(folder):
    x, p = np.ones(3, np.float32), {"s": np.float32(0.5)}
    traces: list[int] = []
    _executables.compiled(_program(traces), "c", x, p)
    (path,) = folder.iterdir()
    path.write_bytes(b"truncated")
    _executables._LOADED.clear()
    out = _executables.compiled(_program(traces), "c", x, p)(x, p)
    assert len(traces) == 2 and path.stat().st_size > 100  # traced again, the file replaced
    np.testing.assert_array_equal(out["y"], np.sin(x) * 0.5 + np.float32(1.0 / 3.0))


def _reciprocal_program(c):
    """A program of its own (the constant ``c`` in it), so no earlier test compiled it."""
    return jax.jit(lambda x: {"y": (x / c + jnp.sqrt(x)) * 2.0})


def test_a_program_jaxs_compilation_cache_holds_is_saved_and_loads(folder):
    """The same program compiled in an earlier process (as before an npujax upgrade changed
    the key): JAX's persistent compilation cache supplies its compilation. The folder keeps the
    exported program, not the executable, so it is saved and loads with the same bits (the
    executables that jaxlib 0.10 serialized from that cache lacked their kernels)."""
    x = np.arange(1.0, 9.0, dtype=np.float32)
    c = np.float32(7.1231)
    want = np.asarray(_reciprocal_program(c)(x)["y"])  # compiled and written to JAX's cache
    got = _executables.compiled(_reciprocal_program(c), "from-cache", x)(x)
    np.testing.assert_array_equal(got["y"], want)
    assert (folder / f"{_executables._key('from-cache', None, (x,))}.jaxexport").exists()
    _executables._LOADED.clear()  # as the next process
    again = _executables.compiled(_reciprocal_program(c), "from-cache", x)(x)
    np.testing.assert_array_equal(again["y"], want)


# --- the folder may be shared (NPUJAX_CACHE): nothing in it can run code (issue 28, item 9)


class _Marker:
    """Unpickling this creates the file ``path``: the proof that a pickle was loaded."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


def _unique_program(c):
    return jax.jit(lambda x: {"y": jnp.cos(x) * c - x / 7.0})


def test_a_pickle_in_the_folder_is_never_unpickled(folder, tmp_path):
    """Whatever file the folder holds for a program, a pickle put there (by anyone who can write
    the shared folder) is never loaded: the program is compiled, with the right numbers."""
    import pickle

    x = np.linspace(0.5, 3.0, 6, dtype=np.float32)
    c = np.float32(3.0517)
    want = np.asarray(_unique_program(c)(x)["y"])
    _executables.compiled(_unique_program(c), "pickled", x)  # the file it writes (if any)
    folder.mkdir(parents=True, exist_ok=True)
    marker = tmp_path / "unpickled"
    payload = pickle.dumps(_Marker(marker))
    key = _executables._key("pickled", None, (x,))
    targets = {folder / f"{key}.exe", *folder.iterdir()}  # the old name and every file there
    for path in targets:
        path.write_bytes(payload)
    _executables._LOADED.clear()  # as the next process
    got = _executables.compiled(_unique_program(c), "pickled", x)(x)
    assert not marker.exists(), "a pickle from the cache folder was loaded"
    np.testing.assert_array_equal(got["y"], want)


def test_the_saved_file_holds_no_pickle_and_a_checked_header(folder):
    x = np.arange(3.0, 9.0, dtype=np.float32)
    _executables.compiled(_unique_program(np.float32(1.25)), "format", x)
    (path,) = list(folder.iterdir())
    data = path.read_bytes()
    assert data.startswith(_executables.MAGIC)
    assert b"\x80\x04\x95" not in data[:64]  # (a pickle's protocol-4 opcode)


@pytest.mark.parametrize("damage", ["payload", "header", "truncated", "other key", "version"])
def test_a_damaged_or_foreign_file_is_compiled_again(folder, damage):
    """Checked before anything is deserialized: a flipped payload byte (hash), a broken header,
    a cut file, a valid file under another program's name, another format version."""
    x = np.arange(1.0, 5.0, dtype=np.float32)
    c = np.float32(2.7183)
    want = np.asarray(_unique_program(c)(x)["y"])
    traces: list[int] = []

    def program(x):
        traces.append(1)
        return _unique_program(c)(x)

    _executables.compiled(jax.jit(program), ("damaged", damage), x)
    key = _executables._key(("damaged", damage), None, (x,))
    (path,) = list(folder.iterdir())
    data = bytearray(path.read_bytes())
    if damage == "payload":
        data[-10] ^= 0xFF
    elif damage == "header":
        data[len(_executables.MAGIC) + 2] ^= 0xFF
    elif damage == "truncated":
        data = data[: len(data) // 2]
    elif damage == "other key":  # another program's valid file copied under this name
        _executables.compiled(_unique_program(c), "the other one", x)
        other = folder / path.name.replace(key, _executables._key("the other one", None, (x,)))
        data = bytearray(other.read_bytes())
    else:
        data = data.replace(b'"format": 1', b'"format": 99')
    path.write_bytes(bytes(data))
    _executables._LOADED.clear()
    got = _executables.compiled(jax.jit(program), ("damaged", damage), x)(x)
    assert len(traces) == 2  # traced again: the file was not used
    np.testing.assert_array_equal(got["y"], want)
    assert path.read_bytes().startswith(_executables.MAGIC)  # and it was replaced

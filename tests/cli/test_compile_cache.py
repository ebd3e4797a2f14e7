"""The command line keeps compiled programs between runs (JAX's persistent compilation cache)
in its own folder, unless JAX already has one, it is switched off, or other users could write
it (issue 28, item 9: a cache holds code that is loaded and run)."""

import ast
import logging
import os
from pathlib import Path

import jax
import pytest

from npujax import _program_cache, cli


def _with_cache_dir(value, fn):
    """Run ``fn`` with JAX's cache folder set to ``value``, then put the previous one back."""
    saved = jax.config.jax_compilation_cache_dir
    jax.config.update("jax_compilation_cache_dir", value)
    try:
        return fn(), jax.config.jax_compilation_cache_dir
    finally:
        jax.config.update("jax_compilation_cache_dir", saved)


def test_compile_cache_folder_env_default_and_off(tmp_path, monkeypatch):
    monkeypatch.setenv(cli.COMPILE_CACHE_ENV, str(tmp_path / "xla"))
    assert _with_cache_dir(None, cli.compile_cache) == (str(tmp_path / "xla"),) * 2
    monkeypatch.setenv(cli.COMPILE_CACHE_ENV, "off")
    assert _with_cache_dir(None, cli.compile_cache) == (None, None)
    monkeypatch.delenv(cli.COMPILE_CACHE_ENV)
    monkeypatch.setenv("NPUJAX_CACHE", str(tmp_path / "npujax"))
    assert _with_cache_dir(None, cli.compile_cache) == (str(tmp_path / "npujax" / "jax"),) * 2


def test_a_folder_jax_already_has_is_kept(tmp_path, monkeypatch):
    monkeypatch.setenv(cli.COMPILE_CACHE_ENV, str(tmp_path / "ours"))
    theirs = str(tmp_path / "theirs")
    assert _with_cache_dir(theirs, cli.compile_cache) == (theirs, theirs)


@pytest.mark.skipif(not hasattr(os, "getuid"), reason="no user ids")
def test_the_cache_folder_is_created_private(tmp_path, monkeypatch):
    monkeypatch.setenv(cli.COMPILE_CACHE_ENV, str(tmp_path / "new" / "xla"))
    _with_cache_dir(None, cli.compile_cache)
    assert (tmp_path / "new" / "xla").stat().st_mode & 0o777 == 0o700


@pytest.mark.skipif(not hasattr(os, "getuid"), reason="no user ids")
@pytest.mark.parametrize("mode", [0o777, 0o775, 0o757])
def test_a_folder_other_users_can_write_is_not_used(tmp_path, monkeypatch, caplog, mode):
    """A shared NPUJAX_CACHE: anyone who can write it could put compiled code there that JAX
    would load and run. The programs are compiled instead, with a warning."""
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(mode)
    monkeypatch.setenv(cli.COMPILE_CACHE_ENV, str(shared))
    with caplog.at_level(logging.WARNING):
        assert _with_cache_dir(None, cli.compile_cache) == (None, None)
    assert "other users can write it" in caplog.text and str(shared) in caplog.text


@pytest.mark.skipif(not hasattr(os, "getuid"), reason="no user ids")
def test_a_folder_under_a_folder_other_users_can_write_is_not_used(tmp_path, monkeypatch,
                                                                    caplog):
    """Our own 0700 folder inside a shared one: another user could rename it and put theirs
    in its place. A sticky folder (``/tmp``: only an entry's owner renames it) is fine."""
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    monkeypatch.setenv(cli.COMPILE_CACHE_ENV, str(shared / "jax"))
    with caplog.at_level(logging.WARNING):
        assert _with_cache_dir(None, cli.compile_cache) == (None, None)
    assert "other users can write its folder" in caplog.text and str(shared) in caplog.text
    assert not (shared / "jax").exists()  # nothing created in it
    shared.chmod(0o1777)
    assert _program_cache.private_folder(shared / "jax") is None


def test_npujax_never_unpickles():
    """No module of the package can turn a file into running code: no pickle (or marshal,
    shelve, dill, cloudpickle), no ``allow_pickle=True``, no serialized XLA executables (the
    executable cache read them with ``pickle.loads``)."""
    root = Path(cli.__file__).resolve().parents[1]
    banned = {"pickle", "marshal", "shelve", "dill", "cloudpickle", "_pickle",
              "jax.experimental.serialize_executable"}
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""] + [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.keyword) and node.arg == "allow_pickle" \
                    and not (isinstance(node.value, ast.Constant) and node.value.value is False):
                names = ["allow_pickle"]
            found += [f"{path.relative_to(root)}:{node.lineno}: {n}" for n in names
                      if n in banned or n.split(".")[0] in banned or n == "allow_pickle"]
    assert found == []


class _FakeLibc:
    """A C library whose ``mallopt`` records its calls (the test process's allocator is left
    alone)."""

    def __init__(self):
        self.calls = []
        outer = self

        class _Fn:
            argtypes = restype = None

            def __call__(self, param, value):
                outer.calls.append((param, value))
                return 1
        self.mallopt = _Fn()


def test_lower_caps_the_malloc_arenas_unless_the_user_set_them(monkeypatch):
    """``npujax lower``'s process caps glibc's arenas (M_ARENA_MAX = -8): a first run's
    compilation left ~50 MB in extra arenas. A user's MALLOC_ARENA_MAX wins."""
    import ctypes

    libc = _FakeLibc()
    monkeypatch.setattr(ctypes, "CDLL", lambda name: libc)
    monkeypatch.delenv("MALLOC_ARENA_MAX", raising=False)
    assert cli._few_malloc_arenas() is True
    assert libc.calls == [(-8, 2)]
    monkeypatch.setenv("MALLOC_ARENA_MAX", "4")
    assert cli._few_malloc_arenas() is False
    assert libc.calls == [(-8, 2)]
    assert "lower" in cli._FEW_ARENAS


def test_without_mallopt_nothing_is_capped(monkeypatch):
    import ctypes

    monkeypatch.delenv("MALLOC_ARENA_MAX", raising=False)
    monkeypatch.setattr(ctypes, "CDLL", lambda name: object())  # no mallopt (not glibc)
    assert cli._few_malloc_arenas() is False

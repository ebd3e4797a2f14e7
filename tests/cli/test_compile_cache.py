"""The command line keeps compiled programs between runs (JAX's persistent compilation cache)
in its own folder, unless JAX already has one or it is switched off."""

from pathlib import Path

import jax

from npujax import _executables, cli


def _with_cache_dir(value, fn):
    """Run ``fn`` with JAX's cache folder set to ``value``, then put the previous one back."""
    saved = jax.config.jax_compilation_cache_dir, _executables.folder()
    jax.config.update("jax_compilation_cache_dir", value)
    _executables.enable(None)
    try:
        out = fn(), jax.config.jax_compilation_cache_dir
        exe = _executables.folder()  # the compiled executables go next to JAX's cache
        assert exe == (None if out[0] is None or out[0] == value else
                       Path(out[0]) / "npujax-executables")
        return out
    finally:
        jax.config.update("jax_compilation_cache_dir", saved[0])
        _executables.enable(saved[1])


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

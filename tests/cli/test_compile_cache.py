"""The command line keeps compiled programs between runs (JAX's persistent compilation cache)
in its own folder, unless JAX already has one or it is switched off."""

import jax

from npujax import cli


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

"""A folder of compiled XLA executables, so that a second process skips tracing as well.

JAX's persistent compilation cache (which the command line turns on, ``npujax.cli.compile_cache``)
saves the compilation of a program but not its tracing and lowering: a process that runs the
cost program of ``npujax lower`` again still traces and lowers about 5,000 operations (0.6-0.8 s
of CPU on the PP-OCR detector) before JAX can look the compilation up. This folder keeps the
compiled executable itself (:func:`jax.experimental.serialize_executable.serialize`), keyed by
everything the program is built from: the caller's static key (the layer list, the dataflows),
the structure, shapes and dtypes of the arguments, npujax's own source code, the JAX and jaxlib
versions, the devices, ``XLA_FLAGS`` and the compiler options. A hit loads the executable (about
0.3 s) and runs the same compiled code as a miss would, so the numbers are the same bit for bit.

It is off unless :func:`enable` was called (the command line does, next to JAX's cache, and
``NPUJAX_COMPILE_CACHE=off`` turns both off). A file that cannot be read back (truncated,
another jaxlib) is compiled again and replaced; a folder that cannot be written is skipped.

An executable that JAX's persistent compilation cache supplied (the same program compiled by an
earlier process, e.g. before an npujax upgrade changed the source digest) is not saved: jaxlib
0.10 serializes such an executable without its kernels, and the copy loaded from it fails when
it runs (``NOT_FOUND: Function ... not found``). Every loaded file is therefore run once before
it is used; one that fails (written by an earlier npujax) is removed and the program compiled
again.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import pickle
from collections.abc import Callable, Hashable
from pathlib import Path
from typing import Any

import jax
import numpy as np

__all__ = ["enable", "folder", "compiled"]

log = logging.getLogger(__name__)

_FOLDER: Path | None = None
_LOADED: dict[str, Any] = {}  # key -> executable, the last _KEEP of this process
_KEEP = 64  # as many as the cost program's lru_cache keeps jitted functions


def enable(path: str | os.PathLike | None) -> None:
    """Keep compiled executables in ``path`` (created when first written); None turns it off."""
    global _FOLDER
    _FOLDER = None if path is None else Path(path)


def folder() -> Path | None:
    """The folder in use, or None when off."""
    return _FOLDER


@functools.lru_cache(maxsize=1)
def _source_digest() -> str:
    """SHA-256 of every ``.py`` file of the npujax package (path and contents): a changed cost
    model never loads an executable compiled from the old one."""
    root = Path(__file__).resolve().parent
    h = hashlib.sha256()
    for p in sorted(root.rglob("*.py")):
        h.update(str(p.relative_to(root)).encode())
        h.update(p.read_bytes())
    return h.hexdigest()


def _leaf_signature(x: Any) -> str:
    a = np.asarray(x)
    return f"{type(x).__name__}:{a.dtype}:{a.shape}"


def _key(static: Hashable, options: dict[str, Any] | None, args: tuple[Any, ...]) -> str:
    import jaxlib

    leaves, tree = jax.tree.flatten(args)
    parts = (
        repr(static),
        repr(sorted((options or {}).items())),
        str(tree),
        [_leaf_signature(x) for x in leaves],
        jax.__version__,
        jaxlib.__version__,
        str(jax.dtypes.canonicalize_dtype(np.int64)),  # x64 on or off (a context too)
        [str(d.device_kind) for d in jax.devices()],
        jax.default_backend(),
        os.environ.get("XLA_FLAGS", ""),
        _source_digest(),
    )
    return hashlib.sha256(repr(parts).encode()).hexdigest()


def compiled(
    jitted: Any, static: Hashable, *args: Any, options: dict[str, Any] | None = None
) -> Callable[..., Any]:
    """``jitted`` compiled for ``args``: loaded from the folder when it holds it (and from memory
    after the first call in a process), else traced, compiled and saved there. With the folder
    off, ``jitted`` itself.

    Args:
      jitted: a :func:`jax.jit` function.
      static: what, besides ``args``' structure, shapes and dtypes, the program is built from
        (its ``repr`` enters the key, so it must name everything the trace depends on).
      *args: the arguments the program is compiled for (and called with).
      options: the ``compiler_options`` ``jitted`` was made with (part of the key).

    Returns:
      A callable taking arguments of the same structure, shapes and dtypes as ``args``.
    """
    if _FOLDER is None:
        return jitted
    from jax.experimental.serialize_executable import deserialize_and_load, serialize

    key = _key(static, options, args)
    if key in _LOADED:
        return _LOADED[key]
    while len(_LOADED) >= _KEEP:
        del _LOADED[next(iter(_LOADED))]
    path = _FOLDER / f"{key}.exe"
    if path.exists():
        try:
            payload, in_tree, out_tree = pickle.loads(path.read_bytes())
            exe = deserialize_and_load(payload, in_tree, out_tree)
            jax.block_until_ready(exe(*args))  # one run: a file without kernels fails here
            _LOADED[key] = exe
            return exe
        except Exception as e:  # noqa: BLE001  (any unreadable file: compile again)
            log.debug(f"{path}: not loaded ({e}); compiling again")
            path.unlink(missing_ok=True)
    exe, from_cache = _compile(jitted, args)
    if from_cache:  # (its serialized form would lack the kernels, see the module docstring)
        log.debug(f"{path}: not saved (the executable came from JAX's compilation cache)")
    else:
        try:
            _FOLDER.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_bytes(pickle.dumps(serialize(exe)))
            os.replace(tmp, path)
        except Exception as e:  # noqa: BLE001  (a read-only or full disk: run without saving)
            log.debug(f"{path}: not saved ({e})")
    _LOADED[key] = exe
    return exe


_CACHE_HIT = "/jax/compilation_cache/cache_hits"


def _compile(jitted: Any, args: tuple[Any, ...]) -> tuple[Any, bool]:
    """``(executable, from_cache)``: ``jitted`` traced, lowered and compiled for ``args``;
    ``from_cache`` when JAX's persistent compilation cache supplied the executable (its
    ``/jax/compilation_cache/cache_hits`` event fired during the compilation)."""
    hits: list[str] = []

    def listener(event: str, **kwargs: Any) -> None:
        if event == _CACHE_HIT:
            hits.append(event)

    jax.monitoring.register_event_listener(listener)
    try:
        exe = jitted.trace(*args).lower().compile()
    finally:
        jax.monitoring.unregister_event_listener(listener)
    return exe, bool(hits)

"""A folder of exported programs, so that a second process skips tracing and lowering.

JAX's persistent compilation cache (which the command line turns on, ``npujax.cli.compile_cache``)
saves the compilation of a program but not its tracing and lowering: a process that runs the
cost program of ``npujax lower`` again still traces and lowers about 5,000 operations (0.6-0.8 s
of CPU on the PP-OCR detector) before JAX can look the compilation up. This folder keeps the
lowered program (:func:`jax.export.export`: StableHLO in a versioned flatbuffer), keyed by
everything the program is built from: the caller's static key (the layer list, the dataflows),
the structure, shapes and dtypes of the arguments, npujax's own source code, the JAX and jaxlib
versions, the devices, ``XLA_FLAGS`` and the compiler options. A hit deserializes the program
and compiles it (JAX's compilation cache usually supplies that); a miss exports, saves and runs
the same deserialized program, so the numbers are the same bit for bit.

The folder may be shared (``NPUJAX_CACHE``), so its files are data, never code: no pickle is
ever read. A file is :data:`MAGIC`, one line of JSON (format version, key, JAX and jaxlib
versions, the payload's length and sha256, the output tree by kinds and NamedTuple names) and
the serialized export. All of it is checked before the payload is deserialized; a file that
fails any check (damaged, another version, another program's, an old npujax's pickle) is
removed and the program compiled again. A NamedTuple of the output is looked up among modules
already imported, never imported. A folder that cannot be written is skipped.

It is off unless :func:`enable` was called (the command line does, next to JAX's cache, and
``NPUJAX_COMPILE_CACHE=off`` turns both off).
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import sys
from collections.abc import Callable, Hashable
from pathlib import Path
from typing import Any

import jax
import numpy as np

__all__ = ["enable", "folder", "compiled", "MAGIC"]

log = logging.getLogger(__name__)

_FOLDER: Path | None = None
_LOADED: dict[str, Any] = {}  # key -> executable, the last _KEEP of this process
_KEEP = 64  # as many as the cost program's lru_cache keeps jitted functions

#: The first bytes of every file of the folder.
MAGIC = b"npujax exported program\n"
_FORMAT = 1
_MAX_HEADER = 1 << 20
_SUFFIX = ".jaxexport"


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
    after the first call in a process), else traced, exported, saved there and compiled. With
    the folder off, ``jitted`` itself.

    Args:
      jitted: a :func:`jax.jit` function (its ``compiler_options`` given again as ``options``).
      static: what, besides ``args``' structure, shapes and dtypes, the program is built from
        (its ``repr`` enters the key, so it must name everything the trace depends on).
      *args: the arguments the program is compiled for (and called with).
      options: the ``compiler_options`` ``jitted`` was made with (part of the key, and given to
        the compilation of the exported program).

    Returns:
      A callable taking arguments of the same structure, shapes and dtypes as ``args``.
    """
    if _FOLDER is None:
        return jitted
    key = _key(static, options, args)
    if key in _LOADED:
        return _LOADED[key]
    while len(_LOADED) >= _KEEP:
        del _LOADED[next(iter(_LOADED))]
    leaves = jax.tree.leaves(args)
    path = _FOLDER / f"{key}{_SUFFIX}"
    run = _load(path, key, leaves, options) if path.exists() else None
    if run is None:
        run = _export(jitted, args, key, path, options)
    _LOADED[key] = run
    return run


def _runner(exported: Any, out_tree: Any, leaves: list[Any],
            options: dict[str, Any] | None) -> Callable[..., Any]:
    """The deserialized program compiled for ``leaves``, taking and returning pytrees."""
    kw = {"compiler_options": options} if options else {}
    exe = jax.jit(exported.call, **kw).trace(*leaves).lower().compile()

    def run(*args: Any) -> Any:
        return jax.tree.unflatten(out_tree, exe(*jax.tree.leaves(args)))

    return run


def _export(jitted: Any, args: tuple[Any, ...], key: str, path: Path,
            options: dict[str, Any] | None) -> Callable[..., Any]:
    """Trace and export ``jitted`` for ``args`` (on flat leaves, so that the arguments' own
    pytree types need no serialization), save it, and compile what was saved; ``jitted``
    itself where the program cannot be exported."""
    fun = getattr(jitted, "__wrapped__", None)
    if fun is None:
        return jitted
    leaves, in_tree = jax.tree.flatten(args)
    out_trees: list[Any] = []

    def flat(*xs: Any) -> list[Any]:
        out, tree = jax.tree.flatten(fun(*jax.tree.unflatten(in_tree, xs)))
        out_trees.append(tree)
        return out

    try:
        payload = bytes(jax.export.export(jax.jit(flat))(*leaves).serialize())
        tree_doc = _encode_tree(out_trees[-1])
    except Exception as e:  # noqa: BLE001  (not exportable: run it without the folder)
        log.debug(f"{path}: not exported ({type(e).__name__}: {e}); running it unsaved")
        return jitted
    data = MAGIC + json.dumps(_header(key, payload, tree_doc)).encode() + b"\n" + payload
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_bytes(data)
        os.replace(tmp, path)
    except OSError as e:  # a read-only or full disk: run without saving
        log.debug(f"{path}: not saved ({e})")
    exported, out_tree = _parse(data, key)  # the same program a later process loads
    return _runner(exported, out_tree, leaves, options)


def _header(key: str, payload: bytes, tree_doc: Any) -> dict[str, Any]:
    import jaxlib

    return {"format": _FORMAT, "key": key, "jax": jax.__version__,
            "jaxlib": jaxlib.__version__, "bytes": len(payload),
            "sha256": hashlib.sha256(payload).hexdigest(), "out_tree": tree_doc}


def _load(path: Path, key: str, leaves: list[Any],
          options: dict[str, Any] | None) -> Callable[..., Any] | None:
    """The program saved at ``path`` compiled, or None (and the file removed) if any check
    fails."""
    try:
        exported, out_tree = _parse(path.read_bytes(), key)
        if len(exported.in_avals) != len(leaves):
            raise ValueError(f"{len(exported.in_avals)} inputs, the call has {len(leaves)}")
        return _runner(exported, out_tree, leaves, options)
    except Exception as e:  # noqa: BLE001  (any file that fails a check: compile again)
        log.debug(f"{path}: not loaded ({type(e).__name__}: {e}); compiling again")
        path.unlink(missing_ok=True)
        return None


def _parse(data: bytes, key: str) -> tuple[Any, Any]:
    """``(exported, out_tree)`` of a file's bytes, every header field checked before the
    payload is deserialized.

    Raises:
      ValueError: not a file of this format, version, key or JAX; a payload of another length
        or hash; an output tree it cannot rebuild.
    """
    if not data.startswith(MAGIC):
        raise ValueError("not an npujax exported program")
    end = data.find(b"\n", len(MAGIC), len(MAGIC) + _MAX_HEADER)
    if end < 0:
        raise ValueError("no header line")
    header = json.loads(data[len(MAGIC):end])
    payload = data[end + 1:]
    if not isinstance(header, dict):
        raise ValueError("the header is not a JSON object")
    want = _header(key, payload, header.get("out_tree"))
    for field in ("format", "key", "jax", "jaxlib", "bytes", "sha256"):
        if header.get(field) != want[field]:
            raise ValueError(f"header field {field!r}: {header.get(field)!r}, "
                             f"expected {want[field]!r}")
    out_tree = jax.tree.structure(_decode_tree(header["out_tree"]))
    exported = jax.export.deserialize(bytearray(payload))
    if len(exported.out_avals) != out_tree.num_leaves:
        raise ValueError(f"{len(exported.out_avals)} outputs for {out_tree.num_leaves} leaves")
    return exported, out_tree


def _encode_tree(tree: Any) -> Any:
    """A pytree structure as JSON: ``"*"`` a leaf, null None, ``{"tuple"|"list": [...]}``,
    ``{"dict": [keys, [...]]}`` (string keys), ``{"namedtuple": "module:qualname", ...}``.

    Raises:
      TypeError: another kind of node (the program is then not saved).
    """
    data = tree.node_data()
    if data is None:
        return "*"
    kind, aux = data
    children = [_encode_tree(c) for c in tree.children()]
    if kind is type(None):
        return None
    if kind in (tuple, list):
        return {kind.__name__: children}
    if kind is dict and all(isinstance(k, str) for k in aux):
        return {"dict": [list(aux), children]}
    if issubclass(kind, tuple) and hasattr(kind, "_fields"):
        return {"namedtuple": f"{kind.__module__}:{kind.__qualname__}", "children": children}
    raise TypeError(f"an output node of type {kind.__name__} cannot be saved")


def _decode_tree(doc: Any) -> Any:
    """An example pytree (leaves 0) of :func:`_encode_tree`'s JSON.

    Raises:
      ValueError: anything else, or a NamedTuple that is not in an already imported module.
    """
    if doc == "*":
        return 0
    if doc is None:
        return None
    if isinstance(doc, dict) and len(doc) == 1 and ("tuple" in doc or "list" in doc):
        kind, children = next(iter(doc.items()))
        if isinstance(children, list):
            items = [_decode_tree(c) for c in children]
            return tuple(items) if kind == "tuple" else items
    if isinstance(doc, dict) and set(doc) == {"dict"} and isinstance(doc["dict"], list) \
            and len(doc["dict"]) == 2:
        keys, children = doc["dict"]
        if isinstance(keys, list) and isinstance(children, list) and len(keys) == len(children) \
                and all(isinstance(k, str) for k in keys):
            return {k: _decode_tree(c) for k, c in zip(keys, children)}
    if isinstance(doc, dict) and set(doc) == {"namedtuple", "children"} \
            and isinstance(doc["namedtuple"], str) and isinstance(doc["children"], list):
        cls = _imported_namedtuple(doc["namedtuple"])
        if len(cls._fields) == len(doc["children"]):
            return cls(*[_decode_tree(c) for c in doc["children"]])
    raise ValueError(f"not an output tree: {str(doc)[:80]}")


def _imported_namedtuple(name: str) -> Any:
    """The NamedTuple class ``module:qualname`` of a module already imported, found through
    ``vars`` (no import, no module ``__getattr__``).

    Raises:
      ValueError: no such module imported, attribute or NamedTuple.
    """
    module, _, qualname = name.partition(":")
    obj: Any = sys.modules.get(module)
    for part in qualname.split("."):
        obj = vars(obj).get(part) if obj is not None and hasattr(obj, "__dict__") else None
    if not (isinstance(obj, type) and issubclass(obj, tuple) and hasattr(obj, "_fields")):
        raise ValueError(f"{name!r} is not a NamedTuple of an imported module")
    return obj

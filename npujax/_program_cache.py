"""Traced programs kept between processes, next to JAX's compile cache: numpy programs
(:func:`evaluate`, :mod:`npujax._jaxpr_numpy`) and exported XLA programs (:func:`call`,
:mod:`jax.export`).

:func:`evaluate` is how ``lower`` runs its cost programs: traced once, then carried out with
numpy operation by operation, which for a program run once costs milliseconds where XLA's
compilation costs about a second; the flattened program is kept as JSON, so a later process
neither traces nor compiles. Programs it cannot run go to :func:`call`.

JAX's persistent compilation cache (``npujax.cli.compile_cache``) skips XLA's compilation of a
program it has compiled before, but a fresh process still traces the Python function and lowers
it to StableHLO to find the program's key: for the cost program of ``npujax lower`` (three
dataflows, ~5,000 operations) that is 0.5 CPU s, about as long as loading the compiled program.
:func:`call` keeps the *traced* program too: the first call of a signature exports it
(``jax.export``: trace and lower once, as ``jax.jit`` would) and writes it to the folder; a later
process reads it back (a few milliseconds) and compiles it through the persistent cache, with
no Python tracing. Every call runs the exported program, the first as the later ones, so both
give the same numbers bit for bit, and the XLA program they compile is one (one cache entry).

A program is keyed by everything its trace depends on: the caller's name and static values,
the arguments' tree structure (static fields of dataclasses included) and each leaf's shape,
dtype and weak type, the ``jax_enable_x64`` mode, the compiler options, the backend, the
versions of jax and jaxlib and a digest of npujax's own source files (an edited checkout traces
anew). The folder holds what the process runs, so it is used only where the command line
enabled it (:func:`enable`): in its compile-cache folder, which it checked no other user can
write. Nothing is unpickled: the program's arguments enter flat (their structure is the
caller's), and its output's structure is jax.export's own serialization (tuples, dicts and the
named tuples the caller registers).

Reference: JAX documentation, "Exporting and serializing staged-out computations"
(``jax.export``).
"""

from __future__ import annotations

import collections
import contextlib
import functools
import hashlib
import json
import logging
import os
import stat
import threading
from collections.abc import Callable, Hashable, Iterator, Sequence
from pathlib import Path
from typing import Any

from npujax._atomic import atomic_write_bytes

__all__ = ["enable", "folder", "library_folder", "private_folder", "call", "loaded",
           "cache_every_compilation", "evaluate", "numpy_evaluation", "kept_shapes",
           "keep_shapes"]

_log = logging.getLogger(__name__)

#: Sub-folder of the compile-cache folder holding the exported programs.
SUBFOLDER = "npujax-exported"
#: First bytes of a program file (the format's version in its last byte).
_MAGIC = b"npujax-exported\x02"

_folder: Path | None = None
#: In this process: program key -> jitted call of the exported program.
_loaded: dict[str, Callable[..., Any]] = {}
#: The named tuples registered for jax.export's serialization of tree structures.
_registered: set[type] = set()
#: In this process: program key -> (numpy program, output tree as JSON) for :func:`evaluate`,
#: the :data:`_NUMPY_KEEP` most recently used (a search or a fit lowers many workload lists).
_numpy_programs: collections.OrderedDict[str, tuple[Any, Any]] = collections.OrderedDict()
_NUMPY_KEEP = 64
_numpy_lock = threading.Lock()
#: ``(name, reason)`` of every program :func:`evaluate` traced but could not run with numpy
#: in this process (it compiled them instead): a diagnostic, which the tests check stays empty.
numpy_fallbacks: list[tuple[str, str]] = []
#: Whether :func:`evaluate` runs programs with numpy (:func:`numpy_evaluation` switches it).
_use_numpy = True
#: First bytes of a numpy program file (:mod:`npujax._jaxpr_numpy`).
_NUMPY_MAGIC = b"npujax-numpy-program\x02"


def _sealed(body: bytes, magic: bytes) -> bytes:
    """``magic``, the sha256 of ``body`` (hex) and ``body``: a file :func:`_unsealed` checks."""
    return magic + hashlib.sha256(body).hexdigest().encode() + b"\n" + body


def _unsealed(data: bytes, magic: bytes) -> bytes:
    """The body of a :func:`_sealed` file.

    Raises:
      ValueError: another magic, or a body that is not the one sealed (a damaged file).
    """
    if not data.startswith(magic):
        raise ValueError("not a file of this kind")
    digest, body = data[len(magic):len(magic) + 64], data[len(magic) + 65:]
    if hashlib.sha256(body).hexdigest().encode() != digest:
        raise ValueError("its checksum does not match")
    return body


def enable(path: str | os.PathLike[str] | None) -> None:
    """Keep exported programs in ``path/npujax-exported`` (None: do not keep them).

    ``path`` must be a folder only this user can write (the caller checks it, as
    ``npujax.cli.compile_cache`` does): the programs read from it are run.
    """
    global _folder
    _folder = None if path is None else Path(path) / SUBFOLDER


def private_folder(path: str | os.PathLike[str]) -> str | None:
    """Create ``path`` (mode 0700) if needed and say why it is not private, or None if it is:
    a folder owned by this user that no other user can write, under folders no other user can
    write either (else another user could put a folder of their own in its place), except
    sticky ones such as ``/tmp``, whose entries only their owner can rename. (Where the system
    has no user ids, None.)"""
    if not hasattr(os, "getuid"):
        return None
    folder = Path(path)
    for parent in folder.absolute().parents:  # before creating anything in them
        try:
            pst = parent.stat()
        except FileNotFoundError:
            continue  # created below, 0700
        except OSError as e:
            return f"its folder {str(parent)!r} cannot be read ({e.strerror})"
        if pst.st_uid not in (0, os.getuid()):
            return f"its folder {str(parent)!r} belongs to another user (uid {pst.st_uid})"
        if pst.st_mode & 0o022 and not pst.st_mode & stat.S_ISVTX:
            return (f"other users can write its folder {str(parent)!r} "
                    f"(mode {pst.st_mode & 0o777:o})")
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        st = folder.stat()
    except OSError as e:
        return f"it cannot be created ({e.strerror})"
    if st.st_uid != os.getuid():
        return f"it belongs to another user (uid {st.st_uid})"
    if st.st_mode & 0o022:
        return f"other users can write it (mode {st.st_mode & 0o777:o})"
    return None


def folder() -> Path | None:
    """The folder of exported programs in use, or None (:func:`call` then only jits)."""
    return _folder


@functools.lru_cache(maxsize=1)
def _source_digest() -> str:
    """sha256 of npujax's ``.py`` files (paths and contents): a program traced by other source
    is never reused."""
    root = Path(__file__).resolve().parent
    h = hashlib.sha256()
    for p in sorted(root.rglob("*.py")):
        h.update(str(p.relative_to(root)).encode())
        h.update(b"\0")
        h.update(p.read_bytes())
        h.update(b"\0")
    return h.hexdigest()


def _key(name: str, static: Hashable, in_tree: Any, leaves: list[Any],
         compiler_options: dict[str, Any]) -> str:
    import jax
    import jaxlib

    parts = (name, repr(static), str(in_tree), [str(jax.typeof(x)) for x in leaves],
             bool(jax.config.read("jax_enable_x64")), sorted(compiler_options.items()),
             jax.default_backend(), jax.__version__, jaxlib.__version__, _source_digest())
    return hashlib.sha256(repr(parts).encode()).hexdigest()


def _register(node_types: Sequence[type]) -> None:
    """Make the named tuples ``node_types`` serializable in exported programs' output trees
    (once per process; the name is the class's import path)."""
    from jax import export

    for t in node_types:
        if t not in _registered:
            export.register_namedtuple_serialization(
                t, serialized_name=f"{t.__module__}.{t.__qualname__}")
            _registered.add(t)


def _read(path: Path) -> Any:
    """The exported program in ``path``, or None if absent or unreadable."""
    from jax import export

    try:
        data = path.read_bytes()
    except OSError:
        return None
    try:
        if not data.startswith(_MAGIC):
            raise ValueError("not a program file")
        return export.deserialize(bytearray(data[len(_MAGIC):]))
    except Exception as e:  # noqa: BLE001 - any damage: trace and write it anew
        _log.debug("ignoring the exported program %s (%s)", path, e)
        return None


def _write(path: Path, exported: Any) -> None:
    try:
        data = _MAGIC + bytes(exported.serialize())
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        atomic_write_bytes(path, data)
    except Exception as e:  # noqa: BLE001 - a cache: the run goes on without it
        _log.debug("not keeping the exported program %s (%s)", path, e)


def _export(fn: Callable[..., Any], in_tree: Any, leaves: list[Any],
            shardings: dict[str, Any] | None = None) -> Any:
    """``fn`` traced and lowered on leaves of ``in_tree``: the exported program of the flat
    leaves (its output is ``fn``'s pytree), with the leaves' ``in_shardings`` and the
    ``out_shardings`` of ``shardings`` (none: one device)."""
    import jax
    from jax import export

    def flat(*xs: Any) -> Any:
        return fn(*jax.tree.unflatten(in_tree, xs))

    return export.export(jax.jit(flat, **(shardings or {})))(*leaves)


def _leaf_shardings(args: tuple[Any, ...], in_shardings: Sequence[Any] | None,
                    out_shardings: Any) -> dict[str, Any]:
    """``jax.jit``'s ``in_shardings`` (one per leaf of ``args``, each argument's sharding for
    all its leaves) and ``out_shardings``; empty where neither is given."""
    import jax

    if in_shardings is None and out_shardings is None:
        return {}
    out: dict[str, Any] = {"out_shardings": out_shardings}
    if in_shardings is not None:
        out["in_shardings"] = tuple(s for a, s in zip(args, in_shardings, strict=True)
                                    for _ in jax.tree.leaves(a))
    return out


@contextlib.contextmanager
def cache_every_compilation(active: bool | None = None) -> Iterator[None]:
    """The persistent compilation cache keeps the programs compiled in the block however fast
    they compiled (JAX's threshold is a second; the cost program compiles in about one, and
    loads in a third of that).

    Args:
      active: whether to; None: where :func:`folder` is enabled (a caller that keeps its
        programs in any JAX cache folder passes whether one is set). Where not active, nothing
        changes.
    """
    import jax

    if not (_folder is not None if active is None else active):
        yield
        return
    option = "jax_persistent_cache_min_compile_time_secs"
    before = getattr(jax.config, option)
    jax.config.update(option, 0.0)
    try:
        yield
    finally:
        jax.config.update(option, before)


def exported_of(run: Any) -> Any:
    """The exported program a :func:`call` entry runs."""
    return getattr(run, "__npujax_exported__", None)


@contextlib.contextmanager
def no_lapack(exported: Any) -> Iterator[None]:
    """Lower a program without custom calls without initialising LAPACK.

    Lowering an exported program for the CPU first initialises jaxlib's LAPACK kernels
    (``jax._src.export._export._ensure_backends_initialized``), which imports scipy: 0.3 CPU s,
    a third of a warm ``npujax lower``, for kernels that only a program with custom calls
    (``stablehlo.custom_call``: linear algebra) can run. A program whose serialized module names
    no custom call skips it; anything else, or a jax without that function, runs as it is.
    """
    from jax._src.export import _export

    skip = (exported is not None and b"custom_call" not in exported.mlir_module_serialized
            and callable(getattr(_export, "_ensure_backends_initialized", None)))
    if not skip:
        yield
        return
    before = _export._ensure_backends_initialized
    _export._ensure_backends_initialized = lambda platforms: None
    try:
        yield
    finally:
        _export._ensure_backends_initialized = before


def call(fn: Callable[..., Any], args: tuple[Any, ...], *, name: str, static: Hashable = (),
         compiler_options: dict[str, Any] | None = None,
         node_types: Sequence[type] = (), in_shardings: Sequence[Any] | None = None,
         out_shardings: Any = None, jitted: Callable[..., Any] | None = None) -> Any:
    """``jax.jit(fn, compiler_options=..., in_shardings=..., out_shardings=...)(*args)``,
    through an exported program kept in :func:`folder`; where none is enabled, ``jitted(*args)``
    (the caller's own, cached, jit of ``fn`` with those options) or a plain ``jax.jit``.

    Args:
      fn: a pure function of ``args`` (a pytree of arrays and scalars) returning a pytree of
        arrays; everything else it depends on must be in ``name`` and ``static``.
      args: the arguments.
      name: the program's name (one per function).
      static: the values ``fn`` closes over (its repr enters the key).
      compiler_options: XLA options, as for :func:`jax.jit`.
      node_types: the named tuples in ``fn``'s output (tuples, lists, dicts and None need
        none).
      in_shardings: one sharding per argument (for all its leaves), or None (one device).
      out_shardings: the output's sharding (a prefix of its tree), or None. The shardings
        enter the key (an exported program runs on its number of devices).
      jitted: ``fn`` jitted as above by the caller and kept (so that a process without a
        folder traces it once), used where no folder is enabled; None: a new ``jax.jit``.

    Returns:
      ``fn(*args)``'s pytree of arrays.

    Raises:
      ValueError: ``fn``'s output holds a node type other than those and ``node_types``.
    """
    import jax

    options = dict(compiler_options or {})
    if _folder is None and jitted is not None:
        return jitted(*args)
    if _folder is None:
        sharded: dict[str, Any] = {k: v for k, v in (("in_shardings", in_shardings),
                                     ("out_shardings", out_shardings)) if v is not None}
        return jax.jit(fn, compiler_options=options, **sharded)(*args)
    run = loaded(fn, args, name=name, static=static, compiler_options=options,
                 node_types=node_types, in_shardings=in_shardings,
                 out_shardings=out_shardings, where=_folder)
    with cache_every_compilation(), no_lapack(exported_of(run)):
        return run(*jax.tree.leaves(args))


def loaded(fn: Callable[..., Any], args: tuple[Any, ...], *, name: str,
           static: Hashable = (), compiler_options: dict[str, Any] | None = None,
           node_types: Sequence[type] = (), in_shardings: Sequence[Any] | None = None,
           out_shardings: Any = None, where: Path) -> Callable[..., Any]:
    """The program :func:`call` runs for ``args``' signature, kept in ``where``: a jitted call
    of the exported program of ``fn`` on the flat leaves of ``args`` (``run(*leaves)``), read
    from ``where`` or traced and written there, and kept in this process. Arguments as for
    :func:`call`. Its first call compiles (through the persistent cache); run it inside
    ``no_lapack(exported_of(run))`` to skip jaxlib's LAPACK set-up for a program without
    custom calls.
    """
    import jax

    options = dict(compiler_options or {})
    leaves, in_tree = jax.tree.flatten(args)
    shardings = _leaf_shardings(args, in_shardings, out_shardings)
    key = _key(name, (static, repr(shardings)) if shardings else static, in_tree, leaves,
               options)
    run = _loaded.get(key)
    if run is None:
        _register(node_types)
        path = where / f"{name}-{key[:40]}"
        exported = _read(path)
        if exported is None:
            exported = _export(fn, in_tree, leaves, shardings)
            _write(path, exported)
        run = jax.jit(exported.call, compiler_options=options, **shardings)
        run.__npujax_exported__ = exported  # type: ignore[attr-defined]
        _loaded[key] = run
    return run


def library_folder() -> Path | None:
    """Where a library function that keeps its programs wherever JAX keeps its compiled ones
    (:func:`npujax.ir.execute.inference`) keeps them: :func:`folder` where the command line
    enabled one, else the ``npujax-exported`` sub-folder of JAX's persistent compilation cache
    (``jax_compilation_cache_dir``, set by the user) where that folder is private
    (:func:`private_folder`, checked once per folder); None where neither."""
    if _folder is not None:
        return _folder
    import jax

    current = jax.config.jax_compilation_cache_dir  # type: ignore[attr-defined]
    return _private_subfolder(str(current)) if current else None


@functools.lru_cache(maxsize=8)
def _private_subfolder(path: str) -> Path | None:
    problem = private_folder(path)
    if problem:  # (once per folder: the check is cached)
        _log.warning("not keeping npujax's traced programs in JAX's compilation-cache folder "
                     "%r: %s; npujax runs what that folder holds. Set "
                     "jax_compilation_cache_dir to a folder only you can write.", path, problem)
        return None
    return Path(path) / SUBFOLDER


@contextlib.contextmanager
def numpy_evaluation(active: bool) -> Iterator[None]:
    """Within the block, :func:`evaluate` runs its programs with numpy (``True``, the default)
    or compiles them with XLA (``False``: how tests compare the two)."""
    global _use_numpy
    before = _use_numpy
    _use_numpy = active
    try:
        yield
    finally:
        _use_numpy = before


def _is_named_tuple(t: type) -> bool:
    """Whether ``t`` is one of npujax's named tuples (the only named tuples kept in files)."""
    return (issubclass(t, tuple) and hasattr(t, "_fields")
            and t.__module__.split(".")[0] == "npujax")


def _tree_json(tree: Any, count: list[int]) -> Any:
    """The structure of ``jax.eval_shape``'s output ``tree`` as JSON: leaves numbered in
    ``jax.tree.leaves`` order, containers tuples, lists, dicts with string keys, None and
    npujax's named tuples.

    Raises:
      npujax._jaxpr_numpy.Unsupported: another container.
    """
    from npujax._jaxpr_numpy import Unsupported

    if tree is None:
        return None
    if _is_named_tuple(type(tree)):
        return {"t": f"{type(tree).__module__}:{type(tree).__qualname__}",
                "f": [_tree_json(x, count) for x in tree]}
    if isinstance(tree, dict):
        if not all(isinstance(k, str) for k in tree):
            raise Unsupported("an output dict with keys other than strings")
        return {"d": [[k, _tree_json(tree[k], count)] for k in sorted(tree)]}
    if type(tree) in (tuple, list):
        return {"l" if isinstance(tree, list) else "u": [_tree_json(x, count) for x in tree]}
    if hasattr(tree, "shape") and hasattr(tree, "dtype"):
        count[0] += 1
        return count[0] - 1
    raise Unsupported(f"an output of type {type(tree).__name__}")


def _named_tuple(name: str) -> type:
    """The npujax named tuple ``module:qualname``.

    Raises:
      ValueError: ``name`` is not one.
    """
    import importlib

    module, _, qualname = name.partition(":")
    if module.split(".")[0] != "npujax":
        raise ValueError(f"not an npujax type: {name!r}")
    t: Any = importlib.import_module(module)
    for part in qualname.split("."):
        t = getattr(t, part)
    if not (isinstance(t, type) and _is_named_tuple(t)):
        raise ValueError(f"not an npujax named tuple: {name!r}")
    return t


def _tree_of(spec: Any, leaves: list[Any]) -> Any:
    """The output tree of :func:`_tree_json`'s ``spec`` with ``leaves`` in its places."""
    if spec is None:
        return None
    if isinstance(spec, int):
        return leaves[spec]
    if "t" in spec:
        return _named_tuple(spec["t"])(*[_tree_of(x, leaves) for x in spec["f"]])
    if "d" in spec:
        return {k: _tree_of(v, leaves) for k, v in spec["d"]}
    if "l" in spec:
        return [_tree_of(x, leaves) for x in spec["l"]]
    return tuple(_tree_of(x, leaves) for x in spec["u"])


def _read_numpy(path: Path) -> tuple[Any, Any] | None:
    """The numpy program and output tree in ``path``, or None if absent or unreadable."""
    from npujax._jaxpr_numpy import Program

    try:
        data = path.read_bytes()
    except OSError:
        return None
    try:
        d = json.loads(_unsealed(data, _NUMPY_MAGIC))
        return Program.from_json(d["program"]), d["tree"]
    except Exception as e:  # noqa: BLE001 - any damage: trace and write it anew
        _log.debug("ignoring the numpy program %s (%s)", path, e)
        return None


def evaluate(fn: Callable[..., Any], args: tuple[Any, ...], compiled: Callable[[], Any], *,
             name: str, static: Hashable = ()) -> Any:
    """``fn(*args)`` as XLA computes it, run with numpy instead of compiled.

    ``fn`` is traced (:func:`jax.make_jaxpr`) and its program carried out operation by
    operation by :mod:`npujax._jaxpr_numpy`, each primitive with XLA's semantics: the numbers
    are the compiled program's to float64 rounding (XLA's algebraic simplifier reassociates
    some divisions; counts are exact). The flattened program is kept in this process and,
    where :func:`folder` is enabled, in a file of its own (JSON with a sha256: no pickle), so a
    later process neither compiles nor traces; a damaged file, or one that does not run, is
    traced again. A program holding an operation that module does not carry
    out, or any program within ``numpy_evaluation(False)``, is computed by ``compiled``.

    Args:
      fn: a pure function of ``args`` returning a pytree of arrays, as for :func:`call`.
      args: the arguments (a pytree of numpy arrays and scalars).
      compiled: computes ``fn(*args)`` compiled (the caller's jitted program, or :func:`call`).
      name, static: as for :func:`call`. ``fn``'s output may hold tuples, lists, dicts with
        string keys, None and npujax's named tuples.

    Returns:
      ``fn(*args)``'s pytree of numpy arrays (or what ``compiled`` returns).
    """
    import jax

    from npujax._jaxpr_numpy import Unsupported, flatten

    if not _use_numpy:
        return compiled()
    leaves, in_tree = jax.tree.flatten(args)
    key = _key("numpy:" + name, static, in_tree, leaves, {})
    path = None if _folder is None else _folder / f"{name}-numpy-{key[:40]}"
    entry = _numpy_programs.get(key)
    if entry is None and path is not None:
        entry = _read_numpy(path)
        if entry is not None and entry[0] is not None:
            try:  # a file that reads but does not run (edited by hand): trace anew
                return _remember(key, entry, leaves)
            except Exception as e:  # noqa: BLE001
                _log.debug("ignoring the numpy program %s (%s)", path, e)
                entry = None
    if entry is None:
        closed, shapes = jax.make_jaxpr(fn, return_shape=True)(*args)
        try:
            entry = (flatten(closed), _tree_json(shapes, [0]))
        except Unsupported as e:
            _log.debug("%s: compiled with XLA (%s)", name, e)
            numpy_fallbacks.append((name, str(e)))
            entry = (None, None)
        if path is not None and entry[0] is not None:
            _keep_file(path, _sealed(json.dumps(
                {"program": entry[0].to_json(), "tree": entry[1]},
                separators=(",", ":")).encode(), _NUMPY_MAGIC))
    if entry[0] is None:
        _remember(key, entry, None)
        return compiled()
    return _remember(key, entry, leaves)


def _keep_file(path: Path, data: bytes) -> None:
    """Write a cache file: a temporary file renamed over ``path`` (a reader sees the old file
    or the new one, never part of one), not fsynced (a file a crash truncates fails its
    checksum and is written anew; an import writes a hundred of them). Any failure (a
    read-only folder, a full disk) is logged and ignored: a cache."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        tmp.write_bytes(data)
        os.replace(tmp, path)
    except OSError as e:
        _log.debug("not keeping %s (%s)", path, e)
        with contextlib.suppress(OSError):
            tmp.unlink()


def _remember(key: str, entry: tuple[Any, Any], leaves: list[Any] | None) -> Any:
    """Keep ``entry`` as the process's program of ``key`` (the :data:`_NUMPY_KEEP` most
    recent) and return its output tree for ``leaves`` (None: nothing to run)."""
    program, tree = entry
    out = None if leaves is None else _tree_of(tree, program(*leaves))
    with _numpy_lock:  # (lower may be called from several threads)
        _numpy_programs[key] = entry
        _numpy_programs.move_to_end(key)
        while len(_numpy_programs) > _NUMPY_KEEP:
            _numpy_programs.popitem(last=False)
    return out


#: Sub-folder (next to :data:`SUBFOLDER`) of the output shapes of traced operator signatures.
SHAPES_SUBFOLDER = "npujax-shapes"
_SHAPES_MAGIC = b"npujax-shapes\x01"


def _shapes_path(signature: Any) -> Path | None:
    where = library_folder()
    if where is None:
        return None
    import jax

    key = hashlib.sha256(repr((signature, jax.__version__, _source_digest())).encode())
    return where.parent / SHAPES_SUBFOLDER / key.hexdigest()[:40]


def kept_shapes(signature: Any) -> list[tuple[tuple[int, ...], str]] | None:
    """The output ``(shape, dtype)`` pairs :func:`keep_shapes` kept for an operator signature
    (a repr-stable tuple: op, attributes, input shapes and dtypes), or None (none kept, no
    folder, or a damaged file). The folder is :func:`library_folder`'s: the command line's, or
    JAX's compilation-cache folder where the user set a private one."""
    path = _shapes_path(signature)
    if path is None:
        return None
    try:
        data = json.loads(_unsealed(path.read_bytes(), _SHAPES_MAGIC))
        out = [(tuple(int(d) for d in shape), str(dtype)) for shape, dtype in data]
    except (OSError, ValueError, TypeError):
        return None
    return out


def keep_shapes(signature: Any, outs: Sequence[tuple[Sequence[int], str]]) -> None:
    """Keep an operator signature's output ``(shape, dtype)`` pairs in :func:`library_folder`
    (a later process importing a model with that signature does not trace it); nothing without
    a folder. The key holds the JAX version and npujax's source digest."""
    path = _shapes_path(signature)
    if path is not None:
        _keep_file(path, _sealed(json.dumps(
            [[list(map(int, s)), str(d)] for s, d in outs]).encode(), _SHAPES_MAGIC))

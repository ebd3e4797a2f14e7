"""Lazy re-exports written once: a package's ``if TYPE_CHECKING:`` imports are its lazy names.

A package ``__init__`` that must stay cheap to import lists the names it loads on first use as
``from module import name as name`` inside ``if TYPE_CHECKING:``, where type checkers, editors
and the documentation read them as ordinary imports, and ends with::

    if not TYPE_CHECKING:
        __getattr__, __dir__, __all__ = _lazy.attach(__name__, __file__)

:func:`attach` reads the same lines back from the ``__init__``'s source with :mod:`ast` (well
under a millisecond) and builds the package's ``__getattr__`` (PEP 562): the first
``npujax.lower`` imports :mod:`npujax.plan.lower` and nothing else, and stores the function in
the package, so later lookups are plain attribute reads. ``__all__`` is every name the
``__init__`` re-exports (``X as X``), eager or lazy, in source order. A public submodule is
an attribute too, imported on first use (``import npujax; npujax.ir.fold_batchnorm`` works as
after ``import npujax.ir``), as scipy's subpackages are. Hiding ``__getattr__``
from type checkers keeps a misspelt or removed name a type error instead of ``Any``.

This is scientific-python's ``lazy_loader.attach_stub`` (SPEC 1) with the list kept in the
``__init__`` instead of a ``.pyi`` stub: a stub hides its ``.py`` from type checkers, so a
package importing most names eagerly and a few lazily (:mod:`npujax.quantize`, whose Flax-model
names import flax) would have to write its eager names twice; and there is no data file to ship.
"""

from __future__ import annotations

import ast
import contextlib
import importlib
import importlib.util
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple


class Reexport(NamedTuple):
    """One ``from module import name as name`` of a package's ``__init__``."""

    name: str
    module: str
    #: inside ``if TYPE_CHECKING:`` (loaded on first use)
    lazy: bool


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(stmts: list[ast.stmt], lazy: bool) -> Iterator[Reexport]:
    for stmt in stmts:
        if isinstance(stmt, ast.ImportFrom) and stmt.module and stmt.level == 0:
            for alias in stmt.names:
                if alias.asname == alias.name:
                    yield Reexport(alias.name, stmt.module, lazy)


def _is_submodule(package: str, name: str) -> bool:
    """Whether ``package.name`` is a public module (found on the package's path, not imported)."""
    return (name.isidentifier() and not name.startswith("_")
            and importlib.util.find_spec(f"{package}.{name}") is not None)


def reexports(source: str) -> list[Reexport]:
    """The names a package ``__init__``'s source re-exports, in order.

    Args:
      source: the text of the ``__init__.py``.

    Returns:
      One :class:`Reexport` per top-level ``from module import name as name`` (eager) and per
      such import directly inside a top-level ``if TYPE_CHECKING:`` (lazy); other imports are
      private to the ``__init__``.
    """
    found: list[Reexport] = []
    for stmt in ast.parse(source).body:
        if isinstance(stmt, ast.If) and _is_type_checking(stmt.test):
            found += _imports(stmt.body, lazy=True)
        else:
            found += _imports([stmt], lazy=False)
    return found


def attach(package: str, init_file: str) -> tuple[Callable[[str], Any], Callable[[], list[str]],
                                                  list[str]]:
    """A package's ``__getattr__``, ``__dir__`` and ``__all__`` from its ``__init__``'s imports.

    Args:
      package: the package's ``__name__``.
      init_file: its ``__file__`` (the ``__init__.py``, read as text).

    Returns:
      ``(__getattr__, __dir__, __all__)``: ``__getattr__`` imports a lazy name's module (or a
      public submodule) on first use and caches it in the package; ``__dir__`` lists
      ``__all__``, sorted.
    """
    found = reexports(Path(init_file).read_text(encoding="utf-8"))
    lazy = {r.name: r.module for r in found if r.lazy}
    names = list(dict.fromkeys(r.name for r in found))

    def __getattr__(name: str) -> Any:
        module = lazy.get(name)
        if module is not None:
            value = getattr(importlib.import_module(module), name)
        elif _is_submodule(package, name):  # as after `import package.name`
            value = importlib.import_module(f"{package}.{name}")
        else:
            raise AttributeError(
                f"module {package!r} has no attribute {name!r} (dir({package}) lists its names; "
                f"the rest of the API is one dot further, in its subpackages and modules)")
        setattr(sys.modules[package], name, value)  # later lookups skip __getattr__
        return value

    def __dir__() -> list[str]:
        return sorted(names)

    return __getattr__, __dir__, names


# --- Names read from a module's source, without importing it ---------------------------------
#
# The command line lists registry names in its --help (dataflows, observers, searchers, ...). The
# registries live in modules that import JAX, so importing them would make `npujax --help` cost
# a JAX start-up. :func:`names` reads such a constant from the module's *source* instead, with
# :mod:`ast`, the way :func:`attach` reads an ``__init__``'s imports (or takes the live value
# when the module is imported already): the registry stays the one place each name is written,
# and the parser loads nothing. tests/cli/test_startup.py checks that every value the parser
# reads from source equals the imported registry's.

_ROOT = Path(__file__).parent


def _module_file(module: str) -> Path:
    """The source file of an npujax module, found without importing its package (importlib's
    ``find_spec`` imports the parents)."""
    parts = module.split(".")
    if parts[0] != "npujax":
        raise ValueError(f"{module!r} is not an npujax module")
    base = _ROOT.joinpath(*parts[1:])
    return base / "__init__.py" if base.is_dir() else base.with_suffix(".py")


_TREES: dict[str, ast.Module] = {}


def _tree(module: str) -> ast.Module:
    if module not in _TREES:
        _TREES[module] = ast.parse(_module_file(module).read_text(encoding="utf-8"))
    return _TREES[module]


def _assignment(tree: ast.Module, name: str) -> ast.expr | None:
    """The value of the last top-level ``name = ...`` (or ``name: T = ...``) of a module."""
    found = None
    for stmt in tree.body:
        if isinstance(stmt, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == name for t in stmt.targets):
            found = stmt.value
        elif (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)
              and stmt.target.id == name and stmt.value is not None):
            found = stmt.value
    return found


def _class(module: str, name: str) -> tuple[str, ast.ClassDef]:
    """A class defined in ``module`` or imported into it by ``from npujax... import name``."""
    tree = _tree(module)
    for stmt in tree.body:
        if isinstance(stmt, ast.ClassDef) and stmt.name == name:
            return module, stmt
    for stmt in tree.body:
        if (isinstance(stmt, ast.ImportFrom) and stmt.level == 0 and stmt.module
                and any((a.asname or a.name) == name for a in stmt.names)):
            return _class(stmt.module, name)
    raise LookupError(f"class {name} is not defined in {module}")


def _class_attribute(module: str, cls: str, attr: str) -> Any:
    where, node = _class(module, cls)
    if attr == "__doc__":
        return ast.get_docstring(node)
    for stmt in node.body:
        value = _assignment(ast.Module(body=[stmt], type_ignores=[]), attr)
        if value is not None:
            return ast.literal_eval(value)
    raise LookupError(f"class {where}.{cls} sets no literal {attr!r}")


def _class_name(node: ast.expr) -> str | None:
    """``A`` of an entry written ``A`` or ``A()``."""
    if isinstance(node, ast.Call) and not node.args and not node.keywords:
        node = node.func
    return node.id if isinstance(node, ast.Name) else None


def _registry(module: str, value: ast.expr) -> list[tuple[str, str | None]] | None:
    """``(name, class or None)`` of each entry of a registry written as a dict display with
    literal string keys (``{"a": A, "b": B()}``; the class is None for other values, e.g.
    ``DecoderConfig(...)``) or as ``{x.name: x for x in (A(), B)}`` (the names are the classes'
    ``name`` attributes); None for any other form."""
    if isinstance(value, ast.Dict):
        if not all(isinstance(k, ast.Constant) and isinstance(k.value, str) for k in value.keys):
            return None
        return [(k.value, _class_name(v)) for k, v in zip(value.keys, value.values)]  # type: ignore[union-attr]
    if not (isinstance(value, ast.DictComp) and len(value.generators) == 1):
        return None
    source = value.generators[0].iter
    if not isinstance(source, (ast.Tuple, ast.List)):
        return None
    classes = [_class_name(e) for e in source.elts]
    if not all(classes):
        return None
    return [(_class_attribute(module, c, "name"), c) for c in classes]  # type: ignore[arg-type]


def names(module: str, name: str, attr: str | None = None) -> Any:
    """A registry's names (or a constant) for the command line, without importing the registry.

    When ``module`` is already imported, its live value is used (so an entry registered at run
    time, e.g. by a test or a plugin, is listed); otherwise the value is read from the module's
    source (:func:`source_names`), which imports nothing. Registries read either way give the
    same value: ``tests/cli/test_startup.py`` checks every one the parser reads.

    Args:
      module: the dotted module name, e.g. ``"npujax.hw.spec"``.
      name: the constant's name.
      attr: for a registry of classes (or instances), the class attribute to give per name
        (``"__doc__"``: the cleaned docstring).

    Returns:
      The value: the tuple of a registry's names, ``{name: attribute}`` with ``attr``, else the
      constant itself.

    Raises:
      LookupError: see :func:`source_names`.
    """
    loaded = sys.modules.get(module)
    if loaded is not None and hasattr(loaded, name):
        return live_names(getattr(loaded, name), attr)
    return source_names(module, name, attr)


def live_names(value: Any, attr: str | None = None) -> Any:
    """:func:`names` of an imported registry ``value``: a dict gives the tuple of its keys, or
    with ``attr`` ``{key: attribute of the entry}``; anything else is returned as it is."""
    import inspect

    if attr is not None:
        return {k: inspect.getdoc(v) if attr == "__doc__" else getattr(v, attr)
                for k, v in value.items()}
    return tuple(value) if isinstance(value, dict) else value


def source_names(module: str, name: str, attr: str | None = None) -> Any:
    """A registry constant of an npujax module, read from its source without importing it.

    Understood forms (anything else raises, so a registry rewritten into another form fails the
    parser's test, never silently):

    * a literal: ``FUSION_LEVELS = ("none", "elementwise", ...)``, ``DEFAULT_CHUNK = 4096``;
    * a dict display with literal string keys, a registry
      (``DECODER_CONFIGS = {"qwen2.5-0.5b": DecoderConfig(...)}``, ``{"cle": CLE}``, ``{}``):
      the tuple of its keys;
    * classes or their instances keyed by their ``name`` class attribute,
      ``{x.name: x for x in (A(), B)}``: the tuple of the names;
    * ``tuple(OTHER)`` of such a constant;
    * with ``attr``, for a registry of classes (``{"a": A, "b": B()}`` or the comprehension):
      ``{name: the class attribute attr}``, a literal (e.g. each searcher's ``summary``), or the
      class docstring for ``"__doc__"``. A class may be imported from another npujax module.

    Args:
      module: the dotted module name, e.g. ``"npujax.hw.spec"``.
      name: the constant's name.
      attr: for a registry of instances, the class attribute to read for each name.

    Returns:
      The value (a tuple of names for a registry).

    Raises:
      LookupError: no such constant, or one written in another form.
    """
    value = _assignment(_tree(module), name)
    if value is None:
        raise LookupError(f"{module} has no top-level {name} = ...")
    if (isinstance(value, ast.Call) and isinstance(value.func, ast.Name)
            and value.func.id == "tuple" and len(value.args) == 1
            and isinstance(value.args[0], ast.Name)):
        return source_names(module, value.args[0].id, attr)
    entries = _registry(module, value)
    if entries is not None:
        if attr is None:
            return tuple(k for k, _ in entries)
        if all(c is not None for _, c in entries):
            return {k: _class_attribute(module, c, attr) for k, c in entries}  # type: ignore[arg-type]
    elif attr is None:
        with contextlib.suppress(ValueError):
            return ast.literal_eval(value)
    raise LookupError(f"{module}.{name} is not a literal, a dict with literal keys or a registry "
                      "of classes {x.name: x for x in (A(), ...)}; npujax._lazy.names cannot "
                      f"read it{' with ' + repr(attr) if attr else ''}")

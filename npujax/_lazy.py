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

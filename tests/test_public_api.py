"""The top-level API: a short list, each name written once, loaded on first use.

``npujax/__init__.py`` re-exports its names as ``from module import name as name`` inside
``if TYPE_CHECKING:`` (what type checkers and the docs read) and ``npujax._lazy.attach`` builds
the lazy ``__getattr__`` and ``__all__`` from those same lines; ``npujax.quantize`` and
``npujax.backends`` load their heavier names (flax, onnx) the same way.
"""

import ast
import importlib
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

import npujax
from npujax import _lazy

ROOT = Path(npujax.__file__).parent
#: Packages whose ``__init__`` loads some names lazily.
LAZY_PACKAGES = ["npujax", "npujax.quantize", "npujax.backends"]


def _init_source(package: str) -> str:
    return (ROOT.parent / package.replace(".", "/") / "__init__.py").read_text()


@pytest.mark.parametrize("package", LAZY_PACKAGES)
def test_every_exported_name_resolves_to_its_import_line(package):
    module = importlib.import_module(package)
    for r in _lazy.reexports(_init_source(package)):
        assert getattr(module, r.name) is getattr(importlib.import_module(r.module), r.name), r
    assert set(module.__all__) == {r.name for r in _lazy.reexports(_init_source(package))}
    assert dir(module) == sorted(module.__all__)


def test_import_npujax_loads_no_dependency():
    # (and npujax.lower loads no onnx: tests/test_layering.py)
    code = ("import sys, npujax; dir(npujax); heavy = {'jax', 'numpy', 'flax', 'onnx', 'optax', "
            "'scipy'} & set(sys.modules); assert not heavy, heavy")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr


def test_each_public_name_is_written_once():
    source = _init_source("npujax")
    names = [r.name for r in _lazy.reexports(source)]
    assert len(names) == len(set(names)), "a name is imported twice"
    assert npujax.__all__ == names
    # no second list: no string in the __init__ (besides its docstring) spells a public name,
    # and __all__ is only ever assigned from _lazy.attach
    tree = ast.parse(source)
    strings = {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant)
               and isinstance(n.value, str)} - {ast.get_docstring(tree, clean=False)}
    assert not strings & set(names), strings & set(names)
    assigned = [ast.unparse(n) for n in ast.walk(tree) if isinstance(n, ast.Assign)]
    assert assigned == ["__getattr__, __dir__, __all__ = _lazy.attach(__name__, __file__)"]


def test_the_api_fits_on_one_screen():
    assert len(npujax.__all__) <= 40, "move entry points' helpers to their subpackage"


@pytest.mark.parametrize("package", LAZY_PACKAGES)
def test_no_lazy_name_is_also_a_submodule(package):
    # importing a submodule sets the package attribute of its name, which would then hide the
    # lazy re-export of the same name (__getattr__ runs only for missing attributes)
    path = importlib.import_module(package).__path__
    submodules = {m.name for m in pkgutil.iter_modules(path)}
    lazy = {r.name for r in _lazy.reexports(_init_source(package)) if r.lazy}
    assert not lazy & submodules


def test_subpackages_are_one_dot_away():
    # import npujax; npujax.ir.fold_batchnorm works as after import npujax.ir
    assert npujax.__getattr__("ir") is sys.modules["npujax.ir"]
    with pytest.raises(AttributeError):
        npujax.__getattr__("ir.graph")


@pytest.mark.parametrize("package", sorted(
    m.name for m in pkgutil.iter_modules(npujax.__path__) if m.ispkg and m.name != "cli"))
def test_every_subpackage_name_resolves(package):
    module = importlib.import_module(f"npujax.{package}")
    for name in getattr(module, "__all__", ()):
        assert getattr(module, name) is not None, name


def test_a_missing_name_says_where_to_look():
    with pytest.raises(AttributeError, match="has no attribute 'fold_batchnorm'.*subpackages"):
        npujax.fold_batchnorm  # noqa: B018 (one dot away: npujax.ir.fold_batchnorm)

"""Backends: integer-only execution (:mod:`.integer`) and QDQ ONNX export (:mod:`.onnx_export`,
loaded on first use: it imports onnx)."""

from typing import TYPE_CHECKING

from npujax import _lazy
from npujax.backends.integer import IntegerModel as IntegerModel
from npujax.backends.integer import convert as convert
from npujax.backends.integer import execute_integer as execute_integer

if TYPE_CHECKING:
    from npujax.backends.onnx_export import to_onnx as to_onnx

__all__ = ["convert", "execute_integer", "IntegerModel", "to_onnx"]

if not TYPE_CHECKING:
    __getattr__, __dir__ = _lazy.attach(__name__, __file__)[:2]  # __all__ above, for the docs

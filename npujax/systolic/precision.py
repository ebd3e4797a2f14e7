"""How operand bit widths change a MAC array's speed: one small class per kind of array.

A GEMM's streaming time (the ``T`` cycles of every fold, :mod:`npujax.systolic.dataflow`) at
weight width ``w`` and activation width ``a`` is the time at the array's native ``operand_bits``
``b`` times :meth:`PrecisionScaling.stream_factor`; operands wider than ``b`` take
``passes = ceil(w/b) * ceil(a/b)`` passes on every array (:func:`passes`), and fill/drain never
scales:

==================  ===============================================  =============================
scaling             stream factor                                    source
==================  ===============================================  =============================
``fixed``           1 (narrower operands gain nothing)               a fixed-width int array
``bit_composable``  ``ceil(w'/k) ceil(a'/k) / (b/k)^2``, ``k`` the   Bit Fusion (Sharma et al.,
                    BitBrick width (``brick_bits``)                  ISCA 2018)
``bit_serial``      ``w' a' / b^2``                                  Loom (Sharify et al., DAC
                                                                     2018)
==================  ===============================================  =============================

with ``w' = min(w, b)`` and ``a' = min(a, b)``.

All methods are pure ``jnp`` of (possibly traced, vmapped) widths and hardware numbers.
"""

from __future__ import annotations

import abc
from typing import ClassVar, final

import jax
import jax.numpy as jnp

from npujax import _relax
from npujax._exact import exact
from npujax.errors import ConfigError

__all__ = ["PrecisionScaling", "Fixed", "BitComposable", "BitSerial", "PRECISION_SCALINGS",
           "get_precision_scaling", "passes"]


@exact
def passes(weight_bits: jax.Array, act_bits: jax.Array, operand_bits: jax.Array) -> jax.Array:
    """``ceil(w / b) * ceil(a / b)``: passes of operands wider than the native width ``b``
    (int64, see ``npujax._exact``)."""
    return _relax.count(_relax.ceil(weight_bits / operand_bits)
                        * _relax.ceil(act_bits / operand_bits))


def _capped(bits: jax.Array, operand_bits: jax.Array) -> jax.Array:
    """``min(bits, operand_bits)`` whose gradient stays with ``bits`` at equality (a width at
    the array's native one still saves streaming time when it narrows; ``jnp.minimum`` would
    halve that slope)."""
    return jnp.where(bits <= operand_bits, bits, operand_bits)


class PrecisionScaling(abc.ABC):
    """Scaling of a MAC array's streaming time with the operand widths (module table)."""

    name: ClassVar[str]

    @abc.abstractmethod
    def stream_factor(self, weight_bits: jax.Array, act_bits: jax.Array,
                      operand_bits: jax.Array, brick_bits: jax.Array) -> jax.Array:
        """float32 factor on the streaming cycles at native width (widths in bits, [L] or
        scalars; ``operand_bits`` and ``brick_bits`` scalars)."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


@final
class Fixed(PrecisionScaling):
    """A fixed-width integer array: narrower operands run at the same speed."""

    name = "fixed"

    def stream_factor(self, weight_bits, act_bits, operand_bits, brick_bits):
        return jnp.ones_like(weight_bits)


@final
class BitComposable(PrecisionScaling):
    """Bit Fusion: each PE is ``(b/k)^2`` BitBricks of ``k`` bits that fuse into
    ``(b/k)^2 / (ceil(w/k) ceil(a/k))`` MACs per cycle (Sharma et al., ISCA 2018)."""

    name = "bit_composable"

    def stream_factor(self, weight_bits, act_bits, operand_bits, brick_bits):
        w, a = _capped(weight_bits, operand_bits), _capped(act_bits, operand_bits)
        return _relax.ceil(w / brick_bits) * _relax.ceil(a / brick_bits) / jnp.square(
            operand_bits / brick_bits)


@final
class BitSerial(PrecisionScaling):
    """Loom: weights and activations processed bit-serially, time ``w a / b^2`` (Sharify et al.,
    DAC 2018)."""

    name = "bit_serial"

    def stream_factor(self, weight_bits, act_bits, operand_bits, brick_bits):
        w, a = _capped(weight_bits, operand_bits), _capped(act_bits, operand_bits)
        return w * a / jnp.square(operand_bits)


_BY_NAME: dict[str, PrecisionScaling] = {s.name: s for s in (Fixed(), BitComposable(),
                                                             BitSerial())}
#: Names of the precision scalings, for presets (``[array] precision_scaling``).
PRECISION_SCALINGS = tuple(_BY_NAME)


def get_precision_scaling(name: str | PrecisionScaling) -> PrecisionScaling:
    """The :class:`PrecisionScaling` of a name (or the instance itself).

    Raises:
      ConfigError: an unknown name (lists the valid ones).
    """
    if isinstance(name, PrecisionScaling):
        return name
    if name not in _BY_NAME:
        raise ConfigError(f"unknown precision_scaling {name!r}; use one of "
                          f"{', '.join(PRECISION_SCALINGS)}.")
    return _BY_NAME[name]

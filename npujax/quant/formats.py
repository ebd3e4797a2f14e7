"""Integer number formats for quantization."""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp

from npujax.errors import QuantizationError

__all__ = ["IntFormat", "INT8", "UINT8"]


@dataclasses.dataclass(frozen=True, kw_only=False)
class IntFormat:
    """A signed or unsigned two's-complement integer format of 2 to 16 bits.

    The representable code range is ``[qmin, qmax]``:

    * signed: ``[-2^(b-1), 2^(b-1) - 1]``, or ``[-2^(b-1) + 1, 2^(b-1) - 1]`` with ``narrow_range``
      (symmetric around zero, as TFLite uses for weights so that ``-qmin == qmax``);
    * unsigned: ``[0, 2^b - 1]``, or ``[1, 2^b - 1]`` with ``narrow_range``.

    Args:
      bits: number of bits, 2 <= bits <= 16.
      signed: two's-complement signed codes if True, else unsigned.
      narrow_range: drop the most negative code (signed) or zero (unsigned).

    Raises:
      QuantizationError: if ``bits`` is not an integer in [2, 16].

    Example:
      >>> IntFormat(4).qmin, IntFormat(4).qmax
      (-8, 7)
    """

    bits: int
    signed: bool = True
    narrow_range: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.bits, bool) or not isinstance(self.bits, int):
            raise QuantizationError(
                f"IntFormat.bits must be a Python int, got {self.bits!r} "
                f"({type(self.bits).__name__}); pass e.g. IntFormat(8)."
            )
        if not 2 <= self.bits <= 16:
            raise QuantizationError(
                f"IntFormat.bits must be in [2, 16], got {self.bits}; "
                "1-bit (binary) and >16-bit formats are not supported."
            )

    @property
    def qmin(self) -> int:
        """Smallest representable integer code."""
        if self.signed:
            return -(2 ** (self.bits - 1)) + (1 if self.narrow_range else 0)
        return 1 if self.narrow_range else 0

    @property
    def qmax(self) -> int:
        """Largest representable integer code."""
        return 2 ** (self.bits - 1) - 1 if self.signed else 2**self.bits - 1

    @property
    def levels(self) -> int:
        """Number of representable codes, ``qmax - qmin + 1``."""
        return self.qmax - self.qmin + 1

    @property
    def storage_dtype(self) -> jnp.dtype:
        """Smallest standard integer dtype that holds every code (int8/uint8/int16/uint16)."""
        if self.bits <= 8:
            return jnp.dtype(jnp.int8 if self.signed else jnp.uint8)
        return jnp.dtype(jnp.int16 if self.signed else jnp.uint16)

    def __str__(self) -> str:
        kind = "int" if self.signed else "uint"
        return f"{kind}{self.bits}" + ("_narrow" if self.narrow_range else "")


INT8 = IntFormat(8)
UINT8 = IntFormat(8, signed=False)

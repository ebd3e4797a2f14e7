"""Number formats for quantization: integers of 2-16 bits and the two OCP FP8 formats."""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import ml_dtypes

from npujax.errors import QuantizationError

__all__ = ["IntFormat", "FloatFormat", "INT8", "UINT8", "FP8_E4M3FN", "FP8_E5M2", "Format",
           "check_bits", "MIN_BITS", "MAX_BITS"]

#: The integer widths npujax supports, inclusive: 2 to 16 bits.
MIN_BITS, MAX_BITS = 2, 16


def check_bits(bits: object, what: str = "bits") -> int:
    """``bits`` as an int, after checking that it is a whole number in [2, 16].

    The one place where npujax checks a bit width: number formats, quantization rules and specs,
    precision policies and the latency model all call it.

    Args:
      bits: the width (an int, or a float/numpy number with an integer value).
      what: what the width is, for the message (e.g. ``"weight_bits['fc1']"``).

    Returns:
      The width as a Python int.

    Raises:
      QuantizationError: not a number, not whole, or outside [2, 16] (1-bit binary and >16-bit
        formats are not supported).
    """
    try:
        ok = (not isinstance(bits, bool) and float(bits).is_integer()  # type: ignore[arg-type]
              and MIN_BITS <= float(bits) <= MAX_BITS)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        ok = False
    if not ok:
        raise QuantizationError(f"{what} must be a whole number of bits in [{MIN_BITS}, "
                                f"{MAX_BITS}], got {bits!r}; 1-bit (binary) and >16-bit formats "
                                "are not supported.")
    return int(float(bits))  # type: ignore[arg-type]


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

    Examples:
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
        check_bits(self.bits, "IntFormat.bits")

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


_FP8 = {
    "float8_e4m3fn": ml_dtypes.float8_e4m3fn,
    "float8_e5m2": ml_dtypes.float8_e5m2,
}


@dataclasses.dataclass(frozen=True)
class FloatFormat:
    """An 8-bit floating-point format (OCP FP8) with saturating conversion.

    ``E4M3FN``: 4 exponent / 3 mantissa bits, no infinities, largest finite value 448.
    ``E5M2``: 5 exponent / 2 mantissa bits (IEEE-like, has inf), largest finite value 57344.
    Quantizing follows ONNX QuantizeLinear with ``saturate=1``: ``x / scale`` is rounded to the
    nearest representable value (ties to even, via ml_dtypes) after clipping to
    ``[-max, max]``, so values beyond the range saturate instead of becoming NaN/inf.

    Args:
      name: ``"float8_e4m3fn"`` or ``"float8_e5m2"``.

    Raises:
      QuantizationError: for any other name.

    References:
      Micikevicius et al. 2022, "FP8 Formats for Deep Learning", arXiv:2209.05433.
    """

    name: str

    def __post_init__(self) -> None:
        if self.name not in _FP8:
            raise QuantizationError(
                f"FloatFormat name must be one of {sorted(_FP8)}, got {self.name!r}."
            )

    @property
    def storage_dtype(self) -> jnp.dtype:
        """The ml_dtypes float8 dtype of the codes."""
        return jnp.dtype(_FP8[self.name])

    @property
    def max(self) -> float:
        """Largest finite magnitude (448 for E4M3FN, 57344 for E5M2)."""
        return float(ml_dtypes.finfo(_FP8[self.name]).max)

    @property
    def qmin(self) -> float:
        """Most negative representable value, ``-max``."""
        return -self.max

    @property
    def qmax(self) -> float:
        """Largest representable value, ``max``."""
        return self.max

    @property
    def signed(self) -> bool:
        """FP8 formats are always signed."""
        return True

    def __str__(self) -> str:
        return self.name


#: Either number format.
Format = IntFormat | FloatFormat

#: Signed 8-bit integers, ``[-128, 127]``.
INT8 = IntFormat(8)
#: Unsigned 8-bit integers, ``[0, 255]``.
UINT8 = IntFormat(8, signed=False)
#: OCP FP8 E4M3FN (no infinities, max 448).
FP8_E4M3FN = FloatFormat("float8_e4m3fn")
#: OCP FP8 E5M2 (max 57344).
FP8_E5M2 = FloatFormat("float8_e5m2")

"""Errors raised by npujax.

Every error a user can trigger with bad input is an :class:`NpujaxError` subclass whose message
says what was received, which rule it broke and how to fix it. The CLI turns these into a one-line
message and a non-zero exit code (see ``docs/errors.md`` for the catalogue and exit codes).
"""

from __future__ import annotations

__all__ = [
    "NpujaxError",
    "ConfigError",
    "QuantizationError",
    "CalibrationError",
    "GraphError",
    "UnsupportedOpError",
    "ShapeError",
    "FetchError",
    "LimitError",
    "OutputError",
]


class NpujaxError(Exception):
    """Base class of every error npujax raises on purpose.

    ``exit_code`` is the process exit status the CLI uses for this kind of error.
    """

    exit_code: int = 1

    def __str__(self) -> str:
        # one line, always: messages quoting other libraries (ONNX shape inference) may not be
        return " ".join(super().__str__().split("\n")).strip()


class ConfigError(NpujaxError, ValueError):
    """A hardware preset, run configuration or argument is missing, malformed or out of range."""

    exit_code = 2


class QuantizationError(NpujaxError, ValueError):
    """A number format or quantization parameter is invalid (e.g. 1-bit integers, scale <= 0)."""

    exit_code = 3


class CalibrationError(NpujaxError, ValueError):
    """Calibration data cannot give valid ranges (NaN/inf values, empty iterator)."""

    exit_code = 4


class GraphError(NpujaxError, ValueError):
    """A model cannot be turned into, or read back as, an npujax Graph."""

    exit_code = 5


class UnsupportedOpError(GraphError):
    """An operator or JAX primitive has no npujax implementation."""

    exit_code = 6


class ShapeError(NpujaxError, ValueError):
    """Array shapes or dtypes do not match what an operation requires."""

    exit_code = 7


class FetchError(NpujaxError, OSError):
    """A packaged model could not be downloaded, or its bytes do not match the pinned sha256."""

    exit_code = 8


class LimitError(NpujaxError, ValueError):
    """An input would exceed a resource limit of :mod:`npujax.limits` (a tensor's bytes, a
    model's total bytes, a declared tensor's elements, a count the cost model keeps exact). The
    message names the tensor, its size, the limit and how to raise it."""

    exit_code = 9


class OutputError(NpujaxError, OSError):
    """An output file or folder cannot be written (full disk, no permission, a folder's name
    taken by a file, or a file a run writes taken by one npujax did not write). Nothing of a
    previous run's output, and nothing npujax did not write, is lost or changed."""

    exit_code = 10

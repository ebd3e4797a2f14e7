"""Resource limits, checked before anything is allocated.

npujax reads models, saved files and data from strangers. A small file can declare a huge
tensor (``ConstantOfShape([30000, 30000])`` is 896 bytes of ONNX and 3.6 GB of float32), so every
size that npujax would *materialize* is checked against a limit before the allocation, and a size
over it raises :class:`~npujax.errors.LimitError` naming the tensor, its size, the limit and how
to raise it.

* ``max_tensor_bytes`` (default 1 GiB = 2**30, ``$NPUJAX_MAX_TENSOR_BYTES``): one materialized
  tensor: an ONNX initializer or attribute tensor, an external-data file's slice, a
  constant-folded value, an array of a saved model file.
* ``max_model_bytes`` (default 4 GiB = 2**32, ``$NPUJAX_MAX_MODEL_BYTES``): all materialized
  tensors of one model (or one model file) together, and the size of the file itself.
* ``max_tensor_elements`` (default 2**48, ``$NPUJAX_MAX_TENSOR_ELEMENTS``): the elements of one
  declared tensor (a shape that is only computed with, never allocated, e.g. by ``lower``):
  graph inputs, node outputs, tensor types in a model file, ``--batch``.

Each limit can also be set per call with :func:`limits` (a context manager) or for the process
with :func:`set_limits`, and on the command line with ``npujax --max-tensor-bytes 4GiB ...``
(sizes take the suffixes ``KiB``, ``MiB``, ``GiB``, ``TiB``). The cost model keeps counts exact
up to :data:`MAX_EXACT_COUNT` (2**53) and refuses a layer whose MACs or elements exceed it
(that one is not configurable: beyond it the numbers would no longer be exact).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import re
from collections.abc import Iterator, Sequence

from npujax.errors import ConfigError, LimitError

__all__ = ["Limits", "get_limits", "set_limits", "limits", "parse_size", "check_bytes",
           "check_elements", "ByteBudget", "MAX_EXACT_COUNT", "ENV_VARS"]

#: Counts (cycles, bytes, MACs, elements) the cost model keeps exact: 2**53.
MAX_EXACT_COUNT = 2**53

#: The environment variable of each limit.
ENV_VARS = {"max_tensor_bytes": "NPUJAX_MAX_TENSOR_BYTES",
            "max_model_bytes": "NPUJAX_MAX_MODEL_BYTES",
            "max_tensor_elements": "NPUJAX_MAX_TENSOR_ELEMENTS"}
_CLI = {"max_tensor_bytes": "--max-tensor-bytes", "max_model_bytes": "--max-model-bytes",
        "max_tensor_elements": "--max-tensor-elements"}
_UNITS = {"": 1, "b": 1, "k": 2**10, "kib": 2**10, "kb": 10**3, "m": 2**20, "mib": 2**20,
          "mb": 10**6, "g": 2**30, "gib": 2**30, "gb": 10**9, "t": 2**40, "tib": 2**40,
          "tb": 10**12}


@dataclasses.dataclass(frozen=True, kw_only=True)
class Limits:
    """The resource limits (see the module docstring).

    Attributes:
      max_tensor_bytes: bytes of one materialized tensor, >= 1.
      max_model_bytes: bytes of all materialized tensors of one model together, >= 1.
      max_tensor_elements: elements of one declared tensor shape, >= 1.
    """

    max_tensor_bytes: int = 2**30
    max_model_bytes: int = 2**32
    max_tensor_elements: int = 2**48

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ConfigError(f"limit {f.name} must be a whole number >= 1, got {v!r}.")


def parse_size(text: str | int, what: str = "size") -> int:
    """A byte or element count from ``"1073741824"``, ``"1GiB"``, ``"512MiB"``, ``"2e9"``.

    Raises:
      ConfigError: not a positive whole number with an optional unit suffix.
    """
    if isinstance(text, int) and not isinstance(text, bool):
        value = text
    else:
        m = re.fullmatch(r"\s*([0-9.eE+]+)\s*([a-zA-Z]*)\s*", str(text))
        unit = _UNITS.get(m.group(2).lower()) if m else None
        try:
            number = float(m.group(1)) if m else math.nan
        except ValueError:
            number = math.nan
        if unit is None or not math.isfinite(number) or not (number * unit).is_integer():
            raise ConfigError(f"{what} {text!r} is not a size; write a whole number with an "
                              "optional unit, e.g. 1073741824, 1GiB, 512MiB.")
        value = int(number * unit)
    if value < 1:
        raise ConfigError(f"{what} must be >= 1, got {text!r}.")
    return value


def _from_env() -> Limits:
    values = {}
    for name, var in ENV_VARS.items():
        text = os.environ.get(var)
        if text:
            values[name] = parse_size(text, f"${var}")
    return Limits(**values)


_current: Limits | None = None


def get_limits() -> Limits:
    """The limits in force: those of :func:`set_limits`/:func:`limits`, else the environment
    variables of :data:`ENV_VARS`, else the defaults.

    Raises:
      ConfigError: an environment variable that is not a size.
    """
    return _current if _current is not None else _from_env()


def set_limits(**changes: int | str) -> Limits:
    """Set limits for the process (``set_limits(max_tensor_bytes="4GiB")``); returns the
    previous ones.

    Raises:
      ConfigError: an unknown limit name or a value that is not a size >= 1.
    """
    global _current
    previous = get_limits()
    unknown = sorted(set(changes) - set(ENV_VARS))
    if unknown:
        raise ConfigError(f"unknown limit(s) {unknown}; limits are {sorted(ENV_VARS)}.")
    _current = dataclasses.replace(
        previous, **{k: parse_size(v, k) for k, v in changes.items()})
    return previous


@contextlib.contextmanager
def limits(**changes: int | str) -> Iterator[Limits]:
    """Limits changed inside a ``with`` block (``with limits(max_tensor_bytes=2**32): ...``).

    Raises:
      ConfigError: as :func:`set_limits`.
    """
    global _current
    saved = _current
    set_limits(**changes)
    try:
        yield get_limits()
    finally:
        _current = saved


def _fmt(n: int | float) -> str:
    for unit, size in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:.3g} {unit}"
    return f"{int(n)} bytes"


def _how(name: str) -> str:
    return (f"raise it with {_CLI[name]} on the command line, ${ENV_VARS[name]}, or "
            f"npujax.limits.limits({name}=...) (docs/errors.md)")


def check_bytes(nbytes: int, what: str, *, limit: str = "max_tensor_bytes") -> None:
    """Refuse ``nbytes`` over the limit ``limit`` for ``what`` (e.g. ``"tensor 'w' (float32
    [30000, 30000])"``), before it is allocated.

    Raises:
      LimitError: ``nbytes`` exceeds the limit.
    """
    cap = getattr(get_limits(), limit)
    if nbytes > cap:
        raise LimitError(f"{what} would take {_fmt(nbytes)} ({nbytes:,} bytes), over the limit "
                         f"{limit} = {_fmt(cap)}; {_how(limit)}.")


def check_elements(shape: Sequence[int], what: str) -> int:
    """The element count of a declared ``shape``, refused over ``max_tensor_elements``.

    Raises:
      LimitError: the count exceeds the limit.
      ShapeError: a negative dimension.
    """
    from npujax.errors import ShapeError

    if any(int(d) < 0 for d in shape):
        raise ShapeError(f"{what} has a negative dimension in its shape {list(shape)}.")
    n = math.prod(int(d) for d in shape)
    cap = get_limits().max_tensor_elements
    if n > cap:
        raise LimitError(f"{what} has shape {list(shape)}: {n:,} elements, over the limit "
                         f"max_tensor_elements = {cap:,}; {_how('max_tensor_elements')}.")
    return n


class ByteBudget:
    """Counts the bytes materialized for one model and refuses a tensor that would exceed
    ``max_tensor_bytes`` on its own or ``max_model_bytes`` in total."""

    def __init__(self, where: str):
        self.where = where
        self.used = 0

    def take(self, nbytes: int, what: str) -> None:
        """Account ``nbytes`` for ``what`` before it is allocated.

        Raises:
          LimitError: a limit would be exceeded.
        """
        check_bytes(nbytes, what)
        check_bytes(self.used + nbytes, f"{self.where} (with {what})", limit="max_model_bytes")
        self.used += nbytes


def check_array_file(path: str | os.PathLike[str]) -> None:
    """Check a ``.npy`` or ``.npz`` file against the limits from its headers, before any array
    is read: each array's declared size (``max_tensor_bytes``) and all together
    (``max_model_bytes``); a compressed ``.npz`` member cannot expand past what it declares.

    Raises:
      LimitError: an array or the file over a limit.
      ConfigError: not a readable ``.npy``/``.npz`` file, or an array of Python objects.
    """
    import zipfile

    import numpy as np

    where = str(path)
    check_bytes(os.path.getsize(path), f"data file {where!r}", limit="max_model_bytes")
    budget = ByteBudget(f"the arrays of {where!r}")

    def header(f: object, name: str) -> None:
        version = np.lib.format.read_magic(f)  # type: ignore[arg-type]
        shape, _, dtype = (np.lib.format.read_array_header_1_0(f) if version == (1, 0)  # type: ignore[arg-type]
                           else np.lib.format.read_array_header_2_0(f))  # type: ignore[arg-type]
        if dtype.hasobject:
            raise ConfigError(f"{where!r}: array {name!r} holds Python objects; data files "
                              "hold numbers only.")
        budget.take(check_elements(shape, f"array {name!r} of {where!r}") * dtype.itemsize,
                    f"array {name!r} of {where!r}")

    try:
        if zipfile.is_zipfile(path):
            with zipfile.ZipFile(path) as z:
                for info in z.infolist():
                    with z.open(info) as f:
                        header(f, info.filename)
        else:
            with open(path, "rb") as f:
                header(f, "x")
    except (LimitError, ConfigError):
        raise
    except Exception as e:  # untrusted bytes: any parse failure is a bad file
        raise ConfigError(f"{where!r} is not a readable .npy/.npz file ({type(e).__name__}: "
                          f"{e}).") from None

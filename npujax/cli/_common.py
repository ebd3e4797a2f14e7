"""What the command modules share: console, argument types, logging and the error contract."""

from __future__ import annotations

import argparse
import logging
import math
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from npujax._lazy import names as _names
from npujax.errors import ConfigError, QuantizationError

__all__ = ["console", "bits_spec", "int_list", "positive_int", "add_data_args",
           "add_progress_arg", "configure_logging", "precision_from_bits", "epilog",
           "output_dir", "output_file", "finite_float", "seed"]


def console() -> Any:
    """A rich console on stdout. A terminal gets its own width (table cells wrap, never cut);
    pipes, files and CI logs get a width no table reaches, so every table keeps its natural width:
    each row on one line and no cell shortened to ``…`` (long layer names included)."""
    from rich.console import Console

    return Console(width=None if sys.stdout.isatty() else 10_000)


def bits_spec(text: str | list[str]) -> int | dict[str, int]:
    """``8`` or ``fc1=4,fc2=8`` (a width for every layer, or per named layer); the values of a
    repeated option (``--weight-bits fc1=4 --weight-bits conv1=4``) are combined.

    Raises:
      ConfigError: a malformed spec or a layer named twice.
      QuantizationError: a width outside [:data:`~npujax.numerics.formats.MIN_BITS`,
        :data:`~npujax.numerics.formats.MAX_BITS`] (named with the spec, before any work; the
        library's own check names a layer).
    """
    from npujax.numerics.formats import MAX_BITS, MIN_BITS

    if isinstance(text, list):
        text = ",".join(text)
    try:
        pairs = [kv.split("=", 1) for kv in text.split(",")] if "=" in text else []
        out: int | dict[str, int] = ({k.strip(): int(v) for k, v in pairs} if pairs
                                     else int(text))
    except ValueError:
        raise ConfigError(
            f"bad bit-width spec {text!r}; use a number (8) or layer=bits pairs (fc1=4,fc2=8)."
        ) from None
    widths = list(out.values()) if isinstance(out, dict) else [out]
    if len(widths) != max(len(pairs), 1):
        raise ConfigError(f"bit-width spec {text!r} names a layer twice.")
    if any(not MIN_BITS <= w <= MAX_BITS for w in widths):
        raise QuantizationError(f"bit-width spec {text!r} has a width outside [{MIN_BITS}, "
                                f"{MAX_BITS}]; use whole widths such as 4 or 8.")
    return out


def precision_from_bits(graph: Any, weight_bits: int | Mapping[str, int],
                        act_bits: int | Mapping[str, int]) -> dict[str, Any]:
    """The :data:`~npujax.QuantSpec` of command-line widths: a number for every layer, or
    ``layer=bits`` pairs with the layers not named at 8 bits.

    Raises:
      ConfigError: a name that is not a GEMM layer of the graph.
      QuantizationError: a width outside [2, 16].
    """
    from npujax.ops import quantizable_nodes
    from npujax.quantize.spec import quant_spec

    names = [n.name for n in quantizable_nodes(graph)]

    def full(v: int | Mapping[str, int], what: str) -> int | dict[str, int]:
        if not isinstance(v, Mapping):
            return v
        unknown = sorted(set(v) - set(names))
        if unknown:
            raise ConfigError(f"{what} names {unknown}, which are not GEMM layers of the model; "
                              f"its layers are {names}.")
        return {n: v.get(n, 8) for n in names}

    return quant_spec(graph, full(weight_bits, "--weight-bits"), full(act_bits, "--act-bits"))


def int_list(flag: str):
    """An argparse type for comma-separated integers (``2,4,8``)."""

    def parse(text: str) -> tuple[int, ...]:
        try:
            return tuple(int(v) for v in text.split(","))
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{flag} takes comma-separated integers (e.g. 2,4,8), got {text!r}") from None

    return parse


def positive_int(text: str) -> int:
    """An argparse type for an integer >= 1."""
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {v}")
    return v


def finite_float(low: float = 0.0, high: float = math.inf, *, low_open: bool = True):
    """An argparse type for a finite float in ``(low, high]`` (``[low, high]`` with
    ``low_open=False``); NaN and infinities are refused."""

    def parse(text: str) -> float:
        try:
            v = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        ok = math.isfinite(v) and (v > low if low_open else v >= low) and v <= high
        if not ok:
            left = "(" if low_open else "["
            right = "]" if math.isfinite(high) else ")"
            raise argparse.ArgumentTypeError(
                f"must be a finite number in {left}{low:g}, {high:g}{right}, got {text!r}")
        return v

    return parse


def seed(text: str) -> int:
    """An argparse type for a random seed in ``[0, 2**32)``."""
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if not 0 <= v < 2**32:
        raise argparse.ArgumentTypeError(f"must be in [0, 2**32), got {v}")
    return v


def add_data_args(p: argparse.ArgumentParser) -> None:
    """``--input-shape``, ``--data``, ``--examples`` (models and their data)."""
    p.add_argument("--input-shape", action="append", metavar="NAME=1,3,48,192",
                   help="static shape of an ONNX input with dynamic dimensions")
    p.add_argument("--data", help="digits (default for model.npz), mnist5k, text, photos or "
                   "lines (images generated at the ONNX model's input size; lines: a text "
                   "recogniser's input), or FILE.npy / FILE.npz "
                   "('x' inputs, optional 'y' int labels)")
    p.add_argument("--examples", type=positive_int, default=256,
                   help="images generated for --data text/photos/lines (default 256)")
    p.add_argument("--image-normalization",
                   choices=_names("npujax.data.images", "IMAGE_NORMALIZATIONS"),
                   help="for --data FOLDER of images: how pixels are scaled, as the model was "
                   "trained: symmetric (pixel/127.5 - 1, in [-1, 1], the default; PaddleOCR, "
                   "Keras mode 'tf'), unit (pixel/255, in [0, 1]) or imagenet "
                   "((pixel/255 - mean) / std with ImageNet's mean and std, torchvision's "
                   "Normalize)")


def add_devices_arg(p: argparse.ArgumentParser) -> None:
    """``--devices all|N``: data-parallel batches over the local devices (one when absent)."""
    def devices(text: str) -> str | int:
        if text == "all":
            return text
        try:
            return positive_int(text)
        except argparse.ArgumentTypeError:
            raise argparse.ArgumentTypeError(
                f"takes 'all' or a device count >= 1, got {text!r}") from None

    p.add_argument("--devices", type=devices, metavar="all|N",
                   help="split every batch over the local devices (jax.devices(): GPUs, or "
                        "host devices forced with XLA_FLAGS): 'all' or the first N; the "
                        "batch sizes must be multiples of it (default: one device)")


def add_progress_arg(p: argparse.ArgumentParser) -> None:
    """``--no-progress`` (every long command has it)."""
    p.add_argument("--no-progress", action="store_true",
                   help="no progress on stderr (a bar on a terminal, else a line every few "
                        "seconds and one per phase)")


def configure_logging(verbosity: int) -> None:
    """Messages of npujax's loggers on stderr: warnings with ``-q``, progress notes by default,
    debug details with ``-v``. Only the command line configures logging; the library never
    does."""
    level = {-1: logging.WARNING, 0: logging.INFO}.get(verbosity, logging.DEBUG)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    root = logging.getLogger("npujax")
    root.handlers[:] = [handler]
    root.setLevel(level)
    root.propagate = False


def epilog(*examples: str) -> str:
    """An ``--help`` epilog listing example command lines."""
    return "examples:\n" + "\n".join(f"  {e}" for e in examples)


def output_dir(path: str | None, files: Sequence[str] = ()) -> Path | None:
    """``--out`` as a folder, created now so that a folder that cannot be written fails before
    the work, not after it; ``files``, the names the command writes there, are checked now too.

    Raises:
      ConfigError: the folder cannot be created (no permission), or ``path`` is empty.
      OutputError: a file of that name, or one of ``files`` there that npujax did not write (a
        folder's other files are kept, see ``npujax._atomic.staged_dir``).
    """
    if path is None:
        return None
    if not path.strip():
        raise ConfigError("--out is empty; pass the folder to write to.")
    from npujax._atomic import check_output_dir, refuse_foreign

    out = check_output_dir(path)  # a file of that name: refused now,
    refuse_foreign(out, files)  # and a user's file where the command writes one
    missing = []  # the folders this creates, deepest first (removed again if the run fails)
    p = out.absolute()
    while not p.exists() and p != p.parent:
        missing.append(p)
        p = p.parent
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ConfigError(f"cannot create output folder {path!r}: {e.strerror}; pass another "
                          "--out.") from None
    _CREATED.extend(missing)
    return out


#: Output folders :func:`output_dir` created for this command, deepest first.
_CREATED: list[Path] = []


def discard_created_outputs(failed: bool) -> None:
    """After a command: if it ``failed``, remove the folders :func:`output_dir` created that are
    still empty (a run's outputs appear all together or not at all, and a failed run leaves no
    empty ``--out`` behind); forget them either way."""
    created, _CREATED[:] = list(_CREATED), []
    if not failed:
        return
    for p in created:
        try:
            p.rmdir()  # only an empty folder; a kept chunk or a user's file stays
        except OSError:
            break  # not empty: its parents are not either


def output_file(path: str, flag: str = "--out") -> Path:
    """``--out`` as a file to write at the end: checked now (not empty, not a folder, its folder
    creatable), so that a bad path fails before the work, not after it.

    Raises:
      ConfigError: the path is empty, names a folder, or its folder cannot be created.
    """
    if not path or not path.strip():
        raise ConfigError(f"{flag} is empty; pass the file to write.")
    out = Path(path)
    if out.is_dir() or path.endswith(("/", os.sep)):
        raise ConfigError(f"{flag} {path!r} is a folder; pass a file name (e.g. "
                          f"{str(out / 'policy.json')!r}).")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ConfigError(f"cannot create the folder of {flag} {path!r}: {e.strerror}.") from None
    if not os.access(out.parent, os.W_OK):
        raise ConfigError(f"{flag} {path!r}: its folder is not writable.")
    return out

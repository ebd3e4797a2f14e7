"""The observers by name (the calibration ``observer=`` argument, the CLI's ``--observer``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from npujax.calib.histogram import entropy_observer, mse_observer, percentile_observer
from npujax.calib.observers import (
    Observer,
    ema_minmax_observer,
    mean_minmax_observer,
    minmax_observer,
)
from npujax.errors import CalibrationError

__all__ = ["OBSERVERS", "get_observer"]

_MAKERS: dict[str, Callable[..., Observer]] = {
    "minmax": minmax_observer,
    "mean_minmax": mean_minmax_observer,
    "ema": ema_minmax_observer,
    "percentile": percentile_observer,
    "mse": mse_observer,
    "entropy": entropy_observer,
}

#: Observer names accepted by :func:`get_observer` (and the CLI / experiment configs).
OBSERVERS = tuple(_MAKERS)


def get_observer(name: str, axis: int | None = None, **kwargs: Any) -> Observer:
    """The observer called ``name`` (one of :data:`OBSERVERS`), per tensor or per channel.

    Args:
      name: the observer's name.
      axis: channel axis for per-channel ranges; None for per tensor.
      **kwargs: the observer's options (e.g. ``percentile=``, ``bins=``; min-max has none).

    Raises:
      CalibrationError: for an unknown name (the message lists the known ones).
    """
    if name not in _MAKERS:
        raise CalibrationError(f"unknown observer {name!r}; choose one of {list(OBSERVERS)}.")
    if name in ("minmax", "mean_minmax"):
        return _MAKERS[name](axis=axis)
    return _MAKERS[name](axis=axis, **kwargs)

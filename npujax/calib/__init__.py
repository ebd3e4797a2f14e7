"""Calibration observers (pure init/update pairs) and the calibration driver."""

from npujax.calib.observers import Observer as Observer
from npujax.calib.observers import check_finite_state as check_finite_state
from npujax.calib.observers import ema_minmax_observer as ema_minmax_observer
from npujax.calib.observers import minmax_observer as minmax_observer

__all__ = ["Observer", "minmax_observer", "ema_minmax_observer", "check_finite_state"]

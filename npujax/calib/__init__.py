"""Calibration observers as pure (init, update) pairs: min-max, EMA, percentile, MSE, entropy."""

from npujax.calib.histogram import entropy_observer as entropy_observer
from npujax.calib.histogram import histogram_observer as histogram_observer
from npujax.calib.histogram import mse_observer as mse_observer
from npujax.calib.histogram import percentile_observer as percentile_observer
from npujax.calib.observers import Observer as Observer
from npujax.calib.observers import check_finite_state as check_finite_state
from npujax.calib.observers import ema_minmax_observer as ema_minmax_observer
from npujax.calib.observers import mean_minmax_observer as mean_minmax_observer
from npujax.calib.observers import minmax_observer as minmax_observer
from npujax.calib.registry import OBSERVERS as OBSERVERS
from npujax.calib.registry import get_observer as get_observer

__all__ = [
    "Observer",
    "minmax_observer",
    "ema_minmax_observer",
    "mean_minmax_observer",
    "percentile_observer",
    "mse_observer",
    "entropy_observer",
    "histogram_observer",
    "get_observer",
    "OBSERVERS",
    "check_finite_state",
]

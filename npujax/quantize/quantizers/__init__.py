"""Quantizers: one :class:`~npujax.quantize.quantizers.base.Quantizer` per module, registered by
name in :data:`QUANTIZERS` when this package is imported (every module is imported, so a new
quantizer is one new file)."""

import importlib
import pkgutil

from npujax.quantize.quantizers.base import QUANTIZERS as QUANTIZERS
from npujax.quantize.quantizers.base import QState as QState
from npujax.quantize.quantizers.base import Quantizer as Quantizer
from npujax.quantize.quantizers.base import WeightGrid as WeightGrid
from npujax.quantize.quantizers.base import get_quantizer as get_quantizer
from npujax.quantize.quantizers.base import init_states as init_states
from npujax.quantize.quantizers.base import merge_learned as merge_learned
from npujax.quantize.quantizers.base import quantize_weight as quantize_weight
from npujax.quantize.quantizers.base import register_quantizer as register_quantizer
from npujax.quantize.quantizers.base import split_learned as split_learned
from npujax.quantize.quantizers.lsq import LSQ as LSQ
from npujax.quantize.quantizers.lsq import LSQPlus as LSQPlus
from npujax.quantize.quantizers.lsq import LSQPlusState as LSQPlusState
from npujax.quantize.quantizers.lsq import LSQState as LSQState
from npujax.quantize.quantizers.mixture import Mixture as Mixture
from npujax.quantize.quantizers.mixture import MixtureState as MixtureState
from npujax.quantize.quantizers.ste import STE as STE
from npujax.quantize.quantizers.ste import STEState as STEState

for _m in pkgutil.iter_modules(__path__):
    if _m.name != "base":
        importlib.import_module(f"{__name__}.{_m.name}")

__all__ = [
    "Quantizer", "QUANTIZERS", "register_quantizer", "get_quantizer", "WeightGrid", "QState",
    "STE", "STEState", "LSQ", "LSQState", "LSQPlus", "LSQPlusState", "Mixture", "MixtureState",
    "quantize_weight", "init_states", "split_learned", "merge_learned",
]

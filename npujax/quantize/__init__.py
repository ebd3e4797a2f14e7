"""Quantization applied to a Graph: per-layer specs, rules, calibration, PTQ, QAT training."""

from npujax.quantize.calibrate import calibrate as calibrate
from npujax.quantize.execute import LayerQuant as LayerQuant
from npujax.quantize.execute import QuantSpec as QuantSpec
from npujax.quantize.execute import execute as execute
from npujax.quantize.execute import quant_spec as quant_spec
from npujax.quantize.ptq import bias_correction as bias_correction
from npujax.quantize.ptq import layer_sqnr as layer_sqnr
from npujax.quantize.ptq import ptq as ptq
from npujax.quantize.rules import QuantRule as QuantRule
from npujax.quantize.rules import first_last_rules as first_last_rules
from npujax.quantize.rules import quant_spec_from_rules as quant_spec_from_rules

__all__ = ["LayerQuant", "QuantSpec", "quant_spec", "execute", "calibrate", "ptq",
           "bias_correction", "layer_sqnr", "QuantRule", "quant_spec_from_rules",
           "first_last_rules"]

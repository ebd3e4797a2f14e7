"""Number formats, quantize/dequantize, fake-quant (STE) and learned-step (LSQ/LSQ+) operators."""

from npujax.numerics.core import broadcast_qparam as broadcast_qparam
from npujax.numerics.core import dequantize as dequantize
from npujax.numerics.core import fake_quant as fake_quant
from npujax.numerics.core import quantize as quantize
from npujax.numerics.formats import FP8_E4M3FN as FP8_E4M3FN
from npujax.numerics.formats import FP8_E5M2 as FP8_E5M2
from npujax.numerics.formats import INT8 as INT8
from npujax.numerics.formats import UINT8 as UINT8
from npujax.numerics.formats import FloatFormat as FloatFormat
from npujax.numerics.formats import Format as Format
from npujax.numerics.formats import IntFormat as IntFormat
from npujax.numerics.formats import check_bits as check_bits
from npujax.numerics.lsq import lsq_fake_quant as lsq_fake_quant
from npujax.numerics.lsq import lsq_init_step as lsq_init_step
from npujax.numerics.qparams import MIN_SCALE as MIN_SCALE
from npujax.numerics.qparams import qparams_from_range as qparams_from_range
from npujax.numerics.qparams import weight_qparams as weight_qparams

__all__ = [
    "IntFormat",
    "FloatFormat",
    "Format",
    "check_bits",
    "INT8",
    "UINT8",
    "FP8_E4M3FN",
    "FP8_E5M2",
    "quantize",
    "dequantize",
    "fake_quant",
    "broadcast_qparam",
    "lsq_fake_quant",
    "lsq_init_step",
    "qparams_from_range",
    "weight_qparams",
    "MIN_SCALE",
]

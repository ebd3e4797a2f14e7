"""Number formats, quantize/dequantize and fake-quant operators (ONNX semantics, STE gradients)."""

from npujax.quant.core import dequantize as dequantize
from npujax.quant.core import fake_quant as fake_quant
from npujax.quant.core import quantize as quantize
from npujax.quant.formats import INT8 as INT8
from npujax.quant.formats import UINT8 as UINT8
from npujax.quant.formats import IntFormat as IntFormat
from npujax.quant.qparams import MIN_SCALE as MIN_SCALE
from npujax.quant.qparams import qparams_from_range as qparams_from_range
from npujax.quant.qparams import weight_qparams as weight_qparams

__all__ = [
    "IntFormat",
    "INT8",
    "UINT8",
    "quantize",
    "dequantize",
    "fake_quant",
    "qparams_from_range",
    "weight_qparams",
    "MIN_SCALE",
]

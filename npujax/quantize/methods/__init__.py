"""Post-training quantization methods, one file each behind :class:`PTQMethod`.

:data:`PTQ_METHODS` maps each method's name (the ``npujax quantize --NAME`` flag) to its class;
a new method is one new file and one entry here. (The command line reads this registry from the
source without importing it, ``npujax._lazy.names``: keep it in this literal form.)
"""

from npujax.quantize.methods.adaround import AdaRound as AdaRound
from npujax.quantize.methods.base import PTQMethod as PTQMethod
from npujax.quantize.methods.base import PTQStep as PTQStep
from npujax.quantize.methods.base import Stage as Stage
from npujax.quantize.methods.cle import CrossLayerEqualization as CrossLayerEqualization
from npujax.quantize.methods.gptq import GPTQ as GPTQ
from npujax.quantize.methods.smoothquant import SmoothQuant as SmoothQuant

#: name -> method class, in the order the command line lists them
PTQ_METHODS: dict[str, type[PTQMethod]] = {
    x.name: x for x in (CrossLayerEqualization, SmoothQuant, AdaRound, GPTQ)}

__all__ = ["PTQMethod", "PTQStep", "Stage", "PTQ_METHODS", "CrossLayerEqualization",
           "SmoothQuant", "AdaRound", "GPTQ"]

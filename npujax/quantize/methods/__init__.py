"""Post-training quantization methods, one file each behind :class:`PTQMethod`.

:data:`PTQ_METHODS` maps each method's name (the ``npujax quantize --NAME`` flag) to its class.
"""

from npujax.quantize.methods.base import PTQMethod as PTQMethod
from npujax.quantize.methods.base import PTQStep as PTQStep
from npujax.quantize.methods.base import Stage as Stage

#: name -> method class; each method module registers itself here
PTQ_METHODS: dict[str, type[PTQMethod]] = {}

__all__ = ["PTQMethod", "PTQStep", "Stage", "PTQ_METHODS"]

"""Post-training quantization methods, one file each behind :class:`PTQMethod`.

:data:`PTQ_METHODS` maps each method's name (the ``npujax quantize --NAME`` flag) to its class.
"""

import importlib
import pkgutil

from npujax.quantize.methods.base import PTQMethod as PTQMethod
from npujax.quantize.methods.base import PTQStep as PTQStep
from npujax.quantize.methods.base import Stage as Stage

#: name -> method class; each method module registers itself here
PTQ_METHODS: dict[str, type[PTQMethod]] = {}

# every method module registers itself when imported (a new method is one new file)
for _m in pkgutil.iter_modules(__path__):
    if not _m.name.startswith("_") and _m.name != "base":
        importlib.import_module(f"{__name__}.{_m.name}")

__all__ = ["PTQMethod", "PTQStep", "Stage", "PTQ_METHODS"]

"""The cost passes of the one cost program (:mod:`npujax.plan.program`), one module each.

A module of this package that defines ``PASS`` (a :class:`~npujax.plan.passes.base.CostPass`)
is a registered pass: :func:`registered` finds it, and the composer runs it where it applies, in
the order of ``PASS.order``. A new effect is a new module here and nothing else.
"""

from __future__ import annotations

import functools
import importlib
import pkgutil

from npujax.plan.passes.base import CostPass

__all__ = ["registered"]


@functools.cache
def registered() -> tuple[CostPass, ...]:
    """Every pass of this package, sorted by ``order`` (imported on first call).

    Raises:
      RuntimeError: two passes share a name or an order (a packaging bug, not user input).
    """
    found = []
    for info in pkgutil.iter_modules(__path__):
        module = importlib.import_module(f"{__name__}.{info.name}")
        p = getattr(module, "PASS", None)
        if isinstance(p, CostPass):
            found.append(p)
    found.sort(key=lambda p: p.order)
    if len({p.name for p in found}) < len(found) or len({p.order for p in found}) < len(found):
        raise RuntimeError(f"cost passes share a name or an order: {found}")
    return tuple(found)

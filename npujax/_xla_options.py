"""XLA compiler options that npujax's own many-program computations pass to ``jax.jit``.

XLA:CPU's legacy elemental emitters (``xla_cpu_use_fusion_emitters=False``) compile a program
in about half the time of the MLIR fusion emitters that JAX uses by default, and run it as
fast. A computation that compiles many small programs, each run a few times (the cost program
of ``npujax lower``, the layer-by-layer pieces of the sequential bias correction), spends most
of its time compiling, so it asks for them. The two emitters may order a float sum or contract
a multiply-add differently (a last-bit difference); see :mod:`npujax.plan.lower` and
``experiments/bench/bias_correction_one_pass.py`` for what was measured.
"""

from __future__ import annotations

import functools
from typing import Any

from npujax import _program_cache

__all__ = ["LEGACY_EMITTERS", "cpu_legacy_emitters"]

#: The option; a jaxlib that does not know it refuses it.
LEGACY_EMITTERS = {"xla_cpu_use_fusion_emitters": False}


@functools.lru_cache(maxsize=1)
def cpu_legacy_emitters() -> dict[str, Any]:
    """:data:`LEGACY_EMITTERS` on CPU where this jaxlib accepts it (probed once by compiling a
    one-operation program), else ``{}``."""
    import jax
    import numpy as np

    if jax.default_backend() != "cpu":
        return {}
    try:
        with _program_cache.cache_every_compilation():  # (the command line's: loaded, 5 ms)
            jax.jit(lambda x: x + 1, compiler_options=LEGACY_EMITTERS).lower(
                np.float32(0)).compile()
    except jax.errors.JaxRuntimeError:
        return {}
    return dict(LEGACY_EMITTERS)

"""Weights are checked like activations are: finite, and small enough to quantize.

A non-finite weight poisons everything after it (an ``inf`` in a kernel gives NaN logits, a NaN
gives a NaN scale), and a finite weight near the float32 maximum overflows when quantized to a
narrow integer (int2's grid reaches ``-2 x scale = -2 x amax``). :func:`check_weights` refuses
both before calibration, training or conversion, naming the layer and the parameter.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

import numpy as np

from npujax.errors import CalibrationError

__all__ = ["check_weights", "MAX_ABS_WEIGHT"]

#: Largest weight magnitude npujax quantizes: a quarter of the float32 maximum (about 8.5e37),
#: so ``q x scale`` stays finite for every integer grid (``|q_min| / q_max <= 2`` for int2).
MAX_ABS_WEIGHT = float(np.finfo(np.float32).max) / 4


def check_weights(params: Mapping[str, Mapping[str, Any]],
                  layers: Collection[str] | None = None) -> None:
    """Refuse NaN/inf parameters, and weights too large to quantize, naming the layer.

    Args:
      params: ``{layer: {role: array}}`` (float arrays of any shape).
      layers: the layers whose parameters are checked (default all).

    Raises:
      CalibrationError: a non-finite value or a magnitude above :data:`MAX_ABS_WEIGHT`; the
        message names the layer, the parameter, the count and the first bad value.
    """
    for layer, roles in params.items():
        if layers is not None and layer not in layers:
            continue
        for role, v in roles.items():
            a = np.asarray(v)
            if not np.issubdtype(a.dtype, np.floating) or a.size == 0:
                continue
            bad = ~np.isfinite(a)
            if bad.any():
                first = tuple(int(i) for i in np.argwhere(bad)[0])
                raise CalibrationError(
                    f"layer {layer!r} {role} holds {int(bad.sum())} non-finite value(s) (first: "
                    f"{a[first]} at index {first}); fix or retrain the model: NaN/inf weights "
                    "give NaN outputs and quantization scales.")
            peak = float(np.max(np.abs(a)))
            if peak > MAX_ABS_WEIGHT:
                raise CalibrationError(
                    f"layer {layer!r} {role} holds |w| = {peak:.3g}, above {MAX_ABS_WEIGHT:.3g} "
                    "(float32 max / 4): quantizing it would overflow float32 to inf.")

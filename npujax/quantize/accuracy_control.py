"""The accuracy-bounded PTQ loop: return the most sensitive layers to higher precision until the
accuracy drop is within a bound.

The idea of NNCF's ``quantize_with_accuracy_control`` (its ``max_drop``): measure the float and
the quantized model's metric; while ``float - quantized > max_drop``, take the most sensitive
layer that is still quantized, give it the next wider precision, re-quantize and re-measure.

* **Order**: :func:`npujax.quantize.sensitivity.sensitivity_split` (model-output SQNR with one
  layer's weights, or its inputs, quantized alone; the lower of the two ranks the layer). After a
  layer is widened its own split is measured again at the new widths and it takes its new place
  in the order (the other layers' isolated measurements do not change), so a layer widened to
  8 bits that is still the worst is the next to go to float.
* **Ladder**: each step moves both operands of the layer to the next width of ``ladder`` above
  its current widths (8 by default), and from the widest to float (the layer leaves the spec).
* **Stops** when the drop is within ``max_drop`` or no layer is left quantized.

References:
  NNCF, ``nncf.quantize_with_accuracy_control`` (docs: "Quantization with accuracy control");
  Nagel et al. 2021, arXiv:2106.08295, section 4.3.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from npujax.errors import ConfigError
from npujax.numerics import IntFormat
from npujax.quantize.sensitivity import LayerSensitivity, int_bits, sensitivity_order
from npujax.quantize.spec import LayerQuant, QuantSpec

__all__ = ["AccuracyStep", "AccuracyControl", "accuracy_control", "widen"]


class AccuracyStep(NamedTuple):
    """One step of the loop: a layer returned to higher precision.

    Attributes:
      layer: the layer.
      before: its ``(weight_bits, act_bits)`` before the step.
      after: its widths after (None: float).
      sensitivity: its split at ``before`` (why it was chosen: the worst remaining).
      accuracy: the quantized metric after the step (percent).
      drop: ``float_accuracy - accuracy`` after the step (points).
    """

    layer: str
    before: tuple[int | None, int | None]
    after: tuple[int | None, int | None] | None
    sensitivity: LayerSensitivity
    accuracy: float
    drop: float


@dataclasses.dataclass(frozen=True)
class AccuracyControl:
    """What the loop did.

    Attributes:
      quant: the final quantization spec (widened layers changed, float layers removed).
      float_accuracy: the float model's metric (percent).
      initial_accuracy: the quantized metric before any step.
      accuracy: the final quantized metric.
      max_drop: the bound (points).
      steps: one :class:`AccuracyStep` per layer widening, in order.
      met: whether the final drop is within ``max_drop``.
    """

    quant: QuantSpec
    float_accuracy: float
    initial_accuracy: float
    accuracy: float
    max_drop: float
    steps: tuple[AccuracyStep, ...]
    met: bool

    @property
    def drop(self) -> float:
        """The final drop, ``float_accuracy - accuracy`` (points)."""
        return self.float_accuracy - self.accuracy


def _bits(lq: LayerQuant) -> tuple[int | None, int | None]:
    w = lq.weight_candidates[0] if lq.weight_candidates else None
    return int_bits(w), int_bits(lq.act)


def widen(lq: LayerQuant, ladder: Sequence[int] = (8,)) -> LayerQuant | None:
    """``lq`` at the next precision of ``ladder``: both integer operands at the smallest ladder
    width above the layer's widest operand, or None (float) when none is above.

    Args:
      lq: the layer's quantization (single formats; FP8 operands count as 8 bits).
      ladder: ascending integer widths.

    Returns:
      The widened :class:`LayerQuant` (same scheme: signedness, narrow range, per-channel), or
      None when the layer goes to float.
    """
    current = max(b for b in (lq.weight_bits, lq.act_bits) if b is not None)
    wider = [int(b) for b in sorted(ladder) if b > current]
    if not wider:
        return None
    b = wider[0]

    def at(fmt: Any, scheme: IntFormat) -> Any:
        if fmt is None:
            return None
        return dataclasses.replace(fmt, bits=b) if isinstance(fmt, IntFormat) else scheme

    w = lq.weight_candidates[0] if lq.weight_candidates else None
    return dataclasses.replace(lq, weight=at(w, IntFormat(b, narrow_range=True)),
                               act=at(lq.act, IntFormat(b, signed=False)))


def accuracy_control(
    quant: QuantSpec,
    evaluate: Callable[[QuantSpec], tuple[float, dict[str, Any]]],
    sensitivity: Callable[[QuantSpec, dict[str, Any], Sequence[str] | None],
                          list[LayerSensitivity]],
    float_accuracy: float,
    max_drop: float,
    *,
    ladder: Sequence[int] = (8,),
    on_step: Callable[[AccuracyStep], None] | None = None,
) -> AccuracyControl:
    """Widen the most sensitive layers until ``float_accuracy - accuracy <= max_drop``.

    Args:
      quant: the starting spec (single formats per layer).
      evaluate: ``evaluate(spec) -> (accuracy in percent, state)``: quantize with that spec
        (calibrate, PTQ methods) and measure; ``state`` is passed to ``sensitivity``.
      sensitivity: ``sensitivity(spec, state, layers) -> rows``: the split of ``layers`` (None:
        all) under ``spec`` (:func:`npujax.quantize.sensitivity.sensitivity_split`).
      float_accuracy: the float model's metric (percent).
      max_drop: the allowed drop in points (>= 0).
      ladder: the integer widths a layer is returned to before float (ascending).
      on_step: called after each step (progress, logs).

    Returns:
      An :class:`AccuracyControl`.

    Raises:
      ConfigError: a negative or non-finite ``max_drop``, a ladder width outside [2, 16].
    """
    if not (isinstance(max_drop, (int, float)) and math.isfinite(max_drop) and max_drop >= 0):
        raise ConfigError(f"max_drop must be a finite number of points >= 0, got {max_drop!r}.")
    if any(not 2 <= int(b) <= 16 for b in ladder):
        raise ConfigError(f"ladder widths must be in [2, 16], got {list(ladder)}.")
    spec = dict(quant)
    accuracy, state = evaluate(spec)
    initial = accuracy
    order = sensitivity(spec, state, None)
    steps: list[AccuracyStep] = []
    while float_accuracy - accuracy > max_drop and order:
        worst = order.pop(0)
        before = _bits(spec[worst.name])
        lq = widen(spec[worst.name], ladder)
        if lq is None:
            del spec[worst.name]
        else:
            spec[worst.name] = lq
        accuracy, state = evaluate(spec)
        step = AccuracyStep(worst.name, before, None if lq is None else _bits(lq), worst,
                            accuracy, float_accuracy - accuracy)
        steps.append(step)
        if on_step is not None:
            on_step(step)
        if lq is not None:  # measured again at its new widths, back in its place in the order
            order = sensitivity_order([*order, *sensitivity(spec, state, [worst.name])])
    return AccuracyControl(spec, float_accuracy, initial, accuracy, float(max_drop),
                           tuple(steps), float_accuracy - accuracy <= max_drop)

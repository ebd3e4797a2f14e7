"""The one interface every post-training quantization method implements.

A PTQ method rewrites a float model's parameters (and, where the method decides them, the
quantizer states) around calibration. Methods run in two stages:

========================  =====================================================================
``pre_calibration``       rewrite the *float* model so that it quantizes better, keeping its
                          float function equal (cross-layer equalization, SmoothQuant); observers
                          then calibrate the rewritten model.
``post_calibration``      choose the quantized weights given calibrated activation ranges
                          (AdaRound, GPTQ); they may fix weight scales in ``qstate``.
========================  =====================================================================

``npujax quantize`` runs every selected method of the first
stage in the order given, calibrate, then every selected method of the second stage. A method is
one file in this folder and one entry in :data:`npujax.quantize.methods.PTQ_METHODS`.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from typing import Any, ClassVar, Literal, NamedTuple

from jax.typing import ArrayLike

from npujax.ir.graph import Graph, Params
from npujax.quantize.spec import QuantSpec

__all__ = ["PTQMethod", "PTQStep", "Stage"]

Stage = Literal["pre_calibration", "post_calibration"]
"""When a method runs: before calibration (on the float model) or after it."""


class PTQStep(NamedTuple):
    """What one PTQ method returns.

    Attributes:
      graph: the model graph (a method that absorbs or inserts scales may change it; most return
        the graph they were given).
      params: the new parameters, float32, the same tree structure as the input's.
      quant: the quantization spec (a method may set formats it decided, e.g. GPTQ's group size).
      qstate: the quantizer states (``None`` before calibration).
      notes: one line per layer or decision, for the report (e.g. ``"conv1->conv2: 16 channels
        equalized, max range ratio 41.2 -> 1.0"``).
    """

    graph: Graph
    params: Params
    quant: QuantSpec
    qstate: dict[str, Any] | None
    notes: tuple[str, ...]


class PTQMethod(abc.ABC):
    """A post-training quantization method (see the module docstring for the two stages).

    Subclasses are frozen configuration (keyword-only dataclasses): their fields are the method's
    hyper-parameters with the paper's defaults, validated in ``__post_init__`` with a
    :class:`npujax.errors.ConfigError` naming the field.
    """

    #: the registry name and the ``npujax quantize --NAME`` flag
    name: ClassVar[str]
    #: when it runs relative to calibration
    stage: ClassVar[Stage]

    @abc.abstractmethod
    def apply(self, graph: Graph, params: Params, quant: QuantSpec,
              batches: Sequence[ArrayLike], qstate: dict[str, Any] | None) -> PTQStep:
        """Run the method.

        Args:
          graph: the BN-folded float model.
          params: its parameters.
          quant: the quantization spec (which layers, which formats).
          batches: calibration batches, float32 ``(batch, ...)`` in the model's input layout.
          qstate: calibrated quantizer states for ``post_calibration`` methods, else ``None``.

        Returns:
          A :class:`PTQStep`.

        Raises:
          CalibrationError: empty or non-finite data.
        """

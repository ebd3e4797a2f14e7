"""The settings of a precision search (:class:`SearchConfig`), validated once."""

from __future__ import annotations

import dataclasses
import math

from npujax.errors import ConfigError
from npujax.numerics import check_bits
from npujax.search.base import Pinned
from npujax.search.registry import SEARCHERS

__all__ = ["SearchConfig", "SENSITIVITIES"]

#: Sensitivity measures of the ``ilp`` and ``greedy`` searchers.
SENSITIVITIES = ("hessian", "loss")


@dataclasses.dataclass(frozen=True, kw_only=True)
class SearchConfig:
    """How :func:`npujax.search_precision` searches (defaults: HAWQ-V3's integer program).

    Attributes:
      method: the searcher, a name of :data:`npujax.search.SEARCHERS` (``ilp``: HAWQ-V3
        integer program; ``greedy``: by sensitivity; ``gradient``: learned widths, EdMIPS).
      candidates: candidate weight widths (bits, each 2..16).
      act_candidates: candidate activation widths.
      budget_s: latency budget (s); None: ``budget_ratio`` x the uniform 8-bit latency.
      budget_ratio: see ``budget_s``; in (0, 1].
      pinned: ``{layer: w or (w, a)}`` layers every searcher keeps at that choice (e.g. the
        first and last at ``(8, 8)``, the convention of HAWQ-V3 and HAQ).
      loss: the task loss kind (``logits``, ``probabilities``, ``dense``); None infers it from
        the graph's output (:func:`npujax.search.task_loss`).
      sensitivity: what ``ilp``/``greedy`` minimise: ``hessian`` (HAWQ-V3 trace x weight
        perturbation, plus the empirical-Fisher activation term) or ``loss`` (measured loss
        increase, one layer quantized at a time).
      sensitivity_samples: Hutchinson probes for the Hessian traces.
      sensitivity_batch: examples of the sensitivity analysis.
      steps: optimisation steps of the gradient searcher.
      lam: initial latency multiplier of the gradient searcher (>= 0).
      dual_rate: step of its dual-ascent update of the multiplier.
      learning_rate, logits_learning_rate: its Adam rates for weights and width logits.
      batch_size: its mini-batch size.
      dataflow: overrides the preset's dataflow in the latency model.
      seed: random seed (probes, mini-batches).
      progress: show progress bars.
      devices: data-parallel data passes (sensitivity batch, gradient-search mini-batches)
        over a ``Mesh`` axis ``data`` (:mod:`npujax.quantize.parallel`): ``"all"`` local
        devices or a count; ``sensitivity_batch`` (or the data, if smaller) and ``batch_size``
        must be multiples of it. None (default): one device.

    Raises:
      ConfigError: an unknown method or sensitivity, an empty candidate list, a budget ratio
        outside (0, 1], a non-positive budget or count.
      QuantizationError: a candidate width outside [2, 16].
    """

    method: str = "ilp"
    candidates: tuple[int, ...] = (2, 4, 8)
    act_candidates: tuple[int, ...] = (8,)
    budget_s: float | None = None
    budget_ratio: float = 0.75
    pinned: Pinned | None = None
    loss: str | None = None
    sensitivity: str = "hessian"
    sensitivity_samples: int = 16
    sensitivity_batch: int = 256
    steps: int = 300
    lam: float = 0.0
    dual_rate: float = 0.05
    learning_rate: float = 1e-4
    logits_learning_rate: float = 0.05
    batch_size: int = 64
    dataflow: str | None = None
    seed: int = 0
    progress: bool = False
    devices: str | int | None = None

    def __post_init__(self) -> None:
        if self.method not in SEARCHERS:
            raise ConfigError(f"unknown search method {self.method!r}; use one of "
                              f"{', '.join(SEARCHERS)}.")
        if self.sensitivity not in SENSITIVITIES:
            raise ConfigError(f"unknown sensitivity {self.sensitivity!r}; use one of "
                              f"{', '.join(SENSITIVITIES)}.")
        for what in ("candidates", "act_candidates"):
            v = getattr(self, what)
            if isinstance(v, int) or not v:
                raise ConfigError(f"SearchConfig.{what} must be a non-empty sequence of widths, "
                                  f"got {v!r}.")
            object.__setattr__(self, what, tuple(sorted({check_bits(b, f"{what} entry")
                                                         for b in v})))
        for what in ("budget_ratio", "lam", "dual_rate", "learning_rate", "logits_learning_rate"):
            v = getattr(self, what)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise ConfigError(f"SearchConfig.{what} must be a finite number, got {v!r}.")
        if self.budget_s is not None and (
                isinstance(self.budget_s, bool) or not isinstance(self.budget_s, (int, float))
                or not math.isfinite(self.budget_s)):
            raise ConfigError(f"budget_s must be a finite latency in seconds, got "
                              f"{self.budget_s!r}.")
        for what in ("sensitivity_samples", "sensitivity_batch", "steps", "batch_size", "seed"):
            v = getattr(self, what)
            if isinstance(v, bool) or not isinstance(v, int):
                raise ConfigError(f"SearchConfig.{what} must be a whole number, got {v!r}.")
        if not 0 <= self.seed < 2**32:
            raise ConfigError(f"SearchConfig.seed must be in [0, 2**32), got {self.seed}.")
        if not 0 < self.budget_ratio <= 1:
            raise ConfigError(f"budget_ratio must be in (0, 1], got {self.budget_ratio}.")
        if self.budget_s is not None and not self.budget_s > 0:
            raise ConfigError(f"budget_s must be a positive latency in seconds, got "
                              f"{self.budget_s}.")
        for what in ("sensitivity_samples", "sensitivity_batch", "steps", "batch_size"):
            if getattr(self, what) < 1:
                raise ConfigError(f"SearchConfig.{what} must be >= 1, got {getattr(self, what)}.")
        if self.devices is not None and not (
                self.devices == "all" or (isinstance(self.devices, int)
                                          and not isinstance(self.devices, bool)
                                          and self.devices >= 1)):
            raise ConfigError(f"SearchConfig.devices must be None, 'all' or a device count "
                              f">= 1, got {self.devices!r}.")
        if self.lam < 0:
            raise ConfigError(f"lam must be >= 0, got {self.lam}.")

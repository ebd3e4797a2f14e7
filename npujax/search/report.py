"""The result of a precision search: the policy with its exact latency and provenance."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from npujax.ir.graph import Params
from npujax.search.config import Pinned
from npujax.search.policy import PrecisionPolicy

__all__ = ["SearchReport"]


@dataclasses.dataclass(frozen=True)
class SearchReport:
    """What :func:`npujax.search_precision` found.

    Attributes:
      policy: the per-layer widths; its ``meta`` is :meth:`meta` (saved with the policy file).
      method: the searcher's name.
      npu: the preset whose latency model was the cost.
      loss: the task loss kind (``logits``, ``probabilities`` or ``dense``).
      distilled: True when no labels were given (targets from the float model).
      budget_s: the latency budget (s).
      latency_s: the policy's exact lowered latency (s).
      int8_latency_s: the uniform 8-bit latency (s).
      pinned: the layers held at fixed widths.
      details: the searcher's own provenance (e.g. the gradient searcher's ``probabilities``,
        ``act_probabilities``, ``candidates``, ``act_candidates``, ``final_lambda``; the
        sensitivity searchers' ``sensitivity``).
      params: the weights after a search that trains them (gradient), else None.
    """

    policy: PrecisionPolicy
    method: str
    npu: str
    loss: str
    distilled: bool
    budget_s: float
    latency_s: float
    int8_latency_s: float
    pinned: Pinned | None
    details: Mapping[str, Any]
    params: Params | None = None

    @property
    def budget_met(self) -> bool:
        """Whether the exact latency meets the budget (to a relative 1e-9)."""
        return self.latency_s <= self.budget_s * (1 + 1e-9)

    @property
    def speedup_vs_int8(self) -> float:
        """``int8_latency_s / latency_s``."""
        return self.int8_latency_s / self.latency_s

    def _repr_html_(self) -> str:
        """The chosen widths per layer, with the latency against the budget, in a notebook."""
        from npujax._html import html_table

        caption = (f"{self.method} on {self.npu}: {self.latency_s * 1e6:,.2f} µs "
                   f"(budget {self.budget_s * 1e6:,.2f} µs, "
                   f"{'met' if self.budget_met else 'NOT met'}; "
                   f"{self.speedup_vs_int8:.2f}x vs int8)")
        rows = [(name, bits, self.policy.act_bits.get(name))
                for name, bits in self.policy.weight_bits.items()]
        return html_table(caption, ("layer", "weight bits", "act bits"), rows,
                          numeric=[False, True, True])

    def meta(self) -> dict[str, Any]:
        """JSON-ready provenance, as stored in the policy file's ``meta``."""
        return {"method": self.method, "npu": self.npu, "loss": self.loss,
                "pinned": {k: list(v) if isinstance(v, tuple) else v
                           for k, v in (self.pinned or {}).items()},
                "labels": "float model (distillation)" if self.distilled else "given",
                "budget_s": float(self.budget_s), "budget_met": self.budget_met,
                "latency_s": self.latency_s, "int8_latency_s": self.int8_latency_s,
                "speedup_vs_int8": self.speedup_vs_int8, **dict(self.details)}

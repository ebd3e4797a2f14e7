"""The searcher interface: the problem every searcher gets and the outcome it returns.

A :class:`Searcher` gets the :class:`SearchProblem` (model, data, quantization state, the
latency table and budget) and the :class:`~npujax.search.config.SearchConfig`, and returns a
:class:`SearchOutcome`: a ``(weight, act)`` width per layer and its searcher-specific details.
:func:`npujax.search_precision` builds the problem, runs the searcher and checks its choice on
the exact lowering. A new searcher is one module plus its entry in
:data:`npujax.search.registry.SEARCHERS`.
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

if TYPE_CHECKING:
    from npujax.hw.spec import NpuSpec
    from npujax.ir.graph import Graph, Params
    from npujax.quantize.quantizers import QState
    from npujax.search.config import SearchConfig
    from npujax.search.cost import LatencyTable
    from npujax.search.objective import TaskLoss

__all__ = ["Searcher", "SearchProblem", "SearchOutcome", "Pinned", "Choice"]

#: ``(weight_bits, act_bits)`` of one layer.
Choice = tuple[int, int]
#: ``{layer: weight_bits or (weight_bits, act_bits)}``: layers whose choice is fixed (e.g. the
#: first and last layers at 8 bits, as HAWQ-V3 and HAQ keep them).
Pinned = Mapping[str, "int | tuple[int, int]"]


@dataclasses.dataclass(frozen=True)
class SearchProblem:
    """What every searcher works on (built by :func:`npujax.search_precision`).

    Attributes:
      graph, params: the optimized float (or QAT) model.
      spec: the NPU whose latency model is the cost.
      x: inputs ``[n, ...]`` float32.
      targets: targets of ``task`` (int labels, or the float model's outputs to distil from).
      qstate: calibrated states (activation grids) of a single-width quantization of the model.
      task: the task loss.
      table: exact per-layer latency of every (weight, act) candidate pair.
      budget_s: the latency budget (s).
      fastest_s: the lowest latency the candidates (and pins) allow (s).
      pinned: layers held at one choice.
    """

    graph: Graph
    params: Params
    spec: NpuSpec
    x: np.ndarray
    targets: np.ndarray
    qstate: QState
    task: TaskLoss
    table: LatencyTable
    budget_s: float
    fastest_s: float
    pinned: Pinned | None


@dataclasses.dataclass(frozen=True)
class SearchOutcome:
    """A searcher's result.

    Attributes:
      choice: ``{layer: (weight_bits, act_bits)}`` for every GEMM layer.
      details: searcher-specific, JSON-ready provenance (e.g. the gradient searcher's final
        probabilities), recorded in the policy file.
      params: the weights after a search that trains them (the gradient searcher), else None.
    """

    choice: Mapping[str, Choice]
    details: Mapping[str, Any]
    params: Params | None = None


class Searcher(abc.ABC):
    """A precision searcher (see the module docstring)."""

    name: ClassVar[str]
    #: One line for ``npujax search --help``.
    summary: ClassVar[str]

    @abc.abstractmethod
    def search(self, problem: SearchProblem, config: SearchConfig) -> SearchOutcome:
        """Choose one (weight, act) width per layer meeting ``problem.budget_s`` (the exact
        latency is checked and reported by the caller).

        Raises:
          ConfigError: a setting the searcher cannot honour.
        """

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"

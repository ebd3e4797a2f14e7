"""The registry of precision searchers: the names ``search_precision`` and ``npujax search
--method`` accept. A new searcher is one module (a :class:`~npujax.search.base.Searcher`) plus
its entry here."""

from __future__ import annotations

from npujax.search.base import Searcher
from npujax.search.gradient import GradientSearcher
from npujax.search.greedy import GreedySearcher
from npujax.search.ilp import IlpSearcher

__all__ = ["SEARCHERS"]

#: The searchers by name, in the order the command line lists them.
SEARCHERS: dict[str, Searcher] = {
    s.name: s for s in (IlpSearcher(), GreedySearcher(), GradientSearcher())
}

"""Mixed-precision search: the differentiable latency cost and the gradient searcher."""

from npujax.search.cost import LatencyTable as LatencyTable
from npujax.search.cost import expected_latency as expected_latency
from npujax.search.cost import latency_table as latency_table
from npujax.search.gradient import SearchResult as SearchResult
from npujax.search.gradient import gradient_search as gradient_search

__all__ = ["LatencyTable", "latency_table", "expected_latency", "SearchResult", "gradient_search"]

"""Mixed-precision search: a latency table from the NPU model, sensitivities, the searchers
(HAWQ-V3 integer program, greedy, gradient) behind one interface, and precision policies."""

from npujax.search.api import search_precision as search_precision
from npujax.search.base import Searcher as Searcher
from npujax.search.base import SearchOutcome as SearchOutcome
from npujax.search.base import SearchProblem as SearchProblem
from npujax.search.config import SENSITIVITIES as SENSITIVITIES
from npujax.search.config import SearchConfig as SearchConfig
from npujax.search.cost import LatencyTable as LatencyTable
from npujax.search.cost import expected_latency as expected_latency
from npujax.search.cost import latency_table as latency_table
from npujax.search.cost import policy_latency_s as policy_latency_s
from npujax.search.greedy import greedy_policy as greedy_policy
from npujax.search.ilp import ilp_policy as ilp_policy
from npujax.search.objective import TaskLoss as TaskLoss
from npujax.search.objective import task_loss as task_loss
from npujax.search.policy import PrecisionPolicy as PrecisionPolicy
from npujax.search.policy import load_policy as load_policy
from npujax.search.policy import save_policy as save_policy
from npujax.search.registry import SEARCHERS as SEARCHERS
from npujax.search.report import SearchReport as SearchReport
from npujax.search.sensitivity import activation_sensitivity as activation_sensitivity
from npujax.search.sensitivity import hawq_sensitivity as hawq_sensitivity
from npujax.search.sensitivity import hessian_traces as hessian_traces
from npujax.search.sensitivity import loss_sensitivity as loss_sensitivity
from npujax.search.sensitivity import weight_perturbation as weight_perturbation
from npujax.search.solvers import allowed_mask as allowed_mask
from npujax.search.solvers import check_budget as check_budget
from npujax.search.solvers import fastest_latency_s as fastest_latency_s
from npujax.search.solvers import fit_exact_budget as fit_exact_budget

__all__ = [
    "search_precision",
    "SearchConfig",
    "SearchReport",
    "SEARCHERS",
    "SENSITIVITIES",
    "Searcher",
    "SearchProblem",
    "SearchOutcome",
    "TaskLoss",
    "task_loss",
    "LatencyTable",
    "latency_table",
    "expected_latency",
    "policy_latency_s",
    "PrecisionPolicy",
    "save_policy",
    "load_policy",
    "hessian_traces",
    "loss_sensitivity",
    "activation_sensitivity",
    "weight_perturbation",
    "hawq_sensitivity",
    "ilp_policy",
    "greedy_policy",
    "fastest_latency_s",
    "check_budget",
    "fit_exact_budget",
    "allowed_mask",
]

"""Design-space exploration: grids of hardware configurations and precisions, evaluated through
the cost model in one sharded, vmapped program per static combination."""

from npujax.explore.grid import SAMPLING_METHODS as SAMPLING_METHODS
from npujax.explore.grid import Grid as Grid
from npujax.explore.grid import configurations as configurations
from npujax.explore.grid import parse_grid_axis as parse_grid_axis
from npujax.explore.pareto import pareto_front as pareto_front
from npujax.explore.sweep import COLUMNS as COLUMNS
from npujax.explore.sweep import SweepResult as SweepResult
from npujax.explore.sweep import evaluate as evaluate
from npujax.explore.sweep import evaluate_configs as evaluate_configs
from npujax.explore.sweep import sweep as sweep

__all__ = [
    "Grid",
    "SAMPLING_METHODS",
    "configurations",
    "parse_grid_axis",
    "COLUMNS",
    "SweepResult",
    "evaluate",
    "evaluate_configs",
    "pareto_front",
    "sweep",
]

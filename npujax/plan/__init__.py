"""The NPU execution model: workloads, per-layer costs (pure jnp), the one cost program that chains
the cost passes (:mod:`npujax.plan.program`, :mod:`npujax.plan.passes`), and ``lower``; across
layers fusion (:mod:`npujax.plan.passes.cross_layer`), multi-core pipelines
(:mod:`npujax.plan.pipeline`), co-resident models (:mod:`npujax.plan.coresident`) and peak memory
(:mod:`npujax.plan.memory`); after the program, thermal throttling (:mod:`npujax.plan.thermal`)
and the host pipeline around the NPU (:mod:`npujax.plan.host_pipeline`); fitting a preset to a
measured profile (:mod:`npujax.plan.profile`, :mod:`npujax.plan.fit`).
"""

from npujax.plan.buckets import BucketPlan as BucketPlan
from npujax.plan.buckets import ShapeCosts as ShapeCosts
from npujax.plan.buckets import bucket_plans as bucket_plans
from npujax.plan.buckets import optimal_buckets as optimal_buckets
from npujax.plan.coresident import SHARING as SHARING
from npujax.plan.coresident import CoResidency as CoResidency
from npujax.plan.coresident import ModelShare as ModelShare
from npujax.plan.coresident import lower_models as lower_models
from npujax.plan.costs import BREAKDOWN as BREAKDOWN
from npujax.plan.costs import LayerCosts as LayerCosts
from npujax.plan.costs import layer_costs as layer_costs
from npujax.plan.costs import layer_costs_by_dataflow as layer_costs_by_dataflow
from npujax.plan.decompose import Decomposition as Decomposition
from npujax.plan.decompose import RewriteChoice as RewriteChoice
from npujax.plan.fit import FitConfig as FitConfig
from npujax.plan.fit import FitResult as FitResult
from npujax.plan.fit import fit_spec as fit_spec
from npujax.plan.host_pipeline import PipelineReport as PipelineReport
from npujax.plan.host_pipeline import host_pipeline as host_pipeline
from npujax.plan.host_pipeline import parse_host_stage as parse_host_stage
from npujax.plan.liveness import peak_activation_bytes as peak_activation_bytes
from npujax.plan.lower import DEFAULT_BITS as DEFAULT_BITS
from npujax.plan.lower import EdgeReport as EdgeReport
from npujax.plan.lower import LayerReport as LayerReport
from npujax.plan.lower import Lowering as Lowering
from npujax.plan.lower import Schedule as Schedule
from npujax.plan.lower import decompose_unsupported as decompose_unsupported
from npujax.plan.lower import layer_bits as layer_bits
from npujax.plan.lower import lower as lower
from npujax.plan.lower import lower_by_dataflow as lower_by_dataflow
from npujax.plan.lower import lower_dataflows as lower_dataflows
from npujax.plan.memory import MemoryReport as MemoryReport
from npujax.plan.memory import memory_report as memory_report
from npujax.plan.passes.attention import AttentionChain as AttentionChain
from npujax.plan.passes.attention import AttentionCosts as AttentionCosts
from npujax.plan.passes.attention import attention_chains as attention_chains
from npujax.plan.passes.attention import attention_costs as attention_costs
from npujax.plan.passes.base import CostMode as CostMode
from npujax.plan.passes.base import CostPass as CostPass
from npujax.plan.passes.base import ProgramCosts as ProgramCosts
from npujax.plan.passes.cross_layer import EdgeCosts as EdgeCosts
from npujax.plan.passes.energy import ENERGY_BREAKDOWN as ENERGY_BREAKDOWN
from npujax.plan.passes.energy import LayerEnergy as LayerEnergy
from npujax.plan.passes.energy import layer_energy as layer_energy
from npujax.plan.pipeline import OBJECTIVES as OBJECTIVES
from npujax.plan.pipeline import CoreSchedule as CoreSchedule
from npujax.plan.pipeline import best_core_schedule as best_core_schedule
from npujax.plan.pipeline import core_schedules as core_schedules
from npujax.plan.profile import MatchedProfile as MatchedProfile
from npujax.plan.profile import Profile as Profile
from npujax.plan.profile import match_profile as match_profile
from npujax.plan.profile import read_profile as read_profile
from npujax.plan.program import Network as Network
from npujax.plan.program import Totals as Totals
from npujax.plan.program import layer_sums as layer_sums
from npujax.plan.program import network as network
from npujax.plan.program import program_cost as program_cost
from npujax.plan.program import program_costs as program_costs
from npujax.plan.shapes import sweep_shapes as sweep_shapes
from npujax.plan.table import LayerTable as LayerTable
from npujax.plan.table import layer_table as layer_table
from npujax.plan.thermal import SustainedReport as SustainedReport
from npujax.plan.thermal import sustained as sustained
from npujax.plan.thermal import thermal_state as thermal_state
from npujax.plan.workload import Workload as Workload
from npujax.plan.workload import workloads as workloads

__all__ = [
    "PipelineReport",
    "host_pipeline",
    "parse_host_stage",
    "SustainedReport",
    "sustained",
    "thermal_state",
    "BucketPlan",
    "ShapeCosts",
    "bucket_plans",
    "optimal_buckets",
    "Decomposition",
    "RewriteChoice",
    "decompose_unsupported",
    "AttentionChain",
    "AttentionCosts",
    "attention_chains",
    "attention_costs",
    "BREAKDOWN",
    "SHARING",
    "OBJECTIVES",
    "CoResidency",
    "ModelShare",
    "lower_models",
    "MemoryReport",
    "memory_report",
    "sweep_shapes",
    "CoreSchedule",
    "best_core_schedule",
    "core_schedules",
    "EdgeCosts",
    "EdgeReport",
    "CostMode",
    "CostPass",
    "Network",
    "ProgramCosts",
    "Totals",
    "network",
    "program_costs",
    "program_cost",
    "layer_sums",
    "LayerCosts",
    "LayerEnergy",
    "layer_energy",
    "ENERGY_BREAKDOWN",
    "LayerReport",
    "Schedule",
    "layer_costs",
    "layer_costs_by_dataflow",
    "layer_bits",
    "lower",
    "lower_by_dataflow",
    "lower_dataflows",
    "Lowering",
    "DEFAULT_BITS",
    "peak_activation_bytes",
    "Workload",
    "workloads",
    "LayerTable",
    "layer_table",
    "FitConfig",
    "FitResult",
    "fit_spec",
    "Profile",
    "MatchedProfile",
    "read_profile",
    "match_profile",
]

"""Lowering a Graph onto an NpuSpec: workloads, the latency model and the Schedule."""

from npujax.plan.latency import BREAKDOWN as BREAKDOWN
from npujax.plan.latency import HwParams as HwParams
from npujax.plan.latency import LayerReport as LayerReport
from npujax.plan.latency import Schedule as Schedule
from npujax.plan.latency import layer_costs as layer_costs
from npujax.plan.latency import lower as lower
from npujax.plan.liveness import peak_activation_bytes as peak_activation_bytes
from npujax.plan.workload import Workload as Workload
from npujax.plan.workload import workloads as workloads

__all__ = [
    "Workload",
    "workloads",
    "HwParams",
    "layer_costs",
    "lower",
    "LayerReport",
    "Schedule",
    "BREAKDOWN",
    "peak_activation_bytes",
]

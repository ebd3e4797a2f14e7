"""Systolic-array dataflows (weight/output/input stationary) and their cycle model."""

from npujax.systolic.dataflow import Dataflow as Dataflow
from npujax.systolic.dataflow import InputStationary as InputStationary
from npujax.systolic.dataflow import OutputStationary as OutputStationary
from npujax.systolic.dataflow import WeightStationary as WeightStationary
from npujax.systolic.dataflow import gemm_cycles as gemm_cycles
from npujax.systolic.dataflow import get_dataflow as get_dataflow

__all__ = [
    "Dataflow",
    "WeightStationary",
    "OutputStationary",
    "InputStationary",
    "get_dataflow",
    "gemm_cycles",
]

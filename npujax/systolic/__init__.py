"""Systolic arrays: dataflows, the closed-form cycle model, bit-exact emulation, memory traffic.

* :func:`gemm_cycles` / :func:`conv_cycles`: folds, compute cycles (exact to SCALE-Sim 3.0.0),
  utilization, mapping efficiency and SRAM accesses per operand; pure jnp, vmaps over hardware.
* :func:`emulate_gemm` / :func:`emulate_conv`: int8/int16 -> int32 results, fold by fold, + stats.
* :func:`simulate_gemm`: register-level ``lax.scan`` over cycles that proves the closed form.
* :func:`gemm_memory`: SRAM double buffering, DRAM traffic and stall cycles (SCALE-Sim's order).
* :func:`gemm_mapping`: the same under the DRAM-level mapping a compiler picks (fold order and
  chunks with the fewest DRAM bytes), or SCALE-Sim's (``mapping="scalesim"``).
* :func:`scalesim_report`: the same figures in SCALE-Sim's report conventions.
* :class:`PrecisionScaling`: how operand widths change the array's speed (fixed, Bit Fusion,
  Loom).
"""

from npujax.systolic.conv import conv_cycles as conv_cycles
from npujax.systolic.conv import conv_gemm_shape as conv_gemm_shape
from npujax.systolic.dataflow import DATAFLOW_NAMES as DATAFLOW_NAMES
from npujax.systolic.dataflow import DATAFLOWS as DATAFLOWS
from npujax.systolic.dataflow import SCALESIM_CYCLE_OFFSET as SCALESIM_CYCLE_OFFSET
from npujax.systolic.dataflow import Dataflow as Dataflow
from npujax.systolic.dataflow import InputStationary as InputStationary
from npujax.systolic.dataflow import OutputStationary as OutputStationary
from npujax.systolic.dataflow import RowStationary as RowStationary
from npujax.systolic.dataflow import WeightStationary as WeightStationary
from npujax.systolic.dataflow import gemm_cycles as gemm_cycles
from npujax.systolic.dataflow import get_dataflow as get_dataflow
from npujax.systolic.emulator import emulate_conv as emulate_conv
from npujax.systolic.emulator import emulate_gemm as emulate_gemm
from npujax.systolic.mapping import MAPPINGS as MAPPINGS
from npujax.systolic.mapping import gemm_mapping as gemm_mapping
from npujax.systolic.memory import gemm_memory as gemm_memory
from npujax.systolic.precision import PRECISION_SCALINGS as PRECISION_SCALINGS
from npujax.systolic.precision import BitComposable as BitComposable
from npujax.systolic.precision import BitSerial as BitSerial
from npujax.systolic.precision import Fixed as Fixed
from npujax.systolic.precision import PrecisionScaling as PrecisionScaling
from npujax.systolic.precision import get_precision_scaling as get_precision_scaling
from npujax.systolic.registers import simulate_gemm as simulate_gemm
from npujax.systolic.row_stationary import rs_conv as rs_conv
from npujax.systolic.scalesim import scalesim_report as scalesim_report

__all__ = [
    "Dataflow",
    "DATAFLOWS",
    "DATAFLOW_NAMES",
    "RowStationary",
    "rs_conv",
    "WeightStationary",
    "OutputStationary",
    "InputStationary",
    "get_dataflow",
    "gemm_cycles",
    "conv_cycles",
    "conv_gemm_shape",
    "emulate_gemm",
    "emulate_conv",
    "simulate_gemm",
    "gemm_memory",
    "gemm_mapping",
    "MAPPINGS",
    "scalesim_report",
    "SCALESIM_CYCLE_OFFSET",
    "PrecisionScaling",
    "Fixed",
    "BitComposable",
    "BitSerial",
    "PRECISION_SCALINGS",
    "get_precision_scaling",
]

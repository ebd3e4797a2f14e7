"""The three systolic GEMM dataflows as one set of formulas whose operand roles are data
(issue 30): :class:`npujax.systolic.dataflow.Roles`, which :func:`gemm_cycles`,
:func:`gemm_memory` and :func:`gemm_mapping` accept in place of a static dataflow. (The
prototype that lived here moved into those modules; ``check.py``, ``sweep_style.py``,
``sweep_equal.py`` and ``lower_vmap.py`` measure it.)
"""

from npujax.systolic.dataflow import Roles, gemm_cycles
from npujax.systolic.mapping import gemm_mapping
from npujax.systolic.memory import gemm_memory

__all__ = ["Roles", "gemm_cycles", "gemm_memory", "gemm_mapping"]

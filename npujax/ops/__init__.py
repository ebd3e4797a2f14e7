"""The operator registry: one :class:`~npujax.ops.registry.OpDef` per Graph operator.

Every module of this package (one per op family) registers its operators and ONNX importers when
imported; this ``__init__`` imports them all, so adding an operator means adding one file. See
:mod:`npujax.ops.registry` for what a definition holds.
"""

import importlib
import pkgutil

from npujax.ops.registry import ONNX_DOMAIN_IMPORTERS as ONNX_DOMAIN_IMPORTERS
from npujax.ops.registry import ONNX_IMPORTERS as ONNX_IMPORTERS
from npujax.ops.registry import ONNX_WEIGHT_OPS as ONNX_WEIGHT_OPS
from npujax.ops.registry import OPS as OPS
from npujax.ops.registry import ArrayWork as ArrayWork
from npujax.ops.registry import OpDef as OpDef
from npujax.ops.registry import VectorWork as VectorWork
from npujax.ops.registry import apply_epilogue as apply_epilogue
from npujax.ops.registry import embedding_nodes as embedding_nodes
from npujax.ops.registry import epilogue_ops as epilogue_ops
from npujax.ops.registry import gemm_nodes as gemm_nodes
from npujax.ops.registry import get_op as get_op
from npujax.ops.registry import kernel_in_axis as kernel_in_axis
from npujax.ops.registry import kernel_out_axis as kernel_out_axis
from npujax.ops.registry import onnx_importer as onnx_importer
from npujax.ops.registry import operand_quantized_ops as operand_quantized_ops
from npujax.ops.registry import ops_with as ops_with
from npujax.ops.registry import out_channel_view as out_channel_view
from npujax.ops.registry import quantizable_nodes as quantizable_nodes
from npujax.ops.registry import quantized_ops as quantized_ops
from npujax.ops.registry import register as register
from npujax.ops.registry import run_op as run_op
from npujax.ops.registry import weight_role as weight_role

for _m in pkgutil.iter_modules(__path__):
    if not _m.name.startswith("_") and _m.name != "registry":
        importlib.import_module(f"{__name__}.{_m.name}")

__all__ = [
    "OpDef", "ArrayWork", "VectorWork", "OPS", "ONNX_IMPORTERS", "ONNX_WEIGHT_OPS", "register",
    "ONNX_DOMAIN_IMPORTERS",
    "onnx_importer", "get_op", "run_op", "gemm_nodes", "quantized_ops", "kernel_out_axis",
    "kernel_in_axis", "out_channel_view", "apply_epilogue", "epilogue_ops", "ops_with",
    "operand_quantized_ops", "quantizable_nodes", "embedding_nodes", "weight_role",
]

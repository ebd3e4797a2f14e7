"""The Graph IR, Flax tracing, ONNX import/export, passes, execution and calibration."""

from npujax.graph.calibrate import calibrate as calibrate
from npujax.graph.execute import LayerQuant as LayerQuant
from npujax.graph.execute import QuantSpec as QuantSpec
from npujax.graph.execute import execute as execute
from npujax.graph.execute import quant_spec as quant_spec
from npujax.graph.integer import IntegerModel as IntegerModel
from npujax.graph.integer import convert as convert
from npujax.graph.integer import execute_integer as execute_integer
from npujax.graph.ir import GEMM_OPS as GEMM_OPS
from npujax.graph.ir import Graph as Graph
from npujax.graph.ir import Node as Node
from npujax.graph.ir import Params as Params
from npujax.graph.ir import TensorType as TensorType
from npujax.graph.onnx_export import to_onnx as to_onnx
from npujax.graph.onnx_import import from_onnx as from_onnx
from npujax.graph.passes import fold_batchnorm as fold_batchnorm
from npujax.graph.passes import fuse_epilogues as fuse_epilogues
from npujax.graph.passes import optimize as optimize
from npujax.graph.passes import rebatch as rebatch
from npujax.graph.ptq import bias_correction as bias_correction
from npujax.graph.ptq import layer_sqnr as layer_sqnr
from npujax.graph.ptq import ptq as ptq
from npujax.graph.rules import QuantRule as QuantRule
from npujax.graph.rules import first_last_rules as first_last_rules
from npujax.graph.rules import quant_spec_from_rules as quant_spec_from_rules
from npujax.graph.serialize import load_graph as load_graph
from npujax.graph.serialize import save_graph as save_graph
from npujax.graph.trace_flax import trace_flax as trace_flax

__all__ = [
    "Graph",
    "Node",
    "TensorType",
    "Params",
    "GEMM_OPS",
    "trace_flax",
    "from_onnx",
    "to_onnx",
    "execute",
    "LayerQuant",
    "QuantSpec",
    "quant_spec",
    "calibrate",
    "fold_batchnorm",
    "fuse_epilogues",
    "optimize",
    "rebatch",
    "save_graph",
    "QuantRule",
    "quant_spec_from_rules",
    "first_last_rules",
    "ptq",
    "bias_correction",
    "layer_sqnr",
    "convert",
    "execute_integer",
    "IntegerModel",
    "load_graph",
]

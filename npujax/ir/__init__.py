"""The Graph IR: nodes over named tensors, graph passes, and the graph's JSON form."""

from npujax.ir.graph import Graph as Graph
from npujax.ir.graph import Node as Node
from npujax.ir.graph import Params as Params
from npujax.ir.graph import TensorType as TensorType
from npujax.ir.passes import fold_batchnorm as fold_batchnorm
from npujax.ir.passes import fuse_epilogues as fuse_epilogues
from npujax.ir.passes import optimize as optimize
from npujax.ir.passes import rebatch as rebatch
from npujax.ir.patterns import fuse_transformer_patterns as fuse_transformer_patterns

__all__ = ["Graph", "Node", "TensorType", "Params", "fold_batchnorm",
           "fuse_epilogues", "fuse_transformer_patterns", "optimize", "rebatch"]

"""Exact rewrites of operators an NPU lacks into operators it runs, one rule per file.

:class:`Rewrite` is the interface, :data:`REWRITES` the registry (operator -> rule) and
:func:`apply_rewrite` splices a rule's nodes into a graph. The rules: LeakyReLU as a max
(:mod:`.leaky_relu`), a large-kernel convolution as a sum of small ones
(:mod:`.large_kernel_conv`), average pooling as a depthwise convolution
(:mod:`.avgpool_depthwise`), GELU from elementwise operators (:mod:`.gelu`), HardSigmoid as a
clip (:mod:`.hard_sigmoid`), LayerNormalization from reductions and elementwise operators
(:mod:`.layer_norm`). Whether to rewrite
or fall back is decided per layer by the cost program (:func:`npujax.plan.decompose`).
"""

from npujax.ir.rewrites import avgpool_depthwise as avgpool_depthwise
from npujax.ir.rewrites import gelu as gelu
from npujax.ir.rewrites import hard_sigmoid as hard_sigmoid
from npujax.ir.rewrites import large_kernel_conv as large_kernel_conv
from npujax.ir.rewrites import layer_norm as layer_norm
from npujax.ir.rewrites import leaky_relu as leaky_relu
from npujax.ir.rewrites.base import REWRITES as REWRITES
from npujax.ir.rewrites.base import Replacement as Replacement
from npujax.ir.rewrites.base import Rewrite as Rewrite
from npujax.ir.rewrites.base import apply_rewrite as apply_rewrite
from npujax.ir.rewrites.base import register_rewrite as register_rewrite
from npujax.ir.rewrites.base import rewrite_for as rewrite_for

__all__ = ["REWRITES", "Rewrite", "Replacement", "apply_rewrite", "register_rewrite",
           "rewrite_for"]

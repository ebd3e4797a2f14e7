"""The operator registry: JAX semantics of every Graph operator."""

from npujax.ops.core import OPS as OPS
from npujax.ops.core import run_op as run_op

__all__ = ["OPS", "run_op"]

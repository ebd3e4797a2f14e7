"""JAX implementations of the Graph operators.

Each implementation is ``fn(node, inputs, params) -> list of outputs`` where ``inputs`` are the
arrays named by ``node.inputs`` and ``params`` is ``params[node.name]`` (possibly already
fake-quantized by :func:`npujax.graph.execute`). Semantics follow the ONNX operator
specification where the op has an ONNX name; layouts are explicit in the attributes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from npujax.errors import UnsupportedOpError
from npujax.graph.ir import Node

__all__ = ["OPS", "apply_epilogue", "kernel_out_axis", "UNARY_EPILOGUES"]

OpFn = Callable[[Node, Sequence[jax.Array], dict[str, jax.Array]], list[jax.Array]]
OPS: dict[str, OpFn] = {}


def _register(*names: str) -> Callable[[OpFn], OpFn]:
    def deco(fn: OpFn) -> OpFn:
        for n in names:
            OPS[n] = fn
        return fn

    return deco


def kernel_out_axis(node: Node) -> int:
    """Axis of the output channels in a GEMM node's ``kernel`` (the per-channel quant axis)."""
    if node.op == "Conv":
        return node.attrs["kernel_layout"].index("O")
    if node.op == "Gemm":
        return 1  # kernel is [in_features, out_features]
    raise UnsupportedOpError(f"node {node.name!r} ({node.op}) has no weight kernel.")


UNARY_EPILOGUES: dict[str, Callable[[jax.Array], jax.Array]] = {
    "Relu": jax.nn.relu,
    "Relu6": lambda x: jnp.clip(x, 0.0, 6.0),
    "Sigmoid": jax.nn.sigmoid,
    "Tanh": jnp.tanh,
}


def apply_epilogue(node: Node, y: jax.Array) -> jax.Array:
    """Apply the activations fused into a GEMM node (``attrs['epilogue']``), in order."""
    for op in node.attrs.get("epilogue", ()):
        y = UNARY_EPILOGUES[op](y)
    return y


@_register("Conv")
def _conv(node: Node, inputs, params):
    a = node.attrs
    (x,) = inputs
    y = lax.conv_general_dilated(
        x,
        params["kernel"],
        window_strides=tuple(a["strides"]),
        padding=[tuple(p) for p in a["padding"]],
        lhs_dilation=tuple(a.get("lhs_dilation", (1,) * len(a["strides"]))),
        rhs_dilation=tuple(a["dilations"]),
        dimension_numbers=(a["data_layout"], a["kernel_layout"], a["data_layout"]),
        feature_group_count=int(a["groups"]),
    )
    if "bias" in params:
        c_axis = a["data_layout"].index("C")
        shape = [1] * y.ndim
        shape[c_axis] = -1
        y = y + params["bias"].reshape(shape)
    return [apply_epilogue(node, y)]


@_register("Gemm")
def _gemm(node: Node, inputs, params):
    (x,) = inputs
    y = jnp.matmul(x, params["kernel"])
    if "bias" in params:
        y = y + params["bias"].reshape((1,) * (y.ndim - 1) + (-1,))
    return [apply_epilogue(node, y)]


@_register("BatchNormalization")
def _batchnorm(node: Node, inputs, params):
    (x,) = inputs
    axis = node.attrs["axis"] % x.ndim
    shape = [1] * x.ndim
    shape[axis] = -1
    inv = lax.rsqrt(params["var"] + node.attrs["epsilon"])
    y = (x - params["mean"].reshape(shape)) * inv.reshape(shape)
    if "scale" in params:
        y = y * params["scale"].reshape(shape)
    if "bias" in params:
        y = y + params["bias"].reshape(shape)
    return [y]


def _unary(fn: Callable[[jax.Array], jax.Array]) -> OpFn:
    return lambda node, inputs, params: [fn(inputs[0])]


for _name, _fn in UNARY_EPILOGUES.items():
    OPS[_name] = _unary(_fn)
OPS["Identity"] = _unary(lambda x: x)


@_register("Clip")
def _clip(node: Node, inputs, params):
    return [jnp.clip(inputs[0], node.attrs.get("min"), node.attrs.get("max"))]


_BINARY = {
    "Add": jnp.add,
    "Sub": jnp.subtract,
    "Mul": jnp.multiply,
    "Div": jnp.divide,
    "Max": jnp.maximum,
    "Min": jnp.minimum,
}
def _same_rank(a: jax.Array, b: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Prepend unit dimensions to the lower-rank operand (numpy/ONNX broadcasting, explicit)."""
    a, b = jnp.asarray(a), jnp.asarray(b)
    if a.ndim < b.ndim:
        a = a.reshape((1,) * (b.ndim - a.ndim) + a.shape)
    elif b.ndim < a.ndim:
        b = b.reshape((1,) * (a.ndim - b.ndim) + b.shape)
    return a, b


for _name, _fn in _BINARY.items():
    OPS[_name] = (lambda f: lambda node, inputs, params: [f(*_same_rank(*inputs[:2]))])(_fn)


def _pool(node: Node, x: jax.Array, init: Any, reducer) -> jax.Array:
    a = node.attrs
    return lax.reduce_window(
        x,
        init,
        reducer,
        tuple(a["window"]),
        tuple(a["strides"]),
        [tuple(p) for p in a["padding"]],
    )


@_register("MaxPool")
def _maxpool(node: Node, inputs, params):
    (x,) = inputs
    return [_pool(node, x, -jnp.inf, lax.max)]


@_register("AveragePool")
def _avgpool(node: Node, inputs, params):
    # count_include_pad semantics (divide by the full window), as flax's avg_pool by default.
    (x,) = inputs
    window = int(np.prod(node.attrs["window"]))
    return [_pool(node, x, 0.0, lax.add) / window]


@_register("SumPool")
def _sumpool(node: Node, inputs, params):
    (x,) = inputs
    return [_pool(node, x, 0.0, lax.add)]


@_register("Reshape")
def _reshape(node: Node, inputs, params):
    # ONNX Reshape semantics: 0 copies the input dimension (used for the batch), -1 is inferred.
    x = inputs[0]
    shape = [x.shape[i] if s == 0 else s for i, s in enumerate(node.attrs["shape"])]
    return [jnp.reshape(x, shape)]


@_register("Transpose")
def _transpose(node: Node, inputs, params):
    return [jnp.transpose(inputs[0], node.attrs["perm"])]


@_register("ReduceSum", "ReduceMax", "ReduceMean")
def _reduce(node: Node, inputs, params):
    fn = {"ReduceSum": jnp.sum, "ReduceMax": jnp.max, "ReduceMean": jnp.mean}[node.op]
    return [fn(inputs[0], axis=tuple(node.attrs["axes"]), keepdims=bool(node.attrs["keepdims"]))]


@_register("Softmax")
def _softmax(node: Node, inputs, params):
    return [jax.nn.softmax(inputs[0], axis=node.attrs.get("axis", -1))]


@_register("JaxPrimitive")
def _primitive(node: Node, inputs, params):
    # An elementwise JAX primitive kept as is (e.g. exp, logistic); binding it is exact.
    out = node.attrs["primitive"].bind(*inputs, **node.attrs["primitive_params"])
    return list(out) if node.attrs["primitive"].multiple_results else [out]


def run_op(node: Node, inputs: Sequence[jax.Array], params: dict[str, jax.Array]):
    """Run one node; raises UnsupportedOpError naming the node if its op is unknown."""
    fn = OPS.get(node.op)
    if fn is None:
        raise UnsupportedOpError(
            f"node {node.name!r} has operator {node.op!r}, which npujax cannot execute; "
            f"supported operators: {sorted(OPS)}."
        )
    return fn(node, inputs, params)

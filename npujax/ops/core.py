"""JAX implementations of the Graph operators.

Each implementation is ``fn(node, inputs, params) -> list of outputs`` where ``inputs`` are the
arrays named by ``node.inputs`` and ``params`` is ``params[node.name]`` (possibly already
fake-quantized by :func:`npujax.quantize.execute`). Semantics follow the ONNX operator
specification where the op has an ONNX name; layouts are explicit in the attributes.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from npujax.errors import QuantizationError, UnsupportedOpError
from npujax.ir.graph import Node
from npujax.quant.core import true_divide

__all__ = [
    "OPS", "apply_epilogue", "avgpool_count", "kernel_out_axis", "out_channel_view",
    "UNARY_EPILOGUES",
]

OpFn = Callable[[Node, Sequence[jax.Array], dict[str, jax.Array]], list[jax.Array]]
OPS: dict[str, OpFn] = {}


def _register(*names: str) -> Callable[[OpFn], OpFn]:
    def deco(fn: OpFn) -> OpFn:
        for n in names:
            OPS[n] = fn
        return fn

    return deco


def kernel_out_axis(node: Node) -> int:
    """Axis of the output channels in a GEMM node's ``kernel`` (the per-channel quant axis).

    Raises:
      QuantizationError: for a grouped ConvTranspose, whose kernel has no such axis (use
        :func:`out_channel_view`).
      UnsupportedOpError: for a node without a weight kernel.
    """
    if node.op == "Conv":
        return node.attrs["kernel_layout"].index("O")
    if node.op == "Gemm":
        return 1  # kernel is [in_features, out_features]
    if node.op == "ConvTranspose":
        if int(node.attrs["groups"]) > 1:
            raise QuantizationError(
                f"node {node.name!r}: a ConvTranspose with groups={node.attrs['groups']} has no "
                "single output-channel axis in its [C_in, C_out/groups, *k] kernel; quantize "
                "per channel through npujax.ops.core.out_channel_view.")
        return 1  # ONNX ConvTranspose kernel is [C_in, C_out, *k]
    raise UnsupportedOpError(f"node {node.name!r} ({node.op}) has no weight kernel.")


def out_channel_view(node: Node, kernel: Any) -> tuple[Any, int, Callable[[Any], Any]]:
    """The kernel seen with its output channels on one axis, that axis, and the map back.

    Per-channel quantization needs one scale per output channel. For Conv, Gemm and an
    ungrouped ConvTranspose that is one axis of the kernel (:func:`kernel_out_axis`) and the view
    is the kernel itself. A grouped ConvTranspose kernel ``[C_in, C_out/g, *k]`` keeps output
    channel ``i*(C_out/g) + j`` in rows ``i*C_in/g .. (i+1)*C_in/g - 1`` of column ``j``; its
    view is ``[C_out, C_in/g, *k]`` (axis 0), the layout the op runs in.

    Args:
      node: a GEMM-like node.
      kernel: its kernel (numpy or JAX array).

    Returns:
      ``(view, axis, back)`` with ``back(view) == kernel``.
    """
    if node.op == "ConvTranspose" and int(node.attrs["groups"]) > 1:
        g = int(node.attrs["groups"])
        c_in, c_out_g, *k = kernel.shape
        view = kernel.reshape(g, c_in // g, c_out_g, *k).swapaxes(1, 2).reshape(
            g * c_out_g, c_in // g, *k)

        def back(v: Any) -> Any:
            return v.reshape(g, c_out_g, c_in // g, *k).swapaxes(1, 2).reshape(c_in, c_out_g, *k)

        return view, 0, back
    return kernel, kernel_out_axis(node), lambda v: v


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


def _depthwise_conv(x: jax.Array, kernel: jax.Array, a: dict) -> jax.Array:
    """Depthwise convolution as a sum of strided shifted products (same result as lax.conv).

    XLA:CPU runs ``feature_group_count == C`` convolutions tens of times slower than this
    shift-and-multiply form (measured 8 ms vs 0.2 ms for a 64-channel 24x96 3x3 layer), and the
    mobile CNNs npujax imports are full of them. Supports any stride, dilation, padding, channel
    multiplier and layout; the summation order differs from XLA's, so results agree to float
    rounding.
    """
    layout, klayout = a["data_layout"], a["kernel_layout"]
    xc = jnp.transpose(x, [layout.index(d) for d in "NCHW"])
    w = jnp.transpose(kernel, [klayout.index(d) for d in "OIHW"])  # [C*m, 1, kh, kw]
    c = xc.shape[1]
    m = w.shape[0] // c
    (pt, pb), (pl, pr) = a["padding"]
    xp = jnp.pad(xc, ((0, 0), (0, 0), (pt, pb), (pl, pr)))
    if m > 1:
        xp = jnp.repeat(xp, m, axis=1)
    sh, sw = a["strides"]
    dh, dw = a["dilations"]
    kh, kw = w.shape[2:]
    ho = (xp.shape[2] - (dh * (kh - 1) + 1)) // sh + 1
    wo = (xp.shape[3] - (dw * (kw - 1) + 1)) // sw + 1
    out = None
    for i in range(kh):
        for j in range(kw):
            patch = lax.slice(xp, (0, 0, i * dh, j * dw),
                              (xp.shape[0], xp.shape[1], i * dh + (ho - 1) * sh + 1,
                               j * dw + (wo - 1) * sw + 1), (1, 1, sh, sw))
            term = patch * w[:, 0, i, j].reshape(1, -1, 1, 1)
            out = term if out is None else out + term
    return jnp.transpose(out, ["NCHW".index(d) for d in layout])


def _is_depthwise(x: jax.Array, kernel: jax.Array, a: dict) -> bool:
    if len(a["strides"]) != 2 or any(d != 1 for d in a.get("lhs_dilation", (1, 1))):
        return False
    c_in = x.shape[a["data_layout"].index("C")]
    k = dict(zip(a["kernel_layout"], kernel.shape))
    return int(a["groups"]) == c_in > 1 and k["I"] == 1 and k["H"] * k["W"] <= 49


def _is_pointwise(kernel: jax.Array, a: dict) -> bool:
    k = dict(zip(a["kernel_layout"], kernel.shape))
    return (len(a["strides"]) == 2 and int(a["groups"]) == 1 and k["H"] == k["W"] == 1
            and all(s == 1 for s in a["strides"]) and all(p == [0, 0] or tuple(p) == (0, 0)
                                                          for p in a["padding"])
            and all(d == 1 for d in a.get("lhs_dilation", (1, 1))))


def _pointwise_conv(x: jax.Array, kernel: jax.Array, a: dict) -> jax.Array:
    """A 1x1 convolution as a matrix product over the channel axis (XLA:CPU's dot is faster
    than its convolution for this shape)."""
    layout, klayout = a["data_layout"], a["kernel_layout"]
    w = jnp.transpose(kernel, [klayout.index(d) for d in "OIHW"])[:, :, 0, 0]  # [O, I]
    spec = layout.replace("C", "c")
    out = layout.replace("C", "o")
    return jnp.einsum(f"{spec},oc->{out}", x, w)


@_register("Conv")
def _conv(node: Node, inputs, params):
    a = node.attrs
    (x,) = inputs
    if _is_depthwise(x, params["kernel"], a):
        y = _depthwise_conv(x, params["kernel"], a)
    elif _is_pointwise(params["kernel"], a):
        y = _pointwise_conv(x, params["kernel"], a)
    else:
        y = _dense_conv(x, params["kernel"], a)
    if "bias" in params:
        c_axis = a["data_layout"].index("C")
        shape = [1] * y.ndim
        shape[c_axis] = -1
        y = y + params["bias"].reshape(shape)
    return [apply_epilogue(node, y)]


def _dense_conv(x: jax.Array, kernel: jax.Array, a: dict,
                preferred_element_type: Any = None) -> jax.Array:
    """A Conv node's convolution with XLA (``preferred_element_type=int32`` for integer codes)."""
    return lax.conv_general_dilated(
        x,
        kernel,
        window_strides=tuple(a["strides"]),
        padding=[tuple(p) for p in a["padding"]],
        lhs_dilation=tuple(a.get("lhs_dilation", (1,) * len(a["strides"]))),
        rhs_dilation=tuple(a["dilations"]),
        dimension_numbers=(a["data_layout"], a["kernel_layout"], a["data_layout"]),
        feature_group_count=int(a["groups"]),
        preferred_element_type=preferred_element_type,
    )


@_register("Gemm")
def _gemm(node: Node, inputs, params):
    (x,) = inputs
    y = jnp.matmul(x, params["kernel"])
    if "bias" in params:
        y = y + jnp.reshape(params["bias"], (1,) * (y.ndim - 1) + (-1,))
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
    x = inputs[0]
    lo, hi = node.attrs.get("min"), node.attrs.get("max")
    lo = None if lo is None else jnp.asarray(lo, x.dtype)
    hi = None if hi is None else jnp.asarray(hi, x.dtype)
    # ONNX Clip: min(max(x, lo), hi), so hi wins when lo > hi.
    if lo is not None:
        x = jnp.maximum(x, lo)
    if hi is not None:
        x = jnp.minimum(x, hi)
    return [x]


def _divide(a: jax.Array, b: jax.Array) -> jax.Array:
    """ONNX Div: correctly rounded for floats, as onnxruntime's (XLA alone would multiply by the
    reciprocal of a broadcast divisor; see :func:`npujax.quant.core.true_divide`)."""
    dtype = jnp.result_type(a, b)
    if not jnp.issubdtype(dtype, jnp.floating):
        return jnp.divide(a, b)
    shape = jnp.broadcast_shapes(jnp.shape(a), jnp.shape(b))
    return true_divide(jnp.broadcast_to(jnp.asarray(a, dtype), shape), b)


_BINARY = {
    "Add": jnp.add,
    "Sub": jnp.subtract,
    "Mul": jnp.multiply,
    "Div": _divide,
    "Max": jnp.maximum,
    "Min": jnp.minimum,
}


def align_ranks(*xs: jax.Array) -> list[jax.Array]:
    """Prepend unit axes so all operands have the same rank (ONNX/numpy broadcasting, explicit)."""
    rank = max(jnp.ndim(x) for x in xs)
    return [jnp.reshape(x, (1,) * (rank - jnp.ndim(x)) + tuple(jnp.shape(x))) for x in xs]


for _name, _fn in _BINARY.items():
    # Variadic for Max/Min (ONNX); the arithmetic ops always have two inputs.
    OPS[_name] = (lambda f: lambda node, inputs, params: [
        functools.reduce(f, align_ranks(*inputs))])(_fn)


def _pool(node: Node, x: jax.Array, init: Any, reducer) -> jax.Array:
    a = node.attrs
    return lax.reduce_window(
        x,
        init,
        reducer,
        tuple(a["window"]),
        tuple(a["strides"]),
        [tuple(p) for p in a["padding"]],
        window_dilation=tuple(a.get("window_dilation", (1,) * x.ndim)),
    )


@_register("MaxPool")
def _maxpool(node: Node, inputs, params):
    (x,) = inputs
    lowest = -np.inf if jnp.issubdtype(x.dtype, jnp.floating) else np.iinfo(x.dtype).min
    return [_pool(node, x, np.array(lowest, x.dtype), lax.max)]


def avgpool_count(node: Node, shape: tuple[int, ...]) -> np.ndarray:
    """The divisor of an AveragePool node for each output element (a static numpy array).

    Without ``count_include_pad`` in attrs: the full window (flax's avg_pool default). With it
    (ONNX import): the window's elements inside the input, plus the explicit pads when
    count_include_pad=1; the ``ceil_extra`` end padding that ceil_mode adds is never counted
    (ONNX AveragePool spec; onnxruntime's pool kernels).
    """
    a = node.attrs
    ndim = len(shape)
    if "count_include_pad" not in a:
        return np.asarray(int(np.prod(a["window"])))
    extra = a.get("ceil_extra", [0] * ndim)
    spatial = range(2, ndim)  # ONNX pools are channels-first: [N, C, *spatial]
    mshape = tuple(shape[i] if i in spatial else 1 for i in range(ndim))
    ones = np.ones(mshape, np.float32)
    if a["count_include_pad"]:
        explicit = [(p[0], p[1] - e) if i in spatial else (0, 0)
                    for i, (p, e) in enumerate(zip(a["padding"], extra))]
        ones = np.pad(ones, explicit, constant_values=1.0)
        pad = [(0, e) if i in spatial else (0, 0) for i, e in enumerate(extra)]
    else:
        pad = [tuple(p) if i in spatial else (0, 0) for i, p in enumerate(a["padding"])]
    window = tuple(w if i in spatial else 1 for i, w in enumerate(a["window"]))
    dil = tuple(a.get("window_dilation", (1,) * ndim))
    with jax.ensure_compile_time_eval():  # a static divisor, computed once while tracing
        return np.asarray(lax.reduce_window(ones, np.float32(0.0), lax.add, window,
                                            tuple(a["strides"]), pad, window_dilation=dil))


@_register("AveragePool")
def _avgpool(node: Node, inputs, params):
    (x,) = inputs
    total = _pool(node, x, np.array(0, x.dtype), lax.add)
    count = avgpool_count(node, x.shape)
    return [total / jnp.asarray(count, x.dtype)]


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
    # ``coerce_2d`` (ONNX opset < 13): the input is viewed as 2-D [prod(shape[:axis]), rest] and
    # normalised over the whole trailing block.
    x = inputs[0]
    axis = node.attrs.get("axis", -1) % max(x.ndim, 1)
    if node.attrs.get("coerce_2d") and axis != x.ndim - 1:
        flat = jnp.reshape(x, (int(np.prod(x.shape[:axis], dtype=np.int64)), -1))
        return [jnp.reshape(jax.nn.softmax(flat, axis=-1), x.shape)]
    return [jax.nn.softmax(x, axis=axis)]


@_register("JaxPrimitive")
def _primitive(node: Node, inputs, params):
    # An elementwise JAX primitive kept as is (e.g. exp, logistic); binding it is exact.
    out = node.attrs["primitive"].bind(*inputs, **node.attrs["primitive_params"])
    return list(out) if node.attrs["primitive"].multiple_results else [out]


# The operators only ONNX models use register themselves here (kept in their own module).
from npujax.ops import onnx_ops as _onnx_ops  # noqa: E402,F401


def run_op(node: Node, inputs: Sequence[jax.Array], params: dict[str, jax.Array]):
    """Run one node; raises UnsupportedOpError naming the node if its op is unknown."""
    fn = OPS.get(node.op)
    if fn is None:
        raise UnsupportedOpError(
            f"node {node.name!r} has operator {node.op!r}, which npujax cannot execute; "
            f"supported operators: {sorted(OPS)}."
        )
    return fn(node, inputs, params)

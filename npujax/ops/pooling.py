"""Pooling: MaxPool, AveragePool, SumPool (Flax's window sum) and GlobalAveragePool.

Windows, strides and padding are explicit per axis of the input (``[1, 1, kh, kw]`` for an ONNX
NCHW pool, ``[1, kh, kw, 1]`` for a Flax NHWC one). AveragePool divides by
:func:`avgpool_count`: the full window (Flax), or, for an ONNX or a Keras pool
(``count_include_pad`` in the attributes), the window's elements inside the input plus the
explicit pads when ``count_include_pad=1``; the end padding ``ceil_mode`` adds is never counted
(ONNX AveragePool spec; onnxruntime's pool kernels).

On integer codes (:mod:`npujax.backends.integer`) MaxPool is exact and AveragePool rounds once:
from saturated codes as onnxruntime's QLinearAveragePool does (float32, window summed in
row-major order), from unsaturated codes with extra fraction bits as an int32 pooling unit does.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from npujax.errors import UnsupportedOpError
from npujax.numerics.core import true_divide
from npujax.numerics.fixed_point import div_round_half_even
from npujax.ops._onnx import conv_pads, simple_importer
from npujax.ops.registry import OpDef, VectorWork, is_forward_only, onnx_importer, register

if TYPE_CHECKING:
    from npujax.ir.graph import Node
    from npujax.numerics.fixed_point import QTensor

__all__ = ["avgpool_count"]


def _pool(node: Node, x: jax.Array, init: Any, reducer: Any) -> jax.Array:
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


#: In a forward-only trace (:func:`npujax.ops.registry.forward_only`), a MaxPool without padding
#: whose window has at most this many elements is the maximum of its window's strided slices.
_SLICED_MAX_WINDOW = 16


def _maxpool(node: Node, inputs: Sequence[jax.Array], params: Mapping[str, jax.Array]):
    (x,) = inputs
    a = node.attrs
    window, strides = tuple(a["window"]), tuple(a["strides"])
    dil = tuple(a.get("window_dilation", (1,) * x.ndim))
    if (is_forward_only() and all(tuple(p) == (0, 0) for p in a["padding"])
            and math.prod(window) <= _SLICED_MAX_WINDOW
            and all(d * (k - 1) < n for d, k, n in zip(dil, window, x.shape))):
        return [_sliced_max(x, window, strides, dil)]
    lowest = -np.inf if jnp.issubdtype(x.dtype, jnp.floating) else np.iinfo(x.dtype).min
    return [_pool(node, x, np.array(lowest, x.dtype), lax.max)]


def _sliced_max(x: jax.Array, window: tuple[int, ...], strides: tuple[int, ...],
                dil: tuple[int, ...]) -> jax.Array:
    """An unpadded max pool as the maximum of one strided slice per window element: the same
    values as ``lax.reduce_window``, which XLA:CPU runs through a slower reduction (PP-OCR cls's
    2x2 pool of a 200x2x96 map with the global mean after it: 170 us against 83 us)."""
    out_shape = [(n - d * (k - 1) - 1) // s + 1
                 for n, k, s, d in zip(x.shape, window, strides, dil)]
    out = None
    for offsets in np.ndindex(*window):
        start = [o * d for o, d in zip(offsets, dil)]
        limit = [b + (m - 1) * s + 1 for b, m, s in zip(start, out_shape, strides)]
        tap = lax.slice(x, start, limit, strides)
        out = tap if out is None else lax.max(out, tap)
    assert out is not None
    return out


def avgpool_count(node: Node, shape: tuple[int, ...]) -> np.ndarray:
    """The divisor of an AveragePool node for each output element (a static numpy array).

    Args:
      node: the AveragePool node.
      shape: its input shape.

    Returns:
      float32 array broadcasting against the output (a scalar for a Flax pool).
    """
    a = node.attrs
    ndim = len(shape)
    if "count_include_pad" not in a:
        return np.asarray(int(np.prod(a["window"])))
    extra = a.get("ceil_extra", [0] * ndim)
    # the pooled axes: those with a window, stride or padding (an ONNX pool's H and W, NCHW;
    # an NHWC pool's after a layout pass or from a Keras model); any other axis counts 1
    spatial = [i for i in range(ndim) if a["window"][i] != 1 or a["strides"][i] != 1
               or list(a["padding"][i]) != [0, 0]]
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


def _avgpool(node: Node, inputs: Sequence[jax.Array], params: Mapping[str, jax.Array]):
    (x,) = inputs
    total = _pool(node, x, np.array(0, x.dtype), lax.add)
    count = avgpool_count(node, x.shape)
    return [total / jnp.asarray(count, x.dtype)]


def _sumpool(node: Node, inputs: Sequence[jax.Array], params: Mapping[str, jax.Array]):
    (x,) = inputs
    return [_pool(node, x, 0.0, lax.add)]


def _global_avg_pool(node: Node, inputs: Sequence[jax.Array], params: Mapping[str, jax.Array]):
    x = inputs[0]
    if node.attrs.get("sum_only"):  # its readers scale (npujax.ir.execute.inference)
        axes = tuple(range(2, x.ndim))
        return [lax.expand_dims(lax.reduce(x, np.zeros((), x.dtype), lax.add, axes), axes)]
    return [jnp.mean(x, axis=tuple(range(2, x.ndim)), keepdims=True)]


# --------------------------------------------------------------------------------------------
# Integer codes


def _maxpool_codes(node: Node, v: QTensor) -> QTensor:
    a = node.attrs
    init = jnp.asarray(jnp.iinfo(v.codes.dtype).min, v.codes.dtype)
    c = lax.reduce_window(v.codes, init, lax.max, tuple(a["window"]), tuple(a["strides"]),
                          [tuple(p) for p in a["padding"]])
    return v._replace(codes=c)


def _window_sum_in_order(node: Node, v: jax.Array) -> jax.Array:
    """Sum over each pooling window, adding the elements in row-major window order as ORT's
    pool loops do (padding adds zeros)."""
    a = node.attrs
    v = jnp.pad(v, [tuple(p) for p in a["padding"]])
    dil = tuple(a.get("window_dilation", (1,) * v.ndim))
    out_shape = [(v.shape[i] - (a["window"][i] - 1) * dil[i] - 1) // a["strides"][i] + 1
                 for i in range(v.ndim)]
    total = None
    for offset in np.ndindex(*a["window"]):
        start = [o * d for o, d in zip(offset, dil)]
        limit = [b + (n - 1) * st + 1 for b, n, st in zip(start, out_shape, a["strides"])]
        term = lax.slice(v, start, limit, tuple(a["strides"]))
        total = term if total is None else total + term
    assert total is not None
    return total


def _avgpool_codes(node: Node, v: QTensor) -> QTensor:
    """``DQ -> AveragePool -> Q`` on one grid (see the module docstring for the two modes)."""
    a = node.attrs
    count = avgpool_count(node, v.codes.shape)
    x = v.codes - (v.zero_point << v.frac_bits)
    if v.frac_bits == 0:  # saturated codes: onnxruntime's QLinearAveragePool, float32
        xd = v.scale * x.astype(jnp.float32)
        avg = true_divide(_window_sum_in_order(node, xd), count)
        q = jnp.round(true_divide(avg, v.scale) + v.zero_point.astype(jnp.float32))
        q = q.astype(jnp.int32)
    else:  # int32 pooling unit: one rounding of the unsaturated sum
        s = lax.reduce_window(x, jnp.int32(0), lax.add, tuple(a["window"]), tuple(a["strides"]),
                              [tuple(p) for p in a["padding"]],
                              window_dilation=tuple(a.get("window_dilation", (1,) * x.ndim)))
        d = jnp.asarray(count, jnp.int32) * jnp.int32(2**v.frac_bits)
        q = div_round_half_even(s, d) + v.zero_point
    return v._replace(codes=jnp.clip(q, v.fmt.qmin, v.fmt.qmax), frac_bits=0)


# --------------------------------------------------------------------------------------------
# ONNX


@onnx_importer("MaxPool", "AveragePool")
def _import_pool(ctx: Any, n: Any, a: Mapping[str, Any]) -> None:
    if len(n.output) > 1 and n.output[1]:
        raise UnsupportedOpError("MaxPool with the Indices output is not supported.")
    shape = ctx.shape(n.input[0])
    k = list(a["kernel_shape"])
    nsp = len(k)
    strides = list(a.get("strides", [1] * nsp))
    dil = list(a.get("dilations", [1] * nsp))
    eff = [(kk - 1) * d + 1 for kk, d in zip(k, dil)]
    auto = a.get("auto_pad", "NOTSET")
    ceil = bool(a.get("ceil_mode", 0))
    pads = conv_pads(a, shape[2:], k, strides, dil)
    extra = []
    for size, e, s, (pb, pe) in zip(shape[2:], eff, strides, pads):
        if auto in ("SAME_UPPER", "SAME_LOWER"):
            out = -(-size // s)
        elif auto == "VALID":
            out = (size - e) // s + 1
        else:
            span = size + pb + pe - e
            out = (-(-span // s) if ceil else span // s) + 1
            if ceil and (out - 1) * s >= size + pb:
                out -= 1  # the last window must start inside the input or the begin padding
        extra.append(max(0, (out - 1) * s + e - (size + pb + pe)))
    attrs: dict[str, Any] = {
        "window": [1, 1, *k], "strides": [1, 1, *strides],
        "padding": [[0, 0], [0, 0]] + [[pb, pe + x] for (pb, pe), x in zip(pads, extra)],
        "window_dilation": [1, 1, *dil],
    }
    if n.op_type == "AveragePool":
        attrs["count_include_pad"] = int(a.get("count_include_pad", 0))
        attrs["ceil_extra"] = [0, 0, *extra]
    ctx.emit(n.op_type, [n.input[0]], [n.output[0]], attrs)


onnx_importer("GlobalAveragePool")(simple_importer("GlobalAveragePool"))


def _export_pool(w: Any, node: Node) -> None:
    a = node.attrs
    rank = len(a["window"])

    def plain(i: int) -> bool:
        return a["window"][i] == 1 and a["strides"][i] == 1 and list(a["padding"][i]) == [0, 0]

    if not plain(0) or not (plain(1) or plain(rank - 1)):
        raise UnsupportedOpError(f"node {node.name!r}: {node.op} pooling over the batch or "
                                 "without a channel axis cannot be exported as an ONNX pool.")
    axis = 1 if plain(1) else rank - 1
    x, y, perm = w.to_channels_first(node, axis, rank)
    perm = perm or list(range(rank))
    win = [a["window"][i] for i in perm][2:]
    strides = [a["strides"][i] for i in perm][2:]
    padding = [list(a["padding"][i]) for i in perm][2:]
    extra = [list(a.get("ceil_extra", [0] * rank))[i] for i in perm][2:]
    pads = [p[0] for p in padding] + [p[1] - e for p, e in zip(padding, extra)]
    attrs: dict[str, Any] = {"kernel_shape": win, "strides": strides, "pads": pads,
                             "ceil_mode": int(any(extra))}
    dil = [list(a.get("window_dilation", [1] * rank))[i] for i in perm][2:]
    if any(d != 1 for d in dil):
        attrs["dilations"] = dil
    if node.op == "AveragePool":
        attrs["count_include_pad"] = int(a.get("count_include_pad", 1))
    w.add(node.op, [x], [y], node.name, **attrs)
    w.flush()


def _export_global(w: Any, node: Node) -> None:
    w.add(node.op, list(node.inputs), list(node.outputs), node.name)


def _global_work(node: Node, ins: Sequence[tuple[int, ...]], outs: Sequence[tuple[int, ...]]
                 ) -> VectorWork:
    """One operation per input element, as an AveragePool's window over the whole image (its
    per-output count times the H x W window): a global pool over 7x7x1024 is 50,176 additions,
    not the 1,024 operations of one per output."""
    return VectorWork(alu_ops=int(np.prod(ins[0], dtype=np.int64)), special_ops=0)


register(
    OpDef(name="MaxPool", run=_maxpool, cost="vector", export=_export_pool, codes="exact",
          run_codes=_maxpool_codes),
    OpDef(name="AveragePool", run=_avgpool, cost="vector", export=_export_pool,
          codes="rounding", run_codes=_avgpool_codes),
    OpDef(name="SumPool", run=_sumpool, cost="vector"),
    OpDef(name="GlobalAveragePool", run=_global_avg_pool, cost="vector", export=_export_global,
          vector_work=_global_work),
)

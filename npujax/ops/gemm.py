"""Operators on the MAC array: Conv, ConvTranspose, Gemm (weights) and MatMul (two activations).

Semantics follow ONNX (https://onnx.ai/onnx/operators/): Conv with explicit layouts
(``data_layout``/``kernel_layout``, e.g. ``NCHW``/``OIHW`` from ONNX, ``NHWC``/``HWIO`` from
Flax), Gemm as ``x[..., K] @ kernel[K, N] + bias``, ConvTranspose with ONNX's ``[C_in,
C_out/groups, *k]`` kernel, MatMul as numpy ``matmul``. A fused activation (``attrs
['epilogue']``) is applied in the output stage. As GEMMs after im2col a convolution is ``groups``
GEMMs of ``M = batch x output pixels``, ``K = C_in/groups x k_h x k_w``, ``N = C_out/groups``
(:func:`npujax.systolic.conv.im2col_extents`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from npujax.errors import QuantizationError, UnsupportedOpError
from npujax.ops._onnx import conv_pads
from npujax.ops.elementwise import align_ranks
from npujax.ops.registry import (
    ArrayWork,
    OpDef,
    apply_epilogue,
    is_forward_only,
    onnx_importer,
    out_channel_view,
    register,
)
from npujax.systolic.conv import im2col_extents

if TYPE_CHECKING:
    from npujax.ir.graph import Node

__all__ = ["dense_conv"]


def _pad(c: int, align: int) -> int:
    return -(-c // align) * align


# --------------------------------------------------------------------------------------------
# Conv


def _host(w: Any) -> Any:
    """A weight as a numpy array when its value is known (a constant of the program, e.g. under
    :func:`npujax.ir.execute.inference`), else as given (a traced argument): rearranging a
    known kernel (transposes, per-tap slices) then costs no traced operations, which shortens
    tracing, lowering and XLA's constant folding. The same values either way."""
    return w if isinstance(w, jax.core.Tracer) else np.asarray(w)


def _pad_hw(xc: jax.Array, pt: int, pb: int, pl: int, pr: int) -> jax.Array:
    """Zero padding of an NCHW tensor's H and W; a negative amount crops, as XLA's
    convolution padding does (the 3x3 tiles of a split large kernel read shifted windows,
    :mod:`npujax.ir.rewrites.large_kernel_conv`)."""
    zero = jnp.zeros((), xc.dtype)
    return lax.pad(xc, zero, ((0, 0, 0), (0, 0, 0), (int(pt), int(pb), 0), (int(pl), int(pr), 0)))


def _depthwise_conv(x: jax.Array, kernel: jax.Array, a: Mapping[str, Any]) -> jax.Array:
    """Depthwise convolution as a sum of strided shifted products (same result as lax.conv).

    XLA:CPU runs ``feature_group_count == C`` convolutions tens of times slower than this
    shift-and-multiply form (measured 8 ms vs 0.2 ms for a 64-channel 24x96 3x3 layer), and the
    mobile CNNs npujax imports are full of them. Supports any stride, dilation, padding, channel
    multiplier and layout; the summation order differs from XLA's, so results agree to float
    rounding. With a known kernel and ``attrs["flattened_by_consumer"]`` (set by
    :func:`npujax.ir.execute.execute`), a stride-1 layer that keeps its width runs on flattened
    rows instead (:func:`_depthwise_rows`).
    """
    layout, klayout = a["data_layout"], a["kernel_layout"]
    xc = jnp.transpose(x, [layout.index(d) for d in "NCHW"])
    # [C*m, 1, kh, kw]: numpy when the kernel is known, else traced
    w: jax.Array | np.ndarray = _host(kernel).transpose([klayout.index(d) for d in "OIHW"])
    c = xc.shape[1]
    m = w.shape[0] // c
    (pt, pb), (pl, pr) = a["padding"]
    sh, sw = a["strides"]
    dh, dw = a["dilations"]
    kh, kw = w.shape[2:]
    if (isinstance(w, np.ndarray) and a.get("flattened_by_consumer")
            and _rows_apply(xc.shape, kh, kw, a)):
        if m > 1:
            xc = jnp.repeat(xc, m, axis=1)
        return jnp.transpose(_depthwise_rows(xc, w[:, 0], a), ["NCHW".index(d) for d in layout])
    xp = _pad_hw(xc, pt, pb, pl, pr)
    if m > 1:
        xp = jnp.repeat(xp, m, axis=1)
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
    assert out is not None
    return jnp.transpose(out, ["NCHW".index(d) for d in layout])


def _rows_apply(x_shape: tuple[int, ...], kh: int, kw: int, a: Mapping[str, Any]) -> bool:
    """Whether :func:`_depthwise_rows` computes this depthwise convolution (NCHW ``x_shape``):
    stride 1, no cropping, and an output as wide as the input ("same" padding along W)."""
    (pt, pb), (pl, pr) = (tuple(int(v) for v in p) for p in a["padding"])
    dh, dw = (int(d) for d in a["dilations"])
    return (all(int(s) == 1 for s in a["strides"]) and min(pt, pb, pl, pr) >= 0
            and pl + pr == dw * (kw - 1) and max(pl, pr) <= x_shape[3]
            and x_shape[2] + pt + pb > dh * (kh - 1))


def _depthwise_rows(xc: jax.Array, w: np.ndarray, a: Mapping[str, Any]) -> jax.Array:
    """A stride-1 depthwise convolution of NCHW ``xc`` with a known kernel ``w`` ``[C, kh, kw]``
    whose output keeps the input's width (:func:`_rows_apply`), computed on the rows flattened to
    ``[N, C, H*W]``.

    The input is padded once along H, by ``pt + 1`` zero rows above and ``pb + 1`` below, and
    flattened; tap ``(i, j)`` is then the contiguous slice at offset ``(i*dh + 1)*W + j*dw -
    pl``, and the taps of one kernel column share a mask that zeroes the reads that wrapped
    round a row edge (into the neighbouring row, or the extra zero row).
    XLA:CPU vectorises this loop whether the output stays 4-D or is flattened for the 1x1
    convolution that follows; the strided-slice form of :func:`_depthwise_conv` is not
    vectorised once flattened (PP-OCR rec's 240-channel 12x80 5x5 layer followed by a
    240-channel 1x1 convolution: 2.5 ms against 1.1 ms of CPU). ``execute`` asks for this form
    (``attrs["flattened_by_consumer"]``) where only 1x1 convolutions read the output; where it
    is also pooled the strided form is faster. Same values as ``lax.conv_general_dilated`` up
    to the order of the float sums.
    """
    n, c, h, wd = xc.shape
    kh, kw = w.shape[1:]
    dh, dw = (int(d) for d in a["dilations"])
    (pt, pb), (pl, pr) = (tuple(int(v) for v in p) for p in a["padding"])
    ho = h + pt + pb - dh * (kh - 1)
    length = ho * wd
    # One more zero row above and below the H padding holds the reads of the first and last
    # columns' taps (masked); padding the flattened rows instead by pl and pr elements made
    # XLA:CPU emit a pad that loads before its input buffer (a segfault on PP-OCR det).
    xf = lax.pad(xc, jnp.zeros((), xc.dtype),
                 ((0, 0, 0), (0, 0, 0), (pt + 1, pb + 1, 0), (0, 0, 0))
                 ).reshape(n, c, (h + pt + pb + 2) * wd)
    col = np.arange(length).reshape(1, 1, length) % wd  # numpy: constant masks, no kernel
    out = None
    for j in range(kw):
        acc = None
        for i in range(kh):
            off = (i * dh + 1) * wd + j * dw - pl
            term = lax.slice_in_dim(xf, off, off + length, axis=2) * w[:, i, j].reshape(1, -1, 1)
            acc = term if acc is None else acc + term
        assert acc is not None
        lo, hi = pl - j * dw, wd + pl - j * dw  # the columns whose tap lies inside the row
        if lo > 0 or hi < wd:
            inside = (col >= lo) & (col < hi)
            acc = jnp.where(inside, acc, jnp.zeros((), acc.dtype))
        out = acc if out is None else out + acc
    assert out is not None
    return out.reshape(n, c, ho, wd)


def _is_depthwise(x: jax.Array, kernel: jax.Array, a: Mapping[str, Any]) -> bool:
    if len(a["strides"]) != 2 or any(d != 1 for d in a.get("lhs_dilation", (1, 1))):
        return False
    c_in = x.shape[a["data_layout"].index("C")]
    k = dict(zip(a["kernel_layout"], kernel.shape))
    return int(a["groups"]) == c_in > 1 and k["I"] == 1 and k["H"] * k["W"] <= 49


def _is_pointwise(kernel: jax.Array, a: Mapping[str, Any]) -> bool:
    k = dict(zip(a["kernel_layout"], kernel.shape))
    return (len(a["strides"]) == 2 and int(a["groups"]) == 1 and k["H"] == k["W"] == 1
            and all(s == 1 for s in a["strides"]) and all(p == [0, 0] or tuple(p) == (0, 0)
                                                          for p in a["padding"])
            and all(d == 1 for d in a.get("lhs_dilation", (1, 1))))


#: In a forward-only trace, a product of one vector with a weight matrix of at most this many
#: elements runs as a product with two copies of the vector (:func:`_vector_product`).
_PAIRED_VECTOR_MAX_WEIGHTS = 1 << 16


def _pairs_vectors(one_row: bool, weights: int) -> bool:
    """Whether a product with a matrix of ``weights`` elements runs as :func:`_vector_product`:
    in a forward-only trace, of one row, the matrix small."""
    return one_row and is_forward_only() and weights <= _PAIRED_VECTOR_MAX_WEIGHTS


def _vector_product(v: jax.Array, w: Any) -> jax.Array:
    """``v @ w`` for one row ``v`` (``K`` elements, any shape) and ``w`` ``[K, N]`` as ``[v; v]
    @ w`` and its first row (``[N]``); :func:`_pairs_vectors` says where.

    XLA:CPU compiles a matrix-vector product into an LLVM kernel of its own (YNNPACK takes no
    vectors), about 15 ms of compilation each; a two-row product goes to YNNPACK and compiles
    nothing, and the copy and the row pick fuse into the neighbouring loops. The PP-OCR
    classifier's squeeze-and-excitation blocks and head have 19 such products. The values are
    ``v @ w``'s (each row is the same product)."""
    if v.dtype != w.dtype:
        return jnp.matmul(jnp.broadcast_to(jnp.reshape(v, (1, -1)), (2, v.size)), w)[0]
    pair = lax.broadcast_in_dim(lax.reshape(v, (1, v.size)), (2, v.size), (0, 1))
    y = lax.dot_general(pair, w, (((1,), (0,)), ((), ())))  # lax: the cheapest to trace
    return lax.index_in_dim(y, 0, 0, keepdims=False)


def _pointwise_conv(x: jax.Array, kernel: jax.Array, a: Mapping[str, Any]) -> jax.Array:
    """A 1x1 convolution as a matrix product over the channel axis (XLA:CPU's dot is faster
    than its convolution for this shape); on one pixel of one example, a vector product
    (:func:`_vector_product`)."""
    layout, klayout = a["data_layout"], a["kernel_layout"]
    w = _host(kernel).transpose([klayout.index(d) for d in "OIHW"])[:, :, 0, 0]  # [O, I]
    c = layout.index("C")
    if _pairs_vectors(x.size == x.shape[c], w.size):
        y = _vector_product(x, w.T)
        return y.reshape([w.shape[0] if i == c else 1 for i in range(x.ndim)])
    spec = layout.replace("C", "c")
    out = layout.replace("C", "o")
    return jnp.einsum(f"{spec},oc->{out}", x, w)


#: A dense 2-D conv with at most this many input channels runs as im2col + one matrix product.
_IM2COL_MAX_CIN = 4


def _is_small_cin(x: jax.Array, a: Mapping[str, Any]) -> bool:
    return (len(a["strides"]) == 2 and int(a["groups"]) == 1
            and x.shape[a["data_layout"].index("C")] <= _IM2COL_MAX_CIN
            and all(d == 1 for d in a.get("lhs_dilation", (1, 1))))


def _im2col_conv(x: jax.Array, kernel: jax.Array, a: Mapping[str, Any]) -> jax.Array:
    """A dense 2-D convolution with few input channels (an RGB stem) as im2col and one matrix
    product with ``K = C_in x k_h x k_w``.

    XLA:CPU's convolution is slow for ``C_in = 3`` (measured 330 us vs 125 us for PP-OCR's
    3->8, 3x3, stride-2 stem at 48x192). Any stride, dilation and padding; results agree with
    ``lax.conv`` to float rounding (another summation order).
    """
    layout, klayout = a["data_layout"], a["kernel_layout"]
    xc = jnp.transpose(x, [layout.index(d) for d in "NCHW"])
    w = _host(kernel).transpose([klayout.index(d) for d in "OIHW"])  # [O, C, kh, kw]
    o, c, kh, kw = w.shape
    (pt, pb), (pl, pr) = a["padding"]
    sh, sw = a["strides"]
    dh, dw = a["dilations"]
    ho = (xc.shape[2] + pt + pb - (dh * (kh - 1) + 1)) // sh + 1
    wo = (xc.shape[3] + pl + pr - (dw * (kw - 1) + 1)) // sw + 1
    if ho <= 0 or wo <= 0:  # a window larger than its padded input: XLA's empty output, which
        return dense_conv(x, kernel, a)  # validation reports as such (never a slice error)
    if isinstance(w, np.ndarray) and (sh > 1 or sw > 1) and dh == dw == 1:
        out = _phase_conv(xc, w, (pt, pl), (sh, sw), (ho, wo))
        return jnp.transpose(out, ["NCHW".index(d) for d in layout])
    xp = _pad_hw(xc, pt, pb, pl, pr)
    taps = [lax.slice(xp, (0, 0, i * dh, j * dw),
                      (xp.shape[0], c, i * dh + (ho - 1) * sh + 1, j * dw + (wo - 1) * sw + 1),
                      (1, 1, sh, sw))
            for i in range(kh) for j in range(kw)]
    patches = jnp.stack(taps, axis=2)  # [N, C, kh*kw, ho, wo]
    out = jnp.einsum("nckhw,ock->nohw", patches, w.reshape(o, c, kh * kw))
    return jnp.transpose(out, ["NCHW".index(d) for d in layout])


def _phase_conv(xc: jax.Array, w: np.ndarray, begin: tuple[int, int], strides: tuple[int, int],
                out_hw: tuple[int, int]) -> jax.Array:
    """A strided convolution of NCHW ``xc`` with a known kernel ``w`` ``[O, C, kh, kw]`` (no
    dilation; ``begin`` = the top and left padding, ``out_hw`` its output's size) as a stride-1
    one on its stride phases ("space to depth"), for :func:`_im2col_conv`.

    The padded input is split into its ``sh x sw`` phases, ``[N, C*sh*sw, Hq, Wq]`` (one
    transpose); tap ``(i, j)`` of the kernel reads phase ``(i % sh, j % sw)`` at offset
    ``(i // sh, j // sw)``, so the convolution is ``ceil(kh/sh) x ceil(kw/sw)`` unit-stride
    slices of the phases stacked and one matrix product with the kernel rearranged to match
    (zeros where a phase's tap lies outside the kernel). XLA:CPU compiles the transpose and the
    stacking into one loop kernel, where the im2col form's strided slices took a kernel each
    and the concatenation another (PP-OCR's 3x3 stride-2 stem: 3 kernels instead of 11, about
    0.1 s less compilation, the same run time). Same values as ``lax.conv`` up to the order of
    the sums (and an infinite or NaN input read by a zero weight gives NaN).
    """
    n, c = xc.shape[:2]
    o, _, kh, kw = w.shape
    sh, sw = strides
    ho, wo = out_hw
    th, tw = -(-kh // sh), -(-kw // sw)
    hq, wq = ho + th - 1, wo + tw - 1
    pt, pl = begin
    # pad (or crop) the far edges so that the padded input is exactly hq*sh x wq*sw: the rows
    # and columns cut off are never read, the ones added are read by zero weights only
    xp = _pad_hw(xc, pt, hq * sh - xc.shape[2] - pt, pl, wq * sw - xc.shape[3] - pl)
    ph = xp.reshape(n, c, hq, sh, wq, sw).transpose(0, 1, 3, 5, 2, 4).reshape(
        n, c * sh * sw, hq, wq)
    w2 = np.zeros((o, c, sh, sw, th, tw), w.dtype)
    for i in range(kh):
        for j in range(kw):
            w2[:, :, i % sh, j % sw, i // sh, j // sw] = w[:, :, i, j]
    taps = [lax.slice(ph, (0, 0, ti, tj), (n, c * sh * sw, ti + ho, tj + wo))
            for ti in range(th) for tj in range(tw)]
    patches = jnp.stack(taps, axis=2)  # [N, C*sh*sw, th*tw, ho, wo]
    return jnp.einsum("nckhw,ock->nohw", patches, w2.reshape(o, c * sh * sw, th * tw))


def dense_conv(x: jax.Array, kernel: jax.Array, a: Mapping[str, Any],
               preferred_element_type: Any = None) -> jax.Array:
    """A Conv node's convolution with XLA (``preferred_element_type=int32`` for integer codes).

    Args:
      x: the input in ``a["data_layout"]``.
      kernel: the kernel in ``a["kernel_layout"]``.
      a: the node's attributes (strides, padding, dilations, lhs_dilation, groups, layouts).
      preferred_element_type: accumulation dtype (None: the operands' dtype).
    """
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


def _conv(node: Node, inputs: Sequence[jax.Array], params: Mapping[str, jax.Array]):
    a = node.attrs
    (x,) = inputs
    if _is_depthwise(x, params["kernel"], a):
        y = _depthwise_conv(x, params["kernel"], a)
    elif _is_pointwise(params["kernel"], a):
        y = _pointwise_conv(x, params["kernel"], a)
    elif _is_small_cin(x, a):
        y = _im2col_conv(x, params["kernel"], a)
    else:
        y = dense_conv(x, params["kernel"], a)
    if "output_scale" in a:  # the input is a sum whose mean this reads (npujax.ir.execute)
        y = lax.mul(y, np.asarray(a["output_scale"], y.dtype))
    if "bias" in params:
        c_axis = a["data_layout"].index("C")
        shape = [1] * y.ndim
        shape[c_axis] = -1
        y = y + _host(params["bias"]).reshape(shape)
    return [apply_epilogue(node, y)]


def _conv_work(node: Node, ins: Sequence[tuple[int, ...]], outs: Sequence[tuple[int, ...]],
               align: int) -> ArrayWork:
    a = node.attrs
    layout, klayout = a["data_layout"], a["kernel_layout"]
    shape = a.get("kernel_shape")
    if shape is None:
        raise UnsupportedOpError(
            f"Conv node {node.name!r} lacks attrs['kernel_shape']; build graphs with the "
            "npujax importers (they record it)."
        )
    k = dict(zip(klayout, (int(d) for d in shape)))
    out = dict(zip(layout, outs[0]))
    c_in, c_out, groups = dict(zip(layout, ins[0]))["C"], out["C"], int(a["groups"])
    macs = out["N"] * out["H"] * out["W"] * k["H"] * k["W"] * k["I"] * c_out
    if groups == c_in == c_out and groups > 1:  # depthwise: pad the channel count
        groups = _pad(groups, align)
        cin_g, cout_g = 1, 1
    elif groups == 1:
        cin_g, cout_g = _pad(c_in, align), _pad(c_out, align)
    else:  # grouped: per-group channels are not padded
        cin_g, cout_g = c_in // groups, c_out // groups
    M, K, N = im2col_extents(out["N"], out["H"] * out["W"], k["H"] * k["W"], cin_g, cout_g)
    return ArrayWork(M, K, N, groups, macs, groups * K * N,
                     groups * N if "bias" in node.params else 0)


def _conv_axes_out(node: Node) -> int:
    return node.attrs["kernel_layout"].index("O")


def _conv_axes_in(node: Node) -> int:
    return node.attrs["kernel_layout"].index("I")


@onnx_importer("Conv", weights=True)
def _import_conv(ctx: Any, n: Any, a: Mapping[str, Any]) -> None:
    w = ctx.const(n.input[1], "weight W")
    b = ctx.opt_const(2, "bias B")
    k = list(w.shape[2:])
    nsp = len(k)
    strides = list(a.get("strides", [1] * nsp))
    dil = list(a.get("dilations", [1] * nsp))
    x_shape = ctx.shape(n.input[0])
    pads = conv_pads(a, x_shape[2:], k, strides, dil)
    if nsp > 3:
        raise UnsupportedOpError(f"Conv with {nsp} spatial dimensions is not supported.")
    layout = "NC" + "DHW"[3 - nsp:]
    params = {"kernel": w}
    if b is not None:
        params["bias"] = b
    ctx.emit("Conv", [n.input[0]], [n.output[0]], {
        "data_layout": layout, "kernel_layout": "OI" + layout[2:], "strides": strides,
        "padding": pads, "dilations": dil, "groups": int(a.get("group", 1)),
        "kernel_shape": [int(d) for d in w.shape],
    }, params)


def _export_conv(w: Any, node: Node) -> None:
    a = node.attrs
    layout, klayout = a["data_layout"], a["kernel_layout"]
    nsp = len(layout) - 2
    channels_first = "NC" + "DHW"[3 - nsp:]
    kernel = w.param(node, "kernel")
    kernel = np.transpose(kernel, [klayout.index(c) for c in "OI" + channels_first[2:]])
    if any(d != 1 for d in a.get("lhs_dilation", [1] * nsp)):
        raise UnsupportedOpError(f"node {node.name!r}: Conv with lhs_dilation cannot be exported.")
    x = node.inputs[0]
    if layout != channels_first:
        perm = [layout.index(c) for c in channels_first]
        t = w.name(f"{x}/to_nchw")
        w.add("Transpose", [x], [t], f"{node.name}/to_nchw", perm=perm)
        x = t
    x = w.qdq_input(node, x)
    kname, bname = w.weights(node, kernel, 0, 1)
    padding = [list(p) for p in a["padding"]]
    pads = [p[0] for p in padding] + [p[1] for p in padding]
    y = w.name(f"{node.name}/conv") if (a.get("epilogue") or layout != channels_first) else \
        node.outputs[0]
    w.add("Conv", [x, kname] + ([bname] if bname else []), [y], node.name,
          strides=list(a["strides"]), pads=pads, dilations=list(a["dilations"]),
          group=int(a["groups"]), kernel_shape=list(kernel.shape[2:]))
    if layout != channels_first:
        back = [channels_first.index(c) for c in layout]
        t = w.name(f"{node.name}/to_layout") if a.get("epilogue") else node.outputs[0]
        w.add("Transpose", [y], [t], f"{node.name}/from_nchw", perm=back)
        y = t
    if a.get("epilogue"):
        w.epilogue(node, y, node.outputs[0])


# --------------------------------------------------------------------------------------------
# Gemm


def _rows_product(x: jax.Array, w: jax.Array) -> jax.Array:
    """``x @ w`` for ``x`` ``[..., K]`` of rank > 2 and ``w`` ``[K, N]``, computed on ``x``
    reshaped to ``[rows, K]`` (the same products, ``[..., N]`` out).

    The gradient is where it differs: ``jnp.matmul`` of a rank-3 ``x`` differentiates the
    kernel as a product over two contracted axes followed by a transpose, which XLA:CPU
    compiled (a transformer's ``[batch, tokens, d]`` activations) into transposing copies of
    the activation gradients and Eigen products outside YNNPACK; on flattened rows the kernel
    gradient is one 2-D product with no copy. The digits ViT's QAT step went from 1.15-1.16 x
    qwix's to 1.09-1.12 x (docs/results/qwix.md, 2026-12-03)."""
    rows = math.prod(x.shape[:-1])
    return jnp.matmul(jnp.reshape(x, (rows, x.shape[-1])), w).reshape(*x.shape[:-1], w.shape[-1])


def _gemm(node: Node, inputs: Sequence[jax.Array], params: Mapping[str, jax.Array]):
    (x,) = inputs
    if _pairs_vectors(x.size == x.shape[-1], math.prod(params["kernel"].shape)):
        y = _vector_product(x, params["kernel"]).reshape(*x.shape[:-1], -1)
    elif x.ndim > 2:  # rows flattened: see _rows_product
        y = _rows_product(x, params["kernel"])
    else:
        y = jnp.matmul(x, params["kernel"])
    if "output_scale" in node.attrs:  # as Conv's
        y = lax.mul(y, np.asarray(node.attrs["output_scale"], y.dtype))
    if "bias" in params:
        y = y + jnp.reshape(params["bias"], (1,) * (y.ndim - 1) + (-1,))
    return [apply_epilogue(node, y)]


def _gemm_work(node: Node, ins: Sequence[tuple[int, ...]], outs: Sequence[tuple[int, ...]],
               align: int) -> ArrayWork:
    x, y = ins[0], outs[0]
    K, N = _pad(int(x[-1]), align), _pad(int(y[-1]), align)
    M = math.prod(int(d) for d in x[:-1])
    macs = M * int(x[-1]) * int(y[-1])
    return ArrayWork(M, K, N, 1, macs, K * N, N if "bias" in node.params else 0)


@onnx_importer("Gemm", weights=True)
def _import_gemm(ctx: Any, n: Any, a: Mapping[str, Any]) -> None:
    alpha, beta = float(a.get("alpha", 1.0)), float(a.get("beta", 1.0))
    x = n.input[0]
    if a.get("transA", 0):
        t = ctx.tmp(x)
        ctx.emit("Transpose", [x], [t], {"perm": [1, 0]}, name=f"{ctx.node_name}/transA")
        x = t
    c = ctx.opt_const(2, "C") if len(n.input) > 2 and n.input[2] in ctx.consts else None
    has_c = len(n.input) > 2 and bool(n.input[2])
    if n.input[1] in ctx.consts:
        w = ctx.consts[n.input[1]].astype(np.float32)
        w = (w.T if a.get("transB", 0) else w) * np.float32(alpha)
        N = w.shape[1]
        params = {"kernel": w}
        bias_is_vector = c is not None and c.size in (1, N) and (c.ndim < 2 or c.shape[0] == 1)
        if bias_is_vector and c is not None:  # (bias_is_vector implies c is not None)
            params["bias"] = np.broadcast_to(c.astype(np.float32).reshape(-1) * beta, (N,))
        if not has_c or bias_is_vector:
            ctx.emit("Gemm", [x], [n.output[0]], {}, params)
            return
        y = ctx.tmp(n.output[0])
        ctx.emit("Gemm", [x], [y], {}, params)
    else:
        b = n.input[1]
        if a.get("transB", 0):
            t = ctx.tmp(b)
            ctx.emit("Transpose", [b], [t], {"perm": [1, 0]}, name=f"{ctx.node_name}/transB")
            b = t
        y = ctx.tmp(n.output[0]) if (alpha != 1.0 or has_c) else n.output[0]
        ctx.emit("MatMul", [x, b], [y], name=f"{ctx.node_name}/matmul")
        if alpha != 1.0:
            s = ctx.new_const(np.asarray(alpha, np.float32), "alpha")
            y2 = ctx.tmp(n.output[0]) if has_c else n.output[0]
            ctx.emit("Mul", [y, s], [y2], name=f"{ctx.node_name}/alpha")
            y = y2
        if not has_c:
            return
    cname = n.input[2]
    if beta != 1.0:
        if cname in ctx.consts:
            cname = ctx.new_const((ctx.consts[cname] * np.float32(beta)).astype(np.float32),
                                  "beta_C")
        else:
            s = ctx.new_const(np.asarray(beta, np.float32), "beta")
            t = ctx.tmp(cname)
            ctx.emit("Mul", [cname, s], [t], name=f"{ctx.node_name}/beta")
            cname = t
    ctx.emit("Add", [y, cname], [n.output[0]], name=f"{ctx.node_name}/bias")


def _export_gemm(w: Any, node: Node) -> None:
    x = w.qdq_input(node, node.inputs[0])
    kname, bname = w.weights(node, w.param(node, "kernel"), 1, 0)
    rank = len(w.graph.tensors[node.inputs[0]].shape)
    y = w.name(f"{node.name}/gemm") if node.attrs.get("epilogue") else node.outputs[0]
    if rank == 2:
        w.add("Gemm", [x, kname] + ([bname] if bname else []), [y], node.name)
    else:
        mm = w.name(f"{node.name}/matmul") if bname else y
        w.add("MatMul", [x, kname], [mm], node.name)
        if bname:
            w.add("Add", [mm, bname], [y], f"{node.name}/bias")
    if node.attrs.get("epilogue"):
        w.epilogue(node, y, node.outputs[0])


# --------------------------------------------------------------------------------------------
# ConvTranspose


def _conv_transpose(node: Node, inputs: Sequence[jax.Array], params: Mapping[str, jax.Array]):
    """ONNX ConvTranspose as a dilated-input convolution.

    ``kernel`` is ONNX's ``[C_in, C_out/groups, *k]``. With ``lhs_dilation = strides`` and the
    spatially flipped kernel, the begin/end padding per spatial axis is
    ``dilation*(k-1) - pad_begin`` and ``dilation*(k-1) - pad_end + output_padding``.
    Activations are in ``data_layout`` (``NCHW`` as imported; ``NHWC`` after
    :func:`npujax.ir.passes.channels_last`).
    """
    a = node.attrs
    (x,) = inputs
    w = params["kernel"]
    g = int(a["groups"])
    c_in, c_out_g, *k = w.shape
    layout = _conv_transpose_layout(node)
    # [g, C_in/g, C_out/g, *k] -> [g, C_out/g, C_in/g, *k] -> [C_out, C_in/g, *k], flipped.
    w = jnp.reshape(w, (g, c_in // g, c_out_g, *k))
    w = jnp.swapaxes(w, 1, 2).reshape((g * c_out_g, c_in // g, *k))
    w = jnp.flip(w, axis=tuple(range(2, w.ndim)))
    pads = [
        (d * (kk - 1) - pb, d * (kk - 1) - pe + op)
        for kk, d, (pb, pe), op in zip(k, a["dilations"], a["pads"], a["output_padding"])
    ]
    spatial = "DHW"[3 - len(k):]
    y = lax.conv_general_dilated(
        x, w, window_strides=(1,) * len(k), padding=pads, lhs_dilation=tuple(a["strides"]),
        rhs_dilation=tuple(a["dilations"]),
        dimension_numbers=(layout, "OI" + spatial, layout), feature_group_count=g,
    )
    if "bias" in params:
        bshape = [1] * len(layout)
        bshape[layout.index("C")] = -1
        y = y + jnp.reshape(params["bias"], bshape)
    return [apply_epilogue(node, y)]


def _conv_transpose_layout(node: Node) -> str:
    """A ConvTranspose's activation layout: its ``data_layout`` (graphs saved before it had
    one are channels-first, ONNX's)."""
    nsp = len(node.attrs["strides"])
    return node.attrs.get("data_layout", "NC" + "DHW"[3 - nsp:])


def _conv_transpose_work(node: Node, ins: Sequence[tuple[int, ...]],
                         outs: Sequence[tuple[int, ...]], align: int) -> ArrayWork:
    """Scatter form: every input pixel times every kernel tap."""
    c_in, cout_g, kh, kw = (int(d) for d in node.attrs["kernel_shape"])
    groups = int(node.attrs["groups"])
    c_axis = _conv_transpose_layout(node).index("C")
    M = math.prod(int(d) for i, d in enumerate(ins[0]) if i != c_axis)  # every input pixel
    K = _pad(c_in // groups, align) if groups == 1 else c_in // groups
    N = (_pad(cout_g, align) if groups == 1 else cout_g) * kh * kw
    macs = M * c_in * cout_g * kh * kw
    return ArrayWork(M, K, N, groups, macs, groups * K * N,
                     groups * N // (kh * kw) if "bias" in node.params else 0)


def _conv_transpose_out_axis(node: Node) -> int:
    if int(node.attrs["groups"]) > 1:
        raise QuantizationError(
            f"node {node.name!r}: a ConvTranspose with groups={node.attrs['groups']} has no "
            "single output-channel axis in its [C_in, C_out/groups, *k] kernel; quantize "
            "per channel through npujax.ops.out_channel_view.")
    return 1  # ONNX ConvTranspose kernel is [C_in, C_out, *k]


def _conv_transpose_view(node: Node, kernel: Any):
    """A grouped kernel ``[C_in, C_out/g, *k]`` keeps output channel ``i*(C_out/g) + j`` in
    rows ``i*C_in/g .. (i+1)*C_in/g - 1`` of column ``j``; its view is ``[C_out, C_in/g, *k]``
    (axis 0), the layout the op runs in."""
    g = int(node.attrs["groups"])
    if g == 1:
        return kernel, 1, lambda v: v
    c_in, c_out_g, *k = kernel.shape
    view = kernel.reshape(g, c_in // g, c_out_g, *k).swapaxes(1, 2).reshape(
        g * c_out_g, c_in // g, *k)

    def back(v: Any) -> Any:
        return v.reshape(g, c_out_g, c_in // g, *k).swapaxes(1, 2).reshape(c_in, c_out_g, *k)

    return view, 0, back


@onnx_importer("ConvTranspose", weights=True)
def _import_conv_transpose(ctx: Any, n: Any, a: Mapping[str, Any]) -> None:
    w = ctx.const(n.input[1], "weight W")
    b = ctx.opt_const(2, "bias B")
    k = list(w.shape[2:])
    nsp = len(k)
    g = int(a.get("group", 1))
    strides = list(a.get("strides", [1] * nsp))
    dil = list(a.get("dilations", [1] * nsp))
    opad = list(a.get("output_padding", [0] * nsp))
    in_sp = ctx.shape(n.input[0])[2:]
    auto = a.get("auto_pad", "NOTSET")
    eff = [(kk - 1) * d + 1 for kk, d in zip(k, dil)]
    if "output_shape" in a or auto in ("SAME_UPPER", "SAME_LOWER"):
        out_sp = list(a["output_shape"])[-nsp:] if "output_shape" in a else \
            [i * s for i, s in zip(in_sp, strides)]
        pads = []
        for j, (i, s, e, op, o) in enumerate(zip(in_sp, strides, eff, opad, out_sp)):
            total = s * (i - 1) + op + e - o
            # A requested output larger than the transposed conv's gets zeros at the end (as
            # onnxruntime's ComputeTransposePadAndOutputShape does).
            opad[j] += max(0, -total)
            total = max(0, total)
            if auto == "SAME_UPPER":
                pads.append([total // 2, total - total // 2])
            else:  # SAME_LOWER, and NOTSET with output_shape (ONNX: extra pad at the beginning)
                pads.append([total - total // 2, total // 2])
    elif auto == "VALID":
        pads = [[0, 0] for _ in range(nsp)]
    else:
        p = list(a.get("pads", [0] * 2 * nsp))
        pads = [[int(p[i]), int(p[i + nsp])] for i in range(nsp)]
    params = {"kernel": w}
    if b is not None:
        params["bias"] = b
    ctx.emit("ConvTranspose", [n.input[0]], [n.output[0]], {
        "strides": strides, "dilations": dil, "pads": pads, "output_padding": opad,
        "groups": g, "kernel_shape": [int(d) for d in w.shape],
        "data_layout": "NC" + "DHW"[3 - nsp:],
    }, params)


def _export_conv_transpose(w: Any, node: Node) -> None:
    """ConvTranspose; quantized as Conv is (input QDQ, int8 kernel + DequantizeLinear, int32
    bias). Per-channel weights of an ungrouped ConvTranspose dequantize along axis 1 of the
    ``[C_in, C_out, *k]`` kernel. DequantizeLinear has one scale per index of one axis, which a
    grouped kernel ``[C_in, C_out/g, *k]`` lacks (see :func:`npujax.ops.out_channel_view`):
    its codes are stored as ``[C_out, C_in/g, *k]``, dequantized along axis 0, and moved back by
    Reshape-Transpose-Reshape (exact; onnxruntime runs ConvTranspose in float either way)."""
    a = node.attrs
    nsp = len(a["strides"])
    layout, channels_first = _conv_transpose_layout(node), "NC" + "DHW"[3 - nsp:]
    x = node.inputs[0]
    if layout != channels_first:  # as Conv's export: ONNX's ConvTranspose is channels-first
        t = w.name(f"{x}/to_nchw")
        w.add("Transpose", [x], [t], f"{node.name}/to_nchw",
              perm=[layout.index(c) for c in channels_first])
        x = t
    x = w.qdq_input(node, x)
    kernel = w.param(node, "kernel")
    lq = w.layer_quant(node)
    per_channel = lq is not None and lq.weight_per_channel and bool(lq.weight_candidates)
    view, axis, _ = out_channel_view(node, kernel) if per_channel else (kernel, 1, None)
    kname, bname = w.weights(node, view, axis, 0)
    if view is not kernel:
        g = int(a["groups"])
        c_in, c_out_g, *k = kernel.shape
        shape1 = w.init(f"{node.name}.kernel_grouped_shape", np.asarray(
            [g, c_out_g, c_in // g, *k], np.int64))
        shape2 = w.init(f"{node.name}.kernel_shape", np.asarray(kernel.shape, np.int64))
        t1, t2, t3 = (w.name(f"{node.name}.kernel_{s}") for s in ("grouped", "swapped", "onnx"))
        w.add("Reshape", [kname, shape1], [t1], f"{node.name}/kernel_group")
        w.add("Transpose", [t1], [t2], f"{node.name}/kernel_swap",
              perm=[0, 2, 1] + list(range(3, 3 + len(k))))
        w.add("Reshape", [t2, shape2], [t3], f"{node.name}/kernel_ungroup")
        kname = t3
    pads = [p[0] for p in a["pads"]] + [p[1] for p in a["pads"]]
    y = w.name(f"{node.name}/convt") if (a.get("epilogue") or layout != channels_first) else \
        node.outputs[0]
    w.add("ConvTranspose", [x, kname] + ([bname] if bname else []), [y], node.name,
          strides=list(a["strides"]), pads=pads, dilations=list(a["dilations"]),
          output_padding=list(a["output_padding"]), group=int(a["groups"]),
          kernel_shape=list(a["kernel_shape"][2:2 + nsp]))
    if layout != channels_first:
        t = w.name(f"{node.name}/to_layout") if a.get("epilogue") else node.outputs[0]
        w.add("Transpose", [y], [t], f"{node.name}/from_nchw",
              perm=[channels_first.index(c) for c in layout])
        y = t
    if a.get("epilogue"):
        w.epilogue(node, y, node.outputs[0])


# --------------------------------------------------------------------------------------------
# MatMul of two activations


def _matmul(node: Node, inputs: Sequence[jax.Array], params: Mapping[str, jax.Array]):
    """numpy ``matmul`` of two activations (ONNX MatMul; weights become ``Gemm`` nodes)."""
    a, b = inputs
    if a.ndim > 2 and b.ndim > 2:
        a, b = align_ranks(a, b)
        if (a.shape[:-2] == b.shape[:-2] and not is_forward_only()
                and jnp.issubdtype(a.dtype, jnp.floating) and a.dtype == b.dtype):
            return [_batched_product(a, b)]
    return [jnp.matmul(a, b)]


@jax.custom_jvp
def _batched_product(a: jax.Array, b: jax.Array) -> jax.Array:
    """``a @ b`` for ``a`` ``[..., M, K]`` and ``b`` ``[..., K, N]`` of the same leading
    (batch) shape (attention's ``q k^T`` and ``p v``), differentiated as usual but for how the
    second operand's cotangent ``a^T g`` is computed: from ``a`` transposed into a copy XLA
    keeps (``optimization_barrier``), so that the product contracts the first operand's last
    axis, the form XLA:CPU hands to YNNPACK. Left to itself, XLA folds the transpose into the
    product, which then contracts the first operand's second-to-last axis and runs as an Eigen
    product: the digits ViT's QAT step spent 0.87 of its 8.4 ms of compiled time in its four
    (``jax.profiler`` trace, 30 steps). A ``custom_jvp``, so forward-mode differentiation (the
    Hessian-vector products of ``npujax.search.sensitivity``) works through it; the values are
    ``a @ b``'s and its derivatives' up to the order of the sums."""
    return jnp.matmul(a, b)


@_batched_product.defjvp
def _batched_product_jvp(primals: tuple[jax.Array, jax.Array],
                         tangents: tuple[jax.Array, jax.Array]) -> tuple[jax.Array, jax.Array]:
    a, b = primals
    da, db = tangents
    at = lax.optimization_barrier(jnp.swapaxes(a, -1, -2))
    return jnp.matmul(a, b), jnp.matmul(da, b) + jnp.matmul(jnp.swapaxes(at, -1, -2), db)


def _matmul_work(node: Node, ins: Sequence[tuple[int, ...]], outs: Sequence[tuple[int, ...]],
                 align: int) -> ArrayWork:
    """Activation x activation (attention's ``Q K^T`` and ``P V``): ``groups`` GEMMs over the
    broadcast batch dimensions; the second operand is the array's stationary operand (read like
    weights). A 2-D second operand is shared by the whole batch: one GEMM with the batch in M.
    Counts are exact Python integers."""
    a, b = tuple(ins[0]), tuple(ins[1])
    a2 = (1,) + a if len(a) == 1 else a
    b2 = b + (1,) if len(b) == 1 else b
    K, N = int(a2[-1]), int(b2[-1])
    if len(b2) == 2:
        groups, M = 1, math.prod(int(d) for d in a2[:-1])
    else:
        batch = np.broadcast_shapes(a2[:-2], b2[:-2])
        groups, M = math.prod(int(d) for d in batch), int(a2[-2])
    return ArrayWork(M, K, N, groups, groups * M * K * N, groups * K * N, 0)


@onnx_importer("MatMul", weights=True)
def _import_matmul(ctx: Any, n: Any, a: Mapping[str, Any]) -> None:
    b = ctx.consts.get(n.input[1])
    if b is not None and b.ndim == 2 and len(ctx.shape(n.input[0])) >= 2:
        ctx.emit("Gemm", [n.input[0]], [n.output[0]], {}, {"kernel": b})
    else:
        ctx.emit("MatMul", [n.input[0], n.input[1]], [n.output[0]])


def _export_matmul(w: Any, node: Node) -> None:
    a, b = node.inputs
    w.add("MatMul", [w.qdq_input(node, a), w.qdq_operand(node, b)], list(node.outputs),
          node.name)


register(
    OpDef(name="Conv", run=_conv, cost="array", export=_export_conv, array_work=_conv_work,
          kernel_out_axis=_conv_axes_out, kernel_in_axis=_conv_axes_in, quantized=True),
    OpDef(name="Gemm", run=_gemm, cost="array", export=_export_gemm, array_work=_gemm_work,
          kernel_out_axis=lambda node: 1, kernel_in_axis=lambda node: 0, quantized=True),
    OpDef(name="ConvTranspose", run=_conv_transpose, cost="array",
          export=_export_conv_transpose, array_work=_conv_transpose_work,
          kernel_out_axis=_conv_transpose_out_axis, kernel_in_axis=lambda node: 0,
          channel_view=_conv_transpose_view),
    OpDef(name="MatMul", run=_matmul, cost="array", export=_export_matmul,
          array_work=_matmul_work, quantized_operands=True),
)

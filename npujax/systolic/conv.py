"""Convolutions as GEMMs: im2col shapes, padding arithmetic and per-group cycle counts.

A 2-D convolution with ``groups`` groups becomes ``groups`` independent GEMMs (per-group mapping),
run one after another on the array, each of shape

    M = batch x out_h x out_w,   K = (C_in / groups) x k_h x k_w,   N = C_out / groups

with ``out = (in + pad_lo + pad_hi - dilation x (k - 1) - 1) // stride + 1`` per spatial axis.
Depthwise convolution is ``groups == C_in`` (N = C_out / C_in, usually 1): every channel is its
own tiny GEMM, which is why depthwise layers use a systolic array poorly. SCALE-Sim models the same
by splitting a depthwise layer into one layer per channel (its ``DP`` topology rows); its conv is
"valid" only, so it is given pre-padded inputs (``in + pad_lo + pad_hi``, no padding).
"""

from __future__ import annotations

from collections.abc import Sequence

import jax

from npujax._exact import count, exact
from npujax.errors import ConfigError, ShapeError
from npujax.systolic.dataflow import Dataflow, gemm_cycles

__all__ = ["normalize_conv_args", "conv_out_size", "im2col_extents", "conv_gemm_shape",
           "conv_cycles"]

Padding = str | int | Sequence[int] | Sequence[tuple[int, int]]


def _pair(v, what: str) -> tuple[int, int]:
    if isinstance(v, int):
        v = (v, v)
    v = tuple(int(x) for x in v)
    if len(v) != 2:
        raise ConfigError(f"{what} must be an int or a pair of ints (h, w); got {v!r}.")
    return v


def normalize_conv_args(
    kernel_hw, stride, padding: Padding, dilation, in_hw=None
) -> tuple[tuple[int, int], tuple[tuple[int, int], ...], tuple[int, int]]:
    """Normalise conv arguments to ``(stride, ((lo, hi), (lo, hi)), dilation)`` of ints.

    ``padding`` is ``"VALID"``, ``"SAME"`` (TensorFlow/ONNX SAME_UPPER: output = ceil(in /
    stride), extra padding at the end; needs ``in_hw``), an int, a pair ``(ph, pw)`` or
    ``((top, bottom), (left, right))``.

    Raises:
      ConfigError: non-positive stride or dilation, negative padding, an unknown padding string.
    """
    stride, dilation = _pair(stride, "stride"), _pair(dilation, "dilation")
    if min(stride) < 1 or min(dilation) < 1:
        raise ConfigError(f"stride {stride} and dilation {dilation} must be >= 1.")
    pads: tuple[tuple[int, int], ...]
    if isinstance(padding, str):
        mode = padding.upper()
        if mode == "VALID":
            pads = ((0, 0), (0, 0))
        elif mode == "SAME":
            if in_hw is None:
                raise ConfigError("padding='SAME' needs the input height and width.")
            same = []
            for n, k, s, d in zip(in_hw, kernel_hw, stride, dilation):
                out = -(-n // s)
                total = max((out - 1) * s + d * (k - 1) + 1 - n, 0)
                same.append((total // 2, total - total // 2))
            pads = tuple(same)
        else:
            raise ConfigError(f"padding {padding!r}: use 'VALID', 'SAME' or explicit integers.")
    elif isinstance(padding, int):
        pads = ((padding, padding), (padding, padding))
    else:
        items = list(padding)
        ints = [p for p in items if isinstance(p, int)]
        if len(items) == 2 and len(ints) == 2:
            pads = ((ints[0], ints[0]), (ints[1], ints[1]))
        else:
            pads = tuple(_pair(p, "padding") for p in items)
            if len(pads) != 2:
                raise ConfigError(f"padding needs two (lo, hi) pairs; got {padding!r}.")
    if min(min(p) for p in pads) < 0:
        raise ConfigError(f"padding {pads} must be >= 0.")
    return stride, pads, dilation


def conv_out_size(n, k, stride, pad_lo, pad_hi, dilation):
    """Output extent of one spatial axis (jnp-friendly): ``(n + lo + hi - d(k-1) - 1)//s + 1``."""
    return (n + pad_lo + pad_hi - dilation * (k - 1) - 1) // stride + 1


def im2col_extents(batch: int, out_pixels: int, kernel_taps: int, c_in_per_group: int,
                   c_out_per_group: int) -> tuple[int, int, int]:
    """``(M, K, N)`` of one group's GEMM after im2col: ``M = batch x output pixels``,
    ``K = C_in/groups x kernel taps`` (``k_h x k_w``), ``N = C_out/groups``.

    The one definition of the conv-to-GEMM mapping, used by :func:`conv_gemm_shape` and by the
    NPU cost model (:mod:`npujax.ops.gemm`, with padded channel counts).
    """
    return batch * out_pixels, c_in_per_group * kernel_taps, c_out_per_group


def conv_gemm_shape(x_shape, w_shape, *, stride=1, padding: Padding = 0, dilation=1, groups=1):
    """The per-group GEMM of an NHWC x HWIO convolution.

    Args:
      x_shape: ``(batch, in_h, in_w, C_in)``.
      w_shape: ``(k_h, k_w, C_in / groups, C_out)``.
      stride: see :func:`normalize_conv_args`.
      padding: see :func:`normalize_conv_args`.
      dilation: see :func:`normalize_conv_args`.
      groups: conv groups (``C_in`` for depthwise).

    Returns:
      dict of Python ints ``M``, ``K``, ``N``, ``groups``, ``out_h``, ``out_w``.

    Raises:
      ShapeError: ranks other than 4, channels not divisible by ``groups``, a weight whose input
        channels are not ``C_in / groups``, or an empty output.
    """
    if len(x_shape) != 4 or len(w_shape) != 4:
        raise ShapeError(
            f"conv needs x as (batch, h, w, C_in) and w as (k_h, k_w, C_in/groups, C_out); got "
            f"x {tuple(x_shape)}, w {tuple(w_shape)}."
        )
    b, h, w, c_in = (int(v) for v in x_shape)
    kh, kw, c_g, c_out = (int(v) for v in w_shape)
    if groups < 1 or c_in % groups or c_out % groups:
        raise ShapeError(
            f"groups={groups} must divide C_in={c_in} and C_out={c_out} (depthwise: groups=C_in)."
        )
    if c_g != c_in // groups:
        raise ShapeError(
            f"weight has {c_g} input channels per group but x has C_in/groups = "
            f"{c_in}/{groups} = {c_in // groups}; give w as (k_h, k_w, C_in/groups, C_out)."
        )
    stride, pads, dilation = normalize_conv_args((kh, kw), stride, padding, dilation, (h, w))
    oh = conv_out_size(h, kh, stride[0], *pads[0], dilation[0])
    ow = conv_out_size(w, kw, stride[1], *pads[1], dilation[1])
    if oh < 1 or ow < 1:
        raise ShapeError(
            f"conv output would be {oh}x{ow}: the (dilated) kernel is larger than the padded input "
            f"{h}x{w}; add padding or use a smaller kernel/dilation."
        )
    M, K, N = im2col_extents(b, oh * ow, kh * kw, c_g, c_out // groups)
    return {"M": M, "K": K, "N": N, "groups": groups, "out_h": oh, "out_w": ow}


@exact
def conv_cycles(M, K, N, groups, rows, cols, dataflow: str | Dataflow) -> dict[str, jax.Array]:
    """:func:`gemm_cycles` of a grouped conv: ``groups`` per-group GEMMs run back to back.

    Counts (folds, cycles, SRAM accesses) are ``groups x`` the per-group figures; efficiency and
    utilization equal the per-group ones. Pure jnp over (traced) ints, like :func:`gemm_cycles`;
    get ``M, K, N, groups`` from :func:`conv_gemm_shape`.
    """
    g = gemm_cycles(M, K, N, rows, cols, dataflow)
    groups = count(groups)
    ratios = ("mapping_efficiency", "utilization", "fold_cycles")
    out = {k: (v if k in ratios else v * groups) for k, v in g.items()}
    out["scalesim_cycles"] = out["compute_cycles"] - groups  # one offset per per-group layer
    return out

"""Bit-exact systolic-array emulation of integer GEMMs and convolutions, fold by fold.

``emulate_gemm`` computes ``a @ b`` the way an R x C array running a given dataflow does: the
reduction dimension K is cut into the folds the dataflow gives it (R-row tiles for weight and
input stationary, all of K at once for output stationary, whose PEs keep the partial sums), each
fold multiplies integer operands and accumulates in int32 inside the PEs, and the per-fold partial
sums are added in int32 in the output buffer, fold after fold. The M and N folds are independent
output tiles. The result equals ``jnp`` integer matmul bit for bit.

The accumulation never wraps silently. Before running, the worst case ``max|a| * max|b| * K``
of the operand dtypes is compared with the accumulator: int8 x int8 fits int32 for K < 2**17;
int16 x int16 does not for K >= 2. ``accumulator="auto"`` (default) accumulates in int32 where
the worst case fits and in int64 otherwise (the output's dtype says which; exact, run under a
scoped ``jax.enable_x64``); ``"int32"`` models a 32-bit accumulator and refuses a GEMM whose
worst case does not fit, naming the bound; ``"int64"`` always widens.

The fold loop is expressed as one batched ``dot_general`` over the K folds (operands stay
int8/int16, ``preferred_element_type=int32``) plus an int32 sum over folds, so XLA runs it as
fast as a plain matmul. Cycle and traffic statistics come from the closed form
:func:`gemm_cycles`; the register-level simulation in :mod:`npujax.systolic.registers`
proves that closed form.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from npujax.errors import ConfigError, QuantizationError, ShapeError
from npujax.systolic.conv import Padding, conv_cycles, conv_gemm_shape, normalize_conv_args
from npujax.systolic.dataflow import Dataflow, gemm_cycles, get_dataflow

__all__ = ["emulate_gemm", "emulate_conv", "check_array_size", "k_fold_size",
           "accumulator_dtype", "ACCUMULATORS"]

_MAX_BITS = 16
#: Accumulator choices of :func:`emulate_gemm` / :func:`emulate_conv`.
ACCUMULATORS = ("auto", "int32", "int64")


def _max_abs(dtype) -> int:
    info = jnp.iinfo(dtype)
    return max(abs(int(info.min)), int(info.max))


def accumulator_dtype(a_dtype, b_dtype, K: int, accumulator: str = "auto") -> str:
    """The accumulator (``"int32"`` or ``"int64"``) for a ``K``-long integer dot product.

    Args:
      a_dtype: the first operand's integer dtype (its range bounds the products).
      b_dtype: the second operand's integer dtype.
      K: the reduction length.
      accumulator: ``"auto"`` (int32 where the worst case fits, else int64), ``"int32"`` (refuse
        if it may not fit) or ``"int64"``.

    Raises:
      ConfigError: an unknown ``accumulator``.
      QuantizationError: ``"int32"`` and ``max|a| * max|b| * K > 2**31 - 1``.
    """
    if accumulator not in ACCUMULATORS:
        raise ConfigError(f"accumulator={accumulator!r}; use one of {', '.join(ACCUMULATORS)}.")
    bound = _max_abs(a_dtype) * _max_abs(b_dtype) * int(K)
    if accumulator == "int64" or (accumulator == "auto" and bound > 2**31 - 1):
        return "int64"
    if bound > 2**31 - 1:
        raise QuantizationError(
            f"{np.dtype(a_dtype).name} x {np.dtype(b_dtype).name} products summed over K={K} "
            f"reach {bound:,} in the worst case, beyond the int32 accumulator's {2**31 - 1:,}; "
            "use accumulator='int64' (or 'auto'), narrower operands or a shorter K.")
    return "int32"


def check_array_size(rows, cols) -> tuple[int, int]:
    """Validate a static array size; returns ``(rows, cols)`` as Python ints.

    Raises:
      ConfigError: a size that is not a positive integer.
    """
    out = []
    for name, v in (("rows", rows), ("cols", cols)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or int(v) < 1:
            raise ConfigError(
                f"array {name}={v!r}: the emulator needs a positive Python int (the PE count "
                f"along that edge), e.g. {name}=16."
            )
        out.append(int(v))
    return out[0], out[1]


def _check_operand(x, what: str) -> jax.Array:
    x = jnp.asarray(x)
    if not jnp.issubdtype(x.dtype, jnp.integer) or jnp.iinfo(x.dtype).bits > _MAX_BITS:
        raise ShapeError(
            f"{what} has dtype {x.dtype}; the array multiplies integers of at most {_MAX_BITS} "
            f"bits (int8, uint8, int16, uint16). Quantize it first (npujax.quant) and pass the "
            f"integer values."
        )
    return x


def _common_dtype(a: jax.Array, b: jax.Array):
    if a.dtype == b.dtype:
        return a, b
    # explicit widening to a signed type that holds both ranges exactly (int8/uint8 -> int16)
    bits = max(jnp.iinfo(a.dtype).bits, jnp.iinfo(b.dtype).bits)
    dt = jnp.int16 if bits <= 8 else jnp.int32
    return a.astype(dt), b.astype(dt)


def k_fold_size(K: int, rows: int, cols: int, dataflow: str | Dataflow) -> int:
    """How many K elements one fold reduces: R, C or all of K, by where the dataflow puts K."""
    df = get_dataflow(dataflow)
    if df.layout[0] == "K":
        return min(rows, K)
    if df.layout[1] == "K":
        return min(cols, K)
    return K


def _folded_matmul(a, b, tk: int, acc: str = "int32"):
    """``a @ b`` accumulated in ``acc`` as a sum over ceil(K / tk) K-folds (a: [M, K],
    b: [K, N])."""
    M, K = a.shape
    N = b.shape[1]
    fk = -(-K // tk)
    pad = fk * tk - K
    if pad:
        a = jnp.pad(a, ((0, 0), (0, pad)))
        b = jnp.pad(b, ((0, pad), (0, 0)))
    a_f = a.reshape(M, fk, tk)
    b_f = b.reshape(fk, tk, N)
    # Batch over folds: partial[f] = a_f[:, f, :] @ b_f[f] with `acc` accumulation in the PEs.
    partial = lax.dot_general(
        a_f, b_f, (((2,), (1,)), ((1,), (0,))), preferred_element_type=jnp.dtype(acc)
    )
    if fk == 1:
        return partial[0]
    return jnp.sum(partial, axis=0, dtype=jnp.dtype(acc))  # partial sums in the output buffer


@functools.partial(jax.jit, static_argnames=("rows", "cols", "dataflow", "acc"))
def _emulate_gemm(a, b, rows: int, cols: int, dataflow: str, acc: str):
    tk = k_fold_size(a.shape[1], rows, cols, dataflow)
    out = _folded_matmul(a, b, tk, acc)
    stats = gemm_cycles(a.shape[0], a.shape[1], b.shape[1], rows, cols, dataflow)
    return out, stats


def emulate_gemm(a, b, rows: int, cols: int, dataflow: str | Dataflow, *,
                 accumulator: str = "auto"):
    """Run ``a @ b`` on a ``rows x cols`` systolic array, bit-exactly, fold by fold.

    Args:
      a: integer ``[M, K]`` (int8/uint8/int16/uint16; the streamed or stationary activations).
      b: integer ``[K, N]`` (weights), same width class as ``a`` (mixed widths are widened).
      rows: array height in PEs (static positive int).
      cols: array width in PEs (static positive int).
      dataflow: ``weight_stationary``/``output_stationary``/``input_stationary`` (or ws/os/is),
        or a :class:`Dataflow`.
      accumulator: ``"auto"``, ``"int32"`` or ``"int64"`` (:func:`accumulator_dtype`).

    Returns:
      ``(out, stats)``: ``out`` ``[M, N]`` equal to the exact integer ``a @ b``, int32 (int64
      where the worst case does not fit int32, see :func:`accumulator_dtype`);
      ``stats`` the dict of :func:`gemm_cycles` (folds, compute_cycles, scalesim_cycles,
      utilization, mapping_efficiency, sram_reads_a, sram_reads_b, sram_writes_out).
      Jitted: new operand values with the same shapes and dtypes reuse the compiled code.

    Raises:
      ShapeError: non-integer or wider-than-16-bit operands, ranks other than 2, mismatched K.
      ConfigError: non-positive array sizes, unknown dataflow or accumulator.
      QuantizationError: ``accumulator="int32"`` and the worst case does not fit int32.

    Examples:
      >>> a = jnp.ones((4, 3), jnp.int8); b = jnp.full((3, 2), 2, jnp.int8)
      >>> out, stats = emulate_gemm(a, b, 2, 2, "ws")
      >>> out.tolist(), int(stats["folds"])
      ([[6, 6], [6, 6], [6, 6], [6, 6]], 2)
    """
    rows, cols = check_array_size(rows, cols)
    df = get_dataflow(dataflow)
    a, b = _check_operand(a, "a"), _check_operand(b, "b")
    if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[0]:
        raise ShapeError(
            f"emulate_gemm needs a [M, K] and b [K, N] with the same K; got a {a.shape}, "
            f"b {b.shape}. Reshape (conv: use emulate_conv) or transpose b."
        )
    if min(a.shape + b.shape) < 1:
        raise ShapeError(f"empty GEMM: a {a.shape}, b {b.shape}; every extent must be >= 1.")
    acc = accumulator_dtype(a.dtype, b.dtype, a.shape[1], accumulator)
    a, b = _common_dtype(a, b)
    with jax.enable_x64(acc == "int64"):
        return _emulate_gemm(a, b, rows=rows, cols=cols, dataflow=df.name, acc=acc)


def _im2col(x, kh: int, kw: int, stride, pads, dilation, oh: int, ow: int):
    """``[B, H, W, C] -> [B, oh, ow, kh, kw, C]`` patches (zero padding)."""
    x = jnp.pad(x, ((0, 0), pads[0], pads[1], (0, 0)))
    sh, sw = stride
    dh, dw = dilation
    taps = [
        x[:, i * dh: i * dh + sh * (oh - 1) + 1: sh, j * dw: j * dw + sw * (ow - 1) + 1: sw, :]
        for i in range(kh) for j in range(kw)
    ]
    p = jnp.stack(taps, axis=3)  # [B, oh, ow, kh*kw, C]
    return p.reshape(x.shape[0], oh, ow, kh, kw, x.shape[3])


@functools.partial(
    jax.jit, static_argnames=("rows", "cols", "dataflow", "stride", "pads", "dilation", "groups",
                              "acc")
)
def _emulate_conv(x, w, rows, cols, dataflow, stride, pads, dilation, groups, acc):
    b = x.shape[0]
    kh, kw, c_g, c_out = w.shape
    shp = conv_gemm_shape(x.shape, w.shape, stride=stride, padding=pads, dilation=dilation,
                          groups=groups)
    oh, ow, n_g = shp["out_h"], shp["out_w"], shp["N"]
    p = _im2col(x, kh, kw, stride, pads, dilation, oh, ow)  # [B, oh, ow, kh, kw, C_in]
    p = p.reshape(b * oh * ow, kh, kw, groups, c_g)
    cols_g = jnp.transpose(p, (3, 0, 1, 2, 4)).reshape(groups, b * oh * ow, kh * kw * c_g)
    w_g = w.reshape(kh, kw, c_g, groups, n_g)
    w_g = jnp.transpose(w_g, (3, 0, 1, 2, 4)).reshape(groups, kh * kw * c_g, n_g)
    tk = k_fold_size(kh * kw * c_g, rows, cols, dataflow)
    out = jax.vmap(lambda a, bb: _folded_matmul(a, bb, tk, acc))(cols_g, w_g)  # [G, M, N/G]
    out = jnp.transpose(out, (1, 0, 2)).reshape(b, oh, ow, c_out)
    stats = conv_cycles(shp["M"], shp["K"], shp["N"], groups, rows, cols, dataflow)
    return out, stats


def emulate_conv(
    x, w, rows: int, cols: int, dataflow: str | Dataflow, *, stride=1, padding: Padding = 0,
    dilation=1, groups: int = 1, accumulator: str = "auto",
):
    """Integer 2-D convolution on the array: im2col, then one folded GEMM per group.

    Args:
      x: integer ``[batch, H, W, C_in]`` (NHWC), at most 16 bits.
      w: integer ``[k_h, k_w, C_in / groups, C_out]`` (HWIO).
      rows: array height in PEs (static positive int).
      cols: array width in PEs (static positive int).
      dataflow: dataflow name or :class:`Dataflow`.
      stride: int or ``(h, w)``.
      dilation: int or ``(h, w)``.
      padding: ``"VALID"``, ``"SAME"``, int, ``(ph, pw)`` or ``((top, bottom), (left, right))``;
        padded with 0 (symmetric quantization; subtract a zero point before calling).
      groups: conv groups; ``groups == C_in`` is depthwise (each channel its own GEMM).
      accumulator: ``"auto"``, ``"int32"`` or ``"int64"`` (:func:`accumulator_dtype`, with
        ``K = k_h * k_w * C_in / groups``).

    Returns:
      ``(out, stats)``: ``[batch, out_h, out_w, C_out]`` equal to the exact integer
      convolution, int32 (int64 where the worst case does not fit int32); ``stats`` from
      :func:`conv_cycles` (totals over the groups).

    Raises:
      ShapeError: non-integer operands, bad ranks or channel counts, an empty output.
      ConfigError: non-positive array size, stride or dilation; bad padding; unknown dataflow
        or accumulator.
      QuantizationError: ``accumulator="int32"`` and the worst case does not fit int32.
    """
    rows, cols = check_array_size(rows, cols)
    df = get_dataflow(dataflow)
    x, w = _check_operand(x, "x"), _check_operand(w, "w")
    conv_gemm_shape(x.shape, w.shape, stride=stride, padding=padding, dilation=dilation,
                    groups=groups)  # validates
    stride, pads, dilation = normalize_conv_args(w.shape[:2], stride, padding, dilation,
                                                 x.shape[1:3])
    acc = accumulator_dtype(x.dtype, w.dtype, w.shape[0] * w.shape[1] * w.shape[2], accumulator)
    x, w = _common_dtype(x, w)
    with jax.enable_x64(acc == "int64"):
        return _emulate_conv(x, w, rows=rows, cols=cols, dataflow=df.name, stride=stride,
                             pads=pads, dilation=dilation, groups=int(groups), acc=acc)

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

The fold loop is a rolled ``fori_loop``: each K-fold is one ``dot_general`` (operands stay
int8/int16, ``preferred_element_type=int32``) added into a single int32 output buffer, so XLA
runs it as fast as a plain int32 matmul and keeps one fold's partial sums at a time. Concrete
GEMM operands run as fixed-shape ``TILE x TILE`` output tiles over K-chunks of whole folds
(zero-padded; ``_tile_step``), so one compilation per array edge and dataflow serves every
GEMM shape; ``shapes="buckets"`` pads to shape buckets instead (:func:`shape_bucket`, one
compilation per bucket, one call per GEMM). Cycle and traffic statistics come from the
closed form :func:`gemm_cycles`; the register-level simulation in :mod:`npujax.systolic.registers`
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
from npujax.systolic.dataflow import Dataflow, gemm_cycles, get_systolic_dataflow

__all__ = ["emulate_gemm", "emulate_conv", "check_array_size", "k_fold_size",
           "accumulator_dtype", "ACCUMULATORS",
           "shape_bucket", "tile_fold_size", "TILE", "SHAPE_MODES"]

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
            f"bits (int8, uint8, int16, uint16). Quantize it first (npujax.numerics) and pass the "
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
    df = get_systolic_dataflow(dataflow)
    if df.layout[0] == "K":
        return min(rows, K)
    if df.layout[1] == "K":
        return min(cols, K)
    return K


def _folded_matmul(a, b, tk: int, acc: str = "int32", folds=None):
    """``a @ b`` accumulated in ``acc``, one K-fold after the other (a: [M, K], b: [K, N]).

    A rolled ``fori_loop`` over the ``ceil(K / tk)`` folds: fold ``f`` multiplies
    ``a[:, f*tk:(f+1)*tk] @ b[f*tk:(f+1)*tk]`` (operands in their own narrow dtype, products
    summed in ``acc`` inside the PEs) and adds that partial sum into one ``[M, N]`` ``acc``
    buffer (the output buffer), so only one fold's partial sums exist at a time (the batched
    form this replaces materialised all ``folds x M x N`` of them: 2.0-2.5x a plain int32 matmul
    at n = 512-1024 on 16x16, against 0.7-0.8x for the loop). ``folds`` (traced int, default
    all) stops the loop after the GEMM's real folds when the operands were zero-padded to a
    bucket."""
    M, K = a.shape
    N = b.shape[1]
    fk = -(-K // tk)
    pad = fk * tk - K
    if pad:
        a = jnp.pad(a, ((0, 0), (0, pad)))
        b = jnp.pad(b, ((0, pad), (0, 0)))
    dt = jnp.dtype(acc)
    if fk == 1:
        return lax.dot(a, b, preferred_element_type=dt)

    def fold(f, out):
        a_f = lax.dynamic_slice_in_dim(a, f * tk, tk, axis=1)
        b_f = lax.dynamic_slice_in_dim(b, f * tk, tk, axis=0)
        return out + lax.dot(a_f, b_f, preferred_element_type=dt)  # partial sums in the buffer

    return lax.fori_loop(0, fk if folds is None else folds, fold, jnp.zeros((M, N), dt))


def shape_bucket(n: int) -> int:
    """The GEMM extent ``n`` rounded up to the next of ``4, 5, 6, 7, 8, 10, 12, 14, 16, 20, ...``
    (``m * 2**e`` with ``m`` in 4..7): at most 25 % padding per extent, and a few compiled
    programs serve every GEMM size (used by :func:`emulate_gemm`)."""
    n = int(n)
    if n <= 4:
        return n
    e = (n - 1).bit_length() - 3  # 2**e * 4 < n <= 2**e * 8
    step = 1 << e
    return -(-n // step) * step


@functools.partial(jax.jit, static_argnames=("rows", "cols", "dataflow", "acc"))
def _emulate_gemm(a, b, k, rows: int, cols: int, dataflow: str, acc: str):
    """``a``, ``b`` zero-padded to a bucket; ``k`` (traced int32) the real K, so only the real
    folds run: padding K costs no multiplies, and one program serves every K of a bucket."""
    tk = k_fold_size(a.shape[1], rows, cols, dataflow)
    return _folded_matmul(a, b, tk, acc, folds=-(-k // tk))


#: Output tile edge (M and N) of the tiled path of :func:`emulate_gemm`.
TILE = 128
#: K-chunk target of the tiled path (whole folds): fewer, longer steps per tile (each step is a
#: dispatch and two operand transfers; at n = 512 on 16x16 a chunk of 128 made 64 steps, 4 per
#: output tile, and 512 makes 16).
K_CHUNK = 512


def tile_fold_size(rows: int, cols: int, dataflow: str | Dataflow) -> int:
    """The K-fold size of the tiled path: the array edge K lies on (rows for weight and input
    stationary, whatever the GEMM's K, padded with zeros), or :data:`TILE` for output
    stationary, whose fold is all of K (its int32 sum is the same cut in chunks: integer
    addition is exact within the accumulator's range, which :func:`accumulator_dtype` checks)."""
    df = get_systolic_dataflow(dataflow)
    if df.layout[0] == "K":
        return rows
    if df.layout[1] == "K":
        return cols
    return TILE


@functools.partial(jax.jit, static_argnames=("tk", "acc"))
def _tile_step(out, a, b, folds, tk: int, acc: str):
    """``out + a @ b`` of one ``[TILE, kc] x [kc, TILE]`` tile pair, fold by fold: the first
    ``folds`` (traced int32) K-folds of ``tk``. Every operand has a fixed shape, so one program
    per (fold size, accumulator, operand dtype) serves every GEMM."""
    dt = jnp.dtype(acc)

    def fold(f, o):
        a_f = lax.dynamic_slice_in_dim(a, f * tk, tk, axis=1)
        b_f = lax.dynamic_slice_in_dim(b, f * tk, tk, axis=0)
        return o + lax.dot(a_f, b_f, preferred_element_type=dt)  # partial sums in the buffer

    return lax.fori_loop(0, folds, fold, out)


def _tiled_gemm(a, b, rows: int, cols: int, df: Dataflow, acc: str) -> jax.Array:
    """``a @ b`` of concrete operands as ``TILE x TILE`` output tiles, each accumulated over
    K-chunks of whole folds by ``_tile_step`` (zero-padded on the host; the padding folds
    of the last chunk are skipped), assembled on the host.

    Each chunk of ``b`` reaches the device once and each chunk of ``a`` once per row of tiles
    (not once per tile), and the tiles come back to the host only after every step has been
    dispatched, so the host prepares the next steps while the device computes."""
    a_np, b_np = np.asarray(a), np.asarray(b)
    (M, K), N = a_np.shape, b_np.shape[1]
    tk = tile_fold_size(rows, cols, df)
    kc = tk * max(1, K_CHUNK // tk)
    Mp, Kp, Np = (-(-M // TILE) * TILE, -(-K // kc) * kc, -(-N // TILE) * TILE)
    a_p = np.zeros((Mp, Kp), a_np.dtype)
    a_p[:M, :K] = a_np
    b_p = np.zeros((Kp, Np), b_np.dtype)
    b_p[:K, :N] = b_np
    chunks = range(0, Kp, kc)
    folds = [jax.device_put(np.int32(-(-min(kc, K - k) // tk) if k < K else 0)) for k in chunks]
    b_dev = [[jax.device_put(b_p[k:k + kc, j:j + TILE]) for j in range(0, Np, TILE)]
             for k in chunks]
    zero = jax.device_put(np.zeros((TILE, TILE), acc))  # a device array, as each tile becomes
    tiles = []
    for i in range(0, Mp, TILE):
        row = [zero] * (Np // TILE)
        for c, k in enumerate(chunks):  # each tile's chunks in order of k, as before
            a_dev = jax.device_put(a_p[i:i + TILE, k:k + kc])
            row = [_tile_step(o, a_dev, b_c, folds[c], tk=tk, acc=acc)
                   for o, b_c in zip(row, b_dev[c])]
        tiles.append(row)
    out = np.block([[np.asarray(o) for o in row] for row in tiles])
    return jax.device_put(out[:M, :N])  # (jnp.asarray of numpy compiles a program per shape)


def _bucket_extents(M: int, K: int, N: int, rows: int, cols: int, df: Dataflow):
    """The padded ``(M', K', N')`` of a GEMM: :func:`shape_bucket` for M and N (padding there
    is multiplied), and K rounded up to a power of two of whole folds (folds of padding are
    skipped, so any K' costs only the copy)."""
    tk = k_fold_size(K, rows, cols, df)
    if tk < K:
        folds = -(-K // tk)
        Kp = tk * (1 << (folds - 1).bit_length())
    else:
        Kp = shape_bucket(K)
    return shape_bucket(M), Kp, shape_bucket(N)


@functools.lru_cache(maxsize=4096)
def _stats(M: int, K: int, N: int, rows: int, cols: int, dataflow: str) -> dict:
    """:func:`gemm_cycles` eagerly from Python ints (no compilation per shape or array size:
    each jnp primitive compiles once per process for scalars; about 2 ms), cached per GEMM so a
    repeated call costs nothing (the arrays are immutable)."""
    return gemm_cycles(M, K, N, rows, cols, dataflow)


def _pad_to_bucket(x, shape):
    """Zero-pad a concrete ``x`` to ``shape`` on the host (an eager jnp pad would compile once
    per shape, which the bucketing exists to avoid)."""
    if tuple(x.shape) == tuple(shape):
        return x
    return jnp.asarray(np.pad(np.asarray(x), [(0, t - s) for s, t in zip(x.shape, shape)]))


#: How :func:`emulate_gemm` compiles concrete operands (its ``shapes`` argument).
SHAPE_MODES = ("tiles", "buckets", "exact")


def emulate_gemm(a, b, rows: int, cols: int, dataflow: str | Dataflow, *,
                 accumulator: str = "auto", bucket: bool = True, shapes: str = "tiles"):
    """Run ``a @ b`` on a ``rows x cols`` systolic array, bit-exactly, fold by fold.

    Args:
      a: integer ``[M, K]`` (int8/uint8/int16/uint16; the streamed or stationary activations).
      b: integer ``[K, N]`` (weights), same width class as ``a`` (mixed widths are widened).
      rows: array height in PEs (static positive int).
      cols: array width in PEs (static positive int).
      dataflow: ``weight_stationary``/``output_stationary``/``input_stationary`` (or ws/os/is),
        or a :class:`Dataflow`.
      accumulator: ``"auto"``, ``"int32"`` or ``"int64"`` (:func:`accumulator_dtype`).
      bucket: False is ``shapes="exact"`` (kept for compatibility).
      shapes: how concrete operands are compiled (static; operands traced by a caller's ``jit``
        are always ``exact``): ``"tiles"`` (default) runs ``TILE x TILE`` output tiles over
        K-chunks of whole folds, zero-padded, through one program per array edge, dataflow,
        accumulator and operand dtype, whatever the GEMM's shape (``_tile_step``: many
        GEMM shapes, one compilation; a host loop over the tiles); ``"buckets"`` zero-pads to
        the :func:`shape_bucket` of M and N and K to a power of two of whole folds (one
        compilation per bucket, one call); ``"exact"`` compiles one program per shape. Padding
        is zeros and skipped folds: the result is the same bit for bit in every mode; the
        statistics run eagerly, uncompiled.

    Returns:
      ``(out, stats)``: ``out`` ``[M, N]`` equal to the exact integer ``a @ b``, int32 (int64
      where the worst case does not fit int32, see :func:`accumulator_dtype`);
      ``stats`` the dict of :func:`gemm_cycles` (folds, compute_cycles, scalesim_cycles,
      utilization, mapping_efficiency, sram_reads_a, sram_reads_b, sram_writes_out).
      Jitted: new operand values with the same shapes and dtypes reuse the compiled code.

    Raises:
      ShapeError: non-integer or wider-than-16-bit operands, ranks other than 2, mismatched K.
      ConfigError: non-positive array sizes, unknown dataflow, accumulator or ``shapes``.
      QuantizationError: ``accumulator="int32"`` and the worst case does not fit int32.

    Examples:
      >>> a = jnp.ones((4, 3), jnp.int8); b = jnp.full((3, 2), 2, jnp.int8)
      >>> out, stats = emulate_gemm(a, b, 2, 2, "ws")
      >>> out.tolist(), int(stats["folds"])
      ([[6, 6], [6, 6], [6, 6], [6, 6]], 2)
    """
    rows, cols = check_array_size(rows, cols)
    df = get_systolic_dataflow(dataflow)
    a, b = _check_operand(a, "a"), _check_operand(b, "b")
    if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[0]:
        raise ShapeError(
            f"emulate_gemm needs a [M, K] and b [K, N] with the same K; got a {a.shape}, "
            f"b {b.shape}. Reshape (conv: use emulate_conv) or transpose b."
        )
    if min(a.shape + b.shape) < 1:
        raise ShapeError(f"empty GEMM: a {a.shape}, b {b.shape}; every extent must be >= 1.")
    if shapes not in SHAPE_MODES:
        raise ConfigError(f"shapes={shapes!r}; use one of {', '.join(SHAPE_MODES)}.")
    acc = accumulator_dtype(a.dtype, b.dtype, a.shape[1], accumulator)
    a, b = _common_dtype(a, b)
    (M, K), N = a.shape, b.shape[1]
    traced = isinstance(a, jax.core.Tracer) or isinstance(b, jax.core.Tracer)
    mode = "exact" if traced or not bucket else shapes
    if mode == "tiles":
        with jax.enable_x64(acc == "int64"):
            out = _tiled_gemm(a, b, rows, cols, df, acc)
        return out, dict(_stats(M, K, N, rows, cols, df.name))
    if mode == "exact":
        Mp, Kp, Np = M, K, N  # under a caller's trace: that trace compiles once anyway
    else:
        Mp, Kp, Np = _bucket_extents(M, K, N, rows, cols, df)
        a, b = _pad_to_bucket(a, (Mp, Kp)), _pad_to_bucket(b, (Kp, Np))
    with jax.enable_x64(acc == "int64"):
        out = _emulate_gemm(a, b, np.int32(K), rows=rows, cols=cols, dataflow=df.name, acc=acc)
        if (Mp, Np) != (M, N):  # (inside the x64 scope: an int64 result stays int64)
            out = jnp.asarray(np.asarray(out)[:M, :N])
    stats = dict(_stats(M, K, N, rows, cols, df.name))  # a copy: the cached one stays intact
    return out, stats


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
    df = get_systolic_dataflow(dataflow)
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

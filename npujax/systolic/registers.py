"""Register-level systolic-array simulation: a ``lax.scan`` over clock cycles, for small arrays.

Each fold is simulated cycle by cycle on the R x C PE grid. Nothing in here uses the closed-form
cycle count: a fold ends when its last result leaves the array, and the measured lengths are what
tests compare with :func:`npujax.systolic.gemm_cycles` (and the values with ``jnp.matmul``).

Two register structures cover the three dataflows (the dataflow chooses which GEMM operand plays
which role, through its :attr:`~npujax.systolic.Dataflow.layout`):

* *stationary* (weight and input stationary). Cycle by cycle the stationary tile is shifted into
  the grid from the top, one row per cycle, until every row holds its value. Then the streamed
  operand enters at the left edge, row ``r`` delayed by ``r`` cycles (the skew), and moves one PE to
  the right per cycle; partial sums move one PE down per cycle, each PE adding its product. A
  result leaves the bottom edge in the cycle its last product is added. Every value carries a tag
  (its stream index) and a valid bit, and a partial sum only continues when the tags meet, so a
  wrong skew loses results instead of passing silently.
* *output stationary*: operand ``a`` enters at the left (row ``r`` skewed by ``r``) and ``b`` at the
  top (column ``c`` skewed by ``c``); each PE multiplies what meets in it and keeps the sum. A
  result leaves in the cycle its PE adds its T-th product.

Partly filled folds run on zero-padded tiles: the array's schedule does not depend on how many
PEs hold real work (as in SCALE-Sim, whose demand matrices pad idle PEs with null requests), so
padded positions are timed like real ones and the fold ends when the whole wavefront has drained.
Folds run back to back; K folds add their partial sums in the output buffer.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from npujax.errors import ShapeError
from npujax.systolic.dataflow import Dataflow, get_systolic_dataflow
from npujax.systolic.emulator import _check_operand, check_array_size

__all__ = ["simulate_gemm"]


def _stationary_fold(stat, stream, n_valid, n_cycles: int):
    """One stationary fold. stat: [R, C]; stream: [T, R], of which the first ``n_valid`` rows
    are real (the rest is padding that never enters the array). Returns (out [T, C], exit
    [T, C])."""
    R, C = stat.shape
    T = stream.shape[0]
    rows = jnp.arange(R)

    def step(carry, t):
        w, loaded, tau, h, ht, hv, v, vt, vv, out, ext = carry
        filling = loaded < R
        # fill: shift the stationary tile down one row; the bottom row enters first
        new_row = stat[jnp.clip(R - 1 - loaded, 0, R - 1)]
        w = jnp.where(filling, jnp.concatenate([new_row[None], w[:-1]], 0), w)
        streaming = jnp.logical_not(filling)
        idx = tau - rows  # skew: row r sees stream element tau - r
        ok = streaming & (idx >= 0) & (idx < n_valid)
        left = jnp.where(ok, stream[jnp.clip(idx, 0, T - 1), rows], 0)
        h = jnp.concatenate([left[:, None], h[:, :-1]], 1)
        ht = jnp.concatenate([idx[:, None], ht[:, :-1]], 1)
        hv = jnp.concatenate([ok[:, None], hv[:, :-1]], 1)
        prod = h * w
        above_v = jnp.concatenate([hv[:1], vv[:-1]], 0)
        above_t = jnp.concatenate([ht[:1], vt[:-1]], 0)
        above = jnp.concatenate([jnp.zeros_like(v[:1]), v[:-1]], 0)
        vv = above_v & hv & (above_t == ht)
        v = above + prod
        vt = ht
        leaving, m = vv[-1], vt[-1]
        slot = jnp.where(leaving, m, T)  # T: out of range, dropped
        out = out.at[slot, jnp.arange(C)].set(v[-1], mode="drop")
        ext = ext.at[slot, jnp.arange(C)].set(t, mode="drop")
        carry = (w, loaded + filling.astype(jnp.int32), tau + streaming.astype(jnp.int32),
                 h, ht, hv, v, vt, vv, out, ext)
        return carry, None

    zi = jnp.zeros((R, C), jnp.int32)
    zb = jnp.zeros((R, C), bool)
    init = (zi, jnp.int32(0), jnp.int32(0), zi, zi, zb, zi, zi, zb,
            jnp.zeros((T, C), jnp.int32), jnp.full((T, C), -1, jnp.int32))
    carry, _ = lax.scan(step, init, jnp.arange(n_cycles, dtype=jnp.int32))
    return carry[-2], carry[-1]


def _output_stationary_fold(left, top, n_valid, n_cycles: int):
    """One OS fold. left: [R, T] (rows of a), top: [T, C], of which the first ``n_valid`` steps
    are real. Returns (out [R, C], exit [R, C])."""
    R, T = left.shape
    C = top.shape[1]
    rows, cols = jnp.arange(R), jnp.arange(C)

    def step(carry, t):
        a, at, av, b, bt, bv, acc, cnt, ext = carry
        ia, ib = t - rows, t - cols
        oka, okb = (ia >= 0) & (ia < n_valid), (ib >= 0) & (ib < n_valid)
        a = jnp.concatenate([jnp.where(oka, left[rows, jnp.clip(ia, 0, T - 1)], 0)[:, None],
                             a[:, :-1]], 1)
        at = jnp.concatenate([ia[:, None], at[:, :-1]], 1)
        av = jnp.concatenate([oka[:, None], av[:, :-1]], 1)
        b = jnp.concatenate([jnp.where(okb, top[jnp.clip(ib, 0, T - 1), cols], 0)[None],
                             b[:-1]], 0)
        bt = jnp.concatenate([ib[None], bt[:-1]], 0)
        bv = jnp.concatenate([okb[None], bv[:-1]], 0)
        mac = av & bv & (at == bt)  # the k-th elements of a row and a column meet
        acc = acc + jnp.where(mac, a * b, 0)
        cnt = cnt + mac.astype(jnp.int32)
        ext = jnp.where(mac & (cnt == n_valid), t, ext)
        return (a, at, av, b, bt, bv, acc, cnt, ext), None

    zi = jnp.zeros((R, C), jnp.int32)
    zb = jnp.zeros((R, C), bool)
    init = (zi, zi, zb, zi, zi, zb, zi, zi, jnp.full((R, C), -1, jnp.int32))
    carry, _ = lax.scan(step, init, jnp.arange(n_cycles, dtype=jnp.int32))
    return carry[-3], carry[-1]


def _tiles(x, r: int, c: int):
    """[P, Q] -> [P/r, Q/c, r, c] after zero padding to multiples (fold tiles)."""
    P, Q = x.shape
    fp, fq = -(-P // r), -(-Q // c)
    x = jnp.pad(x, ((0, fp * r - P), (0, fq * c - Q)))
    return x.reshape(fp, r, fq, c).transpose(0, 2, 1, 3)


@functools.partial(jax.jit, static_argnames=("rows", "cols", "dataflow"))
def _simulate(a, b, extents, rows: int, cols: int, dataflow: str):
    """Simulate every fold of the zero-padded ``a [M', K']``, ``b [K', N']`` whose real extents
    are the dynamic ``extents = (M, K, N)``: the streamed operand's padding never enters the
    array, and folds made only of padding are computed but dropped by the caller, so one
    compilation serves every shape up to the padded one."""
    df = get_systolic_dataflow(dataflow)
    a, b = a.astype(jnp.int32), b.astype(jnp.int32)
    M, K, N = extents[0], extents[1], extents[2]
    if df.layout == ("M", "N", "K"):  # output stationary: a rows on R, b columns on C
        Kp = a.shape[1]
        at_ = _tiles(a, rows, Kp)[:, 0]         # [FM, R, K']
        bt_ = _tiles(b, Kp, cols)[0]            # [FN, K', C]
        n_cycles = 2 * (rows + cols + Kp) + 4   # generous bound; the measurement decides
        fold = jax.vmap(jax.vmap(lambda lt, tp: _output_stationary_fold(lt, tp, K, n_cycles),
                                 (None, 0)), (0, None))
        out, ext = fold(at_, bt_)               # [FM, FN, R, C]
        fm, fn = out.shape[:2]
        out = out.transpose(0, 2, 1, 3).reshape(fm * rows, fn * cols)
    else:
        # weight stationary: stationary b [K, N], stream a [M, K];
        # input stationary: stationary a^T [K, M], stream b^T [N, K] (output transposed).
        stat, stream, n_valid = (b, a, M) if df.layout[1] == "N" else (a.T, b.T, N)
        T = stream.shape[0]
        st = _tiles(stat, rows, cols)           # [FK, FX, R, C]
        sq = _tiles(stream, T, rows)[0]         # [FK, T, R]
        n_cycles = 2 * (2 * rows + cols + T) + 4
        fold = jax.vmap(jax.vmap(lambda s, q: _stationary_fold(s, q, n_valid, n_cycles),
                                 (0, None)), (0, 0))
        out, ext = fold(st, sq)                 # [FK, FX, T, C]
        out = jnp.sum(out, axis=0)              # K folds: partial sums added in the buffer
        fx = out.shape[0]
        out = out.transpose(1, 0, 2).reshape(T, fx * cols)
        if df.layout[1] != "N":
            out = out.T
    return out, ext


def simulate_gemm(a, b, rows: int, cols: int, dataflow: str | Dataflow, *,
                  pad_to: tuple[int, int, int] | None = None):
    """Cycle-by-cycle register simulation of ``a @ b`` on a small ``rows x cols`` array.

    Args:
      a: integer ``[M, K]`` (at most 16 bits).
      b: integer ``[K, N]`` (at most 16 bits).
      rows: array height in PEs (static positive int; meant for small arrays, <= 16).
      cols: array width in PEs (static positive int, <= 16).
      dataflow: dataflow name or :class:`Dataflow`.
      pad_to: optional ``(M', K', N')`` >= ``(M, K, N)``: the operands are zero-padded to these
        extents inside the simulation, with the padding masked out (it is never streamed, and
        folds of padding only are dropped), so the results are those of the unpadded GEMM while
        one compilation (about 1 s of CPU) serves every GEMM up to that size on this array.

    Returns:
      dict: ``out`` int32 ``[M, N]``; ``fold_cycles`` int32 ``[folds]``, the measured length of
      each fold (cycle 0 = its first operand request, to the cycle its last result leaves,
      inclusive); ``compute_cycles`` their sum; ``complete`` whether every output slot of every
      fold left the array within the simulated window; ``exit_cycles`` int32 ``[folds, slots]``,
      the cycle (within its fold) at which each output slot left the array (padded slots of
      partly filled folds included; -1 if it never did).

    Raises:
      ShapeError: ``a``/``b`` are not ``[M, K]``/``[K, N]`` integers, or ``pad_to`` is smaller
        than the GEMM.
      ConfigError: as :func:`npujax.systolic.emulate_gemm`.
    """
    rows, cols = check_array_size(rows, cols)
    df = get_systolic_dataflow(dataflow)
    a, b = _check_operand(a, "a"), _check_operand(b, "b")
    if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[0]:
        raise ShapeError(
            f"simulate_gemm needs a [M, K] and b [K, N]; got a {a.shape}, b {b.shape}."
        )
    M, K = a.shape
    N = b.shape[1]
    Mp, Kp, Np = (M, K, N) if pad_to is None else (int(v) for v in pad_to)
    if Mp < M or Kp < K or Np < N:
        raise ShapeError(f"simulate_gemm: pad_to={tuple(pad_to or ())} is smaller than the GEMM "
                         f"(M, K, N) = {(M, K, N)}; pass extents at least as large.")
    # padding and the selection of real folds on the host (numpy): eager jnp ops would compile
    # once per shape, which is what pad_to exists to avoid
    a = np.pad(np.asarray(a), ((0, Mp - M), (0, Kp - K)))
    b = np.pad(np.asarray(b), ((0, Kp - K), (0, Np - N)))
    out, ext = _simulate(a, b, np.asarray([M, K, N], np.int32), rows=rows, cols=cols,
                         dataflow=df.name)
    out, ext = np.asarray(out)[:M, :N], np.asarray(ext)
    # keep the real folds (and, for the stationary dataflows, the real stream slots)
    if df.layout == ("M", "N", "K"):
        ext = ext[: -(-M // rows), : -(-N // cols)]
    else:
        n_stat, n_stream = (N, M) if df.layout[1] == "N" else (M, N)
        ext = ext[: -(-K // rows), : -(-n_stat // cols), :n_stream]
    ext = ext.reshape(-1, ext.shape[-2] * ext.shape[-1])  # [folds, output slots]
    fold_len = ext.max(axis=1) + 1
    # device_put, not jnp.asarray: jnp.asarray of a numpy array compiles a program per shape
    return jax.device_put({"out": out, "fold_cycles": fold_len,
                           "compute_cycles": np.asarray(fold_len.sum(), np.int32),
                           "complete": np.asarray(bool((ext >= 0).all())), "exit_cycles": ext})

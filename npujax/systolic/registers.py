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
from jax import lax

from npujax.errors import ShapeError
from npujax.systolic.dataflow import Dataflow, get_dataflow
from npujax.systolic.emulator import _check_operand, check_array_size

__all__ = ["simulate_gemm"]


def _stationary_fold(stat, stream, n_cycles: int):
    """One stationary fold. stat: [R, C]; stream: [T, R]. Returns (out [T, C], exit [T, C])."""
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
        ok = streaming & (idx >= 0) & (idx < T)
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


def _output_stationary_fold(left, top, n_cycles: int):
    """One OS fold. left: [R, T] (rows of a), top: [T, C]. Returns (out [R, C], exit [R, C])."""
    R, T = left.shape
    C = top.shape[1]
    rows, cols = jnp.arange(R), jnp.arange(C)

    def step(carry, t):
        a, at, av, b, bt, bv, acc, cnt, ext = carry
        ia, ib = t - rows, t - cols
        oka, okb = (ia >= 0) & (ia < T), (ib >= 0) & (ib < T)
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
        ext = jnp.where(mac & (cnt == T), t, ext)
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
def _simulate(a, b, rows: int, cols: int, dataflow: str):
    df = get_dataflow(dataflow)
    a, b = a.astype(jnp.int32), b.astype(jnp.int32)
    M, K = a.shape
    N = b.shape[1]
    if df.layout == ("M", "N", "K"):  # output stationary: a rows on R, b columns on C
        at_ = _tiles(a, rows, K)[:, 0]          # [FM, R, K]
        bt_ = _tiles(b, K, cols)[0]             # [FN, K, C]
        fm, fn = at_.shape[0], bt_.shape[0]
        n_cycles = 2 * (rows + cols + K) + 4    # generous bound; the measurement decides
        fold = jax.vmap(jax.vmap(lambda lt, tp: _output_stationary_fold(lt, tp, n_cycles),
                                 (None, 0)), (0, None))
        out, ext = fold(at_, bt_)               # [FM, FN, R, C]
        out = out.transpose(0, 2, 1, 3).reshape(fm * rows, fn * cols)[:M, :N]
    else:
        # weight stationary: stationary b [K, N], stream a [M, K];
        # input stationary: stationary a^T [K, M], stream b^T [N, K] (output transposed).
        stat, stream = (b, a) if df.layout[1] == "N" else (a.T, b.T)
        T = stream.shape[0]
        st = _tiles(stat, rows, cols)           # [FK, FX, R, C]
        sq = _tiles(stream, T, rows)[0]         # [FK, T, R]
        n_cycles = 2 * (2 * rows + cols + T) + 4
        fold = jax.vmap(jax.vmap(lambda s, q: _stationary_fold(s, q, n_cycles), (0, None)),
                        (0, 0))
        out, ext = fold(st, sq)                 # [FK, FX, T, C]
        out = jnp.sum(out, axis=0)              # K folds: partial sums added in the buffer
        fx = out.shape[0]
        out = out.transpose(1, 0, 2).reshape(T, fx * cols)[:, : stat.shape[1]]
        if df.layout[1] != "N":
            out = out.T
    ext = ext.reshape(-1, ext.shape[-2] * ext.shape[-1])  # [folds, output slots]
    fold_len = jnp.max(ext, axis=1) + 1
    complete = jnp.all(ext >= 0)
    return out, fold_len, complete, ext


def simulate_gemm(a, b, rows: int, cols: int, dataflow: str | Dataflow):
    """Cycle-by-cycle register simulation of ``a @ b`` on a small ``rows x cols`` array.

    Args:
      a: integer ``[M, K]`` (at most 16 bits).
      b: integer ``[K, N]`` (at most 16 bits).
      rows: array height in PEs (static positive int; meant for small arrays, <= 16).
      cols: array width in PEs (static positive int, <= 16).
      dataflow: dataflow name or :class:`Dataflow`.

    Returns:
      dict: ``out`` int32 ``[M, N]``; ``fold_cycles`` int32 ``[folds]``, the measured length of
      each fold (cycle 0 = its first operand request, to the cycle its last result leaves,
      inclusive); ``compute_cycles`` their sum; ``complete`` whether every output slot of every
      fold left the array within the simulated window; ``exit_cycles`` int32 ``[folds, slots]``,
      the cycle (within its fold) at which each output slot left the array (padded slots of
      partly filled folds included; -1 if it never did).

    Raises:
      ShapeError, ConfigError: as :func:`npujax.systolic.emulate_gemm`.
    """
    rows, cols = check_array_size(rows, cols)
    df = get_dataflow(dataflow)
    a, b = _check_operand(a, "a"), _check_operand(b, "b")
    if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[0]:
        raise ShapeError(
            f"simulate_gemm needs a [M, K] and b [K, N]; got a {a.shape}, b {b.shape}."
        )
    out, fold_len, complete, ext = _simulate(a, b, rows=rows, cols=cols, dataflow=df.name)
    return {"out": out, "fold_cycles": fold_len, "compute_cycles": jnp.sum(fold_len),
            "complete": complete, "exit_cycles": ext}


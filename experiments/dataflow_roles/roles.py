"""Feasibility prototype (issue 30): the three systolic GEMM dataflows as ONE set of formulas
whose operand roles are data.

weight, output and input stationary differ only in which GEMM dimension (M, K, N) lies on the
array rows, the array columns and in time (``Dataflow.layout``) and in the fill (0 for output
stationary, R otherwise). Every Python branch on the layout in ``npujax.systolic.dataflow``
and ``npujax.systolic.memory`` is a choice between values that are computed by the same
operations, so each becomes an exact ``jnp.where`` on a traced dataflow index (0 WS, 1 OS,
2 IS): the chosen values keep their bits.

Not wired into the cost program: ``check.py`` compares these with the static per-dataflow
functions bit for bit and times their compilation (three static copies against one vmapped
body).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from npujax import _relax
from npujax._exact import exact, real
from npujax.systolic.dataflow import DATAFLOWS, SCALESIM_CYCLE_OFFSET, get_dataflow
from npujax.systolic.memory import PSUM_BYTES

_DIM = {"M": 0, "K": 1, "N": 2}
#: [dataflow index, (rows, cols, time)] -> GEMM dimension index, in DATAFLOWS order.
LAYOUTS = np.asarray([[_DIM[d] for d in get_dataflow(n).layout] for n in DATAFLOWS], np.int32)
_OS = DATAFLOWS.index("output_stationary")


class Roles:
    """The dataflow as data: a traced int32 index into :data:`npujax.systolic.DATAFLOWS`."""

    def __init__(self, index):
        self.index = jnp.asarray(index, jnp.int32)
        lay = jnp.asarray(LAYOUTS)[self.index]
        self._lay = (lay[..., 0], lay[..., 1], lay[..., 2])

    def on(self, axis: int, dim: str):
        """bool: GEMM dimension ``dim`` lies on ``axis`` (0 rows, 1 cols, 2 time)."""
        return self._lay[axis] == _DIM[dim]

    def pick(self, axis: int, ext: dict):
        """The extent on ``axis``: one of ``ext['M'|'K'|'N']`` (exact select)."""
        return jnp.where(self.on(axis, "M"), ext["M"],
                         jnp.where(self.on(axis, "K"), ext["K"], ext["N"]))

    def fill_cycles(self, rows, cols):
        del cols
        return jnp.where(self.index == _OS, jnp.zeros_like(rows), rows)

    def drain_cycles(self, rows, cols):
        return rows + cols - 2

    def dim_folds(self, dim, extent, rows, cols, *, bound=None):
        return jnp.where(self.on(0, dim), _relax.ceil_div(extent, rows, bound=bound),
                         jnp.where(self.on(1, dim), _relax.ceil_div(extent, cols, bound=bound),
                                   jnp.ones_like(extent)))


@exact
def gemm_cycles(M, K, N, rows, cols, roles: Roles, *, bound=None):
    """:func:`npujax.systolic.gemm_cycles` with the dataflow as data."""
    M, K, N, rows, cols = (_relax.count(v) for v in (M, K, N, rows, cols))
    ext = {"M": M, "K": K, "N": N}
    s_r, s_c, t = (roles.pick(i, ext) for i in range(3))
    folds = (_relax.ceil_div(s_r, rows, bound=bound) * _relax.ceil_div(s_c, cols, bound=bound))
    per_fold = roles.fill_cycles(rows, cols) + t + roles.drain_cycles(rows, cols)
    cycles = folds * per_fold
    pes = real(rows * cols)
    mapping = real(s_r * s_c) / (real(folds) * pes)
    macs = real(M) * real(K) * real(N)
    util = macs / (real(cycles) * pes)
    return {
        "folds": folds,
        "fold_cycles": per_fold + jnp.zeros_like(folds),
        "compute_cycles": cycles,
        "scalesim_cycles": cycles - SCALESIM_CYCLE_OFFSET,
        "mapping_efficiency": mapping,
        "utilization": util,
        "sram_reads_a": M * K * roles.dim_folds("N", N, rows, cols, bound=bound),
        "sram_reads_b": K * N * roles.dim_folds("M", M, rows, cols, bound=bound),
        "sram_writes_out": M * N * roles.dim_folds("K", K, rows, cols, bound=bound),
    }


@exact
def gemm_memory(M, K, N, rows, cols, roles: Roles, *, sram_bytes_a, sram_bytes_b, sram_bytes_out,
                elem_bytes_a=1, elem_bytes_b=1, elem_bytes_out=1, dram_bytes_per_cycle,
                unique_elems_a=None, bound=None):
    """:func:`npujax.systolic.gemm_memory` with the dataflow as data."""
    g = gemm_cycles(M, K, N, rows, cols, roles, bound=bound)
    ext = {"M": real(M), "K": real(K), "N": real(N)}
    r, c = real(rows), real(cols)
    count = _relax.count
    folds = {d: real(roles.dim_folds(d, count(v), count(rows), count(cols), bound=bound))
             for d, v in (("M", M), ("K", K), ("N", N))}
    inner, outer, time = 0, 1, 2
    # the static function's names: inner = the rows' dimension, outer = the columns'
    f_outer = roles.pick(outer, folds)

    def tile(d):
        return jnp.where(roles.on(inner, d), jnp.minimum(ext[d], r),
                         jnp.where(roles.on(outer, d), jnp.minimum(ext[d], c), ext[d]))

    def reused_elems(dims, other):
        size = ext[dims[0]] * ext[dims[1]]
        outer_in = roles.on(outer, dims[0]) | roles.on(outer, dims[1])
        o_inner, o_outer = roles.on(inner, other), roles.on(outer, other)
        return jnp.where(o_inner & outer_in, size / f_outer,
                         jnp.where(o_inner | o_outer, size, jnp.zeros_like(size)))

    def operand(dims, other, sram, eb, unique):
        size = ext[dims[0]] * ext[dims[1]]
        dedup = jnp.minimum(unique / size, 1.0)
        need = reused_elems(dims, other) * dedup * real(eb)
        resident = need <= real(sram) / 2
        refetch = _relax.select_step(resident, need, real(sram) / 2, jnp.ones_like(need),
                                     folds[other])
        reads = jnp.minimum(unique, size) * real(eb) * refetch
        return reads, resident

    uniq_a = ext["M"] * ext["K"] if unique_elems_a is None else real(unique_elems_a)
    rd_a, res_a = operand(("M", "K"), "N", sram_bytes_a, elem_bytes_a, uniq_a)
    rd_b, res_b = operand(("K", "N"), "M", sram_bytes_b, elem_bytes_b, ext["K"] * ext["N"])
    out_elems = ext["M"] * ext["N"]
    psums = reused_elems(("M", "N"), "K") * PSUM_BYTES
    res_out = psums <= real(sram_bytes_out) / 2
    spills = _relax.select_step(res_out, psums, real(sram_bytes_out) / 2, jnp.zeros_like(psums),
                                folds["K"] - 1.0)
    wr_out = out_elems * (real(elem_bytes_out) + spills * PSUM_BYTES)
    rd_out = out_elems * spills * PSUM_BYTES
    dram = rd_a + rd_b + wr_out + rd_out
    bw = real(dram_bytes_per_cycle)

    def first_bytes(dims, eb):
        # the static branches' own expressions, selected: the tile of the dimension not in
        # time alone (the static ``x * 1.0``, which XLA drops) or both tiles' product
        t0, t1 = roles.on(time, dims[0]), roles.on(time, dims[1])
        one_ = jnp.where(t0, tile(dims[1]), tile(dims[0])) * real(eb)
        two = tile(dims[0]) * tile(dims[1]) * real(eb)
        return jnp.where(t0 | t1, one_, two)

    dedup_a = jnp.minimum(uniq_a / (ext["M"] * ext["K"]), 1.0)
    prologue = (first_bytes(("M", "K"), elem_bytes_a) * dedup_a
                + first_bytes(("K", "N"), elem_bytes_b)) / bw
    epilogue = first_bytes(("M", "N"), elem_bytes_out) / bw
    memory = dram / bw
    steady = jnp.maximum(memory - prologue - epilogue, 0.0)
    compute = real(g["compute_cycles"])
    stall = prologue + epilogue + jnp.maximum(steady - compute, 0.0)
    return {
        "dram_read_bytes_a": rd_a, "dram_read_bytes_b": rd_b, "dram_write_bytes_out": wr_out,
        "dram_read_bytes_out": rd_out, "dram_bytes": dram, "memory_cycles": memory,
        "prologue_cycles": prologue, "epilogue_cycles": epilogue, "stall_cycles": stall,
        "total_cycles": compute + stall, "compute_cycles": g["compute_cycles"],
        "resident_a": res_a, "resident_b": res_b, "resident_out": res_out,
    }


def _floor(x):
    from npujax.systolic.mapping import _floor as floor
    return floor(x)


def _spatial(roles: Roles, dims, d):
    """``d[spatial]`` for the static ``spatial = dims[0] if dims[1] == t_dim else dims[1]``."""
    return jnp.where(roles.on(2, dims[1]), d[dims[0]], d[dims[1]])


def _candidate(roles: Roles, inner: int, chunk, ext, folds, *, half, eb, dedup_a, uniq_a):
    """``npujax.systolic.mapping._candidate`` with the dataflow as data (``inner``: the array
    axis, 0 rows or 1 columns, whose fold loop is inner)."""
    T = roles.pick(2, ext)
    n_chunks = _relax.ceil(T / chunk)

    def need_elems(dims, other):
        sp_e, sp_f = _spatial(roles, dims, ext), _spatial(roles, dims, folds)
        return jnp.where(roles.on(2, other), ext[dims[0]] * ext[dims[1]],
                         jnp.where(roles.on(inner, other), chunk * sp_e / sp_f, chunk * sp_e))

    def operand(dims, other, cap, e, unique, dedup):
        size = ext[dims[0]] * ext[dims[1]]
        need = need_elems(dims, other) * dedup * e
        fits = need <= cap
        fits = fits | (roles.on(2, other) & (n_chunks <= 1.0))
        times = jnp.where(roles.on(2, other), n_chunks, folds[other])
        refetch = _relax.select_step(fits, need, cap, jnp.ones_like(need), times)
        return jnp.minimum(unique, size) * e * refetch, fits

    rd_a, res_a = operand(("M", "K"), "N", half["a"], eb["a"], uniq_a, dedup_a)
    rd_b, res_b = operand(("K", "N"), "M", half["b"], eb["b"], ext["K"] * ext["N"], 1.0)
    psums = jnp.where(roles.on(2, "K"), jnp.zeros_like(rd_a),
                      need_elems(("M", "N"), "K") * PSUM_BYTES)
    res_out = psums <= half["out"]
    spills = _relax.select_step(res_out, psums, half["out"], jnp.zeros_like(psums),
                                folds["K"] - 1.0)
    out_elems = ext["M"] * ext["N"]
    wr_out = out_elems * (eb["out"] + spills * PSUM_BYTES)
    rd_out = out_elems * spills * PSUM_BYTES
    return (rd_a, rd_b, wr_out, rd_out), (res_a, res_b, res_out), n_chunks


def _per_row_needs(roles: Roles, inner: int, ext, folds, eb, dedup_a):
    """``npujax.systolic.mapping._per_row_needs`` with the dataflow as data: ``(streamed
    operand's bytes per row, its half buffer, the partial sums' bytes per row)``; meaningless
    for output stationary (no chunks: its candidates are masked)."""
    def per_row(dims, other, e):
        sp_e, sp_f = _spatial(roles, dims, ext), _spatial(roles, dims, folds)
        return jnp.where(roles.on(inner, other), sp_e / sp_f, sp_e) * e

    t_m = roles.on(2, "M")
    streamed = jnp.where(t_m, per_row(("M", "K"), "N", eb["a"] * dedup_a),
                         per_row(("K", "N"), "M", eb["b"]))
    return streamed, t_m, per_row(("M", "N"), "K", real(PSUM_BYTES))


def _search(roles: Roles, ext, folds, half, eb, dedup_a, uniq_a, T, min_chunk, compute,
            all_folds, fd, bw, batch):
    """``npujax.systolic.mapping._search`` with the dataflow as data: the eight candidates of
    weight and input stationary, of which output stationary (no chunks of the reduction) keeps
    the two ``chunk = T`` ones (the others' bytes and cycles set to inf: never chosen, and the
    first best is the static search's)."""
    import functools

    chunks_ok = ~roles.on(2, "K")
    cands = []
    for inner in (0, 1):
        streamed, t_m, out = _per_row_needs(roles, inner, ext, folds, eb, dedup_a)
        half_s = jnp.where(t_m, half["a"], half["b"])
        breaks = [_floor(jnp.where(v > 0, h / jnp.where(v > 0, v, 1.0), jnp.inf))
                  for v, h in ((streamed, half_s), (out, half["out"]))]
        chunks = [(T, None)] + [(b, chunks_ok) for b in breaks]
        chunks.append((jnp.minimum(breaks[0], breaks[1]), chunks_ok))
        for chunk, valid in chunks:
            t = jnp.clip(chunk, min_chunk, T)
            by, res, n = _candidate(roles, inner, t, ext, folds, half=half, eb=eb,
                                    dedup_a=dedup_a, uniq_a=uniq_a)
            cands.append((by, res, n, inner == 0, valid))
    shape = jnp.broadcast_shapes(*(jnp.shape(x) for c in cands for x in (*c[0], *c[1], c[2])),
                                 batch)
    totals = [by[0] + by[1] + by[2] + by[3] for by, _, _, _, _ in cands]
    ests = [jnp.maximum(compute + (n - 1.0) * all_folds * fd, total / bw)
            for total, (_, _, n, _, _) in zip(totals, cands)]
    sg = jax.lax.stop_gradient
    tbs = [sg(x) if c[4] is None else jnp.where(c[4], sg(x), jnp.inf)
           for x, c in zip(totals, cands)]
    tes = [sg(x) if c[4] is None else jnp.where(c[4], sg(x), jnp.inf)
           for x, c in zip(ests, cands)]
    least = functools.reduce(jnp.minimum, tbs)
    keys = [jnp.where(tb <= least * (1.0 + 1e-12), te, jnp.inf) for tb, te in zip(tbs, tes)]
    least_key = functools.reduce(jnp.minimum, keys)
    best = [key <= least_key for key in keys]

    def chosen(get):
        vals = [jnp.broadcast_to(get(c), shape) for c in cands]
        out = jnp.zeros_like(vals[0])
        for b, v in zip(reversed(best), reversed(vals)):
            out = jnp.where(b, v, out)
        return out

    rd_a, rd_b, wr_out, rd_out = (chosen(lambda c, i=i: c[0][i]) for i in range(4))
    res_a, res_b, res_out = (chosen(lambda c, i=i: c[1][i]) for i in range(3))
    n_chunks = chosen(lambda c: c[2])
    rows_inner = chosen(lambda c: jnp.asarray(c[3]))
    return rd_a, rd_b, wr_out, rd_out, res_a, res_b, res_out, n_chunks, rows_inner


@exact
def gemm_mapping(M, K, N, rows, cols, roles: Roles, *, sram_bytes_a, sram_bytes_b,
                 sram_bytes_out, elem_bytes_a=1, elem_bytes_b=1, elem_bytes_out=1,
                 dram_bytes_per_cycle, unique_elems_a=None, bound=None):
    """:func:`npujax.systolic.gemm_mapping` (``mapping="best"``) with the dataflow as data."""
    base = gemm_memory(M, K, N, rows, cols, roles, sram_bytes_a=sram_bytes_a,
                       sram_bytes_b=sram_bytes_b, sram_bytes_out=sram_bytes_out,
                       elem_bytes_a=elem_bytes_a, elem_bytes_b=elem_bytes_b,
                       elem_bytes_out=elem_bytes_out, dram_bytes_per_cycle=dram_bytes_per_cycle,
                       unique_elems_a=unique_elems_a, bound=bound)
    ext = {"M": real(M), "K": real(K), "N": real(N)}
    count = _relax.count
    folds = {d: real(roles.dim_folds(d, count(v), count(rows), count(cols), bound=bound))
             for d, v in (("M", M), ("K", K), ("N", N))}
    half = {"a": real(sram_bytes_a) / 2, "b": real(sram_bytes_b) / 2,
            "out": real(sram_bytes_out) / 2}
    eb = {"a": real(elem_bytes_a), "b": real(elem_bytes_b), "out": real(elem_bytes_out)}
    uniq_a = ext["M"] * ext["K"] if unique_elems_a is None else real(unique_elems_a)
    dedup_a = jnp.minimum(uniq_a / (ext["M"] * ext["K"]), 1.0)
    T = roles.pick(2, ext)
    fd = real(roles.fill_cycles(count(rows), count(cols))
              + roles.drain_cycles(count(rows), count(cols)))
    min_chunk = jnp.minimum(jnp.maximum(fd, 1.0), T)
    all_folds = folds["M"] * folds["K"] * folds["N"]
    compute = real(base["compute_cycles"])
    bw = real(dram_bytes_per_cycle)
    rd_a, rd_b, wr_out, rd_out, res_a, res_b, res_out, n_chunks, rows_inner = _search(
        roles, ext, folds, half, eb, dedup_a, uniq_a, T, min_chunk, compute, all_folds, fd, bw,
        jnp.shape(base["dram_bytes"]))
    extra_fd = (n_chunks - 1.0) * all_folds * fd
    dram = rd_a + rd_b + wr_out + rd_out
    memory = dram / bw
    prologue, epilogue = base["prologue_cycles"], base["epilogue_cycles"]
    steady = jnp.maximum(memory - prologue - epilogue, 0.0)
    busy = compute + extra_fd
    stall = prologue + epilogue + jnp.maximum(steady - busy, 0.0)
    return {
        **base, "dram_read_bytes_a": rd_a, "dram_read_bytes_b": rd_b,
        "dram_write_bytes_out": wr_out, "dram_read_bytes_out": rd_out, "dram_bytes": dram,
        "memory_cycles": memory, "stall_cycles": stall, "total_cycles": busy + stall,
        "resident_a": res_a, "resident_b": res_b, "resident_out": res_out,
        "extra_fill_drain_cycles": extra_fd, "chunks": n_chunks, "rows_inner": rows_inner,
    }

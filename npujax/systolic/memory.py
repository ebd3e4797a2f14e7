"""Memory model of one GEMM on a systolic array: double-buffered SRAMs, DRAM traffic, stalls.

Each operand has its own SRAM (SCALE-Sim's ifmap / filter / ofmap buffers; ``a[M,K]`` is the
ifmap operand, ``b[K,N]`` the filter, the output the ofmap). Every SRAM is *double buffered*: one
half feeds the array while the other half is filled from (or drained to) DRAM, so only half of
each SRAM holds data that can be reused (SCALE-Sim's ``active_buf_frac = 0.5``).

Folds are visited as SCALE-Sim does: the fold index of the dimension on the array columns is the
outer loop, the one on the rows the inner loop (``for fc: for fr:``). An operand is read once per
fold of the GEMM dimension it does not contain (see :func:`npujax.systolic.gemm_cycles`); it comes
from DRAM only once when the data reused between those folds stays in its active half-buffer:

* other dimension in time (folds once): read once, nothing to keep;
* other dimension on the rows (inner loop): reused by consecutive folds, so one column-fold's
  tile must fit (e.g. output stationary keeps a ``K x C`` slice of ``b``);
* other dimension on the columns (outer loop): reused only after a whole sweep of the inner
  loop, so the whole operand must fit.

Otherwise it is fetched again for every such fold. Partial sums across K folds (weight and input
stationary put K on the rows) stay in the output SRAM when one column-fold's output tile of int32
partial sums fits in its half; otherwise each K fold but the last spills them to DRAM (4 bytes per
element) and reads them back. The final outputs are written once at ``elem_bytes_out``.

Time: before computing starts the first stationary tile must be in the array's SRAM, and the
first vector of each streamed operand (*prologue*); after the last fold ends its last results must
be written (*epilogue*: the whole output tile for output stationary, whose results appear at the
end of a fold, one output vector otherwise). All other DRAM traffic overlaps compute through the
double buffers and stalls only the part of it that is slower than compute, spread evenly over the
folds::

    stall_cycles = prologue + epilogue + max(0, steady_dram_cycles - compute_cycles)
    total_cycles = compute_cycles + stall_cycles

so ``total_cycles >= max(compute_cycles, dram_bytes / dram_bytes_per_cycle)`` (the roofline of
Williams et al., CACM 2009). Memory-side figures are float64 cycles (fractional when bytes do not
divide the bandwidth), as in :mod:`npujax.plan.costs`.

All arguments may be traced jnp scalars or arrays (``vmap`` over hardware configurations); the
dataflow is static.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from npujax import _relax
from npujax._exact import exact, real
from npujax.systolic.dataflow import Dataflow, both, choose, either, gemm_cycles, get_dataflow

__all__ = ["gemm_memory", "PSUM_BYTES"]

#: Bytes of one int32 partial sum spilled to DRAM between K folds.
PSUM_BYTES = 4


_f32 = real  # (float64 inside @exact; the name marks "a real number" here)


@exact
def gemm_memory(
    M, K, N, rows, cols, dataflow: str | Dataflow, *,
    sram_bytes_a, sram_bytes_b, sram_bytes_out,
    elem_bytes_a=1, elem_bytes_b=1, elem_bytes_out=1,
    dram_bytes_per_cycle,
    unique_elems_a=None,
    bound: int | None = None,
) -> dict[str, jax.Array]:
    """DRAM traffic and memory stalls of an ``[M,K] x [K,N]`` GEMM (pure jnp, vmappable).

    Args:
      M: rows of ``a`` and of the output (int, may be traced), >= 1.
      K: the reduction extent (int, may be traced), >= 1.
      N: columns of ``b`` and of the output (int, may be traced), >= 1.
      rows: array height in PEs, >= 1.
      cols: array width in PEs, >= 1.
      dataflow: a :class:`Dataflow` or its name (static), or a
        :class:`~npujax.systolic.dataflow.Roles` (the dataflow as data).
      sram_bytes_a: total bytes of the ifmap SRAM (``a``; double buffered: half is active).
      sram_bytes_b: total bytes of the filter SRAM (``b``), double buffered.
      sram_bytes_out: total bytes of the ofmap SRAM (the output), double buffered.
      elem_bytes_a: bytes per element of ``a`` (e.g. 1 for int8; fractional values model
        sub-byte formats).
      elem_bytes_b: bytes per element of ``b``.
      elem_bytes_out: bytes per element of the final output.
      dram_bytes_per_cycle: DRAM bandwidth in bytes per array clock cycle (> 0).
      unique_elems_a: distinct elements behind ``a`` (default ``M*K``, a plain GEMM). For a conv,
        ``a`` is the im2col matrix whose windows overlap; pass the input size per group
        (``batch*H*W*C_in/groups``) and ``a`` costs DRAM reads of its distinct elements, as in
        SCALE-Sim, whose DRAM IFMAP reads count distinct addresses.
      bound: a static upper bound of ``M``, ``K`` and ``N`` or None (see :func:`gemm_cycles`).

    Returns:
      dict of float64 arrays: ``dram_read_bytes_a``, ``dram_read_bytes_b``,
      ``dram_write_bytes_out``, ``dram_read_bytes_out`` (partial sums read back), ``dram_bytes``
      (their sum); ``memory_cycles`` (dram_bytes / bandwidth); ``prologue_cycles`` and
      ``epilogue_cycles`` (the first tiles in, the last tile out); ``stall_cycles``;
      ``total_cycles`` (compute + stalls); bool ``resident_a``, ``resident_b``, ``resident_out``
      (whether the reused data fits its active half-buffer); int64 ``compute_cycles`` (from
      :func:`gemm_cycles`).

    Raises:
      ConfigError: unknown dataflow name.
    """
    df = get_dataflow(dataflow)
    g = gemm_cycles(M, K, N, rows, cols, df, bound=bound)
    ext = {"M": _f32(M), "K": _f32(K), "N": _f32(N)}
    r, c = _f32(rows), _f32(cols)
    count = _relax.count
    folds = {d: _f32(df.dim_folds(d, count(v), count(rows), count(cols), bound=bound))
             for d, v in (("M", M), ("K", K), ("N", N))}
    # the layout's branches (``inner``: the rows' dimension, ``outer``: the columns', then time)
    # through ``choose``: Python branches for a static dataflow, exact selects for Roles
    inner, outer, time = 0, 1, 2

    def tile(d):  # extent of dimension d inside one fold
        return choose(df.on(inner, d), lambda: jnp.minimum(ext[d], r),
                      lambda: choose(df.on(outer, d), lambda: jnp.minimum(ext[d], c),
                                     lambda: ext[d]))

    def reused_elems(dims, other):
        """Elements that must stay resident for reuse across the folds of ``other``."""
        size = ext[dims[0]] * ext[dims[1]]
        o_inner = df.on(inner, other)
        return choose(
            both(o_inner, either(df.on(outer, dims[0]), df.on(outer, dims[1]))),
            lambda: size / df.pick(outer, folds),  # one column-fold's slice
            lambda: choose(either(o_inner, df.on(outer, other)), lambda: size,
                           lambda: jnp.zeros_like(size)))  # other temporal: read once

    def operand(dims, other, sram, eb, unique):
        size = ext[dims[0]] * ext[dims[1]]
        dedup = jnp.minimum(unique / size, 1.0)  # im2col duplicates come from SRAM, not DRAM
        need = reused_elems(dims, other) * dedup * _f32(eb)
        resident = need <= _f32(sram) / 2
        refetch = _relax.select_step(resident, need, _f32(sram) / 2, jnp.ones_like(need),
                                     folds[other])
        reads = jnp.minimum(unique, size) * _f32(eb) * refetch
        return reads, resident

    uniq_a = ext["M"] * ext["K"] if unique_elems_a is None else _f32(unique_elems_a)
    rd_a, res_a = operand(("M", "K"), "N", sram_bytes_a, elem_bytes_a, uniq_a)
    rd_b, res_b = operand(("K", "N"), "M", sram_bytes_b, elem_bytes_b, ext["K"] * ext["N"])
    out_elems = ext["M"] * ext["N"]
    psums = reused_elems(("M", "N"), "K") * PSUM_BYTES
    res_out = psums <= _f32(sram_bytes_out) / 2
    spills = _relax.select_step(res_out, psums, _f32(sram_bytes_out) / 2, jnp.zeros_like(psums),
                                folds["K"] - 1.0)
    wr_out = out_elems * (_f32(elem_bytes_out) + spills * PSUM_BYTES)
    rd_out = out_elems * spills * PSUM_BYTES
    dram = rd_a + rd_b + wr_out + rd_out

    bw = _f32(dram_bytes_per_cycle)

    def first_bytes(dims, eb):
        """Bytes needed before the first (last) cycle of a fold: a stationary tile (both dims on
        the array) entirely, a streamed operand only its first vector (its spatial extent)."""
        t0, t1 = df.on(time, dims[0]), df.on(time, dims[1])
        return choose(either(t0, t1),
                      lambda: choose(t0, lambda: tile(dims[1]), lambda: tile(dims[0])) * 1.0
                      * _f32(eb),
                      lambda: tile(dims[0]) * tile(dims[1]) * _f32(eb))

    dedup_a = jnp.minimum(uniq_a / (ext["M"] * ext["K"]), 1.0)
    prologue = (first_bytes(("M", "K"), elem_bytes_a) * dedup_a
                + first_bytes(("K", "N"), elem_bytes_b)) / bw
    epilogue = first_bytes(("M", "N"), elem_bytes_out) / bw
    memory = dram / bw
    steady = jnp.maximum(memory - prologue - epilogue, 0.0)
    compute = real(g["compute_cycles"])
    stall = prologue + epilogue + jnp.maximum(steady - compute, 0.0)
    return {
        "dram_read_bytes_a": rd_a,
        "dram_read_bytes_b": rd_b,
        "dram_write_bytes_out": wr_out,
        "dram_read_bytes_out": rd_out,
        "dram_bytes": dram,
        "memory_cycles": memory,
        "prologue_cycles": prologue,
        "epilogue_cycles": epilogue,
        "stall_cycles": stall,
        "total_cycles": compute + stall,
        "compute_cycles": g["compute_cycles"],
        "resident_a": res_a,
        "resident_b": res_b,
        "resident_out": res_out,
    }

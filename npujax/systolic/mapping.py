"""DRAM-level mapping of one GEMM: the loop order and tiling a compiler picks for the SRAMs.

:func:`npujax.systolic.gemm_memory` visits the folds in SCALE-Sim's one fixed order: the fold of
the dimension on the array *columns* outer, the one on the *rows* inner, and the streamed
dimension ``T`` whole inside every fold. That order reproduces SCALE-Sim's DRAM counts, but when
what a fold reuses does not fit its active half-buffer it is a schedule no compiler would choose:
weight stationary on a 16x16 array with 64 KiB active output halves writes and re-reads the int32
partial sums of an ``M x 16`` output slice once per fold of K (a 3x3 conv with ``M = 25,600``
pixels and ``K = 864`` moves 347 MB of partial sums where its operands and output are 5.8 MB).

A *mapper* (Timeloop, Parashar et al., ISPASS 2019; ZigZag, Mei et al., IEEE TC 2021) searches
the loop orders and tile sizes of every memory level and keeps the mapping that minimises its
objective. For the two levels modelled here (DRAM -> double-buffered SRAM -> a fixed array
dataflow) the sensible mappings are few, and the best one has a closed form
(:func:`gemm_mapping` with ``mapping="best"``):

* **fold order**: which spatial fold loop is inner, the rows' (SCALE-Sim's) or the columns'. The
  operand whose *other* dimension is the inner loop only needs one slice resident; the one whose
  other dimension is the outer loop needs the whole (chunk of the) operand.
* **chunks of the streamed dimension** (weight / input stationary only, where ``T`` is an output
  dimension, M or N): an outermost loop over chunks of ``t`` rows of ``T``, each run as its own
  fold sweep. Every reused slice that contains ``T`` shrinks in proportion to ``t`` (partial sums,
  the streamed operand), so it fits; the array-stationary operand (without ``T``) is read again
  for every chunk unless it fits whole; each extra chunk repeats the folds' fill and drain
  (``(chunks - 1) x folds x (fill + drain)`` extra compute cycles). Output stationary streams the
  reduction K, whose partial sums stay in the PEs and cannot be split without reloading them, so
  it is not chunked. Chunks are at least ``fill + drain`` long (a shorter chunk would spend more
  time filling and draining the array than streaming).

For a fold order the DRAM bytes are a sum of steps in ``t``: operands and partial sums that
contain ``T`` fit for ``t`` up to their breakpoint ``floor(half_buffer / bytes_per_row)`` (fewer
bytes for smaller ``t``), the array-stationary operand costs ``ceil(T / t)`` reads unless it fits
(fewer for larger ``t``). The minimum over ``t`` is therefore at ``t = T`` or at one of the
breakpoints or at their minimum: four candidates per order (two for output stationary), each a
closed-form jnp expression. The mapping with the fewest DRAM bytes wins, ties going to the fewest
cycles (``max(compute, memory)``), then to SCALE-Sim's order: the chosen mapping never moves more
bytes than SCALE-Sim's order (it is a candidate), and because every candidate's bytes fall with
more SRAM and the set of chunk sizes does not depend on it, more SRAM never adds DRAM bytes.

What is not modelled: the halo of overlapping conv windows between chunks of pixels (the im2col
input costs its distinct elements in proportion to the chunk, as in :func:`gemm_memory`), and
tilings finer than a fold inside the SRAM (both spatial tiles stay the array's).

``mapping="scalesim"`` returns :func:`gemm_memory`'s figures unchanged (the cross-check mode).
All arguments may be traced (``vmap`` over hardware), and inside ``npujax._relax.relaxed`` the
candidate figures carry the relaxed gradients (the choice itself is a hard selection: the gradient
is the chosen mapping's, as a compiler's choice is piecewise constant).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
from collections.abc import Iterator
from typing import Any

import jax
import jax.numpy as jnp

from npujax import _relax
from npujax._exact import computed_once, computes_once, exact, real
from npujax.errors import ConfigError
from npujax.systolic.dataflow import Dataflow, Roles, choose, get_dataflow, negate
from npujax.systolic.memory import PSUM_BYTES, gemm_memory

__all__ = ["MAPPINGS", "gemm_mapping", "check_mapping"]

#: DRAM-level mappings: ``best`` (the closed-form mapper) and ``scalesim`` (SCALE-Sim's order).
MAPPINGS = ("best", "scalesim")


_STACKED: contextvars.ContextVar[bool] = contextvars.ContextVar("npujax_stacked_mapping",
                                                               default=False)


@contextlib.contextmanager
def stacked_search() -> Iterator[None]:
    """Trace :func:`gemm_mapping` with its candidates stacked on a leading axis (the
    implementation before the unrolled one; the same values bit for bit): the reference that
    ``experiments/bench/cost_throughput.py`` and the equality tests compare against. Read while
    tracing, like ``npujax._relax.integer_division``."""
    token = _STACKED.set(True)
    try:
        yield
    finally:
        _STACKED.reset(token)


def _lift(x):
    """``x`` with a leading axis of length 1 (the candidates'), scalars unchanged (numpy rank
    promotion is an error in the tests)."""
    x = jnp.asarray(x)
    return x[None] if x.ndim else x


def check_mapping(mapping: str) -> str:
    """``mapping`` if it is one of :data:`MAPPINGS`.

    Raises:
      ConfigError: any other value (the message lists the valid ones).
    """
    if mapping not in MAPPINGS:
        raise ConfigError(f"unknown mapping {mapping!r}; use one of {', '.join(MAPPINGS)} "
                          "('best': the loop order and tiling with the fewest DRAM bytes; "
                          "'scalesim': SCALE-Sim's fixed fold order, for cross-checks).")
    return mapping


def _floor(x: jax.Array) -> jax.Array:
    """``floor(x)``; relaxed, with the gradient of ``x`` (straight-through) where ``x`` is
    finite and none where it is infinite (``x - x`` would be NaN there)."""
    f = jnp.floor(x)
    if not _relax.is_relaxed():
        return f
    finite = jnp.isfinite(x)
    xs = jnp.where(finite, x, 0.0)
    return jnp.where(finite, jax.lax.stop_gradient(f) + (xs - jax.lax.stop_gradient(xs)), f)


def _candidate(df: Dataflow, inner: int, chunk, ext, folds, *, half, eb, dedup_a, uniq_a):
    """DRAM bytes of one mapping: fold order (the dimension on array axis ``inner``, 0 rows or
    1 columns, loops inside the other) and chunks of ``chunk`` elements of the streamed
    dimension (arrays broadcast over the batch). The layout's branches go through
    :func:`~npujax.systolic.dataflow.choose` (Python branches for a static dataflow, exact
    selects for :class:`~npujax.systolic.dataflow.Roles`).
    Returns (bytes per operand, resident flags, number of chunks)."""
    n_chunks = _relax.ceil(df.pick(2, ext) / chunk)

    def need_elems(dims, other):
        """Elements kept resident for reuse across the folds of ``other`` (per chunk)."""
        def chunked():
            sp_e, sp_f = _spatial(df, dims, ext), _spatial(df, dims, folds)
            return choose(df.on(inner, other),
                          lambda: chunk * sp_e / sp_f,  # one slice of the outer loop's fold
                          lambda: chunk * sp_e)  # other on the outer loop: the whole chunk
        # no T in it: reused across chunks only, so all of it
        return choose(df.on(2, other), lambda: ext[dims[0]] * ext[dims[1]], chunked)

    def operand(dims, other, cap, e, unique, dedup):
        size = ext[dims[0]] * ext[dims[1]]
        need = need_elems(dims, other) * dedup * e
        fits = need <= cap
        in_time = df.on(2, other)
        # read once per chunk: kept when it fits or there is one chunk
        fits = choose(in_time, lambda: fits | (n_chunks <= 1.0), lambda: fits)
        times = choose(in_time, lambda: n_chunks, lambda: folds[other])
        refetch = _relax.select_step(fits, need, cap, jnp.ones_like(need), times)
        return jnp.minimum(unique, size) * e * refetch, fits

    rd_a, res_a = operand(("M", "K"), "N", half["a"], eb["a"], uniq_a, dedup_a)
    rd_b, res_b = operand(("K", "N"), "M", half["b"], eb["b"], ext["K"] * ext["N"], 1.0)
    # output stationary: partial sums never leave the PEs
    psums = choose(df.on(2, "K"), lambda: jnp.zeros_like(rd_a),
                   lambda: need_elems(("M", "N"), "K") * PSUM_BYTES)
    res_out = psums <= half["out"]
    spills = _relax.select_step(res_out, psums, half["out"], jnp.zeros_like(psums),
                                folds["K"] - 1.0)
    out_elems = ext["M"] * ext["N"]
    wr_out = out_elems * (eb["out"] + spills * PSUM_BYTES)
    rd_out = out_elems * spills * PSUM_BYTES
    return (rd_a, rd_b, wr_out, rd_out), (res_a, res_b, res_out), n_chunks


def _spatial(df: Dataflow, dims: tuple[str, str], d: dict[str, Any]) -> Any:
    """``d`` of the spatial one of ``dims`` (a slice holding the time dimension T): ``dims[0]``
    when ``dims[1]`` lies in time, else ``dims[1]``."""
    return choose(df.on(2, dims[1]), lambda: d[dims[0]], lambda: d[dims[1]])


@exact
def gemm_mapping(
    M, K, N, rows, cols, dataflow: str | Dataflow, *,
    sram_bytes_a, sram_bytes_b, sram_bytes_out,
    elem_bytes_a=1, elem_bytes_b=1, elem_bytes_out=1,
    dram_bytes_per_cycle,
    unique_elems_a=None,
    mapping: str = "best",
    bound: int | None = None,
) -> dict[str, jax.Array]:
    """DRAM traffic and stalls of an ``[M,K] x [K,N]`` GEMM under the best DRAM-level mapping.

    Same arguments and results as :func:`npujax.systolic.gemm_memory` (see there for units and
    dtypes), plus ``mapping`` and three results:

    * ``extra_fill_drain_cycles`` (float64): the fill and drain of the folds repeated for every
      chunk of the streamed dimension after the first; ``total_cycles`` includes them,
      ``compute_cycles`` (the fold model, SCALE-Sim's count) does not.
    * ``chunks`` (float64): chunks the streamed dimension is split into (1 = not split).
    * ``rows_inner`` (bool): the array rows' fold loop is inner (SCALE-Sim's order) or not.

    Args:
      mapping: ``"best"`` (the closed-form mapper of the module docstring) or ``"scalesim"``
        (:func:`gemm_memory`'s figures, bit for bit, with no extra cycles). Static.
      bound: a static upper bound of ``M``, ``K`` and ``N`` or None (see
        :func:`npujax.systolic.gemm_cycles`).

    Raises:
      ConfigError: an unknown dataflow or mapping.

    Examples:
      >>> m = gemm_mapping(25600, 864, 32, 16, 16, "ws", sram_bytes_a=131072,
      ...                  sram_bytes_b=131072, sram_bytes_out=131072,
      ...                  dram_bytes_per_cycle=6.4, unique_elems_a=25600 * 96)
      >>> round(float(m["dram_bytes"]) / 1e6, 2), int(m["chunks"])
      (3.3, 38)

    References:
      Parashar et al., "Timeloop: A Systematic Approach to DNN Accelerator Evaluation", ISPASS
      2019 (a mapper that searches the mapspace of loop orders and tilings per memory level with
      an analytical cost model); Mei et al., "ZigZag: Enlarging Joint Architecture-Mapping
      Design Space Exploration for DNN Accelerators", IEEE Trans. Computers 70(8):1160-1174,
      2021, doi:10.1109/TC.2021.3059962 (temporal-mapping search per layer). Here the few
      candidates of a two-level hierarchy, in closed form.
    """
    check_mapping(mapping)
    df = get_dataflow(dataflow)  # a static dataflow, or Roles (data)
    base = gemm_memory(M, K, N, rows, cols, df, sram_bytes_a=sram_bytes_a,
                       sram_bytes_b=sram_bytes_b, sram_bytes_out=sram_bytes_out,
                       elem_bytes_a=elem_bytes_a, elem_bytes_b=elem_bytes_b,
                       elem_bytes_out=elem_bytes_out, dram_bytes_per_cycle=dram_bytes_per_cycle,
                       unique_elems_a=unique_elems_a, bound=bound)
    zero = jnp.zeros_like(base["dram_bytes"])
    if mapping == "scalesim":
        return {**base, "extra_fill_drain_cycles": zero, "chunks": zero + 1.0,
                "rows_inner": jnp.ones_like(base["resident_a"])}

    ext = {"M": real(M), "K": real(K), "N": real(N)}
    count = _relax.count
    folds = {d: real(df.dim_folds(d, count(v), count(rows), count(cols), bound=bound))
             for d, v in (("M", M), ("K", K), ("N", N))}
    half = {"a": real(sram_bytes_a) / 2, "b": real(sram_bytes_b) / 2,
            "out": real(sram_bytes_out) / 2}
    eb = {"a": real(elem_bytes_a), "b": real(elem_bytes_b), "out": real(elem_bytes_out)}
    uniq_a = ext["M"] * ext["K"] if unique_elems_a is None else real(unique_elems_a)
    dedup_a = jnp.minimum(uniq_a / (ext["M"] * ext["K"]), 1.0)
    T = df.pick(2, ext)
    search = _search_stacked if _STACKED.get() else _search
    fd = real(df.fill_cycles(count(rows), count(cols)) + df.drain_cycles(count(rows), count(cols)))
    min_chunk = jnp.minimum(jnp.maximum(fd, 1.0), T)
    all_folds = folds["M"] * folds["K"] * folds["N"]
    compute = real(base["compute_cycles"])
    bw = real(dram_bytes_per_cycle)

    rd_a, rd_b, wr_out, rd_out, res_a, res_b, res_out, n_chunks, rows_inner = search(
        df, ext, folds, half, eb, dedup_a, uniq_a, T, min_chunk, compute, all_folds, fd, bw,
        jnp.shape(base["dram_bytes"]))
    extra_fd = (n_chunks - 1.0) * all_folds * fd
    dram = rd_a + rd_b + wr_out + rd_out
    memory = dram / bw
    prologue, epilogue = base["prologue_cycles"], base["epilogue_cycles"]
    steady = jnp.maximum(memory - prologue - epilogue, 0.0)
    busy = compute + extra_fd
    stall = prologue + epilogue + jnp.maximum(steady - busy, 0.0)
    return {
        **base,
        "dram_read_bytes_a": rd_a,
        "dram_read_bytes_b": rd_b,
        "dram_write_bytes_out": wr_out,
        "dram_read_bytes_out": rd_out,
        "dram_bytes": dram,
        "memory_cycles": memory,
        "stall_cycles": stall,
        "total_cycles": busy + stall,
        "resident_a": res_a,
        "resident_b": res_b,
        "resident_out": res_out,
        "extra_fill_drain_cycles": extra_fd,
        "chunks": n_chunks,
        "rows_inner": rows_inner,
    }


def _search(df: Dataflow, ext, folds, half, eb, dedup_a, uniq_a, T, min_chunk, compute,
            all_folds, fd, bw, batch):
    """The mapping with the fewest DRAM bytes (ties: fewest cycles, then the first candidate):
    its four traffic figures, three residency flags, chunks and fold order, each ``[*batch]``.

    With :class:`~npujax.systolic.dataflow.Roles` every element has eight candidates; output
    stationary (no chunks of its reduction) keeps the two ``chunk = T`` ones, the others'
    bytes and cycles set to inf (never chosen: its first best is the static search's)."""
    # the candidates one by one, each a [*batch] array (not stacked on a candidate axis: XLA
    # then fuses the whole search into one loop over the batch, where a stacked axis made it
    # materialise [batch, candidates] intermediates and branch per element in concatenations)
    cands = []  # (bytes tuple, resident tuple, chunks, rows inner, valid: True or traced)
    for inner, chunks in _chunk_candidates(df, ext, folds, half, eb, dedup_a, T):
        for chunk, valid in chunks:
            t = jnp.clip(chunk, min_chunk, T)
            by, res, n = _candidate(df, inner, t, ext, folds, half=half, eb=eb, dedup_a=dedup_a,
                                    uniq_a=uniq_a)
            cands.append((by, res, n, inner == 0, valid))
    shape = jnp.broadcast_shapes(*(jnp.shape(x) for c in cands for x in (*c[0], *c[1], c[2])),
                                 batch)
    totals = [by[0] + by[1] + by[2] + by[3] for by, *_ in cands]
    ests = [jnp.maximum(compute + (n - 1.0) * all_folds * fd, total / bw)
            for total, (_, _, n, *_) in zip(totals, cands)]
    # fewest bytes; among equal bytes the fewest cycles; then the first (SCALE-Sim's order)
    sg = jax.lax.stop_gradient
    tbs, tes = ([sg(x) if c[4] is True else jnp.where(c[4], sg(x), jnp.inf)
                 for x, c in zip(xs, cands)] for xs in (totals, ests))
    least = functools.reduce(jnp.minimum, tbs)
    keys = [jnp.where(tb <= least * (1.0 + 1e-12), te, jnp.inf) for tb, te in zip(tbs, tes)]
    least_key = functools.reduce(jnp.minimum, keys)
    best = [key <= least_key for key in keys]
    if computes_once():
        # the first best candidate's index (len(cands) if none is best), computed once, and
        # below each chosen figure (computed_once): XLA would otherwise copy the whole search
        # into every fusion that reads a figure (14 in the README's sweep program, three
        # dataflows: x1.4 its compile time, and the run time of the copies)
        first = jnp.full(shape, len(cands), jnp.int32)
        for i in reversed(range(len(cands))):
            first = jnp.where(best[i], i, first)
        first = computed_once(first)
        best = [first == i for i in range(len(cands))]

    def chosen(get):
        """The figure of the first best candidate (zero / False if none is best: NaN costs),
        exact, and a gradient of the chosen candidate only."""
        vals = [jnp.broadcast_to(get(c), shape) for c in cands]
        out = jnp.zeros_like(vals[0])
        for b, v in zip(reversed(best), reversed(vals)):
            out = jnp.where(b, v, out)
        return out

    rd_a, rd_b, wr_out, rd_out = (chosen(lambda c, i=i: c[0][i]) for i in range(4))
    res_a, res_b, res_out = (chosen(lambda c, i=i: c[1][i]) for i in range(3))
    n_chunks = chosen(lambda c: c[2])
    rows_inner = chosen(lambda c: jnp.asarray(c[3]))
    return computed_once((rd_a, rd_b, wr_out, rd_out, res_a, res_b, res_out, n_chunks,
                          rows_inner))


def _search_stacked(df: Dataflow, ext, folds, half, eb, dedup_a, uniq_a, T, min_chunk, compute,
                    all_folds, fd, bw, batch):
    """:func:`_search` with the candidates on a leading axis (the previous implementation, kept
    as the reference: :func:`stacked_search`); the same values bit for bit."""
    if isinstance(df, Roles):
        raise ConfigError("the stacked mapping search (the reference implementation) takes a "
                          "static dataflow; Roles (the dataflow as data) runs npujax's own search "
                          "(leave stacked_search()).")
    parts = []  # per fold order: (bytes tuple, resident tuple, chunks), leading candidate axis
    rows_inner_flags = []
    lifted = ({k: _lift(v) for k, v in d.items()} for d in (ext, folds, half, eb))
    l_ext, l_folds, l_half, l_eb = lifted
    for inner, chunks in _chunk_candidates(df, ext, folds, half, eb, dedup_a, T):
        t = jnp.clip(jnp.stack(jnp.broadcast_arrays(*(c for c, _ in chunks))), _lift(min_chunk),
                     _lift(T))
        parts.append(_candidate(df, inner, t, l_ext, l_folds, half=l_half, eb=l_eb,
                                dedup_a=_lift(dedup_a), uniq_a=_lift(uniq_a)))
        rows_inner_flags += [inner == 0] * len(chunks)

    def stacked(get):
        """One figure of every candidate, ``[candidates, *batch]``."""
        vals = [jnp.asarray(get(p)) for p in parts]
        shape = jnp.broadcast_shapes(*(v.shape[1:] if v.ndim else () for v in vals), batch)
        return jnp.concatenate([jnp.broadcast_to(v, v.shape[:1] + shape) for v in vals])

    fig = {"rd_a": stacked(lambda p: p[0][0]), "rd_b": stacked(lambda p: p[0][1]),
           "wr_out": stacked(lambda p: p[0][2]), "rd_out": stacked(lambda p: p[0][3]),
           "res_a": stacked(lambda p: p[1][0]), "res_b": stacked(lambda p: p[1][1]),
           "res_out": stacked(lambda p: p[1][2]), "chunks": stacked(lambda p: p[2])}
    total = fig["rd_a"] + fig["rd_b"] + fig["wr_out"] + fig["rd_out"]
    est = jnp.maximum(_lift(compute) + (fig["chunks"] - 1.0) * _lift(all_folds) * _lift(fd),
                      total / _lift(bw))
    sg = jax.lax.stop_gradient
    tb, te = sg(total), sg(est)
    fewest = tb <= jnp.min(tb, axis=0, keepdims=True) * (1.0 + 1e-12)
    key = jnp.where(fewest, te, jnp.inf)
    best = key <= jnp.min(key, axis=0, keepdims=True)
    # the first best candidate, unrolled (no argmin: its int64 index breaks jax.grad's transpose
    # outside the x64 scope)
    taken = jnp.zeros_like(best[0])
    rows = []
    for i in range(best.shape[0]):
        rows.append(best[i] & ~taken)
        taken = taken | best[i]
    onehot = jnp.stack(rows)

    def chosen(values):  # a masked sum, exact (x + 0 == x) and transposable outside x64
        if values.dtype == jnp.bool_:
            return jnp.any(onehot & values, axis=0)
        return jnp.sum(jnp.where(onehot, values, jnp.zeros_like(values)), axis=0)

    rd_a, rd_b, wr_out, rd_out = (chosen(fig[k]) for k in ("rd_a", "rd_b", "wr_out", "rd_out"))
    res_a, res_b, res_out = (chosen(fig[k]) for k in ("res_a", "res_b", "res_out"))
    n_chunks = chosen(fig["chunks"])
    flags = jnp.asarray(rows_inner_flags).reshape((-1,) + (1,) * (total.ndim - 1))
    rows_inner = jnp.any(onehot & flags, axis=0)
    return rd_a, rd_b, wr_out, rd_out, res_a, res_b, res_out, n_chunks, rows_inner


def _per_row_needs(df: Dataflow, inner: int, ext, folds, eb, dedup_a) -> tuple[Any, Any, Any]:
    """Bytes per element of the streamed dimension T of the two reused slices that contain T
    (the streamed operand and the partial sums) under fold order ``inner`` (array axis): dividing
    a half buffer by them gives the largest chunk for which that slice stays resident.

    Returns ``(streamed operand's bytes per row, whether it is a (T = M; else b), the partial
    sums' bytes per row)``; meaningless for output stationary (no chunks)."""
    def per_row(dims, other, e):
        sp_e = _spatial(df, dims, ext)
        return choose(df.on(inner, other), lambda: sp_e / _spatial(df, dims, folds),
                      lambda: sp_e) * e

    t_m = df.on(2, "M")
    streamed = choose(t_m, lambda: per_row(("M", "K"), "N", eb["a"] * dedup_a),
                      lambda: per_row(("K", "N"), "M", eb["b"]))
    return streamed, t_m, per_row(("M", "N"), "K", real(PSUM_BYTES))


def _chunk_candidates(df: Dataflow, ext, folds, half, eb, dedup_a, T) -> Iterator[Any]:
    """Per fold order (array axis 0 inner, then 1: SCALE-Sim's order first, it wins ties),
    ``(inner, [(chunk, valid), ...])``: the chunk sizes of the streamed dimension to try (all of
    T, and the largest for which the streamed slice, the partial sums or both stay resident),
    each with whether it applies (True; a traced bool for Roles: output stationary's reduction
    in time is never chunked). A generator, so each order's breaks are traced just before its
    candidates, as they were."""
    chunked = negate(df.on(2, "K"))
    for inner in (0, 1):
        chunks: list[tuple[Any, Any]] = [(T, True)]
        if chunked is not False:
            streamed, t_m, psums = _per_row_needs(df, inner, ext, folds, eb, dedup_a)
            half_s = choose(t_m, lambda: half["a"], lambda: half["b"])
            # a buffer with no per-row need bounds nothing (inf; a safe division, so the relaxed
            # gradient has no 0 x inf)
            breaks = [_floor(jnp.where(v > 0, h / jnp.where(v > 0, v, 1.0), jnp.inf))
                      for v, h in ((streamed, half_s), (psums, half["out"]))]
            chunks += [(b, chunked) for b in breaks + [jnp.minimum(breaks[0], breaks[1])]]
        yield inner, chunks

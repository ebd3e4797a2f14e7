"""Row-stationary (RS) dataflow of Eyeriss: 1-D row primitives on PE sets, in closed form.

Chen, Emer and Sze, "Eyeriss: A Spatial Architecture for Energy-Efficient Dataflow for
Convolutional Neural Networks", ISCA 2016 (Sec. IV, the RS dataflow); Chen, Krishna, Emer and Sze,
"Eyeriss: An Energy-Efficient Reconfigurable Accelerator for Deep Convolutional Neural Networks",
IEEE JSSC 52(1):127-138, 2017 (Sec. III-IV: the 12 x 14 PE array, the scratchpads, the mapping).

Notation is the papers': ``N`` images, ``M`` filters and ``C`` channels (per group), an ``R x S``
filter, an ``E x F`` output (ofmap), stride ``U``; the array has ``rows x cols`` PEs.

**Primitive.** A PE runs a 1-D convolution of one filter row (``S`` weights, in its filter
scratchpad) with one ifmap row (a sliding window in its ifmap scratchpad) into one psum row of
``F`` values: ``S x F`` MACs, one per cycle. A PE interleaves ``q`` channels and ``p`` filters
(``q`` ifmap windows, ``p x q`` filter rows, ``p`` psum rows in its scratchpads):

    q = min(C, floor(ifmap_spad / S')),   p = min(M, psum_spad, floor(filter_spad / (q S')))

with ``S' = min(S, ifmap_spad)`` (a longer filter row is split into ``ceil(S / S')`` pieces).

**PE set.** One 2-D convolution (one filter, one channel, one image) is an ``R x E`` set of
PEs: PE ``(i, j)`` holds filter row ``i`` (the same filter row across a PE *row*, horizontal
reuse), ifmap row ``i + U j`` (the same ifmap row along an anti-*diagonal*), and the psum rows
of a PE *column* are summed from bottom to top into ofmap row ``j`` (vertical accumulation).

**Physical mapping.** ``R' = min(R, rows)`` filter rows fit (a taller filter folds into
``ceil(R / R')`` row folds whose psums add in the global buffer); the array holds ``bands =
floor(rows / R')`` bands of ``R'`` rows, each with a *strip* of at most ``cols`` ofmap rows, and a
set needs ``strips = ceil(E / cols)`` of them:

* ``strips <= bands``: the whole set fits and is *replicated* ``floor(bands / strips)`` times
  down the array, and ``floor(cols / E)`` times across it when ``E <= cols`` (replicas work on
  other filters or channels): AlexNet CONV3 (3 x 13) runs 4 replicas, 156 PEs; a 1 x 1 set
  (an FC layer) fills all 168 PEs;
* ``strips > bands``: the set is *folded*: its strips run one band-load after another (CONV1,
  11 x 55, runs in strips of 14 columns, 154 PEs); CONV2 (5 x 27) fills two bands, 135 PEs.

Those are the JSSC paper's active-PE counts (its Table of the AlexNet mapping: 154, 135, 156,
156, 156); :func:`rs_conv` returns them as ``active_pes``.

**Cycles.** The unit of work is a *band job*: one image, one strip, one row fold, one piece of
``S`` (and one group) through all ``M`` filters and ``C`` channels. Its cycles are

    F x M x (C x S' + ceil(C / q))  +  ceil(M / p) x ceil(C / q) x (R' - 1)

the MACs (``F x S'`` per primitive, one per cycle), then the vertical accumulation: in every
processing pass (``p`` filters x ``q`` channels) each PE adds the incoming ``p x F`` psums to its
own with the same adder (one cycle each; the bottom PE adds the psums of the previous pass,
read back from the global buffer), and the last psum takes ``R' - 1`` hops up the column.
Band jobs spread over all ``slots = bands x side x cores`` set places (``side = floor(cols /
E)`` replicas across a band when one strip holds the set, else 1; replication splits the jobs by
filters and channels, assumed evenly), so

    compute_cycles = max(ceil(jobs x job_cycles / slots), one pass)

``jobs = N x groups x strips x ceil(R / R') x ceil(S / S')``. ``fill_drain_cycles`` are the
accumulation and hop cycles (the part that is not MACs).

**Buffer accesses** (in words, the global buffer (GLB) <-> PE array traffic the mapping
implies): every pass reads its ``q`` channels' ifmap rows once (multicast along the diagonals:
``(e - 1) U + R'`` rows of ``W = (F - 1) U + S`` per strip of ``e`` ofmap rows, again for every
group of ``p`` filters), its ``p x q x R'`` filter rows once (multicast along the PE rows), and
writes its ``p x e x F`` psums (read back for the next channel group). The scratchpads are
accessed four times per MAC (filter, ifmap, psum read and write).

**GEMM / fully connected layers.** Eyeriss runs an FC layer as a convolution whose filter
covers the whole input; a GEMM ``[M, K] x [K, N]`` without conv geometry is mapped as a 1 x 1
convolution with ``E = F = 1`` over ``K`` channels for ``M`` images: the PE set is one PE, the
primitive one MAC, replicated over the whole array, and every pass of ``p x q`` MACs pays ``p``
accumulation cycles, so utilization stays below ``q / (q + 1)`` and the layer, whose weights
are used once per image, is memory bound on them. That
is the real behaviour of RS on FC layers (JSSC Sec. VI reports CONV layers only).

All arguments may be traced and broadcast (``vmap`` over hardware, ``[L]`` columns over layers);
counts are exact int64 (computed in 64 bits, as every count of the cost model). In the relaxed
mode the ceilings and floors (``floor(a / b) = ceil((a - b + 1) / b)``) pass the
straight-through slopes of ``npujax._relax``; ``min`` passes the slope of the smaller side.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from npujax import _relax
from npujax._exact import exact, real

__all__ = ["rs_conv", "rs_dram"]

_ceil_div = _relax.ceil_div


def _floor_div(a, b):
    """``floor(a / b)`` of counts ``a >= 0``, ``b >= 1`` as ``ceil((a - b + 1) / b)``."""
    return _ceil_div(jnp.maximum(a - b + 1, 0), b)


@exact
def rs_conv(images, channels, filters, R, S, E, F, rows, cols, *, ifmap_spad, filter_spad,
            psum_spad, stride=1, groups=1, cores=1) -> dict[str, jax.Array]:
    """Cycles, mapping and buffer accesses of a convolution on a row-stationary array.

    Args:
      images: ``N``, images (batch), int count(s) >= 1 (scalars or ``[L]``; may be traced).
      channels: ``C``, input channels per group, >= 1.
      filters: ``M``, filters (output channels) per group, >= 1.
      R: filter height, >= 1.
      S: filter width, >= 1.
      E: ofmap height, >= 1.
      F: ofmap width, >= 1.
      rows: PE array rows (Eyeriss: 12), >= 1.
      cols: PE array columns (Eyeriss: 14), >= 1.
      ifmap_spad: ifmap scratchpad per PE (words; Eyeriss: 12), >= 1.
      filter_spad: filter scratchpad per PE (words; Eyeriss: 224), >= 1.
      psum_spad: psum scratchpad per PE (words; Eyeriss: 24), >= 1.
      stride: ``U``, the vertical (and horizontal) stride, >= 1.
      groups: convolution groups (each runs the mapping above), >= 1.
      cores: identical arrays sharing the band jobs, >= 1.

    Returns:
      dict of arrays broadcast over the inputs. int64 (exact; float64 whole numbers in the
      relaxed mode): ``compute_cycles``; ``fill_drain_cycles`` (vertical accumulation and hops,
      part of ``compute_cycles``); ``passes`` (processing passes, all bands); ``p``, ``q``
      (filters and channels interleaved in a PE); ``bands``, ``strips``, ``row_folds``,
      ``active_pes`` (PEs of one array holding work in a band-load, the JSSC count);
      ``glb_reads_ifmap``, ``glb_reads_filter``, ``glb_reads_psum``, ``glb_writes_psum``
      (words), ``spad_accesses`` (words). float64: ``utilization`` (MACs / (cycles x rows x
      cols x cores), <= 1) and ``mapping_efficiency`` (``active_pes / (rows x cols)``).

    Examples:
      >>> g = rs_conv(4, 256, 384, 3, 3, 13, 13, 12, 14, ifmap_spad=12, filter_spad=224,
      ...             psum_spad=24)   # AlexNet CONV3, batch 4, on Eyeriss
      >>> int(g["active_pes"]), int(g["q"]), int(g["compute_cycles"])
      (156, 4, 4156160)

    References:
      Chen, Emer, Sze, ISCA 2016, Sec. IV-A/B (1-D primitives, PE sets, folding and
      replication); Chen et al., JSSC 2017, Sec. III-B (mapping onto the 12 x 14 array).
    """
    c = _relax.count
    n, C, M, R, S, E, F = (jnp.maximum(c(v), 1) for v in (images, channels, filters, R, S, E, F))
    rows, cols, U, G, cores = (jnp.maximum(c(v), 1) for v in (rows, cols, stride, groups, cores))
    sp_i, sp_f, sp_p = (jnp.maximum(c(v), 1) for v in (ifmap_spad, filter_spad, psum_spad))

    r1 = jnp.minimum(R, rows)                      # filter rows on the array
    row_folds = _ceil_div(R, r1)
    s1 = jnp.minimum(S, sp_i)                      # filter-row piece in the ifmap spad
    s_folds = _ceil_div(S, s1)
    bands = _floor_div(rows, r1)
    strips = _ceil_div(E, cols)
    q = jnp.clip(_floor_div(sp_i, s1), 1, C)
    p = jnp.clip(jnp.minimum(sp_p, _floor_div(sp_f, q * s1)), 1, M)
    c_groups = _ceil_div(C, q)
    m_groups = _ceil_div(M, p)

    job = F * M * (C * s1 + c_groups) + m_groups * c_groups * (r1 - 1)
    jobs = n * G * strips * row_folds * s_folds
    one_pass = p * F * (q * s1 + 1) + (r1 - 1)
    # a set narrower than half the array sits side by side with replicas in its band
    side = jnp.where(strips == 1, _floor_div(cols, jnp.minimum(E, cols)), 1)
    slots = bands * side * cores
    cycles = jnp.maximum(_ceil_div(jobs * job, slots), one_pass)
    overhead_total = jobs * (F * M * c_groups + m_groups * c_groups * (r1 - 1))
    fill_drain = jnp.minimum(_ceil_div(overhead_total, slots), cycles)
    passes = jobs * m_groups * c_groups

    fits = strips <= bands
    active = jnp.where(fits, _floor_div(bands, jnp.maximum(strips, 1)) * side * r1 * E,
                       bands * r1 * jnp.minimum(E, cols))
    W = (F - 1) * U + S
    in_rows = (E - strips) * U + strips * r1           # sum over strips of (e - 1) U + R'
    ifmap_reads = n * G * m_groups * C * in_rows * W * row_folds
    filter_reads = n * G * strips * M * C * r1 * row_folds * S
    psum_writes = n * G * M * E * F * c_groups * row_folds * s_folds
    psum_reads = psum_writes - n * G * M * E * F
    macs = real(n * G * M * C) * real(R * S) * real(E * F)
    padded = real(n * G * M * C) * real(r1 * row_folds * s1 * s_folds) * real(E * F)
    pes = real(rows * cols * cores)
    return {
        "compute_cycles": cycles,
        "fill_drain_cycles": fill_drain,
        "passes": passes,
        "p": p,
        "q": q,
        "bands": bands,
        "strips": strips,
        "row_folds": row_folds,
        "active_pes": active,
        "glb_reads_ifmap": ifmap_reads,
        "glb_reads_filter": filter_reads,
        "glb_reads_psum": psum_reads,
        "glb_writes_psum": psum_writes,
        "spad_accesses": 4.0 * padded,
        "utilization": macs / (real(cycles) * pes),
        "mapping_efficiency": real(active) / real(rows * cols),
    }


@exact
def rs_dram(images, channels, filters, R, E, F, cols, *, stride, ifmap_bytes, weight_bytes,
            ofmap_bytes, psum_elem_bytes, psum_capacity_bytes, ifmap_capacity_bytes,
            filter_capacity_bytes) -> dict[str, jax.Array]:
    """DRAM traffic of one convolution (one group) under row stationary's buffer-level order.

    The global buffer keeps the partial sums of a block of ``m`` filters x ``n_b`` images x one
    strip of ``e = min(E, cols)`` ofmap rows while all ``C`` channels stream through (the
    paper's processing order completes the channels of a filter block before moving on,
    ISCA 2016 Sec. V-B), so no partial sum leaves the chip. Loop order, outer to inner: strips,
    image blocks, filter blocks, channels. Then

    * filters are read once per (strip, image block): ``weight x strips x ceil(N / n_b)``, once
      if they all fit the filter capacity;
    * the ifmap is read once per filter block, each strip with its halo of ``R - U`` rows:
      ``ifmap x halo x ceil(M / m)``, once if the whole ifmap fits the ifmap capacity;
    * the ofmap is written once.

    ``m = floor(psum_capacity / (n_b e F psum_bytes))`` (at least 1, at most M), and ``n_b`` is
    the best of 1, ``ceil(N / 2)`` and ``N`` (fewest bytes). Zero compression is not modelled.

    Args:
      images: ``N``, images (counts >= 1; scalars or ``[L]``; may be traced).
      channels: ``C``, channels per group (not read: every channel streams through).
      filters: ``M``, filters per group.
      R: filter height.
      E: ofmap height.
      F: ofmap width.
      cols: PE array columns (the strip height), >= 1.
      stride: ``U`` >= 1.
      ifmap_bytes: the ifmap's bytes once (float).
      weight_bytes: the filters' bytes once.
      ofmap_bytes: the ofmap's bytes once.
      psum_elem_bytes: bytes of a partial sum.
      psum_capacity_bytes: the buffer bytes for partial sums (``ofmap_sram_bytes``).
      ifmap_capacity_bytes: the buffer bytes for ifmap rows (``ifmap_sram_bytes``).
      filter_capacity_bytes: bytes that can hold filters (``filter_sram_bytes``).

    Returns:
      float64 ``dram_read_bytes_ifmap``, ``dram_read_bytes_filter``, ``dram_write_bytes_ofmap``
      and ``filter_block`` (``m``), ``image_block`` (``n_b``) of the chosen candidate.

    References:
      Chen, Emer, Sze, ISCA 2016, Sec. V (the RS processing passes and the global buffer).
    """
    c = _relax.count
    n, C, M, R, E, F = (jnp.maximum(c(v), 1) for v in (images, channels, filters, R, E, F))
    cols, U = jnp.maximum(c(cols), 1), jnp.maximum(c(stride), 1)
    del C
    e = jnp.minimum(E, cols)
    strips = _ceil_div(E, e)
    h_in = (E - 1) * U + R
    halo = jnp.maximum(real(jnp.minimum(strips * ((e - 1) * U + R), strips * h_in)) / real(h_in),
                       1.0)
    per = real(e * F) * real(psum_elem_bytes)
    cap = real(psum_capacity_bytes)
    w_once = real(weight_bytes) <= real(filter_capacity_bytes)
    i_once = real(ifmap_bytes) <= real(ifmap_capacity_bytes)
    best: tuple[jax.Array, ...] | None = None
    for nb in (jnp.ones_like(n), _ceil_div(n, 2), n):
        m = jnp.clip(jnp.floor(cap / (real(nb) * per)), 1.0, real(M))
        rd_w = real(weight_bytes) * jnp.where(w_once, 1.0, real(strips * _ceil_div(n, nb)))
        rd_i = real(ifmap_bytes) * jnp.where(i_once, 1.0,
                                             halo * real(_ceil_div(M, c(m))))
        cand = (rd_w + rd_i, rd_i, rd_w, m, real(nb))
        if best is None:
            best = cand
        else:
            take = cand[0] < best[0]
            best = tuple(jnp.where(take, x, y) for x, y in zip(cand, best))
    assert best is not None
    return {"dram_read_bytes_ifmap": best[1], "dram_read_bytes_filter": best[2],
            "dram_write_bytes_ofmap": real(ofmap_bytes) + jnp.zeros_like(best[1]),
            "filter_block": best[3], "image_block": best[4]}

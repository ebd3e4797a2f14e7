"""Energy per action and silicon area of an NPU, from its spec's ``[technology]``, ``[energy]``
and ``[area]`` sections (pure jnp: traced, vmapped and differentiated like the cost model).

Energy per action (pJ) at the chip's node, with ``s_E = (technology.node_nm /
energy.reference_node_nm) ** energy.node_exponent`` (on-chip actions only)::

    MAC(w, a)       = s_E * (mult_int8_pj * w * a / 64 + add_int32_pj * accumulator_bits / 32)
    register byte   = s_E * register_pj_per_byte
    SRAM byte (C B) = s_E * sram_{read,write}_pj_per_byte * (C / sram_reference_bytes)
                      ** sram_energy_exponent
    vector lane op  = s_E * vector_op_pj
    DRAM byte       = dram_pj_per_byte          host op = host_op_pj
    host link byte  = host_link_pj_per_byte

The multiplier term follows the product of the operand widths and the adder term the width
(Horowitz, ISSCC 2014: 8b/32b multiply 0.2/3.1 pJ, add 0.03/0.1 pJ); SRAM energy grows with the
square root of the capacity by default (CACTI's bank organisation; Horowitz's 10/20/100 pJ per
64 bits at 8 KB/32 KB/1 MB). Area (mm^2), with ``s_A = (technology.node_nm /
area.reference_node_nm) ** area.node_exponent``::

    PE      = mult_int8_um2 * (operand_bits / 8)^2 + add_int32_um2 * accumulator_bits / 32
              + register_um2_per_bit * (2 operand_bits + accumulator_bits) + pe_extra_um2
    array   = s_A * 1e-6 * rows * cols * cores * PE
    SRAM    = s_A * 1e-6 * cores * sum over the 3 buffers of (sram_um2_per_byte * C
              + sram_periphery_um2_per_sqrt_byte * sqrt(C))
              (one term of C = onchip_sram_bytes under memory.sram_split = "per_model")
    vector  = s_A * 1e-6 * lanes * cores * vector_lane_um2

Leakage, clock tree, control and the network on chip are not modelled (see ``docs/npu_model.md``,
"Energy and area"). How a layer's actions are counted is :mod:`npujax.plan.passes.energy`.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax.numpy as jnp

from npujax.hw.spec import NpuSpec

__all__ = ["energy_scale", "area_scale", "mac_energy_pj", "sram_pj_per_byte", "AreaBreakdown",
           "area_breakdown", "area_mm2", "pe_um2"]


def _real(x: Any) -> Any:
    """A spec leaf as a float (Python numbers may exceed int32; arrays keep their dtype's
    precision and their gradient)."""
    if isinstance(x, (int, float)):
        return jnp.asarray(float(x))
    x = jnp.asarray(x)
    return x if jnp.issubdtype(x.dtype, jnp.floating) else x.astype(jnp.result_type(float))


def energy_scale(spec: NpuSpec) -> Any:
    """``(node_nm / energy.reference_node_nm) ** energy.node_exponent``: on-chip energies at
    the chip's node.

    Args:
      spec: the NPU (its leaves may be traced or batched).

    Returns:
      A float scalar (or ``[n]`` under a stacked spec).
    """
    e = spec.energy
    return (_real(spec.technology.node_nm) / _real(e.reference_node_nm)) ** _real(e.node_exponent)


def area_scale(spec: NpuSpec) -> Any:
    """``(node_nm / area.reference_node_nm) ** area.node_exponent``: areas at the chip's node."""
    ar = spec.area
    return (_real(spec.technology.node_nm) / _real(ar.reference_node_nm)) ** _real(ar.node_exponent)


def mac_energy_pj(spec: NpuSpec, weight_bits: Any, act_bits: Any) -> Any:
    """Energy of one multiply-accumulate at the given operand widths (pJ, at the chip's node).

    ``s_E * (mult_int8_pj * w * a / 64 + add_int32_pj * accumulator_bits / 32)``: an array
    multiplier's switched capacitance grows with the product of its operand widths (Horowitz,
    ISSCC 2014: 0.2 pJ at 8 bits, 3.1 pJ at 32 bits), the accumulator's adder with its width.
    Narrow operands on a wider multiplier are counted at their own widths (their upper partial
    products do not toggle); wider ones split into passes cost the same product in total.

    Args:
      spec: the NPU.
      weight_bits: weight width (bits; float, any shape broadcastable with ``act_bits``).
      act_bits: activation width (bits; float).

    Returns:
      pJ per MAC, the broadcast shape of the widths.
    """
    e = spec.energy
    w, a = jnp.asarray(weight_bits), jnp.asarray(act_bits)
    return energy_scale(spec) * (_real(e.mult_int8_pj) * w * a / 64.0 + _real(e.add_int32_pj)
                                 * _real(spec.array.accumulator_bits) / 32.0)


def sram_pj_per_byte(spec: NpuSpec, capacity_bytes: Any, *, write: bool = False) -> Any:
    """Access energy per byte of an SRAM buffer of ``capacity_bytes`` (pJ, at the chip's node).

    ``s_E * sram_{read,write}_pj_per_byte * (capacity / sram_reference_bytes) **
    sram_energy_exponent`` (CACTI-style: bit and word lines, hence the energy per access, grow
    with the square root of the capacity at the default exponent 0.5; Horowitz's 64-bit reads
    of 10, 20 and 100 pJ at 8 KB, 32 KB and 1 MB).

    Args:
      spec: the NPU.
      capacity_bytes: the buffer's capacity (bytes, > 0; any shape).
      write: the write energy instead of the read energy.

    Returns:
      pJ per byte, the shape of ``capacity_bytes``.
    """
    e = spec.energy
    per_byte = _real(e.sram_write_pj_per_byte if write else e.sram_read_pj_per_byte)
    ratio = _real(capacity_bytes) / _real(e.sram_reference_bytes)
    return energy_scale(spec) * per_byte * ratio ** _real(e.sram_energy_exponent)


class AreaBreakdown(NamedTuple):
    """Silicon area of an NPU (mm^2 at its node), from :func:`area_breakdown`.

    Attributes:
      array_mm2: the MAC arrays (all cores).
      sram_mm2: the ifmap, filter and ofmap buffers (all cores); under
        ``memory.sram_split = "per_model"`` the one shared SRAM of ``onchip_sram_bytes``
        (filter buffer included) whose split the compiler chooses per model.
      vector_mm2: the vector units (all cores).
      total_mm2: their sum.
    """

    array_mm2: Any
    sram_mm2: Any
    vector_mm2: Any
    total_mm2: Any


def pe_um2(spec: NpuSpec) -> Any:
    """Area of one PE at ``reference_node_nm`` (um^2): multiplier (product of the operand
    widths), accumulator adder (its width) and the operand and partial-sum registers."""
    a, ar = spec.array, spec.area
    ob, acc = _real(a.operand_bits), _real(a.accumulator_bits)
    return (_real(ar.mult_int8_um2) * (ob / 8.0) ** 2 + _real(ar.add_int32_um2) * acc / 32.0
            + _real(ar.register_um2_per_bit) * (2.0 * ob + acc) + _real(ar.pe_extra_um2))


def area_breakdown(spec: NpuSpec) -> AreaBreakdown:
    """Area of the array, SRAM buffers and vector unit (mm^2 at the chip's node).

    See the module docstring for the formulas. Monotone in rows, cols, cores, lanes, operand
    and accumulator widths and every buffer's bytes (under a per-model SRAM split, the shared
    SRAM's ``onchip_sram_bytes`` in place of the buffers it is split into); differentiable in
    all of them (give the spec float leaves, :func:`npujax.hw.differentiable_spec`).

    Args:
      spec: the NPU (leaves may be traced or batched).

    Returns:
      An :class:`AreaBreakdown` of float scalars (``[n]`` under a stacked spec).
    """
    a, m, ar = spec.array, spec.memory, spec.area
    s = area_scale(spec) * 1e-6
    cores = _real(a.cores)
    array = s * _real(a.rows) * _real(a.cols) * cores * pe_um2(spec)

    def buffer(c: Any) -> Any:
        c = _real(c)
        return (_real(ar.sram_um2_per_byte) * c
                + _real(ar.sram_periphery_um2_per_sqrt_byte) * jnp.sqrt(c))

    if m.sram_split == "per_model":  # one SRAM, split per model: its size is the silicon
        sram = s * cores * buffer(m.onchip_sram_bytes)
    else:
        sram = s * cores * (buffer(m.ifmap_sram_bytes) + buffer(m.filter_sram_bytes)
                            + buffer(m.ofmap_sram_bytes))
    vector = s * _real(spec.vector.lanes) * cores * _real(ar.vector_lane_um2)
    return AreaBreakdown(array, sram, vector, array + sram + vector)


def area_mm2(spec: NpuSpec) -> Any:
    """Total silicon area of the modelled blocks (mm^2): ``area_breakdown(spec).total_mm2``.

    Examples:
      >>> from npujax.hw import load_npu_spec
      >>> round(float(area_mm2(load_npu_spec("edge_16x16"))), 2)  # doctest: +SKIP
    """
    return area_breakdown(spec).total_mm2

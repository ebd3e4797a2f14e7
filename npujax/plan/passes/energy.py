"""Per-layer energy (J) next to the latency model, in pure jnp (jit, vmap over specs, grad).

Each layer's energy is the sum of the :data:`ENERGY_BREAKDOWN` components, every one an action
count of the cost model times an energy per action of :mod:`npujax.hw.energy` (pJ):

* ``mac`` — GEMM layers on the NPU: ``MACs x MAC(w_bits, a_bits)`` (true MACs; idle PEs of a
  partly filled fold cost nothing: no leakage or clock energy is modelled);
* ``register`` — the PE registers: every MAC latches its two operands (forwarded to the next
  PE) and its partial sum, ``MACs x ((w + a + accumulator_bits) / 8) x register_pj_per_byte``;
* ``sram`` — the on-chip buffers, each at its capacity's energy per byte
  (:func:`~npujax.hw.energy.sram_pj_per_byte`, per core): the array's reads of its operands
  (SCALE-Sim's SRAM reads: ``M K`` per fold of N for the ifmap, ``K N`` per fold of M for the
  filter, of :func:`npujax.systolic.gemm_cycles`, im2col duplicates included), its output writes
  (final outputs at ``a_bits``, partial sums across K folds written and read back at
  ``accumulator_bits``), and the staging of every DRAM byte through a buffer (written when it
  arrives, read when it leaves), split over the three buffers as the tiled traffic of
  :func:`npujax.systolic.gemm_memory` is; vector layers read their input from the ifmap buffer
  and write their output to the ofmap buffer (layers fused into a GEMM's output stage touch no
  SRAM), and a precision conversion reads and writes its tensor;
* ``dram`` — ``dram_bytes`` of :func:`~npujax.plan.layer_costs` (after fusion, whole bursts)
  plus a conversion's bytes, times ``dram_pj_per_byte``;
* ``vector`` — lane operations of the vector unit: ``vector_ops + special_ops x
  special_cycles_per_elem`` (a special function takes that many lane cycles) and one per element
  of a conversion, times ``vector_op_pj``;
* ``host`` — layers that fall back to the CPU: ``cpu_ops x host_op_pj + link bytes x
  host_link_pj_per_byte``.

Energy per inference is the sum over layers; the energy-delay product is ``energy x latency``
(J s; Gonzalez and Horowitz, "Energy dissipation in general purpose microprocessors", JSSC 1996).
The counts are those of the latency model, so the energy is as exact as they are; in the relaxed
mode (``relaxed=True``) it passes the same straight-through and smoothed gradients.

**As a pass** (:data:`PASS`, the last of the one cost program, :mod:`npujax.plan.program`): each
layer's energy at the DRAM bytes the earlier passes left (cross-layer placement and attention
kernels move fewer bytes), wherever the program's mode asks for energy.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

import jax
import jax.numpy as jnp

from npujax import _relax
from npujax._exact import exact, real
from npujax.hw.energy import energy_scale, mac_energy_pj, sram_pj_per_byte
from npujax.hw.spec import NpuSpec
from npujax.plan.costs import _hw, input_widths, layer_costs, split_over_cores
from npujax.plan.passes.base import CostMode, CostPass, PassInput, ProgramCosts
from npujax.plan.table import LayerTable, layer_table
from npujax.plan.workload import Workload
from npujax.systolic.dataflow import Dataflow, get_dataflow
from npujax.systolic.memory import gemm_memory

if TYPE_CHECKING:
    from npujax.plan.passes.attention import AttentionChain

__all__ = ["LayerEnergy", "layer_energy", "ENERGY_BREAKDOWN", "PASS"]

#: The energy components of a layer; they sum to its ``total_j``.
ENERGY_BREAKDOWN = ("mac", "register", "sram", "dram", "vector", "host")

_PJ = 1e-12  # joules per picojoule


class LayerEnergy(NamedTuple):
    """Energy of layers (J): ``[L]`` arrays from :func:`layer_energy`, or one layer's numbers.

    Attributes:
      mac_j: multiplies and accumulations of the MAC array.
      register_j: PE operand and partial-sum registers.
      sram_j: on-chip buffer reads and writes.
      dram_j: off-chip DRAM traffic.
      vector_j: vector-unit lane operations.
      host_j: host-CPU operations and NPU <-> host transfers of fallback layers.
      total_j: the sum of the six.
    """

    mac_j: Any
    register_j: Any
    sram_j: Any
    dram_j: Any
    vector_j: Any
    host_j: Any
    total_j: Any

    def breakdown(self) -> dict[str, Any]:
        """Joules per :data:`ENERGY_BREAKDOWN` component; they sum to ``total_j``."""
        return {k: getattr(self, f"{k}_j") for k in ENERGY_BREAKDOWN}


def layer_energy(
    layers: Sequence[Workload] | LayerTable,
    spec: NpuSpec,
    weight_bits: jax.Array,
    act_bits: jax.Array,
    dataflow: str | None = None,
    *,
    dram_bytes: jax.Array | None = None,
    relaxed: bool = False,
    temperature: float = _relax.DEFAULT_TEMPERATURE,
    count_slope: str = "unit",
) -> LayerEnergy:
    """Per-layer energy (J) of ``layers`` on ``spec`` (pure jnp; jit/vmap over ``spec``, grad).

    Args:
      layers: static workloads (from :func:`npujax.plan.workloads`) or their (possibly traced)
        :class:`~npujax.plan.LayerTable`, as in :func:`~npujax.plan.layer_costs`.
      spec: the NPU; its numeric fields may be traced or batched (:func:`npujax.hw.stack_specs`
        under ``jax.vmap``; :func:`npujax.hw.differentiable_spec` for gradients).
      weight_bits: float ``[L]`` weight width per layer (ignored for non-GEMM layers).
      act_bits: float ``[L]`` activation width per layer.
      dataflow: dataflow name (static); default the spec's.
      dram_bytes: float ``[L]`` DRAM bytes of each layer on ``spec`` (e.g. ``dram_bytes`` of
        :func:`npujax.plan.program_costs`, which reflect layer fusion); default those of
        :func:`~npujax.plan.layer_costs` of the same arguments (``relaxed`` included).
      relaxed: the differentiable mode of :func:`~npujax.plan.layer_costs` (static): same
        forward values, straight-through gradients of folds and tiles.
      temperature: as in :func:`~npujax.plan.layer_costs` (only with ``relaxed``).
      count_slope: as in :func:`~npujax.plan.layer_costs` (only with ``relaxed``).

    Returns:
      :class:`LayerEnergy` of ``[L]`` float arrays (JAX's default float type unless x64 is
      enabled); non-negative.

    Raises:
      ConfigError: an unknown dataflow, or a temperature out of range.

    Examples:
      >>> e = layer_energy(layers, spec, w, a)  # doctest: +SKIP
      >>> float(e.total_j.sum())  # joules per inference  # doctest: +SKIP
    """
    if dram_bytes is None:
        dram_bytes = layer_costs(layers, spec, weight_bits, act_bits, dataflow, relaxed=relaxed,
                                 temperature=temperature, count_slope=count_slope).dram_bytes
    if relaxed:
        with _relax.relaxed(temperature, count_slope):
            out = _layer_energy(layers, spec, weight_bits, act_bits, dataflow, dram_bytes)
    else:
        out = _layer_energy(layers, spec, weight_bits, act_bits, dataflow, dram_bytes)
    if bool(jax.config.read("jax_enable_x64")):
        return out
    return LayerEnergy(*(v.astype(jnp.float32) for v in out))


@exact
def _layer_energy(layers: Sequence[Workload] | LayerTable, spec: NpuSpec, weight_bits: jax.Array,
                  act_bits: jax.Array, dataflow: str | Dataflow | None, dram_bytes: jax.Array,
                  streamed_bytes: jax.Array | None = None) -> LayerEnergy:
    df = get_dataflow(dataflow or spec.array.dataflow)
    hw = _hw(spec)
    a, m, en = hw.array, hw.memory, hw.energy
    wb, ab = real(weight_bits), real(act_bits)
    t = layer_table(layers)
    f64 = lambda name: real(getattr(t, name))  # noqa: E731
    on_npu = jnp.asarray(t.npu)
    is_gemm = jnp.asarray(t.gemm) & on_npu
    fused = jnp.asarray(t.fused)
    M, K, N = (jnp.maximum(_relax.count(getattr(t, d)), 1) for d in "MKN")
    groups = real(_relax.count(t.groups))
    R, C, cores = a.rows, a.cols, a.cores
    fcores = real(cores)
    acc = real(a.accumulator_bits)
    macs = f64("macs")
    in_elems, out_elems = f64("in_elems"), f64("out_elems")
    s_e = energy_scale(hw)

    # array datapath and PE registers
    mac = jnp.where(is_gemm, macs * mac_energy_pj(hw, wb, ab), 0.0)
    register = jnp.where(is_gemm, macs * (wb + ab + acc) / 8.0, 0.0) * s_e * en.register_pj_per_byte

    # SRAM: the array's accesses, per core at the split the latency model chooses
    g, use_m = split_over_cores(M, K, N, R, C, cores, df)
    per_core_out = jnp.where(use_m, real(_relax.ceil_div(M, cores)) * real(N),
                             real(M) * real(_relax.ceil_div(N, cores)))
    k_acc = fcores * groups
    rd_a = k_acc * real(g["sram_reads_a"]) * ab / 8.0
    rd_b = k_acc * real(g["sram_reads_b"]) * wb / 8.0
    psums = k_acc * jnp.maximum(real(g["sram_writes_out"]) - per_core_out, 0.0) * acc / 8.0
    final = k_acc * per_core_out * ab / 8.0
    e_rd = {k: sram_pj_per_byte(hw, c) for k, c in
            (("a", m.ifmap_sram_bytes), ("b", m.filter_sram_bytes), ("o", m.ofmap_sram_bytes))}
    e_wr = {k: sram_pj_per_byte(hw, c, write=True) for k, c in
            (("a", m.ifmap_sram_bytes), ("b", m.filter_sram_bytes), ("o", m.ofmap_sram_bytes))}
    array_sram = (rd_a * e_rd["a"] + rd_b * e_rd["b"]
                  + final * e_wr["o"] + psums * (e_wr["o"] + e_rd["o"]))
    # staging of the DRAM traffic through the buffers, split as the tiled traffic is
    mem = gemm_memory(M, K, N, R, C, df, sram_bytes_a=real(m.ifmap_sram_bytes) * fcores,
                      sram_bytes_b=real(m.filter_sram_bytes) * fcores,
                      sram_bytes_out=real(m.ofmap_sram_bytes) * fcores,
                      elem_bytes_a=ab / 8.0, elem_bytes_b=wb / 8.0, elem_bytes_out=ab / 8.0,
                      dram_bytes_per_cycle=1.0, unique_elems_a=in_elems / groups)
    parts = (mem["dram_read_bytes_a"], mem["dram_read_bytes_b"],
             mem["dram_write_bytes_out"] + mem["dram_read_bytes_out"])
    total = jnp.maximum(parts[0] + parts[1] + parts[2], 1e-30)
    stage_gemm = real(dram_bytes) * (parts[0] / total * e_wr["a"] + parts[1] / total * e_wr["b"]
                                     + parts[2] / total * e_rd["o"])
    # vector layers: DRAM in (written to the ifmap buffer) and out (read from the ofmap one)
    in_b, out_b = in_elems * ab / 8.0, out_elems * ab / 8.0
    unit_vec = jnp.where(fused, 0.0, in_b * e_rd["a"] + out_b * e_wr["o"])
    stage_vec = real(dram_bytes) * 0.5 * (e_wr["a"] + e_rd["o"])

    # precision conversion of an input read at another width (as in the latency model)
    a_in, needs = input_widths(t, act_bits, on_npu)
    conv_bytes = in_elems * (a_in + ab) / 8.0
    conv_sram = in_elems * (a_in * e_rd["a"] + ab * e_wr["a"]) / 8.0

    sram = jnp.where(is_gemm, array_sram + stage_gemm,
                     jnp.where(on_npu, unit_vec + stage_vec, 0.0))
    sram = sram + jnp.where(needs, conv_sram, 0.0)
    dram = (jnp.where(on_npu, real(dram_bytes), 0.0)
            + jnp.where(needs, conv_bytes, 0.0)) * en.dram_pj_per_byte
    lane_ops = (f64("vector_ops")
                + f64("special_ops") * hw.vector.special_cycles_per_elem)
    vector = (jnp.where(on_npu & ~is_gemm, lane_ops, 0.0)
              + jnp.where(needs, in_elems, 0.0)) * s_e * en.vector_op_pj
    link_bytes = (f64("link_in_elems") + f64("link_out_elems")) * ab / 8.0
    host = jnp.where(~on_npu, f64("cpu_ops") * en.host_op_pj
                     + link_bytes * en.host_link_pj_per_byte, 0.0)
    if streamed_bytes is not None:  # weights streamed over the host link (weight_stream pass)
        host = host + real(streamed_bytes) * en.host_link_pj_per_byte
    mac, register, sram, dram, vector, host = (
        x * _PJ for x in (mac, register, sram, dram, vector, host))
    return LayerEnergy(mac_j=mac, register_j=register, sram_j=sram, dram_j=dram, vector_j=vector,
                       host_j=host, total_j=mac + register + sram + dram + vector + host)


def _applies(spec: NpuSpec, chains: tuple[AttentionChain, ...], mode: CostMode) -> bool:
    return mode.energy


def _apply(inp: PassInput, state: ProgramCosts) -> ProgramCosts:
    return state._replace(energy=_layer_energy(inp.layers, inp.spec, inp.weight_bits,
                                               inp.act_bits, inp.dataflow,
                                               state.costs.dram_bytes,
                                               state.streamed_weight_bytes))


#: Energy as the last cost pass (at the static workload sizes: not with traced shapes).
PASS = CostPass("energy", 90, _applies, _apply, traced_shapes=False)

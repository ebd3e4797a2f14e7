"""Hardware description: a frozen, validated NpuSpec loaded from a TOML preset.

Hardware is data. Every numeric field carries its unit in its name (``clock_hz``, ``sram_bytes``,
``dram_bytes_per_s``, ``link_latency_s``). A preset file has one table per section::

    name = "edge_16x16"
    description = "..."
    [array]    rows, cols, dataflow, clock_hz, operand_bits, accumulator_bits, cores,
               precision_scaling, brick_bits, group_packing (optional),
               stationary_buffering (optional), cores_per_inference (optional)
    [memory]   ifmap_sram_bytes, filter_sram_bytes, ofmap_sram_bytes, dram_bytes_per_s,
               dram_latency_s, dram_bytes (optional), core_link_bytes_per_s (optional),
               mapping (optional), parameter_cache (optional), parameter_cache_bytes
               (optional), sram_split (optional), onchip_sram_bytes (optional),
               instruction_bytes_per_op (optional)
    [vector]   lanes, special_cycles_per_elem (optional, default 4)
    [layout]   activation_layout, c0, channel_alignment, dram_burst_bytes
    [ops]      supported, fused_activations, conv_max_kernel, conv_max_stride, fusion,
               attention_fusion (optional), fallback (optional), unsupported (optional),
               resize_max_scale (optional)
    [host]     cpu_ops_per_s, link_bytes_per_s, link_latency_s, memory_bytes_per_s (optional),
               invocation_overhead_s (optional), shape_compile_s (optional),
               scalar_ops_per_s (optional), elementwise_elems_per_s (optional)
    [technology] node_nm (optional section, as the two below: every key has a default)
    [energy]   reference_node_nm, node_exponent, mult_int8_pj, add_int32_pj,
               register_pj_per_byte, sram_read_pj_per_byte, sram_write_pj_per_byte,
               sram_reference_bytes, sram_energy_exponent,
               dram_pj_per_byte, vector_op_pj, host_op_pj, host_link_pj_per_byte (optional)
    [area]     reference_node_nm, node_exponent, mult_int8_um2, add_int32_um2,
               register_um2_per_bit, pe_extra_um2, sram_um2_per_byte,
               sram_periphery_um2_per_sqrt_byte, vector_lane_um2 (optional)
    [thermal]  ambient_c, junction_to_ambient_k_per_w, time_constant_s, static_power_w,
               dvfs_thresholds_c, dvfs_clock_scales, hysteresis_c (optional section: absent,
               no throttling)

Unknown keys, missing keys, wrong types, non-positive sizes, values outside a field's physical
range (``docs/hw.md``: e.g. ``clock_hz`` in [1e3, 1e11]; they keep every latency finite and every
count exact) and unknown names are rejected with a :class:`~npujax.errors.ConfigError` that names
the file, the section, the key and the fix.
See ``docs/hw.md`` for the meaning of every field.

The spec is a JAX pytree: its numeric fields are leaves and everything else (names, dataflow,
layout, operator lists) is static. The cost model (:mod:`npujax.plan`) therefore takes the spec
itself, and ``jax.vmap`` over a spec whose leaves are arrays (:func:`stack_specs`) sweeps
hardware configurations; :meth:`NpuSpec.with_fields` changes fields with the same validation as
a preset file.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib.resources
import json
import math
import os
import tomllib
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp

from npujax.errors import ConfigError
from npujax.systolic.dataflow import DATAFLOW_NAMES, DATAFLOWS
from npujax.systolic.mapping import MAPPINGS
from npujax.systolic.precision import PRECISION_SCALINGS

__all__ = [
    "FUSION_LEVELS",
    "ATTENTION_FUSIONS",
    "PARAMETER_CACHES",
    "FALLBACK_SCOPES",
    "UNSUPPORTED_POLICIES",
    "GROUP_PACKINGS",
    "STATIONARY_BUFFERINGS",
    "ArraySpec",
    "MemorySpec",
    "VectorSpec",
    "LayoutSpec",
    "OpsSpec",
    "HostSpec",
    "TechnologySpec",
    "EnergySpec",
    "AreaSpec",
    "ThermalSpec",
    "NpuSpec",
    "DATAFLOWS",
    "MAPPINGS",
    "LAYOUTS",
    "PRECISION_SCALINGS",
    "load_npu_spec",
    "npu_spec_from_dict",
    "list_presets",
    "stack_specs",
    "differentiable_spec",
    "as_spec",
    "spec_to_toml",
    "preset_text",
]

#: Activation layouts an NPU may keep in its memory.
LAYOUTS = ("NHWC", "NCHW", "NC1HWC0")

#: What an NPU's compiler fuses across layers, each level including the ones before it:
#: ``none`` (every operator is its own layer, its activations through DRAM), ``elementwise``
#: (elementwise ops whose inputs all come from a GEMM's output stage join it), ``residual`` (also
#: an elementwise op with a second operand from an older tensor, e.g. a residual ``Add`` and the
#: activation after it) and ``layer`` (also activations kept in on-chip SRAM between layers and
#: depth-first tiling of layer pairs; see :mod:`npujax.plan.passes.cross_layer`).
FUSION_LEVELS = ("none", "elementwise", "residual", "layer")

#: How an NPU's compiler fuses an attention block (Q·Kᵀ → scale/mask → Softmax → P·V):
#: ``none`` (each op is a layer, the [heads, S_q, S_k] scores go to DRAM and back),
#: ``on_chip`` (the chain runs as one kernel when a query block's whole score rows fit in SRAM)
#: and ``flash`` (also FlashAttention tiling when they do not: K/V streamed in blocks, online
#: softmax; Dao et al., NeurIPS 2022). See :mod:`npujax.plan.passes.attention`.
ATTENTION_FUSIONS = ("none", "on_chip", "flash")

#: Where the weights live between inferences (``memory.parameter_cache``): no parameter cache,
#: or a cache whose overflow streams from DRAM or from host memory over the host link. See
#: :mod:`npujax.plan.passes.weight_stream`.
PARAMETER_CACHES = ("none", "streams_from_dram", "streams_from_host")

#: How the on-chip SRAM is divided (``memory.sram_split``): ``fixed`` (the buffers and the
#: parameter cache as the preset sizes them) or ``per_model`` (one SRAM of
#: ``onchip_sram_bytes`` shared by the parameter cache and the activations, split by the
#: compiler per model). See :mod:`npujax.plan.passes.onchip_split`.
SRAM_SPLITS = ("fixed", "per_model")


#: What falls back to the host CPU when an operator is not supported (``ops.fallback``): that
#: operator alone (``per_op``: the NPU runs everything it can, crossing the host link around
#: each unsupported operator), or that operator and every operator after it in the graph's
#: order (``rest_of_graph``: one partition, as the Coral Edge TPU compiler does,
#: coral.ai/docs/edgetpu/models-intro).
FALLBACK_SCOPES = ("per_op", "rest_of_graph")

#: What the compiler does with an operator the NPU does not run (``ops.unsupported``): fall
#: back to the host (``fallback``, the default: every figure as before), per layer the cheaper
#: of the host fallback and an exact rewrite into operators the NPU runs
#: (``rewrite_or_fallback``), or rewrite where a rule applies and refuse the model otherwise
#: (``rewrite_or_refuse``: a compiler without host fallback). The rules are
#: :mod:`npujax.ir.rewrites`; the decision is :func:`npujax.plan.decompose`'s.
UNSUPPORTED_POLICIES = ("fallback", "rewrite_or_fallback", "rewrite_or_refuse")


#: How a grouped convolution's groups share the array (``array.group_packing``): one group per
#: fold (``sequential``, SCALE-Sim's mapping) or, on a weight-stationary array, as many groups
#: as fit side by side in one fold with block-diagonal weights (``block_diagonal``: a 3x3
#: depthwise layer puts ``floor(rows / 9)`` channels on a fold instead of one).
GROUP_PACKINGS = ("sequential", "block_diagonal")

#: How a fold's stationary operand (weight stationary: the weight tile; input stationary: the
#: input tile) is loaded (``array.stationary_buffering``): ``single``, SCALE-Sim's order, shifts
#: it in before the fold streams (its fill, ``rows`` cycles, serialised with every fold);
#: ``double``, as TPU v1's matrix unit holds "one 64 KiB tile of weights plus one for
#: double-buffering (to hide the 256 cycles it takes to shift a tile in)" (Jouppi et al., ISCA
#: 2017, section 2), shifts the next fold's tile in while the current fold streams: only the
#: first fold's fill, and the part of each later fill longer than the fold before it streams,
#: is exposed.
STATIONARY_BUFFERINGS = ("single", "double")


def _field(*, zero_ok: bool = False, choices: tuple[str, ...] | None = None, default=None,
           lo: float | None = None, hi: float | None = None):
    """A spec field; numeric ones carry their physical range ``[lo, hi]`` (docs/hw.md)."""
    meta = {"zero_ok": zero_ok, "choices": choices, "lo": lo, "hi": hi}
    if default is None:
        return dataclasses.field(metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


@dataclasses.dataclass(frozen=True, kw_only=True)
class ArraySpec:
    """The systolic MAC array(s).

    Attributes:
      rows, cols: PE array height and width (PEs), >= 1.
      dataflow: default dataflow, one of :data:`DATAFLOW_NAMES` (the systolic
        :data:`DATAFLOWS` or ``row_stationary``).
      clock_hz: array clock frequency (Hz), > 0.
      operand_bits: native operand width of a MAC (bits); wider operands take
        ``ceil(w/operand_bits) * ceil(a/operand_bits)`` passes.
      accumulator_bits: width of the partial sums (bits), e.g. 32.
      cores: number of identical NPU cores sharing the DRAM bandwidth, >= 1.
      cores_per_inference: how many of the ``cores`` one inference runs on unless told otherwise
        (the runtime's default core mask), >= 0 (default 0: every core, each layer split over
        them). A multi-core NPU whose runtime gives a model one core by default (Rockchip's
        RKNN, ``RKNN_NPU_CORE_AUTO``) sets 1: the cost program then costs every layer on
        ``min(cores, cores_per_inference)`` cores with the whole DRAM bandwidth
        (:func:`npujax.plan.program_costs`), while co-resident and pipelined schedules
        (:mod:`npujax.plan.coresident`, :mod:`npujax.plan.pipeline`) still share out all
        ``cores``.
      precision_scaling: how narrower operands speed the array up:

        * ``fixed`` — a fixed-width int array: narrower operands run at the same speed, wider
          ones take ``ceil(w/operand_bits) * ceil(a/operand_bits)`` passes;
        * ``bit_composable`` — Bit Fusion (Sharma et al., ISCA 2018): each PE is a Fusion Unit
          of ``(operand_bits/brick_bits)^2`` BitBricks that fuse into
          ``(operand_bits/brick_bits)^2 / (ceil(w/brick_bits) * ceil(a/brick_bits))`` MACs
          per cycle, so streaming time scales by the inverse;
        * ``bit_serial`` — Loom (Sharify et al., DAC 2018): weights and activations are
          processed bit-serially, streaming time scales by ``w * a / operand_bits^2``.
      brick_bits: operand width of a BitBrick for ``bit_composable`` (e.g. 2); ignored otherwise.
      group_packing: how a grouped convolution's groups (depthwise: one per channel) share the
        array, one of :data:`GROUP_PACKINGS` (default ``sequential``: each group is its own
        GEMM, one after the other). ``block_diagonal``: on a weight-stationary array,
        ``P = min(groups, floor(rows / K), floor(cols / N))`` groups (``K``, ``N`` a group's)
        are loaded side by side as one block-diagonal weight tile, each row fed by its own
        group's input stream and each column summing its own group's rows, so one fold of
        ``M`` streamed pixels computes ``P`` groups. Output- and input-stationary arrays share
        the streamed operand along a row and cannot; they stay sequential.
      stationary_buffering: how a fold's stationary tile is loaded, one of
        :data:`STATIONARY_BUFFERINGS` (default ``single``: SCALE-Sim's serialised fill;
        ``double``: the next fold's tile shifts in while the current fold streams, the TPU's
        double-buffered weight tile). Weight- and input-stationary only: an
        output-stationary fold has no fill, and row stationary keeps its own model.
      ifmap_spad_words, filter_spad_words, psum_spad_words: per-PE scratchpads of the
        ``row_stationary`` dataflow (words of ``operand_bits``), read only by it
        (:func:`npujax.systolic.rs_conv`); the defaults are Eyeriss's 12, 224 and 24 x 16 b
        (Chen et al., JSSC 2017, Sec. IV).
    """

    rows: int = _field(lo=1, hi=2**16)
    cols: int = _field(lo=1, hi=2**16)
    dataflow: str = _field(choices=DATAFLOW_NAMES)
    clock_hz: float = _field(lo=1e3, hi=1e11)
    operand_bits: int = _field(lo=1, hi=64)
    accumulator_bits: int = _field(lo=1, hi=128)
    cores: int = _field(lo=1, hi=2**16)
    cores_per_inference: int = _field(zero_ok=True, default=0, lo=0, hi=2**16)
    precision_scaling: str = _field(choices=PRECISION_SCALINGS)
    brick_bits: int = _field(lo=1, hi=64)
    group_packing: str = _field(choices=GROUP_PACKINGS, default="sequential")
    stationary_buffering: str = _field(choices=STATIONARY_BUFFERINGS, default="single")
    ifmap_spad_words: int = _field(lo=1, hi=2**20, default=12)
    filter_spad_words: int = _field(lo=1, hi=2**20, default=224)
    psum_spad_words: int = _field(lo=1, hi=2**20, default=24)


@dataclasses.dataclass(frozen=True, kw_only=True)
class MemorySpec:
    """On-chip SRAM buffers (one per GEMM operand, as in SCALE-Sim) and off-chip DRAM.

    A unified buffer is described by splitting it per operand the way its compiler allocates it.

    Attributes:
      ifmap_sram_bytes, filter_sram_bytes, ofmap_sram_bytes: buffer capacities (bytes), >= 1.
      dram_bytes_per_s: sustained DRAM bandwidth (bytes/s), > 0.
      dram_latency_s: latency of the first access of a DMA transfer (s), >= 0.
      dram_bytes: DRAM capacity available to the NPU's models (bytes; a float, capacities
        exceed 2^31); 0 (default) = unlimited.
        Co-resident models whose weights and activations exceed it swap weights in over the
        host link (:mod:`npujax.plan.coresident`).
      core_link_bytes_per_s: bandwidth between cores (on-chip network or shared SRAM) for
        pipelined schedules (bytes/s); 0 (default) = tensors between cores go through DRAM
        (:mod:`npujax.plan.pipeline`).
      mapping: how the compiler maps a GEMM's tiles between DRAM and the SRAMs, one of
        :data:`MAPPINGS` (default ``best``: per layer the fold order and tiling with the fewest
        DRAM bytes; ``scalesim``: SCALE-Sim's fixed fold order, for cross-checks; see
        :mod:`npujax.systolic.mapping`).
      parameter_cache: where the weights live between inferences, one of
        :data:`PARAMETER_CACHES` (default ``none``: every layer reads its weights from DRAM as
        tiled; ``streams_from_dram``: an on-chip parameter cache of ``parameter_cache_bytes``
        keeps the weights of the first layers, in schedule order, across inferences, and the
        other layers read theirs from DRAM; ``streams_from_host``: the same, the other layers'
        weights streamed from host memory over the host link on every inference, as the Coral
        Edge TPU does; see :mod:`npujax.plan.passes.weight_stream`).
      parameter_cache_bytes: the parameter cache's capacity (bytes), >= 0 (default 0).
      sram_split: how the on-chip SRAM is divided, one of :data:`SRAM_SPLITS` (default
        ``fixed``: the buffers and the cache as sized here; ``per_model``: one SRAM of
        ``onchip_sram_bytes`` shared by the parameter cache and the activation buffers, split
        by the compiler per model, overriding ``ifmap_sram_bytes``, ``ofmap_sram_bytes`` and
        ``parameter_cache_bytes``; see :mod:`npujax.plan.passes.onchip_split`).
      onchip_sram_bytes: the shared SRAM of ``sram_split = "per_model"`` (bytes, the filter
        buffer included), >= 0 (default 0).
      instruction_bytes_per_op: compiled instructions per NPU operation that the NPU reads
        from off-chip memory on every inference, before it computes (bytes, a float), >= 0
        (default 0: the instructions stay on chip); see
        :mod:`npujax.plan.passes.instruction_stream`.
    """

    ifmap_sram_bytes: int = _field(lo=1, hi=2**40)
    filter_sram_bytes: int = _field(lo=1, hi=2**40)
    ofmap_sram_bytes: int = _field(lo=1, hi=2**40)
    dram_bytes_per_s: float = _field(lo=1e3, hi=1e15)
    dram_latency_s: float = _field(zero_ok=True, lo=0.0, hi=1.0)
    dram_bytes: float = _field(zero_ok=True, default=0.0, lo=0.0, hi=2.0**50)
    core_link_bytes_per_s: float = _field(zero_ok=True, default=0.0, lo=0.0, hi=1e15)
    mapping: str = _field(choices=MAPPINGS, default="best")
    parameter_cache: str = _field(choices=PARAMETER_CACHES, default="none")
    parameter_cache_bytes: int = _field(zero_ok=True, default=0, lo=0, hi=2**40)
    sram_split: str = _field(choices=SRAM_SPLITS, default="fixed")
    onchip_sram_bytes: int = _field(zero_ok=True, default=0, lo=0, hi=2**40)
    instruction_bytes_per_op: float = _field(zero_ok=True, default=0.0, lo=0.0, hi=2.0**30)


@dataclasses.dataclass(frozen=True, kw_only=True)
class VectorSpec:
    """The vector unit for pooling, elementwise and activation ops not fused into a GEMM.

    Attributes:
      lanes: elements processed per clock cycle, >= 1.
      special_cycles_per_elem: lane cycles of one special-function evaluation (exp, erf, tanh,
        reciprocal, rsqrt) on the special-function unit, > 0 (default 4: a lookup table plus
        a few Newton or polynomial steps, as in the softmax units of NPU papers such as
        Stevens et al., "Softermax", DAC 2021, arXiv:2103.09301).
    """

    lanes: int = _field(lo=1, hi=2**20)
    special_cycles_per_elem: float = _field(default=4.0, lo=0.0625, hi=2**16)


@dataclasses.dataclass(frozen=True, kw_only=True)
class LayoutSpec:
    """How activations are laid out in NPU memory.

    Attributes:
      activation_layout: ``NHWC``, ``NCHW`` or ``NC1HWC0`` (channels split into C1 blocks of C0).
      c0: channel block of ``NC1HWC0`` (channels per block), >= 1.
      channel_alignment: channels are padded up to a multiple of this (compute and bytes), >= 1.
      dram_burst_bytes: DMA granularity; every transfer is rounded up to whole bursts, >= 1.
    """

    activation_layout: str = _field(choices=LAYOUTS)
    c0: int = _field(lo=1, hi=2**12)
    channel_alignment: int = _field(lo=1, hi=2**12)
    dram_burst_bytes: int = _field(lo=1, hi=2**20)


@dataclasses.dataclass(frozen=True, kw_only=True)
class OpsSpec:
    """Operators the NPU runs natively; anything else falls back to the host CPU.

    Attributes:
      supported: ONNX-style operator names run on the NPU (GEMM ops on the array, the rest on
        the vector unit), e.g. ``["Conv", "Gemm", "MaxPool", "AveragePool", "Add"]``.
      fused_activations: activations the array's output stage applies for free after a GEMM.
      conv_max_kernel: largest supported kernel height/width (pixels), >= 1.
      conv_max_stride: largest supported stride, >= 1.
      fusion: what the compiler fuses across layers, one of :data:`FUSION_LEVELS` (default
        ``elementwise``: elementwise epilogues only).
      attention_fusion: how the compiler fuses attention blocks, one of
        :data:`ATTENTION_FUSIONS` (default ``none``; :mod:`npujax.plan.passes.attention`).
      fallback: what runs on the host when an operator is not supported, one of
        :data:`FALLBACK_SCOPES` (default ``per_op``).
      unsupported: fall back, rewrite or refuse an unsupported operator, one of
        :data:`UNSUPPORTED_POLICIES` (default ``fallback``).
      resize_max_scale: the largest upscaling factor (output over input size, on any axis) of a
        ``Resize`` the NPU runs, >= 0 (default 0: any); a larger one is not supported and
        falls back (a compiler that keeps large bilinear upscales on the CPU to avoid
        fixed-point interpolation error, as the Edge TPU compiler documents).
    """

    supported: tuple[str, ...] = _field()
    fused_activations: tuple[str, ...] = _field()
    conv_max_kernel: int = _field(lo=1, hi=2**16)
    conv_max_stride: int = _field(lo=1, hi=2**16)
    fusion: str = _field(choices=FUSION_LEVELS, default="elementwise")
    attention_fusion: str = _field(choices=ATTENTION_FUSIONS, default="none")
    fallback: str = _field(choices=FALLBACK_SCOPES, default="per_op")
    unsupported: str = _field(choices=UNSUPPORTED_POLICIES, default="fallback")
    resize_max_scale: float = _field(zero_ok=True, default=0.0, lo=0.0, hi=1e6)


@dataclasses.dataclass(frozen=True, kw_only=True)
class HostSpec:
    """The host CPU that runs unsupported operators, and the link between it and the NPU.

    Attributes:
      cpu_ops_per_s: sustained CPU throughput (operations/s; a MAC counts as 2), > 0.
      link_bytes_per_s: NPU <-> host transfer bandwidth (bytes/s), > 0.
      link_latency_s: fixed cost of one transfer (synchronisation, driver) (s), >= 0.
      memory_bytes_per_s: the host's sustained memory bandwidth (bytes/s), >= 0 (default 0:
        not modelled). A fallback layer takes ``max(cpu_ops / cpu_ops_per_s, bytes /
        memory_bytes_per_s)``, its bytes its inputs, output and weights at their widths: the
        roofline of the host (Williams et al., CACM 2009), so a large elementwise or pooling
        layer on the host is priced by the bytes it moves, not only by its operations.
      invocation_overhead_s: a fixed cost per inference (s), >= 0 (default 0): the runtime's
        call into the NPU and the link's round trips of the graph's input and output
        (:mod:`npujax.plan.passes.invocation`).
      shape_compile_s: time to compile (or reload) the model for a new input shape (s), >= 0
        (default 0: not modelled); the cost of a compiled bucket in
        :mod:`npujax.plan.buckets`. Not part of any per-inference latency.
      scalar_ops_per_s: one host core's throughput on scalar, branching code (operations/s),
        >= 0 (default 0: ``cpu_ops_per_s``): the host stages that neither vectorise nor split
        over cores (non-maximum suppression, CTC decoding, top-k) of the pipeline around the
        NPU (:mod:`npujax.plan.host_pipeline`).
      elementwise_elems_per_s: the host runtime's throughput on the kernels of fallback layers
        that are not GEMMs (elementwise, casts and (de)quantization, copies and
        concatenations, reductions, resizes, ArgMax; elements/s, each element of the layer's
        largest tensor counted once), >= 0 (default 0: such a layer's operations at
        ``cpu_ops_per_s``). An inference runtime's int8 GEMMs are vectorised and threaded; its
        other kernels are mostly single-threaded loops of tens of instructions per element
        (requantization, index arithmetic), an order or two slower per element than a MAC.
    """

    cpu_ops_per_s: float = _field(lo=1e3, hi=1e16)
    link_bytes_per_s: float = _field(lo=1e3, hi=1e15)
    link_latency_s: float = _field(zero_ok=True, lo=0.0, hi=10.0)
    memory_bytes_per_s: float = _field(zero_ok=True, default=0.0, lo=0.0, hi=1e15)
    invocation_overhead_s: float = _field(zero_ok=True, default=0.0, lo=0.0, hi=10.0)
    shape_compile_s: float = _field(zero_ok=True, default=0.0, lo=0.0, hi=1e5)
    scalar_ops_per_s: float = _field(zero_ok=True, default=0.0, lo=0.0, hi=1e16)
    elementwise_elems_per_s: float = _field(zero_ok=True, default=0.0, lo=0.0, hi=1e16)


@dataclasses.dataclass(frozen=True, kw_only=True)
class TechnologySpec:
    """The chip's process node.

    The ``[energy]`` and ``[area]`` sections each give their figures at their own
    ``reference_node_nm`` (default 45 nm, the node of Horowitz's tables) and scale them to
    ``node_nm`` by ``(node_nm / reference_node_nm) ** node_exponent`` (see
    :mod:`npujax.hw.energy`).

    Attributes:
      node_nm: the chip's process node (nm), in [1, 1000]; default 45.
    """

    node_nm: float = _field(default=45.0, lo=1.0, hi=1000.0)


@dataclasses.dataclass(frozen=True, kw_only=True)
class EnergySpec:
    """Energy per action (pJ), at ``technology.reference_node_nm``; see :mod:`npujax.hw.energy`
    for how they combine (and ``docs/npu_model.md``, "Energy and area").

    Defaults are Horowitz, "Computing's energy problem (and what we can do about it)", ISSCC
    2014, 45 nm at 0.9 V: 8b add 0.03 pJ, 8b multiply 0.2 pJ, 32b add 0.1 pJ, 32b multiply
    3.1 pJ; a 64-bit SRAM access of 10 pJ at 8 KB, 20 pJ at 32 KB, 100 pJ at 1 MB; DRAM 1.3-2.6
    nJ per 64 bits; about 70 pJ per instruction of an in-order core. A zero switches an action's
    energy off (e.g. to compare with a tool that does not count it).

    The on-chip figures scale to the chip's node by ``s_E = (technology.node_nm /
    reference_node_nm) ** node_exponent``; the default exponent 1 is classical scaling at a
    flat supply voltage (switched capacitance, hence ``C V^2``, proportional to the feature
    size; the supply has stayed near 0.8-0.9 V since 45 nm). Stillmaker and Baas (Integration
    58, 2017) show such rules can err by large factors below 45 nm: a preset whose source gives
    figures at its own node sets ``reference_node_nm`` to it and gives them. DRAM and host
    figures are off-chip and not scaled.

    Attributes:
      reference_node_nm: node at which this section's figures hold (nm); default 45.
      node_exponent: exponent of the on-chip energy scaling, in [0, 4]; default 1.
      mult_int8_pj: an 8b x 8b multiply (pJ); a ``w``-bit by ``a``-bit multiply costs
        ``mult_int8_pj * w * a / 64`` (array multipliers grow with the product of the widths:
        8b 0.2 pJ to 32b 3.1 pJ is 15.5x for 16x the product). Default 0.2.
      add_int32_pj: a 32-bit add (pJ); the MAC's accumulation at ``accumulator_bits`` costs
        ``add_int32_pj * accumulator_bits / 32`` (adders grow with the width). Default 0.1.
      register_pj_per_byte: writing a byte into a PE's pipeline or partial-sum register (pJ);
        default 0.03 (Horowitz gives no register figure: a flip-flop bit toggles about as much
        as a full-adder bit, so a byte costs about an 8b add).
      sram_read_pj_per_byte, sram_write_pj_per_byte: SRAM access energy per byte of a buffer of
        ``sram_reference_bytes`` (pJ); default 1.25 (10 pJ per 64-bit read of 8 KB).
      sram_reference_bytes: capacity at which the two above hold (bytes); default 8192.
      sram_energy_exponent: access energy grows as ``(capacity / sram_reference_bytes) **
        sram_energy_exponent`` (CACTI: bit- and word-line lengths grow with the square root of
        a bank's capacity); default 0.5 (Horowitz: 8 KB -> 32 KB doubles it, 1 MB gives 113 pJ
        against 100 pJ measured).
      dram_pj_per_byte: off-chip DRAM access per byte (pJ, interface included; not node
        scaled); default 162.5 (1.3 nJ per 64 bits, the low end of Horowitz's DDR3 range).
      vector_op_pj: one lane operation of the vector unit (pJ); default 0.1 (a 32-bit add).
      host_op_pj: one operation of the host CPU (pJ, not node scaled); default 70 (Horowitz's
        energy per instruction of an in-order core, mostly fetch and control).
      host_link_pj_per_byte: moving a byte between the NPU and the host (pJ, not node scaled);
        default 325 (the copy writes and reads DRAM: twice ``dram_pj_per_byte``).
    """

    reference_node_nm: float = _field(default=45.0, lo=1.0, hi=1000.0)
    node_exponent: float = _field(zero_ok=True, default=1.0, lo=0.0, hi=4.0)
    mult_int8_pj: float = _field(zero_ok=True, default=0.2, lo=0.0, hi=1e4)
    add_int32_pj: float = _field(zero_ok=True, default=0.1, lo=0.0, hi=1e4)
    register_pj_per_byte: float = _field(zero_ok=True, default=0.03, lo=0.0, hi=1e4)
    sram_read_pj_per_byte: float = _field(zero_ok=True, default=1.25, lo=0.0, hi=1e5)
    sram_write_pj_per_byte: float = _field(zero_ok=True, default=1.25, lo=0.0, hi=1e5)
    sram_reference_bytes: float = _field(default=8192.0, lo=1.0, hi=2.0**40)
    sram_energy_exponent: float = _field(zero_ok=True, default=0.5, lo=0.0, hi=2.0)
    dram_pj_per_byte: float = _field(zero_ok=True, default=162.5, lo=0.0, hi=1e6)
    vector_op_pj: float = _field(zero_ok=True, default=0.1, lo=0.0, hi=1e5)
    host_op_pj: float = _field(zero_ok=True, default=70.0, lo=0.0, hi=1e6)
    host_link_pj_per_byte: float = _field(zero_ok=True, default=325.0, lo=0.0, hi=1e6)


@dataclasses.dataclass(frozen=True, kw_only=True)
class AreaSpec:
    """Silicon area of the array, SRAMs and vector unit (um^2), at
    ``technology.reference_node_nm``; see :func:`npujax.hw.area_mm2`.

    Defaults: Horowitz (ISSCC 2014, 45 nm) gives 282 um^2 for an 8b multiplier and 137 um^2
    for a 32b adder (and 3495 um^2 for a 32b multiplier); a 45 nm D flip-flop is about 4.5
    um^2 (Nangate 45 nm open cell library, DFF_X1); Intel's 45 nm 6T SRAM cell is 0.346 um^2
    (Mistry et al., IEDM 2007), 2.77 um^2 per byte. The SRAM periphery (decoders, sense
    amplifiers, drivers) grows with the edge of the cell array, ``sqrt(capacity)`` (as in
    CACTI's organisation); 250 um^2 per sqrt(byte) makes it half the cell area at 8 KB and 8 %
    at 1 MB (an assumption, not a measurement). Areas scale to the chip's node by ``s_A =
    (technology.node_nm / reference_node_nm) ** node_exponent`` (default 2: classical area
    scaling with the square of the feature size).

    Attributes:
      reference_node_nm: node at which this section's figures hold (nm); default 45.
      node_exponent: exponent of the area scaling, in [0, 4]; default 2.
      mult_int8_um2: an 8b x 8b multiplier (um^2); scales with the product of the operand
        widths. Default 282.
      add_int32_um2: a 32-bit adder (um^2); scales with the width. Default 137.
      register_um2_per_bit: a flip-flop (um^2); a PE holds ``2 operand_bits +
        accumulator_bits`` of them. Default 4.5.
      pe_extra_um2: any further area per PE (operand double buffers, skew registers, muxes,
        wiring), for a preset whose source gives its PE area (um^2); default 0.
      sram_um2_per_byte: SRAM cell array per byte (um^2); default 2.77.
      sram_periphery_um2_per_sqrt_byte: SRAM periphery per square root of a buffer's bytes
        (um^2); default 250.
      vector_lane_um2: one lane of the vector unit (um^2); default 3632 (a 32b multiplier and
        a 32b adder).
    """

    reference_node_nm: float = _field(default=45.0, lo=1.0, hi=1000.0)
    node_exponent: float = _field(zero_ok=True, default=2.0, lo=0.0, hi=4.0)
    mult_int8_um2: float = _field(zero_ok=True, default=282.0, lo=0.0, hi=1e8)
    add_int32_um2: float = _field(zero_ok=True, default=137.0, lo=0.0, hi=1e8)
    register_um2_per_bit: float = _field(zero_ok=True, default=4.5, lo=0.0, hi=1e6)
    pe_extra_um2: float = _field(zero_ok=True, default=0.0, lo=0.0, hi=1e9)
    sram_um2_per_byte: float = _field(zero_ok=True, default=2.77, lo=0.0, hi=1e6)
    sram_periphery_um2_per_sqrt_byte: float = _field(zero_ok=True, default=250.0, lo=0.0,
                                                     hi=1e8)
    vector_lane_um2: float = _field(zero_ok=True, default=3632.0, lo=0.0, hi=1e9)


@dataclasses.dataclass(frozen=True, kw_only=True)
class ThermalSpec:
    """The chip's first-order thermal model and its DVFS (throttling) table; see
    :mod:`npujax.plan.thermal` (and ``docs/npu_model.md``, "Thermal throttling").

    During continuous inference the chip dissipates ``P = E / T + static_power_w`` (``E`` the
    energy model's joules per inference, ``T`` the latency, both at the current clock) and its
    junction follows ``T_j(t) = ambient_c + P R (1 - exp(-t / tau))`` (one thermal resistance
    ``R`` to ambient and one time constant ``tau = R C``). When ``T_j`` reaches
    ``dvfs_thresholds_c[i]`` the clock drops to ``dvfs_clock_scales[i] x array.clock_hz``; it
    rises again below ``dvfs_thresholds_c[i] - hysteresis_c``. The whole section is optional:
    without it (``junction_to_ambient_k_per_w = 0``, an empty table) nothing throttles.

    Attributes:
      ambient_c: ambient temperature (degrees C), in [-55, 125]; default 25.
      junction_to_ambient_k_per_w: thermal resistance junction to ambient (K/W), >= 0; default
        0 (no thermal model).
      time_constant_s: the thermal time constant ``R C`` (s), > 0; default 60.
      static_power_w: power drawn whatever the work (leakage, clock tree, I/O), which the
        energy model's per-action energies leave out (W), >= 0; default 0.
      dvfs_thresholds_c: the junction temperatures (degrees C) at which the clock steps down,
        strictly increasing and above ``ambient_c``; default none.
      dvfs_clock_scales: the clock of each step as a fraction of ``array.clock_hz``, strictly
        decreasing, in (0, 1), one per threshold (a clock divider of 2 is 0.5).
      hysteresis_c: how far below a threshold the junction must cool before the clock steps
        back up (K), >= 0 and below the gap between two thresholds; default 0.
    """

    ambient_c: float = _field(zero_ok=True, default=25.0, lo=-55.0, hi=125.0)
    junction_to_ambient_k_per_w: float = _field(zero_ok=True, default=0.0, lo=0.0, hi=1e4)
    time_constant_s: float = _field(default=60.0, lo=1e-6, hi=1e7)
    static_power_w: float = _field(zero_ok=True, default=0.0, lo=0.0, hi=1e5)
    dvfs_thresholds_c: tuple[float, ...] = _field(default=(), lo=-55.0, hi=250.0)
    dvfs_clock_scales: tuple[float, ...] = _field(default=(), lo=0.0, hi=1.0)
    hysteresis_c: float = _field(zero_ok=True, default=0.0, lo=0.0, hi=100.0)


@dataclasses.dataclass(frozen=True, kw_only=True)
class NpuSpec:
    """A complete NPU description (see the module docstring for the TOML layout).

    Attributes:
      name: preset name.
      description: free text, including the sources of the figures.
      array, memory, vector, layout, ops, host: the sections.
      technology, energy, area: the optional sections of the energy and area model (their
        defaults when a preset leaves them out).
      thermal: the optional thermal model and DVFS table (default: none, no throttling).
    """

    name: str
    description: str = ""
    array: ArraySpec
    memory: MemorySpec
    vector: VectorSpec
    layout: LayoutSpec
    ops: OpsSpec
    host: HostSpec
    technology: TechnologySpec = dataclasses.field(default_factory=TechnologySpec)
    energy: EnergySpec = dataclasses.field(default_factory=EnergySpec)
    area: AreaSpec = dataclasses.field(default_factory=AreaSpec)
    thermal: ThermalSpec = dataclasses.field(default_factory=ThermalSpec)

    @property
    def peak_macs_per_s(self) -> float:
        """``cores * rows * cols * clock_hz``: the compute roof (MAC/s at native width)."""
        a = self.array
        return a.cores * a.rows * a.cols * a.clock_hz

    @property
    def dram_bytes_per_cycle(self) -> float:
        """DRAM bandwidth in bytes per array clock cycle."""
        return self.memory.dram_bytes_per_s / self.array.clock_hz

    @property
    def ridge_macs_per_byte(self) -> float:
        """Arithmetic intensity (MACs/byte) above which a layer is compute-bound (roofline)."""
        return self.peak_macs_per_s / self.memory.dram_bytes_per_s

    def with_fields(self, changes: Mapping[str, Any], name: str | None = None) -> NpuSpec:
        """A copy with ``{"section.key": value}`` changed, validated as a preset file is.

        Args:
          changes: e.g. ``{"array.rows": 32, "memory.dram_bytes_per_s": 12.8e9}``.
          name: the new spec's name (default: this one's).

        Raises:
          ConfigError: an unknown section or key, or a value a preset could not hold.

        Examples:
          >>> big = load_npu_spec("edge_16x16").with_fields({"array.rows": 32})  # doctest: +SKIP
        """
        sections = {s: dataclasses.asdict(getattr(self, s)) for s in _SECTIONS}
        for key, value in changes.items():
            section, _, field = key.partition(".")
            if section not in sections or field not in sections[section]:
                raise ConfigError(f"unknown hardware field {key!r}; use 'section.key' with "
                                  f"sections {list(_SECTIONS)} (see docs/hw.md).")
            sections[section][field] = list(value) if isinstance(value, tuple) else value
        for sec in sections.values():
            for k, v in sec.items():
                if isinstance(v, tuple):
                    sec[k] = list(v)
        return npu_spec_from_dict({"name": name or self.name, "description": self.description,
                                   **sections}, origin=f"{self.name} with {dict(changes)}")


def _section_classes(cls: type) -> dict[str, type]:
    """``{section: dataclass}`` of a spec class: its dataclass-typed fields, in declaration order
    (``name`` and ``description`` are not sections)."""
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)
            if isinstance(hints[f.name], type) and dataclasses.is_dataclass(hints[f.name])}


#: ``{section: dataclass}`` in preset order. A new section is one new field of :class:`NpuSpec`:
#: the loader, the pytree registration, ``with_fields`` and :mod:`npujax.hw.fields` follow.
_SECTIONS: dict[str, type] = _section_classes(NpuSpec)

#: Sections a preset may leave out (every key has a default: NpuSpec gives a default factory).
_OPTIONAL_SECTIONS = tuple(f.name for f in dataclasses.fields(NpuSpec)
                           if f.name in _SECTIONS and f.default_factory is not dataclasses.MISSING)


def _numeric(f: dataclasses.Field) -> bool:
    return str(f.type) in ("int", "float")


# Numeric fields are pytree leaves (traced under jit/vmap/grad); names, dataflow, layout and
# operator lists are static.
for _cls in _SECTIONS.values():
    jax.tree_util.register_dataclass(
        _cls, data_fields=[f.name for f in dataclasses.fields(_cls) if _numeric(f)],
        meta_fields=[f.name for f in dataclasses.fields(_cls) if not _numeric(f)])
jax.tree_util.register_dataclass(NpuSpec, data_fields=list(_SECTIONS),
                                 meta_fields=["name", "description"])


def stack_specs(specs: list[NpuSpec]) -> NpuSpec:
    """One spec whose numeric leaves are arrays ``[len(specs)]``, for ``jax.vmap`` over
    hardware configurations (int fields int32, float fields float32).

    Raises:
      ConfigError: no specs, or specs whose static fields (dataflow, layout, operator lists,
        precision scaling, names) differ.
    """
    if not specs:
        raise ConfigError("stack_specs needs at least one spec.")
    # object: jaxlib ships no stub for PyTreeDef, and equality is all this needs of it
    treedef: object = jax.tree.structure(specs[0])
    for s in specs[1:]:
        if treedef != jax.tree.structure(s):
            raise ConfigError(
                f"specs {specs[0].name!r} and {s.name!r} differ in static fields (dataflow, "
                "layout, operator lists, precision scaling, name); only numeric fields can be "
                "stacked for vmap.")
    return jax.tree.map(lambda *v: jnp.asarray(v), *specs)


def differentiable_spec(spec: NpuSpec, dtype: Any = None) -> NpuSpec:
    """``spec`` with every numeric field a float array, so ``jax.grad`` of the relaxed cost
    model (``layer_costs(..., relaxed=True)``) reaches the integer fields too (rows, cols,
    cores, lanes, SRAM bytes); JAX does not differentiate integers.

    Args:
      spec: the NPU.
      dtype: float dtype of the leaves; default JAX's default float (float32 unless x64 is
        enabled). In float32 a value such as 6.4e9 B/s is rounded, and the model's forward
        value is that of the rounded hardware; use float64 under ``jax.enable_x64`` for exact.

    Returns:
      The same spec with scalar float array leaves.
    """
    dt = jnp.result_type(float) if dtype is None else dtype
    return jax.tree.map(lambda v: jnp.asarray(v, dt), spec)


def _fields(cls: type) -> dict[str, dataclasses.Field]:
    return {f.name: f for f in dataclasses.fields(cls)}


def _check_value(where: str, key: str, value: Any, f: dataclasses.Field) -> Any:
    annotation = str(f.type)
    choices = f.metadata.get("choices")
    if annotation == "str":
        if not isinstance(value, str):
            raise ConfigError(f"{where}: '{key}' must be a string, got {value!r}.")
        if choices and value not in choices:
            raise ConfigError(
                f"{where}: unknown {key} {value!r}; use one of {', '.join(choices)}."
            )
        return value
    if annotation.startswith("tuple[str"):
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ConfigError(f"{where}: '{key}' must be a list of strings, got {value!r}.")
        return tuple(value)
    lo, hi = f.metadata.get("lo"), f.metadata.get("hi")
    if annotation.startswith("tuple[float"):
        if not isinstance(value, list | tuple) or not all(
                isinstance(v, int | float) and not isinstance(v, bool) for v in value):
            raise ConfigError(f"{where}: '{key}' must be a list of numbers, got {value!r}.")
        out = tuple(float(v) for v in value)
        lo_f, hi_f = float(lo or 0.0), float(hi if hi is not None else math.inf)
        bad = [v for v in out if not math.isfinite(v) or v < lo_f or v > hi_f
               or (v == 0 and not f.metadata.get("zero_ok") and lo_f == 0)]
        if bad:
            raise ConfigError(f"{where}: '{key}' holds {bad[0]!r}, outside the physical range "
                              f"({lo:g}, {hi:g}] npujax models (docs/hw.md, 'Ranges')."
                              if lo == 0 else
                              f"{where}: '{key}' holds {bad[0]!r}, outside the physical range "
                              f"[{lo:g}, {hi:g}] npujax models (docs/hw.md, 'Ranges').")
        return out
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"{where}: '{key}' must be a number, got {value!r}.")
    if annotation == "int":
        if not float(value).is_integer():
            raise ConfigError(f"{where}: '{key}' must be a whole number, got {value!r}.")
        value = int(value)
    else:
        value = float(value)
    if key.endswith("_per_s"):  # a rate: bytes/s, ops/s, elems/s
        unit = f" ({key[:-len('_per_s')].rsplit('_', 1)[-1]}/s)"
    else:
        unit = key.rsplit("_", 1)[-1] if "_" in key else ""
        unit = f" ({unit})" if unit in ("bytes", "hz", "s", "bits", "nm", "pj", "um2") else ""
    signed = lo is not None and lo < 0  # a temperature in degrees C may be negative
    if not math.isfinite(value) or (value < 0 and not signed) or (
            value == 0 and not f.metadata.get("zero_ok")):
        kind = "non-negative" if f.metadata.get("zero_ok") else "positive"
        raise ConfigError(f"{where}: '{key}' must be a {kind} finite number{unit}, got {value!r}.")
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        raise ConfigError(f"{where}: '{key}' = {value!r}{unit} is outside the physical range "
                          f"[{lo:g}, {hi:g}] npujax models (docs/hw.md, 'Ranges').")
    return value


def _build_section(where: str, cls: type, table: Any) -> Any:
    if not isinstance(table, Mapping):
        raise ConfigError(f"{where}: must be a TOML table [section], got {table!r}.")
    fields = _fields(cls)
    unknown = sorted(set(table) - set(fields))
    if unknown:
        raise ConfigError(
            f"{where}: unknown key(s) {', '.join(map(repr, unknown))}; "
            f"allowed keys are {', '.join(fields)}."
        )
    # a field with a default may be left out (a new field needs no edit of existing presets)
    missing = [name for name, f in fields.items()
               if name not in table and f.default is dataclasses.MISSING]
    if missing:
        raise ConfigError(f"{where}: missing required key(s) {', '.join(map(repr, missing))}.")
    return cls(**{name: _check_value(where, name, table[name], f) for name, f in fields.items()
                  if name in table})


def npu_spec_from_dict(data: Mapping[str, Any], origin: str = "<dict>") -> NpuSpec:
    """Validate a parsed preset and build the :class:`NpuSpec`.

    Args:
      data: the TOML document as a mapping (see the module docstring).
      origin: file name used in error messages.

    Raises:
      ConfigError: unknown/missing key or section, wrong type, non-positive size, unknown name.
    """
    allowed = {"name", "description", *_SECTIONS}
    unknown = sorted(set(data) - allowed)
    if unknown:
        raise ConfigError(
            f"{origin}: unknown top-level key(s) {', '.join(map(repr, unknown))}; "
            f"allowed: name, description and the sections [{'], ['.join(_SECTIONS)}]."
        )
    if not isinstance(data.get("name"), str) or not data["name"]:
        raise ConfigError(f"{origin}: 'name' (a non-empty string) is required.")
    missing = [s for s in _SECTIONS if s not in data and s not in _OPTIONAL_SECTIONS]
    if missing:
        raise ConfigError(
            f"{origin}: missing section(s) [{'], ['.join(missing)}]; see docs/hw.md or copy "
            "configs/npu/edge_16x16.toml."
        )
    sections = {s: _build_section(f"{origin} [{s}]", cls, data.get(s, {}))
                for s, cls in _SECTIONS.items()}
    description = data.get("description", "")
    if not isinstance(description, str):
        raise ConfigError(f"{origin}: 'description' must be a string.")
    mem = sections["memory"]
    if mem.parameter_cache == "none" and mem.parameter_cache_bytes > 0:
        raise ConfigError(
            f"{origin} [memory]: parameter_cache_bytes = {mem.parameter_cache_bytes} has no "
            "effect while parameter_cache = 'none'; set parameter_cache = 'streams_from_dram' "
            "or 'streams_from_host' (docs/hw.md), or leave parameter_cache_bytes out.")
    if (mem.sram_split == "per_model") != (mem.onchip_sram_bytes > 0):
        raise ConfigError(
            f"{origin} [memory]: sram_split = {mem.sram_split!r} with onchip_sram_bytes = "
            f"{mem.onchip_sram_bytes}: a per-model split needs the shared SRAM's size "
            "(onchip_sram_bytes > 0, more than filter_sram_bytes), and only a per-model split "
            "reads it; set both or neither (docs/hw.md).")
    if mem.sram_split == "per_model" and mem.onchip_sram_bytes <= mem.filter_sram_bytes:
        raise ConfigError(
            f"{origin} [memory]: onchip_sram_bytes = {mem.onchip_sram_bytes} leaves nothing "
            f"beside the filter buffer ({mem.filter_sram_bytes} B); give the whole on-chip "
            "SRAM, the filter buffer included.")
    scale = sections["ops"].resize_max_scale
    if 0 < scale < 1:
        raise ConfigError(
            f"{origin} [ops]: resize_max_scale = {scale:g} is below 1, and every Resize "
            "upscales by at least 1 on some axis; give the largest upscaling factor the NPU "
            "runs (>= 1), or 0 for any.")
    _check_thermal(f"{origin} [thermal]", sections["thermal"])
    return NpuSpec(name=data["name"], description=description, **sections)


def _check_thermal(where: str, th: ThermalSpec) -> None:
    """The rules between the ``[thermal]`` keys (each key's own range is checked already).

    Raises:
      ConfigError: naming the key: a table of unequal lengths, thresholds not strictly
        increasing or not above ``ambient_c``, clock scales not strictly decreasing, a table
        without a thermal resistance, or a hysteresis wider than the gap between thresholds.
    """
    t, c = th.dvfs_thresholds_c, th.dvfs_clock_scales
    if len(t) != len(c):
        raise ConfigError(f"{where}: 'dvfs_clock_scales' has {len(c)} entries but "
                          f"'dvfs_thresholds_c' has {len(t)}; give one clock scale per "
                          "threshold (the clock above that temperature).")
    if any(b <= a for a, b in zip(t, t[1:])):
        raise ConfigError(f"{where}: 'dvfs_thresholds_c' = {list(t)} must be strictly "
                          "increasing (each step throttles further as the chip heats up).")
    if c and c[0] >= 1.0:
        raise ConfigError(f"{where}: 'dvfs_clock_scales' = {list(c)} must be below 1 (a "
                          "throttled clock is a fraction of array.clock_hz).")
    if any(b >= a for a, b in zip(c, c[1:])):
        raise ConfigError(f"{where}: 'dvfs_clock_scales' = {list(c)} must be strictly "
                          "decreasing (each hotter step runs a slower clock).")
    if t and th.junction_to_ambient_k_per_w == 0:
        raise ConfigError(f"{where}: a DVFS table is given but 'junction_to_ambient_k_per_w' "
                          "= 0, so the chip never heats and never throttles; set the thermal "
                          "resistance (K/W) or drop the table.")
    if t and t[0] <= th.ambient_c:
        raise ConfigError(f"{where}: 'ambient_c' = {th.ambient_c:g} is not below the first "
                          f"DVFS threshold {t[0]:g} C: the chip would start throttled; lower "
                          "ambient_c or raise dvfs_thresholds_c.")
    if th.hysteresis_c > 0 and not t:
        raise ConfigError(f"{where}: 'hysteresis_c' = {th.hysteresis_c:g} has no effect "
                          "without a DVFS table (dvfs_thresholds_c); drop it or give the table.")
    gaps = [b - a for a, b in zip(t, t[1:])] + ([t[0] - th.ambient_c] if t else [])
    if t and th.hysteresis_c >= min(gaps):
        raise ConfigError(f"{where}: 'hysteresis_c' = {th.hysteresis_c:g} K must be below the "
                          f"smallest gap between DVFS thresholds (and ambient), {min(gaps):g} "
                          "K, so each release point lies between its neighbours.")


def list_presets() -> list[str]:
    """Names of the presets installed with npujax (``configs/npu/*.toml`` in the repository)."""
    files = importlib.resources.files("npujax.presets")
    return sorted(p.name[:-5] for p in files.iterdir() if p.name.endswith(".toml"))


def preset_text(preset: str | os.PathLike[str]) -> tuple[str, str]:
    """The TOML text of a preset file or installed preset, and a name for it in messages.

    Raises:
      ConfigError: neither a file nor an installed preset, or not UTF-8.
    """
    path = Path(preset)
    if path.is_file():
        raw, origin = path.read_bytes(), str(path)
    elif str(preset) in list_presets():
        res = importlib.resources.files("npujax.presets").joinpath(f"{preset}.toml")
        raw, origin = res.read_bytes(), f"preset {preset!r}"
    else:
        near = difflib.get_close_matches(Path(str(preset)).stem, list_presets(), n=1, cutoff=0.6)
        hint = f" Did you mean {near[0]!r}?" if near else ""
        raise ConfigError(
            f"hardware preset {str(preset)!r} not found: it is neither a file nor an installed "
            f"preset.{hint} Pass a path to a .toml file or one of: {', '.join(list_presets())}."
        )
    try:
        return raw.decode("utf-8"), origin
    except UnicodeDecodeError as e:
        raise ConfigError(f"{origin} is not valid TOML: {e}.") from None


def load_npu_spec(preset: str | os.PathLike[str]) -> NpuSpec:
    """Load and validate a hardware preset.

    Args:
      preset: a path to a ``.toml`` file, or the name of an installed preset (e.g.
        ``"edge_16x16"``, see :func:`list_presets`).

    Returns:
      The validated, frozen :class:`NpuSpec`.

    Raises:
      ConfigError: the file does not exist, is not valid TOML, or fails validation.
    """
    text, origin = preset_text(preset)
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{origin} is not valid TOML: {e}.") from None
    return npu_spec_from_dict(data, origin)


def as_spec(spec: NpuSpec | str | os.PathLike[str]) -> NpuSpec:
    """``spec`` itself, or the preset a name or TOML path names (:func:`load_npu_spec`).

    Raises:
      ConfigError: neither an :class:`NpuSpec` nor a preset name or file.
    """
    if isinstance(spec, NpuSpec):
        return spec
    if isinstance(spec, (str, os.PathLike)):
        return load_npu_spec(spec)
    raise ConfigError(f"expected an NpuSpec, a preset name or a TOML path, got "
                      f"{type(spec).__name__}; load one with npujax.load_npu_spec('edge_16x16').")


def _toml_value(v: Any) -> str:
    if isinstance(v, str):
        return json.dumps(v)  # a JSON string is a valid TOML basic string
    if isinstance(v, (tuple, list)):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    return repr(float(v))  # shortest round-trip form: '6400000000.0', '1e-07' are valid TOML


def _check_concrete(section: str, key: str, value: Any) -> None:
    if not isinstance(value, (str, int, float, tuple, list)):
        raise ConfigError(f"spec_to_toml: {section}.{key} is a {type(value).__name__}, "
                          "not a number; write a concrete spec (not a traced or stacked one).")


def spec_to_toml(spec: NpuSpec, header: str = "", *, base: str | os.PathLike[str] | None = None,
                 notes: Mapping[str, str] | None = None) -> str:
    """``spec`` as a preset file that :func:`load_npu_spec` reads back to an equal spec.

    Without ``base`` the file lists every section and key, defaults included. With ``base`` (the
    preset ``spec`` was derived from, e.g. the one a fit started from) it is that preset's own
    text, comments, sources and order kept, with only the keys whose values differ rewritten;
    each rewritten key carries an end-of-line comment (``notes[\"section.key\"]``, else
    ``changed from <old value>``) followed by the base line's own comment.

    Args:
      spec: a validated spec with Python-number fields (not traced or stacked arrays).
      header: comment text put at the top (each line prefixed with ``#``), e.g. the source.
      base: a preset name or TOML path (:func:`load_npu_spec`).
      notes: end-of-line comments for changed keys, keyed ``"section.key"``.

    Returns:
      The TOML text.

    Raises:
      ConfigError: a field is not a Python number or string (a traced or batched spec), or
        ``base`` cannot be read.
    """
    lines = [f"# {line}".rstrip() for line in header.splitlines()]
    if base is not None:
        return "\n".join(lines + [_edit_preset(spec, base, notes or {})])
    lines += [f"name = {_toml_value(spec.name)}",
              f"description = {_toml_value(spec.description)}"]
    for section in _SECTIONS:
        lines += ["", f"[{section}]"]
        for key, value in dataclasses.asdict(getattr(spec, section)).items():
            _check_concrete(section, key, value)
            lines.append(f"{key} = {_toml_value(value)}")
    return "\n".join(lines) + "\n"


def _edit_preset(spec: NpuSpec, base: str | os.PathLike[str], notes: Mapping[str, str]) -> str:
    """The base preset's TOML with the keys where ``spec`` differs rewritten (tomlkit keeps
    the comments and layout of everything else)."""
    import tomlkit

    text, origin = preset_text(base)
    doc = tomlkit.parse(text)
    old = npu_spec_from_dict(tomllib.loads(text), origin)

    def put(table: Any, key: str, value: Any, was: Any, note: str | None) -> None:
        item = tomlkit.item(list(value) if isinstance(value, tuple) else value)
        prior = table[key].trivia.comment.lstrip("# ").strip() if key in table else ""
        comment = note or f"changed from {_toml_value(was)}"
        item.comment(f"{comment}; {prior}" if prior else comment)
        table[key] = item

    for key in ("name", "description"):
        if getattr(spec, key) != getattr(old, key):
            put(doc, key, getattr(spec, key), getattr(old, key), notes.get(key))
    for section in _SECTIONS:
        new_values = dataclasses.asdict(getattr(spec, section))
        old_values = dataclasses.asdict(getattr(old, section))
        for key, value in new_values.items():
            _check_concrete(section, key, value)
            if value == old_values[key]:
                continue
            if section not in doc:
                doc[section] = tomlkit.table()
            put(doc[section], key, value, old_values[key], notes.get(f"{section}.{key}"))
    return tomlkit.dumps(doc)

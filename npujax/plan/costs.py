"""The per-layer cost model: cycles, bytes and the latency breakdown of every layer, in pure jnp.

For every layer of :func:`npujax.plan.workloads` (after BN folding and activation fusion):

**NPU GEMM layers** (Conv, Gemm) on the MAC array. The layer is split over ``cores`` along M or
along N, whichever finishes first; each core runs
``gemm_cycles(M', K, N', R, C, dataflow)`` (the fold model of :mod:`npujax.systolic`), times
``groups`` and ``passes = ceil(w_bits / operand_bits) x ceil(a_bits / operand_bits)`` (operands
wider than the array's width are split): ``compute_cycles``, of which ``fill_drain_cycles`` are
spent filling and draining the array.

**NPU vector layers** (pooling, elementwise, layout transforms, Softmax, normalizations):
``ceil((alu_ops + special_ops x special_cycles_per_elem) / (lanes x cores))``, where the special
functions (exp, erf, tanh, reciprocal, rsqrt) take ``vector.special_cycles_per_elem`` lane cycles
each.

**Memory.** Vector layers read their operands and write their output once: ``dram_bytes =
weights x w_bits/8 + bias x accumulator_bits/8 + (in + out) x a_bits/8``; GEMM layers move the
tiled traffic of the layer's DRAM-level mapping (:func:`npujax.systolic.gemm_mapping`: by default
the fold order and chunking with the fewest DRAM bytes, whose extra chunks repeat the folds' fill
and drain in ``fill_drain_cycles``; or SCALE-Sim's order, :func:`npujax.systolic.gemm_memory`:
operands re-fetched when SRAM cannot hold what a fold reuses, partial sums spilled); each tensor
is rounded up to whole DRAM bursts and ``memory_cycles = dram_bytes / (dram_bytes_per_s /
clock_hz)``. Compute and DMA are double-buffered and overlap, except the first tiles in and
the last tile out, which are exposed with the first-access latency as ``dma_cycles``; the rest
shows as ``stall_cycles = max(0, memory - exposed - compute)``, so ``latency = max(compute +
dma, memory + access latency)``.

**Precision.** How operand widths change the array's speed is the preset's
``precision_scaling`` (:mod:`npujax.systolic.precision`): every array takes ``passes`` for
operands wider than ``operand_bits``; ``fixed`` arrays gain nothing below it, ``bit_composable``
arrays (Bit Fusion) and ``bit_serial`` arrays (Loom) scale the streaming time; fill/drain is
unchanged.
A GEMM's output stage requantizes to the width its (first) consumer wants for free and vector
layers keep their width, so a chain of layers never converts; a tensor read at two widths (e.g. a
residual branch at 4 bits next to an 8-bit skip path) costs its second consumer a conversion pass
on the vector unit (``convert_cycles``: read at one width, write at the other).

**CPU layers** (operators the NPU does not support): ``fallback_cycles = max(cpu_ops /
cpu_ops_per_s, host bytes / memory_bytes_per_s)``, where a layer without MACs takes
``max(in_elems, out_elems) / elementwise_elems_per_s`` in place of the first term if the preset
gives that rate (the second term where the host's memory is
modelled) and ``transfer_cycles = link_transfers x link_latency + link_bytes /
link_bytes_per_s`` (inputs produced on the NPU go to the host, outputs used on the NPU come back).

``latency = compute + convert + dma + stall + fallback + transfer`` exactly (the breakdown
:data:`BREAKDOWN` splits compute into streaming and fill/drain), so it is never
below the roofline bound ``max(MACs / peak, bytes / bandwidth)`` (Williams, Waterman and Patterson,
"Roofline", CACM 2009); ``bound`` is ``compute``, ``memory`` or ``fallback``.

Everything after the static workloads is pure ``jnp`` of the bit widths and of the hardware
spec's numeric fields (an :class:`~npujax.hw.NpuSpec` is a pytree), so ``jax.vmap`` over a stacked
spec (:func:`npujax.hw.stack_specs`) sweeps hardware configurations and ``jax.grad`` flows to the
bit widths (burst rounding passes the gradient of the unrounded bytes straight through).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from npujax import _relax
from npujax._exact import count, exact, real
from npujax.errors import ConfigError
from npujax.hw.spec import NpuSpec
from npujax.plan.recombine import recombine
from npujax.plan.table import SHAPE_FIELDS, LayerTable, layer_table
from npujax.plan.workload import Workload
from npujax.systolic.dataflow import DATAFLOWS, Dataflow, choose, either, gemm_cycles, get_dataflow
from npujax.systolic.mapping import check_mapping, gemm_mapping
from npujax.systolic.precision import get_precision_scaling, passes
from npujax.systolic.row_stationary import rs_conv, rs_dram

__all__ = ["LayerCosts", "layer_costs", "layer_costs_by_dataflow", "first_consumers",
           "input_widths", "split_over_cores", "BREAKDOWN", "EXACT_FIELDS", "SHAPE_FIELDS"]

#: The latency components of a layer; they sum exactly to its latency. ``compute`` is the
#: streaming part of ``compute_cycles`` (the rest is ``fill_drain``).
BREAKDOWN = ("compute", "fill_drain", "convert", "dma", "stall", "fallback", "transfer")


class LayerCosts(NamedTuple):
    """Costs of layers: ``[L]`` arrays from :func:`layer_costs`, or one layer's numbers.

    Cycle figures are array clock cycles; ``latency_cycles = compute + convert + dma + stall +
    fallback + transfer`` exactly (the :data:`BREAKDOWN`). From :func:`layer_costs` the counts
    (:data:`EXACT_FIELDS`) are 64-bit and exact up to 2**53 (see ``npujax._exact``: read them
    with numpy or cast them before mixing them with 32-bit jnp code); the other fields are
    float64 inside the cost model and returned in JAX's default float type.

    Attributes:
      compute_cycles: int64, exact: MAC-array cycles (fill/drain included) or vector-unit cycles.
      fill_drain_cycles: int64, the array's fill and drain cycles (part of compute).
      convert_cycles: float, precision conversion of an input read at another width.
      dma_cycles: float, exposed DMA latency (first tiles in, last tile out).
      stall_cycles: float, memory time not hidden by compute.
      fallback_cycles: float, host-CPU time of a fallback layer.
      transfer_cycles: float, NPU <-> host transfers of a fallback layer.
      latency_cycles: float, the sum above.
      memory_cycles: float, DRAM time of the layer's traffic.
      dram_bytes: float64, DRAM bytes moved (whole bursts; an exact integer below 2**53).
      weight_dram_bytes: float64, the part of ``dram_bytes`` that reads the layer's weights
        and biases (a GEMM's stationary operand, re-fetches included; whole bursts).
      refetch_factor: float, DRAM bytes / bytes of each operand once (tiling re-reads).
      sram_peak_bytes: float, on-chip buffer bytes a GEMM layer occupies at its peak.
      folds: int64, folds of the mapping (all groups and passes).
      utilization: float, MACs / (compute cycles x PEs); 0 for non-GEMM layers.
      mapping_efficiency: float, fraction of PEs holding work, averaged over folds.
    """

    compute_cycles: Any
    fill_drain_cycles: Any
    convert_cycles: Any
    dma_cycles: Any
    stall_cycles: Any
    fallback_cycles: Any
    transfer_cycles: Any
    latency_cycles: Any
    memory_cycles: Any
    dram_bytes: Any
    weight_dram_bytes: Any
    refetch_factor: Any
    sram_peak_bytes: Any
    folds: Any
    utilization: Any
    mapping_efficiency: Any

    def breakdown(self) -> dict[str, Any]:
        """Cycles per :data:`BREAKDOWN` component; they sum to ``latency_cycles``."""
        return {
            "compute": self.compute_cycles - self.fill_drain_cycles,
            "fill_drain": self.fill_drain_cycles,
            "convert": self.convert_cycles,
            "dma": self.dma_cycles,
            "stall": self.stall_cycles,
            "fallback": self.fallback_cycles,
            "transfer": self.transfer_cycles,
        }


_ceil_div = _relax.ceil_div  # exact (float64 division, npujax._relax); straight-through relaxed


def first_consumers(layers: Sequence[Workload]) -> jax.Array:
    """Index of the first layer reading each layer's output (-1 if none), static int32 [L]."""
    return jnp.asarray(layer_table(layers).first_consumer)


def input_widths(layers: Sequence[Workload] | LayerTable, act_bits: jax.Array,
                 on_npu: jax.Array) -> tuple[jax.Array, jax.Array]:
    """The width each layer's input arrives at, and whether it needs a conversion pass.

    A GEMM's output stage requantizes to the width of its first consumer for free; a vector
    layer keeps its width. A consumer on the NPU that wants another width than it receives pays
    a conversion (read at the arriving width, written at its own).

    Args:
      layers: the workloads (``producer`` indices), or their :class:`~npujax.plan.LayerTable`
        (its columns may be traced).
      act_bits: ``[L]`` activation width per layer (float), in the dtype the caller gave it, not
        widened to float64: it is gathered, and a float64 gather cannot be differentiated
        outside the 64-bit scope (``npujax/_exact.py``).
      on_npu: bool ``[L]``, the layers the NPU runs.

    Returns:
      ``(a_in, needs)``: float64 ``[L]`` arriving widths (the layer's own without a producer)
      and bool ``[L]`` conversion flags.
    """
    t = layer_table(layers)
    bits = jnp.asarray(act_bits)
    first = jnp.asarray(t.first_consumer)
    out_width = jnp.where(jnp.asarray(t.gemm) & (first >= 0),
                          bits[jnp.maximum(first, 0)], bits)
    producer = jnp.asarray(t.producer)
    has_prod = producer >= 0
    a_in = jnp.where(has_prod, out_width[jnp.maximum(producer, 0)], bits)
    return real(a_in), has_prod & on_npu & (a_in != bits)


def split_over_cores(M, K, N, rows, cols, cores, df: Dataflow, *, bound: int | None = None
                     ) -> tuple[dict[str, jax.Array], jax.Array]:
    """The fold model of one core's share of a GEMM split over ``cores`` along M or along N,
    whichever finishes first (M on a tie).

    In the relaxed mode the gradient is the chosen split's, except at a tie (always at one
    core, where both splits are the whole layer): there it follows the split that one more
    core would choose, the one-sided derivative of ``min(by_m, by_n)`` towards more cores
    (the derivative of a minimum at a tie is the smaller of the two sides' derivatives in the
    direction of the step). The forward values are the exact mode's.

    Args:
      M: rows of the GEMM's output, ``[L]`` counts (>= 1).
      K: the reduction extent, ``[L]`` counts (>= 1).
      N: columns of the output, ``[L]`` counts (>= 1).
      rows: the array's rows (a count; scalar, may be traced).
      cols: the array's columns (likewise).
      cores: the number of cores (likewise).
      df: the dataflow.
      bound: a static upper bound of ``M``, ``K`` and ``N`` or None (the one-rounding division
        of ``npujax._relax.ceil_div``).

    Returns:
      ``(g, use_m)``: :func:`npujax.systolic.gemm_cycles`'s dict for the chosen split, and the
      bool ``[L]`` choice (True: split along M).
    """
    by_m = gemm_cycles(_ceil_div(M, cores, bound=bound), K, N, rows, cols, df, bound=bound)
    by_n = gemm_cycles(M, K, _ceil_div(N, cores, bound=bound), rows, cols, df, bound=bound)
    cm, cn = by_m["compute_cycles"], by_n["compute_cycles"]
    use_m = cm <= cn
    grad_m = use_m
    if _relax.is_relaxed():
        sg = jax.lax.stop_gradient
        more = sg(cores) + 1.0
        nm = gemm_cycles(_ceil_div(sg(M), more), K, N, rows, cols, df)["compute_cycles"]
        nn = gemm_cycles(M, K, _ceil_div(sg(N), more), rows, cols, df)["compute_cycles"]
        grad_m = jnp.where(sg(cm) == sg(cn), sg(nm) <= sg(nn), use_m)
    g = jax.tree.map(lambda x, y: _relax.select(use_m, grad_m, x, y), by_m, by_n)
    return g, use_m


def _bursts(nbytes, burst):
    """Round up to whole bursts; the gradient is that of ``nbytes`` (straight-through)."""
    rounded = jnp.ceil(nbytes / burst) * burst
    return nbytes + jax.lax.stop_gradient(rounded - nbytes)


def _hw(spec: NpuSpec) -> NpuSpec:
    """The spec's numeric leaves as jnp values: int fields int64, float fields float64 (all
    float64 in the relaxed mode, so rows, lanes, SRAM bytes... get gradients)."""
    if _relax.is_relaxed():
        return jax.tree.map(real, spec)
    return jax.tree.map(
        lambda v: count(v) if isinstance(v, int) or jnp.issubdtype(
            jnp.result_type(v), jnp.integer) else real(v), spec)


#: The :class:`LayerCosts` fields that are exact 64-bit counts whatever JAX's config.
EXACT_FIELDS = ("compute_cycles", "fill_drain_cycles", "folds", "dram_bytes",
                "weight_dram_bytes")


def layer_costs(
    layers: Sequence[Workload] | LayerTable,
    spec: NpuSpec,
    weight_bits: jax.Array,
    act_bits: jax.Array,
    dataflow: str | Dataflow | None = None,
    *,
    relaxed: bool = False,
    temperature: float = _relax.DEFAULT_TEMPERATURE,
    shapes: Mapping[str, jax.Array] | None = None,
    mapping: str | None = None,
    count_slope: str = "unit",
) -> LayerCosts:
    """Vectorised cost of ``layers`` (pure jnp; jit/vmap over ``spec``, grad w.r.t. the bits).

    Computes with 64-bit types enabled for its own tracing (``npujax._exact``), whatever
    JAX's config, so no count wraps or rounds: the counts of :data:`EXACT_FIELDS` are returned in
    64 bits (int64 cycles and folds, float64 whole DRAM bytes), exact up to 2**53; the other
    (real-valued) fields in JAX's default float type (float32 unless x64 is enabled), so they
    mix with the caller's jnp code. Gradients w.r.t. float32 bit widths are float32.

    Args:
      layers: static workloads (from :func:`npujax.plan.workloads`), or their
        :class:`~npujax.plan.LayerTable` (:func:`npujax.plan.layer_table`), which may be a
        traced argument: one compiled program then serves every workload list of its length
        (pad shorter ones, ``layer_table(layers, length)``), with the same numbers bit for bit.
      spec: the NPU; its numeric fields may be traced or batched (:func:`npujax.hw.stack_specs`
        under ``jax.vmap``).
      weight_bits: float32 ``[L]`` weight width per layer (ignored for non-GEMM layers).
      act_bits: float32 ``[L]`` activation width per layer.
      dataflow: dataflow name (static), default the spec's; or a
        :class:`~npujax.systolic.dataflow.Roles` (the systolic dataflows as data).
      relaxed: the differentiable mode (static; ``npujax/_relax.py``): every value is the same
        as in the exact mode, bit for bit (at whole-number hardware values), but ``ceil`` of
        folds, passes and tiles passes a straight-through slope, the maximum of compute and
        memory time and the buffer-residency steps pass a smoothed one, so ``jax.grad`` w.r.t.
        the bit widths and every numeric spec field (rows, cols, cores, clock_hz, SRAM bytes,
        dram_bytes_per_s, lanes, ...) is useful. Give integer fields as float arrays to
        differentiate them (:func:`npujax.hw.differentiable_spec`). The counts of
        :data:`EXACT_FIELDS` come back as float64 whole numbers (exact below 2**53).
      temperature: relative temperature of the smoothed maximum and steps (static, in (0, 10];
        only with ``relaxed``): their gradient blends both sides over about this fraction.
      shapes: ``{field: [L] array}`` of numeric workload fields (:data:`SHAPE_FIELDS`: GEMM
        extents, element and operation counts) that replace those of ``layers``, as traced
        values: one compiled program then serves every workload list of the same structure at
        other shapes (``jax.vmap`` over a sequence-length sweep, :func:`npujax.plan.
        sweep_shapes`). Pass int64/float64 arrays under ``jax.enable_x64`` to keep counts exact.
      mapping: DRAM-level mapping of the GEMM layers (static; default the spec's
        ``memory.mapping``): ``best`` (per layer the fold order and chunking with the fewest
        DRAM bytes, :func:`npujax.systolic.gemm_mapping`) or ``scalesim`` (SCALE-Sim's order).
      count_slope: with ``relaxed``, the gradient of a fold count w.r.t. the hardware count
        that divides it (rows, cols, cores, lanes; static): ``unit`` (default), the exact
        change for one unit more, so ``gradient x 1`` predicts what one more row does;
        ``mean``, the staircase's mean slope, the trend a descent over many units needs to
        cross plateaus of whole folds (:func:`npujax.search.codesign.codesign` uses it).
        ``npujax/_relax.py`` says why one slope cannot serve both.

    Returns:
      :class:`LayerCosts` of ``[L]`` arrays (see above for their dtypes).

    Raises:
      ConfigError: an unknown dataflow, precision scaling, mapping or count slope, or a
        temperature out of range.

    Examples:
      >>> import jax, jax.numpy as jnp  # doctest: +SKIP
      >>> f = lambda w: layer_costs(layers, spec, w, a, relaxed=True).latency_cycles.sum()
      >>> jax.grad(f)(w)  # cycles per bit of each layer's weights  # doctest: +SKIP

    References:
      Straight-through estimators: Bengio et al., arXiv:1308.3432. Differentiable performance
      models: DiffTune (Renda et al., MICRO 2020) and DOSA (Hong et al., MICRO 2023).
    """
    return _evaluate(layers, spec, weight_bits, act_bits, (dataflow,), relaxed, temperature,
                     shapes, mapping, count_slope)[0]


def layer_costs_by_dataflow(
    layers: Sequence[Workload] | LayerTable,
    spec: NpuSpec,
    weight_bits: jax.Array,
    act_bits: jax.Array,
    dataflows: Sequence[str] = DATAFLOWS,
    *,
    relaxed: bool = False,
    temperature: float = _relax.DEFAULT_TEMPERATURE,
    mapping: str | None = None,
    count_slope: str = "unit",
) -> dict[str, LayerCosts]:
    """:func:`layer_costs` at several dataflows in one program: ``{dataflow: LayerCosts}``.

    What does not depend on the dataflow (vector, conversion and host-CPU layers, the
    operands' bytes) is computed once, and one ``jit`` compiles all dataflows together (a
    comparison table costs one compilation and one call, not one per dataflow). Vmapped over
    many configurations on a CPU it is also somewhat faster than one :func:`layer_costs` per
    dataflow (``docs/results/cost_throughput.md``). The
    counts of :data:`EXACT_FIELDS` equal ``layer_costs(..., dataflow)``'s bit for bit; the
    real-valued fields too, up to the last bit where XLA fuses the float arithmetic of the two
    programs differently (it may turn ``x / y`` into ``x * (1 / y)``).

    Args:
      layers: static workloads (from :func:`npujax.plan.workloads`) or their (possibly traced)
        :class:`~npujax.plan.LayerTable`, as in :func:`layer_costs`.
      spec: the NPU (its own dataflow is ignored); may be traced or batched, as in
        :func:`layer_costs`.
      weight_bits: float32 ``[L]`` weight width per layer.
      act_bits: float32 ``[L]`` activation width per layer.
      dataflows: dataflow names (static; default all of :data:`npujax.systolic.DATAFLOWS`, in
        that order).
      relaxed: the differentiable mode, as in :func:`layer_costs`.
      temperature: as in :func:`layer_costs`.
      mapping: DRAM-level mapping of the GEMM layers, as in :func:`layer_costs`.
      count_slope: as in :func:`layer_costs`.

    Returns:
      ``{name: LayerCosts}`` of ``[L]`` arrays (dtypes as :func:`layer_costs`), keyed by the
      full dataflow names (``weight_stationary``, ...).

    Raises:
      ConfigError: an unknown dataflow or precision scaling, no dataflow, or a temperature out
        of range.
    """
    if not dataflows:
        raise ConfigError(f"layer_costs_by_dataflow needs at least one dataflow, e.g. "
                          f"{DATAFLOWS}.")
    names = [get_dataflow(d).name for d in dataflows]
    if len(set(names)) < len(names):
        raise ConfigError(f"layer_costs_by_dataflow got a dataflow twice: {list(dataflows)}.")
    costs = _evaluate(layers, spec, weight_bits, act_bits, tuple(names), relaxed, temperature,
                      None, mapping, count_slope)
    return dict(zip(names, costs))


def _evaluate(layers: Sequence[Workload] | LayerTable, spec: NpuSpec, weight_bits: jax.Array,
              act_bits: jax.Array, dataflows: tuple[str | Dataflow | None, ...], relaxed: bool,
              temperature: float, shapes: Mapping[str, jax.Array] | None = None,
              mapping: str | None = None, count_slope: str = "unit"
              ) -> tuple[LayerCosts, ...]:
    x64 = bool(jax.config.read("jax_enable_x64"))
    mapping = check_mapping(mapping or spec.memory.mapping)
    if relaxed:
        with _relax.relaxed(temperature, count_slope):
            costs = _layer_costs(layers, spec, weight_bits, act_bits, dataflows, shapes,
                                 mapping)
    else:
        costs = _layer_costs(layers, spec, weight_bits, act_bits, dataflows, shapes, mapping)
    if x64:
        return costs
    return tuple(c._replace(**{k: v.astype(jnp.float32) for k, v in c._asdict().items()
                               if k not in EXACT_FIELDS}) for c in costs)


@exact
def _layer_costs(layers: Sequence[Workload] | LayerTable, spec: NpuSpec, weight_bits: jax.Array,
                 act_bits: jax.Array, dataflows: tuple[str | Dataflow | None, ...],
                 shapes: Mapping[str, jax.Array] | None = None, mapping: str = "best"
                 ) -> tuple[LayerCosts, ...]:
    """The costs at each of ``dataflows`` (None: the spec's). What does not depend on the
    dataflow (vector, conversion and host layers, the operands' bytes) is traced once. (Not
    stacked: XLA:CPU emits a concatenation inside a loop fusion as a per-element branch, which
    halved the vmapped throughput.)"""
    dfs = [get_dataflow(d or spec.array.dataflow) for d in dataflows]
    scaling = get_precision_scaling(spec.array.precision_scaling)
    hw = _hw(spec)
    a, m, h = hw.array, hw.memory, hw.host
    wb = real(weight_bits)
    ab = real(act_bits)

    t = layer_table(layers)

    def num(name: str) -> Any:  # a numeric column: static, traced, or from ``shapes``
        if shapes is not None and name in shapes:
            return shapes[name]
        return getattr(t, name)

    def bound(*names: str) -> int | None:  # a static bound of the columns (None: unknown)
        if shapes is not None and any(n in shapes for n in names):
            return None
        return t.bound(*names)

    i32 = lambda name: _relax.count(num(name))  # noqa: E731  (exact counts)
    f32 = lambda name: real(num(name))  # noqa: E731  (float64)
    on_npu = jnp.asarray(t.npu)
    is_gemm = jnp.asarray(t.gemm) & on_npu
    M, K, N = (jnp.maximum(i32(d), 1) for d in "MKN")
    groups = i32("groups")
    R, C, cores = a.rows, a.cols, a.cores
    ob = real(a.operand_bits)
    clock = a.clock_hz
    n_passes = passes(wb, ab, ob)
    scale = scaling.stream_factor(wb, ab, ob, real(a.brick_bits))
    lanes = hw.vector.lanes
    special = _relax.ceil(f32("special_ops") * hw.vector.special_cycles_per_elem)
    # (special ops x cycles may pass 2**53: the wide division, exact to 2**62)
    vec_cycles = _ceil_div(i32("vector_ops") + _relax.count(special), lanes * cores,
                           wide=True)
    # static bounds of the numerators: <= 2**50 takes the one-rounding division (_relax)
    mkn = bound("M", "K", "N")

    burst = real(hw.layout.dram_burst_bytes)
    acc_bits = real(a.accumulator_bits)
    bpc = m.dram_bytes_per_s / clock
    in_elems, out_elems = f32("in_elems"), f32("out_elems")
    bias_bytes = _bursts(f32("bias_elems") * acc_bits / 8.0, burst)
    # every operand once: the traffic if SRAM were large enough (vector layers always)
    once = (_bursts(f32("weight_elems") * wb / 8.0, burst) + bias_bytes
            + _bursts(in_elems * ab / 8.0, burst) + _bursts(out_elems * ab / 8.0, burst))
    fcores = real(cores)
    sram_a = real(m.ifmap_sram_bytes) * fcores
    sram_b = real(m.filter_sram_bytes) * fcores
    sram_o = real(m.ofmap_sram_bytes) * fcores
    fused = jnp.asarray(t.fused)
    pes = real(R * C * cores)
    macs = f32("macs")

    # precision conversion: a consumer wanting another width than it receives pays a pass
    a_in, needs = input_widths(t, act_bits, on_npu)
    conv_bytes = _bursts(in_elems * a_in / 8.0, burst) + _bursts(in_elems * ab / 8.0, burst)
    conv_cycles = jnp.maximum(real(_ceil_div(i32("in_elems"), lanes * cores,
                                             bound=bound("in_elems"))),
                              conv_bytes / bpc)
    convert = jnp.where(needs, conv_cycles, 0.0)

    cpu = ~on_npu
    # the host's roofline: its operations, or the bytes it moves where its memory is modelled
    host_bytes = (f32("in_elems") + f32("out_elems")) * ab / 8.0 + f32("weight_elems") * wb / 8.0
    host_mem_s = jnp.where(h.memory_bytes_per_s > 0,
                           host_bytes / jnp.maximum(h.memory_bytes_per_s, 1.0), 0.0)
    # a GEMM at the host's MAC rate; any other kernel per element of its largest tensor at the
    # runtime's elementwise rate where the preset gives one
    host_ops_s = f32("cpu_ops") / h.cpu_ops_per_s
    host_elems_s = jnp.maximum(in_elems, out_elems) / jnp.maximum(h.elementwise_elems_per_s, 1.0)
    host_s = jnp.where((h.elementwise_elems_per_s > 0) & (macs <= 0), host_elems_s, host_ops_s)
    fallback = jnp.where(cpu, _relax.smooth_max(host_s, host_mem_s) * clock, 0.0)
    link_bytes = (f32("link_in_elems") + f32("link_out_elems")) * ab / 8.0
    transfer = jnp.where(
        cpu,
        (f32("link_transfers") * h.link_latency_s
         + link_bytes / h.link_bytes_per_s) * clock,
        0.0,
    )

    def _row_stationary(M, K, N):
        # Eyeriss's RS on one group of every GEMM row (npujax.systolic.rs_conv). A Conv row
        # (a 4-D output whose N x E x F is its M, K = C x R x S) maps as a convolution; any
        # other GEMM (FC, MatMul) as a 1 x 1 convolution with E = F = 1 over K channels for M
        # images, as Eyeriss runs FC layers. The geometry is a decision of the shapes: no
        # gradient flows through it.
        sg = jax.lax.stop_gradient
        img, rows_out = sg(i32("images")), sg(i32("out_rows"))
        kr, kc, f_out = sg(i32("window_rows")), sg(i32("window_cols")), sg(i32("out_cols"))
        one_ = jnp.ones_like(img)
        e_out = rows_out // jnp.maximum(img, 1)
        rk = jnp.maximum(kr * kc, 1)
        conv = ((img > 0) & (e_out > 0) & (f_out > 0) & (img * e_out * f_out == sg(M))
                & (sg(K) % rk == 0))
        pick = lambda x, y: jnp.where(conv, x, y)  # noqa: E731
        geo = dict(images=pick(img, M), channels=pick(K // rk, K), filters=N,
                   R=pick(kr, one_), E=pick(e_out, one_), F=pick(f_out, one_),
                   stride=pick(jnp.maximum(sg(i32("stride_rows")), 1), one_))
        rs = rs_conv(geo["images"], geo["channels"], N, geo["R"], pick(kc, one_), geo["E"],
                     geo["F"], R, C, ifmap_spad=a.ifmap_spad_words,
                     filter_spad=a.filter_spad_words, psum_spad=a.psum_spad_words,
                     stride=geo["stride"], cores=cores)
        return rs, geo

    def one(df: Dataflow) -> LayerCosts:
        # grouped convolutions: ``pack`` groups side by side per fold (block-diagonal weight
        # tiles, weight stationary only; ``array.group_packing``), a decision of the shapes
        # (no gradient), then ``ng`` packed GEMMs of K x pack rows, N x pack columns
        pack: Any = 1
        ng, Mg, Kg, Ng, packed = groups, M, K, N, mkn
        # (Python bools for a static dataflow; traced for Roles, the dataflow as data, whose
        # other dataflows then take one group per fold: the same counts, exactly)
        ws = df.is_("weight_stationary")
        if a.group_packing == "block_diagonal" and ws is not False:
            pack = jax.lax.stop_gradient(jnp.clip(jnp.minimum(R // K, C // N), 1,
                                                  jnp.maximum(groups, 1)))
            pack = choose(ws, lambda: pack, lambda: jnp.ones_like(pack))
            ng = _ceil_div(groups, pack)
            Mg, Kg, Ng, packed = M, K * pack, N * pack, None
        gn = real(ng)
        geo: dict[str, Any] = {}  # the row-stationary mapping's layer geometry
        if df.name == "row_stationary":
            rs, geo = _row_stationary(M, K, N)
            g = {"folds": rs["passes"], "mapping_efficiency": rs["mapping_efficiency"]}
            fill_drain_1 = rs["fill_drain_cycles"]
            stream_1 = real(rs["compute_cycles"] - fill_drain_1)
        else:
            g, _ = split_over_cores(Mg, Kg, Ng, R, C, cores, df, bound=packed)
            fd_per_fold = df.fill_cycles(R, C) + df.drain_cycles(R, C)
            fill_drain_1 = g["folds"] * fd_per_fold
            stream_1 = real(g["compute_cycles"] - fill_drain_1)
        stream = _relax.count(_relax.ceil(stream_1 * scale))

        # GEMM layers: the tiled traffic of the systolic memory model (SRAM capacity, reuse,
        # spills) under the chosen mapping. im2col happens on chip: the [M, K] operand costs
        # DRAM reads of its distinct elements only.
        # (a packed tile's weights are block-diagonal: 1/pack of its K x N elements exist)
        mem = gemm_mapping(Mg, Kg, Ng, R, C, df, sram_bytes_a=sram_a, sram_bytes_b=sram_b,
                           sram_bytes_out=sram_o, elem_bytes_a=ab / 8.0,
                           elem_bytes_b=wb / 8.0 / real(pack), elem_bytes_out=ab / 8.0,
                           dram_bytes_per_cycle=bpc,
                           unique_elems_a=in_elems / real(groups) * real(pack),
                           mapping=mapping, bound=packed)
        if df.name == "row_stationary":  # its own buffer-level order (rs_dram)
            fg = real(groups)
            d = rs_dram(**geo, cols=C, ifmap_bytes=in_elems / fg * ab / 8.0,
                        weight_bytes=f32("weight_elems") / fg * wb / 8.0,
                        ofmap_bytes=out_elems / fg * ab / 8.0, psum_elem_bytes=acc_bits / 8.0,
                        psum_capacity_bytes=sram_o, ifmap_capacity_bytes=sram_a,
                        filter_capacity_bytes=sram_b)
            mem = {**mem, "dram_read_bytes_a": d["dram_read_bytes_ifmap"],
                   "dram_read_bytes_b": d["dram_read_bytes_filter"],
                   "dram_write_bytes_out": d["dram_write_bytes_ofmap"],
                   "dram_read_bytes_out": jnp.zeros_like(d["dram_write_bytes_ofmap"])}
        # the mapping's chunks of the streamed dimension repeat the folds' fill and drain
        # (whole cycles, spread evenly over the cores; zero in the scalesim mapping)
        extra = mem["extra_fill_drain_cycles"]
        extra_1 = _ceil_div(_relax.count(extra if _relax.is_relaxed() else jnp.rint(extra)),
                            cores)
        gemm_total = ng * (fill_drain_1 + extra_1 + stream) * n_passes
        gemm_fill_drain = ng * (fill_drain_1 + extra_1) * n_passes
        preloads = either(ws, df.is_("input_stationary"))  # output stationary preloads nothing
        if a.stationary_buffering == "double" and preloads is not False:
            # the next fold's stationary tile shifts in while this fold streams (TPU v1's
            # double-buffered weight tile): after the layer's first fold, each fill is hidden
            # up to one fold's streaming cycles (every fold of the layer, over its packed
            # groups and precision passes; the mapping's extra chunks keep theirs)
            folds_1 = jnp.maximum(g["folds"], 1)
            per_fold = (stream / real(folds_1) if _relax.is_relaxed()
                        else stream // folds_1)
            hidden = (jnp.maximum(ng * g["folds"] * n_passes - 1, 0)
                      * jnp.minimum(df.fill_cycles(R, C), per_fold))
            hidden = choose(preloads, lambda: hidden, lambda: jnp.zeros_like(hidden))
            gemm_total = gemm_total - hidden
            gemm_fill_drain = gemm_fill_drain - hidden
        total_compute = jnp.where(is_gemm, gemm_total, jnp.where(on_npu, vec_cycles, 0))
        fill_drain = jnp.where(is_gemm, gemm_fill_drain, 0)
        tiled = (_bursts(gn * mem["dram_read_bytes_a"], burst)
                 + _bursts(gn * mem["dram_read_bytes_b"], burst) + bias_bytes
                 + _bursts(gn * (mem["dram_write_bytes_out"] + mem["dram_read_bytes_out"]),
                           burst))
        dram_bytes = jnp.where(on_npu, jnp.where(is_gemm, tiled, once), 0.0)
        weight_once = _bursts(f32("weight_elems") * wb / 8.0, burst) + bias_bytes
        weight_dram = jnp.where(on_npu, jnp.where(
            is_gemm, _bursts(gn * mem["dram_read_bytes_b"], burst) + bias_bytes, weight_once),
            0.0)
        refetch = jnp.where(on_npu, dram_bytes / jnp.maximum(once, 1.0), 0.0)
        memory = dram_bytes / bpc
        # the first tiles in and the last tile out cannot overlap compute
        exposed = jnp.where(is_gemm, jnp.minimum(mem["prologue_cycles"]
                                                 + mem["epilogue_cycles"], memory), 0.0)
        tc = real(total_compute)
        # the one recombination (npujax.plan.recombine): stall = max(memory - exposed, tc) - tc,
        # relaxed a smooth max(compute, memory); the first tiles' DMA where the layer has one
        dma, stall, latency = recombine(tc, memory, exposed, on_npu & ~fused,
                                        m.dram_latency_s * clock, convert, fallback, transfer)
        sram_peak = jnp.where(is_gemm, (
            jnp.minimum(in_elems * ab / 8.0, sram_a)
            + jnp.minimum(f32("weight_elems") * wb / 8.0, sram_b)
            + jnp.minimum(out_elems * jnp.where(mem["resident_out"], acc_bits, ab) / 8.0,
                          sram_o)), 0.0)
        zero = jnp.zeros_like(memory)
        util = jnp.where(is_gemm, macs / jnp.maximum(tc, 1.0) / pes, zero)
        return LayerCosts(
            compute_cycles=total_compute,
            fill_drain_cycles=fill_drain,
            convert_cycles=convert,
            dma_cycles=dma,
            stall_cycles=stall,
            fallback_cycles=fallback,
            transfer_cycles=transfer,
            latency_cycles=latency,
            memory_cycles=memory,
            dram_bytes=dram_bytes,
            weight_dram_bytes=weight_dram,
            refetch_factor=refetch,
            sram_peak_bytes=sram_peak,
            folds=jnp.where(is_gemm, ng * g["folds"] * n_passes, 0),
            utilization=util,
            mapping_efficiency=jnp.where(is_gemm, g["mapping_efficiency"], zero),
        )

    return tuple(one(df) for df in dfs)

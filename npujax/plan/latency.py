"""Lower a Graph onto an NpuSpec: per-layer latency with its breakdown, and end-to-end totals.

For every layer of :func:`npujax.plan.workloads` (after BN folding and activation fusion):

**NPU GEMM layers** (Conv, Gemm) on the MAC array. The layer is split over ``cores`` along M or
along N, whichever finishes first; each core runs
``gemm_cycles(M', K, N', R, C, dataflow)`` (the fold model of :mod:`npujax.systolic`), times
``groups`` and ``passes = ceil(w_bits / operand_bits) x ceil(a_bits / operand_bits)`` (operands
wider than the array's width are split): ``compute_cycles``, of which ``fill_drain_cycles`` are
spent filling and draining the array.

**NPU vector layers** (pooling, elementwise, layout transforms): ``ceil(ops / (lanes x cores))``.

**Memory.** ``dram_bytes = weights x w_bits/8 + bias x accumulator_bits/8 + (in + out) x
a_bits/8``, each tensor rounded up to whole DRAM bursts; every layer reads its operands from DRAM
and writes its output back. ``memory_cycles = dram_bytes / (dram_bytes_per_s / clock_hz)``.
Compute and DMA are double-buffered and overlap, so the DMA only shows as ``stall_cycles =
max(0, memory - compute)``; the first access latency is exposed once per layer (``dma_cycles``).

**Precision.** How operand widths change the array's speed is the preset's
``precision_scaling``: ``fixed`` arrays take ``passes`` for operands wider than
``operand_bits`` and gain nothing below it; ``bit_composable`` arrays (Bit Fusion) divide the
streaming time by ``(operand_bits/brick_bits)^2 / (ceil(w/brick_bits) * ceil(a/brick_bits))``;
``bit_serial`` arrays (Loom) multiply it by ``w * a / operand_bits^2``; fill/drain is unchanged.
A GEMM's output stage requantizes to the width its (first) consumer wants for free and vector
layers keep their width, so a chain of layers never converts; a tensor read at two widths (e.g. a
residual branch at 4 bits next to an 8-bit skip path) costs its second consumer a conversion pass
on the vector unit (``convert_cycles``: read at one width, write at the other).

**CPU layers** (operators the NPU does not support): ``fallback_cycles = cpu_ops /
cpu_ops_per_s`` and ``transfer_cycles = link_transfers x link_latency + link_bytes /
link_bytes_per_s`` (inputs produced on the NPU go to the host, outputs used on the NPU come back).

``latency = compute + convert + dma + stall + fallback + transfer`` exactly (the breakdown
:data:`BREAKDOWN` splits compute into streaming and fill/drain), so it is never
below the roofline bound ``max(MACs / peak, bytes / bandwidth)`` (Williams, Waterman and Patterson,
"Roofline", CACM 2009); ``bound`` is ``compute``, ``memory`` or ``fallback``.

Everything after the static workloads is pure ``jnp`` of the bit widths and of the hardware numbers
(:class:`HwParams`), so ``jax.vmap`` sweeps hardware configurations and ``jax.grad`` flows to the
bit widths (burst rounding passes the gradient of the unrounded bytes straight through).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from npujax.errors import ConfigError, QuantizationError
from npujax.hw.spec import NpuSpec
from npujax.ir.graph import Graph
from npujax.ir.passes import rebatch
from npujax.plan.liveness import peak_activation_bytes
from npujax.plan.workload import Workload, workloads
from npujax.systolic.dataflow import gemm_cycles, get_dataflow
from npujax.systolic.memory import gemm_memory

__all__ = ["HwParams", "LayerReport", "Schedule", "layer_costs", "lower", "BREAKDOWN"]

#: The latency components of a layer; they sum exactly to its latency. ``compute`` is the
#: streaming part of ``compute_cycles`` (the rest is ``fill_drain``).
BREAKDOWN = ("compute", "fill_drain", "convert", "dma", "stall", "fallback", "transfer")


class HwParams(NamedTuple):
    """The numeric hardware parameters as a pytree of scalars (or arrays, to ``vmap`` over).

    Fields mirror :class:`~npujax.hw.NpuSpec` (same names and units).
    """

    rows: Any
    cols: Any
    cores: Any
    clock_hz: Any
    operand_bits: Any
    accumulator_bits: Any
    dram_bytes_per_s: Any
    dram_latency_s: Any
    dram_burst_bytes: Any
    ifmap_sram_bytes: Any
    filter_sram_bytes: Any
    ofmap_sram_bytes: Any
    lanes: Any
    brick_bits: Any
    cpu_ops_per_s: Any
    link_bytes_per_s: Any
    link_latency_s: Any

    @classmethod
    def from_spec(cls, spec: NpuSpec) -> HwParams:
        """The numbers of ``spec`` as int32/float32 jnp scalars."""
        a, m, h = spec.array, spec.memory, spec.host
        i32 = lambda v: jnp.asarray(v, jnp.int32)  # noqa: E731
        f32 = lambda v: jnp.asarray(v, jnp.float32)  # noqa: E731
        return cls(
            rows=i32(a.rows), cols=i32(a.cols), cores=i32(a.cores), clock_hz=f32(a.clock_hz),
            operand_bits=f32(a.operand_bits), accumulator_bits=f32(a.accumulator_bits),
            dram_bytes_per_s=f32(m.dram_bytes_per_s), dram_latency_s=f32(m.dram_latency_s),
            dram_burst_bytes=f32(spec.layout.dram_burst_bytes), lanes=i32(spec.vector.lanes),
            ifmap_sram_bytes=f32(m.ifmap_sram_bytes), filter_sram_bytes=f32(m.filter_sram_bytes),
            ofmap_sram_bytes=f32(m.ofmap_sram_bytes),
            brick_bits=f32(a.brick_bits),
            cpu_ops_per_s=f32(h.cpu_ops_per_s), link_bytes_per_s=f32(h.link_bytes_per_s),
            link_latency_s=f32(h.link_latency_s),
        )


def _ceil_div(a, b):
    return -(-a // b)


def _first_consumers(layers: Sequence[Workload]) -> jax.Array:
    """Index of the first layer reading each layer's output (-1 if none), static int32 [L]."""
    first = [-1] * len(layers)
    for j, w in enumerate(layers):
        if w.producer >= 0 and first[w.producer] < 0:
            first[w.producer] = j
    return jnp.asarray(first, jnp.int32)


def _bursts(nbytes, burst):
    """Round up to whole bursts; the gradient is that of ``nbytes`` (straight-through)."""
    rounded = jnp.ceil(nbytes / burst) * burst
    return nbytes + jax.lax.stop_gradient(rounded - nbytes)


def layer_costs(
    layers: Sequence[Workload],
    hw: HwParams,
    weight_bits: jax.Array,
    act_bits: jax.Array,
    dataflow: str,
    precision_scaling: str = "fixed",
) -> dict[str, jax.Array]:
    """Vectorised cost of ``layers`` (pure jnp; jit/vmap over ``hw``, grad w.r.t. the bits).

    Args:
      layers: static workloads (from :func:`npujax.plan.workloads`).
      hw: hardware numbers (:meth:`HwParams.from_spec`, or arrays of them under ``vmap``).
      weight_bits: float32 ``[L]`` weight width per layer (ignored for non-GEMM layers).
      act_bits: float32 ``[L]`` activation width per layer.
      dataflow: dataflow name (static).
      precision_scaling: ``fixed``, ``bit_composable`` or ``bit_serial`` (static; see the
        module docstring).

    Returns:
      dict of ``[L]`` arrays: ``compute_cycles`` (int32, exact: array or vector-unit cycles incl.
      fill/drain), ``fill_drain_cycles`` (int32), and float32 ``convert_cycles``, ``dma_cycles``,
      ``stall_cycles``,
      ``fallback_cycles``, ``transfer_cycles``, ``latency_cycles`` (their sum with compute),
      ``memory_cycles``, ``dram_bytes``; ``folds`` (int32); ``utilization`` and
      ``mapping_efficiency`` (float32; 0 for non-GEMM layers).
    """
    df = get_dataflow(dataflow)
    wb = jnp.asarray(weight_bits, jnp.float32)
    ab = jnp.asarray(act_bits, jnp.float32)
    i32 = lambda f: jnp.asarray([f(w) for w in layers], jnp.int32)  # noqa: E731
    f32 = lambda f: jnp.asarray([f(w) for w in layers], jnp.float32)  # noqa: E731
    on_npu = jnp.asarray([w.device == "npu" for w in layers])
    is_gemm = jnp.asarray([w.kind == "gemm" for w in layers]) & on_npu
    M, K, N = (i32(lambda w, d=d: max(getattr(w, d), 1)) for d in "MKN")
    groups = i32(lambda w: w.groups)
    R, C, cores = hw.rows, hw.cols, hw.cores

    # multi-core: split M or N across the cores, whichever is faster
    by_m = gemm_cycles(_ceil_div(M, cores), K, N, R, C, df)
    by_n = gemm_cycles(M, K, _ceil_div(N, cores), R, C, df)
    use_m = by_m["compute_cycles"] <= by_n["compute_cycles"]
    g = jax.tree.map(lambda a, b: jnp.where(use_m, a, b), by_m, by_n)
    ob = hw.operand_bits
    passes = (jnp.ceil(wb / ob) * jnp.ceil(ab / ob)).astype(jnp.int32)
    fd_per_fold = df.fill_cycles(R, C) + df.drain_cycles(R, C)
    fill_drain_1 = g["folds"] * fd_per_fold
    stream_1 = (g["compute_cycles"] - fill_drain_1).astype(jnp.float32)
    if precision_scaling == "fixed":
        scale = jnp.ones_like(wb)
    elif precision_scaling == "bit_composable":
        b = hw.brick_bits
        w_eff, a_eff = jnp.minimum(wb, ob), jnp.minimum(ab, ob)
        scale = jnp.ceil(w_eff / b) * jnp.ceil(a_eff / b) / jnp.square(ob / b)
    elif precision_scaling == "bit_serial":
        scale = jnp.minimum(wb, ob) * jnp.minimum(ab, ob) / jnp.square(ob)
    else:
        raise ConfigError(f"unknown precision_scaling {precision_scaling!r}.")
    stream = jnp.ceil(stream_1 * scale).astype(jnp.int32)
    gemm_total = groups * (fill_drain_1 + stream) * passes
    gemm_fill_drain = groups * fill_drain_1 * passes
    vec_cycles = _ceil_div(i32(lambda w: w.vector_ops), hw.lanes * cores)
    total_compute = jnp.where(is_gemm, gemm_total, jnp.where(on_npu, vec_cycles, 0))
    fill_drain = jnp.where(is_gemm, gemm_fill_drain, 0)

    burst = hw.dram_burst_bytes
    bpc = hw.dram_bytes_per_s / hw.clock_hz
    in_elems, out_elems = f32(lambda w: w.in_elems), f32(lambda w: w.out_elems)
    bias_bytes = _bursts(f32(lambda w: w.bias_elems) * hw.accumulator_bits / 8.0, burst)
    # every operand once: the traffic if SRAM were large enough (vector layers always)
    once = (_bursts(f32(lambda w: w.weight_elems) * wb / 8.0, burst) + bias_bytes
            + _bursts(in_elems * ab / 8.0, burst) + _bursts(out_elems * ab / 8.0, burst))
    # GEMM layers: the tiled traffic of the systolic memory model (SRAM capacity, reuse, spills).
    # im2col happens on chip: the [M, K] operand costs DRAM reads of its distinct elements only.
    fcores = cores.astype(jnp.float32)
    mem = gemm_memory(M, K, N, R, C, df, sram_bytes_a=hw.ifmap_sram_bytes * fcores,
                      sram_bytes_b=hw.filter_sram_bytes * fcores,
                      sram_bytes_out=hw.ofmap_sram_bytes * fcores,
                      elem_bytes_a=ab / 8.0, elem_bytes_b=wb / 8.0,
                      elem_bytes_out=ab / 8.0, dram_bytes_per_cycle=bpc,
                      unique_elems_a=in_elems / groups.astype(jnp.float32))
    gf = groups.astype(jnp.float32)
    tiled = (_bursts(gf * mem["dram_read_bytes_a"], burst)
             + _bursts(gf * mem["dram_read_bytes_b"], burst) + bias_bytes
             + _bursts(gf * (mem["dram_write_bytes_out"] + mem["dram_read_bytes_out"]), burst))
    dram_bytes = jnp.where(on_npu, jnp.where(is_gemm, tiled, once), 0.0)
    refetch = jnp.where(on_npu, dram_bytes / jnp.maximum(once, 1.0), 0.0)
    memory = dram_bytes / bpc
    # the first tiles in and the last tile out cannot overlap compute
    exposed = jnp.where(is_gemm, jnp.minimum(mem["prologue_cycles"] + mem["epilogue_cycles"],
                                             memory), 0.0)
    tc = total_compute.astype(jnp.float32)
    stall = jnp.maximum(memory - exposed - tc, 0.0)
    fused = jnp.asarray([bool(w.fused_into) for w in layers])
    dma = jnp.where(on_npu & ~fused, hw.dram_latency_s * hw.clock_hz + exposed, 0.0)
    sram_peak = jnp.where(is_gemm, (
        jnp.minimum(in_elems * ab / 8.0, hw.ifmap_sram_bytes * fcores)
        + jnp.minimum(f32(lambda w: w.weight_elems) * wb / 8.0, hw.filter_sram_bytes * fcores)
        + jnp.minimum(out_elems * jnp.where(mem["resident_out"], hw.accumulator_bits, ab) / 8.0,
                      hw.ofmap_sram_bytes * fcores)), 0.0)

    # precision conversion: a GEMM's output stage requantizes to the width of its first consumer
    # for free; a vector layer keeps its width. A consumer wanting another width pays a pass.
    first = _first_consumers(layers)
    out_width = jnp.where(jnp.asarray([w.kind == "gemm" for w in layers]) & (first >= 0),
                          ab[jnp.maximum(first, 0)], ab)
    prod = jnp.asarray([max(w.producer, 0) for w in layers], jnp.int32)
    has_prod = jnp.asarray([w.producer >= 0 for w in layers])
    a_in = jnp.where(has_prod, out_width[prod], ab)
    needs = has_prod & on_npu & (a_in != ab)
    in_elems = f32(lambda w: w.in_elems)
    conv_bytes = _bursts(in_elems * a_in / 8.0, burst) + _bursts(in_elems * ab / 8.0, burst)
    conv_cycles = jnp.maximum(_ceil_div(i32(lambda w: w.in_elems), hw.lanes * cores)
                              .astype(jnp.float32),
                              conv_bytes / (hw.dram_bytes_per_s / hw.clock_hz))
    convert = jnp.where(needs, conv_cycles, 0.0)

    cpu = ~on_npu
    fallback = jnp.where(cpu, f32(lambda w: w.cpu_ops) / hw.cpu_ops_per_s * hw.clock_hz, 0.0)
    link_bytes = (f32(lambda w: w.link_in_elems) + f32(lambda w: w.link_out_elems)) * ab / 8.0
    transfer = jnp.where(
        cpu,
        (f32(lambda w: w.link_transfers) * hw.link_latency_s
         + link_bytes / hw.link_bytes_per_s) * hw.clock_hz,
        0.0,
    )
    latency = tc + convert + dma + stall + fallback + transfer
    zero = jnp.zeros_like(memory)
    pes = (R * C * cores).astype(jnp.float32)
    macs = f32(lambda w: w.macs)
    util = jnp.where(is_gemm, macs / jnp.maximum(tc, 1.0) / pes, zero)
    return {
        "compute_cycles": total_compute,
        "fill_drain_cycles": fill_drain,
        "convert_cycles": convert,
        "dma_cycles": dma,
        "stall_cycles": stall,
        "fallback_cycles": fallback,
        "transfer_cycles": transfer,
        "latency_cycles": latency,
        "memory_cycles": memory,
        "dram_bytes": dram_bytes,
        "refetch_factor": refetch,
        "sram_peak_bytes": sram_peak,
        "folds": jnp.where(is_gemm, groups * g["folds"] * passes, 0),
        "utilization": util,
        "mapping_efficiency": jnp.where(is_gemm, g["mapping_efficiency"], zero),
    }


@dataclasses.dataclass(frozen=True)
class LayerReport:
    """One row of the per-layer table (all figures for the whole layer, all groups, all cores).

    Cycle figures are array clock cycles; ``latency_s = latency_cycles / clock_hz`` and
    ``latency_cycles = compute + convert + dma + stall + fallback + transfer`` (see
    :meth:`breakdown`).
    """

    name: str
    op: str
    kind: str
    device: str
    reason: str
    M: int
    K: int
    N: int
    macs: int
    weight_bits: int | None
    act_bits: int
    compute_cycles: int
    fill_drain_cycles: int
    convert_cycles: float
    dma_cycles: float
    stall_cycles: float
    fallback_cycles: float
    transfer_cycles: float
    latency_cycles: float
    latency_s: float
    memory_cycles: float
    bound: str
    utilization: float
    mapping_efficiency: float
    dram_bytes: float
    refetch_factor: float
    sram_peak_bytes: float
    folds: int
    epilogue: tuple[str, ...] = ()

    def breakdown(self) -> dict[str, float]:
        """Cycles per :data:`BREAKDOWN` component; they sum to ``latency_cycles``."""
        return {
            "compute": float(self.compute_cycles - self.fill_drain_cycles),
            "fill_drain": float(self.fill_drain_cycles),
            "convert": self.convert_cycles,
            "dma": self.dma_cycles,
            "stall": self.stall_cycles,
            "fallback": self.fallback_cycles,
            "transfer": self.transfer_cycles,
        }


@dataclasses.dataclass(frozen=True)
class Schedule:
    """The lowered model: per-layer reports and end-to-end totals on one NpuSpec and dataflow."""

    npu: str
    dataflow: str
    clock_hz: float
    batch: int
    layers: tuple[LayerReport, ...]
    peak_activation_bytes: int = 0

    @property
    def latency_s(self) -> float:
        """End-to-end latency in seconds: the sum of the per-layer latencies."""
        return float(sum(r.latency_s for r in self.layers))

    @property
    def latency_cycles(self) -> float:
        """End-to-end latency in array clock cycles."""
        return float(sum(r.latency_cycles for r in self.layers))

    @property
    def macs(self) -> int:
        """Total multiply-accumulates."""
        return int(sum(r.macs for r in self.layers))

    @property
    def throughput_per_s(self) -> float:
        """Inferences per second at the graph's batch size (``batch / latency``)."""
        return self.batch / self.latency_s if self.latency_s > 0 else float("inf")

    def breakdown_s(self) -> dict[str, float]:
        """End-to-end seconds per :data:`BREAKDOWN` component (they sum to ``latency_s``)."""
        rows = [r.breakdown() for r in self.layers]
        return {k: sum(b[k] for b in rows) / self.clock_hz for k in BREAKDOWN}

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict: totals, breakdown and ``layers``."""
        return {
            "npu": self.npu,
            "dataflow": self.dataflow,
            "batch": self.batch,
            "latency_s": self.latency_s,
            "latency_cycles": self.latency_cycles,
            "throughput_per_s": self.throughput_per_s,
            "macs": self.macs,
            "peak_activation_bytes": self.peak_activation_bytes,
            "breakdown_s": self.breakdown_s(),
            "layers": [
                {**dataclasses.asdict(r), "epilogue": list(r.epilogue)} for r in self.layers
            ],
        }


def _check_bits(bits: Any, what: str) -> int:
    if isinstance(bits, bool) or not float(bits).is_integer() or not 2 <= bits <= 16:
        raise QuantizationError(f"{what} must be a whole number of bits in [2, 16], got {bits!r}.")
    return int(bits)


def _per_layer(
    value: int | Mapping[str, int], layers: Sequence[Workload], what: str, default: int,
    weights_only: bool = False,
) -> np.ndarray:
    if isinstance(value, Mapping):
        names = {w.name for w in layers}
        unknown = set(value) - names
        if unknown:
            raise ConfigError(
                f"{what} names unknown layers {sorted(unknown)}; layers: {sorted(names)}."
            )
        if weights_only:
            no_weights = sorted(w.name for w in layers if w.name in value and w.kind != "gemm")
            if no_weights:
                raise ConfigError(f"{what} names layers without weights: {no_weights}.")
        return np.asarray([_check_bits(value.get(w.name, default), f"{what}[{w.name!r}]")
                           for w in layers], np.float32)
    return np.full(len(layers), _check_bits(value, what), np.float32)


@functools.lru_cache(maxsize=64)
def _jitted_costs(layers: tuple[Workload, ...], dataflow: str, precision_scaling: str):
    """One compiled cost function per (workloads, dataflow); hardware and bits stay traced."""
    return jax.jit(lambda hw, w, a: layer_costs(layers, hw, w, a, dataflow, precision_scaling))


def lower(
    graph: Graph,
    spec: NpuSpec,
    *,
    weight_bits: int | Mapping[str, int] = 8,
    act_bits: int | Mapping[str, int] = 8,
    dataflow: str | None = None,
    batch: int | None = None,
) -> Schedule:
    """Lower ``graph`` onto ``spec`` and return the per-layer :class:`Schedule`.

    Args:
      graph: an optimized graph (see :func:`npujax.optimize`); its traced batch size is the
        inference batch.
      spec: the NPU.
      weight_bits: one width or ``{layer: bits}`` (layers not named get 8).
      act_bits: one width or ``{layer: bits}``.
      dataflow: overrides the preset's dataflow (``weight_stationary`` etc.).
      batch: inference batch size (default: the graph's own; see :func:`npujax.rebatch`).

    Returns:
      The :class:`Schedule`; its per-layer ``latency_s`` sum to ``Schedule.latency_s``.

    Raises:
      ConfigError: unknown dataflow or layer names, or weight bits for a layer without weights.
      QuantizationError: a bit width that is not a whole number in [2, 16].
    """
    if batch is not None:
        graph = rebatch(graph, batch)
    layers = workloads(graph, spec)
    wb = _per_layer(weight_bits, layers, "weight_bits", 8, weights_only=True)
    ab = _per_layer(act_bits, layers, "act_bits", 8)
    if isinstance(act_bits, Mapping):
        # vector layers not named run at the width their consumer wants (else their producer's)
        first = np.asarray(_first_consumers(layers))
        for i in reversed(range(len(layers))):
            w = layers[i]
            if w.name in act_bits or w.kind == "gemm":
                continue
            if first[i] >= 0:
                ab[i] = ab[first[i]]
        for i, w in enumerate(layers):
            if w.name not in act_bits and w.kind != "gemm" and first[i] < 0 and w.producer >= 0:
                ab[i] = ab[w.producer]
    df = get_dataflow(dataflow or spec.array.dataflow)
    costs = _jitted_costs(tuple(layers), df.name, spec.array.precision_scaling)(
        HwParams.from_spec(spec), wb, ab)
    costs = jax.tree.map(np.asarray, costs)
    clock = spec.array.clock_hz
    reports = []
    for i, w in enumerate(layers):
        c = {k: float(v[i]) for k, v in costs.items()}
        if w.device == "cpu":
            bound = "fallback"
        else:
            bound = "compute" if c["compute_cycles"] >= c["memory_cycles"] else "memory"
        reports.append(
            LayerReport(
                name=w.name, op=w.op, kind=w.kind, device=w.device, reason=w.reason,
                M=w.M, K=w.K, N=w.N, macs=w.macs,
                weight_bits=int(wb[i]) if w.kind == "gemm" else None, act_bits=int(ab[i]),
                compute_cycles=int(costs["compute_cycles"][i]),
                fill_drain_cycles=int(costs["fill_drain_cycles"][i]),
                convert_cycles=c["convert_cycles"], dma_cycles=c["dma_cycles"],
                stall_cycles=c["stall_cycles"],
                fallback_cycles=c["fallback_cycles"], transfer_cycles=c["transfer_cycles"],
                latency_cycles=c["latency_cycles"], latency_s=c["latency_cycles"] / clock,
                memory_cycles=c["memory_cycles"], bound=bound,
                utilization=c["utilization"], mapping_efficiency=c["mapping_efficiency"],
                dram_bytes=c["dram_bytes"], refetch_factor=c["refetch_factor"],
                sram_peak_bytes=c["sram_peak_bytes"], folds=int(costs["folds"][i]),
                epilogue=w.epilogue,
            )
        )
    batch = int(graph.tensors[graph.inputs[0]].shape[0]) if graph.inputs else 1
    act = int(act_bits) if not isinstance(act_bits, Mapping) else int(max(ab, default=8))
    return Schedule(spec.name, df.name, clock, batch, tuple(reports),
                    peak_activation_bytes(graph, act))

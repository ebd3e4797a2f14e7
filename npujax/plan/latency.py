"""Lower a Graph onto an NpuSpec: per-layer compute, memory and latency (the roofline model).

For each layer (after BN folding and activation fusion):

* GEMM layers (Conv, Gemm) on the MAC array:
  ``compute_cycles = groups x gemm_cycles(M, K, N, R, C, dataflow) x passes`` with the fold model
  of :mod:`npujax.systolic` and ``passes = ceil(w_bits / operand_bits) x ceil(a_bits /
  operand_bits)`` (operands wider than the array's native width are split, as on int8 arrays that
  run int16 layers in four passes).
* Vector layers (pooling, unfused elementwise ops): ``compute_cycles = ceil(ops / lanes)``.
* ``dram_bytes = weight_elems x w_bits/8 + bias_elems x 4 + (in_elems + out_elems) x a_bits/8``:
  every layer reads its weights and input activation from DRAM and writes its output back (no
  inter-layer residency in SRAM in this model; tiling and reuse come with the tiled model).
* ``memory_cycles = dram_bytes / (dram_bytes_per_s / clock_hz)`` (fractional cycles).
* ``latency_cycles = max(compute_cycles, memory_cycles)``: compute and DMA are double-buffered and
  overlap, so the slower of the two bounds the layer — the roofline model of Williams, Waterman and
  Patterson, "Roofline: an insightful visual performance model", CACM 2009. ``bound`` says which.

Everything is a pure ``jnp`` function of the per-layer bit widths (and hardware numbers), so
``jax.grad`` / ``jax.vmap`` apply; lower bit widths never increase any latency figure.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from npujax.errors import ConfigError
from npujax.graph.ir import Graph
from npujax.hw.spec import NpuSpec
from npujax.plan.workload import Workload, workloads
from npujax.systolic.dataflow import gemm_cycles, get_dataflow

__all__ = ["LayerReport", "Schedule", "layer_costs", "lower", "BIAS_BYTES"]

#: Bytes per bias element (int32 accumulator-width bias, as in TFLite/ONNX QLinearConv).
BIAS_BYTES = 4


def _ceil_div(a, b):
    return -(-a // b)


def layer_costs(
    layers: Sequence[Workload],
    spec: NpuSpec,
    weight_bits: jax.Array,
    act_bits: jax.Array,
    dataflow: str | None = None,
) -> dict[str, jax.Array]:
    """Vectorised cost of ``layers`` (pure jnp; differentiable in the bit widths).

    Args:
      layers: static workloads (from :func:`npujax.plan.workloads`).
      spec: the hardware.
      weight_bits: float32 ``[L]`` weight width per layer (ignored for vector layers).
      act_bits: float32 ``[L]`` activation width per layer.
      dataflow: overrides ``spec.array.dataflow``.

    Returns:
      dict of ``[L]`` arrays: ``compute_cycles`` (int32, exact), ``memory_cycles`` (float32),
      ``latency_cycles`` (float32), ``dram_bytes`` (float32), ``folds`` (int32),
      ``utilization`` and ``mapping_efficiency`` (float32; 0 for vector layers), ``macs``.
    """
    df = get_dataflow(dataflow or spec.array.dataflow)
    wb = jnp.asarray(weight_bits, jnp.float32)
    ab = jnp.asarray(act_bits, jnp.float32)
    arr = lambda f: jnp.asarray([f(w) for w in layers], jnp.int32)  # noqa: E731
    is_gemm = jnp.asarray([w.kind == "gemm" for w in layers])
    M, K, N = arr(lambda w: max(w.M, 1)), arr(lambda w: max(w.K, 1)), arr(lambda w: max(w.N, 1))
    groups = arr(lambda w: w.groups)
    g = gemm_cycles(M, K, N, spec.array.rows, spec.array.cols, df)
    ob = spec.array.operand_bits
    passes = (jnp.ceil(wb / ob) * jnp.ceil(ab / ob)).astype(jnp.int32)
    vec_cycles = _ceil_div(arr(lambda w: w.vector_ops), spec.vector.lanes)
    compute = jnp.where(is_gemm, groups * g["compute_cycles"] * passes, vec_cycles)

    f32 = lambda f: jnp.asarray([f(w) for w in layers], jnp.float32)  # noqa: E731
    dram_bytes = (
        f32(lambda w: w.weight_elems) * wb / 8.0
        + f32(lambda w: w.bias_elems) * BIAS_BYTES
        + (f32(lambda w: w.in_elems) + f32(lambda w: w.out_elems)) * ab / 8.0
    )
    memory = dram_bytes / (spec.memory.dram_bytes_per_s / spec.array.clock_hz)
    latency = jnp.maximum(compute.astype(jnp.float32), memory)
    zero = jnp.zeros_like(memory)
    return {
        "compute_cycles": compute,
        "memory_cycles": memory,
        "latency_cycles": latency,
        "dram_bytes": dram_bytes,
        "folds": jnp.where(is_gemm, groups * g["folds"] * passes, 0),
        "utilization": jnp.where(is_gemm, g["utilization"] / passes.astype(jnp.float32), zero),
        "mapping_efficiency": jnp.where(is_gemm, g["mapping_efficiency"], zero),
        "macs": f32(lambda w: w.macs),
    }


@dataclasses.dataclass(frozen=True)
class LayerReport:
    """One row of the per-layer table (all figures for the whole layer, all groups)."""

    name: str
    op: str
    kind: str
    M: int
    K: int
    N: int
    macs: int
    weight_bits: int | None
    act_bits: int
    compute_cycles: int
    memory_cycles: float
    latency_cycles: float
    latency_s: float
    bound: str
    utilization: float
    mapping_efficiency: float
    dram_bytes: float
    folds: int
    epilogue: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class Schedule:
    """The lowered model: per-layer reports and end-to-end totals on one NpuSpec and dataflow."""

    npu: str
    dataflow: str
    clock_hz: float
    layers: tuple[LayerReport, ...]

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

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict: ``npu``, ``dataflow``, ``latency_s``, ``macs`` and ``layers``."""
        return {
            "npu": self.npu,
            "dataflow": self.dataflow,
            "latency_s": self.latency_s,
            "latency_cycles": self.latency_cycles,
            "macs": self.macs,
            "layers": [
                {**dataclasses.asdict(r), "epilogue": list(r.epilogue)} for r in self.layers
            ],
        }


def _per_layer(
    value: int | Mapping[str, int], layers: Sequence[Workload], what: str, default: int
) -> np.ndarray:
    if isinstance(value, Mapping):
        names = {w.name for w in layers}
        unknown = set(value) - names
        if unknown:
            raise ConfigError(
                f"{what} names unknown layers {sorted(unknown)}; layers: {sorted(names)}."
            )
        return np.asarray([value.get(w.name, default) for w in layers], np.float32)
    return np.full(len(layers), value, np.float32)


def lower(
    graph: Graph,
    spec: NpuSpec,
    *,
    weight_bits: int | Mapping[str, int] = 8,
    act_bits: int | Mapping[str, int] = 8,
    dataflow: str | None = None,
) -> Schedule:
    """Lower ``graph`` onto ``spec`` and return the per-layer :class:`Schedule`.

    Args:
      graph: an optimized graph (see :func:`npujax.graph.optimize`); its traced batch size is the
        inference batch.
      spec: the NPU.
      weight_bits: one width or ``{layer: bits}`` (layers not named get 8).
      act_bits: one width or ``{layer: bits}``.
      dataflow: overrides the preset's dataflow (``weight_stationary`` etc.).

    Returns:
      The :class:`Schedule`; its per-layer ``latency_s`` sum to ``Schedule.latency_s``.

    Raises:
      ConfigError: unknown dataflow or layer names.
    """
    layers = workloads(graph)
    wb = _per_layer(weight_bits, layers, "weight_bits", 8)
    ab = _per_layer(act_bits, layers, "act_bits", 8)
    df = get_dataflow(dataflow or spec.array.dataflow)
    costs = jax.tree.map(np.asarray, jax.jit(
        lambda w, a: layer_costs(layers, spec, w, a, df))(wb, ab))
    reports = []
    for i, w in enumerate(layers):
        compute, memory = int(costs["compute_cycles"][i]), float(costs["memory_cycles"][i])
        lat = float(costs["latency_cycles"][i])
        reports.append(
            LayerReport(
                name=w.name, op=w.op, kind=w.kind, M=w.M, K=w.K, N=w.N, macs=w.macs,
                weight_bits=int(wb[i]) if w.kind == "gemm" else None, act_bits=int(ab[i]),
                compute_cycles=compute, memory_cycles=memory, latency_cycles=lat,
                latency_s=lat / spec.array.clock_hz,
                bound="compute" if compute >= memory else "memory",
                utilization=float(costs["utilization"][i]),
                mapping_efficiency=float(costs["mapping_efficiency"][i]),
                dram_bytes=float(costs["dram_bytes"][i]), folds=int(costs["folds"][i]),
                epilogue=w.epilogue,
            )
        )
    return Schedule(spec.name, df.name, spec.array.clock_hz, tuple(reports))

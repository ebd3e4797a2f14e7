"""Several models sharing one NPU: memory, weights resident or swapped, DRAM interference.

:func:`lower_models` lowers each model alone (all cores, the whole DRAM bandwidth) and together
in one of two ways (:data:`SHARING`):

* ``time_multiplexed`` — the models take turns on all cores (round robin). Each runs at its
  alone speed, but a request may wait for one inference of every other model:
  ``together = own + sum(others)`` (the worst case; the round-robin frame).
* ``core_partitioned`` — each model gets its own cores (``cores``, default in proportion to
  its MACs, at least one each) and runs concurrently; the cores share the DRAM. Each model is
  lowered on its cores with the SRAM of those cores; when the models' DRAM demands (bytes per
  second at full bandwidth) add up to more than the bandwidth, each gets a share in proportion
  to its demand and is lowered again at that bandwidth (a fluid model of a fair memory
  controller).

**Weights.** Every model's weights and DRAM activations (:func:`npujax.plan.memory_report`)
must fit in the DRAM capacity together (``memory.dram_bytes``; 0 = unlimited). If they do,
weights are ``resident`` in DRAM and nothing changes; if not, models are made resident in the
order given while they fit and the others are ``swapped``: their weights come over the host
link (``host.link_bytes_per_s``, one transfer) before every inference.

Together is never faster than alone (fewer cores, less SRAM and bandwidth, waits and swaps only
add time; property-tested). Python over the jnp per-layer model, like :func:`npujax.lower`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from npujax.errors import ConfigError
from npujax.hw.spec import NpuSpec, as_spec
from npujax.ir.graph import Graph
from npujax.plan.lower import Schedule, lower
from npujax.plan.memory import MemoryReport, memory_report
from npujax.quantize.spec import QuantSpec

__all__ = ["SHARING", "ModelShare", "CoResidency", "lower_models"]

#: How co-resident models share the NPU.
SHARING = ("time_multiplexed", "core_partitioned")


@dataclasses.dataclass(frozen=True)
class ModelShare:
    """One model's part of a co-resident schedule.

    Attributes:
      name: the model's name.
      alone_s: its latency alone on the whole NPU (s).
      together_s: its latency sharing the NPU (s).
      cores: cores it runs on together.
      dram_bytes_per_s: DRAM bandwidth it gets together (bytes/s).
      weights: ``resident`` (in DRAM) or ``swapped`` (from host memory every inference).
      swap_s: time to swap its weights in (0 when resident) (s).
      memory: its :class:`~npujax.plan.memory.MemoryReport` alone.
      schedule: its :class:`~npujax.plan.Schedule` alone.
    """

    name: str
    alone_s: float
    together_s: float
    cores: int
    dram_bytes_per_s: float
    weights: str
    swap_s: float
    memory: MemoryReport
    schedule: Schedule

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (without the per-layer schedule)."""
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
             if f.name not in ("memory", "schedule")}
        return {**d, "memory": self.memory.to_dict(), "slowdown": self.slowdown}

    @property
    def slowdown(self) -> float:
        """``together_s / alone_s`` (>= 1)."""
        return self.together_s / self.alone_s if self.alone_s > 0 else 1.0


@dataclasses.dataclass(frozen=True)
class CoResidency:
    """Co-resident models on one NPU.

    Attributes:
      npu: the preset's name.
      sharing: one of :data:`SHARING`.
      models: one :class:`ModelShare` per model, in the order given.
      dram_footprint_bytes: the models' DRAM footprints added up.
      dram_capacity_bytes: the preset's DRAM capacity (0: unlimited).
    """

    npu: str
    sharing: str
    models: tuple[ModelShare, ...]
    dram_footprint_bytes: float
    dram_capacity_bytes: float

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return {"npu": self.npu, "sharing": self.sharing,
                "dram_footprint_bytes": self.dram_footprint_bytes,
                "dram_capacity_bytes": self.dram_capacity_bytes,
                "models": [m.to_dict() for m in self.models]}


def _split_cores(total: int, macs: Sequence[int]) -> list[int]:
    """Cores in proportion to MACs, at least one each, summing to ``total``."""
    n = len(macs)
    cores = [1] * n
    for _ in range(total - n):  # give each next core to the model with most MACs per core
        i = max(range(n), key=lambda k: macs[k] / cores[k])
        cores[i] += 1
    return cores


def lower_models(
    graphs: Mapping[str, Graph],
    spec: NpuSpec | str,
    quants: Mapping[str, QuantSpec | None] | None = None,
    *,
    sharing: str = "time_multiplexed",
    cores: Sequence[int] | None = None,
    dataflow: str | None = None,
    fusion: str | None = None,
) -> CoResidency:
    """Lower several models that share ``spec``, alone and together.

    Args:
      graphs: ``{name: optimized graph}``, at least one.
      spec: the NPU (an :class:`~npujax.hw.NpuSpec`, a preset name or a TOML path).
      quants: per model its quantization spec (missing: 8 bits everywhere).
      sharing: one of :data:`SHARING`.
      cores: cores per model for ``core_partitioned`` (default in proportion to MACs).
      dataflow, fusion: as for :func:`npujax.lower`.

    Returns:
      The :class:`CoResidency`.

    Raises:
      ConfigError: no models, an unknown sharing mode, fewer cores than models for
        ``core_partitioned``, or ``cores`` that do not add up to the preset's.
    """
    spec = as_spec(spec)
    if fusion is not None and fusion != spec.ops.fusion:
        spec = spec.with_fields({"ops.fusion": fusion})
    if not graphs:
        raise ConfigError("lower_models needs at least one model.")
    if sharing not in SHARING:
        raise ConfigError(f"unknown sharing {sharing!r}; use one of {', '.join(SHARING)}.")
    quants = quants or {}
    names = list(graphs)
    alone = {n: lower(graphs[n], spec, quants.get(n), dataflow=dataflow) for n in names}
    mem = {n: memory_report(graphs[n], alone[n], spec) for n in names}
    cap = float(spec.memory.dram_bytes)
    used, weights = 0.0, {}
    for n in names:
        fits = cap <= 0 or used + mem[n].dram_footprint_bytes <= cap
        weights[n] = "resident" if fits else "swapped"
        used += mem[n].dram_footprint_bytes if fits else mem[n].dram_activation_peak_bytes
    swap = {n: (spec.host.link_latency_s + mem[n].weight_bytes / spec.host.link_bytes_per_s
                if weights[n] == "swapped" else 0.0) for n in names}
    total = spec.array.cores
    bw = spec.memory.dram_bytes_per_s
    if sharing == "time_multiplexed":
        own = {n: alone[n].latency_s + swap[n] for n in names}
        shares = [ModelShare(n, alone[n].latency_s, sum(own.values()), total, bw, weights[n],
                             swap[n], mem[n], alone[n]) for n in names]
    else:
        if total < len(names):
            raise ConfigError(f"core_partitioned sharing needs a core per model: {spec.name} "
                              f"has {total} core(s) for {len(names)} models; use "
                              "time_multiplexed or a preset with more array.cores.")
        split = list(cores) if cores is not None else _split_cores(
            total, [alone[n].macs for n in names])
        if len(split) != len(names) or sum(split) != total or min(split) < 1:
            raise ConfigError(f"cores {split} must give each of the {len(names)} models at "
                              f"least one core and add up to {spec.name}'s {total}.")
        part = {n: spec.with_fields({"array.cores": c}) if c != total else spec
                for n, c in zip(names, split)}
        sched = {n: lower(graphs[n], part[n], quants.get(n), dataflow=dataflow) for n in names}
        demand = {n: sched[n].dram_bytes / sched[n].latency_s if sched[n].latency_s > 0 else 0.0
                  for n in names}
        need = sum(demand.values())
        rate = {n: bw if need <= bw else bw * demand[n] / need for n in names}
        for n in names:
            if rate[n] < bw:
                sched[n] = lower(graphs[n], part[n].with_fields(
                    {"memory.dram_bytes_per_s": rate[n]}), quants.get(n), dataflow=dataflow)
        shares = [ModelShare(n, alone[n].latency_s,
                             sched[n].latency_s + swap[n], c, rate[n],
                             weights[n], swap[n], mem[n], alone[n])
                  for n, c in zip(names, split)]
    return CoResidency(spec.name, sharing, tuple(shares),
                       sum(m.dram_footprint_bytes for m in mem.values()), cap)

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

**Weights.** A model whose weights (and biases) fit in half the filter SRAM of the cores it
runs on keeps them there across inferences (``sram``: no weight traffic, see
``lower(..., resident_weights=True)``); time-multiplexed models must fit there *together*, a
core-partitioned model on its own cores. Otherwise weights stream from DRAM every inference
(``dram``), which needs every model's weights and DRAM activations
(:func:`npujax.plan.memory_report`) to fit the DRAM capacity together (``memory.dram_bytes``; 0 =
unlimited): models stay in DRAM in the order given while they fit, and the others are swapped
(``host``): their weights come over the host link (``host.link_bytes_per_s``, one transfer)
before every inference. A swapped model still holds its DRAM activations; a model whose
activations do not fit beside the models before it (or alone) cannot be deployed: its ``fits``
is false, and so is the deployment's.

Together is never faster than alone (fewer cores, less SRAM and bandwidth, waits and swaps only
add time; property-tested). Python over the jnp per-layer model, like :func:`npujax.lower`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from npujax.errors import ConfigError
from npujax.hw.spec import NpuSpec, as_spec
from npujax.ir.graph import Graph
from npujax.plan.lower import Schedule, lower, weight_bytes
from npujax.plan.memory import MemoryReport, memory_report
from npujax.plan.workload import workloads
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
      weights: where its weights live together: ``sram`` (resident on chip), ``dram``
        (streamed every inference) or ``host`` (swapped in over the host link every inference).
      swap_s: time to swap its weights in (0 when resident) (s).
      memory: its :class:`~npujax.plan.memory.MemoryReport` alone.
      schedule: its :class:`~npujax.plan.Schedule` alone (weights in SRAM if they fit).
      fits: whether its DRAM share (footprint, or activations when its weights are swapped to
        the host) fits beside the models before it in the capacity.
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
    fits: bool = True

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
      dram_footprint_bytes: the models' DRAM footprints added up (all weights in DRAM).
      dram_capacity_bytes: the preset's DRAM capacity (0: unlimited).
      dram_held_bytes: what the DRAM holds with the swapped models' weights in host memory
        (the models that fit: their footprints, or activations when swapped).
    """

    npu: str
    sharing: str
    models: tuple[ModelShare, ...]
    dram_footprint_bytes: float
    dram_capacity_bytes: float
    dram_held_bytes: float = 0.0

    @property
    def fits(self) -> bool:
        """Whether every model fits the DRAM (weights swapped to the host where needed)."""
        return all(m.fits for m in self.models)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return {"npu": self.npu, "sharing": self.sharing,
                "dram_footprint_bytes": self.dram_footprint_bytes,
                "dram_capacity_bytes": self.dram_capacity_bytes,
                "dram_held_bytes": self.dram_held_bytes, "fits": self.fits,
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
      dataflow: overrides the preset's dataflow.
      fusion: overrides the preset's ``ops.fusion`` (see :func:`npujax.lower`).

    Returns:
      The :class:`CoResidency`.

    Raises:
      ConfigError: no models, an unknown sharing mode, a ``quants`` key that names no model,
        ``cores`` with ``time_multiplexed`` (every model runs on all cores there), fewer cores
        than models for ``core_partitioned``, or ``cores`` that do not add up to the preset's.
    """
    spec = as_spec(spec)
    if spec.array.cores_per_inference:  # these schedules give each model its cores themselves
        spec = spec.with_fields({"array.cores_per_inference": 0})
    if fusion is not None and fusion != spec.ops.fusion:
        spec = spec.with_fields({"ops.fusion": fusion})
    if not graphs:
        raise ConfigError("lower_models needs at least one model.")
    if sharing not in SHARING:
        raise ConfigError(f"unknown sharing {sharing!r}; use one of {', '.join(SHARING)}.")
    quants = quants or {}
    names = list(graphs)
    unknown = sorted(set(quants) - set(names))
    if unknown:
        raise ConfigError(f"quants names {unknown}, which are not among the models "
                          f"{names}; key each quantization spec by its model's name.")
    if cores is not None and sharing != "core_partitioned":
        raise ConfigError(f"cores={list(cores)} splits the cores among the models, which only "
                          f"core_partitioned sharing does; {sharing} runs every model on all "
                          "the cores (drop cores or pass sharing='core_partitioned').")

    def fits_sram(ns: Sequence[str], cores: int) -> bool:
        return sum(wbytes[n] for n in ns) <= spec.memory.filter_sram_bytes * cores / 2

    plain = {n: lower(graphs[n], spec, quants.get(n), dataflow=dataflow) for n in names}
    wbytes = {n: weight_bytes(list(workloads(graphs[n], spec)), spec,
                              np.asarray([r.weight_bits or 0 for r in plain[n].layers]))
              for n in names}
    total = spec.array.cores
    alone = {n: lower(graphs[n], spec, quants.get(n), dataflow=dataflow, resident_weights=True)
             if fits_sram([n], total) else plain[n] for n in names}
    mem = {n: memory_report(graphs[n], plain[n], spec) for n in names}
    cap = float(spec.memory.dram_bytes)
    used, host, fit = 0.0, set(), {}
    for n in names:
        fit[n] = True
        if cap <= 0 or used + mem[n].dram_footprint_bytes <= cap:
            used += mem[n].dram_footprint_bytes
        else:
            host.add(n)
            if used + mem[n].dram_activation_peak_bytes <= cap:
                used += mem[n].dram_activation_peak_bytes
            else:  # even its activations do not fit: it cannot be deployed beside the others
                fit[n] = False
    swap = {n: (spec.host.link_latency_s + mem[n].weight_bytes / spec.host.link_bytes_per_s
                if n in host else 0.0) for n in names}
    bw = spec.memory.dram_bytes_per_s
    if sharing == "time_multiplexed":
        on_chip = fits_sram(names, total)
        where = {n: "sram" if on_chip else "host" if n in host else "dram" for n in names}
        swap = {n: swap[n] if where[n] == "host" else 0.0 for n in names}
        together = {n: (alone[n] if on_chip else plain[n]).latency_s + swap[n] for n in names}
        shares = [ModelShare(n, alone[n].latency_s, sum(together.values()), total, bw,
                             where[n], swap[n], mem[n], alone[n], fit[n]) for n in names]
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
        ncores = dict(zip(names, split))
        part = {n: spec.with_fields({"array.cores": c}) if c != total else spec
                for n, c in ncores.items()}
        resident = {n: fits_sram([n], ncores[n]) for n in names}
        where = {n: "sram" if resident[n] else "host" if n in host else "dram" for n in names}
        swap = {n: swap[n] if where[n] == "host" else 0.0 for n in names}

        def run(n: str, s: NpuSpec) -> Schedule:
            return lower(graphs[n], s, quants.get(n), dataflow=dataflow,
                         resident_weights=resident[n])

        sched = {n: run(n, part[n]) for n in names}
        demand = {n: sched[n].dram_bytes / sched[n].latency_s if sched[n].latency_s > 0 else 0.0
                  for n in names}
        need = sum(demand.values())
        rate = {n: bw if need <= bw else bw * demand[n] / need for n in names}
        for n in names:
            if rate[n] < bw:
                sched[n] = run(n, part[n].with_fields({"memory.dram_bytes_per_s": rate[n]}))
        shares = [ModelShare(n, alone[n].latency_s, sched[n].latency_s + swap[n], ncores[n],
                             rate[n], where[n], swap[n], mem[n], alone[n], fit[n])
                  for n in names]
    return CoResidency(spec.name, sharing, tuple(shares),
                       sum(m.dram_footprint_bytes for m in mem.values()), cap, used)

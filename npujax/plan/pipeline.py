"""Multi-core schedules: every layer split over the cores, or layers pipelined over the cores.

:func:`npujax.lower` splits each layer over ``array.cores`` (along M or N, whichever is faster):
*layer-split*. With streaming inputs (or a batch cut into micro-batches) the cores can instead
run consecutive groups of layers as a *pipeline*: core ``i`` runs stage ``i`` of inference ``n``
while core ``i + 1`` runs stage ``i + 1`` of inference ``n - 1``.

* **Stages.** Each layer costs what it costs on one core (the spec with ``cores = 1``: one core's
  array, vector lanes and SRAM; its cross-layer fusion decided on that core's SRAM). The rows
  are cut into at most ``cores`` contiguous stages minimising the slowest stage (the classic
  linear-partition dynamic program, exact; in numpy).
* **Transfers.** A tensor produced in one stage and read in a later one crosses cores: at
  ``memory.core_link_bytes_per_s`` (an on-chip network or shared SRAM) when the preset gives
  one, charged to the receiving stage; otherwise through DRAM, which costs nothing extra when
  the layer-by-layer schedule already wrote it there and a DRAM write and read when fusion had
  kept it on chip.
* **DRAM interference.** All cores share the DRAM: in steady state a new inference can start
  no faster than the DRAM moves one inference's bytes, so ``period = max(slowest stage, DRAM
  bytes / bandwidth)``; ``throughput = batch / period``; ``latency = sum of the stages`` (one
  inference passes every stage).

The layer-split schedule has ``period = latency``. A one-stage pipeline is the single-core
schedule, so the pipeline's throughput is never below one core's (property-tested).

The per-layer costs are the jnp model; the partition itself is combinatorial (a choice of cut
points) and runs in Python/numpy, outside ``jit`` and ``grad``: it is a deployment decision
made once per model and hardware, not a quantity the precision search differentiates.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from npujax.errors import ConfigError
from npujax.hw.spec import NpuSpec, as_spec
from npujax.ir.graph import Graph
from npujax.ir.passes import rebatch
from npujax.plan.lower import Schedule, lower
from npujax.plan.workload import workloads
from npujax.quantize.spec import QuantSpec

__all__ = ["CoreSchedule", "core_schedules", "best_core_schedule", "OBJECTIVES"]

#: What :func:`best_core_schedule` maximises: ``throughput`` or (minimum) ``latency``.
OBJECTIVES = ("throughput", "latency")


@dataclasses.dataclass(frozen=True)
class CoreSchedule:
    """A multi-core schedule of one model.

    Attributes:
      kind: ``layer_split`` or ``pipeline``.
      cores: cores used (a pipeline may use fewer stages than cores).
      batch: inputs per inference.
      latency_s: one inference from its first layer to its last (s).
      period_s: time between successive inferences in steady state (s).
      stages: layer names per stage (one stage for ``layer_split``).
      stage_s: time of each stage, its incoming transfers included (s).
      transfer_s: time of the transfers into each stage (s).
      dram_s: DRAM time of one inference's bytes (s); bounds the period.
    """

    kind: str
    cores: int
    batch: int
    latency_s: float
    period_s: float
    stages: tuple[tuple[str, ...], ...]
    stage_s: tuple[float, ...]
    transfer_s: tuple[float, ...]
    dram_s: float

    @property
    def throughput_per_s(self) -> float:
        """Inferences' inputs per second in steady state (``batch / period``)."""
        return self.batch / self.period_s if self.period_s > 0 else float("inf")

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (with ``throughput_per_s``)."""
        d = dataclasses.asdict(self)
        d["stages"] = [list(s) for s in self.stages]
        return {**d, "throughput_per_s": self.throughput_per_s}


def _partition(cost: np.ndarray, cut: np.ndarray, parts: int) -> list[int]:
    """Start rows of at most ``parts`` contiguous stages minimising the slowest stage.

    ``cost[i]`` is row i's time, ``cut[a]`` the transfer time into a stage starting at row a.
    """
    n = len(cost)
    pre = np.concatenate([[0.0], np.cumsum(cost)])
    best = pre[1:].copy()  # best[b]: rows 0..b in one stage
    starts: list[list[int]] = [[0] for _ in range(n)]
    result_val, result = best[-1], [0]
    for _ in range(1, parts):
        new = best.copy()
        new_starts = [list(s) for s in starts]
        for b in range(1, n):
            a = np.arange(1, b + 1)  # the last stage is rows a..b
            val = np.maximum(best[a - 1], pre[b + 1] - pre[a] + cut[a])
            k = int(np.argmin(val))
            if val[k] < new[b]:
                new[b] = val[k]
                new_starts[b] = starts[a[k] - 1] + [int(a[k])]
        best, starts = new, new_starts
        if best[-1] < result_val:
            result_val, result = best[-1], starts[-1]
    return result


def core_schedules(
    graph: Graph,
    spec: NpuSpec | str,
    quant: QuantSpec | None = None,
    *,
    dataflow: str | None = None,
    batch: int | None = None,
    fusion: str | None = None,
) -> dict[str, CoreSchedule]:
    """The layer-split and pipelined schedules of ``graph`` on the cores of ``spec``.

    Args:
      graph: the optimized graph.
      spec: the NPU (``array.cores`` cores; ``memory.core_link_bytes_per_s`` between them).
      quant: the layers' precision (None: 8 bits).
      dataflow: overrides the preset's dataflow.
      batch: inference batch size (default: the graph's own).
      fusion: overrides the preset's ``ops.fusion``.

    Returns:
      ``{"layer_split": ..., "pipeline": ...}`` (:class:`CoreSchedule`); on a one-core spec
      both are the single-core schedule.

    Raises:
      ConfigError: as :func:`npujax.lower`.
    """
    spec = as_spec(spec)
    if spec.array.cores_per_inference:  # this schedule places the layers on every core itself
        spec = spec.with_fields({"array.cores_per_inference": 0})
    if batch is not None:
        graph = rebatch(graph, batch)
    split = lower(graph, spec, quant, dataflow=dataflow, fusion=fusion)
    one = spec if spec.array.cores == 1 else spec.with_fields({"array.cores": 1})
    single = split if one is spec else lower(graph, one, quant, dataflow=dataflow, fusion=fusion)
    bw = spec.memory.dram_bytes_per_s
    names = tuple(r.name for r in split.layers)
    layer_split = CoreSchedule("layer_split", spec.array.cores, split.batch, split.latency_s,
                               split.latency_s, (names,), (split.latency_s,), (0.0,),
                               split.dram_bytes / bw)
    return {"layer_split": layer_split,
            "pipeline": _pipeline(graph, one, single, spec.array.cores, bw,
                                  spec.memory.core_link_bytes_per_s)}


def _pipeline(graph: Graph, one: NpuSpec, single: Schedule, cores: int, bw: float,
              link: float) -> CoreSchedule:
    layers = workloads(graph, one.with_fields({"ops.fusion": single.fusion}))
    cost = np.asarray([r.latency_s for r in single.layers])
    act = np.asarray([r.act_bits for r in single.layers], np.float64)
    on_chip = {e.producer for e in single.edges if e.placement != "dram"}
    # bytes crossing into a stage that starts at row a: tensors made before a, read at/after a
    cut = np.zeros(len(layers) + 1)
    crossing: dict[int, dict[int, float]] = {}
    for j, w in enumerate(layers):
        for p, n in w.inputs:
            if p >= 0:
                nbytes = n * act[j] / 8.0
                for a in range(p + 1, j + 1):
                    crossing.setdefault(a, {})[p] = nbytes
    for a, tensors in crossing.items():
        if link > 0:
            cut[a] = sum(tensors.values()) / link
        else:  # through DRAM: only tensors that fusion had kept on chip cost anything more
            cut[a] = sum(b for p, b in tensors.items()
                         if single.layers[p].name in on_chip) * 2.0 / bw
    starts = _partition(cost, cut, cores) if len(cost) else [0]
    bounds = list(starts) + [len(cost)]
    names = [r.name for r in single.layers]
    stages, stage_s, transfer_s = [], [], []
    for a, b in zip(bounds[:-1], bounds[1:]):
        t = float(cut[a]) if a > 0 else 0.0
        stages.append(tuple(names[a:b]))
        transfer_s.append(t)
        stage_s.append(float(cost[a:b].sum()) + t)
    dram_s = single.dram_bytes / bw
    latency = float(sum(stage_s))
    return CoreSchedule("pipeline", len(stages), single.batch, latency,
                        max(max(stage_s, default=0.0), dram_s), tuple(stages), tuple(stage_s),
                        tuple(transfer_s), dram_s)


def best_core_schedule(schedules: dict[str, CoreSchedule],
                       objective: str = "throughput") -> CoreSchedule:
    """The better of :func:`core_schedules`' results for ``objective``.

    Args:
      schedules: from :func:`core_schedules`.
      objective: ``throughput`` (shortest period; ties: lower latency) or ``latency``.

    Raises:
      ConfigError: an unknown objective.
    """
    if objective not in OBJECTIVES:
        raise ConfigError(f"unknown objective {objective!r}; use one of {', '.join(OBJECTIVES)}.")
    key = ((lambda s: (s.period_s, s.latency_s)) if objective == "throughput"
           else (lambda s: (s.latency_s, s.period_s)))
    return min(schedules.values(), key=key)

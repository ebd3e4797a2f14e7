"""Peak memory of a lowered model: SRAM from the fused schedule, DRAM from activation liveness.

* **SRAM.** At every row of the schedule the SRAM holds the row's working set (its tiled
  operand buffers) and the activations kept on chip across it (whole, or a depth-first
  stripe): ``Schedule.sram_peak_bytes`` of :func:`npujax.lower` with ``layer`` fusion, else the
  largest working set alone. It never exceeds the capacity: what does not fit streams from DRAM.
* **DRAM.** All weights (and int32 biases) stay in DRAM; an activation that the schedule does
  not keep on chip lives in DRAM from the row that produces it (graph inputs: from the start)
  to its last reader (graph outputs: to the end). The footprint is the weights plus the peak
  over rows of the live DRAM activations.

When the preset gives a DRAM capacity (``memory.dram_bytes`` > 0) and the footprint exceeds it,
the model cannot fit: its ``spill`` lists the layers whose weights would have to
stay in host memory (largest first, until the rest fits; all of them when the activations alone
exceed the capacity), fetched over the host link. When the DRAM activations alone exceed the
capacity (``activations_fit`` false), spilling weights is not enough: ``activation_spill`` lists
the activations (by producing layer) that would also have to live in host memory, largest live
tensor at the fullest step first, until the peak fits.

This is reporting (Python over the lowered schedule), not part of the jnp cost model.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from npujax.errors import ConfigError
from npujax.hw.spec import NpuSpec, as_spec
from npujax.ir.graph import Graph
from npujax.plan.lower import Schedule
from npujax.plan.program import inference_cores
from npujax.plan.workload import workloads

__all__ = ["MemoryReport", "memory_report"]


@dataclasses.dataclass(frozen=True)
class MemoryReport:
    """Memory a lowered model holds (bytes).

    Attributes:
      weight_bytes: weights and biases at their widths (all in DRAM).
      dram_activation_peak_bytes: peak of the activations live in DRAM at once.
      dram_footprint_bytes: ``weight_bytes + dram_activation_peak_bytes``.
      dram_capacity_bytes: the preset's ``memory.dram_bytes`` (0: unlimited).
      sram_peak_bytes: peak SRAM occupied (working set plus activations kept on chip).
      sram_capacity_bytes: ``(ifmap + filter + ofmap) x cores`` (under a per-model SRAM split,
        the buffers as the split sized them: ``Schedule.sram_split``).
      fits: whether the footprint fits the DRAM capacity.
      spill: ``(layer, weight bytes)`` that would have to stay in host memory to fit.
      activations_fit: whether the DRAM activations alone fit the capacity (else spilling
        every weight is not enough).
      activation_spill: ``(producing layer, activation bytes)`` that would also have to live in
        host memory when the activations alone do not fit (``"graph input"`` for the inputs).
    """

    weight_bytes: float
    dram_activation_peak_bytes: float
    dram_footprint_bytes: float
    dram_capacity_bytes: float
    sram_peak_bytes: float
    sram_capacity_bytes: float
    fits: bool
    spill: tuple[tuple[str, float], ...] = ()
    activations_fit: bool = True
    activation_spill: tuple[tuple[str, float], ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return {**dataclasses.asdict(self), "spill": [list(s) for s in self.spill],
                "activation_spill": [list(s) for s in self.activation_spill]}

    def _repr_html_(self) -> str:
        """The report as a table in a notebook (KiB)."""
        from npujax._html import html_table

        rows = [(f.name.replace("_bytes", " KiB").replace("_", " "),
                 getattr(self, f.name) / 1024 if f.name.endswith("_bytes") else
                 getattr(self, f.name)) for f in dataclasses.fields(self) if f.name != "spill"]
        rows += [(f"spill {layer} KiB", b / 1024) for layer, b in self.spill]
        return html_table("memory", ("", "value"), rows, numeric=[False, True])


def memory_report(graph: Graph, schedule: Schedule, spec: NpuSpec | str) -> MemoryReport:
    """Peak SRAM and DRAM of ``schedule`` (the result of ``lower(graph, spec, ...)``).

    Args:
      graph: the graph that was lowered (at the schedule's batch size).
      schedule: its :class:`~npujax.plan.Schedule`.
      spec: the NPU it was lowered on.

    Returns:
      The :class:`MemoryReport`.

    Raises:
      ConfigError: ``schedule`` was not lowered from ``graph`` (its layers differ).
    """
    spec = as_spec(spec)
    if spec.ops.fusion != schedule.fusion:
        spec = spec.with_fields({"ops.fusion": schedule.fusion})
    layers = workloads(graph, spec)
    rows = schedule.layers
    if [w.name for w in layers] != [r.name for r in rows]:
        raise ConfigError(
            f"memory_report: the schedule's {len(rows)} layers are not the {len(layers)} layers "
            f"of this graph (first: {rows[0].name if rows else None!r} vs "
            f"{layers[0].name if layers else None!r}); pass the graph the schedule was lowered "
            "from: memory_report(graph, lower(graph, spec), spec).")
    acc = spec.array.accumulator_bits
    w_bytes = np.asarray([w.weight_elems * (r.weight_bits or 0) / 8.0 + w.bias_elems * acc / 8.0
                          for w, r in zip(layers, rows)])
    on_chip = {e.producer for e in schedule.edges if e.placement != "dram"}
    n = len(layers)
    live = np.zeros(n + 1)
    last: dict[int, tuple[int, float]] = {}  # producer row -> (last reader, bytes)
    for j, w in enumerate(layers):
        for p, elems in w.inputs:
            if p < 0 or rows[p].name not in on_chip:
                prev = last.get(p, (j, 0.0))
                last[p] = (max(prev[0], j), max(prev[1], elems * rows[j].act_bits / 8.0))
    for i, w in enumerate(layers):
        if w.graph_output and rows[i].name not in on_chip:
            last[i] = (n, max(last.get(i, (n, 0.0))[1], w.out_elems * rows[i].act_bits / 8.0))
    for p, (end, nbytes) in last.items():
        live[max(p, 0):end + 1] += nbytes
    act_peak = float(live.max(initial=0.0))
    weights = float(w_bytes.sum())
    footprint = weights + act_peak
    cap = float(spec.memory.dram_bytes)
    act_spill: list[tuple[str, float]] = []
    if cap > 0 and act_peak > cap:  # spilling weights is not enough: activations go too
        left, rest = live.copy(), dict(last)
        while left.max(initial=0.0) > cap and rest:
            step = int(np.argmax(left))
            at = [p for p, (end, _) in rest.items() if max(p, 0) <= step <= end]
            if not at:
                break
            p = max(at, key=lambda q: rest[q][1])
            end, nbytes = rest.pop(p)
            left[max(p, 0):end + 1] -= nbytes
            act_spill.append((rows[p].name if p >= 0 else "graph input", float(nbytes)))
    m = spec.memory
    split = schedule.sram_split  # a per-model split: the buffers as the split sized them
    sram_cap = float((split["ifmap_sram_bytes"] + split["filter_sram_bytes"]
                      + split["ofmap_sram_bytes"] if split else
                      m.ifmap_sram_bytes + m.filter_sram_bytes + m.ofmap_sram_bytes)
                     * inference_cores(spec).array.cores)
    sram_peak = schedule.sram_peak_bytes or max((r.costs.sram_peak_bytes for r in rows),
                                                default=0.0)
    spill: list[tuple[str, float]] = []
    if cap > 0 and footprint > cap:
        over = footprint - cap
        for i in np.argsort(-w_bytes):
            if over <= 0 or w_bytes[i] <= 0:
                break
            spill.append((rows[int(i)].name, float(w_bytes[i])))
            over -= float(w_bytes[i])
    return MemoryReport(weights, act_peak, footprint, cap, float(sram_peak), sram_cap,
                        cap <= 0 or footprint <= cap, tuple(spill), cap <= 0 or act_peak <= cap,
                        tuple(act_spill))

"""Lower a Graph onto an NpuSpec: the per-layer :class:`Schedule` and end-to-end totals.

:func:`lower` builds the layers' workloads (:mod:`npujax.plan.workload`), takes each layer's
weight and activation widths from the quantization spec (the one precision vocabulary,
:data:`npujax.QuantSpec`), evaluates the one cost program (:func:`npujax.plan.program_costs`:
the per-layer model and every cost pass the preset's switches call for; one compiled program per
padded layer count, or per workload list where a pass needs static layers) and reports every
layer with its latency, breakdown, bound and where its activations lived. See
:mod:`npujax.plan.costs` and :mod:`npujax.plan.passes` for the model.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Collection, Sequence
from typing import Any

import jax
import numpy as np

from npujax import _program_cache
from npujax._xla_options import cpu_legacy_emitters
from npujax.errors import ConfigError
from npujax.hw.energy import AreaBreakdown, area_breakdown
from npujax.hw.spec import NpuSpec, as_spec
from npujax.ir.graph import Graph
from npujax.ir.passes import rebatch
from npujax.plan.costs import BREAKDOWN, LayerCosts, first_consumers
from npujax.plan.decompose import Decomposition, choose_rewrites
from npujax.plan.liveness import peak_activation_bytes
from npujax.plan.passes import cross_layer
from npujax.plan.passes.attention import (
    ATTENTION_MODES,
    AttentionChain,
    AttentionCosts,
    attention_chains,
)
from npujax.plan.passes.base import ProgramCosts
from npujax.plan.passes.cross_layer import PLACEMENTS, cross_layer_edges
from npujax.plan.passes.energy import ENERGY_BREAKDOWN, LayerEnergy
from npujax.plan.passes.onchip_split import split_spec
from npujax.plan.program import (
    active_passes,
    inference_cores,
    needs_static_layers,
    program_cost,
    program_costs,
)
from npujax.plan.table import layer_table, table_length
from npujax.plan.workload import Workload, workloads
from npujax.quantize.spec import QuantSpec
from npujax.systolic.dataflow import DATAFLOWS, get_dataflow

__all__ = ["LayerReport", "EdgeReport", "AttentionReport", "Schedule", "lower",
           "lower_by_dataflow", "Lowering", "lower_dataflows", "layer_bits", "weight_bytes",
           "DEFAULT_BITS", "ACTIVATION_PLACEMENTS", "activation_placements",
           "decompose_unsupported"]

#: Where a layer's activations live (``LayerReport.input_placement`` and
#: ``output_placement``): ``dram`` (through DRAM), ``sram`` (kept on chip whole by the
#: cross-layer placement), ``depth_first`` (a stripe buffer of a depth-first pair), ``fused``
#: (inside a GEMM's output stage, with the elementwise ops fused into it), ``attention`` (inside
#: an attention kernel: the scores never leave the chip), ``host`` (a layer on the host CPU).
ACTIVATION_PLACEMENTS = ("dram", "sram", "depth_first", "fused", "attention", "host")

#: Width of the layers a quantization spec does not name (and of every layer without one): the
#: int8 deployment NPUs are built for.
DEFAULT_BITS = 8


@dataclasses.dataclass(frozen=True)
class LayerReport:
    """One row of the per-layer table (all figures for the whole layer, all groups, all cores).

    Attributes:
      name, op, kind, device, reason: the layer (see :class:`~npujax.plan.workload.Workload`).
      M, K, N, macs: its GEMM extents after im2col and padding, and its true MACs.
      weight_bits, act_bits: the widths it was costed at (``weight_bits`` None for layers
        without weights).
      costs: its :class:`~npujax.plan.costs.LayerCosts` (Python numbers, array cycles).
      latency_s: ``costs.latency_cycles / clock_hz``.
      bound: ``compute``, ``memory``, ``transfer`` or ``fallback`` (``transfer``: an NPU
        layer whose host-link transfers, such as streamed weights, outlast its compute and
        memory time; else the larger of compute and memory cycles,
        or a host-CPU layer).
      epilogue: activations applied in the layer's output stage.
      energy: its :class:`~npujax.plan.LayerEnergy` (J, Python numbers; see
        :mod:`npujax.plan.passes.energy`).
      input_placement, output_placement: where the layer's activation inputs came from and
        where its output went, one of :data:`ACTIVATION_PLACEMENTS` (an input read from DRAM
        makes the layer's ``dram``; see :func:`activation_placements`).
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
    costs: LayerCosts
    latency_s: float
    bound: str
    epilogue: tuple[str, ...] = ()
    energy: LayerEnergy | None = None
    input_placement: str = "dram"
    output_placement: str = "dram"

    @property
    def energy_j(self) -> float:
        """The layer's energy (J); 0 if it was not computed."""
        return float(self.energy.total_j) if self.energy is not None else 0.0

    def breakdown(self) -> dict[str, float]:
        """Cycles per :data:`~npujax.plan.costs.BREAKDOWN` component; they sum to the latency."""
        return {k: float(v) for k, v in self.costs.breakdown().items()}

    def to_dict(self) -> dict[str, Any]:
        """The row as one flat JSON-ready dict (the costs' fields next to the layer's)."""
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
             if f.name not in ("costs", "energy")}
        energy = ({"energy_j": self.energy_j} | {
            f"energy_{k}_j": float(v) for k, v in self.energy.breakdown().items()}
            if self.energy is not None else {})
        return {**d, **self.costs._asdict(), **energy, "epilogue": list(self.epilogue)}


@dataclasses.dataclass(frozen=True)
class EdgeReport:
    """Where one activation tensor lived between layers (a ``layer``-fusion schedule).

    Attributes:
      producer: the layer that produced it.
      consumers: the layers that read it.
      tensor_bytes: its bytes at its width.
      placement: ``dram``, ``sram`` (kept on chip whole) or ``depth_first`` (the producer and
        its consumer ran stripe by stripe), see :mod:`npujax.plan.passes.cross_layer`.
      stripe_rows, stripes: the consumer's output rows per stripe and the number of stripes
        (depth-first; 0 otherwise).
      dram_bytes_saved: DRAM bytes saved against the layer-by-layer schedule (reads and the
        write avoided, less the weights re-read per stripe).
      extra_weight_bytes: weight bytes re-read for the stripes (depth-first).
    """

    producer: str
    consumers: tuple[str, ...]
    tensor_bytes: float
    placement: str
    stripe_rows: int
    stripes: int
    dram_bytes_saved: float
    extra_weight_bytes: float

    def to_dict(self) -> dict[str, Any]:
        """The edge as a JSON-ready dict."""
        return {**dataclasses.asdict(self), "consumers": list(self.consumers)}


@dataclasses.dataclass(frozen=True)
class AttentionReport:
    """How one attention block ran (:mod:`npujax.plan.passes.attention`).

    Attributes:
      qk, softmax, pv: the Q·Kᵀ MatMul, Softmax and P·V MatMul layers.
      layers: every layer of the chain (the scale, mask and transposes between included).
      mode: ``unfused``, ``on_chip`` (the scores stayed in SRAM) or ``flash`` (FlashAttention
        tiling), one of :data:`npujax.plan.passes.attention.ATTENTION_MODES`.
      query_block, key_block: FlashAttention's ``B_r`` and ``B_c`` (``B_c = S_k`` on chip).
      query_blocks, key_blocks: ``T_r`` and ``T_c``.
      dram_bytes_saved: DRAM bytes saved against the unfused chain.
    """

    qk: str
    softmax: str
    pv: str
    layers: tuple[str, ...]
    mode: str
    query_block: int
    key_block: int
    query_blocks: int
    key_blocks: int
    dram_bytes_saved: float

    def to_dict(self) -> dict[str, Any]:
        """The block as a JSON-ready dict."""
        return {**dataclasses.asdict(self), "layers": list(self.layers)}


@dataclasses.dataclass(frozen=True)
class Schedule:
    """The lowered model: per-layer reports and end-to-end totals on one NpuSpec and dataflow.

    ``fusion`` is the compiler's fusion level it was lowered at and ``mapping`` its DRAM-level
    mapping (:mod:`npujax.systolic.mapping`); with ``layer`` fusion,
    ``edges`` says where each activation lived, ``sram_peak_bytes`` is the peak SRAM occupied
    (working set plus activations kept on chip) of ``sram_capacity_bytes``, and
    ``unfused_dram_bytes`` / ``unfused_latency_s`` are the layer-by-layer figures of the same
    layers (residual epilogues fused, every activation through DRAM: the ``residual`` level).
    ``attention_fusion`` is the compiler's attention fusion capability and ``attention`` the
    recognised attention blocks and how each ran (:class:`AttentionReport`; with ``layer``
    fusion a fused block is a boundary of the cross-layer schedule, see
    :mod:`npujax.plan.passes.cross_layer`). ``area_mm2`` is the spec's modelled silicon area
    (:func:`npujax.hw.area_breakdown`, per block in ``area_breakdown_mm2``); energy per
    inference, its breakdown and the energy-delay product are derived from the layers'
    energies. ``rewrites`` holds, under the preset's ``ops.unsupported`` policy, the
    :class:`~npujax.plan.decompose.RewriteChoice` of each unsupported layer (rewritten or sent
    to the host, and why; empty under the default ``fallback``). ``sram_split``, on a preset
    with ``memory.sram_split = "per_model"``, is the split of the shared SRAM the compiler was
    modelled to choose (the activations' share and the bytes of each buffer and of the
    parameter cache; :mod:`npujax.plan.passes.onchip_split`), else None.
    """

    npu: str
    dataflow: str
    clock_hz: float
    batch: int
    layers: tuple[LayerReport, ...]
    peak_activation_bytes: int = 0
    fusion: str = "elementwise"
    mapping: str = "best"
    edges: tuple[EdgeReport, ...] = ()
    sram_peak_bytes: float = 0.0
    sram_capacity_bytes: float = 0.0
    unfused_dram_bytes: float | None = None
    unfused_latency_s: float | None = None
    attention_fusion: str = "none"
    attention: tuple[AttentionReport, ...] = ()
    area_mm2: float = 0.0
    area_breakdown_mm2: dict[str, float] = dataclasses.field(default_factory=dict)
    rewrites: tuple[Any, ...] = ()
    sram_split: dict[str, float] | None = None

    @property
    def energy_j(self) -> float:
        """Energy per inference (J, the graph's batch): the sum of the layers' energies."""
        return float(sum(r.energy_j for r in self.layers))

    @property
    def edp_js(self) -> float:
        """Energy-delay product (J s): ``energy_j * latency_s``."""
        return self.energy_j * self.latency_s

    def energy_breakdown_j(self) -> dict[str, float]:
        """Joules per :data:`~npujax.plan.ENERGY_BREAKDOWN` component (they sum to
        ``energy_j``)."""
        rows = [r.energy.breakdown() for r in self.layers if r.energy is not None]
        return {k: float(sum(b[k] for b in rows)) for k in ENERGY_BREAKDOWN}

    @property
    def dram_bytes(self) -> float:
        """DRAM bytes moved per inference (all layers)."""
        return float(sum(r.costs.dram_bytes for r in self.layers))

    @property
    def latency_s(self) -> float:
        """End-to-end latency in seconds: the sum of the per-layer latencies."""
        return float(sum(r.latency_s for r in self.layers))

    @property
    def latency_cycles(self) -> float:
        """End-to-end latency in array clock cycles."""
        return float(sum(r.costs.latency_cycles for r in self.layers))

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
            "dram_bytes": self.dram_bytes,
            "fusion": self.fusion,
            "mapping": self.mapping,
            "sram_peak_bytes": self.sram_peak_bytes,
            "sram_capacity_bytes": self.sram_capacity_bytes,
            "unfused_dram_bytes": self.unfused_dram_bytes,
            "unfused_latency_s": self.unfused_latency_s,
            "attention_fusion": self.attention_fusion,
            "attention": [a.to_dict() for a in self.attention],
            "breakdown_s": self.breakdown_s(),
            "energy_j": self.energy_j,
            "energy_breakdown_j": self.energy_breakdown_j(),
            "edp_js": self.edp_js,
            "area_mm2": self.area_mm2,
            "area_breakdown_mm2": dict(self.area_breakdown_mm2),
            "layers": [r.to_dict() for r in self.layers],
            "edges": [e.to_dict() for e in self.edges],
            "rewrites": [c.to_dict() for c in self.rewrites],
            "sram_split": None if self.sram_split is None else dict(self.sram_split),
        }

    def _repr_html_(self) -> str:
        """The per-layer table in a notebook (latency in µs, utilization in %)."""
        from npujax._html import html_table

        header = ("layer", "op", "device", "M", "K", "N", "MACs", "W bits", "A bits",
                  "latency cycles", "latency µs", "bound", "util %")
        rows = [(r["name"], r["op"], r["device"], r["M"] or None, r["K"] or None,
                 r["N"] or None, r["macs"] or None, r["weight_bits"], r["act_bits"],
                 round(r["latency_cycles"], 1), r["latency_s"] * 1e6, r["bound"],
                 round(100 * r["utilization"], 1) if r["macs"] else None)
                for r in (layer.to_dict() for layer in self.layers)]
        caption = (f"{self.npu} — {self.dataflow}, batch {self.batch}: "
                   f"{self.latency_s * 1e6:,.2f} µs, {self.macs:,} MACs, "
                   f"{self.throughput_per_s:,.0f} inferences/s")
        return html_table(caption, header, rows,
                          numeric=[h not in ("layer", "op", "device", "bound") for h in header])


def layer_bits(layers: list[Workload], quant: QuantSpec | None
               ) -> tuple[np.ndarray, np.ndarray]:
    """float32 ``[L]`` weight and activation widths of the workloads under ``quant``.

    GEMM layers take their :class:`~npujax.LayerQuant`'s widths (FP8: 8); layers the spec
    leaves out, and every layer when ``quant`` is None, take :data:`DEFAULT_BITS`. A vector
    layer runs at the width its first consumer wants (else its producer's): a GEMM's output
    stage requantizes for free, so a chain of layers never converts.

    Raises:
      ConfigError: the spec names a layer the graph does not cost, or one without weights, or
        holds a search mixture (several candidate widths).
    """
    wb = np.full(len(layers), DEFAULT_BITS, np.float32)
    ab = np.full(len(layers), DEFAULT_BITS, np.float32)
    if quant is None:
        return wb, ab
    index = {w.name: i for i, w in enumerate(layers)}
    # embedding tables (weight-only, quant_spec(embedding_bits=...)): a Gather reads one row
    # per token, costed as the vector layer's output; the table's width does not enter
    quant = {n: lq for n, lq in quant.items()
             if not (lq.act is None and n in index and layers[index[n]].op == "Gather")}
    unknown = sorted(set(quant) - set(index))
    if unknown:
        raise ConfigError(f"the quantization spec names unknown layers {unknown}; layers: "
                          f"{sorted(index)}.")
    no_weights = sorted(n for n in quant if layers[index[n]].kind != "gemm")
    if no_weights:
        raise ConfigError(f"the quantization spec names layers without weights: {no_weights}.")
    for name, lq in quant.items():
        i = index[name]
        wb[i] = lq.weight_bits or DEFAULT_BITS
        ab[i] = lq.act_bits or DEFAULT_BITS
    # vector layers run at the width their consumer wants (else their producer's)
    first = np.asarray(first_consumers(layers))
    for i in reversed(range(len(layers))):
        if layers[i].kind != "gemm" and first[i] >= 0:
            ab[i] = ab[first[i]]
    for i, w in enumerate(layers):
        if w.kind != "gemm" and first[i] < 0 and w.producer >= 0:
            ab[i] = ab[w.producer]
    return wb, ab


def weight_bytes(layers: list[Workload], spec: NpuSpec, weight_bits: np.ndarray) -> float:
    """Bytes of the weights (at ``weight_bits`` per layer) and int32 biases of the NPU layers."""
    acc = spec.array.accumulator_bits
    return float(sum(w.weight_elems * float(b) / 8.0 + w.bias_elems * acc / 8.0
                     for w, b in zip(layers, weight_bits) if w.device == "npu"))


def _resident(layers: list[Workload], spec: NpuSpec, wb: np.ndarray
              ) -> tuple[list[Workload], NpuSpec]:
    """Workloads without weight traffic, and the spec with the SRAM the weights leave free."""
    need = weight_bytes(layers, spec, wb)
    cores = inference_cores(spec).array.cores
    room = spec.memory.filter_sram_bytes * cores / 2
    if need > room:
        raise ConfigError(f"resident_weights: the weights take {need:,.0f} bytes, more than half "
                          f"of {spec.name}'s filter SRAM ({room:,.0f} bytes); stream them "
                          "(resident_weights=False) or use a preset with more filter SRAM.")
    free = max(1, spec.memory.filter_sram_bytes - int(np.ceil(need / cores)))
    return ([dataclasses.replace(w, weight_elems=0, bias_elems=0) if w.device == "npu" else w
             for w in layers], spec.with_fields({"memory.filter_sram_bytes": free}))


#: XLA options of the cost program that ``lower`` runs about once per compilation: LLVM's
#: optimizations take longer than they save (0.9 instead of 1.4 s to compile the three dataflows
#: of the PP-OCR detector; the program runs in well under a millisecond either way). The HLO
#: passes run as before. LLVM at -O2 may contract a multiply and an add into an FMA, which -O0
#: does not (DigitsCNN's energy total on bitfusion_16x16 does differ in its last bit between the
#: two), and tests/plan/test_fused_dataflows.py compares the programs bit for bit.
_ONCE = {"xla_backend_optimization_level": 0}  # (LLVM only: the HLO schedule is unchanged)
#: :data:`npujax._xla_options.LEGACY_EMITTERS` is added to :data:`_ONCE` on CPU where the
#: jaxlib knows it (:func:`_cost_options`): XLA:CPU's
#: legacy elemental emitters compile the program in x0.49-0.59 of the time of the MLIR fusion
#: emitters (jaxlib 0.10.2, 4 models, one and three dataflows). Bit for bit the same outputs:
#: ``experiments/bench/cost_program_options.py`` compares every array of the programs ``lower``
#: runs (the layer-table program, and the layer list's with attention chains) for 4 models x 8
#: presets x 2 dataflow sets x 5 settings (15,720 arrays, none differing), and
#: tests/plan/test_fused_dataflows.py a sample. The program of a static layer list can differ in
#: a last bit: run everywhere, as ``lower`` did before the layer tables, 40 of 11,880 arrays did
#: (the PP-OCRv4 recogniser's transfer and latency cycles on tpu_v1); ``lower`` now runs it only
#: with attention chains, where none of the checked cases differed. Since the instruction_stream
#: pass (in every program of a traced spec), the two emitters round 2 of DigitsCNN's DMA cycles
#: on bitfusion_16x16 1 ulp apart (tests/plan/test_fused_dataflows.py); ``lower`` always runs
#: the one it chose, so its figures do not depend on it.


@functools.lru_cache(maxsize=1)
def _cost_options() -> dict[str, Any]:
    """The ``compiler_options`` of ``lower``'s cost programs: :data:`_ONCE`, with
    :data:`npujax._xla_options.LEGACY_EMITTERS` on CPU when this jaxlib accepts the option
    (:func:`npujax._xla_options.cpu_legacy_emitters`: a jaxlib without it refuses the option,
    and the cost program then compiles with the default emitters)."""
    return {**_ONCE, **cpu_legacy_emitters()}


def _with_total(energy: LayerEnergy) -> LayerEnergy:
    """``energy`` (``[L]`` float64 numpy components, ``total_j`` None) with ``total_j`` their sum
    in :data:`~npujax.plan.passes.energy.ENERGY_BREAKDOWN` order, as :func:`layer_energy` adds them.

    The cost program leaves the total out: its fusion recomputes all six components, and
    without it the program compiles in 0.87 of the time (DigitsCNN and the PP-OCR detector, three
    dataflows); the host's float64 sum is the program's total bit for bit (all 8,670 arrays of
    3 models x 8 presets x 3 dataflows x 5 width/spec settings compared, ``np.array_equal``)."""
    mac, register, sram, dram, vector, host = energy[:6]
    return energy._replace(total_j=mac + register + sram + dram + vector + host)


#: The named tuples in the cost programs' outputs (:func:`_program_outputs`).
_OUTPUT_TYPES = (LayerCosts, LayerEnergy, AreaBreakdown, AttentionCosts)


def _program_outputs(out: tuple[ProgramCosts, ...], dataflows: tuple[str, ...],
                     spec: NpuSpec) -> tuple[Any, ...]:
    """``(by_dataflow, energies, area, attention, sram_split)`` of the cost program's answers,
    the energies' ``total_j`` left to the host (:func:`_with_total`)."""
    by_df = {df: o.costs for df, o in zip(dataflows, out)}
    energy = {df: o.layer_energy._replace(total_j=None) for df, o in zip(dataflows, out)}
    att = {df: o.attention for df, o in zip(dataflows, out) if o.attention is not None}
    split = {df: o.sram_split for df, o in zip(dataflows, out) if o.sram_split is not None}
    return by_df, energy, area_breakdown(spec), att, split


def _static_costs(layers: tuple[Workload, ...], dataflows: tuple[str, ...],
                  chains: tuple[AttentionChain, ...] = ()):
    """The cost program of :func:`_jitted_costs`, not jitted: ``(spec, w, a)`` to
    ``(by_dataflow, energies, area, attention)``."""
    def run(spec, w, a):
        out = program_costs(layers, spec, w, a, dataflows=dataflows, chains=chains)
        return _program_outputs(out, dataflows, spec)
    return run


@functools.lru_cache(maxsize=64)
def _jitted_costs(layers: tuple[Workload, ...], dataflows: tuple[str, ...],
                  chains: tuple[AttentionChain, ...] = ()):
    """One compiled cost program per (workloads, dataflows, attention chains), all dataflows
    in one program (:func:`npujax.plan.program.program_costs`), with each one's energy
    (``total_j`` None: :func:`_with_total` sums it), attention decisions and the area; hardware
    and bits stay traced."""
    return jax.jit(_static_costs(layers, dataflows, chains), compiler_options=_cost_options())


def _table_costs(dataflows: tuple[str, ...]):
    """The cost program of :func:`_jitted_table_costs`, not jitted: ``(spec, w, a, table)`` to
    ``(by_dataflow, energies, area, attention)``."""
    def run(spec, w, a, table):
        out = program_costs(table, spec, w, a, dataflows=dataflows)
        return _program_outputs(out, dataflows, spec)
    return run


@functools.lru_cache(maxsize=16)
def _jitted_table_costs(dataflows: tuple[str, ...]):
    """One compiled cost program per dataflows for every workload list: the layers enter as
    a traced :class:`~npujax.plan.LayerTable` (padded to :func:`~npujax.plan.table.
    table_length` rows, so a program serves all lists of its length), as :func:`_jitted_costs`
    computes them without attention chains (bit for bit: ``tests/plan/test_layer_table.py``)."""
    return jax.jit(_table_costs(dataflows), compiler_options=_cost_options())


def _program_spec(spec: NpuSpec) -> NpuSpec:
    """``spec`` with the static fields that the table program does not read (name, description,
    default dataflow, activation layout, operator lists, fusion levels: the workloads and the
    chains carry their effect) set to one value each, so that specs differing only there share
    one compiled program; the precision scaling and the DRAM-level mapping stay."""
    return dataclasses.replace(
        spec, name="", description="",
        array=dataclasses.replace(spec.array, dataflow=DATAFLOWS[0]),
        layout=dataclasses.replace(spec.layout, activation_layout="NHWC"),
        ops=dataclasses.replace(spec.ops, supported=(), fused_activations=(),
                                fusion="elementwise", attention_fusion="none"))


def _costs_program(layers: list[Workload], names: tuple[str, ...],
                   chains: tuple[AttentionChain, ...], spec: NpuSpec, wb: np.ndarray,
                   ab: np.ndarray) -> tuple[Any, ...]:
    """``(by_dataflow, energies, area, attention)`` of ``layers`` as numpy ``[L]`` arrays: the
    shared program of traced workload tables (:func:`_table_costs`), or where a pass needs the
    layers as a static list (attention chains) the program of this list (:func:`_static_costs`),
    traced and run with numpy (:func:`npujax._program_cache.evaluate`); compiled instead
    (:func:`_jitted_table_costs`, :func:`_jitted_costs`, or through ``_program_cache.call``
    for the command line) within ``numpy_evaluation(False)`` or for a program numpy cannot
    run."""
    if needs_static_layers(spec, chains):
        key = (tuple(layers), names, chains)
        res = _run_cost_program(_static_costs(*key), _jitted_costs(*key), (spec, wb, ab),
                                name="costs", static=key)
        return jax.tree.map(np.asarray, res)
    n = len(layers)
    length = table_length(n)
    table = layer_table(layers, length)
    pad = np.full(length - n, float(DEFAULT_BITS), np.float32)
    w, a = np.concatenate([wb, pad]), np.concatenate([ab, pad])
    res = _run_cost_program(_table_costs(names), _jitted_table_costs(names),
                            (_program_spec(spec), w, a, table), name="table_costs",
                            static=names)
    return jax.tree.map(lambda x: np.asarray(x)[:n] if np.ndim(x) else np.asarray(x), res)


def _run_cost_program(fn: Any, jitted: Any, args: tuple[Any, ...], *, name: str,
                      static: Any) -> Any:
    """``fn(*args)`` run with numpy (:func:`npujax._program_cache.evaluate`); compiled where
    numpy cannot run it or within ``numpy_evaluation(False)``, through
    :func:`npujax._program_cache.call` (``jitted``, ``fn`` jitted with :func:`_cost_options`,
    where the command line keeps no programs)."""
    return _program_cache.evaluate(
        fn, args, lambda: _program_cache.call(fn, args, name=name, static=static, jitted=jitted,
                                              compiler_options=_cost_options(),
                                              node_types=_OUTPUT_TYPES),
        name=name, static=static)


def _fused_costs(layers: tuple[Workload, ...], dataflow: str,
                 chains: tuple[AttentionChain, ...] = ()):
    """The program of :func:`_jitted_fused`, not jitted."""
    def run(spec, w, a):
        return program_cost(layers, spec, w, a, dataflow, chains=chains), area_breakdown(spec)
    return run


@functools.lru_cache(maxsize=64)
def _jitted_fused(layers: tuple[Workload, ...], dataflow: str,
                  chains: tuple[AttentionChain, ...] = ()):
    """One compiled ``layer``-fusion program per (workloads, dataflow, attention chains): the
    cost program's answer (with the layer-by-layer costs, the energy, the edges and the
    attention decisions) and the area."""
    return jax.jit(_fused_costs(layers, dataflow, chains))


def lower(
    graph: Graph,
    spec: NpuSpec | str,
    quant: QuantSpec | None = None,
    *,
    dataflow: str | None = None,
    batch: int | None = None,
    fusion: str | None = None,
    resident_weights: bool = False,
    mapping: str | None = None,
) -> Schedule:
    """Lower ``graph`` onto ``spec`` and return the per-layer :class:`Schedule`.

    Args:
      graph: an optimized graph (see :func:`npujax.optimize`); its traced batch size is the
        inference batch.
      spec: the NPU: an :class:`~npujax.hw.NpuSpec`, or a preset name or TOML path.
      quant: the layers' precision (:func:`npujax.quant_spec`, rules, or a searched policy's
        :meth:`~npujax.search.PrecisionPolicy.quant_spec`); None costs every layer at 8 bits
        (see :func:`layer_bits`).
      dataflow: overrides the preset's dataflow (``weight_stationary`` etc.).
      batch: inference batch size (default: the graph's own; see :func:`npujax.rebatch`).
      fusion: overrides the preset's ``ops.fusion`` (``none``, ``elementwise``, ``residual``,
        ``layer``; see :data:`npujax.hw.FUSION_LEVELS` and :mod:`npujax.plan.passes.cross_layer`).
      resident_weights: the weights (and biases) stay in the filter SRAM across inferences
        (loaded once, as for a model served in a loop): no weight traffic per inference, and
        the layers tile with the filter SRAM the weights leave free. They must fit in half of
        it (see :func:`weight_bytes`).
      mapping: overrides the preset's ``memory.mapping``: ``best`` (the default: per layer the
        DRAM-level fold order and chunking with the fewest DRAM bytes) or ``scalesim``
        (SCALE-Sim's fixed order); see :mod:`npujax.systolic.mapping`.

    Returns:
      The :class:`Schedule`; its per-layer ``latency_s`` sum to ``Schedule.latency_s``.

    Raises:
      ConfigError: an unknown preset, dataflow, mapping, fusion level or layer name, a layer
        without weights or a search mixture in ``quant``; ``resident_weights`` for weights
        that do not fit in half the filter SRAM; a non-finite or negative figure (never reported).
      LimitError: a layer beyond 2**53 MACs or elements (:func:`npujax.plan.workloads`).
      UnsupportedOpError: under the preset's ``ops.unsupported = "rewrite_or_refuse"``, a layer
        the NPU does not run and no rule rewrites (:func:`decompose_unsupported`).
    """
    spec = as_spec(spec)
    name = get_dataflow(dataflow or spec.array.dataflow).name
    return lower_by_dataflow(graph, spec, quant, dataflows=(name,), batch=batch, fusion=fusion,
                             resident_weights=resident_weights, mapping=mapping)[name]


def lower_by_dataflow(
    graph: Graph,
    spec: NpuSpec | str,
    quant: QuantSpec | None = None,
    *,
    dataflows: Sequence[str] = DATAFLOWS,
    batch: int | None = None,
    fusion: str | None = None,
    resident_weights: bool = False,
    mapping: str | None = None,
) -> dict[str, Schedule]:
    """:func:`lower` at several dataflows, their costs evaluated in one compiled call.

    The workloads, widths and per-layer reports are built once, and the cost model of all
    ``dataflows`` is one program (:func:`npujax.plan.program_costs`): a dataflow
    comparison costs one compilation, not one per dataflow. Each schedule equals
    ``lower(..., dataflow=d)``'s (counts bit for bit; real-valued figures up to the last bit
    where XLA fuses the two programs' float arithmetic differently). With ``layer`` fusion
    each dataflow is its own program (:mod:`npujax.plan.passes.cross_layer`).

    Args:
      graph: an optimized graph, as in :func:`lower`.
      spec: the NPU (its own dataflow is not used), as in :func:`lower`.
      quant: the layers' precision, as in :func:`lower`.
      dataflows: the dataflow names (or ``ws``/``os``/``is``); default all of
        :data:`npujax.systolic.DATAFLOWS`.
      batch: inference batch size, as in :func:`lower`.
      fusion: overrides the preset's fusion level, as in :func:`lower`.
      resident_weights: weights kept in the filter SRAM, as in :func:`lower`.
      mapping: overrides the preset's DRAM-level mapping, as in :func:`lower`.

    Returns:
      ``{dataflow: Schedule}`` keyed by the full dataflow names, in the order given.

    Raises:
      ConfigError: as :func:`lower`; no dataflow, or one given twice.
      LimitError: as :func:`lower`.
    """
    spec = as_spec(spec)
    names = tuple(get_dataflow(d).name for d in dataflows)
    if not names or len(set(names)) < len(names):
        raise ConfigError(f"lower_by_dataflow needs distinct dataflows, got {list(dataflows)}.")
    if fusion is not None and fusion != spec.ops.fusion:
        spec = spec.with_fields({"ops.fusion": fusion})
    if mapping is not None and mapping != spec.memory.mapping:
        spec = spec.with_fields({"memory.mapping": mapping})
    if batch is not None:
        graph = rebatch(graph, batch)
    rewrites: tuple[Any, ...] = ()
    if spec.ops.unsupported != "fallback":  # per layer, rewrite or fall back (plan.decompose)
        dec = decompose_unsupported(graph, spec, quant=quant, dataflow=names[0],
                                    resident_weights=resident_weights)
        graph, quant, rewrites = dec.graph, dec.quant, dec.choices
        spec = spec.with_fields({"ops.unsupported": "fallback"}, name=spec.name)
    layers = workloads(graph, spec)
    wb, ab = layer_bits(layers, quant)
    if resident_weights:
        layers, spec = _resident(layers, spec, wb)
    batch_size = int(graph.tensors[graph.inputs[0]].shape[0]) if graph.inputs else 1
    act = DEFAULT_BITS if quant is None else int(max(ab, default=DEFAULT_BITS))
    peak = peak_activation_bytes(graph, act)
    out: dict[str, Schedule] = {}
    with jax.enable_x64(True):  # the spec's numbers enter as int64/float64 (npujax._exact)
        chains = attention_chains(graph, layers)
        stationary = _stationary_activations(graph, layers)
        # the cross-layer placement as its own program per dataflow (the programs it had before
        # the one cost program, so its figures stay bit for bit; see test_published_numbers)
        if cross_layer.PASS in active_passes(spec, chains):
            for df in names:
                costs, energy, area, extra = _layer_fused(tuple(layers), spec, wb, ab, df,
                                                          chains)
                out[df] = _schedule(spec, df, layers, wb, ab, costs, energy, area, batch_size,
                                    peak, extra, stationary)
        else:
            by_df, energies, area, att, split = _costs_program(layers, names, chains, spec, wb,
                                                               ab)
            for df in names:
                out[df] = _schedule(spec, df, layers, wb, ab, by_df[df],
                                    _with_total(energies[df]), area,
                                    batch_size, peak,
                                    {**_attention_report(layers, chains, att.get(df)),
                                     **_split_report(spec, split.get(df))}, stationary)
    if rewrites:
        out = {df: dataclasses.replace(v, rewrites=rewrites) for df, v in out.items()}
    return out


def decompose_unsupported(graph: Graph, spec: NpuSpec | str, params: Any = None,
                          quant: QuantSpec | None = None, *, dataflow: str | None = None,
                          policy: str | None = None, resident_weights: bool = False
                          ) -> Decomposition:
    """Rewrite, fall back or refuse each layer ``spec`` does not run, as its
    ``ops.unsupported`` (or ``policy``) says, comparing whole-graph latencies from :func:`lower`
    (:func:`npujax.plan.decompose.choose_rewrites`; the rules are :mod:`npujax.ir.rewrites`).

    Args:
      graph: an optimized graph.
      spec: the NPU (an :class:`~npujax.hw.NpuSpec`, a preset name or a TOML path).
      params: the graph's params, rewritten along (None: the structure alone, for costing).
      quant: the layers' precision (a rewritten GEMM's entry carries over to its parts).
      dataflow: the dataflow the latencies are compared at (default: the preset's).
      policy: overrides ``spec.ops.unsupported`` (:data:`~npujax.hw.UNSUPPORTED_POLICIES`).
      resident_weights: compare with resident weights, as :func:`lower`.

    Returns:
      A :class:`~npujax.plan.decompose.Decomposition` (graph, params, choices, quant).

    Raises:
      UnsupportedOpError: under ``rewrite_or_refuse``, a layer no rule rewrites.
      ConfigError: as :func:`lower`.
    """
    def latency(g: Graph, q: Any, s: NpuSpec) -> float:
        return lower(g, s, q, dataflow=dataflow, resident_weights=resident_weights).latency_s

    return choose_rewrites(graph, as_spec(spec), latency, params, quant, policy=policy)


def _stationary_activations(graph: Graph, layers: Sequence[Workload]) -> frozenset[str]:
    """Names of the GEMM layers whose second (stationary) operand is an activation."""
    gemms = {w.name for w in layers if w.kind == "gemm"}
    return frozenset(n.name for n in graph.nodes if n.name in gemms
                     and sum(t not in graph.constants for t in n.inputs) > 1)


def _attention_report(layers: list[Workload], chains: tuple[AttentionChain, ...],
                      att: Any) -> dict[str, Any]:
    """The schedule's ``attention`` field from :func:`attention_costs`' decisions."""
    if att is None:
        return {}
    n = [w.name for w in layers]
    return dict(attention=tuple(AttentionReport(
        n[c.qk], n[c.softmax], n[c.pv], tuple(n[r] for r in c.rows),
        ATTENTION_MODES[int(att.mode[i])], int(att.query_block[i]), int(att.key_block[i]),
        int(att.query_blocks[i]), int(att.key_blocks[i]), float(att.saved_bytes[i]))
        for i, c in enumerate(chains)))


def _layer_fused(layers: tuple[Workload, ...], spec: NpuSpec, wb: np.ndarray, ab: np.ndarray,
                 dataflow: str, chains: tuple[AttentionChain, ...]
                 ) -> tuple[LayerCosts, LayerEnergy, Any, dict[str, Any]]:
    """The ``layer``-fusion costs, energy and area at one dataflow, and the schedule's edge
    and attention fields."""
    key = (layers, dataflow, chains)
    p, area = jax.tree.map(np.asarray, _program_cache.evaluate(
        _fused_costs(*key), (spec, wb, ab), lambda: _jitted_fused(*key)(spec, wb, ab),
        name="fused_costs", static=key))
    costs, ec, unfused, energy, att = p.costs, p.edges, p.unfused, p.energy, p.attention
    names = [w.name for w in layers]
    extra = dict(
        edges=tuple(EdgeReport(
            names[e.producer], tuple(names[c] for c in e.consumers),
            float(ec.tensor_bytes[i]), PLACEMENTS[int(ec.mode[i])],
            int(ec.stripe_rows[i]), int(ec.stripes[i]) if ec.mode[i] == 2 else 0,
            float(ec.saved_bytes[i]), float(ec.extra_weight_bytes[i]))
            for i, e in enumerate(cross_layer_edges(layers))),
        sram_peak_bytes=float(np.max(ec.sram_bytes, initial=0.0)),
        sram_capacity_bytes=float(ec.sram_capacity),
        unfused_dram_bytes=float(np.sum(unfused.dram_bytes)),
        unfused_latency_s=float(np.sum(unfused.latency_cycles)) / spec.array.clock_hz,
        **_attention_report(list(layers), chains, att),
        **_split_report(spec, p.sram_split))
    return costs, energy, area, extra


def _split_report(spec: NpuSpec, share: Any) -> dict[str, Any]:
    """The schedule's ``sram_split`` of the share the ``onchip_split`` pass chose (none where
    it did not run): the bytes each use got (:func:`~npujax.plan.passes.onchip_split.
    split_spec`, all cores alike)."""
    if share is None:
        return {}
    m = split_spec(spec, float(share)).memory
    return {"sram_split": {
        "activation_share": float(share),
        "onchip_sram_bytes": float(spec.memory.onchip_sram_bytes),
        "filter_sram_bytes": float(spec.memory.filter_sram_bytes),
        "ifmap_sram_bytes": float(m.ifmap_sram_bytes),
        "ofmap_sram_bytes": float(m.ofmap_sram_bytes),
        "parameter_cache_bytes": float(m.parameter_cache_bytes)}}


def activation_placements(layers: Sequence[Workload], edges: Sequence[EdgeReport] = (),
                          attention: Sequence[AttentionReport] = (),
                          stationary_activations: Collection[str] = ()
                          ) -> list[tuple[str, str]]:
    """``(input, output)`` placement of every layer's activations (:data:`ACTIVATION_PLACEMENTS`).

    A layer's output is ``host`` on the CPU; ``attention`` inside an attention kernel (every row
    of a fused chain but its P·V); ``fused`` when an elementwise op in its own output stage
    consumes it; else the placement of its tensor (the cross-layer edge it starts, else
    ``dram``). Its input is ``host`` on the CPU; ``dram`` when any activation input is read from
    DRAM (a GEMM of two activations reads its second, the array's stationary operand, from
    DRAM as it reads weights); else the deepest on-chip placement among its inputs
    (``depth_first``, ``sram``, ``attention``); ``fused`` when it reads only its own fusion group
    (an epilogue).

    Args:
      layers: the workloads, in schedule order.
      edges: where each cross-layer tensor lived (``Schedule.edges``, ``layer`` fusion).
      attention: the attention blocks (``Schedule.attention``); those not ``unfused`` ran
        as kernels.
      stationary_activations: names of the GEMM layers whose stationary operand is an
        activation (MatMul, Einsum of two activations).

    Returns:
      One ``(input_placement, output_placement)`` per layer.
    """
    index = {w.name: i for i, w in enumerate(layers)}
    out_of = {index[e.producer]: e.placement for e in edges}
    kernel_out: set[int] = set()
    kernel_in: set[int] = set()
    for a in attention:
        if a.mode == "unfused":
            continue
        rows = {index[n] for n in a.layers}
        kernel_out |= rows - {index[a.pv]}
        kernel_in |= rows - {index[a.qk]}
    heads = {index[w.fused_into] for w in layers if w.fused_into in index}
    out = []
    for i, w in enumerate(layers):
        if w.device != "npu":
            out.append(("host", "host"))
            continue
        if i in kernel_out:
            o = "attention"
        elif i in heads and i not in out_of:
            o = "fused"
        else:
            o = out_of.get(i, "dram")
        ins = ["dram" if p < 0 or layers[p].device != "npu" else
               "attention" if i in kernel_in and p in kernel_out else out_of.get(p, "dram")
               for p, _ in w.inputs]
        if w.name in stationary_activations:
            ins.append("dram")
        if not ins:
            inp = "fused" if w.fused_into else "dram"
        elif "dram" in ins:
            inp = "dram"
        else:
            inp = next(k for k in ("depth_first", "sram", "attention") if k in ins)
        out.append((inp, o))
    return out


def _schedule(spec: NpuSpec, dataflow: str, layers: list[Workload], wb: np.ndarray,
              ab: np.ndarray, costs: LayerCosts, energy: LayerEnergy, area: Any,
              batch_size: int, peak: int, extra: dict[str, Any],
              stationary: Collection[str] = ()) -> Schedule:
    """The :class:`Schedule` of evaluated costs and energy (numpy ``[L]`` arrays).

    Raises:
      ConfigError: a non-finite or negative figure.
    """
    for field, v in {**costs._asdict(), **energy._asdict()}.items():  # never NaN/inf (#11)
        bad = np.flatnonzero(~np.isfinite(v) | (v < 0))
        if bad.size:
            raise ConfigError(
                f"the cost model gives {field} = {v[bad[0]]} for layer {layers[bad[0]].name!r} "
                f"on {spec.name!r}: the hardware values are outside what npujax can model "
                "(see the ranges in docs/hw.md).")
    ints = ("compute_cycles", "fill_drain_cycles", "folds")
    clock = spec.array.clock_hz
    # Python numbers for the reports, converted per field at once (not per element)
    cols = {k: (v.astype(np.int64) if k in ints else v.astype(np.float64)).tolist()
            for k, v in costs._asdict().items()}
    energy_cols = [np.asarray(v, np.float64).tolist() for v in energy]
    placements = activation_placements(layers, extra.get("edges", ()),
                                       extra.get("attention", ()), stationary)
    reports = []
    for i, w in enumerate(layers):
        c = LayerCosts(**{k: v[i] for k, v in cols.items()})
        bound = ("fallback" if w.device == "cpu" else
                 "transfer" if c.transfer_cycles > max(c.compute_cycles, c.memory_cycles) else
                 "compute" if c.compute_cycles >= c.memory_cycles else "memory")
        reports.append(LayerReport(
            name=w.name, op=w.op, kind=w.kind, device=w.device, reason=w.reason, M=w.M, K=w.K,
            N=w.N, macs=w.macs, weight_bits=int(wb[i]) if w.kind == "gemm" else None,
            act_bits=int(ab[i]), costs=c, latency_s=c.latency_cycles / clock, bound=bound,
            epilogue=w.epilogue, energy=LayerEnergy(*(e[i] for e in energy_cols)),
            input_placement=placements[i][0], output_placement=placements[i][1]))
    return Schedule(spec.name, dataflow, clock, batch_size, tuple(reports), peak,
                    fusion=spec.ops.fusion, mapping=spec.memory.mapping,
                    attention_fusion=spec.ops.attention_fusion,
                    area_mm2=float(area.total_mm2),
                    area_breakdown_mm2={k.removesuffix("_mm2"): float(v) for k, v in
                                        area._asdict().items() if k != "total_mm2"}, **extra)


@dataclasses.dataclass(frozen=True)
class Lowering:
    """A model lowered at one dataflow and, for comparison, at every dataflow.

    Attributes:
      schedule: the schedule at the chosen dataflow.
      by_dataflow: ``{dataflow: schedule}`` for every dataflow.
      graph: under a preset's ``ops.unsupported`` other than ``fallback``, the graph lowered
        (with the chosen rewrites, at the batch size asked for); None: the graph given.
    """

    schedule: Schedule
    by_dataflow: dict[str, Schedule]
    graph: Graph | None = None


def lower_dataflows(graph: Graph, spec: NpuSpec, quant: QuantSpec | None = None, *,
                    dataflow: str | None = None, batch: int | None = None) -> Lowering:
    """:func:`npujax.lower` at ``dataflow`` (default the preset's) and at every systolic
    dataflow (:data:`npujax.systolic.DATAFLOWS`, plus the chosen one when it is
    ``row_stationary``), the costs evaluated in one compiled call (:func:`lower_by_dataflow`).
    """
    chosen = get_dataflow(dataflow or spec.array.dataflow).name
    # the systolic dataflows, and the chosen one when it is not among them (row_stationary)
    names = DATAFLOWS + ((chosen,) if chosen not in DATAFLOWS else ())
    if spec.ops.unsupported == "fallback":
        by_df = lower_by_dataflow(graph, spec, quant, dataflows=names, batch=batch)
        return Lowering(by_df[chosen], by_df)
    # the rewrites decided once, at the chosen dataflow; every dataflow costs that graph
    if batch is not None:
        graph = rebatch(graph, batch)
    dec = decompose_unsupported(graph, spec, quant=quant, dataflow=chosen)
    plain = spec.with_fields({"ops.unsupported": "fallback"})
    by_df = {df: dataclasses.replace(s, rewrites=dec.choices) for df, s in
             lower_by_dataflow(dec.graph, plain, dec.quant, dataflows=names).items()}
    return Lowering(by_df[chosen], by_df, graph=dec.graph)

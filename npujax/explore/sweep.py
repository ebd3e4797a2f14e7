"""Evaluate a design-space sweep: every configuration of a :class:`~npujax.explore.Grid`
through the one cost program (:func:`npujax.plan.program_costs`: every cost pass the spec's
switches call for, as :func:`npujax.lower` applies them), vmapped and sharded over devices.

For each combination of the grid's static axes other than the dataflow (precision scaling,
mapping, layout and operator fields: they change the program's formulas or the workloads; a grid
of numeric fields, bit widths and dataflows has none) the layers' workloads are built once and one
jitted program evaluates all the configurations of that combination: ``jax.vmap`` over a
stacked :class:`~npujax.NpuSpec` (its numeric leaves ``[n]`` arrays, int64/float64:
:func:`npujax.hw.fields.stack`), the ``bits`` axis and the dataflow's index (data inside the
cost formulas, :class:`npujax.systolic.dataflow.Roles`, for the systolic dataflows; with
``row_stationary`` in the grid the program costs every dataflow and each configuration takes
its own by an exact select), sharded over the local devices by a
``jax.sharding.Mesh`` with one ``config`` axis (``NamedSharding(mesh, P("config"))`` on every input
and output; sharded ``jit``). The configurations are independent, and each configuration's layer
sums take one fixed order (:func:`npujax.plan.layer_sums`), so the sharded program runs the same
per-configuration arithmetic as on one device and gives the same numbers, bit for bit, for any batch
(tested on 8 host devices, and batches of 5 and 40). Batches are padded to a power of two (a
multiple of the device count) so a long sweep compiles a few programs, not one per batch size.

The layers enter the program as a traced :class:`~npujax.plan.LayerTable` padded with inert rows
(``_table_length``: at most 1/8 more rows), as ``lower``'s cost program takes them, so one
program serves every model of a padded length, with the figures of the program that holds the
layers as constants, bit for bit (tests/explore/test_sweep.py); only a pass that needs the
layers static (attention kernels, layer fusion) compiles a program per layer list. Where the
command line keeps programs (``npujax._program_cache``) the traced program is kept as well, so
a second process neither traces nor compiles it.

A small sweep (at most :data:`NUMPY_MAX_CONFIGS` configurations in all) runs the same traced
program with numpy instead (``npujax._program_cache.evaluate``, as ``lower`` does): XLA
would spend seconds compiling a program that then runs for a fraction of one. Its figures are
the compiled program's to float64 rounding (XLA's algebraic simplifier reassociates some
divisions, and its float64 ``exp`` is not correctly rounded: at most a last bit apart), and the
same bits for any batch and device count. The choice is made from the whole sweep's size, so
every chunk, slice and process of one sweep takes the same path.

Each configuration reduces its layers to one row of :data:`COLUMNS` (totals, per layer class,
utilization); :class:`SweepResult` holds the rows with the axis values and derives the bounds,
resources and the Pareto front. Each row also holds the energy per inference and its
breakdown (:func:`npujax.plan.layer_energy`), the energy-delay product and the modelled area
(:func:`npujax.hw.area_mm2`), so a Pareto front can trade latency or energy against area; the
resources ``pes`` (MAC units) and ``sram_bytes`` (on-chip buffers) stay as columns. With a
DVFS table in the spec's ``[thermal]`` section the row also holds ``sustained_latency_s``, the
latency the chip sustains once it has heated up (:mod:`npujax.plan.thermal`; the latency itself
without a table), and ``steady_temperature_c``, so a Pareto front can trade sustained rather
than cold latency (``sweep --pareto sustained_latency_s,area_mm2``).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import operator
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from npujax import _program_cache
from npujax._exact import COUNT, computing_once, real
from npujax.errors import ConfigError
from npujax.explore.grid import Grid, configurations
from npujax.hw import fields
from npujax.hw.energy import area_mm2
from npujax.hw.spec import NpuSpec, as_spec
from npujax.ir.graph import Graph
from npujax.plan.lower import DEFAULT_BITS, _program_spec
from npujax.plan.passes.attention import AttentionChain
from npujax.plan.passes.energy import ENERGY_BREAKDOWN
from npujax.plan.program import (
    Network,
    inference_cores,
    layer_sums,
    needs_static_layers,
    network,
    program_costs,
    totals,
)
from npujax.plan.table import MIN_LENGTH, LayerTable, layer_table
from npujax.plan.thermal import thermal_state
from npujax.plan.workload import Workload
from npujax.systolic.dataflow import DATAFLOWS, Roles, get_dataflow

__all__ = ["sweep", "evaluate", "evaluate_configs", "SweepResult", "COLUMNS", "INT_COLUMNS",
           "LAYER_CLASSES", "NUMPY_MAX_CONFIGS", "runs_with_numpy"]

#: Layer classes reported separately: GEMMs on the array, other NPU layers on the vector unit,
#: layers that fall back to the host CPU.
LAYER_CLASSES = ("gemm", "vector", "cpu")

#: The per-configuration figures :func:`evaluate` computes, in order (cycles are array cycles).
COLUMNS = (
    "latency_s", "latency_cycles", "compute_cycles", "memory_cycles", "stall_cycles",
    "dram_bytes", "utilization", "sram_peak_bytes", "memory_bound_layers",
    *(f"{c}_{f}" for c in LAYER_CLASSES for f in ("latency_cycles", "compute_cycles",
                                                   "memory_cycles")),
    "energy_j", "edp_js", "area_mm2", *(f"energy_{k}_j" for k in ENERGY_BREAKDOWN),
    "sustained_latency_s", "steady_temperature_c",
)
#: The most configurations a sweep evaluates with numpy rather than by compiling its program
#: (:func:`evaluate`'s ``numpy``). The README's sweep of zoo:ppocr_cls (164 layers, three
#: dataflows), 2 cores: numpy 0.34 s for 162 configurations, 1.3 s for 1,000, 8.6 s for 4,096,
#: against 5.5-5.9 s to compile the program and 0.06-0.65 s to run it
#: (``experiments/bench/startup_and_sweep.py``).
NUMPY_MAX_CONFIGS = 1024


def runs_with_numpy(configs: int) -> bool:
    """Whether a sweep of ``configs`` configurations in all runs its program with numpy
    (:data:`NUMPY_MAX_CONFIGS`)."""
    return configs <= NUMPY_MAX_CONFIGS


#: Of :data:`COLUMNS`, those that are exact integers (int64).
INT_COLUMNS = ("compute_cycles", "memory_bound_layers", "gemm_compute_cycles",
               "vector_compute_cycles", "cpu_compute_cycles")


def _mesh(devices: Sequence[Any] | None) -> Mesh:
    devs = list(devices) if devices is not None else jax.local_devices()
    return Mesh(np.asarray(devs, dtype=object), ("config",))


@functools.lru_cache(maxsize=32)
def _program(layers: tuple[Workload, ...], dataflows: tuple[str, ...], mesh: Mesh,
             chains: tuple[AttentionChain, ...] = ()) -> Callable[..., Any]:
    """The jitted, sharded evaluation of ``layers`` for a batch of configurations, each at one
    of ``dataflows`` (its index, a traced ``[n]`` int32), the attention blocks ``chains`` fused
    as the configurations' ``ops.attention_fusion`` allows: ``(spec, bits, index)`` to
    ``{column: [n]}`` (:func:`_batched`, the layers constants of the program).

    The dataflows are data, not separate programs: the systolic ones inside the formulas (one
    copy of them whose layout is the configuration's index, :class:`npujax.systolic.dataflow.
    Roles`: the README's sweep compiles in 0.88 of the time of three copies and a select,
    ``docs/results/bench_lowering.md``); with ``row_stationary`` among them the cost program
    evaluates all of them (:func:`npujax.plan.program_costs`, which traces what does not depend
    on the dataflow once) and each configuration takes its own dataflow's per-layer costs by an
    exact select (:func:`_select`). Either way a sweep over dataflows compiles one program per
    batch size, and each configuration's figures are those of the program of its dataflow
    alone, bit for bit."""
    return _jit(_batched(layers, dataflows, chains), mesh, 3)


@functools.lru_cache(maxsize=8)
def _table_program(dataflows: tuple[str, ...], mesh: Mesh) -> Callable[..., Any]:
    """As :func:`_program`, the layers a traced :class:`~npujax.plan.LayerTable` (a fourth
    argument, the same for the whole batch): ``(spec, bits, index, table)`` to
    ``{column: [n]}`` (:func:`_batched_table`). One program serves every workload list of the
    table's padded length (:func:`~npujax.plan.table.table_length`), as ``lower``'s does."""
    return _jit(_batched_table(dataflows), mesh, 4)


def _table_length(layers: int) -> int:
    """The padded length of the sweep's layer table: a multiple of an eighth of the power of
    two below ``layers`` (at least :data:`~npujax.plan.table.MIN_LENGTH`), so the program
    serves every model of that length and evaluates at most 1/8 inert rows. (``lower``'s
    powers of two would cost the PP-OCR classifier's 164 layers 256 rows: the sweep's
    throughput x0.66; here 176 rows.)"""
    step = max(1, (1 << max(layers - 1, 0).bit_length()) // 16)
    return max(MIN_LENGTH, -(-layers // step) * step)


def _jit(fn: Callable[..., Any], mesh: Mesh, nargs: int) -> Callable[..., Any]:
    """``fn`` jitted with :func:`_shardings` and :func:`_compiler_options`."""
    ins, out = _shardings(mesh, nargs)
    return jax.jit(fn, in_shardings=ins, out_shardings=out,
                   compiler_options=_compiler_options(mesh.devices.flat[0].platform))


def _shardings(mesh: Mesh, nargs: int) -> tuple[tuple[NamedSharding, ...], NamedSharding]:
    """The program's argument and output shardings: the configurations split over the mesh's
    ``config`` axis; a fourth argument (the layer table) on every device."""
    split = NamedSharding(mesh, P("config"))
    return (split, split, split, NamedSharding(mesh, P()))[:nargs], split


@functools.lru_cache(maxsize=32)
def _batched(layers: tuple[Workload, ...], dataflows: tuple[str, ...],
             chains: tuple[AttentionChain, ...] = ()) -> Callable[..., Any]:
    """The batched evaluation of :func:`_program`, not jitted: ``(spec, bits, index)`` to
    ``{column: [n]}``, the layers static."""
    on_npu = np.asarray([w.device == "npu" for w in layers])
    gemm = np.asarray([w.kind == "gemm" for w in layers])
    gemm_macs = float(sum(w.macs for w, g in zip(layers, on_npu & gemm) if g))
    return jax.vmap(_figures(layers, on_npu, gemm, gemm_macs, dataflows, chains))


@functools.lru_cache(maxsize=8)
def _batched_table(dataflows: tuple[str, ...]) -> Callable[..., Any]:
    """The batched evaluation of :func:`_table_program`, not jitted: ``(spec, bits, index,
    table)`` to ``{column: [n]}``, the table shared by the batch. The padding rows are inert
    (on the CPU, every cost 0): the per-layer sums and maxima are those of the list alone."""
    def one(spec: NpuSpec, bits: jax.Array, df: jax.Array, table: LayerTable
            ) -> dict[str, jax.Array]:
        gemm_macs = real(jnp.sum(jnp.where(table.npu & table.gemm, table.macs, 0)))
        return _figures(table, table.npu, table.gemm, gemm_macs, dataflows, ())(spec, bits, df)

    return jax.vmap(one, in_axes=(0, 0, 0, None))


def _figures(layers: tuple[Workload, ...] | LayerTable, on_npu: Any, gemm: Any, gemm_macs: Any,
             dataflows: tuple[str, ...], chains: tuple[AttentionChain, ...]
             ) -> Callable[..., dict[str, jax.Array]]:
    """One configuration's :data:`COLUMNS`: ``(spec, bits, index)`` to ``{column: scalar}``.

    ``layers`` is a static workload list or a (traced) layer table; ``on_npu`` and ``gemm`` are
    ``[L]`` bool masks (numpy or traced) of its layers on the NPU and its GEMMs; ``gemm_macs``
    the MACs of the GEMMs on the NPU (float)."""
    L = len(layers)
    masks = {"gemm": on_npu & gemm, "cpu": ~on_npu}
    masks["vector"] = on_npu & ~masks["gemm"]

    def costs(spec: NpuSpec, widths: jax.Array, df: jax.Array) -> Any:
        # the mapping search computed once per dataflow, not once per figure that reads it
        # (npujax._exact.computed_once): x0.7 the compile time, the same bits
        with computing_once():
            if len(dataflows) > 1 and all(d in DATAFLOWS for d in dataflows):
                # the dataflow as data inside the formulas (Roles): one copy of them, not one
                # per dataflow and a select; the same figures bit for bit
                return program_costs(layers, spec, widths, widths,
                                     dataflows=(Roles.of(dataflows, df),), chains=chains)[0]
            return _select(program_costs(layers, spec, widths, widths, dataflows=dataflows,
                                         chains=chains), df)

    def one(spec: NpuSpec, bits: jax.Array, df: jax.Array) -> dict[str, jax.Array]:
        widths = jnp.full((L,), bits, real(0).dtype)
        p = costs(spec, widths, df)
        c, e = p.costs, p.layer_energy
        lat = c.latency_cycles
        comp = c.compute_cycles
        cpu_cycles = c.fallback_cycles + c.transfer_cycles
        a = inference_cores(spec).array
        pes = real(a.rows) * real(a.cols) * real(a.cores)
        gemm_comp = jnp.sum(jnp.where(masks["gemm"], comp, 0))
        per_layer = {"latency_cycles": lat, "memory_cycles": c.memory_cycles,
                     "stall_cycles": c.stall_cycles, "dram_bytes": c.dram_bytes,
                     **{f"energy_{k}_j": v for k, v in e.breakdown().items()}}
        for cls, m in masks.items():
            per_layer[f"{cls}_latency_cycles"] = jnp.where(m, lat, 0.0)
            per_layer[f"{cls}_memory_cycles"] = jnp.where(m, c.memory_cycles, 0.0)
        per_layer["cpu_latency_cycles"] = jnp.where(masks["cpu"], cpu_cycles, 0.0)
        out = {
            **layer_sums(per_layer),
            "compute_cycles": jnp.sum(comp),
            "utilization": gemm_macs / jnp.maximum(real(gemm_comp), 1.0) / pes,
            # the working sets, and under layer fusion the activations kept on chip beside them
            "sram_peak_bytes": jnp.max(c.sram_peak_bytes if p.edges is None
                                       else p.edges.sram_bytes),
            "memory_bound_layers": jnp.sum(on_npu & (c.memory_cycles > real(comp))
                                           ).astype(COUNT),
        }
        # the total from the components' sums, in ENERGY_BREAKDOWN order: with the layers'
        # total_j (their components added inside the program) in the tree, 8 host devices gave
        # DigitsCNN's energy another last bit than one device, the components' sums did not
        out["energy_j"] = functools.reduce(
            operator.add, (out[f"energy_{k}_j"] for k in ENERGY_BREAKDOWN))
        out["latency_s"] = out["latency_cycles"] / real(a.clock_hz)
        for cls, m in masks.items():
            out[f"{cls}_compute_cycles"] = jnp.sum(jnp.where(m, comp, 0))
        out["edp_js"] = out["energy_j"] * out["latency_s"]
        out["area_mm2"] = area_mm2(spec)
        out.update(_sustained(spec, out["latency_s"], out["energy_j"],
                              lambda s: costs(s, widths, df)))
        return out

    return one


#: XLA:CPU options of the sweep's program: the legacy elemental emitters. They compile the
#: README's sweep program (PP-OCR cls, three dataflows) in 0.67 of the time of the MLIR fusion
#: emitters and run it as fast, and they give the figures of the per-dataflow programs the
#: sweep compiled before, bit for bit: with the fusion emitters LLVM contracted a multiply and
#: an add of the SRAM energy into an FMA in the one program and not in the per-dataflow ones
#: (6 of 162 configurations differed in their last bit). Measured by
#: ``experiments/bench/startup_and_sweep.py``; tests/explore/test_sweep.py compares the one
#: program with the per-dataflow ones.
_CPU_OPTIONS = {"xla_cpu_use_fusion_emitters": False}


@functools.lru_cache(maxsize=4)
def _compiler_options(platform: str) -> dict[str, Any] | None:
    """:data:`_CPU_OPTIONS` on the CPU where this jaxlib knows them (probed once with a
    one-operation program), else None (XLA's defaults)."""
    if platform != "cpu":
        return None
    try:
        jax.jit(lambda x: x + 1, compiler_options=_CPU_OPTIONS).lower(np.float32(0)).compile()
    except jax.errors.JaxRuntimeError:
        return None
    return dict(_CPU_OPTIONS)


def _select(by_dataflow: Sequence[Any], index: jax.Array) -> Any:
    """The pytree of ``by_dataflow[index]`` (``index`` a traced scalar): one exact
    ``jnp.where`` per leaf and dataflow, so the chosen leaves keep their bits."""
    if len(by_dataflow) == 1:
        return by_dataflow[0]

    def pick(*leaves: jax.Array) -> jax.Array:
        out = leaves[0]
        for i, leaf in enumerate(leaves[1:], 1):
            out = jnp.where(index == i, leaf, out)
        return out

    return jax.tree.map(pick, *by_dataflow)


def _sustained(spec: NpuSpec, latency_s: Any, energy_j: Any,
               program: Callable[[NpuSpec], Any]) -> dict[str, Any]:
    """The steady state of the thermal model (:mod:`npujax.plan.thermal`): the one cost
    program again at each DVFS step's clock (the table is static; the steps one
    ``jax.lax.map`` body), its totals added in the same fixed tree as the nominal clock's.
    Without a DVFS table the sustained latency is the latency, and the steady temperature
    ``ambient_c + (E / T + static_power_w) R``."""
    th = spec.thermal
    lats, ens = jnp.stack([latency_s]), jnp.stack([energy_j])
    if th.dvfs_clock_scales:
        def step(scale: jax.Array) -> tuple[jax.Array, jax.Array]:
            clock = real(spec.array.clock_hz) * scale
            t = totals(program(fields.replace_traced(spec, {"array.clock_hz": clock})))
            return t.latency_cycles / clock, t.energy_j

        # one loop body for every step: traced and compiled once, not once per step (the
        # same bits; coral_devboard's 3 steps: tracing 5.2 -> 3.0 s, compiling 11.2 -> 8.2 s)
        step_lats, step_ens = jax.lax.map(step, real(np.asarray(th.dvfs_clock_scales)))
        lats, ens = jnp.concatenate([lats, step_lats]), jnp.concatenate([ens, step_ens])
    st = thermal_state(lats, ens, th, 0.0)
    return {"sustained_latency_s": st.steady_latency_s,
            "steady_temperature_c": st.steady_temperature_c}


def _bucket(n: int, ndev: int) -> int:
    """The padded batch size: a power of two >= n, at least and a multiple of ``ndev``."""
    b = max(1 << max(n - 1, 0).bit_length(), ndev)
    return -(-b // ndev) * ndev


def evaluate(layers: Sequence[Workload], spec: NpuSpec, changes: dict[str, np.ndarray],
             bits: np.ndarray, devices: Sequence[Any] | None = None,
             chains: Sequence[AttentionChain] = (), *,
             dataflows: Sequence[str] | None = None,
             dataflow: np.ndarray | None = None, numpy: bool = False) -> dict[str, np.ndarray]:
    """The :data:`COLUMNS` of ``n`` configurations sharing ``spec``'s static fields (but the
    dataflow, which may be data).

    Args:
      layers: the workloads (:func:`npujax.plan.workloads` of the graph on ``spec``).
      spec: the configurations' common spec (static fields, and the numeric fields not swept).
      changes: ``{"section.key": values [n]}`` for the swept numeric fields.
      bits: ``[n]`` uniform weight and activation width per configuration.
      devices: the devices to shard over (default: every local device).
      chains: the graph's attention blocks (:func:`npujax.plan.network`), fused as
        ``spec.ops.attention_fusion`` declares, as :func:`npujax.lower` does.
      dataflows: the dataflows the program evaluates (names or short names; default
        ``(spec.array.dataflow,)``). One compiled program serves every configuration: give the
        same tuple for every batch of a sweep and it compiles once per batch size.
      dataflow: int ``[n]`` index into ``dataflows`` per configuration (default all 0).
      numpy: run the traced program with numpy (``npujax._program_cache.evaluate``)
        instead of compiling it: for a few hundred configurations, seconds faster.

    Returns:
      ``{column: [n] array}`` (int64 for :data:`INT_COLUMNS`, float64 otherwise), the same bits
      for any batch and device count; compiled, the same bits as the program of each
      configuration's dataflow alone; with numpy, those figures to float64 rounding.

    Raises:
      ConfigError: an unknown dataflow, or ``dataflow`` not ``[n]`` indices into ``dataflows``.
    """
    n = len(bits)
    if n == 0:
        return {k: np.zeros(0, np.int64 if k in INT_COLUMNS else np.float64) for k in COLUMNS}
    names = tuple(get_dataflow(d).name for d in (dataflows or (spec.array.dataflow,)))
    index = np.zeros(n, np.int32) if dataflow is None else np.asarray(dataflow, np.int32)
    if index.shape != (n,) or index.min() < 0 or index.max() >= len(names):
        raise ConfigError(f"dataflow indices of shape {index.shape} in [{index.min()}, "
                          f"{index.max()}]; give {n} indices into the {len(names)} dataflows "
                          f"{list(names)}.")
    mesh = _mesh(devices)
    ndev = mesh.devices.size
    size = _bucket(n, ndev)
    pad = lambda v: np.concatenate([v, np.repeat(v[-1:], size - n)])  # noqa: E731
    layers, chains = tuple(layers), tuple(chains)
    table = not needs_static_layers(spec, chains)
    if table:  # (as lower: the static fields the table program does not read, one value each)
        spec = _program_spec(spec)
    stacked = fields.stack(spec, {k: pad(np.asarray(v)) for k, v in changes.items()}, size)
    args: tuple[Any, ...] = (stacked, pad(np.asarray(bits, np.float64)), pad(index))
    static: tuple[Any, ...]  # the program's static key: the names, or the layers too
    if table:  # one program for every model of the padded length
        args += (layer_table(layers, _table_length(len(layers))),)
        batched, name, static = _batched_table(names), "sweep_table", names
    else:
        batched, name, static = _batched(layers, names, chains), "sweep", (layers, names,
                                                                            chains)
    def compiled() -> dict[str, Any]:
        ins, shard = _shardings(mesh, len(args))
        jitted = _table_program(names, mesh) if table else _program(layers, names, mesh, chains)
        return _program_cache.call(  # (the command line's programs are kept between runs)
            batched, args, name=name, static=static, in_shardings=ins, out_shardings=shard,
            compiler_options=_compiler_options(mesh.devices.flat[0].platform), jitted=jitted)

    with jax.enable_x64(True):  # the numbers enter as int64/float64 (npujax._exact)
        out = (_program_cache.evaluate(batched, args, compiled, name=name, static=static)
               if numpy else compiled())
        out = {k: np.asarray(v)[:n] for k, v in out.items()}
    return {k: out[k] for k in COLUMNS}


@dataclasses.dataclass(frozen=True)
class SweepResult:
    """The configurations of a sweep and their figures.

    Attributes:
      grid: the axes.
      configs: int64 ``[n, axes]`` value indices (see :func:`npujax.explore.configurations`).
      columns: ``{name: [n] array}``: :data:`COLUMNS` from the cost model.
      layers: layers per configuration (the first static group's count).
      seconds: wall time of the evaluation (compilation included).
    """

    grid: Grid
    configs: np.ndarray
    columns: dict[str, np.ndarray]
    layers: int = 0
    seconds: float = 0.0

    def __len__(self) -> int:
        return int(self.configs.shape[0])

    def axis_values(self) -> dict[str, np.ndarray]:
        """``{axis: [n] values}`` of every configuration (strings for static text axes)."""
        return {name: np.asarray(vals, dtype=object if isinstance(vals[0], str) else None)
                [self.configs[:, j]] for j, (name, vals) in enumerate(self.grid.axes)}

    def table(self, base: NpuSpec) -> dict[str, np.ndarray]:
        """One row per configuration: the axis values, :data:`COLUMNS`, the bound per layer
        class (``compute``/``memory``/``none``), and the resources ``pes`` and ``sram_bytes``
        (``base``'s values where the grid does not change them)."""
        axes = self.axis_values()
        n = len(self)

        def field(name: str) -> np.ndarray:
            if name in axes:
                return np.asarray(axes[name], np.float64)
            return np.full(n, float(fields.get(base, name)))

        cores = field("array.cores")
        out: dict[str, np.ndarray] = {**axes, **self.columns}
        for cls in ("gemm", "vector"):
            comp = self.columns[f"{cls}_compute_cycles"].astype(np.float64)
            mem = self.columns[f"{cls}_memory_cycles"]
            out[f"{cls}_bound"] = np.where(comp + mem == 0, "none",
                                           np.where(mem > comp, "memory", "compute"))
        out["pes"] = (field("array.rows") * field("array.cols") * cores).astype(np.int64)
        out["sram_bytes"] = ((field("memory.ifmap_sram_bytes") + field("memory.filter_sram_bytes")
                              + field("memory.ofmap_sram_bytes")) * cores).astype(np.int64)
        return out

    @property
    def evaluations_per_s(self) -> float:
        """(configuration x layer) evaluations per second of wall time."""
        return len(self) * self.layers / self.seconds if self.seconds > 0 else math.inf


_DATAFLOW = "array.dataflow"


def _groups(grid: Grid, configs: np.ndarray) -> dict[tuple[int, ...], np.ndarray]:
    """Rows of ``configs`` per combination of the static axes' values that need their own
    program (every static axis but the dataflow, which is data: :func:`_program`)."""
    static = _program_axes(grid)
    if not static:
        return {(): np.arange(len(configs))}
    keys = configs[:, static]
    uniq, inverse = np.unique(keys, axis=0, return_inverse=True)
    return {tuple(int(x) for x in u): np.flatnonzero(inverse.ravel() == g)
            for g, u in enumerate(uniq)}


def _program_axes(grid: Grid) -> list[int]:
    """The static axes (indices) other than the dataflow: their values change the workloads
    or the cost model's formulas, so each combination compiles its own program."""
    return [j for j, name in enumerate(grid.names) if grid.is_static(name) and name != _DATAFLOW]


def evaluate_configs(graph: Graph, base: NpuSpec, grid: Grid, configs: np.ndarray,
                     devices: Sequence[Any] | None = None,
                     workload_cache: dict[Any, tuple[NpuSpec, Network]] | None = None,
                     numpy: bool = False) -> dict[str, np.ndarray]:
    """:data:`COLUMNS` of the given configurations (rows of value indices) of ``grid``.

    One compiled program per combination of the static axes other than the dataflow (none for
    a grid of numeric fields, bit widths and dataflows) and padded batch size: the dataflows
    of the grid's ``dataflow`` axis are all evaluated by that program (:func:`evaluate`; with
    ``numpy``, the programs are run with numpy instead of compiled).

    Raises:
      ConfigError: a static combination that makes an invalid spec.
    """
    cache = {} if workload_cache is None else workload_cache
    n = len(configs)
    out = {k: np.zeros(n, np.int64 if k in INT_COLUMNS else np.float64) for k in COLUMNS}
    static = _program_axes(grid)
    df_axis = grid.names.index(_DATAFLOW) if _DATAFLOW in grid.names else None
    for key, rows in _groups(grid, configs).items():
        if key not in cache:
            spec = fields.replace(base, {grid.axes[j][0]: grid.axes[j][1][v]
                                         for j, v in zip(static, key)}) if key else base
            if df_axis is not None:  # every dataflow of the grid is valid with this group
                for d in grid.axes[df_axis][1]:
                    fields.replace(spec, {_DATAFLOW: d})
            cache[key] = (spec, network(graph, spec))
        spec, (layers, chains) = cache[key]
        changes, bits = {}, np.full(len(rows), DEFAULT_BITS, np.float64)
        dataflows, index = None, None
        for j, (name, vals) in enumerate(grid.axes):
            if j == df_axis:
                dataflows, index = tuple(vals), configs[rows, j]
                continue
            if grid.is_static(name):
                continue
            picked = np.asarray(vals)[configs[rows, j]]
            if name == "bits":
                bits = picked.astype(np.float64)
            else:
                changes[name] = picked
        cols = evaluate(layers, spec, changes, bits, devices, chains, dataflows=dataflows,
                        dataflow=index, numpy=numpy)
        for k, v in cols.items():
            out[k][rows] = v
    return out


def sweep(graph: Graph, base_spec: NpuSpec | str, grid: Grid | dict[str, Sequence[Any]], *,
          sample: int | None = None, method: str = "random", seed: int = 0,
          devices: Sequence[Any] | None = None) -> SweepResult:
    """Evaluate ``graph`` on every configuration of ``grid`` (or a sample of them).

    Args:
      graph: an optimized graph (:func:`npujax.optimize`).
      base_spec: the NPU the axes change (a spec, a preset name or a TOML path).
      grid: a :class:`~npujax.explore.Grid` or ``{axis: values}``, e.g.
        ``{"array.rows": [8, 16, 32], "dataflow": ["ws", "os"], "bits": [4, 8]}``.
      sample: None for the full product, else the number of configurations to draw.
      method: ``random`` or ``lhs`` (see :func:`npujax.explore.configurations`).
      seed: the sampling seed.
      devices: devices to shard each batch over (default: every local device).

    Returns:
      The :class:`SweepResult`, rows in configuration order (a sweep of at most
      :data:`NUMPY_MAX_CONFIGS` configurations is run with numpy, not compiled: the module's
      docstring).

    Raises:
      ConfigError: a bad axis, value, sample size or method.

    Examples:
      >>> r = sweep(graph, "edge_16x16", {"array.rows": [8, 16]})  # doctest: +SKIP
      >>> r.table(load_npu_spec("edge_16x16"))["latency_s"]  # doctest: +SKIP
    """
    base = as_spec(base_spec)
    g = grid if isinstance(grid, Grid) else Grid.build(grid, base)
    configs = configurations(g, sample, method, seed)
    cache: dict[Any, tuple[NpuSpec, Network]] = {}
    t = time.perf_counter()
    cols = evaluate_configs(graph, base, g, configs, devices, cache,
                            numpy=runs_with_numpy(len(configs)))
    seconds = time.perf_counter() - t
    layers = len(next(iter(cache.values()))[1].layers) if cache else 0
    if not all(np.all(np.isfinite(v)) for v in cols.values()):
        raise ConfigError("the cost model gave a non-finite figure for some configuration; the "
                          "grid's values are outside what npujax can model (docs/hw.md).")
    return SweepResult(g, configs, cols, layers, seconds)

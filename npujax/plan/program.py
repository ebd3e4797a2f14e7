"""The one cost program: every consumer of the NPU model gets its numbers here.

``lower``, the design-space sweep (:func:`npujax.sweep`), codesign, ``fit``, the precision
search's latency table, the shape sweeps and the gradient checks all call
:func:`program_costs`. It evaluates the per-layer model (:func:`npujax.plan.layer_costs`) and
chains the registered cost passes (:mod:`npujax.plan.passes`) in their order:

=====  ===============  ==========================================  =====================
order  pass             runs where                                  module
=====  ===============  ==========================================  =====================
0      per-layer        always                                      ``plan/costs.py``
20     attention        ``ops.attention_fusion`` != ``none`` and    ``passes/attention.py``
                        the graph has attention blocks
30     cross_layer      ``ops.fusion`` = ``layer``                  ``passes/cross_layer.py``
40     weight_stream    ``memory.parameter_cache`` != ``none``      ``passes/weight_stream.py``
50     invocation       ``host.invocation_overhead_s`` != 0         ``passes/invocation.py``
55     instruction_     ``memory.instruction_bytes_per_op`` != 0    ``passes/instruction_stream.py``
       stream
90     energy           the mode asks for energy                    ``passes/energy.py``
=====  ===============  ==========================================  =====================

The composer alone reads the spec's switches (through each pass's ``applies``), so two consumers
cannot disagree on which effects a number includes: that would be a silently wrong number (the
lesson of optax's ``chain``, which every optimizer alias is built from). A pass that cannot
follow the caller's mode (the relaxed mode, a traced layer table, traced shapes) is refused with
a :class:`~npujax.errors.ConfigError`, never skipped.

Everything is pure jnp of the bit widths and the spec's numeric fields, in the 64-bit scope of
``npujax._exact``: jit, ``jax.vmap`` over stacked specs, ``jax.grad`` in the relaxed mode,
sharding (:mod:`npujax.explore.sweep`). :func:`layer_sums` adds a configuration's layers in one
fixed tree of elementwise additions, so totals are the same bit for bit for any batch, chunk
size or device count.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from npujax import _relax
from npujax._exact import exact, real
from npujax.errors import ConfigError
from npujax.hw.fields import replace_traced
from npujax.hw.spec import NpuSpec
from npujax.ir.graph import Graph
from npujax.plan.costs import EXACT_FIELDS, LayerCosts, _layer_costs
from npujax.plan.passes import registered
from npujax.plan.passes.attention import AttentionChain, attention_chains
from npujax.plan.passes.base import EXACT, CostMode, CostPass, PassInput, ProgramCosts
from npujax.plan.passes.energy import ENERGY_BREAKDOWN
from npujax.plan.table import LayerTable
from npujax.plan.workload import Workload, workloads
from npujax.systolic.dataflow import Dataflow, Roles, get_dataflow
from npujax.systolic.mapping import check_mapping

__all__ = ["CostMode", "EXACT", "Network", "ProgramCosts", "Totals", "network", "program_costs",
           "program_cost", "active_passes", "needs_static_layers", "check_program",
           "layer_sums", "totals"]

_COUNT_SLOPES = ("unit", "mean")


class Network(NamedTuple):
    """The static input of the cost program for one graph on one spec.

    Attributes:
      layers: the workloads (:func:`npujax.plan.workloads`).
      chains: the attention blocks (:func:`npujax.plan.attention_chains`), recognised whatever
        the spec's attention fusion: the composer decides whether they run as kernels.
    """

    layers: tuple[Workload, ...]
    chains: tuple[AttentionChain, ...] = ()


def network(graph: Graph, spec: NpuSpec) -> Network:
    """The :class:`Network` of an optimized ``graph`` on ``spec`` (its workloads depend on the
    spec's layout, operator and fusion fields).

    Raises:
      ConfigError, LimitError: as :func:`npujax.plan.workloads`.
    """
    layers = tuple(workloads(graph, spec))
    return Network(layers, attention_chains(graph, list(layers)))


class Totals(NamedTuple):
    """A configuration's totals over its layers (:func:`totals`; array cycles, bytes, J).

    Attributes:
      latency_cycles: float, the summed latency.
      dram_bytes: float, DRAM bytes per inference.
      energy_j: float, the summed energy (from its components' sums, in
        :data:`~npujax.plan.ENERGY_BREAKDOWN` order), or None without the energy pass.
    """

    latency_cycles: Any
    dram_bytes: Any
    energy_j: Any = None


def active_passes(spec: NpuSpec, chains: Sequence[AttentionChain] = (),
                  mode: CostMode = EXACT) -> tuple[CostPass, ...]:
    """The registered passes that apply to ``spec`` (static), in order.

    Args:
      spec: the NPU (only its static switches are read).
      chains: the graph's attention blocks (:func:`network`).
      mode: the :class:`CostMode`.

    Returns:
      The :class:`~npujax.plan.passes.base.CostPass` es whose ``applies`` is true, by ``order``.
    """
    return tuple(p for p in registered() if p.applies(spec, tuple(chains), mode))


def needs_static_layers(spec: NpuSpec, chains: Sequence[AttentionChain] = (),
                        mode: CostMode = EXACT) -> bool:
    """Whether a pass that applies to ``spec`` needs the workloads as a static list (attention
    blocks, cross-layer edges), so the program cannot take them as a traced layer table."""
    return any(not p.traced_layers for p in active_passes(spec, chains, mode))


def check_program(spec: NpuSpec, chains: Sequence[AttentionChain] = (), mode: CostMode = EXACT,
                  *, table: bool = False, shapes: bool = False) -> None:
    """Refuse, before any tracing, a cost program that a pass applying to ``spec`` cannot
    follow (see :func:`program_costs`).

    Raises:
      ConfigError: an unknown count slope, or a pass without a relaxed form (in the relaxed
        mode), needing static workloads (``table``) or static sizes (``shapes``).
    """
    _check(mode, active_passes(spec, chains, mode), spec, table, shapes)


def _check(mode: CostMode, passes: tuple[CostPass, ...], spec: NpuSpec, table: bool,
           shapes: bool) -> None:
    if mode.count_slope not in _COUNT_SLOPES:
        raise ConfigError(f"unknown count slope {mode.count_slope!r}; use one of "
                          f"{_COUNT_SLOPES}.")
    for p in passes:
        if mode.relaxed and not p.relaxed:
            raise ConfigError(f"the {p.name} cost pass of {spec.name!r} has no relaxed form; "
                              "evaluate it in the exact mode.")
        if table and not p.traced_layers:
            raise ConfigError(f"the {p.name} cost pass of {spec.name!r} needs the workloads as "
                              "a static list, not a traced layer table.")
        if shapes and not p.traced_shapes:
            raise ConfigError(
                f"the {p.name} cost pass of {spec.name!r} costs static sizes and cannot follow "
                "traced shapes: lower each point with npujax.lower"
                + (", or sweep a copy with spec.with_fields({'ops.fusion': 'residual'})"
                   if p.name == "cross_layer" else "") + ".")


def program_costs(
    layers: Sequence[Workload] | LayerTable,
    spec: NpuSpec,
    weight_bits: jax.Array,
    act_bits: jax.Array,
    *,
    dataflows: Sequence[str | Dataflow | None] = (None,),
    chains: Sequence[AttentionChain] = (),
    mode: CostMode = EXACT,
    shapes: Mapping[str, jax.Array] | None = None,
) -> tuple[ProgramCosts, ...]:
    """The per-layer costs under every pass that applies, at each of ``dataflows``.

    What does not depend on the dataflow (vector, conversion and host layers, the operands'
    bytes) is traced once for all dataflows, as :func:`npujax.plan.layer_costs_by_dataflow`
    does.

    Args:
      layers: static workloads (:func:`npujax.plan.workloads`) or a (possibly traced)
        :class:`~npujax.plan.LayerTable` (then no pass may need static layers).
      spec: the NPU; numeric fields may be traced, batched (``jax.vmap`` over
        :func:`npujax.hw.stack_specs`) or float (:func:`npujax.hw.differentiable_spec`).
      weight_bits: float ``[L]`` weight width per layer (bits).
      act_bits: float ``[L]`` activation width per layer (bits).
      dataflows: dataflow names (static); None is the spec's; or a
        :class:`~npujax.systolic.dataflow.Roles`, one of the systolic dataflows chosen by data
        (traced), whose costs are those of its dataflow's name bit for bit.
      chains: the graph's attention blocks (static, :func:`network`); run as kernels where the
        spec's ``ops.attention_fusion`` allows.
      mode: exact or relaxed, energy on or off (static, :class:`CostMode`).
      shapes: traced workload sizes ``{field: [L]}`` (:data:`~npujax.plan.costs.SHAPE_FIELDS`;
        :func:`npujax.plan.sweep_shapes`), or None.

    Returns:
      One :class:`~npujax.plan.passes.base.ProgramCosts` per dataflow, in order: the counts
      (:data:`~npujax.plan.costs.EXACT_FIELDS`) 64-bit and exact, the other fields in JAX's
      default float type (float64 under ``jax.enable_x64``).

    Raises:
      ConfigError: an unknown dataflow, precision scaling, mapping or count slope, a
        temperature out of range, no dataflow, or a pass that cannot follow the mode, a traced
        layer table or traced shapes (named in the message).
    """
    if not dataflows:
        raise ConfigError("the cost program needs at least one dataflow.")
    # names, or a Roles (the dataflow as data) kept as it is
    names = tuple(d if isinstance(d, Roles) else get_dataflow(d or spec.array.dataflow).name
                  for d in dataflows)
    passes = active_passes(spec, chains, mode)
    _check(mode, passes, spec, isinstance(layers, LayerTable), shapes is not None)
    x64 = bool(jax.config.read("jax_enable_x64"))
    if mode.relaxed:
        with _relax.relaxed(mode.temperature, mode.count_slope):
            out = _compose(layers, spec, weight_bits, act_bits, names, tuple(chains), mode,
                           shapes, passes)
    else:
        out = _compose(layers, spec, weight_bits, act_bits, names, tuple(chains), mode,
                       shapes, passes)
    return out if x64 else tuple(_to_default_float(o) for o in out)


def program_cost(layers: Sequence[Workload] | LayerTable, spec: NpuSpec, weight_bits: jax.Array,
                 act_bits: jax.Array, dataflow: str | Dataflow | None = None, **kwargs: Any
                 ) -> ProgramCosts:
    """:func:`program_costs` at one dataflow (default the spec's); keywords as there."""
    return program_costs(layers, spec, weight_bits, act_bits, dataflows=(dataflow,),
                         **kwargs)[0]


@exact
def _compose(layers: Sequence[Workload] | LayerTable, spec: NpuSpec, weight_bits: jax.Array,
             act_bits: jax.Array, dataflows: tuple[str | Dataflow, ...],
             chains: tuple[AttentionChain, ...], mode: CostMode,
             shapes: Mapping[str, jax.Array] | None, passes: tuple[CostPass, ...]
             ) -> tuple[ProgramCosts, ...]:
    mapping = check_mapping(spec.memory.mapping)
    spec = inference_cores(spec)
    base = _layer_costs(layers, spec, weight_bits, act_bits, dataflows, shapes, mapping)
    if passes and not isinstance(layers, LayerTable):
        layers = tuple(layers)
    # the widths as the caller gave them: a pass widens them, after any gather (_exact.py)
    wb, ab = jnp.asarray(weight_bits), jnp.asarray(act_bits)
    out = []
    for df, costs in zip(dataflows, base):
        state = ProgramCosts(costs=costs, unfused=costs)
        inp = PassInput(layers, spec, wb, ab, df, chains, shapes, mode)
        for p in passes:
            state = p.apply(inp, state)
        out.append(state)
    return tuple(out)


def inference_cores(spec: NpuSpec) -> NpuSpec:
    """``spec`` with ``array.cores`` set to the cores one inference runs on:
    ``min(cores, cores_per_inference)``, or ``spec`` itself when ``cores_per_inference`` is 0
    (every core). The composer applies it before every pass, so each consumer of the cost
    program sees one answer; a traced or batched field stays traced."""
    a = spec.array
    n: Any = a.cores_per_inference  # an int in a preset; traced or float in a sweep or a fit
    cores: Any = a.cores
    if isinstance(n, int) and isinstance(cores, int):
        if n == 0 or n >= cores:
            return spec
        return dataclasses.replace(spec, array=dataclasses.replace(a, cores=n))
    cores = jnp.where(jnp.asarray(n) > 0, jnp.minimum(cores, n), cores)
    return replace_traced(spec, {"array.cores": cores})


def _to_default_float(p: ProgramCosts) -> ProgramCosts:
    """``p`` outside the 64-bit scope: the counts stay 64-bit, the rest in float32."""
    def costs(c: LayerCosts) -> LayerCosts:
        return c._replace(**{k: v.astype(jnp.float32) for k, v in c._asdict().items()
                             if k not in EXACT_FIELDS})

    def floats(t: Any) -> Any:
        return jax.tree.map(lambda v: v.astype(jnp.float32)
                            if jnp.issubdtype(v.dtype, jnp.floating) else v, t)

    return p._replace(costs=costs(p.costs), unfused=costs(p.unfused), energy=floats(p.energy),
                      edges=floats(p.edges), attention=floats(p.attention),
                      streamed_weight_bytes=floats(p.streamed_weight_bytes))


def layer_sums(values: Mapping[str, jax.Array]) -> dict[str, jax.Array]:
    """``{name: sum}`` of one configuration's per-layer float values (``[L]`` each) in one fixed
    order: the vectors stacked to ``[L, k]`` and halved in a fixed tree of elementwise additions
    (zero-padded to a power of two).

    ``jnp.sum`` leaves the order to XLA, and under ``vmap`` XLA:CPU orders a ``[n, L]``
    reduction differently for small and large ``n``: the PP-OCR classifier's totals changed in
    their last bit between batches of up to 24 configurations and of 28 or more, so a sweep's
    numbers depended on its chunk size and on the device count. Elementwise additions are exact
    IEEE operations whatever the vector width, so this tree gives the same bits for any batch,
    chunk and sharding (and numpy's elementwise additions in the same tree give them too)."""
    names = list(values)
    x = jnp.stack([values[k] for k in names], axis=-1)
    n = x.shape[0]
    x = jnp.pad(x, ((0, (1 << max(n - 1, 0).bit_length()) - n), (0, 0)))
    while x.shape[0] > 1:
        h = x.shape[0] // 2
        x = x[:h] + x[h:]
    return {k: x[0, i] for i, k in enumerate(names)}


def totals(p: ProgramCosts) -> Totals:
    """The :class:`Totals` of one configuration's :class:`ProgramCosts`: its ``[L]`` latency
    cycles, DRAM bytes and energy components (J) added in :func:`layer_sums`' fixed tree, as the
    design-space sweep adds them (float64 scalars; call in the 64-bit scope for exact counts).

    Args:
      p: one configuration's program costs (not batched: ``[L]`` arrays).

    Returns:
      :class:`Totals`; ``energy_j`` None when the program ran without the energy pass.
    """
    values = {"latency_cycles": real(p.costs.latency_cycles),
              "dram_bytes": real(p.costs.dram_bytes)}
    if p.energy is not None:
        values.update({k: real(v) for k, v in p.energy.breakdown().items()})
    s = layer_sums(values)
    energy = None
    if p.energy is not None:
        energy = s[ENERGY_BREAKDOWN[0]]
        for k in ENERGY_BREAKDOWN[1:]:
            energy = energy + s[k]
    return Totals(s["latency_cycles"], s["dram_bytes"], energy)

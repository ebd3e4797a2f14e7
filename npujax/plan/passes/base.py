"""The cost-pass interface: what a pass receives, what it returns, what it can follow.

A cost pass turns the per-layer costs of :func:`npujax.plan.layer_costs` into the costs of one
more effect of the NPU's compiler or system (cross-layer placement, attention kernels, energy,
host-link weight streaming). The composer (:func:`npujax.plan.program.program_costs`) decides
which passes apply, in which order, and refuses a pass that cannot follow the caller's mode.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

import jax
import jax.numpy as jnp

from npujax import _relax
from npujax._exact import real
from npujax.errors import ConfigError
from npujax.hw.spec import NpuSpec
from npujax.plan.costs import LayerCosts
from npujax.plan.table import LayerTable
from npujax.plan.workload import Workload
from npujax.systolic.dataflow import Dataflow

if TYPE_CHECKING:
    from npujax.plan.passes.attention import AttentionChain, AttentionCosts
    from npujax.plan.passes.cross_layer import EdgeCosts
    from npujax.plan.passes.energy import LayerEnergy

__all__ = ["CostMode", "EXACT", "LATENCY", "PassInput", "ProgramCosts", "CostPass",
           "maybe_nonzero", "once_per_inference"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class CostMode:
    """How the cost program evaluates (static: each mode is its own compiled program).

    Attributes:
      relaxed: the differentiable mode (``npujax/_relax.py``): the same forward values bit for
        bit, straight-through and smoothed gradients; every pass must follow it.
      temperature: the relaxation's relative temperature (in (0, 10]; only with ``relaxed``).
      count_slope: the gradient of a fold count w.r.t. a hardware count (``unit`` or ``mean``;
        see :func:`npujax.plan.layer_costs`).
      energy: also compute each layer's energy (:mod:`npujax.plan.passes.energy`).
    """

    relaxed: bool = False
    temperature: float = _relax.DEFAULT_TEMPERATURE
    count_slope: str = "unit"
    energy: bool = True


#: The exact mode with energy, what :func:`npujax.lower` reports.
EXACT = CostMode()
#: The exact mode without energy: latency only (fit's predictions, the latency table, the shape
#: sweep, the gradient check).
LATENCY = CostMode(energy=False)


class PassInput(NamedTuple):
    """What every pass reads (inside the composer's 64-bit scope).

    Attributes:
      layers: the static workloads, or a (possibly traced) :class:`~npujax.plan.LayerTable`.
      spec: the NPU; numeric fields may be traced or batched.
      weight_bits, act_bits: float ``[L]`` widths in the caller's dtype: widen them with
        ``npujax._exact.real`` for arithmetic, after any gather (``npujax/_exact.py``).
      dataflow: the dataflow's full name (static), or a
        :class:`~npujax.systolic.dataflow.Roles` (one of the systolic dataflows as data).
      chains: the attention blocks (static; empty where they were not recognised).
      shapes: traced workload sizes ``{field: [L]}`` or None (:func:`npujax.plan.sweep_shapes`).
      mode: the :class:`CostMode`.
    """

    layers: Sequence[Workload] | LayerTable
    spec: NpuSpec
    weight_bits: jax.Array
    act_bits: jax.Array
    dataflow: str | Dataflow
    chains: tuple[AttentionChain, ...]
    shapes: Mapping[str, jax.Array] | None
    mode: CostMode

    @property
    def workloads(self) -> tuple[Workload, ...]:
        """The static workloads (for passes with ``traced_layers=False``, which the composer
        never gives a traced table)."""
        if isinstance(self.layers, LayerTable):
            raise ConfigError("this cost pass needs the workloads as a static list.")
        return tuple(self.layers)


class ProgramCosts(NamedTuple):
    """The cost program's answer at one dataflow: typed per-layer costs and what each pass
    decided.

    Attributes:
      costs: :class:`~npujax.plan.LayerCosts` of ``[L]`` arrays after every pass (what
        :func:`npujax.lower` reports).
      unfused: the layer-by-layer costs (the per-layer model alone: every activation through
        DRAM, no attention kernel).
      energy: :class:`~npujax.plan.LayerEnergy` at ``costs``' DRAM bytes, or None without
        the energy pass.
      edges: :class:`~npujax.plan.EdgeCosts` of the cross-layer placement, or None where it
        did not run (``ops.fusion`` below ``layer``).
      attention: :class:`~npujax.plan.AttentionCosts` per attention block, or None where the
        attention pass did not run.
      streamed_weight_bytes: float ``[L]`` weight bytes each layer streams over the host link
        per inference, or None where the weight-streaming pass did not run.
      sram_split: float scalar, the activations' share of a per-model SRAM split that the
        ``onchip_split`` pass chose (:mod:`npujax.plan.passes.onchip_split`), or None where
        it did not run.
    """

    costs: LayerCosts
    unfused: LayerCosts
    energy: LayerEnergy | None = None
    edges: EdgeCosts | None = None
    attention: AttentionCosts | None = None
    streamed_weight_bytes: Any = None
    sram_split: Any = None

    @property
    def layer_energy(self) -> LayerEnergy:
        """``energy``, for a program whose mode asked for it.

        Raises:
          ConfigError: the program ran without the energy pass (``CostMode(energy=False)``).
        """
        if self.energy is None:
            raise ConfigError("the cost program ran without energy; evaluate it with "
                              "CostMode(energy=True).")
        return self.energy


@dataclasses.dataclass(frozen=True)
class CostPass:
    """One effect of the NPU's compiler or system on the per-layer costs.

    Attributes:
      name: the pass's name (in errors and ``docs/design.md``).
      order: position in the chain (ascending; the per-layer model is 0).
      applies: ``applies(spec, chains, mode) -> bool``, static: whether the spec's switches
        (with the attention blocks and the :class:`CostMode`) call for the pass. Only passes
        read the spec's switches.
      apply: ``apply(inp, state) -> state``: the pass, pure jnp in the 64-bit scope.
      relaxed: it follows the relaxed mode (its decisions piecewise constant, its costs
        differentiable in the chosen branch).
      traced_layers: it runs on a traced :class:`~npujax.plan.LayerTable`.
      traced_shapes: it runs with traced workload sizes (``shapes``).
    """

    name: str
    order: int
    applies: Callable[[NpuSpec, tuple[AttentionChain, ...], CostMode], bool]
    apply: Callable[[PassInput, ProgramCosts], ProgramCosts]
    relaxed: bool = True
    traced_layers: bool = True
    traced_shapes: bool = True


def maybe_nonzero(value: Any) -> bool:
    """Whether a spec field may be non-zero when a pass decides to apply (static): False only
    for a concrete 0 (a preset's default, which then needs no pass); a traced or stacked value
    (a fit, a sweep, ``lower``'s shared program) may be anything."""
    return not (isinstance(value, int | float) and value == 0)


def once_per_inference(costs: LayerCosts, field: str, cycles: Any) -> LayerCosts:
    """``costs`` with a cost paid once per inference: ``cycles`` (float64 scalar) added to the
    first layer's ``field`` (e.g. ``"transfer_cycles"``) and to its ``latency_cycles``, so the
    schedule's total and the report's breakdown both carry it. Zero cycles leave the costs
    unchanged bit for bit (``x + 0.0``).

    Raises:
      AttributeError: ``field`` is not a :class:`~npujax.plan.LayerCosts` field.
    """
    n = jnp.shape(costs.latency_cycles)[-1]
    extra = jnp.where(jnp.arange(n) == 0, cycles, 0.0)
    return costs._replace(**{field: real(getattr(costs, field)) + extra},
                          latency_cycles=real(costs.latency_cycles) + extra)

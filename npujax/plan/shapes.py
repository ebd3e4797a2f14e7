"""Sweeps over model shapes (sequence length, resolution) in one compiled cost program.

:func:`npujax.lower` compiles one cost program per workload list, because the workloads' sizes
are constants of it. A sweep over a transformer's sequence length changes only the sizes, not
the structure (the same layers, devices, producers and fusion groups), so :func:`sweep_shapes`
stacks the sizes (:data:`~npujax.plan.costs.SHAPE_FIELDS`) of every point into ``[S, L]``
arrays and evaluates :func:`~npujax.plan.layer_costs` on them with ``jax.vmap``: one
compilation for the whole sweep instead of one per point, with the same numbers (bit for bit)
as lowering each point.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import TYPE_CHECKING

import jax
import jax.numpy as jnp
import numpy as np

from npujax.errors import ConfigError
from npujax.hw.spec import NpuSpec, as_spec
from npujax.plan.costs import SHAPE_FIELDS, LayerCosts, layer_costs
from npujax.plan.lower import layer_bits
from npujax.plan.workload import Workload

if TYPE_CHECKING:
    from npujax.quantize.spec import QuantSpec

__all__ = ["sweep_shapes", "structure"]


def structure(layers: Sequence[Workload]) -> tuple:
    """What must agree between the points of a shape sweep: every layer's name, operator,
    kind, device, producer, fused group and epilogue."""
    return tuple((w.name, w.op, w.kind, w.device, w.producer, w.fused_into, w.epilogue)
                 for w in layers)


@functools.lru_cache(maxsize=16)
def _program(layers: tuple[Workload, ...], dataflow: str | None):
    def one(spec, wb, ab, shapes):
        return layer_costs(layers, spec, wb, ab, dataflow, shapes=shapes)

    return jax.jit(jax.vmap(one, in_axes=(None, None, None, 0)))


def sweep_shapes(points: Sequence[Sequence[Workload]], spec: NpuSpec | str,
                 quant: QuantSpec | None = None, *, dataflow: str | None = None) -> LayerCosts:
    """The per-layer costs of every point of a shape sweep, in one vmapped program.

    Args:
      points: the workload lists (:func:`npujax.plan.workloads`) of the sweep's points, e.g.
        one graph per sequence length; all of the same :func:`structure`.
      spec: the NPU (an :class:`~npujax.hw.NpuSpec`, a preset name or a TOML path).
      quant: the precision (the same layer names at every point); None: 8 bits.
      dataflow: overrides the preset's dataflow.

    Returns:
      :class:`~npujax.plan.LayerCosts` of ``[S, L]`` arrays (the counts in 64 bits, exact);
      ``latency_cycles.sum(-1) / clock_hz`` is each point's latency, equal to
      ``npujax.lower(graph_s, spec, quant).latency_s``.

    Raises:
      ConfigError: no points, or points of different structure (another layer list: lower
        them separately).
    """
    spec = as_spec(spec)
    if not points:
        raise ConfigError("sweep_shapes needs at least one point (a workload list).")
    first = tuple(points[0])
    ref = structure(first)
    for i, p in enumerate(points[1:], 1):
        if structure(p) != ref:
            raise ConfigError(f"point {i} of the shape sweep has another layer structure than "
                              "point 0 (layers, devices or fusion differ); lower it on its own.")
    wb, ab = layer_bits(list(first), quant)
    with jax.enable_x64(True):
        shapes = {f: jnp.asarray(np.asarray([[getattr(w, f) for w in p] for p in points],
                                            np.int64)) for f in SHAPE_FIELDS}
        costs = _program(first, dataflow)(spec, jnp.asarray(wb), jnp.asarray(ab), shapes)
        return jax.tree.map(np.asarray, costs)

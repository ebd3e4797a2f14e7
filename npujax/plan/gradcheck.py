"""How good the relaxed gradients are: gradient vs the exact model's secant over one unit.

For every layer and every parameter ``p`` of :data:`STEPS`, the relaxed model's predicted change
``dlatency/dp x h`` (the one cost program, :func:`npujax.plan.program_costs`, relaxed) is compared
with the exact model's change ``latency(p + h) - latency(p)`` over one unit ``h`` of the parameter:
one row, column, core or lane; one bit less of a layer's weights or activations; 1 % more SRAM
bytes, DRAM bandwidth or clock. Latency is in seconds (so the clock counts). A case *agrees in sign*
when both changes have the same sign (changes within ``1e-9`` of the latency count as zero), and *in
magnitude* when, in addition, their ratio is within ``[1/2, 2]`` (or both are zero). Cases where
both changes are zero (a parameter that does not touch the layer) are counted separately and left
out of the rates.

**How a zero secant counts.** Strictly: a change counts as zero only within ``1e-9`` of the
layer's latency (float rounding of whole cycles); a gradient that predicts a change where the
exact model does not move (or the reverse) disagrees in sign. No coarser resolution is applied:
with the relaxed mode's default ``count_slope="unit"`` a one-unit step of a hardware count
predicts the exact change of its folds (whole folds, 0 on a plateau), so sub-fold predictions no
longer arise there. They remain where the relaxation is a mean slope or a blend — a tensor one
bit narrower that moves no whole DRAM burst (the bytes' straight-through slope predicts the
fraction), a 1 % larger buffer that reaches no new mapper chunk, a step that lowers the side of
``max(compute, memory)`` that does not bind within the temperature of balance — and they are
counted as disagreements, not rounded to zero (``docs/npu_model.md`` lists them).

This is the check of issue 13 (sign >= 95 %, magnitude >= 80 %); the benchmark
``experiments/bench/gradients.py`` runs it on random layers and every preset.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from npujax import _relax
from npujax.errors import ConfigError
from npujax.hw import fields
from npujax.hw.spec import NpuSpec, differentiable_spec
from npujax.plan.passes.attention import AttentionChain
from npujax.plan.passes.base import LATENCY, CostMode
from npujax.plan.program import program_cost
from npujax.plan.workload import Workload

__all__ = ["STEPS", "SecantCheck", "secant_check"]

#: parameter -> one unit of it: ``("add", 1)`` adds one, ``("scale", 0.01)`` adds 1 % (rounded
#: to a whole number for integer fields); ``weight_bits``/``act_bits`` step one bit down.
STEPS: dict[str, tuple[str, float]] = {
    "array.rows": ("add", 1.0),
    "array.cols": ("add", 1.0),
    "array.cores": ("add", 1.0),
    "vector.lanes": ("add", 1.0),
    "memory.ifmap_sram_bytes": ("scale", 0.01),
    "memory.filter_sram_bytes": ("scale", 0.01),
    "memory.ofmap_sram_bytes": ("scale", 0.01),
    "memory.dram_bytes_per_s": ("scale", 0.01),
    "array.clock_hz": ("scale", 0.01),
    "weight_bits": ("add", -1.0),
    "act_bits": ("add", -1.0),
}

_ZERO_RTOL = 1e-9


@dataclasses.dataclass(frozen=True)
class SecantCheck:
    """Per-case results of :func:`secant_check` (float64 ``[P, L]`` arrays, rows in ``params``
    order).

    Attributes:
      params: the parameter names (rows).
      predicted: relaxed gradient x step (s).
      secant: the exact model's change over the step (s).
      latency: exact latency of each layer (s), ``[L]``.
    """

    params: tuple[str, ...]
    predicted: np.ndarray
    secant: np.ndarray
    latency: np.ndarray

    def _masks(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        tol = _ZERO_RTOL * np.abs(self.latency)[None, :]
        p = np.where(np.abs(self.predicted) <= tol, 0.0, self.predicted)
        s = np.where(np.abs(self.secant) <= tol, 0.0, self.secant)
        informative = (p != 0) | (s != 0)
        sign = np.sign(p) == np.sign(s)
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = np.where(s != 0, p / s, np.inf)
        mag = sign & (((p == 0) & (s == 0)) | ((ratio >= 0.5) & (ratio <= 2.0)))
        return informative, sign, mag

    def rates(self) -> dict[str, dict[str, float]]:
        """Per parameter and ``"all"``: ``cases`` (informative), ``trivial`` (both zero),
        ``sign`` and ``magnitude`` agreement rates over the informative cases."""
        informative, sign, mag = self._masks()
        out = {}
        rows = [(p, slice(i, i + 1)) for i, p in enumerate(self.params)]
        for name, sl in [*rows, ("all", slice(None))]:
            inf = informative[sl]
            n = int(inf.sum())
            out[name] = {
                "cases": n,
                "trivial": int((~inf).sum()),
                "sign": float(sign[sl][inf].mean()) if n else float("nan"),
                "magnitude": float(mag[sl][inf].mean()) if n else float("nan"),
            }
        return out


def _step(spec: NpuSpec, name: str) -> tuple[NpuSpec, float]:
    kind, amount = STEPS[name]
    old = fields.get(spec, name)
    if kind == "add":
        new = old + type(old)(amount)
    elif isinstance(old, int):
        new = old + max(1, round(old * amount))
    else:
        new = old * (1.0 + amount)
    return fields.replace(spec, {name: new}), float(new - old)


def secant_check(
    layers: Sequence[Workload],
    spec: NpuSpec,
    weight_bits: Sequence[float],
    act_bits: Sequence[float],
    params: Sequence[str] = tuple(STEPS),
    temperature: float | None = None,
    count_slope: str = "unit",
    chains: Sequence[AttentionChain] = (),
) -> SecantCheck:
    """Compare the relaxed gradient of every layer's latency with the exact secant.

    Args:
      layers: the workloads (any; layers linked by ``producer`` are stepped one at a time).
      spec: the NPU (its values must stay valid one step up, e.g. cores < 2**16).
      weight_bits: ``[L]`` weight widths (bits, >= 2 so that one bit less is a width).
      act_bits: ``[L]`` activation widths (bits, >= 2).
      params: names from :data:`STEPS`.
      temperature: the relaxation temperature (default ``0.05``).
      count_slope: the relaxed mode's slope of fold counts w.r.t. hardware counts
        (``layer_costs``'s ``count_slope``: ``unit`` or ``mean``).
      chains: the graph's attention blocks (:func:`npujax.plan.network`): the latencies are the
        one cost program's, every pass of ``spec`` included.

    Returns:
      :class:`SecantCheck` (float64).

    Raises:
      ConfigError: an unknown parameter name, widths below 2 bits, or a step outside a spec
        field's valid range.
    """
    bad = [p for p in params if p not in STEPS]
    if bad:
        raise ConfigError(f"unknown secant-check parameters {bad}; use names from {list(STEPS)}.")
    n = len(layers)
    temp = _relax.DEFAULT_TEMPERATURE if temperature is None else temperature
    relaxed = CostMode(relaxed=True, temperature=temp, count_slope=count_slope, energy=False)

    def exact_s(s, w, a):
        return program_cost(layers, s, w, a, chains=chains, mode=LATENCY
                            ).costs.latency_cycles / jnp.asarray(s.array.clock_hz, jnp.float64)

    def relaxed_s(s, w, a):
        return program_cost(layers, s, w, a, chains=chains, mode=relaxed
                            ).costs.latency_cycles / s.array.clock_hz

    def relaxed_bits_s(w, a):  # in the caller's config: the 64-bit counts cast down first
        cycles = program_cost(layers, spec, w, a, chains=chains, mode=relaxed
                              ).costs.latency_cycles
        return cycles.astype(w.dtype) / spec.array.clock_hz

    # the widths' gradients as a search takes them: float32 widths in JAX's default config (a
    # gradient that works only with 64-bit types enabled would pass unnoticed with them on)
    jac_bits = None
    if {"weight_bits", "act_bits"} & set(params):
        w32, a32 = np.asarray(weight_bits, np.float32), np.asarray(act_bits, np.float32)
        if w32.shape == a32.shape == (n,):
            with jax.enable_x64(False):
                jac_bits = jax.jit(jax.jacrev(relaxed_bits_s, argnums=(0, 1)))(w32, a32)
    with jax.enable_x64(True):
        wb = jnp.asarray(weight_bits, jnp.float64)
        ab = jnp.asarray(act_bits, jnp.float64)
        if wb.shape != (n,) or ab.shape != (n,) or float(jnp.min(jnp.minimum(wb, ab))) < 2:
            raise ConfigError(f"secant_check needs one width >= 2 bits per layer ({n}); got "
                              f"shapes {wb.shape}, {ab.shape}.")
        exact = jax.jit(exact_s)
        base = np.asarray(exact(spec, wb, ab))
        jac_spec = None
        if set(params) - {"weight_bits", "act_bits"}:
            ds = differentiable_spec(spec, jnp.float64)
            jac_spec = jax.jit(jax.jacrev(relaxed_s))(ds, wb, ab)
        one_hot = jnp.eye(n, dtype=jnp.float64)
        pred, sec = [], []
        for p in params:
            if p in ("weight_bits", "act_bits"):
                i = 1 if p == "weight_bits" else 2
                assert jac_bits is not None
                pred.append(-np.diagonal(np.asarray(jac_bits[i - 1], np.float64)))
                wbn, abn = jnp.broadcast_to(wb, (n, n)), jnp.broadcast_to(ab, (n, n))
                args = [(wbn - one_hot, abn), (wbn, abn - one_hot)][i - 1]
                stepped = jax.jit(jax.vmap(exact_s, in_axes=(None, 0, 0)))(spec, *args)
                sec.append(np.diagonal(np.asarray(stepped)) - base)
            else:
                new, h = _step(spec, p)
                assert jac_spec is not None
                g = np.asarray(fields.get(jac_spec, p))
                pred.append(g * h)
                sec.append(np.asarray(exact(new, wb, ab)) - base)
    return SecantCheck(params=tuple(params), predicted=np.stack(pred), secant=np.stack(sec),
                       latency=base)

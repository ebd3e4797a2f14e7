"""Thermal throttling: the latency an NPU sustains after a while of continuous inference.

Edge NPUs slow down as they heat up: a practitioner measured 12 ms cold and 18 ms after five
minutes of continuous inference on a development board (issue 32). This module is a **model
right after the one cost program**, not a pass inside it. A pass rewrites one clock's per-layer
costs, while throttling chooses *which clock* the per-layer costs are evaluated at, from the
whole inference's energy and latency at every clock of the DVFS table. So the cost program
(:func:`npujax.plan.program_costs`, every pass included) is evaluated once per DVFS step, at
``clock_hz x dvfs_clock_scales[i]``, and this model combines the totals. The per-layer cycles
stay the program's, and so does every number that ``lower`` reported before: this model adds
numbers and changes none. :func:`thermal_state` is pure jnp of those totals and the spec's
``[thermal]`` fields. The design-space sweep evaluates it inside its vmapped program (the
``sustained_latency_s`` column, an objective ``sweep --pareto`` can name). ``lower
--sustained SECONDS`` reports it.

**Power.** During continuous inference at DVFS step ``k`` (clock ``f_k``) the chip draws
``P_k = E_k / T_k + static_power_w``: ``E_k`` the energy model's joules per inference
(:mod:`npujax.plan.passes.energy`) and ``T_k`` the latency at ``f_k``. The per-action energies
do not depend on the clock (no voltage scaling is modelled: a DVFS step that also lowers the
supply would lower ``P_k`` further), so a slower clock lowers the power by stretching the same
energy over a longer inference. Memory-bound layers barely slow down, so a model's slowdown at
``f / 2`` is between 1 (all memory-bound) and 2 (all compute-bound).

**Temperature.** One thermal resistance ``R`` (junction to ambient, K/W) and one time constant
``tau = R C`` (s), a first-order RC network (the lumped model of JEDEC JESD51-1 and of
HotSpot's single node; Skadron et al., ISCA 2003). At a constant power ``P`` from the
temperature ``T_0``::

    T(t) = T_ss + (T_0 - T_ss) exp(-t / tau),   T_ss = ambient_c + P R

and from ambient this is ``T_amb + P R (1 - exp(-t / tau))``. An inference takes milliseconds
and ``tau`` is seconds to minutes, so the power is averaged over inferences.

**DVFS.** Step 0 is the nominal clock; the chip enters step ``i + 1`` when the junction reaches
``dvfs_thresholds_c[i]`` and returns below ``dvfs_thresholds_c[i] - hysteresis_c``. Starting cold
(at ambient), the chip climbs steps while step ``k``'s steady temperature lies above the next
threshold. Step ``k`` lasts::

    t_k = tau ln((T_ss,k - T_entry,k) / (T_ss,k - theta_{k+1}))

so the first throttle comes at ``tau ln(P_0 R / (P_0 R - (theta_1 - T_amb)))``. The sustained
operating point is the fixed point of "the clock sets the power, the power sets the
temperature, the temperature sets the clock": the first step ``m`` whose own steady temperature
``T_ss,m`` stays below ``theta_{m+1}``. If ``T_ss,m`` also stays above ``theta_m -
hysteresis_c`` the chip settles there. Otherwise no step is a fixed point: step ``m`` cools the
chip below its release point and step ``m - 1`` heats it past ``theta_m``, a limit cycle. Its
phases last ``tau ln((a + h) / a)`` (heating at ``m - 1``, ``a = T_ss,m-1 - theta_m``) and
``tau ln(b / (b - h))`` (cooling at ``m``, ``b = theta_m - T_ss,m``). Without hysteresis the
phases shrink to nothing in the ratio ``b : a``, so the clock dithers at the fraction that holds
the junction at ``theta_m`` (the average power ``(theta_m - T_amb) / R``). The latency in a limit
cycle is its mean: the inverse of the time-averaged inference rate.

Not modelled: the package's second time constant (die versus heatsink), the sensor's polling
period (Coral's driver polls at ``temp_poll_interval`` ms), other heat sources on the board
(the host CPU under the same heatsink), and a fan's own trip points.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from npujax.errors import ConfigError
from npujax.hw.spec import NpuSpec, ThermalSpec

__all__ = ["ThermalState", "thermal_state", "dvfs_clocks_hz", "throttled_specs",
           "SustainedReport", "sustained"]


class ThermalState(NamedTuple):
    """The thermal model at one time (float scalars, or ``[n]`` under ``vmap``).

    Attributes:
      latency_s: the latency at the time asked (s): the DVFS step in effect then, or a limit
        cycle's mean once it has started.
      step: the DVFS step in effect (0 = nominal clock; int); in a limit cycle the slower one.
      temperature_c: the junction temperature at that time (degrees C).
      power_w: the power drawn at that time (W; a limit cycle's mean once it has started).
      first_throttle_s: when the junction first reaches ``dvfs_thresholds_c[0]`` (s), inf if it
        never does.
      steady_latency_s: the latency as time goes to infinity (s; a limit cycle's mean).
      steady_step: the step the chip settles at (in a limit cycle the slower one).
      steady_temperature_c: the temperature it settles at (degrees C; a limit cycle's mean
        band centre, the threshold itself without hysteresis).
      limit_cycle: whether the chip ends in a limit cycle between ``steady_step - 1`` and
        ``steady_step`` (bool).
      settle_s: when the last step (or the limit cycle) is first entered (s).
    """

    latency_s: Any
    step: Any
    temperature_c: Any
    power_w: Any
    first_throttle_s: Any
    steady_latency_s: Any
    steady_step: Any
    steady_temperature_c: Any
    limit_cycle: Any
    settle_s: Any


def dvfs_clocks_hz(spec: NpuSpec) -> tuple[Any, ...]:
    """The clock of each DVFS step: ``array.clock_hz`` then ``clock_hz x dvfs_clock_scales``."""
    f = spec.array.clock_hz
    return (f, *(f * s for s in spec.thermal.dvfs_clock_scales))


def throttled_specs(spec: NpuSpec) -> tuple[NpuSpec, ...]:
    """``spec`` at each DVFS step's clock (concrete specs, validated; the first is ``spec``).

    Args:
      spec: a concrete NPU.

    Returns:
      One spec per step, differing from ``spec`` in ``array.clock_hz`` alone: the same name and
      static fields, so a compiled cost program serves every step (the clock is a traced
      field). Their DVFS tables are ``spec``'s, unused: the table's scales are fractions of
      the nominal clock, which only ``spec`` holds.
    """
    return (spec, *(spec.with_fields({"array.clock_hz": spec.array.clock_hz * s})
                    for s in spec.thermal.dvfs_clock_scales))


def _f(x: Any) -> Any:
    return jnp.asarray(x, jnp.result_type(float))


def thermal_state(latency_s: Any, energy_j: Any, thermal: ThermalSpec, seconds: Any
                  ) -> ThermalState:
    """The thermal model (module docstring) at ``seconds`` of continuous inference from cold.

    Pure jnp: ``jax.vmap`` over configurations (the thermal fields may be traced or stacked)
    and over times; differentiable in the latencies, energies and thermal fields (piecewise:
    the step in effect is a discrete choice).

    Args:
      latency_s: float ``[K + 1]`` latency per inference at each DVFS step (s), the nominal
        clock first (:func:`dvfs_clocks_hz`).
      energy_j: float ``[K + 1]`` energy per inference at each step (J).
      thermal: the spec's ``[thermal]`` section (its table static, ``K`` entries).
      seconds: time since the start of continuous inference from ambient (s), >= 0.

    Returns:
      :class:`ThermalState`.

    Examples:
      >>> th = ThermalSpec(junction_to_ambient_k_per_w=30.0, time_constant_s=60.0,
      ...                  dvfs_thresholds_c=(85.0,), dvfs_clock_scales=(0.5,))
      >>> s = thermal_state(jnp.array([0.01, 0.016]), jnp.array([0.03, 0.03]), th, 300.0)
      >>> float(s.first_throttle_s) > 0  # doctest: +SKIP
    """
    lat, e = _f(latency_s), _f(energy_j)
    n = len(thermal.dvfs_thresholds_c) + 1
    if lat.shape[-1:] != (n,) or e.shape[-1:] != (n,):
        raise ConfigError(f"thermal_state needs one latency and one energy per DVFS step "
                          f"({n}), got {lat.shape} and {e.shape}.")
    ta, r, tau = _f(thermal.ambient_c), _f(thermal.junction_to_ambient_k_per_w), \
        _f(thermal.time_constant_s)
    h, t = _f(thermal.hysteresis_c), _f(seconds)
    power = e / lat + _f(thermal.static_power_w)
    tss = ta + power * r  # [n]
    inf = jnp.inf
    theta = jnp.asarray(thermal.dvfs_thresholds_c, lat.dtype).reshape(n - 1)
    up = jnp.concatenate([theta, jnp.full((1,), inf, lat.dtype)])  # exit threshold of step k
    entry = jnp.concatenate([ta[None], theta])  # entry temperature of step k
    climbs = tss > up  # [n]: step k heats past its exit threshold
    m = jnp.argmin(climbs)  # the first step that does not (the last never does)
    idx = jnp.arange(n)
    # time in each climbing step: tau ln((Tss - entry) / (Tss - exit))
    num = jnp.where(climbs, tss - entry, 1.0)
    den = jnp.where(climbs, tss - jnp.where(climbs, up, 0.0), 1.0)
    dur = jnp.where(climbs & (idx < m), tau * jnp.log(num / den), 0.0)
    start = jnp.concatenate([jnp.zeros((1,), lat.dtype), jnp.cumsum(dur)[:-1]])  # [n]
    settle = start[m]
    first = jnp.where(m >= 1, start[jnp.minimum(1, n - 1)], inf)

    # the operating point at m: settled, or a limit cycle between m - 1 and m
    theta_m = entry[m]
    lc = (m >= 1) & (tss[m] < theta_m - h)
    prev = jnp.maximum(m - 1, 0)
    a = jnp.where(lc, tss[prev] - theta_m, 1.0)  # > 0: step m - 1 climbs past theta_m
    b = jnp.where(lc, theta_m - tss[m], 2.0)  # > h
    hs = jnp.where(h > 0, h, 1.0)
    t_heat = jnp.where(h > 0, tau * jnp.log((a + hs) / a), b / (a + b))
    t_cool = jnp.where(h > 0, tau * jnp.log(b / (b - jnp.where(h > 0, hs, 0.0))), a / (a + b))
    x_heat = t_heat / (t_heat + t_cool)
    rate = x_heat / lat[prev] + (1.0 - x_heat) / lat[m]
    cyc_lat = 1.0 / rate
    cyc_power = x_heat * power[prev] + (1.0 - x_heat) * power[m]
    steady_lat = jnp.where(lc, cyc_lat, lat[m])
    steady_temp = jnp.where(lc, theta_m - h / 2.0, tss[m])

    # at time t: the step whose interval holds t (climbing), else the operating point
    k = jnp.minimum(jnp.sum((start <= t) & (idx <= m)) - 1, m)
    k = jnp.maximum(k, 0)
    temp_k = tss[k] + (entry[k] - tss[k]) * jnp.exp(-(t - start[k]) / tau)
    # in the limit cycle: cool from theta_m at step m for t_cool, heat from theta_m - h at m-1
    period = jnp.where(h > 0, t_heat + t_cool, 1.0)
    ph = jnp.mod(jnp.maximum(t - settle, 0.0), period)
    cool = ph < t_cool
    t_in_cycle = jnp.where(
        cool, tss[m] + (theta_m - tss[m]) * jnp.exp(-ph / tau),
        tss[prev] + (theta_m - h - tss[prev]) * jnp.exp(-(ph - t_cool) / tau))
    in_cycle = lc & (t >= settle)
    temperature = jnp.where(in_cycle, jnp.where(h > 0, t_in_cycle, theta_m), temp_k)
    latency = jnp.where(in_cycle, cyc_lat, lat[k])
    p_now = jnp.where(in_cycle, cyc_power, power[k])
    step = jnp.where(in_cycle, m, k)
    return ThermalState(latency, step, temperature, p_now, first, steady_lat, m, steady_temp, lc,
                        settle)


#: :func:`thermal_state` compiled (one program per DVFS table length and dtype).
_thermal_state_jit = jax.jit(thermal_state)


@dataclasses.dataclass(frozen=True)
class SustainedReport:
    """``lower --sustained``: the thermal model of one lowering (:func:`sustained`).

    Attributes:
      seconds: the time asked (s).
      clocks_hz: each DVFS step's clock (Hz), nominal first.
      latency_s: each step's latency per inference (s), from the one cost program.
      energy_j: each step's energy per inference (J).
      power_w: each step's power during continuous inference (W).
      steady_temperature_c: each step's own steady temperature (degrees C).
      state: the :class:`ThermalState` at ``seconds`` (Python numbers).
      thermal: the spec's ``[thermal]`` section.
    """

    seconds: float
    clocks_hz: tuple[float, ...]
    latency_s: tuple[float, ...]
    energy_j: tuple[float, ...]
    power_w: tuple[float, ...]
    steady_temperature_c: tuple[float, ...]
    state: ThermalState
    thermal: ThermalSpec

    @property
    def modelled(self) -> bool:
        """Whether the preset has a thermal model (a thermal resistance)."""
        return self.thermal.junction_to_ambient_k_per_w > 0

    def at(self, seconds: Sequence[float] | np.ndarray) -> ThermalState:
        """The :class:`ThermalState` at each of ``seconds`` (numpy ``[n]`` arrays)."""
        with jax.enable_x64(True):
            fn = jax.jit(jax.vmap(lambda t: thermal_state(
                jnp.asarray(self.latency_s), jnp.asarray(self.energy_j), self.thermal, t)))
            return ThermalState(*(np.asarray(v) for v in fn(jnp.asarray(seconds, float))))

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready numbers (``schedule.json``'s ``sustained``)."""
        s = self.state
        inf = lambda v: None if not math.isfinite(float(v)) else float(v)  # noqa: E731
        return {
            "seconds": self.seconds, "modelled": self.modelled,
            "steps": [{"clock_hz": f, "latency_s": t, "energy_j": e, "power_w": p,
                       "steady_temperature_c": c, "threshold_c": th}
                      for f, t, e, p, c, th in zip(
                          self.clocks_hz, self.latency_s, self.energy_j, self.power_w,
                          self.steady_temperature_c,
                          (None, *self.thermal.dvfs_thresholds_c), strict=True)],
            "latency_s": float(s.latency_s), "step": int(s.step),
            "temperature_c": float(s.temperature_c), "power_w": float(s.power_w),
            "first_throttle_s": inf(s.first_throttle_s),
            "steady_latency_s": float(s.steady_latency_s), "steady_step": int(s.steady_step),
            "steady_temperature_c": float(s.steady_temperature_c),
            "limit_cycle": bool(s.limit_cycle), "settle_s": float(s.settle_s),
            "thermal": dataclasses.asdict(self.thermal),
        }


def sustained(spec: NpuSpec, seconds: float,
              lower_at: Callable[[NpuSpec], tuple[float, float]]) -> SustainedReport:
    """The thermal model of a lowering after ``seconds`` of continuous inference.

    Args:
      spec: the NPU (concrete); without a ``[thermal]`` section nothing throttles and the
        sustained latency is the cold one.
      seconds: time of continuous inference from ambient (s), >= 0 and finite.
      lower_at: ``lower_at(spec_k) -> (latency_s, energy_j)`` per inference on a spec at one
        DVFS step's clock (:func:`throttled_specs`), e.g. through :func:`npujax.lower`.

    Returns:
      :class:`SustainedReport`.

    Raises:
      ConfigError: ``seconds`` negative or not finite.
    """
    if not (isinstance(seconds, int | float) and math.isfinite(seconds) and seconds >= 0):
        raise ConfigError(f"--sustained takes seconds of continuous inference (a finite "
                          f"number >= 0), got {seconds!r}.")
    specs = throttled_specs(spec)
    lat, en = zip(*(lower_at(s) for s in specs), strict=True)
    th = spec.thermal
    with jax.enable_x64(True):
        state = _thermal_state_jit(jnp.asarray(lat), jnp.asarray(en), th,
                                   jnp.asarray(float(seconds)))
        state = ThermalState(*(v.item() for v in state))
    power = tuple(e / t + th.static_power_w for e, t in zip(en, lat, strict=True))
    tss = tuple(th.ambient_c + p * th.junction_to_ambient_k_per_w for p in power)
    return SustainedReport(float(seconds), tuple(float(s.array.clock_hz) for s in specs),
                           tuple(map(float, lat)), tuple(map(float, en)), power, tss, state, th)

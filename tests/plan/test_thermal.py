"""The thermal-throttling model (npujax.plan.thermal) against the closed-form RC solution and
an independent time-stepped simulation of the same RC network and DVFS controller."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from npujax.errors import ConfigError
from npujax.hw import ThermalSpec, load_npu_spec
from npujax.plan.thermal import sustained, thermal_state, throttled_specs

# three DVFS steps of a made-up chip: its latency and energy per inference at each clock
LAT = np.array([0.012, 0.018, 0.030])
EN = np.array([0.024, 0.024, 0.024])


_STATE = jax.jit(thermal_state)  # one compile per table length


def _state(th, t, lat=LAT, en=EN):
    with jax.enable_x64(True):
        s = _STATE(jnp.asarray(lat), jnp.asarray(en), th, jnp.asarray(t, float))
        return type(s)(*(v.item() for v in s))


def _simulate(th, lat, en, t_end, dt=2e-3):
    """Time-stepped C dT/dt = P - (T - Ta) / R (each step of ``dt`` at the power of the clock
    in effect, exact within the step) with the DVFS controller polled every ``dt`` (step up at
    a threshold, down below threshold - hysteresis): returns the time of each first step entry
    and the mean latency (inverse mean inference rate) over the second half."""
    r, tau, ta = th.junction_to_ambient_k_per_w, th.time_constant_s, th.ambient_c
    theta = th.dvfs_thresholds_c
    power = en / lat + th.static_power_w
    temp, k, entries, done = ta, 0, {}, 0.0
    n = int(t_end / dt)
    for i in range(n):
        t = i * dt
        while k < len(theta) and temp >= theta[k]:
            k += 1
            entries.setdefault(k, t)
        while k > 0 and temp < theta[k - 1] - th.hysteresis_c:
            k -= 1
        if i >= n // 2:
            done += dt / lat[k]
        tss = ta + power[k] * r
        temp = tss + (temp - tss) * math.exp(-dt / tau)
    return entries, (t_end - (n // 2) * dt) / done


def test_temperature_is_the_closed_form_rc_solution():
    th = ThermalSpec(junction_to_ambient_k_per_w=20.0, time_constant_s=45.0, static_power_w=0.3,
                     dvfs_thresholds_c=(150.0,), dvfs_clock_scales=(0.5,))
    p = EN[0] / LAT[0] + 0.3
    for t in (0.0, 3.0, 45.0, 200.0, 1e4):
        want = 25.0 + p * 20.0 * (1.0 - math.exp(-t / 45.0))
        s = _state(th, t, LAT[:2], EN[:2])
        assert s.temperature_c == pytest.approx(want, rel=1e-12)
        assert s.step == 0 and s.latency_s == LAT[0]
    s = _state(th, 10.0, LAT[:2], EN[:2])
    assert math.isinf(s.first_throttle_s)
    assert s.steady_temperature_c == pytest.approx(25.0 + p * 20.0, rel=1e-12)


def test_first_throttle_time_is_analytic():
    th = ThermalSpec(junction_to_ambient_k_per_w=40.0, time_constant_s=60.0,
                     dvfs_thresholds_c=(70.0, 90.0), dvfs_clock_scales=(0.5, 0.25))
    p0 = EN[0] / LAT[0]
    t1 = 60.0 * math.log(p0 * 40.0 / (p0 * 40.0 - (70.0 - 25.0)))
    s = _state(th, 0.0)
    assert s.first_throttle_s == pytest.approx(t1, rel=1e-12)
    # just before, step 0 at (almost) the threshold; just after, step 1
    assert _state(th, t1 * (1 - 1e-9)).step == 0
    assert _state(th, t1 * (1 + 1e-9)).step == 1
    assert _state(th, t1).temperature_c == pytest.approx(70.0, abs=1e-6)


@pytest.mark.parametrize("hysteresis", [0.0, 3.0])
def test_steps_and_limit_cycle_agree_with_a_time_stepped_simulation(hysteresis):
    # step 1 still climbs past 90 C; step 2 cools below it: a limit cycle between 1 and 2
    th = ThermalSpec(junction_to_ambient_k_per_w=50.0, time_constant_s=20.0,
                     dvfs_thresholds_c=(70.0, 90.0), dvfs_clock_scales=(0.5, 0.25),
                     hysteresis_c=hysteresis)
    s = _state(th, 1e3)
    entries, mean_latency = _simulate(th, LAT, EN, 400.0)
    assert s.first_throttle_s == pytest.approx(entries[1], abs=4e-3)
    assert s.settle_s == pytest.approx(entries[2], abs=4e-3)
    assert s.limit_cycle and s.steady_step == 2
    assert s.steady_latency_s == pytest.approx(mean_latency, rel=2e-3)
    if hysteresis == 0.0:  # the clock dithers at the power that holds the junction at 90 C
        assert s.power_w == pytest.approx((90.0 - 25.0) / 50.0, rel=1e-12)


def test_settles_on_a_step_that_is_its_own_fixed_point():
    th = ThermalSpec(junction_to_ambient_k_per_w=35.0, time_constant_s=30.0,
                     dvfs_thresholds_c=(70.0, 90.0), dvfs_clock_scales=(0.5, 0.25),
                     hysteresis_c=30.0)
    s = _state(th, 1e4)  # step 1: 25 + 35 x 1.33 = 71.7 C, between 70 - 30 and 90
    assert not s.limit_cycle and s.steady_step == 1 and s.step == 1
    assert s.steady_latency_s == LAT[1]
    assert s.steady_temperature_c == pytest.approx(25.0 + 35.0 * EN[1] / LAT[1], rel=1e-12)
    assert _simulate(th, LAT, EN, 300.0)[1] == pytest.approx(LAT[1], rel=1e-9)


def test_hotter_chips_throttle_sooner_and_sustain_less():
    first, steady, later = [], [], []
    for r in (20.0, 30.0, 40.0, 60.0, 80.0):
        th = ThermalSpec(junction_to_ambient_k_per_w=r, time_constant_s=60.0,
                         dvfs_thresholds_c=(70.0, 90.0), dvfs_clock_scales=(0.5, 0.25))
        first.append(_state(th, 0.0).first_throttle_s)
        steady.append(_state(th, 0.0).steady_latency_s)
        later.append([_state(th, t).latency_s for t in (0.0, 30.0, 60.0, 120.0, 600.0)])
    assert all(b <= a for a, b in zip(first, first[1:])) and math.isinf(first[0])
    assert all(b >= a for a, b in zip(steady, steady[1:])) and steady[-1] > steady[0]
    for row in later:  # from cold, the latency never falls
        assert all(b >= a for a, b in zip(row, row[1:]))


def test_without_a_thermal_section_nothing_throttles():
    spec = load_npu_spec("edge_16x16")
    assert throttled_specs(spec) == (spec,)
    rep = sustained(spec, 300.0, lambda s: (0.01, 0.02))
    assert not rep.modelled and rep.state.latency_s == 0.01
    assert math.isinf(rep.state.first_throttle_s)
    with pytest.raises(ConfigError, match="seconds"):
        sustained(spec, -1.0, lambda s: (0.01, 0.02))


def test_throttled_specs_differ_in_the_clock_alone():
    spec = load_npu_spec("coral_devboard")
    specs = throttled_specs(spec)
    clocks = [s.array.clock_hz for s in specs]
    assert clocks == [spec.array.clock_hz * f for f in (1.0, 0.5, 0.25, 0.125)]
    # one compiled program serves every step: only the (traced) clock differs
    assert all(jax.tree.structure(s) == jax.tree.structure(spec) for s in specs)


@pytest.mark.parametrize("changes,key", [
    ({"thermal.dvfs_clock_scales": [0.5]}, "dvfs_clock_scales"),
    ({"thermal.dvfs_thresholds_c": [90.0, 85.0, 95.0]}, "dvfs_thresholds_c"),
    ({"thermal.dvfs_clock_scales": [0.5, 0.5, 0.125]}, "dvfs_clock_scales"),
    ({"thermal.dvfs_clock_scales": [1.0, 0.25, 0.125]}, "dvfs_clock_scales"),
    ({"thermal.dvfs_clock_scales": [0.5, 0.25, 0.0]}, "dvfs_clock_scales"),
    ({"thermal.dvfs_thresholds_c": [85.0, "hot", 95.0]}, "dvfs_thresholds_c"),
    ({"thermal.junction_to_ambient_k_per_w": 0.0}, "junction_to_ambient_k_per_w"),
    ({"thermal.ambient_c": 90.0}, "ambient_c"),
    ({"thermal.hysteresis_c": 5.0}, "hysteresis_c"),
    ({"thermal.time_constant_s": 0.0}, "time_constant_s"),
])
def test_bad_thermal_tables_name_the_key(changes, key):
    spec = load_npu_spec("coral_devboard")
    with pytest.raises(ConfigError, match=rf"\[thermal\].*'{key}'|'{key}'.*"):
        spec.with_fields(changes)

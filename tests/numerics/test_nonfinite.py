"""Non-finite inputs and extreme finite ranges at the fake-quant API (issue 28, item 11).

A NaN or inf in a weight used to give a NaN or inf scale and NaN outputs silently, and a finite
range near the float32 maximum gave -inf (int2/int3) or NaN (an asymmetric range wider than the
float32 maximum). Eager values that are not finite are refused, naming the tensor and channel;
every scale computed from finite values dequantizes every code to a finite value.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from npujax.errors import QuantizationError
from npujax.numerics import (
    FP8_E4M3FN,
    FP8_E5M2,
    IntFormat,
    fake_quant,
    lsq_fake_quant,
    lsq_init_step,
    qparams_from_range,
    quantize,
    weight_qparams,
)
from npujax.quantize.quantizers.base import quantize_weight

FMAX = float(np.finfo(np.float32).max)


@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf])
def test_a_non_finite_weight_is_refused_naming_the_tensor_and_channel(value):
    w = np.ones((3, 4, 5), np.float32)
    w[1, 3, 2] = value
    with pytest.raises(QuantizationError, match=r"'conv1/kernel'.*channel 3 \(axis 1\)"):
        weight_qparams(w, IntFormat(8), 1, name="conv1/kernel")
    with pytest.raises(QuantizationError, match=r"weight.*channel 2 \(axis -1\)"):
        weight_qparams(w, IntFormat(4), -1)  # the default name
    with pytest.raises(QuantizationError, match=r"weight 'w'.*element \(1, 3, 2\)"):
        quantize_weight(jnp.asarray(w), IntFormat(8), None, name="w")  # per tensor
    with pytest.raises(QuantizationError, match=r"block 1 along axis 2 \(element \(1, 3, 2\)"):
        weight_qparams(w, IntFormat(4), 2, block_size=2)
    with pytest.raises(QuantizationError, match=r"input 'fc/kernel'.*channel 1"):
        lsq_init_step(w, IntFormat(4), axis=0, name="fc/kernel")
    with pytest.raises(QuantizationError, match=r"range maximum.*channel 2"):
        qparams_from_range(jnp.zeros(4), jnp.asarray([1.0, 1.0, value, 1.0]), IntFormat(8),
                           False)


def test_non_finite_grids_and_nan_inputs_are_refused_eagerly():
    x = jnp.ones((2, 3))
    for bad in (np.nan, np.inf, 0.0, -1.0):
        with pytest.raises(QuantizationError, match=r"scale.*channel 1"):
            fake_quant(x, jnp.asarray([1.0, bad, 1.0]), jnp.zeros(3), IntFormat(8), axis=1)
    with pytest.raises(QuantizationError, match=r"zero_point"):
        fake_quant(x, 1.0, np.nan, IntFormat(8))
    with pytest.raises(QuantizationError, match=r"input.*channel 2"):
        quantize(x.at[1, 2].set(np.nan), jnp.ones(3), jnp.zeros(3, jnp.int32), IntFormat(8),
                 axis=1)
    with pytest.raises(QuantizationError, match=r"step"):
        lsq_fake_quant(x, jnp.float32(np.inf), IntFormat(4))
    # +-inf activations saturate to the grid's ends (as ONNX QuantizeLinear's saturate)
    out = fake_quant(jnp.asarray([-np.inf, np.inf]), 0.5, 0, IntFormat(8))
    np.testing.assert_array_equal(np.asarray(out), [-64.0, 63.5])


def test_inside_jit_nothing_can_be_raised_and_nan_propagates():
    # documented: a traced value is not known, so the checks are eager only; the graph-level
    # entry points (calibrate, QAT, convert) check every weight before they trace
    w = jnp.ones((2, 3)).at[0, 1].set(jnp.nan)
    s, _ = jax.jit(lambda v: weight_qparams(v, IntFormat(8), 0))(w)
    assert np.isnan(np.asarray(s)[0]) and np.asarray(s)[1] > 0


def _formats():
    return [IntFormat(b, signed=sgn, narrow_range=nr) for b in (2, 3, 4, 8, 16)
            for sgn in (True, False) for nr in (False, True)]


finite = st.floats(-FMAX, FMAX, width=32, allow_nan=False, allow_infinity=False)
extreme = st.one_of(finite, st.sampled_from([FMAX, -FMAX, FMAX / 2, -FMAX / 3, 1e38, -1e38,
                                             3e38, 1e-38, -1e-45, 0.0]))


@given(lo=extreme, hi=extreme, fmt=st.sampled_from(_formats()), symmetric=st.booleans())
@settings(max_examples=150, deadline=None)
def test_any_finite_range_gives_a_grid_of_finite_values(lo, hi, fmt, symmetric):
    scale, zp = qparams_from_range(np.float32(min(lo, hi)), np.float32(max(lo, hi)), fmt,
                                   symmetric)
    assert np.isfinite(float(scale)) and float(scale) > 0
    # every code dequantizes to a finite value, and so does every finite input
    codes = np.arange(fmt.qmin, fmt.qmax + 1, dtype=np.float32)
    assert np.all(np.isfinite((codes - np.float32(zp)) * np.float32(scale)))
    x = np.asarray([lo, hi, -FMAX, FMAX, 0.0], np.float32)
    out = np.asarray(fake_quant(jnp.asarray(x), scale, zp, fmt))
    assert np.all(np.isfinite(out)), (x, out)


weights = hnp.arrays(np.float32, (4, 3), elements=extreme)


@given(w=weights, fmt=st.sampled_from([*_formats(), FP8_E4M3FN, FP8_E5M2]),
       axis=st.sampled_from([None, 0, 1]))
@settings(max_examples=120, deadline=None)
def test_any_finite_weight_quantizes_to_finite_values(w, fmt, axis):
    # (the host path of a concrete weight; the traced one is qparams_from_range's, above)
    scale, zp = weight_qparams(w, fmt, axis)
    assert np.all(np.isfinite(np.asarray(scale))) and np.all(np.asarray(scale) > 0)
    out = np.asarray(quantize_weight(jnp.asarray(w), fmt, axis))
    assert np.all(np.isfinite(out)), (w, out)


@given(w=weights, bits=st.sampled_from([2, 3, 4, 8]))
@settings(max_examples=60, deadline=None)
def test_lsq_steps_of_finite_weights_are_finite(w, bits):
    fmt = IntFormat(bits)
    step = lsq_init_step(w, fmt, axis=1)
    assert np.all(np.isfinite(np.asarray(step)))
    out = np.asarray(lsq_fake_quant(jnp.asarray(w), step, fmt, axis=1))
    assert np.all(np.isfinite(out))
    # a learned step or offset anywhere in the finite range: outputs saturate, never overflow
    big = lsq_fake_quant(jnp.asarray(w), jnp.float32(FMAX), fmt, offset=jnp.float32(-FMAX))
    assert np.all(np.isfinite(np.asarray(big)))


def test_the_issues_examples():
    # int2/int3 of a range near 1e38 gave -inf; an asymmetric [-3e38, 3e38] a NaN scale
    for bits in (2, 3):
        x = jnp.asarray([-FMAX, FMAX, 1e38, -1e38], jnp.float32)
        s, z = weight_qparams(np.asarray(x), IntFormat(bits), None)
        assert np.all(np.isfinite(np.asarray(fake_quant(x, s, z, IntFormat(bits)))))
        s, z = qparams_from_range(jnp.float32(-3e38), jnp.float32(3e38), IntFormat(bits), False)
        assert np.isfinite(float(s))
        assert np.all(np.isfinite(np.asarray(fake_quant(x, s, z, IntFormat(bits)))))
    # ordinary ranges keep their scales bit for bit: (max - min) / (qmax - qmin)
    s, _ = qparams_from_range(jnp.float32(-1.5), jnp.float32(2.25), IntFormat(8, signed=False),
                              False)
    assert float(s) == float(np.float32(3.75) / np.float32(255))

"""fake_quant / quantize / dequantize against a numpy reference of ONNX Q/DQ semantics."""

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
    MIN_SCALE,
    IntFormat,
    dequantize,
    fake_quant,
    qparams_from_range,
    quantize,
)


def np_quantize(x, scale, zp, qmin, qmax, axis=None):
    """ONNX QuantizeLinear: saturate(round_half_even(x / scale) + zp)."""
    x = np.asarray(x, np.float32)
    scale, zp = np.asarray(scale, np.float32), np.asarray(zp, np.float32)
    if axis is not None:
        shape = [1] * x.ndim
        shape[axis] = -1
        scale, zp = scale.reshape(shape), zp.reshape(shape)
    return np.clip(np.round(x / scale) + zp, qmin, qmax)  # np.round is half-to-even


def np_fake_quant(x, scale, zp, qmin, qmax, axis=None):
    q = np_quantize(x, scale, zp, qmin, qmax, axis)
    scale, zp = np.asarray(scale, np.float32), np.asarray(zp, np.float32)
    if axis is not None:
        shape = [1] * q.ndim
        shape[axis] = -1
        scale, zp = scale.reshape(shape), zp.reshape(shape)
    return ((q - zp) * scale).astype(np.float32)


FORMATS = [IntFormat(8), IntFormat(8, signed=False), IntFormat(4), IntFormat(4, signed=False),
           IntFormat(2, narrow_range=True), IntFormat(16), IntFormat(8, narrow_range=True)]

MAX_LEN = 64
floats = hnp.arrays(np.float32, st.integers(1, MAX_LEN),
                    elements=st.floats(-1024, 1024, width=32, allow_subnormal=False))


@pytest.mark.parametrize("fmt", FORMATS, ids=str)
@given(x=floats, scale=st.floats(0.0009765625, 10.0, width=32), zp_frac=st.floats(0, 1))
@settings(max_examples=40, deadline=None)
def test_per_tensor_matches_numpy(fmt, x, scale, zp_frac):
    zp = int(round(fmt.qmin + zp_frac * (fmt.qmax - fmt.qmin)))
    # Elementwise ops: x runs zero-padded to one length, so the 40 examples share one compiled
    # program per op instead of one per length; every element of x is still compared.
    n, xp = x.size, jnp.asarray(np.pad(x, (0, MAX_LEN - x.size)))
    q = quantize(xp, jnp.float32(scale), jnp.int32(zp), fmt)
    assert q.dtype == fmt.storage_dtype
    np.testing.assert_array_equal(np.asarray(q)[:n], np_quantize(x, scale, zp, fmt.qmin, fmt.qmax))
    fq = fake_quant(xp, jnp.float32(scale), jnp.int32(zp), fmt)
    np.testing.assert_array_equal(np.asarray(fq)[:n],
                                  np_fake_quant(x, scale, zp, fmt.qmin, fmt.qmax))
    np.testing.assert_array_equal(
        np.asarray(dequantize(q, jnp.float32(scale), jnp.int32(zp))), np.asarray(fq))


def test_exact_ties_round_half_to_even():
    fmt = IntFormat(8)
    x = jnp.asarray([0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 3.5], jnp.float32)  # x/scale = k + 0.5
    q = quantize(x, jnp.float32(1.0), jnp.int32(0), fmt)
    np.testing.assert_array_equal(np.asarray(q), [0, 2, 2, -0, -2, -2, 4])


def test_saturation_and_zero_point():
    fmt = IntFormat(8, signed=False)
    x = jnp.asarray([-100.0, -1.0, 0.0, 1.0, 1000.0], jnp.float32)
    q = quantize(x, jnp.float32(0.5), jnp.int32(10), fmt)
    np.testing.assert_array_equal(np.asarray(q), [0, 8, 10, 12, 255])


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_per_channel_any_axis(axis):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(3, 4, 5)).astype(np.float32) * 3
    n = x.shape[axis]
    scale = rng.uniform(0.01, 0.1, n).astype(np.float32)
    zp = rng.integers(-5, 5, n).astype(np.int32)
    fmt = IntFormat(8)
    got = fake_quant(jnp.asarray(x), jnp.asarray(scale), jnp.asarray(zp), fmt, axis=axis)
    want = np_fake_quant(x, scale, zp, fmt.qmin, fmt.qmax, axis % x.ndim)
    np.testing.assert_array_equal(np.asarray(got), want)


def test_ste_gradient_inside_one_outside_zero():
    fmt = IntFormat(4)  # codes [-8, 7]
    x = jnp.asarray([0.1, 3.4, 3.5, 3.75, 3.8, -4.0, -4.25, -4.3, 50.0], jnp.float32)
    g = jax.grad(lambda v: jnp.sum(fake_quant(v, jnp.float32(0.5), jnp.int32(0), fmt)))(x)
    # rounded values: 0, 7, 7 (3.5/0.5=7), 8 (7.5 -> 8, outside), 8, -8, -8 (-8.5 -> -8), -9, 100
    np.testing.assert_array_equal(np.asarray(g), [1, 1, 1, 0, 0, 1, 1, 0, 0])


def test_ste_gradient_zero_for_scale_and_zero_point():
    fmt = IntFormat(8)
    x = jnp.linspace(-2, 2, 11, dtype=jnp.float32)
    gs, gz = jax.grad(lambda s, z: jnp.sum(fake_quant(x, s, z, fmt)), argnums=(0, 1))(
        jnp.float32(0.1), jnp.float32(3.0))
    assert float(gs) == 0.0 and float(gz) == 0.0


def test_fake_quant_is_jittable_and_vmappable():
    fmt = IntFormat(8)
    x = jnp.ones((4, 3), jnp.float32)
    f = jax.jit(jax.vmap(lambda r: fake_quant(r, jnp.float32(0.1), jnp.int32(0), fmt)))
    np.testing.assert_array_equal(np.asarray(f(x)), np.ones((4, 3), np.float32))


@given(lo=st.floats(-100, 100, width=32), width=st.floats(0, 128, width=32))
@settings(max_examples=60, deadline=None)
def test_qparams_range_contains_zero_and_is_finite(lo, width):
    hi = lo + width
    for fmt, sym in [(IntFormat(8, signed=False), False), (IntFormat(8, narrow_range=True), True)]:
        scale, zp = qparams_from_range(jnp.float32(lo), jnp.float32(hi), fmt, sym)
        assert np.isfinite(float(scale)) and float(scale) >= MIN_SCALE
        assert fmt.qmin <= int(zp) <= fmt.qmax
        # 0.0 is exactly representable
        z = fake_quant(jnp.zeros(1, jnp.float32), scale, zp, fmt)
        assert float(z[0]) == 0.0


def test_zero_range_gives_exact_zeros_not_nan():
    fmt = IntFormat(8, signed=False)
    scale, zp = qparams_from_range(jnp.float32(0), jnp.float32(0), fmt, symmetric=False)
    out = fake_quant(jnp.zeros(5, jnp.float32), scale, zp, fmt)
    assert np.all(np.asarray(out) == 0.0)


@pytest.mark.parametrize("bits", [0, 1, 17, 8.0])
def test_bad_format_raises(bits):
    with pytest.raises(QuantizationError):
        IntFormat(bits)


def test_shape_mismatch_raises():
    with pytest.raises(QuantizationError, match="channels"):
        fake_quant(jnp.ones((2, 3), jnp.float32), jnp.ones(4, jnp.float32),
                   jnp.zeros(4, jnp.int32), IntFormat(8), axis=1)
    with pytest.raises(QuantizationError, match="floating"):
        quantize(jnp.ones(3, jnp.int32), jnp.float32(1.0), jnp.int32(0), IntFormat(8))


def test_rounding_noise_is_uniform_with_variance_step_squared_over_12():
    # Quantization error of a smooth input is ~ U(-s/2, s/2): variance s^2/12 (Widrow 1956).
    rng = np.random.default_rng(1)
    x = rng.uniform(-50, 50, 200_000).astype(np.float32)
    s = 0.37
    err = np.asarray(fake_quant(jnp.asarray(x), jnp.float32(s), jnp.int32(0), IntFormat(16))) - x
    assert np.max(np.abs(err)) <= s / 2 * (1 + 1e-5)
    np.testing.assert_allclose(err.var(), s**2 / 12, rtol=0.02)
    np.testing.assert_allclose(err.mean(), 0.0, atol=s * 0.01)


def test_weight_qparams_per_block_shapes_and_values():
    from npujax.numerics import weight_qparams

    w = jnp.arange(2 * 10, dtype=jnp.float32).reshape(10, 2) - 7.0  # [K=10, N=2]
    s, z = weight_qparams(w, IntFormat(8, narrow_range=True), 0, block_size=4)
    assert s.shape == (3, 2) and z.shape == (3, 2) and s.dtype == jnp.float32
    amax = np.abs(np.pad(np.asarray(w), ((0, 2), (0, 0)))).reshape(3, 4, 2).max(1)
    np.testing.assert_allclose(s, amax / 127, rtol=1e-6)
    s8, _ = weight_qparams(w, FP8_E4M3FN, 0, block_size=4)
    np.testing.assert_allclose(s8, amax / 448, rtol=1e-6)

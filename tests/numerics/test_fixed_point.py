"""Fixed-point arithmetic of the integer path against exact int64/float64 references."""

import jax.numpy as jnp
import numpy as np

from npujax.numerics.fixed_point import (
    div_round_half_even,
    quantize_multiplier,
    requantize,
    rounding_doubling_high_mul,
)


def test_rounding_doubling_high_mul_matches_int64_reference():
    rng = np.random.default_rng(0)
    a = np.concatenate([rng.integers(-2**31, 2**31, 4000), [-2**31, 2**31 - 1, 0, -1, 1]])
    b = rng.integers(2**30, 2**31, a.size)
    ab = a.astype(np.int64) * b.astype(np.int64)
    s = ab + np.where(ab >= 0, 1 << 30, 1 - (1 << 30))
    want = np.where(s >= 0, s // (1 << 31), -((-s) // (1 << 31)))  # truncating division
    got = rounding_doubling_high_mul(jnp.asarray(a, jnp.int32), jnp.asarray(b, jnp.int32))
    np.testing.assert_array_equal(np.asarray(got).astype(np.int64), want)


def test_requantize_is_within_half_a_step_of_exact():
    rng = np.random.default_rng(1)
    m = np.exp(rng.uniform(np.log(1e-6), np.log(3.0), 64))
    m0, shift = quantize_multiplier(m)
    assert np.all(m0 >= 2**30) and np.all(m0 <= 2**31 - 1)
    acc = rng.integers(-2**20, 2**20, (500, 64)).astype(np.int32)
    m0, shift = m0[None], shift[None]
    got = np.asarray(requantize(jnp.asarray(acc), jnp.asarray(m0), jnp.asarray(shift)))
    exact = acc.astype(np.float64) * m
    assert np.max(np.abs(got - exact)) <= 0.5 + 1e-6 * np.max(np.abs(exact)) + 1e-9


def test_div_round_half_even_matches_numpy_round():
    rng = np.random.default_rng(2)
    n = rng.integers(-10**6, 10**6, 5000).astype(np.int32)
    d = rng.integers(1, 1000, 5000).astype(np.int32)
    d[:8] = 2  # exact ties
    got = np.asarray(div_round_half_even(jnp.asarray(n), jnp.asarray(d)))
    np.testing.assert_array_equal(got, np.round(n.astype(np.float64) / d).astype(np.int64))

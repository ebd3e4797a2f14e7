"""``npujax._exact.computed_once``: the same values bit for bit, the identity's gradient, a
chain that XLA computes once instead of once per consumer, nothing outside its scope; and
``one_hot``'s rows computed in the program."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from npujax._exact import computed_once, computing_once, exact, one_hot, take


@exact
def _roundtrip(x: np.ndarray) -> np.ndarray:
    with computing_once():
        return np.asarray(jax.jit(computed_once)(jnp.asarray(x)))


def test_values_are_the_same_bits() -> None:
    # (not subnormals: XLA:CPU may run a program flushing them to zero, as its arithmetic does)
    x = np.array([1.5, -0.0, 0.0, np.nan, -np.nan, np.inf, -np.inf, 2.2250738585072014e-308,
                  2.0**53 + 2])
    assert np.array_equal(_roundtrip(x).view(np.int64), x.view(np.int64))
    ints = np.array([0, -3, 2**62], np.int64)
    assert np.array_equal(_roundtrip(ints), ints)
    flags = np.array([[True, False], [False, False]])
    assert np.array_equal(_roundtrip(flags), flags)


def test_gradient_is_the_identitys() -> None:
    def f(a: jax.Array) -> jax.Array:
        return jnp.sum(computed_once(a * 3.0) ** 2)

    a = jnp.array([1.0, -2.0, 0.5], jnp.float32)
    with computing_once():
        assert np.array_equal(jax.grad(f)(a), 18.0 * np.asarray(a))
        assert np.array_equal(jax.vmap(jax.grad(f))(jnp.stack([a, a])), 18.0 * np.stack([a, a]))


def test_a_chain_read_by_several_consumers_is_compiled_once() -> None:
    def program(once: bool):
        def f(a: jax.Array, b: jax.Array) -> tuple[jax.Array, ...]:
            c = jnp.ceil(jnp.where(a > b, a * b, a - b))
            c = computed_once(c) if once else c
            return c * 2.0 + a, c - b, c * c
        with computing_once():
            hlo = jax.jit(f).lower(jnp.ones(64), jnp.ones(64)).compile().as_text()
        return hlo.count(" ceil(")

    assert program(True) == 1 < program(False)


def test_outside_its_scope_it_is_the_identity() -> None:
    x = jnp.ones(3)
    assert computed_once(x) is x
    with computing_once():
        assert computed_once(x) is not x


@exact
def _rows(index, length):
    return np.asarray(jax.jit(lambda: one_hot(index, length))())


def test_one_hot_rows_are_numpys_and_no_constant_of_their_size() -> None:
    for index, length in (([0, 4, 2, -1], 5), ([], 7), ([1, 1], 3)):
        assert np.array_equal(_rows(index, length), np.eye(length)[np.asarray(index, int)])
    with pytest.raises(IndexError):
        one_hot([5], 5)
    # a lookup of 64 rows of 4,096: the program carries the 64 indices, not 64 x 4,096 floats
    with jax.enable_x64(True):
        text = jax.jit(lambda x: take(one_hot(np.arange(64) * 7, 4096), x)).lower(
            jnp.zeros(4096, jnp.float64)).as_text()
    assert len(text) < 20_000, len(text)

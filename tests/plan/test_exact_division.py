"""The float64 ``ceil_div`` of the cost model equals int64 division over the ranges npujax allows.

The argument is in ``npujax/_relax.py``; these tests check it where it could fail: every small
operand pair, and large operands at the boundaries where a rounded quotient could cross an
integer (``a = q b + r`` with ``r`` in ``{0, 1, b - 1}``, ``a`` at 2**53), for denominators of
every size the model divides by (array rows/cols up to 2**16, lanes x cores up to 2**36, up to
2**53), both as XLA compiles a plain division and as it compiles a divisor broadcast under
``vmap`` (``a * (1 / b)``, the rewrite that makes the float quotient only an estimate); and the
one-rounding form ``ceil((a - 1/2) / b)`` for numerators below a static bound, up to 2**50.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from npujax import _relax
from npujax._exact import exact
from npujax.limits import MAX_EXACT_COUNT


def _exact_ceil(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """ceil(a / b) by Python integers (no rounding anywhere)."""
    return np.asarray([-(-int(x) // int(y)) for x, y in zip(a.ravel(), b.ravel())],
                      np.int64).reshape(a.shape)


@exact
def _float_ceil_div(a: np.ndarray, b: np.ndarray, wide: bool = False) -> np.ndarray:
    """ceil_div under jit, elementwise, and under vmap over b (the reciprocal rewrite)."""
    a, b = jnp.asarray(a, jnp.int64), jnp.asarray(b, jnp.int64)
    flat = jax.jit(lambda x, y: _relax.ceil_div(x, y, wide=wide))(a, b)
    per_b = jax.jit(jax.vmap(lambda x, y: _relax.ceil_div(x, y, wide=wide)))(a, b[:, 0])
    return np.asarray(flat), np.asarray(per_b)


def _check(a: np.ndarray, b: np.ndarray, wide: bool = False) -> None:
    """a: [B, A], b: [B, 1] (one denominator per row, broadcast like a hardware field)."""
    want = _exact_ceil(a, np.broadcast_to(b, a.shape))
    flat, per_b = _float_ceil_div(a, np.broadcast_to(b, a.shape), wide)
    np.testing.assert_array_equal(flat, want)
    np.testing.assert_array_equal(per_b, want)


def test_every_small_pair():
    a = np.broadcast_to(np.arange(0, 2049, dtype=np.int64), (256, 2049))
    b = np.arange(1, 257, dtype=np.int64)[:, None]
    _check(a, b)


def _boundary_numerators(b: int, top: int, rng: np.random.Generator) -> np.ndarray:
    """a = q b + r for r in {0, 1, b - 1}, q spread over [0, top // b], and a = top."""
    qmax = top // b
    q = np.unique(np.concatenate([
        [0, 1, 2, 3, qmax - 2, qmax - 1, qmax],
        rng.integers(0, qmax + 1, 40, dtype=np.int64),
        2 ** np.arange(0, int(qmax).bit_length(), dtype=np.int64)]).clip(0, qmax))
    a = np.concatenate([q * b, q * b + 1, q * b + b - 1, [top, top - 1]])
    return a[(a >= 0) & (a <= top)]


_DENOMINATORS = sorted({1, 2, 3, 5, 7, 9, 10, 12, 49, 127, 255, 257, 1000, 65_521, 2**16 - 1,
                        2**16, 2**16 + 1, 3 * 2**20, 2**26 - 5, 2**36 - 1, 2**36, 10**12 + 39,
                        2**52 - 1, 2**52 + 1, 2**53 - 1, MAX_EXACT_COUNT})


def _stack(rows: list[np.ndarray]) -> np.ndarray:
    n = max(len(r) for r in rows)
    return np.stack([np.pad(r, (0, n - len(r)), mode="edge") for r in rows])


def test_boundaries_up_to_max_exact_count():
    rng = np.random.default_rng(0)
    a = _stack([_boundary_numerators(b, MAX_EXACT_COUNT, rng) for b in _DENOMINATORS])
    b = np.asarray(_DENOMINATORS, np.int64)[:, None]
    _check(a, b)


def test_random_pairs_up_to_max_exact_count():
    rng = np.random.default_rng(1)
    b = np.exp2(rng.uniform(0, 53, (64, 1))).astype(np.int64).clip(1, MAX_EXACT_COUNT)
    a = np.exp2(rng.uniform(0, 53, (64, 512))).astype(np.int64).clip(0, MAX_EXACT_COUNT)
    _check(a, b)


def test_wide_division_up_to_2_62():
    rng = np.random.default_rng(2)
    dens = [d for d in _DENOMINATORS if d <= 2**52]
    a = _stack([_boundary_numerators(b, 2**62, rng) for b in dens])
    _check(a, np.asarray(dens, np.int64)[:, None], wide=True)


def test_the_plain_estimate_alone_would_be_wrong():
    """The correction step is needed: under vmap XLA multiplies by the reciprocal, and the
    uncorrected ceiling misses by one (a regression guard for the correction)."""
    @exact
    def estimate(a, b):
        return np.asarray(jax.jit(jax.vmap(
            lambda x, y: jnp.ceil(x.astype(jnp.float64) / y.astype(jnp.float64)).astype(
                jnp.int64)))(jnp.asarray(a), jnp.asarray(b)))

    rng = np.random.default_rng(3)
    b = np.asarray(_DENOMINATORS, np.int64)
    a = _stack([_boundary_numerators(x, MAX_EXACT_COUNT, rng) for x in b])
    assert np.any(estimate(a, b) != _exact_ceil(a, np.broadcast_to(b[:, None], a.shape)))


@exact
def test_integer_division_is_the_reference():
    a, b = jnp.asarray([7, 8, 9], jnp.int64), jnp.asarray(4, jnp.int64)
    with _relax.integer_division():
        reference = str(jax.make_jaxpr(lambda x, y: _relax.ceil_div(x, y))(a, b))
        np.testing.assert_array_equal(_relax.ceil_div(a, b), [2, 2, 3])
    assert " div " in reference and "ceil" not in reference  # int64 floor division
    jaxpr = str(jax.make_jaxpr(lambda x, y: _relax.ceil_div(x, y))(a, b))
    assert "ceil" in jaxpr and "f64" in jaxpr
    np.testing.assert_array_equal(_relax.ceil_div(a, b), [2, 2, 3])


@pytest.mark.parametrize("relaxed", [False, True])
@exact
def test_relaxed_mode_unchanged(relaxed):
    a, b = jnp.asarray([7.0, 8.0, 9.0]), jnp.asarray(4.0)
    if relaxed:
        with _relax.relaxed():
            out = _relax.ceil_div(a, b)
        assert out.dtype == jnp.float64
    else:
        out = _relax.ceil_div(a.astype(jnp.int64), b.astype(jnp.int64))
        assert out.dtype == jnp.int64
    np.testing.assert_array_equal(out, [2, 2, 3])


@exact
def _bounded_ceil_div(a: np.ndarray, b: np.ndarray, bound: int) -> tuple[np.ndarray, ...]:
    """The one-rounding form (a static ``bound``) under jit, and under vmap over b (the
    reciprocal rewrite), with the numerator traced and as a constant folded into the program
    (as the cost model's static GEMM extents are)."""
    row = np.asarray(a[0], np.int64)  # a numpy constant, folded into the program
    a, b = jnp.asarray(a, jnp.int64), jnp.asarray(b, jnp.int64)
    f = lambda x, y: _relax.ceil_div(x, y, bound=bound)  # noqa: E731
    flat = jax.jit(f)(a, b)
    per_b = jax.jit(jax.vmap(f))(a, b[:, 0])
    const = jax.jit(jax.vmap(lambda y: f(row, y)))(b[:, 0])
    return np.asarray(flat), np.asarray(per_b), np.asarray(const)


def _check_bounded(a: np.ndarray, b: np.ndarray, bound: int) -> None:
    """a: [B, A] (or [A], the same for every row), b: [B, 1]."""
    a = np.broadcast_to(a, (b.shape[0], a.shape[-1]))
    want = _exact_ceil(a, np.broadcast_to(b, a.shape))
    flat, per_b, const = _bounded_ceil_div(a, np.broadcast_to(b, a.shape), bound)
    np.testing.assert_array_equal(flat, want)
    np.testing.assert_array_equal(per_b, want)
    np.testing.assert_array_equal(const, _exact_ceil(np.broadcast_to(a[0], a.shape),
                                                     np.broadcast_to(b, a.shape)))


def test_one_rounding_every_small_pair():
    a = np.arange(0, 2049, dtype=np.int64)
    b = np.arange(1, 257, dtype=np.int64)[:, None]
    _check_bounded(a, b, bound=2048)


def test_one_rounding_boundaries_up_to_its_bound():
    rng = np.random.default_rng(4)
    top = _relax.ONE_ROUNDING_BOUND
    a = _stack([_boundary_numerators(b, top, rng) for b in _DENOMINATORS])
    _check_bounded(a, np.asarray(_DENOMINATORS, np.int64)[:, None], bound=top)


def test_one_rounding_random_pairs_up_to_its_bound():
    rng = np.random.default_rng(5)
    b = np.exp2(rng.uniform(0, 53, (64, 1))).astype(np.int64).clip(1, MAX_EXACT_COUNT)
    a = np.exp2(rng.uniform(0, 50, (64, 512))).astype(np.int64).clip(0, 2**50)
    _check_bounded(a, b, bound=2**50)


@exact
def test_one_rounding_is_taken_only_within_its_bound():
    """A bound above 2**50 (or none, or the corrected_division reference) keeps the corrected
    form; within it the program has no correction (no select), and near 2**53, where the
    margin is gone, the one-rounding form would be wrong (why the bound is checked)."""
    a, b = jnp.asarray([7, 8, 9], jnp.int64), jnp.asarray(4, jnp.int64)
    jaxpr = lambda **kw: str(jax.make_jaxpr(  # noqa: E731
        lambda x, y: _relax.ceil_div(x, y, **kw))(a, b))
    assert "select_n" not in jaxpr(bound=2**50)
    assert "select_n" in jaxpr(bound=2**50 + 1)
    assert "select_n" in jaxpr()
    with _relax.corrected_division():
        assert "select_n" in jaxpr(bound=16)
    np.testing.assert_array_equal(_relax.ceil_div(a, b, bound=9), [2, 2, 3])
    big = 9007199254737994  # near 2**53: a - 1/2 rounds, and so does the reciprocal's product
    assert np.ceil((np.float64(big) - 0.5) * (1.0 / 3.0)) != -(-big // 3)

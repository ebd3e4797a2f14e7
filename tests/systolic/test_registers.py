"""The register-level lax.scan simulation proves the closed-form cycle count, fold by fold."""

import jax.numpy as jnp
import numpy as np
import pytest

from npujax.hw import DATAFLOWS
from npujax.systolic import gemm_cycles, simulate_gemm

# Hand-picked shapes (60 more random ones in tests/integration/test_registers_many.py):
# extents below, at and above the array edges, 1-wide GEMMs, and
# non-square arrays (R != C catches a swapped skew).
_rng = np.random.default_rng(7)
SHAPES = [(1, 1, 1, 1, 1), (1, 1, 1, 4, 4), (4, 4, 4, 4, 4), (5, 3, 4, 4, 4), (7, 9, 5, 4, 3),
          (10, 6, 11, 3, 5), (4, 20, 3, 8, 8), (16, 16, 16, 8, 2), (3, 17, 2, 2, 8)]
# Random GEMMs up to 18 x 18 x 18 on six arrays (square and not, 1-wide, edges of 8): simulated
# padded to 18^3 (simulate_gemm(pad_to=...)), one compilation per array instead of one per shape.
RANDOM_ARRAYS = [(1, 1), (2, 7), (3, 3), (5, 2), (4, 8), (8, 8)]
PAD_TO = (18, 18, 18)
RANDOM_SHAPES = [tuple(int(v) for v in _rng.integers(1, 19, 3)) + RANDOM_ARRAYS[i % 6]
                 for i in range(60)]


def check_shapes(df, shapes, pad_to=None):
    rng = np.random.default_rng(11)
    for M, K, N, R, C in shapes:
        a = jnp.asarray(rng.integers(-128, 128, (M, K)), jnp.int8)
        b = jnp.asarray(rng.integers(-128, 128, (K, N)), jnp.int8)
        sim = simulate_gemm(a, b, R, C, df, pad_to=pad_to)
        g = gemm_cycles(M, K, N, R, C, df)
        shape = (M, K, N, R, C)
        assert bool(sim["complete"]), shape
        np.testing.assert_array_equal(
            np.asarray(sim["out"]), np.asarray(a, np.int32) @ np.asarray(b, np.int32),
            err_msg=str(shape))
        assert sim["fold_cycles"].shape == (int(g["folds"]),), shape
        assert np.all(np.asarray(sim["fold_cycles"]) == int(g["fold_cycles"])), shape
        assert int(sim["compute_cycles"]) == int(g["compute_cycles"]), shape


@pytest.mark.parametrize("df", DATAFLOWS)
def test_register_simulation_proves_closed_form(df):
    check_shapes(df, SHAPES)


def test_exit_times_follow_the_skew():
    # WS on a 4x3 array, one fold: output (m, c) leaves the bottom edge at 2R - 1 + m + c
    # (R cycles of fill, row skew R - 1, column skew c).
    a = jnp.ones((5, 4), jnp.int8)
    b = jnp.ones((4, 3), jnp.int8)
    sim = simulate_gemm(a, b, 4, 3, "weight_stationary")
    m, c = np.meshgrid(np.arange(5), np.arange(3), indexing="ij")
    np.testing.assert_array_equal(np.asarray(sim["exit_cycles"])[0], (2 * 4 - 1 + m + c).ravel())
    # OS: PE (r, c) adds its last (K-th) product at K - 1 + r + c
    sim = simulate_gemm(jnp.ones((4, 6), jnp.int8), jnp.ones((6, 3), jnp.int8), 4, 3,
                        "output_stationary")
    r, c = np.meshgrid(np.arange(4), np.arange(3), indexing="ij")
    np.testing.assert_array_equal(np.asarray(sim["exit_cycles"])[0], (6 - 1 + r + c).ravel())


def test_pad_to_smaller_than_the_gemm_is_refused():
    from npujax.errors import ShapeError

    with pytest.raises(ShapeError, match="pad_to"):
        simulate_gemm(jnp.ones((5, 4), jnp.int8), jnp.ones((4, 3), jnp.int8), 4, 3,
                      "weight_stationary", pad_to=(4, 4, 3))

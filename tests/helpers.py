"""Shared test helpers: tolerances per dtype in one place."""

import numpy as np

TOLERANCES = {
    np.dtype(np.float32): {"rtol": 1e-5, "atol": 1e-6},
    np.dtype(np.float64): {"rtol": 1e-12, "atol": 1e-12},
}


def assert_close(actual, desired, dtype=np.float32, **overrides):
    """assert_allclose with the tolerance of ``dtype`` (overridable)."""
    tol = {**TOLERANCES[np.dtype(dtype)], **overrides}
    np.testing.assert_allclose(np.asarray(actual), np.asarray(desired), **tol)

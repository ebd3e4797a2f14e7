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


def digits_cnn(seed=0):
    """The demo's DigitsCNN with non-trivial BatchNorm statistics (so folding is really tested)."""
    import jax.numpy as jnp
    from flax import nnx

    from npujax.models.cnn import DigitsCNN

    m = DigitsCNN(rngs=nnx.Rngs(seed))
    rng = np.random.default_rng(seed)
    for bn in (m.bn1, m.bn2):
        n = bn.mean[...].shape[0]
        bn.mean[...] = jnp.asarray(rng.normal(size=n), jnp.float32)
        bn.var[...] = jnp.asarray(rng.uniform(0.5, 2.0, n), jnp.float32)
        bn.scale[...] = jnp.asarray(rng.normal(size=n), jnp.float32)
        bn.bias[...] = jnp.asarray(rng.normal(size=n), jnp.float32)
    return m


def traced_digits_cnn():
    """``(model, (graph, params))``: :func:`digits_cnn` traced (BatchNorm not folded)."""
    import jax.numpy as jnp

    from npujax.frontends.flax import trace_flax

    m = digits_cnn()
    x = jnp.asarray(np.random.default_rng(0).uniform(size=(1, 8, 8, 1)), jnp.float32)
    return m, trace_flax(m, x)


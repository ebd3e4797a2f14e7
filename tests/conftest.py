"""Strict JAX settings for every test (as equinox's test suite does): no silent dtype or rank
promotion, so an int8 operand can never be widened behind our back.

Flax's own layers (e.g. ``avg_pool`` dividing by an integer window size) are not written for
strict promotion, so tests that run a Flax model are marked ``flax_model`` and use JAX's standard
promotion for that part only.
"""

import jax
import pytest


@pytest.fixture(autouse=True)
def _strict_jax(request):
    if request.node.get_closest_marker("flax_model"):
        yield
        return
    with jax.numpy_dtype_promotion("strict"), jax.numpy_rank_promotion("raise"):
        yield


@pytest.fixture(scope="session")
def edge_spec():
    from npujax.hw import load_npu_spec

    return load_npu_spec("edge_16x16")

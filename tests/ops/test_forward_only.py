"""Forward-only kernel forms (npujax.ops.registry.forward_only) give the reference forms' values."""

import jax
import numpy as np
import pytest

from npujax.ir.graph import Node
from npujax.ops import OPS
from npujax.ops.registry import forward_only, is_forward_only


@pytest.mark.parametrize("window,strides", [
    ([1, 1, 2, 2], [1, 1, 2, 2]), ([1, 1, 3, 3], [1, 1, 2, 1]), ([1, 2, 2, 1], [1, 1, 2, 1]),
])
def test_maxpool_forward_only_equals_reduce_window(window, strides):
    node = Node("pool", "MaxPool", ("x",), ("y",),
                {"window": window, "strides": strides, "padding": [[0, 0]] * 4})
    x = np.random.default_rng(0).integers(-3, 3, (2, 4, 7, 9)).astype(np.float32)  # many ties
    ref = OPS["MaxPool"].run(node, [x], {})[0]
    assert not is_forward_only()
    with forward_only():
        assert is_forward_only()
        fast = jax.jit(lambda v: OPS["MaxPool"].run(node, [v], {})[0])(x)
    assert not is_forward_only()
    np.testing.assert_array_equal(np.asarray(fast), np.asarray(ref))

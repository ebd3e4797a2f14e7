"""Forward-only kernel forms (npujax.ops.registry.forward_only) give the reference forms' values."""

import jax
import numpy as np
import pytest

from npujax.ir.graph import Node
from npujax.ops import OPS
from npujax.ops.registry import forward_only, is_forward_only
from tests.helpers import assert_close


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


def test_vector_products_and_short_softmax_forward_only_equal_reference():
    """One row times a weight matrix (Gemm; a 1x1 Conv on one pixel) runs as a two-row product,
    and a Softmax over a short axis pairwise, when forward-only: the reference values to float
    rounding, including a row whose exponentials overflow and one masked with -inf."""
    rng = np.random.default_rng(1)
    gemm = Node("fc", "Gemm", ("x",), ("y",), {})
    conv = Node("se", "Conv", ("x",), ("y",), {
        "data_layout": "NCHW", "kernel_layout": "OIHW", "strides": [1, 1], "dilations": [1, 1],
        "padding": [[0, 0], [0, 0]], "groups": 1, "kernel_shape": [5, 12, 1, 1]})
    soft = Node("sm", "Softmax", ("x",), ("y",), {"axis": 1})
    cases = [
        (gemm, rng.normal(size=(1, 12)), {"kernel": rng.normal(size=(12, 5)),
                                          "bias": rng.normal(size=5)}),
        (conv, rng.normal(size=(1, 12, 1, 1)), {"kernel": rng.normal(size=(5, 12, 1, 1))}),
        (soft, np.array([[1e3, 0, -1e3], [1, 2, 3], [0, -np.inf, 1]]), {}),
    ]
    for node, x, p in cases:
        x = x.astype(np.float32)
        p = {k: v.astype(np.float32) for k, v in p.items()}
        ref = np.asarray(OPS[node.op].run(node, [x], p)[0])
        run = jax.jit(lambda v, node=node, p=p: OPS[node.op].run(node, [v], p)[0])
        with forward_only():
            fast = run(x)
            eqns = jax.make_jaxpr(run.__wrapped__)(x).eqns
        prims = {e.primitive.name for e in eqns}
        if node.op == "Softmax":  # one reduction, no maximum
            assert "reduce_max" not in prims and "reduce_sum" in prims
        else:  # the vector is paired: a product with two rows
            dots = [e for e in eqns if e.primitive.name == "dot_general"]
            assert [d.invars[0].aval.shape[0] for d in dots] == [2]
        assert fast.shape == ref.shape
        assert_close(fast, ref)

"""The shift-and-multiply depthwise convolution equals XLA's grouped convolution."""

import jax.numpy as jnp
import numpy as np
import pytest

from npujax.ops.gemm import _depthwise_conv, _is_depthwise
from npujax.ops.gemm import dense_conv as _dense_conv


@pytest.mark.parametrize("layout,klayout", [("NCHW", "OIHW"), ("NHWC", "HWIO")])
@pytest.mark.parametrize("c,m,k,s,d,pad", [
    (8, 1, 3, 1, 1, ((1, 1), (1, 1))), (6, 2, 5, 2, 1, ((2, 1), (0, 2))),
    (4, 1, 3, 2, 2, ((2, 2), (2, 2))), (5, 1, 1, 1, 1, ((0, 0), (0, 0))),
    (3, 1, 7, 3, 1, ((3, 3), (3, 3))),
    # stride 1, same width: the flattened-rows form (_depthwise_rows), asymmetric and dilated
    (4, 2, 3, 1, 2, ((1, 3), (1, 3))), (3, 1, 5, 1, 1, ((0, 4), (3, 1))),
])
def test_depthwise_matches_grouped_conv(layout, klayout, c, m, k, s, d, pad):
    rng = np.random.default_rng(c * 100 + k)
    x = rng.normal(size=(2, c, 11, 13)).astype(np.float32)
    w = rng.normal(size=(c * m, 1, k, k)).astype(np.float32)
    xl = jnp.asarray(np.transpose(x, ["NCHW".index(a) for a in layout]))
    wl = jnp.asarray(np.transpose(w, ["OIHW".index(a) for a in klayout]))
    a = dict(data_layout=layout, kernel_layout=klayout, strides=[s, s], dilations=[d, d],
             padding=[list(p) for p in pad], groups=c)
    assert _is_depthwise(xl, wl, a)
    fast, ref = _depthwise_conv(xl, wl, a), _dense_conv(xl, wl, a)
    rows = _depthwise_conv(xl, wl, {**a, "flattened_by_consumer": True})
    np.testing.assert_allclose(np.asarray(rows), np.asarray(ref), rtol=1e-5, atol=1e-5)
    assert fast.shape == ref.shape
    np.testing.assert_allclose(np.asarray(fast), np.asarray(ref), rtol=1e-5, atol=1e-5)


def test_grouped_but_not_depthwise_uses_xla():
    x = jnp.ones((1, 8, 5, 5), jnp.float32)
    w = jnp.ones((8, 2, 3, 3), jnp.float32)  # 4 groups of 2 channels
    a = dict(data_layout="NCHW", kernel_layout="OIHW", strides=[1, 1], dilations=[1, 1],
             padding=[[1, 1], [1, 1]], groups=4)
    assert not _is_depthwise(x, w, a)


@pytest.mark.parametrize("layout,klayout", [("NCHW", "OIHW"), ("NHWC", "HWIO")])
def test_pointwise_matches_conv(layout, klayout):
    from npujax.ops.gemm import _is_pointwise, _pointwise_conv

    rng = np.random.default_rng(0)
    x = rng.normal(size=(2, 6, 5, 7)).astype(np.float32)
    w = rng.normal(size=(4, 6, 1, 1)).astype(np.float32)
    xl = jnp.asarray(np.transpose(x, ["NCHW".index(a) for a in layout]))
    wl = jnp.asarray(np.transpose(w, ["OIHW".index(a) for a in klayout]))
    a = dict(data_layout=layout, kernel_layout=klayout, strides=[1, 1], dilations=[1, 1],
             padding=[[0, 0], [0, 0]], groups=1)
    assert _is_pointwise(wl, a)
    np.testing.assert_allclose(np.asarray(_pointwise_conv(xl, wl, a)),
                               np.asarray(_dense_conv(xl, wl, a)), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("layout,klayout", [("NCHW", "OIHW"), ("NHWC", "HWIO")])
@pytest.mark.parametrize("c,k,s,d,pad", [
    (3, 3, 2, 1, ((1, 1), (1, 1))), (1, 5, 1, 2, ((2, 1), (0, 3))), (4, 2, 3, 1, ((0, 0), (1, 0))),
    (2, 2, 2, 1, ((0, 0), (0, 0))),  # the phase form crops a row and a column never read
])
def test_small_cin_im2col_matches_conv(layout, klayout, c, k, s, d, pad):
    from npujax.ops.gemm import _im2col_conv, _is_small_cin

    rng = np.random.default_rng(c * 10 + k)
    x = rng.normal(size=(2, c, 11, 13)).astype(np.float32)
    w = rng.normal(size=(5, c, k, k)).astype(np.float32)
    xl = jnp.asarray(np.transpose(x, ["NCHW".index(a) for a in layout]))
    wl = jnp.asarray(np.transpose(w, ["OIHW".index(a) for a in klayout]))
    a = dict(data_layout=layout, kernel_layout=klayout, strides=[s, s], dilations=[d, d],
             padding=[list(p) for p in pad], groups=1)
    assert _is_small_cin(xl, a)
    fast, ref = _im2col_conv(xl, wl, a), _dense_conv(xl, wl, a)
    assert fast.shape == ref.shape
    np.testing.assert_allclose(np.asarray(fast), np.asarray(ref), rtol=1e-5, atol=1e-5)


def test_rows_form_only_where_it_applies():
    """Stride 1 with the input's width kept takes the flattened-rows form (when a 1x1 conv
    flattens the output); a stride, a width change or a traced kernel keep the strided-slice
    form; both equal XLA's convolution."""
    import jax

    from npujax.ops.gemm import _rows_apply

    def attrs(s, pad):
        return dict(data_layout="NCHW", kernel_layout="OIHW", strides=[1, s], dilations=[1, 1],
                    padding=pad, groups=3, flattened_by_consumer=True)

    assert _rows_apply((1, 3, 6, 7), 3, 3, attrs(1, [[1, 1], [2, 0]]))
    assert not _rows_apply((1, 3, 6, 7), 3, 3, attrs(2, [[1, 1], [1, 1]]))
    assert not _rows_apply((1, 3, 6, 7), 3, 3, attrs(1, [[1, 1], [0, 0]]))
    assert not _rows_apply((1, 3, 6, 7), 3, 3, attrs(1, [[-1, 1], [1, 1]]))
    rng = np.random.default_rng(3)
    x = rng.normal(size=(1, 3, 6, 7)).astype(np.float32)
    w = rng.normal(size=(3, 1, 3, 3)).astype(np.float32)
    a = attrs(1, [[1, 1], [2, 0]])
    ref = np.asarray(_dense_conv(jnp.asarray(x), jnp.asarray(w), a))
    traced = jax.jit(lambda v, k: _depthwise_conv(v, k, a))(x, w)
    np.testing.assert_allclose(np.asarray(_depthwise_conv(x, w, a)), ref, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(traced), ref, rtol=1e-5, atol=1e-5)


def test_flattened_by_consumer_follows_elementwise_nodes():
    """execute marks a depthwise Conv whose output reaches only 1x1 Convs, through elementwise
    nodes (a hardswish reads it twice), and not one that is also pooled."""
    from npujax.ir.execute import _flattened_by_consumer
    from npujax.ir.graph import Graph, Node, TensorType

    def conv(name, x, y, groups, k):
        return Node(name, "Conv", (x,), (y,), {"groups": groups, "strides": [1, 1],
                                               "kernel_shape": [4, 4 // groups, k, k]})

    t = TensorType((1, 4, 5, 5), "float32")
    nodes = (conv("dw1", "x", "a", 4, 3), Node("relu", "Relu", ("a",), ("b",)),
             Node("mul", "Mul", ("a", "b"), ("c",)), conv("pw1", "c", "d", 1, 1),
             conv("dw2", "d", "e", 4, 3), Node("pool", "GlobalAveragePool", ("e",), ("f",)),
             Node("scale", "Mul", ("e", "f"), ("g",)), conv("pw2", "g", "h", 1, 1))
    g = Graph(nodes, ("x",), ("h",), {n: t for n in "xabcdefgh"})
    assert _flattened_by_consumer(g) == {"dw1"}

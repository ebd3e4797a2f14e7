"""AdaRound and GPTQ in one layer-by-layer pass (``LayerPass``) equal their former form (one
whole quantized run per wave of layers), bit for bit on small models."""

import dataclasses

import numpy as np
import pytest

import npujax.quantize.methods.adaround as adaround_module
from npujax.ir.graph import Graph, Node, TensorType
from npujax.quantize.calibrate import calibrate
from npujax.quantize.methods import GPTQ, AdaRound
from npujax.quantize.methods._common import LayerPass
from npujax.quantize.spec import quant_spec
from tests.quantize.ptq_graphs import F32, correlated_inputs, gemm, mlp_block


def _branches():
    """``out(q(x) + k(x) + x)`` and an unread ``v(x)``: two layers of one wave (q, k) and one
    never read (v), a residual read across them, 8 features, random weights."""
    rng = np.random.default_rng(0)
    graph = Graph((gemm("q", "x", "q", relu=True), gemm("k", "x", "k"), gemm("v", "x", "v"),
                   Node("add", "Add", ("q", "k"), ("s",)), Node("res", "Add", ("s", "x"), ("r",)),
                   gemm("out", "r", "y")), ("x",), ("y", "v"),
                  {t: TensorType((1, 8), F32) for t in ("x", "q", "k", "v", "s", "r", "y")})
    params = {n: {"kernel": (rng.normal(size=(8, 8)) / 3).astype(np.float32),
                  "bias": (0.1 * rng.normal(size=8)).astype(np.float32)}
              for n in ("q", "k", "v", "out")}
    x = correlated_inputs(rng, 32, 8)
    return graph, params, [x[:16], x[16:]]


def _equal(a, b):
    assert a.notes == b.notes
    for name in a.params:
        for role in a.params[name]:
            np.testing.assert_array_equal(np.asarray(a.params[name][role]),
                                          np.asarray(b.params[name][role]), err_msg=name)


@pytest.mark.parametrize("weight_only", [False, True])
def test_adaround_one_pass_feeds_each_layer_what_the_waves_do(monkeypatch, weight_only):
    # W4A4 (every input quantized), or W4 weight-only (the first wave, q, k and v, reads the
    # float inputs, from the float pass). Each layer's optimization is replaced by rounding to
    # a scaling (its 10k-step compile is not what differs): what each layer is fed, its float
    # target (computed layer by layer in the one pass, all at once in the waves) and so its
    # result, must be equal.
    seen = {}

    def nearest(node, kernel, bias, scale, zero_point, fmt, axis, block_size, x, y, method):
        seen.setdefault(method.seed, []).append((node.name, np.asarray(x), np.asarray(y)))
        # (a later layer's input depends on this one's)
        return np.asarray(kernel) * np.float32(1.0 + 0.01 * float(np.mean(x)))

    monkeypatch.setattr(adaround_module, "adaround_layer", nearest)
    graph, params, batches = _branches()
    q = quant_spec(graph, 4, 4)
    if weight_only:
        q = {n: dataclasses.replace(lq, act=None) for n, lq in q.items()}
    qstate = calibrate(graph, params, batches, q)
    one = AdaRound(seed=1)._apply(graph, params, q, batches, qstate, one_pass=True)
    _equal(one, AdaRound(seed=2)._apply(graph, params, q, batches, qstate, one_pass=False))
    assert [n for n, _, _ in seen[1]] == [n for n, _, _ in seen[2]] == ["q", "k", "v", "out"]
    for (name, x1, y1), (_, x2, y2) in zip(seen[1], seen[2], strict=True):
        np.testing.assert_array_equal(x1, x2, err_msg=name)
        np.testing.assert_array_equal(y1, y2, err_msg=name)


def test_gptq_one_pass_equals_the_waves():
    graph, params, batches = _branches()
    q = quant_spec(graph, 8, 8)
    qstate = calibrate(graph, params, batches, q)
    m = GPTQ(group_size=4, weight_only=False)  # (the inputs quantized too)
    _equal(m._apply(graph, params, q, batches, qstate, one_pass=True),
           m._apply(graph, params, q, batches, qstate, one_pass=False))


def test_layer_pass_refuses_layers_out_of_order():
    rng = np.random.default_rng(2)
    graph, params = mlp_block(rng)
    run = LayerPass(graph, [np.zeros((2, 4, 16), np.float32)])
    run.layer_input("fc2", params, {}, None)
    with pytest.raises(ValueError, match="graph order"):
        run.layer_input("fc1", params, {}, None)
